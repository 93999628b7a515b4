#include "parse.h"

#include <errno.h>
#include <stdlib.h>

int parse_numbers(int count, char **strings, double *out)
{
    for (int i = 0; i < count; i++) {
        char *end = NULL;
        errno = 0;
        out[i] = strtod(strings[i], &end);
        if (errno != 0 || end == strings[i] || *end != '\0')
            return i + 1;
    }
    return 0;
}
