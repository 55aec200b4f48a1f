// snapshot.h - save the whole training state, and load it back only if it is intact.
//
// A job that is killed (a node reboots, the scheduler preempts it, a rank
// crashes) should resume as if nothing had happened. That needs more than the
// weights: the optimizer state, the random generator, the epoch, the position
// in the data, the world size and the configuration. A snapshot holds all of
// it: named tensors plus string metadata, in one file.
//
// The file is in the safetensors layout, so Python can open it too
// (safetensors.safe_open(path, "np")):
//   8 bytes   N, the length of the header, a little-endian unsigned 64-bit number
//   N bytes   a JSON header, padded with spaces to a multiple of 8 bytes:
//             {"__metadata__":{"format":"course-snapshot","version":"2",
//                              "checksum":"crc32c:1a2b3c4d","epoch":"3",...},
//              "w":{"dtype":"F32","shape":[64,1],"data_offsets":[0,256]},...}
//   the rest  the tensors' raw little-endian bytes, back to back, in the order
//             of their data_offsets, which count from the start of this part
// safetensors allows only strings as metadata values, so numbers such as the
// epoch are stored as decimal text (snapshot_meta_of, snapshot_meta_i64).
//
// Why it is written and read the way it is:
// - Atomic writes. The bytes go to a hidden temporary file in the same
//   directory (".<name>.<pid>.tmp", never named like a snapshot), which is
//   fsynced, renamed over the final name, and then the directory is fsynced.
//   A crash or kill -9 at any moment leaves the old file or the complete new
//   one, never half a snapshot under a snapshot's name.
// - Full validation. A snapshot can be truncated by a full disk or damaged on
//   the way; training on from garbage weights is worse than stopping. The
//   reader checks every length, offset, name and type before it trusts it and
//   names the first problem in one line. No file can crash it.
// - A checksum of the whole file: CRC32C (the Castagnoli CRC of iSCSI and
//   ext4), computed from tables 8 bytes at a time, about 2 GB/s on one core.
//   It catches every error burst up to 32 bits long and other damage with
//   probability 1 - 2^-32. It covers the 8-byte length, the header and the
//   tensor bytes, so a changed metadata value ("epoch":"3" -> "4") is caught
//   like a changed weight; the CRC is taken with the checksum's own 8 hex
//   digits written as "00000000" (the file cannot contain its own CRC), and
//   the reader insists that the checksum is written literally, without JSON
//   escapes, so there is exactly one way to find those digits. (Version 1
//   files, whose CRC covered only the tensor bytes, are refused.) Python:
//     raw = open(path, "rb").read(); n = int.from_bytes(raw[:8], "little")
//     crc = json.loads(raw[8:8 + n])["__metadata__"]["checksum"]
//     crc32c.crc32c(raw.replace(crc.encode(), b"crc32c:00000000", 1)) == int(crc[7:], 16)
//   (in a file this library wrote, the checksum is the first such text).
// - Tensors are laid out largest element first (8-byte types, then 4, 2, 1),
//   as the safetensors library does, so every tensor starts at a multiple of
//   its element size and can be used in place. The reader insists on that.
// - Series (snapshot_save_step): "<dir>/<stem>.<step, 10 digits>.safetensors".
//   Old ones are deleted only after the new one is durable, and loading falls
//   back to the newest one that validates (snapshot_load_latest).
//
// In a training program (rank 0 saves; every rank loads):
//   snapshot_tensor t[] = {snapshot_tensor_of("w", "F32", w, 2, (int64_t[]){64, 1})};
//   snapshot_meta m[] = {snapshot_meta_of("epoch", "%d", epoch), snapshot_meta_of("features", "%d", features)};
//   if (!snapshot_save_step("runs/06/snapshot.safetensors", step, t, 1, m, 2, keep, err, sizeof err)) die(...);
//   ...
//   int found = snapshot_load_latest("runs/06/snapshot.safetensors", &snap, report, sizeof report);
//   if (report[0]) print the report: which snapshots were refused and why
//   snapshot_expect_meta(&snap, "features", "64", err, sizeof err): the same model?
//   snapshot_copy(&snap, "w", "F32", 2, (int64_t[]){64, 1}, w, err, sizeof err); snapshot_release(&snap);
// Functions named snap_* are internal helpers.
//
// Only rank 0 writes snapshots; the caller checks its rank. After every step
// all ranks hold the same weights, and several writers of one file would race.
// Tensors live in host memory here: copy device tensors to the host first.
// Names, keys and values are printable UTF-8 (no control characters), so that
// every message about them stays on one line.
#ifndef COURSE_SNAPSHOT_H
#define COURSE_SNAPSHOT_H

#include <ctype.h>
#include <dirent.h>
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
#include "json.h"
#include "files.h"

// Tensor bytes are written as they lie in memory, and the format says little-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "snapshot.h writes tensors in host byte order; safetensors needs a little-endian host"
#endif

#define SNAPSHOT_FORMAT "course-snapshot"
#define SNAPSHOT_VERSION "2" // 2: the checksum covers the whole file, header included
#define SNAPSHOT_MAX_DIMS 8
#define SNAPSHOT_NAME_MAX 64        // bytes for a tensor name or metadata key, NUL included
#define SNAPSHOT_VALUE_MAX 512      // bytes for a metadata value, NUL included
#define SNAPSHOT_PATH_MAX 1024
#define SNAPSHOT_MAX_HEADER 100000000 // the safetensors library's limit
#define SNAPSHOT_MAX_TENSORS 100000
#define SNAPSHOT_MAX_META 10000
#define SNAPSHOT_MAX_STEP 9999999999LL // ten digits in a series file name

typedef struct {
    char name[SNAPSHOT_NAME_MAX];
    char dtype[8];                    // "F32", "F64", "I32", "I64", "U8", "BF16", ...
    int ndim;                         // 0 for a scalar, at most SNAPSHOT_MAX_DIMS
    int64_t shape[SNAPSHOT_MAX_DIMS];
    const void *data;                 // host memory; in a loaded snapshot it points into its blob
    size_t bytes;                     // elements x element size
} snapshot_tensor;

typedef struct {
    char key[SNAPSHOT_NAME_MAX];
    char value[SNAPSHOT_VALUE_MAX];
} snapshot_meta;

typedef struct {
    char path[SNAPSHOT_PATH_MAX];     // the file it was read from
    snapshot_tensor *tensors;         // in the order of the header
    int num_tensors;
    snapshot_meta *meta;              // all of __metadata__, format, version and checksum included
    int num_meta;
    void *blob;                       // the tensor bytes; free with snapshot_release
    size_t blob_bytes;
} snapshot_t;

