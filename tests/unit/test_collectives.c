// test_collectives.c - every collective of pg.h against a reference computed
// locally, driven by tests/library/test_collectives.sh.
//
// For each world size asked for, spawn() starts that many ranks; each rank
// meets the others (env://), creates a process group and runs every
// collective x dtype x op it allows x count, out of place and in place, with
// roots other than 0 for the rooted ones. Inputs are small integers chosen
// from (rank, index) so that every result is exact in every dtype (bf16
// holds integers up to 256; products stay within {-32..32}): the check is
// byte for byte. A last case all-reduces random, non-exact floats and
// compares a checksum of the result across ranks: the replicas of
// data-parallel training rely on those bytes being identical.
//
// Counts: 0, 1, 3 (fewer elements than ranks), 1000 (small-message
// algorithms) and 70001 (above the 64 KiB switch to the ring algorithms)
// for every dtype and op. The big count 1048577 (4 MiB of f32, odd so that
// blocks are uneven) runs for f32 SUM in every collective, plus u8 MAX and
// bf16 AVG all-reduce, to keep the file within a couple of minutes on 2 cores.
//
// all_to_all_v: counts per peer from a few patterns, uneven, with zeros (a
// rank that sends nothing to some peer, one that sends nothing at all, one
// that receives nothing at all, a job where nobody sends anything), small
// and above the ring's segments, against the blocks computed on the host;
// a rank with nothing to send or receive passes NULL there. Equal counts
// would hide a displacement taken from the wrong peer: these do not.
// --only all_to_all_v runs just those (the nccl backend on several GPUs,
// the planted bugs); --mismatch makes rank 0 send 5 elements to rank 1,
// which expects 4, for the checks of the error that names it.
//
// Then ddp_average_gradients (common/ddp.h): with buckets of a few bytes,
// for counts that fill the buckets exactly and that straddle their ends,
// against one plain all-reduce (AVG) of the whole buffer and against the
// exact mean: a bucket that is skipped or averaged twice shows.
//
// Results: the ranks add their failure counts per collective to the store
// (not through the process group under test) and rank 0 prints one PASS or
// FAIL line per collective and world size.
#include <math.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "pg.h"
#include "rendezvous.h"
#include "spawn.h"
#include "test.h"

enum { C_BROADCAST, C_REDUCE, C_ALL_REDUCE, C_GATHER, C_ALL_GATHER, C_SCATTER,
       C_REDUCE_SCATTER, C_ALL_TO_ALL, C_ALL_TO_ALL_V, C_BARRIER, C_IDENTICAL, C_DDP, C_COUNT };
static const char *coll_names[C_COUNT] = {"broadcast", "reduce", "all_reduce", "gather",
                                          "all_gather", "scatter", "reduce_scatter",
                                          "all_to_all", "all_to_all_v", "barrier", "identical bits",
                                          "ddp_average_gradients buckets"};

#define BIG_COUNT 1048577

typedef struct {
    const char *backend, *device, *label, *only;
    bool big, mismatch;
} options;

typedef struct {
    pg_t *pg;
    device_t *dev;
    rendezvous_t *rdzv;
    int rank, world;
    int checks[C_COUNT], failures[C_COUNT];
    char first[C_COUNT][200];   // the first failure, in words
} ctx_t;

// ---------------------------------------------------------------- inputs and references

// The value rank r contributes at index i: small integers, exact in every dtype.
static int64_t value(dtype_t t, redop_t op, int r, size_t i) {
    if (op == OP_PROD) {
        static const int pattern[] = {1, 2, -1, 1, 2, 1, -1};
        int v = pattern[(r * 3 + i) % 7];
        return t == DTYPE_U8 && v < 0 ? 1 : v;
    }
    if (redop_is_bitwise(op)) {
        uint64_t v = (uint64_t)(r + 1) * 0x9E3779B1u ^ (uint64_t)i * 0x85EBCA6Bu;
        return t == DTYPE_U8 ? (int64_t)(v & 0xff) : (int64_t)(v & 0x7fffffff);
    }
    int64_t v = (int64_t)((r * 7 + i * 13) % 11);
    return t == DTYPE_U8 ? v : v - 5;
}

