// nccl_reduce.c - the emulated NCCL's element types and reductions.
//
// Every rank combines the ranks' values in rank order, so every rank gets
// the same bits. 16-bit floats convert as the emulated GPU converts them
// (cuda_bf16.h, cuda_fp16.h).
#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
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
DEFINE_REDUCTION(f16, float, uint16_t, emu_half_bits_to_float, emu_float_to_half_bits, ADD_PLAIN, MUL_PLAIN)
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

// ================================================================ PreMulSum

double emu_nccl_value_at(const void *p, ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return *(const int8_t *)p;
    case ncclUint8: return *(const uint8_t *)p;
    case ncclInt32: return *(const int32_t *)p;
    case ncclUint32: return *(const uint32_t *)p;
    case ncclInt64: return (double)*(const int64_t *)p;
    case ncclUint64: return (double)*(const uint64_t *)p;
    case ncclFloat16: return emu_half_bits_to_float(*(const uint16_t *)p);
    case ncclBfloat16: return emu_bf16_bits_to_float(*(const uint16_t *)p);
    case ncclFloat32: return *(const float *)p;
    default: return *(const double *)p;
    }
}

#define PREMULTIPLY(T, EXPR)                                  \
    do {                                                      \
        T *v = x;                                             \
        for (size_t i = 0; i < n; i++) v[i] = (T)(EXPR);      \
    } while (0)

void emu_nccl_premultiply(void *x, size_t n, ncclDataType_t t, double scalar) {
    int64_t k = (int64_t)scalar;
    float f = (float)scalar;
    switch (t) {
    case ncclInt8: PREMULTIPLY(int8_t, (uint8_t)v[i] * (uint8_t)k); break;
    case ncclUint8: PREMULTIPLY(uint8_t, v[i] * (uint8_t)k); break;
    case ncclInt32: PREMULTIPLY(int32_t, (uint32_t)v[i] * (uint32_t)k); break;
    case ncclUint32: PREMULTIPLY(uint32_t, v[i] * (uint32_t)k); break;
    case ncclInt64: PREMULTIPLY(int64_t, (uint64_t)v[i] * (uint64_t)k); break;
    case ncclUint64: PREMULTIPLY(uint64_t, v[i] * (uint64_t)k); break;
    case ncclFloat16: PREMULTIPLY(uint16_t, emu_float_to_half_bits(emu_half_bits_to_float(v[i]) * f)); break;
    case ncclBfloat16: PREMULTIPLY(uint16_t, emu_float_to_bf16_bits(emu_bf16_bits_to_float(v[i]) * f)); break;
    case ncclFloat32: PREMULTIPLY(float, v[i] * f); break;
    default: PREMULTIPLY(double, v[i] * scalar); break;
    }
}
