// planted_out_of_bounds.cu - the classic off-by-one: `i <= n` lets thread
// n write one float past the end of an n-float buffer. A GPU usually
// writes into whatever lies there and carries on; the emulated GPU names
// the kernel and the allocation (and, built with ASAN=1, the line).
#include "planted.h"

__global__ void fill(float *a, int n, bool fixed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (fixed ? i < n : i <= n) a[i] = (float)i;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int n = 1000;
    float *a;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    fill<<<(n + 255) / 256, 256>>>(a, n, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    float last = 0;
    CHECK(cudaMemcpy(&last, a + n - 1, sizeof last, cudaMemcpyDeviceToHost));
    printf("a[%d] = %g\n", n - 1, last);
    return 0;
}