static void put(void *buf, dtype_t t, size_t i, double v) {
    switch (t) {
    case DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case DTYPE_F64: ((double *)buf)[i] = v; break;
    case DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DTYPE_BF16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case DTYPE_F16: ((uint16_t *)buf)[i] = f32_to_f16((float)v); break;
    }
}

static void fill(void *buf, dtype_t t, redop_t op, int r, size_t first, size_t count) {
    for (size_t i = 0; i < count; i++) put(buf, t, i, (double)value(t, op, r, first + i));
}

// The expected reduction at index i, exactly as the backends define it
// (AVG: exact sum, then a division in the dtype's own arithmetic).
static void put_reduced(void *buf, size_t at, dtype_t t, redop_t op, int world, size_t i) {
    int64_t acc = value(t, op, 0, i);
    for (int r = 1; r < world; r++) {
        int64_t v = value(t, op, r, i);
        switch (op) {
        case OP_SUM: case OP_AVG: acc += v; break;
        case OP_PROD: acc *= v; break;
        case OP_MIN: acc = v < acc ? v : acc; break;
        case OP_MAX: acc = v > acc ? v : acc; break;
        case OP_BAND: acc &= v; break;
        case OP_BOR: acc |= v; break;
        case OP_BXOR: acc ^= v; break;
        }
    }
    if (op != OP_AVG || dtype_is_integer(t)) {
        put(buf, t, at, (double)(op == OP_AVG ? acc / world : acc));
        return;
    }
    if (t == DTYPE_F64) ((double *)buf)[at] = (double)acc / world;
    else if (t == DTYPE_F32) ((float *)buf)[at] = (float)acc / (float)world;
    else ((uint16_t *)buf)[at] = f32_to_float16(t, (float)acc / (float)world);
}

static void expect_reduced(void *buf, dtype_t t, redop_t op, int world, size_t first,
                           size_t count) {
    for (size_t i = 0; i < count; i++) put_reduced(buf, i, t, op, world, first + i);
}

// ---------------------------------------------------------------- running one case

static void record(ctx_t *c, int coll, bool ok, const char *fmt, ...) {
    c->checks[coll]++;
    if (ok) return;
    if (c->failures[coll]++ == 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(c->first[coll], sizeof c->first[coll], fmt, args);
        va_end(args);
    }
}

// Buffers live on the group's device; the test fills and reads them on the host.
static void *dev_alloc(ctx_t *c, size_t bytes) { return device_alloc(c->dev, bytes); }

static void *dev_copy(ctx_t *c, const void *host, size_t bytes) {
    void *d = device_alloc(c->dev, bytes);
    if (device_is_cuda(c->dev)) device_from_host(c->dev, d, host, bytes);
    else memcpy(d, host, bytes);
    return d;
}

static bool same(ctx_t *c, const void *dev, const void *expected, size_t bytes) {
    void *host = xcalloc(1, bytes);
    device_to_host(c->dev, host, dev, bytes);
    bool ok = memcmp(host, expected, bytes) == 0;
    free(host);
    return ok;
}

static const char *describe(char *buf, dtype_t t, redop_t op, size_t count, bool inplace) {
    snprintf(buf, 120, "%s %s count %zu%s", dtype_name(t), redop_name(op), count,
             inplace ? " in place" : "");
    return buf;
}

static void check_all_reduce(ctx_t *c, dtype_t t, redop_t op, size_t count, bool inplace) {
    size_t bytes = count * dtype_size(t);
    void *in = xcalloc(1, bytes), *want = xcalloc(1, bytes);
    fill(in, t, op, c->rank, 0, count);
    expect_reduced(want, t, op, c->world, 0, count);
    void *send = dev_copy(c, in, bytes), *recv = inplace ? send : dev_alloc(c, bytes);
    pg_all_reduce(c->pg, send, recv, count, t, op);
    char what[120];
    describe(what, t, op, count, inplace);
    record(c, C_ALL_REDUCE, same(c, recv, want, bytes), "%s", what);
    if (!inplace) record(c, C_ALL_REDUCE, same(c, send, in, bytes), "input changed: %s", what);
    device_free(c->dev, send);
    if (!inplace) device_free(c->dev, recv);
    free(in);
    free(want);
}

