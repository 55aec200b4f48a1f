// ddp.h - data parallelism as PyTorch's DistributedDataParallel does it.
//
// Every rank holds a full copy (a replica) of the model. Three rules keep
// the replicas identical, step after step:
//   1. Start equal: rank 0's parameters are broadcast to everyone.
//   2. Step equal: after backward, every rank's gradients are averaged with
//      all-reduce, so every rank applies the same update. The gradients of
//      all parameters lie in one flat buffer, cut into buckets (25 MiB, as
//      DDP's default): a bucket can be sent while the next is still being
//      computed, and one huge message would need one huge staging buffer.
//      (COURSE_DDP_BUCKET_BYTES sets another size, see ddp_bucket_bytes.)
//   3. Reduce identically: the process group gives every rank the same
//      bytes, so no rank drifts by a rounding error.
// A debug check (ddp_check_replicas) proves rule 3 held: it compares a
// checksum of every rank's parameters and names the rank that diverged
// (tests/library/test_ddp.sh makes ranks drift on purpose, to see it work).
//
// How a bucket travels is DDP's communication hook (register_comm_hook):
// fp32 as computed, or bf16_compress_hook's or fp16_compress_hook's half
// the bytes (--grad_compress, ddp_compress_t below).
#ifndef COURSE_DDP_H
#define COURSE_DDP_H

#include <stdint.h>
#include <string.h>

#include "check.h"
#include "device.h"
#include "pg.h"

#define DDP_BUCKET_BYTES (25u << 20)

// The hook: --grad_compress none (all-reduce the fp32 gradients), bf16
// (PyTorch's bf16_compress_hook: round each bucket to bfloat16, all-reduce
// half the bytes, widen the average back to fp32) or fp16 (its
// fp16_compress_hook, the same with IEEE half). bf16 keeps fp32's range
// (8 exponent bits) but 8 bits of mantissa instead of 24: each gradient is
// off by up to 1 part in 256 before the sum, and each partial sum is rounded
// again, so the update is not quite the fp32 one. fp16 keeps 11 bits, 8
// times finer, but only 5 exponent bits: a gradient below 6e-8 becomes 0 and
// one above 65504 becomes inf (fp16 training's loss scale lifts the small
// ones; see gpt/gpt_cuda.h). Whether the loss notices is measured, not
// assumed: chapter 08's README shows the curves. The replicas stay identical
// either way: every rank widens the same 16-bit bytes.
// DDP_COMPRESS_POWERSGD (chapter 08) needs the tensors' shapes: the model
// does it (gpt/model.h, common/powersgd.h).
typedef enum { DDP_COMPRESS_NONE, DDP_COMPRESS_BF16, DDP_COMPRESS_FP16, DDP_COMPRESS_POWERSGD } ddp_compress_t;

static inline ddp_compress_t ddp_compress_from_name(const char *name) {
    if (!strcmp(name, "none")) return DDP_COMPRESS_NONE;
    if (!strcmp(name, "bf16")) return DDP_COMPRESS_BF16;
    if (!strcmp(name, "fp16")) return DDP_COMPRESS_FP16;
    if (!strcmp(name, "powersgd")) return DDP_COMPRESS_POWERSGD;
    die("unknown gradient compression '%s' (none, bf16, fp16 or powersgd)", name);
}

// What the buckets travel as: its name for the log, its process-group type.
static inline const char *ddp_wire_name(ddp_compress_t how) {
    return how == DDP_COMPRESS_BF16 ? "bf16" : how == DDP_COMPRESS_FP16 ? "fp16" : how == DDP_COMPRESS_POWERSGD ? "powersgd" : "fp32";
}
static inline dtype_t ddp_wire_dtype(ddp_compress_t how) {
    return how == DDP_COMPRESS_BF16 ? DTYPE_BF16 : how == DDP_COMPRESS_FP16 ? DTYPE_F16 : DTYPE_F32;
}

// The samples each rank trains on per step: batch_size, or its share of a
// global batch that stays the same on any number of ranks (the chapters'
// --global_batch_size, for elastic jobs whose world size changes).
static inline int ddp_batch_per_rank(int batch_size, int global_batch_size, int world_size) {
    if (!global_batch_size) return batch_size;
    if (global_batch_size % world_size != 0)
        die("--global_batch_size %d is not a multiple of the %d ranks of this attempt: choose "
            "one that every world size the job may have divides", global_batch_size, world_size);
    return global_batch_size / world_size;
}

