/* The training step in CUDA graphs (train.cuda_graphs; docs/gpu.md, "CUDA graphs").
 *
 * After the run's first RUN_GRAPH_WARMUP steps (uncaptured: the reducer's and the
 * libraries' buffers reach their size), a step of a full batch runs as two graph
 * launches around the host's one wait for the step's scalars, which keeps every decision
 * on the host exactly where an uncaptured step takes it (the stop, the flight recorder,
 * clipping, the non-finite skip):
 *   forward graph  the batch's copy from the loader's pinned slot, forward, loss,
 *                  backward with the reducer's buckets (NCCL), the wait for them, and
 *                  the step's scalars (loss, stop and flight flags from pinned memory,
 *                  all-reduced; the gradients' sum of squares) copied to pinned memory;
 *   update graph   the optimizer's step, its scalars (learning rate, momentum, bias
 *                  corrections) read from the pinned slot rt_optimizer_replay_prepare_after
 *                  fills before each launch. The moving average (train.ema_decay) and a
 *                  clipping scale are launched uncaptured around it, when due.
 * What changes from step to step reaches the graphs through memory: the batch through
 * the slot's address (one forward graph per slot and batch size: the key), the flags and
 * the optimizer's scalars through pinned buffers. A batch of another size (the epoch's
 * last, partial one) runs uncaptured. Evaluation runs uncaptured. Algorithm choices are
 * fixed when the model is created, before any capture, so nothing a graph holds changes
 * during the process; a resume is a new process and captures anew.
 *
 * Stage timings: the forward graph holds record nodes of run->graphs.ev (rt_event_record_node)
 * at the stage boundaries; right after the host's wait they are complete and their times
 * go into the step's pending record (pre_ms), before the next launch records them again.
 * The collectives of a replay are reported to the group (rt_pg_graph_launched): flight
 * recorder entries and one event, after the graph, that the NCCL watchdog polls. */
#include "train/internal/run.h"

#include "core/log.h"
#include "core/trace.h"

#include <stdio.h>
#include <string.h>

/* Whether this run can capture its step; why not, in words for the error or the log. */
static bool capturable(const run *r, char *why, size_t n) {
    if (!rt_device_is_cuda(r->dev)) {
        snprintf(why, n, "the run is on the CPU (train.device)");
        return false;
    }
    if (r->cfg->train.accumulate > 1) {
        snprintf(why, n,
                 "train.accumulate is %lld: a step is that many forwards and backwards with the gradients folded "
                 "between them, which the step's one forward graph does not hold",
                 (long long)r->cfg->train.accumulate);
        return false;
    }
    if (rt_model_dropout_counters(r->model, NULL, 0) > 0) {
        snprintf(why, n,
                 "the model has dropout, whose mask is drawn from a host counter at each call (a graph would "
                 "repeat one mask)");
        return false;
    }
    if (!r->bufs.vals_pinned) { /* rt_host_alloc fell back to pageable memory */
        snprintf(why, n, "the step's scalars are in pageable host memory (pinned memory could not be allocated)");
        return false;
    }
    if (r->pg && !rt_pg_capturable(r->pg, why, n)) return false;
    return true;
}

rt_status rt_run_setup_graphs(run *r) {
    const rt_graphs_mode mode = r->cfg->train.cuda_graphs;
    r->graphs.on = false;
    if (mode == RT_GRAPHS_OFF) return RT_OK;
    char why[256] = "";
    if (!capturable(r, why, sizeof why)) {
        RT_REQUIRE(mode != RT_GRAPHS_ON, RT_ERR_UNSUPPORTED,
                   "train.cuda_graphs: on, but the step cannot be captured: %s (auto captures where it can, off "
                   "never)",
                   why);
        RT_LOG_DEBUG("train.cuda_graphs auto: steps run uncaptured: %s", why);
        return RT_OK;
    }
    for (int e = 0; e < EV_COUNT; e++) RT_CHECK(rt_event_create(r->dev, &r->graphs.ev[e]));
    r->graphs.on = true;
    r->graphs.warmup_left = RUN_GRAPH_WARMUP;
    return RT_OK;
}

