// gpt_cuda_cp.cuh - context parallelism (chapter 12) in the GPU model: the
// CPU's gpt/context_parallel.h on the device. Included by gpt_cuda.cu after
// its model struct (section 6); gpt_cuda.cu calls it at four places (the
// position embedding forward and backward, attention forward and backward)
// when the model has a cp context with a layout for the pass.
//
// A rank holds some tokens of each sequence (model.h chooses them and
// gives their global positions: gpt_cuda_cp_layout). Everything but
// attention is gpt_cuda.cu's own code on fewer tokens; the position
// embedding reads wpe at the tokens' global positions. Attention:
//   ring: the keys and values of this rank's tokens are packed into a
//     block that goes around the ring (device buffers, the caller's
//     messages: gpt_cuda_cp_comm). Each step, a partial flash attention of
//     the local queries to the visiting block (cp_partial_kernel: the tile
//     loop of section 5's flash_forward_kernel, masked by global position)
//     gives an output and a log-sum-exp per row, which cp_merge_kernel
//     merges into the running ones. The next block's transfer is started
//     before the block's kernels are queued and waited for after: NCCL
//     moves it on its stream while the model's stream computes. The
//     backward pass sends the blocks around again with their key/value
//     gradients (fp32), which end at their owners.
//   ulysses: an all-to-all turns the rank's tokens of every head into
//     every token of its heads; section 5's flash attention runs over the
//     whole sequence for those heads; an all-to-all turns the output back.
//
// Which keys a query sees: a rank's tokens are in ascending global order
// (zigzag: chunk r then chunk 2N-1-r), so query t of this rank sees a
// prefix of any block's keys, nvis[t] of them, and key s of a block is
// seen by a suffix of this rank's queries, from firstq[s] on. The host
// computes both per block (they depend on positions only, not on layers)
// and the kernels loop over exactly those.

// What the model keeps for context parallelism (gpt_cuda_context_parallel).
struct gpu_cp {
    int ways, rank;
    bool ulysses;
    gpt_cuda_cp_comm comm;
    bool active;          // this pass is split (gpt_cuda_cp_layout); else the model computes whole sequences
    int whole, count;     // tokens per sequence in the pass, this rank's of them
    int *counts, *starts; // per rank: its tokens, where its positions start in pos_all
    int *pos_all;         // host: every rank's positions, rank by rank (whole of them)
    int *pos_dev;         // device: the same
    int *nvis_dev;        // device, per source rank r: this rank's queries' visible counts of r's keys (count each)
    int *firstq_dev;      // device, per source rank r: per key of r, the first query of this rank that sees it
    int *nvis_host, *firstq_host;
    int L, C, NH, max_B, max_T, max_count;
    size_t act_bytes;     // 4 or 2
    void *kv[2];          // ring: the block computed on and the one arriving (Act, B x max_count x 2C)
    float *dkv[2];        // ring: their gradients (fp32)
    float *own, *run_o, *part_o, *part_lse, *dq; // ring: this rank's key/value gradients, the running and partial outputs, dq
    void *send, *recv;    // ulysses: the all-to-all buffers (Act, B x max_T x 3C / cp)
    void *heads, *dheads; // ulysses: q, k, v and their gradients, this rank's heads over the whole sequence
    void **yw;            // ulysses: per layer, the whole sequence's output for this rank's heads (backward needs it)
    double sent_forward, sent_backward, pairs; // numbers sent (forward, backward), score pairs computed
    size_t allocated;
};

static void *cp_alloc(gpu_cp *cp, size_t bytes) {
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    cp->allocated += bytes;
    return p;
}

// ---------------------------------------------------------------- kernels

// x[n,:] = wte[token[n],:] + wpe[pos[n % T],:] (encoder_forward_kernel, at global positions).
template <typename Act>
static __global__ void cp_encoder_forward_kernel(Act *out, const uint16_t *tokens, const float *wte, const float *wpe,
                                                 const int *pos, int T, int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / C;
    int c = (int)(i % C), t = pos[n % T];
    out[i] = from_f<Act>(wte[(size_t)tokens[n] * C + c] + wpe[(size_t)t * C + c]);
}

// dwpe[pos[t]] += sum over sequences of dx[b,t]: each position is held by one token here.
template <typename Act>
static __global__ void cp_encoder_backward_wpe_kernel(float *dwpe, const Act *dout, const int *pos, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += to_f(dout[(size_t)b * T * C + i]);
    dwpe[(size_t)pos[i / C] * C + i % C] += s;
}

// The keys and values of rows rows of qkv (rows, 3C) into a block (rows, 2C).
template <typename Act>
static __global__ void cp_pack_kv_kernel(Act *kv, const Act *qkv, int C, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / (2 * C);
    kv[i] = qkv[n * 3 * C + C + i % (2 * C)];
}

