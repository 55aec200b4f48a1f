// planted_misaligned_vector.cu - a kernel copies floats four at a time as
// float4, starting one float into the buffer. A float4 load needs an
// address that is a multiple of 16; a GPU stops the kernel with
// cudaErrorMisalignedAddress, while a CPU would load it happily. The
// emulated GPU checks every vector load and store as a GPU would. The fix:
// vector loads from 16-byte aligned offsets (or scalar loads).
#include "planted.h"

__global__ void copy4(const float *in, float *out, int offset) {
    int i = threadIdx.x;
    reinterpret_cast<float4 *>(out)[i] = reinterpret_cast<const float4 *>(in + offset)[i];
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float host[132], back[128];
    for (int i = 0; i < 132; i++) host[i] = (float)i;
    float *in, *out;
    CHECK(cudaMalloc(&in, sizeof host));
    CHECK(cudaMalloc(&out, sizeof back));
    CHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
    int offset = fixed ? 4 : 1;
    copy4<<<1, 32>>>(in, out, offset);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
    printf("out[0] = %g (expected %d)\n", back[0], offset);
    return back[0] == (float)offset ? 0 : 1;
}
