/* The nccl transport (CUDA builds): device buffers on distinct GPUs.
 *
 * Each rank runs on the group's buffer device (rt_pg_options.device, chosen by the
 * program, e.g. rt_device_select(want, local_rank)): the model and the communicator
 * share one GPU, never a guess of the transport's own. The ranks publish (host, PCI bus id)
 * through the store and refuse to start when two share a GPU (NCCL cannot; use tcp or
 * shm, which stage device buffers through pinned host memory). Rank 0's ncclUniqueId
 * travels through the store. The communicator is non-blocking, so that every wait can
 * honour the group's timeout: an operation is enqueued on the rank's stream and the
 * host polls the stream and ncclCommGetAsyncError until it finishes, fails or runs out
 * of time; on a failure or a timeout the communicator is aborted (ncclCommAbort) and
 * the group is broken. Peers are world ranks; sub-groups are not supported on nccl.
 */
#include "core/cuda/cuda_check.h"
#include "core/log.h"
#include "core/timer.h"
#include "dist/internal/pg_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

/* NCCL calls (core's RT_CHECK_LIB shape). ncclInProgress is not an error: a
 * non-blocking communicator's call that is still running. */
#define RT_CHECK_NCCL(expr)                                                                                            \
    RT_CHECK_LIB(expr, ncclResult_t, rt_e_ == ncclSuccess || rt_e_ == ncclInProgress, "NCCL", ncclGetErrorString)

typedef struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int *flag_dev; /* barrier */
    bool aborted;
} nccl_state;

static nccl_state *st_of(rt_pg *pg) { return pg->w->nccl; }

static void nap(void) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

static rt_status abort_comm(rt_pg *pg, rt_status s, const char *op, const char *why) {
    nccl_state *st = st_of(pg);
    if (st && !st->aborted) {
        ncclCommAbort(st->comm);
        st->aborted = true;
    }
    pg->w->eng.broken = true;
    rt_error_record rec;
    rt_status r = RT_ERROR(s, "%s over nccl: %s (communicator aborted)", op, why);
    rt_error_save(&rec);
    pg->w->eng.err = rec;
    return r;
}

/* Wait until the non-blocking communicator is no longer "in progress". */
static rt_status wait_ready(rt_pg *pg, const char *op, uint64_t deadline) {
    nccl_state *st = st_of(pg);
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(st->comm, &a);
        if (q != ncclSuccess && q != ncclInProgress) return abort_comm(pg, RT_ERR_CUDA, op, ncclGetErrorString(q));
        if (a == ncclSuccess) return RT_OK;
        if (a != ncclInProgress) return abort_comm(pg, RT_ERR_PEER, op, ncclGetErrorString(a));
        if (rt_now_ns() >= deadline) return abort_comm(pg, RT_ERR_TIMEOUT, op, "timed out (a peer is gone or stuck?)");
        nap();
    }
}

/* Wait for the stream, watching for NCCL errors and the deadline. */
static rt_status wait_stream(rt_pg *pg, const char *op, uint64_t deadline) {
    nccl_state *st = st_of(pg);
    RT_CHECK(wait_ready(pg, op, deadline));
    for (;;) {
        cudaError_t e = cudaStreamQuery(st->stream);
        if (e == cudaSuccess) return RT_OK;
        if (e != cudaErrorNotReady) return abort_comm(pg, RT_ERR_CUDA, op, cudaGetErrorString(e));
        ncclResult_t a = ncclSuccess;
        ncclCommGetAsyncError(st->comm, &a);
        if (a != ncclSuccess && a != ncclInProgress) return abort_comm(pg, RT_ERR_PEER, op, ncclGetErrorString(a));
        if (rt_now_ns() >= deadline) {
            char why[96];
            snprintf(why, sizeof why, "timed out after %.1f s", pg->timeout_s);
            return abort_comm(pg, RT_ERR_TIMEOUT, op, why);
        }
        nap();
    }
}

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

