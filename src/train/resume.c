/* Choosing the checkpoint a run continues from, and loading it (docs/checkpoints.md).
 * Rank 0 chooses (checkpoint.resume: auto, none or a path) before the model is made (a GPU
 * resume takes the checkpoint's convolution algorithms) and tells every rank, which then
 * loads exactly that checkpoint; each checks the checkpoint's config against this run's
 * (a key of the trajectory may change only when checkpoint.allow_changes names it), the
 * schedule's saved state is restored, and the ranks agree on the outcome. A resumed run's
 * metrics files are cut back to the checkpoint's step. */
#include "train/internal/run.h"

#include "core/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* fflush, fsync and fclose f (written to `path`), each checked */
static rt_status close_synced(FILE *f, const char *path) {
    int e = 0;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) e = errno ? errno : EIO;
    if (fclose(f) != 0 && !e) e = errno;
    RT_REQUIRE(!e, RT_ERR_IO, "writing %s: %s", path, strerror(e));
    return RT_OK;
}

/* fsync the directory that holds `path` (a rename in it is then durable) */
static rt_status fsync_parent(const char *path) {
    char dir[RT_CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    RT_REQUIRE(fd >= 0, RT_ERR_IO, "cannot open %s to fsync it: %s", dir, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    RT_REQUIRE(rc == 0, RT_ERR_IO, "fsync %s: %s", dir, strerror(e));
    return RT_OK;
}

/* Cut metrics file `path` back to `step`: the lines logged after it go to `moved` (a new
 * file; NULL: dropped, they are logged again by the run that resumes there), the rest
 * stay. Durable: `moved` is complete on disk before `path` is replaced, and `path` is
 * replaced by an fsynced temporary renamed over it (then its folder fsynced), so a crash
 * leaves either file whole. `eval_at` as for rt_run_truncate_metrics. */
static rt_status cut_metrics(const char *path, int64_t step, int64_t *eval_at, const char *moved) {
    if (eval_at) *eval_at = -1;
    FILE *f = fopen(path, "r");
    if (!f) return RT_OK; /* nothing logged yet */
    char tmp[RT_CONFIG_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *o = fopen(tmp, "w"), *mv = o && moved ? fopen(moved, "w") : NULL;
    if (!o || (moved && !mv)) {
        int e = errno;
        fclose(f);
        if (o) fclose(o);
        return RT_ERROR(RT_ERR_IO, "%s: %s", o ? moved : tmp, strerror(e));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    bool past = false; /* the file is in time order: after the first line past `step`, every line
                        * is of the trajectory cut off (its "end" line, a later "start" line) */
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* a line cut short by a kill */
        const char *k = strstr(line, "\"step\": ");
        long long s = -1;
        if (k && sscanf(k + 8, "%lld", &s) == 1 && s > step) past = true;
        if (past) {
            if (mv) fputs(line, mv);
            continue;
        }
        if (eval_at && s == step && strncmp(line, "{\"kind\": \"eval\", ", 17) == 0) *eval_at = step;
        fputs(line, o);
    }
    bool read_err = ferror(f);
    free(line);
    fclose(f);
    rt_status st = mv ? close_synced(mv, moved) : RT_OK;
    rt_status st2 = close_synced(o, tmp);
    if (st == RT_OK) st = st2;
    if (st == RT_OK && read_err) st = RT_ERROR(RT_ERR_IO, "reading %s: %s", path, strerror(errno));
    if (st != RT_OK) {
        unlink(tmp);
        return st;
    }
    RT_REQUIRE(rename(tmp, path) == 0, RT_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    return fsync_parent(path);
}

/* Keep the lines of a metrics file up to `step` (a resumed run logs the steps after its
 * checkpoint again): no gap, no duplicate. Lines without a "step" field are kept.
 * `eval_at` (may be NULL): `step` if an "eval" line of that step was kept, else -1 (a
 * checkpoint of an epoch's last step was written before that epoch's evaluation, so the
 * resumed run evaluates that step again, and must not log it twice). */
rt_status rt_run_truncate_metrics(const char *path, int64_t step, int64_t *eval_at) {
    return cut_metrics(path, step, eval_at, NULL);
}

/* The metrics files of the run folder (metrics.jsonl, every rank's metrics-rank<k>.jsonl
 * of log.all_ranks as this rank sees the folder, and log.tensorboard's event files):
 * fn(r, name, arg) for each that exists, stopping at the first error. */
static rt_status each_metrics_file(run *r, rt_status (*fn)(run *, const char *, const void *), const void *arg) {
    DIR *d = opendir(r->run_dir);
    if (!d) return RT_OK;
    /* the names first, then fn: fn renames over them, and a folder read while its entries
     * are renamed may list one again (tmpfs, older btrfs) */
    char(*names)[256] = NULL;
    size_t count = 0, cap = 0;
    rt_status st = RT_OK;
    struct dirent *e;
    while (st == RT_OK && (e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        size_t l = strlen(nm);
        bool rank_file = strncmp(nm, "metrics-rank", 12) == 0 && l > 18 && strcmp(nm + l - 6, ".jsonl") == 0 &&
                         strspn(nm + 12, "0123456789") == l - 18;
        bool events = strncmp(nm, RT_TB_PREFIX, strlen(RT_TB_PREFIX)) == 0 && !strstr(nm, ".tmp");
        if ((strcmp(nm, "metrics.jsonl") != 0 && !rank_file && !events) || l >= sizeof *names) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 8;
            void *grown = realloc(names, cap * sizeof *names);
            if (!grown)
                st = RT_ERROR(RT_ERR_NOMEM, "listing the metrics files of %s", r->run_dir);
            else
                names = grown;
        }
        if (st == RT_OK) snprintf(names[count++], sizeof *names, "%s", nm);
    }
    closedir(d);
    for (size_t i = 0; i < count && st == RT_OK; i++) st = fn(r, names[i], arg);
    free(names);
    return st;
}

/* each_metrics_file: RUN_DIR/name moved whole into the folder `arg` (renamed, or copied
 * and removed across file systems) */
static rt_status move_metrics_file(run *r, const char *name, const void *arg) {
    char from[RT_CONFIG_PATH_MAX + 64], to[RT_CKPT_PATH_MAX + 64];
    snprintf(from, sizeof from, "%s/%s", r->run_dir, name);
    snprintf(to, sizeof to, "%s/%s", (const char *)arg, name);
    if (rename(from, to) == 0) return RT_OK;
    RT_REQUIRE(errno == EXDEV, RT_ERR_IO, "moving %s to %s: %s", from, to, strerror(errno));
    FILE *f = fopen(from, "r"), *o = f ? fopen(to, "w") : NULL;
    if (!o) {
        int e = errno;
        if (f) fclose(f);
        RT_FAIL(RT_ERR_IO, "%s: %s", f ? to : from, strerror(e));
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, o);
    bool read_err = ferror(f);
    fclose(f);
    RT_CHECK(close_synced(o, to));
    RT_REQUIRE(!read_err, RT_ERR_IO, "reading %s", from);
    RT_REQUIRE(unlink(from) == 0, RT_ERR_IO, "removing %s (copied to %s): %s", from, to, strerror(errno));
    return RT_OK;
}

/* each_metrics_file: the lines of RUN_DIR/name after the resumed step moved into the
 * same-named file of the abandoned branch's folder */
typedef struct cut_arg {
    int64_t step;
    const char *aside;
} cut_arg;
static rt_status cut_metrics_file(run *r, const char *name, const void *arg) {
    const cut_arg *a = arg;
    char from[RT_CONFIG_PATH_MAX + 64], to[RT_CKPT_PATH_MAX + 64];
    snprintf(from, sizeof from, "%s/%s", r->run_dir, name);
    snprintf(to, sizeof to, "%s/%s", a->aside, name);
    if (strncmp(name, RT_TB_PREFIX, strlen(RT_TB_PREFIX)) == 0) return rt_tb_cut(from, a->step, to, NULL);
    return cut_metrics(from, a->step, NULL, to);
}

/* A run's id: 16 hex digits from getrandom (the time and pid if it fails). */
static void new_run_id(char *out, size_t n) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    snprintf(out, n, "%016llx", (unsigned long long)v);
}

/* The run continues the run of the checkpoint it resumes: its run_id, unless it has none
 * (older than the key) or one that does not fit (then the fresh one stays) */
static void take_run_id(run *r, const char *id) {
    size_t l = strlen(id);
    if (l == 0 || l >= sizeof r->ckpt.run_id) return;
    memcpy(r->ckpt.run_id, id, l + 1);
}

/* Whether `path` (a checkpoint directory) sits directly in the folder `dir` (the same
 * directory, by device and inode) */
static bool in_folder(const char *path, const char *dir) {
    char parent[RT_CKPT_PATH_MAX + 4];
    snprintf(parent, sizeof parent, "%s", path);
    size_t l = strlen(parent);
    while (l > 1 && parent[l - 1] == '/') parent[--l] = '\0';
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        slash[slash == parent ? 1 : 0] = '\0';
    struct stat a, b;
    return stat(parent, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* checkpoint.resume: PATH. The run continues PATH's run (its run_id) when PATH is the
 * newest checkpoint of this run's folder; it is a new branch with its own (fresh) run id
 * when the folder holds newer checkpoints (a rollback: rt_run_resume moves them aside)
 * or PATH is in another folder. A PATH whose header cannot be read is left to
 * rt_run_resume, which says why. */
static rt_status choose_path(run *r, const char *dir) {
    const char *path = r->cfg->checkpoint.resume;
    snprintf(r->ckpt.chosen_path, sizeof r->ckpt.chosen_path, "%s", path);
    int64_t step;
    char id[64];
    if (rt_ckpt_peek(path, &step, id, sizeof id) != RT_OK) {
        rt_error_clear();
        return RT_OK;
    }
    r->ckpt.chosen_step = step;
    int n = 0;
    RT_CHECK(rt_ckpt_count_abandoned(dir, step, path, &n, NULL, 0));
    if (n == 0 && in_folder(path, dir)) take_run_id(r, id);
    return RT_OK;
}

/* checkpoint.resume: none. The folder must hold no checkpoint, or checkpoint.overwrite
 * moves them aside, and the run's metrics files go with them. */
static rt_status choose_none(run *r, const char *dir) {
    int n = 0;
    char newest[256];
    RT_CHECK(rt_ckpt_count(dir, &n, newest, sizeof newest));
    if (n == 0) return RT_OK;
    RT_REQUIRE(r->cfg->checkpoint.overwrite, RT_ERR_INVALID,
               "checkpoint.resume is none but %s holds %d checkpoint(s) of an earlier run (the newest %s); a new "
               "run there would mix with them: give this run another checkpoint.dir (or log.dir), continue that "
               "run (checkpoint.resume: auto), or set checkpoint.overwrite: true to move them aside into "
               "%s/old-<run id>/",
               dir, n, newest, dir);
    char aside[RT_CKPT_PATH_MAX + 128];
    RT_CHECK(rt_ckpt_move_aside(dir, aside, sizeof aside));
    RT_CHECK(each_metrics_file(r, move_metrics_file, aside));
    fprintf(r->out,
            "ringtrain: checkpoint.overwrite: moved the %d checkpoint(s) of %s and the run's metrics aside into %s\n",
            n, dir, aside);
    fflush(r->out);
    return RT_OK;
}

/* Rank 0's choice (find_resume): checkpoint.resume auto (the newest complete checkpoint
 * of checkpoint.dir, if any, and its run id), none (choose_none) or a path (choose_path).
 * A fresh run and a new branch get a fresh run id. */
static rt_status choose_resume(run *r) {
    const rt_config *c = r->cfg;
    new_run_id(r->ckpt.run_id, sizeof r->ckpt.run_id); /* a resume that continues a run takes its id */
    char dir[RT_CKPT_PATH_MAX];
    rt_run_rank_view(r, r->ckpt.dir, dir, sizeof dir);
    if (strcmp(c->checkpoint.resume, "none") == 0) return choose_none(r, dir);
    if (strcmp(c->checkpoint.resume, "auto") != 0) return choose_path(r, dir);
    rt_ckpt_found found;
    RT_CHECK(rt_ckpt_find(dir, &found));
    for (int i = 0; i < found.n_skipped; i++)
        RT_LOG_WARN("checkpoint %s refused: %s; trying the one before", found.skipped[i].path, found.skipped[i].reason);
    snprintf(r->ckpt.chosen_path, sizeof r->ckpt.chosen_path, "%s", found.path); /* "": nothing to resume */
    r->ckpt.chosen_step = found.step;
    take_run_id(r, found.run_id);
    return RT_OK;
}

/* Rank 0 chooses the checkpoint to continue from into r->ckpt.chosen_path ("": a fresh run),
 * before the model is made (a GPU resume takes the checkpoint's convolution algorithms);
 * the other ranks take its choice from share_resume. A failure is kept for share_resume,
 * which tells every rank. */
rt_status rt_run_find_resume(run *r) {
    r->ckpt.chosen_path[0] = '\0';
    r->ckpt.chosen_step = -1;
    rt_train_ckpt_dir(r->cfg, r->ckpt.dir, sizeof r->ckpt.dir);
    if (!is_root(r)) return RT_OK;
    if (choose_resume(r) != RT_OK) {
        rt_error_save(&r->ckpt.choose_err);
        r->ckpt.choose_failed = true;
        r->ckpt.chosen_path[0] = '\0';
    }
    return RT_OK;
}

/* Rank 0's choice (path, step, run id) to every rank, after the model is made: every
 * rank then loads exactly that path, whatever its own folder holds. */
rt_status rt_run_share_resume(run *r) {
    struct {
        int64_t failed, step;
        char run_id[32];
        char path[RT_CKPT_PATH_MAX];
    } d;
    memset(&d, 0, sizeof d);
    d.failed = r->ckpt.choose_failed;
    d.step = r->ckpt.chosen_step;
    snprintf(d.run_id, sizeof d.run_id, "%s", r->ckpt.run_id);
    snprintf(d.path, sizeof d.path, "%s", r->ckpt.chosen_path);
    RT_CHECK(rt_run_broadcast_bytes(r, &d, sizeof d));
    if (r->ckpt.choose_failed) return rt_error_restore(&r->ckpt.choose_err);
    RT_REQUIRE(!d.failed, RT_ERR_INVALID, "rank 0 could not choose the checkpoint (its error says why)");
    snprintf(r->ckpt.chosen_path, sizeof r->ckpt.chosen_path, "%s", d.path);
    snprintf(r->ckpt.run_id, sizeof r->ckpt.run_id, "%s", d.run_id);
    r->ckpt.chosen_step = d.step;
    return RT_OK;
}

/* Every rank's outcome of loading rank 0's choice: the job goes on only if every rank
 * loaded it; otherwise each fails, the one that could not with its own reason. */
rt_status rt_run_agree_loaded(run *r, rt_status st, const char *path) {
    char what[RT_CKPT_PATH_MAX + 64];
    snprintf(what, sizeof what, "load the checkpoint %s that rank 0 chose", path);
    return rt_run_agree(r, st, what);
}

/* A config value as a person writes it: numbers in their shortest exact form (0.05, not
 * 0.050000000000000003), strings without their quotes. */
static void pretty_value(const char *v, char *out, size_t n) {
    char *end = NULL;
    double d = strtod(v, &end);
    if (end != v && !*end && strchr(v, '.')) {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, n, "%.*g", prec, d);
            if (strtod(out, NULL) == d) return;
        }
    }
    size_t l = strlen(v);
    if (l >= 2 && v[0] == '"' && v[l - 1] == '"')
        snprintf(out, n, "%.*s", (int)(l - 2), v + 1);
    else
        snprintf(out, n, "%s", v);
}

/* optim.eps as the optimizer uses it: auto is the optimizer's default (1e-8 unless its
 * row says otherwise: what a checkpoint written before auto existed holds) */
static double effective_eps(const rt_config *c) {
    if (!isnan(c->optim.opt.eps)) return c->optim.opt.eps;
    rt_optim_config d;
    rt_optim_config_default(&d, c->optim.opt.kind);
    return d.eps;
}

/* The checkpoint's config (metadata "config", the resolved config it was written with)
 * against this run's, key by key: a key of the trajectory that differs is refused unless
 * checkpoint.allow_changes names it, then it applies and rank 0 logs it. */
static rt_status compare_config(run *r, const char *path, const char *text) {
    const rt_config *c = r->cfg;
    for (int i = 0; i < c->checkpoint.n_allow_changes; i++)
        RT_REQUIRE(rt_config_has_key(c->checkpoint.allow_changes[i]), RT_ERR_INVALID,
                   "checkpoint.allow_changes: '%s' is not a config key (see docs/config.md)",
                   c->checkpoint.allow_changes[i]);
    rt_config *old = malloc(sizeof *old);
    RT_CHECK_ALLOC(old, sizeof *old);
    rt_config_default(old);
    char name[RT_CKPT_PATH_MAX + 64];
    snprintf(name, sizeof name, "%s/" RT_CKPT_TRAIN_FILE " metadata 'config'", path);
    rt_status st = rt_config_parse_text(old, text, strlen(text), name);
    char refused[2048] = "";
    size_t rl = 0;
    int n_refused = 0;
    const char *k;
    for (int i = 0; st == RT_OK && rt_config_key_at(i, &k, NULL, NULL, NULL); i++) {
        char a[1200], b[1200];
        rt_config_value_at(old, i, a, sizeof a);
        rt_config_value_at(c, i, b, sizeof b);
        /* a key that may change, or that a checkpoint never sets (its column in docs/config.md) */
        if (strcmp(a, b) == 0 || rt_config_key_resume(k) != RT_KEY_MUST_MATCH) continue;
        if (strcmp(k, "optim.eps") == 0 && effective_eps(old) == effective_eps(c)) continue; /* auto vs its value */
        char pa[600], pb[600];
        pretty_value(a, pa, sizeof pa);
        pretty_value(b, pb, sizeof pb);
        bool allowed = false;
        for (int j = 0; j < c->checkpoint.n_allow_changes; j++)
            allowed |= strcmp(c->checkpoint.allow_changes[j], k) == 0;
        if (allowed) {
            if (is_root(r)) fprintf(r->out, "ringtrain: checkpoint.allow_changes: %s %s -> %s\n", k, pa, pb);
            continue;
        }
        if (rl < sizeof refused)
            rl += (size_t)snprintf(refused + rl, sizeof refused - rl, "%s%s %s in the checkpoint, %s in this run",
                                   n_refused ? "; " : "", k, pa, pb);
        n_refused++;
    }
    free(old);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "checkpoint.resume: the checkpoint's config"), st;
    if (is_root(r)) fflush(r->out);
    RT_REQUIRE(n_refused == 0, RT_ERR_INVALID,
               "checkpoint %s was trained with another config: %s. A resume continues the same run: use the "
               "checkpoint's values, state the change with checkpoint.allow_changes=[KEY,...] to apply it, or start "
               "afresh (checkpoint.resume: none, in another checkpoint.dir)",
               path, refused);
    return RT_OK;
}

/* The schedule's saved state (schedule.* metadata) over the one this config resolves to:
 * lengths left to auto keep their saved values (a run trained longer by train.epochs
 * keeps its schedule, as a restored PyTorch scheduler keeps T_max); explicit ones, and
 * a schedule of another kind or interval (a stated change), come from the config.
 * Checkpoints without schedule.* keep the config's. */
static rt_status restore_schedule(run *r, const rt_ckpt_meta *m, int64_t step) {
    const rt_config *c = r->cfg;
    const char *kind = rt_ckpt_meta_get(m, "schedule.kind"), *interval = rt_ckpt_meta_get(m, "schedule.interval");
    if (!kind || !interval) return RT_OK;
    rt_schedule *sc = &r->upd.sched;
    if (strcmp(kind, rt_sched_kind_name(sc->kind)) != 0 || strcmp(interval, sc->per_epoch ? "epoch" : "iteration") != 0)
        return RT_OK;
    int64_t spe, t_max, total, saved_step;
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.steps_per_epoch", &spe));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.t_max", &t_max));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.total_steps", &total));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.step", &saved_step));
    RT_REQUIRE(saved_step == step, RT_ERR_FORMAT, "%s: metadata 'schedule.step' is %lld, expected the step %lld",
               m->source, (long long)saved_step, (long long)step);
    rt_schedule s = *sc;
    if (spe > 0) s.steps_per_epoch = spe;
    if (c->optim.sched.t_max == RT_CONFIG_AUTO) s.t_max = t_max;
    if (c->optim.sched.total_steps == RT_CONFIG_AUTO) s.total_steps = total;
    rt_status st = rt_schedule_validate(&s);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "the checkpoint's schedule.* metadata"), st;
    bool kept = s.t_max != sc->t_max || s.total_steps != sc->total_steps || s.steps_per_epoch != sc->steps_per_epoch;
    if (kept && is_root(r)) {
        fprintf(r->out,
                "ringtrain: the schedule keeps its saved lengths (t_max %lld, total_steps %lld, %lld steps/epoch; "
                "this config alone gives %lld, %lld, %lld): set optim.t_max or optim.total_steps with "
                "checkpoint.allow_changes to re-plan it\n",
                (long long)s.t_max, (long long)s.total_steps, (long long)s.steps_per_epoch, (long long)sc->t_max,
                (long long)sc->total_steps, (long long)sc->steps_per_epoch);
        fflush(r->out);
    }
    *sc = s;
    return RT_OK;
}

