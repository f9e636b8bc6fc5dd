/* One training step: the batch to the device, forward and loss, backward with the
 * gradient buckets handed to the reducer as they are written, the step's scalars (the
 * loss over the ranks, the stop flag, the gradient norm), clipping and the optimizer at
 * the schedule's learning rate, or the skip of a non-finite step naming the rank that
 * produced it. Its timing record is completed in timing.c. */
#include "train/internal/run.h"

#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"

#include <math.h>
#include <stdio.h>

static rt_status on_grad_ready(void *user, int block, size_t begin, size_t end) {
    (void)block;
    run *r = user;
    return rt_reducer_ready(r->upd.reducer, begin, end);
}

/* On a GPU, the device's part of the step's scalars (step_scalars): the loss and the
 * host's flags (pinned, written before this work runs) all-reduced on the device (ordered
 * on the model stream, no host wait), the gradients' sum of squares, one copy of all of
 * them to pinned memory. Capturable: nothing here is a host value of the call. */
static rt_status scalars_enqueue(run *r) {
    rt_stream *st = r->ctx->stream;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    float *sc = r->bufs.scratch_dev;
    RT_CHECK(rt_memcpy(sc, r->dev, rt_model_loss_ptr(r->model), r->dev, sizeof(float), st));
    RT_CHECK(rt_memcpy(sc + 1, r->dev, r->bufs.vals_host->flags, rt_device_cpu(), sizeof r->bufs.vals_host->flags, st));
    if (r->pg) {
        rt_request *q = NULL;
        uint64_t t = rt_trace_now();
        RT_CHECK(rt_iall_reduce(r->pg, sc, 4, RT_F32, RT_OP_SUM, &q)); /* after the copies: the group's stream */
        RT_CHECK(rt_wait_stream(q, st));                               /* on the device: the copy below waits for it */
        rt_trace_end(RT_TRACK_MAIN, "scalars all_reduce", t);
    }
    RT_CHECK(rt_grad_sumsq_async(&r->upd.clip, grads, n, st, &r->bufs.vals_host->sumsq));
    return rt_memcpy(r->bufs.vals_host->loss_stop, rt_device_cpu(), sc, r->dev, sizeof r->bufs.vals_host->loss_stop,
                     st);
}

/* What the host must know after backward: the loss averaged over the ranks, whether any
 * rank was asked to stop (or for the flight recorder, or rank 0's clock for a checkpoint:
 * r->stop), and the gradient norm (clipping, non-finite steps). On a GPU
 * the three come back together after one host wait for scalars_enqueue's work. */
static rt_status step_scalars(run *r, double *loss, bool *stop, double *norm) {
    rt_stream *st = r->ctx->stream;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    if (!rt_device_is_cuda(r->dev)) {
        float lf;
        RT_CHECK(rt_model_loss_value(r->model, &lf));
        /* the mean loss; any rank asked to stop; any rank asked for the flight recorder;
         * rank 0's clock asks for a checkpoint (checkpoint.every_minutes) */
        double agree[4] = {lf, rt_run_stop_signal() ? 1.0 : 0.0, rt_run_flight_signal() ? 1.0 : 0.0,
                           rt_run_minutes_due(r) ? 1.0 : 0.0};
        uint64_t t = rt_trace_now();
        RT_CHECK(rt_run_all_reduce_f64(r, agree, 4, RT_OP_SUM));
        if (r->pg) rt_trace_end(RT_TRACK_MAIN, "scalars all_reduce", t);
        *loss = agree[0] / r->who.world_size;
        *stop = agree[1] > 0;
        r->stop.flight = agree[2] > 0;
        r->stop.ckpt_now = agree[3] > 0;
        return rt_grad_norm(&r->upd.clip, grads, n, st, norm);
    }
    pending *p = rt_trace_enabled() ? r->log.cur : NULL;
    if (p) RT_CHECK(rt_event_record(p->anchor, st));
    RT_CHECK(rt_event_record(r->bufs.ev_vals, st));
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_event_sync(r->bufs.ev_vals)); /* the step's one host wait */
    if (p) p->anchor_ns = rt_now_ns();        /* the anchor completed at most this long ago */
    rt_trace_end(RT_TRACK_MAIN, "wait for the step's scalars", t);
    *loss = (double)r->bufs.vals_host->loss_stop[0] / r->who.world_size;
    *stop = r->bufs.vals_host->loss_stop[1] > 0;
    r->stop.flight = r->bufs.vals_host->loss_stop[2] > 0;
    r->stop.ckpt_now = r->bufs.vals_host->loss_stop[3] > 0;
    *norm = sqrt(r->bufs.vals_host->sumsq);
    return RT_OK;
}

/* Which ranks produced a non-finite step: every rank sees it (the loss is averaged over
 * the ranks, the gradient norm is that of the all-reduced gradients), so each checks its
 * own loss and its own gradients (the all-reduce overwrote them: backward again, without
 * the reducer; parameter gradients are written, not accumulated) and they agree on the
 * lowest such rank and their number. Only on this path: a finite step pays nothing. */