static void check_reduce(ctx_t *c, dtype_t t, redop_t op, size_t count, int root) {
    size_t bytes = count * dtype_size(t);
    void *in = xcalloc(1, bytes), *want = xcalloc(1, bytes);
    fill(in, t, op, c->rank, 0, count);
    expect_reduced(want, t, op, c->world, 0, count);
    void *send = dev_copy(c, in, bytes);
    void *recv = c->rank == root ? dev_alloc(c, bytes) : NULL;
    pg_reduce(c->pg, send, recv, count, t, op, root);
    char what[120];
    if (c->rank == root)
        record(c, C_REDUCE, same(c, recv, want, bytes), "%s root %d",
               describe(what, t, op, count, false), root);
    device_free(c->dev, send);
    if (recv) device_free(c->dev, recv);
    free(in);
    free(want);
}

static void check_reduce_scatter(ctx_t *c, dtype_t t, redop_t op, size_t count, bool inplace) {
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)c->world;
    void *in = xcalloc(1, all), *want = xcalloc(1, bytes);
    fill(in, t, op, c->rank, 0, count * (size_t)c->world);
    expect_reduced(want, t, op, c->world, (size_t)c->rank * count, count);
    char *send = dev_copy(c, in, all);
    void *recv = inplace ? send + (size_t)c->rank * bytes : dev_alloc(c, bytes);
    pg_reduce_scatter(c->pg, send, recv, count, t, op);
    char what[120];
    record(c, C_REDUCE_SCATTER, same(c, recv, want, bytes), "%s",
           describe(what, t, op, count, inplace));
    device_free(c->dev, send);
    if (!inplace) device_free(c->dev, recv);
    free(in);
    free(want);
}

static void check_broadcast(ctx_t *c, dtype_t t, size_t count, int root) {
    size_t bytes = count * dtype_size(t);
    void *want = xcalloc(1, bytes), *mine = xcalloc(1, bytes);
    fill(want, t, OP_SUM, root, 0, count);
    fill(mine, t, OP_SUM, c->rank, 0, count);
    void *buf = dev_copy(c, mine, bytes);
    pg_broadcast(c->pg, buf, count, t, root);
    record(c, C_BROADCAST, same(c, buf, want, bytes), "%s count %zu root %d", dtype_name(t),
           count, root);
    device_free(c->dev, buf);
    free(want);
    free(mine);
}

// recv[r * count + i] = rank r's value at i, for gather and all_gather.
static void *expect_gathered(ctx_t *c, dtype_t t, size_t count) {
    size_t bytes = count * dtype_size(t);
    char *want = xcalloc(1, bytes * (size_t)c->world);
    for (int r = 0; r < c->world; r++) fill(want + (size_t)r * bytes, t, OP_SUM, r, 0, count);
    return want;
}

static void check_all_gather(ctx_t *c, dtype_t t, size_t count, bool inplace) {
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)c->world;
    void *in = xcalloc(1, bytes), *want = expect_gathered(c, t, count);
    fill(in, t, OP_SUM, c->rank, 0, count);
    char *recv = dev_alloc(c, all);
    void *send = recv + (size_t)c->rank * bytes;
    if (inplace) device_from_host(c->dev, send, in, bytes);
    else send = dev_copy(c, in, bytes);
    pg_all_gather(c->pg, send, recv, count, t);
    record(c, C_ALL_GATHER, same(c, recv, want, all), "%s count %zu%s", dtype_name(t), count,
           inplace ? " in place" : "");
    if (!inplace) device_free(c->dev, send);
    device_free(c->dev, recv);
    free(in);
    free(want);
}

static void check_gather(ctx_t *c, dtype_t t, size_t count, int root) {
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)c->world;
    void *in = xcalloc(1, bytes), *want = expect_gathered(c, t, count);
    fill(in, t, OP_SUM, c->rank, 0, count);
    void *send = dev_copy(c, in, bytes), *recv = c->rank == root ? dev_alloc(c, all) : NULL;
    pg_gather(c->pg, send, recv, count, t, root);
    if (recv)
        record(c, C_GATHER, same(c, recv, want, all), "%s count %zu root %d", dtype_name(t),
               count, root);
    device_free(c->dev, send);
    if (recv) device_free(c->dev, recv);
    free(in);
    free(want);
}

