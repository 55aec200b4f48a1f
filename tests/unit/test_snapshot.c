// Unit tests of common/snapshot.h and the JSON reader under it: a round trip,
// the bytes on disk, every kind of damage refused with its own message,
// series with keep-K and fallback to an older snapshot, and fuzzing.
// (Killing a writer mid-write needs a second process: tests/library/test_snapshot.sh.)
// Usage: test_snapshot [SCRATCH_DIR]   (default: a new directory under /tmp)
#include <ftw.h>

#include "rng.h"
#include "snapshot.h"
#include "test.h"

static char scratch[512];

static const char *in_scratch(const char *name) {
    static char path[4][700];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", scratch, name);
    return p;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK_PTR(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = xmalloc((size_t)size + 1);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) die("cannot read %s", path);
    fclose(f);
    *n = (size_t)size;
    return buf;
}

static void spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_PTR(f);
    if (n && fwrite(data, 1, n, f) != n) die("cannot write %s", path);
    if (fclose(f) != 0) die("cannot close %s", path);
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// ---------------------------------------------------------------- a sample state

typedef struct {
    float w[12];
    double lr;
    int64_t rng[2];
    uint8_t mask[5];
    uint16_t half[3];
    safetensors_tensor t[6];
    safetensors_meta m[5];
} sample;

static void make_sample(sample *s, uint64_t seed) {
    rng_t r = rng_seed(seed);
    for (int i = 0; i < 12; i++) s->w[i] = (float)rng_normal(&r);
    s->lr = rng_uniform(&r);
    s->rng[0] = (int64_t)rng_next(&r);
    s->rng[1] = -5;
    for (int i = 0; i < 5; i++) s->mask[i] = (uint8_t)rng_below(&r, 256);
    for (int i = 0; i < 3; i++) s->half[i] = (uint16_t)rng_below(&r, 65536);
    // Odd sizes and mixed element sizes, so the writer has to order them for alignment.
    s->t[0] = safetensors_tensor_of("mask", "U8", s->mask, 1, (int64_t[]){5});
    s->t[1] = safetensors_tensor_of("model.w", "F32", s->w, 2, (int64_t[]){3, 4});
    s->t[2] = safetensors_tensor_of("half", "BF16", s->half, 1, (int64_t[]){3});
    s->t[3] = safetensors_tensor_of("lr", "F64", &s->lr, 0, NULL);
    s->t[4] = safetensors_tensor_of("rng", "I64", s->rng, 1, (int64_t[]){2});
    s->t[5] = safetensors_tensor_of("empty", "F32", NULL, 2, (int64_t[]){0, 7});
    s->m[0] = safetensors_meta_of("epoch", "%d", 3);
    s->m[1] = safetensors_meta_of("features", "%d", 64);
    s->m[2] = safetensors_meta_of("config", "%s", "lr=0.01 \"quoted\" back\\slash caf\xc3\xa9");
    s->m[3] = safetensors_meta_of("empty_value", "%s", "");
    s->m[4] = safetensors_meta_of("step", "%llu", (unsigned long long)seed);
}

static bool same_tensor(const safetensors_tensor *a, const safetensors_tensor *b) {
    if (!a || !b || strcmp(a->dtype, b->dtype) || a->ndim != b->ndim || a->bytes != b->bytes) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return a->bytes == 0 || memcmp(a->data, b->data, a->bytes) == 0;
}

static void expect_refused(const char *name, const char *path, const char *want) {
    safetensors_t s;
    char err[600] = "";
    bool ok = snapshot_read(path, &s, err, sizeof err);
    EXPECT(name, !ok && strstr(err, want) && !strchr(err, '\n') && s.tensors == NULL,
           "read %s with message '%s'; expected a refusal saying '%s'", ok ? "succeeded" : "failed", err, want);
    if (ok) safetensors_release(&s);
    if (getenv("TEST_SNAPSHOT_VERBOSE")) fprintf(stderr, "    message: %s\n", err);
}

// ---------------------------------------------------------------- round trip and layout

