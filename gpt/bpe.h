// bpe.h - a byte-level BPE tokenizer: train, encode, decode, save and load.
//
// A language model reads token ids, not text. Byte-pair encoding (BPE)
// starts from the 256 byte values as tokens and learns merges: "the pair
// of tokens that is most frequent in the training text becomes a new
// token", repeated until the vocabulary has the size asked for. Because
// every byte is a token, any input -- any language, binary junk, invalid
// UTF-8 -- encodes and decodes back to exactly the same bytes: there is
// no "unknown" token.
//
// The parts, in the order the file presents them:
//   1. growable arrays and two hash maps (byte strings, token pairs)
//   2. pre-splitting text into words, as GPT-2 does, so merges never
//      cross a word boundary
//   3. training with the incremental algorithm (pair counts in a max-heap,
//      an index pair -> words, so a merge touches only the words that
//      contain the pair)
//   4. encoding (a cache per distinct word; merges applied by rank) and
//      decoding
//   5. saving and loading in the layout of Hugging Face tokenizers'
//      tokenizer.json (read with the course's JSON reader, common/json.h)
//
// Token ids are uint16_t, so a vocabulary holds at most 65536 tokens.
// One special token, "<|endoftext|>", marks document boundaries; the
// encoder never produces it from text (wikitext.h inserts it).
#ifndef COURSE_BPE_H
#define COURSE_BPE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "json.h"
#include "sha256.h"

#define BPE_EOT "<|endoftext|>"
#define BPE_MAX_VOCAB 65536   // ids must fit in uint16_t
#define BPE_MAX_WORD 128      // longer runs of letters etc. are cut into pieces of this many bytes
#define BPE_PRESPLIT_RULE 1   // bump when bpe_next_word changes: old token caches become stale
#define BPE_MAX_FILE (512u << 20) // refuse tokenizer files larger than this

// ======================================================== 1. containers

// Write a one-line reason (cut if too long); returns false, so that checks
// read "return bpe_fail(reason, size, ...)".
__attribute__((format(printf, 3, 4)))
static inline bool bpe_fail(char *reason, size_t reason_len, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(reason, reason_len, fmt, args);
    va_end(args);
    return false;
}

// snprintf for paths: true if the whole text fit (a cut path is a wrong path).
__attribute__((format(printf, 3, 4)))
static inline bool bpe_format(char *out, size_t size, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(out, size, fmt, args);
    va_end(args);
    return n >= 0 && (size_t)n < size;
}

// Grow an array to hold at least `needed` elements, doubling, so that
// pushing n elements costs O(n) in total.
static inline void *bpe_grow(void *data, size_t *capacity, size_t needed, size_t elem_size) {
    if (needed <= *capacity) return data;
    size_t cap = *capacity ? *capacity : 16;
    while (cap < needed) cap *= 2;
    if (cap > SIZE_MAX / elem_size) die("bpe: array of %zu elements is too large", cap);
    void *p = realloc(data, cap * elem_size);
    if (!p) die("out of memory growing an array to %zu x %zu bytes", cap, elem_size);
    *capacity = cap;
    return p;
}

typedef struct { int32_t *data; size_t count, capacity; } bpe_i32vec;

static inline void bpe_i32vec_push(bpe_i32vec *v, int32_t x) {
    v->data = bpe_grow(v->data, &v->capacity, v->count + 1, sizeof *v->data);
    v->data[v->count++] = x;
}

// The encoder's output: a growable array of token ids.
typedef struct { uint16_t *ids; size_t count, capacity; } bpe_ids_t;

static inline void bpe_ids_push(bpe_ids_t *v, uint16_t id) {
    v->ids = bpe_grow(v->ids, &v->capacity, v->count + 1, sizeof *v->ids);
    v->ids[v->count++] = id;
}

// Byte strings -> int64 values. Entries are kept in insertion order (the
// table only holds their indices), which makes iteration deterministic.
typedef struct { size_t key_off; uint32_t key_len; uint64_t hash; int64_t value; } bpe_strmap_entry;
typedef struct {
    int32_t *slots;            // -1 = empty, else an index into entries
    size_t slot_count;         // a power of two, at least twice the entries
    bpe_strmap_entry *entries;
    size_t count, capacity;
    char *pool;                // the keys' bytes, back to back
    size_t pool_len, pool_cap;
} bpe_strmap;

