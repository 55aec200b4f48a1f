// nccl_peers.c - waiting for the other ranks, and noticing when one is gone.
//
// Real NCCL would wait forever for a rank that never comes; its users run
// a watchdog (ncclCommGetAsyncError, a deadline, ncclCommAbort) for that.
// The emulator's waits end: a rank that fails, aborts or leaves says so in
// its record of the segment, and a waiting rank also checks (every 50 ms)
// that its peer's process still exists. Either way the wait ends in an
// error that names the rank; any other wait ends after EMU_TIMEOUT seconds.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "emu_internal.h"

// ================================================================ is that process still there?

// A zombie (exited, not yet reaped by its parent) still answers kill(pid, 0).
static bool is_zombie(pid_t pid) {
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *end_of_name = strrchr(text, ')');
    return end_of_name && end_of_name[1] == ' ' && (end_of_name[2] == 'Z' || end_of_name[2] == 'X');
}

bool emu_nccl_process_is_gone(pid_t pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) == 0) return is_zombie(pid);
    return errno == ESRCH;
}

void emu_nccl_pause(long *delay_ns) {
    struct timespec ts = {0, *delay_ns};
    nanosleep(&ts, NULL);
    if (*delay_ns < 500000) *delay_ns = *delay_ns * 3 / 2;   // 50 us, growing to 0.5 ms
}

// ================================================================ waiting for peers

void emu_nccl_progressed(emu_nccl_part *p) {
    p->progressed = true;
    p->loss_seen = false;
    p->stalled_since = emu_now();
}

bool emu_nccl_stalled_too_long(const emu_nccl_part *p) { return emu_now() - p->stalled_since > emu_timeout_s(); }

// Whether it is time to ask the kernel whether peers still live.
bool emu_nccl_time_to_check_pids(emu_nccl_part *p) {
    double now = emu_now();
    if (now - p->last_pid_check < EMU_NCCL_PID_CHECK_INTERVAL_S) return false;
    p->last_pid_check = now;
    return true;
}

// If rank r will never get to where `p` waits for it - it aborted, failed,
// destroyed its communicator or exited - fails the communicator and says
// so.
//
// Careful: the caller first saw that r had not arrived, and only then
// looks at r's state. In between, r may have arrived, finished and left.
// So the first time r looks lost we only take note and wait; the caller
// checks again whether r has arrived, and only if r is still missing and
// still lost at the next look has it really gone.
bool emu_nccl_peer_is_lost(struct ncclComm *comm, emu_nccl_part *p, int r, bool check_pid) {
    emu_nccl_rank *peer = emu_nccl_rank_record(comm, r);
    int state = atomic_load_explicit(&peer->state, memory_order_acquire);
    pid_t pid = atomic_load_explicit(&peer->pid, memory_order_relaxed);
    bool exited = state == RANK_JOINED && check_pid && emu_nccl_process_is_gone(pid);
    if (state == RANK_JOINED && !exited) return false;
    if (!p->loss_seen) {
        p->loss_seen = true;
        return false;
    }
    char what[300];
    emu_nccl_describe_part(what, sizeof what, comm, p);
    switch (state) {
    case RANK_ABORTED:
        emu_nccl_comm_fail(comm, ncclRemoteError, "rank %d aborted the communicator, so %s cannot complete",
                           r, what);
        return true;
    case RANK_FAILED:
        emu_nccl_comm_fail(comm, ncclRemoteError, "rank %d failed (%s), so %s cannot complete", r,
                           peer->error, what);
        return true;
    case RANK_LEFT:
        emu_nccl_comm_fail(comm, ncclInvalidUsage,
                           "rank %d destroyed its communicator while this rank still needs it for %s "
                           "(did every rank make the same calls?)", r, what);
        return true;
    default:
        emu_nccl_comm_fail(comm, ncclRemoteError, "rank %d (pid %d) exited, so %s cannot complete", r, (int)pid,
                           what);
        return true;
    }
}

// A part that waits for an earlier operation of this same rank (the
// previous collective, the previous message on its channel). That one is
// normally earlier on the same stream; if it is on another stream that
// nobody waits for, say so rather than hang.
emu_nccl_status emu_nccl_wait_for_turn(struct ncclComm *comm, emu_nccl_part *p) {
    if (!emu_nccl_stalled_too_long(p)) return PART_PENDING;
    char what[300];
    emu_nccl_describe_part(what, sizeof what, comm, p);
    emu_nccl_comm_fail(comm, ncclInvalidUsage,
                       "%s waited %g s for this rank's previous operation on the communicator, which "
                       "has not run (is it queued on another stream that nobody waits for?)",
                       what, emu_timeout_s());
    return PART_FAILED;
}
