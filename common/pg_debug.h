// pg_debug.h - COURSE_DEBUG: see what every rank calls, and catch the
// mismatch that would otherwise hang or corrupt in silence.
//
// A collective is a promise that every rank calls the same operation, in the
// same order, with the same count, type, reduction and root. Break it (one
// rank all-reduces 1000 floats, another 999; one rank skips a barrier) and
// the backends cannot tell: the bytes simply do not line up, and the job
// hangs until the timeout or, worse, finishes with wrong numbers.
// PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks the promise before each
// collective; COURSE_DEBUG does the same here:
//   COURSE_DEBUG=INFO    every rank prints each collective it calls
//   COURSE_DEBUG=DETAIL  also, before each collective, every rank publishes
//                        what it is about to call in the rendezvous store and
//                        reads what the others published; if they differ,
//                        every rank stops with the same line naming the ranks
//                        and their calls.
// all_to_all_v is the one collective whose counts differ between ranks:
// there the ranks compare the call and the type, and then the counts pair by
// pair - rank a's send_counts[b] must be rank b's recv_counts[a] - and a
// pair that disagrees is named ("rank 0 sends 5 to rank 1, which expects
// 4") where the backends would hang or fail with less to go on.
// DETAIL costs a few store round trips per collective: a tool for finding a
// bug, not for training runs.
#ifndef COURSE_PG_DEBUG_H
#define COURSE_PG_DEBUG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "store_client.h"

typedef enum { PG_DEBUG_OFF, PG_DEBUG_INFO, PG_DEBUG_DETAIL } pg_debug_level_t;

typedef struct {
    pg_debug_level_t level;
    store_t *store;        // the rendezvous store (DETAIL only)
    int rank, world_size;
    char group[64];        // which process group: its store keys never meet another's
    unsigned long calls;   // collectives called so far by this rank
    double timeout_s;
    bool counts_before;    // the previous call published its counts (all_to_all_v)
} pg_debug_t;

static inline pg_debug_level_t pg_debug_level_from_env(void) {
    const char *text = getenv("COURSE_DEBUG");
    if (!text || !text[0] || !strcmp(text, "OFF")) return PG_DEBUG_OFF;
    if (!strcmp(text, "INFO")) return PG_DEBUG_INFO;
    if (!strcmp(text, "DETAIL")) return PG_DEBUG_DETAIL;
    die("COURSE_DEBUG must be OFF, INFO or DETAIL, got '%s'", text);
    return PG_DEBUG_OFF;
}

static inline pg_debug_t pg_debug_start(store_t *store, int rank, int world_size, const char *group,
                                      double timeout_s) {
    pg_debug_t d = {pg_debug_level_from_env(), store, rank, world_size, "", 0, timeout_s, false};
    snprintf(d.group, sizeof d.group, "%s", group);
    if (d.level == PG_DEBUG_DETAIL && (!store || world_size < 2)) d.level = PG_DEBUG_INFO;
    return d;
}

static inline void pg_debug_key(const pg_debug_t *d, unsigned long call, int rank, char *key,
                                size_t size) {
    snprintf(key, size, "%s/debug/%lu/%d", d->group, call, rank);
}

// Every rank publishes call n's description, then reads everyone's. A rank
// that reaches call n has finished checking call n-1, and so has every rank
// whose call-n key it reads: so n-1's keys can go.
static inline void pg_debug_compare(pg_debug_t *d, const char *mine) {
    char key[96], theirs[160];
    pg_debug_key(d, d->calls, d->rank, key, sizeof key);
    store_set(d->store, key, mine, strlen(mine) + 1);
    for (int r = 0; r < d->world_size; r++) {
        if (r == d->rank) continue;
        pg_debug_key(d, d->calls, r, key, sizeof key);
        if (!store_wait(d->store, key, d->timeout_s))
            die("COURSE_DEBUG=DETAIL: rank %d did not reach collective #%lu within %.0f s; this "
                "rank called %s there (rank %d skipped a collective, finished early, or is stuck)",
                r, d->calls, d->timeout_s, mine, r);
        store_get(d->store, key, theirs, sizeof theirs, d->timeout_s);
        theirs[sizeof theirs - 1] = '\0';
        if (strcmp(theirs, mine) == 0) continue;
        // Name the lower rank first, so that every rank prints the same line.
        bool first = d->rank < r;
        die("COURSE_DEBUG=DETAIL: collective #%lu differs across ranks: rank %d called %s, "
            "rank %d called %s", d->calls, first ? d->rank : r, first ? mine : theirs,
            first ? r : d->rank, first ? theirs : mine);
    }
    if (d->calls > 0) {
        pg_debug_key(d, d->calls - 1, d->rank, key, sizeof key);
        store_delete(d->store, key);
        if (d->counts_before) {
            strncat(key, "/counts", sizeof key - strlen(key) - 1);
            store_delete(d->store, key);
        }
    }
    d->counts_before = false;
}

