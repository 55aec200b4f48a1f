// rne16.h - rounding float32 to bf16 and fp16 to nearest, ties to even,
// written plainly: the reference the tests hold the course's conversions
// to, bit for bit (tests/unit/test_gpt_cuda.c: the GPU model's stores and
// copies, and the CPU's common/pg_types.h).
//
// No bit tricks, so that it cannot share a mistake with the code it
// checks. A 16-bit float's non-negative values, decoded from their bits
// with ldexp (exact in double), grow with their bit patterns. So the two
// neighbours of |x| are found by bisection over the patterns, the nearer
// one wins, and a tie goes to the even pattern (last bit 0). Overflow is
// IEEE 754's rule: round as if the exponent went on, and a result past the
// largest finite value is infinity. The infinity's pattern (0x7F80,
// 0x7C00) decodes, by the same formula, to the value the exponent would
// give next (2^128, 2^16), so the bisection rounds up to it as to any
// other neighbour - and that pattern means infinity. A NaN becomes a NaN
// (which one is the hardware's choice: rne16_is_nan compares them).
#ifndef COURSE_RNE16_H
#define COURSE_RNE16_H
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *name;
    int mantissa_bits; // stored bits of the significand
    int bias;          // exponent bias
    uint16_t inf;      // +infinity's pattern: exponent all ones, mantissa 0
} rne16_format;

static const rne16_format RNE16_BF16 = {"bf16", 7, 127, 0x7F80};
static const rne16_format RNE16_FP16 = {"fp16", 10, 15, 0x7C00};

// The value of a non-negative pattern p <= f->inf: subnormal (exponent 0)
// m * 2^(1 - bias - mantissa_bits), else (2^mantissa_bits + m) * 2^(e - bias - mantissa_bits).
static inline double rne16_value(const rne16_format *f, uint16_t p) {
    int e = p >> f->mantissa_bits, m = p & ((1 << f->mantissa_bits) - 1);
    if (e == 0) return ldexp((double)m, 1 - f->bias - f->mantissa_bits);
    return ldexp((double)((1 << f->mantissa_bits) + m), e - f->bias - f->mantissa_bits);
}

static inline bool rne16_is_nan(const rne16_format *f, uint16_t h) {
    return (h & 0x7FFFu) > f->inf;
}

static inline uint16_t rne16(const rne16_format *f, float x) {
    if (isnan(x)) return (uint16_t)(f->inf | (1u << (f->mantissa_bits - 1))); // a quiet NaN
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs((double)x);
    if (a >= rne16_value(f, f->inf)) return sign | f->inf; // rounds past the largest finite value
    uint16_t lo = 0, hi = f->inf; // value(lo) <= a < value(hi)
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (rne16_value(f, mid) <= a) lo = mid;
        else hi = mid;
    }
    // Both differences are exact in double: a has 24 significant bits, the
    // neighbours at most 11, and they lie within one unit of each other.
    double below = a - rne16_value(f, lo), above = rne16_value(f, hi) - a;
    uint16_t p = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | p;
}

static inline float rne16_float_of(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static inline uint32_t rne16_bits_of(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

// The inputs every conversion is checked on (out: room for
// rne16_input_count(f) floats; returns the count): for every finite
// non-negative value v of the format, v itself, the tie halfway to the next
// value (the last one: halfway to infinity), and the floats just below and
// just above that tie - and all of those negated; then infinities, NaNs
// (quiet, signalling, negative), float subnormals and FLT_MAX, and 4096
// floats of random bits (a fixed seed: the same every run).
enum { RNE16_EXTRA = 14 + 4096 };
static inline size_t rne16_input_count(const rne16_format *f) { return (size_t)f->inf * 8 + RNE16_EXTRA; }

static inline size_t rne16_inputs(const rne16_format *f, float *out) {
    size_t n = 0;
    for (uint32_t p = 0; p < f->inf; p++) {
        double v = rne16_value(f, (uint16_t)p), tie = (v + rne16_value(f, (uint16_t)(p + 1))) / 2;
        float t = (float)tie; // exact: one bit more than the format holds
        float four[4] = {(float)v, t, nextafterf(t, 0.0f), nextafterf(t, INFINITY)};
        for (int k = 0; k < 4; k++) out[n++] = four[k], out[n++] = -four[k];
    }
    static const uint32_t special[14] = {
        0x7F800000u, 0xFF800000u,                           // infinities
        0x7FC00000u, 0x7F800001u, 0xFFC00001u, 0x7FFFFFFFu, // NaNs: quiet, signalling, negative, all ones
        0x00000001u, 0x00400000u, 0x007FFFFFu, 0x80000001u, // float subnormals
        0x7F7FFFFFu, 0xFF7FFFFFu,                           // +-FLT_MAX
        0x0DA24260u, 0x8DA24260u,                           // +-1e-30: far below every 16-bit subnormal
    };
    for (int k = 0; k < 14; k++) out[n++] = rne16_float_of(special[k]);
    uint64_t s = 0x9E3779B97F4A7C15u;
    for (int k = 0; k < 4096; k++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        out[n++] = rne16_float_of((uint32_t)(s >> 32));
    }
    return n;
}

// How one input relates to the format, for messages.
static inline const char *rne16_kind(const rne16_format *f, float x) {
    if (isnan(x)) return "a NaN";
    if (isinf(x)) return "an infinity";
    uint16_t r = rne16(f, x);
    if ((r & 0x7FFFu) == f->inf) return "overflows to infinity";
    double a = fabs((double)x), v = rne16_value(f, r & 0x7FFFu);
    if (a == v) return (r & 0x7FFFu) < (1u << f->mantissa_bits) ? "an exact subnormal" : "exact";
    uint16_t lo = a < v ? (uint16_t)((r & 0x7FFFu) - 1) : (uint16_t)(r & 0x7FFFu);
    double tie = (rne16_value(f, lo) + rne16_value(f, (uint16_t)(lo + 1))) / 2;
    if (a == tie) return "a tie (to even)";
    return a < tie ? "below a tie" : "above a tie";
}

// Compares got[i] with rne16(inputs[i]) for n values (NaN: any NaN); the
// number wrong, the first of them in *first (or n when none).
static inline size_t rne16_wrong(const rne16_format *f, const float *inputs, const uint16_t *got, size_t n,
                                 size_t *first) {
    size_t wrong = 0;
    *first = n;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = rne16(f, inputs[i]);
        bool ok = rne16_is_nan(f, want) ? rne16_is_nan(f, got[i]) : got[i] == want;
        if (!ok && wrong++ == 0) *first = i;
    }
    return wrong;
}

#endif
