// ddprun - the course's launcher: run N copies of a program as one distributed job.
//
// It does for a C program what torchrun does for a Python script:
//   1. The launcher of node 0 serves the rendezvous store (common/store.h) at
//      MASTER_ADDR:MASTER_PORT. Every node's launcher joins it, says how many
//      workers it runs, and global ranks are handed out node by node.
//   2. It starts the workers with fork + exec, each with torchrun's variables
//      (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), so the
//      workers' own rendezvous() finds the launcher's store.
//   3. It relays their output line by line, prefixed with "[rank R]: ".
//   4. It watches them. When one fails, it stops the others (SIGTERM, then
//      SIGKILL after a grace period) and either restarts every worker on every
//      node (--max_restarts) or ends the job, naming the rank that failed.
//
// The launchers of a multi-node job talk only through keys under "ddprun/" in
// the store: node/<R> (who joined), beat/<R> (a heartbeat counter),
// restart/<G> and failed (what happened), stopped/<G> and done/<G> (barriers).
// The workers' own keys live under "attempt<G>/..." (store.h's rendezvous uses
// COURSE_ATTEMPT), so a restarted job never sees stale keys.
//
// That is the static rendezvous: every node is given --nnodes=N and its
// --node_rank. The c10d rendezvous (--rdzv_backend=c10d, or an elastic
// --nnodes=MIN:MAX) numbers the nodes itself, in rounds: a round forms when
// MIN launchers have joined and no more come for a moment (or MAX have), and
// a node that joins or is lost later starts the next round, in which every
// worker restarts with the new world size (the section "elastic rounds").
//
// Usage: ddprun --nproc_per_node=4 ./my_program --its --flags   (see --help)
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "flags.h"
#include "netif.h"
#include "store.h"

extern char **environ;

enum {
    LINE_MAX_BYTES = 4096,  // a longer line without '\n' is relayed in pieces
    TEXT_MAX = 1024,        // messages kept in the store (reasons, node records)
};
#define HEARTBEAT_PERIOD_S 1.0   // launchers of a multi-node job beat this often
#define NODE_SILENCE_MAX_S 30.0  // a node silent this long is taken for dead
#define REPLACE_SILENCE_S 5.0    // a new launcher may take the place of one silent this long
#define PROGRESS_PERIOD_S 5.0    // "waiting for nodes" lines
#define KILL_WAIT_S 5.0          // how long SIGKILL may take to be reaped
#define WRITE_STALL_MAX_S 10.0   // a terminal that takes no output this long is dropped

// ================================================================ options

typedef struct {
    const char *nproc_text;   // "4", "gpu", "cpu" or "auto"
    const char *nnodes_text;  // "2", or "MIN:MAX" (elastic)
    int nproc, nnodes, node_rank;
    int min_nodes, max_nodes; // of --nnodes; static: both nnodes
    const char *rdzv_backend, *rdzv_endpoint, *rdzv_conf;
    bool dynamic;             // the c10d rendezvous: nodes numbered in order of arrival
    double last_call;         // c10d: how long a round waits for more nodes once MIN have joined
    int is_host;              // c10d: serve the store here: 1 yes, 0 no, -1 if the endpoint is local
    const char *master_addr;
    int master_port;
    bool standalone, no_python, use_env, pass_local_rank, module;
    const char *start_method, *role, *run_path;   // torchrun's; see parse_options
    const char *local_addr;                        // torchrun's: this node's address for its peers
    const char *ranks_filter; // --local_ranks_filter: "0,3"; NULL: every local rank
    uint64_t shown_ranks;     // bit L: local rank L's lines go to the terminal
    int max_restarts;
    double monitor_interval, rdzv_timeout;
    const char *run_id, *log_dir;
    int redirects, tee;       // 0 none, 1 stdout, 2 stderr, 3 both
    char **program_argv;      // PROGRAM ARGS..., NULL-terminated
} options_t;

// ================================================================ job state

typedef struct {
    int fd;            // read end of the worker's pipe; -1 once closed
    int console;       // 1 or 2: where its lines go on the terminal; -1: file only
    int file;          // per-rank log file, or -1
    size_t len;        // bytes in buf still waiting for their '\n'
    char buf[LINE_MAX_BYTES];
} stream_t;

typedef struct {
    int rank, local_rank;
    pid_t pid;         // also its process group id; 0 before the first start
    bool running;
    int wait_status;
    stream_t out, err;
} worker_t;

typedef struct {
    bool set;
    int rank, local_rank;
    pid_t pid;
    int wait_status;
    int64_t when_us;   // wall clock (CLOCK_REALTIME), comparable across nodes
    int node;          // where it happened
    char host[256];
} failure_t;

typedef enum { OUTCOME_SUCCEEDED, OUTCOME_RESTART, OUTCOME_FAILED, OUTCOME_SIGNALED } outcome_t;

typedef struct {
    options_t opt;
    flag_set *flags;            // for usage errors found after parsing
    char *program_path;         // PROGRAM resolved like a shell does
    char host[256];
    char run_id[80], token[40];
    const char *master_addr;
    int master_port;            // the port actually served (standalone: picked by the OS)
    pid_t launcher_pid;
    int devnull;                // the workers' stdin
    double kill_grace;
    bool set_omp;               // give workers OMP_NUM_THREADS=1
    // layout of the job, known after the nodes have met
    int nnodes, node_rank;      // this attempt's (static: the flags')
    int world_size, rank_offset;
    int *node_nproc;
    char **node_host;
    char **node_net;            // "eth0 10.0.0.2 MTU 1500": how each node reaches the store
    int *node_beat;             // the heartbeat key of each node (static: its node rank)
    int beat_id;                // this launcher's heartbeat key
    // workers of the current attempt
    int generation;             // = COURSE_ATTEMPT, the same on every node
    int restarts;               // after failures: TORCHELASTIC_RESTART_COUNT (static: = generation)
    worker_t *workers;
    int nworkers;
    bool stopping;              // exits now are our doing, not failures
    failure_t failure;          // first failure of this attempt
    bool failure_posted;        // this attempt's ddprun/failure/<G>/<node> is written
    struct pollfd *pfds;
    stream_t **pstreams;
    int *pranks;
    bool console_broken[3];
    // signals to the launcher
    int signal_pipe[2];
    int pending_signal, signal_count;
    // store and the other nodes
    store_server_t *server;
    store_t *store;
    double next_beat, next_silence_check;
    bool nodes_met;             // every node has joined: heartbeats count from now on
    int64_t *beat_seen;
    double *beat_changed;
    bool failure_known;         // the store already says the job failed
    bool replacing;             // this launcher takes the place of one that died
    bool silence_said;          // this barrier has said which node it waits for
    int64_t *replaced_seen;     // how often each node's launcher has been replaced so far
    bool gave_up;               // a local failure with no restarts left ends the job
    bool leaving;               // c10d: a signal takes this node out; the job goes on
    char reason[2 * TEXT_MAX];  // why the job ends or restarts, for messages
    char net[160];              // "eth0 10.0.0.2 MTU 1500": this node's way to the others
    char net_how[TEXT_MAX];     // the same, and why that interface
} job_t;

static job_t the_job;

// ================================================================ small helpers

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);   // an early wake-up by a signal is fine: callers loop
}

static char *xstrdup(const char *text) {
    size_t n = strlen(text) + 1;
    char *copy = xmalloc(n);
    memcpy(copy, text, n);
    return copy;
}

// A launcher message on stderr, one line, always starting with "ddprun: ".
__attribute__((format(printf, 1, 2)))
static void say(const char *fmt, ...) {
    char line[3 * TEXT_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    fprintf(stderr, "ddprun: %s\n", line);
}

static const char *signal_name(int sig) {
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

static int64_t wall_clock_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

// "exited with status 3" or "was killed by signal 9 (SIGKILL)".
static void describe_exit(int wait_status, char *buf, size_t size) {
    if (WIFEXITED(wait_status)) {
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(wait_status));
    } else {
        int sig = WTERMSIG(wait_status);
        snprintf(buf, size, "was killed by signal %d (%s%s)", sig, signal_name(sig),
                 WCOREDUMP(wait_status) ? ", core dumped" : "");
    }
}

// "rank 3 (node 1, local 1, pid 1234)"; the node only matters with several.
static void describe_worker(const job_t *job, int rank, int local_rank, pid_t pid, char *buf,
                            size_t size) {
    if (job->nnodes > 1)
        snprintf(buf, size, "rank %d (node %d, local %d, pid %d)", rank, job->node_rank,
                 local_rank, (int)pid);
    else
        snprintf(buf, size, "rank %d (local %d, pid %d)", rank, local_rank, (int)pid);
}

// "ranks 2-4" or "rank 2".
static void describe_ranks(int first, int count, char *buf, size_t size) {
    if (count == 1) snprintf(buf, size, "rank %d", first);
    else snprintf(buf, size, "ranks %d-%d", first, first + count - 1);
}

// COURSE_KILL_GRACE: seconds between SIGTERM and SIGKILL (default 5; torchrun waits 30).
static double kill_grace_from_env(const flag_set *set) {
    const char *text = getenv("COURSE_KILL_GRACE");
    if (!text || !text[0]) return 5.0;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= 0 && v <= 3600))
        flags_fail(set, "COURSE_KILL_GRACE must be a number of seconds from 0 to 3600, got '%s'",
                   text);
    return v;
}

static void random_hex(char *out, size_t hex_digits) {
    unsigned char bytes[32];
    size_t n = (hex_digits + 1) / 2;
    if (n > sizeof bytes) n = sizeof bytes;
    ssize_t got = getrandom(bytes, n, 0);
    if (got != (ssize_t)n) die("getrandom failed: %s", strerror(errno));
    for (size_t i = 0; i < n && 2 * i < hex_digits; i++) sprintf(out + 2 * i, "%02x", bytes[i]);
    out[hex_digits] = '\0';
}

// The job token of a multi-node job: every node must compute the same one
// without talking first, so it comes from what they share (run id and port).
// It keeps a stale worker of another job from joining this one; it is not a secret.
static void token_from_run_id(const char *run_id, int port, char *out, size_t size) {
    uint64_t h = 0xcbf29ce484222325ull;   // FNV-1a
    char text[128];
    snprintf(text, sizeof text, "ddprun:%s:%d", run_id, port);
    for (const char *c = text; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    snprintf(out, size, "%016llx", (unsigned long long)h);
}

// Write all of buf, waiting (with a deadline) when the terminal or pipe is full.
static bool write_all(int fd, const char *buf, size_t len) {
    double deadline = now_s() + WRITE_STALL_MAX_S;
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EAGAIN && now_s() < deadline) {
            struct pollfd p = {fd, POLLOUT, 0};
            poll(&p, 1, 100);
        } else if (!(n < 0 && errno == EINTR)) {
            return false;   // EPIPE (nobody reads our output any more), a stall, ...
        }
    }
    return true;
}

// ================================================================ options

static int count_gpus(void) {
#ifdef COURSE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;   // no driver or no GPU: none
    return n;
#else
    return 0;   // a CPU-only build cannot use GPUs, so it sees none
#endif
}

static int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

