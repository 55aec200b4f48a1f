// fiber.c - user-level threads, the way the emulator runs a block's threads.
//
// A GPU runs the threads of a block at the same time, and __syncthreads()
// holds each one until all have arrived. On one CPU core the emulator gets
// the same effect with fibers: each CUDA thread has its own small stack,
// runs until it must wait (a barrier, a shuffle) or ends, and then hands
// the core to the next thread with a context switch - saving a few
// registers and the stack pointer, loading another thread's. No OS thread
// is created and nothing runs in parallel, so switches cost nanoseconds
// and every run is reproducible.
//
// x86-64 switches with the few instructions below; other machines use
// ucontext (slower, same behaviour). Under AddressSanitizer every switch
// is announced to ASan, which otherwise mistakes the new stack for an
// overflow of the old one.
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_internal.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(EMU_USE_UCONTEXT)
// emu_raw_switch(&from_sp, to_sp): push the callee-saved registers, save
// the stack pointer, load the other one, pop its registers, return into
// it. (The SSE and x87 control words are not switched: kernels share the
// host thread's rounding mode and never change it.) A fresh fiber "returns" into the
// trampoline, which calls entry(arg) with r12 = arg and r13 = entry.
__asm__(".text\n"
        ".globl emu_raw_switch\n"
        ".type emu_raw_switch,@function\n"
        "emu_raw_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size emu_raw_switch, .-emu_raw_switch\n"
        ".globl emu_fiber_trampoline\n"
        ".type emu_fiber_trampoline,@function\n"
        "emu_fiber_trampoline:\n"
        "    endbr64\n"
        "    movq %r12, %rdi\n"
        "    callq *%r13\n"
        "    ud2\n"
        ".size emu_fiber_trampoline, .-emu_fiber_trampoline\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
void emu_raw_switch(void **save_sp, void *load_sp);
void emu_fiber_trampoline(void);
#define EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

struct emu_fiber {
    char *map;          // mapping: guard page, then the stack
    size_t map_len;
    char *stack;        // usable stack [stack, stack + stack_size)
    size_t stack_size;
    void (*user_entry)(void *); // what the fiber runs
    void *user_arg;
#ifdef EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
#ifdef __SANITIZE_ADDRESS__
    void *fake_stack;
    const void *asan_bottom; // for the host thread's own context, learnt on the first switch
    size_t asan_size;
#endif
};

static size_t stack_bytes(void) {
    static size_t bytes;
    if (!bytes) {
        const char *s = getenv("EMU_STACK_KB");
        long kb = s ? atol(s) : 0;
#ifdef __SANITIZE_ADDRESS__
        if (kb <= 0) kb = 512; // ASan's redzones make every frame several times larger
#else
        if (kb <= 0) kb = 64;
#endif
        long page = sysconf(_SC_PAGESIZE);
        bytes = ((size_t)kb * 1024 + (size_t)page - 1) / (size_t)page * (size_t)page;
    }
    return bytes;
}

// The host thread's own context: where the scheduler runs.
static __thread emu_fiber host_context;

// Stacks are made once per thread index and reused by every block.
static __thread emu_fiber *pool[EMU_FIBER_MAX];

// Every stack ever made, for the fault handler's "stack overflow" test.
static emu_fiber *all_fibers[4 * EMU_FIBER_MAX];
static int all_count;

emu_fiber *emu_fiber_host(void) { return &host_context; }

#ifdef __SANITIZE_ADDRESS__
// Under ASan every stack is a mapping of its own with an unmapped page
// below it, so an overflow faults at once (and the fault handler says so).
static void map_stack(emu_fiber *f, int index, size_t size) {
    (void)index;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    f->map_len = size + page;
    f->map = mmap(NULL, f->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f->map == MAP_FAILED) emu_fatal("cannot map a %zu KiB kernel thread stack: %s", size / 1024, strerror(errno));
    if (mprotect(f->map, page, PROT_NONE) != 0) emu_fatal("mprotect of a stack guard failed: %s", strerror(errno));
    f->stack = f->map + page;
}
#else
// Otherwise all stacks lie side by side in one region of huge pages: a
// switch to another thread's stack then rarely misses the TLB (with 4 KiB
// pages, every switch of a 256-thread block did - a third of the time of a
// shuffle). A canary at the bottom of each stack stands in for a guard page.
#define CANARY_WORDS 8
#define CANARY 0xA5A5A5A5A5A5A5A5ull
static __thread char *stack_region;

static void map_stack(emu_fiber *f, int index, size_t size) {
    if (!stack_region) {
        size_t huge = 2u << 20, len = (size_t)EMU_FIBER_MAX * size + huge;
        char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r == MAP_FAILED) emu_fatal("cannot map the kernel threads' stacks (%zu MiB): %s", len >> 20, strerror(errno));
        stack_region = (char *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
        madvise(stack_region, (size_t)EMU_FIBER_MAX * size, MADV_HUGEPAGE); // a hint; fine if refused
    }
    f->stack = stack_region + (size_t)index * size;
    for (int k = 0; k < CANARY_WORDS; k++) ((uint64_t *)f->stack)[k] = CANARY;
}
#endif

// After a block: a stack whose canary changed overflowed into its neighbour.
void emu_fiber_check_stacks(int used, const char *kernel) {
#ifndef __SANITIZE_ADDRESS__
    for (int i = 0; i < used && i < EMU_FIBER_MAX; i++) {
        const uint64_t *c = pool[i] ? (const uint64_t *)pool[i]->stack : NULL;
        for (int k = 0; c && k < CANARY_WORDS; k++)
            if (c[k] != CANARY)
                emu_fatal("a thread of kernel %s overflowed its %zu KiB stack (large local arrays or deep "
                          "recursion in a kernel; EMU_STACK_KB sets the emulated thread's stack size)",
                          kernel, stack_bytes() / 1024);
    }
#else
    (void)used, (void)kernel;
#endif
}

emu_fiber *emu_fiber_for_thread(int index) {
    if (index < 0 || index >= EMU_FIBER_MAX) emu_fatal("fiber index %d out of range", index);
    if (pool[index]) return pool[index];
    emu_fiber *f = calloc(1, sizeof *f);
    if (!f) emu_fatal("out of host memory for a kernel thread");
    size_t size = stack_bytes();
    map_stack(f, index, size);
    f->stack_size = size;
    pool[index] = f;
    emu_lock();
    if (all_count < (int)(sizeof all_fibers / sizeof all_fibers[0])) all_fibers[all_count++] = f;
    emu_unlock();
    return f;
}

void emu_fiber_stacks(const char **lo, const char **hi) {
#ifdef __SANITIZE_ADDRESS__
    *lo = *hi = NULL; // one mapping per stack (and no race checking under ASan)
#else
    if (!stack_region) emu_fiber_for_thread(0);
    *lo = stack_region, *hi = stack_region + (size_t)EMU_FIBER_MAX * stack_bytes();
#endif
}

bool emu_fiber_stack_guard(const void *addr) {
    const char *a = (const char *)addr;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < all_count; i++)
        if (all_fibers[i]->map && a >= all_fibers[i]->map && a < all_fibers[i]->map + page) return true;
    return false;
}

