// tp_report.h - chapter 10's checks and reports: the replicas checked byte
// for byte, and what one rank holds and sends, measured, beside the
// formulas (README.md, "What a rank holds and sends").
//
// Not the lesson - the training program (10_tensor_parallel.c) is - but
// what shows that the lesson holds: a tensor-parallel run is still a
// data-parallel one along dp, its tp ranks agree where they must, and the
// memory and traffic are what the arithmetic says.
#ifndef TP_REPORT_H
#define TP_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "ddp.h"
#include "groups.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "plan_measured.h"

// The layout, as the metrics' title line and the snapshot's "mesh" say it.
static inline const char *tp_mesh_text(const groups_t *g) {
    static char text[64];
    snprintf(text, sizeof text, "dp %d x tp %d", g->size[DIM_DP], g->size[DIM_TP]);
    return text;
}

// The promises of this layout, checked byte for byte, as ddp_check_replicas
// checks chapter 04's: on the ranks of a tp group the replicated tensors
// (embeddings, LayerNorms, the row-parallel biases) have the same gradients
// and the same values - every rank computed them from the same numbers -
// and on the ranks of a dp group every tensor of the shard has the same
// averaged gradient and value (data parallelism's rules 2 and 3). A
// difference stops the job, naming the tensor and the ranks.
static inline void check_replicas(model_t *m, groups_t *g, int step) {
    const gpt_real *grads = model_grads_to_host(m);
    model_to_host(m);
    const gpt_t *h = &m->host;
    const device_t *dev = &g->dist->device;
    int tp = g->size[DIM_TP], dp = g->size[DIM_DP];
    size_t n = 2 * (size_t)h->num_tensors; // per tensor: its gradient's checksum, its values'
    int64_t *mine = xmalloc(sizeof(int64_t) * n);
    int64_t *tp_all = xmalloc(sizeof(int64_t) * n * (size_t)tp);
    int64_t *dp_all = xmalloc(sizeof(int64_t) * n * (size_t)dp);
    for (int t = 0; t < h->num_tensors; t++) {
        size_t bytes = sizeof(gpt_real) * h->tensors[t].count;
        mine[2 * t] = (int64_t)checksum_bytes(grads + h->tensors[t].offset, bytes);
        mine[2 * t + 1] = (int64_t)checksum_bytes(h->params + h->tensors[t].offset, bytes);
    }
    groups_all_gather_host(g->group[DIM_TP], dev, mine, tp_all, n, DTYPE_I64);
    groups_all_gather_host(g->group[DIM_DP], dev, mine, dp_all, n, DTYPE_I64);
    static const char *const what[2] = {"gradient", "values"}, *const differ[2] = {"differs", "differ"};
    for (size_t k = 0; k < n; k++) {
        const char *name = h->tensors[k / 2].name;
        for (int r = 1; r < tp && h->tensors[k / 2].split == GPT_REPLICATED; r++)
            if (tp_all[(size_t)r * n + k] != tp_all[k])
                die("after step %d the %s of %s, a replicated tensor, %s between tp ranks 0 and %d of rank %d's "
                    "tp group: every rank must compute it from the same numbers", step, what[k % 2], name,
                    differ[k % 2], r, g->rank);
        for (int r = 1; r < dp; r++)
            if (dp_all[(size_t)r * n + k] != dp_all[k])
                die("after step %d the %s of %s %s between dp ranks 0 and %d of rank %d's dp group: the "
                    "replicas of a shard diverged", step, what[k % 2], name, differ[k % 2], r, g->rank);
    }
    free(mine), free(tp_all), free(dp_all);
}

// After check_replicas at the end of training: that the replicas held, and
// what one rank holds and sends, measured, beside the formulas. V
// vocabulary, T block, C channels, L layers, NH heads, B x T tokens per
// micro-batch (N = B T). `tp_sent`: the numbers and the bytes the model
// all-reduced over tp in `steps` training steps (measured around them:
// validation's forward passes all-reduce too).
static inline void report_memory_and_traffic(model_t *m, const groups_t *g, const options *o, const double tp_sent[2],
                                             int steps) {
    log_main("replicas: the replicated tensors' gradients and values are the same bytes on the ranks of each tp "
             "group, and every shard on the ranks of each dp group\n");
    const gpt_t *h = &m->host;
    double V = h->cfg.vocab_size, Tb = h->cfg.block_size, C = h->cfg.n_embd, L = h->cfg.n_layer;
    double NH = h->cfg.n_head, tp = g->size[DIM_TP], B = o->batch_size, T = o->block_size, N = B * T;
    double params = (V + Tb) * C + 2 * C + L * (6 * C + (12 * C * C + 7 * C) / tp);
    log_main("per rank: parameters %zu numbers; formula (V+T)C + 2C + L(6C + (12C^2+7C)/tp) = %.0f; with their "
             "gradients and AdamW's two moments %.2f MiB (16 bytes each)\n", h->num_params, params,
             16.0 * (double)h->num_params / 1048576);
    size_t held = 0;
    const char *where = model_activation_bytes(m, &held);
    double acts = 3 * N * C + 3 * N + L * (4 * N * C + 4 * N + 12 * N * C / tp + B * (NH / tp) * T * T) + N * V +
                  2 * N * C + 7 * N * C / tp;
    if (!m->on_gpu)
        log_main("per rank: activations and their gradients %.2f MiB (%s); formula, in floats, 3NC + 3N + L(4NC + 4N "
                 "+ 12NC/tp + B(NH/tp)T^2) + NV + 2NC + 7NC/tp = %.2f MiB\n", (double)held / 1048576, where,
                 acts * sizeof(gpt_real) / 1048576);
    else
        log_main("per rank: the GPU model's buffers %.2f MiB (%s)\n", (double)held / 1048576, where);
    double numbers = tp > 1 ? 4 * L * N * C * o->grad_accum : 0, dp = g->size[DIM_DP];
    double per_step = steps > 0 ? tp_sent[0] / steps : 0, bytes_per_step = steps > 0 ? tp_sent[1] / steps : 0;
    log_main("per rank and step: tp all-reduces of %.0f numbers (%.2f MiB) measured; formula 4 x L x B x T x C x "
             "grad_accum (0 with tp 1) = %.0f; dp all-reduce of the shard's gradients %.0f numbers (%.2f MiB; 0 with "
             "dp 1); a ring all-reduce sends 2(n-1)/n of what it sums from every rank\n", per_step,
             bytes_per_step / 1048576, numbers, dp > 1 ? (double)h->num_params : 0,
             dp > 1 ? 4.0 * (double)h->num_params / 1048576 : 0);
    // The same as the planner's rows (gpt/plan.h; --plan prints them for
    // the same flags): this rank's buffers by kind, and what it sent per
    // step over tp and dp, at what a ring sends for each all-reduce.
    plan_rank row = {{0}, {0}};
    plan_measure_model(m, 1, row.mem);
    if (steps > 0) {
        row.sent[PLAN_TP] = plan_ring_all_reduce(tp_sent[1] / steps, (int)tp);
        row.sent[PLAN_DP] = plan_ring_all_reduce((double)ddp_bytes_reduced() / steps, (int)dp);
    }
    plan_report_measured(g->dist, 0, 1, &row);
}

#endif
