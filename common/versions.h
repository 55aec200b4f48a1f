// versions.h - every rank runs the same software, or the job does not start.
//
// On one machine every rank runs the same binary. On several machines each
// node has its own copy of the course, its own CUDA runtime and driver, and
// its own NCCL. When they differ the job does not always fail cleanly: two
// NCCL versions may disagree on a protocol and hang in the first all-reduce,
// two builds of the course may lay out a message differently and compute
// garbage. So, right after the rendezvous and before any collective, every
// rank publishes what it runs to the store; rank 0 compares, and on a
// mismatch prints a table of who has what, naming the column that differs,
// and every rank stops with a one-line error.
//
// Compared: the course version, the CUDA runtime and NCCL ("none" in a CPU
// build: a CPU build and a CUDA build are different software too). The CUDA
// driver is shown but may differ: a driver runs every runtime up to its own
// version, and clusters rarely update all nodes at once.
//
// To see the check fail without two machines, give one node another
// version: COURSE_VERSION_OVERRIDE=9.9.9 (also COURSE_CUDA_VERSION_OVERRIDE,
// COURSE_NCCL_VERSION_OVERRIDE).
#ifndef COURSE_VERSIONS_H
#define COURSE_VERSIONS_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rendezvous.h"

#define COURSE_VERSION "0.1.0"

typedef struct {
    char host[64];
    char course[32];
    char cuda[32];     // CUDA runtime, e.g. "13.0"
    char driver[32];   // the newest CUDA version the driver supports, or "none"
    char nccl[32];     // e.g. "2.28.3"
    int node;          // GROUP_RANK
} versions_t;

// The columns that must agree, by name as the table shows them, and their values.
enum { VERSIONS_COMPARED = 3 };

static inline const char *versions_column(int column) {
    return column == 0 ? "course" : column == 1 ? "CUDA" : "NCCL";
}

static inline const char *versions_field(const versions_t *v, int column) {
    return column == 0 ? v->course : column == 1 ? v->cuda : v->nccl;
}

// value, unless the variable `override` (if any) says otherwise, for the
// exercises and tests. Spaces become '_': each field travels as one word.
static inline void versions_put(char *out, size_t size, const char *override, const char *value) {
    const char *forced = override ? getenv(override) : NULL;
    const char *text = forced && forced[0] ? forced : value[0] ? value : "?";
    snprintf(out, size, "%.*s", (int)size - 1, text); // a longer version is cut, not an error
    for (char *c = out; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n') *c = '_';
}

// CUDA encodes 13.0 as 13000.
static inline void versions_cuda_text(int v, char *out, size_t size) {
    if (v <= 0) snprintf(out, size, "none");
    else snprintf(out, size, "%d.%d", v / 1000, (v % 1000) / 10);
}

static inline versions_t versions_mine(int node) {
    versions_t v = {.node = node};
    char host[64] = "?", cuda[32] = "none", driver[32] = "none", nccl[48] = "none";
    if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "?");
#ifdef COURSE_CUDA
    int runtime = 0, drv = 0, code = 0;
    CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
    CHECK_CUDA(cudaDriverGetVersion(&drv));   // 0 when no driver is installed
    versions_cuda_text(runtime, cuda, sizeof cuda);
    versions_cuda_text(drv, driver, sizeof driver);
    CHECK_NCCL(ncclGetVersion(&code));        // 2.28.3 is 22803 (since NCCL 2.9)
    snprintf(nccl, sizeof nccl, "%d.%d.%d", code / 10000, (code % 10000) / 100, code % 100);
#endif
    versions_put(v.host, sizeof v.host, NULL, host);
    versions_put(v.course, sizeof v.course, "COURSE_VERSION_OVERRIDE", COURSE_VERSION);
    versions_put(v.cuda, sizeof v.cuda, "COURSE_CUDA_VERSION_OVERRIDE", cuda);
    versions_put(v.driver, sizeof v.driver, NULL, driver);
    versions_put(v.nccl, sizeof v.nccl, "COURSE_NCCL_VERSION_OVERRIDE", nccl);
    return v;
}

static inline void versions_publish(store_t *st, int rank, const versions_t *v) {
    char key[64], text[256];
    snprintf(key, sizeof key, "versions/%d", rank);
    int n = snprintf(text, sizeof text, "%d %s %s %s %s %s", v->node, v->host, v->course,
                     v->cuda, v->driver, v->nccl);
    store_set(st, key, text, (size_t)n);
}

