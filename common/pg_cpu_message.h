// pg_cpu_message.h - layer 2 of the cpu backend (pg_cpu.h): messages.
// Every send becomes a frame, a checked header and the payload, written to
// the byte stream of pg_cpu_stream.h; the receiver checks that both sides
// are in the same operation with the same size, delivers the payload into a
// posted receive (or keeps it aside, "parked", until one is posted), and
// between ranks of one host may copy a large payload straight out of the
// sender's memory ("single copy").
#ifndef COURSE_PG_CPU_MESSAGE_H
#define COURSE_PG_CPU_MESSAGE_H

#include "pg_cpu_stream.h"

// ---------------------------------------------------------------- sending

// The bytes of r's frame in the stream: a header, then the payload padded
// to 8 bytes - or only the header, when the peer reads the payload itself.
static inline size_t cpu_frame_bytes(const cpu_req_t *r) {
    return sizeof r->header + (r->header.remote ? 0 : cpu_padded(r->bytes));
}

// The parts of r's frame (header, payload, padding) not yet written.
static inline int cpu_frame_parts(const cpu_req_t *r, size_t done, struct iovec iov[3]) {
    static const char zeros[8];
    const char *base[3] = {(const char *)&r->header, r->src, zeros};
    size_t payload = r->header.remote ? 0 : r->bytes;
    size_t len[3] = {sizeof r->header, payload, cpu_padded(payload) - payload};
    int count = 0;
    for (int i = 0; i < 3; i++) {
        if (done >= len[i]) {
            done -= len[i];
            continue;
        }
        iov[count].iov_base = (void *)(base[i] + done);
        iov[count].iov_len = len[i] - done;
        count++;
        done = 0;
    }
    return count;
}

static inline bool cpu_send_progress(cpu_peer_t *p) {
    bool moved = false;
    cpu_req_t *r;
    while ((r = p->sends.head) != NULL) {
        struct iovec iov[3];
        int parts = cpu_frame_parts(r, p->tx_done, iov);
        size_t n = cpu_write(p, iov, parts);
        if (n == 0) break;
        moved = true;
        p->tx_done += n;
        if (p->tx_done < cpu_frame_bytes(r)) continue;
        cpu_req_pop(&p->sends);
        p->tx_done = 0;
        if (r->header.remote) cpu_req_push(&p->reading, r);   // done when the peer has read it
        else if (r->detached) free(r);
        else r->done = true;   // the bytes are in the ring or the kernel: the buffer is free
    }
    return moved;
}

// Tell the peer we have read its payload: its buffer is free again.
static inline void cpu_send_done_reading(cpu_peer_t *p) {
    cpu_req_t *r = xcalloc(1, sizeof *r);
    r->peer = p->rank;
    r->is_send = r->detached = true;
    r->header = (cpu_header_t){CPU_MAGIC, CPU_TAG_DONE_READING, 0, 0};
    cpu_req_push(&p->sends, r);
    if (p->sends.head == r) cpu_send_progress(p);
}

// ---------------------------------------------------------------- receiving

static inline void cpu_check_match(const cpu_pg_t *pg, const cpu_peer_t *p, const cpu_req_t *r,
                                   uint32_t tag, size_t bytes) {
    if (tag != r->tag)
        die("rank %d sent data for %s while this rank is in %s: every rank must call the "
            "same collectives in the same order", p->rank, cpu_tag_name(tag),
            cpu_tag_name(r->tag));
    if (bytes != r->bytes)
        die("rank %d sent %zu bytes for %s but this rank expected %zu: do all ranks pass the "
            "same count and dtype?", p->rank, bytes, cpu_tag_name(tag), r->bytes);
    (void)pg;
}

// n bytes of r's payload, starting at byte `at`, have arrived in src.
static inline void cpu_deliver(cpu_req_t *r, const char *src, size_t at, size_t n) {
    if (n == 0) return;
    if (r->mine)
        pg_combine(r->dst + at, src, r->mine + at, n / dtype_size(r->dtype), r->dtype, r->op);
    else
        memcpy(r->dst + at, src, n);
}

// An unexpected message grows as it arrives (it may never be large).
static inline void cpu_msg_append(cpu_msg_t *m, const char *src, size_t at, size_t n) {
    if (at + n > m->cap) {
        size_t cap = m->cap ? m->cap : 64 << 10;
        while (cap < at + n) cap *= 2;
        if (cap > m->bytes) cap = m->bytes;
        char *grown = realloc(m->data, cap);
        if (!grown) die("out of memory keeping a %zu-byte message that arrived early", m->bytes);
        m->data = grown;
        m->cap = cap;
    }
    memcpy(m->data + at, src, n);
}

