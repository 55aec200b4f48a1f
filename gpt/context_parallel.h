// context_parallel.h - context parallelism (chapter 12) in the CPU model:
// each sequence split over the ranks of a cp group, attention computed
// across them.
//
// Every layer but attention works token by token: embeddings, LayerNorm,
// the MLP, the loss. So a rank that holds only some tokens of a sequence
// computes them exactly as one process would - if it knows their GLOBAL
// positions (the position embedding, and the causal mask: token p sees
// keys 0..p). Attention is the one layer where tokens meet, and there the
// ranks must exchange something. Two ways:
//   1. ring (Liu, Zaharia, Abbeel, 2023): each rank keeps its queries and
//      passes its keys and values around the ring; at every step it
//      attends its queries to the visiting block, which gives a PARTIAL
//      result - a softmax-weighted average over that block's keys only -
//      and merges it into the running one by their log-sum-exps
//      (cp_merge: the online softmax of flash attention). The backward
//      pass sends the blocks around again, with the gradients of their
//      keys and values, which end at their owners.
//   2. ulysses (DeepSpeed-Ulysses): an all-to-all turns this rank's tokens
//      of every head into every token of 1/cp of the heads; each rank runs
//      ordinary causal attention for its heads over the whole sequence; an
//      all-to-all turns the result back. Four all-to-alls per layer.
// Which tokens a rank holds (cp_segments): with --cp_balance none chunk r
// of cp, so under the causal mask rank 0's queries see one chunk of keys
// and the last rank's all of them; with zigzag (Megatron-LM, Llama 3)
// chunks r and 2cp-1-r of 2cp, so every rank does the same work.
//
// This file is included by gpt.h after its layers (section 4): it uses
// gpt_real, gpt_exp, gemm_serial, attention_forward and attention_backward.
// gpt.h calls it at five places (the tokens a rank keeps, the position
// embedding, attention forward and backward, the loss and the logits).
// The communication comes from outside through cp_comm, as tensor
// parallelism's all-reduce does (gpt/model.h builds both over a process
// group). The CPU model keeps the attention probabilities of its queries
// (one process keeps B x NH x T x T of them; a rank of cp keeps 1/cp: its
// rows, or its heads), as gpt.h does without cp; the GPU model
// (gpt_cuda_cp.cuh: the same ideas in kernels) keeps one log-sum-exp per
// row instead, as its flash attention does.
#ifndef GPT_CONTEXT_PARALLEL_H
#define GPT_CONTEXT_PARALLEL_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef enum { CP_RING, CP_ULYSSES } cp_kind;
typedef enum { CP_ZIGZAG, CP_CONTIGUOUS } cp_balance;

// What the model asks of the cp group (model.h provides it).
typedef struct {
    void *user;
    // Starts sending send_count numbers to the next rank of the ring and
    // receiving recv_count from the previous one; finish waits for both.
    void *(*ring_start)(void *user, const gpt_real *send, size_t send_count, gpt_real *recv, size_t recv_count);
    void (*ring_finish)(void *user, void *pending);
    // Block p of send goes to rank p, block p of recv comes from rank p.
    void (*all_to_all_v)(void *user, const gpt_real *send, const size_t *send_counts, gpt_real *recv,
                         const size_t *recv_counts);
    void (*sum)(void *user, double *values, int count);                    // over the group, in place
    void (*broadcast)(void *user, gpt_real *buf, size_t count, int root);
} cp_comm;

// Global positions [first, first + count) of one sequence.
typedef struct {
    int first, count;
} cp_segment;

enum { CP_SCRATCH = 6 };

typedef struct gpt_cp {
    int ways, rank, n_head;
    cp_kind kind;
    cp_balance balance;
    cp_comm comm;
    int whole;             // tokens per sequence in the last forward pass (its T)
    int count;             // this rank's tokens of each sequence
    int nseg;              // in 1 or 2 segments
    cp_segment seg[2];
    int *pos;              // the global position of each of them
    uint16_t *inputs, *targets; // this rank's tokens of the batch, B x count
    size_t tokens_capacity;
    size_t att_held;       // the most attention probabilities a layer kept (numbers)
    gpt_real *row;         // one row of logits, broadcast from its owner (gpt_logits)
    gpt_real *scratch[CP_SCRATCH];
    size_t scratch_capacity[CP_SCRATCH];
    // What attention did, added up since the model was made (chapter 12
    // reads differences): numbers sent to other ranks in the forward and
    // backward passes, query-key pairs whose scores the forward pass
    // computed (a segment pair is computed whole, its masked part too), and
    // CPU seconds spent in attention's arithmetic, both passes.
    double sent_forward, sent_backward, pairs, seconds;
} gpt_cp;