static void test_round_trip(void) {
    sample a;
    safetensors_t s;
    char err[600] = "";
    const char *path = in_scratch("round.safetensors");
    make_sample(&a, 7);
    bool wrote = snapshot_write(path, a.t, 6, a.m, 5, err, sizeof err);
    EXPECT("snapshot: write succeeds", wrote, "%s", err);
    bool ok = snapshot_read(path, &s, err, sizeof err);
    EXPECT("snapshot: read back succeeds", ok, "%s", err);
    if (!ok) return;
    int same = 0;
    for (int i = 0; i < 6; i++) same += same_tensor(safetensors_find(&s, a.t[i].name), &a.t[i]);
    EXPECT("snapshot: round trip gives identical tensors", same == 6 && s.num_tensors == 6, "%d of 6 identical, %d read", same, s.num_tensors);
    int meta = 0;
    for (int i = 0; i < 5; i++) meta += safetensors_meta_get(&s, a.m[i].key) && !strcmp(safetensors_meta_get(&s, a.m[i].key), a.m[i].value);
    EXPECT("snapshot: round trip gives identical metadata (quotes, backslash, UTF-8, empty)", meta == 5, "%d of 5 identical", meta);
    EXPECT("snapshot: format, version and checksum are recorded",
           !strcmp(safetensors_meta_get(&s, "format"), "course-snapshot") && !strcmp(safetensors_meta_get(&s, "version"), "2") &&
               !strncmp(safetensors_meta_get(&s, "checksum"), "crc32c:", 7) && s.num_meta == 8,
           "format=%s num_meta=%d", safetensors_meta_get(&s, "format"), s.num_meta);
    int64_t epoch = 0;
    EXPECT("snapshot: meta_i64 reads a number", snapshot_meta_i64(&s, "epoch", &epoch, err, sizeof err) && epoch == 3, "%s", err);
    EXPECT("snapshot: meta_i64 refuses text", !snapshot_meta_i64(&s, "config", &epoch, err, sizeof err) && strstr(err, "not a whole number"), "%s", err);
    float w[12] = {0};
    EXPECT("snapshot: copy checks and copies a tensor",
           snapshot_copy(&s, "model.w", "F32", 2, (int64_t[]){3, 4}, w, err, sizeof err) && !memcmp(w, a.w, sizeof w), "%s", err);
    EXPECT("snapshot: the path it was read from is kept", !strcmp(s.path, path), "path '%s'", s.path);
    safetensors_release(&s);
    EXPECT("snapshot: release empties the struct", s.tensors == NULL && s.blob == NULL && s.num_tensors == 0, "not emptied");
}

// The bytes on disk, checked without the library's reader: what a Python
// safetensors user relies on.
static void test_layout(void) {
    size_t n;
    unsigned char *file = slurp(in_scratch("round.safetensors"), &n);
    uint64_t hlen = n >= 8 ? le64(file) : 0;
    EXPECT("layout: starts with the header length, a multiple of 8 that fits", n >= 8 && hlen % 8 == 0 && hlen + 8 <= n,
           "file %zu bytes, header length %llu", n, (unsigned long long)hlen);
    if (!(n >= 8 && hlen + 8 <= n)) { free(file); return; }
    char *header = xmalloc(hlen + 1), err[200];
    memcpy(header, file + 8, hlen);
    header[hlen] = '\0';
    size_t json_end = hlen;
    while (json_end > 0 && header[json_end - 1] == ' ') json_end--;
    json_doc doc;
    bool parsed = header[0] == '{' && json_parse(header, hlen, &doc, err, sizeof err);
    EXPECT("layout: header is JSON starting with '{', padded with spaces", parsed && hlen - json_end < 8, "%s", err);
    if (!parsed) { free(header); free(file); return; }
    const json_node *root = json_root(&doc), *meta = json_member(&doc, root, "__metadata__");
    const json_node *format = json_member(&doc, meta, "format");
    EXPECT("layout: __metadata__ holds format=course-snapshot as a string",
           meta && format && format->type == JSON_STRING && !strcmp(format->text, "course-snapshot"), "no such entry");
    uint64_t begins[16], ends[16], data = n - 8 - hlen, covered = 0;
    int count = 0, aligned = 1, w_ok = 0;
    for (const json_node *e = json_first(&doc, root); e && count < 16; e = json_next(&doc, e)) {
        if (e == meta) continue;
        const json_node *off = json_member(&doc, e, "data_offsets"), *dt = json_member(&doc, e, "dtype");
        if (!off || !dt || !json_u64(json_first(&doc, off), &begins[count]) || !json_u64(json_next(&doc, json_first(&doc, off)), &ends[count])) break;
        aligned &= begins[count] % safetensors_dtype_size(dt->text) == 0;
        covered += ends[count] - begins[count];
        if (!strcmp(e->key, "model.w")) {
            sample a;
            make_sample(&a, 7);
            w_ok = ends[count] - begins[count] == sizeof a.w && !memcmp(file + 8 + hlen + begins[count], a.w, sizeof a.w);
        }
        count++;
    }
    int contiguous = count == 6 && covered == data;
    for (int i = 0; contiguous && i < count; i++) { // every begin is 0 or some other tensor's end
        int found = begins[i] == 0;
        for (int j = 0; j < count && !found; j++) found = j != i && ends[j] == begins[i] && ends[j] > begins[j];
        contiguous = found || begins[i] == ends[i];
    }
    EXPECT("layout: data offsets are contiguous and cover the data exactly", contiguous, "%d tensors cover %llu of %llu bytes", count,
           (unsigned long long)covered, (unsigned long long)data);
    EXPECT("layout: each tensor starts at a multiple of its element size", aligned, "a tensor is misaligned");
    EXPECT("layout: tensor bytes are stored raw (little-endian) at their offsets", w_ok, "model.w bytes differ");
    json_free(&doc);
    free(header);
    free(file);
}

