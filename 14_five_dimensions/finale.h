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
#include "gather_whole.h"
#include "gpt.h"
#include "groups.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "pipeline.h"
#include "zero.h"
#include "zero_devices.h"

// ===================================================================== options

// Chapter 12's and 13's flags, as they spell them, and 09's ZeRO flags
// (stage 1 only: see finale_refuse).
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
    flag_int(set, "shard", &o->shard, 0, 3,
             "ZeRO over dp (chapter 09): 0 none, 1 AdamW's moments of each rank's part in dp slices (2, 3: refused)");
    flag_int(set, "replicate", &o->replicate, 1, 256,
             "hybrid sharding (chapter 09): the dp ranks as R replicas, each slicing over dp/R; needs --shard 1");
}

// On GPUs the finale runs the shapes whose GPU paths the chapters wrote:
// dp x tp x pp (10's tensor-parallel blocks, 11's stages, composed there
// already) and dp x cp (12's attention, with tp = pp = 1). The rest is
// refused, one line each, naming what is not written.
static inline void finale_refuse_gpu(flag_set *set, const options *o) {
    if (strcmp(o->device, "cuda")) return;
    if (o->ep > 1)
        flags_fail(set, "--device cuda with --ep %d: the finale does not compose 13's GPU expert exchanges with "
                        "its other dimensions yet (13 runs them alone); use --ep 1, chapter 13, or --device cpu", o->ep);
    if (o->n_expert && (o->tp > 1 || o->pp > 1 || o->cp > 1))
        flags_fail(set, "--device cuda with --n_expert %d and --tp %d --pp %d --cp %d: 13's GPU mixture runs in a whole "
                        "model on one GPU, not in a tp shard, a stage or a cp rank's tokens; use --device cpu",
                   o->n_expert, o->tp, o->pp, o->cp);
    if (o->cp > 1 && (o->tp > 1 || o->pp > 1))
        flags_fail(set, "--device cuda with --cp %d and --tp %d --pp %d: 12's GPU attention across cp ranks takes "
                        "neither a tp shard's heads nor a pipeline stage; use --tp 1 --pp 1, or --device cpu",
                   o->cp, o->tp, o->pp);
}

// What cannot work, each in one line with the reason (flags_fail: exit 2).
static inline void finale_refuse(flag_set *set, const options *o) {
    if (o->shard > 1 && o->pp > 1)
        flags_fail(set, "--shard %d with --pp %d: a stage's gradients are final only after all its micro-batches, and "
                        "ZeRO-2 and 3 reduce-scatter them on each; DeepSpeed and Megatron-LM allow only ZeRO-1 with "
                        "pipeline stages: use --shard 1", o->shard, o->pp);
    if (o->shard > 1)
        flags_fail(set, "--shard %d: ZeRO-2 and 3 scatter and gather a whole model's buckets inside its passes (09's "
                        "bucket hook), and a rank's part here is cut by tp and ep; use --shard 1", o->shard);
    if (o->replicate > 1 && !o->shard)
        flags_fail(set, "--replicate %d needs --shard 1: with --shard 0 there are no slices to replicate", o->replicate);
    if (o->shard && !strcmp(o->device, "cuda"))
        flags_fail(set, "--shard %d with --device cuda: ZeRO in the finale is written for CPU ranks (its clipping "
                        "norm reads the slices on the host); use --device cpu", o->shard);
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
    int dp = o->dp ? o->dp : o->nprocs / per_replica;
    if (o->replicate > 1 && dp > 0 && dp % o->replicate)
        flags_fail(set, "--replicate %d does not divide the %d dp ranks (hybrid sharding splits dp)", o->replicate, dp);
    if (o->capacity_groups > o->batch_size)
        flags_fail(set, "--capacity_groups %d: more groups than the %d sequences of a micro-batch", o->capacity_groups,
                   o->batch_size);
    finale_refuse_gpu(set, o);
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
    model_create_keeping(model, part, d, precision, o->batch_size, o->block_size, zero_model_keeps(o->shard));
    if (g->size[DIM_TP] > 1) model_tensor_parallel(model, g->group[DIM_TP]);
    model_context_parallel(model, g->group[DIM_CP], o->cp_attention, o->cp_balance);
    if (g->size[DIM_EP] > 1) model_expert_parallel(model, g->group[DIM_EP], expert_replicas);
}

