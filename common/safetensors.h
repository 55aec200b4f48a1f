// safetensors.h - the safetensors file format: named tensors and string
// metadata in one file, written atomically and read back only if intact.
//
// The layout is Hugging Face's, so Python opens these files too
// (safetensors.safe_open(path, "np"), safetensors.torch.load_file):
//   8 bytes   N, the length of the header, a little-endian unsigned 64-bit number
//   N bytes   a JSON header, padded with spaces to a multiple of 8 bytes:
//             {"__metadata__":{"checksum":"crc32c:1a2b3c4d","epoch":"3",...},
//              "w":{"dtype":"F32","shape":[64,1],"data_offsets":[0,256]},...}
//   the rest  the tensors' raw little-endian bytes, back to back, in the order
//             of their data_offsets, which count from the start of this part
// Metadata values are strings only (the format allows nothing else), so
// numbers are stored as decimal text (safetensors_meta_of).
//
// Why it is written and read the way it is:
// - Atomic writes (files.h): a crash or kill -9 at any moment leaves the old
//   file or the complete new one, never half a file under the final name.
// - Full validation. A file can be truncated by a full disk or damaged on
//   the way; training on from garbage weights is worse than stopping. The
//   reader checks every length, offset, name and type before it trusts it and
//   names the first problem in one line. No file can crash it.
// - A checksum of the whole file, the one thing this library adds to the
//   format: CRC32C (crc32c.h) in the metadata. It covers the 8-byte length,
//   the header and the tensor bytes, so a changed metadata value
//   ("epoch":"3" -> "4") is caught like a changed weight; the CRC is taken
//   with the checksum's own 8 hex digits written as "00000000" (the file
//   cannot contain its own CRC), and the reader insists that the checksum is
//   written literally, without JSON escapes, so there is exactly one way to
//   find those digits. Files from elsewhere, without a checksum, are read
//   and validated all the same. Python:
//     raw = open(path, "rb").read(); n = int.from_bytes(raw[:8], "little")
//     crc = json.loads(raw[8:8 + n])["__metadata__"]["checksum"]
//     crc32c.crc32c(raw.replace(crc.encode(), b"crc32c:00000000", 1)) == int(crc[7:], 16)
//   (the library writes the checksum first, so it is the first such text).
// - Tensors are laid out largest element first (8-byte types, then 4, 2, 1),
//   as the safetensors library does, so every tensor starts at a multiple of
//   its element size and can be used in place. The reader insists on that.
//
//   safetensors_tensor t[] = {safetensors_tensor_of("w", "F32", w, 2, (int64_t[]){64, 1})};
//   safetensors_meta m[] = {safetensors_meta_of("epoch", "%d", epoch)};
//   if (!safetensors_write(path, t, 1, m, 1, err, sizeof err)) die("%s", err);
//   ...
// Reading a file back, and checking all of it: safetensors_read.h.
// Functions named st_* are the helpers of this file and of safetensors_read.h. Tensors live in host memory
// here: copy device tensors to the host first. Names, keys and values are
// printable UTF-8 (no control characters), so that every message about them
// stays on one line.
#ifndef COURSE_SAFETENSORS_H
#define COURSE_SAFETENSORS_H

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "crc32c.h"
#include "files.h"
#include "json.h" // json_utf8_valid: names are UTF-8

// Tensor bytes are written as they lie in memory, and the format says little-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.h writes tensors in host byte order; safetensors needs a little-endian host"
#endif

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_NAME_MAX 64        // bytes for a tensor name or metadata key, NUL included
#define SAFETENSORS_VALUE_MAX 512      // bytes for a metadata value, NUL included
#define SAFETENSORS_PATH_MAX FILES_PATH_MAX
#define SAFETENSORS_MAX_HEADER 100000000 // the safetensors library's limit
#define SAFETENSORS_MAX_TENSORS 100000
#define SAFETENSORS_MAX_META 10000

typedef struct {
    char name[SAFETENSORS_NAME_MAX];
    char dtype[8];                    // "F32", "F64", "I32", "I64", "U8", "BF16", ...
    int ndim;                         // 0 for a scalar, at most SAFETENSORS_MAX_DIMS
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;                 // host memory; in a file that was read it points into its blob
    size_t bytes;                     // elements x element size
} safetensors_tensor;

