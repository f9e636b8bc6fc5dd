/* The nccl transport (CUDA builds): device buffers on distinct GPUs. It fills the
 * transport table (transport.h, rt_tp_nccl) as a whole-operation transport: `run`
 * enqueues each operation on NCCL; it has no channels (the engine keeps the tcp mesh).
 *
 * Each rank runs on the group's buffer device (rt_pg_options.device, chosen by the
 * program, e.g. rt_device_select(want, local_rank)): the model and the communicator
 * share one GPU, never a guess of the transport's own. The ranks publish (host, PCI bus id)
 * through the store and refuse to start when two share a GPU (NCCL cannot; use tcp or
 * shm, which stage device buffers through pinned host memory). Rank 0's ncclUniqueId
 * travels through the store. Peers are world ranks; sub-groups are not supported on nccl.
 *
 * NCCL's rules for a non-blocking communicator (ncclConfig_t.blocking = 0), as applied here:
 * - every call that returns ncclInProgress is polled (ncclCommGetAsyncError) until it is
 *   no longer in progress before the next NCCL call (init, each enqueue, ncclGroupEnd);
 * - work that must follow a collective on the stream (the own chunk of scatter/gather)
 *   is enqueued only once ncclGroupEnd has completed, so it is behind the collective;
 * - ncclCommFinalize is polled to ncclSuccess before ncclCommDestroy (or, on an error
 *   or after the timeout, the communicator is aborted), and every result is checked;
 * - a failed init aborts the communicator it created, so the peers fail fast.
 *
 * Streams (docs/dist.md): an operation is ordered after the group's stream
 * (rt_pg_set_stream: an event recorded there, the communication stream waits on it) and
 * ends with an event on the communication stream: the request's device part. rt_test
 * and rt_wait poll that event and ncclCommGetAsyncError against the deadline (spinning,
 * then yielding; no fixed sleeps); rt_wait_stream makes a stream wait for the event and
 * hands it to a watchdog thread, which keeps polling it, so that a dead peer or the
 * timeout aborts the communicator (its kernels then end and no stream hangs) and breaks
 * the group even while the host is blocked elsewhere. On a failure or a timeout the
 * communicator is aborted (ncclCommAbort) and the group is broken. One mutex orders
 * every NCCL call of the communicator with the watchdog's abort.
 */
#include "core/cuda/cuda_check.h"
#include "core/log.h"
#include "core/spin.h"
#include "core/timer.h"
#include "dist/internal/bf16_cuda.h"
#include "dist/internal/pg_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

/* NCCL calls outside the communicator's life (ncclGetUniqueId): core's RT_CHECK_LIB shape. */
#define RT_CHECK_NCCL(expr)                                                                                            \
    RT_CHECK_LIB(expr, ncclResult_t, rt_e_ == ncclSuccess || rt_e_ == ncclInProgress, "NCCL", ncclGetErrorString)

/* a device completion waited for by a stream: the watchdog polls it */
typedef struct watched {
    cudaEvent_t ev;
    uint64_t deadline;
    const char *op;
    rt_flight *fr; /* the flight recorder entries it ends: fr_id .. fr_id + fr_n - 1 (fr NULL or fr_id 0: none) */
    uint64_t fr_id;
    int fr_n;
    rt_pg *owner;     /* the group (NULL: none): a wait past slow_at runs its desync check */
    uint64_t slow_at; /* docs/dist.md, "Hangs and desyncs" */
} watched;

typedef struct nccl_state {
    rt_pg_world *w;
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ev_in; /* recorded on the caller's stream; the communication stream waits on it */
    int device;
    int *flag_dev; /* barrier */
    /* bf16 all-reduce (bf16_all_reduce_locked): device scratch, grown by doubling; a
     * buffer outgrown may still be read by work on the stream, so it is kept until teardown */
    void *scratch;
    size_t scratch_bytes;
    void *retired[64];
    int nretired;
    double timeout_s;
    pthread_mutex_t mu; /* every NCCL call on comm, and the abort */
    bool aborting;      /* set before ncclCommAbort: completions seen after it may be cut short */
    bool in_group;      /* between our ncclGroupStart and ncclGroupEnd: a failure there ends the group first */
    bool capturing;     /* enqueuing a captured operation (rt_op.captured) */
    /* the watchdog */
    pthread_cond_t cv;
    watched *watch;
    int nwatch, capwatch;
    uint64_t slow_next; /* the next desync check of a slow watched operation (at most one a second) */
    pthread_t thread;
    bool thread_started, stop;
} nccl_state;

static nccl_state *st_of(rt_pg *pg) { return pg->w->op_state; }

/* Spin briefly, then give the processor away: a poll loop's pause between looks. */
static void poll_pause(unsigned i) {
    if (i < 2000)
        rt_cpu_relax();
    else
        sched_yield();
}

static bool group_broken(rt_pg_world *w, rt_error_record *rec) {
    pthread_mutex_lock(&w->eng.mu);
    bool b = w->eng.broken;
    if (b && rec) *rec = w->eng.err;
    pthread_mutex_unlock(&w->eng.mu);
    return b;
}

static rt_status broken_error(rt_pg_world *w, const char *op) {
    rt_error_record rec = {0};
    if (!group_broken(w, &rec)) snprintf(rec.msg, sizeof rec.msg, "the communicator was aborted");
    return RT_ERROR(RT_ERR_PEER, "%s: the process group is broken by an earlier error: %s", op, rec.msg);
}

