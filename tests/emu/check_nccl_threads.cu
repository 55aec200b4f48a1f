// check_nccl_threads.cu - one process drives two GPUs, one host thread
// each, as NVIDIA's nccl-tests do: the main thread makes both ranks'
// communicators inside one ncclGroupStart/ncclGroupEnd (the joins
// complete together at ncclGroupEnd), then each thread all-reduces with a
// PreMulSum op (each rank's values times its own scalar, then the sum) and
// with ncclBcast. Runs on the emulated GPU, and on a machine with 2 GPUs.
#include <nccl.h>
#include <pthread.h>

#include "planted.h"

enum { N = 1000 };

typedef struct {
    int rank;
    ncclComm_t comm;
    int wrong;
} rank_work;

static void *rank_main(void *arg) {
    rank_work *w = (rank_work *)arg;
    CHECK(cudaSetDevice(w->rank));
    float *buf, host[N];
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&buf, sizeof host));
    for (int i = 0; i < N; i++) host[i] = (float)(i % 7);
    CHECK(cudaMemcpyAsync(buf, host, sizeof host, cudaMemcpyHostToDevice, s));
    float scalar = w->rank == 0 ? 2.0f : 3.0f; // sum: 2x + 3x = 5x
    ncclRedOp_t premul;
    if (ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat, ncclScalarHostImmediate, w->comm) != ncclSuccess ||
        ncclAllReduce(buf, buf, N, ncclFloat, premul, w->comm, s) != ncclSuccess)
        w->wrong = 1000;
    CHECK(cudaMemcpyAsync(host, buf, sizeof host, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++) w->wrong += host[i] != 5.0f * (float)(i % 7);
    if (ncclRedOpDestroy(premul, w->comm) != ncclSuccess) w->wrong++;
    float root_value = w->rank == 1 ? 42.0f : 0.0f;
    CHECK(cudaMemcpyAsync(buf, &root_value, sizeof root_value, cudaMemcpyHostToDevice, s));
    if (ncclBcast(buf, 1, ncclFloat, 1, w->comm, s) != ncclSuccess) w->wrong++;
    CHECK(cudaMemcpyAsync(host, buf, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    w->wrong += host[0] != 42.0f;
    CHECK(cudaFree(buf));
    return NULL;
}

int main(void) {
    int devices = 0;
    CHECK(cudaGetDeviceCount(&devices));
    if (devices < 2) {
        printf("SKIP: one GPU here; this needs two\n");
        return 0;
    }
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    rank_work work[2] = {{0, NULL, 0}, {1, NULL, 0}};
    if (ncclGroupStart() != ncclSuccess) return 1;
    for (int r = 0; r < 2; r++) {
        CHECK(cudaSetDevice(r));
        if (ncclCommInitRank(&work[r].comm, 2, id, r) != ncclSuccess) return 1;
    }
    if (ncclGroupEnd() != ncclSuccess) {
        printf("ncclGroupEnd failed: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    pthread_t threads[2];
    for (int r = 0; r < 2; r++) pthread_create(&threads[r], NULL, rank_main, &work[r]);
    for (int r = 0; r < 2; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < 2; r++) ncclCommDestroy(work[r].comm);
    printf("rank 0: %d wrong, rank 1: %d wrong\n", work[0].wrong, work[1].wrong);
    return work[0].wrong || work[1].wrong ? 1 : 0;
}
