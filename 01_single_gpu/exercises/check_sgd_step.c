// check_sgd_step.c - checks exercise 01/sgd_step (sgd_step.c).
//
// Run it with `make check-exercise EX=01/sgd_step` from the top folder.
// Three stages, each ending in a verdict in plain words:
//   1. mse_gradient on small hand-made batches, against a reference computed
//      in double precision. The first wrong parameter is named (dL/dw[j] or
//      dL/db), and the usual slips are recognised: a flipped sign, a missing
//      factor 2, a sum instead of a mean, a gradient added to old contents.
//   2. sgd_update against p - lr * g, including "do not touch what is past
//      count".
//   3. Training: chapter 01's data and loop with your two functions. It must
//      learn w = 2 and b = 3, as ./01_single_gpu does.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "linreg.h"
#include "rng.h"

// What the check writes into grads before each call: a value still there
// afterwards was never written.
#define MARKER 777.0f

static bool close_to(double got, double expected) {
    return fabs(got - expected) <= 1e-4 * fmax(1.0, fabs(expected));
}

// ---------------------------------------------------------------- stage 1: the gradient
static void param_name(int j, int features, char *out, size_t size) {
    if (j == features) snprintf(out, size, "dL/db");
    else snprintf(out, size, "dL/dw[%d]", j);
}

// Why a gradient value is wrong, when the value itself gives it away.
static const char *gradient_hint(double got, double want, int batch) {
    if (isnan(got)) return "it is not a number (NaN): an uninitialised variable or 0/0?";
    if (got == MARKER) return "it was never written (it still holds the check's marker 777)";
    if (close_to(got, want + MARKER) || close_to(got, want + MARKER * 2.0 / batch))
        return "it was ADDED to the old contents of grads: set grads to this batch's gradient";
    if (close_to(got, -want)) return "the sign is flipped: the residual is prediction - y, not y - prediction";
    if (close_to(got, want / 2)) return "half the right value: the derivative of r^2 is 2r, so the factor is 2/B";
    if (close_to(got, want * 2)) return "twice the right value: the factor is 2/B, not 4/B";
    if (batch > 1 && close_to(got, want * batch))
        return "B times too large: the loss is the MEAN over the batch, so divide the sum by B";
    if (batch > 1 && close_to(got, want / batch)) return "B times too small: divide by B once, not twice";
    return "compare with the formula in the exercise's header";
}

typedef struct {
    const char *name;
    int batch, features;
    float x[64 * 8], y[64], params[9];
} grad_case;

static void reference(const grad_case *c, double *grads, double *loss) {
    int D = c->features;
    for (int j = 0; j <= D; j++) grads[j] = 0;
    *loss = 0;
    for (int i = 0; i < c->batch; i++) {
        double r = (double)c->params[D] - c->y[i];
        for (int j = 0; j < D; j++) r += (double)c->x[i * D + j] * c->params[j];
        *loss += r * r / c->batch;
        for (int j = 0; j < D; j++) grads[j] += 2 * r * c->x[i * D + j] / c->batch;
        grads[D] += 2 * r / c->batch;
    }
}

static bool check_gradient(const grad_case *c) {
    double want[9], want_loss;
    float got[9];
    reference(c, want, &want_loss);
    for (int j = 0; j <= c->features; j++) got[j] = MARKER;
    float loss = mse_gradient(c->x, c->y, c->batch, c->features, c->params, got);
    for (int j = 0; j <= c->features; j++) {
        if (close_to(got[j], want[j])) continue;
        char name[32];
        param_name(j, c->features, name, sizeof name);
        verdict(false, "%s: %s: got %g, expected %g: %s", c->name, name, got[j], want[j],
                gradient_hint(got[j], want[j], c->batch));
        return false;
    }
    if (!close_to(loss, want_loss)) {
        verdict(false, "%s: the returned loss is %g, expected %g (the mean of r_i^2 over the batch)%s",
                c->name, loss, want_loss, loss == 0 ? ": return the loss you computed" : "");
        return false;
    }
    // Called again on the same batch, the answer must not change.
    for (int j = 0; j <= c->features; j++) got[j] = 0.5f;
    mse_gradient(c->x, c->y, c->batch, c->features, c->params, got);
    for (int j = 0; j <= c->features; j++)
        if (!close_to(got[j], want[j])) {
            verdict(false, "%s: with 0.5 already in grads, entry %d came out %g instead of %g: "
                    "set grads, do not add to it", c->name, j, got[j], want[j]);
            return false;
        }
    verdict(true, "%s: gradient and loss", c->name);
    return true;
}

