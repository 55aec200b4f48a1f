// ep_report.h - chapter 13's helpers around the lesson: a rank takes its
// experts of a whole model (a snapshot's, on resume), and, after training,
// the routing, traffic, memory and time tables, measured, beside the
// formulas (README.md, "The tables").
//
// Not the lesson - the training program (13_expert_parallel.c) and the
// layer (gpt/moe.h) are - but what shows that it holds: where the tokens
// went, what the all-to-alls moved, what a rank holds.
#ifndef EP_REPORT_H
#define EP_REPORT_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "groups.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "plan_measured.h"

// The layout, as the metrics' title line and the snapshot's "mesh" say it.
static inline const char *ep_mesh_text(const groups_t *g) {
    static char text[64];
    snprintf(text, sizeof text, "dp %d x ep %d", g->size[DIM_DP], g->size[DIM_EP]);
    return text;
}

// The model's configuration from the flags: 08's, and the mixture's.
static inline gpt_config ep_config(const options *o, int vocab_size, int ep) {
    gpt_config c = gpt_config_of(vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd);
    c.n_expert = o->n_expert, c.top_k = o->moe_top_k, c.ep = ep, c.capacity_groups = o->capacity_groups;
    c.capacity_factor = (float)o->capacity_factor, c.aux_loss_coef = (float)o->aux_loss_coef;
    return c;
}

// What the mixture's GPU path does not do, refused in one line (exit 2):
// fp16 (its loss scale does not reach the balancing loss's gradient).
static inline void ep_check_gpu(flag_set *set, const options *o) {
    if (strcmp(o->device, "cuda") != 0) return;
    if (o->n_expert && !strcmp(o->precision, "fp16"))
        flags_fail(set, "--precision fp16 with --n_expert %d: the mixture trains in fp32 or bf16 on a GPU (fp16's loss "
                   "scale does not reach the balancing loss's gradient)", o->n_expert);
}

// This rank's experts (ep rank `ep_rank`) of the whole model's parameters
// and, once a step was taken, AdamW's moments and step.
static inline void take_experts(model_t *m, const gpt_t *whole, int ep_rank) {
    gpt_t *h = &m->host;
    gpt_expert_shard_copy(h, ep_rank, whole->params, h->params, true);
    h->adam_step = whole->adam_step;
    if (whole->adam_step > 0) {
        if (!h->adam_m) h->adam_m = xcalloc(h->num_params, sizeof(gpt_real));
        if (!h->adam_v) h->adam_v = xcalloc(h->num_params, sizeof(gpt_real));
        gpt_expert_shard_copy(h, ep_rank, whole->adam_m, h->adam_m, true);
        gpt_expert_shard_copy(h, ep_rank, whole->adam_v, h->adam_v, true);
    }
    model_to_device(m);
}

