// race.c - data races, found as the kernels and the queued work run.
//
// Two accesses to one byte race when at least one writes and nothing
// orders them. On a GPU, what orders them is:
//   - within a block: a __syncthreads between them (or, within a warp, a
//     warp operation both lanes took part in);
//   - between blocks of one kernel: nothing (only atomics are safe);
//   - between two queued operations (a kernel, a copy, a GEMM, an NCCL
//     call): their stream's order, an event, the legacy stream's rule, or
//     a synchronize after which the host queued the second (order.c).
// A racy program can work for years on one GPU and fail on the next; the
// emulator runs one legal order at a time, so it checks the rule instead of
// hoping the order shows the bug.
//
// How: the CUDA=emu build compiles .cu files with -fsanitize=thread, which
// makes the compiler call __tsan_read4(address) (and its kin) before every
// load and store. This file defines those functions - not ThreadSanitizer's
// runtime, which is not linked - and keeps, for every 4 bytes of device and
// shared memory, the last write and the last read: which operation, which
// thread of the grid, how many barriers its block had passed, how many warp
// operations it had taken part in. Each access is compared with them and
// then recorded. Copies, fills, GEMMs and NCCL calls record the ranges they
// touch (emu_race_range), as whole operations. The first race found ends
// the program with both parties, the allocation and the offset.
//
// It is a shadow per allocation (and one for shared memory), and works a
// launch at a time: a thread's own earlier accesses, a read after a read,
// and atomics against atomics never race. It keeps one reader per word, so
// a write can miss a race with an earlier of several concurrent readers: it
// may miss races, but a race it reports is one. EMU_RACECHECK=0 turns it off.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "emu_kernel_abi.h"

#define NO_THREAD 0xffffffffu

// What the shadow remembers of one access to a 4-byte word.
typedef struct {
    uint32_t op;      // the operation (device memory) or block (shared) that made it; 0: none
    uint32_t thread;  // its thread's number in the grid, NO_THREAD for copies, GEMMs, NCCL
    uint16_t barrier; // the block's __syncthreads passed at the time
    uint16_t warp;    // the thread's warp operations at the time
    uint8_t bytes;    // which bytes of the word (bit k: byte k)
    uint8_t atomic;
    uint16_t unused;
} access;

typedef struct {
    access write, read;
} word;
_Static_assert(sizeof(word) <= EMU_RACE_SHADOW_BYTES, "the shadow's words are EMU_RACE_SHADOW_BYTES");

// The access being made now.
typedef struct {
    const void *address;
    unsigned size;
    bool write, atomic;
    access a;
    const emu_running_op *op;
    const emu_thread_view *view; // NULL outside kernels
} current;

// EMU_RACECHECK: 0 off; 1 (the default) every launch of a kernel up to its
// 16th, then one in 16; all: every launch. A race in a loop shows in every
// round, so the sampled rounds find it; what is not sampled leaves older
// records in the shadow, which can hide a race but never invent one (an
// operation that comes after a later one on a stream comes after it too).
enum { SAMPLE_FIRST = 16, SAMPLE_EVERY = 16 };
static bool enabled = true, every_launch = false;

__attribute__((constructor)) static void read_setting(void) {
    const char *s = getenv("EMU_RACECHECK");
    if (s && *s && strcmp(s, "0") && strcmp(s, "1") && strcmp(s, "all"))
        emu_fatal("EMU_RACECHECK=%s: expected 0, 1 or all", s);
    enabled = !(s && !strcmp(s, "0"));
    every_launch = s && !strcmp(s, "all");
}

// Whether this launch of `kernel` (its name) is checked.
bool emu_race_check_launch(const char *kernel) {
    static struct { const char *name; unsigned long long launches; } seen[512];
    if (!enabled) return false;
    if (every_launch) return true;
    unsigned slot = (unsigned)(((uintptr_t)kernel >> 4) % 512);
    for (unsigned k = 0; k < 512 && seen[slot].name && seen[slot].name != kernel; k++) slot = (slot + 1) % 512;
    if (seen[slot].name && seen[slot].name != kernel) return true; // (a full table: check them all)
    seen[slot].name = kernel;
    unsigned long long n = ++seen[slot].launches;
    return n <= SAMPLE_FIRST || n % SAMPLE_EVERY == 0;
}

