// launch.c - running a kernel: a grid of blocks, each a set of threads.
//
// kernel<<<grid, block, shared, stream>>>(args) becomes, in the emulated
// build, a call to emu_launch_kernel with the arguments copied (as CUDA
// copies them at launch). The launch is checked against a GPU's limits at
// once and queued on the stream; when the stream runs it, the blocks run
// one after another, and inside a block every thread runs on its own fiber:
//
//   - a thread runs until it reaches __syncthreads() or a warp operation
//     (a shuffle, a vote, __syncwarp), or ends; then the next ready thread
//     of the block runs, in order of threadIdx (EMU_ORDER=reverse: the
//     other way round; shuffled: in a random order, new for every block);
//   - __syncthreads() releases the block once every thread is waiting
//     there (at the same __syncthreads; a thread that left the kernel
//     early is an error, as CUDA's rules make it);
//   - a warp operation releases once every lane its mask names has reached
//     a warp operation; values move through 32 slots, one per lane.
//
// Running each thread as far as it can go before the next one starts is
// the most adversarial schedule a GPU could legally pick for code without
// barriers: thread 0 finishes before thread 1 begins. A reduction missing a
// __syncthreads then reads shared memory nobody has written yet, which the
// emulator fills with NaNs at the start of every block - so the bug shows
// as a wrong answer every time instead of once in a thousand runs. When no
// thread can go on (some wait at a barrier others never reach) the
// emulator says who waits where, instead of hanging like a GPU. The blocks
// of a grid run in the order EMU_ORDER picks too.
//
// Every access a kernel makes to device or shared memory is checked for
// races as it runs (race.c); for that each block publishes how many
// barriers it has passed, and each thread how many warp operations.
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu_internal.h"
#include "emu_kernel_abi.h"

#define SHARED_BYTES (EMU_STATIC_SHARED_LIMIT + EMU_DYNAMIC_SHARED_OPTIN)
#define POISON 0xFF

typedef enum { READY, AT_BARRIER, AT_WARP, EXITED } thread_state;

typedef struct {
    emu_thread_view view;
    thread_state state;
    const char *wait_what, *wait_file; // where it waits, for messages
    int wait_line;
    unsigned wait_mask;                // the mask of the warp operation it waits in
    int result_bank;                   // the warp slots it reads after a release
    bool started;
    emu_fiber *fiber;                  // the stack it runs on, once started
} kthread;

typedef struct {
    unsigned existing;  // lanes the block has in this warp
    unsigned releases;  // warp operations completed (each participant's warp_epoch)
    unsigned exited;
    unsigned arrived;   // lanes waiting at the current warp operation
    unsigned wanted;    // lanes the arrived lanes' masks name
    int bank;           // which of the two slot banks the next exchange fills
    unsigned char slots[2][EMU_WARP_SIZE][EMU_WARP_SLOT_BYTES];
} warp;

typedef struct {
    emu_launch_config cfg;
    emu_kernel_site site; // its name, and where it was launched
    void (*body)(void *);
    void (*free_closure)(void *);
    void *closure;
} kernel_launch;

// The block being run (one at a time per host thread).
typedef struct {
    const kernel_launch *k;
    int count;       // threads in the block
    int live;        // not exited
    int at_barrier;
    int barrier_count, barrier_result; // __syncthreads_count: the sum so far, the last result
    int current;
    emu_block_info info;        // what race.c reads about the block
    int order[EMU_MAX_BLOCK_THREADS];      // the threads in the order they are picked
    int rank[EMU_MAX_BLOCK_THREADS];       // each thread's place in order[]
    int lane_order[EMU_WARP_SIZE], lane_rank[EMU_WARP_SIZE];
    kthread *threads;
    warp *warps;
    unsigned long long serial;
    unsigned char *shared;      // [static area | dynamic area]
    size_t static_used, static_poisoned;
    int free_stacks[EMU_MAX_BLOCK_THREADS]; // fiber stacks no started thread holds
    int free_count, fewest_free;            // fewest_free: how deep into the stacks this block went
} block_run;

static __thread block_run *running;
static unsigned long long block_serial_counter;

static kthread *self_thread(const char *what) {
    if (!running || !emu_self) emu_not_in_kernel(what);
    return &running->threads[running->current];
}

// ---------------------------------------------------------------- switching

