// ring_allreduce.c - reference solution of exercise 03/ring_allreduce.
#include "check.h"
#include "exercises.h"

static int ring_mod(int a, int n) { return ((a % n) + n) % n; }

// Chunk c of W: elements [chunk_start(c), chunk_start(c + 1)).
static size_t chunk_start(size_t count, int c, int world) { return count * (size_t)c / (size_t)world; }

static size_t chunk_len(size_t count, int c, int world) {
    return chunk_start(count, c + 1, world) - chunk_start(count, c, world);
}

// One step: send chunk `out` to the right while receiving `in_len` floats
// from the left into `in`. The send is posted first and waited for last,
// so no rank ever waits for a neighbour that is itself waiting.
static void ring_step(pg_t *pg, const float *out, size_t out_len, float *in, size_t in_len) {
    int world = pg_world_size(pg), rank = pg_rank(pg);
    pg_request_t *send = pg_isend(pg, out, out_len, DTYPE_F32, ring_mod(rank + 1, world));
    pg_recv(pg, in, in_len, DTYPE_F32, ring_mod(rank - 1, world));
    pg_wait(send);
}

void ring_all_reduce(pg_t *pg, float *buf, size_t count) {
    int world = pg_world_size(pg), rank = pg_rank(pg);
    if (world == 1 || count == 0) return;
    float *incoming = xmalloc((count / (size_t)world + 1) * sizeof(float));
    // 1. reduce-scatter: afterwards chunk (rank + 1) mod W is complete here.
    for (int step = 0; step < world - 1; step++) {
        int out = ring_mod(rank - step, world), in = ring_mod(rank - step - 1, world);
        size_t in_len = chunk_len(count, in, world);
        ring_step(pg, buf + chunk_start(count, out, world), chunk_len(count, out, world), incoming, in_len);
        float *mine = buf + chunk_start(count, in, world);
        for (size_t j = 0; j < in_len; j++) mine[j] += incoming[j];
    }
    // 2. all-gather: pass the complete chunks on, storing them unchanged.
    for (int step = 0; step < world - 1; step++) {
        int out = ring_mod(rank + 1 - step, world), in = ring_mod(rank - step, world);
        ring_step(pg, buf + chunk_start(count, out, world), chunk_len(count, out, world),
                  buf + chunk_start(count, in, world), chunk_len(count, in, world));
    }
    free(incoming);
}
