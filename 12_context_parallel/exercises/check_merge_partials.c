// check_merge_partials.c - checks exercise 12/merge_partials.
//
// Run it with `make check-exercise EX=12/merge_partials` from the top
// folder. One head of 4 channels; 8 queries at positions 10..17 of a
// sequence of 24; three blocks of 8 keys: A at 0..7 (before every query),
// B at 8..15 (the diagonal: the causal mask cuts through it), C at 16..23
// (only queries 16 and 17 see any of it). The reference is computed here
// in double. It checks
//   partial_attention  on each block (out and lse), and on block A with
//                      scores large enough that exp overflows unless the
//                      largest is taken off first;
//   merge_partials     from an empty running result (lse -inf), then C, A
//                      and B merged in turn (from the reference partials,
//                      so that a slip in one function is not blamed on the
//                      other), against one softmax over all the keys.
// It names the usual slips by their numbers: partial results added or
// averaged without rescaling, the diagonal block's causal mask forgotten,
// positions taken as local (0, 1, 2 ... in the block), and NaN where a
// block has no key a query sees.
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { HS = 4, NQ = 8, NB = 8, BLOCKS = 3, FIRST_Q = 10 };
static const float UNWRITTEN = 777.0f;

typedef struct {
    float q[NQ * HS], k[BLOCKS * NB * HS], v[BLOCKS * NB * HS];
    int qpos[NQ], kpos[BLOCKS * NB];
} problem;

static problem make_problem(double scale) {
    problem p;
    rng_t rng = rng_seed(1212);
    for (int i = 0; i < NQ * HS; i++) p.q[i] = (float)(scale * rng_normal(&rng));
    for (int i = 0; i < BLOCKS * NB * HS; i++) p.k[i] = (float)(scale * rng_normal(&rng)), p.v[i] = (float)rng_normal(&rng);
    for (int i = 0; i < NQ; i++) p.qpos[i] = FIRST_Q + i;
    for (int j = 0; j < BLOCKS * NB; j++) p.kpos[j] = j;
    return p;
}

// The partial result of query i over keys [first, first + n): causal by
// global position, by local index (local), or not at all (unmasked).
typedef enum { GLOBAL, LOCAL, UNMASKED } masking;
static void reference(const problem *p, int i, int first, int n, masking how, double *out, double *lse) {
    double s[BLOCKS * NB], top = -INFINITY, sum = 0;
    for (int c = 0; c < HS; c++) out[c] = 0;
    for (int j = 0; j < n; j++) {
        bool sees = how == UNMASKED || (how == GLOBAL ? p->kpos[first + j] <= p->qpos[i] : j <= i);
        s[j] = -INFINITY;
        if (!sees) continue;
        double d = 0;
        for (int c = 0; c < HS; c++) d += (double)p->q[i * HS + c] * p->k[(first + j) * HS + c];
        s[j] = d / sqrt((double)HS);
        top = fmax(top, s[j]);
    }
    if (top == -INFINITY) { *lse = -INFINITY; return; }
    for (int j = 0; j < n; j++) {
        if (s[j] == -INFINITY) continue;
        double w = exp(s[j] - top);
        sum += w;
        for (int c = 0; c < HS; c++) out[c] += w * p->v[(first + j) * HS + c];
    }
    for (int c = 0; c < HS; c++) out[c] /= sum;
    *lse = top + log(sum);
}

static bool near_value(double got, double want) {
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= 1e-4 * fmax(1.0, fabs(want));
}

// Does (out, lse) of query i match this reference?
static bool matches(const problem *p, int i, int first, int n, masking how, const float *out, float lse) {
    double want[HS], want_lse;
    reference(p, i, first, n, how, want, &want_lse);
    if (!near_value(lse, want_lse)) return false;
    for (int c = 0; c < HS; c++)
        if (!near_value(out[c], want[c])) return false;
    return true;
}