static rt_status nonfinite_ranks(run *r, char *who, size_t n) {
    float own = 0;
    double own_norm = 0;
    RT_CHECK(rt_model_loss_value(r->model, &own)); /* this rank's loss, before the averaging */
    if (isfinite(own)) {
        float *grads = rt_model_grads(r->model)->base;
        size_t ng = rt_model_grads(r->model)->size / sizeof(float);
        if (r->pg) RT_CHECK(rt_model_backward(r->model, NULL, NULL));
        RT_CHECK(rt_grad_norm(&r->upd.clip, grads, ng, r->ctx->stream, &own_norm));
    }
    bool bad = !isfinite(own) || !isfinite(own_norm);
    int64_t first = bad ? r->who.rank : r->who.world_size, count = bad ? 1 : 0;
    RT_CHECK(rt_run_all_reduce_host(r, &first, 1, RT_I64, RT_OP_MIN));
    RT_CHECK(rt_run_all_reduce_host(r, &count, 1, RT_I64, RT_OP_SUM));
    if (count == 0)
        snprintf(who, n,
                 "on no rank alone (the own loss and gradients of each of the %d rank(s) were finite: their sum "
                 "overflowed)",
                 r->who.world_size);
    else if (count == 1)
        snprintf(who, n, "on rank %lld (of %d rank(s), the only one whose own loss or gradients were non-finite)",
                 (long long)first, r->who.world_size);
    else
        snprintf(who, n, "on rank %lld (the first of %lld of %d ranks whose own loss or gradients were non-finite)",
                 (long long)first, (long long)count, r->who.world_size);
    return RT_OK;
}

/* The batch where the model reads it: on a GPU copied to the device buffers, after which
 * the loader's pinned slot may be refilled; on the CPU the loader's own buffers. */
static rt_status step_input(run *r, const rt_batch *b, bool capture, const float **x, const int64_t **y) {
    *x = b->images;
    *y = b->labels;
    if (!rt_device_is_cuda(r->dev)) return RT_OK;
    rt_stream *st = r->ctx->stream;
    size_t img = rt_dataset_image_bytes(&r->data.train_ds);
    RT_CHECK(rt_memcpy(r->bufs.x_dev, r->dev, b->images, rt_device_cpu(), sizeof(float) * img * (size_t)b->size, st));
    RT_CHECK(rt_memcpy(r->bufs.label_dev, r->dev, b->labels, rt_device_cpu(), sizeof(int64_t) * (size_t)b->size, st));
    /* the pinned slot is refilled only after these copies ran, not when the host
     * asks for the next batch (the copies may not have started by then); a captured
     * copy runs at the launch, after which the caller releases the slot */
    if (!capture) RT_CHECK(rt_loader_release_after(r->data.train_loader, b, st));
    *x = r->bufs.x_dev;
    *y = r->bufs.label_dev;
    return RT_OK;
}

/* a stage's end: an event, or a record node of the graph being captured */
static rt_status mark(rt_event *e, rt_stream *st, bool capture) {
    return capture ? rt_event_record_node(e, st) : rt_event_record(e, st);
}

/* Forward, loss and backward (the buckets go to the reducer as backward writes them),
 * then the wait for the gradients' all-reduce; an event at each stage's end. */
static rt_status forward_backward(run *r, rt_event *const *ev, bool capture, const float *x, const int64_t *y, int n,
                                  rt_reducer_stats *rs) {
    rt_stream *st = r->ctx->stream;
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_model_forward(r->model, x, n, true));
    RT_CHECK(rt_model_loss(r->model, y));
    RT_CHECK(mark(ev[EV_FWD], st, capture));
    rt_trace_end(RT_TRACK_MAIN, "forward", t);
    t = rt_trace_now();
    if (r->upd.reducer) {
        RT_CHECK(rt_reducer_begin(r->upd.reducer));
        rt_run_test_bucket_fault(r);
    }
    RT_CHECK(rt_model_backward(r->model, r->upd.reducer ? on_grad_ready : NULL, r));
    RT_CHECK(mark(ev[EV_BWD], st, capture));
    rt_trace_end(RT_TRACK_MAIN, "backward", t);
    *rs = (rt_reducer_stats){0};
    if (r->upd.reducer) {
        t = rt_trace_now();
        RT_CHECK(rt_reducer_finish(r->upd.reducer));
        rt_trace_end(RT_TRACK_MAIN, "wait for gradient all_reduce", t);
        rt_reducer_stats_get(r->upd.reducer, rs);
    }
    return mark(ev[EV_COMM], st, capture);
}

rt_status rt_run_step_work(run *r, const rt_batch *b, rt_event *const *ev, bool capture, rt_reducer_stats *rs) {
    rt_stream *st = r->ctx->stream;
    uint64_t t = rt_trace_now();
    const float *x;
    const int64_t *y;
    RT_CHECK(step_input(r, b, capture, &x, &y));
    RT_CHECK(mark(ev[EV_H2D], st, capture));
    rt_trace_end(RT_TRACK_MAIN, "h2d", t);
    RT_CHECK(forward_backward(r, ev, capture, x, y, b->size, rs));
    return rt_device_is_cuda(r->dev) ? scalars_enqueue(r) : RT_OK;
}

