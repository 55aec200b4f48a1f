// check_zero1_step.c - checks exercise 09/zero1_step.
//
// Run it with `make check-exercise EX=09/zero1_step` from the top folder.
// 1, 2 and 3 ranks (started with spawn, on the cpu backend) hold the same
// 3 x 257 parameters and each its own gradients, and call your zero1_step
// for two steps. The parent steps all the parameters in one process with
// the mean gradient, as DDP would, and compares: every rank's parameters
// (to 1e-6), the same bytes on every rank, and each rank's moments of its
// own slice. A wrong result is checked against the usual slips - a sum
// where a mean belongs, a missing all-gather, a step on the wrong slice,
// no weight decay - so that the message can say which it is.
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { MAX_WORLD = 3, SLICE = 257, STEPS = 2, MOST = MAX_WORLD * SLICE };
#define LR 0.01f
#define BETA1 0.9f
#define BETA2 0.95f
#define EPS 1e-8f
#define DECAY 0.1f

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    float params[MAX_WORLD][MOST];
    float m[MAX_WORLD][SLICE], v[MAX_WORLD][SLICE];
} shared_results;

static shared_results *shared;

static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside zero1_step with no result: do all ranks make the "
    "same pg_ calls in the same order?";

static float initial(int j) { return (float)(0.5 * sin(0.37 * j)); }

// Rank r's gradient at step s (1, 2): its own numbers.
static void gradient(int rank, int step, float *out, int count) {
    rng_t rng = rng_seed(100 * (uint64_t)step + (uint64_t)rank);
    for (int j = 0; j < count; j++) out[j] = (float)rng_normal(&rng);
}

static int step_rank(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    rank_join(&d);
    int count = world * SLICE;
    float *params = shared->params[rank], grads[MOST], grad_slice[SLICE];
    for (int j = 0; j < count; j++) params[j] = initial(j);
    arm_deadline(rank);
    for (int s = 1; s <= STEPS; s++) {
        gradient(rank, s, grads, count);
        zero1_step(d.pg, params, grads, grad_slice, shared->m[rank], shared->v[rank], SLICE, s, LR, BETA1, BETA2,
                   EPS, DECAY);
    }
    alarm(0);
    rank_finished(rank);
    dist_finish(&d);
    return 0;
}

// One process, all the parameters, the gradient combined over the ranks
// as `how` says (0: the mean, 1: the sum), with weight decay `decay`;
// `only` >= 0: only that slice steps (a missing all-gather).
typedef struct {
    float p[MOST], m[MOST], v[MOST];
} reference;

static void reference_run(reference *r, int world, int how, float decay, int only) {
    int count = world * SLICE;
    float g[MOST], sum[MOST];
    for (int j = 0; j < count; j++) r->p[j] = initial(j), r->m[j] = r->v[j] = 0;
    for (int s = 1; s <= STEPS; s++) {
        for (int j = 0; j < count; j++) sum[j] = 0;
        for (int q = 0; q < world; q++) {
            gradient(q, s, g, count);
            for (int j = 0; j < count; j++) sum[j] += g[j];
        }
        double c1 = 1 - pow((double)BETA1, s), c2 = 1 - pow((double)BETA2, s);
        for (int j = 0; j < count; j++) {
            if (only >= 0 && j / SLICE != only) continue;
            float gj = how == 1 ? sum[j] : sum[j] / (float)world;
            r->m[j] = BETA1 * r->m[j] + (1 - BETA1) * gj;
            r->v[j] = BETA2 * r->v[j] + (1 - BETA2) * gj * gj;
            float mhat = r->m[j] / (float)c1, vhat = r->v[j] / (float)c2;
            r->p[j] -= LR * decay * r->p[j];
            r->p[j] -= LR * mhat / (sqrtf(vhat) + EPS);
        }
    }
}

static bool near(float got, float want) { return fabsf(got - want) <= 1e-6f * fmaxf(1.0f, fabsf(want)); }

