// 10_tensor_parallel.c - Chapter 10: tensor parallelism, combined with data parallelism.
//
// Chapter 08's program - it
//   1. finds WikiText-2 (wikitext.h) and checks it,
//   2. trains a byte-level BPE tokenizer on the training text, or loads the
//      one it trained before (bpe.h), and encodes the three splits,
//   3. trains a GPT (gpt.h) with AdamW, a warm-up + cosine learning rate,
//      gradient clipping and optional gradient accumulation,
//   4. measures the validation loss and perplexity on the whole validation
//      split after every epoch (and every --eval_every steps), the test
//      perplexity at the end,
//   5. samples a few continuations of a prompt, and saves the model as
//      safetensors with the tokenizer beside it, which --generate reloads -
// with one more idea: each transformer block is SPLIT over --tp ranks, as
// Megatron-LM does it (Shoeybi et al., 2019). Data parallelism gives every
// rank the whole model and a share of the batch; tensor parallelism gives
// every rank a share of the model - its own attention heads and its own
// part of the MLP - and the whole batch of its group: the ranks of a tp
// group compute each block TOGETHER, adding up their partial results with
// all-reduces inside the forward and the backward pass. What changes:
//   a. the ranks are laid out as a mesh of --dp x --tp (common/mesh.h,
//      init_device_mesh): a tp group holds consecutive ranks, the ranks of
//      one machine, whose links are the fastest (README.md says why);
//   b. every rank builds the whole model from the seed, as in 08, and keeps
//      its shard (gpt_init_shard; gpt_layout.h, section 5: which rows or
//      columns of each matrix); the model calls back for the all-reduces
//      over the tp group (model_tensor_parallel; gpt.h, section 9);
//   c. data parallelism runs over the dp group only: the sampler splits the
//      data over dp, the gradients are averaged over dp; the ranks of a tp
//      group see the same data;
//   d. the gradient norm adds up the shards' squares over tp;
//   e. snapshots and the saved model hold the WHOLE model, gathered from
//      the shards, so chapter 08 loads it and samples, and a run resumes
//      with another --tp;
//   f. what each rank holds and sends is printed beside the formulas, and
//      the replicas are checked to be the same bytes where they must be.
//
// Read it top to bottom: options, device, the mesh, data, model, training
// loop, evaluation, sampling, saving. The model itself, layer by layer, is
// in ../gpt/gpt.h: the GPT, its tokenizer and its data live in ../gpt/,
// which chapters 08-11 share.
//
// Where it computes: on a GPU when there is one (gpt_cuda.cu: our kernels
// and cuBLAS, in bf16 mixed precision by default), else on the CPU
// (gpt.h); model.h hides the difference, and everything else - data,
// sampler, snapshots, samples, the printed lines - is the same on both.
//
// --dp M --tp N spawns M x N ranks, or ddprun (or mpirun) starts them;
// --tp 1 is chapter 08's data parallelism, --dp 1 --tp 1 one process. With
// --snapshot_path, the ranks of replica 0 gather a resumable snapshot
// (common/snapshot.h) every --save_every epochs, and a restarted run goes
// on from it.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bpe.h"
#include "corpus.h"
#include "data_check.h"
#include "ddp.h"
#include "device.h"
#include "dist.h"
#include "fault.h"
#include "flags.h"
#include "gpt.h"
#include "launch_env.h"
#include "log.h"
#include "mesh.h"
#include "metrics.h"
#include "model.h"
#include "nodes.h"
#include "rng.h"
#include "sampler.h"
#include "samples.h"
#include "sha256.h"
#include "snapshot.h"
#include "spawn.h"
#include "threads.h"
#include "timer.h"
#include "wikitext.h"

#define CHAPTER "10_tensor_parallel"

typedef struct {
    int epochs, batch_size, grad_accum, max_steps, warmup_steps, eval_every, log_every, save_every, seed;
    int vocab_size, block_size, n_layer, n_head, n_embd;
    double lr, min_lr, weight_decay, grad_clip, temperature;
    int top_k, num_samples, sample_tokens, dp, tp, check_every;
    double timeout;
    const char *backend;
    bool generate, verify_data;
    const char *preset, *data_dir, *out_dir, *snapshot_path, *prompt, *device, *precision;
} options;

// ===================================================================== options

