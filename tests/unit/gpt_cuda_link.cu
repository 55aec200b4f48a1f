// gpt_cuda_link.cu - links chapter 08's GPU model into the unit tests.
//
// tests/Makefile compiles every unit/*.cu and links it into every unit test
// (CUDA build only), so test_gpt_cuda.c can call gpt_cuda_*. Its exported
// names all begin with gpt_cuda_ and everything else in it is static, so
// the other tests link as before.
#include "../../08_gpt_wikitext/gpt_cuda.cu"