static void check_scatter(ctx_t *c, dtype_t t, size_t count, int root) {
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)c->world;
    void *in = xcalloc(1, all), *want = xcalloc(1, bytes);
    fill(in, t, OP_SUM, root, 0, count * (size_t)c->world);
    fill(want, t, OP_SUM, root, (size_t)c->rank * count, count);
    void *send = c->rank == root ? dev_copy(c, in, all) : NULL, *recv = dev_alloc(c, bytes);
    pg_scatter(c->pg, send, recv, count, t, root);
    record(c, C_SCATTER, same(c, recv, want, bytes), "%s count %zu root %d", dtype_name(t),
           count, root);
    if (send) device_free(c->dev, send);
    device_free(c->dev, recv);
    free(in);
    free(want);
}

// Block p of rank r's send holds r's values at indices p*count..; rank q
// receives block q of every rank.
static void check_all_to_all(ctx_t *c, dtype_t t, size_t count, bool inplace) {
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)c->world;
    char *in = xcalloc(1, all), *want = xcalloc(1, all);
    fill(in, t, OP_SUM, c->rank, 0, count * (size_t)c->world);
    for (int p = 0; p < c->world; p++)
        fill(want + (size_t)p * bytes, t, OP_SUM, p, (size_t)c->rank * count, count);
    void *send = dev_copy(c, in, all), *recv = inplace ? send : dev_alloc(c, all);
    pg_all_to_all(c->pg, send, recv, count, t);
    record(c, C_ALL_TO_ALL, same(c, recv, want, all), "%s count %zu%s", dtype_name(t), count,
           inplace ? " in place" : "");
    device_free(c->dev, send);
    if (!inplace) device_free(c->dev, recv);
    free(in);
    free(want);
}

// ---------------------------------------------------------------- all_to_all_v

// How many elements rank a sends to rank b in each pattern of counts.
enum { V_UNEVEN, V_SILENT_ENDS, V_LARGE, V_NOTHING, V_PATTERNS };
static const char *v_pattern_names[V_PATTERNS] = {
    "uneven, some pairs 0", "rank 0 sends nothing, the last rank receives nothing",
    "large (up to 80044 per peer), some pairs 0", "nobody sends anything"};

static size_t v_count(int pattern, int a, int b, int n) {
    switch (pattern) {
    case V_UNEVEN: return (size_t)((a * 3 + b * 5 + 1) % 4);
    case V_SILENT_ENDS: return a == 0 || b == n - 1 ? 0 : (size_t)(1 + (a + 2 * b) % 3);
    case V_LARGE: return (size_t)((a * 7 + b * 3) % 5) * 20011;
    default: return 0;
    }
}

// Element k of the block rank a sends to rank b: exact in every dtype, and
// different from its neighbours and from the other blocks' first elements.
static double v_value(int a, int b, size_t k) { return (double)(((size_t)a * 37 + (size_t)b * 11 + k) % 251); }

// Room after each buffer, one peer's largest count: a block placed a peer
// off lands there (and shows as wrong bytes or a changed guard) instead of
// corrupting the heap.
#define V_GUARD (4 * 20011)

