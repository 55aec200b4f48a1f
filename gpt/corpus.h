// corpus.h - the text a GPT of chapters 08-11 trains on: WikiText-2 (or,
// with verification off, any folder with train.txt, valid.txt and
// test.txt), its BPE tokenizer and the three splits as token arrays.
//
// Each chapter's main program loads it the same way (rank 0 first, so that
// it alone trains the tokenizer and writes the caches; the others then read
// them):
//   corpus_t c = corpus_load(data_dir, verify, vocab_size, cache_dir);
//   ... c.tokenizer, c.split[0..2] (train, valid, test), c.count[0..2] ...
#ifndef GPT_CORPUS_H
#define GPT_CORPUS_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpe.h"
#include "files.h"
#include "log.h"
#include "sha256.h"
#include "timer.h"
#include "wikitext.h"

typedef struct {
    bpe_t *tokenizer;
    uint16_t *split[3]; // train, valid, test
    size_t count[3];
} corpus_t;

static const char *const corpus_split_names[3] = {"train", "valid", "test"};

// The tokenizer trained on this training text with this vocabulary size:
// from the cache when it was trained before, else trained now (a few
// seconds to a minute) and cached. The name carries the text's checksum,
// so another corpus never picks up this one's tokenizer.
static inline bpe_t *corpus_tokenizer(const char *text, size_t len, int vocab, const char *cache_dir) {
    uint8_t digest[SHA256_DIGEST_BYTES];
    char hex[SHA256_HEX_BYTES], path[1200], err[2048];
    sha256(text, len, digest);
    sha256_to_hex(digest, hex);
    snprintf(path, sizeof path, "%s/tokenizer-v%d-%.16s.json", cache_dir, vocab, hex);
    bpe_t *t = access(path, R_OK) == 0 ? bpe_load_json(path, err, sizeof err) : NULL;
    if (t) {
        log_main("tokenizer: %d tokens, loaded from %s\n", bpe_vocab_size(t), path);
        return t;
    }
    if (access(path, F_OK) == 0) log_main("tokenizer: cached file unusable (%s); training again\n", err);
    double start = now_seconds();
    t = bpe_train(text, len, vocab);
    log_main("tokenizer: trained %d tokens on %zu bytes in %.1f s\n", bpe_vocab_size(t), len, now_seconds() - start);
    if (!bpe_save_json(t, path, err, sizeof err)) log_main("tokenizer: not cached: %s\n", err);
    return t;
}

// Without verification the folder may hold any text corpus (tests use a
// small generated one); the token cache is then keyed by the text itself.
static inline uint16_t *corpus_encode_split(const wikitext_t *w, const char *split, const bpe_t *t, const char *cache_dir,
                                            bool verify, size_t *count) {
    if (verify) return wikitext_tokens(w, split, t, cache_dir, count);
    size_t len;
    char *text = wikitext_read_split(w, split, &len, false);
    char path[1200];
    snprintf(path, sizeof path, "%s/corpus.%s.%016llx.tokens", cache_dir, split,
             (unsigned long long)bpe_fingerprint(t));
    uint16_t *ids = wikitext_encode_cached(t, text, len, path, count, NULL);
    free(text);
    return ids;
}

static inline wikitext_t corpus_find(const char *data_dir, bool verify) {
    if (verify) return wikitext_find(data_dir, NULL);
    wikitext_t w;
    memset(&w, 0, sizeof w);
    if (!data_dir) die("--verify_data=false needs --data_dir (a folder with train.txt, valid.txt, test.txt)");
    snprintf(w.dir, sizeof w.dir, "%s", data_dir);
    snprintf(w.root, sizeof w.root, "%s", files_course_root());
    for (int s = 0; s < 3; s++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s.txt", w.dir, corpus_split_names[s]);
        if (access(path, R_OK) != 0)
            die("cannot read %s: %s (--data_dir needs train.txt, valid.txt and test.txt)", path, strerror(errno));
    }
    return w;
}

static inline corpus_t corpus_load(const char *data_dir, bool verify, int vocab_size, const char *cache_dir) {
    corpus_t c;
    memset(&c, 0, sizeof c);
    wikitext_t w = corpus_find(data_dir, verify);
    log_main("data: %s%s\n", w.dir, verify ? " (WikiText-2, sha256 verified)" : " (not verified)");
    size_t len;
    char *train_text = wikitext_read_split(&w, "train", &len, false);
    c.tokenizer = corpus_tokenizer(train_text, len, vocab_size, cache_dir);
    free(train_text);
    for (int s = 0; s < 3; s++)
        c.split[s] = corpus_encode_split(&w, corpus_split_names[s], c.tokenizer, cache_dir, verify, &c.count[s]);
    log_main("data: %zu train, %zu valid, %zu test tokens\n", c.count[0], c.count[1], c.count[2]);
    return c;
}

#endif
