/* The tcp transport (transport.h): the rendezvous' mesh of authenticated sockets, one per
 * pair of ranks, non-blocking with TCP_NODELAY; works across hosts.
 *
 * A channel sends straight from the caller's buffer and receives through a staging
 * buffer (256 KiB, allocated at the first peek) so that a reduction reads whole
 * elements; a plain copy reads the socket straight into the destination once the
 * staging buffer is drained. The engine waits in poll() on the sockets it has work on
 * and on its eventfd (another thread submitted work).
 */
#include "dist/internal/pg_internal.h"

#include "core/log.h"
#include "core/timer.h"
#include "dist/internal/auth.h"
#include "dist/internal/sock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCP_STAGE_BYTES (256u << 10)

/* A channel's receive staging: valid bytes are stage[tail, head). */
typedef struct tcp_chan {
    uint8_t *stage;
    size_t cap, head, tail;
    bool send_blocked; /* the last send would block: poll for POLLOUT */
} tcp_chan;

static rt_status peer_closed(rt_chan *c, const char *what, int err) {
    if (err) return RT_ERROR(RT_ERR_PEER, "peer rank %d: %s failed: %s", c->peer, what, strerror(err));
    return RT_ERROR(RT_ERR_PEER, "peer rank %d closed the connection (the process died or aborted)", c->peer);
}

static rt_status tcp_fill(rt_chan *c, tcp_chan *t) {
    if (t->tail == t->head) t->tail = t->head = 0;
    if (t->head == t->cap) return RT_OK;
    ssize_t r = recv(c->fd, t->stage + t->head, t->cap - t->head, MSG_DONTWAIT);
    if (r > 0) {
        t->head += (size_t)r;
        return RT_OK;
    }
    if (r == 0) return peer_closed(c, "recv", 0);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return RT_OK;
    return peer_closed(c, "recv", errno);
}

static rt_status tcp_send(rt_chan *c, const void *p, size_t n, size_t *moved) {
    tcp_chan *t = c->state;
    *moved = 0;
    if (n == 0) return RT_OK;
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
        *moved = (size_t)w;
        t->send_blocked = (size_t)w < n;
        return RT_OK;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        t->send_blocked = true;
        return RT_OK;
    }
    return peer_closed(c, "send", w < 0 ? errno : 0);
}

static rt_status tcp_peek(rt_chan *c, const uint8_t **p, size_t *avail) {
    tcp_chan *t = c->state;
    if (t->tail == t->head) {
        if (!t->stage) {
            t->stage = malloc(TCP_STAGE_BYTES);
            RT_CHECK_ALLOC(t->stage, TCP_STAGE_BYTES);
            t->cap = TCP_STAGE_BYTES;
        }
        RT_CHECK(tcp_fill(c, t));
    }
    *p = t->stage + t->tail;
    *avail = t->head - t->tail;
    return RT_OK;
}

static void tcp_consume(rt_chan *c, size_t n) {
    tcp_chan *t = c->state;
    t->tail += n;
}

static rt_status tcp_recv(rt_chan *c, void *dst, size_t n, size_t *moved) {
    tcp_chan *t = c->state;
    *moved = 0;
    if (n == 0) return RT_OK;
    if (t->tail < t->head) {
        size_t m = t->head - t->tail;
        if (m > n) m = n;
        memcpy(dst, t->stage + t->tail, m);
        t->tail += m;
        *moved = m;
        return RT_OK;
    }
    ssize_t r = recv(c->fd, dst, n, MSG_DONTWAIT);
    if (r > 0) {
        *moved = (size_t)r;
        return RT_OK;
    }
    if (r == 0) return peer_closed(c, "recv", 0);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return RT_OK;
    return peer_closed(c, "recv", errno);
}

static void tcp_close(rt_chan *c) {
    tcp_chan *t = c->state;
    if (t) free(t->stage);
    free(t);
    c->state = NULL;
}

/* Block in poll() until a socket with work or the wake-up eventfd is ready. Called with
 * mu held: the poll set is built under the lock, the lock is dropped only for poll(). */
