// store.h - a small TCP key-value store for start-up, and rendezvous.
//
// Before ranks can talk to each other they must find each other. NCCL's
// ranks need the same 128-byte unique id, the cpu backend's ranks need each
// other's listening addresses, and everyone needs to know when all have
// arrived. torch.distributed solves this with TCPStore: rank 0 (or the
// launcher) serves a key-value table on MASTER_ADDR:MASTER_PORT, and every
// rank connects as a client that can
//   set   a key,
//   get   a key, waiting until some other rank has set it,
//   add   to a counter atomically (how a barrier counts arrivals),
//   check whether a key exists, or wait for it.
// This header is the same idea in plain C: a server thread, a client, a
// barrier, and rendezvous() for the env://, tcp:// and file:// init methods.
//
// The server is one background thread running a poll() loop over the
// listening socket and every client, so it serves any number of ranks
// without a thread each. A get for a missing key does not busy-poll: the
// server parks the client as a waiter and answers when the key is set, or
// with "timeout" at the client's deadline.
//
// Wire protocol (all integers big-endian). Every message is a frame:
//   u32 body_length, then body_length bytes of body.
// A request body starts with a u8 operation; most carry a key:
//   HELLO  u32 magic, u16 version, u16 token_len, token, u16 session_len, session
//   SET    u16 key_len, key, u32 value_len, value
//   GET    u16 key_len, key, u32 timeout_ms
//   ADD    u16 key_len, key, i64 delta         (the value is kept as decimal text)
//   CHECK  u16 key_len, key
//   WAIT   u16 key_len, key, u32 timeout_ms
//   DELETE u16 key_len, key
// A reply body starts with a u8 status (OK, TIMEOUT, ERROR + text, or a
// refusal of the hello) followed by the answer. The hello's answer is the
// magic, the version and the server's random nonce, which file:// uses to
// tell a live record from a stale one.
//
// Limits, so that a confused or hostile peer cannot eat the memory: keys up
// to STORE_MAX_KEY bytes (1 KiB), values up to STORE_MAX_VALUE (1 MiB; the
// store is for ids and addresses, never for tensors), 256 MiB in all. A
// malformed or oversized request closes that one connection; the server
// keeps serving the others. A client must present the job's token (exactly:
// no token is a token too) before anything else; a stranger that says no
// hello is dropped after STORE_HELLO_GRACE_S, or sooner, oldest first, when
// the store runs out of file descriptors or slots for new connections.
//
// Deadlines: every client socket operation is a poll() with the time left,
// so a dead or stuck store ends the program with a message naming the
// store's address instead of a hang.
//
// Use:
//   store_server_t *srv = store_server_start("0.0.0.0", 29500, token);  // rank 0 / launcher
//   store_t *st = store_connect("node0", 29500, token, timeout_s);       // every rank
//   store_set(st, "nccl_id", &id, sizeof id);
//   store_get(st, "nccl_id", &id, sizeof id, timeout_s);   // waits for rank 0's set
//   store_barrier(st, "init", rank, world, timeout_s);
//   store_close(st); store_server_stop(srv);
// or, as chapters do, rendezvous("env://", -1, -1, 0) ... rendezvous_close().
#ifndef COURSE_STORE_H
#define COURSE_STORE_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "files.h"

enum {
    STORE_MAX_KEY = 1024,           // bytes, prefix included
    STORE_MAX_VALUE = 1 << 20,      // 1 MiB per value
    STORE_MAX_TOKEN = 255,          // job token and session label
    STORE_MAX_FRAME = STORE_MAX_VALUE + STORE_MAX_KEY + 64,
    STORE_MAX_CLIENTS = 4096,
    STORE_MAX_PREFIX = 256,
    STORE_MAX_HELLO = 2 * STORE_MAX_TOKEN + 32,
};
#define STORE_MAX_TOTAL_BYTES ((size_t)256 << 20)
#define STORE_MAGIC 0x43535430u     // "CST0"
#define STORE_VERSION 1
// A connection that has not said hello within this time is dropped, so
// that port scanners and stuck clients cannot hold slots forever.
#define STORE_HELLO_GRACE_S 30.0

enum { STORE_OP_HELLO = 1, STORE_OP_SET, STORE_OP_GET, STORE_OP_ADD, STORE_OP_CHECK,
       STORE_OP_WAIT, STORE_OP_DELETE };
enum { STORE_OK = 0, STORE_TIMEOUT, STORE_ERROR, STORE_REFUSED_TOKEN, STORE_REFUSED_VERSION,
       STORE_REFUSED_SESSION };

