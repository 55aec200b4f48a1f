// pipeline.h - chapter 11's machinery around its lesson: the pipeline's
// state, the messages between stages, evaluation and sampling through the
// pipeline, and what it measures (the bubble, the activations held, the
// timeline). The lesson itself - the two schedules, a micro-batch's
// forward and backward pass, the training step - is in
// 11_pipeline_parallel.c. The finale (chapter 14) runs the same pipeline
// with cp and ep in the mesh too: a stage's messages then carry its cp
// rank's tokens of each sequence only (pipe_tokens).
//
// The mesh is pp x dp x tp (common/groups.h, tp fastest, as Megatron-LM
// orders them): the tp ranks of a stage, which all-reduce inside every
// block, are neighbours (one node, its fastest links); then the replicas of
// the stage, whose all-reduce comes once a step; the stages of a pipeline
// are farthest apart (across nodes), and only activations travel between
// them. With --tp 1 the mesh is pp x dp.
#ifndef PIPELINE_H
#define PIPELINE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "flags.h"
#include "gpt.h"
#include "groups.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "options.h"
#include "plan_measured.h"
#include "rng.h"
#include "timer.h"
#include "trainer.h"

// ===================================================================== options

// The flags of this chapter: the schedule and the mesh. Its micro-batches
// are 08's --grad_accum: the micro-batches of a step, the gradients of each
// added up before AdamW, are what flows through the pipeline.
static inline void pipeline_add_flags(flag_set *set, options *o, const char *mesh) {
    for (int i = 0; i < set->count; i++)
        if (!strcmp(set->flags[i].name, "grad_accum"))
            set->flags[i].help = "micro-batches per optimizer step, their gradients added up: in a pipeline, the "
                                 "pieces of the batch that flow through the stages one after another";
    flag_choice(set, "schedule", &o->schedule, "gpipe|1f1b", "the order of forward and backward passes in a stage");
    options_add_mesh_flags(set, o, mesh); // 11: "dp tp pp"; 14: all five
}

// 08's options_finish, with a block for every stage: a preset of fewer
// blocks than --pp stages gets --pp blocks (and the model line says so).
// Then what no single flag's range can say.
static inline void pipeline_finish_options(options *o, flag_set *set) {
    gpt_config preset = gpt_config_of(o->vocab_size, 0, 0, 0, 0);
    gpt_preset(o->preset, &preset);
    o->layers_for_stages = !o->n_layer && preset.n_layer < o->pp;
    if (o->layers_for_stages) o->n_layer = o->pp;
    options_finish(o, set);
    gpt_config c = gpt_config_of(o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd);
    const char *problem = gpt_stage_problem(&c, o->pp);
    if (problem) flags_fail(set, "--pp %d: %s (the model has %d; use --n_layer)", o->pp, problem, o->n_layer);
    problem = gpt_tp_problem(&c, o->tp);
    if (problem) flags_fail(set, "--tp %d: %s (the model has --n_head %d)", o->tp, problem, o->n_head);
    if (o->nprocs % (o->pp * o->tp) != 0)
        flags_fail(set, "--nprocs %d is not a multiple of --pp %d x --tp %d: every pipeline needs %d ranks", o->nprocs,
                   o->pp, o->tp, o->pp * o->tp);
    if (!strcmp(o->precision, "fp16"))
        flags_fail(set, "--precision fp16: the GPU model keeps fp16's loss scale in chapter 08's whole-model step "
                        "only, not in a pipeline stage's (gpt_cuda.cu); use bf16 or fp32");
}

// ===================================================================== the pipeline

// What each rank did during a step, and when (seconds since the step began):
// the timeline that the figure draws and the bubble is measured from.
typedef struct {
    char kind;      // 'F' forward, 'B' backward, 'S' send, 'R' receive
    int micro;      // the micro-batch
    double start, end;
} pipe_event;

