// check_syncthreads_count.cu - __syncthreads_count, _and and _or: a
// barrier that also counts (or ands, or ors) a predicate over the block.
// 3 blocks of 96 threads, the predicate true for threads below the block's
// number times 40; each block writes what the three barriers returned.
// Runs on the emulated GPU and on a real one.
#include "planted.h"

__global__ void votes(int *out) {
    int limit = (int)blockIdx.x * 40;
    bool p = (int)threadIdx.x < limit;
    int count = __syncthreads_count(p);
    int all = __syncthreads_and(p);
    int any = __syncthreads_or(p);
    if (threadIdx.x == 0) out[blockIdx.x * 3] = count, out[blockIdx.x * 3 + 1] = all != 0, out[blockIdx.x * 3 + 2] = any != 0;
}

int main(void) {
    int out[9], *dev;
    CHECK(cudaMalloc(&dev, sizeof out));
    votes<<<3, 96>>>(dev);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dev, sizeof out, cudaMemcpyDeviceToHost));
    // block 0: nobody; block 1: 40 of 96; block 2: 80 of 96
    const int want[9] = {0, 0, 0, 40, 0, 1, 80, 0, 1};
    int wrong = 0;
    for (int b = 0; b < 3; b++) {
        printf("block %d: count %d, and %d, or %d\n", b, out[3 * b], out[3 * b + 1], out[3 * b + 2]);
        for (int k = 0; k < 3; k++) wrong += out[3 * b + k] != want[3 * b + k];
    }
    printf("%d of 9 wrong\n", wrong);
    return wrong ? 1 : 0;
}
