// fuzz_snapshot - the snapshot reader, common/snapshot.h's snapshot_read.
//
// Input: the bytes of a file. Each input is read twice: as it is, and
// "resealed" (its checksum digits rewritten to the CRC of the file as it
// now is, when it has a literal "checksum":"crc32c:XXXXXXXX"), so that
// mutated headers get past the checksum and reach the code after it.
// Promises checked:
// - a refusal has a one-line reason and leaves the snapshot empty;
// - an accepted snapshot is what its header says: each tensor's bytes are
//   its dtype's size times its shape and lie inside the data, the tensors
//   cover the data back to back without overlap, names and metadata keys are
//   unique, the format is course-snapshot, and snapshot_expect_tensor
//   accepts each tensor as it was read.
#include "fuzz.h"
#include "snapshot.h"

static fuzz_file file;

typedef struct { size_t begin, end; } span;

static int by_begin(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void check_accepted(const safetensors_t *s) {
    fuzz_check(!strcmp(safetensors_meta_get(s, "format"), SNAPSHOT_FORMAT), "snapshot: accepted another format");
    span *spans = malloc(sizeof *spans * (size_t)(s->num_tensors + 1));
    if (!spans) abort();
    const char *blob = s->blob;
    for (int i = 0; i < s->num_tensors; i++) {
        const safetensors_tensor *t = &s->tensors[i];
        uint64_t bytes;
        const char *p = t->data;
        fuzz_check(st_tensor_bytes(safetensors_dtype_size(t->dtype), t->ndim, t->shape, &bytes) && bytes == t->bytes,
                   "snapshot: a tensor's bytes disagree with its dtype and shape");
        fuzz_check(p >= blob && (size_t)(p - blob) <= s->blob_bytes && t->bytes <= s->blob_bytes - (size_t)(p - blob),
                   "snapshot: a tensor lies outside the data");
        fuzz_check((size_t)(p - blob) % safetensors_dtype_size(t->dtype) == 0, "snapshot: a misaligned tensor");
        spans[i] = (span){(size_t)(p - blob), (size_t)(p - blob) + t->bytes};
        char err[600];
        fuzz_check(safetensors_find(s, t->name) == t, "snapshot: two tensors with one name");
        fuzz_check(snapshot_expect_tensor(s, t->name, t->dtype, t->ndim, t->shape, err, sizeof err),
                   "snapshot: expect_tensor refuses a tensor as it was read");
    }
    qsort(spans, (size_t)s->num_tensors, sizeof *spans, by_begin);
    size_t pos = 0;
    for (int i = 0; i < s->num_tensors; i++) {
        fuzz_check(spans[i].begin == pos, "snapshot: tensors overlap or leave a gap");
        pos = spans[i].end;
    }
    fuzz_check(pos == s->blob_bytes, "snapshot: bytes after the last tensor");
    free(spans);
    for (int i = 0; i < s->num_meta; i++) {
        int64_t v;
        char err[700];
        fuzz_check(safetensors_meta_get(s, s->meta[i].key) == s->meta[i].value, "snapshot: a metadata key twice");
        if (!snapshot_meta_i64(s, s->meta[i].key, &v, err, sizeof err)) fuzz_check(fuzz_one_line(err), "snapshot: meta_i64 reason");
    }
}

static void read_once(const uint8_t *data, size_t size) {
    safetensors_t s;
    char err[FILES_PATH_MAX + 200] = "";
    fuzz_file_put(&file, data, size);
    if (snapshot_read(file.path, &s, err, sizeof err)) {
        check_accepted(&s);
        safetensors_release(&s);
    } else {
        fuzz_check(fuzz_one_line(err), "snapshot: refusal without a one-line reason");
        fuzz_check(!s.tensors && !s.meta && !s.blob && !s.num_tensors, "snapshot: a refusal left data behind");
    }
}

// The CRC of the whole file with the digits at `digits` taken as zeros.
static void reseal(uint8_t *buf, size_t size, size_t digits) {
    crc32c_t c;
    char hex[9];
    crc32c_init(&c);
    crc32c_update(&c, buf, digits);
    crc32c_update(&c, "00000000", 8);
    crc32c_update(&c, buf + digits + 8, size - digits - 8);
    snprintf(hex, sizeof hex, "%08x", crc32c_final(&c));
    memcpy(buf + digits, hex, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char mark[] = "\"checksum\":\"crc32c:";
    fuzz_quiet();
    read_once(data, size);
    const uint8_t *at = size > 8 ? memmem(data + 8, size - 8, mark, sizeof mark - 1) : NULL;
    size_t digits = at ? (size_t)(at - data) + sizeof mark - 1 : 0;
    if (!at || digits + 8 > size) return 0;
    uint8_t *copy = malloc(size);
    if (!copy) abort();
    memcpy(copy, data, size);
    reseal(copy, size, digits);
    if (memcmp(copy, data, size) != 0) read_once(copy, size);
    free(copy);
    return 0;
}
