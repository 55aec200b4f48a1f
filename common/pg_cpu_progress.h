// pg_cpu_progress.h - layer 3 of the cpu backend (pg_cpu.h): the progress
// engine, which moves the messages of pg_cpu_message.h while the caller
// waits, and the verbs of "posting work" that the algorithms
// (pg_cpu_algorithms.h) use: cpu_post_send, cpu_post_recv (and _reduce),
// cpu_wait, cpu_send_wait, cpu_recv_wait and cpu_exchange.
#ifndef COURSE_PG_CPU_PROGRESS_H
#define COURSE_PG_CPU_PROGRESS_H

#include "pg_cpu_message.h"

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
    for (int i = 0; i < count; i++) {   // kept for the next requests (cpu_new_req)
        reqs[i]->next = pg->spare;
        pg->spare = reqs[i];
    }
}

// ---------------------------------------------------------------- posting work

// A request that cpu_wait finished is used again: a small collective posts
// two and waits for them, and a calloc and a free take about 20 ns here,
// which a 2-rank all-reduce of 8 bytes (0.7 us) paid three times over
// (with its scratch buffer).
static inline cpu_req_t *cpu_new_req(cpu_pg_t *pg, int peer, size_t bytes) {
    cpu_req_t *r = pg->spare;
    if (r) {
        pg->spare = r->next;
        memset(r, 0, sizeof *r);
    } else {
        r = xcalloc(1, sizeof *r);
    }
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