/* Abort the communicator (once) and break the group with this error. st->mu held. */
static rt_status fail_locked(nccl_state *st, rt_status s, const char *op, const char *why) {
    if (st->in_group) { /* NCCL's group state is per thread: never leave it open */
        st->in_group = false;
        ncclResult_t g = ncclGroupEnd();
        if (g != ncclSuccess && g != ncclInProgress)
            RT_LOG_DEBUG("nccl: ncclGroupEnd after a failure in the group: %s", ncclGetErrorString(g));
    }
    if (!st->aborting && st->comm) {
        st->aborting = true;
        ncclResult_t a = ncclCommAbort(st->comm);
        if (a != ncclSuccess) RT_LOG_WARN("nccl: ncclCommAbort: %s", ncclGetErrorString(a));
        st->comm = NULL;
    }
    st->aborting = true;
    rt_status r = RT_ERROR(s, "%s over nccl: %s (communicator aborted)", op, why);
    rt_engine *e = &st->w->eng;
    pthread_mutex_lock(&e->mu);
    if (!e->broken) {
        e->broken = true;
        rt_error_save(&e->err);
    }
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* A CUDA call failed while enqueuing. Captured work runs nowhere yet, so no peer waits
 * in it: the capture fails (the caller's capture end says so), the communicator lives. */
static rt_status cuda_failed_locked(nccl_state *st, const char *op, const char *why) {
    if (st->capturing) return RT_ERROR(RT_ERR_CUDA, "%s over nccl, during a CUDA graph capture: %s", op, why);
    return fail_locked(st, RT_ERR_CUDA, op, why);
}

/* Poll until the communicator is no longer "in progress" (after a call returned
 * ncclInProgress, or after init). st->mu held. */
static rt_status wait_ready_locked(nccl_state *st, const char *op, uint64_t deadline) {
    for (unsigned i = 0;; i++) {
        if (!st->comm) return broken_error(st->w, op);
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(st->comm, &a);
        if (q != ncclSuccess) return fail_locked(st, RT_ERR_CUDA, op, ncclGetErrorString(q));
        if (a == ncclSuccess) return RT_OK;
        if (a != ncclInProgress) return fail_locked(st, RT_ERR_PEER, op, ncclGetErrorString(a));
        if (rt_now_ns() >= deadline) {
            char why[96];
            snprintf(why, sizeof why, "timed out after %.1f s (a peer is gone or stuck?)", st->timeout_s);
            return fail_locked(st, RT_ERR_TIMEOUT, op, why);
        }
        poll_pause(i);
    }
}

/* One NCCL call on the communicator (st->mu held): an error aborts; ncclInProgress is
 * polled to completion before anything else touches NCCL. */
#define NCALL(st, op, deadline, expr)                                                                                  \
    do {                                                                                                               \
        ncclResult_t rt_r_ = (expr);                                                                                   \
        if (rt_r_ == ncclInProgress)                                                                                   \
            RT_CHECK(wait_ready_locked((st), (op), (deadline)));                                                       \
        else if (rt_r_ != ncclSuccess)                                                                                 \
            return fail_locked((st), RT_ERR_CUDA, (op), ncclGetErrorString(rt_r_));                                    \
    } while (0)

/* A CUDA call while enqueuing on the communicator (st->mu held): the peers may already
 * wait in this operation, so a failure aborts the communicator like an NCCL failure
 * instead of leaving them to their timeout. */
#define CCALL(st, op, expr)                                                                                            \
    do {                                                                                                               \
        cudaError_t rt_c_ = (expr);                                                                                    \
        if (rt_c_ != cudaSuccess) {                                                                                    \
            (void)cudaGetLastError();                                                                                  \
            char rt_w_[200];                                                                                           \
            snprintf(rt_w_, sizeof rt_w_, "%s: %s", #expr, cudaGetErrorString(rt_c_));                                 \
            return cuda_failed_locked((st), (op), rt_w_);                                                              \
        }                                                                                                              \
    } while (0)

/* The communicator's asynchronous error, if any, as a failure (aborts). st->mu held. */
static rt_status async_error_locked(nccl_state *st, const char *op) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(st->comm, &a);
    if (q != ncclSuccess) return fail_locked(st, RT_ERR_CUDA, op, ncclGetErrorString(q));
    if (a != ncclSuccess && a != ncclInProgress) return fail_locked(st, RT_ERR_PEER, op, ncclGetErrorString(a));
    return RT_OK;
}

/* ---- the watchdog: device completions that a stream waits for ---- */

/* One look at every watched completion, and at the communicator. st->mu held. */
static void watch_pass_locked(nccl_state *st) {
    uint64_t now = rt_now_ns();
    rt_pg *slow_owner = NULL; /* a slow wait to check, after the pass, without the lock */
    const char *slow_op = NULL;
    for (int i = 0; i < st->nwatch;) {
        watched *x = &st->watch[i];
        cudaError_t e = cudaEventQuery(x->ev);
        /* complete, but a kernel cut short by a failed peer completes too: only a
         * communicator without an asynchronous error (looked at after the event) makes it a success */
        if (e == cudaSuccess && !st->aborting && st->comm) (void)async_error_locked(st, x->op);
        bool gone = e == cudaSuccess || st->aborting; /* done, or cut short by the abort */
        if (gone && x->fr_id)
            for (int k = 0; k < x->fr_n; k++)
                rt_flight_end(x->fr, x->fr_id + (uint64_t)k, e == cudaSuccess && !st->aborting);
        if (!gone && e == cudaErrorNotReady) {
            (void)cudaGetLastError();
            if (x->owner && now >= x->slow_at && now >= st->slow_next && !st->aborting) {
                /* slow: publish and compare the ranks' states (a desync aborts) */
                st->slow_next = now + 1000000000ull;
                slow_owner = x->owner;
                slow_op = x->op;
            }
            if (now >= x->deadline) {
                char why[128];
                snprintf(why, sizeof why, "timed out after %.1f s (a stream waited for it; a peer is gone or stuck?)",
                         st->timeout_s);
                (void)fail_locked(st, RT_ERR_TIMEOUT, x->op, why);
            }
        } else if (!gone) {
            (void)cudaGetLastError();
            (void)fail_locked(st, RT_ERR_CUDA, x->op, cudaGetErrorString(e));
        }
        if (gone) {
            cudaEventDestroy(x->ev);
            st->watch[i] = st->watch[--st->nwatch];
        } else {
            i++;
        }
    }
    if (st->nwatch > 0 && st->comm && !st->aborting) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(st->comm, &a);
        if (q != ncclSuccess)
            (void)fail_locked(st, RT_ERR_CUDA, st->watch[0].op, ncclGetErrorString(q));
        else if (a != ncclSuccess && a != ncclInProgress)
            (void)fail_locked(st, RT_ERR_PEER, st->watch[0].op, ncclGetErrorString(a));
    }
    if (slow_owner) {
        /* the check makes store requests (up to 2 s each): without st->mu, so that watch_add
         * and the waits on the main thread go on. The owner outlives its watched entries
         * (the group destroys this state, joining this thread, before it frees itself). */
        pthread_mutex_unlock(&st->mu);
        rt_status s = rt_pg_slow_check(slow_owner);
        char why[900] = "";
        if (s != RT_OK) snprintf(why, sizeof why, "%s", rt_error_message());
        pthread_mutex_lock(&st->mu);
        if (s != RT_OK && !st->aborting) (void)fail_locked(st, RT_ERR_PEER, slow_op, why);
    }
}

/* Looks every millisecond while something is watched (a failure detector, not a
 * waiter: nobody's latency depends on it), sleeps on the condition variable otherwise. */
static void *watchdog_main(void *arg) {
    nccl_state *st = arg;
    (void)cudaSetDevice(st->device);
    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        if (st->nwatch == 0) {
            pthread_cond_wait(&st->cv, &st->mu);
            continue;
        }
        watch_pass_locked(st);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&st->cv, &st->mu, &ts);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Hand a completion event to the watchdog (it destroys it). */
static void watch_add(nccl_state *st, cudaEvent_t ev, uint64_t deadline, const char *op, rt_flight *fr, uint64_t fr_id,
                      int fr_n, rt_pg *owner, uint64_t slow_at) {
    pthread_mutex_lock(&st->mu);
    bool ok = true;
    if (st->nwatch == st->capwatch) {
        int cap = st->capwatch ? 2 * st->capwatch : 16;
        watched *g = realloc(st->watch, sizeof *g * (size_t)cap);
        if (g) {
            st->watch = g;
            st->capwatch = cap;
        } else {
            ok = false;
        }
    }
    if (ok && !st->thread_started) {
        if (pthread_create(&st->thread, NULL, watchdog_main, st) == 0)
            st->thread_started = true;
        else
            ok = false;
    }
    if (ok) {
        st->watch[st->nwatch++] = (watched){ev, deadline, op, fr, fr_id, fr_n, owner, slow_at};
        pthread_cond_signal(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    if (!ok) { /* no watchdog: the host waits for it here instead */
        RT_LOG_WARN("nccl: cannot start the watchdog; waiting for %s on the host", op);
        for (unsigned i = 0; cudaEventQuery(ev) == cudaErrorNotReady; i++) poll_pause(i);
        (void)cudaGetLastError();
        cudaEventDestroy(ev);
        for (int k = 0; k < fr_n && fr_id; k++) rt_flight_end(fr, fr_id + (uint64_t)k, true);
    }
}

/* ---- a request's device part: the completion event ---- */

typedef struct nccl_done {
    nccl_state *st;
    cudaEvent_t ev;
    uint64_t deadline;
    const char *op;
} nccl_done;

static rt_status nccl_poll(rt_request *r, bool *done) {
    nccl_done *c = r->dev_ctx;
    nccl_state *st = c->st;
    *done = false;
    cudaError_t e = cudaEventQuery(c->ev);
    pthread_mutex_lock(&st->mu);
    rt_status s = RT_OK;
    if (st->aborting) { /* checked after the query: a completion may be the abort's doing */
        s = broken_error(st->w, c->op);
    } else if (e == cudaSuccess) {
        /* complete, but a kernel cut short by a failed peer completes too: only a
         * communicator without an asynchronous error makes it a success */
        s = async_error_locked(st, c->op);
        *done = s == RT_OK;
    } else if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        s = fail_locked(st, RT_ERR_CUDA, c->op, cudaGetErrorString(e));
    } else {
        (void)cudaGetLastError();
        s = async_error_locked(st, c->op);
        if (s == RT_OK && rt_now_ns() >= c->deadline) {
            char why[96];
            snprintf(why, sizeof why, "timed out after %.1f s (a peer is gone or stuck?)", st->timeout_s);
            s = fail_locked(st, RT_ERR_TIMEOUT, c->op, why);
        }
    }
    pthread_mutex_unlock(&st->mu);
    return s;
}

static rt_status nccl_stream_wait(rt_request *r, rt_stream *s) {
    nccl_done *c = r->dev_ctx;
    RT_CHECK_CUDA(cudaStreamWaitEvent((cudaStream_t)rt_stream_native(s), c->ev, 0));
    return RT_OK;
}

static void nccl_release(rt_request *r) {
    nccl_done *c = r->dev_ctx;
    if (!c) return;
    if (r->dev_done || r->captured) /* done, or a position in a graph (its launches are watched) */
        cudaEventDestroy(c->ev);
    else { /* a stream waits for it (or nobody did): the watchdog keeps an eye on it, and
            * its recorder entry stays open until the watchdog sees the completion (world
            * group only: a sub-group's recorder may be freed before) */
        rt_pg *pg = r->owner;
        bool own = r->fr_id && pg && pg->is_world;
        uint64_t slow_at = c->deadline - (uint64_t)((c->st->timeout_s - r->slow_s) * 1e9);
        watch_add(c->st, c->ev, c->deadline, c->op, own ? r->fr : NULL, own ? r->fr_id : 0, 1,
                  own && r->slow_s > 0 ? pg : NULL, slow_at);
        if (own) r->fr_id = 0;
    }
    free(c);
    r->dev_ctx = NULL;
}

static const rt_req_dev_ops k_nccl_ops = {nccl_poll, nccl_stream_wait, nccl_release};

static rt_status dtype_of(rt_dtype t, ncclDataType_t *out) {
    switch (t) {
    case RT_F32:
        *out = ncclFloat32;
        return RT_OK;
    case RT_F64:
        *out = ncclFloat64;
        return RT_OK;
    case RT_I32:
        *out = ncclInt32;
        return RT_OK;
    case RT_I64:
        *out = ncclInt64;
        return RT_OK;
    case RT_U8:
        *out = ncclUint8;
        return RT_OK;
    default:
        return RT_ERROR(RT_ERR_INVALID, "nccl: dtype %d", (int)t);
    }
}

static ncclRedOp_t op_of(rt_reduce_op op) {
    switch (op) {
    case RT_OP_AVG:
        return ncclAvg;
    case RT_OP_PRODUCT:
        return ncclProd;
    case RT_OP_MIN:
        return ncclMin;
    case RT_OP_MAX:
        return ncclMax;
    default:
        return ncclSum;
    }
}

/* ---- init and destroy ---- */

/* Every rank has read the GPU table and refuses nccl: the ranks that do not host the store
 * say so as their last request to it, and a rank that hosts it waits for them before it
 * returns (its store closes with the refused group; a rank still reading the table would
 * fail with "store closed" instead of the reason). The error being returned is kept. */
static void verdict_reached(rt_pg_world *w, int rank, int world) {
    rt_error_record rec;
    rt_error_save(&rec);
    char key[64];
    if (!w->server) {
        snprintf(key, sizeof key, "rt/nccl/verdict/%d", rank);
        (void)rt_store_set(w->store, key, "1", 1);
    } else {
        for (int j = 0; j < world; j++) {
            if (j == rank) continue;
            snprintf(key, sizeof key, "rt/nccl/verdict/%d", j);
            const char *k = key;
            if (rt_store_wait(w->store, &k, 1) != RT_OK) break; /* a rank is gone: nothing to wait for */
        }
    }
    rt_error_restore(&rec);
}

static rt_status init_(rt_pg *pg, nccl_state *st) {
    rt_pg_world *w = pg->w;
    int rank = w->eng.rank, world = w->eng.world;
    RT_CHECK_CUDA(cudaSetDevice(st->device));
    /* one GPU per rank */
    char me[400], bus[64] = "", key[64];
    RT_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, st->device));
    char hid[300];
    rt_dist_host_id(hid, sizeof hid);
    snprintf(me, sizeof me, "%s|%s", hid, bus);
    snprintf(key, sizeof key, "rt/nccl/gpu/%d", rank);
    RT_CHECK(rt_store_set(w->store, key, me, strlen(me)));
    /* every rank reads the whole table and looks for any two ranks on one GPU, so all
     * of them reach the same verdict (3 ranks on 2 GPUs: rank 1 has a GPU of its own,
     * but ranks 0 and 2 do not, and rank 1 must not wait for an NCCL id that never comes) */
    char(*tab)[400] = calloc((size_t)world, sizeof *tab);
    RT_CHECK_ALLOC(tab, (size_t)world * sizeof *tab);
    rt_status ts = RT_OK;
    for (int j = 0; j < world && ts == RT_OK; j++) {
        size_t n = 0;
        snprintf(key, sizeof key, "rt/nccl/gpu/%d", j);
        ts = rt_store_get(w->store, key, tab[j], sizeof tab[j] - 1, &n);
    }
    for (int a = 0; a < world && ts == RT_OK; a++)
        for (int b = a + 1; b < world && ts == RT_OK; b++)
            if (strcmp(tab[a], tab[b]) == 0) {
                const char *gpu = strrchr(tab[a], '|');
                ts = RT_ERROR(RT_ERR_UNSUPPORTED,
                              "transport nccl: ranks %d and %d share GPU %s; NCCL needs one GPU per rank (use "
                              "transport shm or tcp, which stage device buffers through pinned host memory)",
                              a, b, gpu ? gpu + 1 : tab[a]);
            }
    free(tab);
    if (ts == RT_ERR_UNSUPPORTED) verdict_reached(w, rank, world);
    RT_CHECK(ts);
    ncclUniqueId id;
    if (rank == 0) {
        RT_CHECK_NCCL(ncclGetUniqueId(&id));
        RT_CHECK(rt_store_set(w->store, "rt/nccl/id", &id, sizeof id));
    } else {
        size_t n = 0;
        RT_CHECK(rt_store_get(w->store, "rt/nccl/id", &id, sizeof id, &n));
        RT_REQUIRE(n == sizeof id, RT_ERR_PEER, "store: NCCL unique id of %zu bytes, expected %zu", n, sizeof id);
    }
    RT_CHECK_CUDA(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    RT_CHECK_CUDA(cudaEventCreateWithFlags(&st->ev_in, cudaEventDisableTiming));
    RT_CHECK_CUDA(cudaMalloc((void **)&st->flag_dev, sizeof(int)));
    RT_CHECK_CUDA(cudaMemset(st->flag_dev, 0, sizeof(int)));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    uint64_t deadline = rt_now_ns() + (uint64_t)(pg->timeout_s * 1e9);
    pthread_mutex_lock(&st->mu);
    rt_status s = RT_OK;
    ncclResult_t r = ncclCommInitRankConfig(&st->comm, world, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        s = fail_locked(st, RT_ERR_CUDA, "nccl init", ncclGetErrorString(r));
    else /* polled to success even when the call said ncclSuccess: init is asynchronous */
        s = wait_ready_locked(st, "nccl init", deadline);
    pthread_mutex_unlock(&st->mu);
    RT_CHECK(s);
    RT_LOG_DEBUG("nccl: rank %d on GPU %d (%s)", rank, st->device, bus);
    return RT_OK;
}

static void nccl_teardown(rt_pg_world *w);

/* Cleans up after itself when it fails (a communicator it created is aborted, so the
 * peers fail fast). */
static rt_status nccl_setup(rt_pg *pg, const rt_transport_setup *setup) {
    (void)setup;
    rt_pg_world *w = pg->w;
    int ndev = 0;
    RT_CHECK(rt_cuda_device_count(&ndev));
    RT_REQUIRE(pg->buf_device.kind == RT_DEVICE_CUDA && pg->buf_device.index >= 0 && pg->buf_device.index < ndev,
               RT_ERR_INVALID, "transport nccl: the group's device must be a GPU of this host (cuda:0..%d), got %s",
               ndev - 1, pg->buf_device.kind == RT_DEVICE_CUDA ? "another index" : "the CPU");
    nccl_state *st = calloc(1, sizeof *st);
    RT_CHECK_ALLOC(st, sizeof *st);
    st->w = w;
    st->device = pg->buf_device.index;
    st->timeout_s = pg->timeout_s;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    w->op_state = st;
    rt_status s = init_(pg, st);
    if (s != RT_OK) {
        /* a communicator that exists is aborted, not left for the peers to time out on */
        rt_error_record rec;
        rt_error_save(&rec);
        pthread_mutex_lock(&st->mu);
        if (st->comm && !st->aborting) {
            st->aborting = true;
            ncclResult_t a = ncclCommAbort(st->comm);
            if (a != ncclSuccess) RT_LOG_WARN("nccl: ncclCommAbort after a failed init: %s", ncclGetErrorString(a));
            st->comm = NULL;
        }
        pthread_mutex_unlock(&st->mu);
        nccl_teardown(w);
        rt_error_restore(&rec);
        return s;
    }
    return RT_OK;
}

/* Finalize (polled to success against the timeout), then destroy; abort instead on a
 * broken group, an error or the timeout. */
static void close_comm(nccl_state *st) {
    if (!st->comm) return;
    bool broken = st->aborting || group_broken(st->w, NULL);
    if (!broken) {
        ncclResult_t f = ncclCommFinalize(st->comm);
        if (f != ncclSuccess && f != ncclInProgress) {
            RT_LOG_WARN("nccl: ncclCommFinalize: %s; aborting the communicator", ncclGetErrorString(f));
            broken = true;
        }
        uint64_t deadline = rt_now_ns() + (uint64_t)(st->timeout_s * 1e9);
        for (unsigned i = 0; !broken; i++) {
            ncclResult_t a = ncclSuccess;
            ncclResult_t q = ncclCommGetAsyncError(st->comm, &a);
            if (q == ncclSuccess && a == ncclSuccess) break;
            if (q != ncclSuccess || a != ncclInProgress) {
                RT_LOG_WARN("nccl: finalize failed: %s; aborting the communicator",
                            ncclGetErrorString(q != ncclSuccess ? q : a));
                broken = true;
            } else if (rt_now_ns() >= deadline) {
                RT_LOG_WARN("nccl: finalize did not complete within %.1f s; aborting the communicator", st->timeout_s);
                broken = true;
            } else {
                poll_pause(i);
            }
        }
        if (!broken) {
            ncclResult_t d = ncclCommDestroy(st->comm);
            if (d != ncclSuccess) RT_LOG_WARN("nccl: ncclCommDestroy: %s", ncclGetErrorString(d));
            st->comm = NULL;
            return;
        }
    }
    st->aborting = true;
    ncclResult_t a = ncclCommAbort(st->comm);
    if (a != ncclSuccess) RT_LOG_WARN("nccl: ncclCommAbort: %s", ncclGetErrorString(a));
    st->comm = NULL;
}

static void nccl_teardown(rt_pg_world *w) {
    nccl_state *st = w->op_state;
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->stop = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    if (st->thread_started) pthread_join(st->thread, NULL);
    (void)cudaSetDevice(st->device);
    close_comm(st);
    for (int i = 0; i < st->nwatch; i++) cudaEventDestroy(st->watch[i].ev);
    free(st->watch);
    if (st->ev_in) cudaEventDestroy(st->ev_in);
    if (st->stream) (void)cudaStreamSynchronize(st->stream); /* nothing reads the scratch any more */
    if (st->scratch) cudaFree(st->scratch);
    for (int i = 0; i < st->nretired; i++) cudaFree(st->retired[i]);
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->flag_dev) cudaFree(st->flag_dev);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
    w->op_state = NULL;
}

/* ---- operations ---- */

static rt_status precheck(rt_pg *pg, const char *op) {
    RT_REQUIRE(st_of(pg) != NULL, RT_ERR_INVALID, "%s: nccl transport not initialised", op);
    RT_REQUIRE(pg->is_world, RT_ERR_UNSUPPORTED, "%s: sub-groups are not supported on the nccl transport", op);
    if (group_broken(pg->w, NULL)) return broken_error(pg->w, op);
    RT_CHECK_CUDA(cudaSetDevice(st_of(pg)->device));
    return RT_OK;
}

/* ---- bf16 all-reduce: the CPU's algorithms, bit for bit ---- */

/* collectives.c's chunking: n chunks, the first count % n one element longer */
static size_t chunk_off(size_t count, int n, int c) {
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)c * base + ((size_t)c < rem ? (size_t)c : rem);
}
static size_t chunk_len(size_t count, int n, int c) {
    return count / (size_t)n + ((size_t)c < count % (size_t)n ? 1 : 0);
}

