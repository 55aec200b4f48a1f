// bench_gpt.c - training throughput of gpt.h on synthetic tokens (no data
// set, no tokenizer): what the chapter's README quotes as tokens/s, and
// where the time of a step goes.
//
// Build and run from 08_gpt_wikitext/:  make bench
//   build/bench_gpt [B] [steps] [default|tiny] [ranks]
// B sequences of the preset's block size per rank; ranks > 1 trains data
// parallel as the chapter does (spawned processes, the cpu process group,
// gradients averaged with ddp.h), each rank on its own random tokens, with
// the machine's cores shared between the ranks unless OMP_NUM_THREADS is set.
// After 2 warm-up steps it prints the median step (the slowest rank's) and
// the tokens/s of all ranks together, then the profile: the median
// milliseconds of each phase of a step on rank 0, timed with the host clock
// around each phase.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt.h"
#include "ddp.h"
#include "dist.h"
#include "spawn.h"
#include "timer.h"

typedef struct {
    int B, steps, ranks;
    const char *preset;
    gpt_config cfg;
} bench_options;

// The phases of one training step, in order.
enum { FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER, PHASES };
static const char *const phase_names[PHASES] = {"forward", "backward", "all-reduce", "optimizer"};

// As in 08_gpt_wikitext.c: OpenMP threads spin only briefly at barriers,
// so that other work on the machine does not make every barrier slow.
static void spin_briefly_in_openmp(char **argv) {
    if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv("/proc/self/exe", argv); // returns only if it failed
}

// As the chapter's choose_threads: the ranks share the cores.
static void share_the_cores(int ranks) {
    gpt_blas_single_threaded();
#ifdef _OPENMP
    if (launch_env_has("OMP_NUM_THREADS")) return;
    long share = sysconf(_SC_NPROCESSORS_ONLN) / ranks;
    omp_set_num_threads(share > 0 ? (int)share : 1);
#else
    (void)ranks;
#endif
}

static int bench_rank(int rank, int world, void *arg) {
    const bench_options *o = arg;
    dist_t dist;
    dist_options how = {"env://", "cpu", "cpu", 0};
    dist_init(&dist, &how);
    share_the_cores(world);
    int B = o->B, T = o->cfg.block_size;
    gpt_t m;
    gpt_init(&m, o->cfg, 1); // the same seed everywhere: the replicas start equal
    rng_t rng = rng_seed(7 + (uint64_t)rank);
    uint16_t *tokens = xmalloc(sizeof(uint16_t) * ((size_t)B * T + 1));
    for (int i = 0; i < B * T + 1; i++) tokens[i] = (uint16_t)rng_below(&rng, (uint64_t)o->cfg.vocab_size);

    double *steps = xmalloc(sizeof(double) * (size_t)o->steps);
    double *phases[PHASES];
    for (int p = 0; p < PHASES; p++) phases[p] = xmalloc(sizeof(double) * (size_t)o->steps);
    float loss = 0;
    for (int s = -2; s < o->steps; s++) {
        double t[PHASES + 1];
        t[0] = now_seconds();
        gpt_zero_grad(&m);
        loss = gpt_forward(&m, tokens, tokens + 1, B, T);
        t[1] = now_seconds();
        gpt_backward(&m, 1.0f);
        t[2] = now_seconds();
        ddp_average_gradients(dist.pg, m.grads, m.num_params); // nothing with one rank
        t[3] = now_seconds();
        gpt_clip_grad_norm(&m, 1.0f);
        gpt_adamw_step(&m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f);
        t[4] = now_seconds();
        if (s < 0) continue; // warm-up: first touches of memory, OpenBLAS's buffers
        steps[s] = t[PHASES] - t[0];
        for (int p = 0; p < PHASES; p++) phases[p][s] = t[p + 1] - t[p];
    }
    // Data parallel, the job goes at the pace of its slowest rank; and the
    // replicas must have stayed equal, or the all-reduce did not average.
    double slowest = timer_median(steps, o->steps);
    dist_all_reduce_host(&dist, &slowest, 1, OP_MAX);
    if (world > 1) ddp_check_replicas(dist.pg, &dist.device, m.params, m.num_params, o->steps + 2);
    if (rank == 0) {
        printf("last loss %.4f\n", loss);
        printf("gpt %s: %zu params, B=%d T=%d per rank, %d rank%s x %d thread%s, matmul: %s\n", o->preset,
               m.num_params, B, T, world, world > 1 ? "s" : "", gpt_num_threads(),
               gpt_num_threads() > 1 ? "s" : "", gpt_matmul_backend());
        printf("median step %.1f ms -> %.0f tokens/s\n", slowest * 1e3, (double)world * B * T / slowest);
        printf("profile (rank 0, median ms):");
        for (int p = 0; p < PHASES; p++) printf(" %s %.2f%s", phase_names[p], timer_median(phases[p], o->steps) * 1e3,
                                                p < PHASES - 1 ? " |" : "\n");
    }
    for (int p = 0; p < PHASES; p++) free(phases[p]);
    free(steps);
    free(tokens);
    gpt_free(&m);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    bench_options o = {argc > 1 ? atoi(argv[1]) : 8, argc > 2 ? atoi(argv[2]) : 10, argc > 4 ? atoi(argv[4]) : 1,
                       argc > 3 ? argv[3] : "default", {5000, 0, 0, 0, 0}};
    if (argc > 5 || !gpt_preset(o.preset, &o.cfg) || o.B < 1 || o.steps < 1 || o.ranks < 1 || o.ranks > 64) {
        fprintf(stderr, "usage: bench_gpt [B>=1] [steps>=1] [default|tiny] [ranks 1..64]\n");
        return 2;
    }
    if (o.ranks == 1) return bench_rank(0, 1, &o);
    return spawn(o.ranks, bench_rank, &o);
}
