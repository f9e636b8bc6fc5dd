/* Collectives as graphs of transfers (engine.h): ring, chain and flat algorithms.
 *
 * Ring all-reduce over n ranks: the buffer is split into n chunks (the first
 * count % n chunks one element longer). Reduce-scatter: at step s rank r sends chunk
 * r-s-1 to its right neighbour and receives chunk r-s-2 from its left one, reducing it
 * into place; after n-1 steps it owns chunk r fully reduced (AVG divides right there).
 * All-gather: at step s it sends chunk r-s and receives chunk r-s-1 (a copy). Every
 * send streams behind the receive that produced its chunk, so slices are forwarded as
 * soon as they are reduced: sending, receiving and reducing overlap, and no rank
 * waits for a whole chunk. The final values of a chunk are computed once, by its owner,
 * and copied everywhere else: all ranks end bitwise identical.
 */
#include "dist/pg_internal.h"

#include <stdlib.h>
#include <string.h>

#define MOD(a, n) ((((a) % (n)) + (n)) % (n))
/* base + off, where base may be NULL for empty buffers (NULL + 0 is undefined in C) */
#define AT(base, off) ((base) ? (uint8_t *)(base) + (off) : (uint8_t *)(base))

static size_t chunk_off(size_t count, int n, int c) {
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)c * base + ((size_t)c < rem ? (size_t)c : rem);
}
static size_t chunk_len(size_t count, int n, int c) {
    return count / (size_t)n + ((size_t)c < count % (size_t)n ? 1 : 0);
}

static rt_status check_args(rt_pg *pg, const char *op, const void *buf, size_t count, rt_dtype dtype, int reduce,
                            rt_reduce_op rop, int root) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "%s: NULL process group", op);
    size_t es = rt_dtype_size(dtype);
    RT_REQUIRE((unsigned)dtype < RT_DTYPE_COUNT_ && es > 0, RT_ERR_INVALID, "%s: bad dtype %d", op, (int)dtype);
    RT_REQUIRE(!reduce || rt_reduce_dtype_ok(dtype), RT_ERR_INVALID,
               "%s: dtype %s cannot be reduced (f32 f64 i32 i64 can)", op, rt_dtype_name(dtype));
    RT_REQUIRE(!reduce || (unsigned)rop < RT_OP_COUNT_, RT_ERR_INVALID, "%s: bad reduce op %d", op, (int)rop);
    RT_REQUIRE(count <= RT_MSG_MAX_BYTES / es / (size_t)pg->size, RT_ERR_INVALID, "%s: %zu elements is too many", op,
               count);
    RT_REQUIRE(buf || count == 0, RT_ERR_INVALID, "%s: NULL buffer", op);
    RT_REQUIRE(root >= 0 && root < pg->size, RT_ERR_INVALID, "%s: root %d out of range 0..%d", op, root, pg->size - 1);
    RT_REQUIRE(pg->buf_device.kind == RT_DEVICE_CPU || pg->transport == RT_TRANSPORT_NCCL, RT_ERR_UNSUPPORTED,
               "%s: device buffers over %s: only all_reduce and broadcast stage through host memory (or use the "
               "nccl transport)",
               op, rt_transport_name(pg->transport));
    return RT_OK;
}

/* nccl: the operation runs on the GPU stream and is waited for (with the timeout);
 * the i* forms get a request that is already complete. */
static rt_status nccl_run(rt_pg *pg, const char *op, int kind, const void *send, void *recv, size_t count,
                          rt_dtype dtype, rt_reduce_op rop, int root, rt_request **out) {
    RT_CHECK(rt_nccl_coll(pg, kind, send, recv, count, dtype, rop, root));
    if (!out) return RT_OK;
    rt_request *r;
    RT_CHECK(rt_req_new(&pg->w->eng, op, pg->id, pg->timeout_s, 0, &r));
    rt_status s = rt_req_submit(r, false);
    if (s != RT_OK) {
        rt_req_free(r);
        return s;
    }
    *out = r;
    return RT_OK;
}

