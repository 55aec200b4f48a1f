// zero.h - chapter 09's sharding of the GPT: which slice each rank owns,
// the collectives that move slices, and what each rank holds and sends.
// The finale (chapter 14) shards a part's optimizer state with it too (a
// pipeline stage x a tp shard x some experts: ZeRO-1 over dp), so it lives
// in gpt/ beside the model.
//
// 09_zero_fsdp.c says WHAT each ZeRO stage does in its training step; this
// file holds the machinery it calls, in this order:
//   1. who owns what: the buckets of gpt_layout.h, each cut in N slices;
//      with --replicate R, in N/R slices, R times over (hybrid sharding)
//   2. counting: the bytes each rank holds, by kind, and sends, by collective
//   3. the sharded state and the collectives on slices
//   4. the bucket hook: ZeRO-2's gradients and ZeRO-3's parameters, bucket
//      by bucket, while the model computes
//   5. the optimizer step on this rank's slices
// and, in headers of their own that build on this one (09_zero_fsdp.c
// includes them all), how the CPU and a GPU do it (zero_devices.h: the
// two tables of section 3's zero_device_ops), the tables the program
// prints (zero_report.h) and the sharded snapshots (zero_snapshot.h).
#ifndef ZERO_H
#define ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "dist.h"
#include "gpt.h"
#include "groups.h"
#include "log.h"
#include "model.h"
#include "pg.h"

// ===================================================================== 1. who owns what
//
// The flat parameter array is cut where gpt_layout.h cuts it into buckets:
// ln_f, each block, the embeddings. Each bucket of `count` parameters is
// padded to a multiple of N, N x S, and rank r owns slice r of it: the
// parameters [offset + r S, offset + r S + S). The padding (fewer than N
// numbers, at the end of the last slices) is never updated and never saved.
//
// Why each bucket, and not the whole array once (which is what DeepSpeed
// does for ZeRO-1 and 2)? ZeRO-3 gathers one block at a time, and a
// collective moves equal pieces from every rank: so every block must be cut
// in N equal slices. PyTorch's FSDP does the same: each wrapped module's
// parameters form one flat array, padded to a multiple of N and cut in N.
// The stages share one cut, so a snapshot of any stage resumes in any other.
//
// A part of the model (the finale's: a pipeline stage, a tp shard, some
// experts) has a flat array of its own tensors, which gpt_layout.h's
// buckets do not describe. ZeRO-1 needs no buckets - it reduce-scatters
// the gradients and gathers the parameters once the backward pass is done -
// so a part is cut as ONE bucket, its whole array (as DeepSpeed cuts ZeRO-1
// and 2); ZeRO-2 and 3 act bucket by bucket inside a whole model's passes
// (section 4), and a part is refused them.
//
// Hybrid sharding (--replicate R; FSDP's HYBRID_SHARD, torchtitan's
// dp_replicate x dp_shard): the N ranks are R replicas of a group of N/R
// that shards - consecutive ranks, the ranks of a node - and everything
// above holds with N/R in place of N: the cut, the reduce-scatters and
// all-gathers, all inside the shard group (z->shard, whose size is
// z->world here). Rank i of every shard group owns the same slices, so the
// R replicas of a slice are averaged over the replicate group (z->replicate)
// once a step, and stay equal. The groups come from the caller (09: the
// job's dp dimension, split by groups_split; a chapter with more
// dimensions: the groups of its dp dimension).
typedef struct {
    size_t offset, count; // the bucket in the flat array
    size_t slice;         // S: parameters per rank, padding included (count <= N S < count + N)
    size_t first, owned;  // this rank's slice: its first parameter, and how many are real (0..S)
    size_t at;            // where this rank's slice starts in its shard arrays
} zero_bucket;

static inline size_t zero_slice_size(size_t count, int world) { return (count + (size_t)world - 1) / (size_t)world; }

// Real (not padding) parameters of slice `rank`.
static inline size_t zero_owned(size_t count, int world, int rank) {
    size_t s = zero_slice_size(count, world), start = (size_t)rank * s;
    return start >= count ? 0 : count - start < s ? count - start : s;
}

// ===================================================================== 2. counting

// What a rank holds, by kind. The model's own buffers are counted from the
// sizes it allocated; the chapter's go through zero_alloc.
typedef enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER, MEM_GATHERED, MEM_ACTIVATIONS, MEM_OTHER, MEM_KINDS } mem_kind;
static const char *const mem_kind_names[MEM_KINDS] = {"parameters", "gradients", "optimizer state",
                                                      "gathered buffers", "activations", "other (workspace)"};

