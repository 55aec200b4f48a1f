// check_global_rank.c - checks exercise 07/global_rank.
//
// Run it with `make check-exercise EX=07/global_rank` from the top folder.
// For several layouts of workers per node, even and uneven, it asks your
// global_rank for every (node, local rank) and your rank_location for every
// global rank, and compares with the numbering tools/ddprun uses: node by
// node, node 0's workers first. A wrong number is explained when it is a
// familiar mistake (node_rank times this node's count, say).
#include <stdbool.h>
#include <stdio.h>

#include "exercise_check.h"
#include "exercises.h"

// ---------------------------------------------------------------- layouts
typedef struct {
    int nnodes;
    int nproc[5];
} layout;

static const layout layouts[] = {
    {1, {1}}, {1, {4}}, {2, {2, 3}}, {2, {8, 8}}, {3, {4, 2, 3}}, {5, {1, 1, 1, 1, 1}}, {5, {3, 1, 4, 1, 5}},
};

static void describe(const layout *l, char *out, size_t size) {
    size_t used = (size_t)snprintf(out, size, "nodes of [");
    for (int n = 0; n < l->nnodes; n++)
        used += (size_t)snprintf(out + used, size - used, "%s%d", n ? ", " : "", l->nproc[n]);
    snprintf(out + used, size - used, "] workers");
}

static int workers_before(const layout *l, int node) {
    int before = 0;
    for (int n = 0; n < node; n++) before += l->nproc[n];
    return before;
}

static const char *rank_hint(const layout *l, int node, int local, int got) {
    int before = workers_before(l, node);
    if (got == local && node > 0) return ": that is the local rank; the workers of the nodes before this one come first";
    if (got == node * l->nproc[node] + local)
        return ": node_rank x this node's count is right only when every node has as many workers; "
               "add up the counts of the nodes BEFORE this one";
    if (got == node * l->nproc[0] + local)
        return ": node_rank x node 0's count is right only when every node has as many workers; "
               "add up the counts of the nodes BEFORE this one";
    if (got == before + l->nproc[node] + local) return ": this node's own workers were counted too; only the nodes before it";
    return "";
}

static bool check_forward(const layout *l, const char *name) {
    for (int node = 0; node < l->nnodes; node++)
        for (int local = 0; local < l->nproc[node]; local++) {
            int want = workers_before(l, node) + local;
            int got = global_rank(node, local, l->nproc, l->nnodes);
            if (got == want) continue;
            verdict(false, "%s: global_rank(node %d, local rank %d) = %d, expected %d (%d worker(s) on "
                    "the nodes before, then local rank %d)%s", name, node, local, got, want,
                    workers_before(l, node), local, rank_hint(l, node, local, got));
            return false;
        }
    return true;
}

static bool check_inverse(const layout *l, const char *name) {
    int rank = 0;
    for (int node = 0; node < l->nnodes; node++)
        for (int local = 0; local < l->nproc[node]; local++, rank++) {
            int got_node = -1, got_local = -1;
            rank_location(rank, l->nproc, l->nnodes, &got_node, &got_local);
            if (got_node == node && got_local == local) continue;
            verdict(false, "%s: rank_location(rank %d) gave node %d, local rank %d; expected node %d, "
                    "local rank %d", name, rank, got_node, got_local, node, local);
            return false;
        }
    return true;
}

int main(void) {
    printf("check 07/global_rank: global ranks from node rank and workers per node (global_rank.c)\n");
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        char name[64];
        describe(&layouts[k], name, sizeof name);
        bool forward = check_forward(&layouts[k], name);
        bool inverse = check_inverse(&layouts[k], name);
        if (forward && inverse) verdict(true, "%s: every worker's rank, and back", name);
    }
    return check_finish("ranks are handed out node by node, as ddprun does, for even and uneven nodes, "
                        "and rank_location undoes it");
}
