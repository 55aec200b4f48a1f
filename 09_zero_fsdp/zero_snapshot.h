// zero_snapshot.h - chapter 09's snapshots, sharded: every rank writes its
// own slices, any number of ranks reads them back (resharding), and
// --consolidate writes them as one model file that chapter 08 loads.
//
// The resumable state, as in chapter 06 (and 08's gpt/snapshot_whole.h):
// the parameters, both AdamW moments and its step count, where the run
// is, fp16's loss scale, and the configuration that must match. But no
// rank holds all of it (with ZeRO-3 not even the parameters), so every
// rank writes its own slices, padding left out: rank r of n the series
// DIR/STEM-shard<r>of<n>.<step>.safetensors. Once every rank's file is on
// disk, rank 0 writes the index, the series DIR/STEM.<step>.safetensors,
// which makes the step complete: a run killed while the shards are
// written resumes from the previous index, whose shards are still there
// (every series keeps its last two). The slices are the same in every
// stage, so any stage resumes any other's. With hybrid sharding the R
// replicas hold the same slices: the first replica's N/R ranks write them,
// and the snapshot is one of N/R shards - which any N and R read back.
#ifndef ZERO_SNAPSHOT_H
#define ZERO_SNAPSHOT_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ddp.h"
#include "files.h"
#include "options.h"
#include "samples.h"
#include "snapshot.h"
#include "snapshot_whole.h"
#include "zero.h"

static inline void zero_shard_path(const char *snapshot_path, int rank, int world, char *out, size_t size) {
    size_t n = strlen(snapshot_path), s = strlen(".safetensors");
    int stem = (int)(n > s && !strcmp(snapshot_path + n - s, ".safetensors") ? n - s : n);
    snprintf(out, size, "%.*s-shard%dof%d.safetensors", stem, snapshot_path, rank, world);
}

// This rank's slices, padding left out, as its shard of the step; returns
// AdamW's step count.
static inline int zero_snapshot_write_shard(zero_t *z, const options *o, int step) {
    size_t owned = zero_owned_total(z);
    float *slices[3];
    for (int i = 0; i < 3; i++) slices[i] = xmalloc((owned ? owned : 1) * sizeof(float));
    int adam_step = zero_slices_to_host(z, slices);
    int64_t shape[1] = {(int64_t)owned};
    safetensors_tensor t[3] = {safetensors_tensor_of("params", "F32", slices[0], 1, shape),
                               safetensors_tensor_of("adam_m", "F32", slices[1], 1, shape),
                               safetensors_tensor_of("adam_v", "F32", slices[2], 1, shape)};
    safetensors_meta meta[3];
    int n = 0;
    meta[n++] = snapshot_config_meta(&z->model->host.cfg);
    meta[n++] = safetensors_meta_of("step", "%d", step);
    meta[n++] = safetensors_meta_of("shard", "%d of %d", z->rank, z->world);
    char path[FILES_PATH_MAX], err[1400];
    zero_shard_path(o->snapshot_path, z->rank, z->world, path, sizeof path);
    if (!snapshot_save_step(path, step, t, 3, meta, n, 2, err, sizeof err))
        die("could not save this rank's shard: %s", err);
    for (int i = 0; i < 3; i++) free(slices[i]);
    return adam_step;
}