/* At least nb bytes of device scratch in st->scratch. Not during a capture: an
 * allocation would end it (the same operations run once uncaptured size it). st->mu held. */
static rt_status scratch_locked(nccl_state *st, size_t nb, const char *name) {
    if (st->scratch_bytes >= nb) return RT_OK;
    RT_REQUIRE(!st->capturing, RT_ERR_INVALID,
               "%s of bf16 over nccl: needs %zu bytes of device scratch, the group has %zu, and a CUDA graph capture "
               "cannot allocate: run the same operations once uncaptured before capturing them",
               name, nb, st->scratch_bytes);
    size_t want = st->scratch_bytes * 2 > nb ? st->scratch_bytes * 2 : nb;
    void *p = NULL;
    CCALL(st, name, cudaMalloc(&p, want));
    if (st->scratch) {
        if (st->nretired == (int)(sizeof st->retired / sizeof st->retired[0])) {
            cudaFree(p);
            return fail_locked(st, RT_ERR_NOMEM, name, "bf16 scratch grown too often");
        }
        st->retired[st->nretired++] = st->scratch;
    }
    st->scratch = p;
    st->scratch_bytes = want;
    return RT_OK;
}

/* One grouped step of the ring: send `sn` bf16 from `sp` to the right, receive `rn` into
 * `rp` from the left (zero-length sides are left out, on both ends alike). st->mu held. */
