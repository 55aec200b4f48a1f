// linreg.h - the course's model: linear regression trained by SGD.
//
// Chapter 01 teaches it; chapters 04-07 train the very same model on many
// ranks, so that every speedup compares like with like.
//
//   data:  y = X . w_true + 3 + 0.1 * noise,   X and noise ~ N(0, 1)
//   model: prediction = X . w + b
//   loss:  mean over the batch of (prediction - y)^2
//
// The parameters live in ONE buffer, w[0..D-1] then b at [D], and so do the
// gradients: data parallelism then averages one buffer with one all-reduce.
// Everything here runs on the CPU or, in a CUDA build with a GPU, on the GPU
// (kernels in linreg_gpu.cu); the CPU functions are the reference.
#ifndef COURSE_LINREG_H
#define COURSE_LINREG_H

#include <stdint.h>
#include <string.h>

#include "device.h"
#include "rng.h"

#define LINREG_TRUE_BIAS 3.0f
#define LINREG_NOISE 0.1f

typedef struct {
    int features;     // D
    int64_t samples;  // N
    float *x;         // N x D, row-major: sample i is x[i*D .. i*D+D-1]
    float *y;         // N
    float *w_true;    // D: the weights the model should find
} linreg_data;

// The weights to recover: 2.0 for the first feature (the classic y = 2x + 3),
// then a known spread of values so a wrong feature index shows up.
static inline float linreg_true_weight(int j, int features) {
    return 2.0f - 3.0f * (float)j / (float)features;
}

static inline linreg_data linreg_make_data(int features, int64_t samples, uint64_t seed) {
    linreg_data d = {features, samples, NULL, NULL, NULL};
    d.x = xmalloc(sizeof(float) * (size_t)samples * (size_t)features);
    d.y = xmalloc(sizeof(float) * (size_t)samples);
    d.w_true = xmalloc(sizeof(float) * (size_t)features);
    for (int j = 0; j < features; j++) d.w_true[j] = linreg_true_weight(j, features);
    rng_t rng = rng_seed(seed);
    for (int64_t i = 0; i < samples; i++) {
        float *xi = d.x + i * features;
        double dot = 0;
        for (int j = 0; j < features; j++) {
            xi[j] = (float)rng_normal(&rng);
            dot += (double)xi[j] * d.w_true[j];
        }
        d.y[i] = (float)(dot + LINREG_TRUE_BIAS + LINREG_NOISE * rng_normal(&rng));
    }
    return d;
}

static inline void linreg_free_data(linreg_data *d) {
    free(d->x);
    free(d->y);
    free(d->w_true);
    memset(d, 0, sizeof *d);
}

// The model and its training state, on one device.
typedef struct {
    const device_t *device;
    int features;
    int64_t samples;
    float *params;     // D + 1: w then b        (device memory)
    float *grads;      // D + 1                  (device memory)
    float *velocity;   // D + 1: SGD momentum state, allocated on first use
    float *x, *y;      // the whole dataset      (device memory)
    int64_t *order;    // this epoch's sample order (device memory)
    int64_t order_len;
    double *loss_sum;  // running sum of batch losses, read back only to print
    float *residual;   // one per sample of the largest batch (GPU scratch)
    int max_batch;
} linreg_model;

#ifdef COURSE_CUDA
// The GPU versions, in linreg_gpu.cu; plain pointers keep that file plain CUDA.
void linreg_cuda_forward_backward(const float *x, const float *y, const int64_t *order,
                                  const float *params, float *grads, float *residual,
                                  double *loss_sum, int features, int64_t start, int batch);
void linreg_cuda_sgd_step(float *params, const float *grads, int count, float lr);
void linreg_cuda_momentum_step(float *params, float *velocity, const float *grads, int count,
                               float lr, float momentum);
#endif

