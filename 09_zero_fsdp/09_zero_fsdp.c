// 09_zero_fsdp.c - Chapter 9: sharded data parallelism - ZeRO-1, ZeRO-2
// and FSDP (ZeRO-3) - on chapter 08's GPT.
//
// Chapter 08 trained with DDP: every rank holds the whole model, all its
// gradients and all of AdamW's state, and averages the gradients. That is
// N copies of the same numbers. ZeRO (Rajbhandari et al., 2020) keeps one:
// each rank owns a 1/N slice of every bucket of the flat parameter array
// (zero.h, section 1), and --shard says how much of the state is sharded:
//   0  nothing: 08's DDP (all-reduce the gradients, every rank steps all);
//   1  AdamW's moments: the gradients are reduce-scattered, each rank
//      updates its slice, the parameters are all-gathered;
//   2  and the gradients: each bucket is reduce-scattered during the
//      backward pass, as soon as it is computed, and then dropped;
//   3  and the parameters (FSDP's FULL_SHARD): each block's parameters are
//      all-gathered just before its forward pass and again before its
//      backward pass, and dropped after.
// Each rank prints what it holds, by kind, beside the ZeRO paper's formula,
// and what it sends per step, beside the theory.
//
// Read it beside 08: `make diffs` shows 08 -> 09, and that diff is the
// chapter. Everything that is not about sharding - the flags, the data,
// the evaluation, the samples - is 08's. The machinery of the slices is in
// zero.h; the model is ../gpt/'s, which lets a caller provide each bucket's
// parameters and gradients (gpt_layout.h, section 3).
//
// Snapshots are sharded too: every rank writes its own slices of the state
// (a safetensors file, atomically) and rank 0 then an index that makes the
// step complete. A run with another number of ranks reshards on load, and
// --consolidate writes the latest snapshot as one model file that 08's
// --generate loads.
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
#include "zero.h"
#include "zero_devices.h"
#include "zero_report.h"

#define CHAPTER "09_zero_fsdp"

