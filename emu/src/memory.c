// memory.c - device memory, and the fault handler that guards it.
//
// A real GPU's memory is a separate chip: host code cannot dereference a
// device pointer (it gets garbage or a crash), and copies go through
// cudaMemcpy. To make the same mistakes visible here, every cudaMalloc is a
// mapping of its own that is PROT_NONE - unreadable - whenever host code
// runs, and readable only while the emulator runs queued GPU work. A host
// read of a device pointer is then a fault at once, which the SIGSEGV
// handler below turns into a sentence naming the allocation.
//
// Each allocation is placed so that it ends at (or within 255 bytes of)
// the end of its pages, with an unmapped guard page after it: a kernel
// that runs past the end of a buffer faults. The few bytes of slack that
// the 256-byte alignment leaves are filled with a canary that is checked
// after every kernel, so even a one-element overrun is named (with the
// kernel). Under AddressSanitizer the slack is poisoned instead, and ASan
// reports the overrun with the kernel's source line. Fresh allocations are filled with 0xFF
// bytes (a NaN in every float), as a GPU gives no zeros: code that forgets
// a cudaMemset computes with NaNs instead of passing by luck.
//
// cudaFree lives in copy.c: it first waits for the queued work that may
// still use the memory, which is a stream's business, above this file.
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_internal.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#define EMU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define EMU_MAX_DEVICES 64 // as core.c
#define EMU_ALIGN 256        // cudaMalloc's alignment
#define EMU_POISON_BYTE 0xFF // NaN in float, bf16 and double; -1 in integers
#define EMU_CANARY_BYTE 0xCD // fills the slack around an allocation: a changed byte is an overrun

// ================================================================ device memory

typedef struct allocation {
    char *map;       // the whole mapping: data pages + one guard page
    size_t map_len;
    char *ptr;       // what cudaMalloc returned
    size_t size;
    size_t data_len; // bytes of the mapping the data pages cover (no guard)
    int device;
    bool freed;      // kept PROT_NONE for a while, so a use after cudaFree is named
    void *shadow;    // the race checker's record of its words (race.c), made on first use
    size_t shadow_len;
    struct allocation *next;
} allocation;

static allocation *allocations;       // live first, then recently freed
static allocation **sorted;           // the live ones by address, for emu_device_span_of
static int sorted_count, sorted_cap;
static bool sorted_stale = true;
static size_t allocated_bytes[EMU_MAX_DEVICES];
static int access_depth = 0;          // > 0 while the emulator runs GPU work
static int freed_kept = 0;
enum { FREED_KEPT_MAX = 256 };

