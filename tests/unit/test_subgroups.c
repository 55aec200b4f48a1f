// test_subgroups.c - process sub-groups (pg_split, pg_new_group) on every
// backend, driven by tests/library/test_subgroups.sh.
//
// Each rank joins the job (dist_init: spawned here, or started by mpirun),
// then checks, on groups made from the job's group:
//   ranks        pg_split(color = rank % 2, key = -rank): the group has the
//                ranks of its color, in the order of the keys (reversed);
//                color < 0 gets NULL; pg_new_group({W-1, 1}) ranks 1 and
//                W-1 in the parent's order, and NULL elsewhere
//   collectives  all nine on the color groups, with inputs made from each
//                rank's rank in the job, so that a wrong member shows;
//                2 and 70001 elements (the small and the ring algorithms)
//   p2p          isend/irecv around each group's ring, polled with pg_test
//   nested       a group split out of a group, and an all-reduce on it
//   independent  group 0 all-reduces only after group 1 has finished its
//                own all-reduce (a key in the store says so): a collective
//                that needed every rank of the job would never finish
//   mesh         with 4 or 8 ranks, a dp x tp (x pp) mesh (common/mesh.h):
//                each rank's coordinates, and an all-reduce along every
//                dimension over exactly the ranks of that line
//   split        common/groups.h's groups_split: the dp dimension (dp W, or
//                dp 4 x tp 2 on 8 ranks) as outer x inner, inner fastest
//                (hybrid sharding's replicate x shard): each group has
//                exactly the ranks it should, in order
// The ranks add their failures per check to the store; rank 0 prints one
// PASS or FAIL line per check.
#include "dist.h"
#include "flags.h"
#include "groups.h"
#include "mesh.h"
#include "pg.h"
#include "spawn.h"
#include "test.h"

enum { K_RANKS, K_COLLECTIVES, K_P2P, K_NESTED, K_INDEPENDENT, K_MESH, K_SPLIT, K_COUNT };
static const char *check_names[K_COUNT] = {"ranks of split and new_group", "nine collectives on the color groups",
                                           "isend/irecv/test/wait around each group", "a group split from a group",
                                           "disjoint groups run collectives independently",
                                           "a device mesh: coordinates and the group along each dimension",
                                           "groups_split: dp as outer x inner, the inner fastest"};

typedef struct {
    const char *backend, *device, *label;
    int world;
    const char *mesh; // "AxB" or "AxBxC": a mesh of that shape instead of the default one
    bool mismatch; // for COURSE_DEBUG=DETAIL: group 1's last rank all-reduces one element fewer
} options;

typedef struct {
    dist_t *d;
    const options *o;
    int failures[K_COUNT];
    char first[K_COUNT][240];
} ctx_t;

static void record(ctx_t *c, int k, bool ok, const char *fmt, ...) {
    if (ok || c->failures[k]++) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->first[k], sizeof c->first[k], fmt, args);
    va_end(args);
}

// ---------------------------------------------------------------- buffers on the group's device

static float *dev_floats(ctx_t *c, const float *host, size_t n) {
    float *d = device_alloc(&c->d->device, n * sizeof(float));
    if (host) device_from_host(&c->d->device, d, host, n * sizeof(float));
    return d;
}

static float *host_floats(ctx_t *c, const float *dev, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    device_to_host(&c->d->device, h, dev, n * sizeof(float));
    return h;
}

// The value job rank r contributes at index i: an integer, exact in float.
static float value(int r, size_t i) { return (float)((r * 7 + (int)(i % 13)) % 17); }

// ---------------------------------------------------------------- ranks

// members[0..n) = the job ranks of color `color`, in the order key = -rank gives.
static int color_members(int world, int color, int *members) {
    int n = 0;
    for (int r = world - 1; r >= 0; r--)
        if (r % 2 == color) members[n++] = r;
    return n;
}