static void drop_graph(run_graph *g) {
    rt_graph_destroy(g->g);
    rt_pg_graph_free(g->pg);
    *g = (run_graph){0};
}

void rt_run_free_graphs(run *r) {
    bool any = r->graphs.update != NULL;
    for (int i = 0; i < RUN_GRAPHS_MAX; i++) any |= r->graphs.fwd[i].g != NULL;
    if (any && r->ctx) (void)rt_stream_sync(r->ctx->stream); /* no launch in flight */
    for (int i = 0; i < RUN_GRAPHS_MAX; i++) drop_graph(&r->graphs.fwd[i]);
    rt_graph_destroy(r->graphs.update);
    r->graphs.update = NULL;
    for (int e = 0; e < EV_COUNT; e++) rt_event_destroy(r->graphs.ev[e]);
}

/* the graph of this batch's slot and size, or the slot to capture it into (the least
 * recently used one when all are taken) */
static run_graph *graph_for(run *r, const rt_batch *b, bool *found) {
    run_graph *lru = &r->graphs.fwd[0];
    for (int i = 0; i < RUN_GRAPHS_MAX; i++) {
        run_graph *g = &r->graphs.fwd[i];
        if (g->g && g->images == b->images && g->labels == b->labels && g->n == b->size) {
            *found = true;
            return g;
        }
        if (!g->g || (lru->g && g->used < lru->used)) lru = g;
    }
    *found = false;
    return lru;
}

/* A capture failed. With train.cuda_graphs auto and one rank (nothing of a group's
 * collectives half-captured), the run goes on uncaptured, saying why; otherwise the error
 * stands (on: as promised; with a group the reducer may hold work of the failed capture). */
static bool fall_back(run *r, const char *what) {
    if (r->cfg->train.cuda_graphs != RT_GRAPHS_AUTO || r->pg) return false;
    RT_LOG_WARN("train.cuda_graphs auto: %s could not be captured, the steps run uncaptured: %s", what,
                rt_error_message());
    rt_error_clear();
    r->graphs.on = false;
    return true;
}

/* Capture the forward graph of batch b into g: the step's device work up to its
 * scalars, with record nodes for the stage events, and the group's record of the
 * collectives in it. Nothing runs (the first launch runs it). */
static rt_status capture_forward(run *r, const rt_batch *b, run_graph *g) {
    rt_stream *st = r->ctx->stream;
    drop_graph(g);
    if (r->pg) RT_CHECK(rt_pg_capture_begin(r->pg));
    rt_status s = rt_stream_capture_begin(st);
    if (s == RT_OK) {
        rt_reducer_stats rs;
        s = rt_run_step_work(r, b, r->graphs.ev, true, &rs);
        rt_status end = rt_stream_capture_end(st, &g->g); /* ends it in every case */
        if (s == RT_OK) s = end;
    }
    if (r->pg) {
        rt_status pe = rt_pg_capture_end(r->pg, &g->pg);
        if (s == RT_OK) s = pe;
    }
    if (s != RT_OK) {
        drop_graph(g);
        return rt_error_trace(__FILE__, __LINE__, "capturing the training step in a CUDA graph (train.cuda_graphs)"),
               s;
    }
    g->images = b->images;
    g->labels = b->labels;
    g->n = b->size;
    r->graphs.captures++;
    return RT_OK;
}

