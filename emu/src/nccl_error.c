// nccl_error.c - the emulated NCCL's messages, errors and names.
//
// Real NCCL says little when a program misuses it: it hangs, or returns
// ncclInvalidUsage and leaves the why to NCCL_DEBUG=WARN. The emulator
// says what went wrong in a sentence that names the call and the ranks,
// prints it (with the rank), and keeps it for ncclGetLastError. An error
// of a communicator is also published in the shared segment, so that the
// other ranks, instead of waiting for their timeout, say why they stop.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"

// ================================================================ messages and errors

static char last_error[EMU_NCCL_ERROR_BYTES];

void emu_nccl_set_last_error(const char *text) { snprintf(last_error, sizeof last_error, "%s", text); }

void emu_nccl_appendf(char *buf, size_t size, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= size) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf + len, size - len, fmt, args);
    va_end(args);
}

// Copies as much of src as fits, cutting it short if need be.
static void copy_text(char *dst, size_t size, const char *src) {
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

// Every message starts "emulated NCCL: "; this is the rest, for quoting one
// message inside another.
const char *emu_nccl_without_prefix(const char *text) {
    return strncmp(text, "emulated NCCL: ", 15) == 0 ? text + 15 : text;
}

static void print_error(const struct ncclComm *comm, const char *text) {
    const char *body = emu_nccl_without_prefix(text);
    if (comm && comm->rank >= 0)
        fprintf(stderr, "emulated NCCL (rank %d): %s\n", comm->rank, body);
    else
        fprintf(stderr, "emulated NCCL: %s\n", body);
    fflush(stderr);
}

ncclResult_t emu_nccl_call_error(const struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    char text[EMU_NCCL_ERROR_BYTES] = "emulated NCCL: ";
    va_list args;
    va_start(args, fmt);
    vsnprintf(text + strlen(text), sizeof text - strlen(text), fmt, args);
    va_end(args);
    emu_nccl_set_last_error(text);
    print_error(comm, text);
    return code;
}

void emu_nccl_comm_fail(struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    if (comm->error != ncclSuccess) return;   // the first failure is the one that matters
    char text[EMU_NCCL_ERROR_BYTES] = "emulated NCCL: ";
    va_list args;
    va_start(args, fmt);
    vsnprintf(text + strlen(text), sizeof text - strlen(text), fmt, args);
    va_end(args);
    comm->error = code;
    snprintf(comm->error_text, sizeof comm->error_text, "%s", text);
    emu_nccl_set_last_error(text);
    print_error(comm, text);
    if (comm->registered) {
        emu_nccl_rank *me = &comm->ranks[comm->rank];
        copy_text(me->error, sizeof me->error, emu_nccl_without_prefix(text));
        int32_t joined = RANK_JOINED;
        atomic_compare_exchange_strong_explicit(&me->state, &joined, RANK_FAILED,
                                                memory_order_release, memory_order_relaxed);
    }
}

void *emu_nccl_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) emu_fatal("emulated NCCL: out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *emu_nccl_realloc(void *p, size_t bytes) {
    p = realloc(p, bytes);
    if (!p) emu_fatal("emulated NCCL: out of memory (%zu bytes)", bytes);
    return p;
}

// ================================================================ names, for messages

static const char *type_name(int t) {
    static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                  "uint64",  "float16", "float32", "float64", "bfloat16"};
    return t >= 0 && t <= ncclBfloat16 ? names[t] : "?";
}

static const char *reduction_name(int op) {
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op <= ncclAvg ? names[op] : op < ncclNumOps + EMU_NCCL_PREMUL_OPS ? "premulsum" : "?";
}

const char *emu_nccl_kind_name(int kind) {
    static const char *names[] = {"ncclAllReduce", "ncclBroadcast",     "ncclReduce", "ncclAllGather",
                                  "ncclReduceScatter", "ncclSend", "ncclRecv"};
    return kind >= 0 && kind <= KIND_RECV ? names[kind] : "?";
}

