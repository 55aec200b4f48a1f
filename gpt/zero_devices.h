// zero_devices.h - how the CPU and a GPU do what zero.h asks: copies,
// sums, AdamW on the slices, and the bucket hook's collectives. One table
// of functions per device, as ../gpt/model.h has (zero.h, section 3,
// declares it; zero_ops_for picks one for zero_setup).
#ifndef ZERO_DEVICES_H
#define ZERO_DEVICES_H

#include "zero.h"

// --- the CPU: plain loops; every call has finished when it returns.
static inline void zero_cpu_copy(zero_t *z, float *dst, const float *src, size_t n) {
    (void)z;
    if (n) memmove(dst, src, n * sizeof(float));
}
static inline void zero_cpu_fill_zero(zero_t *z, float *dst, size_t n) {
    (void)z;
    if (n) memset(dst, 0, n * sizeof(float));
}
static inline void zero_cpu_add(zero_t *z, float *dst, const float *src, size_t n) {
    (void)z;
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
static inline void zero_cpu_finish(zero_t *z) { (void)z; }
static inline double zero_cpu_sum_squares(zero_t *z, const float *x, size_t n) {
    (void)z;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

// gpt.h's AdamW on each slice: the parameters are the model's flat array
// (ZeRO-1, 2) or the parameter shard (ZeRO-3); the gradients and moments
// are the shard's. Clipping first scales the gradient slices, as
// gpt_clip_grad_norm scales the whole gradient.
static inline void zero_cpu_adamw(zero_t *z, float grad_scale, float lr, float beta1, float beta2, float eps,
                                  float weight_decay) {
    const gpt_t *h = &z->model->host;
    z->adam_step++;
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        float *g = z->grads + b->at, *p = z->stage == 3 ? z->params + b->at : h->params + b->first;
        if (grad_scale != 1.0f)
            for (size_t i = 0; i < b->owned; i++) g[i] *= grad_scale;
        gpt_adamw_range(h->tensors, h->num_tensors, b->first, b->owned, p, g, z->adam_m + b->at, z->adam_v + b->at,
                        z->adam_step, lr, beta1, beta2, eps, weight_decay);
    }
}

static inline void zero_cpu_params_changed(zero_t *z) { (void)z; }

static inline void zero_cpu_hook(void *user, gpt_bucket_event event, int bucket, gpt_real **params, gpt_real **grads) {
    zero_on_bucket(user, event, bucket, params, grads);
}

static inline void zero_cpu_attach(zero_t *z) {
    z->model->host.hook = zero_cpu_hook;
    z->model->host.hook_user = z;
}

static inline float *zero_cpu_model_params(zero_t *z) { return z->model->host.params; }
static inline float *zero_cpu_model_grads(zero_t *z) { return z->model->host.grads; }
static inline size_t zero_cpu_front(zero_t *z) { (void)z; return 0; }

// The CPU model's arrays, from the sizes it allocated them with.
static inline void zero_cpu_model_memory(zero_t *z, size_t bytes[MEM_KINDS]) {
    const gpt_t *h = &z->model->host;
    size_t p = h->num_params * sizeof(gpt_real);
    bytes[MEM_PARAMS] += h->params ? p : 0;
    bytes[MEM_GRADS] += h->grads ? p : 0;
    bytes[MEM_OPTIMIZER] += (h->adam_m ? p : 0) + (h->adam_v ? p : 0);
    bytes[MEM_ACTIVATIONS] += (h->acts_capacity + h->grads_capacity) * sizeof(gpt_real);
}

// The collectives of the bucket hook, blocking: when they return, the
// buffer is filled or read.
static inline void zero_cpu_gather(zero_t *z, int k, int slot, float *dst) {
    (void)slot;
    zero_all_gather(z, z->params + z->buckets[k].at, dst, z->buckets[k].slice);
}
static inline void zero_cpu_scatter(zero_t *z, int slot, const float *grads, float *mine, size_t slice) {
    (void)slot;
    zero_reduce_scatter(z, grads, mine, slice);
}
static inline void zero_cpu_nothing(zero_t *z, int slot) { (void)z, (void)slot; }

static inline const zero_device_ops *zero_cpu_ops(void) {
    static const zero_device_ops ops = {zero_cpu_copy,          zero_cpu_fill_zero,      zero_cpu_add,
                                        zero_cpu_finish,        zero_cpu_sum_squares,    zero_cpu_adamw,
                                        zero_cpu_params_changed, zero_cpu_attach,        zero_cpu_model_params,
                                        zero_cpu_model_grads,   zero_cpu_front,          zero_cpu_model_memory,
                                        zero_cpu_gather,        zero_cpu_nothing,        zero_cpu_scatter,
                                        zero_cpu_nothing};
    return &ops;
}

#ifdef COURSE_CUDA
// --- a GPU: the model's stream (gpt_cuda_stream) runs the copies and the
// kernels in order. The collectives of the training step (ZeRO-1's, the
// optimizer's) are blocking calls of pg.h: before one reads what the model
// computed, or writes what it may still read, the host waits for that
// stream and for the collectives queued before (finish). The bucket hook's
// collectives are queued instead, as 08's DDP queues its all-reduces: a
// block's gradients are reduce-scattered behind the event that says they
// are computed, while the model computes the next block, and ZeRO-3
// gathers the next block's parameters while the model computes this one
// (FSDP's forward and backward prefetch). Events tie the two streams: the
// model waits for a gathered buffer before it reads it, and for a
// reduce-scatter to have read a gradient buffer before it writes it again.
// With NCCL the queued collectives run on the group's stream; the cpu
// backend runs them at once (pg.h), and the same events keep the order.
static inline cudaStream_t zero_stream(zero_t *z) { return gpt_cuda_stream(z->model->gpu); }

static inline void zero_gpu_copy(zero_t *z, float *dst, const float *src, size_t n) {
    if (n) CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, zero_stream(z)));
}
static inline void zero_gpu_fill_zero(zero_t *z, float *dst, size_t n) {
    if (n) CHECK_CUDA(cudaMemsetAsync(dst, 0, n * sizeof(float), zero_stream(z)));
}
static inline void zero_gpu_add(zero_t *z, float *dst, const float *src, size_t n) {
    gpt_cuda_add(z->model->gpu, dst, src, n);
}
static inline void zero_gpu_finish(zero_t *z) {
    CHECK_CUDA(cudaStreamSynchronize(zero_stream(z)));
    pg_wait_queued(z->shard);
}
static inline double zero_gpu_sum_squares(zero_t *z, const float *x, size_t n) {
    return gpt_cuda_sum_squares(z->model->gpu, x, n);
}

