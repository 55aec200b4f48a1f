// 04_ddp_spawn.c - Chapter 4: data-parallel training, started by the
// program itself (the mp.spawn way).
//
// The model and data of chapter 01, trained twice:
//   1. the baseline: one process, batch 32, learning rate lr;
//   2. data parallel: W processes, each with its own replica of the model
//      and its own 1/W of every epoch (the sampler), batch 32 EACH, so the
//      job takes W*32 samples per step; the gradients are averaged across
//      ranks with all-reduce before every step. With W times the batch,
//      the learning rate is scaled by W, as the classic comparison does.
// Then it compares the two: the same answer, and how much faster. "How much
// faster" is measured like a benchmark: the two runs you see are the
// warm-up, then --repeats more of each, interleaved, give the median time
// and the spread of the speedup.
//
// Read it top to bottom: options, the worker that every rank runs (set-up,
// data, model, training loop, teardown), then main, which spawns them.
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "sampler.h"
#include "spawn.h"
#include "timer.h"

typedef struct {
    int nprocs, epochs, batch_size, features, samples, seed, check_replicas, repeats;
    double lr, timeout;
    const char *backend, *device;
    bool no_baseline;
} options;

// What rank 0 of a run hands back to main: workers are separate processes,
// so they write into memory that main mapped as shared before forking.
typedef struct {
    int done;
    double seconds;
    int world_size;
    double first_loss, last_loss;   // rank 0's loss: its first batch's, and its last epoch's mean
    float params[]; // w[0..D-1], b
} run_result;

typedef struct {
    options opt;
    float lr;            // the learning rate this run uses
    bool quiet;          // a timing repetition: no progress lines
    run_result *result;
} run_plan;

// ---------------------------------------------------------------- the worker
// Every rank runs this function, in its own process.
static int train_worker(int rank, int world_size, void *arg) {
    const run_plan *plan = arg;
    const options *opt = &plan->opt;
    (void)rank;
    (void)world_size;

    // --- Set-up: join the job (rendezvous, device, process group).
    dist_t dist;
    dist_options how = {"env://", opt->backend, opt->device, opt->timeout};
    dist_init(&dist, &how);
    const char *kind = device_is_cuda(&dist.device) ? "GPU" : "CPU";
    if (dist.rank == 0 && !plan->quiet)
        log_main("[%s0] %d rank(s), backend %s; device %s: %s\n", kind, dist.world_size,
                 pg_describe(dist.pg), dist.device.name, dist.device.why);

    // --- Data: every rank makes the full dataset from the same seed (as
    // every rank would open the same files); the sampler then picks this
    // rank's share of each epoch.
    linreg_data data = linreg_make_data(opt->features, opt->samples, (uint64_t)opt->seed);
    sampler_t sampler = sampler_create(opt->samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt->seed, false);

    // --- Model: a replica per rank, made equal by broadcasting rank 0's.
    linreg_model model;
    linreg_init(&model, &dist.device, &data, opt->batch_size);
    size_t nparams = (size_t)opt->features + 1;
    ddp_broadcast_parameters(dist.pg, model.params, nparams);

    // --- Training loop. The clock starts when every rank is ready.
    pg_barrier(dist.pg);
    double start = now_seconds();
    long step = 0, since_print = 0;
    // Rank 0 watches its loss: the first batch's (where training starts),
    // every 100 batches' mean (printed), and the last epoch's mean.
    double first_loss = NAN, last_loss = NAN, window = 0, epoch_sum = 0;
    for (int epoch = 0; epoch < opt->epochs; epoch++) {
        sampler_set_epoch(&sampler, epoch); // a new order each epoch, the same on every rank
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        long steps = (long)((sampler.num_samples + opt->batch_size - 1) / opt->batch_size);
        // Each rank says what it is doing: with several ranks, lines from
        // all of them interleave, and the rank label tells them apart.
        if (!plan->quiet) {
            printf("[%s%d] Epoch %d | Batchsize: %d | Steps: %ld\n", kind, dist.rank, epoch,
                   opt->batch_size, steps);
            fflush(stdout);
        }
        for (int64_t first = 0; first < sampler.num_samples; first += opt->batch_size) {
            int size = (int)(sampler.num_samples - first < opt->batch_size
                                 ? sampler.num_samples - first : opt->batch_size);
            linreg_forward_backward(&model, first, size);           // local gradient
            ddp_average_gradients(dist.pg, model.grads, nparams);  // the one DDP line
            linreg_sgd_step(&model, plan->lr);                      // same update everywhere
            step++;
            since_print++;
            if (dist.rank == 0 && (step == 1 || since_print == 100)) {
                double taken = linreg_take_loss_sum(&model);   // the sum since the last take
                window += taken;
                epoch_sum += taken;
                if (step == 1) first_loss = taken;
            }
            if (dist.rank == 0 && since_print == 100) {
                if (!plan->quiet)
                    log_main("[%s0] step %5ld | loss %.6f (mean of rank 0's last 100 batches)\n", kind,
                             step, window / 100);
                window = 0;
                since_print = 0;
            }
            if (opt->check_replicas > 0 && step % opt->check_replicas == 0)
                ddp_check_replicas(dist.pg, &dist.device, model.params, nparams, step);
        }
        if (dist.rank == 0) {
            double taken = linreg_take_loss_sum(&model);
            window += taken;
            last_loss = (epoch_sum + taken) / (double)steps;
            epoch_sum = 0;
        }
    }
    pg_barrier(dist.pg); // the job is done when the slowest rank is
    double seconds = now_seconds() - start;

    // --- Teardown: rank 0 reports back to main.
    if (dist.rank == 0) {
        linreg_get_params(&model, plan->result->params);
        plan->result->seconds = seconds;
        plan->result->world_size = dist.world_size;
        plan->result->first_loss = first_loss;
        plan->result->last_loss = last_loss;
        plan->result->done = 1;
    }
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    dist_finish(&dist);
    return 0;
}