static __global__ void cp_fill_kernel(float *x, float value, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}

// Partial attention of this rank's queries (qkv: B x Tl x 3C) to one block
// of keys and values (kv: B x Ts x 2C): query t sees keys 0..nvis[t]-1 of
// it. One thread per query row, as flash_forward_kernel; o_part (fp32,
// B x Tl x C) gets the average over the keys seen, lse_part (B x NH x Tl)
// its log-sum-exp (-inf and 0 where none is seen).
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    cp_partial_kernel(float *o_part, float *lse_part, const Act *qkv, const Act *kv, const int *nvis, int Tl, int Ts,
                      int C, int NH, float scale) {
    __shared__ float k_tile[FLASH_TILE][HS];
    __shared__ float v_tile[FLASH_TILE][HS];
    flash_block w = flash_where(NH, true);
    int hs = C / NH, t = w.first + threadIdx.x, r = min(t, Tl - 1);
    bool mine = t < Tl;
    const Act *q_in = qkv + (size_t)w.b * Tl * 3 * C + w.h * hs;
    const Act *k_in = kv + (size_t)w.b * Ts * 2 * C + w.h * hs, *v_in = k_in + C;
    float q[HS], o[HS], m = -INFINITY, l = 0.0f;
    load_row<HS>(q, q_in + (size_t)r * 3 * C, hs, scale);
    UNROLL for (int c = 0; c < HS; c++) o[c] = 0.0f;
    int n_t = mine ? nvis[t] : 0, last = nvis[min(Tl, w.first + FLASH_ROWS) - 1]; // nvis grows with t
    for (int j0 = 0; j0 < last; j0 += FLASH_TILE) {
        load_tile<HS>(k_tile, k_in, 2 * C, j0, Ts, hs, 1.0f);
        load_tile<HS>(v_tile, v_in, 2 * C, j0, Ts, hs, 1.0f);
        __syncthreads();
        if (mine && j0 < n_t) attend_tile<HS>(q, o, m, l, k_tile, v_tile, min(FLASH_TILE, n_t - j0));
        __syncthreads();
    }
    if (!mine) return;
    float *po = o_part + ((size_t)w.b * Tl + t) * C + w.h * hs;
    UNROLL for (int c = 0; c < HS; c++) if (c < hs) po[c] = l > 0.0f ? o[c] / l : 0.0f;
    lse_part[(size_t)w.bh * Tl + t] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// The merge of a partial result (o_b, lse_b) into the running one (o,
// lse), one thread per (sequence, head, row): gpt/context_parallel.h's
// cp_merge. A side without keys (lse -inf) weighs 0.
static __global__ void cp_merge_kernel(float *o, float *lse, const float *o_b, const float *lse_b, int Tl, int C,
                                       int NH, size_t rows) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    float lb = lse_b[i], la = lse[i];
    if (lb == -INFINITY) return;
    size_t b = i / ((size_t)NH * Tl), h = i / Tl % NH, t = i % Tl;
    int hs = C / NH;
    float top = fmaxf(la, lb), wa = la == -INFINITY ? 0.0f : expf(la - top), wb = expf(lb - top), sum = wa + wb;
    float *out = o + (b * Tl + t) * C + h * hs;
    const float *in = o_b + (b * Tl + t) * C + h * hs;
    for (int c = 0; c < hs; c++) out[c] = (wa * out[c] + wb * in[c]) / sum;
    lse[i] = top + logf(sum);
}

// D = rowsum(dy .* y) per (sequence, head, row): the softmax backward's
// sum over ALL keys, which no single block has.
template <typename Act>
static __global__ void cp_delta_kernel(float *delta, const Act *dout, const Act *out, int Tl, int C, int NH, size_t rows) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    size_t b = i / ((size_t)NH * Tl), h = i / Tl % NH, t = i % Tl;
    int hs = C / NH;
    const Act *dy = dout + (b * Tl + t) * C + h * hs, *y = out + (b * Tl + t) * C + h * hs;
    float d = 0.0f;
    for (int c = 0; c < hs; c++) d += to_f(dy[c]) * to_f(y[c]);
    delta[i] = d;
}

