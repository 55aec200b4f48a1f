// exercises.h - the functions chapter 04's exercises ask you to write.
//
// You write them in average_gradients.c and sync_batchnorm.c; the check
// programs beside them call them, so keep these signatures. Check one from
// the course's top folder with
//   make check-exercise EX=04/average_gradients   (or EX=04/sync_batchnorm)
#ifndef EXERCISES_04_H
#define EXERCISES_04_H

#include <stddef.h>

#include "pg.h"

// grads[0..count-1] <- the mean over all ranks of grads, on every rank.
void average_gradients(pg_t *pg, float *grads, size_t count);

// Exercise 04/sync_batchnorm (sync_batchnorm.c): BatchNorm's statistics
// over the whole batch when each rank holds a part of it, as PyTorch's
// SyncBatchNorm. x and g are n rows of c features (row-major); n may differ
// from rank to rank.
// mean[j], var[j] <- over ALL ranks' rows: the mean and the biased variance
// (divided by the number of rows). Returns that number of rows.
int sync_batch_stats(pg_t *pg, const float *x, int n, int c, float *mean, float *var);
// sum_g[j], sum_gx[j] <- over ALL ranks' rows: the sums of g[i][j] and of
// g[i][j] * xhat[i][j] (what BatchNorm's backward pass needs).
void sync_grad_sums(pg_t *pg, const float *g, const float *xhat, int n, int c, float *sum_g, float *sum_gx);

#endif
