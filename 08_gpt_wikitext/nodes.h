// nodes.h - chapter 08 across several nodes: who runs where, and the same
// data on every node.
//
// On one machine every rank reads the same files and picks its device the
// same way. Across machines neither is given. A node may find no usable GPU
// (an old driver, CUDA_VISIBLE_DEVICES set to nothing) and compute on its
// CPU, slowing the whole job to its pace; a node may hold another copy of
// the corpus, or train another tokenizer, and then its ranks compute
// gradients of other text under the same token ids: the loss still falls,
// nothing crashes, and the model is quietly wrong. So:
//
//   nodes_report      rank 0 prints one line per node, among the first lines
//                     of the run: its host, its ranks, their device and the
//                     transport the backend uses there;
//   nodes_check_data  after loading the data, every rank publishes a
//                     fingerprint of its tokenizer and of each split's tokens;
//                     rank 0 compares them with its own, and on a difference
//                     every rank stops with the same one-line error.
//
// (The software itself - course, CUDA, NCCL - was compared already, by
// dist_init: common/versions.h.) Both go through the rendezvous store,
// whose keys belong to this attempt of the job, so a restarted job never
// reads the previous attempt's answers.
#ifndef COURSE_08_NODES_H
#define COURSE_08_NODES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "dist.h"
#include "log.h"

typedef struct {
    int node, cuda, gpu;
    char host[64], device[128], backend[400], why[200];
} nodes_where;

// Rank 0's wait for another rank's key: the job's timeout.
static inline size_t nodes_get(dist_t *d, const char *key, char *buf, size_t size) {
    size_t n = store_get(d->rdzv.store, key, buf, size - 1, d->rdzv.timeout_s);
    buf[n] = '\0';
    return n;
}

// "0-1" for ranks 0 and 1 of `node`, "2" for rank 2 alone, "0-3,8-11" when the
// node's ranks are not consecutive (srun --distribution=cyclic). Returns the count.
static inline int nodes_rank_list(const nodes_where *all, int world, int node, char *out, size_t size) {
    size_t at = 0;
    int count = 0;
    out[0] = '\0';
    for (int r = 0; r < world; r++) {
        if (all[r].node != node) continue;
        int last = r;
        while (last + 1 < world && all[last + 1].node == node) last++;
        count += last - r + 1;
        if (at < size)
            at += (size_t)(last > r ? snprintf(out + at, size - at, "%s%d-%d", at ? "," : "", r, last)
                                    : snprintf(out + at, size - at, "%s%d", at ? "," : "", r));
        r = last;
    }
    return count;
}

// A GPU's model without its number: "NVIDIA H100 80GB HBM3" from "GPU 3:
// NVIDIA H100 80GB HBM3"; a CPU's name as it is.
static inline const char *nodes_model(const nodes_where *w) {
    const char *colon = w->cuda ? strstr(w->device, ": ") : NULL;
    return colon ? colon + 2 : w->device;
}

// The node's devices in a few words: "CPU (16 cores)", "GPUs 0,1,2,3
// (NVIDIA H100 80GB HBM3)", or, when its ranks differ, each rank's device.
static inline void nodes_devices(const nodes_where *all, int world, int node, char *out, size_t size) {
    const nodes_where *first = NULL;
    bool same_model = true, all_gpus = true;
    int count = 0;
    for (int r = 0; r < world; r++) {
        if (all[r].node != node) continue;
        if (!first) first = &all[r];
        same_model = same_model && !strcmp(nodes_model(&all[r]), nodes_model(first));
        all_gpus = all_gpus && all[r].cuda;
        count++;
    }
    if (!first) {
        snprintf(out, size, "?");
        return;
    }
    if (same_model && !all_gpus) {
        snprintf(out, size, "%s", first->device);
        return;
    }
    size_t at = (size_t)snprintf(out, size, "%s", same_model ? (count == 1 ? "GPU " : "GPUs ") : "");
    for (int r = 0; r < world && at < size; r++) {
        if (all[r].node != node) continue;
        const char *sep = &all[r] == first ? "" : same_model ? "," : "; ";
        at += same_model ? (size_t)snprintf(out + at, size - at, "%s%d", sep, all[r].gpu)
                         : (size_t)snprintf(out + at, size - at, "%srank %d: %s", sep, r, all[r].device);
    }
    if (same_model && at < size) snprintf(out + at, size - at, " (%s)", nodes_model(first));
}

