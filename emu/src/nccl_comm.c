// nccl_comm.c - the emulated NCCL: communicators between processes, in shared memory.
//
// What NCCL does. Each rank of a job is a process (or thread) driving one
// GPU. NCCL moves data between the GPUs' memories: collectives (all-reduce,
// broadcast, ...) that every rank calls, and point-to-point sends and
// receives. Real NCCL, at ncclCommInitRank, connects the ranks through a TCP
// "bootstrap" (the unique id holds the root's address), discovers how the
// GPUs are wired (NVLink, PCIe, InfiniBand), builds rings and trees over
// those links, and then runs every operation as a CUDA kernel that pipelines
// the data around the ring in chunks, on many channels at once. It trusts
// the program: if two ranks call different collectives, NCCL hangs or
// returns wrong numbers, and nothing says why.
//
// What the emulator does. The ranks are processes on one machine and the
// emulated GPU's memory is ordinary process memory, so the ranks meet in a
// POSIX shared-memory segment (shm_open) that each of them maps; the unique
// id carries its name. The segment holds:
//
//   header    who set it up, how many ranks, errors during the join
//   ranks[]   per rank: pid, device, state, barrier counter, and the
//             descriptors of its collectives (below)
//   channels  per ordered pair (sender, receiver): a 64 KiB ring buffer
//             with byte counters, for ncclSend/ncclRecv
//   slots[]   per rank: 256 KiB through which collectives move data
//
// Why chunks: /dev/shm is small (64 MiB in a Docker container), so the
// segment stays a few MiB whatever the message size. A collective moves its
// data in rounds ("chunks") of at most one slot: every rank copies its part
// of the chunk into its own slot, waits at a barrier until everybody has,
// computes its own result from all the slots in rank order, and waits at a
// second barrier so that no slot is overwritten while someone still reads
// it. Real NCCL also pipelines chunks, but around a ring (2(N-1) steps of
// 1/N of the data each); "everybody reads every slot" copies more, is much
// easier to follow, and - because every rank adds in rank order - gives
// bit-identical results on every rank.
//
// Why descriptors: before moving any data each rank publishes what it was
// asked to do ("collective #7: ncclAllReduce, 1024 float32, sum") and
// compares it with the others'. A mismatch, which real NCCL turns into a
// hang or garbage, becomes an error that names each rank's call; a rank that
// never arrives becomes a timeout that names it.
//
// Why a state machine: the emulated GPU runs queued work as late as it can
// (when the program waits for the stream), and one process must never sit
// inside the stream runner waiting for another. So each operation is
// resumable: it remembers its phase and chunk, makes what progress it can,
// and returns "pending" when it must wait for a peer; the runner calls it
// again later.
//
// Sends and receives: each (sender, receiver) pair has a ring. The sender
// describes message #k (count, type), writes bytes while there is room,
// and is done when the receiver has taken them all - NCCL, too, buffers
// nothing beyond its channel, which is why an exchange where both ranks
// send first needs ncclGroupStart/End: the group's parts progress together.
//
// Faults: a rank that fails, aborts or leaves says so in its record, and a
// waiting rank also checks (every 50 ms) that its peer's process still
// exists. Either way the wait ends in an error that names the rank, and any
// other wait ends after EMU_TIMEOUT seconds with a message saying how far
// each missing rank got. Real NCCL would wait forever; its users run a
// watchdog (ncclCommGetAsyncError, a deadline, ncclCommAbort) for that.
//
// The files: this one makes, joins and ends communicators; nccl_queue.c
// checks and queues the work calls; nccl_collective.c and nccl_p2p.c are
// the state machines; nccl_peers.c waits for the other ranks;
// nccl_reduce.c reduces; nccl_error.c words the errors; nccl_split.c splits
// a communicator with the public calls. The types they share are in
// emu_internal.h.
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"

enum {
    RINGS_BYTES = 16 << 20,   // all rings together: send/recv in flight, per ordered pair of ranks
    RING_MAX_BYTES = 1 << 20, // one pair's ring, at most (2-4 ranks; 256 KiB with 8)
};