// Called first thing by every collective of pg.h. `what` says everything the
// ranks must agree on, e.g. "all_reduce(1024 x f32, sum)".
static inline void pg_debug_collective(pg_debug_t *d, const char *what) {
    if (d->level == PG_DEBUG_OFF) return;
    course_say("COURSE_DEBUG: collective #%lu: %s", d->calls, what);
    if (d->level == PG_DEBUG_DETAIL) pg_debug_compare(d, what);
    d->calls++;
}

// "[3 0 5]", cut after 16 counts.
static inline void pg_debug_list(char *out, size_t size, const size_t *counts, int n) {
    size_t used = (size_t)snprintf(out, size, "[");
    for (int p = 0; p < n && used < size; p++) {
        if (p == 16) {
            used += (size_t)snprintf(out + used, size - used, " ...");
            break;
        }
        used += (size_t)snprintf(out + used, size - used, p ? " %zu" : "%zu", counts[p]);
    }
    if (used < size) snprintf(out + used, size - used, "]");
}

// all_to_all_v, called first thing by pg_all_to_all_v: the ranks compare
// "all_to_all_v(<type>)" as for any collective, then every rank reads every
// rank's counts (published under a key of their own before the call's key,
// so they are there once the call's key is) and checks every pair in the
// same order, so that every rank that finds a disagreement names the same one.
static inline void pg_debug_collective_counts(pg_debug_t *d, const char *type, const size_t *send_counts,
                                              const size_t *recv_counts) {
    if (d->level == PG_DEBUG_OFF) return;
    int n = d->world_size;
    char what[64], sends[200], receives[200], key[112];
    snprintf(what, sizeof what, "all_to_all_v(%s)", type);
    pg_debug_list(sends, sizeof sends, send_counts, n);
    pg_debug_list(receives, sizeof receives, recv_counts, n);
    course_say("COURSE_DEBUG: collective #%lu: %s, sends %s, receives %s", d->calls, what, sends, receives);
    if (d->level != PG_DEBUG_DETAIL) {
        d->calls++;
        return;
    }
    // Mine: the send counts, then the receive counts, as 64-bit numbers.
    size_t bytes = 2 * (size_t)n * sizeof(uint64_t);
    uint64_t *all = xcalloc((size_t)n, bytes);
    for (int p = 0; p < n; p++) {
        all[(size_t)d->rank * 2 * (size_t)n + (size_t)p] = send_counts[p];
        all[(size_t)d->rank * 2 * (size_t)n + (size_t)n + (size_t)p] = recv_counts[p];
    }
    pg_debug_key(d, d->calls, d->rank, key, sizeof key - 8);
    strcat(key, "/counts");
    store_set(d->store, key, all + (size_t)d->rank * 2 * (size_t)n, bytes);
    pg_debug_compare(d, what);
    for (int r = 0; r < n; r++) {
        if (r == d->rank) continue;
        pg_debug_key(d, d->calls, r, key, sizeof key - 8);
        strcat(key, "/counts");
        if (store_get(d->store, key, all + (size_t)r * 2 * (size_t)n, bytes, d->timeout_s) != bytes)
            die("COURSE_DEBUG=DETAIL: rank %d published a malformed list of counts for collective #%lu "
                "(%s)", r, d->calls, what);
    }
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            uint64_t sends_ab = all[(size_t)a * 2 * (size_t)n + (size_t)b];
            uint64_t expects = all[(size_t)b * 2 * (size_t)n + (size_t)n + (size_t)a];
            if (sends_ab == expects) continue;
            free(all);
            die("COURSE_DEBUG=DETAIL: collective #%lu, %s: rank %d sends %llu to rank %d, which expects "
                "%llu (rank %d's send_counts[%d] must equal rank %d's recv_counts[%d])", d->calls, what, a,
                (unsigned long long)sends_ab, b, (unsigned long long)expects, a, b, b, a);
        }
    free(all);
    d->counts_before = true;
    d->calls++;
}

#endif
