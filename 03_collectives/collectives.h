// collectives.h - the nine collectives of chapter 3, described once.
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
//   barrier         no    no       -            -            0               -
//
// count is elements per rank, as the pg API (and NCCL) count them: for the
// last five it is one rank's chunk of an n-chunk buffer. S is the bytes
// nccl-tests divides by the time for the algorithm bandwidth (algbw); the
// bus bandwidth busbw = algbw x factor counts what each link carries in a
// ring, so it compares with the hardware's link speed whatever n is (an
// all-reduce is a reduce-scatter then an all-gather: twice (n-1)/n).
#ifndef CH03_COLLECTIVES_H
#define CH03_COLLECTIVES_H

#include <stdbool.h>

#include "pg.h"

typedef enum {
    BROADCAST, REDUCE, ALL_REDUCE, GATHER, ALL_GATHER, SCATTER, REDUCE_SCATTER, ALL_TO_ALL, BARRIER,
    COLLECTIVES
} coll_id;

typedef enum { BUS_NONE, BUS_ONE, BUS_RING, BUS_TWO_RINGS } bus_kind;

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
    {"barrier",          false, false,   false,  false,  BUS_NONE},
};

// Buffer lengths in elements for `count` per rank.
static inline size_t coll_send_len(coll_id c, size_t count, int n) {
    return COLLECTIVE[c].send_chunks ? count * (size_t)n : count;
}
static inline size_t coll_recv_len(coll_id c, size_t count, int n) {
    return COLLECTIVE[c].recv_chunks ? count * (size_t)n : count;
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
    case BARRIER: pg_barrier(pg); break;
    case COLLECTIVES: break;
    }
}

#endif
