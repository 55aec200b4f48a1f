// check_row_parallel.c - checks exercise 10/row_parallel.
//
// Run it with `make check-exercise EX=10/row_parallel` from the top folder.
// Groups of 1, 2, 3 and 4 ranks (started with spawn, on the cpu backend):
// every rank builds the same random layer - x (N x K), W (OC x K), b, and
// the gradient dout that comes back - takes its columns of x and W, and
// calls your row_parallel_forward and row_parallel_backward. The parent
// computes the whole layer in one process (in double) and compares:
//   out      the whole output, on every rank, the same bytes everywhere;
//   dinp     each rank's columns of dx;
//   dweight  each rank's columns of dW, ADDED to what was there;
//   dbias    the whole db on every rank, added to what was there.
// It recognises the usual mistakes by their numbers: a bias added on every
// rank (it counts W times), an output that is one rank's partial sum only,
// and gradients summed over the ranks where nothing needs a sum. A rank
// still inside your functions after EXERCISE_DEADLINE seconds (default 10)
// is called deadlocked.
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { MAX_WORLD = 4, N = 5, K = 12, OC = 7 };
static const float UNWRITTEN = 777.0f, DW0 = 0.5f, DB0 = 0.25f; // what the outputs hold before the call

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    float out[MAX_WORLD][N * OC];
    float dinp[MAX_WORLD][N * K];    // rank r fills its columns r*Ks ..
    float dweight[MAX_WORLD][OC * K];
    float dbias[MAX_WORLD][OC];
} shared_results;

static shared_results *shared;

static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside row_parallel_forward or row_parallel_backward: "
    "do all ranks make the same pg_ calls in the same order?";

// ---------------------------------------------------------------- the layer, the same on every rank
typedef struct {
    float x[N * K], w[OC * K], b[OC], dout[N * OC];
} layer;

static layer make_layer(void) {
    layer l;
    rng_t rng = rng_seed(1010);
    for (int i = 0; i < N * K; i++) l.x[i] = (float)rng_normal(&rng);
    for (int i = 0; i < OC * K; i++) l.w[i] = (float)rng_normal(&rng);
    for (int i = 0; i < OC; i++) l.b[i] = 1.0f + (float)i; // large enough to be told apart
    for (int i = 0; i < N * OC; i++) l.dout[i] = (float)rng_normal(&rng);
    return l;
}

// ---------------------------------------------------------------- the ranks
static int layer_rank(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    rank_join(&d);
    layer l = make_layer();
    int Ks = K / world, first = rank * Ks;
    float inp[N * K], w[OC * K], out[N * OC], dinp[N * K], dw[OC * K], db[OC];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < Ks; k++) inp[n * Ks + k] = l.x[n * K + first + k];
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < Ks; k++) w[o * Ks + k] = l.w[o * K + first + k];
    for (int i = 0; i < N * OC; i++) out[i] = UNWRITTEN;
    for (int i = 0; i < N * Ks; i++) dinp[i] = UNWRITTEN;
    for (int i = 0; i < OC * Ks; i++) dw[i] = DW0;
    for (int i = 0; i < OC; i++) db[i] = DB0;
    arm_deadline(rank);
    row_parallel_forward(d.pg, out, inp, w, l.b, N, Ks, OC);
    row_parallel_backward(d.pg, dinp, dw, db, l.dout, inp, w, N, Ks, OC);
    alarm(0);
    memcpy(shared->out[rank], out, sizeof out);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < Ks; k++) shared->dinp[rank][n * K + first + k] = dinp[n * Ks + k];
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < Ks; k++) shared->dweight[rank][o * K + first + k] = dw[o * Ks + k];
    memcpy(shared->dbias[rank], db, sizeof db);
    rank_finished(rank);
    dist_finish(&d);
    return 0;
}

// ---------------------------------------------------------------- the parent
static bool close_to(double got, double want) { return fabs(got - want) <= 1e-4 * fmax(1.0, fabs(want)); }

// The whole layer in one process, in double.
typedef struct {
    double out[N * OC], partial[MAX_WORLD][N * OC], dx[N * K], dw[OC * K], db[OC];
} reference;

static reference compute_reference(const layer *l, int world) {
    reference r;
    memset(&r, 0, sizeof r);
    int Ks = K / world;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            for (int k = 0; k < K; k++) r.partial[k / Ks][n * OC + o] += (double)l->x[n * K + k] * l->w[o * K + k];
            for (int q = 0; q < world; q++) r.out[n * OC + o] += r.partial[q][n * OC + o];
            r.out[n * OC + o] += l->b[o];
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int o = 0; o < OC; o++) r.dx[n * K + k] += (double)l->dout[n * OC + o] * l->w[o * K + k];
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) r.dw[o * K + k] += (double)l->dout[n * OC + o] * l->x[n * K + k];
    for (int o = 0; o < OC; o++)
        for (int n = 0; n < N; n++) r.db[o] += l->dout[n * OC + o];
    return r;
}