// Bytes per element of a safetensors dtype, 0 for an unknown one.
static inline size_t snapshot_dtype_size(const char *dtype) {
    static const struct { const char *name; size_t size; } known[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4},
        {"F16", 2}, {"BF16", 2}, {"I16", 2}, {"U16", 2}, {"U8", 1}, {"I8", 1},
        {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(dtype, known[i].name) == 0) return known[i].size;
    return 0;
}

// ---------------------------------------------------------------- CRC32C

// table[k][b] is the CRC of byte b followed by k zero bytes, which lets the
// loop fold in 8 bytes per step instead of one ("slicing by 8").
typedef struct {
    uint32_t table[8][256];
    uint32_t crc;
} snapshot_crc;

static inline void snapshot_crc_init(snapshot_crc *c) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t r = b;
        for (int k = 0; k < 8; k++) r = (r & 1) ? (r >> 1) ^ 0x82F63B78u : r >> 1; // reflected Castagnoli polynomial
        c->table[0][b] = r;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++)
            c->table[k][b] = (c->table[k - 1][b] >> 8) ^ c->table[0][c->table[k - 1][b] & 0xFF];
    c->crc = 0xFFFFFFFFu;
}

static inline void snapshot_crc_update(snapshot_crc *c, const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t crc = c->crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8); // the first byte lands in the low bits on a little-endian host
        w ^= crc;
        crc = c->table[7][w & 0xFF] ^ c->table[6][(w >> 8) & 0xFF] ^ c->table[5][(w >> 16) & 0xFF] ^
              c->table[4][(w >> 24) & 0xFF] ^ c->table[3][(w >> 32) & 0xFF] ^ c->table[2][(w >> 40) & 0xFF] ^
              c->table[1][(w >> 48) & 0xFF] ^ c->table[0][w >> 56];
    }
    for (; n > 0; p++, n--) crc = (crc >> 8) ^ c->table[0][(crc ^ *p) & 0xFF];
    c->crc = crc;
}

static inline uint32_t snapshot_crc_final(const snapshot_crc *c) { return ~c->crc; }

// ---------------------------------------------------------------- small helpers

__attribute__((format(printf, 3, 4)))
static inline bool snap_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, errlen, fmt, args);
        va_end(args);
    }
    return false;
}

// "<what> <path>: <reason> (hint: ...)" for a failed system call.
static inline bool snap_fail_errno(char *err, size_t errlen, const char *what, const char *path) {
    int e = errno;
    const char *hint = errno_hint(e);
    return snap_fail(err, errlen, "%s %s: %s%s%s%s", what, path, strerror(e),
                     hint[0] ? " (hint: " : "", hint, hint[0] ? ")" : "");
}