// --nproc_per_node: a number, or gpu (one per GPU), cpu (one per core), or
// auto (one per GPU if there are GPUs, else one per core), as torchrun.
static int parse_nproc(const flag_set *set, const char *text) {
    int n;
    if (!strcmp(text, "gpu")) {
        n = count_gpus();
        if (n == 0) flags_fail(set, "--nproc_per_node=gpu, but this build sees no GPU");
    } else if (!strcmp(text, "cpu")) {
        n = cpu_count();
    } else if (!strcmp(text, "auto")) {
        n = count_gpus();
        if (n == 0) n = cpu_count();
    } else {
        char *end;
        errno = 0;
        long v = strtol(text, &end, 10);
        if (end == text || *end || errno || v < 1 || v > 1024)
            flags_fail(set, "--nproc_per_node expects a number from 1 to 1024, or gpu, cpu or "
                       "auto, got '%s'", text);
        n = (int)v;
    }
    return n;
}

// --nnodes: N, or MIN:MAX, an elastic job that runs on any number of nodes
// in that range (as torchrun).
static void parse_nnodes(const flag_set *set, const char *text, options_t *o) {
    char *end;
    errno = 0;
    long lo = strtol(text, &end, 10), hi = lo;
    bool ok = end != text && !errno;
    if (ok && *end == ':') {
        const char *rest = end + 1;
        hi = strtol(rest, &end, 10);
        ok = end != rest && !errno;
    }
    if (!ok || *end || lo < 1 || hi < 1 || lo > 4096 || hi > 4096)
        flags_fail(set, "--nnodes expects a number of nodes from 1 to 4096, or MIN:MAX, got '%s'",
                   text);
    if (hi < lo) flags_fail(set, "--nnodes=%s: MIN is above MAX", text);
    o->min_nodes = (int)lo;
    o->max_nodes = o->nnodes = (int)hi;
}

// --rdzv_endpoint HOST[:PORT] ([IPv6]:PORT too): where the c10d store is,
// torchrun's name for --master_addr and --master_port (its default port 29400).
static void parse_endpoint(const flag_set *set, const char *text, options_t *o) {
    static char host[256];
    const char *colon = strrchr(text, ':');
    bool bracketed = text[0] == '[';
    if (bracketed) {
        const char *close = strchr(text, ']');
        if (!close || (close[1] && close[1] != ':'))
            flags_fail(set, "--rdzv_endpoint expects HOST:PORT or [IPv6]:PORT, got '%s'", text);
        colon = close[1] == ':' ? close + 1 : NULL;
        snprintf(host, sizeof host, "%.*s", (int)(close - text - 1), text + 1);
    } else if (colon && strchr(text, ':') != colon) {
        colon = NULL;   // a bare IPv6 address: no port
        snprintf(host, sizeof host, "%s", text);
    } else {
        snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - text) : (int)strlen(text), text);
    }
    o->master_port = 29400;
    if (colon) {
        char *end;
        errno = 0;
        long port = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || errno || port < 1 || port > 65535)
            flags_fail(set, "--rdzv_endpoint expects a port from 1 to 65535 after the ':', got '%s'",
                       text);
        o->master_port = (int)port;
    }
    if (!host[0]) flags_fail(set, "--rdzv_endpoint needs a host, got '%s'", text);
    o->master_addr = host;
}

// --rdzv_conf KEY=VALUE,...: the c10d rendezvous's settings that ddprun has.
static void parse_rdzv_conf(const flag_set *set, const char *text, options_t *o) {
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", text);
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *end;
        if (!eq) flags_fail(set, "--rdzv_conf expects KEY=VALUE,..., got '%s'", item);
        *eq = '\0';
        const char *value = eq + 1;
        errno = 0;
        double v = strtod(value, &end);
        bool number = end != value && !*end && !errno && v >= 0 && v <= 1e6;
        if (!strcmp(item, "join_timeout") && number) o->rdzv_timeout = v;
        else if (!strcmp(item, "last_call_timeout") && number) o->last_call = v;
        else if (!strcmp(item, "is_host") && (!strcmp(value, "true") || !strcmp(value, "1")))
            o->is_host = 1;
        else if (!strcmp(item, "is_host") && (!strcmp(value, "false") || !strcmp(value, "0")))
            o->is_host = 0;
        else if (!strcmp(item, "join_timeout") || !strcmp(item, "last_call_timeout") ||
                 !strcmp(item, "is_host"))
            flags_fail(set, "--rdzv_conf %s=%s: expects %s", item, value, strcmp(item, "is_host")
                       ? "a number of seconds" : "true or false");
        else
            flags_fail(set, "--rdzv_conf: ddprun knows join_timeout, last_call_timeout and "
                       "is_host, not '%s'", item);
    }
}

// static (the default): every node is given its --node_rank. c10d: the
// launchers number themselves at the store, which one of them serves.
static void parse_backend(const flag_set *set, options_t *o) {
    const char *b = o->rdzv_backend;
    if (b && strcmp(b, "static") && strcmp(b, "c10d"))
        flags_fail(set, "--rdzv_backend=%s is not one ddprun has: c10d (the course's store, served "
                   "by one of the launchers) or static (each node given its --node_rank)", b);
    bool elastic = o->min_nodes != o->max_nodes;
    if (elastic && b && !strcmp(b, "static"))
        flags_fail(set, "--nnodes=%s asks for an elastic job, which needs --rdzv_backend=c10d: "
                   "the static rendezvous has a fixed --node_rank for every node", o->nnodes_text);
    o->dynamic = elastic || (b && !strcmp(b, "c10d"));
}

// --local_ranks_filter 0,3: the local ranks whose lines reach the terminal
// (all of them still go to --log_dir's files), as a bit set.
static uint64_t parse_ranks_filter(const flag_set *set, const char *text, int nproc) {
    uint64_t bits = 0;
    const char *p = text;
    do {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= nproc || r >= 64 || (*end && *end != ','))
            flags_fail(set, "--local_ranks_filter=%s: give local ranks 0 to %d, separated by commas",
                       text, (nproc < 64 ? nproc : 64) - 1);
        bits |= (uint64_t)1 << r;
        p = *end ? end + 1 : end;
    } while (*p);
    return bits;
}

static void check_options(const flag_set *set, options_t *o) {
    o->nproc = parse_nproc(set, o->nproc_text);
    parse_nnodes(set, o->nnodes_text, o);
    if (o->rdzv_endpoint) parse_endpoint(set, o->rdzv_endpoint, o);
    if (o->rdzv_conf) parse_rdzv_conf(set, o->rdzv_conf, o);
    parse_backend(set, o);
    if (o->standalone && o->dynamic)
        flags_fail(set, "--standalone is for one node; a c10d or elastic job names its store with "
                   "--rdzv_endpoint=HOST:PORT, the same on every node");
    if (!o->dynamic && o->node_rank >= o->nnodes)
        flags_fail(set, "--node_rank=%d is not below --nnodes=%d (node ranks count from 0)",
                   o->node_rank, o->nnodes);
    if (o->standalone && o->nnodes > 1)
        flags_fail(set, "--standalone is for one node; with --nnodes=%d give every node the "
                   "same --master_addr and --master_port instead", o->nnodes);
    if ((o->nnodes > 1 || o->dynamic) && o->master_port == 0)
        flags_fail(set, "--master_port=0 (any free port) works only on one node: the other "
                   "nodes could not know which port node 0 got");
    if (!o->master_addr[0]) flags_fail(set, "--master_addr must not be empty");
    if (o->run_id && (!o->run_id[0] || strlen(o->run_id) > 64))
        flags_fail(set, "--run_id must have 1 to 64 characters");
    // torchrun's ways of naming a Python program: ddprun runs PROGRAM itself.
    if (o->module)
        flags_fail(set, "-m/--module runs a Python module under torchrun; ddprun runs a program: "
                   "give its path (./program, or a name in PATH)");
    if (o->run_path)
        flags_fail(set, "--run_path runs a Python file by path under torchrun; ddprun runs a "
                   "program: give its path as PROGRAM");
    if (!o->role[0]) flags_fail(set, "--role must not be empty");
    // The workers publish this address to their peers (COURSE_LOCAL_ADDR,
    // common/netif.h); checked here, before any worker starts.
    char why[1200];
    if (o->local_addr && !netif_is_mine(o->local_addr, why, sizeof why))
        flags_fail(set, "--local_addr %s %s", o->local_addr, why);
    if (o->local_addr) CHECK_SYS(setenv("COURSE_LOCAL_ADDR", o->local_addr, 1));
    o->shown_ranks = ~(uint64_t)0;
    if (o->ranks_filter) o->shown_ranks = parse_ranks_filter(set, o->ranks_filter, o->nproc);
    if ((o->redirects || o->tee) && !o->log_dir)
        flags_fail(set, "--redirects and --tee choose what goes to the files of --log_dir, "
                   "which is not given");
}

static void parse_options(options_t *o, int argc, char **argv) {
    *o = (options_t){.nproc_text = "1", .nnodes_text = "1", .master_addr = "127.0.0.1",
                     .master_port = 29500, .monitor_interval = 0.1, .rdzv_timeout = 300,
                     .last_call = 30, .is_host = -1, .start_method = "spawn", .role = "default"};
    // One set for the whole run: the_job keeps it for usage errors found later.
    static flag_set set = {.program = "ddprun",
                           .summary = "start N workers of PROGRAM as one distributed job (like torchrun)",
                           .positional = "PROGRAM [ARGS...]", .prefixes = true};
    flag_string(&set, "nproc_per_node", &o->nproc_text, "workers on this node: a number, or gpu, cpu, auto")->env = "PET_NPROC_PER_NODE";
    flag_string(&set, "nnodes", &o->nnodes_text, "number of nodes: N, or MIN:MAX (elastic)")->env = "PET_NNODES";
    flag_int(&set, "node_rank", &o->node_rank, 0, 4095, "this node's index, 0 .. nnodes-1 (static rendezvous)")->env = "PET_NODE_RANK";
    flag_string(&set, "master_addr", &o->master_addr, "address of node 0, where the store runs")->env = "PET_MASTER_ADDR";
    flag_int(&set, "master_port", &o->master_port, 0, 65535, "port of the store on node 0")->env = "PET_MASTER_PORT";
    flag_bool(&set, "standalone", &o->standalone, "one node: a free port on 127.0.0.1 and a random run id")->env = "PET_STANDALONE";
    flag_int(&set, "max_restarts", &o->max_restarts, 0, 1000000, "restart all workers up to this many times after a failure")->env = "PET_MAX_RESTARTS";
    flag_double(&set, "monitor_interval", &o->monitor_interval, 0.01, 60, "seconds between checks of the other nodes")->env = "PET_MONITOR_INTERVAL";
    flag_string(&set, "run_id", &o->run_id, "job id, the same on every node; unset: random, or 'none' with several nodes")->env = "PET_RDZV_ID";
    flag_string(&set, "rdzv_id", &o->run_id, "torchrun's name for --run_id");
    flag_string(&set, "rdzv_backend", &o->rdzv_backend, "static (each node its --node_rank) or c10d (nodes numbered as they join; elastic)")->env = "PET_RDZV_BACKEND";
    flag_string(&set, "rdzv_endpoint", &o->rdzv_endpoint, "HOST[:PORT] of the store (port 29400 if none), instead of --master_addr/--master_port")->env = "PET_RDZV_ENDPOINT";
    flag_string(&set, "rdzv_conf", &o->rdzv_conf, "c10d settings: join_timeout=S,last_call_timeout=S,is_host=true|false")->env = "PET_RDZV_CONF";
    flag_double(&set, "rdzv_timeout", &o->rdzv_timeout, 0.1, 1e6, "seconds to wait for the other nodes")->env = "COURSE_TIMEOUT";
    flag_string(&set, "log_dir", &o->log_dir, "also write each rank's output to DIR/attempt_G/RANK/{stdout,stderr}.log")->env = "PET_LOG_DIR";
    flag_t *redirects = flag_int(&set, "redirects", &o->redirects, 0, 3, "streams sent to the log files only: 0 none, 1 stdout, 2 stderr, 3 both");
    redirects->short_name = "r";
    redirects->env = "PET_REDIRECTS";
    flag_t *tee = flag_int(&set, "tee", &o->tee, 0, 3, "streams sent to the log files and the terminal (the default with --log_dir)");
    tee->short_name = "t";
    tee->env = "PET_TEE";
    flag_bool(&set, "no_python", &o->no_python, "accepted for torchrun compatibility: PROGRAM always runs directly");
    flag_bool(&set, "pass_local_rank", &o->pass_local_rank, "also pass --local_rank=N to PROGRAM, as torch.distributed.launch did");
    flag_bool(&set, "use_env", &o->use_env, "accepted for torch.distributed.launch compatibility: LOCAL_RANK is always set");
    flag_choice(&set, "start_method", &o->start_method, "spawn|fork|forkserver",
                "accepted for torchrun compatibility: every worker starts as fork, then exec of PROGRAM");
    flag_string(&set, "role", &o->role, "the workers' role, in ROLE_NAME (torchrun's --role)")->env = "PET_ROLE";
    flag_t *module = flag_bool(&set, "module", &o->module, "refused with a reason: torchrun's way to run a Python module");
    module->short_name = "m";
    flag_string(&set, "run_path", &o->run_path, "refused with a reason: torchrun's way to run a Python file");
    flag_string(&set, "local_addr", &o->local_addr, "the address this node's workers give their peers (default: the route to --master_addr)");
    flag_string(&set, "local_ranks_filter", &o->ranks_filter, "only these local ranks' lines reach the terminal: 0,3 (all go to --log_dir)");
    the_job.flags = &set;
    int first = flags_parse(&set, argc, argv);
    if (first >= argc) flags_fail(&set, "missing PROGRAM: what should the workers run?");
    o->program_argv = argv + first;   // argv[argc] is NULL, so this list is terminated
    check_options(&set, o);
}

