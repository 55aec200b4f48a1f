// pg.h - process groups: one API for communication between ranks, three backends.
//
// A process group is the set of ranks of a job plus the means to move data
// between them, as in torch.distributed. Chapters call pg_all_reduce() and
// friends and do not care how the bytes travel:
//
//   nccl  (pg_nccl.h) NCCL on GPU buffers, one rank per GPU. Only a CUDA
//         build has it.
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
//     collectives in the same order with the same count and dtype
//     (all_to_all_v: the same dtype, and counts that agree pair by pair);
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
// Sub-groups: pg_split(pg, color, key) makes a group of the ranks that pass
// the same color (MPI_Comm_split, ncclCommSplit), pg_new_group(pg, ranks,
// n) one of the ranks listed (torch.distributed.new_group); every rank of pg
// calls them, and a rank of no group gets NULL. A sub-group is a process
// group like any other: every call below works on it, and disjoint groups
// run their collectives at the same time.
//
// The types and the element-wise reduction kernels, which every backend
// shares, are in pg_types.h; the seam between this file and the backends,
// one table of functions per backend, is pg_backend.h. This file holds the
// functions the chapters call, which check their arguments, stage GPU
// buffers when the backend works on the host, and call the backend's table.
#ifndef COURSE_PG_H
#define COURSE_PG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "pg_backend.h"
#include "pg_types.h"

// The backends: each file ends with its table (pg_backend.h).
#include "pg_cpu.h"
#include "pg_debug.h"
#include "pg_mpi.h"   // mpi: under mpirun or srun (a build that found MPI)
#include "pg_nccl.h"  // nccl: a CUDA build

// ---------------------------------------------------------------- the process group

struct pg {
    const pg_backend_t *backend;   // the table of the backend in use
    backend_kind_t kind;           // BACKEND_CPU, BACKEND_NCCL or BACKEND_MPI
    void *impl;                    // the backend's own state
    pg_group_id_t id;              // store key prefix, rank, world size
    device_t device;               // a copy of the caller's device
    bool stage;                    // GPU buffers, host backend: copy through host memory
    store_t *store;                // the rendezvous store (sub-groups meet through it)
    double timeout_s;
    int splits;                    // sub-groups made from this group so far
    void *host[2];                 // staging buffers, grown on demand and kept
    size_t host_bytes[2];
    char description[400];
    pg_debug_t debug;              // COURSE_DEBUG (pg_debug.h)
};

struct pg_request {
    pg_t *pg;
    void *req;                     // the backend's request
    void *staged;                  // host copy of the caller's GPU buffer (staging only)
    void *device_dst;              // irecv with staging: where the bytes go at the end
    size_t bytes;
};

static inline backend_kind_t pg_backend(const pg_t *pg) { return pg->kind; }
static inline const char *pg_describe(const pg_t *pg) { return pg->description; }
static inline int pg_rank(const pg_t *pg) { return pg->id.rank; }
static inline int pg_world_size(const pg_t *pg) { return pg->id.world_size; }

static inline const pg_backend_t *pg_backend_table(backend_kind_t kind) {
    return kind == BACKEND_NCCL ? nccl_backend() : kind == BACKEND_MPI ? mpi_backend() : cpu_backend();
}

// ---------------------------------------------------------------- choosing the backend

// Can this rank run NCCL? If not, *why says so in words.
static inline bool pg_nccl_possible(const pg_config_t *cfg, char *why, size_t size) {
    const device_t *d = cfg->device;
    if (nccl_backend()->missing) {
        snprintf(why, size, "%s", nccl_backend()->missing);
        return false;
    }
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
}

// auto: nccl only if every rank can; the ranks vote through the store, so that one host with too few GPUs makes the whole job use cpu
// (a job whose ranks use different backends would hang).
static inline backend_kind_t pg_vote_backend(const pg_config_t *cfg, bool possible, const char *group,
                                             double timeout_s) {
    if (cfg->world_size == 1) return possible ? BACKEND_NCCL : BACKEND_CPU;
    char key[96];
    snprintf(key, sizeof key, "%s/cannot_nccl", group);
    return store_vote(cfg->store, key, cfg->rank, cfg->world_size, possible, timeout_s)
               ? BACKEND_NCCL : BACKEND_CPU;
}

