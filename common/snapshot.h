// snapshot.h - save the whole training state, and load it back only if it is intact.
//
// A job that is killed (a node reboots, the scheduler preempts it, a rank
// crashes) should resume as if nothing had happened. That needs more than the
// weights: the optimizer state, the random generator, the epoch, the position
// in the data, the world size and the configuration. A snapshot holds all of
// it: named tensors plus string metadata, in one safetensors file
// (safetensors.h: the format, atomic writes, validation, the checksum).
// This file adds what makes a file a snapshot, and a series of them:
// - Its metadata says "format":"course-snapshot" and "version":"2" (2: the
//   checksum covers the whole file, header included; version 1 files are
//   refused), and it must have a checksum (snapshot_read checks all three).
// - A series (snapshot_save_step): "<dir>/<stem>.<step, 10 digits>.safetensors".
//   Old ones are deleted only after the new one is durable, and loading falls
//   back to the newest one that validates (snapshot_load_latest).
// - Resuming needs the same model and configuration: snapshot_expect_meta,
//   snapshot_expect_tensor and snapshot_copy say what differs.
//
// In a training program (rank 0 saves; every rank loads):
//   safetensors_tensor t[] = {safetensors_tensor_of("w", "F32", w, 2, (int64_t[]){64, 1})};
//   safetensors_meta m[] = {safetensors_meta_of("epoch", "%d", epoch), safetensors_meta_of("features", "%d", features)};
//   if (!snapshot_save_step("runs/06/snapshot.safetensors", step, t, 1, m, 2, keep, err, sizeof err)) die(...);
//   ...
//   int found = snapshot_load_latest("runs/06/snapshot.safetensors", &snap, report, sizeof report);
//   if (report[0]) print the report: which snapshots were refused and why
//   snapshot_expect_meta(&snap, "features", "64", err, sizeof err): the same model?
//   snapshot_copy(&snap, "w", "F32", 2, (int64_t[]){64, 1}, w, err, sizeof err); safetensors_release(&snap);
// Functions named snap_* are this file's helpers.
//
// Only rank 0 writes snapshots; the caller checks its rank. After every step
// all ranks hold the same weights, and several writers of one file would race.
#ifndef COURSE_SNAPSHOT_H
#define COURSE_SNAPSHOT_H

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "safetensors.h"
#include "safetensors_read.h"

#define SNAPSHOT_FORMAT "course-snapshot"
#define SNAPSHOT_VERSION "2" // 2: the checksum covers the whole file, header included
#define SNAPSHOT_MAX_STEP 9999999999LL // ten digits in a series file name

// ---------------------------------------------------------------- one snapshot

// A safetensors file (safetensors_write) with the format and version of a
// snapshot first in its metadata; those two keys are the library's.
static inline bool snapshot_write(const char *path, const safetensors_tensor *t, int nt,
                                  const safetensors_meta *m, int nm, char *err, size_t errlen) {
    if (nm < 0 || nm > SAFETENSORS_MAX_META - 2 || (nm > 0 && !m)) return files_fail(err, errlen, "no or too much metadata given");
    safetensors_meta *all = xcalloc((size_t)nm + 2, sizeof *all);
    all[0] = safetensors_meta_of("format", "%s", SNAPSHOT_FORMAT);
    all[1] = safetensors_meta_of("version", "%s", SNAPSHOT_VERSION);
    bool ok = true;
    for (int i = 0; i < nm && ok; i++) {
        if (!strcmp(m[i].key, "format") || !strcmp(m[i].key, "version"))
            ok = files_fail(err, errlen, "metadata key '%s' is reserved: the library writes it", m[i].key);
        all[i + 2] = m[i];
    }
    ok = ok && safetensors_write(path, t, nt, all, nm + 2, err, errlen);
    free(all);
    return ok;
}

// Is this file, read and validated, a snapshot this program can resume from?
static inline bool snap_check_format(const safetensors_t *s, char *err, size_t errlen) {
    const char *format = safetensors_meta_get(s, "format"), *version = safetensors_meta_get(s, "version");
    if (s->num_meta == 0) return files_fail(err, errlen, "not a course snapshot: the header has no __metadata__ entries");
    if (!format) return files_fail(err, errlen, "not a course snapshot: __metadata__ has no 'format'");
    if (strcmp(format, SNAPSHOT_FORMAT) != 0)
        return files_fail(err, errlen, "not a course snapshot: format is '%s', expected '" SNAPSHOT_FORMAT "'", format);
    if (!version || strcmp(version, SNAPSHOT_VERSION) != 0)
        return files_fail(err, errlen, "snapshot version '%s' is not supported (this program reads version " SNAPSHOT_VERSION ")",
                          version ? version : "(none)");
    if (!s->has_checksum) return files_fail(err, errlen, "__metadata__ has no 'checksum'");
    return true;
}

// Reads and validates a snapshot (safetensors_read, then the format). On
// failure returns false with a one-line reason in err and *out holds nothing.
static inline bool snapshot_read(const char *path, safetensors_t *out, char *err, size_t errlen) {
    if (!safetensors_read(path, out, err, errlen)) return false;
    if (snap_check_format(out, err, errlen)) return true;
    safetensors_release(out);
    return false;
}

// ---------------------------------------------------------------- does it match this run?

