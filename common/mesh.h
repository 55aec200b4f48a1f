// mesh.h - a device mesh: the ranks of a job laid out as a grid, with one
// process group along each named dimension (PyTorch's init_device_mesh).
//
// Large models are trained with several kinds of parallelism at once: data
// parallelism (dp) over copies of the model, tensor parallelism (tp) inside
// each layer, pipeline parallelism (pp) over the layers. Each needs its own
// group of ranks to talk to, and a rank belongs to one group of each kind.
//
// Ranks are numbered row-major, the last dimension fastest, as
// init_device_mesh does. With names ("dp", "tp"), ranks 0 and 1 differ in
// tp only, so a tp group holds consecutive ranks - the ranks of one node,
// whose links (NVLink) are the fastest: that is where tensor parallelism,
// the most talkative, belongs. The group along dimension k holds the ranks
// whose other coordinates are all equal to this rank's:
//
//   mesh dp 2 x tp 2, 4 ranks            tp groups {0,1} {2,3}
//                                        dp groups {0,2} {1,3}
//             tp 0   tp 1
//     dp 0:     0      1
//     dp 1:     2      3
//
// mesh_init makes every group with pg_split (so every backend works, and
// the groups of one dimension, being disjoint, run their collectives at
// the same time); mesh_report prints rank -> coordinates -> device.
#ifndef COURSE_MESH_H
#define COURSE_MESH_H

#include <stdio.h>
#include <string.h>

#include "dist.h"
#include "log.h"
#include "nodes.h"
#include "pg.h"

#define MESH_MAX_DIMS 5

typedef struct {
    int ndims;
    int shape[MESH_MAX_DIMS];
    char names[MESH_MAX_DIMS][16];
    int coord[MESH_MAX_DIMS];     // this rank's place
    pg_t *group[MESH_MAX_DIMS];   // the ranks along each dimension
    int rank, size;               // in the job's group
} mesh_t;

// The mesh over all ranks of pg: ndims dimensions of the given sizes, whose
// product must be pg's world size. Every rank calls it.
static inline void mesh_init(mesh_t *m, pg_t *pg, int ndims, const int *shape, const char *const *names) {
    memset(m, 0, sizeof *m);
    if (ndims < 1 || ndims > MESH_MAX_DIMS) die("mesh_init: %d dimensions (1 to %d)", ndims, MESH_MAX_DIMS);
    m->ndims = ndims, m->rank = pg_rank(pg), m->size = pg_world_size(pg);
    long product = 1;
    char text[128] = "";
    for (int k = 0; k < ndims; k++) {
        if (shape[k] < 1) die("mesh_init: dimension '%s' has size %d", names[k], shape[k]);
        product *= shape[k];
        m->shape[k] = shape[k];
        snprintf(m->names[k], sizeof m->names[k], "%s", names[k]);
        size_t used = strlen(text);
        snprintf(text + used, sizeof text - used, "%s%s %d", k ? " x " : "", names[k], shape[k]);
    }
    if (product != m->size)
        die("mesh %s needs %ld ranks, and the job has %d: choose sizes whose product is the number of ranks", text,
            product, m->size);
    // Row-major: the stride of dimension k is the product of the sizes after it.
    int stride[MESH_MAX_DIMS];
    for (int k = ndims - 1, s = 1; k >= 0; s *= m->shape[k--]) stride[k] = s;
    for (int k = 0; k < ndims; k++) m->coord[k] = m->rank / stride[k] % m->shape[k];
    // Along dimension k: the ranks equal to ours but for coordinate k. The
    // rank with coordinate k at 0 names the group; the coordinate orders it.
    for (int k = 0; k < ndims; k++) m->group[k] = pg_split(pg, m->rank - m->coord[k] * stride[k], m->coord[k]);
}

static inline int mesh_dim(const mesh_t *m, const char *name) {
    for (int k = 0; k < m->ndims; k++)
        if (!strcmp(m->names[k], name)) return k;
    die("the mesh has no dimension '%s'", name);
}

// The group, this rank's coordinate, and the size along a named dimension.
static inline pg_t *mesh_group(const mesh_t *m, const char *name) { return m->group[mesh_dim(m, name)]; }
static inline int mesh_coord(const mesh_t *m, const char *name) { return m->coord[mesh_dim(m, name)]; }
static inline int mesh_size(const mesh_t *m, const char *name) { return m->shape[mesh_dim(m, name)]; }

// Rank 0 prints the mesh, one line per rank: its coordinates, host and device.
//   mesh: dp 2 x tp 2 (4 ranks, the last dimension fastest)
//     rank  dp tp  host   device
//        0   0  0  vm-1   GPU 0: NVIDIA H100 80GB HBM3
static inline void mesh_report(const mesh_t *m, dist_t *d) {
    int nodes = 0;
    nodes_where *all = nodes_gather(d, &nodes);
    char key[64], text[64];
    int n = 0;
    for (int k = 0; k < m->ndims; k++) n += snprintf(text + n, sizeof text - (size_t)n, " %d", m->coord[k]);
    snprintf(key, sizeof key, "mesh/coord/%d", m->rank);
    store_set(d->rdzv.store, key, text, strlen(text));
    if (!all) return;
    char shape[128] = "", header[128] = "";
    for (int k = 0, a = 0, b = 0; k < m->ndims; k++) {
        a += snprintf(shape + a, sizeof shape - (size_t)a, "%s%s %d", k ? " x " : "", m->names[k], m->shape[k]);
        b += snprintf(header + b, sizeof header - (size_t)b, " %3s", m->names[k]);
    }
    log_main("mesh: %s (%d ranks, the last dimension fastest)\n", shape, m->size);
    log_main("  rank %s  host  device\n", header);
    for (int r = 0; r < m->size; r++) {
        snprintf(key, sizeof key, "mesh/coord/%d", r);
        nodes_get(d, key, text, sizeof text);
        char coords[128] = "";
        int at = 0;
        for (char *tok = strtok(text, " "); tok; tok = strtok(NULL, " "))
            at += snprintf(coords + at, sizeof coords - (size_t)at, " %3s", tok);
        log_main("  %4d %s  %s  %s\n", r, coords, all[r].host, all[r].device);
    }
    free(all);
}

static inline void mesh_free(mesh_t *m) {
    for (int k = 0; k < m->ndims; k++) pg_destroy(m->group[k]);
    memset(m, 0, sizeof *m);
}

#endif
