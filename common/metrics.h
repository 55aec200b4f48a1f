// metrics.h - CSV files under runs/<chapter>/ that the gnuplot scripts read.
//
// The file is written atomically (files.h): under a hidden temporary name,
// renamed when closed, so a plot never reads half a file, and a crashed run
// leaves the old one intact. Where runs/ is: files_runs_dir in files.h.
#ifndef COURSE_METRICS_H
#define COURSE_METRICS_H

#include <stdarg.h>
#include <stdio.h>

#include "check.h"
#include "files.h"

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

// A CSV being written; its out is NULL when it was never opened (on the
// ranks other than 0, which write no files).
typedef files_atomic metrics_csv;

// Opens <dir>/<name>.csv (dir e.g. "runs/01_single_gpu") and writes the header
// row, then a comment line with the command that made the file
// ("# command: 01_single_gpu --lr 0.1"; gnuplot skips lines starting with #).
static inline metrics_csv metrics_open(const char *dir, const char *name, const char *header) {
    metrics_csv m;
    char path[FILES_PATH_MAX], err[FILES_PATH_MAX + 200];
    files_make_dirs_or_die(dir);
    if (snprintf(path, sizeof path, "%s/%s.csv", dir, name) >= (int)sizeof path) die("metrics path too long: %s/%s", dir, name);
    if (!files_atomic_open(&m, path, err, sizeof err)) die("cannot write metrics file: %s", err);
    char command[1024];
    metrics_command_line(command, sizeof command);
    fprintf(m.out, "%s\n# command: %s\n", header, command);
    return m;
}

__attribute__((format(printf, 2, 3)))
static inline void metrics_row(metrics_csv *m, const char *fmt, ...) {
    if (!m->out) return; // not opened: a rank other than 0, which writes no files
    va_list args;
    va_start(args, fmt);
    vfprintf(m->out, fmt, args);
    va_end(args);
    fputc('\n', m->out);
}

static inline void metrics_close(metrics_csv *m) {
    char err[FILES_PATH_MAX + 200];
    if (!m->out) return;
    if (!files_atomic_commit(m, err, sizeof err)) die("writing the metrics file failed: %s", err);
}

#endif
