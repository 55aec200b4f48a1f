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
// Megatron-LM does it (Shoeybi et al., 2019): every rank holds its own
// attention heads and its own part of the MLP, and the ranks of a tp group
// compute each block TOGETHER on the same data, adding up their partial
// results with all-reduces inside the forward and the backward pass.
//   a. --dp M --tp N: a mesh of M x N ranks (common/groups.h), tp fastest:
//      a tp group is consecutive ranks, one machine (README.md says why);
//   b. every rank builds the whole model, as in 08, and keeps its shard
//      (gpt_init_shard; gpt_layout.h, section 5); the model calls back for
//      the all-reduces over tp (model_tensor_parallel; gpt.h, section 9);
//   c. data parallelism runs over the dp group only; the clipping norm
//      adds up the shards' squares over tp;
//   d. snapshots and the saved model hold the WHOLE model (gpt/gather_whole.h):
//      chapter 08 samples from it, a run resumes with another --tp;
//   e. tp_report.h checks the replicas and prints what a rank holds and sends.
//
// Read it top to bottom: options, the training step, the training loop,
// what every rank runs. The model itself, layer by layer, is in
// ../gpt/gpt.h; the GPT, its tokenizer, its data and what every GPT
// chapter's loop leans on without teaching it (the flags: options.h; the
// learning rate, progress and validation: trainer.h; the whole-model
// snapshot: snapshot_whole.h; the start and end of a run: run.h) live in
// ../gpt/, which chapters 09-14 share. Each of them is 08's file plus its
// idea: `make diffs` shows how little else changes.
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

#include "ddp.h"
#include "dist.h"
#include "fault.h"
#include "flags.h"
#include "gather_whole.h"
#include "groups.h"
#include "launch_env.h"
#include "log.h"
#include "model.h"
#include "nodes.h"
#include "options.h"
#include "run.h"
#include "snapshot_whole.h"
#include "spawn.h"
#include "threads.h"
#include "tp_report.h"
#include "tp_shard.h"
#include "trainer.h"

#define CHAPTER "10_tensor_parallel"

// ===================================================================== options

// Every flag is gpt/options.h's: 08's, and the mesh's --dp and --tp.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2, each block split over --tp ranks"};
    options_add_flags(&set, &o);
    options_add_mesh_flags(&set, &o, "dp tp");
    flag_int(&set, "check_every", &o.check_every, 0, 100000000, "check the replicas byte for byte every N steps (0: at the end only)");
    flags_parse(&set, argc, argv);
    options_finish(&o, &set);
    gpt_config c = gpt_config_of(o.vocab_size, o.block_size, o.n_layer, o.n_head, o.n_embd);
    const char *problem = gpt_tp_problem(&c, o.tp);
    if (problem) flags_fail(&set, "--tp %d: %s (the model has --n_head %d)", o.tp, problem, o.n_head);
    if (o.tp > 1 && !strcmp(o.precision, "fp16"))
        flags_fail(&set, "--precision fp16 with --tp %d: fp16's loss scaler (gpt_cuda.cu, section 7) lives in the "
                   "whole model's step only, and the tp ranks, whose shards overflow apart, would have to agree on "
                   "every step they skip; use --precision bf16 or fp32", o.tp);
    return o;
}

