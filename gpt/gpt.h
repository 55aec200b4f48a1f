// gpt.h - a GPT language model on the CPU, forward and backward written out
// layer by layer.
//
// This is the reference implementation of chapter 08: plain C, one layer
// function per idea, each forward pass beside its backward pass with the
// calculus in the comments. Read it top to bottom:
//   1. the number type (the configuration is in gpt_layout.h)
//   2. views of the flat arrays: parameters, activations (the layout
//      itself - which tensor lives where - is gpt_layout.h's)
//   3. matrix products (OpenBLAS or a blocked C kernel)
//   4. the layers, each forward + backward
//   5. the model: forward, backward
//   6. the optimizer: gradient clipping, AdamW (the learning-rate schedule
//      is the training loop's: 08_gpt_wikitext.c)
//   7. sampling text
//   8. saving and loading in the safetensors format
//   9. tensor parallelism: a rank's shard of each block (chapter 10)
//  10. expert parallelism: a rank's experts of each block (chapter 13; the
//      mixture of experts itself is gpt/moe.h, included before section 5)
// and context parallelism (chapter 12: a rank's tokens of each sequence)
// in context_parallel.h, included after section 4.
//
// Every parameter lives in ONE flat array and every gradient in another,
// laid out as gpt_layout.h says (the GPU model, gpt_cuda.cu, reads the same
// layout, so the two exchange whole arrays).
//
// The number type is gpt_real: float for training, double when a test
// defines GPT_REAL before including this file, so that gradients can be
// checked against finite differences without float round-off drowning
// the comparison.
#ifndef GPT_H
#define GPT_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <tgmath.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef COURSE_BLAS
#include <cblas.h>
#endif

#include "check.h"
#include "gpt_layout.h"
#include "rng.h"
#include "safetensors.h"
#include "safetensors_read.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpt.h reads and writes little-endian files by copying memory; port gpt_save/gpt_load first"
#endif

#ifndef GPT_REAL
#define GPT_REAL float
#endif
typedef GPT_REAL gpt_real;

// ===================================================================== 1. the number type
// (gpt_real, above: float, or double for the gradient check.) The
// configuration, its presets and the layout are in gpt_layout.h.

// ===================================================================== 2. views of the flat arrays

// Pointers to one block's tensors inside a flat array (parameters or grads).
typedef struct {
    gpt_real *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attproj_w, *attproj_b;
    gpt_real *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
    gpt_real *router_w; // a mixture of experts' (gpt/moe.h); NULL in a dense block
} gpt_block;

// The activations of one block that the backward pass needs again
// (gpt_layout.h lists them with their shapes; the CPU keeps the attention
// probabilities, never flash attention's log-sum-exps).
typedef struct {
    gpt_real *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *res3;
} gpt_block_acts;

// The activations of one forward pass: what gpt_t keeps of its last batch.
// A pipeline stage keeps those of several micro-batches at once, one slot
// each (gpt_use_slot); the slots not in use wait here.
typedef struct {
    gpt_real *acts;
    uint16_t *inputs, *targets;
    size_t acts_capacity, tokens_capacity;
    int B, T;
    bool have_targets;
    void *moe_layers;   // a mixture of experts' routing of this micro-batch (gpt_moe_layer per layer; the finale)
} gpt_slot;
// Where a bucket's parameters and gradients are (gpt_layout.h, section 3):
// the hook is given the model's own (NULL where the model has none) and
// may point them elsewhere, at arrays laid out as the bucket's part of the
// flat array. Chapter 09 gathers a block's parameters here.
typedef void (*gpt_bucket_hook)(void *user, gpt_bucket_event event, int bucket, gpt_real **params, gpt_real **grads);

typedef struct {
    gpt_config cfg;
    gpt_stage stage;              // the blocks and ends held here: all (gpt_init), or a pipeline stage's (gpt_init_stage)
    gpt_real *params, *grads;     // num_params each, laid out as tensors[]
    gpt_real *adam_m, *adam_v;    // optimizer moments, allocated on the first step
    size_t num_params;
    gpt_tensor *tensors;
    int num_tensors;
    int adam_step;                // AdamW steps taken (for bias correction)

    // Activations for the last forward pass of B sequences of T tokens.
    int B, T;
    size_t acts_capacity, grads_capacity; // elements allocated
    gpt_real *acts;               // everything the forward pass keeps
    gpt_real *grad_acts;          // scratch for the backward pass
    uint16_t *inputs, *targets;   // copies of the last batch
    bool have_targets;            // a backward pass may follow (it needs the targets, on the last stage)
    float last_loss;
    size_t tokens_capacity;       // of inputs and targets
    gpt_slot *slots;              // pipeline stages: the slots not in use (gpt_use_slot); NULL otherwise
    int num_slots, slot;

    // Tensor parallelism (chapter 10, section 9): this model is one rank's
    // shard of each block, split over tp ranks (0 or 1: the whole model).
    // Its blocks add up their partial results across the ranks by calling
    // tp_all_reduce (a sum over the tp ranks, in place), which the training
    // program provides.
    int tp;
    void (*tp_all_reduce)(void *user, gpt_real *buf, size_t count);
    void *tp_user;

    // Context parallelism (chapter 12, context_parallel.h): this model
    // computes its cp rank's tokens of each sequence (NULL: all of them).
    struct gpt_cp *cp;

    gpt_bucket_hook hook;         // NULL: every bucket lives in params and grads
    void *hook_user;

    // A mixture of experts (cfg.n_expert > 0; gpt/moe.h): the layers' state
    // between the passes, and what they routed. train_pass: the forward
    // pass is a training step's (capacity and the balancing loss apply;
    // evaluation routes every token). Expert parallelism (chapter 13,
    // section 10): this model holds the experts of shard ep_rank of
    // cfg.ep, and exchanges tokens over the ep group through the training
    // program's two callbacks: counts (per_peer ints to each rank) and
    // rows (pg_all_to_all_v's counts, in numbers).
    struct gpt_moe *moe;
    bool train_pass;
    gpt_real grad_scale;          // the last backward pass's
    int ep_rank;
    void (*ep_all_to_all)(void *user, const int *send, int *recv, int per_peer);
    void (*ep_all_to_all_v)(void *user, const gpt_real *send, const size_t *send_counts, gpt_real *recv,
                            const size_t *recv_counts);
    void *ep_user;
} gpt_t;

// The table of gpt_layout.h, for this model's configuration, stage (a
// pipeline stage's tensors only; those it lacks are empty) and shard.
static inline void gpt_build_table(gpt_t *m) {
    m->num_tensors = gpt_num_tensors(&m->cfg);
    m->tensors = xcalloc((size_t)m->num_tensors, sizeof(gpt_tensor));
    m->num_params = gpt_layout_stage_params(&m->cfg, &m->stage, m->tp, m->tensors);
}

// The block's tensors inside `base`, the block's part of the parameters or
// of the gradients: m->params + the block's offset in this model's array,
// or what a bucket hook gave instead.
static inline gpt_block gpt_block_view(const gpt_t *m, gpt_real *base, int layer) {
    gpt_real *p[GPT_BLOCK_TENSORS_MAX] = {0};
    size_t start = m->tensors[gpt_block_tensor(&m->cfg, layer, 0)].offset;
    for (int i = 0; i < gpt_block_tensors(&m->cfg); i++)
        p[i] = base + (m->tensors[gpt_block_tensor(&m->cfg, layer, i)].offset - start);
    gpt_block b = {p[B_LN1_W], p[B_LN1_B], p[B_QKV_W], p[B_QKV_B], p[B_ATTPROJ_W], p[B_ATTPROJ_B],
                   p[B_LN2_W], p[B_LN2_B], p[B_FC_W], p[B_FC_B], p[B_FCPROJ_W], p[B_FCPROJ_B], p[B_ROUTER_W]};
    return b;
}

// Where bucket `bucket` starts in this model's flat array: at its first
// tensor, in the whole model's array or in a shard's or a stage's.
static inline size_t gpt_bucket_start(const gpt_t *m, int bucket) {
    int L = m->cfg.n_layer;
    int first = bucket == GPT_BUCKET_LN_F ? gpt_ln_f_tensor(&m->cfg) : bucket <= L ? gpt_block_tensor(&m->cfg, L - bucket, 0) : 0;
    return m->tensors[first].offset;
}

// Tensor `index` inside the arrays of bucket `bucket`, which start where
// the bucket starts in the flat array (see gpt_bucket_begin).

static inline gpt_real *gpt_tensor_in(const gpt_t *m, gpt_real *bucket_base, int bucket, int index) {
    return bucket_base + (m->tensors[index].offset - gpt_bucket_start(m, bucket));
}


// ===================================================================== 3. matrix products
//
// Nearly all the arithmetic of a transformer is matrix products, so their
// speed is the model's speed. With COURSE_BLAS (the chapter's Makefile sets
// it when OpenBLAS is installed) they call cblas_sgemm; otherwise a blocked
// kernel below. Both compute, row-major,
//     C[M x N] = beta * C + op(A)[M x K] * op(B)[K x N],   op(X) = X or X^T.
// The serial version runs on the calling thread; gemm_parallel splits the
// rows of C between the OpenMP threads, so threading is the same whichever
// kernel does the work.

