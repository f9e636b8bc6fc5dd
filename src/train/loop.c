/* The epoch loop: for each epoch the batches (one training step each), with the points
 * where the ranks agree to stop, dump the flight recorder or write a checkpoint between
 * steps; then the epoch's timing table, its evaluation (train.eval_every, and always the
 * run's last epoch) with what watches it (monitor.c: the best checkpoint, the early stop)
 * and its checkpoint (checkpoint.every_epochs, the end, a stop, a new best).
 * A resumed run starts in the middle of its epoch, from the checkpoint's position. */
#include "train/internal/run.h"

#include "core/timer.h"
#include "core/trace.h"
#include "dist/launch.h"

#include <math.h>
#include <stdio.h>

typedef struct loop_state {
    int64_t epoch;
    int64_t saved_at;    /* the step of the newest checkpoint */
    int64_t eval_logged; /* the step of an eval line metrics.jsonl has already (a resume) */
    run_eval ev;         /* the last evaluation's (loss NaN: none yet) */
} loop_state;

/* The epoch's order from its start, or for the resumed epoch the batches not taken yet
 * (re-partitioned if the world changed). */
static rt_status start_epoch(run *r, int64_t epoch) {
    if (epoch != r->ckpt.start_epoch || r->ckpt.start_batches <= 0)
        return rt_loader_start_epoch(r->data.train_loader, epoch);
    int64_t pos = r->ckpt.start_batches * rt_loader_batch_size(r->data.train_loader);
    int64_t len = rt_loader_samples_per_epoch(r->data.train_loader);
    return rt_loader_restore(r->data.train_loader, (rt_loader_state){epoch, pos < len ? pos : len});
}

/* After a step: the flight recorder if a rank asked (every rank after the same step),
 * the heartbeat, and a checkpoint on a stop or at checkpoint.every_steps. */
static rt_status after_step(run *r, loop_state *s, const rt_batch *b) {
    const rt_config *c = r->cfg;
    rt_launch_progress(r->step); /* a heartbeat with the step (--max-restarts compares it) */
    rt_run_test_kill_rank_at(r);
    if (r->stop.flight) {
        r->stop.flight = false;
        rt_run_flight_clear();
        rt_run_flight_dump(r, "SIGUSR1");
    }
    bool every = c->checkpoint.every_steps > 0 && r->step % c->checkpoint.every_steps == 0;
    if (!r->stop.requested && !every && !r->stop.ckpt_now) return RT_OK;
    RT_CHECK(rt_run_complete_in_order(r, true));
    const char *why = r->stop.requested ? "stop" : every ? "every_steps" : "every_minutes";
    RT_CHECK(rt_run_save_checkpoint(r, s->epoch, b->index + 1, why));
    s->saved_at = r->step;
    if (!r->stop.requested) RT_CHECK(rt_run_agree_stop(r)); /* asked during the write: this one is kept */
    return RT_OK;
}

/* The epoch's batches until it ends, the run's steps are done or the ranks stop;
 * *next_batch: the batch a resume would take next in this epoch (-1: it ran to its end). */
static rt_status run_batches(run *r, loop_state *s, int64_t *next_batch) {
    *next_batch = -1;
    while (r->step < r->data.total_steps && !r->stop.requested) {
        rt_run_test_signal_at(r, "step", r->step + 1);
        rt_trace_set_step(r->step + 1, s->epoch);
        uint64_t t = rt_now_ns();
        rt_batch b;
        RT_CHECK(rt_loader_next(r->data.train_loader, &b));
        if (b.size == 0) {
            /* the epoch is over: its evaluation and checkpoint belong to its last step */
            rt_trace_set_step(r->step, s->epoch);
            *next_batch = -1;
            break;
        }
        uint64_t t_data = rt_now_ns();
        if (rt_trace_enabled()) rt_trace_span(RT_TRACK_MAIN, "data", t, t_data);
        RT_CHECK(rt_run_train_step(r, &b, (double)(t_data - t) * 1e-6, s->epoch));
        if (rt_trace_enabled()) rt_trace_span(RT_TRACK_MAIN, "step", t, rt_now_ns());
        *next_batch = b.index + 1 < r->data.steps_per_epoch ? b.index + 1 : -1;
        RT_CHECK(after_step(r, s, &b));
    }
    return RT_OK;
}

