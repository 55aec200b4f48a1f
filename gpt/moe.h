// moe.h - a mixture of experts in place of a block's MLP, on the CPU
// (chapter 13), forward and backward; included by gpt.h, which calls it
// where the dense MLP would run (gpt_block_forward, gpt_block_backward).
//
// With --n_expert E --moe_top_k K each block has E expert MLPs (the
// dense MLP's shapes, E times: gpt_layout.h stacks them in mlp.experts.*)
// and a router, a C -> E linear layer without bias. For each token x (the
// output of ln_2, n of the N positions):
//   1. p = softmax(x Wr^T)                                   the router
//   2. the K largest p_e (ties: the lower e), their gates
//      g_k = p_e(k) / sum_j p_e(j)                           renormalised: they add up to 1
//   3. y = sum_k g_k expert_e(k)(x),  expert(x) = c_proj(gelu(c_fc(x)))
// and the block adds y to the residual stream as the MLP's output was.
//
// Capacity (GShard, Switch Transformer; --capacity_factor f, 0: none). An
// expert takes at most ceil(f * n K / E) of the n tokens of a group: f = 1
// is its fair share. The assignments are served first choices first, then
// second choices, each in token order; those past an expert's capacity are
// DROPPED: counted, they add nothing to y, and the token passes through
// the residual stream alone (y is only the sum of its kept experts).
// A group is the tokens one rank routes: a rank's micro-batch. One process
// that stands for G ranks with their total batch counts capacity over G
// groups (cfg.capacity_groups): sequence j of its batch is in group j mod
// G, which is what the DistributedSampler gives rank j mod G (common/
// sampler.h: rank r takes positions r, r + W, ...). So one process drops
// the tokens the ranks drop. Capacity bounds training only: evaluation and
// sampling route every token (m->train_pass false).
//
// The load-balancing loss (Switch Transformer, --aux_loss_coef a): for each
// group, a * E * sum_e f_e P_e, f_e the fraction of the group's K n
// assignments that chose expert e (before drops), P_e the mean of p_e over
// the group. It is smallest when both are uniform (1/E each); f is counted,
// not differentiated, so its gradient flows through P only: d/dp_{n,e} =
// a E f_e / n. Summed over the layers, averaged over the groups; it trains
// the router and is not part of the printed loss (gpt_moe_aux).
//
// Expert parallelism. A model whose cfg.ep > 1 holds E/ep experts of each
// block (gpt_init_expert_shard): experts r E/ep ... of rank r of the ep
// group. Its tokens then travel: the layer counts the rows it sends to
// each expert, the ranks exchange these counts (ep_all_to_all: every rank
// learns how many rows it will receive, and for which of its experts),
// send the rows (ep_all_to_all_v: variable counts), each rank runs its
// experts on what it received, and the outputs go back the same way
// (counts swapped). The backward pass sends the outputs' gradients to the
// experts and the inputs' gradients back: the same two exchanges, the same
// counts. Without callbacks (one process, ep 1) the exchanges are copies.
#ifndef GPT_MOE_H
#define GPT_MOE_H

#include <time.h>

// One layer's state between its forward and its backward pass.
typedef struct {
    int N, G;                 // buffers' room: tokens, capacity groups
    bool train;               // the last forward pass was a training pass (m->train_pass)
    int groups;               // its capacity groups
    gpt_real *probs;          // (N, E) the router's softmax
    int *choice;              // (N, K) the chosen experts
    gpt_real *gate;           // (N, K) their renormalised gates
    int *slot;                // (N, K) the row it was sent as, -1: dropped
    gpt_real *aux_scale;      // (G, E) d(aux loss)/d p_{n,e} for a token of group g
    int S, R;                 // rows sent, rows received
    int R_most;               // the most rows a forward pass received (its buffers' high-water mark)
    int *sent;                // (S) which assignment (n K + k) row s is
    int *count_out, *count_in; // (E) rows sent to each expert; (ep, E/ep) rows received from rank p for my expert e
    size_t *send_counts, *recv_counts; // (ep) numbers to and from each rank of the ep group
    gpt_real *send_x, *back_y; // (S, C) the rows sent, the outputs returned
    gpt_real *recv_x, *recv_y; // (R, C) the rows received (rank by rank), the outputs to return
    int *order;               // (R) expert-major position of received row i
    gpt_real *xe, *h, *hg, *ye; // (R, C), (R, 4C), (R, 4C), (R, C): the experts' rows, expert by expert
} gpt_moe_layer;

