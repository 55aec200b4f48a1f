// global_rank.c - reference solution of exercise 07/global_rank.
#include "exercises.h"

int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes) {
    int before = 0;   // workers on the nodes before this one
    for (int n = 0; n < node_rank && n < nnodes; n++) before += nproc_per_node[n];
    return before + local_rank;
}

void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank) {
    int n = 0;
    while (n < nnodes - 1 && rank >= nproc_per_node[n]) rank -= nproc_per_node[n++];
    *node_rank = n;
    *local_rank = rank;
}
