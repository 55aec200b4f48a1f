// pg.h - process groups: one API for communication between ranks, three backends.
//
// A process group is the set of ranks of a job plus the means to move data
// between them, as in torch.distributed. Chapters call pg_all_reduce() and
// friends and do not care how the bytes travel:
//
//   nccl  (pg_nccl.h) NCCL on GPU buffers, one rank per GPU. Built only in
//         the CUDA build.
//   cpu   (pg_cpu.h)  our own implementation over TCP sockets, with shared
//         memory between the ranks of one host. Works everywhere: on host
//         buffers, and on GPU buffers too by copying them through host memory
//         ("staging"), which is how four ranks can share one GPU (NCCL refuses
//         two ranks on one GPU).
//   mpi   (pg_mpi.h)  MPI (OpenMPI, MPICH), the engine of CPU clusters, for
//         a job started by mpirun or srun. Built where MPI is found.
//   auto  nccl when this is a CUDA build, the device is a GPU and every rank
//         on this host has a GPU of its own; otherwise cpu (mpi when an MPI
//         launcher started the job). All ranks must agree, so they vote
//         through the rendezvous store.
//
// The promises the backends keep (but mpi has no timeouts of its own: pg_mpi.h):
//   - counts are in elements, never bytes; any count >= 0, any world size >= 1;
//   - collectives are blocking for the host and every rank must call the same
//     collectives in the same order with the same count and dtype;
//   - after an all-reduce every rank holds the same bytes (data-parallel
//     replicas depend on it): each element is reduced once, in a fixed order,
//     and that result is what everyone receives;
//   - AVG is SUM followed by a division by the world size (integer division
//     for integer types); BAND/BOR/BXOR exist only for integer types;
//   - nothing waits forever: a dead peer or a timeout ends the process with a
//     one-line error that names the operation and, where known, the peer.
//     The timeout counts from the last moment any data moved, so a long
//     transfer that progresses never times out, and a stuck one does;
//   - a process group is used from one thread at a time;
//   - GPU buffers: a blocking call reads its inputs after the work queued
//     before it on the legacy default stream (and on streams that wait for
//     it, as streams created with default flags do). Work on a non-blocking
//     stream (cudaStreamNonBlocking, as chapter 08's model uses) must be
//     finished first - cudaStreamSynchronize, or an event: that is what
//     pg_all_reduce_after takes. When the call returns, its result is in
//     the caller's buffer and visible to work on any stream.
//
// The types and the element-wise reduction kernels, which both backends
// share, are in pg_types.h. This file holds the functions the chapters call,
// which check their arguments, stage GPU buffers when needed and hand over
// to a backend.
#ifndef COURSE_PG_H
#define COURSE_PG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "pg_types.h"

// The backends. Each defines its own struct and functions on host (cpu) or
// device (nccl) buffers; the dispatch below picks one.
#include "pg_cpu.h"
#include "pg_debug.h"
#include "pg_nccl.h"
#include "pg_mpi.h"   // mpi: under mpirun or srun (a build that found MPI)

// ---------------------------------------------------------------- the process group

struct pg {
    backend_kind_t backend;          // the one in use: BACKEND_CPU or BACKEND_NCCL
    int rank, world_size;
    device_t device;               // a copy of the caller's device
    bool stage;                    // cpu backend, GPU buffers: copy through host memory
    cpu_pg_t *cpu;
    mpi_pg_t *mpi;
#ifdef COURSE_CUDA
    nccl_pg_t *nccl;
#endif
    void *host[2];                 // staging buffers, grown on demand and kept
    size_t host_bytes[2];
    char description[400];
    pg_debug_t debug;              // COURSE_DEBUG (pg_debug.h)
};

struct pg_request {
    pg_t *pg;
    cpu_req_t *cpu;
    mpi_req_t *mpi;
#ifdef COURSE_CUDA
    nccl_req_t *nccl;
#endif
    void *staged;                  // host copy of the caller's GPU buffer (staging only)
    void *device_dst;              // irecv with staging: where the bytes go at the end
    size_t bytes;
};

static inline backend_kind_t pg_backend(const pg_t *pg) { return pg->backend; }
static inline const char *pg_describe(const pg_t *pg) { return pg->description; }
static inline int pg_rank(const pg_t *pg) { return pg->rank; }
static inline int pg_world_size(const pg_t *pg) { return pg->world_size; }
static inline const device_t *pg_device(const pg_t *pg) { return &pg->device; }

