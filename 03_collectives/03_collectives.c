// 03_collectives.c - Chapter 3: the nine collectives, and how fast they are.
//
// Point-to-point (chapter 2) moves data between two ranks. A collective is
// an operation that every rank of the group calls together, each with its
// own buffer: broadcast, reduce, all_reduce, gather, all_gather, scatter,
// reduce_scatter, all_to_all and barrier. DDP rests on two of them:
// broadcast (the initial weights) and all_reduce (the gradients). One
// variant closes the lesson: all_to_all_v, an all_to_all whose chunks
// differ in size from pair to pair, which routes a mixture of experts'
// tokens (chapter 13).
//
// Without flags the program runs each collective once on a tiny buffer and
// prints every rank's buffer before and after, so that you can see what
// moved where, and ends with sub-groups: collectives among some of the
// ranks. That is this file. With --bench it measures them in the
// style of nccl-tests - time, algorithm bandwidth, bus bandwidth, and a
// correctness check - which is bench_collectives.h. What each collective
// is (root, reduction, buffer sizes, bandwidth formulas) is one table, in
// collectives.h.
//
// Like chapter 2 it starts its own ranks with spawn(), or is one rank when
// a launcher (tools/ddprun, torchrun, srun) started it.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "bench_collectives.h"
#include "collectives.h"
#include "dist.h"
#include "flags.h"
#include "log.h"
#include "spawn.h"
#include "timer.h"

// ---------------------------------------------------------------- options
typedef struct {
    int nprocs;
    const char *backend, *device;
    double timeout;
    bool bench, mismatch;
    bench_options b;   // the flags of --bench (bench_collectives.h)
} options;

static options parse_options(int argc, char **argv, const launch_env_t *env) {
    options o = {0, "auto", "auto", 0, false, false, {1, 8, (size_t)64 << 20, 2, 20, 5, "sum", "float", "all", 0}};
    flag_set set = {.program = "03_collectives",
                    .summary = "the nine collectives, rank by rank; --bench: nccl-tests style benchmark"};
    flag_int(&set, "nprocs", &o.nprocs, 0, 64, "ranks to spawn (0: one per GPU if there are 2 or more, else 4)");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the buffers live")->env = "COURSE_DEVICE";
    flag_double(&set, "timeout", &o.timeout, 0, 86400, "seconds any wait may take (0: COURSE_TIMEOUT or 300)");
    flag_bool(&set, "bench", &o.bench, "benchmark (nccl-tests style) instead of the lesson");
    flag_bool(&set, "mismatch", &o.mismatch, "a planted bug: rank 1 reduces with max where the others sum (try COURSE_DEBUG=DETAIL)");
    flag_int(&set, "check", &o.b.check, 0, 1000, "correctness rounds per size after timing (0: none)")->short_name = "c";
    flag_bytes(&set, "minbytes", &o.b.minbytes, 1, 2147483648.0, "smallest size (K, M, G suffixes)")->short_name = "b";
    flag_bytes(&set, "maxbytes", &o.b.maxbytes, 1, 2147483648.0, "largest size")->short_name = "e";
    flag_int(&set, "stepfactor", &o.b.stepfactor, 2, 1024, "multiply the size by this from one row to the next")->short_name = "f";
    flag_int(&set, "iters", &o.b.iters, 1, 1000000, "timed operations per size (fewer for big sizes)")->short_name = "n";
    flag_int(&set, "warmup_iters", &o.b.warmup_iters, 0, 1000000, "untimed operations per size first")->short_name = "w";
    flag_choice(&set, "op", &o.b.op, "sum|prod|min|max|avg|band|bor|bxor|all",
                "reduction (all: a row for each; band/bor/bxor: integer types)")->short_name = "o";
    flag_choice(&set, "datatype", &o.b.datatype, "float|double|int32|int64|uint8|bfloat16|half|all",
                "element type (all: a row for each)")->short_name = "d";
    flag_choice(&set, "collective", &o.b.collective,
                "all|broadcast|reduce|all_reduce|gather|all_gather|scatter|reduce_scatter|all_to_all|all_to_all_v|barrier",
                "which collective to measure");
    flag_int(&set, "root", &o.b.root, 0, 4095, "root rank of broadcast, reduce, gather, scatter")->short_name = "r";
    flags_parse(&set, argc, argv);
    bool bitwise = !strcmp(o.b.op, "band") || !strcmp(o.b.op, "bor") || !strcmp(o.b.op, "bxor");
    bool floating = !strcmp(o.b.datatype, "float") || !strcmp(o.b.datatype, "double") ||
                    !strcmp(o.b.datatype, "bfloat16") || !strcmp(o.b.datatype, "half");
    if (bitwise && floating)
        flags_fail(&set, "-o %s works on integer types (int32, int64, uint8), not -d %s", o.b.op, o.b.datatype);
    if (o.b.minbytes > o.b.maxbytes)
        flags_fail(&set, "-b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)", o.b.minbytes, o.b.maxbytes);
    if (o.nprocs == 0) {
        int gpus = strcmp(o.device, "cpu") ? device_count_gpus_before_fork() : 0;
        o.nprocs = gpus >= 2 ? gpus : 4;
    }
    int world = env->launched ? env->world_size : o.nprocs;
    if (o.b.root >= world) flags_fail(&set, "-r/--root %d is not a rank of a job of %d ranks", o.b.root, world);
    return o;
}

