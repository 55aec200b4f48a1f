// cuda_runtime.h - the emulated GPU's CUDA: the runtime API plus, for C++
// (the course's .cu files, compiled by g++ in the CUDA=emu build), what
// kernels see: threadIdx and friends, __syncthreads, warp shuffles and
// votes, atomics, the math intrinsics, vector types, and the launch that
// the build's rewrite (emu/tools/cu2emu.c) puts where <<<...>>> was.
//
// Each kernel thread is a fiber (emu/src/launch.c); threadIdx reads the
// coordinates of the fiber that runs now. Outside a kernel they do not
// exist, and using them says so.
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"
#include "emu_kernel_abi.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

// ---------------------------------------------------------------- qualifiers
// Every function is a host function here; kernels are ordinary functions
// that only emu_launch calls.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Empty: the standard C++ headers write __attribute__((__noinline__)), which
// a definition as __attribute__((noinline)) would break; inlining is only a
// hint here anyway.
#define __noinline__
#define __launch_bounds__(...) // cu2emu reads the bound; launches check it (emu_bounded)
#define __align__(n) __attribute__((aligned(n)))
// The build rewrites every __shared__ declaration (see emu/tools/cu2emu.c);
// one it could not rewrite stops the compile here with this name.
#define __shared__ __shared___declaration_not_rewritten_by_cu2emu

// ---------------------------------------------------------------- vector types
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define EMU_VECTOR2(name, T) struct name { T x, y; }; \
    static inline name make_##name(T x, T y) { return name{x, y}; }
#define EMU_VECTOR4(name, T) struct __attribute__((aligned(4 * sizeof(T)))) name { T x, y, z, w; }; \
    static inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }
EMU_VECTOR2(float2, float)
EMU_VECTOR4(float4, float)
EMU_VECTOR2(double2, double)
EMU_VECTOR2(int2, int)
EMU_VECTOR4(int4, int)
EMU_VECTOR2(uint2, unsigned int)
EMU_VECTOR4(uint4, unsigned int)
#undef EMU_VECTOR2
#undef EMU_VECTOR4
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }

// ---------------------------------------------------------------- where am I
static inline emu_thread_view *emu_view(const char *what) {
    emu_thread_view *v = emu_self;
    if (__builtin_expect(v == NULL, 0)) emu_not_in_kernel(what);
    return v;
}
#define threadIdx (emu_view("threadIdx")->thread_idx)
#define blockIdx (emu_view("blockIdx")->block_idx)
#define blockDim (emu_view("blockDim")->block_dim)
#define gridDim (emu_view("gridDim")->grid_dim)
#define warpSize EMU_WARP_SIZE

// ---------------------------------------------------------------- barriers
#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)
// The barrier, and how many threads of the block (all, any) brought a true predicate.
#define __syncthreads_count(p) emu_syncthreads_count((p), "__syncthreads_count", __FILE__, __LINE__)
#define __syncthreads_and(p) \
    (emu_syncthreads_count((p), "__syncthreads_and", __FILE__, __LINE__) == emu_block_threads())
#define __syncthreads_or(p) (emu_syncthreads_count((p), "__syncthreads_or", __FILE__, __LINE__) != 0)
static inline int emu_block_threads(void) {
    const emu_thread_view *v = emu_self;
    return (int)(v->block_dim.x * v->block_dim.y * v->block_dim.z);
}

static inline void emu_syncwarp(const char *file, int line, unsigned mask = 0xffffffffu) {
    int nothing = 0;
    emu_warp_share(mask, &nothing, sizeof nothing, "__syncwarp", file, line);
}
#define __syncwarp(...) emu_syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)

static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------- shuffles and votes
// Every lane named in the mask must call; each gets the value of the lane
// the shuffle's rule picks. width splits the warp into groups of that many
// lanes (a power of two up to 32).

static inline void emu_check_width(int width, const char *what) {
    if (width < 1 || width > EMU_WARP_SIZE || (width & (width - 1)))
        emu_kernel_error(what, "its width must be a power of two from 1 to 32");
}

