// 11_pipeline_parallel.c - Chapter 11: pipeline parallelism, GPipe and 1F1B.
//
// Chapter 08's GPT and training loop, with the model cut by depth into
// --pp stages, one rank each: stage s holds blocks [s L/S, (s+1) L/S) of
// the L blocks - the first stage also the embeddings, the last the final
// LayerNorm and the LM head (gpt_layout.h, section 6) - and the batch of a
// step is cut into --micro_batches pieces that flow through the stages one
// after another. A stage sends its output (B x T x C activations) to the
// next stage, and on the way back the gradient of its input to the
// previous one: pg_isend/pg_irecv between neighbours, nothing else, until
// the last micro-batch is through.
//
// The schedule says in which order a stage runs its forward and backward
// passes (--schedule):
//   gpipe  every micro-batch forward, then every one backward (Huang et al.,
//          GPipe, 2019): a stage holds the activations of all M micro-batches;
//   1f1b   a few forwards, then one forward, one backward, ... (PipeDream-
//          Flush, Narayanan et al., 2021): at most S micro-batches held.
// Both compute the gradients of 08 with --grad_accum M, and both leave the
// stages idle while the pipeline fills and drains: the bubble, S-1 of every
// M+S-1 time slots. Every rank records when each forward, backward, send
// and receive began and ended; the program prints the measured bubble
// beside that formula, and the activation memory each stage held, and
// writes the last step's timeline for the figure (plots/11_timeline.gp).
//
// Data parallelism on top: N ranks form N/S pipelines (a pp x dp mesh,
// common/mesh.h), each trains on its own share of the data, and every
// stage averages its gradients with the same stage of the other pipelines.
// Snapshots hold the whole model, assembled by rank 0 from the stages: 08
// resumes a pipelined run's snapshot, and this program resumes 08's.
//
// Read it top to bottom, as 08's: options, device, data, then the pipeline
// (new: the mesh, the messages between stages, the timeline), evaluation,
// sampling and saving through the pipeline, training (the two schedules),
// the measurements, snapshots, main. Where it computes: as in 08, on a GPU
// when there is one (bf16 by default: the activations travel in bf16),
// else on the CPU; model.h hides the difference.
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

#define CHAPTER "11_pipeline_parallel"

typedef struct {
    int epochs, batch_size, micro_batches, max_steps, warmup_steps, eval_every, log_every, save_every, seed;
    int pp, tp;
    int vocab_size, block_size, n_layer, n_head, n_embd;
    double lr, min_lr, weight_decay, grad_clip, temperature;
    int top_k, num_samples, sample_tokens, nprocs;
    double timeout;
    const char *backend;
    bool generate, verify_data;
    bool layers_for_stages; // the preset had fewer blocks than --pp stages
    const char *preset, *data_dir, *out_dir, *snapshot_path, *prompt, *device, *precision, *schedule;
} options;

// ===================================================================== options

