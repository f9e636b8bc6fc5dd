/* A transport is one file filling one table (rt_transport_ops), in the spirit of NCCL's
 * `struct ncclTransport`: the engine, the channels and collectives.c call through it and
 * never ask which transport they run on.
 *
 * Two kinds fill it:
 * - byte-stream transports (transport_tcp.c, transport_shm.c): the engine (engine.h)
 *   drives their channels (send, peek, consume, recv, close, abort) and waits through
 *   them (sleep, wake); operations are transfer graphs (collectives.c) over any of them,
 *   and device buffers go through the staging wrapper (staging.c);
 * - whole-operation transports (cuda/nccl.c): `run` enqueues the operation itself; the
 *   channel and engine entries are NULL.
 *
 * Every world is first connected by the rendezvous' tcp mesh (pg.c): one socket per
 * pair, the data path of tcp and the control line of shm. transports.c holds the list of
 * tables and the `auto` choice.
 */
#ifndef RT_DIST_TRANSPORT_H
#define RT_DIST_TRANSPORT_H

#include "core/status.h"
#include "dist/dist.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_chan rt_chan;
typedef struct rt_engine rt_engine;
typedef struct rt_op rt_op;
typedef struct rt_pg_world rt_pg_world;

/* What the rendezvous learnt, for can_connect and setup. */
typedef struct rt_transport_setup {
    bool same_host;   /* every rank runs on this host (same host id: rt_dist_host_id) */
    double timeout_s; /* for the setup's own waits */
} rt_transport_setup;

typedef struct rt_transport_ops {
    const char *name; /* as rt_transport_name prints it */
    rt_transport kind;
    /* operations take device buffers (the group's device) only, never host memory */
    bool device_only;
    /* the flight recorder's algorithm name for its operations (it runs them whole); NULL:
     * the engine's transfer graphs, named by the algorithm */
    const char *algo;

    /* ---- setup (world group, after the rendezvous and the tcp mesh) ---- */
    /* RT_OK when it can connect this world; else an error saying why not
     * (RT_ERR_UNSUPPORTED: not available here, `auto` then tries the next one). */
    rt_status (*can_connect)(rt_pg *pg, const rt_transport_setup *s);
    /* Connect every peer (pg is the world group, its fields filled). On failure it frees
     * what it made, except channel state that the engine's close frees. */
    rt_status (*setup)(rt_pg *pg, const rt_transport_setup *s);
    /* Free the world's resources of a whole-operation transport (rt_pg_destroy); NULL: none. */
    void (*teardown)(rt_pg_world *w);

    /* ---- CUDA graphs (pg_graph.c; NULL: this transport's operations cannot be captured) ----
     * A graph holding `fr_n` of the group's operations was just launched on `s`; their
     * flight recorder entries are fr_first .. fr_first + fr_n - 1 (fr_first 0: none).
     * Record the graph's completion on s and watch it as any operation a stream waits
     * for (the timeout, a dead peer), ending the entries with it. */
    rt_status (*graph_launched)(rt_pg *pg, rt_stream *s, uint64_t fr_first, int fr_n);
    /* Bring the flight recorder up to date with what the device has completed (the
     * watchdog's polling, done now: a dump right after the host waited for a replay shows
     * its operations done). NULL: nothing to do. Never blocks on the device. */
    void (*flight_refresh)(rt_pg *pg);

    /* ---- one operation ---- */
    /* Run `op` on group pg: submitted and waited for (out NULL), or handed back in *out.
     * Whatever fails, nothing is left behind. */
    rt_status (*run)(rt_pg *pg, const char *name, const rt_op *op, rt_request **out);

    /* ---- channels (byte streams; NULL for whole-operation transports) ----
     * All non-blocking: they move what they can. */
    /* Move up to n bytes into the channel; *moved may be 0 (full). */
    rt_status (*send)(rt_chan *c, const void *p, size_t n, size_t *moved);
    /* Bytes readable in place: *p, *avail (contiguous; 0 when nothing arrived). */
    rt_status (*peek)(rt_chan *c, const uint8_t **p, size_t *avail);
    /* Release n bytes seen by peek. */
    void (*consume)(rt_chan *c, size_t n);
    /* Copy up to n received bytes into dst. */
    rt_status (*recv)(rt_chan *c, void *dst, size_t n, size_t *moved);
    /* Free the channel's state (its socket is the engine's). */
    void (*close)(rt_chan *c);
    /* Before the engine shuts the channel's socket down after a failure (NULL: nothing). */
    void (*abort)(rt_chan *c);

    /* ---- the engine's waits (engine.c, drive) ---- */
    /* After the spin (RINGTRAIN_SHM_SPIN_US), yield the processor a while before sleep. */
    bool yield_before_sleep;
    /* Nothing moved: sleep until the peers may have moved something, at most max_ms.
     * Called with the engine's mutex held (may drop it while sleeping); an error (a
     * peer gone) fails the engine. */
    rt_status (*sleep)(rt_engine *e, int max_ms);
    /* Wake a driver sleeping in `sleep` (another thread submitted work); may be NULL
     * (the engine's eventfd is always written). */
    void (*wake)(rt_engine *e);
    /* Free the engine-wide state (e->tp_state) at rt_engine_destroy; NULL: none. */
    void (*engine_close)(rt_engine *e);
} rt_transport_ops;

extern const rt_transport_ops rt_tp_tcp;
extern const rt_transport_ops rt_tp_shm;
#ifdef RT_HAVE_CUDA
extern const rt_transport_ops rt_tp_nccl;
#endif

/* The table of a transport; NULL when it is not built in (nccl without CUDA) or for auto. */
const rt_transport_ops *rt_transport_ops_of(rt_transport t);

/* Pick and connect the world group's transport (pg->tp): `o->transport`, or for auto shm
 * when every rank shares this host (else tcp), and with device buffers the first built
 * device transport that connects (else the host transport, with staging). */
rt_status rt_transport_connect(rt_pg *pg, const rt_pg_options *o, const rt_transport_setup *s);

/* tcp (transport_tcp.c): the rendezvous' mesh, one authenticated socket per pair (rank j
 * connects to every i < j); addrs[j] is rank j's "ip port". */
rt_status rt_tcp_mesh_connect(rt_pg_world *w, int lfd, char (*addrs)[80], double timeout_s);
/* tcp's setup on an engine: every peer channel with a socket (rt_chan.fd) reads and
 * writes it, and the engine waits in poll() (tests drive a bare engine with it). */
rt_status rt_tcp_attach(rt_engine *e);

/* shm (transport_shm.c): open a peer's segment through `path` (/proc/<pid>/fd/<n>, as
 * the peer published it) read-write into *fd, refused (RT_ERR_PEER) unless what opened
 * is a memfd named `memfd_name` of exactly `len` bytes: a reused pid can point at any
 * file of the same user. */
rt_status rt_shm_peer_open(const char *path, const char *memfd_name, size_t len, int *fd);

/* The paths a run takes (collectives.c, staging.c): transfers on the engine; an empty
 * request whose device part `enqueue` fills (whole-operation transports); host
 * transports' run: staged through pinned host memory when the buffers are on a device. */
rt_status rt_run_transfers(rt_pg *pg, const char *name, const rt_op *op, rt_request **out);
rt_status rt_run_enqueued(rt_pg *pg, const char *name, const rt_op *op, rt_request **out,
                          rt_status (*enqueue)(rt_pg *pg, const rt_op *op, rt_request *r));
rt_status rt_run_host(rt_pg *pg, const char *name, const rt_op *op, rt_request **out);

#endif