static rt_status ring_step_locked(nccl_state *st, const char *name, uint64_t deadline, int right, const void *sp,
                                  size_t sn, int left, void *rp, size_t rn) {
    if (sn == 0 && rn == 0) return RT_OK;
    ncclComm_t comm = st->comm;
    cudaStream_t cs = st->stream;
    NCALL(st, name, deadline, ncclGroupStart());
    st->in_group = true;
    if (sn) NCALL(st, name, deadline, ncclSend(sp, sn * 2, ncclUint8, right, comm, cs));
    if (rn) NCALL(st, name, deadline, ncclRecv(rp, rn * 2, ncclUint8, left, comm, cs));
    st->in_group = false;
    NCALL(st, name, deadline, ncclGroupEnd()); /* polled: the kernels below come after it */
    return RT_OK;
}

/* All-reduce of bf16 in place with the algorithm a host buffer gets (collectives.c), so
 * the bits are the CPU run's: NCCL has no bf16 reduction with our rounding points (its
 * AVG pre-multiplies, its order is its own), so NCCL only moves bytes and every
 * reduction step is dist/reduce.c's, on the device (bf16_cuda.h):
 * - ring / rsag / nccl: the ring's reduce-scatter (chunk c starts at rank c+1, each hop
 *   adds its own element and rounds, AVG's division fused into the last hop, at rank c),
 *   then its all-gather (copies);
 * - ring at most RINGTRAIN_ALLREDUCE_SMALL_BYTES: the one-round form, every rank folds
 *   the n buffers in rank order, then AVG divides (a rounding of its own);
 * - naive: rank 0's fold in rank order with AVG's division fused into the last step,
 *   computed by every rank from an all-gather (the same bits rank 0 would broadcast).
 * st->mu held. */
