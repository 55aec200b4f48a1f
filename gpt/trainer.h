// trainer.h - what every GPT chapter's training loop leans on and none of
// them teaches: the data of each step, the learning rate, the progress
// line, validation, and the loss over a whole split.
//
// Chapter 08 wrote these once; chapters 09-14 train the same way and change
// WHO shares the data: 08's ranks each take a share of every epoch; in 10
// the ranks of a tp group see the same data (they hold one model between
// them) and only the dp replicas split it; in 11 the stages of a pipeline
// see the same data and only its last stage has a loss. So the trainer is
// given a `replicas_t`: which replica this rank belongs to, how many there
// are, the group over which losses and token counts are summed, and
// whether this rank's loss counts in that sum (the others add 0).
#ifndef GPT_TRAINER_H
#define GPT_TRAINER_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "corpus.h"
#include "dist.h"
#include "groups.h"
#include "loader.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "options.h"
#include "sampler.h"
#include "timer.h"

// Who shares the data, and who sums the losses.
typedef struct {
    int rank, size;   // this rank's replica, of `size`: each takes its share of every epoch
    pg_t *sum;        // losses and token counts are summed over this group
    bool counts;      // this rank's loss is in that sum (the others add 0)
} replicas_t;

// Chapter 08's: every rank a replica of its own, all of them summed.
static inline replicas_t replicas_of_job(dist_t *d) { return (replicas_t){d->rank, d->world_size, d->pg, true}; }

typedef struct {
    int steps_per_epoch, total_steps, warmup;
    size_t num_blocks;         // training sequences of T+1 tokens (overlapping by one)
    sampler_t sampler;         // this replica's blocks of each epoch
    loader_t loader;           // makes the batches from them, a step ahead (gpt/loader.h)
    double start, train_time;  // wall clock; seconds spent in training steps
    int loss_count;            // steps since the last progress line
    double interval_start;
    metrics_csv csv;           // rank 0 only
    dist_t *dist;
    replicas_t replicas;
    bool graph;                // each step one CUDA graph launch (08's train_step)
} trainer_t;

// `mesh`: what the metrics' title line says of the layout ("" for none).
static inline trainer_t trainer_make(const options *o, const corpus_t *c, dist_t *d, replicas_t r, const char *mesh) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    int B = o->batch_size, T = o->block_size, W = r.size;
    tr.dist = d, tr.replicas = r;
    tr.num_blocks = c->count[0] > 1 ? (c->count[0] - 1) / (size_t)T : 0;
    if (tr.num_blocks < (size_t)W)
        die("the training split has %zu tokens: too few blocks of %d for %d replica(s)", c->count[0], T, W);
    // Every replica gets the same number of blocks (DistributedSampler
    // semantics), so every rank takes the same number of steps.
    tr.sampler = sampler_create((int64_t)tr.num_blocks, W, r.rank, true, (uint64_t)o->seed, false);
    int64_t per_rank = ((int64_t)tr.num_blocks + W - 1) / W;
    tr.steps_per_epoch = (int)(per_rank / ((int64_t)B * o->grad_accum));
    if (tr.steps_per_epoch < 1)
        die("the training split has %zu tokens: too few for one step of %d replica(s) x %d x %d x %d tokens (use a "
            "smaller --batch_size, --grad_accum or --block_size)", c->count[0], W, o->grad_accum, B, T);
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
        metrics_row(&tr.csv, "# %s | backend %s | %d rank(s)%s%s | %s", d->device.name,
                    backend_name(pg_backend(d->pg)), d->world_size, mesh[0] ? ", " : "", mesh, date);
    }
    return tr;
}

static inline void trainer_free(trainer_t *tr) {
    metrics_close(&tr->csv);
    loader_free(&tr->loader);
    sampler_free(&tr->sampler);
}

// Each epoch: this replica's share of the epoch's order (seed + epoch), and
// the loader's `micro_batches` batches of it per step.
static inline void trainer_set_epoch(trainer_t *tr, int epoch, int micro_batches) {
    sampler_set_epoch(&tr->sampler, epoch);
    loader_set_epoch(&tr->loader, tr->sampler.indices, tr->steps_per_epoch * micro_batches);
}

// The first line of training: how many steps of how many tokens.
static inline void trainer_announce(const trainer_t *tr, const options *o) {
    log_main("training: %d step(s) (%d per epoch) of %d tokens (%d replica(s) x %d x batch %d x block %d) | lr %g -> "
             "%g, warm-up %d\n", tr->total_steps, tr->steps_per_epoch,
             tr->replicas.size * o->grad_accum * o->batch_size * o->block_size, tr->replicas.size, o->grad_accum,
             o->batch_size, o->block_size, o->lr, o->min_lr, tr->warmup);
}

