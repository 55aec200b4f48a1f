// flags.h - the command-line parser every program of the course uses.
//
// Accepts --name=value and --name value, with '_' and '-' spellings alike
// (--batch_size and --batch-size), short names (-b 8), and --help.
// Bad input never crashes: a one-line error names the flag (a value's
// control characters are shown escaped, so it stays one line), a usage line
// follows, and the program exits with status 2.
//
// A flag can also take its default from an environment variable
// (e.g. COURSE_DEVICE for --device); the command line wins over it.
//
// A program lists its flags with one call each (flag_int, flag_double,
// flag_bytes, flag_bool, flag_string, flag_choice), in the order --help
// shows them, then calls flags_parse; see flag_set below.
#ifndef COURSE_FLAGS_H
#define COURSE_FLAGS_H

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef enum {
    FLAG_INT,    // int *
    FLAG_DOUBLE, // double *
    FLAG_STRING, // const char **
    FLAG_BOOL,   // bool *; "--x" alone means true, or --x=true|false|1|0
    FLAG_BYTES,  // size_t *; accepts K, M, G suffixes (powers of 1024)
} flag_type;

typedef struct {
    const char *name;       // long name, written with '_'
    const char *short_name; // one letter for "-b 8", or NULL
    flag_type type;
    void *value;            // where the parsed value goes; holds the default
    const char *help;
    double min, max;        // allowed range for numbers; min > max: no range
    const char *choices;    // "auto|cpu|cuda": allowed strings, or NULL
    const char *env;        // environment variable that sets the default, or NULL
} flag_t;

// The most flags one program has (chapter 08 has 34).
#define FLAGS_MAX 64

// A program's flags: name it, then add its flags one call each, in the
// order --help lists them:
//   flag_set set = {.program = "01_single_gpu", .summary = "linear regression ..."};
//   flag_int(&set, "epochs", &o.epochs, 1, 100000, "passes over the data");
//   flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where to compute")->env = "COURSE_DEVICE";
//   flags_parse(&set, argc, argv);
// Each adder takes a pointer of its flag's type (the compiler checks it)
// whose value is the default, and returns the new flag, whose rarer fields
// (short_name, env) are set by name.
typedef struct {
    const char *program;    // name shown in messages
    const char *summary;    // one line saying what the program does
    const char *positional; // e.g. "PROGRAM [ARGS...]"; NULL if none allowed
    bool prefixes;          // also take an unambiguous prefix (--nnode for --nnodes), as
                            // Python's argparse does: ddprun, for torchrun's command lines
    flag_t flags[FLAGS_MAX];
    int count;
} flag_set;

static inline flag_t *flags_add(flag_set *set, flag_type type, const char *name, void *value,
                                double min, double max, const char *help) {
    if (set->count == FLAGS_MAX)
        die("flags: %s has more than %d flags; raise FLAGS_MAX in flags.h", set->program, FLAGS_MAX);
    flag_t *f = &set->flags[set->count++];
    *f = (flag_t){.name = name, .type = type, .value = value, .help = help, .min = min, .max = max};
    return f;
}

// Numbers, with the range they must lie in (bounds included).
static inline flag_t *flag_int(flag_set *set, const char *name, int *value, double min, double max,
                               const char *help) {
    return flags_add(set, FLAG_INT, name, value, min, max, help);
}
static inline flag_t *flag_double(flag_set *set, const char *name, double *value, double min,
                                  double max, const char *help) {
    return flags_add(set, FLAG_DOUBLE, name, value, min, max, help);
}
// A size in bytes: 8, 64K, 16M, 1G.
static inline flag_t *flag_bytes(flag_set *set, const char *name, size_t *value, double min,
                                 double max, const char *help) {
    return flags_add(set, FLAG_BYTES, name, value, min, max, help);
}
static inline flag_t *flag_bool(flag_set *set, const char *name, bool *value, const char *help) {
    return flags_add(set, FLAG_BOOL, name, value, 1, 0, help);
}
// Any text.
static inline flag_t *flag_string(flag_set *set, const char *name, const char **value,
                                  const char *help) {
    return flags_add(set, FLAG_STRING, name, value, 1, 0, help);
}
// One of a few words: choices is "auto|cpu|cuda".
static inline flag_t *flag_choice(flag_set *set, const char *name, const char **value,
                                  const char *choices, const char *help) {
    flag_t *f = flags_add(set, FLAG_STRING, name, value, 1, 0, help);
    f->choices = choices;
    return f;
}