static flag_set option_flags(options *o) {
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2 and sample from it"};
    flag_int(&set, "epochs", &o->epochs, 1, 1000, "passes over the training split");
    flag_int(&set, "batch_size", &o->batch_size, 1, 4096, "sequences per micro-batch")->short_name = "b";
    flag_int(&set, "micro_batches", &o->micro_batches, 1, 4096, "micro-batches per step, pipelined (08's --grad_accum)");
    flag_int(&set, "pp", &o->pp, 1, 256, "pipeline stages: the model cut into this many ranges of blocks");
    flag_choice(&set, "schedule", &o->schedule, "gpipe|1f1b", "the order of forward and backward passes in a stage");
    flag_int(&set, "tp", &o->tp, 1, 256, "tensor-parallel ranks each stage's blocks are split over (chapter 10; divides n_head)");
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
    flag_int(&set, "nprocs", &o->nprocs, 0, 256, "ranks to spawn, --pp x --tp per pipeline (0: one pipeline; under ddprun: ignored)");
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

// Model sizes left at 0 come from the preset; the result must be buildable,
// with a block for every stage: a preset of fewer blocks than --pp stages
// gets --pp blocks (and the model line says so).
static void apply_preset(options *o, flag_set *set) {
    gpt_config p = {o->vocab_size, 0, 0, 0, 0};
    gpt_preset(o->preset, &p); // the flag's choices guarantee a known name
    if (!o->block_size) o->block_size = p.block_size;
    o->layers_for_stages = !o->n_layer && p.n_layer < o->pp;
    if (!o->n_layer) o->n_layer = o->layers_for_stages ? o->pp : p.n_layer;
    if (!o->n_head) o->n_head = p.n_head;
    if (!o->n_embd) o->n_embd = p.n_embd;
    gpt_config c = {o->vocab_size, o->block_size, o->n_layer, o->n_head, o->n_embd};
    const char *problem = gpt_config_problem(c);
    if (problem) flags_fail(set, "bad model size: %s (got --n_embd %d --n_head %d)", problem, o->n_embd, o->n_head);
    problem = gpt_stage_problem(&c, o->pp);
    if (problem) flags_fail(set, "--pp %d: %s (the model has %d; use --n_layer)", o->pp, problem, o->n_layer);
    problem = gpt_tp_problem(&c, o->tp);
    if (problem) flags_fail(set, "--tp %d: %s (the model has --n_head %d)", o->tp, problem, o->n_head);
}

static options parse_options(int argc, char **argv) {
    options o = {.epochs = 1, .batch_size = 8, .micro_batches = 4, .pp = 2, .tp = 1, .schedule = "1f1b", .max_steps = 0,
                 .warmup_steps = 100,
                 .eval_every = 1000, .log_every = 10, .save_every = 0, .seed = 1337, .vocab_size = 5000,
                 .lr = 1e-3, .min_lr = -1, .weight_decay = 0.1, .grad_clip = 1.0, .temperature = 0.8,
                 .top_k = 40, .num_samples = 3, .sample_tokens = 64, .verify_data = true,
                 .preset = "default", .prompt = "The", .device = "auto", .nprocs = 0, .backend = "auto",
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
    if (o.nprocs % (o.pp * o.tp) != 0)
        flags_fail(&set, "--nprocs %d is not a multiple of --pp %d x --tp %d: every pipeline needs %d ranks", o.nprocs, o.pp,
                   o.tp, o.pp * o.tp);
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

// ===================================================================== data

// The text, its tokenizer and the three splits as tokens: gpt/corpus.h.
static corpus_t load_corpus(const options *o, const char *cache_dir) {
    return corpus_load(o->data_dir, o->verify_data, o->vocab_size, cache_dir);
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
    mesh_t mesh;             // pp x dp x tp: the stages of a pipeline, the replicas of a stage, its shards
    pg_t *pp, *dp, *tp;      // this pipeline's stages; this stage's replicas (data parallelism); its shards
    pg_t *tie;               // the first and the last stage of this pipeline: their two copies of wte
    pg_t *world;             // every rank
    int stage, stages;       // this rank's stage, of S
    int replica, replicas;   // this rank's pipeline, of N / (S x tp)
    int shard, shards;       // this rank's part of each block of its stage, of tp (chapter 10)
    bool first, last;
    bool counts;             // this rank adds its pipeline's loss to sums: the last stage's first shard
    const device_t *device;
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
} pipeline_t;

// The mesh: pp x dp x tp, the last dimension fastest (common/mesh.h), as
// Megatron-LM orders them. The tp ranks of a stage, which all-reduce
// inside every block, are neighbours (one node, its fastest links); then
// the replicas of the stage, whose all-reduce comes once a step; the
// stages of a pipeline are farthest apart (across nodes), and only
// activations travel between them. With --tp 1 the mesh is pp x dp.
static void pipeline_init(pipeline_t *p, dist_t *d, const options *o) {
    memset(p, 0, sizeof *p);
    int per_pipeline = o->pp * o->tp;
    if (d->world_size % per_pipeline != 0)
        die("--pp %d x --tp %d does not divide the %d ranks of this job: start a multiple of %d ranks", o->pp, o->tp,
            d->world_size, per_pipeline);
    int shape[3] = {o->pp, d->world_size / per_pipeline, o->tp};
    const char *names[3] = {"pp", "dp", "tp"};
    mesh_init(&p->mesh, d->pg, o->tp > 1 ? 3 : 2, shape, names);
    p->pp = mesh_group(&p->mesh, "pp"), p->dp = mesh_group(&p->mesh, "dp");
    p->tp = o->tp > 1 ? mesh_group(&p->mesh, "tp") : NULL;
    p->world = d->pg;
    p->stage = mesh_coord(&p->mesh, "pp"), p->stages = o->pp;
    p->replica = mesh_coord(&p->mesh, "dp"), p->replicas = shape[1];
    p->shard = o->tp > 1 ? mesh_coord(&p->mesh, "tp") : 0, p->shards = o->tp;
    p->first = p->stage == 0, p->last = p->stage == p->stages - 1;
    p->counts = p->last && p->shard == 0; // every shard of the last stage computes the same loss
    // The tied embedding: the first and the last stage of each pipeline,
    // shard by shard (pg_split: every rank calls it; the others join no group).
    bool ends = p->stages > 1 && (p->first || p->last);
    p->tie = pg_split(d->pg, ends ? p->replica * p->shards + p->shard : -1, p->stage);
    p->device = &d->device;
    p->gpipe = !strcmp(o->schedule, "gpipe");
    p->micro_batches = o->micro_batches, p->B = o->batch_size, p->T = o->block_size;
    p->slot_of = xcalloc((size_t)o->micro_batches, sizeof(int));
    p->slot_busy = xcalloc((size_t)o->micro_batches, sizeof(bool));
    p->max_events = 6 * o->micro_batches; // F and B, and at most a send and a receive with each
    p->events = xcalloc((size_t)p->max_events, sizeof(pipe_event));
}

// Once the model is built: what travels between stages, where this
// stage's own gradients begin, room for the times of `steps` steps. Rank 0
// prints what each stage holds and sends.
static void pipeline_start(pipeline_t *p, model_t *m, int steps) {
    const gpt_config *c = &m->host.cfg;
    p->own_from = gpt_stage_tied_copy(c, &m->host.stage);
    p->dtype = model_stage_dtype(m);
    p->count = (size_t)p->B * p->T * c->n_embd;
    p->max_steps = steps;
    p->busy = xcalloc((size_t)steps + 1, sizeof(double)), p->ends = xcalloc((size_t)steps + 1, sizeof(double));
    double kib = (double)(p->count * dtype_size(p->dtype)) / 1024;
    log_main("pipeline: %d stage(s) x %d micro-batches of %d x %d tokens, schedule %s; %d pipeline(s) (data parallel)%s\n",
             p->stages, p->micro_batches, p->B, p->T, p->gpipe ? "gpipe" : "1f1b", p->replicas,
             p->shards > 1 ? "; each stage split over tp ranks (per rank:)" : "");
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
                 st.head ? " + ln_f, the LM head (its own copy of wte)" : "", gpt_layout_stage_params(c, &st, p->shards, NULL),
                 sends[0] ? sends : "nothing (one stage)");
    }
}

static void pipeline_free(pipeline_t *p) {
    free(p->slot_of), free(p->slot_busy), free(p->events), free(p->busy), free(p->ends);
    if (p->tie) pg_destroy(p->tie);
    mesh_free(&p->mesh);
}

static double pipe_clock(const pipeline_t *p) { return now_seconds() - p->t0; }

static void pipe_record(pipeline_t *p, char kind, int micro, double start) {
    if (!p->recording) return;
    if (p->num_events == p->max_events) die("pipeline: more than %d events in a step", p->max_events);
    p->events[p->num_events++] = (pipe_event){kind, micro, start, pipe_clock(p)};
}

// Micro-batch i's activations go into the first free slot; its backward
// pass frees it. So the slots a stage ever uses - and so the memory the
// model allocates for them - are the micro-batches it held at once.
static void pipe_take_slot(pipeline_t *p, int i) {
    int k = 0;
    while (k < p->micro_batches && p->slot_busy[k]) k++;
    if (k == p->micro_batches) die("pipeline: micro-batch %d finds no free activation slot", i);
    p->slot_busy[k] = true, p->slot_of[i] = k;
    if (k + 1 > p->slots_used) p->slots_used = k + 1;
}

// One of the three buffers of micro-batch i's slot (model_stage_buffer).
static void *pipe_buffer(pipeline_t *p, model_t *m, int i, model_stage_buffer_t which, int B, int T) {
    model_use_slot(m, p->slot_of[i]);
    return model_stage_buffer(m, which, B, T);
}

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
    int peer, micro; // peer: a stage of this pipeline, -1 for none
} pipe_msg;

