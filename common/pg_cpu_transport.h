// pg_cpu_transport.h - how the cpu backend (pg_cpu.h) moves bytes between
// two ranks: byte streams over TCP or shared-memory rings (layer 1),
// messages with a checked header (layer 2), and the progress engine that
// moves them while the caller waits (layer 3). pg_cpu.h explains the layers;
// the algorithms (pg_cpu_algorithms.h) use only the verbs of "posting work":
// cpu_post_send, cpu_post_recv (and _reduce), cpu_wait, cpu_send_wait,
// cpu_recv_wait and cpu_exchange.
#ifndef COURSE_PG_CPU_TRANSPORT_H
#define COURSE_PG_CPU_TRANSPORT_H

#include "pg_types.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "netif.h"
#include "timer.h"

enum {
    CPU_SMALL_BYTES = 64 << 10,      // all-reduce up to this size: recursive doubling
    CPU_TREE_BROADCAST_BYTES = 8 << 20,   // broadcast up to this size: a tree
    CPU_SEGMENT_BYTES = 512 << 10,   // pipeline unit of the large broadcast
    CPU_BOUNCE_BYTES = 256 << 10,    // TCP: most bytes taken from the kernel per recv()
    CPU_PASS_BYTES = 4 << 20,        // most bytes read from one peer per pass (fairness)
    CPU_RING_MAX = 4 << 20,          // shared-memory ring per ordered pair of ranks
    CPU_RING_MIN = 64 << 10,
    CPU_CHUNK_BYTES = 64 << 10,      // shared memory: bytes published or consumed at a time
    CPU_SINGLE_COPY_MIN = 512 << 10, // shared memory: the receiver reads payloads of these sizes
    CPU_SINGLE_COPY_MAX = 8 << 20,   // ... straight from the sender's buffer (measured, see below)
    CPU_SHM_BUDGET = 48 << 20,       // all rings of a host (Docker's /dev/shm is 64 MiB)
};
// How a rank waits for bytes (cpu_idle): first it spins, polling the rings
// with a pause instruction in between, for CPU_SPIN_SECONDS, if every rank
// of the host has a core of its own. Then it polls with sched_yield() in
// between until CPU_YIELD_SECONDS: that hands the core to a rank that
// shares it (more ranks than cores, or the scheduler briefly put two ranks
// on one core) and costs little more than a spin when nobody does. Only
// then does it sleep on its doorbell. Sleeping earlier loses more than it
// saves: waking a sleeper took 50-100 us here, and the kernel tends to wake
// it on the waker's core, so two ranks that both fall asleep stay slow
// (measured: 100 us per 8-byte all-reduce instead of 0.3-0.8 us). Spins of
// 5 and 50 us gave the same latencies on 2 cores; the short one wastes less
// when two ranks share a core.
#define CPU_SPIN_SECONDS 10e-6
#define CPU_YIELD_SECONDS 0.1
// A rank idle this long takes what it has not asked for yet into buffers of
// its own (cpu_take_unasked).
#define CPU_UNASKED_SECONDS 1e-3
#define CPU_MAGIC 0x314d4750u        // "PGM1", first bytes of every message header
#define CPU_SHM_MAGIC 0x314d485347504ull

// ---------------------------------------------------------------- messages

// Which operation a message belongs to; it travels in the header.
enum {
    CPU_TAG_P2P = 1, CPU_TAG_SETUP, CPU_TAG_BROADCAST, CPU_TAG_REDUCE, CPU_TAG_ALL_REDUCE,
    CPU_TAG_GATHER, CPU_TAG_ALL_GATHER, CPU_TAG_SCATTER, CPU_TAG_REDUCE_SCATTER,
    CPU_TAG_ALL_TO_ALL, CPU_TAG_BARRIER, CPU_TAG_DESTROY, CPU_TAG_DONE_READING, CPU_TAG_COUNT
};

