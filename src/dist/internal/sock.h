/* Small TCP socket helpers shared by the store and the tcp transport: resolve, listen,
 * connect with retry and exponential backoff until a deadline, read/write a whole
 * buffer before a deadline (poll-based, so a dead or silent peer becomes an error
 * after the deadline instead of a hang). Deadlines are absolute rt_now_ns() values. */
#ifndef RT_DIST_SOCK_H
#define RT_DIST_SOCK_H

#include "core/status.h"
#include <stddef.h>
#include <stdint.h>

/* Listen on host:port (host NULL or "" = any address; port 0 = ephemeral). The bound
 * port goes to *bound_port. */
rt_status rt_sock_listen(const char *host, int port, int *fd_out, int *bound_port);
/* Connect to host:port, retrying refused/unreachable attempts with backoff until the
 * deadline. `what` names the target in errors ("store at 127.0.0.1:29500"). */
rt_status rt_sock_connect(const char *host, int port, uint64_t deadline_ns, const char *what, int *fd_out);
/* Accept one connection before the deadline (RT_ERR_TIMEOUT otherwise). */
rt_status rt_sock_accept(int lfd, uint64_t deadline_ns, int *fd_out);
rt_status rt_sock_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns, const char *what);
/* Reads exactly n bytes; EOF is RT_ERR_PEER naming `what`. */
rt_status rt_sock_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns, const char *what);
rt_status rt_sock_set_nonblock(int fd, int on);
void rt_sock_set_nodelay(int fd);
/* Local IPv4 address of a connected socket, as text. */
rt_status rt_sock_local_addr(int fd, char *buf, size_t n);
/* Milliseconds left until the deadline, clamped to [0, cap_ms]. */
int rt_sock_ms_left(uint64_t deadline_ns, int cap_ms);
/* Fill buf with n random bytes (getrandom). */
rt_status rt_random_bytes(void *buf, size_t n);
/* n bytes as 2n lowercase hex digits and a NUL into out (2n + 1 chars). */
void rt_hex_encode(const uint8_t *bytes, size_t n, char *out);
/* A fresh secret: n random bytes as hex into out (2n + 1 chars); job secrets take
 * RT_SECRET_BYTES (128 bits, 32 hex digits, as `openssl rand -hex 16`). */
enum { RT_SECRET_BYTES = 16 };
rt_status rt_random_hex(char *out, size_t n);

#endif