static void test_crc(void) {
    crc32c_t c;
    crc32c_init(&c);
    crc32c_update(&c, "123456789", 9);
    uint32_t whole = crc32c_final(&c);
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    crc32c_init(&c);
    crc32c_update(&c, buf, 1000);
    uint32_t one = crc32c_final(&c);
    crc32c_init(&c);
    crc32c_update(&c, buf, 3); // split at odd places: the 8-byte path and the byte path agree
    crc32c_update(&c, buf + 3, 500);
    crc32c_update(&c, buf + 503, 497);
    EXPECT("crc32c: standard check value and chunking", whole == 0xE3069283u && one == crc32c_final(&c),
           "crc('123456789') = %08x, want e3069283", whole);
}

// ---------------------------------------------------------------- damaged files

// The CRC32C of a whole file (length, header, data) with the 8 digits after
// "crc32c:" at digits taken as "00000000": the reader's rule, written out
// independently of snapshot.h's helpers.
static uint32_t whole_file_crc(const unsigned char *file, size_t n, size_t digits) {
    crc32c_t c;
    crc32c_init(&c);
    crc32c_update(&c, file, digits);
    crc32c_update(&c, "00000000", 8);
    crc32c_update(&c, file + digits + 8, n - digits - 8);
    return crc32c_final(&c);
}

// Rewrites the checksum of a file after a deliberate change, as a forger (or
// a careful editor) would: a file that must be refused for its content, not
// for its checksum.
static void reseal(unsigned char *file, size_t n) {
    char *at = memmem(file, n, "\"checksum\":\"crc32c:", 19);
    if (!at) die("reseal: no checksum in the file");
    size_t digits = (size_t)(at - (char *)file) + 19;
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", whole_file_crc(file, n, digits));
    memcpy(file + digits, hex, 8);
}

// A file with the given header text (padded) and data; "%c" in the header
// is replaced by the checksum of the whole file, as crc32c:<hex>.
static void craft(const char *path, const char *header_fmt, const void *data, size_t n) {
    char header[2048];
    const char *mark = strstr(header_fmt, "%c");
    if (mark) snprintf(header, sizeof header, "%.*scrc32c:00000000%s", (int)(mark - header_fmt), header_fmt, mark + 2);
    else snprintf(header, sizeof header, "%s", header_fmt);
    size_t hlen = strlen(header);
    while (hlen % 8) header[hlen++] = ' ';
    unsigned char *file = xmalloc(8 + hlen + n);
    put_le64(file, hlen);
    memcpy(file + 8, header, hlen);
    if (n) memcpy(file + 8 + hlen, data, n);
    if (mark) reseal(file, 8 + hlen + n);
    spit(path, file, 8 + hlen + n);
    free(file);
}

#define META "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"2\",\"checksum\":\"%c\"}"
#define F32(name, shape, b, e) ",\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void refused_header(const char *name, const char *header, size_t data_bytes, const char *want) {
    unsigned char data[512] = {0};
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;
    craft(in_scratch("crafted.safetensors"), header, data, data_bytes);
    expect_refused(name, in_scratch("crafted.safetensors"), want);
}