static grad_case random_case(const char *name, int batch, int features, uint64_t seed) {
    grad_case c = {name, batch, features, {0}, {0}, {0}};
    rng_t rng = rng_seed(seed);
    for (int i = 0; i < batch * features; i++) c.x[i] = (float)rng_normal(&rng);
    for (int i = 0; i < batch; i++) c.y[i] = (float)(3 * rng_normal(&rng));
    for (int j = 0; j <= features; j++) c.params[j] = (float)rng_normal(&rng);
    return c;
}

static bool stage_gradient(void) {
    printf("1. mse_gradient\n");
    // r = 2*0.5 + 0.25 - 7 = -5.75: loss 33.0625, dL/dw = 2*r*x = -23, dL/db = 2*r = -11.5
    grad_case one = {"1 sample, 1 feature (x=2, y=7, w=0.5, b=0.25)", 1, 1, {2}, {7}, {0.5f, 0.25f}};
    grad_case four = {"4 samples, 1 feature", 4, 1, {1, 2, -1, 0.5f}, {3, 5, 1, 4}, {1.5f, -0.5f}};
    grad_case cases[] = {one, four, random_case("5 samples, 3 features", 5, 3, 7),
                         random_case("64 samples, 8 features", 64, 8, 8)};
    bool all = true;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) all &= check_gradient(&cases[k]);
    return all;
}

// ---------------------------------------------------------------- stage 2: the update
static bool stage_update(void) {
    printf("2. sgd_update\n");
    float params[5] = {1, -2, 0.5f, 3, 42}, grads[5] = {0.5f, -1, 2, 0, 9};
    const float before[5] = {1, -2, 0.5f, 3, 42}, lr = 0.1f;
    sgd_update(params, grads, 4, lr);
    for (int j = 0; j < 4; j++) {
        float want = before[j] - lr * grads[j];
        if (close_to(params[j], want)) continue;
        const char *hint = params[j] == before[j] && grads[j] != 0 ? "it did not change"
                         : close_to(params[j], before[j] + lr * grads[j]) ? "it went UP the gradient: subtract lr * grads[j]"
                         : close_to(params[j], before[j] - grads[j]) ? "the step forgot the learning rate"
                         : "expected params[j] - lr * grads[j]";
        verdict(false, "params[%d] after one step with lr %g: got %g, expected %g: %s", j, lr,
                params[j], want, hint);
        return false;
    }
    if (params[4] != before[4]) {
        verdict(false, "sgd_update(params, grads, 4, lr) changed params[4], which is past count: "
                "loop over j < count only");
        return false;
    }
    verdict(true, "params[j] - lr * grads[j] for 4 parameters, nothing past count touched");
    return true;
}

// ---------------------------------------------------------------- stage 3: training
// Chapter 01's loop: 10000 samples of y = 2x + 3 + noise, batch 32, lr 0.01,
// a new order each epoch, with your mse_gradient and sgd_update.
static void stage_training(void) {
    printf("3. training the chapter's model with your functions (3 epochs)\n");
    enum { SAMPLES = 10000, BATCH = 32, EPOCHS = 3 };
    linreg_data data = linreg_make_data(1, SAMPLES, 42);
    int64_t *order = xmalloc(sizeof(int64_t) * SAMPLES);
    float params[2] = {0, 0}, grads[2], xb[BATCH], yb[BATCH];
    double last_epoch_loss = 0;
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        rng_t shuffle = rng_seed(42 + (uint64_t)epoch);
        rng_permutation(&shuffle, order, SAMPLES);
        double loss_sum = 0;
        int batches = 0;
        for (int first = 0; first < SAMPLES; first += BATCH, batches++) {
            int size = SAMPLES - first < BATCH ? SAMPLES - first : BATCH;
            for (int i = 0; i < size; i++) {
                xb[i] = data.x[order[first + i]];
                yb[i] = data.y[order[first + i]];
            }
            loss_sum += mse_gradient(xb, yb, size, 1, params, grads);
            sgd_update(params, grads, 2, 0.01f);
        }
        last_epoch_loss = loss_sum / batches;
    }
    bool learned = fabs(params[0] - 2) < 0.05 && fabs(params[1] - 3) < 0.05;
    verdict(learned, "after %d epochs: w = %.4f, b = %.4f (true 2 and 3), last epoch's mean loss %.4f "
            "(the noise floor is 0.01)%s", EPOCHS, params[0], params[1], last_epoch_loss,
            learned ? "" : ": the model did not learn");
    free(order);
    linreg_free_data(&data);
}

int main(void) {
    printf("check 01/sgd_step: the gradient of the MSE loss and the SGD update (sgd_step.c)\n");
    bool gradient_ok = stage_gradient();
    bool update_ok = stage_update();
    if (gradient_ok && update_ok) stage_training();
    else printf("3. training: skipped until 1 and 2 pass\n");
    return check_finish("your gradient and update match the reference and learn w = 2, b = 3");
}