// ---------------------------------------------------------------- the lesson
// Every rank r starts with 100*r + i at index i, so the hundreds digit of
// any number says which rank it came from and the last digits where.
#define PER_RANK 4

typedef struct {
    pg_t *pg;
    const device_t *dev;
    int rank, world;
    size_t width;       // floats in the widest buffer: world * PER_RANK
    float *host_slot;   // [length, values...] of this rank's buffer
    float *dev_slot;
    float *dev_all;     // every rank's slot, gathered at rank 0
    float *host_all;
} lesson_t;

static float *buffer_new(const lesson_t *L, size_t len, bool numbered) {
    float *host = xcalloc(len, sizeof(float));
    if (numbered)
        for (size_t i = 0; i < len; i++) host[i] = (float)(100 * L->rank) + (float)i;
    float *dev = device_alloc(L->dev, len * sizeof(float));
    device_from_host(L->dev, dev, host, len * sizeof(float));
    free(host);
    return dev;
}

// Rank 0 prints every rank's buffer, in rank order. Printing on every rank
// at once would interleave the lines at random, so each rank ships its
// buffer to rank 0 with a gather (collective number 4 below) and rank 0
// prints them all. len 0: this rank has no such buffer (shown as "-").
static void show(lesson_t *L, const char *label, const float *buf, size_t len) {
    size_t slot = L->width + 1;
    memset(L->host_slot, 0, slot * sizeof(float));
    L->host_slot[0] = (float)len;
    if (len) device_to_host(L->dev, L->host_slot + 1, buf, len * sizeof(float));
    device_from_host(L->dev, L->dev_slot, L->host_slot, slot * sizeof(float));
    pg_gather(L->pg, L->dev_slot, L->dev_all, slot, DTYPE_F32, 0);
    if (L->rank != 0) return;
    device_to_host(L->dev, L->host_all, L->dev_all, (size_t)L->world * slot * sizeof(float));
    for (int r = 0; r < L->world; r++) {
        const float *s = L->host_all + (size_t)r * slot;
        printf("  %-7s rank %d: ", r == 0 ? label : "", r);
        if (s[0] == 0) printf("-");
        else printf("[");
        for (size_t i = 0; i < (size_t)s[0]; i++) printf("%s%4g", i ? " " : "", s[1 + i]);
        printf("%s\n", s[0] == 0 ? "" : "]");
    }
    fflush(stdout);
}

// One collective, drawn: every rank's input before, every rank's output
// after. Only the root has a send buffer in scatter and a result in reduce
// and gather; the other ranks show "-" there.
static void demo(lesson_t *L, coll_id c, int number, const char *what) {
    int root = 0;
    log_main("\n== %d. %s%s: %s\n", number, COLLECTIVE[c].name, COLLECTIVE[c].has_root ? " (root 0)" :
             COLLECTIVE[c].reduces ? " (sum)" : "", what);
    size_t slen = coll_send_len(c, PER_RANK, L->world), rlen = coll_recv_len(c, PER_RANK, L->world);
    bool is_root = L->rank == root;
    float *send = buffer_new(L, slen, true);
    float *recv = buffer_new(L, rlen, c == BROADCAST);
    if (c == BROADCAST) show(L, "before", recv, rlen);
    else show(L, "before", send, c == SCATTER && !is_root ? 0 : slen);
    coll_run(L->pg, c, send, recv, PER_RANK, DTYPE_F32, OP_SUM, root);
    show(L, "after", recv, (c == REDUCE || c == GATHER) && !is_root ? 0 : rlen);
    device_free(L->dev, send);
    device_free(L->dev, recv);
}

