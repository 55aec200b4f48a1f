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
// activations for the matrix products; gpt_cuda.h explains it), fp16 (the
// same, with a loss scale: for GPUs without bf16) or fp32.
//
// Data parallelism (ddp.h's three rules): model_backward, given the
// process group on the last micro-batch, lets each bucket of gradients
// start its all-reduce on the GPU as soon as the backward pass has queued
// the kernels that finish it - the communication overlaps the rest of the
// backward pass, as in PyTorch's DDP; model_average_gradients waits for
// the last bucket. On the CPU the average is taken after the backward pass.
// PowerSGD (--grad_compress powersgd, model_use_powersgd) sends each
// matrix as two thin ones, on the host (a GPU's gradients go there and back).
// grad_compress (ddp.h's hook, --grad_compress) sends the buckets as bf16 or fp16:
// on a GPU each is rounded there before its all-reduce, and the average is
// widened back once the last one has arrived.
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stdbool.h>
#include <string.h>

#include "ddp.h"
#include "powersgd.h"
#include "device.h"
#include "dist.h"
#include "gpt.h"
#include "gpt_cuda.h"
#include "groups.h"

typedef struct model model_t;

// What the model keeps of the training state. 08's keeps all of it;
// chapter 09's sharded stages keep less, and the rest in slices of their
// own: the model then has no AdamW moments, no gradient array (the bucket
// hook gives it one bucket at a time), or no parameter array on the
// device (the same).
typedef struct {
    bool params, grads, adam;
} model_keeps;

// The buffers neighbouring stages of a pipeline exchange (model_stage_buffer).
typedef enum { STAGE_INPUT, STAGE_OUTPUT, STAGE_GRAD } model_stage_buffer_t;

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
    // A pipeline stage (chapter 11): the model is m->host.stage's part.
    void (*use_slot)(model_t *m, int k);
    size_t (*slot_bytes)(model_t *m);
    void *(*stage_buffer)(model_t *m, model_stage_buffer_t which, int B, int T);
    void (*wait)(model_t *m);                              // for the work queued so far
    float *(*grads)(model_t *m);                           // the gradients, in the device's memory
    double *(*grad_square_sum)(model_t *m, size_t from, bool replicated); // in the device's memory
    void (*clip_grads)(model_t *m, float max_norm);        // by the square sum there
} model_ops;

struct model {
    const model_ops *ops;
    gpt_t host;             // the CPU model; on a GPU run, the host copy of the state
    bool on_gpu;
    gpt_precision precision; // always GPT_FP32 on the CPU
    double loss_sum;        // CPU: the training losses since take_train_loss
    int loss_count;
    struct gpt_cuda *gpu;   // GPU runs: the model on the device
    pg_t *averaging;        // GPU runs, during backward: the group the buckets are averaged over
    bool overlapped;        // GPU runs: the last backward started averaging its buckets
    ddp_compress_t grad_compress; // how the buckets travel (ddp.h); NONE unless the chapter sets it
    powersgd_t *powersgd;   // DDP_COMPRESS_POWERSGD: its state (model_use_powersgd)
    double square_sum;      // CPU: a pipeline stage's sum of squared gradients
    pg_t *tp_group;         // tensor parallelism (chapter 10): the ranks the blocks are split over
    pg_t *ep_group;         // expert parallelism (chapter 13): the ranks the experts are spread over
    pg_t *expert_replicas;  // and the ranks that hold the same experts (model_expert_parallel)
    double tp_bytes;        // what the blocks all-reduced over tp_group so far: bytes
    double tp_numbers;      // and numbers
    double grads_all_reduced; // bytes model_all_reduce_grads handed to all-reduces so far (11's two copies of wte)
    model_keeps keeps;      // chapter 09: what of the training state the model itself holds
    const device_t *device; // where it computes (the job's device)
    pg_t *cp_group;         // context parallelism (chapter 12): the ranks each sequence is split over
    bool cp_split;          // GPU runs: the last forward pass was split over them
};

static inline const model_ops *model_cpu_ops(void);
static inline const model_ops *model_gpu_ops(void); // NULL in a CPU-only build

static inline const char *model_precision(const model_t *m) {
    if (m->precision == GPT_BF16) return "bf16 (fp32 master weights, gradients and AdamW)";
    if (m->precision == GPT_FP16) return "fp16 (fp32 master weights, gradients and AdamW; dynamic loss scale)";
    return "fp32";
}

// ---------------------------------------------------------------- the calls the training loop makes

// Mean cross-entropy of the batch; with targets NULL, logits only (-1).
// On a GPU this waits for the GPU, to read the loss.
static inline float model_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    m->host.train_pass = false; // evaluation: a mixture of experts routes every token
    return m->ops->forward(m, in, tg, B, T, true);
}

