// exercises.h - the functions chapter 10's exercise asks you to write.
//
// You write them in row_parallel.c; check_row_parallel.c calls them, so
// keep these signatures. Check them from the course's top folder with
//   make check-exercise EX=10/row_parallel
#ifndef EXERCISES_10_H
#define EXERCISES_10_H

#include "pg.h"

// A row-parallel linear layer, y = x W^T + b, on one rank of the group tp
// (W is OC x K, stored row-major as (out, in); the group has W_ranks ranks,
// each holding Ks = K / W_ranks of the K inputs):
//   inp      (N, Ks)   this rank's columns of x: channels r*Ks .. r*Ks+Ks-1
//   weight   (OC, Ks)  this rank's columns of W: the same channels
//   bias     (OC)      the whole bias, the same on every rank
// Forward: out (N, OC) <- x W^T + b, the whole output, the same bytes on
// every rank.
void row_parallel_forward(pg_t *tp, float *out, const float *inp, const float *weight, const float *bias, int N,
                          int Ks, int OC);

// Backward, given dout (N, OC) = d(loss)/d(out), the same on every rank:
//   dinp     (N, Ks)   <- d(loss)/d(this rank's columns of x)   (overwritten)
//   dweight  (OC, Ks)  += d(loss)/d(this rank's columns of W)   (added to)
//   dbias    (OC)      += d(loss)/d(b)                          (added to)
void row_parallel_backward(pg_t *tp, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, int N, int Ks, int OC);

#endif
