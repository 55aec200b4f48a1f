// nccl_collective.c - what a queued collective does, chunk by chunk.
//
// A collective moves its data in rounds ("chunks") of at most one slot:
// every rank copies its part of the chunk into its own slot, waits at a
// barrier until everybody has, computes its own result from all the slots
// in rank order, and waits at a second barrier so that no slot is
// overwritten while someone still reads it. Before any data moves, each
// rank publishes what it was asked to do (its descriptor) and compares it
// with the others', so that ranks that call different collectives get an
// error naming every rank's call instead of a hang.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

// ================================================================ waiting for every rank

static bool collective_rank_reached(struct ncclComm *comm, const emu_nccl_part *p, int r) {
    emu_nccl_rank *peer = emu_nccl_rank_record(comm, r);
    if (p->phase == COLL_AGREE)
        return atomic_load_explicit(&peer->desc[p->seq % 2].seq, memory_order_acquire) == p->seq;
    return atomic_load_explicit(&peer->arrived, memory_order_acquire) >= p->barrier;
}

// Why rank r has not reached collective p, in words, for the timeout.
static void explain_missing_rank(char *buf, size_t size, struct ncclComm *comm, const emu_nccl_part *p, int r) {
    emu_nccl_rank *peer = emu_nccl_rank_record(comm, r);
    uint64_t issued = atomic_load_explicit(&peer->issued, memory_order_relaxed);
    uint64_t completed = atomic_load_explicit(&peer->completed, memory_order_relaxed);
    char last[80] = "it has finished none";
    if (completed > 0)
        snprintf(last, sizeof last, "the last it finished: #%llu %s", (unsigned long long)completed,
                 emu_nccl_kind_name(atomic_load_explicit(&peer->last_kind, memory_order_relaxed)));
    if (p->phase != COLL_AGREE)
        emu_nccl_appendf(buf, size, "; rank %d started it but stopped making progress (is that process "
                         "stopped, or busy without waiting for its stream?)", r);
    else if (issued < p->seq)
        emu_nccl_appendf(buf, size, "; rank %d has called only %llu collective(s) (%s)", r,
                         (unsigned long long)issued, last);
    else
        emu_nccl_appendf(buf, size, "; rank %d has called it, but its stream has not run it yet (%s; "
                         "work runs when that rank synchronizes or queries its stream)", r, last);
}

static void fail_collective_timeout(struct ncclComm *comm, emu_nccl_part *p) {
    char what[300], text[EMU_NCCL_ERROR_BYTES] = "";
    emu_nccl_describe_part(what, sizeof what, comm, p);
    bool someone_called_less = false;
    for (int r = 0; r < comm->nranks; r++) {
        if (collective_rank_reached(comm, p, r)) continue;
        explain_missing_rank(text, sizeof text, comm, p, r);
        if (atomic_load_explicit(&emu_nccl_rank_record(comm, r)->issued, memory_order_relaxed) < p->seq)
            someone_called_less = true;
    }
    emu_nccl_comm_fail(comm, p->phase == COLL_AGREE || someone_called_less ? ncclInvalidUsage : ncclRemoteError,
                       "%s timed out after %g s%s (every rank must call the same collectives in the same "
                       "order; EMU_TIMEOUT sets the limit)", what, emu_timeout_s(), text);
}

// Waits until every rank has posted this collective's descriptor (phase
// COLL_AGREE) or arrived at barrier p->barrier (the data phases). A barrier
// is a counter per rank that only grows: "everyone has arrived" is
// "everyone's counter >= mine", so nothing has to be reset between rounds
// and a rank that is missing can be named.
static emu_nccl_status wait_for_all_ranks(struct ncclComm *comm, emu_nccl_part *p) {
    bool check_pids = emu_nccl_time_to_check_pids(p);
    bool everyone = true;
    for (int r = 0; r < comm->nranks; r++) {
        if (collective_rank_reached(comm, p, r)) continue;
        everyone = false;
        if (emu_nccl_peer_is_lost(comm, p, r, check_pids)) return PART_FAILED;
    }
    if (everyone) {
        emu_nccl_progressed(p);
        return PART_DONE;
    }
    if (emu_nccl_stalled_too_long(p)) {
        fail_collective_timeout(comm, p);
        return PART_FAILED;
    }
    return PART_PENDING;
}

