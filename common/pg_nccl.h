// pg_nccl.h - the nccl backend of pg.h: NCCL on GPU buffers, one rank per GPU.
//
// Included by pg.h (it needs only pg_types.h), and compiled only in the
// CUDA build.
// NCCL does the real work; this file adds what a course needs around it:
//
//   - start-up as the NCCL guide prescribes: cudaSetDevice first, then rank 0
//     makes the unique id (ncclGetUniqueId), the store carries it to the
//     others, and every rank calls ncclCommInitRankConfig;
//   - a non-blocking communicator (config.blocking = 0), so that the host
//     never sits inside NCCL: every call returns at once, and we wait by
//     polling the stream (cudaStreamQuery) and the communicator's error
//     state (ncclCommGetAsyncError) against the group's deadline. A dead
//     peer or a timeout then ends in ncclCommAbort and a message naming the
//     operation, instead of a hang - the pattern of nccl-tests;
//   - gather, scatter, all_to_all and all_to_all_v from grouped
//     ncclSend/ncclRecv, which works on every NCCL since 2.7 (native
//     versions of the first three arrived in 2.28; all_to_all_v is grouped
//     sends and receives in NCCL's own documentation);
//   - BAND/BOR/BXOR, which NCCL lacks, by gathering the inputs and
//     combining them on the host in rank order;
//   - a barrier (NCCL has none): a one-element all-reduce, then a wait.
//
// isend/irecv are collected and launched together, as one NCCL group, at
// the first pg_test or pg_wait (or the next collective). Inside a group
// NCCL matches sends and receives that must progress together; without it
// two ranks that each send before they receive would deadlock, as NCCL
// has no buffer to hold a message nobody receives yet. For the same reason
// a blocking pg_send completes only when the peer receives: an exchange
// must post both isend and irecv before waiting (the cpu backend, which can
// keep early messages aside, has no such limit).
//
// A sub-group (pg_split) is ncclCommSplit of the group's communicator: NCCL
// builds it from what the parent knows, without a new unique id.
// pg.h calls this file through the table at its end (pg_backend.h); in a
// build without CUDA the table only says why there is no nccl backend.
#ifndef COURSE_PG_NCCL_H
#define COURSE_PG_NCCL_H

#include "pg_backend.h"
#include "pg_types.h"

#ifdef COURSE_CUDA

#include <stdarg.h>
#include <time.h>

#include "timer.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "pg_nccl.h needs NCCL 2.14 or newer (non-blocking communicators); install a newer NCCL or build with make CUDA=0"
#endif

typedef struct nccl_req_t {
    cudaEvent_t done;          // recorded on the stream after the operation
    bool is_send;
    void *buf;
    size_t count;
    dtype_t dtype;
    int peer;
} nccl_req_t;

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, world, gpu;
    double timeout_s;
    const char *op;            // the operation in progress, for messages
    nccl_req_t **pending;        // isend/irecv not launched yet
    int pending_count, pending_cap;
    int *scratch;              // one int on the GPU, for the barrier
} nccl_pg_t;

// ---------------------------------------------------------------- errors and waiting

// Abort the communicator (this also frees any collective stuck inside NCCL)
// and stop with a message naming the operation.
__attribute__((format(printf, 2, 3), noreturn))
static inline void nccl_fail(nccl_pg_t *pg, const char *fmt, ...) {
    char text[600];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    if (pg->comm) ncclCommAbort(pg->comm);
    die("%s during %s (the NCCL communicator was aborted)", text, pg->op);
}

static inline void nccl_pause(void) {
    struct timespec ts = {0, 20000};   // 20 us: quick to notice completion, cheap on the CPU
    nanosleep(&ts, NULL);
}

// Dies if NCCL reports an asynchronous error, e.g. ncclRemoteError when a
// peer died.
static inline void nccl_poll_error(nccl_pg_t *pg) {
    ncclResult_t state;
    ncclResult_t res = ncclCommGetAsyncError(pg->comm, &state);
    if (res != ncclSuccess) state = res;
    if (state != ncclSuccess && state != ncclInProgress)
        nccl_fail(pg, "NCCL reported '%s': %s (hint: %s)", ncclGetErrorString(state),
                  ncclGetLastError(pg->comm), nccl_hint(state));
}

