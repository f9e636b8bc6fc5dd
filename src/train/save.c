/* Writing a checkpoint during a run (the format: checkpoint.h), and the run's final
 * model.safetensors. Rank 0 writes ckpt-<step>/ after rank 0's batch-norm buffers reached
 * every rank; the others wait for the outcome, so a failed write (disk full, permissions)
 * stops every rank with rank 0's error and leaves the earlier checkpoints as they were. */
#include "train/internal/run.h"

#include "core/timer.h"
#include "core/trace.h"
#include "dist/launch.h"
#include "dist/store.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The metadata of the checkpoint of this step: where the data stands (epoch, batches),
 * the run, the schedule's state (as PyTorch's scheduler state_dict: its resolved lengths
 * and step), the device and, on a GPU, the convolution algorithms every rank ran (rank
 * 0's choice: setup.c), and the resolved config. */
static rt_status checkpoint_meta(run *r, int64_t epoch, int64_t epoch_batches, rt_ckpt_meta *m) {
    const rt_config *c = r->cfg;
    char *yaml = NULL;
    size_t ylen = 0;
    rt_status st = RT_OK;
    FILE *mf = open_memstream(&yaml, &ylen);
    if (!mf) st = RT_ERROR(RT_ERR_NOMEM, "checkpoint: the config text");
    if (st == RT_OK) st = rt_config_write(c, mf);
    if (mf) fclose(mf);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "epoch", epoch);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "epoch_batches", epoch_batches);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "world_size", r->who.world_size);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "global_batch", c->data.batch_size);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "seed", c->train.seed);
    if (st == RT_OK) st = rt_ckpt_meta_set(m, "run_id", r->ckpt.run_id);
    const rt_schedule *s = &r->upd.sched;
    if (st == RT_OK) st = rt_ckpt_meta_set(m, "schedule.kind", rt_sched_kind_name(s->kind));
    if (st == RT_OK) st = rt_ckpt_meta_set(m, "schedule.interval", s->per_epoch ? "epoch" : "iteration");
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "schedule.steps_per_epoch", s->steps_per_epoch);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "schedule.t_max", s->t_max);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "schedule.total_steps", s->total_steps);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "schedule.warmup_steps", s->warmup_steps);
    if (st == RT_OK) st = rt_ckpt_meta_set_i64(m, "schedule.step", r->step);
    if (st == RT_OK) st = rt_ckpt_meta_set(m, "device", rt_device_is_cuda(r->dev) ? "cuda" : "cpu");
    if (st == RT_OK && rt_device_is_cuda(r->dev)) {
        rt_conv_algos algos;
        rt_model_ctx_get_conv_algos(r->ctx, &algos);
        st = rt_ckpt_meta_set(m, "cudnn.deterministic", r->ctx->deterministic ? "true" : "false");
        if (st == RT_OK) st = rt_ckpt_meta_set(m, "cudnn.benchmark", r->ctx->benchmark ? "true" : "false");
        if (st == RT_OK) st = rt_ckpt_meta_set_conv_algos(m, "cudnn.conv_algos", &algos);
    }
    if (st == RT_OK) st = rt_run_monitor_meta(r, m); /* the best so far, the early stop's count */
    if (st == RT_OK) st = rt_ckpt_meta_set(m, "config", yaml ? yaml : "");
    free(yaml);
    return st;
}

/* Rank 0's part: the metadata, then the files (checkpoint.keep_last prunes older ones).
 * With a moving average, model.safetensors holds it (what evaluation uses) and the
 * optimizer's "ema" state the raw weights (swapped back right after). */
static rt_status write_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, char *path, size_t n) {
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = checkpoint_meta(r, epoch, epoch_batches, &m);
    rt_run_test_signal_at(r, "ckpt", r->step);
    rt_run_test_ckpt_stall(r);
    rt_launch_heartbeat();
    bool ema = st == RT_OK && rt_run_ema_active(r);
    if (ema) st = rt_run_ema_swap(r);
    if (st == RT_OK)
        st = rt_ckpt_write(r->ckpt.dir, r->step, r->model, &r->upd.opt, &m, (int)r->cfg->checkpoint.keep_last, path, n);
    if (st == RT_OK && r->mon.write_best) /* the same checkpoint, kept in best/ (never pruned) */
        st = rt_ckpt_write_named(r->ckpt.dir, "best", r->step, r->model, &r->upd.opt, &m, NULL, 0);
    if (ema) {
        rt_status s2 = rt_run_ema_swap(r);
        if (st == RT_OK) st = s2;
    }
    rt_launch_heartbeat();
    rt_ckpt_meta_free(&m);
    return st;
}

/* The peers' wait for rank 0's write (docs/checkpoints.md, "Slow checkpoints"): a write
 * (files, read-back, verification, pruning) may take longer than dist.timeout_s, which
 * bounds every collective. So the peers do not wait in one: rank 0 beats on the job's
 * store while it writes (a thread adds 1 to CKPT_BEAT every min(dist.timeout_s / 4, 10) s)
 * and sets CKPT_DONE when it is done; the peers poll both and wait as long as the beats
 * come, and fail after dist.timeout_s without one (a hung or dead rank 0; a dead one is
 * seen sooner by the launcher, which stops the job). Then the outcome's all-reduce, which
 * no longer waits for the write; rank 0 removes CKPT_DONE after it (every peer has seen
 * it), so the next checkpoint's wait starts afresh. */
#define CKPT_BEAT "rt/ckpt/beat"
#define CKPT_DONE "rt/ckpt/done"

typedef struct ckpt_beat {
    rt_store *store;
    double every_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
} ckpt_beat;

