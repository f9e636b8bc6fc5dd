/* One training step: the batch to the device, forward and loss, backward with the
 * gradient buckets handed to the reducer as they are written, the step's scalars (the
 * loss over the ranks, the stop flag, the gradient norm), clipping and the optimizer at
 * the schedule's learning rate, or the skip of a non-finite step naming the rank that
 * produced it. Its timing record is completed in timing.c. */
#include "train/internal/run.h"

#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "model/layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- train.accumulate (docs/train.md, "Gradient accumulation") ----------------------
 * A rank's batch of n samples runs as micro-batches of r->accum.micro samples (the last
 * one shorter in an epoch's short last batch). Backward writes a micro-batch's
 * gradients (it does not accumulate them), each the mean over the micro-batch's samples;
 * they are scaled by the micro-batch's share of the rank's batch (len / n: 1/K when the K
 * micro-batches are equal) as the loss of one batch of n would weigh them, and folded into
 * r->accum.grads: copied after the first backward, added after the next ones. The last
 * backward adds the sum into each block's gradients as it is reported, before the block
 * goes to the reducer, so the buckets, their all-reduces and their overlap with backward
 * are those of a step without accumulation, once per optimizer step.
 * The scale is the clipper's (the gradient's x *= coef, on the CPU or the model's stream):
 * the optimizer area's kernel, reached through its backend table, as src/optim offers no
 * public scale of its own; a product by a power of two is exact, so with K a power of two
 * the step's gradient is that of one batch up to the order of the sums. */

enum fold_mode { FOLD_NONE, FOLD_SET, FOLD_ADD, FOLD_OUT };

/* Bytes [begin, end) of the gradients of the micro-batch just computed: scaled by its
 * share, then copied into (FOLD_SET) or added to (FOLD_ADD) the sum, or the sum added
 * into them (FOLD_OUT: the last micro-batch, whose gradients go on to the reducer). */
static rt_status fold(run *r, size_t begin, size_t end) {
    if (r->accum.mode == FOLD_NONE) return RT_OK;
    float *g = (float *)((char *)rt_model_grads(r->model)->base + begin);
    float *acc = (float *)((char *)r->accum.grads + begin);
    size_t n = (end - begin) / sizeof(float);
    rt_stream *st = r->ctx->stream;
    if (r->accum.share != 1.0f) RT_CHECK(rt_grad_scale(&r->upd.clip, g, n, r->accum.share, st));
    if (r->accum.mode == FOLD_SET) return rt_memcpy(acc, r->dev, g, r->dev, end - begin, st);
    if (r->accum.mode == FOLD_ADD) return rt_add_backward_f32(r->ctx, n, g, acc);
    return rt_add_backward_f32(r->ctx, n, acc, g);
}

/* The micro-batch's loss (a mean over its samples) times its share, added to the rank's
 * loss of the step: on the host on the CPU, on the model's stream on a GPU (no host
 * wait); the same float arithmetic on both. */
static rt_status fold_loss(run *r, bool first) {
    if (!rt_device_is_cuda(r->dev)) {
        float lf;
        RT_CHECK(rt_model_loss_value(r->model, &lf));
        float part = lf * r->accum.share;
        r->accum.loss = first ? part : r->accum.loss + part;
        return RT_OK;
    }
    rt_stream *st = r->ctx->stream;
    float *dst = r->accum.loss_dev + (first ? 0 : 1);
    RT_CHECK(rt_memcpy(dst, r->dev, rt_model_loss_ptr(r->model), r->dev, sizeof(float), st));
    RT_CHECK(rt_grad_scale(&r->upd.clip, dst, 1, r->accum.share, st));
    return first ? RT_OK : rt_add_backward_f32(r->ctx, 1, dst, r->accum.loss_dev);
}

/* The rank's loss of the step, as the host knows it (CPU; a GPU reads it back: only the
 * non-finite step's diagnosis does) */
static rt_status own_loss(run *r, float *out) {
    if (r->accum.count == 1) return rt_model_loss_value(r->model, out);
    if (!rt_device_is_cuda(r->dev)) return *out = r->accum.loss, RT_OK;
    RT_CHECK(rt_memcpy(out, rt_device_cpu(), r->accum.loss_dev, r->dev, sizeof(float), r->ctx->stream));
    return rt_stream_sync(r->ctx->stream);
}

