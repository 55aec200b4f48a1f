// check_average_gradients.c - checks exercise 04/average_gradients.
//
// Run it with `make check-exercise EX=04/average_gradients` from the top
// folder. Two stages:
//   1. 1, 2 and 3 ranks (started with spawn, on the cpu backend) each call
//      your average_gradients on three buffers: 7 small integers (exact
//      answers you can check by eye: rank r holds (r+1)*(j+1)), 1000 random
//      floats, and an empty one. The parent compares every rank's result
//      with the mean, names the first wrong rank and element, recognises a
//      sum where a mean belongs, and insists that all ranks hold the same
//      bytes (or their replicas would drift apart).
//   2. Chapter 04's training, 2 ranks x batch 16, with your function in the
//      loop, must end where 1 process with batch 32 ends (the same samples
//      per step, so the same gradients).
// A rank that is still inside your function after EXERCISE_DEADLINE seconds
// (default 10) is called deadlocked, and the ranks are stopped.
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "linreg.h"
#include "rng.h"
#include "sampler.h"

enum { MAX_WORLD = 3, SMALL = 7, LARGE = 1000, FEATURES = 4 };

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    float small[MAX_WORLD][SMALL];
    float large[MAX_WORLD][LARGE];
    float ddp_params[FEATURES + 1];
} shared_results;

static shared_results *shared;

// What run_ranks says of a deadlock: a printf format given the case, the
// deadline in seconds and the ranks still inside the function.
static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside average_gradients with "
    "no result: do all ranks make the same pg_ calls in the same order?";

// ---------------------------------------------------------------- stage 1: the mean
static float small_input(int rank, int j) { return (float)((rank + 1) * (j + 1)); }

static void large_input(int rank, float *out) {
    rng_t rng = rng_seed(1000 + (uint64_t)rank);
    for (int j = 0; j < LARGE; j++) out[j] = (float)rng_normal(&rng);
}

static int mean_rank(int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dist_t d;
    rank_join(&d);
    float *small = shared->small[rank], *large = shared->large[rank], empty[1] = {0};
    for (int j = 0; j < SMALL; j++) small[j] = small_input(rank, j);
    large_input(rank, large);
    arm_deadline(rank);
    average_gradients(d.pg, small, SMALL);
    average_gradients(d.pg, large, LARGE);
    average_gradients(d.pg, empty, 0);
    alarm(0);
    rank_finished(rank);
    dist_finish(&d);
    return 0;
}

static const char *mean_hint(float got, int rank, int j, int world) {
    double own = small_input(rank, j), sum = 0;
    for (int r = 0; r < world; r++) sum += small_input(r, j);
    if (got == own) return ": it still holds this rank's own gradient; nothing was exchanged";
    if (got == sum) return ": that is the SUM over the ranks; divide it by the world size";
    if (got == sum / world / world) return ": divided by the world size twice";
    if (got == own / world) return ": this rank's own value divided by W; sum over the ranks first";
    return "";
}

static bool check_small(int world) {
    for (int r = 0; r < world; r++)
        for (int j = 0; j < SMALL; j++) {
            float want = (float)((j + 1) * (world + 1)) / 2.0f, got = shared->small[r][j];
            if (got == want) continue;
            verdict(false, "%d rank(s), 7 integers: rank %d, element %d: got %g, expected %g (the mean "
                    "over %d ranks of (r+1)*%d)%s", world, r, j, got, want, world, j + 1,
                    mean_hint(got, r, j, world));
            return false;
        }
    return true;
}

static bool check_large(int world) {
    double want[LARGE] = {0};
    float input[LARGE];
    for (int r = 0; r < world; r++) {
        large_input(r, input);
        for (int j = 0; j < LARGE; j++) want[j] += input[j] / (double)world;
    }
    for (int r = 0; r < world; r++)
        for (int j = 0; j < LARGE; j++) {
            float got = shared->large[r][j], first = shared->large[0][j];
            if (fabs(got - want[j]) > 1e-5 * fmax(1.0, fabs(want[j]))) {
                verdict(false, "%d rank(s), 1000 random floats: rank %d, element %d: got %.7g, expected "
                        "%.7g (the mean over %d ranks)", world, r, j, got, want[j], world);
                return false;
            }
            if (memcmp(&got, &first, sizeof got) != 0) {
                verdict(false, "%d rank(s), 1000 random floats: element %d is %.9g on rank %d but %.9g on "
                        "rank 0: every rank must hold the same bytes, or the replicas drift apart",
                        world, j, got, r, first);
                return false;
            }
        }
    return true;
}

