// rendezvous.h - how the ranks of a job find each other, as
// torch.distributed.init_process_group does it: one rank (or the launcher)
// serves the store (store_server.h), every rank connects (store_client.h),
// and all wait until every rank has arrived. Three init methods:
//   env://           MASTER_ADDR and MASTER_PORT from the environment (ddprun sets them)
//   tcp://HOST:PORT  the address given
//   file:///path     a shared file where rank 0 writes the store's address
// Use:
//   rendezvous_t r = rendezvous("env://", -1, -1, 0);   // rank, world from RANK, WORLD_SIZE
//   ... r.store ...
//   rendezvous_close(&r);
#ifndef COURSE_RENDEZVOUS_H
#define COURSE_RENDEZVOUS_H

#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>

#include "files.h"
#include "store_client.h"
#include "store_server.h"

typedef struct {
    store_t *store;
    store_server_t *server;   // set on the rank that serves the store
    int rank, world_size;
    double timeout_s;
    char *file_path;          // file:// only: the record rank 0 wrote
} rendezvous_t;

// An integer from the environment: false when unset; dies when malformed.
static inline bool rendezvous_env_int(const char *name, int min, int max, int *out) {
    const char *text = getenv(name);
    if (!text || !text[0]) return false;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < min || v > max)
        die("%s must be an integer from %d to %d, got '%s'", name, min, max, text);
    *out = (int)v;
    return true;
}

// Fill in rank and world size from the caller or from RANK / WORLD_SIZE.
static inline void rendezvous_rank_world(const char *method, int *rank, int *world) {
    if (*world < 0 && !rendezvous_env_int("WORLD_SIZE", 1, 1 << 20, world)) {
        if (!strcmp(method, "env://")) *world = 1;   // started by hand: one process
        else die("%s rendezvous needs the world size: pass it or set WORLD_SIZE", method);
    }
    if (*rank < 0 && !rendezvous_env_int("RANK", 0, 1 << 20, rank)) {
        if (*world == 1) *rank = 0;
        else die("%s rendezvous with a world of %d needs this process's rank: pass it or "
                 "set RANK", method, *world);
    }
    if (*world < 1 || *rank >= *world)
        die("rank %d is not in a world of %d ranks (check RANK and WORLD_SIZE)", *rank, *world);
}

// Parse "HOST:PORT" or "[IPv6]:PORT".
static inline void rendezvous_host_port(const char *text, const char *what, char *host,
                                        size_t size, int *port) {
    const char *colon = text[0] == '[' ? strstr(text, "]:") : strrchr(text, ':');
    if (colon && text[0] == '[') colon++;
    const char *start = text[0] == '[' ? text + 1 : text;
    size_t len = colon ? (size_t)(colon - start) - (text[0] == '[') : 0;
    char *end;
    long v = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || len == 0 || len >= size || *end || colon[1] == '\0' || v < 1 || v > 65535)
        die("%s '%s' is not HOST:PORT with a port from 1 to 65535", what, text);
    memcpy(host, start, len);
    host[len] = '\0';
    *port = (int)v;
}

// Where the serving rank binds: only loopback when the job is on this host alone.
static inline const char *rendezvous_bind_host(const char *host) {
    if (!strcmp(host, "::1")) return "::1";
    if (store_is_loopback(host)) return "127.0.0.1";
    return strchr(host, ':') ? "::" : "0.0.0.0";
}

// env:// and tcp://: rank 0 serves at host:port (unless a launcher does) and everyone connects.
static inline void rendezvous_meet(rendezvous_t *r, const char *host, int port, bool agent_serves,
                                   const char *token, const char *session) {
    if (r->rank == 0 && !agent_serves) {
        const char *bind_host = rendezvous_bind_host(host);
        r->server = store_server_start_session(bind_host, port, token, session);
        const char *self = strchr(bind_host, ':') ? "::1" : "127.0.0.1";
        r->store = store_connect_session(self, port, token, session, r->timeout_s);
        // Messages name the address the other ranks use, not loopback.
        snprintf(r->store->host, sizeof r->store->host, "%s", host);
    } else {
        r->store = store_connect_session(host, port, token, session, r->timeout_s);
    }
}

static inline void rendezvous_env(rendezvous_t *r, const char *token, const char *session) {
    const char *addr = getenv("MASTER_ADDR");
    int port = -1;
    bool have_port = rendezvous_env_int("MASTER_PORT", 1, 65535, &port);
    if (r->world_size == 1 && (!addr || !addr[0] || !have_port)) {
        // One process started by hand: a private store on loopback, no network needed.
        r->server = store_server_start_session("127.0.0.1", 0, token, session);
        r->store = store_connect_session("127.0.0.1", store_server_port(r->server), token,
                                         session, r->timeout_s);
        return;
    }
    if (!addr || !addr[0])
        die("env:// rendezvous needs MASTER_ADDR (the host of rank 0), which is not set; "
            "start the job with ddprun, or export MASTER_ADDR and MASTER_PORT");
    if (!have_port)
        die("env:// rendezvous needs MASTER_PORT (a free port on rank 0's host), which is not "
            "set; start the job with ddprun, or export MASTER_PORT");
    const char *agent = getenv("COURSE_AGENT_STORE");
    store_port_advice = "set MASTER_PORT to a free port, the same on every rank, or start the job with "
                        "ddprun --standalone, which picks one";
    rendezvous_meet(r, addr, port, agent && !strcmp(agent, "1"), token, session);
}

