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
//   3  and the parameters (FSDP's FULL_SHARD): each block's parameters
//      are all-gathered before its forward and its backward pass, then dropped.
// --replicate R shards inside groups of N/R consecutive ranks (a node's)
// and averages the slices over the R replicas (FSDP's HYBRID_SHARD). Each
// rank prints what it holds and sends per step beside the formulas
// (zero_report.h); the machinery of the slices is in ../gpt/zero.h (zero_devices.h:
// the CPU's and a GPU's); the model lets a caller provide each bucket's
// parameters and gradients (../gpt/gpt_layout.h, section 3).
//
// Read it top to bottom: options, the training step, the training loop,
// what every rank runs. The model itself, layer by layer, is in
// ../gpt/gpt.h; the GPT, its tokenizer, its data and what every GPT
// chapter's loop leans on without teaching it (the flags: options.h; the
// learning rate, progress and validation: trainer.h; the whole-model
// snapshot: snapshot_whole.h; the start and end of a run: run.h) live in
// ../gpt/, which chapters 08-14 share. This file is 08's plus sharding:
// `make diffs` shows 08 -> 09, and that diff is the chapter.
//
// Where it computes: on a GPU when there is one (gpt_cuda.cu: our kernels
// and cuBLAS, in bf16 mixed precision by default), else on the CPU
// (gpt.h); model.h hides the difference, and everything else - data,
// sampler, snapshots, samples, the printed lines - is the same on both.
//
// Data parallel as in chapters 04-06: --nprocs N spawns N ranks, or
// ddprun starts them; each trains on its share of every epoch's blocks
// (common/sampler.h). Snapshots are sharded too (zero_snapshot.h): with
// --snapshot_path every rank writes its own slices every --save_every
// epochs, and rank 0 then an index that makes the step complete. A run
// with another number of ranks reshards on load, and --consolidate writes
// the latest snapshot as one model file that 08's --generate loads.
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
#include "spawn.h"
#include "threads.h"
#include "trainer.h"
#include "zero.h"
#include "zero_devices.h"
#include "zero_report.h"
#include "zero_snapshot.h"

#define CHAPTER "09_zero_fsdp"

// ===================================================================== options

// Every flag is gpt/options.h's: 08's, and this chapter's three. Two of 08's
// act on the whole-model step that ZeRO replaces: they need --shard 0.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    o.shard = 3; // FSDP, unless --shard says otherwise
    flag_set set = {.program = CHAPTER,
                    .summary = "train a GPT language model on WikiText-2 and sample from it"};
    options_add_flags(&set, &o);
    flag_int(&set, "shard", &o.shard, 0, 3, "ZeRO stage: 0 DDP (chapter 08), 1 optimizer state, 2 and gradients, 3 and parameters (FSDP)");
    flag_int(&set, "replicate", &o.replicate, 1, 256, "hybrid sharding (FSDP's HYBRID_SHARD): R replicas, each sharding over N/R consecutive ranks");
    flag_bool(&set, "consolidate", &o.consolidate, "write the latest sharded snapshot (--snapshot_path) as one model in --out_dir; no training");
    flags_parse(&set, argc, argv);
    options_finish(&o, &set);
    if (o.consolidate && !o.snapshot_path)
        flags_fail(&set, "--consolidate needs --snapshot_path (the snapshots to consolidate)");
    int ranks = launch_env_read().launched ? launch_env_read().world_size : options_ranks(&o);
    if (o.replicate > 1 && o.shard == 0)
        flags_fail(&set, "--replicate %d needs --shard 1, 2 or 3: DDP (--shard 0) shards nothing", o.replicate);
    if (ranks % o.replicate) flags_fail(&set, "--replicate %d does not divide the job's %d ranks", o.replicate, ranks);
    if (o.shard > 0 && strcmp(o.grad_compress, "none"))
        flags_fail(&set, "--grad_compress %s needs --shard 0: it compresses DDP's all-reduce, and ZeRO reduce-scatters "
                   "the gradients instead", o.grad_compress);
    if (o.shard > 0 && !strcmp(o.precision, "fp16"))
        flags_fail(&set, "--precision fp16 needs --shard 0: its loss scale is unscaled, checked for overflow and "
                   "updated by the model's whole-model clip and AdamW, which ZeRO replaces by its own on slices "
                   "(use bf16 or fp32)");
    return o;
}