// ===================================================================== clipping

// The squares of gradients g, which hold the model's flat array from
// `first` on for `count` numbers, by kind: tp-split, experts, the rest;
// tensors before `from` left out (the last stage's copy of wte).
static inline void finale_square_sums(const gpt_t *h, const gpt_real *g, size_t first, size_t count, size_t from,
                                      double sums[3]) {
    for (int t = 0; t < h->num_tensors; t++) {
        const gpt_tensor *ten = &h->tensors[t];
        if (ten->count == 0 || ten->offset < from) continue;
        size_t lo = ten->offset > first ? ten->offset : first, end = ten->offset + ten->count;
        size_t hi = end < first + count ? end : first + count;
        double sum = 0;
        for (size_t i = lo; i < hi; i++) sum += (double)g[i - first] * g[i - first];
        sums[gpt_tensor_is_expert(h, t) ? 1 : ten->split != GPT_REPLICATED ? 0 : 2] += sum;
    }
}

// The norm of the whole model's gradient, each number counted once: a
// tensor cut by tp is summed over the tp group, an expert over the ep group
// (each rank holds other experts; they are whole on every tp rank), the
// rest is the same on every tp and ep rank and counted as it is; then the
// stages add theirs. cp and dp ranks hold the same averaged numbers:
// nothing to add there. Returns the sum of squares.
static inline double finale_square_total(const groups_t *g, double sums[3]) {
    if (g->size[DIM_TP] > 1) pg_all_reduce(g->group[DIM_TP], &sums[0], &sums[0], 1, DTYPE_F64, OP_SUM);
    if (g->size[DIM_EP] > 1) pg_all_reduce(g->group[DIM_EP], &sums[1], &sums[1], 1, DTYPE_F64, OP_SUM);
    double total = sums[0] + sums[1] + sums[2];
    if (g->size[DIM_PP] > 1) pg_all_reduce(g->group[DIM_PP], &total, &total, 1, DTYPE_F64, OP_SUM);
    return total;
}

// Clipping by that norm, each rank its whole gradient. On a GPU ep is 1
// (finale_refuse_gpu): no expert is cut, and this is 11's clipping
// (model_clip_grad_norm_over), its sums on the device.
static inline void finale_clip(model_t *m, const groups_t *g, size_t from, float max_norm) {
    if (m->on_gpu) {
        model_clip_grad_norm_over(m, g->group[DIM_PP], from, max_norm);
        return;
    }
    double sums[3] = {0, 0, 0};
    finale_square_sums(&m->host, m->host.grads, 0, m->host.num_params, from, sums);
    gpt_clip_grads(&m->host, finale_square_total(g, sums), max_norm);
}

// ===================================================================== ZeRO over dp (chapter 09)
//
// With --shard 1 each rank keeps AdamW's moments of 1/dp of its part
// (zero.h: a part is one bucket), dp being the one dimension along which
// every rank holds the very same numbers of a part - the same stage, tp
// shard AND experts. So before the slices' reduce-scatter over dp, the
// gradient is averaged over what the rest of the "dp ep cp" and "dp cp"
// groups add: the dense ones over ep x cp, the experts summed over cp
// (14_five_dimensions.c joins the groups without dp). Megatron-LM's
// distributed optimizer slices over dp x cp too; here that would cut the
// experts' and the dense gradients' slices over two different groups,
// and 09's zero_setup takes one. --replicate R splits dp as 09 does
// (groups_split): slices within dp/R ranks, averaged across the R replicas.
// Returns NULL with --shard 0.
static inline zero_t *finale_zero(zero_t *z, pipeline_t *p, model_t *m, const options *o) {
    if (!o->shard) return NULL;
    pg_t *replicate, *shard;
    groups_split(&p->g, DIM_DP, o->replicate, &replicate, &shard);
    zero_setup(z, o->shard, p->g.dist, m, o->grad_accum, zero_ops_for(m), shard, replicate);
    zero_moments_from_host(z); // resumed from a whole snapshot: this rank's slices of its part's moments
    return z;
}