// ================================================================ agreeing on the call

static void post_descriptor(struct ncclComm *comm, const emu_nccl_part *p) {
    emu_nccl_descriptor *d = &emu_nccl_rank_record(comm, comm->rank)->desc[p->seq % 2];
    d->kind = p->kind;
    d->count = p->count;
    d->dtype = p->dtype;
    d->op = emu_nccl_kind_reduces(p->kind) ? (int32_t)p->op : -1;
    d->root = emu_nccl_kind_has_root(p->kind) ? p->root : -1;
    atomic_store_explicit(&d->seq, p->seq, memory_order_release);
}

static bool same_call(const emu_nccl_descriptor *a, const emu_nccl_descriptor *b) {
    return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root;
}

// Every rank compares all the descriptors, so every rank finds a mismatch
// and writes the same message: "rank 0 called ..., ranks 1 and 2 called ...".
static bool descriptors_agree(struct ncclComm *comm, const emu_nccl_part *p) {
    const emu_nccl_descriptor *first = &emu_nccl_rank_record(comm, 0)->desc[p->seq % 2];
    bool agree = true;
    for (int r = 1; r < comm->nranks; r++)
        if (!same_call(first, &emu_nccl_rank_record(comm, r)->desc[p->seq % 2])) agree = false;
    if (agree) return true;

    char text[EMU_NCCL_ERROR_BYTES] = "";
    bool *listed = emu_nccl_calloc((size_t)comm->nranks, sizeof *listed);
    for (int r = 0; r < comm->nranks; r++) {
        if (listed[r]) continue;
        const emu_nccl_descriptor *d = &emu_nccl_rank_record(comm, r)->desc[p->seq % 2];
        int same = 0;
        for (int s = r; s < comm->nranks; s++)
            if (!listed[s] && same_call(d, &emu_nccl_rank_record(comm, s)->desc[p->seq % 2])) same++;
        emu_nccl_appendf(text, sizeof text, "%s%s", text[0] ? ", " : "", same > 1 ? "ranks " : "rank ");
        int shown = 0;
        for (int s = r; s < comm->nranks; s++) {
            if (listed[s] || !same_call(d, &emu_nccl_rank_record(comm, s)->desc[p->seq % 2])) continue;
            listed[s] = true;
            shown++;
            emu_nccl_appendf(text, sizeof text, "%s%d", shown == 1 ? "" : shown == same ? " and " : ", ", s);
        }
        char call[160];
        emu_nccl_describe_call(call, sizeof call, d->kind, d->count, d->dtype, d->op, d->root);
        emu_nccl_appendf(text, sizeof text, " called %s", call);
    }
    free(listed);
    emu_nccl_comm_fail(comm, ncclInvalidUsage, "collective #%llu differs between ranks: %s",
                       (unsigned long long)p->seq, text);
    return false;
}

// ================================================================ moving the data

// How many elements go through a slot per round: a whole slot, except for
// reduce-scatter, where a slot holds one piece for each rank.
static void plan_chunks(struct ncclComm *comm, emu_nccl_part *p) {
    size_t per_chunk = EMU_NCCL_SLOT_BYTES / emu_nccl_dtype_size(p->dtype);
    if (p->kind == KIND_REDUCE_SCATTER) per_chunk /= (size_t)comm->nranks;
    p->chunk_elems = per_chunk;
    p->nchunks = (p->count + per_chunk - 1) / per_chunk;
    p->chunk = 0;
}

static size_t chunk_first(const emu_nccl_part *p) { return p->chunk * p->chunk_elems; }

static size_t chunk_length(const emu_nccl_part *p) {
    size_t left = p->count - chunk_first(p);
    return left < p->chunk_elems ? left : p->chunk_elems;
}

