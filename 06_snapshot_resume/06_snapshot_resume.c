// 06_snapshot_resume.c - Chapter 6: surviving failures.
//
// Distributed jobs fail: a GPU falls off the bus, a node reboots, someone
// presses Ctrl-C. This chapter trains like chapter 05 and, every few
// epochs (or steps), has rank 0 write a SNAPSHOT of everything the run
// needs to continue: the weights, the optimizer's momentum, where in the
// data it was, and the configuration. When a worker dies, the launcher
// (tools/ddprun --max_restarts=K) stops the others and starts them all
// again; on start, the program finds the newest valid snapshot and goes on
// from there. Done right, the final weights are bit-for-bit those of a run
// that never failed.
//
//   tools/ddprun --standalone --nproc_per_node=2 --max_restarts=2
//       06_snapshot_resume/06_snapshot_resume --total_epochs 20 --save_every 2
//       --fail_rank 1 --fail_step 2000          (one command line)
//
// Read it top to bottom: options, the training state and its snapshot,
// fault injection, then main: set-up, resume, training loop, export.
#include <signal.h>
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "sampler.h"
#include "snapshot.h"
#include "timer.h"

typedef struct {
    int total_epochs, save_every, save_every_steps, keep, batch_size, features, samples, seed;
    double lr, momentum, timeout;
    const char *snapshot_path, *backend, *device;
    int fail_rank, fail_step, fail_attempts;
    const char *fail_mode;
} options;

