// check_route.c - checks exercise 13/route.
//
// Run it with `make check-exercise EX=13/route` from the top folder. One
// process: 4 sequences of 6 tokens, 4 experts, top 2, routed with
// capacity 1 over 2 groups (some choices are dropped), and dropless; your
// moe_route and moe_combine against a reference written here. It names the
// usual slips by their numbers: gates left as probabilities, capacity
// counted over the whole batch or over contiguous blocks of sequences
// instead of the groups a rank holds, second choices served before first
// ones, and a token whose every choice was dropped leaving without its
// residual stream.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { B = 4, T = 6, N = B * T, E = 4, K = 2, G = 2, C = 3 };

// The reference, with the slips it recognises as switches.
typedef enum { RIGHT, WHOLE_BATCH, CONTIGUOUS, TOKEN_MAJOR } grouping;

static void reference(const float *probs, double f, grouping how, int *choice, float *gate, int *kept) {
    for (int n = 0; n < N; n++) {
        const float *p = probs + n * E;
        double sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= choice[n * K + j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            choice[n * K + k] = best, sum += p[best];
        }
        for (int k = 0; k < K; k++) gate[n * K + k] = (float)(p[choice[n * K + k]] / sum);
    }
    int groups = how == WHOLE_BATCH ? 1 : G, tokens[G] = {0}, served[G][E] = {{0}};
    for (int n = 0; n < N; n++) tokens[how == CONTIGUOUS ? n * groups / N : (n / T) % groups]++;
    for (int i = 0; i < N * K; i++) {
        int n = how == TOKEN_MAJOR ? i / K : i % N, k = how == TOKEN_MAJOR ? i % K : i / N;
        int g = how == CONTIGUOUS ? n * groups / N : (n / T) % groups, e = choice[n * K + k];
        long cap = f > 0 ? (long)ceil(f * tokens[g] * K / E) : N;
        kept[n * K + k] = served[g][e] < cap;
        served[g][e] += served[g][e] < cap;
    }
}

static bool same_ints(const int *a, const int *b, int n) { return !memcmp(a, b, sizeof(int) * (size_t)n); }

static void check_case(const char *what, const float *probs, double f) {
    int choice[N * K], kept[N * K], want_choice[N * K], want_kept[N * K];
    float gate[N * K], want_gate[N * K];
    for (int i = 0; i < N * K; i++) choice[i] = -1, kept[i] = -1, gate[i] = 777;
    moe_route(probs, N, E, K, T, G, f, choice, gate, kept);
    reference(probs, f, RIGHT, want_choice, want_gate, want_kept);
    int bad = -1;
    for (int i = 0; i < N * K && bad < 0; i++) bad = choice[i] != want_choice[i] ? i : -1;
    if (bad >= 0) {
        verdict(false, "%s: choices: token %d, choice %d: got expert %d, expected %d (the k-th largest probability; "
                "ties: the lower index)", what, bad / K, bad % K, choice[bad], want_choice[bad]);
        return;
    }
    verdict(true, "%s: choices: every token's top 2, in order", what);
    double worst = 0, sum_worst = 0;
    bool plain = true;
    for (int n = 0; n < N; n++) {
        double sum = 0;
        for (int k = 0; k < K; k++) {
            worst = fmax(worst, fabs(gate[n * K + k] - want_gate[n * K + k]));
            plain &= fabs(gate[n * K + k] - probs[n * E + choice[n * K + k]]) < 1e-6;
            sum += gate[n * K + k];
        }
        sum_worst = fmax(sum_worst, fabs(sum - 1));
    }
    if (plain && sum_worst > 1e-3)
        verdict(false, "%s: gates not renormalised: they are the probabilities, and a token's add up to %.3f, not 1: "
                "divide each by the sum of the K kept", what, 1 - sum_worst);
    else
        verdict(worst < 1e-5, "%s: gates renormalised over the kept K (largest difference %.2g)", what, worst);
    if (same_ints(kept, want_kept, N * K)) {
        int dropped = 0;
        for (int i = 0; i < N * K; i++) dropped += !kept[i];
        verdict(true, "%s: capacity: %d of %d assignments dropped, the reference's", what, dropped, N * K);
        return;
    }
    int k2[N * K];
    float g2[N * K];
    const char *why = "not the reference's (first choices first, each in token order; capacity per group)";
    reference(probs, f, WHOLE_BATCH, want_choice, g2, k2);
    if (same_ints(kept, k2, N * K)) why = "capacity counted over the whole batch: count it per group, token n in group (n / T) % G";
    reference(probs, f, CONTIGUOUS, want_choice, g2, k2);
    if (same_ints(kept, k2, N * K))
        why = "capacity counted over contiguous blocks of sequences: the group of sequence j is j mod G (the tokens rank "
              "j mod G holds), not j * G / B";
    reference(probs, f, TOKEN_MAJOR, want_choice, g2, k2);
    if (same_ints(kept, k2, N * K)) why = "second choices served before later tokens' first choices: serve every token's first choice first";
    verdict(false, "%s: capacity: kept/dropped %s", what, why);
}

static void check_combine(const float *probs) {
    int choice[N * K], kept[N * K];
    float gate[N * K], res[N * C], y[N * K * C], out[N * C];
    reference(probs, 0.5, RIGHT, choice, gate, kept); // capacity 0.5: some tokens lose both choices
    rng_t rng = rng_seed(77);
    for (int i = 0; i < N * C; i++) res[i] = (float)rng_normal(&rng), out[i] = 777;
    for (int i = 0; i < N * K * C; i++) y[i] = (float)rng_normal(&rng);
    moe_combine(out, res, y, gate, kept, N, K, C);
    int wrong = -1, all_dropped = -1;
    bool lost = false;
    for (int n = 0; n < N; n++) {
        bool none = true;
        for (int k = 0; k < K; k++) none &= !kept[n * K + k];
        if (none && all_dropped < 0) all_dropped = n;
        for (int c = 0; c < C; c++) {
            double want = res[n * C + c];
            for (int k = 0; k < K; k++)
                if (kept[n * K + k]) want += (double)gate[n * K + k] * y[(n * K + k) * C + c];
            if (fabs(out[n * C + c] - want) > 1e-5 && wrong < 0) wrong = n;
            if (none && fabs(out[n * C + c] - want) > 1e-5) lost = true;
        }
    }
    if (all_dropped < 0)
        verdict(false, "combine: the check's case has no fully dropped token (the check is broken, not you)");
    else if (lost)
        verdict(false, "combine: token %d, whose every choice was dropped, left without its residual stream: out = res "
                "for it (a dropped token passes through)", all_dropped);
    else
        verdict(wrong < 0, "combine: out = res + the gate-weighted kept outputs%s",
                wrong < 0 ? ", and the fully dropped tokens pass through on their residual" : " - not for every token");
}

int main(void) {
    float probs[N * E];
    rng_t rng = rng_seed(13);
    for (int n = 0; n < N; n++) { // a softmax of random logits, leaning to experts 0 and 1 so that some overflow
        double sum = 0;
        for (int e = 0; e < E; e++) sum += probs[n * E + e] = (float)exp(rng_normal(&rng) + (e < 2 ? 1.0 : 0.0));
        for (int e = 0; e < E; e++) probs[n * E + e] = (float)(probs[n * E + e] / sum);
    }
    check_case("dropless", probs, 0);
    check_case("capacity 1 over 2 groups", probs, 1.0);
    check_combine(probs);
    return check_finish("top-k routing with renormalised gates, capacity per group, and the combine with its residual");
}
