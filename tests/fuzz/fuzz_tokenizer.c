// fuzz_tokenizer - the tokenizer loader, gpt/bpe.h's
// bpe_parse_json (tokenizer.json: vocabulary, merges, added tokens).
//
// Input: the bytes of a tokenizer.json. Promises checked:
// - a refusal has a one-line reason;
// - an accepted tokenizer is usable: every byte has a token, the
//   end-of-text token is special, every merge joins two tokens into a
//   token that is their bytes side by side, and encoding then decoding any
//   text (a fixed sample and the input itself) gives back the same bytes;
// - saving it and loading it again gives the same tokenizer (fingerprint).
#include "fuzz.h"
#include "bpe.h"

static char save_path[256];

static void check_round_trip(const bpe_t *t, const char *text, size_t len) {
    size_t count, back_len;
    uint16_t *ids = bpe_encode(t, text, len, &count);
    for (size_t i = 0; i < count; i++) fuzz_check(ids[i] < bpe_vocab_size(t) && !bpe_is_special(t, ids[i]), "tokenizer: encode made a special or unknown id");
    char *back = bpe_decode(t, ids, count, &back_len);
    fuzz_check(back_len == len && memcmp(back, text, len) == 0, "tokenizer: decode(encode(text)) != text");
    free(back);
    free(ids);
}

static void check_accepted(const bpe_t *t, const uint8_t *data, size_t size) {
    fuzz_check(bpe_eot_id(t) >= 0 && bpe_is_special(t, bpe_eot_id(t)), "tokenizer: no special end-of-text token");
    for (int b = 0; b < 256; b++) fuzz_check(t->byte_to_id[b] >= 0, "tokenizer: a byte without a token");
    for (int r = 0; r < bpe_num_merges(t); r++) {
        bpe_merge_t m = bpe_merge(t, r);
        size_t la, lb, lr;
        const char *a = bpe_token_bytes(t, m.a, &la), *b = bpe_token_bytes(t, m.b, &lb), *res = bpe_token_bytes(t, m.result, &lr);
        fuzz_check(lr == la + lb && !memcmp(res, a, la) && !memcmp(res + la, b, lb), "tokenizer: a merge that is not its halves side by side");
    }
    static const char sample[] = " = Valkyria Chronicles = \n\n The game 's <unk> \xe2\x80\x94 caf\xc3\xa9 \xff\x00 12.5 \n";
    check_round_trip(t, sample, sizeof sample - 1);
    check_round_trip(t, (const char *)data, size < 512 ? size : 512);
    char err[512];
    fuzz_check(bpe_save_json(t, save_path, err, sizeof err), "tokenizer: cannot save a tokenizer it loaded");
    bpe_t *again = bpe_load_json(save_path, err, sizeof err);
    fuzz_check(again && bpe_fingerprint(again) == bpe_fingerprint(t), "tokenizer: saved and loaded again, it differs");
    bpe_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[600] = "";
    fuzz_quiet();
    if (!save_path[0]) { // tmpfs when there is one: the save is fsynced
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(save_path, sizeof save_path, "%s/fuzz-tokenizer-%d.json", dir, (int)getpid());
    }
    bpe_t *t = bpe_parse_json((const char *)data, size, "tokenizer.json", err, sizeof err);
    if (!t) {
        fuzz_check(fuzz_one_line(err), "tokenizer: refusal without a one-line reason");
        return 0;
    }
    check_accepted(t, data, size);
    bpe_free(t);
    unlink(save_path);
    return 0;
}
