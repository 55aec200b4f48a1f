// planted_wrong_stream_collective.cu - two ranks, each a process on its own
// GPU, compute gradients with a kernel on their own non-blocking stream and
// all-reduce them - on the legacy default stream (the bug). A non-blocking
// stream does not order itself with the legacy stream, so the all-reduce
// may read the gradients before the kernel has written them. Here the
// program synchronizes its stream before it reads the result, which runs
// the kernel first, so the numbers even come out right, in every schedule:
// the race checker sees that nothing orders the all-reduce after the
// kernel, and says so every time. The fix: the all-reduce on the stream
// that computed the gradients (or an event between them).
#include "planted_ranks.h"

__global__ void gradients(float *g, int n, float rank) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = rank + 1.0f;
}

static int rank_main(int rank, ncclUniqueId id, bool fixed) {
    CHECK(cudaSetDevice(rank));
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 1;
    const int n = 1024;
    float *g, host[1024];
    cudaStream_t model;
    CHECK(cudaStreamCreateWithFlags(&model, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&g, n * sizeof(float)));
    gradients<<<n / 256, 256, 0, model>>>(g, n, (float)rank);
    CHECK(cudaGetLastError());
    if (ncclAllReduce(g, g, n, ncclFloat, ncclSum, comm, fixed ? model : 0) != ncclSuccess) return 1;
    CHECK(cudaStreamSynchronize(model));
    CHECK(cudaMemcpy(host, g, sizeof host, cudaMemcpyDeviceToHost));
    printf("rank %d: element 0 is %g (expected 3)\n", rank, host[0]);
    ncclCommDestroy(comm);
    return host[0] == 3.0f ? 0 : 1;
}

int main(int argc, char **argv) { return planted_two_ranks(rank_main, planted_fixed(argc, argv)); }