// dq (fp32, B x Tl x C) += the visiting block's share, one thread per
// query row (flash_backward_dq_kernel on the keys the row sees of the block).
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    cp_dq_kernel(float *dq, const Act *qkv, const Act *kv, const Act *dout, const float *lse, const float *delta,
                 const int *nvis, int Tl, int Ts, int C, int NH, float scale) {
    __shared__ float k_tile[FLASH_TILE][HS];
    __shared__ float v_tile[FLASH_TILE][HS];
    flash_block w = flash_where(NH, true);
    int hs = C / NH, t = w.first + threadIdx.x, r = min(t, Tl - 1);
    bool mine = t < Tl;
    const Act *q_in = qkv + (size_t)w.b * Tl * 3 * C + w.h * hs;
    const Act *k_in = kv + (size_t)w.b * Ts * 2 * C + w.h * hs, *v_in = k_in + C;
    size_t yrow = ((size_t)w.b * Tl + r) * C + w.h * hs;
    float q[HS], dy[HS], acc[HS], D = delta[(size_t)w.bh * Tl + r], row_lse = lse[(size_t)w.bh * Tl + r];
    load_row<HS>(q, q_in + (size_t)r * 3 * C, hs, scale);
    load_row<HS>(dy, dout + yrow, hs, 1.0f);
    UNROLL for (int c = 0; c < HS; c++) acc[c] = 0.0f;
    int n_t = mine ? nvis[t] : 0, last = nvis[min(Tl, w.first + FLASH_ROWS) - 1];
    for (int j0 = 0; j0 < last; j0 += FLASH_TILE) {
        load_tile<HS>(k_tile, k_in, 2 * C, j0, Ts, hs, 1.0f);
        load_tile<HS>(v_tile, v_in, 2 * C, j0, Ts, hs, 1.0f);
        __syncthreads();
        int n = mine ? max(0, min(FLASH_TILE, n_t - j0)) : 0;
        for (int j = 0; j < n; j++) {
            float p = expf(dot<HS>(q, k_tile[j]) - row_lse), ds = p * (dot<HS>(dy, v_tile[j]) - D);
            UNROLL for (int c = 0; c < HS; c++) acc[c] += ds * k_tile[j][c];
        }
        __syncthreads();
    }
    if (!mine) return;
    float *out = dq + yrow;
    UNROLL for (int c = 0; c < HS; c++) if (c < hs) out[c] += acc[c] * scale;
}

// The gradient of the visiting block's keys and values (dkv: fp32, B x Ts
// x 2C) += this rank's queries' share, one thread per key row s, over the
// queries that see it (from firstq[s] on): flash_backward_dkv_kernel.
template <typename Act, int HS>
static __global__ void __launch_bounds__(FLASH_ROWS)
    cp_dkv_kernel(float *dkv, const Act *qkv, const Act *kv, const Act *dout, const float *lse, const float *delta,
                  const int *firstq, int Tl, int Ts, int C, int NH, float scale) {
    __shared__ float q_tile[FLASH_TILE][HS];
    __shared__ float dy_tile[FLASH_TILE][HS];
    __shared__ float lse_tile[FLASH_TILE];
    __shared__ float delta_tile[FLASH_TILE];
    flash_block w = flash_where(NH, false);
    int hs = C / NH, s = w.first + threadIdx.x, r = min(s, Ts - 1);
    bool mine = s < Ts;
    const Act *q_in = qkv + (size_t)w.b * Tl * 3 * C + w.h * hs, *dy_in = dout + (size_t)w.b * Tl * C + w.h * hs;
    const Act *k_in = kv + (size_t)w.b * Ts * 2 * C + w.h * hs;
    float k[HS], v[HS], dk[HS], dv[HS];
    load_row<HS>(k, k_in + (size_t)r * 2 * C, hs, 1.0f);
    load_row<HS>(v, k_in + C + (size_t)r * 2 * C, hs, 1.0f);
    UNROLL for (int c = 0; c < HS; c++) dk[c] = dv[c] = 0.0f;
    const float *row_lse = lse + (size_t)w.bh * Tl, *row_delta = delta + (size_t)w.bh * Tl;
    int first = firstq[min(w.first, Ts - 1)], from_s = mine ? firstq[s] : Tl; // firstq grows with s
    for (int t0 = first; t0 < Tl; t0 += FLASH_TILE) {
        load_tile<HS>(q_tile, q_in, 3 * C, t0, Tl, hs, scale);
        load_tile<HS>(dy_tile, dy_in, C, t0, Tl, hs, 1.0f);
        if (threadIdx.x < FLASH_TILE) {
            int t = t0 + threadIdx.x;
            lse_tile[threadIdx.x] = t < Tl ? row_lse[t] : 0.0f;
            delta_tile[threadIdx.x] = t < Tl ? row_delta[t] : 0.0f;
        }
        __syncthreads();
        int from = max(0, from_s - t0), to = min(FLASH_TILE, Tl - t0);
        for (int i = from; i < to; i++) {
            float p = expf(dot<HS>(q_tile[i], k) - lse_tile[i]), ds = p * (dot<HS>(dy_tile[i], v) - delta_tile[i]);
            UNROLL for (int c = 0; c < HS; c++) {
                dv[c] += p * dy_tile[i][c];
                dk[c] += ds * q_tile[i][c];
            }
        }
        __syncthreads();
    }
    if (!mine) return;
    float *out = dkv + ((size_t)w.b * Ts + s) * 2 * C + w.h * hs;
    UNROLL for (int c = 0; c < HS; c++) {
        if (c >= hs) continue;
        out[c] += dk[c];
        out[C + c] += dv[c];
    }
}

