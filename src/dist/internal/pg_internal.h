/* Process-group internals shared by pg.c, collectives.c, staging.c and the transports
 * (transport.h). */
#ifndef RT_DIST_PG_INTERNAL_H
#define RT_DIST_PG_INTERNAL_H

#include "dist/dist.h"
#include "dist/internal/engine.h"
#include "dist/internal/flight.h"
#include "dist/internal/names.h"
#include "dist/internal/rendezvous.h"
#include "dist/internal/transport.h"

typedef struct rt_pg_world {
    rt_engine eng;
    rt_rdzv rdzv;
    rt_store *store;
    rt_store_server *server;
    uint8_t token[RT_TOKEN_BYTES];
    char tokhex[2 * RT_TOKEN_BYTES + 1];
    int next_group;
    rt_flight_cell *cell; /* the world group's shared recorder page (flight.h), NULL: none */
    int cell_fd;
    int (*cellref)[2];            /* [world]: the pid and fd of each rank's page on this host ({0, 0}: none) */
    void *op_state;               /* a whole-operation transport's state (nccl), NULL: none */
    size_t allreduce_small_bytes; /* RINGTRAIN_ALLREDUCE_SMALL_BYTES, read at init */
} rt_pg_world;

/* One pinned host buffer of the staging pool (device buffers over tcp/shm). `ev` is
 * the last copy back to the device out of it: the buffer is reused only after it. */
typedef struct rt_stage_buf {
    void *p;
    size_t bytes;
    bool pinned, busy;
    rt_event *ev;
} rt_stage_buf;

struct rt_pg {
    rt_pg_world *w;
    rt_device buf_device; /* where collective buffers live (see rt_pg_set_buffer_device) */
    rt_stream *stream;    /* the caller's stream (rt_pg_set_stream); NULL: none */
    /* staging of device buffers over tcp/shm: a copy stream, the event that orders it
     * after the caller's stream, and the pool of pinned buffers (one per operation in
     * flight) */
    rt_stream *stage_stream;
    rt_event *stage_ev_in;
    rt_stage_buf *stage;
    int nstage;
    bool is_world;
    int rank, size; /* in this group */
    int *ranks;     /* group rank -> world rank */
    int id;
    uint32_t seq;
    double timeout_s;
    rt_algo algo;
    rt_transport transport;                         /* tp->kind */
    const rt_transport_ops *tp;                     /* runs this group's operations (transport.h) */
    rt_flight flight;                               /* this group's last operations (flight.h) */
    bool has_flight;                                /* flight initialised (destroy it) */
    char tag[RT_FLIGHT_TAG], op_tag[RT_FLIGHT_TAG]; /* rt_pg_set_tag, rt_pg_set_op_tag */
    uint32_t *p2p_n;                                /* [2 * size]: messages sent to / received from each peer */
    bool debug;                                     /* rt_pg_options.debug */
    /* debug mode: the sequence numbers of this rank's keys in the store (its last check
     * that passed, and the checks after it) */
    uint32_t debug_keys[8];
    int ndebug_keys;
    /* world group: the peers' shared pages as the last slow check read them (a peer may
     * exit before this rank's own timeout reads them again) */
    rt_flight_state_rec *cell_cache;
    /* guards cell_cache: the progress thread, the main thread (dev_wait) and the nccl
     * watchdog may run rt_pg_slow_check at once; diagnose_flight reads it (world group) */
    pthread_mutex_t cache_mu;
    /* CUDA graphs (pg_graph.c): the graph being captured (rt_pg_capture_begin; NULL:
     * none) and its requests not yet joined to a stream (rt_wait_stream) */
    rt_pg_graph *capture;
    int capture_open;
};

/* Host identity: hostname | boot id | network namespace (ranks with equal ids share
 * memory). */
void rt_dist_host_id(char *buf, size_t n);

/* One operation as the transports see it (collectives.c fills it from the public call). */
typedef struct rt_op {
    int kind;         /* rt_comm_kind */
    bool is_send;     /* RT_K_P2P: this side sends */
    const void *send; /* in-place operations: send == recv */
    void *recv;
    size_t count;
    rt_dtype dtype;
    rt_reduce_op rop; /* reducing operations */
    int root;         /* the root; for RT_K_P2P the peer (group ranks) */
    rt_algo algo;     /* RT_K_ALLREDUCE */
    rt_event *gate;   /* staging: no transfer starts before this device event (the copy to the host) */
    bool captured;    /* enqueued into the CUDA graph the group's stream is capturing (pg_graph.c) */
} rt_op;

/* Hangs and desyncs (hangs.c): debug mode's check of one collective's fingerprint across
 * the group before it runs; the engine's hook for a wait that is slow (a quarter of the
 * timeout, at most 10 s). */
rt_status rt_pg_debug_check(rt_pg *pg, const rt_flight_fp *fp);
/* Publish this group's state to the store and compare it with the others'. A desync
 * found returns RT_ERR_PEER with the report. */
rt_status rt_pg_slow_check(rt_pg *pg);
double rt_pg_slow_after_s(double timeout_s);
/* The engine's hooks (hangs.c): on_slow runs rt_pg_slow_check for the request's group;
 * on_fail publishes the failing rank's state, diagnoses and records the group's first
 * failure in the store (ctx: the rt_pg_world). */
rt_status rt_pg_on_slow(void *owner);
void rt_pg_report_failure(void *ctx, rt_error_record *rec);
/* The world's shared recorder page (flight.h): create this rank's and publish it (best
 * effort), and read rank j's reference when it is on this host (at init). */
void rt_pg_cell_create(rt_pg_world *w, int rank);
void rt_pg_cell_ref(rt_pg_world *w, int j);

/* Wait until key "<prefix><j>" exists in the store for every rank j < world, polling;
 * a rank that never arrives within timeout_s is named (`what` says which wait). */
rt_status rt_pg_wait_ranks(rt_store *st, const char *prefix, int world, double timeout_s, const char *what);

/* A new request for `op` (built into transfers when `build`), recorded in the group's
 * flight recorder and submitted (driven by the progress thread when `async` and it has
 * transfers), not waited for; `dev_part`: it ends with its device part. Whatever fails,
 * it is freed (collectives.c). */
rt_status rt_pg_submit_req(rt_pg *pg, const char *name, const rt_op *op, bool build, bool async, bool dev_part,
                           rt_request **out);

/* CUDA graphs (pg_graph.c). Whether an operation `name` issued now is captured (the
 * group's stream captures): an error when it may not be (no rt_pg_capture_begin, a
 * blocking call, a transport that cannot be captured, or a capture begun while the stream
 * does not capture). */
rt_status rt_pg_capture_check(rt_pg *pg, const char *name, bool async, bool *captured);
/* Note a captured operation in the group's graph (flight algorithm name, its op tag). */
rt_status rt_pg_capture_note(rt_pg *pg, const rt_op *op, const char *algo, const char *op_tag);
/* A captured request is gone: joined to a stream (rt_wait_stream), or (`unnote`) its
 * enqueue failed and the graph does not hold it. */
void rt_pg_capture_forget(rt_pg *pg, bool unnote);

/* Frees the staging pool and its stream (staging.c). */
void rt_stage_pool_free(rt_pg *pg);

#endif
