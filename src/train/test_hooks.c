/* Test-only fault injection (docs/testing.md, "Test hooks"): each RINGTRAIN_TEST_* setting
 * makes one rank break something at an exact point (a signal, a NaN, a skipped bucket, a
 * diverged parameter, a kill), so a test can wait for an event instead of for time and
 * fail when the trainer's repair or check is missing.
 *
 * They are compiled into every binary (the tests run the one users run) and act only
 * when RINGTRAIN_TEST_HOOKS=1 is set too: without it every hook reads as unset, and a run
 * that finds one set says once that it ignores it (rt_run_test_hooks_check). A hook only
 * ever signals its own process or ringtrain's launcher that forked it (checked: the
 * parent runs the same executable and handed this rank its job token), never another
 * process. This file is the only reader of the RINGTRAIN_TEST_* rows (tests/train/guards.sh
 * checks it). */
#include "train/internal/run.h"

#include "core/log.h"
#include "core/settings.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The switch: RINGTRAIN_TEST_HOOKS=1 (a value that does not parse counts as off). */
static bool hooks_enabled(void) {
    bool on = false;
    if (rt_setting_bool(RT_SET_TEST_HOOKS, &on) != RT_OK) {
        rt_error_clear();
        return false;
    }
    return on;
}

/* A hook's setting, NULL unless the hooks are enabled. */
static const char *hook_text(rt_setting_id id) { return hooks_enabled() ? rt_setting_text(id) : NULL; }

/* A hook's row: a test row named like the switch (its prefix, up to and with TEST_). */
static bool is_hook(const rt_setting_info *s) {
    const char *sw = rt_setting_info_get(RT_SET_TEST_HOOKS)->name;
    size_t pre = (size_t)(strrchr(sw, '_') - sw) + 1;
    return s && s->group == RT_SETTING_TEST && strncmp(s->name, sw, pre) == 0 && strcmp(s->name, sw) != 0;
}

/* A run with a hook set but not enabled says, once per process, that it ignores it. */
void rt_run_test_hooks_check(const run *r) {
    static bool said;
    (void)r;
    if (said || hooks_enabled()) return;
    for (int id = 0; id < RT_SETTING_COUNT_; id++) {
        const rt_setting_info *s = rt_setting_info_get((rt_setting_id)id);
        if (!is_hook(s) || !rt_setting_is_set((rt_setting_id)id)) continue;
        RT_LOG_WARN("ignoring %s: a test-only hook, which acts only with RINGTRAIN_TEST_HOOKS=1 (docs/testing.md)",
                    s->name);
        said = true;
    }
}

/* The pid of ringtrain's launcher when it forked this rank, else 0: the parent must run
 * the same executable as this process (both ringtrain) and this rank must hold a job
 * token (the launcher gives one to every rank it starts). Under torchrun, srun or a shell
 * the parent is someone else's process, and a hook never signals it. */
static pid_t launcher_pid(void) {
    if (!rt_setting_is_set(RT_SET_JOB_TOKEN)) return 0;
    pid_t parent = getppid();
    char exe[64];
    snprintf(exe, sizeof exe, "/proc/%d/exe", (int)parent);
    struct stat a, b;
    if (parent <= 1 || stat(exe, &a) != 0 || stat("/proc/self/exe", &b) != 0) return 0;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino ? parent : 0;
}

/* Each makes one rank break a distributed guarantee that the trainer must repair or
 * detect, so a test can fail when the repair or the check is missing:
 *   RINGTRAIN_TEST_INIT_SEED_RANK=<rank>     that rank initialises its weights from
 *       train.seed + 1 (rank 0's weights broadcast at start must replace them);
 *   RINGTRAIN_TEST_PERTURB_AT=<rank>:<step>  after step <step>, that rank adds 1e-3 to its
 *       first parameter (a diverged rank: dist.check_sync_every must name the step);
 *   RINGTRAIN_TEST_BN_PERTURB=<rank>         before every evaluation, that rank scales its
 *       batch-norm running means and variances by 4 (evaluation uses rank 0's). */