/* Device buffers over tcp/shm (ranks sharing one GPU): copy to pinned host memory, run
 * the host collective, copy back. Blocking only. */
static rt_status stage_begin(rt_pg *pg, const char *op, void *buf, size_t nb, rt_request **out, void **host) {
    RT_REQUIRE(out == NULL, RT_ERR_UNSUPPORTED, "%s: asynchronous operations on device buffers need the nccl transport",
               op);
    if (pg->stage_bytes < nb) {
        if (pg->stage) rt_host_free(pg->stage, pg->stage_pinned);
        pg->stage = NULL;
        pg->stage_bytes = 0;
        RT_CHECK(rt_host_alloc(nb, true, &pg->stage, &pg->stage_pinned));
        pg->stage_bytes = nb;
    }
    if (nb) RT_CHECK(rt_memcpy(pg->stage, rt_device_cpu(), buf, pg->buf_device, nb, NULL));
    *host = pg->stage;
    return RT_OK;
}

static rt_status new_req(rt_pg *pg, const char *op, int maxx, rt_request **r) {
    return rt_req_new(&pg->w->eng, op, pg->id, pg->timeout_s, maxx, r);
}

/* Submit; block (out == NULL) or hand the request back. */
static rt_status finish(rt_request *r, rt_request **out) {
    rt_status s = rt_req_submit(r, out != NULL);
    if (s == RT_OK && !out) s = rt_req_wait(r);
    if (s != RT_OK || !out) {
        rt_req_free(r);
        return s;
    }
    *out = r;
    return RT_OK;
}

#define W(pg, r) ((pg)->ranks[MOD((r), (pg)->size)])
#define ADD_OR_FAIL(x, r)                                                                                              \
    do {                                                                                                               \
        if (!(x)) {                                                                                                    \
            rt_req_free(r);                                                                                            \
            return RT_ERROR(RT_ERR_INTERNAL, "transfer table full");                                                   \
        }                                                                                                              \
    } while (0)

/* Ring reduce-scatter (+ optionally all-gather) in place over `count` elements split
 * in pg->size chunks. full_gate: the all-gather waits for the whole reduce-scatter
 * (rsag) instead of streaming behind it (ring). */
static rt_status ring_build(rt_pg *pg, rt_request *r, uint8_t *buf, size_t count, rt_dtype dtype, rt_reduce_op op,
                            bool do_rs, bool do_ag, bool full_gate, uint16_t kind, uint32_t seq) {
    int n = pg->size, me = pg->rank;
    size_t es = rt_dtype_size(dtype);
    int right = W(pg, me + 1), left = W(pg, me - 1);
    const rt_xfer *prev = NULL;
    if (do_rs) {
        for (int s = 0; s < n - 1; s++) {
            int sc = MOD(me - s - 1, n), rc = MOD(me - s - 2, n);
            rt_xfer *x = rt_req_send(r, right, AT(buf, chunk_off(count, n, sc) * es), chunk_len(count, n, sc) * es,
                                     kind, seq, prev, false);
            ADD_OR_FAIL(x, r);
            int div = (s == n - 2 && op == RT_OP_AVG) ? n : 0;
            rt_xfer *y = rt_req_recv(r, left, AT(buf, chunk_off(count, n, rc) * es), chunk_len(count, n, rc) * es, kind,
                                     seq, (int)op, dtype, div, NULL, false);
            ADD_OR_FAIL(y, r);
            prev = y;
        }
    }
    if (do_ag) {
        for (int s = 0; s < n - 1; s++) {
            int sc = MOD(me - s, n), rc = MOD(me - s - 1, n);
            rt_xfer *x = rt_req_send(r, right, AT(buf, chunk_off(count, n, sc) * es), chunk_len(count, n, sc) * es,
                                     kind, seq, prev, s == 0 && full_gate);
            ADD_OR_FAIL(x, r);
            rt_xfer *y = rt_req_recv(r, left, AT(buf, chunk_off(count, n, rc) * es), chunk_len(count, n, rc) * es, kind,
                                     seq, -1, dtype, 0, NULL, false);
            ADD_OR_FAIL(y, r);
            prev = y;
        }
    }
    return RT_OK;
}

