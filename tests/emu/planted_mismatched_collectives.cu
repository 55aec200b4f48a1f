// planted_mismatched_collectives.cu - two ranks, each a process on its own
// GPU, make their first collective call: rank 0 an all-reduce of 1024
// floats, rank 1 (the bug) a broadcast of 512. Real NCCL trusts the
// program: this hangs, or both ranks go on with garbage, and nothing says
// why. The emulated NCCL compares what every rank was asked to do and
// stops both ranks with a message naming each call.
#include "planted_ranks.h"

static int rank_main(int rank, ncclUniqueId id, bool fixed) {
    CHECK(cudaSetDevice(rank)); // one GPU per rank, set before the communicator
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 1;
    const int count = 1024;
    float *buf, host[1024];
    for (int i = 0; i < count; i++) host[i] = (float)(rank + 1);
    CHECK(cudaMalloc(&buf, count * sizeof(float)));
    CHECK(cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice));
    ncclResult_t res;
    if (rank == 0 || fixed) res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, 0);
    else res = ncclBroadcast(buf, buf, count / 2, ncclFloat, 0, comm, 0);
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: the collective failed: %s\n", rank, ncclGetErrorString(res));
        return 1;
    }
    cudaError_t err = cudaStreamSynchronize(0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (err != cudaSuccess || async != ncclSuccess) {
        fprintf(stderr, "rank %d: %s / %s: %s\n", rank, cudaGetErrorString(err), ncclGetErrorString(async),
                ncclGetLastError(comm));
        ncclCommAbort(comm);
        return 1;
    }
    CHECK(cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost));
    printf("rank %d: element 0 is %g (expected 3)\n", rank, host[0]);
    ncclCommDestroy(comm);
    return host[0] == 3.0f ? 0 : 1;
}

int main(int argc, char **argv) { return planted_two_ranks(rank_main, planted_fixed(argc, argv)); }