static bool check_partial(const problem *p, int block, const char *what) {
    float out[NQ * HS], lse[NQ];
    for (int i = 0; i < NQ * HS; i++) out[i] = UNWRITTEN;
    for (int i = 0; i < NQ; i++) lse[i] = UNWRITTEN;
    int first = block * NB;
    partial_attention(p->q, p->k + first * HS, p->v + first * HS, p->qpos, p->kpos + first, NQ, NB, HS, out, lse);
    for (int i = 0; i < NQ; i++) {
        if (matches(p, i, first, NB, GLOBAL, out + i * HS, lse[i])) continue;
        double want[HS], want_lse;
        reference(p, i, first, NB, GLOBAL, want, &want_lse);
        const char *hint = "";
        bool nan = isnan(lse[i]);
        for (int c = 0; c < HS; c++) nan |= isnan(out[i * HS + c]);
        if (out[i * HS] == UNWRITTEN || lse[i] == UNWRITTEN) hint = ": out or lse was never written";
        else if (matches(p, i, first, NB, LOCAL, out + i * HS, lse[i]))
            hint = ": that is the mask by the keys' and queries' places in the BLOCK (j <= i); the mask compares "
                   "their positions in the whole sequence, kpos[j] <= qpos[i]";
        else if (matches(p, i, first, NB, UNMASKED, out + i * HS, lse[i]))
            hint = ": that is attention to EVERY key of the block: the causal mask is forgotten (on the diagonal "
                   "block some keys come after the query)";
        else if (nan && want_lse == -INFINITY)
            hint = ": NaN where the query sees no key of the block: give it out 0 and lse -INFINITY";
        else if (nan || isinf(lse[i]))
            hint = ": inf or NaN: exp of a large score overflows a float (exp(89) is inf); subtract the largest "
                   "score of the row before exp, and add it back to lse";
        verdict(false, "%s: query %d (position %d): got lse %.6g, out[0] %.6g; expected lse %.6g, out[0] %.6g%s", what,
                i, p->qpos[i], lse[i], out[i * HS], want_lse, want[0], hint);
        return false;
    }
    verdict(true, "%s", what);
    return true;
}

static bool check_merge(const problem *p) {
    float out[NQ * HS], lse[NQ], part[BLOCKS][NQ * HS], part_lse[BLOCKS][NQ];
    for (int b = 0; b < BLOCKS; b++)
        for (int i = 0; i < NQ; i++) {
            double o[HS], l;
            reference(p, i, b * NB, NB, GLOBAL, o, &l);
            for (int c = 0; c < HS; c++) part[b][i * HS + c] = (float)o[c];
            part_lse[b][i] = (float)l;
        }
    for (int i = 0; i < NQ * HS; i++) out[i] = 0;
    for (int i = 0; i < NQ; i++) lse[i] = -INFINITY; // the running result before any block
    // C first: for queries 10..15 both sides are then empty (lse -inf).
    for (int b = BLOCKS - 1, n = 0; n < BLOCKS; n++, b = n - 1) merge_partials(out, lse, part[b], part_lse[b], NQ, HS);
    for (int i = 0; i < NQ; i++) {
        if (matches(p, i, 0, BLOCKS * NB, GLOBAL, out + i * HS, lse[i])) continue;
        double want[HS], want_lse, sum = 0, mean = 0;
        reference(p, i, 0, BLOCKS * NB, GLOBAL, want, &want_lse);
        int seen = 0;
        for (int b = 0; b < BLOCKS; b++)
            if (part_lse[b][i] != -INFINITY) sum += part[b][i * HS], seen++;
        mean = sum / seen;
        const char *hint = "";
        if (isnan(out[i * HS]) || isnan(lse[i]))
            hint = ": NaN: a block whose lse is -INFINITY (the query sees none of its keys) must weigh 0 - "
                   "exp(-inf - top) is 0, but -inf - (-inf) is NaN: merging into the empty start needs its own case";
        else if (near_value(out[i * HS], sum))
            hint = ": the partial results were ADDED; each is already an average, weighted by its softmax's own "
                   "sum: rescale each by exp(lse_side - lse_merged) before adding";
        else if (near_value(out[i * HS], mean))
            hint = ": the partial results were AVERAGED; a block of one unlikely key would weigh as much as a block "
                   "of likely ones: weigh each by exp(lse_side - lse_merged)";
        else if (near_value(out[i * HS], want[0]) && !near_value(lse[i], want_lse))
            hint = ": out is right, lse is not: the merged lse is log(exp(lse) + exp(lse_b)), which the next "
                   "merge needs";
        verdict(false, "merge of C, A, B: query %d: got lse %.6g, out[0] %.6g; expected lse %.6g, out[0] %.6g%s", i,
                lse[i], out[i * HS], want_lse, want[0], hint);
        return false;
    }
    verdict(true, "merge of blocks C, A, B into an empty running result equals one softmax over all 24 keys");
    return true;
}

int main(void) {
    problem p = make_problem(1.0), big = make_problem(14.0);
    // In this order, each only once the one before it passes: the first slip is the one to fix.
    if (check_partial(&p, 0, "partial attention to block A (keys 0..7, before every query)") &&
        check_partial(&p, 1, "partial attention to block B (keys 8..15, the diagonal: the causal mask cuts through it)") &&
        check_partial(&p, 2, "partial attention to block C (keys 16..23: queries 10..15 see none of them)"))
        check_partial(&big, 0, "partial attention to block A with scores in the hundreds (exp overflows unless the "
                      "largest is subtracted)");
    check_merge(&p);
    return check_finish("partial attention by global position and the merge by log-sum-exps, as ring attention does");
}
