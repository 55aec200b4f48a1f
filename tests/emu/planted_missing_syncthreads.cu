// planted_missing_syncthreads.cu - a block sums 256 numbers in shared
// memory, halving the number of active threads each round. Without a
// __syncthreads() between rounds, thread t may read partial[t + half]
// before thread t + half has written it. On a GPU that is usually hidden
// by timing; the emulated GPU runs each thread as far as it can before the
// next starts, and shared memory starts as NaN, so the sum is always wrong.
#include "planted.h"

__global__ void block_sum(const float *in, float *out, bool fixed) {
    __shared__ float partial[256];
    int t = threadIdx.x;
    partial[t] = in[t];
    if (fixed) __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        if (fixed) __syncthreads();
    }
    if (t == 0) *out = partial[0];
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float host[256], sum = 0, expected = 0;
    for (int i = 0; i < 256; i++) host[i] = (float)(i + 1), expected += host[i];
    float *in, *out;
    CHECK(cudaMalloc(&in, sizeof host));
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
    block_sum<<<1, 256>>>(in, out, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost));
    printf("block sum %g, expected %g\n", sum, expected);
    return sum == expected ? 0 : 1;
}
