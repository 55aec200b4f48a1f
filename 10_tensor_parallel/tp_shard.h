// tp_shard.h - the way back of gpt/gather_whole.h: a rank of chapter 10
// takes its shard of a whole model (a snapshot's, on resume).
#ifndef TP_SHARD_H
#define TP_SHARD_H

#include "gpt.h"
#include "model.h"

// This rank's shard (tp rank `tp_rank`) of the whole model's parameters
// and, once a step was taken, AdamW's moments and step; then onto the
// device. gpt_shard_copy knows, from the shard's table, which rows or
// columns of each tensor the shard holds.
static inline void take_shard(model_t *m, const gpt_t *whole, int tp_rank) {
    gpt_t *h = &m->host;
    gpt_shard_copy(h, tp_rank, whole->params, h->params, true);
    h->adam_step = whole->adam_step;
    if (whole->adam_step > 0) {
        if (!h->adam_m) h->adam_m = xcalloc(h->num_params, sizeof(gpt_real));
        if (!h->adam_v) h->adam_v = xcalloc(h->num_params, sizeof(gpt_real));
        gpt_shard_copy(h, tp_rank, whole->adam_m, h->adam_m, true);
        gpt_shard_copy(h, tp_rank, whole->adam_v, h->adam_v, true);
    }
    model_to_device(m);
}

#endif
