// pg_cpu_setup.h - how the ranks of the cpu backend (pg_cpu.h) connect:
// each publishes a listening address through the store and connects to
// every other rank over TCP; ranks of one host then also share a segment of
// shared memory with a ring per ordered pair. A sub-group (pg_split) is set
// up the same way, with sockets and rings of its own, under store keys of
// its own: its collectives never wait for another group's.
// cpu_create and cpu_destroy are what pg_cpu.h's table calls.
#ifndef COURSE_PG_CPU_SETUP_H
#define COURSE_PG_CPU_SETUP_H

#include "pg_backend.h"
#include "pg_cpu_algorithms.h"
#include "pg_cpu_progress.h"

// ---------------------------------------------------------------- setting up: TCP

typedef struct {
    char ip[64];        // where the rank listens
    int port;
    char host[200];     // which host (and /dev/shm) it runs on; see cpu_host_key
} cpu_address_t;

typedef struct {
    uint32_t magic;
    int32_t rank;
    uint64_t nonce;     // this group's random number: stray connections are refused
} cpu_hello_t;

// The address other ranks can reach this one at: the local end of our
// connection to the store, which every rank reaches. The rank that serves
// the store talks to it over loopback; it asks the route to the address the
// others use instead.
static inline void cpu_local_address(const store_t *st, char *ip, size_t size) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    snprintf(ip, size, "127.0.0.1");
    if (getsockname(st->fd, (struct sockaddr *)&a, &len) == 0)
        getnameinfo((struct sockaddr *)&a, len, ip, (socklen_t)size, NULL, 0, NI_NUMERICHOST);
    if (store_is_loopback(ip) && !store_is_loopback(st->host)) netif_route_source(st->host, ip, size);
}

// Ranks with the same key share a host and a /dev/shm: the boot id tells
// machines apart, the device number of /dev/shm tells containers apart.
static inline void cpu_host_key(char *key, size_t size) {
    char host[64] = "?", boot[40] = "?";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "?");
        boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    struct stat st;
    unsigned long dev = stat("/dev/shm", &st) == 0 ? (unsigned long)st.st_dev : 0;
    snprintf(key, size, "%s/%s/%lx", host, boot, dev);
}

// Listen on loopback for a job on loopback, else on every interface of the
// address's family (the published address is one of them).
static inline int cpu_listen(const char *ip, int backlog, int *port) {
    const char *bind_ip = store_is_loopback(ip) ? ip : strchr(ip, ':') ? "::" : "0.0.0.0";
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE};
    struct addrinfo *list;
    int rc = getaddrinfo(bind_ip, "0", &hints, &list);
    if (rc) die("process group: cannot listen on '%s': %s", bind_ip, gai_strerror(rc));
    int fd = socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    CHECK_SYS(fd);
    CHECK_SYS(bind(fd, list->ai_addr, list->ai_addrlen));
    CHECK_SYS(listen(fd, backlog));
    freeaddrinfo(list);
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    CHECK_SYS(getsockname(fd, (struct sockaddr *)&a, &len));
    *port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                          : ((struct sockaddr_in *)&a)->sin_port);
    return fd;
}

// Every rank publishes where it listens ("ip port host") and reads everyone's.
static inline void cpu_share_addresses(cpu_pg_t *pg, store_t *st, const char *group, int port,
                                       const char *ip, cpu_address_t *all) {
    enum { TEXT = 320 };
    char stem[96], mine[TEXT], host[200];
    cpu_host_key(host, sizeof host);
    snprintf(stem, sizeof stem, "%s/addr", group);
    snprintf(mine, sizeof mine, "%s %d %s", ip, port, host);
    char *text = xmalloc((size_t)pg->world * TEXT);
    store_all_gather(st, stem, pg->rank, pg->world, mine, text, TEXT, pg->timeout_s);
    for (int r = 0; r < pg->world; r++) {
        const char *value = text + (size_t)r * TEXT;
        if (sscanf(value, "%63s %d %199s", all[r].ip, &all[r].port, all[r].host) != 3)
            die("process group: rank %d published a malformed address '%s'", r, value);
    }
    free(text);
    const cpu_address_t *me = &all[pg->rank];
    for (int r = 0; r < pg->world; r++)
        if (store_is_loopback(all[r].ip) && strcmp(all[r].host, me->host))
            die("rank %d can only be reached at %s, a loopback address, but runs on another "
                "host: give the job an address every host can reach (MASTER_ADDR, or the "
                "tcp:// address)", r, all[r].ip);
}