// A metadata value that must be a whole number (the epoch, a step, a position).
static inline bool snapshot_meta_i64(const safetensors_t *s, const char *key, int64_t *out, char *err, size_t errlen) {
    const char *text = safetensors_meta_get(s, key);
    char *end;
    if (!text) return files_fail(err, errlen, "snapshot has no '%s'", key);
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || isspace((unsigned char)text[0]))
        return files_fail(err, errlen, "snapshot has %s='%s', not a whole number", key, text);
    *out = v;
    return true;
}

// Does the snapshot hold tensor name with this dtype and shape, as this run's
// model expects? Otherwise err says what differs, e.g. "tensor 'w' has shape
// [64, 1] in the snapshot but this run expects [1, 1]".
static inline bool snapshot_expect_tensor(const safetensors_t *s, const char *name, const char *dtype, int ndim,
                                          const int64_t *shape, char *err, size_t errlen) {
    const safetensors_tensor *t = safetensors_find(s, name);
    char have[160], want[160];
    safetensors_shape_text(ndim, shape, want, sizeof want);
    if (!t) return files_fail(err, errlen, "snapshot has no tensor '%s' (this run expects %s %s)", name, dtype, want);
    if (strcmp(t->dtype, dtype) != 0)
        return files_fail(err, errlen, "tensor '%s' is %s in the snapshot but this run expects %s", name, t->dtype, dtype);
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return files_fail(err, errlen, "tensor '%s' has shape %s in the snapshot but this run expects %s", name,
                         safetensors_shape_text(t->ndim, t->shape, have, sizeof have), want);
    return true;
}

// Checks the tensor as snapshot_expect_tensor does, then copies its bytes to dst.
static inline bool snapshot_copy(const safetensors_t *s, const char *name, const char *dtype, int ndim,
                                 const int64_t *shape, void *dst, char *err, size_t errlen) {
    if (!snapshot_expect_tensor(s, name, dtype, ndim, shape, err, errlen)) return false;
    const safetensors_tensor *t = safetensors_find(s, name);
    if (t->bytes > 0) memcpy(dst, t->data, t->bytes);
    return true;
}

// Does metadata key hold value, as this run has it? Otherwise err names both:
// "snapshot has features=64 but this run has features=1".
static inline bool snapshot_expect_meta(const safetensors_t *s, const char *key, const char *value, char *err, size_t errlen) {
    const char *have = safetensors_meta_get(s, key);
    if (!have) return files_fail(err, errlen, "snapshot has no %s (this run has %s=%s)", key, key, value);
    if (strcmp(have, value) != 0)
        return files_fail(err, errlen, "snapshot has %s=%s but this run has %s=%s", key, have, key, value);
    return true;
}

// ---------------------------------------------------------------- series of snapshots

// "runs/x/snapshot.safetensors" -> directory "runs/x", stem "snapshot".
static inline bool snap_series_parts(const char *path_template, char dir[FILES_PATH_MAX], char stem[FILES_PATH_MAX]) {
    const char *suffix = ".safetensors", *slash = strrchr(path_template, '/');
    const char *name = slash ? slash + 1 : path_template;
    if (!name[0] || strlen(path_template) >= FILES_PATH_MAX) return false;
    files_dir_of(path_template, dir, FILES_PATH_MAX);
    snprintf(stem, FILES_PATH_MAX, "%s", name);
    size_t n = strlen(stem), s = strlen(suffix);
    if (n > s && strcmp(stem + n - s, suffix) == 0) stem[n - s] = '\0';
    return true;
}

// The file of one step: "runs/x/snapshot.safetensors", 42 -> "runs/x/snapshot.0000000042.safetensors".
static inline bool snapshot_step_path(const char *path_template, int64_t step, char *out, size_t size) {
    char dir[FILES_PATH_MAX], stem[FILES_PATH_MAX];
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
        files_fail_errno(err, errlen, "cannot list directory", dir);
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
        files_fail_errno(err, errlen, "cannot list directory", dir);
        n = -1;
    }
    closedir(d);
    if (n > 0) qsort(*out, (size_t)n, sizeof **out, snap_compare_newest);
    return n;
}

static inline void snap_remove(const char *dir, const char *name) {
    char path[FILES_PATH_MAX + 260];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) < 0 && errno != ENOENT) {
        course_say("warning: cannot delete old snapshot file %s: %s", path, strerror(errno));
    }
}

// After step was saved: keeps it and the newest keep-1 others, and removes
// temporary files that crashed writers of this series left behind.
static inline void snap_prune(const char *dir, const char *stem, int64_t step, int keep) {
    snap_entry *list;
    char err[FILES_PATH_MAX + 100];
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
static inline bool snapshot_save_step(const char *path_template, int64_t step, const safetensors_tensor *t, int nt,
                                      const safetensors_meta *m, int nm, int keep, char *err, size_t errlen) {
    char path[FILES_PATH_MAX], dir[FILES_PATH_MAX], stem[FILES_PATH_MAX];
    if (step < 0 || step > SNAPSHOT_MAX_STEP)
        return files_fail(err, errlen, "snapshot step %" PRId64 " is outside 0..%lld", step, SNAPSHOT_MAX_STEP);
    if (!snap_series_parts(path_template, dir, stem) || !snapshot_step_path(path_template, step, path, sizeof path))
        return files_fail(err, errlen, "snapshot path '%s' is empty, too long or a directory", path_template);
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
static inline int snapshot_load_latest(const char *path_template, safetensors_t *out, char *report, size_t reportlen) {
    char dir[FILES_PATH_MAX], stem[FILES_PATH_MAX], path[FILES_PATH_MAX + 260], err[FILES_PATH_MAX + 200];
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