static bool stage_mean(void) {
    printf("1. the mean over 1, 2 and 3 ranks\n");
    bool all = true;
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[64];
        snprintf(what, sizeof what, "%d rank(s)", world);
        if (!run_ranks(world, mean_rank, what)) {
            all = false;
            continue;
        }
        if (check_small(world) && check_large(world))
            verdict(true, "%d rank(s): the mean of 7 integers and of 1000 floats, the same bytes on every "
                    "rank; 0 elements is fine", world);
        else all = false;
    }
    return all;
}

// ---------------------------------------------------------------- stage 2: training
// Chapter 04's loop, one epoch: 9600 samples of a 4-feature model, batch 16
// per rank, lr 0.03, gradients averaged with your function.
enum { SAMPLES = 9600, BATCH = 16, SEED = 42 };
#define LR 0.03f

static void train(linreg_model *model, sampler_t *sampler, int batch, pg_t *pg) {
    sampler_set_epoch(sampler, 0);
    linreg_set_order(model, sampler->indices, sampler->num_samples);
    for (int64_t first = 0; first < sampler->num_samples; first += batch) {
        int size = (int)(sampler->num_samples - first < batch ? sampler->num_samples - first : batch);
        linreg_forward_backward(model, first, size);
        if (pg) average_gradients(pg, model->grads, FEATURES + 1);
        linreg_sgd_step(model, LR);
    }
}

static int ddp_rank(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    rank_join(&d);
    linreg_data data = linreg_make_data(FEATURES, SAMPLES, SEED);
    sampler_t sampler = sampler_create(SAMPLES, world, rank, true, SEED, false);
    linreg_model model;
    linreg_init(&model, &d.device, &data, BATCH);
    arm_deadline(rank);
    train(&model, &sampler, BATCH, d.pg);
    alarm(0);
    if (rank == 0) linreg_get_params(&model, shared->ddp_params);
    rank_finished(rank);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    dist_finish(&d);
    return 0;
}

static void stage_training(void) {
    printf("2. training: 2 ranks x batch 16 with your function against 1 process x batch 32\n");
    if (!run_ranks(2, ddp_rank, "training on 2 ranks")) return;
    device_t cpu = device_choose("cpu", 0);
    linreg_data data = linreg_make_data(FEATURES, SAMPLES, SEED);
    sampler_t sampler = sampler_create(SAMPLES, 1, 0, true, SEED, false);
    linreg_model model;
    linreg_init(&model, &cpu, &data, 2 * BATCH);
    train(&model, &sampler, 2 * BATCH, NULL);
    float single[FEATURES + 1];
    linreg_get_params(&model, single);
    for (int j = 0; j <= FEATURES; j++) {
        float got = shared->ddp_params[j];
        if (fabsf(got - single[j]) <= 1e-5f * fmaxf(1.0f, fabsf(single[j]))) continue;
        verdict(false, "after one epoch, parameter %d (%s) is %.7g with DDP but %.7g in one process "
                "with the same global batch", j, j == FEATURES ? "the bias" : "a weight", got, single[j]);
        break;
    }
    if (check_problems() == 0)
        verdict(true, "after one epoch both runs have w[0] = %.6f, b = %.6f (within 1e-5)", single[0],
                single[FEATURES]);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
}

int main(void) {
    printf("check 04/average_gradients: the mean of the gradients over all ranks (average_gradients.c)\n");
    shared = ranks_setup(sizeof *shared, "average_gradients", deadlock_verdict);
    if (stage_mean()) stage_training();
    else printf("2. training: skipped until 1 passes\n");
    ranks_teardown();
    return check_finish("every rank gets the mean, bit-identical, on 1 to 3 ranks, and DDP with it "
                        "trains exactly like one process with the whole batch");
}
