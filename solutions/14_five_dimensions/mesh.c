// mesh.c - a solution of exercise 14/mesh (see 14_five_dimensions/exercises/mesh.c).
#include "exercises.h"

void mesh_coords(const int sizes[MESH_DIMS], int rank, int coord[MESH_DIMS]) {
    for (int d = MESH_DIMS - 1; d >= 0; d--) { // tp is the lowest digit
        coord[d] = rank % sizes[d];
        rank /= sizes[d];
    }
}

int mesh_group(const int sizes[MESH_DIMS], int rank, unsigned dims, int *members) {
    int world = 1, mine[MESH_DIMS], n = 0;
    for (int d = 0; d < MESH_DIMS; d++) world *= sizes[d];
    mesh_coords(sizes, rank, mine);
    for (int r = 0; r < world; r++) { // in increasing order
        int c[MESH_DIMS], same = 1;
        mesh_coords(sizes, r, c);
        for (int d = 0; d < MESH_DIMS; d++)
            if (!(dims & (1u << d)) && c[d] != mine[d]) same = 0;
        if (same) members[n++] = r;
    }
    return n;
}