// What a rank sends, by collective: counted from the calls it makes, at
// what a ring algorithm sends for each (NCCL's and our cpu backend's
// large-message algorithm): an all-reduce of B bytes sends 2 (N-1)/N B, a
// reduce-scatter or all-gather of B bytes in all (N-1)/N B, N being the
// group's size. The first three go over the shard group, the last over the
// replicate group (hybrid sharding: often the links between nodes).
typedef enum { COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER, COMM_REPLICAS, COMM_KINDS } comm_kind;
static const char *const comm_kind_names[COMM_KINDS] = {"all_reduce", "reduce_scatter", "all_gather", "all_reduce"};

// ===================================================================== 3. the sharded state

typedef struct zero zero_t;

// What a device does for the sharding (zero_devices.h): a table per device, as model.h's.
typedef struct {
    void (*copy)(zero_t *z, float *dst, const float *src, size_t n);
    void (*fill_zero)(zero_t *z, float *dst, size_t n);
    void (*add)(zero_t *z, float *dst, const float *src, size_t n);
    void (*finish)(zero_t *z); // the model's queued work is done: a blocking collective may read its results
    double (*sum_squares)(zero_t *z, const float *x, size_t n);
    // AdamW on this rank's slices, each gradient times grad_scale (the clipping).
    void (*adamw)(zero_t *z, float grad_scale, float lr, float beta1, float beta2, float eps, float weight_decay);
    void (*params_changed)(zero_t *z); // the full parameters were gathered (a GPU refreshes its bf16 copy)
    void (*attach)(zero_t *z);         // sets the model's bucket hook (section 4)
    float *(*model_params)(zero_t *z); // the model's full parameters and gradients (ZeRO-1, 2), on its device
    float *(*model_grads)(zero_t *z);
    size_t (*front)(zero_t *z);        // zeros the model needs in front of the embeddings' buffers
    void (*model_memory)(zero_t *z, size_t bytes[MEM_KINDS]); // what the model itself allocated, by kind
    // The bucket hook's collectives (section 4): gather bucket k's slices
    // into a buffer; make the model wait for a gathered buffer before it
    // reads it; reduce-scatter a bucket's gradients once the model has
    // computed them; make the model wait before it writes gradients into a
    // buffer that a reduce-scatter may still read.
    void (*gather)(zero_t *z, int k, int slot, float *dst);
    void (*use_gathered)(zero_t *z, int slot);
    void (*scatter)(zero_t *z, int slot, const float *grads, float *mine, size_t slice);
    void (*before_grads)(zero_t *z, int slot);
} zero_device_ops;

struct zero {
    int stage, rank, world;          // this rank's place in the shard group, and its size
    pg_t *shard, *replicate;         // the ranks that share the slices, and the replicas of this rank's slices
    int replica, replicas;           // this rank's place in the replicate group, and its size (R)
    dist_t *dist;                    // the job: its device, its barrier
    model_t *model;
    const zero_device_ops *ops;
    int num_buckets;
    zero_bucket *buckets;
    size_t shard_len;                // sum of the slices: the length of each shard array
    size_t num_params;               // of the model, without padding
    // This rank's slices, on the model's device, S per bucket (padding included, zeros):
    float *params;                   // ZeRO-3: the parameters (the only copy: fp32 master weights on a GPU)
    float *grads;                    // ZeRO-1, 2, 3: the averaged gradients
    float *adam_m, *adam_v;          // ZeRO-1, 2, 3: AdamW's moments
    int adam_step;
    float *staging;                  // ZeRO-1, 2: one padded bucket, N S, for the collectives
    float *scratch;                  // ZeRO-2, 3 with micro-batches: one slice, received before it is added
    // ZeRO-2 and 3: the buffers a bucket uses while the model computes it (section 4).
    int block_slots;                 // buffers for the blocks: 1 on the CPU, 2 on a GPU (one computes, one moves)
    float *bucket_grads[4];          // the embeddings', ln_f's, and the blocks'
    float *gathered[4];              // ZeRO-3: the same, for the gathered parameters
    int holds[4];                    // which bucket each gathered buffer holds, or is being gathered into (-1: none)
#ifdef COURSE_CUDA
    cudaEvent_t gathered_ev[4];      // recorded after the last gather into each buffer
    cudaEvent_t scattered_ev[4];     // recorded after the last reduce-scatter from each gradient buffer
    cudaEvent_t now_ev, done_ev;     // the model's stream now; the hook's `done` (zero_devices.h)
#endif
    size_t front;                    // zeros a GPU model needs in front of the embeddings (its LM head's padding)
    bool training;                   // inside a training step: keep the embeddings and ln_f gathered until backward
    bool first_micro;                // the first micro-batch of the step: the gradient shard starts from zero
    size_t mem[MEM_KINDS];           // bytes the chapter allocated, by kind
    double sent[COMM_KINDS];         // bytes sent in training steps, by collective
    long calls[COMM_KINDS];
    int steps_counted;
    size_t ddp_bytes;                // stage 0: ddp.h's count when the step began
};

