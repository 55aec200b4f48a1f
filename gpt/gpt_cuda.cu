// gpt_cuda.cu - the GPT of gpt.h on the GPU: our kernels for the layers,
// cuBLAS for the matrix products, fp32, or bf16 or fp16 mixed precision.
//
// Read it beside gpt.h: every layer here has the same name, the same
// arguments and the same formulas as there, so each kernel is a loop of
// gpt.h spread over GPU threads. The order:
//   1. checks, the two number types, conversions
//   2. reductions inside a warp and inside a block (shuffles)
//   3. the layers: kernels + the host function that launches them
//   4. matrix products with cuBLAS (row-major on a column-major library),
//      and attention with them: the readable way
//   5. flash attention: the fast way, one kernel, no T x T matrices
//   6. the model: memory plan, forward, backward with bucket callbacks
//   7. the optimizer: gradient norm, clipping, AdamW
//   8. copies to and from the host, and one-layer entry points for tests
//   9. tensor parallelism: a shard of each block (chapter 10)
//  10. the training step as one CUDA graph: captured once, replayed
//
// Precision. Templates take the activation type Act: float (fp32 mode,
// the reference), __nv_bfloat16 (bf16 mode) or __half (fp16 mode).
// Whatever Act is:
//   - arithmetic inside kernels is fp32: values are widened on load and
//     rounded once on store;
//   - LayerNorm mean/rstd, the attention scores before softmax, the
//     logits, the losses are fp32 buffers;
//   - parameters, their gradients and AdamW's moments are fp32; the 16-bit
//     modes keep a 16-bit copy of the parameters for the matrix products only
//     (vectors - LayerNorm gains, biases - and the embeddings are read
//     from the fp32 master copy: they are small and it costs nothing);
//   - cuBLAS accumulates in fp32 (CUBLAS_COMPUTE_32F) in every mode;
//   - fp16 mode scales the loss's gradient by a loss scale kept on the
//     device, and the gradient norm's kernel unscales, skips a step whose
//     gradients overflowed and adjusts the scale (section 7).
//
// Streams. Every kernel of a model goes to its own non-blocking stream.
// The steps of training (zero_grad, forward, backward, clipping, AdamW)
// only queue work: the loss and the gradient norm stay on the device until
// the host asks for them. Functions that return data to the host wait.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <type_traits>

#include "check.h"
#include "gpt_cuda.h"

// ===================================================================== 1. checks and number types

static const char *cublas_hint(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "no usable GPU, or the CUDA context failed to start";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the GPU is out of memory";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "this GPU cannot do this product (bf16 needs compute capability 8.0 or newer: use --precision fp16)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "this combination of types is not supported by this cuBLAS";
    default: return "";
    }
}

#define CHECK_CUBLAS(call)                                                               \
    do {                                                                                 \
        cublasStatus_t check_st_ = (call);                                               \
        if (check_st_ != CUBLAS_STATUS_SUCCESS)                                          \
            check_failed(#call, __FILE__, __LINE__, cublasGetStatusString(check_st_),    \
                         cublas_hint(check_st_));                                        \
    } while (0)

// A kernel launch returns nothing; a bad configuration shows up here.
static void launched(const char *kernel) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) die("launching the CUDA kernel %s failed: %s", kernel, cudaGetErrorString(err));
}

static unsigned blocks_for(size_t threads, unsigned per_block) {
    return (unsigned)((threads + per_block - 1) / per_block);
}

typedef __nv_bfloat16 bf16;
typedef __half f16;

// Widen to fp32 on load, round (to nearest even) on store. A value past
// fp16's 65504 rounds to infinity: the loss scale's overflow (section 7).
static __device__ __forceinline__ float to_f(float x) { return x; }
static __device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }
template <typename Act> static __device__ __forceinline__ Act from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half(x); }

template <typename Act> static cudaDataType cuda_type() {
    return std::is_same<Act, float>::value ? CUDA_R_32F : std::is_same<Act, bf16>::value ? CUDA_R_16BF : CUDA_R_16F;
}

// A host function templated on Act, called with the type of a precision:
// BY_PRECISION(p, f, args) is f<bf16>(args), f<f16>(args) or f<float>(args).
#define BY_PRECISION(p, f, ...) \
    ((p) == GPT_BF16 ? f<bf16>(__VA_ARGS__) : (p) == GPT_FP16 ? f<f16>(__VA_ARGS__) : f<float>(__VA_ARGS__))

template <typename Out, typename In>
static __global__ void convert_kernel(Out *out, const In *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<Out>(to_f(in[i]));
}

template <typename Out, typename In>
static void convert(cudaStream_t s, Out *out, const In *in, size_t n) {
    if (n == 0) return;
    convert_kernel<Out, In><<<blocks_for(n, 256), 256, 0, s>>>(out, in, n);
    launched("convert_kernel");
}

// What the layers need to launch work: a stream and a cuBLAS handle bound to it.
typedef struct {
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *workspace; // cuBLAS scratch, given explicitly so that it is counted
} gpu_ctx;

static const size_t CUBLAS_WORKSPACE_BYTES = 32u << 20; // what NVIDIA recommends for Hopper

static gpu_ctx ctx_create(cudaStream_t stream, void *workspace) {
    gpu_ctx c = {stream, NULL, workspace};
    CHECK_CUBLAS(cublasCreate(&c.cublas));
    // Order matters: cublasSetStream resets the workspace to cuBLAS's own pool.
    CHECK_CUBLAS(cublasSetStream(c.cublas, stream));
    CHECK_CUBLAS(cublasSetWorkspace(c.cublas, workspace, CUBLAS_WORKSPACE_BYTES));
    return c;
}

// ===================================================================== 2. reductions
//
// A warp is 32 threads that execute together. __shfl_xor_sync(mask, v, k)
// hands each lane the v of lane (its id XOR k) without touching memory;
// with k = 16, 8, 4, 2, 1 every lane ends up holding the sum of all 32 (a
// butterfly). A block's reduction is two warp reductions: each warp reduces,
// its lane 0 leaves the result in shared memory, the first warp reduces those.
#define WARP 32
#define FULL_MASK 0xffffffffu

static __device__ __forceinline__ float warp_sum(float v) {
    for (int k = WARP / 2; k > 0; k /= 2) v += __shfl_xor_sync(FULL_MASK, v, k);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int k = WARP / 2; k > 0; k /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, k));
    return v;
}

static __device__ __forceinline__ double warp_sum_double(double v) {
    for (int k = WARP / 2; k > 0; k /= 2) v += __shfl_xor_sync(FULL_MASK, v, k);
    return v;
}

// Every thread of the block gets the block's sum (or max). blockDim.x must
// be a multiple of 32. The last __syncthreads lets a second call reuse the
// shared slots safely.
static __device__ float block_reduce(float v, bool is_max) {
    __shared__ float partial[WARP];
    __shared__ float result;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? partial[lane] : (is_max ? -INFINITY : 0.0f);
        v = is_max ? warp_max(v) : warp_sum(v);
        if (lane == 0) result = v;
    }
    __syncthreads();
    float r = result;
    __syncthreads();
    return r;
}

// The block's sum in double (the loss, the gradient norm). Every thread
// gets it. The additions happen in the same order every run, so the result
// is the same bits every run.
static __device__ double block_sum_double(double v) {
    __shared__ double partial[WARP];
    __shared__ double result;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_sum_double(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_sum_double(lane < warps ? partial[lane] : 0.0);
        if (lane == 0) result = v;
    }
    __syncthreads();
    double r = result;
    __syncthreads();
    return r;
}

// Column sums over many rows (bias and LayerNorm parameter gradients).
// Blocks are 32 x 8 threads: threadIdx.x picks the column, so the 32
// threads of a warp read 32 neighbouring numbers of one row (one memory
// transaction); threadIdx.y picks every 8th row of the block's slab of
// rows. Each thread has its partial sum; here the 8 partials of a column
// meet in shared memory, and one atomicAdd per column and block adds the
// slab's sum to the gradient. Atomics make the order of those additions,
// and so the last bits of the result, vary from run to run.
#define COL_X 32
#define COL_Y 8
#define COL_ROWS_PER_BLOCK 256

static __device__ void column_add(float *dst, int col, int cols, float v) {
    __shared__ float part[COL_Y][COL_X];
    part[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float s = 0.0f;
        for (int y = 0; y < COL_Y; y++) s += part[y][threadIdx.x];
        atomicAdd(&dst[col], s);
    }
    __syncthreads();
}

static dim3 column_grid(int rows, int cols) {
    return dim3(blocks_for((size_t)cols, COL_X), blocks_for((size_t)rows, COL_ROWS_PER_BLOCK));
}

// ===================================================================== 3. the layers

// --- token + position embedding: x[n,:] = wte[token[n],:] + wpe[n % T,:]
// One thread per output number; consecutive threads, consecutive channels.
template <typename Act>
static __global__ void encoder_forward_kernel(Act *out, const uint16_t *tokens, const float *wte,
                                              const float *wpe, int T, int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C), t = (int)(n % T);
    out[i] = from_f<Act>(wte[(size_t)tokens[n] * C + c] + wpe[(size_t)t * C + c]);
}

// dwte[token] += dx: two positions holding the same token add to the same
// row, so these additions are atomic.
template <typename Act>
static __global__ void encoder_backward_wte_kernel(float *dwte, const Act *dout, const uint16_t *tokens,
                                                   int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    atomicAdd(&dwte[(size_t)tokens[i / C] * C + i % C], to_f(dout[i]));
}

// dwpe[t] += sum over sequences b of dx[b,t]: one thread per (t, c) owns
// its sum, so no atomics are needed and the result is deterministic.
template <typename Act>
static __global__ void encoder_backward_wpe_kernel(float *dwpe, const Act *dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += to_f(dout[(size_t)b * T * C + i]);
    dwpe[i] += s;
}

template <typename Act>
static void encoder_forward(const gpu_ctx *x, Act *out, const uint16_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    encoder_forward_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(out, tokens, wte, wpe, T, C, total);
    launched("encoder_forward_kernel");
}

template <typename Act>
static void encoder_backward(const gpu_ctx *x, float *dwte, float *dwpe, const Act *dout,
                             const uint16_t *tokens, int B, int T, int C) {
    size_t total = (size_t)B * T * C;
    encoder_backward_wte_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(dwte, dout, tokens, C, total);
    launched("encoder_backward_wte_kernel");
    encoder_backward_wpe_kernel<Act><<<blocks_for((size_t)T * C, 256), 256, 0, x->stream>>>(dwpe, dout, B, T, C);
    launched("encoder_backward_wpe_kernel");
}

// --- LayerNorm forward. One warp per row: the row's C numbers are read by
// 32 lanes, lane j taking channels j, j+32, ... (neighbouring lanes read
// neighbouring addresses). The warp sums with shuffles, so it needs no
// shared memory and no __syncthreads. Mean and variance in fp32, two
// passes (as gpt.h): a one-pass E[x^2] - E[x]^2 loses digits to cancellation.
template <typename Act>
static __global__ void layernorm_forward_kernel(Act *out, float *mean, float *rstd, const Act *inp,
                                                const float *weight, const float *bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return; // the whole warp leaves together: the shuffles below stay complete
    const Act *x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP) sum += to_f(x[c]);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float d = to_f(x[c]) - m;
        var += d * d;
    }
    float s = rsqrtf(warp_sum(var) / C + 1e-5f);
    Act *y = out + (size_t)row * C;
    for (int c = lane; c < C; c += WARP) y[c] = from_f<Act>((to_f(x[c]) - m) * s * weight[c] + bias[c]);
    if (lane == 0) mean[row] = m, rstd[row] = s;
}

// --- LayerNorm backward, input gradient (gpt.h's formula):
//     dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w.
// One warp per row again: the two means are warp sums. dx ADDS (it is the
// residual stream's gradient).
template <typename Act>
static __global__ void layernorm_backward_input_kernel(Act *dinp, const Act *dout, const Act *inp,
                                                       const float *weight, const float *mean,
                                                       const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    const Act *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row], g_sum = 0.0f, gx_sum = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float g = to_f(dy[c]) * weight[c];
        g_sum += g;
        gx_sum += g * (to_f(x[c]) - m) * s;
    }
    float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
    Act *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += WARP) {
        float xhat = (to_f(x[c]) - m) * s;
        float d = s * (to_f(dy[c]) * weight[c] - g_mean - xhat * gx_mean);
        dx[c] = from_f<Act>(to_f(dx[c]) + d);
    }
}

// --- LayerNorm backward, parameter gradients: dw += sum_rows dy * xhat,
// db += sum_rows dy. Sums over rows are column sums (see column_add).
template <typename Act>
static __global__ void layernorm_backward_params_kernel(float *dweight, float *dbias, const Act *dout,
                                                        const Act *inp, const float *mean,
                                                        const float *rstd, int N, int C) {
    int c = blockIdx.x * COL_X + threadIdx.x;
    int r0 = blockIdx.y * COL_ROWS_PER_BLOCK, r1 = min(N, r0 + COL_ROWS_PER_BLOCK);
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += COL_Y) {
            float dy = to_f(dout[(size_t)r * C + c]);
            dw += dy * (to_f(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
            db += dy;
        }
    }
    column_add(dweight, c, C, dw); // every thread calls it: it has __syncthreads inside
    column_add(dbias, c, C, db);
}

static const int ROWS_PER_BLOCK = 8; // warps per 256-thread block in the one-warp-per-row kernels

template <typename Act>
static void layernorm_forward(const gpu_ctx *x, Act *out, float *mean, float *rstd, const Act *inp,
                              const float *weight, const float *bias, int N, int C) {
    layernorm_forward_kernel<Act><<<blocks_for((size_t)N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * WARP, 0, x->stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    launched("layernorm_forward_kernel");
}

template <typename Act>
static void layernorm_backward(const gpu_ctx *x, Act *dinp, float *dweight, float *dbias, const Act *dout,
                               const Act *inp, const float *weight, const float *mean, const float *rstd,
                               int N, int C) {
    layernorm_backward_input_kernel<Act><<<blocks_for((size_t)N, ROWS_PER_BLOCK), ROWS_PER_BLOCK * WARP, 0,
                                           x->stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    launched("layernorm_backward_input_kernel");
    layernorm_backward_params_kernel<Act><<<column_grid(N, C), dim3(COL_X, COL_Y), 0, x->stream>>>(
        dweight, dbias, dout, inp, mean, rstd, N, C);
    launched("layernorm_backward_params_kernel");
}

// --- bias: out[n,o] = bias[o] before the product adds inp W^T onto it
// (beta = 1), so a bf16 output is rounded once, not twice.
template <typename Out>
static __global__ void bias_broadcast_kernel(Out *out, const float *bias, int OC, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = from_f<Out>(bias[i % OC]);
}

// dbias[o] += sum over rows of dout[n,o].
template <typename Act>
static __global__ void bias_backward_kernel(float *dbias, const Act *dout, int N, int OC) {
    int c = blockIdx.x * COL_X + threadIdx.x;
    int r0 = blockIdx.y * COL_ROWS_PER_BLOCK, r1 = min(N, r0 + COL_ROWS_PER_BLOCK);
    float s = 0.0f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += COL_Y) s += to_f(dout[(size_t)r * OC + c]);
    column_add(dbias, c, OC, s);
}

// --- causal softmax, forward. One warp per row (b, h, t) of the (T, T)
// score matrix; only s <= t is visible, the rest becomes 0. fp32 scores in,
// probabilities out. In fp32 mode scores and att are the same buffer: each
// lane reads an element before it writes that element, and only it.
template <typename Act>
static __global__ void softmax_forward_kernel(Act *att, const float *scores, int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = row % T;
    const float *s = scores + (size_t)row * T;
    float maxv = -INFINITY;
    for (int j = lane; j <= t; j += WARP) maxv = fmaxf(maxv, s[j] * scale);
    maxv = warp_max(maxv);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += WARP) sum += expf(s[j] * scale - maxv);
    float inv = 1.0f / warp_sum(sum);
    Act *p = att + (size_t)row * T;
    for (int j = lane; j < T; j += WARP) p[j] = from_f<Act>(j <= t ? expf(s[j] * scale - maxv) * inv : 0.0f);
}

// --- causal softmax, backward: dS = P .* (dP - rowsum(dP .* P)) * scale.
// dP is fp32; dS may be the same buffer in fp32 mode (same argument as above).
template <typename Act>
static __global__ void softmax_backward_kernel(Act *ds, const float *dp, const Act *att, int rows, int T,
                                               float scale) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= rows) return;
    int t = row % T;
    const float *d = dp + (size_t)row * T;
    const Act *p = att + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += WARP) dot += d[j] * to_f(p[j]);
    dot = warp_sum(dot);
    Act *out = ds + (size_t)row * T;
    for (int j = lane; j < T; j += WARP) out[j] = from_f<Act>(j <= t ? to_f(p[j]) * (d[j] - dot) * scale : 0.0f);
}

// --- GELU (tanh form) written as x * sigmoid(2u), as gpt.h; fp32 inside.
static __device__ __forceinline__ float gelu_sigmoid(float x) {
    const float k = 0.7978845608028654f, a = 0.044715f;
    return 1.0f / (1.0f + expf(-2.0f * k * (x + a * x * x * x)));
}

template <typename Act>
static __global__ void gelu_forward_kernel(Act *out, const Act *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(inp[i]);
    out[i] = from_f<Act>(x * gelu_sigmoid(x));
}

// dinp may be dout: each thread reads its element before writing it.
template <typename Act>
static __global__ void gelu_backward_kernel(Act *dinp, const Act *inp, const Act *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float k = 0.7978845608028654f, a = 0.044715f;
    float x = to_f(inp[i]), s = gelu_sigmoid(x);
    dinp[i] = from_f<Act>((s + 2.0f * x * s * (1.0f - s) * k * (1.0f + 3.0f * a * x * x)) * to_f(dout[i]));
}

template <typename Act>
static __global__ void residual_forward_kernel(Act *out, const Act *a, const Act *b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<Act>(to_f(a[i]) + to_f(b[i]));
}

template <typename Act> static void gelu_forward(const gpu_ctx *x, Act *out, const Act *inp, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<Act><<<blocks_for(n, 256), 256, 0, x->stream>>>(out, inp, n);
    launched("gelu_forward_kernel");
}

template <typename Act>
static void gelu_backward(const gpu_ctx *x, Act *dinp, const Act *inp, const Act *dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<Act><<<blocks_for(n, 256), 256, 0, x->stream>>>(dinp, inp, dout, n);
    launched("gelu_backward_kernel");
}

template <typename Act>
static void residual_forward(const gpu_ctx *x, Act *out, const Act *a, const Act *b, size_t n) {
    if (n == 0) return;
    residual_forward_kernel<Act><<<blocks_for(n, 256), 256, 0, x->stream>>>(out, a, b, n);
    launched("residual_forward_kernel");
}