#define ID_MAGIC "course-emu-nccl"     // first bytes of every ncclUniqueId we make
#define SEGMENT_MAGIC "emu-nccl-shm-1" // first bytes of the shared header

// ================================================================ the unique id

// What the 128 bytes of an ncclUniqueId hold.
typedef struct {
    char magic[16];
    char name[96];   // of the shared-memory segment, "/course-emu-nccl-..."
} id_contents;

_Static_assert(sizeof(id_contents) <= NCCL_UNIQUE_ID_BYTES, "the id must fit an ncclUniqueId");

// A name nobody else uses: our pid, a counter, and random bits (in case a
// pid is reused while an old segment still exists).
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static _Atomic unsigned counter;
    if (!uniqueId) return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    uint64_t random_bits = 0;
    if (getrandom(&random_bits, sizeof random_bits, GRND_NONBLOCK) != (ssize_t)sizeof random_bits)
        random_bits = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    id_contents id;
    memset(&id, 0, sizeof id);
    snprintf(id.magic, sizeof id.magic, "%s", ID_MAGIC);
    snprintf(id.name, sizeof id.name, "/course-emu-nccl-%d-%u-%016llx", (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long long)random_bits);
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &id, sizeof id);
    return ncclSuccess;
}

// ================================================================ the shared segment
//
// header, ranks[], channels[], rings, slots[] (their types are in
// emu_internal.h). Where each part starts, for a given number of ranks:
typedef struct {
    size_t ranks, channels, rings, slots, total;
    size_t ring_bytes; // each pair's ring
} shm_layout;

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static shm_layout layout_for(int nranks) {
    size_t n = (size_t)nranks, page = 4096;
    shm_layout l;
    l.ranks = round_up(sizeof(emu_nccl_header), page);
    l.channels = round_up(l.ranks + n * sizeof(emu_nccl_rank), page);
    l.rings = round_up(l.channels + n * n * sizeof(emu_nccl_channel), page);
    // Big rings move big messages in few rounds; their sum stays within a
    // budget that a 64 MiB /dev/shm (a Docker container's) can hold.
    l.ring_bytes = RING_MAX_BYTES;
    while (l.ring_bytes > 4096 && n * n * l.ring_bytes > RINGS_BYTES) l.ring_bytes /= 2;
    l.slots = l.rings + n * n * l.ring_bytes;
    l.total = l.slots + n * EMU_NCCL_SLOT_BYTES;
    return l;
}

// ================================================================ the API: joining

static void unlink_segment(struct ncclComm *comm) {
    if (comm->unlinked || !comm->shm_name[0]) return;
    shm_unlink(comm->shm_name);   // ENOENT is fine: another rank was first
    comm->unlinked = true;
}

// Records why the join failed where every rank looks while it waits, so
// they fail too instead of waiting for their timeout.
__attribute__((format(printf, 3, 4)))
static ncclResult_t join_fail(struct ncclComm *comm, ncclResult_t code, const char *fmt, ...) {
    char text[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    emu_nccl_header *h = comm->header;
    int32_t ok = INIT_OK;
    if (h && atomic_compare_exchange_strong(&h->init_state, &ok, INIT_WRITING_ERROR)) {
        snprintf(h->init_error, sizeof h->init_error, "%s", text);
        h->init_error_code = code;
        atomic_store_explicit(&h->init_state, INIT_FAILED, memory_order_release);
    }
    unlink_segment(comm);
    emu_nccl_comm_fail(comm, code, "%s", text);
    return code;
}

static ncclResult_t join_timed_out(struct ncclComm *comm) {
    char missing[256] = "";
    int count = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (atomic_load_explicit(&emu_nccl_rank_record(comm, r)->state, memory_order_acquire) != RANK_ABSENT)
            continue;
        emu_nccl_appendf(missing, sizeof missing, "%s%d", count ? ", " : "", r);
        count++;
    }
    return join_fail(comm, ncclRemoteError,
                     "ncclCommInitRank: rank%s %s of %d did not join within %g s (does every rank "
                     "call ncclCommInitRank with the same id and nranks? EMU_TIMEOUT sets the limit)",
                     count > 1 ? "s" : "", missing, comm->nranks, emu_timeout_s());
}

