// planted_kernel_reads_host.cu - a kernel is given a pointer to ordinary
// host memory (a malloc'd array) instead of a device copy. A GPU cannot
// read it: the kernel faults with cudaErrorIllegalAddress, reported at the
// next synchronize, far from the launch. The emulated GPU checks every
// pointer argument at the launch. The fix: cudaMalloc and cudaMemcpy.
#include "planted.h"

__global__ void scale(const float *in, float *out, float s) { out[threadIdx.x] = s * in[threadIdx.x]; }

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float *host = (float *)malloc(64 * sizeof(float)), back[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    float *in, *out;
    CHECK(cudaMalloc(&in, 64 * sizeof(float)));
    CHECK(cudaMalloc(&out, 64 * sizeof(float)));
    CHECK(cudaMemcpy(in, host, 64 * sizeof(float), cudaMemcpyHostToDevice));
    scale<<<1, 64>>>(fixed ? in : host, out, 2.0f);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
    printf("out[3] = %g (expected 6)\n", back[3]);
    free(host);
    return back[3] == 6.0f ? 0 : 1;
}