// ---------------------------------------------------------------- time

// Seconds on a clock that never jumps (wall-clock changes must not break deadlines).
static inline double store_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Milliseconds from now until deadline, for poll(); 0 once it has passed.
static inline int store_ms_left(double deadline) {
    double left = deadline - store_clock();
    if (left <= 0) return 0;
    if (left > 86400.0) return 86400 * 1000;
    return (int)ceil(left * 1000.0);
}

static inline void store_sleep(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    nanosleep(&ts, NULL);   // an early wake-up by a signal is harmless: callers loop
}

// The timeout every wait uses unless told otherwise: COURSE_TIMEOUT seconds, or 300.
static inline double course_timeout_default(void) {
    const char *text = getenv("COURSE_TIMEOUT");
    if (!text || !text[0]) return 300.0;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno || !isfinite(v) || v <= 0 || v > 1e7)
        die("COURSE_TIMEOUT must be a number of seconds greater than 0, got '%s'", text);
    return v;
}

// ---------------------------------------------------------------- bytes

// A growable byte buffer, for building frames.
typedef struct {
    uint8_t *data;
    size_t len, cap;
} store_bytes;

static inline void store_bytes_put(store_bytes *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (!grown) die("out of memory growing a store buffer to %zu bytes", cap);
        b->data = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
}

static inline void store_bytes_free(store_bytes *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

// Append an unsigned integer of `bytes` bytes, big-endian.
static inline void store_put_uint(store_bytes *b, uint64_t v, int bytes) {
    uint8_t raw[8];
    for (int i = bytes - 1; i >= 0; i--, v >>= 8) raw[i] = (uint8_t)(v & 0xff);
    store_bytes_put(b, raw, (size_t)bytes);
}

static inline void store_put_key(store_bytes *b, const char *key) {
    size_t n = strlen(key);
    store_put_uint(b, n, 2);
    store_bytes_put(b, key, n);
}

// Reads a body without ever running past its end: a short body clears ok.
typedef struct {
    const uint8_t *p;
    size_t left;
    bool ok;
} store_reader;

static inline uint64_t store_take_uint(store_reader *r, int bytes) {
    if (!r->ok || r->left < (size_t)bytes) {
        r->ok = false;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | r->p[i];
    r->p += bytes;
    r->left -= (size_t)bytes;
    return v;
}

static inline const uint8_t *store_take_bytes(store_reader *r, size_t n) {
    if (!r->ok || r->left < n) {
        r->ok = false;
        return NULL;
    }
    const uint8_t *at = r->p;
    r->p += n;
    r->left -= n;
    return at;
}

// Well formed and nothing left over.
static inline bool store_reader_done(const store_reader *r) { return r->ok && r->left == 0; }

static inline uint32_t store_read_u32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t store_random_u64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        // Without the kernel's generator, time and pid still differ per run.
        v = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(store_clock() * 1e9);
    }
    return v;
}

// ================================================================ server

typedef struct {
    char *key;
    uint8_t *value;
    size_t len;
} store_entry;

typedef struct {
    int fd;
    char peer[64];          // "10.0.0.2:51234", for warnings
    bool greeted;           // sent a valid hello
    bool closing;           // send what is queued, then close
    bool dead;              // close at the end of this round
    store_bytes in;         // bytes received, not yet a whole frame
    store_bytes out;        // replies not yet sent
    size_t out_sent;
    int wait_op;            // STORE_OP_GET or STORE_OP_WAIT while parked, else 0
    char *wait_key;
    double deadline;        // of the parked wait, or of the hello
} store_client;

typedef struct store_server {
    int listen_fd;
    int wake[2];            // a byte here tells the thread to stop
    int port;
    char host[256];
    char token[STORE_MAX_TOKEN + 1];
    char session[STORE_MAX_TOKEN + 1];
    uint64_t nonce;
    bool accepting;         // false: close the listening socket, serve who is connected
    bool stopping;          // the thread should end
    double accept_paused_until;
    pthread_t thread;
    pthread_mutex_t lock;   // held while the thread works; spawn holds it across fork()
    store_client *clients;
    size_t nclients, cap_clients;
    store_entry *entries;
    size_t nentries, cap_entries;
    size_t total_bytes;
    struct pollfd *pfds;
    size_t cap_pfds;
} store_server_t;

__attribute__((format(printf, 3, 4)))
static inline void store_client_drop(store_server_t *s, store_client *c, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "warning: the rendezvous store on port %d dropped a connection from %s: ",
            s->port, c->peer);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    c->dead = true;
}

