// layernorm_backward.c - reference solution of exercise 08/layernorm_backward.
#include "exercises.h"

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (long)n * C, *dy = dout + (long)n * C;
        float *dx = dinp + (long)n * C;
        // The two means that carry the dependence of m and rstd on every x.
        float g_mean = 0, gx_mean = 0;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - mean[n]) * rstd[n], g = dy[c] * weight[c];
            g_mean += g;
            gx_mean += g * xhat;
            dbias[c] += dy[c];
            dweight[c] += dy[c] * xhat;
        }
        g_mean /= C;
        gx_mean /= C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - mean[n]) * rstd[n];
            dx[c] += rstd[n] * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
        }
    }
}
