// ring_allreduce.c - EXERCISE: all-reduce around a ring, from send and receive.
//
// pg_all_reduce (and NCCL's) sums large buffers with a RING: W ranks in a
// circle, each talking only to its two neighbours. Cut buf into W chunks
// (chunk c: elements count*c/W up to count*(c+1)/W; some may be empty when
// count < W). Then:
//   1. reduce-scatter, W-1 steps: in step s, rank r sends chunk (r - s) mod W
//      to its right neighbour (r+1) mod W, receives chunk (r - s - 1) mod W
//      from its left neighbour (r-1) mod W, and adds what it received into
//      its own copy of that chunk. After W-1 steps rank r holds the complete
//      sum of chunk (r + 1) mod W.
//   2. all-gather, W-1 steps: in step s, rank r sends chunk (r + 1 - s) mod W
//      (a finished one) to the right and receives chunk (r - s) mod W from
//      the left, storing it as it is. Now every rank has every finished chunk.
// Each rank sends and receives 2(W-1)/W of the buffer in all, whatever W:
// that is why the ring's bus bandwidth does not fall as ranks are added.
//
//     void ring_all_reduce(pg_t *pg, float *buf, size_t count);
//
// Use pg_send, pg_recv, pg_isend, pg_irecv, pg_wait (common/pg.h), not
// pg_all_reduce or the other collectives: writing them is the point.
//
// Hints:
//   - A C remainder can be negative: (r - s) mod W is ((r - s) % W + W) % W.
//   - Every rank sends and receives in every step. With blocking calls on
//     all ranks (everyone sends first) the cpu backend copes, but NCCL and
//     MPI can deadlock: post the send with pg_isend, receive with pg_recv,
//     then pg_wait for the send.
//   - Receive into a scratch buffer, then add: the chunk you are sending in
//     the same step must not change while it is in flight.
//   - The sum must be the same BYTES on every rank: each chunk is summed on
//     one path around the ring, and the finished chunk is then copied, never
//     re-added. (Floating-point addition in another order rounds differently.)
//   - One rank, or count 0: nothing to do.
//
// Check it (from the course's top folder):
//     make check-exercise EX=03/ring_allreduce
// The check spawns 1 to 4 ranks and tries sizes from 0 to 65537 elements
// (fewer elements than ranks too). Rank r's input is 8^r * (1 + i % 3), so
// that a wrong sum says which ranks' values it holds ("rank 0's value once,
// rank 1's twice, ..."). It also compares the ranks' results byte for byte,
// and calls a hang a deadlock after EXERCISE_DEADLINE seconds (default 10).
#include "exercises.h"

void ring_all_reduce(pg_t *pg, float *buf, size_t count) {
    // TODO: reduce-scatter, then all-gather, around the ring.
    (void)pg;
    (void)buf;
    (void)count;
}
