// nccl_p2p.c - what a queued ncclSend or ncclRecv does.
//
// Each (sender, receiver) pair has a ring in the segment. The sender
// describes message #k (count, type), writes bytes while there is room,
// and is done when the receiver has taken them all - NCCL, too, buffers
// nothing beyond its channel, which is why an exchange where both ranks
// send first needs ncclGroupStart/End: the group's parts progress together.
#include <stdio.h>
#include <string.h>

#include "emu_internal.h"

// ================================================================ when the other side does not come

static void fail_p2p_mismatch(struct ncclComm *comm, const emu_nccl_part *p, int sender, int receiver,
                              uint64_t send_count, int send_dtype, uint64_t recv_count, int recv_dtype) {
    char send_call[160], recv_call[160];
    emu_nccl_describe_call(send_call, sizeof send_call, KIND_SEND, send_count, send_dtype, -1, receiver);
    emu_nccl_describe_call(recv_call, sizeof recv_call, KIND_RECV, recv_count, recv_dtype, -1, sender);
    emu_nccl_comm_fail(comm, ncclInvalidUsage,
                       "send/recv #%llu from rank %d to rank %d differs between the two ranks: rank %d called "
                       "%s, rank %d called %s (count and type must match)",
                       (unsigned long long)p->seq, sender, receiver, sender, send_call, receiver, recv_call);
}

static void fail_p2p_timeout(struct ncclComm *comm, const emu_nccl_part *p, emu_nccl_channel *ch) {
    char what[300];
    emu_nccl_describe_part(what, sizeof what, comm, p);
    bool sending = p->kind == KIND_SEND;
    uint64_t peer_issued = atomic_load_explicit(sending ? &ch->recv_issued : &ch->send_issued,
                                                memory_order_relaxed);
    const char *peer_call = sending ? "ncclRecv from" : "ncclSend to";
    char why[400];
    if (peer_issued < p->seq)
        snprintf(why, sizeof why, "rank %d has called %s rank %d only %llu time(s)", p->peer, peer_call,
                 comm->rank, (unsigned long long)peer_issued);
    else
        snprintf(why, sizeof why,
                 "rank %d has called the matching %s but has not finished it: its stream has not "
                 "got there (perhaps it waits behind an earlier operation, such as its own send), "
                 "or that process is stuck", p->peer, sending ? "ncclRecv" : "ncclSend");
    emu_nccl_comm_fail(comm, ncclInvalidUsage,
                       "%s timed out after %g s: %s (a send completes only when its receiver has taken "
                       "all the data: sends and receives that must progress together, such as an exchange, "
                       "belong in one ncclGroupStart/ncclGroupEnd; EMU_TIMEOUT sets the limit)",
                       what, emu_timeout_s(), why);
}

// The sender is blocked (ring full, or waiting for the acknowledgement).
static emu_nccl_status sender_waits(struct ncclComm *comm, emu_nccl_part *p, emu_nccl_channel *ch) {
    if (atomic_load_explicit(&ch->rejected, memory_order_acquire) == p->seq) {
        fail_p2p_mismatch(comm, p, comm->rank, p->peer, p->count, p->dtype, ch->recv_count,
                          ch->recv_dtype);
        return PART_FAILED;
    }
    if (emu_nccl_peer_is_lost(comm, p, p->peer, emu_nccl_time_to_check_pids(p))) return PART_FAILED;
    if (emu_nccl_stalled_too_long(p)) {
        fail_p2p_timeout(comm, p, ch);
        return PART_FAILED;
    }
    return PART_PENDING;
}

static emu_nccl_status receiver_waits(struct ncclComm *comm, emu_nccl_part *p, emu_nccl_channel *ch) {
    if (emu_nccl_peer_is_lost(comm, p, p->peer, emu_nccl_time_to_check_pids(p))) return PART_FAILED;
    if (emu_nccl_stalled_too_long(p)) {
        fail_p2p_timeout(comm, p, ch);
        return PART_FAILED;
    }
    return PART_PENDING;
}

// Copies as much as fits (up to the end of the ring); returns the bytes copied.
static size_t write_to_ring(emu_nccl_channel *ch, unsigned char *ring_data, size_t ring_bytes,
                            const unsigned char *src, size_t left) {
    uint64_t written = atomic_load_explicit(&ch->written, memory_order_relaxed);   // ours alone
    uint64_t read = atomic_load_explicit(&ch->read, memory_order_acquire);
    size_t room = ring_bytes - (size_t)(written - read), at = (size_t)(written % ring_bytes);
    size_t n = left;
    if (n > room) n = room;
    if (n > ring_bytes - at) n = ring_bytes - at;
    memcpy(ring_data + at, src, n);
    atomic_store_explicit(&ch->written, written + n, memory_order_release);
    return n;
}