static inline const char *zero_stage_name(int stage) {
    static const char *const names[4] = {"DDP (no sharding)", "ZeRO-1 (optimizer state sharded)",
                                         "ZeRO-2 (optimizer state and gradients sharded)",
                                         "ZeRO-3 / FSDP (optimizer state, gradients and parameters sharded)"};
    return names[stage];
}

// Device memory of the model's device, counted by kind.
static inline float *zero_alloc(zero_t *z, mem_kind kind, size_t floats) {
    if (floats == 0) return NULL;
    float *p = device_alloc(&z->dist->device, floats * sizeof(float));
    z->ops->fill_zero(z, p, floats);
    z->ops->finish(z); // zeros before anything else writes it (a copy from the host is not on the model's stream)
    z->mem[kind] += floats * sizeof(float);
    return p;
}

static inline void zero_count(zero_t *z, comm_kind kind, double bytes_sent) {
    if (!z->training) return; // evaluation and sampling are not training steps
    z->sent[kind] += bytes_sent;
    z->calls[kind]++;
}

// The collectives, counted. Every rank calls them with the same sizes, so
// the count is the same on every rank.
static inline void zero_all_gather(zero_t *z, const float *send, float *recv, size_t count) {
    zero_count(z, COMM_ALL_GATHER, (double)(z->world - 1) * (double)count * sizeof(float));
    pg_all_gather(z->shard, send, recv, count, DTYPE_F32);
}

static inline void zero_reduce_scatter(zero_t *z, const float *send, float *recv, size_t count) {
    zero_count(z, COMM_REDUCE_SCATTER, (double)(z->world - 1) * (double)count * sizeof(float));
    pg_reduce_scatter(z->shard, send, recv, count, DTYPE_F32, OP_AVG);
}

// Stage 0 (08's DDP) averages all gradients with all-reduces, of the bytes
// ddp.h counts as it hands them over: fp32, or what --grad_compress makes.
static inline void zero_count_all_reduce(zero_t *z, double bytes) {
    zero_count(z, COMM_ALL_REDUCE, 2.0 * (z->world - 1) / z->world * bytes);
}

static inline bool zero_is_head(const zero_t *z, int bucket) {
    return bucket == GPT_BUCKET_LN_F || bucket == gpt_bucket_embeddings(&z->model->host.cfg);
}

// Which bucket buffer bucket k uses: the embeddings 0, ln_f 1, block l 2
// (on a GPU, 2 and 3 in turn).
static inline int zero_slot(const zero_t *z, int bucket) {
    if (bucket == gpt_bucket_embeddings(&z->model->host.cfg)) return 0;
    return bucket == GPT_BUCKET_LN_F ? 1 : 2 + bucket % z->block_slots;
}

// The largest bucket of a kind (the embeddings, ln_f, a block), padded.
static inline size_t zero_slot_size(const zero_t *z, int slot) {
    size_t most = 0;
    for (int k = 0; k < z->num_buckets; k++) {
        size_t padded = z->buckets[k].slice * (size_t)z->world;
        if (zero_slot(z, k) == slot && padded > most) most = padded;
    }
    return most + (slot == 0 ? z->front : 0);
}

// This rank's slices of a full array on the host (`full`, num_params
// floats) into a shard array on the device, padding zero.
static inline void zero_scatter_host(zero_t *z, const float *full, float *shard) {
    float *host = xcalloc(z->shard_len, sizeof(float));
    for (int k = 0; k < z->num_buckets; k++)
        memcpy(host + z->buckets[k].at, full + z->buckets[k].first, z->buckets[k].owned * sizeof(float));
    device_from_host(&z->dist->device, shard, host, z->shard_len * sizeof(float));
    free(host);
}