static inline const char *cpu_tag_name(uint32_t tag) {
    static const char *names[] = {"?", "send/recv", "setup", "broadcast", "reduce",
                                  "all_reduce", "gather", "all_gather", "scatter",
                                  "reduce_scatter", "all_to_all", "barrier", "pg_destroy",
                                  "single copy"};
    return tag < CPU_TAG_COUNT ? names[tag] : "?";
}

// Point-to-point messages and collective messages are matched separately
// (two "contexts", as MPI calls them): an isend posted before a collective
// must not be taken for the collective's data.
static inline int cpu_context(uint32_t tag) { return tag == CPU_TAG_P2P ? 0 : 1; }

typedef struct {
    uint32_t magic;
    uint32_t tag;
    uint64_t bytes;   // payload size; the payload follows, padded to a multiple of 8, unless
    uint64_t remote;  // ... this is not 0: the payload's address in the sender (single copy)
} cpu_header_t;

// Padding every payload to 8 bytes keeps every header and payload at a
// multiple of 8 in the stream. Elements read straight out of a ring are then
// aligned, and a ring (a power of two in size) never wraps inside an element.
static inline size_t cpu_padded(size_t bytes) { return (bytes + 7) & ~(size_t)7; }

typedef struct cpu_req_t {
    struct cpu_req_t *next;      // in the peer's send queue or posted-receive queue
    int peer;
    uint32_t tag;
    bool is_send, done;
    bool detached;             // nobody waits for it (a done-reading note): freed once written
    size_t bytes;
    const char *src;           // send: the payload
    char *dst;                 // receive: where the payload goes
    const char *mine;          // reduce on receive: dst = incoming OP mine; NULL: copy
    dtype_t dtype;
    redop_t op;
    cpu_header_t header;         // send: kept here while it is written out
} cpu_req_t;

typedef struct cpu_msg_t {       // a message that arrived before its receive was posted
    struct cpu_msg_t *next;
    uint32_t tag;
    size_t bytes, cap;
    char *data;
    uint64_t remote;             // single copy, not read yet: the payload is still in the sender
} cpu_msg_t;

typedef struct { cpu_req_t *head, *tail; } cpu_req_queue_t;
typedef struct { cpu_msg_t *head, *tail; } cpu_msg_queue_t;

static inline void cpu_req_push(cpu_req_queue_t *q, cpu_req_t *r) {
    r->next = NULL;
    if (q->tail) q->tail->next = r;
    else q->head = r;
    q->tail = r;
}

static inline cpu_req_t *cpu_req_pop(cpu_req_queue_t *q) {
    cpu_req_t *r = q->head;
    if (r && !(q->head = r->next)) q->tail = NULL;
    return r;
}

static inline void cpu_msg_push(cpu_msg_queue_t *q, cpu_msg_t *m) {
    m->next = NULL;
    if (q->tail) q->tail->next = m;
    else q->head = m;
    q->tail = m;
}

static inline cpu_msg_t *cpu_msg_pop(cpu_msg_queue_t *q) {
    cpu_msg_t *m = q->head;
    if (m && !(q->head = m->next)) q->tail = NULL;
    return m;
}

static inline void cpu_msg_free(cpu_msg_t *m) {
    if (m) free(m->data);
    free(m);
}

// ---------------------------------------------------------------- shared memory
//
// One segment per host holds, for every ordered pair of local ranks (a, b),
// a ring buffer that only a writes and only b reads: a single-producer,
// single-consumer queue needs no lock, just two counters. `head` counts the
// bytes ever written, `tail` the bytes ever read; head - tail are waiting.
// The writer publishes bytes by storing head with release order after
// copying them; the reader loads head with acquire order before reading
// them, so it never sees a count ahead of the bytes. The counters sit on
// separate cache lines so that the two processes do not fight over one.
//
// Each rank also has a doorbell: when it has waited for a while it sleeps on
// a futex (a kernel wait queue keyed by an address, which works across
// processes on shared memory), and a peer that writes to it or frees room
// for it rings the bell. Ranks do not spin for long: with more ranks than
// cores a spinning rank would steal the core of the rank it waits for.