static inline int gpt_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// The calling thread's share [*begin, *end) of n items, in multiples of
// `grain`, inside a parallel region (all of it outside one).
static inline void gpt_thread_share(size_t n, size_t grain, size_t *begin, size_t *end) {
    size_t id = 0, count = 1;
#ifdef _OPENMP
    id = (size_t)omp_get_thread_num();
    count = (size_t)omp_get_num_threads();
#endif
    size_t chunks = (n + grain - 1) / grain;
    size_t b = chunks * id / count * grain, e = chunks * (id + 1) / count * grain;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

enum { GEMM_MR = 4, GEMM_NR = 32, GEMM_KC = 128, GEMM_MC = 64, GEMM_NC = 512 };

// Element (row, col) of op(X), where X is stored row-major with leading dimension ld.
static inline gpt_real gemm_at(const gpt_real *X, int ld, bool trans, int row, int col) {
    return trans ? X[(size_t)col * ld + row] : X[(size_t)row * ld + col];
}

// Copies rows k0..k0+kc-1, columns j0..j0+nc-1 of op(B) into tiles of NR
// columns, each tile k-major, zero-padded: the micro-kernel then reads one
// contiguous stream of NR-wide rows.
static inline void gemm_pack_b(gpt_real *dst, const gpt_real *B, int ldb, bool tb,
                               int k0, int kc, int j0, int nc) {
    for (int jt = 0; jt < nc; jt += GEMM_NR)
        for (int k = 0; k < kc; k++)
            for (int j = 0; j < GEMM_NR; j++)
                *dst++ = jt + j < nc ? gemm_at(B, ldb, tb, k0 + k, j0 + jt + j) : 0;
}

// Copies rows i0..i0+mc-1, columns k0..k0+kc-1 of op(A) into tiles of MR rows, k-major.
static inline void gemm_pack_a(gpt_real *dst, const gpt_real *A, int lda, bool ta,
                               int i0, int mc, int k0, int kc) {
    for (int it = 0; it < mc; it += GEMM_MR)
        for (int k = 0; k < kc; k++)
            for (int r = 0; r < GEMM_MR; r++)
                *dst++ = it + r < mc ? gemm_at(A, lda, ta, i0 + it + r, k0 + k) : 0;
}

// C[mr x nr] += (MR x kc tile of A) * (kc x NR tile of B). The MR x NR sums
// stay in registers for the whole k loop; that reuse is what makes a blocked
// product fast, as each loaded value feeds MR (or NR) multiply-adds.
static inline void gemm_micro(int kc, const gpt_real *restrict a, const gpt_real *restrict b,
                              gpt_real *C, int ldc, int mr, int nr) {
    gpt_real acc[GEMM_MR][GEMM_NR] = {{0}};
    for (int k = 0; k < kc; k++) {
        for (int r = 0; r < GEMM_MR; r++) {
            gpt_real ar = a[k * GEMM_MR + r];
#pragma omp simd
            for (int j = 0; j < GEMM_NR; j++) acc[r][j] += ar * b[k * GEMM_NR + j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[(size_t)r * ldc + j] += acc[r][j];
}

static inline void gemm_scale(int M, int N, gpt_real beta, gpt_real *C, int ldc) {
    if (beta == 1) return;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            C[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * C[(size_t)i * ldc + j];
}

static inline void gemm_blocked(bool ta, bool tb, int M, int N, int K, const gpt_real *A, int lda,
                                const gpt_real *B, int ldb, gpt_real beta, gpt_real *C, int ldc) {
    gemm_scale(M, N, beta, C, ldc);
    gpt_real *bp = xmalloc(sizeof(gpt_real) * GEMM_KC * (GEMM_NC + GEMM_NR));
    gpt_real *ap = xmalloc(sizeof(gpt_real) * GEMM_KC * (GEMM_MC + GEMM_MR));
    for (int j0 = 0; j0 < N; j0 += GEMM_NC) {
        int nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
        for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
            int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            gemm_pack_b(bp, B, ldb, tb, k0, kc, j0, nc);
            for (int i0 = 0; i0 < M; i0 += GEMM_MC) {
                int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC;
                gemm_pack_a(ap, A, lda, ta, i0, mc, k0, kc);
                for (int jt = 0; jt < nc; jt += GEMM_NR)
                    for (int it = 0; it < mc; it += GEMM_MR)
                        gemm_micro(kc, ap + (size_t)it * kc, bp + (size_t)jt * kc,
                                   C + (size_t)(i0 + it) * ldc + j0 + jt, ldc,
                                   mc - it < GEMM_MR ? mc - it : GEMM_MR,
                                   nc - jt < GEMM_NR ? nc - jt : GEMM_NR);
            }
        }
    }
    free(ap);
    free(bp);
}

static inline void gemm_serial(bool ta, bool tb, int M, int N, int K, const gpt_real *A, int lda,
                               const gpt_real *B, int ldb, gpt_real beta, gpt_real *C, int ldc) {
    if (M <= 0 || N <= 0) return;
#ifdef COURSE_BLAS
    enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
    if (sizeof(gpt_real) == sizeof(float))
        cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, 1.0f, (const float *)A, lda,
                    (const float *)B, ldb, (float)beta, (float *)C, ldc);
    else
        cblas_dgemm(CblasRowMajor, opa, opb, M, N, K, 1.0, (const double *)A, lda,
                    (const double *)B, ldb, (double)beta, (double *)C, ldc);
#else
    gemm_blocked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
#endif
}

// Each OpenMP thread computes a band of rows of C. Row i of op(A) starts at
// A + i (transposed: a column of the stored matrix) or A + i*lda.
static inline void gemm_parallel(bool ta, bool tb, int M, int N, int K, const gpt_real *A, int lda,
                                 const gpt_real *B, int ldb, gpt_real beta, gpt_real *C, int ldc) {
#pragma omp parallel
    {
        size_t i0, i1;
        gpt_thread_share((size_t)M, 16, &i0, &i1);
        if (i1 > i0)
            gemm_serial(ta, tb, (int)(i1 - i0), N, K, ta ? A + i0 : A + i0 * (size_t)lda, lda, B, ldb,
                        beta, C + i0 * (size_t)ldc, ldc);
    }
}

// Called once: OpenBLAS must not start threads of its own inside ours.
static inline void gpt_blas_single_threaded(void) {
#ifdef COURSE_BLAS
    openblas_set_num_threads(1);
#endif
}

static inline const char *gpt_matmul_backend(void) {
#ifdef COURSE_BLAS
    return "OpenBLAS sgemm";
#else
    return "blocked C kernel";
#endif
}

// ===================================================================== exp, fast
//
// The C library's expf is exact to the last bit but is a function call the
// compiler cannot vectorise. GELU and the softmaxes call exp tens of
// millions of times per step, so in float we use our own: split
//     exp(x) = 2^n * exp(r),  n = round(x / ln 2),  |r| <= ln(2)/2,
// and approximate exp(r) by a polynomial (the classic Cephes coefficients):
// relative error below 1e-7, a float's own precision (the unit test checks).
// Every step is plain arithmetic, so `omp simd` loops run 8 or 16 at once.
static inline float gpt_expf_fast(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;             // stay within normal floats
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;    // round to nearest (1.5 * 2^23 trick)
    float r = x - n * 0.693359375f - n * -2.12194440e-4f;       // x - n ln2, ln2 split in two for accuracy
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;                    // 2^n built in the exponent field
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// The model's exp: the fast one in float, the library's in double (the
// gradient check compares against finite differences that need every digit).
static inline gpt_real gpt_exp(gpt_real x) {
    if (sizeof(gpt_real) != sizeof(float)) return exp(x);
    return (gpt_real)gpt_expf_fast((float)x);
}

// ===================================================================== 4. layers
//
// Conventions. N = B*T rows (one per token position), C channels.
// Every backward function ADDS into parameter gradients (dweight, dbias),
// so gradients of several micro-batches accumulate for free. Gradients of
// activations are overwritten, except where a comment says "adds": the
// residual stream's gradient is a sum over the paths that read it.

// --- token + position embedding
// x[b,t,:] = wte[token[b,t],:] + wpe[t,:]; at[t] instead of t where a
// rank holds some tokens of each sequence (context parallelism, chapter 12).
static inline void encoder_forward_at(gpt_real *out, const uint16_t *tokens, const gpt_real *wte,
                                      const gpt_real *wpe, const int *at, int B, int T, int C) {
#pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        const gpt_real *tok = wte + (size_t)tokens[n] * C, *pos = wpe + (size_t)(at ? at[n % T] : n % T) * C;
        gpt_real *o = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
}

static inline void encoder_forward(gpt_real *out, const uint16_t *tokens, const gpt_real *wte,
                                   const gpt_real *wpe, int B, int T, int C) {
    encoder_forward_at(out, tokens, wte, wpe, NULL, B, T, C);
}

// A lookup's gradient goes back to the row that was looked up: dwte[token]
// += dx, dwpe[t] += dx. Rows repeat (the same token twice), so the threads
// split the channels, never the rows, and no two threads add to one number.
static inline void encoder_backward_at(gpt_real *dwte, gpt_real *dwpe, const gpt_real *dout,
                                       const uint16_t *tokens, const int *at, int B, int T, int C) {
#pragma omp parallel
    {
        size_t c0, c1;
        gpt_thread_share((size_t)C, 16, &c0, &c1);
        for (int n = 0; n < B * T; n++) {
            const gpt_real *d = dout + (size_t)n * C;
            gpt_real *tok = dwte + (size_t)tokens[n] * C, *pos = dwpe + (size_t)(at ? at[n % T] : n % T) * C;
#pragma omp simd
            for (size_t c = c0; c < c1; c++) {
                tok[c] += d[c];
                pos[c] += d[c];
            }
        }
    }
}

static inline void encoder_backward(gpt_real *dwte, gpt_real *dwpe, const gpt_real *dout,
                                    const uint16_t *tokens, int B, int T, int C) {
    encoder_backward_at(dwte, dwpe, dout, tokens, NULL, B, T, C);
}

// --- layer normalisation
// Per row: mean m, variance v (biased, as PyTorch), rstd = 1/sqrt(v + eps),
// xhat = (x - m) * rstd, y = xhat * w + b. It keeps the residual stream's
// scale in check whatever the depth. mean and rstd are kept for backward.
static inline void layernorm_forward(gpt_real *out, gpt_real *mean, gpt_real *rstd, const gpt_real *inp,
                                     const gpt_real *weight, const gpt_real *bias, int N, int C) {
    const gpt_real eps = (gpt_real)1e-5;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const gpt_real *x = inp + (size_t)n * C;
        gpt_real m = 0, v = 0;
#pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        gpt_real s = 1 / sqrt(v + eps);
        gpt_real *y = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// With g = dy * w (gradient at xhat), the mean and the variance both depend
// on every x of the row, which gives
//     dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//     dw += sum over rows of dy * xhat,   db += sum over rows of dy.
// dinp ADDS (it is the residual stream). The parameter sums run over rows,
// so the threads split the channels for them, the rows for dx.
static inline void layernorm_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias,
                                      const gpt_real *dout, const gpt_real *inp, const gpt_real *weight,
                                      const gpt_real *mean, const gpt_real *rstd, int N, int C) {
#pragma omp parallel
    {
#pragma omp for
        for (int n = 0; n < N; n++) {
            const gpt_real *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            gpt_real g_mean = 0, gx_mean = 0;
#pragma omp simd reduction(+ : g_mean, gx_mean)
            for (int c = 0; c < C; c++) {
                gpt_real g = dy[c] * weight[c];
                g_mean += g;
                gx_mean += g * (x[c] - mean[n]) * rstd[n];
            }
            g_mean /= C;
            gx_mean /= C;
            gpt_real *dx = dinp + (size_t)n * C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                gpt_real xhat = (x[c] - mean[n]) * rstd[n];
                dx[c] += rstd[n] * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
            }
        }
        size_t c0, c1;
        gpt_thread_share((size_t)C, 16, &c0, &c1);
        for (int n = 0; n < N; n++) {
            const gpt_real *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
#pragma omp simd
            for (size_t c = c0; c < c1; c++) {
                dweight[c] += dy[c] * (x[c] - mean[n]) * rstd[n];
                dbias[c] += dy[c];
            }
        }
    }
}

// --- linear layer (a matrix product plus a bias)
// out = inp W^T + b:  inp (N, C), W (OC, C), b (OC) or NULL, out (N, OC).
static inline void matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *weight,
                                  const gpt_real *bias, int N, int C, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt_real *row = out + (size_t)n * OC;
        if (bias) memcpy(row, bias, sizeof(gpt_real) * (size_t)OC);
        else memset(row, 0, sizeof(gpt_real) * (size_t)OC);
    }
    gemm_parallel(false, true, N, OC, C, inp, C, weight, C, 1, out, OC);
}

// From out = inp W^T + b:
//     dinp = dout W          (N, C)   overwritten; skipped when dinp is NULL
//     dW  += dout^T inp      (OC, C)  every row's outer product, summed
//     db  += sum over rows of dout
static inline void matmul_backward(gpt_real *dinp, gpt_real *dweight, gpt_real *dbias,
                                   const gpt_real *dout, const gpt_real *inp, const gpt_real *weight,
                                   int N, int C, int OC) {
    if (dinp) gemm_parallel(false, false, N, C, OC, dout, OC, weight, C, 0, dinp, C);
    gemm_parallel(true, false, OC, C, N, dout, OC, inp, C, 1, dweight, C);
    if (!dbias) return;
#pragma omp parallel
    {
        size_t o0, o1;
        gpt_thread_share((size_t)OC, 16, &o0, &o1);
        for (int n = 0; n < N; n++) {
            const gpt_real *row = dout + (size_t)n * OC;
#pragma omp simd
            for (size_t o = o0; o < o1; o++) dbias[o] += row[o];
        }
    }
}

// --- causal multi-head self-attention
// qkv (B,T,3C) holds, per position, the query, key and value of all heads:
// head h uses channels h*hs .. h*hs+hs-1 of each third (hs = C/NH). Per
// sequence and head, with Q, K, V the (T, hs) slices:
//     S = Q K^T / sqrt(hs)                 how much each position attends to each other
//     P = softmax(S) over s <= t           row t sees positions 0..t only (causal)
//     Y = P V                              (T, hs), written to head h's channels of out
// P is kept in att (B,NH,T,T) for the backward pass.
static inline void attention_forward(gpt_real *out, gpt_real *att, const gpt_real *qkv,
                                     int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel for
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const gpt_real *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        gpt_real *p = att + (size_t)bh * T * T;
        gemm_serial(false, true, T, T, hs, q, C3, k, C3, 0, p, T);
        for (int t = 0; t < T; t++) {
            gpt_real *row = p + (size_t)t * T, maxv = row[0] * scale, sum = 0;
            for (int s = 1; s <= t; s++) maxv = row[s] * scale > maxv ? row[s] * scale : maxv;
#pragma omp simd reduction(+ : sum)
            for (int s = 0; s <= t; s++) {
                row[s] = gpt_exp(row[s] * scale - maxv);
                sum += row[s];
            }
            gpt_real inv = 1 / sum;
            for (int s = 0; s <= t; s++) row[s] *= inv;
            for (int s = t + 1; s < T; s++) row[s] = 0;
        }
        gemm_serial(false, false, T, hs, T, p, T, v, C3, 0, out + (size_t)b * T * C + h * hs, C);
    }
}