// Reductions are not only sums. On integers, bitwise or and and let the
// ranks agree on flags with one call: bor tells everyone which ranks raised
// a flag, band which flags every rank raised (torch.distributed has them as
// ReduceOp.BOR and BAND; NCCL does not, and the nccl backend combines them
// on the host).
static void demo_flags(lesson_t *L) {
    log_main("\n== 10. all_reduce with bor and band: agreeing on flags (integer types only)\n"
             "  element 0: rank r sets bit r when it is ready (rank 1 is not); element 1: the features a rank\n"
             "  supports, one bit each (all have 1 and 2; 4 all but the last rank; 8 rank 0 only)\n");
    int last = L->world - 1;
    int32_t flags[2] = {L->rank == 1 ? 0 : 1 << L->rank, 1 | 2 | (L->rank != last ? 4 : 0) | (L->rank == 0 ? 8 : 0)};
    int32_t *dev = device_alloc(L->dev, sizeof flags), *out = device_alloc(L->dev, sizeof flags);
    float *shown = device_alloc(L->dev, 2 * sizeof(float));
    float as_float[2];
    for (int step = 0; step < 3; step++) {
        const char *label = step == 0 ? "before" : step == 1 ? "bor" : "band";
        int32_t values[2];
        if (step == 0) memcpy(values, flags, sizeof values);
        else {
            device_from_host(L->dev, dev, flags, sizeof flags);
            pg_all_reduce(L->pg, dev, out, 2, DTYPE_I32, step == 1 ? OP_BOR : OP_BAND);
            device_to_host(L->dev, values, out, sizeof values);
        }
        as_float[0] = (float)values[0], as_float[1] = (float)values[1];
        device_from_host(L->dev, shown, as_float, sizeof as_float);
        show(L, label, shown, 2);
    }
    log_main("  bor of element 0: the ranks that are ready, as bits (rank 1's is missing); band of element 1:\n"
             "  the features every rank supports (1 + 2 = 3). Each is one all_reduce of one integer.\n");
    device_free(L->dev, dev);
    device_free(L->dev, out);
    device_free(L->dev, shown);
}

// A barrier moves no data; what it does is visible in time. Rank r arrives
// r*100 ms late; nobody leaves before the last one has arrived.
static void demo_barrier(lesson_t *L) {
    log_main("\n== 9. barrier: no rank leaves before every rank has arrived "
             "(rank r arrives after r x 100 ms)\n");
    pg_barrier(L->pg);
    double start = now_seconds();
    struct timespec late = {L->rank / 10, (long)(L->rank % 10) * 100 * 1000 * 1000};
    nanosleep(&late, NULL);
    float times[2];
    times[0] = roundf((float)((now_seconds() - start) * 1e3));
    pg_barrier(L->pg);
    times[1] = roundf((float)((now_seconds() - start) * 1e3));
    float *dev = device_alloc(L->dev, sizeof times);
    device_from_host(L->dev, dev, times, sizeof times);
    log_main("  (milliseconds since the ranks last met: arrived, left)\n");
    show(L, "times", dev, 2);
    device_free(L->dev, dev);
}

// Sub-groups: a collective need not involve every rank. pg_split (MPI's
// MPI_Comm_split, NCCL's ncclCommSplit) makes a group of the ranks that pass
// the same color; here the even ranks and the odd ranks, each group running
// its own all_reduce at the same time. This is how data, tensor and
// pipeline parallelism combine: each kind of parallelism talks inside its
// own groups (common/mesh.h lays them out; chapters 09-11 use them).
static void demo_subgroups(lesson_t *L) {
    log_main("\n== 11. sub-groups: pg_split(color = rank %% 2) makes a group of the even ranks and one of the odd\n"
             "  ranks; each all_reduces (sum) its [rank, group rank] on its own\n");
    pg_t *half = pg_split(L->pg, L->rank % 2, L->rank);
    float mine[2] = {(float)L->rank, (float)pg_rank(half)};
    float *dev = device_alloc(L->dev, sizeof mine), *sum = device_alloc(L->dev, sizeof mine);
    device_from_host(L->dev, dev, mine, sizeof mine);
    show(L, "before", dev, 2);
    pg_all_reduce(half, dev, sum, 2, DTYPE_F32, OP_SUM);   // only the ranks of this group take part
    show(L, "after", sum, 2);
    log_main("  the even ranks hold the sum over the even ranks, the odd ones over the odd ones; the two\n"
             "  all_reduces ran side by side, each on its own connections.\n");
    pg_destroy(half);
    device_free(L->dev, dev);
    device_free(L->dev, sum);
}

