// planted_launch_bounds.cu - a kernel declared __launch_bounds__(128), which
// lets the compiler give each thread the registers of a 128-thread block,
// launched with 256 threads per block. A GPU refuses the launch
// (cudaErrorLaunchOutOfResources) and runs nothing; code that does not check
// cudaGetLastError reads an untouched buffer. The emulated GPU refuses it
// the same way, and says why. The fix: at most 128 threads per block.
#include "planted.h"

__global__ void __launch_bounds__(128) square(float *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * a[i];
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int n = 512;
    float host[512];
    for (int i = 0; i < n; i++) host[i] = 3.0f;
    float *a;
    CHECK(cudaMalloc(&a, sizeof host));
    CHECK(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));
    int threads = fixed ? 128 : 256;
    square<<<n / threads, threads>>>(a, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost));
    printf("a[0] = %g (expected 9)\n", host[0]);
    return host[0] == 9.0f ? 0 : 1;
}
