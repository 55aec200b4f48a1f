// exercises.h - the function chapter 02's exercise asks you to write.
//
// You write it in pingpong.c; check_pingpong.c calls it, so keep this
// signature. Check it from the course's top folder with
//   make check-exercise EX=02/pingpong
#ifndef EXERCISES_02_H
#define EXERCISES_02_H

#include <stddef.h>
#include <stdint.h>

#include "pg.h"

// iters round trips between ranks 0 and 1: rank 0 sends buf, rank 1 adds 1
// to every element and sends it back, rank 0 receives it into buf. Other
// ranks return at once.
void pingpong(pg_t *pg, int32_t *buf, size_t count, int iters);

#endif
