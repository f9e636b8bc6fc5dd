/* The progress engine: transfers, requests, and who drives them.
 *
 * Every operation (a send, a receive, a whole collective) becomes a request holding a
 * few transfers. A transfer moves one message (a 24-byte header, then the body) over
 * one channel; a receive either copies the body or reduces it element by element
 * into the destination as the bytes arrive (in place from the shm ring). A transfer
 * may depend on another one: it moves only as many bytes as its dependency has
 * finished (streaming: the ring all-reduce forwards a slice as soon as it is reduced)
 * or only after it completed (full). Transfers queue per channel and direction in
 * submission order, so all ranks see the same order on every stream.
 *
 * Driving: a blocking call drives progress itself in the calling thread (no thread
 * hand-off, lowest latency); asynchronous requests are driven by a progress thread
 * started on first use. Only one thread drives at a time; the others wait on a
 * condition variable. Every request has a deadline; a timeout or a dead peer breaks
 * the engine: all pending requests fail with a message naming the peer and the
 * operation, and all sockets are shut down so that the peers fail fast too.
 */
#ifndef RT_DIST_ENGINE_H
#define RT_DIST_ENGINE_H

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"
#include "dist/internal/chan.h"
#include "dist/reduce.h"
#include "dist/internal/wire.h"

#include <pthread.h>

typedef struct rt_engine rt_engine;
typedef struct rt_request rt_request;

struct rt_xfer {
    rt_chan *ch;
    rt_request *req;
    bool is_send;
    bool complete;
    uint8_t *buf;
    size_t nbytes, done;
    rt_msg_hdr hdr; /* expected (recv) or sent (send) */
    uint8_t hbuf[RT_MSG_HDR];
    size_t hdone;
    size_t pad, pdone; /* zero bytes after the body: every message is 8-byte aligned in the stream */
    /* recv: reduce (op >= 0) or copy (op < 0) */
    int op;
    rt_dtype dtype;
    size_t esize;
    int avg_div;                 /* > 0: divide after this final reduction */
    _Alignas(8) uint8_t part[8]; /* an element split across reads, aligned for the kernels */
    size_t part_n;
    /* dependency */
    const rt_xfer *dep;
    bool dep_full;
    rt_xfer *qnext;
};

/* The device part of a request (streams: docs/dist.md). Some requests end on a device
 * stream after their host part (the transfers above) is done: a nccl operation (no host
 * part at all) or a staged one (the copy back to the device buffer). The transport
 * that creates it fills rt_request.dev; rt_test / rt_wait / rt_wait_stream (pg.c) run
 * the host part to completion first, then these. Tests may install a fake. */
typedef struct rt_req_dev_ops {
    /* One non-blocking look: *done when the device part has completed. An error (a
     * failed or timed-out operation) is returned, and is final. */
    rt_status (*poll)(rt_request *r, bool *done);
    /* Make stream `s` wait for the device part on the device (no host wait). */
    rt_status (*stream_wait)(rt_request *r, rt_stream *s);
    /* Free the device part (rt_req_free). May hand unfinished work to its transport,
     * which keeps watching it. */
    void (*release)(rt_request *r);
} rt_req_dev_ops;

typedef struct rt_post_copy {
    void *dst;
    const void *src;
    size_t n;
} rt_post_copy;

struct rt_request {
    rt_engine *eng;
    const char *opname;
    int group;
    rt_xfer *x;
    int nx, capx;
    int pending;
    bool done, submitted, async;
    rt_status status;
    rt_error_record err;
    uint64_t deadline_ns;
    double timeout_s;
    void *scratch;
    rt_post_copy posts[4];
    int nposts;
    /* post-reduce (small all-reduce): buf = slot 0 op slot 1 op ... (rank order) */
    void *pr_buf;
    const uint8_t *pr_slots;
    int pr_n, pr_op;
    size_t pr_count;
    rt_dtype pr_dtype;
    rt_request *next; /* active list */
    /* NULL, or a device event no transfer of this request may start before (staging:
     * the copy of the device buffer into the pinned one); the engine polls it, so the
     * thread that submitted does not wait for the device */
    rt_event *gate;
    bool gate_open;
    /* device part (NULL: none); dev_done once it has completed */
    const rt_req_dev_ops *dev;
    void *dev_ctx;
    bool dev_done;
    rt_status dev_status;
    rt_error_record dev_err;
    /* the flight recorder entry of this operation (flight.h; fr NULL or fr_id 0: none).
     * fr_dev: it ends with its device part (dev_poll in pg.c), not with the host part */
    struct rt_flight *fr;
    uint64_t fr_id;
    bool fr_dev;
    /* enqueued into a CUDA graph being captured (pg_graph.c): only rt_wait_stream may
     * take it (on the device); nothing to poll or watch, no recorder entry */
    bool captured;
    /* hangs and desyncs: the group that submitted it (NULL: none), and after how many
     * seconds a wait in it is slow (0: never): the engine then calls on_slow */
    void *owner;
    double slow_s;
    uint64_t slow_ns;
};