// This rank's place in the mesh and the pipeline's state during a step.
typedef struct {
    groups_t g;              // pp x dp x tp: the stages of a pipeline, the replicas of a stage, its shards
    pg_t *pp, *dp, *tp;      // this pipeline's stages; this stage's replicas (data parallelism); its shards
    pg_t *data;              // with ep (the finale): dp x ep, the ranks that read different batches
    pg_t *tie;               // the first and the last stage of this pipeline: their two copies of wte
    int stage, stages;       // this rank's stage, of S
    bool first, last;
    bool counts;             // this rank adds its pipeline's loss to sums: the last stage's first shard
    model_t *m;              // this rank's stage of the model (pipeline_start)
    bool gpipe;              // the schedule: GPipe, or 1F1B
    int micro_batches, B, T;
    size_t count;            // numbers a message carries: B x T x n_embd
    dtype_t dtype;           // their type: the activations', bf16 or fp32 (model_stage_dtype)
    size_t own_from;         // this stage's gradients from here on are its own (the last stage's copy of wte is not)
    int *slot_of;            // micro-batch -> the activation slot that holds it
    bool *slot_busy;         // slot -> in use
    int slots_used;          // the most slots in use at once
    pipe_event *events;      // this step's
    int num_events, max_events;
    double t0;               // when this step began
    bool recording;          // in a training step (validation and sampling are not on the timeline)
    double *busy, *ends;     // each step of this run: seconds of forward and backward passes; when the last ended
    int steps, max_steps;
    double pp_sent;          // bytes this rank sent to its neighbouring stages in training steps
    double tp_sent, tp_at;   // bytes its blocks all-reduced over tp in training steps; the count when the step began
    double cp_sent, cp_at;   // numbers its attention sent over cp in training steps (the finale); the count then
} pipeline_t;

// The numbers a model's attention has sent over cp so far (gpt/context_parallel.h's counters; 0 without cp).
static inline double pipe_cp_numbers(const model_t *m) {
    return m->host.cp ? m->host.cp->sent_forward + m->host.cp->sent_backward : 0;
}

static inline void pipeline_init(pipeline_t *p, dist_t *d, const options *o) {
    memset(p, 0, sizeof *p);
    int sizes[DIMS] = {[DIM_PP] = o->pp, [DIM_DP] = o->dp, [DIM_EP] = o->ep, [DIM_CP] = o->cp, [DIM_TP] = o->tp};
    groups_init(&p->g, d, sizes);
    p->pp = p->g.group[DIM_PP], p->dp = p->g.group[DIM_DP], p->tp = p->g.group[DIM_TP];
    p->stage = p->g.coord[DIM_PP], p->stages = p->g.size[DIM_PP];
    p->first = groups_first(&p->g, DIM_PP), p->last = groups_last(&p->g, DIM_PP);
    // every shard of the last stage computes the same loss, and so does
    // every cp rank (context_parallel.h's cp_mean_loss: the sequences' mean)
    p->counts = p->last && groups_first(&p->g, DIM_TP) && groups_first(&p->g, DIM_CP);
    if (p->g.size[DIM_EP] > 1) p->data = groups_join(&p->g, "dp ep"); // freed by groups_free
    // The tied embedding: the first and the last stage of each pipeline,
    // shard by shard, named by the first stage's rank (pg_split: every rank
    // calls it; the others join no group).
    bool ends = p->stages > 1 && (p->first || p->last);
    p->tie = pg_split(d->pg, ends ? groups_rank_with(&p->g, DIM_PP, 0) : -1, p->stage);
    p->gpipe = !strcmp(o->schedule, "gpipe");
    p->micro_batches = o->grad_accum, p->B = o->batch_size, p->T = o->block_size;
    p->slot_of = xcalloc((size_t)o->grad_accum, sizeof(int));
    p->slot_busy = xcalloc((size_t)o->grad_accum, sizeof(bool));
    p->max_events = 6 * o->grad_accum; // F and B, and at most a send and a receive with each
    p->events = xcalloc((size_t)p->max_events, sizeof(pipe_event));
}

// The data is shared between the pipelines, as 08 shares it between its
// ranks: the stages of one pipeline read the same blocks (the first one
// their tokens, the last one their targets), and the last stage's first
// shard has the pipeline's loss.
// With ep (the finale), every rank of dp x ep reads its own batches: the
// experts are all an ep group shares.
static inline replicas_t pipeline_replicas(pipeline_t *p) {
    if (p->data) return (replicas_t){pg_rank(p->data), pg_world_size(p->data), p->g.dist->pg, p->counts};
    return (replicas_t){p->g.coord[DIM_DP], p->g.size[DIM_DP], p->g.dist->pg, p->counts};
}