// A non-blocking communicator may answer ncclInProgress: the call is still
// being carried out, and nothing else may be asked of the communicator until
// ncclCommGetAsyncError says it has finished.
static inline void nccl_check(nccl_pg_t *pg, ncclResult_t res, const char *call) {
    double deadline = now_seconds() + pg->timeout_s;
    while (res == ncclInProgress) {
        if (now_seconds() > deadline)
            nccl_fail(pg, "%s did not finish within %g s (COURSE_TIMEOUT sets the limit)", call,
                      pg->timeout_s);
        nccl_pause();
        ncclResult_t query = ncclCommGetAsyncError(pg->comm, &res);
        if (query != ncclSuccess) res = query;
    }
    if (res != ncclSuccess)
        nccl_fail(pg, "%s failed: %s: %s (hint: %s)", call, ncclGetErrorString(res),
                  pg->comm ? ncclGetLastError(pg->comm) : "", nccl_hint(res));
}

// Wait for an event (or, with NULL, for all the work on our stream), polling
// for errors and the deadline, as nccl-tests does.
static inline void nccl_wait(nccl_pg_t *pg, cudaEvent_t event) {
    double start = now_seconds();
    for (;;) {
        cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(pg->stream);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) nccl_fail(pg, "the GPU stream failed: %s", cudaGetErrorString(q));
        nccl_poll_error(pg);
        if (now_seconds() - start > pg->timeout_s)
            nccl_fail(pg, "timed out after %g s (is a rank missing, stuck, or in a different "
                      "operation? COURSE_TIMEOUT sets the limit)", pg->timeout_s);
        nccl_pause();
    }
}

// ---------------------------------------------------------------- create and destroy

static inline ncclUniqueId nccl_share_id(nccl_pg_t *pg, store_t *st, const char *group) {
    ncclUniqueId id;
    char key[96];
    snprintf(key, sizeof key, "%s/nccl_id", group);
    if (pg->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    if (pg->world > 1 &&
        store_broadcast(st, key, pg->rank, &id, sizeof id, sizeof id, pg->timeout_s) != sizeof id)
        die("the store holds a malformed NCCL unique id under '%s'", key);
    return id;
}

static inline void nccl_flush(nccl_pg_t *pg);

// Our stream and the barrier's scratch int, on the group's GPU.
static inline void nccl_make_stream(nccl_pg_t *pg) {
    // A stream with the default flags waits for the work the caller queued on
    // the legacy default stream: a collective never reads a buffer before a
    // kernel queued there to compute it has finished. A producer on a
    // non-blocking stream is not waited for (pg.h's promises say what the
    // caller does then); nccl_wait makes the result visible to every stream.
    CHECK_CUDA(cudaStreamCreate(&pg->stream));
    CHECK_CUDA(cudaMalloc((void **)&pg->scratch, sizeof(int)));
    CHECK_CUDA(cudaMemset(pg->scratch, 0, sizeof(int)));
}

static inline nccl_pg_t *nccl_new(int rank, int world, int gpu, double timeout_s, const char *op) {
    nccl_pg_t *pg = xcalloc(1, sizeof *pg);
    *pg = (nccl_pg_t){.rank = rank, .world = world, .gpu = gpu, .timeout_s = timeout_s, .op = op};
    // NCCL binds a communicator to the device that is current when it is made.
    CHECK_CUDA(cudaSetDevice(pg->gpu));
    nccl_make_stream(pg);
    return pg;
}

// A non-blocking communicator: NCCL never holds the host (see the top).
static inline ncclConfig_t nccl_config(void) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
}

static inline nccl_pg_t *nccl_create(const pg_config_t *cfg, const pg_group_id_t *group, double timeout_s) {
    nccl_pg_t *pg = nccl_new(group->rank, group->world_size, cfg->device->gpu, timeout_s, "pg_create");
    ncclUniqueId id = nccl_share_id(pg, cfg->store, group->key);
    ncclConfig_t config = nccl_config();
    ncclResult_t res = ncclCommInitRankConfig(&pg->comm, pg->world, id, pg->rank, &config);
    nccl_check(pg, res, "ncclCommInitRankConfig");
    return pg;
}

