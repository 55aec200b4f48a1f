// copy.c - copies, fills and frees: the memory calls that order with queued work.
//
// Each of them is a stream's business as much as memory's: a copy or a fill
// is queued like a kernel, some copies make the host wait, and cudaFree
// first waits for the work that may still use the memory. So they live
// here, above both stream.c and memory.c.
//
// When a copy happens, following CUDA's "API synchronization behavior":
//   cudaMemcpy  host->device: the host's bytes are taken at the call (a
//               pageable buffer is staged) and written when the legacy
//               stream gets there; from pinned memory the call waits.
//               device->host: returns when the copy is done.
//               device->device: queued only.
//   cudaMemcpyAsync  from pageable host memory: taken at the call; to
//               pageable host memory: returns when done (CUDA must stage
//               it); pinned host memory and device->device: queued - the
//               host must synchronize before it reads the result.
//   cudaMemset(Async): queued.
//   cudaFree, cudaFreeHost: wait for the device first.
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    void *staged; // a copy of pageable host bytes taken at the call
    int fill;
} copy_state;

static emu_op_status run_copy(void *state) {
    copy_state *c = (copy_state *)state;
    if (!c->staged) emu_race_range(c->src, c->bytes, false); // (the race checker looks at device memory only)
    emu_race_range(c->dst, c->bytes, true);
    memmove(c->dst, c->staged ? c->staged : c->src, c->bytes);
    return EMU_OP_DONE;
}

static emu_op_status run_fill(void *state) {
    copy_state *c = (copy_state *)state;
    emu_race_range(c->dst, c->bytes, true);
    memset(c->dst, c->fill, c->bytes);
    return EMU_OP_DONE;
}

static void free_copy(void *state) {
    copy_state *c = (copy_state *)state;
    free(c->staged);
    free(c);
}

static const char *copy_kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
    }
    return "an unknown cudaMemcpyKind";
}

// The direction the call says must be the direction the pointers have.
static cudaError_t check_direction(const char *call, cudaMemcpyKind kind, bool dst_dev, bool src_dev) {
    bool want_src_dev, want_dst_dev;
    switch (kind) {
    case cudaMemcpyHostToHost: want_src_dev = false, want_dst_dev = false; break;
    case cudaMemcpyHostToDevice: want_src_dev = false, want_dst_dev = true; break;
    case cudaMemcpyDeviceToHost: want_src_dev = true, want_dst_dev = false; break;
    case cudaMemcpyDeviceToDevice: want_src_dev = true, want_dst_dev = true; break;
    case cudaMemcpyDefault: return cudaSuccess;
    default:
        emu_warn("%s: %d is not a cudaMemcpyKind", call, (int)kind);
        return cudaErrorInvalidMemcpyDirection;
    }
    if (want_src_dev != src_dev || want_dst_dev != dst_dev) {
        emu_warn("%s(..., %s): the source is %s memory and the destination is %s memory", call, copy_kind_name(kind),
                 src_dev ? "device" : "host", dst_dev ? "device" : "host");
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

static cudaError_t memcpy_common(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                 cudaStream_t handle, bool async) {
    const char *call = async ? "cudaMemcpyAsync" : "cudaMemcpy";
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return emu_set_error(cudaErrorInvalidValue);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err) return err;
    emu_memory_kind dk = emu_memory_kind_of(dst, bytes, async ? "cudaMemcpyAsync destination" : "cudaMemcpy destination");
    emu_memory_kind sk = emu_memory_kind_of(src, bytes, async ? "cudaMemcpyAsync source" : "cudaMemcpy source");
    err = check_direction(call, kind, dk == EMU_DEVICE, sk == EMU_DEVICE);
    if (err) return emu_set_error(err);
    if (dk != EMU_DEVICE && sk != EMU_DEVICE) { // host to host: fully synchronous
        memmove(dst, src, bytes);
        return cudaSuccess;
    }
    cudaStream_t s = async ? handle : 0;
    if (!async && sk != EMU_DEVICE) { // cudaMemcpy from the host first waits for the legacy stream
        err = emu_stream_wait(s, EMU_STREAM_ALL, call);
        if (err) return err;
    }
    copy_state *c = calloc(1, sizeof *c);
    if (!c) emu_fatal("out of host memory queueing a copy");
    c->dst = dst, c->src = src, c->bytes = bytes;
    if (sk == EMU_HOST) { // pageable: staged now, the caller may reuse its buffer at once
        c->staged = malloc(bytes);
        if (!c->staged) emu_fatal("out of host memory staging a %zu-byte copy", bytes);
        memcpy(c->staged, src, bytes);
    }
    uint64_t position;
    err = emu_stream_enqueue(s, call, run_copy, c, free_copy, &position, c->staged ? 0 : EMU_OP_REPLAYABLE);
    if (err) return emu_set_error(err);
    bool host_waits = (dk != EMU_DEVICE && (!async || dk == EMU_HOST)) || (!async && sk == EMU_HOST_PINNED);
    return host_waits ? emu_stream_wait(s, position, call) : cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    return memcpy_common(dst, src, bytes, kind, 0, false);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    return memcpy_common(dst, src, bytes, kind, stream, true);
}

static cudaError_t memset_common(void *dst, int value, size_t bytes, cudaStream_t handle, const char *call) {
    if (bytes == 0) return cudaSuccess;
    if (!dst) return emu_set_error(cudaErrorInvalidValue);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err) return err;
    if (emu_memory_kind_of(dst, bytes, call) != EMU_DEVICE) {
        emu_warn("%s(%p, ...): the destination is host memory; it fills device memory only", call, dst);
        return emu_set_error(cudaErrorInvalidValue);
    }
    copy_state *c = calloc(1, sizeof *c);
    if (!c) emu_fatal("out of host memory queueing a memset");
    c->dst = dst, c->bytes = bytes, c->fill = value;
    err = emu_stream_enqueue(handle, call, run_fill, c, free, NULL, EMU_OP_REPLAYABLE);
    return err ? emu_set_error(err) : cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) { return memset_common(dst, value, bytes, 0, "cudaMemset"); }

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    return memset_common(dst, value, bytes, stream, "cudaMemsetAsync");
}

// ---------------------------------------------------------------- frees

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    int device;
    cudaError_t err = emu_allocation_to_free(p, &device);
    if (err) return err;
    // cudaFree waits for the device: work queued on it may still use the
    // memory. (Work that failed is reported there, and by the next synchronize.)
    emu_device_wait(device, "cudaFree");
    emu_allocation_release(p);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    cudaDeviceSynchronize(); // as on a GPU: queued copies may still use it
    return emu_pinned_remove(p, true);
}