static inline uint64_t cpu_share_nonce(cpu_pg_t *pg, store_t *st, const char *group) {
    char key[96];
    uint64_t nonce = store_random_u64();
    snprintf(key, sizeof key, "%s/nonce", group);
    if (store_broadcast(st, key, pg->rank, &nonce, sizeof nonce, sizeof nonce, pg->timeout_s) !=
        sizeof nonce)
        die("process group: the store holds a malformed group id");
    return nonce;
}

// Buffer sizes are left to the kernel: its autotuning grows each socket's
// buffers up to net.ipv4.tcp_rmem / tcp_wmem (megabytes), whereas setting
// SO_RCVBUF turns autotuning off and caps the size at net.core.rmem_max,
// which is often smaller. (Measured here: no gain from fixed 4 MiB buffers.)
static inline void cpu_tune_socket(int fd) {
    int one = 1;
    // Nagle's algorithm would hold small messages back for more: a tiny
    // all-reduce would take tens of milliseconds.
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Higher ranks connect to lower ones: each pair gets exactly one connection.
static inline void cpu_connect_lower(cpu_pg_t *pg, const cpu_address_t *all, uint64_t nonce,
                                     double deadline) {
    for (int r = 0; r < pg->rank; r++) {
        char why[200] = "";
        int fd;
        while ((fd = store_dial(all[r].ip, all[r].port, deadline, why, sizeof why)) < 0) {
            if (now_seconds() >= deadline)
                die("could not connect to rank %d at %s:%d within %g s: %s", r, all[r].ip,
                    all[r].port, pg->timeout_s, why);
            store_sleep(0.01);
        }
        cpu_tune_socket(fd);
        cpu_hello_t hello = {CPU_MAGIC, pg->rank, nonce};
        if (store_io(fd, &hello, sizeof hello, deadline, true) != 0)
            die("could not greet rank %d at %s:%d: the connection failed", r, all[r].ip,
                all[r].port);
        pg->peers[r].fd = fd;
    }
}

// The rank a new connection says it is, or -1 for a stray connection.
static inline int cpu_read_hello(int fd, uint64_t nonce, double deadline) {
    cpu_hello_t hello;
    double until = now_seconds() + 5 < deadline ? now_seconds() + 5 : deadline;
    if (store_io(fd, &hello, sizeof hello, until, false) != 0) return -1;
    if (hello.magic != CPU_MAGIC || hello.nonce != nonce) return -1;
    return hello.rank;
}

static inline void cpu_accept_timeout(const cpu_pg_t *pg) {
    char missing[256] = "";
    size_t used = 0;
    for (int r = pg->rank + 1; r < pg->world && used < sizeof missing - 16; r++)
        if (pg->peers[r].fd < 0)
            used += (size_t)snprintf(missing + used, sizeof missing - used, " %d", r);
    die("timed out after %g s setting up the process group: rank(s)%s never connected to "
        "rank %d (did they crash or get stuck before pg_create?)", pg->timeout_s, missing,
        pg->rank);
}

static inline void cpu_accept_higher(cpu_pg_t *pg, int listen_fd, uint64_t nonce, double deadline) {
    int missing = pg->world - 1 - pg->rank;
    while (missing > 0) {
        struct pollfd p = {listen_fd, POLLIN, 0};
        int rc = poll(&p, 1, store_ms_left(deadline));
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) die("poll() on the listening socket failed: %s", strerror(errno));
        if (rc == 0) cpu_accept_timeout(pg);
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;   // the connection went away already
        int who = cpu_read_hello(fd, nonce, deadline);
        if (who <= pg->rank || who >= pg->world) {
            close(fd);   // not one of ours
            continue;
        }
        if (pg->peers[who].fd >= 0)
            die("two processes claim to be rank %d: check RANK and WORLD_SIZE", who);
        cpu_tune_socket(fd);
        pg->peers[who].fd = fd;
        missing--;
    }
}