// Rank 0 prints "ranks: N, backend B" and, when there are several ranks, one
// line per node. A node whose ranks compute on another kind of device than
// rank 0 also says why: that is the node to look at.
static inline void nodes_report(dist_t *d) {
    if (d->world_size == 1) {
        log_main("ranks: 1, backend %s\n", pg_describe(d->pg));
        return;
    }
    nodes_where me = {.node = d->env.group_rank, .cuda = device_is_cuda(&d->device), .gpu = d->device.gpu};
    if (gethostname(me.host, sizeof me.host - 1) < 0) snprintf(me.host, sizeof me.host, "?");
    snprintf(me.device, sizeof me.device, "%s", d->device.name);
    snprintf(me.backend, sizeof me.backend, "%s", pg_describe(d->pg));
    snprintf(me.why, sizeof me.why, "%s", d->device.why);
    char key[64], text[1024];
    snprintf(key, sizeof key, "gpt/where/%d", d->rank);
    int n = snprintf(text, sizeof text, "%d %d %d\n%s\n%s\n%s\n%s", me.node, me.cuda, me.gpu, me.host, me.device,
                     me.backend, me.why);
    store_set(d->rdzv.store, key, text, (size_t)(n < (int)sizeof text ? n : (int)sizeof text - 1));
    if (d->rank != 0) return;

    nodes_where *all = xcalloc((size_t)d->world_size, sizeof *all);
    int nodes = 0;
    for (int r = 0; r < d->world_size; r++) {
        snprintf(key, sizeof key, "gpt/where/%d", r);
        nodes_get(d, key, text, sizeof text);
        nodes_where *w = &all[r];
        char *line[5] = {text, NULL, NULL, NULL, NULL};
        for (int i = 1; i < 5; i++) {
            line[i] = line[i - 1] ? strchr(line[i - 1], '\n') : NULL;
            if (line[i]) *line[i]++ = '\0';
        }
        if (!line[4] || sscanf(line[0], "%d %d %d", &w->node, &w->cuda, &w->gpu) != 3)
            die("rank %d published a malformed description of where it runs", r);
        snprintf(w->host, sizeof w->host, "%s", line[1]);
        snprintf(w->device, sizeof w->device, "%s", line[2]);
        snprintf(w->backend, sizeof w->backend, "%s", line[3]);
        snprintf(w->why, sizeof w->why, "%s", line[4]);
        if (w->node + 1 > nodes) nodes = w->node + 1;
    }
    log_main("ranks: %d on %d node%s, backend %s\n", d->world_size, nodes, nodes == 1 ? "" : "s",
             backend_name(pg_backend(d->pg)));
    for (int node = 0; node < nodes; node++) {
        char ranks[256], devices[512];
        int count = nodes_rank_list(all, d->world_size, node, ranks, sizeof ranks);
        if (count == 0) continue;
        nodes_devices(all, d->world_size, node, devices, sizeof devices);
        const nodes_where *w = NULL;
        for (int r = 0; r < d->world_size && !w; r++)
            if (all[r].node == node) w = &all[r];
        log_main("  node %d (%s): rank%s %s on %s; %s%s%s\n", node, w->host, count == 1 ? "" : "s", ranks, devices,
                 w->backend, w->cuda != all[0].cuda ? "; why: " : "", w->cuda != all[0].cuda ? w->why : "");
    }
    free(all);
}

// Every rank must train on the same tokens: the same tokenizer, and splits
// with the same tokens. Rank 0 compares everyone's fingerprints with its own.
static inline void nodes_check_data(dist_t *d, uint64_t tokenizer, uint16_t *const split[3], const size_t count[3]) {
    if (d->world_size == 1) return;
    static const char *const names[3] = {"train", "valid", "test"};
    char key[64], text[512], host[64] = "?", verdict[1024] = "ok";
    if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "?");
    unsigned long long mine[7] = {(unsigned long long)tokenizer};
    for (int s = 0; s < 3; s++) {
        mine[1 + 2 * s] = count[s];
        mine[2 + 2 * s] = checksum_bytes(split[s], count[s] * sizeof(uint16_t));
    }
    snprintf(key, sizeof key, "gpt/data/%d", d->rank);
    int n = snprintf(text, sizeof text, "%d %.63s %llx %llu %llx %llu %llx %llu %llx", d->env.group_rank, host,
                     mine[0], mine[1], mine[2], mine[3], mine[4], mine[5], mine[6]);
    store_set(d->rdzv.store, key, text, (size_t)n);
    if (d->rank == 0) {
        for (int r = 1; r < d->world_size && !strcmp(verdict, "ok"); r++) {
            snprintf(key, sizeof key, "gpt/data/%d", r);
            nodes_get(d, key, text, sizeof text);
            unsigned long long theirs[7];
            int node;
            char where[64];
            if (sscanf(text, "%d %63s %llx %llu %llx %llu %llx %llu %llx", &node, where, &theirs[0], &theirs[1],
                       &theirs[2], &theirs[3], &theirs[4], &theirs[5], &theirs[6]) != 9)
                die("rank %d published a malformed data fingerprint", r);
            int field = 0;
            while (field < 7 && theirs[field] == mine[field]) field++;
            if (field == 7) continue;
            char what[200];
            if (field == 0)
                snprintf(what, sizeof what, "another tokenizer (fingerprint %016llx, rank 0's %016llx)", theirs[0],
                         mine[0]);
            else
                snprintf(what, sizeof what, "another %s split (%llu tokens, checksum %016llx; rank 0: %llu, %016llx)",
                         names[(field - 1) / 2], theirs[1 + (field - 1) / 2 * 2], theirs[2 + (field - 1) / 2 * 2],
                         mine[1 + (field - 1) / 2 * 2], mine[2 + (field - 1) / 2 * 2]);
            snprintf(verdict, sizeof verdict, "data check: rank %d (node %d, %s) has %s than rank 0 (node %d, %s): "
                     "every node needs the same train.txt, valid.txt and test.txt and the same --vocab_size",
                     r, node, where, what, d->env.group_rank, host);
        }
        store_set(d->rdzv.store, "gpt/data/verdict", verdict, strlen(verdict));
    } else {
        nodes_get(d, "gpt/data/verdict", verdict, sizeof verdict);
    }
    if (strcmp(verdict, "ok")) die("%s", verdict);
}

#endif