// What a run routed, summed since gpt_moe_stats_reset: for the tables of
// chapter 13 (routing, traffic, time).
typedef struct {
    double *routed;           // (L, E) assignments per expert, before drops (training passes)
    double *dropped;          // (L) assignments dropped
    double assignments;       // all assignments, every layer
    double aux_sum;           // the balancing loss of each training pass, summed
    int passes;               // training passes counted
    double sent[2];           // numbers this rank passed to the all-to-alls: forward, backward
    double away[2];           // of them, those for other ranks (what crossed the wire; the planner's ep column)
    double exchanges[2];      // all-to-all calls: forward, backward
    double seconds[4];        // routing, dispatch, experts, combine (forward and backward)
} gpt_moe_stats;

typedef struct gpt_moe {
    gpt_moe_layer *layer;     // n_layer
    gpt_moe_stats stats;
} gpt_moe;

enum { MOE_ROUTING, MOE_DISPATCH, MOE_EXPERTS, MOE_COMBINE };

static inline double moe_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Experts held here, and the first of them.
static inline int gpt_moe_local(const gpt_config *c) { return c->n_expert / gpt_ep_ways(c->ep); }

static inline gpt_moe *gpt_moe_state(gpt_t *m) {
    if (!m->moe) {
        m->moe = xcalloc(1, sizeof(gpt_moe));
        m->moe->layer = xcalloc((size_t)m->cfg.n_layer, sizeof(gpt_moe_layer));
        m->moe->stats.routed = xcalloc((size_t)m->cfg.n_layer * (size_t)m->cfg.n_expert, sizeof(double));
        m->moe->stats.dropped = xcalloc((size_t)m->cfg.n_layer, sizeof(double));
    }
    return m->moe;
}

static inline void gpt_moe_stats_reset(gpt_t *m) {
    gpt_moe_stats *s = &gpt_moe_state(m)->stats;
    memset(s->routed, 0, sizeof(double) * (size_t)m->cfg.n_layer * (size_t)m->cfg.n_expert);
    memset(s->dropped, 0, sizeof(double) * (size_t)m->cfg.n_layer);
    s->assignments = s->aux_sum = 0, s->passes = 0;
    memset(s->sent, 0, sizeof s->sent), memset(s->away, 0, sizeof s->away), memset(s->exchanges, 0, sizeof s->exchanges);
    memset(s->seconds, 0, sizeof s->seconds);
}

// One micro-batch's layers (a pipeline stage keeps one set per activation
// slot: gpt_use_slot).
static inline void gpt_moe_free_layers(const gpt_config *c, gpt_moe_layer *layers) {
    if (!layers) return;
    for (int l = 0; l < c->n_layer; l++) {
        gpt_moe_layer *y = &layers[l];
        free(y->probs), free(y->choice), free(y->gate), free(y->slot), free(y->aux_scale), free(y->sent);
        free(y->count_out), free(y->count_in), free(y->send_counts), free(y->recv_counts);
        free(y->send_x), free(y->back_y), free(y->recv_x), free(y->recv_y), free(y->order);
        free(y->xe), free(y->h), free(y->hg), free(y->ye);
    }
    free(layers);
}

static inline void gpt_moe_free(gpt_t *m) {
    if (!m->moe) return;
    gpt_moe_free_layers(&m->cfg, m->moe->layer);
    free(m->moe->stats.routed), free(m->moe->stats.dropped), free(m->moe);
    m->moe = NULL;
}