// Backward through Y = P V, P = softmax(S), S = Q K^T * scale:
//     dP = dY V^T,  dV = P^T dY
//     dS = P .* (dP - rowsum(dP .* P)) * scale    (softmax's Jacobian; masked P are 0, so dS is too)
//     dQ = dS K,    dK = dS^T Q
// dqkv is overwritten; each thread has its own (T,T) scratch for dP / dS.
static inline void attention_backward(gpt_real *dqkv, const gpt_real *dout, const gpt_real *qkv,
                                      const gpt_real *att, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel
    {
        gpt_real *ds = xmalloc(sizeof(gpt_real) * (size_t)T * T);
#pragma omp for
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t off = (size_t)b * T * C3 + h * hs;
            const gpt_real *q = qkv + off, *k = q + C, *v = q + 2 * C, *p = att + (size_t)bh * T * T;
            const gpt_real *dy = dout + (size_t)b * T * C + h * hs;
            gpt_real *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
            gemm_serial(false, true, T, T, hs, dy, C, v, C3, 0, ds, T);
            gemm_serial(true, false, T, hs, T, p, T, dy, C, 0, dv, C3);
            for (int t = 0; t < T; t++) {
                const gpt_real *pr = p + (size_t)t * T;
                gpt_real *dr = ds + (size_t)t * T, dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int s = 0; s <= t; s++) dot += dr[s] * pr[s];
#pragma omp simd
                for (int s = 0; s < T; s++) dr[s] = pr[s] * (dr[s] - dot) * scale;
            }
            gemm_serial(false, false, T, hs, T, ds, T, k, C3, 0, dq, C3);
            gemm_serial(true, false, T, hs, T, ds, T, q, C3, 0, dk, C3);
        }
        free(ds);
    }
}

// --- GELU, tanh approximation (as GPT-2)
// y = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) * (x + 0.044715 x^3).
// Since (1 + tanh u)/2 = sigmoid(2u), this is y = x * s with
// s = 1 / (1 + exp(-2u)): one exponential per element, no tanh.
static inline void gelu_forward(gpt_real *out, const gpt_real *inp, size_t n) {
    const gpt_real k = (gpt_real)0.7978845608028654, a = (gpt_real)0.044715;
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        gpt_real x = inp[i];
        out[i] = x / (1 + gpt_exp(-2 * k * (x + a * x * x * x)));
    }
}

// dy/dx = s + x * ds/dx, and ds/dx = s (1 - s) * d(2u)/dx, so
//     dy/dx = s + 2 x s (1 - s) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2).
// dinp may be dout (the update is element by element).
static inline void gelu_backward(gpt_real *dinp, const gpt_real *inp, const gpt_real *dout, size_t n) {
    const gpt_real k = (gpt_real)0.7978845608028654, a = (gpt_real)0.044715;
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        gpt_real x = inp[i], s = 1 / (1 + gpt_exp(-2 * k * (x + a * x * x * x)));
        dinp[i] = (s + 2 * x * s * (1 - s) * k * (1 + 3 * a * x * x)) * dout[i];
    }
}

// --- residual connection: out = a + b. Its backward passes the gradient
// unchanged to both inputs, which is why deep residual networks train:
// the gradient has a direct path from the loss to every block.
static inline void residual_forward(gpt_real *out, const gpt_real *a, const gpt_real *b, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// --- softmax + cross-entropy, fused
// p = softmax(logits), loss = -log p[target] = logsumexp(logits) - logits[target].
// The logits buffer is overwritten with p (the backward pass needs p, and
// the logits themselves are not needed again). Returns the mean loss.
static inline float crossentropy_forward(gpt_real *losses, gpt_real *logits_probs,
                                         const uint16_t *targets, int N, int V) {
    double total = 0;
#pragma omp parallel for reduction(+ : total)
    for (int n = 0; n < N; n++) {
        gpt_real *z = logits_probs + (size_t)n * V, maxv = z[0], sum = 0;
#pragma omp simd reduction(max : maxv)
        for (int i = 1; i < V; i++) maxv = z[i] > maxv ? z[i] : maxv;
        gpt_real target_logit = z[targets[n]] - maxv; // shifted by the max, as every exponent below
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) {
            z[i] = gpt_exp(z[i] - maxv);
            sum += z[i];
        }
        losses[n] = log(sum) - target_logit;
        gpt_real inv = 1 / sum;
#pragma omp simd
        for (int i = 0; i < V; i++) z[i] *= inv;
        total += losses[n];
    }
    return (float)(total / N);
}

// d(loss)/d(logits) = p - onehot(target); times dloss, the weight of each
// row in the mean (and the gradient-accumulation scale). In place: p in, dlogits out.
static inline void crossentropy_backward(gpt_real *probs_dlogits, const uint16_t *targets,
                                         int N, int V, gpt_real dloss) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt_real *d = probs_dlogits + (size_t)n * V;
        d[targets[n]] -= 1;
#pragma omp simd
        for (int i = 0; i < V; i++) d[i] *= dloss;
    }
}

// Context parallelism (chapter 12): a rank's tokens of each sequence, and
// attention across the ranks that hold the others.
#include "context_parallel.h"
#include "moe.h" // the mixture of experts that replaces the MLP when cfg.n_expert > 0

// ===================================================================== 5. the model

// GPT-2's initialisation: weights N(0, 0.02), the two projections that
// write into the residual stream scaled by 1/sqrt(2 * n_layer) so that the
// stream's variance does not grow with depth; biases 0, LayerNorm gains 1.
static inline void gpt_init_params(gpt_t *m, uint64_t seed) {
    rng_t rng = rng_seed(seed);
    double proj_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int i = 0; i < m->num_tensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        gpt_real *p = m->params + t->offset;
        bool layernorm_gain = strstr(t->name, "ln_") && strstr(t->name, ".weight");
        bool projection = strstr(t->name, "c_proj.weight") != NULL;
        for (size_t j = 0; j < t->count; j++) {
            if (t->ndim == 2) p[j] = (gpt_real)(rng_normal(&rng) * (projection ? proj_std : 0.02));
            else p[j] = layernorm_gain ? 1 : 0;
        }
    }
}

// Builds the model: the table, parameters (deterministic from the seed),
// zeroed gradients. Activations are allocated by the first forward pass.
static inline void gpt_init(gpt_t *m, gpt_config cfg, uint64_t seed) {
    const char *problem = gpt_config_problem(cfg);
    if (problem) die("bad model configuration: %s", problem);
    memset(m, 0, sizeof *m);
    m->cfg = cfg;
    m->stage = gpt_stage_of(&cfg, 0, 1);
    gpt_build_table(m);
    m->params = xmalloc(sizeof(gpt_real) * m->num_params);
    m->grads = xcalloc(m->num_params, sizeof(gpt_real));
    gpt_init_params(m, seed);
}