static void check_ranks(ctx_t *c, pg_t *sub, const int *members, int n) {
    int me = c->d->rank, expected = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == me) expected = i;
    record(c, K_RANKS, pg_rank(sub) == expected && pg_world_size(sub) == n,
           "rank %d: split gave rank %d of %d, expected %d of %d", me, pg_rank(sub), pg_world_size(sub), expected, n);
    // No color: rank 0 stays out, the others form one group ranked as before.
    pg_t *rest = pg_split(c->d->pg, me == 0 ? -1 : 7, me);
    record(c, K_RANKS, me == 0 ? rest == NULL : rest && pg_rank(rest) == me - 1 && pg_world_size(rest) == c->d->world_size - 1,
           "rank %d: split without rank 0 gave %s", me, rest ? "a group" : "NULL");
    pg_destroy(rest);
    // new_group({W-1, 1}): ranks 1 and W-1, ranked in the parent's order.
    int W = c->d->world_size, list[2] = {W - 1, 1};
    if (W >= 3) {
        pg_t *pair = pg_new_group(c->d->pg, list, 2);
        bool in = me == 1 || me == W - 1;
        record(c, K_RANKS, in ? pair && pg_world_size(pair) == 2 && pg_rank(pair) == (me == 1 ? 0 : 1) : pair == NULL,
               "rank %d: new_group({%d, 1}) gave %s (rank %d)", me, W - 1, pair ? "a group" : "NULL",
               pair ? pg_rank(pair) : -1);
        if (pair) {
            float x = (float)me, sum;
            float *dx = dev_floats(c, &x, 1);
            pg_all_reduce(pair, dx, dx, 1, DTYPE_F32, OP_SUM);
            device_to_host(&c->d->device, &sum, dx, sizeof sum);
            device_free(&c->d->device, dx);
            record(c, K_RANKS, sum == (float)(W - 1 + 1), "rank %d: all_reduce on new_group gave %g, expected %d",
                   me, sum, W);
        }
        pg_destroy(pair);
    }
}

// ---------------------------------------------------------------- the nine collectives

// The sum over the members of value(member, i).
static float member_sum(const int *members, int n, size_t i) {
    float s = 0;
    for (int k = 0; k < n; k++) s += value(members[k], i);
    return s;
}

static void expect_floats(ctx_t *c, const char *what, size_t count, const float *dev, const float *want) {
    float *got = host_floats(c, dev, count);
    size_t bad = 0;
    while (bad < count && got[bad] == want[bad]) bad++;
    record(c, K_COLLECTIVES, bad == count, "rank %d: %s of %zu: element %zu is %g, expected %g", c->d->rank, what,
           count, bad, bad < count ? got[bad] : 0, bad < count ? want[bad] : 0);
    free(got);
}

static void check_collectives(ctx_t *c, pg_t *g, const int *members, int n, size_t count) {
    int me = pg_rank(g), root = n > 1 ? 1 : 0, job = c->d->rank;
    float *mine = xmalloc(count * n * sizeof(float)), *want = xmalloc(count * n * sizeof(float));
    for (size_t i = 0; i < count * n; i++) mine[i] = value(job, i);
    float *in = dev_floats(c, mine, count * n), *out = dev_floats(c, NULL, count * n);

    pg_all_reduce(g, in, out, count, DTYPE_F32, OP_SUM);
    for (size_t i = 0; i < count; i++) want[i] = member_sum(members, n, i);
    expect_floats(c, "all_reduce", count, out, want);

    pg_reduce(g, in, out, count, DTYPE_F32, OP_SUM, root);
    if (me == root) expect_floats(c, "reduce", count, out, want);

    float *buf = dev_floats(c, mine, count);
    pg_broadcast(g, buf, count, DTYPE_F32, root);
    for (size_t i = 0; i < count; i++) want[i] = value(members[root], i);
    expect_floats(c, "broadcast", count, buf, want);
    device_free(&c->d->device, buf);

    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < count; i++) want[k * count + i] = value(members[k], i);
    pg_all_gather(g, in, out, count, DTYPE_F32);
    expect_floats(c, "all_gather", count * n, out, want);
    pg_gather(g, in, out, count, DTYPE_F32, root);
    if (me == root) expect_floats(c, "gather", count * n, out, want);

    // scatter: block k of the root's input goes to rank k.
    pg_scatter(g, in, out, count, DTYPE_F32, root);
    for (size_t i = 0; i < count; i++) want[i] = value(members[root], (size_t)me * count + i);
    expect_floats(c, "scatter", count, out, want);

    // reduce_scatter: rank k gets the sum of everyone's block k.
    pg_reduce_scatter(g, in, out, count, DTYPE_F32, OP_SUM);
    for (size_t i = 0; i < count; i++) want[i] = member_sum(members, n, (size_t)me * count + i);
    expect_floats(c, "reduce_scatter", count, out, want);

    // all_to_all: block k from rank k is rank k's block `me`.
    pg_all_to_all(g, in, out, count, DTYPE_F32);
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < count; i++) want[k * count + i] = value(members[k], (size_t)me * count + i);
    expect_floats(c, "all_to_all", count * n, out, want);

    pg_barrier(g);
    device_free(&c->d->device, in), device_free(&c->d->device, out);
    free(mine), free(want);
}