static const pipe_msg NO_MSG = {NULL, -1, -1};

static void pipe_exchange(pipeline_t *p, pipe_msg send, pipe_msg recv, size_t count) {
    double start = pipe_clock(p);
    pg_request_t *r = recv.peer >= 0 ? pg_irecv(p->pp, recv.buf, count, p->dtype, recv.peer) : NULL;
    pg_request_t *s = send.peer >= 0 ? pg_isend(p->pp, send.buf, count, p->dtype, send.peer) : NULL;
    if (r) pg_wait(r), pipe_record(p, 'R', recv.micro, start);
    if (s) pg_wait(s), pipe_record(p, 'S', send.micro, start);
}

// The four kinds of message, as Megatron-LM names them: activations go
// forward to stage s+1, gradients backward to stage s-1. Every one names
// the buffer of its micro-batch's slot, so a transfer is one call.
static pipe_msg pipe_msg_of(pipeline_t *p, model_t *m, int i, model_stage_buffer_t which, int peer) {
    if (peer < 0 || peer >= p->stages) return NO_MSG;
    return (pipe_msg){pipe_buffer(p, m, i, which, p->B, p->T), peer, i};
}
static pipe_msg send_forward(pipeline_t *p, model_t *m, int i) { return pipe_msg_of(p, m, i, STAGE_OUTPUT, p->stage + 1); }
static pipe_msg send_backward(pipeline_t *p, model_t *m, int i) { return pipe_msg_of(p, m, i, STAGE_GRAD, p->stage - 1); }
static pipe_msg recv_backward(pipeline_t *p, model_t *m, int i) { return pipe_msg_of(p, m, i, STAGE_GRAD, p->stage + 1); }
// Micro-batch i arrives at this stage: it takes a slot (on the first
// stage too, which receives nothing: it reads tokens).
static pipe_msg recv_forward(pipeline_t *p, model_t *m, int i) {
    pipe_take_slot(p, i);
    return pipe_msg_of(p, m, i, STAGE_INPUT, p->stage - 1);
}

// One batch forward through the whole pipeline and nothing else
// (validation, sampling): each stage receives, computes, sends on. The
// loss is the last stage's (its first shard's: see `counts`); the others
// return 0.
static float pipe_forward_only(pipeline_t *p, model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    size_t count = (size_t)B * T * m->host.cfg.n_embd;
    model_use_slot(m, 0);
    pipe_msg input = p->first ? NO_MSG : (pipe_msg){model_stage_buffer(m, STAGE_INPUT, B, T), p->stage - 1, 0};
    pipe_exchange(p, NO_MSG, input, count);
    float loss = model_forward(m, p->first ? in : NULL, p->last ? tg : NULL, B, T);
    model_wait(m); // before the output is sent
    pipe_msg output = p->last ? NO_MSG : (pipe_msg){model_stage_buffer(m, STAGE_OUTPUT, B, T), p->stage + 1, 0};
    pipe_exchange(p, output, NO_MSG, count);
    return p->counts ? loss : 0.0f;
}