// ---------------------------------------------------------------- main
static options parse_options(int argc, char **argv, int gpus) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    // One rank per GPU; without GPUs, one rank per core (at least 2, so
    // that there is something to be parallel about).
    options o = {gpus > 0 ? gpus : (cores > 2 ? (int)cores : 2), 10, 32, 1, 10000, 42, 0, 5,
                 0.01, 0, "auto", "auto", false};
    flag_t flags[] = {
        {"nprocs", NULL, FLAG_INT, &o.nprocs, "number of ranks (processes)", 1, 256, NULL, NULL},
        {"epochs", NULL, FLAG_INT, &o.epochs, "passes over the data", 1, 100000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.lr, "learning rate of one process (DDP uses lr x nprocs)", 0, 100, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl|mpi", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"no_baseline", NULL, FLAG_BOOL, &o.no_baseline, "skip the single-process run", 1, 0, NULL, NULL},
        {"check_replicas", NULL, FLAG_INT, &o.check_replicas, "every N steps, stop if the replicas differ (0: never)", 0, 1000000000, NULL, NULL},
        {"repeats", NULL, FLAG_INT, &o.repeats, "timed runs of each, after the two you see (the warm-up)", 1, 1000, NULL, NULL},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
    };
    flag_set set = {"04_ddp_spawn", "data-parallel training of the chapter 01 model, started with spawn",
                    NULL, flags, (int)(sizeof flags / sizeof flags[0])};
    flags_parse(&set, argc, argv);
    return o;
}

// Runs the training on `world_size` spawned ranks into `result` (memory that
// main mapped as shared before forking). Ctrl-C ends the program as spawn
// reports it ("got SIGINT; stopping ..."), with status 128 + the signal.
static void run(const options *opt, int world_size, float lr, bool quiet, run_result *result) {
    result->done = 0;
    run_plan plan = {*opt, lr, quiet, result};
    int status = spawn(world_size, train_worker, &plan);
    if (status > 128) exit(status);
    if (status != 0 || !result->done)
        die("the run with %d rank(s) failed (see the messages above)", world_size);
}