static rt_status bf16_all_reduce_locked(rt_pg *pg, nccl_state *st, const rt_op *o, const char *name,
                                        uint64_t deadline) {
    int n = pg->size, me = pg->rank;
    size_t count = o->count, nb = count * 2;
    uint16_t *buf = o->recv;
    int op = (int)o->rop;
    cudaStream_t cs = st->stream;
    if (n == 1 || count == 0) return RT_OK;
    if (o->send != o->recv) CCALL(st, name, cudaMemcpyAsync(buf, o->send, nb, cudaMemcpyDeviceToDevice, cs));
    bool naive = o->algo == RT_ALGO_NAIVE;
    bool one_round = o->algo == RT_ALGO_RING && nb <= pg->w->allreduce_small_bytes;
    if (naive || one_round) {
        RT_CHECK(scratch_locked(st, nb * (size_t)n, name));
        uint16_t *slots = st->scratch;
        NCALL(st, name, deadline, ncclAllGather(buf, slots, nb, ncclUint8, st->comm, cs));
        CCALL(st, name, cudaMemcpyAsync(buf, slots, nb, cudaMemcpyDeviceToDevice, cs));
        for (int k = 1; k < n; k++) {
            int div = naive && k == n - 1 && op == RT_OP_AVG ? n : 0;
            CCALL(st, name, rt_dist_bf16_combine(cs, buf, slots + (size_t)k * count, count, op, div));
        }
        if (one_round && op == RT_OP_AVG) CCALL(st, name, rt_dist_bf16_div(cs, buf, count, n));
        return RT_OK;
    }
    RT_CHECK(scratch_locked(st, chunk_len(count, n, 0) * 2, name));
    uint16_t *tmp = st->scratch;
    int right = (me + 1) % n, left = (me + n - 1) % n;
    for (int s = 0; s < n - 1; s++) { /* reduce-scatter */
        int sc = ((me - s - 1) % n + n) % n, rc = ((me - s - 2) % n + n) % n;
        size_t rn = chunk_len(count, n, rc);
        RT_CHECK(ring_step_locked(st, name, deadline, right, buf + chunk_off(count, n, sc), chunk_len(count, n, sc),
                                  left, tmp, rn));
        int div = s == n - 2 && op == RT_OP_AVG ? n : 0;
        CCALL(st, name, rt_dist_bf16_combine(cs, buf + chunk_off(count, n, rc), tmp, rn, op, div));
    }
    for (int s = 0; s < n - 1; s++) { /* all-gather */
        int sc = ((me - s) % n + n) % n, rc = ((me - s - 1) % n + n) % n;
        RT_CHECK(ring_step_locked(st, name, deadline, right, buf + chunk_off(count, n, sc), chunk_len(count, n, sc),
                                  left, buf + chunk_off(count, n, rc), chunk_len(count, n, rc)));
    }
    return RT_OK;
}

