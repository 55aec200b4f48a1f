// gpt_cuda.h - the GPT of gpt.h on one GPU: CUDA kernels plus cuBLAS.
//
// The same model, the same parameter layout (ONE flat float array, the
// tensor table of gpt_layout.h) and the same formulas as gpt.h, so the
// CPU model is the reference the GPU is tested against. The GPU keeps its
// own copies of everything: parameters, gradients, AdamW moments,
// activations. The host sees tokens going in and losses, logits,
// parameters and gradients coming out, when it asks: a training step only
// queues work on the GPU and never waits for it.
//
// Three precisions (gpt_precision, --precision):
//   fp32  everything in float: the reference, equal to gpt.h within 1e-4.
//   bf16  mixed precision: fp32 master weights, fp32 gradients and fp32
//         AdamW moments; matrix products read a bf16 copy of the weights
//         and bf16 activations and accumulate in fp32; LayerNorm
//         statistics, softmax and the loss are computed in fp32.
//   fp16  the same with fp16 (GPUs before Ampere have no bf16 products),
//         plus a dynamic loss scale (gpt_cuda_scaler below).
//
// Data parallelism: the gradients lie in one flat device buffer in the
// parameter layout (gpt_cuda_grads_device). gpt_cuda_backward can call the
// caller back each time a bucket of gradients is final (one bucket per
// transformer block, plus ln_f first and the embeddings last), with a CUDA
// event recorded after the bucket's last kernel, so an all-reduce of that
// bucket can start on another stream while the backward pass goes on.
//
// Only in a CUDA build: everything below is under #ifdef COURSE_CUDA, and
// the implementation is gpt_cuda.cu.
#ifndef GPT_CUDA_H
#define GPT_CUDA_H

#ifdef COURSE_CUDA
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

// nvcc compiles C++, which cannot include gpt.h (C11: <tgmath.h>,
// restrict); the layout both models share is plain C.
#include "gpt_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_cuda gpt_cuda_t;

// ---------------------------------------------------------------- host-only questions (no GPU needed)

// Device bytes gpt_cuda_create allocates for batches up to B x T (with the
// attention path it will choose: see gpt_cuda_attention).
size_t gpt_cuda_memory_needed(const gpt_config *cfg, int B, int T, gpt_precision precision);

// ---------------------------------------------------------------- the model on the device

// Copies the parameters (gpt.h layout, num_params floats) to the current
// GPU and allocates room for batches up to B x T. Dies with the size asked
// for when the model does not fit in the free device memory.
gpt_cuda_t *gpt_cuda_create(const gpt_config *cfg, const float *params_host, int B, int T, gpt_precision precision);
void gpt_cuda_free(gpt_cuda_t *g);

// The stream every kernel of the model runs on (non-blocking: it does not
// wait for the legacy default stream, so communication can overlap it).
cudaStream_t gpt_cuda_stream(const gpt_cuda_t *g);
size_t gpt_cuda_param_count(const gpt_cuda_t *g);
float *gpt_cuda_params_device(gpt_cuda_t *g); // fp32 master weights
float *gpt_cuda_grads_device(gpt_cuda_t *g);  // fp32 gradients, one flat buffer

// The forward pass over B x T tokens (B, T at most those given to create).
// It only queues work on the GPU: with targets, the mean cross-entropy
// stays in device memory until gpt_cuda_loss asks for it, so a training
// step never waits for the GPU. The logits stay for gpt_cuda_logits.
void gpt_cuda_forward(gpt_cuda_t *g, const uint16_t *inputs, const uint16_t *targets, int B, int T);

// The mean loss of the last forward pass with targets. Waits for the GPU.
float gpt_cuda_loss(gpt_cuda_t *g);

// Each forward pass with targets also adds its mean loss to a sum on the
// device. This returns the mean of those losses since the last call (their
// number in *count, if count is not NULL; 0 when there were none) and starts
// a new sum: one wait for the GPU every so many steps, for a progress line.
float gpt_cuda_take_loss(gpt_cuda_t *g, int *count);

