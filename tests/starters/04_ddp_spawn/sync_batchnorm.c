// sync_batchnorm.c - EXERCISE: BatchNorm over the whole batch when each rank
// holds a part of it (PyTorch's nn.SyncBatchNorm).
//
// BatchNorm normalises each feature j with the mean and variance of the
// batch: xhat = (x - mean) / sqrt(var + eps). With data parallelism each
// rank sees only its own rows, so a plain BatchNorm normalises with its
// rank's statistics, and W ranks no longer compute what one process with
// the whole batch computes. SyncBatchNorm all-reduces what the statistics
// are made of. Write the two functions that do it (exercises.h):
//
//     int sync_batch_stats(pg_t *pg, const float *x, int n, int c, float *mean, float *var);
//         mean[j], var[j] over ALL ranks' rows (var: the biased variance,
//         divided by the number of rows, as BatchNorm normalises with it);
//         returns the number of rows of all ranks together.
//     void sync_grad_sums(pg_t *pg, const float *g, const float *xhat, int n, int c,
//                         float *sum_g, float *sum_gx);
//         sum_g[j] = sum of g[i][j], sum_gx[j] = sum of g[i][j] * xhat[i][j],
//         over ALL ranks' rows: the backward pass,
//         dx = (g - sum_g / N - xhat * sum_gx / N) / sqrt(var + eps),
//         needs them (the check does the rest).
//
// Hints:
//   - The mean and the variance are not additive, but sums are: each rank
//     adds up x and x*x per feature, and var = E[x^2] - mean^2.
//   - The ranks may hold different numbers of rows: add up the counts too.
//   - One all-reduce of 2c + 1 numbers does the forward pass (pack them);
//     DTYPE_F64 keeps E[x^2] - mean^2 from losing digits.
//   - Every rank must make the same pg_ calls in the same order.
//
// Check it (from the course's top folder):
//     make check-exercise EX=04/sync_batchnorm
// The check splits one batch of 12 rows over 1, 2 and 3 ranks (unevenly),
// compares your statistics with the whole batch's and says what a wrong
// result looks like, then runs BatchNorm's forward and backward passes with
// your functions: every rank's input gradient must be what one process
// computes on the whole batch.
#include "exercises.h"

int sync_batch_stats(pg_t *pg, const float *x, int n, int c, float *mean, float *var) {
    // TODO: per feature, the sums of x and x*x and the row count, over all ranks.
    (void)pg, (void)x;
    for (int j = 0; j < c; j++) mean[j] = 0, var[j] = 1;
    return n;
}

void sync_grad_sums(pg_t *pg, const float *g, const float *xhat, int n, int c, float *sum_g, float *sum_gx) {
    // TODO: the two sums per feature, over all ranks.
    (void)pg, (void)g, (void)xhat, (void)n;
    for (int j = 0; j < c; j++) sum_g[j] = 0, sum_gx[j] = 0;
}
