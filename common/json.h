// json.h - a small, strict JSON reader: text in, a tree of nodes out.
//
// Files the course reads back (snapshot headers above all) may be truncated,
// damaged or hand-edited, so this reader accepts exactly the JSON of RFC 8259
// and otherwise stops at the first problem, naming it and where it is
// (line, column and byte offset).
// It never reads outside the text it is given, it bounds the nesting depth
// (JSON_MAX_DEPTH) so hostile input cannot exhaust the stack, and it requires
// strings to be valid UTF-8. Duplicate keys are kept; callers that care check.
//
// It parses in place: a string is decoded inside the caller's buffer (an
// escape never decodes to more bytes than it was written with) and ends with
// a NUL, so the tree points into that buffer and lives as long as it does.
//
//   json_doc doc;
//   if (!json_parse(text, len, &doc, err, sizeof err)) ... // err: one line
//   const json_node *name = json_member(&doc, json_root(&doc), "name");
//   for (const json_node *n = json_first(&doc, obj); n; n = json_next(&doc, n)) ...
//   json_free(&doc);
#ifndef COURSE_JSON_H
#define COURSE_JSON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct {
    json_type type;
    const char *key;   // the member's name when the parent is an object (decoded, NUL-terminated), else NULL
    size_t key_len;    // bytes in key (a decoded \u0000 makes strlen(key) shorter)
    const char *text;  // JSON_STRING: the decoded value, NUL-terminated; JSON_NUMBER: the number as written (not terminated)
    size_t len;        // bytes in text
    int count;         // JSON_ARRAY and JSON_OBJECT: how many children
    int first_child;   // index of the first child, -1 when none
    int next;          // index of the next sibling, -1 for the last one
} json_node;

typedef struct {
    json_node *nodes;  // nodes[0] is the root
    int count, capacity;
} json_doc;

typedef struct {
    char *s;
    size_t len, pos;
    json_doc *doc;
    char *err;
    size_t errlen;
} json_parser;

static inline const char *json_type_name(json_type t) {
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return names[t];
}

