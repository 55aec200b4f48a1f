// sgd_step.c - reference solution of exercise 01/sgd_step.
#include "exercises.h"

float mse_gradient(const float *x, const float *y, int batch, int features, const float *params,
                   float *grads) {
    const float *w = params;
    float b = params[features];
    for (int j = 0; j <= features; j++) grads[j] = 0.0f;
    double loss = 0.0;
    for (int i = 0; i < batch; i++) {
        const float *xi = x + (long)i * features;
        float r = b - y[i];
        for (int j = 0; j < features; j++) r += xi[j] * w[j];
        loss += (double)r * r;
        for (int j = 0; j < features; j++) grads[j] += r * xi[j];
        grads[features] += r;
    }
    float scale = 2.0f / (float)batch;
    for (int j = 0; j <= features; j++) grads[j] *= scale;
    return (float)(loss / batch);
}

void sgd_update(float *params, const float *grads, int count, float lr) {
    for (int j = 0; j < count; j++) params[j] -= lr * grads[j];
}
