// metrics.h - CSV files under runs/<chapter>/ that the gnuplot scripts read.
//
// The file is written under a temporary name and renamed when closed, so a
// plot never reads half a file, and a crashed run leaves the old one intact.
#ifndef COURSE_METRICS_H
#define COURSE_METRICS_H

#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

// The project's root, set by the build, so that runs/ is the same folder
// whether a program is started from the root or from its chapter folder.
#ifndef COURSE_ROOT
#define COURSE_ROOT "."
#endif

// Where a chapter's outputs go: <project>/runs/<chapter>, or
// $COURSE_RUNS_DIR/<chapter> when that is set: the tests and `make plots`
// use it to write into a folder of their own, apart from your runs.
static inline void runs_dir(char *out, size_t size, const char *chapter) {
    const char *runs = getenv("COURSE_RUNS_DIR");
    if (runs && runs[0]) snprintf(out, size, "%s/%s", runs, chapter);
    else snprintf(out, size, "%s/runs/%s", COURSE_ROOT, chapter);
}

// The command line of this process, "01_single_gpu --lr 0.1" (the program's
// file name and its arguments), read from /proc/self/cmdline. A CSV records
// it, so that a figure can say which run it shows and with which flags.
static inline void metrics_command_line(char *out, size_t size) {
    snprintf(out, size, "(unknown)");
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return;
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (n == 0) return;
    buf[n] = '\0';
    const char *name = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;   // argv[0] without its folder
    size_t used = (size_t)snprintf(out, size, "%s", name);
    for (size_t i = strlen(buf) + 1; i < n && used < size; i += strlen(buf + i) + 1)
        used += (size_t)snprintf(out + used, size - used, " %s", buf + i);
}

typedef struct {
    FILE *file;
    char path[1100], tmp_path[1130];
} metrics_csv;

// mkdir -p for a directory path.
static inline void make_dirs(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST) die("cannot create directory %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) < 0 && errno != EEXIST) die("cannot create directory %s: %s", path, strerror(errno));
}

// Opens <dir>/<name>.csv (dir e.g. "runs/01_single_gpu") and writes the header
// row, then a comment line with the command that made the file
// ("# command: 01_single_gpu --lr 0.1"; gnuplot skips lines starting with #).
static inline metrics_csv metrics_open(const char *dir, const char *name, const char *header) {
    metrics_csv m;
    make_dirs(dir);
    if (strlen(dir) + strlen(name) + 5 >= sizeof m.path) die("metrics path too long: %s/%s", dir, name);
    snprintf(m.path, sizeof m.path, "%s/%s.csv", dir, name);
    snprintf(m.tmp_path, sizeof m.tmp_path, "%s.tmp.%d", m.path, (int)getpid());
    m.file = fopen(m.tmp_path, "w");
    if (!m.file) die("cannot write metrics file %s: %s", m.tmp_path, strerror(errno));
    char command[1024];
    metrics_command_line(command, sizeof command);
    fprintf(m.file, "%s\n# command: %s\n", header, command);
    return m;
}

__attribute__((format(printf, 2, 3)))
static inline void metrics_row(metrics_csv *m, const char *fmt, ...) {
    if (!m->file) return; // not opened: a rank other than 0, which writes no files
    va_list args;
    va_start(args, fmt);
    vfprintf(m->file, fmt, args);
    va_end(args);
    fputc('\n', m->file);
}

static inline void metrics_close(metrics_csv *m) {
    if (!m->file) return;
    if (fclose(m->file) != 0) die("writing %s failed: %s", m->tmp_path, strerror(errno));
    m->file = NULL;
    CHECK_SYS(rename(m->tmp_path, m->path));
}

#endif
