// test_p2p.c - point-to-point messages, failures and teardown of pg.h,
// driven by tests/library/test_p2p.sh.
//
// --mode basic    (the default) in one job: messages between a pair arrive
//                 in the order sent; two ranks that both pg_send 64 KiB,
//                 2 MiB or 64 MiB to each other before receiving do not
//                 deadlock; isend/irecv
//                 polled with pg_test complete, and pg_test does not block
//                 while the peer has not sent yet; a p2p message posted
//                 before a collective is not mistaken for the collective's
//                 data; a ring of isend/irecv among all ranks
// --mode reinit   pg_create, use, pg_destroy, twice in the same process
// --mode kill     rank 1 kills itself (SIGKILL) in the middle of a stream of
//                 all-reduces; the others must exit non-zero within seconds
// --mode stall    rank 1 never joins the all-reduce; the others must time
//                 out (COURSE_TIMEOUT) with a message naming the op and rank
// --mode mismatch rank 0 broadcasts while the others all-reduce: a clear
//                 error instead of garbage
// --mode bind     the cores each rank may use after pg_create: with no more
//                 ranks than cores, disjoint shares of the cores the job
//                 started with, together all of them; else (or with
//                 COURSE_BIND=0) the cores it started with
// --mode nccl     --backend nccl on one rank (needs a GPU)
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include "flags.h"
#include "pg.h"
#include "rendezvous.h"
#include "spawn.h"
#include "test.h"

typedef struct {
    const char *mode, *backend, *device;
} options;

typedef struct {
    pg_t *pg;
    rendezvous_t rdzv;
    device_t dev;
    int rank, world;
} job;

static void job_start(job *j, int rank, int world, const options *o) {
    j->rank = rank;
    j->world = world;
    j->rdzv = rendezvous("env://", -1, -1, 0);
    j->dev = device_choose(o->device, rank);
    pg_config_t cfg = {.rank = rank, .world_size = world, .local_rank = rank,
                     .local_world_size = world, .backend = backend_parse(o->backend),
                     .device = &j->dev, .store = j->rdzv.store, .timeout_s = 0};
    j->pg = pg_create(&cfg);
}

static void job_end(job *j) {
    pg_destroy(j->pg);
    rendezvous_close(&j->rdzv);
}

// Prints only on rank 0, so that each case is counted once.
static void expect(const job *j, const char *name, bool ok, const char *why) {
    if (j->rank == 0) EXPECT(name, ok, "%s", why);
    else if (!ok) fprintf(stderr, "rank %d: %s: %s\n", j->rank, name, why);
}

// All ranks agree that a case passed (through the store, not the group under test).
static bool all_ok(job *j, const char *name, bool ok) {
    char key[96];
    snprintf(key, sizeof key, "test/bad/%s", name);
    store_add(j->rdzv.store, key, ok ? 0 : 1);
    store_barrier(j->rdzv.store, key, j->rank, j->world, 0);
    return store_add(j->rdzv.store, key, 0) == 0;
}

static float pattern(int from, int seq, size_t i) { return (float)(from * 1000 + seq * 10 + (int)(i % 7)); }

static bool check_pattern(const float *buf, size_t count, int from, int seq) {
    for (size_t i = 0; i < count; i++)
        if (buf[i] != pattern(from, seq, i)) return false;
    return true;
}

static void fill_pattern(float *buf, size_t count, int from, int seq) {
    for (size_t i = 0; i < count; i++) buf[i] = pattern(from, seq, i);
}

// ---------------------------------------------------------------- basic cases

// Rank 0 sends messages of growing and shrinking sizes (0 included) to rank 1.
static void case_order(job *j) {
    static const size_t sizes[] = {5, 0, 1, 70000, 3, 1 << 20, 17, 0, 4096, 2};
    enum { N = sizeof sizes / sizeof sizes[0] };
    bool ok = true;
    if (j->rank == 0) {
        pg_request_t *reqs[N];
        float *bufs[N];
        for (int k = 0; k < N; k++) {
            bufs[k] = xmalloc(sizes[k] * sizeof(float));
            fill_pattern(bufs[k], sizes[k], 0, k);
            reqs[k] = pg_isend(j->pg, bufs[k], sizes[k], DTYPE_F32, 1);
        }
        for (int k = 0; k < N; k++) {
            pg_wait(reqs[k]);
            free(bufs[k]);
        }
    } else if (j->rank == 1) {
        for (int k = 0; k < N; k++) {
            float *buf = xmalloc(sizes[k] * sizeof(float));
            pg_recv(j->pg, buf, sizes[k], DTYPE_F32, 0);
            ok &= check_pattern(buf, sizes[k], 0, k);
            free(buf);
        }
    }
    expect(j, "p2p: messages arrive in the order sent", all_ok(j, "order", ok),
           "rank 1 received a message out of order or damaged");
}

