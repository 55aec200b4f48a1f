// 03_collectives.c - Chapter 3: the nine collectives, and how fast they are.
//
// Point-to-point (chapter 2) moves data between two ranks. A collective is
// an operation that every rank of the group calls together, each with its
// own buffer: broadcast, reduce, all_reduce, gather, all_gather, scatter,
// reduce_scatter, all_to_all and barrier. DDP rests on two of them:
// broadcast (the initial weights) and all_reduce (the gradients).
//
// Without flags the program runs each collective once on a tiny buffer and
// prints every rank's buffer before and after, so that you can see what
// moved where. With --bench it measures them in the style of nccl-tests:
// time, algorithm bandwidth, bus bandwidth, and a correctness check.
//
// Like chapter 2 it starts its own ranks with spawn(), or is one rank when
// a launcher (tools/ddprun, torchrun, srun) started it.
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "dist.h"
#include "flags.h"
#include "log.h"
#include "metrics.h"
#include "spawn.h"
#include "timer.h"

// ---------------------------------------------------------------- the nine collectives
typedef enum {
    BROADCAST, REDUCE, ALL_REDUCE, GATHER, ALL_GATHER, SCATTER, REDUCE_SCATTER, ALL_TO_ALL, BARRIER,
    COLLECTIVES
} coll_id;

static const char *const COLL_NAMES[COLLECTIVES] = {
    "broadcast", "reduce", "all_reduce", "gather", "all_gather",
    "scatter", "reduce_scatter", "all_to_all", "barrier",
};

static bool coll_has_root(coll_id c) { return c == BROADCAST || c == REDUCE || c == GATHER || c == SCATTER; }
static bool coll_reduces(coll_id c) { return c == REDUCE || c == ALL_REDUCE || c == REDUCE_SCATTER; }

// Every rank calls this with the same arguments except the buffers. The
// result is always in `recv`; broadcast works in place on `recv`.
static void collective(pg_t *pg, coll_id c, const void *send, void *recv, size_t count, dtype_t type,
                       redop_t op, int root) {
    switch (c) {
    case BROADCAST: pg_broadcast(pg, recv, count, type, root); break;
    case REDUCE: pg_reduce(pg, send, recv, count, type, op, root); break;
    case ALL_REDUCE: pg_all_reduce(pg, send, recv, count, type, op); break;
    case GATHER: pg_gather(pg, send, recv, count, type, root); break;
    case ALL_GATHER: pg_all_gather(pg, send, recv, count, type); break;
    case SCATTER: pg_scatter(pg, send, recv, count, type, root); break;
    case REDUCE_SCATTER: pg_reduce_scatter(pg, send, recv, count, type, op); break;
    case ALL_TO_ALL: pg_all_to_all(pg, send, recv, count, type); break;
    case BARRIER: pg_barrier(pg); break;
    case COLLECTIVES: break;
    }
}

// Buffer lengths in elements for `count` per rank, as the pg API counts:
// gather/all_gather/all_to_all receive one chunk from each of the n ranks,
// scatter/reduce_scatter/all_to_all send one chunk to each.
static size_t send_len(coll_id c, size_t count, int n) {
    return (c == SCATTER || c == REDUCE_SCATTER || c == ALL_TO_ALL) ? count * (size_t)n : count;
}
static size_t recv_len(coll_id c, size_t count, int n) {
    return (c == GATHER || c == ALL_GATHER || c == ALL_TO_ALL) ? count * (size_t)n : count;
}

// ---------------------------------------------------------------- options
typedef struct {
    int nprocs;
    const char *backend, *device;
    double timeout;
    bool bench;
    int check;
    size_t minbytes, maxbytes;
    int stepfactor, iters, warmup_iters;
    const char *op, *datatype, *collective;
    int root;
} options;

// Counts GPUs without initialising CUDA in this process: a child forked
// after CUDA is initialised cannot use the GPU (PyTorch counts devices
// through NVML before mp.spawn for the same reason). The driver lists one
// directory per GPU; CUDA_VISIBLE_DEVICES may hide some of them.
static int gpus_before_fork(void) {
#ifdef COURSE_CUDA
    DIR *dir = opendir("/proc/driver/nvidia/gpus");
    if (!dir) return 0;
    int count = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.') count++;
    closedir(dir);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible) {
        int listed = visible[0] ? 1 : 0;
        for (const char *p = visible; *p; p++) listed += *p == ',';
        if (listed < count) count = listed;
    }
    return count;
#else
    return 0;
#endif
}

