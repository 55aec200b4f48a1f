// check_sync_batchnorm.c - checks exercise 04/sync_batchnorm.
//
// Run it with `make check-exercise EX=04/sync_batchnorm` from the top
// folder. One batch of 12 rows x 3 features, split over 1, 2 and 3 ranks
// (unevenly: 12; 5 + 7; 3 + 5 + 4), on the cpu backend:
//   1. your sync_batch_stats on every rank must give the whole batch's mean
//      and biased variance and its 12 rows; a wrong result is recognised
//      (the rank's own statistics, E[x^2] without - mean^2, a count that
//      assumes equal shares, the unbiased variance);
//   2. BatchNorm's forward and backward passes with your two functions:
//      every rank's input gradient must be the one a single process
//      computes on the whole batch (within 1e-4).
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { MAX_WORLD = 3, ROWS = 12, C = 3 };
#define EPS 1e-5

typedef struct {
    float mean[MAX_WORLD][C], var[MAX_WORLD][C];
    int rows[MAX_WORLD];
    float dx[ROWS][C];   // each rank writes its own rows
} shared_results;

static shared_results *shared;

static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside sync_batch_stats or sync_grad_sums with no "
    "result: do all ranks make the same pg_ calls in the same order?";

// The whole batch, the same on every rank: x and the upstream gradient dy.
static void batch(float x[ROWS][C], float dy[ROWS][C], float gamma[C]) {
    rng_t r = rng_seed(7);
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < C; j++) x[i][j] = (float)(rng_normal(&r) * (j + 1) + 2 * j), dy[i][j] = (float)rng_normal(&r);
    for (int j = 0; j < C; j++) gamma[j] = 0.5f + (float)j;
}

// Rank r of `world` holds rows [first, first + count): 12; 5 + 7; 3 + 5 + 4.
static void share(int world, int rank, int *first, int *count) {
    static const int sizes[MAX_WORLD][MAX_WORLD] = {{12, 0, 0}, {5, 7, 0}, {3, 5, 4}};
    *first = 0;
    for (int k = 0; k < rank; k++) *first += sizes[world - 1][k];
    *count = sizes[world - 1][rank];
}

// Statistics of rows [first, first + n), in double: mean and biased variance.
static void stats_of(float x[ROWS][C], int first, int n, double *mean, double *var, bool unbiased) {
    for (int j = 0; j < C; j++) {
        double s = 0, q = 0;
        for (int i = first; i < first + n; i++) s += x[i][j];
        mean[j] = s / n;
        for (int i = first; i < first + n; i++) q += (x[i][j] - mean[j]) * (x[i][j] - mean[j]);
        var[j] = q / (unbiased ? n - 1 : n);
    }
}

static int bn_rank(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    rank_join(&d);
    float x[ROWS][C], dy[ROWS][C], gamma[C], mean[C], var[C], sum_g[C], sum_gx[C];
    batch(x, dy, gamma);
    int first, n;
    share(world, rank, &first, &n);
    float *mine = &x[first][0], xhat[ROWS][C], g[ROWS][C];
    arm_deadline(rank);
    int rows = sync_batch_stats(d.pg, mine, n, C, mean, var);
    alarm(0);
    for (int j = 0; j < C; j++) shared->mean[rank][j] = mean[j], shared->var[rank][j] = var[j];
    shared->rows[rank] = rows;
    // BatchNorm: forward with those statistics, backward to the input.
    for (int i = 0; i < n; i++)
        for (int j = 0; j < C; j++) {
            xhat[i][j] = (float)((mine[i * C + j] - mean[j]) / sqrt(var[j] + EPS));
            g[i][j] = dy[first + i][j] * gamma[j];   // the gradient reaching xhat
        }
    arm_deadline(rank);
    sync_grad_sums(d.pg, &g[0][0], &xhat[0][0], n, C, sum_g, sum_gx);
    alarm(0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < C; j++)
            shared->dx[first + i][j] = (float)((g[i][j] - sum_g[j] / rows - xhat[i][j] * sum_gx[j] / rows) /
                                               sqrt(var[j] + EPS));
    rank_finished(rank);
    dist_finish(&d);
    return 0;
}

