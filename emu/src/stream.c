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
#define EVENT_MAGIC 0x4556454eU
#define MAX_DEVICES 64

typedef struct CUstream_st stream;

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
    stream *next;         // the device's streams
};

struct CUevent_st {
    unsigned magic;
    unsigned flags;
    stream *on;           // the stream of the latest record, and its position there
    uint64_t seq;
    unsigned long long generation;
    emu_clock clock;      // the clock of that record
    double time;          // when the latest record ran (emulated time: host clock)
    bool recorded, destroyed;
    int refs;             // queued records that will write here, plus the owner
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
// after event e's latest record when e is given (cudaStreamWaitEvent).
static op *append(stream *s, const char *what, emu_op_fn fn, void *state, void (*free_state)(void *),
                  const struct CUevent_st *e) {
    op *o = calloc(1, sizeof *o);
    if (!o) emu_fatal("out of host memory queueing GPU work");
    o->what = what, o->fn = fn, o->state = state, o->free_state = free_state;
    o->serial = ++ops_queued;
    emu_clock_copy(&o->clock, &s->clock);
    emu_clock_join(&o->clock, emu_host_clock());
    add_implicit_dependencies(o, s);
    if (e) add_dependency(o, e->on, e->seq, &e->clock);
    o->seq = ++s->enqueued;
    emu_clock_set(&o->clock, s->id, o->seq);
    emu_clock_copy(&s->clock, &o->clock);
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    return o;
}

static void settle(stream *s);

cudaError_t emu_stream_enqueue(cudaStream_t handle, const char *what, emu_op_fn fn, void *state,
                               void (*free_state)(void *), uint64_t *position) {
    emu_lock();
    stream *s = resolve(handle);
    if (!s) {
        emu_unlock();
        if (free_state) free_state(state);
        return cudaErrorInvalidResourceHandle;
    }
    op *o = append(s, what, fn, state, free_state, NULL);
    if (position) *position = o->seq;
    settle(s);
    emu_unlock();
    return cudaSuccess;
}

void emu_op_fail_reason(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(fail_reason, sizeof fail_reason, fmt, args);
    va_end(args);
}

static emu_op_status done_at_once(void *state) {
    (void)state;
    return EMU_OP_DONE;
}

void emu_stream_discard_if(bool (*match)(void *state, void *owner), void *owner) {
    emu_lock();
    for (int d = 0; d < MAX_DEVICES; d++)
        for (stream *s = devices_streams[d]; s; s = s->next)
            for (op *o = s->head; o; o = o->next)
                if (o->fn != done_at_once && match(o->state, owner)) {
                    if (o->free_state) o->free_state(o->state);
                    o->fn = done_at_once, o->state = NULL, o->free_state = NULL;
                }
    emu_unlock();
}

// ================================================================ running

// Stopped at a failed op (not one that was discarded since).
static bool stuck(const stream *s) { return s->failed && s->head && s->head->fn != done_at_once; }

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
static emu_op_status run(stream *s, uint64_t target, int max_ops) {
    while (s->completed < target && max_ops-- > 0) {
        op *o = s->head;
        if (s->failed && o->fn != done_at_once) return EMU_OP_FAILED;
        s->failed = false; // the failed op was discarded (ncclCommAbort): the stream runs on
        for (int i = 0; i < o->dep_count; i++) {
            emu_op_status r = run(o->deps[i].on, o->deps[i].seq, 1 << 30);
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
                if (unfinished(c) && !stuck(c) && pick-- == 0) run(c, c->completed + 1, 1);
    }
}

// After an operation was queued on s: under EMU_SCHEDULE=eager, run it
// now (an operation that waits for another process stays queued); under
// random, maybe run something. Never from inside a running operation.
static void settle(stream *s) {
    emu_schedule_kind k = emu_schedule();
    if (k == EMU_SCHEDULE_LAZY || settling || emu_current_op()) return;
    settling++;
    emu_device_access_begin();
    if (k == EMU_SCHEDULE_EAGER) run(s, s->enqueued, 1 << 30);
    else random_steps();
    emu_device_access_end();
    settling--;
}

// ================================================================ the host waits

// The host waits: run until `target`, sleeping while queued work waits
// for another process. Called with the lock held once. On success the
// host knows what `known` (target's clock, or NULL) says happened before.
static cudaError_t wait_for(stream *s, uint64_t target, const char *call, const emu_clock *known) {
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
        emu_op_status r = run(s, target, 1 << 30);
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
    if (s->completed >= target) {
        emu_clock_join(emu_host_clock(), known);
        return cudaSuccess;
    }
    if (stuck(s)) return failed(s, call);
    emu_device_access_begin();
    emu_op_status r = run(s, target, 1);
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

// ================================================================ events

static struct CUevent_st *event_of(cudaEvent_t e) {
    return e && e->magic == EVENT_MAGIC && !e->destroyed ? e : NULL;
}

static void event_release(struct CUevent_st *e) {
    if (--e->refs > 0) return;
    if (e->on) {
        e->on->refs--;
        maybe_free(e->on);
    }
    e->magic = 0;
    emu_clock_free(&e->clock);
    free(e);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
    if (!out || (flags & ~7u)) return emu_set_error(cudaErrorInvalidValue);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err) return err;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return emu_set_error(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC, e->flags = flags, e->refs = 1;
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t handle) {
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    if (!e) {
        emu_unlock();
        return emu_set_error(cudaErrorInvalidResourceHandle);
    }
    e->destroyed = true;
    event_release(e);
    emu_unlock();
    return cudaSuccess;
}

typedef struct {
    struct CUevent_st *event;
    unsigned long long generation;
} record_state;

static emu_op_status run_record(void *state) {
    record_state *r = (record_state *)state;
    if (r->generation == r->event->generation) r->event->time = emu_now();
    return EMU_OP_DONE;
}

static void free_record(void *state) {
    record_state *r = (record_state *)state;
    event_release(r->event);
    free(r);
}

cudaError_t cudaEventRecord(cudaEvent_t handle, cudaStream_t stream_handle) {
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    stream *s = resolve(stream_handle);
    if (!e || !s) {
        emu_unlock();
        return emu_set_error(cudaErrorInvalidResourceHandle);
    }
    record_state *r = malloc(sizeof *r);
    if (!r) emu_fatal("out of host memory recording an event");
    r->event = e, r->generation = ++e->generation;
    e->refs++;
    op *o = append(s, "cudaEventRecord", run_record, r, free_record, NULL);
    if (e->on) {
        e->on->refs--;
        maybe_free(e->on);
    }
    e->on = s, e->seq = o->seq, e->recorded = true;
    emu_clock_copy(&e->clock, &o->clock);
    s->refs++;
    settle(s);
    emu_unlock();
    return cudaSuccess;
}

// A later operation on `stream` waits for the event's latest record as it
// is now (CUDA semantics: a record made after this call does not count).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream_handle, cudaEvent_t handle, unsigned int flags) {
    if (flags != 0) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    stream *s = resolve(stream_handle);
    if (!e || !s) {
        emu_unlock();
        return emu_set_error(cudaErrorInvalidResourceHandle);
    }
    if (e->recorded) {
        append(s, "cudaStreamWaitEvent", done_at_once, NULL, NULL, e);
        settle(s);
    }
    emu_unlock();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t handle) {
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    cudaError_t err = cudaSuccess;
    if (!e) err = emu_set_error(cudaErrorInvalidResourceHandle);
    else if (e->recorded) err = step_toward(e->on, e->seq, "cudaEventQuery", &e->clock);
    emu_unlock();
    return err;
}

cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    cudaError_t err = cudaSuccess;
    if (!e) err = emu_set_error(cudaErrorInvalidResourceHandle);
    else if (e->recorded) err = wait_for(e->on, e->seq, "cudaEventSynchronize", &e->clock);
    emu_unlock();
    return err;
}

// Emulated time: the host clock when each record ran. It measures the
// emulator, not a GPU, and says nothing about a GPU's speed.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    struct CUevent_st *a = event_of(start), *b = event_of(end);
    cudaError_t err = cudaSuccess;
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        err = cudaErrorInvalidResourceHandle;
    else if (!a->recorded || !b->recorded || a->on->completed < a->seq || b->on->completed < b->seq)
        err = cudaErrorNotReady;
    else
        *ms = (float)((b->time - a->time) * 1000.0);
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}
