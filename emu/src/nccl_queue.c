// nccl_queue.c - the calls that give the emulated NCCL work: checked, then queued.
//
// ncclAllReduce, ncclSend and the others check their arguments as NCCL
// documents them (device memory of the communicator's device, the two
// legal buffer layouts, ...), get their sequence numbers, and queue one
// operation on the stream, as a kernel would be queued. The emulated GPU
// runs queued work as late as it can (when the program waits for the
// stream), and one process must never sit inside the stream runner waiting
// for another: so each operation is a resumable state machine
// (nccl_collective.c, nccl_p2p.c) that makes what progress it can and
// answers "pending" when it must wait for a peer; the runner calls it
// again later. Calls inside ncclGroupStart/End become the parts of one
// operation, which progress together.
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

// ================================================================ queued operations

static emu_nccl_status progress_part(struct ncclComm *comm, emu_nccl_part *p) {
    switch (p->kind) {
    case KIND_SEND: return emu_nccl_progress_send(comm, p);
    case KIND_RECV: return emu_nccl_progress_recv(comm, p);
    default: return emu_nccl_progress_collective(comm, p);
    }
}

static void op_finished(emu_nccl_op *o) {
    if (o->finished) return;
    o->finished = true;
    if (o->comm) o->comm->ops_unfinished--;
}

// What the stream runs. Every part gets a turn, again and again while any
// of them moves, so that the parts of a group (a send and a receive that
// need each other, even to and from this same rank) progress together.
// Tells the race checker which device memory a finished call read and wrote.
static void touch_buffers(const struct ncclComm *comm, const emu_nccl_part *p) {
    size_t n = p->count * emu_nccl_dtype_size(p->dtype), all = n * (size_t)comm->nranks;
    bool root = comm->rank == p->root;
    switch (p->kind) {
    case KIND_SEND: emu_race_range(p->send, n, false); break;
    case KIND_RECV: emu_race_range(p->recv, n, true); break;
    case KIND_ALL_GATHER: emu_race_range(p->send, n, false), emu_race_range(p->recv, all, true); break;
    case KIND_REDUCE_SCATTER: emu_race_range(p->send, all, false), emu_race_range(p->recv, n, true); break;
    case KIND_BROADCAST:
        if (root) emu_race_range(p->send, n, false);
        emu_race_range(p->recv, n, true);
        break;
    case KIND_REDUCE:
        emu_race_range(p->send, n, false);
        if (root) emu_race_range(p->recv, n, true);
        break;
    default: emu_race_range(p->send, n, false), emu_race_range(p->recv, n, true); break;
    }
}

static emu_op_status run_op(void *state) {
    emu_nccl_op *o = state;
    struct ncclComm *comm = o->comm;
    if (!comm || comm->error != ncclSuccess) {
        emu_op_fail_reason("%s", comm ? comm->error_text : "emulated NCCL: the communicator is gone");
        op_finished(o);
        return EMU_OP_FAILED;
    }
    if (!o->started) {   // timeouts count from the first time the stream gets here
        o->started = true;
        for (int i = 0; i < o->nparts; i++) o->parts[i].stalled_since = emu_now();
    }
    // When a peer is moving data at the same moment, a 64 KiB ring drains
    // and refills many times a millisecond: keep at it for up to 2 ms
    // (yielding the core) before handing back to the stream runner, which
    // would otherwise sleep between rounds.
    bool all_done, moved, any_moved = false;
    double spin_until = emu_now() + 0.002;
spin:
    do {
        all_done = true;
        moved = false;
        for (int i = 0; i < o->nparts; i++) {
            emu_nccl_part *p = &o->parts[i];
            if (p->done) continue;
            p->progressed = false;
            emu_nccl_status s = progress_part(comm, p);
            if (s == PART_FAILED) {
                emu_op_fail_reason("%s", comm->error_text);
                op_finished(o);
                return EMU_OP_FAILED;
            }
            if (s == PART_DONE) p->done = true, touch_buffers(comm, p);
            else all_done = false;
            moved = moved || p->progressed;
        }
        if (moved) any_moved = true;
    } while (!all_done && moved);
    if (!all_done && emu_now() < spin_until) {
        sched_yield();
        goto spin;
    }
    if (!all_done) {
        // A part that waits for its turn behind another part of this op is
        // not stuck while that one moves.
        for (int i = 0; i < o->nparts && any_moved; i++)
            if (o->parts[i].phase == COLL_TURN || o->parts[i].phase == SEND_TURN ||
                o->parts[i].phase == RECV_TURN)
                o->parts[i].stalled_since = emu_now();
        return EMU_OP_PENDING;
    }
    op_finished(o);
    return EMU_OP_DONE;
}