static bool near(double got, double want) { return fabs(got - want) <= 1e-4 * fmax(1.0, fabs(want)); }

// What a wrong variance or mean on rank r most likely is.
static const char *stats_hint(float x[ROWS][C], int world, int r, int j) {
    int first, n;
    share(world, r, &first, &n);
    double own_m[C], own_v[C], all_m[C], all_v[C], unb_m[C], unb_v[C];
    stats_of(x, first, n, own_m, own_v, false);
    stats_of(x, 0, ROWS, all_m, all_v, false);
    stats_of(x, 0, ROWS, unb_m, unb_v, true);
    float m = shared->mean[r][j], v = shared->var[r][j];
    if (world > 1 && near(m, own_m[j]) && near(v, own_v[j])) return ": these are this rank's own statistics; nothing was exchanged";
    if (near(m, all_m[j]) && near(v, all_v[j] + all_m[j] * all_m[j])) return ": that is E[x^2]; subtract the mean squared";
    if (near(m, all_m[j]) && near(v, unb_v[j])) return ": that is the unbiased variance (N - 1); BatchNorm divides by N";
    double equal_share = all_m[j] * ROWS / ((double)n * world);
    if (world > 1 && near(m, equal_share)) return ": divided by n x world, but the ranks hold different numbers of rows: add up the counts";
    return "";
}

static bool check_world(int world) {
    float x[ROWS][C], dy[ROWS][C], gamma[C];
    batch(x, dy, gamma);
    double mean[C], var[C];
    stats_of(x, 0, ROWS, mean, var, false);
    for (int r = 0; r < world; r++) {
        for (int j = 0; j < C; j++)
            if (!near(shared->mean[r][j], mean[j]) || !near(shared->var[r][j], var[j])) {
                verdict(false, "%d rank(s): rank %d, feature %d: mean %.6g, var %.6g; the whole batch has mean %.6g, "
                        "var %.6g%s", world, r, j, shared->mean[r][j], shared->var[r][j], mean[j], var[j],
                        stats_hint(x, world, r, j));
                return false;
            }
        if (shared->rows[r] != ROWS) {
            verdict(false, "%d rank(s): rank %d's sync_batch_stats returned %d rows, expected %d (all ranks' rows "
                    "together)", world, r, shared->rows[r], ROWS);
            return false;
        }
    }
    // The reference backward pass, one process, the whole batch, in double.
    for (int j = 0; j < C; j++) {
        double rstd = 1 / sqrt(var[j] + EPS), sg = 0, sgx = 0;
        for (int i = 0; i < ROWS; i++) {
            double g = dy[i][j] * gamma[j];
            sg += g, sgx += g * (x[i][j] - mean[j]) * rstd;
        }
        for (int i = 0; i < ROWS; i++) {
            double g = dy[i][j] * gamma[j], xhat = (x[i][j] - mean[j]) * rstd;
            double want = (g - sg / ROWS - xhat * sgx / ROWS) * rstd;
            if (near(shared->dx[i][j], want)) continue;
            verdict(false, "%d rank(s): the input gradient of row %d, feature %d is %.6g; one process with the whole "
                    "batch gets %.6g: check sync_grad_sums (sums over ALL ranks' rows)", world, i, j,
                    shared->dx[i][j], want);
            return false;
        }
    }
    return true;
}

int main(void) {
    printf("check 04/sync_batchnorm: BatchNorm's statistics over all ranks (sync_batchnorm.c)\n");
    shared = ranks_setup(sizeof *shared, "sync_batch_stats", deadlock_verdict);
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[64];
        snprintf(what, sizeof what, "%d rank(s)", world);
        memset(shared, 0, sizeof *shared);
        if (!run_ranks(world, bn_rank, what)) continue;
        if (check_world(world))
            verdict(true, "%d rank(s) (rows split %s): the whole batch's statistics, and the input gradient one "
                    "process computes", world, world == 1 ? "12" : world == 2 ? "5 + 7" : "3 + 5 + 4");
    }
    ranks_teardown();
    return check_finish("every rank normalises with the whole batch's statistics and gets the input gradient "
                        "of one process with the whole batch, on 1 to 3 uneven ranks");
}
