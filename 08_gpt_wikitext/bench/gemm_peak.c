// gemm_peak.c - the roofline for bench_gpt: how fast this machine multiplies
// matrices, and how long the matrix products of one training step take
// alone (MEASUREMENTS.md, "Speed on the CPU").
//
// Build and run from 08_gpt_wikitext/:  make gemm-peak
//   build/gemm_peak [B] [repeats]
// 1. sgemm on square 2048 x 2048 matrices, OpenBLAS's own threads 1 and 2
//    (needs OpenBLAS): the machine's practical fp32 peak. OpenBLAS starts
//    no more threads than OMP_NUM_THREADS or OPENBLAS_NUM_THREADS allow:
//    leave them unset for the 2-thread line.
// 2. every matrix product of one training step of the default model
//    (forward and backward, B sequences of 128 tokens), with the shapes and
//    the threading gpt.h uses (gemm_parallel, gemm_serial per attention
//    head), on OMP_NUM_THREADS threads, and their FLOPs counted from the
//    shapes (2 per multiply-add).
// Each figure is the median of `repeats` timed runs after one warm-up run.
#include <stdio.h>
#include <stdlib.h>

#include "gpt.h"
#include "timer.h"

// Scratch operands, large enough for every product below; their values do not matter.
static gpt_real *scratch_a, *scratch_b, *scratch_c;
static double counted_flops;

static void product(bool ta, bool tb, int M, int N, int K) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    gemm_parallel(ta, tb, M, N, K, scratch_a, lda, scratch_b, ldb, 0, scratch_c, N);
    counted_flops += 2.0 * M * N * K;
}

// The attention's products, as attention_forward and attention_backward
// make them: per sequence and head, with hs-wide slices of the (T, 3C)
// q, k, v rows; one sequence and head per thread.
static void attention_products(int BH, int T, int C, int hs) {
    int C3 = 3 * C;
#pragma omp parallel for
    for (int bh = 0; bh < BH; bh++) {
        const gpt_real *qkv = scratch_a, *p = scratch_b;
        gpt_real *out = scratch_c + (size_t)bh * T * C3;
        gemm_serial(false, true, T, T, hs, qkv, C3, qkv, C3, 0, out, T);   // S = Q K^T
        gemm_serial(false, false, T, hs, T, p, T, qkv, C3, 0, out, C);     // Y = P V
        gemm_serial(false, true, T, T, hs, qkv, C, qkv, C3, 0, out, T);    // dP = dY V^T
        gemm_serial(true, false, T, hs, T, p, T, qkv, C, 0, out, C3);      // dV = P^T dY
        gemm_serial(false, false, T, hs, T, p, T, qkv, C3, 0, out, C3);    // dQ = dS K
        gemm_serial(true, false, T, hs, T, p, T, qkv, C3, 0, out, C3);     // dK = dS^T Q
    }
    counted_flops += 6.0 * BH * 2.0 * T * T * hs;
}

// matmul_forward and matmul_backward's products for out = inp W^T, W (OC, C).
static void linear(int N, int C, int OC) {
    product(false, true, N, OC, C);  // forward
    product(false, false, N, C, OC); // backward: dinp = dout W
    product(true, false, OC, C, N);  // backward: dW += dout^T inp
}

static void training_step_products(gpt_config c, int B) {
    int N = B * c.block_size, C = c.n_embd;
    for (int l = 0; l < c.n_layer; l++) {
        linear(N, C, 3 * C);
        attention_products(B * c.n_head, c.block_size, C, C / c.n_head);
        linear(N, C, C);
        linear(N, C, 4 * C);
        linear(N, 4 * C, C);
    }
    linear(N, C, c.vocab_size); // the tied LM head
}

static double median_seconds(void (*run)(void *), void *arg, int repeats) {
    double *t = xmalloc(sizeof(double) * (size_t)repeats);
    run(arg); // warm-up
    for (int r = 0; r < repeats; r++) {
        double t0 = now_seconds();
        run(arg);
        t[r] = now_seconds() - t0;
    }
    double m = timer_median(t, repeats);
    free(t);
    return m;
}

#ifdef COURSE_BLAS
enum { SQUARE = 2048 };
static void square_sgemm(void *unused) {
    (void)unused;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, SQUARE, SQUARE, SQUARE, 1, scratch_a, SQUARE,
                scratch_b, SQUARE, 0, scratch_c, SQUARE);
}
#endif

typedef struct { gpt_config cfg; int B; } step_shape;
static void step_products(void *arg) {
    const step_shape *s = arg;
    training_step_products(s->cfg, s->B);
}

int main(int argc, char **argv) {
    int B = argc > 1 ? atoi(argv[1]) : 8, repeats = argc > 2 ? atoi(argv[2]) : 10;
    if (argc > 3 || B < 1 || B > 64 || repeats < 1) {
        fprintf(stderr, "usage: gemm_peak [B 1..64] [repeats>=1]\n");
        return 2;
    }
    step_shape s = {{5000, 0, 0, 0, 0}, B};
    gpt_preset("default", &s.cfg);
    size_t N = (size_t)B * s.cfg.block_size, big = N * s.cfg.vocab_size; // the logits: the largest operand
    if (big < (size_t)2048 * 2048) big = (size_t)2048 * 2048;
    scratch_a = xcalloc(big, sizeof(gpt_real));
    scratch_b = xcalloc(big, sizeof(gpt_real));
    scratch_c = xcalloc(big, sizeof(gpt_real));
#ifdef COURSE_BLAS
    for (int threads = 1; threads <= 2; threads++) {
        openblas_set_num_threads(threads);
        double t = median_seconds(square_sgemm, NULL, repeats);
        printf("sgemm %d x %d x %d, OpenBLAS %d thread%s: %.1f ms -> %.1f GFLOP/s\n", SQUARE, SQUARE, SQUARE,
               threads, threads > 1 ? "s" : "", t * 1e3, 2.0 * SQUARE * SQUARE * SQUARE / t / 1e9);
    }
#endif
    gpt_blas_single_threaded(); // as in training: the OpenMP threads share the work
    double t = median_seconds(step_products, &s, repeats);
    counted_flops /= repeats + 1; // per run
    int threads = gpt_num_threads();
    printf("a training step's matrix products (default model, B=%d, %d thread%s, %s): %.1f ms, "
           "%.2f GFLOP (%.1f MFLOP per token) -> %.1f GFLOP/s\n", B, threads, threads > 1 ? "s" : "",
           gpt_matmul_backend(), t * 1e3, counted_flops / 1e9, counted_flops / (double)N / 1e6,
           counted_flops / t / 1e9);
    free(scratch_a), free(scratch_b), free(scratch_c);
    return 0;
}