static size_t page_size(void) {
    static size_t p;
    if (!p) p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

static void protect(allocation *a, int prot) {
    if (mprotect(a->map, a->data_len, prot) != 0)
        emu_fatal("mprotect of a %zu-byte device allocation failed: %s", a->size, strerror(errno));
}

void emu_device_access_begin(void) {
    emu_lock();
    if (access_depth++ == 0)
        for (allocation *a = allocations; a; a = a->next)
            if (!a->freed) protect(a, PROT_READ | PROT_WRITE);
    emu_unlock();
}

void emu_device_access_end(void) {
    emu_lock();
    if (--access_depth == 0)
        for (allocation *a = allocations; a; a = a->next)
            if (!a->freed) protect(a, PROT_NONE);
    emu_unlock();
}

static allocation *find_allocation(const void *p, bool include_guard) {
    const char *c = (const char *)p;
    for (allocation *a = allocations; a; a = a->next) {
        if (include_guard ? (c >= a->map && c < a->map + a->map_len) : (c >= a->ptr && c < a->ptr + a->size))
            return a;
    }
    return NULL;
}

cudaError_t cudaMalloc(void **out, size_t size) {
    if (!out) return emu_set_error(cudaErrorInvalidValue);
    *out = NULL;
    emu_lock();
    cudaError_t err = emu_check_device(emu_current_device());
    if (err) {
        emu_unlock();
        return emu_set_error(err);
    }
    int dev = emu_current_device();
    if (size == 0) { // CUDA returns success and a NULL pointer
        emu_unlock();
        return cudaSuccess;
    }
    if (allocated_bytes[dev] + size > emu_device_memory_bytes() || size > emu_device_memory_bytes()) {
        emu_unlock();
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    size_t pg = page_size(), data_len = (size + pg - 1) / pg * pg;
    char *map = mmap(NULL, data_len + pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        emu_unlock();
        return emu_set_error(cudaErrorMemoryAllocation);
    }
    allocation *a = calloc(1, sizeof *a);
    if (!a) emu_fatal("out of host memory for allocation bookkeeping");
    // End the data as close to the guard page as the 256-byte alignment allows.
    size_t start = (data_len - size) / EMU_ALIGN * EMU_ALIGN;
    *a = (allocation){.map = map, .map_len = data_len + pg, .ptr = map + start, .size = size, .data_len = data_len,
                      .device = dev, .next = allocations};
    allocations = a;
    sorted_stale = true;
    allocated_bytes[dev] += size;
    protect(a, PROT_READ | PROT_WRITE);
    memset(a->ptr, EMU_POISON_BYTE, size);
    memset(map, EMU_CANARY_BYTE, start);
    memset(a->ptr + size, EMU_CANARY_BYTE, data_len - start - size);
    EMU_POISON(map, start);
    EMU_POISON(a->ptr + size, data_len - start - size);
    if (access_depth == 0) protect(a, PROT_NONE);
    *out = a->ptr;
    emu_unlock();
    return cudaSuccess;
}

// Forget the oldest freed allocations once there are many.
static void trim_freed(void) {
    while (freed_kept > FREED_KEPT_MAX) {
        allocation **link = &allocations, *oldest = NULL, **oldest_link = NULL;
        for (; *link; link = &(*link)->next)
            if ((*link)->freed) oldest = *link, oldest_link = link;
        if (!oldest) return;
        *oldest_link = oldest->next;
        EMU_UNPOISON(oldest->map, oldest->data_len);
        munmap(oldest->map, oldest->map_len);
        if (oldest->shadow) munmap(oldest->shadow, oldest->shadow_len);
        free(oldest);
        freed_kept--;
    }
}

cudaError_t emu_allocation_to_free(const void *p, int *device) {
    emu_lock();
    cudaError_t err = emu_ready();
    if (err) {
        emu_unlock();
        return emu_set_error(err);
    }
    allocation *a = find_allocation(p, false);
    if (!a || a->ptr != (const char *)p || a->freed) {
        bool twice = a && a->freed;
        emu_unlock();
        emu_warn("cudaFree(%p): %s", p, twice ? "this memory was already freed" : "not a pointer cudaMalloc returned");
        return emu_set_error(cudaErrorInvalidValue);
    }
    *device = a->device;
    emu_unlock();
    return cudaSuccess;
}

void emu_allocation_release(const void *p) {
    emu_lock();
    allocation *a = find_allocation(p, false);
    if (a && !a->freed) {
        a->freed = true;
        sorted_stale = true;
        protect(a, PROT_NONE);
        allocated_bytes[a->device] -= a->size;
        freed_kept++;
        trim_freed();
    }
    emu_unlock();
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return emu_set_error(cudaErrorInvalidValue);
    cudaError_t err = emu_check_device(emu_current_device());
    if (err) return emu_set_error(err);
    *total = emu_device_memory_bytes();
    *free_bytes = *total - allocated_bytes[emu_current_device()];
    return cudaSuccess;
}

// After a kernel: did it write into the slack around an allocation?
void emu_check_redzones(const char *kernel) {
#ifndef __SANITIZE_ADDRESS__ // ASan watches the slack itself, and would object to reading it
    for (allocation *a = allocations; a; a = a->next) {
        if (a->freed) continue;
        const char *slack[2] = {a->map, a->ptr + a->size};
        size_t bytes[2] = {(size_t)(a->ptr - a->map), a->data_len - (size_t)(a->ptr - a->map) - a->size};
        for (int side = 0; side < 2; side++)
            for (size_t i = 0; i < bytes[side]; i++)
                if ((unsigned char)slack[side][i] != EMU_CANARY_BYTE) {
                    long offset = side ? (long)i : -(long)(bytes[0] - i);
                    emu_fatal("kernel %s wrote outside a %zu-byte device allocation at %p: byte %ld %s it was "
                              "changed (out of bounds; build with make CUDA=emu ASAN=1 to see the line)",
                              kernel, a->size, (void *)a->ptr, offset < 0 ? -offset : offset + 1,
                              side ? "past its end" : "before its start");
                }
    }
#else
    (void)kernel;
#endif
}

// ---------------------------------------------------------------- pinned host memory
// Page-locked host memory is ordinary memory here, but the emulator must
// know it: copies into it from the device are truly asynchronous (the host
// may read stale bytes before a synchronize), as on a GPU.
typedef struct pinned {
    char *ptr;
    size_t size;
    bool owned; // cudaMallocHost (freed by cudaFreeHost) or registered
    struct pinned *next;
} pinned;

static pinned *pinned_list;

static pinned *find_pinned(const void *p) {
    const char *c = (const char *)p;
    for (pinned *q = pinned_list; q; q = q->next)
        if (c >= q->ptr && c < q->ptr + q->size) return q;
    return NULL;
}

static cudaError_t add_pinned(void *p, size_t size, bool owned) {
    pinned *q = calloc(1, sizeof *q);
    if (!q) return cudaErrorMemoryAllocation;
    *q = (pinned){p, size, owned, pinned_list};
    pinned_list = q;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **out, size_t size, unsigned int flags) {
    (void)flags;
    if (!out) return emu_set_error(cudaErrorInvalidValue);
    cudaError_t err = emu_ready();
    if (err) return emu_set_error(err);
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 1) != 0) return emu_set_error(cudaErrorMemoryAllocation);
    emu_lock();
    err = add_pinned(p, size ? size : 1, true);
    emu_unlock();
    if (err) {
        free(p);
        return emu_set_error(err);
    }
    *out = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **out, size_t size) { return cudaHostAlloc(out, size, 0); }


