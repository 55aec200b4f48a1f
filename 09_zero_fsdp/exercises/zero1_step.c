// zero1_step.c - EXERCISE: the ZeRO-1 optimizer step, in three calls.
//
// DDP all-reduces the gradients and then every rank runs AdamW on ALL the
// parameters, with a copy of AdamW's moments for all of them: N ranks, N
// copies of the same work and of the same state. ZeRO-1 splits both. Each
// rank owns one slice of the flat array and keeps AdamW's moments of that
// slice only (chapter 09's --shard 1; zero.h does it bucket by bucket):
//
//     void zero1_step(pg_t *pg, float *params, const float *grads, float *grad_slice,
//                     float *adam_m, float *adam_v, size_t slice, int step, float lr,
//                     float beta1, float beta2, float eps, float weight_decay);
//
//   params      N * slice floats, the same on every rank before and after
//   grads       N * slice floats: this rank's own gradient of them
//   grad_slice  slice floats, for the mean of this rank's slice of the gradient
//   adam_m/v    slice floats each: AdamW's moments of this rank's slice
//
// 1. pg_reduce_scatter(pg, send, recv, count, DTYPE_F32, OP_AVG) gives rank
//    r the mean over the ranks of block r of `send` (count floats per
//    block): exactly this rank's slice of the averaged gradient.
// 2. AdamW, as gpt.h's gpt_adamw_step, for each i in 0..slice-1 with
//    p = params[r * slice + i] and g = grad_slice[i]:
//        m = beta1 m + (1 - beta1) g,    v = beta2 v + (1 - beta2) g g
//        p -= lr * weight_decay * p
//        p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
//    (the two corrections in double, as gpt.h: 1 - pow(beta1, step)).
// 3. pg_all_gather(pg, send, recv, count, DTYPE_F32) puts rank q's `count`
//    floats at recv + q * count on every rank. In place is allowed: send
//    may be recv + r * count, this rank's own block.
//
// Hints: pg_rank(pg) is r. Every rank must make the same pg_ calls in the
// same order. The check gives every rank its own gradients, runs two
// steps on 1, 2 and 3 ranks, and compares with one process stepping all
// the parameters with the mean gradient.
#include <math.h>

#include "exercises.h"

void zero1_step(pg_t *pg, float *params, const float *grads, float *grad_slice, float *adam_m, float *adam_v,
                size_t slice, int step, float lr, float beta1, float beta2, float eps, float weight_decay) {
    // TODO: 1. reduce-scatter the gradients (OP_AVG) into grad_slice;
    //       2. AdamW on params[r * slice .. (r + 1) * slice) with grad_slice, adam_m, adam_v;
    //       3. all-gather every rank's slice into params.
    (void)pg, (void)params, (void)grads, (void)grad_slice, (void)adam_m, (void)adam_v, (void)slice;
    (void)step, (void)lr, (void)beta1, (void)beta2, (void)eps, (void)weight_decay;
}
