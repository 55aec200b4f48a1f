// collectives.h - the nine collectives of chapter 3 (and all_to_all_v, all_to_all
// with a count per pair), described once.
//
// Everything the lesson draws and the benchmark measures about a
// collective comes from its row in this table:
//
//   collective      root  reduces  send buffer  recv buffer  nccl-tests' S   busbw factor
//   broadcast       yes   no       count        count        count x size    1
//   reduce          yes   yes      count        count        count x size    1
//   all_reduce      no    yes      count        count        count x size    2(n-1)/n
//   gather          yes   no       count        n x count    n x count x s   (n-1)/n
//   all_gather      no    no       count        n x count    n x count x s   (n-1)/n
//   scatter         yes   no       n x count    count        n x count x s   (n-1)/n
//   reduce_scatter  no    yes      n x count    count        n x count x s   (n-1)/n
//   all_to_all      no    no       n x count    n x count    n x count x s   (n-1)/n
//   all_to_all_v    no    no       ~n x count   ~n x count   sent x s        1
//   barrier         no    no       -            -            0               -
//
// count is elements per rank, as the pg API (and NCCL) count them: for the
// last five it is one rank's chunk of an n-chunk buffer. S is the bytes
// nccl-tests divides by the time for the algorithm bandwidth (algbw); the
// bus bandwidth busbw = algbw x factor counts what each link carries in a
// ring, so it compares with the hardware's link speed whatever n is (an
// all-reduce is a reduce-scatter then an all-gather: twice (n-1)/n).
//
// all_to_all_v has no single count: its counts differ from pair to pair.
// Here `count` sets them, as uneven as routed tokens are but the same total
// on every rank (coll_v_count): rank r sends 2k/(n-1) x count elements to
// rank r+k (mod n), k = 0 .. n-1, rounded down - nothing to itself, twice
// count to rank r-1. Every rank sends and receives about n x count, and
// every byte crosses a link: S is what one rank sends, and busbw = algbw.
#ifndef CH03_COLLECTIVES_H
#define CH03_COLLECTIVES_H

#include <stdbool.h>

#include "pg.h"

typedef enum {
    BROADCAST, REDUCE, ALL_REDUCE, GATHER, ALL_GATHER, SCATTER, REDUCE_SCATTER, ALL_TO_ALL, ALL_TO_ALL_V,
    BARRIER, COLLECTIVES
} coll_id;

// BUS_AWAY: every byte leaves its rank (factor 1; 0 with one rank).
typedef enum { BUS_NONE, BUS_ONE, BUS_RING, BUS_TWO_RINGS, BUS_AWAY } bus_kind;

typedef struct {
    const char *name;
    bool has_root, reduces;
    bool send_chunks, recv_chunks;   // the buffer holds one chunk of `count` per rank
    bus_kind bus;
} collective_info;

static const collective_info COLLECTIVE[COLLECTIVES] = {
    //  name              root   reduces  send n  recv n  busbw
    {"broadcast",        true,  false,   false,  false,  BUS_ONE},
    {"reduce",           true,  true,    false,  false,  BUS_ONE},
    {"all_reduce",       false, true,    false,  false,  BUS_TWO_RINGS},
    {"gather",           true,  false,   false,  true,   BUS_RING},
    {"all_gather",       false, false,   false,  true,   BUS_RING},
    {"scatter",          true,  false,   true,   false,  BUS_RING},
    {"reduce_scatter",   false, true,    true,   false,  BUS_RING},
    {"all_to_all",       false, false,   true,   true,   BUS_RING},
    {"all_to_all_v",     false, false,   true,   true,   BUS_AWAY},
    {"barrier",          false, false,   false,  false,  BUS_NONE},
};

// all_to_all_v's counts: what rank `from` sends to rank `to` (see the top).
static inline size_t coll_v_count(size_t count, int from, int to, int n) {
    if (n == 1) return count;
    size_t k = (size_t)(((to - from) % n + n) % n);
    return 2 * k * count / (size_t)(n - 1);
}

// Buffer lengths in elements for `count` per rank (all_to_all_v: what a
// rank sends, which is what it receives, the same on every rank).
static inline size_t coll_send_len(coll_id c, size_t count, int n) {
    if (c == ALL_TO_ALL_V) {
        size_t total = 0;
        for (int to = 0; to < n; to++) total += coll_v_count(count, 0, to, n);
        return total;
    }
    return COLLECTIVE[c].send_chunks ? count * (size_t)n : count;
}
static inline size_t coll_recv_len(coll_id c, size_t count, int n) {
    if (c == ALL_TO_ALL_V) return coll_send_len(c, count, n);
    return COLLECTIVE[c].recv_chunks ? count * (size_t)n : count;
}

// all_to_all_v with coll_v_count's counts.
static inline void coll_all_to_all_v(pg_t *pg, const void *send, void *recv, size_t count, dtype_t type) {
    int n = pg_world_size(pg), me = pg_rank(pg);
    size_t *counts = xcalloc(2 * (size_t)n, sizeof *counts), *send_counts = counts, *recv_counts = counts + n;
    for (int p = 0; p < n; p++) {
        send_counts[p] = coll_v_count(count, me, p, n);
        recv_counts[p] = coll_v_count(count, p, me, n);
    }
    pg_all_to_all_v(pg, send, send_counts, recv, recv_counts, type);
    free(counts);
}

// Every rank calls this with the same arguments except the buffers. The
// result is always in `recv`; broadcast works in place on `recv`.
static inline void coll_run(pg_t *pg, coll_id c, const void *send, void *recv, size_t count, dtype_t type,
                            redop_t op, int root) {
    switch (c) {
    case BROADCAST: pg_broadcast(pg, recv, count, type, root); break;
    case REDUCE: pg_reduce(pg, send, recv, count, type, op, root); break;
    case ALL_REDUCE: pg_all_reduce(pg, send, recv, count, type, op); break;
    case GATHER: pg_gather(pg, send, recv, count, type, root); break;
    case ALL_GATHER: pg_all_gather(pg, send, recv, count, type); break;
    case SCATTER: pg_scatter(pg, send, recv, count, type, root); break;
    case REDUCE_SCATTER: pg_reduce_scatter(pg, send, recv, count, type, op); break;
    case ALL_TO_ALL: pg_all_to_all(pg, send, recv, count, type); break;
    case ALL_TO_ALL_V: coll_all_to_all_v(pg, send, recv, count, type); break;
    case BARRIER: pg_barrier(pg); break;
    case COLLECTIVES: break;
    }
}

#endif
