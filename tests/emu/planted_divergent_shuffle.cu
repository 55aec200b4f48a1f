// planted_divergent_shuffle.cu - a warp sums its 32 values with shuffles,
// but the even lanes shuffle in one branch and the odd lanes in another.
// CUDA requires every lane named in a shuffle's mask to call the same
// shuffle; on a GPU this may work, hang, or exchange the wrong values,
// depending on the architecture and the compiler. The emulated GPU names
// the two call sites, as it does for a __syncthreads in a branch. The fix:
// one shuffle that every lane reaches.
#include "planted.h"

__global__ void warp_sum(const float *in, float *out, bool fixed) {
    float v = in[threadIdx.x];
    for (int k = 16; k > 0; k /= 2) {
        if (fixed || threadIdx.x % 2 == 0) v += __shfl_xor_sync(0xffffffffu, v, k);
        else v += __shfl_xor_sync(0xffffffffu, v, k);
    }
    if (threadIdx.x == 0) *out = v;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float host[32], sum = 0;
    for (int i = 0; i < 32; i++) host[i] = (float)i;
    float *in, *out;
    CHECK(cudaMalloc(&in, sizeof host));
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
    warp_sum<<<1, 32>>>(in, out, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost));
    printf("warp sum %g, expected 496\n", sum);
    return sum == 496.0f ? 0 : 1;
}
