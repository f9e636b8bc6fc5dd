/* Point-to-point and collectives as graphs of transfers (engine.h): ring, chain and flat
 * algorithms, over any byte-stream transport. Every public call fills an rt_op and goes
 * through run(): the argument checks, the NULL-request guard of the rt_i* forms, then
 * the group's transport runs it (transport.h: the transfers here, staged through host
 * memory for device buffers in staging.c, or a whole-operation transport such as nccl),
 * through one submit path that frees the request whatever fails. A new operation is a
 * builder and a row of k_ops.
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
#include "dist/internal/pg_internal.h"

#include <stdio.h>
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

static bool reduces(int kind) { return kind == RT_K_REDUCE || kind == RT_K_ALLREDUCE || kind == RT_K_REDUCE_SCATTER; }
/* all_reduce and broadcast of device buffers over a host transport (tcp, shm) go through
 * pinned host memory (staging.c) */
static bool stageable(int kind) { return kind == RT_K_ALLREDUCE || kind == RT_K_BCAST; }
/* a barrier moves no buffer: it runs on the host engine whatever the buffers' device */
static bool moves_data(int kind) { return kind != RT_K_BARRIER; }

static rt_status check_args(rt_pg *pg, const char *name, const rt_op *op) {
    size_t es = rt_dtype_size(op->dtype);
    RT_REQUIRE((unsigned)op->dtype < RT_DTYPE_COUNT_ && es > 0, RT_ERR_INVALID, "%s: bad dtype %d", name,
               (int)op->dtype);
    RT_REQUIRE(!reduces(op->kind) || rt_reduce_dtype_ok(op->dtype), RT_ERR_INVALID,
               "%s: dtype %s cannot be reduced (f32 f64 i32 i64 bf16 can)", name, rt_dtype_name(op->dtype));
    RT_REQUIRE(!reduces(op->kind) || (unsigned)op->rop < RT_OP_COUNT_, RT_ERR_INVALID, "%s: bad reduce op %d", name,
               (int)op->rop);
    /* the buffers go to the transport as they are: host memory, a transport that takes
     * device buffers, or none moved */
    bool direct = pg->buf_device.kind == RT_DEVICE_CPU || pg->tp->device_only || !moves_data(op->kind);
    if (op->kind == RT_K_P2P) {
        RT_REQUIRE(op->root >= 0 && op->root < pg->size && op->root != pg->rank, RT_ERR_INVALID,
                   "%s: peer rank %d is not another rank of the group (size %d, this rank %d)", name, op->root,
                   pg->size, pg->rank);
        RT_REQUIRE(op->count <= RT_MSG_MAX_BYTES / es, RT_ERR_INVALID, "%s: %zu elements of dtype %d", name, op->count,
                   (int)op->dtype);
        RT_REQUIRE(op->recv || op->count == 0, RT_ERR_INVALID, "%s: NULL buffer", name);
        RT_REQUIRE(direct, RT_ERR_UNSUPPORTED,
                   "%s: device buffers over tcp/shm: only all_reduce and broadcast stage through host memory", name);
        return RT_OK;
    }
    RT_REQUIRE(op->count <= RT_MSG_MAX_BYTES / es / (size_t)pg->size, RT_ERR_INVALID, "%s: %zu elements is too many",
               name, op->count);
    RT_REQUIRE(op->root >= 0 && op->root < pg->size, RT_ERR_INVALID, "%s: root %d out of range 0..%d", name, op->root,
               pg->size - 1);
    bool root = pg->rank == op->root, none = op->count == 0;
    switch (op->kind) {
    case RT_K_SCATTER:
        RT_REQUIRE(op->recv || none, RT_ERR_INVALID, "%s: NULL buffer", name);
        RT_REQUIRE(!root || op->send || none, RT_ERR_INVALID, "scatter: NULL send buffer at the root");
        break;
    case RT_K_GATHER:
        RT_REQUIRE(op->send || none, RT_ERR_INVALID, "%s: NULL buffer", name);
        RT_REQUIRE(!root || op->recv || none, RT_ERR_INVALID, "gather: NULL receive buffer at the root");
        break;
    case RT_K_ALLGATHER:
    case RT_K_REDUCE_SCATTER:
        RT_REQUIRE(op->send || none, RT_ERR_INVALID, "%s: NULL buffer", name);
        RT_REQUIRE(op->recv || none, RT_ERR_INVALID, "%s: NULL receive buffer", name);
        break;
    default: /* in place */
        RT_REQUIRE(op->recv || none, RT_ERR_INVALID, "%s: NULL buffer", name);
        break;
    }
    RT_REQUIRE(direct || stageable(op->kind), RT_ERR_UNSUPPORTED,
               "%s: device buffers over %s: only all_reduce and broadcast stage through host memory (or use the "
               "nccl transport)",
               name, rt_transport_name(pg->transport));
    return RT_OK;
}
#define W(pg, r) ((pg)->ranks[MOD((r), (pg)->size)])
/* A transfer that does not fit is a bug in the table of transfer counts below; the
 * request is freed by the shared submit path. */