typedef struct {
    _Alignas(64) _Atomic uint64_t head;   // bytes ever written; only the writer stores it
    _Alignas(64) _Atomic uint64_t tail;   // bytes ever read; only the reader stores it
} cpu_shm_ring_ctl_t;

typedef struct {
    _Alignas(64) _Atomic uint32_t seq;    // the futex word: bumped to wake the owner
    _Atomic uint32_t sleeping;            // the owner is asleep, or about to be
    _Atomic int32_t core;                 // where the owner last waited (sched_getcpu)
} cpu_shm_bell_t;

typedef struct {
    uint64_t magic, nonce, members, ring_bytes;
} cpu_shm_header_t;

typedef struct {
    cpu_shm_ring_ctl_t *ctl;
    char *data;
    size_t cap;                           // a power of two
    uint64_t tail_seen;                   // writer: `tail` when last loaded (see cpu_ring_write)
} cpu_shm_ring_t;

// Copies as much of iov as fits; returns the bytes written. The bytes are
// published one chunk at a time, so that the reader copies chunk k out
// while we copy chunk k+1 in: two cores work at once, and a chunk is still
// in the cache when the reader takes it. Publishing only at the end made
// a 4 MiB message cost two full copies one after the other (measured:
// half MPI's speed at 2-8 MiB).
//
// The writer loads the reader's `tail` only when the tail it saw last leaves
// too little room. Each load of a counter that the other core has just
// stored moves a cache line between the cores - the largest part of a
// small message's cost - and a stale tail only makes the room look smaller.
static inline size_t cpu_ring_write(cpu_shm_ring_t *r, const struct iovec *iov, int count) {
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_relaxed);
    size_t wanted = 0, written = 0;
    for (int i = 0; i < count; i++) wanted += iov[i].iov_len;
    if (r->cap - (size_t)(head - r->tail_seen) < wanted)
        r->tail_seen = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    size_t room = r->cap - (size_t)(head - r->tail_seen);
    for (int i = 0; i < count && room > 0; i++) {
        const char *src = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left > 0 && room > 0) {
            size_t n = left < room ? left : room;
            if (n > CPU_CHUNK_BYTES) n = CPU_CHUNK_BYTES;
            size_t at = (size_t)head & (r->cap - 1);
            size_t first = n < r->cap - at ? n : r->cap - at;   // up to the end of the ring
            memcpy(r->data + at, src, first);
            if (n > first) memcpy(r->data, src + first, n - first);
            head += n;
            atomic_store_explicit(&r->ctl->head, head, memory_order_release);
            src += n;
            left -= n;
            room -= n;
            written += n;
        }
    }
    return written;
}

// The readable bytes up to the end of the ring, at most a chunk (NULL when
// there are none). Consuming them chunk by chunk frees room for the writer
// early: the other half of the pipeline.
static inline const char *cpu_ring_peek(cpu_shm_ring_t *r, size_t *len) {
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    size_t at = (size_t)tail & (r->cap - 1), ready = (size_t)(head - tail);
    *len = ready < r->cap - at ? ready : r->cap - at;
    if (*len > CPU_CHUNK_BYTES) *len = CPU_CHUNK_BYTES;
    return *len ? r->data + at : NULL;
}

static inline void cpu_ring_consume(cpu_shm_ring_t *r, size_t n) {
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    atomic_store_explicit(&r->ctl->tail, tail + n, memory_order_release);
}

