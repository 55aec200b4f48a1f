// nccl.c - the emulated NCCL: communicators between processes, in shared memory.
//
// What NCCL does. Each rank of a job is a process (or thread) driving one
// GPU. NCCL moves data between the GPUs' memories: collectives (all-reduce,
// broadcast, ...) that every rank calls, and point-to-point sends and
// receives. Real NCCL, at ncclCommInitRank, connects the ranks through a TCP
// "bootstrap" (the unique id holds the root's address), discovers how the
// GPUs are wired (NVLink, PCIe, InfiniBand), builds rings and trees over
// those links, and then runs every operation as a CUDA kernel that pipelines
// the data around the ring in chunks, on many channels at once. It trusts
// the program: if two ranks call different collectives, NCCL hangs or
// returns wrong numbers, and nothing says why.
//
// What the emulator does. The ranks are processes on one machine and the
// emulated GPU's memory is ordinary process memory, so the ranks meet in a
// POSIX shared-memory segment (shm_open) that each of them maps; the unique
// id carries its name. The segment holds:
//
//   header    who set it up, how many ranks, errors during the join
//   ranks[]   per rank: pid, device, state, barrier counter, and the
//             descriptors of its collectives (below)
//   channels  per ordered pair (sender, receiver): a 64 KiB ring buffer
//             with byte counters, for ncclSend/ncclRecv
//   slots[]   per rank: 256 KiB through which collectives move data
//
// Why chunks: /dev/shm is small (64 MiB in a Docker container), so the
// segment stays a few MiB whatever the message size. A collective moves its
// data in rounds ("chunks") of at most one slot: every rank copies its part
// of the chunk into its own slot, waits at a barrier until everybody has,
// computes its own result from all the slots in rank order, and waits at a
// second barrier so that no slot is overwritten while someone still reads
// it. Real NCCL also pipelines chunks, but around a ring (2(N-1) steps of
// 1/N of the data each); "everybody reads every slot" copies more, is much
// easier to follow, and - because every rank adds in rank order - gives
// bit-identical results on every rank.
//
// Why descriptors: before moving any data each rank publishes what it was
// asked to do ("collective #7: ncclAllReduce, 1024 float32, sum") and
// compares it with the others'. A mismatch, which real NCCL turns into a
// hang or garbage, becomes an error that names each rank's call; a rank that
// never arrives becomes a timeout that names it.
//
// Why a state machine: the emulated GPU runs queued work as late as it can
// (when the program waits for the stream), and one process must never sit
// inside the stream runner waiting for another. So each operation is
// resumable: it remembers its phase and chunk, makes what progress it can,
// and returns "pending" when it must wait for a peer; the runner calls it
// again later.
//
// Sends and receives: each (sender, receiver) pair has a ring. The sender
// describes message #k (count, type), writes bytes while there is room,
// and is done when the receiver has taken them all - NCCL, too, buffers
// nothing beyond its channel, which is why an exchange where both ranks
// send first needs ncclGroupStart/End: the group's parts progress together.
//
// Faults: a rank that fails, aborts or leaves says so in its record, and a
// waiting rank also checks (every 50 ms) that its peer's process still
// exists. Either way the wait ends in an error that names the rank, and any
// other wait ends after EMU_TIMEOUT seconds with a message saying how far
// each missing rank got. Real NCCL would wait forever; its users run a
// watchdog (ncclCommGetAsyncError, a deadline, ncclCommAbort) for that.
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"
#include "nccl.h"

enum {
    SLOT_BYTES = 256 * 1024,   // per rank: one chunk of a collective
    RINGS_BYTES = 16 << 20,    // all rings together: send/recv in flight, per ordered pair of ranks
    RING_MAX_BYTES = 1 << 20,  // one pair's ring, at most (2-4 ranks; 256 KiB with 8)
    ERROR_BYTES = 1024,
};

#define ID_MAGIC "course-emu-nccl"          // first bytes of every ncclUniqueId we make
#define SEGMENT_MAGIC "emu-nccl-shm-1"       // first bytes of the shared header
#define COMM_MAGIC 0x4e43434cu               // marks a live struct ncclComm
#define PID_CHECK_INTERVAL_S 0.05            // how often a waiting rank asks "is my peer alive?"

// ================================================================ the unique id

// What the 128 bytes of an ncclUniqueId hold.
typedef struct {
    char magic[16];
    char name[96];   // of the shared-memory segment, "/course-emu-nccl-..."
} id_contents;

_Static_assert(sizeof(id_contents) <= NCCL_UNIQUE_ID_BYTES, "the id must fit an ncclUniqueId");

// ================================================================ the shared segment
//
// Everything below lives in memory that several processes map. Fields that
// one rank writes and others read are atomics: the writer fills in data,
// then stores a counter with release order; a reader loads the counter with
// acquire order and may then read the data.

// What collective #seq asked of one rank.
typedef struct {
    _Atomic uint64_t seq;   // the collective this describes; 0: none yet
    int32_t kind;
    int32_t dtype;
    int32_t op;             // -1 where the collective has no reduction
    int32_t root;           // -1 where the collective has no root
    uint64_t count;
} shm_descriptor;

enum rank_state { RANK_ABSENT, RANK_JOINED, RANK_FAILED, RANK_ABORTED, RANK_LEFT };

typedef struct {
    _Alignas(64) _Atomic int32_t pid;   // claimed with compare-and-swap; 0: nobody yet
    int32_t device;                     // physical emulated device
    _Atomic int32_t state;              // enum rank_state
    _Atomic int32_t last_kind;          // kind of the last collective finished here
    _Atomic uint64_t issued;            // collectives the program has called (for messages)
    _Atomic uint64_t completed;         // collectives finished
    _Atomic uint64_t arrived;           // barriers this rank has arrived at, ever
    shm_descriptor desc[2];             // collective k is described in desc[k % 2]
    char error[256];                    // why it failed (state RANK_FAILED)
} shm_rank;

typedef struct {
    _Alignas(64) _Atomic uint64_t send_issued;   // ncclSend calls to this receiver (for messages)
    _Atomic uint64_t recv_issued;                // ncclRecv calls from this sender (for messages)
    _Atomic uint64_t send_posted;   // the message the sender describes next:
    uint64_t send_count;
    int32_t send_dtype;
    _Atomic uint64_t rejected;      // a message the receiver found mismatched, with
    uint64_t recv_count;            // what the receiver expected
    int32_t recv_dtype;
    _Atomic uint64_t acked;         // messages the receiver has taken completely
    _Alignas(64) _Atomic uint64_t written;   // bytes ever put into the ring
    _Alignas(64) _Atomic uint64_t read;      // bytes ever taken out
} shm_channel;

enum { SETUP_NONE, SETUP_BUSY, SETUP_DONE };
enum { INIT_OK, INIT_WRITING_ERROR, INIT_FAILED };

typedef struct {
    _Atomic uint32_t setup;        // SETUP_*: exactly one rank fills in the header
    char magic[16];
    int32_t nranks;
    _Atomic int32_t joined;        // ranks registered so far
    _Atomic int32_t init_state;    // INIT_*: a rank that finds the join broken says why here
    int32_t init_error_code;
    char init_error[512];
} shm_header;

// Where each part starts, for a given number of ranks.
typedef struct {
    size_t ranks, channels, rings, slots, total;
    size_t ring_bytes; // each pair's ring
} shm_layout;

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static shm_layout layout_for(int nranks) {
    size_t n = (size_t)nranks, page = 4096;
    shm_layout l;
    l.ranks = round_up(sizeof(shm_header), page);
    l.channels = round_up(l.ranks + n * sizeof(shm_rank), page);
    l.rings = round_up(l.channels + n * n * sizeof(shm_channel), page);
    // Big rings move big messages in few rounds; their sum stays within a
    // budget that a 64 MiB /dev/shm (a Docker container's) can hold.
    l.ring_bytes = RING_MAX_BYTES;
    while (l.ring_bytes > 4096 && n * n * l.ring_bytes > RINGS_BYTES) l.ring_bytes /= 2;
    l.slots = l.rings + n * n * l.ring_bytes;
    l.total = l.slots + n * SLOT_BYTES;
    return l;
}

// ================================================================ this process's side

enum kind {
    KIND_ALL_REDUCE,
    KIND_BROADCAST,
    KIND_REDUCE,
    KIND_ALL_GATHER,
    KIND_REDUCE_SCATTER,
    KIND_SEND,
    KIND_RECV,
};

static const char *kind_name(int kind) {
    static const char *names[] = {"ncclAllReduce", "ncclBroadcast",     "ncclReduce", "ncclAllGather",
                                  "ncclReduceScatter", "ncclSend", "ncclRecv"};
    return kind >= 0 && kind <= KIND_RECV ? names[kind] : "?";
}

static bool kind_reduces(int kind) {
    return kind == KIND_ALL_REDUCE || kind == KIND_REDUCE || kind == KIND_REDUCE_SCATTER;
}

static bool kind_has_root(int kind) { return kind == KIND_BROADCAST || kind == KIND_REDUCE; }

// Phases of the state machines. A collective: wait for its turn among this
// rank's collectives, publish the descriptor, agree, then per chunk fill /
// wait / take the result / wait. A send: wait its turn on the channel,
// describe, write, wait for the receiver's acknowledgement. A receive: wait
// its turn, match the sender's description, read.
enum phase {
    COLL_TURN, COLL_AGREE, COLL_FILL, COLL_FILLED, COLL_DRAINED, COLL_FINISH,
    SEND_TURN, SEND_WRITE, SEND_ACK,
    RECV_TURN, RECV_MATCH, RECV_READ,
};

typedef enum { PART_DONE, PART_PENDING, PART_FAILED } part_status;

// One call: a collective, a send or a receive. A group's calls become the
// parts of one queued operation.
typedef struct {
    int kind;
    const void *send;
    void *recv;
    size_t count;               // elements, as the program passed them
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;                   // collectives with a root
    int peer;                   // send/recv
    uint64_t seq;               // collective #seq of the comm, or message #seq on the channel
    // progress
    int phase;
    size_t chunk, nchunks, chunk_elems;
    uint64_t barrier;           // the barrier this rank waits at
    size_t moved;               // send/recv: bytes so far
    bool done, progressed;
    bool loss_seen;             // a peer looked lost once (see peer_is_lost)
    double stalled_since;       // last time it moved forward (for the timeout)
    double last_pid_check;
} part;

