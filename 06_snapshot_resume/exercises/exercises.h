// exercises.h - the function chapter 06's exercise asks you to write.
//
// You write it in atomic_save.c; check_atomic_save.c calls it, so keep this
// signature. Check it from the course's top folder with
//   make check-exercise EX=06/atomic_save
#ifndef EXERCISES_06_H
#define EXERCISES_06_H

#include <stdbool.h>
#include <stddef.h>

// Writes bytes bytes of data to path so that, whatever happens (a crash, a
// kill -9, a power cut), path holds either its old contents or all of the
// new ones, never a mixture. Returns true on success; on failure returns
// false with a one-line reason in err (errlen bytes) and leaves path as it was.
bool atomic_save(const char *path, const void *data, size_t bytes, char *err, size_t errlen);

#endif
