// test_ddprun_worker - a worker for tests/tools/test_ddprun.sh, not a unit test.
//
// It does what its arguments say, in order, so that one binary can play a
// good worker, a failing one, a crashing one or a slow one under ddprun:
//   env                  print the launcher's variables, one NAME=value a line
//   echo TEXT            print TEXT on stdout;  echo-err TEXT: on stderr
//   partial              print one line in two pieces, 0.2 s apart
//   tail TEXT            print TEXT without a final newline
//   sleep SECONDS        sleep
//   ignore-term          ignore SIGTERM (to test the SIGKILL after the grace period)
//   exit-if-rank R CODE  exit with CODE when RANK is R (R = -1: every rank)
//   exit-if-first R CODE the same, only when TORCHELASTIC_RESTART_COUNT is 0
//   kill-if-rank R SIG   kill itself with signal number SIG when RANK is R
// Run without arguments it prints its variables and exits 0.
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const launch_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "COURSE_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "COURSE_JOB_TOKEN",
    "COURSE_AGENT_STORE", "OMP_NUM_THREADS",
};

static int env_number(const char *name) {
    const char *text = getenv(name);
    return text ? atoi(text) : -1;
}

static void print_env(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof launch_vars[0]; i++) {
        const char *value = getenv(launch_vars[i]);
        printf("%s=%s\n", launch_vars[i], value ? value : "(unset)");
    }
    fflush(stdout);
}

static void sleep_seconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
}

static bool is_my_rank(const char *text) {
    int want = atoi(text);
    return want == -1 || want == env_number("RANK");
}

// Runs the action at argv[i]; returns how many arguments it used.
static int run_action(int argc, char **argv, int i) {
    const char *a = argv[i];
    int left = argc - i - 1;
    if (!strcmp(a, "env")) print_env();
    else if (!strcmp(a, "echo") && left >= 1) { printf("%s\n", argv[i + 1]); fflush(stdout); return 2; }
    else if (!strcmp(a, "echo-err") && left >= 1) { fprintf(stderr, "%s\n", argv[i + 1]); return 2; }
    else if (!strcmp(a, "tail") && left >= 1) { printf("%s", argv[i + 1]); fflush(stdout); return 2; }
    else if (!strcmp(a, "partial")) {
        printf("first half, ");
        fflush(stdout);
        sleep_seconds(0.2);
        printf("second half\n");
        fflush(stdout);
    } else if (!strcmp(a, "sleep") && left >= 1) { sleep_seconds(atof(argv[i + 1])); return 2; }
    else if (!strcmp(a, "ignore-term")) signal(SIGTERM, SIG_IGN);
    else if (!strcmp(a, "exit-if-rank") && left >= 2) {
        if (is_my_rank(argv[i + 1])) exit(atoi(argv[i + 2]));
        return 3;
    } else if (!strcmp(a, "exit-if-first") && left >= 2) {
        if (is_my_rank(argv[i + 1]) && env_number("TORCHELASTIC_RESTART_COUNT") == 0)
            exit(atoi(argv[i + 2]));
        return 3;
    } else if (!strcmp(a, "kill-if-rank") && left >= 2) {
        if (is_my_rank(argv[i + 1])) {
            signal(atoi(argv[i + 2]), SIG_DFL);
            raise(atoi(argv[i + 2]));
        }
        return 3;
    } else {
        fprintf(stderr, "test_ddprun_worker: unknown action '%s' (or missing arguments)\n", a);
        exit(99);
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc == 1) print_env();
    for (int i = 1; i < argc;) i += run_action(argc, argv, i);
    return 0;
}