static inline void store_client_reply(store_client *c, int status, const void *answer,
                                      size_t len) {
    store_put_uint(&c->out, 1 + len, 4);
    store_put_uint(&c->out, (uint64_t)status, 1);
    store_bytes_put(&c->out, answer, len);
}

static inline void store_client_error(store_client *c, const char *text) {
    store_client_reply(c, STORE_ERROR, text, strlen(text));
}

static inline long store_find(const store_server_t *s, const char *key) {
    // A linear scan: start-up uses a few keys per rank, and it reads plainly.
    for (size_t i = 0; i < s->nentries; i++)
        if (!strcmp(s->entries[i].key, key)) return (long)i;
    return -1;
}

// Store a copy of value under key. False when the store would grow past its limit.
static inline bool store_put_value(store_server_t *s, const char *key, const void *value,
                                   size_t len) {
    long at = store_find(s, key);
    size_t old = at >= 0 ? s->entries[at].len : 0;
    if (s->total_bytes - old + len > STORE_MAX_TOTAL_BYTES) return false;
    if (at < 0) {
        if (s->nentries == s->cap_entries) {
            s->cap_entries = s->cap_entries ? 2 * s->cap_entries : 64;
            s->entries = realloc(s->entries, s->cap_entries * sizeof *s->entries);
            if (!s->entries) die("out of memory in the rendezvous store");
        }
        at = (long)s->nentries++;
        s->entries[at] = (store_entry){strdup(key), NULL, 0};
        if (!s->entries[at].key) die("out of memory in the rendezvous store");
    }
    store_entry *e = &s->entries[at];
    free(e->value);
    e->value = xmalloc(len);
    if (len) memcpy(e->value, value, len);
    e->len = len;
    s->total_bytes = s->total_bytes - old + len;
    return true;
}

static inline void store_answer_waiter(store_client *c, const store_entry *e) {
    if (c->wait_op == STORE_OP_GET) store_client_reply(c, STORE_OK, e->value, e->len);
    else store_client_reply(c, STORE_OK, NULL, 0);
    free(c->wait_key);
    c->wait_key = NULL;
    c->wait_op = 0;
}

// A key appeared or changed: answer everyone parked on it.
static inline void store_wake_waiters(store_server_t *s, const char *key) {
    long at = store_find(s, key);
    for (size_t i = 0; i < s->nclients && at >= 0; i++) {
        store_client *c = &s->clients[i];
        if (c->wait_op && !strcmp(c->wait_key, key)) store_answer_waiter(c, &s->entries[at]);
    }
}

static inline void store_begin_wait(store_server_t *s, store_client *c, int op, const char *key,
                                    uint32_t timeout_ms) {
    long at = store_find(s, key);
    c->wait_op = op;
    if (at >= 0) {
        c->wait_key = NULL;
        store_answer_waiter(c, &s->entries[at]);
    } else if (timeout_ms == 0) {
        c->wait_op = 0;
        store_client_reply(c, STORE_TIMEOUT, NULL, 0);
    } else {
        c->wait_key = strdup(key);
        if (!c->wait_key) die("out of memory in the rendezvous store");
        c->deadline = store_clock() + timeout_ms / 1000.0;
    }
}

static inline void store_handle_hello(store_server_t *s, store_client *c, store_reader *r) {
    uint32_t magic = (uint32_t)store_take_uint(r, 4);
    uint16_t version = (uint16_t)store_take_uint(r, 2);
    size_t token_len = store_take_uint(r, 2);
    const uint8_t *token = store_take_bytes(r, token_len);
    size_t session_len = store_take_uint(r, 2);
    const uint8_t *session = store_take_bytes(r, session_len);
    if (!store_reader_done(r) || magic != STORE_MAGIC) {
        store_client_drop(s, c, "not a rendezvous-store hello (wrong magic number)");
        return;
    }
    store_bytes a = {0};
    if (version != STORE_VERSION) {
        store_put_uint(&a, STORE_VERSION, 2);
        store_client_reply(c, STORE_REFUSED_VERSION, a.data, a.len);
        store_bytes_free(&a);
        c->closing = true;
        return;
    }
    // Tokens must match exactly, the empty one included: a store started
    // without a token must not let in the workers of a job that has one.
    if (token_len != strlen(s->token) || memcmp(token, s->token, token_len) != 0) {
        fprintf(stderr, "warning: the rendezvous store on port %d refused %s: it presented "
                "another job's token\n", s->port, c->peer);
        store_client_reply(c, STORE_REFUSED_TOKEN, NULL, 0);
        c->closing = true;
        return;
    }
    if (s->session[0] && session_len &&
        (session_len != strlen(s->session) || memcmp(session, s->session, session_len))) {
        store_client_reply(c, STORE_REFUSED_SESSION, NULL, 0);  // quietly: the client retries
        c->closing = true;
        return;
    }
    store_put_uint(&a, STORE_MAGIC, 4);
    store_put_uint(&a, STORE_VERSION, 2);
    store_put_uint(&a, s->nonce, 8);
    store_client_reply(c, STORE_OK, a.data, a.len);
    store_bytes_free(&a);
    c->greeted = true;
}

