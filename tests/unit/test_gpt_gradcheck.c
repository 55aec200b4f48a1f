// test_gpt_gradcheck.c - every backward pass of gpt/gpt.h
// against central finite differences, in double precision.
//
// For a layer y = f(x) and a fixed random R, the scalar L = sum(y * R) has
// dL/dx = backward(dout = R). Numerically, dL/dx_i ~ (L(x_i + h) - L(x_i - h)) / 2h.
// The error reported per tensor is max_i |analytic_i - numeric_i| divided
// by max_i |numeric_i|: relative to the gradient's scale, so that tiny
// entries (where any relative error is noise) cannot fail the test alone.
//
// Why the tolerance 1e-6: in double, h = 1e-5 gives a truncation error of
// about h^2 * |f'''| ~ 1e-10 and a round-off error of about 1e-16 * |L| / h
// ~ 1e-11, relative to gradients of order 1e-3..1: a correct backward pass
// lands near 1e-9 or below. A wrong one (a missing term, a wrong index, a
// transposed matrix) is off by 1e-2 or more. 1e-6 sits far from both.
#define GPT_REAL double
#include "../../gpt/gpt.h"
#include "test.h"

static const double H = 1e-5, TOLERANCE = 1e-6;

static void fill_random(double *x, size_t n, rng_t *rng, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(rng) * scale;
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// One tensor to check: its values (perturbed in place) and the analytic gradient.
typedef struct { const char *name; double *x; const double *grad; size_t n; } checked_tensor;

// Max over the tensors of the scaled error described at the top.
static double max_relative_error(double (*loss)(void *), void *ctx, checked_tensor *tensors, int count,
                                 char *worst, size_t worst_len) {
    double worst_err = 0;
    for (int t = 0; t < count; t++) {
        double max_diff = 0, max_num = 1e-30;
        for (size_t i = 0; i < tensors[t].n; i++) {
            double saved = tensors[t].x[i];
            tensors[t].x[i] = saved + H;
            double up = loss(ctx);
            tensors[t].x[i] = saved - H;
            double down = loss(ctx);
            tensors[t].x[i] = saved;
            double numeric = (up - down) / (2 * H);
            double diff = fabs(numeric - tensors[t].grad[i]);
            if (diff > max_diff) max_diff = diff;
            if (fabs(numeric) > max_num) max_num = fabs(numeric);
        }
        double err = max_diff / max_num;
        if (err >= worst_err) {
            worst_err = err;
            snprintf(worst, worst_len, "%s", tensors[t].name);
        }
    }
    return worst_err;
}

static void report(const char *layer, double err, const char *worst) {
    char name[96];
    printf("info: gradcheck %-16s max relative error %.2e (worst tensor: %s; tolerance %.0e)\n", layer, err,
           worst, TOLERANCE);
    snprintf(name, sizeof name, "gpt gradcheck %s", layer);
    EXPECT(name, err < TOLERANCE, "%s: max relative error %.3e >= %.0e in %s", layer, err, TOLERANCE, worst);
}

// ------------------------------------------------------------------ the layers

typedef struct { double *out, *wte, *wpe, *r; uint16_t *tokens; int B, T, C; } encoder_case;

static double encoder_loss(void *p) {
    encoder_case *c = p;
    encoder_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

static void check_encoder(rng_t *rng) {
    enum { B = 2, T = 3, C = 4, V = 5 };
    uint16_t tokens[B * T] = {1, 3, 1, 4, 1, 0}; // token 1 three times: its gradient sums
    double out[B * T * C], wte[V * C], wpe[T * C], r[B * T * C], dwte[V * C] = {0}, dwpe[T * C] = {0};
    fill_random(wte, V * C, rng, 1), fill_random(wpe, T * C, rng, 1), fill_random(r, B * T * C, rng, 1);
    encoder_case c = {out, wte, wpe, r, tokens, B, T, C};
    encoder_backward(dwte, dwpe, r, tokens, B, T, C);
    checked_tensor ts[] = {{"wte", wte, dwte, V * C}, {"wpe", wpe, dwpe, T * C}};
    char worst[64];
    report("embedding", max_relative_error(encoder_loss, &c, ts, 2, worst, sizeof worst), worst);
}

typedef struct { double *out, *mean, *rstd, *inp, *w, *b, *r; int N, C; } layernorm_case;

static double layernorm_loss(void *p) {
    layernorm_case *c = p;
    layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->r, (size_t)c->N * c->C);
}

static void check_layernorm(rng_t *rng) {
    enum { N = 5, C = 7 };
    double out[N * C], mean[N], rstd[N], inp[N * C], w[C], b[C], r[N * C];
    double dinp[N * C] = {0}, dw[C] = {0}, db[C] = {0};
    fill_random(inp, N * C, rng, 2), fill_random(w, C, rng, 1), fill_random(b, C, rng, 1);
    fill_random(r, N * C, rng, 1);
    layernorm_case c = {out, mean, rstd, inp, w, b, r, N, C};
    layernorm_loss(&c);
    layernorm_backward(dinp, dw, db, r, inp, w, mean, rstd, N, C);
    checked_tensor ts[] = {{"input", inp, dinp, N * C}, {"weight", w, dw, C}, {"bias", b, db, C}};
    char worst[64];
    report("layernorm", max_relative_error(layernorm_loss, &c, ts, 3, worst, sizeof worst), worst);
}

typedef struct { double *out, *inp, *w, *b, *r; int N, C, OC; } matmul_case;

static double matmul_loss(void *p) {
    matmul_case *c = p;
    matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->r, (size_t)c->N * c->OC);
}

