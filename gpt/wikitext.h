// wikitext.h - the WikiText-2 data for the GPT chapter: find it, check it,
// mark the articles, and encode it once into a cache of token ids.
//
// WikiText-2 (Merity et al., 2016; CC BY-SA 3.0, text from Wikipedia) is
// three files, train.txt, valid.txt and test.txt, of already tokenized
// English (words and punctuation separated by spaces, rare words replaced
// by <unk>). The course reads them from a folder found in this order:
//   1. the --data_dir flag (passed in by the program),
//   2. the environment variable WIKITEXT_DIR,
//   3. <project root>/../shared/data/wikitext-2, then <project root>/data/wikitext-2
//      (where `make data`, i.e. tools/get_wikitext.sh, downloads it).
// Every file is checked against the published SHA-256, so a training run
// never silently uses a truncated or different copy.
//
// Articles start with a level-1 heading line " = Title = " between two blank
// lines; sections (" = = Section = = ") are not articles. The encoder puts
// the "<|endoftext|>" token before each article (before the blank line
// that precedes its heading), so the model sees where documents begin.
//
// Encoding the 10.8 MB training split takes a few seconds, so the tokens are
// cached in a binary file. The file names the tokenizer (its fingerprint)
// and the text (its SHA-256) it was made from, and a checksum of its own
// tokens: a cache that does not match is rebuilt, never trusted.
#ifndef COURSE_WIKITEXT_H
#define COURSE_WIKITEXT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bpe.h"
#include "check.h"
#include "files.h"
#include "sha256.h"

// Sizes and SHA-256 of wikitext-2-v1 (wiki.{train,valid,test}.tokens), as
// published in shared/data/SOURCES.md; the same bytes as the copies in the
// pytorch/examples repository (word_language_model/data/wikitext-2/).
typedef struct { const char *split; size_t bytes; const char *sha256; } wikitext_file_info;

static const wikitext_file_info wikitext_files[3] = {
    {"train", 10797148, "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"},
    {"valid", 1121681, "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"},
    {"test", 1256449, "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"},
};

typedef struct {
    char dir[1024];  // the folder holding train.txt, valid.txt, test.txt
    char root[1024]; // the project root, for "run make data there" in messages
} wikitext_t;

static inline const wikitext_file_info *wikitext_info(const char *split) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(split, wikitext_files[i].split)) return &wikitext_files[i];
    die("unknown WikiText-2 split '%s' (use train, valid or test)", split);
}

static inline bool wikitext_has_train(const char *dir) {
    char path[1100];
    return bpe_format(path, sizeof path, "%s/train.txt", dir) && access(path, R_OK) == 0;
}

__attribute__((noreturn))
static inline void wikitext_die_damaged(const wikitext_t *w, const char *path, const char *what) {
    die("WikiText-2 file %s %s: delete it and run `make data` in %s, or set WIKITEXT_DIR to a folder with "
        "good copies of train.txt, valid.txt and test.txt (sha256 in gpt/wikitext.h)",
        path, what, w->root);
}

// Size and SHA-256 of one file, read in pieces (no need to hold it).
static inline void wikitext_verify_file(const wikitext_t *w, const wikitext_file_info *info) {
    char path[1100], why[256], hex[SHA256_HEX_BYTES];
    bpe_format(path, sizeof path, "%s/%s.txt", w->dir, info->split); // fits: dir has at most 1023 bytes
    FILE *f = fopen(path, "rb");
    if (!f) bpe_fail(why, sizeof why, "cannot be opened (%s)", strerror(errno)), wikitext_die_damaged(w, path, why);
    sha256_ctx c;
    sha256_init(&c);
    size_t n, buf_size = 1 << 16;
    char *buf = xmalloc(buf_size);
    while ((n = fread(buf, 1, buf_size, f)) > 0) sha256_update(&c, buf, n);
    bool read_error = ferror(f);
    fclose(f);
    free(buf);
    if (read_error) wikitext_die_damaged(w, path, "could not be read");
    if (c.total_bytes != info->bytes) {
        bpe_fail(why, sizeof why, "has %llu bytes, not %zu", (unsigned long long)c.total_bytes, info->bytes);
        wikitext_die_damaged(w, path, why);
    }
    uint8_t digest[SHA256_DIGEST_BYTES];
    sha256_final(&c, digest);
    sha256_to_hex(digest, hex);
    if (strcmp(hex, info->sha256)) {
        bpe_fail(why, sizeof why, "has sha256 %.16s..., not the published %.16s...", hex, info->sha256);
        wikitext_die_damaged(w, path, why);
    }
}