static options parse_options(int argc, char **argv) {
    static char default_path[1200];
    char dir[1024];
    runs_dir(dir, sizeof dir, "06_snapshot_resume");
    snprintf(default_path, sizeof default_path, "%s/snapshot.safetensors", dir);
    options o = {10, 1, 0, 2, 32, 1, 10000, 42, 0.01, 0.9, 0, default_path, "auto", "auto",
                 -1, -1, 1, "exit"};
    flag_t flags[] = {
        {"total_epochs", NULL, FLAG_INT, &o.total_epochs, "epochs of the whole run, across restarts", 1, 100000, NULL, NULL},
        {"save_every", NULL, FLAG_INT, &o.save_every, "snapshot every N epochs", 1, 100000, NULL, NULL},
        {"save_every_steps", NULL, FLAG_INT, &o.save_every_steps, "also snapshot every N steps (0: only at epoch ends)", 0, 1000000000, NULL, NULL},
        {"snapshot_path", NULL, FLAG_STRING, &o.snapshot_path, "snapshot series: DIR/STEM.safetensors", 1, 0, NULL, NULL},
        {"keep", NULL, FLAG_INT, &o.keep, "keep the newest K snapshots", 1, 1000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.lr, "learning rate", 0, 100, NULL, NULL},
        {"momentum", NULL, FLAG_DOUBLE, &o.momentum, "SGD momentum (optimizer state!)", 0, 0.999, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
        {"fail_rank", NULL, FLAG_INT, &o.fail_rank, "fault injection: this rank dies... (-1: none)", -1, 1000000, NULL, "COURSE_FAIL_RANK"},
        {"fail_step", NULL, FLAG_INT, &o.fail_step, "...at this global step", -1, 1000000000, NULL, "COURSE_FAIL_STEP"},
        {"fail_mode", NULL, FLAG_STRING, &o.fail_mode, "...by exit(3) or SIGKILL", 1, 0, "exit|kill", "COURSE_FAIL_MODE"},
        {"fail_attempts", NULL, FLAG_INT, &o.fail_attempts, "...in the first N attempts (restarts) only", 0, 1000000, NULL, "COURSE_FAIL_ATTEMPTS"},
    };
    flag_set set = {"06_snapshot_resume", "data-parallel training that snapshots and resumes after failures",
                    NULL, flags, (int)(sizeof flags / sizeof flags[0])};
    flags_parse(&set, argc, argv);
    return o;
}

// ---------------------------------------------------------------- state
// Where the run is. With the seed, this is all it takes to rebuild the data
// order: the sampler's permutation is a function of (seed, epoch), so the
// "random state" of the data pipeline is the epoch and the position in it.
typedef struct {
    int64_t epoch;           // the epoch in progress
    int64_t position;        // samples of this epoch's global order already trained on
    int64_t global_step;     // steps since the very start
    int64_t world_size;      // of the run that wrote the snapshot
} progress_t;

// The configuration that must match for a snapshot to be resumable: a
// snapshot of a 64-feature model cannot continue a 1-feature run.
static void config_meta(const options *o, snapshot_meta *m, int *n) {
    m[(*n)++] = snapshot_meta_of("features", "%d", o->features);
    m[(*n)++] = snapshot_meta_of("samples", "%d", o->samples);
    m[(*n)++] = snapshot_meta_of("batch_size", "%d", o->batch_size);
    m[(*n)++] = snapshot_meta_of("seed", "%d", o->seed);
    m[(*n)++] = snapshot_meta_of("lr", "%.9g", o->lr);
    m[(*n)++] = snapshot_meta_of("momentum", "%.9g", o->momentum);
}

// Rank 0 writes: all replicas are identical, so one copy is the state.
static void save_snapshot(const options *o, linreg_model *model, const progress_t *p) {
    size_t count = (size_t)o->features + 1;
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    linreg_get_params(model, params);
    device_to_host(model->device, velocity, linreg_velocity(model), count * sizeof(float));
    int64_t shape[1] = {(int64_t)count};
    snapshot_tensor tensors[2] = {snapshot_tensor_of("params", "F32", params, 1, shape),
                                  snapshot_tensor_of("momentum_buffer", "F32", velocity, 1, shape)};
    snapshot_meta meta[16];
    int n = 0;
    config_meta(o, meta, &n);
    meta[n++] = snapshot_meta_of("epoch", "%lld", (long long)p->epoch);
    meta[n++] = snapshot_meta_of("position", "%lld", (long long)p->position);
    meta[n++] = snapshot_meta_of("global_step", "%lld", (long long)p->global_step);
    meta[n++] = snapshot_meta_of("world_size", "%lld", (long long)p->world_size);
    meta[n++] = snapshot_meta_of("rng", "data order = permutation(seed %d + epoch); no other random state", o->seed);
    char err[1400];
    if (!snapshot_save_step(o->snapshot_path, p->global_step, tensors, 2, meta, n, o->keep, err, sizeof err))
        die("could not save the snapshot: %s", err);
    log_main("snapshot saved: Epoch %lld (step %lld) in %s (keeping the newest %d)\n",
             (long long)p->epoch, (long long)p->global_step, o->snapshot_path, o->keep);
    free(params);
    free(velocity);
}

static int64_t meta_int(const snapshot_t *s, const char *key) {
    const char *text = snapshot_meta_get(s, key);
    char *end;
    long long v = text ? strtoll(text, &end, 10) : -1;
    if (!text || *end || v < 0) die("snapshot %s: metadata '%s' is missing or not a number", s->path, key);
    return v;
}

// Rank 0 looks for the newest valid snapshot. A damaged newest one is
// reported and an older one used; one from another configuration is
// refused with both values named. Returns true when one was loaded.
static bool load_snapshot(const options *o, linreg_model *model, progress_t *p) {
    snapshot_t snap;
    char report[4096], dir[1024];
    const char *slash = strrchr(o->snapshot_path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - o->snapshot_path) : 1, slash ? o->snapshot_path : ".");
    make_dirs(dir); // a first run: no folder yet, so no snapshot either
    int found = snapshot_load_latest(o->snapshot_path, &snap, report, sizeof report);
    if (report[0]) log_main("%s\n", report);
    if (found == 0) return false;
    if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", o->snapshot_path);
    snapshot_meta want[8];
    int n = 0;
    char err[1400];
    config_meta(o, want, &n);
    for (int i = 0; i < n; i++)
        if (!snapshot_expect_meta(&snap, want[i].key, want[i].value, err, sizeof err))
            die("cannot resume from %s: %s", snap.path, err);
    size_t count = (size_t)o->features + 1;
    int64_t shape[1] = {(int64_t)count};
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    if (!snapshot_copy(&snap, "params", "F32", 1, shape, params, err, sizeof err) ||
        !snapshot_copy(&snap, "momentum_buffer", "F32", 1, shape, velocity, err, sizeof err))
        die("cannot resume from %s: %s", snap.path, err);
    linreg_set_params(model, params);
    device_from_host(model->device, linreg_velocity(model), velocity, count * sizeof(float));
    p->epoch = meta_int(&snap, "epoch");
    p->position = meta_int(&snap, "position");
    p->global_step = meta_int(&snap, "global_step");
    p->world_size = meta_int(&snap, "world_size");
    if (p->position > o->samples || p->epoch > o->total_epochs)
        die("snapshot %s says epoch %lld, position %lld: outside this run", snap.path,
            (long long)p->epoch, (long long)p->position);
    free(params);
    free(velocity);
    snapshot_release(&snap);
    return true;
}

// ---------------------------------------------------------------- faults
// For teaching and testing: --fail_rank R --fail_step S makes rank R die
// just before the all-reduce of step S, so the other ranks are caught in
// the middle of a collective, as with a real crash. Only in the first
// --fail_attempts attempts, or the restarted job would die forever.
static void maybe_fail(const options *o, const dist_t *d, int64_t global_step) {
    if (d->rank != o->fail_rank || global_step != o->fail_step) return;
    if (d->env.restart_count >= o->fail_attempts) return;
    bool kill = !strcmp(o->fail_mode, "kill");
    fprintf(stderr, "[rank %d] fault injection: dying at step %lld by %s (attempt %d)\n", d->rank,
            (long long)global_step, kill ? "SIGKILL" : "exit(3)", d->env.restart_count);
    fflush(NULL);
    if (kill) raise(SIGKILL);
    exit(3);
}

