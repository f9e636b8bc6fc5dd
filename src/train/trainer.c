/* The trainer (trainer.h): one rank of a data-parallel run. This file holds the public
 * entry points and the run's shape: the setup sequence, the run's logs (metrics.jsonl,
 * config.yaml, the console header), the epochs (loop.c) and the end (the last
 * evaluation, the model file, the end line). The rooms it calls are listed in
 * internal/run.h. */
#include "train/internal/run.h"

#include "core/file.h"
#include "core/log.h"
#include "core/settings.h"
#include "core/timer.h"
#include "core/trace.h"
#include "dist/launch.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void rt_train_run_dir(const rt_config *cfg, char *out, size_t n) {
    if (strcmp(cfg->log.dir, "auto") != 0) {
        snprintf(out, n, "%s", cfg->log.dir);
        return;
    }
    const char *base = strrchr(cfg->source, '/');
    base = base ? base + 1 : cfg->source;
    char stem[RT_CONFIG_PATH_MAX];
    snprintf(stem, sizeof stem, "%s", *base ? base : "default");
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = '\0';
    snprintf(out, n, "runs/%.*s", (int)(n > 6 ? n - 6 : 0), stem);
}

void rt_train_ckpt_dir(const rt_config *cfg, char *out, size_t n) {
    if (strcmp(cfg->checkpoint.dir, "auto") != 0) {
        snprintf(out, n, "%s", cfg->checkpoint.dir);
        return;
    }
    char run_dir[RT_CONFIG_PATH_MAX];
    rt_train_run_dir(cfg, run_dir, sizeof run_dir);
    snprintf(out, n, "%s/checkpoints", run_dir);
}

rt_status rt_train_check_world(const rt_config *cfg, int64_t world_size) {
    RT_REQUIRE(cfg->data.batch_size % world_size == 0, RT_ERR_INVALID,
               "data.batch_size: %lld is not divisible by the world size %lld (it is the global batch: each rank "
               "takes batch_size / world_size)",
               (long long)cfg->data.batch_size, (long long)world_size);
    int64_t k = cfg->train.accumulate;
    RT_REQUIRE(cfg->data.batch_size % (world_size * k) == 0, RT_ERR_INVALID,
               "data.batch_size %lld with train.accumulate %lld on %lld rank(s): each rank's batch of %lld does not "
               "split into %lld micro-batches (expected data.batch_size divisible by world_size x train.accumulate = "
               "%lld)",
               (long long)cfg->data.batch_size, (long long)k, (long long)world_size,
               (long long)(cfg->data.batch_size / world_size), (long long)k, (long long)(world_size * k));
    return RT_OK;
}

/* The job's attempt: TORCHELASTIC_RESTART_COUNT, set by ringtrain's launcher (--max-restarts)
 * and by torchrun; 0 (the first attempt) when unset. A launcher's variable that does not
 * parse reads as 0 here (this only labels metrics and test hooks), with a warning. */
long long rt_run_restart_count(void) {
    int64_t n = 0;
    if (rt_setting_int(RT_SET_TE_RESTART_COUNT, &n) != RT_OK) {
        RT_LOG_WARN("%s; taking attempt 0", rt_error_message());
        rt_error_clear();
        n = 0;
    }
    return (long long)n;
}