static void test_crafted(void) {
    craft(in_scratch("ok.safetensors"), META F32("a", "[2,2]", 0, 16) F32("b", "[]", 16, 20) "}", "0123456789abcdefghij", 20);
    safetensors_t s;
    char err[600];
    bool ok = snapshot_read(in_scratch("ok.safetensors"), &s, err, sizeof err);
    EXPECT("crafted: a hand-made valid file loads (scalar shape [])", ok && s.num_tensors == 2 && safetensors_find(&s, "b")->ndim == 0, "%s", err);
    if (ok) safetensors_release(&s);
    refused_header("refused: non-JSON header", "{this is not json}", 0, "bad header: JSON error at line 1, column 2 (byte 1)");
    refused_header("refused: header that is not an object", "[1,2,3]", 0, "does not start with '{'");
    refused_header("refused: trailing comma", META F32("a", "[1]", 0, 4) ",}", 4, "JSON error");
    refused_header("refused: unknown dtype", META ",\"x\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'x' has unknown dtype 'F33'");
    refused_header("refused: overlapping offsets", META F32("a", "[4]", 0, 16) F32("b", "[4]", 8, 24) "}", 24, "tensors 'a' [0, 16] and 'b' [8, 24] overlap");
    refused_header("refused: a gap between tensors", META F32("a", "[4]", 0, 16) F32("b", "[4]", 24, 40) "}", 40, "bytes [16, 24) of the data belong to no tensor");
    refused_header("refused: bytes after the last tensor", META F32("a", "[4]", 0, 16) "}", 24, "bytes [16, 24) of the data belong to no tensor");
    refused_header("refused: shape and offsets disagree", META F32("a", "[3]", 0, 16) "}", 16, "tensor 'a' is F32 [3] but its data_offsets [0, 16] hold 16 bytes");
    refused_header("refused: offsets end before they begin", META F32("a", "[4]", 16, 0) "}", 16, "end before they begin");
    refused_header("refused: offsets beyond the data", META F32("w", "[100]", 0, 400) "}", 256, "tensor 'w' data_offsets [0, 400] end beyond the data (256 bytes)");
    refused_header("refused: duplicate tensor names", META F32("a", "[1]", 0, 4) F32("a", "[1]", 4, 8) "}", 8, "two tensors are named 'a'");
    refused_header("refused: metadata value that is not a string",
                   "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"2\",\"checksum\":\"%c\",\"epoch\":3}}", 0, "metadata 'epoch' is a JSON number, not a string");
    refused_header("refused: no __metadata__", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "has no __metadata__");
    refused_header("refused: another format", "{\"__metadata__\":{\"format\":\"pt\"}}", 0, "not a course snapshot: format is 'pt'");
    refused_header("refused: another version (1: the CRC did not cover the header)",
                   "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"1\",\"checksum\":\"%c\"}}", 0, "version '1' is not supported");
    refused_header("refused: the checksum spelled with a JSON escape",
                   "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"2\",\"checksum\":\"\\u0063rc32c:00000000\"}}", 0,
                   "the checksum is written with JSON escapes");
    refused_header("refused: malformed checksum", "{\"__metadata__\":{\"format\":\"course-snapshot\",\"version\":\"2\",\"checksum\":\"md5:1\"}}", 0, "checksum 'md5:1' is not");
    refused_header("refused: misaligned tensor", META ",\"m\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}" F32("f", "[1]", 1, 5) "}", 5, "not a multiple of its element size 4");
    refused_header("refused: negative dimension", META F32("a", "[-1]", 0, 4) "}", 4, "shape entry 1 is not a non-negative integer");
    refused_header("refused: fractional offset", META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, "data_offsets is not [begin, end]");
    refused_header("refused: shape whose size overflows", META F32("a", "[4294967296,4294967296]", 0, 0) "}", 0, "hold 0 bytes");
    refused_header("refused: too many dimensions", META F32("a", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, "has 9 dimensions");
    refused_header("refused: unexpected key in a tensor", META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unexpected key 'x'");
    refused_header("refused: tensor without data_offsets", META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, "tensor 'a' has no data_offsets");
    refused_header("refused: control character in a name", META F32("a\\u0001", "[1]", 0, 4) "}", 4, "holds a control character");
    refused_header("refused: invalid UTF-8 in a name", META F32("a\xff", "[1]", 0, 4) "}", 4, "invalid UTF-8");
    refused_header("refused: deep nesting", META ",\"a\":" "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                   "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 0, "nested deeper than 64 levels");
    refused_header("refused: two __metadata__", META ",\"__metadata__\":{}}", 0, "__metadata__ twice");
}

// Replaces the first `from` in the file's header by `to` (same length), writes
// the result, and expects a refusal saying `want`; with reseal the checksum is
// recomputed first, so only a check of the content itself can refuse it.
static void changed_header(const char *name, const unsigned char *good, size_t n, const char *from, const char *to,
                           bool with_reseal, const char *want) {
    unsigned char *bad = xmalloc(n);
    memcpy(bad, good, n);
    char *at = memmem(bad + 8, (size_t)le64(bad), from, strlen(from));
    if (!at || strlen(from) != strlen(to)) die("changed_header: '%s' not in the header", from);
    memcpy(at, to, strlen(to));
    if (with_reseal) reseal(bad, n);
    spit(in_scratch("changed.safetensors"), bad, n);
    expect_refused(name, in_scratch("changed.safetensors"), want);
    free(bad);
}

// The checksum covers the header too: changes that leave a well-formed
// header, which only the CRC can tell from the original.
static void test_damaged_header(const unsigned char *good, size_t n) {
    const char *crc = "checksum mismatch: header or tensor bytes changed";
    changed_header("refused: a changed metadata value (epoch 3 -> 4)", good, n, "\"epoch\":\"3\"", "\"epoch\":\"4\"", false, crc);
    changed_header("refused: a transposed shape with the same bytes", good, n, "[3,4]", "[4,3]", false, crc);
    changed_header("refused: a changed dtype of the same size (I64 -> F64)", good, n, "\"I64\"", "\"F64\"", false, crc);
    changed_header("refused: a space of the padding changed to a tab", good, n, "}  ", "}\t ", false, crc);
    safetensors_t s;
    char err[600] = "";
    unsigned char *copy = xmalloc(n);
    memcpy(copy, good, n);
    reseal(copy, n);
    spit(in_scratch("resealed.safetensors"), copy, n);
    bool ok = snapshot_read(in_scratch("resealed.safetensors"), &s, err, sizeof err);
    EXPECT("checksum: this test's independent CRC of the whole file agrees with the writer's", ok && !memcmp(copy, good, n), "%s", err);
    if (ok) safetensors_release(&s);
    free(copy);
}

static void test_damaged(void) {
    size_t n;
    unsigned char *good = slurp(in_scratch("round.safetensors"), &n), *bad = xmalloc(n);
    uint64_t hlen = le64(good);
    const char *path = in_scratch("damaged.safetensors");
    spit(path, good, n - 3);
    expect_refused("refused: truncated file", path, "end beyond the data");
    spit(path, good, 8 + hlen / 2);
    expect_refused("refused: truncated inside the header", path, "is larger than the file");
    spit(path, good, 5);
    expect_refused("refused: file shorter than 8 bytes", path, "too short for the 8-byte header length");
    memcpy(bad, good, n);
    bad[n - 20] ^= 0x10;
    spit(path, bad, n);
    expect_refused("refused: flipped byte in the tensor data", path, "checksum mismatch: header or tensor bytes changed (file damaged?)");
    test_damaged_header(good, n);
    memcpy(bad, good, n);
    put_le64(bad, 999999);
    spit(path, bad, n);
    char want[100];
    snprintf(want, sizeof want, "header length 999999 is larger than the file (%zu bytes)", n);
    expect_refused("refused: header length larger than the file", path, want);
    put_le64(bad, UINT64_MAX);
    spit(path, bad, n);
    expect_refused("refused: header length 2^64-1", path, "is larger than the file");
    expect_refused("refused: a directory", scratch, "not a regular file");
    expect_refused("refused: a missing file", in_scratch("no-such.safetensors"), "cannot open it: No such file");
    free(good);
    free(bad);
}

// ---------------------------------------------------------------- expectations and bad writes

static void test_expect(void) {
    sample a;
    safetensors_t s;
    char err[600] = "";
    make_sample(&a, 7);
    if (!snapshot_read(in_scratch("round.safetensors"), &s, err, sizeof err)) { EXPECT("expect: read", false, "%s", err); return; }
    EXPECT("expect: matching tensor passes", snapshot_expect_tensor(&s, "model.w", "F32", 2, (int64_t[]){3, 4}, err, sizeof err), "%s", err);
    EXPECT("expect: wrong shape names both shapes", !snapshot_expect_tensor(&s, "model.w", "F32", 2, (int64_t[]){4, 3}, err, sizeof err) &&
           !strcmp(err, "tensor 'model.w' has shape [3, 4] in the snapshot but this run expects [4, 3]"), "%s", err);
    EXPECT("expect: wrong rank is a wrong shape", !snapshot_expect_tensor(&s, "model.w", "F32", 1, (int64_t[]){12}, err, sizeof err) &&
           strstr(err, "expects [12]"), "%s", err);
    EXPECT("expect: wrong dtype", !snapshot_expect_tensor(&s, "model.w", "F64", 2, (int64_t[]){3, 4}, err, sizeof err) &&
           !strcmp(err, "tensor 'model.w' is F32 in the snapshot but this run expects F64"), "%s", err);
    EXPECT("expect: missing tensor", !snapshot_expect_tensor(&s, "model.b", "F32", 1, (int64_t[]){1}, err, sizeof err) &&
           strstr(err, "snapshot has no tensor 'model.b'"), "%s", err);
    EXPECT("expect: matching metadata passes", snapshot_expect_meta(&s, "features", "64", err, sizeof err), "%s", err);
    EXPECT("expect: wrong model size names both values", !snapshot_expect_meta(&s, "features", "1", err, sizeof err) &&
           !strcmp(err, "snapshot has features=64 but this run has features=1"), "%s", err);
    EXPECT("expect: missing metadata", !snapshot_expect_meta(&s, "world_size", "2", err, sizeof err) &&
           !strcmp(err, "snapshot has no world_size (this run has world_size=2)"), "%s", err);
    safetensors_release(&s);
}

static void expect_write_refused(const char *name, const safetensors_tensor *t, int nt, const safetensors_meta *m, int nm, const char *want) {
    char err[600] = "";
    const char *path = in_scratch("refused-write.safetensors");
    bool ok = snapshot_write(path, t, nt, m, nm, err, sizeof err);
    EXPECT(name, !ok && strstr(err, want) && access(path, F_OK) != 0, "wrote=%d message '%s', want '%s'", ok, err, want);
}

static void test_bad_writes(void) {
    sample a;
    make_sample(&a, 1);
    safetensors_tensor t[6];
    safetensors_meta m[5];
    memcpy(t, a.t, sizeof t);
    snprintf(t[2].name, sizeof t[2].name, "model.w");
    expect_write_refused("write refused: duplicate tensor names", t, 6, a.m, 5, "two tensors are named 'model.w'");
    memcpy(t, a.t, sizeof t);
    t[1].bytes = 10;
    expect_write_refused("write refused: bytes disagree with the shape", t, 6, a.m, 5, "but its bytes field says 10");
    memcpy(t, a.t, sizeof t);
    snprintf(t[1].dtype, sizeof t[1].dtype, "F33");
    expect_write_refused("write refused: unknown dtype", t, 6, a.m, 5, "unknown dtype 'F33'");
    memcpy(m, a.m, sizeof m);
    snprintf(m[1].key, sizeof m[1].key, "checksum");
    expect_write_refused("write refused: reserved metadata key", a.t, 6, m, 5, "metadata key 'checksum' is reserved");
    memcpy(m, a.m, sizeof m);
    snprintf(m[1].value, sizeof m[1].value, "two\nlines");
    expect_write_refused("write refused: control character in a value", a.t, 6, m, 5, "holds a control character");
    memcpy(m, a.m, sizeof m);
    snprintf(m[1].key, sizeof m[1].key, "epoch");
    expect_write_refused("write refused: duplicate metadata key", a.t, 6, m, 5, "metadata key 'epoch' is given twice");
    char err[200];
    EXPECT("write: no tensors at all is a valid snapshot", snapshot_write(in_scratch("empty.safetensors"), NULL, 0, a.m, 5, err, sizeof err), "%s", err);
    safetensors_t s;
    EXPECT("read: a snapshot with no tensors", snapshot_read(in_scratch("empty.safetensors"), &s, err, sizeof err) && s.num_tensors == 0, "%s", err);
    safetensors_release(&s);
}

// ---------------------------------------------------------------- series

static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, needle) != NULL;
    closedir(d);
    return n;
}