static flag_set option_flags(options *o) {
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2 and sample from it"};
    flag_int(&set, "epochs", &o->epochs, 1, 1000, "passes over the training split");
    flag_int(&set, "batch_size", &o->batch_size, 1, 4096, "sequences per micro-batch")->short_name = "b";
    flag_int(&set, "grad_accum", &o->grad_accum, 1, 4096, "micro-batches per optimizer step");
    flag_double(&set, "lr", &o->lr, 0, 10, "peak learning rate");
    flag_double(&set, "min_lr", &o->min_lr, -1, 10, "learning rate at the end of the cosine (-1: lr/10)");
    flag_int(&set, "warmup_steps", &o->warmup_steps, 0, 1000000, "linear warm-up steps (at most a fifth of the run)");
    flag_double(&set, "weight_decay", &o->weight_decay, 0, 10, "AdamW decay of the weight matrices");
    flag_double(&set, "grad_clip", &o->grad_clip, 0, 1e6, "clip the gradient norm to this (0: never)");
    flag_int(&set, "max_steps", &o->max_steps, 0, 100000000, "stop after this many optimizer steps (0: all epochs)");
    flag_int(&set, "eval_every", &o->eval_every, 0, 100000000, "validate every N steps as well as after each epoch (0: epochs only)");
    flag_int(&set, "log_every", &o->log_every, 1, 100000000, "progress line every N steps");
    flag_int(&set, "save_every", &o->save_every, 0, 1000000, "save the model every N epochs (0: at the end only)");
    flag_string(&set, "snapshot_path", &o->snapshot_path, "resumable snapshots DIR/STEM.safetensors, every --save_every epochs");
    flag_int(&set, "dp", &o->dp, 0, 256, "data-parallel replicas of the model (0: the job's ranks / tp, 1 without a launcher)");
    flag_int(&set, "tp", &o->tp, 1, 256, "tensor-parallel ranks each block is split over (must divide n_head)");
    flag_int(&set, "check_every", &o->check_every, 0, 100000000, "check the replicas byte for byte every N steps (0: at the end only)");
    flag_choice(&set, "backend", &o->backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_double(&set, "timeout", &o->timeout, 0, 86400, "seconds a rank waits for another (0: COURSE_TIMEOUT or 300)");
    flag_int(&set, "seed", &o->seed, 0, 2147483647, "seed for the weights, the shuffle and the samples");
    flag_choice(&set, "preset", &o->preset, "default|tiny", "model size: default (128/4/4/256) or tiny (32/2/2/64)");
    flag_int(&set, "vocab_size", &o->vocab_size, 258, 65536, "BPE vocabulary: 256 bytes + merges + <|endoftext|>");
    flag_int(&set, "block_size", &o->block_size, 1, 8192, "context length in tokens (0: from --preset)");
    flag_int(&set, "n_layer", &o->n_layer, 1, 256, "transformer blocks (0: from --preset)");
    flag_int(&set, "n_head", &o->n_head, 1, 256, "attention heads (0: from --preset)");
    flag_int(&set, "n_embd", &o->n_embd, 1, 16384, "channels (0: from --preset)");
    flag_string(&set, "data_dir", &o->data_dir, "folder with train.txt, valid.txt, test.txt (none: $WIKITEXT_DIR, else ../shared/data/wikitext-2)");
    flag_bool(&set, "verify_data", &o->verify_data, "check the files are the published WikiText-2 (false: any text corpus)");
    flag_string(&set, "out_dir", &o->out_dir, "model, tokenizer, caches and metrics go here");
    flag_bool(&set, "generate", &o->generate, "load the saved model from --out_dir and sample; no training");
    flag_string(&set, "prompt", &o->prompt, "text the samples continue");
    flag_double(&set, "temperature", &o->temperature, 0, 100, "sampling temperature (0: always the most likely token)");
    flag_int(&set, "top_k", &o->top_k, 0, 65536, "sample among the k most likely tokens (0: all)");
    flag_int(&set, "num_samples", &o->num_samples, 0, 100, "continuations to print");
    flag_int(&set, "sample_tokens", &o->sample_tokens, 1, 100000, "tokens per continuation");
    flag_choice(&set, "device", &o->device, "auto|cpu|cuda", "where to compute")->env = "COURSE_DEVICE";
    flag_choice(&set, "precision", &o->precision, "auto|bf16|fp32", "number format on a GPU (auto: bf16 there, fp32 on the CPU)");
    return set;
}

// Model sizes left at 0 come from the preset; the result must be buildable.
static void apply_preset(options *o, flag_set *set) {
    gpt_config p = {o->vocab_size, 0, 0, 0, 0};
    gpt_preset(o->preset, &p); // the flag's choices guarantee a known name
    if (!o->block_size) o->block_size = p.block_size;
    if (!o->n_layer) o->n_layer = p.n_layer;
    if (!o->n_head) o->n_head = p.n_head;
    if (!o->n_embd) o->n_embd = p.n_embd;
    gpt_config c = {o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd};
    const char *problem = gpt_config_problem(c);
    if (problem) flags_fail(set, "bad model size: %s (got --n_embd %d --n_head %d)", problem, o->n_embd, o->n_head);
    problem = gpt_tp_problem(&c, o->tp);
    if (problem) flags_fail(set, "--tp %d: %s (the model has --n_head %d)", o->tp, problem, o->n_head);
}

static options parse_options(int argc, char **argv) {
    options o = {.epochs = 1, .batch_size = 8, .grad_accum = 1, .max_steps = 0, .warmup_steps = 100,
                 .eval_every = 1000, .log_every = 10, .save_every = 0, .seed = 1337, .vocab_size = 5000,
                 .lr = 1e-3, .min_lr = -1, .weight_decay = 0.1, .grad_clip = 1.0, .temperature = 0.8,
                 .top_k = 40, .num_samples = 3, .sample_tokens = 64, .verify_data = true,
                 .preset = "default", .prompt = "The", .device = "auto", .dp = 0, .tp = 1, .backend = "auto",
                 .precision = "auto"};
    static char default_out_dir[1024]; // outlives this function: o.out_dir points at it
    files_runs_dir(default_out_dir, sizeof default_out_dir, CHAPTER);
    o.out_dir = default_out_dir;
    flag_set set = option_flags(&o);
    flags_parse(&set, argc, argv);
    apply_preset(&o, &set);
    if (o.min_lr < 0) o.min_lr = o.lr / 10;
    if (o.min_lr > o.lr) flags_fail(&set, "--min_lr %g is above --lr %g", o.min_lr, o.lr);
    if (strlen(o.out_dir) > 900) flags_fail(&set, "--out_dir is too long (at most 900 characters)");
    if (!strcmp(o.device, "cpu") && !strcmp(o.precision, "bf16"))
        flags_fail(&set, "--precision bf16 needs a GPU: the CPU model computes in fp32 (use --device auto or cuda)");
    return o;
}

// ===================================================================== device and threads

// The first line: where this run computes, and why. A GPU trains in bf16
// unless --precision says otherwise; the CPU always in fp32 (gpt/model.h).
static gpt_precision announce_device(const options *o, const device_t *d) {
    log_main("%s: running on %s; why: %s\n", CHAPTER, d->name, d->why);
    return model_precision_for(o->precision, d);
}

// How many threads, and how they wait: gpt/threads.h (spin_briefly_in_openmp,
// choose_threads).

// ===================================================================== the mesh: dp x tp

// Where this rank sits: the job's ranks laid out as --dp x --tp (common/
// mesh.h, like init_device_mesh((dp, tp), mesh_dim_names=("dp", "tp"))),
// the last dimension fastest. The ranks of one tp group hold the shards of
// ONE model and see the same data; the ranks of one dp group hold the same
// shard and see different data:
//
//             tp 0   tp 1
//     dp 0:     0      1        tp groups {0,1} {2,3}: consecutive ranks, one machine
//     dp 1:     2      3        dp groups {0,2} {1,3}
typedef struct {
    mesh_t mesh;
    pg_t *dp, *tp;
    int dp_rank, dp_size, tp_rank, tp_size;
    dist_t *dist;
} parallel_t;

static void parallel_init(parallel_t *p, dist_t *d, const options *o) {
    memset(p, 0, sizeof *p);
    if (d->world_size % o->tp != 0)
        die("--tp %d does not divide the job's %d ranks: the ranks are laid out as dp x tp", o->tp, d->world_size);
    int shape[2] = {o->dp ? o->dp : d->world_size / o->tp, o->tp};
    const char *names[2] = {"dp", "tp"};
    if (shape[0] * shape[1] != d->world_size)
        die("--dp %d x --tp %d is %d ranks, and the job has %d", shape[0], shape[1], shape[0] * shape[1], d->world_size);
    mesh_init(&p->mesh, d->pg, 2, shape, names);
    p->dp = mesh_group(&p->mesh, "dp"), p->tp = mesh_group(&p->mesh, "tp");
    p->dp_rank = mesh_coord(&p->mesh, "dp"), p->dp_size = shape[0];
    p->tp_rank = mesh_coord(&p->mesh, "tp"), p->tp_size = shape[1];
    p->dist = d;
    mesh_report(&p->mesh, d);
}

// The process groups work on the device's memory (a GPU's, with nccl), so
// a few host numbers travel through it, as dist_all_reduce_host does for
// the whole job; these take any group of it.
static void group_all_reduce_host(pg_t *g, const device_t *dev, double *values, int count, redop_t op) {
    size_t bytes = sizeof(double) * (size_t)count;
    double *on_device = device_alloc(dev, bytes);
    device_from_host(dev, on_device, values, bytes);
    pg_all_reduce(g, on_device, on_device, (size_t)count, DTYPE_F64, op);
    device_to_host(dev, values, on_device, bytes);
    device_free(dev, on_device);
}

// mine: count numbers of type t; all: the group's, rank r's at r * count.
static void group_all_gather_host(pg_t *g, const device_t *dev, const void *mine, void *all, size_t count, dtype_t t) {
    size_t bytes = dtype_size(t) * count, world = (size_t)pg_world_size(g);
    if (bytes == 0) return;
    void *send = device_alloc(dev, bytes), *recv = device_alloc(dev, bytes * world);
    device_from_host(dev, send, mine, bytes);
    pg_all_gather(g, send, recv, count, t);
    device_to_host(dev, all, recv, bytes * world);
    device_free(dev, send);
    device_free(dev, recv);
}

// ===================================================================== data

// The text, its tokenizer and the three splits as tokens: gpt/corpus.h.
static corpus_t load_corpus(const options *o, const char *cache_dir) {
    return corpus_load(o->data_dir, o->verify_data, o->vocab_size, cache_dir);
}

// ===================================================================== evaluation

// Mean loss over a whole split, cut into non-overlapping pieces of T+1
// tokens (T inputs, each predicting the next); a shorter last piece counts
// too, so every token but the first of each piece is predicted exactly once.
// The dp replicas share the pieces (replica r takes pieces r, r+W, ...;
// replica 0 the short one), then add up their loss sums and token counts:
// no piece is counted twice, whatever the number of replicas. The ranks of
// a tp group compute each piece together.
static double evaluate(model_t *m, parallel_t *par, const uint16_t *tokens, size_t count, int B, int T) {
    double loss_sum = 0;
    size_t rank = (size_t)par->dp_rank, world = (size_t)par->dp_size;
    size_t predicted = 0, piece = (size_t)T + 1, full = count / piece;
    size_t mine = full > rank ? (full - rank + world - 1) / world : 0;
    uint16_t *in = xmalloc(sizeof(uint16_t) * (size_t)B * T), *tg = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    for (size_t first = 0; first < mine; first += (size_t)B) {
        int b = mine - first < (size_t)B ? (int)(mine - first) : B;
        for (int i = 0; i < b; i++) {
            const uint16_t *p = tokens + ((first + (size_t)i) * world + rank) * piece;
            memcpy(in + (size_t)i * T, p, sizeof(uint16_t) * T);
            memcpy(tg + (size_t)i * T, p + 1, sizeof(uint16_t) * T);
        }
        loss_sum += (double)model_forward(m, in, tg, b, T) * b * T;
        predicted += (size_t)b * T;
    }
    size_t rest = count - full * piece;
    if (rest >= 2 && rank == 0) {
        const uint16_t *last = tokens + full * piece;
        loss_sum += (double)model_forward(m, last, last + 1, 1, (int)rest - 1) * (double)(rest - 1);
        predicted += rest - 1;
    }
    free(in);
    free(tg);
    double sums[2] = {loss_sum, (double)predicted};
    group_all_reduce_host(par->dp, &par->dist->device, sums, 2, OP_SUM);
    if (sums[1] == 0) die("the split has fewer than 2 tokens: nothing to evaluate");
    return sums[0] / sums[1];
}

// ===================================================================== sampling

// Continuations of the prompt (gpt/samples.h); the same seed gives the same text.
static void print_samples(model_t *m, const bpe_t *t, const options *o) {
    samples_opts_t how = {o->prompt, o->num_samples, o->sample_tokens, o->temperature, o->top_k, o->seed};
    samples_print(t, &how, samples_from_model, m);
}

// ===================================================================== saving

// The whole model, put together from the shards of one tp group: every
// rank of the group calls it, and its tp rank 0 gets, in *whole, a model of
// chapter 08's layout - the parameters and, with `moments`, AdamW's moments
// and step - and returns true. Each array travels once around the group
// (an all-gather), and gpt_shard_copy puts each rank's part in its place.
static bool gather_whole(model_t *m, parallel_t *par, bool moments, gpt_t *whole) {
    model_to_host(m);
    gpt_t *h = &m->host;
    size_t n = h->num_params;
    bool root = par->tp_rank == 0;
    gpt_real *zeros = xcalloc(n, sizeof(gpt_real)), *all = xmalloc(sizeof(gpt_real) * n * (size_t)par->tp_size);
    gpt_real *mine[3] = {h->params, h->adam_m ? h->adam_m : zeros, h->adam_v ? h->adam_v : zeros};
    if (root) {
        gpt_init(whole, h->cfg, 0);
        whole->adam_step = h->adam_step;
        whole->adam_m = xcalloc(whole->num_params, sizeof(gpt_real));
        whole->adam_v = xcalloc(whole->num_params, sizeof(gpt_real));
    }
    for (int k = 0; k < (moments ? 3 : 1); k++) {
        group_all_gather_host(par->tp, &par->dist->device, mine[k], all, n, DTYPE_F32);
        gpt_real *to[3] = {root ? whole->params : NULL, root ? whole->adam_m : NULL, root ? whole->adam_v : NULL};
        for (int r = 0; root && r < par->tp_size; r++) gpt_shard_copy(h, r, to[k], all + (size_t)r * n, false);
    }
    free(zeros), free(all);
    return root;
}

// The model as safetensors and, beside it, the tokenizer that gives its
// token ids meaning: chapter 08's file, whole, which 08 --generate reads.
static void save_model(const gpt_t *whole, const bpe_t *t, const options *o) {
    run_save(whole, t, o->out_dir);
}

// --generate: no data, no training; the saved model and tokenizer only.
static int generate_only(const options *o) {
    char path[1100];
    gpt_t loaded;
    bpe_t *t = run_load(o->out_dir, CHAPTER, &loaded, path, sizeof path);
    device_t d = device_choose(o->device, launch_env_read().local_rank);
    gpt_precision precision = announce_device(o, &d);
    choose_threads();
    model_t m;
    model_create(&m, loaded, &d, precision, 1, loaded.cfg.block_size);
    log_main("model: %s: %zu parameters (block %d, %d layers, %d heads, %d channels, vocabulary %d), %s\n", path,
             m.host.num_params, m.host.cfg.block_size, m.host.cfg.n_layer, m.host.cfg.n_head, m.host.cfg.n_embd,
             m.host.cfg.vocab_size, model_precision(&m));
    print_samples(&m, t, o);
    bpe_free(t);
    model_free(&m);
    return 0;
}

// ===================================================================== checks

// The promises of this layout, checked byte for byte, as ddp_check_replicas
// checks chapter 04's: on the ranks of a tp group the replicated tensors
// (embeddings, LayerNorms, the row-parallel biases) have the same gradients
// and the same values - every rank computed them from the same numbers -
// and on the ranks of a dp group every tensor of the shard has the same
// averaged gradient and value (data parallelism's rules 2 and 3). A
// difference stops the job, naming the tensor and the ranks.
static void check_replicas(model_t *m, parallel_t *par, int step) {
    const gpt_real *grads = model_grads_to_host(m);
    model_to_host(m);
    const gpt_t *h = &m->host;
    size_t n = 2 * (size_t)h->num_tensors; // per tensor: its gradient's checksum, its values'
    int64_t *mine = xmalloc(sizeof(int64_t) * n);
    int64_t *tp_all = xmalloc(sizeof(int64_t) * n * (size_t)par->tp_size);
    int64_t *dp_all = xmalloc(sizeof(int64_t) * n * (size_t)par->dp_size);
    for (int t = 0; t < h->num_tensors; t++) {
        size_t bytes = sizeof(gpt_real) * h->tensors[t].count;
        mine[2 * t] = (int64_t)checksum_bytes(grads + h->tensors[t].offset, bytes);
        mine[2 * t + 1] = (int64_t)checksum_bytes(h->params + h->tensors[t].offset, bytes);
    }
    group_all_gather_host(par->tp, &par->dist->device, mine, tp_all, n, DTYPE_I64);
    group_all_gather_host(par->dp, &par->dist->device, mine, dp_all, n, DTYPE_I64);
    static const char *const what[2] = {"gradient", "values"}, *const differ[2] = {"differs", "differ"};
    for (size_t k = 0; k < n; k++) {
        const char *name = h->tensors[k / 2].name;
        for (int r = 1; r < par->tp_size && h->tensors[k / 2].split == GPT_REPLICATED; r++)
            if (tp_all[(size_t)r * n + k] != tp_all[k])
                die("after step %d the %s of %s, a replicated tensor, %s between tp ranks 0 and %d of rank %d's "
                    "tp group: every rank must compute it from the same numbers", step, what[k % 2], name,
                    differ[k % 2], r, par->dist->rank);
        for (int r = 1; r < par->dp_size; r++)
            if (dp_all[(size_t)r * n + k] != dp_all[k])
                die("after step %d the %s of %s %s between dp ranks 0 and %d of rank %d's dp group: the "
                    "replicas of a shard diverged", step, what[k % 2], name, differ[k % 2], r, par->dist->rank);
    }
    free(mine), free(tp_all), free(dp_all);
}

// ===================================================================== training

typedef struct {
    int steps_per_epoch, total_steps, warmup;
    size_t num_blocks;         // training sequences of T+1 tokens (overlapping by one)
    sampler_t sampler;         // this rank's blocks of each epoch
    uint16_t *inputs, *targets;
    double start, train_time;  // wall clock; seconds spent in training steps
    int loss_count;            // steps since the last progress line
    double interval_start;
    metrics_csv csv;           // rank 0 only
    dist_t *dist;
    parallel_t *par;
    double tp_bytes_per_step;  // all-reduced over the tp group in one training step (measured)
    double tp_numbers_per_step;
} trainer_t;

static trainer_t make_trainer(const options *o, const corpus_t *c, parallel_t *par) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    int B = o->batch_size, T = o->block_size, replicas = par->dp_size;
    dist_t *d = par->dist;
    tr.dist = d, tr.par = par;
    tr.num_blocks = c->count[0] > 1 ? (c->count[0] - 1) / (size_t)T : 0;
    if (tr.num_blocks < (size_t)replicas)
        die("the training split has %zu tokens: too few blocks of %d for %d replicas", c->count[0], T, replicas);
    // Every replica gets the same number of blocks (DistributedSampler
    // semantics over the dp group), so every rank takes the same number of
    // steps; the ranks of a tp group get the same blocks: they share one model.
    tr.sampler = sampler_create((int64_t)tr.num_blocks, replicas, par->dp_rank, true, (uint64_t)o->seed, false);
    int64_t per_rank = ((int64_t)tr.num_blocks + replicas - 1) / replicas;
    tr.steps_per_epoch = (int)(per_rank / ((int64_t)B * o->grad_accum));
    if (tr.steps_per_epoch < 1)
        die("the training split has %zu tokens: too few for one step of %d replica(s) x %d x %d x %d tokens (use a "
            "smaller --batch_size, --grad_accum or --block_size)", c->count[0], replicas, o->grad_accum, B, T);
    tr.total_steps = tr.steps_per_epoch * o->epochs;
    if (o->max_steps > 0 && o->max_steps < tr.total_steps) tr.total_steps = o->max_steps;
    tr.warmup = o->warmup_steps < tr.total_steps / 5 ? o->warmup_steps : tr.total_steps / 5;
    tr.inputs = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    tr.targets = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    if (d->rank == 0) {
        tr.csv = metrics_open(o->out_dir, "metrics", "step,epoch,train_loss,valid_loss,tokens_per_s");
        char date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
        // One comment line that plots/make_plots.sh reads for the figures' titles.
        metrics_row(&tr.csv, "# %s | backend %s | %d rank(s), dp %d x tp %d | %s", d->device.name,
                    backend_name(pg_backend(d->pg)), d->world_size, par->dp_size, par->tp_size, date);
    }
    return tr;
}

