// cp_report.h - chapter 12's refusals and reports: what does not divide,
// and what one rank holds, sends and computes, measured, beside the
// formulas (README.md, "What a rank holds, sends and computes").
//
// Not the lesson - the training program (12_context_parallel.c) and the
// model's attention (gpt/context_parallel.h) are - but what shows that the
// lesson holds: the memory of a rank is 1/cp of one process's, the traffic
// is what the arithmetic says, and zigzag evens out the causal mask's work.
#ifndef CP_REPORT_H
#define CP_REPORT_H

#include <stdio.h>
#include <string.h>

#include "flags.h"
#include "groups.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "plan_measured.h"

// What cannot work, refused in one line with the reason.
static inline void cp_refuse(flag_set *set, const options *o) {
    cp_kind kind = strcmp(o->cp_attention, "ulysses") ? CP_RING : CP_ULYSSES;
    cp_balance balance = strcmp(o->cp_balance, "none") ? CP_ZIGZAG : CP_CONTIGUOUS;
    const char *problem = cp_problem(o->block_size, o->n_head, o->cp, kind, balance);
    if (problem)
        flags_fail(set, "--cp %d with --block_size %d, --n_head %d, --cp_attention %s, --cp_balance %s: %s", o->cp,
                   o->block_size, o->n_head, o->cp_attention, o->cp_balance, problem);
}

// The layout, as the metrics' title line says it.
static inline const char *cp_mesh_text(const groups_t *g, const options *o) {
    static char text[96];
    snprintf(text, sizeof text, "dp %d x cp %d (%s, %s)", g->size[DIM_DP], g->size[DIM_CP], o->cp_attention,
             o->cp_balance);
    return text;
}

// What attention sent and computed: the model's counters (context_parallel.h).
typedef struct {
    double sent_forward, sent_backward, pairs, seconds;
} cp_counts;

static inline cp_counts cp_counts_now(const model_t *m) {
    const gpt_cp *cp = m->host.cp;
    if (cp && m->on_gpu) { // the GPU model counts its own (gpt_cuda_cp.cuh); its time is not measured
        double n[3];
        model_gpu_cp_counts(m, n);
        return (cp_counts){n[0], n[1], n[2], 0};
    }
    return cp ? (cp_counts){cp->sent_forward, cp->sent_backward, cp->pairs, cp->seconds} : (cp_counts){0, 0, 0, 0};
}

static inline void cp_counts_add(cp_counts *sum, cp_counts before, cp_counts after) {
    sum->sent_forward += after.sent_forward - before.sent_forward;
    sum->sent_backward += after.sent_backward - before.sent_backward;
    sum->pairs += after.pairs - before.pairs;
    sum->seconds += after.seconds - before.seconds;
}

// The memory table: each cp rank's activations beside one process's / cp
// (the CPU model's buffers; `all`: 7 numbers per rank, report_context_parallel's).
static inline void cp_report_memory(const gpt_t *h, const double *all, int N, size_t B, size_t T, size_t NH, size_t L,
                                    double V) {
    // One process's buffers for a batch (gpt.h: activations, logits, the
    // backward pass's scratch), its attention probabilities among them.
    double one_att = (double)L * B * NH * T * T;
    double one_all = (double)(gpt_head_acts_size(&h->cfg, GPT_ACT, B, T) + gpt_head_acts_size(&h->cfg, GPT_STAT, B, T)) +
                     (double)L * (gpt_block_acts_size(&h->cfg, GPT_ACT, false, B, T) +
                                  gpt_block_acts_size(&h->cfg, GPT_STAT, false, B, T)) +
                     (double)B * T * V + (double)gpt_grad_acts_size(&h->cfg, B, T);
    double MiB = 1048576, f = sizeof(gpt_real);
    log_main("memory per rank (activations of a batch of %zu x %zu tokens, %zu per rank): one process's / cp %d: "
             "attention probabilities L B NH T^2 / cp = %.3f MiB, per-token activations and their gradients = %.3f MiB\n",
             B, T, T / (size_t)N, N, one_att * f / N / MiB, (one_all - one_att) * f / N / MiB);
    for (int r = 0; r < N; r++) {
        const double *a = all + 7 * r;
        log_main("  cp rank %d: attention %.3f MiB (%.3f x formula), per-token %.3f MiB (%.3f x formula), cp buffers "
                 "(blocks in flight, all-to-all staging) %.3f MiB\n", r, a[1] / MiB, a[1] / (one_att * f / N),
                 (a[0] - a[1]) / MiB, (a[0] - a[1]) / ((one_all - one_att) * f / N), a[2] / MiB);
    }
}

// The planner's rows (gpt/plan.h; --plan prints them for the same flags):
// this rank's buffers by kind (cp's blocks in flight and tokens among the
// comm buffers), and per step what attention sent over cp (the counted
// numbers, at the activations' bytes) and the gradients' all-reduce over
// dp x cp (at what a ring sends). Every rank calls it.
static inline void cp_report_plan_rows(model_t *m, const groups_t *g, const cp_counts *c, int steps) {
    plan_rank row = {{0}, {0}};
    plan_measure_model(m, 1, row.mem);
    double act = m->on_gpu && m->precision != GPT_FP32 ? 2 : 4;
    row.sent[PLAN_CP] = (c->sent_forward + c->sent_backward) * act / steps;
    row.sent[PLAN_DP] =
        plan_ring_all_reduce((double)ddp_bytes_reduced() / steps, g->size[DIM_DP] * g->size[DIM_CP]);
    plan_report_measured(g->dist, 0, 1, &row);
}