rt_status rt_run_setup_accum(run *r) {
    r->accum.count = 1;
    if (r->cfg->train.accumulate <= 1) return RT_OK;
    RT_CHECK(rt_malloc(r->dev, rt_model_grads(r->model)->size, (void **)&r->accum.grads));
    if (rt_device_is_cuda(r->dev)) RT_CHECK(rt_malloc(r->dev, 2 * sizeof(float), (void **)&r->accum.loss_dev));
    return RT_OK;
}

void rt_run_free_accum(run *r) {
    if (r->accum.grads) rt_free(r->dev, r->accum.grads);
    if (r->accum.loss_dev) rt_free(r->dev, r->accum.loss_dev);
    r->accum.grads = NULL;
    r->accum.loss_dev = NULL;
}

/* A block's gradients are final: with accumulation the earlier micro-batches' sum is
 * folded in first; then the block goes to the reducer (none with one rank). */
static rt_status on_grad_ready(void *user, int block, size_t begin, size_t end) {
    (void)block;
    run *r = user;
    RT_CHECK(fold(r, begin, end));
    return r->upd.reducer ? rt_reducer_ready(r->upd.reducer, begin, end) : RT_OK;
}

/* GPU: the host's flags the step's scalars take along, into pinned memory (a graph reads
 * them at its launch; an uncaptured step again before its scalars are enqueued, so a
 * signal during its micro-batches counts in this step, as on the CPU) */