// m->acts holds, in gpt_layout.h's order: the activations outside the
// blocks (embeddings, scratch, ln_f, losses), then each block's, then the
// logits (N, V). The CPU keeps both kinds of gpt_layout.h (ACT and STAT) in
// this one buffer, and the attention probabilities (no flash attention).
// With context parallelism the probabilities are this rank's part of the
// whole sequence's (cp_att_size).
static inline size_t gpt_cpu_block_act_size(const gpt_t *m, int a, size_t B, size_t T) {
    if (a == A_ATT && m->cp) return cp_att_size(m->cp, B, (size_t)m->cp->n_head);
    return gpt_block_act_size_tp(&m->cfg, m->tp, a, B, T);
}
static inline size_t gpt_cpu_block_acts(const gpt_t *m, size_t B, size_t T) {
    size_t total = 0;
    for (int a = 0; a < GPT_BLOCK_ACTS; a++)
        if (gpt_block_act_kept(a, false)) total += gpt_cpu_block_act_size(m, a, B, T);
    return total;
}
static inline size_t gpt_cpu_head_acts(const gpt_config *c, size_t B, size_t T) {
    return gpt_head_acts_size(c, GPT_ACT, B, T) + gpt_head_acts_size(c, GPT_STAT, B, T);
}

// Block `layer`'s activations inside m->acts: one carve loop over the layout.
static inline gpt_block_acts gpt_block_acts_view(const gpt_t *m, int layer) {
    size_t B = (size_t)m->B, T = (size_t)m->T;
    gpt_block_acts a = {0};
    gpt_real **slot[GPT_BLOCK_ACTS] = {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, NULL, &a.atty, &a.res2,
                                       &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu, &a.res3};
    gpt_real *cur = m->acts + gpt_cpu_head_acts(&m->cfg, B, T) +
                    (size_t)(layer - m->stage.first) * gpt_cpu_block_acts(m, B, T);
    for (int i = 0; i < GPT_BLOCK_ACTS; i++) {
        if (!gpt_block_act_kept(i, false)) continue;
        *slot[i] = cur;
        cur += gpt_cpu_block_act_size(m, i, B, T);
    }
    return a;
}

typedef struct { gpt_real *encoded, *scratch, *lnf, *lnf_mean, *lnf_rstd, *losses, *logits; } gpt_head_acts;

static inline gpt_head_acts gpt_head_acts_view(const gpt_t *m) {
    size_t B = (size_t)m->B, T = (size_t)m->T;
    gpt_head_acts h;
    gpt_real **slot[GPT_HEAD_ACTS] = {&h.encoded, &h.scratch, &h.lnf, &h.lnf_mean, &h.lnf_rstd, &h.losses};
    gpt_real *cur = m->acts;
    for (int i = 0; i < GPT_HEAD_ACTS; i++) {
        *slot[i] = cur;
        cur += gpt_head_act_size(&m->cfg, i, B, T);
    }
    h.logits = cur + (size_t)(m->stage.last - m->stage.first) * gpt_cpu_block_acts(m, B, T);
    return h;
}

// The backward pass's scratch (m->grad_acts), as gpt_layout.h lists it.
typedef struct { gpt_real *dres, *dtmp, *dqkv, *dhidden; } gpt_grad_acts;

static inline gpt_grad_acts gpt_grad_acts_view(const gpt_t *m) {
    gpt_grad_acts g;
    gpt_real **slot[GPT_GRAD_ACTS] = {&g.dres, &g.dtmp, &g.dqkv, &g.dhidden};
    gpt_real *cur = m->grad_acts;
    for (int i = 0; i < GPT_GRAD_ACTS; i++) {
        *slot[i] = cur;
        cur += gpt_grad_act_size_tp(&m->cfg, m->tp, i, (size_t)m->B, (size_t)m->T);
    }
    return g;
}

// Makes room for a batch of B sequences of T tokens (grows, never shrinks).
// Only the last stage of a pipeline computes logits.
static inline void gpt_ensure_acts(gpt_t *m, int B, int T) {
    size_t N = (size_t)B * T, L = (size_t)(m->stage.last - m->stage.first);
    size_t acts = gpt_cpu_head_acts(&m->cfg, B, T) + L * gpt_cpu_block_acts(m, B, T) +
                  (m->stage.head ? N * (size_t)m->cfg.vocab_size : 0);
    size_t grad_acts = gpt_grad_acts_size_tp(&m->cfg, m->tp, B, T);
    if (acts > m->acts_capacity) {
        free(m->acts);
        m->acts = xmalloc(sizeof(gpt_real) * acts);
        m->acts_capacity = acts;
    }
    if (grad_acts > m->grads_capacity) {
        free(m->grad_acts);
        m->grad_acts = xmalloc(sizeof(gpt_real) * grad_acts);
        m->grads_capacity = grad_acts;
    }
    if (N > m->tokens_capacity) {
        free(m->inputs);
        free(m->targets);
        m->inputs = xmalloc(sizeof(uint16_t) * N);
        m->targets = xmalloc(sizeof(uint16_t) * N);
        m->tokens_capacity = N;
    }
    m->B = B, m->T = T;
}

// A shard of a block, split over tensor-parallel ranks (section 9).
static inline void gpt_tp_block_forward(gpt_t *m, int layer, gpt_real *params, const gpt_real *x, gpt_real *scratch);
static inline void gpt_tp_block_backward(gpt_t *m, int layer, gpt_real *params, gpt_real *grads);

// One transformer block, pre-LayerNorm (as GPT-2):
//     res2 = x    + attn(ln_1(x))
//     res3 = res2 + mlp(ln_2(res2)),   mlp(z) = c_proj(gelu(c_fc(z)))
// `params` is the block's part of the parameters (gpt_block_view).
static inline void gpt_block_forward(gpt_t *m, int layer, gpt_real *params, const gpt_real *x, gpt_real *scratch) {
    if (m->tp > 1) { // this model holds a shard of the block (chapter 10)
        gpt_tp_block_forward(m, layer, params, x, scratch);
        return;
    }
    int B = m->B, T = m->T, C = m->cfg.n_embd, N = B * T;
    gpt_block p = gpt_block_view(m, params, layer);
    gpt_block_acts a = gpt_block_acts_view(m, layer);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, C);
    matmul_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C);
    if (m->cp) cp_attention_forward(m->cp, a.atty, a.att, a.qkv, B, C, m->cfg.n_head); // across the cp ranks
    else attention_forward(a.atty, a.att, a.qkv, B, T, C, m->cfg.n_head);
    matmul_forward(scratch, a.atty, p.attproj_w, p.attproj_b, N, C, C);
    residual_forward(a.res2, x, scratch, (size_t)N * C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C);
    if (m->cfg.n_expert) { // a mixture of experts in the MLP's place, residual included (gpt/moe.h)
        gpt_moe_forward(m, layer, &p, a.ln2, a.res2, a.res3);
        return;
    }
    matmul_forward(a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C);
    gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C);
    matmul_forward(scratch, a.fch_gelu, p.fcproj_w, p.fcproj_b, N, 4 * C, C);
    residual_forward(a.res3, a.res2, scratch, (size_t)N * C);
}

static inline void gpt_check_tokens(const gpt_t *m, const uint16_t *tokens, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= m->cfg.vocab_size)
            die("%s token %u at position %zu is outside the model's vocabulary of %d; "
                "was the model built for another tokenizer?", what, tokens[i], i, m->cfg.vocab_size);
}

// Bucket `bucket`'s parameters (and, with grads, its gradients): the
// model's flat arrays from where the bucket starts, unless the hook points
// them elsewhere (gpt_layout.h, section 3).
static inline void gpt_bucket_begin(gpt_t *m, gpt_bucket_event event, int bucket, gpt_real **params, gpt_real **grads) {
    size_t start = gpt_bucket_start(m, bucket);
    *params = m->params ? m->params + start : NULL;
    if (grads) *grads = m->grads ? m->grads + start : NULL;
    if (m->hook) m->hook(m->hook_user, event, bucket, params, grads);
}

// The pass is done with the bucket (FORWARD_END, BACKWARD_END).
static inline void gpt_bucket_end(gpt_t *m, gpt_bucket_event event, int bucket) {
    if (m->hook) m->hook(m->hook_user, event, bucket, NULL, NULL);
}

// The residual input of block `layer`: the embeddings, or the previous
// block's output. A pipeline stage's first block reads the `encoded` slot
// too, where the previous stage's output was received (gpt_stage_input).
static inline gpt_real *gpt_block_input(const gpt_t *m, int layer) {
    return layer == m->stage.first ? gpt_head_acts_view(m).encoded : gpt_block_acts_view(m, layer - 1).res3;
}