static inline void store_handle_add(store_server_t *s, store_client *c, const char *key,
                                    int64_t delta) {
    long at = store_find(s, key);
    long long now = 0;
    if (at >= 0) {
        char text[32];
        const store_entry *e = &s->entries[at];
        char *end;
        size_t n = e->len < sizeof text - 1 ? e->len : sizeof text - 1;
        memcpy(text, e->value, n);
        text[n] = '\0';
        errno = 0;
        now = strtoll(text, &end, 10);
        if (e->len == 0 || e->len >= sizeof text || *end || errno) {
            store_client_error(c, "the key holds a value that is not a counter");
            return;
        }
    }
    if (__builtin_add_overflow(now, (long long)delta, &now)) {
        store_client_error(c, "the counter would overflow");
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", now);
    if (!store_put_value(s, key, text, (size_t)n)) {
        store_client_error(c, "the store is full (256 MiB in all)");
        return;
    }
    store_bytes a = {0};
    store_put_uint(&a, (uint64_t)now, 8);
    store_client_reply(c, STORE_OK, a.data, a.len);
    store_bytes_free(&a);
    store_wake_waiters(s, key);
}

static inline void store_handle_set(store_server_t *s, store_client *c, const char *key,
                                    store_reader *r) {
    size_t len = store_take_uint(r, 4);
    const uint8_t *value = store_take_bytes(r, len);
    if (!store_reader_done(r) || len > STORE_MAX_VALUE) {
        store_client_drop(s, c, "malformed or oversized set request");
        return;
    }
    if (!store_put_value(s, key, value, len)) {
        store_client_error(c, "the store is full (256 MiB in all)");
        return;
    }
    store_client_reply(c, STORE_OK, NULL, 0);
    store_wake_waiters(s, key);
}

static inline void store_handle_keyed(store_server_t *s, store_client *c, int op,
                                      const char *key, store_reader *r) {
    if (op == STORE_OP_SET) {
        store_handle_set(s, c, key, r);
        return;
    }
    uint64_t number = 0;
    if (op == STORE_OP_GET || op == STORE_OP_WAIT) number = store_take_uint(r, 4);
    if (op == STORE_OP_ADD) number = store_take_uint(r, 8);
    if (!store_reader_done(r) || op < STORE_OP_GET || op > STORE_OP_DELETE) {
        store_client_drop(s, c, "malformed request (operation %d)", op);
        return;
    }
    long at = store_find(s, key);
    uint8_t flag = at >= 0;
    if (op == STORE_OP_GET || op == STORE_OP_WAIT) {
        store_begin_wait(s, c, op, key, (uint32_t)number);
    } else if (op == STORE_OP_ADD) {
        store_handle_add(s, c, key, (int64_t)number);
    } else if (op == STORE_OP_CHECK) {
        store_client_reply(c, STORE_OK, &flag, 1);
    } else {  // DELETE
        if (at >= 0) {
            s->total_bytes -= s->entries[at].len;
            free(s->entries[at].key);
            free(s->entries[at].value);
            s->entries[at] = s->entries[--s->nentries];
        }
        store_client_reply(c, STORE_OK, &flag, 1);
    }
}

static inline void store_handle_request(store_server_t *s, store_client *c, const uint8_t *body,
                                        size_t n) {
    store_reader r = {body, n, true};
    int op = (int)store_take_uint(&r, 1);
    if (!c->greeted) {
        if (op == STORE_OP_HELLO) store_handle_hello(s, c, &r);
        else store_client_drop(s, c, "the first message was not a hello (not a store client?)");
        return;
    }
    size_t key_len = store_take_uint(&r, 2);
    const uint8_t *raw = store_take_bytes(&r, key_len);
    if (!r.ok || key_len == 0 || key_len > STORE_MAX_KEY || memchr(raw, 0, key_len)) {
        store_client_drop(s, c, "malformed key in request (operation %d)", op);
        return;
    }
    char key[STORE_MAX_KEY + 1];
    memcpy(key, raw, key_len);
    key[key_len] = '\0';
    store_handle_keyed(s, c, op, key, &r);
}

// Handle every whole frame received, unless the client is parked on a wait.
static inline void store_serve_frames(store_server_t *s, store_client *c) {
    size_t used = 0;
    while (!c->dead && !c->closing && !c->wait_op && c->in.len - used >= 4) {
        uint32_t n = store_read_u32(c->in.data + used);
        // Before its hello a client gets no more than a hello needs: a stranger
        // cannot make the store hold a megabyte per connection.
        uint32_t limit = c->greeted ? STORE_MAX_FRAME : STORE_MAX_HELLO;
        if (n == 0 || n > limit) {
            store_client_drop(s, c, "a frame of %u bytes (limit %u): not a store client?", n,
                              limit);
            break;
        }
        if (c->in.len - used < 4 + (size_t)n) break;
        store_handle_request(s, c, c->in.data + used + 4, n);
        used += 4 + (size_t)n;
    }
    if (used) {
        memmove(c->in.data, c->in.data + used, c->in.len - used);
        c->in.len -= used;
    }
}

static inline void store_client_read(store_server_t *s, store_client *c) {
    uint8_t chunk[65536];
    size_t room = 4 + (size_t)STORE_MAX_FRAME - c->in.len;
    if (room == 0) return;   // a parked client sent ahead; read on once it is answered
    ssize_t n = recv(c->fd, chunk, room < sizeof chunk ? room : sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {   // closed by the client (the normal end) or reset
        c->dead = true;
        return;
    }
    store_bytes_put(&c->in, chunk, (size_t)n);
    // A frame header that promises too much is refused at once, not after 1 MiB arrives.
    if (c->in.len >= 4 && !c->wait_op) store_serve_frames(s, c);
}

static inline void store_client_flush(store_client *c) {
    while (c->out_sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_sent, c->out.len - c->out_sent,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) {
            c->dead = true;
            return;
        }
        c->out_sent += (size_t)n;
    }
    c->out.len = c->out_sent = 0;
    if (c->closing) c->dead = true;
}

static inline void store_client_free(store_client *c) {
    if (c->fd >= 0) close(c->fd);
    store_bytes_free(&c->in);
    store_bytes_free(&c->out);
    free(c->wait_key);
}

static inline void store_format_peer(const struct sockaddr_storage *a, char *out, size_t size) {
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)a;
        inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof ip);
        port = ntohs(v4->sin_port);
    } else if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)a;
        inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof ip);
        port = ntohs(v6->sin6_port);
    }
    snprintf(out, size, "%s:%d", ip, port);
}