// Text from a file, made safe for a one-line message: control bytes become
// '?', and long text is cut short with "...".
static inline const char *snap_shown(const char *s, size_t len, char *buf, size_t size) {
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
static inline bool snap_check_text(const char *what, const char *s, size_t len, size_t cap, bool may_be_empty,
                                   char *err, size_t errlen) {
    char shown[72];
    if (len == 0 && !may_be_empty) return snap_fail(err, errlen, "a %s is empty", what);
    if (len >= cap) return snap_fail(err, errlen, "%s '%s' is longer than %zu bytes", what,
                                     snap_shown(s, len, shown, sizeof shown), cap - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7F)
            return snap_fail(err, errlen, "%s '%s' holds a control character", what, snap_shown(s, len, shown, sizeof shown));
    if (!json_utf8_valid(s, len))
        return snap_fail(err, errlen, "%s '%s' is not valid UTF-8", what, snap_shown(s, len, shown, sizeof shown));
    return true;
}

// Bytes of a tensor with this element size and shape; false on a negative
// dimension or on overflow.
static inline bool snap_tensor_bytes(size_t elem, int ndim, const int64_t *shape, uint64_t *bytes) {
    uint64_t n = elem;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return false;
    *bytes = n;
    return true;
}

// "[64, 1]"
static inline const char *snap_shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

static int snap_compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The first name that occurs twice among n names (each at stride bytes from
// the previous one), or NULL; *oom is set when there was no memory to check.
static inline const char *snap_duplicate(const char *first, size_t stride, int n, bool *oom) {
    const char **names = malloc((size_t)(n > 0 ? n : 1) * sizeof *names), *dup = NULL;
    *oom = names == NULL;
    if (!names) return NULL;
    for (int i = 0; i < n; i++) names[i] = first + (size_t)i * stride;
    qsort(names, (size_t)n, sizeof *names, snap_compare_names);
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(names[i - 1], names[i]) == 0) dup = names[i];
    free(names);
    return dup;
}

// Splits "runs/x/a.safetensors" into "runs/x" and "a.safetensors" ("." for no directory).
static inline bool snap_split_path(const char *path, char dir[SNAPSHOT_PATH_MAX], char base[SNAPSHOT_PATH_MAX]) {
    size_t n = strlen(path);
    const char *slash = strrchr(path, '/');
    if (n == 0 || n >= SNAPSHOT_PATH_MAX) return false;
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    if (!slash) memcpy(dir, ".", 2);
    else if (dir_len == 0) memcpy(dir, "/", 2);
    else { memcpy(dir, path, dir_len); dir[dir_len] = '\0'; }
    const char *name = slash ? slash + 1 : path;
    memcpy(base, name, strlen(name) + 1);
    return base[0] != '\0';
}

// ---------------------------------------------------------------- building a snapshot

// A tensor for snapshot_write; the data stays the caller's and is only read.
// Stops the program on a name, dtype or shape that no snapshot can hold:
// that is a bug in the calling code, not bad input.
static inline snapshot_tensor snapshot_tensor_of(const char *name, const char *dtype, const void *data,
                                                 int ndim, const int64_t *shape) {
    snapshot_tensor t;
    uint64_t bytes;
    memset(&t, 0, sizeof t);
    if (strlen(name) >= sizeof t.name) die("tensor name '%s' is too long for a snapshot (at most %zu bytes)", name, sizeof t.name - 1);
    if (snapshot_dtype_size(dtype) == 0) die("tensor '%s': unknown dtype '%s'", name, dtype);
    if (ndim < 0 || ndim > SNAPSHOT_MAX_DIMS) die("tensor '%s' has %d dimensions (0 to %d allowed)", name, ndim, SNAPSHOT_MAX_DIMS);
    if (!snap_tensor_bytes(snapshot_dtype_size(dtype), ndim, shape, &bytes)) die("tensor '%s' has a negative or too large shape", name);
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
    t.ndim = ndim;
    if (ndim > 0) memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    t.data = data;
    t.bytes = (size_t)bytes;
    return t;
}

// A metadata entry, the value printf-style: snapshot_meta_of("epoch", "%d", epoch).
// Stops the program when the key or value does not fit.
__attribute__((format(printf, 2, 3)))
static inline snapshot_meta snapshot_meta_of(const char *key, const char *fmt, ...) {
    snapshot_meta m;
    memset(&m, 0, sizeof m);
    if (strlen(key) >= sizeof m.key) die("metadata key '%s' is too long for a snapshot (at most %zu bytes)", key, sizeof m.key - 1);
    snprintf(m.key, sizeof m.key, "%s", key);
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(m.value, sizeof m.value, fmt, args);
    va_end(args);
    if (n < 0 || (size_t)n >= sizeof m.value) die("metadata '%s' is too long for a snapshot (at most %zu bytes)", key, sizeof m.value - 1);
    return m;
}

// ---------------------------------------------------------------- writing

static inline bool snap_check_tensor(const snapshot_tensor *t, char *err, size_t errlen) {
    char a[96], b[96];
    uint64_t bytes;
    size_t elem = snapshot_dtype_size(t->dtype);
    if (!snap_check_text("tensor name", t->name, strnlen(t->name, sizeof t->name), sizeof t->name, false, err, errlen))
        return false;
    if (strcmp(t->name, "__metadata__") == 0) return snap_fail(err, errlen, "a tensor cannot be named __metadata__");
    if (strnlen(t->dtype, sizeof t->dtype) == sizeof t->dtype || elem == 0)
        return snap_fail(err, errlen, "tensor '%s' has unknown dtype '%s'", t->name, snap_shown(t->dtype, strnlen(t->dtype, 8), a, sizeof a));
    if (t->ndim < 0 || t->ndim > SNAPSHOT_MAX_DIMS)
        return snap_fail(err, errlen, "tensor '%s' has %d dimensions (0 to %d allowed)", t->name, t->ndim, SNAPSHOT_MAX_DIMS);
    if (!snap_tensor_bytes(elem, t->ndim, t->shape, &bytes))
        return snap_fail(err, errlen, "tensor '%s' has a negative or too large shape %s", t->name, snap_shape_text(t->ndim, t->shape, a, sizeof a));
    if (bytes != t->bytes)
        return snap_fail(err, errlen, "tensor '%s' is %s %s, %" PRIu64 " bytes, but its bytes field says %zu", t->name,
                         t->dtype, snap_shape_text(t->ndim, t->shape, b, sizeof b), bytes, t->bytes);
    if (bytes > 0 && !t->data) return snap_fail(err, errlen, "tensor '%s' has no data", t->name);
    return true;
}

static inline bool snap_check_meta(const snapshot_meta *m, char *err, size_t errlen) {
    if (!snap_check_text("metadata key", m->key, strnlen(m->key, sizeof m->key), sizeof m->key, false, err, errlen) ||
        !snap_check_text("metadata value", m->value, strnlen(m->value, sizeof m->value), sizeof m->value, true, err, errlen))
        return false;
    if (!strcmp(m->key, "format") || !strcmp(m->key, "version") || !strcmp(m->key, "checksum"))
        return snap_fail(err, errlen, "metadata key '%s' is reserved: the library writes it", m->key);
    return true;
}

static inline bool snap_check_inputs(const snapshot_tensor *t, int nt, const snapshot_meta *m, int nm,
                                     char *err, size_t errlen) {
    bool oom;
    const char *dup;
    if (nt < 0 || nm < 0 || (nt > 0 && !t) || (nm > 0 && !m)) return snap_fail(err, errlen, "no tensors or metadata given");
    if (nt > SNAPSHOT_MAX_TENSORS || nm > SNAPSHOT_MAX_META)
        return snap_fail(err, errlen, "too many tensors (%d, at most %d) or metadata (%d, at most %d)",
                         nt, SNAPSHOT_MAX_TENSORS, nm, SNAPSHOT_MAX_META);
    for (int i = 0; i < nt; i++)
        if (!snap_check_tensor(&t[i], err, errlen)) return false;
    for (int i = 0; i < nm; i++)
        if (!snap_check_meta(&m[i], err, errlen)) return false;
    if ((dup = snap_duplicate(nt ? t[0].name : "", sizeof *t, nt, &oom)))
        return snap_fail(err, errlen, "two tensors are named '%s'", dup);
    if (!oom && (dup = snap_duplicate(nm ? m[0].key : "", sizeof *m, nm, &oom)))
        return snap_fail(err, errlen, "metadata key '%s' is given twice", dup);
    return oom ? snap_fail(err, errlen, "out of memory") : true;
}

typedef struct { size_t elem; int index; } snap_slot;

static int snap_compare_slots(const void *a, const void *b) {
    const snap_slot *x = a, *y = b;
    if (x->elem != y->elem) return x->elem > y->elem ? -1 : 1; // largest element first
    return x->index - y->index;                                  // then in the caller's order
}

// The order of the tensors in the file: 8-byte types first, then 4, 2, 1, so
// that each starts at a multiple of its element size.
static inline int *snap_file_order(const snapshot_tensor *t, int nt) {
    snap_slot *slots = xcalloc((size_t)nt, sizeof *slots);
    int *order = xcalloc((size_t)nt, sizeof *order);
    for (int i = 0; i < nt; i++) slots[i] = (snap_slot){snapshot_dtype_size(t[i].dtype), i};
    qsort(slots, (size_t)nt, sizeof *slots, snap_compare_slots);
    for (int i = 0; i < nt; i++) order[i] = slots[i].index;
    free(slots);
    return order;
}

typedef struct { char *buf; size_t len, cap; } snap_text;

static inline void snap_put(snap_text *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->buf, cap);
        if (!grown) die("out of memory building a snapshot header of %zu bytes", cap);
        b->buf = grown;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static inline void snap_puts(snap_text *b, const char *s) { snap_put(b, s, strlen(s)); }

// A JSON string; names and values hold no control characters (checked), so
// only the quote and the backslash need escaping.
static inline void snap_put_string(snap_text *b, const char *s) {
    snap_puts(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') snap_puts(b, "\\");
        snap_put(b, s, 1);
    }
    snap_puts(b, "\"");
}

static inline void snap_put_tensor(snap_text *b, const snapshot_tensor *t, uint64_t offset) {
    char num[64];
    snap_puts(b, ",");
    snap_put_string(b, t->name);
    snap_puts(b, ":{\"dtype\":");
    snap_put_string(b, t->dtype);
    snap_puts(b, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
        snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", t->shape[d]);
        snap_puts(b, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + t->bytes);
    snap_puts(b, num);
}

// The JSON header, padded with spaces to a multiple of 8 bytes; free() it.
// Its checksum reads "crc32c:00000000"; *digits is where the 8 zeros are,
// for snap_put_checksum once the CRC of the whole file is known.
static inline char *snap_build_header(const snapshot_tensor *t, const int *order, int nt,
                                      const snapshot_meta *m, int nm, size_t *len, size_t *digits) {
    snap_text b = {NULL, 0, 0};
    snap_puts(&b, "{\"__metadata__\":{\"format\":\"" SNAPSHOT_FORMAT "\",\"version\":\"" SNAPSHOT_VERSION "\",\"checksum\":\"crc32c:");
    *digits = b.len;
    snap_puts(&b, "00000000\"");
    for (int i = 0; i < nm; i++) {
        snap_puts(&b, ",");
        snap_put_string(&b, m[i].key);
        snap_puts(&b, ":");
        snap_put_string(&b, m[i].value);
    }
    snap_puts(&b, "}");
    uint64_t offset = 0;
    for (int i = 0; i < nt; i++) {
        snap_put_tensor(&b, &t[order[i]], offset);
        offset += t[order[i]].bytes;
    }
    snap_puts(&b, "}");
    while (b.len % 8 != 0) snap_puts(&b, " ");
    *len = b.len;
    return b.buf;
}

// Starts the CRC of a whole file: its 8-byte header length, then the header
// as it is on disk except that the checksum's 8 digits read "00000000".
static inline void snap_crc_head(snapshot_crc *crc, const char *header, size_t header_len) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i)); // little-endian
    snapshot_crc_init(crc);
    snapshot_crc_update(crc, len8, 8);
    snapshot_crc_update(crc, header, header_len);
}

