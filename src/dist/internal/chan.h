/* A channel: the ordered byte stream between this rank and one peer, over the world's
 * transport (transport.h): tcp (the mesh socket with a receive staging buffer), shm (two
 * single-producer single-consumer rings in a shared-memory segment; the tcp socket stays
 * as a control line, whose EOF tells that the peer died), or another table.
 *
 * All calls are non-blocking and move what they can. Receivers can peek at the bytes
 * in place (shm: directly in the shared ring) and consume them, so a reduction reads
 * the ring and writes the destination with no intermediate copy. The engine (engine.h)
 * drives channels; it owns the per-channel queues of transfers.
 */
#ifndef RT_DIST_CHAN_H
#define RT_DIST_CHAN_H

#include "core/status.h"
#include "dist/internal/transport.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_xfer rt_xfer;

struct rt_chan {
    int peer;                    /* world rank */
    int fd;                      /* the mesh socket (tcp data, shm control line); -1 for self */
    const rt_transport_ops *ops; /* NULL for self (and before the transport's setup) */
    void *state;                 /* the transport's per-channel state */
    /* engine queues (FIFO per direction) */
    rt_xfer *sq_head, *sq_tail, *rq_head, *rq_tail;
};

/* The data path, through the channel's transport (transport.h). */
static inline rt_status rt_chan_send(rt_chan *c, const void *p, size_t n, size_t *moved) {
    return c->ops->send(c, p, n, moved);
}
static inline rt_status rt_chan_peek(rt_chan *c, const uint8_t **p, size_t *avail) { return c->ops->peek(c, p, avail); }
static inline void rt_chan_consume(rt_chan *c, size_t n) { c->ops->consume(c, n); }
static inline rt_status rt_chan_recv_into(rt_chan *c, void *dst, size_t n, size_t *moved) {
    return c->ops->recv(c, dst, n, moved);
}

#endif
