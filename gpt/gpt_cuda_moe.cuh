// gpt_cuda_moe.cuh - the mixture of experts of gpt/moe.h on the GPU
// (chapter 13), included by gpt_cuda.cu: block_forward and block_backward
// call moe_forward / moe_backward where the dense MLP would run.
//
// Read it beside gpt/moe.h: the same steps, the same formulas, the same
// order of additions where it decides the last bits. One layer:
//   1. the router: logits = x Wr^T with cuBLAS (fp32 logits), then one
//      thread per token: softmax (in double, as the CPU), the top K (ties:
//      the lower expert), their gates renormalised to add up to 1;
//   2. capacity and dispatch: ONE thread walks the assignments in the
//      CPU's order - first choices first, then seconds, each in token
//      order, group by group - so it drops exactly the tokens the CPU
//      drops; it counts the rows per expert and gives every kept
//      assignment its row in expert order (slot, and sent: its inverse).
//      The walk is serial on purpose: the order IS the rule. (A parallel
//      version is a prefix sum per expert over a token-major order; it
//      drops the same tokens only if it keeps this order.)
//   3. the host reads the counts (E numbers: it waits for the GPU here)
//      to launch one pair of cuBLAS products per expert on its rows;
//   4. the rows are gathered into expert order, the experts run
//      (c_fc, GELU, c_proj: the dense MLP's kernels on fewer rows), and
//      the combine adds each token's gate-weighted kept rows to its
//      residual stream, in the order of its choices. A dropped choice adds
//      nothing: an all-dropped token leaves on the residual alone.
// Backward reverses it: dy of a row is gate * dout, the gate's gradient
// <dout, expert(x)>, the experts' backward products, the router's
// gradient through the renormalisation, the balancing loss and the softmax
// (one thread per token), and the input's gradient: the kept rows' plus
// the router's.
//
// Because step 3 waits for the GPU, a mixture's step cannot be one CUDA
// graph (the counts change every step): gpt_cuda_graph_step refuses it.
//
// Expert parallelism (cfg.ep = P > 1: this GPU holds E/P experts of each
// block, gpt_layout.h section 7) adds gpt/moe.h's two exchanges, on device
// buffers, through the caller's callbacks (gpt_cuda_ep_comm: the ep
// group's all-to-alls, blocking; the stream is waited for first):
//   3a. the counts: the E rows per expert this rank sends (on the device
//       after step 2) go out E/P to each rank, which learns how many rows
//       each rank sends to each of its experts; the host reads both;
//   3b. the rows, already in expert order (so in rank order: rank p's
//       experts are p E/P ...), with pg_all_to_all_v; they arrive rank by
//       rank, expert by expert within each, and a permutation (order,
//       computed on the GPU from the counts) puts them expert-major, each
//       expert's rows from every rank in rank order - gpt/moe.h's order,
//       so the sums match the CPU's;
//   4. the local experts run on them; their outputs go back through the
//       inverse permutation and the reverse exchange, landing in the rows'
//       own order (ye), where the combine reads them as with P = 1.
// Backward: the rows' gradients make the same trip (dsend out, expert-major,
// the experts' backward, back), then the router as before. Capacity is
// counted over this rank's own tokens (its micro-batch), as on the CPU.
// What is not here: fp16 (its loss scale would have to reach the
// balancing loss's gradient), refused at create.

// One layer's state between its forward and its backward pass (device
// buffers but count, which the host keeps for the backward's launches).
struct moe_cuda_layer {
    float *probs;     // (N, E) the router's softmax (fp32)
    int *choice;      // (N, K) the chosen experts
    float *gate;      // (N, K) their renormalised gates
    int *slot;        // (N, K) the row the assignment was sent as, -1: dropped
    int *sent;        // (N K) which assignment row s is
    float *aux_scale; // (G, E) d(balancing loss)/d p_{n,e} for a token of group g
    void *xe, *h, *hg, *ye; // Act: (R, C), (R, 4C), (R, 4C), (N K, C): the experts' rows in expert order (R = P N K
                            // rows: all a rank can receive; N K with P = 1), and the outputs in the rows' order
    int *order;       // (R) expert parallelism: the expert-major position of received row i
    int *count;       // host (3 E + 2): rows kept per expert, the assignments dropped, the
                      // assignments per expert before drops, the balancing loss (a float's bits),
                      // and (ep > 1) the rows rank p sends to my expert e ([p E/P + e])
    int rows;         // rows kept (sum of count)
    int received;     // rows received for this rank's experts (= rows with P = 1)
    int groups;       // capacity groups of the last forward pass
    bool train;       // the last forward pass was a training pass
};