// Sizes that are not multiples of the kernel's tiles (4 x 32, k blocks of
// 128) so that the edges of the blocked product are exercised too.
static void check_matmul(rng_t *rng) {
    enum { N = 6, C = 131, OC = 37 };
    double *out = xmalloc(sizeof(double) * N * OC), *inp = xmalloc(sizeof(double) * N * C);
    double *w = xmalloc(sizeof(double) * OC * C), b[OC], *r = xmalloc(sizeof(double) * N * OC);
    double *dinp = xcalloc(N * C, sizeof(double)), *dw = xcalloc(OC * C, sizeof(double)), db[OC] = {0};
    fill_random(inp, N * C, rng, 1), fill_random(w, OC * C, rng, 0.1), fill_random(b, OC, rng, 1);
    fill_random(r, N * OC, rng, 1);
    matmul_case c = {out, inp, w, b, r, N, C, OC};
    matmul_backward(dinp, dw, db, r, inp, w, N, C, OC);
    checked_tensor ts[] = {{"input", inp, dinp, N * C}, {"weight", w, dw, OC * C}, {"bias", b, db, OC}};
    char worst[64];
    report("matmul", max_relative_error(matmul_loss, &c, ts, 3, worst, sizeof worst), worst);
    free(out), free(inp), free(w), free(r), free(dinp), free(dw);
}

typedef struct { double *out, *att, *qkv, *r; int B, T, C, NH; } attention_case;

