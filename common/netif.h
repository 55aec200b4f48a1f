// netif.h - which of this host's addresses the other nodes should use to reach it.
//
// A rank listens for its peers and publishes "IP port" in the store; the
// others connect there. On one machine 127.0.0.1 does. A real node has
// several interfaces (lo, a management ethernet, a fast data network,
// docker0, ...) and publishing the wrong one is the classic multi-node hang:
// the address is valid here but unreachable from the other nodes, so they
// wait until the timeout.
//
// The choice, in order:
//   0. An address given outright: COURSE_LOCAL_ADDR (ddprun --local_addr, as
//      torchrun's --local_addr). It must be one of this host's: an address
//      no interface holds stops the program with one line, where the others
//      would wait for it until the timeout.
//   1. An interface spec from COURSE_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME,
//      else NCCL_SOCKET_IFNAME, with NCCL's syntax:
//        "eth,ens"   interfaces whose names START with eth or ens
//        "=eth0"     exactly eth0 (a comma list of exact names works too)
//        "^docker"   any interface but those starting with docker ("^=" exact)
//      Loopback is used only when the spec names it ("lo"): an exclusion
//      spec never picks it. Of the matching interfaces, the one the route to
//      MASTER_ADDR goes through wins; otherwise the first match in the spec's
//      order, IPv4 before IPv6. A spec that matches nothing stops the program
//      with one line listing the interfaces present.
//   2. No spec: the address of the interface that routes to MASTER_ADDR.
//      Connecting a UDP socket sends no packet but makes the kernel pick the
//      route and the source address (getsockname tells which), so this is
//      right on a multi-homed node, in a container and in a network
//      namespace, without any configuration.
//   3. No MASTER_ADDR either (a job on one machine): 127.0.0.1.
//
// Use: netif_choice me = netif_advertise(master_addr);  then publish me.ip.
#ifndef COURSE_NETIF_H
#define COURSE_NETIF_H

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

typedef struct {
    char ip[INET6_ADDRSTRLEN];   // numeric, ready to publish
    char ifname[IF_NAMESIZE];    // the interface it belongs to ("?" if unknown)
    char how[200];               // why this one, for the start-up line
} netif_choice;

// The spec in force and the variable it came from; NULL when none is set.
static inline const char *netif_spec_from_env(const char **variable) {
    static const char *names[] = {"COURSE_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                  "NCCL_SOCKET_IFNAME"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *spec = getenv(names[i]);
        if (spec && spec[0]) {
            if (variable) *variable = names[i];
            return spec;
        }
    }
    return NULL;
}

// Where ifname first matches the spec's list (0, 1, ...), or -1. For an
// exclusion spec: 0 when it matches none of the list, else -1.
static inline int netif_spec_rank(const char *spec, const char *ifname) {
    bool exclude = spec[0] == '^';
    if (exclude) spec++;
    bool exact = spec[0] == '=';
    if (exact) spec++;
    int index = 0;
    for (const char *item = spec; *item; index++) {
        size_t len = strcspn(item, ",");
        bool hit = len > 0 && (exact ? strlen(ifname) == len && !strncmp(ifname, item, len)
                                     : !strncmp(ifname, item, len));
        if (hit) return exclude ? -1 : index;
        item += len + (item[len] == ',');
    }
    return exclude ? 0 : -1;
}

static inline bool netif_spec_matches(const char *spec, const char *ifname) {
    return netif_spec_rank(spec, ifname) >= 0;
}

// The numeric address of an interface entry; false for entries that cannot
// be advertised (no address, not IP, down, or IPv6 link-local, which needs
// a scope the other host does not know).
static inline bool netif_entry_ip(const struct ifaddrs *a, char *ip, size_t size) {
    if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) return false;
    int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) return false;
    if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr))
        return false;
    socklen_t len = family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    return getnameinfo(a->ifa_addr, len, ip, (socklen_t)size, NULL, 0, NI_NUMERICHOST) == 0;
}

// Appends to out (size bytes in all), never past its end.
__attribute__((format(printf, 4, 5)))
static inline void netif_append(char *out, size_t size, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= size) return;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(out + *used, size - *used, fmt, args);
    va_end(args);
    if (n > 0) *used = *used + (size_t)n < size ? *used + (size_t)n : size - 1;
}

