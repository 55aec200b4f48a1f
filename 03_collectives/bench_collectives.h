// bench_collectives.h - chapter 3's benchmark, in the style of nccl-tests: for each
// collective, a table of sizes with the time per operation, the algorithm
// and bus bandwidths (collectives.h says how they are counted) and #wrong,
// the elements a correctness check found wrong. 03_collectives.c runs it
// for --bench; the lesson there shows what each collective does, this file
// how fast.
//
// How it measures (the preamble it prints says the same): per size, a few
// untimed operations, a barrier, then a host timer around n operations
// back to back; the time is the slowest rank's. Then -c rounds of fresh
// inputs whose results are small integers, exact in every type, so that
// any element that differs is wrong (common/bench.h has the size sweep).
#ifndef CH03_BENCH_COLLECTIVES_H
#define CH03_BENCH_COLLECTIVES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "bench.h"
#include "collectives.h"
#include "dist.h"
#include "log.h"
#include "metrics.h"
#include "timer.h"

// The flags of --bench (03_collectives.c parses them).
typedef struct {
    int check;
    size_t minbytes, maxbytes;
    int stepfactor, iters, warmup_iters;
    const char *op, *datatype, *collective;
    int root;
} bench_options;

// ---------------------------------------------------------------- types and values
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
    {"half", DTYPE_F16, 2, 0x1p-10},
};

typedef struct { const char *name; redop_t op; } op_info;
static const op_info OPS[] = {
    {"sum", OP_SUM}, {"prod", OP_PROD}, {"min", OP_MIN}, {"max", OP_MAX}, {"avg", OP_AVG},
    {"band", OP_BAND}, {"bor", OP_BOR}, {"bxor", OP_BXOR},   // integers only
};
#define TYPE_COUNT (sizeof TYPES / sizeof TYPES[0])
#define OP_COUNT (sizeof OPS / sizeof OPS[0])

// -d and -o name one type or reduction, or "all".
static bool selected(const char *asked, const char *name) { return !strcmp(asked, "all") || !strcmp(asked, name); }

static double load_value(dtype_t t, const void *base, size_t i) {
    switch (t) {
    case DTYPE_F32: return ((const float *)base)[i];
    case DTYPE_F64: return ((const double *)base)[i];
    case DTYPE_I32: return ((const int32_t *)base)[i];
    case DTYPE_I64: return (double)((const int64_t *)base)[i];
    case DTYPE_U8: return ((const uint8_t *)base)[i];
    case DTYPE_BF16:
    case DTYPE_F16: return float16_to_f32(t, ((const uint16_t *)base)[i]);
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
    case DTYPE_BF16:
    case DTYPE_F16: ((uint16_t *)base)[i] = f32_to_float16(t, (float)v); break;
    default: die("03_collectives: unknown data type %d", (int)t);
    }
}

typedef struct {
    const dist_t *dist;
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
    if (!COLLECTIVE[c].reduces) return (double)((r * 13 + i + s * 5) % 251);
    if (b->op->op == OP_PROD) return rank < 7 && (r + i + s) % 2 == 0 ? 2 : 1;
    if (redop_is_bitwise(b->op->op)) return (double)((r * 37 + i * 11 + s * 3) % 256);   // any 8 bits
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
        case OP_BAND: acc = (double)((long long)acc & (long long)v); break;
        case OP_BOR: acc = (double)((long long)acc | (long long)v); break;
        case OP_BXOR: acc = (double)((long long)acc ^ (long long)v); break;
        default: acc += v; break;   // sum, avg
        }
    }
    if (b->op->op != OP_AVG) return acc;
    return b->type->eps > 0 ? acc / b->n : floor(acc / b->n);   // integers: integer division
}

// all_to_all_v: where this rank's recv[j] comes from - rank *from, index
// *at of its send buffer - with coll_v_count's counts.
static void v_source(const bench_t *b, size_t chunk, size_t j, int *from, size_t *at) {
    int p = 0;
    while (p < b->n - 1 && j >= coll_v_count(chunk, p, b->rank, b->n)) j -= coll_v_count(chunk, p++, b->rank, b->n);
    size_t before = 0;   // what rank p sends to the ranks before this one
    for (int q = 0; q < b->rank; q++) before += coll_v_count(chunk, p, q, b->n);
    *from = p;
    *at = before + j;
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
    case ALL_TO_ALL_V: {
        int sender;
        size_t index;
        v_source(b, chunk, j, &sender, &index);
        return input_value(b, c, sender, index, seed);
    }
    default: return 0;
    }
}

