// core.c - the bottom of the emulated GPU: what every other part needs.
//
// Messages ("emulated GPU: ..."), the clock, the one lock, the error that
// cudaGetLastError returns, the rule that CUDA does not survive fork(),
// the emulated devices (how many, which one this thread uses, what they
// report), and who runs now: host code, or a thread of which kernel. It
// calls no other file of the library.
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"
#include "emu_kernel_abi.h"

#define EMU_MAX_DEVICES 64

// ================================================================ messages, time, lock

static void vreport(const char *prefix, const char *fmt, va_list args) {
    char text[2048];
    vsnprintf(text, sizeof text, fmt, args);
    fflush(stdout);
    fprintf(stderr, "%s%s\n", prefix, text);
}

void emu_warn(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vreport("emulated GPU: ", fmt, args);
    va_end(args);
}

void emu_fatal(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vreport("emulated GPU: error: ", fmt, args);
    va_end(args);
    exit(1);
}

double emu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double emu_timeout_s(void) {
    const char *s = getenv("EMU_TIMEOUT");
    double t = s ? atof(s) : 0;
    return t > 0 ? t : 300;
}

static pthread_mutex_t big_lock;
static pthread_once_t big_lock_once = PTHREAD_ONCE_INIT;

static void big_lock_init(void) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&big_lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

void emu_lock(void) {
    pthread_once(&big_lock_once, big_lock_init);
    pthread_mutex_lock(&big_lock);
}

void emu_unlock(void) { pthread_mutex_unlock(&big_lock); }

// ================================================================ errors

static __thread cudaError_t last_error = cudaSuccess;

cudaError_t emu_set_error(cudaError_t err) {
    if (err != cudaSuccess) last_error = err;
    return err;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

typedef struct { cudaError_t code; const char *name, *text; } error_text;

// NVIDIA's names; the sentences are the emulator's own.
static const error_text error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const error_text *find_error(cudaError_t e) {
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++)
        if (error_texts[i].code == e) return &error_texts[i];
    return NULL;
}

const char *cudaGetErrorString(cudaError_t e) {
    const error_text *t = find_error(e);
    return t ? t->text : "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e) {
    const error_text *t = find_error(e);
    return t ? t->name : "cudaErrorUnknown";
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return emu_set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return emu_set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

// ================================================================ fork
// A CUDA context does not survive fork(): a child of a process that has
// used CUDA cannot use it (this is why mp.spawn does not fork). The
// emulator refuses the same way, so the course's fork-before-CUDA rule is
// tested here too.
static pid_t initialised_in = 0; // the process that made the first CUDA call

cudaError_t emu_ready(void) {
    pid_t me = getpid();
    if (initialised_in == 0) initialised_in = me;
    if (initialised_in != me) {
        static bool told = false;
        if (!told)
            emu_warn("this process was forked from one that had already used CUDA (pid %d); a CUDA "
                     "context does not survive fork(): start workers before touching CUDA, or exec them",
                     (int)initialised_in);
        told = true;
        return cudaErrorInitializationError;
    }
    return cudaSuccess;
}

// ================================================================ devices

static int visible[EMU_MAX_DEVICES]; // visible index -> emulated device number
static int visible_count = -1;
static __thread int current_device = 0;

// EMU_GPUS emulated GPUs (default 8, a full server), then CUDA_VISIBLE_DEVICES
// picks and renumbers them as it does on a real machine.
static void discover_devices(void) {
    if (visible_count >= 0) return;
    const char *env = getenv("EMU_GPUS");
    int total = env && *env ? atoi(env) : 8;
    if (total < 0) total = 0;
    if (total > EMU_MAX_DEVICES) total = EMU_MAX_DEVICES;
    visible_count = 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        for (int i = 0; i < total; i++) visible[visible_count++] = i;
        return;
    }
    // As CUDA does: a comma-separated list; parsing stops at the first
    // entry that is not a valid device.
    const char *p = cvd;
    while (*p && visible_count < EMU_MAX_DEVICES) {
        char *end;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d >= total) break;
        visible[visible_count++] = (int)d;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
}

int emu_device_count(void) {
    discover_devices();
    return visible_count;
}

