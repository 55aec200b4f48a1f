// pg_cpu_algorithms.h - the cpu backend's collectives (layer 4 of pg_cpu.h),
// each written with the transport's verbs (pg_cpu_progress.h): post a send,
// post a receive (which may add what arrives to a buffer), wait, and
// exchange with a peer.
//
//   all-reduce      large: ring reduce-scatter, then ring all-gather;
//                   small: recursive doubling
//   reduce-scatter  the ring's first half
//   broadcast       small: a binomial tree; large: a pipelined chain
//   all-to-all-v    pairwise exchange, with counts per peer
//   the rest        all-gather, gather, scatter, all-to-all, barrier
// Every rank of the group ends with the same bits: each element is reduced
// once, in a fixed order, and that result is what everyone receives.
#ifndef COURSE_PG_CPU_ALGORITHMS_H
#define COURSE_PG_CPU_ALGORITHMS_H

#include "pg_cpu_progress.h"

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
static inline void cpu_ring_reduce_scatter(cpu_pg_t *pg, const char *send, char *recv, size_t count,
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
        cpu_req_t *reqs[2] = {
            cpu_post_recv_reduce(pg, cpu_mod(r - 1, n), recv + in_first * es,
                                 send + in_first * es, in_len, t, op),
            cpu_post_send_to_reduce(pg, cpu_mod(r + 1, n), out, out_len * es),
        };
        cpu_wait(pg, reqs, 2);
    }
}