static void check_all_to_all_v(ctx_t *c, dtype_t t, int pattern) {
    int n = c->world, me = c->rank;
    size_t es = dtype_size(t), *send_counts = xcalloc((size_t)n, sizeof(size_t));
    size_t *recv_counts = xcalloc((size_t)n, sizeof(size_t)), sends = 0, receives = 0;
    for (int p = 0; p < n; p++) {
        send_counts[p] = v_count(pattern, me, p, n);
        recv_counts[p] = v_count(pattern, p, me, n);
        sends += send_counts[p];
        receives += recv_counts[p];
    }
    // send: our blocks for ranks 0, 1, ... packed; want: the blocks of ranks 0, 1, ... to us.
    char *in = xcalloc(1, sends * es + 1), *want = xcalloc(1, receives * es + 1);
    size_t at = 0;
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < send_counts[p]; k++) put(in, t, at++, v_value(me, p, k));
    at = 0;
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < recv_counts[p]; k++) put(want, t, at++, v_value(p, me, k));
    size_t room = (receives + V_GUARD) * es;   // the receive buffer starts as 0xee, no element's value
    char *poison = xmalloc(room);
    memset(poison, 0xee, room);
    void *send = NULL, *recv = NULL;
    if (sends) {
        send = dev_alloc(c, (sends + V_GUARD) * es);
        device_from_host(c->dev, send, in, sends * es);
    }
    if (receives) {
        recv = dev_alloc(c, room);
        device_from_host(c->dev, recv, poison, room);
    }
    pg_all_to_all_v(c->pg, send, send_counts, recv, recv_counts, t);
    char what[160];
    snprintf(what, sizeof what, "%s, %s: rank %d sends %zu, receives %zu", dtype_name(t),
             v_pattern_names[pattern], me, sends, receives);
    if (recv) {
        char *got = xcalloc(1, room);
        device_to_host(c->dev, got, recv, room);
        size_t bad = 0;
        while (bad < receives * es && got[bad] == want[bad]) bad++;
        // Which peer's block the first wrong byte is in.
        int from = 0;
        for (size_t end = recv_counts[0] * es; from < n - 1 && end <= bad; end += recv_counts[from] * es) from++;
        record(c, C_ALL_TO_ALL_V, bad == receives * es, "%s: byte %zu (in the block from rank %d) is wrong", what,
               bad, from);
        record(c, C_ALL_TO_ALL_V, memcmp(got + receives * es, poison, V_GUARD * es) == 0,
               "%s: bytes were written past the end of the receive buffer", what);
        free(got);
    } else {
        record(c, C_ALL_TO_ALL_V, true, "%s", what);
    }
    if (send) record(c, C_ALL_TO_ALL_V, same(c, send, in, sends * es), "input changed: %s", what);
    if (send) device_free(c->dev, send);
    if (recv) device_free(c->dev, recv);
    free(in);
    free(want);
    free(poison);
    free(send_counts);
    free(recv_counts);
}

static void run_all_to_all_v(ctx_t *c) {
    // Moving data looks at the size of an element only (see run_movers).
    for (int t = DTYPE_F32; t <= DTYPE_BF16; t++) {
        check_all_to_all_v(c, t, V_UNEVEN);
        check_all_to_all_v(c, t, V_SILENT_ENDS);
    }
    check_all_to_all_v(c, DTYPE_F32, V_LARGE);
    check_all_to_all_v(c, DTYPE_U8, V_LARGE);
    check_all_to_all_v(c, DTYPE_F32, V_NOTHING);
}

// The planted mismatch (--mismatch): every rank sends 2 elements to every
// rank, except that rank 0 sends 5 to rank 1, which expects 4 from it.
static void all_to_all_v_mismatch(ctx_t *c) {
    int n = c->world;
    size_t *send_counts = xcalloc((size_t)n, sizeof(size_t)), *recv_counts = xcalloc((size_t)n, sizeof(size_t));
    for (int p = 0; p < n; p++) send_counts[p] = recv_counts[p] = 2;
    if (c->rank == 0) send_counts[1] = 5;
    if (c->rank == 1) recv_counts[0] = 4;
    float *send = dev_alloc(c, 2 * (size_t)n * sizeof(float) + 3 * sizeof(float));
    float *recv = dev_alloc(c, 2 * (size_t)n * sizeof(float) + 2 * sizeof(float));
    pg_all_to_all_v(c->pg, send, send_counts, recv, recv_counts, DTYPE_F32);
    printf("# rank %d: all_to_all_v with mismatched counts returned without an error\n", c->rank);
    device_free(c->dev, send);
    device_free(c->dev, recv);
    free(send_counts);
    free(recv_counts);
}

// Nobody may leave the barrier before everybody has entered it.
static void check_barrier(ctx_t *c, int round) {
    char key[64];
    snprintf(key, sizeof key, "test/barrier%d", round);
    store_add(c->rdzv->store, key, 1);
    pg_barrier(c->pg);
    int64_t arrived = store_add(c->rdzv->store, key, 0);
    record(c, C_BARRIER, arrived == c->world, "left barrier %d when only %lld of %d ranks had "
           "arrived", round, (long long)arrived, c->world);
}

// ---------------------------------------------------------------- identical bits