// Writes the 8 lowercase hex digits of crc at digits (no NUL).
static inline void snap_put_checksum(char *digits, uint32_t crc) {
    char hex[9];
    snprintf(hex, sizeof hex, "%08" PRIx32, crc);
    memcpy(digits, hex, 8);
}

// Test hook: COURSE_SNAPSHOT_PAUSE_MS=<ms> sleeps halfway through the tensor
// bytes, before fsync and rename, so a test can kill the writer mid-write.
static inline void snap_test_pause(void) {
    const char *text = getenv("COURSE_SNAPSHOT_PAUSE_MS");
    long ms = text ? strtol(text, NULL, 10) : 0;
    if (ms <= 0) return;
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) < 0 && errno == EINTR) {}
}

static inline bool snap_write_data(FILE *out, const snapshot_tensor *t, const int *order, int nt) {
    size_t total = 0, done = 0;
    bool paused = false;
    for (int i = 0; i < nt; i++) total += t[i].bytes;
    for (int i = 0; i < nt; i++) {
        const char *p = t[order[i]].data;
        size_t n = t[order[i]].bytes;
        if (!paused && done + n >= total / 2) {
            size_t before = total / 2 - done;
            if (before > 0 && fwrite(p, 1, before, out) != before) return false;
            snap_test_pause();
            paused = true;
            done += before;
            n -= before;
            if (n > 0) p += before;
        }
        if (n > 0 && fwrite(p, 1, n, out) != n) return false;
        done += n;
    }
    if (!paused) snap_test_pause();
    return true;
}

// The length, the header and the tensors, written atomically (files.h).
static inline bool snap_write_file(const char *path, const char *header, size_t header_len,
                                   const snapshot_tensor *t, const int *order, int nt, char *err, size_t errlen) {
    char dir[SNAPSHOT_PATH_MAX], base[SNAPSHOT_PATH_MAX];
    unsigned char len8[8];
    if (!snap_split_path(path, dir, base)) return snap_fail(err, errlen, "snapshot path '%s' is empty, too long or a directory", path);
    files_make_dirs_or_die(dir);
    files_atomic f;
    if (!files_atomic_open(&f, path, err, errlen)) return false;
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i)); // little-endian
    if (fwrite(len8, 1, 8, f.out) != 8 || fwrite(header, 1, header_len, f.out) != header_len ||
        !snap_write_data(f.out, t, order, nt)) {
        snap_fail_errno(err, errlen, "cannot write", f.tmp);
        files_atomic_abort(&f);
        return false;
    }
    return files_atomic_commit(&f, err, errlen);
}

// Writes the tensors (host memory) and metadata to path, atomically; creates
// the directory if needed (files_make_dirs_or_die, which exits with a
// message if it cannot). The library adds "format", "version" and "checksum" to the
// metadata. Returns false with a one-line reason in err.
static inline bool snapshot_write(const char *path, const snapshot_tensor *t, int nt,
                                  const snapshot_meta *m, int nm, char *err, size_t errlen) {
    if (!snap_check_inputs(t, nt, m, nm, err, errlen)) return false;
    int *order = snap_file_order(t, nt);
    size_t header_len, digits;
    char *header = snap_build_header(t, order, nt, m, nm, &header_len, &digits);
    snapshot_crc crc;
    snap_crc_head(&crc, header, header_len);   // with the digits still "00000000"
    for (int i = 0; i < nt; i++)
        if (t[order[i]].bytes > 0) snapshot_crc_update(&crc, t[order[i]].data, t[order[i]].bytes);
    snap_put_checksum(header + digits, snapshot_crc_final(&crc));
    bool ok = snap_write_file(path, header, header_len, t, order, nt, err, errlen);
    free(header);
    free(order);
    return ok;
}

// ---------------------------------------------------------------- reading

typedef struct { uint64_t begin, end; int index; } snap_span;

static inline bool snap_read_all(int fd, void *buf, size_t n, const char *what, char *err, size_t errlen) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n < (1u << 30) ? n : (1u << 30));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return snap_fail(err, errlen, "cannot read %s: %s", what, strerror(errno));
        if (r == 0) return snap_fail(err, errlen, "the file ended inside %s (did it change while being read?)", what);
        p += r;
        n -= (size_t)r;
    }
    return true;
}

// Reads the length and the header (NUL-terminated, for the JSON parser, and
// followed by a copy of itself as read); *data_bytes is the size of the rest of the file.
static inline bool snap_read_header(int fd, char **header, size_t *header_len, uint64_t *data_bytes,
                                    char *err, size_t errlen) {
    struct stat st;
    unsigned char len8[8];
    uint64_t n = 0;
    if (fstat(fd, &st) < 0) return snap_fail(err, errlen, "cannot stat the file: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return snap_fail(err, errlen, "not a regular file");
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) return snap_fail(err, errlen, "the file is %" PRIu64 " bytes long, too short for the 8-byte header length (truncated?)", size);
    if (!snap_read_all(fd, len8, 8, "the header length", err, errlen)) return false;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > size - 8) return snap_fail(err, errlen, "header length %" PRIu64 " is larger than the file (%" PRIu64 " bytes)", n, size);
    if (n > SNAPSHOT_MAX_HEADER) return snap_fail(err, errlen, "header length %" PRIu64 " is absurd (the limit is %d bytes)", n, SNAPSHOT_MAX_HEADER);
    *header = malloc(2 * n + 1); // room for a raw copy after it: the JSON parser decodes in place
    if (!*header) return snap_fail(err, errlen, "out of memory for a header of %" PRIu64 " bytes", n);
    if (!snap_read_all(fd, *header, n, "the header", err, errlen)) return false;
    (*header)[n] = '\0';
    memcpy(*header + n + 1, *header, n);
    if (n == 0 || (*header)[0] != '{') return snap_fail(err, errlen, "the header does not start with '{' (not a safetensors file?)");
    *header_len = n;
    *data_bytes = size - 8 - n;
    return true;
}

