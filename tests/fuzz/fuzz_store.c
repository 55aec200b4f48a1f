// fuzz_store - the server side of the rendezvous store, common/store.h: the
// byte streams of up to four clients, read by the real server code
// (store_server_round: poll, recv, frames, requests, replies, send) in this
// thread, over socket pairs instead of TCP.
//
// Input: a script of steps; each step is one byte, then its arguments:
//   byte & 3          the client it is about (connected on first use)
//   (byte >> 2) & 7   0-3: send the next LEN bytes (LEN: one byte) as they are
//                     4: send a correct hello (the job's token)
//                     5: hang up (the server must notice and forget it)
//                     6: time passes (every deadline is now): hello grace
//                        periods and parked waits run out
//                     7: send N * 64 zero bytes (N: two bytes), for large
//                        and partial frames
// After each step the server runs one round, and the replies are read back.
// Promises checked:
// - every reply is a well-formed frame with a known status;
// - the store's byte count equals the bytes it holds;
// - nothing is written while no client has sent the job's token (another
//   job's token, no token, a request before the hello: no key appears);
// - a client that has not said hello holds at most one hello's worth of
//   unread bytes (a stranger cannot make the store hold a megabyte).
#include <poll.h>
#include <sys/socket.h>

#include "fuzz.h"
#include "store_server.h"

#define TOKEN "job-token-of-the-fuzzed-store"
enum { SLOTS = 4 };

typedef struct {
    int peer;            // our end of the socket pair; -1: not connected
    int server_fd;       // the server's end, which the server closes
    store_bytes_t replies; // bytes received, not yet a whole reply
    store_bytes_t tail;    // the last bytes sent, where a token may have begun
    bool token_sent;     // the job's token went out on this connection
} slot;

static store_server_t *new_server(void) {
    store_server_t *s = xcalloc(1, sizeof *s);
    s->listen_fd = -1;    // no listening socket: clients are added by hand
    s->wake[0] = s->wake[1] = -1;
    s->port = 1;
    snprintf(s->token, sizeof s->token, "%s", TOKEN);
    s->nonce = 42;
    s->accepting = false;
    return s;
}

static void free_server(store_server_t *s) {
    for (size_t i = 0; i < s->nclients; i++) store_conn_free(&s->clients[i]);
    for (size_t i = 0; i < s->nentries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    free(s->clients);
    free(s->entries);
    free(s->pfds);
    free(s);
}

static store_conn_t *client_of(store_server_t *s, const slot *k) {
    for (size_t i = 0; i < s->nclients; i++)
        if (s->clients[i].fd == k->server_fd) return &s->clients[i];
    return NULL;
}

static void connect_slot(store_server_t *s, slot *k) {
    int fds[2];
    struct sockaddr_storage nobody = {0};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
        dprintf(2, "fuzz: socketpair: %s\n", strerror(errno));
        abort();
    }
    k->peer = fds[0];
    k->server_fd = fds[1];
    store_server_add_client(s, fds[1], &nobody);
}

// Notes whether the job's token is among the bytes sent so far (it may span sends).
static void note_sent(slot *k, const void *data, size_t n) {
    size_t keep = strlen(TOKEN) - 1;
    store_bytes_put(&k->tail, data, n);
    if (memmem(k->tail.data, k->tail.len, TOKEN, strlen(TOKEN))) k->token_sent = true;
    if (k->tail.len > keep) {
        memmove(k->tail.data, k->tail.data + k->tail.len - keep, keep);
        k->tail.len = keep;
    }
}

