// Unit test of the GPT chapter's tokenizer and data pipeline:
// gpt/bpe.h, wikitext.h and sha256.h.
//
// Needs no real dataset: the corpus is a few KB of WikiText-style prose
// written below, grown with generated sentences, plus random bytes.
// Usage: test_gpt_tokenizer [SCRATCH_DIR]  (default: a fresh folder in /tmp, removed at the end)
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "../../gpt/bpe.h"
#include "../../gpt/sha256.h"
#include "../../gpt/wikitext.h"
#include "test.h"

static const char *handmade_corpus =
    " \n = The Lighthouse at Marren Point = \n \n"
    " The lighthouse at Marren Point is a stone tower on the northern coast , built in 1871 to guide ships "
    "past the reefs that had wrecked more than forty vessels in the previous century . It stands 31 metres "
    "tall and its light can be seen from 22 nautical miles away on a clear night . \n"
    " The first keeper , Thomas Alden , kept a journal that survives in the county archive . He wrote that "
    "the winter of 1873 was the worst he had seen : the lamp froze twice and the supply boat could not land "
    "for six weeks . \n \n = = Construction = = \n \n"
    " Work began in the spring of 1869 . The granite was cut at a quarry ten miles inland and carried to the "
    "coast by cart , then lifted into place with a steam crane . The engineers didn 't trust the local sand , "
    "so the foundation was sunk into the bedrock itself . \n"
    " The cost of the tower was £ 12 @,@ 400 , about twice the first estimate . \n \n"
    " = The Orchard Song = \n \n"
    " \" The Orchard Song \" is a folk song from the valley towns , first written down in 1902 by a teacher who "
    "heard it sung at a harvest fair . Its melody is in a minor key and its verses tell of a farmer 's "
    "daughter who waits for a sailor to return . \n"
    " Several versions exist ; the oldest has seven verses and the shortest has three . Singers often change "
    "the names of the towns to match their own region . \n \n = = Recordings = = \n \n"
    " The song was first recorded in 1931 on a wax cylinder . A modern arrangement reached number 14 on the "
    "national folk chart in 1978 , and it has been performed at the spring festival every year since . \n \n"
    " = Heron Lake = \n \n"
    " Heron Lake is a shallow lake of 3 @.@ 6 square kilometres in the eastern lowlands . It is fed by two "
    "streams and drains to the south through a narrow channel . Grey herons nest in the reeds along its "
    "western shore , which gives the lake its name . \n"
    " In dry summers the water level falls by more than a metre , and parts of the old causeway appear . "
    "Fishermen say the lake holds pike , perch and eels , though the eels have become rare . \n";

// Grow the corpus with sentences built from common words, so that BPE has
// something to learn; a fixed seed keeps the test repeatable.
static char *make_corpus(size_t *len) {
    static const char *words[] = {"the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "that", "with",
                                  "by", "his", "as", "at", "from", "it", "were", "an", "which", "city", "river",
                                  "season", "album", "church", "station", "people", "during", "after", "between",
                                  "government", "national", "however", "released", "several", "thousand", "1998",
                                  "2004", "north", "south", "played", "written", "building", "island", "<unk>"};
    bpe_text s = {0};
    bpe_text_str(&s, handmade_corpus);
    uint64_t rng = 42;
    for (int article = 0; article < 12; article++) {
        char title[64];
        snprintf(title, sizeof title, " \n = Generated article %d = \n \n", article);
        bpe_text_str(&s, title);
        for (int sentence = 0; sentence < 40; sentence++) {
            for (int w = 0; w < 12; w++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                bpe_text_str(&s, " ");
                bpe_text_str(&s, words[(rng >> 33) % (sizeof words / sizeof *words)]);
            }
            bpe_text_str(&s, sentence % 5 == 4 ? " . \n" : " ,");
        }
    }
    *len = s.len;
    return s.data;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) { // xorshift64*
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

// Random bytes, biased towards the troublesome ones: NUL, 0xFF, lone UTF-8
// continuation bytes, truncated multi-byte starts, spaces and newlines.
static char *random_bytes(size_t len) {
    static const unsigned char nasty[] = {0x00, 0xFF, 0x80, 0xBF, 0xC3, 0xE2, 0xF0, ' ', '\n', '\'', 'a'};
    char *p = xmalloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        uint64_t r = next_random();
        p[i] = (char)(r % 3 == 0 ? nasty[(r >> 8) % sizeof nasty] : (r >> 16) & 0xFF);
    }
    return p;
}

static bool round_trips(const bpe_t *t, const char *text, size_t len) {
    size_t count, back_len;
    uint16_t *ids = bpe_encode(t, text, len, &count);
    bool ok = true;
    for (size_t i = 0; i < count; i++) ok = ok && ids[i] < bpe_vocab_size(t) && ids[i] != bpe_eot_id(t);
    char *back = bpe_decode(t, ids, count, &back_len);
    ok = ok && back_len == len && !memcmp(back, text, len);
    free(ids), free(back);
    return ok;
}