// ---------------------------------------------------------------- choosing the backend

// Can this rank run NCCL? If not, *why says so in words.
static inline bool pg_nccl_possible(const pg_config_t *cfg, char *why, size_t size) {
#ifndef COURSE_CUDA
    (void)cfg;
    snprintf(why, size, "this is a CPU-only build, without NCCL");
    return false;
#else
    const device_t *d = cfg->device;
    if (!d || !device_is_cuda(d)) {
        snprintf(why, size, "the device is the CPU, and NCCL works on GPU buffers only");
        return false;
    }
    if (cfg->local_world_size > d->gpu_count) {
        snprintf(why, size, "%d ranks on this host share %d GPU%s, and NCCL needs one GPU per "
                 "rank (two ranks on one GPU fail with 'Duplicate GPU detected')",
                 cfg->local_world_size, d->gpu_count, d->gpu_count == 1 ? "" : "s");
        return false;
    }
    return true;
#endif
}

// auto: nccl only if every rank can; the ranks vote through the store, so that one host with too few GPUs makes the whole job use cpu
// (a job whose ranks use different backends would hang).
static inline backend_kind_t pg_vote_backend(const pg_config_t *cfg, bool possible, int generation,
                                             double timeout_s) {
    if (cfg->world_size == 1) return possible ? BACKEND_NCCL : BACKEND_CPU;
    char key[64];
    snprintf(key, sizeof key, "pg%d/cannot_nccl", generation);
    return store_vote(cfg->store, key, cfg->rank, cfg->world_size, possible, timeout_s)
               ? BACKEND_NCCL : BACKEND_CPU;
}

static inline backend_kind_t pg_choose_backend(const pg_config_t *cfg, int generation,
                                               double timeout_s) {
    char why[256];
    bool possible = pg_nccl_possible(cfg, why, sizeof why);
    if (cfg->backend == BACKEND_CPU || cfg->backend == BACKEND_MPI) return cfg->backend;
    if (cfg->backend == BACKEND_NCCL) {
        if (!possible)
            die("--backend nccl cannot run here: %s. NCCL runs one rank per GPU; use "
                "--backend cpu (or auto, which picks cpu in this case) to share GPUs or run "
                "on the CPU", why);
        return BACKEND_NCCL;
    }
#ifdef COURSE_CUDA
    backend_kind_t vote = pg_vote_backend(cfg, possible, generation, timeout_s);
#else
    (void)generation, (void)timeout_s;
    backend_kind_t vote = BACKEND_CPU;   // no rank of a CPU-only build can run NCCL
#endif
    // Under mpirun or srun (and an MPI build), MPI rather than our own cpu backend.
    return vote == BACKEND_CPU && pg_mpi_running() ? BACKEND_MPI : vote;
}

static inline void pg_check_config(const pg_config_t *cfg) {
    if (!cfg) die("pg_create: no configuration given");
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        die("pg_create: rank %d is not in a world of %d ranks", cfg->rank, cfg->world_size);
    if (cfg->world_size > 1 && !cfg->store)
        die("pg_create: a job of %d ranks needs a connected store (from rendezvous())",
            cfg->world_size);
    if ((unsigned)cfg->backend > BACKEND_MPI) die("pg_create: unknown backend %d", (int)cfg->backend);
}

static inline void pg_describe_cpu(pg_t *pg, const pg_config_t *cfg) {
    char staging[120] = "";
    if (pg->stage && cfg->local_world_size > pg->device.gpu_count)
        snprintf(staging, sizeof staging, "%d ranks share %d GPU%s: buffers staged through "
                 "host memory; ", cfg->local_world_size, pg->device.gpu_count,
                 pg->device.gpu_count == 1 ? "" : "s");
    else if (pg->stage)
        snprintf(staging, sizeof staging, "GPU buffers staged through host memory; ");
    snprintf(pg->description, sizeof pg->description, "cpu (%s%s)", staging,
             cpu_transport(pg->cpu));
}

static inline void pg_describe_mpi(pg_t *pg) {
    char library[200];
    mpi_library(library, sizeof library);
    snprintf(pg->description, sizeof pg->description, "mpi (%s%s)",
             pg->stage ? "GPU buffers staged through host memory; " : "", library);
}