// dqkv (Act, rows x 3C) <- dq, and dk, dv: this rank's own queries' share
// plus what came home around the ring (home NULL: none).
template <typename Act>
static __global__ void cp_join_grads_kernel(Act *dqkv, const float *dq, const float *own, const float *home, int C,
                                            size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t n = i / (3 * C), c = i % (3 * C);
    float v = c < (size_t)C ? dq[n * C + c] : own[n * 2 * C + c - C] + (home ? home[n * 2 * C + c - C] : 0.0f);
    dqkv[i] = from_f<Act>(v);
}

// Ulysses' reshuffles. Split: local (B, Tl, P x C) -> send, by rank r:
// (B, Tl, P x Cn) of rank r's channels [part C + r Cn, part C + (r+1) Cn).
// join_channels is the way back.
template <typename Act>
static __global__ void cp_split_channels_kernel(Act *send, const Act *local, int B, int Tl, int C, int Cn, int P,
                                                size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t W = (size_t)P * Cn, e = i % W, row = i / W, r = row / ((size_t)B * Tl), bt = row % ((size_t)B * Tl);
    size_t part = e / Cn, c = e % Cn;
    send[i] = local[bt * P * C + part * C + r * Cn + c];
}

template <typename Act>
static __global__ void cp_join_channels_kernel(Act *local, const Act *recv, int B, int Tl, int C, int Cn, int P,
                                               size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t W = (size_t)P * Cn, e = i % W, row = i / W, r = row / ((size_t)B * Tl), bt = row % ((size_t)B * Tl);
    size_t part = e / Cn, c = e % Cn;
    local[bt * P * C + part * C + r * Cn + c] = recv[i];
}

// Rows of one rank's tokens between a packed block (B, Tr, W) and the
// whole sequence (B, T, W), at their global positions pos.
template <typename Act>
static __global__ void cp_place_rows_kernel(Act *whole, Act *packed, const int *pos, int Tr, int T, int W,
                                            bool to_whole, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t e = i % W, row = i / W, b = row / Tr, t = row % Tr;
    size_t at = ((size_t)b * T + pos[t]) * W + e;
    if (to_whole) whole[at] = packed[i];
    else packed[i] = whole[at];
}

// ---------------------------------------------------------------- the host's side

template <typename Act> static gpt_cuda_type cp_type() {
    return std::is_same<Act, float>::value ? GPT_CUDA_F32 : std::is_same<Act, bf16>::value ? GPT_CUDA_BF16 : GPT_CUDA_F16;
}

// Waits for the model's stream: the buffers a message reads are computed,
// and those it writes are no longer read.
static void cp_settle(const gpu_ctx *x) { CHECK_CUDA(cudaStreamSynchronize(x->stream)); }

template <typename Act>
static void cp_encoder_forward(gpu_cp *cp, const gpu_ctx *x, Act *out, const uint16_t *tokens, const float *wte,
                               const float *wpe, int B, int C) {
    size_t total = (size_t)B * cp->count * C;
    cp_encoder_forward_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(
        out, tokens, wte, wpe, cp->pos_dev + cp->starts[cp->rank], cp->count, C, total);
    launched("cp_encoder_forward_kernel");
}

template <typename Act>
static void cp_encoder_backward(gpu_cp *cp, const gpu_ctx *x, float *dwte, float *dwpe, const Act *dout,
                                const uint16_t *tokens, int B, int C) {
    size_t total = (size_t)B * cp->count * C;
    encoder_backward_wte_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(dwte, dout, tokens, C, total);
    launched("encoder_backward_wte_kernel");
    cp_encoder_backward_wpe_kernel<Act><<<blocks_for((size_t)cp->count * C, 256), 256, 0, x->stream>>>(
        dwpe, dout, cp->pos_dev + cp->starts[cp->rank], B, cp->count, C);
    launched("cp_encoder_backward_wpe_kernel");
}

