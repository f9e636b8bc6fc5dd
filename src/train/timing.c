/* Per-step timing records. Every stage boundary records an event on the model's stream
 * (on the CPU an event is a host timestamp, so the same code runs there). A step's record
 * is completed when its events are ready: at once on the CPU, one step later on a GPU, so
 * timing never adds a synchronisation. The data stage is host time (waiting for the
 * loader). Completed records go to the epoch's table, metrics.jsonl and the progress bar. */
#include "train/internal/run.h"

#include "core/timer.h"
#include "core/trace.h"

static rt_status log_record(run *r, rt_step_record *rec) {
    rec->images_per_s = rec->ms[RT_STAGE_STEP] > 0 ? (double)rec->images / (rec->ms[RT_STAGE_STEP] * 1e-3) : 0;
    RT_CHECK(rt_stage_stats_add(r->log.stats, rec));
    if (r->log.metrics) RT_CHECK(rt_metrics_step(r->log.metrics, rec));
    if (r->log.rank_metrics) RT_CHECK(rt_metrics_step(r->log.rank_metrics, rec));
    if (r->log.tb) RT_CHECK(rt_tb_step(r->log.tb, rec));
    if (is_root(r)) rt_progress_step(&r->log.progress, rec);
    return RT_OK;
}

/* Tracing on a GPU: the step's stream spans, from its events (all complete: rt_run_complete()
 * asks this only once the last one is), placed on the host clock by the anchor. */
static rt_status trace_stream(run *r, pending *p) {
    if (!rt_trace_enabled() || !rt_device_is_cuda(r->dev) || !p->anchor_ns) return RT_OK;
    static const char *const names[EV_COUNT - 1] = {"h2d", "forward", "backward", "wait for gradient all_reduce",
                                                    "scalars + optimizer"};
    uint64_t at[EV_COUNT];
    for (int i = 0; i < EV_COUNT; i++) {
        if (p->graphed && i > EV_START && i < EV_END) { /* inside the forward graph: its own events' times */
            at[i] = at[i - 1] + (uint64_t)((double)p->pre_ms[i - 1] * 1e6);
            continue;
        }
        float ms = 0;
        bool ready = false;
        bool after = i == EV_END; /* recorded after the anchor */
        RT_CHECK(after ? rt_event_elapsed_ms(p->anchor, p->ev[i], &ms, &ready)
                       : rt_event_elapsed_ms(p->ev[i], p->anchor, &ms, &ready));
        if (!ready) return RT_OK;
        double ns = ms > 0 ? (double)ms * 1e6 : 0;
        at[i] = after ? p->anchor_ns + (uint64_t)ns : p->anchor_ns - (uint64_t)(ns < (double)p->anchor_ns ? ns : 0);
    }
    /* the anchors' host wake-up differs from step to step: never before the span before */
    for (int i = 0; i < EV_COUNT; i++) {
        if (at[i] < r->log.stream_last) at[i] = r->log.stream_last;
        r->log.stream_last = at[i];
    }
    for (int i = 0; i < EV_COUNT - 1; i++)
        rt_trace_span_at(RT_TRACK_STREAM, names[i], at[i], at[i + 1], p->rec.step, p->rec.epoch);
    p->anchor_ns = 0;
    return RT_OK;
}

/* Complete pending record p if its events are ready (always on the CPU); `force` waits,
 * only when the record is not complete yet (two steps back it always is on a GPU: each
 * step waits for its own scalars). */
rt_status rt_run_complete(run *r, pending *p, bool force) {
    if (!p->waiting) return RT_OK;
    float ms[EV_COUNT - 1];
    if (force) {
        bool ready = false;
        RT_CHECK(rt_event_query(p->ev[EV_END], &ready));
        if (!ready) RT_CHECK(rt_event_sync(p->ev[EV_END]));
    }
    for (int i = p->graphed ? EV_COMM : 0; i < EV_COUNT - 1; i++) { /* a graphed step: after its forward graph */
        bool ready = false;
        RT_CHECK(rt_event_elapsed_ms(p->ev[i], p->ev[i + 1], &ms[i], &ready));
        if (!ready) return RT_OK; /* a step later */
    }
    if (p->graphed) {
        for (int i = 0; i < EV_COMM; i++) ms[i] = p->pre_ms[i];
        ms[EV_COMM] += p->pre_ms[EV_COMM]; /* the step's scalars, inside the graph */
    }
    rt_step_record *rec = &p->rec;
    RT_CHECK(trace_stream(r, p));
    rec->ms[RT_STAGE_H2D] = ms[EV_START];
    rec->ms[RT_STAGE_FORWARD] = ms[EV_H2D];
    rec->ms[RT_STAGE_BACKWARD] = ms[EV_FWD];
    rec->ms[RT_STAGE_COMM] = ms[EV_BWD];
    rec->ms[RT_STAGE_OPTIM] = ms[EV_COMM];
    rec->ms[RT_STAGE_STEP] = rec->ms[RT_STAGE_DATA];
    for (int i = 0; i < EV_COUNT - 1; i++) rec->ms[RT_STAGE_STEP] += ms[i];
    p->waiting = false;
    return log_record(r, rec);
}

/* Complete the pending records oldest first (`force`: wait for them): a record is never
 * logged before the one of the step before it, which may still be pending when its
 * events were not ready a step late (metrics.jsonl must count up: `ringtrain report`
 * reads a smaller step as a rewind and drops the lines before it). */
rt_status rt_run_complete_in_order(run *r, bool force) {
    pending *old = &r->log.pend[0], *young = &r->log.pend[1];
    if (young->waiting && (!old->waiting || young->rec.step < old->rec.step)) {
        old = &r->log.pend[1];
        young = &r->log.pend[0];
    }
    RT_CHECK(rt_run_complete(r, old, force));
    if (old->waiting) return RT_OK; /* not ready: the younger one waits behind it */
    return rt_run_complete(r, young, force);
}