// One launch for every slice: the model's kernel with a table of slices.
static inline void zero_gpu_adamw(zero_t *z, float grad_scale, float lr, float beta1, float beta2, float eps,
                                  float weight_decay) {
    gpt_cuda_slice *slices = xcalloc((size_t)z->num_buckets, sizeof *slices);
    float *params = z->stage == 3 ? z->params : gpt_cuda_params_device(z->model->gpu);
    for (int k = 0; k < z->num_buckets; k++) {
        const zero_bucket *b = &z->buckets[k];
        slices[k] = (gpt_cuda_slice){b->first, b->owned, z->stage == 3 ? params + b->at : params + b->first,
                                     z->grads + b->at, z->adam_m + b->at, z->adam_v + b->at};
    }
    gpt_cuda_adamw_slices(z->model->gpu, slices, z->num_buckets, ++z->adam_step, grad_scale, lr, beta1, beta2, eps,
                          weight_decay);
    free(slices);
}

static inline void zero_gpu_params_changed(zero_t *z) { gpt_cuda_params_changed(z->model->gpu); }

static inline void zero_gpu_hook(void *user, gpt_bucket_event event, int bucket, float **params, float **grads,
                                 cudaEvent_t done) {
    zero_t *z = user;
    z->done_ev = done; // the reduce-scatter of BACKWARD_END waits for it
    zero_on_bucket(z, event, bucket, params, grads);
}