// The learning rate of step `step` (counted from 0): a linear warm-up from
// lr/warmup to lr over the first tr->warmup steps (Adam's moment estimates
// are poor at first), then a cosine from lr down to min_lr at the last
// step, and min_lr after it.
static inline float learning_rate(const trainer_t *tr, const options *o, int step) {
    float max_lr = (float)o->lr, min_lr = (float)o->min_lr;
    if (step < tr->warmup) return max_lr * (float)(step + 1) / (float)tr->warmup;
    if (step >= tr->total_steps) return min_lr;
    double progress = (double)(step - tr->warmup) / (double)(tr->total_steps - tr->warmup);
    return min_lr + (float)(0.5 * (1 + cos(3.141592653589793 * progress))) * (max_lr - min_lr);
}

// Whether each step can be one CUDA graph launch, and if not, why. A graph
// holds the work of one GPU's stream: not the collectives of several ranks
// between backward and AdamW, not a loop of micro-batches. `chapter_why`:
// what in a chapter's own step keeps it out of a graph (NULL: 08's step).
static inline void trainer_choose_graph(trainer_t *tr, const model_t *m, const options *o, const char *chapter_why) {
    const char *no_graph = !m->on_gpu ? "the CPU computes" : !o->cuda_graph ? "--cuda_graph=false"
                           : tr->dist->world_size > 1 ? "several ranks: the all-reduce sits inside the step"
                           : o->grad_accum > 1 ? "--grad_accum > 1" : chapter_why;
    tr->graph = !no_graph;
    if (m->on_gpu) {
        if (tr->graph) log_main("step: one CUDA graph launch after the copy of the tokens (--cuda_graph)\n");
        else log_main("step: launched call by call (no CUDA graph: %s)\n", no_graph);
    }
}