#define NCCL_ENQ(pg, op, expr)                                                                                         \
    do {                                                                                                               \
        ncclResult_t rt_r_ = (expr);                                                                                   \
        if (rt_r_ != ncclSuccess && rt_r_ != ncclInProgress)                                                           \
            return abort_comm((pg), RT_ERR_CUDA, (op), ncclGetErrorString(rt_r_));                                     \
    } while (0)

rt_status rt_pg_nccl_init(rt_pg *pg) {
    rt_pg_world *w = pg->w;
    int rank = w->eng.rank, world = w->eng.world;
    int ndev = 0;
    RT_CHECK(rt_cuda_device_count(&ndev));
    RT_REQUIRE(pg->buf_device.kind == RT_DEVICE_CUDA && pg->buf_device.index >= 0 && pg->buf_device.index < ndev,
               RT_ERR_INVALID, "transport nccl: the group's device must be a GPU of this host (cuda:0..%d), got %s",
               ndev - 1, pg->buf_device.kind == RT_DEVICE_CUDA ? "another index" : "the CPU");
    nccl_state *st = calloc(1, sizeof *st);
    RT_CHECK_ALLOC(st, sizeof *st);
    w->nccl = st;
    st->device = pg->buf_device.index;
    RT_CHECK_CUDA(cudaSetDevice(st->device));
    /* one GPU per rank */
    char me[400], bus[64] = "", key[64];
    RT_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, st->device));
    char hid[300];
    rt_dist_host_id(hid, sizeof hid);
    snprintf(me, sizeof me, "%s|%s", hid, bus);
    snprintf(key, sizeof key, "rt/nccl/gpu/%d", rank);
    RT_CHECK(rt_store_set(w->store, key, me, strlen(me)));
    for (int j = 0; j < world; j++) {
        char other[400] = "";
        size_t n = 0;
        snprintf(key, sizeof key, "rt/nccl/gpu/%d", j);
        RT_CHECK(rt_store_get(w->store, key, other, sizeof other - 1, &n));
        if (j != rank && strcmp(other, me) == 0)
            return RT_ERROR(RT_ERR_UNSUPPORTED,
                            "transport nccl: ranks %d and %d share GPU %s; NCCL needs one GPU per rank (use "
                            "transport shm or tcp, which stage device buffers through pinned host memory)",
                            j < rank ? j : rank, j < rank ? rank : j, bus);
    }
    ncclUniqueId id;
    if (rank == 0) {
        RT_CHECK_NCCL(ncclGetUniqueId(&id));
        RT_CHECK(rt_store_set(w->store, "rt/nccl/id", &id, sizeof id));
    } else {
        size_t n = 0;
        RT_CHECK(rt_store_get(w->store, "rt/nccl/id", &id, sizeof id, &n));
        RT_REQUIRE(n == sizeof id, RT_ERR_PEER, "store: NCCL unique id of %zu bytes, expected %zu", n, sizeof id);
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    RT_CHECK_NCCL(ncclCommInitRankConfig(&st->comm, world, id, rank, &cfg));
    RT_CHECK(wait_ready(pg, "nccl init", rt_now_ns() + (uint64_t)(pg->timeout_s * 1e9)));
    RT_CHECK_CUDA(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    RT_CHECK_CUDA(cudaMalloc((void **)&st->flag_dev, sizeof(int)));
    RT_LOG_DEBUG("nccl: rank %d on GPU %d (%s)", rank, st->device, bus);
    return RT_OK;
}

void rt_pg_nccl_destroy(rt_pg_world *w) {
    nccl_state *st = w->nccl;
    if (!st) return;
    if (st->comm) {
        if (st->aborted || w->eng.broken)
            ncclCommAbort(st->comm);
        else if (ncclCommFinalize(st->comm) == ncclSuccess || 1)
            ncclCommDestroy(st->comm);
    }
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->flag_dev) cudaFree(st->flag_dev);
    free(st);
    w->nccl = NULL;
}