// ---------------------------------------------------------------- which tokens a rank holds

// Rank r's segments of a sequence of T tokens split over n ranks. zigzag:
// of 2n chunks, chunks r and 2n-1-r (chunk i is [i T / 2n, (i+1) T / 2n),
// so a T that 2n does not divide still splits, unevenly); none: chunk r of n.
static inline int cp_segments(int T, int n, int r, cp_balance balance, cp_segment seg[2]) {
    if (balance == CP_CONTIGUOUS) {
        int a = (int)((long)r * T / n), b = (int)((long)(r + 1) * T / n);
        seg[0] = (cp_segment){a, b - a};
        return 1;
    }
    int chunks = 2 * n, last = chunks - 1 - r;
    int a = (int)((long)r * T / chunks), b = (int)((long)(r + 1) * T / chunks);
    int c = (int)((long)last * T / chunks), d = (int)((long)(last + 1) * T / chunks);
    seg[0] = (cp_segment){a, b - a};
    seg[1] = (cp_segment){c, d - c};
    return 2;
}

static inline int cp_count_of(const gpt_cp *cp, int r) {
    cp_segment seg[2];
    int n = cp_segments(cp->whole, cp->ways, r, cp->balance, seg), total = 0;
    for (int i = 0; i < n; i++) total += seg[i].count;
    return total;
}

static inline size_t cp_att_size(const gpt_cp *cp, size_t B, size_t NH);

static inline gpt_cp *cp_create(int ways, int rank, int n_head, cp_kind kind, cp_balance balance, cp_comm comm) {
    gpt_cp *cp = xcalloc(1, sizeof *cp);
    cp->ways = ways, cp->rank = rank, cp->n_head = n_head, cp->kind = kind, cp->balance = balance, cp->comm = comm;
    return cp;
}

static inline void cp_free(gpt_cp *cp) {
    if (!cp) return;
    free(cp->pos), free(cp->inputs), free(cp->targets), free(cp->row);
    for (int k = 0; k < CP_SCRATCH; k++) free(cp->scratch[k]);
    free(cp);
}

// Scratch buffer k, at least n numbers (grows, never shrinks).
static inline gpt_real *cp_scratch(gpt_cp *cp, int k, size_t n) {
    if (n > cp->scratch_capacity[k]) {
        free(cp->scratch[k]);
        cp->scratch[k] = xmalloc(sizeof(gpt_real) * n);
        cp->scratch_capacity[k] = n;
    }
    return cp->scratch[k];
}

// Bytes of buffers the cp machinery holds besides the model's activations:
// the key/value blocks in flight, the all-to-alls' buffers, this rank's tokens.
static inline size_t cp_buffer_bytes(const gpt_cp *cp) {
    size_t bytes = cp->tokens_capacity * 2 * sizeof(uint16_t);
    for (int k = 0; k < CP_SCRATCH; k++) bytes += cp->scratch_capacity[k] * sizeof(gpt_real);
    return bytes;
}

// The start of a forward pass over B sequences of T tokens: this rank keeps
// its tokens of each (and their targets), at their global positions.
// Returns how many per sequence.
static inline int cp_take_tokens(gpt_cp *cp, const uint16_t *inputs, const uint16_t *targets, int B, int T) {
    cp->whole = T;
    cp->nseg = cp_segments(T, cp->ways, cp->rank, cp->balance, cp->seg);
    cp->count = cp_count_of(cp, cp->rank);
    size_t att = cp_att_size(cp, (size_t)B, (size_t)cp->n_head);
    cp->att_held = att > cp->att_held ? att : cp->att_held;
    size_t n = (size_t)B * (size_t)(cp->count ? cp->count : 1);
    if (n > cp->tokens_capacity) {
        free(cp->inputs), free(cp->targets);
        cp->inputs = xmalloc(sizeof(uint16_t) * n), cp->targets = xmalloc(sizeof(uint16_t) * n);
        cp->tokens_capacity = n;
    }
    free(cp->pos);
    cp->pos = xmalloc(sizeof(int) * (size_t)(cp->count ? cp->count : 1));
    for (int s = 0, t = 0; s < cp->nseg; s++)
        for (int i = 0; i < cp->seg[s].count; i++) cp->pos[t++] = cp->seg[s].first + i;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < cp->count; t++) {
            size_t from = (size_t)b * T + (size_t)cp->pos[t], to = (size_t)b * cp->count + (size_t)t;
            if (inputs) cp->inputs[to] = inputs[from]; // a pipeline's later stages take none (the finale)
            if (targets) cp->targets[to] = targets[from];
        }
    return cp->count;
}