struct moe_cuda {
    int L, N, K, E, G, C;      // layers held, room for N tokens and G groups
    moe_cuda_layer *layer;
    bool train;                // the next forward pass is a training pass (gpt_cuda_set_train_pass)
    float grad_scale;          // the backward pass's: scales the balancing loss's gradient as the cross-entropy's
    void *dsend, *dh, *dxe;    // backward scratch, Act: (N K, C), (N K, 4C), (N K, C)
    void *dlogits;             // Act (N, E)
    float *dgate;              // (N K)
    int *work;                 // the dispatch thread's counters: (3 G E + G + 2 E + 2)
    int *counts;               // device: the E counts and the drops (and, ep > 1, the E received), copied to the host
    void *xa, *xb;             // expert parallelism: Act (R, C) each, rows in transit (rank-major, expert-major)
    void *base;                // the one allocation all of the above are carved from
    size_t bytes;
    int P;                     // expert parallelism: the ep group's ranks (1: every expert here)
    gpt_cuda_ep_comm comm;     // its exchanges (gpt_cuda_expert_parallel)
    double sent[2], exchanges[2]; // numbers passed to the row exchanges and their calls, forward and backward
};

// Buffers of size `bytes` carved one after another from base (NULL: only
// counted), each on a 256-byte boundary (cuBLAS's and vector loads' liking).
static void *moe_carve(char *base, size_t *at, size_t bytes) {
    void *p = base ? base + *at : NULL;
    *at += (bytes + 255) / 256 * 256;
    return p;
}

// The layout of every MoE buffer for L layers, N tokens, G groups and
// activations of `act` bytes; returns the bytes. plan_memory counts them
// with m NULL, create carves them.
// With expert parallelism (P ranks) a rank may receive up to P N K rows
// (every rank's every assignment, dropless): the experts' buffers are
// sized for that worst case, P times a whole model's.
static size_t moe_layout(moe_cuda *m, char *base, const gpt_config *c, size_t L, size_t N, size_t act) {
    size_t K = (size_t)c->top_k, E = (size_t)c->n_expert, C = (size_t)c->n_embd, H = 4 * C, at = 0;
    size_t G = c->capacity_groups > 1 ? (size_t)c->capacity_groups : 1;
    size_t P = (size_t)gpt_ep_ways(c->ep), R = P * N * K, X = P > 1 ? R : 0;
    for (size_t l = 0; l < L; l++) {
        moe_cuda_layer tmp, *y = m ? &m->layer[l] : &tmp;
        y->probs = (float *)moe_carve(base, &at, N * E * 4);
        y->choice = (int *)moe_carve(base, &at, N * K * 4);
        y->gate = (float *)moe_carve(base, &at, N * K * 4);
        y->slot = (int *)moe_carve(base, &at, N * K * 4);
        y->sent = (int *)moe_carve(base, &at, N * K * 4);
        y->aux_scale = (float *)moe_carve(base, &at, G * E * 4);
        y->xe = moe_carve(base, &at, R * C * act), y->h = moe_carve(base, &at, R * H * act);
        y->hg = moe_carve(base, &at, R * H * act), y->ye = moe_carve(base, &at, N * K * C * act);
        y->order = (int *)moe_carve(base, &at, X * 4);
    }
    moe_cuda tmp, *s = m ? m : &tmp;
    s->dsend = moe_carve(base, &at, N * K * C * act), s->dh = moe_carve(base, &at, R * H * act);
    s->dxe = moe_carve(base, &at, N * K * C * act), s->dlogits = moe_carve(base, &at, N * E * act);
    s->dgate = (float *)moe_carve(base, &at, N * K * 4);
    s->work = (int *)moe_carve(base, &at, (3 * G * E + G + 2 * E + 2) * 4);
    s->counts = (int *)moe_carve(base, &at, (2 * E + 2 + (P > 1 ? E : 0)) * 4);
    s->xa = moe_carve(base, &at, X * C * act), s->xb = moe_carve(base, &at, X * C * act);
    return at;
}

