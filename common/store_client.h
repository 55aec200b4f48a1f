// store_client.h - a rank's connection to the rendezvous store
// (store_server.h): set, get (waiting until another rank has set the key),
// add to a counter, check, wait, delete; a barrier built from them; and the
// three patterns every start-up uses: one rank tells everyone a value
// (store_broadcast), every rank tells everyone its value (store_all_gather),
// and every rank votes yes or no (store_vote).
//
// Deadlines: every socket operation is a poll() with the time left, so a
// dead or stuck store ends the program with a message naming the store's
// address instead of a hang.
//
// Use (every rank):
//   store_t *st = store_connect("node0", 29500, token, timeout_s);
//   store_set(st, "nccl_id", &id, sizeof id);
//   store_get(st, "nccl_id", &id, sizeof id, timeout_s);   // waits for rank 0's set
//   store_barrier(st, "init", rank, world, timeout_s);
//   store_close(st);
#ifndef COURSE_STORE_CLIENT_H
#define COURSE_STORE_CLIENT_H

#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "store_wire.h"

typedef struct store {
    int fd;
    char host[256];
    int port;
    char prefix[STORE_MAX_PREFIX];
    double timeout_s;        // for requests that the store answers at once
    uint64_t server_nonce;
    unsigned barrier_seq;    // barriers done through this client, to name the next
    char past_barrier[2][256];  // key stems of the last two, for cleaning up
    int past_rank[2];
    pthread_mutex_t lock;    // one request at a time when threads share a client
} store_t;

// A connection that TCP made from a socket to itself. Dialing a port of this
// host on which nothing listens yet can end so: when the kernel gives the
// socket that very port as its own (ports in the ephemeral range, 32768-60999
// on Linux), the SYN comes back to its sender and TCP's simultaneous open
// connects the two. The client would read its own hello as the store's
// answer, and the store, starting a moment later, would find its port taken.
static inline bool store_is_self_connected(int fd) {
    struct sockaddr_storage mine, peer;
    socklen_t mine_len = sizeof mine, peer_len = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&mine, &mine_len) < 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &peer_len) < 0 ||
        mine.ss_family != peer.ss_family)
        return false;
    if (mine.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)&mine, *b = (const void *)&peer;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (mine.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)&mine, *b = (const void *)&peer;
        return a->sin6_port == b->sin6_port &&
               !memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr);
    }
    return false;
}

// Connect to one address before the deadline; -1 with why filled on failure.
static inline int store_dial_one(const struct addrinfo *ai, double deadline, char *why,
                                 size_t size) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK_SYS(fd);
    int err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int rc;
            while ((rc = poll(&p, 1, store_ms_left(deadline))) < 0 && errno == EINTR) {}
            socklen_t len = sizeof err;
            if (rc <= 0) err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        }
    }
    if (!err && store_is_self_connected(fd)) {
        // Nothing listens there yet. Reset rather than close, so that the
        // port is free again at once for the store that is about to bind it.
        struct linger reset = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        err = ECONNREFUSED;
    }
    if (err) {
        snprintf(why, size, "%s", strerror(err));
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static inline int store_dial(const char *host, int port, double deadline, char *why,
                             size_t size) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV}, *list;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    int rc = getaddrinfo(host, port_text, &hints, &list);
    if (rc) {
        snprintf(why, size, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next)
        fd = store_dial_one(ai, deadline, why, size);
    freeaddrinfo(list);
    return fd;
}