// The training loop's forward pass: the loss is not read at once but added
// to a sum (on the GPU, in device memory), which model_take_train_loss
// returns as a mean. A GPU step then never waits for the GPU; the loop
// reads the loss only when it prints it.
static inline void model_train_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T) {
    m->host.train_pass = true; // a mixture of experts: capacity and the balancing loss (gpt/moe.h)
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
// On a GPU, the buckets the last backward pass started are waited for; if
// it started none (a pipeline stage's: chapter 11), they are averaged now.
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

// What --precision (auto, fp32, bf16, fp16) means on device d: a GPU trains
// in bf16 unless asked otherwise; the CPU always in fp32, and says so rather
// than quietly ignore a half precision it was asked for.
static inline gpt_precision model_precision_for(const char *asked, const device_t *d) {
    bool gpu = device_is_cuda(d), auto_or_fp32 = !strcmp(asked, "auto") || !strcmp(asked, "fp32");
    if (!gpu && !auto_or_fp32)
        die("--precision %s needs a GPU, and this run computes on the CPU (in fp32): use --precision fp32 or auto",
            asked);
    if (!gpu || !strcmp(asked, "fp32")) return GPT_FP32;
    return !strcmp(asked, "fp16") ? GPT_FP16 : GPT_BF16;
}

// Takes over `host` (initialised or loaded); on a GPU, copies it there and
// sizes the GPU's buffers for batches of up to B x T tokens. It keeps what
// `keeps` says of the training state (model_create: all of it).
static inline void model_create_keeping(model_t *m, gpt_t host, const device_t *d, gpt_precision precision, int B, int T,
                                        model_keeps keeps) {
    // Sharding (chapter 09) slices the state of a whole model over the
    // data-parallel ranks; of a pipeline stage or a tensor-parallel shard
    // (chapters 10, 11) only AdamW's moments (ZeRO-1: the finale, 14), since
    // ZeRO-2 and 3 act on a whole model's buckets during its passes.
    if (!(keeps.params && keeps.grads) && (host.stage.count > 1 || gpt_tp_ways(host.tp) > 1))
        die("a model sharded beyond ZeRO-1 (chapter 09) cannot also be a pipeline stage (%d stages) or a "
            "tensor-parallel shard (tp %d): shard whole models only", host.stage.count, gpt_tp_ways(host.tp));
    memset(m, 0, sizeof *m);
    m->host = host;
    m->on_gpu = device_is_cuda(d) && model_gpu_ops();
    m->precision = m->on_gpu ? precision : GPT_FP32;
    m->keeps = keeps;
    m->device = d;
    m->ops = m->on_gpu ? model_gpu_ops() : model_cpu_ops();
    m->ops->create(m, B, T);
}

static inline void model_create(model_t *m, gpt_t host, const device_t *d, gpt_precision precision, int B, int T) {
    model_keeps all = {true, true, true};
    model_create_keeping(m, host, d, precision, B, T, all);
}

static inline void model_free(model_t *m) {
    if (m->powersgd) powersgd_free(m->powersgd), free(m->powersgd);
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

// ---------------------------------------------------------------- a pipeline stage (chapter 11)
//
// model_create with a host model that is one stage of a pipeline
// (gpt_init_stage) makes the device's model of that stage. Forward takes
// input tokens on the first stage only and targets on the last only;
// backward takes no process group (the gradients are averaged after the
// whole pipeline has run, with model_all_reduce_grads).

// Slot k keeps one micro-batch's activations from its forward pass to its
// backward pass: forward writes, backward reads the slot in use.
static inline void model_use_slot(model_t *m, int k) { m->ops->use_slot(m, k); }

// Bytes of activation slots allocated: the micro-batches held at once.
static inline size_t model_slot_bytes(model_t *m) { return m->ops->slot_bytes(m); }

// Where the previous stage's output is received (STAGE_INPUT, for a batch
// of B x T, before forward), this stage's output (STAGE_OUTPUT, after
// forward), and the gradient of the residual stream (STAGE_GRAD: received
// from the next stage before backward, sent to the previous one after).
// B x T x n_embd numbers of model_stage_dtype each, in the device's memory.
static inline void *model_stage_buffer(model_t *m, model_stage_buffer_t which, int B, int T) {
    return m->ops->stage_buffer(m, which, B, T);
}
static inline dtype_t model_stage_dtype(const model_t *m) { return m->precision == GPT_BF16 ? DTYPE_BF16 : DTYPE_F32; }

// Returns when the device has done what was queued: before a process group
// reads what the model wrote (a GPU model computes on a stream of its own),
// and to time it.
static inline void model_wait(model_t *m) { m->ops->wait(m); }

// Gradients [first, first + count) of the stage <- op over the ranks of pg.
static inline void model_all_reduce_grads(model_t *m, pg_t *pg, size_t first, size_t count, redop_t op) {
    if (pg_world_size(pg) == 1) return;
    float *g = m->ops->grads(m) + first;
    m->ops->wait(m);
    pg_all_reduce(pg, g, g, count, DTYPE_F32, op);
    m->grads_all_reduced += (double)count * sizeof(float);
}

// Clipping by the norm of all stages' gradients together: each stage adds
// the squares of its gradients [from, ...) - from skips a copy that
// another stage counts - the stages of pg add up their sums, and each
// stage clips with the total. A stage split over tensor-parallel ranks
// first adds up its shards' squares over them, the replicated tensors'
// counted once (by tp rank 0).
static inline void model_clip_grad_norm_over(model_t *m, pg_t *pg, size_t from, float max_norm) {
    bool replicated = !m->tp_group || pg_rank(m->tp_group) == 0;
    double *sum = m->ops->grad_square_sum(m, from, replicated);
    m->ops->wait(m);
    if (m->tp_group && pg_world_size(m->tp_group) > 1) pg_all_reduce(m->tp_group, sum, sum, 1, DTYPE_F64, OP_SUM);
    if (pg_world_size(pg) > 1) pg_all_reduce(pg, sum, sum, 1, DTYPE_F64, OP_SUM);
    m->ops->clip_grads(m, max_norm);
}

// ---------------------------------------------------------------- tensor parallelism (chapter 10)
//
// A model whose host copy is one rank's shard of each block (gpt_init_shard:
// m->host.tp > 1) computes its blocks with the other ranks of `tp`: the
// model calls back here for each sum over them (gpt.h, section 9; the
// paper's f and g), and here they become a blocking pg_all_reduce on the
// tp group. On a GPU the callback first waits for the model's stream, since
// the partial sums are computed there: while the numbers travel, the GPU
// waits (gpt_cuda.cu, section 9, says what that costs and what Megatron does
// about it). The gradient norm of clipping adds up over the group too.
static inline void model_tp_count(model_t *m, size_t count, dtype_t t) {
    m->tp_bytes += (double)count * (double)dtype_size(t);
    m->tp_numbers += (double)count;
}

static inline void model_tp_sum_cpu(void *user, gpt_real *buf, size_t count) {
    model_t *m = user;
    pg_all_reduce(m->tp_group, buf, buf, count, DTYPE_F32, OP_SUM);
    model_tp_count(m, count, DTYPE_F32);
}

static inline void model_tp_sum_norm(void *user, double *value) {
    model_t *m = user;
    pg_all_reduce(m->tp_group, value, value, 1, DTYPE_F64, OP_SUM);
}

// The GPU's side of these (the GPU section below; in a CPU-only build no
// model is on a GPU, and they are never called).
static inline void model_gpu_tensor_parallel(model_t *m);
static inline void model_gpu_tp_agree(model_t *m);
static inline void model_gpu_grads_to_host(model_t *m);
static inline size_t model_gpu_allocated_bytes(const model_t *m);

// The model is a shard (m->host.tp ranks) and `tp` is the group of its
// ranks, in the order of their shards (shard r: rank r of the group).
static inline void model_tensor_parallel(model_t *m, pg_t *tp) {
    if (gpt_tp_ways(m->host.tp) != pg_world_size(tp))
        die("the model is split over %d ranks but the tp group has %d", gpt_tp_ways(m->host.tp), pg_world_size(tp));
    m->tp_group = tp;
    m->host.tp_all_reduce = model_tp_sum_cpu, m->host.tp_user = m;
    if (m->on_gpu) model_gpu_tensor_parallel(m);
}

// ---------------------------------------------------------------- expert parallelism (chapter 13)
//
// A model whose host copy holds E/ep experts of each block
// (gpt_init_expert_shard: m->host.cfg.ep > 1) sends its tokens to the
// experts over the ep group: the model calls back here for the counts
// (pg_all_to_all) and the rows (pg_all_to_all_v), blocking calls on the
// group. `expert_replicas`: the ranks that hold the same experts (the dp
// group), over which their gradients are averaged (model_average_gradients).
static inline void model_ep_counts(void *user, const int *send, int *recv, int per_peer) {
    model_t *m = user;
    pg_all_to_all(m->ep_group, send, recv, (size_t)per_peer, DTYPE_I32);
}

static inline void model_ep_rows(void *user, const gpt_real *send, const size_t *send_counts, gpt_real *recv,
                                 const size_t *recv_counts) {
    model_t *m = user;
    pg_all_to_all_v(m->ep_group, send, send_counts, recv, recv_counts, DTYPE_F32);
}

static inline void model_gpu_expert_parallel(model_t *m); // the GPU section: the same exchanges on device buffers

static inline void model_expert_parallel(model_t *m, pg_t *ep, pg_t *expert_replicas) {
    if (gpt_ep_ways(m->host.cfg.ep) != pg_world_size(ep))
        die("the model's experts are spread over %d ranks but the ep group has %d", gpt_ep_ways(m->host.cfg.ep),
            pg_world_size(ep));
    m->ep_group = ep, m->expert_replicas = expert_replicas;
    m->host.ep_all_to_all = model_ep_counts, m->host.ep_all_to_all_v = model_ep_rows, m->host.ep_user = m;
    if (m->on_gpu && pg_world_size(ep) > 1) model_gpu_expert_parallel(m);
}

// The gradients of an expert-parallel model, averaged. The dense tensors
// (attention, LayerNorms, router, embeddings) are the same weights on every
// rank, and each rank's gradient is the mean over its own tokens: their
// mean over all the ranks of `all` (dp x ep) is the gradient of the mean
// over every token, as in chapter 08. An expert lives on ep-th of the
// ranks: its gradient on each already ADDS the gradients of the tokens
// that every rank of its ep group sent it (each with that rank's 1/tokens),
// so its replicas (the dp group) add theirs, and the sum is divided by the
// same number as the dense ones - the ranks of `all` - not by dp: that is
// the gradient of the mean over every token too (Megatron-LM scales its
// expert gradients by the full data-parallel size for the same reason).
// Averaging an expert over `all` would mix other experts' gradients into it.
static inline void model_average_experts(model_t *m, pg_t *all) {
    gpt_t *h = &m->host;
    size_t dense = 0, expert = 0;
    for (int t = 0; t < h->num_tensors; t++) *(gpt_tensor_is_expert(h, t) ? &expert : &dense) += h->tensors[t].count;
    gpt_real *buf[2] = {xmalloc(sizeof(gpt_real) * (dense + 1)), xmalloc(sizeof(gpt_real) * (expert + 1))};
    size_t at[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) { // 0: pack, 1: unpack
        if (pass == 1) {
            ddp_average_gradients_with(all, buf[0], dense, m->grad_compress);
            if (pg_world_size(m->expert_replicas) > 1)
                pg_all_reduce(m->expert_replicas, buf[1], buf[1], expert, DTYPE_F32, OP_SUM);
            for (size_t i = 0; i < expert; i++) buf[1][i] /= (gpt_real)pg_world_size(all);
            at[0] = at[1] = 0;
        }
        for (int t = 0; t < h->num_tensors; t++) {
            int k = gpt_tensor_is_expert(h, t);
            gpt_real *g = h->grads + h->tensors[t].offset, *b = buf[k] + at[k];
            memcpy(pass ? g : b, pass ? b : g, sizeof(gpt_real) * h->tensors[t].count);
            at[k] += h->tensors[t].count;
        }
    }
    free(buf[0]), free(buf[1]);
}

// Clipping by the whole model's norm: the dense gradients are the same on
// every rank of the ep group (counted once), each expert's on one of them
// (added up over the group).
static inline void model_clip_experts(model_t *m, float max_norm) {
    gpt_t *h = &m->host;
    double sums[2] = {0, 0};
    for (int t = 0; t < h->num_tensors; t++) {
        double sum = 0;
        const gpt_real *g = h->grads + h->tensors[t].offset;
        for (size_t i = 0; i < h->tensors[t].count; i++) sum += (double)g[i] * g[i];
        sums[gpt_tensor_is_expert(h, t)] += sum;
    }
    pg_all_reduce(m->ep_group, &sums[1], &sums[1], 1, DTYPE_F64, OP_SUM);
    gpt_clip_grads(h, sums[0] + sums[1], max_norm);
}

// The replicated tensors' gradients, the same bytes on every rank of the
// tp group. Every rank computes them from the same numbers, and the CPU
// model adds in a fixed order: they are equal already, and this does
// nothing (chapter 10's check_replicas proves it). A GPU adds some of them
// with atomics (gpt_cuda.cu, column_add; the embeddings' backward), in an
// order that varies from run to run and from GPU to GPU: their last bits
// can differ between the ranks, and the copies of a replicated tensor
// would drift apart step by step. So on a GPU every rank takes tp rank
// 0's: one broadcast per run of adjacent replicated tensors, (V+T)C + 6LC
// + 2C numbers per step in all. Call it once the gradients are final.
static inline void model_tp_agree(model_t *m) {
    if (m->tp_group && m->on_gpu && pg_world_size(m->tp_group) > 1) model_gpu_tp_agree(m);
}

// ---------------------------------------------------------------- context parallelism (chapter 12)
//
// A model that computes its rank's tokens of each sequence (gpt/context_parallel.h
// on the CPU, gpt/gpt_cuda_cp.cuh on a GPU) asks the cp group for
// attention's messages through these: the ring's sends and receives
// (started together, waited for after the block's arithmetic), the
// all-to-alls of ulysses, the loss's sum and a row of logits for
// sampling. The CPU model's messages are host buffers; the GPU model's
// are device buffers (the model_cp_device_ callbacks), and the host numbers
// (the loss, a row of logits) travel through the device's memory.
typedef struct {
    pg_request_t *send, *recv;
} model_cp_pending;

static inline void *model_cp_ring_start(void *user, const gpt_real *send, size_t send_count, gpt_real *recv,
                                        size_t recv_count) {
    model_t *m = user;
    pg_t *cp = m->cp_group;
    int n = pg_world_size(cp), next = (pg_rank(cp) + 1) % n, prev = (pg_rank(cp) + n - 1) % n;
    model_cp_pending *p = xcalloc(1, sizeof *p);
    if (recv_count) p->recv = pg_irecv(cp, recv, recv_count, DTYPE_F32, prev);
    if (send_count) p->send = pg_isend(cp, send, send_count, DTYPE_F32, next);
    return p;
}

static inline void model_cp_ring_finish(void *user, void *pending) {
    (void)user;
    model_cp_pending *p = pending;
    if (p->send) pg_wait(p->send);
    if (p->recv) pg_wait(p->recv);
    free(p);
}

static inline void model_cp_all_to_all_v(void *user, const gpt_real *send, const size_t *send_counts, gpt_real *recv,
                                         const size_t *recv_counts) {
    model_t *m = user;
    pg_all_to_all_v(m->cp_group, send, send_counts, recv, recv_counts, DTYPE_F32);
}

// The loss's sums and a row of logits are host numbers: through the
// device's memory, as every group takes them (common/groups.h).
static inline void model_cp_sum(void *user, double *values, int count) {
    model_t *m = user;
    groups_all_reduce_host(m->cp_group, m->device, values, (size_t)count, DTYPE_F64, OP_SUM);
}

static inline void model_cp_broadcast(void *user, gpt_real *buf, size_t count, int root) {
    model_t *m = user;
#ifdef COURSE_CUDA
    if (m->on_gpu) {
        groups_broadcast_host(m->cp_group, m->device, buf, count, DTYPE_F32, root);
        return;
    }
#endif
    pg_broadcast(m->cp_group, buf, count, DTYPE_F32, root); // the CPU's group takes host buffers
}

// The GPU model's messages (gpt_cuda.h's gpt_cuda_cp_comm): device buffers.
static inline dtype_t model_cp_dtype(int type) {
    return type == 1 ? DTYPE_BF16 : type == 2 ? DTYPE_F64 : type == 3 ? DTYPE_F16 : DTYPE_F32; // gpt_cuda_type's order
}

static inline void *model_cp_device_ring_start(void *user, const void *send, size_t send_count, void *recv,
                                               size_t recv_count, int type) {
    model_t *m = user;
    pg_t *cp = m->cp_group;
    int n = pg_world_size(cp), next = (pg_rank(cp) + 1) % n, prev = (pg_rank(cp) + n - 1) % n;
    model_cp_pending *p = xcalloc(1, sizeof *p);
    if (recv_count) p->recv = pg_irecv(cp, recv, recv_count, model_cp_dtype(type), prev);
    if (send_count) p->send = pg_isend(cp, send, send_count, model_cp_dtype(type), next);
    return p;
}

static inline void model_cp_device_all_to_all_v(void *user, const void *send, const size_t *send_counts, void *recv,
                                                const size_t *recv_counts, int type) {
    model_t *m = user;
    pg_all_to_all_v(m->cp_group, send, send_counts, recv, recv_counts, model_cp_dtype(type));
}

static inline void model_gpu_context_parallel(model_t *m, bool ulysses);

// The model computes rank pg_rank(cp)'s tokens of each sequence; its
// attention is `kind` ("ring" or "ulysses"), its tokens chosen by
// `balance` ("zigzag" or "none"). Every weight stays whole on every rank.
static inline void model_context_parallel(model_t *m, pg_t *cp, const char *kind, const char *balance) {
    if (pg_world_size(cp) == 1) return; // one rank: the model of chapter 08, untouched
    if (m->on_gpu && (gpt_tp_ways(m->host.tp) > 1 || m->host.stage.count > 1))
        die("context parallelism with tensor or pipeline parallelism on GPUs is not written (the finale, chapter 14, "
            "composes them on CPU ranks)");
    m->cp_group = cp;
    cp_comm comm = {m, model_cp_ring_start, model_cp_ring_finish, model_cp_all_to_all_v, model_cp_sum,
                    model_cp_broadcast};
    m->host.cp = cp_create(pg_world_size(cp), pg_rank(cp), m->host.cfg.n_head / gpt_tp_ways(m->host.tp), strcmp(kind, "ulysses") ? CP_RING : CP_ULYSSES,
                           strcmp(balance, "none") ? CP_ZIGZAG : CP_CONTIGUOUS, comm);
    // On a GPU the host model only chooses the tokens and keeps their
    // positions; the GPU model computes (gpt_cuda_cp.cuh).
    if (m->on_gpu) model_gpu_context_parallel(m, m->host.cp->kind == CP_ULYSSES);
}

// The gradients of the last backward pass (and averaging), in m->host.grads.
static inline const gpt_real *model_grads_to_host(model_t *m) {
    if (m->on_gpu) model_gpu_grads_to_host(m);
    return m->host.grads;
}

// What the model holds besides its training state, in *bytes, and what
// that is: on the CPU the buffers of the activations and of their
// gradients; on a GPU everything the model allocated there.
static inline const char *model_activation_bytes(const model_t *m, size_t *bytes) {
    if (m->on_gpu) {
        *bytes = model_gpu_allocated_bytes(m);
        return "every buffer: state, activations, logits, scratch; measured by the model as it allocated them";
    }
    *bytes = (m->host.acts_capacity + m->host.grads_capacity) * sizeof(gpt_real);
    return "measured: the model's buffers for a batch";
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

// PowerSGD's matrices are the model's 2-D tensors (rows x cols, row-major
// as gpt_layout.h keeps them); the vectors go as they are. min_rate is
// PyTorch's min_compression_rate (2; COURSE_POWERSGD_MIN_RATE overrides it).
static inline void model_use_powersgd(model_t *m, int rank) {
    const gpt_t *h = &m->host;
    powersgd_tensor *t = xmalloc(sizeof *t * (size_t)h->num_tensors);
    for (int i = 0; i < h->num_tensors; i++) {
        const gpt_tensor *g = &h->tensors[i];
        bool matrix = g->ndim == 2 && g->count; // count 0: a tensor a pipeline stage does not hold (chapter 11)
        t[i] = (powersgd_tensor){g->offset, matrix ? g->shape[0] : (int)g->count, matrix ? g->shape[1] : 1};
    }
    const char *rate = getenv("COURSE_POWERSGD_MIN_RATE");
    m->grad_compress = DDP_COMPRESS_POWERSGD;
    m->powersgd = xmalloc(sizeof *m->powersgd);
    powersgd_init(m->powersgd, t, h->num_tensors, rank, rate && *rate ? atof(rate) : 2.0);
    free(t);
}

// How the gradients travel (--grad_compress, DDP's communication hook):
// fp32, rounded to bf16 or fp16 for half the bytes, or each matrix as two
// thin ones of rank powersgd_rank.
static inline void model_use_grad_compress(model_t *m, const char *name, int powersgd_rank) {
    m->grad_compress = ddp_compress_from_name(name);
    if (m->grad_compress != DDP_COMPRESS_POWERSGD) return;
    if (m->precision == GPT_FP16)
        die("--grad_compress powersgd with --precision fp16: a step that overflows would leave inf in "
            "PowerSGD's error feedback for good; use --precision bf16 or fp32");
    model_use_powersgd(m, powersgd_rank);
}

static inline void model_cpu_average_gradients(model_t *m, pg_t *pg) {
    if (m->ep_group && pg_world_size(m->ep_group) > 1) model_average_experts(m, pg); // chapter 13
    else if (m->powersgd && pg && pg_world_size(pg) > 1) powersgd_average(m->powersgd, pg, m->host.grads);
    else ddp_average_gradients_with(pg, m->host.grads, m->host.num_params, m->grad_compress);
}

static inline void model_tp_sum_norm(void *user, double *value);

static inline void model_cpu_clip_grad_norm(model_t *m, float max_norm) {
    if (m->tp_group) gpt_clip_grad_norm_tp(&m->host, max_norm, model_tp_sum_norm, m);
    else if (m->ep_group && pg_world_size(m->ep_group) > 1) model_clip_experts(m, max_norm);
    else gpt_clip_grad_norm(&m->host, max_norm);
}

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

static inline void model_cpu_use_slot(model_t *m, int k) { gpt_use_slot(&m->host, k); }
static inline size_t model_cpu_slot_bytes(model_t *m) { return gpt_slot_bytes(&m->host); }

static inline void *model_cpu_stage_buffer(model_t *m, model_stage_buffer_t which, int B, int T) {
    if (which == STAGE_INPUT) return gpt_stage_input(&m->host, B, T);
    return which == STAGE_OUTPUT ? gpt_stage_output(&m->host) : gpt_stage_grad(&m->host);
}

static inline float *model_cpu_grads(model_t *m) { return m->host.grads; }

static inline double *model_cpu_grad_square_sum(model_t *m, size_t from, bool replicated) {
    m->square_sum = gpt_grad_square_sum(&m->host, from, replicated);
    return &m->square_sum;
}

static inline void model_cpu_clip_grads(model_t *m, float max_norm) { gpt_clip_grads(&m->host, m->square_sum, max_norm); }

static inline const model_ops *model_cpu_ops(void) {
    static const model_ops ops = {model_cpu_create, model_cpu_forward, model_cpu_take_train_loss, model_cpu_zero_grad, model_cpu_backward,
                                  model_cpu_average_gradients, model_cpu_clip_grad_norm, model_cpu_adamw,
                                  model_cpu_nothing, model_cpu_nothing, model_cpu_logits, model_cpu_nothing,
                                  model_cpu_use_slot, model_cpu_slot_bytes, model_cpu_stage_buffer,
                                  model_cpu_nothing, model_cpu_grads, model_cpu_grad_square_sum, model_cpu_clip_grads};
    return &ops;
}

// ---------------------------------------------------------------- the GPU model (gpt_cuda.h)
//
// Only a CUDA build (real or emulated) has one; this is the only place in
// the file that asks.
#ifdef COURSE_CUDA
static inline void model_gpu_create(model_t *m, int B, int T) {
    if (m->keeps.params && m->keeps.grads && m->keeps.adam) {
        m->gpu = gpt_cuda_create_stage(&m->host.cfg, &m->host.stage, gpt_tp_ways(m->host.tp), m->host.params, B, T, m->precision);
        return;
    }
    m->gpu = gpt_cuda_create_keeping(&m->host.cfg, m->host.params, B, T, m->precision, m->keeps.params, m->keeps.grads,
                                     m->keeps.adam);
}

// Context parallelism (chapter 12): the host model chooses this rank's
// tokens (cp_take_tokens) and the GPU model computes them, given every
// rank's positions. A pass whose sequences the split does not divide
// (evaluation's last short piece, sampling) is computed whole on every
// rank, as one GPU would: it needs no message.
static inline float model_gpu_cp_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, bool wait) {
    gpt_cp *cp = m->host.cp;
    int n = cp->ways, split = cp->balance == CP_ZIGZAG ? 2 * n : n;
    m->cp_split = T % split == 0;
    if (!m->cp_split) {
        gpt_cuda_cp_layout(m->gpu, 0, NULL);
        gpt_cuda_forward(m->gpu, in, tg, B, T);
        return wait && tg ? gpt_cuda_loss(m->gpu) : -1.0f;
    }
    int *segs = xcalloc((size_t)n * 4, sizeof(int));
    for (int r = 0; r < n; r++) {
        cp_segment seg[2] = {{0, 0}, {0, 0}};
        cp_segments(T, n, r, cp->balance, seg);
        segs[4 * r] = seg[0].first, segs[4 * r + 1] = seg[0].count, segs[4 * r + 2] = seg[1].first;
        segs[4 * r + 3] = seg[1].count;
    }
    int mine = cp_take_tokens(cp, in, tg, B, T);
    gpt_cuda_cp_layout(m->gpu, T, segs);
    free(segs);
    gpt_cuda_forward(m->gpu, cp->inputs, tg ? cp->targets : NULL, B, mine);
    return wait && tg ? cp_mean_loss(cp, gpt_cuda_loss(m->gpu), (size_t)B * mine) : -1.0f;
}

// What an expert-parallel GPU model's exchanges passed since the last
// call, added to the host copy's traffic counters (gpt/moe.h's gpt_moe_stats).
static inline void model_gpu_moe_traffic(model_t *m) {
    gpt_moe_stats *s = &gpt_moe_state(&m->host)->stats;
    double sent[2], exchanges[2];
    gpt_cuda_moe_take_traffic(m->gpu, sent, exchanges);
    for (int i = 0; i < 2; i++) s->sent[i] += sent[i], s->exchanges[i] += exchanges[i];
}

// A mixture of experts' training pass on the GPU adds what it routed to
// the host copy's tables (gpt/moe.h's gpt_moe_stats), as the CPU's does.
static inline void model_gpu_moe_stats(model_t *m, int B, int T) {
    const gpt_config *c = &m->host.cfg;
    gpt_moe_stats *s = &gpt_moe_state(&m->host)->stats;
    model_gpu_moe_traffic(m);
    int *routed = xmalloc(sizeof(int) * (size_t)c->n_expert);
    for (int l = m->host.stage.first; l < m->host.stage.last; l++) {
        float aux = 0;
        int dropped = gpt_cuda_moe_counts(m->gpu, l, routed, &aux);
        for (int e = 0; e < c->n_expert; e++) s->routed[(size_t)l * c->n_expert + e] += routed[e];
        s->dropped[l] += dropped, s->assignments += (double)B * T * c->top_k, s->aux_sum += aux;
    }
    s->passes++;
    free(routed);
}

static inline float model_gpu_forward(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, bool wait) {
    gpt_cuda_set_train_pass(m->gpu, m->host.train_pass); // a mixture of experts: capacity and the balancing loss
    if (m->host.cp) return model_gpu_cp_forward(m, in, tg, B, T, wait);
    gpt_cuda_forward(m->gpu, in, tg, B, T);
    if (m->host.cfg.n_expert && m->host.train_pass) model_gpu_moe_stats(m, B, T);
    return wait && tg ? gpt_cuda_loss(m->gpu) : -1.0f;
}

// With cp, each rank's mean over its tokens (the same number of them),
// averaged over the group.
static inline float model_gpu_take_train_loss(model_t *m) {
    double loss = gpt_cuda_take_loss(m->gpu, NULL);
    if (!m->host.cp) return (float)loss;
    m->host.cp->comm.sum(m, &loss, 1);
    return (float)(loss / m->host.cp->ways);
}
static inline void model_gpu_zero_grad(model_t *m) { gpt_cuda_zero_grad(m->gpu); }

// gpt_cuda_backward calls this as each bucket's gradients are final on the GPU.
static inline void model_bucket_ready(void *user, const gpt_bucket *bucket, cudaEvent_t ready) {
    model_t *m = user;
    if (m->grad_compress != DDP_COMPRESS_NONE) {   // rounded on the GPU, then sent
        bool fp16 = m->grad_compress == DDP_COMPRESS_FP16;
        gpt_cuda_round_grads(m->gpu, bucket->offset, bucket->count, fp16, ready);
        ddp_average_16bit_bucket_after(m->averaging, gpt_cuda_grads_16bit(m->gpu) + bucket->offset, bucket->count,
                                       ddp_wire_dtype(m->grad_compress), ready);
        return;
    }
    ddp_average_bucket_after(m->averaging, gpt_cuda_grads_device(m->gpu) + bucket->offset, bucket->count, ready);
}

static inline void model_gpu_backward(model_t *m, float grad_scale, pg_t *pg) {
    // (With cp, attention's backward pass sends and waits between the
    // buckets: they are averaged after it.)
    // (With ep, a bucket - a block - holds dense and expert gradients,
    // averaged over different groups: model_gpu_average_experts, after it.)
    bool experts = m->ep_group && pg_world_size(m->ep_group) > 1;
    bool overlap = pg && pg_world_size(pg) > 1 && !m->powersgd && !m->host.cp && !experts;
    m->averaging = pg;
    gpt_cuda_backward(m->gpu, grad_scale, overlap ? model_bucket_ready : NULL, m);
    m->averaging = NULL;
    m->overlapped = overlap;
    if (experts) model_gpu_moe_traffic(m);
}

// model_average_experts on the device: each run of adjacent dense tensors
// averaged over `all` (dp x ep), each run of expert tensors summed over
// their replicas (dp) and divided by the ranks of `all` - the CPU's rule,
// without packing: about two collectives per block.
static inline void model_gpu_average_experts(model_t *m, pg_t *all) {
    const gpt_t *h = &m->host;
    float *grads = gpt_cuda_grads_device(m->gpu);
    m->ops->wait(m); // the backward pass has computed them
    for (int t = 0; t < h->num_tensors;) {
        bool expert = gpt_tensor_is_expert(h, t);
        size_t first = h->tensors[t].offset, count = 0;
        for (; t < h->num_tensors && gpt_tensor_is_expert(h, t) == expert; t++) count += h->tensors[t].count;
        if (!expert) {
            ddp_average_gradients_with(all, grads + first, count, m->grad_compress);
            continue;
        }
        if (pg_world_size(m->expert_replicas) > 1)
            pg_all_reduce(m->expert_replicas, grads + first, grads + first, count, DTYPE_F32, OP_SUM);
        gpt_cuda_scale(m->gpu, grads + first, count, 1.0f / (float)pg_world_size(all));
    }
}

static inline void model_gpu_average_gradients(model_t *m, pg_t *pg) {
    if (m->ep_group && pg_world_size(m->ep_group) > 1) { // chapter 13
        model_gpu_average_experts(m, pg);
        return;
    }
    if (m->powersgd && pg && pg_world_size(pg) > 1) { // on the host: there and back
        gpt_cuda_get_grads(m->gpu, m->host.grads);
        powersgd_average(m->powersgd, pg, m->host.grads);
        gpt_cuda_set_grads(m->gpu, m->host.grads);
        return;
    }
    if (!m->overlapped && pg && pg_world_size(pg) > 1) { // no bucket started (see model_average_gradients)
        m->ops->wait(m);
        ddp_average_gradients_with(pg, gpt_cuda_grads_device(m->gpu), m->host.num_params, m->grad_compress);
        return;
    }
    ddp_finish_gradients(pg, gpt_cuda_grads_device(m->gpu));
    bool compressed = m->grad_compress != DDP_COMPRESS_NONE && pg && pg_world_size(pg) > 1;
    if (compressed) gpt_cuda_widen_grads(m->gpu, m->grad_compress == DDP_COMPRESS_FP16); // the averages into fp32
}

static inline void model_gpu_clip_grad_norm(model_t *m, float max_norm) {
    if (m->tp_group) gpt_cuda_clip_grad_norm_tp(m->gpu, max_norm);
    else if (m->ep_group && pg_world_size(m->ep_group) > 1) gpt_cuda_clip_grad_norm_ep(m->gpu, max_norm);
    else gpt_cuda_clip_grad_norm(m->gpu, max_norm);
}

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
    if (m->host.cp && m->cp_split) { // position t is one rank's: it sends the row to the others
        gpt_cp *cp = m->host.cp;
        int owner = 0, local = 0;
        for (int r = 0; r < cp->ways; r++) {
            cp_segment seg[2] = {{0, 0}, {0, 0}};
            int k = cp_segments(cp->whole, cp->ways, r, cp->balance, seg), before = 0;
            for (int s = 0; s < k; s++) {
                if (t >= seg[s].first && t < seg[s].first + seg[s].count) owner = r, local = before + t - seg[s].first;
                before += seg[s].count;
            }
        }
        if (owner == cp->rank) gpt_cuda_logits(m->gpu, 0, local, scratch);
        groups_broadcast_host(m->cp_group, m->device, scratch, (size_t)m->host.cfg.vocab_size, DTYPE_F32, owner);
        return scratch;
    }
    gpt_cuda_logits(m->gpu, 0, t, scratch);
    return scratch;
}

static inline void model_gpu_free(model_t *m) { gpt_cuda_free(m->gpu); }

static inline void model_gpu_use_slot(model_t *m, int k) { gpt_cuda_use_slot(m->gpu, k); }
static inline size_t model_gpu_slot_bytes(model_t *m) { return gpt_cuda_slot_bytes(m->gpu); }

static inline void *model_gpu_stage_buffer(model_t *m, model_stage_buffer_t which, int B, int T) {
    if (which == STAGE_INPUT) return gpt_cuda_stage_input(m->gpu, B, T);
    return which == STAGE_OUTPUT ? gpt_cuda_stage_output(m->gpu) : gpt_cuda_stage_grad(m->gpu);
}

static inline void model_gpu_wait(model_t *m) { CHECK_CUDA(cudaStreamSynchronize(gpt_cuda_stream(m->gpu))); }
static inline float *model_gpu_grads(model_t *m) { return gpt_cuda_grads_device(m->gpu); }
static inline double *model_gpu_grad_square_sum(model_t *m, size_t from, bool replicated) {
    return gpt_cuda_grad_square_sum(m->gpu, from, replicated);
}
static inline void model_gpu_clip_grads(model_t *m, float max_norm) { gpt_cuda_clip_grads(m->gpu, max_norm); }

static inline const model_ops *model_gpu_ops(void) {
    static const model_ops ops = {model_gpu_create, model_gpu_forward, model_gpu_take_train_loss, model_gpu_zero_grad, model_gpu_backward,
                                  model_gpu_average_gradients, model_gpu_clip_grad_norm, model_gpu_adamw,
                                  model_gpu_to_host, model_gpu_to_device, model_gpu_logits, model_gpu_free,
                                  model_gpu_use_slot, model_gpu_slot_bytes, model_gpu_stage_buffer,
                                  model_gpu_wait, model_gpu_grads, model_gpu_grad_square_sum, model_gpu_clip_grads};
    return &ops;
}

// The whole step as one CUDA graph launch (gpt_cuda_graph_step): a GPU
// model, one process, no gradient accumulation. Not in the table: the CPU
// has no graphs, and the caller (08's train) decides when it applies.
static inline void model_graph_step(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, float max_norm,
                                    float lr, float beta1, float beta2, float eps, float weight_decay) {
    gpt_cuda_graph_step(m->gpu, in, tg, B, T, max_norm, lr, beta1, beta2, eps, weight_decay);
    m->host.adam_step++;
}

// Tensor parallelism on a GPU: the blocks' sums over the tp group, after
// the model's stream has computed the partial sums.
static inline void model_tp_sum_gpu(void *user, void *buf, size_t count, gpt_cuda_type type, cudaStream_t stream) {
    model_t *m = user;
    dtype_t t = type == GPT_CUDA_BF16 ? DTYPE_BF16 : type == GPT_CUDA_F64 ? DTYPE_F64 : DTYPE_F32;
    CHECK_CUDA(cudaStreamSynchronize(stream)); // the partial sums are on the GPU now
    pg_all_reduce(m->tp_group, buf, buf, count, t, OP_SUM);
    if (type != GPT_CUDA_F64) model_tp_count(m, count, t); // the gradient norm's one double is not counted
}

static inline void model_gpu_tensor_parallel(model_t *m) { gpt_cuda_set_tp_all_reduce(m->gpu, model_tp_sum_gpu, m); }

// Expert parallelism on a GPU: model_ep_counts and model_ep_rows on device
// buffers (the model has waited for its stream), and the clipping norm's
// sum over the ep group.
static inline void model_ep_counts_gpu(void *user, const int *send, int *recv, int per_peer) {
    model_t *m = user;
    pg_all_to_all(m->ep_group, send, recv, (size_t)per_peer, DTYPE_I32);
}
static inline void model_ep_rows_gpu(void *user, const void *send, const size_t *send_counts, void *recv,
                                     const size_t *recv_counts, gpt_cuda_type type) {
    model_t *m = user;
    pg_all_to_all_v(m->ep_group, send, send_counts, recv, recv_counts, model_cp_dtype((int)type));
}
static inline void model_ep_sum_gpu(void *user, void *buf, size_t count, gpt_cuda_type type, cudaStream_t stream) {
    model_t *m = user;
    CHECK_CUDA(cudaStreamSynchronize(stream)); // the partial sums are on the GPU now
    pg_all_reduce(m->ep_group, buf, buf, count, model_cp_dtype((int)type), OP_SUM);
}
static inline void model_gpu_expert_parallel(model_t *m) {
    gpt_cuda_ep_comm comm = {m, model_ep_counts_gpu, model_ep_rows_gpu, model_ep_sum_gpu};
    gpt_cuda_expert_parallel(m->gpu, comm);
}

static inline void *model_cp_gpu_ring_start(void *user, const void *send, size_t send_count, void *recv,
                                            size_t recv_count, gpt_cuda_type type) {
    return model_cp_device_ring_start(user, send, send_count, recv, recv_count, (int)type);
}
static inline void model_cp_gpu_all_to_all_v(void *user, const void *send, const size_t *send_counts, void *recv,
                                             const size_t *recv_counts, gpt_cuda_type type) {
    model_cp_device_all_to_all_v(user, send, send_counts, recv, recv_counts, (int)type);
}
static inline void model_gpu_context_parallel(model_t *m, bool ulysses) {
    gpt_cuda_cp_comm comm = {m, model_cp_gpu_ring_start, model_cp_ring_finish, model_cp_gpu_all_to_all_v};
    gpt_cuda_context_parallel(m->gpu, pg_world_size(m->cp_group), pg_rank(m->cp_group), ulysses, comm);
}

// What attention sent (numbers, forward and backward) and computed (score pairs) so far.
static inline void model_gpu_cp_counts(const model_t *m, double counts[3]) { gpt_cuda_cp_counts(m->gpu, counts); }

// fp16's loss scale (gpt_cuda.h): read (waits for the GPU) and set (a
// snapshot's). Other precisions have none: scale 0.
static inline gpt_scaler model_get_scaler(model_t *m) {
    return m->precision == GPT_FP16 ? gpt_cuda_get_scaler(m->gpu) : (gpt_scaler){0};
}
static inline void model_set_scaler(model_t *m, gpt_scaler s) {
    if (m->precision == GPT_FP16) gpt_cuda_set_scaler(m->gpu, s);
}
static inline void model_gpu_grads_to_host(model_t *m) { gpt_cuda_get_grads(m->gpu, m->host.grads); }
static inline size_t model_gpu_allocated_bytes(const model_t *m) { return gpt_cuda_allocated_bytes(m->gpu); }

static inline void model_gpu_tp_agree(model_t *m) {
    float *grads = gpt_cuda_grads_device(m->gpu);
    const gpt_t *h = &m->host;
    CHECK_CUDA(cudaStreamSynchronize(gpt_cuda_stream(m->gpu))); // the backward pass has computed them
    for (int t = 0; t < h->num_tensors;) {
        if (h->tensors[t].split != GPT_REPLICATED) {
            t++;
            continue;
        }
        size_t first = h->tensors[t].offset, count = 0;
        for (; t < h->num_tensors && h->tensors[t].split == GPT_REPLICATED; t++) count += h->tensors[t].count;
        pg_broadcast(m->tp_group, grads + first, count, DTYPE_F32, 0);
    }
}
#else
static inline const model_ops *model_gpu_ops(void) { return NULL; }
static inline void model_graph_step(model_t *m, const uint16_t *in, const uint16_t *tg, int B, int T, float max_norm,
                                    float lr, float beta1, float beta2, float eps, float weight_decay) {
    (void)m, (void)in, (void)tg, (void)B, (void)T, (void)max_norm, (void)lr, (void)beta1, (void)beta2, (void)eps;
    (void)weight_decay;
    die("model_graph_step: CUDA graphs need a GPU build");
}
static inline void model_gpu_tensor_parallel(model_t *m) { (void)m; }
static inline void model_gpu_expert_parallel(model_t *m) { (void)m; }
static inline void model_gpu_context_parallel(model_t *m, bool ulysses) { (void)m, (void)ulysses; }
static inline void model_gpu_cp_counts(const model_t *m, double counts[3]) { (void)m, counts[0] = counts[1] = counts[2] = 0; }
static inline gpt_scaler model_get_scaler(model_t *m) { (void)m; return (gpt_scaler){0}; }
static inline void model_set_scaler(model_t *m, gpt_scaler s) { (void)m, (void)s; }
static inline void model_gpu_tp_agree(model_t *m) { (void)m; }
static inline void model_gpu_grads_to_host(model_t *m) { (void)m; }
static inline size_t model_gpu_allocated_bytes(const model_t *m) { (void)m; return 0; }
#endif

#endif
