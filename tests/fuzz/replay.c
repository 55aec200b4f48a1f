// replay.c - main() for fuzz targets built without libFuzzer.
//
// Usage: fuzz_NAME FILE_OR_DIR...   Runs every file (directories: every
// file in them, in name order) through LLVMFuzzerTestOneInput once, and
// prints "NAME: replayed N inputs". A crash, a sanitizer report or a
// broken invariant ends it with a non-zero status; with FUZZ_REPLAY_VERBOSE
// set, the last "replaying FILE" line before the report names the input.
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replayed;

static void replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        dprintf(2, "replay: cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    size_t cap = 1 << 16, len = 0, n;
    uint8_t *data = malloc(cap);
    while (data && (n = fread(data + len, 1, cap - len, f)) > 0)
        if ((len += n) == cap) data = realloc(data, cap *= 2);
    if (!data || ferror(f)) {
        dprintf(2, "replay: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    // An exact-size copy, so that the sanitizers see a read past the end.
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) abort();
    memcpy(exact, data, len);
    free(data);
    if (getenv("FUZZ_REPLAY_VERBOSE")) dprintf(2, "replaying %s\n", path);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    replayed++;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static void replay_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        dprintf(2, "replay: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (!S_ISDIR(st.st_mode)) {
        replay_file(path);
        return;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name);
    if (n < 0) {
        dprintf(2, "replay: cannot list %s: %s\n", path, strerror(errno));
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        char child[4096];
        if (names[i]->d_name[0] != '.') {
            snprintf(child, sizeof child, "%s/%s", path, names[i]->d_name);
            replay_path(child);
        }
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    FILE *out = stdout; // the target may send stdout to /dev/null
    for (int i = 1; i < argc; i++) replay_path(argv[i]);
    const char *name = strrchr(argv[0], '/');
    fprintf(out, "%s: replayed %d inputs\n", name ? name + 1 : argv[0], replayed);
    return 0;
}