static run_result *new_result(const options *opt) {
    size_t bytes = sizeof(run_result) + sizeof(float) * (size_t)(opt->features + 1);
    run_result *result = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (result == MAP_FAILED) die("mmap of %zu bytes failed: %s", bytes, strerror(errno));
    return result;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of n numbers (sorts them).
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_times(const char *label, const double *seconds, int n) {
    printf("%-14s", label);
    for (int i = 0; i < n; i++) printf(" %.6f", seconds[i]);
    printf(" s\n");
}

static void print_result(const char *label, const run_result *r, double seconds, const char *how,
                         int features, int samples, int epochs) {
    printf("%-14s weight %.6f  bias %.6f  time %.6f s (%s)  %.0f samples/s\n", label, r->params[0],
           r->params[features], seconds, how, (double)samples * epochs / seconds);
}

int main(int argc, char **argv) {
    int gpus = device_count_gpus_before_fork();
    options opt = parse_options(argc, argv, gpus);
    if (!strcmp(opt.backend, "nccl") && opt.nprocs > gpus)
        die("--backend nccl needs one GPU per rank, but %d ranks were asked for and %d GPU(s) are "
            "visible. NCCL cannot put two ranks on one GPU. Run with --backend cpu (or auto), "
            "or with --nprocs %d", opt.nprocs, gpus, gpus > 0 ? gpus : 1);
    printf("04_ddp_spawn: %d GPU(s) visible; %d rank(s) for the data-parallel run\n", gpus, opt.nprocs);

    run_result *baseline = NULL;
    if (!opt.no_baseline) {
        printf("\n=== baseline: 1 process, batch %d, lr %g\n", opt.batch_size, opt.lr);
        baseline = new_result(&opt);
        run(&opt, 1, (float)opt.lr, false, baseline);
    }
    // W ranks take W times the samples per step; the linear scaling rule
    // keeps the size of an epoch's progress the same by scaling lr by W.
    float ddp_lr = (float)(opt.lr * opt.nprocs);
    printf("\n=== DDP: %d processes, batch %d per rank (%d per step in all), lr %g (%g x %d)\n",
           opt.nprocs, opt.batch_size, opt.batch_size * opt.nprocs, ddp_lr, opt.lr, opt.nprocs);
    run_result *ddp = new_result(&opt);
    run(&opt, opt.nprocs, ddp_lr, false, ddp);

    // --- Timing. One run says little: the first run of a program pays for
    // page faults and cold caches, and on a shared machine any run can meet
    // other work. So the two runs above were the warm-up; now --repeats
    // more of each, interleaved (baseline, DDP, baseline, DDP, ...), so that
    // a busy moment hits both alike. Each pair gives one speedup; we report
    // the median, and the range that a rerun could land in.
    char label[32];
    snprintf(label, sizeof label, "DDP (%d)", opt.nprocs);
    int n = opt.repeats;
    double *base_s = xcalloc((size_t)n, sizeof(double)), *ddp_s = xcalloc((size_t)n, sizeof(double));
    double *speedups = xcalloc((size_t)n, sizeof(double));
    if (baseline) {
        run_result *scratch = new_result(&opt);
        for (int i = 0; i < n; i++) {
            run(&opt, 1, (float)opt.lr, true, scratch);
            base_s[i] = scratch->seconds;
            run(&opt, opt.nprocs, ddp_lr, true, scratch);
            ddp_s[i] = scratch->seconds;
            speedups[i] = base_s[i] / ddp_s[i];
        }
        printf("\n=== timing: %d more run(s) of each, interleaved; the runs above were the warm-up\n", n);
        print_times("baseline (1)", base_s, n);
        print_times(label, ddp_s, n);
    }

    printf("\n=== results (true weight 2.0, bias 3.0)\n");
    if (baseline) {
        char how[48];
        snprintf(how, sizeof how, "median of %d", n);
        print_result("baseline (1)", baseline, median(base_s, n), how, opt.features, opt.samples, opt.epochs);
        print_result(label, ddp, median(ddp_s, n), how, opt.features, opt.samples, opt.epochs);
        double best = speedups[0], worst = speedups[0];
        for (int i = 1; i < n; i++) {
            if (speedups[i] > best) best = speedups[i];
            if (speedups[i] < worst) worst = speedups[i];
        }
        double speedup = median(speedups, n);
        printf("speedup %.3gx (median of %d; range %.3g-%.3gx), parallel efficiency %.0f%% (ideal: %dx, 100%%)\n",
               speedup, n, worst, best, 100.0 * speedup / opt.nprocs, opt.nprocs);
    } else {
        print_result(label, ddp, ddp->seconds, "one run", opt.features, opt.samples, opt.epochs);
    }

    // --- Did the DDP run learn, or blow up? The linear scaling rule makes
    // lr W times larger; for this data SGD diverges once lr reaches 1.
    if (linreg_diverged(ddp->first_loss, ddp->last_loss) || !isfinite(ddp->params[0]))
        die("the DDP run diverged: rank 0's loss went from %g (first batch) to %g (last epoch). Its lr %g (= %g x %d ranks, the "
            "linear scaling rule) is too large: SGD on this data is stable only for lr below 1 (the "
            "loss's curvature is 2). Use --lr %g or less with %d ranks (lr x %d = 0.5, half the limit), "
            "or fewer --nprocs", ddp->first_loss, ddp->last_loss, ddp_lr, opt.lr, opt.nprocs,
            0.5 / opt.nprocs, opt.nprocs, opt.nprocs);
    return 0;
}