// A part of a model (section 1): a pipeline stage, a tp shard or some experts.
static inline bool zero_is_part(const model_t *m) {
    return m->host.stage.count > 1 || gpt_tp_ways(m->host.tp) > 1 || gpt_ep_ways(m->host.cfg.ep) > 1;
}

// Cuts the model in slices, says so, and allocates this rank's state for the stage.
// The model was created keeping what the stage does not shard
// (zero_model_keeps); ZeRO-3 takes its slices of the model's initial
// parameters (the host copy), which then go. With grad_accum micro-batches
// per step, ZeRO-2 and 3 need a slice of scratch to add each one's slice.
// ops: how the model's device does it (zero_devices.h's zero_ops_for).
// shard: the group that shares the slices (all the data-parallel ranks,
// or with hybrid sharding one node's of them); replicate: the group of
// the ranks that own the same slices (one rank alone without it).
static inline void zero_setup(zero_t *z, int stage, dist_t *d, model_t *m, int grad_accum,
                              const zero_device_ops *ops, pg_t *shard, pg_t *replicate) {
    memset(z, 0, sizeof *z);
    z->stage = stage, z->dist = d, z->model = m, z->shard = shard, z->replicate = replicate;
    z->rank = pg_rank(shard), z->world = pg_world_size(shard);
    z->replica = pg_rank(replicate), z->replicas = pg_world_size(replicate);
    if (stage == 0 && z->replicas > 1) die("zero_setup: DDP (stage 0) has no slices to replicate");
    z->ops = ops;
    z->front = z->ops->front(z);
    const gpt_config *c = &m->host.cfg;
    z->num_params = m->host.num_params;
    bool part = zero_is_part(m);
    if (part && stage > 1)
        die("zero_setup: ZeRO-%d gathers and scatters a whole model's buckets during its passes; a pipeline stage, a "
            "tp shard or some experts take ZeRO-1 only", stage);
    z->num_buckets = part ? 1 : gpt_layout_buckets(c, NULL, 0);
    z->buckets = xcalloc((size_t)z->num_buckets, sizeof *z->buckets);
    for (int k = 0; k < z->num_buckets; k++) {
        gpt_bucket b = part ? (gpt_bucket){.offset = 0, .count = m->host.num_params, .name = "part"} : gpt_layout_bucket(c, k);
        zero_bucket *s = &z->buckets[k];
        s->offset = b.offset, s->count = b.count, s->slice = zero_slice_size(b.count, z->world);
        s->first = b.offset + (size_t)z->rank * s->slice, s->owned = zero_owned(b.count, z->world, z->rank);
        s->at = z->shard_len;
        z->shard_len += s->slice;
    }
    if (part)
        log_main("sharding: %s; each rank's part (stage x tp shard x experts) one bucket, in %d slices over dp%s: "
                 "%zu parameters in rank 0's slice (padding included)%s\n", zero_stage_name(stage), z->world,
                 z->replicas > 1 ? ", hybrid" : "", z->shard_len,
                 z->replicas > 1 ? ", each slice held by the replicas over the rest of dp" : "");
    else if (z->replicas == 1)
        log_main("sharding: %s; %d rank(s), each owning 1/%d of every bucket: %zu parameters a rank (padding included)\n",
                 zero_stage_name(stage), z->world, z->world, z->shard_len);
    else
        log_main("sharding: %s, hybrid: %d rank(s) = %d replicas x %d sharding (consecutive ranks), each owning 1/%d "
                 "of every bucket: %zu parameters a rank (padding included), each slice held %d times\n",
                 zero_stage_name(stage), z->world * z->replicas, z->replicas, z->world, z->world, z->shard_len,
                 z->replicas);
    for (int i = 0; i < 4; i++) z->holds[i] = -1;
    z->block_slots = m->on_gpu ? 2 : 1;
    if (stage == 0) return;
    z->grads = zero_alloc(z, MEM_GRADS, z->shard_len);
    z->adam_m = zero_alloc(z, MEM_OPTIMIZER, z->shard_len);
    z->adam_v = zero_alloc(z, MEM_OPTIMIZER, z->shard_len);
    size_t most = 0;
    for (int k = 0; k < z->num_buckets; k++) most = z->buckets[k].slice > most ? z->buckets[k].slice : most;
    if (stage < 3) z->staging = zero_alloc(z, MEM_OTHER, most * (size_t)z->world);
    if (stage >= 2) {
        if (grad_accum > 1) z->scratch = zero_alloc(z, MEM_GRADS, most);
        for (int i = 0; i < 2 + z->block_slots; i++) z->bucket_grads[i] = zero_alloc(z, MEM_GRADS, zero_slot_size(z, i));
    }
    if (stage == 3) { // the slices of the initial parameters stay; the full array goes
        z->params = zero_alloc(z, MEM_PARAMS, z->shard_len);
        zero_scatter_host(z, m->host.params, z->params);
        free(m->host.params);
        m->host.params = NULL;
        for (int i = 0; i < 2 + z->block_slots; i++) z->gathered[i] = zero_alloc(z, MEM_GATHERED, zero_slot_size(z, i));
    }
    if (stage >= 2) z->ops->attach(z);
}