static inline bool snap_key_is(const json_node *n, const char *key) {
    return n->key_len == strlen(key) && memcmp(n->key, key, n->key_len) == 0;
}

static inline const char *snapshot_meta_get(const snapshot_t *s, const char *key);

static inline bool snap_check_format(const snapshot_t *s, uint32_t *crc, char *err, size_t errlen) {
    const char *format = snapshot_meta_get(s, "format"), *version = snapshot_meta_get(s, "version");
    const char *checksum = snapshot_meta_get(s, "checksum");
    char hex[9];
    int used = 0;
    if (!format) return snap_fail(err, errlen, "not a course snapshot: __metadata__ has no 'format'");
    if (strcmp(format, SNAPSHOT_FORMAT) != 0)
        return snap_fail(err, errlen, "not a course snapshot: format is '%s', expected '" SNAPSHOT_FORMAT "'", format);
    if (!version || strcmp(version, SNAPSHOT_VERSION) != 0)
        return snap_fail(err, errlen, "snapshot version '%s' is not supported (this program reads version " SNAPSHOT_VERSION ")",
                         version ? version : "(none)");
    if (!checksum) return snap_fail(err, errlen, "__metadata__ has no 'checksum'");
    if (strlen(checksum) != 15 || sscanf(checksum, "crc32c:%8[0-9a-f]%n", hex, &used) != 1 || used != 15)
        return snap_fail(err, errlen, "checksum '%s' is not crc32c:<8 lowercase hex digits>", checksum);
    *crc = (uint32_t)strtoul(hex, NULL, 16);
    return true;
}

static inline bool snap_read_meta(const json_doc *doc, const json_node *meta, snapshot_t *out, char *err, size_t errlen) {
    char shown[72];
    bool oom;
    const char *dup;
    if (!meta) return snap_fail(err, errlen, "not a course snapshot: the header has no __metadata__");
    if (meta->type != JSON_OBJECT) return snap_fail(err, errlen, "__metadata__ is a JSON %s, not an object", json_type_name(meta->type));
    if (meta->count > SNAPSHOT_MAX_META) return snap_fail(err, errlen, "__metadata__ has %d entries (at most %d)", meta->count, SNAPSHOT_MAX_META);
    out->meta = calloc((size_t)(meta->count ? meta->count : 1), sizeof *out->meta);
    if (!out->meta) return snap_fail(err, errlen, "out of memory");
    for (const json_node *e = json_first(doc, meta); e; e = json_next(doc, e)) {
        snapshot_meta *m = &out->meta[out->num_meta++];
        if (!snap_check_text("metadata key", e->key, e->key_len, sizeof m->key, false, err, errlen)) return false;
        memcpy(m->key, e->key, e->key_len);
        if (e->type != JSON_STRING)
            return snap_fail(err, errlen, "metadata '%s' is a JSON %s, not a string (safetensors metadata values are strings)",
                             m->key, json_type_name(e->type));
        snprintf(shown, sizeof shown, "value of metadata '%.30s'", m->key);
        if (!snap_check_text(shown, e->text, e->len, sizeof m->value, true, err, errlen)) return false;
        memcpy(m->value, e->text, e->len);
    }
    if ((dup = snap_duplicate(out->meta[0].key, sizeof *out->meta, out->num_meta, &oom)))
        return snap_fail(err, errlen, "metadata key '%s' appears twice", dup);
    return oom ? snap_fail(err, errlen, "out of memory") : true;
}

static inline bool snap_read_shape(const json_doc *doc, const json_node *shape, snapshot_tensor *t, char *err, size_t errlen) {
    if (shape->type != JSON_ARRAY)
        return snap_fail(err, errlen, "tensor '%s' shape is a JSON %s, not an array", t->name, json_type_name(shape->type));
    if (shape->count > SNAPSHOT_MAX_DIMS)
        return snap_fail(err, errlen, "tensor '%s' has %d dimensions (at most %d)", t->name, shape->count, SNAPSHOT_MAX_DIMS);
    t->ndim = 0;
    for (const json_node *d = json_first(doc, shape); d; d = json_next(doc, d)) {
        uint64_t v;
        if (!json_u64(d, &v) || v > (uint64_t)INT64_MAX)
            return snap_fail(err, errlen, "tensor '%s' shape entry %d is not a non-negative integer", t->name, t->ndim + 1);
        t->shape[t->ndim++] = (int64_t)v;
    }
    return true;
}

static inline bool snap_read_offsets(const json_doc *doc, const json_node *offsets, const char *name, snap_span *span,
                                     char *err, size_t errlen) {
    const json_node *begin = json_first(doc, offsets), *end = json_next(doc, begin);
    if (offsets->type != JSON_ARRAY || offsets->count != 2 || !json_u64(begin, &span->begin) || !json_u64(end, &span->end))
        return snap_fail(err, errlen, "tensor '%s' data_offsets is not [begin, end] with two non-negative integers", name);
    return true;
}

// The offsets against the data part, the dtype and the shape.
static inline bool snap_check_extent(const snapshot_tensor *t, const snap_span *s, uint64_t data_bytes, char *err, size_t errlen) {
    char shape[96];
    uint64_t bytes;
    size_t elem = snapshot_dtype_size(t->dtype);
    if (s->end < s->begin)
        return snap_fail(err, errlen, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", t->name, s->begin, s->end);
    if (s->end > data_bytes)
        return snap_fail(err, errlen, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] end beyond the data (%" PRIu64 " bytes)",
                         t->name, s->begin, s->end, data_bytes);
    snap_shape_text(t->ndim, t->shape, shape, sizeof shape);
    if (!snap_tensor_bytes(elem, t->ndim, t->shape, &bytes) || bytes != s->end - s->begin)
        return snap_fail(err, errlen, "tensor '%s' is %s %s but its data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes",
                         t->name, t->dtype, shape, s->begin, s->end, s->end - s->begin);
    if (s->begin % elem != 0)
        return snap_fail(err, errlen, "tensor '%s' starts at byte %" PRIu64 ", not a multiple of its element size %zu"
                         " (this reader needs aligned tensors)", t->name, s->begin, elem);
    return true;
}