// Step 1 of a round: this rank's contribution into its own slot.
static void fill_slot(struct ncclComm *comm, const emu_nccl_part *p) {
    size_t size = emu_nccl_dtype_size(p->dtype), first = chunk_first(p), n = chunk_length(p);
    const unsigned char *send = p->send;
    unsigned char *mine = emu_nccl_slot_of(comm, comm->rank);
    switch (p->kind) {
    case KIND_BROADCAST:
        if (comm->rank == p->root) memcpy(mine, send + first * size, n * size);
        break;
    case KIND_REDUCE_SCATTER:   // the chunk of every rank's block, side by side
        for (int r = 0; r < comm->nranks; r++)
            memcpy(mine + (size_t)r * p->chunk_elems * size,
                   send + ((size_t)r * p->count + first) * size, n * size);
        break;
    default:                    // all-reduce, reduce, all-gather
        memcpy(mine, send + first * size, n * size);
        break;
    }
    if (!emu_nccl_kind_reduces(p->kind) || p->op < ncclNumOps) return;
    // A PreMulSum op: this rank's values times its scalar, then the sum.
    int k = p->op - ncclNumOps;
    double scalar = comm->premul[k].device_scalar ? emu_nccl_value_at(comm->premul[k].device_scalar, p->dtype)
                                                  : comm->premul[k].scalar;
    if (p->kind != KIND_REDUCE_SCATTER) emu_nccl_premultiply(mine, n, p->dtype, scalar);
    else
        for (int r = 0; r < comm->nranks; r++)
            emu_nccl_premultiply(mine + (size_t)r * p->chunk_elems * size, n, p->dtype, scalar);
}
static void take_result(struct ncclComm *comm, const emu_nccl_part *p) {
    size_t size = emu_nccl_dtype_size(p->dtype), first = chunk_first(p), n = chunk_length(p);
    unsigned char *recv = p->recv;
    switch (p->kind) {
    case KIND_ALL_REDUCE:
        emu_nccl_reduce_slots(comm, p, 0, n, recv + first * size);
        break;
    case KIND_REDUCE:
        if (comm->rank == p->root) emu_nccl_reduce_slots(comm, p, 0, n, recv + first * size);
        break;
    case KIND_BROADCAST:
        memcpy(recv + first * size, emu_nccl_slot_of(comm, p->root), n * size);
        break;
    case KIND_ALL_GATHER:
        for (int r = 0; r < comm->nranks; r++)
            memcpy(recv + ((size_t)r * p->count + first) * size, emu_nccl_slot_of(comm, r), n * size);
        break;
    case KIND_REDUCE_SCATTER:
        emu_nccl_reduce_slots(comm, p, (size_t)comm->rank * p->chunk_elems * size, n, recv + first * size);
        break;
    }
}

static void arrive_at_barrier(struct ncclComm *comm, emu_nccl_part *p) {
    p->barrier = ++comm->barriers;
    atomic_store_explicit(&emu_nccl_rank_record(comm, comm->rank)->arrived, p->barrier, memory_order_release);
}

static void finish_collective(struct ncclComm *comm, const emu_nccl_part *p) {
    emu_nccl_rank *me = emu_nccl_rank_record(comm, comm->rank);
    comm->collectives_done = p->seq;
    atomic_store_explicit(&me->last_kind, p->kind, memory_order_relaxed);
    atomic_store_explicit(&me->completed, p->seq, memory_order_release);
}

emu_nccl_status emu_nccl_progress_collective(struct ncclComm *comm, emu_nccl_part *p) {
    emu_nccl_status s;
    for (;;) {
        switch (p->phase) {
        case COLL_TURN:   // collectives run in the order the program called them
            if (comm->collectives_done + 1 != p->seq) return emu_nccl_wait_for_turn(comm, p);
            post_descriptor(comm, p);
            emu_nccl_progressed(p);
            p->phase = COLL_AGREE;
            break;
        case COLL_AGREE:
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            if (!descriptors_agree(comm, p)) return PART_FAILED;
            plan_chunks(comm, p);
            p->phase = p->nchunks > 0 ? COLL_FILL : COLL_FINISH;
            break;
        case COLL_FILL:
            fill_slot(comm, p);
            arrive_at_barrier(comm, p);
            p->phase = COLL_FILLED;
            break;
        case COLL_FILLED:   // every slot is full: compute, then say "done reading"
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            take_result(comm, p);
            arrive_at_barrier(comm, p);
            p->phase = COLL_DRAINED;
            break;
        case COLL_DRAINED:  // nobody reads the slots any more: the next round may fill them
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            p->chunk++;
            p->phase = p->chunk < p->nchunks ? COLL_FILL : COLL_FINISH;
            break;
        default:            // COLL_FINISH
            finish_collective(comm, p);
            return PART_DONE;
        }
    }
}
