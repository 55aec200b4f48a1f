// cublas.c - GEMM on the emulated GPU.
//
// cuBLAS stores matrices column-major: element (i, j) of an m x n matrix
// with leading dimension ld is at [i + j*ld], and ld >= m. op(A) is A or
// its transpose. The call checks its arguments as cuBLAS documents them,
// returns a status at once, and queues the product on the handle's
// stream. The product converts op(A)'s rows and op(B)'s columns to float
// and takes dot products, accumulating in float (CUBLAS_COMPUTE_32F); a
// bf16 result is rounded once, to nearest even.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_internal.h"

#define HANDLE_MAGIC 0x43424c53u

struct cublasContext {
    unsigned magic;
    int device;
    cudaStream_t stream;
    void *workspace;
    size_t workspace_bytes;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
};

static bool valid(cublasHandle_t h) { return h && h->magic == HANDLE_MAGIC; }

cublasStatus_t cublasCreate(cublasHandle_t *out) {
    if (!out) return CUBLAS_STATUS_INVALID_VALUE;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    cublasHandle_t h = calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    h->device = emu_current_device();
    *out = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    cudaStreamSynchronize(h->stream); // queued products read the handle's settings no more, but finish them
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

// As in cuBLAS, setting a stream drops a user workspace (set it again after).
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    h->workspace = NULL, h->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *workspace, size_t bytes) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && (!workspace || emu_memory_kind_of(workspace, bytes, "cublasSetWorkspace workspace") != EMU_DEVICE))
        return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = workspace, h->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
    h->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown error";
}

// ---------------------------------------------------------------- the product

typedef struct {
    const char *name;
    bool trans_a, trans_b;
    int m, n, k, batch;
    float alpha, beta;
    const float *alpha_device, *beta_device; // CUBLAS_POINTER_MODE_DEVICE: read when the product runs
    const void *A, *B;
    void *C;
    cudaDataType a_type, b_type, c_type;
    int lda, ldb, ldc;
    long long stride_a, stride_b, stride_c;
} gemm;

static size_t type_size(cudaDataType t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 4; }

static float load(cudaDataType t, const void *base, long long i) {
    if (t == CUDA_R_16BF) return emu_bf16_bits_to_float(((const unsigned short *)base)[i]);
    if (t == CUDA_R_16F) return emu_half_bits_to_float(((const unsigned short *)base)[i]);
    return ((const float *)base)[i];
}

// Rounded once, to nearest even; a value past half's 65504 becomes inf, as
// on a GPU (what fp16 training's loss scaling watches for).
static void store(cudaDataType t, void *base, long long i, float v) {
    if (t == CUDA_R_16BF) ((unsigned short *)base)[i] = emu_float_to_bf16_bits(v);
    else if (t == CUDA_R_16F) ((unsigned short *)base)[i] = emu_float_to_half_bits(v);
    else ((float *)base)[i] = v;
}

// rows x depth of op(X), row r holding op(X)(r, 0..depth-1), as floats.
static void gather_rows(float *out, cudaDataType t, const void *x, int ld, bool trans, int rows, int depth) {
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < depth; p++)
            out[(size_t)r * depth + p] = load(t, x, trans ? (long long)p + (long long)r * ld : (long long)r + (long long)p * ld);
}

// Eight running sums, so the compiler can use vector instructions (the
// order of a GPU's additions is unspecified too).
static float dot(const float *x, const float *y, int n) {
    float part[8] = {0};
    int p = 0;
    for (; p + 8 <= n; p += 8)
        for (int l = 0; l < 8; l++) part[l] += x[p + l] * y[p + l];
    float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; p < n; p++) sum += x[p] * y[p];
    return sum;
}

// Tells the race checker which bytes of a column-major matrix the product touches.
static void touch_matrix(const void *x, cudaDataType t, int rows, int cols, int ld, bool write) {
    for (int j = 0; j < cols; j++)
        emu_race_range((const char *)x + (size_t)j * (size_t)ld * type_size(t), (size_t)rows * type_size(t), write);
}

