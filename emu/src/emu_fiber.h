// emu_fiber.h - user-level threads for the kernel's CUDA threads (fiber.c).
#ifndef EMU_FIBER_H
#define EMU_FIBER_H

#include <stdbool.h>

#define EMU_FIBER_MAX 1024 // one per thread of the largest block

typedef struct emu_fiber emu_fiber;

emu_fiber *emu_fiber_host(void);             // this host thread's own context
emu_fiber *emu_fiber_for_thread(int index);  // the stack thread `index` of a block runs on
// Make f start entry(arg) at its next switch_to (entry must never return).
void emu_fiber_prepare(emu_fiber *f, void (*entry)(void *), void *arg);
// Save the current context in `from`, continue `to`. from_finished: `from`
// will never run again (its thread has ended).
void emu_fiber_switch(emu_fiber *from, emu_fiber *to, bool from_finished);
// After a block that used stacks 0..used-1: stop with a message if one overflowed.
void emu_fiber_check_stacks(int used, const char *kernel);

#endif