// The process groups move data in the device's memory (NCCL knows no
// other): a few host values travel through a device buffer, as
// dist_all_reduce_host does for the whole job. `arg` is the peer of a send
// or a receive, the root of a broadcast, the operation of an all-reduce.
typedef enum { HOST_SEND, HOST_RECV, HOST_BROADCAST, HOST_ALL_REDUCE } host_op;

static void host_pg(pg_t *pg, const device_t *dev, host_op what, void *values, size_t count, dtype_t t, int arg) {
    if (pg_world_size(pg) == 1 || count == 0) return;
    size_t bytes = dtype_size(t) * count;
    void *buf = device_alloc(dev, bytes);
    device_from_host(dev, buf, values, bytes);
    if (what == HOST_SEND) pg_send(pg, buf, count, t, arg);
    else if (what == HOST_RECV) pg_recv(pg, buf, count, t, arg);
    else if (what == HOST_BROADCAST) pg_broadcast(pg, buf, count, t, arg);
    else pg_all_reduce(pg, buf, buf, count, t, (redop_t)arg);
    if (what != HOST_SEND) device_to_host(dev, values, buf, bytes);
    device_free(dev, buf);
}

// ===================================================================== evaluation

// Mean loss over a whole split, cut into non-overlapping pieces of T+1
// tokens (T inputs, each predicting the next); a shorter last piece counts
// too, so every token but the first of each piece is predicted exactly once.
// The pipelines share the pieces (pipeline r takes pieces r, r+W, ...;
// pipeline 0 the short one), each piece goes through every stage of its
// pipeline, and the last stages add up their loss sums and token counts:
// no piece is counted twice, whatever the number of pipelines.
static double evaluate(model_t *m, pipeline_t *pp, dist_t *d, const uint16_t *tokens, size_t count, int B, int T) {
    double loss_sum = 0;
    size_t predicted = 0, piece = (size_t)T + 1, full = count / piece;
    size_t rank = (size_t)pp->replica, world = (size_t)pp->replicas;
    size_t mine = full > rank ? (full - rank + world - 1) / world : 0;
    uint16_t *in = xmalloc(sizeof(uint16_t) * (size_t)B * T), *tg = xmalloc(sizeof(uint16_t) * (size_t)B * T);
    for (size_t first = 0; first < mine; first += (size_t)B) {
        int b = mine - first < (size_t)B ? (int)(mine - first) : B;
        for (int i = 0; i < b; i++) {
            const uint16_t *p = tokens + ((first + (size_t)i) * world + rank) * piece;
            memcpy(in + (size_t)i * T, p, sizeof(uint16_t) * T);
            memcpy(tg + (size_t)i * T, p + 1, sizeof(uint16_t) * T);
        }
        loss_sum += (double)pipe_forward_only(pp, m, in, tg, b, T) * b * T;
        predicted += pp->counts ? (size_t)b * T : 0;
    }
    size_t rest = count - full * piece;
    if (rest >= 2 && rank == 0) {
        const uint16_t *last = tokens + full * piece;
        loss_sum += (double)pipe_forward_only(pp, m, last, last + 1, 1, (int)rest - 1) * (double)(rest - 1);
        predicted += pp->counts ? rest - 1 : 0;
    }
    free(in);
    free(tg);
    double sums[2] = {loss_sum, (double)predicted};
    dist_all_reduce_host(d, sums, 2, OP_SUM);
    if (sums[1] == 0) die("the split has fewer than 2 tokens: nothing to evaluate");
    return sums[0] / sums[1];
}

// ===================================================================== sampling

typedef struct {
    pipeline_t *p;
    model_t *m;
} pipe_sampler_t;

// model_generate through the pipeline: every stage computes its blocks for
// the text so far, the last one picks the next token, and every stage
// learns it (a broadcast from the last stage): the first needs it next.
// With tp, the last stage's shards take their first shard's pick.
static void pipe_generate(void *ctx, uint16_t *tokens, int len, int total, float temperature, int top_k,
                          rng_t *rng) {
    pipeline_t *p = ((pipe_sampler_t *)ctx)->p;
    model_t *m = ((pipe_sampler_t *)ctx)->m;
    int V = m->host.cfg.vocab_size, block = m->host.cfg.block_size;
    float *scratch = xmalloc(sizeof(float) * (size_t)V);
    for (int n = len; n < total; n++) {
        int start = n > block ? n - block : 0;
        pipe_forward_only(p, m, tokens + start, NULL, 1, n - start);
        int32_t next = 0;
        if (p->last) next = gpt_sample_next(model_logits(m, n - start - 1, scratch), V, temperature, top_k, rng);
        if (p->last && p->tp) host_pg(p->tp, p->device, HOST_BROADCAST, &next, 1, DTYPE_I32, 0);
        host_pg(p->pp, p->device, HOST_BROADCAST, &next, 1, DTYPE_I32, p->stages - 1);
        tokens[n] = (uint16_t)next;
    }
    free(scratch);
}

