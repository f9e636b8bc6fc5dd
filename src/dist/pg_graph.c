/* A group's operations inside a CUDA graph (dist.h, "CUDA graphs"; docs/dist.md).
 *
 * While the group's stream captures, an operation is enqueued into the graph, not run:
 * nothing is entered in the flight recorder, no sequence number is used and nothing is
 * handed to a watchdog, because nothing happens until the graph is launched. Between
 * rt_pg_capture_begin and rt_pg_capture_end the group notes each such operation (its
 * kind, dtype, count, root, operation and algorithm, and its rt_pg_set_op_tag) in an
 * rt_pg_graph. After each launch, rt_pg_graph_launched enters them in the flight recorder
 * as if they had just been called (sequence numbers advancing), and the transport records
 * one event on the launch stream behind the graph and watches it like any operation a
 * stream waits for: a dead peer or the timeout aborts the communicator and breaks the
 * group, and the entries complete (or fail) with the event.
 *
 * Only a transport whose device work needs no host (nccl) can be captured: its table
 * fills graph_launched. tcp and shm stage device buffers through pinned host memory and
 * drive the transfers from the host, which a graph cannot hold. */
#include "dist/internal/pg_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rt_pg_graph_op {
    int kind;
    bool is_send;
    rt_dtype dtype;
    size_t count;
    int root, rop;
    const char *algo;
    char op_tag[RT_FLIGHT_TAG];
} rt_pg_graph_op;

struct rt_pg_graph {
    const rt_pg *pg;
    rt_pg_graph_op *ops;
    int n, cap;
};

bool rt_pg_capturable(const rt_pg *pg, char *why, size_t n) {
    char buf[256] = "";
    if (!pg)
        snprintf(buf, sizeof buf, "no process group");
    else if (pg->buf_device.kind != RT_DEVICE_CUDA)
        snprintf(buf, sizeof buf,
                 "the group's buffers are host memory (dist.transport %s): its operations run on the host, outside "
                 "any CUDA graph",
                 pg->tp->name);
    else if (!pg->tp->graph_launched)
        snprintf(buf, sizeof buf,
                 "dist.transport %s stages device buffers through the host, which a CUDA graph cannot hold (nccl, "
                 "one GPU per rank, can be captured)",
                 pg->tp->name);
    else if (!pg->is_world)
        snprintf(buf, sizeof buf, "sub-groups are not supported on dist.transport %s", pg->tp->name);
    if (why && n) snprintf(why, n, "%s", buf);
    return buf[0] == '\0';
}

rt_status rt_pg_capture_begin(rt_pg *pg) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "rt_pg_capture_begin: NULL process group");
    char why[256];
    RT_REQUIRE(rt_pg_capturable(pg, why, sizeof why), RT_ERR_UNSUPPORTED,
               "rt_pg_capture_begin: this group's operations cannot be captured in a CUDA graph: %s", why);
    RT_REQUIRE(!pg->capture, RT_ERR_INVALID, "rt_pg_capture_begin: the group is capturing already");
    rt_pg_graph *g = calloc(1, sizeof *g);
    RT_CHECK_ALLOC(g, sizeof *g);
    g->pg = pg;
    pg->capture = g;
    pg->capture_open = 0;
    return RT_OK;
}

rt_status rt_pg_capture_end(rt_pg *pg, rt_pg_graph **out) {
    RT_REQUIRE(pg != NULL && out != NULL, RT_ERR_INVALID, "rt_pg_capture_end: NULL argument");
    *out = NULL;
    RT_REQUIRE(pg->capture, RT_ERR_INVALID, "rt_pg_capture_end: the group is not capturing (rt_pg_capture_begin)");
    rt_pg_graph *g = pg->capture;
    int open = pg->capture_open;
    pg->capture = NULL;
    pg->capture_open = 0;
    if (open > 0) {
        rt_pg_graph_free(g);
        RT_FAIL(RT_ERR_INVALID,
                "rt_pg_capture_end: %d captured operation%s not joined to a stream (rt_wait_stream on the capturing "
                "stream)",
                open, open == 1 ? " was" : "s were");
    }
    *out = g;
    return RT_OK;
}

void rt_pg_graph_free(rt_pg_graph *g) {
    if (!g) return;
    free(g->ops);
    free(g);
}

int rt_pg_graph_ops(const rt_pg_graph *g) { return g ? g->n : 0; }

rt_status rt_pg_capture_check(rt_pg *pg, const char *name, bool async, bool *captured) {
    /* host buffers: the stream does not concern them (dist.h, rt_pg_set_stream) */
    *captured = pg->buf_device.kind == RT_DEVICE_CUDA && pg->stream && rt_stream_capturing(pg->stream);
    if (!*captured) {
        RT_REQUIRE(!pg->capture, RT_ERR_INVALID,
                   "%s: the group is capturing (rt_pg_capture_begin) but its stream is not: set the group's stream "
                   "(rt_pg_set_stream) to the stream being captured",
                   name);
        return RT_OK;
    }
    char why[256];
    RT_REQUIRE(rt_pg_capturable(pg, why, sizeof why), RT_ERR_UNSUPPORTED,
               "%s: the group's stream is capturing a CUDA graph, but this group's operations cannot be captured: %s",
               name, why);
    RT_REQUIRE(pg->capture, RT_ERR_INVALID,
               "%s: the group's stream is capturing a CUDA graph: call rt_pg_capture_begin first (and "
               "rt_pg_graph_launched after each launch), so that the group knows what the graph holds",
               name);
    RT_REQUIRE(async, RT_ERR_INVALID,
               "%s: a blocking call cannot be captured (the host would wait for the device): use rt_i%s and "
               "rt_wait_stream",
               name, name);
    return RT_OK;
}