static inline versions_t versions_read(store_t *st, int rank, double timeout_s) {
    char key[64], text[256];
    versions_t v;
    snprintf(key, sizeof key, "versions/%d", rank);
    size_t n = store_get(st, key, text, sizeof text - 1, timeout_s);
    text[n] = '\0';
    if (sscanf(text, "%d %63s %31s %31s %31s %31s", &v.node, v.host, v.course, v.cuda,
               v.driver, v.nccl) != 6)
        die("rank %d published malformed versions '%s'", rank, text);
    return v;
}

// The first column in which some rank differs from rank 0 (-1: none);
// *who is that rank.
static inline int versions_compare(const versions_t *all, int world, int *who) {
    for (int c = 0; c < VERSIONS_COMPARED; c++)
        for (int r = 1; r < world; r++)
            if (strcmp(versions_field(&all[0], c), versions_field(&all[r], c))) {
                *who = r;
                return c;
            }
    return -1;
}

static inline void versions_print_table(const versions_t *all, int world, int column) {
    fflush(stdout);
    fprintf(stderr, "version check: the ranks of this job run different software; column "
            "'%s' differs:\n", versions_column(column));
    fprintf(stderr, "  %5s %5s  %-20s %-10s %-8s %-8s %s\n", "rank", "node", "host",
            "course", "CUDA", "driver", "NCCL");
    for (int r = 0; r < world; r++) {
        const versions_t *v = &all[r];
        bool odd = strcmp(versions_field(v, column), versions_field(&all[0], column)) != 0;
        fprintf(stderr, "  %5d %5d  %-20s %-10s %-8s %-8s %s%s\n", r, v->node, v->host,
                v->course, v->cuda, v->driver, v->nccl, odd ? "   <- differs from rank 0" : "");
    }
}

// Rank 0: gather, compare, and give the verdict ("ok" or the error line).
static inline void versions_judge(store_t *st, int world, double timeout_s, char *verdict,
                                  size_t size) {
    versions_t *all = xcalloc((size_t)world, sizeof *all);
    for (int r = 0; r < world; r++) all[r] = versions_read(st, r, timeout_s);
    int who = 0, column = versions_compare(all, world, &who);
    snprintf(verdict, size, "ok");
    if (column >= 0) {
        versions_print_table(all, world, column);
        snprintf(verdict, size, "version mismatch: %s %s on rank 0 (node %d, %s) but %s on "
                 "rank %d (node %d, %s); install the same course build, CUDA and NCCL on "
                 "every node (table printed by rank 0)", versions_column(column),
                 versions_field(&all[0], column), all[0].node, all[0].host,
                 versions_field(&all[who], column), who, all[who].node, all[who].host);
    }
    for (int r = 1; r < world && column < 0; r++) {
        if (!strcmp(all[r].driver, all[0].driver)) continue;
        fprintf(stderr, "note: CUDA drivers differ (rank 0: %s, rank %d: %s); that is allowed "
                "while each supports the CUDA runtime\n", all[0].driver, r, all[r].driver);
        break;
    }
    free(all);
}

// A refusal: every rank says the verdict on one line, then waits (10 s at
// most) until all have said it, because a launcher stops a node's other
// workers as soon as one of them exits, which would cut their lines off.
// The rank that serves the store (if one does) leaves last.
__attribute__((noreturn))
static inline void versions_refuse(rendezvous_t *r, const char *verdict) {
    course_say("error: %s", verdict);
    store_add(r->store, "versions/refused", 1);
    double deadline = store_clock() + 10.0;
    while (store_add(r->store, "versions/refused", 0) < r->world_size && store_clock() < deadline)
        store_sleep(0.02);
    if (r->server) {
        store_close(r->store);
        store_server_drain(r->server, 5.0);
    }
    exit(1);
}

// Every rank calls this right after the rendezvous (dist_init does). Returns
// when all ranks run the same software; otherwise every rank exits with
// status 1 and one line, after rank 0 has printed the table.
static inline void versions_check(rendezvous_t *r, int node) {
    if (r->world_size < 2) return;
    versions_t mine = versions_mine(node);
    versions_publish(r->store, r->rank, &mine);
    char verdict[1024] = "";
    if (r->rank == 0) versions_judge(r->store, r->world_size, r->timeout_s, verdict, sizeof verdict);
    size_t n = store_broadcast(r->store, "versions/verdict", r->rank, verdict, strlen(verdict),
                               sizeof verdict - 1, r->timeout_s);
    verdict[n] = '\0';
    if (strcmp(verdict, "ok")) versions_refuse(r, verdict);
}

#endif
