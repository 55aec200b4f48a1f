// rng.h - a small, fast, reproducible random number generator.
//
// Every rank must be able to produce the same numbers from the same seed
// (the same data, the same shuffle), on any machine, so the course uses its
// own generator (splitmix64) instead of rand(), whose sequence differs
// between C libraries.
#ifndef COURSE_RNG_H
#define COURSE_RNG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t state; } rng_t;

static inline rng_t rng_seed(uint64_t seed) { rng_t r = {seed}; return r; }

static inline uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1), with 53 random bits.
static inline double rng_uniform(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

// Uniform integer in [0, n), without modulo bias worth caring about at these sizes.
static inline uint64_t rng_below(rng_t *r, uint64_t n) {
    return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

// Standard normal by Box-Muller (one of the pair is thrown away: simple beats fast here).
static inline double rng_normal(rng_t *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Fisher-Yates: a uniformly random order of 0..n-1.
static inline void rng_permutation(rng_t *r, int64_t *order, size_t n) {
    for (size_t i = 0; i < n; i++) order[i] = (int64_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(r, i);
        int64_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

#endif
