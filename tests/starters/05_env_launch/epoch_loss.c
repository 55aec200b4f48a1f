// epoch_loss.c - EXERCISE: the loss of an epoch, over all ranks.
//
// In a data-parallel job each rank sees only its share of the data, so its
// own loss is only part of the picture. At the end of an epoch every rank
// knows two numbers about its share:
//     loss_sum  the sum of its batches' mean losses
//     batches   how many batches it trained on
// Return, on every rank, the mean batch loss of the WHOLE epoch:
//     (loss_sum of rank 0 + ... + loss_sum of rank W-1)
//   / (batches of rank 0  + ... + batches of rank W-1)
// 05_env_launch.c prints exactly this after every epoch; try without looking.
//
//     double epoch_mean_loss(dist_t *d, double loss_sum, double batches);
//
// Hints:
//   - d->world_size and d->rank are the job's; d->pg is the process group.
//   - dist_all_reduce_host(d, values, count, OP_SUM) (common/dist.h) sums a
//     few doubles that live on the host over all ranks, in place.
//   - The mean of the ranks' means is NOT the same number when the ranks
//     trained on different numbers of batches (the check makes them differ).
//   - Every rank must make the same calls: an all-reduce on rank 0 only
//     would leave it waiting for the others forever.
//
// Check it (from the course's top folder):
//     make check-exercise EX=05/epoch_loss
// The check launches 1, 2 and 3 ranks through the launcher's variables
// (spawn sets RANK, WORLD_SIZE, MASTER_ADDR, ... as ddprun does) and says
// which rank returned what, and what that number is (rank 0's own mean, the
// mean of the means, ...).
#include "exercises.h"

double epoch_mean_loss(dist_t *d, double loss_sum, double batches) {
    // TODO: sum both numbers over the ranks, then divide.
    (void)d;
    return loss_sum / batches;
}
