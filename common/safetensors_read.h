// safetensors_read.h - read a safetensors file (safetensors.h) back, and
// trust nothing in it until it is checked.
//
// A file can be truncated by a full disk, damaged on the way, or written by
// someone else. The reader checks, in this order, and names the first
// problem in one line:
//   1. the 8-byte header length against the file's size;
//   2. the header: strict JSON (json.h), an object of tensors and an
//      optional __metadata__ of strings;
//   3. each tensor: a known dtype, a shape of non-negative integers whose
//      bytes equal its data_offsets, inside the data, aligned to its
//      element size;
//   4. the layout: the tensors cover the data back to back, without
//      overlaps or gaps;
//   5. the checksum of the whole file, when the metadata records one.
// No file can crash it, and no damaged header can make it allocate more
// than the file holds.
//
//   safetensors_t f;
//   if (!safetensors_read(path, &f, err, sizeof err)) die("%s: %s", path, err);
//   const safetensors_tensor *w = safetensors_find(&f, "w");  // w->data, w->shape, ...
//   safetensors_release(&f);
#ifndef COURSE_SAFETENSORS_READ_H
#define COURSE_SAFETENSORS_READ_H

#include "json.h"
#include "safetensors.h"

// ---------------------------------------------------------------- reading

typedef struct { uint64_t begin, end; int index; } st_span;

static inline bool st_read_all(int fd, void *buf, size_t n, const char *what, char *err, size_t errlen) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n < (1u << 30) ? n : (1u << 30));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return files_fail(err, errlen, "cannot read %s: %s", what, strerror(errno));
        if (r == 0) return files_fail(err, errlen, "the file ended inside %s (did it change while being read?)", what);
        p += r;
        n -= (size_t)r;
    }
    return true;
}

// Reads the length and the header (NUL-terminated, for the JSON parser, and
// followed by a copy of itself as read); *data_bytes is the size of the rest of the file.
static inline bool st_read_header(int fd, char **header, size_t *header_len, uint64_t *data_bytes,
                                    char *err, size_t errlen) {
    struct stat st;
    unsigned char len8[8];
    uint64_t n = 0;
    if (fstat(fd, &st) < 0) return files_fail(err, errlen, "cannot stat the file: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return files_fail(err, errlen, "not a regular file");
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) return files_fail(err, errlen, "the file is %" PRIu64 " bytes long, too short for the 8-byte header length (truncated?)", size);
    if (!st_read_all(fd, len8, 8, "the header length", err, errlen)) return false;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > size - 8) return files_fail(err, errlen, "header length %" PRIu64 " is larger than the file (%" PRIu64 " bytes)", n, size);
    if (n > SAFETENSORS_MAX_HEADER) return files_fail(err, errlen, "header length %" PRIu64 " is absurd (the limit is %d bytes)", n, SAFETENSORS_MAX_HEADER);
    *header = malloc(2 * n + 1); // room for a raw copy after it: the JSON parser decodes in place
    if (!*header) return files_fail(err, errlen, "out of memory for a header of %" PRIu64 " bytes", n);
    if (!st_read_all(fd, *header, n, "the header", err, errlen)) return false;
    (*header)[n] = '\0';
    memcpy(*header + n + 1, *header, n);
    if (n == 0 || (*header)[0] != '{') return files_fail(err, errlen, "the header does not start with '{' (not a safetensors file?)");
    *header_len = n;
    *data_bytes = size - 8 - n;
    return true;
}

static inline bool st_key_is(const json_node *n, const char *key) {
    return n->key_len == strlen(key) && memcmp(n->key, key, n->key_len) == 0;
}

// The value of a metadata key, or NULL.
static inline const char *safetensors_meta_get(const safetensors_t *s, const char *key) {
    for (int i = 0; i < s->num_meta; i++)
        if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
    return NULL;
}

// The checksum the metadata records, if it records one: crc32c:<8 hex digits>.
static inline bool st_check_checksum(safetensors_t *s, uint32_t *crc, char *err, size_t errlen) {
    const char *checksum = safetensors_meta_get(s, "checksum");
    char hex[9];
    int used = 0;
    s->has_checksum = checksum != NULL;
    if (!checksum) return true;
    if (strlen(checksum) != 15 || sscanf(checksum, "crc32c:%8[0-9a-f]%n", hex, &used) != 1 || used != 15)
        return files_fail(err, errlen, "checksum '%s' is not crc32c:<8 lowercase hex digits>", checksum);
    *crc = (uint32_t)strtoul(hex, NULL, 16);
    return true;
}