// Every rank publishes where it listens, then connects to every other rank.
static inline void cpu_connect_all(cpu_pg_t *pg, store_t *st, const char *group, cpu_address_t *all,
                                   uint64_t *nonce) {
    double deadline = now_seconds() + pg->timeout_s;
    char ip[64];
    int port;
    *nonce = cpu_share_nonce(pg, st, group);
    // COURSE_LOCAL_ADDR (ddprun --local_addr) names the address itself;
    // COURSE_SOCKET_IFNAME (or GLOO_/NCCL_SOCKET_IFNAME) picks the interface,
    // as NCCL_SOCKET_IFNAME does for NCCL; otherwise the one that reaches the store.
    const char *variable;
    const char *spec = netif_spec_from_env(&variable), *given = netif_given_from_env();
    if (given) snprintf(ip, sizeof ip, "%s", netif_given(given, "COURSE_LOCAL_ADDR").ip);
    else if (spec) snprintf(ip, sizeof ip, "%s", netif_choose(spec, variable, st->host).ip);
    else cpu_local_address(st, ip, sizeof ip);
    int listen_fd = cpu_listen(ip, pg->world, &port);
    cpu_share_addresses(pg, st, group, port, ip, all);
    cpu_connect_lower(pg, all, *nonce, deadline);
    cpu_accept_higher(pg, listen_fd, *nonce, deadline);
    close(listen_fd);
}

// ---------------------------------------------------------------- setting up: shared memory

typedef struct {
    size_t bells, rings, data, total;   // byte offsets in the segment, and its size
    size_t ring_bytes;
    int members;
} cpu_shm_layout_t;

static inline size_t cpu_page_round(size_t bytes) { return (bytes + 4095) & ~(size_t)4095; }

// Rings of at most max_ring bytes, halved until all of them fit the budget.
static inline cpu_shm_layout_t cpu_shm_layout(int members, size_t max_ring) {
    cpu_shm_layout_t l = {.members = members, .ring_bytes = max_ring};
    size_t pairs = (size_t)members * (size_t)(members - 1);
    while (l.ring_bytes > CPU_RING_MIN && l.ring_bytes * pairs > CPU_SHM_BUDGET) l.ring_bytes /= 2;
    l.bells = 4096;   // after the header
    l.rings = l.bells + cpu_page_round((size_t)members * sizeof(cpu_shm_bell_t));
    l.data = l.rings + cpu_page_round(pairs * sizeof(cpu_shm_ring_ctl_t));
    l.total = l.data + pairs * l.ring_bytes;
    return l;
}

// The ring that local rank a writes and local rank b reads.
static inline size_t cpu_ring_index(int a, int b, int members) {
    return (size_t)a * (size_t)(members - 1) + (size_t)(b < a ? b : b - 1);
}

// NULL (and why) when the segment cannot be made: the group then uses TCP.
// Map the segment with its page tables filled in now (MAP_POPULATE), so
// that no message pays a page fault. That did not close the "latency hole"
// at 2-4 KiB on this virtual machine: the first pass over a ring's memory
// stays slow with every page mapped, and even written once at setup (the
// host's own lazy memory, or cold caches; measured, not explained). What
// closed it is a small ring, which wraps within a benchmark's warm-up
// (CPU_RING_MAX in pg_cpu_stream.h).
static inline char *cpu_shm_map(int fd, size_t bytes) {
    return mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
}