// *p resized to n elements of `size` bytes (contents not kept).
static inline void *moe_buffer(void *p, size_t n, size_t size) {
    free(p);
    return xmalloc(n ? n * size : 1);
}

// The exchange of rows over the ep group: `rows_out[p]` rows of C numbers
// to rank p, `rows_in[p]` from it (counts in numbers, as pg_all_to_all_v
// takes them). One process: its own block, copied.
static inline void moe_exchange(gpt_t *m, const gpt_real *send, const size_t *out, gpt_real *recv, const size_t *in,
                                int pass, bool count) {
    int P = gpt_ep_ways(m->cfg.ep);
    gpt_moe_stats *s = &m->moe->stats;
    for (int p = 0; count && p < P; p++) s->sent[pass] += (double)out[p];
    for (int p = 0; count && p < P; p++) s->away[pass] += p != m->ep_rank ? (double)out[p] : 0; // what leaves the rank
    s->exchanges[pass] += count;
    if (P == 1) {
        if (out[0] != in[0]) die("moe: %zu numbers sent to myself, %zu expected", out[0], in[0]);
        memcpy(recv, send, sizeof(gpt_real) * out[0]);
        return;
    }
    if (!m->ep_all_to_all_v)
        die("an expert-parallel model (ep %d) needs ep_all_to_all_v, the exchange over its ranks", P);
    m->ep_all_to_all_v(m->ep_user, send, out, recv, in);
}