static inline pg_t *pg_create(const pg_config_t *cfg) {
    pg_check_config(cfg);
    pg_t *pg = xcalloc(1, sizeof *pg);
    pg->rank = cfg->rank;
    pg->world_size = cfg->world_size;
    if (cfg->device) pg->device = *cfg->device;
    else device_cpu_name(&pg->device);   // kind 0 = DEVICE_CPU: host buffers
    double timeout = cfg->timeout_s > 0 ? cfg->timeout_s : course_timeout_default();
    int generation = pg_next_generation();
    pg->debug = pg_debug_start(cfg->store, cfg->rank, cfg->world_size, generation, timeout);
    pg->backend = pg_choose_backend(cfg, generation, timeout);
#ifdef COURSE_CUDA
    if (pg->backend == BACKEND_NCCL) {
        pg->nccl = nccl_create(cfg, timeout, generation);
        snprintf(pg->description, sizeof pg->description, "nccl (one GPU per rank)");
        return pg;
    }
#endif
    pg->stage = device_is_cuda(&pg->device);
    if (pg->backend == BACKEND_MPI) {
        pg->mpi = mpi_create(cfg);
        pg_describe_mpi(pg);
        return pg;
    }
    pg->cpu = cpu_create(cfg, timeout, generation);
    pg_describe_cpu(pg, cfg);
    return pg;
}

static inline void pg_destroy(pg_t *pg) {
    if (!pg) return;
#ifdef COURSE_CUDA
    if (pg->nccl) nccl_destroy(pg->nccl);
#endif
    if (pg->cpu) cpu_destroy(pg->cpu);
    if (pg->mpi) mpi_destroy(pg->mpi);
    free(pg->host[0]);
    free(pg->host[1]);
    free(pg);
}

// ---------------------------------------------------------------- argument checks

// count elements of t, times `copies` (world_size for the per-rank buffers of
// gather and friends), in bytes; a count so large that the bytes overflow is
// a bug in the caller, not a reason to corrupt memory.
static inline size_t pg_bytes(const pg_t *pg, size_t count, dtype_t t, size_t copies,
                              const char *what) {
    if (!dtype_valid(t)) die("%s: unknown dtype %d", what, (int)t);
    size_t size = dtype_size(t);
    if (count > SIZE_MAX / size / copies)
        die("%s: %zu elements of %s on %d ranks do not fit in memory", what, count,
            dtype_name(t), pg->world_size);
    return count * size * copies;
}

static inline void pg_check_rank(const pg_t *pg, int who, const char *role, const char *what) {
    if (who < 0 || who >= pg->world_size)
        die("%s: %s %d is not a rank of this group (ranks 0..%d)", what, role, who,
            pg->world_size - 1);
}

static inline void pg_check_peer(const pg_t *pg, int peer, const char *what) {
    pg_check_rank(pg, peer, "peer", what);
    if (peer == pg->rank)
        die("%s: rank %d cannot send to or receive from itself; copy the buffer instead",
            what, peer);
}

static inline void pg_check_buffer(const void *buf, size_t count, const char *name,
                                   const char *what) {
    if (!buf && count > 0) die("%s: the %s buffer is NULL", what, name);
}

// ---------------------------------------------------------------- staging (cpu backend, GPU buffers)
//
// The cpu backend only touches host memory. When the caller's buffers are on
// a GPU we copy inputs to a host buffer, communicate, and copy the result
// back: slower than NCCL, but it works with any number of ranks per GPU.

static inline void *pg_host_buffer(pg_t *pg, int slot, size_t bytes) {
    if (pg->host_bytes[slot] < bytes) {
        free(pg->host[slot]);
        pg->host[slot] = xmalloc(bytes);
        pg->host_bytes[slot] = bytes;
    }
    return pg->host[slot];
}

// A host pointer with the contents of the caller's input buffer.
static inline const void *pg_stage_in(pg_t *pg, int slot, const void *buf, size_t bytes) {
    if (!pg->stage || !buf) return buf;
    void *host = pg_host_buffer(pg, slot, bytes);
    device_to_host(&pg->device, host, buf, bytes);
    return host;
}