// The name of a segment this process created and has not unlinked yet. A
// rank that dies while the others map the segment ends the job: the leader
// then dies too, by exit (die(), a timeout: atexit unlinks the name) or by
// the spawner's SIGTERM (a handler held for that window unlinks it and dies
// of the signal as it would have), so a failed start leaves nothing in
// /dev/shm. Only the leader's own SIGKILL in that window can.
static char cpu_shm_pending[64];
static inline void cpu_shm_unlink_pending(void) {
    if (cpu_shm_pending[0]) shm_unlink(cpu_shm_pending);
    cpu_shm_pending[0] = '\0';
}
static inline void cpu_shm_on_signal(int sig) {
    cpu_shm_unlink_pending();
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline char *cpu_shm_create(const char *name, const cpu_shm_layout_t *l, uint64_t nonce,
                                   char *why, size_t size) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, size, "shm_open: %s", strerror(errno));
        return NULL;
    }
    snprintf(cpu_shm_pending, sizeof cpu_shm_pending, "%s", name);
    // fallocate, not just ftruncate: on a full /dev/shm a lazily sized segment
    // would kill us later with SIGBUS; this fails now, cleanly.
    int err = ftruncate(fd, (off_t)l->total) < 0 ? errno : posix_fallocate(fd, 0, (off_t)l->total);
    char *base = err ? MAP_FAILED : cpu_shm_map(fd, l->total);
    if (!err && base == MAP_FAILED) err = errno;
    close(fd);
    if (err) {
        snprintf(why, size, "%zu MiB in /dev/shm: %s", l->total >> 20, strerror(err));
        cpu_shm_unlink_pending();
        return NULL;
    }
    cpu_shm_header_t h = {CPU_SHM_MAGIC, nonce, (uint64_t)l->members, l->ring_bytes};
    memcpy(base, &h, sizeof h);   // fresh pages are zero: counters start at 0
    return base;
}

static inline char *cpu_shm_attach(const char *name, const cpu_shm_layout_t *l, uint64_t nonce,
                                   char *why, size_t size) {
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, size, "shm_open: %s (another /dev/shm?)", strerror(errno));
        return NULL;
    }
    char *base = cpu_shm_map(fd, l->total);
    close(fd);
    cpu_shm_header_t h;
    if (base != MAP_FAILED) memcpy(&h, base, sizeof h);
    if (base == MAP_FAILED || h.magic != CPU_SHM_MAGIC || h.nonce != nonce) {
        snprintf(why, size, "the segment is not this group's");
        if (base != MAP_FAILED) munmap(base, l->total);
        return NULL;
    }
    return base;
}

// The lowest rank of a host creates the segment and tells the others its
// name; once all have mapped it (or failed), it unlinks the name, so nothing
// is left in /dev/shm however the job ends later. Shared memory is used only
// if every rank of the host could map it.
static inline char *cpu_shm_lead(cpu_pg_t *pg, const int *members, const cpu_shm_layout_t *l,
                                 uint64_t nonce, char *why, size_t size) {
    static bool at_exit;
    if (!at_exit && atexit(cpu_shm_unlink_pending) != 0) die("atexit: cannot register the /dev/shm cleanup");
    at_exit = true;
    struct sigaction on = {.sa_handler = cpu_shm_on_signal}, old_term, old_int;
    CHECK_SYS(sigaction(SIGTERM, &on, &old_term));
    CHECK_SYS(sigaction(SIGINT, &on, &old_int));
    char name[64];
    snprintf(name, sizeof name, "/course-pg-%016llx-%d", (unsigned long long)nonce, pg->rank);
    char *base = cpu_shm_create(name, l, nonce, why, size);
    char text[64] = "";
    if (base) snprintf(text, sizeof text, "%s", name);
    for (int i = 1; i < l->members; i++) cpu_send_wait(pg, members[i], text, sizeof text);
    uint8_t all_ok = base != NULL, ok;
    for (int i = 1; i < l->members; i++) {
        cpu_recv_wait(pg, members[i], &ok, 1);
        all_ok &= ok;
    }
    if (base) cpu_shm_unlink_pending();
    CHECK_SYS(sigaction(SIGTERM, &old_term, NULL));
    CHECK_SYS(sigaction(SIGINT, &old_int, NULL));
    for (int i = 1; i < l->members; i++) cpu_send_wait(pg, members[i], &all_ok, 1);
    if (!all_ok && base) {
        munmap(base, l->total);
        snprintf(why, size, "another rank of this host could not map the segment");
        base = NULL;
    }
    return base;
}

