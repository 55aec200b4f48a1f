// powersgd.h - PowerSGD, DDP's low-rank gradient compression hook
// (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook), on host
// memory.
//
// A gradient matrix M (rows x cols) is sent as two thin matrices: P = M Q
// (rows x R) and Q = M^T P (cols x R), R the rank, instead of rows x cols
// numbers. One step, as PyTorch's hook takes it:
//   1. M = this rank's gradient + its error from the last step (error
//      feedback: what compression dropped is sent later, not lost);
//   2. P = M Q, all-reduced (mean), then orthonormalised (Gram-Schmidt);
//   3. Q = M^T P, all-reduced (mean);
//   4. the gradient becomes P Q^T, the same on every rank, and the error
//      M - P Q^T stays on this rank for the next step.
// Q starts random (the same seed on every rank) and is kept from step to
// step (PyTorch's warm start): one power iteration a step refines it.
// Because P and Q are linear in M, all-reducing them equals compressing the
// mean gradient; with R as large as the matrix, P Q^T is exactly the mean.
// Vectors (and matrices that R would not make smaller by at least
// min_rate, PyTorch's min_compression_rate, 2) are all-reduced as they are.
#ifndef COURSE_POWERSGD_H
#define COURSE_POWERSGD_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ddp.h"
#include "pg.h"
#include "rng.h"

// One tensor of the flat gradient array: where it lies and its shape
// (cols 1 for a vector).
typedef struct {
    size_t offset;
    int rows, cols;
} powersgd_tensor;

typedef struct {
    int rank, count;         // R; tensors
    powersgd_tensor *tensor;
    bool *compressed;        // per tensor: sent as P and Q
    float **q, **error;      // per compressed tensor: Q (cols x R), the error (rows x cols)
    size_t plain, p_total, q_total; // numbers sent as they are, in all P's, in all Q's
    float *buffer;           // packing: max(plain, p_total, q_total)
    size_t buffer_count;
    void *device_buffer;     // its copy on the process group's GPU (NCCL reduces device memory)
    device_t device;         // that GPU
} powersgd_t;

static inline void powersgd_init(powersgd_t *s, const powersgd_tensor *t, int count, int rank, double min_rate) {
    memset(s, 0, sizeof *s);
    if (rank < 1) die("PowerSGD: the rank must be at least 1, not %d", rank);
    s->rank = rank, s->count = count;
    s->tensor = xmalloc(sizeof *t * (size_t)count);
    memcpy(s->tensor, t, sizeof *t * (size_t)count);
    s->compressed = xcalloc((size_t)count, sizeof *s->compressed);
    s->q = xcalloc((size_t)count, sizeof *s->q), s->error = xcalloc((size_t)count, sizeof *s->error);
    rng_t r = rng_seed(2718); // the same Q on every rank
    for (int i = 0; i < count; i++) {
        size_t m = (size_t)t[i].rows, n = (size_t)t[i].cols, sent = (m + n) * (size_t)rank;
        s->compressed[i] = m > 1 && n > 1 && (size_t)rank <= (m < n ? m : n) && (double)(m * n) >= min_rate * (double)sent;
        if (!s->compressed[i]) {
            s->plain += m * n;
            continue;
        }
        s->q[i] = xmalloc(n * (size_t)rank * sizeof(float));
        for (size_t k = 0; k < n * (size_t)rank; k++) s->q[i][k] = (float)rng_normal(&r);
        s->error[i] = xcalloc(m * n, sizeof(float));
        s->p_total += m * (size_t)rank, s->q_total += n * (size_t)rank;
    }
    size_t most = s->plain > s->p_total ? s->plain : s->p_total;
    s->buffer_count = most > s->q_total ? most : s->q_total;
    s->buffer = xmalloc(s->buffer_count * sizeof(float) + 1);
}

// The mean over the ranks of buf[0..n), through the GPU when the group's
// device is one (the packing is done on the host either way).
static inline void powersgd_all_reduce(powersgd_t *s, pg_t *pg, float *buf, size_t n) {
    const device_t *d = &pg->device;
    if (!device_is_cuda(d)) {
        pg_all_reduce(pg, buf, buf, n, DTYPE_F32, OP_AVG);
        return;
    }
    if (!s->device_buffer) s->device = *d, s->device_buffer = device_alloc(d, s->buffer_count * sizeof(float) + 1);
    device_from_host(d, s->device_buffer, buf, n * sizeof(float));
    pg_all_reduce(pg, s->device_buffer, s->device_buffer, n, DTYPE_F32, OP_AVG);
    device_to_host(d, buf, s->device_buffer, n * sizeof(float));
}

static inline void powersgd_free(powersgd_t *s) {
    if (s->device_buffer) device_free(&s->device, s->device_buffer);
    for (int i = 0; i < s->count; i++) free(s->q[i]), free(s->error[i]);
    free(s->q), free(s->error), free(s->compressed), free(s->tensor), free(s->buffer);
    memset(s, 0, sizeof *s);
}

static inline double powersgd_column_norm(const float *p, int rows, int R, int a) {
    double norm = 0;
    for (int i = 0; i < rows; i++) norm += (double)p[i * R + a] * p[i * R + a];
    return sqrt(norm);
}

