// stream.c - streams and events: work runs as late as CUDA allows.
//
// On a GPU, a kernel launch or an async copy only queues work: the host
// goes on at once, and the GPU gets to it whenever it gets to it. Code
// that reads a result without waiting for it, or that lets two streams
// touch one buffer without an event between them, works or fails by luck
// of timing. The emulator removes the luck: queued work runs only when
// something must wait for it -
//   - the host: cudaStreamSynchronize, cudaDeviceSynchronize,
//     cudaEventSynchronize, a copy to pageable host memory, cudaFree;
//   - another stream: cudaStreamWaitEvent, or the legacy default stream,
//     which waits for (and is waited for by) every stream created without
//     cudaStreamNonBlocking;
//   - a query: cudaStreamQuery and cudaEventQuery run one queued operation
//     per call and say "not ready" while any was left at the call.
// So a missing dependency gives stale data every time, in a test.
//
// That is the default schedule (EMU_SCHEDULE=lazy). eager runs work as
// it is queued, random at random moments, one stream at a time, within
// what the dependencies allow (order.c): a program must be right in all
// three.
//
// Each stream is a queue of operations numbered 1, 2, ...; an operation
// carries the (stream, number) pairs it must wait for, fixed when it was
// queued, so "run stream S up to operation N" first runs what those pairs
// name. It also carries its vector clock (order.c), which race.c reads to
// tell whether two operations that touch the same memory are ordered. The
// legacy stream of each device is made on first use.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "emu_internal.h"

#define STREAM_MAGIC 0x5354524dU
#define MAX_DEVICES 64

typedef emu_stream stream;

typedef struct {
    stream *on;
    uint64_t seq;
} dependency;

typedef struct op {
    uint64_t seq;
    uint32_t serial;      // its number among all operations of this process
    emu_clock clock;      // what happens before it
    const char *what;
    emu_op_fn fn;
    void *state;
    void (*free_state)(void *);
    dependency *deps;
    int dep_count;
    struct op *next;
} op;

struct CUstream_st {
    unsigned magic;
    int device;
    int id;               // its number in this process: its entry in vector clocks
    char name[64];        // for messages: "the legacy stream of device 0", "stream 3"
    emu_clock clock;      // the clock of its last queued operation
    bool legacy, nonblocking, destroyed;
    op *head, *tail;
    uint64_t enqueued, completed;
    int refs;             // dependencies and events that point here
    bool failed;
    char why[800];        // why it failed
    struct CUgraph_st *capture; // the graph its work goes to while it is captured (graph.c)
    bool capture_failed;        // something that cannot be captured was attempted
    stream *next;         // the device's streams
};


static stream *devices_streams[MAX_DEVICES];
static stream *legacy_streams[MAX_DEVICES];
static int streams_made, streams_created; // all (the legacy ones too); by cudaStreamCreate
static uint32_t ops_queued;
static __thread char fail_reason[600];

// ================================================================ handles

static stream *new_stream(int device, bool legacy, bool nonblocking) {
    stream *s = calloc(1, sizeof *s);
    if (!s) emu_fatal("out of host memory for a stream");
    s->magic = STREAM_MAGIC;
    s->device = device, s->legacy = legacy, s->nonblocking = nonblocking;
    s->id = streams_made++;
    if (legacy) snprintf(s->name, sizeof s->name, "the legacy stream of device %d", device);
    else snprintf(s->name, sizeof s->name, "stream %d (%s) of device %d", ++streams_created,
                  nonblocking ? "non-blocking" : "blocking", device);
    s->next = devices_streams[device];
    devices_streams[device] = s;
    return s;
}

static stream *legacy_of(int device) {
    if (!legacy_streams[device]) legacy_streams[device] = new_stream(device, true, false);
    return legacy_streams[device];
}

// 0, cudaStreamLegacy and cudaStreamPerThread are the current device's
// legacy stream (per-thread default streams are not emulated separately).
static stream *resolve(cudaStream_t handle) {
    int dev = emu_current_device();
    if (dev < 0 || dev >= MAX_DEVICES || dev >= emu_device_count()) return NULL;
    if (!handle || handle == cudaStreamLegacy || handle == cudaStreamPerThread) return legacy_of(dev);
    stream *s = (stream *)handle;
    return s->magic == STREAM_MAGIC && !s->destroyed ? s : NULL;
}

int emu_stream_device(cudaStream_t handle) {
    emu_lock();
    stream *s = resolve(handle);
    int d = s ? s->device : -1;
    emu_unlock();
    return d;
}