static void flip_data_byte(const char *path) {
    size_t n;
    unsigned char *file = slurp(path, &n);
    file[n - 1] ^= 0x01;
    spit(path, file, n);
    free(file);
}

static bool step_exists(const char *tmpl, int64_t step) {
    char path[800];
    return snapshot_step_path(tmpl, step, path, sizeof path) && access(path, F_OK) == 0;
}

static void test_series_keep(const char *tmpl, sample *a) {
    char err[600], report[2000], dir[700];
    safetensors_t s;
    bool saved = true;
    for (int step = 1; step <= 5; step++) saved &= snapshot_save_step(tmpl, step, a[step].t, 6, a[step].m, 5, 2, err, sizeof err);
    snprintf(dir, sizeof dir, "%s/series", scratch);
    EXPECT("series: steps 1..5 with keep 2 leave only steps 4 and 5", saved && count_files(dir, ".safetensors") == 2 &&
           step_exists(tmpl, 4) && step_exists(tmpl, 5) && count_files(dir, ".tmp") == 0, "%d files left", count_files(dir, ".safetensors"));
    int r = snapshot_load_latest(tmpl, &s, report, sizeof report);
    EXPECT("series: load_latest loads the newest, silently", r == 1 && !strcmp(safetensors_meta_get(&s, "step"), "5") && report[0] == '\0',
           "returned %d, report '%s'", r, report);
    if (r == 1) safetensors_release(&s);
    EXPECT("series: step path has 10 digits", snapshot_step_path("runs/x/snap.safetensors", 42, dir, sizeof dir) &&
           !strcmp(dir, "runs/x/snap.0000000042.safetensors") && snapshot_step_path("snap", 7, dir, sizeof dir) &&
           !strcmp(dir, "./snap.0000000007.safetensors") && !snapshot_step_path("x", -1, dir, sizeof dir), "'%s'", dir);
}

