// pg_mpi.h - the mpi backend: the course's process-group API over MPI.
//
// A CPU cluster already has an engine for moving data between processes:
// MPI (OpenMPI, MPICH), started by `mpirun -np N ./prog` or SLURM's `srun`.
// This backend maps pg.h's calls onto it, one for one, which makes it a
// small dictionary between the two APIs:
//
//   pg.h                    MPI
//   rank, world size        MPI_Comm_rank, MPI_Comm_size (of a private copy
//                           of MPI_COMM_WORLD, so our messages never meet the
//                           program's own)
//   pg_isend / pg_irecv     MPI_Isend / MPI_Irecv; pg_request_t holds the
//   pg_test / pg_wait       MPI_Request, pg_test is MPI_Test, pg_wait MPI_Wait
//   broadcast, reduce, all_reduce, gather, all_gather, scatter,
//   reduce_scatter, all_to_all, all_to_all_v, barrier
//                           MPI_Bcast, MPI_Reduce, MPI_Allreduce, MPI_Gather,
//                           MPI_Allgather, MPI_Scatter, MPI_Reduce_scatter_block,
//                           MPI_Alltoall, MPI_Alltoallv (counts and
//                           displacements as ints), MPI_Barrier
//   dtypes                  MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T,
//                           MPI_UINT8_T; bf16 and fp16, which MPI does not
//                           know, move as MPI_UINT16_T and reduce with ops of
//                           our own (MPI_Op_create) that call pg.h's kernel
//   sum prod min max, band bor bxor
//                           MPI_SUM ... MPI_BXOR; AVG is MPI_SUM and then a
//                           division by the world size, as in the other backends
//   "in place" (send == recv) MPI_IN_PLACE: MPI forbids aliased buffers
//
// Errors: MPI's default is to abort the whole job with MPI's own words. We
// ask for MPI_ERRORS_RETURN instead and turn every failed call into the
// course's one line: "[rank R] error: MPI_Allreduce (all_reduce) failed:
// <MPI_Error_string>". A rank that dies is noticed by mpirun, which ends
// the others; MPI has no timeouts of its own, so --timeout does not apply.
//
//   sub-groups (pg_split)   MPI_Comm_split (MPI_UNDEFINED for no group)
//
// GPU buffers are staged through host memory by pg.h, as for the cpu backend.
// pg.h calls this file through the table at its end (pg_backend.h).
//
// Start-up (pg_mpi_start, called by dist_init): MPI_Init, then rank 0 tells
// the others, through MPI, the address of the rendezvous store it is about
// to serve (MASTER_ADDR, MASTER_PORT, unless already set), so that the
// course's start-up (rendezvous, version check) runs unchanged under mpirun.
// The build defines COURSE_MPI when it finds MPI (common/detect.mk); without
// it, the table says why there is no mpi backend, and --backend mpi says how
// to get one.
#ifndef COURSE_PG_MPI_H
#define COURSE_PG_MPI_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "launch_env.h"
#include "pg_backend.h"
#include "pg_types.h"

#define PG_MPI_HOW_TO_GET \
    "install OpenMPI (apt-get install libopenmpi-dev openmpi-bin) or MPICH and run make again (without MPI=0)"

#ifdef COURSE_MPI
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct mpi_pg {
    MPI_Comm comm;
    int rank, world_size;
} mpi_pg_t;

typedef struct mpi_req {
    MPI_Request request;
    const char *what;   // "isend" or "irecv", for messages
    int peer, count;    // irecv: the count the caller expects
    MPI_Datatype type;
    bool done;          // completed by a pg_test (MPI then forgets the request)
} mpi_req_t;

// One line naming the call, the course's operation and MPI's reason.
static inline void mpi_check(int rc, const char *call, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char reason[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, reason, &len) != MPI_SUCCESS) snprintf(reason, sizeof reason, "code %d", rc);
    die("%s (%s) failed: %s", call, what, reason);
}

static inline bool pg_mpi_running(void) {
    int started = 0, finished = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&finished);
    return started && !finished;
}