static bool unfinished(const stream *s) { return s->completed < s->enqueued; }

// A destroyed stream is freed once nothing is queued on it and nothing points to it.
static void maybe_free(stream *s) {
    if (!s->destroyed || unfinished(s) || s->refs > 0 || s->legacy) return;
    for (stream **link = &devices_streams[s->device]; *link; link = &(*link)->next)
        if (*link == s) {
            *link = s->next;
            break;
        }
    s->magic = 0;
    emu_clock_free(&s->clock);
    free(s);
}

// ================================================================ queueing

// o waits for operation `seq` of stream `on`, whose clock is `clock`.
static void add_dependency(op *o, stream *on, uint64_t seq, const emu_clock *clock) {
    dependency *d = realloc(o->deps, sizeof *d * (size_t)(o->dep_count + 1));
    if (!d) emu_fatal("out of host memory queueing GPU work");
    o->deps = d;
    d[o->dep_count++] = (dependency){on, seq};
    on->refs++;
    emu_clock_join(&o->clock, clock);
}

// The legacy stream waits for all work queued so far on the device's
// blocking streams, and they wait for the legacy stream's.
static void add_implicit_dependencies(op *o, stream *s) {
    if (s->nonblocking) return;
    if (s->legacy) {
        for (stream *b = devices_streams[s->device]; b; b = b->next)
            if (b != s && !b->nonblocking && b->enqueued) {
                if (unfinished(b)) add_dependency(o, b, b->enqueued, &b->clock);
                else emu_clock_join(&o->clock, &b->clock);
            }
    } else {
        stream *l = legacy_streams[s->device];
        if (l && unfinished(l)) add_dependency(o, l, l->enqueued, &l->clock);
        else if (l) emu_clock_join(&o->clock, &l->clock);
    }
}

// Queue an operation on s, after what the host has seen complete, and
// after operation after_seq of stream `after` when it is given (an event).
static op *append(stream *s, const char *what, emu_op_fn fn, void *state, void (*free_state)(void *), stream *after,
                  uint64_t after_seq, const emu_clock *after_clock) {
    op *o = calloc(1, sizeof *o);
    if (!o) emu_fatal("out of host memory queueing GPU work");
    o->what = what, o->fn = fn, o->state = state, o->free_state = free_state;
    o->serial = ++ops_queued;
    emu_clock_copy(&o->clock, &s->clock);
    emu_clock_join(&o->clock, emu_host_clock());
    add_implicit_dependencies(o, s);
    if (after) add_dependency(o, after, after_seq, after_clock);
    o->seq = ++s->enqueued;
    emu_clock_set(&o->clock, s->id, o->seq);
    emu_clock_copy(&s->clock, &o->clock);
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    return o;
}

static void settle(stream *s);

// ================================================================ capture (the graphs of graph.c)

static void invalidate_capture(stream *s, const char *why) {
    if (!s->capture_failed) emu_warn("stream capture invalidated: %s", why);
    s->capture_failed = true;
}

// The legacy stream orders itself with every blocking stream: while one
// of them is captured, it may not be used (CUDA's cudaErrorStreamCaptureImplicit).
static bool blocking_stream_captured(int device, const char *call) {
    for (stream *b = devices_streams[device]; b; b = b->next)
        if (b->capture && !b->nonblocking && !b->legacy) {
            char why[160];
            snprintf(why, sizeof why, "%s on the legacy stream while a blocking stream is captured", call);
            invalidate_capture(b, why);
            return true;
        }
    return false;
}

static void capture_op(stream *s, const char *what, emu_op_fn fn, void *state, void (*free_state)(void *)) {
    struct CUgraph_st *g = s->capture;
    emu_graph_node *n = calloc(1, sizeof *n);
    if (!n) emu_fatal("out of host memory capturing GPU work");
    *n = (emu_graph_node){1, what, fn, state, free_state};
    if (g->count == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 64;
        g->nodes = realloc(g->nodes, sizeof *g->nodes * (size_t)g->cap);
        if (!g->nodes) emu_fatal("out of host memory capturing GPU work");
    }
    g->nodes[g->count++] = n;
}

void emu_graph_node_release(emu_graph_node *n) {
    if (--n->refs > 0) return;
    if (n->free_state) n->free_state(n->state);
    free(n);
}