// inputs, targets: B rows of T tokens. Returns the mean cross-entropy, or
// -1 when targets is NULL; then m->acts holds the logits (gpt_logits).
// A pipeline stage (gpt_init_stage) computes its part only: the first
// stage embeds the inputs; the others take no tokens (inputs NULL) and
// start from the previous stage's output, received into gpt_stage_input;
// only the last computes logits and the loss, the others return -1 and
// leave their output in gpt_stage_output.
static inline float gpt_forward(gpt_t *m, const uint16_t *inputs, const uint16_t *targets, int B, int T) {
    if (B < 1 || T < 1 || T > m->cfg.block_size)
        die("gpt_forward: batch %d x %d tokens does not fit the model (block_size %d)", B, T, m->cfg.block_size);
    if ((inputs != NULL) != m->stage.embedding || (targets && !m->stage.head))
        die("gpt_forward: stage %d of %d takes %s", m->stage.index, m->stage.count,
            m->stage.embedding ? "input tokens" : "no input tokens, and targets only if it is the last");
    // Context parallelism: from here on the model computes this rank's
    // tokens of each sequence only (T of them, at their global positions).
    if (m->cp) {
        T = cp_take_tokens(m->cp, inputs, targets, B, T);
        inputs = inputs ? m->cp->inputs : NULL, targets = targets ? m->cp->targets : NULL;
    }
    size_t N = (size_t)B * T;
    if (inputs) gpt_check_tokens(m, inputs, N, "input");
    if (targets) gpt_check_tokens(m, targets, N, "target");
    gpt_ensure_acts(m, B, T);
    if (inputs) memcpy(m->inputs, inputs, sizeof(uint16_t) * N);
    if (targets) memcpy(m->targets, targets, sizeof(uint16_t) * N);
    // The last stage's backward pass starts from the targets; another
    // stage's from the gradient the next stage sends.
    m->have_targets = targets != NULL || !m->stage.head;

    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->stage.last, emb = gpt_bucket_embeddings(&m->cfg);
    gpt_head_acts h = gpt_head_acts_view(m);
    gpt_real *embeddings = NULL, *block, *ln_f, *wte = NULL;
    // The embeddings' bucket: the encoder reads wte and wpe, the LM head wte
    // again (tied weights), on the first and the last stage of a pipeline.
    bool embedding_bucket = m->stage.embedding || m->stage.head;
    if (embedding_bucket) {
        gpt_bucket_begin(m, GPT_FORWARD_BEGIN, emb, &embeddings, NULL);
        wte = gpt_tensor_in(m, embeddings, emb, 0);
    }
    if (m->stage.embedding)
        encoder_forward_at(h.encoded, m->inputs, wte, gpt_tensor_in(m, embeddings, emb, 1), m->cp ? m->cp->pos : NULL,
                           B, T, C);
    for (int l = m->stage.first; l < L; l++) {
        gpt_bucket_begin(m, GPT_FORWARD_BEGIN, gpt_bucket_of_block(&m->cfg, l), &block, NULL);
        gpt_block_forward(m, l, block, gpt_block_input(m, l), h.scratch);
        gpt_bucket_end(m, GPT_FORWARD_END, gpt_bucket_of_block(&m->cfg, l));
    }
    if (!m->stage.head) {
        if (embedding_bucket) gpt_bucket_end(m, GPT_FORWARD_END, emb);
        return m->last_loss = -1.0f;
    }
    int lnf = gpt_ln_f_tensor(&m->cfg);
    gpt_bucket_begin(m, GPT_FORWARD_BEGIN, GPT_BUCKET_LN_F, &ln_f, NULL);
    layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, gpt_block_input(m, L), gpt_tensor_in(m, ln_f, GPT_BUCKET_LN_F, lnf),
                      gpt_tensor_in(m, ln_f, GPT_BUCKET_LN_F, lnf + 1), (int)N, C);
    matmul_forward(h.logits, h.lnf, wte, NULL, (int)N, C, V); // the LM head is wte: tied weights
    m->last_loss = targets ? crossentropy_forward(h.losses, h.logits, m->targets, (int)N, V) : -1.0f;
    if (m->cp && targets) m->last_loss = cp_mean_loss(m->cp, m->last_loss, N); // the mean over every rank's tokens
    gpt_bucket_end(m, GPT_FORWARD_END, GPT_BUCKET_LN_F);
    gpt_bucket_end(m, GPT_FORWARD_END, emb);
    return m->last_loss;
}

// The logits of sequence b at position t after gpt_forward(..., NULL, ...).
static inline const gpt_real *gpt_logits(const gpt_t *m, int b, int t) {
    if (m->cp) return cp_logits(m->cp, gpt_head_acts_view(m).logits, b, t, m->cfg.vocab_size); // from its rank
    return gpt_head_acts_view(m).logits + ((size_t)b * m->T + t) * m->cfg.vocab_size;
}

