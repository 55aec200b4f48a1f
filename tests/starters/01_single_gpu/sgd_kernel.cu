// sgd_kernel.cu - EXERCISE: the SGD update as a CUDA kernel.
//
// Write sgd_kernel, and choose how many blocks sgd_update_gpu launches, so
// that every parameter j < count gets
//     params[j] <- params[j] - lr * grads[j]
// exactly once, on the GPU. common/linreg_gpu.cu has the course's own
// version; try without looking.
//
// Hints:
//   - One thread per parameter. Its index is blockIdx.x * blockDim.x + threadIdx.x.
//   - The grid is made of whole blocks, so it usually has MORE threads than
//     parameters: the threads past the end must do nothing (if (j < count)),
//     or they write memory that is not theirs.
//   - Enough blocks to cover count threads: (count + threads - 1) / threads.
//   - A launch does not report errors itself: cudaGetLastError() right after
//     it catches a bad configuration (e.g. more than 1024 threads per block).
//
// Check it (from the course's top folder):
//     make check-exercise EX=01/sgd_kernel
// It needs a CUDA build (nvcc found, not CUDA=0) to compile this file and a
// GPU to run it; without a GPU it compiles your file and says it cannot run.
// The check compares with a CPU reference for sizes from 1 to 3 million,
// names the first wrong element, and notices writes past the end.
#include "check.h"
#include "exercises.h"

__global__ void sgd_kernel(float *params, const float *grads, int count, float lr) {
    // TODO: one thread, one parameter.
    (void)params;
    (void)grads;
    (void)count;
    (void)lr;
}

extern "C" void sgd_update_gpu(float *params, const float *grads, int count, float lr) {
    const int threads = 256;
    int blocks = 1;   // TODO: enough blocks for count parameters
    sgd_kernel<<<blocks, threads>>>(params, grads, count, lr);
    CHECK_CUDA(cudaGetLastError());
}