/* Rank 0, resuming checkpoint.resume: PATH of step `step`: the checkpoints of this run's
 * folder the resume abandons (rt_ckpt_abandon: newer ones, or another of that step) are
 * moved into CKPT_DIR/abandoned-<their run id>-from-<step>/, with the lines of the run's
 * metrics files logged after `step` (nothing is deleted); choose_path gave this branch
 * its own run id. */
static rt_status move_abandoned(run *r, int64_t step) {
    char dir[RT_CKPT_PATH_MAX], path[RT_CKPT_PATH_MAX], aside[RT_CKPT_PATH_MAX + 128];
    rt_run_rank_view(r, r->ckpt.dir, dir, sizeof dir);
    rt_run_rank_view(r, r->ckpt.chosen_path, path, sizeof path);
    int n = 0;
    RT_CHECK(rt_ckpt_abandon(dir, step, path, &n, aside, sizeof aside));
    if (n == 0) return RT_OK;
    cut_arg a = {step, aside};
    RT_CHECK(each_metrics_file(r, cut_metrics_file, &a));
    fprintf(r->out,
            "ringtrain: checkpoint.resume: %s (step %lld) is not the newest checkpoint of %s: this run is a new "
            "branch (run id %s); the %d checkpoint(s) it abandons and the metrics lines logged after step %lld were "
            "moved aside into %s/ (resume: auto never picks them)\n",
            path, (long long)step, dir, r->ckpt.run_id, n, (long long)step, aside);
    fflush(r->out);
    return RT_OK;
}

