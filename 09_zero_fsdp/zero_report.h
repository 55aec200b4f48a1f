// zero_report.h - the two tables chapter 09 prints after training: what
// every rank holds, by kind, beside the ZeRO paper's formula, and what it
// sends per step, by collective, beside the theory (zero.h counts both).
#ifndef ZERO_REPORT_H
#define ZERO_REPORT_H

#include <time.h>

#include "metrics.h"
#include "plan.h"
#include "zero.h"

// "(4+4+8)P/N": the ZeRO paper's formula with this run's bytes per
// parameter, each term over N where the stage shards it - over N/R, the
// shard group, with hybrid sharding (`over`: "N" or "(N/R)").
static inline void zero_formula(char *out, size_t size, const double *bytes, const bool *sharded, int n,
                                const char *over) {
    int used = 0;
    bool all = true, none = true;
    for (int i = 0; i < n; i++) all = all && sharded[i], none = none && !sharded[i];
    if (n == 1 || all || none) {
        used += snprintf(out + used, size - (size_t)used, n > 1 ? "(" : "");
        for (int i = 0; i < n; i++) used += snprintf(out + used, size - (size_t)used, "%s%g", i ? "+" : "", bytes[i]);
        snprintf(out + used, size - (size_t)used, "%sP%s%s", n > 1 ? ")" : "", all ? "/" : "", all ? over : "");
        return;
    }
    double whole = 0, part = 0; // some terms whole, the others over N
    for (int i = 0; i < n; i++) *(sharded[i] ? &part : &whole) += bytes[i];
    snprintf(out, size, "%gP + %gP/%s", whole, part, over);
}

static inline double zero_kib(double bytes) { return bytes / 1024.0; }

// What every rank holds, by kind, beside the ZeRO paper's formula: with P
// parameters and N ranks, DDP holds (p+g+k)P, ZeRO-1 (p+g)P + kP/N, ZeRO-2
// pP + (g+k)P/N, ZeRO-3 (p+g+k)P/N, where p, g, k are the bytes per
// parameter of the parameters, the gradients and the optimizer state.
// With hybrid sharding each N is N/R: a rank holds what it would in a job
// of N/R ranks - the memory of HYBRID_SHARD is the memory of its node.
// One column per rank of the job. The formula's N and R are the job's
// ranks (all data-parallel here) and --replicate, not what the slices were
// cut for: a cut over the wrong group shows. Rank 0 also writes its row to
// `csv` (make plots draws them).
static inline void zero_report_memory(zero_t *z, metrics_csv *csv) {
    int ranks = z->dist->world_size, N = ranks / z->replicas, cols = ranks < 8 ? ranks : 8;
    size_t mine[MEM_KINDS];
    memcpy(mine, z->mem, sizeof mine);
    z->ops->model_memory(z, mine);
    double *all = xcalloc((size_t)ranks * MEM_KINDS, sizeof(double));
    for (int i = 0; i < MEM_KINDS; i++) all[(size_t)z->dist->rank * MEM_KINDS + i] = (double)mine[i];
    dist_all_reduce_host(z->dist, all, ranks * MEM_KINDS, OP_SUM);
    // p: fp32 parameters, and on a GPU in bf16 their bf16 copy too (ZeRO-3
    // keeps only fp32 slices, and makes bf16 copies of a gathered bucket).
    double P = (double)z->num_params, p = z->model->precision != GPT_FP32 && z->stage < 3 ? 6 : 4, g = 4, k = 8;
    double per[3] = {p, g, k};
    bool sharded[3] = {z->stage == 3, z->stage >= 2, z->stage >= 1};
    const char *over = z->replicas > 1 ? "(N/R)" : "N", *device = z->model->on_gpu ?
        (z->model->precision == GPT_BF16 ? "GPU, bf16 copies of fp32 weights" : "GPU, fp32") : "CPU, fp32";
    if (z->replicas == 1)
        log_main("memory per rank, KiB (%s, N = %d, P = %zu parameters; %s):\n", zero_stage_name(z->stage), N,
                 z->num_params, device);
    else
        log_main("memory per rank, KiB (%s, N = %d = R %d replicas x N/R %d sharding, P = %zu parameters; %s):\n",
                 zero_stage_name(z->stage), ranks, z->replicas, N, z->num_params, device);
    char line[400];
    int used = snprintf(line, sizeof line, "  %-20s", "");
    for (int r = 0; r < cols; r++) used += snprintf(line + used, sizeof line - (size_t)used, "   rank %-3d", r);
    log_main("%s%s   the ZeRO paper's formula\n", line, ranks > cols ? "  ..." : "");
    double states[8] = {0};
    for (int i = 0; i < MEM_KINDS; i++) {
        used = snprintf(line, sizeof line, "  %-20s", mem_kind_names[i]);
        for (int r = 0; r < cols; r++) {
            double b = all[(size_t)r * MEM_KINDS + i];
            used += snprintf(line + used, sizeof line - (size_t)used, " %10.1f", zero_kib(b));
            if (i <= MEM_OPTIMIZER) states[r] += b;
        }
        char formula[80] = "(no formula)";
        if (i <= MEM_OPTIMIZER) {
            char f[60];
            zero_formula(f, sizeof f, &per[i], &sharded[i], 1, over);
            snprintf(formula, sizeof formula, "%-13s = %10.1f", f, zero_kib(per[i] * P / (sharded[i] ? N : 1)));
        }
        log_main("%s%s   %s\n", line, ranks > cols ? "  ..." : "", formula);
    }
    used = snprintf(line, sizeof line, "  %-20s", "model states (1-3)");
    for (int r = 0; r < cols; r++)
        used += snprintf(line + used, sizeof line - (size_t)used, " %10.1f", zero_kib(states[r]));
    char f[60];
    zero_formula(f, sizeof f, per, sharded, 3, over);
    double total = 0;
    for (int i = 0; i < 3; i++) total += per[i] * P / (sharded[i] ? N : 1);
    log_main("%s%s   %-13s = %10.1f\n", line, ranks > cols ? "  ..." : "", f, zero_kib(total));
    metrics_row(csv, "%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f", z->stage, N, all[MEM_PARAMS], all[MEM_GRADS],
                all[MEM_OPTIMIZER], all[MEM_GATHERED], all[MEM_ACTIVATIONS], all[MEM_OTHER], total);
    free(all);
}

