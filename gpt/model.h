// model.h - the GPT on the device the run chose: the CPU (gpt.h) or a GPU
// (gpt_cuda.h, real or emulated), behind one table of functions.
//
// The training loop (08_gpt_wikitext.c and the chapters after it) is the
// same on both: it calls model_forward, model_backward, ... and each of
// those calls the function of the model's table (model_ops). There are two
// tables, one per device, at the end of this file; model_create picks one.
// Nothing else in the loop asks which device computes.
//
// The CPU model (a gpt_t) always exists. It knows the configuration and
// the parameter layout; on a GPU run it is also the host copy of the state
// - parameters, AdamW moments and step - which snapshots, the saved model
// and the start of data parallelism read and write (model_to_host and
// model_to_device move it; the layout is the same flat array on both
// sides, so a GPU run resumes a CPU snapshot and the other way round).
//
// Precision: fp32 on the CPU; on a GPU bf16 by default (fp32 master
// weights, gradients and AdamW moments, bf16 copies of the weights and
// activations for the matrix products; gpt_cuda.h explains it) or fp32.
//
// Data parallelism (ddp.h's three rules): model_backward, given the
// process group on the last micro-batch, lets each bucket of gradients
// start its all-reduce on the GPU as soon as the backward pass has queued
// the kernels that finish it - the communication overlaps the rest of the
// backward pass, as in PyTorch's DDP; model_average_gradients waits for
// the last bucket. On the CPU the average is taken after the backward pass.
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stdbool.h>

#include "ddp.h"
#include "device.h"
#include "dist.h"
#include "gpt.h"
#include "gpt_cuda.h"

typedef struct model model_t;

// What the model keeps of the training state. 08's keeps all of it;
// chapter 09's sharded stages keep less, and the rest in slices of their
// own: the model then has no AdamW moments, no gradient array (the bucket
// hook gives it one bucket at a time), or no parameter array on the
// device (the same).
typedef struct {
    bool params, grads, adam;
} model_keeps;

// What a device's model does; every entry is required.
typedef struct {
    // Takes m->host (initialised or loaded) to the device, with room for
    // batches of up to B x T tokens.
    void (*create)(model_t *m, int B, int T);
    // The forward pass over B x T tokens. With targets, returns the mean
    // cross-entropy when `wait` (a GPU then waits for it), else -1 and the
    // loss is added to a sum that take_train_loss returns as a mean.
    float (*forward)(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, bool wait);
    float (*take_train_loss)(model_t *m);
    void (*zero_grad)(model_t *m);
    // Adds grad_scale * the gradient; with pg (last micro-batch), a GPU
    // starts averaging each bucket as soon as it is computed.
    void (*backward)(model_t *m, float grad_scale, pg_t *pg);
    void (*average_gradients)(model_t *m, pg_t *pg);
    void (*clip_grad_norm)(model_t *m, float max_norm);
    void (*adamw)(model_t *m, float lr, float beta1, float beta2, float eps, float weight_decay);
    void (*to_host)(model_t *m);   // the host copy of the state, up to date
    void (*to_device)(model_t *m); // the host copy's state onto the device
    // The logits of sequence 0, position t of the last forward pass (scratch: V floats).
    const float *(*logits)(model_t *m, int t, float *scratch);
    void (*free)(model_t *m);
} model_ops;

struct model {
    const model_ops *ops;
    gpt_t host;             // the CPU model; on a GPU run, the host copy of the state
    bool on_gpu, bf16;
    double loss_sum;        // CPU: the training losses since take_train_loss
    int loss_count;
    struct gpt_cuda *gpu;   // GPU runs: the model on the device
    pg_t *averaging;        // GPU runs, during backward: the group the buckets are averaged over
    model_keeps keeps;
};

static inline const model_ops *model_cpu_ops(void);
static inline const model_ops *model_gpu_ops(void); // NULL in a CPU-only build

static inline const char *model_precision(const model_t *m) {
    if (!m->on_gpu) return "fp32";
    return m->bf16 ? "bf16 (fp32 master weights, gradients and AdamW)" : "fp32";
}

// ---------------------------------------------------------------- the calls the training loop makes

// Mean cross-entropy of the batch; with targets NULL, logits only (-1).
// On a GPU this waits for the GPU, to read the loss.
static inline float model_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    return m->ops->forward(m, in, tg, B, T, true);
}

// The training loop's forward pass: the loss is not read at once but added
// to a sum (on the GPU, in device memory), which model_take_train_loss
// returns as a mean. A GPU step then never waits for the GPU; the loop
// reads the loss only when it prints it.
static inline void model_train_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    m->ops->forward(m, in, tg, B, T, false);
}

// The mean loss of the model_train_forward calls since the last call (0 if none).
static inline float model_take_train_loss(model_t *m) { return m->ops->take_train_loss(m); }
static inline void model_zero_grad(model_t *m) { m->ops->zero_grad(m); }