rt_status rt_run_graph_forward(run *r, const rt_batch *b, pending *p, bool *graphed) {
    *graphed = false;
    if (!r->graphs.on || b->size != rt_loader_batch_size(r->data.train_loader)) return RT_OK;
    if (r->graphs.warmup_left > 0) {
        r->graphs.warmup_left--;
        return RT_OK;
    }
    rt_stream *st = r->ctx->stream;
    bool found = false;
    run_graph *g = graph_for(r, b, &found);
    uint64_t t = rt_trace_now();
    if (!found) {
        rt_status cs = capture_forward(r, b, g);
        if (cs != RT_OK && fall_back(r, "the forward graph")) return rt_run_graph_forward(r, b, p, graphed);
        RT_CHECK(cs);
        if (r->graphs.captures == 1 && is_root(r))
            RT_LOG_INFO("train.cuda_graphs: from step %lld the training step runs as CUDA graphs", (long long)r->step + 1);
    }
    g->used = ++r->graphs.clock;
    if (r->pg) RT_CHECK(rt_pg_graph_launchable(r->pg)); /* never NCCL work on an aborted communicator */
    RT_CHECK(rt_graph_launch(g->g, st));
    if (r->pg) RT_CHECK(rt_pg_graph_launched(r->pg, g->pg, st));
    rt_model_note_replayed(r->model, r->bufs.x_dev, b->size); /* the non-finite path reads it (step.c) */
    /* the slot is refilled once the graph's copies ran (after the whole graph, here) */
    RT_CHECK(rt_loader_release_after(r->data.train_loader, b, st));
    RT_CHECK(rt_event_record(p->ev[EV_COMM], st)); /* the graph's end: its scalars' part counts in optim */
    rt_trace_end(RT_TRACK_MAIN, found ? "forward graph" : "capture + forward graph", t);
    r->graphs.replays++;
    *graphed = true;
    return RT_OK;
}

/* ms from a to b, both complete (the host has waited for what follows them) */
static rt_status done_ms(rt_event *a, rt_event *b, float *ms) {
    bool ready = false;
    RT_CHECK(rt_event_elapsed_ms(a, b, ms, &ready));
    RT_REQUIRE(ready, RT_ERR_INTERNAL, "a stage event of the forward graph is not complete after the host's wait");
    if (*ms < 0) *ms = 0;
    return RT_OK;
}

rt_status rt_run_graph_times(run *r, pending *p) {
    rt_event *const *g = r->graphs.ev;
    rt_event *from[EV_COUNT - 1] = {p->ev[EV_START], g[EV_H2D], g[EV_FWD], g[EV_BWD], g[EV_COMM]};
    rt_event *to[EV_COUNT - 1] = {g[EV_H2D], g[EV_FWD], g[EV_BWD], g[EV_COMM], p->ev[EV_COMM]};
    for (int i = 0; i < EV_COUNT - 1; i++) RT_CHECK(done_ms(from[i], to[i], &p->pre_ms[i]));
    p->graphed = true;
    return RT_OK;
}

/* the optimizer's step, captured once (its scalars come from memory at each launch) */
static rt_status capture_update(run *r, double lr) {
    rt_stream *st = r->ctx->stream;
    RT_CHECK(rt_stream_capture_begin(st));
    rt_status s = rt_optimizer_step_arena(&r->upd.opt, rt_model_params(r->model), rt_model_grads(r->model), lr, st);
    rt_status end = rt_stream_capture_end(st, &r->graphs.update);
    if (s == RT_OK) s = end;
    if (s != RT_OK)
        return rt_error_trace(__FILE__, __LINE__, "capturing the optimizer's step in a CUDA graph (train.cuda_graphs)"),
               s;
    return RT_OK;
}

rt_status rt_run_graph_update(run *r, double lr) {
    rt_stream *st = r->ctx->stream;
    if (!r->graphs.update && r->graphs.on) {
        rt_status cs = capture_update(r, lr);
        if (cs != RT_OK && !fall_back(r, "the optimizer's step")) return cs;
    }
    if (!r->graphs.update) /* not captured (fell back): this step's update as uncaptured steps make it */
        return rt_optimizer_step_arena(&r->upd.opt, rt_model_params(r->model), rt_model_grads(r->model), lr, st);
    /* ev_vals followed the previous update launch and the host has waited for it */
    RT_CHECK(rt_optimizer_replay_prepare_after(&r->upd.opt, lr, r->bufs.ev_vals));
    RT_CHECK(rt_graph_launch(r->graphs.update, st));
    r->graphs.replays++;
    return rt_optimizer_replay_finish(&r->upd.opt, rt_model_params(r->model)->base, st);
}
