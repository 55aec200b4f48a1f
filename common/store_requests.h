// store_requests.h - what the rendezvous store's server (store_server.h)
// keeps and how it answers: the table of keys and values, the clients it
// serves as it sees them, the clients parked on a key that is not there
// yet, and one handler per request of store_wire.h - the hello, which
// checks the job's token, then set, get, add, check, wait, delete.
// store_server.h holds the connections and the thread that calls these.
#ifndef COURSE_STORE_REQUESTS_H
#define COURSE_STORE_REQUESTS_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>

#include "store_wire.h"

typedef struct {
    char *key;
    uint8_t *value;
    size_t len;
} store_entry_t;

typedef struct {            // one connected client, as the server sees it
    int fd;
    char peer[64];          // "10.0.0.2:51234", for warnings
    bool greeted;           // sent a valid hello
    bool closing;           // send what is queued, then close
    bool dead;              // close at the end of this round
    store_bytes_t in;         // bytes received, not yet a whole frame
    store_bytes_t out;        // replies not yet sent
    size_t out_sent;
    int wait_op;            // STORE_OP_GET or STORE_OP_WAIT while parked, else 0
    char *wait_key;
    double deadline;        // of the parked wait, or of the hello
} store_conn_t;

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
    bool running;           // the thread has started (see store_server_wait_running)
    double accept_paused_until;
    pthread_t thread;
    pthread_mutex_t lock;   // held while the thread works; spawn holds it across fork()
    store_conn_t *clients;
    size_t nclients, cap_clients;
    store_entry_t *entries;
    size_t nentries, cap_entries;
    size_t total_bytes;
    struct pollfd *pfds;
    size_t cap_pfds;
} store_server_t;

__attribute__((format(printf, 3, 4)))
static inline void store_conn_drop(store_server_t *s, store_conn_t *c, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "warning: the rendezvous store on port %d dropped a connection from %s: ",
            s->port, c->peer);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    c->dead = true;
}

static inline void store_conn_reply(store_conn_t *c, int status, const void *answer,
                                    size_t len) {
    store_put_uint(&c->out, 1 + len, 4);
    store_put_uint(&c->out, (uint64_t)status, 1);
    store_bytes_put(&c->out, answer, len);
}

static inline void store_conn_error(store_conn_t *c, const char *text) {
    store_conn_reply(c, STORE_ERROR, text, strlen(text));
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
        s->entries[at] = (store_entry_t){strdup(key), NULL, 0};
        if (!s->entries[at].key) die("out of memory in the rendezvous store");
    }
    store_entry_t *e = &s->entries[at];
    free(e->value);
    e->value = xmalloc(len);
    if (len) memcpy(e->value, value, len);
    e->len = len;
    s->total_bytes = s->total_bytes - old + len;
    return true;
}

static inline void store_answer_waiter(store_conn_t *c, const store_entry_t *e) {
    if (c->wait_op == STORE_OP_GET) store_conn_reply(c, STORE_OK, e->value, e->len);
    else store_conn_reply(c, STORE_OK, NULL, 0);
    free(c->wait_key);
    c->wait_key = NULL;
    c->wait_op = 0;
}

// A key appeared or changed: answer everyone parked on it.
static inline void store_wake_waiters(store_server_t *s, const char *key) {
    long at = store_find(s, key);
    for (size_t i = 0; i < s->nclients && at >= 0; i++) {
        store_conn_t *c = &s->clients[i];
        if (c->wait_op && !strcmp(c->wait_key, key)) store_answer_waiter(c, &s->entries[at]);
    }
}

static inline void store_begin_wait(store_server_t *s, store_conn_t *c, int op, const char *key,
                                    uint32_t timeout_ms) {
    long at = store_find(s, key);
    c->wait_op = op;
    if (at >= 0) {
        c->wait_key = NULL;
        store_answer_waiter(c, &s->entries[at]);
    } else if (timeout_ms == 0) {
        c->wait_op = 0;
        store_conn_reply(c, STORE_TIMEOUT, NULL, 0);
    } else {
        c->wait_key = strdup(key);
        if (!c->wait_key) die("out of memory in the rendezvous store");
        c->deadline = store_clock() + timeout_ms / 1000.0;
    }
}

static inline void store_handle_hello(store_server_t *s, store_conn_t *c, store_reader_t *r) {
    uint32_t magic = (uint32_t)store_take_uint(r, 4);
    uint16_t version = (uint16_t)store_take_uint(r, 2);
    size_t token_len = store_take_uint(r, 2);
    const uint8_t *token = store_take_bytes(r, token_len);
    size_t session_len = store_take_uint(r, 2);
    const uint8_t *session = store_take_bytes(r, session_len);
    if (!store_reader_done(r) || magic != STORE_MAGIC) {
        store_conn_drop(s, c, "not a rendezvous-store hello (wrong magic number)");
        return;
    }
    store_bytes_t a = {0};
    if (version != STORE_VERSION) {
        store_put_uint(&a, STORE_VERSION, 2);
        store_conn_reply(c, STORE_REFUSED_VERSION, a.data, a.len);
        store_bytes_free(&a);
        c->closing = true;
        return;
    }
    // Tokens must match exactly, the empty one included: a store started
    // without a token must not let in the workers of a job that has one.
    // The comparison takes the same time however much of a guess was right.
    if (!store_token_equal(token, token_len, s->token, strlen(s->token), NULL)) {
        fprintf(stderr, "warning: the rendezvous store on port %d refused %s: it presented "
                "another job's token\n", s->port, c->peer);
        store_conn_reply(c, STORE_REFUSED_TOKEN, NULL, 0);
        c->closing = true;
        return;
    }
    if (s->session[0] && session_len &&
        (session_len != strlen(s->session) || memcmp(session, s->session, session_len))) {
        store_conn_reply(c, STORE_REFUSED_SESSION, NULL, 0);  // quietly: the client retries
        c->closing = true;
        return;
    }
    store_put_uint(&a, STORE_MAGIC, 4);
    store_put_uint(&a, STORE_VERSION, 2);
    store_put_uint(&a, s->nonce, 8);
    store_conn_reply(c, STORE_OK, a.data, a.len);
    store_bytes_free(&a);
    c->greeted = true;
}

