// test_spawn_job.c - a small job started with spawn(), driven by tests/library/test_spawn.sh.
//
// --mode ok    every rank meets the others (env:// through spawn's store),
//              passes a barrier, adds to a counter and returns 0
// --mode fail  rank 1 returns 3 after the rendezvous; the others wait forever
//              (spawn must stop them)
// --mode kill  rank 2 kills itself with SIGKILL; the others wait forever
// --mode hang  every rank waits forever (the test sends SIGINT to the parent)
// --mode stubborn  as fail, but every rank ignores SIGTERM (spawn must SIGKILL)
// The parent prints "spawn returned N" and exits with N.
#include <signal.h>

#include "flags.h"
#include "spawn.h"
#include "rendezvous.h"

typedef struct {
    const char *mode;
} job_args;

static void wait_forever(void) {
    for (;;) pause();
}

static int worker(int rank, int world, void *arg) {
    const job_args *args = arg;
    bool stubborn = !strcmp(args->mode, "stubborn");
    if (stubborn) signal(SIGTERM, SIG_IGN);
    rendezvous_t r = rendezvous("env://", -1, -1, 0);
    if (r.rank != rank || r.world_size != world) {
        fprintf(stderr, "rank %d: rendezvous says rank %d of %d\n", rank, r.rank, r.world_size);
        return 2;
    }
    store_barrier(r.store, "started", r.rank, r.world_size, 0);
    store_add(r.store, "sum", rank + 1);
    store_barrier(r.store, "added", r.rank, r.world_size, 0);
    int64_t sum = store_add(r.store, "sum", 0);
    printf("rank %d of %d: sum %lld\n", rank, world, (long long)sum);
    fflush(stdout);
    if ((!strcmp(args->mode, "fail") || stubborn) && rank == 1) {
        rendezvous_close(&r);
        return 3;
    }
    if (!strcmp(args->mode, "kill") && rank == 2) raise(SIGKILL);
    if (strcmp(args->mode, "ok")) wait_forever();
    rendezvous_close(&r);
    return sum == (int64_t)world * (world + 1) / 2 ? 0 : 1;
}

int main(int argc, char **argv) {
    job_args args = {"ok"};
    int nprocs = 3;
    flag_set set = {.program = "test_spawn_job", .summary = "a small job started with spawn()"};
    flag_int(&set, "nprocs", &nprocs, 1, 64, "ranks to spawn")->short_name = "n";
    flag_choice(&set, "mode", &args.mode, "ok|fail|kill|hang|stubborn", "what the ranks do");
    flags_parse(&set, argc, argv);
    int rc = spawn(nprocs, worker, &args);
    printf("spawn returned %d\n", rc);
    return rc;
}