static size_t read_from_ring(emu_nccl_channel *ch, const unsigned char *ring_data, size_t ring_bytes,
                             unsigned char *dst, size_t left) {
    uint64_t read = atomic_load_explicit(&ch->read, memory_order_relaxed);   // ours alone
    uint64_t written = atomic_load_explicit(&ch->written, memory_order_acquire);
    size_t ready = (size_t)(written - read), at = (size_t)(read % ring_bytes);
    size_t n = left;
    if (n > ready) n = ready;
    if (n > ring_bytes - at) n = ring_bytes - at;
    memcpy(dst, ring_data + at, n);
    atomic_store_explicit(&ch->read, read + n, memory_order_release);
    return n;
}

emu_nccl_status emu_nccl_progress_send(struct ncclComm *comm, emu_nccl_part *p) {
    emu_nccl_channel *ch = emu_nccl_channel_of(comm, comm->rank, p->peer);
    size_t total = p->count * emu_nccl_dtype_size(p->dtype);
    for (;;) {
        switch (p->phase) {
        case SEND_TURN:   // messages to one peer go in call order
            if (comm->sends_done[p->peer] + 1 != p->seq) return emu_nccl_wait_for_turn(comm, p);
            ch->send_count = p->count;
            ch->send_dtype = p->dtype;
            atomic_store_explicit(&ch->send_posted, p->seq, memory_order_release);
            emu_nccl_progressed(p);
            p->phase = SEND_WRITE;
            break;
        case SEND_WRITE:
            if (p->moved == total) {
                p->phase = SEND_ACK;
                break;
            }
            size_t n = write_to_ring(ch, emu_nccl_ring_of(comm, comm->rank, p->peer), comm->ring_bytes,
                                     (const unsigned char *)p->send + p->moved, total - p->moved);
            if (n == 0) return sender_waits(comm, p, ch);
            p->moved += n;
            emu_nccl_progressed(p);
            break;
        default:          // SEND_ACK: done when the receiver has everything
            if (atomic_load_explicit(&ch->acked, memory_order_acquire) < p->seq)
                return sender_waits(comm, p, ch);
            comm->sends_done[p->peer] = p->seq;
            emu_nccl_progressed(p);
            return PART_DONE;
        }
    }
}

emu_nccl_status emu_nccl_progress_recv(struct ncclComm *comm, emu_nccl_part *p) {
    emu_nccl_channel *ch = emu_nccl_channel_of(comm, p->peer, comm->rank);
    size_t total = p->count * emu_nccl_dtype_size(p->dtype);
    for (;;) {
        switch (p->phase) {
        case RECV_TURN:
            if (comm->recvs_done[p->peer] + 1 != p->seq) return emu_nccl_wait_for_turn(comm, p);
            emu_nccl_progressed(p);
            p->phase = RECV_MATCH;
            break;
        case RECV_MATCH:  // the sender's description of this message must match ours
            if (atomic_load_explicit(&ch->send_posted, memory_order_acquire) != p->seq)
                return receiver_waits(comm, p, ch);
            if (ch->send_count != p->count || ch->send_dtype != (int32_t)p->dtype) {
                ch->recv_count = p->count;
                ch->recv_dtype = p->dtype;
                atomic_store_explicit(&ch->rejected, p->seq, memory_order_release);
                fail_p2p_mismatch(comm, p, p->peer, comm->rank, ch->send_count, ch->send_dtype,
                                  p->count, p->dtype);
                return PART_FAILED;
            }
            emu_nccl_progressed(p);
            p->phase = RECV_READ;
            break;
        default:          // RECV_READ
            if (p->moved == total) {
                atomic_store_explicit(&ch->acked, p->seq, memory_order_release);
                comm->recvs_done[p->peer] = p->seq;
                emu_nccl_progressed(p);
                return PART_DONE;
            }
            size_t n = read_from_ring(ch, emu_nccl_ring_of(comm, p->peer, comm->rank), comm->ring_bytes,
                                      (unsigned char *)p->recv + p->moved, total - p->moved);
            if (n == 0) return receiver_waits(comm, p, ch);
            p->moved += n;
            emu_nccl_progressed(p);
            break;
        }
    }
}
