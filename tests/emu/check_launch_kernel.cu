// check_launch_kernel.cu - cudaLaunchKernel: a launch given only the
// kernel's address and an array of pointers to its arguments, as libraries
// and NVIDIA's nccl-tests launch. On the emulated GPU that needs to know
// every kernel's parameters by its address (cu2emu registers each kernel,
// template instantiations included). Runs on the emulated GPU and on a real one.
#include "planted.h"

template <typename T> __global__ void axpy(T *y, const T *x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

int main(void) {
    enum { N = 300 };
    double host_x[N], host_y[N];
    for (int i = 0; i < N; i++) host_x[i] = i, host_y[i] = 1;
    double *x, *y, a = 0.5;
    int n = N;
    CHECK(cudaMalloc(&x, sizeof host_x));
    CHECK(cudaMalloc(&y, sizeof host_y));
    CHECK(cudaMemcpy(x, host_x, sizeof host_x, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, host_y, sizeof host_y, cudaMemcpyHostToDevice));
    void *args[] = {&y, &x, &a, &n};
    const void *kernel = (const void *)&axpy<double>; // the address alone, as a library holds it
    CHECK(cudaLaunchKernel(kernel, dim3((N + 127) / 128), dim3(128), args, 0, 0));
    CHECK(cudaMemcpy(host_y, y, sizeof host_y, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host_y[i] != 1 + 0.5 * i;
    printf("%d of %d wrong\n", wrong, N);
    return wrong ? 1 : 0;
}