static bool same_ids(const uint16_t *a, size_t na, const uint16_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

// ---------------------------------------------------------------- references
//
// The textbook algorithms, slow but plainly right, to check the fast ones:
// training recounts every pair for every merge; encoding replays the merges
// one by one in the order they were learned.

typedef struct { int32_t *symbols; int len; int64_t count; } ref_word;

static int ref_words(const char *text, size_t len, ref_word **out) {
    bpe_strmap map = {0};
    for (size_t pos = 0; pos < len;) {
        size_t n = bpe_next_word(text, len, pos);
        int64_t e = bpe_strmap_add(&map, text + pos, n, 0, NULL); // may move map.entries
        map.entries[e].value++;
        pos += n;
    }
    *out = xcalloc(map.count, sizeof **out);
    for (size_t w = 0; w < map.count; w++) {
        ref_word *r = &(*out)[w];
        r->len = (int)map.entries[w].key_len, r->count = map.entries[w].value;
        r->symbols = xmalloc((size_t)r->len * sizeof *r->symbols);
        for (int i = 0; i < r->len; i++) r->symbols[i] = (unsigned char)map.pool[map.entries[w].key_off + (size_t)i];
    }
    int n = (int)map.count;
    bpe_strmap_free(&map);
    return n;
}

static void ref_apply(ref_word *w, int32_t a, int32_t b, int32_t t) {
    int k = 0;
    for (int i = 0; i < w->len;) {
        if (i + 1 < w->len && w->symbols[i] == a && w->symbols[i + 1] == b) w->symbols[k++] = t, i += 2;
        else w->symbols[k++] = w->symbols[i++];
    }
    w->len = k;
}

// Merges (a, b, result) learned by the naive trainer; returns how many.
static int ref_train(const char *text, size_t len, int vocab_size, bpe_merge_t *merges, char tokens[][BPE_MAX_WORD + 1],
                     int *token_len, int *vocab_out) {
    ref_word *words;
    int num_words = ref_words(text, len, &words), ntok = 256, nmerges = 0;
    for (int b = 0; b < 256; b++) tokens[b][0] = (char)b, token_len[b] = 1;
    int64_t *counts = xmalloc((size_t)vocab_size * (size_t)vocab_size * sizeof *counts);
    while (ntok < vocab_size - 1) {
        memset(counts, 0, (size_t)ntok * (size_t)ntok * sizeof *counts);
        for (int w = 0; w < num_words; w++)
            for (int i = 0; i + 1 < words[w].len; i++)
                counts[words[w].symbols[i] * ntok + words[w].symbols[i + 1]] += words[w].count;
        int64_t best = 0;
        int ba = -1, bb = -1;
        for (int a = 0; a < ntok; a++) // ties: the first (smallest) pair wins
            for (int b = 0; b < ntok; b++)
                if (counts[a * ntok + b] > best) best = counts[a * ntok + b], ba = a, bb = b;
        if (best == 0) break;
        int result = -1;
        for (int m = 0; m < nmerges; m++)
            if (merges[m].a == ba && merges[m].b == bb) result = merges[m].result;
        if (result < 0) {
            char joined[2 * BPE_MAX_WORD];
            int jl = token_len[ba] + token_len[bb];
            memcpy(joined, tokens[ba], (size_t)token_len[ba]), memcpy(joined + token_len[ba], tokens[bb], (size_t)token_len[bb]);
            for (int t = 0; t < ntok; t++)
                if (token_len[t] == jl && !memcmp(tokens[t], joined, (size_t)jl)) result = t;
            if (result < 0) memcpy(tokens[ntok], joined, (size_t)jl), token_len[ntok] = jl, result = ntok++;
            merges[nmerges++] = (bpe_merge_t){ba, bb, result};
        }
        for (int w = 0; w < num_words; w++) ref_apply(&words[w], ba, bb, result);
    }
    for (int w = 0; w < num_words; w++) free(words[w].symbols);
    free(words), free(counts);
    *vocab_out = ntok + 1; // and <|endoftext|>
    return nmerges;
}

static uint16_t *ref_encode(const bpe_t *t, const char *text, size_t len, size_t *count) {
    bpe_ids_t out = {0};
    for (size_t pos = 0; pos < len;) {
        size_t n = bpe_next_word(text, len, pos);
        ref_word w = {xmalloc(n * sizeof(int32_t)), (int)n, 1};
        for (size_t i = 0; i < n; i++) w.symbols[i] = t->byte_to_id[(unsigned char)text[pos + i]];
        for (int r = 0; r < bpe_num_merges(t); r++) ref_apply(&w, t->merges[r].a, t->merges[r].b, t->merges[r].result);
        for (int i = 0; i < w.len; i++) bpe_ids_push(&out, (uint16_t)w.symbols[i]);
        free(w.symbols);
        pos += n;
    }
    *count = out.count;
    return out.ids ? out.ids : xmalloc(2);
}

// ---------------------------------------------------------------- helpers

static char scratch[512];

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK_PTR(f);
    if (len && fwrite(data, 1, len, f) != len) die("short write to %s", path);
    if (fclose(f) != 0) die("cannot close %s", path);
}

