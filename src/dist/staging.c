/* Staging: device buffers over a host transport (tcp, shm), for ranks sharing one GPU
 * (where NCCL cannot run). The host transports' run (transport.h, rt_run_host) wraps the
 * transfers with it when the group's buffers are on a device.
 *
 * On the group's copy stream, after the caller's stream (an event recorded there):
 * device -> a pinned host buffer of the pool; the host operation on the pinned buffer
 * starts when that copy has landed (its transfers are gated by the copy's event, polled
 * by the engine: the thread that queues the backward pass does not wait; on the progress
 * thread when asynchronous), and the request's device part then copies the
 * result back on the copy stream. rt_wait waits for the copy back on the host,
 * rt_wait_stream makes the caller's stream wait for it. A pinned buffer is reused only
 * after its last copy back (its event). */
#include "dist/internal/pg_internal.h"

#include <stdlib.h>

void rt_stage_pool_free(rt_pg *pg) {
    for (int i = 0; i < pg->nstage; i++) {
        rt_stage_buf *b = &pg->stage[i];
        if (b->ev) {
            (void)rt_event_sync(b->ev); /* a copy back may still read the buffer */
            rt_event_destroy(b->ev);
        }
        if (b->p) rt_host_free(b->p, b->pinned);
    }
    free(pg->stage);
    pg->stage = NULL;
    pg->nstage = 0;
    rt_event_destroy(pg->stage_ev_in);
    pg->stage_ev_in = NULL;
    rt_stream_destroy(pg->stage_stream);
    pg->stage_stream = NULL;
}

/* A free pinned buffer of at least nb bytes (index into pg->stage), its last copy
 * back complete. */
static rt_status stage_acquire(rt_pg *pg, size_t nb, int *slot) {
    if (!pg->stage_stream) RT_CHECK(rt_stream_create(pg->buf_device, &pg->stage_stream));
    if (!pg->stage_ev_in) RT_CHECK(rt_event_create(pg->buf_device, &pg->stage_ev_in));
    int pick = -1;
    for (int i = 0; i < pg->nstage; i++) {
        if (pg->stage[i].busy) continue;
        if (pg->stage[i].bytes >= nb) {
            pick = i;
            break;
        }
        if (pick < 0) pick = i; /* free but small: grown below */
    }
    if (pick < 0) {
        rt_stage_buf *grown = realloc(pg->stage, sizeof *grown * (size_t)(pg->nstage + 1));
        RT_CHECK_ALLOC(grown, sizeof *grown * (size_t)(pg->nstage + 1));
        pg->stage = grown;
        pick = pg->nstage++;
        pg->stage[pick] = (rt_stage_buf){0};
        RT_CHECK(rt_event_create(pg->buf_device, &pg->stage[pick].ev));
    }
    rt_stage_buf *b = &pg->stage[pick];
    RT_CHECK(rt_event_sync(b->ev)); /* its last copy back (a no-op when never recorded) */
    if (b->bytes < nb) {
        if (b->p) rt_host_free(b->p, b->pinned);
        b->p = NULL;
        b->bytes = 0;
        RT_CHECK(rt_host_alloc(nb ? nb : 1, true, &b->p, &b->pinned));
        b->bytes = nb;
    }
    b->busy = true;
    *slot = pick;
    return RT_OK;
}

typedef struct staged {
    rt_pg *pg;
    int slot;
    void *dst; /* the device buffer */
    size_t nb;
    bool back; /* the copy back is enqueued */
} staged;

static rt_status staged_copy_back(staged *c) {
    if (c->back) return RT_OK;
    rt_pg *pg = c->pg;
    rt_stage_buf *b = &pg->stage[c->slot];
    if (c->nb) RT_CHECK(rt_memcpy(c->dst, pg->buf_device, b->p, rt_device_cpu(), c->nb, pg->stage_stream));
    RT_CHECK(rt_event_record(b->ev, pg->stage_stream));
    c->back = true;
    return RT_OK;
}

static rt_status staged_poll(rt_request *r, bool *done) {
    staged *c = r->dev_ctx;
    RT_CHECK(staged_copy_back(c));
    return rt_event_query(c->pg->stage[c->slot].ev, done);
}

static rt_status staged_stream_wait(rt_request *r, rt_stream *s) {
    staged *c = r->dev_ctx;
    RT_CHECK(staged_copy_back(c));
    return rt_stream_wait_event(s, c->pg->stage[c->slot].ev);
}

static void staged_release(rt_request *r) {
    staged *c = r->dev_ctx;
    c->pg->stage[c->slot].busy = false; /* reused after its event (stage_acquire) */
    free(c);
    r->dev_ctx = NULL;
}

static const rt_req_dev_ops k_staged_ops = {staged_poll, staged_stream_wait, staged_release};

static rt_status run_staged(rt_pg *pg, const char *name, const rt_op *op, rt_request **out) {
    size_t nb = op->count * rt_dtype_size(op->dtype);
    int slot = -1;
    RT_CHECK(stage_acquire(pg, nb, &slot));
    staged *c = calloc(1, sizeof *c);
    if (!c) {
        pg->stage[slot].busy = false;
        RT_CHECK_ALLOC(NULL, sizeof *c);
    }
    *c = (staged){.pg = pg, .slot = slot, .dst = op->recv, .nb = nb};
    rt_stage_buf *b = &pg->stage[slot];
    rt_status s = RT_OK;
    if (nb) { /* device -> pinned, after everything already on the caller's stream */
        if (pg->stream) {
            s = rt_event_record(pg->stage_ev_in, pg->stream);
            if (s == RT_OK) s = rt_stream_wait_event(pg->stage_stream, pg->stage_ev_in);
        }
        if (s == RT_OK) s = rt_memcpy(b->p, rt_device_cpu(), op->recv, pg->buf_device, nb, pg->stage_stream);
        if (s == RT_OK) s = rt_event_record(b->ev, pg->stage_stream);
    }
    rt_op host = *op;
    host.send = host.recv = b->p;
    /* the transfers wait for the copy on the engine (the calling thread goes on queueing
     * the backward pass) where the builder reads the buffer only through transfers: the
     * ring and rsag all-reduce and broadcast; the others wait here, and so does a ring
     * all-reduce small enough for the one-round form (it copies the buffer at build
     * time), so that it takes the form, and gives the bits, a host buffer would */
    bool one_round = op->kind == RT_K_ALLREDUCE && op->algo == RT_ALGO_RING && nb <= pg->w->allreduce_small_bytes;
    if (nb && s == RT_OK) {
        if (op->kind == RT_K_BCAST ||
            (op->kind == RT_K_ALLREDUCE && !one_round && (op->algo == RT_ALGO_RING || op->algo == RT_ALGO_RSAG)))
            host.gate = b->ev;
        else
            s = rt_event_sync(b->ev);
    }
    rt_request *r = NULL;
    if (s == RT_OK) s = rt_pg_submit_req(pg, name, &host, true, out != NULL, true, &r);
    if (s != RT_OK) {
        b->busy = false;
        free(c);
        return s;
    }
    r->dev = &k_staged_ops;
    r->dev_ctx = c;
    if (out) {
        *out = r;
        return RT_OK;
    }
    return rt_wait(r); /* blocking: the result is in the device buffer on return */
}

rt_status rt_run_host(rt_pg *pg, const char *name, const rt_op *op, rt_request **out) {
    /* a barrier moves no buffer: it runs on the engine whatever the buffers' device */
    if (pg->buf_device.kind == RT_DEVICE_CUDA && op->kind != RT_K_BARRIER) return run_staged(pg, name, op, out);
    return rt_run_transfers(pg, name, op, out);
}