// What every rank sent per training step, by collective and group, beside
// the theory: with B = 4P bytes (the gradients and gathered parameters
// travel in fp32), over the shard group of n ranks (n = N, or N/R with
// --replicate R), DDP's all-reduce and ZeRO-1's and 2's reduce-scatter plus
// all-gather each send 2(n-1)/n B; ZeRO-3 gathers twice (forward and
// backward) and sends 3(n-1)/n B. ZeRO-2 and 3 reduce-scatter on every
// micro-batch, and ZeRO-3 gathers on every one. Over the replicate group
// (hybrid sharding, often between nodes) only the gradient slices travel,
// B/n bytes, all-reduced once a step: 2(R-1)/R B/n.
static inline void zero_report_traffic(zero_t *z, int grad_accum) {
    int R = z->replicas, N = z->dist->world_size / R, S = z->stage, steps = z->steps_counted > 0 ? z->steps_counted : 1;
    double B = 4.0 * (double)z->num_params, f = (N - 1.0) / N, A = grad_accum;
    double theory[COMM_KINDS] = {S == 0 ? 2 * f * B : 0, S == 0 ? 0 : S == 1 ? f * B : A * f * B,
                                 S == 0 ? 0 : S < 3 ? f * B : 2 * A * f * B, 2.0 * (R - 1) / R * B / N};
    const char *n = R > 1 ? "n" : "N"; // the shard group's size: N, or n = N/R
    char says[COMM_KINDS][40], group[2][24];
    snprintf(says[0], sizeof says[0], S == 0 ? "2(%s-1)/%s B" : "(the gradient norm)", n, n);
    snprintf(says[1], sizeof says[1], S == 0 ? "-" : S == 1 ? "(%s-1)/%s B" : "(%s-1)/%s B per micro-batch", n, n);
    snprintf(says[2], sizeof says[2], S == 0 ? "-" : S < 3 ? "(%s-1)/%s B" : "2(%s-1)/%s B per micro-batch", n, n);
    snprintf(says[3], sizeof says[3], "2(R-1)/R B/n (the slices)");
    snprintf(group[0], sizeof group[0], "shard (%d)", N);
    snprintf(group[1], sizeof group[1], "replicate (%d)", R);
    log_main("sent per training step by each rank, KiB (mean of %d step(s); B = 4P bytes, counted from the calls at what a ring "
             "sends%s):\n", z->steps_counted, R > 1 ? "; n = N/R ranks shard, R replicas" : "");
    if (z->model->grad_compress != DDP_COMPRESS_NONE) // --shard 0 only
        log_main("  (--grad_compress %s: the all-reduce carries the compressed gradients, not B)\n",
                 ddp_wire_name(z->model->grad_compress));
    log_main("  %-16s %-14s %8s %12s   theory\n", "collective", "group", "calls", "KiB");
    double sent[2] = {0, 0}, expected[2] = {0, 0};
    for (int i = 0; i < COMM_KINDS; i++) {
        int over = i == COMM_REPLICAS; // 0: the shard group, 1: the replicate group
        if (over && R == 1) continue;  // no replicas: nothing goes there
        sent[over] += z->sent[i] / steps, expected[over] += theory[i];
        log_main("  %-16s %-14s %8.1f %12.1f   %-28s = %10.1f\n", comm_kind_names[i], group[over],
                 (double)z->calls[i] / steps, zero_kib(z->sent[i] / steps), says[i], zero_kib(theory[i]));
    }
    char total[64];
    snprintf(total, sizeof total, S == 3 ? "3(%s-1)/%s B (one micro-batch)" : "2(%s-1)/%s B (one micro-batch)", n, n);
    if (R > 1) { // by dimension: what stays inside a node, what goes between them
        log_main("  %-31s %8s %12.1f   %-28s = %10.1f\n", "over shard", "", zero_kib(sent[0]), total,
                 zero_kib(expected[0]));
        log_main("  %-31s %8s %12.1f   %-28s = %10.1f\n", "over replicate", "", zero_kib(sent[1]), says[3],
                 zero_kib(expected[1]));
        strcat(total, " + 2(R-1)/R B/n");
    }
    log_main("  %-31s %8s %12.1f   %-28s = %10.1f\n", "total", "", zero_kib(sent[0] + sent[1]), total,
             zero_kib(expected[0] + expected[1]));
}