// Gram-Schmidt on the R columns of P (rows x R, row-major), in place. Each
// column loses its parts along the columns before it twice over: once is
// not enough in float when a column is nearly a combination of the others
// (a gradient of lower rank than R, as an embedding's is: the rows of
// tokens absent from the batch are 0). What is left of such a column is
// rounding noise, pointing anywhere; normalising it would make P lose its
// orthonormality, so it becomes 0 instead (it carried nothing new).
static inline void powersgd_orthonormalise(float *p, int rows, int R) {
    for (int a = 0; a < R; a++) {
        double before = powersgd_column_norm(p, rows, R, a);
        for (int pass = 0; pass < 2; pass++)
            for (int b = 0; b < a; b++) {
                double dot = 0;
                for (int i = 0; i < rows; i++) dot += (double)p[i * R + a] * p[i * R + b];
                for (int i = 0; i < rows; i++) p[i * R + a] -= (float)(dot * p[i * R + b]);
            }
        double norm = powersgd_column_norm(p, rows, R, a);
        double scale = norm > 1e-5 * before && norm > 0 ? 1 / norm : 0;
        for (int i = 0; i < rows; i++) p[i * R + a] = (float)(p[i * R + a] * scale);
    }
}

// grads (host, the flat array) <- the PowerSGD mean over the ranks.
static inline void powersgd_average(powersgd_t *s, pg_t *pg, float *grads) {
    int R = s->rank;
    float *buf = s->buffer;
    // The plain tensors: packed, one all-reduce, unpacked.
    size_t at = 0;
    for (int i = 0; i < s->count; i++)
        if (!s->compressed[i]) {
            size_t n = (size_t)s->tensor[i].rows * s->tensor[i].cols;
            memcpy(buf + at, grads + s->tensor[i].offset, n * sizeof(float)), at += n;
        }
    powersgd_all_reduce(s, pg, buf, s->plain);
    at = 0;
    for (int i = 0; i < s->count; i++)
        if (!s->compressed[i]) {
            size_t n = (size_t)s->tensor[i].rows * s->tensor[i].cols;
            memcpy(grads + s->tensor[i].offset, buf + at, n * sizeof(float)), at += n;
        }
    // 1-2. M = gradient + error, kept in `error` for now; P = M Q, packed, averaged.
    at = 0;
    for (int i = 0; i < s->count; i++) {
        if (!s->compressed[i]) continue;
        int m = s->tensor[i].rows, n = s->tensor[i].cols;
        float *M = s->error[i], *g = grads + s->tensor[i].offset, *q = s->q[i], *p = buf + at;
        for (size_t k = 0; k < (size_t)m * n; k++) M[k] += g[k];
        for (int r = 0; r < m; r++)
            for (int a = 0; a < R; a++) {
                double sum = 0;
                for (int c = 0; c < n; c++) sum += (double)M[(size_t)r * n + c] * q[c * R + a];
                p[r * R + a] = (float)sum;
            }
        at += (size_t)m * R;
    }
    powersgd_all_reduce(s, pg, buf, s->p_total);
    // 3. Orthonormalise P (kept in the gradient's first rows x R numbers
    // meanwhile, as the gradient itself is no longer needed), Q = M^T P.
    at = 0;
    for (int i = 0; i < s->count; i++) {
        if (!s->compressed[i]) continue;
        int m = s->tensor[i].rows;
        powersgd_orthonormalise(buf + at, m, R);
        memcpy(grads + s->tensor[i].offset, buf + at, (size_t)m * R * sizeof(float));
        at += (size_t)m * R;
    }
    at = 0;
    for (int i = 0; i < s->count; i++) {
        if (!s->compressed[i]) continue;
        int m = s->tensor[i].rows, n = s->tensor[i].cols;
        const float *M = s->error[i], *p = grads + s->tensor[i].offset;
        float *q = buf + at;
        for (int c = 0; c < n; c++)
            for (int a = 0; a < R; a++) {
                double sum = 0;
                for (int r = 0; r < m; r++) sum += (double)M[(size_t)r * n + c] * p[r * R + a];
                q[c * R + a] = (float)sum;
            }
        at += (size_t)n * R;
    }
    powersgd_all_reduce(s, pg, buf, s->q_total);
    // 4. The gradient P Q^T; the error M - P Q^T; Q kept for the next step.
    at = 0;
    for (int i = 0; i < s->count; i++) {
        if (!s->compressed[i]) continue;
        int m = s->tensor[i].rows, n = s->tensor[i].cols;
        float *M = s->error[i], *g = grads + s->tensor[i].offset, *q = buf + at;
        float *p = xmalloc((size_t)m * R * sizeof(float));
        memcpy(p, g, (size_t)m * R * sizeof(float));
        for (int r = 0; r < m; r++)
            for (int c = 0; c < n; c++) {
                double sum = 0;
                for (int a = 0; a < R; a++) sum += (double)p[r * R + a] * q[c * R + a];
                size_t k = (size_t)r * n + c;
                g[k] = (float)sum, M[k] -= (float)sum;
            }
        memcpy(s->q[i], q, (size_t)n * R * sizeof(float));
        free(p);
        at += (size_t)n * R;
    }
    *ddp_bytes_counter() += (s->plain + s->p_total + s->q_total) * sizeof(float);
}

#endif
