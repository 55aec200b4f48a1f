// pg_cpu.h - the cpu backend of pg.h: collectives between processes, on
// host memory, over TCP sockets and (between ranks of one host) shared memory.
//
// Included by pg.h, which dispatches to it; it needs only pg_types.h. It
// is built in four layers, each using only the one below it:
//
//   1. Transports. To every other rank we hold a byte stream in each
//      direction: a TCP connection, or, when the peer runs on the same host,
//      a pair of ring buffers in shared memory (one copy in, one copy out,
//      no system call). The TCP connection exists in both cases: it is how
//      the ranks meet, and the kernel closes it when a process dies, however
//      it dies - our only reliable sign that a peer is gone.
//   2. Messages. Every send becomes a frame: a 16-byte header (a magic
//      number, which operation sent it, the payload size) and the payload,
//      padded to 8 bytes. The receiver checks that both sides are in the same
//      operation with the same size, instead of silently mixing up bytes.
//   3. The progress engine. isend/irecv only queue work. Bytes move when the
//      caller is inside a pg_ call (test, wait, or a blocking collective): one
//      loop that writes what it can to every peer and reads whatever has
//      arrived from every peer. Data that arrives before its receive was
//      posted is kept aside ("unexpected messages"), so two ranks that both
//      send first and receive second never deadlock, however large the
//      messages and however small the kernel's buffers.
//      We chose this over a progress thread: no locks, every byte moves in
//      one visible loop. The price is that an isend does not advance while
//      the caller computes (as in MPI without an asynchronous progress
//      thread); pg_isend does push the message out at once when the link is
//      idle, so small messages usually leave immediately.
//   4. Algorithms: the collectives, written with isend/irecv/wait. Large
//      all-reduces use a ring (reduce-scatter then all-gather), small ones
//      recursive doubling; each is explained where it is defined.
//
// Waiting never lasts forever: when nothing has moved for the group's
// timeout, or a peer we wait for has closed its connection, the process
// stops with a message that names the operation and the peer.
#ifndef COURSE_PG_CPU_H
#define COURSE_PG_CPU_H

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
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "netif.h"
#include "timer.h"

enum {
    CPU_SMALL_BYTES = 64 << 10,      // up to this size: algorithms with fewer steps
    CPU_SEGMENT_BYTES = 512 << 10,   // pipeline unit of the large broadcast
    CPU_BOUNCE_BYTES = 256 << 10,    // TCP: most bytes taken from the kernel per recv()
    CPU_PASS_BYTES = 4 << 20,        // most bytes read from one peer per pass (fairness)
    CPU_RING_MAX = 4 << 20,          // shared-memory ring per ordered pair of ranks
    CPU_RING_MIN = 64 << 10,
    CPU_SHM_BUDGET = 48 << 20,       // all rings of a host (Docker's /dev/shm is 64 MiB)
};
// Busy-wait this long before sleeping. A longer spin cuts small-message
// latency when other programs compete for the cores, but during big
// transfers it steals time from a peer that shares our core; 50 us was the
// best compromise measured on 2 cores.
#define CPU_SPIN_SECONDS 50e-6
#define CPU_MAGIC 0x314d4750u        // "PGM1", first bytes of every message header
#define CPU_SHM_MAGIC 0x314d485347504ull

// ---------------------------------------------------------------- messages

// Which operation a message belongs to; it travels in the header.
enum {
    CPU_TAG_P2P = 1, CPU_TAG_SETUP, CPU_TAG_BROADCAST, CPU_TAG_REDUCE, CPU_TAG_ALL_REDUCE,
    CPU_TAG_GATHER, CPU_TAG_ALL_GATHER, CPU_TAG_SCATTER, CPU_TAG_REDUCE_SCATTER,
    CPU_TAG_ALL_TO_ALL, CPU_TAG_BARRIER, CPU_TAG_DESTROY, CPU_TAG_COUNT
};

static inline const char *cpu_tag_name(uint32_t tag) {
    static const char *names[] = {"?", "send/recv", "setup", "broadcast", "reduce",
                                  "all_reduce", "gather", "all_gather", "scatter",
                                  "reduce_scatter", "all_to_all", "barrier", "pg_destroy"};
    return tag < CPU_TAG_COUNT ? names[tag] : "?";
}

// Point-to-point messages and collective messages are matched separately
// (two "contexts", as MPI calls them): an isend posted before a collective
// must not be taken for the collective's data.
static inline int cpu_context(uint32_t tag) { return tag == CPU_TAG_P2P ? 0 : 1; }

typedef struct {
    uint32_t magic;
    uint32_t tag;
    uint64_t bytes;   // payload size; the payload follows, padded to a multiple of 8
} cpu_header;

// Padding every payload to 8 bytes keeps every header and payload at a
// multiple of 8 in the stream. Elements read straight out of a ring are then
// aligned, and a ring (a power of two in size) never wraps inside an element.
static inline size_t cpu_padded(size_t bytes) { return (bytes + 7) & ~(size_t)7; }

typedef struct cpu_req {
    struct cpu_req *next;      // in the peer's send queue or posted-receive queue
    int peer;
    uint32_t tag;
    bool is_send, done;
    size_t bytes;
    const char *src;           // send: the payload
    char *dst;                 // receive: where the payload goes
    const char *mine;          // reduce on receive: dst = incoming OP mine; NULL: copy
    dtype_t dtype;
    redop_t op;
    cpu_header header;         // send: kept here while it is written out
} cpu_req;

typedef struct cpu_msg {       // a message that arrived before its receive was posted
    struct cpu_msg *next;
    uint32_t tag;
    size_t bytes, cap;
    char *data;
} cpu_msg;

typedef struct { cpu_req *head, *tail; } cpu_req_queue;
typedef struct { cpu_msg *head, *tail; } cpu_msg_queue;

static inline void req_push(cpu_req_queue *q, cpu_req *r) {
    r->next = NULL;
    if (q->tail) q->tail->next = r;
    else q->head = r;
    q->tail = r;
}

static inline cpu_req *req_pop(cpu_req_queue *q) {
    cpu_req *r = q->head;
    if (r && !(q->head = r->next)) q->tail = NULL;
    return r;
}

static inline void msg_push(cpu_msg_queue *q, cpu_msg *m) {
    m->next = NULL;
    if (q->tail) q->tail->next = m;
    else q->head = m;
    q->tail = m;
}

static inline cpu_msg *msg_pop(cpu_msg_queue *q) {
    cpu_msg *m = q->head;
    if (m && !(q->head = m->next)) q->tail = NULL;
    return m;
}

static inline void msg_free(cpu_msg *m) {
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
} shm_ring_ctl;

typedef struct {
    _Alignas(64) _Atomic uint32_t seq;    // the futex word: bumped to wake the owner
    _Atomic uint32_t sleeping;            // the owner is asleep, or about to be
} shm_bell;

typedef struct {
    uint64_t magic, nonce, members, ring_bytes;
} shm_header;

typedef struct {
    shm_ring_ctl *ctl;
    char *data;
    size_t cap;                           // a power of two
} shm_ring;

// Copies as much of iov as fits; returns the bytes written.
static inline size_t ring_write(shm_ring *r, const struct iovec *iov, int count) {
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    size_t room = r->cap - (size_t)(head - tail), written = 0;
    for (int i = 0; i < count && room > 0; i++) {
        size_t n = iov[i].iov_len < room ? iov[i].iov_len : room;
        size_t at = (size_t)(head + written) & (r->cap - 1);
        size_t first = n < r->cap - at ? n : r->cap - at;   // up to the end of the ring
        memcpy(r->data + at, iov[i].iov_base, first);
        if (n > first) memcpy(r->data, (const char *)iov[i].iov_base + first, n - first);
        written += n;
        room -= n;
    }
    atomic_store_explicit(&r->ctl->head, head + written, memory_order_release);
    return written;
}

