// 13_expert_parallel.c - Chapter 13: a mixture of experts, its experts spread over ranks.
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
// with one more idea: each block's MLP becomes E expert MLPs and a router
// that sends every token to K of them (--n_expert E --moe_top_k K: a
// mixture of experts, as the Switch Transformer and GShard), and the
// experts are SPREAD over --ep ranks: each rank holds E/ep of every
// block's experts, and the tokens travel to their experts and back.
//   a. --dp M --ep N: a mesh of M x N ranks (common/groups.h), and EVERY
//      rank reads its own data: the experts are the only thing an ep
//      group shares, so its ranks are data-parallel for everything else;
//   b. every rank builds the whole model, as in 08, and keeps its experts
//      (gpt_init_expert_shard; gpt_layout.h, section 7); each MoE layer
//      (gpt/moe.h) counts where its tokens go, exchanges the counts
//      (all-to-all), sends the tokens (all-to-all with variable counts),
//      runs its experts, sends the results back and combines them; the
//      backward pass reverses both exchanges (model_expert_parallel);
//   c. the dense weights' gradients are averaged over all the ranks, each
//      expert's over its replicas (the dp group) - model.h says why the
//      sum is still divided by all the ranks;
//   d. --capacity_factor bounds the tokens an expert takes from each
//      rank's micro-batch; one process stands for N ranks with
//      --capacity_groups N (gpt/moe.h: the same tokens are dropped);
//   e. snapshots and the saved model hold the WHOLE model (gpt/gather_whole.h):
//      a run resumes with another --ep, --generate samples from it;
//   f. ep_report.h prints where the tokens went, what the all-to-alls
//      moved, what a rank holds, and the step's time, beside the formulas.
//
// Read it top to bottom: options, the training step, the training loop,
// what every rank runs. The model itself, layer by layer, is in
// ../gpt/gpt.h and the mixture in ../gpt/moe.h; the GPT, its tokenizer,
// its data and what every GPT
// chapter's loop leans on without teaching it (the flags: options.h; the
// learning rate, progress and validation: trainer.h; the whole-model
// snapshot: snapshot_whole.h; the start and end of a run: run.h) live in
// ../gpt/, which chapters 09-14 share. Each of them is 08's file plus its
// idea: `make diffs` shows how little else changes.
//
// Where it computes: CPU ranks, or GPUs (gpt/gpt_cuda_moe.cuh: the same
// layer's kernels, its exchanges on device buffers over NCCL).
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
#include "ep_report.h"
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
#include "trainer.h"

#define CHAPTER "13_expert_parallel"

// ===================================================================== options

// Every flag is gpt/options.h's: 08's, the mesh's --dp and --ep, and the mixture's.
static options parse_options(int argc, char **argv) {
    options o = options_defaults(CHAPTER);
    flag_set set = {.program = CHAPTER,
                    .summary = "train a mixture-of-experts GPT on WikiText-2, its experts spread over --ep ranks"};
    options_add_flags(&set, &o);
    options_add_mesh_flags(&set, &o, "dp ep");
    flag_int(&set, "n_expert", &o.n_expert, 0, 1024, "experts in each block's place of the MLP (0: the dense MLP)");
    flag_int(&set, "moe_top_k", &o.moe_top_k, 1, 1024, "experts each token goes to (--top_k is sampling's)");
    flag_double(&set, "capacity_factor", &o.capacity_factor, 0, 1000, "an expert takes at most f x its even share of a micro-batch's tokens (0: dropless)");
    flag_double(&set, "aux_loss_coef", &o.aux_loss_coef, 0, 100, "weight of the load-balancing loss E x sum f_i P_i");
    flag_int(&set, "capacity_groups", &o.capacity_groups, 1, 4096, "count capacity and balance over N groups of each micro-batch's sequences: one process standing for N ranks");
    flags_parse(&set, argc, argv);
    options_finish(&o, &set);
    if (o.ep > 1 && !o.n_expert) flags_fail(&set, "--ep %d spreads experts over ranks: give --n_expert", o.ep);
    gpt_config c = ep_config(&o, o.vocab_size, o.ep);
    const char *problem = gpt_config_problem(c);
    if (problem) flags_fail(&set, "--n_expert %d --moe_top_k %d --ep %d: %s", o.n_expert, o.moe_top_k, o.ep, problem);
    if (o.capacity_groups > o.batch_size)
        flags_fail(&set, "--capacity_groups %d: more groups than the %d sequences of a micro-batch", o.capacity_groups,
                   o.batch_size);
    ep_check_gpu(&set, &o); // what the GPU path does not do (ep_report.h)
    if (o.ep > 1 && !strcmp(o.grad_compress, "powersgd"))
        flags_fail(&set, "--grad_compress powersgd with --ep %d: PowerSGD factors the whole model's matrices, and the "
                   "experts' gradients are averaged over another group than the dense ones (bf16 and fp16 work)", o.ep);
    return o;
}

