/* The gradient reducer (reducer.h): buckets of whole segments from the end of the
 * buffer, each started with rt_iall_reduce as soon as all its bytes are reported.
 *
 * With tracing on (core/trace.h) each bucket's all-reduce becomes a span on the
 * communication track: from its start (or the completion of the bucket before it, as the
 * transport runs a group's operations in order) to its completion, read from the
 * group's flight recorder entry (the time the progress thread ended it). */
#include "dist/reducer.h"

#include "core/timer.h"
#include "core/trace.h"
#include "dist/internal/bf16_ops.h"
#include "dist/internal/names.h"
#include "dist/internal/pg_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    size_t begin, end; /* bytes of the buffer */
    size_t ready;      /* bytes reported this step */
    rt_request *req;   /* in flight */
    bool started;
    /* tracing: when it was started, its flight recorder entry (0: none), when its wait
     * returned (the completion when the recorder has none) */
    uint64_t t_start, fr_id, t_waited;
    uint64_t p_start, p_fr_id, p_waited; /* the same of the previous step, not yet traced */
} bucket;

struct rt_reducer {
    rt_pg *pg;
    char *buf;
    size_t total;
    rt_reducer_options opt;
    bucket *b;
    int nb;
    size_t *bounds; /* the segments, nseg + 1 offsets */
    bool *seg_ready;
    int nseg;
    /* compress_bf16: the casts of wire_dev's kind (bf16_ops.h): with a stream enqueued
     * there (after the producer's work), else on the host now */
    const rt_dist_bf16_ops *bf16;
    uint16_t *wire;     /* compress_bf16: the bf16 copy of the buffer (element i at i) */
    rt_device wire_dev; /* where it lives: the group's buffer device with a stream, else the host */
    int next;           /* the next bucket to start: buckets start in order on every rank */
    bool open;          /* between begin and finish */
    rt_reducer_stats stats;
    int fault_bucket, fault; /* rt_reducer_test_fault (-1: none) */
    int64_t p_step, p_epoch; /* tracing: the step of the p_* fields */
};

void rt_reducer_options_default(rt_reducer_options *o) {
    *o = (rt_reducer_options){
        .bucket_bytes = (size_t)25 << 20, .first_bucket_bytes = (size_t)1 << 20, .dtype = RT_F32, .op = RT_OP_AVG};
}