static rt_status tcp_sleep(rt_engine *e, int max_ms) {
    struct pollfd pf[65];
    int n = 0;
    pf[n++] = (struct pollfd){e->evfd, POLLIN, 0};
    for (int i = 0; i < e->world && n < 65; i++) {
        rt_chan *c = &e->ch[i];
        if (c->fd < 0 || !c->state) continue;
        tcp_chan *t = c->state;
        short ev = 0;
        if (c->rq_head) ev |= POLLIN;
        if (c->sq_head && t->send_blocked) ev |= POLLOUT;
        if (!ev) continue;
        pf[n++] = (struct pollfd){c->fd, ev, 0};
    }
    pthread_mutex_unlock(&e->mu);
    int pr = poll(pf, (nfds_t)n, max_ms);
    if (pr > 0 && pf[0].revents) {
        uint64_t v;
        if (read(e->evfd, &v, sizeof v) < 0) { /* already drained */
        }
    }
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->world; i++)
        if (e->ch[i].state) ((tcp_chan *)e->ch[i].state)->send_blocked = false;
    return RT_OK;
}

rt_status rt_tcp_attach(rt_engine *e) {
    for (int j = 0; j < e->world; j++) {
        rt_chan *c = &e->ch[j];
        if (j == e->rank || c->fd < 0) continue;
        c->state = calloc(1, sizeof(tcp_chan));
        RT_CHECK_ALLOC(c->state, sizeof(tcp_chan));
        c->ops = &rt_tp_tcp;
    }
    e->tp = &rt_tp_tcp;
    return RT_OK;
}

/* Every peer's channel reads and writes its mesh socket. */
static rt_status tcp_setup(rt_pg *pg, const rt_transport_setup *s) {
    (void)s;
    return rt_tcp_attach(&pg->w->eng);
}

const rt_transport_ops rt_tp_tcp = {
    .name = "tcp",
    .kind = RT_TRANSPORT_TCP,
    .setup = tcp_setup,
    .run = rt_run_host,
    .send = tcp_send,
    .peek = tcp_peek,
    .consume = tcp_consume,
    .recv = tcp_recv,
    .close = tcp_close,
    .sleep = tcp_sleep,
};

/* ---- the mesh (every world's first connection, made at the rendezvous) ---- */

rt_status rt_tcp_mesh_connect(rt_pg_world *w, int lfd, char (*addrs)[80], double timeout_s) {
    rt_engine *e = &w->eng;
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    /* every connection proves the job secret (auth.h); the secret itself never travels */
    uint8_t key[RT_AUTH_MAC];
    RT_CHECK(rt_auth_peer_key(w->rdzv.job, w->token, key));
    for (int j = 0; j < e->rank; j++) {
        char host[64];
        int port = 0;
        if (sscanf(addrs[j], "%63s %d", host, &port) != 2)
            return RT_ERROR(RT_ERR_PEER, "rank %d published a malformed address '%s'", j, addrs[j]);
        char what[96];
        snprintf(what, sizeof what, "peer rank %d", j);
        int fd;
        RT_CHECK(rt_sock_connect(host, port, deadline, what, &fd));
        rt_status s = rt_auth_peer_connect(fd, key, e->rank, j, e->world, deadline, what);
        if (s != RT_OK) {
            close(fd);
            rt_error_trace(__FILE__, __LINE__, what);
            return s;
        }
        e->ch[j].fd = fd;
    }
    int need = e->world - 1 - e->rank;
    while (need > 0) {
        int fd;
        rt_status s = rt_sock_accept(lfd, deadline, &fd);
        if (s != RT_OK) {
            char list[256] = "";
            size_t n = 0;
            for (int j = e->rank + 1; j < e->world && n < sizeof list - 16; j++)
                if (e->ch[j].fd < 0) n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", j);
            return RT_ERROR(RT_ERR_TIMEOUT, "rank(s) %s never connected within %.1f s", list, timeout_s);
        }
        int peer = -1;
        uint64_t hs = rt_now_ns() + 5000000000ull < deadline ? rt_now_ns() + 5000000000ull : deadline;
        s = rt_auth_peer_accept(fd, key, e->rank, e->world, hs, &peer);
        if (s == RT_OK && e->ch[peer].fd >= 0)
            s = RT_ERROR(RT_ERR_PEER, "duplicate rank %d: two processes connected as rank %d", peer, peer);
        if (s != RT_OK) { /* not one of ours (or broken): reject it and keep waiting */
            RT_LOG_WARN("rejected a connection: %s", rt_error_message());
            close(fd);
            continue;
        }
        e->ch[peer].fd = fd;
        need--;
    }
    for (int j = 0; j < e->world; j++)
        if (e->ch[j].fd >= 0) RT_CHECK(rt_sock_set_nonblock(e->ch[j].fd, 1));
    return RT_OK;
}