// The block's backward pass, in the reverse order of its forward pass.
// On entry g.dres is d(loss)/d(res3); on return d(loss)/d(x). params and
// grads are the block's parts of the parameters and gradients.
static inline void gpt_block_backward(gpt_t *m, int layer, gpt_real *params, gpt_real *grads) {
    if (m->tp > 1) {
        gpt_tp_block_backward(m, layer, params, grads);
        return;
    }
    int B = m->B, T = m->T, C = m->cfg.n_embd, N = B * T;
    gpt_block p = gpt_block_view(m, params, layer), d = gpt_block_view(m, grads, layer);
    gpt_block_acts a = gpt_block_acts_view(m, layer);
    gpt_grad_acts g = gpt_grad_acts_view(m);
    const gpt_real *x = gpt_block_input(m, layer);

    // MLP branch. res3 = res2 + c_proj(...): the branch's output gradient
    // is dres itself, and dres also flows on unchanged to res2.
    if (m->cfg.n_expert) { // a mixture of experts' (gpt/moe.h)
        gpt_moe_backward(m, layer, &p, &d, a.ln2, g.dres, g.dtmp, m->grad_scale);
    } else {
        matmul_backward(g.dhidden, d.fcproj_w, d.fcproj_b, g.dres, a.fch_gelu, p.fcproj_w, N, 4 * C, C);
        gelu_backward(g.dhidden, a.fch, g.dhidden, (size_t)N * 4 * C);
        matmul_backward(g.dtmp, d.fc_w, d.fc_b, g.dhidden, a.ln2, p.fc_w, N, C, 4 * C);
    }
    layernorm_backward(g.dres, d.ln2_w, d.ln2_b, g.dtmp, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);

    // Attention branch, the same way: dres is now d(loss)/d(res2).
    matmul_backward(g.dtmp, d.attproj_w, d.attproj_b, g.dres, a.atty, p.attproj_w, N, C, C);
    if (m->cp) cp_attention_backward(m->cp, g.dqkv, g.dtmp, a.qkv, a.att, a.atty, B, C, m->cfg.n_head);
    else attention_backward(g.dqkv, g.dtmp, a.qkv, a.att, B, T, C, m->cfg.n_head);
    matmul_backward(g.dtmp, d.qkv_w, d.qkv_b, g.dqkv, a.ln1, p.qkv_w, N, C, 3 * C);
    layernorm_backward(g.dres, d.ln1_w, d.ln1_b, g.dtmp, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
}

// Adds grad_scale * d(mean loss of the last forward)/d(parameters) to m->grads.
// grad_scale is 1 for a plain step and 1/k when k micro-batches accumulate.
// The logits buffer is consumed: call gpt_forward again before another backward.
// A pipeline stage other than the last starts from d(loss)/d(its output),
// which the next stage sent into gpt_stage_grad (grad_scale is in it
// already); a stage other than the first ends with d(loss)/d(its input)
// there, for the previous stage.
static inline void gpt_backward(gpt_t *m, float grad_scale) {
    if (!m->have_targets) die("gpt_backward needs a gpt_forward with targets just before it");
    m->have_targets = false;
    m->grad_scale = (gpt_real)grad_scale; // a mixture of experts scales its balancing loss's gradient by it
    int B = m->B, T = m->T, C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->stage.last, N = B * T;
    int emb = gpt_bucket_embeddings(&m->cfg), lnf = gpt_ln_f_tensor(&m->cfg), F = GPT_BUCKET_LN_F;
    gpt_head_acts h = gpt_head_acts_view(m);
    gpt_grad_acts g = gpt_grad_acts_view(m);
    gpt_real *embeddings = NULL, *dembeddings = NULL, *ln_f = NULL, *dln_f = NULL, *block, *dblock, *wte = NULL, *dwte = NULL;
    bool embedding_bucket = m->stage.embedding || m->stage.head;
    if (m->stage.head) gpt_bucket_begin(m, GPT_BACKWARD_BEGIN, F, &ln_f, &dln_f);
    if (embedding_bucket) {
        gpt_bucket_begin(m, GPT_BACKWARD_BEGIN, emb, &embeddings, &dembeddings);
        wte = gpt_tensor_in(m, embeddings, emb, 0), dwte = gpt_tensor_in(m, dembeddings, emb, 0);
    }

    if (m->stage.head) {
        double per = m->cp ? cp_tokens_per_rank(m->cp, B) : (double)N; // what each rank's loss is a mean over
        crossentropy_backward(h.logits, m->targets, N, V, (gpt_real)grad_scale / (gpt_real)per);
        matmul_backward(g.dtmp, dwte, NULL, h.logits, h.lnf, wte, N, C, V); // LM head: adds into dwte
        memset(g.dres, 0, sizeof(gpt_real) * (size_t)N * C);
        layernorm_backward(g.dres, gpt_tensor_in(m, dln_f, F, lnf), gpt_tensor_in(m, dln_f, F, lnf + 1), g.dtmp,
                           gpt_block_input(m, L), gpt_tensor_in(m, ln_f, F, lnf), h.lnf_mean, h.lnf_rstd, N, C);
        gpt_bucket_end(m, GPT_BACKWARD_END, F);
    }
    for (int l = L - 1; l >= m->stage.first; l--) {
        gpt_bucket_begin(m, GPT_BACKWARD_BEGIN, gpt_bucket_of_block(&m->cfg, l), &block, &dblock);
        gpt_block_backward(m, l, block, dblock);
        gpt_bucket_end(m, GPT_BACKWARD_END, gpt_bucket_of_block(&m->cfg, l));
    }
    if (m->stage.embedding)
        encoder_backward_at(dwte, gpt_tensor_in(m, dembeddings, emb, 1), g.dres, m->inputs, m->cp ? m->cp->pos : NULL,
                            B, T, C);
    if (embedding_bucket) gpt_bucket_end(m, GPT_BACKWARD_END, emb);
}

static inline void gpt_zero_grad(gpt_t *m) { memset(m->grads, 0, sizeof(gpt_real) * m->num_params); }

static inline void gpt_free(gpt_t *m) {
    free(m->params), free(m->grads), free(m->adam_m), free(m->adam_v), free(m->tensors);
    free(m->acts), free(m->grad_acts), free(m->inputs), free(m->targets);
    cp_free(m->cp);
    for (int k = 0; k < m->num_slots; k++)
        if (k != m->slot) {
            free(m->slots[k].acts), free(m->slots[k].inputs), free(m->slots[k].targets);
            gpt_moe_free_layers(&m->cfg, m->slots[k].moe_layers);
        }
    free(m->slots);
    gpt_moe_free(m);
    memset(m, 0, sizeof *m);
}

// --- a pipeline stage (chapter 11)
//
// A gpt_t may hold one stage of a pipeline (gpt_layout.h, section 6): the
// table, the flat arrays and the loops cover its blocks and ends only, and
// block numbers stay the whole model's.

// A stage is made from the whole model by gpt_init_part (section 9: a
// stage of tensor-parallel shards too), and its arrays go back into the
// whole model's with gpt_shard_copy, tensor by tensor.

// A stage keeps the activations of several micro-batches at once: slot k
// holds one micro-batch's forward pass until its backward pass has used
// it. gpt_use_slot(m, k) makes slot k the one gpt_forward writes and
// gpt_backward reads. A slot's buffers are allocated by the first forward
// pass that uses it, so the memory a schedule takes is the slots it uses.
static inline void gpt_use_slot(gpt_t *m, int k) {
    if (k < 0 || k > 4096) die("gpt_use_slot: slot %d", k);
    if (!m->slots) m->slots = xcalloc(1, sizeof(gpt_slot)), m->num_slots = 1, m->slot = 0;
    if (k >= m->num_slots) {
        m->slots = realloc(m->slots, sizeof(gpt_slot) * (size_t)(k + 1));
        if (!m->slots) die("out of memory for %d activation slots", k + 1);
        memset(m->slots + m->num_slots, 0, sizeof(gpt_slot) * (size_t)(k + 1 - m->num_slots));
        m->num_slots = k + 1;
    }
    if (k == m->slot) return;
    gpt_slot *away = &m->slots[m->slot], *next = &m->slots[k];
    *away = (gpt_slot){.acts = m->acts, .inputs = m->inputs, .targets = m->targets, .acts_capacity = m->acts_capacity,
                       .tokens_capacity = m->tokens_capacity, .B = m->B, .T = m->T, .have_targets = m->have_targets};
    m->acts = next->acts, m->inputs = next->inputs, m->targets = next->targets;
    m->acts_capacity = next->acts_capacity, m->tokens_capacity = next->tokens_capacity;
    m->B = next->B, m->T = next->T, m->have_targets = next->have_targets;
    if (m->moe) { // a mixture of experts keeps each micro-batch's routing for its backward pass (the finale)
        away->moe_layers = m->moe->layer;
        m->moe->layer = next->moe_layers ? next->moe_layers : xcalloc((size_t)m->cfg.n_layer, sizeof(gpt_moe_layer));
    }
    m->slot = k;
}

// Bytes of activations allocated, in every slot: what the micro-batches in
// flight cost a stage.
static inline size_t gpt_slot_bytes(const gpt_t *m) {
    size_t bytes = m->acts_capacity * sizeof(gpt_real) + 2 * m->tokens_capacity * sizeof(uint16_t);
    for (int k = 0; k < m->num_slots; k++)
        if (k != m->slot)
            bytes += m->slots[k].acts_capacity * sizeof(gpt_real) + 2 * m->slots[k].tokens_capacity * sizeof(uint16_t);
    return bytes;
}

// What neighbouring stages send each other, B x T x C numbers each: this
// stage's input (where the previous stage's output is received, before
// gpt_forward of a batch of B x T), its output (after gpt_forward), and
// the gradient of the residual stream - before gpt_backward d(loss)/d(the
// output), received from the next stage; after it d(loss)/d(the input),
// for the previous stage.
static inline gpt_real *gpt_stage_input(gpt_t *m, int B, int T) {
    gpt_ensure_acts(m, B, T);
    return gpt_head_acts_view(m).encoded;
}
static inline gpt_real *gpt_stage_output(const gpt_t *m) { return gpt_block_acts_view(m, m->stage.last - 1).res3; }
static inline gpt_real *gpt_stage_grad(const gpt_t *m) { return gpt_grad_acts_view(m).dres; }

// ===================================================================== 6. optimizer

// The sum of the squares of the gradients [from, num_params). In a
// tensor-parallel shard: those of the split tensors, plus those of the
// replicated ones when `replicated` (the ranks of the tp group hold the
// same replicated gradients: one of them counts them).
static inline double gpt_grad_square_sum(const gpt_t *m, size_t from, bool replicated) {
    double sum = 0;
    if (gpt_tp_ways(m->tp) == 1) {
#pragma omp parallel for reduction(+ : sum)
        for (size_t i = from; i < m->num_params; i++) sum += (double)m->grads[i] * m->grads[i];
        return sum;
    }
    for (int t = 0; t < m->num_tensors; t++) {
        const gpt_tensor *ten = &m->tensors[t];
        if (ten->offset < from || (!replicated && ten->split == GPT_REPLICATED)) continue;
#pragma omp parallel for reduction(+ : sum)
        for (size_t i = ten->offset; i < ten->offset + ten->count; i++) sum += (double)m->grads[i] * m->grads[i];
    }
    return sum;
}

// Clips to max_norm the gradients whose squares sum to square_sum - here,
// or over the stages of a pipeline, each adding its own (chapter 11).
// Returns the norm.
static inline float gpt_clip_grads(gpt_t *m, double square_sum, float max_norm) {
    double norm = sqrt(square_sum);
    if (max_norm > 0 && norm > max_norm) {
        gpt_real s = (gpt_real)(max_norm / (norm + 1e-6));
#pragma omp parallel for
        for (size_t i = 0; i < m->num_params; i++) m->grads[i] *= s;
    }
    return (float)norm;
}

// Scales the gradients down when their global L2 norm exceeds max_norm
// (max_norm <= 0: never). Returns the norm before clipping. One bad batch
// then cannot throw the weights far. With data parallelism call it after
// the all-reduce, so every rank clips the same averaged gradient.
static inline float gpt_clip_grad_norm(gpt_t *m, float max_norm) {
    return gpt_clip_grads(m, gpt_grad_square_sum(m, 0, true), max_norm);
}

// AdamW (Loshchilov & Hutter), as torch.optim.AdamW, on the parameters
// [first, first + count) of the flat array, whose values, gradients and
// moments lie in params[0 .. count), grads[...], ...: the whole model
// (gpt_adamw_step), or one rank's slice in arrays of its own (chapter 09).
// The table says which tensors decay; step counts from 1:
//     m = b1 m + (1-b1) g,  v = b2 v + (1-b2) g^2        running moments
//     p -= lr * wd * p                                     decoupled weight decay (matrices only)
//     p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
static inline void gpt_adamw_range(const gpt_tensor *tensors, int num_tensors, size_t first, size_t count,
                                   gpt_real *params, const gpt_real *grads, gpt_real *adam_m, gpt_real *adam_v,
                                   int step, float lr, float beta1, float beta2, float eps, float weight_decay) {
    double c1 = 1 - pow((double)beta1, step), c2 = 1 - pow((double)beta2, step);
    for (int t = 0; t < num_tensors; t++) {
        const gpt_tensor *ten = &tensors[t];
        size_t begin = ten->offset > first ? ten->offset : first;
        size_t end = ten->offset + ten->count < first + count ? ten->offset + ten->count : first + count;
        if (begin >= end) continue;
        gpt_real decay = ten->decay ? (gpt_real)(lr * weight_decay) : 0;
#pragma omp parallel for simd
        for (size_t k = begin - first; k < end - first; k++) { // k: the position in this slice's arrays
            gpt_real g = grads[k];
            adam_m[k] = beta1 * adam_m[k] + (1 - beta1) * g;
            adam_v[k] = beta2 * adam_v[k] + (1 - beta2) * g * g;
            gpt_real mhat = adam_m[k] / (gpt_real)c1, vhat = adam_v[k] / (gpt_real)c2;
            params[k] -= decay * params[k];
            params[k] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
}

static inline void gpt_adamw_step(gpt_t *m, float lr, float beta1, float beta2, float eps, float weight_decay) {
    if (!m->adam_m) {
        m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
    }
    m->adam_step++;
    gpt_adamw_range(m->tensors, m->num_tensors, 0, m->num_params, m->params, m->grads, m->adam_m, m->adam_v,
                    m->adam_step, lr, beta1, beta2, eps, weight_decay);
}

// ===================================================================== 7. sampling

// Picks the next token from one row of logits. temperature <= 0: the most
// likely token (greedy). Otherwise softmax(logits / temperature) restricted
// to the top_k most likely tokens (top_k <= 0: all of them).
static inline int gpt_sample_next(const gpt_real *logits, int vocab, float temperature, int top_k, rng_t *rng) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    if (top_k <= 0 || top_k > vocab) top_k = vocab;
    // The k-th largest logit: repeatedly take the largest below the last one.
    double cut = logits[best];
    int kept = 1;
    while (kept < top_k) {
        double next = -INFINITY;
        for (int i = 0; i < vocab; i++)
            if (logits[i] < cut && logits[i] > next) next = logits[i];
        if (next == -INFINITY) break;
        for (int i = 0; i < vocab; i++) kept += logits[i] == next;
        cut = next;
    }
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] >= cut) sum += exp((logits[i] - (double)logits[best]) / temperature);
    double r = rng_uniform(rng) * sum, run = 0;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] < cut) continue;
        run += exp((logits[i] - (double)logits[best]) / temperature);
        if (run > r) return i;
    }
    return best;
}

// Extends tokens[0..len-1] to tokens[0..total-1], one token at a time. The
// model sees at most block_size tokens, so a long text slides its window.
static inline void gpt_generate(gpt_t *m, uint16_t *tokens, int len, int total, float temperature,
                                int top_k, rng_t *rng) {
    for (int n = len; n < total; n++) {
        int start = n > m->cfg.block_size ? n - m->cfg.block_size : 0;
        gpt_forward(m, tokens + start, NULL, 1, n - start);
        tokens[n] = (uint16_t)gpt_sample_next(gpt_logits(m, 0, n - start - 1), m->cfg.vocab_size,
                                              temperature, top_k, rng);
    }
}

// ===================================================================== 8. safetensors
//
// The format Hugging Face uses, written and read by common/safetensors.h: an
// 8-byte header length, a JSON header {"name": {"dtype": "F32", "shape":
// [...], "data_offsets": [begin, end]}, ..., "__metadata__": {"key":
// "value"}}, then the raw little-endian data. Python reads it with
// safetensors.torch.load_file; the metadata carries the configuration, so a
// file describes its model completely.

// A mixture of experts adds two keys (a dense model's file has neither).
static const char *const gpt_config_keys[7] = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd",
                                               "n_expert", "top_k"};

static inline int *gpt_config_field(gpt_config *c, int i) {
    int *fields[7] = {&c->vocab_size, &c->block_size, &c->n_layer, &c->n_head, &c->n_embd, &c->n_expert, &c->top_k};
    return fields[i];
}

// Every tensor of the table as float32 (a test's double model is converted
// into *copy, which the caller frees; a float model is used in place).
static inline safetensors_tensor *gpt_file_tensors(const gpt_t *m, float **copy) {
    const float *data = (const float *)m->params;
    *copy = NULL;
    if (sizeof(gpt_real) != sizeof(float)) {
        *copy = xmalloc(m->num_params * sizeof(float));
        for (size_t i = 0; i < m->num_params; i++) (*copy)[i] = (float)m->params[i];
        data = *copy;
    }
    safetensors_tensor *t = xcalloc((size_t)m->num_tensors, sizeof *t);
    for (int i = 0; i < m->num_tensors; i++) {
        const gpt_tensor *g = &m->tensors[i];
        int64_t shape[2] = {g->shape[0], g->shape[1]};
        t[i] = safetensors_tensor_of(g->name, "F32", data + g->offset, g->ndim, shape);
    }
    return t;
}