// ===================================================================== training

// One optimizer step: grad_accum micro-batches, the gradients averaged over
// the ranks (the experts' over their replicas), then clip and AdamW. The losses are not read here: on a GPU
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
    // DDP: every rank ends with the same averaged dense gradient, each
    // expert's replicas with the same expert gradient; the clipping norm
    // adds up the experts over ep (model.h, model_average_experts).
    model_average_gradients(m, tr->replicas.sum);
    model_clip_grad_norm(m, (float)o->grad_clip);
    model_adamw(m, learning_rate(tr, o, step), 0.9f, 0.95f, 1e-8f, (float)o->weight_decay);
}

// The resumable state, as in chapter 06 (gpt/snapshot_whole.h), WHOLE:
// written by rank 0 at the end of an epoch from replica 0's experts; at the
// start, rank 0 reads the newest into `whole` and every rank takes it
// (rule 1 of data parallelism: equal replicas from the start) and keeps
// its experts. Returns the epochs already done and sets *step.
static void save_snapshot(model_t *m, groups_t *g, const options *o, int epochs_done, int step) {
    gpt_t whole;
    if (!gather_whole(m, g, true, &whole)) return;
    snapshot_save_whole(&whole, o, epochs_done, step, g->world, ep_mesh_text(g), model_get_scaler(m));
    gpt_free(&whole);
}

static int resume(model_t *m, gpt_t *whole, const options *o, groups_t *g, int *step) {
    gpt_scaler scaler;
    int epoch = snapshot_resume_whole(whole, o, g->dist, step, &scaler);
    snapshot_broadcast_whole(whole, g->dist);
    take_experts(m, whole, g->coord[DIM_EP]);
    model_set_scaler(m, scaler); // fp16: the loss scale to start from
    return epoch;
}

static void train(model_t *m, gpt_t *whole, groups_t *g, const corpus_t *c, const options *o, trainer_t *tr) {
    trainer_announce(tr, o);
    trainer_choose_graph(tr, m, o, m->host.cfg.n_expert ? "a mixture of experts waits for its routing counts" : NULL);
    int step = 0;
    int first_epoch = resume(m, whole, o, g, &step), first_step = step;
    gpt_free(whole); // from here on, each rank holds its experts only
    if (m->host.cfg.n_expert) gpt_moe_stats_reset(&m->host);
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
            if (step % o->log_every == 0 || step == tr->total_steps) report_progress(m, tr, o, step, epoch),
                report_routing(m, tr->replicas.sum, &tr->dist->device, o, step); // where the tokens went (ep_report.h)
            validated = o->eval_every > 0 && step % o->eval_every == 0;
            if (validated) validate(m, tr, c, o, step, epoch);
        }
        if (!validated) validate(m, tr, c, o, step, epoch);
        // The ranks of replica 0 send their experts; rank 0 writes the whole model.
        bool save = o->save_every > 0 && (epoch + 1) % o->save_every == 0;
        gpt_t saved;
        if (save && o->snapshot_path) save_snapshot(m, g, o, epoch + 1, step);
        else if (save && gather_whole(m, g, false, &saved))
            run_save(&saved, c->tokenizer, o->out_dir), gpt_free(&saved);
    }
    // What data parallelism cost in bytes: each rank's gradients, per step,
    // as they entered the all-reduce (a ring then sends 2(W-1)/W of that).
    int steps_run = step - first_step;
    if (tr->dist->world_size > 1 && steps_run > 0)
        log_main("gradients all-reduced: %.0f bytes per step per rank (%s), %zu parameters\n",
                 (double)ddp_bytes_reduced() / steps_run, ddp_wire_name(m->grad_compress),
                 m->host.num_params);
    // And the mixture's: where the tokens went, what they cost (ep_report.h).
    report_experts(m, g, tr->replicas.sum, o, steps_run);
}

