// files.h - where a program's files go, and how they are written safely.
//
// Three things every program that writes a file needs:
//   files_runs_dir     where outputs go: <course>/runs/<chapter>, or
//                      $COURSE_RUNS_DIR/<chapter> (the tests use it).
//                      <course> is the folder that holds this course,
//                      found at run time from the program's own path, so
//                      a course copied or moved elsewhere (cp -r) writes
//                      into the copy, without a rebuild;
//   files_make_dirs    mkdir -p;
//   files_atomic_*     the one way the course writes a file that someone
//                      may read back (a snapshot, a CSV, a tokenizer, a
//                      rendezvous record): into a hidden temporary file
//                      beside it, fsync, rename over the final name, fsync
//                      the folder. A crash or kill -9 at any moment leaves
//                      the old file or the whole new one, never half of
//                      one under the final name.
#ifndef COURSE_FILES_H
#define COURSE_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define FILES_PATH_MAX 1024

// ---------------------------------------------------------------- where

// The course's folder: the nearest folder above this executable that holds
// common/course.mk (programs live in <course>/<chapter>/, <course>/tools/,
// <course>/tests/unit/, ...). A program copied out of the course finds
// none, and then the current folder stands in for it.
static inline const char *files_course_root(void) {
    static char root[FILES_PATH_MAX];
    if (root[0]) return root;
    char exe[FILES_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    for (char *slash = strrchr(exe, '/'); slash && slash != exe; slash = strrchr(exe, '/')) {
        *slash = '\0';   // one folder up
        char probe[FILES_PATH_MAX + 32];
        snprintf(probe, sizeof probe, "%s/common/course.mk", exe);
        if (access(probe, R_OK) == 0) return strcpy(root, exe);
    }
    return strcpy(root, ".");
}

// Where a chapter's outputs go: <course>/runs/<chapter>, or
// $COURSE_RUNS_DIR/<chapter> when that is set: the tests and `make plots`
// use it to write into a folder of their own, apart from your runs.
static inline void files_runs_dir(char *out, size_t size, const char *chapter) {
    const char *runs = getenv("COURSE_RUNS_DIR");
    int n = runs && runs[0] ? snprintf(out, size, "%s/%s", runs, chapter)
                            : snprintf(out, size, "%s/runs/%s", files_course_root(), chapter);
    if (n < 0 || (size_t)n >= size) die("the path of %s's outputs is longer than %zu bytes: %s", chapter, size, out);
}

// mkdir -p: the folder and its parents. False, with errno set, when one
// cannot be made.
static inline bool files_make_dirs(const char *dir) {
    char path[FILES_PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return errno = ENAMETOOLONG, false;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST) return false;
        *p = '/';
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST;
}

// files_make_dirs, or stop the program naming the folder.
static inline void files_make_dirs_or_die(const char *dir) {
    if (!files_make_dirs(dir)) die("cannot create directory %s: %s", dir, strerror(errno));
}

// ---------------------------------------------------------------- atomic writes

typedef struct {
    FILE *out;                           // write here (fwrite, fprintf, ...)
    char path[FILES_PATH_MAX];           // the final name
    char tmp[FILES_PATH_MAX + 64];       // "<dir>/.<name>.<pid>.tmp", same folder
} files_atomic;

__attribute__((format(printf, 3, 4)))
static inline bool files_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, errlen, fmt, args);
        va_end(args);
    }
    return false;
}

// "<what> <path>: <reason> (hint: ...)" for a failed system call.
static inline bool files_fail_errno(char *err, size_t errlen, const char *what, const char *path) {
    int e = errno;
    const char *hint = errno_hint(e);
    return files_fail(err, errlen, "%s %s: %s%s%s%s", what, path, strerror(e), hint[0] ? " (hint: " : "", hint,
                      hint[0] ? ")" : "");
}

// "runs/x/a.csv" -> "runs/x" ("." for a bare name, "/" for the root).
static inline void files_dir_of(const char *path, char *dir, size_t size) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, size, ".");
    else if (slash == path) snprintf(dir, size, "/");
    else snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

// Starts writing path: the bytes go to a hidden temporary file in the same
// folder (a rename is atomic only within one file system), which no reader
// of path ever sees. False with a one-line reason in err.
static inline bool files_atomic_open(files_atomic *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (!name[0] || strlen(path) >= sizeof f->path)
        return files_fail(err, errlen, "path '%.200s' is empty, too long or a directory", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%.*s.%s.%d.tmp", (int)(name - path), path, name, (int)getpid());
    int fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return files_fail_errno(err, errlen, "cannot create", f->tmp);
    f->out = fdopen(fd, "wb");
    if (!f->out) {
        files_fail_errno(err, errlen, "cannot open", f->tmp);
        close(fd);
        unlink(f->tmp);
        return false;
    }
    return true;
}

// Gives up: the temporary file goes, the final name is untouched.
static inline void files_atomic_abort(files_atomic *f) {
    if (f->out) fclose(f->out);
    f->out = NULL;
    if (f->tmp[0]) unlink(f->tmp);
}

// Makes a rename durable. Some file systems cannot fsync a directory
// (EINVAL); there the rename is as durable as they allow.
static inline bool files_sync_dir(const char *path, char *err, size_t errlen) {
    char dir[FILES_PATH_MAX];
    files_dir_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return files_fail_errno(err, errlen, "cannot open directory", dir);
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    if (!ok) files_fail_errno(err, errlen, "cannot fsync directory", dir);
    close(fd);
    return ok;
}

// Finishes: flush, fsync, close, rename over the final name, fsync the
// folder. On any failure the temporary file is removed and err says why.
static inline bool files_atomic_commit(files_atomic *f, char *err, size_t errlen) {
    bool ok = fflush(f->out) == 0 && !ferror(f->out);
    if (!ok) files_fail_errno(err, errlen, "cannot write", f->tmp);
    if (ok && fsync(fileno(f->out)) < 0) ok = files_fail_errno(err, errlen, "cannot fsync", f->tmp);
    if (fclose(f->out) != 0 && ok) ok = files_fail_errno(err, errlen, "cannot close", f->tmp);
    f->out = NULL;
    if (ok && rename(f->tmp, f->path) < 0) ok = files_fail_errno(err, errlen, "cannot rename the temporary file to", f->path);
    if (!ok) {
        unlink(f->tmp);
        return false;
    }
    return files_sync_dir(f->path, err, errlen);
}

// The whole of data into path, atomically.
static inline bool files_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen) {
    files_atomic f;
    if (!files_atomic_open(&f, path, err, errlen)) return false;
    if (len > 0 && fwrite(data, 1, len, f.out) != len) {
        files_fail_errno(err, errlen, "cannot write", f.tmp);
        files_atomic_abort(&f);
        return false;
    }
    return files_atomic_commit(&f, err, errlen);
}

#endif
