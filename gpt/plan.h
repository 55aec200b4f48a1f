// plan.h - the planner: what each rank of a layout holds and sends, from
// arithmetic alone (no data, no ranks, no device).
//
// A layout is the mesh (dp x tp x pp x cp x ep, common/groups.h's order),
// ZeRO's stage over dp (chapter 09), the pipeline's schedule and
// micro-batches (chapter 11), and the model and batch (08's flags). For a
// rank of each pipeline stage the planner gives
//   - its bytes by kind: parameters, gradients, optimizer state,
//     activations (with their gradients and the tokens), communication
//     buffers (ZeRO's staging and gathered buckets), other (a GPU's cuBLAS
//     workspace and small tables);
//   - its bytes sent per optimizer step along each dimension, counted as a
//     ring algorithm sends them: an all-reduce of B bytes over n ranks
//     sends 2(n-1)/n B, a reduce-scatter or all-gather of B bytes in all
//     (n-1)/n B, a send its bytes. The 8-byte all-reduces of the gradient
//     norm are left out (on both sides: the chapters' measured rows leave
//     them out too).
// The sizes are the model's own: gpt_layout.h's tables, the CPU model's
// buffers as gpt.h allocates them (gpt_cpu_block_acts, gpt_cpu_head_acts,
// gpt_grad_acts_size_tp), the GPU model's as gpt_cuda.cu's memory plan
// allocates them (plan_gpu_model below mirrors its plan_memory, constant
// for constant), chapter 09's slices and buckets as zero.h cuts them.
// gpt/README.md, "Choosing a layout", derives every formula.
//
// Every GPT chapter has --plan (gpt/options.h): it prints these rows for
// the chapter's flags and exits; the chapters print the same rows,
// measured, after training ("memory measured stage 0: ..."), and
// tests/course/test_plan.sh holds the two against each other.
//
// Context parallelism (cp, chapter 12: its ranks' key/value blocks or
// all-to-all buffers, their traffic), the mixture of experts and expert
// parallelism (ep, chapter 13: E/ep experts a rank, the router, the
// routing's buffers, the all-to-alls, dense gradients over dp x ep x cp and
// the experts' over dp x cp) and the finale's compositions (chapter 14,
// with its ZeRO-1 over dp: --shard 1, --replicate R, plan_stage_slices)
// are held to runs of those chapters too (tests/course/test_plan.sh). Two
// numbers depend on where the router sends the tokens, and the planner
// assumes it sends them evenly (and drops none): the rows a rank's experts
// receive (part of its activations) and the bytes it sends to other ranks
// of its ep group; with ep 1 and no drops the plan is exact.
#ifndef GPT_PLAN_H
#define GPT_PLAN_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"
#include "gpt_layout.h"

// ===================================================================== 1. a layout

typedef enum { PLAN_PARAMS, PLAN_GRADS, PLAN_OPTIMIZER, PLAN_ACTIVATIONS, PLAN_COMM, PLAN_OTHER, PLAN_KINDS } plan_kind;
static const char *const plan_kind_names[PLAN_KINDS] = {"parameters", "gradients", "optimizer state",
                                                        "activations", "comm buffers", "other"};
typedef enum { PLAN_DP, PLAN_TP, PLAN_PP, PLAN_CP, PLAN_EP, PLAN_DIMS } plan_dim;
static const char *const plan_dim_names[PLAN_DIMS] = {"dp", "tp", "pp", "cp", "ep"};

typedef struct {
    gpt_config cfg;
    int B, T;                 // a micro-batch: B sequences of T tokens
    int M;                    // micro-batches per optimizer step (08's --grad_accum; 11's pipeline micro-batches)
    bool gpu;                 // the GPU model (gpt_cuda.cu), else the CPU model (gpt.h)
    gpt_precision precision;  // fp32 on the CPU
    int wire_bytes;           // bytes per gradient number in DDP's all-reduce: 4, or 2 with --grad_compress bf16/fp16
    int dp, tp, pp, cp, ep;   // the mesh
    int zero;                 // ZeRO's stage over dp: 0 (DDP) .. 3 (FSDP)
    int replicate;            // hybrid sharding (09's --replicate, FSDP's HYBRID_SHARD): slices over dp / R ranks, R replicas (1: none)
    bool gpipe;               // the pipeline's schedule: GPipe, else 1F1B
    bool ulysses;             // cp: Ulysses' all-to-alls, else ring attention
    int n_expert, top_k;      // ep: experts per MoE layer and experts per token (0: a dense model; cfg's too)
    int capacity_groups;      // 13's --capacity_groups (the routing's tables per group)
} plan_layout;