cudaError_t emu_pinned_remove(void *p, bool owned) {
    emu_lock();
    for (pinned **link = &pinned_list; *link; link = &(*link)->next) {
        pinned *q = *link;
        if (q->ptr == p && q->owned == owned) {
            *link = q->next;
            emu_unlock();
            if (owned) free(q->ptr);
            free(q);
            return cudaSuccess;
        }
    }
    emu_unlock();
    return emu_set_error(cudaErrorInvalidValue);
}


cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
    (void)flags;
    if (!p || !size) return emu_set_error(cudaErrorInvalidValue);
    emu_lock();
    cudaError_t err = find_pinned(p) ? cudaErrorHostMemoryAlreadyRegistered : add_pinned(p, size, false);
    emu_unlock();
    return err ? emu_set_error(err) : cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) { return emu_pinned_remove(p, false); }

// ---------------------------------------------------------------- what a pointer is

emu_memory_kind emu_memory_kind_of(const void *p, size_t bytes, const char *what) {
    emu_lock();
    allocation *a = find_allocation(p, true);
    if (a && a->freed) {
        emu_unlock();
        emu_fatal("%s: %p points into device memory that was freed with cudaFree", what, p);
    }
    if (a && ((const char *)p < a->ptr || (const char *)p >= a->ptr + a->size)) {
        emu_unlock();
        emu_fatal("%s: %p is outside its device allocation (%zu bytes at %p)", what, p, a->size, (void *)a->ptr);
    }
    if (a) {
        size_t offset = (size_t)((const char *)p - a->ptr);
        if (bytes > a->size - offset) {
            emu_unlock();
            emu_fatal("%s: %zu bytes from %p run %zu bytes past the end of its device allocation "
                      "(%zu bytes at %p, %zu of them after this pointer)",
                      what, bytes, p, bytes - (a->size - offset), a->size, (void *)a->ptr, a->size - offset);
        }
        emu_unlock();
        return EMU_DEVICE;
    }
    emu_memory_kind kind = find_pinned(p) ? EMU_HOST_PINNED : EMU_HOST;
    emu_unlock();
    return kind;
}

int emu_device_of(const void *p) {
    emu_lock();
    allocation *a = find_allocation(p, false);
    int d = a && !a->freed ? a->device : -1;
    emu_unlock();
    return d;
}

// ---------------------------------------------------------------- for the race checker

static int by_address(const void *x, const void *y) {
    const char *a = (*(allocation *const *)x)->ptr, *b = (*(allocation *const *)y)->ptr;
    return a < b ? -1 : a > b;
}

static void sort_allocations(void) {
    sorted_count = 0;
    for (allocation *a = allocations; a; a = a->next) {
        if (a->freed) continue;
        if (sorted_count == sorted_cap) {
            sorted_cap = sorted_cap ? 2 * sorted_cap : 64;
            sorted = realloc(sorted, sizeof *sorted * (size_t)sorted_cap);
            if (!sorted) emu_fatal("out of host memory for the allocation index");
        }
        sorted[sorted_count++] = a;
    }
    qsort(sorted, (size_t)sorted_count, sizeof *sorted, by_address);
    sorted_stale = false;
}

// Called for many memory accesses of kernels: a binary search in the live
// allocations, sorted again only after a cudaMalloc or cudaFree. The
// shadow (EMU_RACE_SHADOW_BYTES per 4 bytes of data, zero at first) is
// mapped on first use; its untouched pages cost nothing.
bool emu_device_span_of(const void *p, emu_device_span *out) {
    if (sorted_stale) sort_allocations();
    const char *c = (const char *)p;
    int lo = 0, hi = sorted_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        allocation *a = sorted[mid];
        if (c < a->ptr) hi = mid - 1;
        else if (c >= a->ptr + a->size) lo = mid + 1;
        else {
            if (!a->shadow) {
                a->shadow_len = (a->size / 4 + 1) * EMU_RACE_SHADOW_BYTES;
                a->shadow = mmap(NULL, a->shadow_len, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (a->shadow == MAP_FAILED) emu_fatal("cannot map %zu bytes of race-checking shadow", a->shadow_len);
            }
            *out = (emu_device_span){a->ptr, a->size, a->shadow};
            return true;
        }
    }
    return false;
}

