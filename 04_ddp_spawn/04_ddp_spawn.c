// 04_ddp_spawn.c - Chapter 4: data-parallel training, started by the
// program itself (the mp.spawn way).
//
// The model and data of chapter 01, trained data parallel: W processes
// (ranks), each with its own replica of the model and its own 1/W of every
// epoch (the sampler), batch 32 EACH, so the job takes W*32 samples per
// step; the gradients are averaged across ranks with all-reduce before
// every step. With W times the batch, the learning rate is scaled by W
// (the linear scaling rule). `--nprocs 1` is chapter 01's training again;
// how much faster W ranks are is measured like a benchmark, by
// `make speedup` (tools/speedup.sh), not by this lesson.
//
// Read the diff first: `make diffs` shows what changed since chapter 01.
// Read it top to bottom: options, the training that every rank runs
// (set-up, data, model, training loop, report), then main, which spawns
// the ranks. From chapter 05 on, the training is the same text.
#include <stdio.h>
#include <unistd.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "sampler.h"
#include "spawn.h"
#include "timer.h"

#define CHAPTER "04_ddp_spawn"

typedef struct {
    int epochs, batch_size, features, samples, seed, check_replicas;
    double lr, timeout;
    const char *backend, *device, *grad_compress;
    bool scale_lr;
    int nprocs;
} options;

static options parse_options(int argc, char **argv, int gpus) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    options o = {.epochs = 10, .batch_size = 32, .features = 1, .samples = 10000, .seed = 42, .lr = 0.01,
                 .backend = "auto", .device = "auto", .grad_compress = "none", .scale_lr = true,
                 // One rank per GPU; without GPUs, one rank per core (at least
                 // 2, so that there is something to be parallel about).
                 .nprocs = gpus > 0 ? gpus : (cores > 2 ? (int)cores : 2)};
    flag_set set = {.program = CHAPTER,
                    .summary = "data-parallel training of the chapter 01 model, started with spawn"};
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
    flag_int(&set, "nprocs", &o.nprocs, 1, 256, "number of ranks (processes) to spawn");
    flag_int(&set, "check_replicas", &o.check_replicas, 0, 1000000000, "every N steps, stop if the replicas differ (0: never)");
    flag_double(&set, "timeout", &o.timeout, 0, 86400, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)");
    flags_parse(&set, argc, argv);
    return o;
}

// Every rank runs this function, in its own process (spawn forked it).
static int train(int rank, int world_size, void *arg) {
    (void)rank;         // dist_init reads both from the variables spawn set,
    (void)world_size;   // as it would read a launcher's (chapter 05)
    options opt = *(const options *)arg;

    // --- Set-up: who am I? The variables that spawn set say; dist_init
    // reads them, meets the other ranks and builds the process group.
    dist_t dist;
    dist_options how = {"env://", opt.backend, opt.device, opt.timeout};
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
        // Each rank says what it is doing: lines from all of them
        // interleave, and the rank label tells them apart.
        printf("[%s%d] Epoch %d | Batchsize: %d | Steps: %lld\n", device_is_cuda(&dist.device) ? "GPU" : "CPU",
               dist.rank, epoch, opt.batch_size, (long long)((sampler.num_samples + opt.batch_size - 1) / opt.batch_size));
        fflush(stdout);
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

// ---------------------------------------------------------------- main
int main(int argc, char **argv) {
    int gpus = device_count_gpus_before_fork();
    options opt = parse_options(argc, argv, gpus);
    if (!strcmp(opt.backend, "nccl") && opt.nprocs > gpus)
        die("--backend nccl needs one GPU per rank, but %d ranks were asked for and %d GPU(s) are "
            "visible. NCCL cannot put two ranks on one GPU. Run with --backend cpu (or auto), "
            "or with --nprocs %d", opt.nprocs, gpus, gpus > 0 ? gpus : 1);
    printf(CHAPTER ": %d GPU(s) visible; spawning %d rank(s)\n", gpus, opt.nprocs);
    // spawn(W, train, &opt) makes a job of W ranks on this machine and waits
    // for it: 0 when every rank returned 0, 1 when one failed (spawn says
    // which), 128 + the signal when Ctrl-C stopped it.
    return spawn(opt.nprocs, train, &opt);
}