cudaError_t emu_stream_begin_capture(cudaStream_t handle, struct CUgraph_st *g) {
    emu_lock();
    stream *s = resolve(handle);
    cudaError_t err = cudaSuccess;
    if (!s) err = cudaErrorInvalidResourceHandle;
    else if (s->legacy) err = cudaErrorStreamCaptureUnsupported; // as in CUDA: the legacy stream cannot be captured
    else if (s->capture) err = cudaErrorIllegalState;
    else s->capture = g, s->capture_failed = false;
    emu_unlock();
    return err;
}

struct CUgraph_st *emu_stream_end_capture(cudaStream_t handle, bool *failed) {
    emu_lock();
    stream *s = resolve(handle);
    struct CUgraph_st *g = s ? s->capture : NULL;
    if (g) *failed = s->capture_failed, s->capture = NULL;
    emu_unlock();
    return g;
}

struct CUgraph_st *emu_stream_capture(cudaStream_t handle, bool *failed) {
    emu_lock();
    stream *s = resolve(handle);
    struct CUgraph_st *g = s ? s->capture : NULL;
    if (g && failed) *failed = s->capture_failed;
    emu_unlock();
    return g;
}

// ================================================================ queueing, for the other files

cudaError_t emu_stream_enqueue(cudaStream_t handle, const char *what, emu_op_fn fn, void *state,
                               void (*free_state)(void *), uint64_t *position, unsigned flags) {
    emu_lock();
    stream *s = resolve(handle);
    cudaError_t err = !s ? cudaErrorInvalidResourceHandle
                      : s->legacy && blocking_stream_captured(s->device, what) ? cudaErrorStreamCaptureImplicit
                                                                                : cudaSuccess;
    if (!err && s->capture && !(flags & EMU_OP_REPLAYABLE)) {
        char why[160];
        snprintf(why, sizeof why, "%s cannot be captured in a graph by the emulated GPU", what);
        invalidate_capture(s, why);
        err = cudaErrorStreamCaptureUnsupported;
    }
    if (err) {
        emu_unlock();
        if (free_state) free_state(state);
        return err;
    }
    if (s->capture) {
        capture_op(s, what, fn, state, free_state);
        if (position) *position = 0;
    } else {
        op *o = append(s, what, fn, state, free_state, NULL, 0, NULL);
        if (position) *position = o->seq;
        settle(s);
    }
    emu_unlock();
    return cudaSuccess;
}

emu_stream *emu_stream_of(cudaStream_t handle) { return resolve(handle); }

uint64_t emu_stream_append(emu_stream *s, const char *what, emu_op_fn fn, void *state, void (*free_state)(void *),
                           emu_stream *after, uint64_t after_seq, const emu_clock *after_clock, emu_clock *clock) {
    op *o = append(s, what, fn, state, free_state, after, after_seq, after_clock);
    uint64_t seq = o->seq; // (settle may run it, and free it)
    if (clock) emu_clock_copy(clock, &o->clock);
    settle(s);
    return seq;
}

bool emu_stream_reached(const emu_stream *s, uint64_t seq) { return s->completed >= seq; }

void emu_stream_hold(emu_stream *s) { s->refs++; }

void emu_stream_release(emu_stream *s) {
    s->refs--;
    maybe_free(s);
}

void emu_op_fail_reason(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(fail_reason, sizeof fail_reason, fmt, args);
    va_end(args);
}

emu_op_status emu_done_at_once(void *state) {
    (void)state;
    return EMU_OP_DONE;
}

void emu_stream_discard_if(bool (*match)(void *state, void *owner), void *owner) {
    emu_lock();
    for (int d = 0; d < MAX_DEVICES; d++)
        for (stream *s = devices_streams[d]; s; s = s->next)
            for (op *o = s->head; o; o = o->next)
                if (o->fn != emu_done_at_once && match(o->state, owner)) {
                    if (o->free_state) o->free_state(o->state);
                    o->fn = emu_done_at_once, o->state = NULL, o->free_state = NULL;
                }
    emu_unlock();
}

// ================================================================ running

// Stopped at a failed op (not one that was discarded since).
static bool stuck(const stream *s) { return s->failed && s->head && s->head->fn != emu_done_at_once; }

static void retire(stream *s) {
    op *o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    s->completed = o->seq;
    for (int i = 0; i < o->dep_count; i++) {
        o->deps[i].on->refs--;
        maybe_free(o->deps[i].on);
    }
    if (o->free_state) o->free_state(o->state);
    emu_clock_free(&o->clock);
    free(o->deps);
    free(o);
}

