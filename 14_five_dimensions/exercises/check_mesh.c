// check_mesh.c - checks exercise 14/mesh.
//
// Run it with `make check-exercise EX=14/mesh` from the top folder. One
// process: three meshes (2 x 2 x 2 x 2 x 2; 1 x 3 x 2 x 1 x 2; 2 x 1 x 2 x 4
// x 1), every rank's coordinates, and its tp, cp, dp, "dp cp" and
// "dp ep cp" groups, against a reference written here; the first wrong
// answer is named with the usual slip it looks like.
#include <stdio.h>
#include <string.h>

#include "exercise_check.h"
#include "exercises.h"

static const char *names[MESH_DIMS] = {"pp", "dp", "ep", "cp", "tp"};

static void ref_coords(const int *sizes, int rank, int *coord, int fastest_first) {
    for (int i = 0; i < MESH_DIMS; i++) {
        int d = fastest_first ? i : MESH_DIMS - 1 - i; // fastest_first: the slip, pp taken as the fastest
        coord[d] = rank % sizes[d];
        rank /= sizes[d];
    }
}

static int ref_group(const int *sizes, int rank, unsigned dims, int *members) {
    int world = 1, mine[MESH_DIMS], n = 0;
    for (int d = 0; d < MESH_DIMS; d++) world *= sizes[d];
    ref_coords(sizes, rank, mine, 0);
    for (int r = 0; r < world; r++) {
        int c[MESH_DIMS], same = 1;
        ref_coords(sizes, r, c, 0);
        for (int d = 0; d < MESH_DIMS; d++)
            if (!(dims & (1u << d)) && c[d] != mine[d]) same = 0;
        if (same) members[n++] = r;
    }
    return n;
}

static void dims_text(unsigned dims, char *text, size_t size) {
    text[0] = 0;
    for (int d = 0; d < MESH_DIMS; d++)
        if (dims & (1u << d)) snprintf(text + strlen(text), size - strlen(text), "%s%s", text[0] ? " " : "", names[d]);
}

static void check_mesh(const int *sizes) {
    char mesh[64];
    snprintf(mesh, sizeof mesh, "%d x %d x %d x %d x %d", sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]);
    int world = 1;
    for (int d = 0; d < MESH_DIMS; d++) world *= sizes[d];
    for (int r = 0; r < world; r++) {
        int want[MESH_DIMS], got[MESH_DIMS], slip[MESH_DIMS];
        for (int d = 0; d < MESH_DIMS; d++) got[d] = -1;
        ref_coords(sizes, r, want, 0);
        ref_coords(sizes, r, slip, 1);
        mesh_coords(sizes, r, got);
        if (memcmp(want, got, sizeof want)) {
            verdict(false, "mesh %s, rank %d: got coordinates (pp %d, dp %d, ep %d, cp %d, tp %d), expected (%d, %d, %d, %d, %d)%s",
                    mesh, r, got[0], got[1], got[2], got[3], got[4], want[0], want[1], want[2], want[3], want[4],
                    memcmp(slip, got, sizeof slip) ? "" : ": that is pp read as the fastest dimension; tp is");
            return;
        }
    }
    verdict(true, "mesh %s: every rank's coordinates", mesh);
    unsigned groups[] = {1u << MESH_TP, 1u << MESH_CP, 1u << MESH_DP, (1u << MESH_DP) | (1u << MESH_CP),
                         (1u << MESH_DP) | (1u << MESH_EP) | (1u << MESH_CP)};
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        char dt[32];
        dims_text(groups[k], dt, sizeof dt);
        for (int r = 0; r < world; r++) {
            int want[64], got[64], nw = ref_group(sizes, r, groups[k], want);
            for (int i = 0; i < 64; i++) got[i] = -1;
            int ng = mesh_group(sizes, r, groups[k], got);
            if (ng != nw || memcmp(want, got, sizeof(int) * (size_t)nw)) {
                int sorted = 1, outside = 0;
                for (int i = 1; i < ng && i < 64; i++) sorted &= got[i] > got[i - 1];
                for (int i = 0; i < ng && i < 64; i++) {
                    int in = 0;
                    for (int j = 0; j < nw; j++) in |= got[i] == want[j];
                    outside |= !in;
                }
                verdict(false, "mesh %s, rank %d, group \"%s\": got %d member(s), expected %d (first %d, last %d)%s", mesh,
                        r, dt, ng, nw, want[0], want[nw - 1],
                        outside ? ": it holds a rank that differs in a dimension outside the group"
                        : !sorted ? ": the members are not in increasing order" : "");
                return;
            }
        }
        verdict(true, "mesh %s: every rank's \"%s\" group", mesh, dt);
    }
}

int main(void) {
    int meshes[3][MESH_DIMS] = {{2, 2, 2, 2, 2}, {1, 3, 2, 1, 2}, {2, 1, 2, 4, 1}};
    for (int i = 0; i < 3; i++) check_mesh(meshes[i]);
    return check_finish("a rank's five coordinates and its groups on the mesh, tp fastest");
}
