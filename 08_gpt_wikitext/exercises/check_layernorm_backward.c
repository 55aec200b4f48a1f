// check_layernorm_backward.c - checks exercise 08/layernorm_backward.
//
// Run it with `make check-exercise EX=08/layernorm_backward` from the top
// folder. For three shapes (2 x 5, 16 x 64, 3 x 768) it runs the forward
// pass in double precision, calls your backward pass with dinp, dweight and
// dbias already holding 0.5, 0.25 and -0.75 (it must ADD to them), and
// compares with the gradients computed in double. A wrong array is checked
// against the usual wrong formulas, so that the message can say which term
// is missing. On the smallest shape it also compares your dinp with finite
// differences of the forward pass: the gradient check that proves a
// backward pass without trusting any formula.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

#define DX0 0.5f     // what dinp holds before the call
#define DW0 0.25f    // dweight
#define DB0 (-0.75f) // dbias
#define EPS 1e-5

static bool close_to(double got, double want) { return fabs(got - want) <= 1e-4 * fmax(1.0, fabs(want)); }

// ---------------------------------------------------------------- one shape
typedef struct {
    const char *name;
    int N, C;
    float *x, *w, *dy, *mean, *rstd;   // the inputs your function gets
    double *dx, *dw, *db;              // the right gradients (before adding to the old contents)
    double *naive, *no_var, *no_mean;  // wrong dx formulas, to recognise them
    double *dw_raw;                    // dweight with x instead of xhat
} ln_case;

// dx of row n three ways: right, and with one or both of the "m and rstd
// depend on x" terms left out.
static void row_gradients(ln_case *t, int n) {
    int C = t->C;
    const float *x = t->x + (long)n * C, *dy = t->dy + (long)n * C;
    double gm = 0, gxm = 0;
    for (int c = 0; c < C; c++) {
        double xhat = ((double)x[c] - t->mean[n]) * t->rstd[n], g = (double)dy[c] * t->w[c];
        gm += g / C;
        gxm += g * xhat / C;
        t->db[c] += dy[c];
        t->dw[c] += dy[c] * xhat;
        t->dw_raw[c] += (double)dy[c] * x[c];
    }
    for (int c = 0; c < C; c++) {
        long i = (long)n * C + c;
        double xhat = ((double)x[c] - t->mean[n]) * t->rstd[n], g = (double)dy[c] * t->w[c];
        t->dx[i] = t->rstd[n] * (g - gm - xhat * gxm);
        t->naive[i] = t->rstd[n] * g;
        t->no_var[i] = t->rstd[n] * (g - gm);
        t->no_mean[i] = t->rstd[n] * (g - xhat * gxm);
    }
}

static ln_case make_case(const char *name, int N, int C, uint64_t seed) {
    ln_case t = {name, N, C, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t NC = (size_t)N * C;
    t.x = xmalloc(NC * sizeof(float));
    t.dy = xmalloc(NC * sizeof(float));
    t.w = xmalloc((size_t)C * sizeof(float));
    t.mean = xmalloc((size_t)N * sizeof(float));
    t.rstd = xmalloc((size_t)N * sizeof(float));
    double **outs[] = {&t.dx, &t.naive, &t.no_var, &t.no_mean};
    for (size_t k = 0; k < 4; k++) *outs[k] = xcalloc(NC, sizeof(double));
    t.dw = xcalloc((size_t)C, sizeof(double));
    t.db = xcalloc((size_t)C, sizeof(double));
    t.dw_raw = xcalloc((size_t)C, sizeof(double));
    rng_t rng = rng_seed(seed);
    for (int c = 0; c < C; c++) t.w[c] = (float)(1 + 0.3 * rng_normal(&rng));
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) {
            t.x[(long)n * C + c] = (float)(2 * rng_normal(&rng) + 0.7 * (n - N / 2));
            t.dy[(long)n * C + c] = (float)rng_normal(&rng);
            m += t.x[(long)n * C + c] / (double)C;
        }
        for (int c = 0; c < C; c++) v += pow(t.x[(long)n * C + c] - m, 2) / C;
        t.mean[n] = (float)m;
        t.rstd[n] = (float)(1 / sqrt(v + EPS));
        row_gradients(&t, n);
    }
    return t;
}

static void free_case(ln_case *t) {
    void *all[] = {t->x, t->w, t->dy, t->mean, t->rstd, t->dx, t->dw, t->db, t->naive, t->no_var, t->no_mean, t->dw_raw};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(all[k]);
}

// ---------------------------------------------------------------- diagnosis
// Does got - before match `formula` at every element?
static bool matches(const float *got, float before, const double *formula, long n) {
    for (long i = 0; i < n; i++)
        if (!close_to(got[i] - (double)before, formula[i])) return false;
    return true;
}

static bool all_equal(const float *got, float value, long n) {
    for (long i = 0; i < n; i++)
        if (got[i] != value) return false;
    return true;
}