// Continuations of the prompt (gpt/samples.h); the same seed gives the same
// text. With a pipeline (p), all its stages take part; without, one model samples.
static void print_samples(model_t *m, pipeline_t *p, const bpe_t *t, const options *o) {
    samples_opts_t how = {o->prompt, o->num_samples, o->sample_tokens, o->temperature, o->top_k, o->seed};
    if (p) samples_print(t, &how, pipe_generate, &(pipe_sampler_t){p, m});
    else samples_print(t, &how, samples_from_model, m);
}

// ===================================================================== saving

// The model as safetensors and, beside it, the tokenizer that gives its
// token ids meaning. `whole`: the whole model, which rank 0 assembled
// from the stages (assemble_whole).
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
    print_samples(&m, NULL, t, o);
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
    pipeline_t *pipe;
} trainer_t;

// The data is shared between the pipelines, as 08 shares it between its
// ranks: the stages of one pipeline read the same blocks (the first one
// their tokens, the last one their targets).
static trainer_t make_trainer(const options *o, const corpus_t *c, dist_t *d, pipeline_t *p) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    int B = o->batch_size, T = o->block_size, W = p->replicas;
    tr.dist = d, tr.pipe = p;
    tr.num_blocks = c->count[0] > 1 ? (c->count[0] - 1) / (size_t)T : 0;
    if (tr.num_blocks < (size_t)W)
        die("the training split has %zu tokens: too few blocks of %d for %d pipelines", c->count[0], T, W);
    // Every pipeline gets the same number of blocks (DistributedSampler
    // semantics), so every rank takes the same number of steps.
    tr.sampler = sampler_create((int64_t)tr.num_blocks, W, p->replica, true, (uint64_t)o->seed, false);
    int64_t per_rank = ((int64_t)tr.num_blocks + W - 1) / W;
    tr.steps_per_epoch = (int)(per_rank / ((int64_t)B * o->micro_batches));
    if (tr.steps_per_epoch < 1)
        die("the training split has %zu tokens: too few for one step of %d pipeline(s) x %d x %d x %d tokens (use a "
            "smaller --batch_size, --micro_batches or --block_size)", c->count[0], W, o->micro_batches, B, T);
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

// ---------------------------------------------------------------- the schedules

// Micro-batch i's forward pass on this stage: the first stage embeds its
// tokens, the last computes its loss. The timeline records when the device
// finished (model_wait), which is also when its output may be sent.
static void pipe_forward(pipeline_t *p, model_t *m, trainer_t *tr, const uint16_t *train, int step_in_epoch, int i) {
    fill_batch(tr, train, step_in_epoch * p->micro_batches + i, p->B, p->T);
    model_use_slot(m, p->slot_of[i]);
    double start = pipe_clock(p);
    model_train_forward(m, p->first ? tr->inputs : NULL, p->last ? tr->targets : NULL, p->B, p->T);
    model_wait(m);
    pipe_record(p, 'F', i, start);
}

// Its backward pass, for the mean over the micro-batches (08's
// --grad_accum), from the loss on the last stage and from the gradient
// the next stage sent on the others. Then its slot is free again.
static void pipe_backward(pipeline_t *p, model_t *m, int i) {
    model_use_slot(m, p->slot_of[i]);
    double start = pipe_clock(p);
    model_backward(m, 1.0f / (float)p->micro_batches, NULL);
    model_wait(m);
    pipe_record(p, 'B', i, start);
    p->slot_busy[p->slot_of[i]] = false;
}

// GPipe: all M forward passes, then all M backward passes. Each stage
// holds the activations of every micro-batch until the backward passes
// begin. A stage waits for its input, computes, sends its output on: a
// chain that runs one way and cannot close into a circle of waits.
static void schedule_gpipe(pipeline_t *p, model_t *m, trainer_t *tr, const uint16_t *train, int step_in_epoch) {
    int M = p->micro_batches;
    for (int i = 0; i < M; i++) {
        pipe_exchange(p, NO_MSG, recv_forward(p, m, i), p->count);
        pipe_forward(p, m, tr, train, step_in_epoch, i);
        pipe_exchange(p, send_forward(p, m, i), NO_MSG, p->count);
    }
    for (int i = 0; i < M; i++) {
        pipe_exchange(p, NO_MSG, recv_backward(p, m, i), p->count);
        pipe_backward(p, m, i);
        pipe_exchange(p, send_backward(p, m, i), NO_MSG, p->count);
    }
}

