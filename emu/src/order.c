// order.c - which orders the emulated GPU may choose, and what happens before what.
//
// A GPU promises little about order. Work on one stream runs in order;
// work on two streams runs in any order unless an event (or the legacy
// stream's rule) orders it; the blocks of a grid run in any order; the
// threads of a block, between barriers, in any order. A program that is
// correct in one legal order and wrong in another has a bug that a real
// GPU shows once in a while, on someone else's machine.
//
// So the emulator lets a run pick the order (EMU_SCHEDULE, EMU_ORDER) and
// checks, independently of the order it picked, whether two operations
// that touch the same memory are ordered at all (race.c). For that it
// keeps a vector clock per queued operation: entry k is the last
// operation of stream k that happens before it - through its own stream,
// an event it waits for, the legacy stream's rule, or a synchronize after
// which the host queued it. Operation (k, n) happens before operation B
// exactly when B's clock has entry k >= n.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"

// ================================================================ vector clocks

static void grow(emu_clock *c, int n) {
    if (c->n >= n) return;
    uint64_t *t = realloc(c->t, sizeof *t * (size_t)n);
    if (!t) emu_fatal("out of host memory for a vector clock");
    memset(t + c->n, 0, sizeof *t * (size_t)(n - c->n));
    c->t = t, c->n = n;
}

void emu_clock_join(emu_clock *dst, const emu_clock *src) {
    grow(dst, src->n);
    for (int k = 0; k < src->n; k++)
        if (src->t[k] > dst->t[k]) dst->t[k] = src->t[k];
}

void emu_clock_copy(emu_clock *dst, const emu_clock *src) {
    dst->n = 0;
    emu_clock_join(dst, src);
}

void emu_clock_set(emu_clock *c, int stream, uint64_t seq) {
    grow(c, stream + 1);
    c->t[stream] = seq;
}

bool emu_clock_covers(const emu_clock *c, int stream, uint64_t seq) {
    return stream < c->n && c->t[stream] >= seq;
}

void emu_clock_free(emu_clock *c) {
    free(c->t);
    c->t = NULL, c->n = 0;
}

// What the host knows to have completed: every operation it waited for
// (and what those waited for). Whatever it queues next comes after them.
static emu_clock host_clock;

emu_clock *emu_host_clock(void) { return &host_clock; }

// ================================================================ the schedule and the order

// EMU_SCHEDULE: when queued work runs.
//   lazy    as late as CUDA allows: only when something waits for it (the default)
//   eager   at once, as if the GPU were infinitely fast
//   random  at random moments, a random stream at a time, within what the
//           dependencies allow; random:SEED repeats a run
// EMU_ORDER: in which order the blocks of a grid, and the threads of a
// block between barriers, run: forward (the default), reverse, shuffled[:SEED].
static emu_schedule_kind schedule = EMU_SCHEDULE_LAZY;
static emu_order_kind order = EMU_ORDER_FORWARD;
static uint64_t schedule_seed, order_seed;
static bool settings_read;

// NAME or NAME:SEED; the seed, when given, goes to *seed.
static bool parse_choice(const char *text, const char *name, bool seeded, uint64_t *seed, bool *have_seed) {
    size_t n = strlen(name);
    if (strncmp(text, name, n) != 0) return false;
    if (text[n] == '\0') return true;
    if (!seeded || text[n] != ':' || !text[n + 1]) return false;
    char *end;
    unsigned long long v = strtoull(text + n + 1, &end, 10);
    if (*end) return false;
    *seed = v, *have_seed = true;
    return true;
}

static uint64_t fresh_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 20) % 1000000;
}

static void read_settings(void) {
    if (settings_read) return;
    settings_read = true;
    const char *s = getenv("EMU_SCHEDULE");
    bool have = false;
    if (s && *s) {
        if (parse_choice(s, "lazy", false, NULL, NULL)) schedule = EMU_SCHEDULE_LAZY;
        else if (parse_choice(s, "eager", false, NULL, NULL)) schedule = EMU_SCHEDULE_EAGER;
        else if (parse_choice(s, "random", true, &schedule_seed, &have)) schedule = EMU_SCHEDULE_RANDOM;
        else emu_fatal("EMU_SCHEDULE=%s: expected lazy, eager, random or random:SEED", s);
        if (schedule == EMU_SCHEDULE_RANDOM && !have) {
            schedule_seed = fresh_seed();
            emu_warn("EMU_SCHEDULE=random:%llu (set it so to repeat this run)", (unsigned long long)schedule_seed);
        }
    }
    const char *o = getenv("EMU_ORDER");
    have = false;
    if (o && *o) {
        if (parse_choice(o, "forward", false, NULL, NULL)) order = EMU_ORDER_FORWARD;
        else if (parse_choice(o, "reverse", false, NULL, NULL)) order = EMU_ORDER_REVERSE;
        else if (parse_choice(o, "shuffled", true, &order_seed, &have)) order = EMU_ORDER_SHUFFLED;
        else emu_fatal("EMU_ORDER=%s: expected forward, reverse, shuffled or shuffled:SEED", o);
        if (order == EMU_ORDER_SHUFFLED && !have) {
            order_seed = fresh_seed();
            emu_warn("EMU_ORDER=shuffled:%llu (set it so to repeat this run)", (unsigned long long)order_seed);
        }
    }
}

emu_schedule_kind emu_schedule(void) {
    read_settings();
    return schedule;
}

emu_order_kind emu_order(void) {
    read_settings();
    return order;
}

// splitmix64: small, and the same numbers on every machine for one seed.
static uint64_t next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t emu_schedule_random(void) {
    read_settings();
    return next(&schedule_seed);
}

uint64_t emu_order_random(void) {
    read_settings();
    return next(&order_seed);
}
