// pg_backend.h - the seam between the process group (pg.h) and its
// backends: one table of functions per backend, as nccl-tests has one per
// engine.
//
// pg.h does what every backend needs - check the arguments, stage GPU
// buffers through host memory for a backend that works on the host, say
// what is being called (COURSE_DEBUG) - once, and then calls the table of
// the backend the group uses:
//
//   backend   buffers   file         instance
//   cpu       host      pg_cpu.h     cpu_backend()
//   mpi       host      pg_mpi.h     mpi_backend()
//   nccl      GPU       pg_nccl.h    nccl_backend()
//
// A backend this build lacks (no CUDA, no MPI) still has a table: its
// `missing` says why, and pg.h refuses it with that reason. So no file
// asks "was NCCL built?" but the backend's own.
//
// Every collective has the same arguments (send, recv, count, dtype, op,
// root; unused ones are ignored), and the table below says, for each, what
// it reads and writes. From it pg.h knows which buffers to check, how large
// they are, and which to stage in and out. One collective does not fit
// that shape: all_to_all_v, whose counts differ from peer to peer, has an
// entry of its own in each backend's table.
#ifndef COURSE_PG_BACKEND_H
#define COURSE_PG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "pg_types.h"

typedef enum {
    PG_BROADCAST, PG_REDUCE, PG_ALL_REDUCE, PG_GATHER, PG_ALL_GATHER, PG_SCATTER, PG_REDUCE_SCATTER,
    PG_ALL_TO_ALL, PG_COLLECTIVES
} pg_coll_t;

// Which ranks pass a buffer: every rank, only the root, or every rank but
// the root (broadcast's receivers).
typedef enum { PG_EVERY_RANK, PG_ROOT_ONLY, PG_NOT_ROOT } pg_who_t;

// What a collective reads (send) and writes (recv), in units of `count`
// elements: 1, or one block per rank (PG_BLOCKS).
enum { PG_BLOCKS = 0 };
typedef struct {
    const char *name;
    pg_who_t send_who, recv_who;
    int send_blocks, recv_blocks;   // 1 or PG_BLOCKS
    bool has_root, has_op;
} pg_coll_shape_t;

static const pg_coll_shape_t pg_coll_shapes[PG_COLLECTIVES] = {
    //  name              send from      recv at          send      recv       root   op
    {"broadcast",      PG_ROOT_ONLY,  PG_NOT_ROOT,   1,         1,         true,  false}, // in place: send == recv
    {"reduce",         PG_EVERY_RANK, PG_ROOT_ONLY,  1,         1,         true,  true},
    {"all_reduce",     PG_EVERY_RANK, PG_EVERY_RANK, 1,         1,         false, true},
    {"gather",         PG_EVERY_RANK, PG_ROOT_ONLY,  1,         PG_BLOCKS, true,  false},
    {"all_gather",     PG_EVERY_RANK, PG_EVERY_RANK, 1,         PG_BLOCKS, false, false},
    {"scatter",        PG_ROOT_ONLY,  PG_EVERY_RANK, PG_BLOCKS, 1,         true,  false},
    {"reduce_scatter", PG_EVERY_RANK, PG_EVERY_RANK, PG_BLOCKS, 1,         false, true},
    {"all_to_all",     PG_EVERY_RANK, PG_EVERY_RANK, PG_BLOCKS, PG_BLOCKS, false, false},
};

// Does this rank pass a buffer of that role?
static inline bool pg_who_includes(pg_who_t who, int rank, int root) {
    return who == PG_EVERY_RANK || (who == PG_ROOT_ONLY) == (rank == root);
}

// A CUDA event (cudaEvent_t is this very pointer type), named here so that
// the table has one shape in every build.
typedef struct CUevent_st *pg_event_t;

// Who a new group is: the prefix of its keys in the rendezvous store (a
// group's keys never meet another's), and its ranks.
typedef struct {
    char key[64];
    int rank, world_size;
} pg_group_id_t;

// One backend. `impl` is the backend's own state (cpu_pg_t, mpi_pg_t,
// nccl_pg_t), `req` its own request; pg.h never looks inside either.
typedef struct {
    const char *name;
    const char *missing;    // NULL, or why this build has no such backend
    bool host_buffers;      // works on host memory: pg.h stages GPU buffers
    void *(*create)(const pg_config_t *cfg, const pg_group_id_t *id, double timeout_s);
    // A sub-group of the ranks of impl with the same color (color < 0: none;
    // then NULL is returned), ranked as id says. Every rank of impl calls it.
    void *(*split)(void *impl, int color, int key, const pg_group_id_t *id, store_t *store, double timeout_s);
    void (*destroy)(void *impl);
    void (*describe)(void *impl, char *out, size_t size);
    void *(*isend)(void *impl, const void *buf, size_t count, dtype_t t, int peer);
    void *(*irecv)(void *impl, void *buf, size_t count, dtype_t t, int peer);
    bool (*test)(void *impl, void *req);
    void (*wait)(void *impl, void *req);   // and frees req
    void (*collective)(void *impl, pg_coll_t c, const void *send, void *recv, size_t count, dtype_t t,
                       redop_t op, int root);
    // send_counts[p] elements go to rank p, recv_counts[p] come from it, the
    // blocks packed in rank order (pg.h's pg_all_to_all_v); pg.h has checked
    // the counts this rank can check, and the buffers do not overlap.
    void (*all_to_all_v)(void *impl, const void *send, const size_t *send_counts, void *recv,
                         const size_t *recv_counts, dtype_t t);
    void (*barrier)(void *impl);
    // GPU buffers only (nccl): the collective queued behind the event
    // `ready` (NULL: behind nothing), and `done` (unless NULL) recorded once
    // its result is there; returns at once. NULL for the host backends,
    // which pg.h then runs as "wait for `ready`, the blocking call, record
    // `done`".
    void (*collective_after)(void *impl, pg_coll_t c, const void *send, void *recv, size_t count, dtype_t t,
                             redop_t op, pg_event_t ready, pg_event_t done);
    void (*wait_queued)(void *impl);
} pg_backend_t;

// A backend this build lacks: every entry but these is NULL.
#define PG_MISSING_BACKEND(backend_name, why) \
    { .name = backend_name, .missing = why, .host_buffers = true }

#endif