// This rank's stage of the whole model, on its device: its tensors (with
// --tp, its shard of them: chapter 10's gpt_init_shard), and AdamW's
// moments when the run resumes.
static inline void make_stage(model_t *model, const gpt_t *whole, const pipeline_t *p, const device_t *d,
                              gpt_precision precision, const options *o) {
    gpt_t stage;
    gpt_init_part(&stage, whole, gpt_stage_of(&whole->cfg, p->stage, p->stages), p->g.size[DIM_TP],
                  p->g.coord[DIM_TP]);
    model_create(model, stage, d, precision, o->batch_size, o->block_size);
    if (stage.adam_step > 0) model_to_device(model);                    // the moments too
    if (p->g.size[DIM_TP] > 1) model_tensor_parallel(model, p->tp);    // its blocks' all-reduces: chapter 10
}

// The tokens of each sequence this stage computes: all T, or with context
// parallelism (the finale) its cp rank's, which the model chooses here
// already so that the buffer a message lands in is sized for them.
static inline int pipe_tokens(model_t *m, int B, int T) {
    return m->host.cp ? cp_take_tokens(m->host.cp, NULL, NULL, B, T) : T;
}

// Once the model is built: what travels between stages, where this
// stage's own gradients begin, room for the times of `steps` steps. Rank 0
// prints what each stage holds and sends.
static inline void pipeline_start(pipeline_t *p, model_t *m, int steps) {
    const gpt_config *c = &m->host.cfg;
    p->m = m;
    p->own_from = gpt_stage_tied_copy(c, &m->host.stage);
    p->dtype = model_stage_dtype(m);
    p->count = (size_t)p->B * pipe_tokens(m, p->B, p->T) * c->n_embd;
    p->max_steps = steps;
    p->busy = xcalloc((size_t)steps + 1, sizeof(double)), p->ends = xcalloc((size_t)steps + 1, sizeof(double));
    double kib = (double)(p->count * dtype_size(p->dtype)) / 1024;
    int shards = p->g.size[DIM_TP];
    log_main("pipeline: %d stage(s) x %d micro-batches of %d x %d tokens, schedule %s; %d pipeline(s) (data parallel)%s\n",
             p->stages, p->micro_batches, p->B, p->T, p->gpipe ? "gpipe" : "1f1b", p->g.size[DIM_DP],
             shards > 1 ? "; each stage split over tp ranks (per rank:)" : "");
    for (int s = 0; s < p->stages; s++) {
        gpt_stage st = gpt_stage_of(c, s, p->stages);
        char blocks[32], sends[160] = "";
        if (st.last - st.first == 1) snprintf(blocks, sizeof blocks, "block %d", st.first);
        else snprintf(blocks, sizeof blocks, "blocks %d-%d", st.first, st.last - 1);
        if (!st.head) snprintf(sends, sizeof sends, "%d x %.1f KiB of activations forward", p->micro_batches, kib);
        if (!st.embedding)
            snprintf(sends + strlen(sends), sizeof sends - strlen(sends), "%s%d x %.1f KiB of gradients back",
                     st.head ? "" : ", ", p->micro_batches, kib);
        log_main("  stage %d: %s%s%s, %zu parameters; a step sends %s\n", s, blocks, st.embedding ? " + wte, wpe" : "",
                 st.head ? " + ln_f, the LM head (its own copy of wte)" : "", gpt_layout_stage_params(c, &st, shards, NULL),
                 sends[0] ? sends : "nothing (one stage)");
    }
}

static inline void pipeline_free(pipeline_t *p) {
    free(p->slot_of), free(p->slot_busy), free(p->events), free(p->busy), free(p->ends);
    if (p->tie) pg_destroy(p->tie);
    groups_free(&p->g);
}

static inline double pipe_clock(const pipeline_t *p) { return now_seconds() - p->t0; }