// "lo (127.0.0.1, ::1), eth0 (10.0.0.5), ib0 (down)": every interface, with
// the addresses it could advertise, for messages.
static inline void netif_list(char *out, size_t size) {
    struct ifaddrs *list;
    if (getifaddrs(&list) < 0) {
        snprintf(out, size, "(getifaddrs failed: %s)", strerror(errno));
        return;
    }
    size_t used = 0;
    out[0] = '\0';
    for (struct ifaddrs *a = list; a; a = a->ifa_next) {
        bool seen = false;   // each name once, at its first entry
        for (struct ifaddrs *b = list; b != a && !seen; b = b->ifa_next)
            seen = !strcmp(a->ifa_name, b->ifa_name);
        if (seen) continue;
        netif_append(out, size, &used, "%s%s (", used ? ", " : "", a->ifa_name);
        int ips = 0;
        for (struct ifaddrs *b = a; b; b = b->ifa_next) {
            char ip[INET6_ADDRSTRLEN];
            if (!strcmp(b->ifa_name, a->ifa_name) && netif_entry_ip(b, ip, sizeof ip))
                netif_append(out, size, &used, "%s%s", ips++ ? ", " : "", ip);
        }
        if (!ips) netif_append(out, size, &used, "%s", a->ifa_flags & IFF_UP ? "no IP address" : "down");
        netif_append(out, size, &used, ")");
    }
    if (!used) snprintf(out, size, "none");
    freeifaddrs(list);
}

// The source address the kernel would use to reach host ("" when there is no route).
static inline void netif_route_source(const char *host, char *ip, size_t size) {
    ip[0] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *list;
    if (!host || !host[0] || getaddrinfo(host, "9", &hints, &list) != 0) return;
    int fd = socket(list->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    bool found = fd >= 0 && connect(fd, list->ai_addr, list->ai_addrlen) == 0 &&
                 getsockname(fd, (struct sockaddr *)&a, &len) == 0 &&
                 getnameinfo((struct sockaddr *)&a, len, ip, (socklen_t)size, NULL, 0,
                             NI_NUMERICHOST) == 0;
    if (!found) ip[0] = '\0';
    if (fd >= 0) close(fd);
    freeaddrinfo(list);
}

// The interface that holds address ip ("?" when none does).
static inline void netif_name_of(const char *ip, char *name, size_t size) {
    struct ifaddrs *list;
    snprintf(name, size, "?");
    if (getifaddrs(&list) < 0) return;
    for (struct ifaddrs *a = list; a; a = a->ifa_next) {
        char here[INET6_ADDRSTRLEN];
        if (netif_entry_ip(a, here, sizeof here) && !strcmp(here, ip)) {
            snprintf(name, size, "%s", a->ifa_name);
            break;
        }
    }
    freeifaddrs(list);
}

// How good a candidate is; lower is better: the route's own address first,
// then by position in the spec, IPv4 before IPv6.
static inline long netif_score(const struct ifaddrs *a, const char *ip, const char *spec,
                               const char *route_ip) {
    if (route_ip[0] && !strcmp(ip, route_ip)) return -1;
    return 2L * netif_spec_rank(spec, a->ifa_name) + (a->ifa_addr->sa_family == AF_INET6);
}

// Step 1: the best address on an interface the spec selects. Dies when none does.
static inline netif_choice netif_choose(const char *spec, const char *variable,
                                        const char *master_addr) {
    netif_choice c = {"", "", ""};
    char route_ip[INET6_ADDRSTRLEN];
    netif_route_source(master_addr, route_ip, sizeof route_ip);
    struct ifaddrs *list;
    if (getifaddrs(&list) < 0) die("getifaddrs failed: %s", strerror(errno));
    long best = 0;
    for (struct ifaddrs *a = list; a; a = a->ifa_next) {
        char ip[INET6_ADDRSTRLEN];
        if (!netif_entry_ip(a, ip, sizeof ip) || !netif_spec_matches(spec, a->ifa_name)) continue;
        if (spec[0] == '^' && (a->ifa_flags & IFF_LOOPBACK)) continue;  // loopback only if named
        long score = netif_score(a, ip, spec, route_ip);
        if (c.ip[0] && score >= best) continue;
        best = score;
        snprintf(c.ip, sizeof c.ip, "%s", ip);
        snprintf(c.ifname, sizeof c.ifname, "%s", a->ifa_name);
    }
    freeifaddrs(list);
    if (!c.ip[0]) {
        char present[1024];
        netif_list(present, sizeof present);
        die("%s='%s' matches no interface that is up and has an address; interfaces here: %s",
            variable, spec, present);
    }
    snprintf(c.how, sizeof c.how, "interface %s, chosen by %s=%.120s", c.ifname, variable, spec);
    return c;
}

// The MTU of an interface (the largest packet it sends without splitting
// it), or -1 when unknown. Nodes whose MTUs differ lose the large packets
// (chapter 07's README: the network checks).
static inline int netif_mtu(const char *ifname) {
    struct ifreq req = {0};
    if (!ifname || strlen(ifname) >= sizeof req.ifr_name) return -1;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    snprintf(req.ifr_name, sizeof req.ifr_name, "%s", ifname);
    int mtu = ioctl(fd, SIOCGIFMTU, &req) == 0 ? req.ifr_mtu : -1;
    close(fd);
    return mtu;
}

// Is addr one of this host's addresses? Asked by binding a socket to it:
// the kernel refuses an address that no interface here holds. If not, why.
static inline bool netif_is_mine(const char *addr, char *why, size_t size) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE}, *list;
    int rc = getaddrinfo(addr, "0", &hints, &list);
    if (rc) return snprintf(why, size, "is not a numeric IP address: %s", gai_strerror(rc)), false;
    int fd = socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool mine = fd >= 0 && bind(fd, list->ai_addr, list->ai_addrlen) == 0;
    int err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(list);
    if (mine) return true;
    char present[1024];
    netif_list(present, sizeof present);
    snprintf(why, size, "is not an address of this machine (%s); interfaces here: %s", strerror(err), present);
    return false;
}