typedef struct {
    char key[SAFETENSORS_NAME_MAX];
    char value[SAFETENSORS_VALUE_MAX];
} safetensors_meta;

// A file that was read: its tensors point into one block of memory.
typedef struct {
    char path[SAFETENSORS_PATH_MAX];  // the file it was read from
    safetensors_tensor *tensors;      // in the order of the header
    int num_tensors;
    safetensors_meta *meta;           // all of __metadata__, the checksum included
    int num_meta;
    bool has_checksum;                // the metadata recorded one (and it matched)
    void *blob;                       // the tensor bytes; free with safetensors_release
    size_t blob_bytes;
} safetensors_t;

// Bytes per element of a safetensors dtype, 0 for an unknown one.
static inline size_t safetensors_dtype_size(const char *dtype) {
    static const struct { const char *name; size_t size; } known[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4},
        {"F16", 2}, {"BF16", 2}, {"I16", 2}, {"U16", 2}, {"U8", 1}, {"I8", 1},
        {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(dtype, known[i].name) == 0) return known[i].size;
    return 0;
}

// ---------------------------------------------------------------- small helpers

// Text from a file, made safe for a one-line message: control bytes become
// '?', and long text is cut short with "...".
static inline const char *st_shown(const char *s, size_t len, char *buf, size_t size) {
    if (size < 8) { // too small to show anything useful
        if (size) buf[0] = '\0';
        return buf;
    }
    bool cut = len + 1 > size; // then keep size - 4 bytes and add "..."
    size_t keep = cut ? size - 4 : len;
    for (size_t i = 0; i < keep; i++) buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7F) ? '?' : s[i];
    if (cut) memcpy(buf + keep, "...", 3);
    buf[keep + (cut ? 3 : 0)] = '\0';
    return buf;
}

// Checks a tensor name or metadata key/value: what says which, e.g. "tensor name".
static inline bool st_check_text(const char *what, const char *s, size_t len, size_t cap, bool may_be_empty,
                                   char *err, size_t errlen) {
    char shown[72];
    if (len == 0 && !may_be_empty) return files_fail(err, errlen, "a %s is empty", what);
    if (len >= cap) return files_fail(err, errlen, "%s '%s' is longer than %zu bytes", what,
                                     st_shown(s, len, shown, sizeof shown), cap - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7F)
            return files_fail(err, errlen, "%s '%s' holds a control character", what, st_shown(s, len, shown, sizeof shown));
    if (!json_utf8_valid(s, len))
        return files_fail(err, errlen, "%s '%s' is not valid UTF-8", what, st_shown(s, len, shown, sizeof shown));
    return true;
}

// Bytes of a tensor with this element size and shape; false on a negative
// dimension or on overflow.
static inline bool st_tensor_bytes(size_t elem, int ndim, const int64_t *shape, uint64_t *bytes) {
    uint64_t n = elem;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return false;
    *bytes = n;
    return true;
}

// A shape as "[64, 1]", for messages.
static inline const char *safetensors_shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

static int st_compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The first name that occurs twice among n names (each at stride bytes from
// the previous one), or NULL; *oom is set when there was no memory to check.
static inline const char *st_duplicate(const char *first, size_t stride, int n, bool *oom) {
    const char **names = malloc((size_t)(n > 0 ? n : 1) * sizeof *names), *dup = NULL;
    *oom = names == NULL;
    if (!names) return NULL;
    for (int i = 0; i < n; i++) names[i] = first + (size_t)i * stride;
    qsort(names, (size_t)n, sizeof *names, st_compare_names);
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(names[i - 1], names[i]) == 0) dup = names[i];
    free(names);
    return dup;
}

// ---------------------------------------------------------------- building a file

