// graph.c - CUDA graphs: a stream's work captured once, launched many times.
//
// A training step is a few hundred launches, and for a small model on a
// fast GPU the host's few microseconds per launch, not the GPU, can set the
// pace. A CUDA graph records the step's work once (stream capture:
// cudaStreamBeginCapture ... cudaStreamEndCapture), is made executable once
// (cudaGraphInstantiate), and then costs one call per step
// (cudaGraphLaunch). Its kernels keep the arguments they had when captured;
// cudaGraphExecUpdate gives an executable graph those of a newer capture of
// the same shape.
//
// In the emulator a captured stream hands its operations to the graph
// instead of queueing them (stream.c). A launch queues them again, in
// order, on the stream it is given, each as an operation of its own - so
// the schedules, the race checker and the host's waits see a replayed
// kernel as any other. One stream is captured at a time (no fork and join
// of streams through events inside a capture), and NCCL calls and copies
// from pageable host memory cannot be captured: the capture then fails,
// saying which call, and cudaStreamEndCapture returns
// cudaErrorStreamCaptureInvalidated. emu_launch_count() counts what the
// host launched - kernels and graphs, not what a graph replays.
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

#define GRAPH_MAGIC 0x47524150u
#define EXEC_MAGIC 0x47455845u

struct CUgraphExec_st {
    unsigned magic;
    emu_graph_node **nodes; // shared with the graph it was made from (counted)
    int count;
};

static unsigned long long graph_launches;

unsigned long long emu_launch_count(void) { return emu_kernel_launches() + graph_launches; }

static bool valid_graph(cudaGraph_t g) { return g && g->magic == GRAPH_MAGIC; }
static bool valid_exec(cudaGraphExec_t e) { return e && e->magic == EXEC_MAGIC; }

static void free_graph(cudaGraph_t g) {
    for (int i = 0; i < g->count; i++) emu_graph_node_release(g->nodes[i]);
    free(g->nodes);
    g->magic = 0;
    free(g);
}

// ================================================================ capture

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed) return emu_set_error(cudaErrorInvalidValue);
    cudaGraph_t g = calloc(1, sizeof *g);
    if (!g) return emu_set_error(cudaErrorMemoryAllocation);
    g->magic = GRAPH_MAGIC;
    cudaError_t err = emu_stream_begin_capture(stream, g);
    if (err) {
        free(g);
        if (err == cudaErrorStreamCaptureUnsupported)
            emu_warn("cudaStreamBeginCapture: the legacy default stream cannot be captured; capture a stream "
                     "made with cudaStreamCreate");
        if (err == cudaErrorIllegalState) emu_warn("cudaStreamBeginCapture: the stream is being captured already");
        return emu_set_error(err);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *out) {
    if (!out) return emu_set_error(cudaErrorInvalidValue);
    *out = NULL;
    bool failed = false;
    cudaGraph_t g = emu_stream_end_capture(stream, &failed);
    if (!g) {
        emu_warn("cudaStreamEndCapture: the stream is not being captured");
        return emu_set_error(cudaErrorIllegalState);
    }
    if (failed) { // the call that could not be captured was named when it was made
        emu_lock();
        free_graph(g);
        emu_unlock();
        return emu_set_error(cudaErrorStreamCaptureInvalidated);
    }
    *out = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status) {
    if (!status) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    bool known = emu_stream_of(stream) != NULL, failed = false;
    cudaGraph_t g = known ? emu_stream_capture(stream, &failed) : NULL;
    emu_unlock();
    if (!known) return emu_set_error(cudaErrorInvalidResourceHandle);
    *status = !g ? cudaStreamCaptureStatusNone : failed ? cudaStreamCaptureStatusInvalidated
                                                         : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *count) {
    if (!valid_graph(g) || !count) return emu_set_error(cudaErrorInvalidValue);
    if (nodes)
        for (size_t i = 0; i < *count && i < (size_t)g->count; i++) nodes[i] = (cudaGraphNode_t)g->nodes[i];
    *count = (size_t)g->count;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    if (!valid_graph(g)) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    free_graph(g);
    emu_unlock();
    return cudaSuccess;
}

// ================================================================ executable graphs

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
    (void)flags; // no flag changes what the emulator does
    if (!out || !valid_graph(g)) return emu_set_error(cudaErrorInvalidValue);
    cudaGraphExec_t e = calloc(1, sizeof *e);
    if (!e || !(e->nodes = malloc(sizeof *e->nodes * (size_t)(g->count ? g->count : 1)))) {
        free(e);
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    emu_lock();
    for (int i = 0; i < g->count; i++) (e->nodes[i] = g->nodes[i])->refs++;
    emu_unlock();
    e->count = g->count, e->magic = EXEC_MAGIC;
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
    return cudaGraphInstantiate(out, g, flags);
}

static emu_op_status run_node(void *state) {
    emu_graph_node *n = state;
    return n->fn(n->state);
}

static void release_node(void *state) { emu_graph_node_release(state); }

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t stream) {
    if (!valid_exec(e)) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    if (emu_stream_capture(stream, NULL)) {
        emu_unlock();
        emu_warn("cudaGraphLaunch: launching a graph into a stream capture is not emulated");
        return emu_set_error(cudaErrorStreamCaptureUnsupported);
    }
    for (int i = 0; i < e->count; i++) {
        emu_graph_node *n = e->nodes[i];
        n->refs++; // the queued operation's; released when it retires
        cudaError_t err = emu_stream_enqueue(stream, n->what, run_node, n, release_node, NULL, 0);
        if (err) {
            emu_unlock();
            return emu_set_error(err);
        }
    }
    graph_launches++;
    emu_unlock();
    return cudaSuccess;
}

// A newer capture of the same shape - as many operations, of the same
// kinds, the same kernels - replaces the executable graph's operations:
// new arguments, pointers and sizes; otherwise nothing changes.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    if (!valid_exec(e) || !valid_graph(g)) return emu_set_error(cudaErrorInvalidValue);
    cudaGraphExecUpdateResult result = cudaGraphExecUpdateSuccess;
    cudaGraphNode_t at = NULL;
    if (g->count != e->count) result = cudaGraphExecUpdateErrorTopologyChanged;
    for (int i = 0; i < g->count && result == cudaGraphExecUpdateSuccess; i++) {
        at = (cudaGraphNode_t)g->nodes[i];
        if (g->nodes[i]->fn != e->nodes[i]->fn) result = cudaGraphExecUpdateErrorNodeTypeChanged;
        else if (strcmp(g->nodes[i]->what, e->nodes[i]->what) != 0) result = cudaGraphExecUpdateErrorFunctionChanged;
    }
    if (info) {
        info->result = result;
        info->errorNode = result == cudaGraphExecUpdateSuccess ? NULL : at;
        info->errorFromNode = NULL;
    }
    if (result != cudaGraphExecUpdateSuccess) return emu_set_error(cudaErrorGraphExecUpdateFailure);
    emu_lock();
    for (int i = 0; i < g->count; i++) {
        g->nodes[i]->refs++;
        emu_graph_node_release(e->nodes[i]);
        e->nodes[i] = g->nodes[i];
    }
    emu_unlock();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    if (!valid_exec(e)) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    for (int i = 0; i < e->count; i++) emu_graph_node_release(e->nodes[i]);
    emu_unlock();
    free(e->nodes);
    e->magic = 0;
    free(e);
    return cudaSuccess;
}