// The loss of the whole batch: every rank has the mean over its own
// tokens; the group adds up sums and counts (a rank may hold none).
static inline float cp_mean_loss(gpt_cp *cp, float mine, size_t tokens) {
    double v[2] = {tokens ? (double)mine * (double)tokens : 0.0, (double)tokens};
    cp->comm.sum(cp->comm.user, v, 2);
    return (float)(v[0] / v[1]);
}

// The number of tokens each rank's loss is a mean over, as the backward
// pass divides by it: B x T / cp, the same on every rank when cp divides
// T; so that the average of the ranks' gradients over the group is one
// process's gradient of the mean loss.
static inline double cp_tokens_per_rank(const gpt_cp *cp, int B) { return (double)B * cp->whole / cp->ways; }

// The logits at global position t of sequence b, from the rank that holds
// it, on every rank (sampling). `logits`: this rank's (B x count x V).
static inline const gpt_real *cp_logits(gpt_cp *cp, const gpt_real *logits, int b, int t, int V) {
    if (!cp->row) cp->row = xcalloc((size_t)V, sizeof(gpt_real));
    int owner = -1, local = -1;
    for (int r = 0; r < cp->ways && owner < 0; r++) {
        cp_segment seg[2];
        int n = cp_segments(cp->whole, cp->ways, r, cp->balance, seg), before = 0;
        for (int s = 0; s < n; s++) {
            if (t >= seg[s].first && t < seg[s].first + seg[s].count) owner = r, local = before + t - seg[s].first;
            before += seg[s].count;
        }
    }
    if (owner == cp->rank)
        memcpy(cp->row, logits + ((size_t)b * cp->count + (size_t)local) * V, sizeof(gpt_real) * (size_t)V);
    cp->comm.broadcast(cp->comm.user, cp->row, (size_t)V, owner);
    return cp->row;
}

static inline double cp_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Attention keeps, per layer, the probabilities of this rank's part: its
// queries' rows against every key (ring), or every query and key of its
// heads (ulysses). Both are 1/cp of one process's B x NH x T x T.
static inline size_t cp_att_size(const gpt_cp *cp, size_t B, size_t NH) {
    size_t T = (size_t)cp->whole;
    if (cp->kind == CP_ULYSSES) return B * (NH / (size_t)cp->ways) * T * T;
    return B * NH * (size_t)cp->count * T;
}

// ---------------------------------------------------------------- the merge

// Two softmax-weighted averages of values over DISJOINT sets of keys, o
// over set A (with lse = log of the sum of exp(score) over A) and o_b over
// set B (lse_b), merged into the average over A and B together:
//     lse' = log(e^lse + e^lse_b),   o' = e^(lse - lse') o + e^(lse_b - lse') o_b
// Each weight is the share of its set in the union's softmax sum: adding
// o and o_b, or averaging them, would weigh a set of one unlikely key like
// a set of many likely ones. Subtracting the larger lse first keeps the
// exponentials finite. A set with no visible key has lse -inf: weight 0.
static inline void cp_merge(gpt_real *o, gpt_real *lse, const gpt_real *o_b, gpt_real lse_b, int n) {
    if (lse_b == -INFINITY) return;
    gpt_real top = *lse > lse_b ? *lse : lse_b;
    gpt_real wa = *lse == -INFINITY ? 0 : exp(*lse - top), wb = exp(lse_b - top), sum = wa + wb;
    for (int c = 0; c < n; c++) o[c] = (wa * o[c] + wb * o_b[c]) / sum;
    *lse = top + log(sum);
}

// ---------------------------------------------------------------- ring attention