// Wake the bell's owner if it sleeps. The fence orders our ring update
// before we read `sleeping`; the sleeper orders its `sleeping = 1` before
// it looks at the rings once more. So either it sees our bytes, or we see
// it asleep and wake it: a wake-up is never lost.
static inline void cpu_bell_ring(cpu_shm_bell_t *bell) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&bell->sleeping, memory_order_relaxed)) {
        atomic_fetch_add(&bell->seq, 1);
        syscall(SYS_futex, (uint32_t *)&bell->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// ---------------------------------------------------------------- peers and the group

typedef struct {
    int rank;
    int fd;                       // TCP connection (with shared memory: a sign of life)
    bool closed;                  // the connection ended: the peer exited or crashed
    char closed_why[64];          // "closed the connection", "reset the connection", ...
    bool shm;                     // data travels through the rings below
    cpu_shm_ring_t tx, rx;
    cpu_shm_bell_t *bell;               // the peer's doorbell
    pid_t pid;                    // the peer's process, for single-copy reads
    bool single_copy;             // we may ask the peer to read large payloads from our memory
    cpu_req_queue_t reading;        // our single-copy sends the peer has not finished reading
    char *bounce;                 // TCP: bytes received, not yet used, at [start, end)
    size_t bounce_start, bounce_end;
    uint64_t rx_pos;              // bytes of the incoming stream used so far
    cpu_req_queue_t sends;          // in order; the head is being written
    size_t tx_done;               // bytes of the head's frame already written
    unsigned char hdr[sizeof(cpu_header_t)];
    size_t hdr_got;               // bytes of the next header received so far
    bool in_message;              // a header has arrived and its payload is arriving
    cpu_header_t in;                // ... this header
    size_t in_got;                // ... payload bytes (padding included) so far
    cpu_req_t *in_req;              // ... going into this posted receive, or
    cpu_msg_t *in_msg;              // ... into this buffer, as nobody asked for it yet
    cpu_req_queue_t posted[2];      // receives waiting for a message, by context
    cpu_msg_queue_t unexpected[2];  // messages waiting for a receive, by context
} cpu_peer_t;

typedef struct {
    int rank, world;
    double timeout_s;
    uint32_t tag;                 // the operation in progress (for headers and messages)
    cpu_peer_t *peers;              // by rank; peers[rank] is unused
    int *tcp_ranks, tcp_count;    // peers reached over TCP
    int *shm_ranks, shm_count;    // peers reached over shared memory
    struct pollfd *tcp_poll, *shm_poll;
    void *shm_base;
    size_t shm_bytes;
    cpu_shm_bell_t *bell;               // this rank's doorbell
    bool spin;                    // busy-wait a little before sleeping (enough cores)
    double last_probe;            // last check that the shared-memory peers live
    char transport[200];          // for pg_describe
} cpu_pg_t;

static inline const char *cpu_transport(const cpu_pg_t *pg) { return pg->transport; }

static inline void cpu_peer_closed(cpu_peer_t *p, const char *why) {
    if (p->closed) return;
    p->closed = true;
    snprintf(p->closed_why, sizeof p->closed_why, "%s", why);
}

static inline void cpu_peer_error(cpu_peer_t *p, int err) {
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return;
    if (err == ECONNRESET || err == EPIPE) cpu_peer_closed(p, "closed the connection");
    else cpu_peer_closed(p, strerror(err));
}

// Does this rank expect anything more from, or owe anything to, the peer?
static inline bool cpu_peer_busy(const cpu_peer_t *p) {
    return p->sends.head || p->posted[0].head || p->posted[1].head || p->reading.head ||
           (p->in_message && (p->in_req || p->in_msg));   // a parked message is complete
}

// A peer that is gone matters only if we still need it: a rank that
// finished its part and exited is fine.
static inline void cpu_check_peers(const cpu_pg_t *pg) {
    for (int r = 0; r < pg->world; r++) {
        const cpu_peer_t *p = &pg->peers[r];
        if (r != pg->rank && p->closed && cpu_peer_busy(p))
            die("rank %d %s during %s (did it crash? see its output)", r, p->closed_why,
                cpu_tag_name(pg->tag));
    }
}

// ---------------------------------------------------------------- the byte streams

// Writes as much of iov as the transport takes now; returns the bytes written.
static inline size_t cpu_write(cpu_peer_t *p, const struct iovec *iov, int count) {
    if (p->closed) return 0;
    if (p->shm) {
        size_t n = cpu_ring_write(&p->tx, iov, count);
        if (n) cpu_bell_ring(p->bell);
        return n;
    }
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)count};
    ssize_t n = sendmsg(p->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);   // no SIGPIPE: we report it
    if (n >= 0) return (size_t)n;
    cpu_peer_error(p, errno);
    return 0;
}

