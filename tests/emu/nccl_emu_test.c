// nccl_emu_test.c - tests the emulated NCCL (emu/src/nccl_*.c) with real processes.
//
// Each scenario forks N processes, one rank each with its own emulated
// device (EMU_TEST_DEVICE), sharing the ncclUniqueId that the parent made
// before the fork. Every check prints a FAIL line with what it saw; each
// scenario ends with one PASS or FAIL line; the exit status is 0 only when
// everything passed.
//
// Build from the repository root, with the stub core in place of the real
// runtime (all memory counts as device memory; streams run when synchronized):
//   gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -I emu/include -I emu/src emu/src/nccl_*.c
//       tests/emu/stub_stream.c tests/emu/nccl_emu_test.c -o /tmp/nccl_emu_test -pthread -lrt -lm
// Run: /tmp/nccl_emu_test            (all scenarios, 2, 3, 4 and 8 ranks)
//      /tmp/nccl_emu_test quick      (the full matrix at 2 and 3 ranks only)
//      /tmp/nccl_emu_test stress     (short-lived communicators, many times: races)
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "nccl.h"

// From stub_stream.c.
void stub_mark_host_memory(const void *p, size_t bytes, int pinned);
int stub_queued_ops(void);

// ================================================================ harness

typedef struct {
    int rank, nranks;
    ncclUniqueId id, id2;   // id2: for a second communicator
} rank_ctx;

typedef void (*rank_fn)(rank_ctx *ctx);

static int failures;      // in a rank process: checks that failed
static int my_rank = -1;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            failures++;                                                       \
            fprintf(stderr, "FAIL [rank %d] %s:%d: ", my_rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
        }                                                                     \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static pid_t all_children[4096];
static int all_children_count;

// Forks nranks processes running fn; devices[r] (or r) is rank r's emulated
// device. Returns true when every rank exited 0 within max_s seconds.
static bool run_ranks(const char *name, int nranks, rank_fn fn, const int *devices, double max_s) {
    rank_ctx ctx = {.nranks = nranks};
    ncclGetUniqueId(&ctx.id);
    ncclGetUniqueId(&ctx.id2);
    pid_t pids[64];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            char device[16];
            snprintf(device, sizeof device, "%d", devices ? devices[r] : r);
            setenv("EMU_TEST_DEVICE", device, 1);
            ctx.rank = my_rank = r;
            fn(&ctx);
            fflush(stdout);
            fflush(stderr);
            exit(failures ? 1 : 0);   // exit, not _exit: the leak checker runs at exit
        }
        pids[r] = pid;
        all_children[all_children_count++] = pid;
    }
    // Reap children as soon as they exit (a zombie still looks alive to
    // kill(pid, 0)); kill everything after max_s.
    bool ok = true;
    int left = nranks;
    double deadline = now_s() + max_s;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            left--;
            int r = 0;
            while (r < nranks && pids[r] != pid) r++;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                ok = false;
                if (WIFSIGNALED(status))
                    fprintf(stderr, "FAIL %s: rank %d was killed by signal %d\n", name, r, WTERMSIG(status));
            }
            continue;
        }
        if (now_s() > deadline) {
            fprintf(stderr, "FAIL %s: still running after %g s; killing the ranks\n", name, max_s);
            for (int r = 0; r < nranks; r++) kill(pids[r], SIGKILL);
            deadline = now_s() + 1e9;
            ok = false;
        }
        sleep_s(0.005);
    }
    printf("%s %s (%d rank%s)\n", ok ? "PASS" : "FAIL", name, nranks, nranks > 1 ? "s" : "");
    fflush(stdout);
    return ok;
}

static bool contains(const char *text, const char *part) { return text && strstr(text, part); }

// Polls a non-blocking communicator until its last call has finished.
static ncclResult_t wait_nonblocking(ncclComm_t comm) {
    ncclResult_t state = ncclInProgress;
    double deadline = now_s() + 30;
    while (state == ncclInProgress && now_s() < deadline) {
        ncclResult_t res = ncclCommGetAsyncError(comm, &state);
        if (res != ncclSuccess) return res;
        if (state == ncclInProgress) sleep_s(0.0001);
    }
    return state;
}

static ncclComm_t init_blocking(rank_ctx *c) {
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRank(&comm, c->nranks, c->id, c->rank);
    CHECK(res == ncclSuccess, "ncclCommInitRank: %s: %s", ncclGetErrorString(res), ncclGetLastError(NULL));
    return comm;
}

// ================================================================ data

static const ncclDataType_t all_types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                           ncclFloat64, ncclBfloat16};
static const ncclRedOp_t all_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const char *type_names[] = {"int8",   "uint8",   "int32",   "uint32", "int64",
                                   "uint64", "float16", "float32", "float64", "bfloat16"};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static bool type_has_negatives(ncclDataType_t t) {
    return t != ncclUint8 && t != ncclUint32 && t != ncclUint64;
}

// A small integer as an IEEE half (exact for |v| < 2048); written
// independently of the emulator's rounding code.
static uint16_t half_of_small_int(int64_t v) {
    uint16_t sign = v < 0 ? 0x8000 : 0;
    uint64_t m = (uint64_t)(v < 0 ? -v : v);
    if (m == 0) return 0;
    int e = 63 - __builtin_clzll(m);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((m << (10 - e)) & 0x3ff));
}

