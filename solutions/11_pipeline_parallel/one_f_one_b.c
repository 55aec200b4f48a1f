// one_f_one_b.c - reference solution of exercise 11/one_f_one_b.
#include "exercises.h"

void one_f_one_b(pipe_stage *p, int stage, int stages, int micro_batches) {
    int M = micro_batches, warmup = stages - stage - 1 < M ? stages - stage - 1 : M, steady = M - warmup;
    // Warm-up: enough forwards for the stages after this one to start.
    for (int i = 0; i < warmup; i++) {
        recv_forward(p, i);
        forward(p, i);
        send_forward(p, i);
    }
    if (steady > 0) recv_forward(p, warmup);
    // Steady state: forward micro-batch warmup + j, backward micro-batch j.
    for (int j = 0; j < steady; j++) {
        forward(p, warmup + j);
        send_forward_recv_backward(p, warmup + j, j);
        backward(p, j);
        if (j + 1 < steady) send_backward_recv_forward(p, j, warmup + j + 1);
        else send_backward(p, j);
    }
    // Cool-down: the backwards of the warm-up's micro-batches.
    for (int i = steady; i < M; i++) {
        recv_backward(p, i);
        backward(p, i);
        send_backward(p, i);
    }
}