// Every rank of the parent calls ncclCommSplit; one of no group passes
// NCCL_SPLIT_NOCOLOR and gets no communicator.
static inline nccl_pg_t *nccl_split(nccl_pg_t *parent, int color, int key, const pg_group_id_t *group) {
    nccl_flush(parent);
    parent->op = "pg_split";
    ncclConfig_t config = nccl_config();
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &config);
    if (color < 0 || !comm) {
        nccl_check(parent, res, "ncclCommSplit");
        return NULL;
    }
    nccl_pg_t *pg = nccl_new(group->rank, group->world_size, parent->gpu, parent->timeout_s, "pg_split");
    pg->comm = comm;
    nccl_check(pg, res, "ncclCommSplit");
    int rank = -1, count = -1;
    nccl_check(pg, ncclCommUserRank(comm, &rank), "ncclCommUserRank");
    nccl_check(pg, ncclCommCount(comm, &count), "ncclCommCount");
    if (rank != group->rank || count != group->world_size)
        die("pg_split: NCCL ranked this process %d of %d, the course %d of %d", rank, count, group->rank,
            group->world_size);
    return pg;
}

static inline void nccl_destroy(nccl_pg_t *pg) {
    pg->op = "pg_destroy";
    nccl_flush(pg);
    nccl_wait(pg, NULL);
    // Finalize completes the communicator's outstanding work with the peers;
    // then destroy frees it.
    nccl_check(pg, ncclCommFinalize(pg->comm), "ncclCommFinalize");
    CHECK_NCCL(ncclCommDestroy(pg->comm));
    CHECK_CUDA(cudaFree(pg->scratch));
    CHECK_CUDA(cudaStreamDestroy(pg->stream));
    free(pg->pending);
    free(pg);
}

// ---------------------------------------------------------------- types

static inline ncclDataType_t nccl_type(dtype_t t) {
    switch (t) {
    case DTYPE_F32: return ncclFloat32;
    case DTYPE_F64: return ncclFloat64;
    case DTYPE_I32: return ncclInt32;
    case DTYPE_I64: return ncclInt64;
    case DTYPE_U8: return ncclUint8;
    case DTYPE_BF16: return ncclBfloat16;
    case DTYPE_F16: return ncclFloat16;
    }
    die("nccl: unknown dtype %d", (int)t);
}

// AVG maps to ncclAvg (NCCL >= 2.10), which divides integers too.
static inline ncclRedOp_t nccl_op(redop_t op) {
    switch (op) {
    case OP_SUM: return ncclSum;
    case OP_PROD: return ncclProd;
    case OP_MIN: return ncclMin;
    case OP_MAX: return ncclMax;
    case OP_AVG: return ncclAvg;
    default: die("nccl: op %s has no NCCL equivalent", redop_name(op));
    }
}

// ---------------------------------------------------------------- point-to-point

static inline nccl_req_t *nccl_post(nccl_pg_t *pg, bool is_send, const void *buf, size_t count,
                                    dtype_t t, int peer) {
    nccl_req_t *r = xcalloc(1, sizeof *r);
    *r = (nccl_req_t){.is_send = is_send, .buf = (void *)buf, .count = count, .dtype = t,
                    .peer = peer};
    CHECK_CUDA(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming));
    if (count == 0) {   // nothing to move: done once the stream gets here
        CHECK_CUDA(cudaEventRecord(r->done, pg->stream));
        return r;
    }
    if (pg->pending_count == pg->pending_cap) {
        pg->pending_cap = pg->pending_cap ? 2 * pg->pending_cap : 16;
        pg->pending = realloc(pg->pending, (size_t)pg->pending_cap * sizeof *pg->pending);
        if (!pg->pending) die("out of memory queueing NCCL sends and receives");
    }
    pg->pending[pg->pending_count++] = r;
    return r;
}

// Launch the queued isend/irecv as one group, then mark each request's end
// on the stream.
static inline void nccl_flush(nccl_pg_t *pg) {
    if (pg->pending_count == 0) return;
    const char *op = pg->op;
    pg->op = "send/recv";
    nccl_check(pg, ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < pg->pending_count; i++) {
        nccl_req_t *r = pg->pending[i];
        ncclDataType_t type = nccl_type(r->dtype);
        if (r->is_send)
            nccl_check(pg, ncclSend(r->buf, r->count, type, r->peer, pg->comm, pg->stream), "ncclSend");
        else
            nccl_check(pg, ncclRecv(r->buf, r->count, type, r->peer, pg->comm, pg->stream), "ncclRecv");
    }
    nccl_check(pg, ncclGroupEnd(), "ncclGroupEnd");
    for (int i = 0; i < pg->pending_count; i++)
        CHECK_CUDA(cudaEventRecord(pg->pending[i]->done, pg->stream));
    pg->pending_count = 0;
    pg->op = op;
}