static inline backend_kind_t pg_choose_backend(const pg_config_t *cfg, const char *group, double timeout_s) {
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
    // A build without NCCL has no rank that could run it: nothing to vote on.
    backend_kind_t vote = nccl_backend()->missing ? BACKEND_CPU
                                                  : pg_vote_backend(cfg, possible, group, timeout_s);
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

// "cpu (2 ranks share 1 GPU: buffers staged through host memory; sockets + shared memory)"
static inline void pg_describe_group(pg_t *pg, int local_world_size) {
    char staging[120] = "", inner[256];   // with the backend's short name, they fit in description
    if (pg->stage && local_world_size > pg->device.gpu_count)
        snprintf(staging, sizeof staging, "%d ranks share %d GPU%s: buffers staged through "
                 "host memory; ", local_world_size, pg->device.gpu_count,
                 pg->device.gpu_count == 1 ? "" : "s");
    else if (pg->stage)
        snprintf(staging, sizeof staging, "GPU buffers staged through host memory; ");
    pg->backend->describe(pg->impl, inner, sizeof inner);
    snprintf(pg->description, sizeof pg->description, "%s (%s%s)", pg->backend->name, staging, inner);
}

// A group object for a backend state that exists already.
static inline pg_t *pg_wrap(const pg_backend_t *backend, backend_kind_t kind, const pg_group_id_t *id,
                            const device_t *device, store_t *store, double timeout_s) {
    pg_t *pg = xcalloc(1, sizeof *pg);
    pg->backend = backend;
    pg->kind = kind;
    pg->id = *id;
    if (device) pg->device = *device;
    else device_cpu_name(&pg->device);   // kind 0 = DEVICE_CPU: host buffers
    pg->stage = backend->host_buffers && device_is_cuda(&pg->device);
    pg->store = store;
    pg->timeout_s = timeout_s;
    pg->debug = pg_debug_start(store, id->rank, id->world_size, id->key, timeout_s);
    return pg;
}

static inline pg_t *pg_create(const pg_config_t *cfg) {
    pg_check_config(cfg);
    double timeout = cfg->timeout_s > 0 ? cfg->timeout_s : course_timeout_default();
    pg_group_id_t id = {.rank = cfg->rank, .world_size = cfg->world_size};
    snprintf(id.key, sizeof id.key, "pg%d", pg_next_generation());
    backend_kind_t kind = pg_choose_backend(cfg, id.key, timeout);
    const pg_backend_t *backend = pg_backend_table(kind);
    if (backend->missing) die("--backend %s: %s", backend->name, backend->missing);
    pg_t *pg = pg_wrap(backend, kind, &id, cfg->device, cfg->store, timeout);
    pg->impl = backend->create(cfg, &id, timeout);
    pg_describe_group(pg, cfg->local_world_size);
    return pg;
}

static inline void pg_destroy(pg_t *pg) {
    if (!pg) return;
    pg->backend->destroy(pg->impl);
    free(pg->host[0]);
    free(pg->host[1]);
    free(pg);
}

// ---------------------------------------------------------------- sub-groups

// The sub-group of the ranks that pass the same color, ranked by key (ties:
// by their rank here), as MPI_Comm_split and ncclCommSplit rank them. Every
// rank of pg calls it; a rank with color < 0 joins no group and gets NULL.
// The ranks tell each other their color and key through the store; the
// backend then builds the group (cpu: sockets and rings of its own; nccl:
// ncclCommSplit; mpi: MPI_Comm_split).
static inline pg_t *pg_split(pg_t *pg, int color, int key) {
    int world = pg->id.world_size, me = pg->id.rank;
    enum { TEXT = 32 };
    char stem[96], mine[TEXT];
    snprintf(stem, sizeof stem, "%s/split%d", pg->id.key, pg->splits++);
    snprintf(mine, sizeof mine, "%d %d", color < 0 ? -1 : color, key);
    int *colors = xcalloc((size_t)world, sizeof *colors), *keys = xcalloc((size_t)world, sizeof *keys);
    if (world > 1) {
        char *text = xmalloc((size_t)world * TEXT);
        store_all_gather(pg->store, stem, me, world, mine, text, TEXT, pg->timeout_s);
        for (int r = 0; r < world; r++)
            if (sscanf(text + (size_t)r * TEXT, "%d %d", &colors[r], &keys[r]) != 2)
                die("pg_split: rank %d published a malformed color and key", r);
        free(text);
    } else {
        colors[0] = color < 0 ? -1 : color, keys[0] = key;
    }
    pg_group_id_t id = {.rank = 0, .world_size = 0};
    char group_key[2 * sizeof id.key];
    int len = snprintf(group_key, sizeof group_key, "%s.%d.%d", pg->id.key, pg->splits - 1, color < 0 ? 0 : color);
    if (len < 0 || len >= (int)sizeof id.key)
        die("pg_split: groups nested too deep (the store key '%s' is too long)", group_key);
    memcpy(id.key, group_key, (size_t)len + 1);
    for (int r = 0; r < world; r++) {
        if (color < 0 || colors[r] != color) continue;
        id.world_size++;
        if (keys[r] < key || (keys[r] == key && r < me)) id.rank++;
    }
    free(colors), free(keys);
    void *impl = pg->backend->split(pg->impl, color, key, &id, pg->store, pg->timeout_s);
    if (color < 0) return NULL;
    if (!impl) die("pg_split: the %s backend made no group for color %d", pg->backend->name, color);
    pg_t *sub = pg_wrap(pg->backend, pg->kind, &id, &pg->device, pg->store, pg->timeout_s);
    sub->impl = impl;
    pg_describe_group(sub, id.world_size);
    return sub;
}

// The group of the ranks listed (n of them, each once), ranked in the order
// they have here, as torch.distributed.new_group does. Every rank of pg
// calls it with the same list; a rank not in it gets NULL.
static inline pg_t *pg_new_group(pg_t *pg, const int *ranks, int n) {
    int me = -1;
    if (n < 1 || !ranks) die("pg_new_group: a group needs at least one rank (got %d)", n);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= pg->id.world_size)
            die("pg_new_group: rank %d is not a rank of this group (ranks 0..%d)", ranks[i], pg->id.world_size - 1);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) die("pg_new_group: rank %d is listed twice", ranks[i]);
        if (ranks[i] == pg->id.rank) me = i;
    }
    return pg_split(pg, me >= 0 ? 0 : -1, pg->id.rank);
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
            dtype_name(t), pg->id.world_size);
    return count * size * copies;
}

