// layernorm_backward.c - EXERCISE: the backward pass of layer normalisation.
//
// LayerNorm's forward pass (layernorm_forward in gpt/gpt.h), per row x of C
// numbers, with a weight w and a bias b per channel:
//     m    = mean of x                       v = mean of (x - m)^2
//     rstd = 1 / sqrt(v + 1e-5)              xhat = (x - m) * rstd
//     y    = xhat * w + b
// It kept m and rstd of every row (mean[n], rstd[n]) for this pass. Given
// dy = dL/dy (dout), compute and ADD:
//     dbias[c]   += sum over rows of dy[c]
//     dweight[c] += sum over rows of dy[c] * xhat[c]
//     dinp[c]    += dL/dx[c]
// For dL/dx, remember that m and rstd depend on EVERY x of the row. With
// g = dy * w (the gradient at xhat) it comes out as
//     dL/dx[c] = rstd * (g[c] - mean(g) - xhat[c] * mean(g * xhat))
// (derive it if you can: the mean(g) term comes from m, the other from v).
//
//     void layernorm_backward(float *dinp, float *dweight, float *dbias,
//                             const float *dout, const float *inp, const float *weight,
//                             const float *mean, const float *rstd, int N, int C);
//   inp, dout, dinp: N x C, row n at [n * C]; weight, dweight, dbias: C;
//   mean, rstd: N.
//
// Hints:
//   - ADD, do not overwrite: dinp is the gradient of the residual stream,
//     which already holds the other branch's share; dweight and dbias
//     accumulate over micro-batches (--grad_accum).
//   - Two passes per row: first the two means, then dx.
//   - gpt.h has the course's version; try without looking, then compare.
//
// Check it (from the course's top folder):
//     make check-exercise EX=08/layernorm_backward
// The check compares with a reference computed in double precision and
// with finite differences of the forward pass, names the first wrong
// element (dinp[row, channel], dweight[c] or dbias[c]), and recognises the
// usual slips: overwriting instead of adding, treating m and rstd as
// constants, a missing term.
#include "exercises.h"

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C) {
    // TODO: dbias, dweight and dinp, as above.
    (void)dinp;
    (void)dweight;
    (void)dbias;
    (void)dout;
    (void)inp;
    (void)weight;
    (void)mean;
    (void)rstd;
    (void)N;
    (void)C;
}
