// emu_internal.h - every name one file of the emulated GPU takes from another.
//
// Not for course code: programs see only the drop-in headers in
// emu/include/ (cuda_runtime.h, cublas_v2.h, nccl.h, ...). The library is
// built in layers; each file calls only into the files below it:
//
//   nccl_split.c     ncclCommSplit, built on the public calls below
//   nccl_comm.c      communicators: ids, the shared segment, joining, finalize, destroy
//   nccl_queue.c     the work calls (ncclAllReduce, ncclSend, groups): checked, queued
//   nccl_collective.c, nccl_p2p.c   what a queued collective / send / receive does
//   nccl_peers.c     waiting for the other ranks, and noticing when one is gone
//   nccl_reduce.c    element types and the reductions
//   nccl_error.c     the emulated NCCL's messages, errors and names
//   cublas.c         GEMMs
//   graph.c          CUDA graphs: stream capture, instantiate, launch, update
//   launch.c         kernels: a grid run block by block, threads as fibers
//   copy.c           copies, fills and frees: memory operations that order with the queue
//   event.c          events: marks that the host and other streams wait for
//   race.c           data races in kernels and between queued operations
//   stream.c         streams: the queue that runs work as late as it may, capture
//   memory.c         device memory, protected from host code; the fault handler
//   fiber.c          the user-level threads (context switch)
//   order.c          schedules, and the vector clocks of happens-before
//   core.c           messages, the lock, errors, devices, who runs now
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cuda_runtime_api.h"
#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

// ================================================================ core.c

// ---------------------------------------------------------------- messages
// Every message of the emulator starts with "emulated GPU: " (or
// "emulated NCCL: ...") so a student can tell it from the program's own.
__attribute__((format(printf, 1, 2))) void emu_warn(const char *fmt, ...);
// Print the message, then exit(1) (never returns). For misuse that a real
// GPU would turn into a crash, a hang or silently wrong numbers.
__attribute__((format(printf, 1, 2), noreturn)) void emu_fatal(const char *fmt, ...);

// Seconds on a monotonic clock.
double emu_now(void);

// The timeout for anything the emulator waits for that depends on another
// process (EMU_TIMEOUT seconds, default 300).
double emu_timeout_s(void);

// One lock serialises the emulator: API calls from several host threads and
// the execution of queued work. Work runs on the host thread that waits
// for it. Long waits for other processes (NCCL) release it in between.
// It is recursive: a call that holds it may call others that take it.
void emu_lock(void);
void emu_unlock(void);

// ---------------------------------------------------------------- errors
// The result of a runtime call, remembered for cudaGetLastError.
cudaError_t emu_set_error(cudaError_t err);

// cudaSuccess, or cudaErrorInitializationError in a child forked after the
// parent used CUDA (a CUDA context does not survive fork). Every entry
// point that needs a device calls this first.
cudaError_t emu_ready(void);

// ---------------------------------------------------------------- devices
int emu_device_count(void);       // EMU_GPUS (default 8), after CUDA_VISIBLE_DEVICES
int emu_current_device(void);     // cudaSetDevice's choice for this host thread
int emu_physical_device(int d);   // the index before CUDA_VISIBLE_DEVICES remapping
cudaError_t emu_check_device(int d);   // emu_ready, and d names a visible device
size_t emu_device_memory_bytes(void);  // of each device (EMU_MEMORY_GB, default 16)

// ---------------------------------------------------------------- who runs now
// launch.c says which kernel this host thread runs (NULL: host code again);
// emu_self (emu_kernel_abi.h) says which of its threads. Messages and the
// fault handler read them.
typedef struct emu_kernel_site {
    const char *name, *file; // the kernel, and where it was launched
    int line;
} emu_kernel_site;

void emu_set_running_kernel(const emu_kernel_site *site);
const emu_kernel_site *emu_running_kernel(void);
// The queued operation this host thread runs now (NULL: none), with its
// place in the order of operations (order.c), set by stream.c.
typedef struct emu_clock emu_clock;
typedef struct emu_running_op {
    uint32_t serial;        // its number among all operations of this process
    int stream;             // its stream's number in this process
    uint64_t seq;           // its position on that stream
    const emu_clock *clock; // what happens before it
    const char *what;       // "cudaMemcpyAsync", a kernel's name, ...
    const char *stream_name;
} emu_running_op;