static inline void store_server_add_client(store_server_t *s, int fd,
                                           const struct sockaddr_storage *peer) {
    if (s->nclients == s->cap_clients) {
        s->cap_clients = s->cap_clients ? 2 * s->cap_clients : 16;
        s->clients = realloc(s->clients, s->cap_clients * sizeof *s->clients);
        if (!s->clients) die("out of memory in the rendezvous store");
    }
    store_client *c = &s->clients[s->nclients++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->deadline = store_clock() + STORE_HELLO_GRACE_S;
    store_format_peer(peer, c->peer, sizeof c->peer);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small replies, sent now
}

// The connection that has waited longest without saying hello, or NULL.
static inline store_client *store_oldest_stranger(store_server_t *s) {
    store_client *oldest = NULL;
    for (size_t i = 0; i < s->nclients; i++) {
        store_client *c = &s->clients[i];
        if (c->greeted || c->closing || c->dead) continue;
        if (!oldest || c->deadline < oldest->deadline) oldest = c;  // same grace: earliest deadline = oldest
    }
    return oldest;
}

// Makes room for a new connection by closing the oldest stranger at once
// (its slot goes at the end of the round). False when there is none.
static inline bool store_evict_stranger(store_server_t *s, const char *why) {
    store_client *c = store_oldest_stranger(s);
    if (!c) return false;
    store_client_drop(s, c, "%s; it had not said hello", why);
    close(c->fd);
    c->fd = -1;
    return true;
}

// Takes every waiting connection. When the store runs out of file
// descriptors or slots, strangers that have not said hello make room, oldest
// first: a thousand idle connections (a scanner, a stuck job) must not lock
// the ranks out until their grace period ends.
static inline void store_server_accept(store_server_t *s) {
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t len = sizeof peer;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&peer, &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            bool no_fds = errno == EMFILE || errno == ENFILE;
            if (no_fds && store_evict_stranger(s, "no file descriptors left for new connections")) continue;
            if (no_fds || errno == ENOMEM || errno == ENOBUFS)
                s->accept_paused_until = store_clock() + 0.1;  // do not spin
            return;  // EAGAIN (no one more), ECONNABORTED, EINTR: try next round
        }
        if (s->nclients >= STORE_MAX_CLIENTS &&
            !store_evict_stranger(s, "the store has as many connections as it takes")) {
            close(fd);
            continue;
        }
        store_server_add_client(s, fd, &peer);
    }
}