/* Enqueue the operation on the communication stream after the caller's stream, then its
 * completion event. st->mu held. */
static rt_status enqueue_locked(rt_pg *pg, nccl_state *st, const rt_op *o, const char *name, ncclDataType_t dt,
                                uint64_t deadline, cudaEvent_t done) {
    if (!st->comm || st->aborting) return broken_error(pg->w, name);
    cudaStream_t caller = pg->stream ? (cudaStream_t)rt_stream_native(pg->stream) : NULL;
    if (caller) { /* ordered after everything already enqueued on the caller's stream */
        CCALL(st, name, cudaEventRecord(st->ev_in, caller));
        CCALL(st, name, cudaStreamWaitEvent(st->stream, st->ev_in, 0));
    }
    int kind = o->kind, root = o->root;
    const void *send = o->send;
    void *recv = o->recv;
    size_t count = o->count;
    rt_reduce_op op = o->rop;
    size_t nb = count * rt_dtype_size(o->dtype);
    int n = pg->size, me = pg->rank;
    ncclComm_t comm = st->comm;
    cudaStream_t cs = st->stream;
    switch (kind) {
    case RT_K_ALLREDUCE:
        if (o->dtype == RT_BF16)
            RT_CHECK(bf16_all_reduce_locked(pg, st, o, name, deadline));
        else
            NCALL(st, name, deadline, ncclAllReduce(send, recv, count, dt, op_of(op), comm, cs));
        break;
    case RT_K_BCAST:
        NCALL(st, name, deadline, ncclBroadcast(send, recv, count, dt, root, comm, cs));
        break;
    case RT_K_REDUCE:
        NCALL(st, name, deadline, ncclReduce(send, recv, count, dt, op_of(op), root, comm, cs));
        break;
    case RT_K_ALLGATHER:
        NCALL(st, name, deadline, ncclAllGather(send, recv, count, dt, comm, cs));
        break;
    case RT_K_REDUCE_SCATTER:
        NCALL(st, name, deadline, ncclReduceScatter(send, recv, count, dt, op_of(op), comm, cs));
        break;
    case RT_K_SCATTER:
    case RT_K_GATHER:
        NCALL(st, name, deadline, ncclGroupStart());
        st->in_group = true;
        if (me == root) {
            for (int i = 0; i < n; i++) {
                if (i == root) continue;
                if (kind == RT_K_SCATTER)
                    NCALL(st, name, deadline, ncclSend((const char *)send + (size_t)i * nb, count, dt, i, comm, cs));
                else
                    NCALL(st, name, deadline, ncclRecv((char *)recv + (size_t)i * nb, count, dt, i, comm, cs));
            }
        } else if (kind == RT_K_SCATTER) {
            NCALL(st, name, deadline, ncclRecv(recv, count, dt, root, comm, cs));
        } else {
            NCALL(st, name, deadline, ncclSend(send, count, dt, root, comm, cs));
        }
        /* ncclGroupEnd is polled to completion (NCALL) before the copy below is
         * enqueued: only then is the grouped work on the stream, ahead of the copy */
        st->in_group = false;
        NCALL(st, name, deadline, ncclGroupEnd());
        if (me == root && nb) {
            const char *src = kind == RT_K_SCATTER ? (const char *)send + (size_t)root * nb : send;
            char *dst = kind == RT_K_SCATTER ? recv : (char *)recv + (size_t)root * nb;
            if (src != dst) CCALL(st, name, cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, cs));
        }
        break;
    case RT_K_BARRIER:
        NCALL(st, name, deadline, ncclAllReduce(st->flag_dev, st->flag_dev, 1, ncclInt32, ncclSum, comm, cs));
        break;
    case RT_K_P2P:
        if (o->is_send)
            NCALL(st, name, deadline, ncclSend(send, count, dt, root, comm, cs));
        else
            NCALL(st, name, deadline, ncclRecv(recv, count, dt, root, comm, cs));
        break;
    default:
        return RT_ERROR(RT_ERR_INVALID, "nccl: operation %d", kind);
    }
    CCALL(st, name, cudaEventRecord(done, cs));
    return RT_OK;
}