/* Reduce to `root`: flat (root receives from everyone, in rank order) or a chain along
 * the ring toward the root. Non-root buffers stay unchanged (chain: a scratch copy). */
static rt_status reduce_build(rt_pg *pg, rt_request *r, uint8_t *buf, size_t count, rt_dtype dtype, rt_reduce_op op,
                              int root, bool flat, uint16_t kind, uint32_t seq, const rt_xfer **last) {
    int n = pg->size, me = pg->rank;
    size_t nb = count * rt_dtype_size(dtype);
    *last = NULL;
    if (n == 1) return RT_OK;
    if (flat) {
        if (me == root) {
            const rt_xfer *prev = NULL;
            int k = 0;
            for (int i = 0; i < n; i++) {
                if (i == root) continue;
                k++;
                int div = (k == n - 1 && op == RT_OP_AVG) ? n : 0;
                rt_xfer *y = rt_req_recv(r, W(pg, i), buf, nb, kind, seq, (int)op, dtype, div, prev, false);
                ADD_OR_FAIL(y, r);
                prev = y;
            }
            *last = prev;
        } else {
            rt_xfer *x = rt_req_send(r, W(pg, root), buf, nb, kind, seq, NULL, false);
            ADD_OR_FAIL(x, r);
            *last = x;
        }
        return RT_OK;
    }
    int pos = MOD(me - root, n); /* data flows from position n-1 down to 0 (the root) */
    int up = W(pg, me + 1), down = W(pg, me - 1);
    if (pos == n - 1) {
        rt_xfer *x = rt_req_send(r, down, buf, nb, kind, seq, NULL, false);
        ADD_OR_FAIL(x, r);
        *last = x;
    } else if (pos == 0) {
        int div = op == RT_OP_AVG ? n : 0;
        rt_xfer *y = rt_req_recv(r, up, buf, nb, kind, seq, (int)op, dtype, div, NULL, false);
        ADD_OR_FAIL(y, r);
        *last = y;
    } else {
        if (nb) {
            r->scratch = malloc(nb);
            if (!r->scratch) {
                rt_req_free(r);
                RT_CHECK_ALLOC(NULL, nb);
            }
            memcpy(r->scratch, buf, nb);
        }
        rt_xfer *y = rt_req_recv(r, up, r->scratch, nb, kind, seq, (int)op, dtype, 0, NULL, false);
        ADD_OR_FAIL(y, r);
        rt_xfer *x = rt_req_send(r, down, r->scratch, nb, kind, seq, y, false);
        ADD_OR_FAIL(x, r);
        *last = x;
    }
    return RT_OK;
}

/* Broadcast from root: flat (root sends to each) or a pipelined chain along the ring.
 * root_dep: the root's sends stream behind this transfer (naive all-reduce). */
static rt_status bcast_build(rt_pg *pg, rt_request *r, uint8_t *buf, size_t nb, int root, bool flat, uint16_t kind,
                             uint32_t seq, const rt_xfer *root_dep, const rt_xfer *recv_dep) {
    int n = pg->size, me = pg->rank;
    if (n == 1) return RT_OK;
    if (flat) {
        if (me == root) {
            for (int i = 0; i < n; i++) {
                if (i == root) continue;
                rt_xfer *x = rt_req_send(r, W(pg, i), buf, nb, kind, seq, root_dep, false);
                ADD_OR_FAIL(x, r);
            }
        } else {
            rt_xfer *y = rt_req_recv(r, W(pg, root), buf, nb, kind, seq, -1, RT_U8, 0, recv_dep, false);
            ADD_OR_FAIL(y, r);
        }
        return RT_OK;
    }
    int pos = MOD(me - root, n);
    const rt_xfer *have = root_dep;
    if (pos != 0) {
        rt_xfer *y = rt_req_recv(r, W(pg, me - 1), buf, nb, kind, seq, -1, RT_U8, 0, recv_dep, false);
        ADD_OR_FAIL(y, r);
        have = y;
    }
    if (pos != n - 1) {
        rt_xfer *x = rt_req_send(r, W(pg, me + 1), buf, nb, kind, seq, have, false);
        ADD_OR_FAIL(x, r);
    }
    return RT_OK;
}

