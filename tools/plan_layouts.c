// plan_layouts.c - "choosing a layout" (gpt/README.md): the planner
// (gpt/plan.h) over GPT-2's four sizes on clusters of 8, 64 and 512 GPUs
// of 80 GB, 8 GPUs a node. For each model and cluster it tries every
// layout pp x dp x cp x tp (tp 1-8, inside a node; cp 1, 2 or 4 beside it
// in the node, without ZeRO: chapter 14 runs ZeRO with cp on CPU ranks
// only, and a GPU's cp buffers are not counted; pp dividing the layers
// into stages of at least one block) with ZeRO 0-3 over dp (and, where dp x tp spans nodes,
// ZeRO 1-3 hybrid-sharded: the slices shared by one node's dp ranks, R
// replicas across nodes), keeps those whose every rank's plan fits in the
// GPU's memory, and prints the ones that send the fewest bytes across
// nodes, with the least-traffic tp-only, ZeRO-3-only and cp layouts beside
// them. ep is not among them: GPT-2 is dense (ep cuts a mixture of
// experts, and the planner counts the CPU model's mixture only). cp on a
// GPU: the course's GPU model keeps buffers for the whole block (so cp
// saves no memory there); its cp buffers (gpt_cuda_cp.cuh) are not counted.
//
// What it counts and what it does not: the model's buffers as the course's
// GPU model allocates them (bf16 activations and weight copies, fp32
// master weights, gradients and AdamW's moments, flash attention, no
// activation recomputation); not the CUDA context, NCCL's own buffers or
// the allocator's fragmentation, which the planner cannot derive (so "fits"
// is against 80e9 bytes, a bound, not a promise). Bytes "across nodes" are
// what one rank sends per step in the collectives of the groups that span
// more than one node (tp fastest in the mesh, then cp, dp, pp: a group
// spans nodes when its ranks are more than 8 apart in all; the dense
// gradients' all-reduce is over dp x cp). Link
// bandwidths, and so step times, are left out: the planner has no
// measured figure for them.
//
// The batch: 512 sequences of 1024 tokens a step (GPT-2's), micro-batches
// of 8 sequences (fewer when a replica's share is smaller); a pipeline's
// micro-batches are a replica's share of them.
//
// usage: plan_layouts [--gpus N] [--model small|medium|large|xl] [--all]
//   --all: every layout that fits, not only the best; one line each.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpt/plan.h"

typedef struct {
    const char *name;
    gpt_config cfg;
} model_size;

static const model_size models[] = {
    {"small (124M)", {.vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768}},
    {"medium (350M)", {.vocab_size = 50257, .block_size = 1024, .n_layer = 24, .n_head = 16, .n_embd = 1024}},
    {"large (774M)", {.vocab_size = 50257, .block_size = 1024, .n_layer = 36, .n_head = 20, .n_embd = 1280}},
    {"xl (1.5B)", {.vocab_size = 50257, .block_size = 1024, .n_layer = 48, .n_head = 25, .n_embd = 1600}},
};
enum { MODELS = sizeof models / sizeof models[0], NODE = 8, SEQUENCES = 512, MICRO = 8 };
static const double GPU_BYTES = 80e9;

typedef struct {
    plan_layout l;
    double most;  // bytes of the rank that holds the most
    double cross; // bytes one rank sends per step in groups that span nodes (the most over stages)
    double sent;  // bytes it sends in all
} candidate;

// Does the group along dimension d span nodes? Its ranks are `stride`
// apart (tp 1, dp tp, pp dp tp), `size` of them.
static bool spans_nodes(int stride, int size) { return size > 1 && stride * size > NODE; }

static bool evaluate(plan_layout *l, candidate *out) {
    if (plan_problem(l)) return false;
    candidate c = {*l, 0, 0, 0};
    for (int s = 0; s < l->pp; s++) {
        plan_rank r = plan_stage(l, s);
        double mem = plan_total(r.mem, PLAN_KINDS), cross = 0;
        if (spans_nodes(1, l->tp)) cross += r.sent[PLAN_TP];
        if (spans_nodes(l->tp, l->cp)) cross += r.sent[PLAN_CP];
        // dp: with hybrid sharding, the shard group (dp / R ranks, tp apart)
        // and the replicas' all-reduce (R ranks, dp / R x tp apart) apart.
        int n = l->dp / l->replicate;
        double replicas = plan_replicas_sent(l, s);
        if (spans_nodes(l->tp, n * l->cp)) cross += r.sent[PLAN_DP] - replicas;
        if (spans_nodes(l->tp * n, l->replicate)) cross += replicas;
        if (spans_nodes(l->tp * l->cp * l->dp, l->pp)) cross += r.sent[PLAN_PP];
        if (mem > c.most) c.most = mem;
        if (cross > c.cross) c.cross = cross;
        double sent = plan_total(r.sent, PLAN_DIMS);
        if (sent > c.sent) c.sent = sent;
    }
    *out = c;
    return c.most <= GPU_BYTES;
}

static void print_header(void) {
    printf("  %-4s %-4s %-4s %-4s %-5s %-4s %-6s %12s %18s %18s\n", "pp", "dp", "cp", "tp", "ZeRO", "R", "micro", "GB a GPU",
           "GB sent a step", "GB across nodes");
}

static void print_candidate(const candidate *c, const char *note) {
    printf("  %-4d %-4d %-4d %-4d %-5d %-4d %2d x %-2d %12.1f %18.2f %18.2f  %s\n", c->l.pp, c->l.dp, c->l.cp, c->l.tp, c->l.zero,
           c->l.replicate, c->l.M,
           c->l.B, c->most / 1e9, c->sent / 1e9, c->cross / 1e9, note);
}