// A host pointer the backend may write the result to.
static inline void *pg_stage_out(pg_t *pg, int slot, void *buf, size_t bytes) {
    if (!pg->stage || !buf) return buf;
    return pg_host_buffer(pg, slot, bytes);
}

// Copy the result back to the caller's buffer.
static inline void pg_unstage(pg_t *pg, void *buf, const void *host, size_t bytes) {
    if (pg->stage && buf) device_from_host(&pg->device, buf, host, bytes);
}

// ---------------------------------------------------------------- point-to-point

static inline pg_request_t *pg_isend(pg_t *pg, const void *buf, size_t count, dtype_t t,
                                     int peer) {
    size_t bytes = pg_bytes(pg, count, t, 1, "isend");
    pg_check_peer(pg, peer, "isend");
    pg_check_buffer(buf, count, "send", "isend");
    pg_request_t *req = xcalloc(1, sizeof *req);
    req->pg = pg;
    req->bytes = bytes;
#ifdef COURSE_CUDA
    if (pg->nccl) {
        req->nccl = nccl_isend(pg->nccl, buf, count, t, peer);
        return req;
    }
#endif
    if (pg->stage) {   // the copy is taken now: the caller may reuse buf at once
        req->staged = xmalloc(bytes);
        device_to_host(&pg->device, req->staged, buf, bytes);
        buf = req->staged;
    }
    if (pg->mpi) req->mpi = mpi_isend(pg->mpi, buf, count, t, peer);
    else req->cpu = cpu_isend(pg->cpu, buf, bytes, peer);
    return req;
}

static inline pg_request_t *pg_irecv(pg_t *pg, void *buf, size_t count, dtype_t t, int peer) {
    size_t bytes = pg_bytes(pg, count, t, 1, "irecv");
    pg_check_peer(pg, peer, "irecv");
    pg_check_buffer(buf, count, "receive", "irecv");
    pg_request_t *req = xcalloc(1, sizeof *req);
    req->pg = pg;
    req->bytes = bytes;
#ifdef COURSE_CUDA
    if (pg->nccl) {
        req->nccl = nccl_irecv(pg->nccl, buf, count, t, peer);
        return req;
    }
#endif
    if (pg->stage) {
        req->staged = xmalloc(bytes);
        req->device_dst = buf;
        buf = req->staged;
    }
    if (pg->mpi) req->mpi = mpi_irecv(pg->mpi, buf, count, t, peer);
    else req->cpu = cpu_irecv(pg->cpu, buf, bytes, peer);
    return req;
}

// A staged receive is complete for the caller once its bytes are on the GPU.
static inline void pg_request_unstage(pg_request_t *req) {
    if (req->device_dst) {
        device_from_host(&req->pg->device, req->device_dst, req->staged, req->bytes);
        req->device_dst = NULL;
    }
}

// Has it completed? Never blocks (it does move data along, see pg_cpu.h).
// A completed request must still be passed to pg_wait, which frees it.
static inline bool pg_test(pg_request_t *req) {
    bool done;
#ifdef COURSE_CUDA
    if (req->nccl) return nccl_test(req->pg->nccl, req->nccl);
#endif
    done = req->mpi ? mpi_test(req->mpi) : cpu_test(req->pg->cpu, req->cpu);
    if (done) pg_request_unstage(req);
    return done;
}

// Blocks until the request completes (or the pg's timeout ends the program),
// then frees it.
static inline void pg_wait(pg_request_t *req) {
#ifdef COURSE_CUDA
    if (req->nccl) nccl_wait_request(req->pg->nccl, req->nccl);
#endif
    if (req->cpu) {
        cpu_wait_request(req->pg->cpu, req->cpu);
        pg_request_unstage(req);
    }
    if (req->mpi) {
        mpi_wait_request(req->mpi);
        pg_request_unstage(req);
    }
    free(req->staged);
    free(req);
}

static inline void pg_send(pg_t *pg, const void *buf, size_t count, dtype_t t, int peer) {
    pg_wait(pg_isend(pg, buf, count, t, peer));
}

static inline void pg_recv(pg_t *pg, void *buf, size_t count, dtype_t t, int peer) {
    pg_wait(pg_irecv(pg, buf, count, t, peer));
}