// ===================================================================== training

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// the dp replicas, then clip and AdamW. The losses are not read here: on a GPU
// that would make the host wait for every step, and the progress line
// reads them (model_take_train_loss) every --log_every steps instead.
static void train_step(model_t *m, trainer_t *tr, const options *o, int step) {
    // On one GPU the same step - zero_grad, forward, backward, clip, AdamW -
    // can be ONE launch of a CUDA graph (trainer_graph_step, gpt/trainer.h).
    if (tr->graph) {
        trainer_graph_step(m, tr, o, step);
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
        model_backward(m, 1.0f / (float)o->grad_accum, last ? tr->replicas.sum : NULL);
    }
    // DDP over the dp group: the ranks that hold the same shard end with
    // the same averaged gradient; the clipping norm adds up the shards over tp.
    model_average_gradients(m, tr->replicas.sum);
    model_tp_agree(m); // on a GPU: the replicated gradients of tp rank 0 (model.h says why)
    model_clip_grad_norm(m, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

// The resumable state, as in chapter 06 (gpt/snapshot_whole.h), WHOLE:
// written by rank 0 at the end of an epoch from replica 0's shards; at the
// start, rank 0 reads the newest into `whole` and every rank takes it
// (rule 1 of data parallelism: equal replicas from the start) and keeps
// its shard. Returns the epochs already done and sets *step.
static void save_snapshot(model_t *m, groups_t *g, const options *o, int epochs_done, int step) {
    gpt_t whole;
    if (!gather_whole(m, g, true, &whole)) return;
    snapshot_save_whole(&whole, o, epochs_done, step, g->world, tp_mesh_text(g), model_get_scaler(m));
    gpt_free(&whole);
}

static int resume(model_t *m, gpt_t *whole, const options *o, groups_t *g, int *step) {
    gpt_scaler scaler;
    int epoch = snapshot_resume_whole(whole, o, g->dist, step, &scaler);
    snapshot_broadcast_whole(whole, g->dist);
    take_shard(m, whole, g->coord[DIM_TP]);
    model_set_scaler(m, scaler); // fp16: the loss scale to start from
    return epoch;
}

static void train(model_t *m, gpt_t *whole, groups_t *g, const corpus_t *c, const options *o, trainer_t *tr) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, NULL);
    int step = 0;
    int first_epoch = resume(m, whole, o, g, &step), first_step = step;
    gpt_free(whole); // from here on, each rank holds its shard only
    double tp_sent[2] = {0, 0}; // numbers and bytes all-reduced over tp by the training steps
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
            double numbers = m->tp_numbers, bytes = m->tp_bytes;
            train_step(m, tr, o, step);
            tp_sent[0] += m->tp_numbers - numbers, tp_sent[1] += m->tp_bytes - bytes;
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
            if (o->check_every > 0 && step % o->check_every == 0) check_replicas(m, g, step);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        // The ranks of replica 0 send their shards; rank 0 writes the whole model.
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0;
        gpt_t saved;
        if (save && o->snapshot_path) save_snapshot(m, g, o, epoch + 1, step);
        else if (save && gather_whole(m, g, false, &saved))
            run_save(&saved, c->tokenizer, o->out_dir), gpt_free(&saved);
    }
    // What data parallelism cost in bytes: each rank's gradients, per step,
    // as they entered the all-reduce (a ring then sends 2(W-1)/W of that).
    int steps_run = step - first_step;
    if (tr->replicas.size > 1 && steps_run > 0)
        log_main("gradients all-reduced: %.0f bytes per step per rank (%s), %zu parameters\n",
                 (double)ddp_bytes_reduced() / steps_run, ddp_wire_name(m->grad_compress),
                 m->host.num_params);
    // And tensor parallelism's, after the replicas are checked (tp_report.h).
    check_replicas(m, g, step);
    report_memory_and_traffic(m, g, o, tp_sent, steps_run);
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
    gpt_precision precision = run_announce(CHAPTER, o, &dist.device);
    choose_threads();
    nodes_report(&dist); // one line per node: host, ranks, device, transport
    // The mesh: a tp group holds ONE model's shards, a dp group one shard.
    groups_t g;
    groups_init(&g, &dist, (int[DIMS]){[DIM_PP] = 1, [DIM_DP] = o->dp, [DIM_EP] = 1, [DIM_CP] = 1, [DIM_TP] = o->tp});
    groups_report(&g); // rank -> (dp, tp) -> device

    // --- Data: WikiText-2 and its tokenizer, the same tokens on every rank.
    corpus_t corpus = run_load_corpus(o, &dist);

    // --- Model: sized by the flags, vocabulary by the tokenizer; the same
    // seed gives every rank the same WHOLE model, as in chapter 08 (and
    // rank 0's is broadcast anyway when training starts); each rank keeps
    // its shard, and the model all-reduces over the tp group.
    gpt_config cfg = gpt_config_of(bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd);
    gpt_t initial, shard;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    gpt_init_shard(&shard, &initial, g.size[DIM_TP], g.coord[DIM_TP]);
    model_t model;
    model_create(&model, shard, &dist.device, precision, o->batch_size, o->block_size);
    model_tensor_parallel(&model, g.group[DIM_TP]);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s; %zu on each "
             "rank (its shard of every block: %d of the %d heads)\n", initial.num_params, cfg.vocab_size,
             cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, model_precision(&model), model.host.num_params,
             cfg.n_head / g.size[DIM_TP], cfg.n_head);
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);

    // --- Training, with validation after every epoch: the dp replicas
    // share the data and sum the losses.
    replicas_t dp = {g.coord[DIM_DP], g.size[DIM_DP], g.group[DIM_DP], true};
    trainer_t tr = trainer_make(o, &corpus, &dist, dp, tp_mesh_text(&g));
    train(&model, &initial, &g, &corpus, o, &tr);

    // --- Report: test perplexity; samples and the saved model, whole, from
    // the ranks of replica 0 (they compute together; rank 0 prints and saves).
    double test_loss = evaluate(&model, &tr, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    gpt_t whole;
    if (g.coord[DIM_DP] == 0) run_print_samples(corpus.tokenizer, o, samples_from_model, &model);
    if (gather_whole(&model, &g, false, &whole)) {
        run_save_and_report(&whole, corpus.tokenizer, o, tr.csv.path);
        gpt_free(&whole);
    }

    trainer_free(&tr);
    run_free_corpus(&corpus);
    model_free(&model);
    groups_free(&g);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    options o = parse_options(argc, argv);
    if (o.generate) return run_generate_only(CHAPTER, &o);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --dp M --tp N spawns M x N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || options_ranks(&o) == 1) return run_rank(0, 1, &o);
    return spawn(options_ranks(&o), run_rank, &o);
}
