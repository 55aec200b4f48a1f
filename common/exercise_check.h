// exercise_check.h - the shared harness of the exercise self-checks.
//
// Each NN_chapter/exercises/check_<name>.c calls the student's function,
// prints one line per finding ("  ok    ..." or "  WRONG ...") and ends with
// the verdict line that tools/check_exercise.sh reads: "PASSED: ..." (exit 0)
// or "NOT YET: <the first problem>" (exit 1). What every check needs lives
// here, so that a check file is only about its exercise:
//   - verdict() and check_finish(): the findings and the verdict line;
//   - run_ranks(): for the multi-rank exercises, spawn the ranks (cpu
//     backend, so a check runs anywhere), give each a deadline inside the
//     student's function (EXERCISE_DEADLINE seconds, default 10), and turn a
//     rank that hangs, fails or dies into a sentence rather than a hung or
//     silent check.
#ifndef COURSE_EXERCISE_CHECK_H
#define COURSE_EXERCISE_CHECK_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "dist.h"
#include "spawn.h"

// Memory that processes forked after this call share with this one: how a
// rank, or a case run in a child process, reports to the parent.
static inline void *check_shared_memory(size_t bytes) {
    void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) die("mmap of %zu bytes failed: %s", bytes, strerror(errno));
    return memory;
}

// ---------------------------------------------------------------- findings and the verdict
// How many findings were wrong, and the first of them, which the verdict
// line repeats because it is the one to fix first.
typedef struct {
    int problems;
    char first_problem[700];
} verdict_tally_t;

static verdict_tally_t verdict_tally_of_this_process;
static verdict_tally_t *verdict_tally = &verdict_tally_of_this_process;

// For a check that calls verdict() in child processes: from now on they
// count in memory the parent sees too.
static inline void verdict_tally_share(void) { verdict_tally = check_shared_memory(sizeof *verdict_tally); }

static inline int check_problems(void) { return verdict_tally->problems; }

// One finding, on a line of its own. Flushed at once, so that it comes
// before anything a child process (forked next) prints.
__attribute__((format(printf, 2, 3)))
static inline void verdict(bool ok, const char *fmt, ...) {
    char text[700];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    printf("  %-5s %s\n", ok ? "ok" : "WRONG", text);
    fflush(stdout);
    if (!ok && verdict_tally->problems++ == 0)
        snprintf(verdict_tally->first_problem, sizeof verdict_tally->first_problem, "%s", text);
}

// The verdict line; returns the check's exit status.
static inline int check_finish(const char *praise) {
    if (verdict_tally->problems == 0) {
        printf("PASSED: %s\n", praise);
        return 0;
    }
    printf("NOT YET: %s%s\n", verdict_tally->first_problem,
           verdict_tally->problems > 1 ? " (more problems above)" : "");
    return 1;
}

// ---------------------------------------------------------------- ranks and deadlines
enum { RANKS_MAX = 8, RANK_STUCK_STATUS = 86 };

// What every rank leaves for the parent, whatever the exercise.
typedef struct {
    int finished[RANKS_MAX];   // returned from every call of the student's function
    int stuck[RANKS_MAX];      // still inside it at the deadline
} rank_outcomes_t;

// The multi-rank job of this check (ranks_setup).
static struct {
    const char *function;          // the student's function, as the messages name it
    const char *deadlock_format;   // see ranks_setup
    void *results;                 // the check's own results, cleared before each run
    size_t results_bytes;
    rank_outcomes_t *outcomes;
    int rank;                      // this process's rank, for the deadline
} ranks_job;

// Prepares a multi-rank check; returns results_bytes of memory the ranks
// share with the parent. deadlock_format is the verdict on a deadlock, a
// printf format given the case (%s), the deadline (%d seconds) and the
// stuck ranks (%s), in that order.
static inline void *ranks_setup(size_t results_bytes, const char *function, const char *deadlock_format) {
    ranks_job.function = function;
    ranks_job.deadlock_format = deadlock_format;
    ranks_job.results = check_shared_memory(results_bytes);
    ranks_job.results_bytes = results_bytes;
    ranks_job.outcomes = check_shared_memory(sizeof *ranks_job.outcomes);
    setenv("COURSE_KILL_GRACE", "2", 0);   // stopping deadlocked ranks need not take 5 s
    return ranks_job.results;
}