static inline void pipe_record(pipeline_t *p, char kind, int micro, double start) {
    if (!p->recording) return;
    if (p->num_events == p->max_events) die("pipeline: more than %d events in a step", p->max_events);
    p->events[p->num_events++] = (pipe_event){kind, micro, start, pipe_clock(p)};
}

// Micro-batch i's activations go into the first free slot; its backward
// pass frees it. So the slots a stage ever uses - and so the memory the
// model allocates for them - are the micro-batches it held at once.
static inline void pipe_take_slot(pipeline_t *p, int i) {
    int k = 0;
    while (k < p->micro_batches && p->slot_busy[k]) k++;
    if (k == p->micro_batches) die("pipeline: micro-batch %d finds no free activation slot", i);
    p->slot_busy[k] = true, p->slot_of[i] = k;
    if (k + 1 > p->slots_used) p->slots_used = k + 1;
}

// One of the three buffers of micro-batch i's slot (model_stage_buffer).
static inline void *pipe_buffer(pipeline_t *p, model_t *m, int i, model_stage_buffer_t which, int B, int T) {
    model_use_slot(m, p->slot_of[i]);
    return model_stage_buffer(m, which, B, pipe_tokens(m, B, T));
}

// ===================================================================== the messages between stages

// A send to one neighbour and a receive from the other (either may be
// absent: peer -1), both posted before either is waited for. That is what
// keeps the schedules from deadlocking: NCCL completes a send only once the
// peer receives (pg_nccl.h), and in 1F1B's steady state two neighbouring
// stages each send to the other at the same moment - the activation going
// forward, the gradient coming back. Each posted its receive too, so both
// sends find their receiver. (The cpu backend keeps early messages aside and
// would not deadlock either way; NCCL and MPI's rendezvous for large
// messages would.)
typedef struct {
    void *buf;
    int peer, micro; // peer: a stage of this pipeline (its rank in p->pp), -1 for none
} pipe_msg;

static const pipe_msg NO_MSG = {NULL, -1, -1};

static inline void pipe_exchange(pipeline_t *p, pipe_msg send, pipe_msg recv, size_t count) {
    double start = pipe_clock(p);
    pg_request_t *r = recv.peer >= 0 ? pg_irecv(p->pp, recv.buf, count, p->dtype, recv.peer) : NULL;
    pg_request_t *s = send.peer >= 0 ? pg_isend(p->pp, send.buf, count, p->dtype, send.peer) : NULL;
    if (r) pg_wait(r), pipe_record(p, 'R', recv.micro, start);
    if (s) pg_wait(s), pipe_record(p, 'S', send.micro, start);
    if (s && p->recording) p->pp_sent += (double)count * (double)dtype_size(p->dtype);
}

// The four kinds of message, as Megatron-LM names them: activations go
// forward to the next stage, gradients backward to the previous one
// (groups_peer: -1 past either end of the pipeline). Every one names the
// buffer of its micro-batch's slot, so a transfer is one call.
static inline pipe_msg pipe_msg_of(pipeline_t *p, model_t *m, int i, model_stage_buffer_t which, int peer) {
    if (peer < 0) return NO_MSG;
    return (pipe_msg){pipe_buffer(p, m, i, which, p->B, p->T), peer, i};
}
static inline pipe_msg send_forward(pipeline_t *p, model_t *m, int i) {
    return pipe_msg_of(p, m, i, STAGE_OUTPUT, groups_peer(&p->g, DIM_PP, +1));
}
static inline pipe_msg send_backward(pipeline_t *p, model_t *m, int i) {
    return pipe_msg_of(p, m, i, STAGE_GRAD, groups_peer(&p->g, DIM_PP, -1));
}
static inline pipe_msg recv_backward(pipeline_t *p, model_t *m, int i) {
    return pipe_msg_of(p, m, i, STAGE_GRAD, groups_peer(&p->g, DIM_PP, +1));
}
// Micro-batch i arrives at this stage: it takes a slot (on the first
// stage too, which receives nothing: it reads tokens).
static inline pipe_msg recv_forward(pipeline_t *p, model_t *m, int i) {
    pipe_take_slot(p, i);
    return pipe_msg_of(p, m, i, STAGE_INPUT, groups_peer(&p->g, DIM_PP, -1));
}

