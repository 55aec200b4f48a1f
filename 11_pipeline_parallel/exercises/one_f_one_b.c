// one_f_one_b.c - EXERCISE: one stage's loop under the 1F1B schedule.
//
// A pipeline of S stages trains on M micro-batches per step. The code
// below is GPipe: every forward pass, then every backward pass. It
// computes the right gradients, but stage s holds the activations of all
// M micro-batches until the backward passes begin. Rewrite it as 1F1B
// (PipeDream-Flush), which computes the same gradients and holds at most
// S - s micro-batches:
//   1. warm-up: min(S - s - 1, M) forward passes, each with its input
//      received before and its output sent after;
//   2. steady state: one forward pass, then one backward pass (of the
//      oldest micro-batch not yet backward), until every forward is done;
//   3. cool-down: the backward passes that are left.
// In the steady state, after a forward pass the stage sends its output to
// stage s+1 and needs a gradient from that same stage; after a backward
// pass it sends a gradient to stage s-1 and needs its next input from that
// same stage. Sending first and receiving after deadlocks (a send waits
// for its receiver, who is sending too): use the paired calls.
//
//     void one_f_one_b(pipe_stage *p, int stage, int stages, int micro_batches);
//
// The calls are in exercises.h: forward, backward, recv_forward,
// send_forward, recv_backward, send_backward,
// send_forward_recv_backward, send_backward_recv_forward.
//
// Hints:
//   - Stage S-1 has no warm-up: forward, backward, forward, backward, ...;
//     stage 0 has the longest.
//   - Count: M forwards and M backwards on every stage, each micro-batch's
//     input received before its forward, its gradient before its backward.
//   - With M smaller than S - s - 1 the warm-up is all M forwards and
//     there is no steady state.
//   - schedule_1f1b in 11_pipeline_parallel.c is the course's version; try
//     without looking, then compare.
//
// Check it (from the course's top folder):
//     make check-exercise EX=11/one_f_one_b
// The check runs your function on every stage of pipelines of 1 to 4
// stages and 2 to 8 micro-batches (a thread per stage), with a small model
// whose gradients it knows. It names the first stage whose order of
// forward (F) and backward (B) passes is not 1F1B's, one that held more
// micro-batches than S - s, a deadlock (which stages wait for what), a
// message for the wrong micro-batch, and wrong gradients.
#include "exercises.h"

void one_f_one_b(pipe_stage *p, int stage, int stages, int micro_batches) {
    (void)stage, (void)stages;
    // TODO: 1F1B instead of GPipe.
    for (int i = 0; i < micro_batches; i++) {
        recv_forward(p, i);
        forward(p, i);
        send_forward(p, i);
    }
    for (int i = 0; i < micro_batches; i++) {
        recv_backward(p, i);
        backward(p, i);
        send_backward(p, i);
    }
}
