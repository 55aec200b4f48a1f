// plan_measured.h - the measured side of the planner (gpt/plan.h): what a
// model allocated, in the planner's kinds, and the rows of the rank that
// holds the most, printed as --plan prints its own.
//
// The chapters' report headers count what they send (09: zero.h's calls;
// 10 and 11: the bytes their collectives and messages carried) and call
// these to print it beside what they hold.
#ifndef GPT_PLAN_MEASURED_H
#define GPT_PLAN_MEASURED_H

#include <string.h>

#include "dist.h"
#include "model.h"
#include "plan.h"

// The model's own buffers by kind, as it allocated them. The CPU model:
// its state arrays, the activations of every slot it filled (gpt_slot_bytes:
// with the two token arrays), its activation gradients, a mixture of
// experts' routing and rows (gpt/moe.h: every slot's layers, the rows at
// their high-water mark), context
// parallelism's blocks in flight and tokens (comm buffers). The GPU model: its
// memory plan's parts (gpt_cuda_memory_parts; a pipeline stage's extra
// slots, `slots` in all, are added from gpt_cuda_slot_bytes).
static inline void plan_measure_model(model_t *m, int slots, double mem[PLAN_KINDS]) {
    memset(mem, 0, sizeof(double) * PLAN_KINDS);
#ifdef COURSE_CUDA
    if (m->on_gpu) {
        size_t parts[6];
        gpt_cuda_memory_parts(m->gpu, parts);
        double all_slots = (double)model_slot_bytes(m);
        mem[PLAN_PARAMS] = (double)parts[0], mem[PLAN_GRADS] = (double)parts[1], mem[PLAN_OPTIMIZER] = (double)parts[2];
        mem[PLAN_ACTIVATIONS] = (double)parts[3] + (slots > 1 ? all_slots * (slots - 1) / slots : 0);
        mem[PLAN_OTHER] = (double)parts[4], mem[PLAN_COMM] = (double)parts[5];
        return;
    }
#endif
    (void)slots;
    const gpt_t *h = &m->host;
    double P = (double)h->num_params * sizeof(gpt_real);
    mem[PLAN_PARAMS] = h->params ? P : 0;
    mem[PLAN_GRADS] = h->grads ? P : 0;
    mem[PLAN_OPTIMIZER] = (h->adam_m ? P : 0) + (h->adam_v ? P : 0);
    mem[PLAN_ACTIVATIONS] = (double)gpt_slot_bytes(h) + (double)h->grads_capacity * sizeof(gpt_real);
    if (h->moe) {
        mem[PLAN_ACTIVATIONS] += (double)gpt_moe_layers_bytes(&h->cfg, h->moe->layer, true);
        for (int k = 0; k < h->num_slots; k++)
            if (k != h->slot) mem[PLAN_ACTIVATIONS] += (double)gpt_moe_layers_bytes(&h->cfg, h->slots[k].moe_layers, true);
    }
    if (h->cp) mem[PLAN_COMM] += (double)cp_buffer_bytes(h->cp);
}

// What a mixture of experts sent to other ranks of its ep group in the
// training passes so far (gpt/moe.h's counters: the rows' numbers, fp32),
// and the bytes its experts' gradients hand their all-reduce over their
// replicas each step (model_average_experts: every expert tensor, fp32).
static inline double plan_measured_ep_bytes(const model_t *m) {
    const gpt_t *h = &m->host;
    return h->moe ? (h->moe->stats.away[0] + h->moe->stats.away[1]) * sizeof(gpt_real) : 0;
}

static inline double plan_measured_expert_grad_bytes(const model_t *m) {
    const gpt_t *h = &m->host;
    double n = 0;
    if (!m->ep_group || pg_world_size(m->ep_group) == 1) return 0; // ep 1: the experts travel with the dense ones
    for (int t = 0; t < h->num_tensors; t++)
        if (gpt_tensor_is_expert(h, t)) n += (double)h->tensors[t].count;
    return n * sizeof(gpt_real);
}

// Every rank brings its row (bytes by kind, bytes sent by dimension) and
// its pipeline stage; rank 0 prints, for each stage, the row of the rank
// of that stage that holds the most.
static inline void plan_report_measured(dist_t *d, int stage, int stages, const plan_rank *mine) {
    enum { COLS = 1 + PLAN_KINDS + PLAN_DIMS };
    double *all = xcalloc((size_t)d->world_size * COLS, sizeof(double)), *row = all + (size_t)d->rank * COLS;
    row[0] = stage;
    memcpy(row + 1, mine->mem, sizeof mine->mem);
    memcpy(row + 1 + PLAN_KINDS, mine->sent, sizeof mine->sent);
    dist_all_reduce_host(d, all, d->world_size * COLS, OP_SUM);
    for (int s = 0; s < stages && d->rank == 0; s++) {
        int most = -1;
        for (int r = 0; r < d->world_size; r++) {
            const double *x = all + (size_t)r * COLS;
            if ((int)x[0] != s) continue;
            if (most < 0 || plan_total(x + 1, PLAN_KINDS) > plan_total(all + (size_t)most * COLS + 1, PLAN_KINDS))
                most = r;
        }
        if (most < 0) continue;
        plan_rank r;
        memcpy(r.mem, all + (size_t)most * COLS + 1, sizeof r.mem);
        memcpy(r.sent, all + (size_t)most * COLS + 1 + PLAN_KINDS, sizeof r.sent);
        plan_print_rows(stdout, "measured", s, &r);
    }
    fflush(stdout);
    free(all);
}

#endif
