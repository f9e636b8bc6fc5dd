/* ringtrain's communicator, modelled on torch.distributed.
 *
 * A process group (rt_pg) has a rank and a world size; sub-groups come from a list of
 * ranks (rt_pg_new_group). Point-to-point: rt_send/rt_recv and the non-blocking
 * rt_isend/rt_irecv returning a request (rt_wait, rt_test). Collectives: broadcast,
 * reduce, all_reduce, scatter, gather, all_gather (into one buffer or a list),
 * reduce_scatter, barrier; ops SUM AVG PRODUCT MIN MAX over f32 f64 i32 i64. Every
 * collective blocks by default; rt_i* variants return a request. Buffers are host
 * pointers + element count + dtype (device buffers: see docs/dist.md).
 *
 * All ranks of a group must call the same collectives in the same order with the same
 * sizes (as in torch); a mismatch is detected (every message carries the operation,
 * the group, a sequence number and its length) and reported as RT_ERR_PEER. Every
 * blocking call has a timeout (rt_pg_options.timeout_s, default 300 s); a dead peer
 * or a timeout is an error naming the peer rank and the operation, and breaks the
 * group (later calls fail at once). Non-member ranks get NULL from rt_pg_new_group.
 *
 * Example (the PyTorch tutorial's):
 *     rt_pg_options o; rt_pg_options_default(&o);      // env:// as under torchrun
 *     rt_pg *pg; RT_CHECK(rt_pg_init(&o, &pg));
 *     float t = rt_pg_rank(pg) == 0 ? 1.0f : 0.0f;
 *     if (rt_pg_rank(pg) == 0) RT_CHECK(rt_send(pg, &t, 1, RT_F32, 1));
 *     else if (rt_pg_rank(pg) == 1) RT_CHECK(rt_recv(pg, &t, 1, RT_F32, 0));   // t == 1.0
 */
#ifndef RT_DIST_DIST_H
#define RT_DIST_DIST_H

#include "core/status.h"
#include "core/info.h"
#include "core/device.h"
#include "core/tensor.h"
#include "dist/reduce.h"
#include "dist/store.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_pg rt_pg;
typedef struct rt_request rt_request;

typedef enum rt_transport {
    RT_TRANSPORT_AUTO = 0, /* shm when all ranks share a host, else tcp */
    RT_TRANSPORT_TCP,
    RT_TRANSPORT_SHM,
    RT_TRANSPORT_NCCL, /* device buffers on distinct GPUs (CUDA builds) */
    RT_TRANSPORT_COUNT_
} rt_transport;

typedef enum rt_algo {
    RT_ALGO_RING = 0, /* chunked, pipelined reduce-scatter + all-gather */
    RT_ALGO_NAIVE,    /* reduce to rank 0, then broadcast */
    RT_ALGO_RSAG,     /* reduce_scatter, then all_gather, not overlapped */
    RT_ALGO_NCCL,     /* NCCL's own all-reduce (nccl transport) */
    RT_ALGO_COUNT_
} rt_algo;

/* Names are lowercase ("shm", "ring"); parsing is rt_names_parse of these tables
 * (core/names.h), which also list them in dist.transport's and dist.algo's errors,
 * `ringtrain train --help` and the check of docs/config.md. */
extern const rt_names rt_transport_names, rt_algo_names;
const char *rt_transport_name(rt_transport t);
rt_status rt_transport_parse(const char *text, rt_transport *out);
/* True when transport t, as built, carries host (CPU) buffers: auto and the byte-stream
 * transports of the table (tcp, shm); false for a device-only one (nccl), one not in
 * this build, or a value out of range. */
bool rt_transport_takes_host(rt_transport t);
const char *rt_algo_name(rt_algo a);
rt_status rt_algo_parse(const char *text, rt_algo *out);

