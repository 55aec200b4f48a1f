// 08_gpt_wikitext.c - Chapter 8: a GPT language model trained on WikiText-2.
//
// The capstone: everything the earlier chapters trained was a stand-in;
// this is the real thing, small. The program
//   1. finds WikiText-2 (wikitext.h) and checks it,
//   2. trains a byte-level BPE tokenizer on the training text, or loads the
//      one it trained before (bpe.h), and encodes the three splits,
//   3. trains a GPT (gpt.h) with AdamW, a warm-up + cosine learning rate,
//      gradient clipping and optional gradient accumulation,
//   4. measures the validation loss and perplexity on the whole validation
//      split after every epoch (and every --eval_every steps), the test
//      perplexity at the end,
//   5. samples a few continuations of a prompt, and saves the model as
//      safetensors with the tokenizer beside it, which --generate reloads.
//
// Read it top to bottom: options, device, data, model, training loop,
// evaluation, sampling, saving. The model itself, layer by layer, is in
// ../gpt/gpt.h: the GPT, its tokenizer and its data live in ../gpt/, which
// chapters 09-11 share.
//
// Where it computes: on a GPU when there is one (gpt_cuda.cu: our kernels
// and cuBLAS, in bf16 mixed precision by default), else on the CPU
// (gpt.h); model.h hides the difference, and everything else - data,
// sampler, snapshots, samples, the printed lines - is the same on both.
//
// Data parallel as in chapters 04-06: --nprocs N spawns N ranks, or
// ddprun starts them; each trains on its share of every epoch's blocks
// (common/sampler.h) and the gradients are averaged (common/ddp.h) before
// every step - on GPUs while the backward pass still runs. With
// --snapshot_path, rank 0 writes a resumable snapshot (common/snapshot.h)
// every --save_every epochs, and a restarted run goes on from it.
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
#include "loader.h"
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

#define CHAPTER "08_gpt_wikitext"

