// threads.h - how many OpenMP threads a rank of the GPT's chapters (08-11)
// computes with on the CPU, and how those threads wait.
#ifndef GPT_THREADS_H
#define GPT_THREADS_H

#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gpt.h"
#include "launch_env.h"
#include "log.h"

// OpenMP threads that reach a barrier first wait for the others by
// spinning (libgomp: 300,000 rounds) before they sleep. On a machine that
// also runs other work, the spinning thread holds the very core that the
// thread it waits for needs: on this course's shared 2-core machine,
// training ran 3-8x slower. Spinning briefly (GOMP_SPINCOUNT=1000) costs
// nothing measurable on an idle machine. libgomp reads its variables
// before main() runs, so we set it and start this program again, once.
// Set GOMP_SPINCOUNT or OMP_WAIT_POLICY yourself to choose otherwise.
static inline void spin_briefly_in_openmp(char **argv) {
#ifdef _OPENMP
    if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv("/proc/self/exe", argv); // returns only if it failed: then go on with the default
#endif
    (void)argv;
}

// One process on the machine uses every core. Several processes on one
// machine (data parallelism) share them: each takes its part, unless
// OMP_NUM_THREADS says otherwise, as torchrun does.
static inline void choose_threads(void) {
    gpt_blas_single_threaded();
    launch_env_t env = launch_env_read();
    const char *why = "OMP_NUM_THREADS";
    if (!launch_env_has("OMP_NUM_THREADS")) {
#ifdef _OPENMP
        long share = sysconf(_SC_NPROCESSORS_ONLN) / (env.local_world_size > 0 ? env.local_world_size : 1);
        omp_set_num_threads(share > 0 ? (int)share : 1);
#endif
        why = env.local_world_size > 1 ? "the cores shared between this machine's ranks" : "all cores";
    }
    log_main("threads: %d (%s); matrix products: %s\n", gpt_num_threads(), why, gpt_matmul_backend());
}

#endif
