// cuda_bf16.h - bfloat16 on the emulated GPU.
//
// bf16 keeps a float's sign and 8-bit exponent and the top 7 bits of its
// mantissa: the upper half of the float's 32 bits. Widening is exact
// (append 16 zero bits). Narrowing rounds to the nearest bf16, ties to the
// even one, as a GPU's cvt.rn.bf16.f32 does, and a NaN becomes the
// canonical NaN 0x7FFF - so the emulated device's bits equal a GPU's.
// Arithmetic on bf16 values is done in float and rounded once.
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#define __CUDA_BF16_TYPES_EXIST__ 1 // as NVIDIA's header says

#include <stdint.h>
#include <string.h>

#include "emu_float16_ops.h"
#include "emu_kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline unsigned short emu_float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff; // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                     // round half to even
    return (unsigned short)(u >> 16);
}

static inline float emu_bf16_bits_to_float(unsigned short b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(emu_float_to_bf16_bits(f)) {}
    __nv_bfloat16(double d) : __x(emu_float_to_bf16_bits((float)d)) {}
    __nv_bfloat16(int i) : __x(emu_float_to_bf16_bits((float)i)) {}
    operator float() const { return emu_bf16_bits_to_float(__x); }
};
// Aligned to 4 bytes, as on a GPU, where it is loaded as one 32-bit word.
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
#else
typedef struct { unsigned short __x; } __nv_bfloat16;
typedef struct __attribute__((aligned(4))) { __nv_bfloat16 x, y; } __nv_bfloat162;
#endif
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

static inline __nv_bfloat16 emu_bf16_from_bits(unsigned short bits) {
    __nv_bfloat16 h;
    h.__x = bits;
    return h;
}

static inline __nv_bfloat16 __float2bfloat16(float f) { return emu_bf16_from_bits(emu_float_to_bf16_bits(f)); }
static inline __nv_bfloat16 __double2bfloat16(double d) { return __float2bfloat16((float)d); } // (double rounding: rare ties differ)
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) { // toward zero: drop the low bits
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return emu_bf16_from_bits(0x7fff);
    return emu_bf16_from_bits((unsigned short)(u >> 16));
}
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf16_bits_to_float(h.__x); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return emu_bf16_from_bits(bits); }

#ifdef __cplusplus
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16(a), __float2bfloat16(b)};
}

EMU_FLOAT16_OPS(__nv_bfloat16, __bfloat162float, __float2bfloat16, emu_bf16_from_bits)
__attribute__((no_sanitize_thread)) static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *address,
                                                                          __nv_bfloat16 val) {
    emu_race_atomic(address, sizeof *address);
    __nv_bfloat16 old = *address;
    *address = old + val;
    return old;
}
#endif

#endif