static inline void pg_check_rank(const pg_t *pg, int who, const char *role, const char *what) {
    if (who < 0 || who >= pg->id.world_size)
        die("%s: %s %d is not a rank of this group (ranks 0..%d)", what, role, who,
            pg->id.world_size - 1);
}

static inline void pg_check_peer(const pg_t *pg, int peer, const char *what) {
    pg_check_rank(pg, peer, "peer", what);
    if (peer == pg->id.rank)
        die("%s: rank %d cannot send to or receive from itself; copy the buffer instead",
            what, peer);
}

static inline void pg_check_buffer(const void *buf, size_t count, const char *name,
                                   const char *what) {
    if (!buf && count > 0) die("%s: the %s buffer is NULL", what, name);
}

// ---------------------------------------------------------------- staging (host backends, GPU buffers)
//
// The cpu and mpi backends only touch host memory. When the caller's
// buffers are on a GPU we copy inputs to a host buffer, communicate, and
// copy the result back: slower than NCCL, but it works with any number of
// ranks per GPU.

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

static inline pg_request_t *pg_new_request(pg_t *pg, size_t bytes) {
    pg_request_t *req = xcalloc(1, sizeof *req);
    req->pg = pg;
    req->bytes = bytes;
    return req;
}

static inline pg_request_t *pg_isend(pg_t *pg, const void *buf, size_t count, dtype_t t,
                                     int peer) {
    size_t bytes = pg_bytes(pg, count, t, 1, "isend");
    pg_check_peer(pg, peer, "isend");
    pg_check_buffer(buf, count, "send", "isend");
    pg_request_t *req = pg_new_request(pg, bytes);
    if (pg->stage) {   // the copy is taken now: the caller may reuse buf at once
        req->staged = xmalloc(bytes);
        device_to_host(&pg->device, req->staged, buf, bytes);
        buf = req->staged;
    }
    req->req = pg->backend->isend(pg->impl, buf, count, t, peer);
    return req;
}