static char *read_file(const char *path, size_t *len) {
    char reason[256];
    char *data = bpe_read_file(path, len, reason, sizeof reason);
    if (!data) die("%s: %s", path, reason);
    return data;
}

// text with `from` replaced (once, must be present) by `to`, malloc'd.
static char *replaced(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) die("test setup: '%s' not found in the template tokenizer file", from);
    size_t head = (size_t)(at - text), fl = strlen(from), tl = strlen(to), rest = strlen(at + fl);
    char *out = xmalloc(head + tl + rest + 1);
    memcpy(out, text, head), memcpy(out + head, to, tl), memcpy(out + head + tl, at + fl, rest + 1);
    return out;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) { unlink(path); return; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[1024];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        remove_tree(child);
    }
    closedir(d);
    rmdir(path);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

// ---------------------------------------------------------------- tests

static void test_sha256(void) {
    struct { const char *text; const char *hex; } vectors[] = { // FIPS 180-4 examples
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    uint8_t d[32];
    char hex[65];
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        sha256(vectors[i].text, strlen(vectors[i].text), d);
        sha256_to_hex(d, hex);
        ok = ok && !strcmp(hex, vectors[i].hex);
    }
    EXPECT("sha256: standard test vectors", ok, "a digest differs from FIPS 180-4's examples");
    char *million = xmalloc(1000000);
    memset(million, 'a', 1000000);
    sha256_ctx c;
    sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 1000 + 1) // odd-sized pieces
        sha256_update(&c, million + off, off + step > 1000000 ? 1000000 - off : step);
    sha256_final(&c, d);
    sha256_to_hex(d, hex);
    EXPECT("sha256: a million 'a' fed in odd-sized pieces", !strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
           "got %s", hex);
    free(million);
}

static bool splits_as(const char *text, const char *const *want, int n_want) {
    size_t len = strlen(text), pos = 0;
    int k = 0;
    while (pos < len) {
        size_t n = bpe_next_word(text, len, pos);
        if (k >= n_want || strlen(want[k]) != n || memcmp(want[k], text + pos, n)) return false;
        pos += n, k++;
    }
    return k == n_want;
}

static void test_presplit(void) {
    const char *a[] = {"Hello", " world", "!"}, *b[] = {"a", " ", " b"}, *c[] = {"x", "\n", "\n", "y"};
    const char *d[] = {"don", "'t", " stop", " '", "s"}, *e[] = {"3", ".", "14", " ,", "\n"}, *f[] = {"ab", "  "};
    const char *g[] = {" \xc3\xa9t\xc3\xa9", " \xe2\x80\x94"};
    EXPECT("presplit: a space joins the next word", splits_as("Hello world!", a, 3), "wrong split");
    EXPECT("presplit: of two spaces the last joins the word", splits_as("a  b", b, 3), "wrong split");
    EXPECT("presplit: newlines stay apart from words", splits_as("x\n\ny", c, 4), "wrong split");
    EXPECT("presplit: contractions split as in GPT-2", splits_as("don't stop 's", d, 5), "wrong split");
    EXPECT("presplit: digits and punctuation", splits_as("3.14 ,\n", e, 5), "wrong split");
    EXPECT("presplit: trailing spaces are one word", splits_as("ab  ", f, 2), "wrong split");
    EXPECT("presplit: non-ASCII counts as letters", splits_as(" \xc3\xa9t\xc3\xa9 \xe2\x80\x94", g, 2), "wrong split");
    char longrun[301];
    memset(longrun, 'q', 300), longrun[300] = '\0';
    size_t n1 = bpe_next_word(longrun, 300, 0), n3 = bpe_next_word(longrun, 300, 256);
    EXPECT("presplit: long runs are cut at BPE_MAX_WORD bytes", n1 == BPE_MAX_WORD && n3 == 300 - 256,
           "pieces of %zu and %zu bytes", n1, n3);
}

static void test_alphabet(void) {
    bool ok = bpe_byte_to_char(' ') == 0x120 && bpe_byte_to_char('\n') == 0x10A && bpe_byte_to_char('\t') == 0x109 &&
              bpe_byte_to_char(0x7F) == 0x121 && bpe_byte_to_char(0xAD) == 0x143 && bpe_byte_to_char('A') == 'A' &&
              bpe_byte_to_char(0xE9) == 0xE9;
    for (int b = 0; b < 256; b++) ok = ok && bpe_char_to_byte(bpe_byte_to_char(b)) == b;
    ok = ok && bpe_char_to_byte(' ') == -1 && bpe_char_to_byte(0x144) == -1 && bpe_char_to_byte(0xAD) == -1;
    EXPECT("alphabet: GPT-2's byte-to-unicode map (space is U+0120, soft hyphen U+0143)", ok, "a byte maps wrongly");
}

