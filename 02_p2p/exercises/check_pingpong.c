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
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "timer.h"

enum { MAX_WORLD = 3, CASES = 3 };
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
    finding found[MAX_WORLD][CASES];
    double round_trip_us;      // rank 0, the 1-element case
} shared_results;

static shared_results *shared;

// What run_ranks says of a deadlock: a printf format given the case, the
// deadline in seconds and the ranks still inside the function.
static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside pingpong with no result: "
    "do the ranks send and receive in a matching order (one sends while the other "
    "receives)?";

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
    rank_join(&d);
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
    rank_finished(rank);
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
    shared = ranks_setup(sizeof *shared, "pingpong", deadlock_verdict);
    for (int world = 2; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d ranks", world);
        if (run_ranks(world, pingpong_rank, what)) check_world(world);
    }
    ranks_teardown();
    return check_finish("the message goes to rank 1 and back every round trip, for 1 to a million "
                        "elements, and other ranks stay out");
}
