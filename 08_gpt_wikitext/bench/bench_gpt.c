// bench_gpt.c - training throughput of gpt.h on synthetic tokens (no data
// set, no tokenizer): what the chapter's README quotes as tokens/s.
//
// Build and run from 08_gpt_wikitext/:  make bench
//   build/bench_gpt [B] [steps] [default|tiny]
// Prints the median time of the training steps after 2 warm-up steps.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../gpt.h"
#include "timer.h"

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// As in 08_gpt_wikitext.c: OpenMP threads spin only briefly at barriers,
// so that other work on the machine does not make every barrier slow.
static void spin_briefly_in_openmp(char **argv) {
    if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv("/proc/self/exe", argv); // returns only if it failed
}

int main(int argc, char **argv) {
    spin_briefly_in_openmp(argv);
    int B = argc > 1 ? atoi(argv[1]) : 8, steps = argc > 2 ? atoi(argv[2]) : 10;
    gpt_config cfg = {5000, 0, 0, 0, 0};
    if (!gpt_preset(argc > 3 ? argv[3] : "default", &cfg) || B < 1 || steps < 1) {
        fprintf(stderr, "usage: bench_gpt [B>=1] [steps>=1] [default|tiny]\n");
        return 2;
    }
    int T = cfg.block_size;
    gpt_blas_single_threaded();
    gpt_t m;
    gpt_init(&m, cfg, 1);
    rng_t rng = rng_seed(7);
    uint16_t *tokens = xmalloc(sizeof(uint16_t) * ((size_t)B * T + 1));
    for (int i = 0; i < B * T + 1; i++) tokens[i] = (uint16_t)rng_below(&rng, (uint64_t)cfg.vocab_size);
    double *times = xmalloc(sizeof(double) * (size_t)steps);
    double fwd = 0, bwd = 0;
    for (int s = -2; s < steps; s++) {
        double t0 = now_seconds();
        gpt_zero_grad(&m);
        float loss = gpt_forward(&m, tokens, tokens + 1, B, T);
        double t1 = now_seconds();
        gpt_backward(&m, 1.0f);
        double t2 = now_seconds();
        gpt_clip_grad_norm(&m, 1.0f);
        gpt_adamw_step(&m, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f);
        double t3 = now_seconds();
        if (s >= 0) times[s] = t3 - t0, fwd += t1 - t0, bwd += t2 - t1;
        if (s == steps - 1) printf("last loss %.4f\n", loss);
    }
    qsort(times, (size_t)steps, sizeof(double), compare_doubles);
    double median = times[steps / 2];
    printf("gpt %s: %zu params, B=%d T=%d, %d threads, matmul: %s\n", argc > 3 ? argv[3] : "default",
           m.num_params, B, T, gpt_num_threads(), gpt_matmul_backend());
    printf("median step %.1f ms (forward %.1f, backward %.1f mean) -> %.0f tokens/s\n", median * 1e3,
           fwd / steps * 1e3, bwd / steps * 1e3, B * T / median);
    free(times);
    free(tokens);
    gpt_free(&m);
    return 0;
}