rt_status rt_run_log_eval(run *r, const run_eval *e, int64_t epoch, int64_t eval_logged, bool print) {
    rt_eval_record rec = {.step = r->step,
                          .epoch = epoch,
                          .loss = e->loss,
                          .accuracy = e->acc,
                          .samples = e->samples,
                          .val_loss = e->val_loss,
                          .val_accuracy = e->val_acc,
                          .val_samples = e->val_samples};
    if (r->log.metrics && r->step != eval_logged) RT_CHECK(rt_metrics_eval_record(r->log.metrics, &rec));
    if (r->log.tb) RT_CHECK(rt_tb_eval(r->log.tb, &rec)); /* it knows the evaluation its file kept */
    if (!print || !is_root(r)) return RT_OK;
    fprintf(r->out, "epoch %lld: test loss %.4f, accuracy %.2f%% (%lld samples)", (long long)epoch + 1, e->loss,
            100.0 * e->acc, (long long)e->samples);
    if (e->val_samples > 0)
        fprintf(r->out, "; validation loss %.4f, accuracy %.2f%% (%lld samples)", e->val_loss, 100.0 * e->val_acc,
                (long long)e->val_samples);
    fputc('\n', r->out);
    fflush(r->out);
    return RT_OK;
}

/* The epoch's evaluation, logged and printed; `last`: the run's last, after which
 * nothing is left to agree on. */
static rt_status epoch_eval(run *r, loop_state *s, bool last) {
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_run_evaluate(r, &s->ev));
    rt_trace_end(RT_TRACK_MAIN, "evaluation", t);
    RT_CHECK(rt_run_log_eval(r, &s->ev, s->epoch, s->eval_logged, true));
    rt_run_monitor_observe(r, &s->ev);
    /* asked during the evaluation, or the early stop's patience ran out: stop after it
     * (after the run's last one, finish: only the end-of-run check and the model file are
     * left); the best checkpoint's decision rides along */
    if (!last) return rt_run_agree_stop(r);
    return r->mon.best.metric != RT_MONITOR_NONE ? rt_run_agree_watches(r) : RT_OK;
}

/* The epoch's checkpoint: at the epoch's end (checkpoint.every_epochs), always at the
 * end of the run, and on a stop (unless one of this step is written). */
static rt_status epoch_checkpoint(run *r, loop_state *s, bool last, int64_t next_batch) {
    const rt_config *c = r->cfg;
    bool every = c->checkpoint.every_epochs > 0 && (s->epoch + 1) % c->checkpoint.every_epochs == 0;
    bool best = r->mon.write_best; /* written again when this step's is: best/ is made with it */
    if (!(every || last || r->stop.requested || best) || (s->saved_at == r->step && !best && !r->mon.early_stopped))
        return RT_OK; /* an early stop rewrites a checkpoint of this step written before its evaluation */
    const char *why = r->mon.early_stopped ? "early_stop"
                      : r->stop.requested  ? "stop"
                      : last               ? "end"
                      : every              ? "every_epochs"
                                           : "best";
    /* train.max_steps can end the run in mid-epoch: the position is then the next
     * batch of this epoch, so a resume that trains longer does not skip its rest */
    if (next_batch >= 0)
        RT_CHECK(rt_run_save_checkpoint(r, s->epoch, next_batch, r->stop.requested || best ? why : "end"));
    else
        RT_CHECK(rt_run_save_checkpoint(r, s->epoch + 1, 0, why));
    s->saved_at = r->step;
    if (!r->stop.requested && !last) RT_CHECK(rt_run_agree_stop(r)); /* asked during the write: this one is kept */
    return RT_OK;
}

rt_status rt_run_epochs(run *r, int64_t eval_logged, run_eval *ev, int64_t *epoch) {
    const rt_config *c = r->cfg;
    loop_state s = {.epoch = r->ckpt.start_epoch,
                    .saved_at = r->ckpt.resumed_from,
                    .eval_logged = eval_logged,
                    .ev = {.loss = NAN, .acc = NAN, .val_loss = NAN, .val_acc = NAN}};
    r->ckpt.saved_min = rt_run_minutes(r); /* checkpoint.every_minutes counts from here */
    for (; s.epoch < c->train.epochs && r->step < r->data.total_steps && !r->stop.requested; s.epoch++) {
        rt_stage_stats_reset(r->log.stats);
        RT_CHECK(start_epoch(r, s.epoch));
        int64_t next_batch = -1;
        RT_CHECK(run_batches(r, &s, &next_batch));
        RT_CHECK(rt_run_complete_in_order(r, true));
        rt_reducer_trace_flush(r->upd.reducer);
        RT_CHECK(rt_trace_flush()); /* the epoch's spans (stream spans completed just above) */
        if (r->stop.requested) break;
        bool last = s.epoch + 1 == c->train.epochs || r->step >= r->data.total_steps;
        if (is_root(r)) {
            rt_progress_break(&r->log.progress);
            char title[64];
            snprintf(title, sizeof title, "epoch %lld/%lld", (long long)s.epoch + 1, (long long)c->train.epochs);
            rt_stage_stats_print(r->log.stats, r->out, title);
        }
        if (last || (c->train.eval_every > 0 && (s.epoch + 1) % c->train.eval_every == 0))
            RT_CHECK(epoch_eval(r, &s, last));
        RT_CHECK(epoch_checkpoint(r, &s, last, next_batch));
        if (r->stop.requested) break;
    }
    *ev = s.ev;
    *epoch = s.epoch;
    return RT_OK;
}