// ================================================================ the program and its environment

static bool is_executable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

// A folder that holds a program of its own name, as every chapter does
// (05_env_launch/05_env_launch): the program inside, and a line that says so.
// NULL when `name` is not such a folder.
static char *program_in_folder(const char *name) {
    struct stat st;
    if (stat(name, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    char folder[4096], candidate[8200];
    snprintf(folder, sizeof folder, "%s", name);
    size_t len = strlen(folder);
    while (len > 1 && folder[len - 1] == '/') folder[--len] = '\0';
    const char *base = strrchr(folder, '/') ? strrchr(folder, '/') + 1 : folder;
    snprintf(candidate, sizeof candidate, "%s/%s", folder, base);
    if (!is_executable_file(candidate)) return NULL;
    say("%s is a folder; running the program of the same name in it, %s", name, candidate);
    return xstrdup(candidate);
}

// Like a shell: a name with '/' is a path; otherwise search PATH. A folder
// holding a program of its own name stands for that program (and a name
// that is nowhere in PATH but is such a folder here, too).
static char *resolve_program(const flag_set *set, const char *name) {
    char *inside = strchr(name, '/') ? program_in_folder(name) : NULL;
    if (inside) return inside;
    if (strchr(name, '/')) {
        if (!is_executable_file(name))
            flags_fail(set, "cannot run '%s': %s", name,
                       access(name, F_OK) ? strerror(errno) : "not an executable file");
        return xstrdup(name);
    }
    const char *path = getenv("PATH");
    if (!path || !path[0]) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        char candidate[4096];
        snprintf(candidate, sizeof candidate, "%.*s/%s", len ? (int)len : 1, len ? path : ".",
                 name);
        if (is_executable_file(candidate)) return xstrdup(candidate);
        path += len + (path[len] == ':');
    }
    inside = program_in_folder(name);
    if (inside) return inside;
    flags_fail(set, "program '%s' was not found in PATH (for a program in this folder, "
               "write ./%s)", name, name);
}

typedef struct {
    char **items;   // "NAME=value" strings, NULL-terminated
    int count, cap;
} envlist_t;

static void env_put(envlist_t *e, const char *name, const char *value) {
    size_t n = strlen(name);
    char *entry = xmalloc(n + strlen(value) + 2);
    sprintf(entry, "%s=%s", name, value);
    for (int i = 0; i < e->count; i++) {
        if (!strncmp(e->items[i], name, n) && e->items[i][n] == '=') {
            free(e->items[i]);
            e->items[i] = entry;
            return;
        }
    }
    if (e->count + 2 > e->cap) {
        e->cap = e->cap ? 2 * e->cap : 64;
        char **grown = realloc(e->items, (size_t)e->cap * sizeof *grown);
        if (!grown) die("out of memory building the workers' environment");
        e->items = grown;
    }
    e->items[e->count++] = entry;
    e->items[e->count] = NULL;
}

static void env_put_int(envlist_t *e, const char *name, long value) {
    char text[32];
    snprintf(text, sizeof text, "%ld", value);
    env_put(e, name, text);
}

static void env_free(envlist_t *e) {
    for (int i = 0; i < e->count; i++) free(e->items[i]);
    free(e->items);
}

// The launcher's environment plus what torchrun tells each worker.
static envlist_t worker_environment(const job_t *job, const worker_t *w) {
    envlist_t e = {0};
    for (char **v = environ; *v; v++) {
        const char *eq = strchr(*v, '=');
        if (!eq) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *v), *v);
        env_put(&e, name, eq + 1);
    }
    env_put_int(&e, "RANK", w->rank);
    env_put_int(&e, "LOCAL_RANK", w->local_rank);
    env_put_int(&e, "WORLD_SIZE", job->world_size);
    env_put_int(&e, "LOCAL_WORLD_SIZE", job->nworkers);
    env_put_int(&e, "GROUP_RANK", job->node_rank);
    env_put_int(&e, "GROUP_WORLD_SIZE", job->nnodes);
    env_put_int(&e, "ROLE_RANK", w->rank);
    env_put_int(&e, "ROLE_WORLD_SIZE", job->world_size);
    env_put(&e, "ROLE_NAME", job->opt.role);
    env_put(&e, "MASTER_ADDR", job->master_addr);
    env_put_int(&e, "MASTER_PORT", job->master_port);
    env_put(&e, "TORCHELASTIC_RUN_ID", job->run_id);
    env_put(&e, "COURSE_RUN_ID", job->run_id);
    env_put_int(&e, "TORCHELASTIC_RESTART_COUNT", job->restarts);
    env_put_int(&e, "COURSE_ATTEMPT", job->generation);
    env_put_int(&e, "TORCHELASTIC_MAX_RESTARTS", job->opt.max_restarts);
    env_put(&e, "TORCHELASTIC_USE_AGENT_STORE", "True");
    env_put(&e, "COURSE_AGENT_STORE", "1");
    env_put(&e, "COURSE_JOB_TOKEN", job->token);
    if (job->set_omp) env_put(&e, "OMP_NUM_THREADS", "1");
    return e;
}

// ================================================================ signals to the launcher

static int signal_pipe_write = -1;

// A handler may do almost nothing safely: it writes the signal's number into
// a pipe that the main loop polls, and the main loop does the real work.
static void on_signal(int sig) {
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    ssize_t ignored = write(signal_pipe_write, &byte, 1);
    (void)ignored;
    errno = saved;
}

static const int handled_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static void install_signal_handlers(job_t *job) {
    CHECK_SYS(pipe2(job->signal_pipe, O_CLOEXEC | O_NONBLOCK));
    signal_pipe_write = job->signal_pipe[1];
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof handled_signals / sizeof handled_signals[0]; i++) {
        struct sigaction old;
        CHECK_SYS(sigaction(handled_signals[i], NULL, &old));
        if (handled_signals[i] == SIGHUP && old.sa_handler == SIG_IGN) continue;  // nohup
        CHECK_SYS(sigaction(handled_signals[i], &sa, NULL));
    }
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;   // a worker's exit wakes the main loop
    CHECK_SYS(sigaction(SIGCHLD, &sa, NULL));
}

static void read_signals(job_t *job) {
    unsigned char bytes[64];
    ssize_t n;
    while ((n = read(job->signal_pipe[0], bytes, sizeof bytes)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (bytes[i] == SIGCHLD) continue;   // the loop reaps after every wake-up
            job->pending_signal = bytes[i];
            job->signal_count++;
        }
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) CHECK_SYS(n);
}

// ================================================================ worker output

static void stream_emit(job_t *job, stream_t *s, int rank, const char *line, size_t len) {
    if (s->console < 0 || job->console_broken[s->console]) return;
    char out[LINE_MAX_BYTES + 32];
    int head = snprintf(out, 32, "[rank %d]: ", rank);
    memcpy(out + head, line, len);
    out[head + (int)len] = '\n';
    if (!write_all(s->console, out, (size_t)head + len + 1)) job->console_broken[s->console] = true;
}