// The payload bytes this process's gradient averages have handed to
// all-reduce so far: counted where the calls are made, so that a run can
// print what --grad_compress saved. (One count per program: each program
// of the course is one file.)
static inline size_t *ddp_bytes_counter(void) {
    static size_t bytes;
    return &bytes;
}
static inline size_t ddp_bytes_reduced(void) { return *ddp_bytes_counter(); }

// Everyone starts from rank 0's parameters.
static inline void ddp_broadcast_parameters(pg_t *pg, float *params, size_t count) {
    pg_broadcast(pg, params, count, DTYPE_F32, 0);
}

// The bucket size: DDP_BUCKET_BYTES, or COURSE_DDP_BUCKET_BYTES when set
// (PyTorch's bucket_cap_mb). The tests set a few bytes, so that even a small
// model is averaged in many buckets and a bucket that is skipped shows.
static inline size_t ddp_bucket_bytes(void) {
    const char *text = getenv("COURSE_DDP_BUCKET_BYTES");
    if (!text || !text[0]) return DDP_BUCKET_BYTES;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end || errno || v < sizeof(float) || v > (1ull << 40))
        die("COURSE_DDP_BUCKET_BYTES must be a number of bytes from 4 to 2^40, got '%s'", text);
    return (size_t)v;
}

// grads <- mean over ranks of grads, one bucket of bucket_bytes at a time
// (the last bucket holds what is left). With one rank there is nothing to
// average, and no communication happens at all.
static inline void ddp_average_gradients_in_buckets(pg_t *pg, float *grads, size_t count,
                                                    size_t bucket_bytes) {
    if (pg_world_size(pg) == 1) return;
    size_t bucket = bucket_bytes / sizeof(float);
    if (bucket == 0) bucket = 1;
    for (size_t first = 0; first < count; first += bucket) {
        size_t n = count - first < bucket ? count - first : bucket;
        pg_all_reduce(pg, grads + first, grads + first, n, DTYPE_F32, OP_AVG);
        *ddp_bytes_counter() += n * sizeof(float);
    }
}

// The 16-bit hooks: round, average in the same buckets, widen. wire is
// DTYPE_BF16 or DTYPE_F16. The average cannot overflow fp16 on the way:
// NCCL's average multiplies each rank's part by 1/W before adding, the cpu
// backend adds in fp32. (The mpi backend adds fp16 to fp16, in our own MPI
// op, then divides: there a sum past 65504 would become inf.) grads may lie
// on the process group's GPU: then the rounding is done on the host, through
// copies (fine for chapters 04-07's few parameters; chapter 08's GPU model
// rounds on the GPU, ddp_average_16bit_bucket_after).
static inline void ddp_average_gradients_16bit(pg_t *pg, float *grads, size_t count, size_t bucket_bytes,
                                               dtype_t wire_type) {
    const device_t *device = &pg->device;
    bool on_gpu = device_is_cuda(device);
    float *host = on_gpu ? xmalloc(count * sizeof(float)) : grads;
    uint16_t *half = xmalloc(count * sizeof(uint16_t));
    if (on_gpu) device_to_host(device, host, grads, count * sizeof(float));
    for (size_t i = 0; i < count; i++) half[i] = f32_to_float16(wire_type, host[i]);   // round to nearest even
    uint16_t *wire = on_gpu ? device_alloc(device, count * sizeof(uint16_t)) : half;
    if (on_gpu) device_from_host(device, wire, half, count * sizeof(uint16_t));
    size_t bucket = bucket_bytes / sizeof(float);   // the same gradients per bucket as in fp32
    if (bucket == 0) bucket = 1;
    for (size_t first = 0; first < count; first += bucket) {
        size_t n = count - first < bucket ? count - first : bucket;
        pg_all_reduce(pg, wire + first, wire + first, n, wire_type, OP_AVG);
        *ddp_bytes_counter() += n * sizeof(uint16_t);
    }
    if (on_gpu) device_to_host(device, half, wire, count * sizeof(uint16_t));
    for (size_t i = 0; i < count; i++) host[i] = float16_to_f32(wire_type, half[i]);   // widen: exact
    if (on_gpu) {
        device_from_host(device, grads, host, count * sizeof(float));
        device_free(device, wire);
        free(host);
    }
    free(half);
}

