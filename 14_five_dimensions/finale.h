// finale.h - chapter 14's machinery around its lesson: the flags of
// chapters 12 and 13 beside 11's, what cannot be composed (refused in one
// line with the reason), this rank's part of the model, and the clipping
// norm over the three dimensions that cut the model. The lesson - which
// ranks share what, and over which group each gradient is averaged - is in
// 14_five_dimensions.c.
//
// The mesh is common/groups.h's, pp x dp x ep x cp x tp (tp fastest, as
// Megatron-LM orders them). A rank's coordinates say what it holds:
//   pp  which blocks (a pipeline stage, chapter 11)
//   tp  which part of each block's matrices (chapter 10)
//   ep  which experts of each mixture-of-experts block (chapter 13)
//   cp  which tokens of each sequence it computes (chapter 12; the weights whole)
//   dp  which replica it is (chapters 04-08)
// and which data it reads: dp x ep ranks read different batches, the cp
// ranks of one replica read the same sequences (each keeps its tokens),
// and the tp and pp ranks of one replica compute one model together.
#ifndef FINALE_H
#define FINALE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flags.h"
#include "gpt.h"
#include "groups.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "pipeline.h"

// ===================================================================== options

// Chapter 12's and 13's flags, as they spell them, and 09's ZeRO flags
// (refused beyond stage 0: see finale_refuse).
static inline void finale_add_flags(flag_set *set, options *o) {
    flag_choice(set, "cp_attention", &o->cp_attention, "ring|ulysses",
                "ring: key/value blocks passed around the cp ranks; ulysses: all-to-alls swap tokens for heads");
    flag_choice(set, "cp_balance", &o->cp_balance, "zigzag|none",
                "zigzag: cp rank r holds chunks r and 2cp-1-r of each sequence; none: chunk r");
    flag_int(set, "n_expert", &o->n_expert, 0, 1024, "experts in each block's place of the MLP (0: the dense MLP)");
    flag_int(set, "moe_top_k", &o->moe_top_k, 1, 1024, "experts each token goes to (--top_k is sampling's)");
    flag_double(set, "capacity_factor", &o->capacity_factor, 0, 1000,
                "an expert takes at most f x its even share of a micro-batch's tokens (0: dropless)");
    flag_double(set, "aux_loss_coef", &o->aux_loss_coef, 0, 100, "weight of the load-balancing loss E x sum f_i P_i");
    flag_int(set, "capacity_groups", &o->capacity_groups, 1, 4096,
             "count capacity and balance over N groups of each micro-batch's sequences (one process standing for N)");
    flag_int(set, "shard", &o->shard, 0, 3, "ZeRO stage over dp (chapter 09): only 0 is composed here (see --help's README)");
    flag_int(set, "replicate", &o->replicate, 1, 256, "hybrid sharding's replicas (chapter 09): needs --shard");
}

// What cannot work, each in one line with the reason (flags_fail: exit 2).
static inline void finale_refuse(flag_set *set, const options *o) {
    if (o->shard > 0)
        flags_fail(set, "--shard %d: ZeRO over dp is not composed with the other four dimensions in this chapter yet "
                        "(chapter 09 runs it alone, with --replicate); use --shard 0", o->shard);
    if (o->replicate > 1) flags_fail(set, "--replicate %d: hybrid sharding needs --shard, which is 0 here", o->replicate);
    if (o->ep > 1 && !o->n_expert) flags_fail(set, "--ep %d spreads experts over ranks: give --n_expert", o->ep);
    gpt_config c = gpt_config_of(o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd);
    c.n_expert = o->n_expert, c.top_k = o->moe_top_k, c.ep = o->ep;
    const char *problem = gpt_config_problem(c);
    if (problem) flags_fail(set, "--n_expert %d --moe_top_k %d --ep %d: %s", o->n_expert, o->moe_top_k, o->ep, problem);
    // Ulysses gives every cp rank whole heads of the tp rank's heads.
    cp_kind kind = strcmp(o->cp_attention, "ulysses") ? CP_RING : CP_ULYSSES;
    cp_balance balance = strcmp(o->cp_balance, "none") ? CP_ZIGZAG : CP_CONTIGUOUS;
    problem = cp_problem(o->block_size, o->n_head / o->tp, o->cp, kind, balance);
    if (problem)
        flags_fail(set, "--cp %d with --block_size %d, %d heads per tp rank, --cp_attention %s: %s", o->cp,
                   o->block_size, o->n_head / o->tp, o->cp_attention, problem);
    int per_replica = o->pp * o->tp * o->cp * o->ep;
    if (o->nprocs % per_replica != 0)
        flags_fail(set, "--nprocs %d is not a multiple of --pp %d x --ep %d x --cp %d x --tp %d = %d", o->nprocs, o->pp,
                   o->ep, o->cp, o->tp, per_replica);
    if (o->capacity_groups > o->batch_size)
        flags_fail(set, "--capacity_groups %d: more groups than the %d sequences of a micro-batch", o->capacity_groups,
                   o->batch_size);
    if (!strcmp(o->device, "cuda"))
        flags_fail(set, "--device cuda: the finale composes its five dimensions on CPU ranks only (12's GPU attention "
                        "takes neither tp nor pp, 13's mixture has no GPU path); use --device cpu");
    if (strcmp(o->grad_compress, "none"))
        flags_fail(set, "--grad_compress %s: the dense and the expert gradients are averaged over different groups "
                        "here, and the hook compresses one model's; use none", o->grad_compress);
}

