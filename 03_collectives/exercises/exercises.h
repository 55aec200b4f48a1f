// exercises.h - the function chapter 03's exercise asks you to write.
//
// You write it in ring_allreduce.c; check_ring_allreduce.c calls it, so
// keep this signature. Check it from the course's top folder with
//   make check-exercise EX=03/ring_allreduce
#ifndef EXERCISES_03_H
#define EXERCISES_03_H

#include <stddef.h>

#include "pg.h"

// In place: buf[0..count-1] <- the sum over all ranks of buf, on every rank,
// with the same bytes on every rank. Built from point-to-point calls only.
void ring_all_reduce(pg_t *pg, float *buf, size_t count);

#endif