static rt_status precheck(rt_pg *pg, const char *op) {
    RT_REQUIRE(st_of(pg) != NULL, RT_ERR_INVALID, "%s: nccl transport not initialised", op);
    RT_REQUIRE(pg->is_world, RT_ERR_UNSUPPORTED, "%s: sub-groups are not supported on the nccl transport", op);
    if (pg->w->eng.broken)
        return RT_ERROR(RT_ERR_PEER, "%s: the process group is broken by an earlier error: %s", op, pg->w->eng.err.msg);
    RT_CHECK_CUDA(cudaSetDevice(st_of(pg)->device));
    return RT_OK;
}

rt_status rt_nccl_run(rt_pg *pg, const rt_op *o) {
    const char *name = rt_comm_op_name(o->kind, o->is_send);
    int kind = o->kind, root = o->root;
    const void *send = o->send;
    void *recv = o->recv;
    size_t count = o->count;
    rt_dtype dtype = o->dtype;
    rt_reduce_op op = o->rop;
    RT_CHECK(precheck(pg, name));
    nccl_state *st = st_of(pg);
    ncclDataType_t dt = ncclFloat32;
    RT_CHECK(dtype_of(dtype, &dt));
    uint64_t deadline = rt_now_ns() + (uint64_t)(pg->timeout_s * 1e9);
    size_t nb = count * rt_dtype_size(dtype);
    int n = pg->size, me = pg->rank;
    switch (kind) {
    case RT_K_ALLREDUCE:
        NCCL_ENQ(pg, name, ncclAllReduce(send, recv, count, dt, op_of(op), st->comm, st->stream));
        break;
    case RT_K_BCAST:
        NCCL_ENQ(pg, name, ncclBroadcast(send, recv, count, dt, root, st->comm, st->stream));
        break;
    case RT_K_REDUCE:
        NCCL_ENQ(pg, name, ncclReduce(send, recv, count, dt, op_of(op), root, st->comm, st->stream));
        break;
    case RT_K_ALLGATHER:
        NCCL_ENQ(pg, name, ncclAllGather(send, recv, count, dt, st->comm, st->stream));
        break;
    case RT_K_REDUCE_SCATTER:
        NCCL_ENQ(pg, name, ncclReduceScatter(send, recv, count, dt, op_of(op), st->comm, st->stream));
        break;
    case RT_K_SCATTER:
    case RT_K_GATHER:
        NCCL_ENQ(pg, name, ncclGroupStart());
        if (me == root) {
            for (int i = 0; i < n; i++) {
                if (i == root) continue;
                if (kind == RT_K_SCATTER)
                    NCCL_ENQ(pg, name,
                             ncclSend((const char *)send + (size_t)i * nb, count, dt, i, st->comm, st->stream));
                else
                    NCCL_ENQ(pg, name, ncclRecv((char *)recv + (size_t)i * nb, count, dt, i, st->comm, st->stream));
            }
        } else if (kind == RT_K_SCATTER) {
            NCCL_ENQ(pg, name, ncclRecv(recv, count, dt, root, st->comm, st->stream));
        } else {
            NCCL_ENQ(pg, name, ncclSend(send, count, dt, root, st->comm, st->stream));
        }
        NCCL_ENQ(pg, name, ncclGroupEnd());
        if (me == root && nb) {
            const char *src = kind == RT_K_SCATTER ? (const char *)send + (size_t)root * nb : send;
            char *dst = kind == RT_K_SCATTER ? recv : (char *)recv + (size_t)root * nb;
            if (src != dst) RT_CHECK_CUDA(cudaMemcpyAsync(dst, src, nb, cudaMemcpyDeviceToDevice, st->stream));
        }
        break;
    case RT_K_BARRIER:
        NCCL_ENQ(pg, name, ncclAllReduce(st->flag_dev, st->flag_dev, 1, ncclInt32, ncclSum, st->comm, st->stream));
        break;
    case RT_K_P2P:
        if (o->is_send)
            NCCL_ENQ(pg, name, ncclSend(send, count, dt, root, st->comm, st->stream));
        else
            NCCL_ENQ(pg, name, ncclRecv(recv, count, dt, root, st->comm, st->stream));
        break;
    default:
        return RT_ERROR(RT_ERR_INVALID, "nccl: operation %d", kind);
    }
    return wait_stream(pg, name, deadline);
}