// Find the data folder (see the top of this file) and verify the three
// files. data_dir_flag and project_root may be NULL (root: found from the
// executable's path, files.h). Dies with a one-line "how to get it" when missing or damaged.
static inline wikitext_t wikitext_find(const char *data_dir_flag, const char *project_root) {
    wikitext_t w = {0};
    if (!project_root) project_root = files_course_root();
    if (!bpe_format(w.root, sizeof w.root, "%s", project_root)) die("project root path too long: %s", project_root);
    const char *env = getenv("WIKITEXT_DIR");
    char tried[2][1024];
    int count = 0;
    bool fits = true;
    const char *origin = "";
    if (data_dir_flag && data_dir_flag[0])
        fits = bpe_format(tried[count++], 1024, "%s", data_dir_flag), origin = " (from --data_dir)";
    else if (env && env[0])
        fits = bpe_format(tried[count++], 1024, "%s", env), origin = " (from WIKITEXT_DIR)";
    else {
        fits = bpe_format(tried[count++], 1024, "%s/../shared/data/wikitext-2", w.root);
        fits = fits && bpe_format(tried[count++], 1024, "%s/data/wikitext-2", w.root);
    }
    if (!fits) die("WikiText-2 folder path too long (at most 1023 bytes): %s%s", tried[0], origin);
    for (int i = 0; i < count && !w.dir[0]; i++)
        if (wikitext_has_train(tried[i])) memcpy(w.dir, tried[i], sizeof w.dir);
    if (!w.dir[0])
        die("WikiText-2 not found: no train.txt in %s%s%s%s. Get it with `make data` in %s (downloads into "
            "%s/data/wikitext-2), or set WIKITEXT_DIR=/path/to/wikitext-2 (a folder with train.txt, valid.txt, test.txt)",
            tried[0], count > 1 ? " or " : "", count > 1 ? tried[1] : "", origin, w.root, w.root);
    for (int i = 0; i < 3; i++) wikitext_verify_file(&w, &wikitext_files[i]);
    return w;
}

// The text of one split ("train", "valid", "test"), malloc'd and
// NUL-terminated; with verify_sha256 its checksum is checked again.
static inline char *wikitext_read_split(const wikitext_t *w, const char *split, size_t *len, bool verify_sha256) {
    const wikitext_file_info *info = wikitext_info(split);
    char path[1100], reason[256] = "";
    bpe_format(path, sizeof path, "%s/%s.txt", w->dir, info->split); // fits: dir has at most 1023 bytes
    char *text = bpe_read_file(path, len, reason, sizeof reason);
    if (!text) wikitext_die_damaged(w, path, reason);
    if (verify_sha256) {
        uint8_t digest[SHA256_DIGEST_BYTES];
        char hex[SHA256_HEX_BYTES];
        sha256(text, *len, digest);
        sha256_to_hex(digest, hex);
        if (strcmp(hex, info->sha256)) wikitext_die_damaged(w, path, "does not have the published sha256");
    }
    return text;
}

// ---------------------------------------------------------------- articles

static inline size_t wikitext_line_end(const char *text, size_t len, size_t pos) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    return nl ? (size_t)(nl - text) : len;
}

static inline bool wikitext_is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

// " = Title = ": one '=' on each side (" = = Section = = " is level 2).
static inline bool wikitext_is_title(const char *s, size_t n) {
    return n >= 7 && !memcmp(s, " = ", 3) && s[3] != '=' && !memcmp(s + n - 3, " = ", 3) && s[n - 4] != '=';
}

// If the line starting at line_start is an article heading (between blank
// lines, or the start/end of the text), where its article starts: at the
// blank line before it. Else (size_t)-1. prev_start: start of the line before.
static inline size_t wikitext_article_start(const char *text, size_t len, size_t line_start, size_t prev_start) {
    size_t end = wikitext_line_end(text, len, line_start);
    if (!wikitext_is_title(text + line_start, end - line_start)) return (size_t)-1;
    if (line_start > 0 && !wikitext_is_blank(text + prev_start, line_start - 1 - prev_start)) return (size_t)-1;
    if (end < len && !wikitext_is_blank(text + end + 1, wikitext_line_end(text, len, end + 1) - end - 1))
        return (size_t)-1;
    return line_start > 0 ? prev_start : 0;
}

// Encode a WikiText split, with "<|endoftext|>" before each article.
// Appends to out; returns the number of articles found.
static inline size_t wikitext_encode_text(const bpe_t *t, const char *text, size_t len, bpe_ids_t *out) {
    bpe_cache_t cache = {0};
    size_t articles = 0, done = 0, prev = 0;
    for (size_t line = 0; line < len;) {
        size_t start = wikitext_article_start(text, len, line, prev);
        if (start != (size_t)-1) {
            bpe_encode_append(t, &cache, text + done, start - done, out);
            bpe_ids_push(out, (uint16_t)bpe_eot_id(t));
            done = start;
            articles++;
        }
        prev = line;
        line = wikitext_line_end(text, len, line) + 1;
    }
    bpe_encode_append(t, &cache, text + done, len - done, out);
    bpe_cache_free(&cache);
    return articles;
}