static void *beat_main(void *arg) {
    ckpt_beat *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->done) {
        pthread_mutex_unlock(&b->mu);
        if (rt_store_add(b->store, CKPT_BEAT, 1, NULL) != RT_OK) rt_error_clear(); /* the peers time out */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until); /* the condition variable waits on this clock */
        double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + b->every_s;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_mutex_lock(&b->mu);
        if (!b->done) pthread_cond_timedwait(&b->cv, &b->mu, &until);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Rank 0: write_checkpoint with the beat running, then CKPT_DONE set. */
static rt_status write_with_beat(run *r, int64_t epoch, int64_t epoch_batches, char *path, size_t n) {
    rt_store *store = r->pg ? rt_pg_store(r->pg) : NULL;
    if (!store) return write_checkpoint(r, epoch, epoch_batches, path, n);
    double t = r->cfg->dist.pg.timeout_s / 4;
    ckpt_beat b = {.store = store, .every_s = t < 10 ? t : 10, .done = false};
    pthread_mutex_init(&b.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* a wall-clock step does not stop the beats */
    pthread_cond_init(&b.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t th;
    bool started = pthread_create(&th, NULL, beat_main, &b) == 0;
    rt_status st = write_checkpoint(r, epoch, epoch_batches, path, n);
    if (started) {
        pthread_mutex_lock(&b.mu);
        b.done = true;
        pthread_cond_signal(&b.cv);
        pthread_mutex_unlock(&b.mu);
        pthread_join(th, NULL);
    }
    pthread_cond_destroy(&b.cv);
    pthread_mutex_destroy(&b.mu);
    rt_error_record err;
    if (st != RT_OK) rt_error_save(&err);
    rt_status s2 = rt_store_set(store, CKPT_DONE, "1", 1);
    if (st != RT_OK) return rt_error_restore(&err);
    return s2;
}

/* The other ranks: until rank 0 set CKPT_DONE, as long as its beats come. */
static rt_status wait_for_root(run *r) {
    rt_store *store = r->pg ? rt_pg_store(r->pg) : NULL;
    if (!store) return RT_OK;
    const double bound_s = r->cfg->dist.pg.timeout_s;
    int64_t beats = -1;
    uint64_t seen = rt_now_ns();
    long sleep_ns = 1000000;
    for (;;) {
        bool done = false;
        int64_t b = 0;
        RT_CHECK(rt_store_check(store, CKPT_DONE, &done));
        if (done) return RT_OK;
        RT_CHECK(rt_store_add(store, CKPT_BEAT, 0, &b));
        uint64_t now = rt_now_ns();
        if (b != beats) {
            beats = b;
            seen = now;
            rt_launch_heartbeat(); /* rank 0 is making progress: so is the job */
        } else if ((double)(now - seen) * 1e-9 > bound_s) {
            return RT_ERROR(RT_ERR_TIMEOUT,
                            "rank 0 gave no sign of progress for %.1f s (dist.timeout_s) while it wrote the checkpoint "
                            "of step %lld",
                            bound_s, (long long)r->step);
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 50000000) sleep_ns *= 2;
    }
}

static rt_status save_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, const char *why) {
    RT_CHECK(rt_run_broadcast_state(r, false));
    rt_status st = RT_OK;
    rt_error_record err;
    char path[RT_CKPT_PATH_MAX] = "";
    if (is_root(r)) {
        st = write_with_beat(r, epoch, epoch_batches, path, sizeof path);
        if (st != RT_OK) rt_error_save(&err);
    } else {
        rt_run_test_signal_at(r, "ckpt", r->step);
        RT_CHECK(wait_for_root(r));
    }
    double ok = st == RT_OK;
    RT_CHECK(rt_run_all_reduce_f64(r, &ok, 1, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err); /* rank 0's own error first (the key dies with its store) */
    if (is_root(r) && r->pg && rt_pg_store(r->pg)) RT_CHECK(rt_store_delete(rt_pg_store(r->pg), CKPT_DONE, NULL));
    RT_REQUIRE(ok > 0, RT_ERR_IO, "rank 0 could not write the checkpoint of step %lld (its error says why)",
               (long long)r->step);
    if (r->log.metrics) {
        json_t *f = json_pack("{s:I, s:I, s:s, s:o}", "step", (json_int_t)r->step, "epoch", (json_int_t)epoch, "why",
                              why, "path", rt_metrics_str(path));
        if (f && r->mon.write_best) json_object_set_new(f, "best", json_true());
        RT_CHECK(rt_metrics_line(r->log.metrics, "checkpoint", f));
    }
    r->mon.write_best = false;
    r->ckpt.saved_min = rt_run_minutes(r); /* checkpoint.every_minutes counts from the last save */
    rt_run_test_kill_after_checkpoint(r);
    return RT_OK;
}

/* The checkpoint of this step (and with mon.write_best the same in best/), `why`
 * (every_steps, every_minutes, every_epochs, best, end, stop, early_stop) in metrics.jsonl; epoch and epoch_batches:
 * where a resume continues. */
rt_status rt_run_save_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, const char *why) {
    uint64_t t = rt_trace_now();
    rt_status s = save_checkpoint(r, epoch, epoch_batches, why);
    rt_trace_end(RT_TRACK_MAIN, "checkpoint", t);
    return s;
}

/* Rank 0: the trained weights as torchvision's state_dict, RUN_DIR/model.safetensors (the
 * moving average where there is one: the weights evaluation uses). */
rt_status rt_run_save_model(run *r) {
    if (!is_root(r)) return RT_OK;
    char path[RT_CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", r->run_dir);
    bool ema = rt_run_ema_active(r);
    if (ema) RT_CHECK(rt_run_ema_swap(r));
    RT_CHECK(rt_model_ctx_sync(r->ctx));
    RT_CHECK(rt_model_save(r->model, path));
    if (ema) RT_CHECK(rt_run_ema_swap(r));
    return RT_OK;
}
