// emu_internal.h - what the parts of the emulated GPU share with each other.
//
// Not for course code: programs see only the drop-in headers in
// emu/include/ (cuda_runtime.h, cublas_v2.h, nccl.h, ...). The library is
// split by concern:
//   device.c  devices, device memory (protected from host code), errors
//   stream.c  streams and events: the queue that runs work as late as it may
//   launch.c  kernels: a grid run block by block, threads as fibers
//   fiber.c   the user-level threads (context switch)
//   cublas.c  GEMMs
//   nccl.c    communicators between processes, in shared memory
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- messages
// Every message of the emulator starts with "emulated GPU: " (or
// "emulated NCCL: ...") so a student can tell it from the program's own.
__attribute__((format(printf, 1, 2))) void emu_warn(const char *fmt, ...);
// Print the message, then exit(1) (never returns). For misuse that a real
// GPU would turn into a crash, a hang or silently wrong numbers.
__attribute__((format(printf, 1, 2), noreturn)) void emu_fatal(const char *fmt, ...);

// The result of a runtime call, remembered for cudaGetLastError.
cudaError_t emu_set_error(cudaError_t err);

// Seconds on a monotonic clock.
double emu_now(void);

// The timeout for anything the emulator waits for that depends on another
// process (EMU_TIMEOUT seconds, default 300).
double emu_timeout_s(void);

// ---------------------------------------------------------------- the global lock
// One lock serialises the emulator: API calls from several host threads and
// the execution of queued work. Work runs on the host thread that waits
// for it. Long waits for other processes (NCCL) release it in between.
void emu_lock(void);
void emu_unlock(void);

// ---------------------------------------------------------------- devices
int emu_device_count(void);     // EMU_GPUS (default 8), after CUDA_VISIBLE_DEVICES
int emu_current_device(void);   // cudaSetDevice's choice for this host thread
int emu_physical_device(int d); // the index before CUDA_VISIBLE_DEVICES remapping

// ---------------------------------------------------------------- device memory
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

// ---------------------------------------------------------------- streams
// Work queued on a stream runs only when someone waits for it: a
// synchronize, an event that another stream or the host waits for, the
// legacy default stream's implicit ordering, a query (one step per call).
// Libraries (cuBLAS, NCCL) queue their work as host functions:
typedef enum {
    EMU_OP_DONE,     // finished: the stream moves on
    EMU_OP_PENDING,  // waits for another process; call again later
    EMU_OP_FAILED,   // failed: emu_op_fail_reason() says why; the stream stops here
} emu_op_status;

typedef emu_op_status (*emu_op_fn)(void *state);

// Queue fn(state) on stream s (0 = the legacy default stream). `what` names
// it in messages ("ncclAllReduce"). free_state (may be NULL) is called once
// when the op is retired or discarded. Device memory is accessible while
// fn runs. The stream owns `state` from this call on: when the call fails
// (cudaErrorInvalidResourceHandle for a destroyed or unknown stream) it
// has already called free_state.
cudaError_t emu_stream_enqueue(cudaStream_t s, const char *what, emu_op_fn fn, void *state,
                               void (*free_state)(void *state));

// The device a stream belongs to (0 = the current device's legacy stream).
int emu_stream_device(cudaStream_t s);

// A queued op that returns EMU_OP_FAILED should first set the reason here
// (it is printed by the synchronize that meets it).
void emu_op_fail_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Turn every queued op for which match(state, owner) is true into a no-op
// (its free_state is called now): ncclCommAbort drops a communicator's
// unfinished work this way. match sees the state of every queued op of
// every stream - kernels and GEMMs too - so it must compare pointers
// only. A stream stopped by a failed op that is discarded runs on.
void emu_stream_discard_if(bool (*match)(void *state, void *owner), void *owner);

// ---------------------------------------------------------------- kernels
// Identification of the thread that runs now, for messages (NULL outside kernels).
const char *emu_current_kernel(void);

#ifdef __cplusplus
}
#endif
#endif
