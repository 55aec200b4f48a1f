// check_sgd_kernel.c - checks exercise 01/sgd_kernel (sgd_kernel.cu).
//
// Run it with `make check-exercise EX=01/sgd_kernel` from the top folder.
// For parameter counts from 1 to 3 million (some a multiple of a block,
// most not) it runs your sgd_update_gpu on the GPU and compares every
// element with p - lr * g computed on the CPU. Behind the last parameter it
// leaves a guard band of 1024 elements that no thread may touch: a kernel
// without its `if (j < count)` writes there without crashing, and only such
// a band shows it.
//
// Needs a CUDA build and a GPU. Without a GPU (or in a CPU-only build) it
// says so and exits with 77, which tools/check_exercise.sh reports as
// "cannot check here"; by then nvcc has compiled your file, so at least the
// syntax is checked.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#include "device.h"
#include "exercise_check.h"
#include "exercises.h"

#define CANNOT_RUN 77

#ifndef COURSE_CUDA
int main(void) {
    printf("check 01/sgd_kernel: the SGD update as a CUDA kernel (sgd_kernel.cu)\n");
    printf("CANNOT CHECK HERE: this is a CPU-only build (CUDA=0 or ASAN=1, or nvcc, NCCL and cuBLAS were not "
           "all found), so sgd_kernel.cu was not even compiled; it needs nvcc and a GPU\n");
    return CANNOT_RUN;
}
#else

#define GUARD 1024
#define GUARD_VALUE -12345.0f

static bool close_to(float got, float want) {
    return fabsf(got - want) <= 1e-6f * fmaxf(1.0f, fabsf(want));
}

// The first index at which the parameters were left as they were, if every
// element before it was updated: the signature of a grid that is too small.
static int first_untouched(const float *got, const float *before, const float *grads, int count) {
    for (int j = 0; j < count; j++)
        if (got[j] == before[j] && grads[j] != 0) return j;
    return -1;
}

// Explains the first wrong element in words; returns false if there is one.
static bool explain(int count, const float *got, const float *before, const float *grads, float lr) {
    for (int j = 0; j < count; j++) {
        float want = before[j] - lr * grads[j];
        if (close_to(got[j], want)) continue;
        int untouched = first_untouched(got, before, grads, count);
        char why[200];
        if (untouched == j && j > 0)
            snprintf(why, sizeof why, "elements 0..%d were updated, element %d and later were not: the grid "
                     "is too small; launch (count + threads - 1) / threads blocks", j - 1, j);
        else if (untouched == j)
            snprintf(why, sizeof why, "it was not updated at all: is the kernel body still empty?");
        else if (close_to(got[j], before[j] + lr * grads[j]))
            snprintf(why, sizeof why, "it went UP the gradient: subtract lr * grads[j]");
        else if (close_to(got[j], before[j] - 2 * lr * grads[j]))
            snprintf(why, sizeof why, "it was updated twice: do two threads compute the same index? "
                     "(j = blockIdx.x * blockDim.x + threadIdx.x)");
        else
            snprintf(why, sizeof why, "expected params[j] - lr * grads[j]");
        verdict(false, "%d parameters: element %d: got %g, expected %g: %s", count, j, got[j], want, why);
        return false;
    }
    for (int k = 0; k < GUARD; k++)
        if (got[count + k] != GUARD_VALUE) {
            verdict(false, "%d parameters: params[%d], %d past the last parameter, was changed: "
                    "threads with j >= count must do nothing (if (j < count))", count, count + k, k);
            return false;
        }
    return true;
}

// One size; false when wrong (and then it has said why).
static bool check_size(int count, float lr) {
    size_t n = (size_t)count + GUARD, bytes = n * sizeof(float);
    float *before = xmalloc(bytes), *grads = xmalloc(bytes), *got = xmalloc(bytes);
    for (size_t j = 0; j < n; j++) {
        bool inside = j < (size_t)count;
        before[j] = inside ? (float)sin(0.001 * (double)j) * 3 : GUARD_VALUE;
        grads[j] = inside ? (float)cos(0.37 * (double)j) + 0.25f : 1.0f;
    }
    float *d_params, *d_grads;
    CHECK_CUDA(cudaMalloc((void **)&d_params, bytes));
    CHECK_CUDA(cudaMalloc((void **)&d_grads, bytes));
    CHECK_CUDA(cudaMemcpy(d_params, before, bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_grads, grads, bytes, cudaMemcpyHostToDevice));
    sgd_update_gpu(d_params, d_grads, count, lr);
    cudaError_t err = cudaDeviceSynchronize();   // kernels run later: their errors show here
    bool ok = err == cudaSuccess;
    if (!ok)
        verdict(false, "%d parameters: the kernel failed on the GPU: %s (an index outside the "
                "arrays?)", count, cudaGetErrorString(err));
    else {
        CHECK_CUDA(cudaMemcpy(got, d_params, bytes, cudaMemcpyDeviceToHost));
        ok = explain(count, got, before, grads, lr);
        if (ok) verdict(true, "%d parameters", count);
    }
    cudaFree(d_params);
    cudaFree(d_grads);
    free(before);
    free(grads);
    free(got);
    return ok;
}

int main(void) {
    printf("check 01/sgd_kernel: the SGD update as a CUDA kernel (sgd_kernel.cu)\n");
    char reason[200] = "";
    if (device_count_gpus(reason, sizeof reason) == 0) {
        verdict(true, "sgd_kernel.cu compiled with nvcc");
        printf("CANNOT CHECK HERE: no usable GPU on this machine (%s); run the check where there is one\n",
               reason);
        return CANNOT_RUN;
    }
    CHECK_CUDA(cudaSetDevice(0));
    const int counts[] = {1, 100, 256, 257, 1000, 100003, 3000000};
    int wrong = 0;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        if (!check_size(counts[k], 0.05f)) wrong++;
        if (cudaGetLastError() != cudaSuccess) break;   // a broken context: the rest would fail too
    }
    if (wrong) {
        printf("NOT YET: %d of %zu sizes wrong; the first problem is described above\n", wrong,
               sizeof counts / sizeof counts[0]);
        return 1;
    }
    printf("PASSED: every parameter gets p - lr * g exactly once, for 1 to 3 million parameters, "
           "and nothing past the end is touched\n");
    return 0;
}
#endif
