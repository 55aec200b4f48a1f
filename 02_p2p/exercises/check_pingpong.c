// check_pingpong.c - checks exercise 02/pingpong.
//
// Run it with `make check-exercise EX=02/pingpong` from the top folder.
// It spawns 2 and then 3 ranks (on the cpu backend, so it runs anywhere)
// and runs your pingpong three times: 10 round trips of 1 element, 5 of
// 1000, 3 of a million (4 MiB). Every rank checks its own buffer afterwards:
//   rank 0:    its start value + iters (rank 1 added 1 per round trip)
//   rank 1:    the same (the last value it sent back)
//   rank 2:    untouched (it takes no part)
// and the parent turns the first wrong element into words ("rank 0's buffer
// shows 1 round trip of 5"). A rank that is still inside your function
// after EXERCISE_DEADLINE seconds (default 10) is called deadlocked.
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>

#include "dist.h"
#include "exercises.h"
#include "spawn.h"
#include "timer.h"

enum { MAX_WORLD = 3, CASES = 3, STUCK_STATUS = 86 };
#define RANK1_MARKER (-7777)
#define IDLE_VALUE 55

static const struct { size_t count; int iters; } cases[CASES] = {{1, 10}, {1000, 5}, {1 << 20, 3}};

// The first wrong element a rank found in its own buffer (index -1: none).
typedef struct {
    long index;
    int32_t got, want;
} finding;

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    int finished[MAX_WORLD];   // returned from every call
    int stuck[MAX_WORLD];      // still inside pingpong at the deadline
    finding found[MAX_WORLD][CASES];
    double round_trip_us;      // rank 0, the 1-element case
} shared_results;

static shared_results *shared;

// ---------------------------------------------------------------- verdicts
static int problems = 0;
static char first_problem[700];

__attribute__((format(printf, 2, 3)))
static void verdict(bool ok, const char *fmt, ...) {
    char text[700];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    printf("  %-5s %s\n", ok ? "ok" : "WRONG", text);
    fflush(stdout);
    if (!ok && problems++ == 0) snprintf(first_problem, sizeof first_problem, "%s", text);
}

// ---------------------------------------------------------------- ranks, deadlines
static int deadline_seconds(void) {
    const char *text = getenv("EXERCISE_DEADLINE");
    int seconds = text ? atoi(text) : 0;
    return seconds > 0 ? seconds : 10;
}

static int deadline_rank;

static void on_deadline(int sig) {
    (void)sig;
    shared->stuck[deadline_rank] = 1;
    _exit(STUCK_STATUS);
}

// From here on, this rank has deadline_seconds() to finish.
static void arm_deadline(int rank) {
    deadline_rank = rank;
    struct sigaction on = {0};
    on.sa_handler = on_deadline;
    sigemptyset(&on.sa_mask);
    CHECK_SYS(sigaction(SIGALRM, &on, NULL));
    alarm((unsigned)deadline_seconds());
}

// Runs fn on `world` ranks; false (after saying why) when not all finished.
static bool run_ranks(int world, spawn_fn fn, const char *what) {
    memset(shared, 0, sizeof *shared);
    fflush(stdout);
    if (spawn(world, fn, NULL) == 0) return true;
    char stuck[64] = "", gone[64] = "", done[64] = "";
    for (int r = 0; r < world; r++) {
        char *list = shared->stuck[r] ? stuck : !shared->finished[r] ? gone : done;
        snprintf(list + strlen(list), 64 - strlen(list), "%s%d", list[0] ? ", " : "", r);
    }
    if (stuck[0])
        verdict(false, "%s: deadlock: after %d s rank(s) %s were still inside pingpong with no result: "
                "do the ranks send and receive in a matching order (one sends while the other "
                "receives)?", what, deadline_seconds(), stuck);
    else if (done[0] && gone[0])
        verdict(false, "%s: rank(s) %s stopped inside pingpong while rank(s) %s had returned from it: "
                "every rank must make the same pg_ calls in the same order (the error above says "
                "which call did not match)", what, gone, done);
    else
        verdict(false, "%s: rank(s) %s stopped before finishing: a crash, exit() or a failed pg_ "
                "call (its error is printed above)", what, gone[0] ? gone : "?");
    return false;
}