// The V logits of sequence b, position t of the last forward pass (read them
// before gpt_cuda_backward: in fp32 mode it turns the logits into their gradient).
void gpt_cuda_logits(gpt_cuda_t *g, int b, int t, float *out_host);

void gpt_cuda_zero_grad(gpt_cuda_t *g);

// Called during gpt_cuda_backward each time a bucket's gradients are final
// on the device: `ready` is recorded on gpt_cuda_stream after the bucket's
// last kernel. To overlap, make a communication stream wait for it
// (cudaStreamWaitEvent) and launch the all-reduce there; the host must
// wait for that stream before gpt_cuda_clip_grad_norm / gpt_cuda_adamw.
typedef void (*gpt_cuda_bucket_fn)(void *user, const gpt_bucket *bucket, cudaEvent_t ready);

// Adds grad_scale * d(mean loss)/d(params) to the gradients (micro-batches
// accumulate, as gpt_backward). bucket_ready may be NULL (no callbacks); with
// gradient accumulation pass it on the last micro-batch only. Only queues
// work on gpt_cuda_stream: another stream that reads the gradients must
// first wait for a bucket's event (or for that stream).
void gpt_cuda_backward(gpt_cuda_t *g, float grad_scale, gpt_cuda_bucket_fn bucket_ready, void *user);
// --grad_compress bf16 or fp16 (common/ddp.h): a 16-bit copy of the
// gradients that the buckets travel in (allocated on first use); rounding
// [offset, offset + n) into it (to fp16, else bf16) after the work queued so
// far, then recording `done`; and widening the whole copy back into the fp32
// gradients.
uint16_t *gpt_cuda_grads_16bit(gpt_cuda_t *g);
void gpt_cuda_round_grads(gpt_cuda_t *g, size_t offset, size_t n, bool fp16, cudaEvent_t done);
void gpt_cuda_widen_grads(gpt_cuda_t *g, bool fp16);

// As gpt_clip_grad_norm, but queued: the norm and the clip scale are
// computed on the device, and the next gpt_cuda_adamw applies the scale as
// it reads each gradient (the gradient buffer keeps the unclipped values).
// In fp16 mode it also unscales (below): call it before every AdamW.
void gpt_cuda_clip_grad_norm(gpt_cuda_t *g, float max_norm);
// The norm before clipping of the last gpt_cuda_clip_grad_norm. Waits for the GPU.
float gpt_cuda_grad_norm(gpt_cuda_t *g);
// As gpt_adamw_step (decay on 2-D tensors only): one launch, queued.
void gpt_cuda_adamw(gpt_cuda_t *g, float lr, float beta1, float beta2, float eps, float weight_decay);

// ---------------------------------------------------------------- fp16: the loss scale
//
// fp16 stops at 65504 and loses digits below 6e-5, where many gradients of
// the backward pass lie. So fp16 mode does what PyTorch's GradScaler does,
// on the device: gpt_cuda_backward multiplies the loss's gradient by
// `scale`, so every gradient is `scale` times larger; gpt_cuda_clip_grad_norm
// divides the norm by it and AdamW the gradients. Too large a scale makes
// some gradient overflow to inf (or NaN): the norm is not finite, AdamW
// skips the step (parameters and moments untouched), and the scale halves.
// After GPT_CUDA_SCALE_GROWTH steps in a row without overflow it doubles.
// The gradients are all-reduced before the norm, so every rank of a
// data-parallel group sees the same inf and skips the same step. The
// scaler's state is a gpt_scaler (gpt_layout.h): snapshots keep it.
#define GPT_CUDA_SCALE_INIT 65536.0f // GradScaler's init_scale, 2^16
#define GPT_CUDA_SCALE_GROWTH 2000   // GradScaler's growth_interval

// Queued: sets the scaler (a snapshot's, or a first scale). Waits: reads it.
void gpt_cuda_set_scaler(gpt_cuda_t *g, gpt_scaler s);
gpt_scaler gpt_cuda_get_scaler(gpt_cuda_t *g);

// ---------------------------------------------------------------- the step as one CUDA graph

