// check.h - stop with a useful message when a call fails.
//
// Distributed programs fail in many places at once, so every message says
// which rank failed, which call, where in the source, and what to try next.
// Exit codes: 1 for a runtime failure, 2 for bad command-line input.
#ifndef COURSE_CHECK_H
#define COURSE_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef COURSE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#define EXIT_USAGE 2

// The rank of this process, once it is known (-1 before), for messages.
static int course_rank = -1;

static inline void course_set_rank(int rank) { course_rank = rank; }

static inline void course_print_prefix(FILE *out) {
    if (course_rank >= 0) fprintf(out, "[rank %d] ", course_rank);
}

// Formats a message into out (size bytes) on one line: control characters,
// which a message picks up from what a user typed or a file held (a newline
// in a flag's value, say), are shown as \n, \t or \xNN; text that does not
// fit is cut short with "...". The caller writes the line with one call, so
// that ranks sharing a terminal do not interleave their messages.
static inline void course_one_line(char *out, size_t size, const char *fmt, va_list args) {
    char text[4096];
    int n = vsnprintf(text, sizeof text, fmt, args);
    size_t used = 0;
    bool cut = n >= (int)sizeof text;
    for (const unsigned char *c = (const unsigned char *)text; *c && !cut; c++) {
        if (used + 5 + 4 > size) { cut = true; break; } // room for \xNN and "..."
        if (*c == '\n') used += (size_t)snprintf(out + used, size - used, "\\n");
        else if (*c == '\t') used += (size_t)snprintf(out + used, size - used, "\\t");
        else if (*c < 0x20 || *c == 0x7f) used += (size_t)snprintf(out + used, size - used, "\\x%02x", *c);
        else out[used++] = (char)*c;
    }
    if (cut && used + 4 <= size) memcpy(out + used, "...", 3), used += 3;
    out[used] = '\0';
}

// Print "error: <message>" on one line and exit 1.
__attribute__((format(printf, 1, 2), noreturn))
static inline void die(const char *fmt, ...) {
    char line[8192];
    size_t at = course_rank >= 0 ? (size_t)snprintf(line, sizeof line, "[rank %d] ", course_rank) : 0;
    at += (size_t)snprintf(line + at, sizeof line - at, "error: ");
    va_list args;
    va_start(args, fmt);
    course_one_line(line + at, sizeof line - at - 1, fmt, args);
    va_end(args);
    strcat(line, "\n");
    fflush(stdout);
    fputs(line, stderr);
    exit(1);
}

__attribute__((noreturn))
static inline void check_failed(const char *call, const char *file, int line,
                                const char *reason, const char *hint) {
    fflush(stdout);
    course_print_prefix(stderr);
    fprintf(stderr, "error: %s failed at %s:%d: %s", call, file, line, reason);
    if (hint && hint[0]) fprintf(stderr, " (hint: %s)", hint);
    fputc('\n', stderr);
    exit(1);
}

static inline const char *errno_hint(int err) {
    switch (err) {
    case EADDRINUSE: return "another job uses this port; pick another with --master_port or use --standalone";
    case ECONNREFUSED: return "nothing listens there yet: is MASTER_ADDR/MASTER_PORT right and rank 0 started?";
    case ETIMEDOUT: return "the peer did not answer in time; check the address and firewall";
    case ENOSPC: return "the disk is full";
    case EACCES: case EPERM: return "permission denied; check the path or run with the right user";
    case ENOENT: return "the file or directory does not exist";
    case ENOMEM: return "out of memory; try a smaller model, batch or message size";
    default: return "";
    }
}

// For POSIX calls that return -1 (or a negative number) and set errno.
#define CHECK_SYS(call)                                                        \
    do {                                                                       \
        if ((call) < 0) {                                                      \
            int check_errno_ = errno;                                          \
            check_failed(#call, __FILE__, __LINE__, strerror(check_errno_),    \
                         errno_hint(check_errno_));                            \
        }                                                                      \
    } while (0)

// For pointers that are NULL on failure (malloc, fopen, ...).
#define CHECK_PTR(call)                                                        \
    do {                                                                       \
        if ((call) == NULL) {                                                  \
            int check_errno_ = errno;                                          \
            check_failed(#call, __FILE__, __LINE__,                            \
                         check_errno_ ? strerror(check_errno_) : "returned NULL", \
                         errno_hint(check_errno_));                            \
        }                                                                      \
    } while (0)

// malloc that never returns NULL: a training run cannot go on without memory.
static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory allocating %zu bytes", bytes);
    return p;
}

static inline void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

#ifdef COURSE_CUDA
static inline const char *cuda_hint(cudaError_t err) {
    switch (err) {
    case cudaErrorNoDevice: return "no GPU is visible; check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu";
    case cudaErrorInsufficientDriver: return "the NVIDIA driver is missing or older than this CUDA toolkit";
    case cudaErrorMemoryAllocation: return "the GPU is out of memory; use a smaller batch or model";
    case cudaErrorInvalidDevice: return "that GPU index does not exist; check LOCAL_RANK and CUDA_VISIBLE_DEVICES";
    case cudaErrorNoKernelImageForDevice: return "the binary was built for another GPU architecture; rebuild here (make clean && make)";
    default: return "";
    }
}

#define CHECK_CUDA(call)                                                       \
    do {                                                                       \
        cudaError_t check_err_ = (call);                                       \
        if (check_err_ != cudaSuccess)                                         \
            check_failed(#call, __FILE__, __LINE__,                            \
                         cudaGetErrorString(check_err_), cuda_hint(check_err_)); \
    } while (0)

static inline const char *nccl_hint(ncclResult_t res) {
    switch (res) {
    case ncclInvalidUsage: return "often two ranks on one GPU (NCCL needs one rank per GPU; use --backend cpu) or mismatched calls across ranks";
    case ncclSystemError: return "a socket or system call failed; set NCCL_DEBUG=WARN and check NCCL_SOCKET_IFNAME";
    case ncclRemoteError: return "a peer rank failed or was killed";
    case ncclUnhandledCudaError: return "a CUDA call inside NCCL failed; check the GPU with nvidia-smi";
    case ncclInternalError: return "set NCCL_DEBUG=INFO to see what NCCL was doing";
    default: return "set NCCL_DEBUG=WARN for NCCL's own explanation";
    }
}

#define CHECK_NCCL(call)                                                       \
    do {                                                                       \
        ncclResult_t check_res_ = (call);                                      \
        if (check_res_ != ncclSuccess && check_res_ != ncclInProgress)         \
            check_failed(#call, __FILE__, __LINE__,                            \
                         ncclGetErrorString(check_res_), nccl_hint(check_res_)); \
    } while (0)
#endif

#endif