// ---------------------------------------------------------------- the ranks
static int32_t start_value(size_t i) { return (int32_t)(i % 100000) * 3 + 1; }

static int32_t initial(int rank, size_t i) {
    return rank == 0 ? start_value(i) : rank == 1 ? RANK1_MARKER : IDLE_VALUE;
}

static int32_t expected(int rank, size_t i, int iters) {
    return rank <= 1 ? start_value(i) + iters : IDLE_VALUE;
}

static int pingpong_rank(int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dist_t d;
    dist_options how = {"env://", "cpu", "cpu", deadline_seconds() + 30.0};
    dist_init(&d, &how);
    for (int k = 0; k < CASES; k++) {
        size_t count = cases[k].count;
        int32_t *buf = xmalloc(count * sizeof *buf);
        for (size_t i = 0; i < count; i++) buf[i] = initial(rank, i);
        arm_deadline(rank);
        double start = now_seconds();
        pingpong(d.pg, buf, count, cases[k].iters);
        double seconds = now_seconds() - start;
        alarm(0);
        if (rank == 0 && k == 0) shared->round_trip_us = seconds / cases[k].iters * 1e6;
        finding *f = &shared->found[rank][k];
        f->index = -1;
        for (size_t i = 0; i < count && f->index < 0; i++)
            if (buf[i] != expected(rank, i, cases[k].iters))
                *f = (finding){(long)i, buf[i], expected(rank, i, cases[k].iters)};
        free(buf);
        pg_barrier(d.pg);   // no rank's next case mixes with this one
    }
    shared->finished[rank] = 1;
    dist_finish(&d);
    return 0;
}

// ---------------------------------------------------------------- the parent
static void explain(int world, int rank, int k, const finding *f) {
    int iters = cases[k].iters;
    char head[160];
    snprintf(head, sizeof head, "%d ranks, %d round trip(s) of %zu element(s): rank %d, element %ld: got %d, "
             "expected %d", world, iters, cases[k].count, rank, f->index, f->got, f->want);
    long trips = (long)f->got - start_value((size_t)f->index);
    if (rank >= 2)
        verdict(false, "%s: rank %d changed its buffer; ranks other than 0 and 1 take no part", head, rank);
    else if (rank == 1 && f->got == RANK1_MARKER)
        verdict(false, "%s: rank 1's buffer still holds the check's marker, so rank 1 never received "
                "into buf", head);
    else if (rank == 0 && trips == 0)
        verdict(false, "%s: rank 0's buffer never changed; rank 0 must receive the echo into buf", head);
    else if (trips > 0 && trips < 1000)
        verdict(false, "%s: that is the start value + %ld, so the buffer shows %ld increment(s) where %d "
                "round trips give %d (only rank 1 adds 1, once per round trip)", head, trips, trips,
                iters, iters);
    else
        verdict(false, "%s", head);
}

static bool check_world(int world) {
    for (int k = 0; k < CASES; k++)
        for (int r = 0; r < world; r++)
            if (shared->found[r][k].index >= 0) {
                explain(world, r, k, &shared->found[r][k]);
                return false;
            }
    verdict(true, "%d ranks: 10 x 1, 5 x 1000 and 3 x 1048576 elements arrive and come back; %s"
            "(%.0f us per round trip of 4 bytes)", world, world > 2 ? "rank 2 stays out " : "",
            shared->round_trip_us);
    return true;
}

int main(void) {
    printf("check 02/pingpong: round trips between rank 0 and rank 1 (pingpong.c)\n");
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) die("mmap of %zu bytes failed: %s", sizeof *shared, strerror(errno));
    setenv("COURSE_KILL_GRACE", "2", 0);
    for (int world = 2; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d ranks", world);
        if (run_ranks(world, pingpong_rank, what)) check_world(world);
    }
    munmap(shared, sizeof *shared);
    if (problems == 0) {
        printf("PASSED: the message goes to rank 1 and back every round trip, for 1 to a million "
               "elements, and other ranks stay out\n");
        return 0;
    }
    printf("NOT YET: %s%s\n", first_problem, problems > 1 ? " (more problems above)" : "");
    return 1;
}