static options parse_options(int argc, char **argv, const launch_env_t *env) {
    options o = {0, "auto", "auto", 0, false, 1, 8, (size_t)64 << 20, 2, 20, 5, "sum", "float", "all", 0};
    flag_t flags[] = {
        {"nprocs", NULL, FLAG_INT, &o.nprocs, "ranks to spawn (0: one per GPU if there are 2 or more, else 4)", 0, 64, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where the buffers live", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any wait may take (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
        {"bench", NULL, FLAG_BOOL, &o.bench, "benchmark (nccl-tests style) instead of the lesson", 1, 0, NULL, NULL},
        {"check", "c", FLAG_INT, &o.check, "correctness rounds per size after timing (0: none)", 0, 1000, NULL, NULL},
        {"minbytes", "b", FLAG_BYTES, &o.minbytes, "smallest size (K, M, G suffixes)", 1, 2147483648.0, NULL, NULL},
        {"maxbytes", "e", FLAG_BYTES, &o.maxbytes, "largest size", 1, 2147483648.0, NULL, NULL},
        {"stepfactor", "f", FLAG_INT, &o.stepfactor, "multiply the size by this from one row to the next", 2, 1024, NULL, NULL},
        {"iters", "n", FLAG_INT, &o.iters, "timed operations per size (fewer for big sizes)", 1, 1000000, NULL, NULL},
        {"warmup_iters", "w", FLAG_INT, &o.warmup_iters, "untimed operations per size first", 0, 1000000, NULL, NULL},
        {"op", "o", FLAG_STRING, &o.op, "reduction", 1, 0, "sum|prod|min|max|avg", NULL},
        {"datatype", "d", FLAG_STRING, &o.datatype, "element type", 1, 0, "float|double|int32|int64|uint8|bfloat16", NULL},
        {"collective", NULL, FLAG_STRING, &o.collective, "which collective to measure", 1, 0,
         "all|broadcast|reduce|all_reduce|gather|all_gather|scatter|reduce_scatter|all_to_all|barrier", NULL},
        {"root", "r", FLAG_INT, &o.root, "root rank of broadcast, reduce, gather, scatter", 0, 4095, NULL, NULL},
    };
    flag_set set = {"03_collectives", "the nine collectives, rank by rank; --bench: nccl-tests style benchmark",
                    NULL, flags, (int)(sizeof flags / sizeof flags[0])};
    flags_parse(&set, argc, argv);
    if (o.minbytes > o.maxbytes)
        flags_fail(&set, "-b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)", o.minbytes, o.maxbytes);
    if (o.nprocs == 0) {
        int gpus = strcmp(o.device, "cpu") ? gpus_before_fork() : 0;
        o.nprocs = gpus >= 2 ? gpus : 4;
    }
    int world = env->launched ? env->world_size : o.nprocs;
    if (o.root >= world) flags_fail(&set, "-r/--root %d is not a rank of a job of %d ranks", o.root, world);
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
    log_main("\n== %d. %s%s: %s\n", number, COLL_NAMES[c], coll_has_root(c) ? " (root 0)" :
             coll_reduces(c) ? " (sum)" : "", what);
    size_t slen = send_len(c, PER_RANK, L->world), rlen = recv_len(c, PER_RANK, L->world);
    bool is_root = L->rank == root;
    float *send = buffer_new(L, slen, true);
    float *recv = buffer_new(L, rlen, c == BROADCAST);
    if (c == BROADCAST) show(L, "before", recv, rlen);
    else show(L, "before", send, c == SCATTER && !is_root ? 0 : slen);
    collective(L->pg, c, send, recv, PER_RANK, DTYPE_F32, OP_SUM, root);
    show(L, "after", recv, (c == REDUCE || c == GATHER) && !is_root ? 0 : rlen);
    device_free(L->dev, send);
    device_free(L->dev, recv);
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
    free(L.host_slot);
    free(L.host_all);
    device_free(L.dev, L.dev_slot);
    device_free(L.dev, L.dev_all);
}

// ---------------------------------------------------------------- benchmark: types and values
typedef struct {
    const char *name;
    dtype_t type;
    size_t size;
    double eps;   // machine epsilon; 0 for integers
} type_info;

static const type_info TYPES[] = {
    {"float", DTYPE_F32, 4, 0x1p-23}, {"double", DTYPE_F64, 8, 0x1p-52},
    {"int32", DTYPE_I32, 4, 0},       {"int64", DTYPE_I64, 8, 0},
    {"uint8", DTYPE_U8, 1, 0},        {"bfloat16", DTYPE_BF16, 2, 0x1p-7},
};

typedef struct { const char *name; redop_t op; } op_info;
static const op_info OPS[] = {
    {"sum", OP_SUM}, {"prod", OP_PROD}, {"min", OP_MIN}, {"max", OP_MAX}, {"avg", OP_AVG},
};

static double load_value(dtype_t t, const void *base, size_t i) {
    switch (t) {
    case DTYPE_F32: return ((const float *)base)[i];
    case DTYPE_F64: return ((const double *)base)[i];
    case DTYPE_I32: return ((const int32_t *)base)[i];
    case DTYPE_I64: return (double)((const int64_t *)base)[i];
    case DTYPE_U8: return ((const uint8_t *)base)[i];
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)base)[i]);
    default: die("03_collectives: unknown data type %d", (int)t);
    }
}

