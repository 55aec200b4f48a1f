// log.h - rank-aware printing.
//
// In a distributed job every rank runs the same code, so an unguarded
// printf prints N times. The rule of the course: rank 0 reports
// (log_main); lines that differ per rank carry the rank (log_rank).
#ifndef COURSE_LOG_H
#define COURSE_LOG_H

#include <stdarg.h>
#include <stdio.h>

#include "check.h"

// Print on rank 0 only (or in a single process, where the rank is unknown).
__attribute__((format(printf, 1, 2)))
static inline void log_main(const char *fmt, ...) {
    if (course_rank > 0) return;
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    fflush(stdout);
}

// Print on every rank, each line prefixed with its rank.
__attribute__((format(printf, 1, 2)))
static inline void log_rank(const char *fmt, ...) {
    char line[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    course_print_prefix(stdout);
    fputs(line, stdout);
    fflush(stdout); // one write per line keeps ranks' lines from interleaving mid-line
}

#endif