// Both ranks send first and receive second, with blocking calls: this only
// completes if a rank that waits takes in what it has not asked for yet.
// Each size takes a different path between ranks of one host: 64 KiB waits
// parked in the ring, 2 MiB is read from the sender's memory where single
// copy is on (COURSE_SINGLE_COPY=1), 64 MiB is larger than the ring.
static void case_both_directions(job *j) {
    static const size_t sizes[] = {64u << 10, 2u << 20, 64u << 20};
    for (int k = 0; k < 3; k++) {
        size_t count = sizes[k] / sizeof(float);
        bool ok = true;
        if (j->rank < 2) {
            int peer = 1 - j->rank;
            float *out = xmalloc(count * sizeof(float)), *in = xmalloc(count * sizeof(float));
            fill_pattern(out, count, j->rank, 7 + k);
            pg_send(j->pg, out, count, DTYPE_F32, peer);
            pg_recv(j->pg, in, count, DTYPE_F32, peer);
            ok = check_pattern(in, count, peer, 7 + k);
            free(out);
            free(in);
        }
        char name[96];
        snprintf(name, sizeof name, "p2p: two ranks pg_send %zu KiB to each other at once, no deadlock",
                 sizes[k] >> 10);
        char key[16];
        snprintf(key, sizeof key, "both%d", k);
        expect(j, name, all_ok(j, key, ok), "the data received was wrong");
    }
}

// Rank 1 sends only after rank 0 has polled pg_test and seen 'not yet'.
static void case_test_polling(job *j) {
    size_t count = 300000;
    float *buf = xmalloc(count * sizeof(float));
    bool ok = true, early = false;
    char key[] = "test/polled";
    if (j->rank == 0) {
        pg_request_t *r = pg_irecv(j->pg, buf, count, DTYPE_F32, 1);
        for (int k = 0; k < 20; k++) early |= pg_test(r);   // nothing sent yet
        store_set(j->rdzv.store, key, "1", 1);
        while (!pg_test(r)) {}
        pg_wait(r);
        ok = !early && check_pattern(buf, count, 1, 3);
    } else if (j->rank == 1) {
        char v[4];
        store_get(j->rdzv.store, key, v, sizeof v, 0);
        fill_pattern(buf, count, 1, 3);
        pg_request_t *r = pg_isend(j->pg, buf, count, DTYPE_F32, 0);
        while (!pg_test(r)) {}
        pg_wait(r);
    }
    expect(j, "p2p: irecv + pg_test polling completes, and pg_test does not wait for the peer",
           all_ok(j, "polling", ok), early ? "pg_test said done before anything was sent"
                                          : "the data received was wrong");
    free(buf);
}

// An isend posted before a collective and received after it.
static void case_p2p_around_collective(job *j) {
    float msg[4] = {1, 2, 3, 4}, got[4] = {0}, one = 1, sum = 0;
    pg_request_t *r = NULL;
    if (j->rank == 0) r = pg_isend(j->pg, msg, 4, DTYPE_F32, 1);
    pg_all_reduce(j->pg, &one, &sum, 1, DTYPE_F32, OP_SUM);
    if (j->rank == 1) pg_recv(j->pg, got, 4, DTYPE_F32, 0);
    if (r) pg_wait(r);
    bool ok = sum == (float)j->world && (j->rank != 1 || !memcmp(got, msg, sizeof msg));
    expect(j, "p2p: a send posted before a collective does not disturb it",
           all_ok(j, "around", ok), "the all-reduce or the message came out wrong");
}

// Every rank sends to the next and receives from the previous, at once.
static void case_ring(job *j) {
    size_t count = 100000;
    float *out = xmalloc(count * sizeof(float)), *in = xmalloc(count * sizeof(float));
    int next = (j->rank + 1) % j->world, prev = (j->rank + j->world - 1) % j->world;
    fill_pattern(out, count, j->rank, 5);
    pg_request_t *rs[2] = {pg_irecv(j->pg, in, count, DTYPE_F32, prev),
                           pg_isend(j->pg, out, count, DTYPE_F32, next)};
    pg_wait(rs[0]);
    pg_wait(rs[1]);
    expect(j, "p2p: a ring of isend/irecv among all ranks",
           all_ok(j, "ring", check_pattern(in, count, prev, 5)), "the data received was wrong");
    free(out);
    free(in);
}