static inline nccl_req_t *nccl_isend(nccl_pg_t *pg, const void *buf, size_t count, dtype_t t,
                                     int peer) {
    return nccl_post(pg, true, buf, count, t, peer);
}

static inline nccl_req_t *nccl_irecv(nccl_pg_t *pg, void *buf, size_t count, dtype_t t, int peer) {
    return nccl_post(pg, false, buf, count, t, peer);
}

static inline bool nccl_test(nccl_pg_t *pg, nccl_req_t *r) {
    pg->op = "send/recv";
    nccl_flush(pg);
    cudaError_t q = cudaEventQuery(r->done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) nccl_fail(pg, "the GPU stream failed: %s", cudaGetErrorString(q));
    nccl_poll_error(pg);
    return false;
}

static inline void nccl_wait_request(nccl_pg_t *pg, nccl_req_t *r) {
    pg->op = "send/recv";
    nccl_flush(pg);
    nccl_wait(pg, r->done);
    CHECK_CUDA(cudaEventDestroy(r->done));
    free(r);
}

// ---------------------------------------------------------------- collectives

// Every collective starts by launching queued point-to-point work, so that
// operations reach NCCL in the order the program called them.
static inline void nccl_begin(nccl_pg_t *pg, const char *op) {
    nccl_flush(pg);
    pg->op = op;
}

static inline void nccl_copy(nccl_pg_t *pg, void *dst, const void *src, size_t bytes) {
    if (dst != src)
        CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, pg->stream));
}

// For BAND/BOR/BXOR: every rank's `count` elements, side by side, on the host.
static inline char *nccl_gather_to_host(nccl_pg_t *pg, const void *send, size_t count, dtype_t t) {
    size_t all = count * dtype_size(t) * (size_t)pg->world;
    void *gathered;
    CHECK_CUDA(cudaMalloc(&gathered, all));
    nccl_check(pg, ncclAllGather(send, gathered, count, nccl_type(t), pg->comm, pg->stream),
               "ncclAllGather");
    nccl_wait(pg, NULL);
    char *host = xmalloc(all);
    CHECK_CUDA(cudaMemcpy(host, gathered, all, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(gathered));
    return host;
}

// dst (on the GPU) = part 0 OP part 1 OP ... in rank order; part p of the
// gathered inputs starts at first + p * stride bytes.
static inline void nccl_combine_on_host(nccl_pg_t *pg, const char *first, size_t stride,
                                        size_t count, dtype_t t, redop_t op, void *dst) {
    size_t bytes = count * dtype_size(t);
    char *acc = xmalloc(bytes);
    memcpy(acc, first, bytes);
    for (int p = 1; p < pg->world; p++)
        pg_combine(acc, acc, first + (size_t)p * stride, count, t, op);
    CHECK_CUDA(cudaMemcpy(dst, acc, bytes, cudaMemcpyHostToDevice));
    free(acc);
}

static inline void nccl_broadcast(nccl_pg_t *pg, void *buf, size_t count, dtype_t t, int root) {
    nccl_begin(pg, "broadcast");
    nccl_check(pg, ncclBroadcast(buf, buf, count, nccl_type(t), root, pg->comm, pg->stream),
               "ncclBroadcast");
    nccl_wait(pg, NULL);
}

static inline void nccl_reduce(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                               dtype_t t, redop_t op, int root) {
    nccl_begin(pg, "reduce");
    if (redop_is_bitwise(op)) {
        char *host = nccl_gather_to_host(pg, send, count, t);
        if (pg->rank == root)
            nccl_combine_on_host(pg, host, count * dtype_size(t), count, t, op, recv);
        free(host);
        return;
    }
    // Only the root's recv is used; the others may have passed NULL.
    void *out = recv ? recv : (void *)send;
    nccl_check(pg, ncclReduce(send, out, count, nccl_type(t), nccl_op(op), root, pg->comm,
                              pg->stream), "ncclReduce");
    nccl_wait(pg, NULL);
}

static inline void nccl_all_reduce(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                                   dtype_t t, redop_t op) {
    nccl_begin(pg, "all_reduce");
    if (redop_is_bitwise(op)) {
        char *host = nccl_gather_to_host(pg, send, count, t);
        nccl_combine_on_host(pg, host, count * dtype_size(t), count, t, op, recv);
        free(host);
        return;
    }
    nccl_check(pg, ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), pg->comm,
                                 pg->stream), "ncclAllReduce");
    nccl_wait(pg, NULL);
}

