// store_wire.h - what the rendezvous store's client and server say to each
// other over TCP: frames, operations, status codes and limits, and the small
// tools both sides use to build and read them (byte buffers, a bounds-checked
// reader, a clock for deadlines). store.h says what the store is for.
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
// client must present the job's token (exactly: no token is a token too)
// before anything else.
#ifndef COURSE_STORE_WIRE_H
#define COURSE_STORE_WIRE_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

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
} store_bytes_t;

static inline void store_bytes_put(store_bytes_t *b, const void *src, size_t n) {
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

static inline void store_bytes_free(store_bytes_t *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

// Append an unsigned integer of `bytes` bytes, big-endian.
static inline void store_put_uint(store_bytes_t *b, uint64_t v, int bytes) {
    uint8_t raw[8];
    for (int i = bytes - 1; i >= 0; i--, v >>= 8) raw[i] = (uint8_t)(v & 0xff);
    store_bytes_put(b, raw, (size_t)bytes);
}

static inline void store_put_key(store_bytes_t *b, const char *key) {
    size_t n = strlen(key);
    store_put_uint(b, n, 2);
    store_bytes_put(b, key, n);
}

// Reads a body without ever running past its end: a short body clears ok.
typedef struct {
    const uint8_t *p;
    size_t left;
    bool ok;
} store_reader_t;

static inline uint64_t store_take_uint(store_reader_t *r, int bytes) {
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

static inline const uint8_t *store_take_bytes(store_reader_t *r, size_t n) {
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
static inline bool store_reader_done(const store_reader_t *r) { return r->ok && r->left == 0; }

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

// ---------------------------------------------------------------- the job token

// True when the token a client presented (given_len bytes, any length) is
// the job's (want_len bytes, at most STORE_MAX_TOKEN). The token is the
// job's only lock, so the comparison must not say how close a guess came:
// memcmp stops at the first byte that differs, and answers a little later
// the more leading bytes are right, which a client that times many hellos
// can use to find the token a byte at a time. This one compares
// STORE_MAX_TOKEN pairs of bytes whatever the lengths (a missing byte reads
// as 0), gathers every difference, the lengths' included, with OR, and
// looks at the result once, at the end: its time depends on no byte of
// either token. *compared (when not NULL) is set to the number of byte
// pairs compared, which the tests check is always STORE_MAX_TOKEN.
static inline bool store_token_equal(const uint8_t *given, size_t given_len, const char *want,
                                     size_t want_len, size_t *compared) {
    size_t diff = given_len ^ want_len, pairs = 0;
    for (size_t i = 0; i < STORE_MAX_TOKEN; i++) {
        uint8_t a = i < given_len ? given[i] : 0;
        uint8_t b = i < want_len ? (uint8_t)want[i] : 0;
        diff |= (size_t)(a ^ b);
        pairs++;
    }
    if (compared) *compared = pairs;
    return diff == 0;
}

// ---------------------------------------------------------------- addresses

// A host name that only this machine can reach.
static inline bool store_is_loopback(const char *host) {
    return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

#endif