static bool everybody_joined(struct ncclComm *comm) {
    return comm->join_stage == JOIN_WAIT_ALL &&
           atomic_load_explicit(&comm->header->joined, memory_order_acquire) == comm->nranks;
}

// While waiting for the others: has the join failed elsewhere, has a rank
// that joined exited, has the time run out?
static ncclResult_t join_waits(struct ncclComm *comm) {
    emu_nccl_header *h = comm->header;
    if (atomic_load_explicit(&h->init_state, memory_order_acquire) == INIT_FAILED) {
        unlink_segment(comm);
        emu_nccl_comm_fail(comm, (ncclResult_t)h->init_error_code, "%s", h->init_error);
        return comm->error;
    }
    double now = emu_now();
    if (comm->join_stage == JOIN_WAIT_ALL && now - comm->last_pid_check >= EMU_NCCL_PID_CHECK_INTERVAL_S) {
        comm->last_pid_check = now;
        for (int r = 0; r < comm->nranks; r++) {
            pid_t pid = atomic_load_explicit(&emu_nccl_rank_record(comm, r)->pid, memory_order_relaxed);
            if (r == comm->rank || !emu_nccl_process_is_gone(pid)) continue;
            // A rank may have seen everybody join, finished, and exited since
            // we last counted: count again before blaming it.
            if (everybody_joined(comm)) return ncclInProgress;
            return join_fail(comm, ncclRemoteError, "ncclCommInitRank: rank %d (pid %d) exited "
                             "before every rank had joined", r, (int)pid);
        }
    }
    if (now - comm->join_started > emu_timeout_s() && !everybody_joined(comm)) {
        if (comm->join_stage == JOIN_WAIT_ALL) return join_timed_out(comm);
        return join_fail(comm, ncclRemoteError, "ncclCommInitRank: the shared segment was not set "
                         "up within %g s", emu_timeout_s());
    }
    return ncclInProgress;
}

static ncclResult_t check_duplicate_devices(struct ncclComm *comm) {
    for (int r = 1; r < comm->nranks; r++)
        for (int s = 0; s < r; s++)
            if (emu_nccl_rank_record(comm, r)->device == emu_nccl_rank_record(comm, s)->device)
                return join_fail(comm, ncclInvalidUsage,
                                 "Duplicate GPU detected : rank %d and rank %d both on emulated "
                                 "device %d (NCCL needs one GPU per rank: call cudaSetDevice with "
                                 "each rank's own GPU before ncclCommInitRank)",
                                 r, s, emu_nccl_rank_record(comm, r)->device);
    return ncclSuccess;
}

// One step of joining: set up the header (one rank), register this rank,
// wait for all. Returns ncclInProgress until every rank is in.
static ncclResult_t join_step(struct ncclComm *comm) {
    emu_nccl_header *h = comm->header;
    for (;;) {
        switch (comm->join_stage) {
        case JOIN_SETUP: {
            uint32_t none = SETUP_NONE;
            if (atomic_compare_exchange_strong(&h->setup, &none, SETUP_BUSY)) {
                snprintf(h->magic, sizeof h->magic, "%s", SEGMENT_MAGIC);
                h->nranks = comm->nranks;
                atomic_store_explicit(&h->setup, SETUP_DONE, memory_order_release);
            } else if (atomic_load_explicit(&h->setup, memory_order_acquire) != SETUP_DONE) {
                return join_waits(comm);
            }
            if (strcmp(h->magic, SEGMENT_MAGIC) != 0)
                return join_fail(comm, ncclInternalError, "ncclCommInitRank: shared memory segment "
                                 "%s holds something else", comm->shm_name);
            comm->join_stage = JOIN_REGISTER;
            break;
        }
        case JOIN_REGISTER: {
            if (h->nranks != comm->nranks)
                return join_fail(comm, ncclInvalidUsage,
                                 "ncclCommInitRank: rank %d was given nranks %d, but another rank "
                                 "created the communicator with nranks %d (every rank must pass "
                                 "the same nranks)", comm->rank, comm->nranks, h->nranks);
            emu_nccl_rank *me = emu_nccl_rank_record(comm, comm->rank);
            int32_t nobody = 0;
            if (!atomic_compare_exchange_strong(&me->pid, &nobody, (int32_t)getpid()))
                return join_fail(comm, ncclInvalidUsage,
                                 "ncclCommInitRank: rank %d joined twice, by pid %d and by pid %d "
                                 "(each process must pass its own rank, 0 to nranks-1)",
                                 comm->rank, (int)nobody, (int)getpid());
            comm->registered = true;
            me->device = comm->physical_device;
            atomic_store_explicit(&me->state, RANK_JOINED, memory_order_release);
            atomic_fetch_add(&h->joined, 1);
            comm->join_stage = JOIN_WAIT_ALL;
            break;
        }
        case JOIN_WAIT_ALL: {
            if (!everybody_joined(comm)) return join_waits(comm);
            // Everybody has the segment open: rank 0 removes its name, so
            // that nothing is left in /dev/shm however the job ends.
            if (comm->rank == 0) unlink_segment(comm);
            comm->unlinked = true;
            ncclResult_t res = check_duplicate_devices(comm);
            if (res != ncclSuccess) return res;
            comm->join_stage = JOIN_DONE;
            break;
        }
        default:
            return ncclSuccess;
        }
    }
}