static inline pg_request_t *pg_irecv(pg_t *pg, void *buf, size_t count, dtype_t t, int peer) {
    size_t bytes = pg_bytes(pg, count, t, 1, "irecv");
    pg_check_peer(pg, peer, "irecv");
    pg_check_buffer(buf, count, "receive", "irecv");
    pg_request_t *req = pg_new_request(pg, bytes);
    if (pg->stage) {
        req->staged = xmalloc(bytes);
        req->device_dst = buf;
        buf = req->staged;
    }
    req->req = pg->backend->irecv(pg->impl, buf, count, t, peer);
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
    bool done = req->pg->backend->test(req->pg->impl, req->req);
    if (done) pg_request_unstage(req);
    return done;
}

// Blocks until the request completes (or the pg's timeout ends the program),
// then frees it.
static inline void pg_wait(pg_request_t *req) {
    req->pg->backend->wait(req->pg->impl, req->req);
    pg_request_unstage(req);
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
// Every collective goes through pg_collective: it checks the arguments
// (pg_backend.h's table says which buffers each collective reads and
// writes, and how large they are), returns at once for count 0 (every rank
// passes the same count, so every rank returns), stages the buffers of a
// host backend, and calls the backend.

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

// The checks every collective makes; the bytes it reads and writes in *in, *out.
static inline void pg_check_collective(pg_t *pg, pg_coll_t c, const void *send, const void *recv, size_t count,
                                       dtype_t t, redop_t op, int root, size_t *in, size_t *out) {
    const pg_coll_shape_t *s = &pg_coll_shapes[c];
    pg_announce(pg, s->name, count, t, s->has_op ? (int)op : -1, s->has_root ? root : -1);
    size_t world = (size_t)pg->id.world_size;
    *in = pg_bytes(pg, count, t, s->send_blocks == PG_BLOCKS ? world : 1, s->name);
    *out = pg_bytes(pg, count, t, s->recv_blocks == PG_BLOCKS ? world : 1, s->name);
    if (s->has_op) pg_check_reduction(t, op, s->name);
    if (s->has_root) pg_check_rank(pg, root, "root", s->name);
    if (pg_who_includes(s->send_who, pg->id.rank, root))
        pg_check_buffer(send, count, c == PG_BROADCAST ? "" : "send", s->name);
    if (pg_who_includes(s->recv_who, pg->id.rank, root))
        pg_check_buffer(recv, count, c == PG_BROADCAST ? "" : "receive", s->name);
}

static inline void pg_collective(pg_t *pg, pg_coll_t c, const void *send, void *recv, size_t count, dtype_t t,
                                 redop_t op, int root) {
    const pg_coll_shape_t *s = &pg_coll_shapes[c];
    size_t in, out;
    pg_check_collective(pg, c, send, recv, count, t, op, root, &in, &out);
    if (count == 0) return;
    bool sends = pg_who_includes(s->send_who, pg->id.rank, root);
    bool receives = pg_who_includes(s->recv_who, pg->id.rank, root);
    if (!pg->stage) {
        pg->backend->collective(pg->impl, c, send, recv, count, t, op, root);
        return;
    }
    // In place (send == recv, as broadcast always is): one host buffer for both.
    bool in_place = send == recv && in == out;
    const void *hs = sends ? pg_stage_in(pg, 0, send, in) : NULL;
    void *hr = NULL;
    if (in_place) hr = sends ? (void *)hs : pg_stage_out(pg, 0, recv, out);
    else if (receives) hr = pg_stage_out(pg, 1, recv, out);
    pg->backend->collective(pg->impl, c, hs, hr, count, t, op, root);
    if (receives) pg_unstage(pg, recv, hr, out);
}

// buf is the root's input and everyone else's output.
static inline void pg_broadcast(pg_t *pg, void *buf, size_t count, dtype_t t, int root) {
    pg_collective(pg, PG_BROADCAST, buf, buf, count, t, OP_SUM, root);
}

// recv is used at the root only (other ranks may pass NULL).
static inline void pg_reduce(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                             redop_t op, int root) {
    pg_collective(pg, PG_REDUCE, send, recv, count, t, op, root);
}

static inline void pg_all_reduce(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t, redop_t op) {
    pg_collective(pg, PG_ALL_REDUCE, send, recv, count, t, op, -1);
}

// recv holds world_size * count elements at the root (others may pass NULL).
static inline void pg_gather(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                             int root) {
    pg_collective(pg, PG_GATHER, send, recv, count, t, OP_SUM, root);
}

// count elements per rank; recv holds world_size * count, rank r's part at r * count.
static inline void pg_all_gather(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t) {
    pg_collective(pg, PG_ALL_GATHER, send, recv, count, t, OP_SUM, -1);
}

// send holds world_size * count elements at the root (others may pass NULL).
static inline void pg_scatter(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                              int root) {
    pg_collective(pg, PG_SCATTER, send, recv, count, t, OP_SUM, root);
}

// send holds world_size * count elements; rank r receives the reduction of block r.
static inline void pg_reduce_scatter(pg_t *pg, const void *send, void *recv, size_t count,
                                     dtype_t t, redop_t op) {
    pg_collective(pg, PG_REDUCE_SCATTER, send, recv, count, t, op, -1);
}

// count elements per peer: block p of send goes to rank p, and block p of
// recv comes from rank p.
static inline void pg_all_to_all(pg_t *pg, const void *send, void *recv, size_t count,
                                 dtype_t t) {
    pg_collective(pg, PG_ALL_TO_ALL, send, recv, count, t, OP_SUM, -1);
}

// ---------------------------------------------------------------- all-to-all with counts per peer
//
// pg_all_to_all_v(pg, send, send_counts, recv, recv_counts, dtype): rank r
// sends send_counts[p] elements to rank p and receives recv_counts[p]
// elements from it, for every p, itself included (PyTorch's
// all_to_all_single with input_split_sizes and output_split_sizes;
// MPI_Alltoallv; NCCL has no call of its own: grouped ncclSend/ncclRecv).
// Both count arrays have world_size entries, in elements, and live in host
// memory even when the buffers are on a GPU (PyTorch's split sizes are
// Python lists too: counts computed on a GPU come to the host first). The
// data are packed by peer in rank order, with no gaps: the block for rank p starts
// at element send_counts[0] + ... + send_counts[p-1] of send (the
// displacements are the prefix sums of the counts), and the block from
// rank p at recv_counts[0] + ... + recv_counts[p-1] of recv:
//
//   send on rank 1, send_counts {2, 0, 3}:  [ to 0 | to 0 | to 2 | to 2 | to 2 ]
//   recv on rank 2, recv_counts {1, 3, 0}:  [ from 0 | from 1 | from 1 | from 1 ]
//
// Zeros are allowed anywhere: a rank may send nothing to a peer, or
// receive nothing at all (its buffer may then be NULL), but it still
// calls, as every rank does. The counts must agree: rank a's
// send_counts[b] is rank b's recv_counts[a]. A rank cannot know what the
// others will send it, so a mixture-of-experts layer (chapter 13) first
// exchanges its counts with pg_all_to_all (one count per peer), then the
// tokens with this. Each rank's own block is checked here. A disagreement
// between two ranks is a one-line error on the cpu backend (a message's
// size is in its header); MPI reports a block longer than expected
// (truncation) but not a shorter one; nccl waits until the timeout.
// COURSE_DEBUG=DETAIL names it on every backend ("rank 0 sends 5 to rank
// 1, which expects 4"). Not in place: send and recv must not overlap.

// The elements of all the blocks, and their bytes; a sum that overflows is
// a caller's bug.
static inline size_t pg_counts_total(const pg_t *pg, const size_t *counts, dtype_t t, const char *which) {
    size_t total = 0;
    for (int p = 0; p < pg->id.world_size; p++) {
        if (counts[p] > SIZE_MAX - total)
            die("all_to_all_v: the %s counts add up to more than a size_t holds", which);
        total += counts[p];
    }
    return pg_bytes(pg, total, t, 1, "all_to_all_v");
}

static inline void pg_all_to_all_v(pg_t *pg, const void *send, const size_t *send_counts, void *recv,
                                   const size_t *recv_counts, dtype_t t) {
    if (!dtype_valid(t)) die("all_to_all_v: unknown dtype %d", (int)t);
    if (!send_counts || !recv_counts)
        die("all_to_all_v: the %s counts are NULL (an array of one count per rank is needed)",
            send_counts ? "receive" : "send");
    pg_debug_collective_counts(&pg->debug, dtype_name(t), send_counts, recv_counts);
    size_t in = pg_counts_total(pg, send_counts, t, "send");
    size_t out = pg_counts_total(pg, recv_counts, t, "receive");
    int me = pg->id.rank;
    if (send_counts[me] != recv_counts[me])
        die("all_to_all_v: rank %d sends %zu elements to itself but expects %zu from itself", me,
            send_counts[me], recv_counts[me]);
    pg_check_buffer(send, in, "send", "all_to_all_v");
    pg_check_buffer(recv, out, "receive", "all_to_all_v");
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (in && out && s < r + out && r < s + in)
        die("all_to_all_v: the send and receive buffers overlap; it does not work in place");
    if (!pg->stage) {
        pg->backend->all_to_all_v(pg->impl, send, send_counts, recv, recv_counts, t);
        return;
    }
    const void *hs = in ? pg_stage_in(pg, 0, send, in) : NULL;
    void *hr = out ? pg_stage_out(pg, 1, recv, out) : NULL;
    pg->backend->all_to_all_v(pg->impl, hs, send_counts, hr, recv_counts, t);
    if (out) pg_unstage(pg, recv, hr, out);
}

// Returns once every rank has called it.
static inline void pg_barrier(pg_t *pg) {
    pg_debug_collective(&pg->debug, "barrier()");
    pg->backend->barrier(pg->impl);
}

// ---------------------------------------------------------------- overlapping with the GPU
//
// Every call above returns when its result is ready. DDP on a GPU wants
// more: to all-reduce one bucket of gradients while the GPU is still
// computing the next, so that communication hides behind computation.
// pg_all_reduce_after(pg, buf, ..., ready) all-reduces (in place) a GPU
// buffer that becomes final when the CUDA event `ready` (a cudaEvent_t)
// happens:
//   - nccl: queued on the group's stream behind `ready`; returns at once.
//   - cpu, mpi (GPU buffers staged through host memory): waits for `ready`,
//     then runs now; no overlap, the same result.
// pg_reduce_scatter_after and pg_all_gather_after do the same for ZeRO's
// collectives (chapter 09), and record the event `done` (unless NULL) once
// their result is there: a stream that waits for `done`
// (cudaStreamWaitEvent) uses the result without the host waiting. `ready`
// may be NULL: behind nothing.
// pg_wait_queued returns when everything queued so far has finished (or
// stops the job with a message, as the blocking calls do).
static inline void pg_collective_after(pg_t *pg, pg_coll_t c, const void *send, void *recv, size_t count,
                                       dtype_t t, redop_t op, pg_event_t ready, pg_event_t done) {
    if (!pg->backend->collective_after) {
        device_wait_event(&pg->device, ready);
        pg_collective(pg, c, send, recv, count, t, op, -1);
        device_record_event(&pg->device, done);   // the result is in place already
        return;
    }
    size_t in, out;
    pg_check_collective(pg, c, send, recv, count, t, op, -1, &in, &out);
    pg->backend->collective_after(pg->impl, c, send, recv, count, t, op, ready, done);
}

static inline void pg_all_reduce_after(pg_t *pg, void *buf, size_t count, dtype_t t, redop_t op,
                                       pg_event_t ready) {
    pg_collective_after(pg, PG_ALL_REDUCE, buf, buf, count, t, op, ready, NULL);
}

// send holds world_size * count elements; rank r receives the reduction of block r.
static inline void pg_reduce_scatter_after(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                                           redop_t op, pg_event_t ready, pg_event_t done) {
    pg_collective_after(pg, PG_REDUCE_SCATTER, send, recv, count, t, op, ready, done);
}

// recv holds world_size * count elements, rank r's part at r * count.
static inline void pg_all_gather_after(pg_t *pg, const void *send, void *recv, size_t count, dtype_t t,
                                       pg_event_t ready, pg_event_t done) {
    pg_collective_after(pg, PG_ALL_GATHER, send, recv, count, t, OP_SUM, ready, done);
}

static inline void pg_wait_queued(pg_t *pg) {
    if (pg->backend->wait_queued) pg->backend->wait_queued(pg->impl);
}

#endif