static int by_cross(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->cross != y->cross) return x->cross < y->cross ? -1 : 1;
    if (x->sent != y->sent) return x->sent < y->sent ? -1 : 1;
    return x->most < y->most ? -1 : x->most > y->most;
}

static void plan_cluster(const model_size *m, int gpus, bool all) {
    candidate *fits = malloc(sizeof(candidate) * 16384);
    if (!fits) {
        fprintf(stderr, "plan_layouts: out of memory\n");
        exit(1);
    }
    int n = 0, tried = 0;
    for (int tp = 1; tp <= NODE; tp *= 2)
      for (int cp = 1; cp <= 4 && cp * tp <= NODE; cp *= 2)
        for (int pp = 1; pp <= m->cfg.n_layer && pp * tp * cp <= gpus; pp++) {
            if (gpus % (pp * tp * cp) != 0) continue;
            int dp = gpus / (pp * tp * cp);
            if (SEQUENCES % dp != 0) continue;
            int share = SEQUENCES / dp, B = share < MICRO ? share : MICRO;
            // Hybrid sharding's R: the slices shared by the dp ranks of one
            // node (dp / R x tp = 8), the replicas across nodes.
            int R = tp * dp > NODE && (tp * dp) % NODE == 0 && NODE / tp >= 2 ? tp * dp / NODE : 1;
            for (int zero = 0; zero <= 3; zero++)
                for (int replicate = 1; replicate <= R; replicate += R > 1 ? R - 1 : 1) {
                    if (zero > 0 && dp == 1) continue;
                    if (replicate > 1 && zero == 0) continue;
                    if (cp > 1 && zero > 0) continue; // ZeRO with cp: left out (see above)
                    plan_layout l = {.cfg = m->cfg, .B = B, .T = m->cfg.block_size, .M = share / B, .gpu = true,
                                     .precision = GPT_BF16, .wire_bytes = 4, .dp = dp, .tp = tp, .pp = pp, .cp = cp,
                                     .ep = 1, .zero = zero, .replicate = replicate, .gpipe = false};
                    if (plan_problem(&l)) continue; // tp must divide the heads
                    tried++;
                    candidate c;
                    if (evaluate(&l, &c) && n < 16384) fits[n++] = c;
                }
        }
    printf("\nGPT-2 %s, %zu parameters, on %d GPUs (%d node%s of %d): %d of %d layouts fit in 80 GB\n", m->name,
           gpt_num_params(&m->cfg), gpus, (gpus + NODE - 1) / NODE, gpus > NODE ? "s" : "", NODE, n, tried);
    if (n == 0) {
        free(fits);
        return;
    }
    qsort(fits, (size_t)n, sizeof *fits, by_cross);
    print_header();
    int shown = all ? n : n < 5 ? n : 5;
    for (int i = 0; i < shown; i++) print_candidate(&fits[i], i == 0 ? "(fewest bytes across nodes, then in all)" : "");
    if (all) return free(fits);
    // The two ways to cut memory without a pipeline, side by side: the
    // least-memory layout with tensor parallelism only (ZeRO 0), and with
    // ZeRO-3 only (tp 1).
    // And the one with context parallelism that sends the fewest bytes
    // across nodes (then in all): what splitting the sequence costs.
    const candidate *tp_only = NULL, *z3_only = NULL, *with_cp = NULL;
    for (int i = 0; i < n; i++) {
        const candidate *c = &fits[i];
        if (c->l.pp == 1 && c->l.zero == 0 && c->l.tp > 1 && c->l.cp == 1 && (!tp_only || c->cross < tp_only->cross))
            tp_only = c;
        if (c->l.pp == 1 && c->l.zero == 3 && c->l.tp == 1 && (!z3_only || c->cross < z3_only->cross)) z3_only = c;
        if (c->l.cp > 1 && !with_cp) with_cp = c; // fits is sorted
    }
    if (tp_only) print_candidate(tp_only, "(tp, no ZeRO, no pipeline)");
    if (z3_only) print_candidate(z3_only, "(ZeRO-3, no tp, no pipeline)");
    if (with_cp) print_candidate(with_cp, "(the best with cp)");
    free(fits);
}

int main(int argc, char **argv) {
    int gpus = 0;
    const char *only = NULL;
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpus") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 1 << 20) {
                fprintf(stderr, "plan_layouts: --gpus expects a positive number of GPUs, got '%s'\n", argv[i]);
                return 2;
            }
            gpus = (int)n;
        }
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--all")) all = true;
        else {
            fprintf(stderr, "plan_layouts: unknown argument '%s'\nusage: plan_layouts [--gpus N] [--model small|medium|large|xl] [--all]\n",
                    argv[i]);
            return 2;
        }
    }
    printf("plan_layouts: GPT-2 sizes on GPUs of 80 GB, 8 a node, bf16, 512 x 1024 tokens a step (gpt/plan.h; "
           "ZeRO-1 with tp or pp: a part one bucket, as 14 cuts it, held on CPU ranks; ZeRO-2, 3 with tp or pp: 09's "
           "buckets, not held to a run; cp: the GPU's cp buffers not counted)\n");
    const int clusters[] = {8, 64, 512};
    bool any = false;
    for (int k = 0; k < MODELS; k++) {
        if (only && strncmp(models[k].name, only, strlen(only)) != 0) continue;
        any = true;
        for (int c = 0; c < 3; c++)
            if (!gpus || gpus == clusters[c]) plan_cluster(&models[k], clusters[c], all);
        if (gpus && gpus != 8 && gpus != 64 && gpus != 512) plan_cluster(&models[k], gpus, all);
    }
    if (!any) {
        fprintf(stderr, "plan_layouts: --model %s: use small, medium, large or xl\n", only);
        return 2;
    }
    return 0;
}
