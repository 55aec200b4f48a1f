// device.h - choose where to compute (a GPU or the CPU) and say why.
//
// The rule, as in the course's design: --device auto (the default) takes
// GPU LOCAL_RANK % number_of_GPUs when this is a CUDA build and a GPU is
// usable; otherwise the CPU. A CUDA build on a machine without a driver
// (a laptop, CI) falls back to the CPU with a note instead of failing.
// The environment variable COURSE_DEVICE sets the default for --device.
//
// It also holds the few memory helpers that let the same code move
// buffers whichever device was chosen.
#ifndef COURSE_DEVICE_H
#define COURSE_DEVICE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

typedef enum { DEVICE_CPU, DEVICE_CUDA } device_kind;

// A CUDA event: cudaEvent_t points to one. Named so that code which passes
// events along compiles the same in a build without CUDA.
struct CUevent_st;

typedef struct {
    device_kind kind;
    int gpu;         // CUDA device index, when kind == DEVICE_CUDA
    int gpu_count;   // GPUs visible to this process (0 when none or no CUDA build)
    char name[128];  // "NVIDIA H100 80GB HBM3" or "CPU (16 cores)"
    char why[200];   // one line: why this device was chosen
} device_t;

static inline bool device_is_cuda(const device_t *d) { return d->kind == DEVICE_CUDA; }

static inline void device_cpu_name(device_t *d) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(d->name, sizeof d->name, "CPU (%ld cores)", cores);
}

// How many GPUs the CUDA runtime can use here, and why none if none.
static inline int device_count_gpus(char *reason, size_t size) {
#ifdef COURSE_CUDA
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        snprintf(reason, size, "%s", cudaGetErrorString(err));
        cudaGetLastError(); // clear the sticky error so later calls are not confused
        return 0;
    }
    if (count == 0) snprintf(reason, size, "no GPU is visible");
    return count;
#else
    snprintf(reason, size, "this is a CPU-only build (CUDA=0 or no CUDA toolkit found)");
    return 0;
#endif
}

// The GPU count, asked in a short-lived child process. A program that will
// fork workers must not touch CUDA before fork: a CUDA context does not
// survive into a child (this is why mp.spawn does not use fork with CUDA).
static inline int device_count_gpus_before_fork(void) {
#ifdef COURSE_CUDA
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    if (child < 0) die("fork failed: %s", strerror(errno));
    if (child == 0) {
        char reason[160];
        int count = device_count_gpus(reason, sizeof reason);
        _exit(count > 250 ? 250 : count);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid failed: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
#else
    return 0;
#endif
}

// request: "auto", "cpu" or "cuda" (NULL means auto).
static inline device_t device_choose(const char *request, int local_rank) {
    device_t d;
    memset(&d, 0, sizeof d);
    if (!request) request = "auto";
    if (local_rank < 0) local_rank = 0;
    if (!strcmp(request, "cpu")) {
        d.kind = DEVICE_CPU;
        device_cpu_name(&d);
        snprintf(d.why, sizeof d.why, "--device cpu was asked for");
        return d;
    }
    char reason[160] = "";
    d.gpu_count = device_count_gpus(reason, sizeof reason);
    if (d.gpu_count == 0) {
        if (!strcmp(request, "cuda"))
            die("--device cuda was asked for, but no GPU can be used: %s (use --device auto or cpu)", reason);
        d.kind = DEVICE_CPU;
        device_cpu_name(&d);
        snprintf(d.why, sizeof d.why, "no usable GPU (%s), so the CPU", reason);
        return d;
    }
#ifdef COURSE_CUDA
    d.kind = DEVICE_CUDA;
    d.gpu = local_rank % d.gpu_count;
    CHECK_CUDA(cudaSetDevice(d.gpu));
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, d.gpu));
    snprintf(d.name, sizeof d.name, "GPU %d: %.100s", d.gpu, prop.name);
    snprintf(d.why, sizeof d.why, "%s, local rank %d -> GPU %d of %d",
             strcmp(request, "cuda") ? "auto found a GPU" : "--device cuda",
             local_rank, d.gpu, d.gpu_count);
#endif
    return d;
}

// Memory that lives on the chosen device. On the CPU these are plain
// malloc and memcpy, so callers need no #ifdef.
static inline void *device_alloc(const device_t *d, size_t bytes) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d)) {
        void *p = NULL;
        cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
        if (err != cudaSuccess)
            die("cudaMalloc of %zu bytes (%.1f MiB) on GPU %d failed: %s", bytes,
                bytes / 1048576.0, d->gpu, cudaGetErrorString(err));
        return p;
    }
#endif
    (void)d;
    return xmalloc(bytes);
}

static inline void device_free(const device_t *d, void *p) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d)) {
        if (p) CHECK_CUDA(cudaFree(p));
        return;
    }
#endif
    (void)d;
    free(p);
}

// Waits for the work queued on the legacy default stream (and on streams
// that synchronize with it) before it copies; work on a non-blocking stream
// must be finished first (cudaStreamSynchronize, or an event).
static inline void device_to_host(const device_t *d, void *host, const void *dev, size_t bytes) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d)) {
        CHECK_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
        return;
    }
#endif
    (void)d;
    if (bytes) memmove(host, dev, bytes);
}

// Returns when the bytes are in device memory, visible to work on any
// stream. cudaMemcpy alone does not promise that: from pageable memory it
// may return once the bytes are staged for the copy engine, before they
// land (CUDA's "API synchronization behavior"), and a kernel queued next on
// a non-blocking stream does not wait for the legacy stream that copies
// them. A process group that stages gradients through the host (pg.h) and
// a model that steps on its own stream (chapter 08) met exactly there.
static inline void device_from_host(const device_t *d, void *dev, const void *host, size_t bytes) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d)) {
        CHECK_CUDA(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
        return;
    }
#endif
    (void)d;
    if (bytes) memmove(dev, host, bytes);
}

// Waits on the host until a CUDA event has happened (on the CPU there are
// no events, and NULL is no event: nothing to wait for). The event is a
// cudaEvent_t.
static inline void device_wait_event(const device_t *d, struct CUevent_st *event) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d) && event) {
        CHECK_CUDA(cudaEventSynchronize(event));
        return;
    }
#endif
    (void)d, (void)event;
}

// Records an event (unless NULL) on the legacy default stream: it happens
// once the work queued there so far has, the copies of device_from_host
// included.
static inline void device_record_event(const device_t *d, struct CUevent_st *event) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d) && event) {
        CHECK_CUDA(cudaEventRecord(event, cudaStreamLegacy));
        return;
    }
#endif
    (void)d, (void)event;
}

static inline void device_synchronize(const device_t *d) {
#ifdef COURSE_CUDA
    if (device_is_cuda(d)) CHECK_CUDA(cudaDeviceSynchronize());
#endif
    (void)d;
}

#endif