void emu_set_current_op(const emu_running_op *op);
const emu_running_op *emu_current_op(void);
// The running kernel's name (NULL outside kernels).
const char *emu_current_kernel(void);
// "kernel K (launched at F:L), block (x,y,z), thread (x,y,z)", or "host code".
void emu_kernel_thread_name(char *buf, size_t size);

// ================================================================ order.c
// Which orders a run may choose, and the vector clocks that say which
// operations are ordered whatever the choice.

struct emu_clock {
    uint64_t *t; // t[k]: the last operation of stream k that happens before
    int n;
};
void emu_clock_join(emu_clock *dst, const emu_clock *src);
void emu_clock_copy(emu_clock *dst, const emu_clock *src);
void emu_clock_set(emu_clock *c, int stream, uint64_t seq);
// Whether operation `seq` of `stream` happens before whatever has clock c.
bool emu_clock_covers(const emu_clock *c, int stream, uint64_t seq);
void emu_clock_free(emu_clock *c);
emu_clock *emu_host_clock(void); // what the host has waited for

typedef enum { EMU_SCHEDULE_LAZY, EMU_SCHEDULE_EAGER, EMU_SCHEDULE_RANDOM } emu_schedule_kind;
typedef enum { EMU_ORDER_FORWARD, EMU_ORDER_REVERSE, EMU_ORDER_SHUFFLED } emu_order_kind;
emu_schedule_kind emu_schedule(void); // EMU_SCHEDULE
emu_order_kind emu_order(void);       // EMU_ORDER
uint64_t emu_schedule_random(void);   // the random numbers of each, seeded as the variable says
uint64_t emu_order_random(void);

// What the race checker reads about the block that runs now (each thread's
// emu_thread_view points here); launch.c keeps it current.
typedef struct emu_block_info {
    uint64_t serial;        // this block's number among all blocks this process ran
    uint64_t first_thread;  // the grid-wide number of its thread 0
    unsigned threads;       // threads per block
    unsigned barriers;      // __syncthreads the block has completed
    unsigned char *shared;  // its shared memory: [static part | dynamic part]
    size_t shared_bytes;
    const emu_running_op *op; // the kernel's queued operation
    bool race_check;          // whether race.c checks this launch (emu_race_check_launch)
} emu_block_info;

// ================================================================ launch.c
unsigned long long emu_kernel_launches(void); // kernels launched (not captured) so far

// ================================================================ race.c
// Data races (and misaligned accesses) in kernels, found as they run, and
// between queued operations. Copies, GEMMs and NCCL calls tell it which
// device memory they read or write (the running operation's):
void emu_race_range(const void *p, size_t bytes, bool write);
// Whether to check this launch of a kernel (EMU_RACECHECK: every launch,
// or the first 16 and one in 16 after, or none).
bool emu_race_check_launch(const char *kernel);

// ================================================================ fiber.c
// User-level threads for a kernel's CUDA threads.

#define EMU_FIBER_MAX 1024 // one per thread of the largest block

typedef struct emu_fiber emu_fiber;

emu_fiber *emu_fiber_host(void);            // this host thread's own context
emu_fiber *emu_fiber_for_thread(int index); // the stack thread `index` of a block runs on
// Make f start entry(arg) at its next switch_to (entry must never return).
void emu_fiber_prepare(emu_fiber *f, void (*entry)(void *), void *arg);
// Save the current context in `from`, continue `to`. from_finished: `from`
// will never run again (its thread has ended).
void emu_fiber_switch(emu_fiber *from, emu_fiber *to, bool from_finished);
// After a block that used stacks 0..used-1: stop with a message if one overflowed.
void emu_fiber_check_stacks(int used, const char *kernel);
// Whether addr lies in the guard page below a fiber's stack (an overflow).
bool emu_fiber_stack_guard(const void *addr);
// Where this host thread's kernel-thread stacks lie (all of them, in one region).
void emu_fiber_stacks(const char **lo, const char **hi);