static void test_training(const char *corpus, size_t len, bpe_t *t) {
    EXPECT("train: vocabulary has the size asked for", bpe_vocab_size(t) == 600, "vocab %d", bpe_vocab_size(t));
    EXPECT("train: <|endoftext|> is the last id", bpe_eot_id(t) == 599 && bpe_is_special(t, 599), "eot id %d", bpe_eot_id(t));
    size_t n;
    const char *eot = bpe_token_bytes(t, bpe_eot_id(t), &n);
    EXPECT("train: the special token's text", n == 13 && !memcmp(eot, BPE_EOT, 13), "text '%.*s'", (int)n, eot);
    bpe_t *again = bpe_train(corpus, len, 600);
    bool same = bpe_num_merges(again) == bpe_num_merges(t) && bpe_fingerprint(again) == bpe_fingerprint(t);
    for (int r = 0; same && r < bpe_num_merges(t); r++)
        same = !memcmp(&t->merges[r], &again->merges[r], sizeof(bpe_merge_t));
    EXPECT("train: deterministic (twice on the same text, the same merges)", same, "the two runs differ");
    bpe_free(again);
    bpe_t *other = bpe_train(corpus, len, 500);
    EXPECT("train: the fingerprint tells tokenizers apart", bpe_fingerprint(other) != bpe_fingerprint(t), "equal fingerprints");
    bpe_free(other);
    bpe_t *tiny = bpe_train("abab", 4, 5000);
    EXPECT("train: a tiny corpus stops when no pair is left", bpe_vocab_size(tiny) == 259 && bpe_num_merges(tiny) == 2,
           "vocab %d, merges %d", bpe_vocab_size(tiny), bpe_num_merges(tiny));
    bpe_free(tiny);
}

// The incremental trainer against the naive one, on text with words and junk.
static void test_against_reference(const char *corpus, size_t len) {
    size_t junk_len = 3000, text_len = 12000 + junk_len;
    char *text = xmalloc(text_len), *junk = random_bytes(junk_len);
    memcpy(text, corpus, 12000), memcpy(text + 12000, junk, junk_len);
    int vocab = 500;
    bpe_t *t = bpe_train(text, text_len, vocab);
    bpe_merge_t *merges = xmalloc((size_t)vocab * sizeof *merges);
    char (*tokens)[BPE_MAX_WORD + 1] = xmalloc((size_t)vocab * sizeof *tokens);
    int *token_len = xmalloc((size_t)vocab * sizeof *token_len), ref_vocab;
    int n = ref_train(text, text_len, vocab, merges, tokens, token_len, &ref_vocab);
    bool same = n == bpe_num_merges(t) && ref_vocab == bpe_vocab_size(t);
    int first_diff = -1;
    for (int r = 0; same && r < n; r++)
        if (memcmp(&merges[r], &t->merges[r], sizeof *merges)) same = false, first_diff = r;
    EXPECT("train: same merges as the naive algorithm (recount everything per merge)", same,
           "merges %d vs %d, vocab %d vs %d, first difference at merge %d", n, bpe_num_merges(t), ref_vocab,
           bpe_vocab_size(t), first_diff);
    size_t count_fast, count_ref;
    uint16_t *fast = bpe_encode(t, text, text_len, &count_fast), *ref = ref_encode(t, text, text_len, &count_ref);
    EXPECT("encode: same tokens as replaying the merges in order", same_ids(fast, count_fast, ref, count_ref),
           "%zu vs %zu tokens", count_fast, count_ref);
    free(fast), free(ref), free(merges), free(tokens), free(token_len), free(text), free(junk);
    bpe_free(t);
    (void)len;
}

static void test_round_trips(const bpe_t *t, const char *corpus, size_t len) {
    EXPECT("roundtrip: the training text", round_trips(t, corpus, len), "decode(encode(text)) != text");
    size_t count;
    uint16_t *ids = bpe_encode(t, corpus, len, &count);
    EXPECT("encode: merges compress the training text (under 1 token per 2.5 bytes)", count * 5 < len * 2,
           "%zu bytes became %zu tokens", len, count);
    free(ids);
    size_t sizes[] = {0, 1, 2, 3, 7, 100, 4096, 65536};
    bool ok = true;
    for (int i = 0; i < 8; i++) {
        char *r = random_bytes(sizes[i]);
        ok = ok && round_trips(t, r, sizes[i]);
        free(r);
    }
    EXPECT("roundtrip: random bytes (NUL, invalid UTF-8, ...) of 0 to 64 KiB", ok, "a random buffer came back different");
    static const char tricky[] = "<|endoftext|> \xff\xfe\x00\x80 \xed\xa0\x80 caf\xc3\xa9 \xf0\x9f\x98\x80\t\r\n   ";
    EXPECT("roundtrip: \"<|endoftext|>\" in text stays text; bad UTF-8 and emoji survive",
           round_trips(t, tricky, sizeof tricky - 1), "came back different (or produced the end-of-text id)");
}