static double attention_loss(void *p) {
    attention_case *c = p;
    attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

static void check_attention(rng_t *rng) {
    enum { B = 2, T = 5, C = 8, NH = 2 };
    double out[B * T * C], att[B * NH * T * T], qkv[B * T * 3 * C], r[B * T * C], dqkv[B * T * 3 * C];
    fill_random(qkv, B * T * 3 * C, rng, 1), fill_random(r, B * T * C, rng, 1);
    attention_case c = {out, att, qkv, r, B, T, C, NH};
    attention_loss(&c);
    attention_backward(dqkv, r, qkv, att, B, T, C, NH);
    checked_tensor ts[] = {{"qkv", qkv, dqkv, B * T * 3 * C}};
    char worst[64];
    report("attention", max_relative_error(attention_loss, &c, ts, 1, worst, sizeof worst), worst);

    // Causality: the output at position t must not change when a later
    // position's query, key or value changes.
    attention_loss(&c);
    double before = out[1 * C + 3]; // batch 0, position 1, channel 3
    qkv[3 * 3 * C + C + 2] += 1.0;  // batch 0, position 3, a key channel of head 0
    attention_loss(&c);
    EXPECT("gpt attention is causal", out[1 * C + 3] == before,
           "output at position 1 changed from %g to %g when position 3 changed", before, out[1 * C + 3]);
}

typedef struct { double *out, *inp, *r; size_t n; } gelu_case;

static double gelu_loss(void *p) {
    gelu_case *c = p;
    gelu_forward(c->out, c->inp, c->n);
    return dot(c->out, c->r, c->n);
}

static void check_gelu(rng_t *rng) {
    enum { N = 40 };
    double out[N], inp[N], r[N], dinp[N];
    fill_random(inp, N, rng, 3), fill_random(r, N, rng, 1);
    gelu_backward(dinp, inp, r, N);
    gelu_case c = {out, inp, r, N};
    checked_tensor ts[] = {{"input", inp, dinp, N}};
    char worst[64];
    report("gelu", max_relative_error(gelu_loss, &c, ts, 1, worst, sizeof worst), worst);
    // The tanh form, computed directly: the sigmoid rewrite must be the same function.
    double max_diff = 0;
    gelu_forward(out, inp, N);
    for (int i = 0; i < N; i++) {
        double x = inp[i], ref = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        if (fabs(out[i] - ref) > max_diff) max_diff = fabs(out[i] - ref);
    }
    EXPECT("gpt gelu equals the tanh formula", max_diff < 1e-12, "max difference %.3e", max_diff);
}

typedef struct { double *logits, *work, *losses; uint16_t *targets; int N, V; } xent_case;

// The forward pass returns the mean as a float; the check needs every
// digit, so it averages the per-row losses (doubles here) itself.
static double xent_loss(void *p) {
    xent_case *c = p;
    memcpy(c->work, c->logits, sizeof(double) * (size_t)c->N * c->V); // forward overwrites with p
    crossentropy_forward(c->losses, c->work, c->targets, c->N, c->V);
    double sum = 0;
    for (int n = 0; n < c->N; n++) sum += c->losses[n];
    return sum / c->N;
}

static void check_crossentropy(rng_t *rng) {
    enum { N = 6, V = 11 };
    double logits[N * V], work[N * V], losses[N], dlogits[N * V];
    uint16_t targets[N] = {0, 10, 3, 3, 7, 1};
    fill_random(logits, N * V, rng, 2);
    xent_case c = {logits, work, losses, targets, N, V};
    xent_loss(&c);
    crossentropy_backward(work, targets, N, V, 1.0 / N);
    memcpy(dlogits, work, sizeof dlogits);
    checked_tensor ts[] = {{"logits", logits, dlogits, N * V}};
    char worst[64];
    report("cross-entropy", max_relative_error(xent_loss, &c, ts, 1, worst, sizeof worst), worst);
}

// ------------------------------------------------------------------ the blocked matrix product

// Against the textbook triple loop, for every transposition and for sizes
// that cross each blocking boundary (MC 64, NC 512, KC 128, tiles 4 x 32).
static void check_gemm(rng_t *rng) {
    enum { M = 70, N = 530, K = 260 };
    double *A = xmalloc(sizeof(double) * M * K), *B = xmalloc(sizeof(double) * K * N);
    double *C = xmalloc(sizeof(double) * M * N), *ref = xmalloc(sizeof(double) * M * N);
    fill_random(A, M * K, rng, 1), fill_random(B, K * N, rng, 1);
    double worst = 0;
    for (int variant = 0; variant < 8; variant++) {
        bool ta = variant & 1, tb = variant & 2;
        double beta = variant & 4 ? 0.5 : 0;
        int lda = ta ? M : K, ldb = tb ? K : N;
        fill_random(C, M * N, rng, 1);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = beta * C[i * N + j];
                for (int k = 0; k < K; k++) s += gemm_at(A, lda, ta, i, k) * gemm_at(B, ldb, tb, k, j);
                ref[i * N + j] = s;
            }
        gemm_parallel(ta, tb, M, N, K, A, lda, B, ldb, beta, C, N);
        for (int i = 0; i < M * N; i++)
            if (fabs(C[i] - ref[i]) > worst) worst = fabs(C[i] - ref[i]);
    }
    EXPECT("gpt gemm matches the triple loop (all transpositions)", worst < 1e-10,
           "max difference %.3e", worst);
    free(A), free(B), free(C), free(ref);
}