static bool test_env_rank(const run *r, rt_setting_id id, long long *step) {
    const char *v = hook_text(id);
    if (!v || !r->pg) return false;
    char *end = NULL;
    long long rank = strtoll(v, &end, 10);
    if (step) {
        if (*end != ':') return false;
        *step = strtoll(end + 1, &end, 10);
    }
    return !*end && rank == r->who.rank;
}

/* Tests only: RINGTRAIN_TEST_SIGNAL_AT=<where>:<step>[:<target>[:<rank>[:<signal>]]] makes
 * rank <rank> (default 0) send a signal at an exact point, where a test that polls and
 * then signals races with the run. <where>: step (between steps, before step <step>
 * starts), eval (inside the evaluation after step <step>, after its first batch), ckpt
 * (while the checkpoint of step <step> is written: rank 0 right before it writes the
 * files, the others before they wait for the outcome). <target>: launcher (default; its
 * parent when ringtrain's launcher started it, else itself) or self. <signal>: TERM
 * (default), INT, KILL, USR1 (the flight recorder) or STOP (with target self: a rank that
 * hangs, for the timeout diagnosis). After TERM, INT or USR1 the rank
 * waits (at most 60 s) until its own handler has the signal (the launcher forwards it),
 * so the stop (or dump) is decided at the next agreement point, never at a later one. */
void rt_run_test_signal_at(run *r, const char *where, int64_t step) {
    static bool fired;
    const char *v = hook_text(RT_SET_TEST_SIGNAL_AT);
    if (fired || !v) return;
    char w[16] = "", target[16] = "launcher", name[8] = "TERM";
    long long at = -1;
    int rank = 0;
    if (sscanf(v, "%15[^:]:%lld:%15[^:]:%d:%7s", w, &at, target, &rank, name) < 2) return;
    if (strcmp(w, where) != 0 || at != (long long)step || rank != r->who.rank) return;
    fired = true;
    int sig = strcmp(name, "INT") == 0    ? SIGINT
              : strcmp(name, "KILL") == 0 ? SIGKILL
              : strcmp(name, "USR1") == 0 ? SIGUSR1
              : strcmp(name, "STOP") == 0 ? SIGSTOP
                                          : SIGTERM;
    fflush(NULL);
    pid_t launcher = launcher_pid();
    if (strcmp(target, "launcher") == 0 && launcher > 0) {
        kill(launcher, sig);
        if (sig == SIGKILL)
            for (;;) pause(); /* PR_SET_PDEATHSIG: this rank dies with its launcher */
    } else {
        raise(sig); /* this thread: handled before raise returns */
    }
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 60000 && !(sig == SIGUSR1 ? rt_run_flight_signal() : rt_run_stop_signal() != 0); i++)
        nanosleep(&ms, NULL);
}

/* Tests only: RINGTRAIN_TEST_NAN_AT=<rank>:<step> puts a NaN into the first pixel of that
 * rank's batch at that step (1-based), so that rank alone produces non-finite gradients
 * (its loss may stay finite: a ReLU turns a NaN into 0 on the way forward, not back). */
void rt_run_test_nan_batch(const run *r, const rt_batch *b) {
    const char *v = hook_text(RT_SET_TEST_NAN_AT);
    if (!v || b->size < 1) return;
    char *end = NULL;
    long rank = strtol(v, &end, 10);
    if (*end != ':') return;
    long long at = strtoll(end + 1, &end, 10);
    if (*end || rank != r->who.rank || at != (long long)r->step + 1) return;
    b->images[0] = NAN;
}

/* Tests only (a desync on purpose, docs/dist.md "Hangs and desyncs"):
 *   RINGTRAIN_TEST_SKIP_BUCKET=<rank>:<step>:<bucket>   that rank does not all-reduce
 *       gradient bucket <bucket> (1 = the first started, as in "bucket 1 of 6") in step <step>;
 *   RINGTRAIN_TEST_BUCKET_COUNT=<rank>:<step>:<bucket>  it all-reduces it with one element
 *       fewer. */