// ---------------------------------------------------------------- main
int main(int argc, char **argv) {
    options opt = parse_options(argc, argv);

    // --- Set-up, as in chapter 05.
    dist_t dist;
    dist_options how = {"env://", opt.backend, opt.device, opt.timeout};
    dist_init(&dist, &how);
    log_main("06_snapshot_resume: %d rank(s), backend %s; rank 0 on %s; restart %d of at most %d\n",
             dist.world_size, pg_describe(dist.pg), dist.device.name, dist.env.restart_count,
             dist.env.max_restarts);
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    sampler_t sampler = sampler_create(opt.samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt.seed, false);
    linreg_model model;
    linreg_init(&model, &dist.device, &data, opt.batch_size);
    size_t nparams = (size_t)opt.features + 1;

    // --- Resume: rank 0 reads the snapshot, then everyone gets its state
    // by broadcast (no shared filesystem needed for the other ranks).
    progress_t progress = {0, 0, 0, dist.world_size};
    int64_t resumed = dist.rank == 0 && load_snapshot(&opt, &model, &progress);
    int64_t shared[5] = {resumed, progress.epoch, progress.position, progress.global_step, progress.world_size};
    dist_broadcast_host(&dist, shared, 5, DTYPE_I64, 0);
    progress = (progress_t){shared[1], shared[2], shared[3], shared[4]};
    ddp_broadcast_parameters(dist.pg, model.params, nparams);
    ddp_broadcast_parameters(dist.pg, linreg_velocity(&model), nparams);
    if (shared[0]) {
        log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)progress.epoch,
                 (long long)progress.global_step);
        if (progress.world_size != dist.world_size)
            log_main("the snapshot was written by %lld rank(s), this run has %d: the rest of epoch %lld "
                     "is re-sharded from global position %lld\n", (long long)progress.world_size,
                     dist.world_size, (long long)progress.epoch, (long long)progress.position);
    }

    // --- Training loop, with snapshots and fault injection.
    float lr = (float)opt.lr;
    double start = now_seconds();
    for (int64_t epoch = progress.epoch; epoch < opt.total_epochs; epoch++) {
        int64_t from = epoch == progress.epoch ? progress.position : 0;
        sampler_set_epoch_from(&sampler, (int)epoch, from);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += opt.batch_size) {
            int size = (int)(sampler.num_samples - first < opt.batch_size
                                 ? sampler.num_samples - first : opt.batch_size);
            linreg_forward_backward(&model, first, size);
            maybe_fail(&opt, &dist, progress.global_step + 1);
            ddp_average_gradients(dist.pg, model.grads, nparams);
            linreg_momentum_step(&model, lr, (float)opt.momentum);
            batches++;
            progress = (progress_t){epoch, from + (first + size) * dist.world_size, progress.global_step + 1, dist.world_size};
            if (progress.position > opt.samples) progress.position = opt.samples; // padding at the end
            bool epoch_done = first + size >= sampler.num_samples;
            if (epoch_done) progress = (progress_t){epoch + 1, 0, progress.global_step, dist.world_size};
            bool save = opt.save_every_steps > 0 && progress.global_step % opt.save_every_steps == 0;
            save |= epoch_done && (epoch + 1) % opt.save_every == 0;
            if (save && dist.rank == 0) save_snapshot(&opt, &model, &progress);
        }
        double loss[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss, 2, OP_SUM);
        log_main("epoch %lld | loss %.6f | step %lld | %.3f s\n", (long long)epoch,
                 loss[1] > 0 ? loss[0] / loss[1] : 0.0, (long long)progress.global_step, now_seconds() - start);
    }
    pg_barrier(dist.pg);

    // --- Export: the weights alone, for inference. A snapshot is for
    // training on; an exported model is what you ship.
    float *params = xmalloc(sizeof(float) * nparams);
    linreg_get_params(&model, params);
    if (dist.rank == 0) {
        // Beside the snapshots: <dir of --snapshot_path>/model.safetensors.
        char path[1100], err[1400];
        const char *slash = strrchr(opt.snapshot_path, '/');
        int dir_len = slash ? (int)(slash - opt.snapshot_path) : 1;
        snprintf(path, sizeof path, "%.*s/model.safetensors", dir_len, slash ? opt.snapshot_path : ".");
        int64_t shape[1] = {(int64_t)nparams};
        snapshot_tensor t = snapshot_tensor_of("params", "F32", params, 1, shape);
        snapshot_meta m[8];
        int n = 0;
        config_meta(&opt, m, &n);
        if (!snapshot_write(path, &t, 1, m, n, err, sizeof err)) die("could not export the model: %s", err);
        log_main("final weight %.9g  bias %.9g  (true 2.0, 3.0)\n", params[0], params[opt.features]);
        log_main("final parameters checksum %016llx; model exported to %s\n",
                 (unsigned long long)checksum_bytes(params, sizeof(float) * nparams), path);
    }
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    dist_finish(&dist);
    return 0;
}