void rt_run_free(run *r) {
    rt_run_free_graphs(r); /* before the stream and what the graphs use */
    for (int i = 0; i < 2; i++)
        for (int e = 0; e < EV_COUNT; e++) rt_event_destroy(r->log.pend[i].ev[e]);
    for (int i = 0; i < 2; i++) rt_event_destroy(r->log.pend[i].anchor);
    rt_metrics_close(r->log.metrics);
    rt_metrics_close(r->log.rank_metrics);
    rt_tb_close(r->log.tb);
    rt_stage_stats_destroy(r->log.stats);
    rt_loader_destroy(r->data.train_loader);
    rt_loader_destroy(r->data.test_loader);
    rt_loader_destroy(r->data.val_loader);
    rt_reducer_destroy(r->upd.reducer);
    free(r->upd.bounds);
    if (r->upd.have_opt) rt_optimizer_free(&r->upd.opt);
    if (r->upd.have_clip) rt_grad_clip_free(&r->upd.clip);
    free(r->upd.no_decay);
    free(r->bufs.out_host);
    free(r->bufs.tta_x);
    free(r->bufs.tta_out);
    if (r->bufs.x_dev) rt_free(r->dev, r->bufs.x_dev);
    if (r->bufs.label_dev) rt_free(r->dev, r->bufs.label_dev);
    if (r->bufs.scratch_dev) rt_free(r->dev, r->bufs.scratch_dev);
    if (r->bufs.vals_host) rt_host_free(r->bufs.vals_host, r->bufs.vals_pinned);
    rt_event_destroy(r->bufs.ev_vals);
    rt_run_free_accum(r);
    rt_model_destroy(r->model);
    rt_model_ctx_destroy(r->ctx);
    rt_pg_destroy(r->pg);
    if (r->data.have_train) rt_dataset_free(&r->data.train_ds);
    if (r->data.have_test) rt_dataset_free(&r->data.test_ds);
    if (r->data.have_val) rt_dataset_free(&r->data.val_ds);
}

/* Everything before the first step, in an order every rank follows: the group before
 * the checkpoint choice (rank 0's, told to all), the model before loading a checkpoint
 * into it, the loaders before the optimizer (the schedule's lengths need the steps per
 * epoch), rank 0's weights to every rank before anything trains. */
static rt_status setup_run(run *r, rt_train_result *res) {
    const rt_config *c = r->cfg;
    RT_CHECK(rt_train_check_world(c, r->who.world_size));
    rt_train_run_dir(c, r->run_dir, sizeof r->run_dir);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    if (is_root(r)) RT_CHECK(rt_file_mkdirs(r->run_dir, "run directory"));
    RT_CHECK(rt_device_select(c->train.device, r->who.local_rank, &r->dev));
    RT_CHECK(rt_run_load_data(r));
    RT_CHECK(rt_run_setup_group(r));
    RT_CHECK(rt_run_find_resume(r));
    RT_CHECK(rt_run_setup_model(r));
    rt_launch_heartbeat();
    RT_CHECK(rt_run_setup_trace(r));
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream); /* the stream contract (docs/dist.md) */
    RT_CHECK(rt_run_share_resume(r));
    RT_CHECK(rt_run_broadcast_state(r, true));
    RT_CHECK(rt_run_check_in_sync(r, true, "after the initial broadcast"));
    RT_CHECK(rt_run_setup_loaders(r, true));
    RT_CHECK(rt_run_setup_optim(r));
    RT_CHECK(rt_run_monitor_setup(r)); /* before the resume, which restores the watches */
    rt_train_ckpt_dir(c, r->ckpt.dir, sizeof r->ckpt.dir);
    RT_CHECK(rt_run_resume(r));
    if (r->ckpt.resumed_from >= 0) RT_CHECK(rt_run_check_in_sync(r, true, "after loading the checkpoint"));
    RT_CHECK(rt_run_setup_reducer(r));
    RT_CHECK(rt_run_setup_events(r));
    RT_CHECK(rt_run_setup_accum(r));
    return rt_run_setup_graphs(r);
}

/* Rank 0's metrics.jsonl (cut back to the checkpoint's step on a resume; *eval_logged:
 * the step of an eval line it keeps, -1 if none), config.yaml and the "start" line. */