/* The completion event, then the operation (st->mu held); a failure of either aborts:
 * the peers enter the collective whatever this rank does. */
static rt_status enqueue_locked_ev(rt_pg *pg, nccl_state *st, const rt_op *o, const char *name, ncclDataType_t dt,
                                   nccl_done *c) {
    c->ev = NULL;
    CCALL(st, name, cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming));
    return enqueue_locked(pg, st, o, name, dt, c->deadline, c->ev);
}

/* Enqueue the operation on the communication stream, ordered after the group's stream
 * (rt_pg_set_stream), and give `r` (an empty request, host part complete) its device
 * part: the completion event, polled against the timeout. */
static rt_status nccl_enqueue(rt_pg *pg, const rt_op *o, rt_request *r) {
    const char *name = rt_comm_op_name(o->kind, o->is_send);
    RT_CHECK(precheck(pg, name));
    nccl_state *st = st_of(pg);
    ncclDataType_t dt = ncclFloat32;
    if (o->dtype == RT_BF16 && o->kind == RT_K_ALLREDUCE)
        dt = ncclUint8; /* bf16_all_reduce_locked: NCCL moves the bytes, our kernels reduce */
    else
        RT_CHECK(dtype_of(o->dtype, &dt));
    nccl_done *c = calloc(1, sizeof *c);
    RT_CHECK_ALLOC(c, sizeof *c);
    *c = (nccl_done){.st = st, .deadline = rt_now_ns() + (uint64_t)(pg->timeout_s * 1e9), .op = name};
    pthread_mutex_lock(&st->mu);
    st->capturing = o->captured;
    rt_status s = enqueue_locked_ev(pg, st, o, name, dt, c);
    st->capturing = false;
    pthread_mutex_unlock(&st->mu);
    if (s != RT_OK) {
        if (c->ev) cudaEventDestroy(c->ev);
        free(c);
        return s;
    }
    r->dev = &k_nccl_ops; /* not complete yet: rt_test / rt_wait / rt_wait_stream */
    r->dev_ctx = c;
    return RT_OK;
}