// Move len bytes before the deadline. 0: done; -1: connection lost (errno);
// -2: deadline passed.
static inline int store_io(int fd, void *buf, size_t len, double deadline, bool sending) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        struct pollfd pfd = {fd, sending ? POLLOUT : POLLIN, 0};
        int rc = poll(&pfd, 1, store_ms_left(deadline));
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        if (rc == 0) return -2;
        ssize_t n = sending ? send(fd, p + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, p + done, len - done, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n < 0) return -1;
        if (n == 0) {
            errno = ECONNRESET;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

// Send body as one frame.
static inline int store_send_frame(int fd, const store_bytes_t *body, double deadline) {
    store_bytes_t frame = {0};
    store_put_uint(&frame, body->len, 4);
    store_bytes_put(&frame, body->data, body->len);
    int rc = store_io(fd, frame.data, frame.len, deadline, true);
    store_bytes_free(&frame);
    return rc;
}

// Receive one frame; *rc as store_io, or -3 for a frame no store would send.
static inline uint8_t *store_recv_frame(int fd, double deadline, size_t *len, int *rc) {
    uint8_t header[4];
    *rc = store_io(fd, header, 4, deadline, false);
    if (*rc) return NULL;
    *len = store_read_u32(header);
    if (*len == 0 || *len > (size_t)STORE_MAX_FRAME) {
        *rc = -3;
        return NULL;
    }
    uint8_t *body = xmalloc(*len);
    *rc = store_io(fd, body, *len, deadline, false);
    if (*rc) {
        free(body);
        return NULL;
    }
    return body;
}

// What a failed hello means for the caller: try again, or give up.
typedef enum { STORE_HELLO_OK, STORE_HELLO_RETRY, STORE_HELLO_FATAL } store_hello_result_t;

static inline store_hello_result_t store_hello_answer(const uint8_t *body, size_t len,
                                                      const char *where, uint64_t *nonce,
                                                      char *why, size_t size) {
    store_reader_t r = {body, len, true};
    int status = (int)store_take_uint(&r, 1);
    if (status == STORE_REFUSED_TOKEN) {
        snprintf(why, size, "the store at %s belongs to another job (token mismatch)", where);
        return STORE_HELLO_FATAL;
    }
    if (status == STORE_REFUSED_SESSION) {
        snprintf(why, size, "the store at %s still serves an earlier round", where);
        return STORE_HELLO_RETRY;
    }
    if (status == STORE_REFUSED_VERSION) {
        snprintf(why, size, "the store at %s speaks protocol version %d, this program %d "
                 "(rebuild every program of the job)", where, (int)store_take_uint(&r, 2),
                 STORE_VERSION);
        return STORE_HELLO_FATAL;
    }
    uint32_t magic = (uint32_t)store_take_uint(&r, 4);
    store_take_uint(&r, 2);
    *nonce = store_take_uint(&r, 8);
    if (status != STORE_OK || magic != STORE_MAGIC || !store_reader_done(&r)) {
        snprintf(why, size, "the service at %s is not a rendezvous store "
                 "(wrong answer to the hello; is the port right?)", where);
        return STORE_HELLO_FATAL;
    }
    return STORE_HELLO_OK;
}

static inline store_hello_result_t store_hello(int fd, const char *where, const char *token,
                                               const char *session, double deadline,
                                               uint64_t *nonce, char *why, size_t size) {
    store_bytes_t req = {0};
    store_put_uint(&req, STORE_OP_HELLO, 1);
    store_put_uint(&req, STORE_MAGIC, 4);
    store_put_uint(&req, STORE_VERSION, 2);
    store_put_key(&req, token);
    store_put_key(&req, session);
    int rc = store_send_frame(fd, &req, deadline);
    store_bytes_free(&req);
    size_t len = 0;
    uint8_t *body = rc ? NULL : store_recv_frame(fd, deadline, &len, &rc);
    if (rc == -3) {
        snprintf(why, size, "the service at %s is not a rendezvous store (it answered "
                 "with something else; is the port right?)", where);
        return STORE_HELLO_FATAL;
    }
    if (rc) {
        snprintf(why, size, "%s", rc == -2 ? "no answer to the hello" :
                 "the connection closed during the hello");
        return STORE_HELLO_RETRY;
    }
    store_hello_result_t result = store_hello_answer(body, len, where, nonce, why, size);
    free(body);
    return result;
}

// One attempt to connect and say hello before the deadline. NULL on failure,
// with why set and *fatal telling whether trying again could help.
static inline store_t *store_try_connect(const char *host, int port, const char *token,
                                         const char *session, double deadline, char *why,
                                         size_t size, bool *fatal) {
    *fatal = false;
    if (!token) token = "";
    if (!session) session = "";
    if (strlen(token) > STORE_MAX_TOKEN)
        die("COURSE_JOB_TOKEN is longer than %d bytes", STORE_MAX_TOKEN);
    if (strlen(host) > 255) die("store host name '%.40s...' is too long", host);
    int fd = store_dial(host, port, deadline, why, size);
    if (fd < 0) return NULL;
    char where[300];
    snprintf(where, sizeof where, "%s:%d", host, port);
    uint64_t nonce = 0;
    store_hello_result_t rc = store_hello(fd, where, token, session, deadline, &nonce, why, size);
    if (rc != STORE_HELLO_OK) {
        close(fd);
        *fatal = rc == STORE_HELLO_FATAL;
        return NULL;
    }
    store_t *st = xcalloc(1, sizeof *st);
    st->fd = fd;
    snprintf(st->host, sizeof st->host, "%s", host);
    st->port = port;
    st->server_nonce = nonce;
    st->timeout_s = course_timeout_default();
    pthread_mutex_init(&st->lock, NULL);
    return st;
}

// A client whose store is not up yet says so once after this long. Starting a
// rank before rank 0 (or a node before node 0) is normal, but a wrong address
// or a closed firewall looks just the same from here, and nobody should stare
// at a silent terminal for the whole timeout to learn which.
#define STORE_WAIT_NOTICE_S 10.0

static inline store_t *store_connect_session(const char *host, int port, const char *token,
                                             const char *session, double timeout_s) {
    if (timeout_s <= 0) timeout_s = course_timeout_default();
    if (port < 1 || port > 65535) die("store port %d is out of range 1..65535", port);
    double deadline = store_clock() + timeout_s, pause = 0.02;
    double notice_at = store_clock() + STORE_WAIT_NOTICE_S;
    char why[512] = "";
    for (;;) {
        bool fatal = false;
        store_t *st = store_try_connect(host, port, token, session, deadline, why, sizeof why,
                                        &fatal);
        if (st) {
            st->timeout_s = timeout_s;
            return st;
        }
        if (fatal) die("%s", why);
        if (store_clock() >= deadline)
            die("could not reach the rendezvous store at %s:%d after %g s: %s (is rank 0 or "
                "the launcher running? are MASTER_ADDR and MASTER_PORT the same on every rank?"
                " is the port open in the firewall?)", host, port, timeout_s, why);
        if (store_clock() >= notice_at && deadline - store_clock() > 1) {
            course_say("waiting for the rendezvous store at %s:%d (%s); trying for %.0f s more. "
                       "Is rank 0 (or node 0's launcher) started, with this address and port?",
                       host, port, why, deadline - store_clock());
            notice_at = INFINITY;
        }
        store_sleep(fmin(pause, deadline - store_clock()));
        pause = fmin(pause * 2, 0.5);
    }
}

// Connect, retrying until timeout_s (<= 0: the default) since the server may
// start after its clients.
static inline store_t *store_connect(const char *host, int port, const char *token,
                                     double timeout_s) {
    return store_connect_session(host, port, token, NULL, timeout_s);
}

static inline void store_close(store_t *st) {
    if (!st) return;
    close(st->fd);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

// Every key is stored under the client's prefix, so that restarts and later
// rendezvous rounds cannot see each other's keys.
static inline void store_set_prefix(store_t *st, const char *prefix) {
    if (!prefix) prefix = "";
    if (strlen(prefix) >= STORE_MAX_PREFIX)
        die("store prefix '%.40s...' is longer than %d bytes", prefix, STORE_MAX_PREFIX - 1);
    snprintf(st->prefix, sizeof st->prefix, "%s", prefix);
}

static inline void store_full_key(const store_t *st, const char *key, char *out) {
    if (!key || !key[0]) die("store keys cannot be empty");
    if (strlen(st->prefix) + strlen(key) > STORE_MAX_KEY)
        die("store key '%.60s' is longer than %d bytes", key, STORE_MAX_KEY);
    size_t n = strlen(st->prefix);
    memcpy(out, st->prefix, n);
    memcpy(out + n, key, strlen(key) + 1);
}

// Send a request and return its reply (status byte first; caller frees).
// Dies with a message naming the store when the connection breaks or no answer
// comes by the deadline.
static inline uint8_t *store_roundtrip(store_t *st, const char *what, const char *key,
                                       const store_bytes_t *req, double deadline, size_t *len) {
    int rc = store_send_frame(st->fd, req, deadline);
    uint8_t *reply = rc ? NULL : store_recv_frame(st->fd, deadline, len, &rc);
    if (rc == -2)
        die("the rendezvous store at %s:%d did not answer '%s %s' in time (is its process, "
            "rank 0 or the launcher, stuck?)", st->host, st->port, what, key);
    if (rc == -3)
        die("the rendezvous store at %s:%d sent a malformed answer to '%s %s'", st->host,
            st->port, what, key);
    if (rc)
        die("lost the connection to the rendezvous store at %s:%d during '%s %s': %s (its "
            "process, rank 0 or the launcher, has exited or crashed)", st->host, st->port,
            what, key, strerror(errno));
    if (reply[0] == STORE_ERROR)
        die("the rendezvous store at %s:%d refused '%s %s': %.*s", st->host, st->port, what,
            key, (int)(*len - 1), (const char *)reply + 1);
    return reply;
}

// A request for one key: builds it, sends it under the lock, returns the reply.
static inline uint8_t *store_request(store_t *st, int op, const char *what, const char *key,
                                     const store_bytes_t *extra, double wait_s, size_t *len) {
    char full[STORE_MAX_KEY + 1];
    store_full_key(st, key, full);
    store_bytes_t req = {0};
    store_put_uint(&req, (uint64_t)op, 1);
    store_put_key(&req, full);
    if (extra) store_bytes_put(&req, extra->data, extra->len);
    // The server ends a wait itself; the margin covers the trip there and back.
    double deadline = store_clock() + (wait_s > 0 ? wait_s + 5.0 : st->timeout_s);
    pthread_mutex_lock(&st->lock);
    uint8_t *reply = store_roundtrip(st, what, full, &req, deadline, len);
    pthread_mutex_unlock(&st->lock);
    store_bytes_free(&req);
    return reply;
}

static inline uint32_t store_timeout_ms(double timeout_s) {
    double ms = ceil(timeout_s * 1000.0);
    return ms < 1 ? 1 : ms > 4e9 ? 4000000000u : (uint32_t)ms;
}

static inline void store_set(store_t *st, const char *key, const void *value, size_t len) {
    if (len > STORE_MAX_VALUE)
        die("the value for store key '%s' is %zu bytes; the store holds at most %d bytes "
            "(1 MiB) per value", key, len, STORE_MAX_VALUE);
    store_bytes_t extra = {0};
    store_put_uint(&extra, len, 4);
    store_bytes_put(&extra, value, len);
    size_t n;
    free(store_request(st, STORE_OP_SET, "set", key, &extra, 0, &n));
    store_bytes_free(&extra);
}

// Blocks until key exists (timeout_s <= 0: the client's timeout), then copies
// its value into buf and returns its length. Dies on timeout, naming the key,
// or when the value is larger than cap.
static inline size_t store_get(store_t *st, const char *key, void *buf, size_t cap,
                               double timeout_s) {
    if (timeout_s <= 0) timeout_s = st->timeout_s;
    store_bytes_t extra = {0};
    store_put_uint(&extra, store_timeout_ms(timeout_s), 4);
    size_t n;
    uint8_t *reply = store_request(st, STORE_OP_GET, "get", key, &extra, timeout_s, &n);
    store_bytes_free(&extra);
    if (reply[0] == STORE_TIMEOUT)
        die("timed out after %g s waiting for key '%s%s' in the rendezvous store at %s:%d "
            "(the rank that should set it has not: did it crash or start late?)", timeout_s,
            st->prefix, key, st->host, st->port);
    size_t len = n - 1;
    if (len > cap)
        die("store key '%s' holds %zu bytes, more than the %zu-byte buffer given", key, len, cap);
    if (len) memcpy(buf, reply + 1, len);
    free(reply);
    return len;
}

// Like get without the value: false when the key did not appear in time.
static inline bool store_wait(store_t *st, const char *key, double timeout_s) {
    if (timeout_s <= 0) timeout_s = st->timeout_s;
    store_bytes_t extra = {0};
    store_put_uint(&extra, store_timeout_ms(timeout_s), 4);
    size_t n;
    uint8_t *reply = store_request(st, STORE_OP_WAIT, "wait", key, &extra, timeout_s, &n);
    store_bytes_free(&extra);
    bool found = reply[0] == STORE_OK;
    free(reply);
    return found;
}

// Adds delta to the counter at key (missing: 0) atomically; returns the new value.
static inline int64_t store_add(store_t *st, const char *key, int64_t delta) {
    store_bytes_t extra = {0};
    store_put_uint(&extra, (uint64_t)delta, 8);
    size_t n;
    uint8_t *reply = store_request(st, STORE_OP_ADD, "add", key, &extra, 0, &n);
    store_bytes_free(&extra);
    store_reader_t r = {reply + 1, n - 1, true};
    int64_t value = (int64_t)store_take_uint(&r, 8);
    bool ok = store_reader_done(&r);
    free(reply);
    if (!ok) die("the rendezvous store at %s:%d answered 'add %s' oddly", st->host, st->port, key);
    return value;
}

static inline bool store_flag_request(store_t *st, int op, const char *what, const char *key) {
    size_t n;
    uint8_t *reply = store_request(st, op, what, key, NULL, 0, &n);
    bool flag = n == 2 && reply[1];
    free(reply);
    return flag;
}

// Does key exist now? Answers at once.
static inline bool store_check(store_t *st, const char *key) {
    return store_flag_request(st, STORE_OP_CHECK, "check", key);
}

// Removes key; returns whether it existed.
static inline bool store_delete(store_t *st, const char *key) {
    return store_flag_request(st, STORE_OP_DELETE, "delete", key);
}

// ---------------------------------------------------------------- barrier

// "ranks 1, 2 and 5" style list of the ranks whose arrival key is missing.
static inline void store_missing_ranks(store_t *st, const char *stem, int world, char *out,
                                       size_t size) {
    int shown = 0, missing = 0;
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < world; r++) {
        char key[STORE_MAX_KEY + 1];
        snprintf(key, sizeof key, "%.250s/rank/%d", stem, r);
        if (store_check(st, key)) continue;
        missing++;
        if (shown < 16 && used < size) {
            used += (size_t)snprintf(out + used, size - used, "%s%d", shown ? ", " : "", r);
            shown++;
        }
    }
    if (missing > shown && used < size)
        snprintf(out + used, size - used, " and %d more", missing - shown);
}

static inline void store_barrier_timeout(store_t *st, const char *stem, const char *name,
                                         int world, double timeout_s, char *why, size_t size) {
    char count_key[STORE_MAX_KEY + 1], missing[256];
    snprintf(count_key, sizeof count_key, "%.250s/count", stem);
    int64_t joined = store_add(st, count_key, 0);
    store_missing_ranks(st, stem, world, missing, sizeof missing);
    bool several = strchr(missing, ',') || strstr(missing, "more");
    snprintf(why, size,
             "%" PRId64 " of %d ranks joined barrier '%s' after %g s; missing: rank%s %s", joined,
             world, name, timeout_s, several ? "s" : "", missing);
}

// Barrier k-2's keys are no longer read by anyone once this rank is in barrier
// k (every rank has finished k-1's count, so it left k-2), so remove them; this
// keeps the store small when a program calls barriers in a loop.
static inline void store_barrier_cleanup(store_t *st, unsigned seq) {
    if (seq < 2) return;
    const char *stem = st->past_barrier[seq % 2];
    char key[STORE_MAX_KEY + 1];
    snprintf(key, sizeof key, "%.250s/rank/%d", stem, st->past_rank[seq % 2]);
    store_delete(st, key);
    if (st->past_rank[seq % 2] != 0) return;
    snprintf(key, sizeof key, "%.250s/count", stem);
    store_delete(st, key);
    snprintf(key, sizeof key, "%.250s/done", stem);
    store_delete(st, key);
}

// store_barrier that returns false on timeout, with the message in why.
static inline bool store_barrier_try(store_t *st, const char *name, int rank, int world,
                                     double timeout_s, char *why, size_t size) {
    if (timeout_s <= 0) timeout_s = st->timeout_s;
    if (world < 1 || rank < 0 || rank >= world)
        die("barrier '%s': rank %d is not in a world of %d", name, rank, world);
    unsigned seq = st->barrier_seq++;
    store_barrier_cleanup(st, seq);
    char stem[256], key[STORE_MAX_KEY + 1];
    snprintf(stem, sizeof stem, "barrier/%u/%.200s", seq, name);
    snprintf(st->past_barrier[seq % 2], sizeof st->past_barrier[0], "%s", stem);
    st->past_rank[seq % 2] = rank;
    snprintf(key, sizeof key, "%.250s/rank/%d", stem, rank);
    if (store_add(st, key, 1) != 1)
        die("rank %d joined barrier '%s' twice: were two processes given RANK=%d?", rank,
            name, rank);
    snprintf(key, sizeof key, "%.250s/count", stem);
    int64_t count = store_add(st, key, 1);
    if (count > world)
        die("barrier '%s' has more than %d members: is WORLD_SIZE the same on every rank?",
            name, world);
    snprintf(key, sizeof key, "%.250s/done", stem);
    if (count == world) store_set(st, key, "1", 1);
    else if (!store_wait(st, key, timeout_s)) {
        store_barrier_timeout(st, stem, name, world, timeout_s, why, size);
        return false;
    }
    return true;
}

// Returns when all `world` ranks have called it with the same name (timeout_s
// <= 0: the client's timeout); dies naming the missing ranks otherwise:
// "3 of 4 ranks joined barrier 'init' after 60 s; missing: rank 2".
// Every rank must call the same barriers in the same order.
static inline void store_barrier(store_t *st, const char *name, int rank, int world,
                                 double timeout_s) {
    char why[512];
    if (!store_barrier_try(st, name, rank, world, timeout_s, why, sizeof why)) die("%s", why);
}


// ---------------------------------------------------------------- patterns of start-up
//
// Three exchanges that every start-up needs, each a few store requests.
// Every rank of the group calls them with the same key, in the same order.

// Rank 0's value, on every rank: rank 0 sets key to the len bytes at value;
// every other rank waits for the key and copies its value into value (at
// most cap bytes). Returns the value's length.
static inline size_t store_broadcast(store_t *st, const char *key, int rank, void *value,
                                     size_t len, size_t cap, double timeout_s) {
    if (rank == 0) {
        store_set(st, key, value, len);
        return len;
    }
    return store_get(st, key, value, cap, timeout_s);
}

// Every rank's text, on every rank: each rank sets "<stem>/<rank>" to its
// text, then reads every rank's into all + r * size (size bytes per rank),
// ended by a NUL.
static inline void store_all_gather(store_t *st, const char *stem, int rank, int world,
                                    const char *mine, char *all, size_t size,
                                    double timeout_s) {
    char key[STORE_MAX_KEY + 1];
    snprintf(key, sizeof key, "%.1000s/%d", stem, rank);
    store_set(st, key, mine, strlen(mine));
    for (int r = 0; r < world; r++) {
        snprintf(key, sizeof key, "%.1000s/%d", stem, r);
        char *text = all + (size_t)r * size;
        text[store_get(st, key, text, size - 1, timeout_s)] = '\0';
    }
}

// True when every rank votes yes. The counter at key counts the noes; the
// barrier makes sure every vote is in before anyone reads it.
static inline bool store_vote(store_t *st, const char *key, int rank, int world, bool yes,
                              double timeout_s) {
    store_add(st, key, yes ? 0 : 1);
    store_barrier(st, key, rank, world, timeout_s);
    return store_add(st, key, 0) == 0;
}

#endif