// Copies the keys and values of this rank's tokens out of qkv (B, count, 3C)
// into a block of (B, count, 2C): what travels around the ring.
static inline void cp_pack_kv(gpt_real *kv, const gpt_real *qkv, size_t rows, int C) {
    for (size_t n = 0; n < rows; n++) memcpy(kv + n * 2 * C, qkv + n * 3 * C + C, sizeof(gpt_real) * 2 * (size_t)C);
}

// Attends this rank's queries to the keys and values of rank src's tokens
// (kv: B x Ts x 2C), segment against segment: a pair whose keys all come
// after its queries is skipped (the causal mask hides all of it: that is
// the work zigzag balances); the diagonal pair is masked key by key, by
// global position. Each pair's partial result is merged into out (B,
// count, C) and lse (B, NH, count); its scaled scores are kept in att's
// rows (B, NH, count, T) at their keys' global positions, for the
// probabilities (cp_ring_forward's end).
static inline void cp_attend_block(gpt_cp *cp, gpt_real *out, gpt_real *lse, gpt_real *att, const gpt_real *qkv,
                                   const gpt_real *kv, int src, int B, int C, int NH) {
    int Tl = cp->count, Tw = cp->whole, hs = C / NH, C3 = 3 * C, C2 = 2 * C, Ts = cp_count_of(cp, src);
    cp_segment kseg[2];
    int nk = cp_segments(Tw, cp->ways, src, cp->balance, kseg);
    gpt_real scale = 1 / sqrt((gpt_real)hs);
    double pairs = 0;
#pragma omp parallel reduction(+ : pairs)
    {
        gpt_real *s = xmalloc(sizeof(gpt_real) * ((size_t)Tl * (size_t)(Ts ? Ts : 1) + (size_t)Tl * hs));
        gpt_real *ob = s + (size_t)Tl * (size_t)(Ts ? Ts : 1);
#pragma omp for
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            for (int qi = 0, qoff = 0; qi < cp->nseg; qoff += cp->seg[qi].count, qi++) {
                cp_segment qs = cp->seg[qi];
                for (int ki = 0, koff = 0; ki < nk; koff += kseg[ki].count, ki++) {
                    cp_segment ks = kseg[ki];
                    if (!qs.count || !ks.count || ks.first > qs.first + qs.count - 1) continue;
                    const gpt_real *q = qkv + ((size_t)b * Tl + qoff) * C3 + h * hs;
                    const gpt_real *k = kv + ((size_t)b * Ts + koff) * C2 + h * hs, *v = k + C;
                    gemm_serial(false, true, qs.count, ks.count, hs, q, C3, k, C2, 0, s, ks.count);
                    gpt_real lse_b[qs.count > 0 ? qs.count : 1];
                    for (int t = 0; t < qs.count; t++) {
                        gpt_real *row = s + (size_t)t * ks.count, top = -INFINITY, sum = 0;
                        gpt_real *kept = att + (((size_t)b * NH + h) * Tl + qoff + t) * Tw + ks.first;
                        int p = qs.first + t, visible = p - ks.first + 1;
                        visible = visible > ks.count ? ks.count : visible;
                        for (int j = 0; j < ks.count; j++) kept[j] = row[j] * scale;
                        for (int j = 0; j < visible; j++) top = kept[j] > top ? kept[j] : top;
                        for (int j = 0; j < ks.count; j++) {
                            row[j] = j < visible ? gpt_exp(kept[j] - top) : 0;
                            sum += row[j];
                        }
                        gpt_real inv = visible > 0 ? 1 / sum : 0;
                        for (int j = 0; j < visible; j++) row[j] *= inv;
                        lse_b[t] = visible > 0 ? top + log(sum) : -INFINITY;
                    }
                    pairs += (double)qs.count * ks.count;
                    gemm_serial(false, false, qs.count, hs, ks.count, s, ks.count, v, C2, 0, ob, hs);
                    for (int t = 0; t < qs.count; t++)
                        cp_merge(out + ((size_t)b * Tl + qoff + t) * C + h * hs,
                                 lse + ((size_t)b * NH + h) * Tl + qoff + t, ob + (size_t)t * hs, lse_b[t], hs);
                }
            }
        }
        free(s);
    }
    cp->pairs += pairs;
}