rt_status rt_reducer_create(rt_pg *pg, void *buf, const size_t *bounds, int nseg, const rt_reducer_options *o,
                            rt_reducer **out) {
    RT_REQUIRE(pg && buf && bounds && o && out, RT_ERR_INVALID, "rt_reducer_create: NULL argument");
    RT_REQUIRE(nseg >= 1, RT_ERR_INVALID, "rt_reducer_create: %d segments (expected at least 1)", nseg);
    size_t es = rt_dtype_size(o->dtype);
    RT_REQUIRE(es > 0, RT_ERR_INVALID, "rt_reducer_create: dtype %d", (int)o->dtype);
    RT_REQUIRE(!o->compress_bf16 || o->dtype == RT_F32, RT_ERR_UNSUPPORTED,
               "rt_reducer_create: bf16 compression needs an f32 buffer (dtype %s)", rt_dtype_name(o->dtype));
    RT_REQUIRE(!o->compress_bf16 || !o->stream || (rt_cuda_built() && pg->buf_device.kind == RT_DEVICE_CUDA),
               RT_ERR_UNSUPPORTED,
               "rt_reducer_create: bf16 compression with a device stream needs the group's buffers on a GPU "
               "(rt_pg_set_buffer_device) in a CUDA build");
    RT_REQUIRE(bounds[0] == 0, RT_ERR_INVALID, "rt_reducer_create: bounds[0] = %zu (expected 0)", bounds[0]);
    for (int i = 0; i < nseg; i++)
        RT_REQUIRE(bounds[i + 1] > bounds[i] && bounds[i + 1] % es == 0, RT_ERR_INVALID,
                   "rt_reducer_create: segment %d is [%zu, %zu) (expected ascending multiples of %zu bytes)", i,
                   bounds[i], bounds[i + 1], es);
    rt_reducer *r = calloc(1, sizeof *r);
    RT_CHECK_ALLOC(r, sizeof *r);
    r->fault_bucket = -1;
    r->b = calloc((size_t)nseg, sizeof *r->b);
    r->bounds = malloc(sizeof *r->bounds * (size_t)(nseg + 1));
    r->seg_ready = calloc((size_t)nseg, sizeof *r->seg_ready);
    if (!r->b || !r->bounds || !r->seg_ready) {
        rt_reducer_destroy(r);
        return RT_ERROR(RT_ERR_NOMEM, "rt_reducer_create: %d segments", nseg);
    }
    r->wire_dev = o->stream ? pg->buf_device : rt_device_cpu();
    if (o->compress_bf16) {
        r->bf16 = rt_dist_bf16_ops_of(r->wire_dev.kind);
        if (!r->bf16) {
            char dev[32];
            rt_device_str(r->wire_dev, dev, sizeof dev);
            rt_reducer_destroy(r);
            RT_FAIL(RT_ERR_UNSUPPORTED, "rt_reducer_create: bf16 compression on %s: not in this build", dev);
        }
        rt_status ws = rt_malloc(r->wire_dev, bounds[nseg] / 2, (void **)&r->wire);
        if (ws != RT_OK) {
            rt_reducer_destroy(r);
            return rt_error_trace(__FILE__, __LINE__, "rt_reducer_create: the bf16 staging buffer"), ws;
        }
    }
    memcpy(r->bounds, bounds, sizeof *r->bounds * (size_t)(nseg + 1));
    r->nseg = nseg;
    r->pg = pg;
    r->buf = buf;
    r->total = bounds[nseg];
    r->opt = *o;
    if (r->opt.first_bucket_bytes == 0) r->opt.first_bucket_bytes = r->opt.bucket_bytes;
    if (o->bucket_bytes == 0) {
        r->b[0] = (bucket){.begin = 0, .end = r->total};
        r->nb = 1;
    } else {
        /* whole segments from the end until the bucket reaches its target */
        size_t end = r->total;
        for (int s = nseg - 1; s >= 0; s--) {
            size_t target = r->nb == 0 ? r->opt.first_bucket_bytes : r->opt.bucket_bytes;
            if (end - bounds[s] >= target || s == 0) {
                r->b[r->nb++] = (bucket){.begin = bounds[s], .end = end};
                end = bounds[s];
            }
        }
    }
    *out = r;
    return RT_OK;
}

void rt_reducer_destroy(rt_reducer *r) {
    if (!r) return;
    for (int i = 0; i < r->nb; i++)
        if (r->b[i].req) (void)rt_wait(r->b[i].req); /* a step abandoned on an error */
    free(r->b);
    free(r->bounds);
    free(r->seg_ready);
    if (r->wire && r->opt.stream) (void)rt_stream_sync(r->opt.stream); /* its widening may still read it */
    if (r->wire) rt_free(r->wire_dev, r->wire);
    free(r);
}

int rt_reducer_bucket_count(const rt_reducer *r) { return r->nb; }

void rt_reducer_bucket_range(const rt_reducer *r, int i, size_t *begin, size_t *end) {
    *begin = r->b[i].begin;
    *end = r->b[i].end;
}

rt_status rt_reducer_begin(rt_reducer *r) {
    RT_REQUIRE(!r->open, RT_ERR_INVALID, "rt_reducer_begin: the previous step was not finished");
    for (int i = 0; i < r->nb; i++) {
        r->b[i].ready = 0;
        r->b[i].started = false;
        r->b[i].t_start = r->b[i].fr_id = 0;
    }
    memset(r->seg_ready, 0, sizeof *r->seg_ready * (size_t)r->nseg);
    r->next = 0;
    r->open = true;
    memset(&r->stats, 0, sizeof r->stats);
    r->stats.begin_ns = rt_now_ns();
    return RT_OK;
}

/* Tracing: the id of the all-reduce of `count` elements this thread has just begun on
 * the group (the newest entry of its flight recorder), 0 if the recorder has none. */
static uint64_t flight_last(rt_pg *pg, size_t count) {
    return pg->has_flight ? rt_flight_last_allreduce(&pg->flight, count) : 0;
}