// The MoE's part of the memory plan: 0 for a dense model.
static size_t moe_plan_bytes(const gpt_config *c, size_t L, size_t N, size_t act) {
    return c->n_expert ? moe_layout(NULL, NULL, c, L, N, act) : 0;
}

// What the GPU path of the mixture does not do, refused in one line.
static void moe_check(const gpt_config *c, gpt_precision precision) {
    if (!c->n_expert) return;
    if (precision == GPT_FP16)
        die("gpt_cuda_create: a mixture of experts trains in fp32 or bf16 on a GPU, not fp16 (the loss scale does "
            "not reach the balancing loss's gradient)");
}

static moe_cuda *moe_create(const gpt_config *c, int L, int B, int T, size_t act, size_t *allocated) {
    if (!c->n_expert) return NULL;
    moe_cuda *m = (moe_cuda *)xcalloc(1, sizeof *m);
    m->L = L, m->N = B * T, m->K = c->top_k, m->E = c->n_expert, m->C = c->n_embd;
    m->G = c->capacity_groups > 1 ? c->capacity_groups : 1;
    m->P = gpt_ep_ways(c->ep);
    m->layer = (moe_cuda_layer *)xcalloc((size_t)L, sizeof(moe_cuda_layer));
    m->bytes = moe_layout(NULL, NULL, c, (size_t)L, (size_t)m->N, act);
    cudaError_t err = cudaMalloc(&m->base, m->bytes);
    if (err != cudaSuccess)
        die("cudaMalloc of %.1f MiB for the mixture of experts' buffers failed: %s", m->bytes / 1048576.0,
            cudaGetErrorString(err));
    *allocated += m->bytes;
    moe_layout(m, (char *)m->base, c, (size_t)L, (size_t)m->N, act);
    for (int l = 0; l < L; l++) m->layer[l].count = (int *)xcalloc(3 * (size_t)m->E + 2, sizeof(int));
    return m;
}

static void moe_free(moe_cuda *m) {
    if (!m) return;
    CHECK_CUDA(cudaFree(m->base));
    for (int l = 0; l < m->L; l++) free(m->layer[l].count);
    free(m->layer), free(m);
}

// Where tensor i of block l lies in the block's part of a flat array
// (gpt_cuda.cu's off(), which is defined after this file is included).
static size_t moe_off(const gpt_cuda_t *g, int l, int i) {
    return g->tensors[gpt_block_tensor(&g->cfg, l, i)].offset - g->tensors[gpt_block_tensor(&g->cfg, l, 0)].offset;
}

// --- 1. the router, one thread per token: probs holds the logits on
// entry and the softmax on return (gpt/moe.h's loop, the same types).
static __global__ void moe_router_kernel(float *probs, int *choice, float *gate, int N, int E, int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float *p = probs + (size_t)n * E;
    double mx = p[0], sum = 0;
    for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((double)p[e] - mx);
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)p[e] - mx) / sum);
    int *ch = choice + (size_t)n * K;
    double kept = 0;
    for (int k = 0; k < K; k++) { // the k-th largest: the largest not chosen yet
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= ch[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ch[k] = best, kept += p[best];
    }
    for (int k = 0; k < K; k++) gate[(size_t)n * K + k] = (float)(p[ch[k]] / kept);
}