static int run_basic(int rank, int world, void *arg) {
    job j;
    job_start(&j, rank, world, arg);
    if (rank == 0) printf("# %d ranks: %s\n", world, pg_describe(j.pg));
    case_order(&j);
    case_both_directions(&j);
    case_test_polling(&j);
    case_p2p_around_collective(&j);
    case_ring(&j);
    job_end(&j);
    return test_failures != 0;
}

// ---------------------------------------------------------------- teardown and re-creation

static int run_reinit(int rank, int world, void *arg) {
    rendezvous_t rdzv = rendezvous("env://", -1, -1, 0);
    device_t dev = device_choose(((const options *)arg)->device, rank);
    bool ok = true;
    for (int round = 0; round < 2; round++) {
        pg_config_t cfg = {.rank = rank, .world_size = world, .local_rank = rank,
                         .local_world_size = world,
                         .backend = backend_parse(((const options *)arg)->backend),
                         .device = &dev, .store = rdzv.store, .timeout_s = 0};
        pg_t *pg = pg_create(&cfg);
        float v = (float)(rank + 1 + round), sum = 0;
        pg_all_reduce(pg, &v, &sum, 1, DTYPE_F32, OP_SUM);
        ok &= sum == (float)(world * (world + 1) / 2 + world * round);
        pg_barrier(pg);
        pg_destroy(pg);
    }
    if (rank == 0) EXPECT("p2p: pg_destroy then a second pg_create in the same process", ok,
                          "the second group computed a wrong sum");
    rendezvous_close(&rdzv);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------- failures

static void *kill_later(void *arg) {
    (void)arg;
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    raise(SIGKILL);
    return NULL;
}

// Everyone all-reduces 16 MiB in a loop; rank 1 dies by SIGKILL after 0.3 s,
// in the middle of one of them.
static int run_kill(int rank, int world, void *arg) {
    job j;
    job_start(&j, rank, world, arg);
    size_t count = (16u << 20) / sizeof(float);
    float *buf = xcalloc(count, sizeof(float));
    pthread_t killer;
    if (rank == 1) pthread_create(&killer, NULL, kill_later, NULL);
    // The survivors ignore spawn's SIGTERM: they must notice the death and
    // stop by themselves (the shell test checks how fast).
    else signal(SIGTERM, SIG_IGN);
    for (int k = 0; k < 100000; k++) pg_all_reduce(j.pg, buf, buf, count, DTYPE_F32, OP_SUM);
    fprintf(stderr, "rank %d: the all-reduces went on after rank 1 died\n", rank);
    return 0;   // reaching this is the failure: the shell test sees status 0
}

static int run_stall(int rank, int world, void *arg) {
    job j;
    job_start(&j, rank, world, arg);
    float v = 1, sum = 0;
    if (rank == 1) {
        sleep(120);   // never joins; spawn stops it once the others fail
        return 0;
    }
    pg_all_reduce(j.pg, &v, &sum, 1, DTYPE_F32, OP_SUM);
    return 0;
}

static int run_mismatch(int rank, int world, void *arg) {
    job j;
    job_start(&j, rank, world, arg);
    float v[16] = {0}, sum[16];
    if (rank == 0) pg_broadcast(j.pg, v, 16, DTYPE_F32, 0);
    else pg_all_reduce(j.pg, v, sum, 16, DTYPE_F32, OP_SUM);
    job_end(&j);
    return 0;
}

// ---------------------------------------------------------------- binding to cores

enum { MASK_WORDS = CPU_SETSIZE / 64 };

static void mask_words(const cpu_set_t *set, uint64_t *words) {
    memset(words, 0, MASK_WORDS * sizeof *words);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, set)) words[c / 64] |= 1ull << (c % 64);
}

