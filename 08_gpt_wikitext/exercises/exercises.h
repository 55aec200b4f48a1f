// exercises.h - the function chapter 08's exercise asks you to write.
//
// You write it in layernorm_backward.c; check_layernorm_backward.c calls it,
// so keep this signature (gpt.h's, with gpt_real = float). Check it from
// the course's top folder with
//   make check-exercise EX=08/layernorm_backward
#ifndef EXERCISES_08_H
#define EXERCISES_08_H

// The backward pass of LayerNorm over N rows of C channels. ADDS the
// gradients into dinp (N x C), dweight (C) and dbias (C).
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C);

#endif