// What the model keeps of the state itself: 08's model keeps everything;
// ZeRO-1 keeps AdamW's moments in slices instead, ZeRO-2 the gradients
// too, ZeRO-3 the parameters too.
static inline model_keeps zero_model_keeps(int stage) {
    model_keeps k = {.params = stage < 3, .grads = stage < 2, .adam = stage == 0};
    return k;
}

// The step is over: stage 0's all-reduces are counted (ddp.h made them),
// and the next forward passes (evaluation, sampling) are not, and do not
// keep the embeddings gathered.
static inline void zero_end_step(zero_t *z) {
    if (z->stage == 0) zero_count_all_reduce(z, (double)(ddp_bytes_reduced() - z->ddp_bytes));
    z->training = false;
    z->steps_counted++;
}

static inline void zero_free(zero_t *z) {
    const device_t *d = &z->dist->device;
    if (z->ops) z->ops->finish(z); // nothing queued still uses the buffers
    float *all[] = {z->params,          z->grads,           z->adam_m,          z->adam_v,
                    z->staging,         z->scratch,         z->bucket_grads[0], z->bucket_grads[1],
                    z->bucket_grads[2], z->bucket_grads[3], z->gathered[0],     z->gathered[1],
                    z->gathered[2],     z->gathered[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) device_free(d, all[i]);
#ifdef COURSE_CUDA
    cudaEvent_t events[] = {z->now_ev,          z->gathered_ev[0],  z->gathered_ev[1],  z->gathered_ev[2],
                            z->gathered_ev[3],  z->scattered_ev[0], z->scattered_ev[1], z->scattered_ev[2],
                            z->scattered_ev[3]};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        if (events[i]) CHECK_CUDA(cudaEventDestroy(events[i]));
#endif
    free(z->buckets);
}

// ===================================================================== 4. the bucket hook
//
// ZeRO-2 and 3 act while the model computes: the model asks, bucket by
// bucket, where the parameters and the gradients are (gpt_layout.h,
// section 3), and the hook answers with a bucket buffer: the embeddings',
// ln_f's, or a block's. On a GPU there are two for the blocks, so that the
// next block's parameters can be gathered, or the last block's gradients
// reduce-scattered, while the model computes this one (zero_devices.h); the
// device's gather, scatter and wait calls say when a buffer may be used.

// ZeRO-3: bucket k's parameters, gathered from every rank's slice into its
// buffer, unless the buffer holds them already: the embeddings and ln_f
// between the forward and the backward pass of a training step, or a block
// gathered early (prefetched).
static inline void zero_prefetch(zero_t *z, int k) {
    if (k < 0) return;
    int slot = zero_slot(z, k);
    if (z->holds[slot] == k) return;
    z->ops->gather(z, k, slot, z->gathered[slot] + (slot == 0 ? z->front : 0));
    z->holds[slot] = k;
}

static inline float *zero_gathered(zero_t *z, int k) {
    int slot = zero_slot(z, k);
    zero_prefetch(z, k);
    z->ops->use_gathered(z, slot);
    return z->gathered[slot] + (slot == 0 ? z->front : 0);
}

// The bucket whose parameters the pass needs next, for prefetching: the
// forward pass goes from the embeddings through the blocks to ln_f (bucket
// L+1, L, ..., 0), the backward pass from the last block to the first (1,
// 2, ..., L; the embeddings and ln_f are still there). -1: none.
static inline int zero_next_bucket(const zero_t *z, gpt_bucket_event event, int k) {
    int L = z->num_buckets - 2;
    if (event == GPT_FORWARD_BEGIN) return k - 1;
    if (k == L + 1) return L >= 1 ? 1 : -1;
    return k >= 1 && k < L ? k + 1 : -1;
}

// ZeRO-2 and 3: bucket k's gradients are added to zeros in a bucket
// buffer; once final, they are averaged and scattered: each rank receives
// the mean of its own slice in its gradient shard (micro-batches after the
// first are received apart and added). The buffer is then free again.
static inline float *zero_bucket_grads(zero_t *z, int k) {
    int slot = zero_slot(z, k);
    z->ops->before_grads(z, slot); // the buffer's last reduce-scatter has read it
    z->ops->fill_zero(z, z->bucket_grads[slot], zero_slot_size(z, slot));
    return z->bucket_grads[slot] + (slot == 0 ? z->front : 0);
}

static inline void zero_scatter_bucket(zero_t *z, int k) {
    const zero_bucket *b = &z->buckets[k];
    int slot = zero_slot(z, k);
    float *grads = z->bucket_grads[slot] + (slot == 0 ? z->front : 0), *mine = z->grads + b->at;
    if (z->first_micro) {
        z->ops->scatter(z, slot, grads, mine, b->slice);
        return;
    }
    z->ops->finish(z); // simple and rare: the host waits, then the slice is added
    zero_reduce_scatter(z, grads, z->scratch, b->slice);
    z->ops->add(z, mine, z->scratch, b->slice);
}

static inline void zero_on_bucket(zero_t *z, gpt_bucket_event event, int k, float **params, float **grads) {
    bool keep = z->training && zero_is_head(z, k); // used again at once by the backward pass
    bool prefetch = z->stage == 3 && z->block_slots == 2;
    switch (event) {
    case GPT_FORWARD_BEGIN:
    case GPT_BACKWARD_BEGIN:
        if (z->stage == 3) *params = zero_gathered(z, k);
        if (prefetch) zero_prefetch(z, zero_next_bucket(z, event, k));
        if (event == GPT_BACKWARD_BEGIN) *grads = zero_bucket_grads(z, k);
        break;
    case GPT_FORWARD_END:
        if (z->stage == 3 && !keep) z->holds[zero_slot(z, k)] = -1;
        break;
    case GPT_BACKWARD_END:
        zero_scatter_bucket(z, k);
        if (z->stage == 3) z->holds[zero_slot(z, k)] = -1;
        break;
    }
}

// ===================================================================== 5. the step on this rank's slices

// The training step begins: the gradient shard starts from zero (ZeRO-2
// and 3 add each micro-batch's averaged slice to it).
static inline void zero_begin_step(zero_t *z) {
    z->training = true;
    z->first_micro = true;
    z->ddp_bytes = ddp_bytes_reduced();
    if (z->stage >= 2) z->ops->fill_zero(z, z->grads, z->shard_len);
}

// ZeRO-1, after the backward pass: each bucket's gradients are averaged
// and scattered; this rank keeps the mean of its slices. The padded
// staging buffer holds the bucket and N S - count zeros after it.
static inline void zero_reduce_scatter_gradients(zero_t *z) {
    const float *grads = z->ops->model_grads(z);
    z->ops->finish(z);
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        z->ops->copy(z, z->staging, grads + b->offset, b->count);
        z->ops->fill_zero(z, z->staging + b->count, b->slice * (size_t)z->world - b->count);
        z->ops->finish(z);
        zero_reduce_scatter(z, z->staging, z->grads + b->at, b->slice);
    }
}

