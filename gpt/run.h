// run.h - the beginning and the end of a GPT chapter's run, the same in
// 08-14: where it computes, the data every rank needs, the final report
// (test perplexity, samples, the saved model and its checksum), and
// --generate, which samples from a saved model without training.
#ifndef GPT_RUN_H
#define GPT_RUN_H

#include <math.h>
#include <stdio.h>

#include "bpe.h"
#include "corpus.h"
#include "data_check.h"
#include "ddp.h"
#include "device.h"
#include "dist.h"
#include "launch_env.h"
#include "log.h"
#include "model.h"
#include "options.h"
#include "samples.h"
#include "snapshot.h"
#include "threads.h"

// The first line: where this run computes, and why. A GPU trains in bf16
// unless --precision says otherwise; the CPU always in fp32 (gpt/model.h).
static inline gpt_precision run_announce(const char *chapter, const options *o, const device_t *d) {
    log_main("%s: running on %s; why: %s\n", chapter, d->name, d->why);
    return model_precision_for(o->precision, d);
}

// The text, its tokenizer and the three splits as tokens (gpt/corpus.h).
// Rank 0 trains (or loads) the tokenizer and fills the token cache first;
// the others then read the cache instead of doing it again; every node
// checks that it has the same tokens.
static inline corpus_t run_load_corpus(const options *o, dist_t *d) {
    char cache_dir[1000]; // --out_dir has at most 900 bytes
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", o->out_dir);
    files_make_dirs_or_die(cache_dir);
    corpus_t corpus;
    if (d->rank == 0) corpus = corpus_load(o->data_dir, o->verify_data, o->vocab_size, cache_dir);
    pg_barrier(d->pg);
    if (d->rank != 0) corpus = corpus_load(o->data_dir, o->verify_data, o->vocab_size, cache_dir);
    data_check_across_nodes(d, bpe_fingerprint(corpus.tokenizer), corpus.split, corpus.count);
    return corpus;
}

static inline void run_free_corpus(corpus_t *c) {
    for (int s = 0; s < 3; s++) free(c->split[s]);
    bpe_free(c->tokenizer);
}

// Continuations of the prompt (gpt/samples.h) - the same seed gives the
// same text - made by `next` (samples_from_model: one model; chapter 11's
// goes through the pipeline).
static inline void run_print_samples(const bpe_t *t, const options *o, samples_generate_fn next, void *ctx) {
    samples_opts_t how = {o->prompt, o->num_samples, o->sample_tokens, o->temperature, o->top_k, o->seed};
    samples_print(t, &how, next, ctx);
}

// The end of a run, on the rank that holds the whole model: it saves the
// model with its tokenizer in --out_dir (which --generate and chapter 08
// read back) and prints the checksum the tests compare across layouts.
static inline void run_save_and_report(const gpt_t *whole, const bpe_t *t, const options *o, const char *csv_path) {
    run_save(whole, t, o->out_dir);
    double l2 = 0;
    for (size_t i = 0; i < whole->num_params; i++) l2 += (double)whole->params[i] * whole->params[i];
    log_main("final parameters checksum %016llx, l2 norm %.9g\n",
             (unsigned long long)checksum_bytes(whole->params, sizeof(gpt_real) * whole->num_params), sqrt(l2));
    log_main("metrics: %s (plot: gnuplot plots/08_gpt_loss.gp)\n", csv_path);
}

// --generate: no data, no training; the saved model and tokenizer only.
static inline int run_generate_only(const char *chapter, const options *o) {
    char path[1100];
    gpt_t loaded;
    bpe_t *t = run_load(o->out_dir, chapter, &loaded, path, sizeof path);
    device_t d = device_choose(o->device, launch_env_read().local_rank);
    gpt_precision precision = run_announce(chapter, o, &d);
    choose_threads();
    model_t m;
    model_create(&m, loaded, &d, precision, 1, loaded.cfg.block_size);
    log_main("model: %s: %zu parameters (block %d, %d layers, %d heads, %d channels, vocabulary %d), %s\n", path,
             m.host.num_params, m.host.cfg.block_size, m.host.cfg.n_layer, m.host.cfg.n_head, m.host.cfg.n_embd,
             m.host.cfg.vocab_size, model_precision(&m));
    run_print_samples(t, o, samples_from_model, &m);
    bpe_free(t);
    model_free(&m);
    return 0;
}

#endif
