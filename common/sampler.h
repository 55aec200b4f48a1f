// sampler.h - which samples each rank trains on, epoch by epoch.
//
// The semantics of PyTorch's DistributedSampler, written out:
//   1. Every rank builds the SAME global order of the N samples: a random
//      permutation seeded with seed + epoch (so each epoch differs, and all
//      ranks agree without talking to each other).
//   2. The order is padded by wrapping around to a multiple of the world
//      size W (or cut down to one, with drop_last), so that every rank gets
//      the same number of samples, runs the same number of steps, and no
//      rank waits forever in an all-reduce at the last batch.
//   3. Rank r takes positions r, r + W, r + 2W, ... of that order.
// Because of 3, batch s of every rank together covers positions
// [s*b*W, (s+1)*b*W) of the global order: W ranks with batch b see exactly
// the samples one process with batch b*W would see.
//
// Padding repeats a few samples. Training does not mind; evaluation must not
// count them twice, so the sampler says how many of a rank's samples are real.
//
// As DistributedSampler, a new sampler holds epoch 0's order: a loop that
// never calls sampler_set_epoch still trains on every sample, but in the
// same order every epoch (PyTorch's most common DDP bug: no error, a little
// worse training). Call sampler_set_epoch(&s, epoch) first in every epoch.
#ifndef COURSE_SAMPLER_H
#define COURSE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "rng.h"

typedef struct {
    int64_t dataset_size;  // N
    int world_size, rank;
    bool shuffle, drop_last;
    uint64_t seed;
    int epoch;
    int64_t start;         // global position this epoch starts from (resume)
    int64_t *indices;      // this rank's samples for the epoch, in order
    int64_t num_samples;   // how many: the same on every rank
    int64_t num_real;      // how many of them are not padding
} sampler_t;

// Builds this rank's list for `epoch`, skipping the first `start` positions
// of the global order (0 for a fresh epoch; the saved position on resume:
// the rest of the epoch is then shared among the ranks of this run, so a
// job can resume with another world size).
static inline void sampler_set_epoch_from(sampler_t *s, int epoch, int64_t start) {
    int64_t n = s->dataset_size, world = s->world_size;
    if (start < 0 || start > n) die("sampler: start position %lld is outside 0..%lld", (long long)start, (long long)n);
    int64_t *order = xmalloc(sizeof(int64_t) * (size_t)n);
    if (s->shuffle) {
        rng_t rng = rng_seed(s->seed + (uint64_t)epoch);
        rng_permutation(&rng, order, (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++) order[i] = i;
    }
    int64_t remaining = n - start;
    int64_t per_rank = s->drop_last ? remaining / world : (remaining + world - 1) / world;
    s->epoch = epoch;
    s->start = start;
    s->num_samples = per_rank;
    s->num_real = 0;
    for (int64_t k = 0; k < per_rank; k++) {
        int64_t position = s->rank + k * world;         // in the remaining order
        s->num_real += position < remaining;
        s->indices[k] = order[(start + position) % n]; // past the end: wrap to the epoch's first samples
    }
    free(order);
}

static inline sampler_t sampler_create(int64_t dataset_size, int world_size, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last) {
    if (dataset_size < 1) die("sampler: the dataset is empty");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        die("sampler: rank %d is not in a world of %d", rank, world_size);
    if (drop_last && dataset_size < world_size)
        die("sampler: drop_last with %lld samples for %d ranks leaves nothing to train on",
            (long long)dataset_size, world_size);
    sampler_t s = {dataset_size, world_size, rank, shuffle, drop_last, seed, 0, 0, NULL, 0, 0};
    s.indices = xmalloc(sizeof(int64_t) * (size_t)(dataset_size / world_size + 1));
    sampler_set_epoch_from(&s, 0, 0);   // epoch 0 until told otherwise
    return s;
}

static inline void sampler_set_epoch(sampler_t *s, int epoch) { sampler_set_epoch_from(s, epoch, 0); }

static inline void sampler_free(sampler_t *s) {
    free(s->indices);
    s->indices = NULL;
}

#endif
