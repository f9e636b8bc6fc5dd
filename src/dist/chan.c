/* Channels over tcp and shm (see chan.h). */
#include "dist/internal/chan.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TCP_STAGE_BYTES (256u << 10)

static rt_status peer_closed(rt_chan *c, const char *what, int err) {
    c->eof = true;
    if (err) return RT_ERROR(RT_ERR_PEER, "peer rank %d: %s failed: %s", c->peer, what, strerror(err));
    return RT_ERROR(RT_ERR_PEER, "peer rank %d closed the connection (the process died or aborted)", c->peer);
}

/* ---- shm ---- */

/* Wake-up protocol (Dekker style, both sides fenced): a sleeper sets `waiting`,
 * fences, re-checks the rings, then sleeps on `seq` if nothing changed; a producer or
 * consumer publishes its head/tail, fences, and only if `waiting` is set bumps `seq`
 * and wakes. While nobody sleeps (the spinning phase) a transfer costs no atomic
 * read-modify-write and no system call. */
void rt_shm_bell_ring(rt_shm_bell *b) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&b->waiting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
        syscall(SYS_futex, &b->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

void rt_shm_bell_force(rt_shm_bell *b) {
    atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
    syscall(SYS_futex, &b->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void rt_shm_bell_wait(rt_shm_bell *b, uint32_t seen, int timeout_ms) {
    if (atomic_load_explicit(&b->seq, memory_order_seq_cst) == seen) {
        struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
        syscall(SYS_futex, &b->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}

static rt_status shm_send(rt_chan *c, const void *p, size_t n, size_t *moved) {
    uint64_t head = atomic_load_explicit(&c->tx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
    size_t free_b = c->cap - (size_t)(head - tail);
    if (n > free_b) n = free_b;
    if (n > c->piece) n = c->piece;
    *moved = n;
    if (n == 0) return RT_OK;
    size_t off = (size_t)(head & (c->cap - 1));
    size_t first = c->cap - off < n ? c->cap - off : n;
    memcpy(c->txd + off, p, first);
    if (first < n) memcpy(c->txd, (const uint8_t *)p + first, n - first);
    atomic_store_explicit(&c->tx->head, head + n, memory_order_release);
    rt_shm_bell_ring(c->peer_bell);
    return RT_OK;
}

static void shm_peek(rt_chan *c, const uint8_t **p, size_t *avail) {
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
    size_t n = (size_t)(head - tail);
    size_t off = (size_t)(tail & (c->cap - 1));
    if (n > c->cap - off) n = c->cap - off;
    *p = c->rxd + off;
    *avail = n;
}

static void shm_consume(rt_chan *c, size_t n) {
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
    atomic_store_explicit(&c->rx->tail, tail + n, memory_order_release);
    rt_shm_bell_ring(c->peer_bell);
}

/* ---- tcp ---- */

static rt_status tcp_fill(rt_chan *c) {
    if (c->st_tail == c->st_head) c->st_tail = c->st_head = 0;
    if (c->st_head == c->st_cap) return RT_OK;
    ssize_t r = recv(c->fd, c->stage + c->st_head, c->st_cap - c->st_head, MSG_DONTWAIT);
    if (r > 0) {
        c->st_head += (size_t)r;
        return RT_OK;
    }
    if (r == 0) return peer_closed(c, "recv", 0);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return RT_OK;
    return peer_closed(c, "recv", errno);
}

rt_status rt_chan_send(rt_chan *c, const void *p, size_t n, size_t *moved) {
    if (c->shm) return shm_send(c, p, n, moved);
    *moved = 0;
    if (n == 0) return RT_OK;
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
        *moved = (size_t)w;
        c->send_blocked = (size_t)w < n;
        return RT_OK;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        c->send_blocked = true;
        return RT_OK;
    }
    return peer_closed(c, "send", w < 0 ? errno : 0);
}

rt_status rt_chan_peek(rt_chan *c, const uint8_t **p, size_t *avail) {
    if (c->shm) {
        shm_peek(c, p, avail);
        return RT_OK;
    }
    if (c->st_tail == c->st_head) {
        if (!c->stage) {
            c->stage = malloc(TCP_STAGE_BYTES);
            RT_CHECK_ALLOC(c->stage, TCP_STAGE_BYTES);
            c->st_cap = TCP_STAGE_BYTES;
        }
        RT_CHECK(tcp_fill(c));
    }
    *p = c->stage + c->st_tail;
    *avail = c->st_head - c->st_tail;
    return RT_OK;
}

void rt_chan_consume(rt_chan *c, size_t n) {
    if (c->shm) {
        shm_consume(c, n);
        return;
    }
    c->st_tail += n;
}

rt_status rt_chan_recv_into(rt_chan *c, void *dst, size_t n, size_t *moved) {
    *moved = 0;
    if (n == 0) return RT_OK;
    if (c->shm) {
        uint8_t *d = dst;
        for (int k = 0; k < 2 && *moved < n; k++) {
            const uint8_t *p;
            size_t avail;
            shm_peek(c, &p, &avail);
            if (avail == 0) break;
            size_t m = avail < n - *moved ? avail : n - *moved;
            memcpy(d + *moved, p, m);
            *moved += m;
            /* publish per piece so that the producer can refill while we copy */
            uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
            atomic_store_explicit(&c->rx->tail, tail + m, memory_order_release);
        }
        if (*moved) rt_shm_bell_ring(c->peer_bell);
        return RT_OK;
    }
    if (c->st_tail < c->st_head) {
        size_t m = c->st_head - c->st_tail;
        if (m > n) m = n;
        memcpy(dst, c->stage + c->st_tail, m);
        c->st_tail += m;
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

void rt_chan_close(rt_chan *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->stage);
    c->stage = NULL;
    if (c->seg) munmap(c->seg, c->seglen);
    c->seg = NULL;
    if (c->peer_bell) munmap(c->peer_bell, 4096);
    c->peer_bell = NULL;
}