// Step 0: the address in `variable`, which must be this host's.
static inline netif_choice netif_given(const char *addr, const char *variable) {
    netif_choice c = {"", "", ""};
    char why[1200];
    if (!netif_is_mine(addr, why, sizeof why)) die("%s=%s %s", variable, addr, why);
    snprintf(c.ip, sizeof c.ip, "%s", addr);
    netif_name_of(addr, c.ifname, sizeof c.ifname);
    snprintf(c.how, sizeof c.how, "address %.60s, given by %s", addr, variable);
    return c;
}

// The address in COURSE_LOCAL_ADDR, NULL when it is not set.
static inline const char *netif_given_from_env(void) {
    const char *addr = getenv("COURSE_LOCAL_ADDR");
    return addr && addr[0] ? addr : NULL;
}

// The address to publish. master_addr: where the store runs (NULL: the
// MASTER_ADDR variable).
static inline netif_choice netif_advertise(const char *master_addr) {
    if (netif_given_from_env()) return netif_given(netif_given_from_env(), "COURSE_LOCAL_ADDR");
    const char *variable = NULL, *spec = netif_spec_from_env(&variable);
    if (!master_addr || !master_addr[0]) master_addr = getenv("MASTER_ADDR");
    if (spec) return netif_choose(spec, variable, master_addr);
    netif_choice c = {"", "", ""};
    netif_route_source(master_addr, c.ip, sizeof c.ip);
    if (c.ip[0]) {
        netif_name_of(c.ip, c.ifname, sizeof c.ifname);
        snprintf(c.how, sizeof c.how, "interface %s, the route to MASTER_ADDR %.120s", c.ifname,
                 master_addr);
    } else {
        snprintf(c.ip, sizeof c.ip, "127.0.0.1");
        snprintf(c.ifname, sizeof c.ifname, "lo");
        snprintf(c.how, sizeof c.how, "loopback: %s", master_addr && master_addr[0]
                 ? "no route to MASTER_ADDR" : "no MASTER_ADDR, so a job on this machine");
    }
    return c;
}

#endif