// After training: per rank of replica 0's cp group, what it holds (the
// activations of a training batch), sends (attention's numbers, per step)
// and computes (attention's query-key scores per step and the CPU seconds
// they took), beside the formulas. B x T tokens per micro-batch, N = cp,
// L layers, NH heads, C channels, V vocabulary.
static inline void report_context_parallel(model_t *m, const groups_t *g, const options *o, const cp_counts *c,
                                           int steps) {
    int N = g->size[DIM_CP];
    if (steps < 1) return;
    cp_report_plan_rows(m, g, c, steps);
    const gpt_t *h = &m->host;
    const gpt_cp *cp = h->cp;
    // Rank 0's buffers, in one line for any cp (bench/longest_context.sh
    // reads it: the longest block a memory budget allows). On a GPU only
    // the traffic: the GPU model's buffers are sized for the longest batch.
    if (!m->on_gpu) log_main("held per rank: %.0f bytes of activations and their gradients, %.0f bytes of cp buffers (measured: the "
             "buffers as allocated, batch %d x block %d)\n", (double)(h->acts_capacity + h->grads_capacity) * sizeof(gpt_real),
             cp ? (double)cp_buffer_bytes(cp) : 0.0, o->batch_size, o->block_size);
    if (N == 1) return;
    size_t B = (size_t)o->batch_size, T = (size_t)o->block_size, NH = (size_t)h->cfg.n_head, L = (size_t)h->cfg.n_layer;
    double C = h->cfg.n_embd, V = h->cfg.vocab_size, Tl = (double)T / N, per = (double)steps, MiB = 1048576;
    double mine[7] = {(double)(h->acts_capacity + h->grads_capacity) * sizeof(gpt_real),
                      (double)L * (double)cp->att_held * sizeof(gpt_real), (double)cp_buffer_bytes(cp),
                      c->sent_forward / per, c->sent_backward / per, c->pairs / per, c->seconds / per};
    double *all = xmalloc(sizeof(double) * 7 * (size_t)N);
    groups_all_gather_host(g->group[DIM_CP], &g->dist->device, mine, all, 7, DTYPE_F64);
    if (!m->on_gpu) cp_report_memory(h, all, N, B, T, NH, L, V);
    // Traffic: ring sends cp - 1 key/value blocks of B x T/cp x 2C a layer
    // forward, and as many again with their gradients backward; ulysses
    // sends (cp-1)/cp of q, k, v (3C) and of the output (C) a layer forward,
    // of the output's and q, k, v's gradients backward.
    bool ring = cp->kind == CP_RING;
    double accum = o->grad_accum;
    double fwd = ring ? L * (N - 1) * B * Tl * 2 * C * accum : L * (N - 1.0) / N * B * Tl * 4 * C * accum;
    double bwd = ring ? 2 * fwd : fwd;
    log_main("traffic per rank and step (%s, numbers): formula forward %s = %.0f, backward %s = %.0f\n",
             o->cp_attention, ring ? "L (cp-1) B (T/cp) 2C" : "L (cp-1)/cp B (T/cp) 4C", fwd,
             ring ? "2 L (cp-1) B (T/cp) 2C" : "L (cp-1)/cp B (T/cp) 4C", bwd);
    for (int r = 0; r < N; r++)
        log_main("  cp rank %d: counted forward %.0f, backward %.0f (%.2f MiB a step in fp32)%s\n", r, all[7 * r + 3],
                 all[7 * r + 4], (all[7 * r + 3] + all[7 * r + 4]) * 4 / MiB,
                 all[7 * r + 3] == fwd && all[7 * r + 4] == bwd ? ": the formula's" : ": NOT the formula's");
    if (m->on_gpu) { // the GPU's attention time is not measured per rank, and its pairs are those the mask keeps
        free(all);
        return;
    }
    // Balance: the score pairs each rank's forward pass computes (a chunk
    // pair the causal mask hides wholly is skipped); zigzag: (2cp+1) chunk
    // pairs of (T/2cp)^2 each; none: rank r, r+1 pairs of (T/cp)^2;
    // ulysses: NH/cp heads over all T^2.
    double top = 0, bottom = 1e300;
    for (int r = 0; r < N; r++) {
        double pairs, chunk = (double)T / (2 * N), slice = (double)T / N;
        if (!ring) pairs = (double)B * NH / N * T * T;
        else if (cp->balance == CP_ZIGZAG) pairs = (double)B * NH * (2 * N + 1) * chunk * chunk;
        else pairs = (double)B * NH * (r + 1) * slice * slice;
        pairs *= L * accum;
        double secs = all[7 * r + 6];
        top = secs > top ? secs : top, bottom = secs < bottom ? secs : bottom;
        log_main("  cp rank %d: attention scores %.0f a step (formula %.0f%s), %.2f ms of CPU a step\n", r,
                 all[7 * r + 5], pairs, all[7 * r + 5] == pairs ? ", equal" : ", NOT equal", secs * 1e3);
    }
    log_main("balance (%s, %s): the slowest rank's attention took %.2f x the fastest's CPU time (one process "
             "computes L B NH T^2 = %.0f scores a step)\n", o->cp_attention, o->cp_balance, bottom > 0 ? top / bottom : 0,
             (double)L * B * NH * T * T * accum);
    free(all);
}

#endif
