// exercises.h - the functions chapter 07's exercise asks you to write.
//
// You write them in global_rank.c; check_global_rank.c calls them, so keep
// these signatures. Check them from the course's top folder with
//   make check-exercise EX=07/global_rank
#ifndef EXERCISES_07_H
#define EXERCISES_07_H

// nproc_per_node[n] is the number of workers on node n, for n < nnodes.

// RANK of worker LOCAL_RANK = local_rank on node GROUP_RANK = node_rank.
int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes);

// The inverse: on which node, and as which local rank, global rank `rank` runs.
void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank);

#endif