static void set_flags(run *r) {
    if (!r->bufs.vals_host) return;
    r->bufs.vals_host->flags[0] = rt_run_stop_signal() ? 1.0f : 0.0f;
    r->bufs.vals_host->flags[1] = rt_run_flight_signal() ? 1.0f : 0.0f;
    r->bufs.vals_host->flags[2] = rt_run_minutes_due(r) ? 1.0f : 0.0f;
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
    const float *loss = r->accum.count > 1 ? r->accum.loss_dev : rt_model_loss_ptr(r->model);
    RT_CHECK(rt_memcpy(sc, r->dev, loss, r->dev, sizeof(float), st));
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
        RT_CHECK(own_loss(r, &lf));
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
    RT_CHECK(own_loss(r, &own)); /* this rank's loss, before the averaging */
    if (isfinite(own)) {
        float *grads = rt_model_grads(r->model)->base;
        size_t ng = rt_model_grads(r->model)->size / sizeof(float);
        if (r->pg) { /* the last micro-batch's again, with the earlier ones' sum (accum.mode is still FOLD_OUT) */
            RT_CHECK(rt_model_backward(r->model, NULL, NULL));
            RT_CHECK(fold(r, 0, rt_model_grads(r->model)->size));
        }
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

/* Samples [lo, lo + n) of the batch where the model reads them: on a GPU copied to the
 * device buffers, after which (unless `keep`) the loader's pinned slot may be refilled;
 * on the CPU the loader's own buffers. */
static rt_status step_input(run *r, const rt_batch *b, int lo, int n, bool keep, const float **x, const int64_t **y) {
    size_t img = rt_dataset_image_bytes(&r->data.train_ds);
    *x = b->images + img * (size_t)lo;
    *y = b->labels + lo;
    if (!rt_device_is_cuda(r->dev)) return RT_OK;
    rt_stream *st = r->ctx->stream;
    RT_CHECK(rt_memcpy(r->bufs.x_dev, r->dev, *x, rt_device_cpu(), sizeof(float) * img * (size_t)n, st));
    RT_CHECK(rt_memcpy(r->bufs.label_dev, r->dev, *y, rt_device_cpu(), sizeof(int64_t) * (size_t)n, st));
    /* the pinned slot is refilled only after these copies ran, not when the host
     * asks for the next batch (the copies may not have started by then); a captured
     * copy runs at the launch, after which the caller releases the slot */
    if (!keep) RT_CHECK(rt_loader_release_after(r->data.train_loader, b, st));
    *x = r->bufs.x_dev;
    *y = r->bufs.label_dev;
    return RT_OK;
}

/* a stage's end: an event, or a record node of the graph being captured */
static rt_status mark(rt_event *e, rt_stream *st, bool capture) {
    return capture ? rt_event_record_node(e, st) : rt_event_record(e, st);
}

/* A micro-batch that is not the step's last (train.accumulate): forward, loss, backward
 * without the reducer, its gradients folded into the sum. */
static rt_status micro_backward(run *r, const float *x, const int64_t *y, int n, bool first) {
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_model_forward(r->model, x, n, true));
    RT_CHECK(rt_model_loss(r->model, y));
    RT_CHECK(fold_loss(r, first));
    rt_trace_end(RT_TRACK_MAIN, "forward", t);
    t = rt_trace_now();
    RT_CHECK(rt_model_backward(r->model, NULL, NULL));
    r->accum.mode = first ? FOLD_SET : FOLD_ADD;
    RT_CHECK(fold(r, 0, rt_model_grads(r->model)->size));
    rt_trace_end(RT_TRACK_MAIN, "backward", t);
    return RT_OK;
}

/* Forward, loss and backward (the buckets go to the reducer as backward writes them,
 * with the earlier micro-batches' gradients folded in), then the wait for the gradients'
 * all-reduce; an event at each stage's end. */
static rt_status forward_backward(run *r, rt_event *const *ev, bool capture, const float *x, const int64_t *y, int n,
                                  rt_reducer_stats *rs) {
    rt_stream *st = r->ctx->stream;
    uint64_t t = rt_trace_now();
    bool accumulated = r->accum.count > 1;
    RT_CHECK(rt_model_forward(r->model, x, n, true));
    RT_CHECK(rt_model_loss(r->model, y));
    if (accumulated) RT_CHECK(fold_loss(r, false));
    RT_CHECK(mark(ev[EV_FWD], st, capture));
    rt_trace_end(RT_TRACK_MAIN, "forward", t);
    t = rt_trace_now();
    if (r->upd.reducer) {
        RT_CHECK(rt_reducer_begin(r->upd.reducer));
        rt_run_test_bucket_fault(r);
    }
    r->accum.mode = accumulated ? FOLD_OUT : FOLD_NONE;
    RT_CHECK(rt_model_backward(r->model, r->upd.reducer || accumulated ? on_grad_ready : NULL, r));
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

/* The step's tag in flight files and hang/desync diagnoses: "step S", and with
 * train.accumulate "step S micro i/K" during micro-batch i (i >= 0). */
static void tag_step(run *r, int i) {
    char tag[48];
    int n = snprintf(tag, sizeof tag, "step %lld", (long long)r->step + 1);
    if (i >= 0) snprintf(tag + n, sizeof tag - (size_t)n, " micro %d/%d", i + 1, r->accum.count);
    rt_pg_set_tag(r->pg, tag);
}

rt_status rt_run_step_work(run *r, const rt_batch *b, rt_event *const *ev, bool capture, rt_reducer_stats *rs) {
    rt_stream *st = r->ctx->stream;
    const int m = r->accum.micro, count = (b->size + m - 1) / m; /* 1 without accumulation */
    r->accum.count = count;
    const float *x = NULL;
    const int64_t *y = NULL;
    for (int i = 0; i < count; i++) {
        int lo = i * m, n = b->size - lo < m ? b->size - lo : m;
        bool last = i + 1 == count;
        if (count > 1) {
            tag_step(r, i);
            /* a signal between micro-batches is acted on after the step's optimizer update */
            rt_run_test_signal_at(r, "micro", r->step * r->cfg->train.accumulate + i + 1);
        }
        r->accum.share = count > 1 ? (float)((double)n / b->size) : 1.0f;
        uint64_t t = rt_trace_now();
        RT_CHECK(step_input(r, b, lo, n, capture || !last, &x, &y));
        if (i == 0) RT_CHECK(mark(ev[EV_H2D], st, capture));
        rt_trace_end(RT_TRACK_MAIN, "h2d", t);
        if (!last) RT_CHECK(micro_backward(r, x, y, n, i == 0));
    }
    RT_CHECK(forward_backward(r, ev, capture, x, y, b->size - (count - 1) * m, rs));
    if (count > 1) tag_step(r, -1); /* the step's scalars */
    if (!rt_device_is_cuda(r->dev)) return RT_OK;
    if (!capture) set_flags(r);
    return scalars_enqueue(r);
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
    tag_step(r, -1);
    pending *p = &r->log.pend[r->step % 2];
    RT_CHECK(rt_run_complete(r, p, true)); /* two steps back (the older pending record): surely done */
    r->log.cur = p;
    p->anchor_ns = 0;
    rt_stream *st = r->ctx->stream;
    RT_CHECK(rt_event_record(p->ev[EV_START], st));
    rt_run_test_nan_batch(r, b);
    set_flags(r);
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