// Ring attention's forward pass. Step i attends to the block of rank
// (rank - i) while the next block is already on its way from the previous
// rank (started before the arithmetic, waited for after it): cp - 1 blocks
// are sent in all. At the end, the kept scores become the probabilities
// the backward pass needs (exp(score - lse) with the final lse; 0 where masked).
static inline void cp_ring_forward(gpt_cp *cp, gpt_real *out, gpt_real *att, const gpt_real *qkv, int B, int C,
                                   int NH) {
    int N = cp->ways, Tl = cp->count, Tw = cp->whole;
    size_t most = 0;
    for (int r = 0; r < N; r++) most = (size_t)cp_count_of(cp, r) > most ? (size_t)cp_count_of(cp, r) : most;
    size_t block = (size_t)B * most * 2 * C;
    gpt_real *kv[2] = {cp_scratch(cp, 0, block), cp_scratch(cp, 1, block)};
    gpt_real *lse = cp_scratch(cp, 2, (size_t)B * NH * (Tl ? Tl : 1));
    memset(out, 0, sizeof(gpt_real) * (size_t)B * Tl * C);
    for (size_t i = 0; i < (size_t)B * NH * Tl; i++) lse[i] = -INFINITY;
    cp_pack_kv(kv[0], qkv, (size_t)B * Tl, C);
    for (int i = 0; i < N; i++) {
        int src = ((cp->rank - i) % N + N) % N, next_src = ((src - 1) % N + N) % N;
        void *pending = NULL;
        size_t send = (size_t)B * cp_count_of(cp, src) * 2 * C;
        if (i < N - 1) {
            pending = cp->comm.ring_start(cp->comm.user, kv[i & 1], send, kv[(i + 1) & 1],
                                          (size_t)B * cp_count_of(cp, next_src) * 2 * C);
            cp->sent_forward += (double)send;
        }
        double t0 = cp_cpu_seconds();
        cp_attend_block(cp, out, lse, att, qkv, kv[i & 1], src, B, C, NH);
        cp->seconds += cp_cpu_seconds() - t0;
        if (pending) cp->comm.ring_finish(cp->comm.user, pending);
    }
    // (With every score of the row at hand, the probabilities are computed
    // as one process computes them - max, exponentials, sum - so that the
    // backward pass starts from the same numbers; the log-sum-exps gave
    // the output, whose keys and values are gone.)
#pragma omp parallel for
    for (int r = 0; r < B * NH * Tl; r++) {
        gpt_real *row = att + (size_t)r * Tw, top = row[0], sum = 0;
        int p = cp->pos[r % Tl];
        for (int s = 1; s <= p; s++) top = row[s] > top ? row[s] : top;
#pragma omp simd reduction(+ : sum)
        for (int s = 0; s <= p; s++) {
            row[s] = gpt_exp(row[s] - top);
            sum += row[s];
        }
        gpt_real inv = 1 / sum;
        for (int s = 0; s <= p; s++) row[s] *= inv;
        for (int s = p + 1; s < Tw; s++) row[s] = 0;
    }
}