// A row of routing.csv in --out_dir per layer, at every progress line:
// step, layer, the smallest and largest share of the assignments an
// expert got since the last row (all ranks; even: 1/E), the share dropped,
// the layer's balancing loss (the ranks' mean). make plots draws them
// (plots/13_balance.gp). Every rank calls it at the same steps.
static inline void report_routing(model_t *m, pg_t *all, const device_t *dev, const options *o, int step) {
    gpt_t *h = &m->host;
    if (!h->cfg.n_expert || !h->moe) return;
    static double *last; // the counts at the last row
    static FILE *csv;
    int L = h->cfg.n_layer, E = h->cfg.n_expert;
    size_t n = (size_t)L * E + (size_t)L;
    double *now = xcalloc(n, sizeof(double));
    if (!last) last = xcalloc(n, sizeof(double));
    memcpy(now, h->moe->stats.routed, sizeof(double) * (size_t)L * E);
    memcpy(now + (size_t)L * E, h->moe->stats.dropped, sizeof(double) * (size_t)L);
    groups_all_reduce_host(all, dev, now, n, DTYPE_F64, OP_SUM); // host numbers, through the device's memory (NCCL)
    if (pg_rank(all) == 0 && !csv) {
        char path[1100];
        snprintf(path, sizeof path, "%s/routing.csv", o->out_dir);
        csv = fopen(path, "w");
        if (!csv) die("cannot write %s: %s", path, strerror(errno));
        fprintf(csv, "step,layer,min_share,max_share,dropped,experts,aux_loss_coef,capacity_factor\n");
    }
    for (int l = 0; csv && l < L; l++) {
        double total = 0, lo = 1e300, hi = 0;
        for (int e = 0; e < E; e++) total += now[(size_t)l * E + e] - last[(size_t)l * E + e];
        for (int e = 0; e < E && total > 0; e++) {
            double share = (now[(size_t)l * E + e] - last[(size_t)l * E + e]) / total;
            lo = share < lo ? share : lo, hi = share > hi ? share : hi;
        }
        double dropped = now[(size_t)L * E + l] - last[(size_t)L * E + l];
        if (total > 0)
            fprintf(csv, "%d,%d,%.5f,%.5f,%.5f,%d,%g,%g\n", step, l, lo, hi, dropped / total, E, o->aux_loss_coef,
                    o->capacity_factor);
    }
    if (csv) fflush(csv);
    memcpy(last, now, sizeof(double) * n);
    free(now);
}

// The planner's rows (gpt/plan.h; --plan prints them for the same flags):
// this rank's buffers by kind (its experts' rows and routing among the
// activations), and per step the rows it sent to other ranks of its ep
// group (moe.h's counters) and the gradients' all-reduces: the dense ones
// over dp x ep (what entered DDP's), the experts' over dp (their replicas),
// each at what a ring sends.
static inline void ep_report_plan_rows(model_t *m, groups_t *g, pg_t *all, int steps) {
    if (m->on_gpu && g->size[DIM_EP] > 1) { // the GPU's exchanges count every row, not those for other ranks
        log_main("planner rows: not measured with --ep > 1 on GPUs (their exchanges count all rows passed, not those "
                 "for other ranks)\n");
        return;
    }
    plan_rank row = {{0}, {0}};
    plan_measure_model(m, 1, row.mem);
    row.sent[PLAN_EP] = plan_measured_ep_bytes(m) / steps;
    row.sent[PLAN_DP] = plan_ring_all_reduce((double)ddp_bytes_reduced() / steps, pg_world_size(all)) +
                        plan_ring_all_reduce(plan_measured_expert_grad_bytes(m), g->size[DIM_DP]);
    plan_report_measured(g->dist, 0, 1, &row);
}