// The next thread that can run, or -1: first the lanes of `from`'s warp
// (after it, wrapping round), then the block's threads, both in the
// order EMU_ORDER picked (forward: threadIdx order). Finishing one warp
// before starting the next keeps few stacks in use - a legal schedule,
// and a fast one for kernels that work one warp per row.
static int next_ready(const block_run *b, int from) {
    int warp0 = from & ~(EMU_WARP_SIZE - 1), at = b->lane_rank[from & (EMU_WARP_SIZE - 1)];
    for (int k = 1; k <= EMU_WARP_SIZE; k++) {
        int i = warp0 + b->lane_order[(at + k) & (EMU_WARP_SIZE - 1)];
        if (i < b->count && b->threads[i].state == READY) return i;
    }
    for (int k = 1; k <= b->count; k++) {
        int i = b->order[(b->rank[from] + k) % b->count];
        if (b->threads[i].state == READY) return i;
    }
    return -1;
}

static void fiber_main(void *arg);

// Continue thread `next` from the context `from`: on the stack it holds, or,
// if it has not started, on a free stack (fiber_main starts it there).
static void run_thread(block_run *b, int next, emu_fiber *from, bool from_finished) {
    kthread *t = &b->threads[next];
    b->current = next;
    emu_self = &t->view;
    if (!t->started) {
        int stack = b->free_stacks[--b->free_count];
        if (b->free_count < b->fewest_free) b->fewest_free = b->free_count;
        t->fiber = emu_fiber_for_thread(stack);
        emu_fiber_prepare(t->fiber, fiber_main, (void *)(intptr_t)stack);
        t->started = true;
    }
    emu_fiber_switch(from, t->fiber, from_finished);
}

// Thread t must wait: hand the core straight to the next ready thread -
// one switch, not two through the scheduler - or, when none is ready,
// back to the scheduler in run_block, which then finds the block stuck.
static void yield_to_scheduler(kthread *t) {
    block_run *b = running;
    int next = next_ready(b, t->view.linear);
    if (next < 0) emu_fiber_switch(t->fiber, emu_fiber_host(), false);
    else run_thread(b, next, t->fiber, false);
}

static void release_barrier(block_run *b) {
    const kthread *first = NULL;
    for (int i = 0; i < b->count; i++) {
        kthread *t = &b->threads[i];
        if (t->state != AT_BARRIER) continue;
        if (!first) first = t;
        else if (t->wait_line != first->wait_line || strcmp(t->wait_file, first->wait_file) != 0)
            emu_fatal("in kernel %s, block (%u,%u,%u), threads wait at two different __syncthreads: thread %d at "
                      "%s:%d, thread %d at %s:%d (a barrier inside a branch that not every thread takes; CUDA "
                      "leaves this undefined)",
                      b->k->site.name, t->view.block_idx.x, t->view.block_idx.y, t->view.block_idx.z,
                      first->view.linear, first->wait_file, first->wait_line, t->view.linear, t->wait_file,
                      t->wait_line);
        t->state = READY;
    }
    b->at_barrier = 0;
    b->barrier_result = b->barrier_count;
    b->barrier_count = 0;
    b->info.barriers++;
}

// CUDA allows __syncthreads() in conditional code only when the condition
// is the same for the whole block: a thread that has left the kernel (an
// early `return`) while others wait at a barrier breaks that rule. GPUs
// may hang, or count it as arrived; the emulator names it.
__attribute__((noreturn)) static void barrier_without(const block_run *b, const kthread *gone,
                                                      const kthread *waiting) {
    emu_fatal("in kernel %s, block (%u,%u,%u), thread %d waits at %s (%s:%d) but thread %d has left the "
              "kernel without reaching it (every thread of a block must reach each __syncthreads; an early "
              "`return` before one is a bug)",
              b->k->site.name, waiting->view.block_idx.x, waiting->view.block_idx.y, waiting->view.block_idx.z,
              waiting->view.linear, waiting->wait_what, waiting->wait_file, waiting->wait_line, gone->view.linear);
}

static const kthread *first_in_state(const block_run *b, thread_state s) {
    for (int i = 0; i < b->count; i++)
        if (b->threads[i].state == s) return &b->threads[i];
    return NULL;
}

