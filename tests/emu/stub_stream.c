// stub_stream.c - a stand-in for the emulated GPU's runtime (core, memory,
// streams), just big enough to test the emulated NCCL (emu/src/nccl_*.c) on
// its own (nccl_emu_test.c).
//
// Streams are FIFO queues of ops that run only when the program waits
// (cudaStreamSynchronize) or asks (cudaStreamQuery), as in the real core.
// All memory counts as device memory of the current device, except ranges
// the test marks as host memory. The current device comes from the
// environment variable EMU_TEST_DEVICE. There is no lock: the test uses one
// thread per process.
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_internal.h"

// ---------------------------------------------------------------- messages, time, lock

void emu_warn(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("emulated GPU (stub): ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
}

void emu_fatal(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("emulated GPU (stub): ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

double emu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double emu_timeout_s(void) {
    const char *text = getenv("EMU_TIMEOUT");
    double t = text ? atof(text) : 0;
    return t > 0 ? t : 300;
}

void emu_lock(void) {}
void emu_unlock(void) {}

// ---------------------------------------------------------------- devices and memory

int emu_device_count(void) { return 8; }

int emu_current_device(void) {
    const char *text = getenv("EMU_TEST_DEVICE");
    return text ? atoi(text) : 0;
}

int emu_physical_device(int d) { return d; }

// The test may declare a few ranges to be host memory.
typedef struct {
    const char *start;
    size_t bytes;
    emu_memory_kind kind;
} host_range;
static host_range host_ranges[8];
static int host_range_count;

void stub_mark_host_memory(const void *p, size_t bytes, int pinned) {
    if (host_range_count < 8)
        host_ranges[host_range_count++] =
            (host_range){p, bytes, pinned ? EMU_HOST_PINNED : EMU_HOST};
}

emu_memory_kind emu_memory_kind_of(const void *p, size_t bytes, const char *what) {
    (void)bytes;
    (void)what;
    for (int i = 0; i < host_range_count; i++)
        if ((const char *)p >= host_ranges[i].start &&
            (const char *)p < host_ranges[i].start + host_ranges[i].bytes)
            return host_ranges[i].kind;
    return EMU_DEVICE;
}

int emu_device_of(const void *p) {
    return emu_memory_kind_of(p, 1, "") == EMU_DEVICE ? emu_current_device() : -1;
}

// ---------------------------------------------------------------- streams

typedef struct stub_op {
    const char *what;
    emu_op_fn fn;
    void *state;
    void (*free_state)(void *);
    struct stub_op *next;
} stub_op;

struct CUstream_st {
    stub_op *head, *tail;
    bool destroyed;
    struct CUstream_st *next_stream;
};

static struct CUstream_st legacy_stream;
static struct CUstream_st *all_streams = &legacy_stream;
static char fail_reason[2048];

static struct CUstream_st *stream_of(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy_stream;
    return s;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    struct CUstream_st *st = calloc(1, sizeof *st);
    st->next_stream = all_streams;
    all_streams = st;
    *s = st;
    return cudaSuccess;
}

// A destroyed stream stays in the list (the stub never frees streams) and
// refuses new work.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s) stream_of(s)->destroyed = true;
    return cudaSuccess;
}

// Like the real core: a stream that refuses an op frees its state at once.
cudaError_t emu_stream_enqueue(cudaStream_t s, const char *what, emu_op_fn fn, void *state,
                               void (*free_state)(void *state), uint64_t *position, unsigned flags) {
    (void)position, (void)flags; // the stub neither numbers its ops nor captures them
    struct CUstream_st *st = stream_of(s);
    if (st->destroyed) {
        if (free_state) free_state(state);
        return cudaErrorInvalidResourceHandle;
    }
    stub_op *op = calloc(1, sizeof *op);
    *op = (stub_op){what, fn, state, free_state, NULL};
    if (st->tail) st->tail->next = op;
    else st->head = op;
    st->tail = op;
    return cudaSuccess;
}

// The stub checks no races.
void emu_race_range(const void *p, size_t bytes, bool write) {
    (void)p, (void)bytes, (void)write;
}

int emu_stream_device(cudaStream_t s) {
    (void)s;
    return emu_current_device();
}

void emu_op_fail_reason(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(fail_reason, sizeof fail_reason, fmt, args);
    va_end(args);
}

static void retire_head(struct CUstream_st *st) {
    stub_op *op = st->head;
    st->head = op->next;
    if (!st->head) st->tail = NULL;
    if (op->free_state) op->free_state(op->state);
    free(op);
}

// Runs ops until one must wait; returns the last status (DONE when the stream is empty).
static emu_op_status run_some(struct CUstream_st *st) {
    while (st->head) {
        emu_op_status status = st->head->fn(st->head->state);
        if (status == EMU_OP_PENDING) return status;
        if (status == EMU_OP_FAILED) {
            fprintf(stderr, "emulated GPU (stub): %s failed: %s\n", st->head->what, fail_reason);
            retire_head(st);
            return status;
        }
        retire_head(st);
    }
    return EMU_OP_DONE;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    struct CUstream_st *st = stream_of(s);
    int spins = 0;
    for (;;) {
        emu_op_status status = run_some(st);
        if (status == EMU_OP_DONE) return cudaSuccess;
        if (status == EMU_OP_FAILED) return cudaErrorLaunchFailure;
        if (++spins < 20) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    switch (run_some(stream_of(s))) {
    case EMU_OP_DONE: return cudaSuccess;
    case EMU_OP_FAILED: return cudaErrorLaunchFailure;
    default: return cudaErrorNotReady;
    }
}

void emu_stream_discard_if(bool (*match)(void *state, void *owner), void *owner) {
    for (struct CUstream_st *st = all_streams; st; st = st->next_stream) {
        stub_op **link = &st->head;
        st->tail = NULL;
        while (*link) {
            stub_op *op = *link;
            if (match(op->state, owner)) {
                *link = op->next;
                if (op->free_state) op->free_state(op->state);
                free(op);
            } else {
                st->tail = op;
                link = &op->next;
            }
        }
    }
}

// How many ops all streams hold (for the test of ncclCommAbort).
int stub_queued_ops(void) {
    int n = 0;
    for (struct CUstream_st *st = all_streams; st; st = st->next_stream)
        for (stub_op *op = st->head; op; op = op->next) n++;
    return n;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "some CUDA error";
    }
}
