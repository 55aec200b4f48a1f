// route.c - a solution of exercise 13/route: top-k routing with capacity,
// and the combine (gpt/moe.h does the same inside the model).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exercises.h"

void moe_route(const float *probs, int N, int E, int K, int T, int G, double capacity_factor, int *choice,
               float *gate, int *kept) {
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E;
        int *ch = choice + (size_t)n * K;
        double sum = 0;
        for (int k = 0; k < K; k++) { // the largest not chosen yet
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= ch[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ch[k] = best, sum += p[best];
        }
        for (int k = 0; k < K; k++) gate[(size_t)n * K + k] = (float)(p[ch[k]] / sum);
    }
    int *tokens = calloc((size_t)G, sizeof(int)), *served = calloc((size_t)G * E, sizeof(int));
    for (int n = 0; n < N; n++) tokens[(n / T) % G]++;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int g = (n / T) % G, e = choice[(size_t)n * K + k];
            long cap = capacity_factor > 0 ? (long)ceil(capacity_factor * tokens[g] * K / E) : N;
            kept[(size_t)n * K + k] = served[g * E + e] < cap;
            served[g * E + e] += served[g * E + e] < cap;
        }
    free(tokens), free(served);
}

void moe_combine(float *out, const float *res, const float *y, const float *gate, const int *kept, int N, int K,
                 int C) {
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        memcpy(o, res + (size_t)n * C, sizeof(float) * (size_t)C);
        for (int k = 0; k < K; k++)
            if (kept[(size_t)n * K + k])
                for (int c = 0; c < C; c++) o[c] += gate[(size_t)n * K + k] * y[((size_t)n * K + k) * C + c];
    }
}
