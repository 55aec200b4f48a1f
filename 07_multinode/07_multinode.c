// 07_multinode.c - Chapter 7: one job, many nodes.
//
// The training is chapter 06's (data parallel, snapshots, restarts); what is
// new is where the ranks run. A launcher on EACH node starts that node's
// workers; the launchers meet at node 0 (MASTER_ADDR:MASTER_PORT) and hand
// out global ranks node by node, so each worker knows three numbers:
//   RANK        its place in the whole job (0 .. WORLD_SIZE-1): data shard, who saves
//   LOCAL_RANK  its place on its node: which GPU of this node it uses
//   GROUP_RANK  which node it is on
// Nodes may run different numbers of workers (8 GPUs here, 4 there).
//
//   node 0: tools/ddprun --nnodes=2 --node_rank=0 --nproc_per_node=2
//               --master_addr=10.0.0.1 --master_port=29500 07_multinode/07_multinode
//   node 1: tools/ddprun --nnodes=2 --node_rank=1 --nproc_per_node=3
//               --master_addr=10.0.0.1 --master_port=29500 07_multinode/07_multinode
//   (each is one command line)
//   one machine, two "nodes": 07_multinode/rehearsal.sh
//
// Every rank prints where it is ("[node 1 | rank 3 | local 1] ...") and the
// address it offers to the others, then rank 0 reports. Before any of that
// dist_init has checked that every rank runs the same course, CUDA and NCCL
// (common/versions.h): different versions on different nodes are a classic
// cause of multi-node hangs.
#include <signal.h>
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "netif.h"
#include "sampler.h"
#include "snapshot.h"
#include "timer.h"

typedef struct {
    int total_epochs, save_every, keep, batch_size, features, samples, seed;
    double lr, momentum, timeout;
    const char *snapshot_path, *backend, *device;
    int fail_rank, fail_step, fail_attempts;
    const char *fail_mode;
} options;

static options parse_options(int argc, char **argv) {
    static char default_path[1200];
    char dir[1024];
    runs_dir(dir, sizeof dir, "07_multinode");
    snprintf(default_path, sizeof default_path, "%s/snapshot.safetensors", dir);
    options o = {10, 1, 2, 32, 1, 10000, 42, 0.01, 0.9, 0, default_path, "auto", "auto",
                 -1, -1, 1, "exit"};
    flag_t flags[] = {
        {"total_epochs", NULL, FLAG_INT, &o.total_epochs, "epochs of the whole run, across restarts", 1, 100000, NULL, NULL},
        {"save_every", NULL, FLAG_INT, &o.save_every, "snapshot every N epochs (rank 0, on node 0's disk)", 1, 100000, NULL, NULL},
        {"snapshot_path", NULL, FLAG_STRING, &o.snapshot_path, "snapshot series: DIR/STEM.safetensors", 1, 0, NULL, NULL},
        {"keep", NULL, FLAG_INT, &o.keep, "keep the newest K snapshots", 1, 1000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.lr, "learning rate", 0, 100, NULL, NULL},
        {"momentum", NULL, FLAG_DOUBLE, &o.momentum, "SGD momentum", 0, 0.999, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
        {"fail_rank", NULL, FLAG_INT, &o.fail_rank, "fault injection: this rank dies... (-1: none)", -1, 1000000, NULL, "COURSE_FAIL_RANK"},
        {"fail_step", NULL, FLAG_INT, &o.fail_step, "...at this global step", -1, 1000000000, NULL, "COURSE_FAIL_STEP"},
        {"fail_mode", NULL, FLAG_STRING, &o.fail_mode, "...by exit(3) or SIGKILL", 1, 0, "exit|kill", "COURSE_FAIL_MODE"},
        {"fail_attempts", NULL, FLAG_INT, &o.fail_attempts, "...in the first N attempts (restarts) only", 0, 1000000, NULL, "COURSE_FAIL_ATTEMPTS"},
    };
    flag_set set = {"07_multinode", "data-parallel training across several nodes, with snapshots",
                    NULL, flags, (int)(sizeof flags / sizeof flags[0])};
    flags_parse(&set, argc, argv);
    return o;
}

// ---------------------------------------------------------------- where am I?
// Every rank says where it runs and which address it offers the others: the
// first thing to look at when a multi-node job hangs.
static void print_start_line(const dist_t *d) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    netif_choice me = netif_advertise(d->rdzv.store->host);
    printf("[node %d | rank %d | local %d] host %s, %s, advertises %s (%s)\n", d->env.group_rank,
           d->rank, d->env.local_rank, host, d->device.name, me.ip, me.how);
    fflush(stdout);
}

