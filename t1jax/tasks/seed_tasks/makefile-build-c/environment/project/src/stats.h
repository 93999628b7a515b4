#ifndef STATS_H
#define STATS_H
#include <stddef.h>

double stats_sum(const double *xs, size_t n);
double stats_mean(const double *xs, size_t n);
double stats_rms(const double *xs, size_t n); /* root mean square */

#endif
