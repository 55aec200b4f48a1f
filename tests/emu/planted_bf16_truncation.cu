// planted_bf16_truncation.cu - a kernel narrows floats to bf16 by keeping
// their upper 16 bits: truncation, where CUDA's __float2bfloat16 rounds to
// the nearest bf16, ties to even. The numbers differ by one unit in the
// last place at most, which every tolerance forgives, and a model trained
// this way drifts. So this test is bit-exact: every case below has the one
// answer a GPU's conversion gives - ties (to even, up and down), just above
// and below a tie, a carry into the exponent, overflow to infinity,
// infinities, NaNs (one canonical NaN, 0x7FFF), zeros and subnormals. With
// --fixed it checks __float2bfloat16, __float2bfloat16_rn, the
// __nv_bfloat16 constructor and __floats2bfloat162_rn; it runs on the
// emulated GPU and, in make gpu-check, on a real one.
#include <cuda_bf16.h>
#include <stdint.h>

#include "planted.h"

struct bf16_case {
    uint32_t in;      // a float's bits
    uint16_t rounded; // the bf16 bits of round-to-nearest-even
};

static const bf16_case cases[] = {
    {0x3F800000u, 0x3F80}, // 1.0: exact
    {0x3F808000u, 0x3F80}, // a tie, the even neighbour below: stays
    {0x3F818000u, 0x3F82}, // a tie, the odd neighbour below: up to even
    {0x3F808001u, 0x3F81}, // just above a tie: up
    {0x3F807FFFu, 0x3F80}, // just below a tie: down
    {0xBF818000u, 0xBF82}, // a negative tie: to even, away from zero here
    {0x3FFFFFFFu, 0x4000}, // the carry moves into the exponent
    {0x7F7F7FFFu, 0x7F7F}, // the largest finite bf16
    {0x7F7F8000u, 0x7F80}, // a tie above it: up, to infinity
    {0x7F7FFFFFu, 0x7F80}, // FLT_MAX overflows to infinity
    {0xFF7FFFFFu, 0xFF80}, // and -FLT_MAX to -infinity
    {0x7F800000u, 0x7F80}, // infinity
    {0xFF800000u, 0xFF80}, // -infinity
    {0x7FC00000u, 0x7FFF}, // a quiet NaN: the canonical NaN
    {0x7F800001u, 0x7FFF}, // a signalling NaN (whose truncation would be infinity)
    {0xFFC00001u, 0x7FFF}, // a negative NaN
    {0x00000000u, 0x0000}, // zero
    {0x80000000u, 0x8000}, // negative zero
    {0x00008000u, 0x0000}, // a subnormal tie, even below
    {0x00018000u, 0x0002}, // a subnormal tie, odd below
    {0x00008001u, 0x0001}, // just above a subnormal tie
    {0x007FFFFFu, 0x0080}, // the largest subnormal rounds up to the smallest normal
};
enum { CASES = sizeof cases / sizeof cases[0], WAYS = 5 };

// out[way * CASES + i]: case i narrowed the way-th way (way 0: the bug's truncation).
__global__ void narrow(const uint32_t *in, uint16_t *out, bool fixed) {
    int i = threadIdx.x;
    float x = __uint_as_float(in[i]);
    if (!fixed) {
        out[i] = (uint16_t)(in[i] >> 16); // the bug: keep the upper half
        return;
    }
    __nv_bfloat16 a = __float2bfloat16(x), b = __float2bfloat16_rn(x), c = __nv_bfloat16(x);
    __nv_bfloat162 pair = __floats2bfloat162_rn(x, -x);
    out[0 * CASES + i] = __bfloat16_as_ushort(a);
    out[1 * CASES + i] = __bfloat16_as_ushort(b);
    out[2 * CASES + i] = __bfloat16_as_ushort(c);
    out[3 * CASES + i] = __bfloat16_as_ushort(pair.x);
    out[4 * CASES + i] = __bfloat16_as_ushort(pair.y);
}

int main(int argc, char **argv) {
    bool fixed = planted_fixed(argc, argv);
    uint32_t in[CASES];
    uint16_t out[WAYS * CASES];
    for (int i = 0; i < CASES; i++) in[i] = cases[i].in;
    uint32_t *dev_in;
    uint16_t *dev_out;
    CHECK(cudaMalloc(&dev_in, sizeof in));
    CHECK(cudaMalloc(&dev_out, sizeof out));
    CHECK(cudaMemcpy(dev_in, in, sizeof in, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dev_out, 0, sizeof out));
    narrow<<<1, CASES>>>(dev_in, dev_out, fixed);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dev_out, sizeof out, cudaMemcpyDeviceToHost));
    static const char *ways[WAYS] = {"__float2bfloat16", "__float2bfloat16_rn", "__nv_bfloat16(float)",
                                     "__floats2bfloat162_rn (.x)", "__floats2bfloat162_rn (.y, of -x)"};
    int wrong = 0;
    for (int w = 0; w < (fixed ? WAYS : 1); w++)
        for (int i = 0; i < CASES; i++) {
            uint16_t want = cases[i].rounded;
            if (w == 4) want = (cases[i].in & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFF : (uint16_t)(want ^ 0x8000u);
            if (out[w * CASES + i] == want) continue;
            if (wrong++ < 8)
                printf("%s(0x%08X) gave 0x%04X, round-to-nearest-even is 0x%04X\n", fixed ? ways[w] : "truncation",
                       (unsigned)cases[i].in, out[w * CASES + i], want);
        }
    printf("%d of %d bf16 conversions wrong\n", wrong, (fixed ? WAYS : 1) * CASES);
    return wrong ? 1 : 0;
}
