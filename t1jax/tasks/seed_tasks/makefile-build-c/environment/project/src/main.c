#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "stats.h"
#include "version.h"

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("app %s\n", APP_VERSION);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s NUMBER...\n", argv[0]);
        return 2;
    }
    int n = argc - 1;
    double *xs = malloc(sizeof(double) * (size_t)n);
    if (xs == NULL)
        return 1;
    int bad = parse_numbers(n, argv + 1, xs);
    if (bad) {
        fprintf(stderr, "not a number: %s\n", argv[bad]);
        free(xs);
        return 1;
    }
    printf("n=%d sum=%.3f mean=%.3f rms=%.3f\n", n, stats_sum(xs, (size_t)n),
           stats_mean(xs, (size_t)n), stats_rms(xs, (size_t)n));
    free(xs);
    return 0;
}