// One whole training step - zero_grad, forward with targets, backward
// (grad_scale 1, no bucket callbacks), clipping to max_norm, AdamW - as ONE
// launch: captured into a CUDA graph at the first call (and again when B,
// T, max_norm, the betas, eps or weight_decay change), replayed after. The
// tokens and the step's scalars (lr, AdamW's bias corrections) are copied
// to the device before the launch; nothing waits for the GPU. The same
// arithmetic as the five calls, so the same results; the loss goes to the
// sum that gpt_cuda_take_loss reads. One process only: no all-reduce can
// sit between backward and AdamW (gpt_cuda.cu, section 10, says why).
void gpt_cuda_graph_step(gpt_cuda_t *g, const uint16_t *inputs, const uint16_t *targets, int B, int T,
                         float max_norm, float lr, float beta1, float beta2, float eps, float weight_decay);
// The operations the step's graph holds (kernels, cuBLAS calls, memsets:
// what an uncaptured step launches one by one); 0 before the first graph step.
size_t gpt_cuda_graph_nodes(const gpt_cuda_t *g);

// Host <-> device copies of whole flat arrays (num_params floats each), for
// snapshots, saving, and the cpu process group (which stages through host).
void gpt_cuda_get_params(gpt_cuda_t *g, float *host);
void gpt_cuda_set_params(gpt_cuda_t *g, const float *host);
void gpt_cuda_get_grads(gpt_cuda_t *g, float *host);
void gpt_cuda_set_grads(gpt_cuda_t *g, const float *host);
// AdamW state: moments m, v (num_params floats each, zeros before the first
// step) and the number of steps taken.
void gpt_cuda_get_adam(gpt_cuda_t *g, float *m_host, float *v_host, int *step);
void gpt_cuda_set_adam(gpt_cuda_t *g, const float *m_host, const float *v_host, int step);

// ---------------------------------------------------------------- a pipeline stage (chapter 11)
// A model of the blocks and ends of one stage (gpt_layout.h, section 6),
// of each block's shard when tp > 1 (section 5): params_host is the
// stage's own flat array (gpt_layout_stage_params). Its
// forward pass takes input tokens on the first stage only (NULL on the
// others, whose input is what the previous stage sent into
// gpt_cuda_stage_input) and targets on the last only; its backward pass
// starts, on every stage but the last, from the gradient the next stage
// sent into gpt_cuda_stage_grad, and takes no bucket callback.
gpt_cuda_t *gpt_cuda_create_stage(const gpt_config *cfg, const gpt_stage *stage, int tp, const float *params_host,
                                  int B, int T, gpt_precision precision);
// Slot k keeps one micro-batch's activations from its forward pass to its
// backward pass; forward writes, and backward reads, the slot in use. A
// slot is allocated on the device when it is first used.
void gpt_cuda_use_slot(gpt_cuda_t *g, int k);
size_t gpt_cuda_slot_bytes(const gpt_cuda_t *g); // of all slots allocated
// Device buffers of B x T x C activations (bf16 in bf16 mode, else float):
// the stage's input in the slot in use (for a batch of B x T); its output
// after a forward pass; the gradient of the residual stream, which before
// backward holds d(loss)/d(output) and after it d(loss)/d(input).
void *gpt_cuda_stage_input(gpt_cuda_t *g, int B, int T);
void *gpt_cuda_stage_output(gpt_cuda_t *g);
void *gpt_cuda_stage_grad(gpt_cuda_t *g);
// Clipping by the norm of all stages' gradients: the sum of the squares of
// gradients [from, num_params) into a double on the device (returned;
// queued) - in a tensor-parallel shard those of the split tensors, and of
// the replicated ones only when `replicated` - which the stages (and the
// shards) add up, then gpt_cuda_clip_grads with the total there (queued,
// as gpt_cuda_clip_grad_norm).
double *gpt_cuda_grad_square_sum(gpt_cuda_t *g, size_t from, bool replicated);
void gpt_cuda_clip_grads(gpt_cuda_t *g, float max_norm);

// "flash" or "cublas": the attention path this model uses. Flash is the
// default; GPT_CUDA_ATTENTION=cublas in the environment when the model is
// created picks the cuBLAS path (the readable reference, with the T x T
// matrices); heads of more than 128 channels always use it.
const char *gpt_cuda_attention(const gpt_cuda_t *g);