template <typename Act, int HS>
static void cp_ring_forward_hs(gpu_cp *cp, const gpu_ctx *x, Act *out, float *lse, const Act *qkv, int B, int C, int NH) {
    int N = cp->ways, Tl = cp->count;
    float scale = 1.0f / sqrtf((float)(C / NH));
    size_t rows = (size_t)B * NH * Tl;
    cp_fill_kernel<<<blocks_for(rows, 256), 256, 0, x->stream>>>(lse, -INFINITY, rows);
    launched("cp_fill_kernel");
    CHECK_CUDA(cudaMemsetAsync(cp->run_o, 0, sizeof(float) * B * Tl * C, x->stream));
    cp_pack_kv_kernel<Act><<<blocks_for((size_t)B * Tl * 2 * C, 256), 256, 0, x->stream>>>(
        (Act *)cp->kv[0], qkv, C, (size_t)B * Tl * 2 * C);
    launched("cp_pack_kv_kernel");
    for (int i = 0; i < N; i++) {
        int src = ((cp->rank - i) % N + N) % N, next_src = ((src - 1) % N + N) % N, Ts = cp->counts[src];
        void *pending = NULL;
        if (i < N - 1) {
            cp_settle(x); // this block packed or arrived; the next one's buffer no longer read
            size_t send = (size_t)B * Ts * 2 * C, recv = (size_t)B * cp->counts[next_src] * 2 * C;
            pending = cp->comm.ring_start(cp->comm.user, cp->kv[i & 1], send, cp->kv[(i + 1) & 1], recv, cp_type<Act>());
            cp->sent_forward += (double)send;
        }
        int *nvis = cp->nvis_dev + (size_t)src * cp->max_count;
        if (cp->nvis_host[(size_t)src * cp->max_count + Tl - 1] > 0) { // a block no query sees is skipped
            cp_partial_kernel<Act, HS><<<dim3((unsigned)(B * NH), blocks_for((size_t)Tl, FLASH_ROWS)), FLASH_ROWS, 0,
                                         x->stream>>>(cp->part_o, cp->part_lse, qkv, (const Act *)cp->kv[i & 1], nvis,
                                                      Tl, Ts, C, NH, scale);
            launched("cp_partial_kernel");
            cp_merge_kernel<<<blocks_for(rows, 256), 256, 0, x->stream>>>(cp->run_o, lse, cp->part_o, cp->part_lse,
                                                                          Tl, C, NH, rows);
            launched("cp_merge_kernel");
            for (int t = 0; t < Tl; t++) cp->pairs += (double)B * NH * cp->nvis_host[(size_t)src * cp->max_count + t];
        }
        if (pending) cp->comm.ring_finish(cp->comm.user, pending); // NCCL moved it while the kernels ran
    }
    convert(x->stream, out, cp->run_o, (size_t)B * Tl * C);
}

template <typename Act, int HS>
static void cp_ring_backward_hs(gpu_cp *cp, const gpu_ctx *x, Act *dqkv, float *delta, const Act *dout, const Act *qkv,
                                const Act *out, const float *lse, int B, int C, int NH) {
    int N = cp->ways, Tl = cp->count;
    float scale = 1.0f / sqrtf((float)(C / NH));
    size_t rows = (size_t)B * NH * Tl, mine = (size_t)B * Tl * 2 * C;
    cp_delta_kernel<Act><<<blocks_for(rows, 256), 256, 0, x->stream>>>(delta, dout, out, Tl, C, NH, rows);
    launched("cp_delta_kernel");
    CHECK_CUDA(cudaMemsetAsync(cp->dq, 0, sizeof(float) * B * Tl * C, x->stream));
    CHECK_CUDA(cudaMemsetAsync(cp->own, 0, sizeof(float) * mine, x->stream));
    cp_pack_kv_kernel<Act><<<blocks_for(mine, 256), 256, 0, x->stream>>>((Act *)cp->kv[0], qkv, C, mine);
    launched("cp_pack_kv_kernel");
    for (int i = 0; i < N; i++) {
        int src = ((cp->rank - i) % N + N) % N, next_src = ((src - 1) % N + N) % N, Ts = cp->counts[src];
        size_t here = (size_t)B * Ts * 2 * C, coming = (size_t)B * cp->counts[next_src] * 2 * C;
        void *blocks = NULL;
        cp_settle(x);
        if (i < N - 1) {
            blocks = cp->comm.ring_start(cp->comm.user, cp->kv[i & 1], here, cp->kv[(i + 1) & 1], coming, cp_type<Act>());
            cp->sent_backward += (double)here;
        }
        float *grad = i == 0 ? cp->own : cp->dkv[i & 1];
        if (i == 1) CHECK_CUDA(cudaMemsetAsync(grad, 0, sizeof(float) * here, x->stream));
        const Act *kv = (const Act *)cp->kv[i & 1];
        if (cp->nvis_host[(size_t)src * cp->max_count + Tl - 1] > 0) {
            cp_dq_kernel<Act, HS><<<dim3((unsigned)(B * NH), blocks_for((size_t)Tl, FLASH_ROWS)), FLASH_ROWS, 0,
                                    x->stream>>>(cp->dq, qkv, kv, dout, lse, delta, cp->nvis_dev + (size_t)src * cp->max_count,
                                                 Tl, Ts, C, NH, scale);
            launched("cp_dq_kernel");
            cp_dkv_kernel<Act, HS><<<dim3((unsigned)(B * NH), blocks_for((size_t)Ts, FLASH_ROWS)), FLASH_ROWS, 0,
                                     x->stream>>>(grad, qkv, kv, dout, lse, delta,
                                                  cp->firstq_dev + (size_t)src * cp->max_count, Tl, Ts, C, NH, scale);
            launched("cp_dkv_kernel");
        }
        if (i > 0) { // the gradient goes on (the last one to its owner), and this rank's comes home
            cp_settle(x);
            size_t back = i < N - 1 ? coming : mine;
            void *grads = cp->comm.ring_start(cp->comm.user, grad, here, cp->dkv[(i + 1) & 1], back, GPT_CUDA_F32);
            cp->sent_backward += (double)here;
            cp->comm.ring_finish(cp->comm.user, grads);
        }
        if (blocks) cp->comm.ring_finish(cp->comm.user, blocks);
    }
    size_t total = (size_t)B * Tl * 3 * C;
    cp_join_grads_kernel<Act><<<blocks_for(total, 256), 256, 0, x->stream>>>(dqkv, cp->dq, cp->own,
                                                                             N > 1 ? cp->dkv[N & 1] : NULL, C, total);
    launched("cp_join_grads_kernel");
}