// Element i of buf (of type t) := v.
static void put(void *buf, size_t i, ncclDataType_t t, int64_t v) {
    unsigned char *at = (unsigned char *)buf + i * type_size(t);
    switch (t) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(at, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(at, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(at, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(at, &x, 4); break; }
    case ncclInt64: { int64_t x = v; memcpy(at, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(at, &x, 8); break; }
    case ncclFloat16: { uint16_t x = half_of_small_int(v); memcpy(at, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(at, &x, 4); break; }
    case ncclFloat64: { double x = (double)v; memcpy(at, &x, 8); break; }
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        uint16_t x = (uint16_t)(bits >> 16);   // exact: small integers fit in 8 bits of mantissa
        memcpy(at, &x, 2);
        break;
    }
    default: break;
    }
}

static bool element_is(const void *buf, size_t i, ncclDataType_t t, int64_t v) {
    unsigned char want[8];
    put(want, 0, t, v);
    return memcmp((const unsigned char *)buf + i * type_size(t), want, type_size(t)) == 0;
}

// Rank r's input at index i, chosen so that every result is an exact small
// integer in every type: products of +-1 and 2, sums of -5..10, and for avg
// sums that nranks divides.
static int64_t input(ncclRedOp_t op, bool negatives, int rank, int nranks, size_t i) {
    switch (op) {
    case ncclProd: {
        int64_t v = (i + (size_t)rank) % 4 == 0 ? 2 : 1;
        return negatives && (i * 3 + (size_t)rank) % 5 == 0 ? -v : v;
    }
    case ncclAvg: {
        if (rank < nranks - 1) return (int64_t)((i * 7 + (size_t)rank * 3) % 6);
        int64_t sum = 0;
        for (int r = 0; r < nranks - 1; r++) sum += (int64_t)((i * 7 + (size_t)r * 3) % 6);
        int64_t mean = (sum + nranks - 1) / nranks + (int64_t)(i % 2);
        return mean * nranks - sum;
    }
    default:
        return (int64_t)((i * 7 + (size_t)rank * 3) % 11) - (negatives ? 5 : 0);
    }
}

static int64_t expected_reduction(ncclRedOp_t op, bool negatives, int nranks, size_t i) {
    int64_t acc = input(op, negatives, 0, nranks, i);
    for (int r = 1; r < nranks; r++) {
        int64_t v = input(op, negatives, r, nranks, i);
        switch (op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    return op == ncclAvg ? acc / nranks : acc;
}

// ================================================================ the collective matrix

enum { T_ALL_REDUCE, T_BROADCAST, T_REDUCE, T_ALL_GATHER, T_REDUCE_SCATTER, T_KINDS };
static const char *kind_names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter"};

typedef struct {
    int kind;
    ncclDataType_t t;
    ncclRedOp_t op;
    size_t count;
    bool in_place;
    int root;
} coll_case;

static bool kind_reduces(int kind) {
    return kind == T_ALL_REDUCE || kind == T_REDUCE || kind == T_REDUCE_SCATTER;
}

static ncclResult_t call(const coll_case *k, const void *send, void *recv, ncclComm_t comm, cudaStream_t s) {
    switch (k->kind) {
    case T_ALL_REDUCE: return ncclAllReduce(send, recv, k->count, k->t, k->op, comm, s);
    case T_BROADCAST: return ncclBroadcast(send, recv, k->count, k->t, k->root, comm, s);
    case T_REDUCE: return ncclReduce(send, recv, k->count, k->t, k->op, k->root, comm, s);
    case T_ALL_GATHER: return ncclAllGather(send, recv, k->count, k->t, comm, s);
    default: return ncclReduceScatter(send, recv, k->count, k->t, k->op, comm, s);
    }
}

// What element i of this rank's recvbuff must hold afterwards; false where
// nothing is promised (the recvbuff of a non-root in an in-place reduce).
static bool expected_element(const coll_case *k, int rank, int nranks, size_t i, int64_t *v,
                             bool *untouched) {
    bool neg = type_has_negatives(k->t);
    *untouched = false;
    switch (k->kind) {
    case T_ALL_REDUCE: *v = expected_reduction(k->op, neg, nranks, i); return true;
    case T_REDUCE:
        if (rank == k->root) {
            *v = expected_reduction(k->op, neg, nranks, i);
            return true;
        }
        *untouched = !k->in_place;   // a non-root's recvbuff is not written
        return !k->in_place;
    case T_BROADCAST: *v = input(ncclSum, neg, k->root, nranks, i); return true;
    case T_ALL_GATHER: *v = input(ncclSum, neg, (int)(i / k->count), nranks, i % k->count); return true;
    default: *v = expected_reduction(k->op, neg, nranks, (size_t)rank * k->count + i); return true;
    }
}

static void run_case(const coll_case *k, ncclComm_t comm, cudaStream_t s, int rank, int nranks) {
    size_t size = type_size(k->t), n = k->count, all = n * (size_t)nranks;
    bool neg = type_has_negatives(k->t);
    size_t send_elems = k->kind == T_REDUCE_SCATTER ? all : n;
    size_t recv_elems = k->kind == T_ALL_GATHER ? all : n;
    unsigned char *send, *recv, *buf = NULL, *send_alloc = NULL;
    if (k->in_place) {
        buf = malloc(all * size + 1);
        memset(buf, 0xEE, all * size);
        send = recv = buf;
        if (k->kind == T_ALL_GATHER) send = buf + (size_t)rank * n * size;
        if (k->kind == T_REDUCE_SCATTER) recv = buf + (size_t)rank * n * size;
    } else {
        send = send_alloc = malloc(send_elems * size + 1);
        recv = buf = malloc(recv_elems * size + 1);
        memset(recv, 0xEE, recv_elems * size);
    }
    // This rank's input.
    for (size_t i = 0; i < send_elems; i++) {
        if (k->kind == T_BROADCAST) {
            if (rank == k->root) put(send, i, k->t, input(ncclSum, neg, rank, nranks, i));
        } else {
            put(send, i, k->t, input(kind_reduces(k->kind) ? k->op : ncclSum, neg, rank, nranks, i));
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s %s count %zu %s root %d", kind_names[k->kind], type_names[k->t],
             kind_reduces(k->kind) ? op_names[k->op] : "-", n, k->in_place ? "in place" : "out of place",
             k->root);
    ncclResult_t res = call(k, send, recv, comm, s);
    CHECK(res == ncclSuccess, "%s: %s (%s)", what, ncclGetErrorString(res), ncclGetLastError(comm));
    cudaError_t err = cudaStreamSynchronize(s);
    CHECK(err == cudaSuccess, "%s: stream failed (%s)", what, ncclGetLastError(comm));
    if (res == ncclSuccess && err == cudaSuccess) {
        for (size_t i = 0; i < recv_elems; i++) {
            int64_t v = 0;
            bool untouched;
            if (!expected_element(k, rank, nranks, i, &v, &untouched)) break;
            bool good = untouched ? recv[i * size] == 0xEE : element_is(recv, i, k->t, v);
            if (!good) {
                CHECK(good, "%s: element %zu is wrong (want %s%lld)", what, i,
                      untouched ? "untouched, not " : "", (long long)v);
                break;
            }
        }
    }
    free(buf);
    free(send_alloc);
}

static size_t chunk_plus_some(int kind, ncclDataType_t t, int nranks) {
    size_t per_chunk = 256 * 1024 / type_size(t);   // EMU_NCCL_SLOT_BYTES
    if (kind == T_REDUCE_SCATTER) per_chunk /= (size_t)nranks;
    return per_chunk + 5;
}

// ncclAvg on integers divides with truncation, like C.
static void check_integer_average(ncclComm_t comm, cudaStream_t s, int rank, int nranks) {
    int32_t v32[2] = {rank, -rank};
    int64_t v64[2] = {rank, -rank};
    CHECK(ncclAllReduce(v32, v32, 2, ncclInt32, ncclAvg, comm, s) == ncclSuccess, "avg int32");
    CHECK(ncclAllReduce(v64, v64, 2, ncclInt64, ncclAvg, comm, s) == ncclSuccess, "avg int64");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "avg sync");
    int32_t sum = nranks * (nranks - 1) / 2;
    CHECK(v32[0] == sum / nranks && v32[1] == -sum / nranks, "int32 avg: %d %d, want %d %d", v32[0],
          v32[1], sum / nranks, -sum / nranks);
    CHECK(v64[0] == sum / nranks && v64[1] == -sum / nranks, "int64 avg: %lld %lld",
          (long long)v64[0], (long long)v64[1]);
}

static void test_matrix(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    if (c->rank == 0) {   // the segment's name is gone once everybody has joined
        char path[200];
        snprintf(path, sizeof path, "/dev/shm%s", c->id.internal + 16);
        CHECK(access(path, F_OK) != 0, "%s still exists after every rank joined", path);
    }
    int count_r = -1, rank_r = -1, dev_r = -1;
    CHECK(ncclCommCount(comm, &count_r) == ncclSuccess && count_r == c->nranks, "ncclCommCount %d", count_r);
    CHECK(ncclCommUserRank(comm, &rank_r) == ncclSuccess && rank_r == c->rank, "ncclCommUserRank %d", rank_r);
    CHECK(ncclCommCuDevice(comm, &dev_r) == ncclSuccess && dev_r == c->rank, "ncclCommCuDevice %d", dev_r);
    cudaStream_t s;
    cudaStreamCreate(&s);
    for (int kind = 0; kind < T_KINDS; kind++) {
        for (size_t ti = 0; ti < sizeof all_types / sizeof *all_types; ti++) {
            int nops = kind_reduces(kind) ? 5 : 1;
            for (int oi = 0; oi < nops; oi++) {
                size_t counts[] = {0, 1, 7, chunk_plus_some(kind, all_types[ti], c->nranks)};
                for (int ci = 0; ci < 4; ci++) {
                    for (int in_place = 0; in_place < 2; in_place++) {
                        bool rooted = kind == T_BROADCAST || kind == T_REDUCE;
                        int roots[2] = {rooted ? 0 : -1, rooted ? c->nranks - 1 : -1};
                        for (int ri = 0; ri < (rooted && c->nranks > 1 ? 2 : 1); ri++) {
                            coll_case k = {kind, all_types[ti], all_ops[oi], counts[ci], in_place,
                                           roots[ri]};
                            run_case(&k, comm, s, c->rank, c->nranks);
                            if (failures > 20) return;   // enough to see what is wrong
                        }
                    }
                }
            }
        }
    }
    check_integer_average(comm, s, c->rank, c->nranks);
    CHECK(ncclCommFinalize(comm) == ncclSuccess, "finalize");
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
}

// 1M floats: many chunks.
static void test_large(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    cudaStream_t s;
    cudaStreamCreate(&s);
    int n = c->nranks;
    size_t count = 1 << 20, per_rank = count / (size_t)n;
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    for (size_t i = 0; i < count; i++) a[i] = (float)((i + (size_t)c->rank) % 1000);
    CHECK(ncclAllReduce(a, b, count, ncclFloat, ncclSum, comm, s) == ncclSuccess, "allreduce");
    CHECK(ncclAllReduce(a, a, count, ncclFloat, ncclSum, comm, s) == ncclSuccess, "allreduce in place");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += (float)((i + (size_t)r) % 1000);
        if (a[i] != want || b[i] != want) {
            CHECK(false, "allreduce 1M: element %zu is %g / %g, want %g", i, a[i], b[i], want);
            break;
        }
    }
    // all-gather of per_rank each, then reduce-scatter back
    for (size_t i = 0; i < per_rank; i++) a[i] = (float)(c->rank * 1000 + (int)(i % 1000));
    CHECK(ncclAllGather(a, b, per_rank, ncclFloat, comm, s) == ncclSuccess, "allgather");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    for (size_t i = 0; i < per_rank * (size_t)n; i++) {
        float want = (float)((int)(i / per_rank) * 1000 + (int)(i % per_rank % 1000));
        if (b[i] != want) {
            CHECK(false, "allgather 1M: element %zu is %g, want %g", i, b[i], want);
            break;
        }
    }
    CHECK(ncclReduceScatter(b, a, per_rank, ncclFloat, ncclMax, comm, s) == ncclSuccess, "reducescatter");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    for (size_t i = 0; i < per_rank; i++) {
        float want = (float)(c->rank * 1000 + (int)(i % 1000));
        if (a[i] != want) {
            CHECK(false, "reducescatter 1M: element %zu is %g, want %g", i, a[i], want);
            break;
        }
    }
    if (c->rank == n - 1)
        for (size_t i = 0; i < count; i++) a[i] = (float)(i % 4096);
    CHECK(ncclBroadcast(a, a, count, ncclFloat, n - 1, comm, s) == ncclSuccess, "broadcast");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    for (size_t i = 0; i < count; i++)
        if (a[i] != (float)(i % 4096)) {
            CHECK(false, "broadcast 1M: element %zu is %g", i, a[i]);
            break;
        }
    free(a);
    free(b);
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
}

// 16-bit floats are added in float and rounded once, to nearest with ties
// to even; every rank gets the same bits. Two ranks: result = a + b.
static void test_half_rounding(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    enum { N = 7 };
    // fp16: 2048+1 and 2050+1 are ties (spacing 2): to even, 2048 and 2052;
    // 65504+8 rounds down, 65504+16 is a tie that rounds up to infinity;
    // 2^-24 twice is 2^-23 (subnormals); inf + -inf is NaN (0x7FFF).
    uint16_t f16_a[N] = {0x6800, 0x6801, 0x7bff, 0x7bff, 0x0001, 0x7c00, 0x3c00};
    uint16_t f16_b[N] = {0x3c00, 0x3c00, 0x4800, 0x4c00, 0x0001, 0xfc00, 0xbc00};
    uint16_t f16_want[N] = {0x6800, 0x6802, 0x7bff, 0x7c00, 0x0002, 0x7fff, 0x0000};
    // bf16: 256+1 and 258+1 are ties (spacing 2): 256 and 260; 1 + 2^-8 is
    // a tie that stays 1; 1 + 3*2^-9 rounds up; inf + -inf is NaN.
    uint16_t bf_a[N] = {0x4380, 0x4381, 0x3f80, 0x3f80, 0x7f80, 0x0000, 0xc000};
    uint16_t bf_b[N] = {0x3f80, 0x3f80, 0x3b80, 0x3bc0, 0xff80, 0x0000, 0x4000};
    uint16_t bf_want[N] = {0x4380, 0x4382, 0x3f80, 0x3f81, 0x7fff, 0x0000, 0x0000};
    uint16_t f16[N], bf[N];
    memcpy(f16, c->rank == 0 ? f16_a : f16_b, sizeof f16);
    memcpy(bf, c->rank == 0 ? bf_a : bf_b, sizeof bf);
    CHECK(ncclAllReduce(f16, f16, N, ncclFloat16, ncclSum, comm, 0) == ncclSuccess, "fp16");
    CHECK(ncclAllReduce(bf, bf, N, ncclBfloat16, ncclSum, comm, 0) == ncclSuccess, "bf16");
    CHECK(cudaStreamSynchronize(0) == cudaSuccess, "sync");
    for (int i = 0; i < N; i++) {
        CHECK(f16[i] == f16_want[i], "fp16 %d: 0x%04x, want 0x%04x", i, f16[i], f16_want[i]);
        CHECK(bf[i] == bf_want[i], "bf16 %d: 0x%04x, want 0x%04x", i, bf[i], bf_want[i]);
    }
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
}

// ================================================================ send and receive

static void test_p2p(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    cudaStream_t s;
    cudaStreamCreate(&s);
    int n = c->nranks, me = c->rank, next = (me + 1) % n, prev = (me + n - 1) % n;

    // A ring shift of 400 KB (bigger than a channel's ring), a second
    // message to the same peer that must arrive second, and a send to self,
    // all in one group: without the group each rank would wait in its send.
    size_t big = 100003, self_count = 70001;
    float *out = malloc(big * sizeof *out), *in = malloc(big * sizeof *in);
    int32_t small_out[3] = {me, me * 10, me * 100}, small_in[3] = {-1, -1, -1};
    int64_t *self_out = malloc(self_count * sizeof *self_out), *self_in = malloc(self_count * sizeof *self_in);
    for (size_t i = 0; i < big; i++) out[i] = (float)(me * 1000000 + (int)i);
    for (size_t i = 0; i < self_count; i++) self_out[i] = (int64_t)i * 3 + me;
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclSend(out, big, ncclFloat, next, comm, s) == ncclSuccess, "send");
    CHECK(ncclSend(small_out, 3, ncclInt32, next, comm, s) == ncclSuccess, "send 2");
    CHECK(ncclRecv(in, big, ncclFloat, prev, comm, s) == ncclSuccess, "recv");
    CHECK(ncclRecv(small_in, 3, ncclInt32, prev, comm, s) == ncclSuccess, "recv 2");
    CHECK(ncclGroupStart() == ncclSuccess, "nested group start");
    CHECK(ncclSend(self_out, self_count, ncclInt64, me, comm, s) == ncclSuccess, "send self");
    CHECK(ncclRecv(self_in, self_count, ncclInt64, me, comm, s) == ncclSuccess, "recv self");
    CHECK(ncclGroupEnd() == ncclSuccess, "nested group end");
    CHECK(ncclGroupEnd() == ncclSuccess, "group end");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync: %s", ncclGetLastError(comm));
    for (size_t i = 0; i < big; i++)
        if (in[i] != (float)(prev * 1000000 + (int)i)) {
            CHECK(false, "ring shift: element %zu is %g", i, in[i]);
            break;
        }
    CHECK(small_in[0] == prev && small_in[1] == prev * 10 && small_in[2] == prev * 100,
          "second message: %d %d %d", small_in[0], small_in[1], small_in[2]);
    for (size_t i = 0; i < self_count; i++)
        if (self_in[i] != (int64_t)i * 3 + me) {
            CHECK(false, "send to self: element %zu", i);
            break;
        }

    // Outside a group: rank 0 sends two messages to rank 1 (a blocking send
    // completes when the receiver has taken everything).
    size_t bytes = 300000;
    unsigned char *data = malloc(bytes);
    int32_t second[4] = {0};
    if (me == 0) {
        for (size_t i = 0; i < bytes; i++) data[i] = (unsigned char)(i * 7);
        int32_t msg[4] = {4, 3, 2, 1};
        CHECK(ncclSend(data, bytes, ncclUint8, 1, comm, s) == ncclSuccess, "send");
        CHECK(ncclSend(msg, 4, ncclInt32, 1, comm, s) == ncclSuccess, "send");
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync: %s", ncclGetLastError(comm));
    } else if (me == 1) {
        memset(data, 0, bytes);
        CHECK(ncclRecv(data, bytes, ncclUint8, 0, comm, s) == ncclSuccess, "recv");
        CHECK(ncclRecv(second, 4, ncclInt32, 0, comm, s) == ncclSuccess, "recv");
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync: %s", ncclGetLastError(comm));
        for (size_t i = 0; i < bytes; i++)
            if (data[i] != (unsigned char)(i * 7)) {
                CHECK(false, "plain send/recv: byte %zu", i);
                break;
            }
        CHECK(second[0] == 4 && second[3] == 1, "second plain message");
    }

    // Collectives and point-to-point in one group run in call order.
    int32_t total = me + 1, passed[10], got[10];
    float many[5] = {1, 2, 3, 4, (float)me};
    for (int i = 0; i < 10; i++) passed[i] = me * 100 + i;
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclAllReduce(&total, &total, 1, ncclInt32, ncclSum, comm, s) == ncclSuccess, "allreduce in group");
    CHECK(ncclSend(passed, 10, ncclInt32, next, comm, s) == ncclSuccess, "send in group");
    CHECK(ncclRecv(got, 10, ncclInt32, prev, comm, s) == ncclSuccess, "recv in group");
    CHECK(ncclAllReduce(many, many, 5, ncclFloat, ncclMax, comm, s) == ncclSuccess, "allreduce in group");
    CHECK(ncclGroupEnd() == ncclSuccess, "group end");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync: %s", ncclGetLastError(comm));
    CHECK(total == n * (n + 1) / 2, "allreduce in group: %d", total);
    CHECK(many[4] == (float)(n - 1) && many[0] == 1, "max in group: %g", many[4]);
    CHECK(got[0] == prev * 100 && got[9] == prev * 100 + 9, "recv in group: %d", got[0]);

    // A second communicator at the same time, with the ranks reversed.
    ncclComm_t other = NULL;
    CHECK(ncclCommInitRank(&other, n, c->id2, n - 1 - me) == ncclSuccess, "second comm: %s",
          ncclGetLastError(NULL));
    if (other) {
        int32_t who = me, where = -1;
        CHECK(ncclAllReduce(&who, &who, 1, ncclInt32, ncclMax, other, s) == ncclSuccess, "allreduce 2");
        CHECK(ncclCommUserRank(other, &where) == ncclSuccess && where == n - 1 - me, "rank in comm 2");
        CHECK(ncclAllReduce(&total, &total, 1, ncclInt32, ncclMin, comm, s) == ncclSuccess, "allreduce 1");
        CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync: %s", ncclGetLastError(NULL));
        CHECK(who == n - 1, "allreduce on the second comm: %d", who);
        CHECK(ncclCommDestroy(other) == ncclSuccess, "destroy 2");
    }
    free(out); free(in); free(self_out); free(self_in); free(data);
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
}

// ================================================================ non-blocking communicators

static void test_nonblocking(rank_ctx *c) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comm, c->nranks, c->id, c->rank, &config);
    CHECK(res == ncclInProgress, "init: %s", ncclGetErrorString(res));
    if (!comm) return;
    int count = 0;
    res = ncclCommCount(comm, &count);   // asking anything before the poll says "done" is misuse
    CHECK(res == ncclInvalidUsage, "ncclCommCount during init: %s", ncclGetErrorString(res));
    CHECK(contains(ncclGetLastError(comm), "still in progress (poll ncclCommGetAsyncError"),
          "message: %s", ncclGetLastError(comm));
    CHECK(wait_nonblocking(comm) == ncclSuccess, "init finished: %s", ncclGetLastError(comm));
    CHECK(ncclCommCount(comm, &count) == ncclSuccess && count == c->nranks, "count");

    cudaStream_t s;
    cudaStreamCreate(&s);
    double x[3] = {1, 2, (double)c->rank};
    res = ncclAllReduce(x, x, 3, ncclDouble, ncclSum, comm, s);
    CHECK(res == ncclInProgress, "allreduce answers %s", ncclGetErrorString(res));
    res = ncclAllReduce(x, x, 3, ncclDouble, ncclSum, comm, s);
    CHECK(res == ncclInvalidUsage, "a second call before polling: %s", ncclGetErrorString(res));
    CHECK(contains(ncclGetLastError(comm), "called ncclAllReduce while the communicator's previous call"),
          "message: %s", ncclGetLastError(comm));
    CHECK(wait_nonblocking(comm) == ncclSuccess, "poll");
    while (cudaStreamQuery(s) == cudaErrorNotReady) {
        ncclResult_t state;
        CHECK(ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclSuccess, "async error");
        sleep_s(0.0001);
    }
    int n = c->nranks;
    CHECK(x[0] == n && x[1] == 2 * n && x[2] == n * (n - 1) / 2.0, "allreduce: %g %g %g", x[0], x[1], x[2]);

    // A group on a non-blocking communicator: ncclGroupEnd answers "in progress".
    int32_t out = c->rank, in = -1;
    CHECK(ncclGroupStart() == ncclSuccess, "group start");
    CHECK(ncclSend(&out, 1, ncclInt32, (c->rank + 1) % n, comm, s) == ncclSuccess, "send in group");
    CHECK(ncclRecv(&in, 1, ncclInt32, (c->rank + n - 1) % n, comm, s) == ncclSuccess, "recv in group");
    res = ncclGroupEnd();
    CHECK(res == ncclInProgress, "group end answers %s", ncclGetErrorString(res));
    CHECK(wait_nonblocking(comm) == ncclSuccess, "poll");

    // Finalize with work still queued: it progresses inside ncclCommGetAsyncError.
    float y = 1;
    CHECK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, comm, s) == ncclInProgress, "allreduce");
    CHECK(wait_nonblocking(comm) == ncclSuccess, "poll");
    res = ncclCommFinalize(comm);
    CHECK(res == ncclInProgress, "finalize answers %s", ncclGetErrorString(res));
    CHECK(wait_nonblocking(comm) == ncclSuccess, "finalize finished: %s", ncclGetLastError(comm));
    CHECK(in == (c->rank + n - 1) % n, "recv in group: %d", in);
    CHECK(y == (float)n, "allreduce completed by finalize: %g", y);
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
}