/* Below this many bytes the ring all-reduce becomes one exchange round
 * (RINGTRAIN_ALLREDUCE_SMALL_BYTES; 0 disables). */
static size_t small_bytes(void) {
    static long v = -1;
    if (v < 0) {
        const char *s = getenv("RINGTRAIN_ALLREDUCE_SMALL_BYTES");
        v = s && *s ? atol(s) : 4096;
        if (v < 0) v = 0;
    }
    return (size_t)v;
}

/* ---- public collectives ---- */

static rt_status all_reduce_(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, rt_algo algo,
                             rt_request **out) {
    if (pg->transport == RT_TRANSPORT_NCCL) {
        RT_CHECK(check_args(pg, "all_reduce", buf, count, dtype, 1, op, 0));
        return nccl_run(pg, "all_reduce", RT_K_ALLREDUCE, buf, buf, count, dtype, op, 0, out);
    }
    if (pg->buf_device.kind == RT_DEVICE_CUDA) {
        void *host;
        size_t nb = count * rt_dtype_size(dtype);
        RT_CHECK(stage_begin(pg, "all_reduce", buf, nb, out, &host));
        rt_device d = pg->buf_device;
        pg->buf_device = rt_device_cpu();
        rt_status s = all_reduce_(pg, host, count, dtype, op, algo, NULL);
        pg->buf_device = d;
        RT_CHECK(s);
        if (nb) RT_CHECK(rt_memcpy(buf, d, host, rt_device_cpu(), nb, NULL));
        return RT_OK;
    }
    RT_CHECK(check_args(pg, "all_reduce", buf, count, dtype, 1, op, 0));
    if (algo == RT_ALGO_NCCL)
        return RT_ERROR(RT_ERR_UNSUPPORTED, "all_reduce: algorithm nccl needs the nccl transport and device buffers");
    int n = pg->size;
    rt_request *r;
    RT_CHECK(new_req(pg, "all_reduce", 4 * n + 4, &r));
    uint32_t seq = ++pg->seq;
    if (algo == RT_ALGO_NAIVE) {
        const rt_xfer *last = NULL;
        RT_CHECK(reduce_build(pg, r, buf, count, dtype, op, 0, true, RT_K_ALLREDUCE, seq, &last));
        RT_CHECK(bcast_build(pg, r, buf, count * rt_dtype_size(dtype), 0, true, RT_K_ALLREDUCE, seq,
                             pg->rank == 0 ? last : NULL, pg->rank == 0 ? NULL : last));
    } else if (algo == RT_ALGO_RING && n > 1 && count * rt_dtype_size(dtype) <= small_bytes()) {
        /* small buffers: one exchange round (everyone sends its buffer to everyone),
         * then every rank reduces the n buffers in rank order: latency-bound sizes
         * pay one message delay instead of 2(n-1), results stay bitwise identical */
        size_t nb = count * rt_dtype_size(dtype);
        r->scratch = malloc(nb * (size_t)n + 1);
        if (!r->scratch) {
            rt_req_free(r);
            RT_CHECK_ALLOC(NULL, nb * (size_t)n);
        }
        uint8_t *slots = r->scratch;
        if (nb) memcpy(slots + (size_t)pg->rank * nb, buf, nb);
        for (int k = 1; k < n; k++) { /* send to the right first: spreads the load */
            int peer = MOD(pg->rank + k, n);
            ADD_OR_FAIL(
                rt_req_send(r, pg->ranks[peer], slots + (size_t)pg->rank * nb, nb, RT_K_ALLREDUCE, seq, NULL, false),
                r);
        }
        for (int k = 1; k < n; k++) {
            int peer = MOD(pg->rank - k, n);
            ADD_OR_FAIL(rt_req_recv(r, pg->ranks[peer], slots + (size_t)peer * nb, nb, RT_K_ALLREDUCE, seq, -1, dtype,
                                    0, NULL, false),
                        r);
        }
        r->pr_buf = buf;
        r->pr_slots = slots;
        r->pr_n = n;
        r->pr_op = (int)op;
        r->pr_count = count;
        r->pr_dtype = dtype;
    } else {
        RT_CHECK(ring_build(pg, r, buf, count, dtype, op, true, true, algo == RT_ALGO_RSAG, RT_K_ALLREDUCE, seq));
    }
    return finish(r, out);
}

