// sgd_step.c - EXERCISE: one step of SGD for linear regression, by hand.
//
// Write the two functions below: the gradient of the mean squared error of
// one batch, and the SGD update. They are what common/linreg.h does in
// linreg_cpu_forward_backward and linreg_sgd_step; try without looking.
//
// For a batch of B samples x_i (each with D features) and targets y_i,
// with parameters w[0..D-1] and b = params[D]:
//     prediction  p_i  = x_i . w + b
//     residual    r_i  = p_i - y_i
//     loss        L    = (1/B) sum_i r_i^2
//     gradient    dL/dw_j = (2/B) sum_i r_i x_ij      dL/db = (2/B) sum_i r_i
//     update      params[j] <- params[j] - lr * grads[j]
//
// Hints:
//   - sample i's features are x[i * features + 0 .. i * features + features - 1].
//   - grads holds ONE batch's gradient: set it, do not add to what was there.
//   - sum the loss in a double: many small squares lose digits in a float.
//
// Check it (from the course's top folder):
//     make check-exercise EX=01/sgd_step
// The check compares your gradient with a reference on small batches, names
// the first wrong parameter (dL/dw[j] or dL/db), and then trains the
// chapter's model with your two functions: it must learn w = 2, b = 3.
#include "exercises.h"

float mse_gradient(const float *x, const float *y, int batch, int features, const float *params,
                   float *grads) {
    // TODO: compute the residuals, the loss and the gradient (formulas above).
    (void)x;
    (void)y;
    (void)batch;
    (void)features;
    (void)params;
    (void)grads;
    return 0.0f;
}

void sgd_update(float *params, const float *grads, int count, float lr) {
    // TODO: one step down the gradient.
    (void)params;
    (void)grads;
    (void)count;
    (void)lr;
}