static inline void rendezvous_tcp(rendezvous_t *r, const char *where, const char *token,
                                  const char *session) {
    char host[256];
    int port;
    rendezvous_host_port(where, "tcp:// address", host, sizeof host, &port);
    store_port_advice = "use another port in tcp://HOST:PORT, the same on every rank";
    rendezvous_meet(r, host, port, false, token, session);
}

// ---------------------------------------------------------------- file://
//
// file:///path: the ranks share a filesystem, not an address. Rank 0 serves
// the store on a port the system picks and publishes where it is in a small
// text record at path:
//     course-rendezvous 1 / host H / port P / nonce N / world W / started T / pid PID
// (one "name value" per line). It writes it atomically (files.h), so a
// reader sees the old record or the new one, never half of one. The nonce is a random number the store also sends in its hello
// answer. A record left by an earlier run is therefore harmless: its address
// is dead (connection refused: read again), or a different live store answers
// there (another nonce, or another job's token: read again). Clients accept a
// record only when the store at its address answers with the record's nonce
// and the record's world size is theirs, and they keep re-reading until the
// deadline. Rank 0 removes the record at rendezvous_close() if it is still its own.

typedef struct {
    char host[256];
    int port, world;
    uint64_t nonce;
} rendezvous_record_t;

static inline void rendezvous_write_record(const char *path, const rendezvous_record_t *rec) {
    char text[600], err[FILES_PATH_MAX + 200];
    int len = snprintf(text, sizeof text, "course-rendezvous 1\nhost %s\nport %d\nnonce %016"
                       PRIx64 "\nworld %d\nstarted %lld\npid %d\n", rec->host, rec->port,
                       rec->nonce, rec->world, (long long)time(NULL), (int)getpid());
    if (!files_write_atomic(path, text, (size_t)len, err, sizeof err))
        die("file:// rendezvous cannot write its record: %s (the directory must exist and be "
            "writable on every node)", err);
}

// False (with why) when the record is missing or malformed.
static inline bool rendezvous_read_record(const char *path, rendezvous_record_t *rec, char *why,
                                          size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, size, "cannot read '%s': %s", path, strerror(errno));
        return false;
    }
    char text[1024];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    int version = 0;
    if (sscanf(text, "course-rendezvous %d host %255s port %d nonce %" SCNx64 " world %d",
               &version, rec->host, &rec->port, &rec->nonce, &rec->world) != 5 ||
        version != 1 || rec->port < 1 || rec->port > 65535) {
        snprintf(why, size, "'%s' is not a rendezvous record (yet)", path);
        return false;
    }
    return true;
}

// The address other hosts should use for this one: MASTER_ADDR when set, else
// the host name if it resolves, else loopback (a job on one machine).
static inline void rendezvous_advertised_host(char *host, size_t size) {
    const char *addr = getenv("MASTER_ADDR");
    if (addr && addr[0]) {
        snprintf(host, size, "%s", addr);
        return;
    }
    char name[256] = "";
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *list;
    if (gethostname(name, sizeof name - 1) == 0 && getaddrinfo(name, NULL, &hints, &list) == 0) {
        freeaddrinfo(list);
        snprintf(host, size, "%s", name);
    } else {
        snprintf(host, size, "127.0.0.1");
    }
}

static inline void rendezvous_file_serve(rendezvous_t *r, const char *path, const char *token,
                                         const char *session) {
    r->server = store_server_start_session("0.0.0.0", 0, token, session);
    rendezvous_record_t rec = {.port = store_server_port(r->server), .world = r->world_size,
                             .nonce = store_server_nonce(r->server)};
    rendezvous_advertised_host(rec.host, sizeof rec.host);
    r->store = store_connect_session("127.0.0.1", rec.port, token, session, r->timeout_s);
    // As in rendezvous_meet: name the address the other ranks use, not loopback.
    snprintf(r->store->host, sizeof r->store->host, "%s", rec.host);
    rendezvous_write_record(path, &rec);
    r->file_path = strdup(path);
    if (!r->file_path) die("out of memory");
}

static inline void rendezvous_file_join(rendezvous_t *r, const char *path, const char *token,
                                        const char *session) {
    double deadline = store_clock() + r->timeout_s;
    char why[600] = "";
    for (;;) {
        rendezvous_record_t rec;
        if (rendezvous_read_record(path, &rec, why, sizeof why)) {
            bool fatal;   // a refusal only means the record points at someone else's store
            double attempt = fmin(deadline, store_clock() + 2.0);
            store_t *st = store_try_connect(rec.host, rec.port, token, session, attempt, why,
                                            sizeof why, &fatal);
            if (st && st->server_nonce == rec.nonce) {
                if (rec.world != r->world_size)
                    die("file:// rendezvous through '%s': rank 0 has a world of %d ranks, this "
                        "rank %d (check WORLD_SIZE)", path, rec.world, r->world_size);
                st->timeout_s = r->timeout_s;
                r->store = st;
                return;
            }
            if (st)
                snprintf(why, sizeof why, "stale record: %s:%d is another store", rec.host,
                         rec.port);
            store_close(st);
        }
        if (store_clock() >= deadline)
            die("file:// rendezvous through '%s' found no live record from rank 0 after %g s "
                "(last problem: %s); is rank 0 running with the same path?", path, r->timeout_s,
                why);
        store_sleep(0.05);
    }
}

