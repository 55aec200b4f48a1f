// zero1_step.c - a solution of exercise 09/zero1_step (see the exercise's
// header for the task): reduce-scatter, AdamW on the slice, all-gather.
#include <math.h>

#include "exercises.h"

void zero1_step(pg_t *pg, float *params, const float *grads, float *grad_slice, float *adam_m, float *adam_v,
                size_t slice, int step, float lr, float beta1, float beta2, float eps, float weight_decay) {
    float *mine = params + (size_t)pg_rank(pg) * slice;
    // 1. The mean over the ranks of this rank's slice of the gradient.
    pg_reduce_scatter(pg, grads, grad_slice, slice, DTYPE_F32, OP_AVG);
    // 2. AdamW on the slice only.
    double c1 = 1 - pow((double)beta1, step), c2 = 1 - pow((double)beta2, step);
    for (size_t i = 0; i < slice; i++) {
        float g = grad_slice[i];
        adam_m[i] = beta1 * adam_m[i] + (1 - beta1) * g;
        adam_v[i] = beta2 * adam_v[i] + (1 - beta2) * g * g;
        float mhat = adam_m[i] / (float)c1, vhat = adam_v[i] / (float)c2;
        mine[i] -= lr * weight_decay * mine[i];
        mine[i] -= lr * mhat / (sqrtf(vhat) + eps);
    }
    // 3. Every rank's slice, to every rank (in place).
    pg_all_gather(pg, mine, params, slice, DTYPE_F32);
}