// ---------------------------------------------------------------- collectives
//
// Each function checks its arguments, returns at once for count 0 (every
// rank passes the same count, so every rank returns), and then either calls
// NCCL or stages the buffers and calls the cpu backend.

// COURSE_DEBUG=INFO|DETAIL (pg_debug.h): name the call and everything the
// ranks must agree on; root < 0 and op < 0 when the collective has none.
static inline void pg_announce(pg_t *pg, const char *name, size_t count, dtype_t t, int op,
                               int root) {
    if (pg->debug.level == PG_DEBUG_OFF) return;
    char what[160];
    int n = snprintf(what, sizeof what, "%s(%zu x %s", name, count, dtype_name(t));
    if (op >= 0) n += snprintf(what + n, sizeof what - (size_t)n, ", %s", redop_name((redop_t)op));
    if (root >= 0) n += snprintf(what + n, sizeof what - (size_t)n, ", root %d", root);
    snprintf(what + n, sizeof what - (size_t)n, ")");
    pg_debug_collective(&pg->debug, what);
}

static inline void pg_broadcast(pg_t *pg, void *buf, size_t count, dtype_t t, int root) {
    pg_announce(pg, "broadcast", count, t, -1, root);
    size_t bytes = pg_bytes(pg, count, t, 1, "broadcast");
    pg_check_rank(pg, root, "root", "broadcast");
    pg_check_buffer(buf, count, "", "broadcast");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_broadcast(pg->nccl, buf, count, t, root); return; }
#endif
    void *host = pg_stage_out(pg, 0, buf, bytes);
    if (pg->rank == root && host != buf) device_to_host(&pg->device, host, buf, bytes);
    if (pg->mpi) mpi_broadcast(pg->mpi, host, count, t, root);
    else cpu_broadcast(pg->cpu, host, bytes, root);
    if (pg->rank != root) pg_unstage(pg, buf, host, bytes);
}

// recv is used at the root only (other ranks may pass NULL).
static inline void pg_reduce(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                             redop_t op, int root) {
    pg_announce(pg, "reduce", count, t, (int)op, root);
    size_t bytes = pg_bytes(pg, count, t, 1, "reduce");
    pg_check_reduction(t, op, "reduce");
    pg_check_rank(pg, root, "root", "reduce");
    pg_check_buffer(send, count, "send", "reduce");
    if (pg->rank == root) pg_check_buffer(recv, count, "receive", "reduce");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_reduce(pg->nccl, send, recv, count, t, op, root); return; }
#endif
    void *out = pg->rank == root ? recv : NULL;
    const void *hs = pg_stage_in(pg, 0, send, bytes);
    void *hr = pg_stage_out(pg, 1, out, bytes);
    if (pg->mpi) mpi_reduce(pg->mpi, hs, hr, count, t, op, root);
    else cpu_reduce(pg->cpu, hs, hr, count, t, op, root);
    pg_unstage(pg, out, hr, bytes);
}

static inline void pg_all_reduce(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t, redop_t op) {
    pg_announce(pg, "all_reduce", count, t, (int)op, -1);
    size_t bytes = pg_bytes(pg, count, t, 1, "all_reduce");
    pg_check_reduction(t, op, "all_reduce");
    pg_check_buffer(send, count, "send", "all_reduce");
    pg_check_buffer(recv, count, "receive", "all_reduce");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_all_reduce(pg->nccl, send, recv, count, t, op); return; }
#endif
    const void *hs = pg_stage_in(pg, 0, send, bytes);
    void *hr = pg_stage_out(pg, 1, recv, bytes);
    if (pg->mpi) mpi_all_reduce(pg->mpi, hs, hr, count, t, op);
    else cpu_all_reduce(pg->cpu, hs, hr, count, t, op);
    pg_unstage(pg, recv, hr, bytes);
}

// recv holds world_size * count elements at the root (others may pass NULL).
static inline void pg_gather(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                             int root) {
    pg_announce(pg, "gather", count, t, -1, root);
    size_t bytes = pg_bytes(pg, count, t, 1, "gather");
    size_t all = pg_bytes(pg, count, t, (size_t)pg->world_size, "gather");
    pg_check_rank(pg, root, "root", "gather");
    pg_check_buffer(send, count, "send", "gather");
    if (pg->rank == root) pg_check_buffer(recv, count, "receive", "gather");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_gather(pg->nccl, send, recv, count, t, root); return; }
