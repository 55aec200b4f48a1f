// exercises.h - the function chapter 11's exercise asks you to write, and
// what it may call.
//
// You write one_f_one_b in one_f_one_b.c; check_one_f_one_b.c runs it on
// every stage of a pipeline (one thread per stage) and implements the
// calls below, so keep these signatures. Check it from the course's top
// folder with
//   make check-exercise EX=11/one_f_one_b
#ifndef EXERCISES_11_H
#define EXERCISES_11_H

// One stage of a pipeline, as the check keeps it (you never look inside).
typedef struct pipe_stage pipe_stage;

// Micro-batch `micro`'s forward pass on this stage (it needs the input
// that recv_forward brought, on every stage but the first), and its
// backward pass (it needs the forward pass, and on every stage but the
// last the gradient that recv_backward brought).
void forward(pipe_stage *p, int micro);
void backward(pipe_stage *p, int micro);

// Messages between neighbouring stages, as in 11_pipeline_parallel.c and
// Megatron-LM: activations go forward to stage s+1, gradients backward to
// stage s-1. A call without a neighbour does nothing (the first stage
// receives no input: it reads tokens; the last sends no output: it
// computes the loss). A send completes only once the neighbour receives,
// as NCCL's does: two neighbours that both send first wait for each other
// for ever. The paired calls post both before waiting for either.
void recv_forward(pipe_stage *p, int micro);  // micro's input, from stage s-1
void send_forward(pipe_stage *p, int micro);  // micro's output, to stage s+1
void recv_backward(pipe_stage *p, int micro); // the gradient of micro's output, from stage s+1
void send_backward(pipe_stage *p, int micro); // the gradient of micro's input, to stage s-1
void send_forward_recv_backward(pipe_stage *p, int send_micro, int recv_micro);
void send_backward_recv_forward(pipe_stage *p, int send_micro, int recv_micro);

// THE EXERCISE: the training step of stage `stage` of `stages` under the
// 1F1B schedule, for micro-batches 0 .. micro_batches-1.
void one_f_one_b(pipe_stage *p, int stage, int stages, int micro_batches);

#endif
