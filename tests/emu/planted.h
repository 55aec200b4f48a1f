// planted.h - what every planted-bug program shares: a checked CUDA call
// and the --fixed switch.
#ifndef PLANTED_H
#define PLANTED_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                  \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s failed at %s:%d: %s (%s)\n", #call, __FILE__, __LINE__,              \
                    cudaGetErrorString(err_), cudaGetErrorName(err_));                               \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

// true when the program was asked to run the corrected code
static inline bool planted_fixed(int argc, char **argv) { return argc > 1 && !strcmp(argv[1], "--fixed"); }
#endif