// Answer "timeout" to parked waits whose time is up, and drop silent newcomers.
static inline void store_server_expire(store_server_t *s) {
    double now = store_clock();
    for (size_t i = 0; i < s->nclients; i++) {
        store_client *c = &s->clients[i];
        if (c->dead || now < c->deadline) continue;
        if (c->wait_op) {
            store_client_reply(c, STORE_TIMEOUT, NULL, 0);
            free(c->wait_key);
            c->wait_key = NULL;
            c->wait_op = 0;
        } else if (!c->greeted) {
            store_client_drop(s, c, "no hello within %.0f s", STORE_HELLO_GRACE_S);
        }
    }
}

static inline void store_server_reap(store_server_t *s) {
    for (size_t i = 0; i < s->nclients;) {
        if (s->clients[i].dead) {
            store_client_free(&s->clients[i]);
            s->clients[i] = s->clients[--s->nclients];
        } else {
            i++;
        }
    }
}

// pfds[0] = wake pipe, pfds[1] = listening socket (or -1), pfds[2 + i] = client i.
static inline size_t store_server_fill_pollfds(store_server_t *s) {
    size_t n = 2 + s->nclients;
    if (n > s->cap_pfds) {
        s->cap_pfds = 2 * n;
        s->pfds = realloc(s->pfds, s->cap_pfds * sizeof *s->pfds);
        if (!s->pfds) die("out of memory in the rendezvous store");
    }
    bool listen_now = s->accepting && store_clock() >= s->accept_paused_until;
    s->pfds[0] = (struct pollfd){s->wake[0], POLLIN, 0};
    s->pfds[1] = (struct pollfd){listen_now ? s->listen_fd : -1, POLLIN, 0};
    for (size_t i = 0; i < s->nclients; i++) {
        const store_client *c = &s->clients[i];
        short events = c->in.len < 4 + (size_t)STORE_MAX_FRAME ? POLLIN : 0;
        if (c->out_sent < c->out.len) events |= POLLOUT;
        s->pfds[2 + i] = (struct pollfd){c->fd, events, 0};
    }
    return n;
}

static inline int store_server_poll_ms(const store_server_t *s) {
    double next = store_clock() + 1.0;   // wake at least every second
    for (size_t i = 0; i < s->nclients; i++) {
        const store_client *c = &s->clients[i];
        if ((c->wait_op || !c->greeted) && c->deadline < next) next = c->deadline;
    }
    if (s->accept_paused_until > store_clock() && s->accept_paused_until < next)
        next = s->accept_paused_until;
    return store_ms_left(next);
}

static inline void store_server_round(store_server_t *s, size_t npfds) {
    if (s->pfds[1].revents & POLLIN) store_server_accept(s);
    for (size_t i = 2; i < npfds; i++) {
        store_client *c = &s->clients[i - 2];
        if (s->pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) store_client_read(s, c);
    }
    store_server_expire(s);
    for (size_t i = 0; i < s->nclients; i++) store_serve_frames(s, &s->clients[i]);
    for (size_t i = 0; i < s->nclients; i++)
        if (!s->clients[i].dead) store_client_flush(&s->clients[i]);
    store_server_reap(s);
}