// MPI counts are ints: a larger buffer would have to be split.
static inline int mpi_count(size_t count, const char *what) {
    if (count > (size_t)INT_MAX)
        die("%s: %zu elements is more than MPI's int counts allow (%d); split the call", what,
            count, INT_MAX);
    return (int)count;
}

static inline MPI_Datatype mpi_type(dtype_t t) {
    switch (t) {
    case DTYPE_F32: return MPI_FLOAT;
    case DTYPE_F64: return MPI_DOUBLE;
    case DTYPE_I32: return MPI_INT32_T;
    case DTYPE_I64: return MPI_INT64_T;
    case DTYPE_U8: return MPI_UINT8_T;
    case DTYPE_BF16:
    case DTYPE_F16: return MPI_UINT16_T;    // moved as 16-bit words; reduced by our ops below
    }
    die("unknown dtype %d", (int)t);
}

// The type a reduction runs on: signed integers add and multiply as
// unsigned ones, which wrap around like two's complement (the course's
// promise, and the same bits) where signed overflow is undefined in C.
static inline MPI_Datatype mpi_reduce_type(dtype_t t, redop_t op) {
    bool wraps = op == OP_SUM || op == OP_PROD || op == OP_AVG;
    if (wraps && t == DTYPE_I32) return MPI_UINT32_T;
    if (wraps && t == DTYPE_I64) return MPI_UINT64_T;
    return mpi_type(t);
}

// bf16 and fp16 reductions: MPI calls fn(in, inout, len, type) and wants
// inout[i] = in[i] op inout[i]; pg.h's kernel does exactly that.
#define PG_MPI_FLOAT16_OP(name, dtype, op)                                             \
    static inline void mpi_##name(void *in, void *inout, int *len, MPI_Datatype *t) {  \
        (void)t;                                                                       \
        pg_combine_float16(inout, in, inout, (size_t)*len, dtype, op);                 \
    }
PG_MPI_FLOAT16_OP(bf16_sum, DTYPE_BF16, OP_SUM)
PG_MPI_FLOAT16_OP(bf16_prod, DTYPE_BF16, OP_PROD)
PG_MPI_FLOAT16_OP(bf16_min, DTYPE_BF16, OP_MIN)
PG_MPI_FLOAT16_OP(bf16_max, DTYPE_BF16, OP_MAX)
PG_MPI_FLOAT16_OP(f16_sum, DTYPE_F16, OP_SUM)
PG_MPI_FLOAT16_OP(f16_prod, DTYPE_F16, OP_PROD)
PG_MPI_FLOAT16_OP(f16_min, DTYPE_F16, OP_MIN)
PG_MPI_FLOAT16_OP(f16_max, DTYPE_F16, OP_MAX)

static inline MPI_Op mpi_float16_op(dtype_t t, redop_t op) {
    static MPI_User_function *const kernels[2][4] = {{mpi_bf16_sum, mpi_bf16_prod, mpi_bf16_min, mpi_bf16_max},
                                                     {mpi_f16_sum, mpi_f16_prod, mpi_f16_min, mpi_f16_max}};
    static MPI_Op made[2][4];
    static bool ready[2][4];
    int k = t == DTYPE_F16, i = op == OP_AVG ? OP_SUM : (int)op;   // OP_SUM .. OP_MAX are 0..3
    if (!ready[k][i]) {
        mpi_check(MPI_Op_create(kernels[k][i], 1, &made[k][i]), "MPI_Op_create", "16-bit float reduction");
        ready[k][i] = true;
    }
    return made[k][i];
}

static inline MPI_Op mpi_op(dtype_t t, redop_t op) {
    if (dtype_is_float16(t)) return mpi_float16_op(t, op);   // pg.h has refused bitwise ops on them
    switch (op) {
    case OP_SUM:
    case OP_AVG: return MPI_SUM;
    case OP_PROD: return MPI_PROD;
    case OP_MIN: return MPI_MIN;
    case OP_MAX: return MPI_MAX;
    case OP_BAND: return MPI_BAND;
    case OP_BOR: return MPI_BOR;
    case OP_BXOR: return MPI_BXOR;
    }
    die("unknown reduction op %d", (int)op);
}