// A mixture of experts (chapter 13, gpt_cuda_moe.cuh): whether the next
// forward passes are training passes (capacity and the balancing loss, as
// gpt.h's train_pass; false, the default: every token routed), and what the
// last forward pass of `layer` routed: the assignments per expert before
// drops into routed (n_expert numbers), its balancing loss into aux (a
// training pass's; either may be NULL), the assignments dropped returned
// (-1: a dense model, or a layer not held here). No wait: the forward pass
// brought these to the host.
void gpt_cuda_set_train_pass(gpt_cuda_t *g, bool train);
int gpt_cuda_moe_counts(const gpt_cuda_t *g, int layer, int *routed, float *aux);

// Bytes this model has allocated on the device (all at create, so this is
// also its peak), and what the whole process uses on the GPU now
// (cudaMemGetInfo: our buffers + the CUDA context + cuBLAS + anyone else's).
size_t gpt_cuda_allocated_bytes(const gpt_cuda_t *g);
size_t gpt_cuda_device_used_bytes(void);

// ---------------------------------------------------------------- tensor parallelism (chapter 10)
// A model that holds one rank's shard of each block, split over tp ranks
// (gpt_layout.h, section 5): params_host is the shard's flat array
// (gpt_layout_params_tp), and every buffer is sized for the shard. tp 1 is
// gpt_cuda_create.
gpt_cuda_t *gpt_cuda_create_tp(const gpt_config *cfg, int tp, const float *params_host, int B, int T,
                               gpt_precision precision);
int gpt_cuda_tp(const gpt_cuda_t *g);

// The sums over the tp ranks that a shard's blocks need: the caller's
// all-reduce (sum, in place) of count numbers of `type` in device memory,
// which the work queued on `stream` so far computes. When it returns, the
// sum must be in buf for the work queued next on `stream`.
typedef enum { GPT_CUDA_F32, GPT_CUDA_BF16, GPT_CUDA_F64, GPT_CUDA_F16 } gpt_cuda_type;
typedef void (*gpt_cuda_tp_fn)(void *user, void *buf, size_t count, gpt_cuda_type type, cudaStream_t stream);
void gpt_cuda_set_tp_all_reduce(gpt_cuda_t *g, gpt_cuda_tp_fn fn, void *user);

// gpt_cuda_clip_grad_norm for a shard: the norm of the whole model (the
// split tensors' squares summed over the tp ranks with the all-reduce
// above, the replicated ones counted once). With tp 1, gpt_cuda_clip_grad_norm.
void gpt_cuda_clip_grad_norm_tp(gpt_cuda_t *g, float max_norm);
// ---------------------------------------------------------------- context parallelism (chapter 12)
//
// The model computes one cp rank's tokens of each sequence (gpt_cuda_cp.cuh
// says how): the caller chooses them (model.h) and passes them to
// gpt_cuda_forward with their global positions given before each pass.
// Attention's messages go through the caller, on device buffers of count
// numbers of `type`, after the work queued on the model's stream so far:
// ring_start starts sending to the next rank of the ring and receiving
// from the previous one, ring_finish waits for both; all_to_all_v as
// pg_all_to_all_v (counts on the host).
typedef struct {
    void *user;
    void *(*ring_start)(void *user, const void *send, size_t send_count, void *recv, size_t recv_count,
                        gpt_cuda_type type);
    void (*ring_finish)(void *user, void *pending);
    void (*all_to_all_v)(void *user, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                         gpt_cuda_type type);
} gpt_cuda_cp_comm;
// This model is rank `rank` of `ways`; ring attention, or ulysses.
void gpt_cuda_context_parallel(gpt_cuda_t *g, int ways, int rank, bool ulysses, gpt_cuda_cp_comm comm);
// Before each forward pass of sequences of `whole` tokens: rank r holds
// positions [segs[4r], +segs[4r+1]) and [segs[4r+2], +segs[4r+3]), in
// order; whole 0: the pass is not split (whole sequences on every rank).
void gpt_cuda_cp_layout(gpt_cuda_t *g, int whole, const int *segs);
// Numbers attention sent forward and backward, and score pairs computed, so far.
void gpt_cuda_cp_counts(const gpt_cuda_t *g, double counts[3]);