template <typename T> static inline T emu_pick_lane(const void *slots, int lane) {
    static_assert(sizeof(T) <= EMU_WARP_SLOT_BYTES, "a shuffle moves at most 16 bytes");
    T out;
    memcpy((void *)&out, (const unsigned char *)slots + lane * EMU_WARP_SLOT_BYTES, sizeof out);
    return out;
}

template <typename T>
static inline T emu_shfl_sync(const char *file, int line, unsigned mask, T value, int src_lane, int width = 32) {
    emu_check_width(width, "__shfl_sync");
    const void *slots = emu_warp_share(mask, &value, sizeof value, "__shfl_sync", file, line);
    int lane = emu_self->lane, base = lane & ~(width - 1);
    return emu_pick_lane<T>(slots, base + (src_lane & (width - 1)));
}

template <typename T>
static inline T emu_shfl_up_sync(const char *file, int line, unsigned mask, T value, unsigned delta, int width = 32) {
    emu_check_width(width, "__shfl_up_sync");
    const void *slots = emu_warp_share(mask, &value, sizeof value, "__shfl_up_sync", file, line);
    int lane = emu_self->lane;
    int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return emu_pick_lane<T>(slots, src);
}

template <typename T>
static inline T emu_shfl_down_sync(const char *file, int line, unsigned mask, T value, unsigned delta, int width = 32) {
    emu_check_width(width, "__shfl_down_sync");
    const void *slots = emu_warp_share(mask, &value, sizeof value, "__shfl_down_sync", file, line);
    int lane = emu_self->lane;
    int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return emu_pick_lane<T>(slots, src);
}

template <typename T>
static inline T emu_shfl_xor_sync(const char *file, int line, unsigned mask, T value, int lane_mask, int width = 32) {
    emu_check_width(width, "__shfl_xor_sync");
    const void *slots = emu_warp_share(mask, &value, sizeof value, "__shfl_xor_sync", file, line);
    int lane = emu_self->lane, src = lane ^ lane_mask;
    if (src / width > lane / width || src >= EMU_WARP_SIZE) src = lane; // a later group: its own value
    return emu_pick_lane<T>(slots, src);
}

#define __shfl_sync(...) emu_shfl_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu_shfl_up_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu_shfl_down_sync(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu_shfl_xor_sync(__FILE__, __LINE__, __VA_ARGS__)

static inline unsigned emu_ballot_sync(const char *file, int line, unsigned mask, int predicate,
                                       const char *what = "__ballot_sync") {
    int p = predicate != 0;
    const void *slots = emu_warp_share(mask, &p, sizeof p, what, file, line);
    unsigned bits = 0;
    for (int lane = 0; lane < EMU_WARP_SIZE; lane++)
        if (emu_pick_lane<int>(slots, lane) == 1) bits |= 1u << lane;
    return bits & mask;
}
#define __ballot_sync(mask, p) emu_ballot_sync(__FILE__, __LINE__, mask, p)
#define __any_sync(mask, p) (emu_ballot_sync(__FILE__, __LINE__, mask, p, "__any_sync") != 0)
#define __all_sync(mask, p) \
    (emu_ballot_sync(__FILE__, __LINE__, mask, p, "__all_sync") == ((mask) & emu_active_mask()))
#define __activemask() emu_active_mask()

// ---------------------------------------------------------------- atomics
// The threads of a block take turns on one core and switch only at
// barriers and warp operations, so a read-modify-write cannot be torn.
// They are not instrumented as plain accesses are: the race checker is
// told that an atomic touched the address instead.
#define EMU_ATOMIC_FN __attribute__((no_sanitize_thread)) static inline
#define EMU_ATOMIC(name, T, expr) \
    EMU_ATOMIC_FN T name(T *address, T val) { \
        emu_race_atomic(address, sizeof(T)); \
        T old = *address; \
        *address = (expr); \
        return old; \
    }
