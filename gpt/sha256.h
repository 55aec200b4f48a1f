// sha256.h - SHA-256 (FIPS 180-4), small and dependency-free.
//
// The chapter uses it for two things: to check that the WikiText-2 files
// are byte for byte the published ones, and to key the cache of encoded
// tokens, so that a cache built from other text is never trusted.
// A checksum such as CRC would catch accidents, but a cryptographic hash
// also lets us compare against the checksums published with the data.
//
// Use it in one call, sha256(data, len, digest), or in pieces:
//   sha256_ctx c; sha256_init(&c); sha256_update(&c, part, n); ...; sha256_final(&c, digest);
#ifndef COURSE_SHA256_H
#define COURSE_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SHA256_DIGEST_BYTES 32
#define SHA256_HEX_BYTES 65 // 64 hex digits and the terminating NUL

typedef struct {
    uint32_t state[8];
    uint64_t total_bytes;
    uint8_t block[64];
    size_t block_used;
} sha256_ctx;

// The first 32 bits of the fractional parts of the cube roots of the
// first 64 primes (the standard's round constants).
static const uint32_t sha256_round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t sha256_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static inline void sha256_init(sha256_ctx *c) {
    static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->state, initial, sizeof initial);
    c->total_bytes = 0;
    c->block_used = 0;
}

// Mix one 64-byte block into the state.
static inline void sha256_compress(uint32_t state[8], const uint8_t *block) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = sha256_rotr(w[i - 15], 7) ^ sha256_rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = sha256_rotr(w[i - 2], 17) ^ sha256_rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t s1 = sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^ sha256_rotr(e, 25);
        uint32_t choose = (e & f) ^ (~e & g);
        uint32_t t1 = h + s1 + choose + sha256_round_constants[i] + w[i];
        uint32_t s0 = sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^ sha256_rotr(a, 22);
        uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = s0 + majority;
        h = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    state[0] += a, state[1] += b, state[2] += c, state[3] += d;
    state[4] += e, state[5] += f, state[6] += g, state[7] += h;
}

static inline void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    const uint8_t *p = (const uint8_t *)data;
    c->total_bytes += len;
    if (c->block_used > 0) { // top up a partly filled block first
        size_t take = 64 - c->block_used < len ? 64 - c->block_used : len;
        memcpy(c->block + c->block_used, p, take);
        c->block_used += take, p += take, len -= take;
        if (c->block_used < 64) return;
        sha256_compress(c->state, c->block);
        c->block_used = 0;
    }
    for (; len >= 64; p += 64, len -= 64) sha256_compress(c->state, p); // whole blocks in place
    memcpy(c->block, p, len);
    c->block_used = len;
}

// Padding: a 1 bit, zeros, then the message length in bits (big-endian),
// so that the total is a multiple of 64 bytes.
static inline void sha256_final(sha256_ctx *c, uint8_t digest[SHA256_DIGEST_BYTES]) {
    uint64_t bits = c->total_bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t pad_len = (c->block_used < 56 ? 56 : 120) - c->block_used;
    for (int i = 0; i < 8; i++) pad[pad_len + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, pad, pad_len + 8);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(c->state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(c->state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(c->state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)c->state[i];
    }
}

static inline void sha256(const void *data, size_t len, uint8_t digest[SHA256_DIGEST_BYTES]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, len);
    sha256_final(&c, digest);
}

// Lower-case hex, as sha256sum prints it.
static inline void sha256_to_hex(const uint8_t digest[SHA256_DIGEST_BYTES],
                                 char hex[SHA256_HEX_BYTES]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SHA256_DIGEST_BYTES; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = '\0';
}

#endif