// Relay every complete line; keep a partial one until its end arrives.
static void stream_split_lines(job_t *job, stream_t *s, int rank, bool at_eof) {
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        stream_emit(job, s, rank, s->buf + start, i - start);
        start = i + 1;
    }
    bool full = start == 0 && s->len == sizeof s->buf;
    if ((at_eof || full) && start < s->len) {
        stream_emit(job, s, rank, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(stream_t *s) {
    if (s->fd >= 0) CHECK_SYS(close(s->fd));
    if (s->file >= 0) CHECK_SYS(close(s->file));
    s->fd = s->file = -1;
    s->len = 0;
}

static void stream_read(job_t *job, stream_t *s, int rank) {
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    CHECK_SYS(n);
    if (s->file >= 0 && n > 0 && !write_all(s->file, s->buf + s->len, (size_t)n)) {
        say("warning: writing the log of rank %d failed (%s); it goes on without its file",
            rank, strerror(errno));
        CHECK_SYS(close(s->file));
        s->file = -1;
    }
    s->len += (size_t)n;
    stream_split_lines(job, s, rank, n == 0);
    if (n == 0) stream_close(s);
}

// Wait up to timeout_s for worker output or a signal, and handle what came.
// Every waiting loop of the launcher goes through here.
static void heartbeat(job_t *job);
static void post_failure_restart(job_t *job);
static bool restart_posted(job_t *job);
static bool node_waiting(job_t *job);
static void join_round(job_t *job, int round);

static void pump(job_t *job, double timeout_s) {
    int n = 0;
    job->pfds[n++] = (struct pollfd){job->signal_pipe[0], POLLIN, 0};
    for (int i = 0; i < job->nworkers; i++) {
        stream_t *streams[2] = {&job->workers[i].out, &job->workers[i].err};
        for (int k = 0; k < 2; k++) {
            if (streams[k]->fd < 0) continue;
            job->pstreams[n] = streams[k];
            job->pranks[n] = job->workers[i].rank;
            job->pfds[n++] = (struct pollfd){streams[k]->fd, POLLIN, 0};
        }
    }
    int ms = timeout_s <= 0 ? 0 : timeout_s > 1000 ? 1000000 : (int)(timeout_s * 1000 + 0.999);
    int ready = poll(job->pfds, (nfds_t)n, ms);
    if (ready < 0 && errno != EINTR) CHECK_SYS(ready);
    for (int i = 0; i < n && ready > 0; i++) {
        if (!(job->pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (i == 0) read_signals(job);
        else stream_read(job, job->pstreams[i], job->pranks[i]);
    }
    heartbeat(job);
}

// ================================================================ starting workers

static int open_log(const job_t *job, int rank, const char *name) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/attempt_%d/%d", job->opt.log_dir, job->generation, rank);
    if (!files_make_dirs(dir)) die("cannot create the log directory '%s': %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die("cannot write the log file '%s': %s", path, strerror(errno));
    return fd;
}

// The child starts with every signal blocked (see start_worker) and the
// launcher's handlers; a SIGTERM meant for it must not run our handler, which
// would write into the launcher's signal pipe. So: default handlers first,
// then unblock, and a signal that came meanwhile acts as it should.
static void reset_signals_in_child(void) {
    static const int ours[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE};
    struct sigaction dfl = {0}, current;
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) {
        bool nohup = ours[i] == SIGHUP && sigaction(SIGHUP, NULL, &current) == 0 &&
                     current.sa_handler == SIG_IGN;
        if (!nohup) sigaction(ours[i], &dfl, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

// In the child, between fork and exec, only async-signal-safe calls are
// allowed (the store's thread may hold a lock that a copy of it would keep
// forever), so everything was prepared before the fork.
__attribute__((noreturn))
static void exec_worker(const job_t *job, int out_fd, int err_fd, char **argv, char **envp) {
    setpgid(0, 0);   // its own group: signals reach its children too, the terminal's do not
    prctl(PR_SET_PDEATHSIG, SIGKILL);   // if the launcher dies, so does the worker
    if (getppid() != job->launcher_pid) _exit(126);   // it died before prctl
    reset_signals_in_child();
    if (dup2(job->devnull, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    close_range(3, ~0u, 0);   // the store's sockets and the other workers' pipes
    execve(job->program_path, argv, envp);
    static const char msg[] = "ddprun: execve of the program failed (is it a binary or a "
                              "script with a #! line?)\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
}

static void stream_open(job_t *job, stream_t *s, const worker_t *w, int console, int *write_end,
                        const char *name) {
    int rank = w->rank;
    int fds[2];
    CHECK_SYS(pipe2(fds, O_CLOEXEC));
    s->fd = fds[0];
    *write_end = fds[1];
    s->len = 0;
    int bit = console == 1 ? 1 : 2;
    bool file_only = (job->opt.redirects & bit) && !(job->opt.tee & bit);
    bool shown = w->local_rank >= 64 || (job->opt.shown_ranks >> w->local_rank & 1);
    s->console = file_only || !shown ? -1 : console;
    s->file = job->opt.log_dir ? open_log(job, rank, name) : -1;
}

// PROGRAM ARGS..., and with --pass_local_rank a last "--local_rank=N": the
// way torch.distributed.launch told a worker its GPU before torchrun moved it
// into LOCAL_RANK. Old scripts still parse it; the course's programs accept
// it too (flags.h). Free with free() (one block).
static char **worker_argv(const job_t *job, const worker_t *w) {
    int n = 0;
    while (job->opt.program_argv[n]) n++;
    size_t table = sizeof(char *) * (size_t)(n + 2), text = 32;
    char **argv = xcalloc(1, table + text);
    memcpy(argv, job->opt.program_argv, sizeof(char *) * (size_t)n);
    if (job->opt.pass_local_rank) {
        argv[n] = (char *)argv + table;
        snprintf(argv[n], text, "--local_rank=%d", w->local_rank);
    }
    return argv;
}

static void start_worker(job_t *job, worker_t *w) {
    int out_w, err_w;
    stream_open(job, &w->out, w, 1, &out_w, "stdout");
    stream_open(job, &w->err, w, 2, &err_w, "stderr");
    envlist_t env = worker_environment(job, w);
    char **argv = worker_argv(job, w);
    sigset_t all, old;
    sigfillset(&all);
    int rc = pthread_sigmask(SIG_SETMASK, &all, &old);
    if (rc) die("pthread_sigmask failed: %s", strerror(rc));
    pid_t pid = fork();
    if (pid == 0) exec_worker(job, out_w, err_w, argv, env.items);
    int fork_errno = errno;
    rc = pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) die("pthread_sigmask failed: %s", strerror(rc));
    errno = fork_errno;
    CHECK_SYS(pid);
    // Also from here, so that a signal sent right away reaches the group.
    if (setpgid(pid, pid) < 0 && errno != EACCES && errno != ESRCH) CHECK_SYS(-1);
    w->pid = pid;
    w->running = true;
    w->wait_status = 0;
    CHECK_SYS(close(out_w));
    CHECK_SYS(close(err_w));
    env_free(&env);
    free(argv);
}

static void start_workers(job_t *job) {
    job->failure = (failure_t){0};
    job->failure_posted = false;
    job->stopping = false;
    for (int i = 0; i < job->nworkers; i++) start_worker(job, &job->workers[i]);
}

// ================================================================ watching and stopping workers

static int running_count(const job_t *job) {
    int n = 0;
    for (int i = 0; i < job->nworkers; i++) n += job->workers[i].running;
    return n;
}

static void post_failure_record(job_t *job);

static void note_failure(job_t *job, const worker_t *w) {
    char who[160], how[96];
    describe_worker(job, w->rank, w->local_rank, w->pid, who, sizeof who);
    describe_exit(w->wait_status, how, sizeof how);
    bool first = !job->failure.set;
    if (first) {
        job->failure = (failure_t){true, w->rank, w->local_rank, w->pid, w->wait_status,
                                   wall_clock_us(), job->node_rank, ""};
        snprintf(job->failure.host, sizeof job->failure.host, "%s", job->host);
        post_failure_record(job);   // now, before stopping the others takes its time
    }
    int others = running_count(job);
    say("%s %s%s", who, how, first && others > 0 ? "; stopping the other workers" : "");
}

// Relay what an exited worker still had in its pipes, so that its last words
// come before the launcher's message about it.
static void flush_worker_output(job_t *job, worker_t *w) {
    for (int round = 0; round < 1000; round++) {
        struct pollfd p[2] = {{w->out.fd, POLLIN, 0}, {w->err.fd, POLLIN, 0}};
        int ready = poll(p, 2, 0);   // fds of -1 are skipped by poll
        if (ready < 0 && errno != EINTR) CHECK_SYS(ready);
        if (ready <= 0) return;
        if (p[0].revents) stream_read(job, &w->out, w->rank);
        if (p[1].revents) stream_read(job, &w->err, w->rank);
    }
}

// Collect the workers that have exited. While we stop them, exits are expected.
static void reap_workers(job_t *job) {
    for (int i = 0; i < job->nworkers; i++) {
        worker_t *w = &job->workers[i];
        if (!w->running) continue;
        int status;
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        CHECK_SYS(r);
        if (r == 0) continue;
        w->running = false;
        w->wait_status = status;
        bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        if (failed && !job->stopping) {
            flush_worker_output(job, w);
            note_failure(job, w);
        }
    }
}

static void signal_workers(const job_t *job, int sig) {
    for (int i = 0; i < job->nworkers; i++) {
        const worker_t *w = &job->workers[i];
        if (w->running && kill(-w->pid, sig) < 0 && errno != ESRCH) CHECK_SYS(-1);
    }
}

// Pump output and reap until every worker is gone, the deadline passes, or
// a new signal to the launcher asks us to hurry.
static void wait_workers(job_t *job, double seconds) {
    double deadline = now_s() + seconds;
    int signals_before = job->signal_count;
    while (running_count(job) > 0 && now_s() < deadline && job->signal_count == signals_before) {
        double left = deadline - now_s();
        pump(job, left < 0.1 ? left : 0.1);
        reap_workers(job);
    }
}

// Read what the workers wrote last; a grandchild holding a pipe open cannot hold us long.
static void drain_streams(job_t *job) {
    double deadline = now_s() + 0.5;
    bool open = true;
    while (open && now_s() < deadline) {
        pump(job, 0.05);
        open = false;
        for (int i = 0; i < job->nworkers; i++)
            open = open || job->workers[i].out.fd >= 0 || job->workers[i].err.fd >= 0;
    }
    for (int i = 0; i < job->nworkers; i++) {
        stream_split_lines(job, &job->workers[i].out, job->workers[i].rank, true);
        stream_split_lines(job, &job->workers[i].err, job->workers[i].rank, true);
        stream_close(&job->workers[i].out);
        stream_close(&job->workers[i].err);
    }
}

// Stop every worker: first_signal, then SIGKILL after the grace period (as
// torchrun's PContext.close). Also kills what the workers started themselves.
static void stop_workers(job_t *job, int first_signal) {
    job->stopping = true;
    if (running_count(job) > 0) {
        signal_workers(job, first_signal);
        wait_workers(job, job->kill_grace);
    }
    if (running_count(job) > 0) {
        say("%d worker(s) still running %g s after %s; sending SIGKILL", running_count(job),
            job->kill_grace, signal_name(first_signal));
        signal_workers(job, SIGKILL);
        wait_workers(job, KILL_WAIT_S);
    }
    for (int i = 0; i < job->nworkers; i++) {
        worker_t *w = &job->workers[i];
        if (w->running) say("warning: rank %d (pid %d) did not exit even after SIGKILL", w->rank, (int)w->pid);
        if (w->pid > 0 && kill(-w->pid, SIGKILL) < 0 && errno != ESRCH) CHECK_SYS(-1);
    }
    drain_streams(job);
    job->stopping = false;
}

// On any exit that did not stop the workers (a die() in the store, say): stop them now.
static void stop_workers_at_exit(void) {
    job_t *job = &the_job;
    if (!job->workers || running_count(job) == 0) return;
    say("stopping the workers before exiting");
    for (int sig = SIGTERM; sig; sig = sig == SIGTERM ? SIGKILL : 0) {
        signal_workers(job, sig);
        double deadline = now_s() + (sig == SIGTERM ? job->kill_grace : KILL_WAIT_S);
        job->stopping = true;
        while (running_count(job) > 0 && now_s() < deadline) {
            sleep_s(0.02);
            reap_workers(job);
        }
    }
}

// ================================================================ the store and the other nodes

static void node_key(char *key, size_t size, const char *what, int index) {
    snprintf(key, size, "ddprun/%s/%d", what, index);
}

// Launchers that talk through the store: several nodes, or a c10d
// rendezvous (where more may join at any time).
static bool several_nodes(const job_t *job) { return job->opt.dynamic || job->nnodes > 1; }

static void heartbeat(job_t *job) {
    if (!job->store || !several_nodes(job) || now_s() < job->next_beat) return;
    job->next_beat = now_s() + HEARTBEAT_PERIOD_S;
    char key[64];
    node_key(key, sizeof key, "beat", job->beat_id);
    store_add(job->store, key, 1);
}

static double node_silence_max(const job_t *job) {
    return job->opt.rdzv_timeout < NODE_SILENCE_MAX_S ? job->opt.rdzv_timeout : NODE_SILENCE_MAX_S;
}

// A node whose heartbeat counter has not moved for too long: its launcher is
// dead or cut off. Returns its index, or -1.
static int find_silent_node(job_t *job) {
    if (!job->nodes_met || now_s() < job->next_silence_check) return -1;
    job->next_silence_check = now_s() + HEARTBEAT_PERIOD_S;
    for (int r = 0; r < job->nnodes; r++) {
        if (r == job->node_rank) continue;
        char key[64];
        node_key(key, sizeof key, "beat", job->node_beat[r]);
        int64_t beats = store_add(job->store, key, 0);
        if (beats != job->beat_seen[r]) {
            job->beat_seen[r] = beats;
            job->beat_changed[r] = now_s();
        } else if (now_s() - job->beat_changed[r] > node_silence_max(job)) {
            return r;
        }
    }
    return -1;
}

static void store_read_text(job_t *job, const char *key, char *buf, size_t size) {
    size_t n = store_get(job->store, key, buf, size - 1, job->opt.rdzv_timeout);
    buf[n] = '\0';
}

// ---------------------------------------------------------------- the first failure across nodes
//
// A worker that dies often takes others with it: its peers on other nodes
// see their connections close and exit too, and their launchers may notice
// that before the first node has told anyone. So each launcher writes the
// first failure of its own workers in an attempt to ddprun/failure/<G>/<node>
// the moment it reaps it, before it stops the others (which can take the
// kill grace): "TIME_US RANK LOCAL PID WAIT_STATUS HOST", or "none" once it
// stops for another node's sake. The root cause is the earliest record. The
// times are the nodes' wall clocks: NTP keeps them within about a
// millisecond of each other, while a failure spreads to another node no
// faster than a network round trip plus a process exit.

static void post_failure_record(job_t *job) {
    if (!job->store || !several_nodes(job) || job->failure_posted) return;
    char key[64], text[TEXT_MAX];
    const failure_t *f = &job->failure;
    snprintf(key, sizeof key, "ddprun/failure/%d/%d", job->generation, job->node_rank);
    int n = f->set ? snprintf(text, sizeof text, "%lld %d %d %d %d %s", (long long)f->when_us, f->rank,
                              f->local_rank, (int)f->pid, f->wait_status, f->host)
                   : snprintf(text, sizeof text, "none");
    store_set(job->store, key, text, (size_t)(n < TEXT_MAX ? n : TEXT_MAX - 1));
    job->failure_posted = true;
}

// Node r's record; false when it has none yet. A malformed one reads as "none".
static bool read_failure_record(job_t *job, int r, failure_t *out) {
    char key[64], text[TEXT_MAX];
    long long when;
    snprintf(key, sizeof key, "ddprun/failure/%d/%d", job->generation, r);
    if (!store_check(job->store, key)) return false;
    store_read_text(job, key, text, sizeof text);
    *out = (failure_t){0};
    out->node = r;
    out->set = sscanf(text, "%lld %d %d %d %d %255s", &when, &out->rank, &out->local_rank, &out->pid,
                      &out->wait_status, out->host) == 6;
    out->when_us = when;
    return true;
}

// The earliest failure of this attempt on any node: waits (boundedly) until
// every node has written its record, since a node may still be stopping.
static failure_t first_failure_of_job(job_t *job) {
    failure_t first = job->failure;
    if (!several_nodes(job) || !job->store) return first;
    post_failure_record(job);
    bool *seen = xcalloc((size_t)job->nnodes, sizeof *seen);
    double wait = fmin(job->opt.rdzv_timeout, job->kill_grace + KILL_WAIT_S + 2.0);
    double deadline = now_s() + wait;
    for (int count = 0; count < job->nnodes && now_s() < deadline; sleep_s(0.05)) {
        heartbeat(job);   // a replacement must not take this live node for dead
        for (int r = 0; r < job->nnodes; r++) {
            failure_t f;
            if (seen[r] || !read_failure_record(job, r, &f)) continue;
            seen[r] = true;
            count++;
            if (f.set && (!first.set || f.when_us < first.when_us)) first = f;
        }
    }
    free(seen);
    return first;
}

// Tell the other nodes that the job failed, and why (the first word wins
// nothing: any node may post, and every node stops).
static void post_failure(job_t *job) {
    if (!job->store || !several_nodes(job) || job->failure_known || job->leaving) return;
    char text[TEXT_MAX + 300];
    int n = snprintf(text, sizeof text, "node %d (%s): %s", job->node_rank, job->host,
                     job->reason);
    store_set(job->store, "ddprun/failed", text, (size_t)(n < TEXT_MAX ? n : TEXT_MAX - 1));
    job->failure_known = true;
}

static void post_restart(job_t *job) {
    if (!several_nodes(job)) return;
    char key[64], text[TEXT_MAX + 300];
    node_key(key, sizeof key, "restart", job->generation);
    int n = snprintf(text, sizeof text, "node %d (%s): %s", job->node_rank, job->host,
                     job->reason);
    store_set(job->store, key, text, (size_t)(n < TEXT_MAX ? n : TEXT_MAX - 1));
    snprintf(job->reason, sizeof job->reason, "%s", text);   // as the other nodes read it
}

// What the other nodes say: the job failed, a restart is wanted, or a node
// went silent. True (and *outcome set, job->reason filled) when something happened.
// A silent node - its launcher or its whole host died - restarts the job when
// restarts are left: the others then wait in the 'stopped' barrier
// (await_replacement) for a new launcher to take its place (take_over_node).
static bool check_other_nodes(job_t *job, bool watch_restart, bool await_replacement,
                              outcome_t *outcome) {
    if (!several_nodes(job)) return false;
    char key[64], text[TEXT_MAX];
    if (store_check(job->store, "ddprun/failed")) {
        store_read_text(job, "ddprun/failed", text, sizeof text);
        snprintf(job->reason, sizeof job->reason, "the job failed on %s", text);
        job->failure_known = true;
        *outcome = OUTCOME_FAILED;
        return true;
    }
    node_key(key, sizeof key, "restart", job->generation);
    if (watch_restart && store_check(job->store, key)) {
        store_read_text(job, key, text, sizeof text);
        snprintf(job->reason, sizeof job->reason, "%s", text);
        *outcome = OUTCOME_RESTART;
        return true;
    }
    int silent = find_silent_node(job);
    if (silent < 0) return false;
    const char *host = job->node_host[silent] ? job->node_host[silent] : "?";
    if (await_replacement) {
        if (!job->silence_said)
            say("node %d (%s) has sent no heartbeat for %g s: its launcher died or the network "
                "between the nodes failed; waiting up to %g s for a new launcher of node %d (the "
                "same command, on that host or another) to take its place", silent, host,
                node_silence_max(job), job->opt.rdzv_timeout, silent);
        job->silence_said = true;
        return false;
    }
    snprintf(job->reason, sizeof job->reason, "node %d (%s) has sent no heartbeat for %g s: "
             "its launcher died or the network between the nodes failed", silent, host,
             node_silence_max(job));
    if (watch_restart && job->restarts < job->opt.max_restarts) {
        post_failure_restart(job);
        post_restart(job);
        *outcome = OUTCOME_RESTART;
        return true;
    }
    *outcome = OUTCOME_FAILED;
    return true;
}

// ================================================================ rendezvous of the nodes

static void allocate_nodes(job_t *job, int most) {
    job->node_nproc = xcalloc((size_t)most, sizeof *job->node_nproc);
    job->node_host = xcalloc((size_t)most, sizeof *job->node_host);
    job->node_net = xcalloc((size_t)most, sizeof *job->node_net);
    job->node_beat = xcalloc((size_t)most, sizeof *job->node_beat);
    job->beat_seen = xcalloc((size_t)most, sizeof *job->beat_seen);
    job->beat_changed = xcalloc((size_t)most, sizeof *job->beat_changed);
    job->replaced_seen = xcalloc((size_t)most, sizeof *job->replaced_seen);
}

// Where node 0 serves: only loopback when the job stays on this host.
static const char *bind_host(const char *master_addr) {
    if (!strcmp(master_addr, "::1")) return "::1";
    if (store_is_loopback(master_addr)) return "127.0.0.1";
    return strchr(master_addr, ':') ? "::" : "0.0.0.0";
}

// The store's thread must not take our signals: they belong to the main
// loop. It is started between these two, and inherits the mask.
static void block_our_signals(sigset_t *old) {
    sigset_t block;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof handled_signals / sizeof handled_signals[0]; i++)
        sigaddset(&block, handled_signals[i]);
    sigaddset(&block, SIGCHLD);
    int rc = pthread_sigmask(SIG_BLOCK, &block, old);
    if (rc) die("pthread_sigmask failed: %s", strerror(rc));
}

static void restore_signals(const sigset_t *old) {
    int rc = pthread_sigmask(SIG_SETMASK, old, NULL);
    if (rc) die("pthread_sigmask failed: %s", strerror(rc));
}

static void serve_and_connect(job_t *job) {
    if (job->opt.node_rank == 0) {
        sigset_t old;
        block_our_signals(&old);
        store_port_advice = "use --master_port or --standalone";
        job->server = store_server_start(bind_host(job->master_addr), job->master_port,
                                         job->token);
        restore_signals(&old);
        job->master_port = store_server_port(job->server);
    }
    job->store = store_connect(job->master_addr, job->master_port, job->token,
                               job->opt.rdzv_timeout);
}

static void read_node(job_t *job, int r);

// Another launcher joined as this node before us. If it still runs, two
// launchers were given one --node_rank: a mistake. If it died (killed, or its
// host crashed or rebooted), this launcher takes its place, as torchrun's
// agent does when a node comes back: the job restarts on every node from its
// last snapshot (rejoin_job). Its heartbeat tells which: a live launcher
// beats every HEARTBEAT_PERIOD_S in all of its waits, so REPLACE_SILENCE_S
// without a beat means it is gone.
static void take_over_node(job_t *job) {
    int me = job->opt.node_rank;
    char key[64];
    node_key(key, sizeof key, "beat", me);
    int64_t beats = store_add(job->store, key, 0);
    double quiet = fmax(REPLACE_SILENCE_S, 3 * job->opt.monitor_interval);
    say("node %d has a launcher already; watching its heartbeat for %g s to see whether it is "
        "still alive", me, quiet);
    job->next_beat = INFINITY;   // our own beats would look like its
    for (double until = now_s() + quiet; now_s() < until;) {
        pump(job, 0.2);          // also takes Ctrl-C
        if (job->pending_signal) exit(128 + job->pending_signal);
        if (store_add(job->store, key, 0) != beats)
            die("another launcher already joined as node %d and is still running: give every "
                "node its own --node_rank", me);
    }
    job->next_beat = 0;
    if (store_check(job->store, "ddprun/failed")) {
        char text[TEXT_MAX];
        store_read_text(job, "ddprun/failed", text, sizeof text);
        die("node %d's previous launcher is gone, but the job has ended already (%s): start "
            "the whole job again", me, text);
    }
    read_node(job, me);   // what the previous launcher registered
    if (job->node_nproc[me] != job->opt.nproc)
        die("node %d ran %d worker%s; a launcher that takes its place must run as many "
            "(--nproc_per_node=%d), because every rank of the job keeps its number", me,
            job->node_nproc[me], job->node_nproc[me] == 1 ? "" : "s", job->node_nproc[me]);
    say("node %d's previous launcher has sent no heartbeat for %g s: it is gone, and this "
        "launcher takes its place", me, quiet);
    // Counted now, not when this launcher claimed the node: the others read
    // the count once they have all met, which may be after that claim.
    node_key(key, sizeof key, "replaced", me);
    store_add(job->store, key, 1);
    job->replacing = true;
}

static void register_node(job_t *job) {
    char key[64], text[TEXT_MAX];
    node_key(key, sizeof key, "claims", job->opt.node_rank);
    if (store_add(job->store, key, 1) > 1) take_over_node(job);
    int n = snprintf(text, sizeof text, "%d %d %d %s %s", job->opt.nproc, job->opt.nnodes,
                     job->opt.max_restarts, job->host, job->net);
    node_key(key, sizeof key, "node", job->opt.node_rank);
    store_set(job->store, key, text, (size_t)n);
}

// Record what node r said about itself ("NPROC NNODES MAX_RESTARTS HOST NET").
static void read_node(job_t *job, int r) {
    char key[64], text[TEXT_MAX], host[256];
    int nproc, nnodes, max_restarts, net_at = 0;
    node_key(key, sizeof key, "node", r);
    store_read_text(job, key, text, sizeof text);
    if (sscanf(text, "%d %d %d %255s %n", &nproc, &nnodes, &max_restarts, host, &net_at) != 4 ||
        !net_at)
        die("node %d registered something odd in the store: '%s'", r, text);
    if (nnodes != job->opt.nnodes)
        die("node %d (%s) runs with --nnodes=%d, this node with %d: give every node the "
            "same value", r, host, nnodes, job->opt.nnodes);
    if (max_restarts != job->opt.max_restarts)
        die("node %d (%s) runs with --max_restarts=%d, this node with %d: give every node "
            "the same value", r, host, max_restarts, job->opt.max_restarts);
    job->node_nproc[r] = nproc;
    free(job->node_host[r]);
    job->node_host[r] = xstrdup(host);
    free(job->node_net[r]);
    job->node_net[r] = xstrdup(text + net_at);
}

// "1 of 2 joined (node 0: 2 workers); missing: node 1".
static void describe_join(job_t *job, const bool *joined, char *buf, size_t size) {
    int count = 0, at;
    for (int r = 0; r < job->opt.nnodes; r++) count += joined[r];
    at = snprintf(buf, size, "%d of %d joined (", count, job->opt.nnodes);
    const char *sep = "";
    for (int r = 0; r < job->opt.nnodes && at < (int)size; r++) {
        if (!joined[r]) continue;
        at += snprintf(buf + at, size - (size_t)at, "%snode %d: %d worker%s", sep, r,
                       job->node_nproc[r], job->node_nproc[r] == 1 ? "" : "s");
        sep = ", ";
    }
    sep = "); missing: node ";
    for (int r = 0; r < job->opt.nnodes && at < (int)size; r++) {
        if (joined[r]) continue;
        at += snprintf(buf + at, size - (size_t)at, "%s%d", sep, r);
        sep = ", ";
    }
    if (count == job->opt.nnodes && at < (int)size) snprintf(buf + at, size - (size_t)at, ")");
}

__attribute__((noreturn)) static void finish(job_t *job, int code);

static void fail_rendezvous(job_t *job, const bool *joined) {
    char who[512];
    describe_join(job, joined, who, sizeof who);
    snprintf(job->reason, sizeof job->reason,
             "the nodes did not all arrive within %g s: %s. The store is at %s:%d (served by "
             "node 0). Usual causes: a launcher that was not started or has another "
             "--nnodes, --master_port or --run_id; a MASTER_ADDR the other nodes cannot reach "
             "(127.0.0.1 works on one machine only); a firewall blocking port %d; the wrong "
             "network interface", job->opt.rdzv_timeout, who, job->master_addr,
             job->master_port, job->master_port);
    say("error: %s", job->reason);
    finish(job, 1);
}

// Wait until every node has registered, saying who is missing every few seconds.
static void wait_for_nodes(job_t *job) {
    bool *joined = xcalloc((size_t)job->opt.nnodes, sizeof *joined);
    double deadline = now_s() + job->opt.rdzv_timeout, next_progress = now_s() + PROGRESS_PERIOD_S;
    for (int count = 0;;) {
        for (int r = 0; r < job->opt.nnodes; r++) {
            char key[64];
            node_key(key, sizeof key, "node", r);
            if (joined[r] || !store_check(job->store, key)) continue;
            read_node(job, r);
            joined[r] = true;
            count++;
        }
        if (count == job->opt.nnodes) break;
        outcome_t outcome;
        if (check_other_nodes(job, false, false, &outcome)) {
            say("%s", job->reason);
            finish(job, 1);
        }
        if (job->pending_signal) {
            snprintf(job->reason, sizeof job->reason, "stopped by %s while waiting for the "
                     "other nodes", signal_name(job->pending_signal));
            say("%s", job->reason);
            finish(job, 128 + job->pending_signal);
        }
        if (now_s() >= deadline) fail_rendezvous(job, joined);
        if (now_s() >= next_progress) {
            char who[512];
            describe_join(job, joined, who, sizeof who);
            say("waiting for nodes: %s", who);
            next_progress += PROGRESS_PERIOD_S;
        }
        pump(job, 0.1);
    }
    free(joined);
}

// The MTU in "eth0 10.0.0.2 MTU 1500", or -1.
static int net_mtu(const char *net) {
    const char *at = net ? strstr(net, " MTU ") : NULL;
    return at ? atoi(at + 5) : -1;
}

// "all 2 nodes joined: node 0 (host0, eth0 10.0.0.1 MTU 1500): ranks 0-1; ...",
// a warning when their MTUs differ, and this node's "starting" line.
static void announce_layout(const job_t *job) {
    char text[3000];
    int at = 0;
    char ranks[64];
    for (int r = 0, first = 0; r < job->nnodes && at < (int)sizeof text; r++) {
        describe_ranks(first, job->node_nproc[r], ranks, sizeof ranks);
        at += snprintf(text + at, sizeof text - (size_t)at, "%snode %d (%s, %s): %s",
                       r ? "; " : "", r, job->node_host[r], job->node_net[r], ranks);
        first += job->node_nproc[r];
    }
    if (job->opt.dynamic)
        say("round %d: %d node%s joined (%d to %d allowed): %s", job->generation, job->nnodes,
            job->nnodes == 1 ? "" : "s", job->opt.min_nodes, job->opt.max_nodes, text);
    else if (job->nnodes > 1)
        say("all %d nodes joined: %s", job->nnodes, text);
    for (int r = 1; r < job->nnodes; r++) {
        int first = net_mtu(job->node_net[0]), this = net_mtu(job->node_net[r]);
        if (first > 0 && this > 0 && first != this)
            say("warning: node 0 reaches the store with MTU %d, node %d with MTU %d: packets "
                "larger than the smaller MTU are dropped on the way and the job hangs at its "
                "first large message; give every interface between the nodes the same MTU "
                "(ip link; chapter 07's README)", first, r, this);
    }
    describe_ranks(job->rank_offset, job->nworkers, ranks, sizeof ranks);
    char net[TEXT_MAX + 16] = "";
    if (several_nodes(job)) snprintf(net, sizeof net, "; network: %s", job->net_how);
    say("starting %d worker%s of %s: %s of %d; store at %s:%d; run id %s%s", job->nworkers,
        job->nworkers == 1 ? "" : "s", job->opt.program_argv[0], ranks, job->world_size,
        job->master_addr, job->master_port, job->run_id, net);
}

// The launchers meet: node 0 serves the store, every node registers, and
// global ranks are handed out node by node (node 0's workers first).
static void rendezvous_nodes(job_t *job) {
    int nnodes = job->opt.nnodes;
    allocate_nodes(job, nnodes);
    for (int r = 0; r < nnodes; r++) job->node_beat[r] = r;
    job->beat_id = job->node_rank;
    serve_and_connect(job);
    // Until now Ctrl-C simply ends the launcher (there are no workers yet);
    // from here on the main loop handles signals.
    install_signal_handlers(job);
    register_node(job);
    wait_for_nodes(job);
    job->world_size = 0;
    for (int r = 0; r < nnodes; r++) {
        if (r < job->opt.node_rank) job->rank_offset += job->node_nproc[r];
        job->world_size += job->node_nproc[r];
        job->beat_changed[r] = now_s();
        char key[64];
        node_key(key, sizeof key, "replaced", r);
        job->replaced_seen[r] = store_add(job->store, key, 0);
    }
    job->nodes_met = true;
    announce_layout(job);
}

// ================================================================ elastic rounds (the c10d rendezvous)
//
// With --rdzv_backend=c10d or --nnodes=MIN:MAX no launcher is told its node
// rank: the launchers number themselves at the store, in ROUNDS. Round G's
// keys, under ddprun/round/G/: joined (a counter: each launcher's place in
// the round), node/<place> (what it runs: "LAUNCHER NPROC IS_HOST HOST NET"),
// host (the store's own launcher has joined), size ("NODES RESTARTS", set
// once by whoever closes the round). A round closes when MAX launchers have
// joined, or MIN have and no other came for --rdzv_conf last_call_timeout
// seconds, and only once the store's launcher is in it: that launcher is
// node 0 of every round, so rank 0, which writes the snapshots, stays on the
// same host and disk for the whole job.
//
// A launcher that arrives while round G runs joins round G+1 and waits;
// the launchers of round G see it (node_waiting) and stop their workers
// and join round G+1 too: a NEW MEMBERSHIP, which costs no restart. A lost
// node makes its peers' workers fail: that is a failure, counted against
// --max_restarts (ddprun/failrestart/G), and the next round forms without
// it. Either way every worker starts again with the new world size, and
// the program resumes from its snapshot.

static void round_key(char *key, size_t size, int round, const char *what) {
    snprintf(key, size, "ddprun/round/%d/%s", round, what);
}

// Is this address one of this host's? (Binding to it works only if so.)
static bool address_is_local(const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *list;
    if (getaddrinfo(host, NULL, &hints, &list) != 0) return false;
    bool local = false;
    for (struct addrinfo *a = list; a && !local; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        local = bind(fd, a->ai_addr, a->ai_addrlen) == 0;   // port 0: any
        close(fd);
    }
    freeaddrinfo(list);
    return local;
}

// As torchrun's c10d backend: a launcher on the endpoint's host tries to
// serve the store there; if another launcher serves it already (the port is
// taken), it is a client like those of the other hosts.
static void serve_or_join_store(job_t *job) {
    bool here = job->opt.is_host >= 0 ? job->opt.is_host == 1 : address_is_local(job->master_addr);
    if (here) {
        sigset_t old;
        block_our_signals(&old);
        const char *bind_to = bind_host(job->master_addr);
        int fd = store_listen_or(bind_to, job->master_port, true);
        if (fd >= 0) job->server = store_server_start_on(fd, bind_to, job->token, NULL);
        restore_signals(&old);
    }
    job->store = store_connect(job->master_addr, job->master_port, job->token,
                               job->opt.rdzv_timeout);
    say("%s the store at %s:%d (c10d rendezvous, run id %s)", job->server ? "serving" : "joining",
        job->master_addr, job->master_port, job->run_id);
}

// A launcher waits to join the next round, and this round may still grow.
static bool node_waiting(job_t *job) {
    char key[80];
    round_key(key, sizeof key, job->generation + 1, "joined");
    return job->nnodes < job->opt.max_nodes && store_check(job->store, key) &&
           store_add(job->store, key, 0) > 0;
}

// Round `round` ended by a failure: the next one counts as a restart.
static void post_failure_restart(job_t *job) {
    if (!job->opt.dynamic) return;
    char key[64];
    snprintf(key, sizeof key, "ddprun/failrestart/%d", job->generation);
    store_set(job->store, key, "1", 1);
}

// Has another node already asked for a new round? Then our workers failing
// now is most likely its doing (it stopped its workers first), not a fault.
static bool restart_posted(job_t *job) {
    char key[64];
    node_key(key, sizeof key, "restart", job->generation);
    if (!store_check(job->store, key)) return false;
    store_read_text(job, key, job->reason, sizeof job->reason);
    return true;
}

// Whoever closes round `round` decides its size; the first to try does it.
static void close_round(job_t *job, int round) {
    char key[80], text[64];
    round_key(key, sizeof key, round, "closing");
    if (store_add(job->store, key, 1) != 1) return;
    round_key(key, sizeof key, round, "joined");
    int64_t joined = store_add(job->store, key, 0);
    int size = joined < job->opt.max_nodes ? (int)joined : job->opt.max_nodes;
    int restarts = 0, previous_size;   // restarts so far: the last round's, and one if it failed
    round_key(key, sizeof key, round - 1, "size");
    if (round > 0 && store_check(job->store, key)) {
        store_read_text(job, key, text, sizeof text);
        if (sscanf(text, "%d %d", &previous_size, &restarts) != 2) restarts = 0;
        snprintf(key, sizeof key, "ddprun/failrestart/%d", round - 1);
        restarts += store_check(job->store, key);
    }
    int n = snprintf(text, sizeof text, "%d %d", size, restarts);
    round_key(key, sizeof key, round, "size");
    store_set(job->store, key, text, (size_t)n);
}

// The job is over for whoever is still waiting to join it.
static void check_job_over(job_t *job) {
    char text[TEXT_MAX];
    if (store_check(job->store, "ddprun/finished")) {
        say("the job finished before a round with this node began; nothing to do");
        finish(job, 0);
    }
    if (store_check(job->store, "ddprun/failed")) {
        store_read_text(job, "ddprun/failed", text, sizeof text);
        snprintf(job->reason, sizeof job->reason, "the job failed on %s", text);
        job->failure_known = true;
        say("%s", job->reason);
        finish(job, 1);
    }
}

// Wait until round `round` closes (closing it when it is time); its size.
static int wait_round(job_t *job, int round) {
    char joined_key[80], size_key[80], host_key[80], text[64];
    round_key(joined_key, sizeof joined_key, round, "joined");
    round_key(size_key, sizeof size_key, round, "size");
    round_key(host_key, sizeof host_key, round, "host");
    double start = now_s(), changed = start, next_progress = start + PROGRESS_PERIOD_S;
    int64_t seen = -1;
    while (!store_check(job->store, size_key)) {
        check_job_over(job);
        int64_t joined = store_add(job->store, joined_key, 0);
        if (joined != seen) seen = joined, changed = now_s();
        bool host_in = store_check(job->store, host_key);
        bool full = joined >= job->opt.max_nodes;
        bool enough = joined >= job->opt.min_nodes && now_s() - changed >= job->opt.last_call;
        if (host_in && (full || enough)) close_round(job, round);
        if (job->pending_signal) {   // a launcher that was waiting to join leaves quietly
            say("stopped by %s while waiting for round %d", signal_name(job->pending_signal), round);
            job->leaving = !job->server;
            finish(job, 128 + job->pending_signal);
        }
        if (now_s() - start > job->opt.rdzv_timeout) {
            snprintf(job->reason, sizeof job->reason, "round %d did not form within %g s: %lld "
                     "launcher(s) joined, at least %d needed%s. The store is at %s:%d", round,
                     job->opt.rdzv_timeout, (long long)joined, job->opt.min_nodes, host_in ? "" :
                     "; the store's own launcher is not among them", job->master_addr,
                     job->master_port);
            say("error: %s", job->reason);
            finish(job, 1);
        }
        if (now_s() >= next_progress) {
            say("waiting for nodes: round %d has %lld launcher(s); it starts with at least %d, "
                "at most %d%s", round, (long long)joined, job->opt.min_nodes, job->opt.max_nodes,
                host_in ? "" : "; the store's launcher has not joined it yet");
            next_progress += PROGRESS_PERIOD_S;
        }
        pump(job, 0.1);
    }
    store_read_text(job, size_key, text, sizeof text);
    int size, restarts;
    if (sscanf(text, "%d %d", &size, &restarts) != 2) die("round %d's size is odd: '%s'", round, text);
    job->restarts = restarts;
    return size;
}

// The round's nodes, the store's launcher first, then by their places;
// this launcher's node rank, ranks and world size.
static void take_layout(job_t *job, int round, int size, int place) {
    job->nnodes = size;
    job->generation = round;
    job->world_size = job->rank_offset = 0;
    for (int p = 0, r = 1; p < size; p++) {
        char key[80], text[TEXT_MAX], host[256];
        int launcher, nproc, is_host, net_at = 0;
        snprintf(key, sizeof key, "ddprun/round/%d/node/%d", round, p);
        store_read_text(job, key, text, sizeof text);
        if (sscanf(text, "%d %d %d %255s %n", &launcher, &nproc, &is_host, host, &net_at) != 4 ||
            !net_at)
            die("round %d: place %d holds something odd: '%s'", round, p, text);
        int node = is_host ? 0 : r++;
        if (node >= size) die("round %d has no node of the store's launcher", round);
        job->node_nproc[node] = nproc;
        job->node_beat[node] = launcher;
        free(job->node_host[node]);
        job->node_host[node] = xstrdup(host);
        free(job->node_net[node]);
        job->node_net[node] = xstrdup(text + net_at);
        if (p == place) job->node_rank = node;
    }
    for (int r = 0; r < size; r++) {
        if (r < job->node_rank) job->rank_offset += job->node_nproc[r];
        job->world_size += job->node_nproc[r];
        char key[64];
        node_key(key, sizeof key, "beat", job->node_beat[r]);
        job->beat_seen[r] = store_add(job->store, key, 0);
        job->beat_changed[r] = now_s();
    }
    job->nodes_met = true;
    announce_layout(job);
}

// Join round `round`, or the next one if it closes without us; returns
// once this launcher is a node of a round that has begun.
static void join_round(job_t *job, int round) {
    for (;; round++) {
        char key[80], text[TEXT_MAX];
        round_key(key, sizeof key, round, "joined");
        int place = (int)store_add(job->store, key, 1) - 1;
        int n = snprintf(text, sizeof text, "%d %d %d %s %s", job->beat_id, job->opt.nproc,
                         job->server != NULL, job->host, job->net);
        snprintf(key, sizeof key, "ddprun/round/%d/node/%d", round, place);
        store_set(job->store, key, text, (size_t)n);
        if (job->server) {
            round_key(key, sizeof key, round, "host");
            store_set(job->store, key, "1", 1);
        }
        int size = wait_round(job, round);
        if (place < size) {
            take_layout(job, round, size, place);
            return;
        }
        say("round %d began with %d node%s, without this one: waiting for the next round (the "
            "nodes of round %d start it when they see this one waiting, unless they are %d "
            "already)", round, size, size == 1 ? "" : "s", round, job->opt.max_nodes);
    }
}

// The first round this launcher can join: the newest one begun, or the
// next one if that has closed (its nodes will start the next when they see
// us waiting).
static void rendezvous_elastic(job_t *job) {
    allocate_nodes(job, job->opt.max_nodes);
    serve_or_join_store(job);
    install_signal_handlers(job);
    job->beat_id = (int)store_add(job->store, "ddprun/launchers", 1);
    check_job_over(job);
    int round = 0;
    for (char key[80];; round++) {
        round_key(key, sizeof key, round + 1, "joined");
        if (!store_check(job->store, key)) break;
    }
    join_round(job, round);
}

// ================================================================ one attempt

static void summarize_failure(job_t *job) {
    char how[96];
    describe_exit(job->failure.wait_status, how, sizeof how);
    if (job->opt.max_restarts > 0)
        snprintf(job->reason, sizeof job->reason, "giving up after %d restart%s; last failure: "
                 "rank %d %s", job->opt.max_restarts, job->opt.max_restarts == 1 ? "" : "s",
                 job->failure.rank, how);
    else
        snprintf(job->reason, sizeof job->reason, "rank %d %s", job->failure.rank, how);
}

// A local worker failed: the others are stopped; restart if restarts are left.
static outcome_t after_local_failure(job_t *job) {
    if (job->opt.dynamic && restart_posted(job)) {   // another node began a new round first
        say("restart requested by %s; stopping this node's workers", job->reason);
        stop_workers(job, SIGTERM);
        return OUTCOME_RESTART;
    }
    stop_workers(job, SIGTERM);
    if (job->restarts < job->opt.max_restarts) {
        char how[96];
        describe_exit(job->failure.wait_status, how, sizeof how);
        snprintf(job->reason, sizeof job->reason, "rank %d %s", job->failure.rank, how);
        post_failure_restart(job);
        post_restart(job);
        return OUTCOME_RESTART;
    }
    summarize_failure(job);
    job->gave_up = true;
    post_failure(job);
    return OUTCOME_FAILED;
}

// A signal ends the job; in an elastic job it takes only this node out
// (unless it serves the store): the others start a new round without it,
// a new membership rather than a failure, told before our workers stop.
static outcome_t after_signal(job_t *job) {
    int sig = job->pending_signal;
    job->leaving = job->opt.dynamic && !job->server;
    if (job->leaving) {
        snprintf(job->reason, sizeof job->reason, "it leaves the job (stopped by %s)", signal_name(sig));
        post_restart(job);
    }
    if (running_count(job) > 0)
        say("got %s; passing it to the workers and stopping them", signal_name(sig));
    else
        say("got %s; stopping", signal_name(sig));
    stop_workers(job, sig);
    snprintf(job->reason, sizeof job->reason, "stopped by %s", signal_name(sig));
    post_failure(job);
    return OUTCOME_SIGNALED;
}

// Start the workers and watch them until they all succeed, one fails, the
// launcher gets a signal, or another node says restart or failed.
static outcome_t run_attempt(job_t *job) {
    start_workers(job);
    double next_check = now_s() + job->opt.monitor_interval;
    for (;;) {
        pump(job, next_check - now_s());
        reap_workers(job);
        if (job->pending_signal) return after_signal(job);
        if (job->failure.set) return after_local_failure(job);
        if (running_count(job) == 0) {
            drain_streams(job);
            return OUTCOME_SUCCEEDED;
        }
        if (now_s() < next_check) continue;
        next_check = now_s() + job->opt.monitor_interval;
        if (job->opt.dynamic && node_waiting(job)) {   // a new membership: no failure
            snprintf(job->reason, sizeof job->reason, "a new node waits to join (round %d has %d "
                     "of at most %d)", job->generation, job->nnodes, job->opt.max_nodes);
            post_restart(job);
            say("%s; stopping this node's workers for a new round", job->reason);
            post_failure_record(job);
            stop_workers(job, SIGTERM);
            return OUTCOME_RESTART;
        }
        outcome_t outcome;
        if (check_other_nodes(job, true, false, &outcome)) {
            say("%s%s; stopping this node's workers", outcome == OUTCOME_RESTART ?
                "restart requested by " : "", job->reason);
            post_failure_record(job);   // "none": this node stops for another's sake
            stop_workers(job, SIGTERM);
            return outcome;
        }
    }
}

// Count this node into barrier `name` of this generation and wait for all
// nodes, watching for failures, silent nodes and signals meanwhile. Without
// a deadline (timeout_s = 0) the wait lasts while the other nodes send
// heartbeats: their workers may rightly run longer than ours.
static outcome_t node_barrier(job_t *job, const char *name, bool watch_restart,
                              outcome_t success, double timeout_s) {
    char key[64];
    snprintf(key, sizeof key, "ddprun/%s/%d", name, job->generation);
    store_add(job->store, key, 1);
    double start = now_s(), deadline = timeout_s > 0 ? start + timeout_s : INFINITY;
    bool said = false, stopping = !strcmp(name, "stopped");
    job->silence_said = false;
    while (store_add(job->store, key, 0) < job->nnodes) {
        if (!said && now_s() - start > 2.0) {
            say("%s", !strcmp(name, "done") ? "this node's workers have finished; waiting for "
                "the other nodes' workers" : "waiting for the other nodes to stop their workers");
            said = true;
        }
        outcome_t outcome;
        if (check_other_nodes(job, watch_restart, stopping, &outcome)) {
            say("%s%s", outcome == OUTCOME_RESTART ? "restart requested by " : "", job->reason);
            post_failure_record(job);
            return outcome;
        }
        if (job->pending_signal) return after_signal(job);
        if (now_s() >= deadline) {
            snprintf(job->reason, sizeof job->reason, "not every node reached '%s' (attempt "
                     "%d) within %g s%s", name, job->generation, timeout_s, job->silence_said ?
                     ": no new launcher took the silent node's place" : "");
            say("error: %s", job->reason);
            post_failure(job);
            return OUTCOME_FAILED;
        }
        pump(job, job->opt.monitor_interval);
    }
    return success;
}

// Ends the launcher. Node 0 keeps the store up until the other launchers
// (and workers) have hung up, so that they can read how the job ended.
static void finish(job_t *job, int code) {
    if (code != 0) post_failure(job);
    if (job->store && !job->server) {
        store_close(job->store);
        job->store = NULL;
    }
    if (job->workers && running_count(job) > 0) stop_workers(job, SIGTERM);
    if (job->store) store_close(job->store);
    job->store = NULL;
    if (job->server) {
        store_server_drain(job->server, job->kill_grace + 10.0);
        store_server_stop(job->server);
        job->server = NULL;
    }
    exit(code);
}

// The first failure of the job, on whichever node it happened.
static void print_root_cause(job_t *job) {
    failure_t f = first_failure_of_job(job);
    if (!f.set) return;
    char who[400], how[96], when[64];
    snprintf(who, sizeof who, "rank %d (local %d, node %d, host %s, pid %d)", f.rank, f.local_rank, f.node,
             f.host, (int)f.pid);
    describe_exit(f.wait_status, how, sizeof how);
    time_t secs = (time_t)(f.when_us / 1000000);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&secs, &tm));
    say("root cause (first failure): %s %s at %s.%03d", who, how, when, (int)(f.when_us % 1000000 / 1000));
}

// ================================================================ main

// Started with stdin, stdout or stderr closed, our pipes could get fds 0-2
// and the workers' dup2() would go wrong: fill the gaps with /dev/null.
static void ensure_standard_fds(void) {
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0) continue;
        int opened = open("/dev/null", O_RDWR);   // takes the lowest free fd: this one
        CHECK_SYS(opened);
    }
}

static void prepare(job_t *job) {
    const options_t *o = &job->opt;
    ensure_standard_fds();
    job->launcher_pid = getpid();
    job->signal_pipe[0] = job->signal_pipe[1] = -1;   // poll() skips them until installed
    job->kill_grace = kill_grace_from_env(job->flags);
    job->program_path = resolve_program(job->flags, o->program_argv[0]);
    CHECK_SYS(gethostname(job->host, sizeof job->host - 1));
    job->master_addr = o->standalone ? "127.0.0.1" : o->master_addr;
    job->master_port = o->standalone ? 0 : o->master_port;
    job->nnodes = o->nnodes;
    job->node_rank = o->dynamic ? 0 : o->node_rank;   // c10d: until a round says
    bool several = o->nnodes > 1 || o->dynamic;
    if (o->run_id) snprintf(job->run_id, sizeof job->run_id, "%s", o->run_id);
    else if (several) snprintf(job->run_id, sizeof job->run_id, "none");  // as torchrun
    else random_hex(job->run_id, 16);
    if (several) token_from_run_id(job->run_id, job->master_port, job->token, sizeof job->token);
    else random_hex(job->token, 32);
    if (several) {   // how this node reaches the others: its start-up line says it
        netif_choice me = netif_advertise(job->master_addr);
        int mtu = netif_mtu(me.ifname);
        snprintf(job->net, sizeof job->net, "%s %s MTU %d", me.ifname, me.ip, mtu);
        snprintf(job->net_how, sizeof job->net_how, "%s; address %s, MTU %d", me.how, me.ip, mtu);
    }
    struct sigaction ignore = {0};
    ignore.sa_handler = SIG_IGN;
    CHECK_SYS(sigaction(SIGPIPE, &ignore, NULL));   // a closed terminal is an error, not death
    job->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECK_SYS(job->devnull);
    job->nworkers = o->nproc;
    job->workers = xcalloc((size_t)o->nproc, sizeof *job->workers);
    job->pfds = xcalloc(2 * (size_t)o->nproc + 1, sizeof *job->pfds);
    job->pstreams = xcalloc(2 * (size_t)o->nproc + 1, sizeof *job->pstreams);
    job->pranks = xcalloc(2 * (size_t)o->nproc + 1, sizeof *job->pranks);
    for (int i = 0; i < o->nproc; i++)
        job->workers[i].out.fd = job->workers[i].err.fd = -1;
    const char *omp = getenv("OMP_NUM_THREADS");
    job->set_omp = o->nproc > 1 && !(omp && omp[0]);
    if (job->set_omp)
        say("setting OMP_NUM_THREADS=1 for each worker, so that %d workers do not overload "
            "this node's cores; set OMP_NUM_THREADS yourself to choose another value", o->nproc);
}

static void assign_ranks(job_t *job) {
    for (int i = 0; i < job->nworkers; i++) {
        job->workers[i].rank = job->rank_offset + i;
        job->workers[i].local_rank = i;
    }
}

// After a restart's 'stopped' barrier: a node whose launcher was replaced
// (take_over_node) may run on another host now; say so, and count its
// heartbeats afresh.
static void note_new_launchers(job_t *job) {
    for (int r = 0; r < job->opt.nnodes; r++) {
        char key[64];
        node_key(key, sizeof key, "replaced", r);
        int64_t replaced = store_add(job->store, key, 0);
        job->beat_changed[r] = now_s();
        if (r == job->opt.node_rank || replaced == job->replaced_seen[r]) continue;
        job->replaced_seen[r] = replaced;
        read_node(job, r);
        say("node %d has a new launcher, on %s; it rejoins the job", r, job->node_host[r]);
    }
}

// What happens after one attempt; returns only to run another attempt.
static void conclude(job_t *job, outcome_t outcome) {
    if (outcome == OUTCOME_SUCCEEDED)
        outcome = node_barrier(job, "done", true, OUTCOME_SUCCEEDED, 0);
    if (outcome == OUTCOME_RESTART && running_count(job) > 0) stop_workers(job, SIGTERM);
    if (outcome == OUTCOME_RESTART && !job->opt.dynamic)   // c10d: the next round is the barrier
        outcome = node_barrier(job, "stopped", false, OUTCOME_RESTART, job->opt.rdzv_timeout);
    switch (outcome) {
    case OUTCOME_SUCCEEDED:
        if (job->opt.dynamic) store_set(job->store, "ddprun/finished", "1", 1);   // for late joiners
        finish(job, 0);
    case OUTCOME_SIGNALED: finish(job, 128 + job->pending_signal);
    case OUTCOME_FAILED:   // whoever noticed the failure has said so; add the summary
        if (job->gave_up && job->opt.max_restarts > 0) say("%s", job->reason);
        if (job->gave_up || job->nnodes > 1) print_root_cause(job);
        finish(job, 1);
    case OUTCOME_RESTART:
        if (job->opt.dynamic) {
            join_round(job, job->generation + 1);
            assign_ranks(job);
            say("restarting workers in round %d (%d restart%s after failures so far, at most %d)",
                job->generation, job->restarts, job->restarts == 1 ? "" : "s",
                job->opt.max_restarts);
            return;
        }
        note_new_launchers(job);
        job->generation++;
        job->restarts = job->generation;
        say("restarting workers (restart %d of %d)", job->generation, job->opt.max_restarts);
        return;
    }
}

// A replacement launcher (take_over_node) joins at the next attempt. The
// other nodes either still run the current attempt (their workers may be
// stuck waiting for ours), or have asked for a restart and wait in its
// 'stopped' barrier for every node, ours included, which we now count for.
static void rejoin_job(job_t *job) {
    char key[64];
    int g = 0;   // the first attempt for which no node has asked for a restart
    for (;; g++) {
        node_key(key, sizeof key, "restart", g);
        if (!store_check(job->store, key)) break;
    }
    snprintf(key, sizeof key, "ddprun/stopped/%d", g - 1);
    if (g > 0 && store_add(job->store, key, 0) < job->opt.nnodes) {
        job->generation = job->restarts = g - 1;   // that restart is waiting for this node
    } else if (g < job->opt.max_restarts) {
        job->generation = job->restarts = g;
        snprintf(job->reason, sizeof job->reason, "its previous launcher died, and a new one "
                 "takes its place");
        post_restart(job);
    } else {
        job->generation = job->restarts = g;
        snprintf(job->reason, sizeof job->reason, "node %d's launcher died and the job has no "
                 "restarts left (--max_restarts=%d): start the whole job again",
                 job->opt.node_rank, job->opt.max_restarts);
        say("error: %s", job->reason);
        finish(job, 1);
    }
    conclude(job, OUTCOME_RESTART);
}

int main(int argc, char **argv) {
    job_t *job = &the_job;
    parse_options(&job->opt, argc, argv);
    prepare(job);
    if (atexit(stop_workers_at_exit) != 0) die("atexit failed");
    if (job->opt.dynamic) rendezvous_elastic(job);
    else rendezvous_nodes(job);
    assign_ranks(job);
    if (job->replacing) rejoin_job(job);
    for (;;) conclude(job, run_attempt(job));
}