// ================================================================ memory.c

// Device allocations are inaccessible to host code: they are mapped
// PROT_NONE except while the emulator itself runs queued work (kernels,
// copies, GEMMs, collectives). Code in the library that reads or writes
// device memory outside that window brackets the access:
void emu_device_access_begin(void); // nests
void emu_device_access_end(void);

typedef enum { EMU_HOST, EMU_HOST_PINNED, EMU_DEVICE } emu_memory_kind;
// Where [p, p + bytes) lies. Device memory must lie inside one live
// allocation; a range that starts in one and runs past its end is
// reported (emu_fatal) with what is wrong, naming `what`.
emu_memory_kind emu_memory_kind_of(const void *p, size_t bytes, const char *what);
// The device (as numbered by cudaSetDevice in this process) that owns a
// device pointer (-1 for host memory).
int emu_device_of(const void *p);

// cudaFree in two steps, so that copy.c can wait for the device between
// them: is p a live pointer cudaMalloc returned (else a message and
// cudaErrorInvalidValue), and on which device; then release it.
cudaError_t emu_allocation_to_free(const void *p, int *device);
void emu_allocation_release(const void *p);
// Forget pinned host memory: owned (cudaMallocHost, freed here) or registered.
cudaError_t emu_pinned_remove(void *p, bool owned);

// For the race checker (race.c): the live allocation that holds p, with
// its shadow (EMU_RACE_SHADOW_BYTES per 4 bytes, zero when new).
#define EMU_RACE_SHADOW_BYTES 32
typedef struct emu_device_span {
    char *base;
    size_t size;
    void *shadow;
} emu_device_span;
bool emu_device_span_of(const void *p, emu_device_span *out);
// Neither device memory (nor its guard pages) nor pinned host memory.
bool emu_is_host_memory(const void *p);

// After a kernel: did it write into the slack around an allocation?
void emu_check_redzones(const char *kernel);
// The fault handler is installed at start-up; every host thread that runs
// kernels calls this too, for the signal stack a stack overflow needs.
void emu_install_fault_handler(void);

// ================================================================ stream.c

// Work queued on a stream runs only when someone waits for it: a
// synchronize, an event that another stream or the host waits for, the
// legacy default stream's implicit ordering, a query (one step per call).
// Kernels, copies and libraries (cuBLAS, NCCL) queue their work as functions:
typedef enum {
    EMU_OP_DONE,    // finished: the stream moves on
    EMU_OP_PENDING, // waits for another process; call again later
    EMU_OP_FAILED,  // failed: emu_op_fail_reason() says why; the stream stops here
} emu_op_status;

typedef emu_op_status (*emu_op_fn)(void *state);

// Queue fn(state) on stream s (0 = the legacy default stream). `what` names
// it in messages ("ncclAllReduce"). free_state (may be NULL) is called once
// when the op is retired or discarded. Device memory is accessible while
// fn runs. *position (position may be NULL) gets its number on the stream,
// for emu_stream_wait. The stream owns `state` from this call on: when the
// call fails (cudaErrorInvalidResourceHandle for a destroyed or unknown
// stream) it has already called free_state. While s is captured (graph.c)
// the op becomes a node of the graph instead (*position 0), if its flags
// say it may run again and again; otherwise the capture fails.
enum { EMU_OP_REPLAYABLE = 1 }; // fn(state) may run any number of times
cudaError_t emu_stream_enqueue(cudaStream_t s, const char *what, emu_op_fn fn, void *state,
                               void (*free_state)(void *state), uint64_t *position, unsigned flags);

// The host waits until operation `position` of s has run, and what it
// depends on (EMU_STREAM_ALL: everything queued on s so far). Errors are
// returned, and remembered for cudaGetLastError.
#define EMU_STREAM_ALL UINT64_MAX
cudaError_t emu_stream_wait(cudaStream_t s, uint64_t position, const char *call);
// The host waits for everything queued on a device (cudaDeviceSynchronize).
cudaError_t emu_device_wait(int device, const char *call);

