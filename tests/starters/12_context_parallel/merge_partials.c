// merge_partials.c - EXERCISE: attention over one block of keys, and the
// merge of two partial results by their log-sum-exps.
//
// Ring attention (this chapter, gpt/context_parallel.h) never has all the
// keys of a sequence at once: a rank attends its queries to one visiting
// block of keys and values at a time, and keeps a running result. For one
// query with scores s_j over a set of keys J, the partial result is
//     o_J = sum_{j in J} exp(s_j) v_j / Z_J,   Z_J = sum_{j in J} exp(s_j),
// and its log-sum-exp is lse_J = log Z_J. For two DISJOINT sets A and B,
// the result over both is a weighted average of the two partial results,
// each weighted by its share of the softmax's sum:
//     lse = log(exp(lse_A) + exp(lse_B))
//     o   = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B
//
//   1. partial_attention: for each query i, the keys it sees are those at
//      or before its GLOBAL position (kpos[j] <= qpos[i]); the positions
//      are the tokens' places in the whole sequence, not 0, 1, 2 ... in
//      the block. Compute the scores q_i . k_j / sqrt(hs) of those keys,
//      their largest (subtract it before exp: exp(90) is already inf in
//      float), the weights, the weighted average of v, and lse.
//   2. merge_partials: the two formulas above, per query. A side with no
//      key (lse -INFINITY) has weight 0: make sure it gives 0, not NaN.
//
//     void partial_attention(const float *q, const float *k, const float *v, const int *qpos,
//                            const int *kpos, int nq, int nk, int hs, float *out, float *lse);
//     void merge_partials(float *out, float *lse, const float *out_b, const float *lse_b, int nq, int hs);
//
// Row-major: q[i * hs + c], k[j * hs + c], out[i * hs + c]. Plain loops
// (math.h's expf, logf, sqrtf; INFINITY).
//
// Check it (from the course's top folder):
//     make check-exercise EX=12/merge_partials
// The check attends 8 queries to three blocks of keys (one before them,
// one overlapping them - the diagonal, where the causal mask cuts - and one
// partly after them), merges the partial results, and compares them with
// one softmax over all the keys. It names the usual slips: partial results
// added or averaged without rescaling, the diagonal block's causal mask
// forgotten, positions taken as local, exp without the largest score taken
// off, and a block with no visible key turned into NaN.
#include "exercises.h"

void partial_attention(const float *q, const float *k, const float *v, const int *qpos, const int *kpos, int nq,
                       int nk, int hs, float *out, float *lse) {
    // TODO: per query, the scores of the keys it sees, their softmax, the average of v, and lse.
    (void)q, (void)k, (void)v, (void)qpos, (void)kpos, (void)nq, (void)nk, (void)hs, (void)out, (void)lse;
}

void merge_partials(float *out, float *lse, const float *out_b, const float *lse_b, int nq, int hs) {
    // TODO: per query, the two weights exp(lse - lse'), exp(lse_b - lse'), and the merged out and lse.
    (void)out, (void)lse, (void)out_b, (void)lse_b, (void)nq, (void)hs;
}
