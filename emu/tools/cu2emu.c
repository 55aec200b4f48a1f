// cu2emu.c - prepares a .cu file for the emulated GPU's C++ compiler.
//
// Usage: cu2emu INPUT.cu OUTPUT.cpp
//
// Two pieces of CUDA syntax are not C++, and this tool rewrites exactly
// those, leaving every other character (and every line break) in place so
// that compiler messages, sanitizer reports and __LINE__ point at the
// original .cu line:
//
//   kernel<<<grid, block, shared, stream>>>(a, b);
//     -> emu_launch(kernel, "kernel", __FILE__, __LINE__, emu_config(grid, block, shared, stream), a, b);
//
//   __shared__ float tile[32][33];       (inside a function)
//     -> a reference named tile to this declaration's place in the block's
//        shared memory (emu_shared_static), one place per block
//
//   extern __shared__ float buffer[];    (dynamic shared memory)
//     -> an object named buffer that indexes the block's dynamic part
//
//   asm volatile("red.global.add.u64 [%0],%1;" :: "l"(p), "l"(v) : "memory");
//     -> atomicAdd((unsigned long long *)(p), (unsigned long long)(v))
//        (the one piece of inline PTX it knows; any other stays, and fails)
//
// and it reads two more: a kernel declared with __launch_bounds__(N) has
// its launches in this file checked against N (emu_bounded), as a GPU
// refuses a launch of more threads per block than the bound; and every
// kernel's body starts by naming the kernel to the emulator
// (emu_kernel_registrar, on the same line), so that cudaLaunchKernel,
// which is given only the kernel's address, can find its parameters.
//
// Comments, strings, character literals and preprocessor lines are copied
// untouched. A __shared__ declaration it cannot understand (several names
// in one declaration, __shared__ at file scope) stops the build with the
// file, the line and what to write instead.
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
} text;

static const char *input_name;

// Kernels declared with __launch_bounds__: name, and the bound's text.
typedef struct {
    char name[128];
    char bound[256];
} launch_bound;
static launch_bound bounds[256];
static int bound_count;

// Kernel bodies: where each opens, and what to say there.
typedef struct {
    size_t at; // the '{'
    char text[600];
} injection;
static injection injections[1024];
static int injection_count;

static void put(text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->data = realloc(t->data, t->cap);
        if (!t->data) {
            fprintf(stderr, "cu2emu: out of memory\n");
            exit(1);
        }
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = 0;
}

static void puts_text(text *t, const char *s) { put(t, s, strlen(s)); }

static void putf(text *t, const char *fmt, ...) {
    char buf[4096];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    puts_text(t, buf);
}

__attribute__((noreturn)) static void fail(int line, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s:%d: error: (cu2emu, the CUDA=emu build) ", input_name, line);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

static void trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    size_t k = 0;
    while (s[k] && isspace((unsigned char)s[k])) k++;
    memmove(s, s + k, strlen(s + k) + 1);
}

static int line_at(const char *src, size_t pos) {
    int line = 1;
    for (size_t i = 0; i < pos; i++) line += src[i] == '\n';
    return line;
}

// Length of the comment, string or character literal starting at s[i], or 0.
static size_t skip_opaque(const char *s, size_t i, size_t n) {
    size_t j = i;
    if (s[j] == '/' && j + 1 < n && s[j + 1] == '/') {
        while (j < n && s[j] != '\n') j++;
        return j - i;
    }
    if (s[j] == '/' && j + 1 < n && s[j + 1] == '*') {
        j += 2;
        while (j + 1 < n && !(s[j] == '*' && s[j + 1] == '/')) j++;
        return (j + 2 <= n ? j + 2 : n) - i;
    }
    if (s[j] == '"' || s[j] == '\'') {
        char q = s[j++];
        while (j < n && s[j] != q) {
            if (s[j] == '\\') j++;
            j++;
        }
        return (j < n ? j + 1 : n) - i;
    }
    return 0;
}