static rt_status open_metrics(run *r, bool resumed, int64_t *eval_logged) {
    const rt_config *c = r->cfg;
    char path[RT_CONFIG_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->run_dir);
    if (resumed) RT_CHECK(rt_run_truncate_metrics(path, r->step, eval_logged));
    RT_CHECK(rt_metrics_open(path, resumed, &r->log.metrics));
    if (c->log.tensorboard) RT_CHECK(rt_tb_open(r->run_dir, resumed ? r->step : -1, &r->log.tb));
    snprintf(path, sizeof path, "%s/config.yaml", r->run_dir);
    RT_CHECK(rt_config_write_file(c, path));
    char devs[32];
    json_t *fields =
        json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "world_size", r->who.world_size, "device",
                  rt_device_str(r->dev, devs, sizeof devs), "steps_per_epoch", (json_int_t)r->data.steps_per_epoch,
                  "total_steps", (json_int_t)r->data.total_steps, "global_batch", (json_int_t)c->data.batch_size,
                  "train_samples", (json_int_t)r->data.train_ds.n, "test_samples", (json_int_t)r->data.test_ds.n,
                  "parameters", (json_int_t)rt_model_num_parameters(r->model), "run_id", r->ckpt.run_id);
    if (fields && resumed) json_object_set_new(fields, "resumed_from_step", json_integer(r->step));
    if (fields && r->data.have_val) { /* the held-out indices' FNV-1a: the same split in any run that says so */
        char fp[20];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)r->data.val_fingerprint);
        json_object_set_new(fields, "val_samples", json_integer(r->data.val_ds.n));
        json_object_set_new(fields, "val_fingerprint", json_string(fp));
    }
    if (fields && rt_run_restart_count() > 0) /* a restarted attempt (--max-restarts, or torchrun's) */
        json_object_set_new(fields, "restart_count", json_integer(rt_run_restart_count()));
    return rt_metrics_line(r->log.metrics, "start", fields);
}

/* The run's logs: rank 0's metrics (open_metrics), every rank's own with log.all_ranks,
 * the progress bar and the console header. */
