// linreg_snapshot.h - the resumable state of the linear-regression training
// (chapters 06 and 07).
//
// A snapshot holds everything a restarted job needs to continue as if
// nothing had happened (chapter 06's README explains each item):
//   tensors   params (w then b) and momentum_buffer (SGD's velocity)
//   metadata  epoch, position (samples of the epoch's global order already
//             trained on), global_step, world_size, and the configuration a
//             resume must match: features, samples, batch_size (per rank; 0
//             with global_batch_size, the batch of all ranks together, which
//             any world size can continue), seed, lr, momentum. The data order is a function of (seed, epoch), so
//             seed + epoch + position is the data pipeline's random state.
// Rank 0 writes and reads it; the other ranks receive the state by
// broadcast, so only rank 0 needs the disk (node 0's, across nodes).
#ifndef COURSE_LINREG_SNAPSHOT_H
#define COURSE_LINREG_SNAPSHOT_H

#include "ddp.h"
#include "dist.h"
#include "linreg.h"
#include "log.h"
#include "snapshot.h"

// What a snapshot must agree with to continue this run.
typedef struct {
    int features, samples, batch_size, global_batch_size, seed;   // batch_size 0: global / world
    double lr, momentum;
} linreg_run;

// Where the run is.
typedef struct {
    int64_t epoch, position, global_step, world_size;
} linreg_progress;

static inline int linreg_run_meta(const linreg_run *r, safetensors_meta *m) {
    int n = 0;
    m[n++] = safetensors_meta_of("features", "%d", r->features);
    m[n++] = safetensors_meta_of("samples", "%d", r->samples);
    m[n++] = safetensors_meta_of("batch_size", "%d", r->batch_size);
    m[n++] = safetensors_meta_of("global_batch_size", "%d", r->global_batch_size);
    m[n++] = safetensors_meta_of("seed", "%d", r->seed);
    m[n++] = safetensors_meta_of("lr", "%.9g", r->lr);
    m[n++] = safetensors_meta_of("momentum", "%.9g", r->momentum);
    return n;
}

// Rank 0 only: all replicas are identical, so one copy is the state.
static inline void linreg_snapshot_save(const char *path, int keep, const linreg_run *run,
                                        linreg_model *model, const linreg_progress *p) {
    size_t count = (size_t)model->features + 1;
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    linreg_get_params(model, params);
    device_to_host(model->device, velocity, linreg_velocity(model), count * sizeof(float));
    int64_t shape[1] = {(int64_t)count};
    safetensors_tensor tensors[2] = {safetensors_tensor_of("params", "F32", params, 1, shape),
                                  safetensors_tensor_of("momentum_buffer", "F32", velocity, 1, shape)};
    safetensors_meta meta[16];
    int n = linreg_run_meta(run, meta);
    meta[n++] = safetensors_meta_of("epoch", "%lld", (long long)p->epoch);
    meta[n++] = safetensors_meta_of("position", "%lld", (long long)p->position);
    meta[n++] = safetensors_meta_of("global_step", "%lld", (long long)p->global_step);
    meta[n++] = safetensors_meta_of("world_size", "%lld", (long long)p->world_size);
    meta[n++] = safetensors_meta_of("rng", "data order = permutation(seed %d + epoch); no other random state", run->seed);
    char err[1400];
    if (!snapshot_save_step(path, p->global_step, tensors, 2, meta, n, keep, err, sizeof err))
        die("could not save the snapshot: %s", err);
    // Epochs are counted from 0, as the training loop prints them. A
    // snapshot names the epoch that training goes on with: the next one at
    // an epoch's end (position 0), else the one in progress.
    if (p->position == 0)
        log_main("snapshot saved at step %lld: epoch %lld done, resumes at Epoch %lld; in %s (keeping the newest %d)\n",
                 (long long)p->global_step, (long long)p->epoch - 1, (long long)p->epoch, path, keep);
    else
        log_main("snapshot saved at step %lld: resumes in Epoch %lld at sample %lld of %lld; in %s (keeping the newest %d)\n",
                 (long long)p->global_step, (long long)p->epoch, (long long)p->position, (long long)run->samples,
                 path, keep);
    free(params);
    free(velocity);
}

static inline int64_t linreg_meta_int(const safetensors_t *s, const char *key) {
    int64_t v = 0;
    char err[400];
    if (!snapshot_meta_i64(s, key, &v, err, sizeof err) || v < 0) die("snapshot %s: %s", s->path, err);
    return v;
}

