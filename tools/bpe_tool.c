// bpe_tool - train, use and inspect the GPT chapter's BPE tokenizer from the shell.
//
//   bpe_tool train    --input FILE [--vocab_size 5000] --output tokenizer.json
//   bpe_tool encode   --tokenizer tokenizer.json --input FILE --output ids.u16
//   bpe_tool decode   --tokenizer tokenizer.json --input ids.u16 --output FILE
//   bpe_tool verify   [--data_dir DIR]      check the WikiText-2 files' sha256
//   bpe_tool wikitext [--data_dir DIR] [--tokenizer FILE] [--vocab_size N] [--cache_dir DIR]
//                     train (or load) a tokenizer and encode the three splits, with timings
//
// Token files (.u16) are raw little-endian uint16 ids. Every command prints
// what it did and how long it took (wall clock, one thread), so the tool is
// also the tokenizer's benchmark.
#include <time.h>

#include "check.h"
#include "flags.h"

#include "../gpt/bpe.h"
#include "../gpt/wikitext.h"

typedef struct {
    const char *input, *output, *tokenizer, *data_dir, *cache_dir;
    int vocab_size;
} options;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *need(const char *value, const char *flag, const char *command) {
    if (!value || !value[0]) {
        fprintf(stderr, "bpe_tool %s: error: --%s is required\n", command, flag);
        exit(EXIT_USAGE);
    }
    return value;
}

static char *read_or_die(const char *path, size_t *len) {
    char reason[256];
    char *data = bpe_read_file(path, len, reason, sizeof reason);
    if (!data) die("%s: %s", path, reason);
    return data;
}

static void write_or_die(const char *path, const void *data, size_t len) {
    char err[512];
    if (!files_write_atomic(path, data, len, err, sizeof err)) die("%s", err);
}

static bpe_t *load_or_die(const char *path) {
    char err[512];
    bpe_t *t = bpe_load_json(path, err, sizeof err);
    if (!t) die("%s", err);
    return t;
}

static int cmd_train(const options *o) {
    size_t len;
    char *text = read_or_die(need(o->input, "input", "train"), &len);
    double t0 = now_seconds();
    bpe_t *t = bpe_train(text, len, o->vocab_size);
    double secs = now_seconds() - t0;
    char err[512];
    if (!bpe_save_json(t, need(o->output, "output", "train"), err, sizeof err)) die("%s", err);
    printf("trained %d tokens (%d merges) on %zu bytes in %.2f s; saved %s (fingerprint %016llx)\n",
           bpe_vocab_size(t), bpe_num_merges(t), len, secs, o->output, (unsigned long long)bpe_fingerprint(t));
    bpe_free(t), free(text);
    return 0;
}

static int cmd_encode(const options *o) {
    bpe_t *t = load_or_die(need(o->tokenizer, "tokenizer", "encode"));
    size_t len, count;
    char *text = read_or_die(need(o->input, "input", "encode"), &len);
    double t0 = now_seconds();
    uint16_t *ids = bpe_encode(t, text, len, &count);
    double secs = now_seconds() - t0;
    uint8_t *bytes = xmalloc(2 * count + 1);
    for (size_t i = 0; i < count; i++) bytes[2 * i] = (uint8_t)ids[i], bytes[2 * i + 1] = (uint8_t)(ids[i] >> 8);
    write_or_die(need(o->output, "output", "encode"), bytes, 2 * count);
    printf("encoded %zu bytes into %zu tokens (%.2f bytes/token) in %.3f s\n", len, count,
           count ? (double)len / (double)count : 0.0, secs);
    free(bytes), free(ids), free(text), bpe_free(t);
    return 0;
}

static int cmd_decode(const options *o) {
    bpe_t *t = load_or_die(need(o->tokenizer, "tokenizer", "decode"));
    size_t len, text_len;
    uint8_t *bytes = (uint8_t *)read_or_die(need(o->input, "input", "decode"), &len);
    if (len % 2) die("%s: %zu bytes is not a whole number of uint16 token ids", o->input, len);
    uint16_t *ids = xmalloc(len + 1);
    for (size_t i = 0; i < len / 2; i++) {
        ids[i] = (uint16_t)(bytes[2 * i] | bytes[2 * i + 1] << 8);
        if (ids[i] >= bpe_vocab_size(t))
            die("%s: token %zu has id %u, outside the vocabulary (%d tokens)", o->input, i, ids[i], bpe_vocab_size(t));
    }
    char *text = bpe_decode(t, ids, len / 2, &text_len);
    write_or_die(need(o->output, "output", "decode"), text, text_len);
    printf("decoded %zu tokens into %zu bytes\n", len / 2, text_len);
    free(text), free(ids), free(bytes), bpe_free(t);
    return 0;
}