static inline bool st_read_meta(const json_doc *doc, const json_node *meta, safetensors_t *out, char *err, size_t errlen) {
    char shown[72];
    bool oom;
    const char *dup;
    if (!meta) return true; // safetensors makes __metadata__ optional
    if (meta->type != JSON_OBJECT) return files_fail(err, errlen, "__metadata__ is a JSON %s, not an object", json_type_name(meta->type));
    if (meta->count > SAFETENSORS_MAX_META) return files_fail(err, errlen, "__metadata__ has %d entries (at most %d)", meta->count, SAFETENSORS_MAX_META);
    out->meta = calloc((size_t)(meta->count ? meta->count : 1), sizeof *out->meta);
    if (!out->meta) return files_fail(err, errlen, "out of memory");
    for (const json_node *e = json_first(doc, meta); e; e = json_next(doc, e)) {
        safetensors_meta *m = &out->meta[out->num_meta++];
        if (!st_check_text("metadata key", e->key, e->key_len, sizeof m->key, false, err, errlen)) return false;
        memcpy(m->key, e->key, e->key_len);
        if (e->type != JSON_STRING)
            return files_fail(err, errlen, "metadata '%s' is a JSON %s, not a string (safetensors metadata values are strings)",
                             m->key, json_type_name(e->type));
        snprintf(shown, sizeof shown, "value of metadata '%.30s'", m->key);
        if (!st_check_text(shown, e->text, e->len, sizeof m->value, true, err, errlen)) return false;
        memcpy(m->value, e->text, e->len);
    }
    if ((dup = st_duplicate(out->meta[0].key, sizeof *out->meta, out->num_meta, &oom)))
        return files_fail(err, errlen, "metadata key '%s' appears twice", dup);
    return oom ? files_fail(err, errlen, "out of memory") : true;
}

static inline bool st_read_shape(const json_doc *doc, const json_node *shape, safetensors_tensor *t, char *err, size_t errlen) {
    if (shape->type != JSON_ARRAY)
        return files_fail(err, errlen, "tensor '%s' shape is a JSON %s, not an array", t->name, json_type_name(shape->type));
    if (shape->count > SAFETENSORS_MAX_DIMS)
        return files_fail(err, errlen, "tensor '%s' has %d dimensions (at most %d)", t->name, shape->count, SAFETENSORS_MAX_DIMS);
    t->ndim = 0;
    for (const json_node *d = json_first(doc, shape); d; d = json_next(doc, d)) {
        uint64_t v;
        if (!json_u64(d, &v) || v > (uint64_t)INT64_MAX)
            return files_fail(err, errlen, "tensor '%s' shape entry %d is not a non-negative integer", t->name, t->ndim + 1);
        t->shape[t->ndim++] = (int64_t)v;
    }
    return true;
}

static inline bool st_read_offsets(const json_doc *doc, const json_node *offsets, const char *name, st_span *span,
                                     char *err, size_t errlen) {
    const json_node *begin = json_first(doc, offsets), *end = json_next(doc, begin);
    if (offsets->type != JSON_ARRAY || offsets->count != 2 || !json_u64(begin, &span->begin) || !json_u64(end, &span->end))
        return files_fail(err, errlen, "tensor '%s' data_offsets is not [begin, end] with two non-negative integers", name);
    return true;
}

