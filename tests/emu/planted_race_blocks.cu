// planted_race_blocks.cu - 16 blocks each sum 256 numbers in shared memory,
// then thread 0 of each block adds its block's sum to the total with `+=`.
// Blocks never wait for each other: on a GPU two blocks read the same old
// total and one sum is lost, once in a while. The emulated GPU runs the
// blocks one after another, so the total is even right - but its race
// checker sees threads of two blocks write one word, which nothing can
// order. The fix: atomicAdd (or a second kernel that adds the sums).
#include "planted.h"

__global__ void total_sum(const float *in, float *total, bool fixed) {
    __shared__ float partial[256];
    int t = threadIdx.x;
    partial[t] = in[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t != 0) return;
    if (fixed) atomicAdd(total, partial[0]);
    else *total += partial[0];
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    static float host[16 * 256];
    float expected = 0, sum = 0;
    for (int i = 0; i < 16 * 256; i++) host[i] = 1.0f, expected += 1.0f;
    float *in, *total;
    CHECK(cudaMalloc(&in, sizeof host));
    CHECK(cudaMalloc(&total, sizeof(float)));
    CHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(total, 0, sizeof(float)));
    total_sum<<<16, 256>>>(in, total, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&sum, total, sizeof sum, cudaMemcpyDeviceToHost));
    printf("total %g, expected %g\n", sum, expected);
    return sum == expected ? 0 : 1;
}