// ================================================================ the operations seen
// A race between two operations names both; the shadow holds only the
// earlier one's serial, so the last 16384 operations that touched memory
// are kept here (an older one is taken to be ordered: it is long past).

typedef struct {
    uint32_t serial;
    int stream;
    uint64_t seq;
} op_seen;

typedef struct {
    const char *what, *file; // file and line: where a kernel was launched
    int line;
    char stream_name[64];
} op_words;

enum { OPS_KEPT = 1 << 14 };
static op_seen ops_seen[OPS_KEPT];
static op_words ops_said[OPS_KEPT];
static __thread uint32_t last_noted;

static void note_op(const emu_running_op *op) {
    if (op->serial == last_noted) return;
    last_noted = op->serial;
    const emu_kernel_site *k = emu_running_kernel();
    ops_seen[op->serial % OPS_KEPT] = (op_seen){op->serial, op->stream, op->seq};
    op_words *w = &ops_said[op->serial % OPS_KEPT];
    *w = (op_words){op->what, k ? k->file : NULL, k ? k->line : 0, ""};
    snprintf(w->stream_name, sizeof w->stream_name, "%s", op->stream_name);
}

// Whether operation `serial` happens before the running one. The answers
// for the running operation are cached: its accesses meet few others.
static __thread uint32_t answers_for;
static __thread struct { uint32_t serial; bool before; } answers[16];

static bool op_before(uint32_t serial, const emu_running_op *now) {
    if (answers_for != now->serial) {
        memset(answers, 0, sizeof answers);
        answers_for = now->serial;
    }
    unsigned slot = serial % 16;
    if (answers[slot].serial == serial) return answers[slot].before;
    const op_seen *o = &ops_seen[serial % OPS_KEPT];
    bool before = o->serial != serial || o->stream == now->stream || emu_clock_covers(now->clock, o->stream, o->seq);
    answers[slot].serial = serial, answers[slot].before = before;
    return before;
}

// ================================================================ reports

static void describe_thread(char *buf, size_t size, const emu_thread_view *v, uint32_t thread) {
    unsigned per_block = v->block_dim.x * v->block_dim.y * v->block_dim.z;
    unsigned long long blk = thread / per_block, t = thread % per_block;
    snprintf(buf, size, "block (%llu,%llu,%llu) thread (%llu,%llu,%llu)", blk % v->grid_dim.x,
             blk / v->grid_dim.x % v->grid_dim.y, blk / ((unsigned long long)v->grid_dim.x * v->grid_dim.y),
             t % v->block_dim.x, t / v->block_dim.x % v->block_dim.y,
             t / ((unsigned long long)v->block_dim.x * v->block_dim.y));
}

static void describe_op(char *buf, size_t size, uint32_t serial) {
    const op_words *o = &ops_said[serial % OPS_KEPT];
    if (o->file) snprintf(buf, size, "kernel %s (launched at %s:%d) on %s", o->what, o->file, o->line, o->stream_name);
    else snprintf(buf, size, "%s on %s", o->what, o->stream_name);
}

// Where the access was made, for addr2line (the code of a kernel is the program's own).
static void describe_code(char *buf, size_t size, const void *pc) {
    Dl_info info;
    if (pc && dladdr(pc, &info) && info.dli_fname)
        snprintf(buf, size, " (code at `addr2line -f -C -e %s 0x%lx`)", info.dli_fname,
                 (unsigned long)((const char *)pc - (const char *)info.dli_fbase));
    else buf[0] = 0;
}