// The device a stream belongs to (0 = the current device's legacy stream).
int emu_stream_device(cudaStream_t s);

// A queued op that returns EMU_OP_FAILED should first set the reason here
// (it is printed by the synchronize that meets it).
void emu_op_fail_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// An operation that does nothing (it only waits for what it depends on).
emu_op_status emu_done_at_once(void *state);

// For event.c, with the lock held: the stream a handle names (NULL if
// none); queue on it, also after operation after_seq of stream `after`
// (whose clock is after_clock) when after is given, returning the op's
// position and copying its clock to *clock (may be NULL); the host's waits
// for an op (wait_for blocks, poll runs one step and says cudaErrorNotReady);
// whether an op has run; references that keep a destroyed stream alive.
typedef struct CUstream_st emu_stream;
emu_stream *emu_stream_of(cudaStream_t handle);
uint64_t emu_stream_append(emu_stream *s, const char *what, emu_op_fn fn, void *state, void (*free_state)(void *),
                           emu_stream *after, uint64_t after_seq, const emu_clock *after_clock, emu_clock *clock);
cudaError_t emu_stream_wait_for(emu_stream *s, uint64_t seq, const char *call, const emu_clock *known);
cudaError_t emu_stream_poll(emu_stream *s, uint64_t seq, const char *call, const emu_clock *known);
bool emu_stream_reached(const emu_stream *s, uint64_t seq);
void emu_stream_hold(emu_stream *s);
void emu_stream_release(emu_stream *s);

// Stream capture, for graph.c: a graph is the list of operations a stream
// was given between cudaStreamBeginCapture and cudaStreamEndCapture. Nodes
// are shared (counted) between a graph, the executable graphs made of it
// and the launches still queued.
typedef struct emu_graph_node {
    int refs;
    const char *what;
    emu_op_fn fn;
    void *state;
    void (*free_state)(void *);
} emu_graph_node;

struct CUgraph_st {
    unsigned magic;
    emu_graph_node **nodes;
    int count, cap;
};

void emu_graph_node_release(emu_graph_node *n);
cudaError_t emu_stream_begin_capture(cudaStream_t s, struct CUgraph_st *g);
// The graph s was captured into (NULL: none); *failed: whether something
// could not be captured. end_capture also ends it.
struct CUgraph_st *emu_stream_end_capture(cudaStream_t s, bool *failed);
struct CUgraph_st *emu_stream_capture(cudaStream_t s, bool *failed);

// Turn every queued op for which match(state, owner) is true into a no-op
// (its free_state is called now): ncclCommAbort drops a communicator's
// unfinished work this way. match sees the state of every queued op of
// every stream - kernels and GEMMs too - so it must compare pointers
// only. A stream stopped by a failed op that is discarded runs on.
void emu_stream_discard_if(bool (*match)(void *state, void *owner), void *owner);

// ================================================================ the emulated NCCL (nccl_*.c)
// How it works is told at the top of nccl_comm.c. The types below are
// shared by its files: the segment that the ranks map, and this process's
// side of a communicator.

enum {
    EMU_NCCL_SLOT_BYTES = 256 * 1024,   // per rank: one chunk of a collective
    EMU_NCCL_ERROR_BYTES = 1024,
    // Scratch per communicator: the accumulator (up to 2 slots: 16-bit
    // values widen to float) and the result in the element type (1 slot).
    EMU_NCCL_SCRATCH_BYTES = 3 * EMU_NCCL_SLOT_BYTES,
    EMU_NCCL_SCRATCH_RESULT_AT = 2 * EMU_NCCL_SLOT_BYTES,
};
#define EMU_NCCL_COMM_MAGIC 0x4e43434cu      // marks a live struct ncclComm
#define EMU_NCCL_PREMUL_OPS 16                // ncclRedOpCreatePreMulSum ops a communicator may hold
#define EMU_NCCL_PID_CHECK_INTERVAL_S 0.05   // how often a waiting rank asks "is my peer alive?"