static void free_op(void *state) {
    emu_nccl_op *o = state;
    struct ncclComm *comm = o->comm;
    if (comm) {
        op_finished(o);
        if (o->prev) o->prev->next = o->next;
        else comm->ops = o->next;
        if (o->next) o->next->prev = o->prev;
    }
    free(o->parts);
    free(o);
}

// For emu_stream_discard_if: is this queued state one of `comm`'s ops? The
// stream may hold other libraries' work too, so we compare pointers with
// our own list instead of looking inside a state that may not be ours.
bool emu_nccl_op_belongs_to(void *state, void *comm) {
    for (emu_nccl_op *o = ((struct ncclComm *)comm)->ops; o; o = o->next)
        if (o == state) return true;
    return false;
}

static ncclResult_t enqueue_op(struct ncclComm *comm, cudaStream_t stream, const char *what,
                               emu_nccl_part *parts, int nparts) {
    emu_nccl_op *o = emu_nccl_calloc(1, sizeof *o);
    o->comm = comm;
    o->stream = stream;
    o->nparts = nparts;
    o->parts = emu_nccl_calloc((size_t)nparts, sizeof *o->parts);
    memcpy(o->parts, parts, (size_t)nparts * sizeof *parts);
    o->next = comm->ops;
    if (comm->ops) comm->ops->prev = o;
    comm->ops = o;
    comm->ops_unfinished++;
    // A stream that refuses the op (destroyed) has already freed it through free_op.
    cudaError_t err = emu_stream_enqueue(stream, what, run_op, o, free_op, NULL, 0);
    if (err == cudaErrorStreamCaptureUnsupported)
        return emu_nccl_call_error(comm, ncclInvalidUsage, "%s: the stream is being captured into a CUDA "
                                   "graph, and the emulated NCCL cannot be captured", what);
    if (err != cudaSuccess)
        return emu_nccl_call_error(comm, ncclUnhandledCudaError, "%s: the stream refused the work (%s); was "
                                   "it destroyed?", what, cudaGetErrorString(err));
    return ncclSuccess;
}

// ================================================================ groups
//
// NCCL keeps the group per host thread. Calls inside a group only get
// their sequence numbers; the outermost ncclGroupEnd queues them, one op
// per (communicator, stream), each op running its parts together.

typedef struct {
    struct ncclComm *comm;
    cudaStream_t stream;
    emu_nccl_part p;
} group_call;

static _Thread_local int group_depth;
static _Thread_local group_call *group_calls;
static _Thread_local int group_count, group_capacity;

static void group_add(struct ncclComm *comm, cudaStream_t stream, const emu_nccl_part *p) {
    if (group_count == group_capacity) {
        group_capacity = group_capacity ? 2 * group_capacity : 16;
        group_calls = emu_nccl_realloc(group_calls, (size_t)group_capacity * sizeof *group_calls);
    }
    group_calls[group_count++] = (group_call){comm, stream, *p};
}

// Queues the calls of one (comm, stream) pair, in call order, as one op.
static ncclResult_t group_flush_one(int first, bool *queued) {
    struct ncclComm *comm = group_calls[first].comm;
    cudaStream_t stream = group_calls[first].stream;
    emu_nccl_part *parts = emu_nccl_calloc((size_t)group_count, sizeof *parts);
    int n = 0;
    for (int i = first; i < group_count; i++) {
        if (queued[i] || group_calls[i].comm != comm || group_calls[i].stream != stream) continue;
        parts[n++] = group_calls[i].p;
        queued[i] = true;
    }
    ncclResult_t res = enqueue_op(comm, stream, n == 1 ? emu_nccl_kind_name(parts[0].kind) : "ncclGroupEnd",
                                  parts, n);
    free(parts);
    return res;
}