__attribute__((noreturn)) static void report(const current *c, const access *earlier, bool earlier_wrote,
                                             const char *where, const void *pc) {
    char now[400], before[400], code[300], why[200];
    const char *verb = c->atomic ? "atomically updates" : c->write ? "writes" : "reads";
    const char *earlier_verb = earlier->atomic ? "updated it atomically" : earlier_wrote ? "wrote it" : "read it";
    if (c->view) {
        char t[120];
        describe_thread(t, sizeof t, c->view, c->a.thread);
        snprintf(now, sizeof now, "kernel %s (launched at %s:%d), %s,", c->op->what, emu_running_kernel()->file,
                 emu_running_kernel()->line, t);
    } else {
        snprintf(now, sizeof now, "%s on %s", c->op->what, c->op->stream_name);
    }
    if (earlier->op == c->a.op && c->view) {
        describe_thread(before, sizeof before, c->view, earlier->thread);
        bool same_block = earlier->thread / c->view->block->threads == c->a.thread / c->view->block->threads;
        snprintf(why, sizeof why, "%s",
                 same_block ? "with no __syncthreads between them"
                            : "in another block: blocks never wait for each other (atomicAdd, or a second kernel)");
    } else {
        describe_op(before, sizeof before, earlier->op);
        snprintf(why, sizeof why, "%s", "and nothing orders the two operations (the same stream, an event, or a "
                                        "synchronize before the second was queued)");
    }
    describe_code(code, sizeof code, pc);
    emu_fatal("data race: %s %s %u bytes at %s%s; %s %s %s", now, verb, c->size, where, code, before, earlier_verb,
              why);
}

// ================================================================ checking one word

static bool overlaps(const access *e, uint8_t bytes) { return e->op && (e->bytes & bytes); }

// Is the earlier access e ordered before the current one (or harmless)?
static inline bool ordered(const access *e, const current *c, bool device) {
    if (e->op == c->a.op) {
        if (e->thread == c->a.thread || (e->atomic && c->atomic) || !c->view) return true;
        unsigned per_block = c->view->block->threads;
        if (e->thread / per_block != c->a.thread / per_block) return false; // two blocks of one grid
        if (e->barrier != c->a.barrier) return true;
        bool same_warp = e->thread / EMU_WARP_SIZE == c->a.thread / EMU_WARP_SIZE;
        return same_warp && e->warp != c->a.warp;
    }
    if (e->atomic && c->atomic) return true;
    return !device || op_before(e->op, c->op); // shared memory: what an earlier block left is long past
}

// The earlier access that the current one races with on word w (NULL if
// none); then the current one is recorded.
static inline const access *check_word(word *w, const current *c, uint8_t bytes, bool device, bool *earlier_wrote) {
    bool writes = c->write || c->atomic;
    // The most common case: this thread accesses what it accessed last.
    const access *mine = writes ? &w->write : &w->read;
    if (mine->op == c->a.op && mine->thread == c->a.thread && mine->barrier == c->a.barrier &&
        mine->atomic == c->a.atomic && (mine->bytes & bytes) == bytes && (!writes || !w->read.op))
        return NULL;
    if (overlaps(&w->write, bytes) && !ordered(&w->write, c, device)) return *earlier_wrote = true, &w->write;
    if (writes && overlaps(&w->read, bytes) && !ordered(&w->read, c, device)) return *earlier_wrote = false, &w->read;
    access a = c->a;
    a.bytes = bytes;
    if (writes) {
        if (w->write.op == a.op && w->write.thread == a.thread) a.bytes |= w->write.bytes;
        w->write = a;
        w->read.op = 0; // the reads before it are ordered before it: a later access meets the write
    } else if (!overlaps(&w->read, bytes) || ordered(&w->read, c, device)) {
        w->read = a; // an earlier concurrent reader is kept
    }
    return NULL;
}

static void device_where(char *buf, size_t size, const current *c, uintptr_t at) {
    emu_device_span span;
    (void)c;
    if (emu_device_span_of((const void *)at, &span))
        snprintf(buf, size, "byte %zu of a %zu-byte cudaMalloc allocation at %p", (size_t)(at - (uintptr_t)span.base),
                 span.size, (void *)span.base);
}

static void shared_where(char *buf, size_t size, const current *c, uintptr_t at) {
    size_t offset = (size_t)(at - (uintptr_t)c->view->block->shared);
    if (offset < EMU_STATIC_SHARED_LIMIT) snprintf(buf, size, "byte %zu of the block's __shared__ memory", offset);
    else snprintf(buf, size, "byte %zu of the block's dynamic shared memory", offset - EMU_STATIC_SHARED_LIMIT);
}

