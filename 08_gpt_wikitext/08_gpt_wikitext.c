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
// Read it top to bottom: options, the training step, the training loop,
// what every rank runs. The model itself, layer by layer, is in
// ../gpt/gpt.h; the GPT, its tokenizer, its data and what every GPT
// chapter's loop leans on without teaching it (the flags: options.h; the
// learning rate, progress and validation: trainer.h; the whole-model
// snapshot: snapshot_whole.h; the start and end of a run: run.h) live in
// ../gpt/, which chapters 09-14 share. Each of them is this file plus its
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
#include "launch_env.h"
#include "log.h"
#include "model.h"
#include "nodes.h"
#include "options.h"
#include "run.h"
#include "snapshot_whole.h"
#include "spawn.h"
#include "threads.h"
#include "trainer.h"

#define CHAPTER "08_gpt_wikitext"

// ===================================================================== options

// Every flag is gpt/options.h's: chapters 09-14 keep them and add their own.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2 and sample from it"};
    options_add_flags(&set, &o);
    flags_parse(&set, argc, argv);
    options_finish(&o, &set);
    return o;
}

// ===================================================================== training

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// the ranks, then clip and AdamW. The losses are not read here: on a GPU
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
        model_backward(m, 1.0f / (float)o->grad_accum, last ? tr->dist->pg : NULL);
    }
    // DDP: every rank ends with the same averaged gradient, so every rank
    // clips and steps the same way, and the replicas stay identical.
    model_average_gradients(m, tr->dist->pg);
    model_clip_grad_norm(m, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

// The resumable state, as in chapter 06 (gpt/snapshot_whole.h): written by
// rank 0 at the end of an epoch; at the start, rank 0 reads the newest and
// every rank takes its state (rule 1 of data parallelism: equal replicas
// from the start). Returns the epochs already done and sets *step.
static void save_snapshot(model_t *m, const options *o, int epochs_done, int step, int world) {
    model_to_host(m);
    snapshot_save_whole(&m->host, o, epochs_done, step, world, "", model_get_scaler(m));
}

static int resume(model_t *m, const options *o, dist_t *d, int *step) {
    gpt_scaler scaler;
    int epoch = snapshot_resume_whole(&m->host, o, d, step, &scaler);
    model_broadcast_state(m, d);
    model_set_scaler(m, scaler); // fp16: the loss scale to start from
    return epoch;
}

static void train(model_t *m, const corpus_t *c, const options *o, trainer_t *tr) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, NULL);
    int step = 0;
    int first_epoch = resume(m, o, tr->dist, &step), first_step = step;
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
        else if (save) model_to_host(m), run_save(&m->host, c->tokenizer, o->out_dir);
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
    gpt_precision precision = run_announce(CHAPTER, o, &dist.device);
    choose_threads();
    nodes_report(&dist); // one line per node: host, ranks, device, transport

    // --- Data: WikiText-2 and its tokenizer, the same tokens on every rank.
    corpus_t corpus = run_load_corpus(o, &dist);

    // --- Model: sized by the flags, vocabulary by the tokenizer; the same
    // seed gives every rank the same initial weights (and rank 0's are
    // broadcast anyway when training starts).
    gpt_config cfg = gpt_config_of(bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd);
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
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);

    // --- Training, with validation after every epoch: every rank a replica.
    trainer_t tr = trainer_make(o, &corpus, &dist, replicas_of_job(&dist), "");
    train(&model, &corpus, o, &tr);

    // --- Report: test perplexity, samples, the saved model (rank 0).
    double test_loss = evaluate(&model, &tr, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (dist.rank == 0) {
        run_print_samples(corpus.tokenizer, o, samples_from_model, &model);
        model_to_host(&model); // the parameters, back from the device
        run_save_and_report(&model.host, corpus.tokenizer, o, tr.csv.path);
    }

    trainer_free(&tr);
    run_free_corpus(&corpus);
    model_free(&model);
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
