// test_powersgd.c - common/powersgd.h, PowerSGD's low-rank gradient
// compression, on 2 and 3 ranks (spawn, cpu backend).
//
// Each rank's gradient is a flat array of three tensors: a 12 x 7 matrix, a
// vector of 7 and a 7 x 9 matrix, made from (rank, step) so that every rank
// can compute everyone's. Three cases:
//   full rank   R = 7 with min_rate 0: both matrices compressed at their
//               full rank, so the result is the exact mean (to 1e-5);
//   rank 1      R = 1: the result is what one power-iteration step of the
//               MEAN gradient gives, computed here in double from all the
//               ranks' inputs (P Q^T with Q from the same seed), the same
//               bytes on every rank, the vector exactly averaged, and the
//               bytes (7 + (12 + 7) + (7 + 9)) x 4 a step;
//   feedback    a second step at R = 1 compresses gradient + last error: the
//               error is M - P Q^T, so after the two steps what was sent
//               plus what is left equals what was given, on every rank.
#include <math.h>
#include <sys/mman.h>

#include "dist.h"
#include "powersgd.h"
#include "spawn.h"
#include "test.h"

enum { N = 12 * 7 + 7 + 7 * 9 };
static const powersgd_tensor TENSORS[3] = {{0, 12, 7}, {84, 7, 1}, {91, 7, 9}};

static float input(int rank, int step, size_t i) { return (float)sin(0.37 * i + 1.3 * rank + 0.71 * step) * (1 + 0.1f * (float)rank); }

// What every rank reports: its result per case, and the bytes.
typedef struct {
    float full[3][N], one[3][N], second[3][N], error_after[3][N];
    size_t bytes[3];
} results;
static results *out;

static int rank_main(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    dist_options how = {"env://", "cpu", "cpu", 0};
    dist_init(&d, &how);
    float g[N];
    powersgd_t s;
    powersgd_init(&s, TENSORS, 3, 7, 0);
    for (size_t i = 0; i < N; i++) g[i] = input(rank, 0, i);
    powersgd_average(&s, d.pg, g);
    memcpy(out->full[rank], g, sizeof g);
    powersgd_free(&s);
    powersgd_init(&s, TENSORS, 3, 1, 2);
    size_t before = ddp_bytes_reduced();
    for (size_t i = 0; i < N; i++) g[i] = input(rank, 0, i);
    powersgd_average(&s, d.pg, g);
    out->bytes[rank] = ddp_bytes_reduced() - before;
    memcpy(out->one[rank], g, sizeof g);
    for (size_t i = 0; i < N; i++) g[i] = input(rank, 1, i);
    powersgd_average(&s, d.pg, g);
    memcpy(out->second[rank], g, sizeof g);
    for (int t = 0; t < 3; t++)
        if (s.compressed[t])
            memcpy(out->error_after[rank] + TENSORS[t].offset, s.error[t],
                   sizeof(float) * (size_t)TENSORS[t].rows * TENSORS[t].cols);
    powersgd_free(&s);
    (void)world;
    dist_finish(&d);
    return 0;
}

// The rank-1 step of the mean M of the ranks' matrices, in double: p = M q
// (q from powersgd's seed), normalised; q' = M^T p; result p q'^T.
static void reference_rank1(int world, float *want) {
    rng_t r = rng_seed(2718);
    for (int t = 0; t < 3; t++) {
        int m = TENSORS[t].rows, n = TENSORS[t].cols;
        size_t at = TENSORS[t].offset;
        double M[12 * 9], q[12], p[12], norm = 0; // the largest tensor: 12 x 7, 7 x 9
        for (int k = 0; k < m * n; k++) {
            M[k] = 0;
            for (int w = 0; w < world; w++) M[k] += input(w, 0, at + (size_t)k) / (double)world;
        }
        if (n == 1) {
            for (int k = 0; k < m; k++) want[at + (size_t)k] = (float)M[k];
            continue;
        }
        for (int c = 0; c < n; c++) q[c] = (float)rng_normal(&r);
        for (int i = 0; i < m; i++) {
            p[i] = 0;
            for (int c = 0; c < n; c++) p[i] += M[i * n + c] * q[c];
            norm += p[i] * p[i];
        }
        for (int i = 0; i < m; i++) p[i] /= sqrt(norm);
        for (int c = 0; c < n; c++) {
            q[c] = 0;
            for (int i = 0; i < m; i++) q[c] += M[i * n + c] * p[i];
        }
        for (int i = 0; i < m; i++)
            for (int c = 0; c < n; c++) want[at + (size_t)i * n + (size_t)c] = (float)(p[i] * q[c]);
    }
}

static double worst(const float *a, const float *b) {
    double e = 0, scale = 0;
    for (size_t i = 0; i < N; i++) e = fmax(e, fabs((double)a[i] - b[i])), scale = fmax(scale, fabs((double)b[i]));
    return e / fmax(scale, 1e-30);
}

int main(void) {
    out = mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) die("mmap failed");
    for (int world = 2; world <= 3; world++) {
        memset(out, 0, sizeof *out);
        if (spawn(world, rank_main, NULL) != 0) die("the ranks failed");
        float mean[N], want[N];
        for (size_t i = 0; i < N; i++) {
            double sum = 0;
            for (int w = 0; w < world; w++) sum += input(w, 0, i);
            mean[i] = (float)(sum / world);
        }
        char name[160];
        double e = 0;
        for (int w = 0; w < world; w++) e = fmax(e, worst(out->full[w], mean));
        snprintf(name, sizeof name, "powersgd: %d ranks, full rank: the exact mean", world);
        EXPECT(name, e <= 1e-5, "worst error %.3g of the largest value", e);
        reference_rank1(world, want);
        bool same = true;
        e = 0;
        for (int w = 0; w < world; w++)
            same = same && !memcmp(out->one[w], out->one[0], sizeof out->one[0]), e = fmax(e, worst(out->one[w], want));
        snprintf(name, sizeof name, "powersgd: %d ranks, rank 1: one power-iteration step of the mean, the same bytes on every rank", world);
        EXPECT(name, same && e <= 1e-5, "same bytes: %s, worst error %.3g against the reference", same ? "yes" : "NO", e);
        size_t bytes = (7 + (12 + 7) + (7 + 9)) * sizeof(float);
        snprintf(name, sizeof name, "powersgd: %d ranks, rank 1: %zu bytes a step instead of %zu", world, bytes, N * sizeof(float));
        EXPECT(name, out->bytes[0] == bytes, "counted %zu", out->bytes[0]);
        // Error feedback: over two steps, sent + left = given, per rank and matrix element.
        // The mean over ranks of (given - left) is what was sent (the same on every rank).
        double fb = 0;
        for (int t = 0; t < 3; t += 2)
            for (size_t k = TENSORS[t].offset; k < TENSORS[t].offset + (size_t)TENSORS[t].rows * TENSORS[t].cols; k++) {
                double given = 0, left = 0;
                for (int w = 0; w < world; w++)
                    given += (input(w, 0, k) + input(w, 1, k)) / (double)world, left += out->error_after[w][k] / (double)world;
                double sent = (double)out->one[0][k] + out->second[0][k];
                fb = fmax(fb, fabs(sent + left - given));
            }
        snprintf(name, sizeof name, "powersgd: %d ranks, error feedback: after two steps, sent + kept = given", world);
        EXPECT(name, fb <= 1e-5, "off by %.3g", fb);
    }
    return test_failures ? 1 : 0;
}
