// snapshot_whole.h - the resumable snapshot of a whole GPT, as chapter 08
// writes it and chapters 10-14 write it too (chapter 09 writes slices:
// 09_zero_fsdp/zero_snapshot.h).
//
// The state of chapter 06, for the GPT: the parameters, both AdamW moments
// and its step count, where the run is (epoch, step), fp16's loss scale,
// and the configuration that must match to resume: one safetensors file a
// step (common/snapshot.h: atomic, the last two kept). Whatever layout
// trained the model - 08's replicas, 10's shards, 11's stages - the file
// holds the WHOLE model in 08's flat layout, so any chapter resumes from
// any other's, with another number of ranks, and 08 samples from it.
#ifndef GPT_SNAPSHOT_WHOLE_H
#define GPT_SNAPSHOT_WHOLE_H

#include <stdint.h>
#include <stdio.h>

#include "dist.h"
#include "gpt.h"
#include "log.h"
#include "options.h"
#include "snapshot.h"

// What must match to resume: the model and the training.
static inline safetensors_meta snapshot_config_meta(const gpt_config *c) {
    if (c->n_expert) // a mixture of experts (chapter 13)
        return safetensors_meta_of("config", "vocab %d block %d layers %d heads %d embd %d experts %d top_k %d",
                                   c->vocab_size, c->block_size, c->n_layer, c->n_head, c->n_embd, c->n_expert, c->top_k);
    return safetensors_meta_of("config", "vocab %d block %d layers %d heads %d embd %d", c->vocab_size, c->block_size,
                               c->n_layer, c->n_head, c->n_embd);
}

static inline safetensors_meta snapshot_training_meta(const options *o) {
    return safetensors_meta_of("training", "batch %d accum %d lr %.9g seed %d", o->batch_size, o->grad_accum, o->lr,
                               o->seed);
}

static inline int64_t snapshot_int(const safetensors_t *s, const char *key) {
    int64_t v = 0;
    char err[300];
    if (!snapshot_meta_i64(s, key, &v, err, sizeof err)) die("snapshot %s: %s", s->path, err);
    return v;
}

// Rank 0 (or whoever holds the whole model) writes it. `mesh`: the layout
// that trained it, for the reader ("" for none); `scaler`: fp16's loss
// scale (scale 0: not fp16).
static inline void snapshot_save_whole(const gpt_t *m, const options *o, int epochs_done, int step, int world,
                                       const char *mesh, gpt_scaler scaler) {
    int64_t shape[1] = {(int64_t)m->num_params};
    float *zeros = m->adam_m ? NULL : xcalloc(m->num_params, sizeof(float));
    safetensors_tensor t[3] = {safetensors_tensor_of("params", "F32", m->params, 1, shape),
                               safetensors_tensor_of("adam_m", "F32", m->adam_m ? m->adam_m : zeros, 1, shape),
                               safetensors_tensor_of("adam_v", "F32", m->adam_v ? m->adam_v : zeros, 1, shape)};
    safetensors_meta meta[12];
    int n = 0;
    meta[n++] = snapshot_config_meta(&m->cfg);
    meta[n++] = snapshot_training_meta(o);
    meta[n++] = safetensors_meta_of("epoch", "%d", epochs_done);
    meta[n++] = safetensors_meta_of("step", "%d", step);
    meta[n++] = safetensors_meta_of("adam_step", "%d", m->adam_step);
    meta[n++] = safetensors_meta_of("world_size", "%d", world);
    if (mesh[0]) meta[n++] = safetensors_meta_of("mesh", "%s", mesh);
    if (scaler.scale >= 1) { // fp16: the loss scale goes on where it was
        meta[n++] = safetensors_meta_of("loss_scale", "%.0f", scaler.scale);
        meta[n++] = safetensors_meta_of("loss_scale_good_steps", "%d", scaler.good_steps);
        meta[n++] = safetensors_meta_of("steps_skipped", "%d", scaler.skipped_total);
    }
    char err[1400];
    if (!snapshot_save_step(o->snapshot_path, step, t, 3, meta, n, 2, err, sizeof err))
        die("could not save the snapshot: %s", err);
    log_main("snapshot saved: Epoch %d (step %d) in %s\n", epochs_done, step, o->snapshot_path);
    free(zeros);
}

// Rank 0 loads the newest valid snapshot into m, the whole model on the
// host; every rank learns where it left off (the numbers, by broadcast:
// the model itself is the caller's to share, as its layout needs).
// Returns the epochs already done (0: a fresh start), sets *step and
// *scaler (fp16's: --loss_scale on a fresh start, else the snapshot's).
static inline int snapshot_resume_whole(gpt_t *m, const options *o, dist_t *d, int *step, gpt_scaler *scaler) {
    int64_t where[6] = {0, 0, 0, 0, 0, 0}; // epoch, step, adam_step; fp16's loss scale, good steps, skipped
    if (d->rank == 0 && o->snapshot_path) {
        safetensors_t s;
        char report[4096], err[1400];
        int found = snapshot_load_latest(o->snapshot_path, &s, report, sizeof report);
        if (report[0]) log_main("%s\n", report);
        if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", o->snapshot_path);
        if (found > 0) {
            int64_t shape[1] = {(int64_t)m->num_params};
            safetensors_meta config = snapshot_config_meta(&m->cfg), training = snapshot_training_meta(o);
            if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
            if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
            if (!snapshot_expect_meta(&s, config.key, config.value, err, sizeof err) ||
                !snapshot_expect_meta(&s, training.key, training.value, err, sizeof err) ||
                !snapshot_copy(&s, "params", "F32", 1, shape, m->params, err, sizeof err) ||
                !snapshot_copy(&s, "adam_m", "F32", 1, shape, m->adam_m, err, sizeof err) ||
                !snapshot_copy(&s, "adam_v", "F32", 1, shape, m->adam_v, err, sizeof err))
                die("cannot resume from %s: %s", s.path, err);
            where[0] = snapshot_int(&s, "epoch"), where[1] = snapshot_int(&s, "step");
            where[2] = snapshot_int(&s, "adam_step");
            if (safetensors_meta_get(&s, "loss_scale")) { // an fp16 run's
                where[3] = snapshot_int(&s, "loss_scale"), where[4] = snapshot_int(&s, "loss_scale_good_steps");
                where[5] = snapshot_int(&s, "steps_skipped");
            }
            safetensors_release(&s);
        }
    }
    dist_broadcast_host(d, where, 6, DTYPE_I64, 0);
    if (where[2] > 0) {
        if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
        m->adam_step = (int)where[2];
        log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where[0], (long long)where[1]);
    }
    *scaler = (gpt_scaler){(float)o->loss_scale, 0, 0, 0};
    if (where[3] >= 1) *scaler = (gpt_scaler){(float)where[3], (int)where[4], 0, (int)where[5]};
    *step = (int)where[1];
    return (int)where[0];
}

// Rule 1 of data parallelism for a whole model on the host: every rank
// takes rank 0's parameters (and moments, once a step was taken).
static inline void snapshot_broadcast_whole(gpt_t *m, dist_t *d) {
    dist_broadcast_host(d, m->params, m->num_params, DTYPE_F32, 0);
    if (m->adam_step > 0) {
        dist_broadcast_host(d, m->adam_m, m->num_params, DTYPE_F32, 0);
        dist_broadcast_host(d, m->adam_v, m->num_params, DTYPE_F32, 0);
    }
}

#endif