// A tensor for safetensors_write; the data stays the caller's and is only read.
// Stops the program on a name, dtype or shape that no file can hold:
// that is a bug in the calling code, not bad input.
static inline safetensors_tensor safetensors_tensor_of(const char *name, const char *dtype, const void *data,
                                                 int ndim, const int64_t *shape) {
    safetensors_tensor t;
    uint64_t bytes;
    memset(&t, 0, sizeof t);
    if (strlen(name) >= sizeof t.name) die("tensor name '%s' is too long for a safetensors file (at most %zu bytes)", name, sizeof t.name - 1);
    if (safetensors_dtype_size(dtype) == 0) die("tensor '%s': unknown dtype '%s'", name, dtype);
    if (ndim < 0 || ndim > SAFETENSORS_MAX_DIMS) die("tensor '%s' has %d dimensions (0 to %d allowed)", name, ndim, SAFETENSORS_MAX_DIMS);
    if (!st_tensor_bytes(safetensors_dtype_size(dtype), ndim, shape, &bytes)) die("tensor '%s' has a negative or too large shape", name);
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
    t.ndim = ndim;
    if (ndim > 0) memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    t.data = data;
    t.bytes = (size_t)bytes;
    return t;
}

// A metadata entry, the value printf-style: safetensors_meta_of("epoch", "%d", epoch).
// Stops the program when the key or value does not fit.
__attribute__((format(printf, 2, 3)))
static inline safetensors_meta safetensors_meta_of(const char *key, const char *fmt, ...) {
    safetensors_meta m;
    memset(&m, 0, sizeof m);
    if (strlen(key) >= sizeof m.key) die("metadata key '%s' is too long for a safetensors file (at most %zu bytes)", key, sizeof m.key - 1);
    snprintf(m.key, sizeof m.key, "%s", key);
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(m.value, sizeof m.value, fmt, args);
    va_end(args);
    if (n < 0 || (size_t)n >= sizeof m.value) die("metadata '%s' is too long for a safetensors file (at most %zu bytes)", key, sizeof m.value - 1);
    return m;
}

// ---------------------------------------------------------------- writing

static inline bool st_check_tensor(const safetensors_tensor *t, char *err, size_t errlen) {
    char a[96], b[96];
    uint64_t bytes;
    size_t elem = safetensors_dtype_size(t->dtype);
    if (!st_check_text("tensor name", t->name, strnlen(t->name, sizeof t->name), sizeof t->name, false, err, errlen))
        return false;
    if (strcmp(t->name, "__metadata__") == 0) return files_fail(err, errlen, "a tensor cannot be named __metadata__");
    if (strnlen(t->dtype, sizeof t->dtype) == sizeof t->dtype || elem == 0)
        return files_fail(err, errlen, "tensor '%s' has unknown dtype '%s'", t->name, st_shown(t->dtype, strnlen(t->dtype, 8), a, sizeof a));
    if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS)
        return files_fail(err, errlen, "tensor '%s' has %d dimensions (0 to %d allowed)", t->name, t->ndim, SAFETENSORS_MAX_DIMS);
    if (!st_tensor_bytes(elem, t->ndim, t->shape, &bytes))
        return files_fail(err, errlen, "tensor '%s' has a negative or too large shape %s", t->name, safetensors_shape_text(t->ndim, t->shape, a, sizeof a));
    if (bytes != t->bytes)
        return files_fail(err, errlen, "tensor '%s' is %s %s, %" PRIu64 " bytes, but its bytes field says %zu", t->name,
                         t->dtype, safetensors_shape_text(t->ndim, t->shape, b, sizeof b), bytes, t->bytes);
    if (bytes > 0 && !t->data) return files_fail(err, errlen, "tensor '%s' has no data", t->name);
    return true;
}

static inline bool st_check_meta(const safetensors_meta *m, char *err, size_t errlen) {
    if (!st_check_text("metadata key", m->key, strnlen(m->key, sizeof m->key), sizeof m->key, false, err, errlen) ||
        !st_check_text("metadata value", m->value, strnlen(m->value, sizeof m->value), sizeof m->value, true, err, errlen))
        return false;
    if (!strcmp(m->key, "checksum"))
        return files_fail(err, errlen, "metadata key '%s' is reserved: the library writes it", m->key);
    return true;
}