// 1F1B (PipeDream-Flush): stage s first runs S-s-1 forward passes (the
// warm-up: as many as the stages after it need to start), then alternates
// one forward, one backward until the forwards are done, then the
// remaining backwards (the cool-down). Micro-batch i's backward pass comes
// as early as it can, so its activations are freed early: at most S-s
// micro-batches are held, however large M. Same bubble as GPipe, less memory.
// In the steady state a stage sends its output forward while it waits for
// a gradient from the same neighbour, and sends a gradient back while it
// waits for its next input: each pair goes out as one exchange
// (pipe_exchange), as Megatron-LM's send_forward_recv_backward does.
static void schedule_1f1b(pipeline_t *p, model_t *m, trainer_t *tr, const uint16_t *train, int step_in_epoch) {
    int M = p->micro_batches, S = p->stages;
    int warmup = S - p->stage - 1 < M ? S - p->stage - 1 : M, steady = M - warmup;
    for (int i = 0; i < warmup; i++) {
        pipe_exchange(p, NO_MSG, recv_forward(p, m, i), p->count);
        pipe_forward(p, m, tr, train, step_in_epoch, i);
        pipe_exchange(p, send_forward(p, m, i), NO_MSG, p->count);
    }
    if (steady > 0) pipe_exchange(p, NO_MSG, recv_forward(p, m, warmup), p->count);
    for (int j = 0; j < steady; j++) {
        int f = warmup + j, b = j; // this round's forward and backward micro-batches
        pipe_forward(p, m, tr, train, step_in_epoch, f);
        pipe_msg out = send_forward(p, m, f), grad = recv_backward(p, m, b);
        pipe_exchange(p, out, grad, p->count);
        pipe_backward(p, m, b);
        pipe_msg back = send_backward(p, m, b), next = j + 1 < steady ? recv_forward(p, m, f + 1) : NO_MSG;
        pipe_exchange(p, back, next, p->count);
    }
    for (int b = steady; b < M; b++) {
        pipe_exchange(p, NO_MSG, recv_backward(p, m, b), p->count);
        pipe_backward(p, m, b);
        pipe_exchange(p, send_backward(p, m, b), NO_MSG, p->count);
    }
}

// A step begins on every stage of a pipeline at once (a barrier), so that
// the stages' timelines share their zero.
static void pipe_begin_step(pipeline_t *p) {
    pg_barrier(p->pp);
    p->t0 = now_seconds();
    p->num_events = 0;
    p->recording = true;
}