static inline bool snap_read_tensor(const json_doc *doc, const json_node *e, snapshot_tensor *t, snap_span *span,
                                    uint64_t data_bytes, char *err, size_t errlen) {
    const json_node *dtype = NULL, *shape = NULL, *offsets = NULL;
    char shown[72];
    if (!snap_check_text("tensor name", e->key, e->key_len, sizeof t->name, false, err, errlen)) return false;
    memcpy(t->name, e->key, e->key_len);
    if (e->type != JSON_OBJECT) return snap_fail(err, errlen, "tensor '%s' is a JSON %s, not an object", t->name, json_type_name(e->type));
    for (const json_node *f = json_first(doc, e); f; f = json_next(doc, f)) {
        const json_node **slot = snap_key_is(f, "dtype") ? &dtype : snap_key_is(f, "shape") ? &shape
                               : snap_key_is(f, "data_offsets") ? &offsets : NULL;
        if (!slot || *slot)
            return snap_fail(err, errlen, "tensor '%s' has %s key '%s'", t->name, slot ? "a second" : "an unexpected",
                             snap_shown(f->key, f->key_len, shown, sizeof shown));
        *slot = f;
    }
    if (!dtype || !shape || !offsets)
        return snap_fail(err, errlen, "tensor '%s' has no %s", t->name, !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (dtype->type != JSON_STRING || dtype->len >= sizeof t->dtype || snapshot_dtype_size(dtype->text) == 0)
        return snap_fail(err, errlen, "tensor '%s' has unknown dtype '%s'", t->name,
                         dtype->type == JSON_STRING ? snap_shown(dtype->text, dtype->len, shown, sizeof shown) : json_type_name(dtype->type));
    memcpy(t->dtype, dtype->text, dtype->len);
    return snap_read_shape(doc, shape, t, err, errlen) && snap_read_offsets(doc, offsets, t->name, span, err, errlen) &&
           snap_check_extent(t, span, data_bytes, err, errlen);
}

// The tensor entries and __metadata__ of the header; *crc is the checksum it records.
static inline bool snap_read_entries(const json_doc *doc, snapshot_t *out, snap_span **spans, uint64_t data_bytes,
                                     uint32_t *crc, char *err, size_t errlen) {
    const json_node *root = json_root(doc), *meta = NULL;
    bool oom;
    const char *dup;
    for (const json_node *e = json_first(doc, root); e; e = json_next(doc, e))
        if (snap_key_is(e, "__metadata__")) {
            if (meta) return snap_fail(err, errlen, "the header has __metadata__ twice");
            meta = e;
        }
    if (!snap_read_meta(doc, meta, out, err, errlen) || !snap_check_format(out, crc, err, errlen)) return false;
    int n = root->count - 1;
    if (n > SNAPSHOT_MAX_TENSORS) return snap_fail(err, errlen, "the header lists %d tensors (at most %d)", n, SNAPSHOT_MAX_TENSORS);
    out->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *out->tensors);
    *spans = calloc((size_t)(n > 0 ? n : 1), sizeof **spans);
    if (!out->tensors || !*spans) return snap_fail(err, errlen, "out of memory for %d tensors", n);
    for (const json_node *e = json_first(doc, root); e; e = json_next(doc, e)) {
        if (e == meta) continue;
        int i = out->num_tensors++;
        (*spans)[i].index = i;
        if (!snap_read_tensor(doc, e, &out->tensors[i], &(*spans)[i], data_bytes, err, errlen)) return false;
    }
    if ((dup = snap_duplicate(out->tensors[0].name, sizeof *out->tensors, out->num_tensors, &oom)))
        return snap_fail(err, errlen, "two tensors are named '%s'", dup);
    return oom ? snap_fail(err, errlen, "out of memory") : true;
}