static inline void cpu_end_message(cpu_peer_t *p) {
    if (p->in_req) p->in_req->done = true;
    else cpu_msg_push(&p->unexpected[cpu_context(p->in.tag)], p->in_msg);
    p->in_message = false;
    p->in_req = NULL;
    p->in_msg = NULL;
}

static inline cpu_msg_t *cpu_new_msg(const cpu_header_t *h) {
    cpu_msg_t *m = xcalloc(1, sizeof *m);
    m->tag = h->tag;
    m->bytes = h->bytes;
    m->remote = h->remote;
    return m;
}

// A message whose header has arrived but that nobody has asked for yet,
// its payload still in the stream (see cpu_begin_message).
static inline bool cpu_parked(const cpu_peer_t *p) {
    return p->in_message && !p->in_req && !p->in_msg;
}

// ---------------------------------------------------------------- single copy
//
// A large payload between two ranks of one host need not pass through a
// ring at all. Its sender writes only a header with the payload's address;
// the receiver copies the payload straight out of the sender's memory with
// process_vm_readv (Linux's "cross-memory attach", which MPI's shared-memory
// transport uses too), then tells the sender it is done reading, which is
// when the send completes. One copy instead of two: half the memory
// traffic, which is what limits large transfers once they no longer fit in
// the caches.
//
// It is off unless COURSE_SINGLE_COPY=1, because the two copies through a
// 256 KiB ring won here: the sender's copy and the receiver's run at once
// on two cores, and the bytes between them stay in the caches, while the
// kernel's one copy, page by page, runs on one core. 2 ranks, 100
// operations, medians of 5 interleaved runs (2026-11-28, load 0.7):
// ping-pong of 2 MiB 71 us through the ring, 170 by single copy (MPI, which
// uses the kernel's copy: 168); all-reduce of 2 MiB 175 against 434 (MPI
// 324); broadcast of 8 MiB 329 against 550 (MPI 503). On 4 ranks the ring
// was as fast or faster at every size too. A machine with more cores and
// larger messages in flight may decide otherwise: measure with
// 03_collectives/bench/compare_mpi.sh, with and without it.

// Copies `bytes` at address `remote` of the peer's memory to dst.
static inline void cpu_read_remote(const cpu_pg_t *pg, const cpu_peer_t *p, char *dst,
                                   uint64_t remote, size_t bytes) {
    for (size_t got = 0; got < bytes;) {
        struct iovec local = {dst + got, bytes - got};
        struct iovec far = {(void *)(uintptr_t)(remote + got), bytes - got};
        ssize_t n = process_vm_readv(p->pid, &local, 1, &far, 1, 0);
        if (n <= 0)
            die("reading %zu bytes from rank %d's memory during %s failed: %s (did it crash?)",
                bytes, p->rank, cpu_tag_name(pg->tag), n < 0 ? strerror(errno) : "nothing read");
        got += (size_t)n;
    }
}

// A payload the peer lets us read, into the receive it answers. (Senders
// stream what the receiver reduces: cpu_post_send_to_reduce.)
static inline void cpu_single_copy(const cpu_pg_t *pg, cpu_peer_t *p, cpu_req_t *r,
                                   uint64_t remote) {
    if (r->mine) die("rank %d offered a single copy for a reduction (a bug in pg_cpu.h)", p->rank);
    cpu_read_remote(pg, p, r->dst, remote, r->bytes);
    cpu_send_done_reading(p);
    r->done = true;
}

// What nobody has asked for yet is taken into buffers of our own once we
// have had nothing else to do for a while: parked messages, which block
// their stream, and single-copy payloads, whose senders wait for us to read
// them. Their senders may need that before they post the receive we wait
// for (two ranks that both send before they receive). Never leaving a send
// unfinished for good is what MPI calls the progress rule.
static inline bool cpu_take_unasked(const cpu_pg_t *pg) {
    bool moved = false;
    for (int r = 0; r < pg->world; r++) {
        cpu_peer_t *p = &pg->peers[r];
        if (r == pg->rank) continue;
        if (cpu_parked(p)) {   // its payload now flows into a buffer
            p->in_msg = cpu_new_msg(&p->in);
            if (p->in.bytes == 0) cpu_end_message(p);
            moved = true;
        }
        for (int c = 0; c < 2; c++)
            for (cpu_msg_t *m = p->unexpected[c].head; m; m = m->next) {
                if (!m->remote) continue;
                m->data = xmalloc(m->bytes ? m->bytes : 1);
                m->cap = m->bytes;
                cpu_read_remote(pg, p, m->data, m->remote, m->bytes);
                m->remote = 0;
                cpu_send_done_reading(p);
                moved = true;
            }
    }
    return moved;
}