static void test_save_load(const bpe_t *t, const char *corpus, size_t len) {
    char dir[600], path[700], err[512] = "";
    snprintf(dir, sizeof dir, "%s/save", scratch); // an empty folder, to see leftovers
    CHECK_SYS(mkdir(dir, 0755));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    bool saved = bpe_save_json(t, path, err, sizeof err);
    EXPECT("save: writes tokenizer.json", saved, "%s", err);
    bpe_t *u = bpe_load_json(path, err, sizeof err);
    EXPECT("load: reads back what save wrote", u != NULL, "%s", err);
    if (!u) return;
    size_t n1, n2;
    uint16_t *a = bpe_encode(t, corpus, len, &n1), *b = bpe_encode(u, corpus, len, &n2);
    char *junk = random_bytes(5000);
    EXPECT("load: same fingerprint, same encoding, exact round trip",
           bpe_fingerprint(u) == bpe_fingerprint(t) && same_ids(a, n1, b, n2) && round_trips(u, junk, 5000) &&
               bpe_eot_id(u) == bpe_eot_id(t),
           "the loaded tokenizer differs");
    free(a), free(b), free(junk);
    bpe_free(u);
    size_t flen;
    char *text = read_file(path, &flen);
    json_doc j;
    char *parsed_text = xmalloc(flen + 1), why[200] = "";
    memcpy(parsed_text, text, flen);
    bool parsed = json_parse(parsed_text, flen, &j, why, sizeof why);
    const json_node *root = json_root(&j), *model = json_member(&j, root, "model");
    const json_node *vocab = json_member(&j, model, "vocab"), *merges = json_member(&j, model, "merges");
    const json_node *added = json_member(&j, root, "added_tokens");
    bool layout = parsed && bpe_json_string_is(json_member(&j, model, "type"), "BPE") && vocab &&
                  vocab->count == bpe_vocab_size(t) && merges && merges->count == bpe_num_merges(t) &&
                  added && added->count == 1 &&
                  bpe_json_string_is(json_member(&j, json_first(&j, added), "content"), BPE_EOT) &&
                  bpe_json_string_is(json_member(&j, json_member(&j, root, "pre_tokenizer"), "type"), "ByteLevel") &&
                  bpe_json_string_is(json_member(&j, json_member(&j, root, "decoder"), "type"), "ByteLevel") &&
                  strstr(text, "\"\xc4\xa0the\": ") != NULL; // " the" written as "Ġthe"
    EXPECT("save: Hugging Face tokenizer.json layout (model.vocab, model.merges, added_tokens, ByteLevel, Ġ)", layout,
           "a field is missing or wrong%s%s", why[0] ? ": " : "", why);
    json_free(&j);
    free(parsed_text);
    free(text);
    EXPECT("save: no temporary file left behind", count_files(dir) == 1, "%d files in %s", count_files(dir), dir);
}

// A file written by hand the way GPT-2's is: byte tokens not in byte order,
// the special token only in added_tokens, merges in both spellings.
static void test_foreign_file(void) {
    bpe_text s = {0};
    bpe_text_str(&s, "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|endoftext|>\", \"special\": true}],\n"
                     " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"},\n"
                     " \"model\": {\"type\": \"BPE\", \"merges\": [\"\\u0120 t\", [\"h\", \"e\"], \"\xc4\xa0t he\"],\n"
                     "  \"vocab\": {\"\xc4\xa0t\": 256, \"he\": 257, \"\\u0120the\": 258");
    for (int b = 0; b < 256; b++) { // id = 7b + 3 mod 256: a shuffle
        char utf8[4], line[64];
        int n = bpe_utf8_encode(bpe_byte_to_char(b), utf8);
        snprintf(line, sizeof line, ", \"%s%.*s\": %d", b == '"' || b == '\\' ? "\\" : "", n, utf8, (7 * b + 3) % 256);
        bpe_text_str(&s, line);
    }
    bpe_text_str(&s, "}}}\n");
    char path[600], err[512] = "";
    snprintf(path, sizeof path, "%s/foreign.json", scratch);
    write_file(path, s.data, s.len);
    free(s.data);
    bpe_t *t = bpe_load_json(path, err, sizeof err);
    EXPECT("load: a hand-written GPT-2 style file", t != NULL, "%s", err);
    if (!t) return;
    size_t n1, n2;
    uint16_t *a = bpe_encode(t, " the", 4, &n1), *b = bpe_encode(t, "the", 3, &n2);
    EXPECT("load: its merges apply (\" the\" -> [258], \"the\" -> [t, 257])",
           n1 == 1 && a[0] == 258 && n2 == 2 && b[0] == (7 * 't' + 3) % 256 && b[1] == 257 && bpe_eot_id(t) == 259,
           "got %zu and %zu tokens", n1, n2);
    free(a), free(b);
    bpe_free(t);
    unlink(path);
}

