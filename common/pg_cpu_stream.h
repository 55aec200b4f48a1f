// pg_cpu_stream.h - layer 1 of the cpu backend (pg_cpu.h): the byte
// streams between two ranks. To every other rank a rank holds a stream in
// each direction: a TCP connection, or, between ranks of one host, a pair
// of ring buffers in shared memory. This file holds the types every layer
// shares (a message's header, a request, a peer, the group), the rings and
// the verbs that write to and read from a stream. pg_cpu_message.h frames
// messages on top of it; pg_cpu_progress.h moves them.
#ifndef COURSE_PG_CPU_STREAM_H
#define COURSE_PG_CPU_STREAM_H

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
    CPU_RING_MAX = 256 << 10,        // shared-memory ring per ordered pair of ranks (see below)
    CPU_RING_MIN = 64 << 10,
    CPU_CHUNK_BYTES = 64 << 10,      // shared memory: bytes published or consumed at a time
    CPU_SINGLE_COPY_MIN = 512 << 10, // COURSE_SINGLE_COPY=1: the receiver reads payloads of these sizes
    CPU_SINGLE_COPY_MAX = 8 << 20,   // ... straight from the sender's buffer (pg_cpu_message.h)
    CPU_SHM_BUDGET = 48 << 20,       // all rings of a host (Docker's /dev/shm is 64 MiB)
    CPU_PREFETCH_BYTES = 1 << 10,    // shared memory: bytes of a record asked for at once (cpu_ring_peek)
};
// Why a ring of 256 KiB, not more: a message costs most the first time it
// passes over a part of the ring's memory (2 ranks, 2 KiB ping-pong: 9.5 us
// a message until a 4 MiB ring had wrapped once, 1.0 us after, page tables
// filled in or not; 2026-11-28). A small ring wraps after a few hundred
// messages and stays in the caches; 4 MiB kept 2-32 KiB messages 3-20x
// slower than MPI for a thousand of them. What a large ring bought - a
// sender dumping a whole 4 MiB block - was worth at most 30% at 8 MiB
// all-reduces (2 ranks: 1.3 -> 1.8 ms; MPI 2.1 ms) - and since, with the
// records and warm rings, the 256 KiB ring does them in 0.75 ms (MPI 1.7).
// (03's MEASUREMENTS.md, "Small messages" and "Single copy, measured again".)
// The first lap is still slow, and a benchmark of a thousand small
// messages never leaves it: each rank goes once over its rings at the
// start (cpu_warm_rings in pg_cpu_setup.h).
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
// A tighter spin - 16 pauses in a row, looking only at the words where the
// next records land - saved 0.08 us of an 8-byte ping-pong in one state of
// this virtual machine, and made 2-8 KiB all-reduces 3-5x slower in another
// (2 ranks, 8 KiB: 9.0 us instead of 1.8; 2026-11-28): not kept.
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
    CPU_TAG_ALL_TO_ALL, CPU_TAG_BARRIER, CPU_TAG_DESTROY, CPU_TAG_DONE_READING, CPU_TAG_ALL_TO_ALL_V,
    CPU_TAG_COUNT
};

