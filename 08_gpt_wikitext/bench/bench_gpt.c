// bench_gpt.c - training throughput of gpt.h on synthetic tokens (no data
// set, no tokenizer): what the chapter's README quotes as tokens/s, and
// where the time of a step goes.
//
// Build and run from 08_gpt_wikitext/:  make bench
//   build/bench_gpt [B] [steps] [default|tiny] [ranks] [none|bf16|fp16] [workers]
// B sequences of the preset's block size per rank; ranks > 1 trains data
// parallel as the chapter does (spawned processes, the cpu process group,
// gradients averaged with ddp.h, sent as fp32 or, with bf16 or fp16,
// rounded as --grad_compress does), each rank on its own random tokens, with
// the machine's cores shared between the ranks unless OMP_NUM_THREADS is set.
// The batches come from gpt/loader.h, as in the chapter: made in the step
// (workers 0) or a step ahead by a thread (workers 1, the default), which
// the profile's "data" phase shows: what the step waits for its batch.
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
#include "loader.h"
#include "spawn.h"
#include "timer.h"

typedef struct {
    int B, steps, ranks, workers;
    const char *preset;
    gpt_config cfg;
    ddp_compress_t compress;
} bench_options;

// The phases of one training step, in order.
enum { DATA, FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER, PHASES };
static const char *const phase_names[PHASES] = {"data", "forward", "backward", "all-reduce", "optimizer"};

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
    // 64 blocks of random tokens, and a random order of them for the
    // loader: every step trains on B of them, as the chapter's steps do.
    rng_t rng = rng_seed(7 + (uint64_t)rank);
    enum { BLOCKS = 64 };
    size_t ntokens = (size_t)BLOCKS * T + 1, batches = (size_t)o->steps + 2;
    uint16_t *tokens = xmalloc(sizeof(uint16_t) * ntokens);
    for (size_t i = 0; i < ntokens; i++) tokens[i] = (uint16_t)rng_below(&rng, (uint64_t)o->cfg.vocab_size);
    int64_t *order = xmalloc(sizeof(int64_t) * batches * (size_t)B);
    for (size_t i = 0; i < batches * (size_t)B; i++) order[i] = (int64_t)rng_below(&rng, BLOCKS);
    loader_t loader = loader_create(tokens, B, T, o->workers);
    loader_set_epoch(&loader, order, (int)batches);

    double *steps = xmalloc(sizeof(double) * (size_t)o->steps);
    double *phases[PHASES];
    for (int p = 0; p < PHASES; p++) phases[p] = xmalloc(sizeof(double) * (size_t)o->steps);
    float loss = 0;
    for (int s = -2; s < o->steps; s++) {
        double t[PHASES + 1];
        t[0] = now_seconds();
        const loader_batch_t *batch = loader_next(&loader);
        t[1] = now_seconds();
        gpt_zero_grad(&m);
        loss = gpt_forward(&m, batch->inputs, batch->targets, B, T);
        t[2] = now_seconds();
        gpt_backward(&m, 1.0f);
        t[3] = now_seconds();
        ddp_average_gradients_with(dist.pg, m.grads, m.num_params, o->compress); // nothing with one rank
        t[4] = now_seconds();
        gpt_clip_grad_norm(&m, 1.0f);
        gpt_adamw_step(&m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f);
        t[5] = now_seconds();
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
        printf("gpt %s: %zu params, B=%d T=%d per rank, %d rank%s x %d thread%s, matmul: %s, loader workers: %d\n",
               o->preset, m.num_params, B, T, world, world > 1 ? "s" : "", gpt_num_threads(),
               gpt_num_threads() > 1 ? "s" : "", gpt_matmul_backend(), o->workers);
        printf("median step %.1f ms -> %.0f tokens/s\n", slowest * 1e3, (double)world * B * T / slowest);
        if (world > 1)
            printf("gradients all-reduced: %zu bytes per step per rank (%s)\n", ddp_bytes_reduced() / (size_t)(o->steps + 2),
                   ddp_wire_name(o->compress));
        printf("profile (rank 0, median ms):");
        for (int p = 0; p < PHASES; p++) printf(" %s %.3f%s", phase_names[p], timer_median(phases[p], o->steps) * 1e3,
                                                p < PHASES - 1 ? " |" : "\n");
    }
    for (int p = 0; p < PHASES; p++) free(phases[p]);
    free(steps);
    loader_free(&loader);
    free(order);
    free(tokens);
    gpt_free(&m);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    bench_options o = {argc > 1 ? atoi(argv[1]) : 8, argc > 2 ? atoi(argv[2]) : 10, argc > 4 ? atoi(argv[4]) : 1,
                       argc > 6 ? atoi(argv[6]) : 1, argc > 3 ? argv[3] : "default", {5000, 0, 0, 0, 0},
                       DDP_COMPRESS_NONE};
    const char *compress = argc > 5 ? argv[5] : "none";
    bool known = !strcmp(compress, "none") || !strcmp(compress, "bf16") || !strcmp(compress, "fp16");
    if (argc > 7 || !known || !gpt_preset(o.preset, &o.cfg) || o.B < 1 || o.steps < 1 || o.ranks < 1 || o.ranks > 64 ||
        o.workers < 0 || o.workers > 1) {
        fprintf(stderr, "usage: bench_gpt [B>=1] [steps>=1] [default|tiny] [ranks 1..64] [none|bf16|fp16] [workers 0|1]\n");
        return 2;
    }
    o.compress = ddp_compress_from_name(compress);
    if (o.ranks == 1) return bench_rank(0, 1, &o);
    return spawn(o.ranks, bench_rank, &o);
}