// The tables, at the end of training (every rank calls it: the numbers are
// summed over the job). `steps`: the training steps they cover.
static inline void report_experts(model_t *m, groups_t *g, pg_t *all, const options *o, int steps) {
    gpt_t *h = &m->host;
    if (steps < 1) return;
    ep_report_plan_rows(m, g, all, steps);
    if (!h->cfg.n_expert || !h->moe) return;
    const gpt_moe_stats *s = &h->moe->stats;
    int L = h->cfg.n_layer, E = h->cfg.n_expert, K = h->cfg.top_k, El = gpt_moe_local(&h->cfg);
    double C = h->cfg.n_embd, W = pg_world_size(all), N = (double)o->batch_size * o->block_size;
    size_t n = (size_t)L * E + (size_t)L + 4;
    double *sum = xcalloc(n, sizeof(double));
    memcpy(sum, s->routed, sizeof(double) * (size_t)L * E);
    memcpy(sum + (size_t)L * E, s->dropped, sizeof(double) * (size_t)L);
    sum[n - 4] = s->sent[0], sum[n - 3] = s->sent[1], sum[n - 2] = s->assignments, sum[n - 1] = s->aux_sum;
    groups_all_reduce_host(all, &g->dist->device, sum, n, DTYPE_F64, OP_SUM); // host numbers, through the device's memory
    // Routing: each layer's share of the assignments per expert, and the drops.
    log_main("routing (%d steps, all ranks): the share of the assignments each expert got (even: %.1f%%), and "
             "those dropped\n", steps, 100.0 / E);
    for (int l = 0; l < L; l++) {
        char line[2048];
        int at = snprintf(line, sizeof line, "  layer %d:", l);
        double total = 0, lo = 1e300, hi = 0;
        for (int e = 0; e < E; e++) total += sum[(size_t)l * E + e];
        for (int e = 0; e < E && at < (int)sizeof line - 16; e++) {
            double share = total > 0 ? sum[(size_t)l * E + e] / total : 0;
            lo = share < lo ? share : lo, hi = share > hi ? share : hi;
            at += snprintf(line + at, sizeof line - (size_t)at, " %5.1f%%", 100 * share);
        }
        log_main("%s | min %.1f%% max %.1f%% | dropped %.2f%%\n", line, 100 * lo, 100 * hi,
                 total > 0 ? 100 * sum[(size_t)L * E + l] / total : 0);
    }
    log_main("routing: balancing loss %.4f per layer (1: even; mean over the steps and ranks), coefficient %g\n",
             sum[n - 1] / (W * s->passes * L), h->cfg.aux_loss_coef);
    // Traffic: what the all-to-alls passed, against K x tokens x C each way per layer.
    double dropped = 0;
    for (int l = 0; l < L; l++) dropped += sum[(size_t)L * E + l];
    double formula = 2.0 * L * K * N * C * o->grad_accum * W, kept = formula - 2.0 * C * dropped / steps;
    double bytes = m->precision == GPT_BF16 ? 2 : 4; // a row's numbers travel as the activations are held
    if (m->on_gpu && gpt_ep_ways(h->cfg.ep) == 1) // every expert on each GPU: the rows are gathered in its memory
        log_main("traffic: none - each GPU holds every expert (ep 1), its rows gathered in its own memory; the "
                 "formula for ep > 1 would be 2 x L x K x B x T x C x grad_accum x ranks = %.0f each way, %.0f less "
                 "the dropped rows\n", formula, kept);
    else
        log_main("traffic per step, all %.0f ranks: forward %.0f numbers (%.2f MiB), backward %.0f (%.2f MiB) passed "
                 "to the all-to-alls (each rank's block to itself included); formula 2 x L x K x B x T x C x "
                 "grad_accum x ranks = %.0f each way (dispatch and return), %.0f less the dropped rows\n", W,
                 sum[n - 4] / steps, bytes * sum[n - 4] / steps / 1048576, sum[n - 3] / steps,
                 bytes * sum[n - 3] / steps / 1048576, formula, kept);
    // Memory: the experts a rank holds, against E/ep of them.
    double expert = 0;
    for (int t = 0; t < h->num_tensors; t++)
        if (gpt_tensor_is_expert(h, t)) expert += (double)h->tensors[t].count;
    log_main("per rank: %.0f expert parameters (%d of %d experts per layer); formula L x E/ep x (8C^2 + 5C) = %.0f; "
             "dense %.0f; the mixture's buffers %.2f MiB (measured%s)\n", expert, El, E,
             L * (double)El * (8 * C * C + 5 * C), (double)h->num_params - expert, (double)gpt_moe_bytes(h) / 1048576,
             m->on_gpu ? " on the CPU: a GPU's are in its memory plan" : "");
    if (m->on_gpu) {
        log_main("time per step: not split on a GPU (its kernels are queued, not timed one by one)\n");
        free(sum);
        return;
    }
    log_main("time per step on rank %d: routing %.2f ms, dispatch %.2f ms (the all-to-alls), experts %.2f ms, combine "
             "%.2f ms (forward and backward)\n", g->rank, 1e3 * s->seconds[MOE_ROUTING] / steps,
             1e3 * s->seconds[MOE_DISPATCH] / steps, 1e3 * s->seconds[MOE_EXPERTS] / steps,
             1e3 * s->seconds[MOE_COMBINE] / steps);
    free(sum);
}

#endif
