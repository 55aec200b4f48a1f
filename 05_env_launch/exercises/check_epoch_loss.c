// check_epoch_loss.c - checks exercise 05/epoch_loss.
//
// Run it with `make check-exercise EX=05/epoch_loss` from the top folder.
// It starts 1, 2 and 3 ranks with spawn, which sets the launcher's
// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) as tools/ddprun would; each
// rank joins with dist_init, as 05_env_launch does, and calls your
// epoch_mean_loss for two epochs. The ranks trained on DIFFERENT numbers of
// batches (rank r: 2 + 3r), so that the right answer differs from the
// usual wrong ones, which the check recognises: a rank's own mean, the mean
// of the ranks' means, the summed losses divided by the world size.
// A rank that is still inside your function after EXERCISE_DEADLINE
// seconds (default 10) is called deadlocked, and the ranks are stopped.
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>

#include "dist.h"
#include "exercises.h"
#include "spawn.h"

enum { MAX_WORLD = 3, EPOCHS = 2, STUCK_STATUS = 86 };

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    int finished[MAX_WORLD];   // returned from every call
    int stuck[MAX_WORLD];      // still inside epoch_mean_loss at the deadline
    double result[MAX_WORLD][EPOCHS];
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
        verdict(false, "%s: deadlock: after %d s rank(s) %s were still inside epoch_mean_loss with "
                "no result: do all ranks make the same calls (an all-reduce on every rank)?", what,
                deadline_seconds(), stuck);
    else if (done[0] && gone[0])
        verdict(false, "%s: rank(s) %s stopped inside epoch_mean_loss while rank(s) %s had returned from it: "
                "every rank must make the same pg_ calls in the same order (the error above says "
                "which call did not match)", what, gone, done);
    else
        verdict(false, "%s: rank(s) %s stopped before finishing: a crash, exit() or a failed pg_ "
                "call (its error is printed above)", what, gone[0] ? gone : "?");
    return false;
}

// ---------------------------------------------------------------- the numbers
// Rank r trained on 2 + 3r batches whose mean loss was mean_of(r, epoch).
static double batches_of(int rank) { return 2 + 3 * rank; }
static double mean_of(int rank, int epoch) { return epoch == 0 ? 1.0 + rank : 0.5 / (rank + 1); }

static int loss_rank(int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dist_t d;
    dist_options how = {"env://", "cpu", "cpu", deadline_seconds() + 30.0};
    dist_init(&d, &how);   // reads RANK, WORLD_SIZE, ... which spawn set, as a launcher would
    arm_deadline(rank);
    for (int epoch = 0; epoch < EPOCHS; epoch++)
        shared->result[rank][epoch] = epoch_mean_loss(&d, mean_of(rank, epoch) * batches_of(rank),
                                                      batches_of(rank));
    alarm(0);
    shared->finished[rank] = 1;
    dist_finish(&d);
    return 0;
}

static bool same(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

// What a wrong number is, when it is a familiar one.
static const char *loss_hint(double got, int rank, int epoch, int world) {
    double loss_sums = 0, batches = 0, means = 0;
    for (int r = 0; r < world; r++) {
        loss_sums += mean_of(r, epoch) * batches_of(r);
        batches += batches_of(r);
        means += mean_of(r, epoch);
    }
    if (same(got, mean_of(rank, epoch))) return ": that is this rank's own mean; the other ranks' batches are missing";
    if (same(got, means / world))
        return ": that is the mean of the ranks' means; a rank with more batches must weigh more, "
               "so sum the loss sums and the batch counts separately, then divide";
    if (same(got, loss_sums / world)) return ": the summed losses divided by the world size; divide by the summed batches";
    if (same(got, loss_sums)) return ": the summed losses, not yet divided by the summed batches";
    if (same(got, loss_sums / batches_of(rank))) return ": the summed losses divided by this rank's batches only";
    return "";
}

static bool check_world(int world) {
    for (int epoch = 0; epoch < EPOCHS; epoch++) {
        double loss_sums = 0, batches = 0;
        for (int r = 0; r < world; r++) {
            loss_sums += mean_of(r, epoch) * batches_of(r);
            batches += batches_of(r);
        }
        double want = loss_sums / batches;
        for (int r = 0; r < world; r++) {
            double got = shared->result[r][epoch];
            if (same(got, want)) continue;
            verdict(false, "%d rank(s) (rank r has 2 + 3r batches), epoch %d: rank %d returned %.6g, expected %.6g "
                    "(all ranks' loss sums / all ranks' batches = %g / %g)%s", world, epoch, r, got,
                    want, loss_sums, batches, loss_hint(got, r, epoch, world));
            return false;
        }
    }
    return true;
}

int main(void) {
    printf("check 05/epoch_loss: the epoch's mean loss over all ranks (epoch_loss.c)\n");
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) die("mmap of %zu bytes failed: %s", sizeof *shared, strerror(errno));
    setenv("COURSE_KILL_GRACE", "2", 0);
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d rank(s)", world);
        if (run_ranks(world, loss_rank, what) && check_world(world))
            verdict(true, "%d rank(s): every rank returns the mean over all %g batches, two epochs in a row",
                    world, world == 1 ? 2.0 : world == 2 ? 7.0 : 15.0);
    }
    munmap(shared, sizeof *shared);
    if (problems == 0) {
        printf("PASSED: every rank gets the epoch's mean loss over all ranks' batches, weighted by "
               "their number, on 1 to 3 ranks\n");
        return 0;
    }
    printf("NOT YET: %s%s\n", first_problem, problems > 1 ? " (more problems above)" : "");
    return 1;
}