// all_to_all_v: an all_to_all whose chunks differ in size from pair to pair
// (PyTorch's all_to_all_single with split sizes, MPI_Alltoallv). A mixture
// of experts routes its tokens with it (chapter 13): each rank's router
// picks an expert for each token, and the tokens travel to the ranks that
// hold those experts, as many to each as chose it - uneven, often 0. A
// rank cannot know how many it will receive, so the counts go first, with
// an all_to_all of one count per peer; then the data, packed by peer in
// rank order (the block for rank p starts after the blocks for 0..p-1).
static void demo_all_to_all_v(lesson_t *L) {
    log_main("\n== 12. all_to_all_v: all_to_all with a count per pair (mixture-of-experts: tokens travel to the\n"
             "  rank of their expert, as many as chose it; chapter 13). Rank r sends (2r + p + 1) mod 3 numbers to\n"
             "  rank p; the counts go first (an all_to_all of one count per peer), then the numbers\n");
    int n = L->world;
    size_t *send_counts = xcalloc((size_t)n, sizeof(size_t)), *recv_counts = xcalloc((size_t)n, sizeof(size_t));
    int64_t *counts = xcalloc(2 * (size_t)n, sizeof(int64_t));   // sends, then receives
    size_t sends = 0, receives = 0;
    for (int p = 0; p < n; p++) sends += send_counts[p] = (size_t)((2 * L->rank + p + 1) % 3);
    for (int p = 0; p < n; p++) counts[p] = (int64_t)send_counts[p];
    int64_t *dev_counts = device_alloc(L->dev, 2 * (size_t)n * sizeof(int64_t));
    device_from_host(L->dev, dev_counts, counts, (size_t)n * sizeof(int64_t));
    pg_all_to_all(L->pg, dev_counts, dev_counts + n, 1, DTYPE_I64);   // count p of rank p comes to us
    device_to_host(L->dev, counts + n, dev_counts + n, (size_t)n * sizeof(int64_t));
    for (int p = 0; p < n; p++) receives += recv_counts[p] = (size_t)counts[n + p];
    // The counts, drawn as the lesson draws numbers.
    float *as_float = xcalloc(2 * (size_t)n, sizeof(float)), *dev_float = device_alloc(L->dev, 2 * (size_t)n * sizeof(float));
    for (int i = 0; i < 2 * n; i++) as_float[i] = (float)counts[i];
    device_from_host(L->dev, dev_float, as_float, 2 * (size_t)n * sizeof(float));
    show(L, "sends", dev_float, (size_t)n);
    show(L, "gets", dev_float + n, (size_t)n);
    float *send = buffer_new(L, sends, true), *recv = buffer_new(L, receives, false);
    show(L, "before", send, sends);
    pg_all_to_all_v(L->pg, send, send_counts, recv, recv_counts, DTYPE_F32);
    show(L, "after", recv, receives);
    log_main("  rank 1 gets rank 0's block for it (1 2: rank 0's 0 was its block for itself), then its own (100),\n"
             "  then the others' blocks: in rank order, each as long as its sender's count, some empty.\n");
    device_free(L->dev, send);
    device_free(L->dev, recv);
    device_free(L->dev, dev_counts);
    device_free(L->dev, dev_float);
    free(as_float);
    free(counts);
    free(send_counts);
    free(recv_counts);
}

