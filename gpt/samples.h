// samples.h - what a trained GPT of chapters 08-11 leaves behind: a few
// continuations of a prompt, printed, and two files in the run's folder,
// model.safetensors (the weights, in chapter 08's layout whatever layout
// trained them) and tokenizer.json (what gives the token ids meaning).
// `--generate` reads those two back and samples again, without data.
//
//   samples_print(tokenizer, &how, samples_from_model, &model);
//   run_save(&model.host, tokenizer, out_dir);
//   bpe_t *t = run_load(out_dir, CHAPTER, &loaded, path, sizeof path);
#ifndef GPT_SAMPLES_H
#define GPT_SAMPLES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpe.h"
#include "log.h"
#include "model.h"
#include "rng.h"

typedef struct {
    const char *prompt;      // the text every sample continues ("" starts a new document)
    int num_samples, sample_tokens;
    double temperature;      // 0: always the most likely token
    int top_k;               // sample among the k most likely (0: all)
    int seed;                // the same seed gives the same text
} samples_opts_t;

// Extends tokens[len, total) from tokens[0, len). One model samples with
// samples_from_model; chapter 11's pipeline passes its own (every stage
// takes part in every token).
typedef void (*samples_generate_fn)(void *ctx, uint16_t *tokens, int len, int total, float temperature,
                                    int top_k, rng_t *rng);

static inline void samples_from_model(void *model, uint16_t *tokens, int len, int total, float temperature,
                                      int top_k, rng_t *rng) {
    model_generate(model, tokens, len, total, temperature, top_k, rng);
}

// Continuations of the prompt, printed by rank 0 (log_main).
static inline void samples_print(const bpe_t *t, const samples_opts_t *s, samples_generate_fn generate,
                                 void *ctx) {
    size_t prompt_len;
    uint16_t *prompt = bpe_encode(t, s->prompt, strlen(s->prompt), &prompt_len);
    if (prompt_len == 0) { // an empty prompt starts a new document
        free(prompt);
        prompt = xmalloc(sizeof(uint16_t));
        prompt[0] = (uint16_t)bpe_eot_id(t);
        prompt_len = 1;
    }
    int total = (int)prompt_len + s->sample_tokens;
    uint16_t *tokens = xmalloc(sizeof(uint16_t) * (size_t)total);
    rng_t rng = rng_seed((uint64_t)s->seed);
    for (int k = 0; k < s->num_samples; k++) {
        memcpy(tokens, prompt, sizeof(uint16_t) * prompt_len);
        generate(ctx, tokens, (int)prompt_len, total, (float)s->temperature, s->top_k, &rng);
        size_t len;
        char *text = bpe_decode(t, tokens, (size_t)total, &len);
        log_main("--- sample %d (temperature %g, top_k %d, seed %d) ---\n%.*s\n", k + 1, s->temperature,
                 s->top_k, s->seed, (int)len, text);
        free(text);
    }
    free(tokens);
    free(prompt);
}

// The two files of a run's folder.
static inline void run_paths(const char *out_dir, char *model, char *tokenizer, size_t size) {
    snprintf(model, size, "%s/model.safetensors", out_dir);
    snprintf(tokenizer, size, "%s/tokenizer.json", out_dir);
}

// The model as safetensors and, beside it, its tokenizer. `whole` is the
// whole model on the host (model_to_host first; chapter 10 gathers its
// shards into one).
static inline void run_save(const gpt_t *whole, const bpe_t *t, const char *out_dir) {
    char model[1100], tokenizer[1100], err[2048];
    run_paths(out_dir, model, tokenizer, sizeof model);
    if (!gpt_save_safetensors(whole, model, err, sizeof err)) die("saving the model: %s", err);
    if (!bpe_save_json(t, tokenizer, err, sizeof err)) die("saving the tokenizer: %s", err);
    log_main("saved: %s (%zu parameters) and %s\n", model, whole->num_params, tokenizer);
}

// --generate: the model and the tokenizer a run saved in out_dir, checked
// to belong together. Returns the tokenizer; *loaded gets the model and
// path (size bytes) the model file's name. A missing or damaged file ends
// the program with a line saying what to do.
static inline bpe_t *run_load(const char *out_dir, const char *chapter, gpt_t *loaded, char *path,
                              size_t size) {
    char model[1100], tokenizer[1100], err[2048];
    run_paths(out_dir, model, tokenizer, sizeof model);
    snprintf(path, size, "%s", model);
    if (access(model, R_OK) != 0)
        die("no trained model at %s: train one first (./%s --preset tiny), or point --out_dir at a run", model,
            chapter);
    if (!gpt_load_safetensors(loaded, model, err, sizeof err)) die("loading the model: %s", err);
    bpe_t *t = bpe_load_json(tokenizer, err, sizeof err);
    if (!t) die("loading the tokenizer: %s", err);
    if (bpe_vocab_size(t) != loaded->cfg.vocab_size)
        die("%s has %d tokens but the model %s expects %d: they are not from the same run", tokenizer,
            bpe_vocab_size(t), model, loaded->cfg.vocab_size);
    return t;
}

#endif