// What is queued on a stream: one or more parts of one communicator.
typedef struct queued_op {
    struct ncclComm *comm;      // NULL once the comm is gone (then only free_op may run)
    cudaStream_t stream;
    bool started, finished;
    int nparts;
    part *parts;
    struct queued_op *next, *prev;   // the comm's list of ops the stream still holds
} queued_op;

enum join_stage { JOIN_SETUP, JOIN_REGISTER, JOIN_WAIT_ALL, JOIN_DONE };

struct ncclComm {
    uint32_t magic;
    int rank, nranks;
    int device;                 // as cudaSetDevice numbers it
    int physical_device;        // before CUDA_VISIBLE_DEVICES: what "duplicate GPU" compares
    bool blocking;

    // the shared segment
    char shm_name[96];
    int fd;
    void *base;
    size_t bytes;
    shm_header *header;
    shm_rank *ranks;
    shm_channel *channels;
    unsigned char *rings, *slots;
    size_t ring_bytes;

    // joining
    int join_stage;
    bool registered, unlinked;
    double join_started, last_pid_check;

    // the state the API reports
    const char *call_in_progress;   // non-blocking: the call that returned ncclInProgress
    bool finalizing, finalized;
    ncclResult_t error;             // sticky: the first failure
    char error_text[ERROR_BYTES];

    // sequence numbers: given out at call time, completed by the queued ops
    uint64_t collectives_issued, collectives_done, barriers;
    uint64_t *sends_issued, *sends_done;   // per peer
    uint64_t *recvs_issued, *recvs_done;

    queued_op *ops;                 // queued, not yet freed by the stream
    int ops_unfinished;
    void *scratch;                  // where reductions accumulate
};

// ================================================================ messages and errors

static char last_error[ERROR_BYTES];

__attribute__((format(printf, 3, 4)))
static void appendf(char *buf, size_t size, const char *fmt, ...) {
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
static const char *without_prefix(const char *text) {
    return strncmp(text, "emulated NCCL: ", 15) == 0 ? text + 15 : text;
}

static void print_error(const struct ncclComm *comm, const char *text) {
    const char *body = without_prefix(text);
    if (comm && comm->rank >= 0)
        fprintf(stderr, "emulated NCCL (rank %d): %s\n", comm->rank, body);
    else
        fprintf(stderr, "emulated NCCL: %s\n", body);
    fflush(stderr);
}

// An error found while the program calls us: remembered for ncclGetLastError,
// printed, returned.
__attribute__((format(printf, 3, 4)))
static ncclResult_t call_error(const struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    char text[ERROR_BYTES] = "emulated NCCL: ";
    va_list args;
    va_start(args, fmt);
    vsnprintf(text + strlen(text), sizeof text - strlen(text), fmt, args);
    va_end(args);
    snprintf(last_error, sizeof last_error, "%s", text);
    print_error(comm, text);
    return code;
}

// An error of the communicator itself (found by a queued operation, or by a
// non-blocking join): sticky, printed once, and published in the segment so
// that peers waiting for this rank learn why it stopped.
__attribute__((format(printf, 3, 4)))
static void comm_fail(struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    if (comm->error != ncclSuccess) return;   // the first failure is the one that matters
    char text[ERROR_BYTES] = "emulated NCCL: ";
    va_list args;
    va_start(args, fmt);
    vsnprintf(text + strlen(text), sizeof text - strlen(text), fmt, args);
    va_end(args);
    comm->error = code;
    snprintf(comm->error_text, sizeof comm->error_text, "%s", text);
    snprintf(last_error, sizeof last_error, "%s", text);
    print_error(comm, text);
    if (comm->registered) {
        shm_rank *me = &comm->ranks[comm->rank];
        copy_text(me->error, sizeof me->error, without_prefix(text));
        int32_t joined = RANK_JOINED;
        atomic_compare_exchange_strong_explicit(&me->state, &joined, RANK_FAILED,
                                                memory_order_release, memory_order_relaxed);
    }
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) emu_fatal("emulated NCCL: out of memory (%zu x %zu bytes)", n, size);
    return p;
}

static void *xrealloc(void *p, size_t bytes) {
    p = realloc(p, bytes);
    if (!p) emu_fatal("emulated NCCL: out of memory (%zu bytes)", bytes);
    return p;
}

// ================================================================ data types

static size_t dtype_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static const char *dtype_name(int t) {
    static const char *names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                  "uint64",  "float16", "float32", "float64", "bfloat16"};
    return t >= 0 && t <= ncclBfloat16 ? names[t] : "?";
}

static const char *op_name(int op) {
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return op >= 0 && op <= ncclAvg ? names[op] : "?";
}

// bfloat16 is the upper half of a float32. Rounding to nearest, ties to
// even, as GPUs do; every NaN becomes the canonical 0x7FFF.
static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

// IEEE half: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {                  // zero or subnormal: mantissa * 2^-24, exact in float
        float f = (float)mantissa * 0x1p-24f;
        return (h & 0x8000u) ? -f : f;
    }
    if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13);   // inf, NaN
    else bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Keeps `value`'s top bits after dropping `shift` low bits, rounding to
// nearest with ties to even.
static uint32_t shift_round_even(uint32_t value, unsigned shift) {
    uint32_t kept = value >> shift, dropped = value & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (dropped > half || (dropped == half && (kept & 1u))) kept++;
    return kept;
}

static uint16_t float_to_half(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return 0x7fff;                        // NaN
    if (magnitude >= 0x47800000u) return sign | 0x7c00;                // >= 65536: infinity
    uint32_t exponent = magnitude >> 23, mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    if (magnitude < 0x38800000u) {                                     // below 2^-14: subnormal half
        unsigned shift = 126 - exponent;                               // mantissa * 2^-shift, in 2^-24 units
        if (exponent == 0 || shift > 24) return sign;                  // rounds to zero
        return sign | (uint16_t)shift_round_even(mantissa, shift);
    }
    // A normal half; a carry out of the mantissa moves into the exponent,
    // up to infinity (0x7c00), which is right.
    uint32_t half = ((exponent - 112) << 10) | ((magnitude & 0x7fffffu) >> 13);
    uint32_t dropped = magnitude & 0x1fffu;
    if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) half++;
    return sign | (uint16_t)half;
}

// ================================================================ reductions
//
// A reduction runs in three steps over n elements: copy rank 0's values into
// an accumulator, combine rank 1's, rank 2's, ... in rank order, then write
// the result (dividing by nranks for ncclAvg). 16-bit floats accumulate in
// float and are rounded once, at the end. Signed integers add and multiply
// as unsigned numbers, which wrap around like two's complement (signed
// overflow is undefined behaviour in C).

#define SAME(x) (x)
#define ADD_PLAIN(a, b) ((a) + (b))
#define MUL_PLAIN(a, b) ((a) * (b))
#define ADD_U8(a, b) ((int8_t)(uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define MUL_U8(a, b) ((int8_t)(uint8_t)((uint8_t)(a) * (uint8_t)(b)))
#define ADD_U32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define MUL_U32(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define ADD_U64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define MUL_U64(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

#define DEFINE_REDUCTION(NAME, ACC, IN, TO_ACC, FROM_ACC, ADD, MUL)                       \
    static void NAME##_first(void *acc_, const void *in_, size_t n) {                     \
        ACC *acc = acc_;                                                                  \
        const IN *in = in_;                                                               \
        for (size_t i = 0; i < n; i++) acc[i] = TO_ACC(in[i]);                            \
    }                                                                                     \
    static void NAME##_combine(void *acc_, const void *in_, size_t n, ncclRedOp_t op) {   \
        ACC *acc = acc_;                                                                  \
        const IN *in = in_;                                                               \
        for (size_t i = 0; i < n; i++) {                                                  \
            ACC a = acc[i], b = TO_ACC(in[i]);                                            \
            switch (op) {                                                                 \
            case ncclProd: acc[i] = (ACC)MUL(a, b); break;                                \
            case ncclMax: acc[i] = b > a ? b : a; break;                                  \
            case ncclMin: acc[i] = b < a ? b : a; break;                                  \
            default: acc[i] = (ACC)ADD(a, b); break;   /* ncclSum, ncclAvg */             \
            }                                                                             \
        }                                                                                 \
    }                                                                                     \
    static void NAME##_finish(void *out_, const void *acc_, size_t n, ncclRedOp_t op,     \
                              int nranks) {                                               \
        IN *out = out_;                                                                   \
        const ACC *acc = acc_;                                                            \
        for (size_t i = 0; i < n; i++) {                                                  \
            ACC a = acc[i];                                                               \
            if (op == ncclAvg) a = (ACC)(a / (ACC)nranks);                                \
            out[i] = FROM_ACC(a);                                                         \
        }                                                                                 \
    }