// ================================================================ the API: checking arguments

static ncclResult_t check_type_and_op(const char *api, const struct ncclComm *comm, ncclDataType_t t,
                                      bool reduces, ncclRedOp_t op) {
    if ((int)t < 0 || t > ncclBfloat16)
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: datatype %d is not supported by the "
                                   "emulated NCCL (int8 ... bfloat16; no fp8)", api, (int)t);
    int k = (int)op - ncclNumOps;
    bool premul = k >= 0 && k < EMU_NCCL_PREMUL_OPS && comm->premul[k].live;
    if (reduces && ((int)op < 0 || (op > ncclAvg && !premul)))
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: op %d is not one of ncclSum, ncclProd, "
                                   "ncclMax, ncclMin, ncclAvg, nor a PreMulSum op of this communicator", api, (int)op);
    if (reduces && premul && comm->premul[k].dtype != t)
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: the PreMulSum op was made for datatype %d, "
                                   "the call passes %d", api, (int)comm->premul[k].dtype, (int)t);
    return ncclSuccess;
}

static ncclResult_t check_rank_arg(const char *api, const struct ncclComm *comm, const char *what, int r) {
    if (r < 0 || r >= comm->nranks)
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: %s %d is not a rank of this communicator "
                                   "(0 to %d)", api, what, r, comm->nranks - 1);
    return ncclSuccess;
}

// NCCL reads and writes buffers from the GPU: they must be device memory,
// on the communicator's device.
static ncclResult_t check_buffer(const char *api, const struct ncclComm *comm, const char *name,
                                 const void *ptr, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
    if (!ptr) return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: %s is NULL", api, name);
    char what[96];
    snprintf(what, sizeof what, "%s %s", api, name);
    switch (emu_memory_kind_of(ptr, bytes, what)) {
    case EMU_HOST:
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: %s is host memory; NCCL needs device "
                                   "memory (cudaMalloc)", api, name);
    case EMU_HOST_PINNED:
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: %s is pinned host memory "
                                   "(cudaMallocHost); NCCL needs device memory (cudaMalloc)", api, name);
    default: break;
    }
    int owner = emu_device_of(ptr);
    if (owner != comm->device)
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: %s lives on emulated device %d, but the "
                                   "communicator uses device %d", api, name, owner, comm->device);
    return ncclSuccess;
}

static bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

// NCCL allows exactly two layouts: separate buffers, or the documented
// in-place position. Anything else would give wrong numbers on a GPU.
static ncclResult_t check_placement(const char *api, const struct ncclComm *comm, const emu_nccl_part *p) {
    size_t size = emu_nccl_dtype_size(p->dtype), n = p->count * size, all = n * (size_t)comm->nranks;
    const unsigned char *send = p->send, *recv = p->recv;
    switch (p->kind) {
    case KIND_ALL_GATHER:
        if (send != recv + (size_t)comm->rank * n && ranges_overlap(send, n, recv, all))
            return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: sendbuff overlaps recvbuff; in place "
                                       "needs sendbuff == recvbuff + rank * sendcount", api);
        return ncclSuccess;
    case KIND_REDUCE_SCATTER:
        if (recv != send + (size_t)comm->rank * n && ranges_overlap(send, all, recv, n))
            return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: recvbuff overlaps sendbuff; in place "
                                       "needs recvbuff == sendbuff + rank * recvcount", api);
        return ncclSuccess;
    case KIND_BROADCAST:
    case KIND_REDUCE:
        if (comm->rank != p->root) return ncclSuccess;   // only the root uses both
        // fall through
    default:
        if (send != recv && ranges_overlap(send, n, recv, n))
            return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: sendbuff and recvbuff overlap; they "
                                       "must be equal (in place) or apart", api);
        return ncclSuccess;
    }
}