// What one rank holds (bytes) and sends per optimizer step (bytes).
typedef struct {
    double mem[PLAN_KINDS];
    double sent[PLAN_DIMS];
} plan_rank;

static inline double plan_total(const double *x, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += x[i];
    return t;
}

// NULL when the layout can be built, else why not.
static inline const char *plan_problem(const plan_layout *l) {
    static char why[160];
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1 || l->ep < 1) return "every dimension needs at least 1 rank";
    const char *p = gpt_tp_problem(&l->cfg, l->tp);
    if (p) return p;
    if ((p = gpt_stage_problem(&l->cfg, l->pp))) return p;
    if (l->zero < 0 || l->zero > 3) return "ZeRO's stage is 0..3";
    if (l->replicate < 1 || l->dp % l->replicate != 0) {
        snprintf(why, sizeof why, "--replicate %d must divide dp %d", l->replicate, l->dp);
        return why;
    }
    if (l->replicate > 1 && l->zero == 0) return "--replicate needs a sharded stage (DDP has no slices to replicate)";
    if (l->cp > 1 && l->T % l->cp != 0) return "cp must divide the block (each rank a T/cp slice of every sequence)";
    if (l->cp > 1 && l->ulysses && (l->cfg.n_head / l->tp) % l->cp != 0)
        return "ulysses gives each cp rank whole heads: cp must divide a tp rank's heads (n_head / tp)";
    if (l->ep > 1 && (l->n_expert < l->ep || l->n_expert % l->ep != 0))
        return "ep needs n_expert a multiple of ep (each rank its n_expert/ep experts)";
    if (l->n_expert != l->cfg.n_expert || l->top_k != l->cfg.top_k)
        return "the layout's experts are not its model's (cfg.n_expert, cfg.top_k)";
    if (l->n_expert && (p = gpt_config_problem(l->cfg))) return p;
    return NULL;
}

// ===================================================================== 2. memory

// One block's activations on the CPU (gpt.h's gpt_cpu_block_acts) for
// T of a rank's tokens: with cp, attention keeps its queries' rows against
// every key of the sequence (context_parallel.h's cp_att_size; Ulysses'
// NH/cp heads against every query and key are as many numbers).
static inline size_t plan_cpu_block_acts(const gpt_config *c, int tp, int cp, size_t B, size_t T) {
    size_t total = 0;
    for (int a = 0; a < GPT_BLOCK_ACTS; a++) {
        if (!gpt_block_act_kept(a, false)) continue;
        if (a == A_ATT && cp > 1) total += B * (size_t)(c->n_head / (tp > 1 ? tp : 1)) * T * T * (size_t)cp;
        else total += gpt_block_act_size_tp(c, tp, a, B, T);
    }
    return total;
}

// A mixture of experts' buffers for one micro-batch of N tokens on one
// layer (gpt/moe.h, gpt_moe_layers_bytes): the router's probabilities
// (N E), per assignment (N K) the choice, gate, slot and row index and the
// rows sent and returned (2C), the balancing loss's (G E), and per row its
// experts receive (R) the row, its output, the experts' hidden layer
// before and after GELU and their gradients' (12 C numbers) and an index.
// R depends on the routing: evenly routed, every rank receives N K.
static inline double plan_moe_layer_bytes(const gpt_config *c, size_t N, int groups) {
    double E = c->n_expert, K = c->top_k, C = c->n_embd, r = sizeof(gpt_real), R = (double)N * K;
    return (double)N * E * r + (double)N * K * (3 * sizeof(int) + r + 2 * C * r) + (groups > 1 ? groups : 1) * E * r +
           R * 12 * C * r + R * sizeof(int);
}

