// 12_context_parallel.c - Chapter 12: context parallelism, combined with data parallelism.
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
// with one more idea: each SEQUENCE is split over --cp ranks. A long
// context's activations do not fit one device: every layer keeps some per
// token, and attention keeps T x T. Each rank of a cp group holds T/cp of
// the tokens of every sequence (at their global positions) and computes
// the embeddings, LayerNorms, MLP and loss of those only; attention, where
// tokens meet, exchanges keys and values between the ranks:
//   a. --dp M --cp N: a mesh of M x N ranks (common/groups.h); the cp ranks
//      of a replica read the same batch and each keeps its own tokens;
//   b. every rank holds the whole model; the model computes its tokens and
//      calls back to the cp group inside attention (model_context_parallel;
//      gpt/context_parallel.h): --cp_attention ring passes key/value blocks
//      around the ring and merges partial results by their log-sum-exps,
//      ulysses swaps sequence for heads with all-to-alls; --cp_balance
//      zigzag gives rank r chunks r and 2N-1-r so the causal mask leaves
//      every rank the same work (none: chunk r, to see the difference);
//   c. the loss is the mean over the cp group; the gradients are averaged
//      over dp and cp together (groups_join): every weight is replicated;
//   d. snapshots and the saved model are 08's, whole: a run resumes with
//      another --cp, chapter 08 samples from the saved model;
//   e. cp_report.h prints what a rank holds, sends and computes, beside the formulas.
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
#include "groups.h"
#include "launch_env.h"
#include "log.h"
#include "model.h"
#include "cp_report.h"
#include "nodes.h"
#include "options.h"
#include "run.h"
#include "snapshot_whole.h"
#include "spawn.h"
#include "threads.h"
#include "trainer.h"

#define CHAPTER "12_context_parallel"

// ===================================================================== options

// Every flag is gpt/options.h's: 08's, the mesh's --dp and --cp, and how
// attention crosses the cp ranks.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2, each sequence split over --cp ranks"};
    options_add_flags(&set, &o);
    options_add_mesh_flags(&set, &o, "dp cp");
    flag_choice(&set, "cp_attention", &o.cp_attention, "ring|ulysses", "ring: key/value blocks passed around the cp ranks; ulysses: all-to-alls swap tokens for heads");
    flag_choice(&set, "cp_balance", &o.cp_balance, "zigzag|none", "zigzag: rank r holds chunks r and 2cp-1-r of each sequence, equal work under the causal mask; none: chunk r");
    flags_parse(&set, argc, argv);
    options_finish(&o, &set);
    cp_refuse(&set, &o); // what does not divide, and 08's flags that cannot work here (cp_report.h)
    return o;
}

// ===================================================================== training

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// dp and cp, then clip and AdamW. The losses are not read here: on a GPU
// that would make the host wait for every step, and the progress line
// reads them (model_take_train_loss) every --log_every steps instead.
static void train_step(model_t *m, trainer_t *tr, const options *o, int step, pg_t *dp_cp) {
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
        // The whole batch: the model keeps this rank's tokens of each sequence.
        model_train_forward(m, batch->inputs, batch->targets, o->batch_size, o->block_size);
        // The mean over micro-batches; on the last one, a GPU starts
        // averaging each bucket of gradients as soon as it is computed.
        bool last = micro == o->grad_accum - 1;
        model_backward(m, 1.0f / (float)o->grad_accum, last ? dp_cp : NULL);
    }
    // Every weight is replicated over dp AND cp: each cp rank has the
    // gradient of its tokens' loss (their keys' and values' share returned
    // to it by attention's backward pass), so their average over both is
    // one process's gradient of the whole batch's mean loss.
    model_average_gradients(m, dp_cp);
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

static void train(model_t *m, const corpus_t *c, const options *o, trainer_t *tr, groups_t *g, pg_t *dp_cp) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, NULL);
    int step = 0;
    int first_epoch = resume(m, o, tr->dist, &step), first_step = step;
    cp_counts sent = {0}; // what attention sent and computed in the training steps (cp_report.h)
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
            cp_counts before = cp_counts_now(m);
            train_step(m, tr, o, step, dp_cp);
            cp_counts_add(&sent, before, cp_counts_now(m));
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
    // And context parallelism's: memory, traffic and balance beside the formulas.
    report_context_parallel(m, g, o, &sent, steps_run);
}

// ===================================================================== main

// What every rank runs: one process, a rank spawned by --dp x --cp, or a
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
    // The mesh: a cp group holds the tokens of one replica's sequences.
    groups_t g;
    groups_init(&g, &dist, (int[DIMS]){[DIM_PP] = 1, [DIM_DP] = o->dp, [DIM_EP] = 1, [DIM_CP] = o->cp, [DIM_TP] = 1});
    groups_report(&g); // rank -> (dp, cp) -> device
    pg_t *dp_cp = groups_join(&g, "dp cp"); // the ranks that average their gradients

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
    // Each rank computes its tokens of every sequence; attention asks the cp group.
    model_context_parallel(&model, g.group[DIM_CP], o->cp_attention, o->cp_balance);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s; each rank "
             "computes %d of the %d tokens of every sequence (%s attention, %s)\n", model.host.num_params,
             cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, model_precision(&model),
             cfg.block_size / g.size[DIM_CP], cfg.block_size, o->cp_attention, o->cp_balance);
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);

    // --- Training, with validation after every epoch: the dp replicas
    // share the data and sum the losses (each already the mean over its cp group).
    replicas_t dp = {g.coord[DIM_DP], g.size[DIM_DP], g.group[DIM_DP], true};
    trainer_t tr = trainer_make(o, &corpus, &dist, dp, cp_mesh_text(&g, o));
    train(&model, &corpus, o, &tr, &g, dp_cp);

    // --- Report: test perplexity, samples (the cp ranks of replica 0
    // compute them together), the saved model (rank 0: it holds all of it).
    double test_loss = evaluate(&model, &tr, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (g.coord[DIM_DP] == 0) run_print_samples(corpus.tokenizer, o, samples_from_model, &model);
    if (dist.rank == 0) {
        model_to_host(&model); // the parameters, back from the device
        run_save_and_report(&model.host, corpus.tokenizer, o, tr.csv.path);
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
    // Otherwise --dp M --cp N spawns M x N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || options_ranks(&o) == 1) return run_rank(0, 1, &o);
    return spawn(options_ranks(&o), run_rank, &o);
}
