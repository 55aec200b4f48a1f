// fuzz.h - what the fuzz targets in this folder share.
//
// Each fuzz_NAME.c defines LLVMFuzzerTestOneInput, the entry point of
// libFuzzer: it is handed one input and must never crash, hang, leak into
// the next input, or break an invariant that the code it tests promises.
// A broken invariant is reported with fuzz_check(), which aborts: libFuzzer
// then saves the input as a crash file, like any sanitizer report.
//
// The same files also build with any C compiler and replay.c's main(), which
// runs saved inputs through the target once each: that is how `make test`
// replays the seed corpus and every regression input without clang.
#ifndef COURSE_FUZZ_H
#define COURSE_FUZZ_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// An invariant of the code under test: on failure, say which and abort.
static inline void fuzz_check(bool ok, const char *what) {
    if (ok) return;
    dprintf(2, "fuzz invariant broken: %s\n", what); // fd 2: stderr may be /dev/null (fuzz_quiet)
    abort();
}

// The library under test prints its one-line refusals and warnings to
// stderr; millions of them would drown the fuzzer's own report. They go to
// /dev/null instead. Sanitizer reports are written to file descriptor 2
// directly, so they are still seen.
static inline FILE *fuzz_devnull(void) {
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w"))) {
        dprintf(2, "fuzz: /dev/null: %s\n", strerror(errno));
        abort();
    }
    return null;
}

static inline void fuzz_quiet(void) {
    stderr = fuzz_devnull();
    stdout = fuzz_devnull();
}

// A file in memory (memfd) holding the input, for readers that take a path:
// returns "/proc/self/fd/N", valid until the next call with the same fd.
typedef struct { int fd; char path[40]; } fuzz_file;

static inline void fuzz_file_put(fuzz_file *f, const void *data, size_t size) {
    if (f->fd <= 0) {
        f->fd = memfd_create("fuzz-input", MFD_CLOEXEC);
        if (f->fd < 0) { dprintf(2, "fuzz: memfd_create: %s\n", strerror(errno)); abort(); }
        snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    }
    if (ftruncate(f->fd, 0) != 0 || (size && pwrite(f->fd, data, size, 0) != (ssize_t)size)) {
        dprintf(2, "fuzz: writing the memfd: %s\n", strerror(errno));
        abort();
    }
}

// Reads an input front to back, like libFuzzer's FuzzedDataProvider: past
// the end every read gives zeros, so any input is a valid script.
typedef struct { const uint8_t *p; size_t left; } fuzz_input;

static inline unsigned fuzz_u8(fuzz_input *in) {
    if (!in->left) return 0;
    in->left--;
    return *in->p++;
}

static inline unsigned fuzz_u16(fuzz_input *in) { return fuzz_u8(in) << 8 | fuzz_u8(in); }

// Up to max bytes (fewer at the end of the input); *n says how many.
static inline const uint8_t *fuzz_bytes(fuzz_input *in, size_t max, size_t *n) {
    const uint8_t *at = in->p;
    *n = max < in->left ? max : in->left;
    in->p += *n;
    in->left -= *n;
    return at;
}

// A one-line message: non-empty, no newline.
static inline bool fuzz_one_line(const char *text) { return text[0] && !strchr(text, '\n'); }

#endif