static inline bool st_check_inputs(const safetensors_tensor *t, int nt, const safetensors_meta *m, int nm,
                                     char *err, size_t errlen) {
    bool oom;
    const char *dup;
    if (nt < 0 || nm < 0 || (nt > 0 && !t) || (nm > 0 && !m)) return files_fail(err, errlen, "no tensors or metadata given");
    if (nt > SAFETENSORS_MAX_TENSORS || nm > SAFETENSORS_MAX_META)
        return files_fail(err, errlen, "too many tensors (%d, at most %d) or metadata (%d, at most %d)",
                         nt, SAFETENSORS_MAX_TENSORS, nm, SAFETENSORS_MAX_META);
    for (int i = 0; i < nt; i++)
        if (!st_check_tensor(&t[i], err, errlen)) return false;
    for (int i = 0; i < nm; i++)
        if (!st_check_meta(&m[i], err, errlen)) return false;
    if ((dup = st_duplicate(nt ? t[0].name : "", sizeof *t, nt, &oom)))
        return files_fail(err, errlen, "two tensors are named '%s'", dup);
    if (!oom && (dup = st_duplicate(nm ? m[0].key : "", sizeof *m, nm, &oom)))
        return files_fail(err, errlen, "metadata key '%s' is given twice", dup);
    return oom ? files_fail(err, errlen, "out of memory") : true;
}

typedef struct { size_t elem; int index; } st_slot;

static int st_compare_slots(const void *a, const void *b) {
    const st_slot *x = a, *y = b;
    if (x->elem != y->elem) return x->elem > y->elem ? -1 : 1; // largest element first
    return x->index - y->index;                                  // then in the caller's order
}

// The order of the tensors in the file: 8-byte types first, then 4, 2, 1, so
// that each starts at a multiple of its element size.
static inline int *st_file_order(const safetensors_tensor *t, int nt) {
    st_slot *slots = xcalloc((size_t)nt, sizeof *slots);
    int *order = xcalloc((size_t)nt, sizeof *order);
    for (int i = 0; i < nt; i++) slots[i] = (st_slot){safetensors_dtype_size(t[i].dtype), i};
    qsort(slots, (size_t)nt, sizeof *slots, st_compare_slots);
    for (int i = 0; i < nt; i++) order[i] = slots[i].index;
    free(slots);
    return order;
}

typedef struct { char *buf; size_t len, cap; } st_text;

static inline void st_put(st_text *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->buf, cap);
        if (!grown) die("out of memory building a safetensors header of %zu bytes", cap);
        b->buf = grown;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static inline void st_puts(st_text *b, const char *s) { st_put(b, s, strlen(s)); }

// A JSON string; names and values hold no control characters (checked), so
// only the quote and the backslash need escaping.
static inline void st_put_string(st_text *b, const char *s) {
    st_puts(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') st_puts(b, "\\");
        st_put(b, s, 1);
    }
    st_puts(b, "\"");
}

static inline void st_put_tensor(st_text *b, const safetensors_tensor *t, uint64_t offset) {
    char num[64];
    st_puts(b, ",");
    st_put_string(b, t->name);
    st_puts(b, ":{\"dtype\":");
    st_put_string(b, t->dtype);
    st_puts(b, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
        snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", t->shape[d]);
        st_puts(b, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + t->bytes);
    st_puts(b, num);
}

// The JSON header, padded with spaces to a multiple of 8 bytes; free() it.
// Its checksum reads "crc32c:00000000"; *digits is where the 8 zeros are,
// for st_put_checksum once the CRC of the whole file is known.
static inline char *st_build_header(const safetensors_tensor *t, const int *order, int nt,
                                      const safetensors_meta *m, int nm, size_t *len, size_t *digits) {
    st_text b = {NULL, 0, 0};
    st_puts(&b, "{\"__metadata__\":{\"checksum\":\"crc32c:");
    *digits = b.len;
    st_puts(&b, "00000000\"");
    for (int i = 0; i < nm; i++) {
        st_puts(&b, ",");
        st_put_string(&b, m[i].key);
        st_puts(&b, ":");
        st_put_string(&b, m[i].value);
    }
    st_puts(&b, "}");
    uint64_t offset = 0;
    for (int i = 0; i < nt; i++) {
        st_put_tensor(&b, &t[order[i]], offset);
        offset += t[order[i]].bytes;
    }
    st_puts(&b, "}");
    while (b.len % 8 != 0) st_puts(&b, " ");
    *len = b.len;
    return b.buf;
}

// Starts the CRC of a whole file: its 8-byte header length, then the header
// as it is on disk except that the checksum's 8 digits read "00000000".
static inline void st_crc_head(crc32c_t *crc, const char *header, size_t header_len) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i)); // little-endian
    crc32c_init(crc);
    crc32c_update(crc, len8, 8);
    crc32c_update(crc, header, header_len);
}