#ifndef EMU_ASM_SWITCH
static void fiber_start(void *arg);
static void ucontext_entry(unsigned hi, unsigned lo) {
    fiber_start((void *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

// Every fresh fiber starts here: tell ASan we arrived, then run.
static void fiber_start(void *arg) {
    emu_fiber *f = (emu_fiber *)arg;
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(NULL, &host_context.asan_bottom, &host_context.asan_size);
#endif
    f->user_entry(f->user_arg);
    emu_fatal("a kernel thread's fiber returned (internal error)");
}

void emu_fiber_prepare(emu_fiber *f, void (*entry)(void *), void *arg) {
    f->user_entry = entry;
    f->user_arg = arg;
#ifdef __SANITIZE_ADDRESS__
    ASAN_UNPOISON_MEMORY_REGION(f->stack, f->stack_size); // frames of the fiber's last thread
#endif
#ifdef EMU_ASM_SWITCH
    // The frame emu_raw_switch pops: r15, r14, r13, r12, rbx, rbp, then the
    // return address. The trampoline then runs with a 16-byte aligned stack.
    uintptr_t top = ((uintptr_t)(f->stack + f->stack_size) & ~(uintptr_t)15) - 16;
    uint64_t *sp = (uint64_t *)(top - 56);
    sp[0] = 0, sp[1] = 0;                         // r15, r14
    sp[2] = (uint64_t)(uintptr_t)fiber_start;     // r13: what the trampoline calls
    sp[3] = (uint64_t)(uintptr_t)f;               // r12: its argument
    sp[4] = 0, sp[5] = 0;                         // rbx, rbp
    sp[6] = (uint64_t)(uintptr_t)emu_fiber_trampoline;
    f->sp = sp;
#else
    if (getcontext(&f->uc) != 0) emu_fatal("getcontext failed: %s", strerror(errno));
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)f;
    makecontext(&f->uc, (void (*)(void))ucontext_entry, 2, (unsigned)(p >> 32), (unsigned)p);
#endif
}

void emu_fiber_switch(emu_fiber *from, emu_fiber *to, bool from_finished) {
#ifdef __SANITIZE_ADDRESS__
    const void *bottom = to == &host_context ? to->asan_bottom : to->stack;
    size_t size = to == &host_context ? to->asan_size : to->stack_size;
    __sanitizer_start_switch_fiber(from_finished ? NULL : &from->fake_stack, bottom, size);
#else
    (void)from_finished;
#endif
#ifdef EMU_ASM_SWITCH
    emu_raw_switch(&from->sp, to->sp);
#else
    if (swapcontext(&from->uc, &to->uc) != 0) emu_fatal("swapcontext failed: %s", strerror(errno));
#endif
#ifdef __SANITIZE_ADDRESS__
    if (from == &host_context)
        __sanitizer_finish_switch_fiber(from->fake_stack, NULL, NULL);
    else
        __sanitizer_finish_switch_fiber(from->fake_stack, &host_context.asan_bottom, &host_context.asan_size);
#endif
}
