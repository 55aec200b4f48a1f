// atomic_save.c - EXERCISE: save a file so that a crash never leaves half of it.
//
// The version below works, until the machine dies in the middle of write():
// then path holds half a file, and a resumed training run reads garbage.
// Make it atomic, as common/snapshot.h does for every snapshot:
//   1. write the data to a TEMPORARY file in the same directory as path
//      (e.g. "<dir>/.<name>.<pid>.tmp"): rename() is atomic only within one
//      file system, and the same directory is sure to be on the same one;
//   2. fsync() the temporary file: its bytes are on the disk, not just in
//      the kernel's cache;
//   3. close() it, then rename() it over path: at every moment path is the
//      old file or the new one;
//   4. open() the directory (O_RDONLY | O_DIRECTORY) and fsync() it: the
//      rename itself is a change to the directory, and lives in the cache
//      until then.
// On any failure: return false, say what failed in err (with strerror(errno)),
// remove the temporary file, and leave path untouched.
//
//     bool atomic_save(const char *path, const void *data, size_t bytes, char *err, size_t errlen);
//
// Hints:
//   - write() may write FEWER bytes than asked: loop until all are written.
//   - A failed fsync() means the data may never reach the disk: that is a
//     failure, not a detail.
//   - Close every descriptor you open, on every path through the function.
//
// Check it (from the course's top folder):
//     make check-exercise EX=06/atomic_save
// The check watches your write/fsync/rename calls. It "crashes" your save
// halfway through the writing and looks at what is left; it makes fsync
// fail, and write run out of disk space, and checks that you noticed.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "exercises.h"

bool atomic_save(const char *path, const void *data, size_t bytes, char *err, size_t errlen) {
    // TODO: write a temporary file, fsync it, rename it over path, fsync the directory.
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return false;
    }
    const char *p = data;
    while (bytes > 0) {
        ssize_t written = write(fd, p, bytes);
        if (written < 0 && errno == EINTR) continue;
        if (written < 0) {
            snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
            close(fd);
            return false;
        }
        p += written;
        bytes -= (size_t)written;
    }
    close(fd);
    return true;
}