static ncclResult_t check_collective(const char *api, const struct ncclComm *comm, const emu_nccl_part *p) {
    ncclResult_t res = check_type_and_op(api, comm, p->dtype, emu_nccl_kind_reduces(p->kind), p->op);
    if (res == ncclSuccess && emu_nccl_kind_has_root(p->kind)) res = check_rank_arg(api, comm, "root", p->root);
    if (res != ncclSuccess) return res;
    size_t size = emu_nccl_dtype_size(p->dtype), nranks = (size_t)comm->nranks;
    if (p->count > SIZE_MAX / size / nranks)
        return emu_nccl_call_error(comm, ncclInvalidArgument, "%s: count %zu is too large", api, p->count);
    size_t n = p->count * size, send_bytes = n, recv_bytes = n;
    bool root = comm->rank == p->root;
    if (p->kind == KIND_ALL_GATHER) recv_bytes = n * nranks;
    if (p->kind == KIND_REDUCE_SCATTER) send_bytes = n * nranks;
    if (p->kind == KIND_BROADCAST && !root) send_bytes = 0;   // only the root's is read
    if (p->kind == KIND_REDUCE && !root) recv_bytes = 0;      // only the root's is written
    if ((res = check_buffer(api, comm, "sendbuff", p->send, send_bytes)) != ncclSuccess) return res;
    if ((res = check_buffer(api, comm, "recvbuff", p->recv, recv_bytes)) != ncclSuccess) return res;
    return p->count ? check_placement(api, comm, p) : ncclSuccess;
}

// ================================================================ the API: queueing work

// After a call's checks: give it its number, then queue it (or keep it for
// the group's end).
static ncclResult_t submit(struct ncclComm *comm, cudaStream_t stream, emu_nccl_part *p) {
    emu_nccl_rank *me = emu_nccl_rank_record(comm, comm->rank);
    if (p->kind == KIND_SEND) {
        p->seq = ++comm->sends_issued[p->peer];
        p->phase = SEND_TURN;
        emu_nccl_channel *ch = emu_nccl_channel_of(comm, comm->rank, p->peer);
        atomic_store_explicit(&ch->send_issued, p->seq, memory_order_relaxed);
    } else if (p->kind == KIND_RECV) {
        p->seq = ++comm->recvs_issued[p->peer];
        p->phase = RECV_TURN;
        emu_nccl_channel *ch = emu_nccl_channel_of(comm, p->peer, comm->rank);
        atomic_store_explicit(&ch->recv_issued, p->seq, memory_order_relaxed);
    } else {
        p->seq = ++comm->collectives_issued;
        p->phase = COLL_TURN;
        atomic_store_explicit(&me->issued, p->seq, memory_order_relaxed);
    }
    if (group_depth > 0) {
        group_add(comm, stream, p);
        return ncclSuccess;
    }
    ncclResult_t res = enqueue_op(comm, stream, emu_nccl_kind_name(p->kind), p, 1);
    if (res != ncclSuccess || comm->blocking) return res;
    // A non-blocking communicator may answer "in progress" for any call;
    // the emulator always does, so programs that forget to poll are caught.
    comm->call_in_progress = emu_nccl_kind_name(p->kind);
    return ncclInProgress;
}