// MPI forbids a send buffer that overlaps the receive buffer; the course
// allows the usual "in place" forms, which MPI spells MPI_IN_PLACE.
static inline const void *mpi_in_place_if(bool same, const void *send) {
    return same ? MPI_IN_PLACE : send;
}

// ---------------------------------------------------------------- start-up

// Rank 0 chooses where the rendezvous store will listen and tells everyone
// through MPI: mpirun sets no MASTER_ADDR, and the course's start-up (the
// store, the version check) needs one. A job on one host uses loopback.
static inline void pg_mpi_share_master(void) {
    int rank, on_this_host, world;
    MPI_Comm host;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
              "MPI_Comm_split_type", "start-up");
    MPI_Comm_size(host, &on_this_host);
    MPI_Comm_free(&host);
    char where[320] = "";   // "ADDR PORT"
    if (rank == 0) {
        char name[256] = "127.0.0.1";
        const char *addr = getenv("MASTER_ADDR");
        if (addr && addr[0]) snprintf(name, sizeof name, "%s", addr);
        else if (on_this_host < world && gethostname(name, sizeof name - 1) != 0)
            die("gethostname failed: %s", strerror(errno));
        int port = launch_env_int("MASTER_PORT", 0);
        if (port == 0) {   // a port the system says is free now
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET};
            socklen_t len = sizeof a;
            CHECK_SYS(fd);
            CHECK_SYS(bind(fd, (struct sockaddr *)&a, sizeof a));
            CHECK_SYS(getsockname(fd, (struct sockaddr *)&a, &len));
            port = ntohs(a.sin_port);
            close(fd);
        }
        snprintf(where, sizeof where, "%s %d", name, port);
    }
    mpi_check(MPI_Bcast(where, sizeof where, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast", "start-up");
    char *space = strrchr(where, ' ');
    if (!space) die("start-up: rank 0 sent no store address over MPI");
    *space = '\0';
    CHECK_SYS(setenv("MASTER_ADDR", where, 1));
    CHECK_SYS(setenv("MASTER_PORT", space + 1, 1));
}

// Called first thing by dist_init: under an MPI launcher, join MPI.
static inline void pg_mpi_start(void) {
    int started = 0;
    MPI_Initialized(&started);
    if (!launch_env_by_mpi() || started) return;
    int provided, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) die("MPI_Init failed (error %d): is this program started by mpirun?", rc);
    mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
              "start-up");
    pg_mpi_share_master();
}

// Called last by dist_finish.
static inline void pg_mpi_finish(void) {
    if (pg_mpi_running()) mpi_check(MPI_Finalize(), "MPI_Finalize", "finish");
}

// ---------------------------------------------------------------- the group

static inline mpi_pg_t *mpi_create(const pg_config_t *cfg) {
    if (!pg_mpi_running())
        die("--backend mpi needs a job started by an MPI launcher: mpirun -np N <program> "
            "--backend mpi (or srun); this process was not");
    mpi_pg_t *m = xcalloc(1, sizeof *m);
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm), "MPI_Comm_dup", "pg_create");
    mpi_check(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
              "pg_create");
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world_size);
    if (m->rank != cfg->rank || m->world_size != cfg->world_size)
        die("pg_create: the launcher's variables say rank %d of %d, MPI says rank %d of %d",
            cfg->rank, cfg->world_size, m->rank, m->world_size);
    return m;
}

// MPI_Comm_split: the ranks with our color, ordered by key (then by rank).
static inline mpi_pg_t *mpi_split(mpi_pg_t *parent, int color, int key) {
    MPI_Comm comm;
    mpi_check(MPI_Comm_split(parent->comm, color < 0 ? MPI_UNDEFINED : color, key, &comm), "MPI_Comm_split",
              "pg_split");
    if (comm == MPI_COMM_NULL) return NULL;
    mpi_pg_t *m = xcalloc(1, sizeof *m);
    m->comm = comm;
    mpi_check(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "pg_split");
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world_size);
    return m;
}

static inline void mpi_destroy(mpi_pg_t *m) {
    mpi_check(MPI_Comm_free(&m->comm), "MPI_Comm_free", "pg_destroy");
    free(m);
}

