// A small command-line driver of common/snapshot.h for tests/library/test_snapshot.sh,
// which needs separate processes (to kill one in the middle of a write).
// The tensors' values depend only on the step, so a reader can tell a
// complete snapshot of step N from anything else.
//
//   test_snapshot_tool save TEMPLATE STEP KEEP [MIB]  save step STEP of a series (MIB: size of an extra tensor)
//   test_snapshot_tool load TEMPLATE                  load the newest valid one: "loaded step N from PATH";
//                                                     exit 0, 3 when there is none, 1 when none is valid
//   test_snapshot_tool read PATH                      validate one file: "ok step N" or "refused: reason"
#include "snapshot.h"

static void fill(int64_t step, float *w, int nw, uint8_t *big, size_t nbig, int64_t *counter) {
    for (int i = 0; i < nw; i++) w[i] = (float)step + 0.5f * (float)i;
    for (size_t i = 0; i < nbig; i++) big[i] = (uint8_t)(i * 31 + (size_t)step);
    *counter = step * 7;
}

static int save(const char *tmpl, int64_t step, int keep, size_t mib) {
    enum { NW = 256 };
    float w[NW];
    int64_t counter;
    size_t nbig = mib << 20;
    uint8_t *big = xmalloc(nbig);
    char err[1200];
    fill(step, w, NW, big, nbig, &counter);
    safetensors_tensor t[] = {
        safetensors_tensor_of("w", "F32", w, 1, (int64_t[]){NW}),
        safetensors_tensor_of("big", "U8", big, 1, (int64_t[]){(int64_t)nbig}),
        safetensors_tensor_of("counter", "I64", &counter, 0, NULL),
    };
    safetensors_meta m[] = {safetensors_meta_of("step", "%" PRId64, step), safetensors_meta_of("features", "%d", NW)};
    bool ok = snapshot_save_step(tmpl, step, t, 3, m, 2, keep, err, sizeof err);
    free(big);
    if (!ok) die("cannot save step %" PRId64 ": %s", step, err);
    printf("saved step %" PRId64 "\n", step);
    return 0;
}

// The content of a loaded snapshot must be exactly what save wrote for its step.
static bool content_ok(const safetensors_t *s, int64_t *step) {
    char err[300];
    const safetensors_tensor *w = safetensors_find(s, "w"), *big = safetensors_find(s, "big"), *counter = safetensors_find(s, "counter");
    if (!snapshot_meta_i64(s, "step", step, err, sizeof err) || !w || !big || !counter || w->bytes != 256 * sizeof(float))
        return false;
    float want_w[256];
    int64_t want_counter;
    uint8_t *want_big = xmalloc(big->bytes);
    fill(*step, want_w, 256, want_big, big->bytes, &want_counter);
    bool same = !memcmp(w->data, want_w, sizeof want_w) && !memcmp(big->data, want_big, big->bytes) &&
                !memcmp(counter->data, &want_counter, sizeof want_counter);
    free(want_big);
    return same;
}

static int load(const char *tmpl) {
    safetensors_t s;
    char report[4000];
    int64_t step;
    int r = snapshot_load_latest(tmpl, &s, report, sizeof report);
    if (report[0]) fprintf(stderr, "%s\n", report);
    if (r == 0) { printf("no snapshot\n"); return 3; }
    if (r < 0) { printf("no valid snapshot\n"); return 1; }
    bool ok = content_ok(&s, &step);
    printf("%s step %" PRId64 " from %s\n", ok ? "loaded" : "wrong content in", step, s.path);
    safetensors_release(&s);
    return ok ? 0 : 1;
}

static int read_one(const char *path) {
    safetensors_t s;
    char err[1200];
    int64_t step;
    if (!snapshot_read(path, &s, err, sizeof err)) { printf("refused: %s\n", err); return 1; }
    bool ok = content_ok(&s, &step);
    printf("%s step %" PRId64 "\n", ok ? "ok" : "wrong content in", step);
    safetensors_release(&s);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *usage = "usage: test_snapshot_tool save TEMPLATE STEP KEEP [MIB] | load TEMPLATE | read PATH";
    if (argc == 3 && !strcmp(argv[1], "load")) return load(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "read")) return read_one(argv[2]);
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "save"))
        return save(argv[2], strtoll(argv[3], NULL, 10), atoi(argv[4]), argc == 6 ? (size_t)atoi(argv[5]) : 0);
    fprintf(stderr, "%s\n", usage);
    return EXIT_USAGE;
}