// ------------------------------------------------------------------ the whole model

static double model_loss(gpt_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    gpt_forward(m, in, tg, B, T);
    const double *losses = gpt_head_acts_view(m).losses;
    double sum = 0;
    for (int n = 0; n < B * T; n++) sum += losses[n];
    return sum / (B * T);
}

typedef struct { gpt_t *m; const uint16_t *in, *tg; int B, T; } model_case;

static double model_case_loss(void *p) {
    model_case *c = p;
    return model_loss(c->m, c->in, c->tg, c->B, c->T);
}

// Every parameter of a 2-layer model, one finite difference each. The
// initial weights are scaled up from GPT-2's 0.02 so that every path
// (attention, MLP, LayerNorm gains) carries gradients well above round-off.
static void check_model(void) {
    gpt_config cfg = gpt_config_of(11, 6, 2, 2, 8);
    gpt_t m;
    gpt_init(&m, cfg, 5);
    rng_t rng = rng_seed(99);
    for (size_t i = 0; i < m.num_params; i++) m.params[i] += rng_normal(&rng) * 0.3;
    enum { B = 2, T = 6 };
    uint16_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (uint16_t)rng_below(&rng, 11), tg[i] = (uint16_t)rng_below(&rng, 11);
    in[3] = in[7] = 4; // a repeated token
    gpt_zero_grad(&m);
    gpt_forward(&m, in, tg, B, T);
    gpt_backward(&m, 1.0f);
    double *grads = xmalloc(sizeof(double) * m.num_params);
    memcpy(grads, m.grads, sizeof(double) * m.num_params);
    checked_tensor *ts = xmalloc(sizeof(checked_tensor) * (size_t)m.num_tensors);
    for (int t = 0; t < m.num_tensors; t++)
        ts[t] = (checked_tensor){m.tensors[t].name, m.params + m.tensors[t].offset,
                                 grads + m.tensors[t].offset, m.tensors[t].count};
    model_case c = {&m, in, tg, B, T};
    char worst[64];
    report("whole model", max_relative_error(model_case_loss, &c, ts, m.num_tensors, worst, sizeof worst), worst);

    // A context shorter than block_size works the same way.
    model_case shorter = {&m, in, tg, 3, 4};
    gpt_zero_grad(&m);
    gpt_forward(&m, in, tg, 3, 4);
    gpt_backward(&m, 1.0f);
    memcpy(grads, m.grads, sizeof(double) * m.num_params);
    report("model, T < block", max_relative_error(model_case_loss, &shorter, ts, m.num_tensors, worst, sizeof worst),
           worst);
    free(ts), free(grads);
    gpt_free(&m);
}

// A mixture of experts (gpt/moe.h) in every block: 4 experts, top 2, the
// balancing loss on, and a capacity that drops some of the assignments,
// counted over two groups of sequences (the tokens two ranks would hold).
// The loss differentiated is what training minimises: the cross-entropy
// plus coef x the balancing loss of the pass. The routing is a choice,
// not a smooth function: h = 1e-5 moves no token to another expert here
// (a move would show as an error near 1, not 1e-9).
typedef struct { gpt_t *m; const uint16_t *in, *tg; int B, T; } moe_case;

static double moe_case_loss(void *p) {
    moe_case *c = p;
    gpt_moe_stats_reset(c->m);
    double loss = model_loss(c->m, c->in, c->tg, c->B, c->T);
    return loss + c->m->cfg.aux_loss_coef * gpt_moe_aux(c->m);
}