// __syncthreads_count(predicate): the barrier, and how many threads of the
// block brought a true predicate (__syncthreads is this without one).
int emu_syncthreads_count(int predicate, const char *what, const char *file, int line) {
    kthread *t = self_thread(what);
    block_run *b = running;
    t->wait_what = what, t->wait_file = file, t->wait_line = line;
    if (b->live < b->count) barrier_without(b, first_in_state(b, EXITED), t);
    t->state = AT_BARRIER;
    b->barrier_count += predicate != 0;
    if (++b->at_barrier == b->live) release_barrier(b);
    else yield_to_scheduler(t);
    return b->barrier_result; // read before any thread can reach the next barrier
}

void emu_syncthreads(const char *file, int line) { emu_syncthreads_count(0, "__syncthreads", file, line); }

// ---------------------------------------------------------------- warps

static unsigned lane_bit(int lane) { return 1u << lane; }

static void check_mask_lanes(const block_run *b, const warp *w, const kthread *t, unsigned mask, const char *what,
                             const char *file, int line) {
    unsigned gone = mask & w->exited;
    if (!gone) return;
    int lane = __builtin_ctz(gone);
    emu_fatal("%s at %s:%d in kernel %s, block (%u,%u,%u), thread %d: its mask 0x%08x names lane %d, which has "
              "exited (every lane in the mask must reach the call; CUDA leaves this undefined)",
              what, file, line, b->k->site.name, t->view.block_idx.x, t->view.block_idx.y, t->view.block_idx.z,
              t->view.linear, mask, lane);
}

static void release_warp(block_run *b, warp *w, int warp_index) {
    int bank = w->bank;
    w->releases++;
    for (int lane = 0; lane < EMU_WARP_SIZE; lane++) {
        if (w->arrived & lane_bit(lane)) {
            kthread *t = &b->threads[warp_index * EMU_WARP_SIZE + lane];
            t->state = READY;
            t->result_bank = bank;
            t->view.warp_epoch = w->releases;
        } else {
            memset(w->slots[bank][lane], POISON, EMU_WARP_SLOT_BYTES);
        }
    }
    w->bank ^= 1;
    w->arrived = w->wanted = 0;
}

// The lanes of one exchange must all be at the same warp operation, with
// the same mask: a shuffle that some lanes reach at one line and others at
// another (in two branches) is a divergent warp operation, which CUDA
// leaves undefined, like a __syncthreads in a branch. (Two __syncwarp may
// be at different lines: sm_70 and later allow that. Lanes whose masks do
// not name each other are separate exchanges.)
static void check_same_site(const block_run *b, const warp *w, int wi, const kthread *t, unsigned mask,
                            const char *what, const char *file, int line) {
    for (unsigned waiting = w->arrived; waiting; waiting &= waiting - 1) {
        const kthread *o = &b->threads[wi * EMU_WARP_SIZE + __builtin_ctz(waiting)];
        if (!(o->wait_mask & lane_bit(t->view.lane)) && !(mask & lane_bit(o->view.lane))) continue;
        bool same = o->wait_line == line && !strcmp(o->wait_file, file) && !strcmp(o->wait_what, what);
        if (!same && !(strcmp(what, "__syncwarp") == 0 && strcmp(o->wait_what, "__syncwarp") == 0))
            emu_fatal("in kernel %s, block (%u,%u,%u), the lanes of warp %d meet at two different warp operations: "
                      "thread %d at %s (%s:%d), thread %d at %s (%s:%d) (a shuffle or vote inside a branch that not "
                      "every lane of its mask takes; CUDA leaves this undefined)",
                      b->k->site.name, t->view.block_idx.x, t->view.block_idx.y, t->view.block_idx.z, wi,
                      o->view.linear, o->wait_what, o->wait_file, o->wait_line, t->view.linear, what, file, line);
        if (mask != o->wait_mask)
            emu_fatal("in kernel %s, block (%u,%u,%u), thread %d calls %s (%s:%d) with mask 0x%08x, thread %d with "
                      "0x%08x (every lane of an exchange must pass the same mask; CUDA leaves this undefined)",
                      b->k->site.name, t->view.block_idx.x, t->view.block_idx.y, t->view.block_idx.z,
                      o->view.linear, what, file, line, o->wait_mask, t->view.linear, mask);
    }
}