void rt_run_test_bucket_fault(run *r) {
    const rt_setting_id ids[2] = {RT_SET_TEST_SKIP_BUCKET, RT_SET_TEST_BUCKET_COUNT};
    for (int k = 0; k < 2; k++) {
        const char *v = hook_text(ids[k]);
        long long rank = -1, step = -1, bucket = -1;
        if (!v || sscanf(v, "%lld:%lld:%lld", &rank, &step, &bucket) != 3) continue;
        if (rank != r->who.rank || step != (long long)r->step + 1) continue;
        fprintf(stderr, "%s: rank %lld, step %lld, bucket %lld\n", rt_setting_info_get(ids[k])->name, rank, step,
                bucket);
        rt_reducer_test_fault(r->upd.reducer, (int)bucket - 1, k == 0 ? RT_REDUCER_FAULT_SKIP : RT_REDUCER_FAULT_SHORT);
    }
}

/* x[i] = x[i] * mul + add for n floats of the model's device */
static rt_status test_edit_floats(run *r, float *x, size_t n, float mul, float add) {
    float *h = x;
    if (rt_device_is_cuda(r->dev)) {
        RT_CHECK(rt_model_ctx_sync(r->ctx));
        h = malloc(n * sizeof *h);
        RT_CHECK_ALLOC(h, n * sizeof *h);
        rt_status s = rt_memcpy(h, rt_device_cpu(), x, r->dev, n * sizeof *h, NULL);
        if (s != RT_OK) return free(h), s;
    }
    for (size_t i = 0; i < n; i++) h[i] = h[i] * mul + add;
    if (h == x) return RT_OK;
    rt_status s = rt_memcpy(x, r->dev, h, rt_device_cpu(), n * sizeof *h, NULL);
    free(h);
    return s;
}

rt_status rt_run_test_init_seed_rank(run *r) {
    if (!test_env_rank(r, RT_SET_TEST_INIT_SEED_RANK, NULL)) return RT_OK;
    return rt_model_init_weights(r->model, (uint64_t)r->cfg->train.seed + 1);
}

rt_status rt_run_test_perturb_at(run *r) {
    long long at = -1;
    if (!test_env_rank(r, RT_SET_TEST_PERTURB_AT, &at) || at != (long long)r->step) return RT_OK;
    return test_edit_floats(r, rt_model_params(r->model)->base, 1, 1.0f, 1e-3f);
}

rt_status rt_run_test_bn_perturb(run *r) {
    if (!test_env_rank(r, RT_SET_TEST_BN_PERTURB, NULL)) return RT_OK;
    for (int i = 0; i < rt_model_param_count(r->model); i++) {
        const rt_param *p = rt_model_param(r->model, i);
        if (p->kind == RT_PARAM_BUFFER && p->value.dtype == RT_F32)
            RT_CHECK(test_edit_floats(r, rt_tensor_data(&p->value), (size_t)rt_tensor_numel(&p->value), 4.0f, 0.0f));
    }
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_KILL_AFTER_CKPT=<step> makes rank 0, once the checkpoint of
 * that step is complete, SIGKILL its parent when ringtrain's launcher started it (its
 * ranks then die with it, PR_SET_PDEATHSIG) and itself (one rank: there is no launcher): a crash at an exact point,
 * where a test that polls for the checkpoint and then kills races with the run (which may have pruned it by then). */
void rt_run_test_kill_after_checkpoint(run *r) {
    const char *v = hook_text(RT_SET_TEST_KILL_AFTER_CKPT);
    if (!v || !is_root(r)) return;
    char *end = NULL;
    long long at = strtoll(v, &end, 10);
    if (*end || at != (long long)r->step) return;
    fflush(NULL);
    pid_t launcher = launcher_pid();
    if (launcher > 0) kill(launcher, SIGKILL);
    kill(getpid(), SIGKILL);
}

/* Tests only: RINGTRAIN_TEST_KILL_PLAN=<attempt>:<rank>:<step>[,...] makes, in attempt
 * <attempt> of the job (TORCHELASTIC_RESTART_COUNT), rank <rank> SIGKILL itself right after
 * step <step>: a different death in each attempt of a --max-restarts job, at exact points
 * (tests/train/resume.sh restart_repeat, bench/chaos.sh). */