static int snap_compare_spans(const void *a, const void *b) {
    const snap_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// safetensors requires the tensors to cover the data part exactly, back to
// back: no overlap (one tensor's bytes read as another's) and no gap
// (bytes that belong to nothing, a sign of a damaged header).
static inline bool snap_check_layout(const snapshot_t *s, snap_span *spans, uint64_t data_bytes, char *err, size_t errlen) {
    const char *rule = "(safetensors needs the tensors back to back)";
    uint64_t pos = 0;
    qsort(spans, (size_t)s->num_tensors, sizeof *spans, snap_compare_spans);
    for (int i = 0; i < s->num_tensors; i++) {
        const snap_span *a = &spans[i > 0 ? i - 1 : 0], *b = &spans[i];
        if (b->begin < pos)
            return snap_fail(err, errlen, "tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap",
                             s->tensors[a->index].name, a->begin, a->end, s->tensors[b->index].name, b->begin, b->end);
        if (b->begin > pos)
            return snap_fail(err, errlen, "bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor %s", pos, b->begin, rule);
        pos = b->end;
    }
    if (pos != data_bytes)
        return snap_fail(err, errlen, "bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor %s", pos, data_bytes, rule);
    return true;
}

// Where the checksum's 8 hex digits are in the raw header (before the
// parser decoded it in place). The checksum must be written literally: a
// value spelled with escapes ("crc32c:\u0030...") would leave the digits
// somewhere the writer could not have zeroed them.
static inline bool snap_checksum_at(const json_doc *doc, const char *header, const char *raw, size_t header_len,
                                    size_t *digits, char *err, size_t errlen) {
    const json_node *meta = json_member(doc, json_root(doc), "__metadata__");
    const json_node *sum = json_member(doc, meta, "checksum"); // exists and is 15 bytes: snap_check_format
    size_t at = (size_t)(sum->text - header);
    if (at + 16 > header_len || memcmp(raw + at, sum->text, 15) != 0 || raw[at + 15] != '"')
        return snap_fail(err, errlen, "the checksum is written with JSON escapes (it must be plain crc32c:<8 hex digits>)");
    *digits = at + 7;
    return true;
}

// Reads the tensor bytes into one blob and checks the CRC of the whole file;
// crc already holds the length and the header (snap_crc_head).
static inline bool snap_read_data(int fd, snapshot_t *s, const snap_span *spans, uint64_t data_bytes, snapshot_crc *crc,
                                  uint32_t expected, char *err, size_t errlen) {
    if (data_bytes > SIZE_MAX - 1 || !(s->blob = malloc(data_bytes ? (size_t)data_bytes : 1)))
        return snap_fail(err, errlen, "out of memory for %" PRIu64 " bytes of tensor data", data_bytes);
    s->blob_bytes = (size_t)data_bytes;
    if (!snap_read_all(fd, s->blob, s->blob_bytes, "the tensor data", err, errlen)) return false;
    snapshot_crc_update(crc, s->blob, s->blob_bytes);
    if (snapshot_crc_final(crc) != expected)
        return snap_fail(err, errlen, "checksum mismatch: header or tensor bytes changed (file damaged?): the header says crc32c:%08" PRIx32
                         ", the file has crc32c:%08" PRIx32, expected, snapshot_crc_final(crc));
    for (int i = 0; i < s->num_tensors; i++) {
        snapshot_tensor *t = &s->tensors[spans[i].index];
        t->data = (const char *)s->blob + spans[i].begin;
        t->bytes = (size_t)(spans[i].end - spans[i].begin);
    }
    return true;
}

// The header as it was on disk, with the checksum's digits as "00000000",
// folded into a new CRC; false (err set) when the checksum is not literal.
static inline bool snap_crc_of_header(const json_doc *doc, char *header, size_t header_len, snapshot_crc *crc,
                                      char *err, size_t errlen) {
    char *raw = header + header_len + 1; // snap_read_header keeps the raw copy right after the parsed one
    size_t digits = 0;
    if (!snap_checksum_at(doc, header, raw, header_len, &digits, err, errlen)) return false;
    memset(raw + digits, '0', 8);
    snap_crc_head(crc, raw, header_len);
    return true;
}

static inline void snapshot_release(snapshot_t *s) {
    free(s->tensors);
    free(s->meta);
    free(s->blob);
    memset(s, 0, sizeof *s);
}

// Reads and validates the whole file. On failure returns false with a
// one-line reason in err (the caller names the file) and *out holds nothing.
static inline bool snapshot_read(const char *path, snapshot_t *out, char *err, size_t errlen) {
    char *header = NULL, jerr[200];
    size_t header_len = 0;
    uint64_t data_bytes = 0;
    uint32_t crc = 0;
    json_doc doc = {NULL, 0, 0};
    snap_span *spans = NULL;
    memset(out, 0, sizeof *out);
    if (strlen(path) >= sizeof out->path) return snap_fail(err, errlen, "the path is longer than %zu bytes", sizeof out->path - 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return snap_fail(err, errlen, "cannot open it: %s", strerror(errno));
    bool ok = snap_read_header(fd, &header, &header_len, &data_bytes, err, errlen);
    if (ok && !json_parse(header, header_len, &doc, jerr, sizeof jerr)) ok = snap_fail(err, errlen, "bad header: %s", jerr);
    snapshot_crc sum;
    ok = ok && snap_read_entries(&doc, out, &spans, data_bytes, &crc, err, errlen) &&
         snap_check_layout(out, spans, data_bytes, err, errlen) && snap_crc_of_header(&doc, header, header_len, &sum, err, errlen) &&
         snap_read_data(fd, out, spans, data_bytes, &sum, crc, err, errlen);
    close(fd);
    json_free(&doc);
    free(header);
    free(spans);
    if (!ok) snapshot_release(out);
    else snprintf(out->path, sizeof out->path, "%.*s", (int)sizeof out->path - 1, path);
    return ok;
}

// ---------------------------------------------------------------- using a loaded snapshot

// The value of a metadata key, or NULL.
static inline const char *snapshot_meta_get(const snapshot_t *s, const char *key) {
    for (int i = 0; i < s->num_meta; i++)
        if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
    return NULL;
}

// A metadata value that must be a whole number (the epoch, a step, a position).
static inline bool snapshot_meta_i64(const snapshot_t *s, const char *key, int64_t *out, char *err, size_t errlen) {
    const char *text = snapshot_meta_get(s, key);
    char *end;
    if (!text) return snap_fail(err, errlen, "snapshot has no '%s'", key);
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || isspace((unsigned char)text[0]))
        return snap_fail(err, errlen, "snapshot has %s='%s', not a whole number", key, text);
    *out = v;
    return true;
}

static inline const snapshot_tensor *snapshot_find(const snapshot_t *s, const char *name) {
    for (int i = 0; i < s->num_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
    return NULL;
}

// Does the snapshot hold tensor name with this dtype and shape, as this run's
// model expects? Otherwise err says what differs, e.g. "tensor 'w' has shape
// [64, 1] in the snapshot but this run expects [1, 1]".
static inline bool snapshot_expect_tensor(const snapshot_t *s, const char *name, const char *dtype, int ndim,
                                          const int64_t *shape, char *err, size_t errlen) {
    const snapshot_tensor *t = snapshot_find(s, name);
    char have[160], want[160];
    snap_shape_text(ndim, shape, want, sizeof want);
    if (!t) return snap_fail(err, errlen, "snapshot has no tensor '%s' (this run expects %s %s)", name, dtype, want);
    if (strcmp(t->dtype, dtype) != 0)
        return snap_fail(err, errlen, "tensor '%s' is %s in the snapshot but this run expects %s", name, t->dtype, dtype);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return snap_fail(err, errlen, "tensor '%s' has shape %s in the snapshot but this run expects %s", name,
                         snap_shape_text(t->ndim, t->shape, have, sizeof have), want);
    return true;
}

// Checks the tensor as snapshot_expect_tensor does, then copies its bytes to dst.
static inline bool snapshot_copy(const snapshot_t *s, const char *name, const char *dtype, int ndim,
                                 const int64_t *shape, void *dst, char *err, size_t errlen) {
    if (!snapshot_expect_tensor(s, name, dtype, ndim, shape, err, errlen)) return false;
    const snapshot_tensor *t = snapshot_find(s, name);
    if (t->bytes > 0) memcpy(dst, t->data, t->bytes);
    return true;
}

// Does metadata key hold value, as this run has it? Otherwise err names both:
// "snapshot has features=64 but this run has features=1".
static inline bool snapshot_expect_meta(const snapshot_t *s, const char *key, const char *value, char *err, size_t errlen) {
    const char *have = snapshot_meta_get(s, key);
    if (!have) return snap_fail(err, errlen, "snapshot has no %s (this run has %s=%s)", key, key, value);
    if (strcmp(have, value) != 0)
        return snap_fail(err, errlen, "snapshot has %s=%s but this run has %s=%s", key, have, key, value);
    return true;
}

// ---------------------------------------------------------------- series of snapshots

// "runs/x/snapshot.safetensors" -> directory "runs/x", stem "snapshot".
static inline bool snap_series_parts(const char *path_template, char dir[SNAPSHOT_PATH_MAX], char stem[SNAPSHOT_PATH_MAX]) {
    const char *suffix = ".safetensors";
    if (!snap_split_path(path_template, dir, stem)) return false;
    size_t n = strlen(stem), s = strlen(suffix);
    if (n > s && strcmp(stem + n - s, suffix) == 0) stem[n - s] = '\0';
    return true;
}

// The file of one step: "runs/x/snapshot.safetensors", 42 -> "runs/x/snapshot.0000000042.safetensors".
static inline bool snapshot_step_path(const char *path_template, int64_t step, char *out, size_t size) {
    char dir[SNAPSHOT_PATH_MAX], stem[SNAPSHOT_PATH_MAX];
    if (step < 0 || step > SNAPSHOT_MAX_STEP || !snap_series_parts(path_template, dir, stem)) return false;
    int n = snprintf(out, size, "%s/%s.%010" PRId64 ".safetensors", dir, stem, step);
    return n > 0 && (size_t)n < size;
}

// Matches "<stem>.<10 digits>.safetensors", or with temp the temporary file of
// one, ".<stem>.<10 digits>.safetensors.<pid>.tmp".
static inline bool snap_series_match(const char *name, const char *stem, bool temp, int64_t *step) {
    size_t n = strlen(stem);
    int64_t v = 0;
    if (temp && *name++ != '.') return false;
    if (strncmp(name, stem, n) != 0 || name[n] != '.') return false;
    name += n + 1;
    for (int i = 0; i < 10; i++, name++) {
        if (!isdigit((unsigned char)*name)) return false;
        v = v * 10 + (*name - '0');
    }
    if (strncmp(name, ".safetensors", 12) != 0) return false;
    name += 12;
    if (temp) {
        if (*name++ != '.' || !isdigit((unsigned char)*name)) return false;
        while (isdigit((unsigned char)*name)) name++;
        if (strcmp(name, ".tmp") != 0) return false;
    } else if (*name) return false;
    *step = v;
    return true;
}

typedef struct { int64_t step; char name[256]; } snap_entry;

static int snap_compare_newest(const void *a, const void *b) {
    const snap_entry *x = a, *y = b;
    return x->step == y->step ? 0 : x->step > y->step ? -1 : 1;
}

// The files of a series in dir, newest step first; the count, or -1 with err.
static inline int snap_series_list(const char *dir, const char *stem, bool temp, snap_entry **out, char *err, size_t errlen) {
    int n = 0, cap = 0;
    struct dirent *e;
    int64_t step;
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d && errno == ENOENT) return 0; // no directory yet: no snapshots yet
    if (!d) {
        snap_fail_errno(err, errlen, "cannot list directory", dir);
        return -1;
    }
    for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
        if (!snap_series_match(e->d_name, stem, temp, &step)) continue;
        if (n == cap) {
            snap_entry *grown = realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *grown);
            if (!grown) die("out of memory listing %s", dir);
            *out = grown;
        }
        (*out)[n].step = step;
        snprintf((*out)[n].name, sizeof (*out)[n].name, "%s", e->d_name);
        n++;
    }
    if (errno) {
        snap_fail_errno(err, errlen, "cannot list directory", dir);
        n = -1;
    }
    closedir(d);
    if (n > 0) qsort(*out, (size_t)n, sizeof **out, snap_compare_newest);
    return n;
}