#define EMU_ATOMIC_ARITH(T) \
    EMU_ATOMIC(atomicAdd, T, old + val) \
    EMU_ATOMIC(atomicExch, T, val)
EMU_ATOMIC_ARITH(int)
EMU_ATOMIC_ARITH(unsigned int)
EMU_ATOMIC_ARITH(unsigned long long)
EMU_ATOMIC_ARITH(float)
EMU_ATOMIC_ARITH(double)
#define EMU_ATOMIC_INTEGER(T) \
    EMU_ATOMIC(atomicMin, T, val < old ? val : old) \
    EMU_ATOMIC(atomicMax, T, val > old ? val : old) \
    EMU_ATOMIC(atomicAnd, T, old & val) \
    EMU_ATOMIC(atomicOr, T, old | val) \
    EMU_ATOMIC(atomicXor, T, old ^ val)
EMU_ATOMIC_INTEGER(int)
EMU_ATOMIC_INTEGER(unsigned int)
EMU_ATOMIC_INTEGER(unsigned long long)
EMU_ATOMIC(atomicSub, int, old - val)
EMU_ATOMIC(atomicSub, unsigned int, old - val)
EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0 : old + 1)
EMU_ATOMIC(atomicDec, unsigned int, (old == 0 || old > val) ? val : old - 1)
#undef EMU_ATOMIC_INTEGER
#undef EMU_ATOMIC_ARITH
#undef EMU_ATOMIC
#define EMU_ATOMIC_CAS(T) \
    EMU_ATOMIC_FN T atomicCAS(T *address, T compare, T val) { \
        emu_race_atomic(address, sizeof(T)); \
        T old = *address; \
        if (old == compare) *address = val; \
        return old; \
    }
EMU_ATOMIC_CAS(int)
EMU_ATOMIC_CAS(unsigned int)
EMU_ATOMIC_CAS(unsigned long long)
EMU_ATOMIC_CAS(unsigned short)
#undef EMU_ATOMIC_CAS

// ---------------------------------------------------------------- math and bits
// The fast intrinsics (__expf, ...) are the exact functions here: a GPU's
// are a few ulps off, which code must not depend on either way.
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// (glibc declares functions of these names itself: macros take precedence.)
#define __expf expf
#define __logf logf
#define __sinf sinf
#define __cosf cosf
#define __powf powf
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

