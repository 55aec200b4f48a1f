// check_atomic_save.c - checks exercise 06/atomic_save.
//
// Run it with `make check-exercise EX=06/atomic_save` from the top folder.
// The check is linked with -Wl,--wrap=write,--wrap=fsync,... (see the
// Makefile): every write(), fwrite(), fsync(), fdatasync() and rename() your
// file makes comes here first. That lets the check
//   - see the order of the calls: data into a temporary file in the same
//     directory, fsync of it, rename over the final name, fsync of the
//     directory;
//   - misbehave like a real system: write() that writes only part of what
//     was asked, a "crash" (the process ends) halfway through the data,
//     fsync() failing with EIO, write() failing with ENOSPC (disk full).
// Each case runs in a child process in a fresh directory under $TMPDIR (or
// /tmp), which is removed at the end.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exercise_check.h"
#include "exercises.h"

enum { NEW_BYTES = 100000, OLD_BYTES = 5000, SHORT_WRITE = 4000, CRASHED = 97, CASE_SECONDS = 10 };

// ---------------------------------------------------------------- watching the calls
ssize_t __real_write(int fd, const void *buf, size_t n);
size_t __real_fwrite(const void *p, size_t size, size_t n, FILE *f);
int __real_fsync(int fd);
int __real_fdatasync(int fd);
int __real_rename(const char *from, const char *to);
int __real_renameat(int from_dir, const char *from, int to_dir, const char *to);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
size_t __wrap_fwrite(const void *p, size_t size, size_t n, FILE *f);
int __wrap_fsync(int fd);
int __wrap_fdatasync(int fd);
int __wrap_rename(const char *from, const char *to);
int __wrap_renameat(int from_dir, const char *from, int to_dir, const char *to);

typedef enum { FAULT_NONE, FAULT_SHORT_WRITES, FAULT_CRASH, FAULT_FSYNC_EIO, FAULT_ENOSPC } fault_kind;
typedef enum { EV_WRITE, EV_FSYNC, EV_RENAME } event_kind;
typedef struct {
    event_kind kind;
    char path[PATH_MAX], to[PATH_MAX];   // the file (for a rename: from, to)
} event;

static struct {
    bool on;              // only while atomic_save runs
    fault_kind fault;
    size_t written;       // data bytes written to files so far
    bool fsync_failed;    // FAULT_FSYNC_EIO has struck
    int count;
    event events[64];
} watch;

static bool is_file(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

static void fd_path(int fd, char *out) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    out[n > 0 ? n : 0] = '\0';
}

static void record(event_kind kind, int fd, const char *path, const char *to) {
    if (watch.count == (int)(sizeof watch.events / sizeof watch.events[0])) return;
    event *e = &watch.events[watch.count++];
    e->kind = kind;
    if (fd >= 0) fd_path(fd, e->path);
    else snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->to, sizeof e->to, "%s", to ? to : "");
}

// How many of n bytes may be written before the fault strikes (n: none does).
static size_t allowed(size_t n) {
    size_t half = NEW_BYTES / 2;
    if (watch.fault == FAULT_SHORT_WRITES) return n < SHORT_WRITE ? n : SHORT_WRITE;
    if (watch.fault != FAULT_CRASH && watch.fault != FAULT_ENOSPC) return n;
    return watch.written + n <= half ? n : half > watch.written ? half - watch.written : 0;
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (!watch.on || !is_file(fd)) return __real_write(fd, buf, n);
    record(EV_WRITE, fd, NULL, NULL);
    size_t ok = allowed(n);
    if (ok < n && watch.fault == FAULT_CRASH) {
        if (ok) __real_write(fd, buf, ok);
        _exit(CRASHED);   // as if the power went out right here
    }
    if (ok < n && watch.fault == FAULT_ENOSPC) {
        errno = ENOSPC;
        return -1;
    }
    ssize_t done = __real_write(fd, buf, ok);
    if (done > 0) watch.written += (size_t)done;
    return done;
}

size_t __wrap_fwrite(const void *p, size_t size, size_t n, FILE *f) {
    if (!watch.on || size == 0 || !is_file(fileno(f))) return __real_fwrite(p, size, n, f);
    record(EV_WRITE, fileno(f), NULL, NULL);
    size_t bytes = size * n, ok = watch.fault == FAULT_SHORT_WRITES ? bytes : allowed(bytes);
    if (ok < bytes && watch.fault == FAULT_CRASH) {
        __real_fwrite(p, 1, ok, f);
        fflush(f);
        _exit(CRASHED);
    }
    if (ok < bytes && watch.fault == FAULT_ENOSPC) {
        errno = ENOSPC;
        return 0;
    }
    size_t done = __real_fwrite(p, size, n, f);
    watch.written += done * size;
    return done;
}