static inline void *store_server_main(void *arg) {
    store_server_t *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        if (!s->accepting && s->listen_fd >= 0) {   // store_server_stop_accepting asked
            close(s->listen_fd);
            s->listen_fd = -1;
        }
        size_t n = store_server_fill_pollfds(s);
        int timeout_ms = store_server_poll_ms(s);
        pthread_mutex_unlock(&s->lock);
        int rc = poll(s->pfds, n, timeout_ms);
        if (rc < 0 && errno != EINTR)
            die("poll in the rendezvous store failed: %s", strerror(errno));
        pthread_mutex_lock(&s->lock);
        if (rc < 0) continue;
        if (s->pfds[0].revents & POLLIN) {
            char drain[64];
            while (read(s->wake[0], drain, sizeof drain) > 0) {}
        }
        if (!s->stopping) store_server_round(s, n);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static inline bool store_is_loopback(const char *host) {
    return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

// Bind and listen on host:port; dies with a message naming them.
// What the "port already in use" error suggests: whoever chose the port
// knows how to choose another (ddprun's flag, MASTER_PORT, a tcp:// URL).
static const char *store_port_advice = "choose another port";

static inline int store_listen(const char *host, int port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *list;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    int rc = getaddrinfo(host, port_text, &hints, &list);
    if (rc) die("cannot serve the rendezvous store on '%s': %s", host, gai_strerror(rc));
    int fd = socket(list->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK_SYS(fd);
    int one = 1;
    // Lets a new job reuse the port at once while the last one's sockets sit in
    // TIME_WAIT; it does not let two live servers share a port on Linux.
    CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
    if (bind(fd, list->ai_addr, list->ai_addrlen) < 0) {
        int err = errno;
        freeaddrinfo(list);
        close(fd);
        if (err == EADDRINUSE)
            die("port %d is already in use on %s (another job? %s)", port, host, store_port_advice);
        die("cannot serve the rendezvous store on %s:%d: %s", host, port, strerror(err));
    }
    freeaddrinfo(list);
    CHECK_SYS(listen(fd, SOMAXCONN));
    return fd;
}

static inline int store_bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    CHECK_SYS(getsockname(fd, (struct sockaddr *)&a, &len));
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

// As store_server_start, and clients that name a session (rendezvous does: one
// per round) must name this one; others are refused so that they retry.
static inline store_server_t *store_server_start_session(const char *bind_host, int port,
                                                         const char *token,
                                                         const char *session) {
    if (port < 0 || port > 65535) die("store port %d is out of range 0..65535", port);
    if (!token) token = "";
    if (!session) session = "";
    if (strlen(token) > STORE_MAX_TOKEN || strlen(session) > STORE_MAX_TOKEN)
        die("job token or session longer than %d bytes", STORE_MAX_TOKEN);
    store_server_t *s = xcalloc(1, sizeof *s);
    s->listen_fd = store_listen(bind_host, port);
    s->port = store_bound_port(s->listen_fd);
    snprintf(s->host, sizeof s->host, "%s", bind_host);
    snprintf(s->token, sizeof s->token, "%s", token);
    snprintf(s->session, sizeof s->session, "%s", session);
    s->nonce = store_random_u64();
    s->accepting = true;
    CHECK_SYS(pipe2(s->wake, O_CLOEXEC | O_NONBLOCK));
    pthread_mutex_init(&s->lock, NULL);
    // The thread takes no signals: Ctrl-C must reach the main thread's handlers.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, store_server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) die("cannot start the rendezvous store thread: %s", strerror(rc));
    return s;
}

// Serve on bind_host:port (port 0: the system picks; see store_server_port).
// token: the job token clients must present (NULL or "": clients must present none).
static inline store_server_t *store_server_start(const char *bind_host, int port,
                                                 const char *token) {
    return store_server_start_session(bind_host, port, token, NULL);
}

static inline int store_server_port(const store_server_t *s) { return s->port; }
static inline uint64_t store_server_nonce(const store_server_t *s) { return s->nonce; }

// Clients connected now that have said a proper hello (strangers do not count).
static inline size_t store_server_clients(store_server_t *s) {
    pthread_mutex_lock(&s->lock);
    size_t n = 0;
    for (size_t i = 0; i < s->nclients; i++) n += s->clients[i].greeted && !s->clients[i].dead;
    pthread_mutex_unlock(&s->lock);
    return n;
}

static inline void store_server_wake(store_server_t *s) {
    char byte = 1;
    while (write(s->wake[1], &byte, 1) < 0 && errno == EINTR) {}  // EAGAIN: already woken
}

// Stop taking new connections (the thread closes the listening socket, so the
// port is free again); the clients already connected are still served.
static inline void store_server_stop_accepting(store_server_t *s) {
    pthread_mutex_lock(&s->lock);
    s->accepting = false;
    pthread_mutex_unlock(&s->lock);
    store_server_wake(s);
}

// Before stopping: wait (at most `seconds`) until every client has hung up, so that
// ranks still finishing their last requests get their answers.
static inline void store_server_drain(store_server_t *s, double seconds) {
    double deadline = store_clock() + seconds;
    store_server_stop_accepting(s);
    while (store_server_clients(s) > 0 && store_clock() < deadline) store_sleep(0.01);
}

// Stops the thread, then closes every socket and frees everything.
static inline void store_server_stop(store_server_t *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_mutex_unlock(&s->lock);
    store_server_wake(s);
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->nclients; i++) store_client_free(&s->clients[i]);
    for (size_t i = 0; i < s->nentries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    if (s->listen_fd >= 0) close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    pthread_mutex_destroy(&s->lock);
    free(s->clients);
    free(s->entries);
    free(s->pfds);
    free(s);
}

// fork() support (spawn.h): the parent holds the lock across fork() so that the
// child's copy of the server is consistent, and the child closes its copies
// of the server's sockets so that only the parent's thread owns them.
static inline void store_server_lock(store_server_t *s) { pthread_mutex_lock(&s->lock); }
static inline void store_server_unlock(store_server_t *s) { pthread_mutex_unlock(&s->lock); }
static inline void store_server_forget_in_child(store_server_t *s) {
    for (size_t i = 0; i < s->nclients; i++) close(s->clients[i].fd);
    if (s->listen_fd >= 0) close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
}

// ================================================================ client

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
static inline int store_send_frame(int fd, const store_bytes *body, double deadline) {
    store_bytes frame = {0};
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
typedef enum { STORE_HELLO_OK, STORE_HELLO_RETRY, STORE_HELLO_FATAL } store_hello_result;

static inline store_hello_result store_hello_answer(const uint8_t *body, size_t len,
                                                    const char *where, uint64_t *nonce,
                                                    char *why, size_t size) {
    store_reader r = {body, len, true};
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

static inline store_hello_result store_hello(int fd, const char *where, const char *token,
                                             const char *session, double deadline,
                                             uint64_t *nonce, char *why, size_t size) {
    store_bytes req = {0};
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
    store_hello_result result = store_hello_answer(body, len, where, nonce, why, size);
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
    store_hello_result rc = store_hello(fd, where, token, session, deadline, &nonce, why, size);
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

static inline store_t *store_connect_session(const char *host, int port, const char *token,
                                             const char *session, double timeout_s) {
    if (timeout_s <= 0) timeout_s = course_timeout_default();
    if (port < 1 || port > 65535) die("store port %d is out of range 1..65535", port);
    double deadline = store_clock() + timeout_s, pause = 0.02;
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
                                       const store_bytes *req, double deadline, size_t *len) {
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
                                     const store_bytes *extra, double wait_s, size_t *len) {
    char full[STORE_MAX_KEY + 1];
    store_full_key(st, key, full);
    store_bytes req = {0};
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
    store_bytes extra = {0};
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
    store_bytes extra = {0};
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
    store_bytes extra = {0};
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
    store_bytes extra = {0};
    store_put_uint(&extra, (uint64_t)delta, 8);
    size_t n;
    uint8_t *reply = store_request(st, STORE_OP_ADD, "add", key, &extra, 0, &n);
    store_bytes_free(&extra);
    store_reader r = {reply + 1, n - 1, true};
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

// ================================================================ rendezvous

typedef struct {
    store_t *store;
    store_server_t *server;   // set on the rank that serves the store
    int rank, world_size;
    double timeout_s;
    char *file_path;          // file:// only: the record rank 0 wrote
} rendezvous_t;

// An integer from the environment: false when unset; dies when malformed.
static inline bool store_env_int(const char *name, int min, int max, int *out) {
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
    if (*world < 0 && !store_env_int("WORLD_SIZE", 1, 1 << 20, world)) {
        if (!strcmp(method, "env://")) *world = 1;   // started by hand: one process
        else die("%s rendezvous needs the world size: pass it or set WORLD_SIZE", method);
    }
    if (*rank < 0 && !store_env_int("RANK", 0, 1 << 20, rank)) {
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
    bool have_port = store_env_int("MASTER_PORT", 1, 65535, &port);
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
} rendezvous_record;

static inline void rendezvous_write_record(const char *path, const rendezvous_record *rec) {
    char text[600], err[FILES_PATH_MAX + 200];
    int len = snprintf(text, sizeof text, "course-rendezvous 1\nhost %s\nport %d\nnonce %016"
                       PRIx64 "\nworld %d\nstarted %lld\npid %d\n", rec->host, rec->port,
                       rec->nonce, rec->world, (long long)time(NULL), (int)getpid());
    if (!files_write_atomic(path, text, (size_t)len, err, sizeof err))
        die("file:// rendezvous cannot write its record: %s (the directory must exist and be "
            "writable on every node)", err);
}

// False (with why) when the record is missing or malformed.
static inline bool rendezvous_read_record(const char *path, rendezvous_record *rec, char *why,
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
    rendezvous_record rec = {.port = store_server_port(r->server), .world = r->world_size,
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
        rendezvous_record rec;
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
    rendezvous_record rec;
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
    int restart = 0;
    store_env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, &restart);
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