// ===================================================================== evaluation and sampling through the pipeline

// One batch forward through the whole pipeline and nothing else
// (validation, sampling): each stage receives, computes, sends on. The
// loss is the last stage's (evaluate_with counts its first shard's only:
// pipeline_replicas). A forward_fn (gpt/trainer.h): ctx is the pipeline.
static inline float pipe_forward_only(void *ctx, model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    pipeline_t *p = ctx;
    int prev = groups_peer(&p->g, DIM_PP, -1), next = groups_peer(&p->g, DIM_PP, +1);
    model_use_slot(m, 0);
    int mine = pipe_tokens(m, B, T);
    size_t count = (size_t)B * mine * m->host.cfg.n_embd;
    pipe_msg input = p->first ? NO_MSG : (pipe_msg){model_stage_buffer(m, STAGE_INPUT, B, mine), prev, 0};
    pipe_exchange(p, NO_MSG, input, count);
    float loss = model_forward(m, p->first ? in : NULL, p->last ? tg : NULL, B, T);
    model_wait(m); // before the output is sent
    pipe_msg output = p->last ? NO_MSG : (pipe_msg){model_stage_buffer(m, STAGE_OUTPUT, B, mine), next, 0};
    pipe_exchange(p, output, NO_MSG, count);
    return loss;
}

// model_generate through the pipeline (a samples_generate_fn, gpt/samples.h;
// ctx is the pipeline): every stage computes its blocks for the text so far,
// the last one picks the next token, and every stage learns it (a broadcast
// from the last stage): the first needs it next. With tp, the last stage's
// shards take their first shard's pick.
static inline void pipe_generate(void *ctx, uint16_t *tokens, int len, int total, float temperature, int top_k,
                                 rng_t *rng) {
    pipeline_t *p = ctx;
    model_t *m = p->m;
    const device_t *dev = &p->g.dist->device;
    int V = m->host.cfg.vocab_size, block = m->host.cfg.block_size;
    float *scratch = xmalloc(sizeof(float) * (size_t)V);
    for (int n = len; n < total; n++) {
        int start = n > block ? n - block : 0;
        pipe_forward_only(p, m, tokens + start, NULL, 1, n - start);
        int32_t next = 0;
        if (p->last) next = gpt_sample_next(model_logits(m, n - start - 1, scratch), V, temperature, top_k, rng);
        if (p->last) groups_broadcast_host(p->tp, dev, &next, 1, DTYPE_I32, 0);
        groups_broadcast_host(p->pp, dev, &next, 1, DTYPE_I32, p->stages - 1);
        tokens[n] = (uint16_t)next;
    }
    free(scratch);
}

// ===================================================================== measured: the bubble, the memory, the timeline

// A step begins on every stage of a pipeline at once (a barrier), so that
// the stages' timelines share their zero.
static inline void pipe_begin_step(pipeline_t *p) {
    pg_barrier(p->pp);
    p->t0 = now_seconds();
    p->num_events = 0;
    p->recording = true;
    p->tp_at = p->m->tp_bytes;
    p->cp_at = pipe_cp_numbers(p->m);
}

// Its busy time (forward and backward passes) and its end, for the bubble.
static inline void pipe_end_step(pipeline_t *p) {
    p->recording = false;
    p->tp_sent += p->m->tp_bytes - p->tp_at;
    p->cp_sent += pipe_cp_numbers(p->m) - p->cp_at;
    double busy = 0, end = 0;
    for (int e = 0; e < p->num_events; e++) {
        const pipe_event *ev = &p->events[e];
        if (ev->kind == 'F' || ev->kind == 'B') busy += ev->end - ev->start;
        if (ev->end > end) end = ev->end;
    }
    if (p->steps == p->max_steps) die("pipeline: more steps than the %d planned", p->max_steps);
    p->busy[p->steps] = busy, p->ends[p->steps] = end;
    p->steps++;
}