static inline void zero_gpu_attach(zero_t *z) {
    cudaEvent_t *all[] = {&z->now_ev, &z->gathered_ev[0], &z->gathered_ev[1], &z->gathered_ev[2], &z->gathered_ev[3],
                          &z->scattered_ev[0], &z->scattered_ev[1], &z->scattered_ev[2], &z->scattered_ev[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_CUDA(cudaEventCreateWithFlags(all[i], cudaEventDisableTiming));
    gpt_cuda_set_bucket_hook(z->model->gpu, zero_gpu_hook, z);
}

// Queued behind everything the model has queued so far: the last reader
// of the buffer, and the optimizer step that wrote the slices.
static inline void zero_gpu_gather(zero_t *z, int k, int slot, float *dst) {
    const zero_bucket *b = &z->buckets[k];
    zero_count(z, COMM_ALL_GATHER, (double)(z->world - 1) * (double)b->slice * sizeof(float));
    CHECK_CUDA(cudaEventRecord(z->now_ev, zero_stream(z)));
    pg_all_gather_after(z->shard, z->params + b->at, dst, b->slice, DTYPE_F32, z->now_ev, z->gathered_ev[slot]);
}

static inline void zero_gpu_use_gathered(zero_t *z, int slot) {
    CHECK_CUDA(cudaStreamWaitEvent(zero_stream(z), z->gathered_ev[slot], 0));
}

static inline void zero_gpu_scatter(zero_t *z, int slot, const float *grads, float *mine, size_t slice) {
    zero_count(z, COMM_REDUCE_SCATTER, (double)(z->world - 1) * (double)slice * sizeof(float));
    pg_reduce_scatter_after(z->shard, grads, mine, slice, DTYPE_F32, OP_AVG, z->done_ev, z->scattered_ev[slot]);
}

static inline void zero_gpu_before_grads(zero_t *z, int slot) {
    CHECK_CUDA(cudaStreamWaitEvent(zero_stream(z), z->scattered_ev[slot], 0));
}
static inline float *zero_gpu_model_params(zero_t *z) { return gpt_cuda_params_device(z->model->gpu); }
static inline float *zero_gpu_model_grads(zero_t *z) { return gpt_cuda_grads_device(z->model->gpu); }
static inline size_t zero_gpu_front(zero_t *z) {
    return gpt_cuda_bucket_front(z->model->gpu, gpt_bucket_embeddings(&z->model->host.cfg));
}

static inline void zero_gpu_model_memory(zero_t *z, size_t bytes[MEM_KINDS]) {
    size_t parts[6];
    gpt_cuda_memory_parts(z->model->gpu, parts);
    bytes[MEM_PARAMS] += parts[0], bytes[MEM_GRADS] += parts[1], bytes[MEM_OPTIMIZER] += parts[2];
    bytes[MEM_ACTIVATIONS] += parts[3], bytes[MEM_OTHER] += parts[4], bytes[MEM_GATHERED] += parts[5];
}

static inline const zero_device_ops *zero_gpu_ops(void) {
    static const zero_device_ops ops = {zero_gpu_copy,           zero_gpu_fill_zero, zero_gpu_add,
                                        zero_gpu_finish,         zero_gpu_sum_squares, zero_gpu_adamw,
                                        zero_gpu_params_changed, zero_gpu_attach,    zero_gpu_model_params,
                                        zero_gpu_model_grads,    zero_gpu_front,     zero_gpu_model_memory,
                                        zero_gpu_gather,         zero_gpu_use_gathered, zero_gpu_scatter,
                                        zero_gpu_before_grads};
    return &ops;
}
#else
static inline const zero_device_ops *zero_gpu_ops(void) { return NULL; }
#endif

// The table for the device the model computes on.
static inline const zero_device_ops *zero_ops_for(const model_t *m) {
    return m->on_gpu ? zero_gpu_ops() : zero_cpu_ops();
}

#endif