// ---------------------------------------------------------------- the shared segment
// Everything here lives in memory that several processes map. Fields that
// one rank writes and others read are atomics: the writer fills in data,
// then stores a counter with release order; a reader loads the counter with
// acquire order and may then read the data.

// What collective #seq asked of one rank.
typedef struct {
    _Atomic uint64_t seq; // the collective this describes; 0: none yet
    int32_t kind;
    int32_t dtype;
    int32_t op;           // -1 where the collective has no reduction
    int32_t root;         // -1 where the collective has no root
    uint64_t count;
} emu_nccl_descriptor;

enum emu_nccl_rank_state { RANK_ABSENT, RANK_JOINED, RANK_FAILED, RANK_ABORTED, RANK_LEFT };

typedef struct {
    _Alignas(64) _Atomic int32_t pid;   // claimed with compare-and-swap; 0: nobody yet
    int32_t device;                     // physical emulated device
    _Atomic int32_t state;              // enum emu_nccl_rank_state
    _Atomic int32_t last_kind;          // kind of the last collective finished here
    _Atomic uint64_t issued;            // collectives the program has called (for messages)
    _Atomic uint64_t completed;         // collectives finished
    _Atomic uint64_t arrived;           // barriers this rank has arrived at, ever
    emu_nccl_descriptor desc[2];        // collective k is described in desc[k % 2]
    char error[256];                    // why it failed (state RANK_FAILED)
} emu_nccl_rank;

typedef struct {
    _Alignas(64) _Atomic uint64_t send_issued; // ncclSend calls to this receiver (for messages)
    _Atomic uint64_t recv_issued;              // ncclRecv calls from this sender (for messages)
    _Atomic uint64_t send_posted;   // the message the sender describes next:
    uint64_t send_count;
    int32_t send_dtype;
    _Atomic uint64_t rejected;      // a message the receiver found mismatched, with
    uint64_t recv_count;            // what the receiver expected
    int32_t recv_dtype;
    _Atomic uint64_t acked;         // messages the receiver has taken completely
    _Alignas(64) _Atomic uint64_t written; // bytes ever put into the ring
    _Alignas(64) _Atomic uint64_t read;    // bytes ever taken out
} emu_nccl_channel;

enum { SETUP_NONE, SETUP_BUSY, SETUP_DONE };
enum { INIT_OK, INIT_WRITING_ERROR, INIT_FAILED };

typedef struct {
    _Atomic uint32_t setup;       // SETUP_*: exactly one rank fills in the header
    char magic[16];
    int32_t nranks;
    _Atomic int32_t joined;       // ranks registered so far
    _Atomic int32_t init_state;   // INIT_*: a rank that finds the join broken says why here
    int32_t init_error_code;
    char init_error[512];
} emu_nccl_header;

// ---------------------------------------------------------------- this process's side

enum emu_nccl_kind {
    KIND_ALL_REDUCE,
    KIND_BROADCAST,
    KIND_REDUCE,
    KIND_ALL_GATHER,
    KIND_REDUCE_SCATTER,
    KIND_SEND,
    KIND_RECV,
};

// Phases of the state machines. A collective: wait for its turn among this
// rank's collectives, publish the descriptor, agree, then per chunk fill /
// wait / take the result / wait. A send: wait its turn on the channel,
// describe, write, wait for the receiver's acknowledgement. A receive: wait
// its turn, match the sender's description, read.
enum emu_nccl_phase {
    COLL_TURN, COLL_AGREE, COLL_FILL, COLL_FILLED, COLL_DRAINED, COLL_FINISH,
    SEND_TURN, SEND_WRITE, SEND_ACK,
    RECV_TURN, RECV_MATCH, RECV_READ,
};

typedef enum { PART_DONE, PART_PENDING, PART_FAILED } emu_nccl_status;