#define ADD_OR_FAIL(x, r)                                                                                              \
    do {                                                                                                               \
        if (!(x)) return RT_ERROR(RT_ERR_INTERNAL, "%s: transfer table full", (r)->opname);                            \
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
            RT_CHECK_ALLOC(r->scratch, nb);
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

/* Below this many bytes the ring all-reduce becomes one exchange round (0 disables):
 * RINGTRAIN_ALLREDUCE_SMALL_BYTES, read once when the world group is made. */
static size_t small_bytes(const rt_pg *pg) { return pg->w->allreduce_small_bytes; }

/* ---- one builder per operation: the transfers of this rank ---- */

static rt_status build_p2p(rt_pg *pg, rt_request *r, const rt_op *op) {
    size_t nb = op->count * rt_dtype_size(op->dtype);
    int wp = pg->ranks[op->root];
    if (op->is_send)
        ADD_OR_FAIL(rt_req_send(r, wp, op->send, nb, RT_K_P2P, 0, NULL, false), r);
    else
        ADD_OR_FAIL(rt_req_recv(r, wp, op->recv, nb, RT_K_P2P, 0, -1, op->dtype, 0, NULL, false), r);
    return RT_OK;
}

static rt_status build_all_reduce(rt_pg *pg, rt_request *r, const rt_op *op) {
    RT_REQUIRE(op->algo != RT_ALGO_NCCL, RT_ERR_UNSUPPORTED,
               "all_reduce: algorithm nccl needs the nccl transport and device buffers");
    int n = pg->size;
    void *buf = op->recv;
    size_t count = op->count;
    rt_dtype dtype = op->dtype;
    uint32_t seq = ++pg->seq;
    if (op->algo == RT_ALGO_NAIVE) {
        const rt_xfer *last = NULL;
        RT_CHECK(reduce_build(pg, r, buf, count, dtype, op->rop, 0, true, RT_K_ALLREDUCE, seq, &last));
        return bcast_build(pg, r, buf, count * rt_dtype_size(dtype), 0, true, RT_K_ALLREDUCE, seq,
                           pg->rank == 0 ? last : NULL, pg->rank == 0 ? NULL : last);
    }
    if (op->algo == RT_ALGO_RING && n > 1 && count * rt_dtype_size(dtype) <= small_bytes(pg) && !op->gate) {
        /* small buffers: one exchange round (everyone sends its buffer to everyone),
         * then every rank reduces the n buffers in rank order: latency-bound sizes
         * pay one message delay instead of 2(n-1), results stay bitwise identical */
        size_t nb = count * rt_dtype_size(dtype);
        r->scratch = malloc(nb * (size_t)n + 1);
        RT_CHECK_ALLOC(r->scratch, nb * (size_t)n + 1);
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
        r->pr_op = (int)op->rop;
        r->pr_count = count;
        r->pr_dtype = dtype;
        return RT_OK;
    }
    return ring_build(pg, r, buf, count, dtype, op->rop, true, true, op->algo == RT_ALGO_RSAG, RT_K_ALLREDUCE, seq);
}

static rt_status build_broadcast(rt_pg *pg, rt_request *r, const rt_op *op) {
    return bcast_build(pg, r, op->recv, op->count * rt_dtype_size(op->dtype), op->root, pg->algo == RT_ALGO_NAIVE,
                       RT_K_BCAST, ++pg->seq, NULL, NULL);
}

static rt_status build_reduce(rt_pg *pg, rt_request *r, const rt_op *op) {
    const rt_xfer *last;
    return reduce_build(pg, r, op->recv, op->count, op->dtype, op->rop, op->root, pg->algo == RT_ALGO_NAIVE,
                        RT_K_REDUCE, ++pg->seq, &last);
}

static rt_status build_scatter(rt_pg *pg, rt_request *r, const rt_op *op) {
    size_t nb = op->count * rt_dtype_size(op->dtype);
    uint32_t seq = ++pg->seq;
    if (pg->rank == op->root) {
        for (int i = 0; i < pg->size; i++) {
            if (i == op->root) continue;
            ADD_OR_FAIL(rt_req_send(r, W(pg, i), AT(op->send, (size_t)i * nb), nb, RT_K_SCATTER, seq, NULL, false), r);
        }
        const uint8_t *mine = (const uint8_t *)op->send + (size_t)op->root * nb;
        if (nb && mine != op->recv) memmove(op->recv, mine, nb);
    } else {
        ADD_OR_FAIL(rt_req_recv(r, W(pg, op->root), op->recv, nb, RT_K_SCATTER, seq, -1, op->dtype, 0, NULL, false), r);
    }
    return RT_OK;
}

static rt_status build_gather(rt_pg *pg, rt_request *r, const rt_op *op) {
    size_t nb = op->count * rt_dtype_size(op->dtype);
    uint32_t seq = ++pg->seq;
    if (pg->rank == op->root) {
        for (int i = 0; i < pg->size; i++) {
            if (i == op->root) continue;
            ADD_OR_FAIL(rt_req_recv(r, W(pg, i), AT(op->recv, (size_t)i * nb), nb, RT_K_GATHER, seq, -1, op->dtype, 0,
                                    NULL, false),
                        r);
        }
        uint8_t *mine = (uint8_t *)op->recv + (size_t)op->root * nb;
        if (nb && mine != op->send) memmove(mine, op->send, nb);
    } else {
        ADD_OR_FAIL(rt_req_send(r, W(pg, op->root), op->send, nb, RT_K_GATHER, seq, NULL, false), r);
    }
    return RT_OK;
}

static rt_status build_all_gather(rt_pg *pg, rt_request *r, const rt_op *op) {
    size_t nb = op->count * rt_dtype_size(op->dtype);
    uint8_t *mine = AT(op->recv, (size_t)pg->rank * nb);
    if (nb && mine != op->send) memmove(mine, op->send, nb);
    return ring_build(pg, r, op->recv, op->count * (size_t)pg->size, op->dtype, RT_OP_SUM, false, true, false,
                      RT_K_ALLGATHER, ++pg->seq);
}

static rt_status build_reduce_scatter(rt_pg *pg, rt_request *r, const rt_op *op) {
    size_t nb = op->count * rt_dtype_size(op->dtype), total = nb * (size_t)pg->size;
    if (total) {
        r->scratch = malloc(total);
        RT_CHECK_ALLOC(r->scratch, total);
        memcpy(r->scratch, op->send, total);
    }
    uint8_t *mine = AT(r->scratch, (size_t)pg->rank * nb);
    RT_CHECK(ring_build(pg, r, r->scratch, op->count * (size_t)pg->size, op->dtype, op->rop, true, false, false,
                        RT_K_REDUCE_SCATTER, ++pg->seq));
    if (nb) RT_CHECK(rt_req_post_copy(r, op->recv, mine, nb));
    return RT_OK;
}

/* Everyone tells rank 0, rank 0 answers everyone once all have arrived. */
static rt_status build_barrier(rt_pg *pg, rt_request *r, const rt_op *op) {
    (void)op;
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
    return RT_OK;
}

/* Per operation: its builder and the most transfers it adds (per_rank * size + extra). */
static const struct {
    rt_status (*build)(rt_pg *pg, rt_request *r, const rt_op *op);
    int per_rank, extra;
} k_ops[RT_K_COUNT_] = {
    [RT_K_P2P] = {build_p2p, 0, 1},
    [RT_K_BCAST] = {build_broadcast, 1, 2},
    [RT_K_REDUCE] = {build_reduce, 1, 2},
    [RT_K_ALLREDUCE] = {build_all_reduce, 4, 4},
    [RT_K_SCATTER] = {build_scatter, 1, 1},
    [RT_K_GATHER] = {build_gather, 1, 1},
    [RT_K_ALLGATHER] = {build_all_gather, 2, 2},
    [RT_K_REDUCE_SCATTER] = {build_reduce_scatter, 2, 2},
    [RT_K_BARRIER] = {build_barrier, 2, 2},
};

/* ---- the shared submit path: every operation of every transport goes through here ---- */

/* The operation's tag: "<op tag>, <context>" (rt_pg_set_op_tag, rt_pg_set_tag), cut to fit. */
static void compose_tag(const rt_pg *pg, char *tag) {
    size_t l = 0, cap = RT_FLIGHT_TAG - 1;
    const char *parts[3] = {pg->op_tag, pg->op_tag[0] && pg->tag[0] ? ", " : "", pg->tag};
    for (int i = 0; i < 3; i++)
        for (const char *p = parts[i]; *p && l < cap; p++) tag[l++] = *p;
    tag[l] = '\0';
}

/* The algorithm as the flight recorder names it. */
static const char *flight_algo(const rt_pg *pg, const rt_op *op) {
    if (pg->tp->algo) return pg->tp->algo; /* a transport that runs operations whole */
    if (op->kind == RT_K_P2P) return "direct";
    if (op->kind == RT_K_ALLREDUCE) return rt_algo_name(op->algo);
    if (op->kind == RT_K_BCAST || op->kind == RT_K_REDUCE) return pg->algo == RT_ALGO_NAIVE ? "flat" : "chain";
    if (op->kind == RT_K_SCATTER || op->kind == RT_K_GATHER) return "flat";
    return "ring";
}

/* A captured operation (pg_graph.c): an empty request for the transport's device part,
 * noted in the group's graph; no recorder entry and no sequence number (both come at each
 * launch: rt_pg_graph_launched). */
static rt_status submit_captured(rt_pg *pg, const char *name, const rt_op *op, rt_request **out) {
    rt_request *r;
    RT_CHECK(rt_req_new(&pg->w->eng, name, pg->id, pg->timeout_s, 0, &r));
    r->owner = pg;
    r->fr_dev = true;
    r->captured = true;
    rt_status s = rt_req_submit(r, false);
    if (s == RT_OK) s = rt_pg_capture_note(pg, op, flight_algo(pg, op), pg->op_tag);
    pg->op_tag[0] = '\0';
    if (s != RT_OK) {
        rt_req_free(r);
        return s;
    }
    *out = r;
    return RT_OK;
}

/* A new request (built by `build` when given), submitted (driven by the progress thread
 * when `async` and it has transfers) but not waited for. Whatever fails, it is freed.
 * It is recorded in the group's flight recorder: queued here, started just before it is
 * submitted, ended by the engine (or, with `dev_part`, by its device part: pg.c's
 * dev_poll; a request freed still open is ended by rt_req_free). */
rt_status rt_pg_submit_req(rt_pg *pg, const char *name, const rt_op *op, bool build, bool async, bool dev_part,
                           rt_request **out) {
    if (op->captured) return submit_captured(pg, name, op, out);
    int maxx = build ? k_ops[op->kind].per_rank * pg->size + k_ops[op->kind].extra : 0;
    rt_request *r;
    char tag[RT_FLIGHT_TAG];
    compose_tag(pg, tag);
    pg->op_tag[0] = '\0';
    uint64_t fid = rt_flight_begin(&pg->flight, op->kind, op->is_send, op->dtype, op->count, op->root,
                                   reduces(op->kind) ? (int)op->rop : -1, flight_algo(pg, op), tag);
    rt_status s = rt_req_new(&pg->w->eng, name, pg->id, pg->timeout_s, maxx, &r);
    if (s != RT_OK) {
        rt_flight_end(&pg->flight, fid, false);
        return s;
    }
    r->fr = &pg->flight;
    r->fr_id = fid;
    r->owner = pg;
    r->slow_s = rt_pg_slow_after_s(pg->timeout_s);
    r->fr_dev = dev_part;
    r->gate = op->gate;
    uint32_t seq0 = pg->seq;
    s = build ? k_ops[op->kind].build(pg, r, op) : RT_OK;
    if (s == RT_OK && !build && op->kind != RT_K_P2P) ++pg->seq; /* nccl: numbered like the others */
    if (pg->seq != seq0) rt_flight_set_seq(&pg->flight, fid, pg->seq);
    if (s == RT_OK && op->kind == RT_K_P2P && pg->p2p_n) /* p2p: the n-th message to (from) that peer */
        rt_flight_set_seq(&pg->flight, fid, ++pg->p2p_n[2 * op->root + (op->is_send ? 0 : 1)]);
    if (s == RT_OK) {
        rt_flight_started(&pg->flight, fid); /* before the progress thread may end it */
        s = rt_req_submit(r, async && r->nx > 0);
    }
    if (s != RT_OK) {
        rt_req_free(r);
        return s;
    }
    *out = r;
    return RT_OK;
}

/* Submitted, then waited for and freed (blocking, out == NULL) or handed back in *out. */
static rt_status submit(rt_pg *pg, const char *name, const rt_op *op, bool build, rt_request **out) {
    rt_request *r;
    RT_CHECK(rt_pg_submit_req(pg, name, op, build, out != NULL, false, &r));
    if (out) {
        *out = r;
        return RT_OK;
    }
    rt_status s = rt_req_wait(r);
    rt_req_free(r);
    return s;
}

/* ---- the paths a transport's run takes (transport.h) ---- */

rt_status rt_run_transfers(rt_pg *pg, const char *name, const rt_op *op, rt_request **out) {
    return submit(pg, name, op, true, out);
}

rt_status rt_run_enqueued(rt_pg *pg, const char *name, const rt_op *op, rt_request **out,
                          rt_status (*enqueue)(rt_pg *pg, const rt_op *op, rt_request *r)) {
    /* an empty request (no host part) whose device part is the operation on the
     * transport's stream: handed back before it completes, or waited for */
    rt_request *r;
    RT_CHECK(rt_pg_submit_req(pg, name, op, false, false, true, &r));
    rt_status s = enqueue(pg, op, r);
    if (s != RT_OK) {
        if (r->captured) rt_pg_capture_forget(pg, true);
        rt_flight_end(&pg->flight, r->fr_id, false);
        rt_req_free(r);
        return s;
    }
    if (out) {
        *out = r;
        return RT_OK;
    }
    return rt_wait(r);
}

/* Every public operation: check, then run it on the group's transport. */
static rt_status run(rt_pg *pg, const rt_op *op, bool async, rt_request **req) {
    const char *name = rt_comm_op_name(op->kind, op->is_send);
    if (async) { /* the one NULL-request guard */
        RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_i%s: NULL request pointer", name);
        *req = NULL;
    }
    rt_request **out = async ? req : NULL;
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "%s: NULL process group", name);
    RT_CHECK(check_args(pg, name, op));
    rt_op cop = *op;
    RT_CHECK(rt_pg_capture_check(pg, name, async, &cop.captured));
    if (cop.captured) return pg->tp->run(pg, name, &cop, out); /* debug mode checks at each launch */
    if (pg->debug && op->kind != RT_K_P2P) {                   /* debug mode: the ranks agree before anything runs */
        rt_flight_fp fp = {.seq = pg->seq + 1,
                           .kind = op->kind,
                           .rop = reduces(op->kind) ? (int)op->rop : -1,
                           .dtype = (int)op->dtype,
                           .root = op->root,
                           .count = op->count};
        compose_tag(pg, fp.tag);
        RT_CHECK(rt_pg_debug_check(pg, &fp));
    }
    return pg->tp->run(pg, name, op, out);
}