static emu_op_status run_gemm(void *state) {
    gemm *g = (gemm *)state;
    float alpha = g->alpha_device ? *g->alpha_device : g->alpha;
    float beta = g->beta_device ? *g->beta_device : g->beta;
    float *a = malloc(sizeof(float) * ((size_t)g->m * g->k + 1));
    float *bt = malloc(sizeof(float) * ((size_t)g->n * g->k + 1)); // op(B) transposed: column j is a row
    if (!a || !bt) emu_fatal("out of host memory for a %d x %d x %d GEMM", g->m, g->n, g->k);
    for (int b = 0; b < g->batch; b++) {
        const char *A = (const char *)g->A + (size_t)(b * g->stride_a) * type_size(g->a_type);
        const char *B = (const char *)g->B + (size_t)(b * g->stride_b) * type_size(g->b_type);
        char *C = (char *)g->C + (size_t)(b * g->stride_c) * type_size(g->c_type);
        touch_matrix(A, g->a_type, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, false);
        touch_matrix(B, g->b_type, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, false);
        if (beta != 0.0f) touch_matrix(C, g->c_type, g->m, g->n, g->ldc, false);
        touch_matrix(C, g->c_type, g->m, g->n, g->ldc, true);
        gather_rows(a, g->a_type, A, g->lda, g->trans_a, g->m, g->k);
        gather_rows(bt, g->b_type, B, g->ldb, !g->trans_b, g->n, g->k);
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->m; i++) {
                float sum = dot(a + (size_t)i * g->k, bt + (size_t)j * g->k, g->k);
                long long at = (long long)i + (long long)j * g->ldc;
                // beta == 0: C is written, never read (it may be uninitialised).
                float out = alpha * sum + (beta != 0.0f ? beta * load(g->c_type, C, at) : 0.0f);
                store(g->c_type, C, at, out);
            }
    }
    free(a);
    free(bt);
    return EMU_OP_DONE;
}

// The bytes a rows x cols matrix (column-major, ld) spans, `batch` times `stride` apart.
static size_t span_bytes(int rows, int cols, int ld, long long stride, int batch, cudaDataType t) {
    long long last = (long long)(rows - 1) + (long long)(cols - 1) * ld + (long long)(batch - 1) * (stride > 0 ? stride : 0);
    return (size_t)(last + 1) * type_size(t);
}

static cublasStatus_t check_matrix(const char *call, const char *which, const void *p, int rows, int cols, int ld,
                                   long long stride, int batch, cudaDataType t) {
    if (rows == 0 || cols == 0) return CUBLAS_STATUS_SUCCESS;
    char what[160];
    snprintf(what, sizeof what, "%s: matrix %s (%d x %d, leading dimension %d)", call, which, rows, cols, ld);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_memory_kind_of(p, span_bytes(rows, cols, ld, stride, batch, t), what) != EMU_DEVICE)
        emu_fatal("%s is host memory; cuBLAS reads and writes device memory (a GPU would fault)", what);
    return CUBLAS_STATUS_SUCCESS;
}

static bool supported(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t compute) {
    bool inputs = (a == CUDA_R_32F && b == CUDA_R_32F) || (a == CUDA_R_16BF && b == CUDA_R_16BF) ||
                  (a == CUDA_R_16F && b == CUDA_R_16F);
    bool output = c == a || c == CUDA_R_32F;
    bool accumulate = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                      compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF;
    return inputs && output && accumulate;
}

static cublasStatus_t gemm_call(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                cublasComputeType_t compute) {
    if (!valid(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool ok_ops = (ta == CUBLAS_OP_N || ta == CUBLAS_OP_T || ta == CUBLAS_OP_C) &&
                  (tb == CUBLAS_OP_N || tb == CUBLAS_OP_T || tb == CUBLAS_OP_C);
    int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (!ok_ops || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!supported(at, bt, ct, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t st;
    int kk = k ? k : 1;
    if (k && (st = check_matrix(call, "A", A, a_rows, ta == CUBLAS_OP_N ? kk : m, lda, sa, batch, at))) return st;
    if (k && (st = check_matrix(call, "B", B, b_rows, tb == CUBLAS_OP_N ? n : kk, ldb, sb, batch, bt))) return st;
    if ((st = check_matrix(call, "C", C, m, n, ldc, sc, batch, ct))) return st;
    gemm *g = calloc(1, sizeof *g);
    if (!g) return CUBLAS_STATUS_ALLOC_FAILED;
    *g = (gemm){call, ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, batch, 0, 0, NULL, NULL, A, B, C, at, bt, ct,
                lda, ldb, ldc, sa, sb, sc};
    if (h->pointer_mode == CUBLAS_POINTER_MODE_HOST) g->alpha = *(const float *)alpha, g->beta = *(const float *)beta;
    else g->alpha_device = (const float *)alpha, g->beta_device = (const float *)beta;
    if (emu_stream_enqueue(h->stream, call, run_gemm, g, free, NULL, EMU_OP_REPLAYABLE) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm_call("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta,
                     C, ct, ldc, sc, batch, compute);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm_call("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                     compute);
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    return gemm_call("cublasSgemm", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C,
                     CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch) {
    return gemm_call("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F,
                     ldb, sb, beta, C, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F);
}