const void *emu_warp_share(unsigned mask, const void *value, size_t size, const char *what, const char *file,
                           int line) {
    kthread *t = self_thread(what);
    block_run *b = running;
    int wi = t->view.linear / EMU_WARP_SIZE, lane = t->view.lane;
    warp *w = &b->warps[wi];
    if (!(mask & lane_bit(lane)))
        emu_fatal("%s at %s:%d in kernel %s: thread %d calls it with mask 0x%08x, which does not include its own "
                  "lane %d",
                  what, file, line, b->k->site.name, t->view.linear, mask, lane);
    if (size > EMU_WARP_SLOT_BYTES) emu_fatal("%s: a %zu-byte value is larger than a shuffle moves", what, size);
    memcpy(w->slots[w->bank][lane], value, size);
    check_mask_lanes(b, w, t, mask, what, file, line);
    if (w->arrived) check_same_site(b, w, wi, t, mask, what, file, line);
    t->state = AT_WARP;
    t->wait_what = what, t->wait_file = file, t->wait_line = line, t->wait_mask = mask;
    w->arrived |= lane_bit(lane);
    w->wanted |= mask;
    if ((w->wanted & w->existing & ~w->arrived) == 0) release_warp(b, w, wi);
    else yield_to_scheduler(t);
    return w->slots[t->result_bank];
}

unsigned emu_active_mask(void) {
    kthread *t = self_thread("__activemask()");
    const warp *w = &running->warps[t->view.linear / EMU_WARP_SIZE];
    return w->existing & ~w->exited;
}

// ---------------------------------------------------------------- shared memory

void *emu_shared_static(emu_shared_site *site, size_t size, size_t align, const char *name) {
    kthread *t = self_thread("__shared__ memory");
    (void)t;
    block_run *b = running;
    if (site->block_serial != b->serial) {
        size_t offset = (b->static_used + align - 1) / align * align;
        if (offset + size > EMU_STATIC_SHARED_LIMIT)
            emu_fatal("kernel %s declares more than %d KiB of __shared__ memory (at '%s'); a GPU refuses to "
                      "compile that: use dynamic shared memory with cudaFuncSetAttribute",
                      b->k->site.name, EMU_STATIC_SHARED_LIMIT / 1024, name);
        site->offset = offset;
        site->block_serial = b->serial;
        b->static_used = offset + size;
        if (b->static_used > b->static_poisoned) { // first use of these bytes: they hold garbage, as on a GPU
            memset(b->shared + b->static_poisoned, POISON, b->static_used - b->static_poisoned);
            b->static_poisoned = b->static_used;
        }
    }
    return b->shared + site->offset;
}

void *emu_shared_dynamic(void) {
    self_thread("extern __shared__ memory");
    return running->shared + EMU_STATIC_SHARED_LIMIT;
}

// ---------------------------------------------------------------- one block

static void describe_waits(const block_run *b, char *out, size_t size) {
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < b->count && used + 200 < size;) {
        const kthread *t = &b->threads[i];
        int j = i + 1;
        while (j < b->count && b->threads[j].state == t->state && b->threads[j].wait_line == t->wait_line &&
               (t->state == EXITED || !strcmp(b->threads[j].wait_file, t->wait_file)))
            j++;
        if (t->state == EXITED)
            used += (size_t)snprintf(out + used, size - used, "%sthreads %d-%d have exited", used ? "; " : "", i, j - 1);
        else
            used += (size_t)snprintf(out + used, size - used, "%sthreads %d-%d wait in %s at %s:%d", used ? "; " : "",
                                     i, j - 1, t->wait_what, t->wait_file, t->wait_line);
        i = j;
    }
}

__attribute__((noreturn)) static void deadlock(const block_run *b) {
    char waits[1500];
    describe_waits(b, waits, sizeof waits);
    const emu_thread_view *v = &b->threads[0].view;
    emu_fatal("kernel %s (launched at %s:%d) cannot go on in block (%u,%u,%u): %s. On a GPU this hangs; threads "
              "must all reach the same barrier, and every lane a warp operation's mask names must reach one",
              b->k->site.name, b->k->site.file, b->k->site.line, v->block_idx.x, v->block_idx.y, v->block_idx.z, waits);
}