// Length of the valid UTF-8 sequence at s (at most avail bytes), 0 if invalid.
// Overlong forms, surrogates and code points above U+10FFFF are invalid.
static inline size_t json_utf8_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (n > avail || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

static inline bool json_utf8_valid(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t n = json_utf8_len((const unsigned char *)s + i, len - i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

__attribute__((format(printf, 2, 3)))
static inline bool json_fail(json_parser *p, const char *fmt, ...) {
    if (!p->err || p->errlen == 0) return false;
    size_t line = 1, column = 1;   // where a person editing the file looks
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') line++, column = 1;
        else column++;
    }
    int used = snprintf(p->err, p->errlen, "JSON error at line %zu, column %zu (byte %zu): ", line, column, p->pos);
    if (used < 0 || (size_t)used >= p->errlen) return false;
    va_list args;
    va_start(args, fmt);
    vsnprintf(p->err + used, p->errlen - (size_t)used, fmt, args);
    va_end(args);
    return false;
}

// The character at the parse position, described for an error message.
static inline const char *json_here(const json_parser *p, char *buf, size_t size) {
    if (p->pos >= p->len) return "the end of the text";
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c >= 0x21 && c < 0x7F) snprintf(buf, size, "'%c'", c);
    else snprintf(buf, size, "byte 0x%02x", c);
    return buf;
}

static inline void json_skip_space(json_parser *p) {
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

// Appends a node; returns its index, or -1 (with the error set) when out of memory.
static inline int json_new_node(json_parser *p, json_type type) {
    json_doc *d = p->doc;
    if (d->count == d->capacity) {
        if (d->capacity > (1 << 29)) { json_fail(p, "too many values"); return -1; }
        int cap = d->capacity ? 2 * d->capacity : 16;
        json_node *grown = realloc(d->nodes, (size_t)cap * sizeof *grown);
        if (!grown) { json_fail(p, "out of memory"); return -1; }
        d->nodes = grown;
        d->capacity = cap;
    }
    json_node *n = &d->nodes[d->count];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->first_child = n->next = -1;
    return d->count++;
}

static inline int json_hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static inline size_t json_put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Decodes \uXXXX (and a following low surrogate) at p->pos, which is just
// after the 'u'; writes UTF-8 to *out and advances both.
static inline bool json_unicode_escape(json_parser *p, char **out) {
    int hi = p->pos + 4 <= p->len ? json_hex4(p->s + p->pos) : -1;
    if (hi < 0) return json_fail(p, "\\u needs four hex digits");
    p->pos += 4;
    uint32_t cp = (uint32_t)hi;
    if (hi >= 0xDC00 && hi <= 0xDFFF) return json_fail(p, "lone low surrogate \\u%04x", hi);
    if (hi >= 0xD800 && hi <= 0xDBFF) {
        int lo = p->pos + 6 <= p->len && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u'
                     ? json_hex4(p->s + p->pos + 2) : -1;
        if (lo < 0xDC00 || lo > 0xDFFF) return json_fail(p, "high surrogate \\u%04x without a low one", hi);
        p->pos += 6;
        cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
    }
    *out += json_put_utf8(*out, cp);
    return true;
}

static inline bool json_escape(json_parser *p, char **out) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (p->pos >= p->len) return json_fail(p, "unterminated string");
    char c = p->s[p->pos++];
    if (c == 'u') return json_unicode_escape(p, out);
    const char *hit = c ? strchr(from, c) : NULL;
    if (!hit) { p->pos--; return json_fail(p, "unknown escape \\%c", c >= 0x20 && c < 0x7F ? c : '?'); }
    *(*out)++ = to[hit - from];
    return true;
}

// Parses the string starting at the opening quote and decodes it in place.
static inline bool json_string(json_parser *p, const char **text, size_t *len) {
    p->pos++; // past the opening quote
    char *start = p->s + p->pos, *out = start;
    for (;;) {
        if (p->pos >= p->len) return json_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') break;
        if (c < 0x20) return json_fail(p, "control character 0x%02x inside a string (escape it)", c);
        if (c == '\\') {
            p->pos++;
            if (!json_escape(p, &out)) return false;
            continue;
        }
        size_t n = json_utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
        if (n == 0) return json_fail(p, "invalid UTF-8 inside a string");
        memmove(out, p->s + p->pos, n);
        out += n;
        p->pos += n;
    }
    *out = '\0'; // at or before the closing quote, which has been read
    p->pos++;
    *text = start;
    *len = (size_t)(out - start);
    return true;
}

static inline bool json_digits(json_parser *p) {
    size_t start = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    return p->pos > start;
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
static inline int json_number(json_parser *p) {
    size_t start = p->pos;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos < p->len && p->s[p->pos] == '0') p->pos++;
    else if (!json_digits(p)) { json_fail(p, "a number needs a digit here"); return -1; }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        if (!json_digits(p)) { json_fail(p, "a number needs digits after '.'"); return -1; }
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (!json_digits(p)) { json_fail(p, "a number needs digits in its exponent"); return -1; }
    }
    int node = json_new_node(p, JSON_NUMBER);
    if (node < 0) return -1;
    p->doc->nodes[node].text = p->s + start;
    p->doc->nodes[node].len = p->pos - start;
    return node;
}

static inline int json_literal(json_parser *p, const char *word, json_type type) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
        char buf[16];
        json_fail(p, "expected a value, found %s", json_here(p, buf, sizeof buf));
        return -1;
    }
    p->pos += n;
    return json_new_node(p, type);
}

static inline int json_value(json_parser *p, int depth);

// Links child after last (or as the first child of parent).
static inline void json_link(json_doc *d, int parent, int *last, int child) {
    if (*last < 0) d->nodes[parent].first_child = child;
    else d->nodes[*last].next = child;
    *last = child;
    d->nodes[parent].count++;
}

// After a member or element: ',' continues, close ends, anything else is an error.
static inline int json_after_item(json_parser *p, char close) {
    json_skip_space(p);
    char buf[16];
    if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; return 1; }
    if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; return 0; }
    json_fail(p, "expected ',' or '%c', found %s", close, json_here(p, buf, sizeof buf));
    return -1;
}

static inline int json_array(json_parser *p, int depth) {
    int node = json_new_node(p, JSON_ARRAY), last = -1, more = 1;
    if (node < 0) return -1;
    p->pos++;
    json_skip_space(p);
    if (p->pos < p->len && p->s[p->pos] == ']') { p->pos++; return node; }
    while (more == 1) {
        int child = json_value(p, depth + 1);
        if (child < 0) return -1;
        json_link(p->doc, node, &last, child);
        more = json_after_item(p, ']');
    }
    return more == 0 ? node : -1;
}

