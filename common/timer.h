// timer.h - wall-clock time on the host, and the median of timings.
//
// Host timing uses CLOCK_MONOTONIC: it never jumps when the system clock is
// set. GPU work is asynchronous, so a host timer around a kernel launch only
// measures the launch: synchronise first (device_synchronize), as the
// chapters do before they stop the clock.
#ifndef COURSE_TIMER_H
#define COURSE_TIMER_H

#include <stdlib.h>
#include <time.h>

static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int timer_compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of n timings (sorts them in place). The course's benchmarks
// report it: one slow moment on a shared machine moves a mean, not a median.
static inline double timer_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, timer_compare);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
