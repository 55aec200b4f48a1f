// test_ddp_compress.c - ddp.h's 16-bit communication hooks (--grad_compress
// bf16 or fp16), driven by tests/library/test_ddp_compress.sh.
//
// spawn() starts --nprocs ranks. Each makes its own gradients (a different
// pseudo-random vector per rank, values from 1e-3 to 10 in size, so that
// the 16-bit mantissa matters, and inside fp16's range) and averages two
// copies of them: one with the fp32 hook, one with the --hook one. Each rank
// checks, and prints one line per check, "rank R: NAME ok" or
// "rank R: NAME FAILED: why":
//   16bit      every averaged value is a number of the wire's type (bf16:
//              its low 16 bits are 0; fp16: it survives a round trip):
//              what was averaged travelled in 16 bits and was widened back
//   close      each is the fp32 average within the wire's rounding u (bf16
//              2^-8, fp16 2^-11): the inputs' (u of each), the W-1 partial
//              sums' and the division's, at most (W+1)/W x sum|inputs| x u
//   rounded    some value differs from the fp32 average: the hook did round
//   bytes      the hook handed half the fp32 hook's bytes to all-reduce
// then ddp_check_replicas: every rank holds the same averages.
#include <math.h>

#include "ddp.h"
#include "dist.h"
#include "flags.h"
#include "log.h"
#include "rng.h"
#include "spawn.h"

typedef struct {
    const char *device, *backend, *hook;
    int count;
} options;

// Rank r's gradient: reproducible, so every rank can compute everyone's.
static void gradient_of(int rank, float *g, size_t n) {
    rng_t rng = rng_seed(1000 + (uint64_t)rank);
    for (size_t i = 0; i < n; i++) {
        double size = pow(10.0, -3.0 + 4.0 * rng_uniform(&rng));   // 1e-3 .. 10
        g[i] = (float)(rng_uniform(&rng) < 0.5 ? -size : size);
    }
}

static void say(int rank, const char *name, bool ok, const char *why) {
    if (ok) printf("rank %d: %s ok\n", rank, name);
    else printf("rank %d: %s FAILED: %s\n", rank, name, why);
    fflush(stdout);
}

static int worker(int rank, int world, void *arg) {
    (void)rank, (void)world;
    const options *o = arg;
    dist_t dist;
    dist_options how = {"env://", o->backend, o->device, 0};
    dist_init(&dist, &how);
    size_t n = (size_t)o->count, bytes = n * sizeof(float);
    int W = dist.world_size;
    float *mine = xmalloc(bytes), *fp32 = xmalloc(bytes), *half = xmalloc(bytes);
    ddp_compress_t hook = ddp_compress_from_name(o->hook);
    dtype_t wire = ddp_wire_dtype(hook);
    double u = wire == DTYPE_F16 ? 0x1p-11 : 0x1p-8;
    float *all = xmalloc(bytes * (size_t)W);
    for (int r = 0; r < W; r++) gradient_of(r, all + (size_t)r * n, n);
    memcpy(mine, all + (size_t)dist.rank * n, bytes);
    float *dev = device_alloc(&dist.device, bytes);

    size_t before = ddp_bytes_reduced();
    device_from_host(&dist.device, dev, mine, bytes);
    ddp_average_gradients_with(dist.pg, dev, n, DDP_COMPRESS_NONE);
    device_to_host(&dist.device, fp32, dev, bytes);
    size_t fp32_bytes = ddp_bytes_reduced() - before;
    before = ddp_bytes_reduced();
    device_from_host(&dist.device, dev, mine, bytes);
    ddp_average_gradients_with(dist.pg, dev, n, hook);
    device_to_host(&dist.device, half, dev, bytes);
    size_t half_bytes = ddp_bytes_reduced() - before;

    char why[200] = "";
    size_t not_16bit = 0, far = 0, differ = 0;
    for (size_t i = 0; i < n; i++) {
        not_16bit += float16_to_f32(wire, f32_to_float16(wire, half[i])) != half[i];
        // The rounding allowed (see the top): the sum's error is at most W
        // roundings of u x sum|inputs|, divided by W, plus the division's.
        double sum_abs = 0;
        for (int r = 0; r < W; r++) sum_abs += fabs(all[(size_t)r * n + i]);
        double allowed = (W + 1.0) / W * sum_abs * u + 1e-12;
        if (fabs((double)half[i] - fp32[i]) > allowed) {
            if (!far) snprintf(why, sizeof why, "element %zu: %s hook %.9g, fp32 %.9g, allowed %.3g", i, o->hook, half[i], fp32[i], allowed);
            far++;
        }
        differ += half[i] != fp32[i];
    }
    char text[240];
    snprintf(text, sizeof text, "%zu of %zu values are not %s numbers", not_16bit, n, o->hook);
    say(dist.rank, "16bit", W == 1 || not_16bit == 0, text);
    snprintf(text, sizeof text, "%zu of %zu too far; first: %s", far, n, why);
    say(dist.rank, "close", far == 0, text);
    snprintf(text, sizeof text, "all %zu values equal the fp32 average", n);
    say(dist.rank, "rounded", W == 1 || differ > 0, text);
    snprintf(text, sizeof text, "%s hook %zu bytes, fp32 hook %zu", o->hook, half_bytes, fp32_bytes);
    say(dist.rank, "bytes", W == 1 ? half_bytes == 0 && fp32_bytes == 0 : fp32_bytes == bytes && half_bytes == bytes / 2, text);
    device_from_host(&dist.device, dev, half, bytes);
    ddp_check_replicas(dist.pg, &dist.device, dev, n, 1);
    log_main("replicas equal after the %s average\n", o->hook);
    device_free(&dist.device, dev);
    free(mine), free(fp32), free(half), free(all);
    dist_finish(&dist);
    return 0;
}

int main(int argc, char **argv) {
    options o = {.device = "cpu", .backend = "auto", .hook = "bf16", .count = 1000};
    flag_set set = {.program = "test_ddp_compress", .summary = "ddp.h's 16-bit hooks against the fp32 average"};
    int nprocs = 2;
    flag_int(&set, "nprocs", &nprocs, 1, 64, "ranks");
    flag_int(&set, "count", &o.count, 1, 100000000, "gradients per rank");
    flag_choice(&set, "device", &o.device, "auto|cpu|cuda", "where the gradients live");
    flag_choice(&set, "backend", &o.backend, "auto|cpu|nccl|mpi", "communication backend");
    flag_choice(&set, "hook", &o.hook, "bf16|fp16", "the 16-bit hook tested");
    flags_parse(&set, argc, argv);
    return spawn(nprocs, worker, &o);
}
