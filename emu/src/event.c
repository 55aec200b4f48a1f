// event.c - events: marks in a stream that the host and other streams wait for.
//
// cudaEventRecord queues a mark; cudaStreamWaitEvent makes a later
// operation of another stream wait for the latest mark (as it is when
// the wait is queued: a later record does not count); cudaEventSynchronize
// and cudaEventQuery are the host's waits. On the emulated GPU a mark runs
// when its stream gets there, like any queued work (stream.c), and its
// vector clock is what a stream that waits for it comes after (order.c).
// Inside a stream capture (graph.c), a record becomes a node of the graph.
#include <stdlib.h>

#include "emu_internal.h"

#define EVENT_MAGIC 0x4556454eU

struct CUevent_st {
    unsigned magic;
    unsigned flags;
    emu_stream *on;       // the stream of the latest record, and its position there
    uint64_t seq;
    emu_clock clock;      // the clock of that record
    struct CUgraph_st *captured; // the latest record went into this graph's capture instead
    unsigned long long generation;
    double time;          // when the latest record ran (emulated time: host clock)
    bool recorded, destroyed;
    int refs;             // queued records that will write here, plus the owner
};


static struct CUevent_st *event_of(cudaEvent_t e) {
    return e && e->magic == EVENT_MAGIC && !e->destroyed ? e : NULL;
}

static void event_release(struct CUevent_st *e) {
    if (--e->refs > 0) return;
    if (e->on) emu_stream_release(e->on);
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

// A record captured in a graph marks the time of every replay.
static emu_op_status run_captured_record(void *state) {
    ((struct CUevent_st *)state)->time = emu_now();
    return EMU_OP_DONE;
}

static void free_captured_record(void *state) {
    emu_lock();
    event_release((struct CUevent_st *)state);
    emu_unlock();
}

// With the lock taken: the event and the stream (false, the lock released
// and the error set, if either is not valid) and the stream's capture.
static bool event_and_stream(cudaEvent_t handle, cudaStream_t stream_handle, struct CUevent_st **e, emu_stream **s,
                             struct CUgraph_st **g) {
    emu_lock();
    *e = event_of(handle), *s = emu_stream_of(stream_handle);
    if (!*e || !*s) {
        emu_unlock();
        emu_set_error(cudaErrorInvalidResourceHandle);
        return false;
    }
    *g = emu_stream_capture(stream_handle, NULL);
    return true;
}

cudaError_t cudaEventRecord(cudaEvent_t handle, cudaStream_t stream_handle) {
    struct CUevent_st *e;
    emu_stream *s;
    struct CUgraph_st *g;
    if (!event_and_stream(handle, stream_handle, &e, &s, &g)) return cudaErrorInvalidResourceHandle;
    if (g) {
        e->refs++;
        cudaError_t err = emu_stream_enqueue(stream_handle, "cudaEventRecord", run_captured_record, e,
                                             free_captured_record, NULL, EMU_OP_REPLAYABLE);
        if (!err) e->captured = g, e->recorded = true;
        emu_unlock();
        return err ? emu_set_error(err) : cudaSuccess;
    }
    record_state *r = malloc(sizeof *r);
    if (!r) emu_fatal("out of host memory recording an event");
    r->event = e, r->generation = ++e->generation;
    e->refs++;
    emu_stream_hold(s); // before the previous record's stream is let go: it may be the same
    if (e->on) emu_stream_release(e->on);
    e->seq = emu_stream_append(s, "cudaEventRecord", run_record, r, free_record, NULL, 0, NULL, &e->clock);
    e->on = s, e->recorded = true, e->captured = NULL;
    emu_unlock();
    return cudaSuccess;
}

// A later operation on `stream` waits for the event's latest record as it
// is now (CUDA semantics: a record made after this call does not count).
// Within a capture, a record made in the same capture is already ordered
// (the emulator captures one stream at a time); other waits that cross the
// capture's edge are refused.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream_handle, cudaEvent_t handle, unsigned int flags) {
    if (flags != 0) return emu_set_error(cudaErrorInvalidValue);
    struct CUevent_st *e;
    emu_stream *s;
    struct CUgraph_st *g;
    if (!event_and_stream(handle, stream_handle, &e, &s, &g)) return cudaErrorInvalidResourceHandle;
    cudaError_t err = cudaSuccess;
    if (e->captured && g != e->captured) {
        emu_warn("cudaStreamWaitEvent: the event was recorded in a stream capture, and this stream is not that "
                 "capture's (capturing several streams into one graph is not emulated)");
        err = cudaErrorStreamCaptureUnsupported;
    } else if (g && !e->captured && e->recorded) {
        emu_warn("cudaStreamWaitEvent: a captured stream waits for an event recorded outside the capture");
        err = cudaErrorStreamCaptureIsolation;
    } else if (e->recorded && !g) {
        emu_stream_append(s, "cudaStreamWaitEvent", emu_done_at_once, NULL, NULL, e->on, e->seq, &e->clock, NULL);
    }
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}

// The host's two waits for an event: a step and an answer, or to the end.
static cudaError_t wait_for_event(cudaEvent_t handle, bool block) {
    emu_lock();
    struct CUevent_st *e = event_of(handle);
    cudaError_t err = cudaSuccess;
    if (!e) err = emu_set_error(cudaErrorInvalidResourceHandle);
    else if (e->captured) err = emu_set_error(cudaErrorStreamCaptureUnsupported);
    else if (e->recorded && block) err = emu_stream_wait_for(e->on, e->seq, "cudaEventSynchronize", &e->clock);
    else if (e->recorded) err = emu_stream_poll(e->on, e->seq, "cudaEventQuery", &e->clock);
    emu_unlock();
    return err;
}

cudaError_t cudaEventQuery(cudaEvent_t handle) { return wait_for_event(handle, false); }

cudaError_t cudaEventSynchronize(cudaEvent_t handle) { return wait_for_event(handle, true); }

// Emulated time: the host clock when each record ran. It measures the
// emulator, not a GPU, and says nothing about a GPU's speed.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    struct CUevent_st *a = event_of(start), *b = event_of(end);
    cudaError_t err = cudaSuccess;
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming))
        err = cudaErrorInvalidResourceHandle;
    else if (!a->recorded || !b->recorded || !a->on || !b->on || !emu_stream_reached(a->on, a->seq) ||
             !emu_stream_reached(b->on, b->seq))
        err = cudaErrorNotReady;
    else
        *ms = (float)((b->time - a->time) * 1000.0);
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}
