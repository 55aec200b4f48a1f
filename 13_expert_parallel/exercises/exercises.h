// exercises.h - the functions chapter 13's exercise asks you to write.
//
// You write them in route.c; check_route.c calls them, so keep these
// signatures. Check them from the course's top folder with
//   make check-exercise EX=13/route
#ifndef EXERCISES_13_H
#define EXERCISES_13_H

// Top-k routing with capacity, for N tokens (B sequences of T tokens, one
// after another) and E experts:
//   probs    (N, E)  the router's softmax, row by row
//   K                experts per token
//   G                capacity groups: token n belongs to group (n / T) % G
//                    (sequence j to group j mod G: the tokens rank j mod G
//                    holds when G ranks share the batch)
//   capacity_factor  an expert takes at most ceil(f * n_g * K / E) of the
//                    assignments of a group of n_g tokens (0: no limit)
// Out, for each token n and choice k (row-major, n * K + k):
//   choice   the k-th most likely expert (ties: the lower index first)
//   gate     its weight: its probability divided by the sum of the K kept
//   kept     1 if the expert took it, 0 if it was dropped. First choices
//            are served first (every token's), then second choices, ...,
//            each in token order.
void moe_route(const float *probs, int N, int E, int K, int T, int G, double capacity_factor, int *choice,
               float *gate, int *kept);

// The layer's output with its residual stream:
//   out[n] = res[n] + sum over kept k of gate[n, k] * y[n, k]
// res (N, C), y (N, K, C): expert choice[n, k]'s output for token n
// (whatever is in the rows of dropped choices must not count).
void moe_combine(float *out, const float *res, const float *y, const float *gate, const int *kept, int N, int K,
                 int C);

#endif