static inline uint64_t bpe_hash_bytes(const void *data, size_t len) { // FNV-1a
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static inline void bpe_strmap_free(bpe_strmap *m) {
    free(m->slots), free(m->entries), free(m->pool);
    memset(m, 0, sizeof *m);
}

static inline void bpe_strmap_rehash(bpe_strmap *m, size_t slot_count) {
    free(m->slots);
    m->slots = xmalloc(slot_count * sizeof *m->slots);
    memset(m->slots, 0xff, slot_count * sizeof *m->slots); // all -1
    m->slot_count = slot_count;
    for (size_t e = 0; e < m->count; e++) {
        size_t s = m->entries[e].hash & (slot_count - 1);
        while (m->slots[s] >= 0) s = (s + 1) & (slot_count - 1);
        m->slots[s] = (int32_t)e;
    }
}

// The slot where key lives, or the empty slot where it would go.
static inline size_t bpe_strmap_slot(const bpe_strmap *m, const void *key, size_t len, uint64_t h) {
    size_t s = h & (m->slot_count - 1);
    for (;; s = (s + 1) & (m->slot_count - 1)) {
        int32_t e = m->slots[s];
        if (e < 0) return s;
        const bpe_strmap_entry *x = &m->entries[e];
        if (x->hash == h && x->key_len == len && !memcmp(m->pool + x->key_off, key, len)) return s;
    }
}

// Index of the entry for key, or -1.
static inline int64_t bpe_strmap_find(const bpe_strmap *m, const void *key, size_t len) {
    if (!m->slot_count) return -1;
    size_t s = bpe_strmap_slot(m, key, len, bpe_hash_bytes(key, len));
    return m->slots[s];
}

// Index of the entry for key, added with `value` if it was not there.
static inline int64_t bpe_strmap_add(bpe_strmap *m, const void *key, size_t len, int64_t value,
                                     bool *added) {
    if (2 * (m->count + 1) > m->slot_count) bpe_strmap_rehash(m, m->slot_count ? 2 * m->slot_count : 64);
    if (m->count >= INT32_MAX) die("bpe: more than 2^31 distinct strings");
    uint64_t h = bpe_hash_bytes(key, len);
    size_t s = bpe_strmap_slot(m, key, len, h);
    if (added) *added = m->slots[s] < 0;
    if (m->slots[s] >= 0) return m->slots[s];
    m->pool = bpe_grow(m->pool, &m->pool_cap, m->pool_len + len + 1, 1);
    memcpy(m->pool + m->pool_len, key, len);
    m->entries = bpe_grow(m->entries, &m->capacity, m->count + 1, sizeof *m->entries);
    m->entries[m->count] = (bpe_strmap_entry){m->pool_len, (uint32_t)len, h, value};
    m->pool_len += len;
    m->slots[s] = (int32_t)m->count;
    return (int64_t)m->count++;
}

// Token pairs (a, b) -> int32 values.
typedef struct { uint64_t key; int32_t value; } bpe_pair_slot;
typedef struct { bpe_pair_slot *slots; size_t slot_count, count; } bpe_pairmap;

#define BPE_PAIR_EMPTY UINT64_MAX // never a real key: ids are below 2^31

static inline uint64_t bpe_pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static inline uint64_t bpe_hash_u64(uint64_t x) { // splitmix64's finalizer: spreads nearby keys
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline size_t bpe_pairmap_slot(const bpe_pairmap *m, uint64_t key) {
    size_t s = bpe_hash_u64(key) & (m->slot_count - 1);
    while (m->slots[s].key != key && m->slots[s].key != BPE_PAIR_EMPTY) s = (s + 1) & (m->slot_count - 1);
    return s;
}

static inline int32_t bpe_pairmap_find(const bpe_pairmap *m, int32_t a, int32_t b) {
    if (!m->slot_count) return -1;
    size_t s = bpe_pairmap_slot(m, bpe_pair_key(a, b));
    return m->slots[s].key == BPE_PAIR_EMPTY ? -1 : m->slots[s].value;
}

static inline void bpe_pairmap_resize(bpe_pairmap *m, size_t slot_count) {
    bpe_pairmap old = *m;
    m->slots = xmalloc(slot_count * sizeof *m->slots);
    for (size_t s = 0; s < slot_count; s++) m->slots[s].key = BPE_PAIR_EMPTY;
    m->slot_count = slot_count;
    for (size_t s = 0; s < old.slot_count; s++)
        if (old.slots[s].key != BPE_PAIR_EMPTY) m->slots[bpe_pairmap_slot(m, old.slots[s].key)] = old.slots[s];
    free(old.slots);
}

// Sets (a, b) -> value unless the pair is already there; returns the value stored.
static inline int32_t bpe_pairmap_add(bpe_pairmap *m, int32_t a, int32_t b, int32_t value) {
    if (2 * (m->count + 1) > m->slot_count) bpe_pairmap_resize(m, m->slot_count ? 2 * m->slot_count : 1024);
    uint64_t key = bpe_pair_key(a, b);
    size_t s = bpe_pairmap_slot(m, key);
    if (m->slots[s].key == BPE_PAIR_EMPTY) m->slots[s] = (bpe_pair_slot){key, value}, m->count++;
    return m->slots[s].value;
}

// ======================================================== 2. pre-splitting
//
// Merges never cross a word boundary, so that " the" is learned once and
// not once per neighbouring word. The rule is GPT-2's regular expression
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out by hand on bytes, with two simplifications:
//   - a letter is an ASCII letter or any byte >= 0x80 (so every non-ASCII
//     character counts as a letter), a digit is 0-9, a space is one of
//     " \t\n\v\f\r"; everything else (punctuation, control bytes) is "other";
//   - a word is at most BPE_MAX_WORD bytes; longer runs are cut.
// A single space joins the word after it (" the"); of a longer run of
// white space, the last character is left for the word that follows.

enum { BPE_SPACE, BPE_LETTER, BPE_DIGIT, BPE_OTHER };

static inline int bpe_byte_class(unsigned char c) {
    if (c == ' ' || (c >= '\t' && c <= '\r')) return BPE_SPACE;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return BPE_LETTER;
    if (c >= '0' && c <= '9') return BPE_DIGIT;
    return BPE_OTHER;
}

static inline size_t bpe_run_length(const unsigned char *s, size_t len, size_t pos, int cls) {
    size_t e = pos;
    while (e < len && bpe_byte_class(s[e]) == cls) e++;
    return e - pos;
}

// GPT-2's English contractions, matched only where a word starts.
static inline size_t bpe_contraction_length(const unsigned char *s, size_t len, size_t pos) {
    if (s[pos] != '\'' || pos + 1 >= len) return 0;
    unsigned char c = s[pos + 1], d = pos + 2 < len ? s[pos + 2] : 0;
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
    return 0;
}

// Length in bytes of the word that starts at text[pos] (pos < len).
static inline size_t bpe_next_word(const char *text, size_t len, size_t pos) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = bpe_contraction_length(s, len, pos);
    int cls = bpe_byte_class(s[pos]);
    if (n == 0 && cls != BPE_SPACE) n = bpe_run_length(s, len, pos, cls);
    if (n == 0) {
        size_t spaces = bpe_run_length(s, len, pos, BPE_SPACE);
        if (pos + spaces == len) n = spaces;                 // white space at the very end
        else if (spaces > 1) n = spaces - 1;                 // leave the last one for the next word
        else if (s[pos] != ' ') n = 1;                      // a lone tab or newline
        else n = 1 + bpe_run_length(s, len, pos + 1, bpe_byte_class(s[pos + 1])); // " word"
    }
    return n < BPE_MAX_WORD ? n : BPE_MAX_WORD;
}

// ======================================================== the tokenizer

typedef struct { int32_t a, b, result; } bpe_merge_t; // tokens a, b side by side become result

// Special tokens decode to their text but are never made by merges.
typedef struct { uint32_t offset, length; bool special; } bpe_token; // bytes in token_bytes

typedef struct bpe {
    int vocab_size;          // ids run from 0 to vocab_size - 1
    int eot_id;              // "<|endoftext|>"
    int32_t byte_to_id[256]; // the token of each single byte
    bpe_token *tokens;       // by id
    size_t token_cap;
    char *token_bytes;
    size_t token_bytes_len, token_bytes_cap;
    bpe_merge_t *merges;     // in the order they were learned: the merge's rank
    int num_merges;
    size_t merge_cap;
    bpe_pairmap merge_rank;  // (a, b) -> rank of its merge, for encoding
    bpe_strmap token_ids;    // bytes -> id of each ordinary token
    uint64_t fingerprint;
} bpe_t;

static inline int bpe_vocab_size(const bpe_t *t) { return t->vocab_size; }
static inline int bpe_eot_id(const bpe_t *t) { return t->eot_id; }
static inline int bpe_num_merges(const bpe_t *t) { return t->num_merges; }
static inline bpe_merge_t bpe_merge(const bpe_t *t, int rank) { return t->merges[rank]; }
static inline bool bpe_is_special(const bpe_t *t, int id) { return t->tokens[id].special; }
static inline uint64_t bpe_fingerprint(const bpe_t *t) { return t->fingerprint; }

static inline const char *bpe_token_bytes(const bpe_t *t, int id, size_t *len) {
    *len = t->tokens[id].length;
    return t->token_bytes + t->tokens[id].offset;
}

static inline bpe_t *bpe_new(void) {
    bpe_t *t = xcalloc(1, sizeof *t);
    t->eot_id = -1;
    for (int b = 0; b < 256; b++) t->byte_to_id[b] = -1;
    return t;
}

static inline void bpe_free(bpe_t *t) {
    if (!t) return;
    free(t->tokens), free(t->token_bytes);
    free(t->merges), free(t->merge_rank.slots);
    bpe_strmap_free(&t->token_ids);
    free(t);
}

// Append a token with the next id.
static inline int bpe_add_token(bpe_t *t, const char *bytes, size_t len, bool special) {
    int id = t->vocab_size;
    if (id >= BPE_MAX_VOCAB) die("bpe: more than %d tokens", BPE_MAX_VOCAB);
    t->tokens = bpe_grow(t->tokens, &t->token_cap, (size_t)id + 1, sizeof *t->tokens);
    t->token_bytes = bpe_grow(t->token_bytes, &t->token_bytes_cap, t->token_bytes_len + len + 1, 1);
    memcpy(t->token_bytes + t->token_bytes_len, bytes, len);
    t->tokens[id] = (bpe_token){(uint32_t)t->token_bytes_len, (uint32_t)len, special};
    t->token_bytes_len += len;
    if (!special) bpe_strmap_add(&t->token_ids, bytes, len, id, NULL);
    if (!special && len == 1) t->byte_to_id[(unsigned char)bytes[0]] = id;
    if (special && len == strlen(BPE_EOT) && !memcmp(bytes, BPE_EOT, len)) t->eot_id = id;
    t->vocab_size++;
    return id;
}

static inline void bpe_add_merge(bpe_t *t, int32_t a, int32_t b, int32_t result) {
    t->merges = bpe_grow(t->merges, &t->merge_cap, (size_t)t->num_merges + 1, sizeof *t->merges);
    t->merges[t->num_merges] = (bpe_merge_t){a, b, result};
    bpe_pairmap_add(&t->merge_rank, a, b, t->num_merges); // a repeated pair keeps its first rank
    t->num_merges++;
}

static inline void bpe_put_u32(sha256_ctx *c, uint32_t x) {
    uint8_t b[4] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
    sha256_update(c, b, 4);
}

// A 64-bit digest of everything that decides the encoding: tokens, merges,
// the special token, and the pre-split rule. Token caches are keyed by it.
static inline void bpe_compute_fingerprint(bpe_t *t) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "bpe", 3);
    bpe_put_u32(&c, BPE_PRESPLIT_RULE), bpe_put_u32(&c, BPE_MAX_WORD);
    bpe_put_u32(&c, (uint32_t)t->vocab_size), bpe_put_u32(&c, (uint32_t)t->eot_id);
    for (int id = 0; id < t->vocab_size; id++) {
        bpe_put_u32(&c, t->tokens[id].length | (t->tokens[id].special ? 1u << 31 : 0));
        sha256_update(&c, t->token_bytes + t->tokens[id].offset, t->tokens[id].length);
    }
    for (int r = 0; r < t->num_merges; r++)
        bpe_put_u32(&c, (uint32_t)t->merges[r].a), bpe_put_u32(&c, (uint32_t)t->merges[r].b);
    uint8_t digest[SHA256_DIGEST_BYTES];
    sha256_final(&c, digest);
    t->fingerprint = 0;
    for (int i = 0; i < 8; i++) t->fingerprint = t->fingerprint << 8 | digest[i];
}