// The backward pass of one visiting block (src's keys and values kv), for
// every pair of segments the forward pass computed, with P kept:
//     dP = dO V^T,  dV += P^T dO,  dS = P .* (dP - D) * scale,  dQ += dS K,  dK += dS^T Q
// where D = rowsum(dO .* O) over the head's channels is rowsum(dP .* P)
// over ALL keys, which no single block has. dq goes into dqkv (B, count,
// 3C); dK and dV of src's keys into dkv (B, Ts, 2C).
static inline void cp_block_backward(gpt_cp *cp, gpt_real *dqkv, gpt_real *dkv, const gpt_real *dout,
                                     const gpt_real *qkv, const gpt_real *att, const gpt_real *D, const gpt_real *kv,
                                     int src, int B, int C, int NH) {
    int Tl = cp->count, Tw = cp->whole, hs = C / NH, C3 = 3 * C, C2 = 2 * C, Ts = cp_count_of(cp, src);
    cp_segment kseg[2];
    int nk = cp_segments(Tw, cp->ways, src, cp->balance, kseg);
    gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel
    {
        gpt_real *ds = xmalloc(sizeof(gpt_real) * (size_t)(Tl ? Tl : 1) * (size_t)(Ts ? Ts : 1));
#pragma omp for
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            for (int qi = 0, qoff = 0; qi < cp->nseg; qoff += cp->seg[qi].count, qi++) {
                cp_segment qs = cp->seg[qi];
                for (int ki = 0, koff = 0; ki < nk; koff += kseg[ki].count, ki++) {
                    cp_segment ks = kseg[ki];
                    if (!qs.count || !ks.count || ks.first > qs.first + qs.count - 1) continue;
                    size_t qrow = (size_t)b * Tl + qoff, krow = (size_t)b * Ts + koff;
                    const gpt_real *q = qkv + qrow * C3 + h * hs, *k = kv + krow * C2 + h * hs, *v = k + C;
                    const gpt_real *dy = dout + qrow * C + h * hs;
                    const gpt_real *p = att + (((size_t)b * NH + h) * Tl + qoff) * Tw + ks.first;
                    gpt_real *dq = dqkv + qrow * C3 + h * hs, *dk = dkv + krow * C2 + h * hs, *dv = dk + C;
                    gemm_serial(false, true, qs.count, ks.count, hs, dy, C, v, C2, 0, ds, ks.count);
                    gemm_serial(true, false, ks.count, hs, qs.count, p, Tw, dy, C, 1, dv, C2);
                    for (int t = 0; t < qs.count; t++) {
                        const gpt_real *pr = p + (size_t)t * Tw;
                        gpt_real *dr = ds + (size_t)t * ks.count, d = D[((size_t)b * NH + h) * Tl + qoff + t];
                        for (int j = 0; j < ks.count; j++) dr[j] = pr[j] * (dr[j] - d) * scale;
                    }
                    gemm_serial(false, false, qs.count, hs, ks.count, ds, ks.count, k, C2, 1, dq, C3);
                    gemm_serial(true, false, ks.count, hs, qs.count, ds, ks.count, q, C3, 1, dk, C2);
                }
            }
        }
        free(ds);
    }
}

// Ring attention's backward pass: the blocks go around again. At step i
// this rank holds rank (rank - i)'s keys and values and, from step 1 on,
// the gradient of them that the ranks before it have added up; it adds its
// queries' share and passes both on. After the last step the gradient
// arrives at its owner: cp - 1 blocks and cp - 1 gradients sent in all,
// twice the forward pass's traffic.
static inline void cp_ring_backward(gpt_cp *cp, gpt_real *dqkv, const gpt_real *dout, const gpt_real *qkv,
                                    const gpt_real *att, const gpt_real *out, int B, int C, int NH) {
    int N = cp->ways, Tl = cp->count, hs = C / NH;
    size_t most = 0, rows = (size_t)B * Tl;
    for (int r = 0; r < N; r++) most = (size_t)cp_count_of(cp, r) > most ? (size_t)cp_count_of(cp, r) : most;
    size_t block = (size_t)B * most * 2 * C;
    gpt_real *kv[2] = {cp_scratch(cp, 0, block), cp_scratch(cp, 1, block)};
    gpt_real *dkv[2] = {cp_scratch(cp, 3, block), cp_scratch(cp, 4, block)};
    gpt_real *mine = cp_scratch(cp, 5, rows * 2 * C + (size_t)B * NH * Tl + 1), *D = mine + rows * 2 * C;
    memset(dqkv, 0, sizeof(gpt_real) * rows * 3 * C);
    memset(mine, 0, sizeof(gpt_real) * rows * 2 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tl; t++) {
                const gpt_real *dy = dout + ((size_t)b * Tl + t) * C + h * hs, *o = out + ((size_t)b * Tl + t) * C + h * hs;
                gpt_real d = 0;
                for (int c = 0; c < hs; c++) d += dy[c] * o[c];
                D[((size_t)b * NH + h) * Tl + t] = d;
            }
    cp_pack_kv(kv[0], qkv, rows, C);
    for (int i = 0; i < N; i++) {
        int src = ((cp->rank - i) % N + N) % N, next_src = ((src - 1) % N + N) % N;
        size_t here = (size_t)B * cp_count_of(cp, src) * 2 * C, coming = (size_t)B * cp_count_of(cp, next_src) * 2 * C;
        void *blocks = NULL;
        if (i < N - 1) {
            blocks = cp->comm.ring_start(cp->comm.user, kv[i & 1], here, kv[(i + 1) & 1], coming);
            cp->sent_backward += (double)here;
        }
        gpt_real *grad = i == 0 ? mine : dkv[i & 1];
        if (i == 1) memset(grad, 0, sizeof(gpt_real) * here);
        double t0 = cp_cpu_seconds();
        cp_block_backward(cp, dqkv, grad, dout, qkv, att, D, kv[i & 1], src, B, C, NH);
        cp->seconds += cp_cpu_seconds() - t0;
        if (i > 0) { // the gradient goes on; the last one to its owner, and ours comes home
            size_t back = i < N - 1 ? coming : rows * 2 * C;
            void *grads = cp->comm.ring_start(cp->comm.user, grad, here, dkv[(i + 1) & 1], back);
            cp->sent_backward += (double)here;
            cp->comm.ring_finish(cp->comm.user, grads);
        }
        if (blocks) cp->comm.ring_finish(cp->comm.user, blocks);
    }
    const gpt_real *home = N > 1 ? dkv[N & 1] : NULL;
    for (size_t n = 0; n < rows; n++)
        for (int c = 0; c < 2 * C; c++)
            dqkv[n * 3 * C + C + c] = mine[n * 2 * C + c] + (home ? home[n * 2 * C + c] : 0);
}

