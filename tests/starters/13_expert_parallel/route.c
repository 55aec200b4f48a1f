// route.c - EXERCISE: top-k routing with capacity, and the combine.
//
// A mixture-of-experts layer (gpt/moe.h) sends each token to K of its E
// experts. Write the two pieces that decide and undo it:
//
// moe_route: for every token, the K largest router probabilities (in
// order; ties go to the lower expert index), their gates renormalised so
// that a token's K gates add up to 1, and whether each choice fits in its
// expert's capacity: ceil(capacity_factor * n_g * K / E) assignments of
// each group of n_g tokens, group (n / T) % G, first choices served before
// second choices, each in token order. capacity_factor 0: everyone fits.
//
// moe_combine: out[n] = res[n] + the gate-weighted sum of token n's KEPT
// experts' outputs.
//
// The usual slips, which the check names: gates left as probabilities;
// capacity counted over the whole batch, or over contiguous blocks of
// sequences, instead of the groups a rank would hold; a token whose
// choices were all dropped leaving with nothing instead of its residual.
//
// Check it from the top folder:  make check-exercise EX=13/route
#include "exercises.h"

void moe_route(const float *probs, int N, int E, int K, int T, int G, double capacity_factor, int *choice,
               float *gate, int *kept) {
    (void)probs, (void)N, (void)E, (void)K, (void)T, (void)G, (void)capacity_factor;
    (void)choice, (void)gate, (void)kept;
    // TODO: the top K of each row, the renormalised gates, then capacity group by group.
}

void moe_combine(float *out, const float *res, const float *y, const float *gate, const int *kept, int N, int K,
                 int C) {
    (void)out, (void)res, (void)y, (void)gate, (void)kept, (void)N, (void)K, (void)C;
    // TODO: the residual, plus each kept choice's output times its gate.
}
