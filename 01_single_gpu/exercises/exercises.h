// exercises.h - the functions chapter 01's exercises ask you to write.
//
// You write them in sgd_step.c (plain C, runs anywhere) and sgd_kernel.cu
// (CUDA). The check programs check_*.c call them, so keep these signatures.
//   make check-exercise EX=01/sgd_step      (from the course's top folder)
//   make check-exercise EX=01/sgd_kernel
#ifndef EXERCISES_01_H
#define EXERCISES_01_H

#ifdef __cplusplus
extern "C" {
#endif

// sgd_step.c: one batch of the chapter's linear regression, on the CPU.
// x is batch x features (row-major), y is batch; params and grads hold
// w[0..features-1] then b at [features]. Writes the gradient of the batch's
// mean squared error into grads and returns that loss.
float mse_gradient(const float *x, const float *y, int batch, int features, const float *params,
                   float *grads);
// params[j] <- params[j] - lr * grads[j] for j < count.
void sgd_update(float *params, const float *grads, int count, float lr);

// sgd_kernel.cu: the same update on the GPU; params and grads are device memory.
void sgd_update_gpu(float *params, const float *grads, int count, float lr);

#ifdef __cplusplus
}
#endif

#endif
