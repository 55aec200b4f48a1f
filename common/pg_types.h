// pg_types.h - what a process group works with: element types, reduction
// operations, the backends' names, and the element-wise reduction kernels.
//
// Both backends (pg_cpu.h, pg_nccl.h) and the dispatch in pg.h need these,
// so they live here, below all three: pg.h includes the backends, the
// backends include this file, and nothing includes pg.h back.
#ifndef COURSE_PG_TYPES_H
#define COURSE_PG_TYPES_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "store_client.h"

// ---------------------------------------------------------------- types

typedef enum { DTYPE_F32, DTYPE_F64, DTYPE_I32, DTYPE_I64, DTYPE_U8, DTYPE_BF16, DTYPE_F16 } dtype_t;
typedef enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_AVG, OP_BAND, OP_BOR, OP_BXOR } redop_t;
typedef enum { BACKEND_AUTO, BACKEND_CPU, BACKEND_NCCL, BACKEND_MPI } backend_kind_t;

static inline bool dtype_valid(dtype_t t) { return (unsigned)t <= DTYPE_F16; }
static inline bool redop_valid(redop_t op) { return (unsigned)op <= OP_BXOR; }

static inline size_t dtype_size(dtype_t t) {
    static const size_t sizes[] = {4, 8, 4, 8, 1, 2, 2};
    if (!dtype_valid(t)) die("unknown dtype %d", (int)t);
    return sizes[t];
}

static inline const char *dtype_name(dtype_t t) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8", "bf16", "f16"};
    return dtype_valid(t) ? names[t] : "unknown dtype";
}

static inline const char *redop_name(redop_t op) {
    static const char *names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
    return redop_valid(op) ? names[op] : "unknown op";
}

static inline const char *backend_name(backend_kind_t b) {
    return b == BACKEND_NCCL ? "nccl" : b == BACKEND_CPU ? "cpu" : b == BACKEND_MPI ? "mpi" : "auto";
}

static inline backend_kind_t backend_parse(const char *text) {
    if (!strcmp(text, "auto")) return BACKEND_AUTO;
    if (!strcmp(text, "cpu")) return BACKEND_CPU;
    if (!strcmp(text, "nccl")) return BACKEND_NCCL;
    if (!strcmp(text, "mpi")) return BACKEND_MPI;
    die("unknown backend '%s' (use auto, cpu, nccl or mpi)", text);
}

static inline bool dtype_is_integer(dtype_t t) {
    return t == DTYPE_I32 || t == DTYPE_I64 || t == DTYPE_U8;
}

static inline bool redop_is_bitwise(redop_t op) {
    return op == OP_BAND || op == OP_BOR || op == OP_BXOR;
}

// Stops a program that asks for a reduction that does not exist, before any
// rank sends anything (every rank makes the same call, so every rank stops).
static inline void pg_check_reduction(dtype_t t, redop_t op, const char *what) {
    if (!dtype_valid(t)) die("%s: unknown dtype %d", what, (int)t);
    if (!redop_valid(op)) die("%s: unknown reduction op %d", what, (int)op);
    if (redop_is_bitwise(op) && !dtype_is_integer(t))
        die("%s: op %s is only defined for integer dtypes (i32, i64, u8), not %s", what,
            redop_name(op), dtype_name(t));
}

// ---------------------------------------------------------------- bf16
//
// bfloat16 is the top half of a float32: same exponent range, 8 bits of
// mantissa. It is stored as uint16_t, since C has no such type.

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest, ties to even, as hardware and NCCL do; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

// ---------------------------------------------------------------- fp16
//
// IEEE half: 5 bits of exponent (bias 15), 10 of mantissa. Largest 65504;
// below 2^-14 (6.1e-5) subnormal, down to 2^-24 (6e-8). Also uint16_t.

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) { // zero or subnormal: man * 2^-24, exact in float
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    bits = sign | (exp == 0x1f ? 0x7f800000u : (exp + 112u) << 23) | man << 13; // 112: bias 127 - 15
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// Round to nearest, ties to even, as GPUs and NCCL do; past 65504 (from
// 65520 on) infinity; NaN stays NaN.
static inline uint16_t f32_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t mag = bits & 0x7fffffffu;
    if (mag > 0x7f800000u) return sign | 0x7e00u;   // NaN
    if (mag >= 0x477ff000u) return sign | 0x7c00u;  // 65520 or more: infinity
    if (mag < 0x38800000u) {                        // below 2^-14: subnormal, in units of 2^-24
        float units = fabsf(f) * 0x1p24f;           // exact: a power of two
        return sign | (uint16_t)nearbyintf(units);  // ties to even (the default rounding); 1024 is 2^-14, right
    }
    uint32_t h = (mag >> 13) - (112u << 10), rest = mag & 0x1fffu; // exponent rebiased, top 10 mantissa bits
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;       // a carry into the exponent is right too
    return sign | (uint16_t)h;
}

// The two 16-bit floats, for code that handles both the same way.
static inline bool dtype_is_float16(dtype_t t) { return t == DTYPE_BF16 || t == DTYPE_F16; }
static inline float float16_to_f32(dtype_t t, uint16_t h) { return t == DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h); }
static inline uint16_t f32_to_float16(dtype_t t, float f) { return t == DTYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f); }