rt_status rt_all_reduce_algo(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, rt_algo algo) {
    return all_reduce_(pg, buf, count, dtype, op, algo, NULL);
}
rt_status rt_all_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "all_reduce: NULL process group");
    return all_reduce_(pg, buf, count, dtype, op, pg->algo, NULL);
}
rt_status rt_iall_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "all_reduce: NULL process group");
    return all_reduce_(pg, buf, count, dtype, op, pg->algo, req);
}

static rt_status broadcast_(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root, rt_request **out) {
    if (pg->transport != RT_TRANSPORT_NCCL && pg->buf_device.kind == RT_DEVICE_CUDA) {
        void *host;
        size_t nb = count * rt_dtype_size(dtype);
        RT_CHECK(stage_begin(pg, "broadcast", buf, nb, out, &host));
        rt_device d = pg->buf_device;
        pg->buf_device = rt_device_cpu();
        rt_status s = broadcast_(pg, host, count, dtype, root, NULL);
        pg->buf_device = d;
        RT_CHECK(s);
        if (nb) RT_CHECK(rt_memcpy(buf, d, host, rt_device_cpu(), nb, NULL));
        return RT_OK;
    }
    RT_CHECK(check_args(pg, "broadcast", buf, count, dtype, 0, RT_OP_SUM, root));
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "broadcast", RT_K_BCAST, buf, buf, count, dtype, RT_OP_SUM, root, out);
    rt_request *r;
    RT_CHECK(new_req(pg, "broadcast", pg->size + 2, &r));
    RT_CHECK(bcast_build(pg, r, buf, count * rt_dtype_size(dtype), root, pg->algo == RT_ALGO_NAIVE, RT_K_BCAST,
                         ++pg->seq, NULL, NULL));
    return finish(r, out);
}
rt_status rt_broadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root) {
    return broadcast_(pg, buf, count, dtype, root, NULL);
}
rt_status rt_ibroadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root, rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return broadcast_(pg, buf, count, dtype, root, req);
}

static rt_status reduce_(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, int root,
                         rt_request **out) {
    RT_CHECK(check_args(pg, "reduce", buf, count, dtype, 1, op, root));
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "reduce", RT_K_REDUCE, buf, buf, count, dtype, op, root, out);
    rt_request *r;
    RT_CHECK(new_req(pg, "reduce", pg->size + 2, &r));
    const rt_xfer *last;
    RT_CHECK(
        reduce_build(pg, r, buf, count, dtype, op, root, pg->algo == RT_ALGO_NAIVE, RT_K_REDUCE, ++pg->seq, &last));
    return finish(r, out);
}
rt_status rt_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, int root) {
    return reduce_(pg, buf, count, dtype, op, root, NULL);
}
rt_status rt_ireduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op op, int root, rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return reduce_(pg, buf, count, dtype, op, root, req);
}

