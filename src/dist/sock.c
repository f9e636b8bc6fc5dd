/* TCP socket helpers (see sock.h). */
#include "dist/internal/sock.h"

#include "core/timer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int rt_sock_ms_left(uint64_t deadline_ns, int cap_ms) {
    uint64_t now = rt_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

static rt_status resolve(const char *host, int port, int passive, struct addrinfo **out) {
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, out);
    if (rc != 0) return RT_ERROR(RT_ERR_INVALID, "cannot resolve host '%s': %s", host ? host : "", gai_strerror(rc));
    return RT_OK;
}

rt_status rt_sock_listen(const char *host, int port, int *fd_out, int *bound_port) {
    if (port < 0 || port > 65535) return RT_ERROR(RT_ERR_INVALID, "port %d out of range 0..65535", port);
    struct addrinfo *ai = NULL;
    RT_CHECK(resolve(host, port, 1, &ai));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return rt_error_sys(__FILE__, __LINE__, "socket");
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        int e = errno;
        freeaddrinfo(ai);
        close(fd);
        return RT_ERROR(RT_ERR_SYS, "bind to %s:%d: %s", host && *host ? host : "*", port, strerror(e));
    }
    freeaddrinfo(ai);
    if (listen(fd, 128) < 0) {
        close(fd);
        return rt_error_sys(__FILE__, __LINE__, "listen");
    }
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    if (bound_port) *bound_port = ntohs(sa.sin_port);
    *fd_out = fd;
    return RT_OK;
}

rt_status rt_sock_connect(const char *host, int port, uint64_t deadline_ns, const char *what, int *fd_out) {
    struct addrinfo *ai = NULL;
    RT_CHECK(resolve(host, port, 0, &ai));
    int delay_ms = 10, attempts = 0, last_err = 0;
    for (;;) {
        attempts++;
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            freeaddrinfo(ai);
            return rt_error_sys(__FILE__, __LINE__, "socket");
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int pr = poll(&p, 1, rt_sock_ms_left(deadline_ns, 1000));
            if (pr > 0) {
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                rc = err ? -1 : 0;
                errno = err;
            } else {
                rc = -1;
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            freeaddrinfo(ai);
            rt_sock_set_nonblock(fd, 0);
            rt_sock_set_nodelay(fd);
            *fd_out = fd;
            return RT_OK;
        }
        last_err = errno;
        close(fd);
        if (rt_now_ns() >= deadline_ns) break;
        int ms = rt_sock_ms_left(deadline_ns, delay_ms);
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (delay_ms < 1000) delay_ms *= 2;
    }
    freeaddrinfo(ai);
    return RT_ERROR(RT_ERR_TIMEOUT, "could not connect to %s (%s:%d) after %d attempts: %s", what, host, port, attempts,
                    strerror(last_err));
}

rt_status rt_sock_accept(int lfd, uint64_t deadline_ns, int *fd_out) {
    for (;;) {
        struct pollfd p = {lfd, POLLIN, 0};
        int ms = rt_sock_ms_left(deadline_ns, 1000);
        int pr = poll(&p, 1, ms);
        if (pr < 0 && errno != EINTR) return rt_error_sys(__FILE__, __LINE__, "poll");
        if (pr > 0) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                rt_sock_set_nodelay(fd);
                *fd_out = fd;
                return RT_OK;
            }
            if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
                return rt_error_sys(__FILE__, __LINE__, "accept");
        }
        if (rt_now_ns() >= deadline_ns) return RT_ERROR(RT_ERR_TIMEOUT, "no connection arrived before the deadline");
    }
}

rt_status rt_sock_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns, const char *what) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return RT_ERROR(RT_ERR_PEER, "writing to %s: %s", what, strerror(errno));
        struct pollfd pf = {fd, POLLOUT, 0};
        int ms = rt_sock_ms_left(deadline_ns, 1000);
        if (ms == 0 && rt_now_ns() >= deadline_ns) return RT_ERROR(RT_ERR_TIMEOUT, "timed out writing to %s", what);
        poll(&pf, 1, ms);
    }
    return RT_OK;
}

rt_status rt_sock_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns, const char *what) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return RT_ERROR(RT_ERR_PEER, "%s closed the connection", what);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return RT_ERROR(RT_ERR_PEER, "reading from %s: %s", what, strerror(errno));
        struct pollfd pf = {fd, POLLIN, 0};
        int ms = rt_sock_ms_left(deadline_ns, 1000);
        if (ms == 0 && rt_now_ns() >= deadline_ns) return RT_ERROR(RT_ERR_TIMEOUT, "timed out reading from %s", what);
        poll(&pf, 1, ms);
    }
    return RT_OK;
}

rt_status rt_sock_set_nonblock(int fd, int on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return rt_error_sys(__FILE__, __LINE__, "fcntl(F_GETFL)");
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    RT_CHECK_SYS(fcntl(fd, F_SETFL, fl));
    return RT_OK;
}

void rt_sock_set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

rt_status rt_sock_local_addr(int fd, char *buf, size_t n) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    RT_CHECK_SYS(getsockname(fd, (struct sockaddr *)&sa, &sl));
    if (!inet_ntop(AF_INET, &sa.sin_addr, buf, (socklen_t)n)) return rt_error_sys(__FILE__, __LINE__, "inet_ntop");
    return RT_OK;
}

rt_status rt_random_bytes(void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return rt_error_sys(__FILE__, __LINE__, "getrandom");
        }
        p += r;
        n -= (size_t)r;
    }
    return RT_OK;
}

void rt_hex_encode(const uint8_t *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

rt_status rt_random_hex(char *out, size_t n) {
    uint8_t raw[64];
    RT_REQUIRE(n <= sizeof raw, RT_ERR_INTERNAL, "rt_random_hex: %zu bytes (at most %zu)", n, sizeof raw);
    RT_CHECK(rt_random_bytes(raw, n));
    rt_hex_encode(raw, n, out);
    return RT_OK;
}