// ---------------------------------------------------------------- token cache
//
// Layout (all numbers little-endian), WIKITEXT_CACHE_HEADER bytes of header:
//   0  magic "WT2TOKNS"          8  u32 version        12 u32 header bytes
//   16 u64 tokenizer fingerprint 24 u64 text bytes     32 32-byte text sha256
//   64 u64 token count           72 32-byte sha256 of the token bytes
//   104 u32 vocabulary size      108 u32 zero
// then the tokens, u16 each.

#define WIKITEXT_CACHE_MAGIC "WT2TOKNS"
#define WIKITEXT_CACHE_VERSION 1 // bump when the article rule changes
#define WIKITEXT_CACHE_HEADER 112

static inline void wikitext_put_le(uint8_t *p, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(x >> (8 * i));
}

static inline uint64_t wikitext_get_le(const uint8_t *p, int bytes) {
    uint64_t x = 0;
    for (int i = bytes - 1; i >= 0; i--) x = x << 8 | p[i];
    return x;
}

typedef struct {
    bool from_cache; // the tokens came from the cache file
    char note[320];  // why the cache was not used (or could not be written), "" if it was
} wikitext_cache_result;

// What a cache file must say to be used for this tokenizer and text.
typedef struct { uint64_t fingerprint; size_t text_len; const uint8_t *text_sha; int vocab_size; } wikitext_cache_key;

// The tokens of a valid cache file, or NULL with the reason in note.
static inline uint16_t *wikitext_cache_read(const char *path, wikitext_cache_key key, size_t *count, char *note, size_t note_len) {
    size_t len;
    char reason[256];
    if (access(path, F_OK) != 0) return bpe_fail(note, note_len, "no cache yet"), NULL;
    uint8_t *data = (uint8_t *)bpe_read_file(path, &len, reason, sizeof reason);
    if (!data) return bpe_fail(note, note_len, "cache %s unreadable (%s)", path, reason), NULL;
    const char *bad = NULL;
    uint64_t n = len >= WIKITEXT_CACHE_HEADER ? wikitext_get_le(data + 64, 8) : 0;
    uint8_t digest[SHA256_DIGEST_BYTES] = {0};
    if (len >= WIKITEXT_CACHE_HEADER && n == (len - WIKITEXT_CACHE_HEADER) / 2)
        sha256(data + WIKITEXT_CACHE_HEADER, 2 * n, digest);
    if (len < WIKITEXT_CACHE_HEADER || memcmp(data, WIKITEXT_CACHE_MAGIC, 8)) bad = "is not a token cache";
    else if (wikitext_get_le(data + 8, 4) != WIKITEXT_CACHE_VERSION) bad = "has another format version";
    else if (wikitext_get_le(data + 16, 8) != key.fingerprint || wikitext_get_le(data + 104, 4) != (uint64_t)key.vocab_size)
        bad = "was made with another tokenizer";
    else if (wikitext_get_le(data + 24, 8) != key.text_len || memcmp(data + 32, key.text_sha, 32))
        bad = "was made from other text";
    else if (n != (len - WIKITEXT_CACHE_HEADER) / 2 || (len - WIKITEXT_CACHE_HEADER) % 2) bad = "is truncated";
    else if (memcmp(digest, data + 72, 32))
        bad = "is damaged (its checksum does not match)";
    uint16_t *ids = NULL;
    for (uint64_t i = 0; !bad && i < n; i++) {
        if (!ids) ids = xmalloc((n ? n : 1) * sizeof *ids);
        ids[i] = (uint16_t)wikitext_get_le(data + WIKITEXT_CACHE_HEADER + 2 * i, 2);
        if (ids[i] >= key.vocab_size) bad = "holds ids outside the vocabulary";
    }
    if (!bad && !ids) ids = xmalloc(sizeof *ids);
    free(data);
    if (bad) return free(ids), bpe_fail(note, note_len, "cache %s %s", path, bad), NULL;
    *count = (size_t)n;
    return ids;
}