// ===================================================================== training

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// the ranks, then clip and AdamW: 08's step, with --shard 0. ZeRO's stages
// keep less on each rank, and so change what happens after the backward
// pass - or, for 2 and 3, during it. The losses are not read here: on a GPU
// that would make the host wait for every step, and the progress line
// reads them (model_take_train_loss) every --log_every steps instead.
static void train_step(model_t *m, zero_t *z, trainer_t *tr, const options *o, int step) {
    // On one GPU the same step - zero_grad, forward, backward, clip, AdamW -
    // can be ONE launch of a CUDA graph (trainer_graph_step, gpt/trainer.h).
    if (tr->graph) {
        trainer_graph_step(m, tr, o, step);
        return;
    }
    zero_begin_step(z); // ZeRO-2, 3: the gradient slices start from zero
    if (z->stage < 2) model_zero_grad(m);
    for (int micro = 0; micro < o->grad_accum; micro++) {
        // The next micro-batch of this rank's blocks, in order; with
        // --num_workers 1 a thread made it while the last step trained.
        const loader_batch_t *batch = loader_next(&tr->loader);
        model_train_forward(m, batch->inputs, batch->targets, o->batch_size, o->block_size);
        // The mean over micro-batches; on the last one, a GPU starts
        // averaging each bucket of gradients as soon as it is computed.
        // ZeRO-2 and 3 reduce-scatter each bucket in the model's bucket
        // hook instead (zero.h, section 4), on every micro-batch.
        bool last = micro == o->grad_accum - 1;
        z->first_micro = micro == 0;
        model_backward(m, 1.0f / (float)o->grad_accum, last && z->stage == 0 ? tr->dist->pg : NULL);
    }
    if (z->stage == 0) {
        // DDP: every rank ends with the same averaged gradient, so every rank
        // clips and steps the same way, and the replicas stay identical.
        model_average_gradients(m, tr->dist->pg);
        model_clip_grad_norm(m, (float)o->grad_clip);
        model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
    } else {
        // ZeRO-1: the whole gradient was computed on every rank; each keeps
        // the mean of its slices (ZeRO-2 and 3 did so during the backward pass).
        if (z->stage == 1) zero_reduce_scatter_gradients(z);
        // HYBRID_SHARD: those are the shard group's means; averaged over the R replicas too.
        zero_average_replicas(z);
        // The clipping needs the norm of the whole gradient: each rank's
        // slices' squares, added up. Then each rank runs AdamW on its
        // slices only: 1/N of the optimizer's work and state.
        float scale = zero_clip_scale(z, (float)o->grad_clip);
        zero_adamw(z, scale, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
        // ZeRO-1 and 2: the next forward pass needs all the parameters on
        // every rank: gather everyone's updated slices. ZeRO-3 gathers each
        // block when it computes, and keeps only the slices.
        if (z->stage < 3) zero_all_gather_params(z);
    }
    zero_end_step(z);
}

static void train(model_t *m, zero_t *z, const corpus_t *c, const options *o, trainer_t *tr) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, z->stage > 0 ? "ZeRO clips and steps its slices, outside the model's step" : NULL);
    int step = 0;
    bool resharded;
    int first_epoch = zero_snapshot_resume(z, o, &step, &resharded), first_step = step;
    // Shards of this run's own number of ranks, at once: a restart then
    // finds them without resharding (and --consolidate shows the same state).
    if (resharded) zero_snapshot_save(z, o, first_epoch, step);
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
            train_step(m, z, tr, o, step);
            tr->loss_count++;
            step++;
            tr->train_time += now_seconds() - t0;
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch);
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0; // every rank: its slices
        if (save && o->snapshot_path) zero_snapshot_save(z, o, epoch + 1, step);
        else if (save) zero_save_model(z, c->tokenizer, o->out_dir);
    }
    // What data parallelism cost in bytes: each rank's gradients, per step,
    // as they entered the all-reduce (a ring then sends 2(W-1)/W of that).
    int steps_run = step - first_step;
    if (z->stage == 0 && tr->dist->world_size > 1 && steps_run > 0)
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
    // broadcast anyway). The model keeps what the stage does not shard.
    gpt_config cfg = gpt_config_of(bpe_vocab_size(corpus.tokenizer), o->block_size, o->n_layer, o->n_head, o->n_embd);
    gpt_t initial;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    dist_broadcast_host(&dist, initial.params, initial.num_params, DTYPE_F32, 0);
    model_t model;
    model_create_keeping(&model, initial, &dist.device, precision, o->batch_size, o->block_size, zero_model_keeps(o->shard));
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels), %s\n",
             model.host.num_params, cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd,
             model_precision(&model));
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);
    // dp (left 0: every rank) as R replicas x N/R consecutive ranks that shard (torchtitan's dp_replicate x dp_shard)
    groups_t groups;
    groups_init(&groups, &dist, (int[DIMS]){[DIM_PP] = 1, [DIM_EP] = 1, [DIM_CP] = 1, [DIM_TP] = 1});
    pg_t *replicate, *shard;
    groups_split(&groups, DIM_DP, o->replicate, &replicate, &shard);
    zero_t zero; // this rank's slices of the rest (zero.h)
    zero_setup(&zero, o->shard, &dist, &model, o->grad_accum, zero_ops_for(&model), shard, replicate);

    // --- Training, with validation after every epoch: every rank a replica.
    trainer_t tr = trainer_make(o, &corpus, &dist, replicas_of_job(&dist), "");
    train(&model, &zero, &corpus, o, &tr);
    zero_report(&zero, o->grad_accum, o->out_dir); // what each rank held and sent, beside the formulas

    // --- Report: test perplexity, samples, the saved model (rank 0). ZeRO-3's
    // forward passes gather the blocks: every rank samples, rank 0 prints.
    double test_loss = evaluate(&model, &tr, corpus.split[2], corpus.count[2], o->batch_size, o->block_size);
    log_main("test: loss %.4f | perplexity %.2f over %zu tokens\n", test_loss, exp(test_loss), corpus.count[2]);
    if (dist.rank == 0 || zero.stage == 3) run_print_samples(corpus.tokenizer, o, samples_from_model, &model);
    zero_full_params(&zero); // the parameters, back from the device (ZeRO-3: gathered)
    double moments[2];
    zero_moment_norms(&zero, moments);
    if (dist.rank == 0) {
        log_main("final AdamW moments: l2 norm of m %.9g, of v %.9g\n", moments[0], moments[1]);
        run_save_and_report(&model.host, corpus.tokenizer, o, tr.csv.path);
    }

    zero_free(&zero);
    groups_free(&groups);
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
    if (o.consolidate) return zero_consolidate(&o, CHAPTER);
    // Started by a launcher, or one rank: this process is the rank.
    // Otherwise --nprocs N spawns N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || options_ranks(&o) == 1) return run_rank(0, 1, &o);
    return spawn(options_ranks(&o), run_rank, &o);
}