// Adds grad_scale * the gradient of the last forward pass's loss. With a
// process group of several ranks (pass it on the last micro-batch only),
// the GPU starts averaging each bucket as soon as it is computed.
static inline void model_backward(model_t *m, float grad_scale, pg_t *pg) { m->ops->backward(m, grad_scale, pg); }

// Every rank ends with the mean of all ranks' gradients (ddp.h, rule 2).
static inline void model_average_gradients(model_t *m, pg_t *pg) { m->ops->average_gradients(m, pg); }

// On a GPU only queued: the norm stays on the device (gpt_cuda_grad_norm reads it).
static inline void model_clip_grad_norm(model_t *m, float max_norm) { m->ops->clip_grad_norm(m, max_norm); }

static inline void model_adamw(model_t *m, float lr, float beta1, float beta2, float eps, float weight_decay) {
    m->ops->adamw(m, lr, beta1, beta2, eps, weight_decay);
}

// The host copy of the state, up to date (a no-op on the CPU). AdamW's
// moments exist once the first step is taken.
static inline void model_to_host(model_t *m) { m->ops->to_host(m); }

// The host copy's state onto the device (after a resume or a broadcast).
static inline void model_to_device(model_t *m) { m->ops->to_device(m); }

static inline const float *model_logits(model_t *m, int t, float *scratch) { return m->ops->logits(m, t, scratch); }

// Takes over `host` (initialised or loaded); on a GPU, copies it there and
// sizes the GPU's buffers for batches of up to B x T tokens. It keeps what
// `keeps` says of the training state (model_create: all of it).
static inline void model_create_keeping(model_t *m, gpt_t host, const device_t *d, bool bf16, int B, int T,
                                        model_keeps keeps) {
    memset(m, 0, sizeof *m);
    m->host = host;
    m->on_gpu = device_is_cuda(d) && model_gpu_ops();
    m->bf16 = m->on_gpu && bf16;
    m->keeps = keeps;
    m->ops = m->on_gpu ? model_gpu_ops() : model_cpu_ops();
    m->ops->create(m, B, T);
}

static inline void model_create(model_t *m, gpt_t host, const device_t *d, bool bf16, int B, int T) {
    model_keeps all = {true, true, true};
    model_create_keeping(m, host, d, bf16, B, T, all);
}

static inline void model_free(model_t *m) {
    m->ops->free(m);
    gpt_free(&m->host);
}

// Rule 1: every rank starts from rank 0's state (its parameters, and its
// AdamW moments when it resumed from a snapshot). The host copy travels;
// the device then takes it.
static inline void model_broadcast_state(model_t *m, dist_t *d) {
    gpt_t *h = &m->host;
    dist_broadcast_host(d, h->params, h->num_params, DTYPE_F32, 0);
    if (h->adam_step > 0) {
        dist_broadcast_host(d, h->adam_m, h->num_params, DTYPE_F32, 0);
        dist_broadcast_host(d, h->adam_v, h->num_params, DTYPE_F32, 0);
    }
    model_to_device(m);
}

// Continues tokens[0..len) up to `total` tokens, as gpt_generate does.
static inline void model_generate(model_t *m, uint16_t *tokens, int len, int total, float temperature,
                                  int top_k, rng_t *rng) {
    float *scratch = xmalloc(sizeof(float) * (size_t)m->host.cfg.vocab_size);
    for (int n = len; n < total; n++) {
        int start = n > m->host.cfg.block_size ? n - m->host.cfg.block_size : 0;
        model_forward(m, tokens + start, NULL, 1, n - start);
        const float *logits = model_logits(m, n - start - 1, scratch);
        tokens[n] = (uint16_t)gpt_sample_next(logits, m->host.cfg.vocab_size, temperature, top_k, rng);
    }
    free(scratch);
}

// ---------------------------------------------------------------- the CPU model (gpt.h)

static inline float model_cpu_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, bool wait) {
    float loss = gpt_forward(&m->host, in, tg, B, T);
    if (wait || !tg) return loss;
    m->loss_sum += loss;
    m->loss_count++;
    return -1.0f;
}

static inline float model_cpu_take_train_loss(model_t *m) {
    float mean = m->loss_count ? (float)(m->loss_sum / m->loss_count) : 0.0f;
    m->loss_sum = 0, m->loss_count = 0;
    return mean;
}

static inline void model_cpu_zero_grad(model_t *m) { gpt_zero_grad(&m->host); }

static inline void model_cpu_backward(model_t *m, float grad_scale, pg_t *pg) {
    (void)pg; // the CPU averages after the backward pass
    gpt_backward(&m->host, grad_scale);
}

static inline void model_cpu_average_gradients(model_t *m, pg_t *pg) {
    ddp_average_gradients(pg, m->host.grads, m->host.num_params);
}

static inline void model_cpu_clip_grad_norm(model_t *m, float max_norm) { gpt_clip_grad_norm(&m->host, max_norm); }

static inline void model_cpu_adamw(model_t *m, float lr, float beta1, float beta2, float eps, float weight_decay) {
    gpt_adamw_step(&m->host, lr, beta1, beta2, eps, weight_decay);
}