/* Clip (the norm is logged either way), then the optimizer at the schedule's lr; a
 * non-finite step fails naming the rank, or is skipped with train.skip_nonfinite. */
static rt_status update(run *r, double loss, double norm, int64_t epoch, bool graphed, double *lr, rt_grad_stats *gs,
                        bool *skipped) {
    const rt_config *c = r->cfg;
    rt_stream *st = r->ctx->stream;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    RT_CHECK(rt_grad_clip_apply(&r->upd.clip, grads, n, c->optim.clip_grad_norm, norm, st, gs));
    *lr = rt_schedule_lr(&r->upd.sched, r->step);
    double mom;
    if (rt_schedule_momentum(&r->upd.sched, r->step, &mom)) RT_CHECK(rt_optimizer_set_momentum(&r->upd.opt, mom));
    *skipped = false;
    if (gs->finite && isfinite(loss))
        return graphed ? rt_run_graph_update(r, *lr)
                       : rt_optimizer_step_arena(&r->upd.opt, rt_model_params(r->model), rt_model_grads(r->model), *lr, st);
    char who[160]; /* the same on every rank: the launcher names the rank that produced it */
    RT_CHECK(nonfinite_ranks(r, who, sizeof who));
    RT_REQUIRE(c->train.skip_nonfinite, RT_ERR_INVALID,
               "step %lld (epoch %lld): non-finite %s (loss %g, gradient norm %g) %s; set "
               "train.skip_nonfinite: true to skip such steps",
               (long long)r->step + 1, (long long)epoch, isfinite(loss) ? "gradient" : "loss", loss, gs->norm, who);
    *skipped = true;
    RT_LOG_WARN("step %lld: non-finite %s %s, step skipped", (long long)r->step + 1,
                isfinite(loss) ? "gradient" : "loss", who);
    return RT_OK;
}

rt_status rt_run_train_step(run *r, const rt_batch *b, double data_ms, int64_t epoch) {
    const rt_config *c = r->cfg;
    char tag[32]; /* the step in flight files and hang/desync diagnoses */
    snprintf(tag, sizeof tag, "step %lld", (long long)r->step + 1);
    rt_pg_set_tag(r->pg, tag);
    pending *p = &r->log.pend[r->step % 2];
    RT_CHECK(rt_run_complete(r, p, true)); /* two steps back (the older pending record): surely done */
    r->log.cur = p;
    p->anchor_ns = 0;
    rt_stream *st = r->ctx->stream;
    RT_CHECK(rt_event_record(p->ev[EV_START], st));
    rt_run_test_nan_batch(r, b);
    if (r->bufs.vals_host) { /* GPU: the flags the step's scalars take along (a graph reads them at its launch) */
        r->bufs.vals_host->flags[0] = rt_run_stop_signal() ? 1.0f : 0.0f;
        r->bufs.vals_host->flags[1] = rt_run_flight_signal() ? 1.0f : 0.0f;
        r->bufs.vals_host->flags[2] = rt_run_minutes_due(r) ? 1.0f : 0.0f;
    }
    bool graphed = false;
    rt_reducer_stats rs = {0};
    p->graphed = false;
    RT_CHECK(rt_run_graph_forward(r, b, p, &graphed));
    if (!graphed) RT_CHECK(rt_run_step_work(r, b, p->ev, false, &rs));
    /* the loss averaged over the ranks (for the logs), the stop flag, the norm */
    double loss = 0, norm = 0;
    RT_CHECK(step_scalars(r, &loss, &r->stop.requested, &norm));
    if (graphed) RT_CHECK(rt_run_graph_times(r, p));
    if (r->stop.requested) RT_CHECK(rt_run_agree_stop(r)); /* which signal: every rank, they all saw the flag */
    uint64_t t = rt_trace_now();
    double lr = 0;
    rt_grad_stats gs;
    bool skipped = false;
    RT_CHECK(update(r, loss, norm, epoch, graphed, &lr, &gs, &skipped));
    RT_CHECK(rt_event_record(p->ev[EV_END], st));
    rt_trace_end(RT_TRACK_MAIN, "optimizer", t);
    r->step++;
    p->rec = (rt_step_record){.step = r->step,
                              .epoch = epoch,
                              .batch = b->index,
                              .rank = r->who.rank,
                              .comm_busy_ms = rs.busy_ms,
                              .images = (int64_t)b->size * r->who.world_size,
                              .loss = loss,
                              .lr = lr,
                              .grad_norm = gs.norm,
                              .time_s = (double)(rt_now_ns() - r->log.t0) * 1e-9,
                              .skipped = skipped};
    p->rec.ms[RT_STAGE_DATA] = data_ms;
    p->waiting = true;
    RT_CHECK(rt_run_complete_in_order(r, false)); /* the step before first, if it is still pending */
    RT_CHECK(rt_run_test_perturb_at(r));
    if (c->dist.check_sync_every > 0 && r->step % c->dist.check_sync_every == 0) {
        char when[64];
        snprintf(when, sizeof when, "step %lld", (long long)r->step);
        RT_CHECK(rt_run_check_in_sync(r, false, when));
    }
    return RT_OK;
}