// A value no correct result has: the receive buffer starts with it.
static double poison(const bench_t *b) { return b->type->type == DTYPE_U8 ? 255 : -1; }

// ---------------------------------------------------------------- measuring
typedef struct { size_t count, send, recv; } counts_t;   // elements per rank

// nccl-tests' count for a size: the elements of the size; for the
// collectives whose buffers hold one chunk per rank, the per-rank chunk,
// rounded down to a multiple of 16 bytes.
static counts_t counts_for(const bench_t *b, coll_id c, size_t bytes) {
    size_t ts = b->type->size, count = bytes / ts;
    if (COLLECTIVE[c].send_chunks || COLLECTIVE[c].recv_chunks) count = (count / (size_t)b->n) & ~(16 / ts - 1);
    if (c == BARRIER) count = 0;
    return (counts_t){count, coll_send_len(c, count, b->n), coll_recv_len(c, count, b->n)};
}

// nccl-tests' S (bytes for algbw) and busbw factor (collectives.h's table).
static double algbw_bytes(coll_id c, size_t count, size_t ts, int n) {
    if (c == ALL_TO_ALL_V) return (double)coll_send_len(c, count, n) * (double)ts;   // what a rank sends
    bool chunked = COLLECTIVE[c].send_chunks || COLLECTIVE[c].recv_chunks;
    return (double)count * (double)ts * (chunked ? n : 1);
}
static double bus_factor(coll_id c, int n) {
    switch (COLLECTIVE[c].bus) {
    case BUS_ONE: return 1;
    case BUS_RING: return (double)(n - 1) / n;
    case BUS_TWO_RINGS: return 2.0 * (n - 1) / n;
    case BUS_AWAY: return n > 1 ? 1 : 0;
    default: return 0;
    }
}
static const char *bus_factor_text(coll_id c) {
    switch (COLLECTIVE[c].bus) {
    case BUS_ONE: return "1";
    case BUS_TWO_RINGS: return "2(n-1)/n";
    case BUS_AWAY: return "1 (no byte stays on its rank)";
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
    coll_run(b->pg, c, b->send, b->recv, k.count, b->type->type, b->op->op, b->root);
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
    double tol_scale = b->op->op == OP_AVG && COLLECTIVE[c].reduces ? (b->n + 1) * t->eps : 0;
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

static void bench_preamble(const bench_t *b, const bench_options *o) {
    char date[32];
    bench_date(date, sizeof date, true);
    log_main("# 03_collectives --bench (nccl-tests style) | %s\n", date);
    log_main("# world size %d | device: %s | backend: %s\n", b->n, b->dev->name, pg_describe(b->pg));
    log_main("# sizes %zu B to %zu B, x%d per row | type %s | redop %s | root %d | check rounds %d\n",
             o->minbytes, o->maxbytes, o->stepfactor, o->datatype, o->op, b->root, o->check);
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

static void table_header(const bench_t *b, const bench_options *o, coll_id c) {
    log_main("#\n# %s", COLLECTIVE[c].name);
    if (c == BARRIER) {
        log_main(": no data, only time (a barrier is a 1-element all-reduce under NCCL)\n");
    } else if (c == ALL_TO_ALL_V) {
        log_main(": S = what a rank sends: about count x n elements, uneven: 2k/(n-1) x count to rank r+k\n"
                 "#   (rounded down; 0 to itself, 2 x count to rank r-1), the same total on every rank;\n"
                 "#   busbw = algbw x %s = algbw x %.4g (n = %d)\n", bus_factor_text(c), bus_factor(c, b->n), b->n);
    } else {
        bool chunked = COLLECTIVE[c].send_chunks || COLLECTIVE[c].recv_chunks;
        char size[32] = "(type size)";
        for (size_t t = 0; t < TYPE_COUNT; t++)
            if (!strcmp(o->datatype, TYPES[t].name)) snprintf(size, sizeof size, "%zu B", TYPES[t].size);
        log_main(": S = count x %s%s; busbw = algbw x %s = algbw x %.4g (n = %d)\n", size, chunked ? " x n" : "",
                 bus_factor_text(c), bus_factor(c, b->n), b->n);
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
    const char *redop = COLLECTIVE[c].reduces ? b->op->name : "none";
    int root = COLLECTIVE[c].has_root ? b->root : -1;
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
static long bench_collective(bench_t *b, const bench_options *o, coll_id c) {
    table_header(b, o, c);
    metrics_csv csv = {0};
    if (b->rank == 0)
        csv = bench_open_csv(b->dist, "03_collectives", COLLECTIVE[c].name,
                             "size_bytes,count,type,redop,root,time_us,algbw_GBps,busbw_GBps,wrong", true);
    long wrong_total = 0, rows = 0;
    bool checked = o->check > 0 && c != BARRIER;
    double busbw_sum = 0;
    for (size_t bytes = o->minbytes;; bytes *= (size_t)o->stepfactor) {
        // -d all and -o all: a row per type (and per reduction, for the
        // collectives that reduce), as nccl-tests does.
        for (size_t t = 0; t < TYPE_COUNT; t++) {
            if (!selected(o->datatype, TYPES[t].name) || (c == BARRIER && t > 0)) continue;
            b->type = &TYPES[t];
            bool op_done = false;
            for (size_t r = 0; r < OP_COUNT && !op_done; r++) {
                if (!selected(o->op, OPS[r].name)) continue;
                if (redop_is_bitwise(OPS[r].op) && TYPES[t].eps > 0) continue;   // bitwise: integer types only
                b->op = &OPS[r];
                op_done = !COLLECTIVE[c].reduces;   // the others: one row, whatever the op
                counts_t k = counts_for(b, c, c == BARRIER ? 0 : bytes);
                int iters = bench_iters_for(bytes, o->iters);
                int warmup = o->warmup_iters ? bench_iters_for(bytes, o->warmup_iters) : 0;
                double seconds = time_op(b, c, k, warmup, iters);
                long wrong = checked ? check_op(b, c, k, o->check) : -1;
                if (wrong > 0) wrong_total += wrong;
                table_row(b, c, k, seconds, wrong, &csv, &busbw_sum);
                rows++;
            }
        }
        if (c == BARRIER || bench_last_size(bytes, o->maxbytes, o->stepfactor)) break;
    }
    if (b->rank == 0) metrics_close(&csv);
    if (checked) log_main("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    else log_main("# Out of bounds values : N/A (%s)\n", c == BARRIER ? "a barrier moves no data" : "-c 0: not checked");
    log_main("# Avg bus bandwidth    : %g\n", busbw_sum / (double)rows);
    return wrong_total;
}


static int run_bench(dist_t *d, const bench_options *o) {
    bench_t b = {d, d->pg, &d->device, d->rank, d->world_size, o->root, &TYPES[0], &OPS[0],
                 NULL, NULL, NULL, NULL, NULL};
    b.send = device_alloc(b.dev, o->maxbytes);
    b.recv = device_alloc(b.dev, o->maxbytes);
    b.host_send = xmalloc(o->maxbytes);
    b.host_recv = xmalloc(o->maxbytes);
    b.scalar = device_alloc(b.dev, sizeof(double));
    // Timing inputs: ones (no overflow, no denormals, whatever the op).
    memset(b.host_send, 0, o->maxbytes);
    for (size_t i = 0; i < o->maxbytes / sizeof(float); i++) store_value(DTYPE_F32, b.host_send, i, 1);
    device_from_host(b.dev, b.send, b.host_send, o->maxbytes);
    device_from_host(b.dev, b.recv, b.host_send, o->maxbytes);
    bench_preamble(&b, o);
    long wrong = 0;
    for (int c = 0; c < COLLECTIVES; c++)
        if (!strcmp(o->collective, "all") || !strcmp(o->collective, COLLECTIVE[c].name))
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

#endif