// Nothing to move or free: the CPU model's state is the host copy itself.
static inline void model_cpu_nothing(model_t *m) { (void)m; }
static inline void model_cpu_create(model_t *m, int B, int T) {
    (void)B, (void)T;
    if (!m->keeps.grads) { // the bucket hook gives the backward pass a bucket's gradients at a time
        free(m->host.grads);
        m->host.grads = NULL;
    }
}

static inline const float *model_cpu_logits(model_t *m, int t, float *scratch) {
    (void)scratch;
    return gpt_logits(&m->host, 0, t);
}

static inline const model_ops *model_cpu_ops(void) {
    static const model_ops ops = {model_cpu_create, model_cpu_forward, model_cpu_take_train_loss, model_cpu_zero_grad, model_cpu_backward,
                                  model_cpu_average_gradients, model_cpu_clip_grad_norm, model_cpu_adamw,
                                  model_cpu_nothing, model_cpu_nothing, model_cpu_logits, model_cpu_nothing};
    return &ops;
}

// ---------------------------------------------------------------- the GPU model (gpt_cuda.h)
//
// Only a CUDA build (real or emulated) has one; this is the only place in
// the file that asks.
#ifdef COURSE_CUDA
static inline void model_gpu_create(model_t *m, int B, int T) {
    m->gpu = gpt_cuda_create_keeping(&m->host.cfg, m->host.params, B, T, m->bf16, m->keeps.params, m->keeps.grads,
                                     m->keeps.adam);
}

static inline float model_gpu_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, bool wait) {
    gpt_cuda_forward(m->gpu, in, tg, B, T);
    return wait && tg ? gpt_cuda_loss(m->gpu) : -1.0f;
}

static inline float model_gpu_take_train_loss(model_t *m) { return gpt_cuda_take_loss(m->gpu, NULL); }
static inline void model_gpu_zero_grad(model_t *m) { gpt_cuda_zero_grad(m->gpu); }

// gpt_cuda_backward calls this as each bucket's gradients are final on the GPU.
static inline void model_bucket_ready(void *user, const gpt_bucket *bucket, cudaEvent_t ready) {
    model_t *m = user;
    ddp_average_bucket_after(m->averaging, gpt_cuda_grads_device(m->gpu) + bucket->offset, bucket->count, ready);
}

static inline void model_gpu_backward(model_t *m, float grad_scale, pg_t *pg) {
    bool overlap = pg && pg_world_size(pg) > 1;
    m->averaging = pg;
    gpt_cuda_backward(m->gpu, grad_scale, overlap ? model_bucket_ready : NULL, m);
    m->averaging = NULL;
}

static inline void model_gpu_average_gradients(model_t *m, pg_t *pg) {
    ddp_finish_gradients(pg, gpt_cuda_grads_device(m->gpu));
}

static inline void model_gpu_clip_grad_norm(model_t *m, float max_norm) { gpt_cuda_clip_grad_norm(m->gpu, max_norm); }

static inline void model_gpu_adamw(model_t *m, float lr, float beta1, float beta2, float eps, float weight_decay) {
    gpt_cuda_adamw(m->gpu, lr, beta1, beta2, eps, weight_decay);
    m->host.adam_step++; // the step count is known on the host; the moments stay on the GPU
}

// What the model keeps (model_keeps); a sharded stage moves its slices itself.
static inline void model_gpu_to_host(model_t *m) {
    if (m->keeps.params) gpt_cuda_get_params(m->gpu, m->host.params);
    if (m->host.adam_step > 0 && m->keeps.adam) {
        if (!m->host.adam_m) m->host.adam_m = xcalloc(m->host.num_params, sizeof(gpt_real));
        if (!m->host.adam_v) m->host.adam_v = xcalloc(m->host.num_params, sizeof(gpt_real));
        int step;
        gpt_cuda_get_adam(m->gpu, m->host.adam_m, m->host.adam_v, &step);
    }
}

static inline void model_gpu_to_device(model_t *m) {
    if (m->keeps.params) gpt_cuda_set_params(m->gpu, m->host.params);
    if (m->keeps.adam && m->host.adam_m && m->host.adam_v)
        gpt_cuda_set_adam(m->gpu, m->host.adam_m, m->host.adam_v, m->host.adam_step);
}

static inline const float *model_gpu_logits(model_t *m, int t, float *scratch) {
    gpt_cuda_logits(m->gpu, 0, t, scratch);
    return scratch;
}

static inline void model_gpu_free(model_t *m) { gpt_cuda_free(m->gpu); }

static inline const model_ops *model_gpu_ops(void) {
    static const model_ops ops = {model_gpu_create, model_gpu_forward, model_gpu_take_train_loss, model_gpu_zero_grad, model_gpu_backward,
                                  model_gpu_average_gradients, model_gpu_clip_grad_norm, model_gpu_adamw,
                                  model_gpu_to_host, model_gpu_to_device, model_gpu_logits, model_gpu_free};
    return &ops;
}
#else
static inline const model_ops *model_gpu_ops(void) { return NULL; }
#endif

#endif