static void thread_exit(block_run *b, kthread *t) {
    t->state = EXITED;
    b->live--;
    warp *w = &b->warps[t->view.linear / EMU_WARP_SIZE];
    w->exited |= lane_bit(t->view.lane);
    if (w->arrived && (w->wanted & lane_bit(t->view.lane))) {
        const kthread *waiter = &b->threads[(t->view.linear / EMU_WARP_SIZE) * EMU_WARP_SIZE + __builtin_ctz(w->arrived)];
        emu_fatal("in kernel %s, thread %d exited while lane %d of its warp waits for it in %s at %s:%d",
                  b->k->site.name, t->view.linear, waiter->view.lane, waiter->wait_what, waiter->wait_file,
                  waiter->wait_line);
    }
    if (b->at_barrier > 0) barrier_without(b, t, first_in_state(b, AT_BARRIER));
}

// A stack runs threads one after another: when its thread ends and the
// next ready thread has not started yet (the common case: most kernels
// never wait), the next one runs right here, without a switch. Otherwise
// the stack is given back and the core goes to a waiting thread.
static void fiber_main(void *arg) {
    int stack = (int)(intptr_t)arg;
    emu_fiber *me = emu_fiber_for_thread(stack);
    block_run *b = running;
    for (;;) {
        kthread *t = &b->threads[b->current];
        b->k->body(b->k->closure);
        thread_exit(b, t);
        int next = next_ready(b, t->view.linear);
        if (next >= 0 && !b->threads[next].started) {
            kthread *n = &b->threads[next];
            n->started = true, n->fiber = me;
            b->current = next;
            emu_self = &n->view;
            continue;
        }
        b->free_stacks[b->free_count++] = stack;
        if (next < 0) emu_fiber_switch(me, emu_fiber_host(), true);
        else run_thread(b, next, me, true);
    }
}

// A random permutation of 0..n-1 (Fisher-Yates).
static void shuffle(int *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(emu_order_random() % (uint64_t)(i + 1)), x = v[i];
        v[i] = v[j], v[j] = x;
    }
}

// The order in which next_ready picks the threads: warps, and lanes within
// a warp, forward, reverse or shuffled (EMU_ORDER).
static void choose_order(block_run *b) {
    emu_order_kind k = emu_order();
    int warps = (b->count + EMU_WARP_SIZE - 1) / EMU_WARP_SIZE, warp_order[EMU_MAX_BLOCK_THREADS / EMU_WARP_SIZE];
    for (int i = 0; i < EMU_WARP_SIZE; i++) b->lane_order[i] = k == EMU_ORDER_REVERSE ? EMU_WARP_SIZE - 1 - i : i;
    for (int i = 0; i < warps; i++) warp_order[i] = k == EMU_ORDER_REVERSE ? warps - 1 - i : i;
    if (k == EMU_ORDER_SHUFFLED) {
        shuffle(b->lane_order, EMU_WARP_SIZE);
        shuffle(warp_order, warps);
    }
    for (int i = 0; i < EMU_WARP_SIZE; i++) b->lane_rank[b->lane_order[i]] = i;
    int n = 0;
    for (int w = 0; w < warps; w++)
        for (int l = 0; l < EMU_WARP_SIZE; l++) {
            int i = warp_order[w] * EMU_WARP_SIZE + b->lane_order[l];
            if (i < b->count) b->rank[i] = n, b->order[n++] = i;
        }
}

static void setup_threads(block_run *b, uint3 block_idx) {
    const emu_launch_config *c = &b->k->cfg;
    int bx = (int)c->block.x, by = (int)c->block.y;
    for (int i = 0; i < b->count; i++) {
        kthread *t = &b->threads[i];
        t->view.thread_idx = (uint3){(unsigned)(i % bx), (unsigned)((i / bx) % by), (unsigned)(i / (bx * by))};
        t->view.block_idx = block_idx;
        t->view.block_dim = c->block;
        t->view.grid_dim = c->grid;
        t->view.linear = i;
        t->view.lane = i % EMU_WARP_SIZE;
        t->view.warp_epoch = 0;
        t->view.block = &b->info;
        t->state = READY;
        t->started = false;
        t->fiber = NULL;
        b->free_stacks[i] = b->count - 1 - i; // handed out from the top: thread 0 gets stack 0
    }
    b->free_count = b->fewest_free = b->count;
    int warps = (b->count + EMU_WARP_SIZE - 1) / EMU_WARP_SIZE;
    for (int w = 0; w < warps; w++) {
        int lanes = b->count - w * EMU_WARP_SIZE;
        warp *wp = &b->warps[w]; // the slots need no reset: a release poisons the ones not written
        wp->exited = wp->arrived = wp->wanted = wp->releases = 0;
        wp->bank = 0;
        wp->existing = lanes >= EMU_WARP_SIZE ? 0xffffffffu : (1u << lanes) - 1;
    }
    choose_order(b);
}