static int watched_sync(int fd, int (*real)(int)) {
    if (!watch.on) return real(fd);
    record(EV_FSYNC, fd, NULL, NULL);
    if (watch.fault == FAULT_FSYNC_EIO && !watch.fsync_failed && is_file(fd)) {
        watch.fsync_failed = true;
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int __wrap_fsync(int fd) { return watched_sync(fd, __real_fsync); }
int __wrap_fdatasync(int fd) { return watched_sync(fd, __real_fdatasync); }

int __wrap_rename(const char *from, const char *to) {
    if (watch.on) record(EV_RENAME, -1, from, to);
    return __real_rename(from, to);
}

int __wrap_renameat(int from_dir, const char *from, int to_dir, const char *to) {
    if (watch.on) record(EV_RENAME, -1, from, to);
    return __real_renameat(from_dir, from, to_dir, to);
}

// ---------------------------------------------------------------- files and folders
static char root[PATH_MAX];   // this run's scratch folder

static void fill(unsigned char *buf, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 7 + seed + (i >> 8));
}

static void put_file(const char *path, const unsigned char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
}

// The whole file, or NULL when there is none; *n its size.
static unsigned char *get_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *data = xmalloc(NEW_BYTES + OLD_BYTES + 1);
    *n = fread(data, 1, NEW_BYTES + OLD_BYTES + 1, f);
    fclose(f);
    return data;
}

static bool file_is(const char *path, const unsigned char *want, size_t n) {
    size_t got_n = 0;
    unsigned char *got = get_file(path, &got_n);
    bool same = got && got_n == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

// Names in dir other than model.bin, comma-separated ("" if none).
static void others_in(const char *dir, char *out, size_t size) {
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "model.bin")) continue;
        size_t used = strlen(out);
        snprintf(out + used, size - used, "%s'%s'", used ? ", " : "", e->d_name);
    }
    closedir(d);
}

