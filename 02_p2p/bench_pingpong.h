// bench_pingpong.h - chapter 2's benchmark: ping-pong latency and bandwidth.
//
// Rank 0 sends a message to rank 1, which sends it straight back; rank 0
// times each round trip. Half the median round trip is the one-way
// latency (what small messages cost), and size / latency the bandwidth
// (what large ones reach). 02_p2p.c runs it for --bench, with the same
// pg_send and pg_recv its lesson shows (common/bench.h has the size sweep).
#ifndef CH02_BENCH_PINGPONG_H
#define CH02_BENCH_PINGPONG_H

#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "dist.h"
#include "log.h"
#include "metrics.h"
#include "timer.h"

// The flags of --bench (02_p2p.c parses them).
typedef struct {
    size_t minbytes, maxbytes;
    int stepfactor, iters, warmup_iters;
} bench_options;

// Round trips: rank 0 sends `out` and receives the echo into `in`; rank 1
// receives into `in` and sends it straight back. Rank 0 times each round
// trip on its own (round_trip[i], seconds) when round_trip is not NULL:
// both pg calls are blocking for the host, so the clock sees the whole trip.
static void round_trips(dist_t *d, void *out, void *in, size_t bytes, int count, double *round_trip) {
    for (int i = 0; i < count; i++) {
        if (d->rank == 0) {
            double start = now_seconds();
            pg_send(d->pg, out, bytes, DTYPE_U8, 1);
            pg_recv(d->pg, in, bytes, DTYPE_U8, 1);
            if (round_trip) round_trip[i] = now_seconds() - start;
        } else {
            pg_recv(d->pg, in, bytes, DTYPE_U8, 0);
            pg_send(d->pg, in, bytes, DTYPE_U8, 0);
        }
    }
}

static void bench_header(const dist_t *d, const bench_options *o) {
    char date[32];
    bench_date(date, sizeof date, true);
    log_main("# ping-pong between rank 0 and rank 1 (%d ranks in the job), %s\n", d->world_size, date);
    log_main("# device: %s | backend: %s\n", d->device.name, pg_describe(d->pg));
    log_main("# method: per size, %d untimed round trips (warm-up), then n timed ones: rank 0 sends with\n"
             "#   pg_send and waits for the echo with pg_recv; a host timer (CLOCK_MONOTONIC) times each trip.\n"
             "#   n = %d, or fewer for big sizes so that a size moves at most 1 GiB each way (n >= 2).\n"
             "#   latency = median round-trip time / 2 (one way); mean = mean round trip / 2;\n"
             "#   bandwidth = size / latency; GB = 1e9 bytes. The echo is checked: the bytes that come\n"
             "#   back must equal the bytes sent.\n",
             o->warmup_iters, o->iters);
    log_main("#%13s %8s %13s %10s %16s\n", "size (B)", "iters", "latency (us)", "mean (us)", "bandwidth (GB/s)");
}

// The buffers of one benchmark run; `sent` and `scratch` are rank 0's.
typedef struct {
    void *out, *in;
    unsigned char *sent, *scratch;
    double *round_trip;
    metrics_csv csv;
} bench_state;

// Rank 0's check that the echo is the message: a receive that silently did
// nothing would leave `in` zero and fail here.
static void check_echo(const dist_t *d, bench_state *b, size_t bytes) {
    device_to_host(&d->device, b->scratch, b->in, bytes);
    if (memcmp(b->scratch, b->sent, bytes) != 0)
        die("ping-pong of %zu bytes: the bytes that came back differ from the bytes sent", bytes);
}

// One row of the table (ranks 0 and 1 only).
static void measure_size(dist_t *d, const bench_options *o, bench_state *b, size_t bytes) {
    int iters = bench_iters_for(bytes, o->iters);
    if (d->rank == 0) {
        memset(b->scratch, 0, bytes);
        device_from_host(&d->device, b->in, b->scratch, bytes);
    }
    round_trips(d, b->out, b->in, bytes, o->warmup_iters ? bench_iters_for(bytes, o->warmup_iters) : 0, NULL);
    round_trips(d, b->out, b->in, bytes, iters, d->rank == 0 ? b->round_trip : NULL);
    if (d->rank != 0) return;
    check_echo(d, b, bytes);
    double sum = 0;
    for (int i = 0; i < iters; i++) sum += b->round_trip[i];
    double latency = timer_median(b->round_trip, iters) / 2, mean = sum / iters / 2;
    double gbps = (double)bytes / latency / 1e9;
    log_main("%14zu %8d %13.2f %10.2f %16.4f\n", bytes, iters, latency * 1e6, mean * 1e6, gbps);
    metrics_row(&b->csv, "%zu,%.3f,%.6f", bytes, latency * 1e6, gbps);
}

static void run_bench(dist_t *d, const bench_options *o) {
    bench_header(d, o);
    bench_state b = {0};
    size_t cap = o->maxbytes;
    if (d->rank < 2) {
        b.out = device_alloc(&d->device, cap);
        b.in = device_alloc(&d->device, cap);
    }
    if (d->rank == 0) {
        b.sent = xmalloc(cap);
        b.scratch = xmalloc(cap);
        b.round_trip = xcalloc((size_t)o->iters, sizeof(double));
        for (size_t i = 0; i < cap; i++) b.sent[i] = (unsigned char)(i * 7 + 3);
        device_from_host(&d->device, b.out, b.sent, cap);
        b.csv = bench_open_csv(d, "02_p2p", "pingpong", "size_bytes,latency_us,bandwidth_GBps", false);
    }
    for (size_t bytes = o->minbytes; d->rank < 2; bytes *= (size_t)o->stepfactor) {
        measure_size(d, o, &b, bytes);
        if (bench_last_size(bytes, o->maxbytes, o->stepfactor)) break;
    }
    if (d->rank == 0) {
        metrics_close(&b.csv);
        log_main("# CSV: %s\n", b.csv.path);
    }
    if (d->rank < 2) {
        device_free(&d->device, b.out);
        device_free(&d->device, b.in);
    }
    free(b.sent);
    free(b.scratch);
    free(b.round_trip);
    pg_barrier(d->pg);   // ranks 2.. wait here for the measurement to end
}

#endif