static void free_comm(struct ncclComm *comm) {
    for (emu_nccl_op *o = comm->ops; o; o = o->next) o->comm = NULL;   // the stream may still free them
    if (comm->base) munmap(comm->base, comm->bytes);
    if (comm->fd >= 0) close(comm->fd);
    free(comm->sends_issued);
    free(comm->sends_done);
    free(comm->recvs_issued);
    free(comm->recvs_done);
    free(comm->scratch);
    comm->magic = 0;
    free(comm);
}

// Creates (or opens) the segment, makes sure its memory really exists, maps it.
static ncclResult_t map_segment(struct ncclComm *comm) {
    shm_layout layout = layout_for(comm->nranks);
    comm->fd = shm_open(comm->shm_name, O_RDWR | O_CREAT, 0600);
    if (comm->fd < 0)
        return emu_nccl_call_error(comm, ncclSystemError, "ncclCommInitRank: shm_open(%s) failed: %s",
                                   comm->shm_name, strerror(errno));
    struct stat st;
    if (fstat(comm->fd, &st) == 0 && (size_t)st.st_size < layout.total &&
        ftruncate(comm->fd, (off_t)layout.total) != 0)   // only ever grows: others may have mapped it
        return emu_nccl_call_error(comm, ncclSystemError, "ncclCommInitRank: ftruncate of %s failed: %s",
                                   comm->shm_name, strerror(errno));
    // Reserve the pages now, so that a full /dev/shm fails here, with a
    // message, and not later with SIGBUS in the middle of a collective.
    int err = posix_fallocate(comm->fd, 0, (off_t)layout.total);
    if (err != 0) {
        unlink_segment(comm);
        return emu_nccl_call_error(comm, ncclSystemError,
                                   "ncclCommInitRank: cannot reserve %.1f MiB of shared memory for %d ranks "
                                   "in /dev/shm (%s); is /dev/shm full or small? (Docker's default is 64 MiB: "
                                   "docker run --shm-size=1g)", (double)layout.total / (1 << 20), comm->nranks,
                                   strerror(err));
    }
    comm->base = mmap(NULL, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, comm->fd, 0);
    if (comm->base == MAP_FAILED) {
        comm->base = NULL;
        return emu_nccl_call_error(comm, ncclSystemError, "ncclCommInitRank: mmap of %s failed: %s",
                                   comm->shm_name, strerror(errno));
    }
    comm->bytes = layout.total;
    unsigned char *base = comm->base;
    comm->header = (emu_nccl_header *)base;
    comm->ranks = (emu_nccl_rank *)(base + layout.ranks);
    comm->channels = (emu_nccl_channel *)(base + layout.channels);
    comm->rings = base + layout.rings;
    comm->ring_bytes = layout.ring_bytes;
    comm->slots = base + layout.slots;
    return ncclSuccess;
}

