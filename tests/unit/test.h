// test.h - tiny unit-test helpers for C tests; output is read by tests/run.sh.
#ifndef COURSE_TEST_H
#define COURSE_TEST_H
#include <stdio.h>

static int test_failures = 0;

// EXPECT(name, condition, "why it failed, printf-style", ...)
#define EXPECT(name, cond, ...)                                                \
    do {                                                                       \
        if (cond) {                                                            \
            printf("PASS %s\n", name);                                         \
        } else {                                                               \
            printf("FAIL %s: ", name);                                         \
            printf(__VA_ARGS__);                                               \
            printf(" (%s:%d)\n", __FILE__, __LINE__);                          \
            test_failures++;                                                   \
        }                                                                      \
        fflush(stdout);                                                        \
    } while (0)

#define SKIP(name, ...)                                                        \
    do {                                                                       \
        printf("SKIP %s: ", name);                                             \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        fflush(stdout);                                                        \
    } while (0)

#endif