DEFINE_REDUCTION(i8, int8_t, int8_t, SAME, SAME, ADD_U8, MUL_U8)
DEFINE_REDUCTION(u8, uint8_t, uint8_t, SAME, SAME, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(i32, int32_t, int32_t, SAME, SAME, ADD_U32, MUL_U32)
DEFINE_REDUCTION(u32, uint32_t, uint32_t, SAME, SAME, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(i64, int64_t, int64_t, SAME, SAME, ADD_U64, MUL_U64)
DEFINE_REDUCTION(u64, uint64_t, uint64_t, SAME, SAME, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(f16, float, uint16_t, half_to_float, float_to_half, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(f32, float, float, SAME, SAME, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(f64, double, double, SAME, SAME, ADD_PLAIN, MUL_PLAIN)
DEFINE_REDUCTION(bf16, float, uint16_t, bf16_to_float, float_to_bf16, ADD_PLAIN, MUL_PLAIN)

typedef struct {
    void (*first)(void *acc, const void *in, size_t n);
    void (*combine)(void *acc, const void *in, size_t n, ncclRedOp_t op);
    void (*finish)(void *out, const void *acc, size_t n, ncclRedOp_t op, int nranks);
} reduction;

#define REDUCTION(NAME) {NAME##_first, NAME##_combine, NAME##_finish}
static const reduction reductions[] = {
    [ncclInt8] = REDUCTION(i8),     [ncclUint8] = REDUCTION(u8),   [ncclInt32] = REDUCTION(i32),
    [ncclUint32] = REDUCTION(u32),  [ncclInt64] = REDUCTION(i64),  [ncclUint64] = REDUCTION(u64),
    [ncclFloat16] = REDUCTION(f16), [ncclFloat32] = REDUCTION(f32), [ncclFloat64] = REDUCTION(f64),
    [ncclBfloat16] = REDUCTION(bf16),
};

// Scratch per communicator: the accumulator (up to 2 slots: 16-bit values
// widen to float) and the result in the element type (up to 1 slot).
enum { SCRATCH_BYTES = 3 * SLOT_BYTES, SCRATCH_RESULT_AT = 2 * SLOT_BYTES };

// ================================================================ small helpers on the segment

static shm_rank *rank_record(struct ncclComm *comm, int r) { return &comm->ranks[r]; }

static shm_channel *channel(struct ncclComm *comm, int from, int to) {
    return &comm->channels[(size_t)from * (size_t)comm->nranks + (size_t)to];
}

static unsigned char *ring(struct ncclComm *comm, int from, int to) {
    return comm->rings + ((size_t)from * (size_t)comm->nranks + (size_t)to) * comm->ring_bytes;
}

static unsigned char *slot(struct ncclComm *comm, int r) { return comm->slots + (size_t)r * SLOT_BYTES; }

// A zombie (exited, not yet reaped by its parent) still answers kill(pid, 0).
static bool is_zombie(pid_t pid) {
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *end_of_name = strrchr(text, ')');
    return end_of_name && end_of_name[1] == ' ' && (end_of_name[2] == 'Z' || end_of_name[2] == 'X');
}

static bool process_is_gone(pid_t pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) == 0) return is_zombie(pid);
    return errno == ESRCH;
}

static void pause_briefly(long *delay_ns) {
    struct timespec ts = {0, *delay_ns};
    nanosleep(&ts, NULL);
    if (*delay_ns < 500000) *delay_ns = *delay_ns * 3 / 2;   // 50 us, growing to 0.5 ms
}

// ================================================================ describing calls, for messages

static void describe_call(char *buf, size_t size, int kind, uint64_t count, int dtype, int op, int root) {
    switch (kind) {
    case KIND_ALL_REDUCE:
        snprintf(buf, size, "ncclAllReduce(count %llu, %s, %s)", (unsigned long long)count,
                 dtype_name(dtype), op_name(op));
        break;
    case KIND_BROADCAST:
        snprintf(buf, size, "ncclBroadcast(count %llu, %s, root %d)", (unsigned long long)count,
                 dtype_name(dtype), root);
        break;
    case KIND_REDUCE:
        snprintf(buf, size, "ncclReduce(count %llu, %s, %s, root %d)", (unsigned long long)count,
                 dtype_name(dtype), op_name(op), root);
        break;
    case KIND_ALL_GATHER:
        snprintf(buf, size, "ncclAllGather(sendcount %llu, %s)", (unsigned long long)count,
                 dtype_name(dtype));
        break;
    case KIND_REDUCE_SCATTER:
        snprintf(buf, size, "ncclReduceScatter(recvcount %llu, %s, %s)", (unsigned long long)count,
                 dtype_name(dtype), op_name(op));
        break;
    default:
        snprintf(buf, size, "%s(count %llu, %s, peer %d)", kind_name(kind), (unsigned long long)count,
                 dtype_name(dtype), root);
        break;
    }
}

// "collective #7 ncclAllReduce(count 1024, float32, sum)" or
// "ncclSend(count 10, float32, peer 1), message #3 from rank 0 to rank 1".
static void describe_part(char *buf, size_t size, const struct ncclComm *comm, const part *p) {
    char call[160];
    if (p->kind == KIND_SEND || p->kind == KIND_RECV) {
        describe_call(call, sizeof call, p->kind, p->count, p->dtype, -1, p->peer);
        int from = p->kind == KIND_SEND ? comm->rank : p->peer;
        int to = p->kind == KIND_SEND ? p->peer : comm->rank;
        snprintf(buf, size, "%s, message #%llu from rank %d to rank %d", call,
                 (unsigned long long)p->seq, from, to);
    } else {
        describe_call(call, sizeof call, p->kind, p->count, p->dtype, p->op, p->root);
        snprintf(buf, size, "collective #%llu %s", (unsigned long long)p->seq, call);
    }
}

// ================================================================ waiting for peers

static void progressed(part *p) {
    p->progressed = true;
    p->loss_seen = false;
    p->stalled_since = emu_now();
}

static bool stalled_too_long(const part *p) { return emu_now() - p->stalled_since > emu_timeout_s(); }

// Whether it is time to ask the kernel whether peers still live.
static bool time_to_check_pids(part *p) {
    double now = emu_now();
    if (now - p->last_pid_check < PID_CHECK_INTERVAL_S) return false;
    p->last_pid_check = now;
    return true;
}

// If rank r will never get to where `p` waits for it - it aborted, failed,
// destroyed its communicator or exited - fails the communicator and says
// so.
//
// Careful: the caller first saw that r had not arrived, and only then
// looks at r's state. In between, r may have arrived, finished and left.
// So the first time r looks lost we only take note and wait; the caller
// checks again whether r has arrived, and only if r is still missing and
// still lost at the next look has it really gone.
static bool peer_is_lost(struct ncclComm *comm, part *p, int r, bool check_pid) {
    shm_rank *peer = rank_record(comm, r);
    int state = atomic_load_explicit(&peer->state, memory_order_acquire);
    pid_t pid = atomic_load_explicit(&peer->pid, memory_order_relaxed);
    bool exited = state == RANK_JOINED && check_pid && process_is_gone(pid);
    if (state == RANK_JOINED && !exited) return false;
    if (!p->loss_seen) {
        p->loss_seen = true;
        return false;
    }
    char what[300];
    describe_part(what, sizeof what, comm, p);
    switch (state) {
    case RANK_ABORTED:
        comm_fail(comm, ncclRemoteError, "rank %d aborted the communicator, so %s cannot complete",
                  r, what);
        return true;
    case RANK_FAILED:
        comm_fail(comm, ncclRemoteError, "rank %d failed (%s), so %s cannot complete", r,
                  peer->error, what);
        return true;
    case RANK_LEFT:
        comm_fail(comm, ncclInvalidUsage,
                  "rank %d destroyed its communicator while this rank still needs it for %s "
                  "(did every rank make the same calls?)", r, what);
        return true;
    default:
        comm_fail(comm, ncclRemoteError, "rank %d (pid %d) exited, so %s cannot complete", r, (int)pid,
                  what);
        return true;
    }
}

// A part that waits for an earlier operation of this same rank (the
// previous collective, the previous message on its channel). That one is
// normally earlier on the same stream; if it is on another stream that
// nobody waits for, say so rather than hang.
static part_status wait_for_turn(struct ncclComm *comm, part *p) {
    if (!stalled_too_long(p)) return PART_PENDING;
    char what[300];
    describe_part(what, sizeof what, comm, p);
    comm_fail(comm, ncclInvalidUsage,
              "%s waited %g s for this rank's previous operation on the communicator, which "
              "has not run (is it queued on another stream that nobody waits for?)",
              what, emu_timeout_s());
    return PART_FAILED;
}

// ================================================================ collectives

static bool collective_rank_reached(struct ncclComm *comm, const part *p, int r) {
    shm_rank *peer = rank_record(comm, r);
    if (p->phase == COLL_AGREE)
        return atomic_load_explicit(&peer->desc[p->seq % 2].seq, memory_order_acquire) == p->seq;
    return atomic_load_explicit(&peer->arrived, memory_order_acquire) >= p->barrier;
}

// Why rank r has not reached collective p, in words, for the timeout.
static void explain_missing_rank(char *buf, size_t size, struct ncclComm *comm, const part *p, int r) {
    shm_rank *peer = rank_record(comm, r);
    uint64_t issued = atomic_load_explicit(&peer->issued, memory_order_relaxed);
    uint64_t completed = atomic_load_explicit(&peer->completed, memory_order_relaxed);
    char last[80] = "it has finished none";
    if (completed > 0)
        snprintf(last, sizeof last, "the last it finished: #%llu %s", (unsigned long long)completed,
                 kind_name(atomic_load_explicit(&peer->last_kind, memory_order_relaxed)));
    if (p->phase != COLL_AGREE)
        appendf(buf, size, "; rank %d started it but stopped making progress (is that process "
                "stopped, or busy without waiting for its stream?)", r);
    else if (issued < p->seq)
        appendf(buf, size, "; rank %d has called only %llu collective(s) (%s)", r,
                (unsigned long long)issued, last);
    else
        appendf(buf, size, "; rank %d has called it, but its stream has not run it yet (%s; "
                "work runs when that rank synchronizes or queries its stream)", r, last);
}

static void fail_collective_timeout(struct ncclComm *comm, part *p) {
    char what[300], text[ERROR_BYTES] = "";
    describe_part(what, sizeof what, comm, p);
    bool someone_called_less = false;
    for (int r = 0; r < comm->nranks; r++) {
        if (collective_rank_reached(comm, p, r)) continue;
        explain_missing_rank(text, sizeof text, comm, p, r);
        if (atomic_load_explicit(&rank_record(comm, r)->issued, memory_order_relaxed) < p->seq)
            someone_called_less = true;
    }
    comm_fail(comm, p->phase == COLL_AGREE || someone_called_less ? ncclInvalidUsage : ncclRemoteError,
              "%s timed out after %g s%s (every rank must call the same collectives in the same "
              "order; EMU_TIMEOUT sets the limit)", what, emu_timeout_s(), text);
}

// Waits until every rank has posted this collective's descriptor (phase
// COLL_AGREE) or arrived at barrier p->barrier (the data phases). A barrier
// is a counter per rank that only grows: "everyone has arrived" is
// "everyone's counter >= mine", so nothing has to be reset between rounds
// and a rank that is missing can be named.
static part_status wait_for_all_ranks(struct ncclComm *comm, part *p) {
    bool check_pids = time_to_check_pids(p);
    bool everyone = true;
    for (int r = 0; r < comm->nranks; r++) {
        if (collective_rank_reached(comm, p, r)) continue;
        everyone = false;
        if (peer_is_lost(comm, p, r, check_pids)) return PART_FAILED;
    }
    if (everyone) {
        progressed(p);
        return PART_DONE;
    }
    if (stalled_too_long(p)) {
        fail_collective_timeout(comm, p);
        return PART_FAILED;
    }
    return PART_PENDING;
}

static void post_descriptor(struct ncclComm *comm, const part *p) {
    shm_descriptor *d = &rank_record(comm, comm->rank)->desc[p->seq % 2];
    d->kind = p->kind;
    d->count = p->count;
    d->dtype = p->dtype;
    d->op = kind_reduces(p->kind) ? (int32_t)p->op : -1;
    d->root = kind_has_root(p->kind) ? p->root : -1;
    atomic_store_explicit(&d->seq, p->seq, memory_order_release);
}

static bool same_call(const shm_descriptor *a, const shm_descriptor *b) {
    return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root;
}

// Every rank compares all the descriptors, so every rank finds a mismatch
// and writes the same message: "rank 0 called ..., ranks 1 and 2 called ...".
static bool descriptors_agree(struct ncclComm *comm, const part *p) {
    const shm_descriptor *first = &rank_record(comm, 0)->desc[p->seq % 2];
    bool agree = true;
    for (int r = 1; r < comm->nranks; r++)
        if (!same_call(first, &rank_record(comm, r)->desc[p->seq % 2])) agree = false;
    if (agree) return true;

    char text[ERROR_BYTES] = "";
    bool *listed = xcalloc((size_t)comm->nranks, sizeof *listed);
    for (int r = 0; r < comm->nranks; r++) {
        if (listed[r]) continue;
        const shm_descriptor *d = &rank_record(comm, r)->desc[p->seq % 2];
        int same = 0;
        for (int s = r; s < comm->nranks; s++)
            if (!listed[s] && same_call(d, &rank_record(comm, s)->desc[p->seq % 2])) same++;
        appendf(text, sizeof text, "%s%s", text[0] ? ", " : "", same > 1 ? "ranks " : "rank ");
        int shown = 0;
        for (int s = r; s < comm->nranks; s++) {
            if (listed[s] || !same_call(d, &rank_record(comm, s)->desc[p->seq % 2])) continue;
            listed[s] = true;
            shown++;
            appendf(text, sizeof text, "%s%d", shown == 1 ? "" : shown == same ? " and " : ", ", s);
        }
        char call[160];
        describe_call(call, sizeof call, d->kind, d->count, d->dtype, d->op, d->root);
        appendf(text, sizeof text, " called %s", call);
    }
    free(listed);
    comm_fail(comm, ncclInvalidUsage, "collective #%llu differs between ranks: %s",
              (unsigned long long)p->seq, text);
    return false;
}

// How many elements go through a slot per round: a whole slot, except for
// reduce-scatter, where a slot holds one piece for each rank.
static void plan_chunks(struct ncclComm *comm, part *p) {
    size_t per_chunk = SLOT_BYTES / dtype_size(p->dtype);
    if (p->kind == KIND_REDUCE_SCATTER) per_chunk /= (size_t)comm->nranks;
    p->chunk_elems = per_chunk;
    p->nchunks = (p->count + per_chunk - 1) / per_chunk;
    p->chunk = 0;
}

static size_t chunk_first(const part *p) { return p->chunk * p->chunk_elems; }

static size_t chunk_length(const part *p) {
    size_t left = p->count - chunk_first(p);
    return left < p->chunk_elems ? left : p->chunk_elems;
}

// Step 1 of a round: this rank's contribution into its own slot.
static void fill_slot(struct ncclComm *comm, const part *p) {
    size_t size = dtype_size(p->dtype), first = chunk_first(p), n = chunk_length(p);
    const unsigned char *send = p->send;
    unsigned char *mine = slot(comm, comm->rank);
    switch (p->kind) {
    case KIND_BROADCAST:
        if (comm->rank == p->root) memcpy(mine, send + first * size, n * size);
        break;
    case KIND_REDUCE_SCATTER:   // the chunk of every rank's block, side by side
        for (int r = 0; r < comm->nranks; r++)
            memcpy(mine + (size_t)r * p->chunk_elems * size,
                   send + ((size_t)r * p->count + first) * size, n * size);
        break;
    default:                    // all-reduce, reduce, all-gather
        memcpy(mine, send + first * size, n * size);
        break;
    }
}

// dst = slot 0 OP slot 1 OP ... (each at `offset`), in rank order.
static void reduce_slots(struct ncclComm *comm, const part *p, size_t offset, size_t n, void *dst) {
    const reduction *red = &reductions[p->dtype];
    unsigned char *acc = comm->scratch, *result = acc + SCRATCH_RESULT_AT;
    red->first(acc, slot(comm, 0) + offset, n);
    for (int r = 1; r < comm->nranks; r++) red->combine(acc, slot(comm, r) + offset, n, p->op);
    red->finish(result, acc, n, p->op, comm->nranks);
    memcpy(dst, result, n * dtype_size(p->dtype));
}

// Step 2 of a round: this rank's result, from everybody's slots.
static void take_result(struct ncclComm *comm, const part *p) {
    size_t size = dtype_size(p->dtype), first = chunk_first(p), n = chunk_length(p);
    unsigned char *recv = p->recv;
    switch (p->kind) {
    case KIND_ALL_REDUCE:
        reduce_slots(comm, p, 0, n, recv + first * size);
        break;
    case KIND_REDUCE:
        if (comm->rank == p->root) reduce_slots(comm, p, 0, n, recv + first * size);
        break;
    case KIND_BROADCAST:
        memcpy(recv + first * size, slot(comm, p->root), n * size);
        break;
    case KIND_ALL_GATHER:
        for (int r = 0; r < comm->nranks; r++)
            memcpy(recv + ((size_t)r * p->count + first) * size, slot(comm, r), n * size);
        break;
    case KIND_REDUCE_SCATTER:
        reduce_slots(comm, p, (size_t)comm->rank * p->chunk_elems * size, n, recv + first * size);
        break;
    }
}

static void arrive_at_barrier(struct ncclComm *comm, part *p) {
    p->barrier = ++comm->barriers;
    atomic_store_explicit(&rank_record(comm, comm->rank)->arrived, p->barrier, memory_order_release);
}

static void finish_collective(struct ncclComm *comm, const part *p) {
    shm_rank *me = rank_record(comm, comm->rank);
    comm->collectives_done = p->seq;
    atomic_store_explicit(&me->last_kind, p->kind, memory_order_relaxed);
    atomic_store_explicit(&me->completed, p->seq, memory_order_release);
}

static part_status progress_collective(struct ncclComm *comm, part *p) {
    part_status s;
    for (;;) {
        switch (p->phase) {
        case COLL_TURN:   // collectives run in the order the program called them
            if (comm->collectives_done + 1 != p->seq) return wait_for_turn(comm, p);
            post_descriptor(comm, p);
            progressed(p);
            p->phase = COLL_AGREE;
            break;
        case COLL_AGREE:
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            if (!descriptors_agree(comm, p)) return PART_FAILED;
            plan_chunks(comm, p);
            p->phase = p->nchunks > 0 ? COLL_FILL : COLL_FINISH;
            break;
        case COLL_FILL:
            fill_slot(comm, p);
            arrive_at_barrier(comm, p);
            p->phase = COLL_FILLED;
            break;
        case COLL_FILLED:   // every slot is full: compute, then say "done reading"
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            take_result(comm, p);
            arrive_at_barrier(comm, p);
            p->phase = COLL_DRAINED;
            break;
        case COLL_DRAINED:  // nobody reads the slots any more: the next round may fill them
            if ((s = wait_for_all_ranks(comm, p)) != PART_DONE) return s;
            p->chunk++;
            p->phase = p->chunk < p->nchunks ? COLL_FILL : COLL_FINISH;
            break;
        default:            // COLL_FINISH
            finish_collective(comm, p);
            return PART_DONE;
        }
    }
}

// ================================================================ send and receive

static void fail_p2p_mismatch(struct ncclComm *comm, const part *p, int sender, int receiver,
                              uint64_t send_count, int send_dtype, uint64_t recv_count, int recv_dtype) {
    char send_call[160], recv_call[160];
    describe_call(send_call, sizeof send_call, KIND_SEND, send_count, send_dtype, -1, receiver);
    describe_call(recv_call, sizeof recv_call, KIND_RECV, recv_count, recv_dtype, -1, sender);
    comm_fail(comm, ncclInvalidUsage,
              "send/recv #%llu from rank %d to rank %d differs between the two ranks: rank %d called "
              "%s, rank %d called %s (count and type must match)",
              (unsigned long long)p->seq, sender, receiver, sender, send_call, receiver, recv_call);
}

static void fail_p2p_timeout(struct ncclComm *comm, const part *p, shm_channel *ch) {
    char what[300];
    describe_part(what, sizeof what, comm, p);
    bool sending = p->kind == KIND_SEND;
    uint64_t peer_issued = atomic_load_explicit(sending ? &ch->recv_issued : &ch->send_issued,
                                                memory_order_relaxed);
    const char *peer_call = sending ? "ncclRecv from" : "ncclSend to";
    char why[400];
    if (peer_issued < p->seq)
        snprintf(why, sizeof why, "rank %d has called %s rank %d only %llu time(s)", p->peer, peer_call,
                 comm->rank, (unsigned long long)peer_issued);
    else
        snprintf(why, sizeof why,
                 "rank %d has called the matching %s but has not finished it: its stream has not "
                 "got there (perhaps it waits behind an earlier operation, such as its own send), "
                 "or that process is stuck", p->peer, sending ? "ncclRecv" : "ncclSend");
    comm_fail(comm, ncclInvalidUsage,
              "%s timed out after %g s: %s (a send completes only when its receiver has taken "
              "all the data: sends and receives that must progress together, such as an exchange, "
              "belong in one ncclGroupStart/ncclGroupEnd; EMU_TIMEOUT sets the limit)",
              what, emu_timeout_s(), why);
}

// The sender is blocked (ring full, or waiting for the acknowledgement).
static part_status sender_waits(struct ncclComm *comm, part *p, shm_channel *ch) {
    if (atomic_load_explicit(&ch->rejected, memory_order_acquire) == p->seq) {
        fail_p2p_mismatch(comm, p, comm->rank, p->peer, p->count, p->dtype, ch->recv_count,
                          ch->recv_dtype);
        return PART_FAILED;
    }
    if (peer_is_lost(comm, p, p->peer, time_to_check_pids(p))) return PART_FAILED;
    if (stalled_too_long(p)) {
        fail_p2p_timeout(comm, p, ch);
        return PART_FAILED;
    }
    return PART_PENDING;
}

static part_status receiver_waits(struct ncclComm *comm, part *p, shm_channel *ch) {
    if (peer_is_lost(comm, p, p->peer, time_to_check_pids(p))) return PART_FAILED;
    if (stalled_too_long(p)) {
        fail_p2p_timeout(comm, p, ch);
        return PART_FAILED;
    }
    return PART_PENDING;
}

// Copies as much as fits (up to the end of the ring); returns the bytes copied.
static size_t write_to_ring(shm_channel *ch, unsigned char *ring_data, size_t ring_bytes,
                            const unsigned char *src, size_t left) {
    uint64_t written = atomic_load_explicit(&ch->written, memory_order_relaxed);   // ours alone
    uint64_t read = atomic_load_explicit(&ch->read, memory_order_acquire);
    size_t room = ring_bytes - (size_t)(written - read), at = (size_t)(written % ring_bytes);
    size_t n = left;
    if (n > room) n = room;
    if (n > ring_bytes - at) n = ring_bytes - at;
    memcpy(ring_data + at, src, n);
    atomic_store_explicit(&ch->written, written + n, memory_order_release);
    return n;
}

static size_t read_from_ring(shm_channel *ch, const unsigned char *ring_data, size_t ring_bytes,
                             unsigned char *dst, size_t left) {
    uint64_t read = atomic_load_explicit(&ch->read, memory_order_relaxed);   // ours alone
    uint64_t written = atomic_load_explicit(&ch->written, memory_order_acquire);
    size_t ready = (size_t)(written - read), at = (size_t)(read % ring_bytes);
    size_t n = left;
    if (n > ready) n = ready;
    if (n > ring_bytes - at) n = ring_bytes - at;
    memcpy(dst, ring_data + at, n);
    atomic_store_explicit(&ch->read, read + n, memory_order_release);
    return n;
}

static part_status progress_send(struct ncclComm *comm, part *p) {
    shm_channel *ch = channel(comm, comm->rank, p->peer);
    size_t total = p->count * dtype_size(p->dtype);
    for (;;) {
        switch (p->phase) {
        case SEND_TURN:   // messages to one peer go in call order
            if (comm->sends_done[p->peer] + 1 != p->seq) return wait_for_turn(comm, p);
            ch->send_count = p->count;
            ch->send_dtype = p->dtype;
            atomic_store_explicit(&ch->send_posted, p->seq, memory_order_release);
            progressed(p);
            p->phase = SEND_WRITE;
            break;
        case SEND_WRITE:
            if (p->moved == total) {
                p->phase = SEND_ACK;
                break;
            }
            size_t n = write_to_ring(ch, ring(comm, comm->rank, p->peer), comm->ring_bytes,
                                     (const unsigned char *)p->send + p->moved, total - p->moved);
            if (n == 0) return sender_waits(comm, p, ch);
            p->moved += n;
            progressed(p);
            break;
        default:          // SEND_ACK: done when the receiver has everything
            if (atomic_load_explicit(&ch->acked, memory_order_acquire) < p->seq)
                return sender_waits(comm, p, ch);
            comm->sends_done[p->peer] = p->seq;
            progressed(p);
            return PART_DONE;
        }
    }
}

static part_status progress_recv(struct ncclComm *comm, part *p) {
    shm_channel *ch = channel(comm, p->peer, comm->rank);
    size_t total = p->count * dtype_size(p->dtype);
    for (;;) {
        switch (p->phase) {
        case RECV_TURN:
            if (comm->recvs_done[p->peer] + 1 != p->seq) return wait_for_turn(comm, p);
            progressed(p);
            p->phase = RECV_MATCH;
            break;
        case RECV_MATCH:  // the sender's description of this message must match ours
            if (atomic_load_explicit(&ch->send_posted, memory_order_acquire) != p->seq)
                return receiver_waits(comm, p, ch);
            if (ch->send_count != p->count || ch->send_dtype != (int32_t)p->dtype) {
                ch->recv_count = p->count;
                ch->recv_dtype = p->dtype;
                atomic_store_explicit(&ch->rejected, p->seq, memory_order_release);
                fail_p2p_mismatch(comm, p, p->peer, comm->rank, ch->send_count, ch->send_dtype,
                                  p->count, p->dtype);
                return PART_FAILED;
            }
            progressed(p);
            p->phase = RECV_READ;
            break;
        default:          // RECV_READ
            if (p->moved == total) {
                atomic_store_explicit(&ch->acked, p->seq, memory_order_release);
                comm->recvs_done[p->peer] = p->seq;
                progressed(p);
                return PART_DONE;
            }
            size_t n = read_from_ring(ch, ring(comm, p->peer, comm->rank), comm->ring_bytes,
                                      (unsigned char *)p->recv + p->moved, total - p->moved);
            if (n == 0) return receiver_waits(comm, p, ch);
            p->moved += n;
            progressed(p);
            break;
        }
    }
}

// ================================================================ queued operations

static part_status progress_part(struct ncclComm *comm, part *p) {
    switch (p->kind) {
    case KIND_SEND: return progress_send(comm, p);
    case KIND_RECV: return progress_recv(comm, p);
    default: return progress_collective(comm, p);
    }
}

static void op_finished(queued_op *o) {
    if (o->finished) return;
    o->finished = true;
    if (o->comm) o->comm->ops_unfinished--;
}

// What the stream runs. Every part gets a turn, again and again while any
// of them moves, so that the parts of a group (a send and a receive that
// need each other, even to and from this same rank) progress together.
static emu_op_status run_op(void *state) {
    queued_op *o = state;
    struct ncclComm *comm = o->comm;
    if (!comm || comm->error != ncclSuccess) {
        emu_op_fail_reason("%s", comm ? comm->error_text : "emulated NCCL: the communicator is gone");
        op_finished(o);
        return EMU_OP_FAILED;
    }
    if (!o->started) {   // timeouts count from the first time the stream gets here
        o->started = true;
        for (int i = 0; i < o->nparts; i++) o->parts[i].stalled_since = emu_now();
    }
    // When a peer is moving data at the same moment, a 64 KiB ring drains
    // and refills many times a millisecond: keep at it for up to 2 ms
    // (yielding the core) before handing back to the stream runner, which
    // would otherwise sleep between rounds.
    bool all_done, moved, any_moved = false;
    double spin_until = emu_now() + 0.002;
spin:
    do {
        all_done = true;
        moved = false;
        for (int i = 0; i < o->nparts; i++) {
            part *p = &o->parts[i];
            if (p->done) continue;
            p->progressed = false;
            part_status s = progress_part(comm, p);
            if (s == PART_FAILED) {
                emu_op_fail_reason("%s", comm->error_text);
                op_finished(o);
                return EMU_OP_FAILED;
            }
            if (s == PART_DONE) p->done = true;
            else all_done = false;
            moved = moved || p->progressed;
        }
        if (moved) any_moved = true;
    } while (!all_done && moved);
    if (!all_done && emu_now() < spin_until) {
        sched_yield();
        goto spin;
    }
    if (!all_done) {
        // A part that waits for its turn behind another part of this op is
        // not stuck while that one moves.
        for (int i = 0; i < o->nparts && any_moved; i++)
            if (o->parts[i].phase == COLL_TURN || o->parts[i].phase == SEND_TURN ||
                o->parts[i].phase == RECV_TURN)
                o->parts[i].stalled_since = emu_now();
        return EMU_OP_PENDING;
    }
    op_finished(o);
    return EMU_OP_DONE;
}

static void free_op(void *state) {
    queued_op *o = state;
    struct ncclComm *comm = o->comm;
    if (comm) {
        op_finished(o);
        if (o->prev) o->prev->next = o->next;
        else comm->ops = o->next;
        if (o->next) o->next->prev = o->prev;
    }
    free(o->parts);
    free(o);
}

// For emu_stream_discard_if: is this queued state one of `owner`'s ops? The
// stream may hold other libraries' work too, so we compare pointers with
// our own list instead of looking inside a state that may not be ours.
static bool op_belongs_to(void *state, void *owner) {
    for (queued_op *o = ((struct ncclComm *)owner)->ops; o; o = o->next)
        if (o == state) return true;
    return false;
}

static ncclResult_t enqueue_op(struct ncclComm *comm, cudaStream_t stream, const char *what,
                               part *parts, int nparts) {
    queued_op *o = xcalloc(1, sizeof *o);
    o->comm = comm;
    o->stream = stream;
    o->nparts = nparts;
    o->parts = xcalloc((size_t)nparts, sizeof *o->parts);
    memcpy(o->parts, parts, (size_t)nparts * sizeof *parts);
    o->next = comm->ops;
    if (comm->ops) comm->ops->prev = o;
    comm->ops = o;
    comm->ops_unfinished++;
    // A stream that refuses the op (destroyed) has already freed it through free_op.
    cudaError_t err = emu_stream_enqueue(stream, what, run_op, o, free_op);
    if (err != cudaSuccess)
        return call_error(comm, ncclUnhandledCudaError, "%s: the stream refused the work (%s); was "
                          "it destroyed?", what, cudaGetErrorString(err));
    return ncclSuccess;
}

// ================================================================ groups
//
// NCCL keeps the group per host thread. Calls inside a group only get
// their sequence numbers; the outermost ncclGroupEnd queues them, one op
// per (communicator, stream), each op running its parts together.

typedef struct {
    struct ncclComm *comm;
    cudaStream_t stream;
    part p;
} group_call;

static _Thread_local int group_depth;
static _Thread_local group_call *group_calls;
static _Thread_local int group_count, group_capacity;

static void group_add(struct ncclComm *comm, cudaStream_t stream, const part *p) {
    if (group_count == group_capacity) {
        group_capacity = group_capacity ? 2 * group_capacity : 16;
        group_calls = xrealloc(group_calls, (size_t)group_capacity * sizeof *group_calls);
    }
    group_calls[group_count++] = (group_call){comm, stream, *p};
}

// Queues the calls of one (comm, stream) pair, in call order, as one op.
static ncclResult_t group_flush_one(int first, bool *queued) {
    struct ncclComm *comm = group_calls[first].comm;
    cudaStream_t stream = group_calls[first].stream;
    part *parts = xcalloc((size_t)group_count, sizeof *parts);
    int n = 0;
    for (int i = first; i < group_count; i++) {
        if (queued[i] || group_calls[i].comm != comm || group_calls[i].stream != stream) continue;
        parts[n++] = group_calls[i].p;
        queued[i] = true;
    }
    ncclResult_t res = enqueue_op(comm, stream, n == 1 ? kind_name(parts[0].kind) : "ncclGroupEnd",
                                  parts, n);
    free(parts);
    return res;
}

// ================================================================ the API: versions, ids, errors

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return call_error(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
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

// A name nobody else uses: our pid, a counter, and random bits (in case a
// pid is reused while an old segment still exists).
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static _Atomic unsigned counter;
    if (!uniqueId) return call_error(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    uint64_t random_bits = 0;
    if (getrandom(&random_bits, sizeof random_bits, GRND_NONBLOCK) != (ssize_t)sizeof random_bits)
        random_bits = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    id_contents id;
    memset(&id, 0, sizeof id);
    snprintf(id.magic, sizeof id.magic, "%s", ID_MAGIC);
    snprintf(id.name, sizeof id.name, "/course-emu-nccl-%d-%u-%016llx", (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long long)random_bits);
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

// ================================================================ the API: joining

// Every check a call on `comm` makes first.
static ncclResult_t check_comm(const char *api, const struct ncclComm *comm) {
    if (!comm) return call_error(NULL, ncclInvalidArgument, "%s: comm is NULL", api);
    if (comm->magic != COMM_MAGIC)
        return call_error(NULL, ncclInvalidArgument, "%s: comm is not a live communicator "
                          "(destroyed already, or never initialised?)", api);
    if (comm->call_in_progress)
        return call_error(comm, ncclInvalidUsage, "called %s while the communicator's previous call "
                          "(%s) is still in progress (poll ncclCommGetAsyncError until it is not "
                          "ncclInProgress)", api, comm->call_in_progress);
    return ncclSuccess;
}

// ... and a call that queues work also needs a healthy, unfinalized comm.
static ncclResult_t check_comm_for_work(const char *api, const struct ncclComm *comm) {
    ncclResult_t res = check_comm(api, comm);
    if (res != ncclSuccess) return res;
    if (comm->finalizing)
        return call_error(comm, ncclInvalidUsage, "%s called after ncclCommFinalize", api);
    if (comm->error != ncclSuccess)
        return call_error(comm, comm->error, "%s: the communicator failed earlier: %s", api,
                          without_prefix(comm->error_text));
    return ncclSuccess;
}

static void unlink_segment(struct ncclComm *comm) {
    if (comm->unlinked || !comm->shm_name[0]) return;
    shm_unlink(comm->shm_name);   // ENOENT is fine: another rank was first
    comm->unlinked = true;
}

// Records why the join failed where every rank looks while it waits, so
// they fail too instead of waiting for their timeout.
__attribute__((format(printf, 3, 4)))
static ncclResult_t join_fail(struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    char text[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    shm_header *h = comm->header;
    int32_t ok = INIT_OK;
    if (h && atomic_compare_exchange_strong(&h->init_state, &ok, INIT_WRITING_ERROR)) {
        snprintf(h->init_error, sizeof h->init_error, "%s", text);
        h->init_error_code = code;
        atomic_store_explicit(&h->init_state, INIT_FAILED, memory_order_release);
    }
    unlink_segment(comm);
    comm_fail(comm, code, "%s", text);
    return code;
}

static ncclResult_t join_timed_out(struct ncclComm *comm) {
    char missing[256] = "";
    int count = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (atomic_load_explicit(&rank_record(comm, r)->state, memory_order_acquire) != RANK_ABSENT)
            continue;
        appendf(missing, sizeof missing, "%s%d", count ? ", " : "", r);
        count++;
    }
    return join_fail(comm, ncclRemoteError,
                     "ncclCommInitRank: rank%s %s of %d did not join within %g s (does every rank "
                     "call ncclCommInitRank with the same id and nranks? EMU_TIMEOUT sets the limit)",
                     count > 1 ? "s" : "", missing, comm->nranks, emu_timeout_s());
}

static bool everybody_joined(struct ncclComm *comm) {
    return comm->join_stage == JOIN_WAIT_ALL &&
           atomic_load_explicit(&comm->header->joined, memory_order_acquire) == comm->nranks;
}

// While waiting for the others: has the join failed elsewhere, has a rank
// that joined exited, has the time run out?
static ncclResult_t join_waits(struct ncclComm *comm) {
    shm_header *h = comm->header;
    if (atomic_load_explicit(&h->init_state, memory_order_acquire) == INIT_FAILED) {
        unlink_segment(comm);
        comm_fail(comm, (ncclResult_t)h->init_error_code, "%s", h->init_error);
        return comm->error;
    }
    double now = emu_now();
    if (comm->join_stage == JOIN_WAIT_ALL && now - comm->last_pid_check >= PID_CHECK_INTERVAL_S) {
        comm->last_pid_check = now;
        for (int r = 0; r < comm->nranks; r++) {
            pid_t pid = atomic_load_explicit(&rank_record(comm, r)->pid, memory_order_relaxed);
            if (r == comm->rank || !process_is_gone(pid)) continue;
            // A rank may have seen everybody join, finished, and exited since
            // we last counted: count again before blaming it.
            if (everybody_joined(comm)) return ncclInProgress;
            return join_fail(comm, ncclRemoteError, "ncclCommInitRank: rank %d (pid %d) exited "
                             "before every rank had joined", r, (int)pid);
        }
    }
    if (now - comm->join_started > emu_timeout_s() && !everybody_joined(comm)) {
        if (comm->join_stage == JOIN_WAIT_ALL) return join_timed_out(comm);
        return join_fail(comm, ncclRemoteError, "ncclCommInitRank: the shared segment was not set "
                         "up within %g s", emu_timeout_s());
    }
    return ncclInProgress;
}

static ncclResult_t check_duplicate_devices(struct ncclComm *comm) {
    for (int r = 1; r < comm->nranks; r++)
        for (int s = 0; s < r; s++)
            if (rank_record(comm, r)->device == rank_record(comm, s)->device)
                return join_fail(comm, ncclInvalidUsage,
                                 "Duplicate GPU detected : rank %d and rank %d both on emulated "
                                 "device %d (NCCL needs one GPU per rank: call cudaSetDevice with "
                                 "each rank's own GPU before ncclCommInitRank)",
                                 r, s, rank_record(comm, r)->device);
    return ncclSuccess;
}

// One step of joining: set up the header (one rank), register this rank,
// wait for all. Returns ncclInProgress until every rank is in.
static ncclResult_t join_step(struct ncclComm *comm) {
    shm_header *h = comm->header;
    for (;;) {
        switch (comm->join_stage) {
        case JOIN_SETUP: {
            uint32_t none = SETUP_NONE;
            if (atomic_compare_exchange_strong(&h->setup, &none, SETUP_BUSY)) {
                snprintf(h->magic, sizeof h->magic, "%s", SEGMENT_MAGIC);
                h->nranks = comm->nranks;
                atomic_store_explicit(&h->setup, SETUP_DONE, memory_order_release);
            } else if (atomic_load_explicit(&h->setup, memory_order_acquire) != SETUP_DONE) {
                return join_waits(comm);
            }
            if (strcmp(h->magic, SEGMENT_MAGIC) != 0)
                return join_fail(comm, ncclInternalError, "ncclCommInitRank: shared memory segment "
                                 "%s holds something else", comm->shm_name);
            comm->join_stage = JOIN_REGISTER;
            break;
        }
        case JOIN_REGISTER: {
            if (h->nranks != comm->nranks)
                return join_fail(comm, ncclInvalidUsage,
                                 "ncclCommInitRank: rank %d was given nranks %d, but another rank "
                                 "created the communicator with nranks %d (every rank must pass "
                                 "the same nranks)", comm->rank, comm->nranks, h->nranks);
            shm_rank *me = rank_record(comm, comm->rank);
            int32_t nobody = 0;
            if (!atomic_compare_exchange_strong(&me->pid, &nobody, (int32_t)getpid()))
                return join_fail(comm, ncclInvalidUsage,
                                 "ncclCommInitRank: rank %d joined twice, by pid %d and by pid %d "
                                 "(each process must pass its own rank, 0 to nranks-1)",
                                 comm->rank, (int)nobody, (int)getpid());
            comm->registered = true;
            me->device = comm->physical_device;
            atomic_store_explicit(&me->state, RANK_JOINED, memory_order_release);
            atomic_fetch_add(&h->joined, 1);
            comm->join_stage = JOIN_WAIT_ALL;
            break;
        }
        case JOIN_WAIT_ALL: {
            if (!everybody_joined(comm)) return join_waits(comm);
            // Everybody has the segment open: rank 0 removes its name, so
            // that nothing is left in /dev/shm however the job ends.
            if (comm->rank == 0) unlink_segment(comm);
            comm->unlinked = true;
            ncclResult_t res = check_duplicate_devices(comm);
            if (res != ncclSuccess) return res;
            comm->join_stage = JOIN_DONE;
            break;
        }
        default:
            return ncclSuccess;
        }
    }
}

static void free_comm(struct ncclComm *comm) {
    for (queued_op *o = comm->ops; o; o = o->next) o->comm = NULL;   // the stream may still free them
    if (comm->base) munmap(comm->base, comm->bytes);
    if (comm->fd >= 0) close(comm->fd);
    free(comm->sends_issued);
    free(comm->sends_done);
    free(comm->recvs_issued);
    free(comm->recvs_done);
    free(comm->scratch);
    comm->magic = 0;
    free(comm);
}

// Creates (or opens) the segment, makes sure its memory really exists, maps it.
static ncclResult_t map_segment(struct ncclComm *comm) {
    shm_layout layout = layout_for(comm->nranks);
    comm->fd = shm_open(comm->shm_name, O_RDWR | O_CREAT, 0600);
    if (comm->fd < 0)
        return call_error(comm, ncclSystemError, "ncclCommInitRank: shm_open(%s) failed: %s",
                          comm->shm_name, strerror(errno));
    struct stat st;
    if (fstat(comm->fd, &st) == 0 && (size_t)st.st_size < layout.total &&
        ftruncate(comm->fd, (off_t)layout.total) != 0)   // only ever grows: others may have mapped it
        return call_error(comm, ncclSystemError, "ncclCommInitRank: ftruncate of %s failed: %s",
                          comm->shm_name, strerror(errno));
    // Reserve the pages now, so that a full /dev/shm fails here, with a
    // message, and not later with SIGBUS in the middle of a collective.
    int err = posix_fallocate(comm->fd, 0, (off_t)layout.total);
    if (err != 0) {
        unlink_segment(comm);
        return call_error(comm, ncclSystemError,
                          "ncclCommInitRank: cannot reserve %.1f MiB of shared memory for %d ranks "
                          "in /dev/shm (%s); is /dev/shm full or small? (Docker's default is 64 MiB: "
                          "docker run --shm-size=1g)", (double)layout.total / (1 << 20), comm->nranks,
                          strerror(err));
    }
    comm->base = mmap(NULL, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, comm->fd, 0);
    if (comm->base == MAP_FAILED) {
        comm->base = NULL;
        return call_error(comm, ncclSystemError, "ncclCommInitRank: mmap of %s failed: %s",
                          comm->shm_name, strerror(errno));
    }
    comm->bytes = layout.total;
    unsigned char *base = comm->base;
    comm->header = (shm_header *)base;
    comm->ranks = (shm_rank *)(base + layout.ranks);
    comm->channels = (shm_channel *)(base + layout.channels);
    comm->rings = base + layout.rings;
    comm->ring_bytes = layout.ring_bytes;
    comm->slots = base + layout.slots;
    return ncclSuccess;
}

static ncclResult_t read_config(const ncclConfig_t *config, bool *blocking) {
    const char *env = getenv("NCCL_COMM_BLOCKING");
    *blocking = !(env && strcmp(env, "0") == 0);
    if (!config) return ncclSuccess;
    if (config->magic != NCCL_CONFIG_MAGIC)
        return call_error(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: config was not "
                          "initialised with NCCL_CONFIG_INITIALIZER");
    if (config->blocking == NCCL_CONFIG_UNDEF_INT) return ncclSuccess;
    if (config->blocking != 0 && config->blocking != 1)
        return call_error(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: config.blocking is "
                          "%d; it must be 0 or 1", config->blocking);
    *blocking = config->blocking == 1;
    return ncclSuccess;
}

static ncclResult_t init_comm(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                              const ncclConfig_t *config, int device) {
    if (!out) return call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d and nranks %d: "
                          "need nranks >= 1 and 0 <= rank < nranks", rank, nranks);
    id_contents contents;
    memcpy(&contents, id.internal, sizeof contents);
    if (memcmp(contents.magic, ID_MAGIC, sizeof ID_MAGIC) != 0 || contents.name[0] != '/' ||
        !memchr(contents.name, '\0', sizeof contents.name))
        return call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: the ncclUniqueId was not "
                          "made by ncclGetUniqueId (was all of it, %d bytes, passed on?)",
                          NCCL_UNIQUE_ID_BYTES);
    bool blocking;
    ncclResult_t res = read_config(config, &blocking);
    if (res != ncclSuccess) return res;

    struct ncclComm *comm = xcalloc(1, sizeof *comm);
    comm->magic = COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    comm->physical_device = emu_physical_device(device);
    comm->blocking = blocking;
    comm->fd = -1;
    snprintf(comm->shm_name, sizeof comm->shm_name, "%s", contents.name);
    comm->sends_issued = xcalloc((size_t)nranks, sizeof(uint64_t));
    comm->sends_done = xcalloc((size_t)nranks, sizeof(uint64_t));
    comm->recvs_issued = xcalloc((size_t)nranks, sizeof(uint64_t));
    comm->recvs_done = xcalloc((size_t)nranks, sizeof(uint64_t));
    comm->scratch = xcalloc(1, SCRATCH_BYTES);
    comm->join_started = emu_now();
    if ((res = map_segment(comm)) != ncclSuccess) {
        free_comm(comm);
        return res;
    }
    res = join_step(comm);
    if (!blocking) {
        // Non-blocking: the rest of the join happens in ncclCommGetAsyncError.
        // Even a join that is already complete answers "in progress", so that
        // a program that forgets to poll is caught every time.
        *out = comm;
        if (res == ncclSuccess || res == ncclInProgress) {
            comm->call_in_progress = "ncclCommInitRankConfig";
            res = ncclInProgress;
        }
        return res;
    }
    long delay_ns = 50000;
    while (res == ncclInProgress) {   // blocking: wait here, letting other threads in between
        emu_unlock();
        pause_briefly(&delay_ns);
        emu_lock();
        res = join_step(comm);
    }
    if (res != ncclSuccess) {
        snprintf(last_error, sizeof last_error, "%s", comm->error_text);
        free_comm(comm);
        return res;
    }
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    emu_lock();
    ncclResult_t res = init_comm(comm, nranks, commId, rank, config, emu_current_device());
    emu_unlock();
    return res;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (ndev != 1)
        return call_error(NULL, ncclInvalidUsage, "ncclCommInitAll with ndev %d: the emulated NCCL "
                          "drives one emulated GPU per process (ndev 1); start one process per GPU "
                          "and use ncclCommInitRank", ndev);
    int device = devlist ? devlist[0] : 0;
    if (device < 0 || device >= emu_device_count())
        return call_error(NULL, ncclInvalidArgument, "ncclCommInitAll: device %d does not exist "
                          "(%d emulated devices)", device, emu_device_count());
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) return res;
    emu_lock();
    res = init_comm(comm, 1, id, 0, NULL, device);
    emu_unlock();
    return res;
}

// ================================================================ the API: state of a communicator

// Distinct streams holding this comm's unfinished ops.
static int unfinished_streams(struct ncclComm *comm, cudaStream_t *streams, int max) {
    int n = 0;
    for (queued_op *o = comm->ops; o; o = o->next) {
        if (o->finished) continue;
        bool seen = false;
        for (int i = 0; i < n; i++) seen = seen || streams[i] == o->stream;
        if (!seen && n < max) streams[n++] = o->stream;
    }
    return n;
}

// Non-blocking finalize: give every stream that holds our work a step.
// The streams run their work when queried; we must not hold the lock then.
static ncclResult_t finalize_step(struct ncclComm *comm) {
    cudaStream_t streams[16];
    int n = unfinished_streams(comm, streams, 16);
    for (int i = 0; i < n; i++) {
        emu_unlock();
        cudaStreamQuery(streams[i]);
        emu_lock();
    }
    if (comm->error != ncclSuccess) return comm->error;
    return comm->ops_unfinished > 0 ? ncclInProgress : ncclSuccess;
}

static ncclResult_t finalize_blocking(struct ncclComm *comm) {
    cudaStream_t streams[16];
    while (comm->error == ncclSuccess && comm->ops_unfinished > 0) {
        if (unfinished_streams(comm, streams, 16) == 0) break;
        emu_unlock();
        cudaError_t err = cudaStreamSynchronize(streams[0]);
        emu_lock();
        if (err != cudaSuccess && comm->error == ncclSuccess)
            return call_error(comm, ncclUnhandledCudaError, "ncclCommFinalize: the stream with "
                              "this communicator's work failed: %s", cudaGetErrorString(err));
    }
    return comm->error;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError)
        return call_error(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    emu_lock();
    ncclResult_t res = ncclSuccess;
    if (!comm || comm->magic != COMM_MAGIC) {
        res = call_error(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: comm is not a live communicator");
    } else if (comm->join_stage != JOIN_DONE && comm->error == ncclSuccess) {
        *asyncError = join_step(comm);
        if (*asyncError != ncclInProgress) comm->call_in_progress = NULL;
    } else if (comm->finalizing && !comm->finalized && comm->error == ncclSuccess) {
        *asyncError = finalize_step(comm);
        if (*asyncError != ncclInProgress) {
            comm->finalized = comm->error == ncclSuccess;
            comm->call_in_progress = NULL;
        }
    } else {
        // The enqueueing call that answered ncclInProgress has finished;
        // report what the queued work has found so far.
        comm->call_in_progress = NULL;
        *asyncError = comm->error;
    }
    if (res == ncclSuccess && *asyncError != ncclSuccess && *asyncError != ncclInProgress)
        snprintf(last_error, sizeof last_error, "%s", comm->error_text);
    emu_unlock();
    return res;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    emu_lock();
    ncclResult_t res = check_comm_for_work("ncclCommFinalize", comm);
    if (res == ncclSuccess) {
        comm->finalizing = true;
        if (comm->blocking) {
            res = finalize_blocking(comm);
            comm->finalized = res == ncclSuccess;
        } else {   // the work completes in ncclCommGetAsyncError
            comm->call_in_progress = "ncclCommFinalize";
            res = ncclInProgress;
        }
    }
    emu_unlock();
    return res;
}

static void leave_segment(struct ncclComm *comm, int state) {
    if (!comm->registered) {
        if (comm->header) join_fail(comm, ncclRemoteError, "rank %d gave up on the communicator "
                                    "before it had joined", comm->rank);
        return;
    }
    shm_rank *me = rank_record(comm, comm->rank);
    int32_t joined = RANK_JOINED;   // a rank that failed keeps saying why
    atomic_compare_exchange_strong_explicit(&me->state, &joined, state, memory_order_release,
                                            memory_order_relaxed);
    if (comm->join_stage != JOIN_DONE) {
        if (state == RANK_ABORTED)
            join_fail(comm, ncclRemoteError, "rank %d aborted the communicator during "
                      "ncclCommInitRank", comm->rank);
        unlink_segment(comm);
    }
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    emu_lock();
    ncclResult_t res = check_comm("ncclCommDestroy", comm);
    if (res == ncclSuccess) {
        // NCCL finalizes a communicator that was not finalized: queued work
        // is completed first.
        if (!comm->finalized && comm->error == ncclSuccess && comm->join_stage == JOIN_DONE)
            finalize_blocking(comm);
        emu_stream_discard_if(op_belongs_to, comm);   // failed work the stream still holds
        leave_segment(comm, RANK_LEFT);
        free_comm(comm);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    emu_lock();
    ncclResult_t res = ncclSuccess;
    if (comm->magic != COMM_MAGIC) {
        res = call_error(NULL, ncclInvalidArgument, "ncclCommAbort: comm is not a live communicator");
    } else {
        emu_stream_discard_if(op_belongs_to, comm);   // queued work will never run
        leave_segment(comm, RANK_ABORTED);
        free_comm(comm);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    emu_lock();
    ncclResult_t res = check_comm("ncclCommCount", comm);
    if (res == ncclSuccess && !count)
        res = call_error(comm, ncclInvalidArgument, "ncclCommCount: count is NULL");
    if (res == ncclSuccess) *count = comm->nranks;
    emu_unlock();
    return res;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    emu_lock();
    ncclResult_t res = check_comm("ncclCommCuDevice", comm);
    if (res == ncclSuccess && !device)
        res = call_error(comm, ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    if (res == ncclSuccess) *device = comm->device;
    emu_unlock();
    return res;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    emu_lock();
    ncclResult_t res = check_comm("ncclCommUserRank", comm);
    if (res == ncclSuccess && !rank)
        res = call_error(comm, ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    if (res == ncclSuccess) *rank = comm->rank;
    emu_unlock();
    return res;
}

// ================================================================ the API: checking arguments

static ncclResult_t check_type_and_op(const char *api, const struct ncclComm *comm, ncclDataType_t t,
                                      bool reduces, ncclRedOp_t op) {
    if ((int)t < 0 || t > ncclBfloat16)
        return call_error(comm, ncclInvalidArgument, "%s: datatype %d is not supported by the "
                          "emulated NCCL (int8 ... bfloat16; no fp8)", api, (int)t);
    if (reduces && ((int)op < 0 || op > ncclAvg))
        return call_error(comm, ncclInvalidArgument, "%s: op %d is not one of ncclSum, ncclProd, "
                          "ncclMax, ncclMin, ncclAvg", api, (int)op);
    return ncclSuccess;
}

static ncclResult_t check_rank_arg(const char *api, const struct ncclComm *comm, const char *what, int r) {
    if (r < 0 || r >= comm->nranks)
        return call_error(comm, ncclInvalidArgument, "%s: %s %d is not a rank of this communicator "
                          "(0 to %d)", api, what, r, comm->nranks - 1);
    return ncclSuccess;
}

// NCCL reads and writes buffers from the GPU: they must be device memory,
// on the communicator's device.
static ncclResult_t check_buffer(const char *api, const struct ncclComm *comm, const char *name,
                                 const void *ptr, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
    if (!ptr) return call_error(comm, ncclInvalidArgument, "%s: %s is NULL", api, name);
    char what[96];
    snprintf(what, sizeof what, "%s %s", api, name);
    switch (emu_memory_kind_of(ptr, bytes, what)) {
    case EMU_HOST:
        return call_error(comm, ncclInvalidArgument, "%s: %s is host memory; NCCL needs device "
                          "memory (cudaMalloc)", api, name);
    case EMU_HOST_PINNED:
        return call_error(comm, ncclInvalidArgument, "%s: %s is pinned host memory "
                          "(cudaMallocHost); NCCL needs device memory (cudaMalloc)", api, name);
    default: break;
    }
    int owner = emu_device_of(ptr);
    if (owner != comm->device)
        return call_error(comm, ncclInvalidArgument, "%s: %s lives on emulated device %d, but the "
                          "communicator uses device %d", api, name, owner, comm->device);
    return ncclSuccess;
}

static bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

// NCCL allows exactly two layouts: separate buffers, or the documented
// in-place position. Anything else would give wrong numbers on a GPU.
static ncclResult_t check_placement(const char *api, const struct ncclComm *comm, const part *p) {
    size_t size = dtype_size(p->dtype), n = p->count * size, all = n * (size_t)comm->nranks;
    const unsigned char *send = p->send, *recv = p->recv;
    switch (p->kind) {
    case KIND_ALL_GATHER:
        if (send != recv + (size_t)comm->rank * n && ranges_overlap(send, n, recv, all))
            return call_error(comm, ncclInvalidArgument, "%s: sendbuff overlaps recvbuff; in place "
                              "needs sendbuff == recvbuff + rank * sendcount", api);
        return ncclSuccess;
    case KIND_REDUCE_SCATTER:
        if (recv != send + (size_t)comm->rank * n && ranges_overlap(send, all, recv, n))
            return call_error(comm, ncclInvalidArgument, "%s: recvbuff overlaps sendbuff; in place "
                              "needs recvbuff == sendbuff + rank * recvcount", api);
        return ncclSuccess;
    case KIND_BROADCAST:
    case KIND_REDUCE:
        if (comm->rank != p->root) return ncclSuccess;   // only the root uses both
        // fall through
    default:
        if (send != recv && ranges_overlap(send, n, recv, n))
            return call_error(comm, ncclInvalidArgument, "%s: sendbuff and recvbuff overlap; they "
                              "must be equal (in place) or apart", api);
        return ncclSuccess;
    }
}

static ncclResult_t check_collective(const char *api, const struct ncclComm *comm, const part *p) {
    ncclResult_t res = check_type_and_op(api, comm, p->dtype, kind_reduces(p->kind), p->op);
    if (res == ncclSuccess && kind_has_root(p->kind)) res = check_rank_arg(api, comm, "root", p->root);
    if (res != ncclSuccess) return res;
    size_t size = dtype_size(p->dtype), nranks = (size_t)comm->nranks;
    if (p->count > SIZE_MAX / size / nranks)
        return call_error(comm, ncclInvalidArgument, "%s: count %zu is too large", api, p->count);
    size_t n = p->count * size, send_bytes = n, recv_bytes = n;
    bool root = comm->rank == p->root;
    if (p->kind == KIND_ALL_GATHER) recv_bytes = n * nranks;
    if (p->kind == KIND_REDUCE_SCATTER) send_bytes = n * nranks;
    if (p->kind == KIND_BROADCAST && !root) send_bytes = 0;   // only the root's is read
    if (p->kind == KIND_REDUCE && !root) recv_bytes = 0;      // only the root's is written
    if ((res = check_buffer(api, comm, "sendbuff", p->send, send_bytes)) != ncclSuccess) return res;
    if ((res = check_buffer(api, comm, "recvbuff", p->recv, recv_bytes)) != ncclSuccess) return res;
    return p->count ? check_placement(api, comm, p) : ncclSuccess;
}

// ================================================================ the API: queueing work

// After a call's checks: give it its number, then queue it (or keep it for
// the group's end).
static ncclResult_t submit(struct ncclComm *comm, cudaStream_t stream, part *p) {
    shm_rank *me = rank_record(comm, comm->rank);
    if (p->kind == KIND_SEND) {
        p->seq = ++comm->sends_issued[p->peer];
        p->phase = SEND_TURN;
        atomic_store_explicit(&channel(comm, comm->rank, p->peer)->send_issued, p->seq, memory_order_relaxed);
    } else if (p->kind == KIND_RECV) {
        p->seq = ++comm->recvs_issued[p->peer];
        p->phase = RECV_TURN;
        atomic_store_explicit(&channel(comm, p->peer, comm->rank)->recv_issued, p->seq, memory_order_relaxed);
    } else {
        p->seq = ++comm->collectives_issued;
        p->phase = COLL_TURN;
        atomic_store_explicit(&me->issued, p->seq, memory_order_relaxed);
    }
    if (group_depth > 0) {
        group_add(comm, stream, p);
        return ncclSuccess;
    }
    ncclResult_t res = enqueue_op(comm, stream, kind_name(p->kind), p, 1);
    if (res != ncclSuccess || comm->blocking) return res;
    // A non-blocking communicator may answer "in progress" for any call;
    // the emulator always does, so programs that forget to poll are caught.
    comm->call_in_progress = kind_name(p->kind);
    return ncclInProgress;
}

static ncclResult_t collective(int kind, const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                               cudaStream_t stream) {
    const char *api = kind_name(kind);
    part p = {.kind = kind, .send = sendbuff, .recv = recvbuff, .count = count, .dtype = datatype,
              .op = op, .root = root, .peer = -1};
    emu_lock();
    ncclResult_t res = check_comm_for_work(api, comm);
    if (res == ncclSuccess) res = check_collective(api, comm, &p);
    if (res == ncclSuccess) res = submit(comm, stream, &p);
    emu_unlock();
    return res;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return collective(KIND_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return collective(KIND_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

static ncclResult_t point_to_point(int kind, void *buf, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
    const char *api = kind_name(kind);
    emu_lock();
    ncclResult_t res = check_comm_for_work(api, comm);
    if (res == ncclSuccess) res = check_type_and_op(api, comm, datatype, false, ncclSum);
    if (res == ncclSuccess) res = check_rank_arg(api, comm, "peer", peer);
    if (res == ncclSuccess && count > SIZE_MAX / dtype_size(datatype))
        res = call_error(comm, ncclInvalidArgument, "%s: count %zu is too large", api, count);
    if (res == ncclSuccess)
        res = check_buffer(api, comm, kind == KIND_SEND ? "sendbuff" : "recvbuff", buf,
                           count * dtype_size(datatype));
    if (res == ncclSuccess) {
        part p = {.kind = kind, .count = count, .dtype = datatype, .op = ncclSum, .root = -1,
                  .peer = peer};
        if (kind == KIND_SEND) p.send = buf;
        else p.recv = buf;
        res = submit(comm, stream, &p);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return point_to_point(KIND_SEND, (void *)(uintptr_t)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return point_to_point(KIND_RECV, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    emu_lock();
    group_depth++;
    emu_unlock();
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    emu_lock();
    if (group_depth == 0) {
        emu_unlock();
        return call_error(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    }
    ncclResult_t res = ncclSuccess;
    if (--group_depth == 0 && group_count > 0) {
        bool *queued = xcalloc((size_t)group_count, sizeof *queued);
        bool in_progress = false;
        for (int i = 0; i < group_count; i++) {
            if (queued[i]) continue;
            ncclResult_t r = group_flush_one(i, queued);
            if (r != ncclSuccess && res == ncclSuccess) res = r;
        }
        // Every non-blocking communicator of the group now answers "in
        // progress" until ncclCommGetAsyncError has been asked.
        for (int i = 0; i < group_count; i++) {
            struct ncclComm *comm = group_calls[i].comm;
            if (comm->blocking) continue;
            comm->call_in_progress = "ncclGroupEnd";
            in_progress = true;
        }
        free(queued);
        free(group_calls);
        group_calls = NULL;
        group_count = group_capacity = 0;
        if (res == ncclSuccess && in_progress) res = ncclInProgress;
    }
    emu_unlock();
    return res;
}