static rt_status scatter_(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                          rt_request **out) {
    RT_CHECK(check_args(pg, "scatter", recv, count, dtype, 0, RT_OP_SUM, root));
    RT_REQUIRE(pg->rank != root || send || count == 0, RT_ERR_INVALID, "scatter: NULL send buffer at the root");
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "scatter", RT_K_SCATTER, send, recv, count, dtype, RT_OP_SUM, root, out);
    size_t nb = count * rt_dtype_size(dtype);
    rt_request *r;
    RT_CHECK(new_req(pg, "scatter", pg->size + 1, &r));
    uint32_t seq = ++pg->seq;
    if (pg->rank == root) {
        for (int i = 0; i < pg->size; i++) {
            if (i == root) continue;
            ADD_OR_FAIL(rt_req_send(r, W(pg, i), AT(send, (size_t)i * nb), nb, RT_K_SCATTER, seq, NULL, false), r);
        }
        if (nb && (const uint8_t *)send + (size_t)root * nb != recv)
            memmove(recv, (const uint8_t *)send + (size_t)root * nb, nb);
    } else {
        ADD_OR_FAIL(rt_req_recv(r, W(pg, root), recv, nb, RT_K_SCATTER, seq, -1, dtype, 0, NULL, false), r);
    }
    return finish(r, out);
}
rt_status rt_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root) {
    return scatter_(pg, send, recv, count, dtype, root, NULL);
}
rt_status rt_iscatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                      rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return scatter_(pg, send, recv, count, dtype, root, req);
}

static rt_status gather_(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                         rt_request **out) {
    RT_CHECK(check_args(pg, "gather", send, count, dtype, 0, RT_OP_SUM, root));
    RT_REQUIRE(pg->rank != root || recv || count == 0, RT_ERR_INVALID, "gather: NULL receive buffer at the root");
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "gather", RT_K_GATHER, send, recv, count, dtype, RT_OP_SUM, root, out);
    size_t nb = count * rt_dtype_size(dtype);
    rt_request *r;
    RT_CHECK(new_req(pg, "gather", pg->size + 1, &r));
    uint32_t seq = ++pg->seq;
    if (pg->rank == root) {
        for (int i = 0; i < pg->size; i++) {
            if (i == root) continue;
            ADD_OR_FAIL(
                rt_req_recv(r, W(pg, i), AT(recv, (size_t)i * nb), nb, RT_K_GATHER, seq, -1, dtype, 0, NULL, false), r);
        }
        if (nb && (uint8_t *)recv + (size_t)root * nb != send) memmove((uint8_t *)recv + (size_t)root * nb, send, nb);
    } else {
        ADD_OR_FAIL(rt_req_send(r, W(pg, root), send, nb, RT_K_GATHER, seq, NULL, false), r);
    }
    return finish(r, out);
}
rt_status rt_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root) {
    return gather_(pg, send, recv, count, dtype, root, NULL);
}
rt_status rt_igather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                     rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return gather_(pg, send, recv, count, dtype, root, req);
}

static rt_status all_gather_(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_request **out) {
    RT_CHECK(check_args(pg, "all_gather", send, count, dtype, 0, RT_OP_SUM, 0));
    RT_REQUIRE(recv || count == 0, RT_ERR_INVALID, "all_gather: NULL receive buffer");
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "all_gather", RT_K_ALLGATHER, send, recv, count, dtype, RT_OP_SUM, 0, out);
    size_t nb = count * rt_dtype_size(dtype);
    uint8_t *mine = AT(recv, (size_t)pg->rank * nb);
    if (nb && mine != send) memmove(mine, send, nb);
    rt_request *r;
    RT_CHECK(new_req(pg, "all_gather", 2 * pg->size + 2, &r));
    RT_CHECK(ring_build(pg, r, recv, count * (size_t)pg->size, dtype, RT_OP_SUM, false, true, false, RT_K_ALLGATHER,
                        ++pg->seq));
    return finish(r, out);
}
rt_status rt_all_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype) {
    return all_gather_(pg, send, recv, count, dtype, NULL);
}
rt_status rt_iall_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return all_gather_(pg, send, recv, count, dtype, req);
}

