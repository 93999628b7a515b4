#ifndef VERSION_H
#define VERSION_H
#define APP_VERSION "1.2.0"
#endif