// v is always a small integer here, except avg on floating types.
static void store_value(dtype_t t, void *base, size_t i, double v) {
    switch (t) {
    case DTYPE_F32: ((float *)base)[i] = (float)v; break;
    case DTYPE_F64: ((double *)base)[i] = v; break;
    case DTYPE_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case DTYPE_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case DTYPE_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    case DTYPE_BF16: ((uint16_t *)base)[i] = f32_to_bf16((float)v); break;
    default: die("03_collectives: unknown data type %d", (int)t);
    }
}

typedef struct {
    pg_t *pg;
    const device_t *dev;
    int rank, n, root;
    const type_info *type;
    const op_info *op;
    void *send, *recv;              // on the device, maxbytes each
    unsigned char *host_send, *host_recv;
    double *scalar;                 // one double on the device, to combine over ranks
} bench_t;

// The value `rank` puts at index i of its input in check round `seed`.
// Chosen so that every result is exact in every type, whatever order the
// backend reduces in: small integers whose sums stay <= 250 (exact in
// bfloat16 and uint8), and for prod at most seven factors of 2 (<= 128).
// Data-moving collectives get values that differ by rank and index, so a
// chunk delivered to the wrong place is caught.
static double input_value(const bench_t *b, coll_id c, int rank, size_t i, int seed) {
    size_t r = (size_t)rank, s = (size_t)seed;
    if (!coll_reduces(c)) return (double)((r * 13 + i + s * 5) % 251);
    if (b->op->op == OP_PROD) return rank < 7 && (r + i + s) % 2 == 0 ? 2 : 1;
    size_t spread = 250 / (size_t)b->n;
    if (spread > 7) spread = 7;
    if (spread < 1) spread = 1;
    return 1 + (double)((r * 5 + i * 3 + s) % spread);
}

// What every rank's element i reduces to (the inputs are exact integers,
// so double arithmetic gives the exact answer).
static double reduced_value(const bench_t *b, coll_id c, size_t i, int seed) {
    double acc = input_value(b, c, 0, i, seed);
    for (int q = 1; q < b->n; q++) {
        double v = input_value(b, c, q, i, seed);
        switch (b->op->op) {
        case OP_PROD: acc *= v; break;
        case OP_MIN: acc = v < acc ? v : acc; break;
        case OP_MAX: acc = v > acc ? v : acc; break;
        default: acc += v; break;   // sum, avg
        }
    }
    if (b->op->op != OP_AVG) return acc;
    return b->type->eps > 0 ? acc / b->n : floor(acc / b->n);   // integers: integer division
}

// The value this rank's recv[j] must hold after the collective.
static double expected_value(const bench_t *b, coll_id c, size_t chunk, size_t j, int seed) {
    size_t from = chunk ? j / chunk : 0, at = chunk ? j % chunk : 0;
    size_t mine = (size_t)b->rank * chunk;
    switch (c) {
    case BROADCAST: return input_value(b, c, b->root, j, seed);
    case REDUCE: case ALL_REDUCE: return reduced_value(b, c, j, seed);
    case GATHER: case ALL_GATHER: return input_value(b, c, (int)from, at, seed);
    case SCATTER: return input_value(b, c, b->root, mine + j, seed);
    case REDUCE_SCATTER: return reduced_value(b, c, mine + j, seed);
    case ALL_TO_ALL: return input_value(b, c, (int)from, mine + at, seed);
    default: return 0;
    }
}

// A value no correct result has: the receive buffer starts with it.
static double poison(const bench_t *b) { return b->type->type == DTYPE_U8 ? 255 : -1; }

