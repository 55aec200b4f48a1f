// atomic_save.c - reference solution of exercise 06/atomic_save.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "exercises.h"

// Fills err with "<what> <path>: <reason>" and returns false.
static bool fail(char *err, size_t errlen, const char *what, const char *path) {
    int saved = errno;
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(saved));
    errno = saved;
    return false;
}

static bool write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t written = write(fd, p, n);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) {
            if (written == 0) errno = EIO;   // no progress and no reason: do not spin
            return false;
        }
        p += written;
        n -= (size_t)written;
    }
    return true;
}

// Makes the rename durable. Some file systems cannot fsync a directory
// (EINVAL); there the rename is as durable as they allow.
static bool sync_directory(const char *dir, char *err, size_t errlen) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail(err, errlen, "cannot open directory", dir);
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    if (!ok) fail(err, errlen, "cannot fsync directory", dir);
    close(fd);
    return ok;
}

bool atomic_save(const char *path, const void *data, size_t bytes, char *err, size_t errlen) {
    char dir[PATH_MAX], tmp[PATH_MAX + 64];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    snprintf(tmp, sizeof tmp, "%s/.%s.%d.tmp", dir, base, (int)getpid());

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fail(err, errlen, "cannot create", tmp);
    bool ok = write_all(fd, data, bytes) || fail(err, errlen, "cannot write", tmp);
    if (ok && fsync(fd) < 0) ok = fail(err, errlen, "cannot fsync", tmp);
    if (close(fd) < 0 && ok) ok = fail(err, errlen, "cannot close", tmp);
    if (ok && rename(tmp, path) < 0) ok = fail(err, errlen, "cannot rename the temporary file to", path);
    if (!ok) {
        unlink(tmp);
        return false;
    }
    return sync_directory(dir, err, errlen);
}
