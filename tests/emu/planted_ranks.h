// planted_ranks.h - two ranks, each a process on its own GPU, for the
// planted bugs of collectives: the unique id is made before the fork (and
// before any CUDA call: a CUDA context does not survive fork()), each
// process runs rank_main, and the program fails if either rank does.
#ifndef PLANTED_RANKS_H
#define PLANTED_RANKS_H
#include <sys/wait.h>
#include <unistd.h>

#include <nccl.h>

#include "planted.h"

static inline int planted_two_ranks(int (*rank_main)(int rank, ncclUniqueId id, bool fixed), bool fixed) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
    fflush(stdout);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] < 0) return 1;
        if (pids[r] == 0) {
            int status = rank_main(r, id, fixed);
            fflush(NULL);
            _exit(status);
        }
    }
    int failed = 0;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    printf("%d of 2 ranks failed\n", failed);
    return failed ? 1 : 0;
}
#endif