static inline void nccl_reduce_scatter(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                                       dtype_t t, redop_t op) {
    nccl_begin(pg, "reduce_scatter");
    if (redop_is_bitwise(op)) {
        size_t bytes = count * dtype_size(t);
        char *host = nccl_gather_to_host(pg, send, count * (size_t)pg->world, t);
        nccl_combine_on_host(pg, host + (size_t)pg->rank * bytes, bytes * (size_t)pg->world,
                             count, t, op, recv);
        free(host);
        return;
    }
    nccl_check(pg, ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), pg->comm,
                                     pg->stream), "ncclReduceScatter");
    nccl_wait(pg, NULL);
}

static inline void nccl_all_gather(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                                   dtype_t t) {
    nccl_begin(pg, "all_gather");
    nccl_check(pg, ncclAllGather(send, recv, count, nccl_type(t), pg->comm, pg->stream),
               "ncclAllGather");
    nccl_wait(pg, NULL);
}

// Gather from grouped point-to-point: the root receives from everyone at once.
static inline void nccl_gather(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                               dtype_t t, int root) {
    nccl_begin(pg, "gather");
    size_t bytes = count * dtype_size(t);
    ncclDataType_t type = nccl_type(t);
    if (pg->rank == root) nccl_copy(pg, (char *)recv + (size_t)root * bytes, send, bytes);
    nccl_check(pg, ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < pg->world; p++) {
        if (pg->rank == root && p != root)
            nccl_check(pg, ncclRecv((char *)recv + (size_t)p * bytes, count, type, p, pg->comm,
                                    pg->stream), "ncclRecv");
    }
    if (pg->rank != root)
        nccl_check(pg, ncclSend(send, count, type, root, pg->comm, pg->stream), "ncclSend");
    nccl_check(pg, ncclGroupEnd(), "ncclGroupEnd");
    nccl_wait(pg, NULL);
}

static inline void nccl_scatter(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                                dtype_t t, int root) {
    nccl_begin(pg, "scatter");
    size_t bytes = count * dtype_size(t);
    ncclDataType_t type = nccl_type(t);
    if (pg->rank == root) nccl_copy(pg, recv, (const char *)send + (size_t)root * bytes, bytes);
    nccl_check(pg, ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < pg->world; p++) {
        if (pg->rank == root && p != root)
            nccl_check(pg, ncclSend((const char *)send + (size_t)p * bytes, count, type, p,
                                    pg->comm, pg->stream), "ncclSend");
    }
    if (pg->rank != root)
        nccl_check(pg, ncclRecv(recv, count, type, root, pg->comm, pg->stream), "ncclRecv");
    nccl_check(pg, ncclGroupEnd(), "ncclGroupEnd");
    nccl_wait(pg, NULL);
}

// All-to-all from grouped point-to-point; in place works on a copy of send.
static inline void nccl_all_to_all(nccl_pg_t *pg, const void *send, void *recv, size_t count,
                                   dtype_t t) {
    nccl_begin(pg, "all_to_all");
    size_t bytes = count * dtype_size(t), all = bytes * (size_t)pg->world;
    ncclDataType_t type = nccl_type(t);
    void *copy = NULL;
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (s < r + all && r < s + all) {
        CHECK_CUDA(cudaMalloc(&copy, all));
        nccl_copy(pg, copy, send, all);
        send = copy;
    }
    nccl_copy(pg, (char *)recv + (size_t)pg->rank * bytes,
              (const char *)send + (size_t)pg->rank * bytes, bytes);
    nccl_check(pg, ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < pg->world; p++) {
        if (p == pg->rank) continue;
        nccl_check(pg, ncclSend((const char *)send + (size_t)p * bytes, count, type, p, pg->comm,
                                pg->stream), "ncclSend");
        nccl_check(pg, ncclRecv((char *)recv + (size_t)p * bytes, count, type, p, pg->comm,
                                pg->stream), "ncclRecv");
    }
    nccl_check(pg, ncclGroupEnd(), "ncclGroupEnd");
    nccl_wait(pg, NULL);
    if (copy) CHECK_CUDA(cudaFree(copy));
}