static void run_block(block_run *b, uint3 block_idx, unsigned long long block_linear, bool race_check) {
    b->serial = ++block_serial_counter;
    b->static_used = 0;
    b->live = b->count;
    b->at_barrier = b->barrier_count = 0;
    b->info = (emu_block_info){b->serial, block_linear * (unsigned long long)b->count, (unsigned)b->count, 0,
                               b->shared, SHARED_BYTES, emu_current_op(), race_check};
    setup_threads(b, block_idx);
    // Garbage in shared memory, as a GPU leaves it: the static area as each
    // declaration first claims it, the dynamic area now.
    b->static_poisoned = 0;
    if (b->k->cfg.shared_bytes) memset(b->shared + EMU_STATIC_SHARED_LIMIT, POISON, b->k->cfg.shared_bytes);
    // Threads hand over to each other (run_thread); control comes back
    // here only when none is ready: the block is done, or stuck.
    int next = b->order[0];
    while (b->live > 0) {
        if (next < 0) deadlock(b);
        run_thread(b, next, emu_fiber_host(), false);
        emu_self = NULL;
        next = next_ready(b, b->current);
    }
    emu_fiber_check_stacks(b->count - b->fewest_free, b->k->site.name);
}

// ---------------------------------------------------------------- the grid, as a queued op

static unsigned long long gcd(unsigned long long a, unsigned long long b) {
    while (b) {
        unsigned long long r = a % b;
        a = b, b = r;
    }
    return a;
}

static emu_op_status run_kernel(void *state) {
    kernel_launch *k = (kernel_launch *)state;
    static __thread unsigned char *shared_memory;
    static __thread kthread *threads;
    static __thread warp *warps;
    if (!shared_memory) {
        shared_memory = aligned_alloc(256, SHARED_BYTES);
        threads = calloc(EMU_MAX_BLOCK_THREADS, sizeof *threads);
        warps = calloc(EMU_MAX_BLOCK_THREADS / EMU_WARP_SIZE, sizeof *warps);
        if (!shared_memory || !threads || !warps) emu_fatal("out of host memory for running a kernel");
    }
    emu_install_fault_handler();
    block_run b = {.k = k,
                   .count = (int)(k->cfg.block.x * k->cfg.block.y * k->cfg.block.z),
                   .threads = threads,
                   .warps = warps,
                   .shared = shared_memory};
    block_run *outer = running;
    const emu_kernel_site *outer_site = emu_running_kernel();
    running = &b;
    emu_set_running_kernel(&k->site);
    unsigned long long gx = k->cfg.grid.x, gy = k->cfg.grid.y, total = gx * gy * k->cfg.grid.z, step = 1, start = 0;
    emu_order_kind order = emu_order();
    bool race_check = emu_race_check_launch(k->site.name);
    if (order == EMU_ORDER_REVERSE) step = total - 1, start = total - 1; // i -> total-1-i, as (start + i*step) % total
    if (order == EMU_ORDER_SHUFFLED && total > 1) { // i -> (start + i*step) % total, step coprime to total
        do step = 1 + emu_order_random() % (total - 1);
        while (gcd(step, total) != 1);
        start = emu_order_random() % total;
    }
    for (unsigned long long i = 0; i < total; i++) {
        unsigned long long at = (start + (unsigned __int128)i * step % total) % total;
        run_block(&b, (uint3){(unsigned)(at % gx), (unsigned)(at / gx % gy), (unsigned)(at / (gx * gy))}, at,
                  race_check);
    }
    running = outer;
    emu_set_running_kernel(outer_site);
    emu_check_redzones(k->site.name);
    return EMU_OP_DONE;
}

static void free_launch(void *state) {
    kernel_launch *k = (kernel_launch *)state;
    k->free_closure(k->closure);
    free(k);
}

// ---------------------------------------------------------------- kernels by address (cudaLaunchKernel)

typedef struct {
    const void *kernel;
    char *name;
    emu_untyped_launcher launcher;
} registered_kernel;

static registered_kernel *registered;
static int registered_count, registered_cap;