// Sequence-split <-> head-split (ulysses): local (B, Tl, P x C) of this
// rank's tokens and whole (B, T, P x Cn) of its heads.
template <typename Act>
static double cp_ulysses_swap(gpu_cp *cp, const gpu_ctx *x, bool to_heads, Act *local, Act *whole, int B, int C, int P) {
    int N = cp->ways, T = cp->whole, Tl = cp->count, Cn = C / N, W = P * Cn;
    size_t mine[64], theirs[64], mine_total = (size_t)N * B * Tl * W, at = 0;
    for (int r = 0; r < N; r++) mine[r] = (size_t)B * Tl * W, theirs[r] = (size_t)B * cp->counts[r] * W;
    Act *send = (Act *)cp->send, *recv = (Act *)cp->recv;
    if (to_heads) {
        cp_split_channels_kernel<Act><<<blocks_for(mine_total, 256), 256, 0, x->stream>>>(send, local, B, Tl, C, Cn, P,
                                                                                          mine_total);
        launched("cp_split_channels_kernel");
    } else {
        for (int r = 0; r < N; r++, at += theirs[r - 1]) {
            if (!theirs[r]) continue;
            cp_place_rows_kernel<Act><<<blocks_for(theirs[r], 256), 256, 0, x->stream>>>(
                whole, send + at, cp->pos_dev + cp->starts[r], cp->counts[r], T, W, false, theirs[r]);
            launched("cp_place_rows_kernel");
        }
    }
    cp_settle(x);
    if (to_heads) cp->comm.all_to_all_v(cp->comm.user, send, mine, recv, theirs, cp_type<Act>());
    else cp->comm.all_to_all_v(cp->comm.user, send, theirs, recv, mine, cp_type<Act>());
    if (to_heads) {
        at = 0;
        for (int r = 0; r < N; r++, at += theirs[r - 1]) {
            if (!theirs[r]) continue;
            cp_place_rows_kernel<Act><<<blocks_for(theirs[r], 256), 256, 0, x->stream>>>(
                whole, recv + at, cp->pos_dev + cp->starts[r], cp->counts[r], T, W, true, theirs[r]);
            launched("cp_place_rows_kernel");
        }
    } else {
        cp_join_channels_kernel<Act><<<blocks_for(mine_total, 256), 256, 0, x->stream>>>(local, recv, B, Tl, C, Cn, P,
                                                                                         mine_total);
        launched("cp_join_channels_kernel");
    }
    double sent = 0;
    for (int r = 0; r < N; r++)
        if (r != cp->rank) sent += (double)(to_heads ? mine[r] : theirs[r]);
    return sent;
}

template <typename Act>
static void cp_ulysses_forward(gpu_cp *cp, const gpu_ctx *x, int l, Act *out, float *lse, Act *qkv, int B, int C,
                               int NH) {
    int N = cp->ways, T = cp->whole, Cn = C / N;
    Act *heads = (Act *)cp->heads, *y = (Act *)cp->yw[l];
    cp->sent_forward += cp_ulysses_swap<Act>(cp, x, true, qkv, heads, B, C, 3);
    flash_attention_forward(x, y, lse, heads, B, T, Cn, NH / N); // lse: (B, NH/N, T), the same count as the rank's own
    cp->pairs += (double)B * (NH / N) * T * (T + 1) / 2;
    cp->sent_forward += cp_ulysses_swap<Act>(cp, x, false, out, y, B, C, 1);
    // The backward pass needs this rank's heads' q, k, v over the whole
    // sequence: they take the place of its own tokens' (the same count).
    CHECK_CUDA(cudaMemcpyAsync(qkv, heads, sizeof(Act) * B * T * 3 * Cn, cudaMemcpyDeviceToDevice, x->stream));
}