/* Where this process stands in the job, read from the environment before any process
 * group exists, so that a program picks its device first:
 *
 *     rt_dist_env env; RT_CHECK(rt_dist_env_read(&env));
 *     rt_device dev;   RT_CHECK(rt_device_select("auto", env.local_rank, &dev));
 *     rt_pg_options o; rt_pg_options_default(&o); o.device = dev;
 *
 * Launchers, in this order of precedence (the first one with any of its variables set
 * gives every field; the others are not read):
 *   torchrun / ringtrain   RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
 *   Open MPI (mpirun)      OMPI_COMM_WORLD_RANK _SIZE _LOCAL_RANK _LOCAL_SIZE
 *   Slurm (srun)           SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE
 * A field whose variable is unset is -1. A variable that is set but is not an integer in
 * range (rank < world size, local rank < local world size) is RT_ERR_INVALID naming the
 * variable; so is a rank without its world size or the reverse (the launcher sets both;
 * the local pair is optional). With no launcher variables at all: RT_OK, launcher NULL, every field -1. */
typedef struct rt_dist_env {
    int rank, world_size, local_rank, local_world_size;
    const char *launcher;    /* "torchrun", "openmpi", "slurm", or NULL: none */
    const char *rank_source; /* the variable that gave the rank ("RANK", ...), or NULL */
} rt_dist_env;
rt_status rt_dist_env_read(rt_dist_env *out);

typedef struct rt_pg_options {
    const char *init_method; /* "env://" (default), "tcp://host:port", "file:///path" */
    int rank, world_size;    /* -1: from the environment */
    rt_transport transport;
    rt_algo algo;     /* all_reduce algorithm */
    double timeout_s; /* every blocking call; default: RINGTRAIN_DIST_TIMEOUT, else 300 */
    /* where the buffers live (rt_pg_set_buffer_device). With a CUDA device and transport
     * auto, the group uses nccl when every rank has its own GPU, else shm/tcp with
     * staging through pinned host memory. The nccl transport runs on this GPU (pick it
     * with rt_device_select(want, env.local_rank, ...), see rt_dist_env_read). Default:
     * the CPU. */
    rt_device device;
    /* the flight recorder keeps the group's last this many operations (each sub-group
     * too); 0 disables it. Default: RINGTRAIN_FLIGHT_ENTRIES, else 512. */
    int flight_entries;
    /* debug mode: every collective's fingerprint (sequence number, operation, reduce op,
     * dtype, count, root) is compared across the group's ranks through the store before
     * it runs; a mismatch fails the call on every rank with a desync error naming both
     * calls. Default: RINGTRAIN_DIST_DEBUG when set, else true with
     * TORCH_DISTRIBUTED_DEBUG=DETAIL, else false (docs/dist.md, "Hangs and desyncs"). */
    bool debug;
} rt_pg_options;

/* Fill `o` with the defaults; those an environment variable sets come from core/settings.h
 * (docs/settings.md). A bad value of one is RT_ERR_INVALID naming it (`o` is then filled
 * with what could be read). */
rt_status rt_pg_options_default(rt_pg_options *o);
/* Rendezvous, then connect every pair of ranks. Collective over all ranks. */
rt_status rt_pg_init(const rt_pg_options *o, rt_pg **out);
/* World group: says goodbye through the store, closes everything. Sub-group: frees it
 * (call before destroying the world group). NULL is a no-op. */
void rt_pg_destroy(rt_pg *pg);

int rt_pg_rank(const rt_pg *pg);
int rt_pg_size(const rt_pg *pg);
int rt_pg_local_rank(const rt_pg *pg);
/* World rank of group rank r. */
int rt_pg_world_rank(const rt_pg *pg, int r);
rt_transport rt_pg_transport(const rt_pg *pg);
rt_algo rt_pg_algo(const rt_pg *pg);
void rt_pg_set_algo(rt_pg *pg, rt_algo a);
/* Where the buffers given to this group's operations live (default: host memory).
 * With the nccl transport every buffer is a device pointer on the rank's GPU. With
 * tcp/shm and a CUDA device, all_reduce and broadcast stage through pinned host
 * memory (ranks sharing one GPU); other operations need host buffers. */
rt_status rt_pg_set_buffer_device(rt_pg *pg, rt_device d);
/* The stream contract (device buffers; docs/dist.md, "Streams"). `stream` is the
 * caller's stream, the one that produces and consumes the buffers (e.g. the model's).
 * Every later operation of this group on device buffers is ordered after the work
 * already enqueued on it when the call is made (an event recorded there; the
 * communication stream waits on it). Completion: a blocking call has completed, device
 * included, when it returns; a request is waited for by the host (rt_wait, rt_test) or by
 * a stream (rt_wait_stream). NULL (the default): no stream, so the caller must have
 * finished the producing work itself (e.g. rt_stream_sync). Host buffers and CPU streams
 * are not affected. Sub-groups created afterwards inherit it. */