// Context parallelism's buffers (gpt/context_parallel.h, cp_buffer_bytes)
// for B sequences of which a rank holds Tl = T/cp tokens, C and NH the
// channels and heads of its tp shard: ring attention two key/value blocks
// in flight (B Tl 2C each), their gradients' two, the log-sum-exps (B NH
// Tl) and the backward pass's own keys, values and row sums (B Tl 2C + B
// NH Tl + 1); Ulysses four all-to-all buffers of the whole sequence's q, k,
// v for C/cp channels (B T 3C/cp each); both this rank's tokens and
// targets (2 B Tl uint16).
static inline double plan_cp_buffers(const plan_layout *l) {
    if (l->cp == 1) return 0;
    double B = l->B, Tl = (double)l->T / l->cp, C = (double)l->cfg.n_embd / l->tp, NH = (double)l->cfg.n_head / l->tp;
    double numbers = l->ulysses ? 4 * B * l->T * 3 * C / l->cp : 10 * B * Tl * C + 2 * B * NH * Tl + 1;
    return numbers * sizeof(gpt_real) + 2 * B * Tl * sizeof(uint16_t);
}

// The CPU model (gpt.h): parameters, gradients, AdamW's two moments in
// fp32 (4 + 4 + 8 bytes a number, as far as it keeps them); one buffer of
// activations per micro-batch held (gpt_ensure_acts: the part outside the
// blocks, each block's, the logits N V on the last stage), with the two
// token arrays (2 N uint16), and one buffer of activation gradients.
static inline void plan_cpu_model(const plan_layout *l, const gpt_stage *st, int slots, bool params, bool grads,
                                  bool adam, double *mem) {
    const gpt_config *c = &l->cfg;
    double P = (double)gpt_layout_stage_params(c, st, l->tp, NULL);
    size_t B = (size_t)l->B, T = (size_t)l->T / (size_t)l->cp, N = B * T, L = (size_t)(st->last - st->first);
    double acts = (double)(gpt_cpu_head_acts(c, B, T) + L * plan_cpu_block_acts(c, l->tp, l->cp, B, T) +
                           (st->head ? N * (size_t)c->vocab_size : 0));
    mem[PLAN_PARAMS] += params ? 4 * P : 0;
    mem[PLAN_GRADS] += grads ? 4 * P : 0;
    mem[PLAN_OPTIMIZER] += adam ? 8 * P : 0;
    mem[PLAN_ACTIVATIONS] += slots * (4 * acts + 2.0 * N * sizeof(uint16_t)) +
                             4.0 * (double)gpt_grad_acts_size_tp(c, l->tp, B, T);
    // A mixture of experts: each slot's routing and rows, layer by layer
    // (the finale keeps a micro-batch's routing for its backward pass).
    if (c->n_expert) mem[PLAN_ACTIVATIONS] += slots * (double)L * plan_moe_layer_bytes(c, N, l->capacity_groups);
    mem[PLAN_COMM] += plan_cp_buffers(l);
}

// The GPU model (gpt_cuda.cu): its memory plan (plan_memory there), buffer
// for buffer. The vocabulary of the LM head is padded to a multiple of 64
// (padded_vocab), the padding rows in front of wte in the parameters, their
// gradients and their 16-bit copy; activations are 16-bit in bf16 and fp16,
// statistics fp32; flash attention (heads of up to 128 channels) keeps a
// log-sum-exp per row instead of the T x T probabilities; a 32 MiB cuBLAS
// workspace, 264 partial sums of the gradient norm, AdamW's chunk table
// (at most P/4096 + tensors chunks of 16 bytes) and 56 bytes of scalars.
enum { PLAN_GPU_WORKSPACE = 32 << 20, PLAN_GPU_NORM_BLOCKS = 264, PLAN_GPU_ADAM_CHUNK = 4096,
       PLAN_GPU_CHUNK_BYTES = 16, PLAN_GPU_SCALARS = 56 };

