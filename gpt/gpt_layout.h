// gpt_layout.h - where every number of the GPT lives: the one place that
// knows the model's layout.
//
// Two implementations compute the same model: gpt.h on the CPU (C11) and
// gpt_cuda.cu on a GPU (CUDA C++). Both include this file, so it is plain C
// that both languages read, and neither keeps a layout of its own:
//   1. the configuration and its presets;
//   2. the parameter table: every weight lives in ONE flat array, and the
//      table names its slices (wte.weight, h.0.attn.c_attn.weight, ...);
//   3. the gradient buckets: the flat array cut where the backward pass
//      finishes a part of it, for data parallelism;
//   4. the activations: what the forward pass keeps for the backward pass,
//      block by block, and the backward pass's scratch, as sizes that each
//      model carves out of its buffers with one loop;
//   5. tensor parallelism (chapter 10): which tensors a block splits over
//      tp ranks, and the mapping between a rank's shard and the full model;
//   6. pipeline stages (chapter 11): which blocks and ends a stage holds,
//      and where its part of the flat array lies.
// Chapters 09-11 shard this layout (slices of the flat array, a shard of
// each block, a range of blocks), so it is the only place that knows it.
// Every size below has a version for a tensor-parallel shard (`tp`: the
// number of ranks a block is split over; 1 or less: the whole model); the
// plain version is the whole model.
#ifndef GPT_LAYOUT_H
#define GPT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// ===================================================================== 1. configuration

typedef struct {
    int vocab_size; // tokens the model knows (from the tokenizer)
    int block_size; // longest context, in tokens
    int n_layer;    // transformer blocks
    int n_head;     // attention heads per block
    int n_embd;     // width of the residual stream (channels)
    // A mixture of experts in each block's place of the MLP (chapter 13,
    // gpt/moe.h); n_expert 0: the dense MLP, and nothing below matters.
    int n_expert;   // experts per block
    int top_k;      // experts each token goes to
    int ep;         // a rank's shard: the experts split over ep ranks (0 or 1: all of them here)
    int capacity_groups;   // training: capacity and the balancing loss counted per group of sequences (0, 1: the batch)
    float capacity_factor; // training: an expert takes at most ceil(f n K / E) of a group's n tokens (0: all)
    float aux_loss_coef;   // training: the weight of the load-balancing loss
} gpt_config;

// A dense model's configuration (the mixture-of-experts fields 0): what
// chapters 08-12 build, field by field.
static inline gpt_config gpt_config_of(int vocab_size, int block_size, int n_layer, int n_head, int n_embd) {
    gpt_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab_size, c.block_size = block_size, c.n_layer = n_layer, c.n_head = n_head, c.n_embd = n_embd;
    return c;
}

// The number format a model computes its activations in (the CPU model:
// fp32 only). bf16 and fp16 are mixed precision: fp32 master weights,
// gradients and AdamW moments, 16-bit copies of the weights and 16-bit
// activations for the matrix products (gpt_cuda.h). fp16 keeps more digits
// than bf16 (11 significant bits against 8) but only 5 bits of exponent:
// nothing above 65504, and below 6e-5 the digits run out, so the small
// gradients of the backward pass need a loss scale (gpt_cuda.h).
typedef enum { GPT_FP32, GPT_BF16, GPT_FP16 } gpt_precision;

static inline const char *gpt_precision_name(gpt_precision p) {
    return p == GPT_BF16 ? "bf16" : p == GPT_FP16 ? "fp16" : "fp32";
}

// fp16's dynamic loss scale (gpt_cuda.h explains it): kept on the GPU,
// read by the training loop for its progress line and its snapshots.
typedef struct {
    float scale;       // what the loss's gradient is multiplied by (0: no loss scaling)
    int good_steps;    // steps in a row without overflow since the scale last changed
    int skipped;       // 1: the last step overflowed and was skipped
    int skipped_total; // steps skipped since training began
} gpt_scaler;

// "default": the chapter's model (4.47 M parameters with vocabulary 5000).
// "tiny": small enough for tests and for a demo that finishes in a minute.
// The vocabulary comes from the tokenizer, so a preset leaves it alone.
static inline bool gpt_preset(const char *name, gpt_config *c) {
    if (!strcmp(name, "default")) {
        c->block_size = 128, c->n_layer = 4, c->n_head = 4, c->n_embd = 256;
        return true;
    }
    if (!strcmp(name, "tiny")) {
        c->block_size = 32, c->n_layer = 2, c->n_head = 2, c->n_embd = 64;
        return true;
    }
    return false;
}