// Its busy time (forward and backward passes) and its end, for the bubble.
static void pipe_end_step(pipeline_t *p) {
    p->recording = false;
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

// One optimizer step: the micro-batches through the pipeline, then the
// gradients of each stage averaged over its replicas (DDP, as in 08) and
// the two copies of wte summed: the last stage's holds the LM head's part
// of its gradient, the first stage's the embedding's, and both need the
// whole. Clipping needs the norm of the whole model: each stage adds the
// squares of its own gradients (the last leaves out its copy of wte, which
// the first counts), the stages add up their sums. Then every copy of a
// parameter takes the same step. The losses are not read here (see 08).
static void train_step(model_t *m, trainer_t *tr, const options *o, const uint16_t *train, int step_in_epoch, int step) {
    pipeline_t *p = tr->pipe;
    model_zero_grad(m);
    pipe_begin_step(p);
    if (p->gpipe) schedule_gpipe(p, m, tr, train, step_in_epoch);
    else schedule_1f1b(p, m, tr, train, step_in_epoch);
    pipe_end_step(p);
    model_tp_agree(m); // with --tp on a GPU: the replicated gradients of shard 0 (chapter 10)
    model_all_reduce_grads(m, p->dp, 0, m->host.num_params, OP_AVG);
    if (p->tie) model_all_reduce_grads(m, p->tie, 0, (size_t)m->host.cfg.vocab_size * m->host.cfg.n_embd, OP_SUM);
    model_clip_grad_norm_over(m, p->pp, p->own_from, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

static void format_duration(double seconds, char *buf, size_t size) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// The progress line: the loss averaged since the last line over all
// pipelines (the last stages have it: the others add 0), the speed (of all
// ranks together), the time left.
static void report_progress(model_t *m, trainer_t *tr, const options *o, int step, int epoch) {
    double loss = model_take_train_loss(m);           // waits for the GPU, once per line
    if (!tr->pipe->counts) loss = 0;
    dist_all_reduce_host(tr->dist, &loss, 1, OP_SUM);
    loss /= tr->pipe->replicas;
    double now = now_seconds(), tokens = (double)tr->loss_count * o->batch_size * o->micro_batches * o->block_size *
                                         tr->pipe->replicas;
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
    double loss = evaluate(m, tr->pipe, tr->dist, c->split[1], c->count[1], o->batch_size, o->block_size);
    log_main("validation after step %d (epoch %d): loss %.4f | perplexity %.2f | %zu tokens in %.1f s\n", step,
             epoch + 1, loss, exp(loss), c->count[1], now_seconds() - start);
    metrics_row(&tr->csv, "%d,%d,,%.5f,", step, epoch + 1, loss);
    tr->interval_start += now_seconds() - start; // validation time is not training speed
}

// ---------------------------------------------------------------- measured: the bubble, the memory, the timeline

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
static double pipe_report(pipeline_t *p, model_t *m, dist_t *d, const options *o) {
    host_pg(p->pp, p->device, HOST_ALL_REDUCE, p->ends, (size_t)p->steps, DTYPE_F64, OP_MAX); // the spans
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
    // Pipeline 0's ranks are ranks 0, W/S, 2W/S, ... (pp is the slowest dimension).
    log_main("activations held, measured (slots the stage allocated; gpipe holds M = %d, 1f1b at most S - s):\n", M);
    for (int stage = 0; stage < S; stage++) {
        const double *r = table + (size_t)stage * p->replicas * p->shards * ROW;
        log_main("  stage %d: %d micro-batch(es), %.2f MiB\n", stage, (int)r[ROW_SLOTS], r[ROW_BYTES] / 1048576.0);
    }
    free(table);
    return mean;
}

// The last step's timeline, from every rank, into DIR/timeline-SCHEDULE.csv
// for plots/11_timeline.gp: one row per forward, backward, send, receive.
static void write_timeline(pipeline_t *p, dist_t *d, const options *o, double bubble) {
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
        for (int r = 0; r < d->world_size; r++)
            for (int e = 0; e < p->max_events; e++) {
                const double *ev = table + (size_t)r * cols + 4 * (size_t)e;
                if (ev[0] == 0) continue; // the rest of a shorter row
                int per_stage = p->replicas * p->shards; // the mesh: pp x dp x tp, tp fastest
                metrics_row(&csv, "%d,%d,%d,%d,%c,%d,%.3f,%.3f", r, r / per_stage, r / p->shards % p->replicas,
                            r % p->shards, (char)ev[0], (int)ev[1], 1e3 * ev[2], 1e3 * ev[3]);
            }
        metrics_close(&csv);
        log_main("timeline of the last step: %s/%s.csv (plot: make plots)\n", o->out_dir, name);
    }
    free(table);
}

// ===================================================================== snapshots

// The whole model on rank 0, assembled from the stages of pipeline 0
// (and from their tp shards): every rank of it sends its parameters and
// both AdamW moments to rank 0, which puts each tensor, or each tensor's
// part, in its place in 08's flat arrays (gpt_shard_copy with the sender's
// table). The other pipelines hold the same numbers and send nothing.
// Every rank calls it; rank 0 gets true and *whole.
static bool assemble_whole(model_t *m, pipeline_t *p, gpt_t *whole) {
    if (p->replica != 0) return false;
    model_to_host(m);
    gpt_t *h = &m->host;
    int arrays = h->adam_step > 0 ? 3 : 1; // the moments exist once a step was taken
    gpt_real *mine[3] = {h->params, h->adam_m, h->adam_v};
    if (pg_rank(p->world) != 0) {
        for (int k = 0; k < arrays; k++) host_pg(p->world, p->device, HOST_SEND, mine[k], h->num_params, DTYPE_F32, 0);
        return false;
    }
    gpt_init(whole, h->cfg, 0); // every number of it is overwritten below
    whole->adam_step = h->adam_step;
    if (arrays == 3) whole->adam_m = xmalloc(sizeof(gpt_real) * whole->num_params);
    if (arrays == 3) whole->adam_v = xmalloc(sizeof(gpt_real) * whole->num_params);
    gpt_real *dst[3] = {whole->params, whole->adam_m, whole->adam_v};
    for (int stage = 0; stage < p->stages; stage++)
        for (int shard = 0; shard < p->shards; shard++) {
            int from = stage * p->replicas * p->shards + shard; // its rank in the mesh, pipeline 0
            gpt_t part; // the sender's table: where each of its tensors lies in what it sends
            memset(&part, 0, sizeof part);
            part.cfg = h->cfg, part.stage = gpt_stage_of(&h->cfg, stage, p->stages), part.tp = h->tp;
            gpt_build_table(&part);
            gpt_real *buf = from == 0 ? NULL : xmalloc(sizeof(gpt_real) * part.num_params);
            for (int k = 0; k < arrays; k++) {
                if (from > 0) host_pg(p->world, p->device, HOST_RECV, buf, part.num_params, DTYPE_F32, from);
                gpt_shard_copy(&part, shard, dst[k], from == 0 ? mine[k] : buf, false);
            }
            free(buf);
            free(part.tensors);
        }
    return true;
}

// The resumable state, as in chapter 06: the parameters, both AdamW moments
// and its step count, where the run is, and the configuration that must
// match. Written by rank 0 at the end of an epoch, from the whole model:
// chapter 08 reads it as its own.
static void save_snapshot(const gpt_t *m, const options *o, int epochs_done, int step, int world) {
    int64_t shape[1] = {(int64_t)m->num_params};
    float *zeros = m->adam_m ? NULL : xcalloc(m->num_params, sizeof(float));
    safetensors_tensor t[3] = {safetensors_tensor_of("params", "F32", m->params, 1, shape),
                            safetensors_tensor_of("adam_m", "F32", m->adam_m ? m->adam_m : zeros, 1, shape),
                            safetensors_tensor_of("adam_v", "F32", m->adam_v ? m->adam_v : zeros, 1, shape)};
    safetensors_meta meta[12];
    int n = 0;
    meta[n++] = safetensors_meta_of("config", "vocab %d block %d layers %d heads %d embd %d", m->cfg.vocab_size,
                                 m->cfg.block_size, m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd);
    meta[n++] = safetensors_meta_of("training", "batch %d accum %d lr %.9g seed %d", o->batch_size, o->micro_batches,
                                 o->lr, o->seed);
    meta[n++] = safetensors_meta_of("epoch", "%d", epochs_done);
    meta[n++] = safetensors_meta_of("step", "%d", step);
    meta[n++] = safetensors_meta_of("adam_step", "%d", m->adam_step);
    meta[n++] = safetensors_meta_of("world_size", "%d", world);
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

// Rank 0 loads the newest valid snapshot into the whole model m;
// everyone receives it by broadcast, before each rank keeps its stage.
// Returns the epochs already done (0: a fresh start) and sets *step.
static int resume(gpt_t *m, const options *o, dist_t *d, int *step) {
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
            snprintf(want[1], sizeof want[1], "batch %d accum %d lr %.9g seed %d", o->batch_size, o->micro_batches,
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
    // Equal replicas from the start (ddp.h's rule 1): rank 0's state.
    dist_broadcast_host(d, m->params, m->num_params, DTYPE_F32, 0);
    if (m->adam_step > 0) {
        dist_broadcast_host(d, m->adam_m, m->num_params, DTYPE_F32, 0);
        dist_broadcast_host(d, m->adam_v, m->num_params, DTYPE_F32, 0);
    }
    *step = (int)where[1];
    return (int)where[0];
}

// This rank's stage of the whole model, on its device: its tensors (with
// --tp, its shard of them: chapter 10's gpt_init_shard), and AdamW's
// moments when the run resumes.
static void make_stage(model_t *model, const gpt_t *whole, const pipeline_t *p, const device_t *d, gpt_precision precision,
                       const options *o) {
    gpt_t stage;
    gpt_init_part(&stage, whole, gpt_stage_of(&whole->cfg, p->stage, p->stages), p->shards, p->shard);
    model_create(model, stage, d, precision, o->batch_size, o->block_size);
    if (stage.adam_step > 0) model_to_device(model); // the moments too
    if (p->tp) model_tensor_parallel(model, p->tp);   // its blocks' all-reduces: chapter 10
}

static void train(model_t *m, const corpus_t *c, const options *o, trainer_t *tr, int first_epoch, int step) {
    log_main("training: %d step(s) (%d per epoch) of %d tokens (%d pipeline(s) x %d x batch %d x block %d) | lr %g "
             "-> %g, warm-up %d\n", tr->total_steps, tr->steps_per_epoch,
             tr->pipe->replicas * o->micro_batches * o->batch_size * o->block_size, tr->pipe->replicas,
             o->micro_batches, o->batch_size, o->block_size, o->lr, o->min_lr, tr->warmup);
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
        // Every stage of pipeline 0 sends its part to rank 0, which saves.
        gpt_t whole;
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0;
        if (save && assemble_whole(m, tr->pipe, &whole)) {
            if (o->snapshot_path) save_snapshot(&whole, o, epoch + 1, step, tr->dist->world_size);
            else save_model(&whole, c->tokenizer, o);
            gpt_free(&whole);
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
    pipeline_t pipe;
    pipeline_init(&pipe, &dist, o);
    mesh_report(&pipe.mesh, &dist); // one line per rank: its stage and pipeline
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
    // broadcast anyway when training starts). The whole model exists on the
    // host until this rank has taken its stage of it.
    gpt_config cfg = {bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd};
    gpt_t whole;
    gpt_init(&whole, cfg, (uint64_t)o->seed);
    trainer_t tr = make_trainer(o, &corpus, &dist, &pipe);
    int step = 0, first_epoch = resume(&whole, o, &dist, &step);
    model_t model;
    make_stage(&model, &whole, &pipe, &dist.device, precision, o);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers%s, %d heads, %d channels), %s\n",
             whole.num_params, cfg.vocab_size, cfg.block_size, cfg.n_layer,
             o->layers_for_stages ? ": one per stage, more than the preset's" : "", cfg.n_head, cfg.n_embd,
             model_precision(&model));
    gpt_free(&whole);
    pipeline_start(&pipe, &model, tr.total_steps);

    // --- Training, with validation after every epoch.
    train(&model, &corpus, o, &tr, first_epoch, step);
    metrics_close(&tr.csv);
    double bubble = pipe_report(&pipe, &model, &dist, o);
    if (bubble >= 0) write_timeline(&pipe, &dist, o, bubble);

    // --- Report: test perplexity, samples (pipeline 0), the saved model (rank 0).
    double test_loss = evaluate(&model, &pipe, &dist, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (pipe.replica == 0) print_samples(&model, &pipe, corpus.tokenizer, o);
    if (assemble_whole(&model, &pipe, &whole)) {
        save_model(&whole, corpus.tokenizer, o);
        double l2 = 0;
        for (size_t i = 0; i < whole.num_params; i++) l2 += (double)whole.params[i] * whole.params[i];
        log_main("final parameters checksum %016llx, l2 norm %.9g\n",
                 (unsigned long long)checksum_bytes(whole.params, sizeof(gpt_real) * whole.num_params), sqrt(l2));
        log_main("metrics: %s (plot: gnuplot plots/08_gpt_loss.gp)\n", tr.csv.path);
        gpt_free(&whole);
    }

    free(tr.inputs), free(tr.targets);
    sampler_free(&tr.sampler);
    for (int s = 0; s < 3; s++) free(corpus.split[s]);
    bpe_free(corpus.tokenizer);
    model_free(&model);
    pipeline_free(&pipe);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    options o = parse_options(argc, argv);
    if (o.generate) return generate_only(&o);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --nprocs N spawns N ranks (mp.spawn style, chapter 04): by
    // default one pipeline, a rank per stage.
    int ranks = o.nprocs ? o.nprocs : o.pp * o.tp;
    if (launch_env_read().launched || ranks == 1) return run_rank(0, 1, &o);
    return spawn(ranks, run_rank, &o);
}
