// spawn.h - start N ranks of a function as processes, like torch.multiprocessing.spawn.
//
// spawn(4, train, &args) turns one program into a 4-rank job on this machine
// without a launcher: the parent serves the rendezvous store (store_server.h) on a
// free loopback port, forks 4 children with RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, ... set as a launcher would, and each child calls
// train(rank, 4, &args) and exits with its return value. In the child,
// rendezvous("env://", ...) then finds the parent's store.
//
// The parent watches its children, and a job never half-runs or leaves
// orphans behind:
// - when one rank exits non-zero or dies by a signal, the parent says which
//   ("rank 2 exited with status 3", "rank 1 killed by signal SIGKILL"), sends
//   SIGTERM to the others, and SIGKILL to those still alive after a grace
//   period (COURSE_KILL_GRACE seconds, default 5);
// - Ctrl-C (SIGINT) or SIGTERM to the parent is passed on to every child in
//   the same way (a second one kills at once);
// - if the parent itself is killed, the kernel kills the children
//   (prctl PR_SET_PDEATHSIG), so no rank is left waiting for peers forever.
#ifndef COURSE_SPAWN_H
#define COURSE_SPAWN_H

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "launch_env.h"
#include "store_server.h"

typedef int (*spawn_fn)(int rank, int world_size, void *arg);

// The last SIGINT/SIGTERM the parent received while supervising, and how many.
static volatile sig_atomic_t spawn_signal = 0;
static volatile sig_atomic_t spawn_signal_count = 0;

static inline void spawn_on_signal(int sig) {
    spawn_signal = sig;
    spawn_signal_count++;
}

static inline const char *spawn_signal_name(int sig) {
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    return "an unnamed signal";
}

// COURSE_KILL_GRACE: seconds between SIGTERM and SIGKILL (default 5).
static inline double spawn_kill_grace(void) {
    const char *text = getenv("COURSE_KILL_GRACE");
    if (!text || !text[0]) return 5.0;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < 0 || v > 3600)
        die("COURSE_KILL_GRACE must be a number of seconds from 0 to 3600, got '%s'", text);
    return v;
}

static inline void spawn_setenv_int(const char *name, int value) {
    char text[32];
    snprintf(text, sizeof text, "%d", value);
    CHECK_SYS(setenv(name, text, 1));
}

// In the child: become rank `rank` and run fn. Never returns.
__attribute__((noreturn))
static inline void spawn_child(int rank, int world, int port, const char *token, pid_t parent,
                               spawn_fn fn, void *arg) {
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    CHECK_SYS(sigaction(SIGINT, &dfl, NULL));
    CHECK_SYS(sigaction(SIGTERM, &dfl, NULL));
    // Die with the parent; if it already died before this line, leave now.
    CHECK_SYS(prctl(PR_SET_PDEATHSIG, SIGKILL));
    if (getppid() != parent) _exit(1);
    spawn_setenv_int("RANK", rank);
    spawn_setenv_int("LOCAL_RANK", rank);
    spawn_setenv_int("WORLD_SIZE", world);
    spawn_setenv_int("LOCAL_WORLD_SIZE", world);
    spawn_setenv_int("GROUP_RANK", 0);
    spawn_setenv_int("MASTER_PORT", port);
    CHECK_SYS(setenv("MASTER_ADDR", "127.0.0.1", 1));
    CHECK_SYS(setenv("COURSE_AGENT_STORE", "1", 1));
    CHECK_SYS(setenv("COURSE_JOB_TOKEN", token, 1));
    course_set_rank(rank);
    int rc = fn(rank, world, arg);
    // _exit, after flushing stdio: a forked child must not run the parent's
    // exit handlers (LeakSanitizer's among them, which can deadlock on a
    // lock the parent's store thread held at fork time). Exit statuses keep
    // only 8 bits: make sure a failure never reads as success.
    fflush(NULL);
    _exit(rc == 0 ? 0 : (rc & 0xff) ? (rc & 0xff) : 1);
}

typedef struct {
    pid_t *pids;             // 0 once reaped
    int nprocs, alive;
    int result;              // what spawn() returns
    bool stopping;           // SIGTERM (or the parent's signal) sent to all
    bool killed;             // SIGKILL sent to all
    double kill_at;          // when the survivors get SIGKILL
} spawn_job;

static inline void spawn_signal_all(spawn_job *job, int sig) {
    for (int r = 0; r < job->nprocs; r++)
        if (job->pids[r] > 0) kill(job->pids[r], sig);
}

static inline void spawn_stop_all(spawn_job *job, int sig, int result) {
    if (job->stopping) return;
    job->stopping = true;
    job->result = result;
    job->kill_at = store_clock() + spawn_kill_grace();
    spawn_signal_all(job, sig);
}

static inline void spawn_report(int rank, int status, int alive) {
    fflush(stdout);
    char what[64], rest[64] = "";
    if (WIFSIGNALED(status)) snprintf(what, sizeof what, "killed by signal %s", spawn_signal_name(WTERMSIG(status)));
    else snprintf(what, sizeof what, "exited with status %d", WEXITSTATUS(status));
    if (alive > 0) snprintf(rest, sizeof rest, "; stopping the other %d rank%s", alive, alive == 1 ? "" : "s");
    fprintf(stderr, "spawn: rank %d %s%s\n", rank, what, rest);
}

