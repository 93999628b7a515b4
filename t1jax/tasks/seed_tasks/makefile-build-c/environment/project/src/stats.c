#include "stats.h"

#include <math.h>

double stats_sum(const double *xs, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += xs[i];
    return s;
}

double stats_mean(const double *xs, size_t n)
{
    return n ? stats_sum(xs, n) / (double)n : 0.0;
}

double stats_rms(const double *xs, size_t n)
{
    double sq = 0.0;
    if (n == 0)
        return 0.0;
    for (size_t i = 0; i < n; i++)
        sq += xs[i] * xs[i];
    return sqrt(sq / (double)n);
}