static void check_moe(const char *what, float capacity_factor, int groups, bool expect_drops) {
    gpt_config cfg = gpt_config_of(11, 6, 2, 2, 8);
    cfg.n_expert = 4, cfg.top_k = 2, cfg.aux_loss_coef = 0.5f, cfg.capacity_factor = capacity_factor;
    cfg.capacity_groups = groups;
    gpt_t m;
    gpt_init(&m, cfg, 5);
    m.train_pass = true;
    rng_t rng = rng_seed(99);
    for (size_t i = 0; i < m.num_params; i++) m.params[i] += rng_normal(&rng) * 0.3;
    enum { B = 4, T = 6 };
    uint16_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (uint16_t)rng_below(&rng, 11), tg[i] = (uint16_t)rng_below(&rng, 11);
    gpt_zero_grad(&m);
    gpt_moe_stats_reset(&m);
    gpt_forward(&m, in, tg, B, T);
    double dropped = m.moe->stats.dropped[0] + m.moe->stats.dropped[1];
    gpt_backward(&m, 1.0f);
    double *grads = xmalloc(sizeof(double) * m.num_params);
    memcpy(grads, m.grads, sizeof(double) * m.num_params);
    checked_tensor *ts = xmalloc(sizeof(checked_tensor) * (size_t)m.num_tensors);
    for (int t = 0; t < m.num_tensors; t++)
        ts[t] = (checked_tensor){m.tensors[t].name, m.params + m.tensors[t].offset, grads + m.tensors[t].offset,
                                 m.tensors[t].count};
    moe_case c = {&m, in, tg, B, T};
    char worst[64], name[96];
    snprintf(name, sizeof name, "%s (%.0f of %d assignments dropped)", what, dropped, 2 * B * T * cfg.top_k);
    EXPECT(name, (dropped > 0) == expect_drops, "%.0f assignments dropped", dropped);
    report(name, max_relative_error(moe_case_loss, &c, ts, m.num_tensors, worst, sizeof worst), worst);
    free(ts), free(grads);
    gpt_free(&m);
}

// Two micro-batches with grad_scale 1/2 each must give the gradient of the
// two as one batch: the gradient of a mean is the mean of the gradients.
static void check_accumulation(void) {
    gpt_config cfg = gpt_config_of(13, 8, 1, 2, 8);
    gpt_t m;
    gpt_init(&m, cfg, 3);
    enum { B = 4, T = 8 };
    uint16_t data[B * T + 1];
    rng_t rng = rng_seed(5);
    for (int i = 0; i <= B * T; i++) data[i] = (uint16_t)rng_below(&rng, 13);
    gpt_zero_grad(&m);
    gpt_forward(&m, data, data + 1, B, T);
    gpt_backward(&m, 1.0f);
    double *whole = xmalloc(sizeof(double) * m.num_params);
    memcpy(whole, m.grads, sizeof(double) * m.num_params);
    gpt_zero_grad(&m);
    for (int half = 0; half < 2; half++) {
        int offset = half * (B / 2) * T;
        gpt_forward(&m, data + offset, data + offset + 1, B / 2, T);
        gpt_backward(&m, 0.5f);
    }
    double max_diff = 0, max_g = 1e-30;
    for (size_t i = 0; i < m.num_params; i++) {
        if (fabs(whole[i] - m.grads[i]) > max_diff) max_diff = fabs(whole[i] - m.grads[i]);
        if (fabs(whole[i]) > max_g) max_g = fabs(whole[i]);
    }
    EXPECT("gpt gradient accumulation equals one big batch", max_diff / max_g < 1e-12,
           "relative difference %.3e", max_diff / max_g);
    free(whole);
    gpt_free(&m);
}

int main(void) {
    rng_t rng = rng_seed(2024);
    check_gemm(&rng);
    check_encoder(&rng);
    check_layernorm(&rng);
    check_matmul(&rng);
    check_attention(&rng);
    check_gelu(&rng);
    check_crossentropy(&rng);
    check_model();
    check_moe("mixture of experts, dropless", 0, 1, false);
    check_moe("mixture of experts, capacity 1 over 2 groups", 1.0f, 2, true);
    check_accumulation();
    return test_failures ? 1 : 0;
}