// ================================================================ mismatches

static void test_mismatch(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *buf = calloc(1024, sizeof *buf);
    ncclResult_t res = c->rank == 0 ? ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, s)
                                    : ncclBroadcast(buf, buf, 512, ncclFloat, 0, comm, s);
    CHECK(res == ncclSuccess, "the call itself is fine: %s", ncclGetErrorString(res));
    CHECK(cudaStreamSynchronize(s) != cudaSuccess, "the stream must fail");
    ncclResult_t state = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInvalidUsage,
          "async error %s", ncclGetErrorString(state));
    const char *text = ncclGetLastError(comm);
    CHECK(contains(text, "collective #1 differs between ranks") &&
          contains(text, "rank 0 called ncclAllReduce(count 1024, float32, sum)") &&
          contains(text, "rank 1 called ncclBroadcast(count 512, float32, root 0)"),
          "message: %s", text);
    res = ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, s);
    CHECK(res == ncclInvalidUsage, "a failed communicator refuses work: %s", ncclGetErrorString(res));
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
    free(buf);
}

static void test_mismatch_three(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    float buf[16] = {0};
    CHECK(ncclAllReduce(buf, buf, 8, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "first");
    CHECK(ncclAllReduce(buf, buf, c->rank == 1 ? 9 : 8, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "second");
    CHECK(cudaStreamSynchronize(0) != cudaSuccess, "the stream must fail");
    const char *text = ncclGetLastError(comm);
    CHECK(contains(text, "collective #2 differs between ranks: ranks 0 and 2 called "
                   "ncclAllReduce(count 8, float32, sum), rank 1 called ncclAllReduce(count 9, float32, sum)"),
          "message: %s", text);
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
}

static void test_p2p_mismatch(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    float buf[10] = {0};
    if (c->rank == 0) CHECK(ncclSend(buf, 10, ncclFloat, 1, comm, 0) == ncclSuccess, "send");
    else CHECK(ncclRecv(buf, 5, ncclFloat, 0, comm, 0) == ncclSuccess, "recv");
    CHECK(cudaStreamSynchronize(0) != cudaSuccess, "the stream must fail");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    CHECK(state == ncclInvalidUsage, "async error %s", ncclGetErrorString(state));
    const char *text = ncclGetLastError(comm);
    CHECK(contains(text, "rank 0 called ncclSend(count 10, float32, peer 1), rank 1 called "
                   "ncclRecv(count 5, float32, peer 0)"), "message: %s", text);
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
}

// ================================================================ faults

static void test_peer_exits(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    if (c->rank == 1) _exit(0);   // gone without a word
    sleep_s(0.1);
    float x = 1;
    double start = now_s();
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "allreduce");
    CHECK(cudaStreamSynchronize(0) != cudaSuccess, "the stream must fail");
    double took = now_s() - start;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    CHECK(state == ncclRemoteError, "async error %s", ncclGetErrorString(state));
    CHECK(contains(ncclGetLastError(comm), "rank 1 (pid "), "message: %s", ncclGetLastError(comm));
    CHECK(took < 5, "noticed after %.1f s", took);
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
}

static void test_missing_collective(rank_ctx *c) {
    setenv("EMU_TIMEOUT", "2", 1);
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    float x = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "allreduce");
    CHECK(cudaStreamSynchronize(0) == cudaSuccess, "the first one works");
    if (c->rank == 1) {   // skips the second, but stays alive
        sleep_s(3.5);
        ncclCommDestroy(comm);
        return;
    }
    double start = now_s();
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "allreduce");
    CHECK(cudaStreamSynchronize(0) != cudaSuccess, "the stream must fail");
    double took = now_s() - start;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    CHECK(state == ncclInvalidUsage, "async error %s", ncclGetErrorString(state));
    CHECK(contains(ncclGetLastError(comm), "collective #2 ncclAllReduce(count 1, float32, sum) timed out") &&
          contains(ncclGetLastError(comm), "rank 1 has called only 1 collective(s) (the last it "
                   "finished: #1 ncclAllReduce)"), "message: %s", ncclGetLastError(comm));
    CHECK(took > 1.5 && took < 3.4, "timed out after %.1f s", took);
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
}