// ======================================================== 3. training
//
// The naive algorithm recounts every pair in the corpus for every merge:
// O(merges x corpus), minutes for WikiText-2. Instead:
//   - the corpus becomes its distinct words with their counts (a few tens
//     of thousands of words instead of two million);
//   - each pair has a count and a list of the words that contain it;
//   - a max-heap orders the pairs by count. Entries are not updated in
//     place; a count that changes gets a fresh entry and stale ones are
//     skipped when they reach the top ("lazy invalidation");
//   - a merge visits only the words on its pair's list: it subtracts the
//     word's pairs, merges, and adds the word's pairs back.
// Ties in count go to the smallest (a, b), so training is deterministic.

typedef struct { int64_t count; int32_t a, b; } bpe_heap_entry;

typedef struct {
    int32_t a, b;
    int64_t count;       // occurrences, weighted by word counts
    bpe_i32vec words;    // words that contain it (may hold stale entries)
    int32_t touched;     // last merge step that increased the count
} bpe_pair;

typedef struct {
    int32_t *symbols;        // each word's current tokens, words back to back
    size_t *word_start;
    int32_t *word_len, *word_seen;
    int64_t *word_count;
    size_t num_words;
    bpe_pair *pairs;
    size_t num_pairs, pair_cap;
    bpe_pairmap pair_ids;    // (a, b) -> index in pairs
    bpe_heap_entry *heap;
    size_t heap_count, heap_cap;
    bpe_i32vec touched;      // pairs whose count grew in this merge step
    int32_t step;
} bpe_trainer;

static inline bool bpe_heap_before(bpe_heap_entry x, bpe_heap_entry y) {
    if (x.count != y.count) return x.count > y.count;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
}

static inline void bpe_heap_push(bpe_trainer *tr, bpe_heap_entry e) {
    tr->heap = bpe_grow(tr->heap, &tr->heap_cap, tr->heap_count + 1, sizeof *tr->heap);
    size_t i = tr->heap_count++;
    for (; i > 0 && bpe_heap_before(e, tr->heap[(i - 1) / 2]); i = (i - 1) / 2)
        tr->heap[i] = tr->heap[(i - 1) / 2];
    tr->heap[i] = e;
}

static inline bpe_heap_entry bpe_heap_pop(bpe_trainer *tr) {
    bpe_heap_entry top = tr->heap[0], last = tr->heap[--tr->heap_count];
    size_t i = 0, n = tr->heap_count;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && bpe_heap_before(tr->heap[child + 1], tr->heap[child])) child++;
        if (!bpe_heap_before(tr->heap[child], last)) break;
        tr->heap[i] = tr->heap[child];
        i = child;
    }
    if (n > 0) tr->heap[i] = last;
    return top;
}

static inline int32_t bpe_pair_id(bpe_trainer *tr, int32_t a, int32_t b) {
    int32_t p = bpe_pairmap_add(&tr->pair_ids, a, b, (int32_t)tr->num_pairs);
    if ((size_t)p == tr->num_pairs) {
        tr->pairs = bpe_grow(tr->pairs, &tr->pair_cap, tr->num_pairs + 1, sizeof *tr->pairs);
        tr->pairs[p] = (bpe_pair){.a = a, .b = b, .touched = -1};
        tr->num_pairs++;
    }
    return p;
}