// ---------------------------------------------------------------- expert parallelism (chapter 13)
//
// A mixture whose cfg.ep > 1 holds E/ep experts of each block (gpt_layout.h,
// section 7) and exchanges rows with the other ranks of its ep group
// (gpt_cuda_moe.cuh says when and why) through the caller, on device
// buffers, after the model's stream has computed them (the model waits for
// it first); each call is blocking: what it received is there when it
// returns. counts: an all-to-all of per_peer ints to and from each rank
// (pg_all_to_all); rows: pg_all_to_all_v of numbers of `type` (counts on
// the host); sum: an all-reduce (sum, in place) over the ep group, as
// gpt_cuda_tp_fn (the clipping norm's expert squares).
typedef struct {
    void *user;
    void (*counts)(void *user, const int *send, int *recv, int per_peer);
    void (*rows)(void *user, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                 gpt_cuda_type type);
    gpt_cuda_tp_fn sum;
} gpt_cuda_ep_comm;
void gpt_cuda_expert_parallel(gpt_cuda_t *g, gpt_cuda_ep_comm comm);
// The numbers passed to the row exchanges (each rank's block to itself
// included) and the exchanges, forward (training passes) and backward,
// since the last call: gpt/moe.h's traffic counters.
void gpt_cuda_moe_take_traffic(gpt_cuda_t *g, double sent[2], double exchanges[2]);
// gpt_cuda_clip_grad_norm for an expert shard: the norm of the whole
// model, the experts' squares summed over the ep group with comm.sum, the
// dense ones (the same on every rank) counted once. Queued, as the others.
void gpt_cuda_clip_grad_norm_ep(gpt_cuda_t *g, float max_norm);
// x[i] *= s for n device floats, queued on gpt_cuda_stream.
void gpt_cuda_scale(gpt_cuda_t *g, float *x, size_t n, float s);

// ---------------------------------------------------------------- sharded training (chapter 09)
//
// gpt_cuda_create keeps the whole training state on the device. Chapter
// 09's ZeRO stages keep parts of it in slices of their own, and create the
// model without them:
//   params false: no flat parameter array (nor its bf16 copy): the bucket
//     hook gives every bucket's fp32 parameters as the passes reach it, and
//     a bf16 model makes the bf16 copies its products read then;
//   grads false: no flat gradient array: the hook gives each bucket's;
//   adam false: no AdamW moments (the caller steps its slices:
//     gpt_cuda_adamw_slices).
// gpt_cuda_memory_needed and the functions that copy or step the whole
// state need what they touch (they stop with a message otherwise).
gpt_cuda_t *gpt_cuda_create_keeping(const gpt_config *cfg, const float *params_host, int B, int T, gpt_precision precision,
                                    bool params, bool grads, bool adam);

// Where bucket `bucket`'s parameters and gradients are (gpt_layout.h,
// section 3): the hook is given the model's own (NULL where it keeps none)
// and may point them at device arrays laid out as the bucket's part of the
// flat array, with gpt_cuda_bucket_front zeros in front. It is called from
// the host as the passes queue their work; at FORWARD_END and BACKWARD_END
// `done` is an event recorded on gpt_cuda_stream after the bucket's last
// kernel (NULL at the BEGIN events): a buffer may be reused, or a bucket's
// gradients read, once it has happened. Arrays given at BEGIN must be
// ready for work queued on gpt_cuda_stream from then on.
typedef void (*gpt_cuda_bucket_hook)(void *user, gpt_bucket_event event, int bucket, float **params, float **grads,
                                     cudaEvent_t done);
void gpt_cuda_set_bucket_hook(gpt_cuda_t *g, gpt_cuda_bucket_hook hook, void *user);
// Zeros in front of a bucket's arrays that the model reads and writes: the
// LM head's padding rows before wte (see gpt_cuda.cu, "the vocabulary,
// padded"); 0 for every other bucket.
size_t gpt_cuda_bucket_front(const gpt_cuda_t *g, int bucket);

