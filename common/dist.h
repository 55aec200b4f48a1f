// dist.h - join the job: the one call a distributed chapter makes first.
//
// It does, in order, what torch.distributed.init_process_group hides:
//   1. read our place in the job from the launcher's variables (launch_env.h)
//   2. choose the device: GPU LOCAL_RANK % GPUs, or the CPU (device.h)
//   3. meet the other ranks through the rendezvous store (rendezvous.h)
//   4. build the process group for the backend (pg.h): nccl or cpu
// A program started by hand, without a launcher, is a job of one rank.
#ifndef COURSE_DIST_H
#define COURSE_DIST_H

#include <stdio.h>

#include "device.h"
#include "launch_env.h"
#include "pg.h"
#include "rendezvous.h"
#include "versions.h"

typedef struct {
    launch_env_t env;
    device_t device;
    rendezvous_t rdzv;
    pg_t *pg;
    int rank, world_size;
} dist_t;

typedef struct {
    const char *init_method; // "env://" (default), "tcp://HOST:PORT", "file:///path"
    const char *backend;     // "auto", "cpu", "nccl", "mpi"
    const char *device;      // "auto", "cpu", "cuda"
    double timeout_s;        // <= 0: course_timeout_default()
} dist_options;

// Fills *d. The process group keeps a pointer to d->device, so *d must
// outlive it: declare the dist_t in the worker's main function.
static inline void dist_init(dist_t *d, const dist_options *opt) {
    memset(d, 0, sizeof *d);
    pg_mpi_start();   // under mpirun or srun: join MPI, learn rank 0's address (pg_mpi.h)
    d->env = launch_env_read();
    if (d->env.launched) course_set_rank(d->env.rank);
    d->device = device_choose(opt->device, d->env.local_rank);
    double timeout = opt->timeout_s > 0 ? opt->timeout_s : course_timeout_default();
    const char *method = opt->init_method ? opt->init_method : "env://";
    d->rdzv = rendezvous(method, d->env.launched ? d->env.rank : -1,
                         d->env.launched ? d->env.world_size : -1, timeout);
    d->rank = d->rdzv.rank;
    d->world_size = d->rdzv.world_size;
    course_set_rank(d->world_size > 1 ? d->rank : -1);
    // Same course, CUDA and NCCL on every rank, or stop now with a table (versions.h).
    versions_check(&d->rdzv, d->env.group_rank);
    pg_config_t cfg = {
        .rank = d->rank,
        .world_size = d->world_size,
        .local_rank = d->env.local_rank,
        .local_world_size = d->env.launched ? d->env.local_world_size : d->world_size,
        .backend = backend_parse(opt->backend ? opt->backend : "auto"),
        .device = &d->device,
        .store = d->rdzv.store,
        .timeout_s = timeout,
    };
    d->pg = pg_create(&cfg);
}

// All-reduce a few numbers that live on the host (a loss, a count). The
// process group works on the device's memory, so they go through it.
static inline void dist_all_reduce_host(dist_t *d, double *values, int count, redop_t op) {
    if (d->world_size == 1 || count <= 0) return;
    size_t bytes = sizeof(double) * (size_t)count;
    double *on_device = device_alloc(&d->device, bytes);
    device_from_host(&d->device, on_device, values, bytes);
    pg_all_reduce(d->pg, on_device, on_device, (size_t)count, DTYPE_F64, op);
    device_to_host(&d->device, values, on_device, bytes);
    device_free(&d->device, on_device);
}

// Broadcast a few host values from root (e.g. where a snapshot left off).
static inline void dist_broadcast_host(dist_t *d, void *values, size_t count, dtype_t t, int root) {
    if (d->world_size == 1 || count == 0) return; // (count 0: gcc saw the staging buffer read unwritten)
    size_t bytes = dtype_size(t) * count;
    void *on_device = device_alloc(&d->device, bytes);
    device_from_host(&d->device, on_device, values, bytes);
    pg_broadcast(d->pg, on_device, count, t, root);
    device_to_host(&d->device, values, on_device, bytes);
    device_free(&d->device, on_device);
}

static inline void dist_finish(dist_t *d) {
    if (d->pg) pg_destroy(d->pg);
    d->pg = NULL;
    rendezvous_close(&d->rdzv);
    pg_mpi_finish();
}

#endif
