// planted_fill_after_copy.cu - the host queues an asynchronous copy from
// pinned memory to the GPU, and only then fills the pinned buffer. The
// copy may run as soon as it is queued: it then sends what the buffer held
// before. The emulated GPU's default schedule runs queued work as late as
// it may, which hides this bug; EMU_SCHEDULE=eager (work runs as soon as
// it is queued) and random catch it. The fix: fill, then copy.
#include "planted.h"

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    const int n = 1024;
    float *pinned, *dev, back[1024];
    CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
    CHECK(cudaMalloc(&dev, n * sizeof(float)));
    for (int i = 0; i < n; i++) pinned[i] = -1.0f;
    if (fixed)
        for (int i = 0; i < n; i++) pinned[i] = (float)i;
    CHECK(cudaMemcpyAsync(dev, pinned, n * sizeof(float), cudaMemcpyHostToDevice, 0));
    if (!fixed)
        for (int i = 0; i < n; i++) pinned[i] = (float)i;
    CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += back[i] != (float)i;
    printf("%d of %d values copied before the host wrote them\n", wrong, n);
    CHECK(cudaFreeHost(pinned));
    return wrong ? 1 : 0;
}