static int cmd_verify(const options *o) {
    double t0 = now_seconds();
    wikitext_t w = wikitext_find(o->data_dir, NULL);
    printf("WikiText-2 in %s: train.txt, valid.txt and test.txt have the published sha256 (checked in %.2f s)\n",
           w.dir, now_seconds() - t0);
    return 0;
}

// The tokenizer for `wikitext`: loaded from --tokenizer if that file exists,
// else trained on the training split (and saved there if a path was given).
static bpe_t *wikitext_tokenizer(const options *o, const wikitext_t *w) {
    if (o->tokenizer && access(o->tokenizer, F_OK) == 0) {
        bpe_t *t = load_or_die(o->tokenizer);
        printf("loaded %s: %d tokens, %d merges\n", o->tokenizer, bpe_vocab_size(t), bpe_num_merges(t));
        return t;
    }
    size_t len;
    char *text = wikitext_read_split(w, "train", &len, false);
    double t0 = now_seconds();
    bpe_t *t = bpe_train(text, len, o->vocab_size);
    printf("trained %d tokens (%d merges) on train.txt (%zu bytes) in %.2f s\n", bpe_vocab_size(t),
           bpe_num_merges(t), len, now_seconds() - t0);
    free(text);
    char err[512];
    if (o->tokenizer && !bpe_save_json(t, o->tokenizer, err, sizeof err)) die("%s", err);
    return t;
}

static int cmd_wikitext(const options *o) {
    double t0 = now_seconds();
    wikitext_t w = wikitext_find(o->data_dir, NULL);
    printf("WikiText-2 in %s (sha256 checked in %.2f s)\n", w.dir, now_seconds() - t0);
    bpe_t *t = wikitext_tokenizer(o, &w);
    const char *splits[] = {"train", "valid", "test"};
    for (int i = 0; i < 3; i++) {
        size_t count;
        t0 = now_seconds();
        uint16_t *ids = wikitext_tokens(&w, splits[i], t, o->cache_dir && o->cache_dir[0] ? o->cache_dir : NULL, &count);
        size_t articles = 0;
        for (size_t k = 0; k < count; k++) articles += ids[k] == bpe_eot_id(t);
        printf("%-5s %9zu tokens, %4zu articles, %.2f s (read, check, encode or load)\n", splits[i], count, articles,
               now_seconds() - t0);
        free(ids);
    }
    bpe_free(t);
    return 0;
}

int main(int argc, char **argv) {
    options o = {.vocab_size = 5000, .cache_dir = ""};
    flag_set set = {.program = "bpe_tool COMMAND",
                    .summary = "the chapter 08 BPE tokenizer from the shell; COMMAND is one of "
                               "train, encode, decode, verify, wikitext (see the top of tools/bpe_tool.c)"};
    flag_string(&set, "input", &o.input, "file to read (text, or .u16 ids for decode)")->short_name = "i";
    flag_string(&set, "output", &o.output, "file to write (atomically)")->short_name = "o";
    flag_string(&set, "tokenizer", &o.tokenizer, "tokenizer.json to load (wikitext: to load or save)")->short_name = "t";
    flag_int(&set, "vocab_size", &o.vocab_size, 257, 65536, "tokens to learn, including 256 bytes and <|endoftext|>");
    flag_string(&set, "data_dir", &o.data_dir, "WikiText-2 folder; if unset, $WIKITEXT_DIR, then beside the project");
    flag_string(&set, "cache_dir", &o.cache_dir, "folder for encoded-token caches (empty: none)");
    const char *command = argc > 1 ? argv[1] : "";
    if (!strcmp(command, "--help") || !strcmp(command, "-h")) flags_parse(&set, argc, argv); // prints help, exits
    if (command[0] == '\0' || command[0] == '-') {
        fprintf(stderr, "bpe_tool: error: name a command first: train, encode, decode, verify or wikitext\n");
        flags_usage_line(&set, stderr);
        return EXIT_USAGE;
    }
    char program[64];
    snprintf(program, sizeof program, "bpe_tool %.40s", command); // so that flag errors name the command
    set.program = program;
    flags_parse(&set, argc - 1, argv + 1);
    if (!strcmp(command, "train")) return cmd_train(&o);
    if (!strcmp(command, "encode")) return cmd_encode(&o);
    if (!strcmp(command, "decode")) return cmd_decode(&o);
    if (!strcmp(command, "verify")) return cmd_verify(&o);
    if (!strcmp(command, "wikitext")) return cmd_wikitext(&o);
    fprintf(stderr, "bpe_tool: error: unknown command '%s' (train, encode, decode, verify, wikitext)\n", command);
    return EXIT_USAGE;
}