static inline void flags_usage_line(const flag_set *set, FILE *out) {
    fprintf(out, "usage: %s [--flag value ...]%s%s (see --help)\n", set->program,
            set->positional ? " " : "", set->positional ? set->positional : "");
}

__attribute__((format(printf, 2, 3), noreturn))
static inline void flags_fail(const flag_set *set, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fflush(stdout);
    char line[8192];
    size_t at = (size_t)snprintf(line, sizeof line, "%s: error: ", set->program);
    course_one_line(line + at, sizeof line - at - 1, fmt, args); // one line, whatever the value held
    strcat(line, "\n");
    fputs(line, stderr);
    va_end(args);
    flags_usage_line(set, stderr);
    exit(EXIT_USAGE);
}

static inline void flags_format_value(const flag_t *f, char *buf, size_t size) {
    switch (f->type) {
    case FLAG_INT: snprintf(buf, size, "%d", *(int *)f->value); break;
    case FLAG_DOUBLE: snprintf(buf, size, "%g", *(double *)f->value); break;
    case FLAG_STRING: {
        const char *s = *(const char **)f->value;
        snprintf(buf, size, "%s", s ? s : "(none)");
        break;
    }
    case FLAG_BOOL: snprintf(buf, size, "%s", *(bool *)f->value ? "true" : "false"); break;
    case FLAG_BYTES: snprintf(buf, size, "%zu", *(size_t *)f->value); break;
    }
}

static inline void flags_print_help(const flag_set *set) {
    printf("%s - %s\n", set->program, set->summary);
    flags_usage_line(set, stdout);
    printf("\nflags (both --a_b and --a-b spellings work):\n");
    for (int i = 0; i < set->count; i++) {
        const flag_t *f = &set->flags[i];
        char name[64], value[64];
        snprintf(name, sizeof name, "%s%s --%s", f->short_name ? "-" : "   ",
                 f->short_name ? f->short_name : "", f->name);
        if (f->short_name) name[2] = ',';
        flags_format_value(f, value, sizeof value);
        printf("  %-24s %s (default %s", name, f->help, value);
        if (f->choices) printf("; one of %s", f->choices);
        if (f->env) printf("; env %s", f->env);
        printf(")\n");
    }
    printf("  %-24s print this help\n", "   --help");
}

// Names match when they are equal up to '_' versus '-'.
static inline bool flags_name_matches(const char *want, const char *given, size_t len) {
    if (strlen(want) != len) return false;
    for (size_t i = 0; i < len; i++) {
        char a = want[i] == '-' ? '_' : want[i];
        char b = given[i] == '-' ? '_' : given[i];
        if (a != b) return false;
    }
    return true;
}

static inline bool flags_parse_bytes(const char *text, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || v < 0 || !isfinite(v)) return false;
    double scale = 1;
    if (*end == 'K' || *end == 'k') scale = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') scale = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') scale = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0' || v * scale > 1e15) return false;
    *out = (size_t)(v * scale);
    return true;
}

static inline void flags_check_range(const flag_set *set, const flag_t *f, double v,
                                     const char *text) {
    if (f->min <= f->max && (v < f->min || v > f->max))
        flags_fail(set, "--%s must be between %.15g and %.15g, got '%s'", f->name, f->min,
                   f->max, text);
}

