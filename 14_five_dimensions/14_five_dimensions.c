// 14_five_dimensions.c - Chapter 14, the finale: five ways to cut training, on one mesh.
//
// Chapter 11's program - 08's GPT and training loop, the model cut by depth
// into --pp stages that --grad_accum micro-batches flow through (GPipe or
// 1F1B), each stage split over --tp ranks (chapter 10), --dp pipelines
// side by side - with the two cuts chapters 12 and 13 made alone:
//   --cp  each sequence split over cp ranks, attention across them (12);
//   --ep  each mixture-of-experts block's --n_expert experts spread over
//         ep ranks, the tokens sent to them and back (13).
// All five are the dimensions of ONE mesh of common/groups.h, in one
// order, pp x dp x ep x cp x tp (tp fastest: its all-reduces inside every
// block want the nearest ranks; pp's few messages go farthest). The whole
// lesson is which ranks share what, and so over which group each number
// is added up:
//   data    dp x ep ranks read different batches (an ep group shares only
//           its experts); the cp ranks of one replica read the same
//           sequences and each keeps its tokens; tp and pp ranks of one
//           replica compute one model together and read the same batches;
//   dense   a weight outside the experts is held by every rank with the
//           same pp and tp coordinates: its gradient is averaged over
//           dp x ep x cp (groups_join "dp ep cp");
//   experts an expert is held by the ranks with the same pp, tp AND ep
//           coordinates: its gradient is summed over dp x cp ("dp cp")
//           and divided by dp x ep x cp, as the dense ones (gpt/model.h's
//           model_average_experts says why not by dp x cp);
//   norm    clipping's squares are added over tp for the split matrices,
//           over ep for the experts, over pp for the stages (finale.h);
//   loss    the last stage's, each cp rank's the mean over the sequences
//           (cp_mean_loss), summed over dp x ep for the progress line.
// Everything a dimension needs inside the model was written by its
// chapter; the finale adds the places where two meet (gpt.h: cp attention
// and experts in a tp block; pipeline.h: a stage's messages carry its cp
// rank's tokens). Equal to one process with the same total batch: tests/
// chapters/test_14_five_dimensions.sh, 32 ranks 2 x 2 x 2 x 2 x 2 and others.
//
// Read it top to bottom, as 11's: options, the schedules and the training
// step, the training loop, what every rank runs. The pipeline's machinery
// is in ../gpt/pipeline.h (11's), this chapter's in finale.h, the rest in
// ../gpt/. `make diffs` shows what changed from 11.
//
// Where it computes: CPU ranks (gpt.h), or one GPU a rank for the shapes
// whose GPU paths chapters 10-12 wrote (dp x tp x pp; dp x cp); finale.h
// refuses the rest, saying why. --shard 1 (chapter 09's ZeRO-1) slices
// each part's AdamW moments over dp, with --replicate as 09's hybrid
// (ZeRO-2 and 3 are refused: finale.h says why).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "dist.h"
#include "finale.h"
#include "fault.h"
#include "flags.h"
#include "gather_whole.h"
#include "launch_env.h"
#include "log.h"
#include "model.h"
#include "nodes.h"
#include "options.h"
#include "pipeline.h"
#include "run.h"
#include "snapshot_whole.h"
#include "spawn.h"
#include "threads.h"
#include "trainer.h"

#define CHAPTER "14_five_dimensions"

// ===================================================================== options

// Every flag is gpt/options.h's: chapters 09-14 keep them and add their own.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    o.pp = 2, o.grad_accum = 4; // by default two stages, four micro-batches
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2 and sample from it"};
    options_add_flags(&set, &o);
    pipeline_add_flags(&set, &o, "dp tp pp cp ep"); // --schedule, and the mesh: all five dimensions
    finale_add_flags(&set, &o); // 12's attention across cp, 13's mixture of experts
    flags_parse(&set, argc, argv);
    pipeline_finish_options(&o, &set);
    finale_refuse(&set, &o); // what does not divide, what is not composed
    return o;
}

// ===================================================================== training

// Micro-batch i's forward pass on this stage: the first stage embeds its
// tokens, the last computes its loss. Every stage takes the next batch of
// its pipeline's blocks, in order (micro-batches 0 .. M-1 in both
// schedules), and reads its part. The timeline records when the device
// finished (model_wait), which is also when its output may be sent.
static void pipe_forward(pipeline_t *p, model_t *m, trainer_t *tr, int i) {
    const loader_batch_t *batch = loader_next(&tr->loader);
    model_use_slot(m, p->slot_of[i]);
    double start = pipe_clock(p);
    model_train_forward(m, p->first ? batch->inputs : NULL, p->last ? batch->targets : NULL, p->B, p->T);
    model_wait(m);
    pipe_record(p, 'F', i, start);
}