// The same, as the planner's rows (gpt/plan.h: `--plan` prints them for
// the same flags): the bytes by kind of the rank that holds the most, and
// the bytes it sent per step over dp. The model's own buffers and the
// chapter's go to the planner's kinds: the staging and gathered buffers
// are communication buffers, a GPU's cuBLAS workspace and tables "other";
// on the CPU the activations' count adds the two token arrays. The
// all-reduce of the gradient norm (8 bytes) is left out, as the plan does.
static inline void zero_report_plan_rows(zero_t *z) {
    int N = z->dist->world_size, steps = z->steps_counted > 0 ? z->steps_counted : 1; // every rank of the job
    size_t model[MEM_KINDS] = {0};
    z->ops->model_memory(z, model);
    const size_t *ch = z->mem;
    double *all = xcalloc((size_t)N * PLAN_KINDS, sizeof(double)), *mine = all + (size_t)z->dist->rank * PLAN_KINDS;
    const gpt_t *h = &z->model->host;
    mine[PLAN_PARAMS] = (double)(ch[MEM_PARAMS] + model[MEM_PARAMS]);
    mine[PLAN_GRADS] = (double)(ch[MEM_GRADS] + model[MEM_GRADS]);
    mine[PLAN_OPTIMIZER] = (double)(ch[MEM_OPTIMIZER] + model[MEM_OPTIMIZER]);
    mine[PLAN_ACTIVATIONS] = (double)model[MEM_ACTIVATIONS] +
                             (z->model->on_gpu ? 0 : 2.0 * (double)h->tokens_capacity * sizeof(uint16_t));
    mine[PLAN_COMM] = (double)(ch[MEM_GATHERED] + ch[MEM_OTHER] + model[MEM_GATHERED]);
    mine[PLAN_OTHER] = (double)model[MEM_OTHER];
    dist_all_reduce_host(z->dist, all, N * PLAN_KINDS, OP_SUM);
    int most = 0;
    for (int r = 1; r < N; r++)
        if (plan_total(all + (size_t)r * PLAN_KINDS, PLAN_KINDS) > plan_total(all + (size_t)most * PLAN_KINDS, PLAN_KINDS))
            most = r;
    plan_rank row = {{0}, {0}};
    memcpy(row.mem, all + (size_t)most * PLAN_KINDS, sizeof row.mem);
    // dp: the shard group's collectives, and with hybrid sharding the
    // replicas' all-reduce of the slices.
    row.sent[PLAN_DP] = (z->sent[COMM_REDUCE_SCATTER] + z->sent[COMM_ALL_GATHER] + z->sent[COMM_REPLICAS] +
                         (z->stage == 0 ? z->sent[COMM_ALL_REDUCE] : 0)) / steps;
    if (z->dist->rank == 0) plan_print_rows(stdout, "measured", 0, &row), fflush(stdout);
    free(all);
}

// Both tables; rank 0 writes its memory row to <out_dir>/memory.csv.
static inline void zero_report(zero_t *z, int grad_accum, const char *out_dir) {
    metrics_csv csv = {0};
    if (z->dist->rank == 0) {
        csv = metrics_open(out_dir, "memory", "stage,world,params,grads,optimizer,gathered,activations,other,formula");
        char date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
        metrics_row(&csv, "# %s | backend %s | %s", z->dist->device.name, backend_name(pg_backend(z->dist->pg)), date);
    }
    zero_report_memory(z, &csv);
    metrics_close(&csv);
    zero_report_traffic(z, grad_accum);
    zero_report_plan_rows(z);
}

#endif