// ---------------------------------------------------------------- benchmark: measuring
typedef struct { size_t count, send, recv; } counts_t;   // elements per rank

// nccl-tests' count for a size: the elements of the size for the others;
// for the chunked collectives, the per-rank chunk, rounded down to a
// multiple of 16 bytes.
static counts_t counts_for(const bench_t *b, coll_id c, size_t bytes) {
    size_t ts = b->type->size, count = bytes / ts;
    if (c == GATHER || c == ALL_GATHER || c == SCATTER || c == REDUCE_SCATTER || c == ALL_TO_ALL)
        count = (count / (size_t)b->n) & ~(16 / ts - 1);
    if (c == BARRIER) count = 0;
    return (counts_t){count, send_len(c, count, b->n), recv_len(c, count, b->n)};
}

// nccl-tests' S (bytes for algbw) and busbw factor for each collective.
static double algbw_bytes(coll_id c, size_t count, size_t ts, int n) {
    if (c == BROADCAST || c == REDUCE || c == ALL_REDUCE) return (double)count * (double)ts;
    return (double)count * (double)ts * n;
}
static double bus_factor(coll_id c, int n) {
    switch (c) {
    case BROADCAST: case REDUCE: return 1;
    case ALL_REDUCE: return 2.0 * (n - 1) / n;
    case BARRIER: return 0;
    default: return (double)(n - 1) / n;
    }
}
static const char *bus_factor_text(coll_id c) {
    switch (c) {
    case BROADCAST: case REDUCE: return "1";
    case ALL_REDUCE: return "2(n-1)/n";
    default: return "(n-1)/n";
    }
}

static double over_ranks(bench_t *b, double x, redop_t op) {
    device_from_host(b->dev, b->scalar, &x, sizeof x);
    pg_all_reduce(b->pg, b->scalar, b->scalar, 1, DTYPE_F64, op);
    device_to_host(b->dev, &x, b->scalar, sizeof x);
    return x;
}

static void run_op(bench_t *b, coll_id c, counts_t k) {
    collective(b->pg, c, b->send, b->recv, k.count, b->type->type, b->op->op, b->root);
}

// Operations for one size: the -n asked for, but fewer for big sizes, so
// that no size moves more than about 1 GiB per rank (at least 2).
static int iters_for(size_t bytes, int asked) {
    size_t fit = bytes ? ((size_t)1 << 30) / bytes : (size_t)asked;
    if (fit < 2) fit = 2;
    return fit < (size_t)asked ? (int)fit : asked;
}

// Seconds per operation: warm-up, a barrier, then a host timer around
// `iters` operations. The slowest rank's time: an operation is done when
// it is done everywhere. (nccl-tests shows the mean over ranks by default;
// but a rank that only sends - the non-roots of gather, the root of
// scatter - may return as soon as its bytes are queued, and a mean with
// those near-zero times would make the collective look faster than it is.)
static double time_op(bench_t *b, coll_id c, counts_t k, int warmup, int iters) {
    for (int i = 0; i < warmup; i++) run_op(b, c, k);
    pg_barrier(b->pg);
    double start = now_seconds();
    for (int i = 0; i < iters; i++) run_op(b, c, k);
    device_synchronize(b->dev);
    double seconds = (now_seconds() - start) / iters;
    return over_ranks(b, seconds, OP_MAX);
}

// Test hook: COURSE_BENCH_CORRUPT_RANK=r makes one element of rank r's
// result wrong after every checked operation, as a broken backend would, so
// that the tests can see the #wrong column count it and the exit status fail.
static int corrupt_rank(void) {
    const char *text = getenv("COURSE_BENCH_CORRUPT_RANK");
    return text && text[0] ? atoi(text) : -1;
}

