#ifndef PARSE_H
#define PARSE_H
#include <stddef.h>

/* Parse count strings as decimal numbers into out[]. Returns 0 on success, or the
 * 1-based index of the first string that is not a valid number. */
int parse_numbers(int count, char **strings, double *out);

#endif
