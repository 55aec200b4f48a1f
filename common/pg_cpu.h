// pg_cpu.h - the cpu backend of pg.h: collectives between processes, on
// host memory, over TCP sockets and (between ranks of one host) shared memory.
//
// pg.h calls it through the table at the end of this file (pg_backend.h
// explains the tables). It is built in four layers, each using only the
// one below it:
//   pg_cpu_stream.h      layer 1: byte streams (TCP, shared-memory rings)
//   pg_cpu_message.h     layer 2: messages with a checked header, single copy
//   pg_cpu_progress.h    layer 3: the progress engine, and posting work
//   pg_cpu_algorithms.h  layer 4: ring, recursive doubling, tree - the lesson
//   pg_cpu_setup.h       how the ranks connect (TCP, shared memory), create, destroy
//
//   1. Transports. To every other rank we hold a byte stream in each
//      direction: a TCP connection, or, when the peer runs on the same host,
//      a pair of ring buffers in shared memory (one copy in, one copy out,
//      no system call; written and read in 64 KiB chunks, so that the two
//      copies overlap). The TCP connection exists in both cases: it is how
//      the ranks meet, and the kernel closes it when a process dies, however
//      it dies - our only reliable sign that a peer is gone. Ranks of one
//      host that have a core each are bound to it, as mpirun binds them
//      (cpu_bind_to_cores in pg_cpu_setup.h says why).
//   2. Messages. Every send becomes a frame: a 24-byte header (a magic
//      number, which operation sent it, the payload size, and an address)
//      and the payload, padded to 8 bytes. The receiver checks that both
//      sides are in the same operation with the same size, instead of
//      silently mixing up bytes. Between ranks of one host, a payload of
//      512 KiB to 8 MiB may travel as its address only, the receiver
//      copying it straight out of the sender's memory ("single copy", as MPI
//      does): COURSE_SINGLE_COPY=1, off by default (it lost to the rings).
//   3. The progress engine. isend/irecv only queue work. Bytes move when the
//      caller is inside a pg_ call (test, wait, or a blocking collective): one
//      loop that writes what it can to every peer and reads whatever has
//      arrived from every peer. A message that arrives before its receive
//      was posted waits in the stream ("parked") and flows into the
//      receive's buffer once it is posted; a rank that has been idle for a
//      millisecond takes such messages into buffers of its own, so two ranks
//      that both send first and receive second never deadlock, however large
//      the messages and however small the rings and the kernel's buffers.
//      A waiting rank spins, then yields its core, and sleeps only after a
//      tenth of a second (cpu_idle says why).
//      We chose this over a progress thread: no locks, every byte moves in
//      one visible loop. The price is that an isend does not advance while
//      the caller computes (as in MPI without an asynchronous progress
//      thread); pg_isend does push the message out at once when the link is
//      idle, so small messages usually leave immediately.
//   4. Algorithms: the collectives, written with isend/irecv/wait. Large
//      all-reduces use a ring (reduce-scatter then all-gather), small ones
//      recursive doubling, all-to-all with counts per peer a pairwise
//      exchange; each is explained where it is defined.
//
// Waiting never lasts forever: when nothing has moved for the group's
// timeout, or a peer we wait for has closed its connection, the process
// stops with a message that names the operation and the peer.
#ifndef COURSE_PG_CPU_H
#define COURSE_PG_CPU_H

#include "pg_backend.h"
#include "pg_cpu_progress.h"
#include "pg_cpu_algorithms.h"
#include "pg_cpu_setup.h"

// ---------------------------------------------------------------- the table pg.h calls
//
// Host buffers only (pg.h stages GPU buffers through host memory). The
// algorithms move bytes, so the collectives that do not reduce take a byte
// count.

static inline void *cpu_backend_create(const pg_config_t *cfg, const pg_group_id_t *id, double timeout_s) {
    return cpu_create(cfg->store, id, timeout_s, NULL);
}

// A sub-group gets sockets and rings of its own; ranks of no group take no part.
static inline void *cpu_backend_split(void *impl, int color, int key, const pg_group_id_t *id, store_t *store,
                                      double timeout_s) {
    (void)key; // id already says which rank this one is in its group
    return color < 0 ? NULL : cpu_create(store, id, timeout_s, impl);
}

static inline void cpu_backend_destroy(void *impl) { cpu_destroy(impl); }

static inline void cpu_backend_describe(void *impl, char *out, size_t size) {
    snprintf(out, size, "%s", cpu_transport(impl));
}

static inline void *cpu_backend_isend(void *impl, const void *buf, size_t count, dtype_t t, int peer) {
    return cpu_isend(impl, buf, count * dtype_size(t), peer);
}

static inline void *cpu_backend_irecv(void *impl, void *buf, size_t count, dtype_t t, int peer) {
    return cpu_irecv(impl, buf, count * dtype_size(t), peer);
}

static inline bool cpu_backend_test(void *impl, void *req) { return cpu_test(impl, req); }
static inline void cpu_backend_wait(void *impl, void *req) { cpu_wait_request(impl, req); }
static inline void cpu_backend_barrier(void *impl) { cpu_barrier(impl); }

static inline void cpu_backend_collective(void *impl, pg_coll_t c, const void *send, void *recv, size_t count,
                                          dtype_t t, redop_t op, int root) {
    cpu_pg_t *pg = impl;
    size_t bytes = count * dtype_size(t);
    switch (c) {
    case PG_BROADCAST: cpu_broadcast(pg, recv, bytes, root); break;
    case PG_REDUCE: cpu_reduce(pg, send, recv, count, t, op, root); break;
    case PG_ALL_REDUCE: cpu_all_reduce(pg, send, recv, count, t, op); break;
    case PG_GATHER: cpu_gather(pg, send, recv, bytes, root); break;
    case PG_ALL_GATHER: cpu_all_gather(pg, send, recv, bytes); break;
    case PG_SCATTER: cpu_scatter(pg, send, recv, bytes, root); break;
    case PG_REDUCE_SCATTER: cpu_reduce_scatter(pg, send, recv, count, t, op); break;
    case PG_ALL_TO_ALL: cpu_all_to_all(pg, send, recv, bytes); break;
    case PG_COLLECTIVES: break;
    }
}

static inline void cpu_backend_all_to_all_v(void *impl, const void *send, const size_t *send_counts, void *recv,
                                            const size_t *recv_counts, dtype_t t) {
    cpu_all_to_all_v(impl, send, send_counts, recv, recv_counts, dtype_size(t));
}

static inline const pg_backend_t *cpu_backend(void) {
    static const pg_backend_t table = {
        .name = "cpu", .host_buffers = true,
        .create = cpu_backend_create, .split = cpu_backend_split, .destroy = cpu_backend_destroy,
        .describe = cpu_backend_describe, .isend = cpu_backend_isend, .irecv = cpu_backend_irecv,
        .test = cpu_backend_test, .wait = cpu_backend_wait, .collective = cpu_backend_collective,
        .all_to_all_v = cpu_backend_all_to_all_v, .barrier = cpu_backend_barrier,
    };
    return &table;
}

#endif
