// planted_divergent_barrier.cu - __syncthreads() inside a branch that only
// some threads take: the others never arrive. A GPU hangs (or, worse,
// pairs the wrong barriers); the emulated GPU says which threads wait
// where. The fix: every thread of the block reaches the same barrier.
#include "planted.h"

__global__ void halves(float *a, bool fixed) {
    __shared__ float tile[64];
    int t = threadIdx.x;
    tile[t] = (float)t;
    if (fixed || t < 32) __syncthreads();
    a[t] = tile[63 - t];
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float *a, host[64];
    CHECK(cudaMalloc(&a, sizeof host));
    halves<<<1, 64>>>(a, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < 64; t++) wrong += host[t] != (float)(63 - t);
    printf("%d of 64 wrong\n", wrong);
    return wrong ? 1 : 0;
}
