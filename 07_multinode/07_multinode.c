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
#include <stdio.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "linreg.h"
#include "log.h"
#include "metrics.h"
#include "netif.h"
#include "sampler.h"
#include "linreg_snapshot.h"
#include "timer.h"

typedef struct {
    int total_epochs, save_every, keep;
    linreg_run run;      // what a snapshot must match (common/linreg_snapshot.h)
    double timeout;
    const char *snapshot_path, *backend, *device;
    fault_plan fault;
} options;

static options parse_options(int argc, char **argv) {
    static char default_path[1200];
    char dir[1024];
    runs_dir(dir, sizeof dir, "07_multinode");
    snprintf(default_path, sizeof default_path, "%s/snapshot.safetensors", dir);
    options o = {10, 1, 2, {1, 10000, 32, 42, 0.01, 0.9}, 0, default_path, "auto", "auto", fault_none()};
    flag_t flags[24] = {
        {"total_epochs", NULL, FLAG_INT, &o.total_epochs, "epochs of the whole run, across restarts", 1, 100000, NULL, NULL},
        {"save_every", NULL, FLAG_INT, &o.save_every, "snapshot every N epochs (rank 0, on node 0's disk)", 1, 100000, NULL, NULL},
        {"snapshot_path", NULL, FLAG_STRING, &o.snapshot_path, "snapshot series: DIR/STEM.safetensors", 1, 0, NULL, NULL},
        {"keep", NULL, FLAG_INT, &o.keep, "keep the newest K snapshots", 1, 1000, NULL, NULL},
        {"batch_size", NULL, FLAG_INT, &o.run.batch_size, "samples per step PER RANK", 1, 1000000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &o.run.lr, "learning rate", 0, 100, NULL, NULL},
        {"momentum", NULL, FLAG_DOUBLE, &o.run.momentum, "SGD momentum", 0, 0.999, NULL, NULL},
        {"features", NULL, FLAG_INT, &o.run.features, "input features D", 1, 65536, NULL, NULL},
        {"samples", NULL, FLAG_INT, &o.run.samples, "training samples", 1, 100000000, NULL, NULL},
        {"seed", NULL, FLAG_INT, &o.run.seed, "seed for data and shuffling", 0, 2147483647, NULL, NULL},
        {"backend", NULL, FLAG_STRING, &o.backend, "communication backend", 1, 0, "auto|cpu|nccl|mpi", "COURSE_BACKEND"},
        {"device", NULL, FLAG_STRING, &o.device, "where to compute", 1, 0, "auto|cpu|cuda", "COURSE_DEVICE"},
        {"timeout", NULL, FLAG_DOUBLE, &o.timeout, "seconds any rank waits for another (0: COURSE_TIMEOUT or 300)", 0, 86400, NULL, NULL},
    };
    int count = fault_add_flags(&o.fault, flags, 13);
    flag_set set = {"07_multinode", "data-parallel training across several nodes, with snapshots",
                    NULL, flags, count};
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
    const linreg_run *run = &opt.run;
    linreg_data data = linreg_make_data(run->features, run->samples, (uint64_t)run->seed);
    sampler_t sampler = sampler_create(run->samples, dist.world_size, dist.rank, true,
                                       (uint64_t)run->seed, false);
    linreg_model model;
    linreg_init(&model, &dist.device, &data, run->batch_size);
    size_t nparams = (size_t)run->features + 1;

    // --- Resume: rank 0 reads node 0's snapshot; a broadcast carries the
    // state to every rank of every node.
    // Snapshots are taken at epoch ends only here (chapter 06 shows mid-epoch ones).
    linreg_progress where;
    linreg_resume(&dist, opt.snapshot_path, run, opt.total_epochs, &model, &where);

    // --- Training loop: exactly chapter 06's, whatever the number of nodes.
    int64_t step = where.global_step;
    double start = now_seconds();
    for (int64_t epoch = where.epoch; epoch < opt.total_epochs; epoch++) {
        sampler_set_epoch(&sampler, (int)epoch);
        linreg_set_order(&model, sampler.indices, sampler.num_samples);
        double batches = 0;
        for (int64_t first = 0; first < sampler.num_samples; first += run->batch_size) {
            int size = (int)(sampler.num_samples - first < run->batch_size
                                 ? sampler.num_samples - first : run->batch_size);
            linreg_forward_backward(&model, first, size);
            fault_maybe_die(&opt.fault, &dist, step + 1);
            ddp_average_gradients(dist.pg, model.grads, nparams);
            linreg_momentum_step(&model, (float)run->lr, (float)run->momentum);
            step++;
            batches++;
        }
        double loss[2] = {linreg_take_loss_sum(&model), batches};
        dist_all_reduce_host(&dist, loss, 2, OP_SUM);
        log_main("epoch %lld | loss %.6f | step %lld | %.3f s\n", (long long)epoch,
                 loss[1] > 0 ? loss[0] / loss[1] : 0.0, (long long)step, now_seconds() - start);
        if ((epoch + 1) % opt.save_every == 0 && dist.rank == 0) {
            linreg_progress now = {epoch + 1, 0, step, dist.world_size};
            linreg_snapshot_save(opt.snapshot_path, opt.keep, run, &model, &now);
        }
    }

    // --- Teardown: the result, in full precision so runs can be compared.
    pg_barrier(dist.pg);
    float *params = xmalloc(sizeof(float) * nparams);
    linreg_get_params(&model, params);
    log_main("final weight %.9g  bias %.9g  (true 2.0, 3.0)  parameters checksum %016llx\n",
             params[0], params[run->features],
             (unsigned long long)checksum_bytes(params, sizeof(float) * nparams));
    free(params);
    linreg_free(&model);
    sampler_free(&sampler);
    linreg_free_data(&data);
    dist_finish(&dist);
    return 0;
}