// A collective is a promise: every rank calls it with the same count, type,
// reduction and root. --mismatch breaks it on purpose, as a bug in one rank's
// code would: rank 1 reduces with max where the others sum. The bytes still
// line up, so no backend notices; the ranks just end with different "sums".
// COURSE_DEBUG=DETAIL (pg_debug.h) compares the calls first and names them.
static void demo_mismatch(dist_t *d) {
    enum { COUNT = 1000 };
    redop_t op = d->rank == 1 ? OP_MAX : OP_SUM;
    log_main("\n== a planted bug: every rank all-reduces %d floats of value rank + 1 with sum, "
             "except rank 1, which uses max\n", COUNT);
    float *mine = xcalloc(COUNT, sizeof(float));
    for (int i = 0; i < COUNT; i++) mine[i] = (float)(d->rank + 1);
    float *dev = device_alloc(&d->device, COUNT * sizeof(float));
    device_from_host(&d->device, dev, mine, COUNT * sizeof(float));
    pg_all_reduce(d->pg, dev, dev, COUNT, DTYPE_F32, op);
    float *firsts = device_alloc(&d->device, (size_t)d->world_size * sizeof(float));
    pg_all_gather(d->pg, dev, firsts, 1, DTYPE_F32);   // element 0 of each rank's result
    float *got = xcalloc((size_t)d->world_size, sizeof(float));
    device_to_host(&d->device, got, firsts, (size_t)d->world_size * sizeof(float));
    log_main("  element 0 after the all_reduce (the sum is %d):", d->world_size * (d->world_size + 1) / 2);
    for (int r = 0; r < d->world_size; r++) log_main(" rank %d has %g%s", r, (double)got[r], r + 1 < d->world_size ? "," : "\n");
    log_main("  no error, no hang: the ranks silently disagree. Run it again with COURSE_DEBUG=DETAIL.\n");
    device_free(&d->device, firsts);
    device_free(&d->device, dev);
    free(got);
    free(mine);
}

static void run_lesson(dist_t *d) {
    lesson_t L = {d->pg, &d->device, d->rank, d->world_size, (size_t)d->world_size * PER_RANK,
                  NULL, NULL, NULL, NULL};
    size_t slot = L.width + 1;
    L.host_slot = xcalloc(slot, sizeof(float));
    L.host_all = xcalloc((size_t)L.world * slot, sizeof(float));
    L.dev_slot = device_alloc(L.dev, slot * sizeof(float));
    L.dev_all = device_alloc(L.dev, (size_t)L.world * slot * sizeof(float));
    log_main("Rank r starts with 100*r + i at index i: the hundreds digit says which rank a "
             "number came from.\n");
    demo(&L, BROADCAST, 1, "the root's buffer is copied to every rank "
         "(DDP: the initial parameters)");
    demo(&L, REDUCE, 2, "element-wise sum of all buffers, at the root only");
    demo(&L, ALL_REDUCE, 3, "element-wise sum of all buffers, on every rank "
         "(DDP: the gradients)");
    demo(&L, GATHER, 4, "every rank's buffer, one after the other, at the root");
    demo(&L, ALL_GATHER, 5, "every rank's buffer, one after the other, on every rank "
         "(ZeRO/FSDP: the parameter shards)");
    demo(&L, SCATTER, 6, "chunk r of the root's buffer goes to rank r");
    demo(&L, REDUCE_SCATTER, 7, "element-wise sum, then rank r keeps chunk r "
         "(ZeRO/FSDP: gradient shards; half of a ring all_reduce)");
    demo(&L, ALL_TO_ALL, 8, "chunk j of rank i goes to rank j as its chunk i: a transpose "
         "(mixture-of-experts)");
    demo_barrier(&L);
    demo_flags(&L);
    demo_subgroups(&L);
    demo_all_to_all_v(&L);
    free(L.host_slot);
    free(L.host_all);
    device_free(L.dev, L.dev_slot);
    device_free(L.dev, L.dev_all);
}

// ---------------------------------------------------------------- the rank's program
static int worker(int rank, int world_size, void *arg) {
    (void)rank, (void)world_size;   // dist_init reads them from the environment spawn set
    const options *o = arg;
    dist_options how = {.backend = o->backend, .device = o->device, .timeout_s = o->timeout};
    dist_t d;
    dist_init(&d, &how);
    log_main("03_collectives: %d ranks | device: %s (%s) | backend: %s\n", d.world_size, d.device.name,
             d.device.why, pg_describe(d.pg));
    if (o->b.root >= d.world_size) die("-r/--root %d is not a rank of this job of %d ranks", o->b.root, d.world_size);
    int status = 0;
    if (o->bench) status = run_bench(&d, &o->b);
    else if (o->mismatch) demo_mismatch(&d);
    else run_lesson(&d);
    dist_finish(&d);
    return d.rank == 0 ? status : 0;   // rank 0 speaks for the job
}

int main(int argc, char **argv) {
    launch_env_t env = launch_env_read();
    options opt = parse_options(argc, argv, &env);
    // Started by a launcher (ddprun, torchrun, srun): this process is one rank.
    if (env.launched) return worker(env.rank, env.world_size, &opt);
    // Started by hand: become a job of --nprocs ranks, like mp.spawn.
    return spawn(opt.nprocs, worker, &opt);
}