static ncclResult_t read_config(const ncclConfig_t *config, bool *blocking) {
    const char *env = getenv("NCCL_COMM_BLOCKING");
    *blocking = !(env && strcmp(env, "0") == 0);
    if (!config) return ncclSuccess;
    if (config->magic != NCCL_CONFIG_MAGIC)
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: config was not "
                                   "initialised with NCCL_CONFIG_INITIALIZER");
    if (config->blocking == NCCL_CONFIG_UNDEF_INT) return ncclSuccess;
    if (config->blocking != 0 && config->blocking != 1)
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitRankConfig: config.blocking is "
                                   "%d; it must be 0 or 1", config->blocking);
    *blocking = config->blocking == 1;
    return ncclSuccess;
}

// ================================================================ groups: joins deferred to their end

static _Thread_local struct ncclComm **deferred;
static _Thread_local int deferred_count, deferred_cap;

static void defer_join(struct ncclComm *comm) {
    if (deferred_count == deferred_cap) {
        deferred_cap = deferred_cap ? 2 * deferred_cap : 8;
        deferred = emu_nccl_realloc(deferred, sizeof *deferred * (size_t)deferred_cap);
    }
    deferred[deferred_count++] = comm;
}

// Every communicator initialised in the group joins, together. (Lock held.)
static ncclResult_t finish_deferred_joins(void) {
    ncclResult_t res = ncclSuccess;
    long delay_ns = 50000;
    for (;;) {
        bool waiting = false;
        for (int i = 0; i < deferred_count; i++) {
            if (deferred[i]->join_stage == JOIN_DONE || deferred[i]->error != ncclSuccess) continue;
            ncclResult_t r = join_step(deferred[i]);
            if (r == ncclInProgress) waiting = true;
            else if (r != ncclSuccess && res == ncclSuccess) res = r;
        }
        if (!waiting) break;
        emu_unlock();
        emu_nccl_pause(&delay_ns);
        emu_lock();
    }
    deferred_count = 0;
    return res;
}

ncclResult_t ncclGroupStart(void) {
    emu_lock();
    emu_nccl_group_enter();
    emu_unlock();
    return ncclSuccess;
}

// At the outermost end: first the joins, then the group's calls (which
// may use those communicators).
ncclResult_t ncclGroupEnd(void) {
    emu_lock();
    ncclResult_t joined = emu_nccl_group_depth() == 1 && deferred_count ? finish_deferred_joins() : ncclSuccess;
    ncclResult_t res = emu_nccl_group_leave();
    emu_unlock();
    return joined != ncclSuccess ? joined : res;
}