// NULL when the configuration can be built, else the reason it cannot.
static inline const char *gpt_config_problem(gpt_config c) {
    if (c.vocab_size < 2 || c.vocab_size > 65536) return "vocab_size must be 2..65536 (tokens are 16-bit)";
    if (c.block_size < 1 || c.block_size > 8192) return "block_size must be 1..8192";
    if (c.n_layer < 1 || c.n_layer > 256) return "n_layer must be 1..256";
    if (c.n_head < 1 || c.n_embd < 1 || c.n_embd > 16384) return "n_head and n_embd must be positive (n_embd <= 16384)";
    if (c.n_embd % c.n_head != 0) return "n_embd must be a multiple of n_head (each head gets n_embd / n_head channels)";
    if (c.n_expert < 0 || c.n_expert > 1024) return "n_expert must be 0..1024 (0: the dense MLP)";
    if (c.n_expert && (c.top_k < 1 || c.top_k > c.n_expert))
        return "top_k must be 1..n_expert (the experts a token goes to)";
    if (c.n_expert && c.ep > 1 && c.n_expert % c.ep)
        return "n_expert must be a multiple of ep (each rank holds n_expert / ep experts)";
    return NULL;
}

// ===================================================================== 2. the parameter table
//
// The flat array holds, in this order: wte (V x C, the token embedding),
// wpe (block_size x C, the position embedding), the twelve tensors of each
// block h.0 ... h.{L-1}, then ln_f's weight and bias. The LM head has no
// tensor of its own: it reuses wte ("weight tying"), which saves V*C
// parameters and helps small models.
//
// Why one flat array? Data parallelism then all-reduces a single buffer, a
// snapshot writes a single buffer, a GPU copies a single buffer, and
// sharding (chapter 09) cuts it into N slices.

// One named slice of the flat array: what a safetensors file or a snapshot
// stores per tensor. Shapes are row-major; ndim is 1 or 2.
typedef struct {
    char name[48];
    size_t offset, count;
    int ndim;
    int shape[2];
    bool decay; // AdamW's weight decay applies to matrices (ndim 2) only
    int split;  // gpt_split (section 5): how tensor parallelism cuts it
} gpt_tensor;

// How tensor parallelism (chapter 10, section 5 below) cuts a tensor over
// the tp ranks: not at all (every rank holds all of it), its rows (a
// weight's outputs: a column-parallel layer) or its columns (a weight's
// inputs: a row-parallel layer).
typedef enum { GPT_REPLICATED, GPT_SPLIT_ROWS, GPT_SPLIT_COLS } gpt_split;

// The twelve tensors of one block, in storage order. Shapes are multiples
// of C = n_embd: {rows, cols}, cols 0 for a vector. A weight is stored as
// (out, in), as torch.nn.Linear does: y = x W^T + b. The last column is
// how tensor parallelism splits it (section 5 says why these).
// A mixture-of-experts block (chapter 13, cfg.n_expert E > 0) keeps the
// twelve in the same order, its four MLP tensors E times over, expert
// after expert (mlp.experts.c_fc.weight is (E 4C, C): expert e's rows
// e 4C ... (e+1) 4C - 1), and adds a thirteenth at its end: the router,
// mlp.router.weight (E, C). An expert-parallel shard (cfg.ep > 1) holds
// E/ep experts of each: rank r's are experts r E/ep ..., a contiguous
// piece of each of the four (section 7).
enum {
    B_LN1_W, B_LN1_B, B_QKV_W, B_QKV_B, B_ATTPROJ_W, B_ATTPROJ_B,
    B_LN2_W, B_LN2_B, B_FC_W, B_FC_B, B_FCPROJ_W, B_FCPROJ_B, GPT_BLOCK_TENSORS,
    B_ROUTER_W = GPT_BLOCK_TENSORS, GPT_BLOCK_TENSORS_MAX
};
static const struct { const char *name; int rows, cols; gpt_split split; } gpt_block_layout[GPT_BLOCK_TENSORS_MAX] = {
    {"ln_1.weight", 1, 0, GPT_REPLICATED},        {"ln_1.bias", 1, 0, GPT_REPLICATED},
    {"attn.c_attn.weight", 3, 1, GPT_SPLIT_ROWS}, {"attn.c_attn.bias", 3, 0, GPT_SPLIT_ROWS},
    {"attn.c_proj.weight", 1, 1, GPT_SPLIT_COLS}, {"attn.c_proj.bias", 1, 0, GPT_REPLICATED},
    {"ln_2.weight", 1, 0, GPT_REPLICATED},        {"ln_2.bias", 1, 0, GPT_REPLICATED},
    {"mlp.c_fc.weight", 4, 1, GPT_SPLIT_ROWS},    {"mlp.c_fc.bias", 4, 0, GPT_SPLIT_ROWS},
    {"mlp.c_proj.weight", 1, 4, GPT_SPLIT_COLS},  {"mlp.c_proj.bias", 1, 0, GPT_REPLICATED},
    {"mlp.router.weight", 0, 1, GPT_REPLICATED}, // rows: n_expert (gpt_block_tensor_shape)
};

