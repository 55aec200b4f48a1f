// cuda_fp16.h - IEEE half precision on the emulated GPU.
//
// half: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Widening
// is exact; narrowing rounds to the nearest half, ties to even, overflows
// to infinity, and turns a NaN into the canonical 0x7FFF - as a GPU's
// cvt.rn.f16.f32. Arithmetic on halves is done in float and rounded once.
// (The course itself computes in fp32 and bf16; this header is here for
// programs that use fp16, such as NVIDIA's nccl-tests.)
#ifndef EMU_CUDA_FP16_H
#define EMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

#include "emu_float16_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Keeps `value`'s top bits after dropping `shift` (1 to 31) low bits,
// rounding to nearest with ties to even.
static inline uint32_t emu_shift_round_even(uint32_t value, unsigned shift) {
    uint32_t kept = value >> shift, dropped = value & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (dropped > half || (dropped == half && (kept & 1u))) kept++;
    return kept;
}

static inline unsigned short emu_float_to_half_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return 0x7fff;                  // NaN
    if (magnitude >= 0x47800000u) return (uint16_t)(sign | 0x7c00); // >= 65536: infinity
    uint32_t exponent = magnitude >> 23, mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    if (magnitude < 0x38800000u) {                               // below 2^-14: a subnormal half
        unsigned shift = 126 - exponent;                         // mantissa * 2^-shift, in 2^-24 units
        if (exponent == 0 || shift > 24) return sign;            // rounds to zero
        return (uint16_t)(sign | emu_shift_round_even(mantissa, shift));
    }
    // A normal half; a carry out of the mantissa moves into the exponent,
    // up to infinity (0x7c00), which is right.
    uint32_t h = ((exponent - 112) << 10) | ((magnitude & 0x7fffffu) >> 13);
    uint32_t dropped = magnitude & 0x1fffu;
    if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static inline float emu_half_bits_to_float(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    if (exponent == 0) { // zero or subnormal: mantissa * 2^-24, exact in float
        float f = (float)mantissa * 0x1p-24f;
        return (h & 0x8000u) ? -f : f;
    }
    if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13); // infinity, NaN
    else bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#ifdef __cplusplus
}

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(emu_float_to_half_bits(f)) {}
    __half(double d) : __x(emu_float_to_half_bits((float)d)) {}
    __half(int i) : __x(emu_float_to_half_bits((float)i)) {}
    operator float() const { return emu_half_bits_to_float(__x); }
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
typedef __half half;
typedef __half2 half2;

static inline __half emu_half_from_bits(unsigned short bits) {
    __half h;
    h.__x = bits;
    return h;
}
static inline __half __float2half(float f) { return emu_half_from_bits(emu_float_to_half_bits(f)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline __half __double2half(double d) { return __float2half((float)d); } // (double rounding: rare ties differ)
static inline __half __ull2half_rn(unsigned long long u) { return __float2half((float)u); }
static inline float __half2float(__half h) { return emu_half_bits_to_float(h.__x); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short bits) { return emu_half_from_bits(bits); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half(a), __float2half(b)}; }

EMU_FLOAT16_OPS(__half, __half2float, __float2half, emu_half_from_bits)
#else
typedef struct { unsigned short __x; } __half;
typedef struct __attribute__((aligned(4))) { __half x, y; } __half2;
#endif

#endif
