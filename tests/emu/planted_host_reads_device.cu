// planted_host_reads_device.cu - host code dereferences a device pointer.
// On a GPU machine that reads garbage or crashes without a word; the
// emulated GPU keeps device memory unreadable to host code and says what
// was touched and how to copy it instead.
#include "planted.h"

__global__ void set(float *a, float v) { a[threadIdx.x] = v; }

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float *a, value = 0;
    CHECK(cudaMalloc(&a, 32 * sizeof(float)));
    set<<<1, 32>>>(a, 7.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    if (fixed) CHECK(cudaMemcpy(&value, a, sizeof value, cudaMemcpyDeviceToHost));
    else value = a[0]; // the bug: `a` is an address in the GPU's memory
    printf("a[0] = %g\n", value);
    return value == 7.0f ? 0 : 1;
}
