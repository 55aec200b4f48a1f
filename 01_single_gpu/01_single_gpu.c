// 01_single_gpu.c - Chapter 1: training on one device.
//
// The baseline every later chapter is measured against. A linear model
// learns y = 2x + 3 from 10000 noisy samples with mini-batch SGD. On a GPU
// the data and the parameters live in device memory for the whole run: the
// only thing that comes back to the host is the loss we print.
//
// Read it top to bottom: set-up, data, model, training loop, report.
// The model itself (forward, loss, gradient, SGD step) is in
// common/linreg.h (CPU) and common/linreg_gpu.cu (GPU), because chapters
// 04-07 train the very same model on many devices.
#include <stdio.h>
#include <time.h>

#include "device.h"
#include "flags.h"
#include "linreg.h"
#include "metrics.h"
#include "timer.h"

#define CHAPTER "01_single_gpu"

typedef struct {
    int epochs, batch_size, features, samples, seed;
    double lr;
    const char *device;
} options;

static options parse_options(int argc, char **argv) {
    options o = {.epochs = 10, .batch_size = 32, .features = 1, .samples = 10000, .seed = 42, .lr = 0.01,
                 .device = "auto"};
    flag_set set = {.program = CHAPTER,
                    .summary = "linear regression with SGD on one GPU (or the CPU)"};
    flag_int(&set, "epochs", &o.epochs, 1, 100000, "passes over the data");
    flag_int(&set, "batch_size", &o.batch_size, 1, 1000000, "samples per step");
    flag_double(&set, "lr", &o.lr, 0, 100, "learning rate");
    flag_int(&set, "features", &o.features, 1, 65536, "input features D");
    flag_int(&set, "samples", &o.samples, 1, 100000000, "training samples");
    flag_int(&set, "seed", &o.seed, 0, 2147483647, "seed for data and shuffling");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where to compute")->env = "COURSE_DEVICE";
    flags_parse(&set, argc, argv);
    return o;
}

int main(int argc, char **argv) {
    // --- Set-up: choose the device first and say why, so every run's
    // output starts with where it ran.
    options opt = parse_options(argc, argv);
    device_t device = device_choose(opt.device, 0);
    printf(CHAPTER ": running on %s; why: %s\n", device.name, device.why);

    // --- Data: the same seed gives the same samples on every machine.
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    int64_t steps_per_epoch = (opt.samples + opt.batch_size - 1) / opt.batch_size;
    if (opt.features == 1)
        printf("data: %d samples of y = 2x + 3 + %.1f*noise | batch %d | lr %g | %d epochs | %lld steps per epoch\n",
               opt.samples, LINREG_NOISE, opt.batch_size, opt.lr, opt.epochs, (long long)steps_per_epoch);
    else
        printf("data: %d samples of y = X.w_true + 3 + %.1f*noise, %d features | batch %d | lr %g | %d epochs | %lld steps per epoch\n",
               opt.samples, LINREG_NOISE, opt.features, opt.batch_size, opt.lr, opt.epochs,
               (long long)steps_per_epoch);

    // --- Model: w = 0, b = 0, and the dataset copied to the device once.
    linreg_model model;
    linreg_init(&model, &device, &data, opt.batch_size);

    char out_dir[1024];
    files_runs_dir(out_dir, sizeof out_dir, CHAPTER);
    metrics_csv csv = metrics_open(out_dir, "loss", "step,epoch,loss");
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
    // One comment line that plots/make_plots.sh reads for the figure's title.
    metrics_row(&csv, "# %s | backend none (1 process) | %s", device.name, date);

    // --- Training loop. Each epoch visits every sample once, in a new
    // random order (seed + epoch, as PyTorch's DistributedSampler does, so
    // that chapter 04 with one rank repeats this run exactly). The loss
    // printed is the mean over the last 100 batches: one batch's loss is
    // too noisy to read.
    int64_t *order = xmalloc(sizeof(int64_t) * (size_t)opt.samples);
    int64_t step = 0;
    double start = now_seconds();
    for (int epoch = 0; epoch < opt.epochs; epoch++) {
        rng_t shuffle = rng_seed((uint64_t)opt.seed + (uint64_t)epoch);
        rng_permutation(&shuffle, order, (size_t)opt.samples);
        linreg_set_order(&model, order, opt.samples);
        int batches_since_print = 0;
        for (int64_t first = 0, batch = 1; first < opt.samples; first += opt.batch_size, batch++) {
            int size = (int)(opt.samples - first < opt.batch_size ? opt.samples - first : opt.batch_size);
            linreg_forward_backward(&model, first, size); // loss and gradient
            linreg_sgd_step(&model, (float)opt.lr);       // w <- w - lr * dL/dw
            step++;
            if (++batches_since_print == 100 || first + size == opt.samples) {
                double mean_loss = linreg_take_loss_sum(&model) / batches_since_print;
                printf("[%d, %5lld] loss: %.6f\n", epoch + 1, (long long)batch, mean_loss);
                metrics_row(&csv, "%lld,%d,%.8f", (long long)step, epoch + 1, mean_loss);
                batches_since_print = 0;
            }
        }
    }
    device_synchronize(&device); // GPU work is asynchronous: wait before stopping the clock
    double seconds = now_seconds() - start;
    metrics_close(&csv);

    // --- Report: did the model find the true parameters?
    float *params = xmalloc(sizeof(float) * (size_t)(opt.features + 1));
    linreg_get_params(&model, params);
    printf("training time: %.6f s (%.0f samples/s) on %s\n", seconds,
           (double)opt.samples * opt.epochs / seconds, device.name);
    if (opt.features == 1) {
        printf("learned weight: %.6f (true 2.0)\n", params[0]);
    } else {
        printf("learned weights: w[0] = %.6f ... w[%d] = %.6f; largest error vs w_true: %.2e\n",
               params[0], opt.features - 1, params[opt.features - 1], linreg_weight_error(params, &data));
    }
    printf("learned bias: %.6f (true 3.0)\n", params[opt.features]);
    printf("metrics: %s\n", csv.path);

    free(params);
    free(order);
    linreg_free(&model);
    linreg_free_data(&data);
    return 0;
}