// Add (sign = +1) or subtract (-1) the pairs of word w. When adding, the
// word joins the list of each pair that contains `new_token` (these are
// the only pairs a merge creates; new_token < 0: all pairs, at the start).
static inline void bpe_word_pairs(bpe_trainer *tr, size_t w, int sign, int32_t new_token) {
    const int32_t *s = tr->symbols + tr->word_start[w];
    for (int32_t i = 0; i + 1 < tr->word_len[w]; i++) {
        int32_t id = bpe_pair_id(tr, s[i], s[i + 1]); // may move tr->pairs
        bpe_pair *p = &tr->pairs[id];
        p->count += sign * tr->word_count[w];
        if (sign < 0 || (new_token >= 0 && s[i] != new_token && s[i + 1] != new_token)) continue;
        if (!p->words.count || p->words.data[p->words.count - 1] != (int32_t)w)
            bpe_i32vec_push(&p->words, (int32_t)w);
        if (p->touched != tr->step) p->touched = tr->step, bpe_i32vec_push(&tr->touched, (int32_t)(p - tr->pairs));
    }
}

// Replace each (a, b) in word w, left to right, by t; false if there was none.
static inline bool bpe_merge_word(bpe_trainer *tr, size_t w, int32_t a, int32_t b, int32_t t) {
    int32_t *s = tr->symbols + tr->word_start[w];
    int32_t n = tr->word_len[w], out = 0;
    for (int32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) s[out++] = t, i += 2;
        else s[out++] = s[i++];
    }
    tr->word_len[w] = out;
    return out < n;
}

static inline bool bpe_word_has_pair(const bpe_trainer *tr, size_t w, int32_t a, int32_t b) {
    const int32_t *s = tr->symbols + tr->word_start[w];
    for (int32_t i = 0; i + 1 < tr->word_len[w]; i++)
        if (s[i] == a && s[i + 1] == b) return true;
    return false;
}

static inline void bpe_push_touched(bpe_trainer *tr) {
    for (size_t i = 0; i < tr->touched.count; i++) {
        const bpe_pair *p = &tr->pairs[tr->touched.data[i]];
        if (p->count > 0) bpe_heap_push(tr, (bpe_heap_entry){p->count, p->a, p->b});
    }
    tr->touched.count = 0;
}

// Merge pair p into token t in every word that contains it.
static inline void bpe_merge_everywhere(bpe_trainer *tr, int32_t p, int32_t t) {
    int32_t a = tr->pairs[p].a, b = tr->pairs[p].b;
    bpe_i32vec words = tr->pairs[p].words; // after this merge no word contains (a, b)
    tr->pairs[p].words = (bpe_i32vec){0};
    tr->step++;
    for (size_t i = 0; i < words.count; i++) {
        int32_t w = words.data[i];
        if (tr->word_seen[w] == tr->step || !bpe_word_has_pair(tr, (size_t)w, a, b)) continue;
        tr->word_seen[w] = tr->step;
        bpe_word_pairs(tr, (size_t)w, -1, t);
        bpe_merge_word(tr, (size_t)w, a, b, t);
        bpe_word_pairs(tr, (size_t)w, +1, t);
    }
    free(words.data);
    if (tr->pairs[p].count != 0) die("bpe_train: internal error: pair (%d, %d) left after its merge", a, b);
    bpe_push_touched(tr);
}

// The corpus as distinct words with counts; every word starts as its bytes.
static inline void bpe_count_words(bpe_trainer *tr, const char *text, size_t len) {
    bpe_strmap words = {0};
    for (size_t pos = 0; pos < len;) {
        size_t n = bpe_next_word(text, len, pos);
        int64_t e = bpe_strmap_add(&words, text + pos, n, 0, NULL);
        words.entries[e].value++;
        pos += n;
    }
    tr->num_words = words.count;
    tr->symbols = xmalloc((words.pool_len ? words.pool_len : 1) * sizeof *tr->symbols);
    tr->word_start = xmalloc((words.count + 1) * sizeof *tr->word_start);
    tr->word_len = xmalloc((words.count + 1) * sizeof *tr->word_len);
    tr->word_seen = xcalloc(words.count + 1, sizeof *tr->word_seen);
    tr->word_count = xmalloc((words.count + 1) * sizeof *tr->word_count);
    for (size_t w = 0; w < words.count; w++) {
        const bpe_strmap_entry *e = &words.entries[w];
        tr->word_start[w] = e->key_off;
        tr->word_len[w] = (int32_t)e->key_len;
        tr->word_count[w] = e->value;
        for (size_t i = 0; i < e->key_len; i++) tr->symbols[e->key_off + i] = (unsigned char)words.pool[e->key_off + i];
    }
    bpe_strmap_free(&words);
}

// Top of the heap whose count is current, or false when no pair is left.
static inline bool bpe_best_pair(bpe_trainer *tr, int32_t *pair) {
    while (tr->heap_count > 0) {
        bpe_heap_entry e = bpe_heap_pop(tr);
        int32_t p = bpe_pairmap_find(&tr->pair_ids, e.a, e.b);
        int64_t now = tr->pairs[p].count;
        if (now == e.count && now > 0) return *pair = p, true;
        if (now > 0 && now < e.count) bpe_heap_push(tr, (bpe_heap_entry){now, e.a, e.b}); // fell since
    }
    return false;
}

// The token that (a, b) becomes. Two different pairs can spell the same
// bytes ("a"+"bc" and "ab"+"c"); like Hugging Face's trainer we then reuse
// the existing token instead of adding a duplicate. *is_new_merge is false
// when (a, b) was merged before (it can reappear through such a reuse).
static inline int32_t bpe_merge_result(bpe_t *t, int32_t a, int32_t b, bool *is_new_merge) {
    int32_t rank = bpe_pairmap_find(&t->merge_rank, a, b);
    *is_new_merge = rank < 0;
    if (rank >= 0) return t->merges[rank].result;
    char joined[2 * BPE_MAX_WORD];
    size_t la, lb;
    const char *ba = bpe_token_bytes(t, a, &la), *bb = bpe_token_bytes(t, b, &lb);
    memcpy(joined, ba, la), memcpy(joined + la, bb, lb);
    int64_t e = bpe_strmap_find(&t->token_ids, joined, la + lb);
    if (e >= 0) return (int32_t)t->token_ids.entries[e].value;
    return bpe_add_token(t, joined, la + lb, false);
}

static inline void bpe_trainer_free(bpe_trainer *tr) {
    for (size_t p = 0; p < tr->num_pairs; p++) free(tr->pairs[p].words.data);
    free(tr->pairs), free(tr->pair_ids.slots), free(tr->heap), free(tr->touched.data);
    free(tr->symbols), free(tr->word_start), free(tr->word_len), free(tr->word_seen), free(tr->word_count);
}