// Micro-batch `index` of the epoch: B of this rank's blocks, in order.
static void fill_batch(trainer_t *tr, const uint16_t *train, int index, int B, int T) {
    for (int b = 0; b < B; b++) {
        const uint16_t *block = train + (size_t)tr->sampler.indices[(size_t)index * B + b] * T;
        memcpy(tr->inputs + (size_t)b * T, block, sizeof(uint16_t) * T);
        memcpy(tr->targets + (size_t)b * T, block + 1, sizeof(uint16_t) * T);
    }
}

// The learning rate of step `step` (counted from 0): a linear warm-up from
// lr/warmup to lr over the first tr->warmup steps (Adam's moment estimates
// are poor at first), then a cosine from lr down to min_lr at the last
// step, and min_lr after it.
static float learning_rate(const trainer_t *tr, const options *o, int step) {
    float max_lr = (float)o->lr, min_lr = (float)o->min_lr;
    if (step < tr->warmup) return max_lr * (float)(step + 1) / (float)tr->warmup;
    if (step >= tr->total_steps) return min_lr;
    double progress = (double)(step - tr->warmup) / (double)(tr->total_steps - tr->warmup);
    return min_lr + (float)(0.5 * (1 + cos(3.141592653589793 * progress))) * (max_lr - min_lr);
}

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// the dp replicas, then clip and AdamW. The losses are not read here: on a GPU
// that would make the host wait for every step, and the progress line
// reads them (model_take_train_loss) every --log_every steps instead.
static void train_step(model_t *m, trainer_t *tr, const options *o, const uint16_t *train, int step_in_epoch, int step) {
    model_zero_grad(m);
    for (int micro = 0; micro < o->grad_accum; micro++) {
        fill_batch(tr, train, step_in_epoch * o->grad_accum + micro, o->batch_size, o->block_size);
        model_train_forward(m, tr->inputs, tr->targets, o->batch_size, o->block_size);
        // The mean over micro-batches; on the last one, a GPU starts
        // averaging each bucket of gradients as soon as it is computed.
        bool last = micro == o->grad_accum - 1;
        model_backward(m, 1.0f / (float)o->grad_accum, last ? tr->par->dp : NULL);
    }
    // DDP over the dp group: the ranks that hold the same shard end with
    // the same averaged gradient of it. (The ranks of a tp group hold
    // different shards; their replicated tensors' gradients are equal,
    // having been computed from the same numbers.) The norm of the
    // clipping adds up the shards over tp.
    model_average_gradients(m, tr->par->dp);
    model_tp_agree(m); // on a GPU: the replicated gradients of tp rank 0 (model.h says why)
    model_clip_grad_norm(m, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

static void format_duration(double seconds, char *buf, size_t size) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// The progress line: the loss averaged since the last line over the dp
// replicas (the ranks of a tp group have the same loss), the speed (of all
// ranks together: the tokens of every replica), the time left.
static void report_progress(model_t *m, trainer_t *tr, const options *o, int step, int epoch) {
    double loss = model_take_train_loss(m);           // waits for the GPU, once per line
    group_all_reduce_host(tr->par->dp, &tr->dist->device, &loss, 1, OP_AVG);
    double now = now_seconds(), tokens = (double)tr->loss_count * o->batch_size * o->grad_accum * o->block_size *
                                         tr->par->dp_size;
    double tok_per_s = tokens / (now - tr->interval_start);
    char eta[32];
    format_duration(tr->train_time / step * (tr->total_steps - step), eta, sizeof eta);
    log_main("epoch %d | step %d/%d | loss %.4f | lr %.2e | %.0f tokens/s | ETA %s\n", epoch + 1, step,
             tr->total_steps, loss, learning_rate(tr, o, step - 1), tok_per_s, eta);
    metrics_row(&tr->csv, "%d,%d,%.5f,,%.1f", step, epoch + 1, loss, tok_per_s);
    tr->loss_count = 0;
    tr->interval_start = now_seconds();
}

static void validate(model_t *m, trainer_t *tr, const corpus_t *c, const options *o, int step, int epoch) {
    double start = now_seconds();
    double loss = evaluate(m, tr->par, c->split[1], c->count[1], o->batch_size, o->block_size);
    log_main("validation after step %d (epoch %d): loss %.4f | perplexity %.2f | %zu tokens in %.1f s\n", step,
             epoch + 1, loss, exp(loss), c->count[1], now_seconds() - start);
    metrics_row(&tr->csv, "%d,%d,,%.5f,", step, epoch + 1, loss);
    tr->interval_start += now_seconds() - start; // validation time is not training speed
}

// ===================================================================== snapshots

// The resumable state, as in chapter 06: the parameters, both AdamW moments
// and its step count, where the run is, and the configuration that must
// match. The WHOLE model's, as chapter 08 writes it: the ranks of replica
// 0 gather it (gather_whole) at the end of an epoch, and rank 0 writes it.
// So a run with another --tp, or chapter 08, resumes from it.
static void save_snapshot(model_t *model, parallel_t *par, const options *o, int epochs_done, int step) {
    gpt_t whole;
    if (!gather_whole(model, par, true, &whole)) return;
    const gpt_t *m = &whole;
    int64_t shape[1] = {(int64_t)m->num_params};
    float *zeros = m->adam_m ? NULL : xcalloc(m->num_params, sizeof(float));
    safetensors_tensor t[3] = {safetensors_tensor_of("params", "F32", m->params, 1, shape),
                            safetensors_tensor_of("adam_m", "F32", m->adam_m ? m->adam_m : zeros, 1, shape),
                            safetensors_tensor_of("adam_v", "F32", m->adam_v ? m->adam_v : zeros, 1, shape)};
    safetensors_meta meta[12];
    int n = 0;
    meta[n++] = safetensors_meta_of("config", "vocab %d block %d layers %d heads %d embd %d", m->cfg.vocab_size,
                                 m->cfg.block_size, m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd);
    meta[n++] = safetensors_meta_of("training", "batch %d accum %d lr %.9g seed %d", o->batch_size, o->grad_accum,
                                 o->lr, o->seed);
    meta[n++] = safetensors_meta_of("epoch", "%d", epochs_done);
    meta[n++] = safetensors_meta_of("step", "%d", step);
    meta[n++] = safetensors_meta_of("adam_step", "%d", m->adam_step);
    meta[n++] = safetensors_meta_of("world_size", "%d", par->dist->world_size);
    meta[n++] = safetensors_meta_of("mesh", "dp %d tp %d", par->dp_size, par->tp_size);
    char err[1400];
    if (!snapshot_save_step(o->snapshot_path, step, t, 3, meta, n, 2, err, sizeof err))
        die("could not save the snapshot: %s", err);
    log_main("snapshot saved: Epoch %d (step %d) in %s\n", epochs_done, step, o->snapshot_path);
    free(zeros);
    gpt_free(&whole);
}

static int64_t snapshot_int(const safetensors_t *s, const char *key) {
    int64_t v = 0;
    char err[300];
    if (!snapshot_meta_i64(s, key, &v, err, sizeof err)) die("snapshot %s: %s", s->path, err);
    return v;
}

// This rank's shard of the whole model (parameters, AdamW's moments and
// step), onto the device.
static void take_shard(model_t *model, gpt_t *whole, const parallel_t *par) {
    gpt_t *h = &model->host;
    gpt_shard_copy(h, par->tp_rank, whole->params, h->params, true);
    h->adam_step = whole->adam_step;
    if (whole->adam_step > 0) {
        if (!h->adam_m) h->adam_m = xcalloc(h->num_params, sizeof(gpt_real));
        if (!h->adam_v) h->adam_v = xcalloc(h->num_params, sizeof(gpt_real));
        gpt_shard_copy(h, par->tp_rank, whole->adam_m, h->adam_m, true);
        gpt_shard_copy(h, par->tp_rank, whole->adam_v, h->adam_v, true);
    }
    model_to_device(model);
}

// Rank 0 loads the newest valid snapshot into `whole`, the whole model
// (every rank built it from the seed); everyone receives it by broadcast
// and keeps its shard. Returns the epochs already done (0: a fresh start)
// and sets *step. (A model too large for one rank's memory would be
// loaded shard by shard, from a file per rank, as Megatron does; this one
// fits, and one file of the whole model is what chapter 08 reads.)
static int resume(model_t *model, gpt_t *whole, const options *o, parallel_t *par, int *step) {
    gpt_t *m = whole;
    dist_t *d = par->dist;
    int64_t where[3] = {0, 0, 0}; // epoch, step, adam_step
    if (d->rank == 0 && o->snapshot_path) {
        safetensors_t s;
        char report[4096], err[1400], want[2][200];
        int found = snapshot_load_latest(o->snapshot_path, &s, report, sizeof report);
        if (report[0]) log_main("%s\n", report);
        if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", o->snapshot_path);
        if (found > 0) {
            int64_t shape[1] = {(int64_t)m->num_params};
            snprintf(want[0], sizeof want[0], "vocab %d block %d layers %d heads %d embd %d", m->cfg.vocab_size,
                     m->cfg.block_size, m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd);
            snprintf(want[1], sizeof want[1], "batch %d accum %d lr %.9g seed %d", o->batch_size, o->grad_accum,
                     o->lr, o->seed);
            if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
            if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
            if (!snapshot_expect_meta(&s, "config", want[0], err, sizeof err) ||
                !snapshot_expect_meta(&s, "training", want[1], err, sizeof err) ||
                !snapshot_copy(&s, "params", "F32", 1, shape, m->params, err, sizeof err) ||
                !snapshot_copy(&s, "adam_m", "F32", 1, shape, m->adam_m, err, sizeof err) ||
                !snapshot_copy(&s, "adam_v", "F32", 1, shape, m->adam_v, err, sizeof err))
                die("cannot resume from %s: %s", s.path, err);
            where[0] = snapshot_int(&s, "epoch"), where[1] = snapshot_int(&s, "step");
            where[2] = snapshot_int(&s, "adam_step");
            safetensors_release(&s);
        }
    }
    dist_broadcast_host(d, where, 3, DTYPE_I64, 0);
    if (where[2] > 0) {
        if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
        m->adam_step = (int)where[2];
        log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where[0], (long long)where[1]);
    }
    // Rule 1 of data parallelism, for the whole model: every rank starts
    // from rank 0's state. Then each keeps its shard.
    dist_broadcast_host(d, m->params, m->num_params, DTYPE_F32, 0);
    if (m->adam_step > 0) {
        dist_broadcast_host(d, m->adam_m, m->num_params, DTYPE_F32, 0);
        dist_broadcast_host(d, m->adam_v, m->num_params, DTYPE_F32, 0);
    }
    take_shard(model, m, par);
    *step = (int)where[1];
    return (int)where[0];
}

static void train(model_t *m, gpt_t *whole, const corpus_t *c, const options *o, trainer_t *tr) {
    log_main("training: %d step(s) (%d per epoch) of %d tokens (%d replica(s) x %d x batch %d x block %d) | lr %g -> "
             "%g, warm-up %d\n", tr->total_steps, tr->steps_per_epoch,
             tr->par->dp_size * o->grad_accum * o->batch_size * o->block_size, tr->par->dp_size,
             o->grad_accum, o->batch_size, o->block_size, o->lr, o->min_lr, tr->warmup);
    int step = 0;
    int first_epoch = resume(m, whole, o, tr->par, &step);
    gpt_free(whole); // from here on, each rank holds its shard only
    // For the tests, as in chapter 06: COURSE_FAIL_RANK and COURSE_FAIL_STEP
    // make a rank die before that step, in the first attempt only.
    fault_plan fault = fault_from_env();
    tr->start = tr->interval_start = now_seconds();
    for (int epoch = first_epoch; epoch < o->epochs && step < tr->total_steps; epoch++) {
        // Each rank takes its share of this epoch's order (seed + epoch).
        sampler_set_epoch(&tr->sampler, epoch);
        bool validated = false;
        for (int s = 0; s < tr->steps_per_epoch && step < tr->total_steps; s++) {
            double t0 = now_seconds();
            fault_maybe_die(&fault, tr->dist, step + 1);
            double sent = m->tp_bytes, numbers = m->tp_numbers;
            train_step(m, tr, o, c->split[0], s, step);
            tr->tp_bytes_per_step = m->tp_bytes - sent, tr->tp_numbers_per_step = m->tp_numbers - numbers;
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
            if (o->check_every > 0 && step % o->check_every == 0) check_replicas(m, tr->par, step);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        // The ranks of replica 0 gather the whole model; rank 0 writes it.
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0 && tr->par->dp_rank == 0;
        gpt_t whole_now;
        if (save && o->snapshot_path) save_snapshot(m, tr->par, o, epoch + 1, step);
        else if (save && gather_whole(m, tr->par, false, &whole_now)) save_model(&whole_now, c->tokenizer, o), gpt_free(&whole_now);
    }
}

// What one rank holds and sends, measured, beside the formulas (README.md,
// "What a rank holds and sends"). V vocabulary, T block, C channels, L
// layers, NH heads, B x T tokens per micro-batch (N = B T).
static void report_memory_and_traffic(model_t *m, const trainer_t *tr, const options *o) {
    const gpt_t *h = &m->host;
    double V = h->cfg.vocab_size, Tb = h->cfg.block_size, C = h->cfg.n_embd, L = h->cfg.n_layer;
    double NH = h->cfg.n_head, tp = tr->par->tp_size, B = o->batch_size, T = o->block_size, N = B * T;
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
    double numbers = tp > 1 ? 4 * L * N * C * o->grad_accum : 0, dp = tr->par->dp_size;
    log_main("per rank and step: tp all-reduces of %.0f numbers (%.2f MiB) measured; formula 4 x L x B x T x C x "
             "grad_accum (0 with tp 1) = %.0f; dp all-reduce of the shard's gradients %.0f numbers (%.2f MiB; 0 with "
             "dp 1); a ring all-reduce sends 2(n-1)/n of what it sums from every rank\n", tr->tp_numbers_per_step,
             tr->tp_bytes_per_step / 1048576, numbers, dp > 1 ? (double)h->num_params : 0,
             dp > 1 ? 4.0 * (double)h->num_params / 1048576 : 0);
}

// ===================================================================== main

// What every rank runs: one process, a rank spawned by --dp x --tp, or a
// worker started by ddprun or mpirun.
static int run_rank(int rank, int world, void *arg) {
    const options *op = arg, o_copy = *op;
    const options *o = &o_copy;
    (void)rank, (void)world;
    // --- Set-up: join the job (a job of one rank without a launcher).
    dist_t dist;
    dist_options how = {"env://", o->backend, o->device, o->timeout};
    dist_init(&dist, &how);
    gpt_precision precision = announce_device(o, &dist.device);
    choose_threads();
    nodes_report(&dist); // one line per node: host, ranks, device, transport
    parallel_t par;
    parallel_init(&par, &dist, o); // the mesh: rank -> (dp, tp) -> device
    char cache_dir[1000]; // --out_dir has at most 900 bytes
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", o->out_dir);
    files_make_dirs_or_die(cache_dir);

    // --- Data: rank 0 trains (or loads) the tokenizer and fills the token
    // cache first; the others then read the cache instead of doing it again.
    corpus_t corpus;
    if (dist.rank == 0) corpus = load_corpus(o, cache_dir);
    pg_barrier(dist.pg);
    if (dist.rank != 0) corpus = load_corpus(o, cache_dir);
    data_check_across_nodes(&dist, bpe_fingerprint(corpus.tokenizer), corpus.split, corpus.count); // same tokens everywhere

    // --- Model: sized by the flags, vocabulary by the tokenizer; the same
    // seed gives every rank the same WHOLE model, as in chapter 08 (and
    // rank 0's is broadcast anyway when training starts); each rank keeps
    // its shard, and the model all-reduces over the tp group.
    gpt_config cfg = {bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd};
    gpt_t initial, shard;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    gpt_init_shard(&shard, &initial, par.tp_size, par.tp_rank);
    model_t model;
    model_create(&model, shard, &dist.device, precision, o->batch_size, o->block_size);
    model_tensor_parallel(&model, par.tp);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s; %zu on each "
             "rank (its shard of every block: %d of the %d heads)\n", initial.num_params, cfg.vocab_size,
             cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, model_precision(&model), model.host.num_params,
             cfg.n_head / par.tp_size, cfg.n_head);

    // --- Training, with validation after every epoch.
    trainer_t tr = make_trainer(o, &corpus, &par);
    train(&model, &initial, &corpus, o, &tr);
    metrics_close(&tr.csv);
    check_replicas(&model, &par, tr.total_steps);
    log_main("replicas: the replicated tensors' gradients and values are the same bytes on the ranks of each tp "
             "group, and every shard on the ranks of each dp group\n");
    report_memory_and_traffic(&model, &tr, o);

    // --- Report: test perplexity; samples and the saved model, whole, from
    // the ranks of replica 0 (they compute together; rank 0 prints and saves).
    double test_loss = evaluate(&model, &par, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    gpt_t whole;
    if (par.dp_rank == 0) print_samples(&model, corpus.tokenizer, o);
    if (par.dp_rank == 0 && gather_whole(&model, &par, false, &whole)) {
        save_model(&whole, corpus.tokenizer, o);
        const gpt_t *h = &whole;
        double l2 = 0;
        for (size_t i = 0; i < h->num_params; i++) l2 += (double)h->params[i] * h->params[i];
        log_main("final parameters checksum %016llx, l2 norm %.9g\n",
                 (unsigned long long)checksum_bytes(h->params, sizeof(gpt_real) * h->num_params), sqrt(l2));
        log_main("metrics: %s (plot: gnuplot plots/08_gpt_loss.gp)\n", tr.csv.path);
        gpt_free(&whole);
    }

    free(tr.inputs), free(tr.targets);
    sampler_free(&tr.sampler);
    for (int s = 0; s < 3; s++) free(corpus.split[s]);
    bpe_free(corpus.tokenizer);
    model_free(&model);
    mesh_free(&par.mesh);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    options o = parse_options(argc, argv);
    if (o.generate) return generate_only(&o);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --dp M --tp N spawns M x N ranks (mp.spawn style, chapter 04).
    int ranks = (o.dp ? o.dp : 1) * o.tp;
    if (launch_env_read().launched || ranks == 1) return run_rank(0, 1, &o);
    return spawn(ranks, run_rank, &o);
}