// Every rank of the first replica writes its shard (the other replicas'
// slices are the same again); then (a barrier: every shard is durable)
// the first rank the index. What must match to resume is 08's: the model
// (both kinds of file say it) and the training (the index says it).
static inline void zero_snapshot_save(zero_t *z, const options *o, int epochs_done, int step) {
    const gpt_config *c = &z->model->host.cfg;
    int adam_step = z->replica == 0 ? zero_snapshot_write_shard(z, o, step) : 0;
    gpt_scaler scaler = model_get_scaler(z->model); // fp16 (--shard 0 only): the same on every rank
    pg_barrier(z->dist->pg); // every shard is durable
    if (z->replica == 0 && z->rank == 0) {
        safetensors_meta meta[12];
        char err[1400];
        int n = 0;
        meta[n++] = snapshot_config_meta(c);
        meta[n++] = snapshot_training_meta(o);
        meta[n++] = safetensors_meta_of("epoch", "%d", epochs_done);
        meta[n++] = safetensors_meta_of("step", "%d", step);
        meta[n++] = safetensors_meta_of("adam_step", "%d", adam_step);
        meta[n++] = safetensors_meta_of("world_size", "%d", z->world);
        if (scaler.scale >= 1) { // fp16: the loss scale goes on where it was
            meta[n++] = safetensors_meta_of("loss_scale", "%.0f", scaler.scale);
            meta[n++] = safetensors_meta_of("loss_scale_good_steps", "%d", scaler.good_steps);
            meta[n++] = safetensors_meta_of("steps_skipped", "%d", scaler.skipped_total);
        }
        if (!snapshot_save_step(o->snapshot_path, step, NULL, 0, meta, n, 2, err, sizeof err))
            die("could not save the snapshot's index: %s", err);
    }
    log_main("snapshot saved: Epoch %d (step %d) in %s: %d shard(s) and an index\n", epochs_done, step,
             o->snapshot_path, z->world);
}

// Without --snapshot_path, 08's model file at the end of an epoch: the
// whole parameters on rank 0 (ZeRO-3 gathers them: every rank calls it),
// which writes them with the tokenizer (gpt/samples.h's run_save).
static inline void zero_save_model(zero_t *z, const bpe_t *t, const char *out_dir) {
    zero_full_params(z);
    if (z->replica == 0 && z->rank == 0) run_save(&z->model->host, t, out_dir);
}

// Where a snapshot left off: its index's numbers (world 0: none found),
// and fp16's loss scale (scale 0: not an fp16 run's).
typedef struct {
    int64_t epoch, step, adam_step, world, scale, good_steps, skipped;
} zero_snapshot_where;

// The newest complete snapshot of the series: its index, checked against
// this run's model and (o not NULL) its training.
static inline zero_snapshot_where zero_read_index(const char *snapshot_path, const gpt_config *c, const options *o) {
    zero_snapshot_where w = {0, 0, 0, 0, 0, 0, 0};
    safetensors_t s;
    char report[4096], err[1400];
    int found = snapshot_load_latest(snapshot_path, &s, report, sizeof report);
    if (report[0]) log_main("%s\n", report);
    if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", snapshot_path);
    if (found == 0) return w;
    safetensors_meta config = snapshot_config_meta(c);
    bool ok = snapshot_expect_meta(&s, config.key, config.value, err, sizeof err);
    if (ok && o) {
        safetensors_meta training = snapshot_training_meta(o);
        ok = snapshot_expect_meta(&s, training.key, training.value, err, sizeof err);
    }
    if (!ok) die("cannot resume from %s: %s", s.path, err);
    w.epoch = snapshot_int(&s, "epoch"), w.step = snapshot_int(&s, "step");
    w.adam_step = snapshot_int(&s, "adam_step"), w.world = snapshot_int(&s, "world_size");
    if (w.world < 1 || w.world > 65536)
        die("snapshot %s: world_size %lld is not a number of ranks", s.path, (long long)w.world);
    if (safetensors_meta_get(&s, "loss_scale")) { // an fp16 run's
        w.scale = snapshot_int(&s, "loss_scale"), w.good_steps = snapshot_int(&s, "loss_scale_good_steps");
        w.skipped = snapshot_int(&s, "steps_skipped");
    }
    safetensors_release(&s);
    return w;
}

// A part of the flat array that a rank needs from a snapshot: parameters
// [first, first + count), into dst[0] (the parameters), dst[1] and dst[2]
// (AdamW's moments); a NULL dst is not needed.
typedef struct {
    size_t first, count;
    float *dst[3];
} zero_state_range;