static rt_status open_logs(run *r, int64_t *eval_logged) {
    const rt_config *c = r->cfg;
    bool resumed = r->ckpt.resumed_from >= 0;
    *eval_logged = -1;
    /* rank 0's files (and with log.all_ranks each rank's own) fail the job on every rank */
    rt_status st = is_root(r) ? open_metrics(r, resumed, eval_logged) : RT_OK;
    RT_CHECK(rt_run_agree(r, st, "open the run's metrics.jsonl and config.yaml"));
    if (c->log.all_ranks) {
        char path[RT_CONFIG_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/metrics-rank%d.jsonl", r->run_dir, r->who.rank);
        st = resumed ? rt_run_truncate_metrics(path, r->step, NULL) : RT_OK;
        if (st == RT_OK) st = rt_metrics_open(path, resumed, &r->log.rank_metrics);
        RT_CHECK(rt_run_agree(r, st, "open its metrics-rank file"));
    }
    bool tty = c->log.progress == RT_PROGRESS_ON || (c->log.progress == RT_PROGRESS_AUTO && isatty(fileno(r->out)));
    rt_progress_init(&r->log.progress, r->out, tty, c->log.every_steps, c->train.epochs, r->data.steps_per_epoch,
                     r->data.total_steps, r->step);
    if (is_root(r)) {
        char devs[32], micro[80] = "";
        if (c->train.accumulate > 1) /* train.accumulate */
            snprintf(micro, sizeof micro, " (each rank: %lld micro-batches of %lld)", (long long)c->train.accumulate,
                     (long long)(c->data.batch_size / r->who.world_size / c->train.accumulate));
        fprintf(r->out,
                "ringtrain: %s (width %lld) on %s, %d rank(s), global batch %lld%s, %lld steps/epoch, %lld steps; run "
                "directory %s\n",
                rt_model_arch_name(c->model.arch), (long long)c->model.width, rt_device_str(r->dev, devs, sizeof devs),
                r->who.world_size, (long long)c->data.batch_size, micro, (long long)r->data.steps_per_epoch,
                (long long)r->data.total_steps, r->run_dir);
        fflush(r->out);
    }
    return RT_OK;
}

/* A clean stop: the checkpoint is written, the "stop" line is all that is left. */
static rt_status finish_stopped(run *r, rt_train_result *res, int64_t epoch) {
    res->steps = r->step;
    res->epochs = epoch;
    res->wall_s = (double)(rt_now_ns() - r->log.t0) * 1e-9;
    if (r->log.metrics)
        RT_CHECK(rt_metrics_line(r->log.metrics, "stop",
                                 json_pack("{s:I, s:i}", "step", (json_int_t)r->step, "signal", r->stop.signal)));
    return rt_run_traced_barrier(r);
}

/* train.early_stop ended the run (its checkpoint is written): the "early_stop" line and
 * the summary's reason. */
static rt_status note_early_stop(run *r, rt_train_result *res) {
    const run_watch *w = &r->mon.stop;
    res->early_stopped = true;
    snprintf(res->stop_reason, sizeof res->stop_reason, "%s", r->mon.why);
    if (!r->log.metrics) return RT_OK;
    return rt_metrics_line(r->log.metrics, "early_stop",
                           json_pack("{s:I, s:s, s:o, s:I, s:I, s:s}", "step", (json_int_t)r->step, "metric",
                                     rt_names_name(&rt_monitor_names, w->metric), "best", rt_metrics_num(w->best),
                                     "best_step", (json_int_t)w->best_step, "evals_without_improvement",
                                     (json_int_t)w->bad, "why", r->mon.why));
}

/* The end of a run that trained to its end (or stopped early): an evaluation if none ran
 * (a resume of a finished run), the ranks' final agreement, the model file and the "end"
 * line. */
static rt_status finish(run *r, rt_train_result *res, int64_t eval_logged, run_eval e, int64_t epoch) {
    if (isnan(e.acc)) { /* resumed from the end of a finished run: nothing left to train */
        RT_CHECK(rt_run_evaluate(r, &e));
        /* its evaluation was logged before the checkpoint */
        RT_CHECK(rt_run_log_eval(r, &e, epoch, eval_logged, false));
    }
    if (r->mon.early_stopped) RT_CHECK(note_early_stop(r, res));
    RT_CHECK(rt_run_check_in_sync(r, true, "at the end of training"));
    RT_CHECK(rt_run_save_model(r));
    double loss = e.loss, acc = e.acc;
    res->steps = r->step;
    res->epochs = epoch;
    res->test_loss = loss;
    res->test_accuracy = acc;
    res->test_samples = e.samples;
    res->val_loss = e.val_loss;
    res->val_accuracy = e.val_acc;
    res->val_samples = e.val_samples;
    res->wall_s = (double)(rt_now_ns() - r->log.t0) * 1e-9;
    if (r->log.metrics) /* NaN (a diverged model's test loss) is null: JSON has no NaN */
        RT_CHECK(rt_metrics_line(r->log.metrics, "end",
                                 json_pack("{s:I, s:o, s:o, s:o}", "steps", (json_int_t)res->steps, "wall_s",
                                           rt_metrics_num(res->wall_s), "test_accuracy", rt_metrics_num(acc),
                                           "test_loss", rt_metrics_num(loss))));
    return rt_run_traced_barrier(r);
}

static rt_status train_all(run *r, rt_train_result *res) {
    RT_CHECK(setup_run(r, res));
    int64_t eval_logged = -1;
    RT_CHECK(open_logs(r, &eval_logged));
    r->log.t0 = rt_now_ns();
    run_eval e;
    int64_t epoch = 0;
    RT_CHECK(rt_run_epochs(r, eval_logged, &e, &epoch));
    res->stopped = r->stop.requested && r->stop.signal > 0; /* by a signal; an early stop finishes */
    res->stop_signal = r->stop.signal;
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", r->ckpt.dir);
    res->resumed_step = r->ckpt.resumed_from;
    if (res->stopped) return finish_stopped(r, res, epoch);
    return finish(r, res, eval_logged, e, epoch);
}

rt_status rt_train(const rt_config *cfg, const rt_train_rank *who, FILE *out, rt_train_result *res) {
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.who = *who;
    r.out = out ? out : stdout;
    rt_run_test_hooks_check(&r);
    rt_run_signals_install();
    rt_status s = train_all(&r, res);
    if (rt_trace_enabled()) { /* the spans since the last epoch's end (a failure's included) */
        rt_error_record saved_err;
        if (s != RT_OK) rt_error_save(&saved_err);
        rt_reducer_trace_flush(r.upd.reducer);
        rt_status fs = rt_trace_flush();
        if (s != RT_OK)
            rt_error_restore(&saved_err); /* the run's error comes first */
        else
            s = fs;
        rt_trace_stop();
    }
    rt_run_signals_restore_stop();
    rt_error_record saved;
    if (s != RT_OK) rt_error_save(&saved);                    /* freeing must not lose the first error */
    if (s != RT_OK) rt_run_flight_dump(&r, "the run failed"); /* what the group did last; after the group exists */
    rt_run_signals_restore_flight();
    rt_run_free(&r);
    if (s != RT_OK) rt_error_restore(&saved);
    return s;
}
