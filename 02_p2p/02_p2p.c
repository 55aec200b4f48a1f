// 02_p2p.c - Chapter 2: point-to-point messages between two ranks.
//
// The smallest distributed program: rank 0 puts 1.0 in a tensor and sends
// it to rank 1. It is done twice, as in PyTorch's tutorial:
//   1. blocking:     pg_send / pg_recv return when the buffer may be reused;
//   2. non-blocking: pg_isend / pg_irecv return at once with a request; the
//      rank polls it with pg_test (doing other work meanwhile) and finishes
//      with pg_wait. Until then the buffer belongs to the library.
// With --bench the same two calls measure the link: a ping-pong between
// ranks 0 and 1 over message sizes from 8 B to 256 MiB gives the latency
// (small messages) and the bandwidth (large ones); that benchmark is
// bench_pingpong.h.
//
// The program starts its own ranks with spawn() (like mp.spawn); started
// by a launcher (tools/ddprun, torchrun, srun), it is one of the ranks.
#include <stdio.h>
#include <time.h>

#include "bench_pingpong.h"
#include "dist.h"
#include "flags.h"
#include "log.h"
#include "spawn.h"
#include "timer.h"

typedef struct {
    int nprocs;
    const char *backend, *device;
    double timeout;
    bool bench;
    bench_options b;   // the flags of --bench (bench_pingpong.h)
} options;

static options parse_options(int argc, char **argv) {
    options o = {2, "auto", "auto", 0, false, {8, (size_t)256 << 20, 2, 100, 10}};
    flag_set set = {.program = "02_p2p",
                    .summary = "send a tensor from rank 0 to rank 1; --bench: ping-pong latency and bandwidth"};
    flag_int(&set, "nprocs", &o.nprocs, 2, 64, "ranks to spawn (ranks 0 and 1 talk; the others wait)");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "communication backend")->env = "COURSE_BACKEND";
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the buffers live")->env = "COURSE_DEVICE";
    flag_double(&set, "timeout", &o.timeout, 0, 86400, "seconds any wait may take (0: COURSE_TIMEOUT or 300)");
    flag_bool(&set, "bench", &o.bench, "measure ping-pong latency and bandwidth instead of the lesson");
    flag_bytes(&set, "minbytes", &o.b.minbytes, 1, 4294967296.0, "smallest message (K, M, G suffixes)")->short_name = "b";
    flag_bytes(&set, "maxbytes", &o.b.maxbytes, 1, 4294967296.0, "largest message")->short_name = "e";
    flag_int(&set, "stepfactor", &o.b.stepfactor, 2, 1024, "multiply the size by this from one row to the next")->short_name = "f";
    flag_int(&set, "iters", &o.b.iters, 1, 1000000, "timed round trips per size (fewer for big messages)")->short_name = "n";
    flag_int(&set, "warmup_iters", &o.b.warmup_iters, 0, 1000000, "untimed round trips per size first")->short_name = "w";
    flags_parse(&set, argc, argv);
    if (o.b.minbytes > o.b.maxbytes)
        flags_fail(&set, "-b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)", o.b.minbytes, o.b.maxbytes);
    return o;
}

// The first line of every run: where the buffers live, how they travel, why.
static void say_where(const dist_t *d) {
    log_main("02_p2p: %d ranks | device: %s (%s) | backend: %s\n", d->world_size, d->device.name,
             d->device.why, pg_describe(d->pg));
}

// A one-float tensor on the chosen device, set from the host.
static float *tensor_new(const device_t *dev, float value) {
    float *t = device_alloc(dev, sizeof(float));
    device_from_host(dev, t, &value, sizeof value);
    return t;
}

static float tensor_read(const device_t *dev, const float *t) {
    float value;
    device_to_host(dev, &value, t, sizeof value);
    return value;
}

// ---------------------------------------------------------------- 1. blocking
// pg_send returns when the tensor may be changed again (the bytes are on
// their way or delivered); pg_recv returns when the tensor holds the data.
static void blocking_exchange(dist_t *d) {
    log_main("--- 1. blocking: pg_send / pg_recv\n");
    float *tensor = tensor_new(&d->device, 0.0f);
    if (d->rank == 0) {
        float one = tensor_read(&d->device, tensor) + 1.0f;   // tensor += 1
        device_from_host(&d->device, tensor, &one, sizeof one);
        printf("Rank 0 has data %.1f (sending it to rank 1 with pg_send)\n", tensor_read(&d->device, tensor));
        fflush(stdout);
        pg_send(d->pg, tensor, 1, DTYPE_F32, 1);
    } else if (d->rank == 1) {
        pg_recv(d->pg, tensor, 1, DTYPE_F32, 0);
        printf("Rank 1 has data %.1f (pg_recv returned)\n", tensor_read(&d->device, tensor));
        fflush(stdout);
    }
    device_free(&d->device, tensor);
    pg_barrier(d->pg);   // so that part 2's lines come after part 1's
}

