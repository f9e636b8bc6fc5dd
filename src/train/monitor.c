/* What watches the evaluations (docs/train.md, "Validation, best checkpoints and early
 * stopping"): checkpoint.keep_best (the checkpoint of the best evaluation, kept in
 * CHECKPOINT_DIR/best/) and train.early_stop (the run stops when a metric has not improved
 * in early_stop_patience evaluations), as Lightning's ModelCheckpoint(monitor=) and
 * EarlyStopping do; and the clock of checkpoint.every_minutes.
 *
 * Every rank sees the same evaluation (its sums are all-reduced) and updates the same
 * watches; what they decide (write best/, stop) is rank 0's and reaches the others
 * through the stop agreement after the evaluation (stop.c), so the ranks act together.
 * The watches' state is in every checkpoint's metadata ("best.*", "early_stop.*"), so a
 * resume keeps the best so far and the patience counter. */
#include "train/internal/run.h"

#include "core/timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *metric_name(int m) { return rt_names_name(&rt_monitor_names, m); }
static bool is_val(int m) { return m == RT_MONITOR_VAL_ACC || m == RT_MONITOR_VAL_LOSS; }
static bool is_acc(int m) { return m == RT_MONITOR_VAL_ACC || m == RT_MONITOR_TEST_ACC; }

static double metric_value(int m, const run_eval *e) {
    switch (m) {
    case RT_MONITOR_VAL_ACC:
        return e->val_acc;
    case RT_MONITOR_VAL_LOSS:
        return e->val_loss;
    case RT_MONITOR_TEST_ACC:
        return e->acc;
    case RT_MONITOR_TEST_LOSS:
        return e->loss;
    default:
        return NAN;
    }
}

/* a val_* metric needs the split */
static rt_status check_metric(const run *r, int m, const char *key) {
    RT_REQUIRE(!is_val(m) || r->data.have_val, RT_ERR_INVALID,
               "%s: %s needs a validation split (set data.val_split to the number of training samples to hold out, "
               "or watch test_acc / test_loss)",
               key, metric_name(m));
    return RT_OK;
}

rt_status rt_run_monitor_setup(run *r) {
    const rt_config *c = r->cfg;
    int best = c->checkpoint.keep_best;
    if (best == RT_CONFIG_AUTO) best = r->data.have_val ? RT_MONITOR_VAL_ACC : RT_MONITOR_NONE;
    RT_CHECK(check_metric(r, best, "checkpoint.keep_best"));
    RT_CHECK(check_metric(r, c->train.early_stop, "train.early_stop"));
    r->mon.best = (run_watch){.metric = best, .best_step = -1};
    r->mon.stop = (run_watch){.metric = c->train.early_stop, .best_step = -1};
    return RT_OK;
}

/* v improves on w's best by more than delta (the first finite value does); NaN never */
static bool improves(const run_watch *w, double v, double delta) {
    if (isnan(v)) return false;
    if (!w->have) return true;
    return is_acc(w->metric) ? v > w->best + delta : v < w->best - delta;
}

/* w after value v of step `step`; true when it improved */
static bool watch_update(run_watch *w, double v, double delta, int64_t step) {
    if (!improves(w, v, delta)) {
        w->bad++;
        return false;
    }
    *w = (run_watch){.metric = w->metric, .have = true, .best = v, .best_step = step, .bad = 0};
    return true;
}

void rt_run_monitor_observe(run *r, const run_eval *e) {
    const rt_config *c = r->cfg;
    run_watch *b = &r->mon.best, *s = &r->mon.stop;
    if (b->metric != RT_MONITOR_NONE && watch_update(b, metric_value(b->metric, e), 0.0, r->step))
        r->mon.write_best = true;
    if (s->metric == RT_MONITOR_NONE) return;
    watch_update(s, metric_value(s->metric, e), c->train.early_stop_min_delta, r->step);
    if (s->bad < c->train.early_stop_patience) return;
    r->mon.stop_wanted = true;
    snprintf(r->mon.why, sizeof r->mon.why,
             "%s did not improve on %.6g (step %lld) by more than %g in %lld evaluation(s) "
             "(train.early_stop_patience %lld)",
             metric_name(s->metric), s->best, (long long)s->best_step, c->train.early_stop_min_delta, (long long)s->bad,
             (long long)c->train.early_stop_patience);
}

/* ---- the checkpoint's metadata -------------------------------------------------------- */

