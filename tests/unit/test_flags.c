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
    flag_t flags[] = {
        {"epochs", NULL, FLAG_INT, &epochs, "passes over the data", 1, 1000, NULL, NULL},
        {"lr", NULL, FLAG_DOUBLE, &lr, "learning rate", 0, 10, NULL, NULL},
        {"device", NULL, FLAG_STRING, &device, "where to compute", 1, 0, "auto|cpu|cuda", "TEST_FLAGS_DEVICE"},
        {"verbose_output", NULL, FLAG_BOOL, &verbose, "say more", 1, 0, NULL, NULL},
        {"minbytes", "b", FLAG_BYTES, &bytes, "smallest size", 1, 1 << 30, NULL, NULL},
    };
    flag_set set = {"test_flags", "flags parser test", NULL, flags, 5};
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