// Run stream s until operation `target` has completed, or at most
// max_ops of its own operations (what it depends on runs in full).
static emu_op_status run_stream(stream *s, uint64_t target, int max_ops) {
    while (s->completed < target && max_ops-- > 0) {
        op *o = s->head;
        if (s->failed && o->fn != emu_done_at_once) return EMU_OP_FAILED;
        s->failed = false; // the failed op was discarded (ncclCommAbort): the stream runs on
        for (int i = 0; i < o->dep_count; i++) {
            emu_op_status r = run_stream(o->deps[i].on, o->deps[i].seq, 1 << 30);
            if (r != EMU_OP_DONE) return r;
        }
        fail_reason[0] = 0;
        const emu_running_op *outer = emu_current_op();
        emu_running_op self = {o->serial, s->id, o->seq, &o->clock, o->what, s->name};
        emu_set_current_op(&self);
        emu_op_status r = o->fn(o->state);
        emu_set_current_op(outer);
        if (r == EMU_OP_PENDING) return r;
        if (r == EMU_OP_FAILED) {
            s->failed = true;
            snprintf(s->why, sizeof s->why, "%s failed: %s", o->what, fail_reason[0] ? fail_reason : "no reason given");
            return r;
        }
        retire(s);
    }
    return s->completed >= target ? EMU_OP_DONE : EMU_OP_PENDING;
}

static cudaError_t failed(stream *s, const char *call) {
    emu_warn("%s: queued work on this stream failed: %s", call, s->why);
    return emu_set_error(cudaErrorLaunchFailure);
}

// ================================================================ the schedule

static __thread int settling;

// EMU_SCHEDULE=random: a few steps (one on average) of streams picked at
// random among those with queued work; each step first runs what it waits for.
static void random_steps(void) {
    while (emu_schedule_random() % 2) {
        int candidates = 0;
        for (int d = 0; d < MAX_DEVICES; d++)
            for (stream *c = devices_streams[d]; c; c = c->next) candidates += unfinished(c) && !stuck(c);
        if (!candidates) return;
        int pick = (int)(emu_schedule_random() % (uint64_t)candidates);
        for (int d = 0; d < MAX_DEVICES; d++)
            for (stream *c = devices_streams[d]; c; c = c->next)
                if (unfinished(c) && !stuck(c) && pick-- == 0) run_stream(c, c->completed + 1, 1);
    }
}

// After an operation was queued on s: under EMU_SCHEDULE=eager, run it
// now (an operation that waits for another process stays queued); under
// random, maybe run something. Never from inside a running operation.
static void settle(stream *s) {
    emu_schedule_kind k = emu_schedule();
    if (k == EMU_SCHEDULE_LAZY || settling || emu_current_op()) return;
    if (k == EMU_SCHEDULE_RANDOM && emu_schedule_random() % 2) return; // (half the time, nothing runs)
    settling++;
    emu_device_access_begin();
    if (k == EMU_SCHEDULE_EAGER) run_stream(s, s->enqueued, 1 << 30);
    else random_steps();
    emu_device_access_end();
    settling--;
}

// ================================================================ the host waits

// The host waits: run until `target`, sleeping while queued work waits
// for another process. Called with the lock held once. On success the
// host knows what `known` (target's clock, or NULL) says happened before.
static cudaError_t wait_for(stream *s, uint64_t target, const char *call, const emu_clock *known) {
    if (s->capture) { // nothing has been queued to wait for: the host would wait forever
        char why[160];
        snprintf(why, sizeof why, "%s of a stream that is being captured", call);
        invalidate_capture(s, why);
        return emu_set_error(cudaErrorStreamCaptureUnsupported);
    }
    // A little later than the NCCL ops' own timeout, which names the missing rank.
    double start = emu_now(), limit = emu_timeout_s() + 2;
    long pause_ns = 20000;
    emu_device_access_begin();
    if (emu_schedule() == EMU_SCHEDULE_RANDOM && !settling) {
        settling++;
        random_steps();
        settling--;
    }
    for (;;) {
        emu_op_status r = run_stream(s, target, 1 << 30);
        if (r == EMU_OP_DONE) break;
        if (r == EMU_OP_FAILED) {
            emu_device_access_end();
            return failed(s, call);
        }
        if (emu_now() - start > limit) {
            const char *what = s->head ? s->head->what : "queued work";
            emu_device_access_end();
            emu_warn("%s waited %.0f s for %s, which waits for another process (a rank that never made the "
                     "matching call? EMU_TIMEOUT sets this limit)",
                     call, limit, what);
            return emu_set_error(cudaErrorLaunchTimeout);
        }
        emu_unlock();
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
        if (pause_ns < 200000) pause_ns *= 2;
        emu_lock();
    }
    emu_device_access_end();
    if (known) emu_clock_join(emu_host_clock(), known);
    return cudaSuccess;
}