static inline void ranks_teardown(void) {
    munmap(ranks_job.results, ranks_job.results_bytes);
    munmap(ranks_job.outcomes, sizeof *ranks_job.outcomes);
}

static inline int deadline_seconds(void) {
    const char *text = getenv("EXERCISE_DEADLINE");
    int seconds = text ? atoi(text) : 0;
    return seconds > 0 ? seconds : 10;
}

// What a stuck rank says before it goes (written in advance: a signal
// handler may only write(), not format).
static char deadline_message[256];

// A rank still inside the student's function at the deadline: noted for
// the verdict, said on stderr, and ended by the alarm's own signal, so that
// spawn's line reads "killed by signal SIGALRM" rather than a bare status.
static inline void on_deadline(int sig) {
    ranks_job.outcomes->stuck[ranks_job.rank] = 1;
    ssize_t ignored = write(STDERR_FILENO, deadline_message, strlen(deadline_message));
    (void)ignored;   // nothing better to do if stderr is gone
    signal(sig, SIG_DFL);
    sigset_t self;   // unblock it: a signal is blocked inside its own handler
    sigemptyset(&self);
    sigaddset(&self, sig);
    sigprocmask(SIG_UNBLOCK, &self, NULL);
    raise(sig);
    _exit(RANK_STUCK_STATUS);   // not reached: SIGALRM's default action ends the process
}

// From here on, this rank has deadline_seconds() to finish (alarm(0) ends it).
static inline void arm_deadline(int rank) {
    ranks_job.rank = rank;
    snprintf(deadline_message, sizeof deadline_message,
             "rank %d: still inside %s after %d s (EXERCISE_DEADLINE): stopped by the alarm (SIGALRM)\n",
             rank, ranks_job.function, deadline_seconds());
    struct sigaction on = {0};
    on.sa_handler = on_deadline;
    sigemptyset(&on.sa_mask);
    CHECK_SYS(sigaction(SIGALRM, &on, NULL));
    alarm((unsigned)deadline_seconds());
}

// Joins the job spawn() set up: cpu device, cpu backend, so it runs anywhere.
// The process group's own timeout is longer than the deadline, so that the
// check, not the library, reports a hang.
static inline void rank_join(dist_t *d) {
    dist_options how = {"env://", "cpu", "cpu", deadline_seconds() + 30.0};
    dist_init(d, &how);
}

// The last thing a rank does before dist_finish: it returned from every call.
static inline void rank_finished(int rank) { ranks_job.outcomes->finished[rank] = 1; }

// Runs fn on `world` ranks; false (after saying why) when not all finished.
static inline bool run_ranks(int world, spawn_fn fn, const char *what) {
    if (world > RANKS_MAX) die("run_ranks: %d ranks, at most %d", world, RANKS_MAX);
    rank_outcomes_t *out = ranks_job.outcomes;
    memset(ranks_job.results, 0, ranks_job.results_bytes);
    memset(out, 0, sizeof *out);
    fflush(stdout);
    if (spawn(world, fn, NULL) == 0) return true;
    char stuck[64] = "", gone[64] = "", done[64] = "";
    for (int r = 0; r < world; r++) {
        char *list = out->stuck[r] ? stuck : !out->finished[r] ? gone : done;
        snprintf(list + strlen(list), 64 - strlen(list), "%s%d", list[0] ? ", " : "", r);
    }
    if (stuck[0])
        verdict(false, ranks_job.deadlock_format, what, deadline_seconds(), stuck);
    else if (done[0] && gone[0])
        verdict(false, "%s: rank(s) %s stopped inside %s while rank(s) %s had returned from it: every "
                "rank must make the same pg_ calls in the same order (the error above says which call "
                "did not match)", what, gone, ranks_job.function, done);
    else
        verdict(false, "%s: rank(s) %s stopped before finishing: a crash, exit() or a failed pg_ "
                "call (its error is printed above)", what, gone[0] ? gone : "?");
    return false;
}

#endif