// grads <- mean over ranks of grads, sent as `how` says.
static inline void ddp_average_gradients_with(pg_t *pg, float *grads, size_t count, ddp_compress_t how) {
    if (pg_world_size(pg) == 1) return;
    if (how == DDP_COMPRESS_POWERSGD) die("PowerSGD needs the shapes of the tensors: the model does it (gpt/model.h)");
    if (how == DDP_COMPRESS_NONE) ddp_average_gradients_in_buckets(pg, grads, count, ddp_bucket_bytes());
    else ddp_average_gradients_16bit(pg, grads, count, ddp_bucket_bytes(), ddp_wire_dtype(how));
}

static inline void ddp_average_gradients(pg_t *pg, float *grads, size_t count) {
    ddp_average_gradients_with(pg, grads, count, DDP_COMPRESS_NONE);
}

#ifdef COURSE_CUDA
// Rule 2 on a GPU, overlapped with the backward pass: the model calls this
// for each bucket of gradients once the kernels that finish it are queued
// (`ready` is recorded after them), so bucket i is all-reduced on the
// process group's stream while the GPU computes bucket i+1 - what
// PyTorch's DDP does with its autograd hooks. ddp_finish_gradients waits
// for the last bucket.
static inline void ddp_average_bucket_after(pg_t *pg, float *grads, size_t count, cudaEvent_t ready) {
    if (pg_world_size(pg) == 1) return;
    pg_all_reduce_after(pg, grads, count, DTYPE_F32, OP_AVG, ready);
    *ddp_bytes_counter() += count * sizeof(float);
}

// A 16-bit hook on a GPU: the model has rounded the bucket into `wire` (of
// wire_type) by the time `ready` happens; the average replaces it there,
// and the model widens it back into its fp32 gradients after
// ddp_finish_gradients.
static inline void ddp_average_16bit_bucket_after(pg_t *pg, uint16_t *wire, size_t count, dtype_t wire_type,
                                                  cudaEvent_t ready) {
    if (pg_world_size(pg) == 1) return;
    pg_all_reduce_after(pg, wire, count, wire_type, OP_AVG, ready);
    *ddp_bytes_counter() += count * sizeof(uint16_t);
}

// grads: the buffer the buckets are averaged in; final when this returns.
static inline void ddp_finish_gradients(pg_t *pg, float *grads) {
    (void)grads; // named for the reader: nothing is done to it here
    if (pg_world_size(pg) == 1) return;
    pg_wait_queued(pg);
}
#endif

// FNV-1a over the bytes: equal bytes, equal checksum; one flipped bit, a different one.
static inline uint64_t checksum_bytes(const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// Stops the job if any rank's parameters differ from rank 0's, naming the
// ranks. `params` may live on the GPU; it is copied to the host to hash.
static inline void ddp_check_replicas(pg_t *pg, const device_t *device, const float *params,
                                      size_t count, long step) {
    float *host = xmalloc(count * sizeof(float));
    device_to_host(device, host, params, count * sizeof(float));
    int world = pg_world_size(pg);
    int64_t mine = (int64_t)checksum_bytes(host, count * sizeof(float));
    free(host);
    // All-gather needs its buffers on the pg's device, so stage the hashes there.
    int64_t *sums_host = xmalloc(sizeof(int64_t) * (size_t)world);
    int64_t *mine_dev = device_alloc(device, sizeof(int64_t));
    int64_t *sums_dev = device_alloc(device, sizeof(int64_t) * (size_t)world);
    device_from_host(device, mine_dev, &mine, sizeof mine);
    pg_all_gather(pg, mine_dev, sums_dev, 1, DTYPE_I64);
    device_to_host(device, sums_host, sums_dev, sizeof(int64_t) * (size_t)world);
    device_free(device, mine_dev);
    device_free(device, sums_dev);
    char diverged[256] = "";
    size_t used = 0;
    for (int r = 1; r < world; r++)
        if (sums_host[r] != sums_host[0] && used < sizeof diverged - 16)
            used += (size_t)snprintf(diverged + used, sizeof diverged - used, "%s%d", used ? ", " : "", r);
    free(sums_host);
    if (used)
        die("replicas diverged at step %ld: the parameters of rank(s) %s differ from rank 0's "
            "(a rank skipped an all-reduce or computed differently)", step, diverged);
}

#endif