// TCP: the received bytes not used yet, reading more from the kernel when
// fewer than 8 are left. The leftover bytes move to the front of the buffer
// at their position modulo 8 in the stream, so that elements in the buffer
// stay aligned as they are in the stream.
static inline const char *cpu_tcp_peek(cpu_peer_t *p, size_t *len) {
    size_t have = p->bounce_end - p->bounce_start;
    if (have < 8 && !p->closed) {
        size_t at = (size_t)(p->rx_pos & 7);
        memmove(p->bounce + at, p->bounce + p->bounce_start, have);
        p->bounce_start = at;
        p->bounce_end = at + have;
        ssize_t n = recv(p->fd, p->bounce + p->bounce_end, CPU_BOUNCE_BYTES - p->bounce_end,
                         MSG_DONTWAIT);
        if (n > 0) p->bounce_end += (size_t)n;
        else if (n == 0) cpu_peer_closed(p, "closed the connection");
        else cpu_peer_error(p, errno);
        have = p->bounce_end - p->bounce_start;
    }
    *len = have;
    return have ? p->bounce + p->bounce_start : NULL;
}

// Bytes that have arrived from the peer and are not used yet (NULL: none).
static inline const char *cpu_peek(cpu_peer_t *p, size_t *len) {
    return p->shm ? cpu_ring_peek(&p->rx, len) : cpu_tcp_peek(p, len);
}

static inline void cpu_consume(cpu_peer_t *p, size_t n) {
    p->rx_pos += n;
    if (p->shm) {
        cpu_ring_consume(&p->rx, n);
        cpu_bell_ring(p->bell);   // the writer may be waiting for room
    } else {
        p->bounce_start += n;
    }
}

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
// traffic, which is what limits large transfers.

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

static inline bool cpu_recv_progress(const cpu_pg_t *pg, cpu_peer_t *p) {
    size_t taken = 0;
    while (taken < CPU_PASS_BYTES) {
        size_t len, n;
        if (cpu_parked(p)) break;   // the stream waits for a receive
        const char *src = cpu_peek(p, &len);
        if (!src) break;
        n = p->in_message ? cpu_take_payload(p, src, len) : cpu_take_header(pg, p, src, len);
        if (n == 0) break;
        cpu_consume(p, n);
        taken += n;
    }
    return taken > 0;
}

// ---------------------------------------------------------------- the progress engine

// One pass over the TCP peers: poll() says which sockets can move bytes.
// timeout_ms > 0 makes it the way to wait when there is nothing to do.
static inline bool cpu_tcp_pass(cpu_pg_t *pg, int timeout_ms) {
    for (int i = 0; i < pg->tcp_count; i++) {
        cpu_peer_t *p = &pg->peers[pg->tcp_ranks[i]];
        pg->tcp_poll[i] = (struct pollfd){p->closed ? -1 : p->fd,
                                          (short)(POLLIN | (p->sends.head ? POLLOUT : 0)), 0};
    }
    if (poll(pg->tcp_poll, (nfds_t)pg->tcp_count, timeout_ms) < 0 && errno != EINTR)
        die("poll() on the sockets of the process group failed: %s", strerror(errno));
    bool moved = false;
    for (int i = 0; i < pg->tcp_count; i++) {
        cpu_peer_t *p = &pg->peers[pg->tcp_ranks[i]];
        short ev = pg->tcp_poll[i].revents;
        // Bytes already in the bounce buffer count as readable too.
        if ((ev & (POLLIN | POLLHUP | POLLERR)) || p->bounce_end - p->bounce_start >= 8)
            moved |= cpu_recv_progress(pg, p);
        if (ev & (POLLOUT | POLLERR)) moved |= cpu_send_progress(p);
    }
    return moved;
}