// --- 2. capacity and dispatch, by one thread (see the top: the order is
// the rule). Token n (of T per sequence) is in group (n / T) % G. counts
// gets the rows per expert, the assignments dropped, the assignments per
// expert before drops, and (training passes) the balancing loss, for the
// chapter's tables.
static __global__ void moe_dispatch_kernel(const float *probs, const int *choice, int *slot, int *sent,
                                           float *aux_scale, int *counts,
                                           int *work, int N, int T, int K, int E, int G, bool train,
                                           float capacity_factor, float aux_loss_coef) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int *served = work, *chose = served + G * E, *tokens = chose + G * E, *start = tokens + G;
    for (int i = 0; i < 2 * G * E + G; i++) work[i] = 0;
    for (int n = 0; n < N; n++) tokens[(n / T) % G]++;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            int g = (n / T) % G, e = choice[(size_t)n * K + k];
            long cap = train && capacity_factor > 0 ? (long)ceilf(capacity_factor * tokens[g] * K / E) : N;
            chose[g * E + e]++;
            slot[(size_t)n * K + k] = served[g * E + e] < cap ? 0 : -1;
            served[g * E + e] += served[g * E + e] < cap;
        }
    double aux = 0;
    for (int e = 0; e < E; e++) counts[E + 1 + e] = 0;
    for (int g = 0; train && g < G; g++) {
        double aux_g = 0;
        for (int e = 0; e < E; e++) {
            double f = (double)chose[g * E + e] / ((double)tokens[g] * K), P_e = 0;
            for (int n = 0; n < N; n++)
                if ((n / T) % G == g) P_e += probs[(size_t)n * E + e];
            aux_g += E * f * P_e / tokens[g];
            aux_scale[g * E + e] = (float)(aux_loss_coef * E * f / tokens[g] / G);
            counts[E + 1 + e] += chose[g * E + e];
        }
        aux += aux_g / G;
    }
    float aux_f = (float)aux;
    memcpy(&counts[2 * E + 1], &aux_f, sizeof aux_f);
    int dropped = 0;
    for (int e = 0; e <= E; e++) start[e] = 0;
    for (int a = 0; a < N * K; a++) {
        if (slot[a] >= 0) start[choice[a] + 1]++;
        else dropped++;
    }
    for (int e = 0; e < E; e++) counts[e] = start[e + 1], start[e + 1] += start[e];
    counts[E] = dropped;
    for (int a = 0; a < N * K; a++) {
        if (slot[a] < 0) continue;
        int s = start[choice[a]]++;
        slot[a] = s, sent[s] = a;
    }
}

// Row s of xe is the input of the token assignment sent[s] belongs to.
template <typename Act>
static __global__ void moe_gather_kernel(Act *xe, const Act *x, const int *sent, int S, int K, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)S * C) return;
    size_t s = i / C, ch = i % C;
    xe[i] = x[(size_t)(sent[s] / K) * C + ch];
}

// --- 3b. expert parallelism: where received row i goes. The rows arrive
// rank by rank, expert by expert within each rank's block (cin[p El + e]
// rows from rank p for my expert e); expert e's rows start after every
// rank's rows for experts e' < e, and within expert e rank p's follow
// those of ranks p' < p: gpt/moe.h's order (its `fill`).
static __global__ void moe_order_kernel(int *order, const int *cin, int P, int El, int R) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R) return;
    for (int p = 0, start = 0; p < P; p++)
        for (int e = 0; e < El; start += cin[p * El + e], e++) {
            if (i >= start + cin[p * El + e]) continue;
            int at = i - start;
            for (int f = 0; f < e; f++)
                for (int q = 0; q < P; q++) at += cin[q * El + f];
            for (int q = 0; q < p; q++) at += cin[q * El + e];
            order[i] = at;
            return;
        }
}

// Rows of C numbers moved by that order: to (dst[order[i]] = src[i]) or
// from (dst[i] = src[order[i]]) expert-major.
template <typename Act>
static __global__ void moe_permute_kernel(Act *dst, const Act *src, const int *order, int R, int C, bool to_experts) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)R * C) return;
    size_t r = i / C, ch = i % C, o = (size_t)order[r];
    if (to_experts) dst[o * C + ch] = src[i];
    else dst[i] = src[o * C + ch];
}

// --- 4. combine: out = res + sum over the kept choices of gate * row.
template <typename Act>
static __global__ void moe_combine_kernel(Act *out, const Act *res, const Act *ye, const int *slot, const float *gate,
                                          int N, int K, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, ch = i % C;
    float o = to_f(res[i]); // the residual: all a dropped token keeps
    for (int k = 0; k < K; k++) {
        int s = slot[n * K + k];
        if (s < 0) continue;
        o += gate[n * K + k] * to_f(ye[(size_t)s * C + ch]);
    }
    out[i] = from_f<Act>(o);
}

// --- backward: row s's gradient is gate * dout of its token, and the
// gate's is <dout, row>: one thread per row for the dot product (in the
// CPU's order), one per number for the rows.
template <typename Act>
static __global__ void moe_dgate_kernel(float *dgate, const Act *dout, const Act *ye, const int *sent, int S, int K,
                                        int C) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= S) return;
    int a = sent[s];
    const Act *d = dout + (size_t)(a / K) * C, *r = ye + (size_t)s * C;
    float dot = 0;
    for (int ch = 0; ch < C; ch++) dot += to_f(d[ch]) * to_f(r[ch]);
    dgate[a] = dot;
}