static void test_series_fallback(const char *tmpl, sample *a) {
    char err[600], report[2000], path[800];
    safetensors_t s;
    snapshot_step_path(tmpl, 5, path, sizeof path);
    flip_data_byte(path);
    int r = snapshot_load_latest(tmpl, &s, report, sizeof report);
    EXPECT("series: a damaged newest snapshot falls back to the older one", r == 1 && !strcmp(safetensors_meta_get(&s, "step"), "4") &&
           same_tensor(safetensors_find(&s, "model.w"), &a[4].t[1]), "returned %d", r);
    EXPECT("series: the report says which one was refused, why, and what was loaded",
           strstr(report, "snapshot.0000000005.safetensors is damaged (checksum mismatch") &&
           strstr(report, "\nresuming from older snapshot ") && strstr(report, "snapshot.0000000004.safetensors"), "report '%s'", report);
    if (r == 1) safetensors_release(&s);
    // A crashed writer's temporary file is never a candidate, and the next save removes it.
    snapshot_step_path(tmpl, 4, path, sizeof path);
    flip_data_byte(path);
    snprintf(path, sizeof path, "%s/series/.snapshot.0000000009.safetensors.12345.tmp", scratch);
    spit(path, "half a snapshot", 15);
    r = snapshot_load_latest(tmpl, &s, report, sizeof report);
    EXPECT("series: none valid returns -1 and reports each", r == -1 && strstr(report, "0000000005.safetensors is damaged") &&
           strstr(report, "0000000004.safetensors is damaged") && !strstr(report, ".tmp") && s.tensors == NULL, "returned %d, report '%s'", r, report);
    bool saved = snapshot_save_step(tmpl, 6, a[1].t, 6, a[1].m, 5, 1, err, sizeof err);
    snprintf(path, sizeof path, "%s/series", scratch);
    EXPECT("series: the next save removes stale temporary files and keeps 1", saved && count_files(path, ".tmp") == 0 &&
           count_files(path, ".safetensors") == 1, "%s", err);
    // An older step saved after a newer one (resumed from further back) is kept.
    saved = snapshot_save_step(tmpl, 3, a[3].t, 6, a[3].m, 5, 1, err, sizeof err);
    EXPECT("series: the snapshot just written is never pruned", saved && step_exists(tmpl, 3), "%s", err);
    snprintf(path, sizeof path, "%s/nothing-here/snapshot.safetensors", scratch);
    r = snapshot_load_latest(path, &s, report, sizeof report);
    EXPECT("series: no snapshot yet returns 0", r == 0 && report[0] == '\0', "returned %d, report '%s'", r, report);
}