#endif
    void *out = pg->rank == root ? recv : NULL;
    const void *hs = pg_stage_in(pg, 0, send, bytes);
    void *hr = pg_stage_out(pg, 1, out, all);
    if (pg->mpi) mpi_gather(pg->mpi, hs, hr, count, t, root);
    else cpu_gather(pg->cpu, hs, hr, bytes, root);
    pg_unstage(pg, out, hr, all);
}

// count elements per rank; recv holds world_size * count, rank r's part at r * count.
static inline void pg_all_gather(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t) {
    pg_announce(pg, "all_gather", count, t, -1, -1);
    size_t bytes = pg_bytes(pg, count, t, 1, "all_gather");
    size_t all = pg_bytes(pg, count, t, (size_t)pg->world_size, "all_gather");
    pg_check_buffer(send, count, "send", "all_gather");
    pg_check_buffer(recv, count, "receive", "all_gather");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_all_gather(pg->nccl, send, recv, count, t); return; }
#endif
    const void *hs = pg_stage_in(pg, 0, send, bytes);
    void *hr = pg_stage_out(pg, 1, recv, all);
    if (pg->mpi) mpi_all_gather(pg->mpi, hs, hr, count, t);
    else cpu_all_gather(pg->cpu, hs, hr, bytes);
    pg_unstage(pg, recv, hr, all);
}

// send holds world_size * count elements at the root (others may pass NULL).
static inline void pg_scatter(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                              int root) {
    pg_announce(pg, "scatter", count, t, -1, root);
    size_t bytes = pg_bytes(pg, count, t, 1, "scatter");
    size_t all = pg_bytes(pg, count, t, (size_t)pg->world_size, "scatter");
    pg_check_rank(pg, root, "root", "scatter");
    if (pg->rank == root) pg_check_buffer(send, count, "send", "scatter");
    pg_check_buffer(recv, count, "receive", "scatter");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_scatter(pg->nccl, send, recv, count, t, root); return; }
#endif
    const void *in = pg->rank == root ? send : NULL;
    const void *hs = pg_stage_in(pg, 0, in, all);
    void *hr = pg_stage_out(pg, 1, recv, bytes);
    if (pg->mpi) mpi_scatter(pg->mpi, hs, hr, count, t, root);
    else cpu_scatter(pg->cpu, hs, hr, bytes, root);
    pg_unstage(pg, recv, hr, bytes);
}

// send holds world_size * count elements; rank r receives the reduction of block r.
static inline void pg_reduce_scatter(pg_t *pg, const void *send, void *recv, size_t count,
                                     dtype_t t, redop_t op) {
    pg_announce(pg, "reduce_scatter", count, t, (int)op, -1);
    size_t bytes = pg_bytes(pg, count, t, 1, "reduce_scatter");
    size_t all = pg_bytes(pg, count, t, (size_t)pg->world_size, "reduce_scatter");
    pg_check_reduction(t, op, "reduce_scatter");
    pg_check_buffer(send, count, "send", "reduce_scatter");
    pg_check_buffer(recv, count, "receive", "reduce_scatter");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_reduce_scatter(pg->nccl, send, recv, count, t, op); return; }
#endif
    const void *hs = pg_stage_in(pg, 0, send, all);
    void *hr = pg_stage_out(pg, 1, recv, bytes);
    if (pg->mpi) mpi_reduce_scatter(pg->mpi, hs, hr, count, t, op);
    else cpu_reduce_scatter(pg->cpu, hs, hr, count, t, op);
    pg_unstage(pg, recv, hr, bytes);
}

// count elements per peer: block p of send goes to rank p, and block p of
// recv comes from rank p.
static inline void pg_all_to_all(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t) {
    pg_announce(pg, "all_to_all", count, t, -1, -1);
    size_t bytes = pg_bytes(pg, count, t, 1, "all_to_all");
    size_t all = pg_bytes(pg, count, t, (size_t)pg->world_size, "all_to_all");
    pg_check_buffer(send, count, "send", "all_to_all");
    pg_check_buffer(recv, count, "receive", "all_to_all");
    if (count == 0) return;
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_all_to_all(pg->nccl, send, recv, count, t); return; }
#endif
    const void *hs = pg_stage_in(pg, 0, send, all);
    void *hr = pg_stage_out(pg, 1, recv, all);
    if (pg->mpi) mpi_all_to_all(pg->mpi, hs, hr, count, t);
    else cpu_all_to_all(pg->cpu, hs, hr, bytes);
    pg_unstage(pg, recv, hr, all);
}

