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
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"

enum { MAX_WORLD = 3, EPOCHS = 2 };

// What the ranks leave for the parent: memory mapped shared before spawn.
typedef struct {
    double result[MAX_WORLD][EPOCHS];
} shared_results;

static shared_results *shared;

// What run_ranks says of a deadlock: a printf format given the case, the
// deadline in seconds and the ranks still inside the function.
static const char deadlock_verdict[] =
    "%s: deadlock: after %d s rank(s) %s were still inside epoch_mean_loss with "
    "no result: do all ranks make the same calls (an all-reduce on every rank)?";

// ---------------------------------------------------------------- the numbers
// Rank r trained on 2 + 3r batches whose mean loss was mean_of(r, epoch).
static double batches_of(int rank) { return 2 + 3 * rank; }
static double mean_of(int rank, int epoch) { return epoch == 0 ? 1.0 + rank : 0.5 / (rank + 1); }

static int loss_rank(int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dist_t d;
    rank_join(&d);   // reads RANK, WORLD_SIZE, ... which spawn set, as a launcher would
    arm_deadline(rank);
    for (int epoch = 0; epoch < EPOCHS; epoch++)
        shared->result[rank][epoch] = epoch_mean_loss(&d, mean_of(rank, epoch) * batches_of(rank),
                                                      batches_of(rank));
    alarm(0);
    rank_finished(rank);
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
    shared = ranks_setup(sizeof *shared, "epoch_mean_loss", deadlock_verdict);
    for (int world = 1; world <= MAX_WORLD; world++) {
        char what[32];
        snprintf(what, sizeof what, "%d rank(s)", world);
        if (run_ranks(world, loss_rank, what) && check_world(world))
            verdict(true, "%d rank(s): every rank returns the mean over all %g batches, two epochs in a row",
                    world, world == 1 ? 2.0 : world == 2 ? 7.0 : 15.0);
    }
    ranks_teardown();
    return check_finish("every rank gets the epoch's mean loss over all ranks' batches, weighted by "
                        "their number, on 1 to 3 ranks");
}