// Runs before main, once per kernel (cuda_runtime.h's emu_kernel_registrar).
void emu_register_kernel(const void *kernel, const char *pretty, emu_untyped_launcher launcher) {
    const char *k = strstr(pretty, "K = ");
    const char *name = k ? k + 4 : pretty;
    size_t len = strlen(name);
    if (k && len && name[len - 1] == ']') len--;
    emu_lock();
    if (registered_count == registered_cap) {
        registered_cap = registered_cap ? 2 * registered_cap : 64;
        registered = realloc(registered, sizeof *registered * (size_t)registered_cap);
        if (!registered) emu_fatal("out of host memory registering kernels");
    }
    char *copy = strndup(name, len);
    if (!copy) emu_fatal("out of host memory registering kernels");
    registered[registered_count++] = (registered_kernel){kernel, copy, launcher};
    emu_unlock();
}

cudaError_t emu_launch_untyped(const void *kernel, emu_launch_config cfg, void **args) {
    emu_lock();
    registered_kernel found = {0};
    for (int i = 0; i < registered_count && !found.kernel; i++)
        if (registered[i].kernel == kernel) found = registered[i];
    emu_unlock();
    if (!found.kernel) {
        emu_warn("cudaLaunchKernel: %p is not a kernel of this program that the emulated GPU knows (a kernel in a "
                 "file compiled without cu2emu?)",
                 kernel);
        return emu_set_error(cudaErrorInvalidDeviceFunction);
    }
    if (!args) return emu_set_error(cudaErrorInvalidValue);
    return found.launcher(kernel, found.name, &cfg, args);
}

// ---------------------------------------------------------------- attributes and limits

static unsigned long long launches;

unsigned long long emu_kernel_launches(void) { return launches; }

// A pointer argument must point to memory the GPU can reach: device
// memory, or pinned host memory (which CUDA maps into the device's address
// space). A pointer to ordinary host memory faults on a GPU when the
// kernel reads it, far from the launch; here the launch says so.
void emu_check_kernel_pointer(const char *kernel, const char *file, int line, int index, const void *p) {
    if (!p || !emu_is_host_memory(p)) return;
    emu_fatal("kernel %s, launched at %s:%d: argument %d is a pointer to host memory (%p), which a GPU cannot "
              "read (it faults with cudaErrorIllegalAddress): copy the data to device memory (cudaMalloc, "
              "cudaMemcpy) and pass the device pointer",
              kernel, file, line, index + 1, p);
}

typedef struct { const void *kernel; int max_dynamic_shared; } kernel_attr;
static kernel_attr attrs[256];
static int attr_count;

static int max_dynamic_shared(const void *kernel) {
    for (int i = 0; i < attr_count; i++)
        if (attrs[i].kernel == kernel) return attrs[i].max_dynamic_shared;
    return EMU_STATIC_SHARED_LIMIT;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    if (!func) return emu_set_error(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > EMU_DYNAMIC_SHARED_OPTIN)
        return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    int i = 0;
    while (i < attr_count && attrs[i].kernel != func) i++;
    if (i == attr_count) {
        if (attr_count == 256) {
            emu_unlock();
            return emu_set_error(cudaErrorNotSupported);
        }
        attr_count++;
    }
    attrs[i] = (kernel_attr){func, value};
    emu_unlock();
    return cudaSuccess;
}

// The checks a GPU makes before it runs anything. A refused launch queues
// nothing; the error waits for cudaGetLastError, as on a GPU, and the
// emulator says why on stderr.
static cudaError_t check_config(const emu_launch_config *c, const void *kernel, const char *name) {
    unsigned long long threads = (unsigned long long)c->block.x * c->block.y * c->block.z;
    const char *why = NULL;
    char text[300];
    if (!c->block.x || !c->block.y || !c->block.z || !c->grid.x || !c->grid.y || !c->grid.z)
        why = "a grid or block dimension is 0";
    else if (threads > EMU_MAX_BLOCK_THREADS) {
        snprintf(text, sizeof text, "%llu threads per block (%ux%ux%u); a GPU allows at most %d", threads,
                 c->block.x, c->block.y, c->block.z, EMU_MAX_BLOCK_THREADS);
        why = text;
    } else if (c->block.z > 64)
        why = "blockDim.z is above 64";
    else if (c->grid.x > 2147483647u || c->grid.y > 65535 || c->grid.z > 65535) {
        snprintf(text, sizeof text, "a grid of %ux%ux%u blocks; gridDim.y and gridDim.z may be at most 65535",
                 c->grid.x, c->grid.y, c->grid.z);
        why = text;
    }
    if (why) {
        emu_warn("launch of %s refused (cudaErrorInvalidConfiguration): %s", name, why);
        return cudaErrorInvalidConfiguration;
    }
    if (c->max_threads && threads > c->max_threads) {
        emu_warn("launch of %s refused (cudaErrorLaunchOutOfResources): %llu threads per block, above the %u of "
                 "its __launch_bounds__ (the compiler fitted its registers to that many)",
                 name, threads, c->max_threads);
        return cudaErrorLaunchOutOfResources;
    }
    int limit = max_dynamic_shared(kernel);
    if (c->shared_bytes > (size_t)limit) {
        emu_warn("launch of %s refused (cudaErrorInvalidValue): %zu bytes of dynamic shared memory, above the "
                 "kernel's limit of %d (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                 "bytes) raises it to at most %d)",
                 name, c->shared_bytes, limit, EMU_DYNAMIC_SHARED_OPTIN);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

