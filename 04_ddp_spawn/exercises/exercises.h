// exercises.h - the function chapter 04's exercise asks you to write.
//
// You write it in average_gradients.c; check_average_gradients.c calls it,
// so keep this signature. Check it from the course's top folder with
//   make check-exercise EX=04/average_gradients
#ifndef EXERCISES_04_H
#define EXERCISES_04_H

#include <stddef.h>

#include "pg.h"

// grads[0..count-1] <- the mean over all ranks of grads, on every rank.
void average_gradients(pg_t *pg, float *grads, size_t count);

#endif