// ---------------------------------------------------------------- point-to-point

static void check_p2p(ctx_t *c, pg_t *g, const int *members, int n) {
    if (n < 2) return;
    int me = pg_rank(g), next = (me + 1) % n, prev = (me + n - 1) % n;
    float out[3] = {(float)c->d->rank, 1, 2}, in[3] = {-1, -1, -1};
    float *dout = dev_floats(c, out, 3), *din = dev_floats(c, in, 3);
    pg_request_t *r = pg_irecv(g, din, 3, DTYPE_F32, prev), *s = pg_isend(g, dout, 3, DTYPE_F32, next);
    while (!pg_test(r)) {}
    pg_wait(r), pg_wait(s);
    device_to_host(&c->d->device, in, din, sizeof in);
    record(c, K_P2P, in[0] == (float)members[prev] && in[2] == 2, "rank %d: received %g from group rank %d, expected %d",
           c->d->rank, in[0], prev, members[prev]);
    device_free(&c->d->device, dout), device_free(&c->d->device, din);
}

// ---------------------------------------------------------------- nested, independent

static void check_nested(ctx_t *c, pg_t *g, const int *members, int n) {
    int me = pg_rank(g), half = me < (n + 1) / 2 ? 0 : 1;
    pg_t *inner = pg_split(g, half, me);
    int first = half ? (n + 1) / 2 : 0, last = half ? n : (n + 1) / 2;
    float want = 0, got = (float)c->d->rank;
    for (int k = first; k < last; k++) want += (float)members[k];
    float *d = dev_floats(c, &got, 1);
    pg_all_reduce(inner, d, d, 1, DTYPE_F32, OP_SUM);
    device_to_host(&c->d->device, &got, d, sizeof got);
    device_free(&c->d->device, d);
    record(c, K_NESTED, inner && pg_world_size(inner) == last - first && got == want,
           "rank %d: inner group of %d, all_reduce %g, expected %d ranks and %g", c->d->rank,
           inner ? pg_world_size(inner) : 0, got, last - first, want);
    pg_destroy(inner);
}

static void check_independent(ctx_t *c, pg_t *g, int color, const int *members, int n) {
    store_t *st = c->d->rdzv.store;
    if (color == 0 && c->d->world_size > 1) { // wait until group 1 is done
        char flag[8];
        store_get(st, "subgroups/group1_done", flag, sizeof flag, c->d->rdzv.timeout_s);
    }
    float x = 1, *d = dev_floats(c, &x, 1);
    pg_all_reduce(g, d, d, 1, DTYPE_F32, OP_SUM);
    device_to_host(&c->d->device, &x, d, sizeof x);
    device_free(&c->d->device, d);
    if (color == 1 && pg_rank(g) == 0) store_set(st, "subgroups/group1_done", "yes", 3);
    record(c, K_INDEPENDENT, x == (float)n, "rank %d: group of %d all-reduced %g", c->d->rank, n, x);
    (void)members;
}

// ---------------------------------------------------------------- a mesh

