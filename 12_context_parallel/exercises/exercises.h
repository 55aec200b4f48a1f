// exercises.h - the functions chapter 12's exercise asks you to write.
//
// You write them in merge_partials.c; check_merge_partials.c calls them,
// so keep these signatures. Check them from the course's top folder with
//   make check-exercise EX=12/merge_partials
#ifndef EXERCISES_12_H
#define EXERCISES_12_H

// Causal attention of nq queries to ONE BLOCK of nk keys, one head of hs
// channels, as a rank of ring attention computes it for the block that is
// visiting: q (nq x hs), k and v (nk x hs), row-major. qpos[i] and kpos[j]
// are the tokens' positions in the WHOLE sequence: query i sees key j when
// kpos[j] <= qpos[i]. With score s_ij = q_i . k_j / sqrt(hs), over the keys
// query i sees:
//   out[i] (hs)  <- sum_j softmax(s_i)_j v_j   (the partial result)
//   lse[i]       <- log sum_j exp(s_ij)        (its log-sum-exp)
// A query that sees no key of the block: out[i] all 0, lse[i] = -INFINITY.
void partial_attention(const float *q, const float *k, const float *v, const int *qpos, const int *kpos, int nq,
                       int nk, int hs, float *out, float *lse);

// Merges the partial result of another block (out_b, lse_b) into the
// running one (out, lse), query by query: afterwards out and lse are the
// partial result and log-sum-exp over the keys of both. Either side may be
// empty (lse -INFINITY).
void merge_partials(float *out, float *lse, const float *out_b, const float *lse_b, int nq, int hs);

#endif