static inline void linreg_init(linreg_model *m, const device_t *device, const linreg_data *data,
                               int max_batch) {
    memset(m, 0, sizeof *m);
    m->device = device;
    m->features = data->features;
    m->samples = data->samples;
    m->max_batch = max_batch;
    size_t nparams = (size_t)data->features + 1;
    size_t nx = (size_t)data->samples * (size_t)data->features;
    m->params = device_alloc(device, nparams * sizeof(float));
    m->grads = device_alloc(device, nparams * sizeof(float));
    m->x = device_alloc(device, nx * sizeof(float));
    m->y = device_alloc(device, (size_t)data->samples * sizeof(float));
    m->order = device_alloc(device, (size_t)data->samples * sizeof(int64_t));
    m->loss_sum = device_alloc(device, sizeof(double));
    m->residual = device_alloc(device, (size_t)max_batch * sizeof(float));
    device_from_host(device, m->x, data->x, nx * sizeof(float));
    device_from_host(device, m->y, data->y, (size_t)data->samples * sizeof(float));
    float *zeros = xcalloc(nparams, sizeof(float));
    device_from_host(device, m->params, zeros, nparams * sizeof(float)); // start from w = 0, b = 0
    free(zeros);
    double zero = 0;
    device_from_host(device, m->loss_sum, &zero, sizeof zero);
}

static inline void linreg_free(linreg_model *m) {
    const device_t *d = m->device;
    device_free(d, m->params);
    device_free(d, m->grads);
    device_free(d, m->x);
    device_free(d, m->y);
    device_free(d, m->order);
    device_free(d, m->loss_sum);
    device_free(d, m->residual);
    device_free(d, m->velocity);
    memset(m, 0, sizeof *m);
}

// The order in which this epoch visits the samples (this rank's share of them
// in data-parallel training). Copied to the device once per epoch, not per step.
static inline void linreg_set_order(linreg_model *m, const int64_t *order, int64_t len) {
    if (len > m->samples) die("linreg_set_order: %lld indices for %lld samples", (long long)len, (long long)m->samples);
    device_from_host(m->device, m->order, order, (size_t)len * sizeof(int64_t));
    m->order_len = len;
}

// One batch: samples order[start .. start+batch-1]. Computes the mean loss
// (added to loss_sum) and its gradient into grads:
//   r_i   = x_i . w + b - y_i
//   loss  = 1/B sum r_i^2
//   dL/dw = 2/B sum r_i x_i,   dL/db = 2/B sum r_i
static inline void linreg_cpu_forward_backward(linreg_model *m, int64_t start, int batch) {
    int D = m->features;
    float *grad_w = m->grads, *grad_b = m->grads + D;
    memset(m->grads, 0, sizeof(float) * (size_t)(D + 1));
    double loss = 0;
    for (int i = 0; i < batch; i++) {
        const float *xi = m->x + m->order[start + i] * D;
        float r = m->params[D] - m->y[m->order[start + i]];
        for (int j = 0; j < D; j++) r += xi[j] * m->params[j];
        loss += (double)r * r;
        for (int j = 0; j < D; j++) grad_w[j] += r * xi[j];
        *grad_b += r;
    }
    float scale = 2.0f / (float)batch;
    for (int j = 0; j <= D; j++) m->grads[j] *= scale;
    *m->loss_sum += loss / batch;
}

static inline void linreg_forward_backward(linreg_model *m, int64_t start, int batch) {
    if (batch > m->max_batch || start < 0 || start + batch > m->order_len)
        die("batch [%lld, %lld) is outside this epoch's %lld samples", (long long)start,
            (long long)(start + batch), (long long)m->order_len);
#ifdef COURSE_CUDA
    if (device_is_cuda(m->device)) {
        linreg_cuda_forward_backward(m->x, m->y, m->order, m->params, m->grads, m->residual,
                                     m->loss_sum, m->features, start, batch);
        return;
    }
#endif
    linreg_cpu_forward_backward(m, start, batch);
}

// Plain SGD: p <- p - lr * grad.
static inline void linreg_sgd_step(linreg_model *m, float lr) {
#ifdef COURSE_CUDA
    if (device_is_cuda(m->device)) {
        linreg_cuda_sgd_step(m->params, m->grads, m->features + 1, lr);
        return;
    }
#endif
    for (int j = 0; j <= m->features; j++) m->params[j] -= lr * m->grads[j];
}