static cudaError_t sync_device(int device, const char *call) {
    for (stream *c = devices_streams[device]; c; c = c->next)
        if (c->capture) return wait_for(c, c->enqueued, call, NULL); // (refused, and the capture invalidated)
    for (;;) {
        stream *pending = NULL;
        for (stream *s = devices_streams[device]; s && !pending; s = s->next)
            if (unfinished(s) || stuck(s)) pending = s;
        if (!pending) return cudaSuccess;
        if (stuck(pending)) return failed(pending, call);
        cudaError_t err = wait_for(pending, pending->enqueued, call, &pending->clock);
        if (err) return err;
        maybe_free(pending);
    }
}

cudaError_t emu_device_wait(int device, const char *call) {
    emu_lock();
    cudaError_t err = sync_device(device, call);
    emu_unlock();
    return err;
}

cudaError_t emu_stream_wait(cudaStream_t handle, uint64_t position, const char *call) {
    emu_lock();
    stream *s = resolve(handle);
    cudaError_t err = cudaErrorInvalidResourceHandle;
    if (s && position >= s->enqueued) err = wait_for(s, s->enqueued, call, &s->clock);
    else if (s) err = wait_for(s, position, call, NULL);
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}

// ================================================================ the stream API

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    if (!out || (flags & ~1u)) return emu_set_error(cudaErrorInvalidValue);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err) return err;
    emu_lock();
    *out = new_stream(emu_current_device(), false, flags & cudaStreamNonBlocking);
    emu_unlock();
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

// As in CUDA: destroying a stream with queued work returns at once; the
// work still runs (when the device is next synchronized, or something
// waits for it), then the stream is freed.
cudaError_t cudaStreamDestroy(cudaStream_t handle) {
    emu_lock();
    stream *s = handle && handle != cudaStreamLegacy && handle != cudaStreamPerThread ? resolve(handle) : NULL;
    if (!s) {
        emu_unlock();
        return emu_set_error(cudaErrorInvalidResourceHandle);
    }
    s->destroyed = true;
    maybe_free(s);
    emu_unlock();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
    emu_lock();
    stream *s = resolve(handle);
    cudaError_t err =
        s ? wait_for(s, s->enqueued, "cudaStreamSynchronize", &s->clock) : cudaErrorInvalidResourceHandle;
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}

// One step per call: a polling loop sees "not ready" as long as work was
// queued when it asked, and the work moves on as it polls.
// A query's answer: done, or run one more queued operation toward `target`
// and say "not ready".
static cudaError_t step_toward(stream *s, uint64_t target, const char *call, const emu_clock *known) {
    if (s->capture) return wait_for(s, target, call, known); // (refused, and the capture invalidated)
    if (s->completed >= target) {
        emu_clock_join(emu_host_clock(), known);
        return cudaSuccess;
    }
    if (stuck(s)) return failed(s, call);
    emu_device_access_begin();
    emu_op_status r = run_stream(s, target, 1);
    emu_device_access_end();
    return r == EMU_OP_FAILED ? failed(s, call) : cudaErrorNotReady;
}

cudaError_t cudaStreamQuery(cudaStream_t handle) {
    emu_lock();
    stream *s = resolve(handle);
    cudaError_t err = s ? step_toward(s, s->enqueued, "cudaStreamQuery", &s->clock)
                        : emu_set_error(cudaErrorInvalidResourceHandle);
    emu_unlock();
    return err;
}

cudaError_t cudaDeviceSynchronize(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err) return err;
    emu_lock();
    err = sync_device(emu_current_device(), "cudaDeviceSynchronize");
    emu_unlock();
    return err;
}

cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }

cudaError_t emu_stream_wait_for(emu_stream *s, uint64_t seq, const char *call, const emu_clock *known) {
    return wait_for(s, seq, call, known);
}

cudaError_t emu_stream_poll(emu_stream *s, uint64_t seq, const char *call, const emu_clock *known) {
    return step_toward(s, seq, call, known);
}