// Learn merges from text until the vocabulary (256 bytes + merged tokens +
// "<|endoftext|>") has vocab_size tokens, or no pair is left to merge
// (tiny corpora); bpe_vocab_size says which. Deterministic.
static inline bpe_t *bpe_train(const char *text, size_t len, int vocab_size) {
    if (vocab_size < 257 || vocab_size > BPE_MAX_VOCAB)
        die("bpe_train: vocab_size must be between 257 and %d (256 bytes + the end-of-text token), got %d",
            BPE_MAX_VOCAB, vocab_size);
    bpe_t *t = bpe_new();
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        bpe_add_token(t, &byte, 1, false);
    }
    bpe_trainer tr = {0};
    bpe_count_words(&tr, text, len);
    for (size_t w = 0; w < tr.num_words; w++) bpe_word_pairs(&tr, w, +1, -1);
    bpe_push_touched(&tr);
    int32_t p;
    while (t->vocab_size < vocab_size - 1 && bpe_best_pair(&tr, &p)) {
        bool is_new;
        int32_t result = bpe_merge_result(t, tr.pairs[p].a, tr.pairs[p].b, &is_new);
        if (is_new) bpe_add_merge(t, tr.pairs[p].a, tr.pairs[p].b, result);
        bpe_merge_everywhere(&tr, p, result);
    }
    bpe_trainer_free(&tr);
    bpe_add_token(t, BPE_EOT, strlen(BPE_EOT), true);
    bpe_compute_fingerprint(t);
    return t;
}

// ======================================================== 4. encoding, decoding
//
// Encoding a word applies the merges in the order they were learned: find
// the adjacent pair with the lowest rank, merge all its occurrences, and
// repeat (Hugging Face's BPE does the same). A merge's new token only takes
// part in later merges, so this gives the same tokens as replaying the
// training merges one by one -- except in the rare case where a merge
// reused an older token (see bpe_merge_result), where it may merge more.
// Text repeats words endlessly, so each distinct word is encoded once and
// remembered in a cache.

// Tokens of one word (at most BPE_MAX_WORD bytes) into out; returns the count.
static inline int bpe_encode_word(const bpe_t *t, const unsigned char *bytes, int n, int32_t *out) {
    for (int i = 0; i < n; i++) out[i] = t->byte_to_id[bytes[i]];
    while (n > 1) {
        int32_t best = INT32_MAX;
        for (int i = 0; i + 1 < n; i++) {
            int32_t rank = bpe_pairmap_find(&t->merge_rank, out[i], out[i + 1]);
            if (rank >= 0 && rank < best) best = rank;
        }
        if (best == INT32_MAX) break;
        bpe_merge_t m = t->merges[best];
        int k = 0;
        for (int i = 0; i < n;) {
            if (i + 1 < n && out[i] == m.a && out[i + 1] == m.b) out[k++] = m.result, i += 2;
            else out[k++] = out[i++];
        }
        n = k;
    }
    return n;
}

// Remembers the tokens of each word seen. Belongs to one tokenizer.
typedef struct {
    const bpe_t *owner;
    bpe_strmap words; // word -> offset * 256 + number of tokens, in ids
    bpe_ids_t ids;
} bpe_cache_t;

static inline void bpe_cache_free(bpe_cache_t *c) {
    bpe_strmap_free(&c->words);
    free(c->ids.ids);
    memset(c, 0, sizeof *c);
}

// Encode text and append the tokens to out. cache may start zeroed.
static inline void bpe_encode_append(const bpe_t *t, bpe_cache_t *cache, const char *text, size_t len,
                                     bpe_ids_t *out) {
    if (cache->owner && cache->owner != t) die("bpe_encode_append: a word cache was used with two tokenizers");
    cache->owner = t;
    int32_t tokens[BPE_MAX_WORD];
    for (size_t pos = 0; pos < len;) {
        size_t n = bpe_next_word(text, len, pos);
        bool added;
        int64_t e = bpe_strmap_add(&cache->words, text + pos, n, 0, &added);
        if (added) {
            int count = bpe_encode_word(t, (const unsigned char *)text + pos, (int)n, tokens);
            cache->words.entries[e].value = (int64_t)cache->ids.count * 256 + count;
            for (int i = 0; i < count; i++) bpe_ids_push(&cache->ids, (uint16_t)tokens[i]);
        }
        int64_t v = cache->words.entries[e].value;
        out->ids = bpe_grow(out->ids, &out->capacity, out->count + (size_t)(v % 256), sizeof *out->ids);
        memcpy(out->ids + out->count, cache->ids.ids + v / 256, (size_t)(v % 256) * sizeof *out->ids);
        out->count += (size_t)(v % 256);
        pos += n;
    }
}

// Tokens of text, malloc'd. "<|endoftext|>" in the text is encoded as
// ordinary bytes: only the data pipeline places document boundaries.
static inline uint16_t *bpe_encode(const bpe_t *t, const char *text, size_t len, size_t *count_out) {
    bpe_cache_t cache = {0};
    bpe_ids_t out = {0};
    bpe_encode_append(t, &cache, text, len, &out);
    bpe_cache_free(&cache);
    *count_out = out.count;
    return out.ids ? out.ids : xmalloc(sizeof *out.ids);
}

// The bytes of the tokens, malloc'd and NUL-terminated (*len_out excludes
// the NUL). Special tokens come out as their text, "<|endoftext|>".
static inline char *bpe_decode(const bpe_t *t, const uint16_t *ids, size_t count, size_t *len_out) {
    size_t len = 0;
    for (size_t i = 0; i < count; i++) {
        if (ids[i] >= t->vocab_size)
            die("bpe_decode: token id %u is outside the vocabulary (%d tokens)", ids[i], t->vocab_size);
        len += t->tokens[ids[i]].length;
    }
    char *text = xmalloc(len + 1), *p = text;
    for (size_t i = 0; i < count; i++) {
        memcpy(p, t->token_bytes + t->tokens[ids[i]].offset, t->tokens[ids[i]].length);
        p += t->tokens[ids[i]].length;
    }
    *p = '\0';
    *len_out = len;
    return text;
}

// ======================================================== 5. files
//
// The file layout is Hugging Face tokenizers' tokenizer.json for a
// byte-level BPE (as GPT-2's): model.vocab maps token strings to ids,
// model.merges lists "left right" in rank order, added_tokens holds
// "<|endoftext|>". Token strings are written with GPT-2's byte-to-unicode
// map: the 188 printable bytes stand for themselves, the other 68 (space,
// control bytes, ...) become U+0100 and up, so " the" is written "Ġthe".

static inline bool bpe_byte_is_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// Code point standing for byte b. The 68 others are numbered in byte order
// from 256: bytes 0-32 are 256-288, 127-160 are 289-322, 173 is 323.
static inline uint32_t bpe_byte_to_char(int b) {
    if (bpe_byte_is_printable(b)) return (uint32_t)b;
    if (b <= 32) return 256 + (uint32_t)b;
    if (b <= 160) return 289 + (uint32_t)(b - 127);
    return 323; // b == 173, the soft hyphen
}

