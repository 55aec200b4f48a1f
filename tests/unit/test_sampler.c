// Unit test of common/sampler.h: DistributedSampler semantics.
#include <stdlib.h>

#include "sampler.h"
#include "test.h"

// Builds every rank's list for one epoch and checks the contract.
static void check_epoch(int64_t n, int world, int epoch, bool drop_last) {
    char name[160];
    sampler_t *s = malloc(sizeof(sampler_t) * (size_t)world);
    int *seen = calloc((size_t)n, sizeof(int));
    int64_t real_total = 0, length = -1;
    bool equal_lengths = true;
    for (int r = 0; r < world; r++) {
        s[r] = sampler_create(n, world, r, true, 7, drop_last);
        sampler_set_epoch(&s[r], epoch);
        if (length < 0) length = s[r].num_samples;
        equal_lengths &= s[r].num_samples == length;
        real_total += s[r].num_real;
        for (int64_t k = 0; k < s[r].num_real; k++) seen[s[r].indices[k]]++;
    }
    int64_t missing = 0, repeated = 0;
    for (int64_t i = 0; i < n; i++) {
        missing += seen[i] == 0;
        repeated += seen[i] > 1;
    }
    snprintf(name, sizeof name, "sampler: n=%lld world=%d epoch=%d drop_last=%d: equal lengths",
             (long long)n, world, epoch, drop_last);
    EXPECT(name, equal_lengths, "ranks got different numbers of samples");
    snprintf(name, sizeof name, "sampler: n=%lld world=%d epoch=%d drop_last=%d: disjoint%s",
             (long long)n, world, epoch, drop_last, drop_last ? "" : " and covering");
    if (drop_last)
        EXPECT(name, repeated == 0 && real_total == (n / world) * world,
               "%lld repeated, %lld real samples", (long long)repeated, (long long)real_total);
    else
        EXPECT(name, missing == 0 && repeated == 0 && real_total == n && length * world >= n,
               "%lld missing, %lld repeated, %lld real of %lld", (long long)missing,
               (long long)repeated, (long long)real_total, (long long)n);
    for (int r = 0; r < world; r++) sampler_free(&s[r]);
    free(s);
    free(seen);
}

int main(void) {
    int64_t sizes[] = {1, 7, 10, 100, 10000, 10001};
    for (int w = 1; w <= 5; w++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            if (sizes[i] < 2 * w && sizes[i] != 1) continue;
            check_epoch(sizes[i], w, 0, false);
            check_epoch(sizes[i], w, 3, false);
            if (sizes[i] >= w) check_epoch(sizes[i], w, 1, true);
        }

    // A new order each epoch, and the same order on every rank (two
    // samplers built independently, as two processes would).
    sampler_t a = sampler_create(1000, 3, 1, true, 42, false);
    sampler_t b = sampler_create(1000, 3, 1, true, 42, false);
    sampler_set_epoch(&a, 0);
    sampler_set_epoch(&b, 0);
    EXPECT("sampler: same order on every process", !memcmp(a.indices, b.indices, sizeof(int64_t) * (size_t)a.num_samples), "orders differ");
    // Before any set_epoch, a sampler holds epoch 0's order, as PyTorch's
    // DistributedSampler does: a loop that forgets set_epoch trains on every
    // sample (in the same order each epoch), never on nothing.
    sampler_t fresh = sampler_create(1000, 3, 1, true, 42, false);
    EXPECT("sampler: a new sampler holds epoch 0's order before set_epoch",
           fresh.epoch == 0 && fresh.num_samples == a.num_samples && fresh.num_real == a.num_real &&
           !memcmp(fresh.indices, a.indices, sizeof(int64_t) * (size_t)a.num_samples),
           "epoch %d, %lld samples (%lld real); epoch 0 has %lld", fresh.epoch, (long long)fresh.num_samples,
           (long long)fresh.num_real, (long long)a.num_samples);
    sampler_free(&fresh);
    sampler_set_epoch(&b, 1);
    EXPECT("sampler: different order next epoch", memcmp(a.indices, b.indices, sizeof(int64_t) * (size_t)a.num_samples) != 0, "epoch 0 and 1 orders are equal");

    // Batch s of all ranks together = positions [s*b*W, (s+1)*b*W) of the
    // one-process order: the basis of "DDP equals one big batch".
    sampler_t one = sampler_create(1200, 1, 0, true, 42, false);
    sampler_set_epoch(&one, 2);
    bool same_batches = true;
    int world = 3, batch = 16;
    for (int r = 0; r < world; r++) {
        sampler_t s = sampler_create(1200, world, r, true, 42, false);
        sampler_set_epoch(&s, 2);
        for (int64_t k = 0; k < s.num_samples; k++) {
            int64_t step = k / batch, global_block = step * batch * world;
            bool found = false;
            for (int64_t j = global_block; j < global_block + batch * world && j < 1200; j++)
                found |= one.indices[j] == s.indices[k];
            same_batches &= found;
        }
        sampler_free(&s);
    }
    EXPECT("sampler: W ranks' step s covers the one-process batch s", same_batches, "a sample is in another step");

    // Resume from a global position with another world size: together the
    // ranks cover exactly the rest of the epoch.
    int64_t start = 500;
    int *seen = calloc(1200, sizeof(int));
    int64_t real = 0;
    for (int r = 0; r < 2; r++) {
        sampler_t s = sampler_create(1200, 2, r, true, 42, false);
        sampler_set_epoch_from(&s, 2, start);
        for (int64_t k = 0; k < s.num_real; k++) seen[s.indices[k]]++;
        real += s.num_real;
        sampler_free(&s);
    }
    bool rest_once = real == 1200 - start;
    for (int64_t j = 0; j < 1200; j++) rest_once &= seen[one.indices[j]] == (j >= start);
    EXPECT("sampler: resuming mid-epoch covers exactly the rest", rest_once, "%lld real samples", (long long)real);
    free(seen);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&one);
    return test_failures != 0;
}