static void test_series(void) {
    char tmpl[700];
    sample a[6];
    for (int step = 1; step <= 5; step++) make_sample(&a[step], (uint64_t)step);
    snprintf(tmpl, sizeof tmpl, "%s/series/snapshot.safetensors", scratch);
    test_series_keep(tmpl, a);
    test_series_fallback(tmpl, a);
}

// ---------------------------------------------------------------- JSON reader

static bool parses(const char *text) {
    char buf[256], err[200];
    json_doc doc;
    snprintf(buf, sizeof buf, "%s", text);
    bool ok = json_parse(buf, strlen(buf), &doc, err, sizeof err);
    json_free(&doc);
    return ok;
}

static void test_json(void) {
    char text[] = " {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\", \"o\": {}} ", err[200];
    json_doc doc;
    bool ok = json_parse(text, strlen(text), &doc, err, sizeof err);
    const json_node *root = json_root(&doc), *a = json_member(&doc, root, "a"), *s = json_member(&doc, root, "s");
    double d = 0;
    EXPECT("json: parses values, escapes and surrogate pairs", ok && root->count == 3 && a->count == 5 &&
           json_double(json_next(&doc, json_first(&doc, a)), &d) && d == -2500.0 &&
           !strcmp(s->text, "x\xc3\xa9\xf0\x9f\x98\x80\n\"") && s->len == 9, "%s", ok ? "wrong values" : err);
    json_free(&doc);
    const char *bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "-", "1e", "tru", "\"abc", "\"\\x\"", "\"\\ud800\"",
                         "\"\\udc00\"", "\"a\tb\"", "{\"a\" 1}", "{1:2}", "[1 2]", "1 2", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "nul"};
    int refused = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) refused += !parses(bad[i]);
    EXPECT("json: refuses malformed text", refused == (int)(sizeof bad / sizeof bad[0]), "%d of %zu refused", refused, sizeof bad / sizeof bad[0]);
    EXPECT("json: accepts scalars and nesting", parses("0") && parses("-0.5E+2") && parses("[[[]],{}]") && parses("\"\""), "refused");
    uint64_t v;
    char big[] = "[18446744073709551615, 18446744073709551616, 1e3]";
    ok = json_parse(big, strlen(big), &doc, err, sizeof err);
    const json_node *n0 = json_first(&doc, json_root(&doc)), *n1 = json_next(&doc, n0), *n2 = json_next(&doc, n1);
    EXPECT("json: u64 takes plain integers up to 2^64-1 only", ok && json_u64(n0, &v) && v == UINT64_MAX && !json_u64(n1, &v) && !json_u64(n2, &v), "wrong");
    json_free(&doc);
}

// ---------------------------------------------------------------- fuzzing

static const char json_chars[] = "{}[]\",:0123456789-+.eE \\u\"atrfn";

