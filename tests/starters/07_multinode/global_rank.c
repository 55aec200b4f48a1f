// global_rank.c - EXERCISE: hand out global ranks, node by node.
//
// The launchers of a multi-node job (tools/ddprun, torchrun) meet at node 0,
// learn how many workers each node runs, and number the workers node by
// node: node 0's workers first, then node 1's, and so on. Nodes may differ
// (8 GPUs here, 4 there). With nodes of [2, 3] workers:
//     node 0: local ranks 0, 1     -> ranks 0, 1
//     node 1: local ranks 0, 1, 2  -> ranks 2, 3, 4
// Write both directions:
//
//     int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes);
//         RANK of the worker with this GROUP_RANK and LOCAL_RANK.
//     void rank_location(int rank, const int *nproc_per_node, int nnodes,
//                        int *node_rank, int *local_rank);
//         the node and the local rank of global rank `rank` (what rank 0 of
//         07_multinode prints as "node 1 (host): ranks 2-4 on ...").
//
// Hints:
//   - node_rank * nproc_per_node[node_rank] + local_rank is right only when
//     every node runs the same number of workers. Count the workers of the
//     nodes BEFORE this one instead.
//   - For the inverse, walk the nodes, taking off each node's count until
//     the rank falls inside one.
//   - tools/ddprun.c does this when its launchers meet (rank_offset).
//
// Check it (from the course's top folder):
//     make check-exercise EX=07/global_rank
// The check tries layouts such as [1], [2, 3], [8, 8], [4, 2, 3] and
// [3, 1, 4, 1, 5], and says which node and local rank got a wrong number.
#include "exercises.h"

int global_rank(int node_rank, int local_rank, const int *nproc_per_node, int nnodes) {
    // TODO: the workers of the nodes before this one come first.
    (void)node_rank;
    (void)nproc_per_node;
    (void)nnodes;
    return local_rank;
}

void rank_location(int rank, const int *nproc_per_node, int nnodes, int *node_rank, int *local_rank) {
    // TODO: find the node whose range of ranks holds `rank`.
    (void)nproc_per_node;
    (void)nnodes;
    *node_rank = 0;
    *local_rank = rank;
}