bool emu_is_host_memory(const void *p) {
    emu_lock();
    bool host = !find_allocation(p, true) && !find_pinned(p);
    emu_unlock();
    return host;
}

// ================================================================ the fault handler
// Turns a fault into a sentence: which memory, why it cannot be touched
// there, and how to find the line (addr2line, or ASan with make ASAN=1).

static struct sigaction previous_segv, previous_bus;

static void say(const char *text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, text, n);
        if (w <= 0) return;
        text += w, n -= (size_t)w;
    }
}

static void print_where(void) {
    void *frames[12];
    int n = backtrace(frames, 12);
    say("emulated GPU: where (newest first; `addr2line -f -C -e PROGRAM OFFSET` gives the line):\n");
    for (int i = 2; i < n; i++) {
        Dl_info info;
        char line[512];
        if (dladdr(frames[i], &info) && info.dli_fname) {
            snprintf(line, sizeof line, "    %s +0x%lx%s%s\n", info.dli_fname,
                     (unsigned long)((char *)frames[i] - (char *)info.dli_fbase), info.dli_sname ? "  " : "",
                     info.dli_sname ? info.dli_sname : "");
        } else {
            snprintf(line, sizeof line, "    %p\n", frames[i]);
        }
        say(line);
    }
}

static void describe_fault(const char *addr) {
    char text[1024];
    allocation *a = find_allocation(addr, true);
    const char *kernel = emu_current_kernel();
    char who[256];
    if (kernel) emu_kernel_thread_name(who, sizeof who);
    if (a && a->freed) {
        snprintf(text, sizeof text,
                 "emulated GPU: error: %s used device memory at %p after cudaFree released it (a %zu-byte allocation)\n",
                 kernel ? who : "host code", (void *)addr, a->size);
    } else if (a && addr >= a->ptr && addr < a->ptr + a->size) {
        snprintf(text, sizeof text,
                 "emulated GPU: error: host code touched device memory at %p (byte %zu of a %zu-byte cudaMalloc "
                 "allocation). A GPU's memory is not the host's: copy it with cudaMemcpy (and synchronize) before "
                 "reading it on the host\n",
                 (void *)addr, (size_t)(addr - a->ptr), a->size);
    } else if (a) {
        long past = addr >= a->ptr ? (long)(addr - (a->ptr + a->size)) : -(long)(a->ptr - addr);
        snprintf(text, sizeof text,
                 "emulated GPU: error: %s accessed %p, %ld bytes %s a %zu-byte device allocation at %p "
                 "(out of bounds)\n",
                 kernel ? who : "host code", (void *)addr, past >= 0 ? past + 0 : -past,
                 past >= 0 ? "past the end of" : "before the start of", a->size, (void *)a->ptr);
    } else if (kernel && emu_fiber_stack_guard(addr)) {
        snprintf(text, sizeof text,
                 "emulated GPU: error: %s overflowed its stack (large local arrays or deep recursion in a "
                 "kernel; EMU_STACK_KB sets the emulated thread's stack size)\n",
                 who);
    } else {
        return;
    }
    say(text);
    print_where();
    _exit(1);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    describe_fault((const char *)info->si_addr);
    // Not ours: hand it to whoever handled it before (ASan, or the default).
    struct sigaction *prev = sig == SIGSEGV ? &previous_segv : &previous_bus;
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction) {
            prev->sa_sigaction(sig, info, context);
            return;
        }
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN && prev->sa_handler) {
        prev->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

// Faults in a kernel thread can be stack overflows, so the handler needs a
// stack of its own on every host thread that runs kernels.
void emu_install_fault_handler(void) {
    // Kept for the thread's lifetime (the kernel keeps using it), and kept
    // reachable here so that leak checkers do not call it lost.
    static __thread void *altstack = NULL;
    if (!altstack) {
        stack_t ss;
        ss.ss_size = 64 * 1024;
        ss.ss_sp = malloc(ss.ss_size);
        ss.ss_flags = 0;
        if (ss.ss_sp && sigaltstack(&ss, NULL) == 0) altstack = ss.ss_sp;
        else free(ss.ss_sp);
    }
    static bool installed = false;
    if (installed) return;
    installed = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
    sigaction(SIGBUS, &sa, &previous_bus);
}

__attribute__((constructor)) static void emu_memory_init(void) { emu_install_fault_handler(); }