/* ---- the public calls ---- */

static rt_op op_of(int kind, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op rop, int root) {
    return (rt_op){.kind = kind, .send = send, .recv = recv, .count = count, .dtype = dtype, .rop = rop, .root = root};
}

rt_status rt_send(rt_pg *pg, const void *buf, size_t count, rt_dtype dtype, int dst) {
    rt_op op = op_of(RT_K_P2P, buf, (void *)buf, count, dtype, RT_OP_SUM, dst);
    op.is_send = true;
    return run(pg, &op, false, NULL);
}
rt_status rt_recv(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int src) {
    rt_op op = op_of(RT_K_P2P, buf, buf, count, dtype, RT_OP_SUM, src);
    return run(pg, &op, false, NULL);
}
rt_status rt_isend(rt_pg *pg, const void *buf, size_t count, rt_dtype dtype, int dst, rt_request **req) {
    rt_op op = op_of(RT_K_P2P, buf, (void *)buf, count, dtype, RT_OP_SUM, dst);
    op.is_send = true;
    return run(pg, &op, true, req);
}
rt_status rt_irecv(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int src, rt_request **req) {
    rt_op op = op_of(RT_K_P2P, buf, buf, count, dtype, RT_OP_SUM, src);
    return run(pg, &op, true, req);
}