// The bubble: the part of a step in which a stage computes nothing. A
// step's span runs from its start (the barrier) to the moment the stage
// that finished last finished; stage s computed busy_s of it, so its
// bubble is 1 - busy_s / span. For stages of equal cost and free
// communication the schedules leave (S-1)/(M+S-1) of every step idle. The
// first step is left out (it allocates the activation slots) when there
// are others. Each rank fills its row of a table, and an all-reduce (a sum
// over rows that are zero elsewhere) gives every rank the whole table.
enum { ROW_STAGE, ROW_BUBBLE, ROW_SLOTS, ROW_BYTES, ROW };

// Returns the measured bubble (the mean over ranks), or -1 without steps.
static inline double pipe_report(pipeline_t *p, model_t *m, const options *o) {
    dist_t *d = p->g.dist;
    groups_all_reduce_host(p->pp, &d->device, p->ends, (size_t)p->steps, DTYPE_F64, OP_MAX); // the spans
    double bubble = 0;
    int counted = 0;
    for (int k = p->steps > 1 ? 1 : 0; k < p->steps; k++, counted++) bubble += 1 - p->busy[k] / p->ends[k];
    if (counted == 0) return -1; // a resumed run with no step left to take
    double *table = xcalloc((size_t)d->world_size * ROW, sizeof(double)), *row = table + (size_t)d->rank * ROW;
    row[ROW_STAGE] = p->stage, row[ROW_BUBBLE] = bubble / counted, row[ROW_SLOTS] = p->slots_used;
    row[ROW_BYTES] = (double)model_slot_bytes(m);
    dist_all_reduce_host(d, table, d->world_size * ROW, OP_SUM);
    double mean = 0, low = 1, high = 0;
    for (int r = 0; r < d->world_size; r++) {
        double b = table[(size_t)r * ROW + ROW_BUBBLE];
        mean += b / d->world_size, low = b < low ? b : low, high = b > high ? b : high;
    }
    int S = p->stages, M = p->micro_batches;
    log_main("bubble: %s, %d stages x %d micro-batches: %.1f%% of a step idle, measured (mean of %d step(s) and %d "
             "rank(s); stages %.1f%% to %.1f%%); (S-1)/(M+S-1) = %.1f%%\n", o->schedule, S, M, 100 * mean, counted,
             d->world_size, 100 * low, 100 * high, 100.0 * (S - 1) / (M + S - 1));
    log_main("activations held, measured (slots the stage allocated; gpipe holds M = %d, 1f1b at most S - s):\n", M);
    for (int stage = 0; stage < S; stage++) {
        int at[DIMS] = {[DIM_PP] = stage}; // the stage's rank in pipeline 0, shard 0
        const double *r = table + (size_t)groups_rank_of(&p->g, at) * ROW;
        log_main("  stage %d: %d micro-batch(es), %.2f MiB\n", stage, (int)r[ROW_SLOTS], r[ROW_BYTES] / 1048576.0);
    }
    free(table);
    return mean;
}