// Correctness: fresh inputs, one operation, every element compared with the
// exact expected value. Returns the wrong elements summed over all ranks.
static long check_op(bench_t *b, coll_id c, counts_t k, int rounds) {
    const type_info *t = b->type;
    bool has_result = !((c == REDUCE || c == GATHER) && b->rank != b->root);
    double tol_scale = b->op->op == OP_AVG && coll_reduces(c) ? (b->n + 1) * t->eps : 0;
    long wrong = 0;
    for (int seed = 1; seed <= rounds && c != BARRIER; seed++) {
        for (size_t i = 0; i < k.send; i++) store_value(t->type, b->host_send, i, input_value(b, c, b->rank, i, seed));
        for (size_t i = 0; i < k.recv; i++)
            store_value(t->type, b->host_recv, i, c == BROADCAST && b->rank == b->root ?
                        input_value(b, c, b->rank, i, seed) : poison(b));
        device_from_host(b->dev, b->send, b->host_send, k.send * t->size);
        device_from_host(b->dev, b->recv, b->host_recv, k.recv * t->size);
        run_op(b, c, k);
        device_to_host(b->dev, b->host_recv, b->recv, k.recv * t->size);
        if (has_result && k.recv > 0 && corrupt_rank() == b->rank) store_value(t->type, b->host_recv, 0, poison(b));
        for (size_t j = 0; has_result && j < k.recv; j++) {
            double want = expected_value(b, c, k.count, j, seed);
            double got = load_value(t->type, b->host_recv, j);
            if (!(fabs(got - want) <= tol_scale * fmax(fabs(want), 1))) wrong++;   // NaN counts as wrong
        }
    }
    return (long)over_ranks(b, (double)wrong, OP_SUM);
}

static void bench_preamble(const bench_t *b, const options *o) {
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&now));
    log_main("# 03_collectives --bench (nccl-tests style) | %s\n", date);
    log_main("# world size %d | device: %s | backend: %s\n", b->n, b->dev->name, pg_describe(b->pg));
    log_main("# sizes %zu B to %zu B, x%d per row | type %s | redop %s | root %d | check rounds %d\n",
             o->minbytes, o->maxbytes, o->stepfactor, b->type->name, b->op->name, b->root, o->check);
    log_main("# method: per size, %d warm-up ops, a barrier, then a host timer (CLOCK_MONOTONIC) around n\n"
             "#   back-to-back ops, n = %d (fewer for big sizes: each size moves at most ~1 GiB per rank, n >= 2);\n"
             "#   time = elapsed / n of the slowest rank (nccl-tests shows the mean over ranks by default; a rank\n"
             "#   that only sends may return once its bytes are queued, and its near-zero time would flatter the\n"
             "#   mean). The pg's ops are blocking for the host, so they run one after another (nccl-tests\n"
             "#   enqueues all n on a CUDA stream).\n"
             "#   Out-of-place only: send and receive buffers differ (broadcast works in place).\n"
             "# columns: size = larger of send and receive buffer; count = elements per rank as nccl-tests\n"
             "#   counts them (per-rank chunks rounded down to 16 B); algbw = S / time; busbw = algbw x factor;\n"
             "#   GB = 1e9 B; root -1: none. #wrong: after timing, -c rounds with fresh inputs whose results\n"
             "#   are exact small integers; elements that differ (avg on float types: by more than (n+1) eps),\n"
             "#   summed over ranks.\n",
             o->warmup_iters, o->iters);
}

static void table_header(const bench_t *b, coll_id c) {
    log_main("#\n# %s", COLL_NAMES[c]);
    if (c == BARRIER) {
        log_main(": no data, only time (a barrier is a 1-element all-reduce under NCCL)\n");
    } else {
        bool per_rank = c == BROADCAST || c == REDUCE || c == ALL_REDUCE;
        log_main(": S = count x %zu B%s; busbw = algbw x %s = algbw x %.4g (n = %d)\n", b->type->size,
                 per_rank ? "" : " x n", bus_factor_text(c), bus_factor(c, b->n), b->n);
    }
    log_main("#\n#%11s %13s %9s %7s %7s %9s %7s %7s %7s\n", "size", "count", "type", "redop", "root",
             "time", "algbw", "busbw", "#wrong");
    log_main("#%11s %13s %9s %7s %7s %9s %7s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
             "(GB/s)", "(GB/s)");
}

static void table_row(const bench_t *b, coll_id c, counts_t k, double seconds, long wrong,
                      metrics_csv *csv, double *busbw_sum) {
    size_t ts = b->type->size;
    size_t size = (k.send > k.recv ? k.send : k.recv) * ts;
    double algbw = seconds > 0 ? algbw_bytes(c, k.count, ts, b->n) / seconds / 1e9 : 0;
    double busbw = algbw * bus_factor(c, b->n);
    const char *type = c == BARRIER ? "none" : b->type->name;
    const char *redop = coll_reduces(c) ? b->op->name : "none";
    int root = coll_has_root(c) ? b->root : -1;
    char wrong_text[24];
    if (wrong < 0) snprintf(wrong_text, sizeof wrong_text, "N/A");
    else snprintf(wrong_text, sizeof wrong_text, "%ld", wrong);
    log_main(" %11zu %13zu %9s %7s %7d %9.2f %7.2f %7.2f %7s\n", size, k.count, type, redop, root,
             seconds * 1e6, algbw, busbw, wrong_text);
    if (b->rank == 0)
        metrics_row(csv, "%zu,%zu,%s,%s,%d,%.3f,%.6f,%.6f,%ld", size, k.count, type, redop, root,
                    seconds * 1e6, algbw, busbw, wrong);
    *busbw_sum += busbw;
}

