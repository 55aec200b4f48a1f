// average_gradients.c - EXERCISE: the one line that makes training data-parallel.
//
// Every rank has computed the gradient of its own batch into grads. Make
// every rank hold the MEAN over all ranks instead, so that all of them take
// the same step and their replicas of the model stay identical. That is
// what ddp_average_gradients in common/ddp.h does (with OP_AVG); write it
// with OP_SUM and a division, to see what AVG stands for.
//
//     void average_gradients(pg_t *pg, float *grads, size_t count);
//
//   grads  count floats; on return, on EVERY rank, grads[j] is
//          (grads[j] of rank 0 + ... + grads[j] of rank W-1) / W.
//
// Hints:
//   - pg_all_reduce(pg, send, recv, count, DTYPE_F32, OP_SUM) sums over the
//     ranks; send == recv is allowed (in place).
//   - pg_world_size(pg) is W.
//   - In this check grads is host memory, so you may divide in a loop. (On
//     a GPU grads is device memory: there you would use OP_AVG, or a kernel.)
//   - Every rank must make the same pg_ calls in the same order; a rank
//     that skips one leaves the others waiting.
//
// Check it (from the course's top folder):
//     make check-exercise EX=04/average_gradients
// The check spawns 1, 2 and 3 ranks, names the first rank and element that
// are wrong, notices a sum where a mean belongs, and then trains chapter
// 04's model on 2 ranks with your function: it must match one process with
// the same global batch.
#include "exercises.h"

void average_gradients(pg_t *pg, float *grads, size_t count) {
    // TODO: sum over the ranks, then divide by the number of ranks.
    (void)pg;
    (void)grads;
    (void)count;
}
