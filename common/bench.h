// bench.h - what the benchmarks of chapters 2 and 3 share.
//
// Both measure the way nccl-tests does: a sweep of message sizes from -b to
// -e, multiplying by -f from one row to the next; per size a few untimed
// operations (the warm-up), then n timed ones under a host timer; a table on
// the terminal and a CSV under runs/<chapter>/ for the figures. These are
// the sweep's pieces; what is measured, and how it is checked, stays in each
// chapter's bench.h.
#ifndef COURSE_BENCH_H
#define COURSE_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include "dist.h"
#include "metrics.h"

// Operations for one size: the -n asked for, but fewer for big sizes, so
// that no size moves more than about 1 GiB per rank (and at least 2).
static inline int bench_iters_for(size_t bytes, int asked) {
    size_t fit = bytes ? ((size_t)1 << 30) / bytes : (size_t)asked;
    if (fit < 2) fit = 2;
    return fit < (size_t)asked ? (int)fit : asked;
}

// True when `bytes` is the sweep's last size: the next one would pass
// maxbytes (or overflow).
static inline bool bench_last_size(size_t bytes, size_t maxbytes, int factor) {
    return bytes > maxbytes / (size_t)factor;
}

// Today's date, "2026-11-23" or with the time "2026-11-23 14:05".
static inline void bench_date(char *out, size_t size, bool with_time) {
    time_t now = time(NULL);
    strftime(out, size, with_time ? "%Y-%m-%d %H:%M" : "%Y-%m-%d", localtime(&now));
}

// A CSV under runs/<chapter>/<name>.csv (rank 0 writes it), its first line
// after the header a comment with the device, the backend (and the number
// of ranks, when it matters) and the date, which the gnuplot script puts in
// the figure's title.
static inline metrics_csv bench_open_csv(const dist_t *d, const char *chapter, const char *name,
                                         const char *columns, bool name_ranks) {
    char dir[1024], date[32], base[64];   // bounded, so the path's length is known
    files_runs_dir(dir, sizeof dir, chapter);
    snprintf(base, sizeof base, "%s", name);
    metrics_csv csv = metrics_open(dir, base, columns);
    bench_date(date, sizeof date, false);
    char ranks[32] = "";
    if (name_ranks) snprintf(ranks, sizeof ranks, " | %d ranks", d->world_size);
    metrics_row(&csv, "# %s | backend %s%s | %s", d->device.name, backend_name(pg_backend(d->pg)), ranks, date);
    return csv;
}

#endif
