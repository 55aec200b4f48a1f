// store_server.h - the rendezvous store's server: one background thread
// that keeps the key-value table and answers the clients (store_client.h)
// in the protocol of store_wire.h. The table and the answer to each
// request are store_requests.h; this file holds the connections and the
// thread.
//
// The thread runs a poll() loop over the listening socket and every client,
// so it serves any number of ranks without a thread each. A get for a
// missing key does not busy-poll: the server parks the client as a waiter
// and answers when the key is set, or with "timeout" at the client's
// deadline.
//
// A malformed or oversized request closes that one connection; the server
// keeps serving the others. A stranger that says no hello is dropped after
// STORE_HELLO_GRACE_S, or sooner, oldest first, when the store runs out of
// file descriptors or slots for new connections.
//
// Use (rank 0 or the launcher):
//   store_server_t *srv = store_server_start("0.0.0.0", 29500, token);
//   ...  // clients connect with store_connect() and talk
//   store_server_drain(srv, 5.0); store_server_stop(srv);
#ifndef COURSE_STORE_SERVER_H
#define COURSE_STORE_SERVER_H

#include "store_requests.h"

static inline void store_conn_read(store_server_t *s, store_conn_t *c) {
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

static inline void store_conn_flush(store_conn_t *c) {
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

static inline void store_conn_free(store_conn_t *c) {
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
    store_conn_t *c = &s->clients[s->nclients++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->deadline = store_clock() + STORE_HELLO_GRACE_S;
    store_format_peer(peer, c->peer, sizeof c->peer);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small replies, sent now
}

// The connection that has waited longest without saying hello, or NULL.
static inline store_conn_t *store_oldest_stranger(store_server_t *s) {
    store_conn_t *oldest = NULL;
    for (size_t i = 0; i < s->nclients; i++) {
        store_conn_t *c = &s->clients[i];
        if (c->greeted || c->closing || c->dead) continue;
        if (!oldest || c->deadline < oldest->deadline) oldest = c;  // same grace: earliest deadline = oldest
    }
    return oldest;
}

// Makes room for a new connection by closing the oldest stranger at once
// (its slot goes at the end of the round). False when there is none.
static inline bool store_evict_stranger(store_server_t *s, const char *why) {
    store_conn_t *c = store_oldest_stranger(s);
    if (!c) return false;
    store_conn_drop(s, c, "%s; it had not said hello", why);
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
        store_conn_t *c = &s->clients[i];
        if (c->dead || now < c->deadline) continue;
        if (c->wait_op) {
            store_conn_reply(c, STORE_TIMEOUT, NULL, 0);
            free(c->wait_key);
            c->wait_key = NULL;
            c->wait_op = 0;
        } else if (!c->greeted) {
            store_conn_drop(s, c, "no hello within %.0f s", STORE_HELLO_GRACE_S);
        }
    }
}

static inline void store_server_reap(store_server_t *s) {
    for (size_t i = 0; i < s->nclients;) {
        if (s->clients[i].dead) {
            store_conn_free(&s->clients[i]);
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
        const store_conn_t *c = &s->clients[i];
        short events = c->in.len < 4 + (size_t)STORE_MAX_FRAME ? POLLIN : 0;
        if (c->out_sent < c->out.len) events |= POLLOUT;
        s->pfds[2 + i] = (struct pollfd){c->fd, events, 0};
    }
    return n;
}

static inline int store_server_poll_ms(const store_server_t *s) {
    double next = store_clock() + 1.0;   // wake at least every second
    for (size_t i = 0; i < s->nclients; i++) {
        const store_conn_t *c = &s->clients[i];
        if ((c->wait_op || !c->greeted) && c->deadline < next) next = c->deadline;
    }
    if (s->accept_paused_until > store_clock() && s->accept_paused_until < next)
        next = s->accept_paused_until;
    return store_ms_left(next);
}

static inline void store_server_round(store_server_t *s, size_t npfds) {
    if (s->pfds[1].revents & POLLIN) store_server_accept(s);
    for (size_t i = 2; i < npfds; i++) {
        store_conn_t *c = &s->clients[i - 2];
        if (s->pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) store_conn_read(s, c);
    }
    store_server_expire(s);
    for (size_t i = 0; i < s->nclients; i++) store_serve_frames(s, &s->clients[i]);
    for (size_t i = 0; i < s->nclients; i++)
        if (!s->clients[i].dead) store_conn_flush(&s->clients[i]);
    store_server_reap(s);
}

static inline void *store_server_main(void *arg) {
    store_server_t *s = arg;
    pthread_mutex_lock(&s->lock);
    s->running = true;
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

// Bind and listen on host:port; dies with a message naming them.
// What the "port already in use" error suggests: whoever chose the port
// knows how to choose another (ddprun's flag, MASTER_PORT, a tcp:// URL).
static const char *store_port_advice = "choose another port";

// in_use_ok: a port in use returns -1 instead (ddprun's elastic launchers
// all try to serve, and those that find the port taken become clients).
static inline int store_listen_or(const char *host, int port, bool in_use_ok) {
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
        if (err == EADDRINUSE && in_use_ok) return -1;
        if (err == EADDRINUSE)
            die("port %d is already in use on %s (another job? %s)", port, host, store_port_advice);
        die("cannot serve the rendezvous store on %s:%d: %s", host, port, strerror(err));
    }
    freeaddrinfo(list);
    CHECK_SYS(listen(fd, SOMAXCONN));
    return fd;
}

static inline int store_listen(const char *host, int port) { return store_listen_or(host, port, false); }

static inline int store_bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    CHECK_SYS(getsockname(fd, (struct sockaddr *)&a, &len));
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

// Returns once the thread runs our code. A new thread first runs the C
// library's (and a sanitizer's) start-up code, which may allocate; if
// spawn.h forked at that moment, the child would inherit a lock held by a
// thread it does not have, and hang at its first malloc (seen under
// AddressSanitizer, whose allocator has no fork handlers in gcc 12).
// From the moment the thread holds s->lock once, fork() is safe: spawn
// holds that lock across it.
static inline void store_server_wait_running(store_server_t *s) {
    for (double waited = 0;; waited += 0.001) {
        pthread_mutex_lock(&s->lock);
        bool running = s->running;
        pthread_mutex_unlock(&s->lock);
        if (running) return;
        if (waited > 60) die("the rendezvous store thread did not start within 60 s");
        store_sleep(0.001);
    }
}

// The server on a socket already listening (store_listen_or).
static inline store_server_t *store_server_start_on(int listen_fd, const char *bind_host,
                                                    const char *token, const char *session);

// As store_server_start, and clients that name a session (rendezvous does: one
// per round) must name this one; others are refused so that they retry.
static inline store_server_t *store_server_start_session(const char *bind_host, int port,
                                                         const char *token,
                                                         const char *session) {
    if (port < 0 || port > 65535) die("store port %d is out of range 0..65535", port);
    return store_server_start_on(store_listen(bind_host, port), bind_host, token, session);
}

static inline store_server_t *store_server_start_on(int listen_fd, const char *bind_host,
                                                    const char *token, const char *session) {
    if (!token) token = "";
    if (!session) session = "";
    if (strlen(token) > STORE_MAX_TOKEN || strlen(session) > STORE_MAX_TOKEN)
        die("job token or session longer than %d bytes", STORE_MAX_TOKEN);
    store_server_t *s = xcalloc(1, sizeof *s);
    s->listen_fd = listen_fd;
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
    store_server_wait_running(s);
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
    for (size_t i = 0; i < s->nclients; i++) store_conn_free(&s->clients[i]);
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

#endif