// AdamW on this rank's slices only - 1/N of the optimizer's work and state
// - each gradient times grad_scale (the clipping's factor): a loop on the
// CPU, one kernel launch on a GPU (zero_devices.h).
static inline void zero_adamw(zero_t *z, float grad_scale, float lr, float beta1, float beta2, float eps,
                              float weight_decay) {
    z->ops->adamw(z, grad_scale, lr, beta1, beta2, eps, weight_decay);
}

// Hybrid sharding (R replicas > 1), after the reduce-scatters: each slice
// is the mean over this rank's shard group; rank i of every shard group
// holds the same slice, so an all-reduce of the gradient shard over the
// replicate group makes it the mean over all N ranks (the mean of R means
// of N/R each). Once a step, after the micro-batches (FSDP's HYBRID_SHARD
// does it bucket by bucket, behind the backward pass): 2 (R-1)/R of B/(N/R)
// bytes per rank, and the replicas' optimizer steps stay equal.
static inline void zero_average_replicas(zero_t *z) {
    if (z->replicas == 1) return;
    z->ops->finish(z); // every reduce-scatter has arrived
    zero_count(z, COMM_REPLICAS, 2.0 * (z->replicas - 1) / z->replicas * (double)z->shard_len * sizeof(float));
    pg_all_reduce(z->replicate, z->grads, z->grads, z->shard_len, DTYPE_F32, OP_AVG);
}