static void test_abort(rank_ctx *c) {
    ncclComm_t comm = init_blocking(c);
    if (!comm) return;
    float x = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "allreduce");
    if (c->rank == 1) {   // queued, never run: abort drops it
        CHECK(stub_queued_ops() == 1, "queued %d", stub_queued_ops());
        CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
        CHECK(stub_queued_ops() == 0, "after abort %d ops are still queued", stub_queued_ops());
        return;
    }
    CHECK(cudaStreamSynchronize(0) != cudaSuccess, "the stream must fail");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    CHECK(state == ncclRemoteError, "async error %s", ncclGetErrorString(state));
    CHECK(contains(ncclGetLastError(comm), "rank 1 aborted the communicator"), "message: %s",
          ncclGetLastError(comm));
    CHECK(ncclCommAbort(comm) == ncclSuccess, "abort");
}

static void expect_init_failure(rank_ctx *c, int nranks, int rank, const char *text) {
    ncclComm_t comm = (ncclComm_t)1;
    double start = now_s();
    ncclResult_t res = ncclCommInitRank(&comm, nranks, c->id, rank);
    CHECK(res == ncclInvalidUsage, "init: %s", ncclGetErrorString(res));
    CHECK(comm == NULL, "comm is set after a failed init");
    CHECK(contains(ncclGetLastError(NULL), text), "message: %s", ncclGetLastError(NULL));
    CHECK(now_s() - start < 5, "took %.1f s", now_s() - start);
}