// Byte that code point cp stands for, or -1 if it stands for none.
static inline int bpe_char_to_byte(uint32_t cp) {
    if (cp < 256) return bpe_byte_is_printable((int)cp) ? (int)cp : -1;
    if (cp <= 288) return (int)cp - 256;
    if (cp <= 322) return (int)cp - 289 + 127;
    return cp == 323 ? 173 : -1;
}

// Strict UTF-8: the length of the character at s (and its code point),
// or 0 if the bytes are not valid UTF-8 (overlong, surrogate, truncated).
static inline int bpe_utf8_decode(const unsigned char *s, size_t avail, uint32_t *cp) {
    if (avail == 0) return 0;
    int n = s[0] < 0x80 ? 1 : s[0] < 0xC2 ? 0 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : s[0] < 0xF5 ? 4 : 0;
    if (n == 0 || (size_t)n > avail) return 0;
    uint32_t c = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_for_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_for_length[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return n;
}

static inline int bpe_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// A growable text buffer for writing JSON.
typedef struct { char *data; size_t len, cap; } bpe_text;

static inline void bpe_text_add(bpe_text *s, const char *bytes, size_t n) {
    s->data = bpe_grow(s->data, &s->cap, s->len + n + 1, 1);
    memcpy(s->data + s->len, bytes, n);
    s->len += n;
    s->data[s->len] = '\0';
}

static inline void bpe_text_str(bpe_text *s, const char *str) { bpe_text_add(s, str, strlen(str)); }

// Token id as the inside of a JSON string: an ordinary token's bytes go
// through the byte-level map; a special token is written as its own text
// (UTF-8, as it was read), with quotes, backslashes and control bytes escaped.
static inline void bpe_text_token_chars(bpe_text *s, const bpe_t *t, int id) {
    size_t len;
    const unsigned char *bytes = (const unsigned char *)bpe_token_bytes(t, id, &len);
    for (size_t i = 0; i < len; i++) {
        char utf8[8];
        bool special = t->tokens[id].special;
        uint32_t cp = special ? bytes[i] : bpe_byte_to_char(bytes[i]);
        if (cp == '"' || cp == '\\') bpe_text_add(s, "\\", 1);
        if (cp < 0x20) {
            snprintf(utf8, sizeof utf8, "\\u%04x", (unsigned)cp);
            bpe_text_add(s, utf8, 6);
        } else if (special) {
            bpe_text_add(s, (const char *)&bytes[i], 1);
        } else {
            bpe_text_add(s, utf8, (size_t)bpe_utf8_encode(cp, utf8));
        }
    }
}

static inline void bpe_text_token(bpe_text *s, const bpe_t *t, int id) {
    bpe_text_add(s, "\"", 1);
    bpe_text_token_chars(s, t, id);
    bpe_text_add(s, "\"", 1);
}

static inline void bpe_json_header(bpe_text *s, const bpe_t *t) {
    char line[256];
    bpe_text_str(s, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    bool first = true;
    for (int id = 0; id < t->vocab_size; id++) {
        if (!t->tokens[id].special) continue;
        snprintf(line, sizeof line, "%s\n    {\"id\": %d, \"content\": ", first ? "" : ",", id);
        bpe_text_str(s, line);
        bpe_text_token(s, t, id);
        bpe_text_str(s, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                        "\"normalized\": false, \"special\": true}");
        first = false;
    }
    bpe_text_str(s, "\n  ],\n  \"normalizer\": null,\n"
                    "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                    "\"trim_offsets\": true, \"use_regex\": true},\n"
                    "  \"post_processor\": null,\n"
                    "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                    "\"trim_offsets\": true, \"use_regex\": true},\n"
                    "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
                    "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                    "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n");
}

// Save as tokenizer.json (atomically). False + a one-line reason on failure.
static inline bool bpe_save_json(const bpe_t *t, const char *path, char *err, size_t errlen) {
    bpe_text s = {0};
    char num[32];
    bpe_json_header(&s, t);
    bpe_text_str(&s, "    \"vocab\": {");
    for (int id = 0; id < t->vocab_size; id++) {
        bpe_text_str(&s, id ? ",\n      " : "\n      ");
        bpe_text_token(&s, t, id);
        snprintf(num, sizeof num, ": %d", id);
        bpe_text_str(&s, num);
    }
    bpe_text_str(&s, "\n    },\n    \"merges\": [");
    for (int r = 0; r < t->num_merges; r++) { // "left right": no token string holds a space (it is U+0120)
        bpe_text_str(&s, r ? ",\n      \"" : "\n      \"");
        bpe_text_token_chars(&s, t, t->merges[r].a);
        bpe_text_str(&s, " ");
        bpe_text_token_chars(&s, t, t->merges[r].b);
        bpe_text_str(&s, "\"");
    }
    bpe_text_str(&s, "\n    ]\n  }\n}\n");
    bool ok = files_write_atomic(path, s.data, s.len, err, errlen);   // a crash leaves the old file or the new one
    free(s.data);
    return ok;
}

// ---------------------------------------------------------------- loading

// A token string for a one-line message: quoted, shortened, control characters as '?'.
static inline const char *bpe_quote(const char *s, size_t len, char out[64]) {
    size_t n = 0;
    out[n++] = '\'';
    for (size_t i = 0; i < len && n < 56; i++) out[n++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (len > 54) memcpy(out + n, "...", 3), n += 3;
    out[n++] = '\'';
    out[n] = '\0';
    return out;
}


// "an object", "a string", ...: a JSON type in a message.
static inline const char *bpe_json_kind(json_type type) {
    static const char *names[] = {"null", "a boolean", "a boolean", "a number", "a string", "an array", "an object"};
    return names[type];
}

// Member `key` of obj, which must exist and have the given type.
static inline const json_node *bpe_json_need(const json_doc *j, const json_node *obj, const char *key, json_type type,
                                             const char *where, char *reason, size_t reason_len) {
    const json_node *node = json_member(j, obj, key);
    if (!node) return bpe_fail(reason, reason_len, "missing field %s%s", where, key), NULL;
    if (node->type != type)
        return bpe_fail(reason, reason_len, "%s%s should be %s, not %s", where, key, bpe_json_kind(type),
                        bpe_json_kind(node->type)), NULL;
    return node;
}

static inline bool bpe_json_string_is(const json_node *node, const char *s) {
    return node && node->type == JSON_STRING && node->len == strlen(s) && !memcmp(node->text, s, node->len);
}

// A JSON integer in [0, BPE_MAX_VOCAB), else -1.
static inline int32_t bpe_json_token_id(const json_node *node) {
    double v;
    if (!json_double(node, &v)) return -1;
    return v >= 0 && v < BPE_MAX_VOCAB && v == (double)(int32_t)v ? (int32_t)v : -1;
}

// Turn a byte-level token string (UTF-8) back into the bytes it stands for.
static inline bool bpe_unmap_token(const char *s, size_t len, char *out, size_t *out_len) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = bpe_utf8_decode((const unsigned char *)s + i, len - i, &cp);
        int b = k ? bpe_char_to_byte(cp) : -1;
        if (b < 0) return false;
        out[n++] = (char)b;
        i += (size_t)k;
    }
    *out_len = n;
    return true;
}

// What the loader gathers before building the tokenizer: each id's bytes.
typedef struct {
    int64_t *slot_of_id;   // id -> index in bytes_of (-1: unused)
    bpe_strmap bytes_of;   // token bytes, in file order; value: id * 2 + special
    bpe_strmap specials;   // contents of added_tokens -> id
    int max_id;
} bpe_loader;

static inline bool bpe_load_check_model(const json_doc *j, char *reason, size_t reason_len) {
    const json_node *root = json_root(j);
    const json_node *model = bpe_json_need(j, root, "model", JSON_OBJECT, "", reason, reason_len);
    if (!model) return false;
    if (!bpe_json_string_is(json_member(j, model, "type"), "BPE"))
        return bpe_fail(reason, reason_len, "model.type must be \"BPE\" (missing or another model)");
    const char *parts[] = {"pre_tokenizer", "decoder"};
    for (int i = 0; i < 2; i++) {
        const json_node *part = bpe_json_need(j, root, parts[i], JSON_OBJECT, "", reason, reason_len);
        if (!part) return false;
        if (!bpe_json_string_is(json_member(j, part, "type"), "ByteLevel"))
            return bpe_fail(reason, reason_len, "%s.type must be \"ByteLevel\" (this reader handles byte-level BPE only)", parts[i]);
    }
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_node *a = json_member(j, model, affixes[i]);
        if (a && !(a->type == JSON_NULL || bpe_json_string_is(a, "")))
            return bpe_fail(reason, reason_len, "model.%s is set, which this reader does not support", affixes[i]);
    }
    const json_node *ignore = json_member(j, model, "ignore_merges");
    if (ignore && ignore->type == JSON_TRUE)
        return bpe_fail(reason, reason_len, "model.ignore_merges is true, which this reader does not support");
    return true;
}

// Record token `bytes` with id; refuse ids used twice and strings listed twice.
static inline bool bpe_load_token(bpe_loader *L, const char *bytes, size_t len, int32_t id, bool special,
                                  const char *shown, size_t shown_len, char *reason, size_t reason_len) {
    char q[64], q2[64];
    bool added;
    if (id < 0) return bpe_fail(reason, reason_len, "token %s has no valid id (ids are integers from 0 to %d)",
                                     bpe_quote(shown, shown_len, q), BPE_MAX_VOCAB - 1);
    bpe_strmap *m = special ? &L->specials : &L->bytes_of;
    int64_t e = bpe_strmap_add(m, bytes, len, id, &added);
    if (!added && m->entries[e].value == id && special) return true; // in vocab and added_tokens alike
    if (!added) return bpe_fail(reason, reason_len, "token %s is listed twice", bpe_quote(shown, shown_len, q));
    if (L->slot_of_id[id] >= 0) {
        int64_t prev = L->slot_of_id[id];
        const bpe_strmap *pm = prev % 2 ? &L->specials : &L->bytes_of;
        const bpe_strmap_entry *pe = &pm->entries[prev / 2];
        return bpe_fail(reason, reason_len, "id %d is given to two tokens, %s and %s", id,
                             bpe_quote(pm->pool + pe->key_off, pe->key_len, q2), bpe_quote(shown, shown_len, q));
    }
    L->slot_of_id[id] = e * 2 + special;
    if (id > L->max_id) L->max_id = id;
    return true;
}

static inline bool bpe_load_added(const json_doc *j, bpe_loader *L, char *reason, size_t reason_len) {
    const json_node *added = bpe_json_need(j, json_root(j), "added_tokens", JSON_ARRAY, "", reason, reason_len);
    if (!added) return false;
    for (const json_node *a = json_first(j, added); a; a = json_next(j, a)) {
        const json_node *content = bpe_json_need(j, a, "content", JSON_STRING, "added_tokens[].", reason, reason_len);
        const json_node *id = content ? bpe_json_need(j, a, "id", JSON_NUMBER, "added_tokens[].", reason, reason_len) : NULL;
        if (!id) return false;
        if (!bpe_load_token(L, content->text, content->len, bpe_json_token_id(id), true, content->text, content->len,
                            reason, reason_len))
            return false;
    }
    if (bpe_strmap_find(&L->specials, BPE_EOT, strlen(BPE_EOT)) < 0)
        return bpe_fail(reason, reason_len, "added_tokens has no \"%s\" token", BPE_EOT);
    return true;
}

static inline bool bpe_load_vocab(const json_doc *j, bpe_loader *L, char *reason, size_t reason_len) {
    const json_node *model = json_member(j, json_root(j), "model");
    const json_node *vocab = bpe_json_need(j, model, "vocab", JSON_OBJECT, "model.", reason, reason_len);
    if (!vocab) return false;
    char bytes[1024], q[64];
    for (const json_node *v = json_first(j, vocab); v; v = json_next(j, v)) {
        const char *key = v->key;
        size_t key_len = v->key_len, n;
        int32_t id = bpe_json_token_id(v);
        int64_t special = bpe_strmap_find(&L->specials, key, key_len);
        if (special >= 0) {
            if (L->specials.entries[special].value != id)
                return bpe_fail(reason, reason_len, "special token %s has one id in model.vocab and another in added_tokens",
                                     bpe_quote(key, key_len, q));
            continue;
        }
        if (key_len > sizeof bytes || !bpe_unmap_token(key, key_len, bytes, &n) || n == 0)
            return bpe_fail(reason, reason_len, "token %s is not written in the byte-level alphabet (GPT-2's byte-to-unicode map)",
                                 bpe_quote(key, key_len, q));
        if (!bpe_load_token(L, bytes, n, id, false, key, key_len, reason, reason_len)) return false;
    }
    return true;
}

// Build the token table in id order, once every id from 0 to max is known.
static inline bool bpe_load_tokens(bpe_t *t, const bpe_loader *L, char *reason, size_t reason_len) {
    for (int id = 0; id <= L->max_id; id++) {
        int64_t slot = L->slot_of_id[id];
        if (slot < 0) return bpe_fail(reason, reason_len, "token ids must run from 0 to %d without gaps, but id %d is missing",
                                           L->max_id, id);
        const bpe_strmap *m = slot % 2 ? &L->specials : &L->bytes_of;
        const bpe_strmap_entry *e = &m->entries[slot / 2];
        bpe_add_token(t, m->pool + e->key_off, e->key_len, slot % 2);
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_to_id[b] < 0) return bpe_fail(reason, reason_len, "model.vocab has no token for byte 0x%02x", b);
    return true;
}

// The id of a merge's half (a byte-level token string), or -1.
static inline int32_t bpe_load_merge_part(const bpe_t *t, const char *s, size_t len) {
    char bytes[1024];
    size_t n;
    if (len > sizeof bytes || !bpe_unmap_token(s, len, bytes, &n)) return -1;
    int64_t e = bpe_strmap_find(&t->token_ids, bytes, n);
    return e < 0 ? -1 : (int32_t)t->token_ids.entries[e].value;
}

// One merge, "left right" or ["left", "right"], into its two halves.
static inline bool bpe_merge_halves(const json_doc *j, const json_node *node, const char *half[2], size_t half_len[2]) {
    if (node->type == JSON_STRING) {
        const char *s = node->text;
        const char *space = memchr(s, ' ', node->len);
        if (!space || memchr(space + 1, ' ', node->len - (size_t)(space + 1 - s))) return false;
        half[0] = s, half_len[0] = (size_t)(space - s);
        half[1] = space + 1, half_len[1] = node->len - half_len[0] - 1;
        return half_len[0] > 0 && half_len[1] > 0;
    }
    if (node->type != JSON_ARRAY || node->count != 2) return false;
    const json_node *c = json_first(j, node);
    for (int i = 0; i < 2; i++, c = json_next(j, c)) {
        if (c->type != JSON_STRING) return false;
        half[i] = c->text, half_len[i] = c->len;
    }
    return true;
}

static inline bool bpe_load_merges(const json_doc *j, bpe_t *t, char *reason, size_t reason_len) {
    const json_node *model = json_member(j, json_root(j), "model");
    const json_node *merges = bpe_json_need(j, model, "merges", JSON_ARRAY, "model.", reason, reason_len);
    if (!merges) return false;
    int rank = 0;
    char q[64], joined[2048];
    for (const json_node *m = json_first(j, merges); m; m = json_next(j, m), rank++) {
        const char *half[2];
        size_t half_len[2], la, lb;
        if (!bpe_merge_halves(j, m, half, half_len))
            return bpe_fail(reason, reason_len, "model.merges[%d] is not \"left right\" or [\"left\", \"right\"]", rank);
        int32_t id[2];
        for (int i = 0; i < 2; i++)
            if ((id[i] = bpe_load_merge_part(t, half[i], half_len[i])) < 0)
                return bpe_fail(reason, reason_len, "model.merges[%d] uses %s, which is not in model.vocab", rank,
                                     bpe_quote(half[i], half_len[i], q));
        const char *ba = bpe_token_bytes(t, id[0], &la), *bb = bpe_token_bytes(t, id[1], &lb);
        int64_t e = -1;
        if (la + lb <= sizeof joined) {
            memcpy(joined, ba, la), memcpy(joined + la, bb, lb);
            e = bpe_strmap_find(&t->token_ids, joined, la + lb);
        }
        if (e < 0) return bpe_fail(reason, reason_len, "model.merges[%d] makes a token that is not in model.vocab", rank);
        bpe_add_merge(t, id[0], id[1], (int32_t)t->token_ids.entries[e].value);
    }
    return true;
}

// Read a whole file (at most BPE_MAX_FILE bytes), NUL-terminated.
static inline char *bpe_read_file(const char *path, size_t *len, char *reason, size_t reason_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return bpe_fail(reason, reason_len, "cannot open: %s", strerror(errno)), NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > BPE_MAX_FILE) {
        fclose(f);
        return bpe_fail(reason, reason_len, "not a regular file of at most %u MiB", BPE_MAX_FILE >> 20), NULL;
    }
    char *data = xmalloc((size_t)st.st_size + 1);
    *len = fread(data, 1, (size_t)st.st_size, f);
    bool bad = ferror(f) || *len != (size_t)st.st_size;
    fclose(f);
    if (bad) return free(data), bpe_fail(reason, reason_len, "read error (file changed while reading?)"), NULL;
    data[*len] = '\0';
    return data;
}