static inline int json_object(json_parser *p, int depth) {
    int node = json_new_node(p, JSON_OBJECT), last = -1, more = 1;
    if (node < 0) return -1;
    p->pos++;
    json_skip_space(p);
    if (p->pos < p->len && p->s[p->pos] == '}') { p->pos++; return node; }
    while (more == 1) {
        char buf[16];
        const char *key;
        size_t key_len;
        json_skip_space(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            json_fail(p, "expected a \"key\", found %s", json_here(p, buf, sizeof buf));
            return -1;
        }
        if (!json_string(p, &key, &key_len)) return -1;
        json_skip_space(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            json_fail(p, "expected ':' after a key, found %s", json_here(p, buf, sizeof buf));
            return -1;
        }
        p->pos++;
        int child = json_value(p, depth + 1);
        if (child < 0) return -1;
        p->doc->nodes[child].key = key;
        p->doc->nodes[child].key_len = key_len;
        json_link(p->doc, node, &last, child);
        more = json_after_item(p, '}');
    }
    return more == 0 ? node : -1;
}

static inline int json_value(json_parser *p, int depth) {
    char buf[16];
    if (depth > JSON_MAX_DEPTH) { json_fail(p, "nested deeper than %d levels", JSON_MAX_DEPTH); return -1; }
    json_skip_space(p);
    if (p->pos >= p->len) { json_fail(p, "expected a value, found the end of the text"); return -1; }
    char c = p->s[p->pos];
    if (c == '{') return json_object(p, depth);
    if (c == '[') return json_array(p, depth);
    if (c == 't') return json_literal(p, "true", JSON_TRUE);
    if (c == 'f') return json_literal(p, "false", JSON_FALSE);
    if (c == 'n') return json_literal(p, "null", JSON_NULL);
    if (c == '-' || (c >= '0' && c <= '9')) return json_number(p);
    if (c != '"') { json_fail(p, "expected a value, found %s", json_here(p, buf, sizeof buf)); return -1; }
    int node = json_new_node(p, JSON_STRING);
    if (node < 0) return -1;
    const char *text;
    size_t len;
    if (!json_string(p, &text, &len)) return -1;
    p->doc->nodes[node].text = text;
    p->doc->nodes[node].len = len;
    return node;
}

static inline void json_free(json_doc *doc) {
    free(doc->nodes);
    memset(doc, 0, sizeof *doc);
}

// Parses text[0..len) in place. On failure returns false with a one-line
// reason in err and leaves doc empty; there is nothing to free then.
static inline bool json_parse(char *text, size_t len, json_doc *doc, char *err, size_t errlen) {
    json_parser p = {text, len, 0, doc, err, errlen};
    memset(doc, 0, sizeof *doc);
    if (err && errlen) err[0] = '\0';
    if (len > (size_t)1 << 40) { json_fail(&p, "text too long"); return false; }
    bool ok = json_value(&p, 0) == 0;
    if (ok) {
        char buf[16];
        json_skip_space(&p);
        if (p.pos < p.len) ok = json_fail(&p, "unexpected %s after the end of the value", json_here(&p, buf, sizeof buf));
    }
    if (!ok) json_free(doc);
    return ok;
}

static inline const json_node *json_root(const json_doc *doc) {
    return doc->count > 0 ? &doc->nodes[0] : NULL;
}

static inline const json_node *json_first(const json_doc *doc, const json_node *n) {
    return n && n->first_child >= 0 ? &doc->nodes[n->first_child] : NULL;
}

static inline const json_node *json_next(const json_doc *doc, const json_node *n) {
    return n && n->next >= 0 ? &doc->nodes[n->next] : NULL;
}

// The first member of object obj named key, or NULL.
static inline const json_node *json_member(const json_doc *doc, const json_node *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const json_node *m = json_first(doc, obj); m; m = json_next(doc, m))
        if (m->key_len == n && memcmp(m->key, key, n) == 0) return m;
    return NULL;
}

// A number written as a plain non-negative integer (no sign, fraction or
// exponent) that fits in 64 bits; false for anything else.
static inline bool json_u64(const json_node *n, uint64_t *out) {
    if (!n || n->type != JSON_NUMBER || n->len == 0) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n->len; i++) {
        char c = n->text[i];
        if (c < '0' || c > '9') return false;
        if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(c - '0');
    }
    *out = v;
    return true;
}

static inline bool json_double(const json_node *n, double *out) {
    if (!n || n->type != JSON_NUMBER) return false;
    char *copy = malloc(n->len + 1); // the number is not NUL-terminated in the text
    if (!copy) return false;
    memcpy(copy, n->text, n->len);
    copy[n->len] = '\0';
    *out = strtod(copy, NULL);
    free(copy);
    return true;
}

#endif