// ---------------------------------------------------------------- ulysses

// Where this rank's token t of rank r's tokens sits in the whole sequence.
static inline void cp_positions_of(const gpt_cp *cp, int r, int *pos) {
    cp_segment seg[2];
    int n = cp_segments(cp->whole, cp->ways, r, cp->balance, seg);
    for (int s = 0, t = 0; s < n; s++)
        for (int i = 0; i < seg[s].count; i++) pos[t++] = seg[s].first + i;
}

// Sequence-split to head-split: from (B, count, parts x C) of every rank's
// tokens, with channels [part C + r Cn, part C + (r+1) Cn) for rank r's
// heads (Cn = C / cp), to (B, T, parts x Cn) of this rank's heads over the
// whole sequence, rows at their global positions. `to_heads` false: the
// way back. Returns the numbers sent to other ranks.
static inline double cp_ulysses_swap(gpt_cp *cp, bool to_heads, gpt_real *local, gpt_real *whole, int B, int C,
                                     int parts) {
    int N = cp->ways, Tw = cp->whole, Tl = cp->count, Cn = C / N, W = parts * Cn;
    size_t counts_mine[N], counts_theirs[N];
    for (int r = 0; r < N; r++)
        counts_mine[r] = (size_t)B * Tl * W, counts_theirs[r] = (size_t)B * cp_count_of(cp, r) * W;
    gpt_real *send = cp_scratch(cp, 0, (size_t)B * Tw * W), *recv = cp_scratch(cp, 1, (size_t)B * Tw * W);
    int *pos = xmalloc(sizeof(int) * (size_t)(Tw ? Tw : 1));
    gpt_real *mine = to_heads ? send : recv, *theirs = to_heads ? recv : send;
    if (!to_heads) { // this rank's heads of every rank's tokens, packed by rank
        size_t at = 0;
        for (int r = 0; r < N; r++) {
            int Tr = cp_count_of(cp, r);
            cp_positions_of(cp, r, pos);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tr; t++, at += W)
                    memcpy(theirs + at, whole + ((size_t)b * Tw + pos[t]) * W, sizeof(gpt_real) * W);
        }
    } else { // every rank's heads of this rank's tokens, packed by rank
        for (int r = 0; r < N; r++)
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tl; t++)
                    for (int part = 0; part < parts; part++)
                        memcpy(mine + (((size_t)r * B + b) * Tl + t) * W + part * Cn,
                               local + ((size_t)b * Tl + t) * parts * C + part * C + r * Cn, sizeof(gpt_real) * Cn);
    }
    if (to_heads) cp->comm.all_to_all_v(cp->comm.user, send, counts_mine, recv, counts_theirs);
    else cp->comm.all_to_all_v(cp->comm.user, send, counts_theirs, recv, counts_mine);
    if (to_heads) {
        size_t at = 0;
        for (int r = 0; r < N; r++) {
            int Tr = cp_count_of(cp, r);
            cp_positions_of(cp, r, pos);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tr; t++, at += W)
                    memcpy(whole + ((size_t)b * Tw + pos[t]) * W, theirs + at, sizeof(gpt_real) * W);
        }
    } else {
        for (int r = 0; r < N; r++)
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tl; t++)
                    for (int part = 0; part < parts; part++)
                        memcpy(local + ((size_t)b * Tl + t) * parts * C + part * C + r * Cn,
                               mine + (((size_t)r * B + b) * Tl + t) * W + part * Cn, sizeof(gpt_real) * Cn);
    }
    free(pos);
    double sent = 0;
    for (int r = 0; r < N; r++)
        if (r != cp->rank) sent += (double)(to_heads ? counts_mine[r] : counts_theirs[r]);
    return sent;
}