// Rank 0 learns every rank's node (an all-gather, written as a sum of
// vectors that are zero except at one's own rank) and prints the layout:
// "2 nodes: node 0 has ranks 0-1, node 1 has ranks 2-4".
static void report_layout(dist_t *d) {
    int world = d->world_size, nodes = 0;
    double *node_of = xcalloc((size_t)world, sizeof *node_of);
    node_of[d->rank] = d->env.group_rank;
    dist_all_reduce_host(d, node_of, world, OP_SUM);
    for (int r = 0; r < world; r++)
        if ((int)node_of[r] >= nodes) nodes = (int)node_of[r] + 1;
    char text[1024];
    size_t at = (size_t)snprintf(text, sizeof text, "%d node%s:", nodes, nodes == 1 ? "" : "s");
    for (int n = 0; n < nodes && at < sizeof text; n++) {
        int count = 0;
        for (int r = 0; r < world; r++) count += (int)node_of[r] == n;
        at += (size_t)snprintf(text + at, sizeof text - at, "%s node %d has rank%s", n ? "," : "",
                               n, count == 1 ? "" : "s");
        for (int r = 0; r < world && at < sizeof text; r++) {
            if ((int)node_of[r] != n) continue;
            int last = r;   // ranks r..last are all on node n
            while (last + 1 < world && (int)node_of[last + 1] == n) last++;
            at += (size_t)(last > r ? snprintf(text + at, sizeof text - at, " %d-%d", r, last)
                                    : snprintf(text + at, sizeof text - at, " %d", r));
            r = last;
        }
    }
    log_main("07_multinode: %d rank%s on %s; started by %s; backend %s; restart %d of at most %d\n",
             world, world == 1 ? "" : "s", text, d->env.launched ? d->env.source : "hand (no launcher)",
             pg_describe(d->pg), d->env.restart_count, d->env.max_restarts);
    free(node_of);
}

// ---------------------------------------------------------------- snapshots
// As in chapter 06, but only at epoch ends, which keeps the state small:
// parameters, momentum, the epoch and step reached, and the configuration
// a resume must match. Rank 0 writes and reads them, on node 0's disk; the
// other nodes get the state by broadcast, so no shared filesystem is needed.
static void config_meta(const options *o, snapshot_meta *m, int *n) {
    m[(*n)++] = snapshot_meta_of("features", "%d", o->features);
    m[(*n)++] = snapshot_meta_of("samples", "%d", o->samples);
    m[(*n)++] = snapshot_meta_of("batch_size", "%d", o->batch_size);
    m[(*n)++] = snapshot_meta_of("seed", "%d", o->seed);
    m[(*n)++] = snapshot_meta_of("lr", "%.9g", o->lr);
    m[(*n)++] = snapshot_meta_of("momentum", "%.9g", o->momentum);
}

static void save_snapshot(const options *o, linreg_model *model, int64_t epoch, int64_t step) {
    size_t count = (size_t)o->features + 1;
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    linreg_get_params(model, params);
    device_to_host(model->device, velocity, linreg_velocity(model), count * sizeof(float));
    int64_t shape[1] = {(int64_t)count};
    snapshot_tensor tensors[2] = {snapshot_tensor_of("params", "F32", params, 1, shape),
                                  snapshot_tensor_of("momentum_buffer", "F32", velocity, 1, shape)};
    snapshot_meta meta[12];
    int n = 0;
    config_meta(o, meta, &n);
    meta[n++] = snapshot_meta_of("epoch", "%lld", (long long)epoch);
    meta[n++] = snapshot_meta_of("global_step", "%lld", (long long)step);
    char err[1400];
    if (!snapshot_save_step(o->snapshot_path, step, tensors, 2, meta, n, o->keep, err, sizeof err))
        die("could not save the snapshot: %s", err);
    log_main("snapshot saved: Epoch %lld (step %lld) in %s\n", (long long)epoch, (long long)step,
             o->snapshot_path);
    free(params);
    free(velocity);
}

// Rank 0: loads the newest valid snapshot into the model; false when there is none.
static bool load_snapshot(const options *o, linreg_model *model, int64_t *epoch, int64_t *step) {
    char report[4096], dir[1024], err[1400];
    const char *slash = strrchr(o->snapshot_path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - o->snapshot_path) : 1, slash ? o->snapshot_path : ".");
    make_dirs(dir);
    snapshot_t snap;
    int found = snapshot_load_latest(o->snapshot_path, &snap, report, sizeof report);
    if (report[0]) log_main("%s\n", report);
    if (found == 0) return false;
    if (found < 0) die("no valid snapshot for %s; remove the damaged files to start afresh", o->snapshot_path);
    snapshot_meta want[8];
    int n = 0;
    config_meta(o, want, &n);
    for (int i = 0; i < n; i++)
        if (!snapshot_expect_meta(&snap, want[i].key, want[i].value, err, sizeof err))
            die("cannot resume from %s: %s", snap.path, err);
    size_t count = (size_t)o->features + 1;
    int64_t shape[1] = {(int64_t)count};
    float *params = xmalloc(count * sizeof(float)), *velocity = xmalloc(count * sizeof(float));
    if (!snapshot_copy(&snap, "params", "F32", 1, shape, params, err, sizeof err) ||
        !snapshot_copy(&snap, "momentum_buffer", "F32", 1, shape, velocity, err, sizeof err) ||
        !snapshot_meta_i64(&snap, "epoch", epoch, err, sizeof err) ||
        !snapshot_meta_i64(&snap, "global_step", step, err, sizeof err))
        die("cannot resume from %s: %s", snap.path, err);
    if (*epoch < 0 || *epoch > o->total_epochs || *step < 0)
        die("snapshot %s says epoch %lld, step %lld: outside this run", snap.path,
            (long long)*epoch, (long long)*step);
    linreg_set_params(model, params);
    device_from_host(model->device, linreg_velocity(model), velocity, count * sizeof(float));
    free(params);
    free(velocity);
    snapshot_release(&snap);
    return true;
}