int emu_current_device(void) { return current_device; }

int emu_physical_device(int d) {
    discover_devices();
    return d >= 0 && d < visible_count ? visible[d] : -1;
}

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return emu_set_error(cudaErrorInvalidValue);
    *count = 0;
    cudaError_t err = emu_ready();
    if (err) return emu_set_error(err);
    *count = emu_device_count();
    return *count ? cudaSuccess : emu_set_error(cudaErrorNoDevice);
}

cudaError_t emu_check_device(int d) {
    cudaError_t err = emu_ready();
    if (err) return err;
    if (emu_device_count() == 0) return cudaErrorNoDevice;
    return d >= 0 && d < emu_device_count() ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaSetDevice(int d) {
    cudaError_t err = emu_check_device(d);
    if (err) return emu_set_error(err);
    current_device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
    if (!d) return emu_set_error(cudaErrorInvalidValue);
    cudaError_t err = emu_check_device(current_device);
    if (err) return emu_set_error(err);
    *d = current_device;
    return cudaSuccess;
}

size_t emu_device_memory_bytes(void) {
    const char *s = getenv("EMU_MEMORY_GB");
    double gb = s ? atof(s) : 0;
    return (size_t)((gb > 0 ? gb : 16) * 1073741824.0);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!p) return emu_set_error(cudaErrorInvalidValue);
    cudaError_t err = emu_check_device(d);
    if (err) return emu_set_error(err);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated GPU (CPU, for testing)");
    p->totalGlobalMem = emu_device_memory_bytes();
    p->sharedMemPerBlock = EMU_STATIC_SHARED_LIMIT;
    p->sharedMemPerBlockOptin = EMU_DYNAMIC_SHARED_OPTIN;
    p->sharedMemPerMultiprocessor = EMU_DYNAMIC_SHARED_OPTIN + 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)1 << 31;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0; // an sm_90 device: what the course's kernels are written for
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->pciBusID = emu_physical_device(d);
    p->l2CacheSize = 50 << 20;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int d) {
    if (!value) return emu_set_error(cudaErrorInvalidValue);
    struct cudaDeviceProp p;
    cudaError_t err = cudaGetDeviceProperties(&p, d);
    if (err) return err;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return emu_set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d) {
    if (!bus || len < 13) return emu_set_error(cudaErrorInvalidValue);
    cudaError_t err = emu_check_device(d);
    if (err) return emu_set_error(err);
    snprintf(bus, (size_t)len, "0000:%02x:00.0", emu_physical_device(d) & 0xff);
    return cudaSuccess;
}


// ================================================================ who runs now

__thread emu_thread_view *emu_self;                 // the kernel thread (emu_kernel_abi.h)
static __thread const emu_kernel_site *running_kernel; // its kernel

void emu_set_running_kernel(const emu_kernel_site *site) { running_kernel = site; }

const emu_kernel_site *emu_running_kernel(void) { return running_kernel; }

const char *emu_current_kernel(void) { return running_kernel ? running_kernel->name : NULL; }

static __thread const emu_running_op *running_op;

void emu_set_current_op(const emu_running_op *op) { running_op = op; }

const emu_running_op *emu_current_op(void) { return running_op; }

void emu_kernel_thread_name(char *buf, size_t size) {
    if (!running_kernel || !emu_self) {
        snprintf(buf, size, "host code");
        return;
    }
    const emu_thread_view *v = emu_self;
    snprintf(buf, size, "kernel %s (launched at %s:%d), block (%u,%u,%u), thread (%u,%u,%u)", running_kernel->name,
             running_kernel->file, running_kernel->line, v->block_idx.x, v->block_idx.y, v->block_idx.z,
             v->thread_idx.x, v->thread_idx.y, v->thread_idx.z);
}

void emu_not_in_kernel(const char *what) {
    emu_fatal("%s was used outside a kernel (only code launched with <<<...>>> has one)", what);
}

void emu_kernel_error(const char *what, const char *problem) {
    char who[300];
    emu_kernel_thread_name(who, sizeof who);
    emu_fatal("%s in %s: %s", what, who, problem);
}