static ncclResult_t collective(int kind, const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream) {
    const char *api = emu_nccl_kind_name(kind);
    emu_nccl_part p = {.kind = kind, .send = sendbuff, .recv = recvbuff, .count = count, .dtype = datatype,
              .op = op, .root = root, .peer = -1};
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm_for_work(api, comm);
    if (res == ncclSuccess) res = check_collective(api, comm, &p);
    if (res == ncclSuccess) res = submit(comm, stream, &p);
    emu_unlock();
    return res;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return collective(KIND_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

static ncclResult_t point_to_point(int kind, void *buf, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
    const char *api = emu_nccl_kind_name(kind);
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm_for_work(api, comm);
    if (res == ncclSuccess) res = check_type_and_op(api, comm, datatype, false, ncclSum);
    if (res == ncclSuccess) res = check_rank_arg(api, comm, "peer", peer);
    if (res == ncclSuccess && count > SIZE_MAX / emu_nccl_dtype_size(datatype))
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "%s: count %zu is too large", api, count);
    if (res == ncclSuccess)
        res = check_buffer(api, comm, kind == KIND_SEND ? "sendbuff" : "recvbuff", buf,
                           count * emu_nccl_dtype_size(datatype));
    if (res == ncclSuccess) {
        emu_nccl_part p = {.kind = kind, .count = count, .dtype = datatype, .op = ncclSum, .root = -1,
                  .peer = peer};
        if (kind == KIND_SEND) p.send = buf;
        else p.recv = buf;
        res = submit(comm, stream, &p);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return point_to_point(KIND_SEND, (void *)(uintptr_t)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return point_to_point(KIND_RECV, recvbuff, count, datatype, peer, comm, stream);
}

// ================================================================ the API: PreMulSum ops, ncclBcast

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
    const char *api = "ncclRedOpCreatePreMulSum";
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm(api, comm);
    if (res == ncclSuccess && (!op || !scalar))
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "%s: op or scalar is NULL", api);
    if (res == ncclSuccess) res = check_type_and_op(api, comm, datatype, false, ncclSum);
    if (res == ncclSuccess && residence == ncclScalarDevice)
        res = check_buffer(api, comm, "scalar", scalar, emu_nccl_dtype_size(datatype));
    else if (res == ncclSuccess && residence != ncclScalarHostImmediate)
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "%s: residence %d is neither ncclScalarDevice nor "
                                  "ncclScalarHostImmediate", api, (int)residence);
    int k = 0;
    while (res == ncclSuccess && k < EMU_NCCL_PREMUL_OPS && comm->premul[k].live) k++;
    if (res == ncclSuccess && k == EMU_NCCL_PREMUL_OPS)
        res = emu_nccl_call_error(comm, ncclInvalidUsage, "%s: %d PreMulSum ops are live already (the emulated "
                                  "NCCL's limit): destroy some with ncclRedOpDestroy", api, EMU_NCCL_PREMUL_OPS);
    if (res == ncclSuccess) {
        comm->premul[k].live = true;
        comm->premul[k].dtype = datatype;
        comm->premul[k].device_scalar = residence == ncclScalarDevice ? scalar : NULL;
        comm->premul[k].scalar = residence == ncclScalarDevice ? 0 : emu_nccl_value_at(scalar, datatype);
        *op = (ncclRedOp_t)(ncclNumOps + k);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm("ncclRedOpDestroy", comm);
    int k = (int)op - ncclNumOps;
    if (res == ncclSuccess && (k < 0 || k >= EMU_NCCL_PREMUL_OPS || !comm->premul[k].live))
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "ncclRedOpDestroy: op %d is not a PreMulSum op of "
                                  "this communicator", (int)op);
    if (res == ncclSuccess) comm->premul[k].live = false; // (queued collectives keep what they read)
    emu_unlock();
    return res;
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

// ncclGroupStart and ncclGroupEnd themselves are in nccl_comm.c, which
// finishes the group's communicators first (they may be joined in a group).
int emu_nccl_group_depth(void) { return group_depth; }

void emu_nccl_group_enter(void) { group_depth++; }

// Leaves a group; at the outermost, queues its calls. (Lock held.)
ncclResult_t emu_nccl_group_leave(void) {
    if (group_depth == 0)
        return emu_nccl_call_error(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    ncclResult_t res = ncclSuccess;
    if (--group_depth == 0 && group_count > 0) {
        bool *queued = emu_nccl_calloc((size_t)group_count, sizeof *queued);
        bool in_progress = false;
        for (int i = 0; i < group_count; i++) {
            if (queued[i]) continue;
            ncclResult_t r = group_flush_one(i, queued);
            if (r != ncclSuccess && res == ncclSuccess) res = r;
        }
        // Every non-blocking communicator of the group now answers "in
        // progress" until ncclCommGetAsyncError has been asked.
        for (int i = 0; i < group_count; i++) {
            struct ncclComm *comm = group_calls[i].comm;
            if (comm->blocking) continue;
            comm->call_in_progress = "ncclGroupEnd";
            in_progress = true;
        }
        free(queued);
        free(group_calls);
        group_calls = NULL;
        group_count = group_capacity = 0;
        if (res == ncclSuccess && in_progress) res = ncclInProgress;
    }
    return res;
}