// One call: a collective, a send or a receive. A group's calls become the
// parts of one queued operation.
typedef struct {
    int kind;
    const void *send;
    void *recv;
    size_t count;           // elements, as the program passed them
    ncclDataType_t dtype;
    ncclRedOp_t op;
    int root;               // collectives with a root
    int peer;               // send/recv
    uint64_t seq;           // collective #seq of the comm, or message #seq on the channel
    // progress
    int phase;
    size_t chunk, nchunks, chunk_elems;
    uint64_t barrier;       // the barrier this rank waits at
    size_t moved;           // send/recv: bytes so far
    bool done, progressed;
    bool loss_seen;         // a peer looked lost once (see emu_nccl_peer_is_lost)
    double stalled_since;   // last time it moved forward (for the timeout)
    double last_pid_check;
} emu_nccl_part;

// What is queued on a stream: one or more parts of one communicator.
typedef struct emu_nccl_op {
    struct ncclComm *comm;  // NULL once the comm is gone (then only the free may run)
    cudaStream_t stream;
    bool started, finished;
    int nparts;
    emu_nccl_part *parts;
    struct emu_nccl_op *next, *prev; // the comm's list of ops the stream still holds
} emu_nccl_op;

enum emu_nccl_join_stage { JOIN_SETUP, JOIN_REGISTER, JOIN_WAIT_ALL, JOIN_DONE };

struct ncclComm {
    uint32_t magic;
    int rank, nranks;
    int device;             // as cudaSetDevice numbers it
    int physical_device;    // before CUDA_VISIBLE_DEVICES: what "duplicate GPU" compares
    bool blocking;

    // the shared segment
    char shm_name[96];
    int fd;
    void *base;
    size_t bytes;
    emu_nccl_header *header;
    emu_nccl_rank *ranks;
    emu_nccl_channel *channels;
    unsigned char *rings, *slots;
    size_t ring_bytes;

    // joining
    int join_stage;
    bool registered, unlinked;
    double join_started, last_pid_check;

    // the state the API reports
    const char *call_in_progress; // non-blocking: the call that returned ncclInProgress
    bool finalizing, finalized;
    ncclResult_t error;           // sticky: the first failure
    char error_text[EMU_NCCL_ERROR_BYTES];

    // sequence numbers: given out at call time, completed by the queued ops
    uint64_t collectives_issued, collectives_done, barriers;
    uint64_t *sends_issued, *sends_done; // per peer
    uint64_t *recvs_issued, *recvs_done;

    emu_nccl_op *ops;       // queued, not yet freed by the stream
    int ops_unfinished;
    void *scratch;          // where reductions accumulate

    // ncclRedOpCreatePreMulSum's ops: op ncclNumOps + k multiplies each
    // rank's input by that rank's scalar, then sums.
    struct {
        bool live;
        ncclDataType_t dtype;
        double scalar;             // ncclScalarHostImmediate
        const void *device_scalar; // ncclScalarDevice: read when the collective runs
    } premul[EMU_NCCL_PREMUL_OPS];
};

// The segment's parts, for rank r / the ordered pair (from, to).
static inline emu_nccl_rank *emu_nccl_rank_record(struct ncclComm *comm, int r) { return &comm->ranks[r]; }
static inline emu_nccl_channel *emu_nccl_channel_of(struct ncclComm *comm, int from, int to) {
    return &comm->channels[(size_t)from * (size_t)comm->nranks + (size_t)to];
}
static inline unsigned char *emu_nccl_ring_of(struct ncclComm *comm, int from, int to) {
    return comm->rings + ((size_t)from * (size_t)comm->nranks + (size_t)to) * comm->ring_bytes;
}
static inline unsigned char *emu_nccl_slot_of(struct ncclComm *comm, int r) {
    return comm->slots + (size_t)r * EMU_NCCL_SLOT_BYTES;
}