// The weights and the configuration, atomically (a crash leaves the old
// file or the new one, never half of one).
static inline bool gpt_save_safetensors(const gpt_t *m, const char *path, char *err, size_t errlen) {
    safetensors_meta meta[9] = {safetensors_meta_of("format", "pt"), safetensors_meta_of("model", "gpt")};
    gpt_config c = m->cfg;
    int keys = c.n_expert ? 7 : 5;
    if (c.ep > 1) return snprintf(err, errlen, "%s: a model holding %d of %d experts is not a whole model", path,
                                  gpt_moe_local(&c), c.n_expert), false;
    for (int i = 0; i < keys; i++) meta[2 + i] = safetensors_meta_of(gpt_config_keys[i], "%d", *gpt_config_field(&c, i));
    float *copy;
    safetensors_tensor *t = gpt_file_tensors(m, &copy);
    bool ok = safetensors_write(path, t, m->num_tensors, meta, 2 + keys, err, errlen);
    free(t);
    free(copy);
    return ok;
}

// The configuration recorded in the metadata; false (why set) when it is
// missing or cannot be built.
static inline bool gpt_file_config(const safetensors_t *f, gpt_config *cfg, char *why, size_t whylen) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < 7; i++) {
        const char *text = safetensors_meta_get(f, gpt_config_keys[i]);
        char *end = NULL;
        long v = text ? strtol(text, &end, 10) : -1;
        if (text && (*end || end == text || v < 0 || v > 1000000)) v = -1;
        if (v >= 0) *gpt_config_field(cfg, i) = (int)v;
    }
    const char *problem = gpt_config_problem(*cfg);
    if (problem) return snprintf(why, whylen, "__metadata__ has no usable configuration (%s)", problem), false;
    return true;
}

// Every tensor of the file is one of the table's, as F32 with its shape,
// and every one of the table's is in the file.
static inline bool gpt_file_matches(const gpt_t *m, const safetensors_t *f, char *why, size_t whylen) {
    for (int i = 0; i < f->num_tensors; i++) {
        const safetensors_tensor *e = &f->tensors[i];
        int k = 0;
        while (k < m->num_tensors && strcmp(m->tensors[k].name, e->name)) k++;
        if (k == m->num_tensors) return snprintf(why, whylen, "unexpected tensor '%s'", e->name), false;
        const gpt_tensor *t = &m->tensors[k];
        bool shape_ok = e->ndim == t->ndim && e->shape[0] == t->shape[0] && (t->ndim == 1 || e->shape[1] == t->shape[1]);
        if (strcmp(e->dtype, "F32")) return snprintf(why, whylen, "tensor '%s' is %s, not F32", e->name, e->dtype), false;
        if (!shape_ok) return snprintf(why, whylen, "tensor '%s' has the wrong shape for this configuration", e->name), false;
    }
    for (int k = 0; k < m->num_tensors; k++)
        if (!safetensors_find(f, m->tensors[k].name))
            return snprintf(why, whylen, "tensor '%s' is missing", m->tensors[k].name), false;
    return true;
}

// "<path>: <why>" on one line: a reason may quote a tensor name from the
// file, whose control characters (a newline, a terminal escape) become '?'.
static inline bool gpt_fail(char *err, size_t errlen, const char *path, const char *why) {
    snprintf(err, errlen, "%s: %s", path, why);
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return false;
}

// Builds *m from a file written by gpt_save_safetensors (or by Python with
// the same names). false, with a one-line reason in err, on a missing,
// short, corrupt or foreign file. The configuration in the header is checked
// against the file's size before the model is built: a few damaged bytes
// must not make it allocate (and fill) gigabytes for a model the file
// cannot hold.
static inline bool gpt_load_safetensors(gpt_t *m, const char *path, char *err, size_t errlen) {
    safetensors_t f;
    char why[256] = "";
    gpt_config cfg;
    if (!safetensors_read(path, &f, why, sizeof why)) return gpt_fail(err, errlen, path, why);
    bool ok = gpt_file_config(&f, &cfg, why, sizeof why);
    size_t params = ok ? gpt_num_params(&cfg) : 0;
    if (ok && params > f.blob_bytes / sizeof(float))
        ok = false, snprintf(why, sizeof why, "its __metadata__ describes a model of %zu parameters, but the file holds "
                             "only %zu bytes of tensors (truncated, or a damaged configuration)", params, f.blob_bytes);
    if (ok) {
        gpt_init(m, cfg, 0);
        ok = gpt_file_matches(m, &f, why, sizeof why);
        for (int k = 0; ok && k < m->num_tensors; k++) {
            const gpt_tensor *t = &m->tensors[k];
            const float *src = safetensors_find(&f, t->name)->data;
            for (size_t i = 0; i < t->count; i++) m->params[t->offset + i] = src[i];
        }
        if (!ok) gpt_free(m);
    }
    safetensors_release(&f);
    if (!ok) return gpt_fail(err, errlen, path, why);
    return true;
}

// ===================================================================== 9. tensor parallelism
//
// Chapter 10 splits every block over tp ranks (gpt_layout.h, section 5,
// says how and why): each rank's model is a gpt_t with m->tp = tp whose
// table (gpt_layout_params_tp) holds the rank's shard of each split tensor
// and all of each replicated one. Everything else - the flat arrays,
// zero_grad, AdamW, the buckets - works on the shard as on a whole model;
// only a block's two passes and the gradient norm differ, below.

// Copies between an array of the whole model (`full`: parameters, or an
// AdamW moment) and the same array of rank `rank`'s shard (`shard`, laid
// out as m's table): into the shard when to_shard, else the shard's part
// of `full` from it. Called for every rank of the group with its shard,
// the second way assembles the whole model. (A pipeline stage's table
// leaves out the tensors of the other stages: empty, they are skipped.)
static inline void gpt_shard_copy(const gpt_t *m, int rank, gpt_real *full, gpt_real *shard, bool to_shard) {
    gpt_tensor *whole = xcalloc((size_t)m->num_tensors, sizeof(gpt_tensor));
    gpt_layout_params(&m->cfg, whole);
    for (int t = 0; t < m->num_tensors; t++)
        if (m->tensors[t].count > 0)
            gpt_tensor_shard_copy(&whole[t], &m->tensors[t], m->cfg.n_embd, m->tp, rank, full, shard, sizeof(gpt_real),
                              to_shard);
    free(whole);
}

// The part of `full` (a whole model: its parameters and, when it has
// them, its AdamW moments and step) that rank `rank` of tp holds of
// pipeline stage `stage` (chapter 11; gpt_stage_of(c, 0, 1): all blocks).
static inline void gpt_init_part(gpt_t *m, const gpt_t *full, gpt_stage stage, int tp, int rank) {
    const char *problem = gpt_tp_problem(&full->cfg, tp);
    if (problem) die("cannot split the model over %d ranks: %s (n_head %d)", tp, problem, full->cfg.n_head);
    if (rank < 0 || rank >= gpt_tp_ways(tp)) die("gpt_init_part: rank %d of %d", rank, tp);
    memset(m, 0, sizeof *m);
    m->cfg = full->cfg;
    m->stage = stage;
    m->tp = tp;
    gpt_build_table(m);
    m->params = xmalloc(sizeof(gpt_real) * m->num_params);
    m->grads = xcalloc(m->num_params, sizeof(gpt_real));
    gpt_shard_copy(m, rank, full->params, m->params, true);
    m->adam_step = full->adam_step;
    if (full->adam_m) {
        m->adam_m = xmalloc(sizeof(gpt_real) * m->num_params);
        m->adam_v = xmalloc(sizeof(gpt_real) * m->num_params);
        gpt_shard_copy(m, rank, full->adam_m, m->adam_m, true);
        gpt_shard_copy(m, rank, full->adam_v, m->adam_v, true);
    }
}

// The shard of `full` that rank `rank` of tp holds: every block's part.
static inline void gpt_init_shard(gpt_t *m, const gpt_t *full, int tp, int rank) {
    gpt_init_part(m, full, gpt_stage_of(&full->cfg, 0, 1), tp, rank);
}

// The sum over the tp ranks, in place: the training program's all-reduce.
static inline void gpt_tp_sum(gpt_t *m, gpt_real *buf, size_t count) {
    if (!m->tp_all_reduce) die("a tensor-parallel model (tp %d) needs tp_all_reduce, the all-reduce over its ranks", m->tp);
    m->tp_all_reduce(m->tp_user, buf, count);
}

// out = a + (b + bias): the residual add, with the row-parallel layer's
// bias added once to the all-reduced sum b.
static inline void residual_bias_forward(gpt_real *out, const gpt_real *a, const gpt_real *b, const gpt_real *bias,
                                         int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const gpt_real *an = a + (size_t)n * C, *bn = b + (size_t)n * C;
        gpt_real *o = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = an[c] + (bn[c] + bias[c]);
    }
}

// The block of gpt_block_forward on this rank's shard. Cs = C/tp channels
// of heads (NH/tp heads of C/NH channels), H = 4C/tp hidden units. The
// replicated layers run whole on every rank, on the same numbers; the two
// row-parallel layers write partial sums, which the ranks add up (g).
static inline void gpt_tp_block_forward(gpt_t *m, int layer, gpt_real *params, const gpt_real *x, gpt_real *scratch) {
    int B = m->B, T = m->T, C = m->cfg.n_embd, N = B * T, Cs = C / m->tp, H = 4 * C / m->tp;
    gpt_block p = gpt_block_view(m, params, layer);
    gpt_block_acts a = gpt_block_acts_view(m, layer);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, C);
    matmul_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * Cs);      // column-parallel: my heads' q, k, v
    if (m->cp) cp_attention_forward(m->cp, a.atty, a.att, a.qkv, B, Cs, m->cfg.n_head / m->tp); // my heads, across cp
    else attention_forward(a.atty, a.att, a.qkv, B, T, Cs, m->cfg.n_head / m->tp);
    matmul_forward(scratch, a.atty, p.attproj_w, NULL, N, Cs, C);       // row-parallel: a partial sum
    gpt_tp_sum(m, scratch, (size_t)N * C);                              // g: all-reduce
    residual_bias_forward(a.res2, x, scratch, p.attproj_b, N, C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2_w, p.ln2_b, N, C);
    if (m->cfg.n_expert) { // the finale (chapter 14): whole experts on every tp rank, the same tokens, no sum
        gpt_moe_forward(m, layer, &p, a.ln2, a.res2, a.res3);
        return;
    }
    matmul_forward(a.fch, a.ln2, p.fc_w, p.fc_b, N, C, H);              // column-parallel: my hidden units
    gelu_forward(a.fch_gelu, a.fch, (size_t)N * H);
    matmul_forward(scratch, a.fch_gelu, p.fcproj_w, NULL, N, H, C);     // row-parallel
    gpt_tp_sum(m, scratch, (size_t)N * C);                              // g
    residual_bias_forward(a.res3, a.res2, scratch, p.fcproj_b, N, C);
}