// "Open MPI v4.1.4" from MPI's long self-description.
static inline void mpi_library(char *out, size_t size) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(text, &len);
    text[strcspn(text, ",\n")] = '\0';
    snprintf(out, size, "%.100s", text);
}

// ---------------------------------------------------------------- point-to-point
//
// One tag: MPI delivers the messages between two ranks on one communicator
// in the order they were sent, which is the order the course promises.

static inline mpi_req_t *mpi_isend(mpi_pg_t *m, const void *buf, size_t count, dtype_t t, int peer) {
    mpi_req_t *r = xcalloc(1, sizeof *r);
    *r = (mpi_req_t){.what = "isend", .peer = peer, .type = mpi_type(t)};
    r->count = mpi_count(count, "isend");
    mpi_check(MPI_Isend(buf, r->count, r->type, peer, 0, m->comm, &r->request), "MPI_Isend", "isend");
    return r;
}

static inline mpi_req_t *mpi_irecv(mpi_pg_t *m, void *buf, size_t count, dtype_t t, int peer) {
    mpi_req_t *r = xcalloc(1, sizeof *r);
    *r = (mpi_req_t){.what = "irecv", .peer = peer, .type = mpi_type(t)};
    r->count = mpi_count(count, "irecv");
    mpi_check(MPI_Irecv(buf, r->count, r->type, peer, 0, m->comm, &r->request), "MPI_Irecv", "irecv");
    return r;
}

// A receive must get the count it asked for: MPI reports a longer message
// (MPI_ERR_TRUNCATE) but accepts a shorter one, which the course does not.
static inline void mpi_completed(mpi_req_t *r, MPI_Status *status) {
    r->done = true;
    if (strcmp(r->what, "irecv")) return;
    int got = 0;
    MPI_Get_count(status, r->type, &got);
    if (got != r->count)
        die("irecv from rank %d: %d elements arrived, %d expected (sender and receiver must "
            "agree on the count)", r->peer, got, r->count);
}

static inline bool mpi_test(mpi_req_t *r) {
    MPI_Status status;
    int flag = 0;
    if (r->done) return true;
    mpi_check(MPI_Test(&r->request, &flag, &status), "MPI_Test", r->what);
    if (flag) mpi_completed(r, &status);
    return flag;
}

static inline void mpi_wait_request(mpi_req_t *r) {
    MPI_Status status;
    if (!r->done) {
        mpi_check(MPI_Wait(&r->request, &status), "MPI_Wait", r->what);
        mpi_completed(r, &status);
    }
    free(r);
}

// ---------------------------------------------------------------- collectives
//
// Buffers are on the host (pg.h staged GPU buffers); counts are in elements.

static inline void mpi_broadcast(mpi_pg_t *m, void *buf, size_t count, dtype_t t, int root) {
    mpi_check(MPI_Bcast(buf, mpi_count(count, "broadcast"), mpi_type(t), root, m->comm),
              "MPI_Bcast", "broadcast");
}

static inline void mpi_reduce(mpi_pg_t *m, const void *send, void *recv, size_t count, dtype_t t,
                              redop_t op, int root) {
    const void *in = mpi_in_place_if(m->rank == root && send == recv, send);
    mpi_check(MPI_Reduce(in, recv, mpi_count(count, "reduce"), mpi_reduce_type(t, op),
                         mpi_op(t, op), root, m->comm), "MPI_Reduce", "reduce");
    if (op == OP_AVG && m->rank == root) pg_divide_elements(recv, count, t, m->world_size);
}

static inline void mpi_all_reduce(mpi_pg_t *m, const void *send, void *recv, size_t count,
                                  dtype_t t, redop_t op) {
    mpi_check(MPI_Allreduce(mpi_in_place_if(send == recv, send), recv,
                            mpi_count(count, "all_reduce"), mpi_reduce_type(t, op), mpi_op(t, op),
                            m->comm), "MPI_Allreduce", "all_reduce");
    if (op == OP_AVG) pg_divide_elements(recv, count, t, m->world_size);
}

// In place for gather and all_gather: a rank's input already sits in its
// own block of the output.
static inline bool mpi_is_block(const void *part, const void *all, int block, size_t count,
                                dtype_t t) {
    return all && part == (const char *)all + (size_t)block * count * dtype_size(t);
}