// The norm of the whole averaged gradient, from the slices: each rank's
// sum of squares, added up over the shard group (its slices are the whole
// gradient; a replica's are the same again). Every rank gets the same
// number, so every rank clips its slices by the same factor. Returns that factor.
static inline float zero_clip_scale(zero_t *z, float max_norm) {
    double sum = 0;
    z->ops->finish(z); // every reduce-scatter has arrived
    for (int k = 0; k < z->num_buckets; k++)
        sum += z->ops->sum_squares(z, z->grads + z->buckets[k].at, z->buckets[k].owned);
    zero_count(z, COMM_ALL_REDUCE, 2.0 * (z->world - 1) / z->world * sizeof(double));
    groups_all_reduce_host(z->shard, &z->dist->device, &sum, 1, DTYPE_F64, OP_SUM);
    double norm = sqrt(sum);
    return max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

// ZeRO-1 and 2, after the optimizer step: every rank's updated slices are
// gathered into every rank's full parameters, bucket by bucket: this rank's
// slice goes into its place in the padded staging buffer, the all-gather
// fills the others' in place, and the real parameters go back to the model.
static inline void zero_all_gather_params(zero_t *z) {
    float *params = z->ops->model_params(z);
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        float *mine = z->staging + (size_t)z->rank * b->slice;
        z->ops->copy(z, mine, params + b->first, b->owned);
        z->ops->fill_zero(z, mine + b->owned, b->slice - b->owned);
        z->ops->finish(z);
        zero_all_gather(z, mine, z->staging, b->slice);
        z->ops->copy(z, params + b->offset, z->staging, b->count);
    }
    z->ops->params_changed(z);
}

// The whole model's parameters in the model's host copy, on every rank:
// ZeRO-3 gathers them bucket by bucket (FSDP's full state dict); the other
// stages hold them already. For saving the model and its checksum.
static inline void zero_full_params(zero_t *z) {
    model_t *m = z->model;
    if (z->stage < 3) {
        model_to_host(m);
        return;
    }
    if (!m->host.params) m->host.params = xmalloc(z->num_params * sizeof(float));
    for (int k = 0; k < z->num_buckets; k++) {
        const float *gathered = zero_gathered(z, k);
        z->ops->finish(z);
        device_to_host(&z->dist->device, m->host.params + z->buckets[k].offset, gathered,
                       z->buckets[k].count * sizeof(float));
        z->holds[zero_slot(z, k)] = -1;
    }
}

// The norms of AdamW's two moments over the whole model, on every rank
// (from the slices in ZeRO-1, 2, 3: a collective). Adam's step hardly
// changes when every gradient is scaled by the same factor; its moments
// do, so the tests compare these too.
static inline void zero_moment_norms(zero_t *z, double norms[2]) {
    gpt_t *h = &z->model->host;
    norms[0] = norms[1] = 0;
    if (z->stage == 0) {
        model_to_host(z->model);
        for (size_t i = 0; h->adam_m && i < h->num_params; i++)
            norms[0] += (double)h->adam_m[i] * h->adam_m[i], norms[1] += (double)h->adam_v[i] * h->adam_v[i];
    } else {
        z->ops->finish(z);
        for (int k = 0; k < z->num_buckets; k++) {
            norms[0] += z->ops->sum_squares(z, z->adam_m + z->buckets[k].at, z->buckets[k].owned);
            norms[1] += z->ops->sum_squares(z, z->adam_v + z->buckets[k].at, z->buckets[k].owned);
        }
        groups_all_reduce_host(z->shard, &z->dist->device, norms, 2, DTYPE_F64, OP_SUM);
    }
    norms[0] = sqrt(norms[0]), norms[1] = sqrt(norms[1]);
}

// ---------------------------------------------------------------- the state on the host (snapshots)

static inline size_t zero_owned_total(const zero_t *z) {
    size_t n = 0;
    for (int k = 0; k < z->num_buckets; k++) n += z->buckets[k].owned;
    return n;
}