// The layer's forward pass with its residual: out (N, C) = res + y for the
// N = B T tokens x (ln_2's output, N x C) and the residual stream res.
// w: the block's router and (this rank's) experts.
static inline void gpt_moe_forward(gpt_t *m, int layer, const gpt_block *w, const gpt_real *x, const gpt_real *res,
                                   gpt_real *out) {
    gpt_moe *st = gpt_moe_state(m);
    gpt_moe_layer *y = &st->layer[layer];
    const gpt_config *c = &m->cfg;
    int N = m->B * m->T, C = c->n_embd, E = c->n_expert, K = c->top_k, P = gpt_ep_ways(c->ep), El = gpt_moe_local(c);
    int H = 4 * C;
    int G = m->train_pass && c->capacity_groups > 1 ? c->capacity_groups : 1;
    if (G > m->B) die("moe: %d capacity groups for a batch of %d sequences", G, m->B);
    y->train = m->train_pass, y->groups = G;
    double t0 = moe_now(), unused[4], *sec = m->train_pass ? st->stats.seconds : unused; // training passes' time
    if (N > y->N || G > y->G) {
        y->probs = moe_buffer(y->probs, (size_t)N * E, sizeof(gpt_real));
        y->choice = moe_buffer(y->choice, (size_t)N * K, sizeof(int));
        y->gate = moe_buffer(y->gate, (size_t)N * K, sizeof(gpt_real));
        y->slot = moe_buffer(y->slot, (size_t)N * K, sizeof(int));
        y->sent = moe_buffer(y->sent, (size_t)N * K, sizeof(int));
        y->send_x = moe_buffer(y->send_x, (size_t)N * K * C, sizeof(gpt_real));
        y->back_y = moe_buffer(y->back_y, (size_t)N * K * C, sizeof(gpt_real));
        y->aux_scale = moe_buffer(y->aux_scale, (size_t)(G > y->G ? G : y->G) * E, sizeof(gpt_real));
        if (!y->count_out) {
            y->count_out = xcalloc((size_t)E, sizeof(int)), y->count_in = xcalloc((size_t)E, sizeof(int));
            y->send_counts = xcalloc((size_t)P, sizeof(size_t)), y->recv_counts = xcalloc((size_t)P, sizeof(size_t));
        }
        y->N = N > y->N ? N : y->N, y->G = G > y->G ? G : y->G;
    }

    // 1-2. The router: softmax, then the top K, renormalised.
    matmul_forward(y->probs, x, w->router_w, NULL, N, C, E);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt_real *p = y->probs + (size_t)n * E;
        double mx = p[0], sum = 0;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += exp((double)p[e] - mx);
        for (int e = 0; e < E; e++) p[e] = (gpt_real)(exp((double)p[e] - mx) / sum);
        int *ch = y->choice + (size_t)n * K;
        double kept = 0;
        for (int k = 0; k < K; k++) { // the k-th largest: the largest not chosen yet
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++) taken |= ch[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ch[k] = best, kept += p[best];
        }
        for (int k = 0; k < K; k++) y->gate[(size_t)n * K + k] = (gpt_real)(p[ch[k]] / kept);
    }

    // Capacity, group by group: first choices first, then seconds, ...
    int T = m->T, *served = xcalloc((size_t)G * E, sizeof(int)), *chose = xcalloc((size_t)G * E, sizeof(int));
    int *tokens = xcalloc((size_t)G, sizeof(int));
    for (int n = 0; n < N; n++) tokens[(n / T) % G]++;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int g = (n / T) % G, e = y->choice[(size_t)n * K + k];
            long cap = m->train_pass && c->capacity_factor > 0 ? (long)ceil(c->capacity_factor * tokens[g] * K / E) : N;
            chose[g * E + e]++;
            y->slot[(size_t)n * K + k] = served[g * E + e] < cap ? 0 : -1;
            served[g * E + e] += served[g * E + e] < cap;
        }
    // The balancing loss's gradient, and what the tables count (training passes).
    if (m->train_pass) {
        gpt_moe_stats *s = &st->stats;
        double aux = 0;
        for (int g = 0; g < G; g++) {
            double aux_g = 0;
            for (int e = 0; e < E; e++) {
                double f = (double)chose[g * E + e] / ((double)tokens[g] * K), P_e = 0;
                for (int n = 0; n < N; n++)
                    if ((n / T) % G == g) P_e += y->probs[(size_t)n * E + e];
                aux_g += E * f * P_e / tokens[g];
                y->aux_scale[g * E + e] = (gpt_real)(c->aux_loss_coef * E * f / tokens[g] / G);
                s->routed[(size_t)layer * E + e] += chose[g * E + e];
            }
            aux += aux_g / G;
        }
        for (size_t a = 0; a < (size_t)N * K; a++) s->dropped[layer] += y->slot[a] < 0;
        s->assignments += (double)N * K;
        s->aux_sum += aux;
        if (layer == c->n_layer - 1) s->passes++;
    }
    free(served), free(chose), free(tokens);

    // 3. Dispatch: the kept rows sorted by expert (so by rank), token by token.
    memset(y->count_out, 0, sizeof(int) * (size_t)E);
    for (size_t a = 0; a < (size_t)N * K; a++)
        if (y->slot[a] >= 0) y->count_out[y->choice[a]]++;
    int *start = xcalloc((size_t)E + 1, sizeof(int));
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + y->count_out[e];
    y->S = start[E];
    for (size_t a = 0; a < (size_t)N * K; a++) {
        if (y->slot[a] < 0) continue;
        int s = start[y->choice[a]]++;
        y->slot[a] = s, y->sent[s] = (int)a;
        memcpy(y->send_x + (size_t)s * C, x + a / (size_t)K * C, sizeof(gpt_real) * C);
    }
    free(start);
    sec[MOE_ROUTING] += moe_now() - t0;
    t0 = moe_now();
    // How many rows each rank gets for each of its experts: the counts
    // first (an all-to-all of E/ep numbers per rank), then the rows.
    if (P > 1) {
        if (!m->ep_all_to_all) die("an expert-parallel model (ep %d) needs ep_all_to_all to exchange its counts", P);
        m->ep_all_to_all(m->ep_user, y->count_out, y->count_in, El);
    } else {
        memcpy(y->count_in, y->count_out, sizeof(int) * (size_t)E);
    }
    y->R = 0;
    for (int p = 0; p < P; p++) {
        size_t out = 0, in = 0;
        for (int e = 0; e < El; e++) out += (size_t)y->count_out[p * El + e], in += (size_t)y->count_in[p * El + e];
        y->send_counts[p] = out * (size_t)C, y->recv_counts[p] = in * (size_t)C;
        y->R += (int)in;
    }
    size_t R = (size_t)y->R;
    y->R_most = y->R > y->R_most ? y->R : y->R_most;
    y->recv_x = moe_buffer(y->recv_x, R * C, sizeof(gpt_real));
    y->recv_y = moe_buffer(y->recv_y, R * C, sizeof(gpt_real));
    y->xe = moe_buffer(y->xe, R * C, sizeof(gpt_real)), y->ye = moe_buffer(y->ye, R * C, sizeof(gpt_real));
    y->h = moe_buffer(y->h, R * H, sizeof(gpt_real)), y->hg = moe_buffer(y->hg, R * H, sizeof(gpt_real));
    y->order = moe_buffer(y->order, R, sizeof(int));
    moe_exchange(m, y->send_x, y->send_counts, y->recv_x, y->recv_counts, 0, y->train);
    sec[MOE_DISPATCH] += moe_now() - t0;
    t0 = moe_now();

    // 4. The experts: the rows arrive rank by rank (and by expert within
    // each); each expert takes its rows from every rank, in rank order.
    int *at = xcalloc((size_t)El + 1, sizeof(int)), i = 0;
    for (int e = 0; e < El; e++)
        for (int p = 0; p < P; p++) at[e + 1] += y->count_in[p * El + e];
    for (int e = 0; e < El; e++) at[e + 1] += at[e];
    int *fill = xmalloc(sizeof(int) * (size_t)El);
    memcpy(fill, at, sizeof(int) * (size_t)El);
    for (int p = 0; p < P; p++)
        for (int e = 0; e < El; e++)
            for (int r = 0; r < y->count_in[p * El + e]; r++, i++) {
                y->order[i] = fill[e]++;
                memcpy(y->xe + (size_t)y->order[i] * C, y->recv_x + (size_t)i * C, sizeof(gpt_real) * C);
            }
    for (int e = 0; e < El; e++) {
        int rows = at[e + 1] - at[e];
        if (!rows) continue;
        size_t r0 = (size_t)at[e];
        matmul_forward(y->h + r0 * H, y->xe + r0 * C, w->fc_w + (size_t)e * H * C, w->fc_b + (size_t)e * H, rows, C, H);
        gelu_forward(y->hg + r0 * H, y->h + r0 * H, (size_t)rows * H);
        matmul_forward(y->ye + r0 * C, y->hg + r0 * H, w->fcproj_w + (size_t)e * C * H, w->fcproj_b + (size_t)e * C,
                       rows, H, C);
    }
    for (int r = 0; r < y->R; r++)
        memcpy(y->recv_y + (size_t)r * C, y->ye + (size_t)y->order[r] * C, sizeof(gpt_real) * C);
    free(at), free(fill);
    sec[MOE_EXPERTS] += moe_now() - t0;
    t0 = moe_now();
    // The outputs go back: what came from rank p returns to it.
    moe_exchange(m, y->recv_y, y->recv_counts, y->back_y, y->send_counts, 0, y->train);
    sec[MOE_DISPATCH] += moe_now() - t0;
    t0 = moe_now();

    // 5. Combine: each token's residual stream plus its kept experts,
    // weighted by their gates, in the order of its choices. A dropped
    // choice adds nothing: a token whose every choice was dropped leaves
    // the layer as it came, on the residual stream alone.
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt_real *o = out + (size_t)n * C;
        memcpy(o, res + (size_t)n * C, sizeof(gpt_real) * C); // the residual: all a dropped token keeps
        for (int k = 0; k < K; k++) {
            int s = y->slot[(size_t)n * K + k];
            if (s < 0) continue;
            gpt_real g = y->gate[(size_t)n * K + k];
            const gpt_real *r = y->back_y + (size_t)s * C;
            for (int ch = 0; ch < C; ch++) o[ch] += g * r[ch];
        }
    }
    sec[MOE_COMBINE] += moe_now() - t0;
}