// One pass over every peer; true when any byte moved.
static inline bool cpu_progress(cpu_pg_t *pg) {
    bool moved = false;
    for (int i = 0; i < pg->shm_count; i++) {
        cpu_peer_t *p = &pg->peers[pg->shm_ranks[i]];
        moved |= cpu_send_progress(p);
        moved |= cpu_recv_progress(pg, p);
    }
    if (pg->tcp_count) moved |= cpu_tcp_pass(pg, 0);
    return moved;
}

// Shared memory says nothing when a peer dies, but its socket does: the
// kernel closes it when the process ends, however it ends. We never send on
// these sockets, so anything readable means the end (0 bytes: closed).
static inline void cpu_probe_shm_peers(cpu_pg_t *pg) {
    pg->last_probe = now_seconds();
    for (int i = 0; i < pg->shm_count; i++) {
        cpu_peer_t *p = &pg->peers[pg->shm_ranks[i]];
        pg->shm_poll[i] = (struct pollfd){p->closed ? -1 : p->fd, POLLIN, 0};
    }
    if (poll(pg->shm_poll, (nfds_t)pg->shm_count, 0) <= 0) return;
    for (int i = 0; i < pg->shm_count; i++) {
        if (!pg->shm_poll[i].revents) continue;
        cpu_peer_t *p = &pg->peers[pg->shm_ranks[i]];
        char byte;
        ssize_t n = recv(p->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) cpu_peer_closed(p, "closed the connection");
        else if (n < 0) cpu_peer_error(p, errno);
    }
}

