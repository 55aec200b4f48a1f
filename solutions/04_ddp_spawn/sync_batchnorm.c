// sync_batchnorm.c - reference solution of exercise 04/sync_batchnorm.
//
// Sums add up over ranks where means and variances do not: each rank sends
// its per-feature sums of x and x^2 and its row count in ONE all-reduce
// (in double, so that E[x^2] - mean^2 keeps its digits), and every rank
// then computes the same statistics of the whole batch. The backward pass
// needs two more sums per feature, in a second all-reduce. PyTorch's
// SyncBatchNorm does the same with an all-gather of each rank's mean,
// variance and count, and an all-reduce in backward.
#include <stdlib.h>

#include "check.h"
#include "exercises.h"

int sync_batch_stats(pg_t *pg, const float *x, int n, int c, float *mean, float *var) {
    double *s = xcalloc((size_t)(2 * c + 1), sizeof *s);   // sums of x, sums of x^2, count
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) {
            double v = x[(size_t)i * c + j];
            s[j] += v, s[c + j] += v * v;
        }
    s[2 * c] = n;
    pg_all_reduce(pg, s, s, (size_t)(2 * c + 1), DTYPE_F64, OP_SUM);
    double rows = s[2 * c];
    for (int j = 0; j < c; j++) {
        double m = s[j] / rows;
        mean[j] = (float)m, var[j] = (float)(s[c + j] / rows - m * m);
    }
    free(s);
    return (int)rows;
}

void sync_grad_sums(pg_t *pg, const float *g, const float *xhat, int n, int c, float *sum_g, float *sum_gx) {
    double *s = xcalloc((size_t)(2 * c), sizeof *s);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) {
            size_t k = (size_t)i * c + j;
            s[j] += g[k], s[c + j] += (double)g[k] * xhat[k];
        }
    pg_all_reduce(pg, s, s, (size_t)(2 * c), DTYPE_F64, OP_SUM);
    for (int j = 0; j < c; j++) sum_g[j] = (float)s[j], sum_gx[j] = (float)s[c + j];
    free(s);
}