// The clipping factor from the slices: each rank's squares by kind, added
// up over the shard group (its slices are the whole part; a replica's are
// the same again), then over tp, ep and pp as finale_clip adds them.
static inline float finale_zero_clip(zero_t *z, const groups_t *g, size_t from, float max_norm) {
    double sums[3] = {0, 0, 0};
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        finale_square_sums(&z->model->host, z->grads + b->at, b->first, b->owned, from, sums);
    }
    zero_count(z, COMM_ALL_REDUCE, 2.0 * (z->world - 1) / z->world * sizeof sums);
    groups_all_reduce_host(z->shard, &z->dist->device, sums, 3, DTYPE_F64, OP_SUM);
    double norm = sqrt(finale_square_total(g, sums));
    return max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

// What ZeRO-1 held and sent on this rank, measured (zero.h counts its
// allocations and its calls in training steps, at a ring's bytes), beside
// what the whole part's moments would take; rank 0 prints its own, each
// rank's part being another stage, tp shard or experts. Then the
// planner's rows (gpt/plan.h; --plan prints them for the same flags): the
// model's own buffers and messages as pipeline.h measures them, the
// gradients' all-reduce over ep x cp only (the dense group without dp),
// and zero.h's: its slices of the gradients and of AdamW's moments, its
// staging buffer (a comm buffer), and in dp's column its reduce-scatter,
// all-gather and the replicas' all-reduce (clipping's sums left out, as
// the plan leaves out the 8-byte norms).
static inline void finale_zero_report(const zero_t *z, pipeline_t *p) {
    int steps = z->steps_counted > 0 ? z->steps_counted : 1;
    log_main("sharding measured (rank 0's part, %zu parameters): optimizer state %zu bytes in slices (whole: %zu), "
             "slices of the gradients %zu, staging %zu; sent per step: reduce_scatter %.0f, all_gather %.0f, "
             "replicas' all_reduce %.0f, clipping's sums %.0f bytes\n",
             z->num_params, z->mem[MEM_OPTIMIZER], 2 * z->num_params * sizeof(float), z->mem[MEM_GRADS],
             z->mem[MEM_OTHER], z->sent[COMM_REDUCE_SCATTER] / steps, z->sent[COMM_ALL_GATHER] / steps,
             z->sent[COMM_REPLICAS] / steps, z->sent[COMM_ALL_REDUCE] / steps);
    if (p->steps == 0) return; // a resumed run with no step left to take (every rank alike)
    plan_rank row = pipe_plan_row(p, z->model, 1);
    row.mem[PLAN_PARAMS] += (double)z->mem[MEM_PARAMS];
    row.mem[PLAN_GRADS] += (double)z->mem[MEM_GRADS];
    row.mem[PLAN_OPTIMIZER] += (double)z->mem[MEM_OPTIMIZER];
    row.mem[PLAN_COMM] += (double)(z->mem[MEM_OTHER] + z->mem[MEM_GATHERED]);
    row.sent[PLAN_DP] += (z->sent[COMM_REDUCE_SCATTER] + z->sent[COMM_ALL_GATHER] + z->sent[COMM_REPLICAS]) / steps;
    plan_report_measured(p->g.dist, p->stage, p->stages, &row);
}

// The whole model on rank 0 (gather_whole); with ZeRO the moments'
// slices are first gathered into each part's host copy, and dropped after.
static inline bool finale_gather_whole(model_t *m, groups_t *g, zero_t *z, bool moments, gpt_t *whole) {
    if (z && moments) zero_moments_to_host(z);
    bool mine = gather_whole(m, g, moments, whole);
    if (z && moments) zero_drop_host_moments(z);
    return mine;
}

#endif
