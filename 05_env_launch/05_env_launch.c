// 05_env_launch.c - Chapter 5: the same training, started by a launcher.
//
// Chapter 04 forked its own workers. Real jobs are started from outside:
// a launcher (tools/ddprun here, torchrun in PyTorch, srun on a cluster)
// starts N copies of this program and tells each one who it is through
// environment variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...
// This program never spawns. Started by hand, with none of those
// variables, it is simply a job of one rank.
//
//   ./05_env_launch                                              one process
//   tools/ddprun --standalone --nproc_per_node=2 ./05_env_launch  two ranks
//
// Read the diff first: `make diffs` shows what changed since chapter 04.
// Rank 0 alone prints and writes files; the other ranks work quietly. The
// loss printed per epoch is the mean over ALL ranks (one all-reduce), not
// just rank 0's share.
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "sampler.h"
#include "timer.h"

#define CHAPTER "05_env_launch"

typedef struct {
    int epochs, batch_size, features, samples, seed, check_replicas;
    double lr, timeout;
    const char *backend, *device, *init_method, *grad_compress;
    bool scale_lr;
} options;

static options parse_options(int argc, char **argv) {
    options o = {.epochs = 10, .batch_size = 32, .features = 1, .samples = 10000, .seed = 42, .lr = 0.01,
                 .backend = "auto", .device = "auto", .grad_compress = "none", .init_method = "env://", .scale_lr = true};
    flag_set set = {.program = CHAPTER,
                    .summary = "data-parallel training; rank and world size come from the launcher"};
    flag_int(&set, "epochs", &o.epochs, 1, 100000, "passes over the data");
    flag_int(&set, "batch_size", &o.batch_size, 1, 1000000, "samples per step PER RANK");
    flag_double(&set, "lr", &o.lr, 0, 100, "learning rate of one process");
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
    flags_parse(&set, argc, argv);
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
    // The effective batch is world_size x batch_size; the linear scaling
    // rule raises the learning rate by the same factor.
    float lr = (float)(opt.scale_lr ? opt.lr * dist.world_size : opt.lr);
    log_main("batch %d per rank x %d rank(s) = %d per step; lr %g\n", opt.batch_size,
             dist.world_size, opt.batch_size * dist.world_size, lr);

    // --- Data and sampler: every rank makes the same dataset (as every
    // rank would open the same files); the sampler gives each its disjoint
    // share of every epoch.
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    sampler_t sampler = sampler_create(opt.samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt.seed, false);

    // --- Model: a replica per rank, made equal by broadcasting rank 0's.
    linreg_model model;
    linreg_init(&model, &dist.device, &data, opt.batch_size);
    size_t nparams = (size_t)opt.features + 1;
    // How the gradients travel (DDP's communication hook, common/ddp.h): as
    // fp32, or rounded to bf16 for half the bytes.
    ddp_compress_t compress = ddp_compress_from_name(opt.grad_compress);
    ddp_broadcast_parameters(dist.pg, model.params, nparams);
    int64_t step = 0;

    char out_dir[1024];
    files_runs_dir(out_dir, sizeof out_dir, CHAPTER);
    metrics_csv csv = {0};
    if (dist.rank == 0) csv = metrics_open(out_dir, "train", "epoch,loss,seconds");

    // --- Training loop. The clock starts when every rank is ready.
    pg_barrier(dist.pg);
    double start = now_seconds();
    double first_loss = 0, last_loss = 0;   // of the first and the last epoch
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        sampler_set_epoch(&sampler, epoch); // a new order each epoch, the same on every rank
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += opt.batch_size) {
            int size = (int)(sampler.num_samples - first < opt.batch_size
                                 ? sampler.num_samples - first : opt.batch_size);
            linreg_forward_backward(&model, first, size);             // local gradient
            ddp_average_gradients_with(dist.pg, model.grads, nparams, compress); // the one DDP line
            linreg_sgd_step(&model, lr);                              // same update everywhere
            batches++;
            step++;
            if (opt.check_replicas > 0 && step % opt.check_replicas == 0)
                ddp_check_replicas(dist.pg, &dist.device, model.params, nparams, step);
        }
        // The epoch's loss over all ranks: sum every rank's batch losses
        // and batch counts, then divide. Rank 0's own share would be only
        // 1/world of the picture.
        double loss_and_batches[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss_and_batches, 2, OP_SUM);
        double epoch_loss = loss_and_batches[0] / loss_and_batches[1];
        if (epoch == 0) first_loss = epoch_loss;
        last_loss = epoch_loss;
        log_main("epoch %2d | loss %.6f (mean over all ranks) | %lld steps | %.3f s\n", epoch,
                 epoch_loss, (long long)step, now_seconds() - start);
        if (dist.rank == 0) metrics_row(&csv, "%d,%.8f,%.6f", epoch, epoch_loss, now_seconds() - start);
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
                     ddp_bytes_reduced() / (size_t)(step > 0 ? step : 1), ddp_wire_name(compress));
        log_main("training time %.6f s on %d rank(s) (%.0f samples/s)\n", seconds, dist.world_size,
                 (double)opt.samples * opt.epochs / seconds);
    }
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    // Did it learn, or blow up? Every rank knows (the loss is all-reduced);
    // rank 0 says it before anyone leaves, then all of them exit with 1.
    bool diverged = linreg_report_divergence(dist.rank, dist.world_size, first_loss, 0,
                                             last_loss, opt.epochs - 1, lr, opt.scale_lr);
    dist_finish(&dist);
    return diverged ? 1 : 0;
}