// Two processes for a communicator of three: both give up after EMU_TIMEOUT
// and say which rank never came.
static void test_rank_missing(rank_ctx *c) {
    setenv("EMU_TIMEOUT", "1", 1);
    ncclComm_t comm = NULL;
    double start = now_s();
    ncclResult_t res = ncclCommInitRank(&comm, 3, c->id, c->rank);
    CHECK(res == ncclRemoteError, "init: %s", ncclGetErrorString(res));
    CHECK(contains(ncclGetLastError(NULL), "rank 2 of 3 did not join within 1 s"), "message: %s",
          ncclGetLastError(NULL));
    CHECK(now_s() - start < 4, "took %.1f s", now_s() - start);
}

static void test_duplicate_device(rank_ctx *c) {
    expect_init_failure(c, c->nranks, c->rank,
                        "Duplicate GPU detected : rank 1 and rank 0 both on emulated device 0");
}

static void test_duplicate_rank(rank_ctx *c) { expect_init_failure(c, c->nranks, 0, "rank 0 joined twice"); }

static void test_nranks_differ(rank_ctx *c) {
    expect_init_failure(c, c->rank == 0 ? 2 : 3, c->rank, "nranks");
}

// ================================================================ one process: arguments

static void test_arguments(rank_ctx *c) {
    int version = 0;
    CHECK(ncclGetVersion(&version) == ncclSuccess && version == NCCL_VERSION_CODE && version == 21803, "version %d", version);
    CHECK(NCCL_VERSION(2, 28, 3) == 22803 && NCCL_VERSION(2, 8, 4) == 2804, "NCCL_VERSION");
    CHECK(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0), "NCCL_VERSION_CODE");
    CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage") == 0, "error string");

    ncclComm_t comm = NULL;
    ncclUniqueId junk;
    memset(&junk, 'x', sizeof junk);
    CHECK(ncclCommInitRank(&comm, 1, junk, 0) == ncclInvalidArgument, "junk id");
    CHECK(contains(ncclGetLastError(NULL), "ncclGetUniqueId"), "message: %s", ncclGetLastError(NULL));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.magic = 0;
    CHECK(ncclCommInitRankConfig(&comm, 1, c->id, 0, &config) == ncclInvalidArgument, "bad config");
    CHECK(ncclCommInitRank(&comm, 1, c->id, 1) == ncclInvalidArgument, "rank out of range");
    int devices[2] = {0, 1};
    CHECK(ncclCommInitAll(&comm, 2, devices) == ncclInvalidUsage, "InitAll of 2 devices");
    CHECK(contains(ncclGetLastError(NULL), "one emulated GPU per process"), "message: %s",
          ncclGetLastError(NULL));
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "group end without start");

    CHECK(ncclCommInitAll(&comm, 1, devices) == ncclSuccess, "InitAll of 1 device: %s",
          ncclGetLastError(NULL));
    if (!comm) return;
    float *buf = calloc(64, sizeof *buf);
    buf[0] = 3;
    CHECK(ncclAllReduce(buf, buf, 1, ncclFloat, ncclAvg, comm, 0) == ncclSuccess, "allreduce, 1 rank");
    CHECK(cudaStreamSynchronize(0) == cudaSuccess && buf[0] == 3, "one rank: %g", buf[0]);

    float *host = calloc(16, sizeof *host), *pinned = calloc(16, sizeof *pinned);
    stub_mark_host_memory(host, 16 * sizeof *host, 0);
    stub_mark_host_memory(pinned, 16 * sizeof *pinned, 1);
    CHECK(ncclAllReduce(host, buf, 16, ncclFloat, ncclSum, comm, 0) == ncclInvalidArgument, "host memory");
    CHECK(contains(ncclGetLastError(comm), "sendbuff is host memory; NCCL needs device memory"),
          "message: %s", ncclGetLastError(comm));
    CHECK(ncclRecv(pinned, 16, ncclFloat, 0, comm, 0) == ncclInvalidArgument, "pinned memory");
    CHECK(contains(ncclGetLastError(comm), "recvbuff is pinned host memory"), "message: %s",
          ncclGetLastError(comm));
    CHECK(ncclAllReduce(buf, buf, 1, ncclFloat8e4m3, ncclSum, comm, 0) == ncclInvalidArgument, "fp8");
    CHECK(ncclAllReduce(buf, buf, 1, ncclFloat, (ncclRedOp_t)7, comm, 0) == ncclInvalidArgument, "op 7");
    CHECK(ncclBroadcast(buf, buf, 1, ncclFloat, 1, comm, 0) == ncclInvalidArgument, "root 1 of 1");
    CHECK(ncclSend(buf, 1, ncclFloat, -1, comm, 0) == ncclInvalidArgument, "peer -1");
    CHECK(ncclAllReduce(buf, buf + 1, 8, ncclFloat, ncclSum, comm, 0) == ncclInvalidArgument, "overlap");
    CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0) == ncclSuccess, "count 0, NULL");
    CHECK(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, NULL, 0) == ncclInvalidArgument, "NULL comm");
    cudaStream_t gone;
    cudaStreamCreate(&gone);
    cudaStreamDestroy(gone);
    CHECK(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, gone) == ncclUnhandledCudaError,
          "a destroyed stream");
    CHECK(cudaStreamSynchronize(0) == cudaSuccess, "sync");
    CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
    free(buf);
    free(host);
    free(pinned);
}

