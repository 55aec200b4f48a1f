// mesh.c - EXERCISE: a rank's coordinates on the five-dimensional mesh, and
// its groups.
//
// The finale's mesh is pp x dp x ep x cp x tp, tp fastest: rank r of a
// 2 x 2 x 2 x 2 x 2 mesh has the coordinates of r's five binary digits,
// pp the highest. Write
//   mesh_coords  rank -> its five coordinates;
//   mesh_group   the ranks that share every coordinate but those of the
//                dimensions in `dims`: for dims = dp | ep | cp the ranks
//                that average a dense gradient with this one, for dp | cp
//                an expert's replicas.
// The check tries three meshes, every rank, and the groups the finale
// uses; it names the usual slips: the dimensions read in the wrong order
// (pp fastest), a group that also varies a dimension it should hold fixed,
// members out of order.
#include "exercises.h"

void mesh_coords(const int sizes[MESH_DIMS], int rank, int coord[MESH_DIMS]) {
    // TODO: peel the digits off rank, the last dimension (tp) first.
    (void)sizes, (void)rank;
    for (int d = 0; d < MESH_DIMS; d++) coord[d] = 0;
}

int mesh_group(const int sizes[MESH_DIMS], int rank, unsigned dims, int *members) {
    // TODO: every rank of the mesh whose coordinates outside `dims` are rank's.
    (void)sizes, (void)dims;
    members[0] = rank;
    return 1;
}