rt_status rt_pg_capture_note(rt_pg *pg, const rt_op *op, const char *algo, const char *op_tag) {
    rt_pg_graph *g = pg->capture;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        rt_pg_graph_op *p = realloc(g->ops, sizeof *p * (size_t)cap);
        RT_CHECK_ALLOC(p, sizeof *p * (size_t)cap);
        g->ops = p;
        g->cap = cap;
    }
    rt_pg_graph_op *o = &g->ops[g->n++];
    *o = (rt_pg_graph_op){
        .kind = op->kind,
        .is_send = op->is_send,
        .dtype = op->dtype,
        .count = op->count,
        .root = op->root,
        .rop = op->kind == RT_K_REDUCE || op->kind == RT_K_ALLREDUCE || op->kind == RT_K_REDUCE_SCATTER ? (int)op->rop
                                                                                                        : -1,
        .algo = algo};
    snprintf(o->op_tag, sizeof o->op_tag, "%s", op_tag);
    pg->capture_open++;
    return RT_OK;
}

void rt_pg_capture_forget(rt_pg *pg, bool unnote) {
    if (!pg || !pg->capture) return;
    if (pg->capture_open > 0) pg->capture_open--;
    if (unnote && pg->capture->n > 0) pg->capture->n--;
}

/* "<op tag>, <the group's tag now>", cut to fit (as collectives.c composes an operation's) */
static void launch_tag(const rt_pg *pg, const rt_pg_graph_op *o, char *tag) {
    size_t l = 0, cap = RT_FLIGHT_TAG - 1;
    const char *parts[3] = {o->op_tag, o->op_tag[0] && pg->tag[0] ? ", " : "", pg->tag};
    for (int i = 0; i < 3; i++)
        for (const char *p = parts[i]; *p && l < cap; p++) tag[l++] = *p;
    tag[l] = '\0';
}

/* debug mode: the ranks compare each captured operation's fingerprint, numbered as the
 * launch numbers it, before the entries are made */
static rt_status debug_check(rt_pg *pg, const rt_pg_graph *g) {
    uint32_t seq = pg->seq;
    for (int i = 0; i < g->n; i++) {
        const rt_pg_graph_op *o = &g->ops[i];
        if (o->kind == RT_K_P2P) continue;
        rt_flight_fp fp = {
            .seq = ++seq, .kind = o->kind, .rop = o->rop, .dtype = (int)o->dtype, .root = o->root, .count = o->count};
        launch_tag(pg, o, fp.tag);
        RT_CHECK(rt_pg_debug_check(pg, &fp));
    }
    return RT_OK;
}

rt_status rt_pg_graph_launchable(rt_pg *pg) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "rt_pg_graph_launchable: NULL group");
    rt_engine *e = &pg->w->eng;
    pthread_mutex_lock(&e->mu);
    rt_error_record rec = e->err;
    bool broken = e->broken;
    pthread_mutex_unlock(&e->mu);
    RT_REQUIRE(!broken, RT_ERR_PEER, "graph replay over %s: the process group is broken by an earlier error: %s",
               pg->tp->name, rec.msg);
    return RT_OK;
}

rt_status rt_pg_graph_launched(rt_pg *pg, const rt_pg_graph *g, rt_stream *s) {
    RT_REQUIRE(pg != NULL && g != NULL && s != NULL, RT_ERR_INVALID, "rt_pg_graph_launched: NULL argument");
    RT_REQUIRE(g->pg == pg, RT_ERR_INVALID, "rt_pg_graph_launched: the graph was captured on another group");
    RT_REQUIRE(!pg->capture, RT_ERR_INVALID,
               "rt_pg_graph_launched: the group is capturing (a graph is launched outside any capture)");
    RT_REQUIRE(!rt_stream_capturing(s), RT_ERR_INVALID,
               "rt_pg_graph_launched: the launch stream is capturing (a graph is launched outside any capture)");
    if (g->n == 0) return RT_OK;
    if (pg->debug) RT_CHECK(debug_check(pg, g));
    uint64_t first = 0;
    for (int i = 0; i < g->n; i++) {
        const rt_pg_graph_op *o = &g->ops[i];
        char tag[RT_FLIGHT_TAG];
        launch_tag(pg, o, tag);
        uint64_t id =
            rt_flight_begin(&pg->flight, o->kind, o->is_send, o->dtype, o->count, o->root, o->rop, o->algo, tag);
        if (i == 0) first = id;
        if (o->kind != RT_K_P2P)
            rt_flight_set_seq(&pg->flight, id, ++pg->seq);
        else if (pg->p2p_n)
            rt_flight_set_seq(&pg->flight, id, ++pg->p2p_n[2 * o->root + (o->is_send ? 0 : 1)]);
        rt_flight_started(&pg->flight, id);
    }
    rt_status st = pg->tp->graph_launched(pg, s, first, g->n);
    if (st != RT_OK)
        for (int i = 0; i < g->n && first; i++) rt_flight_end(&pg->flight, first + (uint64_t)i, false);
    return st;
}