template <typename Act>
static __global__ void moe_dsend_kernel(Act *dsend, const Act *dout, const float *gate, const int *sent, int S, int K,
                                        int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)S * C) return;
    size_t s = i / C, ch = i % C;
    int a = sent[s];
    dsend[i] = from_f<Act>(gate[a] * to_f(dout[(size_t)(a / K) * C + ch]));
}

// The router's gradient, one thread per token (gpt/moe.h's formulas):
// g_k = p_k / S gives dp_k = (dg_k - sum_j dg_j g_j) / S; the balancing
// loss adds grad_scale * aux_scale to every dp_e; the softmax then gives
// dlogit_e = p_e (dp_e - sum_j p_j dp_j). A dropped choice's gate has
// gradient 0 (it added nothing).
static __device__ __forceinline__ float moe_dp(int e, const float *aux, float grad_scale, bool train, const float *dg,
                                               const int *ch, float mix, float sum, int K) {
    float d = train ? grad_scale * aux[e] : 0;
    for (int k = 0; k < K; k++)
        if (ch[k] == e) d += (dg[k] - mix) / sum;
    return d;
}

template <typename Act>
static __global__ void moe_router_backward_kernel(Act *dlogits, float *dgate, const float *probs, const float *gate,
                                                  const int *choice, const int *slot, const float *aux_scale,
                                                  float grad_scale, bool train, int N, int T, int G, int K, int E) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *p = probs + (size_t)n * E, *g = gate + (size_t)n * K;
    float *dg = dgate + (size_t)n * K;
    const int *ch = choice + (size_t)n * K;
    for (int k = 0; k < K; k++)
        if (slot[(size_t)n * K + k] < 0) dg[k] = 0;
    float mix = 0, sum = 0, dot = 0;
    for (int k = 0; k < K; k++) mix += dg[k] * g[k], sum += p[ch[k]];
    const float *aux = aux_scale + ((n / T) % G) * E;
    // dp_e, computed twice (for the dot product, then for the output)
    // rather than kept in an array of E numbers per thread: the same
    // operations in the same order as the CPU's.
    for (int e = 0; e < E; e++) dot += p[e] * moe_dp(e, aux, grad_scale, train, dg, ch, mix, sum, K);
    for (int e = 0; e < E; e++)
        dlogits[(size_t)n * E + e] = from_f<Act>(p[e] * (moe_dp(e, aux, grad_scale, train, dg, ch, mix, sum, K) - dot));
}

// dx = (sum over the kept choices of their rows' input gradients) + the
// router's input gradient (in dx on entry), added in the CPU's order.
template <typename Act>
static __global__ void moe_dx_kernel(Act *dx, const Act *dxe, const int *slot, int N, int K, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, ch = i % C;
    float o = 0;
    for (int k = 0; k < K; k++) {
        int s = slot[n * K + k];
        if (s >= 0) o += to_f(dxe[(size_t)s * C + ch]);
    }
    dx[i] = from_f<Act>(o + to_f(dx[i]));
}

template <typename Act>
static gpt_cuda_type moe_type() { return sizeof(Act) == 4 ? GPT_CUDA_F32 : GPT_CUDA_BF16; }

// The rows of layer y each local expert runs: from this rank (P = 1), or
// from every rank (the counts received); returns their sum. With P > 1
// also the numbers (rows x C) sent to and received from each rank.
static int moe_rows(const moe_cuda *m, const moe_cuda_layer *y, int C, int *rows, size_t *out, size_t *in) {
    int E = m->E, P = m->P, El = E / P, R = 0;
    const int *cin = y->count + 2 * E + 2;
    for (int e = 0; e < El; e++) {
        rows[e] = P == 1 ? y->count[e] : 0;
        for (int p = 0; P > 1 && p < P; p++) rows[e] += cin[p * El + e];
        R += rows[e];
    }
    for (int p = 0; P > 1 && p < P; p++) {
        out[p] = in[p] = 0;
        for (int e = 0; e < El; e++)
            out[p] += (size_t)y->count[p * El + e] * (size_t)C, in[p] += (size_t)cin[p * El + e] * (size_t)C;
    }
    return R;
}