// A preprocessor line (with its continuations) starting at s[i], or 0.
static size_t skip_directive(const char *s, size_t i, size_t n, bool at_line_start) {
    if (!at_line_start || s[i] != '#') return 0;
    size_t j = i;
    while (j < n && s[j] != '\n') {
        if (s[j] == '\\' && j + 1 < n && s[j + 1] == '\n') j++;
        j++;
    }
    return j - i;
}

// The callee just before "<<<": identifier, template arguments, '::' parts.
static size_t callee_start(const text *out) {
    size_t j = out->len;
    while (j > 0 && isspace((unsigned char)out->data[j - 1])) j--;
    for (;;) {
        if (j > 0 && out->data[j - 1] == '>') {
            int depth = 0;
            while (j > 0) {
                char c = out->data[--j];
                if (c == '>') depth++;
                else if (c == '<' && --depth == 0) break;
            }
        }
        while (j > 0 && ident_char(out->data[j - 1])) j--;
        if (j >= 2 && out->data[j - 1] == ':' && out->data[j - 2] == ':') j -= 2;
        else return j;
    }
}

// From s[i] (just after "<<<") to the matching ">>>"; returns its index.
static size_t find_config_end(const char *s, size_t i, size_t n, int line) {
    int depth = 0;
    while (i + 2 < n) {
        size_t opaque = skip_opaque(s, i, n);
        if (opaque) {
            i += opaque;
            continue;
        }
        char c = s[i];
        if (c == '(' || c == '[' || c == '{') depth++;
        else if (c == ')' || c == ']' || c == '}') depth--;
        else if (depth == 0 && c == '>' && s[i + 1] == '>' && s[i + 2] == '>') return i;
        i++;
    }
    fail(line, "a kernel launch's <<< has no matching >>>");
}

// Skips ( ... ) starting at s[i] == '('; returns the index after ')'.
static size_t skip_parens(const char *s, size_t i, size_t n) {
    int depth = 0;
    while (i < n) {
        size_t opaque = skip_opaque(s, i, n);
        if (opaque) {
            i += opaque;
            continue;
        }
        if (s[i] == '(') depth++;
        else if (s[i] == ')' && --depth == 0) return i + 1;
        i++;
    }
    return n;
}

// __launch_bounds__(MAX[, MIN...]) at s[i]: remember MAX for the function
// declared after it (the last name before its parameter list).
static void note_launch_bound(const char *s, size_t i, size_t n) {
    size_t open = i + strlen("__launch_bounds__");
    while (open < n && isspace((unsigned char)s[open])) open++;
    if (open >= n || s[open] != '(') return;
    size_t close = skip_parens(s, open, n), arg_end = open + 1;
    for (int depth = 0; arg_end < close - 1; arg_end++) { // the first argument: up to a comma at depth 0
        if (s[arg_end] == '(') depth++;
        else if (s[arg_end] == ')') depth--;
        else if (s[arg_end] == ',' && depth == 0) break;
    }
    size_t j = close, name_end = 0, name_start = 0;
    while (j < n && s[j] != '(' && s[j] != ';' && s[j] != '{') {
        if (ident_char(s[j]) && (j == 0 || !ident_char(s[j - 1]))) {
            name_start = j;
            while (j < n && ident_char(s[j])) j++;
            name_end = j;
            continue;
        }
        j++;
    }
    if (j >= n || s[j] != '(' || !name_end || bound_count == (int)(sizeof bounds / sizeof bounds[0])) return;
    launch_bound *b = &bounds[bound_count++];
    snprintf(b->name, sizeof b->name, "%.*s", (int)(name_end - name_start), s + name_start);
    snprintf(b->bound, sizeof b->bound, "%.*s", (int)(arg_end - open - 1), s + open + 1);
}

