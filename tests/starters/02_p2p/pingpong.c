// pingpong.c - EXERCISE: a ping-pong between two ranks.
//
// The measurement behind every latency and bandwidth figure (chapter 02's
// --bench): a message goes from rank 0 to rank 1 and straight back, again
// and again. To make sure the message really travels each time, rank 1
// changes it: each round trip is
//     rank 0:  send buf to rank 1;               receive the answer into buf
//     rank 1:  receive into buf from rank 0;     add 1 to every element;
//              send buf back to rank 0
// After iters round trips, rank 0's buf[i] is its start value + iters.
// Ranks 2, 3, ... take no part: they return at once without sending or
// receiving anything.
//
//     void pingpong(pg_t *pg, int32_t *buf, size_t count, int iters);
//
// Hints:
//   - pg_send(pg, buf, count, DTYPE_I32, peer) and pg_recv(pg, buf, count,
//     DTYPE_I32, peer) (common/pg.h); pg_rank(pg) says who you are.
//   - The order matters: if both ranks start with pg_recv, each waits for
//     the other forever. One rank sends first, the other receives first.
//   - In this check buf is host memory (the cpu device), so rank 1 may add
//     in a plain loop.
//
// Check it (from the course's top folder):
//     make check-exercise EX=02/pingpong
// The check spawns 2 and 3 ranks, runs 1 to 10 round trips with 1 to a
// million elements, says how many round trips rank 0's buffer shows, and
// calls a hang a deadlock after EXERCISE_DEADLINE seconds (default 10).
#include "exercises.h"

void pingpong(pg_t *pg, int32_t *buf, size_t count, int iters) {
    // TODO: rank 0 sends and receives the echo; rank 1 receives, adds 1, sends back.
    (void)pg;
    (void)buf;
    (void)count;
    (void)iters;
}