// A header is complete: find the receive it answers, or keep it for later.
static inline void cpu_begin_message(const cpu_pg_t *pg, cpu_peer_t *p) {
    memcpy(&p->in, p->hdr, sizeof p->in);
    if (p->in.magic != CPU_MAGIC || p->in.tag == 0 || p->in.tag >= CPU_TAG_COUNT)
        die("rank %d sent bytes that are not a message during %s: the two ranks are out of "
            "step (a bug in pg_cpu.h, or a foreign program on this connection)", p->rank,
            cpu_tag_name(pg->tag));
    if (p->in.tag == CPU_TAG_DONE_READING) {   // the peer has read one of our payloads
        cpu_req_t *r = cpu_req_pop(&p->reading);
        if (!r) die("rank %d says it read a payload this rank never offered (a bug in pg_cpu.h)",
                    p->rank);
        r->done = true;
        return;
    }
    p->in_message = true;
    p->in_got = 0;
    p->in_req = cpu_req_pop(&p->posted[cpu_context(p->in.tag)]);
    p->in_msg = NULL;
    if (p->in_req) {
        cpu_check_match(pg, p, p->in_req, p->in.tag, p->in.bytes);
        if (p->in.remote) {   // no payload follows: we read it now
            cpu_single_copy(pg, p, p->in_req, p->in.remote);
            p->in_req = NULL;
            p->in_message = false;
        } else if (p->in.bytes == 0) {
            cpu_end_message(p);
        }
    } else if (p->in.remote) {   // nothing follows in the stream: keep the address for later
        p->in_msg = cpu_new_msg(&p->in);
        cpu_end_message(p);
    }
    // Otherwise nobody has asked for it yet: the message is "parked". Its
    // payload stays in the ring (or the socket) until a receive is posted
    // for it, and then flows straight into that receive's buffer. Taking
    // it out early into a buffer of our own (cpu_take_unasked) costs an
    // allocation, page faults and a second copy - measured as most of the
    // time of back-to-back broadcasts, where the root runs ahead.
}

// The stream is used in multiples of 8 bytes (see cpu_padded); each take
// returns how many bytes it used, 0 when it needs more.
static inline size_t cpu_take_header(const cpu_pg_t *pg, cpu_peer_t *p, const char *src,
                                     size_t len) {
    size_t n = sizeof(cpu_header_t) - p->hdr_got;
    if (len < n) n = len & ~(size_t)7;
    memcpy(p->hdr + p->hdr_got, src, n);
    p->hdr_got += n;
    if (p->hdr_got == sizeof(cpu_header_t)) {
        p->hdr_got = 0;
        cpu_begin_message(pg, p);
    }
    return n;
}

static inline size_t cpu_take_payload(cpu_peer_t *p, const char *src, size_t len) {
    size_t left = cpu_padded(p->in.bytes) - p->in_got;
    size_t n = (len < left ? len : left) & ~(size_t)7;
    if (n == 0) return 0;
    if (p->in_got < p->in.bytes) {
        size_t useful = p->in.bytes - p->in_got;
        if (useful > n) useful = n;
        if (p->in_req) cpu_deliver(p->in_req, src, p->in_got, useful);
        else cpu_msg_append(p->in_msg, src, p->in_got, useful);
    }
    p->in_got += n;
    if (p->in_got == cpu_padded(p->in.bytes)) cpu_end_message(p);
    return n;
}

// Takes what has arrived: headers and payloads, as many messages as the
// bytes in view hold, then hands the bytes back to the stream at once (one
// store of the ring's `tail` and one look at the writer's doorbell per
// view, not one per header and one per payload).
static inline bool cpu_recv_progress(const cpu_pg_t *pg, cpu_peer_t *p) {
    size_t taken = 0;
    while (taken < CPU_PASS_BYTES) {
        size_t len, used = 0, n;
        if (cpu_parked(p)) break;   // the stream waits for a receive
        const char *src = cpu_peek(p, &len);
        if (!src) break;
        do {
            n = p->in_message ? cpu_take_payload(p, src + used, len - used)
                              : cpu_take_header(pg, p, src + used, len - used);
            used += n;
        } while (n > 0 && used < len && !cpu_parked(p));
        if (used == 0) break;
        cpu_consume(p, used);
        taken += used;
    }
    return taken > 0;
}

#endif