// One training step as ONE launch of a CUDA graph captured at the first
// step (gpt_cuda.cu, section 10): the next batch's tokens and this step's
// learning rate are copied to the GPU before it, and it computes what 08's
// train_step computes call by call - zero_grad, forward, backward, clip,
// AdamW - without the host launching each kernel (trainer_choose_graph says
// when it may).
static inline void trainer_graph_step(model_t *m, trainer_t *tr, const options *o, int step) {
    const loader_batch_t *batch = loader_next(&tr->loader);
    model_graph_step(m, batch->inputs, batch->targets, o->batch_size, o->block_size, (float)o->grad_clip,
                     learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

// ===================================================================== evaluation

// One batch's mean loss: the model's forward pass, or a chapter's (11's
// goes through every stage of the pipeline).
typedef float (*forward_fn)(void *ctx, model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T);

static inline float forward_model(void *ctx, model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    (void)ctx;
    return model_forward(m, in, tg, B, T);
}

// Mean loss over a whole split, cut into non-overlapping pieces of T+1
// tokens (T inputs, each predicting the next); a shorter last piece counts
// too, so every token but the first of each piece is predicted exactly once.
// The replicas share the pieces (replica r takes pieces r, r+W, ...;
// replica 0 the short one), then add up their loss sums and token counts:
// no piece is counted twice, whatever the number of replicas.
//
// A forward pass may be collective (ZeRO-3 gathers each block from every
// rank, a pipeline passes activations on): every rank must make as many
// as the others, so a rank with fewer pieces makes passes over one token
// that count nothing (FSDP has the same rule; DDP's join() exists for it).
static inline double evaluate_with(model_t *m, const replicas_t *r, forward_fn forward, void *ctx,
                                   const device_t *dev, const uint16_t *tokens, size_t count, int B, int T) {
    double loss_sum = 0;
    size_t rank = (size_t)r->rank, world = (size_t)r->size;
    size_t predicted = 0, piece = (size_t)T + 1, full = count / piece;
    size_t mine = full > rank ? (full - rank + world - 1) / world : 0;
    size_t rest = count - full * piece;
    double passes = (double)((mine + (size_t)B - 1) / (size_t)B + (rest >= 2 && rank == 0)), most = passes;
    groups_all_reduce_host(r->sum, dev, &most, 1, DTYPE_F64, OP_MAX);
    uint16_t *in = xmalloc(sizeof(uint16_t) * (size_t)B * T), *tg = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    for (size_t first = 0; first < mine; first += (size_t)B) {
        int b = mine - first < (size_t)B ? (int)(mine - first) : B;
        for (int i = 0; i < b; i++) {
            const uint16_t *p = tokens + ((first + (size_t)i) * world + rank) * piece;
            memcpy(in + (size_t)i * T, p, sizeof(uint16_t) * T);
            memcpy(tg + (size_t)i * T, p + 1, sizeof(uint16_t) * T);
        }
        float loss = forward(ctx, m, in, tg, b, T);
        if (r->counts) loss_sum += (double)loss * b * T, predicted += (size_t)b * T;
    }
    if (rest >= 2 && rank == 0) {
        const uint16_t *last = tokens + full * piece;
        float loss = forward(ctx, m, last, last + 1, 1, (int)rest - 1);
        if (r->counts) loss_sum += (double)loss * (double)(rest - 1), predicted += rest - 1;
    }
    for (uint16_t none = 0; passes < most; passes++) forward(ctx, m, &none, &none, 1, 1);
    free(in);
    free(tg);
    double sums[2] = {loss_sum, (double)predicted};
    groups_all_reduce_host(r->sum, dev, sums, 2, DTYPE_F64, OP_SUM);
    if (sums[1] == 0) die("the split has fewer than 2 tokens: nothing to evaluate");
    return sums[0] / sums[1];
}

static inline double evaluate(model_t *m, trainer_t *tr, const uint16_t *tokens, size_t count, int B, int T) {
    return evaluate_with(m, &tr->replicas, forward_model, NULL, &tr->dist->device, tokens, count, B, T);
}

// ===================================================================== what the loop prints

static inline void format_duration(double seconds, char *buf, size_t size) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// fp16 only: the loss scale now, and the steps skipped for overflow so far
// (every rank skips the same ones: the gradients were averaged first).
static inline const char *loss_scale_note(model_t *m) {
    static char note[96];
    gpt_scaler s = model_get_scaler(m); // waits for the GPU; scale 0: not fp16
    if (s.scale == 0) return "";
    if (s.scale < 1)
        die("fp16: the loss scale fell below 1 after %d skipped steps: the gradients overflow even unscaled, "
            "so the run has diverged (try a lower --lr, or --precision bf16)", s.skipped_total);
    snprintf(note, sizeof note, " | loss scale %.0f, %d step(s) skipped", s.scale, s.skipped_total);
    return note;
}

// The progress line: the loss averaged since the last line over the
// replicas, the speed (of all ranks together), the time left.
static inline void report_progress(model_t *m, trainer_t *tr, const options *o, int step, int epoch) {
    double loss = model_take_train_loss(m);           // waits for the GPU, once per line
    const replicas_t *r = &tr->replicas;
    if (!r->counts) loss = 0;
    groups_all_reduce_host(r->sum, &tr->dist->device, &loss, 1, DTYPE_F64, OP_SUM);
    loss /= r->size;
    double now = now_seconds(), tokens = (double)tr->loss_count * o->batch_size * o->grad_accum * o->block_size *
                                         r->size;
    double tok_per_s = tokens / (now - tr->interval_start);
    char eta[32];
    format_duration(tr->train_time / step * (tr->total_steps - step), eta, sizeof eta);
    log_main("epoch %d | step %d/%d | loss %.4f | lr %.2e | %.0f tokens/s | ETA %s%s\n", epoch + 1, step,
             tr->total_steps, loss, learning_rate(tr, o, step - 1), tok_per_s, eta, loss_scale_note(m));
    metrics_row(&tr->csv, "%d,%d,%.5f,,%.1f", step, epoch + 1, loss, tok_per_s);
    tr->loss_count = 0;
    tr->interval_start = now_seconds();
}

// The validation line, with a chapter's forward pass (NULL: the model's).
static inline void validate_with(model_t *m, trainer_t *tr, forward_fn forward, void *ctx, const corpus_t *c,
                                 const options *o, int step, int epoch) {
    double start = now_seconds();
    double loss = evaluate_with(m, &tr->replicas, forward ? forward : forward_model, ctx, &tr->dist->device,
                                c->split[1], c->count[1], o->batch_size, o->block_size);
    log_main("validation after step %d (epoch %d): loss %.4f | perplexity %.2f | %zu tokens in %.1f s\n", step,
             epoch + 1, loss, exp(loss), c->count[1], now_seconds() - start);
    metrics_row(&tr->csv, "%d,%d,,%.5f,", step, epoch + 1, loss);
    tr->interval_start += now_seconds() - start; // validation time is not training speed
}

static inline void validate(model_t *m, trainer_t *tr, const corpus_t *c, const options *o, int step, int epoch) {
    validate_with(m, tr, NULL, NULL, c, o, step, epoch);
}

#endif