// The model's configuration: 08's sizes and 13's mixture.
static inline gpt_config finale_config(const options *o, int vocab_size) {
    gpt_config c = gpt_config_of(vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd);
    c.n_expert = o->n_expert, c.top_k = o->moe_top_k, c.capacity_groups = o->capacity_groups;
    c.capacity_factor = (float)o->capacity_factor, c.aux_loss_coef = (float)o->aux_loss_coef;
    return c;
}

// The layout, as the metrics' title line says it.
static inline const char *finale_mesh_text(const groups_t *g) {
    static char text[96];
    snprintf(text, sizeof text, "pp %d x dp %d x ep %d x cp %d x tp %d", g->size[DIM_PP], g->size[DIM_DP],
             g->size[DIM_EP], g->size[DIM_CP], g->size[DIM_TP]);
    return text;
}

// ===================================================================== this rank's part

// The whole model cut at this rank's coordinates (gpt_init_piece): its
// stage's blocks, its tp shard of them, its experts of each; then the model
// told whom to ask inside its layers - tp for the blocks' sums (10), cp
// for attention across the sequence (12), ep for the tokens' trips to their
// experts (13) and `expert_replicas` for the experts' gradients.
static inline void make_part(model_t *model, const gpt_t *whole, const pipeline_t *p, pg_t *expert_replicas,
                             const device_t *d, gpt_precision precision, const options *o) {
    const groups_t *g = &p->g;
    gpt_t part;
    gpt_init_piece(&part, whole, gpt_stage_of(&whole->cfg, p->stage, p->stages), g->size[DIM_TP], g->coord[DIM_TP],
                   g->size[DIM_EP], g->coord[DIM_EP]);
    model_create(model, part, d, precision, o->batch_size, o->block_size);
    if (g->size[DIM_TP] > 1) model_tensor_parallel(model, g->group[DIM_TP]);
    model_context_parallel(model, g->group[DIM_CP], o->cp_attention, o->cp_balance);
    if (g->size[DIM_EP] > 1) model_expert_parallel(model, g->group[DIM_EP], expert_replicas);
}

// ===================================================================== clipping

// The norm of the whole model's gradient, each number counted once: a
// tensor cut by tp is summed over the tp group, an expert over the ep group
// (each rank holds other experts; they are whole on every tp rank), the
// rest is the same on every tp and ep rank and counted as it is; then the
// stages add theirs (the last stage leaves out its copy of wte, `from`).
// cp and dp ranks hold the same averaged numbers: nothing to add there.
static inline float finale_clip(model_t *m, const groups_t *g, size_t from, float max_norm) {
    gpt_t *h = &m->host;
    double sums[3] = {0, 0, 0}; // tp-split, experts, the rest
    for (int t = 0; t < h->num_tensors; t++) {
        const gpt_tensor *ten = &h->tensors[t];
        if (ten->count == 0 || ten->offset < from) continue;
        double sum = 0;
        for (size_t i = ten->offset; i < ten->offset + ten->count; i++) sum += (double)h->grads[i] * h->grads[i];
        sums[gpt_tensor_is_expert(h, t) ? 1 : ten->split != GPT_REPLICATED ? 0 : 2] += sum;
    }
    if (g->size[DIM_TP] > 1) pg_all_reduce(g->group[DIM_TP], &sums[0], &sums[0], 1, DTYPE_F64, OP_SUM);
    if (g->size[DIM_EP] > 1) pg_all_reduce(g->group[DIM_EP], &sums[1], &sums[1], 1, DTYPE_F64, OP_SUM);
    double total = sums[0] + sums[1] + sums[2];
    if (g->size[DIM_PP] > 1) pg_all_reduce(g->group[DIM_PP], &total, &total, 1, DTYPE_F64, OP_SUM);
    return gpt_clip_grads(h, total, max_norm);
}

#endif