rt_status rt_all_reduce_algo(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op rop, rt_algo algo) {
    rt_op op = op_of(RT_K_ALLREDUCE, buf, buf, count, dtype, rop, 0);
    op.algo = algo;
    return run(pg, &op, false, NULL);
}
rt_status rt_all_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op rop) {
    rt_op op = op_of(RT_K_ALLREDUCE, buf, buf, count, dtype, rop, 0);
    op.algo = pg ? pg->algo : RT_ALGO_RING;
    return run(pg, &op, false, NULL);
}
rt_status rt_iall_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op rop, rt_request **req) {
    rt_op op = op_of(RT_K_ALLREDUCE, buf, buf, count, dtype, rop, 0);
    op.algo = pg ? pg->algo : RT_ALGO_RING;
    return run(pg, &op, true, req);
}

rt_status rt_broadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root) {
    rt_op op = op_of(RT_K_BCAST, buf, buf, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, false, NULL);
}
rt_status rt_ibroadcast(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, int root, rt_request **req) {
    rt_op op = op_of(RT_K_BCAST, buf, buf, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, true, req);
}

rt_status rt_reduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op rop, int root) {
    rt_op op = op_of(RT_K_REDUCE, buf, buf, count, dtype, rop, root);
    return run(pg, &op, false, NULL);
}
rt_status rt_ireduce(rt_pg *pg, void *buf, size_t count, rt_dtype dtype, rt_reduce_op rop, int root, rt_request **req) {
    rt_op op = op_of(RT_K_REDUCE, buf, buf, count, dtype, rop, root);
    return run(pg, &op, true, req);
}

