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
#include <unistd.h>

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
// fit is cut short with "...".
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

// Prints "[rank R] <message>" and a newline on stderr with ONE write() call.
// The ranks of a job share a terminal: one call per line keeps their lines
// whole ("[rank 1] [rank 0] error: ..." is two ranks' lines glued together).
__attribute__((format(printf, 1, 0)))
static inline void course_vsay(const char *fmt, va_list args) {
    char line[4200];
    size_t n = course_rank >= 0 ? (size_t)snprintf(line, sizeof line, "[rank %d] ", course_rank) : 0;
    course_one_line(line + n, sizeof line - n - 1, fmt, args);   // leaves room for the '\n'
    n += strlen(line + n);
    line[n++] = '\n';
    fflush(stdout);
    for (size_t done = 0; done < n;) {   // a write to a terminal or pipe may be partial
        ssize_t w = write(STDERR_FILENO, line + done, n - done);
        if (w <= 0 && errno != EINTR) break;   // stderr is gone: nowhere left to say it
        if (w > 0) done += (size_t)w;
    }
}

__attribute__((format(printf, 1, 2)))
static inline void course_say(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    course_vsay(fmt, args);
    va_end(args);
}

// Print "error: <message>" on one line and exit 1.
__attribute__((format(printf, 1, 2), noreturn))
static inline void die(const char *fmt, ...) {
    char message[3500];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    course_say("error: %s", message);
    exit(1);
}

__attribute__((noreturn))
static inline void check_failed(const char *call, const char *file, int line,
                                const char *reason, const char *hint) {
    course_say("error: %s failed at %s:%d: %s%s%s%s", call, file, line, reason,
               hint && hint[0] ? " (hint: " : "", hint && hint[0] ? hint : "",
               hint && hint[0] ? ")" : "");
    exit(1);
}

static inline const char *errno_hint(int err) {
    switch (err) {
    case EADDRINUSE: return "another program uses this address and port";
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
