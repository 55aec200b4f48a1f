// emu_float16_ops.h - the arithmetic and comparisons that bf16 (cuda_bf16.h)
// and fp16 (cuda_fp16.h) share on the emulated GPU: each in float, rounded
// once to the 16-bit type, as a GPU without native 16-bit math would do.
// T is the type, TO_FLOAT and FROM_FLOAT its conversions, FROM_BITS makes
// one from its 16 bits. C++ only.
#ifndef EMU_FLOAT16_OPS_H
#define EMU_FLOAT16_OPS_H

#define EMU_FLOAT16_BINARY(T, TO_FLOAT, FROM_FLOAT, op, fn)                                                  \
    static inline T fn(T a, T b) { return FROM_FLOAT(TO_FLOAT(a) op TO_FLOAT(b)); }                          \
    static inline T operator op(T a, T b) { return fn(a, b); }                                               \
    static inline T &operator op##=(T &a, T b) { return a = fn(a, b); }

#define EMU_FLOAT16_COMPARE(T, op)                                                                           \
    static inline bool operator op(T a, T b) { return (float)a op (float)b; }

#define EMU_FLOAT16_OPS(T, TO_FLOAT, FROM_FLOAT, FROM_BITS)                                                  \
    EMU_FLOAT16_BINARY(T, TO_FLOAT, FROM_FLOAT, +, __hadd)                                                   \
    EMU_FLOAT16_BINARY(T, TO_FLOAT, FROM_FLOAT, -, __hsub)                                                   \
    EMU_FLOAT16_BINARY(T, TO_FLOAT, FROM_FLOAT, *, __hmul)                                                   \
    EMU_FLOAT16_BINARY(T, TO_FLOAT, FROM_FLOAT, /, __hdiv)                                                   \
    static inline T __hfma(T a, T b, T c) { return FROM_FLOAT(TO_FLOAT(a) * TO_FLOAT(b) + TO_FLOAT(c)); }   \
    static inline T __hneg(T a) { return FROM_BITS((unsigned short)(a.__x ^ 0x8000u)); }                    \
    static inline T operator-(T a) { return __hneg(a); }                                                     \
    static inline bool __hlt(T a, T b) { return (float)a < (float)b; }                                       \
    static inline bool __hgt(T a, T b) { return (float)a > (float)b; }                                       \
    static inline bool __heq(T a, T b) { return (float)a == (float)b; }                                      \
    static inline T __hmin(T a, T b) { return __hlt(b, a) ? b : a; }                                         \
    static inline T __hmax(T a, T b) { return __hgt(b, a) ? b : a; }                                         \
    EMU_FLOAT16_COMPARE(T, ==)                                                                               \
    EMU_FLOAT16_COMPARE(T, !=)                                                                               \
    EMU_FLOAT16_COMPARE(T, <)                                                                                \
    EMU_FLOAT16_COMPARE(T, >)                                                                                \
    EMU_FLOAT16_COMPARE(T, <=)                                                                               \
    EMU_FLOAT16_COMPARE(T, >=)

#endif
