// test_float16.c - the 16-bit floats of common/pg_types.h: bf16 and IEEE
// fp16 to and from float32, which the collectives, the MPI ops and the
// gradient hooks (--grad_compress bf16|fp16) all use.
//
// Every one of the 65536 bit patterns widens and narrows back to itself
// (NaNs to a NaN), and float32 values at the edges round as IEEE 754 says:
// to nearest, ties to even, past the largest finite value to infinity,
// below the smallest subnormal to zero.
#include <math.h>

#include "pg_types.h"
#include "test.h"

static bool is_nan16(dtype_t t, uint16_t h) {
    return t == DTYPE_F16 ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

static void round_trips(dtype_t t) {
    int wrong = 0, first = -1;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        uint16_t back = f32_to_float16(t, float16_to_f32(t, (uint16_t)h));
        bool ok = is_nan16(t, (uint16_t)h) ? is_nan16(t, back) : back == h;
        if (!ok && wrong++ == 0) first = (int)h;
    }
    char name[96];
    snprintf(name, sizeof name, "float16: every %s bit pattern widens and narrows back to itself", dtype_name(t));
    EXPECT(name, wrong == 0, "%d of 65536 do not; the first: 0x%04x", wrong, first);
}

typedef struct {
    float in;
    uint16_t out;
    const char *why;
} rounding;

int main(void) {
    round_trips(DTYPE_BF16);
    round_trips(DTYPE_F16);
    const rounding f16[] = {
        {1.0f, 0x3c00, "one"},
        {-2.0f, 0xc000, "minus two"},
        {65504.0f, 0x7bff, "the largest finite fp16"},
        {65519.0f, 0x7bff, "below the halfway point to 65536: 65504"},
        {65520.0f, 0x7c00, "halfway, and 65504 is odd: rounds to infinity"},
        {1e10f, 0x7c00, "far past the range: infinity"},
        {-INFINITY, 0xfc00, "minus infinity"},
        {1.0f + 0x1p-11f, 0x3c00, "a tie between 1 and 1 + 2^-10: to even, 1"},
        {1.0f + 3 * 0x1p-11f, 0x3c02, "a tie between 1 + 2^-10 and 1 + 2^-9: to even"},
        {0x1p-14f, 0x0400, "the smallest normal"},
        {0x1p-24f, 0x0001, "the smallest subnormal"},
        {0x1p-25f, 0x0000, "half the smallest subnormal: a tie, to even, 0"},
        {3 * 0x1p-25f, 0x0002, "1.5 subnormal steps: a tie, to even, 2 steps"},
        {0x1p-14f - 0x1p-25f, 0x0400, "just below the smallest normal rounds up to it"},
        {-0.0f, 0x8000, "minus zero keeps its sign"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++) {
        uint16_t got = f32_to_f16(f16[i].in);
        if (got == f16[i].out) continue;
        bad++;
        printf("info: f32_to_f16(%.9g) = 0x%04x, expected 0x%04x (%s)\n", f16[i].in, got, f16[i].out, f16[i].why);
    }
    EXPECT("float16: fp16 rounding at the edges (ties to even, overflow, subnormals)", bad == 0,
           "%d of %zu cases wrong (listed above)", bad, sizeof f16 / sizeof f16[0]);
    uint16_t nan = f32_to_f16(NAN);
    EXPECT("float16: NaN stays NaN in fp16", is_nan16(DTYPE_F16, nan) && isnan(f16_to_f32(nan)), "got 0x%04x", nan);
    EXPECT("float16: fp16 widens subnormals exactly", f16_to_f32(0x0001) == 0x1p-24f && f16_to_f32(0x83ff) == -0x3ffp-24f,
           "0x0001 -> %g, 0x83ff -> %g", f16_to_f32(0x0001), f16_to_f32(0x83ff));
    return test_failures ? 1 : 0;
}