// The velocity buffer of SGD with momentum (D + 1 floats on the device),
// zero until the first step.
static inline float *linreg_velocity(linreg_model *m) {
    size_t count = (size_t)m->features + 1;
    if (!m->velocity) {
        m->velocity = device_alloc(m->device, count * sizeof(float));
        float *zeros = xcalloc(count, sizeof(float));
        device_from_host(m->device, m->velocity, zeros, count * sizeof(float));
        free(zeros);
    }
    return m->velocity;
}

// SGD with momentum, as torch.optim.SGD does it:
//   v <- momentum * v + grad;   p <- p - lr * v
// The velocity v is optimizer STATE: it remembers past gradients, so a
// snapshot that keeps only the weights cannot continue the same run.
static inline void linreg_momentum_step(linreg_model *m, float lr, float momentum) {
    size_t count = (size_t)m->features + 1;
    linreg_velocity(m);
#ifdef COURSE_CUDA
    if (device_is_cuda(m->device)) {
        linreg_cuda_momentum_step(m->params, m->velocity, m->grads, (int)count, lr, momentum);
        return;
    }
#endif
    for (size_t j = 0; j < count; j++) {
        m->velocity[j] = momentum * m->velocity[j] + m->grads[j];
        m->params[j] -= lr * m->velocity[j];
    }
}

// Returns the sum of batch losses since the last call, and restarts it.
static inline double linreg_take_loss_sum(linreg_model *m) {
    double sum = 0, zero = 0;
    device_to_host(m->device, &sum, m->loss_sum, sizeof sum);
    device_from_host(m->device, m->loss_sum, &zero, sizeof zero);
    return sum;
}

// Did the training blow up? For this data SGD is stable only while lr < 1:
// the loss's curvature is 2 in every direction (x ~ N(0, 1)), and a step of
// lr x curvature > 2 overshoots further each time, so the loss grows without
// bound, to inf and NaN. A loss that ends above twice where it started
// (the first batches' loss, before much learning) has gone that way.
static inline bool linreg_diverged(double first_loss, double last_loss) {
    return !(last_loss <= 2 * first_loss);   // NaN counts as diverged
}

// The data-parallel chapters' verdict: true when the run diverged, and then
// rank 0 says why and what learning rate would be stable (lr was scaled by
// the world size when scale_lr is set). Every rank gets the same answer,
// since the losses were all-reduced, so every rank can exit with it.
static inline bool linreg_report_divergence(int rank, int world_size, double first_loss,
                                            int first_epoch, double last_loss, int last_epoch,
                                            double lr, bool scale_lr) {
    if (!linreg_diverged(first_loss, last_loss)) return false;
    if (rank == 0)
        course_say("error: training diverged: the loss went from %g (epoch %d) to %g (epoch %d). lr %g%s is "
                   "too large: SGD on this data is stable only for lr below 1. Use --lr %g or less, or "
                   "fewer ranks", first_loss, first_epoch, last_loss, last_epoch, lr,
                   scale_lr && world_size > 1 ? " (lr x world size, the linear scaling rule)" : "",
                   0.5 / (scale_lr ? world_size : 1));
    return true;
}

// Parameters copied to the host: w[0..D-1], b.
static inline void linreg_get_params(const linreg_model *m, float *host_params) {
    device_to_host(m->device, host_params, m->params, sizeof(float) * (size_t)(m->features + 1));
}

static inline void linreg_set_params(linreg_model *m, const float *host_params) {
    device_from_host(m->device, m->params, host_params, sizeof(float) * (size_t)(m->features + 1));
}

// Largest |w_j - w_true_j| over the features: how far from the answer we are.
static inline float linreg_weight_error(const float *params, const linreg_data *d) {
    float worst = 0;
    for (int j = 0; j < d->features; j++) {
        float e = params[j] - d->w_true[j];
        if (e < 0) e = -e;
        if (e > worst) worst = e;
    }
    return worst;
}

#endif