static ncclResult_t init_comm(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                              const ncclConfig_t *config, int device) {
    if (!out) return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: rank %d and nranks %d: "
                                   "need nranks >= 1 and 0 <= rank < nranks", rank, nranks);
    id_contents contents;
    memcpy(&contents, id.internal, sizeof contents);
    if (memcmp(contents.magic, ID_MAGIC, sizeof ID_MAGIC) != 0 || contents.name[0] != '/' ||
        !memchr(contents.name, '\0', sizeof contents.name))
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitRank: the ncclUniqueId was not "
                                   "made by ncclGetUniqueId (was all of it, %d bytes, passed on?)",
                                   NCCL_UNIQUE_ID_BYTES);
    bool blocking;
    ncclResult_t res = read_config(config, &blocking);
    if (res != ncclSuccess) return res;

    struct ncclComm *comm = emu_nccl_calloc(1, sizeof *comm);
    comm->magic = EMU_NCCL_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->device = device;
    comm->physical_device = emu_physical_device(device);
    comm->blocking = blocking;
    comm->fd = -1;
    snprintf(comm->shm_name, sizeof comm->shm_name, "%s", contents.name);
    comm->sends_issued = emu_nccl_calloc((size_t)nranks, sizeof(uint64_t));
    comm->sends_done = emu_nccl_calloc((size_t)nranks, sizeof(uint64_t));
    comm->recvs_issued = emu_nccl_calloc((size_t)nranks, sizeof(uint64_t));
    comm->recvs_done = emu_nccl_calloc((size_t)nranks, sizeof(uint64_t));
    comm->scratch = emu_nccl_calloc(1, EMU_NCCL_SCRATCH_BYTES);
    comm->join_started = emu_now();
    if ((res = map_segment(comm)) != ncclSuccess) {
        free_comm(comm);
        return res;
    }
    res = join_step(comm);
    if (!blocking) {
        // Non-blocking: the rest of the join happens in ncclCommGetAsyncError.
        // Even a join that is already complete answers "in progress", so that
        // a program that forgets to poll is caught every time.
        *out = comm;
        if (res == ncclSuccess || res == ncclInProgress) {
            comm->call_in_progress = "ncclCommInitRankConfig";
            res = ncclInProgress;
        }
        return res;
    }
    if (res == ncclInProgress && emu_nccl_group_depth() > 0) {
        // In a group (one process initialising several GPUs' ranks): the
        // join completes at the outermost ncclGroupEnd, with the others.
        *out = comm;
        defer_join(comm);
        return ncclSuccess;
    }
    long delay_ns = 50000;
    while (res == ncclInProgress) {   // blocking: wait here, letting other threads in between
        emu_unlock();
        emu_nccl_pause(&delay_ns);
        emu_lock();
        res = join_step(comm);
    }
    if (res != ncclSuccess) {
        emu_nccl_set_last_error(comm->error_text);
        free_comm(comm);
        return res;
    }
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    emu_lock();
    ncclResult_t res = init_comm(comm, nranks, commId, rank, config, emu_current_device());
    emu_unlock();
    return res;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (ndev != 1)
        return emu_nccl_call_error(NULL, ncclInvalidUsage, "ncclCommInitAll with ndev %d: the emulated NCCL "
                                   "drives one emulated GPU per process (ndev 1); start one process per GPU "
                                   "and use ncclCommInitRank", ndev);
    int device = devlist ? devlist[0] : 0;
    if (device < 0 || device >= emu_device_count())
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommInitAll: device %d does not exist "
                                   "(%d emulated devices)", device, emu_device_count());
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) return res;
    emu_lock();
    res = init_comm(comm, 1, id, 0, NULL, device);
    emu_unlock();
    return res;
}

// ================================================================ the API: state of a communicator

// Distinct streams holding this comm's unfinished ops.
static int unfinished_streams(struct ncclComm *comm, cudaStream_t *streams, int max) {
    int n = 0;
    for (emu_nccl_op *o = comm->ops; o; o = o->next) {
        if (o->finished) continue;
        bool seen = false;
        for (int i = 0; i < n; i++) seen = seen || streams[i] == o->stream;
        if (!seen && n < max) streams[n++] = o->stream;
    }
    return n;
}

// Non-blocking finalize: give every stream that holds our work a step.
// The streams run their work when queried; we must not hold the lock then.
static ncclResult_t finalize_step(struct ncclComm *comm) {
    cudaStream_t streams[16];
    int n = unfinished_streams(comm, streams, 16);
    for (int i = 0; i < n; i++) {
        emu_unlock();
        cudaStreamQuery(streams[i]);
        emu_lock();
    }
    if (comm->error != ncclSuccess) return comm->error;
    return comm->ops_unfinished > 0 ? ncclInProgress : ncclSuccess;
}

