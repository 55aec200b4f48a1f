// gather_whole.h - the whole model, put together on rank 0 from the parts
// the ranks of a layout hold: chapter 10's tp shards, chapter 11's
// pipeline stages, chapter 13's experts, all at once in the finale.
//
// The ranks of dp replica 0 (every other replica holds the same numbers)
// each send their part - parameters and, if asked, both AdamW moments - to
// the job's rank 0, which puts each tensor, or each tensor's part, in its
// place in chapter 08's flat arrays (gpt_shard_copy with the sender's
// table). What comes out is 08's model, which 08 --generate loads, and
// which a snapshot holds whatever layout wrote it.
#ifndef GPT_GATHER_WHOLE_H
#define GPT_GATHER_WHOLE_H

#include <stdbool.h>
#include <string.h>

#include "gpt.h"
#include "groups.h"
#include "model.h"

// Every rank calls it; the job's rank 0 returns true with *whole, the
// others false. `moments`: AdamW's moments and step too (once a step was
// taken; zeros before).
static inline bool gather_whole(model_t *m, groups_t *g, bool moments, gpt_t *whole) {
    // dp and cp replicas hold the same numbers as coordinate 0's; the ranks
    // along ep hold different experts (chapter 13) and send theirs too.
    if (g->coord[DIM_DP] != 0 || g->coord[DIM_CP] != 0) return false;
    model_to_host(m);
    gpt_t *h = &m->host;
    int arrays = moments ? 3 : 1;
    gpt_real *zeros = moments && !h->adam_m ? xcalloc(h->num_params, sizeof(gpt_real)) : NULL;
    gpt_real *mine[3] = {h->params, h->adam_m ? h->adam_m : zeros, h->adam_v ? h->adam_v : zeros};
    pg_t *world = g->dist->pg;
    const device_t *dev = &g->dist->device;
    if (g->rank != 0) {
        for (int k = 0; k < arrays; k++) groups_send_host(world, dev, mine[k], h->num_params, DTYPE_F32, 0);
        free(zeros);
        return false;
    }
    gpt_config whole_cfg = h->cfg;
    whole_cfg.ep = 1; // all the experts
    gpt_init(whole, whole_cfg, 0); // every number of it is overwritten below
    whole->adam_step = h->adam_step;
    if (moments) whole->adam_m = xmalloc(sizeof(gpt_real) * whole->num_params);
    if (moments) whole->adam_v = xmalloc(sizeof(gpt_real) * whole->num_params);
    gpt_real *dst[3] = {whole->params, whole->adam_m, whole->adam_v};
    int at[DIMS] = {0};
    for (int stage = 0; stage < g->size[DIM_PP]; stage++)
        for (int shard = 0; shard < g->size[DIM_TP] * g->size[DIM_EP]; shard++) {
            int experts = shard / g->size[DIM_TP];
            at[DIM_PP] = stage, at[DIM_TP] = shard % g->size[DIM_TP], at[DIM_EP] = experts;
            int from = groups_rank_of(g, at); // dp 0, and 0 along the dimensions that hold no part
            gpt_t part; // the sender's table: where each of its tensors lies in what it sends
            memset(&part, 0, sizeof part);
            part.cfg = h->cfg, part.stage = gpt_stage_of(&h->cfg, stage, g->size[DIM_PP]), part.tp = h->tp;
            gpt_build_table(&part);
            gpt_real *buf = from == 0 ? NULL : xmalloc(sizeof(gpt_real) * part.num_params);
            for (int k = 0; k < arrays; k++) {
                if (from > 0) groups_recv_host(world, dev, buf, part.num_params, DTYPE_F32, from);
                if (gpt_ep_ways(h->cfg.ep) > 1) // experts and tp shards at once (the finale)
                    gpt_part_copy(&part, shard % g->size[DIM_TP], experts, dst[k], from == 0 ? mine[k] : buf, false);
                else gpt_shard_copy(&part, shard % g->size[DIM_TP], dst[k], from == 0 ? mine[k] : buf, false);
            }
            free(buf);
            free(part.tensors);
        }
    free(zeros);
    return true;
}

#endif