static inline bpe_t *bpe_from_json(const json_doc *j, char *reason, size_t reason_len) {
    if (json_root(j)->type != JSON_OBJECT) return bpe_fail(reason, reason_len, "the document is not a JSON object"), NULL;
    bpe_loader L = {.max_id = -1};
    L.slot_of_id = xmalloc(BPE_MAX_VOCAB * sizeof *L.slot_of_id);
    for (int i = 0; i < BPE_MAX_VOCAB; i++) L.slot_of_id[i] = -1;
    bpe_t *t = bpe_new();
    bool ok = bpe_load_check_model(j, reason, reason_len) && bpe_load_added(j, &L, reason, reason_len) &&
              bpe_load_vocab(j, &L, reason, reason_len) && bpe_load_tokens(t, &L, reason, reason_len) &&
              bpe_load_merges(j, t, reason, reason_len);
    free(L.slot_of_id);
    bpe_strmap_free(&L.bytes_of), bpe_strmap_free(&L.specials);
    if (!ok) return bpe_free(t), NULL;
    bpe_compute_fingerprint(t);
    return t;
}

// A tokenizer from tokenizer.json text that the JSON reader may decode in
// place (common/json.h). On bad content: NULL and a one-line reason,
// prefixed by name.
static inline bpe_t *bpe_parse_json_in_place(char *text, size_t len, const char *name, char *err, size_t errlen) {
    char reason[256] = "", why[200] = "";
    json_doc j;
    bpe_t *t = NULL;
    if (!json_parse(text, len, &j, why, sizeof why)) return bpe_fail(err, errlen, "%s: not valid JSON: %s", name, why), NULL;
    if (!(t = bpe_from_json(&j, reason, sizeof reason))) bpe_fail(err, errlen, "%s: %s", name, reason);
    json_free(&j);
    return t;
}

// A tokenizer from tokenizer.json text in memory (len bytes, no NUL
// needed). On bad content: NULL and a one-line reason, prefixed by name.
static inline bpe_t *bpe_parse_json(const char *text, size_t len, const char *name, char *err, size_t errlen) {
    char *copy = xmalloc(len);
    if (len) memcpy(copy, text, len);
    bpe_t *t = bpe_parse_json_in_place(copy, len, name, err, errlen);
    free(copy);
    return t;
}

// Load a tokenizer.json. On a bad file: NULL and a one-line reason in err.
static inline bpe_t *bpe_load_json(const char *path, char *err, size_t errlen) {
    char reason[256] = "";
    size_t len;
    char *text = bpe_read_file(path, &len, reason, sizeof reason);
    if (!text) return bpe_fail(err, errlen, "%s: %s", path, reason), NULL;
    bpe_t *t = bpe_parse_json_in_place(text, len, path, err, errlen);
    free(text);
    return t;
}

#endif
