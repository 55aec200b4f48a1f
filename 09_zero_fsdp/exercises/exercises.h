// exercises.h - the function chapter 09's exercise asks you to write.
//
// You write it in zero1_step.c; check_zero1_step.c calls it, so keep this
// signature. Check it from the course's top folder with
//   make check-exercise EX=09/zero1_step
#ifndef EXERCISES_09_H
#define EXERCISES_09_H

#include <stddef.h>

#include "pg.h"

// One ZeRO-1 optimizer step on a flat array of N * slice parameters
// (N = pg_world_size(pg)), as 09_zero_fsdp.c takes it with --shard 1.
// Every rank holds all the parameters and its own gradient of them; rank r
// owns slice r, the parameters [r * slice, (r + 1) * slice), and AdamW's
// moments of that slice only (adam_m, adam_v: slice floats each).
//   1. reduce-scatter the gradients, averaging: grad_slice[0..slice)
//      receives the mean over the ranks of this rank's slice;
//   2. AdamW on this rank's slice only (the formula is in zero1_step.c),
//      with grad_slice, adam_m and adam_v; `step` counts from 1;
//   3. all-gather: every rank's updated slice into every rank's params.
void zero1_step(pg_t *pg, float *params, const float *grads, float *grad_slice, float *adam_m, float *adam_v,
                size_t slice, int step, float lr, float beta1, float beta2, float eps, float weight_decay);

#endif
