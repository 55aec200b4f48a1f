// test_gpt_compare A B - how far apart two saved GPT models are
// (tests/chapters/test_10_tensor_parallel.sh: a tensor-parallel run against
// one process). Both files are read as chapter 08 reads them
// (gpt_load_safetensors) and must have the same configuration. Prints
//   relative difference R: |a - b| / |a| over all parameters (L2 norms)
//   worst tensor NAME: max |a - b| D, max |a| S
// R is the comparison: two runs that add the same numbers in other orders
// (data or tensor parallelism) differ by rounding, R ~ 1e-8 after a few
// steps in fp32. The worst tensor is for the reader: it is usually
// attn.c_attn.bias, whose keys' part has a gradient that is 0 in exact
// arithmetic (softmax ignores a shift of all scores), so what AdamW sees
// there is rounding, scaled up to a full step; its values differ
// relatively much between any two such runs, but are tiny.
// Exit 0, or 1 with a one-line reason.
#include <math.h>

#include "../../gpt/gpt.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s A.safetensors B.safetensors\n", argv[0]);
        return 2;
    }
    gpt_t a, b;
    char err[2048];
    if (!gpt_load_safetensors(&a, argv[1], err, sizeof err) || !gpt_load_safetensors(&b, argv[2], err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (memcmp(&a.cfg, &b.cfg, sizeof a.cfg) != 0) {
        fprintf(stderr, "error: %s and %s are models of different configurations\n", argv[1], argv[2]);
        return 1;
    }
    double worst = -1, worst_diff = 0, worst_scale = 0, diff2 = 0, norm2 = 0;
    const char *worst_name = "";
    for (int t = 0; t < a.num_tensors; t++) {
        const gpt_tensor *ten = &a.tensors[t];
        double diff = 0, scale = 0;
        for (size_t i = ten->offset; i < ten->offset + ten->count; i++) {
            double d = (double)a.params[i] - (double)b.params[i];
            diff = fmax(diff, fabs(d));
            scale = fmax(scale, fabs((double)a.params[i]));
            diff2 += d * d, norm2 += (double)a.params[i] * a.params[i];
        }
        double rel = diff / fmax(scale, 1e-30);
        if (rel > worst) worst = rel, worst_diff = diff, worst_scale = scale, worst_name = ten->name;
    }
    printf("relative difference %.3g: |a - b| / |a| over all parameters\n", sqrt(diff2) / fmax(sqrt(norm2), 1e-30));
    printf("worst tensor %s: max |a - b| %.3g, max |a| %.3g\n", worst_name, worst_diff, worst_scale);
    gpt_free(&a), gpt_free(&b);
    return 0;
}
