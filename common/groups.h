// groups.h - the process groups of a parallel layout, built once over a
// device mesh, and the facts every chapter asks of them.
//
// Chapters 10-14 each cut training along more dimensions: data (dp),
// tensor (tp), pipeline (pp), context (cp), expert (ep). Every rank needs
// one group along each dimension, and the answers to a few questions: my
// coordinate along pp, am I the first stage, who is my next stage, which
// rank sits at these coordinates. This header answers them in ONE place,
// so no chapter computes a rank from coordinates by hand and every
// chapter lays the ranks out the same way (picotron's process-group
// manager, without its global: the chapter holds its groups_t).
//
// One dimension order for every chapter, Megatron-LM's, the last fastest:
//
//     pp  x  dp  x  ep  x  cp  x  tp
//   slowest                     fastest
//
// Consecutive ranks - one node, its fastest links - differ in tp, which
// all-reduces inside every block; then cp (attention's key/value blocks,
// every layer: chapter 12); ep (the experts' all-to-all, every MoE layer:
// chapter 13); dp (the gradients, once a step); pp is slowest: only
// activations between neighbouring stages cross its links, often across
// nodes. A rank's number is its coordinates in that order, row-major:
//
//   rank = (((pp * DP + dp) * EP + ep) * CP + cp) * TP + tp
//
// Dimensions of size 1 are left out of the printed mesh (mesh: dp 2 x tp 2)
// but still have a group: of this rank alone, so a chapter's code needs no
// case for "no tensor parallelism".
#ifndef COURSE_GROUPS_H
#define COURSE_GROUPS_H

#include <stdbool.h>
#include <string.h>

#include "device.h"
#include "dist.h"
#include "log.h"
#include "mesh.h"
#include "pg.h"

typedef enum { DIM_PP, DIM_DP, DIM_EP, DIM_CP, DIM_TP, DIMS } dim_t;

static const char *const GROUPS_NAMES[DIMS] = {"pp", "dp", "ep", "cp", "tp"};

typedef struct {
    int size[DIMS];   // along each dimension
    int coord[DIMS];  // this rank's place
    pg_t *group[DIMS];// the ranks that differ from this one along that dimension only
    mesh_t mesh;      // the dimensions of size > 1 (mesh_report prints it)
    pg_t *joined[8];  // groups over several dimensions (groups_join), freed with the rest
    int num_joined;
    dist_t *dist;     // the job: its world group, its device
    int rank, world;  // in the job
} groups_t;

// The groups of the layout with these sizes (size[DIM_DP] 0: the ranks the
// others leave). Every rank of the job calls it; a layout that does not
// fit the job is refused in one line.
static inline void groups_init(groups_t *g, dist_t *d, const int size_in[DIMS]) {
    memset(g, 0, sizeof *g);
    g->dist = d, g->rank = d->rank, g->world = d->world_size;
    int others = 1;
    for (int k = 0; k < DIMS; k++) {
        if (k != DIM_DP && size_in[k] < 1) die("groups: --%s %d: a size is at least 1", GROUPS_NAMES[k], size_in[k]);
        if (k != DIM_DP) others *= size_in[k];
        g->size[k] = size_in[k];
    }
    if (!g->size[DIM_DP]) {
        if (g->world % others)
            die("the mesh's dimensions other than dp make %d ranks, which does not divide the job's %d: start a "
                "multiple of %d ranks", others, g->world, others);
        g->size[DIM_DP] = g->world / others;
    }
    if (g->size[DIM_DP] * others != g->world)
        die("the mesh pp %d x dp %d x ep %d x cp %d x tp %d is %d ranks, and the job has %d", g->size[DIM_PP],
            g->size[DIM_DP], g->size[DIM_EP], g->size[DIM_CP], g->size[DIM_TP], g->size[DIM_DP] * others, g->world);
    int stride = 1;
    for (int k = DIMS - 1; k >= 0; k--) {
        g->coord[k] = g->rank / stride % g->size[k];
        stride *= g->size[k];
    }
    // The mesh of the dimensions that are there (every rank builds the same
    // one), its groups made by pg_split; a dimension of size 1 gets a group
    // of this rank alone.
    int shape[DIMS], n = 0;
    const char *names[DIMS];
    for (int k = 0; k < DIMS; k++)
        if (g->size[k] > 1) shape[n] = g->size[k], names[n++] = GROUPS_NAMES[k];
    if (n == 0) shape[n] = 1, names[n++] = "dp";
    mesh_init(&g->mesh, d->pg, n, shape, names);
    for (int k = 0; k < DIMS; k++)
        g->group[k] = g->size[k] > 1 ? mesh_group(&g->mesh, GROUPS_NAMES[k]) : pg_split(d->pg, g->rank, 0);
}

