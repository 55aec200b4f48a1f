// check_graphs.cu - CUDA graphs: a stream's work captured once, then
// launched again and again, and updated with a newer capture of the same
// shape. Runs on the emulated GPU and on a real one; on the emulated one it
// also checks that a graph launch counts as one launch, whatever it replays.
#include "planted.h"

__global__ void add(float *a, int n, float v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += v;
}

enum { N = 1000 };

// Captures: a += v1; a += v2; b = a. Three operations.
static cudaGraph_t capture(cudaStream_t s, float *a, float *b, float v1, float v2) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add<<<(N + 255) / 256, 256, 0, s>>>(a, N, v1);
    add<<<(N + 255) / 256, 256, 0, s>>>(a, N, v2);
    CHECK(cudaMemcpyAsync(b, a, N * sizeof(float), cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamEndCapture(s, &g));
    return g;
}

static int expect(const char *what, float got, float want) {
    printf("%s: %g (expected %g)\n", what, got, want);
    return got != want;
}

int main(void) {
    float *a, *b, host;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&a, N * sizeof(float)));
    CHECK(cudaMalloc(&b, N * sizeof(float)));
    CHECK(cudaMemsetAsync(a, 0, N * sizeof(float), s));
    CHECK(cudaStreamSynchronize(s));
    int wrong = 0;

    cudaGraph_t g = capture(s, a, b, 1.0f, 2.0f);
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    wrong += expect("nodes captured", (float)nodes, 3);
    CHECK(cudaStreamSynchronize(s)); // nothing ran while capturing
    CHECK(cudaMemcpy(&host, a + N - 1, sizeof host, cudaMemcpyDeviceToHost));
    wrong += expect("a[N-1] after the capture", host, 0);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
#ifdef COURSE_EMU_GPU
    unsigned long long before = emu_launch_count();
#endif
    for (int i = 0; i < 5; i++) CHECK(cudaGraphLaunch(exec, s));
#ifdef COURSE_EMU_GPU
    wrong += expect("launches counted for 5 graph launches", (float)(emu_launch_count() - before), 5);
#endif
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&host, b + 7, sizeof host, cudaMemcpyDeviceToHost));
    wrong += expect("b[7] after 5 launches", host, 15);

    // The same shape with other arguments: the update takes them.
    cudaGraph_t g2 = capture(s, a, b, 10.0f, 20.0f);
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, g2, &info));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&host, b, sizeof host, cudaMemcpyDeviceToHost));
    wrong += expect("b[0] after the updated graph", host, 45);

    // Another shape: the update is refused, and the graph stays as it was.
    cudaGraph_t g3;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add<<<(N + 255) / 256, 256, 0, s>>>(a, N, 100.0f);
    CHECK(cudaStreamEndCapture(s, &g3));
    cudaError_t err = cudaGraphExecUpdate(exec, g3, &info);
    cudaGetLastError();
    wrong += expect("an update to another shape is refused", err == cudaErrorGraphExecUpdateFailure, 1);
    wrong += expect("its reason: the topology changed", info.result == cudaGraphExecUpdateErrorTopologyChanged, 1);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(&host, b, sizeof host, cudaMemcpyDeviceToHost));
    wrong += expect("b[0] after one more launch", host, 75);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(g3));
    printf("%d wrong\n", wrong);
    return wrong ? 1 : 0;
}