// The readable bytes up to the end of the ring (NULL when there are none).
static inline const char *ring_peek(shm_ring *r, size_t *len) {
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
    size_t at = (size_t)tail & (r->cap - 1), ready = (size_t)(head - tail);
    *len = ready < r->cap - at ? ready : r->cap - at;
    return *len ? r->data + at : NULL;
}

static inline void ring_consume(shm_ring *r, size_t n) {
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_relaxed);
    atomic_store_explicit(&r->ctl->tail, tail + n, memory_order_release);
}

// Wake the bell's owner if it sleeps. The fence orders our ring update
// before we read `sleeping`; the sleeper orders its `sleeping = 1` before
// it looks at the rings once more. So either it sees our bytes, or we see
// it asleep and wake it: a wake-up is never lost.
static inline void bell_ring(shm_bell *bell) {
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
    shm_ring tx, rx;
    shm_bell *bell;               // the peer's doorbell
    char *bounce;                 // TCP: bytes received, not yet used, at [start, end)
    size_t bounce_start, bounce_end;
    uint64_t rx_pos;              // bytes of the incoming stream used so far
    cpu_req_queue sends;          // in order; the head is being written
    size_t tx_done;               // bytes of the head's frame already written
    unsigned char hdr[sizeof(cpu_header)];
    size_t hdr_got;               // bytes of the next header received so far
    bool in_message;              // a header has arrived and its payload is arriving
    cpu_header in;                // ... this header
    size_t in_got;                // ... payload bytes (padding included) so far
    cpu_req *in_req;              // ... going into this posted receive, or
    cpu_msg *in_msg;              // ... into this buffer, as nobody asked for it yet
    cpu_req_queue posted[2];      // receives waiting for a message, by context
    cpu_msg_queue unexpected[2];  // messages waiting for a receive, by context
} cpu_peer;

typedef struct {
    int rank, world;
    double timeout_s;
    uint32_t tag;                 // the operation in progress (for headers and messages)
    cpu_peer *peers;              // by rank; peers[rank] is unused
    int *tcp_ranks, tcp_count;    // peers reached over TCP
    int *shm_ranks, shm_count;    // peers reached over shared memory
    struct pollfd *tcp_poll, *shm_poll;
    void *shm_base;
    size_t shm_bytes;
    shm_bell *bell;               // this rank's doorbell
    bool spin;                    // busy-wait a little before sleeping (enough cores)
    double last_probe;            // last check that the shared-memory peers live
    char transport[200];          // for pg_describe
} cpu_pg;

static inline const char *cpu_transport(const cpu_pg *pg) { return pg->transport; }

static inline void cpu_peer_closed(cpu_peer *p, const char *why) {
    if (p->closed) return;
    p->closed = true;
    snprintf(p->closed_why, sizeof p->closed_why, "%s", why);
}

static inline void cpu_peer_error(cpu_peer *p, int err) {
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return;
    if (err == ECONNRESET || err == EPIPE) cpu_peer_closed(p, "closed the connection");
    else cpu_peer_closed(p, strerror(err));
}

// Does this rank expect anything more from, or owe anything to, the peer?
static inline bool cpu_peer_busy(const cpu_peer *p) {
    return p->sends.head || p->posted[0].head || p->posted[1].head || p->in_message;
}

// A peer that is gone matters only if we still need it: a rank that
// finished its part and exited is fine.
static inline void cpu_check_peers(const cpu_pg *pg) {
    for (int r = 0; r < pg->world; r++) {
        const cpu_peer *p = &pg->peers[r];
        if (r != pg->rank && p->closed && cpu_peer_busy(p))
            die("rank %d %s during %s (did it crash? see its output)", r, p->closed_why,
                cpu_tag_name(pg->tag));
    }
}

// ---------------------------------------------------------------- the byte streams