// Rank 0 prints the mesh: rank -> coordinates -> host and device.
static inline void groups_report(groups_t *g) { mesh_report(&g->mesh, g->dist); }

static inline void groups_free(groups_t *g) {
    for (int k = 0; k < g->num_joined; k++) pg_destroy(g->joined[k]);
    for (int k = 0; k < DIMS; k++)
        if (g->size[k] == 1) pg_destroy(g->group[k]);
    mesh_free(&g->mesh);
    memset(g, 0, sizeof *g);
}

// ---------------------------------------------------------------- derived facts

// The job's rank at these coordinates (the order above).
static inline int groups_rank_of(const groups_t *g, const int coord[DIMS]) {
    int rank = 0;
    for (int k = 0; k < DIMS; k++) {
        if (coord[k] < 0 || coord[k] >= g->size[k])
            die("groups_rank_of: %s coordinate %d is outside 0..%d", GROUPS_NAMES[k], coord[k], g->size[k] - 1);
        rank = rank * g->size[k] + coord[k];
    }
    return rank;
}

// The job's rank at this rank's coordinates with one of them changed.
static inline int groups_rank_with(const groups_t *g, dim_t dim, int value) {
    int coord[DIMS];
    memcpy(coord, g->coord, sizeof coord);
    coord[dim] = value;
    return groups_rank_of(g, coord);
}

// The neighbour `step` places along a dimension, as a rank of that
// dimension's group (its coordinate); -1 past either end. The previous
// stage of a pipeline is groups_peer(g, DIM_PP, -1).
static inline int groups_peer(const groups_t *g, dim_t dim, int step) {
    int c = g->coord[dim] + step;
    return c >= 0 && c < g->size[dim] ? c : -1;
}

// The same, around a ring (context parallelism's key/value blocks).
static inline int groups_ring_peer(const groups_t *g, dim_t dim, int step) {
    int n = g->size[dim];
    return ((g->coord[dim] + step) % n + n) % n;
}

static inline bool groups_first(const groups_t *g, dim_t dim) { return g->coord[dim] == 0; }
static inline bool groups_last(const groups_t *g, dim_t dim) { return g->coord[dim] == g->size[dim] - 1; }

// The ranks that differ from this one along the named dimensions only
// ("dp cp": the ranks that hold the same weights and see different data,
// over which chapter 12 averages the gradients; "dp ep" in chapter 13 for
// the dense weights, while an expert's average over "dp" alone). Its ranks
// are numbered in job order, which is the row-major order of the named
// dimensions. Every rank calls it, in the same order (it splits the job's
// group); groups_free destroys it.
static inline pg_t *groups_join(groups_t *g, const char *dims) {
    bool named[DIMS] = {false};
    for (const char *p = dims; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (!n) break;
        int k = 0;
        while (k < DIMS && (strlen(GROUPS_NAMES[k]) != n || strncmp(GROUPS_NAMES[k], p, n))) k++;
        if (k == DIMS) die("groups_join: '%.*s' in \"%s\" is not a dimension (pp dp ep cp tp)", (int)n, p, dims);
        named[k] = true, p += n;
    }
    if (g->num_joined == (int)(sizeof g->joined / sizeof g->joined[0]))
        die("groups_join: more than %d joined groups", g->num_joined);
    // The color: this rank's coordinates with the named ones set to 0 - the
    // same for exactly the ranks that differ along the named dimensions only.
    int coord[DIMS];
    for (int k = 0; k < DIMS; k++) coord[k] = named[k] ? 0 : g->coord[k];
    pg_t *pg = pg_split(g->dist->pg, groups_rank_of(g, coord), g->rank);
    return g->joined[g->num_joined++] = pg;
}