typedef struct {
    int epochs, batch_size, grad_accum, max_steps, warmup_steps, eval_every, log_every, save_every, seed;
    int vocab_size, block_size, n_layer, n_head, n_embd;
    double lr, min_lr, weight_decay, grad_clip, temperature, loss_scale;
    int top_k, num_samples, sample_tokens, nprocs, num_workers, powersgd_rank;
    double timeout;
    const char *backend;
    bool generate, verify_data, cuda_graph;
    const char *preset, *data_dir, *out_dir, *snapshot_path, *prompt, *device, *precision, *grad_compress;
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
    flag_int(&set, "num_workers", &o->num_workers, 0, 1, "threads that make the next batch while a step trains (DataLoader's num_workers)");
    flag_int(&set, "save_every", &o->save_every, 0, 1000000, "save the model every N epochs (0: at the end only)");
    flag_string(&set, "snapshot_path", &o->snapshot_path, "resumable snapshots DIR/STEM.safetensors, every --save_every epochs");
    flag_int(&set, "nprocs", &o->nprocs, 1, 256, "ranks to spawn for data parallelism (under ddprun: ignored)");
    flag_choice(&set, "backend", &o->backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_double(&set, "timeout", &o->timeout, 0, 86400, "seconds a rank waits for another (0: COURSE_TIMEOUT or 300)");
    flag_choice(&set, "grad_compress", &o->grad_compress, "none|bf16|fp16|powersgd", "gradients all-reduced as fp32, rounded to bf16 or fp16 (half the bytes; DDP's bf16_ and fp16_compress_hook), or low-rank (powerSGD_hook)");
    flag_int(&set, "powersgd_rank", &o->powersgd_rank, 1, 1024, "--grad_compress powersgd: the rank R of each matrix's two thin factors (PyTorch's matrix_approximation_rank)");
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
    flag_choice(&set, "precision", &o->precision, "auto|bf16|fp16|fp32", "number format on a GPU (auto: bf16 there, fp32 on the CPU; fp16 for GPUs without bf16)");
    flag_double(&set, "loss_scale", &o->loss_scale, 1, 1099511627776.0, "fp16: the first loss scale, a power of two (GradScaler's init_scale)");
    flag_bool(&set, "cuda_graph", &o->cuda_graph, "on a GPU, one process, no --grad_accum: each step is one CUDA graph launch");
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
                 .top_k = 40, .num_samples = 3, .sample_tokens = 64, .verify_data = true, .cuda_graph = true,
                 .preset = "default", .prompt = "The", .device = "auto", .nprocs = 1, .backend = "auto",
                 .precision = "auto", .grad_compress = "none", .num_workers = 0, .loss_scale = 65536,
                 .powersgd_rank = 1};
    static char default_out_dir[1024]; // outlives this function: o.out_dir points at it
    files_runs_dir(default_out_dir, sizeof default_out_dir, CHAPTER);
    o.out_dir = default_out_dir;
    flag_set set = option_flags(&o);
    flags_parse(&set, argc, argv);
    apply_preset(&o, &set);
    if (o.min_lr < 0) o.min_lr = o.lr / 10;
    if (o.min_lr > o.lr) flags_fail(&set, "--min_lr %g is above --lr %g", o.min_lr, o.lr);
    if (strlen(o.out_dir) > 900) flags_fail(&set, "--out_dir is too long (at most 900 characters)");
    if (!strcmp(o.device, "cpu") && (!strcmp(o.precision, "bf16") || !strcmp(o.precision, "fp16")))
        flags_fail(&set, "--precision %s needs a GPU: the CPU model computes in fp32 (use --device auto or cuda)",
                   o.precision);
    // A power of two: multiplying and dividing by it changes no digit of a
    // gradient, only its exponent (the scaler halves and doubles it).
    int exponent;
    if (frexp(o.loss_scale, &exponent) != 0.5)
        flags_fail(&set, "--loss_scale %g is not a power of two (65536 is GradScaler's default)", o.loss_scale);
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
static double evaluate(model_t *m, dist_t *d, const uint16_t *tokens, size_t count, int B, int T) {
    double loss_sum = 0;
    size_t predicted = 0, piece = (size_t)T + 1, full = count / piece;
    size_t mine = full > (size_t)d->rank ? (full - (size_t)d->rank + (size_t)d->world_size - 1) / (size_t)d->world_size : 0;
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
    size_t rest = count - full * piece;
    if (rest >= 2 && d->rank == 0) {
        const uint16_t *last = tokens + full * piece;
        loss_sum += (double)model_forward(m, last, last + 1, 1, (int)rest - 1) * (double)(rest - 1);
        predicted += rest - 1;
    }
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
    loader_t loader;           // makes the batches from them, a step ahead (gpt/loader.h)
    double start, train_time;  // wall clock; seconds spent in training steps
    int loss_count;            // steps since the last progress line
    double interval_start;
    metrics_csv csv;           // rank 0 only
    dist_t *dist;
    bool graph;                // each step one CUDA graph launch (train_step)
} trainer_t;

static trainer_t make_trainer(const options *o, const corpus_t *c, dist_t *d) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    int B = o->batch_size, T = o->block_size;
    tr.dist = d;
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
    tr.loader = loader_create(c->split[0], B, T, o->num_workers);
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
// the ranks, then clip and AdamW. The losses are not read here: on a GPU
// that would make the host wait for every step, and the progress line
// reads them (model_take_train_loss) every --log_every steps instead.
static void train_step(model_t *m, trainer_t *tr, const options *o, int step) {
    if (tr->graph) {
        // The same step - zero_grad, forward, backward, clip, AdamW - as ONE
        // launch of a CUDA graph captured at the first step (gpt_cuda.cu,
        // section 10): the tokens and this step's learning rate are copied to
        // the GPU before it, and it computes what the calls below compute.
        const loader_batch_t *batch = loader_next(&tr->loader);
        model_graph_step(m, batch->inputs, batch->targets, o->batch_size, o->block_size, (float)o->grad_clip,
                         learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
        return;
    }
    model_zero_grad(m);
    for (int micro = 0; micro < o->grad_accum; micro++) {
        // The next micro-batch of this rank's blocks, in order; with
        // --num_workers 1 a thread made it while the last step trained.
        const loader_batch_t *batch = loader_next(&tr->loader);
        model_train_forward(m, batch->inputs, batch->targets, o->batch_size, o->block_size);
        // The mean over micro-batches; on the last one, a GPU starts
        // averaging each bucket of gradients as soon as it is computed.
        bool last = micro == o->grad_accum - 1;
        model_backward(m, 1.0f / (float)o->grad_accum, last ? tr->dist->pg : NULL);
    }
    // DDP: every rank ends with the same averaged gradient, so every rank
    // clips and steps the same way, and the replicas stay identical.
    model_average_gradients(m, tr->dist->pg);
    model_clip_grad_norm(m, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

static void format_duration(double seconds, char *buf, size_t size) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// fp16 only: the loss scale now, and the steps skipped for overflow so far
// (every rank skips the same ones: the gradients were averaged first).
static const char *loss_scale_note(model_t *m) {
    static char note[96];
    gpt_scaler s = model_get_scaler(m); // waits for the GPU; scale 0: not fp16
    if (s.scale == 0) return "";
    if (s.scale < 1)
        die("fp16: the loss scale fell below 1 after %d skipped steps: the gradients overflow even unscaled, "
            "so the run has diverged (try a lower --lr, or --precision bf16)", s.skipped_total);
    snprintf(note, sizeof note, " | loss scale %.0f, %d step(s) skipped", s.scale, s.skipped_total);
    return note;
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
    log_main("epoch %d | step %d/%d | loss %.4f | lr %.2e | %.0f tokens/s | ETA %s%s\n", epoch + 1, step,
             tr->total_steps, loss, learning_rate(tr, o, step - 1), tok_per_s, eta, loss_scale_note(m));
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

// ===================================================================== snapshots

// The resumable state, as in chapter 06: the parameters, both AdamW moments
// and its step count, where the run is, and the configuration that must
// match. Written by rank 0 at the end of an epoch.
static void save_snapshot(model_t *model, const options *o, int epochs_done, int step, int world) {
    model_to_host(model);
    const gpt_t *m = &model->host;
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
    meta[n++] = safetensors_meta_of("world_size", "%d", world);
    gpt_scaler scaler = model_get_scaler(model); // fp16: the loss scale goes on where it was
    if (scaler.scale >= 1) {
        meta[n++] = safetensors_meta_of("loss_scale", "%.0f", scaler.scale);
        meta[n++] = safetensors_meta_of("loss_scale_good_steps", "%d", scaler.good_steps);
        meta[n++] = safetensors_meta_of("steps_skipped", "%d", scaler.skipped_total);
    }
    char err[1400];
    if (!snapshot_save_step(o->snapshot_path, step, t, 3, meta, n, 2, err, sizeof err))
        die("could not save the snapshot: %s", err);
    log_main("snapshot saved: Epoch %d (step %d) in %s\n", epochs_done, step, o->snapshot_path);
    free(zeros);
}

static int64_t snapshot_int(const safetensors_t *s, const char *key) {
    int64_t v = 0;
    char err[300];
    if (!snapshot_meta_i64(s, key, &v, err, sizeof err)) die("snapshot %s: %s", s->path, err);
    return v;
}

// Rank 0 loads the newest valid snapshot; everyone receives it by broadcast.
// Returns the epochs already done (0: a fresh start) and sets *step.
static int resume(model_t *model, const options *o, dist_t *d, int *step) {
    gpt_t *m = &model->host;
    int64_t where[6] = {0, 0, 0, 0, 0, 0}; // epoch, step, adam_step; fp16's loss scale, good steps, skipped
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
            if (safetensors_meta_get(&s, "loss_scale")) { // an fp16 run's
                where[3] = snapshot_int(&s, "loss_scale"), where[4] = snapshot_int(&s, "loss_scale_good_steps");
                where[5] = snapshot_int(&s, "steps_skipped");
            }
            safetensors_release(&s);
        }
    }
    dist_broadcast_host(d, where, 6, DTYPE_I64, 0);
    if (where[2] > 0) {
        if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
        m->adam_step = (int)where[2];
        log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where[0], (long long)where[1]);
    }
    model_broadcast_state(model, d); // equal replicas from the start
    // fp16: the loss scale to start from, --loss_scale or the snapshot's.
    gpt_scaler scaler = {(float)o->loss_scale, 0, 0, 0};
    if (where[3] >= 1) scaler = (gpt_scaler){(float)where[3], (int)where[4], 0, (int)where[5]};
    model_set_scaler(model, scaler);
    *step = (int)where[1];
    return (int)where[0];
}

static void train(model_t *m, const corpus_t *c, const options *o, trainer_t *tr) {
    log_main("training: %d step(s) (%d per epoch) of %d tokens (%d rank(s) x %d x batch %d x block %d) | lr %g -> "
             "%g, warm-up %d\n", tr->total_steps, tr->steps_per_epoch,
             tr->dist->world_size * o->grad_accum * o->batch_size * o->block_size, tr->dist->world_size,
             o->grad_accum, o->batch_size, o->block_size, o->lr, o->min_lr, tr->warmup);
    // A CUDA graph holds the work of one GPU's stream: not the all-reduce
    // of several ranks between backward and AdamW, not a loop of micro-batches.
    const char *no_graph = !m->on_gpu ? "the CPU computes" : !o->cuda_graph ? "--cuda_graph=false"
                           : tr->dist->world_size > 1 ? "several ranks: the all-reduce sits inside the step"
                           : o->grad_accum > 1 ? "--grad_accum > 1" : NULL;
    tr->graph = !no_graph;
    if (m->on_gpu) {
        if (tr->graph) log_main("step: one CUDA graph launch after the copy of the tokens (--cuda_graph)\n");
        else log_main("step: launched call by call (no CUDA graph: %s)\n", no_graph);
    }
    int step = 0;
    int first_epoch = resume(m, o, tr->dist, &step), first_step = step;
    // For the tests, as in chapter 06: COURSE_FAIL_RANK and COURSE_FAIL_STEP
    // make a rank die before that step, in the first attempt only.
    fault_plan fault = fault_from_env();
    tr->start = tr->interval_start = now_seconds();
    for (int epoch = first_epoch; epoch < o->epochs && step < tr->total_steps; epoch++) {
        // Each rank takes its share of this epoch's order (seed + epoch).
        sampler_set_epoch(&tr->sampler, epoch);
        loader_set_epoch(&tr->loader, tr->sampler.indices, tr->steps_per_epoch * o->grad_accum);
        bool validated = false;
        for (int s = 0; s < tr->steps_per_epoch && step < tr->total_steps; s++) {
            double t0 = now_seconds();
            fault_maybe_die(&fault, tr->dist, step + 1);
            train_step(m, tr, o, step);
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0 && tr->dist->rank == 0;
        if (save && o->snapshot_path) save_snapshot(m, o, epoch + 1, step, tr->dist->world_size);
        else if (save) save_model(m, c->tokenizer, o);
    }
    // What data parallelism cost in bytes: each rank's gradients, per step,
    // as they entered the all-reduce (a ring then sends 2(W-1)/W of that).
    int steps_run = step - first_step;
    if (tr->dist->world_size > 1 && steps_run > 0)
        log_main("gradients all-reduced: %.0f bytes per step per rank (%s), %zu parameters\n",
                 (double)ddp_bytes_reduced() / steps_run, ddp_wire_name(m->grad_compress),
                 m->host.num_params);
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
    // seed gives every rank the same initial weights (and rank 0's are
    // broadcast anyway when training starts).
    gpt_config cfg = {bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd};
    gpt_t initial;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    model_t model;
    model_create(&model, initial, &dist.device, precision, o->batch_size, o->block_size);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s\n",
             model.host.num_params, cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd,
             model_precision(&model));
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model.grad_compress = ddp_compress_from_name(o->grad_compress);
    if (model.grad_compress == DDP_COMPRESS_POWERSGD) {
        if (precision == GPT_FP16)
            die("--grad_compress powersgd with --precision fp16: a step that overflows would leave inf in "
                "PowerSGD's error feedback for good; use --precision bf16 or fp32");
        model_use_powersgd(&model, o->powersgd_rank);
    }

    // --- Training, with validation after every epoch.
    trainer_t tr = make_trainer(o, &corpus, &dist);
    train(&model, &corpus, o, &tr);
    metrics_close(&tr.csv);

    // --- Report: test perplexity, samples, the saved model (rank 0).
    double test_loss = evaluate(&model, &dist, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (dist.rank == 0) {
        print_samples(&model, corpus.tokenizer, o);
        save_model(&model, corpus.tokenizer, o);
        const gpt_t *h = &model.host; // up to date: save_model brought it back from the device
        double l2 = 0;
        for (size_t i = 0; i < h->num_params; i++) l2 += (double)h->params[i] * h->params[i];
        log_main("final parameters checksum %016llx, l2 norm %.9g\n",
                 (unsigned long long)checksum_bytes(h->params, sizeof(gpt_real) * h->num_params), sqrt(l2));
        log_main("metrics: %s (plot: gnuplot plots/08_gpt_loss.gp)\n", tr.csv.path);
    }

    loader_free(&tr.loader);
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
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --nprocs N spawns N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || o.nprocs == 1) return run_rank(0, 1, &o);
    return spawn(o.nprocs, run_rank, &o);
}
