// data_check.h - the GPT of chapters 08-11 across several nodes: the same data on every node.
//
// On one machine every rank reads the same files. Across machines that is
// not given: a node may hold another copy of the corpus, or train another
// tokenizer, and then its ranks compute gradients of other text under the
// same token ids: the loss still falls, nothing crashes, and the model is
// quietly wrong. So, after loading the data, every rank publishes a
// fingerprint of its tokenizer and of each split's tokens through the
// rendezvous store (keys of this attempt of the job); rank 0 compares them
// with its own, and on a difference every rank stops with the same one-line
// error. (The software itself - course, CUDA, NCCL - was compared already,
// by dist_init: common/versions.h; which ranks run where, common/nodes.h.)
#ifndef COURSE_08_DATA_CHECK_H
#define COURSE_08_DATA_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "dist.h"
#include "nodes.h"

// Every rank must train on the same tokens: the same tokenizer, and splits
// with the same tokens. Rank 0 compares everyone's fingerprints with its own.
static inline void data_check_across_nodes(dist_t *d, uint64_t tokenizer, uint16_t *const split[3], const size_t count[3]) {
    if (d->world_size == 1) return;
    static const char *const names[3] = {"train", "valid", "test"};
    char key[64], text[512], host[64] = "?", verdict[1024] = "ok";
    if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "?");
    unsigned long long mine[7] = {(unsigned long long)tokenizer};
    for (int s = 0; s < 3; s++) {
        mine[1 + 2 * s] = count[s];
        mine[2 + 2 * s] = checksum_bytes(split[s], count[s] * sizeof(uint16_t));
    }
    snprintf(key, sizeof key, "gpt/data/%d", d->rank);
    int n = snprintf(text, sizeof text, "%d %.63s %llx %llu %llx %llu %llx %llu %llx", d->env.group_rank, host,
                     mine[0], mine[1], mine[2], mine[3], mine[4], mine[5], mine[6]);
    store_set(d->rdzv.store, key, text, (size_t)n);
    if (d->rank == 0) {
        for (int r = 1; r < d->world_size && !strcmp(verdict, "ok"); r++) {
            snprintf(key, sizeof key, "gpt/data/%d", r);
            nodes_get(d, key, text, sizeof text);
            unsigned long long theirs[7];
            int node;
            char where[64];
            if (sscanf(text, "%d %63s %llx %llu %llx %llu %llx %llu %llx", &node, where, &theirs[0], &theirs[1],
                       &theirs[2], &theirs[3], &theirs[4], &theirs[5], &theirs[6]) != 9)
                die("rank %d published a malformed data fingerprint", r);
            int field = 0;
            while (field < 7 && theirs[field] == mine[field]) field++;
            if (field == 7) continue;
            char what[200];
            if (field == 0)
                snprintf(what, sizeof what, "another tokenizer (fingerprint %016llx, rank 0's %016llx)", theirs[0],
                         mine[0]);
            else
                snprintf(what, sizeof what, "another %s split (%llu tokens, checksum %016llx; rank 0: %llu, %016llx)",
                         names[(field - 1) / 2], theirs[1 + (field - 1) / 2 * 2], theirs[2 + (field - 1) / 2 * 2],
                         mine[1 + (field - 1) / 2 * 2], mine[2 + (field - 1) / 2 * 2]);
            snprintf(verdict, sizeof verdict, "data check: rank %d (node %d, %s) has %s than rank 0 (node %d, %s): "
                     "every node needs the same train.txt, valid.txt and test.txt and the same --vocab_size",
                     r, node, where, what, d->env.group_rank, host);
        }
        store_set(d->rdzv.store, "gpt/data/verdict", verdict, strlen(verdict));
    } else {
        nodes_get(d, "gpt/data/verdict", verdict, sizeof verdict);
    }
    if (strcmp(verdict, "ok")) die("%s", verdict);
}

#endif