// Fault injection, as in chapter 06: rank R dies just before the all-reduce
// of global step S, in the first N attempts only.
static void maybe_fail(const options *o, const dist_t *d, int64_t global_step) {
    if (d->rank != o->fail_rank || global_step != o->fail_step) return;
    if (d->env.restart_count >= o->fail_attempts) return;
    bool kill = !strcmp(o->fail_mode, "kill");
    fprintf(stderr, "[rank %d] fault injection on node %d: dying at step %lld by %s (attempt %d)\n",
            d->rank, d->env.group_rank, (long long)global_step, kill ? "SIGKILL" : "exit(3)",
            d->env.restart_count);
    fflush(NULL);
    if (kill) raise(SIGKILL);
    exit(3);
}

// ---------------------------------------------------------------- main
int main(int argc, char **argv) {
    options opt = parse_options(argc, argv);

    // --- Set-up: the same call as on one node. The launchers did the
    // multi-node work; dist_init meets the others and checks versions.
    dist_t dist;
    dist_options how = {"env://", opt.backend, opt.device, opt.timeout};
    dist_init(&dist, &how);
    print_start_line(&dist);
    report_layout(&dist);

    // --- Data and model: every rank builds the same dataset and takes the
    // share its GLOBAL rank gives it; the node does not matter.
    linreg_data data = linreg_make_data(opt.features, opt.samples, (uint64_t)opt.seed);
    sampler_t sampler = sampler_create(opt.samples, dist.world_size, dist.rank, true,
                                       (uint64_t)opt.seed, false);
    linreg_model model;
    linreg_init(&model, &dist.device, &data, opt.batch_size);
    size_t nparams = (size_t)opt.features + 1;

    // --- Resume: rank 0 reads node 0's snapshot; a broadcast carries the
    // state to every rank of every node.
    int64_t where[3] = {0, 0, 0};   // resumed?, epoch, global step
    if (dist.rank == 0) where[0] = load_snapshot(&opt, &model, &where[1], &where[2]);
    dist_broadcast_host(&dist, where, 3, DTYPE_I64, 0);
    ddp_broadcast_parameters(dist.pg, model.params, nparams);
    ddp_broadcast_parameters(dist.pg, linreg_velocity(&model), nparams);
    if (where[0])
        log_main("Resuming training from snapshot at Epoch %lld (step %lld)\n", (long long)where[1],
                 (long long)where[2]);

    // --- Training loop: exactly chapter 06's, whatever the number of nodes.
    int64_t step = where[2];
    double start = now_seconds();
    for (int64_t epoch = where[1]; epoch < opt.total_epochs; epoch++) {
        sampler_set_epoch(&sampler, (int)epoch);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += opt.batch_size) {
            int size = (int)(sampler.num_samples - first < opt.batch_size
                                 ? sampler.num_samples - first : opt.batch_size);
            linreg_forward_backward(&model, first, size);
            maybe_fail(&opt, &dist, step + 1);
            ddp_average_gradients(dist.pg, model.grads, nparams);
            linreg_momentum_step(&model, (float)opt.lr, (float)opt.momentum);
            step++;
            batches++;
        }
        double loss[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss, 2, OP_SUM);
        log_main("epoch %lld | loss %.6f | step %lld | %.3f s\n", (long long)epoch,
                 loss[1] > 0 ? loss[0] / loss[1] : 0.0, (long long)step, now_seconds() - start);
        if ((epoch + 1) % opt.save_every == 0 && dist.rank == 0)
            save_snapshot(&opt, &model, epoch + 1, step);
    }

    // --- Teardown: the result, in full precision so runs can be compared.
    pg_barrier(dist.pg);
    float *params = xmalloc(sizeof(float) * nparams);
    linreg_get_params(&model, params);
    log_main("final weight %.9g  bias %.9g  (true 2.0, 3.0)  parameters checksum %016llx\n",
             params[0], params[opt.features],
             (unsigned long long)checksum_bytes(params, sizeof(float) * nparams));
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    dist_finish(&dist);
    return 0;
}
