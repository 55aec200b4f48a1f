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
// Read the diff first: `make diffs` shows what changed since chapter 05.
// What a snapshot holds is in common/linreg_snapshot.h, how it is written
// safely in common/snapshot.h.
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "fault.h"
#include "flags.h"
#include "linreg.h"
#include "linreg_snapshot.h"
#include "log.h"
#include "metrics.h"
#include "sampler.h"
#include "timer.h"

#define CHAPTER "06_snapshot_resume"

typedef struct {
    int epochs, batch_size, global_batch_size, features, samples, seed, check_replicas;
    double lr, timeout;
    const char *backend, *device, *init_method, *grad_compress;
    bool scale_lr;
    fault_plan fault;    // --fail_rank R --fail_step S: a rank dies, for the lesson (fault.h)
    int save_every, save_every_steps, keep;
    double momentum;
    const char *snapshot_path;
} options;

static options parse_options(int argc, char **argv) {
    static char default_path[1200];
    char dir[1024];
    files_runs_dir(dir, sizeof dir, CHAPTER);
    snprintf(default_path, sizeof default_path, "%s/snapshot.safetensors", dir);
    options o = {.epochs = 10, .batch_size = 32, .features = 1, .samples = 10000, .seed = 42, .lr = 0.01,
                 .backend = "auto", .device = "auto", .grad_compress = "none", .init_method = "env://", .scale_lr = false,
                 .fault = fault_none(), .save_every = 1, .keep = 2, .momentum = 0.9, .snapshot_path = default_path};
    flag_set set = {.program = CHAPTER,
                    .summary = "data-parallel training that snapshots and resumes after failures"};
    flag_int(&set, "total_epochs", &o.epochs, 1, 100000, "epochs of the whole run, across restarts");
    flag_int(&set, "save_every", &o.save_every, 1, 100000, "snapshot every N epochs");
    flag_int(&set, "save_every_steps", &o.save_every_steps, 0, 1000000000, "also snapshot every N steps (0: only at epoch ends)");
    flag_string(&set, "snapshot_path", &o.snapshot_path, "snapshot series: DIR/STEM.safetensors");
    flag_int(&set, "keep", &o.keep, 1, 1000, "keep the newest K snapshots");
    flag_int(&set, "batch_size", &o.batch_size, 1, 1000000, "samples per step PER RANK");
    flag_int(&set, "global_batch_size", &o.global_batch_size, 0, 100000000, "samples per step of ALL ranks, whatever their number (0: batch_size per rank)");
    flag_double(&set, "lr", &o.lr, 0, 100, "learning rate of one process");
    flag_double(&set, "momentum", &o.momentum, 0, 0.999, "SGD momentum (optimizer state!)");
    flag_bool(&set, "scale_lr", &o.scale_lr, "multiply lr by the world size (linear scaling rule)");
    flag_int(&set, "features", &o.features, 1, 65536, "input features D");
    flag_int(&set, "samples", &o.samples, 1, 100000000, "training samples");
    flag_int(&set, "seed", &o.seed, 0, 2147483647, "seed for data and shuffling");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where to compute")->env = "COURSE_DEVICE";
    flag_choice(&set, "grad_compress", &o.grad_compress, "none|bf16|fp16", "gradients all-reduced as fp32, or rounded to bf16 or fp16 (DDP's bf16_ and fp16_compress_hook)");
    flag_string(&set, "init_method", &o.init_method, "how ranks meet: env://, tcp://HOST:PORT, file:///path");
    flag_int(&set, "check_replicas", &o.check_replicas, 0, 1000000000, "every N steps, stop if the replicas differ (0: never)");
    flag_double(&set, "timeout", &o.timeout, 0, 86400, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)");
    fault_add_flags(&set, &o.fault);
    flags_parse(&set, argc, argv);
    if (o.global_batch_size && o.scale_lr)
        flags_fail(&set, "--scale_lr scales lr with the world size, but with --global_batch_size "
                   "the batch of a step does not change with it, so neither does lr");
    return o;
}