// Reads the shards that `where` names, one file at a time, and copies from
// each the parts that overlap the ranges asked for. The writer's slices are
// computed as zero.h cuts them, for the writer's number of ranks: that is
// all resharding takes - any number of ranks reads what any other wrote.
static inline void zero_load_shards(const char *snapshot_path, zero_snapshot_where where, const gpt_config *c,
                                    const zero_state_range *want, int nwant) {
    static const char *const names[3] = {"params", "adam_m", "adam_v"};
    int world = (int)where.world, buckets = gpt_layout_buckets(c, NULL, 0);
    safetensors_meta config = snapshot_config_meta(c);
    for (int r = 0; r < world; r++) {
        char template[FILES_PATH_MAX], path[FILES_PATH_MAX + 32], err[1400], who[64];
        zero_shard_path(snapshot_path, r, world, template, sizeof template);
        if (!snapshot_step_path(template, where.step, path, sizeof path)) die("snapshot path %s is too long", template);
        size_t owned = 0;
        for (int k = 0; k < buckets; k++) owned += zero_owned(gpt_layout_bucket(c, k).count, world, r);
        int64_t shape[1] = {(int64_t)owned};
        snprintf(who, sizeof who, "%d of %d", r, world);
        safetensors_t s;
        if (!snapshot_read(path, &s, err, sizeof err))
            die("the snapshot of step %lld names %d shards, but shard %d is unusable: %s", (long long)where.step, world, r,
                err);
        if (!snapshot_expect_meta(&s, config.key, config.value, err, sizeof err) ||
            !snapshot_expect_meta(&s, "shard", who, err, sizeof err))
            die("%s: %s", path, err);
        const float *data[3];
        for (int i = 0; i < 3; i++) {
            if (!snapshot_expect_tensor(&s, names[i], "F32", 1, shape, err, sizeof err)) die("%s: %s", path, err);
            data[i] = safetensors_find(&s, names[i])->data;
        }
        size_t pos = 0; // where each of rank r's slices lies in its file
        for (int k = 0; k < buckets; k++) {
            gpt_bucket b = gpt_layout_bucket(c, k);
            size_t first = b.offset + (size_t)r * zero_slice_size(b.count, world), n = zero_owned(b.count, world, r);
            for (int q = 0; q < nwant; q++) { // the overlap [lo, hi) of rank r's slice and range q
                const zero_state_range *w = &want[q];
                size_t lo = first > w->first ? first : w->first;
                size_t hi = first + n < w->first + w->count ? first + n : w->first + w->count;
                for (int i = 0; i < 3 && lo < hi; i++)
                    if (w->dst[i]) memcpy(w->dst[i] + (lo - w->first), data[i] + pos + (lo - first), (hi - lo) * sizeof(float));
            }
            pos += n;
        }
        safetensors_release(&s);
    }
}

// Every rank reads the newest complete snapshot's index (rank 0 looks it up
// and says which), then the shards it needs: what its stage keeps whole
// (the parameters in ZeRO-1 and 2, everything in DDP), from every shard;
// what it keeps in slices, from the shards its slices overlap - its own
// when the number of ranks is the same. Sets fp16's loss scale (the
// snapshot's, else --loss_scale). Returns the epochs already done (0: a
// fresh start) and sets *step and *resharded.
static inline int zero_snapshot_resume(zero_t *z, const options *o, int *step, bool *resharded) {
    gpt_t *m = &z->model->host;
    dist_t *d = z->dist;
    zero_snapshot_where where = {0, 0, 0, 0, 0, 0, 0};
    if (d->rank == 0 && o->snapshot_path) where = zero_read_index(o->snapshot_path, &m->cfg, o);
    dist_broadcast_host(d, &where, 7, DTYPE_I64, 0);
    *step = (int)where.step, *resharded = false;
    gpt_scaler scaler = {(float)o->loss_scale, 0, 0, 0};
    if (where.scale >= 1) scaler = (gpt_scaler){(float)where.scale, (int)where.good_steps, 0, (int)where.skipped};
    model_set_scaler(z->model, scaler); // fp16: the loss scale to start from
    if (where.world == 0) return 0;
    zero_state_range *want = xcalloc((size_t)z->num_buckets + 1, sizeof *want);
    int n = 0;
    float *slices[3] = {NULL, NULL, NULL};
    if (z->stage == 0) {
        if (!m->adam_m) m->adam_m = xcalloc(m->num_params, sizeof(gpt_real));
        if (!m->adam_v) m->adam_v = xcalloc(m->num_params, sizeof(gpt_real));
    }
    if (z->stage < 3) // the whole parameters, and in DDP the whole moments
        want[n++] = (zero_state_range){0, m->num_params, {m->params, m->adam_m, m->adam_v}};
    if (z->stage > 0) { // this rank's slices, in shard arrays
        for (int i = 0; i < 3; i++) slices[i] = xcalloc(z->shard_len, sizeof(float));
        for (int k = 0; k < z->num_buckets; k++) {
            const zero_bucket *b = &z->buckets[k];
            float *p = z->stage == 3 ? slices[0] + b->at : NULL;
            want[n++] = (zero_state_range){b->first, b->owned, {p, slices[1] + b->at, slices[2] + b->at}};
        }
    }
    zero_load_shards(o->snapshot_path, where, &m->cfg, want, n);
    zero_slices_from_host(z, slices, (int)where.adam_step);
    for (int i = 0; i < 3; i++) free(slices[i]);
    free(want);
    *resharded = where.world != z->world;
    log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where.epoch, (long long)where.step);
    if (*resharded)
        log_main("resharded: the snapshot's %lld shard(s) loaded as %d\n", (long long)where.world, z->world);
    return (int)where.epoch;
}