/* After every rank loaded checkpoint.resume: PATH, rank 0 moves the branch it abandons
 * aside (move_abandoned) and the ranks agree on the outcome (resume: auto abandons
 * nothing: a corrupt newer checkpoint it passed over stays where it is). */
static rt_status agree_abandoned(run *r, int64_t step) {
    const char *how = r->cfg->checkpoint.resume;
    if (strcmp(how, "auto") == 0 || strcmp(how, "none") == 0) return RT_OK;
    rt_status st = is_root(r) ? move_abandoned(r, step) : RT_OK;
    if (!r->pg) return st;
    rt_error_record err;
    if (st != RT_OK) rt_error_save(&err);
    int64_t ok = st == RT_OK;
    RT_CHECK(rt_run_all_reduce_host(r, &ok, 1, RT_I64, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err);
    RT_REQUIRE(ok, RT_ERR_IO, "rank 0 could not move the checkpoints this resume abandons aside (its error says why)");
    return RT_OK;
}

/* Load r->ckpt.chosen_path (rank 0's choice: find_resume, share_resume). Every rank loads
 * it, checks the metadata against this run, and the ranks agree on the outcome. */
/* A checkpoint that did not load (a tensor of another shape: model.num_classes,
 * data.label, model.width, ...) may come from another config: that difference, named by
 * key, says more than the tensor does. Otherwise the load's own error stands. */
static rt_status explain_load(run *r, const char *path) {
    rt_error_record why;
    rt_error_save(&why);
    rt_ckpt_meta m;
    rt_status cs = RT_OK;
    if (rt_ckpt_verify(path, &m) == RT_OK) {
        const char *text = rt_ckpt_meta_get(&m, "config");
        if (text) cs = compare_config(r, path, text);
    }
    rt_ckpt_meta_free(&m);
    return cs != RT_OK ? cs : rt_error_restore(&why);
}

rt_status rt_run_resume(run *r) {
    const rt_config *c = r->cfg;
    r->ckpt.resumed_from = -1;
    if (!r->ckpt.chosen_path[0]) return RT_OK;
    char path[RT_CKPT_PATH_MAX];
    rt_run_rank_view(r, r->ckpt.chosen_path, path, sizeof path);
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    int64_t step = 0, epoch = 0, batches = 0, world = 0, batch = 0;
    rt_status st = rt_ckpt_load(path, r->model, &r->upd.opt, &m);
    if (st != RT_OK) st = explain_load(r, path);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    /* model.safetensors held the moving average and the "ema" state the raw weights */
    if (st == RT_OK && rt_run_ema_active(r)) st = rt_run_ema_swap(r);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch", &epoch);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch_batches", &batches);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "world_size", &world);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "global_batch", &batch);
    if (st == RT_OK && r->ckpt.chosen_step >= 0 && step != r->ckpt.chosen_step)
        st = RT_ERROR(RT_ERR_FORMAT, "checkpoint %s holds step %lld here, rank 0 chose it as step %lld", path,
                      (long long)step, (long long)r->ckpt.chosen_step);
    const char *text = st == RT_OK ? rt_ckpt_meta_get(&m, "config") : NULL;
    if (st == RT_OK && text) st = compare_config(r, path, text);
    if (st == RT_OK && batch != c->data.batch_size)
        st = RT_ERROR(RT_ERR_INVALID,
                      "checkpoint %s was trained with data.batch_size %lld, this run has %lld: resume with the same "
                      "global batch (checkpoint.resume: none starts afresh)",
                      path, (long long)batch, (long long)c->data.batch_size);
    if (st == RT_OK) st = restore_schedule(r, &m, step);
    if (st == RT_OK) st = rt_run_monitor_restore(r, &m, path); /* refuses to go on after an early stop */
    rt_ckpt_meta_free(&m);
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "checkpoint.resume");
    RT_CHECK(rt_run_agree_loaded(r, st, r->ckpt.chosen_path));
    /* the rest of the epoch on another number of ranks: exact for the distributed sampler
     * (the epoch's order does not depend on it), not for partition (each rank's part does) */
    const rt_sampler_config *sc = &rt_loader_sampler(r->data.train_loader)->cfg;
    RT_REQUIRE(rt_sampler_resumable(sc, (int)world, batches * c->data.batch_size), RT_ERR_INVALID,
               "checkpoint %s stopped after batch %lld of epoch %lld on %lld rank(s), this run has %d: data.sampler "
               "partition cannot continue that epoch on another number of ranks (each rank's part of the data depends "
               "on it: some samples would be taken twice, others never); resume with %lld rank(s) (dist.nproc), from a "
               "checkpoint at an epoch's end, or with data.sampler: distributed",
               path, (long long)batches, (long long)epoch + 1, (long long)world, r->who.world_size, (long long)world);
    RT_CHECK(agree_abandoned(r, step));
    r->step = step;
    r->ckpt.start_epoch = epoch;
    r->ckpt.start_batches = batches;
    r->ckpt.resumed_from = step;
    if (is_root(r)) {
        fprintf(r->out, "ringtrain: resuming from %s (step %lld, epoch %lld, batch %lld)\n", path, (long long)step,
                (long long)epoch + 1, (long long)batches);
        if (world != r->who.world_size) /* data.sampler distributed (partition refused above) */
            fprintf(r->out,
                    "ringtrain: the checkpoint was written by %lld rank(s), this run has %d: the rest of epoch %lld is "
                    "re-partitioned over %d rank(s) (data.sampler %s: the samples of the epoch's order not taken yet, "
                    "each once)\n",
                    (long long)world, r->who.world_size, (long long)epoch + 1, r->who.world_size,
                    rt_sampler_mode_name(sc->mode));
        fflush(r->out);
    }
    return RT_OK;
}