static bool check_forward(const layer *l, const reference *ref, int world) {
    for (int q = 0; q < world; q++)
        for (int i = 0; i < N * OC; i++) {
            float got = shared->out[q][i];
            double want = ref->out[i], bias = l->b[i % OC];
            if (close_to(got, want)) {
                if (memcmp(&got, &shared->out[0][i], sizeof got) == 0) continue;
                verdict(false, "%d ranks: out[%d] is %.9g on rank %d but %.9g on rank 0: the sum must be the "
                        "same bytes on every rank (pg_all_reduce gives that; do not add in your own order)",
                        world, i, got, q, shared->out[0][i]);
                return false;
            }
            const char *hint = "";
            if (got == UNWRITTEN) hint = ": out was never written";
            else if (world > 1 && close_to(got, want + (world - 1) * bias))
                hint = ": the bias was added on every rank BEFORE the sum, so it counts once per rank; add it "
                       "once, after the all-reduce";
            else if (world > 1 && close_to(got, ref->partial[q][i] + bias))
                hint = ": that is this rank's partial sum x_r W_r^T + b only; sum the partial sums over the "
                       "ranks (pg_all_reduce) before adding the bias";
            else if (world > 1 && close_to(got, ref->partial[q][i]))
                hint = ": this rank's partial sum only, and no bias";
            else if (close_to(got, want - bias)) hint = ": the bias is missing";
            verdict(false, "%d rank(s): out[row %d, output %d] on rank %d: got %.7g, expected %.7g%s", world,
                    i / OC, i % OC, q, got, want, hint);
            return false;
        }
    return true;
}

static bool check_backward(const reference *ref, int world) {
    int Ks = K / world;
    for (int q = 0; q < world; q++) {
        for (int n = 0; n < N; n++)
            for (int k = q * Ks; k < (q + 1) * Ks; k++) {
                float got = shared->dinp[q][n * K + k];
                double want = ref->dx[n * K + k], summed = 0;
                if (close_to(got, want)) continue;
                for (int p = 0; p < world; p++) summed += ref->dx[n * K + p * Ks + k - q * Ks];
                const char *hint = got == UNWRITTEN ? ": dinp was never written"
                                   : world > 1 && close_to(got, summed)
                                       ? ": dinp was summed over the ranks, but each rank's dinp is the gradient of "
                                         "its OWN columns of x, and needs nobody else's numbers"
                                       : "";
                verdict(false, "%d rank(s): dinp[row %d, channel %d] on rank %d: got %.7g, expected %.7g%s", world,
                        n, k, q, got, want, hint);
                return false;
            }
        for (int o = 0; o < OC; o++)
            for (int k = q * Ks; k < (q + 1) * Ks; k++) {
                float got = shared->dweight[q][o * K + k];
                double want = DW0 + ref->dw[o * K + k];
                if (close_to(got, want)) continue;
                const char *hint = close_to(got, ref->dw[o * K + k]) ? ": it REPLACED dweight's old contents: add to it"
                                   : world > 1 && close_to(got, DW0 + world * ref->dw[o * K + k])
                                       ? ": summed over the ranks: every rank already has all it needs (dout and its "
                                         "own columns of x)"
                                       : got == DW0 ? ": dweight was not changed at all" : "";
                verdict(false, "%d rank(s): dweight[output %d, channel %d] on rank %d: got %.7g, expected %.7g%s",
                        world, o, k, q, got, want, hint);
                return false;
            }
        for (int o = 0; o < OC; o++) {
            float got = shared->dbias[q][o];
            double want = DB0 + ref->db[o];
            if (close_to(got, want)) {
                if (memcmp(&got, &shared->dbias[0][o], sizeof got) == 0) continue;
                verdict(false, "%d ranks: dbias[%d] is %.9g on rank %d but %.9g on rank 0: the bias is the same "
                        "tensor on every rank, and so must its gradient be, byte for byte", world, o, got, q,
                        shared->dbias[0][o]);
                return false;
            }
            const char *hint = world > 1 && close_to(got, DB0 + world * ref->db[o])
                                   ? ": summed over the ranks: every rank has all of dout, so each computes the whole "
                                     "dbias itself, and a sum counts it once per rank"
                               : close_to(got, ref->db[o]) ? ": it REPLACED dbias's old contents: add to it"
                               : got == DB0 ? ": dbias was not changed at all" : "";
            verdict(false, "%d rank(s): dbias[%d] on rank %d: got %.7g, expected %.7g%s", world, o, q, got, want, hint);
            return false;
        }
    }
    return true;
}

int main(void) {
    printf("check 10/row_parallel: a row-parallel linear layer, forward and backward (row_parallel.c)\n");
    shared = ranks_setup(sizeof *shared, "row_parallel_forward or row_parallel_backward", deadlock_verdict);
    layer l = make_layer();
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d rank(s)", world);
        reference ref = compute_reference(&l, world);
        if (run_ranks(world, layer_rank, what) && check_forward(&l, &ref, world) && check_backward(&ref, world))
            verdict(true, "%d rank(s), %d inputs each: out, the same bytes on every rank; dinp, dweight, dbias", world,
                    K / world);
    }
    ranks_teardown();
    return check_finish("your row-parallel layer computes the whole layer's output and its gradients, on 1 to 4 "
                        "ranks");
}