// ---------------------------------------------------------------- reduction kernels
//
// dst[i] = a[i] OP b[i] for n elements. dst may be a or b (in place); each
// step reads a[i] and b[i] before writing dst[i], so that is safe. AVG adds
// here; the division by the world size happens once, at the end
// (pg_divide_elements). Signed integers add and multiply as unsigned
// numbers, which wrap around like two's complement (and like NCCL) instead of
// overflowing, which C leaves undefined.
//
// PG_SIMD asks the compiler for SIMD instructions (several elements per
// instruction, 1.5-2x faster here). At -O2, GCC vectorizes only loops whose
// arrays provably do not overlap, and ours may (in place); "omp simd" says
// the iterations are independent, which they are. Without OpenMP it is
// left out and the loops run one element at a time, correctly.
#ifdef _OPENMP
#define PG_SIMD _Pragma("omp simd")
#else
#define PG_SIMD
#endif

static inline void pg_combine_f32(float *d, const float *a, const float *b, size_t n, redop_t op) {
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];
        break;
    case OP_PROD:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] * b[i];
        break;
    case OP_MIN:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];
        break;
    case OP_MAX:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];
        break;
    default: pg_check_reduction(DTYPE_F32, op, "reduce");
    }
}

static inline void pg_combine_f64(double *d, const double *a, const double *b, size_t n,
                                  redop_t op) {
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];
        break;
    case OP_PROD:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] * b[i];
        break;
    case OP_MIN:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];
        break;
    case OP_MAX:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];
        break;
    default: pg_check_reduction(DTYPE_F64, op, "reduce");
    }
}

static inline void pg_combine_i32(int32_t *d, const int32_t *a, const int32_t *b, size_t n,
                                  redop_t op) {
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
        break;
    case OP_PROD:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)a[i] * (uint32_t)b[i]);
        break;
    case OP_MIN:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];
        break;
    case OP_MAX:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];
        break;
    case OP_BAND: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] & b[i]; break;
    case OP_BOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] | b[i]; break;
    case OP_BXOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] ^ b[i]; break;
    }
}

static inline void pg_combine_i64(int64_t *d, const int64_t *a, const int64_t *b, size_t n,
                                  redop_t op) {
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
        break;
    case OP_PROD:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]);
        break;
    case OP_MIN:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];
        break;
    case OP_MAX:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];
        break;
    case OP_BAND: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] & b[i]; break;
    case OP_BOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] | b[i]; break;
    case OP_BXOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] ^ b[i]; break;
    }
}

static inline void pg_combine_u8(uint8_t *d, const uint8_t *a, const uint8_t *b, size_t n,
                                 redop_t op) {
    switch (op) {
    case OP_SUM:
    case OP_AVG:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(a[i] + b[i]);
        break;
    case OP_PROD:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(a[i] * b[i]);
        break;
    case OP_MIN:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];
        break;
    case OP_MAX:
        PG_SIMD for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];
        break;
    case OP_BAND: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] & b[i]; break;
    case OP_BOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] | b[i]; break;
    case OP_BXOR: PG_SIMD for (size_t i = 0; i < n; i++) d[i] = a[i] ^ b[i]; break;
    }
}

// bf16 or fp16 element by element through float32, rounding each result.
// (The cpu backend does not use this for its sums: it widens whole buffers
// to f32 so that a sum over many ranks is rounded only once.)
static inline void pg_combine_float16(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, dtype_t t,
                                      redop_t op) {
    for (size_t i = 0; i < n; i++) {
        float x = float16_to_f32(t, a[i]), y = float16_to_f32(t, b[i]), r;
        pg_combine_f32(&r, &x, &y, 1, op);
        d[i] = f32_to_float16(t, r);
    }
}

static inline void pg_combine(void *dst, const void *a, const void *b, size_t n, dtype_t t,
                              redop_t op) {
    switch (t) {
    case DTYPE_F32: pg_combine_f32(dst, a, b, n, op); break;
    case DTYPE_F64: pg_combine_f64(dst, a, b, n, op); break;
    case DTYPE_I32: pg_combine_i32(dst, a, b, n, op); break;
    case DTYPE_I64: pg_combine_i64(dst, a, b, n, op); break;
    case DTYPE_U8: pg_combine_u8(dst, a, b, n, op); break;
    case DTYPE_BF16:
    case DTYPE_F16: pg_combine_float16(dst, a, b, n, t, op); break;
    }
}

// The second half of AVG: every rank divides the same summed bytes by the
// same number, so the results stay identical across ranks.
static inline void pg_divide_elements(void *buf, size_t n, dtype_t t, int world) {
    switch (t) {
    case DTYPE_F32: { float *x = buf; for (size_t i = 0; i < n; i++) x[i] /= (float)world; break; }
    case DTYPE_F64: { double *x = buf; for (size_t i = 0; i < n; i++) x[i] /= world; break; }
    case DTYPE_I32: { int32_t *x = buf; for (size_t i = 0; i < n; i++) x[i] /= world; break; }
    case DTYPE_I64: { int64_t *x = buf; for (size_t i = 0; i < n; i++) x[i] /= world; break; }
    case DTYPE_U8: { uint8_t *x = buf; for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / world); break; }
    case DTYPE_BF16:
    case DTYPE_F16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = f32_to_float16(t, float16_to_f32(t, x[i]) / (float)world);
        break;
    }
    }
}

// ---------------------------------------------------------------- configuration

typedef struct {
    int rank, world_size;
    int local_rank, local_world_size;   // auto: nccl only if every local rank has its own GPU
    backend_kind_t backend;               // requested
    const device_t *device;             // where the caller's buffers live (GPU or CPU)
    store_t *store;                     // from rendezvous(): already connected
    double timeout_s;                   // every operation's deadline; <= 0: course_timeout_default()
} pg_config_t;

typedef struct pg pg_t;
typedef struct pg_request pg_request_t;

// Store keys of the n-th process group a process creates. Every rank creates
// its groups in the same order, so the n-th group of every rank meets the
// n-th of the others, and a second group never reads the first one's keys.
static inline int pg_next_generation(void) {
    static int generation = 0;
    return generation++;
}

#endif