// Store text into the flag, or fail naming the flag. `origin` says where
// the text came from ("" for the command line, or the variable's name).
static inline void flags_set_value(const flag_set *set, const flag_t *f, const char *text,
                                   const char *origin) {
    char *end;
    char from[96] = "";
    if (origin[0]) snprintf(from, sizeof from, " (from %s)", origin);
    switch (f->type) {
    case FLAG_INT: {
        errno = 0;
        long v = strtol(text, &end, 10);
        if (end == text || *end != '\0' || errno || v < INT32_MIN || v > INT32_MAX)
            flags_fail(set, "--%s expects an integer, got '%s'%s", f->name, text, from);
        flags_check_range(set, f, (double)v, text);
        *(int *)f->value = (int)v;
        break;
    }
    case FLAG_DOUBLE: {
        errno = 0;
        double v = strtod(text, &end);
        if (end == text || *end != '\0' || errno || !isfinite(v))
            flags_fail(set, "--%s expects a number, got '%s'%s", f->name, text, from);
        flags_check_range(set, f, v, text);
        *(double *)f->value = v;
        break;
    }
    case FLAG_STRING:
        if (f->choices) {
            bool ok = false;
            size_t n = strlen(text);
            for (const char *c = f->choices; *c;) {
                const char *bar = strchr(c, '|');
                size_t len = bar ? (size_t)(bar - c) : strlen(c);
                if (len == n && strncmp(c, text, n) == 0) ok = true;
                c += len + (bar ? 1 : 0);
            }
            if (!ok)
                flags_fail(set, "--%s must be one of %s, got '%s'%s", f->name, f->choices,
                           text, from);
        }
        *(const char **)f->value = text;
        break;
    case FLAG_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "1") || !strcmp(text, "yes"))
            *(bool *)f->value = true;
        else if (!strcmp(text, "false") || !strcmp(text, "0") || !strcmp(text, "no"))
            *(bool *)f->value = false;
        else
            flags_fail(set, "--%s expects true or false, got '%s'%s", f->name, text, from);
        break;
    case FLAG_BYTES: {
        size_t v;
        if (!flags_parse_bytes(text, &v))
            flags_fail(set, "--%s expects a size like 8, 64K or 16M, got '%s'%s", f->name,
                       text, from);
        flags_check_range(set, f, (double)v, text);
        *(size_t *)f->value = v;
        break;
    }
    }
}

// With set->prefixes, a long name that is no flag's may begin exactly one
// flag's name; when it begins several, it is an error naming them.
static inline const flag_t *flags_find_prefix(const flag_set *set, const char *name, size_t len) {
    const flag_t *found = NULL;
    bool ambiguous = false;
    char candidates[512] = "";
    for (int i = 0; i < set->count; i++) {
        const flag_t *f = &set->flags[i];
        char head[128];
        if (len >= sizeof head || strlen(f->name) < len) continue;
        memcpy(head, f->name, len);   // the flag's name cut to the length given
        head[len] = '\0';
        if (!flags_name_matches(head, name, len)) continue;
        size_t at = strlen(candidates);
        snprintf(candidates + at, sizeof candidates - at, "%s--%s", found ? ", " : "", f->name);
        ambiguous = found != NULL;
        if (!found) found = f;
    }
    if (ambiguous)
        flags_fail(set, "ambiguous flag '--%.*s': it could be %s", (int)len, name, candidates);
    return found;
}

static inline const flag_t *flags_find(const flag_set *set, const char *name, size_t len,
                                       bool is_short) {
    for (int i = 0; i < set->count; i++) {
        const flag_t *f = &set->flags[i];
        if (is_short ? (f->short_name && strlen(f->short_name) == len &&
                        !strncmp(f->short_name, name, len))
                     : flags_name_matches(f->name, name, len))
            return f;
    }
    return !is_short && set->prefixes && len > 0 ? flags_find_prefix(set, name, len) : NULL;
}

// How many one-letter edits turn a into b ('-' and '_' count as equal):
// the Levenshtein distance, for "did you mean" on a mistyped flag.
static inline int flags_edit_distance(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diagonal = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            char x = a[i - 1] == '-' ? '_' : a[i - 1], y = b[j - 1] == '-' ? '_' : b[j - 1];
            int best = diagonal + (x != y);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diagonal = row[j];
            row[j] = best;
        }
    }
    return row[lb];
}

