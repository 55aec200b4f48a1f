// planted_stream_race.cu - a kernel on a non-blocking stream fills a
// buffer, and a cudaMemcpy (on the legacy default stream) copies it back.
// A stream created with cudaStreamNonBlocking does not order itself with
// the legacy stream, so the copy may run before the kernel. The fix is an
// event: record it after the kernel, make the legacy stream wait for it.
// The emulated GPU runs queued work as late as it may, so the race loses
// every time.
#include "planted.h"

__global__ void fill(float *a, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = v;
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int n = 4096;
    static float host[4096];
    float *a;
    cudaStream_t side;
    cudaEvent_t filled;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
    fill<<<n / 256, 256, 0, side>>>(a, n, 42.0f);
    CHECK(cudaGetLastError());
    if (fixed) {
        CHECK(cudaEventRecord(filled, side));
        CHECK(cudaStreamWaitEvent(0, filled, 0));
    }
    CHECK(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost));
    int stale = 0;
    for (int i = 0; i < n; i++) stale += host[i] != 42.0f;
    printf("%d of %d values read before the kernel wrote them (stale)\n", stale, n);
    CHECK(cudaDeviceSynchronize());
    return stale ? 1 : 0;
}
