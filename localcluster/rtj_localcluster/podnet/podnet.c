/*
 * The pod network of a local-cluster pod: an LD_PRELOAD library the process kubelet puts into every
 * container (with RTJ_POD_IP, the pod's loopback address 127.x.y.z).
 *
 * All pods share the machine's network namespace, so two pods listening on the same port of all
 * addresses would collide. This library gives each pod its own "all addresses":
 *
 * - bind() of the IPv4 wildcard 0.0.0.0 binds the pod IP instead;
 * - bind() of the IPv6 wildcard :: by a dual-stack socket (IPV6_V6ONLY off) binds the pod IP's
 *   IPv4-mapped address ::ffff:<pod IP> (it takes the same IPv4 connections);
 * - bind() of :: by an IPv6-only socket fails with EADDRNOTAVAIL: the pod has no IPv6 address
 *   (asyncio, libuv users such as torch's TCPStore and getaddrinfo loops then use IPv4);
 * - connect() to 127.0.0.1:P (or ::1 / ::ffff:127.0.0.1) goes to <pod IP>:P when something listens
 *   there, so "localhost" inside the pod still reaches the pod's own servers; otherwise (the API
 *   server on 127.0.0.1, any host service) the address is left alone.
 *
 * A bind of any specific address (127.0.0.1, the pod IP, port 0 of a specific address) is not
 * touched. Without RTJ_POD_IP the library does nothing.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*socket_call)(int, const struct sockaddr *, socklen_t);

static struct in_addr pod_ip;
static int have_pod_ip = -1;

static int pod_ip_known(void) {
    if (have_pod_ip < 0) {
        const char *text = getenv("RTJ_POD_IP");
        have_pod_ip = text != NULL && inet_pton(AF_INET, text, &pod_ip) == 1;
    }
    return have_pod_ip;
}

static socket_call real(const char *name) { return (socket_call)dlsym(RTLD_NEXT, name); }

static int v6_only(int fd) {
    int on = 0;
    socklen_t size = sizeof on;
    if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, &size) != 0) return 0;
    return on;
}

static void mapped(struct in6_addr *out, struct in_addr v4) {
    memset(out, 0, sizeof *out);
    out->s6_addr[10] = 0xff;
    out->s6_addr[11] = 0xff;
    memcpy(&out->s6_addr[12], &v4, 4);
}

/* Whether a TCP socket listens on <pod IP>:port (IPv4, or IPv4-mapped IPv6), from /proc/net. */
static int pod_listens(unsigned short port) {
    char want4[16], want6[40], line[512], local[64];
    unsigned char *b = (unsigned char *)&pod_ip;
    unsigned int state, at;
    /* /proc/net/tcp prints the address as one host-order word, tcp6 as four such words. */
    snprintf(want4, sizeof want4, "%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0], port);
    snprintf(want6, sizeof want6, "0000000000000000FFFF0000%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0],
             port);
    const char *files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    const char *wants[2] = {want4, want6};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "re");
        if (f == NULL) continue;
        int found = 0;
        while (!found && fgets(line, sizeof line, f) != NULL) {
            if (sscanf(line, " %u: %63s %*s %x", &at, local, &state) == 3 && state == 0x0A &&
                strcmp(local, wants[i]) == 0)
                found = 1;
        }
        fclose(f);
        if (found) return 1;
    }
    return 0;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static socket_call next;
    if (next == NULL) next = real("bind");
    if (addr != NULL && pod_ip_known()) {
        if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
            struct sockaddr_in in4;
            memcpy(&in4, addr, sizeof in4);
            if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
                in4.sin_addr = pod_ip;
                return next(fd, (const struct sockaddr *)&in4, sizeof in4);
            }
        } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
            struct sockaddr_in6 in6;
            memcpy(&in6, addr, sizeof in6);
            if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
                if (v6_only(fd)) {
                    errno = EADDRNOTAVAIL;
                    return -1;
                }
                mapped(&in6.sin6_addr, pod_ip);
                return next(fd, (const struct sockaddr *)&in6, sizeof in6);
            }
        }
    }
    return next(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static socket_call next;
    if (next == NULL) next = real("connect");
    if (addr != NULL && pod_ip_known()) {
        if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
            struct sockaddr_in in4;
            memcpy(&in4, addr, sizeof in4);
            if (in4.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && pod_listens(ntohs(in4.sin_port))) {
                in4.sin_addr = pod_ip;
                return next(fd, (const struct sockaddr *)&in4, sizeof in4);
            }
        } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
            struct sockaddr_in6 in6;
            struct in6_addr loop4;
            struct in_addr lo = {htonl(INADDR_LOOPBACK)};
            memcpy(&in6, addr, sizeof in6);
            mapped(&loop4, lo);
            int loopback = IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr) ||
                           memcmp(&in6.sin6_addr, &loop4, sizeof loop4) == 0;
            if (loopback && !v6_only(fd) && pod_listens(ntohs(in6.sin6_port))) {
                mapped(&in6.sin6_addr, pod_ip);
                return next(fd, (const struct sockaddr *)&in6, sizeof in6);
            }
        }
    }
    return next(fd, addr, len);
}
