// seed_gen - writes the seed corpus of every fuzz target: small valid inputs
// that the fuzzers mutate (`make -C tests/fuzz seeds` rewrites corpus/).
// Usage: seed_gen DIR   (writes DIR/NAME/seed-*)
#include <sys/stat.h>

#include "fuzz.h"
#include "fuzz_wikitext.h"
#include "gpt.h"
#include "snapshot.h"
#include "store_wire.h"

static const char *out_dir;

static void put(const char *target, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, target);
    files_make_dirs_or_die(path);
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) die("cannot write %s", path);
}

static void put_text(const char *target, const char *name, const char *text) { put(target, name, text, strlen(text)); }

static char *slurp(const char *path, size_t *n) {
    char reason[256];
    char *data = bpe_read_file(path, n, reason, sizeof reason);
    if (!data) die("%s: %s", path, reason);
    return data;
}

static void json_seeds(void) {
    put_text("json", "seed-object", "{\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", \"o\": {}}");
    put_text("json", "seed-header", "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"2\",\"checksum\":\"crc32c:00000000\"},"
                                    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}");
    put_text("json", "seed-numbers", "[0, 18446744073709551615, 18446744073709551616, 1e308, -0.0, 123456789012345678901234567890]");
}

static void snapshot_seeds(void) {
    float w[6] = {1, 2, 3, 4, 5, 6};
    double lr = 0.01;
    int64_t step[1] = {42};
    uint8_t mask[3] = {1, 0, 1};
    safetensors_tensor t[] = {
        safetensors_tensor_of("w", "F32", w, 2, (int64_t[]){2, 3}), safetensors_tensor_of("lr", "F64", &lr, 0, NULL),
        safetensors_tensor_of("step", "I64", step, 1, (int64_t[]){1}), safetensors_tensor_of("mask", "U8", mask, 1, (int64_t[]){3}),
    };
    safetensors_meta m[] = {safetensors_meta_of("epoch", "%d", 3), safetensors_meta_of("note", "%s", "caf\xc3\xa9 \"q\" \\")};
    char path[1024], err[600];
    size_t n;
    snprintf(path, sizeof path, "%s/.seed.safetensors", out_dir);
    if (!snapshot_write(path, t, 4, m, 2, err, sizeof err)) die("%s", err);
    char *data = slurp(path, &n);
    put("snapshot", "seed-four-tensors.safetensors", data, n);
    free(data);
    if (!snapshot_write(path, NULL, 0, m, 1, err, sizeof err)) die("%s", err);
    data = slurp(path, &n);
    put("snapshot", "seed-no-tensors.safetensors", data, n);
    free(data);
    unlink(path);
}

static void tokenizer_seed(void) {
    char path[1024], err[600];
    size_t n;
    bpe_t *t = fuzz_wikitext_tokenizer();
    snprintf(path, sizeof path, "%s/.seed.json", out_dir);
    if (!bpe_save_json(t, path, err, sizeof err)) die("%s", err);
    char *data = slurp(path, &n);
    put("tokenizer", "seed-tokenizer.json", data, n);
    free(data);
    unlink(path);
    bpe_free(t);
}

static void wikitext_seeds(void) {
    put_text("wikitext", "seed-articles.txt", FUZZ_WIKITEXT_CORPUS " = Second = \n\n More text , \xff\xfe and a NUL-free line . \n");
    bpe_t *t = fuzz_wikitext_tokenizer();
    uint8_t sha[SHA256_DIGEST_BYTES];
    size_t count, n;
    char path[1024], err[600];
    const char *text = FUZZ_WIKITEXT_CACHE_TEXT;
    sha256(text, strlen(text), sha);
    uint16_t *ids = bpe_encode(t, text, strlen(text), &count);
    wikitext_cache_key key = {bpe_fingerprint(t), strlen(text), sha, bpe_vocab_size(t)};
    snprintf(path, sizeof path, "%s/.seed.tokens", out_dir);
    if (!wikitext_cache_write(path, key, ids, count, err, sizeof err)) die("%s", err);
    char *data = slurp(path, &n);
    put("wikitext", "seed-cache.tokens", data, n);
    free(data);
    free(ids);
    unlink(path);
    bpe_free(t);
}

