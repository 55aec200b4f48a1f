// fuzz_gpt_weights - chapter 08's model-weights reader, gpt_load_safetensors
// (gpt/gpt.h): the model.safetensors that --generate loads.
//
// Input: the bytes of a weights file. Promises checked:
// - a refusal has a one-line reason;
// - an accepted model got every parameter from the file: the file holds
//   at least 4 bytes per parameter (so a tiny file cannot make the loader
//   build, and fill, a model of gigabytes from the configuration it claims).
#include "fuzz.h"
#include "gpt.h"

static fuzz_file file;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gpt_t m;
    char err[512] = "";
    fuzz_quiet();
    fuzz_file_put(&file, data, size);
    if (gpt_load_safetensors(&m, file.path, err, sizeof err)) {
        fuzz_check(m.num_params <= size / 4, "gpt weights: a model with more parameters than the file holds");
        gpt_free(&m);
    } else {
        fuzz_check(fuzz_one_line(err), "gpt weights: refusal without a one-line reason");
    }
    return 0;
}