// Words that may stand between a template's <...> and __global__.
static bool is_specifier(const char *w, size_t n) {
    static const char *words[] = {"static", "inline", "__host__", "__device__", "__forceinline__", "__noinline__"};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (strlen(words[k]) == n && !strncmp(words[k], w, n)) return true;
    return false;
}

// The names of a template's parameters, "T, HS, Rest...", from the text
// between its < and > (s[open+1 .. close-1]).
static void template_arguments(const char *s, size_t open, size_t close, char *out, size_t size) {
    out[0] = 0;
    size_t start = open + 1;
    int depth = 0;
    for (size_t k = open + 1; k <= close; k++) {
        char c = k < close ? s[k] : ',';
        if (c == '<' || c == '(') depth++;
        else if ((c == '>' || c == ')') && k < close) depth--;
        if (c != ',' || depth > 0) continue;
        size_t end = k; // one parameter: s[start, end); its name is the last identifier before any '='
        for (size_t e = start; e < k; e++)
            if (s[e] == '=') {
                end = e;
                break;
            }
        bool pack = false;
        for (size_t e = start; e + 2 < end; e++) pack = pack || !strncmp(s + e, "...", 3);
        while (end > start && !ident_char(s[end - 1])) end--;
        size_t name = end;
        while (name > start && ident_char(s[name - 1])) name--;
        snprintf(out + strlen(out), size - strlen(out), "%s%.*s%s", out[0] ? ", " : "", (int)(end - name), s + name,
                 pack ? "..." : "");
        start = k + 1;
    }
}

// __global__ at s[i]: if a definition follows, plan the kernel's
// registration at the start of its body.
static void note_kernel(const char *s, size_t i, size_t n) {
    // Backwards: specifiers, then perhaps template <...>.
    size_t j = i;
    for (;;) {
        while (j > 0 && isspace((unsigned char)s[j - 1])) j--;
        size_t w = j;
        while (w > 0 && ident_char(s[w - 1])) w--;
        if (w == j || !is_specifier(s + w, j - w)) break;
        j = w;
    }
    char targs[400] = "";
    if (j > 0 && s[j - 1] == '>') {
        size_t close = j - 1, open = close;
        for (int depth = 0; open > 0; open--) {
            if (s[open] == '>') depth++;
            else if (s[open] == '<' && --depth == 0) break;
        }
        size_t t = open;
        while (t > 0 && isspace((unsigned char)s[t - 1])) t--;
        if (t >= 8 && !strncmp(s + t - 8, "template", 8)) template_arguments(s, open, close, targs, sizeof targs);
    }
    // Forwards: the name before the parameter list (not __launch_bounds__'s), then '{' or ';'.
    size_t k = i + strlen("__global__"), name = 0, name_len = 0;
    while (k < n && s[k] != ';' && s[k] != '{') {
        if (ident_char(s[k]) && !ident_char(s[k - 1])) {
            size_t e = k;
            while (e < n && ident_char(s[e])) e++;
            size_t p = e;
            while (p < n && isspace((unsigned char)s[p])) p++;
            if (p < n && s[p] == '(') {
                if (e - k == 17 && !strncmp(s + k, "__launch_bounds__", 17)) {
                    k = skip_parens(s, p, n);
                    continue;
                }
                name = k, name_len = e - k;
                k = skip_parens(s, p, n);
                break;
            }
            k = e;
            continue;
        }
        k++;
    }
    while (k < n && s[k] != '{' && s[k] != ';') k++; // const, noexcept, ...
    if (!name_len || k >= n || s[k] != '{' || injection_count == (int)(sizeof injections / sizeof injections[0])) return;
    injection *in = &injections[injection_count++];
    in->at = k;
    snprintf(in->text, sizeof in->text, " (void)emu_kernel_registrar<&%.*s%s%s%s>::done;", (int)name_len, s + name,
             targs[0] ? "<" : "", targs, targs[0] ? ">" : "");
}