// All-to-all with counts per peer, as NCCL's documentation writes it: one
// ncclSend and one ncclRecv per peer inside ncclGroupStart/End, so that
// they all progress together; the block for peer p starts at the sum of
// the counts before it. A count of 0 makes no call (the peer, whose count
// agrees, makes none either); our own block is a copy on the stream.
static inline void nccl_all_to_all_v(nccl_pg_t *pg, const void *send, const size_t *send_counts, void *recv,
                                     const size_t *recv_counts, dtype_t t) {
    nccl_begin(pg, "all_to_all_v");
    size_t es = dtype_size(t), send_at = 0, recv_at = 0;
    ncclDataType_t type = nccl_type(t);
    nccl_check(pg, ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < pg->world; p++) {
        // (a rank with nothing to send or receive may have passed NULL)
        const char *out = send ? (const char *)send + send_at * es : NULL;
        char *in = recv ? (char *)recv + recv_at * es : NULL;
        if (p == pg->rank) {
            if (send_counts[p] > 0) nccl_copy(pg, in, out, send_counts[p] * es);
        } else {
            if (send_counts[p] > 0)
                nccl_check(pg, ncclSend(out, send_counts[p], type, p, pg->comm, pg->stream), "ncclSend");
            if (recv_counts[p] > 0)
                nccl_check(pg, ncclRecv(in, recv_counts[p], type, p, pg->comm, pg->stream), "ncclRecv");
        }
        send_at += send_counts[p];
        recv_at += recv_counts[p];
    }
    nccl_check(pg, ncclGroupEnd(), "ncclGroupEnd");
    nccl_wait(pg, NULL);
}

static inline void nccl_wait_queued(nccl_pg_t *pg) {
    pg->op = "the overlapped collectives";
    nccl_wait(pg, NULL);
}

static inline void nccl_barrier(nccl_pg_t *pg) {
    nccl_begin(pg, "barrier");
    nccl_check(pg, ncclAllReduce(pg->scratch, pg->scratch, 1, ncclInt32, ncclSum, pg->comm,
                                 pg->stream), "ncclAllReduce");
    nccl_wait(pg, NULL);
}

// ---------------------------------------------------------------- the table pg.h calls

static inline void *nccl_backend_create(const pg_config_t *cfg, const pg_group_id_t *id, double timeout_s) {
    return nccl_create(cfg, id, timeout_s);
}

static inline void *nccl_backend_split(void *impl, int color, int key, const pg_group_id_t *id, store_t *store,
                                       double timeout_s) {
    (void)store, (void)timeout_s; // NCCL builds the group from the parent's communicator
    return nccl_split(impl, color, key, id);
}

static inline void nccl_backend_destroy(void *impl) { nccl_destroy(impl); }
static inline void nccl_backend_describe(void *impl, char *out, size_t size) {
    (void)impl;
    snprintf(out, size, "one GPU per rank");
}
static inline void *nccl_backend_isend(void *impl, const void *buf, size_t count, dtype_t t, int peer) {
    return nccl_isend(impl, buf, count, t, peer);
}
static inline void *nccl_backend_irecv(void *impl, void *buf, size_t count, dtype_t t, int peer) {
    return nccl_irecv(impl, buf, count, t, peer);
}
static inline bool nccl_backend_test(void *impl, void *req) { return nccl_test(impl, req); }
static inline void nccl_backend_wait(void *impl, void *req) { nccl_wait_request(impl, req); }
static inline void nccl_backend_barrier(void *impl) { nccl_barrier(impl); }