static inline void plan_gpu_model(const plan_layout *l, const gpt_stage *st, int slots, bool params, bool grads,
                                  bool adam, double *mem) {
    const gpt_config *c = &l->cfg;
    size_t P = gpt_layout_stage_params(c, st, l->tp, NULL);
    // With cp the GPU model keeps one process's memory plan, sized for the
    // whole block (gpt_cuda_cp.cuh: a rank's T/cp tokens fill part of it),
    // so its buffers are planned for T tokens, cp or not (measured so on
    // the emulated GPUs: cp 2 and 4, ring, fp32).
    size_t B = (size_t)l->B, T = (size_t)l->T, N = B * T, L = (size_t)(st->last - st->first);
    size_t V = (size_t)c->vocab_size, C = (size_t)c->n_embd, Vp = st->head ? (V + 63) / 64 * 64 : 0;
    size_t pad = st->head ? (Vp - V) * C : 0;
    // The attention path gpt_cuda.cu's use_flash takes: flash for heads of
    // up to 128 channels, unless GPT_CUDA_ATTENTION=cublas asks otherwise.
    const char *attention = getenv("GPT_CUDA_ATTENTION");
    bool lowp = l->precision != GPT_FP32,
         flash = c->n_embd / c->n_head <= 128 && !(attention && !strcmp(attention, "cublas"));
    double act = lowp ? 2 : 4, padded = (double)(P + pad);
    double att = flash ? 0 : (double)gpt_block_act_size_tp(c, l->tp, A_ATT, B, T);
    double acts = act * (double)(gpt_head_acts_size(c, GPT_ACT, N, 1) + L * gpt_block_acts_size_tp(c, l->tp, GPT_ACT, flash, B, T));
    double stats = 4.0 * (double)(gpt_head_acts_size(c, GPT_STAT, N, 1) + N +
                                  L * gpt_block_acts_size_tp(c, l->tp, GPT_STAT, flash, B, T));
    double logits = 4.0 * (double)(N * Vp), dlogits = lowp ? 2.0 * (double)(N * Vp) : 0;
    double scores = flash ? 4.0 * (double)gpt_block_act_size_tp(c, l->tp, A_ATT_LSE, B, T) : lowp ? 4 * att : 0;
    double tokens = 2.0 * N * sizeof(uint16_t), slot = acts + stats + logits + tokens;
    mem[PLAN_PARAMS] += params ? padded * (4 + (lowp ? 2 : 0)) : 0;
    mem[PLAN_GRADS] += grads ? 4 * padded : 0;
    mem[PLAN_OPTIMIZER] += adam ? 8.0 * (double)P : 0;
    mem[PLAN_ACTIVATIONS] += slots * slot + dlogits + scores + att * act + act * (double)gpt_grad_acts_size_tp(c, l->tp, B, T);
    double chunks = adam ? (double)(P / PLAN_GPU_ADAM_CHUNK + (size_t)gpt_num_tensors(c)) * PLAN_GPU_CHUNK_BYTES : 0;
    mem[PLAN_OTHER] += PLAN_GPU_WORKSPACE + PLAN_GPU_NORM_BLOCKS * 8.0 + PLAN_GPU_SCALARS + chunks;
    // Without its parameters (ZeRO-3) a bf16 model makes 16-bit copies of
    // the bucket it computes: the embeddings (with the padding) and a block.
    if (!params && lowp) mem[PLAN_COMM] += 2.0 * (double)(pad + V * C + gpt_block_params_tp(c, l->tp));
}

// Chapter 09's slices (zero.h): each bucket of gpt_layout.h padded to a
// multiple of n and cut in n slices of S = ceil(count / n). Chapter 09
// shards a whole model. ZeRO-2 and 3 of a pipeline stage or tp shard
// (refused by the finale: not held to a run) would cut its own buckets the
// same way: its blocks' shards, the embeddings on the first stage, ln_f
// and the copy of wte on the last. The finale's ZeRO-1 of a part is
// plan_part_slices below.
typedef struct {
    double shard;           // the sum of the slices: one rank's shard arrays
    double most;            // the largest slice
    double slot[4];         // the bucket buffers, padded: the embeddings', ln_f's, the blocks' (2 on a GPU)
    double heads, blocks;   // the slices of the embeddings and ln_f, and of all blocks
} plan_slices;

static inline plan_slices plan_zero_slices(const gpt_config *c, const gpt_stage *st, int tp, int n, bool gpu) {
    plan_slices s = {0};
    for (int k = 0; k < c->n_layer + 2; k++) {
        gpt_bucket b = gpt_layout_bucket_tp(c, tp, k);
        int slot = k == gpt_bucket_embeddings(c) ? 0 : k == GPT_BUCKET_LN_F ? 1 : 2;
        if (slot == 0 && !st->embedding) b.count = st->head ? (size_t)c->vocab_size * c->n_embd : 0;
        if (slot == 1 && !st->head) b.count = 0;
        if (slot == 2 && (c->n_layer - k < st->first || c->n_layer - k >= st->last)) b.count = 0;
        if (b.count == 0) continue;
        double slice = (double)((b.count + (size_t)n - 1) / (size_t)n);
        s.shard += slice;
        if (slice > s.most) s.most = slice;
        if (slot == 2) s.blocks += slice;
        else s.heads += slice;
        if (slice * n > s.slot[slot]) s.slot[slot] = slice * n;
    }
    s.slot[3] = gpu ? s.slot[2] : 0;
    // A GPU model's LM head is padded in front of wte: the embeddings' buffer has room for it.
    if (gpu && st->head) s.slot[0] += (double)(((size_t)c->vocab_size + 63) / 64 * 64 - (size_t)c->vocab_size) * c->n_embd;
    return s;
}

