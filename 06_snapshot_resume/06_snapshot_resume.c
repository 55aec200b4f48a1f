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
// Read it top to bottom: options, then main: set-up, resume, the training
// loop (with snapshots and fault injection), export. What a snapshot holds
// is in common/linreg_snapshot.h, how it is written safely in
// common/snapshot.h.
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "sampler.h"
#include "linreg_snapshot.h"
#include "snapshot.h"
#include "timer.h"

typedef struct {
    int total_epochs, save_every, save_every_steps, keep;
    linreg_run run;       // what a snapshot must match: model, data, batch, optimizer
    double timeout;
    const char *snapshot_path, *backend, *device;
    fault_plan fault;     // --fail_rank R --fail_step S: a rank dies, for the lesson
} options;

static options parse_options(int argc, char **argv) {
    static char default_path[1200];
    char dir[1024];
    runs_dir(dir, sizeof dir, "06_snapshot_resume");
    snprintf(default_path, sizeof default_path, "%s/snapshot.safetensors", dir);
    options o = {10, 1, 0, 2, {1, 10000, 32, 42, 0.01, 0.9}, 0, default_path, "auto", "auto", fault_none()};
    flag_t flags[24] = {
        {"total_epochs", NULL, FLAG_INT, &o.total_epochs, "epochs of the whole run, across restarts", 1, 100000, NULL, NULL},
        {"save_every", NULL, FLAG_INT, &o.save_every, "snapshot every N epochs", 1, 100000, NULL, NULL},
        {"save_every_steps", NULL, FLAG_INT, &o.save_every_steps, "also snapshot every N steps (0: only at epoch ends)", 0, 1000000000, NULL, NULL},
        {"snapshot_path", NULL, FLAG_STRING, &o.snapshot_path, "snapshot series: DIR/STEM.safetensors", 1, 0, NULL, NULL},
        {"keep", NULL, FLAG_INT, &o.keep, "keep the newest K snapshots", 1, 1000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.run.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.run.lr, "learning rate", 0, 100, NULL, NULL},
        {"momentum", NULL, FLAG_DOUBLE, &o.run.momentum, "SGD momentum (optimizer state!)", 0, 0.999, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.run.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.run.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.run.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl|mpi", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
    };
    int count = fault_add_flags(&o.fault, flags, 14);
    flag_set set = {"06_snapshot_resume", "data-parallel training that snapshots and resumes after failures",
                    NULL, flags, count};
    flags_parse(&set, argc, argv);
    return o;
}

// The snapshot itself (what it holds and why, how it is written and
// checked) is in common/linreg_snapshot.h and common/snapshot.h; the
// README walks through both. Here: when to write one, and how to resume.

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
    const linreg_run *run = &opt.run;
    linreg_data data = linreg_make_data(run->features, run->samples, (uint64_t)run->seed);
    sampler_t sampler = sampler_create(run->samples, dist.world_size, dist.rank, true,
                                       (uint64_t)run->seed, false);
    linreg_model model;
    linreg_init(&model, &dist.device, &data, run->batch_size);
    size_t nparams = (size_t)run->features + 1;

    // --- Resume: rank 0 reads the newest valid snapshot (a damaged one is
    // reported and an older one used), then everyone gets its state by
    // broadcast: no shared filesystem needed for the other ranks.
    linreg_progress progress;
    if (linreg_resume(&dist, opt.snapshot_path, run, opt.total_epochs, &model, &progress)) {
        if (progress.world_size != dist.world_size)
            log_main("the snapshot was written by %lld rank(s), this run has %d: the rest of epoch %lld "
                     "is re-sharded from global position %lld\n", (long long)progress.world_size,
                     dist.world_size, (long long)progress.epoch, (long long)progress.position);
    }

    // --- Training loop, with snapshots and fault injection.
    float lr = (float)run->lr;
    double start = now_seconds();
    for (int64_t epoch = progress.epoch; epoch < opt.total_epochs; epoch++) {
        int64_t from = epoch == progress.epoch ? progress.position : 0;
        sampler_set_epoch_from(&sampler, (int)epoch, from);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += run->batch_size) {
            int size = (int)(sampler.num_samples - first < run->batch_size
                                 ? sampler.num_samples - first : run->batch_size);
            linreg_forward_backward(&model, first, size);
            fault_maybe_die(&opt.fault, &dist, progress.global_step + 1);
            ddp_average_gradients(dist.pg, model.grads, nparams);
            linreg_momentum_step(&model, lr, (float)run->momentum);
            batches++;
            // Where the run is now: the ranks together have trained on
            // (first + size) x world samples of this epoch's global order.
            progress = (linreg_progress){epoch, from + (first + size) * dist.world_size, progress.global_step + 1, dist.world_size};
            if (progress.position > run->samples) progress.position = run->samples; // padding at the end
            bool epoch_done = first + size >= sampler.num_samples;
            if (epoch_done) progress = (linreg_progress){epoch + 1, 0, progress.global_step, dist.world_size};
            // Mid-epoch snapshots every --save_every_steps; the one at the
            // epoch's end comes after the epoch's line, below.
            bool save = !epoch_done && opt.save_every_steps > 0 && progress.global_step % opt.save_every_steps == 0;
            if (save && dist.rank == 0) linreg_snapshot_save(opt.snapshot_path, opt.keep, run, &model, &progress);
        }
        double loss[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss, 2, OP_SUM);
        log_main("epoch %lld | loss %.6f | step %lld | %.3f s\n", (long long)epoch,
                 loss[1] > 0 ? loss[0] / loss[1] : 0.0, (long long)progress.global_step, now_seconds() - start);
        bool save = (epoch + 1) % opt.save_every == 0 ||
                    (opt.save_every_steps > 0 && progress.global_step % opt.save_every_steps == 0);
        if (save && dist.rank == 0) linreg_snapshot_save(opt.snapshot_path, opt.keep, run, &model, &progress);
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
        int n = linreg_run_meta(run, m);
        if (!snapshot_write(path, &t, 1, m, n, err, sizeof err)) die("could not export the model: %s", err);
        log_main("final weight %.9g  bias %.9g  (true 2.0, 3.0)\n", params[0], params[run->features]);
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