// --consolidate: the newest snapshot as one model, as FSDP's full state
// dict: every shard read and put in its place (the same load as a resume,
// into the whole flat array), then written as the model file of 08's
// run_save - which 08's (and this chapter's) --generate loads. It prints
// a checksum of the whole state, so two snapshots can be compared.
static inline int zero_consolidate(const options *o, const char *chapter) {
    // The configuration is in the index; the tokenizer's vocabulary is in it too.
    safetensors_t s;
    char report[4096], err[1400];
    if (snapshot_load_latest(o->snapshot_path, &s, report, sizeof report) != 1)
        die("--consolidate: no complete snapshot for %s%s%s", o->snapshot_path, report[0] ? ": " : "", report);
    gpt_config c;
    const char *config = safetensors_meta_get(&s, "config");
    if (!config || sscanf(config, "vocab %d block %d layers %d heads %d embd %d", &c.vocab_size, &c.block_size,
                          &c.n_layer, &c.n_head, &c.n_embd) != 5 || gpt_config_problem(c))
        die("--consolidate: %s has no usable config", s.path);
    safetensors_release(&s);
    zero_snapshot_where where = zero_read_index(o->snapshot_path, &c, NULL); // the model must agree; the training flags need not
    gpt_t full;
    gpt_init(&full, c, 0);
    full.adam_m = xcalloc(full.num_params, sizeof(gpt_real));
    full.adam_v = xcalloc(full.num_params, sizeof(gpt_real));
    full.adam_step = (int)where.adam_step;
    zero_state_range all = {0, full.num_params, {full.params, full.adam_m, full.adam_v}};
    zero_load_shards(o->snapshot_path, where, &c, &all, 1);
    size_t bytes = full.num_params * sizeof(float);
    log_main("consolidated: %lld shard(s) of step %lld (epoch %lld): params %016llx, adam_m %016llx, adam_v %016llx, "
             "adam_step %lld\n", (long long)where.world, (long long)where.step, (long long)where.epoch,
             (unsigned long long)checksum_bytes(full.params, bytes), (unsigned long long)checksum_bytes(full.adam_m, bytes),
             (unsigned long long)checksum_bytes(full.adam_v, bytes), (long long)where.adam_step);
    char model[1100];
    snprintf(model, sizeof model, "%s/model.safetensors", o->out_dir);
    files_make_dirs_or_die(o->out_dir);
    if (!gpt_save_safetensors(&full, model, err, sizeof err)) die("saving the model: %s", err);
    log_main("saved: %s (%zu parameters); ./%s --generate --out_dir %s samples from it, with the run's "
             "tokenizer.json beside it\n", model, full.num_params, chapter, o->out_dir);
    gpt_free(&full);
    return 0;
}

#endif