// ---------------------------------------------------------------- 2. non-blocking
// Stands for useful work that does not touch the buffer in flight: in DDP
// this is the backward pass computing the next gradients while the last
// ones are being all-reduced.
static void other_work(void) {
    struct timespec pause = {0, 100 * 1000};   // 100 us
    nanosleep(&pause, NULL);
}

// Polls until the request completes (or the deadline passes: then pg_wait
// gives up with an error naming the peer). Returns how many polls it took.
static long poll_until_done(pg_request_t *request, double timeout_s) {
    long polls = 0;
    double deadline = now_seconds() + timeout_s;
    while (now_seconds() < deadline) {
        polls++;
        if (pg_test(request)) break;
        other_work();
    }
    pg_wait(request);   // returns at once if done; frees the request either way
    return polls;
}

static void nonblocking_exchange(dist_t *d, double timeout_s) {
    log_main("--- 2. non-blocking: pg_isend / pg_irecv, poll with pg_test, then pg_wait\n");
    pg_barrier(d->pg);   // so that no rank's line comes before this heading
    float *tensor = tensor_new(&d->device, 0.0f);
    if (d->rank == 0) {
        // Rank 0 is "busy" for 20 ms first, so that rank 1 has to wait.
        struct timespec busy = {0, 20 * 1000 * 1000};
        nanosleep(&busy, NULL);
        float one = 1.0f;
        device_from_host(&d->device, tensor, &one, sizeof one);
        printf("Rank 0 has data %.1f and posts pg_isend: until pg_wait returns it may read the "
               "tensor but must not write or free it\n", tensor_read(&d->device, tensor));
        fflush(stdout);
        pg_request_t *request = pg_isend(d->pg, tensor, 1, DTYPE_F32, 1);
        long polls = poll_until_done(request, timeout_s);
        // pg_wait has returned: the tensor is ours again, we may overwrite it.
        printf("Rank 0: isend completed after %ld poll%s; the tensor may be reused now\n", polls,
               polls == 1 ? "" : "s");
        fflush(stdout);
    } else if (d->rank == 1) {
        pg_request_t *request = pg_irecv(d->pg, tensor, 1, DTYPE_F32, 0);
        printf("Rank 1 posted pg_irecv: until pg_wait returns it must neither read nor write the "
               "tensor (it may be half written)\n");
        fflush(stdout);
        long polls = poll_until_done(request, timeout_s);
        // Only now is the received value guaranteed to be in the tensor.
        printf("Rank 1 has data %.1f (irecv completed after %ld polls; each poll did 100 us of "
               "other work)\n", tensor_read(&d->device, tensor), polls);
        fflush(stdout);
    }
    device_free(&d->device, tensor);
    pg_barrier(d->pg);
}

// ---------------------------------------------------------------- the rank's program
static int worker(int rank, int world_size, void *arg) {
    (void)rank, (void)world_size;   // dist_init reads them from the environment spawn set
    const options *o = arg;
    dist_options how = {.backend = o->backend, .device = o->device, .timeout_s = o->timeout};
    dist_t d;
    dist_init(&d, &how);
    say_where(&d);
    if (d.world_size < 2) die("02_p2p needs at least 2 ranks, the launcher started %d", d.world_size);
    if (o->bench) {
        run_bench(&d, &o->b);
    } else {
        if (d.world_size > 2) log_main("(ranks 2..%d take no part: a message has one sender and one receiver)\n",
                                       d.world_size - 1);
        blocking_exchange(&d);
        nonblocking_exchange(&d, o->timeout > 0 ? o->timeout : course_timeout_default());
    }
    dist_finish(&d);
    return 0;
}

int main(int argc, char **argv) {
    options opt = parse_options(argc, argv);
    // Started by a launcher (ddprun, torchrun, srun): this process is one rank.
    launch_env_t env = launch_env_read();
    if (env.launched) return worker(env.rank, env.world_size, &opt);
    // Started by hand: become a job of --nprocs ranks, like mp.spawn.
    return spawn(opt.nprocs, worker, &opt);
}
