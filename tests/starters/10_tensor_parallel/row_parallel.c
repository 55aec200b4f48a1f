// row_parallel.c - EXERCISE: a row-parallel linear layer, forward and backward.
//
// Megatron-LM's RowParallelLinear, the second half of every pair in the
// chapter's blocks (attention's c_proj, the MLP's c_proj): W (OC x K) is
// cut by its INPUTS, its columns, over the W_ranks ranks of the group tp,
// and so is x. Rank r holds x's and W's columns r*Ks .. r*Ks + Ks - 1.
//
//   y = x W^T + b = sum over ranks r of  x_r W_r^T   +  b
//                                       ^^^^^^^^^
//                              what rank r can compute alone
//
// Forward (the paper's g):
//   1. out <- inp weight^T: this rank's PARTIAL sum, (N, OC);
//   2. all-reduce it (sum) over tp: now every rank holds x W^T;
//   3. add the bias, once, on every rank (why not before step 2?).
// Backward, with dout the same on every rank:
//   dinp     = dout weight            (N, Ks): this rank's columns of dx
//   dweight += dout^T inp             (OC, Ks)
//   dbias   += column sums of dout    (OC): the same on every rank
// Does the backward pass need an all-reduce? Work out which ranks'
// numbers each of the three needs before you write one.
//
//     void row_parallel_forward(pg_t *tp, float *out, const float *inp, const float *weight,
//                               const float *bias, int N, int Ks, int OC);
//     void row_parallel_backward(pg_t *tp, float *dinp, float *dweight, float *dbias,
//                                const float *dout, const float *inp, const float *weight,
//                                int N, int Ks, int OC);
//
// Everything is row-major: inp[n * Ks + k], weight[o * Ks + k],
// out[n * OC + o]. Plain loops are fine (the sizes are small); use
// pg_all_reduce (common/pg.h) for the sum: pg_all_reduce(tp, buf, buf,
// count, DTYPE_F32, OP_SUM) sums in place and leaves every rank the same
// bytes.
//
// Check it (from the course's top folder):
//     make check-exercise EX=10/row_parallel
// The check spawns groups of 1 to 4 ranks (cpu backend), gives each rank
// its columns of a random x and W, and compares out, dinp, dweight and
// dbias with one process computing the whole layer; it recognises a bias
// added on every rank, a missing sum, and a sum where none belongs.
#include "exercises.h"

void row_parallel_forward(pg_t *tp, float *out, const float *inp, const float *weight, const float *bias, int N,
                          int Ks, int OC) {
    // TODO: the partial product, its sum over tp, then the bias.
    (void)tp, (void)out, (void)inp, (void)weight, (void)bias, (void)N, (void)Ks, (void)OC;
}

void row_parallel_backward(pg_t *tp, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, int N, int Ks, int OC) {
    // TODO: dinp, dweight and dbias.
    (void)tp, (void)dinp, (void)dweight, (void)dbias, (void)dout, (void)inp, (void)weight, (void)N, (void)Ks, (void)OC;
}