// ===================================================================== main

// What every rank runs: one process, a rank spawned by --dp x --ep, or a
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
    // The mesh: an ep group holds ONE model's experts, a dp group one set of them.
    groups_t g;
    groups_init(&g, &dist, (int[DIMS]){[DIM_PP] = 1, [DIM_DP] = o->dp, [DIM_EP] = o->ep, [DIM_CP] = 1, [DIM_TP] = 1});
    groups_report(&g); // rank -> (dp, ep) -> device
    pg_t *all = groups_join(&g, "dp ep"); // every rank: the dense weights' replicas

    // --- Data: WikiText-2 and its tokenizer, the same tokens on every rank.
    corpus_t corpus = run_load_corpus(o, &dist);

    // --- Model: sized by the flags, vocabulary by the tokenizer; the same
    // seed gives every rank the same WHOLE model, as in chapter 08 (and
    // rank 0's is broadcast anyway when training starts); each rank keeps
    // its experts, and the mixture's layers exchange tokens over ep.
    gpt_config cfg = ep_config(o, bpe_vocab_size(corpus.tokenizer), 1);
    gpt_t initial, shard;
    gpt_init(&initial, cfg, (uint64_t)o->seed);
    gpt_init_expert_shard(&shard, &initial, g.size[DIM_EP], g.coord[DIM_EP]);
    model_t model;
    model_create(&model, shard, &dist.device, precision, o->batch_size, o->block_size);
    model_expert_parallel(&model, g.group[DIM_EP], g.group[DIM_DP]);
    log_main("model: %zu parameters (vocabulary %d, block %d, %d layers, %d heads, %d channels, %d experts, top %d), "
             "%s; %zu on each rank (%d of the %d experts of every block)\n", initial.num_params, cfg.vocab_size,
             cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_expert, cfg.top_k, model_precision(&model),
             model.host.num_params, gpt_moe_local(&model.host.cfg), cfg.n_expert);
    // How the gradients travel (DDP's communication hook, common/ddp.h):
    // fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as
    // two thin ones of rank --powersgd_rank (common/powersgd.h).
    model_use_grad_compress(&model, o->grad_compress, o->powersgd_rank);

    // --- Training, with validation after every epoch: every rank reads its
    // own data (for the dense weights, every rank is a replica).
    replicas_t every = {pg_rank(all), pg_world_size(all), all, true};
    trainer_t tr = trainer_make(o, &corpus, &dist, every, ep_mesh_text(&g));
    train(&model, &initial, &g, &corpus, o, &tr);

    // --- Report: test perplexity; samples and the saved model, whole, from
    // the ranks of replica 0 (their experts answer together; rank 0 prints and saves).
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
    // Otherwise --dp M --ep N spawns M x N ranks (mp.spawn style, chapter 04).
    if (launch_env_read().launched || options_ranks(&o) == 1) return run_rank(0, 1, &o);
    return spawn(options_ranks(&o), run_rank, &o);
}