// Writes the 8 lowercase hex digits of crc at digits (no NUL).
static inline void st_put_checksum(char *digits, uint32_t crc) {
    char hex[9];
    snprintf(hex, sizeof hex, "%08" PRIx32, crc);
    memcpy(digits, hex, 8);
}

// Test hook: COURSE_SNAPSHOT_PAUSE_MS=<ms> sleeps halfway through the tensor
// bytes, before fsync and rename, so a test can kill the writer mid-write
// (the tests of chapter 06 and of this file do).
static inline void st_test_pause(void) {
    const char *text = getenv("COURSE_SNAPSHOT_PAUSE_MS");
    long ms = text ? strtol(text, NULL, 10) : 0;
    if (ms <= 0) return;
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) < 0 && errno == EINTR) {}
}

static inline bool st_write_data(FILE *out, const safetensors_tensor *t, const int *order, int nt) {
    size_t total = 0, done = 0;
    bool paused = false;
    for (int i = 0; i < nt; i++) total += t[i].bytes;
    for (int i = 0; i < nt; i++) {
        const char *p = t[order[i]].data;
        size_t n = t[order[i]].bytes;
        if (!paused && done + n >= total / 2) {
            size_t before = total / 2 - done;
            if (before > 0 && fwrite(p, 1, before, out) != before) return false;
            st_test_pause();
            paused = true;
            done += before;
            n -= before;
            if (n > 0) p += before;
        }
        if (n > 0 && fwrite(p, 1, n, out) != n) return false;
        done += n;
    }
    if (!paused) st_test_pause();
    return true;
}

// The length, the header and the tensors, written atomically (files.h).
static inline bool st_write_file(const char *path, const char *header, size_t header_len,
                                 const safetensors_tensor *t, const int *order, int nt, char *err, size_t errlen) {
    char dir[SAFETENSORS_PATH_MAX];
    unsigned char len8[8];
    files_dir_of(path, dir, sizeof dir);
    files_make_dirs_or_die(dir);
    files_atomic f;
    if (!files_atomic_open(&f, path, err, errlen)) return false;
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i)); // little-endian
    if (fwrite(len8, 1, 8, f.out) != 8 || fwrite(header, 1, header_len, f.out) != header_len ||
        !st_write_data(f.out, t, order, nt)) {
        files_fail_errno(err, errlen, "cannot write", f.tmp);
        files_atomic_abort(&f);
        return false;
    }
    return files_atomic_commit(&f, err, errlen);
}

// Writes the tensors (host memory) and metadata to path, atomically; creates
// the directory if needed (files_make_dirs_or_die, which exits with a
// message if it cannot). The library adds "checksum" to the metadata, first.
// Returns false with a one-line reason in err.
static inline bool safetensors_write(const char *path, const safetensors_tensor *t, int nt,
                                  const safetensors_meta *m, int nm, char *err, size_t errlen) {
    if (!st_check_inputs(t, nt, m, nm, err, errlen)) return false;
    int *order = st_file_order(t, nt);
    size_t header_len, digits;
    char *header = st_build_header(t, order, nt, m, nm, &header_len, &digits);
    crc32c_t crc;
    st_crc_head(&crc, header, header_len);   // with the digits still "00000000"
    for (int i = 0; i < nt; i++)
        if (t[order[i]].bytes > 0) crc32c_update(&crc, t[order[i]].data, t[order[i]].bytes);
    st_put_checksum(header + digits, crc32c_final(&crc));
    bool ok = st_write_file(path, header, header_len, t, order, nt, err, errlen);
    free(header);
    free(order);
    return ok;
}

#endif
