// merge_partials.c - the reference solution of exercise 12/merge_partials
// (the exercise's text is in 12_context_parallel/exercises/merge_partials.c).
#include <math.h>

#include "exercises.h"

void partial_attention(const float *q, const float *k, const float *v, const int *qpos, const int *kpos, int nq,
                       int nk, int hs, float *out, float *lse) {
    float scale = 1.0f / sqrtf((float)hs);
    for (int i = 0; i < nq; i++) {
        float top = -INFINITY, sum = 0;
        for (int j = 0; j < nk; j++) {
            if (kpos[j] > qpos[i]) continue; // the causal mask, by global position
            float s = 0;
            for (int c = 0; c < hs; c++) s += q[i * hs + c] * k[j * hs + c];
            top = fmaxf(top, s * scale);
        }
        for (int c = 0; c < hs; c++) out[i * hs + c] = 0;
        if (top == -INFINITY) { // no key of this block is visible
            lse[i] = -INFINITY;
            continue;
        }
        for (int j = 0; j < nk; j++) {
            if (kpos[j] > qpos[i]) continue;
            float s = 0;
            for (int c = 0; c < hs; c++) s += q[i * hs + c] * k[j * hs + c];
            float w = expf(s * scale - top);
            sum += w;
            for (int c = 0; c < hs; c++) out[i * hs + c] += w * v[j * hs + c];
        }
        for (int c = 0; c < hs; c++) out[i * hs + c] /= sum;
        lse[i] = top + logf(sum);
    }
}

void merge_partials(float *out, float *lse, const float *out_b, const float *lse_b, int nq, int hs) {
    for (int i = 0; i < nq; i++) {
        if (lse_b[i] == -INFINITY) continue; // nothing to add
        if (lse[i] == -INFINITY) {           // nothing yet: take the other side
            for (int c = 0; c < hs; c++) out[i * hs + c] = out_b[i * hs + c];
            lse[i] = lse_b[i];
            continue;
        }
        float top = fmaxf(lse[i], lse_b[i]);
        float wa = expf(lse[i] - top), wb = expf(lse_b[i] - top), sum = wa + wb;
        for (int c = 0; c < hs; c++) out[i * hs + c] = (wa * out[i * hs + c] + wb * out_b[i * hs + c]) / sum;
        lse[i] = top + logf(sum);
    }
}
