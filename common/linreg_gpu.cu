// linreg_gpu.cu - the linear-regression step as CUDA kernels.
//
// The same three steps as linreg_cpu_forward_backward and linreg_sgd_step
// in linreg.h, spread over GPU threads:
//   1. residual_kernel: one warp per sample computes r_i = x_i . w + b - y_i
//      (the dot product is split over the warp's 32 lanes, then summed
//      with shuffles).
//   2. gradient_kernel: one thread per parameter j sums r_i * x_ij over the
//      batch. Each thread owns its own sum, so there are no atomics: 256
//      threads adding into one address would serialise and make the result
//      depend on their timing.
//   3. sgd_kernel: p_j <- p_j - lr * g_j.
// Only the running loss sum ever needs to come back to the host.
#include "check.h"

#define WARP 32

__global__ void residual_kernel(const float *x, const float *y, const int64_t *order,
                                const float *params, float *residual, int features,
                                int64_t start, int batch) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (warp >= batch) return;
    int64_t sample = order[start + warp];
    const float *xi = x + sample * features;
    float partial = 0.0f;
    for (int j = lane; j < features; j += WARP) partial += xi[j] * params[j];
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        partial += __shfl_down_sync(0xffffffffu, partial, offset);
    if (lane == 0) residual[warp] = partial + params[features] - y[sample];
}

// Thread j < features computes dL/dw_j; thread j == features computes dL/db
// and adds the batch's mean loss to loss_sum.
__global__ void gradient_kernel(const float *x, const int64_t *order, const float *residual,
                                float *grads, double *loss_sum, int features, int64_t start,
                                int batch) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j > features) return;
    float sum = 0.0f;
    if (j < features) {
        for (int i = 0; i < batch; i++) sum += residual[i] * x[order[start + i] * features + j];
    } else {
        double loss = 0.0;
        for (int i = 0; i < batch; i++) {
            sum += residual[i];
            loss += (double)residual[i] * residual[i];
        }
        *loss_sum += loss / batch;
    }
    grads[j] = sum * (2.0f / (float)batch);
}

__global__ void sgd_kernel(float *params, const float *grads, int count, float lr) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < count) params[j] -= lr * grads[j];
}

__global__ void momentum_kernel(float *params, float *velocity, const float *grads, int count,
                                float lr, float momentum) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count) return;
    velocity[j] = momentum * velocity[j] + grads[j];
    params[j] -= lr * velocity[j];
}

static int blocks_for(long long threads, int per_block) {
    return (int)((threads + per_block - 1) / per_block);
}

extern "C" void linreg_cuda_forward_backward(const float *x, const float *y, const int64_t *order,
                                             const float *params, float *grads, float *residual,
                                             double *loss_sum, int features, int64_t start,
                                             int batch) {
    const int threads = 256;
    residual_kernel<<<blocks_for((long long)batch * WARP, threads), threads>>>(
        x, y, order, params, residual, features, start, batch);
    CHECK_CUDA(cudaGetLastError());
    gradient_kernel<<<blocks_for(features + 1, threads), threads>>>(
        x, order, residual, grads, loss_sum, features, start, batch);
    CHECK_CUDA(cudaGetLastError());
}

extern "C" void linreg_cuda_sgd_step(float *params, const float *grads, int count, float lr) {
    sgd_kernel<<<blocks_for(count, 256), 256>>>(params, grads, count, lr);
    CHECK_CUDA(cudaGetLastError());
}

extern "C" void linreg_cuda_momentum_step(float *params, float *velocity, const float *grads,
                                          int count, float lr, float momentum) {
    momentum_kernel<<<blocks_for(count, 256), 256>>>(params, velocity, grads, count, lr, momentum);
    CHECK_CUDA(cudaGetLastError());
}