static bool matches(const float *got, const float *want, int count) {
    for (int j = 0; j < count; j++)
        if (!near(got[j], want[j])) return false;
    return true;
}

// Why rank r's parameters are wrong, if a usual slip explains it.
static const char *hint(int world, int rank) {
    static reference alt;
    const float *got = shared->params[rank];
    int count = world * SLICE;
    bool unchanged = true;
    for (int j = 0; j < count; j++) unchanged = unchanged && got[j] == initial(j);
    if (unchanged) return "the parameters never changed: step this rank's slice and gather every rank's";
    reference_run(&alt, world, 1, DECAY, -1);
    if (matches(got, alt.p, count)) return "that is a step with the SUM of the gradients: reduce-scatter with OP_AVG";
    reference_run(&alt, world, 0, DECAY, rank);
    if (matches(got, alt.p, count))
        return "only this rank's own slice stepped, the others kept their old values: all-gather every rank's slice";
    reference_run(&alt, world, 0, 0.0f, -1);
    if (matches(got, alt.p, count)) return "that is AdamW without the weight decay (p -= lr * weight_decay * p)";
    return "compare with the steps in zero1_step.c's header";
}

static bool check_world(int world) {
    static reference want;
    reference_run(&want, world, 0, DECAY, -1);
    int count = world * SLICE;
    for (int r = 0; r < world; r++) {
        const float *got = shared->params[r];
        for (int j = 0; j < count; j++) {
            if (near(got[j], want.p[j])) continue;
            verdict(false, "%d rank(s): rank %d, parameter %d (slice %d): got %.7g, expected %.7g after %d steps: %s",
                    world, r, j, j / SLICE, got[j], want.p[j], STEPS, hint(world, r));
            return false;
        }
        if (memcmp(got, shared->params[0], sizeof(float) * (size_t)count) != 0) {
            verdict(false, "%d rank(s): rank %d's parameters differ from rank 0's in some bits: every rank must "
                    "hold the same bytes (gather the slices, do not recompute them)", world, r);
            return false;
        }
        for (int i = 0; i < SLICE; i++) {
            float wm = want.m[r * SLICE + i], wv = want.v[r * SLICE + i];
            if (near(shared->m[r][i], wm) && near(shared->v[r][i], wv)) continue;
            // Adam's step hardly changes when every gradient is N times larger; its moments do.
            bool summed = near(shared->m[r][i], wm * (float)world) && near(shared->v[r][i], wv * (float)(world * world));
            verdict(false, "%d rank(s): rank %d's moments of its slice, element %d: m %.7g, v %.7g, expected %.7g "
                    "and %.7g (the moments of parameter %d, this rank's slice)%s", world, r, i, shared->m[r][i],
                    shared->v[r][i], wm, wv, r * SLICE + i,
                    summed ? ": N and N^2 times too large, the moments of the SUM of the gradients: reduce-scatter "
                             "with OP_AVG (Adam's step hides it, the moments do not)" : "");
            return false;
        }
    }
    return true;
}

int main(void) {
    printf("check 09/zero1_step: reduce-scatter, AdamW on the slice, all-gather (zero1_step.c)\n");
    shared = ranks_setup(sizeof *shared, "zero1_step", deadlock_verdict);
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[64];
        snprintf(what, sizeof what, "%d rank(s)", world);
        if (!run_ranks(world, step_rank, what)) continue;
        if (check_world(world))
            verdict(true, "%d rank(s), %d parameters, %d steps: the parameters of one process stepping them all "
                    "with the mean gradient, the same bytes on every rank, each rank's moments of its slice",
                    world, world * SLICE, STEPS);
    }
    ranks_teardown();
    return check_finish("each rank stepped its own slice with the mean gradient and every rank gathered them all: "
                        "the optimizer's work and state split N ways, the result of DDP");
}
