// exercises.h - the functions chapter 14's exercise asks you to write.
//
// You write them in mesh.c; check_mesh.c calls them, so keep these
// signatures. Check them from the course's top folder with
//   make check-exercise EX=14/mesh
#ifndef EXERCISES_14_H
#define EXERCISES_14_H

// The mesh of common/groups.h: five dimensions in this order, the LAST
// fastest (a rank's number is its coordinates read as one number, digit d
// counting in base sizes[d]).
enum { MESH_PP, MESH_DP, MESH_EP, MESH_CP, MESH_TP, MESH_DIMS };

// coord[d]: the coordinate of `rank` along dimension d.
void mesh_coords(const int sizes[MESH_DIMS], int rank, int coord[MESH_DIMS]);

// The ranks of `rank`'s group over the dimensions whose bits are set in
// `dims` (bit d: dimension d; e.g. (1 << MESH_DP) | (1 << MESH_CP) is
// groups_join's "dp cp"): every rank whose coordinates along the OTHER
// dimensions are rank's. Written to members in increasing order; returns
// how many.
int mesh_group(const int sizes[MESH_DIMS], int rank, unsigned dims, int *members);

#endif