// ---------------------------------------------------------------- the launch log (EMU_LAUNCH_LOG)
// EMU_LAUNCH_LOG=PATH appends a line to PATH for every kernel the host
// launches (or captures into a graph: its replays run the same grid):
//   launch GXxGYxGZ BXxBYxBZ FILE:LINE NAME
// - the grid, the block, where it was launched and the kernel as the launch
// names it (with template parameters: "layernorm_forward_kernel<Act>").
// emu_launch_log_note adds a line of the program's own, "note TEXT": a
// test marks where each of its cases starts, and can then say which grids
// each case gave which kernel (tests/chapters/test_08_gpt_cuda.sh).
// Each line is one write() to a file opened with O_APPEND, so the lines
// of several threads or processes never mix. Unset: nothing is written.
static int launch_log = -1;

__attribute__((constructor)) static void open_launch_log(void) {
    const char *path = getenv("EMU_LAUNCH_LOG");
    if (!path || !*path) return;
    launch_log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (launch_log < 0) emu_fatal("EMU_LAUNCH_LOG=%s: cannot open it for appending: %s", path, strerror(errno));
}

static void launch_log_write(const char *line, int len) {
    if (len <= 0) return;
    if (write(launch_log, line, (size_t)len) != (ssize_t)len)
        emu_fatal("EMU_LAUNCH_LOG: cannot write to it: %s", strerror(errno));
}

void emu_launch_log_note(const char *text) {
    if (launch_log < 0) return;
    char line[512];
    int len = snprintf(line, sizeof line - 1, "note %s", text);
    if (len > (int)sizeof line - 2) len = (int)sizeof line - 2;
    line[len++] = '\n';
    launch_log_write(line, len);
}

static void log_launch(const emu_launch_config *c, const char *name, const char *file, int line_no) {
    if (launch_log < 0) return;
    char line[1024];
    int len = snprintf(line, sizeof line - 1, "launch %ux%ux%u %ux%ux%u %s:%d %s", c->grid.x, c->grid.y, c->grid.z,
                       c->block.x, c->block.y, c->block.z, file, line_no, name);
    if (len > (int)sizeof line - 2) len = (int)sizeof line - 2;
    line[len++] = '\n';
    launch_log_write(line, len);
}

cudaError_t emu_launch_kernel(const emu_launch_config *cfg, const void *kernel_id, const char *name,
                              const char *file, int line, void (*body)(void *), void (*free_closure)(void *),
                              void *closure) {
    if (running) {
        free_closure(closure);
        emu_fatal("kernel %s was launched from inside kernel %s (dynamic parallelism is not emulated)", name,
                  running->k->site.name);
    }
    cudaError_t err = check_config(cfg, kernel_id, name);
    if (err) {
        free_closure(closure);
        return emu_set_error(err);
    }
    kernel_launch *k = calloc(1, sizeof *k);
    if (!k) emu_fatal("out of host memory queueing a kernel");
    if (!emu_stream_capture(cfg->stream, NULL)) launches++; // a captured kernel is launched with its graph
    log_launch(cfg, name, file, line);
    *k = (kernel_launch){*cfg, {name, file, line}, body, free_closure, closure};
    err = emu_stream_enqueue(cfg->stream, name, run_kernel, k, free_launch, NULL, EMU_OP_REPLAYABLE);
    return err ? emu_set_error(err) : cudaSuccess;
}