// A shard array from the device (ZeRO-1, 2, 3), into host memory.
static inline float *zero_shard_to_host(zero_t *z, const float *shard) {
    float *host = xmalloc(z->shard_len * sizeof(float));
    device_to_host(&z->dist->device, host, shard, z->shard_len * sizeof(float));
    return host;
}

// This rank's slices of the state, padding left out, the buckets in order:
// out[0] the parameters, out[1] and out[2] AdamW's moments
// (zero_owned_total floats each). Returns AdamW's step count. In DDP the
// slices come from the whole state every rank holds.
static inline int zero_slices_to_host(zero_t *z, float *out[3]) {
    gpt_t *h = &z->model->host;
    z->ops->finish(z);
    model_to_host(z->model); // the whole parameters (ZeRO-1, 2), and AdamW's moments (DDP)
    float *shard[3] = {NULL, NULL, NULL};
    if (z->stage == 3) shard[0] = zero_shard_to_host(z, z->params);
    if (z->stage >= 1) shard[1] = zero_shard_to_host(z, z->adam_m), shard[2] = zero_shard_to_host(z, z->adam_v);
    const float *whole[3] = {h->params, h->adam_m, h->adam_v};
    size_t pos = 0;
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        for (int i = 0; i < 3; i++) {
            const float *from = shard[i] ? shard[i] + b->at : whole[i] ? whole[i] + b->first : NULL;
            if (from) memcpy(out[i] + pos, from, b->owned * sizeof(float));
            else memset(out[i] + pos, 0, b->owned * sizeof(float)); // no AdamW step yet
        }
        pos += b->owned;
    }
    for (int i = 0; i < 3; i++) free(shard[i]);
    return z->stage == 0 ? h->adam_step : z->adam_step;
}

// After a resume filled the model's host copy (what the stage keeps whole)
// and `slices` (shard arrays on the host, for what it keeps in slices;
// NULL where it has none): everything to its device, and the step count.
static inline void zero_slices_from_host(zero_t *z, float *slices[3], int adam_step) {
    float *shard[3] = {z->params, z->adam_m, z->adam_v};
    z->ops->finish(z);
    for (int i = 0; i < 3; i++)
        if (slices[i] && shard[i]) device_from_host(&z->dist->device, shard[i], slices[i], z->shard_len * sizeof(float));
    if (z->stage == 0) z->model->host.adam_step = adam_step;
    else z->adam_step = adam_step;
    if (z->stage < 3) model_to_device(z->model);
}

// AdamW's moments whole in the model's host copy (ZeRO-1, 2), gathered
// from every rank's slices, with the step count: for a snapshot of the
// whole model (the finale's; FSDP's full optimizer state dict).
// zero_drop_host_moments frees them again: the model keeps them in slices.
static inline void zero_moments_to_host(zero_t *z) {
    gpt_t *h = &z->model->host;
    if (!z->staging) die("zero_moments_to_host: ZeRO-%d has no staging buffer (ZeRO-1 and 2 only)", z->stage);
    if (!h->adam_m) h->adam_m = xmalloc(z->num_params * sizeof(float));
    if (!h->adam_v) h->adam_v = xmalloc(z->num_params * sizeof(float));
    float *shard[2] = {z->adam_m, z->adam_v}, *whole[2] = {h->adam_m, h->adam_v};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < z->num_buckets; k++) {
            const zero_bucket *b = &z->buckets[k];
            float *mine = z->staging + (size_t)z->rank * b->slice;
            z->ops->copy(z, mine, shard[i] + b->at, b->slice);
            z->ops->finish(z);
            zero_all_gather(z, mine, z->staging, b->slice);
            device_to_host(&z->dist->device, whole[i] + b->offset, z->staging, b->count * sizeof(float));
        }
    h->adam_step = z->adam_step;
}

static inline void zero_drop_host_moments(zero_t *z) {
    gpt_t *h = &z->model->host;
    free(h->adam_m), free(h->adam_v);
    h->adam_m = h->adam_v = NULL;
}

// The other way, after a resume from a whole snapshot put the moments in
// the model's host copy: this rank takes its slices, and the host copy goes.
static inline void zero_moments_from_host(zero_t *z) {
    gpt_t *h = &z->model->host;
    if (!h->adam_m) return; // nothing resumed: the slices start from zero
    zero_scatter_host(z, h->adam_m, z->adam_m);
    zero_scatter_host(z, h->adam_v, z->adam_v);
    z->adam_step = h->adam_step;
    zero_drop_host_moments(z);
}

#endif