// The tensors of one block: 12, or 13 with a router (a mixture of experts).
static inline int gpt_block_tensors(const gpt_config *c) {
    return c->n_expert ? GPT_BLOCK_TENSORS_MAX : GPT_BLOCK_TENSORS;
}

// An expert tensor of a mixture-of-experts block (one of the MLP's four).
static inline bool gpt_is_expert_tensor(const gpt_config *c, int i) {
    return c->n_expert && (i == B_FC_W || i == B_FC_B || i == B_FCPROJ_W || i == B_FCPROJ_B);
}

// How tensor parallelism splits block tensor i: as the table says, except
// a mixture's experts, which stay whole on every tp rank (the finale,
// chapter 14: after attention's all-reduce every tp rank holds the same
// tokens, and its experts compute them whole; ep cuts the experts instead).
static inline gpt_split gpt_block_split(const gpt_config *c, int i) {
    return gpt_is_expert_tensor(c, i) ? GPT_REPLICATED : gpt_block_layout[i].split;
}

// The ranks a model's experts are split over: 1 (all here) for a whole model.
static inline int gpt_ep_ways(int ep) { return ep > 1 ? ep : 1; }

// Table indices: wte 0, wpe 1, block l's tensor i, ln_f's weight and bias.
static inline int gpt_num_tensors(const gpt_config *c) { return 4 + gpt_block_tensors(c) * c->n_layer; }
static inline int gpt_block_tensor(const gpt_config *c, int layer, int i) {
    return 2 + layer * gpt_block_tensors(c) + i;
}
static inline int gpt_ln_f_tensor(const gpt_config *c) { return 2 + gpt_block_tensors(c) * c->n_layer; }

// The number of ranks a tensor-parallel model splits each block over: 1
// (no split) for the whole model.
static inline int gpt_tp_ways(int tp) { return tp > 1 ? tp : 1; }

// Block tensor i's shape in a shard of tp ranks, {rows, cols} in numbers
// (cols 0: a vector): its split dimension divided by tp.
static inline void gpt_block_tensor_shape(const gpt_config *c, int tp, int i, size_t *rows, size_t *cols) {
    size_t C = (size_t)c->n_embd, ways = (size_t)gpt_tp_ways(tp);
    *rows = (size_t)gpt_block_layout[i].rows * C / (gpt_block_split(c, i) == GPT_SPLIT_ROWS ? ways : 1);
    *cols = (size_t)gpt_block_layout[i].cols * C / (gpt_block_split(c, i) == GPT_SPLIT_COLS ? ways : 1);
    if (i == B_ROUTER_W) *rows = (size_t)c->n_expert;
    if (gpt_is_expert_tensor(c, i)) *rows *= (size_t)(c->n_expert / gpt_ep_ways(c->ep)); // this shard's experts
}

// A block tensor's name: the experts' are mlp.experts.* (a dense model's
// file and a mixture's never mix up their MLPs).
static inline void gpt_block_tensor_name(const gpt_config *c, int layer, int i, char *name, size_t size) {
    if (gpt_is_expert_tensor(c, i)) snprintf(name, size, "h.%d.mlp.experts.%s", layer, gpt_block_layout[i].name + 4);
    else snprintf(name, size, "h.%d.%s", layer, gpt_block_layout[i].name);
}