// One exchange of rows over the ep group (gpt/moe.h's moe_exchange): the
// numbers `out[p]` to rank p, `in[p]` from it, once the GPU has computed
// them. pass 0: forward, counted on training passes (as the CPU counts); 1: backward.
template <typename Act>
static void moe_exchange(gpt_cuda_t *g, const void *send, const size_t *out, void *recv, const size_t *in, int pass,
                         bool count) {
    moe_cuda *m = g->moe;
    if (!m->comm.rows)
        die("an expert-parallel GPU model (ep %d) needs gpt_cuda_expert_parallel: the exchanges over its ranks", m->P);
    for (int p = 0; count && p < m->P; p++) m->sent[pass] += (double)out[p];
    m->exchanges[pass] += count;
    CHECK_CUDA(cudaStreamSynchronize(g->ctx.stream)); // the rows to send are on the GPU now
    m->comm.rows(m->comm.user, send, out, recv, in, moe_type<Act>());
}

template <typename Act>
static void moe_permute(const gpu_ctx *cx, Act *dst, const Act *src, const int *order, int R, int C, bool to_experts) {
    if (!R) return;
    moe_permute_kernel<Act><<<blocks_for((size_t)R * C, 256), 256, 0, cx->stream>>>(dst, src, order, R, C, to_experts);
    launched("moe_permute_kernel");
}

// The layer's forward pass: out = res + the mixture of x (ln_2's output).
// p, w: the block's fp32 parameters and the weights the products read
// (this rank's experts: E/P of them).
template <typename Act>
static void moe_forward(gpt_cuda_t *g, int l, const float *p, const Act *w, const Act *x, const Act *res, Act *out) {
    moe_cuda *m = g->moe;
    moe_cuda_layer *y = &m->layer[l - g->stage.first];
    const gpt_config *c = &g->cfg;
    const gpu_ctx *cx = &g->ctx;
    int N = g->B * g->T, C = c->n_embd, E = c->n_expert, K = c->top_k, H = 4 * C, P = m->P, El = E / P;
    int G = m->train && c->capacity_groups > 1 ? c->capacity_groups : 1;
    if (G > g->B) die("moe: %d capacity groups for a batch of %d sequences", G, g->B);
    y->train = m->train, y->groups = G;
    matmul_forward<Act, float>(cx, y->probs, x, w + moe_off(g, l, B_ROUTER_W), NULL, N, C, E);
    moe_router_kernel<<<blocks_for((size_t)N, 128), 128, 0, cx->stream>>>(y->probs, y->choice, y->gate, N, E, K);
    launched("moe_router_kernel");
    moe_dispatch_kernel<<<1, 1, 0, cx->stream>>>(y->probs, y->choice, y->slot, y->sent, y->aux_scale, m->counts, m->work, N,
                                                 g->T, K, E, G, m->train, c->capacity_factor, c->aux_loss_coef);
    launched("moe_dispatch_kernel");
    if (P > 1) { // 3a. my rows per expert, E/P to each rank; its rows per expert of mine back
        if (!m->comm.counts)
            die("an expert-parallel GPU model (ep %d) needs gpt_cuda_expert_parallel: the exchanges over its ranks", P);
        CHECK_CUDA(cudaStreamSynchronize(cx->stream)); // the counts are on the GPU now
        m->comm.counts(m->comm.user, m->counts, m->counts + 2 * E + 2, El);
    }
    // The host needs the rows per expert to size the experts' products.
    CHECK_CUDA(cudaMemcpyAsync(y->count, m->counts, sizeof(int) * (size_t)(2 * E + 2 + (P > 1 ? E : 0)),
                               cudaMemcpyDeviceToHost, cx->stream));
    CHECK_CUDA(cudaStreamSynchronize(cx->stream));
    y->rows = 0;
    for (int e = 0; e < E; e++) y->rows += y->count[e];
    int S = y->rows, *rows = (int *)xmalloc(sizeof(int) * (size_t)El);
    size_t *out_n = (size_t *)xmalloc(sizeof(size_t) * 2 * (size_t)P), *in_n = out_n + P;
    int R = y->received = moe_rows(m, y, C, rows, out_n, in_n);
    if (R > P * m->N * K) die("moe: %d rows received, room for %d", R, P * m->N * K);
    Act *xe = (Act *)y->xe, *h = (Act *)y->h, *hg = (Act *)y->hg, *ye = (Act *)y->ye;
    Act *xa = (Act *)m->xa, *xb = (Act *)m->xb;
    if (S) {
        moe_gather_kernel<Act><<<blocks_for((size_t)S * C, 256), 256, 0, cx->stream>>>(xe, x, y->sent, S, K, C);
        launched("moe_gather_kernel");
    }
    if (P > 1) { // 3b. the rows to their experts' ranks, then expert-major
        moe_exchange<Act>(g, xe, out_n, xa, in_n, 0, m->train);
        if (R) {
            moe_order_kernel<<<blocks_for((size_t)R, 128), 128, 0, cx->stream>>>(y->order, m->counts + 2 * E + 2, P,
                                                                                 El, R);
            launched("moe_order_kernel");
        }
        moe_permute(cx, xe, xa, y->order, R, C, true);
    }
    const Act *fc_w = w + moe_off(g, l, B_FC_W), *proj_w = w + moe_off(g, l, B_FCPROJ_W);
    const float *fc_b = p + moe_off(g, l, B_FC_B), *proj_b = p + moe_off(g, l, B_FCPROJ_B);
    Act *yo = P > 1 ? xb : ye; // the experts' outputs, expert-major (with P = 1 the rows' own order)
    for (int e = 0, r0 = 0; e < El; r0 += rows[e], e++) {
        if (!rows[e]) continue;
        size_t r = (size_t)r0;
        matmul_forward(cx, h + r * H, xe + r * C, fc_w + (size_t)e * H * C, fc_b + (size_t)e * H, rows[e], C, H);
        gelu_forward(cx, hg + r * H, h + r * H, (size_t)rows[e] * H);
        matmul_forward(cx, yo + r * C, hg + r * H, proj_w + (size_t)e * C * H, proj_b + (size_t)e * C, rows[e], H, C);
    }
    if (P > 1) { // 4. the outputs back to the ranks they came from, into the rows' order
        moe_permute(cx, xa, xb, y->order, R, C, false);
        moe_exchange<Act>(g, xa, in_n, ye, out_n, 0, m->train);
    }
    free(rows), free(out_n);
    moe_combine_kernel<Act><<<blocks_for((size_t)N * C, 256), 256, 0, cx->stream>>>(out, res, ye, y->slot, y->gate, N,
                                                                                    K, C);
    launched("moe_combine_kernel");
}

