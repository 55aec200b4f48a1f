// nodes.h - which ranks run where: rank 0 prints one line per node.
//
// On one machine every rank picks its device the same way. Across machines
// nothing is given: a node may find no usable GPU (an old driver,
// CUDA_VISIBLE_DEVICES set to nothing) and compute on its CPU, slowing the
// whole job to its pace; a launcher may number the ranks across nodes
// otherwise than you thought (srun --distribution=cyclic). So, among the
// first lines of a run, rank 0 says it:
//
//   ranks: 5 on 2 nodes, backend cpu
//     node 0 (host-a): ranks 0-1 on CPU (16 cores); cpu (sockets + shared memory: ...)
//     node 1 (host-b): ranks 2-4 on GPUs 0,1,2 (NVIDIA H100 80GB HBM3); cpu (...)
//
// Every rank publishes where it runs (node, host, device, the backend's
// transport) in the rendezvous store, whose keys belong to this attempt of
// the job, so a restarted job never reads the previous attempt's answers;
// rank 0 reads them all (nodes_gather) and prints them (nodes_report). A
// node whose ranks compute on another kind of device than rank 0's also says
// why: that is the node to look at. Chapters 07 and 08 print this; a program
// that lays its ranks out in a mesh can print each rank's place beside it
// from the same table.
#ifndef COURSE_NODES_H
#define COURSE_NODES_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

// Every rank publishes where it runs; rank 0 gets everyone's, indexed by
// rank, and the number of nodes (the others get NULL). Free it with free().
static inline nodes_where *nodes_gather(dist_t *d, int *nodes) {
    nodes_where me = {.node = d->env.group_rank, .cuda = device_is_cuda(&d->device), .gpu = d->device.gpu};
    if (gethostname(me.host, sizeof me.host - 1) < 0) snprintf(me.host, sizeof me.host, "?");
    snprintf(me.device, sizeof me.device, "%s", d->device.name);
    snprintf(me.backend, sizeof me.backend, "%s", pg_describe(d->pg));
    snprintf(me.why, sizeof me.why, "%s", d->device.why);
    char key[64], text[1024];
    snprintf(key, sizeof key, "nodes/where/%d", d->rank);
    int n = snprintf(text, sizeof text, "%d %d %d\n%s\n%s\n%s\n%s", me.node, me.cuda, me.gpu, me.host, me.device,
                     me.backend, me.why);
    store_set(d->rdzv.store, key, text, (size_t)(n < (int)sizeof text ? n : (int)sizeof text - 1));
    if (d->rank != 0) return NULL;

    nodes_where *all = xcalloc((size_t)d->world_size, sizeof *all);
    *nodes = 0;
    for (int r = 0; r < d->world_size; r++) {
        snprintf(key, sizeof key, "nodes/where/%d", r);
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
        if (w->node + 1 > *nodes) *nodes = w->node + 1;
    }
    return all;
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

// Rank 0 prints "ranks: N on M nodes, backend B" and one line per node; a
// job of one rank is one line, "ranks: 1, backend B". Every rank calls it.
static inline void nodes_report(dist_t *d) {
    if (d->world_size == 1) {
        log_main("ranks: 1, backend %s\n", pg_describe(d->pg));
        return;
    }
    int nodes = 0;
    nodes_where *all = nodes_gather(d, &nodes);
    if (!all) return;   // not rank 0
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

#endif