static inline bool wikitext_cache_write(const char *path, wikitext_cache_key key, const uint16_t *ids, size_t count,
                                        char *err, size_t errlen) {
    size_t size = WIKITEXT_CACHE_HEADER + 2 * count;
    uint8_t *data = xcalloc(size, 1);
    memcpy(data, WIKITEXT_CACHE_MAGIC, 8);
    wikitext_put_le(data + 8, WIKITEXT_CACHE_VERSION, 4);
    wikitext_put_le(data + 12, WIKITEXT_CACHE_HEADER, 4);
    wikitext_put_le(data + 16, key.fingerprint, 8);
    wikitext_put_le(data + 24, key.text_len, 8);
    memcpy(data + 32, key.text_sha, 32);
    wikitext_put_le(data + 64, count, 8);
    for (size_t i = 0; i < count; i++) wikitext_put_le(data + WIKITEXT_CACHE_HEADER + 2 * i, ids[i], 2);
    sha256(data + WIKITEXT_CACHE_HEADER, 2 * count, data + 72);
    wikitext_put_le(data + 104, (uint64_t)key.vocab_size, 4);
    char dir[1024];
    bool ok = bpe_format(dir, sizeof dir, "%s", path);
    if (!ok) bpe_fail(err, errlen, "cache path too long: %s", path);
    char *slash = strrchr(dir, '/');
    if (ok && slash && slash != dir) {
        *slash = '\0';
        if (!files_make_dirs(dir)) ok = bpe_fail(err, errlen, "cannot create folder %s: %s", dir, strerror(errno));
    }
    ok = ok && files_write_atomic(path, data, size, err, errlen);
    free(data);
    return ok;
}

// Tokens of a WikiText text (with article boundaries), from the cache file
// at cache_path when it matches this tokenizer and text, else encoded and
// written there. cache_path NULL: no cache. res may be NULL.
static inline uint16_t *wikitext_encode_cached_sha(const bpe_t *t, const char *text, size_t len,
                                                   const uint8_t text_sha[SHA256_DIGEST_BYTES], const char *cache_path,
                                                   size_t *count, wikitext_cache_result *res) {
    wikitext_cache_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    wikitext_cache_key key = {bpe_fingerprint(t), len, text_sha, bpe_vocab_size(t)};
    if (!cache_path) bpe_fail(res->note, sizeof res->note, "no cache asked for");
    uint16_t *ids = cache_path ? wikitext_cache_read(cache_path, key, count, res->note, sizeof res->note) : NULL;
    if (ids) return res->from_cache = true, ids;
    bpe_ids_t out = {0};
    wikitext_encode_text(t, text, len, &out);
    char err[256];
    if (cache_path && !wikitext_cache_write(cache_path, key, out.ids, out.count, err, sizeof err))
        bpe_fail(res->note, sizeof res->note, "could not write the token cache: %s", err);
    *count = out.count;
    return out.ids ? out.ids : xmalloc(sizeof *out.ids);
}

static inline uint16_t *wikitext_encode_cached(const bpe_t *t, const char *text, size_t len, const char *cache_path,
                                               size_t *count, wikitext_cache_result *res) {
    uint8_t text_sha[SHA256_DIGEST_BYTES];
    sha256(text, len, text_sha);
    return wikitext_encode_cached_sha(t, text, len, text_sha, cache_path, count, res);
}

// Tokens of one split, from <cache_dir>/wikitext-2.<split>.<fingerprint>.tokens
// when valid (cache_dir NULL: no cache). Verifies the text's sha256 on the way
// and says on stderr (rank 0 only) where the tokens came from.
static inline uint16_t *wikitext_tokens(const wikitext_t *w, const char *split, const bpe_t *t, const char *cache_dir,
                                        size_t *count) {
    const wikitext_file_info *info = wikitext_info(split);
    size_t len;
    char *text = wikitext_read_split(w, split, &len, false);
    uint8_t text_sha[SHA256_DIGEST_BYTES]; // one hash both checks the file and keys the cache
    char hex[SHA256_HEX_BYTES], path[1200];
    sha256(text, len, text_sha);
    sha256_to_hex(text_sha, hex);
    if (strcmp(hex, info->sha256)) {
        bpe_format(path, sizeof path, "%s/%s.txt", w->dir, info->split);
        wikitext_die_damaged(w, path, "does not have the published sha256");
    }
    if (cache_dir && !bpe_format(path, sizeof path, "%s/wikitext-2.%s.%016llx.tokens", cache_dir, info->split,
                                 (unsigned long long)bpe_fingerprint(t)))
        die("cache folder path too long: %s", cache_dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    wikitext_cache_result res;
    uint16_t *ids = wikitext_encode_cached_sha(t, text, len, text_sha, cache_dir ? path : NULL, count, &res);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (course_rank <= 0) {
        if (res.from_cache) fprintf(stderr, "wikitext: %s: %zu tokens from %s\n", split, *count, path);
        else fprintf(stderr, "wikitext: %s: encoded %zu bytes into %zu tokens in %.2f s (%s)\n", split, len, *count,
                     secs, res.note);
    }
    free(text);
    return ids;
}

#endif