rt_status rt_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root) {
    rt_op op = op_of(RT_K_SCATTER, send, recv, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, false, NULL);
}
rt_status rt_iscatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                      rt_request **req) {
    rt_op op = op_of(RT_K_SCATTER, send, recv, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, true, req);
}

rt_status rt_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root) {
    rt_op op = op_of(RT_K_GATHER, send, recv, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, false, NULL);
}
rt_status rt_igather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, int root,
                     rt_request **req) {
    rt_op op = op_of(RT_K_GATHER, send, recv, count, dtype, RT_OP_SUM, root);
    return run(pg, &op, true, req);
}

rt_status rt_all_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype) {
    rt_op op = op_of(RT_K_ALLGATHER, send, recv, count, dtype, RT_OP_SUM, 0);
    return run(pg, &op, false, NULL);
}
rt_status rt_iall_gather(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_request **req) {
    rt_op op = op_of(RT_K_ALLGATHER, send, recv, count, dtype, RT_OP_SUM, 0);
    return run(pg, &op, true, req);
}

rt_status rt_all_gather_list(rt_pg *pg, const void *send, void *const *recv_list, size_t count, rt_dtype dtype) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "all_gather: NULL process group");
    RT_REQUIRE(recv_list != NULL, RT_ERR_INVALID, "all_gather: NULL receive list");
    RT_REQUIRE(!pg->tp->device_only, RT_ERR_UNSUPPORTED,
               "all_gather (list form) over %s: use rt_all_gather into one device buffer", pg->tp->name);
    size_t es = rt_dtype_size(dtype);
    RT_REQUIRE(es > 0 && count <= RT_MSG_MAX_BYTES / es / (size_t)pg->size, RT_ERR_INVALID,
               "all_gather: %zu elements of dtype %d", count, (int)dtype);
    size_t nb = count * es;
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

rt_status rt_reduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op rop) {
    rt_op op = op_of(RT_K_REDUCE_SCATTER, send, recv, count, dtype, rop, 0);
    return run(pg, &op, false, NULL);
}
rt_status rt_ireduce_scatter(rt_pg *pg, const void *send, void *recv, size_t count, rt_dtype dtype, rt_reduce_op rop,
                             rt_request **req) {
    rt_op op = op_of(RT_K_REDUCE_SCATTER, send, recv, count, dtype, rop, 0);
    return run(pg, &op, true, req);
}

rt_status rt_barrier(rt_pg *pg) {
    rt_op op = op_of(RT_K_BARRIER, NULL, NULL, 0, RT_I32, RT_OP_SUM, 0);
    return run(pg, &op, false, NULL);
}
rt_status rt_ibarrier(rt_pg *pg, rt_request **req) {
    rt_op op = op_of(RT_K_BARRIER, NULL, NULL, 0, RT_I32, RT_OP_SUM, 0);
    return run(pg, &op, true, req);
}
