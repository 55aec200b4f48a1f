// row_parallel.c - reference solution of exercise 10/row_parallel.
#include "exercises.h"

void row_parallel_forward(pg_t *tp, float *out, const float *inp, const float *weight, const float *bias, int N,
                          int Ks, int OC) {
    // 1. This rank's partial sum: its Ks inputs' share of every output.
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = 0;
            for (int k = 0; k < Ks; k++) s += inp[n * Ks + k] * weight[o * Ks + k];
            out[n * OC + o] = s;
        }
    // 2. The sum over the ranks (g): every rank holds x W^T, the same bytes.
    pg_all_reduce(tp, out, out, (size_t)N * OC, DTYPE_F32, OP_SUM);
    // 3. The bias once: before the sum it would be added W_ranks times.
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[n * OC + o] += bias[o];
}

// No communication: dinp and dweight need this rank's columns and dout,
// which every rank has; dbias needs dout alone. (The sum of the input
// gradient happens in the column-parallel layer BEFORE this one, f, where
// the ranks' parts of dx add up.)
void row_parallel_backward(pg_t *tp, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, int N, int Ks, int OC) {
    (void)tp;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < Ks; k++) {
            float s = 0;
            for (int o = 0; o < OC; o++) s += dout[n * OC + o] * weight[o * Ks + k];
            dinp[n * Ks + k] = s;
        }
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < Ks; k++) {
            float s = 0;
            for (int n = 0; n < N; n++) s += dout[n * OC + o] * inp[n * Ks + k];
            dweight[o * Ks + k] += s;
        }
    for (int o = 0; o < OC; o++) {
        float s = 0;
        for (int n = 0; n < N; n++) s += dout[n * OC + o];
        dbias[o] += s;
    }
}