static inline void store_handle_add(store_server_t *s, store_conn_t *c, const char *key,
                                    int64_t delta) {
    long at = store_find(s, key);
    long long now = 0;
    if (at >= 0) {
        char text[32];
        const store_entry_t *e = &s->entries[at];
        char *end;
        size_t n = e->len < sizeof text - 1 ? e->len : sizeof text - 1;
        memcpy(text, e->value, n);
        text[n] = '\0';
        errno = 0;
        now = strtoll(text, &end, 10);
        if (e->len == 0 || e->len >= sizeof text || *end || errno) {
            store_conn_error(c, "the key holds a value that is not a counter");
            return;
        }
    }
    if (__builtin_add_overflow(now, (long long)delta, &now)) {
        store_conn_error(c, "the counter would overflow");
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", now);
    if (!store_put_value(s, key, text, (size_t)n)) {
        store_conn_error(c, "the store is full (256 MiB in all)");
        return;
    }
    store_bytes_t a = {0};
    store_put_uint(&a, (uint64_t)now, 8);
    store_conn_reply(c, STORE_OK, a.data, a.len);
    store_bytes_free(&a);
    store_wake_waiters(s, key);
}

static inline void store_handle_set(store_server_t *s, store_conn_t *c, const char *key,
                                    store_reader_t *r) {
    size_t len = store_take_uint(r, 4);
    const uint8_t *value = store_take_bytes(r, len);
    if (!store_reader_done(r) || len > STORE_MAX_VALUE) {
        store_conn_drop(s, c, "malformed or oversized set request");
        return;
    }
    if (!store_put_value(s, key, value, len)) {
        store_conn_error(c, "the store is full (256 MiB in all)");
        return;
    }
    store_conn_reply(c, STORE_OK, NULL, 0);
    store_wake_waiters(s, key);
}

static inline void store_handle_keyed(store_server_t *s, store_conn_t *c, int op,
                                      const char *key, store_reader_t *r) {
    if (op == STORE_OP_SET) {
        store_handle_set(s, c, key, r);
        return;
    }
    uint64_t number = 0;
    if (op == STORE_OP_GET || op == STORE_OP_WAIT) number = store_take_uint(r, 4);
    if (op == STORE_OP_ADD) number = store_take_uint(r, 8);
    if (!store_reader_done(r) || op < STORE_OP_GET || op > STORE_OP_DELETE) {
        store_conn_drop(s, c, "malformed request (operation %d)", op);
        return;
    }
    long at = store_find(s, key);
    uint8_t flag = at >= 0;
    if (op == STORE_OP_GET || op == STORE_OP_WAIT) {
        store_begin_wait(s, c, op, key, (uint32_t)number);
    } else if (op == STORE_OP_ADD) {
        store_handle_add(s, c, key, (int64_t)number);
    } else if (op == STORE_OP_CHECK) {
        store_conn_reply(c, STORE_OK, &flag, 1);
    } else {  // DELETE
        if (at >= 0) {
            s->total_bytes -= s->entries[at].len;
            free(s->entries[at].key);
            free(s->entries[at].value);
            s->entries[at] = s->entries[--s->nentries];
        }
        store_conn_reply(c, STORE_OK, &flag, 1);
    }
}

static inline void store_handle_request(store_server_t *s, store_conn_t *c, const uint8_t *body,
                                        size_t n) {
    store_reader_t r = {body, n, true};
    int op = (int)store_take_uint(&r, 1);
    if (!c->greeted) {
        if (op == STORE_OP_HELLO) store_handle_hello(s, c, &r);
        else store_conn_drop(s, c, "the first message was not a hello (not a store client?)");
        return;
    }
    size_t key_len = store_take_uint(&r, 2);
    const uint8_t *raw = store_take_bytes(&r, key_len);
    if (!r.ok || key_len == 0 || key_len > STORE_MAX_KEY || memchr(raw, 0, key_len)) {
        store_conn_drop(s, c, "malformed key in request (operation %d)", op);
        return;
    }
    char key[STORE_MAX_KEY + 1];
    memcpy(key, raw, key_len);
    key[key_len] = '\0';
    store_handle_keyed(s, c, op, key, &r);
}

// Handle every whole frame received, unless the client is parked on a wait.
static inline void store_serve_frames(store_server_t *s, store_conn_t *c) {
    size_t used = 0;
    while (!c->dead && !c->closing && !c->wait_op && c->in.len - used >= 4) {
        uint32_t n = store_read_u32(c->in.data + used);
        // Before its hello a client gets no more than a hello needs: a stranger
        // cannot make the store hold a megabyte per connection.
        uint32_t limit = c->greeted ? STORE_MAX_FRAME : STORE_MAX_HELLO;
        if (n == 0 || n > limit) {
            store_conn_drop(s, c, "a frame of %u bytes (limit %u): not a store client?", n,
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

#endif