// The layer's backward pass: dout (N, C) is d(loss)/d(y); dx (N, C) gets
// d(loss)/d(x), overwritten; dw the block's gradients (router, experts).
// grad_scale scales the balancing loss's gradient as the cross-entropy's.
static inline void gpt_moe_backward(gpt_t *m, int layer, const gpt_block *w, const gpt_block *dw, const gpt_real *x,
                                    const gpt_real *dout, gpt_real *dx, gpt_real grad_scale) {
    gpt_moe *st = gpt_moe_state(m);
    gpt_moe_layer *y = &st->layer[layer];
    const gpt_config *c = &m->cfg;
    int N = m->B * m->T, C = c->n_embd, E = c->n_expert, K = c->top_k, El = gpt_moe_local(c), H = 4 * C;
    int S = y->S, R = y->R;
    double t0 = moe_now();
    // Combine's backward: row s carried g_k expert(x): its gradient is g_k
    // dout, and the gate's is <dout, expert(x)>.
    gpt_real *dsend = xmalloc(sizeof(gpt_real) * ((size_t)S * C + 1));
    gpt_real *dgate = xcalloc((size_t)N * K, sizeof(gpt_real));
#pragma omp parallel for
    for (int s = 0; s < S; s++) {
        int a = y->sent[s], n = a / K;
        const gpt_real *d = dout + (size_t)n * C, *r = y->back_y + (size_t)s * C;
        gpt_real g = y->gate[a], dot = 0;
        for (int ch = 0; ch < C; ch++) dsend[(size_t)s * C + ch] = g * d[ch], dot += d[ch] * r[ch];
        dgate[a] = dot;
    }
    st->stats.seconds[MOE_COMBINE] += moe_now() - t0;
    t0 = moe_now();
    gpt_real *drecv = xmalloc(sizeof(gpt_real) * ((size_t)R * C + 1));
    moe_exchange(m, dsend, y->send_counts, drecv, y->recv_counts, 1, true);
    st->stats.seconds[MOE_DISPATCH] += moe_now() - t0;
    t0 = moe_now();

    // The experts' backward passes, expert by expert, on the rows they had.
    gpt_real *dye = xmalloc(sizeof(gpt_real) * ((size_t)R * C + 1));
    gpt_real *dh = xmalloc(sizeof(gpt_real) * ((size_t)R * H + 1));
    gpt_real *dxe = xmalloc(sizeof(gpt_real) * ((size_t)R * C + 1));
    for (int r = 0; r < R; r++) memcpy(dye + (size_t)y->order[r] * C, drecv + (size_t)r * C, sizeof(gpt_real) * C);
    int P = gpt_ep_ways(c->ep), at = 0;
    for (int e = 0; e < El; e++) {
        int rows = 0;
        for (int p = 0; p < P; p++) rows += y->count_in[p * El + e];
        if (rows) {
            size_t r0 = (size_t)at;
            matmul_backward(dh + r0 * H, dw->fcproj_w + (size_t)e * C * H, dw->fcproj_b + (size_t)e * C, dye + r0 * C,
                            y->hg + r0 * H, w->fcproj_w + (size_t)e * C * H, rows, H, C);
            gelu_backward(dh + r0 * H, y->h + r0 * H, dh + r0 * H, (size_t)rows * H);
            matmul_backward(dxe + r0 * C, dw->fc_w + (size_t)e * H * C, dw->fc_b + (size_t)e * H, dh + r0 * H,
                            y->xe + r0 * C, w->fc_w + (size_t)e * H * C, rows, C, H);
        }
        at += rows;
    }
    for (int r = 0; r < R; r++) memcpy(drecv + (size_t)r * C, dxe + (size_t)y->order[r] * C, sizeof(gpt_real) * C);
    free(dye), free(dh), free(dxe);
    st->stats.seconds[MOE_EXPERTS] += moe_now() - t0;
    t0 = moe_now();
    moe_exchange(m, drecv, y->recv_counts, dsend, y->send_counts, 1, true); // the inputs' gradients come back
    st->stats.seconds[MOE_DISPATCH] += moe_now() - t0;
    t0 = moe_now();

    // Each token's input gradient: its kept rows', in the order of its choices.
    int G = y->groups, T = m->T;
    gpt_real *dlogits = xmalloc(sizeof(gpt_real) * (size_t)N * E);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt_real *o = dx + (size_t)n * C;
        memset(o, 0, sizeof(gpt_real) * C);
        for (int k = 0; k < K; k++) {
            int s = y->slot[(size_t)n * K + k];
            if (s < 0) continue;
            for (int ch = 0; ch < C; ch++) o[ch] += dsend[(size_t)s * C + ch];
        }
        // The router. g_k = p_k / S (S: the sum of the K kept p) gives
        // dp_k = (dg_k - sum_j dg_j g_j) / S; the balancing loss adds to
        // every dp_e; then the softmax: dlogit_e = p_e (dp_e - sum_j p_j dp_j).
        const gpt_real *p = y->probs + (size_t)n * E, *g = y->gate + (size_t)n * K, *dg = dgate + (size_t)n * K;
        const int *ch = y->choice + (size_t)n * K;
        gpt_real *dl = dlogits + (size_t)n * E, mix = 0, sum = 0, dot = 0;
        for (int k = 0; k < K; k++) mix += dg[k] * g[k], sum += p[ch[k]];
        for (int e = 0; e < E; e++)
            dl[e] = y->train ? grad_scale * y->aux_scale[((n / T) % G) * E + e] : 0;
        for (int k = 0; k < K; k++) dl[ch[k]] += (dg[k] - mix) / sum;
        for (int e = 0; e < E; e++) dot += p[e] * dl[e];
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - dot);
    }
    gpt_real *drouter = xmalloc(sizeof(gpt_real) * (size_t)N * C);
    matmul_backward(drouter, dw->router_w, NULL, dlogits, x, w->router_w, N, C, E);