static void expect_refused(const char *name, const char *content, size_t len, const char *want) {
    char path[600], err[512] = "", test_name[160];
    snprintf(path, sizeof path, "%s/bad.json", scratch);
    write_file(path, content, len);
    bpe_t *t = bpe_load_json(path, err, sizeof err);
    snprintf(test_name, sizeof test_name, "load refuses: %s", name);
    EXPECT(test_name, !t && strstr(err, want) && !strchr(err, '\n'), "%s (wanted a one-line reason with '%s')",
           t ? "it loaded" : err, want);
    bpe_free(t);
    unlink(path);
}

static void test_fuzzed_files(const char *good, size_t len);

static void test_bad_files(void) {
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/template.json", scratch);
    bpe_t *small = bpe_train("ab ab ab ab cd", 14, 260); // merges: "a b", "Ġ ab", "Ġ c"
    if (!bpe_save_json(small, path, err, sizeof err)) die("%s", err);
    bpe_free(small);
    size_t len;
    char *good = read_file(path, &len);
    struct { const char *name, *from, *to, *want; } cases[] = {
        {"model.type is not BPE", "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type"},
        {"model.vocab of the wrong type", "\"vocab\": {", "\"vocab\": [], \"x\": {", "model.vocab should be an object"},
        {"model.merges of the wrong type", "\"merges\": [", "\"merges\": 3, \"y\": [", "model.merges should be an array"},
        {"missing model.vocab", "\"vocab\"", "\"vocabulary\"", "missing field model.vocab"},
        {"missing pre_tokenizer", "\"pre_tokenizer\"", "\"pre_tokenizer_\"", "missing field pre_tokenizer"},
        {"an id that is a string", "\"a\": 97", "\"a\": \"97\"", "no valid id"},
        {"a negative id", "\"a\": 97", "\"a\": -1", "no valid id"},
        {"an id beyond uint16", "\"a\": 97", "\"a\": 70000", "no valid id"},
        {"a fractional id", "\"a\": 97", "\"a\": 97.5", "no valid id"},
        {"two tokens with one id", "\"a\": 97", "\"a\": 98", "given to two tokens"},
        {"a gap in the ids", "\"a\": 97", "\"a\": 900", "id 97 is missing"},
        {"a token listed twice", "\"a\": 97", "\"a\": 97, \"a\": 97", "listed twice"},
        {"a byte without a token", "\"a\": 97", "\"aaa\": 97", "no token for byte 0x61"},
        {"a token outside the byte-level alphabet", "\"a\": 97", "\"a b\": 97", "byte-level alphabet"},
        {"a merge of an unknown token", "\"a b\"", "\"a q9\"", "not in model.vocab"},
        {"a merge whose result is not in the vocabulary", "\"\xc4\xa0 c\"", "\"c d\"", "makes a token that is not in model.vocab"},
        {"a merge without two halves", "\"a b\"", "\"ab\"", "is not \"left right\""},
        {"no <|endoftext|> token", "\"<|endoftext|>\", \"single", "\"<|other|>\", \"single", "no \"<|endoftext|>\""},
        {"special token ids disagree", "\"<|endoftext|>\": 259", "\"<|endoftext|>\": 258", "one id in model.vocab"},
        {"a bad escape", "\"a\": 97", "\"\\x61\": 97", "unknown escape"},
        {"a lone low surrogate", "\"a\": 97", "\"\\udc00\": 97", "surrogate"},
        {"a high surrogate without its pair", "\"a\": 97", "\"\\ud800a\": 97", "surrogate"},
        {"invalid UTF-8", "\"a\": 97", "\"\xff\": 97", "invalid UTF-8"},
        {"a raw newline inside a string", "\"a\": 97", "\"\n\": 97", "control character"},
        {"a number with a leading zero", "\"a\": 97", "\"a\": 097", "expected ',' or '}', found '9'"},
        {"text after the document", "\n}\n", "\n} x\n", "after the end"},
        {"a missing comma", "\"a\": 97,", "\"a\": 97 ", "expected ','"},
        {"a bare word", "null", "nul", "expected a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *bad = replaced(good, cases[i].from, cases[i].to);
        expect_refused(cases[i].name, bad, strlen(bad), cases[i].want);
        free(bad);
    }
    expect_refused("an empty file", "", 0, "found the end of the text");
    expect_refused("a truncated file", good, len / 2, "not valid JSON");
    expect_refused("an array at the top", "[1, 2]", 6, "not a JSON object");
    expect_refused("an empty object", "{}", 2, "missing field model");
    char deep[3000];
    memset(deep, '[', 1500), memset(deep + 1500, ']', 1500);
    expect_refused("nesting 1500 deep", deep, 3000, "nested deeper than");
    bpe_t *none = bpe_load_json("/nonexistent/tokenizer.json", err, sizeof err);
    EXPECT("load refuses: a missing file", !none && strstr(err, "cannot open"), "%s", none ? "it loaded" : err);
    bpe_free(none);
    test_fuzzed_files(good, len);
    free(good);
}

// Every prefix of a good file, and many copies with one byte changed: each
// is refused with a reason or, if still valid, gives exact round trips.
// Each is parsed from a heap block of exactly its size, so that AddressSanitizer
// catches any read past the end.
static void test_fuzzed_files(const char *good, size_t len) {
    char err[512];
    char *sample = random_bytes(2000);
    int refused = 0, loaded = 0, broken = 0, trials = (int)len + 2000;
    for (int trial = 0; trial < trials; trial++) {
        size_t n = trial < (int)len ? (size_t)trial : len;
        char *copy = xmalloc(n);
        memcpy(copy, good, n);
        if (trial >= (int)len) {
            uint64_t r = next_random();
            copy[r % len] = (char)(r >> 32); // one random byte anywhere
        }
        err[0] = '\0';
        bpe_t *t = bpe_parse_json(copy, n, "fuzz", err, sizeof err);
        bool good_reason = err[0] != '\0' && !strchr(err, '\n');
        if (!t) refused += good_reason, broken += !good_reason;
        else loaded++, broken += !round_trips(t, sample, 2000);
        bpe_free(t);
        free(copy);
    }
    EXPECT("load: truncated and corrupted files are refused with a reason, or still round-trip", broken == 0,
           "%d of %d files misbehaved (%d refused, %d loaded)", broken, trials, refused, loaded);
    free(sample);
}

static void test_articles(const bpe_t *t) {
    const char *text = " \n = Alpha = \n \n Alpha text . \n \n = = Section = = \n \n More text with x = 1 y = \n"
                       " = 1 k = \n \n = Beta = \n \n Beta text . \n \n = Gamma ( film ) = \n \n End . \n";
    bpe_ids_t ids = {0};
    size_t articles = wikitext_encode_text(t, text, strlen(text), &ids), back_len;
    char *back = bpe_decode(t, ids.ids, ids.count, &back_len);
    const char *want = "<|endoftext|> \n = Alpha = \n \n Alpha text . \n \n = = Section = = \n \n More text with x = 1 y = \n"
                       " = 1 k = \n<|endoftext|> \n = Beta = \n \n Beta text . \n<|endoftext|> \n = Gamma ( film ) = \n \n End . \n";
    EXPECT("wikitext: <|endoftext|> before each article (level-1 headings between blank lines only)",
           articles == 3 && !strcmp(back, want), "%zu articles; decoded: %s", articles, back);
    free(back), free(ids.ids);
}

static uint16_t *cached(const bpe_t *t, const char *text, size_t len, const char *path, size_t *count,
                        wikitext_cache_result *res) {
    return wikitext_encode_cached(t, text, len, path, count, res);
}

static void flip_byte(const char *path, size_t offset) {
    size_t len;
    char *data = read_file(path, &len);
    data[offset % len] ^= 0x40;
    write_file(path, data, len);
    free(data);
}

static void test_cache(const bpe_t *t, const char *corpus, size_t len) {
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/cache/nested", scratch);
    snprintf(path, sizeof path, "%s/train.tokens", dir);
    bpe_ids_t want = {0};
    wikitext_encode_text(t, corpus, len, &want);
    wikitext_cache_result r1, r2, r;
    size_t n1, n2, n;
    uint16_t *a = cached(t, corpus, len, path, &n1, &r1), *b = cached(t, corpus, len, path, &n2, &r2);
    EXPECT("cache: the first call encodes and writes the cache (making its folders)",
           !r1.from_cache && access(path, R_OK) == 0 && same_ids(a, n1, want.ids, want.count), "%s", r1.note);
    EXPECT("cache: the second call reads it", r2.from_cache && same_ids(b, n2, want.ids, want.count), "%s", r2.note);
    free(a), free(b);
    char *changed = xmalloc(len);
    memcpy(changed, corpus, len);
    changed[len / 2] = changed[len / 2] == 'x' ? 'y' : 'x';
    a = cached(t, changed, len, path, &n, &r);
    bpe_ids_t want2 = {0};
    wikitext_encode_text(t, changed, len, &want2);
    EXPECT("cache: changed text rebuilds it", !r.from_cache && strstr(r.note, "other text") && same_ids(a, n, want2.ids, want2.count),
           "from cache %d: %s", r.from_cache, r.note);
    free(a), free(changed), free(want2.ids);
    bpe_t *other = bpe_train(corpus, len, 400);
    a = cached(other, corpus, len, path, &n, &r);
    EXPECT("cache: another tokenizer rebuilds it", !r.from_cache && strstr(r.note, "another tokenizer"), "%s", r.note);
    free(a), bpe_free(other);
    a = cached(t, corpus, len, path, &n, &r), free(a); // back to this tokenizer
    struct { const char *name; size_t offset; const char *want; } damage[] = {
        {"a flipped token byte", WIKITEXT_CACHE_HEADER + 101, "damaged"},
        {"a flipped magic byte", 2, "not a token cache"},
        {"a flipped count", 64, "truncated"},
    };
    for (int i = 0; i < 3; i++) {
        flip_byte(path, damage[i].offset);
        a = cached(t, corpus, len, path, &n, &r);
        b = cached(t, corpus, len, path, &n2, &r2);
        char name[160];
        snprintf(name, sizeof name, "cache: %s is detected and the cache rebuilt", damage[i].name);
        EXPECT(name, !r.from_cache && strstr(r.note, damage[i].want) && same_ids(a, n, want.ids, want.count) && r2.from_cache,
               "first call: from cache %d, '%s'; second call: from cache %d", r.from_cache, r.note, r2.from_cache);
        free(a), free(b);
    }
    size_t clen;
    char *data = read_file(path, &clen);
    write_file(path, data, clen - 1); // cut short by one byte
    free(data);
    a = cached(t, corpus, len, path, &n, &r);
    EXPECT("cache: a file cut short is rebuilt", !r.from_cache && same_ids(a, n, want.ids, want.count), "%s", r.note);
    free(a);
    EXPECT("cache: only the cache file is left in its folder (no temporary files)", count_files(dir) == 1,
           "%d files in %s", count_files(dir), dir);
    a = cached(t, corpus, len, "/proc/no/such/dir/x.tokens", &n, &r);
    EXPECT("cache: an unwritable cache still gives the tokens, with a note", same_ids(a, n, want.ids, want.count) &&
           strstr(r.note, "could not write"), "%s", r.note);
    free(a), free(want.ids);
}

// Run wikitext_find in a child; its exit status and what it wrote on stderr.
static int find_in_child(const char *flag, const char *env, const char *root, char *out, size_t out_len) {
    int fds[2];
    CHECK_SYS(pipe(fds));
    pid_t pid = fork();
    CHECK_SYS(pid);
    if (pid == 0) {
        alarm(20); // never outlive the test
        dup2(fds[1], 2), close(fds[0]), close(fds[1]);
        if (env) setenv("WIKITEXT_DIR", env, 1);
        else unsetenv("WIKITEXT_DIR");
        wikitext_find(flag, root);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    struct pollfd p = {fds[0], POLLIN, 0};
    while (got + 1 < out_len && poll(&p, 1, 20000) > 0) {
        ssize_t n = read(fds[0], out + got, out_len - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fds[0]);
    int status;
    CHECK_SYS(waitpid(pid, &status, 0));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool one_line_with(const char *out, const char *a, const char *b) {
    const char *nl = strchr(out, '\n');
    return nl && nl[1] == '\0' && strstr(out, a) && strstr(out, b) && strstr(out, "make data") &&
           strstr(out, "WIKITEXT_DIR");
}

static void test_find(void) {
    char root[600], fake[600], out[4096], path[700];
    snprintf(root, sizeof root, "%s/project", scratch);
    snprintf(fake, sizeof fake, "%s/fake-wikitext", scratch);
    CHECK_SYS(mkdir(root, 0755));
    CHECK_SYS(mkdir(fake, 0755));
    int status = find_in_child(NULL, NULL, root, out, sizeof out);
    EXPECT("wikitext_find: nothing found -> one line saying how to get it", status == 1 &&
           one_line_with(out, "not found", "/data/wikitext-2"), "status %d, said: %s", status, out);
    status = find_in_child(NULL, "/nonexistent/wt2", root, out, sizeof out);
    EXPECT("wikitext_find: a wrong WIKITEXT_DIR is named", status == 1 &&
           one_line_with(out, "/nonexistent/wt2", "from WIKITEXT_DIR"), "status %d, said: %s", status, out);
    status = find_in_child("/nonexistent/flag", "/nonexistent/wt2", root, out, sizeof out);
    EXPECT("wikitext_find: --data_dir wins over WIKITEXT_DIR", status == 1 &&
           one_line_with(out, "/nonexistent/flag", "from --data_dir"), "status %d, said: %s", status, out);
    const char *splits[] = {"train", "valid", "test"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s.txt", fake, splits[i]);
        write_file(path, " = Not WikiText = \n", 19);
    }
    status = find_in_child(fake, NULL, root, out, sizeof out);
    EXPECT("wikitext_find: a wrong file is refused (size and sha256 checked)", status == 1 &&
           one_line_with(out, "train.txt has 19 bytes", "delete it"), "status %d, said: %s", status, out);
}

int main(int argc, char **argv) {
    if (argc > 1) snprintf(scratch, sizeof scratch, "%s/tokenizer-unit", argv[1]);
    else snprintf(scratch, sizeof scratch, "%s/test_gpt_tokenizer.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (argc > 1) CHECK_SYS(mkdir(scratch, 0755));
    else CHECK_PTR(mkdtemp(scratch));
    size_t len;
    char *corpus = make_corpus(&len);
    test_sha256();
    test_presplit();
    test_alphabet();
    bpe_t *t = bpe_train(corpus, len, 600);
    test_training(corpus, len, t);
    test_against_reference(corpus, len);
    test_round_trips(t, corpus, len);
    test_save_load(t, corpus, len);
    test_foreign_file();
    test_bad_files();
    test_articles(t);
    test_cache(t, corpus, len);
    test_find();
    bpe_free(t);
    free(corpus);
    remove_tree(scratch);
    return test_failures != 0;
}
