// test_ddp_replicas.c - ddp_check_replicas (common/ddp.h): the debug check
// that every rank's replica of the parameters is bit for bit rank 0's,
// driven by tests/library/test_ddp.sh.
//
// spawn() starts --nprocs ranks; each joins the job (dist_init), holds the
// same parameters on its device and checks them at steps 1, 2 and 3. Before
// step --drift_step, the ranks listed in --drift change their replica as a
// bug would: one parameter by one unit in the last place (the smallest
// change a float can make), or by 1 (--drift_by one). Rank 0 prints
// "replicas equal at step S" after each check that passes; a check that
// fails stops the job with the check's own message, naming the ranks.
#include <math.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "log.h"
#include "spawn.h"

typedef struct {
    const char *drift, *drift_by, *device, *backend;
    int drift_step, count;
} options;

// Is `rank` in the comma-separated list `ranks`?
static bool listed(const char *ranks, int rank) {
    for (const char *p = ranks; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p) die("--drift expects ranks like 1,3, got '%s'", ranks);
        if (r == rank) return true;
        p = *end == ',' ? end + 1 : end;
    }
    return false;
}

static int worker(int rank, int world, void *arg) {
    (void)rank;
    (void)world;
    const options *o = arg;
    dist_t dist;
    dist_options how = {"env://", o->backend, o->device, 0};
    dist_init(&dist, &how);
    size_t n = (size_t)o->count;
    float *host = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) host[i] = 0.5f + (float)i / 7.0f; // the same on every rank
    float *params = device_alloc(&dist.device, sizeof(float) * n);
    device_from_host(&dist.device, params, host, sizeof(float) * n);
    for (int step = 1; step <= 3; step++) {
        if (step == o->drift_step && listed(o->drift, dist.rank)) {
            size_t i = n / 2;   // a parameter in the middle: not only the first is hashed
            host[i] = !strcmp(o->drift_by, "ulp") ? nextafterf(host[i], INFINITY) : host[i] + 1.0f;
            device_from_host(&dist.device, params, host, sizeof(float) * n);
        }
        ddp_check_replicas(dist.pg, &dist.device, params, n, step);
        log_main("replicas equal at step %d\n", step);
    }
    device_free(&dist.device, params);
    free(host);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    options o = {.drift = "", .drift_by = "ulp", .device = "cpu", .backend = "auto", .drift_step = 2,
                 .count = 1001};
    int nprocs = 3;
    flag_set set = {.program = "test_ddp_replicas", .summary = "ddp_check_replicas on a job of spawned ranks"};
    flag_int(&set, "nprocs", &nprocs, 1, 64, "ranks to spawn");
    flag_string(&set, "drift", &o.drift, "ranks whose replica drifts, e.g. 1,3 (empty: none)");
    flag_choice(&set, "drift_by", &o.drift_by, "ulp|one", "how much one parameter drifts");
    flag_int(&set, "drift_step", &o.drift_step, 1, 3, "the step before which they drift");
    flag_int(&set, "count", &o.count, 1, 10000000, "parameters per replica");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the parameters live");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl", "process-group backend");
    flags_parse(&set, argc, argv);
    return spawn(nprocs, worker, &o);
}