// The bound of the kernel a launch names ("ns::kernel<T, 4>" is kernel), or NULL.
static const char *bound_of(const char *callee) {
    char base[512];
    snprintf(base, sizeof base, "%s", callee);
    char *angle = strchr(base, '<');
    if (angle) *angle = 0;
    trim(base);
    char *colon = strrchr(base, ':');
    const char *name = colon ? colon + 1 : base;
    for (int k = 0; k < bound_count; k++)
        if (!strcmp(bounds[k].name, name)) return bounds[k].bound;
    return NULL;
}

// asm [volatile] ("red[.global].add.TYPE [%0],%1;" :: "l"(p), "l"(v) [: "memory"]) at s[i]:
// rewritten into an atomicAdd; returns the index after it, or 0 if it is another asm.
static size_t rewrite_reduction_asm(const char *s, size_t i, size_t n, text *out) {
    size_t j = i + 3;
    while (j < n && (isspace((unsigned char)s[j]) || ident_char(s[j]))) j++; // volatile, __volatile__
    if (j >= n || s[j] != '(') return 0;
    size_t end = skip_parens(s, j, n);
    char body[512];
    if (end - j >= sizeof body) return 0;
    snprintf(body, sizeof body, "%.*s", (int)(end - j), s + j);
    static const struct { const char *ptx, *type; } forms[] = {
        {"red.global.add.u64", "unsigned long long"}, {"red.add.u64", "unsigned long long"},
        {"red.global.add.u32", "unsigned int"},       {"red.add.u32", "unsigned int"},
        {"red.global.add.s32", "int"},                {"red.global.add.f32", "float"},
    };
    const char *type = NULL;
    for (size_t f = 0; f < sizeof forms / sizeof forms[0] && !type; f++) {
        char want[64];
        snprintf(want, sizeof want, "(\"%s [%%0],%%1;\"", forms[f].ptx);
        if (!strncmp(body, want, strlen(want))) type = forms[f].type;
    }
    if (!type) return 0;
    // The two operands: the text inside the parentheses after "l" (or "r", "f").
    char operand[2][200];
    const char *p = strstr(body, "::");
    for (int k = 0; k < 2; k++) {
        p = p ? strchr(p, '"') : NULL;
        p = p ? strchr(p + 1, '"') : NULL; // the constraint's closing quote
        const char *open = p ? strchr(p, '(') : NULL;
        if (!open) return 0;
        size_t close = skip_parens(body, (size_t)(open - body), strlen(body));
        snprintf(operand[k], sizeof operand[k], "%.*s", (int)(close - (size_t)(open - body) - 2), open + 1);
        p = body + close;
    }
    putf(out, "atomicAdd((%s *)(%s), (%s)(%s))", type, operand[0], type, operand[1]);
    for (size_t k = i; k < end; k++)
        if (s[k] == '\n') put(out, "\n", 1); // keep the line count
    return end;
}

static size_t rewrite_launch(const char *s, size_t i, size_t n, text *out) {
    int line = line_at(s, i);
    size_t start = callee_start(out), end = out->len;
    while (end > start && isspace((unsigned char)out->data[end - 1])) end--;
    if (start == end) fail(line, "cannot find the kernel's name before <<<");
    char callee[512];
    size_t clen = end - start < sizeof callee - 1 ? end - start : sizeof callee - 1;
    memcpy(callee, out->data + start, clen);
    callee[clen] = 0;
    // Keep the whitespace after the name (its line breaks), drop the name.
    char *tail = strdup(out->data + end);
    out->len = start;
    puts_text(out, tail);
    free(tail);
    const char *bound = bound_of(callee);
    putf(out, "emu_launch(%s, \"%s\", __FILE__, __LINE__, %semu_config(", callee, callee, bound ? "emu_bounded(" : "");
    size_t cfg_end = find_config_end(s, i + 3, n, line);
    put(out, s + i + 3, cfg_end - (i + 3));
    puts_text(out, ")");
    if (bound) putf(out, ", (%s))", bound);
    size_t j = cfg_end + 3;
    while (j < n && isspace((unsigned char)s[j])) put(out, s + j++, 1);
    if (j >= n || s[j] != '(') fail(line, "a kernel launch's >>> must be followed by its arguments in parentheses");
    size_t k = j + 1;
    while (k < n && isspace((unsigned char)s[k])) k++;
    if (k < n && s[k] == ')') { // no arguments
        put(out, s + j + 1, k - j - 1);
        puts_text(out, ")");
        return k + 1;
    }
    puts_text(out, ", ");
    return j + 1;
}