/* Tracing: one step's bucket spans, this step's (late false) or the previous step's. */
static void emit_spans(rt_reducer *r, bool late) {
    uint64_t prev_end = 0;
    for (int i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        uint64_t ts = late ? b->p_start : b->t_start;
        if (!ts) continue;
        uint64_t done = 0;
        const char *algo = NULL;
        if (r->pg->has_flight) rt_flight_end_of(&r->pg->flight, late ? b->p_fr_id : b->fr_id, &done, &algo);
        if (!done) done = late ? b->p_waited : b->t_waited;
        uint64_t t0 = ts > prev_end ? ts : prev_end;
        if (done < t0) done = t0;
        int64_t bytes = (int64_t)(b->end - b->begin);
        if (late)
            rt_trace_span_comm_at(RT_TRACK_COMM, "all_reduce bucket", t0, done, i, bytes, algo, t0 - ts, r->p_step,
                                  r->p_epoch);
        else
            rt_trace_span_comm(RT_TRACK_COMM, "all_reduce bucket", t0, done, i, bytes, algo, t0 - ts);
        prev_end = done;
        if (late)
            b->p_start = 0;
        else
            b->t_start = 0;
    }
}

/* Tracing, after the step's waits. The host waited for the operations: their spans now.
 * A device stream waits for them (opt.stream): they complete after this returns, so
 * their spans are recorded a step later (or at rt_reducer_trace_flush), with the end the
 * flight recorder saw by then (nccl: its watchdog's; else, or not seen yet, the
 * hand-off to the stream). */
static void trace_buckets(rt_reducer *r) {
    emit_spans(r, true);
    if (!r->opt.stream) {
        emit_spans(r, false);
        return;
    }
    for (int i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        b->p_start = b->t_start;
        b->p_fr_id = b->fr_id;
        b->p_waited = b->t_waited;
        b->t_start = 0;
    }
    rt_trace_get_step(&r->p_step, &r->p_epoch);
}

void rt_reducer_trace_flush(rt_reducer *r) {
    if (r && rt_trace_enabled()) emit_spans(r, true);
}

static rt_status start(rt_reducer *r, bucket *b) {
    size_t es = rt_dtype_size(r->opt.dtype);
    if (r->next == 0) r->stats.first_start_ns = rt_now_ns();
    /* ordered after what the producer has enqueued so far (the stream contract) */
    rt_stream *saved = rt_pg_stream(r->pg);
    if (r->opt.stream) rt_pg_set_stream(r->pg, r->opt.stream);
    int idx = (int)(b - r->b), fault = idx == r->fault_bucket ? r->fault : RT_REDUCER_FAULT_NONE;
    char tag[48];
    snprintf(tag, sizeof tag, "bucket %d of %d", idx + 1, r->nb); /* in flight files and diagnoses */
    rt_pg_set_op_tag(r->pg, tag);
    /* a captured bucket is not traced: its recorder entries come at each launch (pg_graph.c) */
    b->t_start = fault == RT_REDUCER_FAULT_SKIP || r->pg->capture ? 0 : rt_trace_now();
    size_t count = (b->end - b->begin) / es - (fault == RT_REDUCER_FAULT_SHORT && b->end - b->begin > es ? 1 : 0);
    rt_status s = RT_OK;
    if (fault == RT_REDUCER_FAULT_SKIP) {
        rt_pg_set_op_tag(r->pg, NULL);
    } else if (r->opt.compress_bf16) {
        /* rounding point 1: this rank's f32 gradient to bf16 (on the producer's stream) */
        uint16_t *w = r->wire + b->begin / es;
        s = r->bf16->pack(r->opt.stream, (const float *)(r->buf + b->begin), w, count);
        if (s == RT_OK) s = rt_iall_reduce(r->pg, w, count, RT_BF16, r->opt.op, &b->req);
        r->stats.bytes += count * rt_dtype_size(RT_BF16);
    } else {
        s = rt_iall_reduce(r->pg, r->buf + b->begin, count, r->opt.dtype, r->opt.op, &b->req);
        r->stats.bytes += count * es;
    }
    rt_pg_set_stream(r->pg, saved);
    RT_CHECK(s);
    if (b->t_start) b->fr_id = flight_last(r->pg, count);
    b->started = true;
    r->next++;
    return RT_OK;
}