// Reap the children that have ended; the first failure stops the rest.
// When a rank dies, its peers notice within milliseconds and exit with an
// error of their own, often within the same pass. A death by a signal is
// then the more likely root cause, so it is the one reported.
static inline void spawn_reap(spawn_job *job) {
    int culprit = -1, culprit_status = 0;
    for (int r = 0; r < job->nprocs; r++) {
        if (job->pids[r] <= 0) continue;
        int status = 0;
        pid_t done = waitpid(job->pids[r], &status, WNOHANG);
        if (done == 0 || (done < 0 && errno == EINTR)) continue;
        job->pids[r] = 0;
        job->alive--;
        if (done < 0) {   // ECHILD: someone else reaped it (SIGCHLD ignored?)
            if (!job->stopping) fprintf(stderr, "spawn: lost track of rank %d\n", r);
            spawn_stop_all(job, SIGTERM, 1);
            continue;
        }
        bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        bool better = culprit < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(culprit_status));
        if (failed && better) {
            culprit = r;
            culprit_status = status;
        }
    }
    if (culprit >= 0 && !job->stopping) {
        spawn_report(culprit, culprit_status, job->alive);
        spawn_stop_all(job, SIGTERM, 1);
    }
}

static inline void spawn_supervise(spawn_job *job) {
    while (job->alive > 0) {
        // The parent's signal first: after Ctrl-C in a terminal the children got
        // SIGINT too, and their deaths are not failures of their own.
        int sig = spawn_signal;
        if (sig && !job->stopping) {
            fprintf(stderr, "spawn: got %s; stopping all %d ranks\n", spawn_signal_name(sig),
                    job->alive);
            spawn_stop_all(job, sig, 128 + sig);
        }
        spawn_reap(job);
        if (job->alive == 0) break;
        bool again = spawn_signal_count > 1;   // a second Ctrl-C: no more patience
        if (job->stopping && !job->killed && (again || store_clock() >= job->kill_at)) {
            if (!again)
                fprintf(stderr, "spawn: %d rank%s still running %g s after being told to stop; "
                        "sending SIGKILL\n", job->alive, job->alive == 1 ? "" : "s",
                        spawn_kill_grace());
            spawn_signal_all(job, SIGKILL);
            job->killed = true;
        }
        store_sleep(0.01);   // a short poll: the first failure is noticed at once
    }
}

// Forks the children; returns how many were started.
static inline int spawn_fork_all(spawn_job *job, store_server_t *server, const char *token,
                                 spawn_fn fn, void *arg) {
    pid_t parent = getpid();
    int port = store_server_port(server);
    for (int r = 0; r < job->nprocs; r++) {
        fflush(NULL);   // or buffered output would be printed once per child
        store_server_lock(server);
        pid_t pid = fork();
        if (pid == 0) {
            store_server_forget_in_child(server);
            spawn_child(r, job->nprocs, port, token, parent, fn, arg);
        }
        store_server_unlock(server);
        if (pid < 0) {
            fprintf(stderr, "spawn: fork for rank %d failed: %s; stopping the others\n", r,
                    strerror(errno));
            return r;
        }
        job->pids[r] = pid;
        job->alive++;
    }
    return job->nprocs;
}

// Runs fn(rank, nprocs, arg) in nprocs child processes and waits for them.
// Returns 0 when every rank returned 0; 1 when one failed; 128 + signal when
// the parent was interrupted.
static inline int spawn(int nprocs, spawn_fn fn, void *arg) {
    if (nprocs < 1 || nprocs > 4096) die("spawn: nprocs must be from 1 to 4096, got %d", nprocs);
    // Forked children would inherit the MPI launcher's variables and all
    // claim the same MPI rank: a launcher that starts the ranks itself and
    // a program that starts its own do not mix.
    if (launch_env_by_mpi())
        die("spawn: this program starts its own %d rank(s), but mpirun (or srun) started it, "
            "and starts the ranks itself; run it without mpirun (it spawns), or use a chapter "
            "that reads its rank from the launcher (02, 03, 05-08)", nprocs);
    spawn_kill_grace();   // check the variable before starting anything
    char token[40];
    snprintf(token, sizeof token, "%016" PRIx64 "%016" PRIx64, store_random_u64(),
             store_random_u64());
    store_server_t *server = store_server_start("127.0.0.1", 0, token);
    struct sigaction on = {0}, old_int, old_term;
    on.sa_handler = spawn_on_signal;   // no SA_RESTART: sleeps end early on a signal
    sigemptyset(&on.sa_mask);
    spawn_signal = spawn_signal_count = 0;
    CHECK_SYS(sigaction(SIGINT, &on, &old_int));
    CHECK_SYS(sigaction(SIGTERM, &on, &old_term));
    spawn_job job = {.pids = xcalloc((size_t)nprocs, sizeof(pid_t)), .nprocs = nprocs};
    if (spawn_fork_all(&job, server, token, fn, arg) < nprocs) spawn_stop_all(&job, SIGTERM, 1);
    spawn_supervise(&job);
    CHECK_SYS(sigaction(SIGINT, &old_int, NULL));
    CHECK_SYS(sigaction(SIGTERM, &old_term, NULL));
    free(job.pids);
    store_server_stop(server);
    return job.result;
}

#endif