// ---------------------------------------------------------------- nccl_error.c
// An error found while the program calls us: remembered for
// ncclGetLastError, printed, returned.
__attribute__((format(printf, 3, 4)))
ncclResult_t emu_nccl_call_error(const struct ncclComm *comm, ncclResult_t code, const char *fmt, ...);
// An error of the communicator itself (found by a queued operation, or by a
// non-blocking join): sticky, printed once, and published in the segment so
// that peers waiting for this rank learn why it stopped.
__attribute__((format(printf, 3, 4)))
void emu_nccl_comm_fail(struct ncclComm *comm, ncclResult_t code, const char *fmt, ...);
void emu_nccl_set_last_error(const char *text);
// Every check a call on `comm` makes first; and a call that queues work
// also needs a healthy, unfinalized comm.
ncclResult_t emu_nccl_check_comm(const char *api, const struct ncclComm *comm);
ncclResult_t emu_nccl_check_comm_for_work(const char *api, const struct ncclComm *comm);
// The text after "emulated NCCL: ", for quoting one message in another.
const char *emu_nccl_without_prefix(const char *text);
__attribute__((format(printf, 3, 4))) void emu_nccl_appendf(char *buf, size_t size, const char *fmt, ...);
void *emu_nccl_calloc(size_t n, size_t size); // exits with a message when memory runs out
void *emu_nccl_realloc(void *p, size_t bytes);

const char *emu_nccl_kind_name(int kind);  // "ncclAllReduce"
bool emu_nccl_kind_reduces(int kind);
bool emu_nccl_kind_has_root(int kind);
// "ncclAllReduce(count 1024, float32, sum)"
void emu_nccl_describe_call(char *buf, size_t size, int kind, uint64_t count, int dtype, int op, int root);
// "collective #7 ncclAllReduce(...)" or "ncclSend(...), message #3 from rank 0 to rank 1".
void emu_nccl_describe_part(char *buf, size_t size, const struct ncclComm *comm, const emu_nccl_part *p);

// ---------------------------------------------------------------- nccl_reduce.c
size_t emu_nccl_dtype_size(ncclDataType_t t); // 0 for a type the emulator does not know
// A value of type t at p, as a double (for the scalar of a PreMulSum op).
double emu_nccl_value_at(const void *p, ncclDataType_t t);
// x[i] *= scalar for n elements of type t (16-bit floats: in float, rounded once).
void emu_nccl_premultiply(void *x, size_t n, ncclDataType_t t, double scalar);
// dst = slot 0 OP slot 1 OP ... (n elements at `offset` of each rank's
// slot), in rank order, accumulated in comm's scratch.
void emu_nccl_reduce_slots(struct ncclComm *comm, const emu_nccl_part *p, size_t offset, size_t n, void *dst);

// ---------------------------------------------------------------- nccl_peers.c
bool emu_nccl_process_is_gone(pid_t pid);
void emu_nccl_pause(long *delay_ns); // 50 us, growing to 0.5 ms
void emu_nccl_progressed(emu_nccl_part *p);
bool emu_nccl_stalled_too_long(const emu_nccl_part *p);
bool emu_nccl_time_to_check_pids(emu_nccl_part *p);
// Whether rank r will never get to where p waits for it (then the comm has failed).
bool emu_nccl_peer_is_lost(struct ncclComm *comm, emu_nccl_part *p, int r, bool check_pid);
// A part waiting for this rank's previous operation: pending, or failed after the timeout.
emu_nccl_status emu_nccl_wait_for_turn(struct ncclComm *comm, emu_nccl_part *p);

// ---------------------------------------------------------------- nccl_collective.c, nccl_p2p.c
emu_nccl_status emu_nccl_progress_collective(struct ncclComm *comm, emu_nccl_part *p);
emu_nccl_status emu_nccl_progress_send(struct ncclComm *comm, emu_nccl_part *p);
emu_nccl_status emu_nccl_progress_recv(struct ncclComm *comm, emu_nccl_part *p);

// ---------------------------------------------------------------- nccl_queue.c
// For emu_stream_discard_if: is this queued state one of comm's ops?
bool emu_nccl_op_belongs_to(void *state, void *comm);
// This host thread's group (ncclGroupStart/End are in nccl_comm.c): how
// deep in groups it is; enter; leave, queueing the group's calls at the
// outermost end.
int emu_nccl_group_depth(void);
void emu_nccl_group_enter(void);
ncclResult_t emu_nccl_group_leave(void);

#ifdef __cplusplus
}
#endif
#endif