struct rt_engine {
    int rank, world;
    uint64_t spin_ns; /* spin this long before yielding or sleeping (RINGTRAIN_SHM_SPIN_US) */
    rt_chan *ch;      /* [world] */
    /* the transport the engine waits through (its setup installs it; NULL: no peers) and
     * its engine-wide state (shm: this rank's wake-up word) */
    const rt_transport_ops *tp;
    void *tp_state;
    int evfd; /* written by every wake-up (tcp polls it) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool driving;
    rt_request *active;
    bool broken;
    rt_error_record err;
    pthread_t thread;
    bool thread_started, stop;
    int nasync; /* async requests not yet complete */
    /* called once, on the first failure, before the sockets are shut down; may amend
     * the record (the process group reports it through the store) */
    void (*on_fail)(void *ctx, rt_error_record *rec);
    void *on_fail_ctx;
    int fail_peer; /* at the failure: the peer of the first unfinished receive (-1: none) */
    /* a request has waited past its slow_ns: called with its owner, at most once a second,
     * by the driving thread with mu released (e->driving stays set); an error (a desync
     * found) breaks the engine with it */
    rt_status (*on_slow)(void *owner);
    uint64_t slow_next_ns;
    int mismatch_peer;  /* the failure is a header that did not match (-1: no) */
    void *fail_owner;   /* at the failure: the group of the first active request (NULL: none) */
    bool peers_aborted; /* rt_engine_abort_peers ran */
};

rt_status rt_engine_init(rt_engine *e, int rank, int world);
void rt_engine_destroy(rt_engine *e);

/* Request building (not yet submitted). */
/* maxx: the most transfers it will hold (pointers to them stay valid). */
rt_status rt_req_new(rt_engine *e, const char *opname, int group, double timeout_s, int maxx, rt_request **out);
void rt_req_free(rt_request *r);
/* Add a send / receive; returns the transfer (stable pointer), or NULL on no memory
 * (the request records the error). peer: world rank. */
rt_xfer *rt_req_send(rt_request *r, int peer, const void *buf, size_t nbytes, uint16_t kind, uint32_t seq,
                     const rt_xfer *dep, bool dep_full);
rt_xfer *rt_req_recv(rt_request *r, int peer, void *buf, size_t nbytes, uint16_t kind, uint32_t seq, int op,
                     rt_dtype dtype, int avg_div, const rt_xfer *dep, bool dep_full);
rt_status rt_req_post_copy(rt_request *r, void *dst, const void *src, size_t n);

/* Queue the transfers. Async requests are then driven by the progress thread. */
rt_status rt_req_submit(rt_request *r, bool async);
/* Wait for completion (driving progress if nobody else does). Does not free. */
rt_status rt_req_wait(rt_request *r);
/* Non-blocking: one progress pass if nobody drives; *done says whether it finished. */
rt_status rt_req_test(rt_request *r, bool *done);

/* One progress pass over every channel (mu held): *moved_any when something moved.
 * For transports' sleep (transport.h), which re-checks before sleeping. */
rt_status rt_engine_pass(rt_engine *e, bool *moved_any);

/* Fail the engine with the calling thread's current error. */
void rt_engine_fail(rt_engine *e);
/* Shut every peer connection down (the transport's abort first: shm writes an "aborted"
 * byte) so that the peers fail fast; once (rt_engine_fail does it after on_fail; on_fail may do it earlier). */
void rt_engine_abort_peers(rt_engine *e);

#endif
