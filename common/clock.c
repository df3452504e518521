/* The one clock of Partita: monotonic seconds (common.h, "clock"). */
#include "common/common.h"

#include <time.h>

double pt_monotonic_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}