static void mutate(rng_t *r, unsigned char *buf, size_t *len, size_t cap, size_t header_end) {
    size_t where = *len ? (size_t)rng_below(r, *len) : 0;
    if (rng_below(r, 10) < 7 && header_end > 8 && header_end <= *len) where = 8 + (size_t)rng_below(r, header_end - 8);
    switch (rng_below(r, 7)) {
    case 0: if (*len) buf[where] ^= (unsigned char)(1u << rng_below(r, 8)); break;
    case 1: if (*len) buf[where] = (unsigned char)json_chars[rng_below(r, sizeof json_chars - 1)]; break;
    case 2: *len = (size_t)rng_below(r, *len + 1); break;
    case 3:
        if (*len < cap && where <= *len) {
            memmove(buf + where + 1, buf + where, *len - where);
            buf[where] = (unsigned char)json_chars[rng_below(r, sizeof json_chars - 1)];
            (*len)++;
        }
        break;
    case 4: if (*len) { memmove(buf + where, buf + where + 1, *len - where - 1); (*len)--; } break;
    case 5: if (*len >= 8) put_le64(buf, le64(buf) + (uint64_t)rng_below(r, 33) - 16); break;
    default: if (*len >= 8) put_le64(buf, rng_next(r) >> rng_below(r, 64)); break;
    }
}

// Every read of a mutated file must either succeed with consistent tensors
// or fail with a one-line reason; under ASan/UBSan also without a memory error.
static void test_fuzz(int rounds) {
    size_t n;
    unsigned char *good = slurp(in_scratch("round.safetensors"), &n), *buf = xmalloc(n + 64);
    size_t header_end = 8 + (size_t)le64(good);
    const char *path = in_scratch("fuzz.safetensors");
    rng_t r = rng_seed(20240601);
    int accepted = 0, refused = 0, broken = 0;
    char first_broken[700] = "";
    for (int i = 0; i < rounds; i++) {
        size_t len = n;
        memcpy(buf, good, n);
        for (int k = 1 + (int)rng_below(&r, 3); k > 0; k--) mutate(&r, buf, &len, n + 64, header_end);
        if (i % 10 == 9) { // now and then pure garbage
            len = (size_t)rng_below(&r, n + 64);
            for (size_t j = 0; j < len; j++) buf[j] = (unsigned char)rng_next(&r);
            if (len >= 9 && i % 20 == 9) {
                put_le64(buf, (uint64_t)rng_below(&r, len - 7));
                buf[8] = (unsigned char)'{';
            }
        }
        spit(path, buf, len);
        safetensors_t s;
        char err[600] = "";
        if (snapshot_read(path, &s, err, sizeof err)) {
            bool sane = true;
            for (int t = 0; t < s.num_tensors; t++) {
                const char *p = s.tensors[t].data;
                sane &= p >= (const char *)s.blob && p + s.tensors[t].bytes <= (const char *)s.blob + s.blob_bytes;
            }
            if (sane) accepted++;
            else if (!broken++) snprintf(first_broken, sizeof first_broken, "round %d: accepted a tensor outside the data", i);
            safetensors_release(&s);
        } else if (err[0] && !strchr(err, '\n') && !s.tensors && !s.meta && !s.blob) refused++;
        else if (!broken++) snprintf(first_broken, sizeof first_broken, "round %d: bad refusal '%s'", i, err);
    }
    if (getenv("TEST_SNAPSHOT_VERBOSE")) fprintf(stderr, "    fuzz: %d refused, %d accepted\n", refused, accepted);
    EXPECT("fuzz: random mutations are read or refused cleanly", broken == 0 && refused > rounds / 2, "%d broken (%s), %d refused, %d accepted",
           broken, first_broken, refused, accepted);
    free(good);
    free(buf);
}

static void test_json_fuzz(int rounds) {
    rng_t r = rng_seed(99);
    char text[64], err[200];
    int bad_errors = 0;
    for (int i = 0; i < rounds; i++) {
        size_t len = (size_t)rng_below(&r, sizeof text);
        for (size_t j = 0; j < len; j++) text[j] = json_chars[rng_below(&r, sizeof json_chars - 1)];
        json_doc doc;
        err[0] = '\0';
        if (!json_parse(text, len, &doc, err, sizeof err) && (!err[0] || doc.nodes)) bad_errors++;
        json_free(&doc);
    }
    EXPECT("fuzz: random JSON-like text is parsed or refused with a reason", bad_errors == 0, "%d refusals without a reason", bad_errors);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        snprintf(scratch, sizeof scratch, "%s", argv[1]);
        files_make_dirs_or_die(scratch);
    } else {
        snprintf(scratch, sizeof scratch, "%s/test_snapshot.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        CHECK_PTR(mkdtemp(scratch));
    }
    test_crc();
    test_json();
    test_round_trip();
    test_layout();
    test_crafted();
    test_damaged();
    test_expect();
    test_bad_writes();
    test_series();
    test_fuzz(3000);
    test_json_fuzz(3000);
    if (argc <= 1) nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_failures != 0;
}