static int open_descriptors(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

// ---------------------------------------------------------------- one case
typedef struct {
    char dir[PATH_MAX + 64], path[PATH_MAX + 96];
    unsigned char old_data[OLD_BYTES], new_data[NEW_BYTES];
    bool has_old;
    char err[300];
    bool returned;
} save_case;

static void case_setup(save_case *c, const char *name, bool has_old) {
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s/%s", root, name);
    if (mkdir(c->dir, 0755) < 0) die("cannot create %s: %s", c->dir, strerror(errno));
    snprintf(c->path, sizeof c->path, "%s/model.bin", c->dir);
    fill(c->old_data, OLD_BYTES, 11);
    fill(c->new_data, NEW_BYTES, 29);
    c->has_old = has_old;
    if (has_old) put_file(c->path, c->old_data, OLD_BYTES);
}

static void save(save_case *c, const char *path, size_t bytes, fault_kind fault) {
    memset(&watch, 0, sizeof watch);
    watch.fault = fault;
    watch.on = true;
    c->returned = atomic_save(path, c->new_data, bytes, c->err, sizeof c->err);
    watch.on = false;
}

// Runs body in a child process (so that an exit, a crash or a hang in
// atomic_save cannot take the check with it); returns its exit status, or
// -1 after reporting how it ended otherwise.
static int in_child(const char *what, void (*body)(save_case *), save_case *c) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork failed: %s", strerror(errno));
    if (pid == 0) {
        alarm(CASE_SECONDS);
        body(c);
        fflush(stdout);
        _exit(0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("waitpid failed: %s", strerror(errno));
    if (WIFEXITED(status)) {
        if (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != CRASHED)
            verdict(false, "%s: atomic_save ended the program (exit status %d) instead of returning",
                    what, WEXITSTATUS(status));
        return WEXITSTATUS(status);
    }
    if (WTERMSIG(status) == SIGALRM)
        verdict(false, "%s: atomic_save did not return within %d s (a write loop that never ends? "
                "write() returns -1 on an error: stop there)", what, CASE_SECONDS);
    else
        verdict(false, "%s: atomic_save crashed with signal %d (a NULL pointer, or a buffer too small "
                "for the path?)", what, WTERMSIG(status));
    return -1;
}

// ---------------------------------------------------------------- the cases
static const event *find_rename(const save_case *c) {
    for (int i = 0; i < watch.count; i++)
        if (watch.events[i].kind == EV_RENAME && !strcmp(watch.events[i].to, c->path)) return &watch.events[i];
    return NULL;
}

static bool same_dir(const char *file, const char *dir) {
    const char *slash = strrchr(file, '/');
    return slash && (size_t)(slash - file) == strlen(dir) && !strncmp(file, dir, strlen(dir));
}

// Where the calls happened, in order: the heart of atomicity.
static void check_order(const save_case *c) {
    const event *rn = find_rename(c);
    if (!rn) {
        verdict(false, "rename() over model.bin was never called: the file is written in place, so a "
                "crash in the middle leaves it half-written; write a temporary file and rename it");
        return;
    }
    int at = (int)(rn - watch.events);
    bool tmp_synced = false, dir_synced = false;
    for (int i = 0; i < watch.count; i++) {
        const event *e = &watch.events[i];
        if (e->kind != EV_FSYNC) continue;
        if (i < at && !strcmp(e->path, rn->path)) tmp_synced = true;
        if (i > at && !strcmp(e->path, c->dir)) dir_synced = true;
    }
    if (!same_dir(rn->path, c->dir))
        verdict(false, "the temporary file %s is not in model.bin's directory: rename() is atomic only "
                "within one file system, so make it next to the final file", rn->path);
    else
        verdict(true, "written to a temporary file in the same directory, then renamed over model.bin");
    verdict(tmp_synced, tmp_synced ? "the temporary file is fsynced before the rename"
            : "the temporary file was not fsynced before the rename: after a power cut model.bin could "
              "name an empty or partial file");
    verdict(dir_synced, dir_synced ? "the directory is fsynced after the rename"
            : "the directory was not fsynced after the rename: after a power cut the rename itself can "
              "be lost (open the directory with O_RDONLY | O_DIRECTORY and fsync that)");
}

static void new_file(save_case *c) {
    int fds = open_descriptors();
    save(c, c->path, NEW_BYTES, FAULT_NONE);
    int leaked = open_descriptors() - fds;
    if (!c->returned) {
        verdict(false, "saving 100000 bytes to a new file returned false: '%s'", c->err);
        return;
    }
    verdict(file_is(c->path, c->new_data, NEW_BYTES), "a new file: model.bin %s the 100000 bytes",
            file_is(c->path, c->new_data, NEW_BYTES) ? "holds" : "does NOT hold");
    check_order(c);
    char others[600];
    others_in(c->dir, others, sizeof others);
    if (others[0]) verdict(false, "left behind next to model.bin: %s; after a successful save only model.bin may remain", others);
    else if (leaked > 0) verdict(false, "%d file descriptor(s) left open: close the file and the directory", leaked);
    else verdict(true, "no temporary file and no open descriptor left behind");
}

static void replace_file(save_case *c) {
    save(c, c->path, 3000, FAULT_NONE);
    char others[600];
    others_in(c->dir, others, sizeof others);
    bool ok = c->returned && file_is(c->path, c->new_data, 3000) && !others[0];
    verdict(ok, ok ? "an existing file of 5000 bytes is replaced by 3000 new ones"
            : c->returned ? "replacing a 5000-byte model.bin with 3000 new bytes: the result is not exactly the 3000 new bytes, or extra files remain"
                          : "replacing an existing model.bin returned false");
}

static void short_writes(save_case *c) {
    save(c, c->path, NEW_BYTES, FAULT_SHORT_WRITES);
    size_t n = 0;
    unsigned char *got = get_file(c->path, &n);
    free(got);
    bool ok = c->returned && file_is(c->path, c->new_data, NEW_BYTES);
    if (ok) verdict(true, "write() writing at most %d bytes per call: model.bin still gets all 100000", SHORT_WRITE);
    else verdict(false, "when write() writes at most %d bytes per call (it may), model.bin ends with %zu of "
                 "the 100000 bytes%s: loop until every byte is written", SHORT_WRITE, n,
                 c->returned ? " and atomic_save returned true" : "");
}

static void crash_midway(save_case *c) { save(c, c->path, NEW_BYTES, FAULT_CRASH); }

static void after_crash(save_case *c, int status) {
    if (status != CRASHED) {
        if (status == 0)
            verdict(false, "could not simulate a crash: the check saw no write() or fwrite() to a file "
                    "(write the data with write(2))");
        return;
    }
    size_t n = 0;
    unsigned char *got = get_file(c->path, &n);
    if (file_is(c->path, c->old_data, OLD_BYTES))
        verdict(true, "killed halfway through the writing: model.bin still holds the whole old file");
    else if (!got)
        verdict(false, "after a crash halfway through the writing, model.bin is gone: the old file must "
                "stay until the new one is complete");
    else
        verdict(false, "file left half-written: after a crash halfway through the writing, model.bin "
                "holds %zu bytes, neither the old file (5000) nor the new one (100000); write a "
                "temporary file and rename it over model.bin", n);
    free(got);
}

// After a failure: false, a reason, the old file untouched, nothing left over.
static void expect_failure(save_case *c, const char *what) {
    char others[600];
    others_in(c->dir, others, sizeof others);
    if (c->returned)
        verdict(false, "%s: atomic_save returned true; the data may never reach the disk: return false", what);
    else if (!file_is(c->path, c->old_data, OLD_BYTES))
        verdict(false, "%s: model.bin was changed; after a failure the old file must stay as it was", what);
    else if (!c->err[0])
        verdict(false, "%s: it returned false but err is empty: say what failed (and strerror(errno))", what);
    else if (others[0])
        verdict(false, "%s: %s was left behind; remove the temporary file when you give up", what, others);
    else
        verdict(true, "%s: returns false ('%s'), model.bin unchanged, nothing left behind", what, c->err);
}

static void fsync_fails(save_case *c) {
    save(c, c->path, NEW_BYTES, FAULT_FSYNC_EIO);
    if (!watch.fsync_failed) verdict(false, "fsync() failing with EIO: fsync() was never called on the file");
    else expect_failure(c, "fsync() failing with EIO");
}

static void disk_full(save_case *c) {
    save(c, c->path, NEW_BYTES, FAULT_ENOSPC);
    expect_failure(c, "write() failing with ENOSPC (disk full) halfway");
}

static void missing_dir(save_case *c) {
    char path[PATH_MAX + 160];
    snprintf(path, sizeof path, "%s/no_such_dir/model.bin", c->dir);
    save(c, path, 100, FAULT_NONE);
    bool ok = !c->returned ? c->err[0] != '\0' : file_is(path, c->new_data, 100);
    verdict(ok, ok ? "a path in a missing directory: %s'%s'"
            : "a path in a missing directory: %sno message in err (or true without the file)",
            c->returned ? "created it " : "returns false, ", c->err);
}

static void empty_file(save_case *c) {
    save(c, c->path, 0, FAULT_NONE);
    bool ok = c->returned && file_is(c->path, c->new_data, 0);
    verdict(ok, ok ? "0 bytes: model.bin exists and is empty" : "saving 0 bytes should give an empty model.bin");
}

static void run_case(const char *name, bool has_old, void (*body)(save_case *), save_case *c) {
    case_setup(c, name, has_old);
    in_child(name, body, c);
}

int main(void) {
    printf("check 06/atomic_save: a save that a crash cannot leave half-done (atomic_save.c)\n");
    verdict_tally_share();   // the cases run in child processes
    const char *tmp = getenv("TMPDIR");
    char pattern[PATH_MAX];
    snprintf(pattern, sizeof pattern, "%s/check_atomic_save.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(pattern)) die("cannot create a scratch folder %s: %s", pattern, strerror(errno));
    if (!realpath(pattern, root)) die("realpath %s: %s", pattern, strerror(errno));

    save_case *c = xmalloc(sizeof *c);
    run_case("new", false, new_file, c);
    run_case("replace", true, replace_file, c);
    run_case("short_writes", false, short_writes, c);
    case_setup(c, "crash", true);
    after_crash(c, in_child("crash", crash_midway, c));
    run_case("fsync_eio", true, fsync_fails, c);
    run_case("disk_full", true, disk_full, c);
    run_case("missing_dir", false, missing_dir, c);
    run_case("empty", false, empty_file, c);
    free(c);
    remove_tree(root);

    return check_finish("temporary file, fsync, rename, fsync of the directory; a crash leaves the old "
                        "file, and failures are reported and cleaned up");
}
