// timer.h - wall-clock time for the host, and CUDA events for the GPU.
//
// Host timing uses CLOCK_MONOTONIC: it never jumps when the system clock is
// set. GPU work is asynchronous, so a host timer around a kernel launch only
// measures the launch; synchronise first (device_synchronize) or use events.
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

#ifdef COURSE_CUDA
#include "check.h"

// Milliseconds between two events recorded on the same stream.
typedef struct { cudaEvent_t start, stop; } gpu_timer;

static inline gpu_timer gpu_timer_create(void) {
    gpu_timer t;
    CHECK_CUDA(cudaEventCreate(&t.start));
    CHECK_CUDA(cudaEventCreate(&t.stop));
    return t;
}
static inline void gpu_timer_start(gpu_timer *t, cudaStream_t s) { CHECK_CUDA(cudaEventRecord(t->start, s)); }
static inline float gpu_timer_stop_ms(gpu_timer *t, cudaStream_t s) {
    float ms = 0;
    CHECK_CUDA(cudaEventRecord(t->stop, s));
    CHECK_CUDA(cudaEventSynchronize(t->stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms, t->start, t->stop));
    return ms;
}
static inline void gpu_timer_destroy(gpu_timer *t) {
    CHECK_CUDA(cudaEventDestroy(t->start));
    CHECK_CUDA(cudaEventDestroy(t->stop));
}
#endif

#endif