// The layer's backward pass: dout = d(loss)/d(out) (the residual stream's
// gradient); dx gets d(loss)/d(x), overwritten; d the block's gradients.
template <typename Act>
static void moe_backward(gpt_cuda_t *g, int l, const Act *w, float *d, const Act *x, const Act *dout, Act *dx) {
    moe_cuda *m = g->moe;
    moe_cuda_layer *y = &m->layer[l - g->stage.first];
    const gpt_config *c = &g->cfg;
    const gpu_ctx *cx = &g->ctx;
    int N = g->B * g->T, C = c->n_embd, E = c->n_expert, K = c->top_k, H = 4 * C, S = y->rows, P = m->P, El = E / P;
    Act *dsend = (Act *)m->dsend, *dh = (Act *)m->dh, *dxe = (Act *)m->dxe, *xa = (Act *)m->xa, *xb = (Act *)m->xb;
    int *rows = (int *)xmalloc(sizeof(int) * (size_t)El);
    size_t *out_n = (size_t *)xmalloc(sizeof(size_t) * 2 * (size_t)P), *in_n = out_n + P;
    int R = moe_rows(m, y, C, rows, out_n, in_n);
    CHECK_CUDA(cudaMemsetAsync(m->dgate, 0, sizeof(float) * (size_t)N * K, cx->stream));
    if (S) {
        moe_dgate_kernel<Act><<<blocks_for((size_t)S, 128), 128, 0, cx->stream>>>(m->dgate, dout, (const Act *)y->ye,
                                                                                  y->sent, S, K, C);
        launched("moe_dgate_kernel");
        moe_dsend_kernel<Act><<<blocks_for((size_t)S * C, 256), 256, 0, cx->stream>>>(dsend, dout, y->gate, y->sent,
                                                                                       S, K, C);
        launched("moe_dsend_kernel");
    }
    Act *dye = dsend, *dxl = dxe; // the experts' output and input gradients, expert-major
    if (P > 1) { // the outputs' gradients to the experts' ranks, expert-major there
        moe_exchange<Act>(g, dsend, out_n, xa, in_n, 1, true);
        moe_permute(cx, xb, xa, y->order, R, C, true);
        dye = xb, dxl = xa;
    }
    const Act *fc_w = w + moe_off(g, l, B_FC_W), *proj_w = w + moe_off(g, l, B_FCPROJ_W);
    float *dfc_w = d + moe_off(g, l, B_FC_W), *dfc_b = d + moe_off(g, l, B_FC_B);
    float *dproj_w = d + moe_off(g, l, B_FCPROJ_W), *dproj_b = d + moe_off(g, l, B_FCPROJ_B);
    const Act *xe = (const Act *)y->xe, *h = (const Act *)y->h, *hg = (const Act *)y->hg;
    for (int e = 0, r0 = 0; e < El; r0 += rows[e], e++) {
        if (!rows[e]) continue;
        size_t r = (size_t)r0;
        matmul_backward(cx, dh + r * H, dproj_w + (size_t)e * C * H, dproj_b + (size_t)e * C, dye + r * C, hg + r * H,
                        proj_w + (size_t)e * C * H, rows[e], H, C);
        gelu_backward(cx, dh + r * H, h + r * H, dh + r * H, (size_t)rows[e] * H);
        matmul_backward(cx, dxl + r * C, dfc_w + (size_t)e * H * C, dfc_b + (size_t)e * H, dh + r * H, xe + r * C,
                        fc_w + (size_t)e * H * C, rows[e], C, H);
    }
    if (P > 1) { // the inputs' gradients back, into the rows' order
        moe_permute(cx, xb, xa, y->order, R, C, false);
        moe_exchange<Act>(g, xb, in_n, dxe, out_n, 1, true);
    }
    free(rows), free(out_n);
    Act *dlogits = (Act *)m->dlogits;
    moe_router_backward_kernel<Act><<<blocks_for((size_t)N, 128), 128, 0, cx->stream>>>(
        dlogits, m->dgate, y->probs, y->gate, y->choice, y->slot, y->aux_scale, m->grad_scale, y->train, N, g->T,
        y->groups, K, E);
    launched("moe_router_backward_kernel");
    matmul_backward(cx, dx, d + moe_off(g, l, B_ROUTER_W), (float *)NULL, dlogits, x, w + moe_off(g, l, B_ROUTER_W), N, C, E);
    moe_dx_kernel<Act><<<blocks_for((size_t)N * C, 256), 256, 0, cx->stream>>>(dx, dxe, y->slot, N, K, C);
    launched("moe_dx_kernel");
}