static inline void snap_remove(const char *dir, const char *name) {
    char path[SNAPSHOT_PATH_MAX + 260];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) < 0 && errno != ENOENT) {
        course_say("warning: cannot delete old snapshot file %s: %s", path, strerror(errno));
    }
}

// After step was saved: keeps it and the newest keep-1 others, and removes
// temporary files that crashed writers of this series left behind.
static inline void snap_prune(const char *dir, const char *stem, int64_t step, int keep) {
    snap_entry *list;
    char err[SNAPSHOT_PATH_MAX + 100];
    int n = snap_series_list(dir, stem, false, &list, err, sizeof err), kept = 1;
    for (int i = 0; i < n; i++) {
        if (list[i].step == step) continue;
        if (keep <= 0 || kept < keep) kept++;
        else snap_remove(dir, list[i].name);
    }
    free(list);
    n = snap_series_list(dir, stem, true, &list, err, sizeof err);
    for (int i = 0; i < n; i++) snap_remove(dir, list[i].name);
    free(list);
}

// Writes "<dir>/<stem>.<step, 10 digits>.safetensors" (path_template is e.g.
// "runs/06/snapshot.safetensors") atomically, then deletes older files of
// the series beyond the newest keep (keep <= 0 keeps all). The new file is
// durable before anything is deleted, and it is never deleted itself.
static inline bool snapshot_save_step(const char *path_template, int64_t step, const snapshot_tensor *t, int nt,
                                      const snapshot_meta *m, int nm, int keep, char *err, size_t errlen) {
    char path[SNAPSHOT_PATH_MAX], dir[SNAPSHOT_PATH_MAX], stem[SNAPSHOT_PATH_MAX];
    if (step < 0 || step > SNAPSHOT_MAX_STEP)
        return snap_fail(err, errlen, "snapshot step %" PRId64 " is outside 0..%lld", step, SNAPSHOT_MAX_STEP);
    if (!snap_series_parts(path_template, dir, stem) || !snapshot_step_path(path_template, step, path, sizeof path))
        return snap_fail(err, errlen, "snapshot path '%s' is empty, too long or a directory", path_template);
    if (!snapshot_write(path, t, nt, m, nm, err, errlen)) return false;
    snap_prune(dir, stem, step, keep);
    return true;
}

__attribute__((format(printf, 3, 4)))
static inline void snap_report(char *report, size_t size, const char *fmt, ...) {
    if (!report || size == 0) return;
    size_t used = strlen(report);
    if (used > 0 && used + 1 < size) {
        report[used++] = '\n';
        report[used] = '\0';
    }
    va_list args;
    va_start(args, fmt);
    if (used < size) vsnprintf(report + used, size - used, fmt, args);
    va_end(args);
}

// Loads the newest snapshot of the series that validates. Each newer file
// that was refused gets a line in report ("snapshot X is damaged (reason)"),
// then "resuming from older snapshot Y". Temporary files are never candidates.
// Returns 1 when one was loaded, 0 when the series has none, -1 when none is valid.
static inline int snapshot_load_latest(const char *path_template, snapshot_t *out, char *report, size_t reportlen) {
    char dir[SNAPSHOT_PATH_MAX], stem[SNAPSHOT_PATH_MAX], path[SNAPSHOT_PATH_MAX + 260], err[SNAPSHOT_PATH_MAX + 200];
    snap_entry *list;
    memset(out, 0, sizeof *out);
    if (report && reportlen) report[0] = '\0';
    if (!snap_series_parts(path_template, dir, stem)) {
        snap_report(report, reportlen, "snapshot path '%s' is empty, too long or a directory", path_template);
        return -1;
    }
    int n = snap_series_list(dir, stem, false, &list, err, sizeof err);
    int result = n == 0 ? 0 : -1;
    if (n < 0) snap_report(report, reportlen, "%s", err);
    for (int i = 0; i < n && result < 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, list[i].name);
        if (!snapshot_read(path, out, err, sizeof err)) {
            snap_report(report, reportlen, "snapshot %s is damaged (%s)", path, err);
            continue;
        }
        result = 1;
        if (i > 0) snap_report(report, reportlen, "resuming from older snapshot %s", path);
    }
    free(list);
    return result;
}

#endif