static inline char *cpu_shm_join(cpu_pg_t *pg, int leader, const cpu_shm_layout_t *l,
                                 uint64_t nonce, char *why, size_t size) {
    char name[64];
    cpu_recv_wait(pg, leader, name, sizeof name);
    name[sizeof name - 1] = '\0';
    char *base = name[0] ? cpu_shm_attach(name, l, nonce, why, size) : NULL;
    if (!name[0]) snprintf(why, size, "rank %d could not create the segment", leader);
    uint8_t ok = base != NULL, all_ok;
    cpu_send_wait(pg, leader, &ok, 1);
    cpu_recv_wait(pg, leader, &all_ok, 1);
    if (!all_ok && base) {
        munmap(base, l->total);
        snprintf(why, size, "another rank of this host could not map the segment");
        base = NULL;
    }
    return base;
}

// The cores this process may use (taskset, a batch system's cpuset: maybe
// fewer than the machine's), as they were before cpu_bind_to_cores first
// narrowed them; false if the kernel does not say.
static inline bool cpu_start_cores(cpu_set_t *cores) {
    static cpu_set_t at_start;
    static bool known;
    if (!known && sched_getaffinity(0, sizeof at_start, &at_start) == 0) known = true;
    *cores = at_start;
    return known;
}

// How many of them: each rank may spin only if every local rank has one.
static inline int cpu_usable_cores(void) {
    cpu_set_t set;
    if (cpu_start_cores(&set)) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

// With no more ranks on this host than cores, local rank `me` of `members`
// keeps to its own share of the cores (with c cores, core k goes to rank
// k * members / c), as mpirun does by default. Left free, the scheduler
// now and then runs two ranks on one core while the other core idles, and
// a rank that waits for its peer then holds it up. Measured on 2 cores
// (2026-11-24, 3 interleaved rounds): 2-rank all-reduce 4 KiB-2 MiB 17-27%
// faster bound, ping-pong 4-23%, and the slow outliers gone.
// COURSE_BIND=0 leaves the ranks free (for instance when several jobs
// share a machine: each would bind its rank 0 to the same core).
static inline void cpu_bind_to_cores(int me, int members) {
    const char *env = getenv("COURSE_BIND");
    cpu_set_t usable, share;
    if ((env && !strcmp(env, "0")) || !cpu_start_cores(&usable)) return;
    int cores = CPU_COUNT(&usable);
    if (members > cores) return;
    CPU_ZERO(&share);
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &usable)) continue;
        if (k * members / cores == me) CPU_SET(c, &share);
        k++;
    }
    (void)sched_setaffinity(0, sizeof share, &share);   // refused: the rank stays free
}

// A first lap over ring memory is slow: 2 ranks, all-reduce of 128 B, 1,000
// operations after 20 untimed ones took 1.15-1.26 us a piece with 256 KiB
// rings and 0.76-0.82 with 64 KiB ones, which the first lap covered only
// in part (2026-11-28, 03's MEASUREMENTS.md). So each rank goes once over
// its rings at the start, on its own core: it writes the rings it writes
// and reads those it reads. Nothing in them is a record yet (zero words
// are stamped for no place in the stream).
static inline void cpu_warm_rings(cpu_pg_t *pg) {
    unsigned long seen = 0;
    for (int r = 0; r < pg->world; r++) {
        cpu_peer_t *p = &pg->peers[r];
        if (r == pg->rank || !p->shm) continue;
        memset(p->tx.data, 0, p->tx.cap);
        for (size_t k = 0; k < p->rx.cap; k += 64) seen += ((volatile const unsigned char *)p->rx.data)[k];
    }
    (void)seen;
}

// Point the peers of this host at their rings and doorbells.
static inline void cpu_shm_wire(cpu_pg_t *pg, char *base, const int *members, int me,
                                const cpu_shm_layout_t *l, const cpu_pg_t *parent) {
    cpu_shm_bell_t *bells = (cpu_shm_bell_t *)(base + l->bells);
    cpu_shm_ring_ctl_t *ctls = (cpu_shm_ring_ctl_t *)(base + l->rings);
    pg->shm_base = base;
    pg->shm_bytes = l->total;
    pg->ring_bytes = l->ring_bytes;
    pg->bell = &bells[me];
    atomic_store(&pg->bell->core, sched_getcpu());
    for (int i = 0; i < l->members; i++) {
        if (i == me) continue;
        cpu_peer_t *p = &pg->peers[members[i]];
        size_t out = cpu_ring_index(me, i, l->members), in = cpu_ring_index(i, me, l->members);
        p->tx = (cpu_shm_ring_t){.ctl = &ctls[out], .data = base + l->data + out * l->ring_bytes,
                                 .cap = l->ring_bytes};
        p->rx = (cpu_shm_ring_t){.ctl = &ctls[in], .data = base + l->data + in * l->ring_bytes,
                                 .cap = l->ring_bytes};
        p->bell = &bells[i];
        p->shm = true;
    }
    // Spin only if every local rank can have a core of its own. A sub-group
    // has fewer local ranks than the host runs: it keeps its parent's answer
    // and its parent's binding.
    if (parent) {
        pg->spin = parent->spin;
    } else {
        pg->spin = cpu_usable_cores() >= l->members;
        cpu_bind_to_cores(me, l->members);
    }
    cpu_warm_rings(pg);
}