#pragma omp parallel for
    for (size_t i = 0; i < (size_t)N * C; i++) dx[i] += drouter[i];
    free(drouter), free(dlogits), free(dsend), free(drecv), free(dgate);
    st->stats.seconds[MOE_ROUTING] += moe_now() - t0;
}

// Bytes the layers' buffers hold now: those sized by the tokens (room
// for the largest batch so far) and those sized by the rows the last
// forward pass received (`most`: by the most rows a pass received, the
// high-water mark the planner predicts). `layer`: one micro-batch's
// n_layer layers (a pipeline stage keeps a set per activation slot).
static inline size_t gpt_moe_layers_bytes(const gpt_config *c, const gpt_moe_layer *layer, bool most) {
    size_t bytes = 0, E = (size_t)c->n_expert, K = (size_t)c->top_k, C = (size_t)c->n_embd;
    size_t r = sizeof(gpt_real);
    for (int l = 0; layer && l < c->n_layer; l++) {
        const gpt_moe_layer *y = &layer[l];
        size_t N = (size_t)y->N, R = (size_t)(most ? y->R_most : y->R);
        bytes += N * E * r + N * K * (3 * sizeof(int) + r + 2 * C * r) + (size_t)y->G * E * r;
        bytes += R * (C * 4 + 8 * C) * r + R * sizeof(int);
    }
    return bytes;
}

static inline size_t gpt_moe_bytes(const gpt_t *m) { return m->moe ? gpt_moe_layers_bytes(&m->cfg, m->moe->layer, false) : 0; }

// The balancing loss of the training passes since the last reset, per pass
// (summed over the layers): 1 per layer when the experts are used evenly.
static inline double gpt_moe_aux(const gpt_t *m) {
    return m->moe && m->moe->stats.passes ? m->moe->stats.aux_sum / m->moe->stats.passes : 0;
}

#endif