// Rank 0: the newest valid snapshot into model and *p. A damaged newest one
// is reported and an older one used; one of another configuration is
// refused with both values named. False when there is none.
static inline bool linreg_snapshot_load(const char *path, const linreg_run *run, int total_epochs,
                                        linreg_model *model, linreg_progress *p) {
    char report[4096], dir[1024], err[1400];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    files_make_dirs_or_die(dir); // a first run: no folder yet, so no snapshot either
    safetensors_t snap;
    int found = snapshot_load_latest(path, &snap, report, sizeof report);
    if (report[0]) log_main("%s\n", report);
    if (found == 0) return false;
    if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", path);
    safetensors_meta want[10];
    int n = linreg_run_meta(run, want);
    for (int i = 0; i < n; i++)
        if (!snapshot_expect_meta(&snap, want[i].key, want[i].value, err, sizeof err))
            die("cannot resume from %s: %s", snap.path, err);
    size_t count = (size_t)model->features + 1;
    int64_t shape[1] = {(int64_t)count};
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    if (!snapshot_copy(&snap, "params", "F32", 1, shape, params, err, sizeof err) ||
        !snapshot_copy(&snap, "momentum_buffer", "F32", 1, shape, velocity, err, sizeof err))
        die("cannot resume from %s: %s", snap.path, err);
    linreg_set_params(model, params);
    device_from_host(model->device, linreg_velocity(model), velocity, count * sizeof(float));
    *p = (linreg_progress){linreg_meta_int(&snap, "epoch"), linreg_meta_int(&snap, "position"),
                           linreg_meta_int(&snap, "global_step"), linreg_meta_int(&snap, "world_size")};
    if (p->position > run->samples || p->epoch > total_epochs)
        die("snapshot %s says epoch %lld, position %lld: outside this run", snap.path,
            (long long)p->epoch, (long long)p->position);
    free(params);
    free(velocity);
    safetensors_release(&snap);
    return true;
}

// Every rank: rank 0 loads, then the state reaches everyone by broadcast
// (parameters and momentum too, so replicas start equal either way).
// Returns true when the run resumes; *p is where it goes on from.
static inline bool linreg_resume(dist_t *d, const char *path, const linreg_run *run, int total_epochs,
                                 linreg_model *model, linreg_progress *p) {
    *p = (linreg_progress){0, 0, 0, d->world_size};
    int64_t resumed = d->rank == 0 && linreg_snapshot_load(path, run, total_epochs, model, p);
    int64_t shared[5] = {resumed, p->epoch, p->position, p->global_step, p->world_size};
    dist_broadcast_host(d, shared, 5, DTYPE_I64, 0);
    *p = (linreg_progress){shared[1], shared[2], shared[3], shared[4]};
    size_t count = (size_t)model->features + 1;
    ddp_broadcast_parameters(d->pg, model->params, count);
    ddp_broadcast_parameters(d->pg, linreg_velocity(model), count);
    if (shared[0])
        log_main("Resuming training from snapshot at Epoch %lld, sample %lld (step %lld)\n", (long long)p->epoch,
                 (long long)p->position, (long long)p->global_step);
    if (shared[0] && p->world_size != d->world_size)
        log_main("the snapshot was written by %lld rank(s), this run has %d: the rest of epoch %lld "
                 "is re-sharded from global position %lld%s\n", (long long)p->world_size,
                 d->world_size, (long long)p->epoch, (long long)p->position, run->global_batch_size
                 ? "; the global batch, and so every step, stays the same" : "");
    return shared[0] != 0;
}

// Rank 0, at the end: the weights alone, for inference, beside the
// snapshots (<dir of snapshot_path>/model.safetensors).
static inline void linreg_export(const char *snapshot_path, const linreg_run *run, const float *params) {
    char path[1100], err[1400];
    const char *slash = strrchr(snapshot_path, '/');
    int dir_len = slash ? (int)(slash - snapshot_path) : 1;
    snprintf(path, sizeof path, "%.*s/model.safetensors", dir_len, slash ? snapshot_path : ".");
    int64_t shape[1] = {(int64_t)run->features + 1};
    safetensors_tensor t = safetensors_tensor_of("params", "F32", params, 1, shape);
    safetensors_meta m[10];
    int n = linreg_run_meta(run, m);
    if (!snapshot_write(path, &t, 1, m, n, err, sizeof err)) die("could not export the model: %s", err);
    log_main("model exported to %s\n", path);
}

#endif