// Returns once every rank has called it.
static inline void pg_barrier(pg_t *pg) {
    pg_debug_collective(&pg->debug, "barrier()");
#ifdef COURSE_CUDA
    if (pg->nccl) { nccl_barrier(pg->nccl); return; }
#endif
    if (pg->mpi) mpi_barrier(pg->mpi);
    else cpu_barrier(pg->cpu);
}

#ifdef COURSE_CUDA
// ---------------------------------------------------------------- overlapping with the GPU
//
// Every call above returns when its result is ready. DDP on a GPU wants
// more: to all-reduce one bucket of gradients while the GPU is still
// computing the next, so that communication hides behind computation.
// pg_all_reduce_after(pg, buf, ..., ready) all-reduces (in place) a GPU
// buffer that becomes final when the event `ready` happens:
//   - nccl: queued on the group's stream behind `ready`; returns at once.
//   - cpu (GPU buffers staged through host memory): waits for `ready`,
//     then runs now; no overlap, the same result.
// pg_wait_queued returns when everything queued so has finished (or stops
// the job with a message, as the blocking calls do).
static inline void pg_all_reduce_after(pg_t *pg, void *buf, size_t count, dtype_t t, redop_t op,
                                       cudaEvent_t ready) {
    if (pg->nccl) {
        pg_announce(pg, "all_reduce", count, t, (int)op, -1);
        pg_bytes(pg, count, t, 1, "all_reduce");
        pg_check_reduction(t, op, "all_reduce");
        if (count > 0) nccl_all_reduce_after(pg->nccl, buf, count, t, op, ready);
        return;
    }
    CHECK_CUDA(cudaEventSynchronize(ready));
    pg_all_reduce(pg, buf, buf, count, t, op);
}

// The same for a reduce-scatter and an all-gather of GPU buffers (ZeRO-2
// and 3, chapter 09), queued behind `ready` (NULL: behind nothing) and,
// when `done` is not NULL, recorded into it once the result is there: a
// stream that waits for `done` (cudaStreamWaitEvent) can use the result
// without the host waiting for anything. cpu: waits for `ready`, runs now,
// and records `done` on the legacy stream, after the result.
static inline void pg_after_done(pg_t *pg, cudaEvent_t done) {
    if (done) CHECK_CUDA(cudaEventRecord(done, pg->nccl ? nccl_stream(pg->nccl) : cudaStreamLegacy));
}

static inline void pg_reduce_scatter_after(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                                           redop_t op, cudaEvent_t ready, cudaEvent_t done) {
    if (pg->nccl && !redop_is_bitwise(op)) {
        pg_announce(pg, "reduce_scatter", count, t, (int)op, -1);
        pg_bytes(pg, count, t, (size_t)pg->world_size, "reduce_scatter");
        pg_check_reduction(t, op, "reduce_scatter");
        if (count > 0) nccl_reduce_scatter_after(pg->nccl, send, recv, count, t, op, ready);
        pg_after_done(pg, done);
        return;
    }
    if (ready) CHECK_CUDA(cudaEventSynchronize(ready));
    pg_reduce_scatter(pg, send, recv, count, t, op);
    pg_after_done(pg, done);
}

static inline void pg_all_gather_after(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                                       cudaEvent_t ready, cudaEvent_t done) {
    if (pg->nccl) {
        pg_announce(pg, "all_gather", count, t, -1, -1);
        pg_bytes(pg, count, t, (size_t)pg->world_size, "all_gather");
        if (count > 0) nccl_all_gather_after(pg->nccl, send, recv, count, t, ready);
        pg_after_done(pg, done);
        return;
    }
    if (ready) CHECK_CUDA(cudaEventSynchronize(ready));
    pg_all_gather(pg, send, recv, count, t);
    pg_after_done(pg, done);
}

static inline void pg_wait_queued(pg_t *pg) {
    if (pg->nccl) nccl_wait_queued(pg->nccl);
}
#endif

#endif
