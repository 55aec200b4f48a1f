// emu_kernel_abi.h - what kernel code (C++, cuda_runtime.h) and the
// emulator's library (C, emu/src/launch.c and core.c) agree on: the running thread's
// coordinates, the barriers, the warp exchange, shared memory, launches.
// Course code never includes this directly.
#ifndef EMU_KERNEL_ABI_H
#define EMU_KERNEL_ABI_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// A GPU's limits, enforced at launch as a GPU enforces them.
#define EMU_WARP_SIZE 32
#define EMU_MAX_BLOCK_THREADS 1024
#define EMU_STATIC_SHARED_LIMIT (48 * 1024)    // per block, without opting in
#define EMU_DYNAMIC_SHARED_OPTIN (227 * 1024)  // the most cudaFuncSetAttribute may allow (sm_90)
#define EMU_WARP_SLOT_BYTES 16                 // the largest value a shuffle moves

typedef struct uint3 { unsigned int x, y, z; } uint3;

// What threadIdx, blockIdx, blockDim and gridDim read: the fields of the
// thread that runs now.
struct emu_block_info; // the running block, as the race checker sees it (emu/src)
typedef struct emu_thread_view {
    uint3 thread_idx, block_idx, block_dim, grid_dim;
    int linear;          // thread index within the block: x + y*bx + z*bx*by
    int lane;            // linear % 32
    unsigned warp_epoch; // warp operations this lane has completed
    const struct emu_block_info *block;
} emu_thread_view;

extern __thread emu_thread_view *emu_self;

__attribute__((noreturn)) void emu_not_in_kernel(const char *what);
// Stops with "<what> in kernel K, block (..), thread (..): <problem>".
__attribute__((noreturn)) void emu_kernel_error(const char *what, const char *problem);

// __syncthreads(): every thread of the block that has not exited waits here.
void emu_syncthreads(const char *file, int line);
// __syncthreads_count(p): the same, and how many threads brought p != 0.
int emu_syncthreads_count(int predicate, const char *what, const char *file, int line);

// The warp exchange under every shuffle, vote and __syncwarp: this lane
// puts `size` bytes of `value` in its slot; all lanes named in `mask` must
// arrive (the emulator switches to them until they do); the result is the
// 32 slots (EMU_WARP_SLOT_BYTES each), valid until this lane's next call.
// Slots of lanes that did not take part hold 0xFF bytes.
const void *emu_warp_share(unsigned mask, const void *value, size_t size, const char *what, const char *file,
                           int line);
unsigned emu_active_mask(void);

// One __shared__ declaration: its place in the block's shared memory.
typedef struct emu_shared_site {
    unsigned long long block_serial;
    size_t offset;
} emu_shared_site;

void *emu_shared_static(emu_shared_site *site, size_t size, size_t align, const char *name);
void *emu_shared_dynamic(void);

typedef struct emu_launch_config {
    uint3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    unsigned max_threads; // the kernel's __launch_bounds__, 0 if it has none
} emu_launch_config;

// kernel_id: the kernel function's address (for cudaFuncSetAttribute).
// body(closure) runs the kernel for the current thread; free_closure(closure)
// frees the copied arguments once the kernel has run (or failed to launch).
cudaError_t emu_launch_kernel(const emu_launch_config *cfg, const void *kernel_id, const char *name,
                              const char *file, int line, void (*body)(void *closure),
                              void (*free_closure)(void *closure), void *closure);
// cudaLaunchKernel's side: a kernel registered (by its address) with a
// launcher that knows its parameters, and a launch through it. `pretty`
// holds its name after "K = " (__PRETTY_FUNCTION__ of a template).
typedef cudaError_t (*emu_untyped_launcher)(const void *kernel, const char *name, const emu_launch_config *cfg,
                                            void **args);
void emu_register_kernel(const void *kernel, const char *pretty, emu_untyped_launcher launcher);
cudaError_t emu_launch_untyped(const void *kernel, emu_launch_config cfg, void **args);

// Each pointer argument of a launch (index: its position, from 0).
void emu_check_kernel_pointer(const char *kernel, const char *file, int line, int index, const void *p);

// The race checker's side (race.c): an atomic operation touches `bytes`
// at p; it is not instrumented as plain accesses are.
void emu_race_atomic(const void *p, size_t bytes);
#ifdef __cplusplus
}
#endif
#endif
