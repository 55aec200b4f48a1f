// check_ring_allreduce.c - checks exercise 03/ring_allreduce.
//
// Run it with `make check-exercise EX=03/ring_allreduce` from the top
// folder. It spawns 1, 2, 3 and 4 ranks (cpu backend: it runs anywhere) and
// calls your ring_all_reduce on
//   - "counting" buffers of 0, 1, 3, 7, 1000 and 65537 elements, where rank
//     r holds 8^r * (1 + i % 3): the sum is exact in float, and a wrong sum,
//     read in base 8, says how many times it holds each rank's value;
//   - 10007 random floats, whose sum must be the same BYTES on every rank
//     (data-parallel replicas depend on it) and close to the exact sum.
// Every rank checks its own counting buffers; the random results go back to
// the parent, which compares the ranks. A rank that is still inside your
// function after EXERCISE_DEADLINE seconds (default 10) is called
// deadlocked, and the ranks are stopped.
#include <math.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"
#include "rng.h"

enum { MAX_WORLD = 4, SIZES = 6, RANDOM_COUNT = 10007 };
static const size_t sizes[SIZES] = {0, 1, 3, 7, 1000, 65537};

// The first wrong element a rank found in one of its buffers (index -1: none).
typedef struct {
    long index;
    float got, want;
} finding;

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    finding found[MAX_WORLD][SIZES];
    float random[MAX_WORLD][RANDOM_COUNT];
} shared_results;

static shared_results *shared;

// What run_ranks says of a deadlock: a printf format given the case, the
// deadline in seconds and the ranks still inside the function.
static const char deadlock_verdict[] =
    "%s: deadlock: no result after %d s; rank(s) %s were still inside "
    "ring_all_reduce: do all ranks send and receive in a matching order (every receive "
    "has a send from the left neighbour in the same step)?";

// ---------------------------------------------------------------- the ranks
static float counting_input(int rank, size_t i) { return (float)((1 << (3 * rank)) * (int)(1 + i % 3)); }

static float counting_sum(int world, size_t i) {
    return (float)(((1 << (3 * world)) - 1) / 7 * (int)(1 + i % 3));   // 1 + 8 + ... + 8^(W-1)
}

static void random_input(int rank, float *out) {
    rng_t rng = rng_seed(500 + (uint64_t)rank);
    for (int i = 0; i < RANDOM_COUNT; i++) out[i] = (float)rng_normal(&rng);
}

static int ring_rank(int rank, int world, void *arg) {
    (void)arg;
    dist_t d;
    rank_join(&d);
    arm_deadline(rank);
    for (int k = 0; k < SIZES; k++) {
        size_t count = sizes[k];
        float *buf = xmalloc((count ? count : 1) * sizeof *buf);
        for (size_t i = 0; i < count; i++) buf[i] = counting_input(rank, i);
        ring_all_reduce(d.pg, buf, count);
        finding *f = &shared->found[rank][k];
        f->index = -1;
        for (size_t i = 0; i < count && f->index < 0; i++)
            if (buf[i] != counting_sum(world, i)) *f = (finding){(long)i, buf[i], counting_sum(world, i)};
        free(buf);
    }
    random_input(rank, shared->random[rank]);
    ring_all_reduce(d.pg, shared->random[rank], RANDOM_COUNT);
    alarm(0);
    rank_finished(rank);
    dist_finish(&d);
    return 0;
}

// ---------------------------------------------------------------- the parent
// "rank 0's value once, rank 1's 0 times, ..." when got reads as such a sum.
static void contents(float got, size_t i, int world, char *out, size_t size) {
    out[0] = '\0';
    double units = got / (double)(1 + i % 3);
    if (units < 0 || units != floor(units) || units >= pow(8, world)) return;
    long digits = (long)units;
    size_t used = (size_t)snprintf(out, size, "; it holds ");
    for (int r = 0; r < world; r++, digits /= 8) {
        long times = digits % 8;
        used += (size_t)snprintf(out + used, size - used, "%srank %d's value %s", r ? ", " : "", r,
                                 times == 0 ? "0 times" : times == 1 ? "once" : times == 2 ? "twice" : "3+ times");
    }
    snprintf(out + used, size - used, " (each must be added exactly once)");
}

static bool check_counting(int world) {
    for (int k = 0; k < SIZES; k++)
        for (int r = 0; r < world; r++) {
            const finding *f = &shared->found[r][k];
            if (f->index < 0) continue;
            char holds[300];
            contents(f->got, (size_t)f->index, world, holds, sizeof holds);
            verdict(false, "%d rank(s), %zu elements: rank %d, element %ld: got %g, expected %g (the sum "
                    "over %d rank(s))%s", world, sizes[k], r, f->index, f->got, f->want, world, holds);
            return false;
        }
    return true;
}

static bool check_random(int world) {
    double *exact = xcalloc(RANDOM_COUNT, sizeof *exact);
    float *input = xmalloc(RANDOM_COUNT * sizeof *input);
    for (int r = 0; r < world; r++) {
        random_input(r, input);
        for (int i = 0; i < RANDOM_COUNT; i++) exact[i] += input[i];
    }
    bool ok = true;
    for (int i = 0; i < RANDOM_COUNT && ok; i++) {
        float zero = shared->random[0][i];
        if (fabs(zero - exact[i]) > 1e-5 * fmax(1.0, fabs(exact[i]))) {
            verdict(false, "%d rank(s), %d random floats: rank 0, element %d: got %.7g, expected %.7g "
                    "(the sum over %d ranks)", world, RANDOM_COUNT, i, zero, exact[i], world);
            ok = false;
        }
        for (int r = 1; r < world && ok; r++)
            if (memcmp(&shared->random[r][i], &zero, sizeof zero) != 0) {
                verdict(false, "%d ranks, %d random floats: element %d is %.9g on rank %d but %.9g on rank "
                        "0: the sums must be the same bytes on every rank; sum each chunk once, along "
                        "the ring, and then copy the finished chunk (do not re-add it in another order)",
                        world, RANDOM_COUNT, i, shared->random[r][i], r, zero);
                ok = false;
            }
    }
    free(exact);
    free(input);
    return ok;
}

int main(void) {
    printf("check 03/ring_allreduce: all-reduce (sum) around a ring from send/recv (ring_allreduce.c)\n");
    shared = ranks_setup(sizeof *shared, "ring_all_reduce", deadlock_verdict);
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d rank(s)", world);
        if (run_ranks(world, ring_rank, what) && check_counting(world) && check_random(world))
            verdict(true, "%d rank(s): exact sums for 0 to 65537 elements; 10007 random floats summed to "
                    "the same bytes on every rank", world);
    }
    ranks_teardown();
    return check_finish("your ring gives every rank the sum, byte for byte the same, for 1 to 4 ranks "
                        "and any size");
}