// The unknown flag, and the known one closest to it when it is close
// enough to be a typo: "unknown flag '--epoch' (did you mean --epochs?)".
__attribute__((noreturn))
static inline void flags_fail_unknown(const flag_set *set, const char *arg, const char *name,
                                      size_t len, bool is_long) {
    const flag_t *closest = NULL;
    int best = 99;
    for (int i = 0; is_long && i < set->count; i++) {
        int d = flags_edit_distance(name, len, set->flags[i].name);
        if (d < best) best = d, closest = &set->flags[i];
    }
    int allowed = len < 6 ? 1 : len < 12 ? 2 : 3;   // a typo, not another word
    if (closest && best <= allowed)
        flags_fail(set, "unknown flag '%.*s' (did you mean --%s?)", (int)(len + 2), arg, closest->name);
    flags_fail(set, "unknown flag '%.*s'", (int)(len + (is_long ? 2 : 1)), arg);
}

// --local_rank=N (or --local-rank N): how torch.distributed.launch told each
// worker its local rank before torchrun moved it into LOCAL_RANK, and what
// old scripts still parse. Every program that takes no positional arguments
// accepts it (ddprun --pass_local_rank sends it): it becomes LOCAL_RANK, and
// must agree with LOCAL_RANK when both are given. Returns the arguments used.
static inline int flags_take_local_rank(const flag_set *set, int argc, char **argv, int i,
                                        const char *name, size_t len, const char *eq) {
    if (set->positional || !flags_name_matches("local_rank", name, len)) return 0;
    if (!eq && i + 1 >= argc) flags_fail(set, "--local_rank needs a value");
    const char *text = eq ? eq + 1 : argv[i + 1];
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < 0 || v > 4095)
        flags_fail(set, "--local_rank expects a local rank from 0 to 4095, got '%s'", text);
    const char *env = getenv("LOCAL_RANK");
    if (env && env[0] && strcmp(env, text) != 0)
        flags_fail(set, "--local_rank=%s disagrees with LOCAL_RANK=%s in the environment", text, env);
    if (setenv("LOCAL_RANK", text, 1) != 0) die("setenv LOCAL_RANK failed: %s", strerror(errno));
    return eq ? 1 : 2;
}

// Parse argv. Returns the index of the first positional argument (argc if
// there is none). Parsing stops at the first positional when the set allows
// positionals, so that "ddprun --nproc_per_node 2 prog --lr 1" leaves
// "prog --lr 1" alone; "--" also ends the flags.
static inline int flags_parse(flag_set *set, int argc, char **argv) {
    for (int i = 0; i < set->count; i++) {
        const flag_t *f = &set->flags[i];
        const char *from_env = f->env ? getenv(f->env) : NULL;
        if (from_env && from_env[0]) flags_set_value(set, f, from_env, f->env);
    }
    int i = 1;
    while (i < argc) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) return i + 1;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            flags_print_help(set);
            exit(0);
        }
        bool is_long = arg[0] == '-' && arg[1] == '-';
        bool is_short = !is_long && arg[0] == '-' && isalpha((unsigned char)arg[1]);
        if (!is_long && !is_short) {
            if (set->positional) return i;
            flags_fail(set, "unexpected argument '%s'", arg);
        }
        const char *name = arg + (is_long ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int taken = is_long ? flags_take_local_rank(set, argc, argv, i, name, len, eq) : 0;
        if (taken) {
            i += taken;
            continue;
        }
        const flag_t *f = flags_find(set, name, len, is_short);
        if (!f) flags_fail_unknown(set, arg, name, len, is_long);
        const char *value = eq ? eq + 1 : NULL;
        if (!value && f->type == FLAG_BOOL) {
            bool next_is_bool = i + 1 < argc &&
                (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false"));
            value = next_is_bool ? argv[++i] : "true";
        }
        if (!value) {
            if (i + 1 >= argc) flags_fail(set, "--%s needs a value", f->name);
            value = argv[++i];
        }
        flags_set_value(set, f, value, "");
        i++;
    }
    return argc;
}

#endif