// The block of gpt_block_backward on this rank's shard. dres, the residual
// stream's gradient, is the same on every rank, so the replicated
// parameters' gradients (the LayerNorms', the row-parallel biases') come
// out the same everywhere. A column-parallel layer's input gradient is
// only this rank's part (through its own heads or units): the ranks add
// them up (f) before the LayerNorm below it.
static inline void gpt_tp_block_backward(gpt_t *m, int layer, gpt_real *params, gpt_real *grads) {
    int B = m->B, T = m->T, C = m->cfg.n_embd, N = B * T, Cs = C / m->tp, H = 4 * C / m->tp;
    gpt_block p = gpt_block_view(m, params, layer), d = gpt_block_view(m, grads, layer);
    gpt_block_acts a = gpt_block_acts_view(m, layer);
    gpt_grad_acts g = gpt_grad_acts_view(m);
    const gpt_real *x = gpt_block_input(m, layer);

    if (m->cfg.n_expert) { // whole experts: the gradient of ln_2's output is whole already on every rank
        gpt_moe_backward(m, layer, &p, &d, a.ln2, g.dres, g.dtmp, m->grad_scale);
    } else {
        matmul_backward(g.dhidden, d.fcproj_w, d.fcproj_b, g.dres, a.fch_gelu, p.fcproj_w, N, H, C);
        gelu_backward(g.dhidden, a.fch, g.dhidden, (size_t)N * H);
        matmul_backward(g.dtmp, d.fc_w, d.fc_b, g.dhidden, a.ln2, p.fc_w, N, C, H);
        gpt_tp_sum(m, g.dtmp, (size_t)N * C);                           // f: all-reduce
    }
    layernorm_backward(g.dres, d.ln2_w, d.ln2_b, g.dtmp, a.res2, p.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);

    matmul_backward(g.dtmp, d.attproj_w, d.attproj_b, g.dres, a.atty, p.attproj_w, N, Cs, C);
    if (m->cp) cp_attention_backward(m->cp, g.dqkv, g.dtmp, a.qkv, a.att, a.atty, B, Cs, m->cfg.n_head / m->tp);
    else attention_backward(g.dqkv, g.dtmp, a.qkv, a.att, B, T, Cs, m->cfg.n_head / m->tp);
    matmul_backward(g.dtmp, d.qkv_w, d.qkv_b, g.dqkv, a.ln1, p.qkv_w, N, C, 3 * Cs);
    gpt_tp_sum(m, g.dtmp, (size_t)N * C);                               // f
    layernorm_backward(g.dres, d.ln1_w, d.ln1_b, g.dtmp, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
}

// gpt_clip_grad_norm for a shard: the model's norm adds the squares of
// every rank's split tensors (sum_over_tp: the sum of one double over the
// tp ranks, in place) and those of the replicated ones once (every rank
// holds the same). Every rank gets the same norm and clips the same way.
// The whole model (tp 1) is gpt_clip_grad_norm's, to the bit.
static inline float gpt_clip_grad_norm_tp(gpt_t *m, float max_norm, void (*sum_over_tp)(void *user, double *value),
                                          void *user) {
    if (m->tp <= 1) return gpt_clip_grad_norm(m, max_norm);
    double split = 0, replicated = 0;
    for (int t = 0; t < m->num_tensors; t++) {
        const gpt_tensor *ten = &m->tensors[t];
        double sum = 0;
#pragma omp parallel for reduction(+ : sum)
        for (size_t i = ten->offset; i < ten->offset + ten->count; i++) sum += (double)m->grads[i] * m->grads[i];
        if (ten->split == GPT_REPLICATED) replicated += sum;
        else split += sum;
    }
    sum_over_tp(user, &split);
    double norm = sqrt(split + replicated);
    if (max_norm > 0 && norm > max_norm) {
        gpt_real s = (gpt_real)(max_norm / (norm + 1e-6));
#pragma omp parallel for
        for (size_t i = 0; i < m->num_params; i++) m->grads[i] *= s;
    }
    return (float)norm;
}

// ===================================================================== 10. expert parallelism
//
// Chapter 13 spreads each block's experts over ep ranks (gpt_layout.h,
// section 7): rank r's model holds experts r E/ep ... of every block and
// all of everything else; moe.h exchanges the tokens. Everything else -
// the flat arrays, zero_grad, AdamW, the buckets - works on the shard as
// on a whole model.

// Does tensor t hold experts (one of a mixture's four expert tensors)?
static inline bool gpt_tensor_is_expert(const gpt_t *m, int t) {
    if (!m->cfg.n_expert || t < 2 || t >= gpt_ln_f_tensor(&m->cfg)) return false;
    return gpt_is_expert_tensor(&m->cfg, (t - 2) % gpt_block_tensors(&m->cfg));
}

// Copies between an array of the whole model (`full`) and the same array
// of expert shard `rank` (`shard`, laid out as m's table, m->cfg.ep ranks).
static inline void gpt_expert_shard_copy(const gpt_t *m, int rank, gpt_real *full, gpt_real *shard, bool to_shard) {
    gpt_config whole_cfg = m->cfg;
    whole_cfg.ep = 1;
    gpt_tensor *whole = xcalloc((size_t)m->num_tensors, sizeof(gpt_tensor));
    gpt_layout_params(&whole_cfg, whole);
    for (int t = 0; t < m->num_tensors; t++)
        gpt_tensor_expert_copy(&whole[t], &m->tensors[t], rank, full, shard, sizeof(gpt_real), to_shard);
    free(whole);
}

// The shard of `full` (its parameters and, when it has them, its AdamW
// moments and step) that rank `rank` of ep holds.
// The finale (chapter 14) cuts one model four ways at once: a pipeline
// stage (m->stage), a tp shard (m->tp, rank tp_rank), an ep shard of the
// experts (m->cfg.ep, rank ep_rank); cp ranks hold it whole. Each tensor
// is either an expert tensor (cut by ep; whole on every tp rank: a rank's
// experts compute its tokens whole) or not (cut by tp, as section 9).
// Copies between the whole model (`full`, ep 1) and m's part.
static inline void gpt_part_copy(const gpt_t *m, int tp_rank, int ep_rank, gpt_real *full, gpt_real *part,
                                 bool to_part) {
    gpt_config whole_cfg = m->cfg;
    whole_cfg.ep = 1;
    gpt_tensor *whole = xcalloc((size_t)m->num_tensors, sizeof(gpt_tensor));
    gpt_layout_params(&whole_cfg, whole);
    for (int t = 0; t < m->num_tensors; t++) {
        if (m->tensors[t].count == 0) continue; // not in this stage
        if (gpt_tensor_is_expert(m, t))
            gpt_tensor_expert_copy(&whole[t], &m->tensors[t], ep_rank, full, part, sizeof(gpt_real), to_part);
        else
            gpt_tensor_shard_copy(&whole[t], &m->tensors[t], m->cfg.n_embd, m->tp, tp_rank, full, part,
                                  sizeof(gpt_real), to_part);
    }
    free(whole);
}

// A part of the whole model `full` (its parameters, and AdamW's moments
// and step once it has them): stage `stage`, tp shard tp_rank of tp,
// experts ep_rank of ep.
static inline void gpt_init_piece(gpt_t *m, const gpt_t *full, gpt_stage stage, int tp, int tp_rank, int ep,
                                  int ep_rank) {
    gpt_config c = full->cfg;
    c.ep = ep;
    const char *problem = gpt_config_problem(c);
    if (!problem) problem = gpt_tp_problem(&c, tp);
    if (problem) die("cannot cut the model over tp %d, ep %d: %s", tp, ep, problem);
    memset(m, 0, sizeof *m);
    m->cfg = c, m->stage = stage, m->tp = tp, m->ep_rank = ep_rank;
    gpt_build_table(m);
    m->params = xmalloc(sizeof(gpt_real) * m->num_params);
    m->grads = xcalloc(m->num_params, sizeof(gpt_real));
    gpt_part_copy(m, tp_rank, ep_rank, full->params, m->params, true);
    m->adam_step = full->adam_step;
    if (full->adam_m) {
        m->adam_m = xmalloc(sizeof(gpt_real) * m->num_params);
        m->adam_v = xmalloc(sizeof(gpt_real) * m->num_params);
        gpt_part_copy(m, tp_rank, ep_rank, full->adam_m, m->adam_m, true);
        gpt_part_copy(m, tp_rank, ep_rank, full->adam_v, m->adam_v, true);
    }
}

static inline void gpt_init_expert_shard(gpt_t *m, const gpt_t *full, int ep, int rank) {
    gpt_config c = full->cfg;
    c.ep = ep;
    const char *problem = gpt_config_problem(c);
    if (problem) die("cannot spread the experts over %d ranks: %s (n_expert %d)", ep, problem, c.n_expert);
    if (rank < 0 || rank >= gpt_ep_ways(ep)) die("gpt_init_expert_shard: rank %d of %d", rank, ep);
    memset(m, 0, sizeof *m);
    m->cfg = c;
    m->stage = full->stage;
    m->ep_rank = rank;
    gpt_build_table(m);
    m->params = xmalloc(sizeof(gpt_real) * m->num_params);
    m->grads = xcalloc(m->num_params, sizeof(gpt_real));
    gpt_expert_shard_copy(m, rank, full->params, m->params, true);
    m->adam_step = full->adam_step;
    if (full->adam_m) {
        m->adam_m = xmalloc(sizeof(gpt_real) * m->num_params);
        m->adam_v = xmalloc(sizeof(gpt_real) * m->num_params);
        gpt_expert_shard_copy(m, rank, full->adam_m, m->adam_m, true);
        gpt_expert_shard_copy(m, rank, full->adam_v, m->adam_v, true);
    }
}

#endif