// A sub-group's rings are no larger than its parent's: however many groups a
// rank belongs to, the host's shared memory stays within a few times the
// first group's (CPU_SHM_BUDGET).
static inline void cpu_setup_shm(cpu_pg_t *pg, const cpu_address_t *all, uint64_t nonce,
                                 const cpu_pg_t *parent, char *why, size_t size) {
    const char *env = getenv("COURSE_SHM");
    if (env && !strcmp(env, "0")) {
        snprintf(why, size, "turned off by COURSE_SHM=0");
        return;
    }
    int *members = xcalloc((size_t)pg->world, sizeof *members), count = 0, me = 0;
    for (int r = 0; r < pg->world; r++) {
        if (strcmp(all[r].host, all[pg->rank].host)) continue;
        if (r == pg->rank) me = count;
        members[count++] = r;
    }
    if (count >= 2) {
        size_t max_ring = !parent ? CPU_RING_MAX : parent->ring_bytes ? parent->ring_bytes : CPU_RING_MIN;
        cpu_shm_layout_t l = cpu_shm_layout(count, max_ring);
        char *base = me == 0 ? cpu_shm_lead(pg, members, &l, nonce, why, size)
                             : cpu_shm_join(pg, members[0], &l, nonce, why, size);
        if (base) cpu_shm_wire(pg, base, members, me, &l, parent);
    }
    free(members);
}

// Single copy (see pg_cpu_message.h) needs the right to read a peer's
// memory, which Linux gives to a process that could ptrace the peer: the
// same user, and where Yama's ptrace_scope is 1 (Ubuntu's default) only if
// the peer allows it with prctl(PR_SET_PTRACER), which MPI also calls. Each
// rank sends its shared-memory peers its pid and the address of a value
// they know, each peer tries to read it and answers whether it could; a
// pair that cannot (containers, ptrace_scope 2 or 3) sends everything
// through the rings. It is off unless COURSE_SINGLE_COPY=1: on the machine
// this course was measured on, the rings won at every size it applies to
// (pg_cpu_message.h says by how much).
static inline void cpu_setup_single_copy(cpu_pg_t *pg, uint64_t nonce) {
    const char *env = getenv("COURSE_SINGLE_COPY");
    bool wanted = env && !strcmp(env, "1");
    if (wanted) (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);   // fails without Yama: fine
    struct { uint64_t pid, address; } mine = {(uint64_t)getpid(), wanted ? (uintptr_t)&nonce : 0};
    for (int i = 0; i < pg->shm_count; i++) {
        cpu_peer_t *p = &pg->peers[pg->shm_ranks[i]];
        struct { uint64_t pid, address; } theirs;
        cpu_exchange(pg, p->rank, &mine, &theirs, sizeof mine);
        p->pid = (pid_t)theirs.pid;
        uint64_t seen = 0;
        struct iovec local = {&seen, sizeof seen}, far = {(void *)(uintptr_t)theirs.address, sizeof seen};
        uint8_t i_can_read = theirs.address &&
                             process_vm_readv(p->pid, &local, 1, &far, 1, 0) == sizeof seen &&
                             seen == nonce;
        uint8_t peer_can_read;   // our answer also tells the peer we are done with its address
        cpu_exchange(pg, p->rank, &i_can_read, &peer_can_read, 1);
        p->single_copy = peer_can_read;
    }
}

// ---------------------------------------------------------------- create and destroy