// One collective over all sizes; returns its wrong elements.
static long bench_collective(bench_t *b, const options *o, coll_id c) {
    table_header(b, c);
    metrics_csv csv = {0};
    if (b->rank == 0) {
        char dir[1024], date[32], name[32];   // a bounded name keeps the path's length known
        files_runs_dir(dir, sizeof dir, "03_collectives");
        snprintf(name, sizeof name, "%s", COLL_NAMES[c]);
        csv = metrics_open(dir, name, "size_bytes,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong");
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
        // One comment line that plots/03_collectives.gp reads for its title.
        metrics_row(&csv, "# %s | backend %s | %d ranks | %s", b->dev->name, backend_name(pg_backend(b->pg)),
                    b->n, date);
    }
    long wrong_total = 0, rows = 0;
    bool checked = o->check > 0 && c != BARRIER;
    double busbw_sum = 0;
    for (size_t bytes = o->minbytes;; bytes *= (size_t)o->stepfactor) {
        counts_t k = counts_for(b, c, c == BARRIER ? 0 : bytes);
        int iters = iters_for(bytes, o->iters);
        int warmup = o->warmup_iters ? iters_for(bytes, o->warmup_iters) : 0;
        double seconds = time_op(b, c, k, warmup, iters);
        long wrong = checked ? check_op(b, c, k, o->check) : -1;
        if (wrong > 0) wrong_total += wrong;
        table_row(b, c, k, seconds, wrong, &csv, &busbw_sum);
        rows++;
        if (c == BARRIER || bytes > o->maxbytes / (size_t)o->stepfactor) break;
    }
    if (b->rank == 0) metrics_close(&csv);
    if (checked) log_main("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    else log_main("# Out of bounds values : N/A (%s)\n", c == BARRIER ? "a barrier moves no data" : "-c 0: not checked");
    log_main("# Avg bus bandwidth    : %g\n", busbw_sum / (double)rows);
    return wrong_total;
}

static const type_info *find_type(const char *name) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(TYPES[i].name, name)) return &TYPES[i];
    die("unknown data type '%s'", name);
}
static const op_info *find_op(const char *name) {
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
        if (!strcmp(OPS[i].name, name)) return &OPS[i];
    die("unknown reduction '%s'", name);
}

static int run_bench(dist_t *d, const options *o) {
    bench_t b = {d->pg, &d->device, d->rank, d->world_size, o->root, find_type(o->datatype),
                 find_op(o->op), NULL, NULL, NULL, NULL, NULL};
    b.send = device_alloc(b.dev, o->maxbytes);
    b.recv = device_alloc(b.dev, o->maxbytes);
    b.host_send = xmalloc(o->maxbytes);
    b.host_recv = xmalloc(o->maxbytes);
    b.scalar = device_alloc(b.dev, sizeof(double));
    // Timing inputs: ones (no overflow, no denormals, whatever the op).
    for (size_t i = 0; i < o->maxbytes / b.type->size; i++) store_value(b.type->type, b.host_send, i, 1);
    device_from_host(b.dev, b.send, b.host_send, o->maxbytes);
    device_from_host(b.dev, b.recv, b.host_send, o->maxbytes);
    bench_preamble(&b, o);
    long wrong = 0;
    for (int c = 0; c < COLLECTIVES; c++)
        if (!strcmp(o->collective, "all") || !strcmp(o->collective, COLL_NAMES[c]))
            wrong += bench_collective(&b, o, (coll_id)c);
    char dir[1024];
    files_runs_dir(dir, sizeof dir, "03_collectives");
    log_main("#\n# CSV: %s/<collective>.csv\n", dir);
    if (wrong) log_main("# FAILED: %ld wrong values in all\n", wrong);
    device_free(b.dev, b.send);
    device_free(b.dev, b.recv);
    device_free(b.dev, b.scalar);
    free(b.host_send);
    free(b.host_recv);
    return wrong ? 1 : 0;
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
    if (o->root >= d.world_size) die("-r/--root %d is not a rank of this job of %d ranks", o->root, d.world_size);
    int status = 0;
    if (o->bench) status = run_bench(&d, o);
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