static inline void mpi_gather(mpi_pg_t *m, const void *send, void *recv, size_t count, dtype_t t,
                              int root) {
    int n = mpi_count(count, "gather");
    bool same = m->rank == root && mpi_is_block(send, recv, root, count, t);
    mpi_check(MPI_Gather(mpi_in_place_if(same, send), n, mpi_type(t), recv, n, mpi_type(t), root,
                         m->comm), "MPI_Gather", "gather");
}

static inline void mpi_all_gather(mpi_pg_t *m, const void *send, void *recv, size_t count,
                                  dtype_t t) {
    int n = mpi_count(count, "all_gather");
    bool same = mpi_is_block(send, recv, m->rank, count, t);
    mpi_check(MPI_Allgather(mpi_in_place_if(same, send), n, mpi_type(t), recv, n, mpi_type(t),
                            m->comm), "MPI_Allgather", "all_gather");
}

static inline void mpi_scatter(mpi_pg_t *m, const void *send, void *recv, size_t count, dtype_t t,
                               int root) {
    int n = mpi_count(count, "scatter");
    bool same = m->rank == root && mpi_is_block(recv, send, root, count, t);
    mpi_check(MPI_Scatter(send, n, mpi_type(t), same ? MPI_IN_PLACE : recv, n, mpi_type(t), root,
                          m->comm), "MPI_Scatter", "scatter");
}

static inline void mpi_reduce_scatter(mpi_pg_t *m, const void *send, void *recv, size_t count,
                                      dtype_t t, redop_t op) {
    mpi_check(MPI_Reduce_scatter_block(mpi_in_place_if(send == recv, send), recv,
                                       mpi_count(count, "reduce_scatter"), mpi_reduce_type(t, op),
                                       mpi_op(t, op), m->comm),
              "MPI_Reduce_scatter_block", "reduce_scatter");
    if (op == OP_AVG) pg_divide_elements(recv, count, t, m->world_size);
}

static inline void mpi_all_to_all(mpi_pg_t *m, const void *send, void *recv, size_t count,
                                  dtype_t t) {
    int n = mpi_count(count, "all_to_all");
    mpi_check(MPI_Alltoall(mpi_in_place_if(send == recv, send), n, mpi_type(t), recv, n,
                           mpi_type(t), m->comm), "MPI_Alltoall", "all_to_all");
}

// MPI_Alltoallv takes a count and a displacement per peer, both ints: the
// course's counts (size_t) and their prefix sums, each checked to fit.
static inline void mpi_counts_and_displacements(const size_t *counts, int n, int *ints, int *displs,
                                                const char *buffer) {
    size_t at = 0;
    for (int p = 0; p < n; p++) {
        ints[p] = mpi_count(counts[p], "all_to_all_v");
        if (at > (size_t)INT_MAX)
            die("all_to_all_v: the %s block for rank %d starts at element %zu, beyond MPI's int "
                "displacements (%d); split the call", buffer, p, at, INT_MAX);
        displs[p] = (int)at;
        at += counts[p];
    }
}

static inline void mpi_all_to_all_v(mpi_pg_t *m, const void *send, const size_t *send_counts, void *recv,
                                    const size_t *recv_counts, dtype_t t) {
    int n = m->world_size;
    int *ints = xcalloc(4 * (size_t)n, sizeof *ints);
    int *sc = ints, *sd = ints + n, *rc = ints + 2 * n, *rd = ints + 3 * n;
    mpi_counts_and_displacements(send_counts, n, sc, sd, "send");
    mpi_counts_and_displacements(recv_counts, n, rc, rd, "receive");
    // A rank with nothing to send or receive may pass NULL; MPI gets an
    // address all the same (no byte of a block of 0 is read or written).
    static char nothing;
    mpi_check(MPI_Alltoallv(send ? send : &nothing, sc, sd, mpi_type(t), recv ? recv : &nothing, rc, rd,
                            mpi_type(t), m->comm), "MPI_Alltoallv", "all_to_all_v");
    free(ints);
}