static inline const char *cpu_tag_name(uint32_t tag) {
    static const char *names[] = {"?", "send/recv", "setup", "broadcast", "reduce",
                                  "all_reduce", "gather", "all_gather", "scatter",
                                  "reduce_scatter", "all_to_all", "barrier", "pg_destroy",
                                  "single copy", "all_to_all_v"};
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
// single-consumer queue needs no lock. The bytes travel in records: an
// 8-byte word, then up to a chunk of bytes. The word holds the record's
// length and a stamp of its place in the stream (the count of bytes ever
// written before it, cut to 32 bits); the writer copies the bytes first and
// stores the word last, with release order. The reader waits on the word
// at its position: once the stamp there is the one that position should
// have, the bytes behind it are complete (acquire order). A word left over
// from an earlier lap of the ring has another stamp, so nothing else says
// that bytes have arrived. The reader hands bytes back by storing `tail`,
// the count of bytes ever read; the writer looks at it only when it seems
// short of room.
//
// Why records, and not a count of bytes written that the reader polls (as
// this ring first had): the reader polled the count's cache line, saw it
// change, then asked for the message's line - two trips between the cores,
// one after the other. With the word in the message's own line, one trip
// brings both. MPI's shared-memory transport does the same for small
// messages (Open MPI's "fast boxes"). 2 ranks, 8-128 B ping-pong, 9
// interleaved rounds: 0.72-0.73 us one way -> 0.45-0.57 (MPI 0.86-1.12 at
// that moment; 03's MEASUREMENTS.md, "Small messages").
//
// Each rank also has a doorbell: when it has waited for a while it sleeps on
// a futex (a kernel wait queue keyed by an address, which works across
// processes on shared memory), and a peer that writes to it or frees room
// for it rings the bell. Ranks do not spin for long: with more ranks than
// cores a spinning rank would steal the core of the rank it waits for.

typedef struct {
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
    uint64_t pos;                         // bytes of the stream written (writer) or passed (reader)
    uint64_t tail_seen;                   // writer: `tail` when last loaded (see cpu_ring_write)
    size_t left;                          // reader: bytes of the current record not taken yet
} cpu_shm_ring_t;

enum { CPU_RECORD_WORD = 8 };

// The stamp of a record that starts `pos` bytes into the stream. Never 0 on
// the first lap, where the ring's memory is still zero.
static inline uint32_t cpu_record_stamp(uint64_t pos) { return (uint32_t)(pos / CPU_RECORD_WORD) + 1; }

static inline _Atomic uint64_t *cpu_record_word(const cpu_shm_ring_t *r, uint64_t pos) {
    return (_Atomic uint64_t *)(void *)(r->data + ((size_t)pos & (r->cap - 1)));
}

// Copies as much of iov as fits; returns the bytes written. One record per
// chunk, each published as soon as it is complete, so that the reader
// copies chunk k out while we copy chunk k+1 in: two cores work at once,
// and a chunk is still in the cache when the reader takes it. (Publishing
// only at the end made a 4 MiB message cost two full copies one after the
// other: half MPI's speed at 2-8 MiB.) A record never wraps around the
// ring's end: where only its word would fit, an empty record fills it.
//
// The writer loads the reader's `tail` only when the tail it saw last leaves
// too little room. Each load of a counter that the other core has just
// stored moves a cache line between the cores, and a stale tail only makes
// the room look smaller.
static inline size_t cpu_ring_write(cpu_shm_ring_t *r, const struct iovec *iov, int count) {
    size_t wanted = 0, written = 0, part = 0, part_done = 0;
    for (int i = 0; i < count; i++) wanted += iov[i].iov_len;
    if (r->cap - (size_t)(r->pos - r->tail_seen) < wanted + 2 * CPU_RECORD_WORD)
        r->tail_seen = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    while (written < wanted) {
        size_t room = r->cap - (size_t)(r->pos - r->tail_seen);
        size_t at = (size_t)r->pos & (r->cap - 1), to_end = r->cap - at;
        if (room < 2 * CPU_RECORD_WORD) break;   // not even a word and 8 bytes: the reader must catch up
        size_t n = wanted - written;
        if (n > CPU_CHUNK_BYTES) n = CPU_CHUNK_BYTES;
        if (n > room - CPU_RECORD_WORD) n = room - CPU_RECORD_WORD;
        if (n > to_end - CPU_RECORD_WORD) n = to_end - CPU_RECORD_WORD;   // 0: an empty record
        char *dst = r->data + at + CPU_RECORD_WORD;
        for (size_t copied = 0; copied < n;) {   // the bytes of n from the parts of iov
            size_t take = iov[part].iov_len - part_done;
            if (take > n - copied) take = n - copied;
            memcpy(dst + copied, (const char *)iov[part].iov_base + part_done, take);
            copied += take;
            part_done += take;
            if (part_done == iov[part].iov_len) part++, part_done = 0;
        }
        atomic_store_explicit(cpu_record_word(r, r->pos), (uint64_t)cpu_record_stamp(r->pos) << 32 | n,
                              memory_order_release);
        r->pos += CPU_RECORD_WORD + n;
        written += n;
    }
    return written;
}

// The bytes of the current record not taken yet (NULL when none has
// arrived). Consuming them chunk by chunk frees room for the writer early:
// the other half of the pipeline.
//
// The line of the record's word holds the first 56 bytes too: a small
// message arrives in the one trip that the word takes. The rest of the
// first CPU_PREFETCH_BYTES is asked for at once, before the header is
// taken apart.
static inline const char *cpu_ring_peek(cpu_shm_ring_t *r, size_t *len) {
    while (r->left == 0) {   // at a record's word: has it been written?
        uint64_t word = atomic_load_explicit(cpu_record_word(r, r->pos), memory_order_acquire);
        if ((uint32_t)(word >> 32) != cpu_record_stamp(r->pos)) {
            *len = 0;
            return NULL;
        }
        r->pos += CPU_RECORD_WORD;
        r->left = (uint32_t)word;   // 0: an empty record, the ring's end
    }
    const char *at = r->data + ((size_t)r->pos & (r->cap - 1));
    *len = r->left;
    for (size_t k = 64; k < *len && k < CPU_PREFETCH_BYTES; k += 64) __builtin_prefetch(at + k);
    return at;
}

static inline void cpu_ring_consume(cpu_shm_ring_t *r, size_t n) {
    r->pos += n;
    r->left -= n;
    atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_release);
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
    size_t shm_bytes, ring_bytes;  // the segment, and each ring in it (0: no shared memory)
    cpu_shm_bell_t *bell;               // this rank's doorbell
    bool spin;                    // busy-wait a little before sleeping (enough cores)
    double last_probe;            // last check that the shared-memory peers live
    cpu_req_t *spare;             // finished requests, kept for the next ones (cpu_new_req)
    char *scratch;                // CPU_SMALL_BYTES for the small all-reduce (cpu_recursive_doubling)
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

#endif
