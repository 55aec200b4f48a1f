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

typedef struct {
    int epochs, batch_size, features, samples, seed, check_replicas;
    double lr, timeout;
    const char *backend, *device, *init_method;
    bool scale_lr;
} options;

static options parse_options(int argc, char **argv) {
    options o = {10, 32, 1, 10000, 42, 0, 0.01, 0, "auto", "auto", "env://", true};
    flag_t flags[] = {
        {"epochs", NULL, FLAG_INT, &o.epochs, "passes over the data", 1, 100000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.lr, "learning rate of one process", 0, 100, NULL, NULL},
        {"scale_lr", NULL, FLAG_BOOL, &o.scale_lr, "multiply lr by the world size (linear scaling rule)", 1, 0, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl|mpi", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"init_method", NULL, FLAG_STRING, &o.init_method, "how ranks meet: env://, tcp://HOST:PORT, file:///path", 1, 0, NULL, NULL},
        {"check_replicas", NULL, FLAG_INT, &o.check_replicas, "every N steps, stop if the replicas differ (0: never)", 0, 1000000000, NULL, NULL},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
    };
    flag_set set = {"05_env_launch", "data-parallel training; rank and world size come from the launcher",
                    NULL, flags, (int)(sizeof flags / sizeof flags[0])};
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
    log_main("05_env_launch: %d rank(s) (%s), backend %s; rank 0 on %s: %s\n", dist.world_size,
             dist.env.launched ? dist.env.source : "no launcher: a single process",
             pg_describe(dist.pg), dist.device.name, dist.device.why);
    // The effective batch is world_size x batch_size; the linear scaling
    // rule raises the learning rate by the same factor.
    float lr = (float)(opt.scale_lr ? opt.lr * dist.world_size : opt.lr);
    log_main("batch %d per rank x %d rank(s) = %d per step; lr %g\n", opt.batch_size,
             dist.world_size, opt.batch_size * dist.world_size, lr);

    // --- Data and sampler: every rank makes the same dataset; the sampler
    // gives each its disjoint share of every epoch.
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    sampler_t sampler = sampler_create(opt.samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt.seed, false);

    // --- Model: replicas made equal by broadcasting rank 0's parameters.
    linreg_model model;
    linreg_init(&model, &dist.device, &data, opt.batch_size);
    size_t nparams = (size_t)opt.features + 1;
    ddp_broadcast_parameters(dist.pg, model.params, nparams);

    char out_dir[1024];
    runs_dir(out_dir, sizeof out_dir, "05_env_launch");
    metrics_csv csv = {0};
    if (dist.rank == 0) csv = metrics_open(out_dir, "train", "epoch,loss,seconds");

    // --- Training loop.
    pg_barrier(dist.pg);
    double start = now_seconds();
    long step = 0;
    double first_loss = 0, last_loss = 0;   // of the first and the last epoch
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        sampler_set_epoch(&sampler, epoch);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += opt.batch_size) {
            int size = (int)(sampler.num_samples - first < opt.batch_size
                                 ? sampler.num_samples - first : opt.batch_size);
            linreg_forward_backward(&model, first, size);
            ddp_average_gradients(dist.pg, model.grads, nparams);
            linreg_sgd_step(&model, lr);
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
        log_main("epoch %2d | loss %.6f (mean over all ranks) | %ld steps | %.3f s\n", epoch,
                 epoch_loss, step, now_seconds() - start);
        if (dist.rank == 0) metrics_row(&csv, "%d,%.8f,%.6f", epoch, epoch_loss, now_seconds() - start);
    }
    pg_barrier(dist.pg);
    double seconds = now_seconds() - start;

    // --- Report and teardown.
    float *params = xmalloc(sizeof(float) * nparams);
    linreg_get_params(&model, params);
    if (dist.rank == 0) {
        metrics_close(&csv);
        log_main("final weight %.6f  bias %.6f  (true 2.0, 3.0)\n", params[0], params[opt.features]);
        log_main("training time %.6f s on %d rank(s) (%.0f samples/s)\n", seconds, dist.world_size,
                 (double)opt.samples * opt.epochs / seconds);
    }
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    // Did it learn, or blow up? Every rank knows (the loss is all-reduced);
    // rank 0 says it before anyone leaves, then all of them exit with 1.
    bool diverged = linreg_diverged(first_loss, last_loss);
    if (diverged && dist.rank == 0)
        course_say("error: training diverged: the loss went from %g (epoch 0) to %g (epoch %d). lr %g%s is "
                   "too large: SGD on this data is stable only for lr below 1. Use --lr %g or less, or "
                   "fewer ranks", first_loss, last_loss, opt.epochs - 1, lr,
                   opt.scale_lr && dist.world_size > 1 ? " (lr x world size, the linear scaling rule)" : "",
                   0.5 / (opt.scale_lr ? dist.world_size : 1));
    dist_finish(&dist);
    return diverged ? 1 : 0;
}