// dp x tp (x pp), row-major: job rank = ((dp * tp_size) + tp) ... the last
// dimension fastest. Along each dimension, the all-reduce of the job ranks
// must be the sum over the ranks that differ from ours in that coordinate only.
static void check_mesh(ctx_t *c, int ndims, const int *shape) {
    static const char *const names[3] = {"dp", "tp", "pp"};
    mesh_t m;
    mesh_init(&m, c->d->pg, ndims, shape, names);
    mesh_report(&m, c->d);
    int stride[3], me = c->d->rank;
    for (int k = ndims - 1, s = 1; k >= 0; s *= shape[k--]) stride[k] = s;
    for (int k = 0; k < ndims; k++) {
        int coord = me / stride[k] % shape[k], base = me - coord * stride[k];
        float want = 0, got = (float)me;
        for (int i = 0; i < shape[k]; i++) want += (float)(base + i * stride[k]);
        float *d = dev_floats(c, &got, 1);
        pg_all_reduce(mesh_group(&m, names[k]), d, d, 1, DTYPE_F32, OP_SUM);
        device_to_host(&c->d->device, &got, d, sizeof got);
        device_free(&c->d->device, d);
        record(c, K_MESH, mesh_coord(&m, names[k]) == coord && mesh_size(&m, names[k]) == shape[k] && got == want,
               "rank %d, %s: coordinate %d (expected %d), all-reduce %g (expected %g)", me, names[k],
               mesh_coord(&m, names[k]), coord, got, want);
    }
    mesh_free(&m);
}

// ---------------------------------------------------------------- groups_split

// The dp dimension of the groups' mesh - dp W, or dp 4 x tp 2 on 8 ranks,
// where the ranks of one dp line are not consecutive - split in outer x
// inner (2 x W/2 when dp is even, else 1 x dp). Along dp, coordinate
// c = o * inner + i: the inner group holds the ranks with this rank's o
// (and tp), ordered by i; the outer group those with this rank's i, ordered
// by o. An all-gather of the job's ranks over each group must list them.
static void check_split(ctx_t *c) {
    int W = c->d->world_size, tp = W == 8 ? 2 : 1, dp = W / tp, outer = dp % 2 ? 1 : 2, inner = dp / outer;
    groups_t g;
    groups_init(&g, c->d, (int[DIMS]){[DIM_PP] = 1, [DIM_DP] = dp, [DIM_EP] = 1, [DIM_CP] = 1, [DIM_TP] = tp});
    pg_t *groups[2]; // outer, inner
    groups_split(&g, DIM_DP, outer, &groups[0], &groups[1]);
    int me = c->d->rank, t = me % tp, o = me / tp / inner, i = me / tp % inner;
    for (int which = 0; which < 2; which++) {
        int n = which ? inner : outer, place = which ? i : o, size = pg_world_size(groups[which]);
        float mine = (float)me, *all = xcalloc((size_t)size, sizeof(float));
        groups_all_gather_host(groups[which], &c->d->device, &mine, all, 1, DTYPE_F32);
        int bad = -1, want = 0;
        for (int k = 0; k < size && k < n && bad < 0; k++) {
            want = (which ? o * inner + k : k * inner + i) * tp + t; // member k: its dp coordinate, this tp
            if (all[k] != (float)want) bad = k;
        }
        record(c, K_SPLIT, size == n && pg_rank(groups[which]) == place && bad < 0,
               "rank %d, the %s group of dp %d = %d x %d (tp %d): rank %d of %d (expected %d of %d); member %d is rank "
               "%g (expected %d)", me, which ? "inner" : "outer", dp, outer, inner, tp, pg_rank(groups[which]), size,
               place, n, bad, bad < 0 ? -1.0 : (double)all[bad], bad < 0 ? -1 : want);
        free(all);
    }
    groups_free(&g);
}

// ---------------------------------------------------------------- the job