template <typename Act>
static void cp_ulysses_backward(gpu_cp *cp, const gpu_ctx *x, int l, Act *dqkv, float *delta, Act *dout, const Act *qkv,
                                const float *lse, int B, int C, int NH) {
    int N = cp->ways, T = cp->whole, Cn = C / N;
    Act *dy = (Act *)cp->heads, *dheads = (Act *)cp->dheads;
    cp->sent_backward += cp_ulysses_swap<Act>(cp, x, true, dout, dy, B, C, 1);
    flash_attention_backward(x, dheads, delta, dy, qkv, (const Act *)cp->yw[l], lse, B, T, Cn, NH / N);
    cp->sent_backward += cp_ulysses_swap<Act>(cp, x, false, dqkv, dheads, B, C, 3);
}

// gpt_cuda.cu's two hooks in a block: attention of this rank's tokens.
template <typename Act>
static void cp_attention_forward(gpu_cp *cp, const gpu_ctx *x, int l, Act *out, float *lse, Act *qkv, int B, int C,
                                 int NH) {
    if (cp->ulysses) return cp_ulysses_forward(cp, x, l, out, lse, qkv, B, C, NH);
    switch (flash_head_size(C / NH)) {
    case 32: cp_ring_forward_hs<Act, 32>(cp, x, out, lse, qkv, B, C, NH); break;
    case 64: cp_ring_forward_hs<Act, 64>(cp, x, out, lse, qkv, B, C, NH); break;
    default: cp_ring_forward_hs<Act, FLASH_MAX_HS>(cp, x, out, lse, qkv, B, C, NH); break;
    }
}

template <typename Act>
static void cp_attention_backward(gpu_cp *cp, const gpu_ctx *x, int l, Act *dqkv, float *delta, Act *dout,
                                  const Act *qkv, const Act *out, const float *lse, int B, int C, int NH) {
    if (cp->ulysses) return cp_ulysses_backward(cp, x, l, dqkv, delta, dout, qkv, lse, B, C, NH);
    switch (flash_head_size(C / NH)) {
    case 32: cp_ring_backward_hs<Act, 32>(cp, x, dqkv, delta, dout, qkv, out, lse, B, C, NH); break;
    case 64: cp_ring_backward_hs<Act, 64>(cp, x, dqkv, delta, dout, qkv, out, lse, B, C, NH); break;
    default: cp_ring_backward_hs<Act, FLASH_MAX_HS>(cp, x, dqkv, delta, dout, qkv, out, lse, B, C, NH); break;
    }
}

// ---------------------------------------------------------------- gpt_cuda.h's calls

extern "C" void gpt_cuda_context_parallel(gpt_cuda_t *g, int ways, int rank, bool ulysses, gpt_cuda_cp_comm comm) {
    if (!g->flash)
        die("context parallelism on a GPU uses the flash kernels (heads of up to %d channels; not "
            "GPT_CUDA_ATTENTION=cublas)", FLASH_MAX_HS);
    if (ways < 2 || ways > 64 || g->tp > 1 || g->stage.count > 1)
        die("gpt_cuda_context_parallel: cp %d (2..64, whole models only)", ways);
    gpu_cp *cp = (gpu_cp *)calloc(1, sizeof *cp);
    if (!cp) die("out of host memory");
    cp->ways = ways, cp->rank = rank, cp->ulysses = ulysses, cp->comm = comm;
    cp->L = g->cfg.n_layer, cp->C = g->cfg.n_embd, cp->NH = g->cfg.n_head, cp->max_B = g->max_B, cp->max_T = g->max_T;
    cp->act_bytes = g->precision == GPT_FP32 ? 4 : 2;
    cp->max_count = g->max_T / ways + 2; // the most tokens of a sequence one rank holds (uneven splits: +2)
    cp->counts = (int *)calloc((size_t)ways, sizeof(int)), cp->starts = (int *)calloc((size_t)ways, sizeof(int));
    cp->pos_all = (int *)calloc((size_t)g->max_T, sizeof(int));
    cp->nvis_host = (int *)calloc((size_t)ways * cp->max_count, sizeof(int));
    cp->firstq_host = (int *)calloc((size_t)ways * cp->max_count, sizeof(int));
    if (!cp->counts || !cp->starts || !cp->pos_all || !cp->nvis_host || !cp->firstq_host) die("out of host memory");
    size_t B = (size_t)g->max_B, C = (size_t)g->cfg.n_embd, NH = (size_t)g->cfg.n_head, M = (size_t)cp->max_count;
    cp->pos_dev = (int *)cp_alloc(cp, sizeof(int) * g->max_T);
    cp->nvis_dev = (int *)cp_alloc(cp, sizeof(int) * ways * M);
    cp->firstq_dev = (int *)cp_alloc(cp, sizeof(int) * ways * M);
    if (!ulysses) {
        for (int k = 0; k < 2; k++) {
            cp->kv[k] = cp_alloc(cp, cp->act_bytes * B * M * 2 * C);
            cp->dkv[k] = (float *)cp_alloc(cp, sizeof(float) * B * M * 2 * C);
        }
        cp->own = (float *)cp_alloc(cp, sizeof(float) * B * M * 2 * C);
        cp->run_o = (float *)cp_alloc(cp, sizeof(float) * B * M * C);
        cp->part_o = (float *)cp_alloc(cp, sizeof(float) * B * M * C);
        cp->dq = (float *)cp_alloc(cp, sizeof(float) * B * M * C);
        cp->part_lse = (float *)cp_alloc(cp, sizeof(float) * B * NH * M);
    } else {
        size_t whole = cp->act_bytes * B * g->max_T * 3 * C / ways;
        cp->send = cp_alloc(cp, whole), cp->recv = cp_alloc(cp, whole);
        cp->heads = cp_alloc(cp, whole), cp->dheads = cp_alloc(cp, whole);
        cp->yw = (void **)calloc((size_t)cp->L, sizeof(void *));
        for (int l = 0; l < cp->L; l++) cp->yw[l] = cp_alloc(cp, cp->act_bytes * B * g->max_T * C / ways);
    }
    g->allocated += cp->allocated;
    g->cp = cp;
}