// A part of the model - a pipeline stage, a tp shard or E/ep experts -
// with ZeRO-1 (the finale, chapter 14): zero.h cuts it as ONE bucket, its
// whole flat array of P numbers (the last stage's copy of wte included),
// in n slices of S = ceil(P / n) (zero_setup, zero_is_part). On a GPU the
// finale refuses --shard: planned as the CPU cuts it.
static inline bool plan_zero_part(const plan_layout *l) { return l->zero == 1 && (l->pp > 1 || l->tp > 1 || l->ep > 1); }

// The slices a rank of stage `st` holds over a shard group of n ranks.
static inline plan_slices plan_stage_slices(const plan_layout *l, const gpt_stage *st, int n) {
    if (!plan_zero_part(l)) return plan_zero_slices(&l->cfg, st, l->tp, n, l->gpu);
    plan_slices s = {0};
    size_t P = gpt_layout_stage_params(&l->cfg, st, l->tp, NULL);
    s.shard = s.most = (double)((P + (size_t)n - 1) / (size_t)n);
    return s;
}

// Stage `s` of the pipeline: its rank's bytes by kind.
static inline void plan_memory(const plan_layout *l, int s, double *mem) {
    memset(mem, 0, sizeof(double) * PLAN_KINDS);
    gpt_stage st = gpt_stage_of(&l->cfg, s, l->pp);
    // Activations held: one micro-batch at a time, but in a pipeline GPipe
    // holds all M, 1F1B at most S - s (chapter 11).
    int slots = l->pp == 1 ? 1 : l->gpipe ? l->M : (l->pp - s < l->M ? l->pp - s : l->M);
    int z = l->zero;
    bool keeps_params = z < 3, keeps_grads = z < 2, keeps_adam = z == 0;
    if (l->gpu) plan_gpu_model(l, &st, slots, keeps_params, keeps_grads, keeps_adam, mem);
    else plan_cpu_model(l, &st, slots, keeps_params, keeps_grads, keeps_adam, mem);
    if (z == 0) return;
    // ZeRO (zero.h, zero_setup): the slices of the gradients and of AdamW's
    // moments; ZeRO-1 and 2 a staging buffer of the largest padded bucket;
    // ZeRO-2 and 3 the bucket buffers the hook hands the model (and a slice
    // of scratch with micro-batches); ZeRO-3 the slices of the parameters
    // and the buffers they are gathered into.
    int n = l->dp / l->replicate;
    plan_slices sl = plan_stage_slices(l, &st, n);
    double buckets = sl.slot[0] + sl.slot[1] + sl.slot[2] + sl.slot[3];
    mem[PLAN_GRADS] += 4 * sl.shard + (z >= 2 ? 4 * buckets + (l->M > 1 ? 4 * sl.most : 0) : 0);
    mem[PLAN_OPTIMIZER] += 8 * sl.shard;
    if (z < 3) mem[PLAN_COMM] += 4 * sl.most * n;
    if (z == 3) mem[PLAN_PARAMS] += 4 * sl.shard, mem[PLAN_COMM] += 4 * buckets;
}

// ===================================================================== 3. traffic

static inline double plan_ring_all_reduce(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0; }

// Hybrid sharding's part of the dp column: the R replicas of each slice
// all-reduce it once a step (the rest of the column stays in the shard group).
static inline double plan_replicas_sent(const plan_layout *l, int s) {
    if (l->zero == 0 || l->replicate == 1) return 0;
    gpt_stage st = gpt_stage_of(&l->cfg, s, l->pp);
    plan_slices sl = plan_stage_slices(l, &st, l->dp / l->replicate);
    return plan_ring_all_reduce(4 * sl.shard, l->replicate);
}

// The experts' parameters of a stage's rank: E/ep experts a block, each an
// MLP of 8C^2 + 5C numbers (gpt_layout.h's mlp.experts.* tensors).
static inline double plan_expert_params(const gpt_config *c, const gpt_stage *st) {
    double C = c->n_embd;
    return (double)(st->last - st->first) * (c->n_expert / gpt_ep_ways(c->ep)) * (8 * C * C + 5 * C);
}

