// fuzz_flags - the command-line parser, common/flags.h, with values from the
// command line and from environment variables.
//
// Input: NUL-separated strings. The first three are the values of the
// environment variables FUZZ_INT, FUZZ_BYTES and FUZZ_DEVICE (empty: unset),
// the rest are argv[1..]. Promises checked (flags.h's own contract):
// - bad input ends with status 2 and exactly two lines on stderr, a one-line
//   error "fuzz: error: ..." and the usage line;
// - --help (or -h) ends with status 0;
// - otherwise every value is within its flag's range or choices.
// flags_fail ends the program with exit(); here exit() is turned into a
// jump back to this harness, so that one process can run millions of parses.
#include <setjmp.h>

#include "fuzz.h"
#include "check.h" // its includes before the exit() macro below, which is for flags.h alone

static jmp_buf back;
static int exit_code;

__attribute__((noreturn)) static void fuzz_exit(int code) {
    exit_code = code;
    longjmp(back, 1);
}

#define exit(code) fuzz_exit(code)
#include "flags.h"
#undef exit

enum { MAX_ARGS = 64 };

typedef struct {
    int count;
    double rate;
    const char *device, *name;
    bool verbose;
    size_t bytes;
} values;

static void make_set(flag_set *set, values *v) {
    *v = (values){.count = 10, .rate = 0.5, .device = "auto", .name = NULL, .verbose = false, .bytes = 1024};
    *set = (flag_set){.program = "fuzz", .summary = "parses fuzzed flags"};
    flag_t *f = flag_int(set, "count", &v->count, 1, 1000, "a count");
    f->short_name = "n";
    f->env = "FUZZ_INT";
    flag_double(set, "rate", &v->rate, 0, 1, "a rate");
    f = flag_choice(set, "device", &v->device, "auto|cpu|cuda", "a choice");
    f->short_name = "d";
    f->env = "FUZZ_DEVICE";
    flag_string(set, "name", &v->name, "any text");
    flag_bool(set, "verbose", &v->verbose, "a switch")->short_name = "v";
    f = flag_bytes(set, "max_bytes", &v->bytes, 0, 1 << 30, "a size");
    f->short_name = "b";
    f->env = "FUZZ_BYTES";
}

static void set_env(const char *name, const char *value) {
    if (value && value[0]) setenv(name, value, 1);
    else unsetenv(name);
}

// --help or -h anywhere (also where it is the value of another flag: an over-estimate is enough here).
static bool has_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

static void check_values(const values *v) {
    fuzz_check(v->count >= 1 && v->count <= 1000, "flags: --count outside its range");
    fuzz_check(v->rate >= 0 && v->rate <= 1, "flags: --rate outside its range");
    fuzz_check(!strcmp(v->device, "auto") || !strcmp(v->device, "cpu") || !strcmp(v->device, "cuda"), "flags: --device not a choice");
    fuzz_check(v->bytes <= (1u << 30), "flags: --max_bytes outside its range");
}

// stderr of one parse, then its verdict.
static void check_outcome(bool exited, const char *err, int argc, char **argv) {
    size_t lines = 0;
    for (const char *c = err; *c; c++) lines += *c == '\n';
    if (!exited) {
        fuzz_check(err[0] == '\0', "flags: a successful parse printed something");
    } else if (exit_code == 0) {
        fuzz_check(has_help(argc, argv), "flags: status 0 without --help");
    } else {
        fuzz_check(exit_code == EXIT_USAGE, "flags: bad input ended with a status other than 2");
        fuzz_check(!strncmp(err, "fuzz: error: ", 13) && lines == 2 && strstr(err, "\nusage: fuzz "),
                   "flags: bad input did not give one error line and the usage line");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *copy = malloc(size + 1), *strings[MAX_ARGS + 3], *argv[MAX_ARGS + 2];
    int n = 0;
    if (!copy) abort();
    memcpy(copy, data, size);
    copy[size] = '\0';
    for (char *p = copy; n < MAX_ARGS + 3 && p <= copy + size; p += strlen(p) + 1) strings[n++] = p;
    set_env("FUZZ_INT", n > 0 ? strings[0] : NULL);
    set_env("FUZZ_BYTES", n > 1 ? strings[1] : NULL);
    set_env("FUZZ_DEVICE", n > 2 ? strings[2] : NULL);
    int argc = 1;
    argv[0] = "fuzz";
    for (int i = 3; i < n; i++) argv[argc++] = strings[i];
    argv[argc] = NULL;

    values v;
    flag_set set;
    make_set(&set, &v);
    char *err = NULL;
    size_t err_len = 0;
    FILE *saved_err = stderr, *saved_out = stdout;
    stderr = open_memstream(&err, &err_len);
    stdout = fuzz_devnull(); // --help
    if (!stderr) abort();
    volatile bool exited = false;
    if (setjmp(back) == 0) {
        flags_parse(&set, argc, argv);
        check_values(&v);
    } else {
        exited = true;
    }
    fclose(stderr);
    stderr = saved_err;
    stdout = saved_out;
    check_outcome(exited, err, argc, argv);
    free(err);
    free(copy);
    return 0;
}