// Sleep on our doorbell until a peer rings it or `seconds` pass. After
// announcing the sleep we look at the rings once more (see cpu_bell_ring).
static inline void cpu_bell_sleep(cpu_pg_t *pg, double seconds) {
    cpu_shm_bell_t *bell = pg->bell;
    uint32_t seen = atomic_load(&bell->seq);
    atomic_store(&bell->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (!cpu_progress(pg)) {
        struct timespec ts = {0, (long)(seconds * 1e9)};
        syscall(SYS_futex, (uint32_t *)&bell->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    atomic_store(&bell->sleeping, 0);
}

static inline void cpu_timeout(const cpu_pg_t *pg, cpu_req_t **reqs, int count) {
    for (int i = 0; i < count; i++) {
        const cpu_req_t *r = reqs[i];
        if (r->done) continue;
        die("timed out after %g s in %s: nothing moved while this rank waited to %s %zu bytes "
            "%s rank %d (is that rank stuck, dead, or in a different operation? "
            "COURSE_TIMEOUT sets the limit)", pg->timeout_s, cpu_tag_name(pg->tag),
            r->is_send ? "send" : "receive", r->bytes, r->is_send ? "to" : "from", r->peer);
    }
}

// Is another rank of this host waiting on our core? The scheduler sometimes
// puts two ranks on one core for a while, although another core is free;
// then spinning only delays the rank we wait for, and yielding lets it run.
static inline bool cpu_core_shared(const cpu_pg_t *pg) {
    int core = sched_getcpu();   // cheap: the kernel keeps it in user memory
    // Stored only when it changed: a store would take the cache line from
    // the peers that read our doorbell on every message.
    if (atomic_load_explicit(&pg->bell->core, memory_order_relaxed) != core)
        atomic_store_explicit(&pg->bell->core, core, memory_order_relaxed);
    for (int i = 0; i < pg->shm_count; i++)
        if (atomic_load_explicit(&pg->peers[pg->shm_ranks[i]].bell->core, memory_order_relaxed) ==
            core)
            return true;
    return false;
}

// Nothing moved in the last pass. Stop if we wait for a dead peer or have
// waited too long; otherwise wait a little, as cheaply as the transports allow.
static inline void cpu_idle(cpu_pg_t *pg, cpu_req_t **reqs, int count, double idle_since) {
    cpu_check_peers(pg);
    double idle = now_seconds() - idle_since;
    if (idle > pg->timeout_s) cpu_timeout(pg, reqs, count);
    if (idle > CPU_UNASKED_SECONDS && cpu_take_unasked(pg)) return;
    if (pg->shm_count && idle < CPU_YIELD_SECONDS) {
        if (pg->spin && idle < CPU_SPIN_SECONDS && !cpu_core_shared(pg))
            cpu_relax();    // the peer runs on another core: its bytes come in microseconds
        else
            sched_yield();  // the peer may need our core
        return;
    }
    if (pg->shm_count) cpu_probe_shm_peers(pg);
    if (pg->tcp_count) cpu_tcp_pass(pg, pg->shm_count ? 1 : 100);
    else cpu_bell_sleep(pg, 0.002);
}

static inline bool cpu_all_done(cpu_req_t **reqs, int count) {
    for (int i = 0; i < count; i++)
        if (!reqs[i]->done) return false;
    return true;
}

// Moves bytes until every request is done, then frees them. The timeout
// counts from the last moment anything moved, so a long transfer that
// progresses never times out, and a stuck one does.
static inline void cpu_wait(cpu_pg_t *pg, cpu_req_t **reqs, int count) {
    double idle_since = -1;
    while (!cpu_all_done(reqs, count)) {
        if (cpu_progress(pg)) {
            idle_since = -1;
            continue;
        }
        if (idle_since < 0) idle_since = now_seconds();
        cpu_idle(pg, reqs, count, idle_since);
    }
    for (int i = 0; i < count; i++) free(reqs[i]);
}

// ---------------------------------------------------------------- posting work

static inline cpu_req_t *cpu_new_req(const cpu_pg_t *pg, int peer, size_t bytes) {
    cpu_req_t *r = xcalloc(1, sizeof *r);
    r->peer = peer;
    r->tag = pg->tag;
    r->bytes = bytes;
    return r;
}

static inline cpu_req_t *cpu_post_send_as(cpu_pg_t *pg, int peer, const void *src, size_t bytes,
                                          bool may_single_copy) {
    cpu_req_t *r = cpu_new_req(pg, peer, bytes);
    r->is_send = true;
    r->src = src;
    cpu_peer_t *p = &pg->peers[peer];
    bool single = may_single_copy && p->single_copy && bytes >= CPU_SINGLE_COPY_MIN &&
                  bytes <= CPU_SINGLE_COPY_MAX;
    r->header = (cpu_header_t){CPU_MAGIC, pg->tag, bytes, single ? (uintptr_t)src : 0};
    cpu_req_push(&p->sends, r);
    if (p->sends.head == r) cpu_send_progress(p);   // an idle link: start at once
    return r;
}

static inline cpu_req_t *cpu_post_send(cpu_pg_t *pg, int peer, const void *src, size_t bytes) {
    return cpu_post_send_as(pg, peer, src, bytes, true);
}

// A send whose receiver adds it to its own values (cpu_post_recv_reduce).
// Such bytes always stream through the ring, large or not: the receiver
// combines each chunk as it arrives, straight from the ring, which was
// faster than reading the sender's memory piece by piece (single copy).
static inline cpu_req_t *cpu_post_send_to_reduce(cpu_pg_t *pg, int peer, const void *src,
                                                 size_t bytes) {
    return cpu_post_send_as(pg, peer, src, bytes, false);
}

// Match a new receive with what has arrived already, or queue it.
static inline void cpu_post(cpu_pg_t *pg, cpu_req_t *r) {
    cpu_peer_t *p = &pg->peers[r->peer];
    int context = cpu_context(r->tag);
    cpu_msg_t *m = cpu_msg_pop(&p->unexpected[context]);
    if (m) {   // it has arrived already
        cpu_check_match(pg, p, r, m->tag, m->bytes);
        if (m->remote) cpu_single_copy(pg, p, r, m->remote);
        else cpu_deliver(r, m->data, 0, m->bytes);
        cpu_msg_free(m);
        r->done = true;
    } else if (cpu_parked(p) && cpu_context(p->in.tag) == context) {
        // Its header is here, its payload waits in the stream: let it flow in.
        cpu_check_match(pg, p, r, p->in.tag, p->in.bytes);
        p->in_req = r;
        if (p->in.bytes == 0) cpu_end_message(p);
    } else if (p->in_msg && cpu_context(p->in.tag) == context) {
        // It is arriving right now into a spare buffer: take what came so
        // far and let the rest flow straight into our destination.
        cpu_check_match(pg, p, r, p->in.tag, p->in.bytes);
        cpu_deliver(r, p->in_msg->data, 0, p->in_got < p->in.bytes ? p->in_got : p->in.bytes);
        cpu_msg_free(p->in_msg);
        p->in_msg = NULL;
        p->in_req = r;
    } else {
        cpu_req_push(&p->posted[context], r);
    }
}

static inline cpu_req_t *cpu_post_recv(cpu_pg_t *pg, int peer, void *dst, size_t bytes) {
    cpu_req_t *r = cpu_new_req(pg, peer, bytes);
    r->dst = dst;
    cpu_post(pg, r);
    return r;
}

// Receive count elements and combine them with `mine` as they arrive:
// dst = incoming OP mine. Reducing straight out of the transport's buffer
// saves a pass over memory compared with receiving first and adding after.
static inline cpu_req_t *cpu_post_recv_reduce(cpu_pg_t *pg, int peer, void *dst, const void *mine,
                                              size_t count, dtype_t t, redop_t op) {
    cpu_req_t *r = cpu_new_req(pg, peer, count * dtype_size(t));
    r->dst = dst;
    r->mine = mine;
    r->dtype = t;
    r->op = op;
    cpu_post(pg, r);
    return r;
}

static inline void cpu_send_wait(cpu_pg_t *pg, int peer, const void *src, size_t bytes) {
    cpu_req_t *r = cpu_post_send(pg, peer, src, bytes);
    cpu_wait(pg, &r, 1);
}

static inline void cpu_recv_wait(cpu_pg_t *pg, int peer, void *dst, size_t bytes) {
    cpu_req_t *r = cpu_post_recv(pg, peer, dst, bytes);
    cpu_wait(pg, &r, 1);
}

// Send to and receive from the same peer at once.
static inline void cpu_exchange(cpu_pg_t *pg, int peer, const void *out, void *in, size_t bytes) {
    cpu_req_t *reqs[2] = {cpu_post_recv(pg, peer, in, bytes), cpu_post_send(pg, peer, out, bytes)};
    cpu_wait(pg, reqs, 2);
}

// ---------------------------------------------------------------- point-to-point (for pg.h)

static inline cpu_req_t *cpu_isend(cpu_pg_t *pg, const void *buf, size_t bytes, int peer) {
    pg->tag = CPU_TAG_P2P;
    return cpu_post_send(pg, peer, buf, bytes);
}

static inline cpu_req_t *cpu_irecv(cpu_pg_t *pg, void *buf, size_t bytes, int peer) {
    pg->tag = CPU_TAG_P2P;
    return cpu_post_recv(pg, peer, buf, bytes);
}

// One pass of the engine, never a wait. A caller that polls pg_test in a
// loop still learns of a dead peer (the shared-memory probe runs at most
// every 10 ms, as it costs a system call).
static inline bool cpu_test(cpu_pg_t *pg, cpu_req_t *r) {
    if (r->done) return true;
    pg->tag = CPU_TAG_P2P;
    if (!cpu_progress(pg) && !cpu_take_unasked(pg)) {
        cpu_check_peers(pg);
        if (pg->shm_count && now_seconds() - pg->last_probe > 0.01) cpu_probe_shm_peers(pg);
    }
    return r->done;
}

static inline void cpu_wait_request(cpu_pg_t *pg, cpu_req_t *r) {
    pg->tag = CPU_TAG_P2P;
    cpu_wait(pg, &r, 1);
}

#endif