bool emu_nccl_kind_reduces(int kind) {
    return kind == KIND_ALL_REDUCE || kind == KIND_REDUCE || kind == KIND_REDUCE_SCATTER;
}

bool emu_nccl_kind_has_root(int kind) { return kind == KIND_BROADCAST || kind == KIND_REDUCE; }

void emu_nccl_describe_call(char *buf, size_t size, int kind, uint64_t count, int dtype, int op, int root) {
    switch (kind) {
    case KIND_ALL_REDUCE:
        snprintf(buf, size, "ncclAllReduce(count %llu, %s, %s)", (unsigned long long)count,
                 type_name(dtype), reduction_name(op));
        break;
    case KIND_BROADCAST:
        snprintf(buf, size, "ncclBroadcast(count %llu, %s, root %d)", (unsigned long long)count,
                 type_name(dtype), root);
        break;
    case KIND_REDUCE:
        snprintf(buf, size, "ncclReduce(count %llu, %s, %s, root %d)", (unsigned long long)count,
                 type_name(dtype), reduction_name(op), root);
        break;
    case KIND_ALL_GATHER:
        snprintf(buf, size, "ncclAllGather(sendcount %llu, %s)", (unsigned long long)count,
                 type_name(dtype));
        break;
    case KIND_REDUCE_SCATTER:
        snprintf(buf, size, "ncclReduceScatter(recvcount %llu, %s, %s)", (unsigned long long)count,
                 type_name(dtype), reduction_name(op));
        break;
    default:
        snprintf(buf, size, "%s(count %llu, %s, peer %d)", emu_nccl_kind_name(kind), (unsigned long long)count,
                 type_name(dtype), root);
        break;
    }
}

void emu_nccl_describe_part(char *buf, size_t size, const struct ncclComm *comm, const emu_nccl_part *p) {
    char call[160];
    if (p->kind == KIND_SEND || p->kind == KIND_RECV) {
        emu_nccl_describe_call(call, sizeof call, p->kind, p->count, p->dtype, -1, p->peer);
        int from = p->kind == KIND_SEND ? comm->rank : p->peer;
        int to = p->kind == KIND_SEND ? p->peer : comm->rank;
        snprintf(buf, size, "%s, message #%llu from rank %d to rank %d", call,
                 (unsigned long long)p->seq, from, to);
    } else {
        emu_nccl_describe_call(call, sizeof call, p->kind, p->count, p->dtype, p->op, p->root);
        snprintf(buf, size, "collective #%llu %s", (unsigned long long)p->seq, call);
    }
}

// ================================================================ the API: versions, errors

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;   // as in NCCL: the last error of this process, whichever communicator
    return last_error;
}

// ================================================================ the checks every call makes first

ncclResult_t emu_nccl_check_comm(const char *api, const struct ncclComm *comm) {
    if (!comm) return emu_nccl_call_error(NULL, ncclInvalidArgument, "%s: comm is NULL", api);
    if (comm->magic != EMU_NCCL_COMM_MAGIC)
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "%s: comm is not a live communicator "
                                   "(destroyed already, or never initialised?)", api);
    if (comm->call_in_progress)
        return emu_nccl_call_error(comm, ncclInvalidUsage, "called %s while the communicator's previous call "
                                   "(%s) is still in progress (poll ncclCommGetAsyncError until it is not "
                                   "ncclInProgress)", api, comm->call_in_progress);
    return ncclSuccess;
}

ncclResult_t emu_nccl_check_comm_for_work(const char *api, const struct ncclComm *comm) {
    ncclResult_t res = emu_nccl_check_comm(api, comm);
    if (res != ncclSuccess) return res;
    if (comm->finalizing)
        return emu_nccl_call_error(comm, ncclInvalidUsage, "%s called after ncclCommFinalize", api);
    if (comm->error != ncclSuccess)
        return emu_nccl_call_error(comm, comm->error, "%s: the communicator failed earlier: %s", api,
                                   emu_nccl_without_prefix(comm->error_text));
    return ncclSuccess;
}