typedef struct {
    int epochs, batch_size, grad_accum, max_steps, warmup_steps, eval_every, log_every, save_every, seed;
    int vocab_size, block_size, n_layer, n_head, n_embd;
    double lr, min_lr, weight_decay, grad_clip, temperature;
    int top_k, num_samples, sample_tokens, nprocs, shard;
    double timeout;
    const char *backend;
    bool generate, verify_data, consolidate;
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
    flag_int(&set, "nprocs", &o->nprocs, 1, 256, "ranks to spawn for data parallelism (under ddprun: ignored)");
    flag_choice(&set, "backend", &o->backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_int(&set, "shard", &o->shard, 0, 3, "ZeRO stage: 0 DDP (chapter 08), 1 optimizer state, 2 and gradients, 3 and parameters (FSDP)");
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
    flag_bool(&set, "consolidate", &o->consolidate, "write the latest sharded snapshot (--snapshot_path) as one model in --out_dir; no training");
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
}

static options parse_options(int argc, char **argv) {
    options o = {.epochs = 1, .batch_size = 8, .grad_accum = 1, .max_steps = 0, .warmup_steps = 100,
                 .eval_every = 1000, .log_every = 10, .save_every = 0, .seed = 1337, .vocab_size = 5000,
                 .lr = 1e-3, .min_lr = -1, .weight_decay = 0.1, .grad_clip = 1.0, .temperature = 0.8,
                 .top_k = 40, .num_samples = 3, .sample_tokens = 64, .verify_data = true,
                 .preset = "default", .prompt = "The", .device = "auto", .nprocs = 1, .backend = "auto",
                 .precision = "auto", .shard = 3};
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
    if (o.consolidate && !o.snapshot_path)
        flags_fail(&set, "--consolidate needs --snapshot_path (the snapshots to consolidate)");
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

// ===================================================================== data

// The text, its tokenizer and the three splits as tokens: gpt/corpus.h.
static corpus_t load_corpus(const options *o, const char *cache_dir) {
    return corpus_load(o->data_dir, o->verify_data, o->vocab_size, cache_dir);
}

// ===================================================================== evaluation

// Mean loss over a whole split, cut into non-overlapping pieces of T+1
// tokens (T inputs, each predicting the next); a shorter last piece counts
// too, so every token but the first of each piece is predicted exactly once.
// The ranks share the pieces (rank r takes pieces r, r+W, ...; rank 0 the
// short one), then add up their loss sums and token counts: no piece is
// counted twice, whatever the world size.
// With ZeRO-3 every forward pass gathers each block from every rank: a
// collective, so every rank must make as many as the others. A rank with
// fewer pieces makes passes over one token that count nothing (PyTorch's
// FSDP has the same rule; DDP's join() exists for the same reason).
static double evaluate(model_t *m, dist_t *d, const uint16_t *tokens, size_t count, int B, int T) {
    double loss_sum = 0;
    size_t predicted = 0, piece = (size_t)T + 1, full = count / piece;
    size_t mine = full > (size_t)d->rank ? (full - (size_t)d->rank + (size_t)d->world_size - 1) / (size_t)d->world_size : 0;
    size_t rest = count - full * piece;
    double passes = (double)((mine + (size_t)B - 1) / (size_t)B + (rest >= 2 && d->rank == 0)), most = passes;
    dist_all_reduce_host(d, &most, 1, OP_MAX);
    uint16_t *in = xmalloc(sizeof(uint16_t) * (size_t)B * T), *tg = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    for (size_t first = 0; first < mine; first += (size_t)B) {
        int b = mine - first < (size_t)B ? (int)(mine - first) : B;
        for (int i = 0; i < b; i++) {
            const uint16_t *p = tokens + ((first + (size_t)i) * (size_t)d->world_size + (size_t)d->rank) * piece;
            memcpy(in + (size_t)i * T, p, sizeof(uint16_t) * T);
            memcpy(tg + (size_t)i * T, p + 1, sizeof(uint16_t) * T);
        }
        loss_sum += (double)model_forward(m, in, tg, b, T) * b * T;
        predicted += (size_t)b * T;
    }
    if (rest >= 2 && d->rank == 0) {
        const uint16_t *last = tokens + full * piece;
        loss_sum += (double)model_forward(m, last, last + 1, 1, (int)rest - 1) * (double)(rest - 1);
        predicted += rest - 1;
    }
    for (uint16_t none = 0; passes < most; passes++) model_forward(m, &none, &none, 1, 1);
    free(in);
    free(tg);
    double sums[2] = {loss_sum, (double)predicted};
    dist_all_reduce_host(d, sums, 2, OP_SUM);
    if (sums[1] == 0) die("the split has fewer than 2 tokens: nothing to evaluate");
    return sums[0] / sums[1];
}

// ===================================================================== sampling and saving

// What the run prints and leaves behind (gpt/samples.h): continuations of
// the prompt - the same seed gives the same text - and the model with its
// tokenizer in --out_dir, which --generate reads back.
static void print_samples(model_t *m, const bpe_t *t, const options *o) {
    samples_opts_t how = {o->prompt, o->num_samples, o->sample_tokens, o->temperature, o->top_k, o->seed};
    samples_print(t, &how, samples_from_model, m);
}

static void save_model(model_t *m, const bpe_t *t, const options *o) {
    model_to_host(m); // the parameters, back from the device
    run_save(&m->host, t, o->out_dir);
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
    zero_t *zero;              // this rank's slices (zero.h)
} trainer_t;

static trainer_t make_trainer(const options *o, const corpus_t *c, dist_t *d, zero_t *z) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    int B = o->batch_size, T = o->block_size;
    tr.dist = d, tr.zero = z;
    tr.num_blocks = c->count[0] > 1 ? (c->count[0] - 1) / (size_t)T : 0;
    if (tr.num_blocks < (size_t)d->world_size)
        die("the training split has %zu tokens: too few blocks of %d for %d ranks", c->count[0], T, d->world_size);
    // Every rank gets the same number of blocks (DistributedSampler semantics),
    // so every rank takes the same number of steps.
    tr.sampler = sampler_create((int64_t)tr.num_blocks, d->world_size, d->rank, true, (uint64_t)o->seed, false);
    int64_t per_rank = ((int64_t)tr.num_blocks + d->world_size - 1) / d->world_size;
    tr.steps_per_epoch = (int)(per_rank / ((int64_t)B * o->grad_accum));
    if (tr.steps_per_epoch < 1)
        die("the training split has %zu tokens: too few for one step of %d rank(s) x %d x %d x %d tokens (use a "
            "smaller --batch_size, --grad_accum or --block_size)", c->count[0], d->world_size, o->grad_accum, B, T);
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
        metrics_row(&tr.csv, "# %s | backend %s | %d rank(s) | %s", d->device.name,
                    backend_name(pg_backend(d->pg)), d->world_size, date);
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

// One optimizer step: grad_accum micro-batches, then the update. With
// --shard 0 it is 08's: the gradients averaged over the ranks, then clip
// and AdamW on every rank. The stages of ZeRO keep less on each rank, and
// so change what happens after the backward pass - or, for 2 and 3, during
// it. The losses are not read here: on a GPU that would make the host wait
// for every step, and the progress line reads them every --log_every steps.
static void train_step(model_t *m, trainer_t *tr, const options *o, const uint16_t *train, int step_in_epoch, int step) {
    zero_t *z = tr->zero;
    zero_begin_step(z); // ZeRO-2, 3: the gradient slices start from zero
    if (z->stage < 2) model_zero_grad(m);
    for (int micro = 0; micro < o->grad_accum; micro++) {
        fill_batch(tr, train, step_in_epoch * o->grad_accum + micro, o->batch_size, o->block_size);
        model_train_forward(m, tr->inputs, tr->targets, o->batch_size, o->block_size);
        // The mean over micro-batches; on the last one, DDP on a GPU starts
        // averaging each bucket of gradients as soon as it is computed.
        // ZeRO-2 and 3 reduce-scatter each bucket in the model's bucket
        // hook instead (zero.h, section 4), on every micro-batch.
        bool last = micro == o->grad_accum - 1;
        z->first_micro = micro == 0;
        model_backward(m, 1.0f / (float)o->grad_accum, last && z->stage == 0 ? tr->dist->pg : NULL);
    }
    float lr = learning_rate(tr, o, step);
    if (z->stage == 0) {
        // DDP: every rank ends with the same averaged gradient, so every rank
        // clips and steps the same way, and the replicas stay identical.
        model_average_gradients(m, tr->dist->pg);
        zero_count_all_reduce(z, m->host.num_params);
        model_clip_grad_norm(m, (float)o->grad_clip);
        model_adamw(m, lr, 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
    } else {
        // ZeRO-1: the whole gradient was computed on every rank; each keeps
        // the mean of its slices (ZeRO-2 and 3 did so during the backward pass).
        if (z->stage == 1) zero_reduce_scatter_gradients(z);
        // The clipping needs the norm of the whole gradient: each rank's
        // slices' squares, added up over the ranks. Then each rank runs
        // AdamW on its slices only: 1/N of the optimizer's work and state.
        float scale = zero_clip_scale(z, (float)o->grad_clip);
        z->ops->adamw(z, scale, lr, 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
        // ZeRO-1 and 2: the next forward pass needs all the parameters on
        // every rank: gather everyone's updated slices. ZeRO-3 gathers each
        // block when it computes, and keeps only the slices.
        if (z->stage < 3) zero_all_gather_params(z);
    }
    zero_end_step(z);
}

static void format_duration(double seconds, char *buf, size_t size) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// The progress line: the loss averaged since the last line over all ranks,
// the speed (of all ranks together), the time left.
static void report_progress(model_t *m, trainer_t *tr, const options *o, int step, int epoch) {
    double loss = model_take_train_loss(m);           // waits for the GPU, once per line
    dist_all_reduce_host(tr->dist, &loss, 1, OP_AVG);
    double now = now_seconds(), tokens = (double)tr->loss_count * o->batch_size * o->grad_accum * o->block_size *
                                         tr->dist->world_size;
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
    double loss = evaluate(m, tr->dist, c->split[1], c->count[1], o->batch_size, o->block_size);
    log_main("validation after step %d (epoch %d): loss %.4f | perplexity %.2f | %zu tokens in %.1f s\n", step,
             epoch + 1, loss, exp(loss), c->count[1], now_seconds() - start);
    metrics_row(&tr->csv, "%d,%d,,%.5f,", step, epoch + 1, loss);
    tr->interval_start += now_seconds() - start; // validation time is not training speed
}

// ===================================================================== snapshots, sharded

// The resumable state, as in chapter 06: the parameters, both AdamW moments
// and its step count, where the run is, and the configuration that must
// match. But no rank holds all of it (with ZeRO-3 not even the
// parameters), so every rank writes its own slices, padding left out:
// rank r of n the series DIR/STEM-shard<r>of<n>.<step>.safetensors. Once
// every rank's file is on disk, rank 0 writes the index, the series
// DIR/STEM.<step>.safetensors, which makes the step complete: a run
// killed while the shards are written resumes from the previous index,
// whose shards are still there (every series keeps its last two). The
// slices are the same in every stage, so any stage resumes any other's.
static void shard_path(const char *snapshot_path, int rank, int world, char *out, size_t size) {
    size_t n = strlen(snapshot_path), s = strlen(".safetensors");
    int stem = (int)(n > s && !strcmp(snapshot_path + n - s, ".safetensors") ? n - s : n);
    snprintf(out, size, "%.*s-shard%dof%d.safetensors", stem, snapshot_path, rank, world);
}

// What must match to resume: the model (both kinds of file say it) and
// the training (the index says it).
static safetensors_meta config_meta(const gpt_config *c) {
    return safetensors_meta_of("config", "vocab %d block %d layers %d heads %d embd %d", c->vocab_size, c->block_size,
                               c->n_layer, c->n_head, c->n_embd);
}

static safetensors_meta training_meta(const options *o) {
    return safetensors_meta_of("training", "batch %d accum %d lr %.9g seed %d", o->batch_size, o->grad_accum, o->lr,
                               o->seed);
}

static void save_snapshot(model_t *model, zero_t *z, const options *o, int epochs_done, int step) {
    size_t owned = zero_owned_total(z);
    float *slices[3];
    for (int i = 0; i < 3; i++) slices[i] = xmalloc((owned ? owned : 1) * sizeof(float));
    int adam_step = zero_slices_to_host(z, slices);
    int64_t shape[1] = {(int64_t)owned};
    safetensors_tensor t[3] = {safetensors_tensor_of("params", "F32", slices[0], 1, shape),
                               safetensors_tensor_of("adam_m", "F32", slices[1], 1, shape),
                               safetensors_tensor_of("adam_v", "F32", slices[2], 1, shape)};
    safetensors_meta meta[12];
    int n = 0;
    meta[n++] = config_meta(&model->host.cfg);
    meta[n++] = safetensors_meta_of("step", "%d", step);
    meta[n++] = safetensors_meta_of("shard", "%d of %d", z->rank, z->world);
    char path[FILES_PATH_MAX], err[1400];
    shard_path(o->snapshot_path, z->rank, z->world, path, sizeof path);
    if (!snapshot_save_step(path, step, t, 3, meta, n, 2, err, sizeof err))
        die("could not save this rank's shard: %s", err);
    for (int i = 0; i < 3; i++) free(slices[i]);
    pg_barrier(z->dist->pg); // every shard is durable
    if (z->rank == 0) {
        n = 0;
        meta[n++] = config_meta(&model->host.cfg);
        meta[n++] = training_meta(o);
        meta[n++] = safetensors_meta_of("epoch", "%d", epochs_done);
        meta[n++] = safetensors_meta_of("step", "%d", step);
        meta[n++] = safetensors_meta_of("adam_step", "%d", adam_step);
        meta[n++] = safetensors_meta_of("world_size", "%d", z->world);
        if (!snapshot_save_step(o->snapshot_path, step, NULL, 0, meta, n, 2, err, sizeof err))
            die("could not save the snapshot's index: %s", err);
    }
    log_main("snapshot saved: Epoch %d (step %d) in %s: %d shard(s) and an index\n", epochs_done, step,
             o->snapshot_path, z->world);
}

static int64_t snapshot_int(const safetensors_t *s, const char *key) {
    int64_t v = 0;
    char err[300];
    if (!snapshot_meta_i64(s, key, &v, err, sizeof err)) die("snapshot %s: %s", s->path, err);
    return v;
}

// Where a snapshot left off: its index's numbers (world 0: none found).
typedef struct {
    int64_t epoch, step, adam_step, world;
} snapshot_where;

// The newest complete snapshot of the series: its index, checked against
// this run's model and (o not NULL) its training.
static snapshot_where read_index(const char *snapshot_path, const gpt_config *c, const options *o) {
    snapshot_where w = {0, 0, 0, 0};
    safetensors_t s;
    char report[4096], err[1400];
    int found = snapshot_load_latest(snapshot_path, &s, report, sizeof report);
    if (report[0]) log_main("%s\n", report);
    if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", snapshot_path);
    if (found == 0) return w;
    safetensors_meta config = config_meta(c);
    bool ok = snapshot_expect_meta(&s, config.key, config.value, err, sizeof err);
    if (ok && o) {
        safetensors_meta training = training_meta(o);
        ok = snapshot_expect_meta(&s, training.key, training.value, err, sizeof err);
    }
    if (!ok) die("cannot resume from %s: %s", s.path, err);
    w.epoch = snapshot_int(&s, "epoch"), w.step = snapshot_int(&s, "step");
    w.adam_step = snapshot_int(&s, "adam_step"), w.world = snapshot_int(&s, "world_size");
    if (w.world < 1 || w.world > 65536)
        die("snapshot %s: world_size %lld is not a number of ranks", s.path, (long long)w.world);
    safetensors_release(&s);
    return w;
}

// A part of the flat array that a rank needs from a snapshot: parameters
// [first, first + count), into dst[0] (the parameters), dst[1] and dst[2]
// (AdamW's moments); a NULL dst is not needed.
typedef struct {
    size_t first, count;
    float *dst[3];
} state_range;

// Reads the shards that `where` names, one file at a time, and copies from
// each the parts that overlap the ranges asked for. The writer's slices are
// computed as zero.h cuts them, for the writer's number of ranks: that is
// all resharding takes - any number of ranks reads what any other wrote.
static void load_shards(const char *snapshot_path, snapshot_where where, const gpt_config *c, const state_range *want,
                        int nwant) {
    static const char *const names[3] = {"params", "adam_m", "adam_v"};
    int world = (int)where.world, buckets = gpt_layout_buckets(c, NULL, 0);
    safetensors_meta config = config_meta(c);
    for (int r = 0; r < world; r++) {
        char template[FILES_PATH_MAX], path[FILES_PATH_MAX + 32], err[1400], who[64];
        shard_path(snapshot_path, r, world, template, sizeof template);
        if (!snapshot_step_path(template, where.step, path, sizeof path)) die("snapshot path %s is too long", template);
        size_t owned = 0;
        for (int k = 0; k < buckets; k++) owned += zero_owned(gpt_layout_bucket(c, k).count, world, r);
        int64_t shape[1] = {(int64_t)owned};
        snprintf(who, sizeof who, "%d of %d", r, world);
        safetensors_t s;
        if (!snapshot_read(path, &s, err, sizeof err))
            die("the snapshot of step %lld names %d shards, but shard %d is unusable: %s", (long long)where.step, world, r,
                err);
        if (!snapshot_expect_meta(&s, config.key, config.value, err, sizeof err) ||
            !snapshot_expect_meta(&s, "shard", who, err, sizeof err))
            die("%s: %s", path, err);
        const float *data[3];
        for (int i = 0; i < 3; i++) {
            if (!snapshot_expect_tensor(&s, names[i], "F32", 1, shape, err, sizeof err)) die("%s: %s", path, err);
            data[i] = safetensors_find(&s, names[i])->data;
        }
        size_t pos = 0; // where each of rank r's slices lies in its file
        for (int k = 0; k < buckets; k++) {
            gpt_bucket b = gpt_layout_bucket(c, k);
            size_t first = b.offset + (size_t)r * zero_slice_size(b.count, world), n = zero_owned(b.count, world, r);
            for (int q = 0; q < nwant; q++) { // the overlap [lo, hi) of rank r's slice and range q
                const state_range *w = &want[q];
                size_t lo = first > w->first ? first : w->first;
                size_t hi = first + n < w->first + w->count ? first + n : w->first + w->count;
                for (int i = 0; i < 3 && lo < hi; i++)
                    if (w->dst[i]) memcpy(w->dst[i] + (lo - w->first), data[i] + pos + (lo - first), (hi - lo) * sizeof(float));
            }
            pos += n;
        }
        safetensors_release(&s);
    }
}

// Every rank reads the newest complete snapshot's index (rank 0 looks it up
// and says which), then the shards it needs: what its stage keeps whole
// (the parameters in ZeRO-1 and 2, everything in DDP), from every shard;
// what it keeps in slices, from the shards its slices overlap - its own
// when the number of ranks is the same. Returns the epochs already done
// (0: a fresh start) and sets *step and *resharded.
static int resume(model_t *model, zero_t *z, const options *o, dist_t *d, int *step, bool *resharded) {
    gpt_t *m = &model->host;
    snapshot_where where = {0, 0, 0, 0};
    if (d->rank == 0 && o->snapshot_path) where = read_index(o->snapshot_path, &m->cfg, o);
    dist_broadcast_host(d, &where, 4, DTYPE_I64, 0);
    *step = (int)where.step, *resharded = false;
    if (where.world == 0) return 0;
    state_range *want = xcalloc((size_t)z->num_buckets + 1, sizeof *want);
    int n = 0;
    float *slices[3] = {NULL, NULL, NULL};
    if (z->stage == 0) {
        if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
    }
    if (z->stage < 3) // the whole parameters, and in DDP the whole moments
        want[n++] = (state_range){0, m->num_params, {m->params, m->adam_m, m->adam_v}};
    if (z->stage > 0) { // this rank's slices, in shard arrays
        for (int i = 0; i < 3; i++) slices[i] = xcalloc(z->shard_len, sizeof(float));
        for (int k = 0; k < z->num_buckets; k++) {
            const zero_bucket *b = &z->buckets[k];
            float *p = z->stage == 3 ? slices[0] + b->at : NULL;
            want[n++] = (state_range){b->first, b->owned, {p, slices[1] + b->at, slices[2] + b->at}};
        }
    }
    load_shards(o->snapshot_path, where, &m->cfg, want, n);
    zero_slices_from_host(z, slices, (int)where.adam_step);
    for (int i = 0; i < 3; i++) free(slices[i]);
    free(want);
    *resharded = where.world != d->world_size;
    log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where.epoch, (long long)where.step);
    if (*resharded)
        log_main("resharded: the snapshot's %lld shard(s) loaded as %d\n", (long long)where.world, d->world_size);
    return (int)where.epoch;
}

// --consolidate: the newest snapshot as one model, as FSDP's full state
// dict: every shard read and put in its place (the same load as a resume,
// into the whole flat array), then written as the model file of 08's
// save_model - which 08's (and this chapter's) --generate loads. It prints
// a checksum of the whole state, so two snapshots can be compared.
static int consolidate_only(const options *o) {
    // The configuration is in the index; the tokenizer's vocabulary is in it too.
    safetensors_t s;
    char report[4096], err[1400];
    if (snapshot_load_latest(o->snapshot_path, &s, report, sizeof report) != 1)
        die("--consolidate: no complete snapshot for %s%s%s", o->snapshot_path, report[0] ? ": " : "", report);
    gpt_config c;
    const char *config = safetensors_meta_get(&s, "config");
    if (!config || sscanf(config, "vocab %d block %d layers %d heads %d embd %d", &c.vocab_size, &c.block_size,
                          &c.n_layer, &c.n_head, &c.n_embd) != 5 || gpt_config_problem(c))
        die("--consolidate: %s has no usable config", s.path);
    safetensors_release(&s);
    snapshot_where where = read_index(o->snapshot_path, &c, NULL); // the model must agree; the training flags need not
    gpt_t full;
    gpt_init(&full, c, 0);
    full.adam_m = xcalloc(full.num_params, sizeof(gpt_real));
    full.adam_v = xcalloc(full.num_params, sizeof(gpt_real));
    full.adam_step = (int)where.adam_step;
    state_range all = {0, full.num_params, {full.params, full.adam_m, full.adam_v}};
    load_shards(o->snapshot_path, where, &c, &all, 1);
    size_t bytes = full.num_params * sizeof(float);
    log_main("consolidated: %lld shard(s) of step %lld (epoch %lld): params %016llx, adam_m %016llx, adam_v %016llx, "
             "adam_step %lld\n", (long long)where.world, (long long)where.step, (long long)where.epoch,
             (unsigned long long)checksum_bytes(full.params, bytes), (unsigned long long)checksum_bytes(full.adam_m, bytes),
             (unsigned long long)checksum_bytes(full.adam_v, bytes), (long long)where.adam_step);
    char model[1100];
    snprintf(model, sizeof model, "%s/model.safetensors", o->out_dir);
    files_make_dirs_or_die(o->out_dir);
    if (!gpt_save_safetensors(&full, model, err, sizeof err)) die("saving the model: %s", err);
    log_main("saved: %s (%zu parameters); ./%s --generate --out_dir %s samples from it, with the run's "
             "tokenizer.json beside it\n", model, full.num_params, CHAPTER, o->out_dir);
    gpt_free(&full);
    return 0;
}

static void train(model_t *m, const corpus_t *c, const options *o, trainer_t *tr) {
    log_main("training: %d step(s) (%d per epoch) of %d tokens (%d rank(s) x %d x batch %d x block %d) | lr %g -> "
             "%g, warm-up %d\n", tr->total_steps, tr->steps_per_epoch,
             tr->dist->world_size * o->grad_accum * o->batch_size * o->block_size, tr->dist->world_size,
             o->grad_accum, o->batch_size, o->block_size, o->lr, o->min_lr, tr->warmup);
    int step = 0;
    bool resharded;
    int first_epoch = resume(m, tr->zero, o, tr->dist, &step, &resharded);
    // Shards of this run's own number of ranks, at once: a restart then
    // finds them without resharding (and --consolidate shows the same state).
    if (resharded) save_snapshot(m, tr->zero, o, first_epoch, step);
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
            train_step(m, tr, o, c->split[0], s, step);
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        // Every rank saves: its own shard of a snapshot, or its slices of
        // the model for rank 0 to write (zero_full_params: a collective).
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0;
        if (save && o->snapshot_path) save_snapshot(m, tr->zero, o, epoch + 1, step);
        else if (save) {
            zero_full_params(tr->zero);
            if (tr->dist->rank == 0) save_model(m, c->tokenizer, o);
        }
    }
}

// ===================================================================== main

// What every rank runs: one process, a rank spawned by --nprocs, or a
// worker started by ddprun.
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
    // seed gives every rank the same initial weights, and rank 0's are
    // broadcast anyway (ddp.h's rule 1). The model keeps what the stage
    // does not shard; each rank then keeps its slices of the rest.
    gpt_config cfg = {bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd};
    gpt_t initial;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    dist_broadcast_host(&dist, initial.params, initial.num_params, DTYPE_F32, 0);
    model_t model;
    model_create_keeping(&model, initial, &dist.device, precision, o->batch_size, o->block_size, zero_model_keeps(o->shard));
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s\n",
             model.host.num_params, cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd,
             model_precision(&model));
    zero_t zero;
    zero_setup(&zero, o->shard, &dist, &model, o->grad_accum, zero_ops_for(&model));
    log_main("sharding: %s; %d rank(s), each owning 1/%d of every bucket: %zu parameters a rank (padding included)\n",
             zero_stage_name(o->shard), dist.world_size, dist.world_size, zero.shard_len);

    // --- Training, with validation after every epoch; then what each rank
    // held and sent, beside the formulas.
    trainer_t tr = make_trainer(o, &corpus, &dist, &zero);
    train(&model, &corpus, o, &tr);
    metrics_close(&tr.csv);
    zero_report(&zero, o->grad_accum, o->out_dir);

    // --- Report: test perplexity, samples, the saved model (rank 0). With
    // ZeRO-3 each token sampled is a forward pass that gathers the blocks:
    // every rank samples, rank 0 prints. Saving needs the whole model on
    // rank 0, which ZeRO-3 gathers (FSDP's full state dict).
    double test_loss = evaluate(&model, &dist, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (dist.rank == 0 || zero.stage == 3) print_samples(&model, corpus.tokenizer, o);
    zero_full_params(&zero);
    double moments[2];
    zero_moment_norms(&zero, moments);
    if (dist.rank == 0) {
        save_model(&model, corpus.tokenizer, o);
        const gpt_t *h = &model.host; // up to date: save_model brought it back from the device
        double l2 = 0;
        for (size_t i = 0; i < h->num_params; i++) l2 += (double)h->params[i] * h->params[i];
        log_main("final parameters checksum %016llx, l2 norm %.9g\n",
                 (unsigned long long)checksum_bytes(h->params, sizeof(gpt_real) * h->num_params), sqrt(l2));
        log_main("final AdamW moments: l2 norm of m %.9g, of v %.9g\n", moments[0], moments[1]);
        log_main("metrics: %s (plot: gnuplot plots/08_gpt_loss.gp)\n", tr.csv.path);
    }

    zero_free(&zero);
    free(tr.inputs), free(tr.targets);
    sampler_free(&tr.sampler);
    for (int s = 0; s < 3; s++) free(corpus.split[s]);
    bpe_free(corpus.tokenizer);
    model_free(&model);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    options o = parse_options(argc, argv);
    if (o.generate) return generate_only(&o);
    if (o.consolidate) return consolidate_only(&o);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --nprocs N spawns N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || o.nprocs == 1) return run_rank(0, 1, &o);
    return spawn(o.nprocs, run_rank, &o);
}