int main(int argc, char **argv) {
    options opt = parse_options(argc, argv);

    // --- Set-up: who am I? The launcher's variables say; dist_init reads
    // them, meets the other ranks and builds the process group.
    dist_t dist;
    dist_options how = {opt.init_method, opt.backend, opt.device, opt.timeout};
    dist_init(&dist, &how);
    log_main(CHAPTER ": %d rank(s) (%s), backend %s; rank 0 on %s: %s\n", dist.world_size,
             dist.env.launched ? dist.env.source : "no launcher: a single process",
             pg_describe(dist.pg), dist.device.name, dist.device.why);
    log_main("restart %d of at most %d\n", dist.env.restart_count, dist.env.max_restarts);
    // The effective batch is world_size x batch_size; the linear scaling
    // rule raises the learning rate by the same factor. An elastic job
    // (ddprun --nnodes=MIN:MAX) changes world_size whenever a node comes or
    // goes: --global_batch_size fixes the batch of a step instead, each rank
    // taking its share, so that every step computes the same thing on any
    // number of ranks and lr need not change (README: elastic jobs).
    int batch = ddp_batch_per_rank(opt.batch_size, opt.global_batch_size, dist.world_size);
    float lr = (float)(opt.scale_lr ? opt.lr * dist.world_size : opt.lr);
    log_main("batch %d per rank x %d rank(s) = %d per step; lr %g\n", batch, dist.world_size,
             batch * dist.world_size, lr);

    // --- Data and sampler: every rank makes the same dataset (as every
    // rank would open the same files); the sampler gives each its disjoint
    // share of every epoch.
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    sampler_t sampler = sampler_create(opt.samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt.seed, false);

    // --- Model: a replica per rank, made equal by broadcasting rank 0's.
    linreg_model model;
    linreg_init(&model, &dist.device, &data, batch);
    size_t nparams = (size_t)opt.features + 1;
    // How the gradients travel (DDP's communication hook, common/ddp.h): as
    // fp32, or rounded to bf16 for half the bytes.
    ddp_compress_t compress = ddp_compress_from_name(opt.grad_compress);
    // --- Resume: rank 0 reads the newest valid snapshot (a damaged one is
    // reported and an older one used), then everyone gets its state by
    // broadcast: no shared filesystem needed for the other ranks.
    linreg_run run = {opt.features, opt.samples, opt.global_batch_size ? 0 : batch,
                      opt.global_batch_size, opt.seed,
                      opt.scale_lr ? opt.lr * dist.world_size : opt.lr, opt.momentum};
    linreg_progress progress;
    linreg_resume(&dist, opt.snapshot_path, &run, opt.epochs, &model, &progress);
    int first_epoch = (int)progress.epoch;
    int64_t step = progress.global_step, first_step = step;   // this attempt's steps start here

    char out_dir[1024];
    files_runs_dir(out_dir, sizeof out_dir, CHAPTER);
    metrics_csv csv = {0};
    if (dist.rank == 0) csv = metrics_open(out_dir, "train", "epoch,loss,seconds");

    // --- Training loop. The clock starts when every rank is ready.
    pg_barrier(dist.pg);
    double start = now_seconds();
    double first_loss = 0, last_loss = 0;   // of the first and the last epoch
    for (int epoch = first_epoch; epoch < opt.epochs; epoch++) {
        int64_t from = epoch == first_epoch ? progress.position : 0;   // resumed mid-epoch: go on from there
        sampler_set_epoch_from(&sampler, epoch, from);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += batch) {
            int size = (int)(sampler.num_samples - first < batch ? sampler.num_samples - first : batch);
            linreg_forward_backward(&model, first, size);             // local gradient
            fault_maybe_die(&opt.fault, &dist, step + 1);             // planned failures (fault.h)
            ddp_average_gradients_with(dist.pg, model.grads, nparams, compress); // the one DDP line
            linreg_momentum_step(&model, lr, (float)opt.momentum);    // same update everywhere
            batches++;
            step++;
            if (opt.check_replicas > 0 && step % opt.check_replicas == 0)
                ddp_check_replicas(dist.pg, &dist.device, model.params, nparams, step);
            // Where the run is now: the ranks together have trained on
            // (first + size) x world samples of this epoch's global order.
            progress = (linreg_progress){epoch, from + (first + size) * dist.world_size, step, dist.world_size};
            if (progress.position > opt.samples) progress.position = opt.samples; // padding at the end
            bool epoch_done = first + size >= sampler.num_samples;
            if (epoch_done) progress = (linreg_progress){epoch + 1, 0, step, dist.world_size};
            // Mid-epoch snapshots every --save_every_steps; the one at the
            // epoch's end comes after the epoch's line, below.
            bool save = !epoch_done && opt.save_every_steps > 0 && step % opt.save_every_steps == 0;
            if (save && dist.rank == 0) linreg_snapshot_save(opt.snapshot_path, opt.keep, &run, &model, &progress);
        }
        // The epoch's loss over all ranks: sum every rank's batch losses
        // and batch counts, then divide. Rank 0's own share would be only
        // 1/world of the picture.
        double loss_and_batches[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss_and_batches, 2, OP_SUM);
        double epoch_loss = loss_and_batches[0] / loss_and_batches[1];
        if (epoch == first_epoch) first_loss = epoch_loss;
        last_loss = epoch_loss;
        log_main("epoch %2d | loss %.6f (mean over all ranks) | %lld steps | %.3f s\n", epoch,
                 epoch_loss, (long long)step, now_seconds() - start);
        if (dist.rank == 0) metrics_row(&csv, "%d,%.8f,%.6f", epoch, epoch_loss, now_seconds() - start);
        bool save = (epoch + 1) % opt.save_every == 0 || (opt.save_every_steps > 0 && step % opt.save_every_steps == 0);
        if (save && dist.rank == 0) linreg_snapshot_save(opt.snapshot_path, opt.keep, &run, &model, &progress);
    }
    pg_barrier(dist.pg); // the job is done when the slowest rank is
    double seconds = now_seconds() - start;

    // --- Report and teardown. The checksum compares runs bit for bit.
    float *params = xmalloc(sizeof(float) * nparams);
    linreg_get_params(&model, params);
    if (dist.rank == 0) {
        metrics_close(&csv);
        log_main("final weight %.6f  bias %.6f  (true 2.0, 3.0)  parameters checksum %016llx\n", params[0],
                 params[opt.features], (unsigned long long)checksum_bytes(params, sizeof(float) * nparams));
        if (dist.world_size > 1)
            log_main("gradients all-reduced: %zu bytes per step per rank (%s)\n",
                     ddp_bytes_reduced() / (size_t)(step > first_step ? step - first_step : 1), ddp_wire_name(compress));
        log_main("training time %.6f s on %d rank(s) (%.0f samples/s)\n", seconds, dist.world_size,
                 (double)opt.samples * (opt.epochs - first_epoch) / seconds);
        // The weights alone, for inference: a snapshot is for training on,
        // an exported model is what you ship.
        linreg_export(opt.snapshot_path, &run, params);
    }
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    // Did it learn, or blow up? Every rank knows (the loss is all-reduced);
    // rank 0 says it before anyone leaves, then all of them exit with 1.
    bool diverged = linreg_report_divergence(dist.rank, dist.world_size, first_loss, first_epoch,
                                             last_loss, opt.epochs - 1, lr, opt.scale_lr);
    dist_finish(&dist);
    return diverged ? 1 : 0;
}