static void kill_plan(const run *r) {
    const char *v = hook_text(RT_SET_TEST_KILL_PLAN);
    for (const char *p = v; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        long long attempt = -1, rank = -1, step = -1;
        if (sscanf(p, "%lld:%lld:%lld", &attempt, &rank, &step) != 3) return;
        if (attempt != rt_run_restart_count() || rank != r->who.rank || step != (long long)r->step) continue;
        fprintf(stderr, "RINGTRAIN_TEST_KILL_PLAN: rank %lld kills itself after step %lld (attempt %lld)\n", rank, step,
                attempt);
        fflush(NULL);
        kill(getpid(), SIGKILL);
    }
}

/* Tests only: RINGTRAIN_TEST_KILL_RANK_AT=<rank>:<step> makes that rank SIGKILL itself right
 * after step <step> in the job's first attempt only (restart_count 0: a restarted attempt
 * runs on); <rank>:<step>:every in every attempt. A rank that dies at an exact point, for
 * the launcher's restarts (tests/train/resume.sh restart). */
void rt_run_test_kill_rank_at(const run *r) {
    kill_plan(r);
    const char *v = hook_text(RT_SET_TEST_KILL_RANK_AT);
    if (!v) return;
    char *end = NULL;
    long long rank = strtoll(v, &end, 10);
    if (*end != ':' || rank != r->who.rank) return;
    long long at = strtoll(end + 1, &end, 10);
    bool every = strcmp(end, ":every") == 0;
    if (at != (long long)r->step || (*end && !every) || (!every && rt_run_restart_count() != 0)) return;
    fprintf(stderr, "RINGTRAIN_TEST_KILL_RANK_AT: rank %lld kills itself after step %lld (attempt %lld)\n", rank, at,
            rt_run_restart_count());
    fflush(NULL);
    kill(getpid(), SIGKILL);
}

/* Tests only: RINGTRAIN_TEST_CKPT_STALL=<step>:<seconds> makes rank 0 sleep that long inside
 * the write of the checkpoint of step <step> (after its metadata, before its files): a slow
 * disk or a large model, longer than a small dist.timeout_s (tests/train/resume.sh
 * ckpt_slow: the job must survive it). */
void rt_run_test_ckpt_stall(const run *r) {
    const char *v = hook_text(RT_SET_TEST_CKPT_STALL);
    long long at = -1;
    double s = 0;
    if (!v || !is_root(r) || sscanf(v, "%lld:%lf", &at, &s) != 2 || at != (long long)r->step || !(s > 0)) return;
    fprintf(stderr, "RINGTRAIN_TEST_CKPT_STALL: rank 0 stalls %g s in the checkpoint of step %lld\n", s, at);
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Tests only: RINGTRAIN_TEST_RANK_PATH=<rank>:<from>=<to> makes that rank see the files
 * under <from> at <to>, as ranks on different nodes see node-local folders of the same
 * name: the checkpoint folder's listing and the checkpoints it loads. */
void rt_run_rank_view(const run *r, const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    const char *v = hook_text(RT_SET_TEST_RANK_PATH);
    if (!v) return;
    char *end = NULL;
    long rank = strtol(v, &end, 10);
    const char *eq = *end == ':' ? strchr(end + 1, '=') : NULL;
    if (!eq || rank != r->who.rank) return;
    size_t fl = (size_t)(eq - end - 1);
    if (strncmp(path, end + 1, fl) != 0 || (path[fl] != '/' && path[fl] != '\0')) return;
    snprintf(out, n, "%s%s", eq + 1, path + fl);
}

/* Tests only: RINGTRAIN_TEST_CLOCK=<rank>:<minutes> makes that rank's training clock (the
 * one checkpoint.every_minutes reads, rt_run_minutes) say <minutes> per step done instead
 * of the time since training started: the steps where time-based checkpoints fall are
 * then exact, whatever the machine's speed. */
bool rt_run_test_clock(const run *r, double *minutes) {
    const char *v = hook_text(RT_SET_TEST_CLOCK);
    int rank = -1;
    char tail;
    if (!v || sscanf(v, "%d:%lf%c", &rank, minutes, &tail) != 2 || rank != r->who.rank) return false;
    return *minutes >= 0;
}
