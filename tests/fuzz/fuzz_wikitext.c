// fuzz_wikitext - the WikiText loader of gpt/wikitext.h: a text
// file read (bpe_read_file), its articles found and encoded
// (wikitext_encode_text), and the token cache file read back
// (wikitext_cache_read).
//
// Input: the bytes of a file, used both as a WikiText split and as a token
// cache. Invalid UTF-8, NUL bytes, CR, huge lines and lines of nothing but
// '=' are all fair. Promises checked:
// - the text is read whole, and its tokens decode to exactly the text with
//   one "<|endoftext|>" put before each article found;
// - a cache is either refused with a one-line note or gives ids that are all
//   inside the vocabulary, as many as the file holds.
#include "fuzz.h"
#include "wikitext.h"

#include "fuzz_wikitext.h"

static fuzz_file file;
static bpe_t *tok;
static uint8_t text_sha[SHA256_DIGEST_BYTES];

static void setup(void) {
    tok = fuzz_wikitext_tokenizer();
    sha256(FUZZ_WIKITEXT_CACHE_TEXT, strlen(FUZZ_WIKITEXT_CACHE_TEXT), text_sha);
}

// The decoded tokens must be the text with "<|endoftext|>" before each article.
static void check_encoding(const char *text, size_t len) {
    bpe_ids_t out = {0};
    size_t articles = wikitext_encode_text(tok, text, len, &out), eots = 0, pos = 0;
    for (size_t i = 0; i < out.count; i++) {
        size_t n;
        fuzz_check(out.ids[i] < bpe_vocab_size(tok), "wikitext: an id outside the vocabulary");
        if (out.ids[i] == bpe_eot_id(tok)) {
            eots++;
            continue;
        }
        const char *bytes = bpe_token_bytes(tok, out.ids[i], &n);
        fuzz_check(pos + n <= len && memcmp(text + pos, bytes, n) == 0, "wikitext: tokens do not decode to the text");
        pos += n;
    }
    fuzz_check(pos == len, "wikitext: tokens decode to less than the text");
    fuzz_check(eots == articles, "wikitext: end-of-text tokens differ from the articles found");
    free(out.ids);
}

static void check_cache(void) {
    wikitext_cache_key key = {bpe_fingerprint(tok), strlen(FUZZ_WIKITEXT_CACHE_TEXT), text_sha, bpe_vocab_size(tok)};
    size_t count = 0;
    char note[320] = "";
    uint16_t *ids = wikitext_cache_read(file.path, key, &count, note, sizeof note);
    if (!ids) {
        fuzz_check(fuzz_one_line(note), "wikitext: cache refused without a one-line note");
        return;
    }
    for (size_t i = 0; i < count; i++) fuzz_check(ids[i] < bpe_vocab_size(tok), "wikitext: cache gave an id outside the vocabulary");
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char reason[256] = "";
    size_t len = 0;
    fuzz_quiet();
    if (!tok) setup();
    fuzz_file_put(&file, data, size);
    char *text = bpe_read_file(file.path, &len, reason, sizeof reason);
    fuzz_check(text && len == size && memcmp(text, data, size) == 0 && text[len] == '\0', "wikitext: the file was not read whole");
    check_encoding(text, len);
    free(text);
    check_cache();
    return 0;
}
