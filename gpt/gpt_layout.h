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
//      model carves out of its buffers with one loop.
// Chapters 09-11 shard this layout (slices of the flat array, a shard of
// each block, a range of blocks), so it is the only place that knows it.
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
} gpt_config;

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
} gpt_tensor;

// The twelve tensors of one block, in storage order. Shapes are multiples
// of C = n_embd: {rows, cols}, cols 0 for a vector. A weight is stored as
// (out, in), as torch.nn.Linear does: y = x W^T + b.
enum {
    B_LN1_W, B_LN1_B, B_QKV_W, B_QKV_B, B_ATTPROJ_W, B_ATTPROJ_B,
    B_LN2_W, B_LN2_B, B_FC_W, B_FC_B, B_FCPROJ_W, B_FCPROJ_B, GPT_BLOCK_TENSORS
};
static const struct { const char *name; int rows, cols; } gpt_block_layout[GPT_BLOCK_TENSORS] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},
    {"attn.c_attn.weight", 3, 1}, {"attn.c_attn.bias", 3, 0},
    {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},
    {"mlp.c_fc.weight", 4, 1},    {"mlp.c_fc.bias", 4, 0},
    {"mlp.c_proj.weight", 1, 4},  {"mlp.c_proj.bias", 1, 0},
};

// Table indices: wte 0, wpe 1, block l's tensor i, ln_f's weight and bias.
static inline int gpt_num_tensors(const gpt_config *c) { return 4 + GPT_BLOCK_TENSORS * c->n_layer; }
static inline int gpt_block_tensor(int layer, int i) { return 2 + layer * GPT_BLOCK_TENSORS + i; }
static inline int gpt_ln_f_tensor(const gpt_config *c) { return 2 + GPT_BLOCK_TENSORS * c->n_layer; }

// Appends one tensor of rows x cols (cols 0: a vector) at offset *total.
static inline void gpt_layout_add(gpt_tensor *out, int *n, size_t *total, const char *name, size_t rows,
                                  size_t cols) {
    if (out) {
        gpt_tensor *t = &out[*n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->ndim = cols > 0 ? 2 : 1;
        t->shape[0] = (int)rows;
        t->shape[1] = (int)cols;
        t->count = rows * (cols > 0 ? cols : 1);
        t->offset = *total;
        t->decay = cols > 0;
    }
    *total += rows * (cols > 0 ? cols : 1);
    (*n)++;
}

// Fills out[0 .. gpt_num_tensors) (out may be NULL: only count) and returns
// the number of parameters, the length of the flat array.
static inline size_t gpt_layout_params(const gpt_config *c, gpt_tensor *out) {
    size_t C = (size_t)c->n_embd, total = 0;
    int n = 0;
    gpt_layout_add(out, &n, &total, "wte.weight", (size_t)c->vocab_size, C);
    gpt_layout_add(out, &n, &total, "wpe.weight", (size_t)c->block_size, C);
    for (int l = 0; l < c->n_layer; l++)
        for (int i = 0; i < GPT_BLOCK_TENSORS; i++) {
            char name[48];
            snprintf(name, sizeof name, "h.%d.%s", l, gpt_block_layout[i].name);
            gpt_layout_add(out, &n, &total, name, gpt_block_layout[i].rows * C, gpt_block_layout[i].cols * C);
        }
    gpt_layout_add(out, &n, &total, "ln_f.weight", C, 0);
    gpt_layout_add(out, &n, &total, "ln_f.bias", C, 0);
    return total;
}

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
static inline size_t gpt_block_params(const gpt_config *c) {
    size_t C = (size_t)c->n_embd, total = 0;
    for (int i = 0; i < GPT_BLOCK_TENSORS; i++)
        total += gpt_block_layout[i].rows * C * (gpt_block_layout[i].cols ? gpt_block_layout[i].cols * C : 1);
    return total;
}
static inline size_t gpt_block_offset(const gpt_config *c, int layer) {
    return gpt_embedding_params(c) + (size_t)layer * gpt_block_params(c);
}

// Bucket k of gpt_layout_buckets (0 <= k < n_layer + 2).
static inline gpt_bucket gpt_layout_bucket(const gpt_config *c, int k) {
    int L = c->n_layer;
    gpt_bucket b;
    if (k == 0) { // ln_f: its weight and bias follow the last block
        b.offset = gpt_block_offset(c, L), b.count = 2 * (size_t)c->n_embd;
        snprintf(b.name, sizeof b.name, "ln_f");
    } else if (k <= L) { // block L-k
        b.offset = gpt_block_offset(c, L - k), b.count = gpt_block_params(c);
        snprintf(b.name, sizeof b.name, "h.%d", L - k);
    } else {
        b.offset = 0, b.count = gpt_embedding_params(c);
        snprintf(b.name, sizeof b.name, "wte+wpe");
    }
    return b;
}

// Fills up to max buckets (out may be NULL); returns how many there are (n_layer + 2).
static inline int gpt_layout_buckets(const gpt_config *c, gpt_bucket *out, int max) {
    int n = c->n_layer + 2;
    for (int k = 0; out && k < n && k < max; k++) out[k] = gpt_layout_bucket(c, k);
    return n;
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

// Elements of block activation `a` for a batch of B x T tokens.
static inline size_t gpt_block_act_size(const gpt_config *c, int a, size_t B, size_t T) {
    size_t N = B * T, C = (size_t)c->n_embd, NH = (size_t)c->n_head;
    switch (a) {
    case A_LN1_MEAN: case A_LN1_RSTD: case A_LN2_MEAN: case A_LN2_RSTD: return N;
    case A_QKV: return 3 * N * C;
    case A_ATT: return B * NH * T * T;
    case A_ATT_LSE: return NH * N;
    case A_FCH: case A_FCH_GELU: return 4 * N * C;
    default: return N * C;
    }
}

// Does a model whose attention is `flash` (or not) keep activation a?
static inline bool gpt_block_act_kept(int a, bool flash) {
    gpt_act_when w = gpt_block_acts_layout[a].when;
    return w == GPT_KEPT_ALWAYS || (w == GPT_KEPT_BY_FLASH) == flash;
}

// Elements one block keeps of one kind.
static inline size_t gpt_block_acts_size(const gpt_config *c, gpt_act_kind kind, bool flash, size_t B, size_t T) {
    size_t total = 0;
    for (int a = 0; a < GPT_BLOCK_ACTS; a++)
        if (gpt_block_acts_layout[a].kind == kind && gpt_block_act_kept(a, flash)) total += gpt_block_act_size(c, a, B, T);
    return total;
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
// residual stream, dtmp (N,C), dqkv (N,3C), dhidden (N,4C).
enum { G_DRES, G_DTMP, G_DQKV, G_DHIDDEN, GPT_GRAD_ACTS };
static const int gpt_grad_acts_channels[GPT_GRAD_ACTS] = {1, 1, 3, 4}; // times C per position

static inline size_t gpt_grad_acts_size(const gpt_config *c, size_t B, size_t T) {
    size_t total = 0;
    for (int g = 0; g < GPT_GRAD_ACTS; g++) total += (size_t)gpt_grad_acts_channels[g] * B * T * (size_t)c->n_embd;
    return total;
}

#ifdef __cplusplus
}
#endif

#endif