// The last step's timeline, from every rank, into DIR/timeline-SCHEDULE.csv
// for plots/11_timeline.gp: one row per forward, backward, send, receive.
static inline void write_timeline(pipeline_t *p, const options *o, double bubble) {
    dist_t *d = p->g.dist;
    size_t cols = 4 * (size_t)p->max_events; // kind, micro, start, end
    double *table = xcalloc((size_t)d->world_size * cols, sizeof(double)), *row = table + (size_t)d->rank * cols;
    for (int e = 0; e < p->num_events; e++) {
        const pipe_event *ev = &p->events[e];
        row[4 * e] = ev->kind, row[4 * e + 1] = ev->micro, row[4 * e + 2] = ev->start, row[4 * e + 3] = ev->end;
    }
    dist_all_reduce_host(d, table, (int)((size_t)d->world_size * cols), OP_SUM);
    if (d->rank == 0) {
        char name[64], date[32];
        snprintf(name, sizeof name, "timeline-%s", o->schedule);
        metrics_csv csv = metrics_open(o->out_dir, name, "rank,stage,replica,shard,kind,micro,start_ms,end_ms");
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%d", localtime(&now));
        metrics_row(&csv, "# %s | backend %s | %d rank(s) | %s", d->device.name, backend_name(pg_backend(d->pg)),
                    d->world_size, date);
        int S = p->stages, M = p->micro_batches;
        metrics_row(&csv, "# schedule %s | stages %d | micro_batches %d | the last of %d steps | bubble %.1f%% "
                    "measured (all steps), (S-1)/(M+S-1) = %.1f%%", o->schedule, S, M, p->steps, 100 * bubble,
                    100.0 * (S - 1) / (M + S - 1));
        // The ranks in their order (pp x dp x tp, tp fastest), each named by its coordinates.
        int at[DIMS] = {0};
        for (at[DIM_PP] = 0; at[DIM_PP] < S; at[DIM_PP]++)
            for (at[DIM_DP] = 0; at[DIM_DP] < p->g.size[DIM_DP]; at[DIM_DP]++)
                for (at[DIM_TP] = 0; at[DIM_TP] < p->g.size[DIM_TP]; at[DIM_TP]++) {
                    int r = groups_rank_of(&p->g, at);
                    for (int e = 0; e < p->max_events; e++) {
                        const double *ev = table + (size_t)r * cols + 4 * (size_t)e;
                        if (ev[0] == 0) continue; // the rest of a shorter row
                        metrics_row(&csv, "%d,%d,%d,%d,%c,%d,%.3f,%.3f", r, at[DIM_PP], at[DIM_DP], at[DIM_TP],
                                    (char)ev[0], (int)ev[1], 1e3 * ev[2], 1e3 * ev[3]);
                    }
                }
        metrics_close(&csv);
        log_main("timeline of the last step: %s/%s.csv (plot: make plots)\n", o->out_dir, name);
    }
    free(table);
}

// What each stage held and sent, as the planner's rows (gpt/plan.h;
// --plan prints them for the same flags): its buffers by kind (the
// activations of every slot it filled), and per step what it sent to its
// neighbours plus its share of the all-reduce of the two copies of wte
// (pp), its blocks' all-reduces (tp), its replicas' all-reduce of the
// gradients (dp), each all-reduce at what a ring sends. In the finale the
// dense gradients' replicas are dp x ep x cp and the experts' dp x cp;
// attention's blocks go over cp (fp32 on the CPU), the rows of a mixture
// of experts to other ranks of its ep group (gpt/moe.h's counters).
// `dp`: the dp ranks the gradients' all-reduce spans - all of them, or 1
// when ZeRO averages over dp with its slices' collectives (the finale's
// --shard 1: finale.h adds those, and ZeRO's buffers, to this row).
static inline plan_rank pipe_plan_row(pipeline_t *p, model_t *m, int dp) {
    const int *n = p->g.size;
    int steps = p->steps > 0 ? p->steps : 1;
    plan_rank row = {{0}, {0}};
    plan_measure_model(m, p->slots_used, row.mem);
    double tie = p->tie ? plan_ring_all_reduce(m->grads_all_reduced, pg_world_size(p->tie)) : 0;
    row.sent[PLAN_PP] = (p->pp_sent + tie) / steps;
    row.sent[PLAN_TP] = plan_ring_all_reduce(p->tp_sent / steps, n[DIM_TP]);
    row.sent[PLAN_DP] = plan_ring_all_reduce((double)ddp_bytes_reduced() / steps, dp * n[DIM_EP] * n[DIM_CP]) +
                        plan_ring_all_reduce(plan_measured_expert_grad_bytes(m), dp * n[DIM_CP]);
    row.sent[PLAN_CP] = p->cp_sent * sizeof(gpt_real) / steps;
    row.sent[PLAN_EP] = plan_measured_ep_bytes(m) / steps;
    return row;
}

// After training: the bubble and the activations held, measured, and the
// last step's timeline; then the planner's rows (with --shard, the
// finale's finale_zero_report prints them, ZeRO's slices added).
static inline void pipeline_report(pipeline_t *p, model_t *m, const options *o) {
    double bubble = pipe_report(p, m, o);
    if (bubble >= 0) write_timeline(p, o, bubble);
    if (o->shard || p->steps == 0) return;
    plan_rank row = pipe_plan_row(p, m, p->g.size[DIM_DP]);
    plan_report_measured(p->g.dist, p->stage, p->stages, &row);
}

#endif
