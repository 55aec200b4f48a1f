// sgd_kernel.cu - reference solution of exercise 01/sgd_kernel.
#include "check.h"
#include "exercises.h"

__global__ void sgd_kernel(float *params, const float *grads, int count, float lr) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < count) params[j] -= lr * grads[j];
}

extern "C" void sgd_update_gpu(float *params, const float *grads, int count, float lr) {
    const int threads = 256;
    int blocks = (count + threads - 1) / threads;
    if (blocks == 0) return;   // nothing to update; a launch with 0 blocks is an error
    sgd_kernel<<<blocks, threads>>>(params, grads, count, lr);
    CHECK_CUDA(cudaGetLastError());
}