static const char *dx_hint(const ln_case *t, const float *got) {
    long n = (long)t->N * t->C;
    if (all_equal(got, DX0, n)) return "dinp was not changed at all";
    if (matches(got, 0, t->dx, n)) return "the gradient is right but it REPLACED dinp's old contents: add it (+=)";
    if (matches(got, DX0, t->naive, n))
        return "that is rstd * dy * w: m and rstd were treated as constants, but both depend on every x "
               "of the row; subtract mean(g) and xhat * mean(g * xhat)";
    if (matches(got, DX0, t->no_var, n)) return "the mean(g) term is there; the xhat * mean(g * xhat) term (from the variance) is missing";
    if (matches(got, DX0, t->no_mean, n)) return "the xhat * mean(g * xhat) term is there; the mean(g) term (from the mean) is missing";
    return "compare with the formula in the exercise's header";
}

static const char *param_hint(const float *got, float before, const double *right, const double *raw, long n) {
    if (all_equal(got, before, n)) return "it was not changed at all";
    if (matches(got, 0, right, n)) return "the gradient is right but it REPLACED the old contents: add it (+=)";
    if (raw && matches(got, before, raw, n)) return "that is sum(dy * x): use the normalised xhat = (x - m) * rstd";
    return "compare with the formula in the exercise's header";
}

// The first element of got that is not before + want; false after saying so.
static bool compare(const ln_case *t, const char *array, const float *got, float before,
                    const double *want, long n, int row_len, const char *hint) {
    for (long i = 0; i < n; i++) {
        if (close_to(got[i], before + want[i])) continue;
        char where[48];
        if (row_len) snprintf(where, sizeof where, "%s[row %ld, channel %ld]", array, i / row_len, i % row_len);
        else snprintf(where, sizeof where, "%s[%ld]", array, i);
        verdict(false, "%s: %s: got %.6g, expected %.6g (%g before + gradient %.6g): %s", t->name, where,
                got[i], before + want[i], before, want[i], hint);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- finite differences
// L(x) = sum of dy * y over one row, forward pass in double.
static double row_loss(const ln_case *t, int n, const double *x) {
    double m = 0, v = 0, loss = 0;
    for (int c = 0; c < t->C; c++) m += x[c] / t->C;
    for (int c = 0; c < t->C; c++) v += (x[c] - m) * (x[c] - m) / t->C;
    for (int c = 0; c < t->C; c++)
        loss += t->dy[(long)n * t->C + c] * ((x[c] - m) / sqrt(v + EPS) * t->w[c]);
    return loss;
}

static void gradient_check(const ln_case *t, const float *got) {
    double worst = 0, x[64];
    if (t->C > 64) die("gradient_check: rows of at most 64 channels");
    for (int n = 0; n < t->N; n++)
        for (int c = 0; c < t->C; c++) {
            for (int k = 0; k < t->C; k++) x[k] = t->x[(long)n * t->C + k];
            double h = 1e-4, at = x[c];
            x[c] = at + h;
            double up = row_loss(t, n, x);
            x[c] = at - h;
            double numeric = (up - row_loss(t, n, x)) / (2 * h);
            double diff = fabs((got[(long)n * t->C + c] - (double)DX0) - numeric);
            if (diff > worst) worst = diff;
        }
    verdict(worst < 1e-3, "%s: finite differences of the forward pass agree with your dinp (largest "
            "difference %.1e)", t->name, worst);
}

static void check_case(ln_case *t, bool finite_differences) {
    long NC = (long)t->N * t->C;
    float *dx = xmalloc((size_t)NC * sizeof(float)), *dw = xmalloc((size_t)t->C * sizeof(float));
    float *db = xmalloc((size_t)t->C * sizeof(float));
    for (long i = 0; i < NC; i++) dx[i] = DX0;
    for (int c = 0; c < t->C; c++) dw[c] = DW0, db[c] = DB0;
    layernorm_backward(dx, dw, db, t->dy, t->x, t->w, t->mean, t->rstd, t->N, t->C);
    bool ok = compare(t, "dbias", db, DB0, t->db, t->C, 0, param_hint(db, DB0, t->db, NULL, t->C));
    ok &= compare(t, "dweight", dw, DW0, t->dw, t->C, 0, param_hint(dw, DW0, t->dw, t->dw_raw, t->C));
    ok &= compare(t, "dinp", dx, DX0, t->dx, NC, t->C, dx_hint(t, dx));
    if (ok) verdict(true, "%s: dinp, dweight and dbias added to their old contents, as in double precision", t->name);
    if (ok && finite_differences) gradient_check(t, dx);
    free(dx);
    free(dw);
    free(db);
}

int main(void) {
    printf("check 08/layernorm_backward: the backward pass of LayerNorm (layernorm_backward.c)\n");
    ln_case cases[] = {make_case("2 rows x 5 channels", 2, 5, 1), make_case("16 rows x 64 channels", 16, 64, 2),
                       make_case("3 rows x 768 channels", 3, 768, 3)};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        check_case(&cases[k], k == 0);
        free_case(&cases[k]);
    }
    return check_finish("dinp, dweight and dbias match the double-precision gradients and finite "
                        "differences, and are added to what was there");
}
