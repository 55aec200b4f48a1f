// fuzz_json - the course's JSON reader, common/json.h (safetensors headers,
// tokenizer.json).
//
// Input: any bytes, as JSON text. Promises checked:
// - a refusal has a one-line reason and leaves nothing allocated;
// - an accepted tree is consistent: each container's count is the number
//   of its children, members of objects have keys and elements of arrays do
//   not, strings are valid UTF-8 with a NUL right after len bytes, and
//   json_u64 agrees with the digits it was given;
// - the reader never looks past the end of the text (the text is copied to a
//   block of exactly its size with no NUL after it, so AddressSanitizer
//   sees any read beyond it).
#include "fuzz.h"
#include "json.h"

// Visits n and everything under it; depth guards this walk itself.
static void check_tree(const json_doc *doc, const json_node *n, bool in_object, int depth) {
    fuzz_check(depth <= JSON_MAX_DEPTH + 1, "json: tree deeper than JSON_MAX_DEPTH");
    fuzz_check(in_object == (n->key != NULL), "json: a key on an array element, or none on a member");
    if (n->key) fuzz_check(n->key[n->key_len] == '\0' && json_utf8_valid(n->key, n->key_len), "json: key not NUL-terminated or not UTF-8");
    if (n->type == JSON_STRING)
        fuzz_check(n->text[n->len] == '\0' && json_utf8_valid(n->text, n->len), "json: string not NUL-terminated or not UTF-8");
    if (n->type == JSON_NUMBER) {
        uint64_t v = 0, digits = 0;
        bool plain = n->len > 0 && n->len <= 19;
        for (size_t i = 0; plain && i < n->len; i++) plain = n->text[i] >= '0' && n->text[i] <= '9';
        for (size_t i = 0; plain && i < n->len; i++) digits = digits * 10 + (uint64_t)(n->text[i] - '0');
        if (plain) fuzz_check(json_u64(n, &v) && v == digits, "json: json_u64 disagrees with the digits");
        double d;
        fuzz_check(json_double(n, &d), "json: json_double refused a number the parser accepted");
    }
    int count = 0;
    for (const json_node *c = json_first(doc, n); c; c = json_next(doc, c)) {
        count++;
        check_tree(doc, c, n->type == JSON_OBJECT, depth + 1);
    }
    fuzz_check(count == n->count, "json: count differs from the number of children");
    fuzz_check(count == 0 || n->type == JSON_ARRAY || n->type == JSON_OBJECT, "json: a scalar with children");
}

static void fuzz_course_json(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1), err[200] = "";
    json_doc doc;
    if (!text) abort();
    memcpy(text, data, size);
    if (json_parse(text, size, &doc, err, sizeof err)) {
        fuzz_check(doc.count > 0, "json: accepted with no root");
        check_tree(&doc, json_root(&doc), false, 0);
        json_free(&doc);
    } else {
        fuzz_check(fuzz_one_line(err) && doc.nodes == NULL && doc.count == 0, "json: refusal without a one-line reason, or with nodes left");
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    fuzz_course_json(data, size);
    return 0;
}
