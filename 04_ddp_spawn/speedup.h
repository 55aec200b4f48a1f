// speedup.h - chapter 04's comparison: the baseline (one process) against
// data parallel (W processes), the same answer and how much faster.
//
// Not the lesson of DDP (that is train() in 04_ddp_spawn.c) but how to
// measure it honestly. One run says little: the first run of a program pays
// for page faults and cold caches, and on a shared machine any run can meet
// other work. So the two runs you see are the warm-up; then --repeats more
// of each, interleaved (baseline, DDP, baseline, DDP, ...), so that a busy
// moment hits both alike. Each pair gives one speedup; we report the
// median, and the range that a rerun could land in.
//
// Included by 04_ddp_spawn.c after its options type, which it reads.
#ifndef COURSE_04_SPEEDUP_H
#define COURSE_04_SPEEDUP_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "spawn.h"

// What rank 0 of a run hands back to main: workers are separate processes,
// so they write into memory that main mapped as shared before forking.
typedef struct {
    int done;
    double seconds;
    float params[]; // w[0..D-1], b
} run_result;

typedef struct {
    options opt;
    run_result *result;
} run_plan;

static inline void hand_back(run_result *r, const float *params, size_t nparams, double seconds) {
    memcpy(r->params, params, sizeof(float) * nparams);
    r->seconds = seconds;
    r->done = 1;
}

static run_result *new_result(const options *opt) {
    size_t bytes = sizeof(run_result) + sizeof(float) * (size_t)(opt->features + 1);
    run_result *result = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (result == MAP_FAILED) die("mmap of %zu bytes failed: %s", bytes, strerror(errno));
    return result;
}

// Runs the training on `world_size` spawned ranks into `result`. A quiet
// run (a timing repetition) prints nothing: its ranks' standard output goes
// to /dev/null. Ctrl-C ends the program as spawn reports it ("got SIGINT;
// stopping ..."), with status 128 + the signal.
static void run(const options *opt, int world_size, spawn_fn train, bool quiet, run_result *result) {
    result->done = 0;
    run_plan plan = {*opt, result};
    fflush(stdout);
    int saved = -1;
    if (quiet) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0) die("cannot open /dev/null: %s", strerror(errno));
        CHECK_SYS(saved = dup(STDOUT_FILENO));
        CHECK_SYS(dup2(null, STDOUT_FILENO));
        close(null);
    }
    int status = spawn(world_size, train, &plan);
    if (quiet) {
        CHECK_SYS(dup2(saved, STDOUT_FILENO));
        close(saved);
    }
    if (status > 128) exit(status);
    if (status != 0 || !result->done)
        die("the run with %d rank(s) failed (see the messages above)", world_size);
}

static void print_times(const char *label, const double *seconds, int n) {
    printf("%-14s", label);
    for (int i = 0; i < n; i++) printf(" %.6f", seconds[i]);
    printf(" s\n");
}

static void print_result(const char *label, const run_result *r, double seconds, const char *how,
                         const options *opt) {
    printf("%-14s weight %.6f  bias %.6f  time %.6f s (%s)  %.0f samples/s\n", label, r->params[0],
           r->params[opt->features], seconds, how, (double)opt->samples * opt->epochs / seconds);
}

// The baseline and the DDP run you see, then --repeats timed pairs, then
// the results and the speedup.
static void speedup_compare(const options *opt, spawn_fn train) {
    run_result *baseline = NULL;
    if (!opt->no_baseline) {
        printf("\n=== baseline: 1 process, batch %d, lr %g\n", opt->batch_size, opt->lr);
        baseline = new_result(opt);
        run(opt, 1, train, false, baseline);
    }
    // W ranks take W times the samples per step; the linear scaling rule
    // keeps the size of an epoch's progress the same by scaling lr by W.
    int w = opt->nprocs;
    if (opt->scale_lr)
        printf("\n=== DDP: %d processes, batch %d per rank (%d per step in all), lr %g (%g x %d)\n", w,
               opt->batch_size, opt->batch_size * w, (double)(float)(opt->lr * w), opt->lr, w);
    else
        printf("\n=== DDP: %d processes, batch %d per rank (%d per step in all), lr %g (not scaled)\n", w,
               opt->batch_size, opt->batch_size * w, opt->lr);
    run_result *ddp = new_result(opt);
    run(opt, w, train, false, ddp);

    char label[32];
    snprintf(label, sizeof label, "DDP (%d)", w);
    int n = opt->repeats;
    double *base_s = xcalloc((size_t)n, sizeof(double)), *ddp_s = xcalloc((size_t)n, sizeof(double));
    double *speedups = xcalloc((size_t)n, sizeof(double));
    if (baseline) {
        run_result *scratch = new_result(opt);
        for (int i = 0; i < n; i++) {
            run(opt, 1, train, true, scratch);
            base_s[i] = scratch->seconds;
            run(opt, w, train, true, scratch);
            ddp_s[i] = scratch->seconds;
            speedups[i] = base_s[i] / ddp_s[i];
        }
        printf("\n=== timing: %d more run(s) of each, interleaved; the runs above were the warm-up\n", n);
        print_times("baseline (1)", base_s, n);
        print_times(label, ddp_s, n);
    }

    printf("\n=== results (true weight 2.0, bias 3.0)\n");
    if (baseline) {
        char how[48];
        snprintf(how, sizeof how, "median of %d", n);
        print_result("baseline (1)", baseline, timer_median(base_s, n), how, opt);
        print_result(label, ddp, timer_median(ddp_s, n), how, opt);
        double best = speedups[0], worst = speedups[0];
        for (int i = 1; i < n; i++) {
            if (speedups[i] > best) best = speedups[i];
            if (speedups[i] < worst) worst = speedups[i];
        }
        double speedup = timer_median(speedups, n);
        printf("speedup %.3gx (median of %d; range %.3g-%.3gx), parallel efficiency %.0f%% (ideal: %dx, 100%%)\n",
               speedup, n, worst, best, 100.0 * speedup / w, w);
    } else {
        print_result(label, ddp, ddp->seconds, "one run", opt);
    }
    free(base_s);
    free(ddp_s);
    free(speedups);
}

#endif