static ncclResult_t finalize_blocking(struct ncclComm *comm) {
    cudaStream_t streams[16];
    while (comm->error == ncclSuccess && comm->ops_unfinished > 0) {
        if (unfinished_streams(comm, streams, 16) == 0) break;
        emu_unlock();
        cudaError_t err = cudaStreamSynchronize(streams[0]);
        emu_lock();
        if (err != cudaSuccess && comm->error == ncclSuccess)
            return emu_nccl_call_error(comm, ncclUnhandledCudaError, "ncclCommFinalize: the stream with "
                                       "this communicator's work failed: %s", cudaGetErrorString(err));
    }
    return comm->error;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError)
        return emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    emu_lock();
    ncclResult_t res = ncclSuccess;
    if (!comm || comm->magic != EMU_NCCL_COMM_MAGIC) {
        res = emu_nccl_call_error(NULL, ncclInvalidArgument,
                                  "ncclCommGetAsyncError: comm is not a live communicator");
    } else if (comm->join_stage != JOIN_DONE && comm->error == ncclSuccess) {
        *asyncError = join_step(comm);
        if (*asyncError != ncclInProgress) comm->call_in_progress = NULL;
    } else if (comm->finalizing && !comm->finalized && comm->error == ncclSuccess) {
        *asyncError = finalize_step(comm);
        if (*asyncError != ncclInProgress) {
            comm->finalized = comm->error == ncclSuccess;
            comm->call_in_progress = NULL;
        }
    } else {
        // The enqueueing call that answered ncclInProgress has finished;
        // report what the queued work has found so far.
        comm->call_in_progress = NULL;
        *asyncError = comm->error;
    }
    if (res == ncclSuccess && *asyncError != ncclSuccess && *asyncError != ncclInProgress)
        emu_nccl_set_last_error(comm->error_text);
    emu_unlock();
    return res;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm_for_work("ncclCommFinalize", comm);
    if (res == ncclSuccess) {
        comm->finalizing = true;
        if (comm->blocking) {
            res = finalize_blocking(comm);
            comm->finalized = res == ncclSuccess;
        } else {   // the work completes in ncclCommGetAsyncError
            comm->call_in_progress = "ncclCommFinalize";
            res = ncclInProgress;
        }
    }
    emu_unlock();
    return res;
}

static void leave_segment(struct ncclComm *comm, int state) {
    if (!comm->registered) {
        if (comm->header) join_fail(comm, ncclRemoteError, "rank %d gave up on the communicator "
                                    "before it had joined", comm->rank);
        return;
    }
    emu_nccl_rank *me = emu_nccl_rank_record(comm, comm->rank);
    int32_t joined = RANK_JOINED;   // a rank that failed keeps saying why
    atomic_compare_exchange_strong_explicit(&me->state, &joined, state, memory_order_release,
                                            memory_order_relaxed);
    if (comm->join_stage != JOIN_DONE) {
        if (state == RANK_ABORTED)
            join_fail(comm, ncclRemoteError, "rank %d aborted the communicator during "
                      "ncclCommInitRank", comm->rank);
        unlink_segment(comm);
    }
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm("ncclCommDestroy", comm);
    if (res == ncclSuccess) {
        // NCCL finalizes a communicator that was not finalized: queued work
        // is completed first.
        if (!comm->finalized && comm->error == ncclSuccess && comm->join_stage == JOIN_DONE)
            finalize_blocking(comm);
        emu_stream_discard_if(emu_nccl_op_belongs_to, comm);   // failed work the stream still holds
        leave_segment(comm, RANK_LEFT);
        free_comm(comm);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    emu_lock();
    ncclResult_t res = ncclSuccess;
    if (comm->magic != EMU_NCCL_COMM_MAGIC) {
        res = emu_nccl_call_error(NULL, ncclInvalidArgument, "ncclCommAbort: comm is not a live communicator");
    } else {
        emu_stream_discard_if(emu_nccl_op_belongs_to, comm);   // queued work will never run
        leave_segment(comm, RANK_ABORTED);
        free_comm(comm);
    }
    emu_unlock();
    return res;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm("ncclCommCount", comm);
    if (res == ncclSuccess && !count)
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "ncclCommCount: count is NULL");
    if (res == ncclSuccess) *count = comm->nranks;
    emu_unlock();
    return res;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm("ncclCommCuDevice", comm);
    if (res == ncclSuccess && !device)
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    if (res == ncclSuccess) *device = comm->device;
    emu_unlock();
    return res;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    emu_lock();
    ncclResult_t res = emu_nccl_check_comm("ncclCommUserRank", comm);
    if (res == ncclSuccess && !rank)
        res = emu_nccl_call_error(comm, ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    if (res == ncclSuccess) *rank = comm->rank;
    emu_unlock();
    return res;
}