// One dimension seen as two: its `outer` x (size / outer) ranks, the inner
// fastest - so an inner group is consecutive coordinates (consecutive ranks
// when the dimension is dp and every faster one is 1: the ranks of a node).
// Hybrid sharding splits dp so (torchtitan's dp_replicate x dp_shard,
// FSDP's HYBRID_SHARD): ZeRO inside each inner group, an all-reduce of the
// slices over the outer one. Along dim, coordinate c = o * inner + i:
// *inner_pg holds the ranks with this rank's o (and every other coordinate
// equal), ordered by i; *outer_pg those with this rank's i, ordered by o.
// Every rank calls it, in the same order; groups_free destroys both.
static inline void groups_split(groups_t *g, dim_t dim, int outer, pg_t **outer_pg, pg_t **inner_pg) {
    int size = g->size[dim];
    if (outer < 1 || size % outer)
        die("groups_split: %s's %d rank(s) do not split into %d equal parts", GROUPS_NAMES[dim], size, outer);
    if (g->num_joined + 2 > (int)(sizeof g->joined / sizeof g->joined[0]))
        die("groups_split: more than %d joined groups", g->num_joined);
    int inner = size / outer, c = g->coord[dim], coord[DIMS];
    memcpy(coord, g->coord, sizeof coord);
    // The color of each group: the job's rank of its first member.
    coord[dim] = c - c % inner; // o * inner: the first of this rank's inner group
    *inner_pg = g->joined[g->num_joined++] = pg_split(g->dist->pg, groups_rank_of(g, coord), g->rank);
    coord[dim] = c % inner; // i: the first of this rank's outer group
    *outer_pg = g->joined[g->num_joined++] = pg_split(g->dist->pg, groups_rank_of(g, coord), g->rank);
}

// ---------------------------------------------------------------- a few host numbers over a group

// The groups move data in the device's memory (NCCL knows no other): a few
// host values travel through a device buffer, as dist_all_reduce_host does
// for the whole job. On a group of one rank they stay where they are.
static inline void groups_all_reduce_host(pg_t *pg, const device_t *dev, void *values, size_t count, dtype_t t,
                                          redop_t op) {
    if (pg_world_size(pg) == 1 || count == 0) return;
    size_t bytes = dtype_size(t) * count;
    void *buf = device_alloc(dev, bytes);
    device_from_host(dev, buf, values, bytes);
    pg_all_reduce(pg, buf, buf, count, t, op);
    device_to_host(dev, values, buf, bytes);
    device_free(dev, buf);
}

static inline void groups_broadcast_host(pg_t *pg, const device_t *dev, void *values, size_t count, dtype_t t,
                                         int root) {
    if (pg_world_size(pg) == 1 || count == 0) return;
    size_t bytes = dtype_size(t) * count;
    void *buf = device_alloc(dev, bytes);
    device_from_host(dev, buf, values, bytes);
    pg_broadcast(pg, buf, count, t, root);
    device_to_host(dev, values, buf, bytes);
    device_free(dev, buf);
}

// mine: count numbers of type t; all: the group's, rank r's at r * count.
static inline void groups_all_gather_host(pg_t *pg, const device_t *dev, const void *mine, void *all, size_t count,
                                          dtype_t t) {
    size_t bytes = dtype_size(t) * count, world = (size_t)pg_world_size(pg);
    if (bytes == 0) return;
    if (world == 1) {
        memcpy(all, mine, bytes);
        return;
    }
    void *send = device_alloc(dev, bytes), *recv = device_alloc(dev, bytes * world);
    device_from_host(dev, send, mine, bytes);
    pg_all_gather(pg, send, recv, count, t);
    device_to_host(dev, all, recv, bytes * world);
    device_free(dev, send);
    device_free(dev, recv);
}

static inline void groups_send_host(pg_t *pg, const device_t *dev, const void *values, size_t count, dtype_t t,
                                    int peer) {
    size_t bytes = dtype_size(t) * count;
    if (bytes == 0) return;
    void *buf = device_alloc(dev, bytes);
    device_from_host(dev, buf, values, bytes);
    pg_send(pg, buf, count, t, peer);
    device_free(dev, buf);
}

static inline void groups_recv_host(pg_t *pg, const device_t *dev, void *values, size_t count, dtype_t t, int peer) {
    size_t bytes = dtype_size(t) * count;
    if (bytes == 0) return;
    void *buf = device_alloc(dev, bytes);
    pg_recv(pg, buf, count, t, peer);
    device_to_host(dev, values, buf, bytes);
    device_free(dev, buf);
}

#endif