// Stage `s`'s rank: bytes sent per optimizer step along each dimension.
static inline void plan_traffic(const plan_layout *l, int s, double *sent) {
    memset(sent, 0, sizeof(double) * PLAN_DIMS);
    const gpt_config *c = &l->cfg;
    gpt_stage st = gpt_stage_of(c, s, l->pp);
    double P = (double)gpt_layout_stage_params(c, &st, l->tp, NULL), M = l->M, L = st.last - st.first;
    double act = l->gpu && l->precision != GPT_FP32 ? 2 : 4; // the activations' bytes a number
    double N = (double)l->B * l->T / l->cp, C = c->n_embd;
    // dp: DDP all-reduces the stage's gradients once a step (in
    // --grad_compress's format); ZeRO's collectives are over the n ranks
    // of a shard group, on the slices (fp32). Every average of a gradient
    // over the ranks that hold its numbers is counted in dp's column, the
    // group being dp x ep x cp or dp x cp: with ZeRO (the finale) the part
    // over ep x cp comes first, an all-reduce of the whole gradient (the
    // dense numbers over ep x cp, the experts' over cp), then the slices'.
    int dp = l->dp, z = l->zero;
    // A mixture of experts over ep ranks: the dense gradients over dp x ep
    // x cp (every rank holds them), each expert's over dp x cp (its
    // replicas), fp32 (13's model_average_experts).
    double Pe = c->n_expert && l->ep > 1 ? plan_expert_params(c, &st) : 0;
    if (z == 0)
        sent[PLAN_DP] = plan_ring_all_reduce(l->wire_bytes * (P - Pe), dp * l->ep * l->cp) +
                        plan_ring_all_reduce(4 * Pe, dp * l->cp);
    else {
        int n = dp / l->replicate;
        plan_slices sl = plan_stage_slices(l, &st, n);
        double piece = 4.0 * (n - 1); // a reduce-scatter or all-gather sends n-1 slices
        double rs = z == 1 ? sl.shard : M * sl.shard;               // ZeRO-2, 3: every micro-batch
        double ag = z < 3 ? sl.shard                                 // the updated slices, once
                          : M * (sl.heads + 2 * sl.blocks);          // FSDP: forward and backward, the ends kept between
        double before = plan_ring_all_reduce(l->wire_bytes * (P - Pe), l->ep * l->cp) +
                        plan_ring_all_reduce(4 * Pe, l->cp);         // the finale: over ep x cp first (0 in 09)
        sent[PLAN_DP] = before + piece * (rs + ag) + plan_replicas_sent(l, s);
    }
    // tp (Megatron): per block and micro-batch one all-reduce of the (N, C)
    // output of each half in the forward pass, one of each half's input
    // gradient in the backward pass: 4 of N C activations. A mixture of
    // experts is whole on every tp rank (the finale): attention's 2 only.
    double halves = c->n_expert ? 2 : 4;
    if (l->tp > 1) sent[PLAN_TP] = plan_ring_all_reduce(halves * L * M * N * C * act, l->tp);
    // pp: each micro-batch's output forward, its input gradient back (N C
    // numbers each), and the two copies of wte (first and last stage) summed
    // once a step: an all-reduce of V C fp32 over 2 ranks.
    if (l->pp > 1) {
        sent[PLAN_PP] = (st.head ? 0 : M * N * C * act) + (st.embedding ? 0 : M * N * C * act);
        if (st.embedding || st.head) sent[PLAN_PP] += plan_ring_all_reduce(4.0 * c->vocab_size * C, 2);
    }
    // cp (chapter 12's context_parallel.h): ring attention passes each
    // rank's keys and values (2 N C / tp numbers) to the next rank cp-1
    // times a layer forward, and keys, values and their gradients backward
    // (twice that); Ulysses all-to-alls q, k, v and the output forward and
    // their gradients backward (8 a layer), each sending (cp-1)/cp of N C/tp.
    if (l->cp > 1) {
        double kv = 2 * N * C / l->tp * act;
        sent[PLAN_CP] = l->ulysses ? 8 * L * M * (l->cp - 1.0) / l->cp * N * C / l->tp * act
                                   : 3 * L * M * (l->cp - 1.0) * kv;
    }
    // ep (chapter 13's moe.h): each MoE layer sends every token's top_k
    // copies to their experts and back, forward and backward: 4 all-to-alls
    // of top_k N C numbers (nothing dropped), (ep-1)/ep of them to other
    // ranks when the router spreads the tokens evenly (a rank's own share
    // depends on its tokens' routing: test_plan.sh's stated slack).
    if (l->ep > 1) sent[PLAN_EP] = 4 * L * M * c->top_k * N * C * act * (l->ep - 1.0) / l->ep;
}