static inline void rendezvous_file(rendezvous_t *r, const char *path, const char *token,
                                   const char *session) {
    if (!path[0] || strlen(path) > 4000)
        die("file:// needs a path, as in file:///shared/job.rdzv, got 'file://%.60s'", path);
    if (r->rank == 0) rendezvous_file_serve(r, path, token, session);
    else rendezvous_file_join(r, path, token, session);
}

static inline void rendezvous_file_cleanup(rendezvous_t *r) {
    rendezvous_record_t rec;
    char why[600];
    if (r->server && rendezvous_read_record(r->file_path, &rec, why, sizeof why) &&
        rec.nonce == store_server_nonce(r->server))
        unlink(r->file_path);
    free(r->file_path);
    r->file_path = NULL;
}

// ---------------------------------------------------------------- rendezvous()

// Every rank says it is here and waits for the others; also checks that
// every rank was given the same world size.
static inline void rendezvous_join(rendezvous_t *r) {
    char text[32];
    int n = snprintf(text, sizeof text, "%d", r->world_size);
    if (r->rank == 0) store_set(r->store, "world_size", text, (size_t)n);
    char why[512];
    if (!store_barrier_try(r->store, "rendezvous", r->rank, r->world_size, r->timeout_s, why,
                           sizeof why)) {
        // The serving rank usually started first, so it times out first. It keeps
        // serving a few seconds more so that the other ranks can time out too and
        // name the missing ranks themselves, rather than report a lost store.
        if (r->server) {
            store_close(r->store);
            r->store = NULL;
            store_server_drain(r->server, 5.0);
        }
        die("%s", why);
    }
    char seen[32] = "";
    size_t len = store_get(r->store, "world_size", seen, sizeof seen - 1, r->timeout_s);
    seen[len] = '\0';
    if (strcmp(seen, text))
        die("rank 0 has WORLD_SIZE=%s but rank %d has %d: every rank must be given the same",
            seen, r->rank, r->world_size);
}

// Rendezvous as torch.distributed.init_process_group does it (see the top of this
// file and common/dist.h). rank / world_size: a value, or -1 to read RANK /
// WORLD_SIZE. timeout_s <= 0: course_timeout_default(). When it returns,
// every rank has joined.
static inline rendezvous_t rendezvous(const char *init_method, int rank, int world_size,
                                      double timeout_s) {
    // Each round in a process (and each restart of a job) gets its own keys and
    // session, so that a second rendezvous never meets the first one's leftovers.
    static int rounds_done = 0;
    rendezvous_t r = {0};
    r.timeout_s = timeout_s > 0 ? timeout_s : course_timeout_default();
    const char *method = init_method && init_method[0] ? init_method : "env://";
    const char *kind = !strncmp(method, "env://", 6) ? "env://"
                       : !strncmp(method, "tcp://", 6) ? "tcp://"
                       : !strncmp(method, "file://", 7) ? "file://" : NULL;
    if (!kind)
        die("unknown init method '%s' (use env://, tcp://HOST:PORT or file:///path)", method);
    rendezvous_rank_world(kind, &rank, &world_size);
    r.rank = rank;
    r.world_size = world_size;
    if (world_size > 1) course_set_rank(rank);
    const char *token = getenv("COURSE_JOB_TOKEN");
    // The attempt: restarts after failures, and under an elastic ddprun also
    // each new membership (COURSE_ATTEMPT counts both; torchrun's
    // TORCHELASTIC_RESTART_COUNT only failures).
    int restart = 0;
    if (!rendezvous_env_int("COURSE_ATTEMPT", 0, 1 << 30, &restart))
        rendezvous_env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, &restart);
    char session[64];
    snprintf(session, sizeof session, "attempt%d/round%d", restart, rounds_done++);
    if (!strcmp(kind, "env://")) rendezvous_env(&r, token, session);
    else if (!strcmp(kind, "tcp://")) rendezvous_tcp(&r, method + 6, token, session);
    else rendezvous_file(&r, method + 7, token, session);
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s/", session);
    store_set_prefix(r.store, prefix);
    rendezvous_join(&r);
    return r;
}

// Releases the client and, on the serving rank, the store (after giving the
// other ranks a few seconds to finish their last requests and hang up).
static inline void rendezvous_close(rendezvous_t *r) {
    store_close(r->store);
    if (r->file_path) rendezvous_file_cleanup(r);
    if (r->server) {
        store_server_drain(r->server, 5.0);
        store_server_stop(r->server);
    }
    memset(r, 0, sizeof *r);
}

#endif