// Removes a trailing keyword (extern, static) from the output; true if it was there.
static bool drop_keyword(text *out, const char *word) {
    size_t j = out->len, w = strlen(word);
    while (j > 0 && isspace((unsigned char)out->data[j - 1])) j--;
    if (j < w || strncmp(out->data + j - w, word, w) != 0 || (j > w && ident_char(out->data[j - w - 1])))
        return false;
    char *tail = strdup(out->data + j);
    out->len = j - w;
    puts_text(out, tail);
    free(tail);
    return true;
}

// Pulls "__align__(N)" or "alignas(N)" out of decl; returns N text or "".
static void take_alignment(char *decl, char *align, size_t size) {
    align[0] = 0;
    const char *words[] = {"__align__", "alignas"};
    for (int w = 0; w < 2; w++) {
        char *p = strstr(decl, words[w]);
        if (!p) continue;
        char *open = strchr(p, '('), *close = open ? strchr(open, ')') : NULL;
        if (!close) continue;
        snprintf(align, size, "%.*s", (int)(close - open - 1), open + 1);
        memmove(p, close + 1, strlen(close + 1) + 1);
    }
}

static size_t rewrite_shared(const char *s, size_t i, size_t n, text *out, int brace_depth) {
    int line = line_at(s, i);
    bool is_extern = drop_keyword(out, "extern");
    drop_keyword(out, "static");
    size_t j = i + strlen("__shared__"), semi = j;
    while (semi < n && s[semi] != ';') semi++;
    if (semi >= n) fail(line, "__shared__ declaration without ';'");
    char decl[1024];
    snprintf(decl, sizeof decl, "%.*s", (int)(semi - j), s + j);
    if (strchr(decl, '\n')) fail(line, "write each __shared__ declaration on one line");
    if (strchr(decl, ',') && !strchr(decl, '<'))
        fail(line, "declare one __shared__ variable per declaration (split '%s')", decl);
    if (strchr(decl, '=')) fail(line, "__shared__ variables cannot have initialisers");
    char align[128];
    take_alignment(decl, align, sizeof align);
    trim(decl);
    char *bracket = strchr(decl, '[');
    char dims[512] = "";
    if (bracket) {
        snprintf(dims, sizeof dims, "%s", bracket);
        *bracket = 0;
        trim(decl);
    }
    size_t dl = strlen(decl), name_at = dl;
    while (name_at > 0 && ident_char(decl[name_at - 1])) name_at--;
    if (name_at == dl || name_at == 0) fail(line, "cannot read the type and name of '__shared__ %s'", decl);
    char name[128], type[512];
    snprintf(name, sizeof name, "%s", decl + name_at);
    decl[name_at] = 0;
    snprintf(type, sizeof type, "%s", decl);
    trim(type);
    if (is_extern) {
        if (strcmp(dims, "[]") != 0) fail(line, "extern __shared__ must be an array of unknown size: T name[]");
        putf(out, "static const emu_dynamic_shared<%s> %s = {}", type, name);
        return semi;
    }
    if (brace_depth == 0)
        fail(line, "__shared__ '%s' at file scope is not emulated; declare it inside the kernel or device function", name);
    const char *al = align[0] ? align : "1";
    // An array becomes a reference to an array (T (&name)[N]), a scalar a plain reference.
    char ref[700], ptr[700];
    if (dims[0]) {
        snprintf(ref, sizeof ref, "%s (&%s)%s", type, name, dims);
        snprintf(ptr, sizeof ptr, "%s (*)%s", type, dims);
    } else {
        snprintf(ref, sizeof ref, "%s &%s", type, name);
        snprintf(ptr, sizeof ptr, "%s *", type);
    }
    putf(out,
         "static emu_shared_site emu_site_%s_%d; %s = *reinterpret_cast<%s>(emu_shared_static(&emu_site_%s_%d, "
         "sizeof(%s %s), (alignof(%s) > (%s) ? alignof(%s) : (%s)), \"%s\"))",
         name, line, ref, ptr, name, line, type, dims, type, al, type, al, name);
    return semi;
}

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cu2emu: cannot open %s\n", path);
        exit(1);
    }
    text t = {0};
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) put(&t, buf, got);
    if (ferror(f)) {
        fprintf(stderr, "cu2emu: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    if (!t.data) put(&t, "", 0);
    *size = t.len;
    return t.data;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cu2emu INPUT.cu OUTPUT.cpp\n");
        return 2;
    }
    input_name = argv[1];
    size_t n;
    char *s = read_file(argv[1], &n);
    bool at_start = true;
    for (size_t i = 0; i < n;) { // first pass: the kernels' launch bounds
        size_t skip = skip_opaque(s, i, n);
        if (!skip) skip = skip_directive(s, i, n, at_start);
        if (skip) {
            i += skip, at_start = false;
            continue;
        }
        if (!strncmp(s + i, "__launch_bounds__", 17) && (i == 0 || !ident_char(s[i - 1])) && !ident_char(s[i + 17]))
            note_launch_bound(s, i, n);
        if (!strncmp(s + i, "__global__", 10) && (i == 0 || !ident_char(s[i - 1])) && !ident_char(s[i + 10]))
            note_kernel(s, i, n);
        at_start = s[i] == '\n' || (at_start && isspace((unsigned char)s[i]));
        i++;
    }
    text out = {0};
    putf(&out, "#line 1 \"%s\"\n", argv[1]);
    int depth = 0, next_injection = 0;
    bool line_start = true;
    for (size_t i = 0; i < n;) {
        if (next_injection < injection_count && injections[next_injection].at == i) {
            put(&out, "{", 1);
            puts_text(&out, injections[next_injection++].text);
            depth++;
            i++;
            line_start = false;
            continue;
        }
        size_t skip = skip_opaque(s, i, n);
        if (!skip) skip = skip_directive(s, i, n, line_start);
        if (skip) {
            put(&out, s + i, skip);
            i += skip;
            line_start = false;
            continue;
        }
        char c = s[i];
        if (c == '<' && i + 2 < n && s[i + 1] == '<' && s[i + 2] == '<') {
            i = rewrite_launch(s, i, n, &out);
            continue;
        }
        if (c == 'a' && !strncmp(s + i, "asm", 3) && (i == 0 || !ident_char(s[i - 1])) && !ident_char(s[i + 3])) {
            size_t after = rewrite_reduction_asm(s, i, n, &out);
            if (after) {
                i = after;
                continue;
            }
        }
        if (c == '_' && !strncmp(s + i, "__shared__", 10) && (i == 0 || !ident_char(s[i - 1])) &&
            !ident_char(s[i + 10])) {
            i = rewrite_shared(s, i, n, &out, depth);
            continue;
        }
        if (c == '{') depth++;
        if (c == '}') depth--;
        if (c == '\n') line_start = true;
        else if (!isspace((unsigned char)c)) line_start = false;
        put(&out, s + i, 1);
        i++;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f || fwrite(out.data, 1, out.len, f) != out.len || fclose(f) != 0) {
        fprintf(stderr, "cu2emu: cannot write %s\n", argv[2]);
        return 1;
    }
    free(s);
    free(out.data);
    return 0;
}