extern "C" void gpt_cuda_set_train_pass(gpt_cuda_t *g, bool train) {
    if (g->moe) g->moe->train = train;
}

extern "C" int gpt_cuda_moe_counts(const gpt_cuda_t *g, int layer, int *routed, float *aux) {
    if (!g->moe || layer < g->stage.first || layer >= g->stage.last) return -1;
    const moe_cuda_layer *y = &g->moe->layer[layer - g->stage.first];
    int E = g->cfg.n_expert;
    if (routed) memcpy(routed, y->count + E + 1, sizeof(int) * (size_t)E);
    if (aux) memcpy(aux, y->count + 2 * E + 1, sizeof(float));
    return y->count[E];
}

extern "C" void gpt_cuda_expert_parallel(gpt_cuda_t *g, gpt_cuda_ep_comm comm) {
    if (!g->moe || g->moe->P == 1) die("gpt_cuda_expert_parallel: the model holds every expert (ep 1)");
    g->moe->comm = comm;
}

extern "C" void gpt_cuda_moe_take_traffic(gpt_cuda_t *g, double sent[2], double exchanges[2]) {
    for (int i = 0; i < 2; i++) {
        sent[i] = g->moe ? g->moe->sent[i] : 0, exchanges[i] = g->moe ? g->moe->exchanges[i] : 0;
        if (g->moe) g->moe->sent[i] = g->moe->exchanges[i] = 0;
    }
}