// ================================================================ main

// Names in /dev/shm that one of our processes made and nobody removed.
static int leftover_segments(void) {
    int found = 0;
    DIR *dir = opendir("/dev/shm");
    if (!dir) return 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        int pid;
        if (sscanf(e->d_name, "course-emu-nccl-%d-", &pid) != 1) continue;
        bool ours = pid == getpid();
        for (int i = 0; i < all_children_count && !ours; i++) ours = pid == all_children[i];
        if (!ours) continue;
        fprintf(stderr, "FAIL left behind: /dev/shm/%s\n", e->d_name);
        found++;
    }
    closedir(dir);
    return found;
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    bool stress = argc > 1 && strcmp(argv[1], "stress") == 0;
    setenv("EMU_TIMEOUT", "30", 0);   // a hang fails in 30 s, not 300
    setvbuf(stdout, NULL, _IOLBF, 0);
    int failed = 0, passed = 0;
#define RUN(...) (run_ranks(__VA_ARGS__) ? passed++ : failed++)
    for (int i = 0; stress && i < 100; i++) {   // ranks that finish and leave at once
        RUN("16-bit floats round to nearest even", 2, test_half_rounding, NULL, 30);
        if (i % 5 == 0) RUN("send/recv and groups", 2 + i % 4, test_p2p, NULL, 60);
    }
    if (stress) {
        printf("%d passed, %d failed\n", passed, failed);
        return failed ? 1 : 0;
    }
    RUN("arguments", 1, test_arguments, NULL, 30);
    int sizes[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        int n = sizes[i];
        if (quick && n > 3) continue;
        RUN("collectives: every kind x type x op x count x placement x root", n, test_matrix, NULL, 600);
        RUN("1M floats", n, test_large, NULL, 120);
        RUN("send/recv and groups", n, test_p2p, NULL, 60);
        RUN("non-blocking communicator", n, test_nonblocking, NULL, 60);
    }
    RUN("16-bit floats round to nearest even", 2, test_half_rounding, NULL, 30);
    RUN("mismatched collectives name both calls", 2, test_mismatch, NULL, 30);
    RUN("mismatched collectives, ranks grouped", 3, test_mismatch_three, NULL, 30);
    RUN("mismatched send/recv", 2, test_p2p_mismatch, NULL, 30);
    RUN("a peer that exits", 2, test_peer_exits, NULL, 30);
    RUN("a peer that skips a collective (EMU_TIMEOUT=2)", 2, test_missing_collective, NULL, 30);
    RUN("abort", 2, test_abort, NULL, 30);
    RUN("a rank that never joins (EMU_TIMEOUT=1)", 2, test_rank_missing, NULL, 30);
    RUN("two ranks on one device", 2, test_duplicate_device, (const int[]){0, 0}, 30);
    RUN("one rank index twice", 2, test_duplicate_rank, NULL, 30);
    RUN("nranks differs", 2, test_nranks_differ, NULL, 30);
    int left = leftover_segments();
    if (left) failed++;
    else passed++;
    printf("%s no shared-memory segments left in /dev/shm\n", left ? "FAIL" : "PASS");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