static uint64_t fnv1a(const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// Random floats whose sums round differently in different orders: every
// rank must still end with the same bytes.
static void check_identical(ctx_t *c, dtype_t t, redop_t op, size_t count) {
    size_t bytes = count * dtype_size(t);
    char *in = xcalloc(1, bytes);
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(c->rank + 1);
    for (size_t i = 0; i < count; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        double v = ((double)(state >> 11) / 9007199254740992.0 - 0.5) * 1e3;
        put(in, t, i, v);
    }
    void *buf = dev_copy(c, in, bytes);
    pg_all_reduce(c->pg, buf, buf, count, t, op);
    device_to_host(c->dev, in, buf, bytes);
    int64_t sum = (int64_t)fnv1a(in, bytes), *sums = xcalloc((size_t)c->world, sizeof *sums);
    void *dsum = dev_copy(c, &sum, sizeof sum), *dsums = dev_alloc(c, sizeof sum * (size_t)c->world);
    pg_all_gather(c->pg, dsum, dsums, 1, DTYPE_I64);
    device_to_host(c->dev, sums, dsums, sizeof sum * (size_t)c->world);
    int differ = -1;
    for (int r = 0; r < c->world; r++)
        if (sums[r] != sums[0]) differ = r;
    record(c, C_IDENTICAL, differ < 0, "%s %s count %zu: rank %d's result differs from rank 0's",
           dtype_name(t), redop_name(op), count, differ);
    device_free(c->dev, buf);
    device_free(c->dev, dsum);
    device_free(c->dev, dsums);
    free(in);
    free(sums);
}

// ---------------------------------------------------------------- DDP buckets

// ddp_average_gradients in buckets of bucket_bytes (0: through the
// COURSE_DDP_BUCKET_BYTES variable, set to env_bytes) against one plain
// all-reduce of the whole buffer and against the exact mean.
static void check_ddp(ctx_t *c, size_t count, size_t bucket_bytes, const char *env_bytes) {
    size_t bytes = count * sizeof(float);
    float *in = xcalloc(count, sizeof(float)), *want = xcalloc(count, sizeof(float));
    fill(in, DTYPE_F32, OP_AVG, c->rank, 0, count);
    expect_reduced(want, DTYPE_F32, OP_AVG, c->world, 0, count);
    float *plain = dev_copy(c, in, bytes), *ddp = dev_copy(c, in, bytes);
    pg_all_reduce(c->pg, plain, plain, count, DTYPE_F32, OP_AVG);
    if (bucket_bytes) {
        ddp_average_gradients_in_buckets(c->pg, ddp, count, bucket_bytes);
    } else {
        setenv("COURSE_DDP_BUCKET_BYTES", env_bytes, 1);
        ddp_average_gradients(c->pg, ddp, count);
        unsetenv("COURSE_DDP_BUCKET_BYTES");
    }
    float *got = xcalloc(count, sizeof(float)), *ref = xcalloc(count, sizeof(float));
    device_to_host(c->dev, got, ddp, bytes);
    device_to_host(c->dev, ref, plain, bytes);
    size_t bad = 0;
    while (bad < count && got[bad] == want[bad]) bad++;
    char what[120];
    if (bucket_bytes) snprintf(what, sizeof what, "count %zu, buckets of %zu bytes", count, bucket_bytes);
    else snprintf(what, sizeof what, "count %zu, COURSE_DDP_BUCKET_BYTES=%s", count, env_bytes);
    record(c, C_DDP, memcmp(ref, want, bytes) == 0, "%s: the plain all-reduce is not the exact mean", what);
    size_t per_bucket = (bucket_bytes ? bucket_bytes : strtoull(env_bytes, NULL, 10)) / sizeof(float);
    record(c, C_DDP, bad == count, "%s: element %zu (in bucket %zu) is %g, the mean is %g", what, bad,
           bad / (per_bucket ? per_bucket : 1), bad < count ? got[bad] : 0.0, bad < count ? want[bad] : 0.0);
    device_free(c->dev, plain);
    device_free(c->dev, ddp);
    free(in);
    free(want);
    free(got);
    free(ref);
}

static void run_ddp(ctx_t *c) {
    // Buckets of 1, 3, 10 and 1000 floats: one bucket, exactly full ones,
    // and a last bucket that is partly full (or holds one element).
    static const struct { size_t count, bucket_bytes; } cases[] = {
        {0, 4}, {1, 4}, {2, 4}, {7, 4}, {3, 12}, {4, 12}, {8, 12}, {9, 12}, {10, 12},
        {10, 40}, {11, 40}, {19, 40}, {1000, 40}, {1001, 40},
        {999, 4000}, {1000, 4000}, {1001, 4000}, {70001, 4000}, {70001, 280004}, {70002, 280004},
        {70001, DDP_BUCKET_BYTES},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_ddp(c, cases[k].count, cases[k].bucket_bytes, NULL);
    check_ddp(c, 1001, 0, "40");   // the same through the variable the programs read
    check_ddp(c, 5, 0, "6");       // 6 bytes: buckets of one float
}

// ---------------------------------------------------------------- the plan

static bool allowed(dtype_t t, redop_t op) { return !redop_is_bitwise(op) || dtype_is_integer(t); }

static void run_reductions(ctx_t *c, const options *o) {
    const size_t counts[] = {0, 1, 3, 1000, 70001};
    int last = c->world - 1;
    for (int t = DTYPE_F32; t <= DTYPE_F16; t++)
        for (int op = OP_SUM; op <= OP_BXOR; op++) {
            if (!allowed(t, op)) continue;
            for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                size_t n = counts[k];
                check_all_reduce(c, t, op, n, false);
                check_reduce(c, t, op, n, k % 2 ? last : 0);
                check_reduce_scatter(c, t, op, n, false);
            }
            check_all_reduce(c, t, op, 1000, true);
            check_all_reduce(c, t, op, 70001, true);
            check_reduce_scatter(c, t, op, 1000, true);
        }
    if (!o->big) return;
    check_all_reduce(c, DTYPE_F32, OP_SUM, BIG_COUNT, false);
    check_all_reduce(c, DTYPE_F32, OP_SUM, BIG_COUNT, true);
    check_all_reduce(c, DTYPE_U8, OP_MAX, BIG_COUNT, false);
    check_all_reduce(c, DTYPE_BF16, OP_AVG, BIG_COUNT, false);
    check_reduce(c, DTYPE_F32, OP_SUM, BIG_COUNT, last);
    check_reduce_scatter(c, DTYPE_F32, OP_SUM, BIG_COUNT, false);
}

static void run_movers(ctx_t *c, const options *o) {
    const size_t counts[] = {0, 1, 3, 1000, 70001};
    int last = c->world - 1, middle = c->world / 2;
    // Moving data looks at the size of an element only: f16 moves as bf16
    // does (both 2 bytes), so the 2-byte case is bf16's.
    for (int t = DTYPE_F32; t <= DTYPE_BF16; t++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            size_t n = counts[k];
            check_broadcast(c, t, n, k % 2 ? last : 0);
            check_broadcast(c, t, n, middle);
            check_all_gather(c, t, n, k == 3);
            check_gather(c, t, n, k % 2 ? 0 : last);
            check_scatter(c, t, n, k % 2 ? middle : last);
            check_all_to_all(c, t, n, k == 3);
        }
    if (!o->big) return;
    check_broadcast(c, DTYPE_F32, BIG_COUNT, last);
    check_all_gather(c, DTYPE_F32, BIG_COUNT, false);
    check_gather(c, DTYPE_F32, BIG_COUNT, last);
    check_scatter(c, DTYPE_F32, BIG_COUNT, middle);
    check_all_to_all(c, DTYPE_F32, BIG_COUNT, true);
}

// Every rank adds its failures to the store; rank 0 prints the verdicts.
static void report(ctx_t *c, const options *o) {
    store_t *st = c->rdzv->store;
    char key[64];
    for (int k = 0; k < C_COUNT; k++) {
        snprintf(key, sizeof key, "test/fail/%d", k);
        store_add(st, key, c->failures[k]);
        snprintf(key, sizeof key, "test/why/%d/%d", k, c->rank);
        if (c->failures[k]) store_set(st, key, c->first[k], strlen(c->first[k]));
    }
    store_barrier(st, "test/report", c->rank, c->world, 0);
    if (c->rank != 0) return;
    for (int k = 0; k < C_COUNT; k++) {
        if (strcmp(o->only, "all") && strcmp(o->only, coll_names[k])) continue;
        char name[128], why[200] = "";
        snprintf(name, sizeof name, "%s%s n=%d", o->label, coll_names[k], c->world);
        snprintf(key, sizeof key, "test/fail/%d", k);
        int64_t failed = store_add(st, key, 0);
        for (int r = 0; r < c->world && failed && !why[0]; r++) {
            snprintf(key, sizeof key, "test/why/%d/%d", k, r);
            if (store_check(st, key)) why[store_get(st, key, why, sizeof why - 1, 5)] = '\0';
        }
        EXPECT(name, failed == 0, "%lld wrong results (of %d checks on rank 0), first: %s",
               (long long)failed, c->checks[k], why);
    }
}

static int worker(int rank, int world, void *arg) {
    (void)rank, (void)world;   // dist_init reads them: from spawn, or from mpirun
    const options *o = arg;
    dist_t d;
    dist_options how = {"env://", o->backend, o->device, 0};
    dist_init(&d, &how);
    ctx_t c = {.pg = d.pg, .dev = &d.device, .rdzv = &d.rdzv, .rank = d.rank, .world = d.world_size};
    if (c.rank == 0) printf("# world %d: %s\n", c.world, pg_describe(c.pg));
    if (o->mismatch) {
        all_to_all_v_mismatch(&c);
        dist_finish(&d);
        return 0;
    }
    if (!strcmp(o->only, "all_to_all_v")) {
        run_all_to_all_v(&c);
        report(&c, o);
        dist_finish(&d);
        return c.failures[C_ALL_TO_ALL_V] ? 1 : 0;
    }
    run_reductions(&c, o);
    run_movers(&c, o);
    run_all_to_all_v(&c);
    for (int round = 0; round < 3; round++) check_barrier(&c, round);
    check_identical(&c, DTYPE_F32, OP_SUM, 1000);
    check_identical(&c, DTYPE_F32, OP_AVG, 70001);
    check_identical(&c, DTYPE_F64, OP_SUM, 70001);
    check_identical(&c, DTYPE_BF16, OP_SUM, 70001);
    if (o->big) check_identical(&c, DTYPE_F32, OP_SUM, BIG_COUNT);
    run_ddp(&c);
    report(&c, o);
    dist_finish(&d);
    int failed = 0;
    for (int k = 0; k < C_COUNT; k++) failed += c.failures[k];
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    options o = {"cpu", "cpu", "", "all", true, false};
    const char *worlds = "1,2,3,4,5", *tag = "";
    flag_set set = {.program = "test_collectives", .summary = "checks every collective of pg.h"};
    flag_string(&set, "worlds", &worlds, "world sizes to run, comma-separated");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "process-group backend");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the buffers live");
    flag_bool(&set, "big", &o.big, "include the 1048577-element cases");
    flag_string(&set, "label", &o.label, "prefix for the test names");
    flag_choice(&set, "only", &o.only, "all|all_to_all_v", "run only the checks of this collective");
    flag_bool(&set, "mismatch", &o.mismatch, "a planted bug: rank 0 sends 5 elements to rank 1 in an "
              "all_to_all_v, which expects 4 (try COURSE_DEBUG=DETAIL)");
    flag_string(&set, "tag", &tag, "ignored; marks this run's processes for the leftover check");
    flags_parse(&set, argc, argv);
    // Started by mpirun (--backend mpi): this process is one rank of one job.
    if (launch_env_by_mpi()) return worker(0, 1, &o);
    int status = 0;
    for (const char *w = worlds; *w;) {
        int world = atoi(w);
        if (world < 1 || world > 64) die("--worlds: '%s' is not a list of sizes 1..64", worlds);
        int rc = spawn(world, worker, &o);
        if (rc != 0 && o.mismatch) {
            printf("# world %d: the job stopped (status %d), as the planted mismatch should make it\n", world, rc);
        } else if (rc != 0) {
            printf("FAIL %scollectives n=%d: the job failed (status %d); see the errors above\n",
                   o.label, world, rc);
            status = 1;
        }
        fflush(stdout);
        w += strcspn(w, ",");
        w += *w == ',';
    }
    return status;
}