// Are the ranks' masks disjoint, each one not empty, together `start`, and
// their sizes within one core of each other?
static bool masks_share(const uint64_t *all, int world, const uint64_t *start) {
    int least = CPU_SETSIZE, most = 0;
    for (int w = 0; w < MASK_WORDS; w++) {
        uint64_t seen = 0;
        for (int r = 0; r < world; r++) {
            if (all[r * MASK_WORDS + w] & seen) return false;
            seen |= all[r * MASK_WORDS + w];
        }
        if (seen != start[w]) return false;
    }
    for (int r = 0; r < world; r++) {
        int cores = 0;
        for (int w = 0; w < MASK_WORDS; w++) cores += __builtin_popcountll(all[r * MASK_WORDS + w]);
        least = cores < least ? cores : least;
        most = cores > most ? cores : most;
    }
    return least >= 1 && most - least <= 1;
}

static int run_bind(int rank, int world, void *arg) {
    cpu_set_t set;
    uint64_t start[MASK_WORDS], mine[MASK_WORDS];
    if (sched_getaffinity(0, sizeof set, &set) != 0) die("sched_getaffinity: %s", strerror(errno));
    mask_words(&set, start);
    int cores = CPU_COUNT(&set);
    job j;
    job_start(&j, rank, world, arg);
    if (sched_getaffinity(0, sizeof set, &set) != 0) die("sched_getaffinity: %s", strerror(errno));
    mask_words(&set, mine);
    uint64_t *all = xcalloc((size_t)world * MASK_WORDS, sizeof *all);
    pg_all_gather(j.pg, mine, all, MASK_WORDS, DTYPE_I64);
    const char *env = getenv("COURSE_BIND");
    bool bound = world <= cores && !(env && !strcmp(env, "0"));
    bool ok = true;
    for (int r = 0; r < world && !bound; r++)
        ok &= !memcmp(&all[r * MASK_WORDS], start, sizeof start);
    if (bound) ok = masks_share(all, world, start);
    if (rank == 0) {
        if (bound) EXPECT("p2p: each rank keeps to its own share of the cores", ok,
                          "%d ranks, %d cores: the masks overlap, leave a core out or are uneven", world, cores);
        else EXPECT("p2p: ranks stay free when they outnumber the cores or COURSE_BIND=0", ok,
                    "%d ranks, %d cores: a rank's cores changed", world, cores);
    }
    free(all);
    job_end(&j);
    return test_failures != 0;
}

// ---------------------------------------------------------------- nccl, one rank

static int run_nccl(int rank, int world, void *arg) {
    job j;
    job_start(&j, rank, world, arg);
    size_t count = 1000;
    float *host = xmalloc(count * sizeof(float));
    fill_pattern(host, count, 0, 1);
    float *dev = device_alloc(&j.dev, count * sizeof(float));
    device_from_host(&j.dev, dev, host, count * sizeof(float));
    pg_all_reduce(j.pg, dev, dev, count, DTYPE_F32, OP_SUM);
    pg_broadcast(j.pg, dev, count, DTYPE_F32, 0);
    pg_barrier(j.pg);
    device_to_host(&j.dev, host, dev, count * sizeof(float));
    EXPECT("nccl: one-rank all_reduce, broadcast and barrier on the GPU",
           pg_backend(j.pg) == BACKEND_NCCL && check_pattern(host, count, 0, 1),
           "backend %s, or the data changed", backend_name(pg_backend(j.pg)));
    device_free(&j.dev, dev);
    free(host);
    job_end(&j);
    return test_failures != 0;
}

int main(int argc, char **argv) {
    options o = {"basic", "cpu", "cpu"};
    int nprocs = 3;
    const char *tag = "";
    flag_set set = {.program = "test_p2p", .summary = "point-to-point, failures and teardown of pg.h"};
    flag_choice(&set, "mode", &o.mode, "basic|reinit|kill|stall|mismatch|bind|nccl", "what to test");
    flag_int(&set, "nprocs", &nprocs, 1, 64, "ranks to spawn")->short_name = "n";
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl", "process-group backend");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the buffers live");
    flag_string(&set, "tag", &tag, "ignored; marks this run's processes for the leftover check");
    flags_parse(&set, argc, argv);
    spawn_fn fn = !strcmp(o.mode, "basic") ? run_basic : !strcmp(o.mode, "reinit") ? run_reinit
                  : !strcmp(o.mode, "kill") ? run_kill : !strcmp(o.mode, "stall") ? run_stall
                  : !strcmp(o.mode, "mismatch") ? run_mismatch : !strcmp(o.mode, "bind") ? run_bind
                  : run_nccl;
    int rc = spawn(nprocs, fn, &o);
    printf("spawn returned %d\n", rc);
    return rc;
}