// Writes as much of iov as the transport takes now; returns the bytes written.
static inline size_t cpu_write(cpu_peer *p, const struct iovec *iov, int count) {
    if (p->closed) return 0;
    if (p->shm) {
        size_t n = ring_write(&p->tx, iov, count);
        if (n) bell_ring(p->bell);
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
static inline const char *cpu_tcp_peek(cpu_peer *p, size_t *len) {
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
static inline const char *cpu_peek(cpu_peer *p, size_t *len) {
    return p->shm ? ring_peek(&p->rx, len) : cpu_tcp_peek(p, len);
}

static inline void cpu_consume(cpu_peer *p, size_t n) {
    p->rx_pos += n;
    if (p->shm) {
        ring_consume(&p->rx, n);
        bell_ring(p->bell);   // the writer may be waiting for room
    } else {
        p->bounce_start += n;
    }
}

// ---------------------------------------------------------------- sending

// The parts of r's frame (header, payload, padding) not yet written.
static inline int cpu_frame_parts(const cpu_req *r, size_t done, struct iovec iov[3]) {
    static const char zeros[8];
    const char *base[3] = {(const char *)&r->header, r->src, zeros};
    size_t len[3] = {sizeof r->header, r->bytes, cpu_padded(r->bytes) - r->bytes};
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

static inline bool cpu_send_progress(cpu_peer *p) {
    bool moved = false;
    cpu_req *r;
    while ((r = p->sends.head) != NULL) {
        struct iovec iov[3];
        int parts = cpu_frame_parts(r, p->tx_done, iov);
        size_t n = cpu_write(p, iov, parts);
        if (n == 0) break;
        moved = true;
        p->tx_done += n;
        if (p->tx_done < sizeof r->header + cpu_padded(r->bytes)) continue;
        req_pop(&p->sends);
        p->tx_done = 0;
        r->done = true;   // the bytes are in the ring or the kernel: the buffer is free
    }
    return moved;
}

// ---------------------------------------------------------------- receiving

static inline void cpu_check_match(const cpu_pg *pg, const cpu_peer *p, const cpu_req *r,
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
static inline void cpu_deliver(cpu_req *r, const char *src, size_t at, size_t n) {
    if (n == 0) return;
    if (r->mine)
        pg_combine(r->dst + at, src, r->mine + at, n / dtype_size(r->dtype), r->dtype, r->op);
    else
        memcpy(r->dst + at, src, n);
}

// An unexpected message grows as it arrives (it may never be large).
static inline void cpu_msg_append(cpu_msg *m, const char *src, size_t at, size_t n) {
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

static inline void cpu_end_message(cpu_peer *p) {
    if (p->in_req) p->in_req->done = true;
    else msg_push(&p->unexpected[cpu_context(p->in.tag)], p->in_msg);
    p->in_message = false;
    p->in_req = NULL;
    p->in_msg = NULL;
}

// A header is complete: find the receive it answers, or keep it for later.
static inline void cpu_begin_message(const cpu_pg *pg, cpu_peer *p) {
    memcpy(&p->in, p->hdr, sizeof p->in);
    if (p->in.magic != CPU_MAGIC || p->in.tag == 0 || p->in.tag >= CPU_TAG_COUNT)
        die("rank %d sent bytes that are not a message during %s: the two ranks are out of "
            "step (a bug in pg_cpu.h, or a foreign program on this connection)", p->rank,
            cpu_tag_name(pg->tag));
    p->in_message = true;
    p->in_got = 0;
    p->in_req = req_pop(&p->posted[cpu_context(p->in.tag)]);
    p->in_msg = NULL;
    if (p->in_req) {
        cpu_check_match(pg, p, p->in_req, p->in.tag, p->in.bytes);
    } else {
        p->in_msg = xcalloc(1, sizeof *p->in_msg);
        p->in_msg->tag = p->in.tag;
        p->in_msg->bytes = p->in.bytes;
    }
    if (p->in.bytes == 0) cpu_end_message(p);
}

// The stream is used in multiples of 8 bytes (see cpu_padded); each take
// returns how many bytes it used, 0 when it needs more.
static inline size_t cpu_take_header(const cpu_pg *pg, cpu_peer *p, const char *src,
                                     size_t len) {
    size_t n = sizeof(cpu_header) - p->hdr_got;
    if (len < n) n = len & ~(size_t)7;
    memcpy(p->hdr + p->hdr_got, src, n);
    p->hdr_got += n;
    if (p->hdr_got == sizeof(cpu_header)) {
        p->hdr_got = 0;
        cpu_begin_message(pg, p);
    }
    return n;
}

static inline size_t cpu_take_payload(cpu_peer *p, const char *src, size_t len) {
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

static inline bool cpu_recv_progress(const cpu_pg *pg, cpu_peer *p) {
    size_t taken = 0;
    while (taken < CPU_PASS_BYTES) {
        size_t len, n;
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
static inline bool cpu_tcp_pass(cpu_pg *pg, int timeout_ms) {
    for (int i = 0; i < pg->tcp_count; i++) {
        cpu_peer *p = &pg->peers[pg->tcp_ranks[i]];
        pg->tcp_poll[i] = (struct pollfd){p->closed ? -1 : p->fd,
                                          (short)(POLLIN | (p->sends.head ? POLLOUT : 0)), 0};
    }
    if (poll(pg->tcp_poll, (nfds_t)pg->tcp_count, timeout_ms) < 0 && errno != EINTR)
        die("poll() on the sockets of the process group failed: %s", strerror(errno));
    bool moved = false;
    for (int i = 0; i < pg->tcp_count; i++) {
        cpu_peer *p = &pg->peers[pg->tcp_ranks[i]];
        short ev = pg->tcp_poll[i].revents;
        // Bytes already in the bounce buffer count as readable too.
        if ((ev & (POLLIN | POLLHUP | POLLERR)) || p->bounce_end - p->bounce_start >= 8)
            moved |= cpu_recv_progress(pg, p);
        if (ev & (POLLOUT | POLLERR)) moved |= cpu_send_progress(p);
    }
    return moved;
}

// One pass over every peer; true when any byte moved.
static inline bool cpu_progress(cpu_pg *pg) {
    bool moved = false;
    for (int i = 0; i < pg->shm_count; i++) {
        cpu_peer *p = &pg->peers[pg->shm_ranks[i]];
        moved |= cpu_send_progress(p);
        moved |= cpu_recv_progress(pg, p);
    }
    if (pg->tcp_count) moved |= cpu_tcp_pass(pg, 0);
    return moved;
}

// Shared memory says nothing when a peer dies, but its socket does: the
// kernel closes it when the process ends, however it ends. We never send on
// these sockets, so anything readable means the end (0 bytes: closed).
static inline void cpu_probe_shm_peers(cpu_pg *pg) {
    pg->last_probe = now_seconds();
    for (int i = 0; i < pg->shm_count; i++) {
        cpu_peer *p = &pg->peers[pg->shm_ranks[i]];
        pg->shm_poll[i] = (struct pollfd){p->closed ? -1 : p->fd, POLLIN, 0};
    }
    if (poll(pg->shm_poll, (nfds_t)pg->shm_count, 0) <= 0) return;
    for (int i = 0; i < pg->shm_count; i++) {
        if (!pg->shm_poll[i].revents) continue;
        cpu_peer *p = &pg->peers[pg->shm_ranks[i]];
        char byte;
        ssize_t n = recv(p->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) cpu_peer_closed(p, "closed the connection");
        else if (n < 0) cpu_peer_error(p, errno);
    }
}

// Sleep on our doorbell until a peer rings it or `seconds` pass. After
// announcing the sleep we look at the rings once more (see bell_ring).
static inline void cpu_bell_sleep(cpu_pg *pg, double seconds) {
    shm_bell *bell = pg->bell;
    uint32_t seen = atomic_load(&bell->seq);
    atomic_store(&bell->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (!cpu_progress(pg)) {
        struct timespec ts = {0, (long)(seconds * 1e9)};
        syscall(SYS_futex, (uint32_t *)&bell->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    atomic_store(&bell->sleeping, 0);
}

static inline void cpu_timeout(const cpu_pg *pg, cpu_req **reqs, int count) {
    for (int i = 0; i < count; i++) {
        const cpu_req *r = reqs[i];
        if (r->done) continue;
        die("timed out after %g s in %s: nothing moved while this rank waited to %s %zu bytes "
            "%s rank %d (is that rank stuck, dead, or in a different operation? "
            "COURSE_TIMEOUT sets the limit)", pg->timeout_s, cpu_tag_name(pg->tag),
            r->is_send ? "send" : "receive", r->bytes, r->is_send ? "to" : "from", r->peer);
    }
}

// Nothing moved in the last pass. Stop if we wait for a dead peer or have
// waited too long; otherwise wait a little, as cheaply as the transports allow.
static inline void cpu_idle(cpu_pg *pg, cpu_req **reqs, int count, double idle_since) {
    cpu_check_peers(pg);
    double idle = now_seconds() - idle_since;
    if (idle > pg->timeout_s) cpu_timeout(pg, reqs, count);
    if (pg->shm_count && pg->spin && idle < CPU_SPIN_SECONDS) {
        cpu_relax();   // the peer is running on another core: its bytes come in microseconds
        return;
    }
    if (pg->shm_count) cpu_probe_shm_peers(pg);
    if (pg->tcp_count) cpu_tcp_pass(pg, pg->shm_count ? 1 : 100);
    else cpu_bell_sleep(pg, 0.002);
}

static inline bool cpu_all_done(cpu_req **reqs, int count) {
    for (int i = 0; i < count; i++)
        if (!reqs[i]->done) return false;
    return true;
}

// Moves bytes until every request is done, then frees them. The timeout
// counts from the last moment anything moved, so a long transfer that
// progresses never times out, and a stuck one does.
static inline void cpu_wait(cpu_pg *pg, cpu_req **reqs, int count) {
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

static inline cpu_req *cpu_new_req(const cpu_pg *pg, int peer, size_t bytes) {
    cpu_req *r = xcalloc(1, sizeof *r);
    r->peer = peer;
    r->tag = pg->tag;
    r->bytes = bytes;
    return r;
}

static inline cpu_req *cpu_post_send(cpu_pg *pg, int peer, const void *src, size_t bytes) {
    cpu_req *r = cpu_new_req(pg, peer, bytes);
    r->is_send = true;
    r->src = src;
    r->header = (cpu_header){CPU_MAGIC, pg->tag, bytes};
    cpu_peer *p = &pg->peers[peer];
    req_push(&p->sends, r);
    if (p->sends.head == r) cpu_send_progress(p);   // an idle link: start at once
    return r;
}

// Match a new receive with what has arrived already, or queue it.
static inline void cpu_post(cpu_pg *pg, cpu_req *r) {
    cpu_peer *p = &pg->peers[r->peer];
    int context = cpu_context(r->tag);
    cpu_msg *m = msg_pop(&p->unexpected[context]);
    if (m) {   // it has arrived already
        cpu_check_match(pg, p, r, m->tag, m->bytes);
        cpu_deliver(r, m->data, 0, m->bytes);
        msg_free(m);
        r->done = true;
    } else if (p->in_msg && cpu_context(p->in.tag) == context) {
        // It is arriving right now into a spare buffer: take what came so
        // far and let the rest flow straight into our destination.
        cpu_check_match(pg, p, r, p->in.tag, p->in.bytes);
        cpu_deliver(r, p->in_msg->data, 0, p->in_got < p->in.bytes ? p->in_got : p->in.bytes);
        msg_free(p->in_msg);
        p->in_msg = NULL;
        p->in_req = r;
    } else {
        req_push(&p->posted[context], r);
    }
}

static inline cpu_req *cpu_post_recv(cpu_pg *pg, int peer, void *dst, size_t bytes) {
    cpu_req *r = cpu_new_req(pg, peer, bytes);
    r->dst = dst;
    cpu_post(pg, r);
    return r;
}

// Receive count elements and combine them with `mine` as they arrive:
// dst = incoming OP mine. Reducing straight out of the transport's buffer
// saves a pass over memory compared with receiving first and adding after.
static inline cpu_req *cpu_post_recv_reduce(cpu_pg *pg, int peer, void *dst, const void *mine,
                                            size_t count, dtype_t t, redop_t op) {
    cpu_req *r = cpu_new_req(pg, peer, count * dtype_size(t));
    r->dst = dst;
    r->mine = mine;
    r->dtype = t;
    r->op = op;
    cpu_post(pg, r);
    return r;
}

static inline void cpu_send_wait(cpu_pg *pg, int peer, const void *src, size_t bytes) {
    cpu_req *r = cpu_post_send(pg, peer, src, bytes);
    cpu_wait(pg, &r, 1);
}

static inline void cpu_recv_wait(cpu_pg *pg, int peer, void *dst, size_t bytes) {
    cpu_req *r = cpu_post_recv(pg, peer, dst, bytes);
    cpu_wait(pg, &r, 1);
}

// Send to and receive from the same peer at once.
static inline void cpu_exchange(cpu_pg *pg, int peer, const void *out, void *in, size_t bytes) {
    cpu_req *reqs[2] = {cpu_post_recv(pg, peer, in, bytes), cpu_post_send(pg, peer, out, bytes)};
    cpu_wait(pg, reqs, 2);
}

// ---------------------------------------------------------------- point-to-point (for pg.h)

static inline cpu_req *cpu_isend(cpu_pg *pg, const void *buf, size_t bytes, int peer) {
    pg->tag = CPU_TAG_P2P;
    return cpu_post_send(pg, peer, buf, bytes);
}

static inline cpu_req *cpu_irecv(cpu_pg *pg, void *buf, size_t bytes, int peer) {
    pg->tag = CPU_TAG_P2P;
    return cpu_post_recv(pg, peer, buf, bytes);
}

// One pass of the engine, never a wait. A caller that polls pg_test in a
// loop still learns of a dead peer (the shared-memory probe runs at most
// every 10 ms, as it costs a system call).
static inline bool cpu_test(cpu_pg *pg, cpu_req *r) {
    if (r->done) return true;
    pg->tag = CPU_TAG_P2P;
    if (!cpu_progress(pg)) {
        cpu_check_peers(pg);
        if (pg->shm_count && now_seconds() - pg->last_probe > 0.01) cpu_probe_shm_peers(pg);
    }
    return r->done;
}

static inline void cpu_wait_request(cpu_pg *pg, cpu_req *r) {
    pg->tag = CPU_TAG_P2P;
    cpu_wait(pg, &r, 1);
}

// ---------------------------------------------------------------- setting up: TCP

typedef struct {
    char ip[64];        // where the rank listens
    int port;
    char host[200];     // which host (and /dev/shm) it runs on; see cpu_host_key
} cpu_address;

typedef struct {
    uint32_t magic;
    int32_t rank;
    uint64_t nonce;     // this group's random number: stray connections are refused
} cpu_hello;

// The address other ranks can reach this one at: the local end of our
// connection to the store, which every rank reaches. The rank that serves
// the store talks to it over loopback; it asks the route to the address the
// others use instead.
static inline void cpu_local_address(const store_t *st, char *ip, size_t size) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    snprintf(ip, size, "127.0.0.1");
    if (getsockname(st->fd, (struct sockaddr *)&a, &len) == 0)
        getnameinfo((struct sockaddr *)&a, len, ip, (socklen_t)size, NULL, 0, NI_NUMERICHOST);
    if (store_is_loopback(ip) && !store_is_loopback(st->host)) netif_route_source(st->host, ip, size);
}

// Ranks with the same key share a host and a /dev/shm: the boot id tells
// machines apart, the device number of /dev/shm tells containers apart.
static inline void cpu_host_key(char *key, size_t size) {
    char host[64] = "?", boot[40] = "?";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "?");
        boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    struct stat st;
    unsigned long dev = stat("/dev/shm", &st) == 0 ? (unsigned long)st.st_dev : 0;
    snprintf(key, size, "%s/%s/%lx", host, boot, dev);
}

// Listen on loopback for a job on loopback, else on every interface of the
// address's family (the published address is one of them).
static inline int cpu_listen(const char *ip, int backlog, int *port) {
    const char *bind_ip = store_is_loopback(ip) ? ip : strchr(ip, ':') ? "::" : "0.0.0.0";
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *list;
    int rc = getaddrinfo(bind_ip, "0", &hints, &list);
    if (rc) die("process group: cannot listen on '%s': %s", bind_ip, gai_strerror(rc));
    int fd = socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    CHECK_SYS(fd);
    CHECK_SYS(bind(fd, list->ai_addr, list->ai_addrlen));
    CHECK_SYS(listen(fd, backlog));
    freeaddrinfo(list);
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    CHECK_SYS(getsockname(fd, (struct sockaddr *)&a, &len));
    *port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                          : ((struct sockaddr_in *)&a)->sin_port);
    return fd;
}

// Every rank publishes where it listens ("ip port host") and reads everyone's.
static inline void cpu_share_addresses(cpu_pg *pg, store_t *st, int generation, int port,
                                       const char *ip, cpu_address *all) {
    enum { TEXT = 320 };
    char stem[64], mine[TEXT], host[200];
    cpu_host_key(host, sizeof host);
    snprintf(stem, sizeof stem, "pg%d/addr", generation);
    snprintf(mine, sizeof mine, "%s %d %s", ip, port, host);
    char *text = xmalloc((size_t)pg->world * TEXT);
    store_all_gather(st, stem, pg->rank, pg->world, mine, text, TEXT, pg->timeout_s);
    for (int r = 0; r < pg->world; r++) {
        const char *value = text + (size_t)r * TEXT;
        if (sscanf(value, "%63s %d %199s", all[r].ip, &all[r].port, all[r].host) != 3)
            die("process group: rank %d published a malformed address '%s'", r, value);
    }
    free(text);
    const cpu_address *me = &all[pg->rank];
    for (int r = 0; r < pg->world; r++)
        if (store_is_loopback(all[r].ip) && strcmp(all[r].host, me->host))
            die("rank %d can only be reached at %s, a loopback address, but runs on another "
                "host: give the job an address every host can reach (MASTER_ADDR, or the "
                "tcp:// address)", r, all[r].ip);
}

static inline uint64_t cpu_share_nonce(cpu_pg *pg, store_t *st, int generation) {
    char key[64];
    uint64_t nonce = store_random_u64();
    snprintf(key, sizeof key, "pg%d/nonce", generation);
    if (store_broadcast(st, key, pg->rank, &nonce, sizeof nonce, sizeof nonce, pg->timeout_s) !=
        sizeof nonce)
        die("process group: the store holds a malformed group id");
    return nonce;
}

// Buffer sizes are left to the kernel: its autotuning grows each socket's
// buffers up to net.ipv4.tcp_rmem / tcp_wmem (megabytes), whereas setting
// SO_RCVBUF turns autotuning off and caps the size at net.core.rmem_max,
// which is often smaller. (Measured here: no gain from fixed 4 MiB buffers.)
static inline void cpu_tune_socket(int fd) {
    int one = 1;
    // Nagle's algorithm would hold small messages back for more: a tiny
    // all-reduce would take tens of milliseconds.
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Higher ranks connect to lower ones: each pair gets exactly one connection.
static inline void cpu_connect_lower(cpu_pg *pg, const cpu_address *all, uint64_t nonce,
                                     double deadline) {
    for (int r = 0; r < pg->rank; r++) {
        char why[200] = "";
        int fd;
        while ((fd = store_dial(all[r].ip, all[r].port, deadline, why, sizeof why)) < 0) {
            if (now_seconds() >= deadline)
                die("could not connect to rank %d at %s:%d within %g s: %s", r, all[r].ip,
                    all[r].port, pg->timeout_s, why);
            store_sleep(0.01);
        }
        cpu_tune_socket(fd);
        cpu_hello hello = {CPU_MAGIC, pg->rank, nonce};
        if (store_io(fd, &hello, sizeof hello, deadline, true) != 0)
            die("could not greet rank %d at %s:%d: the connection failed", r, all[r].ip,
                all[r].port);
        pg->peers[r].fd = fd;
    }
}

// The rank a new connection says it is, or -1 for a stray connection.
static inline int cpu_read_hello(int fd, uint64_t nonce, double deadline) {
    cpu_hello hello;
    double until = now_seconds() + 5 < deadline ? now_seconds() + 5 : deadline;
    if (store_io(fd, &hello, sizeof hello, until, false) != 0) return -1;
    if (hello.magic != CPU_MAGIC || hello.nonce != nonce) return -1;
    return hello.rank;
}

static inline void cpu_accept_timeout(const cpu_pg *pg) {
    char missing[256] = "";
    size_t used = 0;
    for (int r = pg->rank + 1; r < pg->world && used < sizeof missing - 16; r++)
        if (pg->peers[r].fd < 0)
            used += (size_t)snprintf(missing + used, sizeof missing - used, " %d", r);
    die("timed out after %g s setting up the process group: rank(s)%s never connected to "
        "rank %d (did they crash or get stuck before pg_create?)", pg->timeout_s, missing,
        pg->rank);
}

static inline void cpu_accept_higher(cpu_pg *pg, int listen_fd, uint64_t nonce, double deadline) {
    int missing = pg->world - 1 - pg->rank;
    while (missing > 0) {
        struct pollfd p = {listen_fd, POLLIN, 0};
        int rc = poll(&p, 1, store_ms_left(deadline));
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) die("poll() on the listening socket failed: %s", strerror(errno));
        if (rc == 0) cpu_accept_timeout(pg);
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;   // the connection went away already
        int who = cpu_read_hello(fd, nonce, deadline);
        if (who <= pg->rank || who >= pg->world) {
            close(fd);   // not one of ours
            continue;
        }
        if (pg->peers[who].fd >= 0)
            die("two processes claim to be rank %d: check RANK and WORLD_SIZE", who);
        cpu_tune_socket(fd);
        pg->peers[who].fd = fd;
        missing--;
    }
}

// Every rank publishes where it listens, then connects to every other rank.
static inline void cpu_connect_all(cpu_pg *pg, store_t *st, int generation, cpu_address *all,
                                   uint64_t *nonce) {
    double deadline = now_seconds() + pg->timeout_s;
    char ip[64];
    int port;
    *nonce = cpu_share_nonce(pg, st, generation);
    // COURSE_SOCKET_IFNAME (or GLOO_/NCCL_SOCKET_IFNAME) picks the interface,
    // as NCCL_SOCKET_IFNAME does for NCCL; otherwise the one that reaches the store.
    const char *variable;
    const char *spec = netif_spec_from_env(&variable);
    if (spec) snprintf(ip, sizeof ip, "%s", netif_choose(spec, variable, st->host).ip);
    else cpu_local_address(st, ip, sizeof ip);
    int listen_fd = cpu_listen(ip, pg->world, &port);
    cpu_share_addresses(pg, st, generation, port, ip, all);
    cpu_connect_lower(pg, all, *nonce, deadline);
    cpu_accept_higher(pg, listen_fd, *nonce, deadline);
    close(listen_fd);
}

// ---------------------------------------------------------------- setting up: shared memory

typedef struct {
    size_t bells, rings, data, total;   // byte offsets in the segment, and its size
    size_t ring_bytes;
    int members;
} shm_layout;

static inline size_t cpu_page_round(size_t bytes) { return (bytes + 4095) & ~(size_t)4095; }

static inline shm_layout cpu_shm_layout(int members) {
    shm_layout l = {.members = members, .ring_bytes = CPU_RING_MAX};
    size_t pairs = (size_t)members * (size_t)(members - 1);
    while (l.ring_bytes > CPU_RING_MIN && l.ring_bytes * pairs > CPU_SHM_BUDGET) l.ring_bytes /= 2;
    l.bells = 4096;   // after the header
    l.rings = l.bells + cpu_page_round((size_t)members * sizeof(shm_bell));
    l.data = l.rings + cpu_page_round(pairs * sizeof(shm_ring_ctl));
    l.total = l.data + pairs * l.ring_bytes;
    return l;
}

// The ring that local rank a writes and local rank b reads.
static inline size_t cpu_ring_index(int a, int b, int members) {
    return (size_t)a * (size_t)(members - 1) + (size_t)(b < a ? b : b - 1);
}

// NULL (and why) when the segment cannot be made: the group then uses TCP.
static inline char *cpu_shm_create(const char *name, const shm_layout *l, uint64_t nonce,
                                   char *why, size_t size) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, size, "shm_open: %s", strerror(errno));
        return NULL;
    }
    // fallocate, not just ftruncate: on a full /dev/shm a lazily sized segment
    // would kill us later with SIGBUS; this fails now, cleanly.
    int err = ftruncate(fd, (off_t)l->total) < 0 ? errno : posix_fallocate(fd, 0, (off_t)l->total);
    char *base = err ? MAP_FAILED
                     : mmap(NULL, l->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && base == MAP_FAILED) err = errno;
    close(fd);
    if (err) {
        snprintf(why, size, "%zu MiB in /dev/shm: %s", l->total >> 20, strerror(err));
        shm_unlink(name);
        return NULL;
    }
    shm_header h = {CPU_SHM_MAGIC, nonce, (uint64_t)l->members, l->ring_bytes};
    memcpy(base, &h, sizeof h);   // fresh pages are zero: counters start at 0
    return base;
}

static inline char *cpu_shm_attach(const char *name, const shm_layout *l, uint64_t nonce,
                                   char *why, size_t size) {
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, size, "shm_open: %s (another /dev/shm?)", strerror(errno));
        return NULL;
    }
    char *base = mmap(NULL, l->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    shm_header h;
    if (base != MAP_FAILED) memcpy(&h, base, sizeof h);
    if (base == MAP_FAILED || h.magic != CPU_SHM_MAGIC || h.nonce != nonce) {
        snprintf(why, size, "the segment is not this group's");
        if (base != MAP_FAILED) munmap(base, l->total);
        return NULL;
    }
    return base;
}

// The lowest rank of a host creates the segment and tells the others its
// name; once all have mapped it (or failed), it unlinks the name, so nothing
// is left in /dev/shm however the job ends later. Shared memory is used only
// if every rank of the host could map it.
static inline char *cpu_shm_lead(cpu_pg *pg, const int *members, const shm_layout *l,
                                 uint64_t nonce, char *why, size_t size) {
    char name[64];
    snprintf(name, sizeof name, "/course-pg-%016llx-%d", (unsigned long long)nonce, pg->rank);
    char *base = cpu_shm_create(name, l, nonce, why, size);
    char text[64] = "";
    if (base) snprintf(text, sizeof text, "%s", name);
    for (int i = 1; i < l->members; i++) cpu_send_wait(pg, members[i], text, sizeof text);
    uint8_t all_ok = base != NULL, ok;
    for (int i = 1; i < l->members; i++) {
        cpu_recv_wait(pg, members[i], &ok, 1);
        all_ok &= ok;
    }
    if (base) shm_unlink(name);
    for (int i = 1; i < l->members; i++) cpu_send_wait(pg, members[i], &all_ok, 1);
    if (!all_ok && base) {
        munmap(base, l->total);
        snprintf(why, size, "another rank of this host could not map the segment");
        base = NULL;
    }
    return base;
}

static inline char *cpu_shm_join(cpu_pg *pg, int leader, const shm_layout *l, uint64_t nonce,
                                 char *why, size_t size) {
    char name[64];
    cpu_recv_wait(pg, leader, name, sizeof name);
    name[sizeof name - 1] = '\0';
    char *base = name[0] ? cpu_shm_attach(name, l, nonce, why, size) : NULL;
    if (!name[0]) snprintf(why, size, "rank %d could not create the segment", leader);
    uint8_t ok = base != NULL, all_ok;
    cpu_send_wait(pg, leader, &ok, 1);
    cpu_recv_wait(pg, leader, &all_ok, 1);
    if (!all_ok && base) {
        munmap(base, l->total);
        snprintf(why, size, "another rank of this host could not map the segment");
        base = NULL;
    }
    return base;
}

// Point the peers of this host at their rings and doorbells.
static inline void cpu_shm_wire(cpu_pg *pg, char *base, const int *members, int me,
                                const shm_layout *l) {
    shm_bell *bells = (shm_bell *)(base + l->bells);
    shm_ring_ctl *ctls = (shm_ring_ctl *)(base + l->rings);
    pg->shm_base = base;
    pg->shm_bytes = l->total;
    pg->bell = &bells[me];
    for (int i = 0; i < l->members; i++) {
        if (i == me) continue;
        cpu_peer *p = &pg->peers[members[i]];
        size_t out = cpu_ring_index(me, i, l->members), in = cpu_ring_index(i, me, l->members);
        p->tx = (shm_ring){&ctls[out], base + l->data + out * l->ring_bytes, l->ring_bytes};
        p->rx = (shm_ring){&ctls[in], base + l->data + in * l->ring_bytes, l->ring_bytes};
        p->bell = &bells[i];
        p->shm = true;
    }
    // Spin only if every local rank can have a core of its own.
    pg->spin = sysconf(_SC_NPROCESSORS_ONLN) >= l->members;
}

static inline void cpu_setup_shm(cpu_pg *pg, const cpu_address *all, uint64_t nonce,
                                 char *why, size_t size) {
    const char *env = getenv("COURSE_SHM");
    if (env && !strcmp(env, "0")) {
        snprintf(why, size, "turned off by COURSE_SHM=0");
        return;
    }
    int *members = xcalloc((size_t)pg->world, sizeof *members), count = 0, me = 0;
    for (int r = 0; r < pg->world; r++) {
        if (strcmp(all[r].host, all[pg->rank].host)) continue;
        if (r == pg->rank) me = count;
        members[count++] = r;
    }
    if (count >= 2) {
        shm_layout l = cpu_shm_layout(count);
        char *base = me == 0 ? cpu_shm_lead(pg, members, &l, nonce, why, size)
                             : cpu_shm_join(pg, members[0], &l, nonce, why, size);
        if (base) cpu_shm_wire(pg, base, members, me, &l);
    }
    free(members);
}

// ---------------------------------------------------------------- create and destroy

// The engine's lists of peers by transport (used by cpu_progress); before
// the shared memory is set up every peer is a TCP peer.
static inline void cpu_sort_peers(cpu_pg *pg) {
    pg->tcp_count = pg->shm_count = 0;
    for (int r = 0; r < pg->world; r++) {
        if (r == pg->rank) continue;
        cpu_peer *p = &pg->peers[r];
        if (p->shm) pg->shm_ranks[pg->shm_count++] = r;
        else pg->tcp_ranks[pg->tcp_count++] = r;
        if (!p->shm && !p->bounce) p->bounce = xmalloc(CPU_BOUNCE_BYTES);
    }
}

static inline void cpu_describe(cpu_pg *pg, const char *shm_why) {
    if (pg->shm_count && pg->tcp_count)
        snprintf(pg->transport, sizeof pg->transport, "sockets + shared memory: shared memory "
                 "with %d rank%s of this host, TCP with %d", pg->shm_count,
                 pg->shm_count == 1 ? "" : "s", pg->tcp_count);
    else if (pg->shm_count)
        snprintf(pg->transport, sizeof pg->transport, "sockets + shared memory");
    else if (shm_why[0])
        snprintf(pg->transport, sizeof pg->transport, "TCP sockets; no shared memory: %s",
                 shm_why);
    else
        snprintf(pg->transport, sizeof pg->transport, "TCP sockets");
}

static inline cpu_pg *cpu_create(const pg_config *cfg, double timeout_s, int generation) {
    cpu_pg *pg = xcalloc(1, sizeof *pg);
    pg->rank = cfg->rank;
    pg->world = cfg->world_size;
    pg->timeout_s = timeout_s;
    pg->tag = CPU_TAG_SETUP;
    pg->peers = xcalloc((size_t)pg->world, sizeof *pg->peers);
    for (int r = 0; r < pg->world; r++) pg->peers[r] = (cpu_peer){.rank = r, .fd = -1};
    if (pg->world == 1) {
        snprintf(pg->transport, sizeof pg->transport, "one rank: nothing to send");
        return pg;
    }
    size_t n = (size_t)pg->world;
    pg->tcp_ranks = xcalloc(n, sizeof(int));
    pg->shm_ranks = xcalloc(n, sizeof(int));
    pg->tcp_poll = xcalloc(n, sizeof(struct pollfd));
    pg->shm_poll = xcalloc(n, sizeof(struct pollfd));
    cpu_address *all = xcalloc(n, sizeof *all);
    uint64_t nonce;
    char shm_why[160] = "";
    cpu_connect_all(pg, cfg->store, generation, all, &nonce);
    cpu_sort_peers(pg);
    cpu_setup_shm(pg, all, nonce, shm_why, sizeof shm_why);
    cpu_sort_peers(pg);
    cpu_describe(pg, shm_why);
    free(all);
    return pg;
}

static inline void cpu_barrier_tagged(cpu_pg *pg, uint32_t tag);

static inline void cpu_destroy(cpu_pg *pg) {
    // A last barrier: no rank closes its connections while another may
    // still be reading what it sent.
    if (pg->world > 1) cpu_barrier_tagged(pg, CPU_TAG_DESTROY);
    for (int r = 0; r < pg->world; r++) {
        cpu_peer *p = &pg->peers[r];
        if (p->fd >= 0) close(p->fd);
        free(p->bounce);
        msg_free(p->in_msg);
        for (int c = 0; c < 2; c++)
            for (cpu_msg *m; (m = msg_pop(&p->unexpected[c])) != NULL;) msg_free(m);
    }
    if (pg->shm_base) munmap(pg->shm_base, pg->shm_bytes);
    free(pg->peers);
    free(pg->tcp_ranks);
    free(pg->shm_ranks);
    free(pg->tcp_poll);
    free(pg->shm_poll);
    free(pg);
}

// ---------------------------------------------------------------- algorithms: helpers

static inline int cpu_mod(int a, int n) { return ((a % n) + n) % n; }

// Cuts count elements into n blocks as evenly as possible; block b starts at
// element *first and holds *len elements (0 for some blocks when count < n).
static inline void cpu_block(size_t count, int n, int b, size_t *first, size_t *len) {
    size_t base = count / (size_t)n, extra = count % (size_t)n, ub = (size_t)b;
    *first = ub * base + (ub < extra ? ub : extra);
    *len = base + (ub < extra ? 1 : 0);
}

static inline bool cpu_overlap(const void *a, const void *b, size_t bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bytes && y < x + bytes;
}

// ---------------------------------------------------------------- algorithms: all-reduce

// Ring reduce-scatter. The buffer is cut into n blocks. In step s every
// rank sends one block to its right neighbour while it receives another
// from its left neighbour and adds its own values to it as the bytes arrive.
// Block b starts at rank b (sent raw in step 0) and travels n-1 hops,
// picking up one rank's values per hop; after n-1 steps rank r holds block
// r+1 complete:
//     block b = ((x[b] + x[b+1]) + x[b+2]) + ... + x[b-1]     (ranks mod n)
// Every element is thus reduced once, on one rank, in a fixed order - which
// is why all ranks end with identical bits. Every link carries (n-1)/n of
// the data, whatever n is: the ring is bandwidth-optimal. Large blocks flow
// through the transport in pieces (the shared-memory ring, the kernel's
// socket buffer), so sending, receiving and adding overlap: a pipeline.
static inline void ring_reduce_scatter(cpu_pg *pg, const char *send, char *recv, size_t count,
                                       dtype_t t, redop_t op) {
    int n = pg->world, r = pg->rank;
    size_t es = dtype_size(t);
    for (int s = 0; s < n - 1; s++) {
        size_t out_first, out_len, in_first, in_len;
        cpu_block(count, n, cpu_mod(r - s, n), &out_first, &out_len);
        cpu_block(count, n, cpu_mod(r - s - 1, n), &in_first, &in_len);
        // Step 0 sends our own values; later steps pass on the block we
        // completed in the step before.
        const char *out = (s == 0 ? send : recv) + out_first * es;
        cpu_req *reqs[2] = {
            cpu_post_recv_reduce(pg, cpu_mod(r - 1, n), recv + in_first * es,
                                 send + in_first * es, in_len, t, op),
            cpu_post_send(pg, cpu_mod(r + 1, n), out, out_len * es),
        };
        cpu_wait(pg, reqs, 2);
    }
}

// Ring all-gather. Rank r starts with block (r + shift) mod n complete; in
// every step it passes the block it received last to the right. After n-1
// steps every rank has every block - copied bytes, never recomputed.
static inline void ring_all_gather(cpu_pg *pg, char *buf, size_t count, size_t es, int shift) {
    int n = pg->world, r = pg->rank;
    for (int s = 0; s < n - 1; s++) {
        size_t out_first, out_len, in_first, in_len;
        cpu_block(count, n, cpu_mod(r + shift - s, n), &out_first, &out_len);
        cpu_block(count, n, cpu_mod(r + shift - s - 1, n), &in_first, &in_len);
        cpu_req *reqs[2] = {
            cpu_post_recv(pg, cpu_mod(r - 1, n), buf + in_first * es, in_len * es),
            cpu_post_send(pg, cpu_mod(r + 1, n), buf + out_first * es, out_len * es),
        };
        cpu_wait(pg, reqs, 2);
    }
}

// Recursive doubling, for small messages, where the number of steps costs
// more than the bytes. In step k every rank swaps its partial result with
// the rank whose number differs in bit k, and both compute
// (lower rank's part) OP (higher rank's part): the same expression from the
// same operands, hence the same bits. After log2(n) steps every rank holds
// the whole result. When n is not a power of two, the extra ranks first hand
// their values to a partner (r - p) and get the answer back at the end.
static inline void recursive_doubling(cpu_pg *pg, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    int n = pg->world, r = pg->rank, p = 1;
    while (p * 2 <= n) p *= 2;
    size_t bytes = count * dtype_size(t);
    memmove(recv, send, bytes);
    if (r >= p) {   // an extra rank
        cpu_send_wait(pg, r - p, recv, bytes);
        cpu_recv_wait(pg, r - p, recv, bytes);
        return;
    }
    char *other = xmalloc(bytes);
    if (r + p < n) {   // fold in the extra rank's values
        cpu_recv_wait(pg, r + p, other, bytes);
        pg_combine(recv, recv, other, count, t, op);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
        int partner = r ^ mask;
        cpu_exchange(pg, partner, recv, other, bytes);
        if (r < partner) pg_combine(recv, recv, other, count, t, op);
        else pg_combine(recv, other, recv, count, t, op);
    }
    if (r + p < n) cpu_send_wait(pg, r + p, recv, bytes);
    free(other);
}

static inline void all_reduce_core(cpu_pg *pg, const void *send, void *recv, size_t count,
                                   dtype_t t, redop_t op) {
    size_t bytes = count * dtype_size(t);
    if (pg->world == 1) {
        memmove(recv, send, bytes);
    } else if (bytes <= CPU_SMALL_BYTES) {
        recursive_doubling(pg, send, recv, count, t, op);
    } else {
        ring_reduce_scatter(pg, send, recv, count, t, op);
        ring_all_gather(pg, recv, count, dtype_size(t), 1);
    }
}

static inline float *cpu_widen_bf16(const void *src, size_t count) {
    const uint16_t *h = src;
    float *wide = xcalloc(count, sizeof *wide);   // calloc: large blocks come zeroed for free
    for (size_t i = 0; i < count; i++) wide[i] = bf16_to_f32(h[i]);
    return wide;
}

static inline void cpu_narrow_bf16(const float *wide, void *dst, size_t count) {
    uint16_t *h = dst;
    for (size_t i = 0; i < count; i++) h[i] = f32_to_bf16(wide[i]);
}

// bf16 is reduced in float32 and rounded once at the end, so a sum over
// many ranks loses no more than one rounding. AVG is SUM, then a division
// that every rank applies to the same bytes.
static inline void all_reduce_any(cpu_pg *pg, const void *send, void *recv, size_t count,
                                  dtype_t t, redop_t op) {
    if (t == DTYPE_BF16) {
        float *wide = cpu_widen_bf16(send, count);
        all_reduce_any(pg, wide, wide, count, DTYPE_F32, op);
        cpu_narrow_bf16(wide, recv, count);
        free(wide);
        return;
    }
    all_reduce_core(pg, send, recv, count, t, op == OP_AVG ? OP_SUM : op);
    if (op == OP_AVG) pg_divide_elements(recv, count, t, pg->world);
}

static inline void cpu_all_reduce(cpu_pg *pg, const void *send, void *recv, size_t count,
                                  dtype_t t, redop_t op) {
    pg->tag = CPU_TAG_ALL_REDUCE;
    all_reduce_any(pg, send, recv, count, t, op);
}

// Reduce is an all-reduce whose result only the root keeps. On a ring each
// link carries as many bytes as a reduce-scatter followed by a gather to the
// root would, and the root gets exactly the bits all_reduce gives.
static inline void cpu_reduce(cpu_pg *pg, const void *send, void *recv, size_t count, dtype_t t,
                              redop_t op, int root) {
    pg->tag = CPU_TAG_REDUCE;
    void *out = pg->rank == root ? recv : xmalloc(count * dtype_size(t));
    all_reduce_any(pg, send, out, count, t, op);
    if (out != recv) free(out);
}

// ---------------------------------------------------------------- algorithms: reduce-scatter

// The ring reduce-scatter again, with equal blocks of `count` elements and
// shifted by one step so that rank r ends with block r, as reduce_scatter
// promises. recv has room for one block only, so the partial sums travel
// through two scratch blocks used in turn: one being sent, one being filled.
static inline void reduce_scatter_core(cpu_pg *pg, const char *send, char *recv, size_t count,
                                       dtype_t t, redop_t op) {
    int n = pg->world, r = pg->rank;
    size_t bytes = count * dtype_size(t);
    if (n == 1) {
        memmove(recv, send, bytes);
        return;
    }
    char *scratch[2] = {n > 2 ? xmalloc(bytes) : NULL, n > 2 ? xmalloc(bytes) : NULL};
    const char *partial = NULL;   // the block completed in the previous step
    for (int s = 0; s < n - 1; s++) {
        int out = cpu_mod(r - s - 1, n), in = cpu_mod(r - s - 2, n);
        char *acc = s == n - 2 ? recv : scratch[s % 2];
        cpu_req *reqs[2] = {
            cpu_post_recv_reduce(pg, cpu_mod(r - 1, n), acc, send + (size_t)in * bytes, count,
                                 t, op),
            cpu_post_send(pg, cpu_mod(r + 1, n), s == 0 ? send + (size_t)out * bytes : partial,
                          bytes),
        };
        cpu_wait(pg, reqs, 2);
        partial = acc;
    }
    free(scratch[0]);
    free(scratch[1]);
}

static inline void reduce_scatter_any(cpu_pg *pg, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    if (t == DTYPE_BF16) {
        float *wide_send = cpu_widen_bf16(send, count * (size_t)pg->world);
        float *wide_recv = xmalloc(count * sizeof(float));
        reduce_scatter_any(pg, wide_send, wide_recv, count, DTYPE_F32, op);
        cpu_narrow_bf16(wide_recv, recv, count);
        free(wide_send);
        free(wide_recv);
        return;
    }
    reduce_scatter_core(pg, send, recv, count, t, op == OP_AVG ? OP_SUM : op);
    if (op == OP_AVG) pg_divide_elements(recv, count, t, pg->world);
}

static inline void cpu_reduce_scatter(cpu_pg *pg, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    pg->tag = CPU_TAG_REDUCE_SCATTER;
    reduce_scatter_any(pg, send, recv, count, t, op);
}

// ---------------------------------------------------------------- algorithms: broadcast

// Binomial tree: counting ranks from the root, in round k every rank that
// has the data sends it 2^k places further, so n ranks have it after
// ceil(log2 n) rounds. Rank `me` receives in the round of its lowest set bit.
static inline void tree_broadcast(cpu_pg *pg, char *buf, size_t bytes, int root) {
    int n = pg->world, me = cpu_mod(pg->rank - root, n), mask = 1;
    while (mask < n && !(me & mask)) mask <<= 1;
    if (me != 0) cpu_recv_wait(pg, cpu_mod(me - mask + root, n), buf, bytes);
    cpu_req *sends[32];
    int count = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (me + mask < n) sends[count++] = cpu_post_send(pg, cpu_mod(me + mask + root, n), buf, bytes);
    cpu_wait(pg, sends, count);
}

// Pipelined chain: root -> root+1 -> ... -> root-1, the message cut into
// segments. While a rank forwards segment k it already receives segment k+1,
// so all links work at once and the time is about bytes / bandwidth, plus
// one segment per hop to fill the pipeline.
static inline void chain_broadcast(cpu_pg *pg, char *buf, size_t bytes, int root) {
    int n = pg->world, me = cpu_mod(pg->rank - root, n);
    int prev = cpu_mod(pg->rank - 1, n), next = cpu_mod(pg->rank + 1, n);
    size_t segments = (bytes + CPU_SEGMENT_BYTES - 1) / CPU_SEGMENT_BYTES;
    cpu_req **recvs = xcalloc(segments, sizeof *recvs), **sends = xcalloc(segments, sizeof *sends);
    for (size_t k = 0; k < segments && me != 0; k++) {
        size_t at = k * CPU_SEGMENT_BYTES, len = bytes - at < CPU_SEGMENT_BYTES ? bytes - at : CPU_SEGMENT_BYTES;
        recvs[k] = cpu_post_recv(pg, prev, buf + at, len);
    }
    for (size_t k = 0; k < segments; k++) {
        size_t at = k * CPU_SEGMENT_BYTES, len = bytes - at < CPU_SEGMENT_BYTES ? bytes - at : CPU_SEGMENT_BYTES;
        if (me != 0) cpu_wait(pg, &recvs[k], 1);
        if (me != n - 1) sends[k] = cpu_post_send(pg, next, buf + at, len);
    }
    if (me != n - 1) cpu_wait(pg, sends, (int)segments);
    free(recvs);
    free(sends);
}

static inline void cpu_broadcast(cpu_pg *pg, void *buf, size_t bytes, int root) {
    pg->tag = CPU_TAG_BROADCAST;
    if (pg->world == 1) return;
    if (bytes <= CPU_SMALL_BYTES) tree_broadcast(pg, buf, bytes, root);
    else chain_broadcast(pg, buf, bytes, root);
}

// ---------------------------------------------------------------- algorithms: the rest

// All-gather: put our part in place, then the ring all-gather with blocks
// of equal size.
static inline void cpu_all_gather(cpu_pg *pg, const void *send, void *recv, size_t bytes) {
    pg->tag = CPU_TAG_ALL_GATHER;
    memmove((char *)recv + (size_t)pg->rank * bytes, send, bytes);
    ring_all_gather(pg, recv, bytes * (size_t)pg->world, 1, 0);
}

// Gather and scatter: the root talks to every rank directly, all at once.
// The root's link carries (n-1)/n of the data either way, so a tree would
// not be faster for large messages, only more complicated.
static inline void cpu_gather(cpu_pg *pg, const void *send, void *recv, size_t bytes, int root) {
    pg->tag = CPU_TAG_GATHER;
    if (pg->rank != root) {
        cpu_send_wait(pg, root, send, bytes);
        return;
    }
    cpu_req **reqs = xcalloc((size_t)pg->world, sizeof *reqs);
    int count = 0;
    for (int p = 0; p < pg->world; p++)
        if (p != root) reqs[count++] = cpu_post_recv(pg, p, (char *)recv + (size_t)p * bytes, bytes);
    memmove((char *)recv + (size_t)root * bytes, send, bytes);
    cpu_wait(pg, reqs, count);
    free(reqs);
}

static inline void cpu_scatter(cpu_pg *pg, const void *send, void *recv, size_t bytes, int root) {
    pg->tag = CPU_TAG_SCATTER;
    if (pg->rank != root) {
        cpu_recv_wait(pg, root, recv, bytes);
        return;
    }
    cpu_req **reqs = xcalloc((size_t)pg->world, sizeof *reqs);
    int count = 0;
    for (int p = 0; p < pg->world; p++)
        if (p != root)
            reqs[count++] = cpu_post_send(pg, p, (const char *)send + (size_t)p * bytes, bytes);
    memmove(recv, (const char *)send + (size_t)root * bytes, bytes);
    cpu_wait(pg, reqs, count);
    free(reqs);
}

// All-to-all: every pair exchanges its blocks directly. Rank r sends to
// r+1, r+2, ... in that order, so that not everyone sends to rank 0 first.
// In place (send == recv) works on a copy of send.
static inline void cpu_all_to_all(cpu_pg *pg, const void *send, void *recv, size_t bytes) {
    pg->tag = CPU_TAG_ALL_TO_ALL;
    int n = pg->world, r = pg->rank;
    size_t all = bytes * (size_t)n;
    char *copy = NULL;
    if (cpu_overlap(send, recv, all)) send = memcpy(copy = xmalloc(all), send, all);
    cpu_req **reqs = xcalloc(2 * (size_t)n, sizeof *reqs);
    int count = 0;
    for (int k = 1; k < n; k++) {
        int from = cpu_mod(r - k, n), to = cpu_mod(r + k, n);
        reqs[count++] = cpu_post_recv(pg, from, (char *)recv + (size_t)from * bytes, bytes);
        reqs[count++] = cpu_post_send(pg, to, (const char *)send + (size_t)to * bytes, bytes);
    }
    memcpy((char *)recv + (size_t)r * bytes, (const char *)send + (size_t)r * bytes, bytes);
    cpu_wait(pg, reqs, count);
    free(reqs);
    free(copy);
}

// Dissemination barrier: in round k every rank signals the rank 2^k ahead
// and waits for the one 2^k behind. After ceil(log2 n) rounds every rank has
// heard, directly or through others, from every rank: nobody leaves before
// everybody has arrived.
static inline void cpu_barrier_tagged(cpu_pg *pg, uint32_t tag) {
    int n = pg->world, r = pg->rank;
    pg->tag = tag;
    for (int k = 1; k < n; k *= 2) {
        cpu_req *reqs[2] = {cpu_post_recv(pg, cpu_mod(r - k, n), NULL, 0),
                            cpu_post_send(pg, cpu_mod(r + k, n), NULL, 0)};
        cpu_wait(pg, reqs, 2);
    }
}

static inline void cpu_barrier(cpu_pg *pg) { cpu_barrier_tagged(pg, CPU_TAG_BARRIER); }

#endif