void rt_pg_set_stream(rt_pg *pg, rt_stream *stream);
rt_stream *rt_pg_stream(const rt_pg *pg);
/* The rendezvous store (e.g. to exchange the NCCL unique id). */
rt_store *rt_pg_store(rt_pg *pg);

/* A group of the listed ranks (of `pg`, in that order; new group rank i = ranks[i]).
 * Every rank of `pg` must call it, in the same order as other new_group calls (as in
 * torch). Non-members get *out == NULL. Shares the parent's connections. */
rt_status rt_pg_new_group(rt_pg *pg, const int *ranks, int n, rt_pg **out);

/* ---- point-to-point (ranks are group ranks) ---- */
rt_status rt_send(rt_pg *pg, const void *buf, size_t count, rt_dtype dtype, int dst);
rt_status rt_recv(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int src);
rt_status rt_isend(rt_pg *pg, const void *buf, size_t count, rt_dtype dtype, int dst, rt_request **req);
rt_status rt_irecv(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int src, rt_request **req);

/* Wait for a request and free it (its error, if any, becomes this thread's). */
rt_status rt_wait(rt_request *req);
/* *done: finished (still call rt_wait to free it). Never blocks. */
rt_status rt_test(rt_request *req, bool *done);
/* Make `stream` wait for the request's completion on the device, without blocking the
 * host, and free the request: work enqueued on `stream` afterwards sees the result. The
 * part of an operation that runs on the host (the ring of a staged operation) is waited
 * for on the host first; with a NULL or CPU stream this is rt_wait. Errors found later
 * (a dead peer, the timeout) abort the communicator (so the stream does not hang) and
 * make the group's next call fail. */
rt_status rt_wait_stream(rt_request *req, rt_stream *stream);

/* ---- collectives (blocking; the rt_i* forms return a request) ---- */
/* In place: buf of count elements, root's contents end up everywhere. */
rt_status rt_broadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root);
/* In place at the root; other ranks' buffers are left unchanged. */
rt_status rt_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, int root);
/* In place; bitwise identical on every rank. Algorithm: the group's (rt_pg_set_algo). */
rt_status rt_all_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op);
rt_status rt_all_reduce_algo(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, rt_algo algo);
/* send (root only): size*count elements, chunk i to rank i; recv: count elements. */
rt_status rt_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root);
/* send: count elements; recv (root only): size*count, rank i's at chunk i. */
rt_status rt_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root);
/* recv: size*count elements on every rank (may contain send at chunk rank). */
rt_status rt_all_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype);
/* recv_list: size buffers of count elements each. */
rt_status rt_all_gather_list(rt_pg *pg, const void *send, void *const *recv_list, size_t count, rt_dtype dtype);
/* send: size*count elements; recv: count elements, the reduction of every rank's chunk `rank`. */
rt_status rt_reduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op);
rt_status rt_barrier(rt_pg *pg);

rt_status rt_ibroadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root, rt_request **req);
rt_status rt_ireduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, int root, rt_request **req);
rt_status rt_iall_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, rt_request **req);
rt_status rt_iscatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                      rt_request **req);
rt_status rt_igather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root, rt_request **req);
rt_status rt_iall_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_request **req);
rt_status rt_ireduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op,
                             rt_request **req);
rt_status rt_ibarrier(rt_pg *pg, rt_request **req);

/* ---- flight recorder (docs/dist.md, "Flight recorder") ----
 * Every group records its last rt_pg_options.flight_entries operations (collectives and
 * point-to-point, blocking and asynchronous): sequence number, operation, dtype, count,
 * root/peer, algorithm, state (queued, started, done, failed) and times. This writes them
 * as JSON to `path` (written under path.tmp, then renamed), oldest first. Safe to call
 * while asynchronous operations are in flight (the progress thread keeps recording). */
rt_status rt_pg_flight_dump(rt_pg *pg, const char *path);
/* Context the recorder keeps with every following operation of the group, shown in the
 * flight files and in hang and desync diagnoses (e.g. "step 212"); NULL or "" clears it.
 * At most 63 bytes are kept. */