// AdamW (gpt_cuda_adamw's arithmetic) on slices of the flat array that
// live in buffers of their own: slice i is parameters [first, first +
// count), its values, gradients and moments at params[0..count) and so on
// (device memory). Every gradient is multiplied by grad_scale (clipping);
// step counts from 1. Queued on gpt_cuda_stream. It does not touch the
// bf16 copy: call gpt_cuda_params_changed once the parameters are whole.
typedef struct {
    size_t first, count;
    float *params;
    const float *grads;
    float *adam_m, *adam_v;
} gpt_cuda_slice;
void gpt_cuda_adamw_slices(gpt_cuda_t *g, const gpt_cuda_slice *slices, int n, int step, float grad_scale, float lr,
                           float beta1, float beta2, float eps, float weight_decay);
// The sum of x[i]^2 over n device floats, in double. Waits for the GPU.
double gpt_cuda_sum_squares(gpt_cuda_t *g, const float *x, size_t n);
// dst[i] += src[i], queued on gpt_cuda_stream.
void gpt_cuda_add(gpt_cuda_t *g, float *dst, const float *src, size_t n);
// The caller wrote the flat fp32 parameters: the bf16 copy follows (queued).
void gpt_cuda_params_changed(gpt_cuda_t *g);
// Bytes allocated, by kind: parts[0] parameters (and their bf16 copy), [1]
// gradients, [2] AdamW's moments, [3] activations and their gradients,
// logits, tokens, [4] the rest (cuBLAS workspace, small tables), [5] the
// bf16 copies of the buckets the hook gives (a model without parameters).
void gpt_cuda_memory_parts(const gpt_cuda_t *g, size_t parts[6]);

// ---------------------------------------------------------------- one layer at a time, for the parity tests
// Each takes host float arrays, runs the layer's forward then backward on
// the GPU in the chosen precision (bf16: inputs rounded to bf16 on the
// device, as the model would hold them), and writes the results back as
// floats. Gradients of parameters are ADDED to (as gpt.h's layers do);
// the names and shapes are those of the layer in gpt.h.

void gpt_cuda_test_encoder(gpt_precision precision, int B, int T, int C, int V, const uint16_t *tokens, const float *wte,
                           const float *wpe, float *out, const float *dout, float *dwte, float *dwpe);
void gpt_cuda_test_layernorm(gpt_precision precision, int N, int C, const float *inp, const float *weight, const float *bias,
                             float *out, float *mean, float *rstd, const float *dout, float *dinp,
                             float *dweight, float *dbias);
// bias may be NULL (then dbias is not touched).
void gpt_cuda_test_matmul(gpt_precision precision, int N, int C, int OC, const float *inp, const float *weight,
                          const float *bias, float *out, const float *dout, float *dinp, float *dweight,
                          float *dbias);
// The cuBLAS path: att receives the probabilities (B, NH, T, T).
void gpt_cuda_test_attention(gpt_precision precision, int B, int T, int C, int NH, const float *qkv, float *out, float *att,
                             const float *dout, float *dqkv);
// The flash path: lse receives each row's log-sum-exp of the scaled scores
// (B, NH, T), in place of the probabilities. Heads of up to 128 channels.
void gpt_cuda_test_flash_attention(gpt_precision precision, int B, int T, int C, int NH, const float *qkv, float *out, float *lse,
                                   const float *dout, float *dqkv);
void gpt_cuda_test_gelu(gpt_precision precision, size_t n, const float *inp, float *out, const float *dout, float *dinp);
void gpt_cuda_test_residual(gpt_precision precision, size_t n, const float *a, const float *b, float *out);
// Logits stay fp32 in both precisions; bf16 only changes dlogits' type.
// Rows of logits and dlogits are Vp >= V long, as in the model: Vp - V
// padding columns first (ignored by the loss, gradient 0), then the V logits.
float gpt_cuda_test_crossentropy(gpt_precision precision, int N, int V, int Vp, const float *logits, const uint16_t *targets,
                                 float *losses, float dloss, float *dlogits);

#ifdef __cplusplus
}
#endif

#endif // COURSE_CUDA
#endif
