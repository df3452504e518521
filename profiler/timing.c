/*
 * The profiler's statistics: a median and an interquartile spread of a
 * part's rounds, and a round's backward from its forward and its pair
 * (profiler/profiler.h).
 */
#include "profiler/profiler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int compare_doubles(const void *a, const void *b)
{
    double left = *(const double *)a, right = *(const double *)b;
    return (left > right) - (left < right);
}

/* The q-quantile of sorted[0..count), interpolating between neighbours. */
static double quantile(const double *sorted, int count, double q)
{
    double position = q * (double)(count - 1);
    int below = (int)floor(position);
    int above = below + 1 < count ? below + 1 : below;
    double weight = position - (double)below;
    return sorted[below] * (1.0 - weight) + sorted[above] * weight;
}

timing_summary timing_summarize(const double *runs, int count)
{
    timing_summary summary = {0};
    if (count < 1)
        return summary;
    if (count > PROFILER_MAX_RUNS)
        count = PROFILER_MAX_RUNS;
    double sorted[PROFILER_MAX_RUNS];
    memcpy(sorted, runs, (size_t)count * sizeof *sorted);
    qsort(sorted, (size_t)count, sizeof *sorted, compare_doubles);
    summary.runs = count;
    summary.median_s = quantile(sorted, count, 0.5);
    if (summary.median_s > 0.0)
        summary.spread = (quantile(sorted, count, 0.75) -
                          quantile(sorted, count, 0.25)) /
                         summary.median_s;
    return summary;
}

void profiler_backward_rounds(const double *forward, const double *pair,
                              int rounds, double *backward)
{
    for (int r = 0; r < rounds; r++)
        backward[r] = fmax(pair[r] - forward[r], 0.05 * pair[r]);
}