// Ring all-gather. Rank r starts with block (r + shift) mod n complete -
// in buf, or in `first` if that is not NULL, which is then copied into buf
// while the first step's bytes travel; in every step it passes the block it
// received last to the right. After n-1 steps every rank has every block -
// copied bytes, never recomputed.
static inline void cpu_ring_all_gather(cpu_pg_t *pg, char *buf, size_t count, size_t es,
                                       int shift, const char *first) {
    int n = pg->world, r = pg->rank;
    for (int s = 0; s < n - 1; s++) {
        size_t out_first, out_len, in_first, in_len;
        cpu_block(count, n, cpu_mod(r + shift - s, n), &out_first, &out_len);
        cpu_block(count, n, cpu_mod(r + shift - s - 1, n), &in_first, &in_len);
        char *out = buf + out_first * es;
        cpu_req_t *reqs[2] = {
            cpu_post_recv(pg, cpu_mod(r - 1, n), buf + in_first * es, in_len * es),
            cpu_post_send(pg, cpu_mod(r + 1, n), s == 0 && first ? first : out, out_len * es),
        };
        if (s == 0 && first && first != out) memcpy(out, first, out_len * es);
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
static inline void cpu_recursive_doubling(cpu_pg_t *pg, const void *send, void *recv, size_t count,
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
    // The partner's values land in scratch memory the group keeps (all-reduces
    // this small come often: a malloc each is time the message does not take).
    if (!pg->scratch) pg->scratch = xmalloc(CPU_SMALL_BYTES);
    char *other = pg->scratch;
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
}

static inline void cpu_all_reduce_core(cpu_pg_t *pg, const void *send, void *recv, size_t count,
                                       dtype_t t, redop_t op) {
    size_t bytes = count * dtype_size(t);
    if (pg->world == 1) {
        memmove(recv, send, bytes);
    } else if (bytes <= CPU_SMALL_BYTES) {
        cpu_recursive_doubling(pg, send, recv, count, t, op);
    } else {
        cpu_ring_reduce_scatter(pg, send, recv, count, t, op);
        cpu_ring_all_gather(pg, recv, count, dtype_size(t), 1, NULL);
    }
}

static inline float *cpu_widen(const void *src, size_t count, dtype_t t) {
    const uint16_t *h = src;
    float *wide = xcalloc(count, sizeof *wide);   // calloc: large blocks come zeroed for free
    for (size_t i = 0; i < count; i++) wide[i] = float16_to_f32(t, h[i]);
    return wide;
}

static inline void cpu_narrow(const float *wide, void *dst, size_t count, dtype_t t) {
    uint16_t *h = dst;
    for (size_t i = 0; i < count; i++) h[i] = f32_to_float16(t, wide[i]);
}

// bf16 and fp16 are reduced in float32 and rounded once at the end, so a
// sum over many ranks loses no more than one rounding. AVG is SUM, then a
// division that every rank applies to the same bytes.
static inline void cpu_all_reduce_any(cpu_pg_t *pg, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    if (dtype_is_float16(t)) {
        float *wide = cpu_widen(send, count, t);
        cpu_all_reduce_any(pg, wide, wide, count, DTYPE_F32, op);
        cpu_narrow(wide, recv, count, t);
        free(wide);
        return;
    }
    cpu_all_reduce_core(pg, send, recv, count, t, op == OP_AVG ? OP_SUM : op);
    if (op == OP_AVG) pg_divide_elements(recv, count, t, pg->world);
}

static inline void cpu_all_reduce(cpu_pg_t *pg, const void *send, void *recv, size_t count,
                                  dtype_t t, redop_t op) {
    pg->tag = CPU_TAG_ALL_REDUCE;
    cpu_all_reduce_any(pg, send, recv, count, t, op);
}

// Reduce is an all-reduce whose result only the root keeps. On a ring each
// link carries as many bytes as a reduce-scatter followed by a gather to the
// root would, and the root gets exactly the bits all_reduce gives.
static inline void cpu_reduce(cpu_pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                              redop_t op, int root) {
    pg->tag = CPU_TAG_REDUCE;
    void *out = pg->rank == root ? recv : xmalloc(count * dtype_size(t));
    cpu_all_reduce_any(pg, send, out, count, t, op);
    if (out != recv) free(out);
}

// ---------------------------------------------------------------- algorithms: reduce-scatter

// The ring reduce-scatter again, with equal blocks of `count` elements and
// shifted by one step so that rank r ends with block r, as reduce_scatter
// promises. recv has room for one block only, so the partial sums travel
// through two scratch blocks used in turn: one being sent, one being filled.
static inline void cpu_reduce_scatter_core(cpu_pg_t *pg, const char *send, char *recv, size_t count,
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
        cpu_req_t *reqs[2] = {
            cpu_post_recv_reduce(pg, cpu_mod(r - 1, n), acc, send + (size_t)in * bytes, count,
                                 t, op),
            cpu_post_send_to_reduce(pg, cpu_mod(r + 1, n),
                                    s == 0 ? send + (size_t)out * bytes : partial, bytes),
        };
        cpu_wait(pg, reqs, 2);
        partial = acc;
    }
    free(scratch[0]);
    free(scratch[1]);
}

static inline void cpu_reduce_scatter_any(cpu_pg_t *pg, const void *send, void *recv, size_t count,
                                          dtype_t t, redop_t op) {
    if (dtype_is_float16(t)) {
        float *wide_send = cpu_widen(send, count * (size_t)pg->world, t);
        float *wide_recv = xmalloc(count * sizeof(float));
        cpu_reduce_scatter_any(pg, wide_send, wide_recv, count, DTYPE_F32, op);
        cpu_narrow(wide_recv, recv, count, t);
        free(wide_send);
        free(wide_recv);
        return;
    }
    cpu_reduce_scatter_core(pg, send, recv, count, t, op == OP_AVG ? OP_SUM : op);
    if (op == OP_AVG) pg_divide_elements(recv, count, t, pg->world);
}

static inline void cpu_reduce_scatter(cpu_pg_t *pg, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    pg->tag = CPU_TAG_REDUCE_SCATTER;
    cpu_reduce_scatter_any(pg, send, recv, count, t, op);
}

// ---------------------------------------------------------------- algorithms: broadcast

// Binomial tree: counting ranks from the root, in round k every rank that
// has the data sends it 2^k places further, so n ranks have it after
// ceil(log2 n) rounds. Rank `me` receives in the round of its lowest set bit.
static inline void cpu_tree_broadcast(cpu_pg_t *pg, char *buf, size_t bytes, int root) {
    int n = pg->world, me = cpu_mod(pg->rank - root, n), mask = 1;
    while (mask < n && !(me & mask)) mask <<= 1;
    if (me != 0) cpu_recv_wait(pg, cpu_mod(me - mask + root, n), buf, bytes);
    cpu_req_t *sends[32];
    int count = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (me + mask < n) sends[count++] = cpu_post_send(pg, cpu_mod(me + mask + root, n), buf, bytes);
    cpu_wait(pg, sends, count);
}

// Pipelined chain: root -> root+1 -> ... -> root-1, the message cut into
// segments. While a rank forwards segment k it already receives segment k+1,
// so all links work at once and the time is about bytes / bandwidth, plus
// one segment per hop to fill the pipeline.
static inline void cpu_chain_broadcast(cpu_pg_t *pg, char *buf, size_t bytes, int root) {
    int n = pg->world, me = cpu_mod(pg->rank - root, n);
    int prev = cpu_mod(pg->rank - 1, n), next = cpu_mod(pg->rank + 1, n);
    size_t segments = (bytes + CPU_SEGMENT_BYTES - 1) / CPU_SEGMENT_BYTES;
    cpu_req_t **recvs = xcalloc(segments, sizeof *recvs);
    cpu_req_t **sends = xcalloc(segments, sizeof *sends);
    for (size_t k = 0; k < segments && me != 0; k++) {
        size_t at = k * CPU_SEGMENT_BYTES, len = bytes - at < CPU_SEGMENT_BYTES ? bytes - at : CPU_SEGMENT_BYTES;
        recvs[k] = cpu_post_recv(pg, prev, buf + at, len);
    }
    for (size_t k = 0; k < segments; k++) {
        size_t at = k * CPU_SEGMENT_BYTES, len = bytes - at < CPU_SEGMENT_BYTES ? bytes - at : CPU_SEGMENT_BYTES;
        if (me != 0) cpu_wait(pg, &recvs[k], 1);
        if (me != n - 1) sends[k] = cpu_post_send_as(pg, next, buf + at, len, false);
    }
    if (me != n - 1) cpu_wait(pg, sends, (int)segments);
    free(recvs);
    free(sends);
}

static inline void cpu_broadcast(cpu_pg_t *pg, void *buf, size_t bytes, int root) {
    pg->tag = CPU_TAG_BROADCAST;
    if (pg->world == 1) return;
    if (bytes <= CPU_TREE_BROADCAST_BYTES) cpu_tree_broadcast(pg, buf, bytes, root);
    else cpu_chain_broadcast(pg, buf, bytes, root);
}

// ---------------------------------------------------------------- algorithms: the rest

// All-gather: the ring all-gather with blocks of equal size, our own block
// sent straight from the caller's send buffer and copied into its place
// while it travels. Copying it into place first and sending it from there
// made the peer read bytes we had just written, whose cache lines then
// move to the peer's core and must come back for our next write; nobody
// writes the send buffer. (2 ranks, 2 MiB: 137-159 us -> 108-119 us, four
// runs of 5 interleaved rounds.) A send buffer that overlaps the receive
// buffer other than in place is copied first, before others' blocks land.
static inline void cpu_all_gather(cpu_pg_t *pg, const void *send, void *recv, size_t bytes) {
    pg->tag = CPU_TAG_ALL_GATHER;
    char *mine = (char *)recv + (size_t)pg->rank * bytes;
    size_t all = bytes * (size_t)pg->world;
    if (pg->world == 1 || (send != mine && cpu_overlap(send, recv, all)))
        send = memmove(mine, send, bytes);
    cpu_ring_all_gather(pg, recv, all, 1, 0, send);
}

// Gather and scatter: the root talks to every rank directly, all at once.
// The root's link carries (n-1)/n of the data either way, so a tree would
// not be faster for large messages, only more complicated.
static inline void cpu_gather(cpu_pg_t *pg, const void *send, void *recv, size_t bytes, int root) {
    pg->tag = CPU_TAG_GATHER;
    if (pg->rank != root) {
        cpu_send_wait(pg, root, send, bytes);
        return;
    }
    cpu_req_t **reqs = xcalloc((size_t)pg->world, sizeof *reqs);
    int count = 0;
    for (int p = 0; p < pg->world; p++)
        if (p != root) reqs[count++] = cpu_post_recv(pg, p, (char *)recv + (size_t)p * bytes, bytes);
    memmove((char *)recv + (size_t)root * bytes, send, bytes);
    cpu_wait(pg, reqs, count);
    free(reqs);
}

static inline void cpu_scatter(cpu_pg_t *pg, const void *send, void *recv, size_t bytes, int root) {
    pg->tag = CPU_TAG_SCATTER;
    if (pg->rank != root) {
        cpu_recv_wait(pg, root, recv, bytes);
        return;
    }
    cpu_req_t **reqs = xcalloc((size_t)pg->world, sizeof *reqs);
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
static inline void cpu_all_to_all(cpu_pg_t *pg, const void *send, void *recv, size_t bytes) {
    pg->tag = CPU_TAG_ALL_TO_ALL;
    int n = pg->world, r = pg->rank;
    size_t all = bytes * (size_t)n;
    char *copy = NULL;
    if (cpu_overlap(send, recv, all)) send = memcpy(copy = xmalloc(all), send, all);
    cpu_req_t **reqs = xcalloc(2 * (size_t)n, sizeof *reqs);
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

// All-to-all with counts per peer (pg_all_to_all_v): pairwise exchange.
// In round k = 1 .. n-1 rank r sends its block for rank r+k and receives
// the block of rank r-k, so that every round pairs every rank with a
// different partner and no rank is sent to by everyone at once; our own
// block is a copy. The rounds are posted together, as all_to_all's are,
// and overlap in the progress engine: the round order only decides who
// goes first. Where the blocks lie comes from the counts: the block for
// peer p starts at the sum of the counts of peers 0..p-1 (the prefix sums
// below; all_to_all's blocks, all of one size, start at p x count).
// A count of 0 still sends a message, of no bytes: its header carries the
// size, so the receiver checks every pair's count - a rank that sends 5
// elements to a rank that expects 4 is a one-line error, and one that
// sends 0 where 4 are expected does not leave its peer waiting.
static inline size_t *cpu_prefix_sums(const size_t *counts, int n) {
    size_t *at = xcalloc((size_t)n, sizeof *at);
    for (int p = 1; p < n; p++) at[p] = at[p - 1] + counts[p - 1];
    return at;
}

// base + elements x es, where a NULL base (a rank with nothing there) stays NULL.
static inline char *cpu_at(const void *base, size_t elements, size_t es) {
    return base ? (char *)base + elements * es : NULL;
}

static inline void cpu_all_to_all_v(cpu_pg_t *pg, const void *send, const size_t *send_counts, void *recv,
                                    const size_t *recv_counts, size_t es) {
    pg->tag = CPU_TAG_ALL_TO_ALL_V;
    int n = pg->world, r = pg->rank;
    size_t *send_at = cpu_prefix_sums(send_counts, n), *recv_at = cpu_prefix_sums(recv_counts, n);
    cpu_req_t **reqs = xcalloc(2 * (size_t)n, sizeof *reqs);
    int count = 0;
    for (int k = 1; k < n; k++) {
        int from = cpu_mod(r - k, n), to = cpu_mod(r + k, n);
        reqs[count++] = cpu_post_recv(pg, from, cpu_at(recv, recv_at[from], es), recv_counts[from] * es);
        reqs[count++] = cpu_post_send(pg, to, cpu_at(send, send_at[to], es), send_counts[to] * es);
    }
    if (send_counts[r] > 0)   // pg.h checked that it equals recv_counts[r]
        memcpy(cpu_at(recv, recv_at[r], es), cpu_at(send, send_at[r], es), send_counts[r] * es);
    cpu_wait(pg, reqs, count);
    free(reqs);
    free(send_at);
    free(recv_at);
}

// Dissemination barrier: in round k every rank signals the rank 2^k ahead
// and waits for the one 2^k behind. After ceil(log2 n) rounds every rank has
// heard, directly or through others, from every rank: nobody leaves before
// everybody has arrived.
static inline void cpu_barrier_tagged(cpu_pg_t *pg, uint32_t tag) {
    int n = pg->world, r = pg->rank;
    pg->tag = tag;
    for (int k = 1; k < n; k *= 2) {
        cpu_req_t *reqs[2] = {cpu_post_recv(pg, cpu_mod(r - k, n), NULL, 0),
                            cpu_post_send(pg, cpu_mod(r + k, n), NULL, 0)};
        cpu_wait(pg, reqs, 2);
    }
}

static inline void cpu_barrier(cpu_pg_t *pg) { cpu_barrier_tagged(pg, CPU_TAG_BARRIER); }

#endif