// Before a forward pass: where every rank's tokens are, segs[4r .. 4r+3] =
// first, count, first, count (global positions; counts may be 0); whole 0:
// this pass is not split (every rank computes whole sequences).
extern "C" void gpt_cuda_cp_layout(gpt_cuda_t *g, int whole, const int *segs) {
    gpu_cp *cp = g->cp;
    if (!cp) die("gpt_cuda_cp_layout: the model has no cp context (gpt_cuda_context_parallel)");
    cp->active = whole > 0;
    if (!cp->active) return;
    if (whole > cp->max_T) die("gpt_cuda_cp_layout: %d tokens, the model was made for %d", whole, cp->max_T);
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // the last pass's kernels read the tables below
    int N = cp->ways, M = cp->max_count, at = 0;
    for (int r = 0; r < N; r++) {
        cp->starts[r] = at;
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < segs[4 * r + 2 * s + 1]; i++) cp->pos_all[at++] = segs[4 * r + 2 * s] + i;
        cp->counts[r] = at - cp->starts[r];
        if (cp->counts[r] > M) die("gpt_cuda_cp_layout: rank %d holds %d tokens, more than %d", r, cp->counts[r], M);
    }
    if (at != whole) die("gpt_cuda_cp_layout: the ranks hold %d tokens of %d", at, whole);
    cp->whole = whole, cp->count = cp->counts[cp->rank];
    if (cp->ulysses && (whole % N || cp->C % N || cp->NH % N))
        die("ulysses: cp %d must divide the sequence's %d tokens and the %d heads", N, whole, cp->NH);
    const int *mine = cp->pos_all + cp->starts[cp->rank];
    for (int r = 0; r < N; r++) {
        const int *theirs = cp->pos_all + cp->starts[r];
        for (int t = 0, n = 0; t < cp->count; t++) { // keys of r at or before my query t: a prefix
            while (n < cp->counts[r] && theirs[n] <= mine[t]) n++;
            cp->nvis_host[(size_t)r * M + t] = n;
        }
        for (int s = 0, q = 0; s < cp->counts[r]; s++) { // my first query at or after r's key s
            while (q < cp->count && mine[q] < theirs[s]) q++;
            cp->firstq_host[(size_t)r * M + s] = q;
        }
    }
    CHECK_CUDA(cudaMemcpy(cp->pos_dev, cp->pos_all, sizeof(int) * whole, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(cp->nvis_dev, cp->nvis_host, sizeof(int) * N * M, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(cp->firstq_dev, cp->firstq_host, sizeof(int) * N * M, cudaMemcpyHostToDevice));
}

extern "C" void gpt_cuda_cp_counts(const gpt_cuda_t *g, double counts[3]) {
    const gpu_cp *cp = g->cp;
    counts[0] = cp ? cp->sent_forward : 0, counts[1] = cp ? cp->sent_backward : 0, counts[2] = cp ? cp->pairs : 0;
}

static void cp_free(gpu_cp *cp) {
    if (!cp) return;
    void *bufs[] = {cp->pos_dev, cp->nvis_dev, cp->firstq_dev, cp->kv[0], cp->kv[1], cp->dkv[0], cp->dkv[1], cp->own,
                    cp->run_o, cp->part_o, cp->dq, cp->part_lse, cp->send, cp->recv, cp->heads, cp->dheads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CHECK_CUDA(cudaFree(bufs[i]));
    for (int l = 0; cp->yw && l < cp->L; l++) CHECK_CUDA(cudaFree(cp->yw[l]));
    free(cp->yw), free(cp->counts), free(cp->starts), free(cp->pos_all), free(cp->nvis_host), free(cp->firstq_host);
    free(cp);
}