rt_status rt_reducer_ready(rt_reducer *r, size_t begin, size_t end) {
    RT_REQUIRE(r->open, RT_ERR_INVALID, "rt_reducer_ready: no step begun (call rt_reducer_begin)");
    RT_REQUIRE(begin < end && end <= r->total, RT_ERR_INVALID, "rt_reducer_ready: [%zu, %zu) outside [0, %zu)", begin,
               end, r->total);
    /* the range is whole segments, none reported before in this step */
    int lo = 0, hi = r->nseg; /* first segment with bounds[s] >= begin */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r->bounds[mid] < begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    RT_REQUIRE(lo < r->nseg && r->bounds[lo] == begin, RT_ERR_INVALID,
               "rt_reducer_ready: [%zu, %zu) does not start at a segment boundary", begin, end);
    for (int s = lo; s < r->nseg && r->bounds[s] < end; s++) {
        RT_REQUIRE(r->bounds[s + 1] <= end, RT_ERR_INVALID,
                   "rt_reducer_ready: [%zu, %zu) ends inside segment %d [%zu, %zu)", begin, end, s, r->bounds[s],
                   r->bounds[s + 1]);
        RT_REQUIRE(!r->seg_ready[s], RT_ERR_INVALID,
                   "rt_reducer_ready: segment %d [%zu, %zu) reported twice in one step", s, r->bounds[s],
                   r->bounds[s + 1]);
    }
    for (int s = lo; s < r->nseg && r->bounds[s] < end; s++) r->seg_ready[s] = true;
    for (int i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        size_t a = begin > b->begin ? begin : b->begin, z = end < b->end ? end : b->end;
        if (a < z) b->ready += z - a;
    }
    if (r->opt.bucket_bytes == 0) return RT_OK; /* one all-reduce after backward */
    /* start, in order, every bucket whose bytes are all ready */
    while (r->next < r->nb && r->b[r->next].ready == r->b[r->next].end - r->b[r->next].begin)
        RT_CHECK(start(r, &r->b[r->next]));
    return RT_OK;
}

rt_status rt_reducer_finish(rt_reducer *r) {
    RT_REQUIRE(r->open, RT_ERR_INVALID, "rt_reducer_finish: no step begun");
    r->stats.finish_call_ns = rt_now_ns();
    r->stats.buckets_before_finish = r->next;
    rt_status st = RT_OK;
    if (r->opt.bucket_bytes != 0)
        for (int i = r->next; i < r->nb && st == RT_OK; i++)
            if (r->b[i].ready != r->b[i].end - r->b[i].begin)
                st = RT_ERROR(RT_ERR_INVALID,
                              "rt_reducer_finish: bucket %d [%zu, %zu) has %zu of %zu bytes reported ready", i,
                              r->b[i].begin, r->b[i].end, r->b[i].ready, r->b[i].end - r->b[i].begin);
    while (st == RT_OK && r->next < r->nb) st = start(r, &r->b[r->next]);
    for (int i = 0; i < r->nb; i++) {
        if (!r->b[i].req) continue;
        /* device-side when the producer has a stream (the host waits otherwise) */
        rt_status w = r->opt.stream ? rt_wait_stream(r->b[i].req, r->opt.stream) : rt_wait(r->b[i].req);
        r->b[i].req = NULL;
        if (r->b[i].t_start) r->b[i].t_waited = rt_now_ns();
        if (st == RT_OK && w != RT_OK) {
            rt_error_trace(__FILE__, __LINE__, "all_reduce of a gradient bucket");
            st = w;
        }
    }
    /* compress_bf16: the whole reduced bf16 copy widened back into the f32 buffer (the
     * buckets tile it; exact; with a stream, enqueued there behind the waits above) */
    if (st == RT_OK && r->opt.compress_bf16)
        st = r->bf16->unpack(r->opt.stream, r->wire, (float *)r->buf, r->total / sizeof(float));
    r->stats.end_ns = rt_now_ns();
    if (rt_trace_enabled()) trace_buckets(r);
    r->fault_bucket = -1;
    r->stats.exposed_ms = (double)(r->stats.end_ns - r->stats.finish_call_ns) * 1e-6;
    r->stats.busy_ms = r->stats.first_start_ns ? (double)(r->stats.end_ns - r->stats.first_start_ns) * 1e-6 : 0;
    r->open = false;
    return st;
}

void rt_reducer_stats_get(const rt_reducer *r, rt_reducer_stats *out) { *out = r->stats; }

void rt_reducer_test_fault(rt_reducer *r, int bucket, int fault) {
    r->fault_bucket = bucket;
    r->fault = fault;
}