static inline void mpi_barrier(mpi_pg_t *m) {
    mpi_check(MPI_Barrier(m->comm), "MPI_Barrier", "barrier");
}

// ---------------------------------------------------------------- the table pg.h calls

static inline void *mpi_backend_create(const pg_config_t *cfg, const pg_group_id_t *id, double timeout_s) {
    (void)id, (void)timeout_s; // MPI has its own ranks, and no timeouts (see above)
    return mpi_create(cfg);
}

static inline void *mpi_backend_split(void *impl, int color, int key, const pg_group_id_t *id, store_t *store,
                                      double timeout_s) {
    (void)store, (void)timeout_s;
    mpi_pg_t *m = mpi_split(impl, color, key);
    if (m && (m->rank != id->rank || m->world_size != id->world_size))
        die("pg_split: MPI ranked this process %d of %d, the course %d of %d", m->rank, m->world_size, id->rank,
            id->world_size);
    return m;
}

static inline void mpi_backend_destroy(void *impl) { mpi_destroy(impl); }
static inline void mpi_backend_describe(void *impl, char *out, size_t size) { (void)impl, mpi_library(out, size); }
static inline void *mpi_backend_isend(void *impl, const void *buf, size_t count, dtype_t t, int peer) {
    return mpi_isend(impl, buf, count, t, peer);
}
static inline void *mpi_backend_irecv(void *impl, void *buf, size_t count, dtype_t t, int peer) {
    return mpi_irecv(impl, buf, count, t, peer);
}
static inline bool mpi_backend_test(void *impl, void *req) { return (void)impl, mpi_test(req); }
static inline void mpi_backend_wait(void *impl, void *req) { (void)impl, mpi_wait_request(req); }
static inline void mpi_backend_barrier(void *impl) { mpi_barrier(impl); }

static inline void mpi_backend_collective(void *impl, pg_coll_t c, const void *send, void *recv, size_t count,
                                          dtype_t t, redop_t op, int root) {
    mpi_pg_t *m = impl;
    switch (c) {
    case PG_BROADCAST: mpi_broadcast(m, recv, count, t, root); break;
    case PG_REDUCE: mpi_reduce(m, send, recv, count, t, op, root); break;
    case PG_ALL_REDUCE: mpi_all_reduce(m, send, recv, count, t, op); break;
    case PG_GATHER: mpi_gather(m, send, recv, count, t, root); break;
    case PG_ALL_GATHER: mpi_all_gather(m, send, recv, count, t); break;
    case PG_SCATTER: mpi_scatter(m, send, recv, count, t, root); break;
    case PG_REDUCE_SCATTER: mpi_reduce_scatter(m, send, recv, count, t, op); break;
    case PG_ALL_TO_ALL: mpi_all_to_all(m, send, recv, count, t); break;
    case PG_COLLECTIVES: break;
    }
}

static inline void mpi_backend_all_to_all_v(void *impl, const void *send, const size_t *send_counts, void *recv,
                                            const size_t *recv_counts, dtype_t t) {
    mpi_all_to_all_v(impl, send, send_counts, recv, recv_counts, t);
}

static inline const pg_backend_t *mpi_backend(void) {
    static const pg_backend_t table = {
        .name = "mpi", .host_buffers = true,
        .create = mpi_backend_create, .split = mpi_backend_split, .destroy = mpi_backend_destroy,
        .describe = mpi_backend_describe, .isend = mpi_backend_isend, .irecv = mpi_backend_irecv,
        .test = mpi_backend_test, .wait = mpi_backend_wait, .collective = mpi_backend_collective,
        .all_to_all_v = mpi_backend_all_to_all_v, .barrier = mpi_backend_barrier,
    };
    return &table;
}

#else   // ---------------------------------------------------------------- no MPI in this build

static inline bool pg_mpi_running(void) { return false; }
static inline void pg_mpi_start(void) {}
static inline void pg_mpi_finish(void) {}

static inline const pg_backend_t *mpi_backend(void) {
    static const pg_backend_t table = PG_MISSING_BACKEND("mpi", "this build has no MPI; " PG_MPI_HOW_TO_GET);
    return &table;
}
#endif
#endif