// Ulysses' forward pass: q, k, v to this rank's heads over the whole
// sequence; ordinary causal attention (gpt.h) for NH / cp heads; the
// output back to this rank's tokens. The whole-sequence q, k, v of its
// heads replace the rank's own in qkv (the same count when cp divides T):
// the backward pass needs them, not those.
static inline void cp_ulysses_forward(gpt_cp *cp, gpt_real *out, gpt_real *att, gpt_real *qkv, int B, int C, int NH) {
    int N = cp->ways, Tw = cp->whole, Cn = C / N;
    gpt_real *heads = cp_scratch(cp, 2, (size_t)B * Tw * 3 * Cn), *y = cp_scratch(cp, 3, (size_t)B * Tw * Cn);
    cp->sent_forward += cp_ulysses_swap(cp, true, qkv, heads, B, C, 3);
    double t0 = cp_cpu_seconds();
    attention_forward(y, att, heads, B, Tw, Cn, NH / N);
    cp->seconds += cp_cpu_seconds() - t0;
    cp->pairs += (double)B * (NH / N) * Tw * Tw;
    cp->sent_forward += cp_ulysses_swap(cp, false, out, y, B, C, 1);
    if ((size_t)Tw * 3 * Cn == (size_t)cp->count * 3 * C) memcpy(qkv, heads, sizeof(gpt_real) * (size_t)B * Tw * 3 * Cn);
}

static inline void cp_ulysses_backward(gpt_cp *cp, gpt_real *dqkv, gpt_real *dout, const gpt_real *qkv,
                                       const gpt_real *att, int B, int C, int NH) {
    int N = cp->ways, Tw = cp->whole, Cn = C / N;
    if ((size_t)Tw != (size_t)cp->count * (size_t)N)
        die("ulysses: a backward pass needs cp %d to divide the sequence's %d tokens", N, Tw);
    gpt_real *dy = cp_scratch(cp, 2, (size_t)B * Tw * 3 * Cn), *dheads = cp_scratch(cp, 3, (size_t)B * Tw * 3 * Cn);
    cp->sent_backward += cp_ulysses_swap(cp, true, dout, dy, B, C, 1);
    double t0 = cp_cpu_seconds();
    attention_backward(dheads, dy, qkv, att, B, Tw, Cn, NH / N);
    cp->seconds += cp_cpu_seconds() - t0;
    cp->sent_backward += cp_ulysses_swap(cp, false, dqkv, dheads, B, C, 3);
}

// ---------------------------------------------------------------- gpt.h's hooks

static inline void cp_attention_forward(gpt_cp *cp, gpt_real *out, gpt_real *att, gpt_real *qkv, int B, int C, int NH) {
    if (cp->kind == CP_ULYSSES) cp_ulysses_forward(cp, out, att, qkv, B, C, NH);
    else cp_ring_forward(cp, out, att, qkv, B, C, NH);
}

static inline void cp_attention_backward(gpt_cp *cp, gpt_real *dqkv, gpt_real *dout, const gpt_real *qkv,
                                         const gpt_real *att, const gpt_real *out, int B, int C, int NH) {
    if (cp->kind == CP_ULYSSES) cp_ulysses_backward(cp, dqkv, dout, qkv, att, B, C, NH);
    else cp_ring_backward(cp, dqkv, dout, qkv, att, out, B, C, NH);
}

// What cp needs of the model's shape, or NULL: heads to split (ulysses),
// and a sequence cp divides (zigzag: into 2 cp chunks).
static inline const char *cp_problem(int block_size, int n_head, int ways, cp_kind kind, cp_balance balance) {
    if (ways < 2) return NULL;
    if (balance == CP_ZIGZAG && block_size % (2 * ways))
        return "zigzag splits each sequence into 2 x cp equal chunks: --block_size must be a multiple of 2 x --cp";
    if (balance == CP_CONTIGUOUS && block_size % ways)
        return "each rank takes an equal slice of each sequence: --block_size must be a multiple of --cp";
    if (kind == CP_ULYSSES && n_head % ways)
        return "ulysses gives each rank whole heads: --n_head must be a multiple of --cp";
    return NULL;
}

#endif