static void send_bytes(slot *k, const void *data, size_t n) {
    // A full socket buffer (a client parked on a wait is not read) drops the rest, like a stalled peer.
    ssize_t sent = n ? send(k->peer, data, n, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
    if (sent < 0 && errno != EAGAIN && errno != EINTR && errno != EPIPE && errno != ECONNRESET) {
        dprintf(2, "fuzz: send: %s\n", strerror(errno));
        abort();
    }
    if (sent > 0) note_sent(k, data, (size_t)sent);
}

static void send_hello(slot *k) {
    store_bytes_t body = {0}, frame = {0};
    store_put_uint(&body, STORE_OP_HELLO, 1);
    store_put_uint(&body, STORE_MAGIC, 4);
    store_put_uint(&body, STORE_VERSION, 2);
    store_put_key(&body, TOKEN);
    store_put_key(&body, "");
    store_put_uint(&frame, body.len, 4);
    store_bytes_put(&frame, body.data, body.len);
    send_bytes(k, frame.data, frame.len);
    store_bytes_free(&body);
    store_bytes_free(&frame);
}

// Reads what the server sent to k and checks each whole reply frame.
static void read_replies(slot *k) {
    uint8_t buf[65536];
    ssize_t n;
    while ((n = recv(k->peer, buf, sizeof buf, MSG_DONTWAIT)) > 0) store_bytes_put(&k->replies, buf, (size_t)n);
    size_t used = 0;
    while (k->replies.len - used >= 4) {
        uint32_t len = store_read_u32(k->replies.data + used);
        fuzz_check(len >= 1 && len <= STORE_MAX_FRAME, "store: a reply frame of impossible length");
        if (k->replies.len - used < 4 + (size_t)len) break;
        fuzz_check(k->replies.data[used + 4] <= STORE_REFUSED_SESSION, "store: a reply with an unknown status");
        used += 4 + len;
    }
    if (used) {
        memmove(k->replies.data, k->replies.data + used, k->replies.len - used);
        k->replies.len -= used;
    }
}

// One round of the server's loop, as its thread runs it, without waiting.
static void serve(store_server_t *s) {
    size_t n = store_server_fill_pollfds(s);
    int rc;
    while ((rc = poll(s->pfds, n, 0)) < 0 && errno == EINTR) {} // libFuzzer's timeout alarm interrupts, as the store's loop allows
    if (rc < 0) {
        dprintf(2, "fuzz: poll: %s\n", strerror(errno));
        abort();
    }
    store_server_round(s, n);
}

static void check_server(const store_server_t *s, bool token_seen) {
    size_t total = 0;
    for (size_t i = 0; i < s->nentries; i++) {
        total += s->entries[i].len;
        size_t key_len = strlen(s->entries[i].key);
        fuzz_check(key_len >= 1 && key_len <= STORE_MAX_KEY, "store: a key of impossible length");
    }
    fuzz_check(total == s->total_bytes, "store: total_bytes differs from the bytes held");
    fuzz_check(token_seen || s->nentries == 0, "store: a key was written by clients that never sent the job's token");
    for (size_t i = 0; i < s->nclients; i++) {
        const store_conn_t *c = &s->clients[i];
        fuzz_check(c->in.len <= 4 + (size_t)STORE_MAX_FRAME, "store: a client's input grew past one frame");
        if (!c->greeted && !c->closing)
            fuzz_check(c->in.len < 4 + (size_t)STORE_MAX_HELLO, "store: a stranger holds more than a hello's worth of bytes");
        fuzz_check(!c->dead, "store: a dead client survived the round");
    }
}

// Could a correct hello have been said? Only where the job's token was sent:
// a sound over-estimate, independent of the server's own bookkeeping.
static bool token_was_sent(const slot *slots) {
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].token_sent) return true;
    return false;
}

// Forget slots whose connection the server closed.
static void forget_closed(store_server_t *s, slot *slots) {
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].peer < 0 || client_of(s, &slots[i])) continue;
        read_replies(&slots[i]);
        close(slots[i].peer);
        slots[i].peer = -1;
        slots[i].replies.len = slots[i].tail.len = 0;
    }
}

static void step(store_server_t *s, slot *slots, fuzz_input *in) {
    unsigned op = fuzz_u8(in), what = (op >> 2) & 7;
    slot *k = &slots[op & 3];
    size_t n;
    if (what == 6) {
        for (size_t i = 0; i < s->nclients; i++) s->clients[i].deadline = store_clock() - 1;
        return;
    }
    if (what == 5) {
        if (k->peer >= 0) close(k->peer);
        k->peer = -1;
        k->replies.len = k->tail.len = 0;
        return;
    }
    if (k->peer < 0) connect_slot(s, k);
    if (what == 4) {
        send_hello(k);
    } else if (what == 7) {
        size_t zeros = 64 * (size_t)fuzz_u16(in);
        uint8_t *z = calloc(zeros ? zeros : 1, 1);
        if (!z) abort();
        send_bytes(k, z, zeros);
        free(z);
    } else {
        const uint8_t *bytes = fuzz_bytes(in, fuzz_u8(in), &n);
        send_bytes(k, bytes, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    store_server_t *s = new_server();
    slot slots[SLOTS];
    for (int i = 0; i < SLOTS; i++) slots[i] = (slot){-1, -1, {0}, {0}, false};
    fuzz_input in = {data, size};
    bool token_seen = false; // once sent, keys may exist for the rest of the input
    for (int steps = 0; in.left > 0 && steps < 256; steps++) {
        step(s, slots, &in);
        token_seen |= token_was_sent(slots);
        for (int round = 0; round < 2; round++) serve(s); // the second sends what the first queued
        check_server(s, token_seen);
        for (int i = 0; i < SLOTS; i++)
            if (slots[i].peer >= 0) read_replies(&slots[i]);
        forget_closed(s, slots);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].peer >= 0) close(slots[i].peer);
        store_bytes_free(&slots[i].replies);
        store_bytes_free(&slots[i].tail);
    }
    free_server(s);
    return 0;
}