// The offsets against the data part, the dtype and the shape.
static inline bool st_check_extent(const safetensors_tensor *t, const st_span *s, uint64_t data_bytes, char *err, size_t errlen) {
    char shape[96];
    uint64_t bytes;
    size_t elem = safetensors_dtype_size(t->dtype);
    if (s->end < s->begin)
        return files_fail(err, errlen, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", t->name, s->begin, s->end);
    if (s->end > data_bytes)
        return files_fail(err, errlen, "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] end beyond the data (%" PRIu64 " bytes)",
                         t->name, s->begin, s->end, data_bytes);
    safetensors_shape_text(t->ndim, t->shape, shape, sizeof shape);
    if (!st_tensor_bytes(elem, t->ndim, t->shape, &bytes) || bytes != s->end - s->begin)
        return files_fail(err, errlen, "tensor '%s' is %s %s but its data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes",
                         t->name, t->dtype, shape, s->begin, s->end, s->end - s->begin);
    if (s->begin % elem != 0)
        return files_fail(err, errlen, "tensor '%s' starts at byte %" PRIu64 ", not a multiple of its element size %zu"
                         " (this reader needs aligned tensors)", t->name, s->begin, elem);
    return true;
}

static inline bool st_read_tensor(const json_doc *doc, const json_node *e, safetensors_tensor *t, st_span *span,
                                    uint64_t data_bytes, char *err, size_t errlen) {
    const json_node *dtype = NULL, *shape = NULL, *offsets = NULL;
    char shown[72];
    if (!st_check_text("tensor name", e->key, e->key_len, sizeof t->name, false, err, errlen)) return false;
    memcpy(t->name, e->key, e->key_len);
    if (e->type != JSON_OBJECT) return files_fail(err, errlen, "tensor '%s' is a JSON %s, not an object", t->name, json_type_name(e->type));
    for (const json_node *f = json_first(doc, e); f; f = json_next(doc, f)) {
        const json_node **slot = st_key_is(f, "dtype") ? &dtype : st_key_is(f, "shape") ? &shape
                               : st_key_is(f, "data_offsets") ? &offsets : NULL;
        if (!slot || *slot)
            return files_fail(err, errlen, "tensor '%s' has %s key '%s'", t->name, slot ? "a second" : "an unexpected",
                             st_shown(f->key, f->key_len, shown, sizeof shown));
        *slot = f;
    }
    if (!dtype || !shape || !offsets)
        return files_fail(err, errlen, "tensor '%s' has no %s", t->name, !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (dtype->type != JSON_STRING || dtype->len >= sizeof t->dtype || safetensors_dtype_size(dtype->text) == 0)
        return files_fail(err, errlen, "tensor '%s' has unknown dtype '%s'", t->name,
                         dtype->type == JSON_STRING ? st_shown(dtype->text, dtype->len, shown, sizeof shown) : json_type_name(dtype->type));
    memcpy(t->dtype, dtype->text, dtype->len);
    return st_read_shape(doc, shape, t, err, errlen) && st_read_offsets(doc, offsets, t->name, span, err, errlen) &&
           st_check_extent(t, span, data_bytes, err, errlen);
}

// The tensor entries and __metadata__ of the header; *crc is the checksum it records.
static inline bool st_read_entries(const json_doc *doc, safetensors_t *out, st_span **spans, uint64_t data_bytes,
                                     uint32_t *crc, char *err, size_t errlen) {
    const json_node *root = json_root(doc), *meta = NULL;
    bool oom;
    const char *dup;
    for (const json_node *e = json_first(doc, root); e; e = json_next(doc, e))
        if (st_key_is(e, "__metadata__")) {
            if (meta) return files_fail(err, errlen, "the header has __metadata__ twice");
            meta = e;
        }
    if (!st_read_meta(doc, meta, out, err, errlen) || !st_check_checksum(out, crc, err, errlen)) return false;
    int n = root->count - (meta ? 1 : 0);
    if (n > SAFETENSORS_MAX_TENSORS) return files_fail(err, errlen, "the header lists %d tensors (at most %d)", n, SAFETENSORS_MAX_TENSORS);
    out->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *out->tensors);
    *spans = calloc((size_t)(n > 0 ? n : 1), sizeof **spans);
    if (!out->tensors || !*spans) return files_fail(err, errlen, "out of memory for %d tensors", n);
    for (const json_node *e = json_first(doc, root); e; e = json_next(doc, e)) {
        if (e == meta) continue;
        int i = out->num_tensors++;
        (*spans)[i].index = i;
        if (!st_read_tensor(doc, e, &out->tensors[i], &(*spans)[i], data_bytes, err, errlen)) return false;
    }
    if ((dup = st_duplicate(out->tensors[0].name, sizeof *out->tensors, out->num_tensors, &oom)))
        return files_fail(err, errlen, "two tensors are named '%s'", dup);
    return oom ? files_fail(err, errlen, "out of memory") : true;
}

static int st_compare_spans(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// safetensors requires the tensors to cover the data part exactly, back to
// back: no overlap (one tensor's bytes read as another's) and no gap
// (bytes that belong to nothing, a sign of a damaged header).
static inline bool st_check_layout(const safetensors_t *s, st_span *spans, uint64_t data_bytes, char *err, size_t errlen) {
    const char *rule = "(safetensors needs the tensors back to back)";
    uint64_t pos = 0;
    qsort(spans, (size_t)s->num_tensors, sizeof *spans, st_compare_spans);
    for (int i = 0; i < s->num_tensors; i++) {
        const st_span *a = &spans[i > 0 ? i - 1 : 0], *b = &spans[i];
        if (b->begin < pos)
            return files_fail(err, errlen, "tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap",
                             s->tensors[a->index].name, a->begin, a->end, s->tensors[b->index].name, b->begin, b->end);
        if (b->begin > pos)
            return files_fail(err, errlen, "bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor %s", pos, b->begin, rule);
        pos = b->end;
    }
    if (pos != data_bytes)
        return files_fail(err, errlen, "bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor %s", pos, data_bytes, rule);
    return true;
}

// Where the checksum's 8 hex digits are in the raw header (before the
// parser decoded it in place). The checksum must be written literally: a
// value spelled with escapes ("crc32c:\u0030...") would leave the digits
// somewhere the writer could not have zeroed them.
static inline bool st_checksum_at(const json_doc *doc, const char *header, const char *raw, size_t header_len,
                                    size_t *digits, char *err, size_t errlen) {
    const json_node *meta = json_member(doc, json_root(doc), "__metadata__");
    const json_node *sum = json_member(doc, meta, "checksum"); // exists and is 15 bytes: st_check_checksum
    size_t at = (size_t)(sum->text - header);
    if (at + 16 > header_len || memcmp(raw + at, sum->text, 15) != 0 || raw[at + 15] != '"')
        return files_fail(err, errlen, "the checksum is written with JSON escapes (it must be plain crc32c:<8 hex digits>)");
    *digits = at + 7;
    return true;
}

// Reads the tensor bytes into one blob and checks the CRC of the whole file
// when the metadata records one; crc already holds the length and the
// header (st_crc_head).
static inline bool st_read_data(int fd, safetensors_t *s, const st_span *spans, uint64_t data_bytes, crc32c_t *crc,
                                  uint32_t expected, char *err, size_t errlen) {
    if (data_bytes > SIZE_MAX - 1 || !(s->blob = malloc(data_bytes ? (size_t)data_bytes : 1)))
        return files_fail(err, errlen, "out of memory for %" PRIu64 " bytes of tensor data", data_bytes);
    s->blob_bytes = (size_t)data_bytes;
    if (!st_read_all(fd, s->blob, s->blob_bytes, "the tensor data", err, errlen)) return false;
    if (s->has_checksum) crc32c_update(crc, s->blob, s->blob_bytes);
    if (s->has_checksum && crc32c_final(crc) != expected)
        return files_fail(err, errlen, "checksum mismatch: header or tensor bytes changed (file damaged?): the header says crc32c:%08" PRIx32
                         ", the file has crc32c:%08" PRIx32, expected, crc32c_final(crc));
    for (int i = 0; i < s->num_tensors; i++) {
        safetensors_tensor *t = &s->tensors[spans[i].index];
        t->data = (const char *)s->blob + spans[i].begin;
        t->bytes = (size_t)(spans[i].end - spans[i].begin);
    }
    return true;
}

// The header as it was on disk, with the checksum's digits as "00000000",
// folded into a new CRC; false (err set) when the checksum is not literal.
static inline bool st_crc_of_header(const json_doc *doc, char *header, size_t header_len, crc32c_t *crc,
                                      char *err, size_t errlen) {
    char *raw = header + header_len + 1; // st_read_header keeps the raw copy right after the parsed one
    size_t digits = 0;
    if (!st_checksum_at(doc, header, raw, header_len, &digits, err, errlen)) return false;
    memset(raw + digits, '0', 8);
    st_crc_head(crc, raw, header_len);
    return true;
}

static inline void safetensors_release(safetensors_t *s) {
    free(s->tensors);
    free(s->meta);
    free(s->blob);
    memset(s, 0, sizeof *s);
}

// Reads and validates the whole file, and its checksum when the metadata
// records one (files of this library always do). On failure returns false
// with a one-line reason in err (the caller names the file) and *out holds
// nothing.
static inline bool safetensors_read(const char *path, safetensors_t *out, char *err, size_t errlen) {
    char *header = NULL, jerr[200];
    size_t header_len = 0;
    uint64_t data_bytes = 0;
    uint32_t crc = 0;
    json_doc doc = {NULL, 0, 0};
    st_span *spans = NULL;
    memset(out, 0, sizeof *out);
    if (strlen(path) >= sizeof out->path) return files_fail(err, errlen, "the path is longer than %zu bytes", sizeof out->path - 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return files_fail(err, errlen, "cannot open it: %s", strerror(errno));
    bool ok = st_read_header(fd, &header, &header_len, &data_bytes, err, errlen);
    if (ok && !json_parse(header, header_len, &doc, jerr, sizeof jerr)) ok = files_fail(err, errlen, "bad header: %s", jerr);
    crc32c_t sum;
    sum.crc = 0; // set by st_crc_of_header when the file has a checksum
    ok = ok && st_read_entries(&doc, out, &spans, data_bytes, &crc, err, errlen) &&
         st_check_layout(out, spans, data_bytes, err, errlen) &&
         (!out->has_checksum || st_crc_of_header(&doc, header, header_len, &sum, err, errlen)) &&
         st_read_data(fd, out, spans, data_bytes, &sum, crc, err, errlen);
    close(fd);
    json_free(&doc);
    free(header);
    free(spans);
    if (!ok) safetensors_release(out);
    else snprintf(out->path, sizeof out->path, "%.*s", (int)sizeof out->path - 1, path);
    return ok;
}

// ---------------------------------------------------------------- using a file that was read

static inline const safetensors_tensor *safetensors_find(const safetensors_t *s, const char *name) {
    for (int i = 0; i < s->num_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
    return NULL;
}

#endif
