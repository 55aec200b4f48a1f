// nccl_split.c - ncclCommSplit, built on the emulator's own public calls.
//
// NVIDIA's NCCL splits a communicator with what its bootstrap already
// knows. The emulator has no bootstrap to reuse, and it does not need one:
// the parent communicator can carry everything a split needs.
//   1. Every rank all-gathers its (color, key) over the parent.
//   2. The first rank of each color (by key, then by rank) makes a unique
//      id; every rank all-gathers the ids, and takes its color's.
//   3. The members of each color meet with ncclCommInitRankConfig, ranked
//      by key, then by their rank in the parent - NCCL's order.
// The ranks of no color (NCCL_SPLIT_NOCOLOR) take part in 1 and 2 only.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_runtime_api.h"
#include "nccl.h"

// A non-blocking parent answers ncclInProgress until the call is queued.
static ncclResult_t split_settle(ncclComm_t comm, ncclResult_t res) {
    while (res == ncclInProgress) {
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
        ncclResult_t query = ncclCommGetAsyncError(comm, &res);
        if (query != ncclSuccess) return query;
    }
    return res;
}

// out (host, world * bytes) <- every rank's `mine` (bytes each), through the parent.
static ncclResult_t split_all_gather(ncclComm_t comm, const void *mine, void *out, size_t bytes, int world,
                                     cudaStream_t stream) {
    void *dev = NULL;
    if (cudaMalloc(&dev, bytes * (size_t)(world + 1)) != cudaSuccess) return ncclUnhandledCudaError;
    char *all = (char *)dev + bytes;
    ncclResult_t res = ncclSuccess;
    // Everything on one stream, in order: the stream is non-blocking, so a
    // copy on the legacy stream would not be ordered before the all-gather.
    if (cudaMemcpyAsync(dev, mine, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) res = ncclUnhandledCudaError;
    if (res == ncclSuccess) res = split_settle(comm, ncclAllGather(dev, all, bytes, ncclUint8, comm, stream));
    if (res == ncclSuccess &&
        cudaMemcpyAsync(out, all, bytes * (size_t)world, cudaMemcpyDeviceToHost, stream) != cudaSuccess)
        res = ncclUnhandledCudaError;
    if (res == ncclSuccess && cudaStreamSynchronize(stream) != cudaSuccess) res = ncclUnhandledCudaError;
    cudaFree(dev);
    return res;
}

// Does rank r (color c, key k) come before rank s in its color's order?
static int split_before(const int32_t *ck, int r, int s) {
    return ck[2 * r + 1] < ck[2 * s + 1] || (ck[2 * r + 1] == ck[2 * s + 1] && r < s);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    if (!comm || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
    *newcomm = NULL;
    int me, world;
    ncclResult_t res = ncclCommUserRank(comm, &me);
    if (res == ncclSuccess) res = ncclCommCount(comm, &world);
    if (res != ncclSuccess) return res;
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return ncclUnhandledCudaError;
    int32_t mine[2] = {color, key}, *ck = calloc((size_t)world * 2, sizeof *ck);
    ncclUniqueId *ids = calloc((size_t)world, sizeof *ids), my_id;
    memset(&my_id, 0, sizeof my_id);
    if (!ck || !ids) res = ncclSystemError;
    if (res == ncclSuccess) res = split_all_gather(comm, mine, ck, sizeof mine, world, stream);
    // Which rank leads my color, what my rank in it is, and how many we are.
    int leader = -1, rank = 0, count = 0;
    for (int r = 0; res == ncclSuccess && color >= 0 && r < world; r++) {
        if (ck[2 * r] != color) continue;
        count++;
        if (leader < 0 || split_before(ck, r, leader)) leader = r;
        if (split_before(ck, r, me)) rank++;
    }
    if (res == ncclSuccess && leader == me) res = ncclGetUniqueId(&my_id);
    if (res == ncclSuccess) res = split_all_gather(comm, &my_id, ids, sizeof my_id, world, stream);
    if (res == ncclSuccess && color >= 0) res = ncclCommInitRankConfig(newcomm, count, ids[leader], rank, config);
    free(ck), free(ids);
    cudaStreamDestroy(stream);
    return res;
}
