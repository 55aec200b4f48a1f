// exercises.h - the function chapter 05's exercise asks you to write.
//
// You write it in epoch_loss.c; check_epoch_loss.c calls it, so keep this
// signature. Check it from the course's top folder with
//   make check-exercise EX=05/epoch_loss
#ifndef EXERCISES_05_H
#define EXERCISES_05_H

#include "dist.h"

// The epoch's mean batch loss over ALL ranks, returned on every rank:
// (sum over ranks of loss_sum) / (sum over ranks of batches).
double epoch_mean_loss(dist_t *d, double loss_sum, double batches);

#endif
