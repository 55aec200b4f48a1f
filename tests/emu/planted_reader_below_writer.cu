// planted_reader_below_writer.cu - each thread writes its value to shared
// memory and, with no __syncthreads between, reads its left neighbour's.
// The emulated GPU's default order runs thread 0 before thread 1, so every
// thread finds its neighbour's value already written: the bug hides. In
// reverse order (EMU_ORDER=reverse, or shuffled) the neighbour has not run
// yet, and the read finds the garbage shared memory starts with. (The race
// checker sees it in any order; this shows what the orders catch where it
// is off: ASan builds, EMU_RACECHECK=0.) The fix: __syncthreads between.
#include "planted.h"

__global__ void neighbour(const float *in, float *out, bool fixed) {
    __shared__ float tile[64];
    int t = threadIdx.x;
    tile[t] = in[t];
    if (fixed) __syncthreads();
    out[t] = t > 0 ? tile[t - 1] : 0.0f;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    float *in, *out;
    CHECK(cudaMalloc(&in, sizeof host));
    CHECK(cudaMalloc(&out, sizeof back));
    CHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice));
    neighbour<<<1, 64>>>(in, out, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(back, out, sizeof back, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 1; t < 64; t++) wrong += back[t] != (float)(t - 1);
    printf("%d of 63 neighbours wrong\n", wrong);
    return wrong ? 1 : 0;
}