static rt_status watch_meta(const run_watch *w, const char *pre, rt_ckpt_meta *m) {
    char key[64], num[64];
    snprintf(key, sizeof key, "%s.metric", pre);
    RT_CHECK(rt_ckpt_meta_set(m, key, metric_name(w->metric)));
    snprintf(key, sizeof key, "%s.evals_without_improvement", pre);
    RT_CHECK(rt_ckpt_meta_set_i64(m, key, w->bad));
    if (!w->have) return RT_OK;
    snprintf(key, sizeof key, "%s.value", pre);
    snprintf(num, sizeof num, "%.17g", w->best);
    RT_CHECK(rt_ckpt_meta_set(m, key, num));
    snprintf(key, sizeof key, "%s.step", pre);
    return rt_ckpt_meta_set_i64(m, key, w->best_step);
}

rt_status rt_run_monitor_meta(const run *r, rt_ckpt_meta *m) {
    if (r->mon.best.metric != RT_MONITOR_NONE) RT_CHECK(watch_meta(&r->mon.best, "best", m));
    if (r->mon.stop.metric == RT_MONITOR_NONE) return RT_OK;
    RT_CHECK(watch_meta(&r->mon.stop, "early_stop", m));
    return rt_ckpt_meta_set(m, "early_stop.stopped", r->mon.early_stopped ? "true" : "false");
}

/* w from the checkpoint's "<pre>.*" when it watched the same metric (else w starts
 * afresh); *found: it did */
static rt_status watch_restore(run_watch *w, const char *pre, const rt_ckpt_meta *m, bool *found) {
    char key[64];
    snprintf(key, sizeof key, "%s.metric", pre);
    const char *name = rt_ckpt_meta_get(m, key);
    *found = name && w->metric != RT_MONITOR_NONE && strcmp(name, metric_name(w->metric)) == 0;
    if (!*found) return RT_OK;
    snprintf(key, sizeof key, "%s.evals_without_improvement", pre);
    RT_CHECK(rt_ckpt_meta_get_i64(m, key, &w->bad));
    snprintf(key, sizeof key, "%s.value", pre);
    const char *v = rt_ckpt_meta_get(m, key);
    if (!v) return RT_OK; /* no evaluation before this checkpoint */
    char *end = NULL;
    w->best = strtod(v, &end);
    RT_REQUIRE(end != v && !*end, RT_ERR_FORMAT, "%s: metadata '%s' is \"%.64s\", expected a number", m->source, key,
               v);
    snprintf(key, sizeof key, "%s.step", pre);
    RT_CHECK(rt_ckpt_meta_get_i64(m, key, &w->best_step));
    w->have = true;
    return RT_OK;
}

rt_status rt_run_monitor_restore(run *r, const rt_ckpt_meta *m, const char *path) {
    const rt_config *c = r->cfg;
    bool found = false;
    RT_CHECK(watch_restore(&r->mon.best, "best", m, &found));
    const char *stopped = rt_ckpt_meta_get(m, "early_stop.stopped");
    RT_CHECK(watch_restore(&r->mon.stop, "early_stop", m, &found));
    if (!stopped || strcmp(stopped, "true") != 0) return RT_OK;
    const run_watch *s = &r->mon.stop;
    /* the run this checkpoint ends stopped early: continue only where the config lets it */
    RT_REQUIRE(!found || s->bad < c->train.early_stop_patience, RT_ERR_INVALID,
               "checkpoint %s ended its run by train.early_stop (%s: no improvement on %.6g of step %lld in %lld "
               "evaluation(s)); to train on from it, raise train.early_stop_patience above %lld or set "
               "train.early_stop: none (or start afresh: checkpoint.resume: none); its best checkpoint is in best/ "
               "beside it (ringtrain eval <checkpoint.dir>/best)",
               path, metric_name(s->metric), s->best, (long long)s->best_step, (long long)s->bad, (long long)s->bad);
    if (is_root(r)) {
        fprintf(r->out,
                "ringtrain: %s ended its run by train.early_stop; continuing (%s): the early stop now counts %s\n",
                path, found ? "train.early_stop_patience raised" : "train.early_stop changed",
                found ? "on from the checkpoint's evaluations" : "afresh");
        fflush(r->out);
    }
    return RT_OK;
}

/* ---- checkpoint.every_minutes ----------------------------------------------------------- */

/* The training clock in minutes: since training started (this attempt), or the test
 * hook's minutes per step done (RINGTRAIN_TEST_CLOCK). */
double rt_run_minutes(const run *r) {
    double per = 0;
    if (rt_run_test_clock(r, &per)) return per * (double)r->step;
    return (double)(rt_now_ns() - r->log.t0) * 1e-9 / 60.0;
}

/* Rank 0's clock alone decides (the others say no): the step's all-reduce of its scalars
 * carries the answer to every rank (step.c). */
bool rt_run_minutes_due(const run *r) {
    double every = r->cfg->checkpoint.every_minutes;
    return is_root(r) && every > 0 && rt_run_minutes(r) - r->ckpt.saved_min >= every;
}