static rt_status nccl_run(rt_pg *pg, const char *name, const rt_op *op, rt_request **out) {
    return rt_run_enqueued(pg, name, op, out, nccl_enqueue);
}

/* A graph holding captured operations of the group was launched on s (pg_graph.c): one
 * event behind it on s, watched like a completion a stream waits for (the timeout from
 * now, a dead peer, the slow check), ending the operations' recorder entries. */
static rt_status nccl_graph_launched(rt_pg *pg, rt_stream *s, uint64_t fr_first, int fr_n) {
    const char *name = "graph replay";
    RT_CHECK(precheck(pg, name));
    cudaEvent_t ev = NULL;
    RT_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, (cudaStream_t)rt_stream_native(s));
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        RT_CHECK_CUDA(e);
    }
    uint64_t now = rt_now_ns();
    double slow_s = rt_pg_slow_after_s(pg->timeout_s);
    watch_add(st_of(pg), ev, now + (uint64_t)(pg->timeout_s * 1e9), name, fr_first ? &pg->flight : NULL, fr_first, fr_n,
              slow_s > 0 ? pg : NULL, now + (uint64_t)(slow_s * 1e9));
    return RT_OK;
}

static rt_status nccl_can_connect(rt_pg *pg, const rt_transport_setup *s) {
    (void)s;
    RT_REQUIRE(pg->buf_device.kind == RT_DEVICE_CUDA, RT_ERR_INVALID,
               "transport nccl needs device buffers (rt_pg_options.device = cuda)");
    return RT_OK;
}

/* a watchdog pass now, on the caller's thread (a flight recorder dump) */
static void nccl_flight_refresh(rt_pg *pg) {
    nccl_state *st = st_of(pg);
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    watch_pass_locked(st);
    pthread_mutex_unlock(&st->mu);
}

const rt_transport_ops rt_tp_nccl = {
    .name = "nccl",
    .kind = RT_TRANSPORT_NCCL,
    .device_only = true,
    .algo = "nccl",
    .can_connect = nccl_can_connect,
    .setup = nccl_setup,
    .teardown = nccl_teardown,
    .run = nccl_run,
    .graph_launched = nccl_graph_launched,
    .flight_refresh = nccl_flight_refresh,
};