// Checks and records an access of `size` bytes at `address`, word by word.
static inline void check_range(word *shadow, uintptr_t base, const current *c, uintptr_t address, size_t size,
                               bool device, const void *pc) {
    uintptr_t end = address + size;
    for (uintptr_t w = address & ~(uintptr_t)3; w < end; w += 4) {
        uintptr_t lo = w > address ? w : address, hi = w + 4 < end ? w + 4 : end;
        uint8_t bytes = (uint8_t)(((1u << (hi - lo)) - 1) << (lo - w));
        bool earlier_wrote;
        const access *earlier = check_word(&shadow[(w - base) / 4], c, bytes, device, &earlier_wrote);
        if (!earlier) continue;
        char where[200] = "an address";
        (device ? device_where : shared_where)(where, sizeof where, c, lo);
        report(c, earlier, earlier_wrote, where, pc);
    }
}

// ================================================================ kernel accesses

// The word-by-word shadow of shared memory, for the block that runs now.
static __thread word *shared_shadow;

// One cached allocation: most accesses of a kernel go to the one before.
static __thread emu_device_span cached;

static void misaligned(const current *c, const void *pc) {
    char who[300], code[300];
    emu_kernel_thread_name(who, sizeof who);
    describe_code(code, sizeof code, pc);
    emu_fatal("misaligned access: %s %s %u bytes at %p, which is not a multiple of %u%s (a GPU's loads and stores "
              "of N bytes - float4, __nv_bfloat162, double - need an address that is a multiple of N: "
              "cudaErrorMisalignedAddress)",
              who, c->write ? "writes" : "reads", c->size, c->address, c->size, code);
}

// This host thread's kernel-thread stacks: locals, not GPU memory.
static __thread uintptr_t stacks_lo, stacks_hi;

static void kernel_access(const void *address, unsigned size, bool write, bool atomic, const void *pc) {
    const emu_thread_view *v = emu_self;
    if (!v || !v->block->race_check) return;
    const emu_block_info *b = v->block;
    uintptr_t a = (uintptr_t)address;
    bool in_shared = a - (uintptr_t)b->shared < b->shared_bytes;
    bool in_device = !in_shared && a - (uintptr_t)cached.base < cached.size;
    if (!in_shared && !in_device) {
        if (a - stacks_lo < stacks_hi - stacks_lo) return;
        if (!stacks_hi) emu_fiber_stacks((const char **)&stacks_lo, (const char **)&stacks_hi);
        if (a - stacks_lo < stacks_hi - stacks_lo || !emu_device_span_of(address, &cached)) return; // not GPU memory
        in_device = true;
    }
    const emu_running_op *op = b->op;
    current c = {address, size, write, atomic, {0, (uint32_t)(b->first_thread + (unsigned)v->linear),
                 (uint16_t)b->barriers, (uint16_t)v->warp_epoch, 0, atomic, 0}, op, v};
    if ((size == 2 || size == 4 || size == 8 || size == 16) && (a & (size - 1))) misaligned(&c, pc);
    if (in_shared) {
        if (!shared_shadow) {
            shared_shadow = calloc(b->shared_bytes / 4 + 1, sizeof *shared_shadow);
            if (!shared_shadow) emu_fatal("out of host memory for the shared-memory shadow");
        }
        c.a.op = (uint32_t)b->serial; // what an earlier block left there counts as long past
        check_range(shared_shadow, (uintptr_t)b->shared, &c, a, size, false, pc);
        return;
    }
    note_op(op);
    c.a.op = op->serial;
    check_range((word *)cached.shadow, (uintptr_t)cached.base, &c, a, size, true, pc);
}

// Operations other than kernels: the range they read or write.
void emu_race_range(const void *p, size_t bytes, bool write) {
    const emu_running_op *op = emu_current_op();
    if (!op || !bytes || !enabled) return;
    emu_device_span span;
    if (!emu_device_span_of(p, &span)) return;
    uintptr_t a = (uintptr_t)p, end = (uintptr_t)span.base + span.size;
    if (a + bytes > end) bytes = end - a;
    note_op(op);
    current c = {p, (unsigned)bytes, write, false, {op->serial, NO_THREAD, 0, 0, 0, 0, 0}, op, NULL};
    check_range((word *)span.shadow, (uintptr_t)span.base, &c, a, bytes, true, NULL);
}

void emu_race_atomic(const void *p, size_t bytes) {
    kernel_access(p, (unsigned)bytes, true, true, __builtin_return_address(0));
}