static void flags_seeds(void) {
    static const char a[] = "\0\0\0--count\0005\0-v\0--max-bytes=64K\0--device\0cpu";
    static const char b[] = "7\0" "16M\0cuda\0--rate=0.25\0--name\0x\0-n\0" "3\0--verbose\0false";
    static const char c[] = "\0\0\0--help";
    put("flags", "seed-cli", a, sizeof a - 1);
    put("flags", "seed-env", b, sizeof b - 1);
    put("flags", "seed-help", c, sizeof c - 1);
}

// Store scripts: see fuzz_store.c for the step encoding.
static void seed_send(store_bytes_t *script, int client, const store_bytes_t *frame_body) {
    store_bytes_t frame = {0};
    store_put_uint(&frame, frame_body->len, 4);
    store_bytes_put(&frame, frame_body->data, frame_body->len);
    if (frame.len > 255) die("seed frame too long");
    store_put_uint(script, (uint64_t)client, 1); // what 0: send LEN bytes
    store_put_uint(script, frame.len, 1);
    store_bytes_put(script, frame.data, frame.len);
    store_bytes_free(&frame);
}

static void seed_request(store_bytes_t *script, int client, int op, const char *key,
                         const void *extra, size_t n) {
    store_bytes_t body = {0};
    store_put_uint(&body, (uint64_t)op, 1);
    store_put_key(&body, key);
    store_bytes_put(&body, extra, n);
    seed_send(script, client, &body);
    store_bytes_free(&body);
}

static void store_seeds(void) {
    store_bytes_t s = {0};
    store_put_uint(&s, 4 << 2 | 0, 1); // client 0: a correct hello
    store_put_uint(&s, 4 << 2 | 1, 1); // client 1 too
    seed_request(&s, 1, STORE_OP_GET, "k", "\0\0\x27\x10", 4);            // parks: waits 10 s for k
    seed_request(&s, 0, STORE_OP_SET, "k", "\0\0\0\3abc", 7);             // wakes client 1
    seed_request(&s, 0, STORE_OP_ADD, "n", "\0\0\0\0\0\0\0\5", 8);
    seed_request(&s, 0, STORE_OP_CHECK, "n", NULL, 0);
    seed_request(&s, 1, STORE_OP_WAIT, "never", "\0\0\0\1", 4);
    store_put_uint(&s, 6 << 2 | 1, 1);                                     // time passes: the wait times out
    seed_request(&s, 0, STORE_OP_DELETE, "k", NULL, 0);
    store_put_uint(&s, 5 << 2 | 0, 1);                                     // client 0 hangs up
    put("store", "seed-session", s.data, s.len);
    s.len = 0;
    store_bytes_t hello = {0};
    store_put_uint(&hello, STORE_OP_HELLO, 1);
    store_put_uint(&hello, STORE_MAGIC, 4);
    store_put_uint(&hello, STORE_VERSION, 2);
    store_put_key(&hello, "another-jobs-token");
    store_put_key(&hello, "");
    seed_send(&s, 2, &hello);                                        // refused: another job's token
    seed_request(&s, 2, STORE_OP_SET, "k", "\0\0\0\1x", 5);
    store_put_uint(&s, 7 << 2 | 3, 1);                                     // 2^63 as a length, then zeros
    store_put_uint(&s, 0, 1);
    store_put_uint(&s, 1, 1);
    put("store", "seed-strangers", s.data, s.len);
    store_bytes_free(&s);
    store_bytes_free(&hello);
}

static void gpt_weights_seed(void) {
    gpt_t m;
    char path[1024], err[600];
    size_t n;
    gpt_init(&m, (gpt_config){.vocab_size = 16, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4}, 7);
    snprintf(path, sizeof path, "%s/.seed-model.safetensors", out_dir);
    if (!gpt_save_safetensors(&m, path, err, sizeof err)) die("%s", err);
    char *data = slurp(path, &n);
    put("gpt_weights", "seed-tiny-model.safetensors", data, n);
    free(data);
    unlink(path);
    gpt_free(&m);
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: seed_gen DIR");
    out_dir = argv[1];
    files_make_dirs_or_die(out_dir);
    json_seeds();
    snapshot_seeds();
    tokenizer_seed();
    wikitext_seeds();
    flags_seeds();
    store_seeds();
    gpt_weights_seed();
    return 0;
}