#define EMU_MINMAX(T) \
    static inline T min(T a, T b) { return b < a ? b : a; } \
    static inline T max(T a, T b) { return a < b ? b : a; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
#undef EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline void __nanosleep(unsigned ns) { (void)ns; }

// ---------------------------------------------------------------- the launch
// cu2emu turns   kernel<<<grid, block, shared, stream>>>(a, b);
// into           emu_launch(kernel, "kernel", __FILE__, __LINE__, emu_config(grid, block, shared, stream), a, b);
// The arguments are converted to the kernel's parameter types and copied
// now, as CUDA does at a launch; the kernel runs when its stream does.
static inline emu_launch_config emu_config(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t stream = 0) {
    emu_launch_config c;
    c.grid = grid, c.block = block, c.shared_bytes = shared, c.stream = stream, c.max_threads = 0;
    return c;
}

// A launch of a kernel declared with __launch_bounds__(max_threads) (cu2emu writes this).
static inline emu_launch_config emu_bounded(emu_launch_config c, unsigned max_threads) {
    c.max_threads = max_threads;
    return c;
}

// Pointer arguments must point where a GPU can read (emu_check_kernel_pointer).
template <typename T>
static inline void emu_check_argument(const char *name, const char *file, int line, int index, const T &arg) {
    if constexpr (std::is_pointer<T>::value && !std::is_function<typename std::remove_pointer<T>::type>::value)
        emu_check_kernel_pointer(name, file, line, index, (const void *)arg);
}

template <typename Tuple, size_t... I>
static inline void emu_check_arguments(const char *name, const char *file, int line, const Tuple &args,
                                       std::index_sequence<I...>) {
    (emu_check_argument(name, file, line, (int)I, std::get<I>(args)), ...);
}

template <typename... P> struct emu_kernel_call {
    void (*kernel)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    static void run(void *self) {
        emu_kernel_call *c = static_cast<emu_kernel_call *>(self);
        std::apply(c->kernel, c->args);
    }
    static void destroy(void *self) { delete static_cast<emu_kernel_call *>(self); }
};

template <typename... P, typename... A>
static inline cudaError_t emu_launch(void (*kernel)(P...), const char *name, const char *file, int line,
                                     emu_launch_config cfg, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes a different number of arguments than the kernel takes");
    auto *call = new emu_kernel_call<P...>{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
    emu_check_arguments(name, file, line, call->args, std::index_sequence_for<P...>{});
    return emu_launch_kernel(&cfg, (const void *)kernel, name, file, line, &emu_kernel_call<P...>::run,
                             &emu_kernel_call<P...>::destroy, call);
}

// CUDA 11's cudaGraphInstantiate, which CUDA 12's C++ header keeps.
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, cudaGraphNode_t *error_node,
                                               char *log, size_t log_size) {
    if (error_node) *error_node = NULL;
    if (log && log_size) log[0] = 0;
    return cudaGraphInstantiate(exec, graph, 0ull);
}

// ---------------------------------------------------------------- cudaLaunchKernel
// cudaLaunchKernel(kernel, grid, block, args, shared, stream) is given the
// kernel's address and an array of pointers to its arguments, nothing of
// their types. nvcc registers every kernel with the CUDA runtime; in the
// emulated build cu2emu starts every kernel's body with
// emu_kernel_registrar<&kernel>::done, whose initialization - once per
// kernel (and per template instantiation) in the program, before main -
// registers a launcher that knows the parameter types.
template <typename... P> struct emu_kernel_entry {
    template <size_t... I>
    static cudaError_t call(void (*k)(P...), const char *name, const emu_launch_config *c, void **args,
                            std::index_sequence<I...>) {
        return emu_launch(k, name, "cudaLaunchKernel", 0, *c, *static_cast<typename std::decay<P>::type *>(args[I])...);
    }
    static cudaError_t launch(const void *kernel, const char *name, const emu_launch_config *c, void **args) {
        return call(reinterpret_cast<void (*)(P...)>(const_cast<void *>(kernel)), name, c, args,
                    std::index_sequence_for<P...>{});
    }
};

template <typename... P> static inline bool emu_register(void (*k)(P...), const char *pretty) {
    emu_register_kernel(reinterpret_cast<const void *>(k), pretty, &emu_kernel_entry<P...>::launch);
    return true;
}

template <auto K> static inline const char *emu_kernel_pretty_name() { return __PRETTY_FUNCTION__; } // "... [with auto K = f<int>]"

template <auto K> struct emu_kernel_registrar {
    static const bool done;
};
template <auto K> const bool emu_kernel_registrar<K>::done = emu_register(K, emu_kernel_pretty_name<K>());

static inline cudaError_t cudaLaunchKernel(const void *kernel, dim3 grid, dim3 block, void **args, size_t shared = 0,
                                           cudaStream_t stream = 0) {
    return emu_launch_untyped(kernel, emu_config(grid, block, shared, stream), args);
}
template <typename T>
static inline cudaError_t cudaLaunchKernel(T *kernel, dim3 grid, dim3 block, void **args, size_t shared = 0,
                                           cudaStream_t stream = 0) {
    return cudaLaunchKernel(reinterpret_cast<const void *>(kernel), grid, block, args, shared, stream);
}

// __shared__ inside a function: cu2emu turns `__shared__ T name[N];` into a
// reference to the block's shared memory (one place per declaration and
// block), and `extern __shared__ T name[];` into this view of the dynamic part.
template <typename T> struct emu_dynamic_shared {
    operator T *() const { return static_cast<T *>(emu_shared_dynamic()); }
    T &operator[](long long i) const { return static_cast<T *>(emu_shared_dynamic())[i]; }
};

#endif // __cplusplus
#endif
