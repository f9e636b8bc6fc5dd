/* A channel: the ordered byte stream between this rank and one peer, over tcp (a
 * non-blocking socket with TCP_NODELAY and a receive staging buffer) or shm (two
 * single-producer single-consumer rings in a shared-memory segment, plus the tcp
 * socket kept as a control line, whose EOF tells that the peer died).
 *
 * All calls are non-blocking and move what they can. Receivers can peek at the bytes
 * in place (shm: directly in the shared ring) and consume them, so a reduction reads
 * the ring and writes the destination with no intermediate copy. The engine (engine.h)
 * drives channels; it owns the per-channel queues of transfers.
 */
#ifndef RT_DIST_CHAN_H
#define RT_DIST_CHAN_H

#include "core/status.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_xfer rt_xfer;

/* One direction of a shm ring: the producer advances head, the consumer tail
 * (both count bytes since the start; the data index is value % cap). */
typedef struct rt_shm_ring {
    _Atomic uint64_t head;
    char pad0[56];
    _Atomic uint64_t tail;
    char pad1[56];
} rt_shm_ring;

/* Per-rank wake-up word in shared memory: peers bump seq when they produce data for
 * or consume data from this rank, and futex-wake it only while it sleeps. */
typedef struct rt_shm_bell {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiting;
    char pad[56];
} rt_shm_bell;

typedef struct rt_chan {
    int peer; /* world rank */
    int fd;   /* tcp data socket, or the shm control socket; -1 for self */
    bool shm;
    /* tcp receive staging: valid bytes are stage[st_tail, st_head) */
    uint8_t *stage;
    size_t st_cap, st_head, st_tail;
    bool eof;
    /* shm */
    rt_shm_ring *tx, *rx;
    uint8_t *txd, *rxd;
    size_t cap;             /* ring capacity (power of two) */
    size_t piece;           /* bytes published per send step */
    rt_shm_bell *peer_bell; /* in its own mapping */
    void *seg;
    size_t seglen;
    /* engine queues (FIFO per direction) */
    rt_xfer *sq_head, *sq_tail, *rq_head, *rq_tail;
    bool send_blocked; /* tcp: the last send would block */
} rt_chan;

/* Move up to n bytes into the channel; *moved may be 0 (full). */
rt_status rt_chan_send(rt_chan *c, const void *p, size_t n, size_t *moved);
/* Bytes readable in place: *p, *avail (contiguous; 0 when nothing arrived). */
rt_status rt_chan_peek(rt_chan *c, const uint8_t **p, size_t *avail);
void rt_chan_consume(rt_chan *c, size_t n);
/* Copy up to n received bytes into dst. */
rt_status rt_chan_recv_into(rt_chan *c, void *dst, size_t n, size_t *moved);
void rt_chan_close(rt_chan *c);

/* shm wake-ups (see chan.c): ring after publishing (wakes only a sleeper), force
 * (always wakes: another thread of the same rank submitted work), wait (sleep while
 * seq == seen, at most timeout_ms; the caller set `waiting` and re-checked first). */
void rt_shm_bell_ring(rt_shm_bell *b);
void rt_shm_bell_force(rt_shm_bell *b);
void rt_shm_bell_wait(rt_shm_bell *b, uint32_t seen, int timeout_ms);

#endif
