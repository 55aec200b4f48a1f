// planted_race_same_block.cu - 256 threads count how many of their numbers
// fall in each of 8 bins, with `counts[bin] += 1` where atomicAdd belongs.
// On a GPU the threads of a warp run that read-modify-write at the same
// time and updates are lost, some of the time. The emulated GPU runs one
// thread at a time, so even the counts come out right - but its race
// checker sees two threads of one block write one word of global memory
// with no barrier between them. The fix: atomicAdd.
#include "planted.h"

__global__ void histogram(const int *values, int *counts, bool fixed) {
    int bin = values[threadIdx.x] % 8;
    if (fixed) atomicAdd(&counts[bin], 1);
    else counts[bin] += 1;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    int host[256], counts[8];
    for (int i = 0; i < 256; i++) host[i] = i;
    int *values, *dev_counts;
    CHECK(cudaMalloc(&values, sizeof host));
    CHECK(cudaMalloc(&dev_counts, sizeof counts));
    CHECK(cudaMemcpy(values, host, sizeof host, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dev_counts, 0, sizeof counts));
    histogram<<<1, 256>>>(values, dev_counts, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(counts, dev_counts, sizeof counts, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int b = 0; b < 8; b++) wrong += counts[b] != 32;
    printf("%d of 8 bins wrong\n", wrong);
    return wrong ? 1 : 0;
}
