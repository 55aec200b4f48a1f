// test_store_rdzv.c - one rank of a small job that meets through rendezvous().
//
// tests/library/test_store.sh starts several of these with the same init method and
// checks that every rank prints its "ok" line: each rank joins, passes a
// barrier, adds rank+1 to a shared counter, and checks the total.
// --rounds 2 repeats the whole rendezvous in the same process (teardown test).
#include "flags.h"
#include "rendezvous.h"

static int run_round(const char *init_method, int rank, int world, double timeout, int round) {
    rendezvous_t r = rendezvous(init_method, rank, world, timeout);
    store_barrier(r.store, "after-join", r.rank, r.world_size, 0);
    store_add(r.store, "sum", r.rank + 1);
    store_barrier(r.store, "after-add", r.rank, r.world_size, 0);
    int64_t sum = store_add(r.store, "sum", 0);
    int64_t want = (int64_t)r.world_size * (r.world_size + 1) / 2;
    printf("rank %d of %d round %d: sum %lld %s\n", r.rank, r.world_size, round,
           (long long)sum, sum == want ? "ok" : "WRONG");
    fflush(stdout);
    rendezvous_close(&r);
    return sum == want ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *init_method = "env://";
    int rank = -1, world = -1, rounds = 1;
    double timeout = 0;
    flag_set set = {.program = "test_store_rdzv", .summary = "one rank of a rendezvous test job"};
    flag_string(&set, "init_method", &init_method, "env://, tcp://HOST:PORT or file:///path");
    flag_int(&set, "rank", &rank, -1, 1 << 20, "this rank (-1: RANK)");
    flag_int(&set, "world_size", &world, -1, 1 << 20, "ranks in the job (-1: WORLD_SIZE)");
    flag_double(&set, "timeout", &timeout, 0, 1e6, "seconds (0: COURSE_TIMEOUT or 300)");
    flag_int(&set, "rounds", &rounds, 1, 100, "rendezvous this many times in a row");
    flags_parse(&set, argc, argv);
    int failures = 0;
    for (int round = 0; round < rounds; round++)
        failures += run_round(init_method, rank, world, timeout, round);
    return failures ? 1 : 0;
}
