// planted_block_too_large.cu - 2048 threads in one block. A GPU allows at
// most 1024: the launch does not run at all, and the only sign is the
// error that cudaGetLastError returns. Code that never asks computes with
// whatever the output buffer held. The fix: more blocks, fewer threads.
#include "planted.h"

__global__ void square(float *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = (float)i * (float)i;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int n = 2048;
    float *a;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    if (fixed) square<<<2, 1024>>>(a, n);
    else square<<<1, 2048>>>(a, n);
    CHECK(cudaGetLastError());
    float last = 0;
    CHECK(cudaMemcpy(&last, a + n - 1, sizeof last, cudaMemcpyDeviceToHost));
    printf("a[%d] = %g\n", n - 1, last);
    return last == (float)(n - 1) * (float)(n - 1) ? 0 : 1;
}