// Its backward pass, for the mean over the micro-batches (08's
// --grad_accum), from the loss on the last stage and from the gradient
// the next stage sent on the others. Then its slot is free again. (No
// process group: a stage's gradients are averaged once the pipeline has
// drained, not bucket by bucket during the backward pass as in 08.)
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
static void schedule_gpipe(pipeline_t *p, model_t *m, trainer_t *tr) {
    int M = p->micro_batches;
    for (int i = 0; i < M; i++) {
        pipe_exchange(p, NO_MSG, recv_forward(p, m, i), p->count);
        pipe_forward(p, m, tr, i);
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
static void schedule_1f1b(pipeline_t *p, model_t *m, trainer_t *tr) {
    int M = p->micro_batches, S = p->stages;
    int warmup = S - p->stage - 1 < M ? S - p->stage - 1 : M, steady = M - warmup;
    for (int i = 0; i < warmup; i++) {
        pipe_exchange(p, NO_MSG, recv_forward(p, m, i), p->count);
        pipe_forward(p, m, tr, i);
        pipe_exchange(p, send_forward(p, m, i), NO_MSG, p->count);
    }
    if (steady > 0) pipe_exchange(p, NO_MSG, recv_forward(p, m, warmup), p->count);
    for (int j = 0; j < steady; j++) {
        int f = warmup + j, b = j; // this round's forward and backward micro-batches
        pipe_forward(p, m, tr, f);
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

// One optimizer step: the micro-batches through the pipeline, then the
// gradients of each stage averaged over the ranks that hold the same
// numbers - the dense ones over dp x ep x cp, each expert over its
// replicas (model_average_experts, chapter 13) - and
// the two copies of wte summed: the last stage's holds the LM head's part
// of its gradient, the first stage's the embedding's, and both need the
// whole. Clipping needs the norm of the whole model: each stage adds the
// squares of its own gradients (the last leaves out its copy of wte, which
// the first counts), over its tp shards and ep experts (finale_clip), and
// the stages add up their sums. Then every copy of a
// parameter takes the same step. The losses are not read here (see 08).
// With --shard 1 (ZeRO-1 over dp, finale.h) the average over dp is the
// reduce-scatter of 09: each rank clips and steps its slice of the part.
static void train_step(pipeline_t *p, model_t *m, trainer_t *tr, const options *o, int step, pg_t *dense, zero_t *z) {
    model_zero_grad(m);
    pipe_begin_step(p);
    if (p->gpipe) schedule_gpipe(p, m, tr);
    else schedule_1f1b(p, m, tr);
    pipe_end_step(p);
    // DDP: every rank ends with the same averaged gradient, so every rank
    // clips and steps the same way, and the replicas stay identical.
    model_average_gradients(m, dense); // the experts over the replicas make_part named
    model_tp_agree(m); // with --tp on a GPU: the replicated gradients of shard 0 (chapter 10)
    if (p->tie) model_all_reduce_grads(m, p->tie, 0, (size_t)m->host.cfg.vocab_size * m->host.cfg.n_embd, OP_SUM);
    if (!z) {
        finale_clip(m, &p->g, p->own_from, (float)o->grad_clip);
        model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
        return;
    }
    zero_begin_step(z);
    zero_reduce_scatter_gradients(z); // the mean over dp of this rank's slice
    zero_average_replicas(z);         // --replicate: and over the replicas
    float scale = finale_zero_clip(z, &p->g, p->own_from, (float)o->grad_clip);
    zero_adamw(z, scale, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
    zero_all_gather_params(z); // every rank's stepped slices, into every rank's part
    zero_end_step(z);
}

// The resumable state, as in chapter 06 (gpt/snapshot_whole.h): written by
// rank 0 at the end of an epoch; at the start, rank 0 reads the newest and
// every rank takes its state (rule 1 of data parallelism: equal replicas
// from the start). Returns the epochs already done and sets *step.
// It is the whole model: every stage of pipeline 0 sends rank 0 its part
// (gather_whole). Without --snapshot_path: the saved model.
static void save_snapshot(pipeline_t *p, model_t *m, zero_t *z, const bpe_t *t, const options *o, int epochs_done,
                          int step, int world) {
    gpt_t whole;
    if (!finale_gather_whole(m, &p->g, z, true, &whole)) return; // with ZeRO, the moments' slices too
    if (o->snapshot_path) snapshot_save_whole(&whole, o, epochs_done, step, world, "", model_get_scaler(m));
    else run_save(&whole, t, o->out_dir);
    gpt_free(&whole);
}

static int resume(gpt_t *whole, const options *o, dist_t *d, int *step) {
    gpt_scaler scaler;
    int epoch = snapshot_resume_whole(whole, o, d, step, &scaler);
    snapshot_broadcast_whole(whole, d); // each rank then keeps its stage (make_stage)
    return epoch;
}

static void train(pipeline_t *p, model_t *m, const corpus_t *c, const options *o, trainer_t *tr, int first_epoch,
                  int step, pg_t *dense, zero_t *z) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, "a pipeline's step is passes and messages per micro-batch");
    int first_step = step;
    // For the tests, as in chapter 06: COURSE_FAIL_RANK and COURSE_FAIL_STEP
    // make a rank die before that step, in the first attempt only.
    fault_plan fault = fault_from_env();
    tr->start = tr->interval_start = now_seconds();
    for (int epoch = first_epoch; epoch < o->epochs && step < tr->total_steps; epoch++) {
        // Each rank takes its share of this epoch's order (seed + epoch).
        trainer_set_epoch(tr, epoch, o->grad_accum);
        bool validated = false;
        for (int s = 0; s < tr->steps_per_epoch && step < tr->total_steps; s++) {
            double t0 = now_seconds();
            fault_maybe_die(&fault, tr->dist, step + 1);
            train_step(p, m, tr, o, step, dense, z);
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate_with(m, tr, pipe_forward_only, p, c, o, step, epoch);
        }
        if (!validated) validate_with(m, tr, pipe_forward_only, p, c, o, step, epoch);
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0;
        if (save) save_snapshot(p, m, z, c->tokenizer, o, epoch + 1, step, tr->dist->world_size);
    }
    // What data parallelism cost in bytes: each rank's gradients, per step,
    // as they entered the all-reduce (a ring then sends 2(W-1)/W of that).
    int steps_run = step - first_step;
    if (tr->replicas.size > 1 && steps_run > 0)
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
    gpt_precision precision = run_announce(CHAPTER, o, &dist.device);
    choose_threads();
    nodes_report(&dist); // one line per node: host, ranks, device, transport
    pipeline_t pipe;
    pipeline_init(&pipe, &dist, o);
    groups_report(&pipe.g); // one line per rank: its five coordinates
    // The groups a gradient is averaged over: the dense weights' holders,
    // and each expert's (its ep coordinate fixed too). With ZeRO, dp's
    // average comes with the slices (finale.h), and the groups leave it out.
    pg_t *dense = groups_join(&pipe.g, o->shard ? "ep cp" : "dp ep cp"),
         *expert_replicas = groups_join(&pipe.g, o->shard ? "cp" : "dp cp");

    // --- Data: WikiText-2 and its tokenizer, the same tokens on every rank.
    corpus_t corpus = run_load_corpus(o, &dist);

    // --- Model: sized by the flags, vocabulary by the tokenizer; the same
    // seed gives every rank the same initial weights (and rank 0's are
    // broadcast anyway when training starts). The whole model exists on the
    // host until this rank has taken its stage of it.
    gpt_config cfg = finale_config(o, bpe_vocab_size(corpus.tokenizer)); // 08's sizes, 13's experts
    gpt_t whole;
    gpt_init(&whole, cfg, (uint64_t)o->seed);
    int step = 0, first_epoch = resume(&whole, o, &dist, &step);
    model_t model;
    make_part(&model, &whole, &pipe, expert_replicas, &dist.device, precision, o); // its stage, shard, experts
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers%s, %d heads, %d channels), %s\n",
             whole.num_params, cfg.vocab_size, cfg.block_size, cfg.n_layer,
             o->layers_for_stages ? ": one per stage, more than the preset's" : "", cfg.n_head, cfg.n_embd,
             model_precision(&model));
    gpt_free(&whole);
    zero_t zero, *z = finale_zero(&zero, &pipe, &model, o); // --shard 1: this rank's slices of its part's moments
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);

    // --- Training, with validation after every epoch: every pipeline of dp x ep a replica.
    trainer_t tr = trainer_make(o, &corpus, &dist, pipeline_replicas(&pipe), finale_mesh_text(&pipe.g));
    pipeline_start(&pipe, &model, tr.total_steps);
    train(&pipe, &model, &corpus, o, &tr, first_epoch, step, dense, z);
    pipeline_report(&pipe, &model, o); // the bubble, the activations held, the timeline
    if (z) finale_zero_report(z, &pipe); // ZeRO's slices and collectives, measured; the planner's rows

    // --- Report: test perplexity, samples, the saved model (rank 0).
    double test_loss = evaluate_with(&model, &tr.replicas, pipe_forward_only, &pipe, &dist.device, corpus.split[2],
                                     corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (groups_first(&pipe.g, DIM_DP)) run_print_samples(corpus.tokenizer, o, pipe_generate, &pipe);
    if (gather_whole(&model, &pipe.g, false, &whole)) { // every stage of pipeline 0 sends its part to rank 0
        run_save_and_report(&whole, corpus.tokenizer, o, tr.csv.path);
        gpt_free(&whole);
    }

    if (z) zero_free(z);
    trainer_free(&tr);
    run_free_corpus(&corpus);
    model_free(&model);
    pipeline_free(&pipe);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    options o = parse_options(argc, argv);
    if (o.generate) return run_generate_only(CHAPTER, &o);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --nprocs N spawns N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || options_ranks(&o) == 1) return run_rank(0, 1, &o);
    return spawn(options_ranks(&o), run_rank, &o);
}