static inline void nccl_backend_collective(void *impl, pg_coll_t c, const void *send, void *recv, size_t count,
                                           dtype_t t, redop_t op, int root) {
    nccl_pg_t *pg = impl;
    switch (c) {
    case PG_BROADCAST: nccl_broadcast(pg, recv, count, t, root); break;
    case PG_REDUCE: nccl_reduce(pg, send, recv, count, t, op, root); break;
    case PG_ALL_REDUCE: nccl_all_reduce(pg, send, recv, count, t, op); break;
    case PG_GATHER: nccl_gather(pg, send, recv, count, t, root); break;
    case PG_ALL_GATHER: nccl_all_gather(pg, send, recv, count, t); break;
    case PG_SCATTER: nccl_scatter(pg, send, recv, count, t, root); break;
    case PG_REDUCE_SCATTER: nccl_reduce_scatter(pg, send, recv, count, t, op); break;
    case PG_ALL_TO_ALL: nccl_all_to_all(pg, send, recv, count, t); break;
    case PG_COLLECTIVES: break;
    }
}

// Queued behind `ready` on our stream (which waits for the event, not for
// the host), `done` recorded behind it; pg_wait_queued waits for it all,
// polling as nccl_wait does. The reductions NCCL lacks (BAND, BOR, BXOR)
// combine on the host: those wait for `ready` and run now.
static inline void nccl_collective_after(nccl_pg_t *pg, pg_coll_t c, const void *send, void *recv, size_t count,
                                         dtype_t t, redop_t op, cudaEvent_t ready, cudaEvent_t done) {
    if (count > 0 && redop_is_bitwise(op) && c != PG_ALL_GATHER) {
        if (ready) CHECK_CUDA(cudaEventSynchronize(ready));
        nccl_backend_collective(pg, c, send, recv, count, t, op, -1);
    } else if (count > 0) {
        nccl_begin(pg, c == PG_ALL_REDUCE ? "all_reduce (overlapped)"
                       : c == PG_REDUCE_SCATTER ? "reduce_scatter (overlapped)" : "all_gather (overlapped)");
        if (ready) CHECK_CUDA(cudaStreamWaitEvent(pg->stream, ready, 0));
        ncclDataType_t type = nccl_type(t);
        switch (c) {
        case PG_ALL_REDUCE:
            nccl_check(pg, ncclAllReduce(send, recv, count, type, nccl_op(op), pg->comm, pg->stream), "ncclAllReduce");
            break;
        case PG_REDUCE_SCATTER:
            nccl_check(pg, ncclReduceScatter(send, recv, count, type, nccl_op(op), pg->comm, pg->stream),
                       "ncclReduceScatter");
            break;
        case PG_ALL_GATHER:
            nccl_check(pg, ncclAllGather(send, recv, count, type, pg->comm, pg->stream), "ncclAllGather");
            break;
        default:
            die("%s cannot be queued behind an event (all_reduce, reduce_scatter and all_gather can)",
                pg_coll_shapes[c].name);
        }
    }
    if (done) CHECK_CUDA(cudaEventRecord(done, pg->stream));
}

static inline void nccl_backend_collective_after(void *impl, pg_coll_t c, const void *send, void *recv,
                                                 size_t count, dtype_t t, redop_t op, pg_event_t ready,
                                                 pg_event_t done) {
    nccl_collective_after(impl, c, send, recv, count, t, op, ready, done);
}
static inline void nccl_backend_wait_queued(void *impl) { nccl_wait_queued(impl); }

static inline void nccl_backend_all_to_all_v(void *impl, const void *send, const size_t *send_counts, void *recv,
                                             const size_t *recv_counts, dtype_t t) {
    nccl_all_to_all_v(impl, send, send_counts, recv, recv_counts, t);
}

static inline const pg_backend_t *nccl_backend(void) {
    static const pg_backend_t table = {
        .name = "nccl", .host_buffers = false,
        .create = nccl_backend_create, .split = nccl_backend_split, .destroy = nccl_backend_destroy,
        .describe = nccl_backend_describe, .isend = nccl_backend_isend, .irecv = nccl_backend_irecv,
        .test = nccl_backend_test, .wait = nccl_backend_wait, .collective = nccl_backend_collective,
        .all_to_all_v = nccl_backend_all_to_all_v, .barrier = nccl_backend_barrier, .collective_after = nccl_backend_collective_after,
        .wait_queued = nccl_backend_wait_queued,
    };
    return &table;
}

#else  // ---------------------------------------------------------------- no CUDA in this build

static inline const pg_backend_t *nccl_backend(void) {
    static const pg_backend_t table =
        PG_MISSING_BACKEND("nccl", "this is a CPU-only build, without NCCL");
    return &table;
}

#endif  // COURSE_CUDA
#endif