// --- softmax + cross-entropy. Rows of logits are Vp >= V numbers long:
// the vocabulary padded to a multiple of 64 for the LM head's matrix
// product (see "the vocabulary, padded" in section 6). The padding comes
// FIRST in each row, the V real logits after it; the loss never looks at
// the padding, and its gradient is 0.
//
// Forward: one block per row (V is thousands: one warp would loop too
// long). loss = lse - z[target] with lse = max + log(sum exp(z - max));
// lse is kept for the backward pass, so the logits need not be
// overwritten with probabilities.
static __global__ void crossentropy_forward_kernel(float *losses, float *lse, const float *logits,
                                                   const uint16_t *targets, int V, int Vp) {
    const float *z = logits + (size_t)blockIdx.x * Vp + (Vp - V);
    float maxv = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxv = fmaxf(maxv, z[i]);
    maxv = block_reduce(maxv, true);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(z[i] - maxv);
    sum = block_reduce(sum, false);
    if (threadIdx.x == 0) {
        float l = maxv + logf(sum);
        lse[blockIdx.x] = l;
        losses[blockIdx.x] = l - z[targets[blockIdx.x]];
    }
}

// Backward: dlogits = (softmax - onehot(target)) * dloss, element by
// element (p = exp(z - lse)), and 0 for the padding. In fp32 mode dlogits
// may be the logits buffer. fp16 mode passes the loss scale (section 7):
// read here, on the device, so a step never waits to learn it.
template <typename Act>
static __global__ void crossentropy_backward_kernel(Act *dlogits, const float *logits, const float *lse,
                                                    const uint16_t *targets, int V, int Vp, size_t total,
                                                    float dloss, const float *loss_scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    if (loss_scale) dloss *= *loss_scale;
    size_t n = i / Vp;
    int v = (int)(i % Vp) - (Vp - V); // the token this column stands for; < 0: padding
    float d = 0.0f;
    if (v >= 0) d = (expf(logits[i] - lse[n]) - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
    dlogits[i] = from_f<Act>(d);
}

static void crossentropy_forward(const gpu_ctx *x, float *losses, float *lse, const float *logits,
                                 const uint16_t *targets, int N, int V, int Vp) {
    crossentropy_forward_kernel<<<N, 256, 0, x->stream>>>(losses, lse, logits, targets, V, Vp);
    launched("crossentropy_forward_kernel");
}

template <typename Act>
static void crossentropy_backward(const gpu_ctx *x, Act *dlogits, const float *logits, const float *lse,
                                  const uint16_t *targets, int N, int V, int Vp, float dloss,
                                  const float *loss_scale = NULL) {
    size_t total = (size_t)N * Vp;
    crossentropy_backward_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(
        dlogits, logits, lse, targets, V, Vp, total, dloss, loss_scale);
    launched("crossentropy_backward_kernel");
}

// ===================================================================== 4. matrix products
//
// Row-major C[M x N] = beta * C + op(A)[M x K] op(B)[K x N], `batch` times
// (A, B, C advancing by their strides), fp32 accumulation. cuBLAS is
// column-major, and a row-major matrix read column-major is its transpose.
// So we ask cuBLAS for C^T = op(B)^T op(A)^T: the same call with A and B
// swapped, M and N swapped, each op kept. A and B have the model's
// activation type; C may be that type or fp32 (weight gradients, logits).
static void gemm(const gpu_ctx *x, cudaDataType ab_type, bool ta, bool tb, int M, int N, int K,
                 const void *A, int lda, long long stride_a, const void *B, int ldb, long long stride_b,
                 float beta, void *C, cudaDataType c_type, int ldc, long long stride_c, int batch) {
    const float alpha = 1.0f;
    CHECK_CUBLAS(cublasGemmStridedBatchedEx(x->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            N, M, K, &alpha, B, ab_type, ldb, stride_b, A, ab_type, lda, stride_a,
                                            &beta, C, c_type, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
}

// --- linear layer: out (N, OC) = inp (N, C) W^T + bias, W stored (OC, C).
// Out is Act, or float for the logits.
template <typename Act, typename Out>
static void matmul_forward(const gpu_ctx *x, Out *out, const Act *inp, const Act *weight, const float *bias,
                           int N, int C, int OC) {
    size_t total = (size_t)N * OC;
    if (bias) {
        bias_broadcast_kernel<Out><<<blocks_for(total, 256), 256, 0, x->stream>>>(out, bias, OC, total);
        launched("bias_broadcast_kernel");
    }
    gemm(x, cuda_type<Act>(), false, true, N, OC, C, inp, C, 0, weight, C, 0, bias ? 1.0f : 0.0f, out,
         cuda_type<Out>(), OC, 0, 1);
}

// dinp = dout W (overwritten; skipped when NULL), dW += dout^T inp in fp32,
// db += column sums of dout.
template <typename Act>
static void matmul_backward(const gpu_ctx *x, Act *dinp, float *dweight, float *dbias, const Act *dout,
                            const Act *inp, const Act *weight, int N, int C, int OC) {
    cudaDataType t = cuda_type<Act>();
    if (dinp) gemm(x, t, false, false, N, C, OC, dout, OC, 0, weight, C, 0, 0.0f, dinp, t, C, 0, 1);
    gemm(x, t, true, false, OC, C, N, dout, OC, 0, inp, C, 0, 1.0f, dweight, CUDA_R_32F, C, 0, 1);
    if (dbias) {
        bias_backward_kernel<Act><<<column_grid(N, OC), dim3(COL_X, COL_Y), 0, x->stream>>>(dbias, dout, N, OC);
        launched("bias_backward_kernel");
    }
}

// --- causal self-attention, the straightforward way (as gpt.h): per
// sequence b, one batched product over the NH heads for S = Q K^T, the
// causal softmax kernel, one batched product for Y = P V. Head h of
// sequence b reads columns h*hs.. of each third of qkv (row stride 3C), so
// consecutive heads are hs numbers apart: that is the batch stride.
// scores (fp32, B*NH*T*T) may be att itself in fp32 mode.
template <typename Act>
static void attention_forward(const gpu_ctx *x, Act *out, Act *att, float *scores, const Act *qkv, int B, int T,
                              int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    cudaDataType t = cuda_type<Act>();
    for (int b = 0; b < B; b++) {
        const Act *q = qkv + (size_t)b * T * C3, *k = q + C;
        gemm(x, t, false, true, T, T, hs, q, C3, hs, k, C3, hs, 0.0f, scores + b * NH * TT, CUDA_R_32F, T, TT, NH);
    }
    int rows = B * NH * T;
    softmax_forward_kernel<Act><<<blocks_for((size_t)rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * WARP, 0, x->stream>>>(
        att, scores, rows, T, 1.0f / sqrtf((float)hs));
    launched("softmax_forward_kernel");
    for (int b = 0; b < B; b++) {
        const Act *v = qkv + (size_t)b * T * C3 + 2 * C;
        gemm(x, t, false, false, T, hs, T, att + b * NH * TT, T, TT, v, C3, hs, 0.0f, out + (size_t)b * T * C, t, C,
             hs, NH);
    }
}

// Backward (gpt.h's formulas): dP = dY V^T, dV = P^T dY, the softmax
// backward kernel gives dS (scale folded in), dQ = dS K, dK = dS^T Q.
// dp is fp32 scratch (B*NH*T*T); ds may be the same buffer in fp32 mode.
template <typename Act>
static void attention_backward(const gpu_ctx *x, Act *dqkv, float *dp, Act *ds, const Act *dout, const Act *qkv,
                               const Act *att, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    cudaDataType t = cuda_type<Act>();
    for (int b = 0; b < B; b++) {
        const Act *v = qkv + (size_t)b * T * C3 + 2 * C, *dy = dout + (size_t)b * T * C, *p = att + b * NH * TT;
        Act *dv = dqkv + (size_t)b * T * C3 + 2 * C;
        gemm(x, t, false, true, T, T, hs, dy, C, hs, v, C3, hs, 0.0f, dp + b * NH * TT, CUDA_R_32F, T, TT, NH);
        gemm(x, t, true, false, T, hs, T, p, T, TT, dy, C, hs, 0.0f, dv, t, C3, hs, NH);
    }
    int rows = B * NH * T;
    softmax_backward_kernel<Act><<<blocks_for((size_t)rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK * WARP, 0, x->stream>>>(
        ds, dp, att, rows, T, 1.0f / sqrtf((float)hs));
    launched("softmax_backward_kernel");
    for (int b = 0; b < B; b++) {
        const Act *q = qkv + (size_t)b * T * C3, *k = q + C, *dsb = ds + b * NH * TT;
        Act *dq = dqkv + (size_t)b * T * C3, *dk = dq + C;
        gemm(x, t, false, false, T, hs, T, dsb, T, TT, k, C3, hs, 0.0f, dq, t, C3, hs, NH);
        gemm(x, t, true, false, T, hs, T, dsb, T, TT, q, C3, hs, 0.0f, dk, t, C3, hs, NH);
    }
}

// ===================================================================== 5. flash attention
//
// The same attention as section 4, in ONE launch per layer for all
// sequences and heads, and without the T x T matrices (FlashAttention, Dao
// et al. 2022; the backward pass is organised as in FlashAttention-2). The
// cuBLAS path writes the scores, the probabilities and, backward, dP and dS
// to memory: 4 B NH T^2 numbers per layer, 400 million for GPT-2 small at
// batch 8 x 1024, most of the layer's memory traffic. This path reads q, k,
// v (and dy) and writes y, dq, dk, dv, plus one number per row: the row's
// log-sum-exp lse, from which the backward pass rebuilds any probability,
// p_ts = exp(s_ts - lse_t), instead of storing it.
//
// Forward, one thread per query row t of one (sequence, head): it keeps its
// query q and its output accumulator o in registers and walks over keys
// 0..t in tiles of FLASH_TILE rows. The block's threads load each tile of K
// and V into shared memory together (every row of the block needs the same
// keys: one load serves FLASH_ROWS rows). Per tile, the online softmax:
//     s_j = q . k_j * scale                    this tile's scores
//     m'  = max(m, max_j s_j)                  the running maximum
//     l   = l * exp(m - m') + sum_j exp(s_j - m')
//     o   = o * exp(m - m') + sum_j exp(s_j - m') v_j
// (rescaling by exp(m - m') keeps every exponent <= 0, as the softmax's
// max subtraction does). At the end y = o / l and lse = m + log(l).
//
// The math is fp32 whatever Act is: tiles are widened to fp32 as they are
// loaded. Head sizes up to FLASH_MAX_HS: the kernels are compiled for a few
// sizes HS, and a head of hs < HS channels is padded with zeros (which add
// nothing to a dot product); larger heads use the cuBLAS path.
//
// What this kernel is not: FlashAttention's tensor-core version. Its
// products run on the CUDA cores in fp32, one row per thread; tensor cores
// (mma instructions over warp-wide tiles) are the next step, and which path
// is faster at a given size is for the benchmark to say.
#define FLASH_ROWS 64   // rows a block owns = its threads
#define FLASH_TILE 32   // rows of the other operand per tile in shared memory
#define FLASH_MAX_HS 128

// `#pragma unroll` for nvcc, so that the per-thread arrays below stay in
// registers; g++ (the emulated GPU's compiler) does not know the pragma.
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

// The head size the kernels are compiled for that fits hs; 0: none does.
static int flash_head_size(int hs) { return hs <= 32 ? 32 : hs <= 64 ? 64 : hs <= FLASH_MAX_HS ? FLASH_MAX_HS : 0; }

// Rows r0 .. r0 + FLASH_TILE - 1 of a (T, hs) slice of rows `ld` numbers
// apart, into shared memory as fp32 times `scale`; rows past T and channels
// past hs become 0. All threads of the block share the work, consecutive
// threads reading consecutive channels.
template <int HS, typename Act>
static __device__ void load_tile(float (*tile)[HS], const Act *src, int ld, int r0, int T, int hs, float scale) {
    for (int e = threadIdx.x; e < FLASH_TILE * HS; e += blockDim.x) {
        int r = e / HS, c = e % HS;
        tile[r][c] = r0 + r < T && c < hs ? to_f(src[(size_t)(r0 + r) * ld + c]) * scale : 0.0f;
    }
}

// One row of a (T, hs) slice into registers, zero-padded to HS.
template <int HS, typename Act>
static __device__ __forceinline__ void load_row(float *dst, const Act *src, int hs, float scale) {
    UNROLL for (int c = 0; c < HS; c++) dst[c] = c < hs ? to_f(src[c]) * scale : 0.0f;
}

template <int HS> static __device__ __forceinline__ float dot(const float *a, const float *b) {
    float s = 0.0f;
    UNROLL for (int c = 0; c < HS; c++) s += a[c] * b[c];
    return s;
}

// One tile of the online softmax for one query row that sees the first n
// keys of the tile (n < FLASH_TILE only on the diagonal: the causal mask).
template <int HS>
static __device__ __forceinline__ void attend_tile(const float *q, float *o, float &m, float &l,
                                                   const float (*k)[HS], const float (*v)[HS], int n) {
    float s[FLASH_TILE], tile_max = -INFINITY;
    UNROLL for (int j = 0; j < FLASH_TILE; j++) {
        s[j] = j < n ? dot<HS>(q, k[j]) : -INFINITY;
        tile_max = fmaxf(tile_max, s[j]);
    }
    float m_new = fmaxf(m, tile_max), rescale = expf(m - m_new); // 0 on the first tile (m = -inf)
    l *= rescale;
    UNROLL for (int c = 0; c < HS; c++) o[c] *= rescale;
    UNROLL for (int j = 0; j < FLASH_TILE; j++) {
        if (j >= n) continue;
        float p = expf(s[j] - m_new);
        l += p;
        UNROLL for (int c = 0; c < HS; c++) o[c] += p * v[j][c];
    }
    m = m_new;
}

// Where a block works: blockIdx.x is the (sequence, head), blockIdx.y
// picks FLASH_ROWS rows. Threads whose row is past T still load tiles and
// meet the barriers; they read row T - 1 (harmlessly) and store nothing.
struct flash_block {
    int b, h, bh, first; // sequence, head, b * NH + h, the block's first row
};

static __device__ flash_block flash_where(int NH, bool last_rows_first) {
    flash_block w;
    w.bh = blockIdx.x, w.b = w.bh / NH, w.h = w.bh % NH;
    int tile = last_rows_first ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
    w.first = tile * FLASH_ROWS;
    return w;
}

// Forward: out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C). The last
// query rows see the most keys, so their blocks are started first.
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    flash_forward_kernel(Act *out, float *lse, const Act *qkv, int T, int C, int NH, float scale) {
    __shared__ float k_tile[FLASH_TILE][HS];
    __shared__ float v_tile[FLASH_TILE][HS];
    flash_block w = flash_where(NH, true);
    int hs = C / NH, C3 = 3 * C, t = w.first + threadIdx.x, r = min(t, T - 1);
    bool mine = t < T;
    const Act *q_in = qkv + (size_t)w.b * T * C3 + w.h * hs, *k_in = q_in + C, *v_in = q_in + 2 * C;
    float q[HS], o[HS], m = -INFINITY, l = 0.0f;
    load_row<HS>(q, q_in + (size_t)r * C3, hs, scale);
    UNROLL for (int c = 0; c < HS; c++) o[c] = 0.0f;
    int last = min(T, w.first + FLASH_ROWS) - 1; // the block's last row sees keys 0..last
    for (int j0 = 0; j0 <= last; j0 += FLASH_TILE) {
        load_tile<HS>(k_tile, k_in, C3, j0, T, hs, 1.0f);
        load_tile<HS>(v_tile, v_in, C3, j0, T, hs, 1.0f);
        __syncthreads();
        if (mine && j0 <= t) attend_tile<HS>(q, o, m, l, k_tile, v_tile, min(FLASH_TILE, t - j0 + 1));
        __syncthreads(); // everyone is done with the tile before the next one overwrites it
    }
    if (!mine) return; // no barrier follows
    Act *y = out + ((size_t)w.b * T + t) * C + w.h * hs;
    UNROLL for (int c = 0; c < HS; c++) if (c < hs) y[c] = from_f<Act>(o[c] / l);
    lse[(size_t)w.bh * T + t] = m + logf(l);
}

// Backward, with p_ts = exp(s_ts - lse_t) rebuilt from the saved lse:
//     dp_ts = dy_t . v_s                  dP = dY V^T
//     ds_ts = p_ts (dp_ts - D_t)          the softmax's backward, where
//     D_t   = sum_s p_ts dp_ts = dy_t . y_t   (one dot product per row)
//     dq_t  = scale sum_s ds_ts k_s,  dk_s = scale sum_t ds_ts q_t,  dv_s = sum_t p_ts dy_t
// dq sums over keys, dk and dv over queries. Two kernels, so that each
// thread owns what it sums and no atomics are needed: this one gives a
// thread a query row (as the forward pass) and computes dq and D; the next
// gives a thread a key row and computes dk and dv from the D saved here.
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    flash_backward_dq_kernel(Act *dqkv, float *delta, const Act *qkv, const Act *out, const Act *dout,
                             const float *lse, int T, int C, int NH, float scale) {
    __shared__ float k_tile[FLASH_TILE][HS];
    __shared__ float v_tile[FLASH_TILE][HS];
    flash_block w = flash_where(NH, true);
    int hs = C / NH, C3 = 3 * C, t = w.first + threadIdx.x, r = min(t, T - 1);
    bool mine = t < T;
    const Act *q_in = qkv + (size_t)w.b * T * C3 + w.h * hs, *k_in = q_in + C, *v_in = q_in + 2 * C;
    size_t yrow = ((size_t)w.b * T + r) * C + w.h * hs;
    float q[HS], dy[HS], dq[HS], D = 0.0f, row_lse = lse[(size_t)w.bh * T + r];
    load_row<HS>(q, q_in + (size_t)r * C3, hs, scale);
    load_row<HS>(dy, dout + yrow, hs, 1.0f);
    UNROLL for (int c = 0; c < HS; c++) if (c < hs) D += dy[c] * to_f(out[yrow + c]); // no registers for y
    UNROLL for (int c = 0; c < HS; c++) dq[c] = 0.0f;
    int last = min(T, w.first + FLASH_ROWS) - 1;
    for (int j0 = 0; j0 <= last; j0 += FLASH_TILE) {
        load_tile<HS>(k_tile, k_in, C3, j0, T, hs, 1.0f);
        load_tile<HS>(v_tile, v_in, C3, j0, T, hs, 1.0f);
        __syncthreads();
        int n = mine ? min(FLASH_TILE, t - j0 + 1) : 0;
        for (int j = 0; j < n; j++) {
            float p = expf(dot<HS>(q, k_tile[j]) - row_lse), ds = p * (dot<HS>(dy, v_tile[j]) - D);
            UNROLL for (int c = 0; c < HS; c++) dq[c] += ds * k_tile[j][c];
        }
        __syncthreads();
    }
    if (!mine) return;
    Act *dq_out = dqkv + (size_t)w.b * T * C3 + (size_t)t * C3 + w.h * hs;
    UNROLL for (int c = 0; c < HS; c++) if (c < hs) dq_out[c] = from_f<Act>(dq[c] * scale);
    delta[(size_t)w.bh * T + t] = D;
}

// dk and dv: one thread per key row s, which queries s..T-1 see. Tiles of
// queries (q pre-scaled, dy, lse, D) go through shared memory. The first
// keys are seen by the most queries, and their blocks come first anyway.
// A thread holds four rows of HS numbers (k, v, dk, dv): at HS = 64 that
// is more than a thread's 255 registers, and the compiler keeps some in
// local memory (cached in L1). Measuring what that costs is the
// benchmark's job.
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    flash_backward_dkv_kernel(Act *dqkv, const Act *qkv, const Act *dout, const float *lse, const float *delta,
                              int T, int C, int NH, float scale) {
    __shared__ float q_tile[FLASH_TILE][HS];
    __shared__ float dy_tile[FLASH_TILE][HS];
    __shared__ float lse_tile[FLASH_TILE];
    __shared__ float delta_tile[FLASH_TILE];
    flash_block w = flash_where(NH, false);
    int hs = C / NH, C3 = 3 * C, s = w.first + threadIdx.x, r = min(s, T - 1);
    bool mine = s < T;
    const Act *q_in = qkv + (size_t)w.b * T * C3 + w.h * hs, *dy_in = dout + (size_t)w.b * T * C + w.h * hs;
    float k[HS], v[HS], dk[HS], dv[HS];
    load_row<HS>(k, q_in + C + (size_t)r * C3, hs, 1.0f);
    load_row<HS>(v, q_in + 2 * C + (size_t)r * C3, hs, 1.0f);
    UNROLL for (int c = 0; c < HS; c++) dk[c] = dv[c] = 0.0f;
    const float *row_lse = lse + (size_t)w.bh * T, *row_delta = delta + (size_t)w.bh * T;
    for (int t0 = w.first; t0 < T; t0 += FLASH_TILE) {
        load_tile<HS>(q_tile, q_in, C3, t0, T, hs, scale);
        load_tile<HS>(dy_tile, dy_in, C, t0, T, hs, 1.0f);
        if (threadIdx.x < FLASH_TILE) {
            int t = t0 + threadIdx.x;
            lse_tile[threadIdx.x] = t < T ? row_lse[t] : 0.0f;
            delta_tile[threadIdx.x] = t < T ? row_delta[t] : 0.0f;
        }
        __syncthreads();
        int from = mine ? max(0, s - t0) : FLASH_TILE, to = min(FLASH_TILE, T - t0); // queries t >= s only
        for (int i = from; i < to; i++) {
            float p = expf(dot<HS>(q_tile[i], k) - lse_tile[i]), ds = p * (dot<HS>(dy_tile[i], v) - delta_tile[i]);
            UNROLL for (int c = 0; c < HS; c++) {
                dv[c] += p * dy_tile[i][c];
                dk[c] += ds * q_tile[i][c]; // q_tile holds q * scale
            }
        }
        __syncthreads();
    }
    if (!mine) return;
    Act *dk_out = dqkv + (size_t)w.b * T * C3 + (size_t)s * C3 + C + w.h * hs, *dv_out = dk_out + C;
    UNROLL for (int c = 0; c < HS; c++) {
        if (c >= hs) continue;
        dk_out[c] = from_f<Act>(dk[c]);
        dv_out[c] = from_f<Act>(dv[c]);
    }
}

// The launches: a grid of (B * NH, row blocks), FLASH_ROWS threads each.
static dim3 flash_grid(int B, int T, int NH) { return dim3((unsigned)(B * NH), blocks_for((size_t)T, FLASH_ROWS)); }

template <typename Act, int HS>
static void flash_forward(const gpu_ctx *x, Act *out, float *lse, const Act *qkv, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    flash_forward_kernel<Act, HS><<<flash_grid(B, T, NH), FLASH_ROWS, 0, x->stream>>>(out, lse, qkv, T, C, NH, scale);
    launched("flash_forward_kernel");
}

template <typename Act, int HS>
static void flash_backward(const gpu_ctx *x, Act *dqkv, float *delta, const Act *dout, const Act *qkv,
                           const Act *out, const float *lse, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 grid = flash_grid(B, T, NH);
    flash_backward_dq_kernel<Act, HS><<<grid, FLASH_ROWS, 0, x->stream>>>(dqkv, delta, qkv, out, dout, lse, T, C,
                                                                          NH, scale);
    launched("flash_backward_dq_kernel");
    flash_backward_dkv_kernel<Act, HS><<<grid, FLASH_ROWS, 0, x->stream>>>(dqkv, qkv, dout, lse, delta, T, C, NH,
                                                                           scale);
    launched("flash_backward_dkv_kernel");
}

// Forward: out and lse (B * NH * T floats, kept for the backward pass).
template <typename Act>
static void flash_attention_forward(const gpu_ctx *x, Act *out, float *lse, const Act *qkv, int B, int T, int C,
                                    int NH) {
    switch (flash_head_size(C / NH)) {
    case 32: flash_forward<Act, 32>(x, out, lse, qkv, B, T, C, NH); break;
    case 64: flash_forward<Act, 64>(x, out, lse, qkv, B, T, C, NH); break;
    case FLASH_MAX_HS: flash_forward<Act, FLASH_MAX_HS>(x, out, lse, qkv, B, T, C, NH); break;
    default: die("flash attention: heads of %d channels are more than %d", C / NH, FLASH_MAX_HS);
    }
}

// Backward: dqkv (overwritten) from dout, with out and lse of the forward
// pass; delta is B * NH * T floats of scratch.
template <typename Act>
static void flash_attention_backward(const gpu_ctx *x, Act *dqkv, float *delta, const Act *dout, const Act *qkv,
                                     const Act *out, const float *lse, int B, int T, int C, int NH) {
    switch (flash_head_size(C / NH)) {
    case 32: flash_backward<Act, 32>(x, dqkv, delta, dout, qkv, out, lse, B, T, C, NH); break;
    case 64: flash_backward<Act, 64>(x, dqkv, delta, dout, qkv, out, lse, B, T, C, NH); break;
    case FLASH_MAX_HS: flash_backward<Act, FLASH_MAX_HS>(x, dqkv, delta, dout, qkv, out, lse, B, T, C, NH); break;
    default: die("flash attention: heads of %d channels are more than %d", C / NH, FLASH_MAX_HS);
    }
}

// ===================================================================== 6. the model

// The parameter table is gpt_layout.h's, the same as gpt.h's: wte, wpe,
// then per block the twelve tensors B_LN1_W ... B_FCPROJ_B, then ln_f.

// AdamW updates every tensor in ONE launch (section 7). The flat parameter
// array is cut into chunks of at most ADAM_CHUNK numbers that never straddle
// two tensors; block b of the launch updates chunk b, and the chunk's entry
// in this table (built once, copied to the device at create) says whether
// its tensor is decayed. One launch instead of one per tensor: 1 instead of
// 12 per layer + 4 (148 for GPT-2 small).
typedef struct {
    size_t offset;  // first parameter of the chunk
    unsigned count; // at most ADAM_CHUNK
    unsigned decay; // 1 for matrices (weight decay), 0 for vectors
} adam_chunk;

static const unsigned ADAM_CHUNK = 4096; // 16 numbers for each of a block's 256 threads

// Fills out (NULL: only counts); returns the number of chunks.
static int build_adam_chunks(const gpt_tensor *tensors, int num_tensors, adam_chunk *out) {
    int n = 0;
    for (int t = 0; t < num_tensors; t++)
        for (size_t done = 0; done < tensors[t].count; done += ADAM_CHUNK, n++) {
            size_t left = tensors[t].count - done;
            if (out) out[n] = adam_chunk{tensors[t].offset + done, (unsigned)(left < ADAM_CHUNK ? left : ADAM_CHUNK),
                                         tensors[t].decay ? 1u : 0u};
        }
    return n;
}

// --- the vocabulary, padded. The LM head is a product with wte, a V x C
// matrix. GPT-2's V = 50257 is odd: cuBLAS computes in tiles of 64 or 128
// rows and columns, so the last tile is mostly waste, and rows of 50257
// logits do not start on 16-byte boundaries, which its fastest kernels
// need. So the LM head computes Vp = V rounded up to a multiple of 64
// logits per token (50304 for GPT-2). The extra Vp - V rows of the matrix
// must be zeros somewhere, yet the parameter layout must stay gpt.h's (wpe
// follows wte directly; snapshots and the gradient buckets depend on it).
// So they go IN FRONT of wte: the parameters, their gradients and the bf16
// copy are allocated with head_pad = (Vp - V) * C zeros before the flat
// array, and "padding rows, then wte" is one Vp x C matrix (lm_head()).
// Its padding logits come first in each row of logits; the loss kernels
// skip them and give them gradient 0, so the padding rows' gradient is 0
// too, and AdamW, which works on the flat array, never touches them.
static int padded_vocab(int V) { return (V + 63) / 64 * 64; }

static size_t head_pad(const gpt_config *c) {
    return (size_t)(padded_vocab(c->vocab_size) - c->vocab_size) * c->n_embd;
}

// What changes from step to step but must not change a CUDA graph of the
// step (section 10): the host writes it into device memory before each replay.
typedef struct {
    float lr, c1, c2; // AdamW's learning rate and bias corrections 1 - beta^t of this step
} step_scalars;

// The numbers a training step produces for the host - the loss and the
// gradient norm - stay in device memory, in this struct, where kernels
// write them. The host reads them only when it asks (gpt_cuda_loss,
// gpt_cuda_grad_norm), so a step never waits for the GPU: the host queues
// the next step while the GPU still computes this one.
typedef struct {
    double loss_sum;  // the mean losses of the forward passes since gpt_cuda_take_loss
    float loss;       // the mean loss of the last forward pass with targets
    float grad_norm;  // from the last gpt_cuda_clip_grad_norm
    float clip_scale; // 1, or max_norm / norm when clipping: the next AdamW multiplies the gradients by it
    step_scalars step; // graph steps: this step's AdamW scalars, copied in before the graph's launch
    double square_sum; // a pipeline stage's sum of squared gradients (gpt_cuda_grad_square_sum)
    gpt_scaler scaler; // fp16 mode: the loss scale, kept and updated here (section 7)
} device_scalars;

// Which attention a model uses: the flash kernels (the default), or the
// cuBLAS path, the readable reference, with GPT_CUDA_ATTENTION=cublas in
// the environment when the model is created. Heads of more than
// FLASH_MAX_HS channels always take the cuBLAS path.
static bool use_flash(const gpt_config *c) {
    const char *choice = getenv("GPT_CUDA_ATTENTION");
    bool fits = flash_head_size(c->n_embd / c->n_head) > 0;
    if (!choice || !*choice) return fits;
    if (!strcmp(choice, "cublas")) return false;
    if (strcmp(choice, "flash") != 0) die("GPT_CUDA_ATTENTION is '%s': use flash or cublas", choice);
    if (!fits)
        die("GPT_CUDA_ATTENTION=flash: the flash kernels take heads of up to %d channels, this model's have %d",
            FLASH_MAX_HS, c->n_embd / c->n_head);
    return true;
}

// The activations live in two buffers, one per kind of gpt_layout.h:
// acts (Act: bf16 or float) and stats (float). Each holds the part outside
// the blocks first, then block 0, 1, ...; stats also keeps each position's
// log-sum-exp of the logits (N floats, for the loss's backward pass) after
// the head's part. Which of the attention's activations a block keeps
// depends on the path: the probabilities (cuBLAS) or the log-sum-exps (flash).
static size_t head_stats(const gpt_config *c, size_t N) { return gpt_head_acts_size(c, GPT_STAT, N, 1) + N; }

// A pipeline stage keeps the activations of several micro-batches, one
// slot each (gpt_cuda_use_slot): the buffers of the slots not in use wait
// here. The slot in use is acts, stats, logits, inputs and targets below.
typedef struct {
    void *acts;
    float *stats, *logits;
    uint16_t *inputs;
    int B, T;
    bool have_targets;
} cuda_slot;

struct gpt_cuda {
    gpt_config cfg;
    gpt_stage stage;  // the blocks and ends held here (gpt_layout.h, section 6)
    gpt_precision precision; // of the activations and the weights' copy (gpt_layout.h)
    bool flash;       // the attention path (use_flash)
    int max_B, max_T; // what the buffers were sized for
    int B, T;         // the last forward pass
    size_t num_params;
    int Vp;          // the vocabulary padded to a multiple of 64 (the logits per token)
    size_t head_pad; // (Vp - V) * C zeros in front of wte in params, grads and params_lp
    int num_tensors;
    gpt_tensor *tensors;
    int num_adam_chunks;
    adam_chunk *adam_chunks; // device: AdamW's table
    gpu_ctx ctx;

    float *params, *grads, *adam_m, *adam_v; // fp32, num_params each (params, grads: head_pad more in front)
    void *params_lp;                         // 16-bit modes: the copy the products read (head_pad more in front)
    void *acts;       // Act: the head's, then each block's (gpt_layout.h, kind GPT_ACT)
    float *stats;     // fp32: the head's and the loss's log-sum-exps, then each block's (GPT_STAT)
    float *logits;    // (N, Vp) fp32
    void *dlogits;    // (N, Vp) Act; the logits buffer itself in fp32 mode
    float *scores;    // flash: backward's D (NH*N); cuBLAS, bf16 mode: fp32 scores, then dP (B*NH*T*T)
    void *dscores;    // cuBLAS: Act (B*NH*T*T): dS (and dP in fp32 mode)
    void *grad_acts;  // Act: dres (NC), dtmp (NC), dqkv (3NC), dhidden (4NC)
    uint16_t *inputs, *targets;     // device
    uint16_t *tokens_host;          // pinned staging for inputs and targets (2 x max_B x max_T)
    cudaEvent_t tokens_copied;      // the staging buffer's last copy has run: it may be refilled
    double *norm_partials;
    device_scalars *scalars;        // loss, loss sum, gradient norm, clip scale: on the device
    int losses_summed;              // forward passes with targets since gpt_cuda_take_loss
    bool clip_pending;              // the next AdamW applies scalars->clip_scale

    int num_buckets;
    gpt_bucket *buckets;
    cudaEvent_t *bucket_events;
    void *grads_16bit;         // --grad_compress bf16 or fp16: what the buckets travel in (first use)

    int adam_step;
    bool have_targets, have_loss, have_norm;
    size_t allocated;
    struct step_graph *graph; // section 10: the captured step (NULL until the first gpt_cuda_graph_step)

    // Tensor parallelism (section 9): this model is a shard of each block
    // over tp ranks (1: the whole model), and adds up partial sums across
    // them with the caller's tp_all_reduce.
    int tp;
    gpt_cuda_tp_fn tp_all_reduce;
    void *tp_user;
    unsigned char *chunk_split; // device, per AdamW chunk: 1 if its tensor is split (gradient norm)
    double *tp_norm;            // device: 2 partial sums per norm block, then the two sums

    cuda_slot *slots; // pipeline stages: the slots not in use; NULL otherwise
    int num_slots, slot;
    size_t slot_bytes; // the device memory of one slot

    // Sharded training (chapter 09; gpt_cuda_create_keeping): what of the
    // training state this model holds, and the hook that gives it the rest
    // bucket by bucket. Without a flat parameter array a bf16 model makes
    // bf16 copies of a bucket's weights as it computes it: of the
    // embeddings (head_pad zeros, then wte: the LM head) and of one block.
    // A sharded model is always a whole model (no stages, tp 1).
    bool keeps_params, keeps_grads, keeps_adam;
    gpt_cuda_bucket_hook hook;
    void *hook_user;
    void *bucket_lp[2];
    size_t allocated_parts[6];        // gpt_cuda_memory_parts
    struct slice_chunk *slice_chunks; // device: gpt_cuda_adamw_slices's table, for the slices in slices_key
    int num_slice_chunks, num_slices_key;
    gpt_cuda_slice *slices_key;
    double *sum_squares;              // device: gpt_cuda_sum_squares's result
    struct gpu_cp *cp;                // context parallelism (chapter 12): gpt_cuda_cp.cuh
    struct moe_cuda *moe;             // a mixture of experts' buffers (gpt_cuda_moe.cuh); NULL: dense
};
#include "gpt_cuda_moe.cuh" // chapter 13: the mixture of experts in the MLP's place
#include "gpt_cuda_cp.cuh" // chapter 12: attention across the ranks that hold a sequence

// Section 9's graph of a training step, and what it was captured for.
typedef struct {
    int B, T;
    float max_norm, beta1, beta2, eps, weight_decay;
} step_graph_shape;

struct step_graph {
    cudaGraphExec_t exec;   // NULL until the first capture
    step_graph_shape shape; // what the capture baked into the kernels' arguments
    size_t nodes;           // operations the graph holds
    bool capturing;         // between cudaStreamBeginCapture and cudaStreamEndCapture
    step_scalars *host;     // pinned: the next step's scalars, copied to scalars->step
    cudaEvent_t copied;     // that copy has run: host may be refilled
};
static void step_graph_free(struct step_graph *sg);

// --- the memory plan: gpt_cuda_memory_needed and gpt_cuda_create share it.
typedef struct {
    size_t params, grads, adam, params_lp, acts, stats, logits, dlogits, scores, dscores, grad_acts, tokens,
        partials, chunks, scalars, workspace, bucket_lp, moe;
} memory_plan;

// What of the training state a model holds (all of it, but in chapter 09).
typedef struct {
    bool params, grads, adam;
} state_kept;
static const state_kept keep_all = {true, true, true};

static const int NORM_BLOCKS = 264; // two per SM of an H100: enough to fill it, few partials to add

// A pipeline stage (s) plans for its blocks only, and only the last stage
// for the logits and the LM head's padding; a tensor-parallel shard (tp)
// for its part of each block; a sharded model (chapter 09) without the
// state it does not keep.
static memory_plan plan_memory(const gpt_config *c, const gpt_stage *s, int tp, int B, int T, gpt_precision precision, bool flash,
                               size_t num_params, state_kept keep) {
    size_t N = (size_t)B * T, Vp = s->head ? (size_t)padded_vocab(c->vocab_size) : 0;
    bool lowp = precision != GPT_FP32; // 16-bit activations, and a 16-bit copy of the weights
    size_t L = (size_t)(s->last - s->first), act = lowp ? 2 : 4;
    size_t att = flash ? 0 : gpt_block_act_size_tp(c, tp, A_ATT, (size_t)B, (size_t)T);
    size_t padded = num_params + (s->head ? head_pad(c) : 0);
    memory_plan p;
    p.params = p.grads = padded * 4;
    p.adam = 2 * num_params * 4;
    p.params_lp = lowp ? padded * 2 : 0;
    p.acts = (gpt_head_acts_size(c, GPT_ACT, N, 1) + L * gpt_block_acts_size_tp(c, tp, GPT_ACT, flash, (size_t)B, (size_t)T)) * act;
    p.stats = (head_stats(c, N) + L * gpt_block_acts_size_tp(c, tp, GPT_STAT, flash, (size_t)B, (size_t)T)) * 4;
    p.logits = N * Vp * 4;
    p.dlogits = lowp ? N * Vp * 2 : 0;
    p.scores = flash ? gpt_block_act_size_tp(c, tp, A_ATT_LSE, (size_t)B, (size_t)T) * 4 : lowp ? att * 4 : 0;
    p.dscores = att * act;
    p.grad_acts = gpt_grad_acts_size_tp(c, tp, (size_t)B, (size_t)T) * act;
    p.tokens = 2 * N * sizeof(uint16_t);
    p.partials = NORM_BLOCKS * sizeof(double);
    p.scalars = sizeof(device_scalars);
    // At most one chunk per ADAM_CHUNK parameters plus one partial chunk per tensor.
    p.chunks = (num_params / ADAM_CHUNK + (size_t)gpt_num_tensors(c)) * sizeof(adam_chunk);
    p.workspace = CUBLAS_WORKSPACE_BYTES;
    p.moe = moe_plan_bytes(c, L, N, act); // a mixture of experts' routing, rows and scratch
    // Chapter 09: the state the caller keeps in slices is not allocated here.
    p.bucket_lp = 0;
    if (!keep.params) {
        p.params = p.params_lp = 0;
        p.bucket_lp = lowp ? (head_pad(c) + (size_t)c->vocab_size * c->n_embd + gpt_block_params_tp(c, tp)) * 2 : 0;
    }
    if (!keep.grads) p.grads = 0;
    if (!keep.adam) p.adam = p.chunks = 0;
    return p;
}

static size_t plan_total(const memory_plan *p) {
    return p->params + p->grads + p->adam + p->params_lp + p->acts + p->stats + p->logits + p->dlogits + p->scores +
           p->dscores + p->grad_acts + p->tokens + p->partials + p->chunks +
           p->scalars + p->workspace + p->bucket_lp + p->moe;
}

extern "C" size_t gpt_cuda_memory_needed(const gpt_config *cfg, int B, int T, gpt_precision precision) {
    gpt_stage whole = gpt_stage_of(cfg, 0, 1);
    memory_plan p = plan_memory(cfg, &whole, 1, B, T, precision, use_flash(cfg), gpt_num_params(cfg), keep_all);
    return plan_total(&p);
}

static void *device_buffer(gpt_cuda_t *g, size_t bytes, const char *what) {
    if (bytes == 0) return NULL;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess)
        die("cudaMalloc of %.1f MiB for the model's %s failed: %s (%.1f MiB allocated before it)",
            bytes / 1048576.0, what, cudaGetErrorString(err), g->allocated / 1048576.0);
    g->allocated += bytes;
    return p;
}

// --- views of the buffers for the current batch (B, T), as gpt.h's
template <typename Act> struct block_acts {
    Act *ln1, *qkv, *att, *atty, *res2, *ln2, *fch, *fch_gelu, *res3; // att: cuBLAS attention only
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *att_lse;       // att_lse: flash attention only
};

template <typename Act> struct head_acts {
    Act *encoded, *scratch, *lnf;
    float *lnf_mean, *lnf_rstd, *losses, *lse;
};

template <typename Act> struct grad_acts { Act *dres, *dtmp, *dqkv, *dhidden; };

// Block `layer`'s activations: one carve loop over gpt_layout.h's table,
// each activation into the buffer of its kind.
template <typename Act> static block_acts<Act> block_view(const gpt_cuda_t *g, int layer) {
    size_t B = (size_t)g->B, T = (size_t)g->T, N = B * T;
    block_acts<Act> a = {};
    Act **act[GPT_BLOCK_ACTS] = {&a.ln1, NULL, NULL, &a.qkv, &a.att, NULL, &a.atty, &a.res2, &a.ln2, NULL, NULL,
                                 &a.fch, &a.fch_gelu, &a.res3};
    float **stat[GPT_BLOCK_ACTS] = {NULL, &a.ln1_mean, &a.ln1_rstd, NULL, NULL, &a.att_lse, NULL, NULL, NULL,
                                    &a.ln2_mean, &a.ln2_rstd, NULL, NULL, NULL};
    size_t index = (size_t)(layer - g->stage.first); // a pipeline stage keeps its own blocks only
    Act *next_act = (Act *)g->acts + gpt_head_acts_size(&g->cfg, GPT_ACT, N, 1) +
                    index * gpt_block_acts_size_tp(&g->cfg, g->tp, GPT_ACT, g->flash, B, T);
    float *next_stat = g->stats + head_stats(&g->cfg, N) +
                       index * gpt_block_acts_size_tp(&g->cfg, g->tp, GPT_STAT, g->flash, B, T);
    for (int i = 0; i < GPT_BLOCK_ACTS; i++) {
        if (!gpt_block_act_kept(i, g->flash)) continue;
        size_t n = gpt_block_act_size_tp(&g->cfg, g->tp, i, B, T);
        if (gpt_block_acts_layout[i].kind == GPT_ACT) *act[i] = next_act, next_act += n;
        else *stat[i] = next_stat, next_stat += n;
    }
    return a;
}

template <typename Act> static head_acts<Act> head_view(const gpt_cuda_t *g) {
    size_t N = (size_t)g->B * g->T;
    head_acts<Act> h = {};
    Act **act[GPT_HEAD_ACTS] = {&h.encoded, &h.scratch, &h.lnf, NULL, NULL, NULL};
    float **stat[GPT_HEAD_ACTS] = {NULL, NULL, NULL, &h.lnf_mean, &h.lnf_rstd, &h.losses};
    Act *next_act = (Act *)g->acts;
    float *next_stat = g->stats;
    for (int i = 0; i < GPT_HEAD_ACTS; i++) {
        size_t n = gpt_head_act_size(&g->cfg, i, N, 1);
        if (gpt_head_acts_kind[i] == GPT_ACT) *act[i] = next_act, next_act += n;
        else *stat[i] = next_stat, next_stat += n;
    }
    h.lse = next_stat; // the loss's log-sum-exps, N of them
    return h;
}

template <typename Act> static grad_acts<Act> grad_view(const gpt_cuda_t *g) {
    grad_acts<Act> v;
    Act **slot[GPT_GRAD_ACTS] = {&v.dres, &v.dtmp, &v.dqkv, &v.dhidden};
    Act *next = (Act *)g->grad_acts;
    for (int i = 0; i < GPT_GRAD_ACTS; i++) {
        *slot[i] = next;
        next += gpt_grad_act_size_tp(&g->cfg, g->tp, i, (size_t)g->B, (size_t)g->T);
    }
    return v;
}

// The weights the matrix products read: the fp32 master or its 16-bit copy.
template <typename Act> static const Act *weights(const gpt_cuda_t *g) {
    return g->params_lp ? (const Act *)(const void *)g->params_lp : (const Act *)(const void *)g->params;
}

// The LM head's Vp x C matrix in a flat array (parameters, their bf16
// copy, gradients): the padding rows in front of wte, then wte.
template <typename T> static T *lm_head(const gpt_cuda_t *g, T *flat) { return flat - g->head_pad; }

// Where tensor i of block `layer` lies in the block's part of a flat array.
// (this model's own table: a tp shard's and a pipeline stage's too).
static size_t off(const gpt_cuda_t *g, int layer, int i) {
    return g->tensors[gpt_block_tensor(&g->cfg, layer, i)].offset - g->tensors[gpt_block_tensor(&g->cfg, layer, 0)].offset;
}

// A pipeline stage's first block reads `encoded` too: the previous stage's
// output is received there (gpt_cuda_stage_input).
template <typename Act> static const Act *block_input(const gpt_cuda_t *g, int layer) {
    return layer == g->stage.first ? head_view<Act>(g).encoded : block_view<Act>(g, layer - 1).res3;
}

// fp32 mode computes the scores in place in att and needs no extra buffer.
template <typename Act> static float *scores_buffer(const gpt_cuda_t *g, Act *att) {
    return g->precision != GPT_FP32 ? g->scores : (float *)(void *)att;
}

static void tp_sum(gpt_cuda_t *g, void *buf, size_t count);
template <typename Act>
static void residual_bias_forward(const gpu_ctx *x, Act *out, const Act *a, const Act *b, const float *bias, int N, int C);

// A row-parallel layer's output (scratch) joins the residual stream: out =
// a + scratch. With tp > 1 scratch holds this rank's partial sum without
// the bias: the ranks add them up first (g), then the bias is added once.
template <typename Act>
static void residual_after_row_parallel(gpt_cuda_t *g, Act *out, const Act *a, Act *scratch, const float *bias, int N,
                                        int C) {
    if (g->tp == 1) {
        residual_forward(&g->ctx, out, a, scratch, (size_t)N * C);
        return;
    }
    tp_sum(g, scratch, (size_t)N * C); // g
    residual_bias_forward(&g->ctx, out, a, scratch, bias, N, C);
}

// p and w: the block's part of the fp32 parameters and of the weights the
// products read (bucket_weights). With tp > 1 (section 9) this is
// gpt_tp_block_forward: the same steps on this rank's shard - Cs = C/tp
// channels of NH/tp heads, H = 4C/tp hidden units - the row-parallel
// layers' biases left to residual_after_row_parallel.
template <typename Act> static void block_forward(gpt_cuda_t *g, int l, const float *p, const Act *w) {
    int B = g->B, T = g->T, C = g->cfg.n_embd, N = B * T, Cs = C / g->tp, H = 4 * C / g->tp, NHs = g->cfg.n_head / g->tp;
    const gpu_ctx *x = &g->ctx;
    const Act *in = block_input<Act>(g, l);
    block_acts<Act> a = block_view<Act>(g, l);
    Act *scratch = head_view<Act>(g).scratch;
    const float *attproj_b = p + off(g, l, B_ATTPROJ_B), *fcproj_b = p + off(g, l, B_FCPROJ_B);
    layernorm_forward(x, a.ln1, a.ln1_mean, a.ln1_rstd, in, p + off(g, l, B_LN1_W), p + off(g, l, B_LN1_B), N, C);
    matmul_forward(x, a.qkv, a.ln1, w + off(g, l, B_QKV_W), p + off(g, l, B_QKV_B), N, C, 3 * Cs);
    if (g->cp && g->cp->active) cp_attention_forward(g->cp, x, l, a.atty, a.att_lse, a.qkv, B, C, g->cfg.n_head);
    else if (g->flash) flash_attention_forward(x, a.atty, a.att_lse, a.qkv, B, T, Cs, NHs);
    else attention_forward(x, a.atty, a.att, scores_buffer(g, a.att), a.qkv, B, T, Cs, NHs);
    matmul_forward(x, scratch, a.atty, w + off(g, l, B_ATTPROJ_W), g->tp == 1 ? attproj_b : NULL, N, Cs, C);
    residual_after_row_parallel(g, a.res2, in, scratch, attproj_b, N, C);
    layernorm_forward(x, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + off(g, l, B_LN2_W), p + off(g, l, B_LN2_B), N, C);
    if (g->moe) return moe_forward(g, l, p, w, a.ln2, a.res2, a.res3); // experts in the MLP's place, residual included
    matmul_forward(x, a.fch, a.ln2, w + off(g, l, B_FC_W), p + off(g, l, B_FC_B), N, C, H);
    gelu_forward(x, a.fch_gelu, a.fch, (size_t)N * H);
    matmul_forward(x, scratch, a.fch_gelu, w + off(g, l, B_FCPROJ_W), g->tp == 1 ? fcproj_b : NULL, N, H, C);
    residual_after_row_parallel(g, a.res3, a.res2, scratch, fcproj_b, N, C);
}

// Where bucket k starts in this model's flat array: at its first tensor
// (the model's own table, so in a tp shard or a pipeline stage too).
static size_t bucket_start(const gpt_cuda_t *g, int k) {
    int L = g->cfg.n_layer;
    int first = k == GPT_BUCKET_LN_F ? gpt_ln_f_tensor(&g->cfg) : k <= L ? gpt_block_tensor(&g->cfg, L - k, 0) : 0;
    return g->tensors[first].offset;
}

// Bucket k's fp32 parameters (and, with grads, its gradients): the flat
// arrays from where the bucket starts, unless the hook points them
// elsewhere (gpt_layout.h, section 3; gpt_cuda_set_bucket_hook).
static void bucket_begin(gpt_cuda_t *g, gpt_bucket_event event, int k, float **params, float **grads) {
    size_t start = bucket_start(g, k);
    *params = g->params ? g->params + start : NULL;
    if (grads) *grads = g->grads ? g->grads + start : NULL;
    if (g->hook) g->hook(g->hook_user, event, k, params, grads, NULL);
}

// The pass is done with bucket k: the hook gets an event recorded after its last kernel.
static void bucket_end(gpt_cuda_t *g, gpt_bucket_event event, int k) {
    if (!g->hook) return;
    CHECK_CUDA(cudaEventRecord(g->bucket_events[k], g->ctx.stream));
    g->hook(g->hook_user, event, k, NULL, NULL, g->bucket_events[k]);
}

// The weights the products of bucket k read, whose fp32 parameters are p:
// p itself in fp32; in bf16 the flat bf16 copy, or, for parameters that
// came from the hook, a bf16 copy made now (of wte only, for the
// embeddings: the encoder reads fp32). The copy is queued on the model's
// stream, so the previous bucket's products have read the buffer before.
template <typename Act> static const Act *bucket_weights(gpt_cuda_t *g, int k, const float *p) {
    if (g->precision == GPT_FP32) return (const Act *)(const void *)p;
    if (g->params_lp) return (const Act *)g->params_lp + bucket_start(g, k);
    bool emb = k == gpt_bucket_embeddings(&g->cfg);
    Act *copy = emb ? (Act *)g->bucket_lp[0] + g->head_pad : (Act *)g->bucket_lp[1];
    convert(g->ctx.stream, copy, p, emb ? (size_t)g->cfg.vocab_size * g->cfg.n_embd : gpt_layout_bucket(&g->cfg, k).count);
    return (const Act *)(const void *)copy;
}

// A pipeline stage computes its part: the embeddings on the first stage
// only, its own blocks, the head on the last stage only. The embeddings'
// bucket is read on the first stage (the encoder) and the last (the LM
// head: tied weights).
template <typename Act> static void model_forward(gpt_cuda_t *g, bool with_targets) {
    int B = g->B, T = g->T, C = g->cfg.n_embd, V = g->cfg.vocab_size, Vp = g->Vp, L = g->stage.last, N = B * T;
    int emb = gpt_bucket_embeddings(&g->cfg);
    const gpu_ctx *x = &g->ctx;
    head_acts<Act> h = head_view<Act>(g);
    size_t wpe = g->tensors[1].offset - g->tensors[0].offset; // in the embeddings' bucket; ln_f starts its bucket
    bool embedding_bucket = g->stage.embedding || g->stage.head;
    float *pe = NULL, *pb, *pf;
    const Act *we = NULL;
    if (embedding_bucket) {
        bucket_begin(g, GPT_FORWARD_BEGIN, emb, &pe, NULL);
        we = bucket_weights<Act>(g, emb, pe);
    }
    if (g->stage.embedding && g->cp && g->cp->active) cp_encoder_forward(g->cp, x, h.encoded, g->inputs, pe, pe + wpe, B, C);
    else if (g->stage.embedding) encoder_forward(x, h.encoded, g->inputs, pe, pe + wpe, B, T, C);
    for (int l = g->stage.first; l < L; l++) {
        int k = gpt_bucket_of_block(&g->cfg, l);
        bucket_begin(g, GPT_FORWARD_BEGIN, k, &pb, NULL);
        block_forward<Act>(g, l, pb, bucket_weights<Act>(g, k, pb));
        bucket_end(g, GPT_FORWARD_END, k);
    }
    if (!g->stage.head) {
        if (embedding_bucket) bucket_end(g, GPT_FORWARD_END, emb);
        return;
    }
    bucket_begin(g, GPT_FORWARD_BEGIN, GPT_BUCKET_LN_F, &pf, NULL);
    layernorm_forward(x, h.lnf, h.lnf_mean, h.lnf_rstd, block_input<Act>(g, L), pf, pf + C, N, C);
    matmul_forward<Act, float>(x, g->logits, h.lnf, lm_head(g, we), NULL, N, C, Vp); // tied: wte
    if (with_targets) crossentropy_forward(x, h.losses, h.lse, g->logits, g->targets, N, V, Vp);
    bucket_end(g, GPT_FORWARD_END, GPT_BUCKET_LN_F);
    bucket_end(g, GPT_FORWARD_END, emb);
}

static void check_tokens(const gpt_cuda_t *g, const uint16_t *tokens, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= g->cfg.vocab_size)
            die("%s token %u at position %zu is outside the model's vocabulary of %d", what, tokens[i], i,
                g->cfg.vocab_size);
}

// The tokens travel through pinned host memory (cudaMallocHost): from
// ordinary pageable memory CUDA may have to wait for the stream before it
// can copy, from pinned memory the copy is only queued. The staging buffer
// is refilled once its previous copy has run (tokens_copied), which the
// GPU does at the very start of the previous forward pass: the host may
// run a step ahead of the GPU, which is all it needs to keep it busy.
static void upload_tokens(gpt_cuda_t *g, const uint16_t *inputs, const uint16_t *targets, size_t N) {
    cudaStream_t s = g->ctx.stream;
    uint16_t *in = g->tokens_host, *tg = g->tokens_host + (size_t)g->max_B * g->max_T;
    CHECK_CUDA(cudaEventSynchronize(g->tokens_copied));
    if (inputs) { // every stage but the first of a pipeline has none
        memcpy(in, inputs, N * sizeof(uint16_t));
        CHECK_CUDA(cudaMemcpyAsync(g->inputs, in, N * sizeof(uint16_t), cudaMemcpyHostToDevice, s));
    }
    if (targets) {
        memcpy(tg, targets, N * sizeof(uint16_t));
        CHECK_CUDA(cudaMemcpyAsync(g->targets, tg, N * sizeof(uint16_t), cudaMemcpyHostToDevice, s));
    }
    CHECK_CUDA(cudaEventRecord(g->tokens_copied, s));
}

// The mean of the N losses, in double as gpt.h adds them, by one block;
// it becomes scalars->loss and is added to scalars->loss_sum.
static __global__ void mean_loss_kernel(device_scalars *out, const float *losses, int N) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) sum += losses[i];
    sum = block_sum_double(sum);
    if (threadIdx.x == 0) {
        float mean = (float)(sum / N);
        out->loss = mean;
        out->loss_sum += mean;
    }
}

template <typename Act> static float *losses_of(const gpt_cuda_t *g) { return head_view<Act>(g).losses; }

// The forward pass on the tokens already on the device (a graph step
// captures this, without the copy of the tokens).
static void queue_forward(gpt_cuda_t *g, int B, int T, bool with_targets) {
    // The last stage's backward pass starts from the targets; another
    // stage's from the gradient the next stage sends (gpt_cuda_stage_grad).
    g->B = B, g->T = T, g->have_targets = with_targets || !g->stage.head;
    BY_PRECISION(g->precision, model_forward, g, with_targets);
    if (!with_targets) return;
    float *losses = BY_PRECISION(g->precision, losses_of, g);
    mean_loss_kernel<<<1, 256, 0, g->ctx.stream>>>(g->scalars, losses, B * T);
    launched("mean_loss_kernel");
    g->have_loss = true, g->losses_summed++;
}

extern "C" void gpt_cuda_forward(gpt_cuda_t *g, const uint16_t *inputs, const uint16_t *targets, int B, int T) {
    if (B < 1 || T < 1 || B > g->max_B || T > g->max_T)
        die("gpt_cuda_forward: a batch of %d x %d tokens does not fit the %d x %d the GPU model was created for", B,
            T, g->max_B, g->max_T);
    if ((inputs != NULL) != g->stage.embedding || (targets && !g->stage.head))
        die("gpt_cuda_forward: stage %d of %d takes %s", g->stage.index, g->stage.count,
            g->stage.embedding ? "input tokens" : "no input tokens, and targets only if it is the last");
    size_t N = (size_t)B * T;
    if (inputs) check_tokens(g, inputs, N, "input");
    if (targets) check_tokens(g, targets, N, "target");
    upload_tokens(g, inputs, targets, N);
    queue_forward(g, B, T, targets != NULL);
}

// One number from the device. This is where the host waits for the GPU.
template <typename T> static T read_scalar(gpt_cuda_t *g, const T *dev) {
    T value;
    CHECK_CUDA(cudaMemcpyAsync(&value, dev, sizeof(T), cudaMemcpyDeviceToHost, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
    return value;
}

extern "C" float gpt_cuda_loss(gpt_cuda_t *g) {
    if (!g->have_loss) die("gpt_cuda_loss: no gpt_cuda_forward with targets yet");
    return read_scalar(g, &g->scalars->loss);
}

extern "C" float gpt_cuda_take_loss(gpt_cuda_t *g, int *count) {
    double sum = read_scalar(g, &g->scalars->loss_sum);
    int n = g->losses_summed;
    CHECK_CUDA(cudaMemsetAsync(&g->scalars->loss_sum, 0, sizeof(double), g->ctx.stream));
    g->losses_summed = 0;
    if (count) *count = n;
    return n ? (float)(sum / n) : 0.0f;
}

extern "C" void gpt_cuda_logits(gpt_cuda_t *g, int b, int t, float *out_host) {
    if (b < 0 || t < 0 || b >= g->B || t >= g->T) die("gpt_cuda_logits: (%d, %d) is outside the last batch", b, t);
    size_t V = (size_t)g->cfg.vocab_size, Vp = (size_t)g->Vp; // the padding comes first in a row
    CHECK_CUDA(cudaMemcpyAsync(out_host, g->logits + ((size_t)b * g->T + t) * Vp + (Vp - V), V * sizeof(float),
                               cudaMemcpyDeviceToHost, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
}

// The block's backward pass, in the reverse order of its forward pass,
// exactly as gpt_block_backward. On entry dres = d(loss)/d(res3); on return d(loss)/d(x).
// p, w, d: the block's part of the fp32 parameters, of the weights the
// products read and of the gradients. With tp > 1 (section 9) it is
// gpt_tp_block_backward: the same steps on this rank's shard - Cs = C/tp
// channels of NH/tp heads, H = 4C/tp hidden units - and the input
// gradients of the two column-parallel layers summed over the tp ranks
// (f). With tp 1 those are C, NH and 4C, and nothing is summed.
template <typename Act> static void block_backward(gpt_cuda_t *g, int l, const float *p, const Act *w, float *d) {
    int B = g->B, T = g->T, C = g->cfg.n_embd, N = B * T, Cs = C / g->tp, H = 4 * C / g->tp, NHs = g->cfg.n_head / g->tp;
    const gpu_ctx *x = &g->ctx;
    block_acts<Act> a = block_view<Act>(g, l);
    grad_acts<Act> ga = grad_view<Act>(g);
    float *dp = g->precision != GPT_FP32 ? g->scores : (float *)g->dscores; // cuBLAS attention's scratch
    Act *ds = (Act *)g->dscores;

    if (g->moe) moe_backward(g, l, w, d, a.ln2, ga.dres, ga.dtmp); // a mixture of experts' (gpt_cuda_moe.cuh)
    else {
        matmul_backward(x, ga.dhidden, d + off(g, l, B_FCPROJ_W), d + off(g, l, B_FCPROJ_B), ga.dres, a.fch_gelu,
                        w + off(g, l, B_FCPROJ_W), N, H, C);
        gelu_backward(x, ga.dhidden, a.fch, ga.dhidden, (size_t)N * H);
        matmul_backward(x, ga.dtmp, d + off(g, l, B_FC_W), d + off(g, l, B_FC_B), ga.dhidden, a.ln2,
                        w + off(g, l, B_FC_W), N, C, H);
        if (g->tp > 1) tp_sum(g, ga.dtmp, (size_t)N * C); // f
    }
    layernorm_backward(x, ga.dres, d + off(g, l, B_LN2_W), d + off(g, l, B_LN2_B), ga.dtmp, a.res2, p + off(g, l, B_LN2_W),
                       a.ln2_mean, a.ln2_rstd, N, C);
    matmul_backward(x, ga.dtmp, d + off(g, l, B_ATTPROJ_W), d + off(g, l, B_ATTPROJ_B), ga.dres, a.atty,
                    w + off(g, l, B_ATTPROJ_W), N, Cs, C);
    if (g->cp && g->cp->active)
        cp_attention_backward(g->cp, x, l, ga.dqkv, g->scores, ga.dtmp, a.qkv, a.atty, a.att_lse, B, C, g->cfg.n_head);
    else if (g->flash) flash_attention_backward(x, ga.dqkv, g->scores, ga.dtmp, a.qkv, a.atty, a.att_lse, B, T, Cs, NHs);
    else attention_backward(x, ga.dqkv, dp, ds, ga.dtmp, a.qkv, a.att, B, T, Cs, NHs);
    matmul_backward(x, ga.dtmp, d + off(g, l, B_QKV_W), d + off(g, l, B_QKV_B), ga.dqkv, a.ln1, w + off(g, l, B_QKV_W), N,
                    C, 3 * Cs);
    if (g->tp > 1) tp_sum(g, ga.dtmp, (size_t)N * C); // f
    layernorm_backward(x, ga.dres, d + off(g, l, B_LN1_W), d + off(g, l, B_LN1_B), ga.dtmp, block_input<Act>(g, l),
                       p + off(g, l, B_LN1_W), a.ln1_mean, a.ln1_rstd, N, C);
}

// Bucket i's gradients are final once the work queued so far has run:
// record that moment and tell the caller.
static void bucket_done(gpt_cuda_t *g, int i, gpt_cuda_bucket_fn fn, void *user) {
    if (!fn) return;
    CHECK_CUDA(cudaEventRecord(g->bucket_events[i], g->ctx.stream));
    fn(user, &g->buckets[i], g->bucket_events[i]);
}

// A pipeline stage other than the last starts from d(loss)/d(its output),
// received into dres (gpt_cuda_stage_grad); one other than the first ends
// with d(loss)/d(its input) there. The buckets are the whole model's.
template <typename Act> static void model_backward(gpt_cuda_t *g, float grad_scale, gpt_cuda_bucket_fn fn, void *user) {
    int B = g->B, T = g->T, C = g->cfg.n_embd, V = g->cfg.vocab_size, Vp = g->Vp, L = g->stage.last, N = B * T;
    int emb = gpt_bucket_embeddings(&g->cfg), F = GPT_BUCKET_LN_F;
    const gpu_ctx *x = &g->ctx;
    head_acts<Act> h = head_view<Act>(g);
    grad_acts<Act> ga = grad_view<Act>(g);
    size_t wpe = g->tensors[1].offset - g->tensors[0].offset; // in the embeddings' bucket
    Act *dlogits = (Act *)g->dlogits;
    bool embedding_bucket = g->stage.embedding || g->stage.head;
    float *pf = NULL, *df = NULL, *pe = NULL, *de = NULL, *pb, *db;
    const Act *we = NULL;
    if (g->stage.head) bucket_begin(g, GPT_BACKWARD_BEGIN, F, &pf, &df);
    if (embedding_bucket) {
        bucket_begin(g, GPT_BACKWARD_BEGIN, emb, &pe, &de);
        we = bucket_weights<Act>(g, emb, pe);
    }

    if (g->stage.head) {
        crossentropy_backward(x, dlogits, g->logits, h.lse, g->targets, N, V, Vp, grad_scale / (float)N,
                              g->precision == GPT_FP16 ? &g->scalars->scaler.scale : NULL);
        matmul_backward<Act>(x, ga.dtmp, lm_head(g, de), NULL, dlogits, h.lnf, lm_head(g, we), N, C, Vp); // adds into dwte
        CHECK_CUDA(cudaMemsetAsync(ga.dres, 0, sizeof(Act) * (size_t)N * C, x->stream));
        layernorm_backward(x, ga.dres, df, df + C, ga.dtmp, block_input<Act>(g, L), pf, h.lnf_mean, h.lnf_rstd, N, C);
        bucket_done(g, F, fn, user);
        bucket_end(g, GPT_BACKWARD_END, F);
    }
    for (int l = L - 1; l >= g->stage.first; l--) {
        int k = gpt_bucket_of_block(&g->cfg, l);
        bucket_begin(g, GPT_BACKWARD_BEGIN, k, &pb, &db);
        block_backward<Act>(g, l, pb, bucket_weights<Act>(g, k, pb), db);
        bucket_done(g, k, fn, user);
        bucket_end(g, GPT_BACKWARD_END, k);
    }
    if (g->stage.embedding && g->cp && g->cp->active) cp_encoder_backward(g->cp, x, de, de + wpe, ga.dres, g->inputs, B, C);
    else if (g->stage.embedding) encoder_backward(x, de, de + wpe, ga.dres, g->inputs, B, T, C);
    if (embedding_bucket) {
        bucket_done(g, emb, fn, user);
        bucket_end(g, GPT_BACKWARD_END, emb);
    }
}

extern "C" void gpt_cuda_backward(gpt_cuda_t *g, float grad_scale, gpt_cuda_bucket_fn bucket_ready, void *user) {
    if (!g->have_targets) die("gpt_cuda_backward needs a gpt_cuda_forward with targets just before it");
    if (bucket_ready && g->stage.count > 1) die("gpt_cuda_backward: a pipeline stage has no gradient buckets");
    g->have_targets = false; // in fp32 mode the logits have become dlogits
    if (g->moe) g->moe->grad_scale = grad_scale; // the balancing loss's gradient scales as the cross-entropy's
    BY_PRECISION(g->precision, model_backward, g, grad_scale, bucket_ready, user);
}

extern "C" uint16_t *gpt_cuda_grads_16bit(gpt_cuda_t *g) {
    if (!g->grads_16bit) {
        CHECK_CUDA(cudaMalloc(&g->grads_16bit, g->num_params * sizeof(uint16_t)));
        g->allocated += g->num_params * sizeof(uint16_t);
    }
    return (uint16_t *)g->grads_16bit;
}

extern "C" void gpt_cuda_round_grads(gpt_cuda_t *g, size_t offset, size_t n, bool fp16, cudaEvent_t done) {
    uint16_t *wire = gpt_cuda_grads_16bit(g) + offset;
    if (fp16) convert(g->ctx.stream, (f16 *)wire, g->grads + offset, n);
    else convert(g->ctx.stream, (bf16 *)wire, g->grads + offset, n);
    CHECK_CUDA(cudaEventRecord(done, g->ctx.stream));
}

extern "C" void gpt_cuda_widen_grads(gpt_cuda_t *g, bool fp16) {
    if (fp16) convert(g->ctx.stream, g->grads, (const f16 *)gpt_cuda_grads_16bit(g), g->num_params);
    else convert(g->ctx.stream, g->grads, (const bf16 *)gpt_cuda_grads_16bit(g), g->num_params);
}

extern "C" void gpt_cuda_zero_grad(gpt_cuda_t *g) {
    if (!g->grads) die("gpt_cuda_zero_grad: this model keeps no gradient array (the bucket hook gives it one bucket at a time)");
    CHECK_CUDA(cudaMemsetAsync(g->grads, 0, g->num_params * sizeof(float), g->ctx.stream));
}

// --- creating and freeing

static void check_config(const gpt_config *c, int B, int T) {
    if (c->vocab_size < 2 || c->vocab_size > 65536 || c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 ||
        c->n_embd % c->n_head != 0 || c->block_size < 1)
        die("gpt_cuda_create: bad model configuration (vocab %d, block %d, layers %d, heads %d, channels %d)",
            c->vocab_size, c->block_size, c->n_layer, c->n_head, c->n_embd);
    if (B < 1 || T < 1 || T > c->block_size)
        die("gpt_cuda_create: a batch of %d x %d tokens does not fit the model (block_size %d)", B, T, c->block_size);
}

// Fail before allocating anything, with the numbers a user can act on.
static void check_fits(const gpt_config *c, int B, int T, gpt_precision precision, size_t need) {
    size_t free_bytes = 0, total_bytes = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (need > free_bytes)
        die("the GPT (%d layers x %d channels, batch %d x %d, %s) needs %.1f GiB, the GPU has %.1f GiB free "
            "(of %.1f GiB); use a smaller batch_size or block_size%s",
            c->n_layer, c->n_embd, B, T, gpt_precision_name(precision), need / 1073741824.0,
            free_bytes / 1073741824.0, total_bytes / 1073741824.0, precision != GPT_FP32 ? "" : ", or --precision bf16");
}

// A flat array with head_pad elements in front (NULL when it is not kept).
template <typename T> static T *after_head_pad(gpt_cuda_t *g, size_t bytes, const char *what) {
    T *p = (T *)device_buffer(g, bytes, what);
    return p ? p + g->head_pad : NULL;
}

// What one forward pass keeps: the slot in use (gpt_cuda_use_slot).
static void allocate_slot(gpt_cuda_t *g, const memory_plan *p) {
    g->acts = device_buffer(g, p->acts, "activations");
    g->stats = (float *)device_buffer(g, p->stats, "LayerNorm statistics and losses");
    g->logits = (float *)device_buffer(g, p->logits, "logits");
    g->dlogits = g->precision != GPT_FP32 ? g->dlogits : (void *)g->logits; // fp32 mode: the logits become their gradient
    g->inputs = (uint16_t *)device_buffer(g, p->tokens, "tokens");
    g->targets = g->inputs + (size_t)g->max_B * g->max_T;
    g->slot_bytes = p->acts + p->stats + p->logits + p->tokens;
}

static void allocate_buffers(gpt_cuda_t *g, const memory_plan *p) {
    if (p->dlogits) g->dlogits = device_buffer(g, p->dlogits, "logit gradients"); // scratch: one for all slots
    g->params = after_head_pad<float>(g, p->params, "parameters");
    g->grads = after_head_pad<float>(g, p->grads, "gradients");
    g->adam_m = (float *)device_buffer(g, p->adam / 2, "AdamW first moments");
    g->adam_v = (float *)device_buffer(g, p->adam / 2, "AdamW second moments");
    if (p->params_lp) g->params_lp = after_head_pad<uint16_t>(g, p->params_lp, "16-bit weight copy");
    if (p->bucket_lp) {
        uint16_t *lp = (uint16_t *)device_buffer(g, p->bucket_lp, "16-bit copies of a bucket's weights");
        g->bucket_lp[0] = lp, g->bucket_lp[1] = lp + g->head_pad + (size_t)g->cfg.vocab_size * g->cfg.n_embd;
    }
    g->allocated_parts[0] = p->params + p->params_lp, g->allocated_parts[1] = p->grads;
    g->allocated_parts[2] = p->adam;
    g->allocated_parts[3] = p->acts + p->stats + p->logits + p->dlogits + p->scores + p->dscores + p->grad_acts + p->tokens;
    g->allocated_parts[4] = p->partials + p->chunks + p->scalars + p->workspace, g->allocated_parts[5] = p->bucket_lp;
    allocate_slot(g, p);
    g->scores = (float *)device_buffer(g, p->scores, "attention scores");
    g->dscores = device_buffer(g, p->dscores, "attention score gradients");
    g->grad_acts = device_buffer(g, p->grad_acts, "activation gradients");
    g->norm_partials = (double *)device_buffer(g, p->partials, "gradient-norm partial sums");
    g->adam_chunks = (adam_chunk *)device_buffer(g, p->chunks, "AdamW chunk table");
    g->scalars = (device_scalars *)device_buffer(g, p->scalars, "loss and gradient norm");
    g->ctx = ctx_create(g->ctx.stream, device_buffer(g, p->workspace, "cuBLAS workspace"));
}

// The LM head's padding rows are zeros (a zero row's logit is 0, and its
// gradient, times the zero gradient of that logit, stays 0).
static void zero_head_padding(gpt_cuda_t *g) {
    cudaStream_t s = g->ctx.stream;
    if (g->params) CHECK_CUDA(cudaMemsetAsync(lm_head(g, g->params), 0, g->head_pad * sizeof(float), s));
    if (g->params_lp) CHECK_CUDA(cudaMemsetAsync(lm_head(g, (uint16_t *)g->params_lp), 0, g->head_pad * 2, s));
    if (g->bucket_lp[0]) CHECK_CUDA(cudaMemsetAsync(g->bucket_lp[0], 0, g->head_pad * 2, s));
}

static void upload_adam_chunks(gpt_cuda_t *g) {
    adam_chunk *table = (adam_chunk *)xmalloc(sizeof(adam_chunk) * (size_t)g->num_adam_chunks);
    build_adam_chunks(g->tensors, g->num_tensors, table);
    CHECK_CUDA(cudaMemcpyAsync(g->adam_chunks, table, sizeof(adam_chunk) * (size_t)g->num_adam_chunks,
                               cudaMemcpyHostToDevice, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // before the host buffer goes
    free(table);
}

static void refresh_lp_copy(gpt_cuda_t *g) {
    if (!g->params_lp) return;
    if (g->precision == GPT_FP16) convert(g->ctx.stream, (f16 *)g->params_lp, g->params, g->num_params);
    else convert(g->ctx.stream, (bf16 *)g->params_lp, g->params, g->num_params);
}

static void tp_setup(gpt_cuda_t *g);
static void ep_norm_setup(gpt_cuda_t *g);

// Every model is created here: a pipeline stage of tp shards that keeps
// `keep` of the training state. gpt_cuda_create is stage 0 of 1, tp 1,
// keeping all; gpt_cuda_create_keeping a whole model that keeps less.
static gpt_cuda_t *create(const gpt_config *cfg, const gpt_stage *stage, int tp, const float *params_host, int B, int T,
                          gpt_precision precision, state_kept keep) {
    check_config(cfg, B, T);
    const char *problem = gpt_tp_problem(cfg, tp);
    if (problem) die("gpt_cuda_create_tp: cannot split the model over %d ranks: %s", tp, problem);
    // fp16's loss scale lives in the whole-model step (clip_grad_norm, then
    // AdamW); the sharded, tensor- and pipeline-parallel steps train in bf16.
    bool whole = stage->first == 0 && stage->last == cfg->n_layer && stage->embedding && stage->head;
    if (precision == GPT_FP16 && (tp > 1 || !whole || !keep.params || !keep.grads || !keep.adam))
        die("fp16 is built for a whole model on each GPU (chapter 08); sharded, tensor- and pipeline-parallel "
            "models train in bf16 or fp32 here");
    moe_check(cfg, precision);
    gpt_cuda_t *g = (gpt_cuda_t *)xcalloc(1, sizeof *g);
    g->keeps_params = keep.params, g->keeps_grads = keep.grads, g->keeps_adam = keep.adam;
    g->cfg = *cfg, g->stage = *stage, g->precision = precision, g->max_B = g->B = B, g->max_T = g->T = T, g->tp = tp;
    g->num_tensors = gpt_num_tensors(cfg);
    g->tensors = (gpt_tensor *)xmalloc(sizeof(gpt_tensor) * (size_t)g->num_tensors);
    g->num_params = gpt_layout_stage_params(cfg, stage, tp, g->tensors);
    g->Vp = padded_vocab(cfg->vocab_size), g->head_pad = stage->head ? head_pad(cfg) : 0;
    g->num_adam_chunks = build_adam_chunks(g->tensors, g->num_tensors, NULL);
    g->flash = use_flash(cfg);
    memory_plan plan = plan_memory(cfg, stage, tp, B, T, precision, g->flash, g->num_params, keep);
    check_fits(cfg, B, T, precision, plan_total(&plan));
    CHECK_CUDA(cudaStreamCreateWithFlags(&g->ctx.stream, cudaStreamNonBlocking));
    allocate_buffers(g, &plan);
    CHECK_CUDA(cudaMallocHost(&g->tokens_host, plan.tokens));
    CHECK_CUDA(cudaEventCreateWithFlags(&g->tokens_copied, cudaEventDisableTiming));
    g->num_buckets = gpt_layout_buckets_tp(cfg, tp, NULL, 0);
    g->buckets = (gpt_bucket *)xmalloc(sizeof(gpt_bucket) * (size_t)g->num_buckets);
    gpt_layout_buckets_tp(cfg, tp, g->buckets, g->num_buckets);
    g->bucket_events = (cudaEvent_t *)xmalloc(sizeof(cudaEvent_t) * (size_t)g->num_buckets);
    for (int i = 0; i < g->num_buckets; i++)
        CHECK_CUDA(cudaEventCreateWithFlags(&g->bucket_events[i], cudaEventDisableTiming));
    if (g->adam_m) upload_adam_chunks(g);
    if (tp > 1) tp_setup(g);
    if (cfg->n_expert && gpt_ep_ways(cfg->ep) > 1) ep_norm_setup(g); // chapter 13: the experts' squares apart
    g->moe = moe_create(cfg, stage->last - stage->first, B, T, precision != GPT_FP32 ? 2 : 4, &g->allocated);
    zero_head_padding(g);
    if (g->params) gpt_cuda_set_params(g, params_host);
    if (g->grads) CHECK_CUDA(cudaMemsetAsync(lm_head(g, g->grads), 0, plan.grads, g->ctx.stream));
    if (g->adam_m) CHECK_CUDA(cudaMemsetAsync(g->adam_m, 0, plan.adam / 2, g->ctx.stream));
    if (g->adam_v) CHECK_CUDA(cudaMemsetAsync(g->adam_v, 0, plan.adam / 2, g->ctx.stream));
    CHECK_CUDA(cudaMemsetAsync(g->scalars, 0, plan.scalars, g->ctx.stream));
    if (precision == GPT_FP16) gpt_cuda_set_scaler(g, gpt_scaler{GPT_CUDA_SCALE_INIT, 0, 0, 0});
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
    return g;
}

extern "C" gpt_cuda_t *gpt_cuda_create(const gpt_config *cfg, const float *params_host, int B, int T, gpt_precision precision) {
    gpt_stage whole = gpt_stage_of(cfg, 0, 1);
    return create(cfg, &whole, 1, params_host, B, T, precision, keep_all);
}

extern "C" gpt_cuda_t *gpt_cuda_create_tp(const gpt_config *cfg, int tp, const float *params_host, int B, int T,
                                          gpt_precision precision) {
    gpt_stage whole = gpt_stage_of(cfg, 0, 1);
    return create(cfg, &whole, tp, params_host, B, T, precision, keep_all);
}

extern "C" gpt_cuda_t *gpt_cuda_create_stage(const gpt_config *cfg, const gpt_stage *stage, int tp,
                                             const float *params_host, int B, int T, gpt_precision precision) {
    return create(cfg, stage, tp, params_host, B, T, precision, keep_all);
}

// Sharded training keeps parts of the state in slices of its own, over
// the data-parallel ranks of a whole model: it does not combine with
// tensor or pipeline parallelism (chapters 10, 11) here.
extern "C" gpt_cuda_t *gpt_cuda_create_keeping(const gpt_config *cfg, const float *params_host, int B, int T,
                                               gpt_precision precision, bool params, bool grads, bool adam) {
    gpt_stage whole = gpt_stage_of(cfg, 0, 1);
    state_kept keep = {params, grads, adam};
    return create(cfg, &whole, 1, params_host, B, T, precision, keep);
}

extern "C" void gpt_cuda_free(gpt_cuda_t *g) {
    if (!g) return;
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
    CHECK_CUBLAS(cublasDestroy(g->ctx.cublas)); // before its workspace goes
    moe_free(g->moe);
    void *bufs[] = {g->params ? lm_head(g, g->params) : NULL, g->grads ? lm_head(g, g->grads) : NULL, g->adam_m,
                    g->adam_v, g->params_lp ? lm_head(g, (uint16_t *)g->params_lp) : NULL, g->acts, g->stats, g->logits,
                    g->precision != GPT_FP32 ? g->dlogits : NULL, g->scores, g->dscores, g->grad_acts, g->inputs,
                    g->norm_partials, g->adam_chunks, g->scalars, g->ctx.workspace, g->grads_16bit, g->bucket_lp[0],
                    g->slice_chunks, g->sum_squares};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CHECK_CUDA(cudaFree(bufs[i]));
    for (int k = 0; k < g->num_slots; k++) {
        cuda_slot *parked = &g->slots[k];
        void *slot_bufs[] = {parked->acts, parked->stats, parked->logits, parked->inputs};
        for (size_t i = 0; k != g->slot && i < sizeof slot_bufs / sizeof slot_bufs[0]; i++)
            if (slot_bufs[i]) CHECK_CUDA(cudaFree(slot_bufs[i]));
    }
    free(g->slots);
    for (int i = 0; i < g->num_buckets; i++) CHECK_CUDA(cudaEventDestroy(g->bucket_events[i]));
    if (g->chunk_split) CHECK_CUDA(cudaFree(g->chunk_split));
    if (g->tp_norm) CHECK_CUDA(cudaFree(g->tp_norm));
    CHECK_CUDA(cudaStreamDestroy(g->ctx.stream));
    CHECK_CUDA(cudaEventDestroy(g->tokens_copied));
    CHECK_CUDA(cudaFreeHost(g->tokens_host));
    step_graph_free(g->graph);
    cp_free(g->cp);
    free(g->bucket_events), free(g->buckets), free(g->tensors), free(g->slices_key);
    free(g);
}

// --- a pipeline stage's activation slots and the buffers stages exchange

extern "C" void gpt_cuda_use_slot(gpt_cuda_t *g, int k) {
    if (k < 0 || k > 4096) die("gpt_cuda_use_slot: slot %d", k);
    if (!g->slots) g->slots = (cuda_slot *)xcalloc(1, sizeof(cuda_slot)), g->num_slots = 1, g->slot = 0;
    if (k >= g->num_slots) {
        g->slots = (cuda_slot *)realloc(g->slots, sizeof(cuda_slot) * (size_t)(k + 1));
        if (!g->slots) die("out of memory for %d activation slots", k + 1);
        memset(g->slots + g->num_slots, 0, sizeof(cuda_slot) * (size_t)(k + 1 - g->num_slots));
        g->num_slots = k + 1;
    }
    if (k == g->slot) return;
    g->slots[g->slot] = cuda_slot{g->acts, g->stats, g->logits, g->inputs, g->B, g->T, g->have_targets};
    cuda_slot *next = &g->slots[k];
    g->slot = k;
    if (!next->inputs) { // its first use: allocate it, as large as the first slot
        state_kept keep = {g->keeps_params, g->keeps_grads, g->keeps_adam};
        memory_plan plan =
            plan_memory(&g->cfg, &g->stage, g->tp, g->max_B, g->max_T, g->precision, g->flash, g->num_params, keep);
        allocate_slot(g, &plan);
        g->have_targets = false;
        return;
    }
    g->acts = next->acts, g->stats = next->stats, g->logits = next->logits, g->inputs = next->inputs;
    g->targets = g->inputs + (size_t)g->max_B * g->max_T;
    if (g->precision == GPT_FP32) g->dlogits = g->logits;
    g->B = next->B, g->T = next->T, g->have_targets = next->have_targets;
}

extern "C" size_t gpt_cuda_slot_bytes(const gpt_cuda_t *g) {
    int slots = 0;
    for (int k = 0; k < g->num_slots; k++) slots += k == g->slot || g->slots[k].inputs != NULL;
    return (size_t)(slots > 1 ? slots : 1) * g->slot_bytes;
}

extern "C" void *gpt_cuda_stage_input(gpt_cuda_t *g, int B, int T) {
    if (B < 1 || T < 1 || B > g->max_B || T > g->max_T)
        die("gpt_cuda_stage_input: a batch of %d x %d tokens does not fit the %d x %d the GPU model was created for", B,
            T, g->max_B, g->max_T);
    return g->acts; // `encoded`, the first of the activations, whatever the batch
}

template <typename Act> static void *stage_output(const gpt_cuda_t *g, int last) {
    return block_view<Act>(g, last).res3;
}

extern "C" void *gpt_cuda_stage_output(gpt_cuda_t *g) {
    int last = g->stage.last - 1;
    return BY_PRECISION(g->precision, stage_output, g, last);
}

extern "C" void *gpt_cuda_stage_grad(gpt_cuda_t *g) { return g->grad_acts; } // dres, the first of them

extern "C" cudaStream_t gpt_cuda_stream(const gpt_cuda_t *g) { return g->ctx.stream; }
extern "C" size_t gpt_cuda_param_count(const gpt_cuda_t *g) { return g->num_params; }
extern "C" float *gpt_cuda_params_device(gpt_cuda_t *g) { return g->params; }
extern "C" float *gpt_cuda_grads_device(gpt_cuda_t *g) { return g->grads; }
extern "C" size_t gpt_cuda_allocated_bytes(const gpt_cuda_t *g) { return g->allocated; }
extern "C" const char *gpt_cuda_attention(const gpt_cuda_t *g) { return g->flash ? "flash" : "cublas"; }

extern "C" size_t gpt_cuda_device_used_bytes(void) {
    size_t free_bytes = 0, total_bytes = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

// ===================================================================== 7. the optimizer

// The gradient norm, on the device. First, sums of squares in double as
// one partial sum per block: each thread strides through the array
// (grid-stride loop) and the block adds its threads' sums. Then one warp
// adds the partials and decides the clip scale. The order of every
// addition is fixed, so the norm is the same bits every run.
static __global__ void sum_squares_kernel(double *partials, const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    s = block_sum_double(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// GradScaler's update, after the norm of a step's scaled gradients: an
// overflow anywhere (inf or NaN: the norm is not finite) skips the step
// and halves the scale; GPT_CUDA_SCALE_GROWTH clean steps double it.
static __device__ void update_scaler(gpt_scaler *s, bool finite) {
    s->skipped = !finite;
    if (!finite) {
        s->scale *= 0.5f, s->good_steps = 0, s->skipped_total++;
    } else if (++s->good_steps == GPT_CUDA_SCALE_GROWTH) {
        s->scale *= 2.0f, s->good_steps = 0;
    }
}

// As gpt_clip_grad_norm: scale = max_norm / (norm + 1e-6) when the norm
// exceeds max_norm (max_norm <= 0: never). Launched as one warp. With
// `scaled` (fp16 mode) the gradients are loss-scale times too large: the
// norm is divided by it, and so is the clip scale AdamW multiplies by, so
// unscaling costs no pass of its own; then the scaler is updated.
static __global__ void grad_norm_kernel(device_scalars *out, const double *partials, int count, float max_norm,
                                        bool scaled) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += WARP) s += partials[i];
    s = warp_sum_double(s);
    if (threadIdx.x == 0) {
        double loss_scale = scaled ? out->scaler.scale : 1.0, norm = sqrt(s) / loss_scale;
        out->grad_norm = (float)norm;
        double clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
        out->clip_scale = (float)(clip / loss_scale);
        if (scaled) update_scaler(&out->scaler, isfinite(norm));
    }
}

// Clipping without a pass of its own: the norm and the scale are computed
// here, and the next AdamW multiplies each gradient by the scale as it
// reads it (the gradient buffer itself keeps the unclipped values).
extern "C" void gpt_cuda_clip_grad_norm(gpt_cuda_t *g, float max_norm) {
    cudaStream_t s = g->ctx.stream;
    int blocks = (int)blocks_for(g->num_params, 256 * 16); // at least 16 numbers a thread
    if (blocks > NORM_BLOCKS) blocks = NORM_BLOCKS;
    sum_squares_kernel<<<blocks, 256, 0, s>>>(g->norm_partials, g->grads, g->num_params);
    launched("sum_squares_kernel");
    grad_norm_kernel<<<1, WARP, 0, s>>>(g->scalars, g->norm_partials, blocks, max_norm, g->precision == GPT_FP16);
    launched("grad_norm_kernel");
    g->clip_pending = true, g->have_norm = true;
}

// Clipping over the stages of a pipeline, in three steps: each stage sums
// the squares of its gradients [from, num_params) into a double on the
// device (returned: queued, as everything here), the stages add up their
// sums there (an all-reduce), then each clips with the total.
static __global__ void square_sum_kernel(double *out, const double *partials, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += WARP) s += partials[i];
    s = warp_sum_double(s);
    if (threadIdx.x == 0) *out = s;
}

static __global__ void tp_add_partials_kernel(double *sums, const double *partials, int blocks);
static __global__ void tp_sum_squares_kernel(double *partials, const float *x, const adam_chunk *chunks,
                                             const unsigned char *split, int count);

// One double from the two sums of a shard's squares: split, and replicated when counted.
static __global__ void shard_square_sum_kernel(double *out, const double *sums, bool replicated) {
    *out = sums[0] + (replicated ? sums[1] : 0.0);
}

extern "C" double *gpt_cuda_grad_square_sum(gpt_cuda_t *g, size_t from, bool replicated) {
    cudaStream_t s = g->ctx.stream;
    if (g->tp > 1) { // a shard: AdamW's chunks say which tensors are split (tp_setup)
        int first = 0;
        adam_chunk *table = (adam_chunk *)xmalloc(sizeof(adam_chunk) * (size_t)g->num_adam_chunks);
        build_adam_chunks(g->tensors, g->num_tensors, table);
        while (first < g->num_adam_chunks && table[first].offset < from) first++;
        free(table);
        int count = g->num_adam_chunks - first, blocks = count < NORM_BLOCKS ? (count > 0 ? count : 1) : NORM_BLOCKS;
        double *sums = g->tp_norm + 2 * NORM_BLOCKS;
        tp_sum_squares_kernel<<<blocks, 256, 0, s>>>(g->tp_norm, g->grads, g->adam_chunks + first,
                                                      g->chunk_split + first, count);
        launched("tp_sum_squares_kernel");
        tp_add_partials_kernel<<<1, WARP, 0, s>>>(sums, g->tp_norm, blocks);
        launched("tp_add_partials_kernel");
        shard_square_sum_kernel<<<1, 1, 0, s>>>(&g->scalars->square_sum, sums, replicated);
        launched("shard_square_sum_kernel");
        return &g->scalars->square_sum;
    }
    (void)replicated; // the whole of each block: every tensor counts
    size_t n = from < g->num_params ? g->num_params - from : 0;
    int blocks = n ? (int)blocks_for(n, 256 * 16) : 1;
    if (blocks > NORM_BLOCKS) blocks = NORM_BLOCKS;
    sum_squares_kernel<<<blocks, 256, 0, s>>>(g->norm_partials, g->grads + from, n);
    launched("sum_squares_kernel");
    square_sum_kernel<<<1, WARP, 0, s>>>(&g->scalars->square_sum, g->norm_partials, blocks);
    launched("square_sum_kernel");
    return &g->scalars->square_sum;
}

extern "C" void gpt_cuda_clip_grads(gpt_cuda_t *g, float max_norm) {
    grad_norm_kernel<<<1, WARP, 0, g->ctx.stream>>>(g->scalars, &g->scalars->square_sum, 1, max_norm, false);
    launched("grad_norm_kernel");
    g->clip_pending = true, g->have_norm = true;
}

// A kernel, not a copy: it is queued behind the step that reads the scaler.
// Field by field: the struct's 4-byte alignment allows no wider store.
static __global__ void set_scaler_kernel(device_scalars *out, gpt_scaler s) {
    gpt_scaler *d = &out->scaler;
    d->scale = s.scale, d->good_steps = s.good_steps, d->skipped = s.skipped, d->skipped_total = s.skipped_total;
}

extern "C" void gpt_cuda_set_scaler(gpt_cuda_t *g, gpt_scaler s) {
    if (!(s.scale > 0) || !isfinite(s.scale)) die("gpt_cuda_set_scaler: the loss scale must be a positive number, not %g", s.scale);
    set_scaler_kernel<<<1, 1, 0, g->ctx.stream>>>(g->scalars, s);
    launched("set_scaler_kernel");
}

extern "C" gpt_scaler gpt_cuda_get_scaler(gpt_cuda_t *g) { return read_scalar(g, &g->scalars->scaler); }

extern "C" float gpt_cuda_grad_norm(gpt_cuda_t *g) {
    if (!g->have_norm) die("gpt_cuda_grad_norm: no gpt_cuda_clip_grad_norm yet");
    return read_scalar(g, &g->scalars->grad_norm);
}

// One parameter's update: its moments and value, from its gradient g
// (already times the clip scale). Returns the new value. adamw_kernel and
// chapter 09's adamw_slices_kernel share it.
static __device__ __forceinline__ float adamw_update(float *param, float g, float *m, float *v, float decay, float lr,
                                                     float beta1, float beta2, float c1, float c2, float eps) {
    float mi = beta1 * *m + (1.0f - beta1) * g, vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi, *v = vi;
    float p = *param;
    p -= decay * p;
    p -= lr * (mi / c1) / (sqrtf(vi / c2) + eps);
    *param = p;
    return p;
}

// gpt_adamw_step's arithmetic in the same order, on the gradient times
// the clip scale (NULL: no clipping). In a 16-bit mode it also writes the
// parameter's 16-bit copy (Lp), so the next forward pass reads the updated
// weights without another pass over memory. With `step` (a graph step,
// section 10) lr, c1 and c2 are read from the device, not taken from the
// arguments. With `skip` (fp16 mode) a step whose gradients overflowed
// changes nothing. (Its bias corrections c1, c2 still count it, where
// PyTorch's skipped optimizer.step() does not: after the first hundred
// steps both are 1 to within 1e-4 either way.)
template <typename Lp>
static __global__ void adamw_kernel(float *params, Lp *params_lp, const float *grads, float *m, float *v,
                                    const adam_chunk *chunks, const float *clip_scale, const step_scalars *step,
                                    const int *skip, float lr, float beta1, float beta2, float c1, float c2,
                                    float eps, float weight_decay) {
    if (skip && *skip) return;
    if (step) lr = step->lr, c1 = step->c1, c2 = step->c2;
    adam_chunk ch = chunks[blockIdx.x];
    float decay = ch.decay ? lr * weight_decay : 0.0f, scale = clip_scale ? *clip_scale : 1.0f;
    for (unsigned k = threadIdx.x; k < ch.count; k += blockDim.x) {
        size_t i = ch.offset + k;
        float p = adamw_update(&params[i], grads[i] * scale, &m[i], &v[i], decay, lr, beta1, beta2, c1, c2, eps);
        if (params_lp) params_lp[i] = from_f<Lp>(p);
    }
}

extern "C" void gpt_cuda_adamw(gpt_cuda_t *g, float lr, float beta1, float beta2, float eps, float weight_decay) {
    g->adam_step++;
    double c1 = 1 - pow((double)beta1, g->adam_step), c2 = 1 - pow((double)beta2, g->adam_step);
    bool fp16 = g->precision == GPT_FP16;
    if (fp16 && !g->clip_pending)
        die("gpt_cuda_adamw: in fp16 mode the gradients are loss-scaled; gpt_cuda_clip_grad_norm unscales them, "
            "call it first");
    const float *clip = g->clip_pending ? &g->scalars->clip_scale : NULL;
    const step_scalars *from_device = g->graph && g->graph->capturing ? &g->scalars->step : NULL; // section 10
    const int *skip = fp16 ? &g->scalars->scaler.skipped : NULL;
    unsigned blocks = (unsigned)g->num_adam_chunks;
    if (fp16)
        adamw_kernel<f16><<<blocks, 256, 0, g->ctx.stream>>>(g->params, (f16 *)g->params_lp, g->grads, g->adam_m,
                                                              g->adam_v, g->adam_chunks, clip, from_device, skip, lr,
                                                              beta1, beta2, (float)c1, (float)c2, eps, weight_decay);
    else
        adamw_kernel<bf16><<<blocks, 256, 0, g->ctx.stream>>>(g->params, (bf16 *)g->params_lp, g->grads, g->adam_m,
                                                               g->adam_v, g->adam_chunks, clip, from_device, skip, lr,
                                                               beta1, beta2, (float)c1, (float)c2, eps, weight_decay);
    launched("adamw_kernel");
    g->clip_pending = false;
}

// --- AdamW on slices (chapter 09): each slice is parameters [first, first
// + count) of the flat array with buffers of its own. The table cuts them
// in chunks as the model's own table cuts the flat array (at most
// ADAM_CHUNK numbers, never across two tensors), each with its pointers.
struct slice_chunk {
    float *params, *m, *v;
    const float *grads;
    unsigned count, decay;
};

static __global__ void adamw_slices_kernel(const slice_chunk *chunks, float grad_scale, float lr, float beta1,
                                           float beta2, float c1, float c2, float eps, float weight_decay) {
    slice_chunk ch = chunks[blockIdx.x];
    float decay = ch.decay ? lr * weight_decay : 0.0f;
    for (unsigned k = threadIdx.x; k < ch.count; k += blockDim.x)
        adamw_update(&ch.params[k], ch.grads[k] * grad_scale, &ch.m[k], &ch.v[k], decay, lr, beta1, beta2, c1, c2, eps);
}

// Fills out (NULL: only counts); returns the number of chunks.
static int build_slice_chunks(const gpt_cuda_t *g, const gpt_cuda_slice *slices, int n, slice_chunk *out) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        const gpt_cuda_slice *s = &slices[i];
        for (int t = 0; t < g->num_tensors; t++) {
            const gpt_tensor *ten = &g->tensors[t];
            size_t lo = ten->offset > s->first ? ten->offset : s->first;
            size_t hi = ten->offset + ten->count < s->first + s->count ? ten->offset + ten->count : s->first + s->count;
            for (size_t at = lo; at < hi; at += ADAM_CHUNK, count++) {
                size_t k = at - s->first, left = hi - at;
                if (out) out[count] = slice_chunk{s->params + k, s->adam_m + k, s->adam_v + k, s->grads + k,
                                                  (unsigned)(left < ADAM_CHUNK ? left : ADAM_CHUNK), ten->decay ? 1u : 0u};
            }
        }
    }
    return count;
}

extern "C" void gpt_cuda_adamw_slices(gpt_cuda_t *g, const gpt_cuda_slice *slices, int n, int step, float grad_scale,
                                      float lr, float beta1, float beta2, float eps, float weight_decay) {
    // The table is built once, and again only when the slices change.
    bool same = g->num_slices_key == n && !memcmp(g->slices_key, slices, sizeof *slices * (size_t)n);
    if (!same) {
        if (g->slice_chunks) CHECK_CUDA(cudaFree(g->slice_chunks));
        g->num_slice_chunks = build_slice_chunks(g, slices, n, NULL);
        slice_chunk *table = (slice_chunk *)xmalloc(sizeof(slice_chunk) * (size_t)(g->num_slice_chunks + 1));
        build_slice_chunks(g, slices, n, table);
        CHECK_CUDA(cudaMalloc(&g->slice_chunks, sizeof(slice_chunk) * (size_t)(g->num_slice_chunks + 1)));
        CHECK_CUDA(cudaMemcpyAsync(g->slice_chunks, table, sizeof(slice_chunk) * (size_t)g->num_slice_chunks,
                                   cudaMemcpyHostToDevice, g->ctx.stream));
        CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // before the host table goes
        free(table);
        free(g->slices_key);
        g->slices_key = (gpt_cuda_slice *)xmalloc(sizeof *slices * (size_t)(n + 1));
        memcpy(g->slices_key, slices, sizeof *slices * (size_t)n);
        g->num_slices_key = n;
    }
    if (g->num_slice_chunks == 0) return;
    double c1 = 1 - pow((double)beta1, step), c2 = 1 - pow((double)beta2, step);
    adamw_slices_kernel<<<g->num_slice_chunks, 256, 0, g->ctx.stream>>>(g->slice_chunks, grad_scale, lr, beta1, beta2,
                                                                        (float)c1, (float)c2, eps, weight_decay);
    launched("adamw_slices_kernel");
}

// One warp adds the partial sums of sum_squares_kernel.
static __global__ void sum_partials_kernel(double *out, const double *partials, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += WARP) s += partials[i];
    s = warp_sum_double(s);
    if (threadIdx.x == 0) *out = s;
}

extern "C" double gpt_cuda_sum_squares(gpt_cuda_t *g, const float *x, size_t n) {
    if (n == 0) return 0.0;
    cudaStream_t s = g->ctx.stream;
    if (!g->sum_squares) g->sum_squares = (double *)device_buffer(g, sizeof(double), "sum of squares");
    int blocks = (int)blocks_for(n, 256 * 16);
    if (blocks > NORM_BLOCKS) blocks = NORM_BLOCKS;
    sum_squares_kernel<<<blocks, 256, 0, s>>>(g->norm_partials, x, n);
    launched("sum_squares_kernel");
    sum_partials_kernel<<<1, WARP, 0, s>>>(g->sum_squares, g->norm_partials, blocks);
    launched("sum_partials_kernel");
    return read_scalar(g, g->sum_squares);
}

static __global__ void add_kernel(float *dst, const float *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

extern "C" void gpt_cuda_add(gpt_cuda_t *g, float *dst, const float *src, size_t n) {
    if (n == 0) return;
    add_kernel<<<blocks_for(n, 256), 256, 0, g->ctx.stream>>>(dst, src, n);
    launched("add_kernel");
}

extern "C" void gpt_cuda_params_changed(gpt_cuda_t *g) { refresh_lp_copy(g); }

extern "C" void gpt_cuda_set_bucket_hook(gpt_cuda_t *g, gpt_cuda_bucket_hook hook, void *user) {
    g->hook = hook, g->hook_user = user;
}

extern "C" size_t gpt_cuda_bucket_front(const gpt_cuda_t *g, int bucket) {
    return bucket == gpt_bucket_embeddings(&g->cfg) ? g->head_pad : 0;
}

extern "C" void gpt_cuda_memory_parts(const gpt_cuda_t *g, size_t parts[6]) {
    memcpy(parts, g->allocated_parts, sizeof g->allocated_parts);
}

// ===================================================================== 8. copies, and layers one at a time

static void copy_in(gpt_cuda_t *g, float *dev, const float *host) {
    CHECK_CUDA(cudaMemcpyAsync(dev, host, g->num_params * sizeof(float), cudaMemcpyHostToDevice, g->ctx.stream));
}

static void copy_out(gpt_cuda_t *g, float *host, const float *dev) {
    CHECK_CUDA(cudaMemcpyAsync(host, dev, g->num_params * sizeof(float), cudaMemcpyDeviceToHost, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
}

// The whole state, where the model keeps it (chapter 09's may not).
static void need(const void *buffer, const char *what) {
    if (!buffer) die("gpt_cuda: this model keeps no %s (it was created without them)", what);
}

extern "C" void gpt_cuda_set_params(gpt_cuda_t *g, const float *host) {
    need(g->params, "parameter array");
    copy_in(g, g->params, host);
    refresh_lp_copy(g);
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // the host buffer may be reused at once
}

extern "C" void gpt_cuda_get_params(gpt_cuda_t *g, float *host) {
    need(g->params, "parameter array");
    copy_out(g, host, g->params);
}

extern "C" void gpt_cuda_get_grads(gpt_cuda_t *g, float *host) {
    need(g->grads, "gradient array");
    copy_out(g, host, g->grads);
}

extern "C" void gpt_cuda_set_grads(gpt_cuda_t *g, const float *host) {
    need(g->grads, "gradient array");
    copy_in(g, g->grads, host);
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
}

extern "C" void gpt_cuda_get_adam(gpt_cuda_t *g, float *m_host, float *v_host, int *step) {
    need(g->adam_m, "AdamW moments");
    copy_out(g, m_host, g->adam_m);
    copy_out(g, v_host, g->adam_v);
    *step = g->adam_step;
}

extern "C" void gpt_cuda_set_adam(gpt_cuda_t *g, const float *m_host, const float *v_host, int step) {
    need(g->adam_m, "AdamW moments");
    copy_in(g, g->adam_m, m_host);
    copy_in(g, g->adam_v, v_host);
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream));
    g->adam_step = step;
}

// --- one layer at a time, for the parity tests. They run on the legacy
// default stream, so plain cudaMemcpy calls are ordered with the kernels.
typedef struct {
    void *ptr[64];
    int count;
    gpu_ctx ctx;
} test_run;

static void *test_alloc(test_run *r, size_t bytes) {
    if (r->count == 64) die("gpt_cuda test: too many buffers");
    CHECK_CUDA(cudaMalloc(&r->ptr[r->count], bytes ? bytes : 1));
    return r->ptr[r->count++];
}

static test_run test_begin(void) {
    test_run r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx_create(0, test_alloc(&r, CUBLAS_WORKSPACE_BYTES));
    return r;
}

static void test_end(test_run *r) {
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUBLAS(cublasDestroy(r->ctx.cublas));
    for (int i = 0; i < r->count; i++) CHECK_CUDA(cudaFree(r->ptr[i]));
}

// Host floats -> device values of type T (rounded to bf16 where T is bf16).
template <typename T> static T *upload(test_run *r, const float *host, size_t n) {
    float *f = (float *)test_alloc(r, n * sizeof(float));
    CHECK_CUDA(cudaMemcpy(f, host, n * sizeof(float), cudaMemcpyHostToDevice));
    if (std::is_same<T, float>::value) return (T *)(void *)f;
    T *t = (T *)test_alloc(r, n * sizeof(T));
    convert(0, t, f, n);
    return t;
}

template <typename T> static T *upload_zeros(test_run *r, size_t n) {
    T *t = (T *)test_alloc(r, n * sizeof(T));
    CHECK_CUDA(cudaMemset(t, 0, n * sizeof(T)));
    return t;
}

static uint16_t *upload_tokens(test_run *r, const uint16_t *host, size_t n) {
    uint16_t *t = (uint16_t *)test_alloc(r, n * sizeof(uint16_t));
    CHECK_CUDA(cudaMemcpy(t, host, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return t;
}

template <typename T> static void download(test_run *r, float *host, const T *dev, size_t n) {
    const float *f = (const float *)(const void *)dev;
    if (!std::is_same<T, float>::value) {
        float *tmp = (float *)test_alloc(r, n * sizeof(float));
        convert(0, tmp, dev, n);
        f = tmp;
    }
    CHECK_CUDA(cudaMemcpy(host, f, n * sizeof(float), cudaMemcpyDeviceToHost));
}

template <typename Act>
static void test_encoder(int B, int T, int C, int V, const uint16_t *tokens, const float *wte, const float *wpe,
                         float *out, const float *dout, float *dwte, float *dwpe) {
    test_run r = test_begin();
    size_t NC = (size_t)B * T * C;
    uint16_t *tok = upload_tokens(&r, tokens, (size_t)B * T);
    Act *o = upload_zeros<Act>(&r, NC), *d = upload<Act>(&r, dout, NC);
    float *w = upload<float>(&r, wte, (size_t)V * C), *p = upload<float>(&r, wpe, (size_t)T * C);
    float *dw = upload<float>(&r, dwte, (size_t)V * C), *dp = upload<float>(&r, dwpe, (size_t)T * C);
    encoder_forward(&r.ctx, o, tok, w, p, B, T, C);
    encoder_backward(&r.ctx, dw, dp, d, tok, B, T, C);
    download(&r, out, o, NC), download(&r, dwte, dw, (size_t)V * C), download(&r, dwpe, dp, (size_t)T * C);
    test_end(&r);
}

extern "C" void gpt_cuda_test_encoder(gpt_precision precision, int B, int T, int C, int V, const uint16_t *tokens,
                                      const float *wte, const float *wpe, float *out, const float *dout, float *dwte,
                                      float *dwpe) {
    BY_PRECISION(precision, test_encoder, B, T, C, V, tokens, wte, wpe, out, dout, dwte, dwpe);
}

template <typename Act>
static void test_layernorm(int N, int C, const float *inp, const float *weight, const float *bias, float *out,
                           float *mean, float *rstd, const float *dout, float *dinp, float *dweight, float *dbias) {
    test_run r = test_begin();
    size_t NC = (size_t)N * C;
    Act *x = upload<Act>(&r, inp, NC), *y = upload_zeros<Act>(&r, NC), *dy = upload<Act>(&r, dout, NC);
    Act *dx = upload<Act>(&r, dinp, NC);
    float *w = upload<float>(&r, weight, C), *b = upload<float>(&r, bias, C);
    float *dw = upload<float>(&r, dweight, C), *db = upload<float>(&r, dbias, C);
    float *m = upload_zeros<float>(&r, N), *s = upload_zeros<float>(&r, N);
    layernorm_forward(&r.ctx, y, m, s, x, w, b, N, C);
    layernorm_backward(&r.ctx, dx, dw, db, dy, x, w, m, s, N, C);
    download(&r, out, y, NC), download(&r, mean, m, N), download(&r, rstd, s, N), download(&r, dinp, dx, NC);
    download(&r, dweight, dw, C), download(&r, dbias, db, C);
    test_end(&r);
}

extern "C" void gpt_cuda_test_layernorm(gpt_precision precision, int N, int C, const float *inp, const float *weight,
                                        const float *bias, float *out, float *mean, float *rstd, const float *dout,
                                        float *dinp, float *dweight, float *dbias) {
    BY_PRECISION(precision, test_layernorm, N, C, inp, weight, bias, out, mean, rstd, dout, dinp, dweight, dbias);
}

template <typename Act>
static void test_matmul(int N, int C, int OC, const float *inp, const float *weight, const float *bias, float *out,
                        const float *dout, float *dinp, float *dweight, float *dbias) {
    test_run r = test_begin();
    Act *x = upload<Act>(&r, inp, (size_t)N * C), *w = upload<Act>(&r, weight, (size_t)OC * C);
    Act *y = upload_zeros<Act>(&r, (size_t)N * OC), *dy = upload<Act>(&r, dout, (size_t)N * OC);
    Act *dx = upload_zeros<Act>(&r, (size_t)N * C);
    float *b = bias ? upload<float>(&r, bias, OC) : NULL, *db = bias ? upload<float>(&r, dbias, OC) : NULL;
    float *dw = upload<float>(&r, dweight, (size_t)OC * C);
    matmul_forward<Act, Act>(&r.ctx, y, x, w, b, N, C, OC);
    matmul_backward(&r.ctx, dx, dw, db, dy, x, w, N, C, OC);
    download(&r, out, y, (size_t)N * OC), download(&r, dinp, dx, (size_t)N * C);
    download(&r, dweight, dw, (size_t)OC * C);
    if (bias) download(&r, dbias, db, OC);
    test_end(&r);
}

extern "C" void gpt_cuda_test_matmul(gpt_precision precision, int N, int C, int OC, const float *inp, const float *weight,
                                     const float *bias, float *out, const float *dout, float *dinp, float *dweight,
                                     float *dbias) {
    BY_PRECISION(precision, test_matmul, N, C, OC, inp, weight, bias, out, dout, dinp, dweight, dbias);
}

template <typename Act>
static void test_attention(int B, int T, int C, int NH, const float *qkv, float *out, float *att,
                           const float *dout, float *dqkv) {
    test_run r = test_begin();
    size_t NC = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    bool is_float = std::is_same<Act, float>::value;
    Act *q = upload<Act>(&r, qkv, 3 * NC), *y = upload_zeros<Act>(&r, NC), *p = upload_zeros<Act>(&r, natt);
    Act *dy = upload<Act>(&r, dout, NC), *dq = upload_zeros<Act>(&r, 3 * NC), *ds = upload_zeros<Act>(&r, natt);
    // The same buffer sharing as the model: fp32 works in place.
    float *scores = is_float ? (float *)(void *)p : upload_zeros<float>(&r, natt);
    float *dp = is_float ? (float *)(void *)ds : upload_zeros<float>(&r, natt);
    attention_forward(&r.ctx, y, p, scores, q, B, T, C, NH);
    attention_backward(&r.ctx, dq, dp, ds, dy, q, p, B, T, C, NH);
    download(&r, out, y, NC), download(&r, att, p, natt), download(&r, dqkv, dq, 3 * NC);
    test_end(&r);
}

extern "C" void gpt_cuda_test_attention(gpt_precision precision, int B, int T, int C, int NH, const float *qkv, float *out,
                                        float *att, const float *dout, float *dqkv) {
    BY_PRECISION(precision, test_attention, B, T, C, NH, qkv, out, att, dout, dqkv);
}

template <typename Act>
static void test_flash_attention(int B, int T, int C, int NH, const float *qkv, float *out, float *lse,
                                 const float *dout, float *dqkv) {
    test_run r = test_begin();
    size_t NC = (size_t)B * T * C, rows = (size_t)B * NH * T;
    Act *q = upload<Act>(&r, qkv, 3 * NC), *y = upload_zeros<Act>(&r, NC), *dy = upload<Act>(&r, dout, NC);
    Act *dq = upload_zeros<Act>(&r, 3 * NC);
    float *l = upload_zeros<float>(&r, rows), *delta = upload_zeros<float>(&r, rows);
    flash_attention_forward(&r.ctx, y, l, q, B, T, C, NH);
    flash_attention_backward(&r.ctx, dq, delta, dy, q, y, l, B, T, C, NH);
    download(&r, out, y, NC), download(&r, lse, l, rows), download(&r, dqkv, dq, 3 * NC);
    test_end(&r);
}

extern "C" void gpt_cuda_test_flash_attention(gpt_precision precision, int B, int T, int C, int NH, const float *qkv,
                                              float *out, float *lse, const float *dout, float *dqkv) {
    if (flash_head_size(C / NH) == 0) die("gpt_cuda_test_flash_attention: heads of %d channels are too large", C / NH);
    BY_PRECISION(precision, test_flash_attention, B, T, C, NH, qkv, out, lse, dout, dqkv);
}

template <typename Act>
static void test_gelu(size_t n, const float *inp, float *out, const float *dout, float *dinp) {
    test_run r = test_begin();
    Act *x = upload<Act>(&r, inp, n), *y = upload_zeros<Act>(&r, n), *d = upload<Act>(&r, dout, n);
    gelu_forward(&r.ctx, y, x, n);
    gelu_backward(&r.ctx, d, x, d, n); // in place, as the model does
    download(&r, out, y, n), download(&r, dinp, d, n);
    test_end(&r);
}

extern "C" void gpt_cuda_test_gelu(gpt_precision precision, size_t n, const float *inp, float *out, const float *dout,
                                   float *dinp) {
    BY_PRECISION(precision, test_gelu, n, inp, out, dout, dinp);
}

template <typename Act> static void test_residual(size_t n, const float *a, const float *b, float *out) {
    test_run r = test_begin();
    Act *x = upload<Act>(&r, a, n), *y = upload<Act>(&r, b, n), *o = upload_zeros<Act>(&r, n);
    residual_forward(&r.ctx, o, x, y, n);
    download(&r, out, o, n);
    test_end(&r);
}

extern "C" void gpt_cuda_test_residual(gpt_precision precision, size_t n, const float *a, const float *b, float *out) {
    BY_PRECISION(precision, test_residual, n, a, b, out);
}

template <typename Act>
static float test_crossentropy(int N, int V, int Vp, const float *logits, const uint16_t *targets, float *losses,
                               float dloss, float *dlogits) {
    test_run r = test_begin();
    size_t NV = (size_t)N * Vp;
    float *z = upload<float>(&r, logits, NV), *l = upload_zeros<float>(&r, N), *lse = upload_zeros<float>(&r, N);
    uint16_t *tg = upload_tokens(&r, targets, N);
    Act *d = upload_zeros<Act>(&r, NV);
    crossentropy_forward(&r.ctx, l, lse, z, tg, N, V, Vp);
    crossentropy_backward(&r.ctx, d, z, lse, tg, N, V, Vp, dloss);
    download(&r, losses, l, N), download(&r, dlogits, d, NV);
    test_end(&r);
    double total = 0;
    for (int i = 0; i < N; i++) total += losses[i];
    return (float)(total / N);
}

extern "C" float gpt_cuda_test_crossentropy(gpt_precision precision, int N, int V, int Vp, const float *logits,
                                            const uint16_t *targets, float *losses, float dloss, float *dlogits) {
    return BY_PRECISION(precision, test_crossentropy, N, V, Vp, logits, targets, losses, dloss, dlogits);
}

// ===================================================================== 9. tensor parallelism
//
// gpt.h's section 9 on the GPU: with tp > 1 this model is one rank's shard
// of each block (gpt_layout.h, section 5), every buffer sized for the shard.
// block_forward and block_backward (section 6) take the shard's sizes and
// call the caller's tp_all_reduce twice in each pass (g after the two
// row-parallel layers, f for the input gradients of the two
// column-parallel ones). Those sums sit on the critical path: nothing in
// the block can go on before they are done. The callback is given the
// model's stream; what the course's callback does (gpt/model.h) is the
// simplest correct thing - wait for the stream, then a blocking all-reduce
// - so the GPU idles while the numbers travel. Megatron hides part of that
// time by overlapping the all-reduce with other work; measuring what is
// left to hide is for the benchmark.

extern "C" void gpt_cuda_set_tp_all_reduce(gpt_cuda_t *g, gpt_cuda_tp_fn fn, void *user) {
    g->tp_all_reduce = fn, g->tp_user = user;
}

extern "C" int gpt_cuda_tp(const gpt_cuda_t *g) { return g->tp; }

// In place: buf (count numbers of the activation type) <- its sum over the tp ranks.
static void tp_sum(gpt_cuda_t *g, void *buf, size_t count) {
    if (!g->tp_all_reduce) die("a tensor-parallel GPU model (tp %d) needs gpt_cuda_set_tp_all_reduce", g->tp);
    g->tp_all_reduce(g->tp_user, buf, count, g->precision == GPT_BF16 ? GPT_CUDA_BF16 : GPT_CUDA_F32, g->ctx.stream);
}

// out = a + (b + bias): the residual add, the row-parallel bias added once to the all-reduced b.
template <typename Act>
static __global__ void residual_bias_forward_kernel(Act *out, const Act *a, const Act *b, const float *bias, int C,
                                                    size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f<Act>(to_f(a[i]) + (to_f(b[i]) + bias[i % C]));
}

template <typename Act>
static void residual_bias_forward(const gpu_ctx *x, Act *out, const Act *a, const Act *b, const float *bias, int N,
                                  int C) {
    size_t n = (size_t)N * C;
    if (n == 0) return;
    residual_bias_forward_kernel<Act><<<blocks_for(n, 256), 256, 0, x->stream>>>(out, a, b, bias, C, n);
    launched("residual_bias_forward_kernel");
}

// --- the gradient norm of a shard (gpt_clip_grad_norm_tp): the squares of
// the split tensors, summed over the tp ranks, plus those of the
// replicated ones, once. AdamW's chunks never straddle two tensors, so
// each chunk is all split or all replicated: chunk_split says which.
static void tp_setup(gpt_cuda_t *g) {
    int n = g->num_adam_chunks;
    adam_chunk *chunks = (adam_chunk *)xmalloc(sizeof(adam_chunk) * (size_t)n);
    unsigned char *split = (unsigned char *)xmalloc((size_t)n);
    build_adam_chunks(g->tensors, g->num_tensors, chunks);
    for (int c = 0, t = 0; c < n; c++) {
        while (chunks[c].offset >= g->tensors[t].offset + g->tensors[t].count) t++;
        split[c] = g->tensors[t].split != GPT_REPLICATED;
    }
    g->chunk_split = (unsigned char *)device_buffer(g, (size_t)n, "chunk kinds (tensor parallelism)");
    g->tp_norm = (double *)device_buffer(g, sizeof(double) * (2 * NORM_BLOCKS + 2), "gradient-norm sums (tensor parallelism)");
    CHECK_CUDA(cudaMemcpyAsync(g->chunk_split, split, (size_t)n, cudaMemcpyHostToDevice, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // before the host buffers go
    free(chunks), free(split);
}

// Block b sums the squares of chunks b, b + gridDim.x, ... into two
// partials, split and replicated, in a fixed order (the same bits every run).
static __global__ void tp_sum_squares_kernel(double *partials, const float *x, const adam_chunk *chunks,
                                             const unsigned char *split, int count) {
    double s_split = 0.0, s_repl = 0.0;
    for (int c = blockIdx.x; c < count; c += gridDim.x) {
        adam_chunk ch = chunks[c];
        double s = 0.0;
        for (unsigned k = threadIdx.x; k < ch.count; k += blockDim.x) s += (double)x[ch.offset + k] * x[ch.offset + k];
        if (split[c]) s_split += s;
        else s_repl += s;
    }
    s_split = block_sum_double(s_split);
    s_repl = block_sum_double(s_repl);
    if (threadIdx.x == 0) partials[2 * blockIdx.x] = s_split, partials[2 * blockIdx.x + 1] = s_repl;
}

// One warp adds the partials: sums[0] split, sums[1] replicated.
static __global__ void tp_add_partials_kernel(double *sums, const double *partials, int blocks) {
    double a = 0.0, b = 0.0;
    for (int i = threadIdx.x; i < blocks; i += WARP) a += partials[2 * i], b += partials[2 * i + 1];
    a = warp_sum_double(a), b = warp_sum_double(b);
    if (threadIdx.x == 0) sums[0] = a, sums[1] = b;
}

// After sums[0] was summed over the tp ranks: the norm and the clip scale, as grad_norm_kernel.
static __global__ void tp_grad_norm_kernel(device_scalars *out, const double *sums, float max_norm) {
    double norm = sqrt(sums[0] + sums[1]);
    out->grad_norm = (float)norm;
    out->clip_scale = max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

// The clipping norm of a model whose chunks are of two kinds (chunk_split:
// a tp shard's split tensors, or an expert shard's experts): each kind's
// squares summed on the device, the split kind's added up over its ranks
// by `sum` (the other kind is the same on every rank, counted once), then
// the norm and the clipping factor.
static void split_grad_norm(gpt_cuda_t *g, float max_norm, gpt_cuda_tp_fn sum, void *user) {
    cudaStream_t s = g->ctx.stream;
    int blocks = g->num_adam_chunks < NORM_BLOCKS ? g->num_adam_chunks : NORM_BLOCKS;
    double *sums = g->tp_norm + 2 * NORM_BLOCKS;
    tp_sum_squares_kernel<<<blocks, 256, 0, s>>>(g->tp_norm, g->grads, g->adam_chunks, g->chunk_split,
                                                  g->num_adam_chunks);
    launched("tp_sum_squares_kernel");
    tp_add_partials_kernel<<<1, WARP, 0, s>>>(sums, g->tp_norm, blocks);
    launched("tp_add_partials_kernel");
    sum(user, sums, 1, GPT_CUDA_F64, s);
    tp_grad_norm_kernel<<<1, 1, 0, s>>>(g->scalars, sums, max_norm);
    launched("tp_grad_norm_kernel");
    g->clip_pending = true, g->have_norm = true;
}

extern "C" void gpt_cuda_clip_grad_norm_tp(gpt_cuda_t *g, float max_norm) {
    if (g->tp <= 1) {
        gpt_cuda_clip_grad_norm(g, max_norm);
        return;
    }
    if (!g->tp_all_reduce) die("a tensor-parallel GPU model (tp %d) needs gpt_cuda_set_tp_all_reduce", g->tp);
    split_grad_norm(g, max_norm, g->tp_all_reduce, g->tp_user); // the split tensors' squares, over the tp ranks
}

// --- expert parallelism (chapter 13): the clipping norm of an expert
// shard, with the kernels above and "split" read as "an expert's": each
// rank sums its experts' squares and the dense ones apart, the ep group
// adds up the experts' (each expert lives on one of its ranks) and the
// dense ones, the same on every rank, count once - model.h's
// model_clip_experts on the device. (No model is both a tp shard and an
// expert shard on a GPU: chunk_split and tp_norm serve one or the other.)
static bool tensor_is_expert(const gpt_config *c, int t) {
    if (!c->n_expert || t < 2 || t >= gpt_ln_f_tensor(c)) return false;
    return gpt_is_expert_tensor(c, (t - 2) % gpt_block_tensors(c));
}

static void ep_norm_setup(gpt_cuda_t *g) {
    if (g->tp > 1) die("gpt_cuda_create: a model split over tp ranks and ep ranks at once is not written for GPUs");
    int n = g->num_adam_chunks;
    adam_chunk *chunks = (adam_chunk *)xmalloc(sizeof(adam_chunk) * (size_t)n);
    unsigned char *expert = (unsigned char *)xmalloc((size_t)n);
    build_adam_chunks(g->tensors, g->num_tensors, chunks);
    for (int c = 0, t = 0; c < n; c++) {
        while (chunks[c].offset >= g->tensors[t].offset + g->tensors[t].count) t++;
        expert[c] = tensor_is_expert(&g->cfg, t);
    }
    g->chunk_split = (unsigned char *)device_buffer(g, (size_t)n, "chunk kinds (expert parallelism)");
    g->tp_norm = (double *)device_buffer(g, sizeof(double) * (2 * NORM_BLOCKS + 2), "gradient-norm sums (expert parallelism)");
    CHECK_CUDA(cudaMemcpyAsync(g->chunk_split, expert, (size_t)n, cudaMemcpyHostToDevice, g->ctx.stream));
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // before the host buffers go
    free(chunks), free(expert);
}

extern "C" void gpt_cuda_clip_grad_norm_ep(gpt_cuda_t *g, float max_norm) {
    if (!g->moe || g->moe->P == 1) {
        gpt_cuda_clip_grad_norm(g, max_norm);
        return;
    }
    if (!g->moe->comm.sum) die("an expert-parallel GPU model (ep %d) needs gpt_cuda_expert_parallel", g->moe->P);
    split_grad_norm(g, max_norm, g->moe->comm.sum, g->moe->comm.user); // the experts' squares, over the ep ranks
}

static __global__ void scale_kernel(float *x, size_t n, float s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" void gpt_cuda_scale(gpt_cuda_t *g, float *x, size_t n, float s) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n, 256), 256, 0, g->ctx.stream>>>(x, n, s);
    launched("scale_kernel");
}

// ===================================================================== 10. the training step as one CUDA graph
//
// A step of the chapter's default model is 149 launches (96 kernels, 51
// cuBLAS calls, 2 memsets; the tiny preset's 83), each a few microseconds
// of the host's time and, for a small model, each a few microseconds of
// work for the GPU: the host, not the GPU, sets the pace.
// A CUDA graph records the step once - the stream is captured
// (cudaStreamBeginCapture): its operations go into a graph instead of to
// the GPU - and then replays it with ONE call, cudaGraphLaunch.
//
// A replay runs the captured operations with the arguments they had when
// captured: the same pointers, the same grid sizes, the same numbers. So
// everything that changes from step to step is read from device memory:
//   - the tokens: copied into the same device buffers before each launch
//     (the data copy stays outside the graph);
//   - the learning rate of the schedule and AdamW's bias corrections
//     1 - beta^t: copied into scalars->step before each launch, and the
//     captured AdamW reads them there (adamw_kernel's `step`);
//   - the loss and the clip scale are computed on the device already
//     (sections 6 and 7), and the host never waits inside the step.
// What the capture does bake in (the batch shape, max_norm, the betas,
// eps, weight decay) is remembered in step_graph_shape: a step with other
// values captures again.
//
// Data parallel runs do not use this: the gradients' all-reduce between
// backward and the optimizer is not on the model's stream alone (the bucket
// hooks queue it on a communication stream after events, or stage it
// through the host), and the emulated NCCL cannot be captured. A graph per
// piece between the collectives would be the next step (PyTorch's
// make_graphed_callables graphs the model's forward and backward, not
// DDP's all-reduce).

static void step_graph_free(struct step_graph *sg) {
    if (!sg) return;
    if (sg->exec) CHECK_CUDA(cudaGraphExecDestroy(sg->exec));
    CHECK_CUDA(cudaEventDestroy(sg->copied));
    CHECK_CUDA(cudaFreeHost(sg->host));
    free(sg);
}

// Everything of a step after the tokens are on the device, captured into
// sg->exec: a new executable graph, or (same topology, other arguments) the
// old one updated in place.
static void capture_step(gpt_cuda_t *g, struct step_graph *sg, const step_graph_shape *k) {
    cudaStream_t s = g->ctx.stream;
    cudaGraph_t graph;
    // ThreadLocal: a call of this thread that cannot be captured (a host
    // wait, a cudaMalloc) fails the capture instead of quietly running.
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    sg->capturing = true;
    int adam_step = g->adam_step, losses_summed = g->losses_summed; // a capture runs nothing: no step, no loss
    gpt_cuda_zero_grad(g);
    queue_forward(g, k->B, k->T, true);
    gpt_cuda_backward(g, 1.0f, NULL, NULL);
    gpt_cuda_clip_grad_norm(g, k->max_norm);
    // The captured AdamW reads lr, c1, c2 from scalars->step at each replay;
    // the values given here (this step's) are not used.
    gpt_cuda_adamw(g, sg->host->lr, k->beta1, k->beta2, k->eps, k->weight_decay);
    sg->capturing = false;
    g->adam_step = adam_step, g->losses_summed = losses_summed;
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphGetNodes(graph, NULL, &sg->nodes));
    cudaGraphExecUpdateResultInfo info;
    if (sg->exec && cudaGraphExecUpdate(sg->exec, graph, &info) != cudaSuccess) {
        (void)cudaGetLastError(); // refused (another topology): a new executable graph instead
        CHECK_CUDA(cudaGraphExecDestroy(sg->exec));
        sg->exec = NULL;
    }
    if (!sg->exec) CHECK_CUDA(cudaGraphInstantiate(&sg->exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
    sg->shape = *k;
}

extern "C" void gpt_cuda_graph_step(gpt_cuda_t *g, const uint16_t *inputs, const uint16_t *targets, int B, int T,
                                    float max_norm, float lr, float beta1, float beta2, float eps,
                                    float weight_decay) {
    if (B < 1 || T < 1 || B > g->max_B || T > g->max_T)
        die("gpt_cuda_graph_step: a batch of %d x %d tokens does not fit the %d x %d the GPU model was created for",
            B, T, g->max_B, g->max_T);
    if (g->moe) die("gpt_cuda_graph_step: a mixture of experts' step waits for its routing counts: it cannot be a CUDA graph");
    struct step_graph *sg = g->graph;
    if (!sg) {
        sg = g->graph = (struct step_graph *)xcalloc(1, sizeof *sg);
        CHECK_CUDA(cudaMallocHost((void **)&sg->host, sizeof *sg->host));
        CHECK_CUDA(cudaEventCreateWithFlags(&sg->copied, cudaEventDisableTiming));
    }
    size_t N = (size_t)B * T;
    check_tokens(g, inputs, N, "input");
    check_tokens(g, targets, N, "target");
    // Outside the graph: this step's tokens and scalars into device memory,
    // on the model's stream, so the launch below runs after them.
    upload_tokens(g, inputs, targets, N);
    int step = g->adam_step + 1;
    CHECK_CUDA(cudaEventSynchronize(sg->copied)); // the last step's scalars have left the pinned slot
    sg->host->lr = lr;
    sg->host->c1 = (float)(1 - pow((double)beta1, step));
    sg->host->c2 = (float)(1 - pow((double)beta2, step));
    CHECK_CUDA(cudaMemcpyAsync(&g->scalars->step, sg->host, sizeof *sg->host, cudaMemcpyHostToDevice,
                               g->ctx.stream));
    CHECK_CUDA(cudaEventRecord(sg->copied, g->ctx.stream));
    step_graph_shape k = {B, T, max_norm, beta1, beta2, eps, weight_decay};
    if (!sg->exec || memcmp(&k, &sg->shape, sizeof k) != 0) capture_step(g, sg, &k);
    CHECK_CUDA(cudaGraphLaunch(sg->exec, g->ctx.stream));
    // What the step did, as the uncaptured calls leave it.
    g->adam_step = step;
    g->B = B, g->T = T;
    g->have_targets = false, g->clip_pending = false;
    g->have_loss = g->have_norm = true;
    g->losses_summed++;
}

extern "C" size_t gpt_cuda_graph_nodes(const gpt_cuda_t *g) { return g->graph ? g->graph->nodes : 0; }
