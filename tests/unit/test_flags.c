// Unit test of common/flags.h: good input is parsed in every spelling.
// (Bad input exits the process, so tests/library/test_flags.sh checks that part.)
#include "flags.h"
#include "test.h"

int main(int argc, char **argv) {
    int epochs = 10;
    double lr = 0.01;
    const char *device = "auto";
    bool verbose = false;
    size_t bytes = 8;
    flag_set set = {.program = "test_flags", .summary = "flags parser test"};
    flag_int(&set, "epochs", &epochs, 1, 1000, "passes over the data");
    flag_double(&set, "lr", &lr, 0, 10, "learning rate");
    flag_choice(&set, "device", &device, "auto|cpu|cuda", "where to compute")->env = "TEST_FLAGS_DEVICE";
    flag_bool(&set, "verbose_output", &verbose, "say more");
    flag_bytes(&set, "minbytes", &bytes, 1, 1 << 30, "smallest size")->short_name = "b";
    // TEST_FLAGS_EXTRA=N adds N more flags: a set holds FLAGS_MAX, and one
    // more is a clear error, not a write past the end.
    const char *extra = getenv("TEST_FLAGS_EXTRA");
    bool extra_flag = false;
    for (int i = 0; extra && i < atoi(extra); i++) flag_bool(&set, "extra", &extra_flag, "one of many");
    if (argc > 1) { // the shell test drives bad input through here
        flags_parse(&set, argc, argv);
        printf("epochs=%d lr=%g device=%s verbose=%d bytes=%zu\n", epochs, lr, device, verbose, bytes);
        return 0;
    }
    char *good[] = {"prog", "--epochs=3", "--lr", "0.5", "--device", "cpu", "--verbose-output", "-b", "64K", NULL};
    flags_parse(&set, 9, good);
    EXPECT("flags: --name=value", epochs == 3, "epochs=%d", epochs);
    EXPECT("flags: --name value", lr == 0.5, "lr=%g", lr);
    EXPECT("flags: choices", !strcmp(device, "cpu"), "device=%s", device);
    EXPECT("flags: dash spelling of a bool", verbose, "verbose=%d", verbose);
    EXPECT("flags: short name with K suffix", bytes == 65536, "bytes=%zu", bytes);
    setenv("TEST_FLAGS_DEVICE", "cuda", 1);
    char *none[] = {"prog", NULL};
    flags_parse(&set, 1, none);
    EXPECT("flags: default from the environment", !strcmp(device, "cuda"), "device=%s", device);
    char *both[] = {"prog", "--device=cpu", NULL};
    flags_parse(&set, 2, both);
    EXPECT("flags: command line wins over the environment", !strcmp(device, "cpu"), "device=%s", device);
    return test_failures != 0;
}