rt_status rt_all_gather_list(rt_pg *pg, const void *send, void *const *recv_list, size_t count, rt_dtype dtype) {
    RT_CHECK(check_args(pg, "all_gather", send, count, dtype, 0, RT_OP_SUM, 0));
    RT_REQUIRE(recv_list != NULL, RT_ERR_INVALID, "all_gather: NULL receive list");
    RT_REQUIRE(pg->transport != RT_TRANSPORT_NCCL, RT_ERR_UNSUPPORTED,
               "all_gather (list form) over nccl: use rt_all_gather into one device buffer");
    size_t nb = count * rt_dtype_size(dtype);
    size_t total = nb * (size_t)pg->size;
    uint8_t *tmp = malloc(total ? total : 1);
    RT_CHECK_ALLOC(tmp, total);
    rt_status s = rt_all_gather(pg, send, tmp, count, dtype);
    if (s == RT_OK)
        for (int i = 0; i < pg->size; i++)
            if (nb) memcpy(recv_list[i], tmp + (size_t)i * nb, nb);
    free(tmp);
    return s;
}

static rt_status reduce_scatter_(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op,
                                 rt_request **out) {
    RT_CHECK(check_args(pg, "reduce_scatter", send, count, dtype, 1, op, 0));
    RT_REQUIRE(recv || count == 0, RT_ERR_INVALID, "reduce_scatter: NULL receive buffer");
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "reduce_scatter", RT_K_REDUCE_SCATTER, send, recv, count, dtype, op, 0, out);
    size_t nb = count * rt_dtype_size(dtype), total = nb * (size_t)pg->size;
    rt_request *r;
    RT_CHECK(new_req(pg, "reduce_scatter", 2 * pg->size + 2, &r));
    if (total) {
        r->scratch = malloc(total);
        if (!r->scratch) {
            rt_req_free(r);
            RT_CHECK_ALLOC(NULL, total);
        }
        memcpy(r->scratch, send, total);
    }
    uint8_t *mine = AT(r->scratch, (size_t)pg->rank * nb);
    if (pg->size == 1 && op == RT_OP_AVG) { /* nothing to add; the division by 1 is a no-op */
    }
    RT_CHECK(ring_build(pg, r, r->scratch, count * (size_t)pg->size, dtype, op, true, false, false, RT_K_REDUCE_SCATTER,
                        ++pg->seq));
    if (nb) RT_CHECK(rt_req_post_copy(r, recv, mine, nb));
    return finish(r, out);
}
rt_status rt_reduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op) {
    return reduce_scatter_(pg, send, recv, count, dtype, op, NULL);
}
rt_status rt_ireduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op op,
                             rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return reduce_scatter_(pg, send, recv, count, dtype, op, req);
}

/* Everyone tells rank 0, rank 0 answers everyone once all have arrived. */
static rt_status barrier_(rt_pg *pg, rt_request **out) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "barrier: NULL process group");
    if (pg->transport == RT_TRANSPORT_NCCL)
        return nccl_run(pg, "barrier", RT_K_BARRIER, NULL, NULL, 0, RT_I32, RT_OP_SUM, 0, out);
    rt_request *r;
    RT_CHECK(new_req(pg, "barrier", 2 * pg->size + 2, &r));
    uint32_t seq = ++pg->seq;
    if (pg->rank == 0) {
        const rt_xfer *prev = NULL;
        for (int i = 1; i < pg->size; i++) {
            rt_xfer *y = rt_req_recv(r, W(pg, i), NULL, 0, RT_K_BARRIER, seq, -1, RT_U8, 0, prev, true);
            ADD_OR_FAIL(y, r);
            prev = y;
        }
        for (int i = 1; i < pg->size; i++)
            ADD_OR_FAIL(rt_req_send(r, W(pg, i), NULL, 0, RT_K_BARRIER, seq, prev, true), r);
    } else {
        rt_xfer *x = rt_req_send(r, W(pg, 0), NULL, 0, RT_K_BARRIER, seq, NULL, false);
        ADD_OR_FAIL(x, r);
        ADD_OR_FAIL(rt_req_recv(r, W(pg, 0), NULL, 0, RT_K_BARRIER, seq, -1, RT_U8, 0, x, true), r);
    }
    return finish(r, out);
}
rt_status rt_barrier(rt_pg *pg) { return barrier_(pg, NULL); }
rt_status rt_ibarrier(rt_pg *pg, rt_request **req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "%s: NULL request pointer", __func__);
    *req = NULL;
    return barrier_(pg, req);
}
