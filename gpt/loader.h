// loader.h - the batches of an epoch, made ready ahead of the training step:
// PyTorch's DataLoader(num_workers=1), for chapter 08's GPT.
//
// A batch here is B blocks of T+1 tokens gathered from the token array in
// the order the sampler gave this rank: B x T inputs and the same shifted by
// one token, the targets. Made in the training loop (num_workers 0, as
// PyTorch's default), the gathering is part of every step. With a worker
// (num_workers 1), a thread makes batch i+1 while step i computes, in a
// second buffer: the step then only swaps buffers, and waits only when the
// worker is behind. Two buffers are enough for one worker; more workers
// help only when one batch takes longer to make than a step takes to train
// (decoding images, reading from a disk), which a gather of a few KiB of
// tokens never does: `make bench` in 08 shows the step's "data" phase with
// and without the worker.
//
// PyTorch's pin_memory=True makes the batches in page-locked memory, from
// which a GPU copies without waiting for the host; the GPU model always
// uploads through its own page-locked buffer (gpt_cuda.cu, upload_tokens),
// so the loader's buffers need not be.
//
// Use:
//   loader_t l = loader_create(tokens, B, T, workers);
//   loader_set_epoch(&l, sampler.indices, batches);   // each epoch, after the sampler's
//   const loader_batch_t *b = loader_next(&l);         // batches 0, 1, ... in order
//   ... b->inputs, b->targets ...                      // valid until the next loader_next
//   loader_free(&l);
#ifndef GPT_LOADER_H
#define GPT_LOADER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

typedef struct {
    uint16_t *inputs, *targets;   // B x T tokens each
    int index;                    // which batch of the epoch it holds (-1: none)
} loader_batch_t;

typedef struct {
    const uint16_t *tokens;       // the split: block k is tokens[k*T .. k*T + T]
    int B, T, workers;
    const int64_t *order;         // this epoch's blocks, in order (the sampler's)
    int batches, next;            // batches this epoch; the one loader_next hands out next
    loader_batch_t slot[2];       // the step trains on one while the worker fills the other
    // The worker: asked to fill slot `wanted_slot` with batch `wanted`.
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int wanted, wanted_slot;           // -1: no request
    bool started, stop;
} loader_t;

// Batch `index` of the epoch into b: B blocks, each its T inputs and the
// same T tokens one step later, the targets.
static inline void loader_fill(const loader_t *l, loader_batch_t *b, int index) {
    for (int i = 0; i < l->B; i++) {
        const uint16_t *block = l->tokens + (size_t)l->order[(size_t)index * l->B + i] * l->T;
        memcpy(b->inputs + (size_t)i * l->T, block, sizeof(uint16_t) * l->T);
        memcpy(b->targets + (size_t)i * l->T, block + 1, sizeof(uint16_t) * l->T);
    }
    b->index = index;
}

// The worker thread: waits for a request, fills, says so, waits again.
static inline void *loader_worker(void *arg) {
    loader_t *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (!l->stop && l->wanted < 0) pthread_cond_wait(&l->changed, &l->lock);
        if (l->stop) break;
        int index = l->wanted, s = l->wanted_slot;
        pthread_mutex_unlock(&l->lock);
        loader_fill(l, &l->slot[s], index);   // the slot is the worker's until it says so
        pthread_mutex_lock(&l->lock);
        l->wanted = -1;
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

static inline loader_t loader_create(const uint16_t *tokens, int B, int T, int workers) {
    if (workers < 0 || workers > 1) die("loader: num_workers is 0 or 1, got %d", workers);
    loader_t l = {.tokens = tokens, .B = B, .T = T, .workers = workers, .wanted = -1};
    for (int s = 0; s < 2; s++) {
        l.slot[s].inputs = xmalloc(sizeof(uint16_t) * (size_t)B * T);
        l.slot[s].targets = xmalloc(sizeof(uint16_t) * (size_t)B * T);
        l.slot[s].index = -1;
    }
    return l;
}

// The thread starts on the first epoch: it needs the loader at its final
// address (the caller's copy of what loader_create returned).
static inline void loader_start_worker(loader_t *l) {
    if (l->workers == 0 || l->started) return;
    int rc = pthread_mutex_init(&l->lock, NULL);
    if (!rc) rc = pthread_cond_init(&l->changed, NULL);
    if (!rc) rc = pthread_create(&l->thread, NULL, loader_worker, l);
    if (rc) die("loader: cannot start its worker thread: %s", strerror(rc));
    l->started = true;
}

// Waits until the worker has no request left (it has filled what it was asked).
static inline void loader_wait_idle(loader_t *l) {
    pthread_mutex_lock(&l->lock);
    while (l->wanted >= 0) pthread_cond_wait(&l->changed, &l->lock);
    pthread_mutex_unlock(&l->lock);
}

static inline void loader_request(loader_t *l, int index, int s) {
    pthread_mutex_lock(&l->lock);
    l->wanted = index, l->wanted_slot = s;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
}

// A new epoch: its order (sampler.indices, which must stay put until the
// next call) and its number of batches. The worker starts on batch 0.
static inline void loader_set_epoch(loader_t *l, const int64_t *order, int batches) {
    loader_start_worker(l);
    if (l->workers) loader_wait_idle(l);   // a batch of the last epoch may be in the making
    l->order = order, l->batches = batches, l->next = 0;
    l->slot[0].index = l->slot[1].index = -1;
    if (l->workers && batches > 0) loader_request(l, 0, 0);
}

// The epoch's next batch, in order: made now (no worker), or taken from the
// worker, which then starts on the one after it in the other buffer.
static inline const loader_batch_t *loader_next(loader_t *l) {
    if (l->next >= l->batches) die("loader: the epoch has %d batches, all handed out", l->batches);
    int index = l->next++;
    if (l->workers == 0) {
        loader_fill(l, &l->slot[0], index);
        return &l->slot[0];
    }
    loader_wait_idle(l);   // the wait that the step profile's "data" phase measures
    int s = l->slot[0].index == index ? 0 : 1;
    if (l->slot[s].index != index) die("loader: batch %d was not made (a bug in loader.h)", index);
    if (index + 1 < l->batches) loader_request(l, index + 1, 1 - s);   // the slot no one reads now
    return &l->slot[s];
}

static inline void loader_free(loader_t *l) {
    if (l->started) {
        pthread_mutex_lock(&l->lock);
        l->stop = true;
        pthread_cond_broadcast(&l->changed);
        pthread_mutex_unlock(&l->lock);
        pthread_join(l->thread, NULL);
        pthread_mutex_destroy(&l->lock);
        pthread_cond_destroy(&l->changed);
    }
    for (int s = 0; s < 2; s++) free(l->slot[s].inputs), free(l->slot[s].targets);
    memset(l, 0, sizeof *l);
}

#endif