static void report(ctx_t *c) {
    store_t *st = c->d->rdzv.store;
    char key[64];
    for (int k = 0; k < K_COUNT; k++) {
        snprintf(key, sizeof key, "subgroups/fail/%d", k);
        store_add(st, key, c->failures[k]);
        snprintf(key, sizeof key, "subgroups/why/%d/%d", k, c->d->rank);
        if (c->failures[k]) store_set(st, key, c->first[k], strlen(c->first[k]));
    }
    store_barrier(st, "subgroups/report", c->d->rank, c->d->world_size, c->d->rdzv.timeout_s);
    if (c->d->rank != 0) return;
    for (int k = 0; k < K_COUNT; k++) {
        char name[160], why[240] = "";
        snprintf(name, sizeof name, "subgroups: %s%s, %d ranks", c->o->label, check_names[k], c->d->world_size);
        snprintf(key, sizeof key, "subgroups/fail/%d", k);
        int64_t failed = store_add(st, key, 0);
        for (int r = 0; r < c->d->world_size && failed && !why[0]; r++) {
            snprintf(key, sizeof key, "subgroups/why/%d/%d", k, r);
            if (store_check(st, key)) why[store_get(st, key, why, sizeof why - 1, 5)] = '\0';
        }
        EXPECT(name, failed == 0, "%lld failures, first: %s", (long long)failed, why);
    }
}

static int worker(int rank, int world, void *arg) {
    (void)rank, (void)world;
    const options *o = arg;
    dist_t d;
    dist_options how = {"env://", o->backend, o->device, 0};
    dist_init(&d, &how);
    ctx_t c = {.d = &d, .o = o};
    int color = d.rank % 2, *members = xcalloc((size_t)d.world_size, sizeof(int));
    int n = color_members(d.world_size, color, members);
    pg_t *g = pg_split(d.pg, color, -d.rank);
    if (o->mismatch) { // only group 1's collectives go wrong; group 0's are fine
        float x[2] = {1, 1}, *dx = dev_floats(&c, x, 2);
        pg_all_reduce(g, dx, dx, color == 1 && pg_rank(g) == n - 1 ? 1 : 2, DTYPE_F32, OP_SUM);
        pg_all_reduce(g, dx, dx, 2, DTYPE_F32, OP_SUM);
        device_free(&d.device, dx);
    }
    if (d.rank == 0) printf("# %d ranks: %s; color group: %s\n", d.world_size, pg_describe(d.pg), pg_describe(g));
    check_ranks(&c, g, members, n);
    check_collectives(&c, g, members, n, 2);
    check_collectives(&c, g, members, n, 70001);
    check_p2p(&c, g, members, n);
    check_nested(&c, g, members, n);
    check_independent(&c, g, color, members, n);
    int shape[3] = {2, 2, 2}, dims = d.world_size == 8 ? 3 : 2;
    if (o->mesh) dims = sscanf(o->mesh, "%dx%dx%d", &shape[0], &shape[1], &shape[2]);
    if (o->mesh || d.world_size == 4 || d.world_size == 8) check_mesh(&c, dims, shape);
    check_split(&c);
    pg_destroy(g);
    free(members);
    report(&c);
    dist_finish(&d);
    int failed = 0;
    for (int k = 0; k < K_COUNT; k++) failed += c.failures[k];
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    options o = {"cpu", "cpu", "", 4, NULL, false};
    const char *tag = "";
    flag_set set = {.program = "test_subgroups", .summary = "checks pg_split and pg_new_group on a backend"};
    flag_int(&set, "world", &o.world, 1, 64, "ranks to spawn (under mpirun: ignored)");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "process-group backend");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the buffers live");
    flag_string(&set, "label", &o.label, "prefix for the test names");
    flag_string(&set, "mesh", &o.mesh, "a mesh of this shape, AxB or AxBxC (default: 2x2 on 4 ranks, 2x2x2 on 8)");
    flag_bool(&set, "mismatch", &o.mismatch, "one rank of group 1 calls all_reduce with another count (COURSE_DEBUG=DETAIL catches it)");
    flag_string(&set, "tag", &tag, "ignored; marks this run's processes for the leftover check");
    flags_parse(&set, argc, argv);
    if (launch_env_read().launched || launch_env_by_mpi()) return worker(0, 1, &o);
    int rc = spawn(o.world, worker, &o);
    if (rc != 0) printf("FAIL subgroups: %sthe job of %d ranks failed (status %d); see the errors above\n", o.label,
                        o.world, rc);
    return rc;
}
