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
// DETAIL costs a few store round trips per collective: a tool for finding a
// bug, not for training runs.
#ifndef COURSE_PG_DEBUG_H
#define COURSE_PG_DEBUG_H

#include <stdbool.h>
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
    pg_debug_t d = {pg_debug_level_from_env(), store, rank, world_size, "", 0, timeout_s};
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
    }
}

// Called first thing by every collective of pg.h. `what` says everything the
// ranks must agree on, e.g. "all_reduce(1024 x f32, sum)".
static inline void pg_debug_collective(pg_debug_t *d, const char *what) {
    if (d->level == PG_DEBUG_OFF) return;
    course_say("COURSE_DEBUG: collective #%lu: %s", d->calls, what);
    if (d->level == PG_DEBUG_DETAIL) pg_debug_compare(d, what);
    d->calls++;
}

#endif
