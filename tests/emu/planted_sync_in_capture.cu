// planted_sync_in_capture.cu - a step is captured into a CUDA graph, and
// in the middle of it the host synchronizes the stream to read a value.
// While a stream is captured nothing runs: the work only becomes a graph.
// A GPU refuses the synchronize (cudaErrorStreamCaptureUnsupported) and the
// capture fails (cudaErrorStreamCaptureInvalidated at its end); the
// emulated GPU too, and it says which call did it. The fix: read values
// after the graph has run, outside the capture.
#include "planted.h"

__global__ void scale(float *a, float s) { a[threadIdx.x] *= s; }

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    float *a, host[32];
    for (int i = 0; i < 32; i++) host[i] = 1.0f;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&a, sizeof host));
    CHECK(cudaMemcpyAsync(a, host, sizeof host, cudaMemcpyHostToDevice, s)); // on s: the legacy stream
    CHECK(cudaStreamSynchronize(s));                                      // would not order it with s
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    scale<<<1, 32, 0, s>>>(a, 2.0f);
    if (!fixed) CHECK(cudaStreamSynchronize(s)); // the bug
    scale<<<1, 32, 0, s>>>(a, 3.0f);
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost));
    printf("a[0] = %g (expected 6)\n", host[0]);
    return host[0] == 6.0f ? 0 : 1;
}
