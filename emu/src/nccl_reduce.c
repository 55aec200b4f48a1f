// nccl_reduce.c - the emulated NCCL's element types and reductions.
//
// Every rank combines the ranks' values in rank order, so every rank gets
// the same bits. bf16 converts as the emulated GPU converts it (cuda_bf16.h);
// IEEE half has its conversions here.
#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"
#include "emu_internal.h"

// ================================================================ data types

size_t emu_nccl_dtype_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
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
DEFINE_REDUCTION(bf16, float, uint16_t, emu_bf16_bits_to_float, emu_float_to_bf16_bits, ADD_PLAIN, MUL_PLAIN)

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

// ================================================================ over the ranks' slots

void emu_nccl_reduce_slots(struct ncclComm *comm, const emu_nccl_part *p, size_t offset, size_t n, void *dst) {
    const reduction *red = &reductions[p->dtype];
    unsigned char *acc = comm->scratch, *result = acc + EMU_NCCL_SCRATCH_RESULT_AT;
    red->first(acc, emu_nccl_slot_of(comm, 0) + offset, n);
    for (int r = 1; r < comm->nranks; r++) red->combine(acc, emu_nccl_slot_of(comm, r) + offset, n, p->op);
    red->finish(result, acc, n, p->op, comm->nranks);
    memcpy(dst, result, n * emu_nccl_dtype_size(p->dtype));
}