void rt_pg_set_tag(rt_pg *pg, const char *tag);
/* The same for the next operation only, put before the context (e.g. "bucket 3 of 6"). */
void rt_pg_set_op_tag(rt_pg *pg, const char *tag);

/* ---- CUDA graphs (docs/dist.md, "CUDA graphs") ----
 * A group's device operations can be captured into a CUDA graph with the rest of a step
 * (core/device.h: rt_stream_capture_begin .. _end, rt_graph_launch) where its transport
 * runs them on the device alone: nccl. While the group's stream (rt_pg_set_stream)
 * captures, an operation is recorded into the graph, not run: it has no flight recorder
 * entry, no sequence number and no watchdog entry then, and only rt_wait_stream may take
 * its request (on the capturing stream: the join, on the device); rt_wait and rt_test on
 * it, and blocking calls, are errors. Each replay runs it again with the buffers'
 * contents at the replay.
 *
 *     rt_pg_set_stream(pg, s);                        // the stream being captured
 *     RT_CHECK(rt_stream_capture_begin(s));
 *     RT_CHECK(rt_pg_capture_begin(pg));
 *     ... rt_iall_reduce(pg, ...); rt_wait_stream(req, s); ...   (e.g. the reducer)
 *     RT_CHECK(rt_pg_capture_end(pg, &pgg));
 *     RT_CHECK(rt_stream_capture_end(s, &graph));
 *     each step: RT_CHECK(rt_graph_launch(graph, s)); RT_CHECK(rt_pg_graph_launched(pg, pgg, s));
 *
 * Whether this group's device operations can be captured: true for nccl (world group,
 * device buffers); false for host buffers, tcp and shm (they stage device buffers
 * through the host) and sub-groups; `why` (may be NULL) then says so in a sentence. */
bool rt_pg_capturable(const rt_pg *pg, char *why, size_t n);
/* From capture_begin to capture_end the group notes each operation captured (operation,
 * dtype, count, root, reduce op, algorithm and its rt_pg_set_op_tag) in an rt_pg_graph.
 * begin: RT_ERR_UNSUPPORTED with the reason when not capturable; RT_ERR_INVALID when
 * capturing already. The operations' stream is the group's at each call (the reducer
 * sets its own around its calls). Between them every operation must be
 * captured (the group's stream capturing: else an error naming the call), and an
 * operation on a capturing stream without capture_begin is an error naming the call.
 * end: *out the graph (free it with rt_pg_graph_free); an error when a captured
 * request was not joined (rt_wait_stream). The capture ends either way. */
typedef struct rt_pg_graph rt_pg_graph;
rt_status rt_pg_capture_begin(rt_pg *pg);
rt_status rt_pg_capture_end(rt_pg *pg, rt_pg_graph **out);
/* Call right after each rt_graph_launch(graph, s) of a graph holding g's operations (from
 * the thread that issues the group's operations): enters them in the flight recorder as
 * if they had just been called (sequence numbers advancing, tag: each one's op tag, then
 * the group's tag now), in debug mode first compares them across the ranks, records one
 * event on s behind the graph and hands it to the watchdog with the group's timeout. A
 * dead peer or the timeout during the replay aborts the communicator and breaks the group
 * (its next call fails with the usual error); the entries end with the event. An error
 * when the group is broken already (the replay then does nothing on the device). */
rt_status rt_pg_graph_launched(rt_pg *pg, const rt_pg_graph *g, rt_stream *s);
/* Call right before each launch: the group's error when it is broken already (an earlier
 * replay's dead peer or timeout aborted the communicator), so that no graph holding its
 * operations is launched on an aborted communicator. RT_OK otherwise. */
rt_status rt_pg_graph_launchable(rt_pg *pg);
/* The number of operations g holds (0 for NULL). */
int rt_pg_graph_ops(const rt_pg_graph *g);
/* NULL is a no-op. Free it before its group. */
void rt_pg_graph_free(rt_pg_graph *g);

/* The libraries src/dist links (NCCL), for `ringtrain info`. */
int rt_dist_lib_versions(rt_lib_version *out, int cap);

#ifdef __cplusplus
}
#endif

#endif