static inline plan_rank plan_stage(const plan_layout *l, int s) {
    plan_rank r;
    plan_memory(l, s, r.mem);
    plan_traffic(l, s, r.sent);
    return r;
}

// ===================================================================== 4. the rows

// The one row format of the plan and of the chapters' measurements:
//   memory plan stage 0: parameters 485376 | gradients ... | total 1234 bytes
//   sent plan stage 0: dp 727296 | tp 0 | pp 0 | cp 0 | ep 0 | total 727296 bytes per step
// `source` is "plan" or "measured".
static inline void plan_print_rows(FILE *out, const char *source, int stage, const plan_rank *r) {
    fprintf(out, "memory %s stage %d:", source, stage);
    for (int k = 0; k < PLAN_KINDS; k++) fprintf(out, " %s %.0f |", plan_kind_names[k], r->mem[k]);
    fprintf(out, " total %.0f bytes\n", plan_total(r->mem, PLAN_KINDS));
    fprintf(out, "sent %s stage %d:", source, stage);
    for (int d = 0; d < PLAN_DIMS; d++) fprintf(out, " %s %.0f |", plan_dim_names[d], r->sent[d]);
    fprintf(out, " total %.0f bytes per step\n", plan_total(r->sent, PLAN_DIMS));
}

// The whole plan: what it is for, then the rows of every stage.
static inline void plan_print(FILE *out, const plan_layout *l) {
    const gpt_config *c = &l->cfg;
    int ranks = l->dp * l->tp * l->pp * l->cp * l->ep;
    fprintf(out, "plan: vocabulary %d, block %d, %d layers, %d heads, %d channels: %zu parameters; micro-batch %d x %d "
            "tokens, %d a step; %s %s\n", c->vocab_size, c->block_size, c->n_layer, c->n_head, c->n_embd,
            gpt_num_params(c), l->B, l->T, l->M, l->gpu ? "GPU" : "CPU", gpt_precision_name(l->precision));
    fprintf(out, "plan: mesh pp %d x dp %d x ep %d x cp %d x tp %d = %d rank(s); ZeRO-%d over dp%s%s\n", l->pp, l->dp,
            l->ep, l->cp, l->tp, ranks, l->zero, l->pp > 1 ? (l->gpipe ? "; schedule gpipe" : "; schedule 1f1b") : "",
            l->cp > 1 ? (l->ulysses ? "; cp ulysses" : "; cp ring") : "");
    if (c->n_expert)
        fprintf(out, "plan: a mixture of %d experts, top %d, %d a rank%s\n", c->n_expert, c->top_k,
                c->n_expert / gpt_ep_ways(l->ep),
                l->ep > 1 ? "; routed evenly and dropless (a rank's rows received and ep bytes depend on its routing)" : "");
    if (plan_zero_part(l))
        fprintf(out, "plan: ZeRO-1 of a part (stage, tp shard, experts) as the finale (chapter 14) cuts it: one bucket in "
                     "%d slices over dp%s\n", l->dp / l->replicate,
                l->cp > 1 || l->ep > 1 ? "; the gradients averaged over ep x cp first (in dp's column)" : "");
    else if (l->zero == 1 && l->cp > 1)
        fprintf(out, "plan: ZeRO-1 with cp as the finale runs it: 09's buckets in slices over dp, the gradients "
                     "all-reduced over cp first (in dp's column)\n");
    if (l->zero > 1 && (l->tp > 1 || l->pp > 1 || l->cp > 1 || l->ep > 1))
        fprintf(out, "plan: ZeRO-%d with tp, pp, cp or ep: 09's buckets over dp alone, which no chapter runs (the finale "
                     "refuses it): not held to a run\n", l->zero);
    if (l->replicate > 1)
        fprintf(out, "plan: hybrid sharding: %d replicas x %d ranks sharing the slices\n", l->replicate, l->dp / l->replicate);
    for (int s = 0; s < l->pp; s++) {
        plan_rank r = plan_stage(l, s);
        plan_print_rows(out, "plan", s, &r);
    }
}

#endif