// The engine's lists of peers by transport (used by cpu_progress); before
// the shared memory is set up every peer is a TCP peer.
static inline void cpu_sort_peers(cpu_pg_t *pg) {
    pg->tcp_count = pg->shm_count = 0;
    for (int r = 0; r < pg->world; r++) {
        if (r == pg->rank) continue;
        cpu_peer_t *p = &pg->peers[r];
        if (p->shm) pg->shm_ranks[pg->shm_count++] = r;
        else pg->tcp_ranks[pg->tcp_count++] = r;
        if (!p->shm && !p->bounce) p->bounce = xmalloc(CPU_BOUNCE_BYTES);
    }
}

static inline void cpu_describe(cpu_pg_t *pg, const char *shm_why) {
    if (pg->shm_count && pg->tcp_count)
        snprintf(pg->transport, sizeof pg->transport, "sockets + shared memory: shared memory "
                 "with %d rank%s of this host, TCP with %d", pg->shm_count,
                 pg->shm_count == 1 ? "" : "s", pg->tcp_count);
    else if (pg->shm_count)
        snprintf(pg->transport, sizeof pg->transport, "sockets + shared memory");
    else if (shm_why[0])
        snprintf(pg->transport, sizeof pg->transport, "TCP sockets; no shared memory: %s",
                 shm_why);
    else
        snprintf(pg->transport, sizeof pg->transport, "TCP sockets");
}

// A group of id->world_size ranks whose store keys start with id->key.
// parent: the group a sub-group is split from (NULL for a job's first group).
static inline cpu_pg_t *cpu_create(store_t *store, const pg_group_id_t *id, double timeout_s,
                                   const cpu_pg_t *parent) {
    cpu_pg_t *pg = xcalloc(1, sizeof *pg);
    pg->rank = id->rank;
    pg->world = id->world_size;
    pg->timeout_s = timeout_s;
    pg->tag = CPU_TAG_SETUP;
    pg->peers = xcalloc((size_t)pg->world, sizeof *pg->peers);
    for (int r = 0; r < pg->world; r++) pg->peers[r] = (cpu_peer_t){.rank = r, .fd = -1};
    if (pg->world == 1) {
        snprintf(pg->transport, sizeof pg->transport, "one rank: nothing to send");
        return pg;
    }
    size_t n = (size_t)pg->world;
    pg->tcp_ranks = xcalloc(n, sizeof(int));
    pg->shm_ranks = xcalloc(n, sizeof(int));
    pg->tcp_poll = xcalloc(n, sizeof(struct pollfd));
    pg->shm_poll = xcalloc(n, sizeof(struct pollfd));
    cpu_address_t *all = xcalloc(n, sizeof *all);
    uint64_t nonce;
    char shm_why[160] = "";
    cpu_connect_all(pg, store, id->key, all, &nonce);
    cpu_sort_peers(pg);
    cpu_setup_shm(pg, all, nonce, parent, shm_why, sizeof shm_why);
    cpu_sort_peers(pg);
    cpu_setup_single_copy(pg, nonce);
    cpu_describe(pg, shm_why);
    free(all);
    return pg;
}

static inline void cpu_destroy(cpu_pg_t *pg) {
    // A last barrier: no rank closes its connections while another may
    // still be reading what it sent.
    if (pg->world > 1) cpu_barrier_tagged(pg, CPU_TAG_DESTROY);
    for (int r = 0; r < pg->world; r++) {
        cpu_peer_t *p = &pg->peers[r];
        if (p->fd >= 0) close(p->fd);
        free(p->bounce);
        cpu_msg_free(p->in_msg);
        for (int c = 0; c < 2; c++)
            for (cpu_msg_t *m; (m = cpu_msg_pop(&p->unexpected[c])) != NULL;) cpu_msg_free(m);
    }
    if (pg->shm_base) munmap(pg->shm_base, pg->shm_bytes);
    for (cpu_req_t *r; (r = pg->spare) != NULL;) {
        pg->spare = r->next;
        free(r);
    }
    free(pg->scratch);
    free(pg->peers);
    free(pg->tcp_ranks);
    free(pg->shm_ranks);
    free(pg->tcp_poll);
    free(pg->shm_poll);
    free(pg);
}

#endif
