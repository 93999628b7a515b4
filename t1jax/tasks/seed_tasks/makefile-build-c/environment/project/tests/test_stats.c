#include <math.h>
#include <stdio.h>

#include "parse.h"
#include "stats.h"

static int failures = 0;

static void check(int ok, const char *what)
{
    if (!ok) {
        printf("FAIL: %s\n", what);
        failures++;
    }
}

int main(void)
{
    double xs[] = {3.0, 4.0, 5.0};
    check(fabs(stats_sum(xs, 3) - 12.0) < 1e-9, "sum of 3 4 5");
    check(fabs(stats_mean(xs, 3) - 4.0) < 1e-9, "mean of 3 4 5");
    check(fabs(stats_rms(xs, 3) - sqrt(50.0 / 3.0)) < 1e-9, "rms of 3 4 5");
    check(stats_mean(xs, 0) == 0.0, "mean of nothing");

    char *good[] = {"1.5", "-2", "1e3"};
    double out[3];
    check(parse_numbers(3, good, out) == 0 && out[0] == 1.5 && out[1] == -2.0 && out[2] == 1000.0,
          "parse valid numbers");
    char *bad[] = {"1", "2x", "3"};
    check(parse_numbers(3, bad, out) == 2, "parse reports the first bad string");

    if (failures) {
        printf("%d TEST(S) FAILED\n", failures);
        return 1;
    }
    printf("ALL TESTS PASSED\n");
    return 0;
}