// ================================================================ what the compiler calls
// The names and signatures of ThreadSanitizer's instrumentation interface.

void __tsan_init(void) {}
void __tsan_func_entry(void *pc) { (void)pc; }
void __tsan_func_exit(void) {}

#define EMU_TSAN_ACCESS(N)                                                                                \
    void __tsan_read##N(void *p) { kernel_access(p, N, false, false, __builtin_return_address(0)); }      \
    void __tsan_write##N(void *p) { kernel_access(p, N, true, false, __builtin_return_address(0)); }      \
    void __tsan_unaligned_read##N(void *p) { kernel_access(p, N, false, false, __builtin_return_address(0)); } \
    void __tsan_unaligned_write##N(void *p) { kernel_access(p, N, true, false, __builtin_return_address(0)); }
EMU_TSAN_ACCESS(1)
EMU_TSAN_ACCESS(2)
EMU_TSAN_ACCESS(4)
EMU_TSAN_ACCESS(8)
EMU_TSAN_ACCESS(16)

void __tsan_read_range(void *p, unsigned long size) {
    kernel_access(p, (unsigned)size, false, false, __builtin_return_address(0));
}
void __tsan_write_range(void *p, unsigned long size) {
    kernel_access(p, (unsigned)size, true, false, __builtin_return_address(0));
}
void __tsan_vptr_read(void **p) { (void)p; }
void __tsan_vptr_update(void **p, void *v) { (void)p, (void)v; }

// C++ atomics (std::atomic, __atomic builtins) in a .cu file: done here,
// atomically, and recorded as atomic accesses.
void __tsan_atomic_thread_fence(int order) { __atomic_thread_fence(order); }
void __tsan_atomic_signal_fence(int order) { __atomic_signal_fence(order); }

#define EMU_TSAN_ATOMICS(N, T)                                                                              \
    T __tsan_atomic##N##_load(const volatile T *p, int mo) {                                              \
        kernel_access((const void *)p, N / 8, false, true, __builtin_return_address(0));                   \
        return __atomic_load_n(p, mo);                                                                      \
    }                                                                                                       \
    void __tsan_atomic##N##_store(volatile T *p, T v, int mo) {                                            \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        __atomic_store_n(p, v, mo);                                                                         \
    }                                                                                                       \
    T __tsan_atomic##N##_exchange(volatile T *p, T v, int mo) {                                            \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_exchange_n(p, v, mo);                                                               \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_add(volatile T *p, T v, int mo) {                                           \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_add(p, v, mo);                                                                \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_sub(volatile T *p, T v, int mo) {                                           \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_sub(p, v, mo);                                                                \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_and(volatile T *p, T v, int mo) {                                           \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_and(p, v, mo);                                                                \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_or(volatile T *p, T v, int mo) {                                            \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_or(p, v, mo);                                                                 \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_xor(volatile T *p, T v, int mo) {                                           \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_xor(p, v, mo);                                                                \
    }                                                                                                       \
    T __tsan_atomic##N##_fetch_nand(volatile T *p, T v, int mo) {                                          \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_fetch_nand(p, v, mo);                                                               \
    }                                                                                                       \
    int __tsan_atomic##N##_compare_exchange_strong(volatile T *p, T *expected, T v, int mo, int fail_mo) { \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_compare_exchange_n(p, expected, v, false, mo, fail_mo);                             \
    }                                                                                                       \
    int __tsan_atomic##N##_compare_exchange_weak(volatile T *p, T *expected, T v, int mo, int fail_mo) {   \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        return __atomic_compare_exchange_n(p, expected, v, true, mo, fail_mo);                              \
    }                                                                                                       \
    T __tsan_atomic##N##_compare_exchange_val(volatile T *p, T expected, T v, int mo, int fail_mo) {       \
        kernel_access((const void *)p, N / 8, true, true, __builtin_return_address(0));                    \
        __atomic_compare_exchange_n(p, &expected, v, false, mo, fail_mo);                                   \
        return expected;                                                                                    \
    }
EMU_TSAN_ATOMICS(8, uint8_t)
EMU_TSAN_ATOMICS(16, uint16_t)
EMU_TSAN_ATOMICS(32, uint32_t)
EMU_TSAN_ATOMICS(64, uint64_t)