// Appends one tensor of rows x cols (cols 0: a vector) at offset *total.
static inline void gpt_layout_add(gpt_tensor *out, int *n, size_t *total, const char *name, size_t rows,
                                  size_t cols, gpt_split split) {
    if (out) {
        gpt_tensor *t = &out[*n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->ndim = cols > 0 ? 2 : 1;
        t->shape[0] = (int)rows;
        t->shape[1] = (int)cols;
        t->count = rows * (cols > 0 ? cols : 1);
        t->offset = *total;
        t->decay = cols > 0;
        t->split = (int)split;
    }
    *total += rows * (cols > 0 ? cols : 1);
    (*n)++;
}

// Fills out[0 .. gpt_num_tensors) (out may be NULL: only count) and returns
// the number of parameters, the length of the flat array: of the whole
// model (gpt_layout_params), or of one rank's shard when each block is
// split over tp ranks (the same tensors, in the same order, the split ones
// smaller; section 5).
static inline size_t gpt_layout_params_tp(const gpt_config *c, int tp, gpt_tensor *out) {
    size_t C = (size_t)c->n_embd, total = 0;
    int n = 0;
    gpt_layout_add(out, &n, &total, "wte.weight", (size_t)c->vocab_size, C, GPT_REPLICATED);
    gpt_layout_add(out, &n, &total, "wpe.weight", (size_t)c->block_size, C, GPT_REPLICATED);
    for (int l = 0; l < c->n_layer; l++)
        for (int i = 0; i < gpt_block_tensors(c); i++) {
            char name[48];
            size_t rows, cols;
            gpt_block_tensor_name(c, l, i, name, sizeof name);
            gpt_block_tensor_shape(c, tp, i, &rows, &cols);
            gpt_layout_add(out, &n, &total, name, rows, cols, gpt_block_split(c, i));
        }
    gpt_layout_add(out, &n, &total, "ln_f.weight", C, 0, GPT_REPLICATED);
    gpt_layout_add(out, &n, &total, "ln_f.bias", C, 0, GPT_REPLICATED);
    return total;
}

static inline size_t gpt_layout_params(const gpt_config *c, gpt_tensor *out) { return gpt_layout_params_tp(c, 1, out); }
static inline size_t gpt_num_params(const gpt_config *c) { return gpt_layout_params(c, NULL); }

// ===================================================================== 3. gradient buckets
//
// The backward pass runs from the loss to the input, so it finishes the
// gradients in this order: ln_f, block L-1 ... block 0, then wte + wpe (wte
// gets its last gradient from the encoder, at the very end, because the LM
// head shares it). Each of these is one contiguous range of the flat array:
// a bucket, which data parallelism can average while the backward pass
// computes the next one. Together they cover [0, num_params) exactly once.
typedef struct {
    size_t offset, count; // in parameters
    char name[32];        // "ln_f", "h.11", "wte+wpe"
} gpt_bucket;

// Parameters before the first block (wte, wpe), in one block, and where
// block l begins; ln_f begins where block n_layer would.
static inline size_t gpt_embedding_params(const gpt_config *c) {
    return ((size_t)c->vocab_size + (size_t)c->block_size) * (size_t)c->n_embd;
}
static inline size_t gpt_block_params_tp(const gpt_config *c, int tp) {
    size_t total = 0, rows, cols;
    for (int i = 0; i < gpt_block_tensors(c); i++) {
        gpt_block_tensor_shape(c, tp, i, &rows, &cols);
        total += rows * (cols ? cols : 1);
    }
    return total;
}
static inline size_t gpt_block_offset_tp(const gpt_config *c, int tp, int layer) {
    return gpt_embedding_params(c) + (size_t)layer * gpt_block_params_tp(c, tp);
}
static inline size_t gpt_block_params(const gpt_config *c) { return gpt_block_params_tp(c, 1); }
static inline size_t gpt_block_offset(const gpt_config *c, int layer) { return gpt_block_offset_tp(c, 1, layer); }

// Bucket k of gpt_layout_buckets_tp (0 <= k < n_layer + 2). In a shard of
// tp ranks, the buckets of the shard's array.
static inline gpt_bucket gpt_layout_bucket_tp(const gpt_config *c, int tp, int k) {
    int L = c->n_layer;
    gpt_bucket b;
    if (k == 0) { // ln_f: its weight and bias follow the last block
        b.offset = gpt_block_offset_tp(c, tp, L), b.count = 2 * (size_t)c->n_embd;
        snprintf(b.name, sizeof b.name, "ln_f");
    } else if (k <= L) { // block L-k
        b.offset = gpt_block_offset_tp(c, tp, L - k), b.count = gpt_block_params_tp(c, tp);
        snprintf(b.name, sizeof b.name, "h.%d", L - k);
    } else {
        b.offset = 0, b.count = gpt_embedding_params(c);
        snprintf(b.name, sizeof b.name, "wte+wpe");
    }
    return b;
}
static inline gpt_bucket gpt_layout_bucket(const gpt_config *c, int k) { return gpt_layout_bucket_tp(c, 1, k); }

// Fills up to max buckets (out may be NULL); returns how many there are (n_layer + 2).
static inline int gpt_layout_buckets_tp(const gpt_config *c, int tp, gpt_bucket *out, int max) {
    int n = c->n_layer + 2;
    for (int k = 0; out && k < n && k < max; k++) out[k] = gpt_layout_bucket_tp(c, tp, k);
    return n;
}

static inline int gpt_layout_buckets(const gpt_config *c, gpt_bucket *out, int max) {
    return gpt_layout_buckets_tp(c, 1, out, max);
}

// Which bucket holds what: ln_f is bucket 0, block l bucket n_layer - l,
// the embeddings (wte+wpe) the last one.
enum { GPT_BUCKET_LN_F = 0 };
static inline int gpt_bucket_of_block(const gpt_config *c, int layer) { return c->n_layer - layer; }
static inline int gpt_bucket_embeddings(const gpt_config *c) { return c->n_layer + 1; }

// Sharded data parallelism (chapter 09) keeps only a slice of each
// bucket's parameters on each rank, and gathers a bucket's parameters just
// before it computes. So both models can ask, bucket by bucket, where the
// parameters and gradients are, through a hook the caller sets (gpt.h's
// gpt_t.hook, gpt_cuda.h's gpt_cuda_set_bucket_hook); without one they are
// the model's own flat arrays. The hook hears, for each bucket in the
// order the passes use them:
typedef enum {
    GPT_FORWARD_BEGIN,  // the forward pass needs the bucket's parameters: where are they?
    GPT_FORWARD_END,    // it is done with them (until the backward pass)
    GPT_BACKWARD_BEGIN, // the backward pass needs the parameters, and where to add the gradients
    GPT_BACKWARD_END,   // the bucket's gradients are final; the parameters are no longer needed
} gpt_bucket_event;
// The forward pass: embeddings BEGIN, then each block BEGIN ... END in
// order, ln_f BEGIN, then ln_f END and embeddings END (the LM head reads
// wte). The backward pass: ln_f BEGIN, embeddings BEGIN, ln_f END, each
// block from the last BEGIN ... END, embeddings END (wte gets gradients at
// the start, from the LM head, and at the end, from the encoder).

// ===================================================================== 4. activations
//
// What the forward pass keeps of each block for the backward pass, in the
// order both models store it. N = B*T token positions, C channels, NH heads.
// Two kinds of storage: ACT is the activations' number type (bf16 on a GPU
// in mixed precision, else float) and STAT is always float (LayerNorm's
// mean and 1/std, the attention's log-sum-exp: numbers that bf16 would
// round too much). The CPU keeps both kinds in one float buffer; the GPU in
// two buffers, one per kind. Attention keeps either its T x T probabilities
// (the CPU, and the GPU's cuBLAS path) or, with flash attention, one
// log-sum-exp per row, from which it recomputes them.
enum {
    A_LN1, A_LN1_MEAN, A_LN1_RSTD, // (N,C), (N), (N): ln_1's output and statistics
    A_QKV,                         // (N,3C): queries, keys, values
    A_ATT, A_ATT_LSE,              // (B,NH,T,T) probabilities, or (NH,N) log-sum-exps (flash)
    A_ATTY,                        // (N,C): attention output, heads side by side
    A_RES2,                        // (N,C): residual stream after attention
    A_LN2, A_LN2_MEAN, A_LN2_RSTD, // as ln_1
    A_FCH, A_FCH_GELU,             // (N,4C): the MLP's hidden layer before / after GELU
    A_RES3,                        // (N,C): residual stream leaving the block
    GPT_BLOCK_ACTS
};
typedef enum { GPT_ACT, GPT_STAT } gpt_act_kind;
typedef enum { GPT_KEPT_ALWAYS, GPT_KEPT_BY_SCORES, GPT_KEPT_BY_FLASH } gpt_act_when;
static const struct { const char *name; gpt_act_kind kind; gpt_act_when when; } gpt_block_acts_layout[GPT_BLOCK_ACTS] = {
    {"ln1", GPT_ACT, GPT_KEPT_ALWAYS},       {"ln1_mean", GPT_STAT, GPT_KEPT_ALWAYS},
    {"ln1_rstd", GPT_STAT, GPT_KEPT_ALWAYS}, {"qkv", GPT_ACT, GPT_KEPT_ALWAYS},
    {"att", GPT_ACT, GPT_KEPT_BY_SCORES},    {"att_lse", GPT_STAT, GPT_KEPT_BY_FLASH},
    {"atty", GPT_ACT, GPT_KEPT_ALWAYS},      {"res2", GPT_ACT, GPT_KEPT_ALWAYS},
    {"ln2", GPT_ACT, GPT_KEPT_ALWAYS},       {"ln2_mean", GPT_STAT, GPT_KEPT_ALWAYS},
    {"ln2_rstd", GPT_STAT, GPT_KEPT_ALWAYS}, {"fch", GPT_ACT, GPT_KEPT_ALWAYS},
    {"fch_gelu", GPT_ACT, GPT_KEPT_ALWAYS},  {"res3", GPT_ACT, GPT_KEPT_ALWAYS},
};

// Elements of block activation `a` for a batch of B x T tokens. In a shard
// of tp ranks (section 5) a rank keeps the activations of its own heads and
// of its share of the MLP's hidden units, a tp-th of them; the residual
// stream, LayerNorm's output and statistics stay whole on every rank.
static inline size_t gpt_block_act_size_tp(const gpt_config *c, int tp, int a, size_t B, size_t T) {
    size_t N = B * T, C = (size_t)c->n_embd, NH = (size_t)c->n_head, ways = (size_t)gpt_tp_ways(tp);
    switch (a) {
    case A_LN1_MEAN: case A_LN1_RSTD: case A_LN2_MEAN: case A_LN2_RSTD: return N;
    case A_QKV: return 3 * N * C / ways;
    case A_ATT: return B * (NH / ways) * T * T;
    case A_ATT_LSE: return NH / ways * N;
    case A_ATTY: return N * C / ways;
    case A_FCH: case A_FCH_GELU: return c->n_expert ? 0 : 4 * N * C / ways; // experts: gpt/moe.h keeps their own
    default: return N * C;
    }
}

static inline size_t gpt_block_act_size(const gpt_config *c, int a, size_t B, size_t T) {
    return gpt_block_act_size_tp(c, 1, a, B, T);
}

// Does a model whose attention is `flash` (or not) keep activation a?
static inline bool gpt_block_act_kept(int a, bool flash) {
    gpt_act_when w = gpt_block_acts_layout[a].when;
    return w == GPT_KEPT_ALWAYS || (w == GPT_KEPT_BY_FLASH) == flash;
}

// Elements one block keeps of one kind.
static inline size_t gpt_block_acts_size_tp(const gpt_config *c, int tp, gpt_act_kind kind, bool flash, size_t B,
                                            size_t T) {
    size_t total = 0;
    for (int a = 0; a < GPT_BLOCK_ACTS; a++)
        if (gpt_block_acts_layout[a].kind == kind && gpt_block_act_kept(a, flash))
            total += gpt_block_act_size_tp(c, tp, a, B, T);
    return total;
}

static inline size_t gpt_block_acts_size(const gpt_config *c, gpt_act_kind kind, bool flash, size_t B, size_t T) {
    return gpt_block_acts_size_tp(c, 1, kind, flash, B, T);
}

// Outside the blocks the forward pass keeps, in this order: the embeddings
// (the first block's input), a scratch stream the blocks' projections write
// into before the residual add, ln_f's output and statistics, and each
// position's loss. The logits, (N, V), live in a buffer of their own on
// both models (the GPU pads V; gpt_cuda.cu says why).
enum { H_ENCODED, H_SCRATCH, H_LNF, H_LNF_MEAN, H_LNF_RSTD, H_LOSSES, GPT_HEAD_ACTS };
static const gpt_act_kind gpt_head_acts_kind[GPT_HEAD_ACTS] = {GPT_ACT, GPT_ACT, GPT_ACT, GPT_STAT, GPT_STAT, GPT_STAT};

static inline size_t gpt_head_act_size(const gpt_config *c, int h, size_t B, size_t T) {
    return gpt_head_acts_kind[h] == GPT_ACT ? B * T * (size_t)c->n_embd : B * T;
}

static inline size_t gpt_head_acts_size(const gpt_config *c, gpt_act_kind kind, size_t B, size_t T) {
    size_t total = 0;
    for (int h = 0; h < GPT_HEAD_ACTS; h++)
        if (gpt_head_acts_kind[h] == kind) total += gpt_head_act_size(c, h, B, T);
    return total;
}

// The backward pass's scratch, reused by every block (the only gradient
// that travels from block to block is dres): dres (N,C) the gradient of the
// residual stream, dtmp (N,C), dqkv (N,3C), dhidden (N,4C). In a shard of
// tp ranks dqkv and dhidden are a tp-th of that (a rank's heads and hidden
// units); dtmp stays (N,C): it holds the input gradients the ranks add up.
enum { G_DRES, G_DTMP, G_DQKV, G_DHIDDEN, GPT_GRAD_ACTS };
static const int gpt_grad_acts_channels[GPT_GRAD_ACTS] = {1, 1, 3, 4}; // times C per position
static const bool gpt_grad_acts_split[GPT_GRAD_ACTS] = {false, false, true, true};

static inline size_t gpt_grad_act_size_tp(const gpt_config *c, int tp, int g, size_t B, size_t T) {
    size_t n = (size_t)gpt_grad_acts_channels[g] * B * T * (size_t)c->n_embd;
    return gpt_grad_acts_split[g] ? n / (size_t)gpt_tp_ways(tp) : n;
}

static inline size_t gpt_grad_acts_size_tp(const gpt_config *c, int tp, size_t B, size_t T) {
    size_t total = 0;
    for (int g = 0; g < GPT_GRAD_ACTS; g++) total += gpt_grad_act_size_tp(c, tp, g, B, T);
    return total;
}

static inline size_t gpt_grad_acts_size(const gpt_config *c, size_t B, size_t T) {
    return gpt_grad_acts_size_tp(c, 1, B, T);
}

// ===================================================================== 5. tensor parallelism
//
// Chapter 10 splits every block over tp ranks, as Megatron-LM does
// (Shoeybi et al., 2019), so that each rank holds and computes a tp-th of
// each block's matrices. A linear layer y = x W^T can be split two ways:
//   - by its outputs, the rows of W ("column-parallel", the paper's A =
//     [A1, A2] cut by columns of A = W^T): each rank computes its share of
//     y's channels from ALL of x. No communication in the forward pass.
//   - by its inputs, the columns of W ("row-parallel"): each rank reads its
//     share of x's channels and computes a partial y; the partial ys must be
//     added up (an all-reduce) before anything nonlinear touches y.
// The paper's trick is to pair them so that the nonlinear parts in between
// need nothing from the other ranks:
//   attention  c_attn column-parallel: a rank computes q, k, v of its own
//              NH/tp heads, and attention is per head; then c_proj
//              row-parallel: its inputs are exactly those heads' outputs.
//   MLP        c_fc column-parallel: a rank computes its share of the 4C
//              hidden units, GELU is per unit; then c_proj row-parallel.
// So each half of a block costs ONE all-reduce of the (N, C) output in the
// forward pass (the paper's g), and, in the backward pass, one of the
// (N, C) input gradient of its column-parallel layer, whose ranks each
// hold only the part that flowed through their own heads or units (the
// paper's f). Row-parallel biases are added once, after the all-reduce (a
// bias on every rank would be added tp times), so they are whole on every
// rank; LayerNorms, embeddings and ln_f are small and whole everywhere too
// ("replicated"): every rank computes them on the same numbers and gets the
// same gradients, with no communication.
//
// The mapping between a shard and the full tensor: every dimension in the
// table is a multiple of C. A split dimension of k*C numbers is k blocks of
// C, and rank r of tp holds the r-th tp-th of each block. For c_attn's 3C
// rows those blocks are q, k and v, and the r-th tp-th of each is the
// channels of heads r*NH/tp ... (r+1)*NH/tp - 1 (head h owns channels
// h*C/NH ...): rank r's q, k, v are of its own heads, stored [q | k | v] as
// the full model stores them. c_proj's C columns are cut the same way: the
// columns of rank r's heads. For the MLP the cut just has to agree between
// c_fc's 4C rows and c_proj's 4C columns, and it does (same rule).

// NULL when a model of this configuration can be split over tp ranks, else why not.
static inline const char *gpt_tp_problem(const gpt_config *c, int tp) {
    if (tp < 1) return "tp must be at least 1";
    if (c->n_head % tp != 0) return "tp must divide n_head (each rank computes whole heads)";
    return NULL;
}

// Copies one tensor between the full model (its table entry `full`, its
// flat array full_base) and rank `rank`'s shard of tp (`shard`,
// shard_base), each number `elem` bytes: into the shard when to_shard,
// else from it into the full model (only the part this rank holds).
static inline void gpt_tensor_shard_copy(const gpt_tensor *full, const gpt_tensor *shard, int C, int tp, int rank,
                                         void *full_base, void *shard_base, size_t elem, bool to_shard) {
    char *f = (char *)full_base + full->offset * elem, *s = (char *)shard_base + shard->offset * elem;
    size_t piece = (size_t)C / (size_t)gpt_tp_ways(tp), first = piece * (size_t)rank;
    size_t rows = (size_t)full->shape[0], cols = full->ndim == 2 ? (size_t)full->shape[1] : 1;
    if (full->split == GPT_SPLIT_ROWS) { // k blocks of C rows: rows first .. first + piece - 1 of each
        for (size_t block = 0; block < rows / (size_t)C; block++) {
            char *fp = f + (block * (size_t)C + first) * cols * elem, *sp = s + block * piece * cols * elem;
            memcpy(to_shard ? sp : fp, to_shard ? fp : sp, piece * cols * elem);
        }
    } else if (full->split == GPT_SPLIT_COLS) { // in every row, k blocks of C columns
        size_t shard_cols = (size_t)shard->shape[1];
        for (size_t row = 0; row < rows; row++)
            for (size_t block = 0; block < cols / (size_t)C; block++) {
                char *fp = f + (row * cols + block * (size_t)C + first) * elem;
                char *sp = s + (row * shard_cols + block * piece) * elem;
                memcpy(to_shard ? sp : fp, to_shard ? fp : sp, piece * elem);
            }
    } else {
        memcpy(to_shard ? s : f, to_shard ? f : s, full->count * elem);
    }
}

// ===================================================================== 6. pipeline stages
//
// Pipeline parallelism (chapter 11) cuts the model by depth: stage s of S
// holds blocks [first, last) and computes them for every micro-batch. The
// first stage also holds the embeddings (wte, wpe); the last one ln_f and
// the LM head, which is wte again (tied weights), so the last stage keeps a
// copy of wte of its own, and the two copies' gradients are added up before
// every step (as Megatron-LM does) so that the copies stay equal. A whole
// model is the one stage of one: gpt_stage_of(c, 0, 1).
typedef struct {
    int index, count;     // stage `index` of `count`
    int first, last;      // blocks [first, last)
    bool embedding, head; // wte + wpe (the first stage); ln_f + the LM head with its copy of wte (the last)
} gpt_stage;

// Blocks are dealt out as evenly as they go: stage s gets [s L / S, (s+1) L / S).
static inline gpt_stage gpt_stage_of(const gpt_config *c, int index, int count) {
    gpt_stage s = {index, count, c->n_layer * index / count, c->n_layer * (index + 1) / count, index == 0,
                   index == count - 1};
    return s;
}

// NULL when the model splits into `count` stages of at least one block each.
static inline const char *gpt_stage_problem(const gpt_config *c, int count) {
    if (count < 1) return "a pipeline needs at least one stage";
    if (count > c->n_layer) return "every stage needs a block of its own: at most n_layer stages";
    return NULL;
}

// Does the stage hold tensor t (an index into the whole model's table)?
static inline bool gpt_stage_holds(const gpt_config *c, const gpt_stage *s, int t) {
    if (t == 0) return s->embedding || s->head; // wte: the token embedding, and the tied LM head
    if (t == 1) return s->embedding;            // wpe
    if (t >= gpt_ln_f_tensor(c)) return s->head;
    int layer = (t - 2) / gpt_block_tensors(c);
    return layer >= s->first && layer < s->last;
}

// The stage's own flat array holds the tensors it holds, in the table's
// order, one after another. This fills out[0 .. gpt_num_tensors) (out may
// be NULL: only count) with the whole model's table - or a shard's, when
// each block is split over tp ranks (section 5) - in which the tensors
// the stage holds have their offsets in that array and the others are
// empty (count 0), and returns its length. For the whole model, the table
// of gpt_layout_params_tp.
static inline size_t gpt_layout_stage_params(const gpt_config *c, const gpt_stage *s, int tp, gpt_tensor *out) {
    size_t C = (size_t)c->n_embd, total = 0;
    if (!out) {
        total += (s->embedding || s->head ? (size_t)c->vocab_size * C : 0) + (s->embedding ? (size_t)c->block_size * C : 0);
        return total + (size_t)(s->last - s->first) * gpt_block_params_tp(c, tp) + (s->head ? 2 * C : 0);
    }
    gpt_layout_params_tp(c, tp, out);
    for (int t = 0; t < gpt_num_tensors(c); t++) {
        if (!gpt_stage_holds(c, s, t)) out[t].count = 0;
        out[t].offset = total;
        total += out[t].count;
    }
    return total;
}

// The numbers at the start of a stage's array that are a copy of another
// stage's: the last stage's wte (the first stage's is the one a snapshot
// saves and the gradient norm counts); 0 on every other stage.
static inline size_t gpt_stage_tied_copy(const gpt_config *c, const gpt_stage *s) {
    return s->head && !s->embedding ? (size_t)c->vocab_size * (size_t)c->n_embd : 0;
}

// ===================================================================== 7. expert parallelism
//
// Chapter 13 spreads each mixture-of-experts block's E experts over ep
// ranks: rank r of the ep group holds experts r E/ep ... (r+1) E/ep - 1
// of every block, and ALL of everything else (attention, LayerNorms,
// router, embeddings). A shard's table (gpt_layout_params_tp with cfg.ep
// = ep) is the whole model's with the four expert tensors of each block
// cut to their E/ep experts; the copy below maps between the two.

// Copies tensor `full` (of the whole model's table, in full_base) to or
// from its part in rank `rank`'s expert shard (`shard`, shard_base), each
// number `elem` bytes. An expert tensor's rows are its experts', one
// expert after another, so a rank's experts are one contiguous piece.
static inline void gpt_tensor_expert_copy(const gpt_tensor *full, const gpt_tensor *shard, int rank, void *full_base,
                                          void *shard_base, size_t elem, bool to_shard) {
    char *f = (char *)full_base + (full->offset + shard->count * (size_t)rank) * elem;
    char *s = (char *)shard_base + shard->offset * elem;
    if (full->count == shard->count) f = (char *)full_base + full->offset * elem; // not an expert tensor: all of it
    memcpy(to_shard ? s : f, to_shard ? f : s, shard->count * elem);
}

#ifdef __cplusplus
}
#endif

#endif
