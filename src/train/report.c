/* Reading metrics.jsonl back (report.h): the run's summary and its plots' gnuplot script.
 * JSON is parsed with jansson. */
#include "train/report.h"

#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- reading one file ------------------------------------------------------------------ */

typedef struct reader {
    rt_run_log *log;
    int64_t cap_steps, cap_evals;
    int cap_segments, cap_warnings;
    int64_t line;
    /* run time across resumes */
    double offset, last_raw, base_end_wall;
    bool any_time;
    bool segment_used; /* the current segment has a record */
} reader;

static rt_status warn(reader *rd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static rt_status warn(reader *rd, const char *fmt, ...) {
    rt_run_log *log = rd->log;
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s:%lld: ", log->path, (long long)rd->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (log->n_warnings == rd->cap_warnings) {
        int cap = rd->cap_warnings ? 2 * rd->cap_warnings : 8;
        char **w = realloc(log->warnings, sizeof *w * (size_t)cap);
        RT_CHECK_ALLOC(w, sizeof *w * (size_t)cap);
        log->warnings = w;
        rd->cap_warnings = cap;
    }
    char *copy = strdup(msg);
    RT_CHECK_ALLOC(copy, strlen(msg) + 1);
    log->warnings[log->n_warnings++] = copy;
    return RT_OK;
}

#define GROW(arr, n, cap, init)                                                                                        \
    do {                                                                                                               \
        if ((n) == (cap)) {                                                                                            \
            size_t c_ = (cap) ? 2 * (size_t)(cap) : (init);                                                            \
            void *p_ = realloc((arr), sizeof *(arr)*c_);                                                               \
            RT_CHECK_ALLOC(p_, sizeof *(arr)*c_);                                                                      \
            (arr) = p_;                                                                                                \
            (cap) = c_;                                                                                                \
        }                                                                                                              \
    } while (0)

static rt_status bad_field(reader *rd, const char *key, const char *expected) {
    return RT_ERROR(RT_ERR_FORMAT, "%s:%lld: field '%s': expected %s", rd->log->path, (long long)rd->line, key,
                    expected);
}

/* A number, or null / absent (NaN). */
static rt_status get_num(reader *rd, json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = NAN;
        return RT_OK;
    }
    if (!json_is_number(v)) return bad_field(rd, key, "a number or null");
    *out = json_number_value(v);
    return RT_OK;
}

/* An integer; absent gives `dflt` unless `required`. */
static rt_status get_int(reader *rd, json_t *obj, const char *key, bool required, int64_t dflt, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return RT_ERROR(RT_ERR_FORMAT, "%s:%lld: field '%s' is missing", rd->log->path, (long long)rd->line, key);
        *out = dflt;
        return RT_OK;
    }
    if (!json_is_integer(v)) return bad_field(rd, key, "an integer");
    *out = (int64_t)json_integer_value(v);
    return RT_OK;
}

static rt_report_segment *current_segment(reader *rd) { return &rd->log->segments[rd->log->n_segments - 1]; }

static rt_status new_segment(reader *rd) {
    rt_run_log *log = rd->log;
    GROW(log->segments, log->n_segments, rd->cap_segments, 4);
    log->segments[log->n_segments++] =
        (rt_report_segment){.end_wall_s = NAN, .end_accuracy = NAN, .end_loss = NAN, .last_time_s = NAN};
    return RT_OK;
}

static rt_status on_start(reader *rd, json_t *o) {
    rt_run_log *log = rd->log;
    (void)log;
    /* the first "start" describes the segment a file begins with */
    if (rd->segment_used) RT_CHECK(new_segment(rd));
    rd->segment_used = true;
    rt_report_segment *g = current_segment(rd);
    int64_t ws;
    RT_CHECK(get_int(rd, o, "world_size", false, 0, &ws));
    g->world_size = (int)ws;
    RT_CHECK(get_int(rd, o, "steps_per_epoch", false, 0, &g->steps_per_epoch));
    RT_CHECK(get_int(rd, o, "total_steps", false, 0, &g->total_steps));
    RT_CHECK(get_int(rd, o, "global_batch", false, 0, &g->global_batch));
    json_t *d = json_object_get(o, "device");
    if (d && !json_is_string(d)) return bad_field(rd, "device", "a string");
    if (d) snprintf(g->device, sizeof g->device, "%s", json_string_value(d));
    return RT_OK;
}

static rt_status on_end(reader *rd, json_t *o) {
    rt_report_segment *g = current_segment(rd);
    g->has_end = true;
    RT_CHECK(get_num(rd, o, "wall_s", &g->end_wall_s));
    RT_CHECK(get_num(rd, o, "test_accuracy", &g->end_accuracy));
    RT_CHECK(get_num(rd, o, "test_loss", &g->end_loss));
    if (isfinite(g->end_wall_s)) rd->base_end_wall = g->end_wall_s;
    return RT_OK;
}

/* A step at or before the last one kept: a resumed run repeated steps; its records
 * replace the earlier ones from that step on. */
static rt_status rewind_to(reader *rd, int64_t step) {
    rt_run_log *log = rd->log;
    int64_t n = log->n_steps, e = log->n_evals;
    while (n > 0 && log->steps[n - 1].rec.step >= step) n--;
    while (e > 0 && log->evals[e - 1].step >= step) e--;
    if (n == log->n_steps && e == log->n_evals) return RT_OK;
    RT_CHECK(warn(rd,
                  "step %lld repeats an earlier step (a resume from an earlier checkpoint?): its %lld earlier step "
                  "record(s) and %lld evaluation(s) from step %lld on are replaced by the later ones",
                  (long long)step, (long long)(log->n_steps - n), (long long)(log->n_evals - e), (long long)step));
    log->n_steps = n;
    log->n_evals = e;
    return RT_OK;
}

static rt_status on_step(reader *rd, json_t *o) {
    rt_run_log *log = rd->log;
    rt_step_record r = {0};
    int64_t rank, images;
    RT_CHECK(get_int(rd, o, "step", true, 0, &r.step));
    RT_CHECK(get_int(rd, o, "epoch", false, 0, &r.epoch));
    RT_CHECK(get_int(rd, o, "batch", false, 0, &r.batch));
    RT_CHECK(get_int(rd, o, "rank", false, log->rank < 0 ? 0 : log->rank, &rank));
    r.rank = (int)rank;
    for (int k = 0; k < RT_STAGE_COUNT_; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s_ms", rt_stage_name((rt_stage)k));
        RT_CHECK(get_num(rd, o, key, &r.ms[k]));
    }
    RT_CHECK(get_num(rd, o, "comm_busy_ms", &r.comm_busy_ms));
    RT_CHECK(get_int(rd, o, "images", false, 0, &images));
    r.images = images;
    RT_CHECK(get_num(rd, o, "images_per_s", &r.images_per_s));
    RT_CHECK(get_num(rd, o, "loss", &r.loss));
    RT_CHECK(get_num(rd, o, "lr", &r.lr));
    RT_CHECK(get_num(rd, o, "grad_norm", &r.grad_norm));
    RT_CHECK(get_num(rd, o, "time_s", &r.time_s));
    json_t *sk = json_object_get(o, "skipped");
    if (sk && !json_is_boolean(sk)) return bad_field(rd, "skipped", "true or false");
    r.skipped = sk && json_is_true(sk);

    if (log->n_steps > 0 && r.step <= log->steps[log->n_steps - 1].rec.step) RT_CHECK(rewind_to(rd, r.step));
    /* time since the first segment started: time_s starts again at a resume */
    double t = r.time_s;
    if (isfinite(t)) {
        if (rd->any_time && t < rd->last_raw) {
            double seg = rd->last_raw;
            if (isfinite(rd->base_end_wall) && rd->base_end_wall > seg) seg = rd->base_end_wall;
            rd->offset += seg;
            rd->base_end_wall = NAN;
        }
        rd->last_raw = t;
        rd->any_time = true;
    }
    rt_report_segment *g = current_segment(rd);
    if (isfinite(t) && !(g->last_time_s >= t)) g->last_time_s = t;
    GROW(log->steps, log->n_steps, rd->cap_steps, 1024);
    log->steps[log->n_steps++] =
        (rt_report_step){.rec = r, .run_s = isfinite(t) ? rd->offset + t : NAN, .segment = log->n_segments - 1};
    return RT_OK;
}

static rt_status on_eval(reader *rd, json_t *o) {
    rt_run_log *log = rd->log;
    rt_report_eval e;
    RT_CHECK(get_int(rd, o, "step", true, 0, &e.step));
    RT_CHECK(get_int(rd, o, "epoch", false, 0, &e.epoch));
    RT_CHECK(get_int(rd, o, "samples", false, 0, &e.samples));
    RT_CHECK(get_num(rd, o, "loss", &e.loss));
    RT_CHECK(get_num(rd, o, "accuracy", &e.accuracy));
    GROW(log->evals, log->n_evals, rd->cap_evals, 64);
    log->evals[log->n_evals++] = e;
    return RT_OK;
}

static rt_status on_object(reader *rd, json_t *o) {
    json_t *k = json_object_get(o, "kind");
    if (!k) return RT_ERROR(RT_ERR_FORMAT, "%s:%lld: no \"kind\" field", rd->log->path, (long long)rd->line);
    if (!json_is_string(k)) return bad_field(rd, "kind", "a string");
    const char *kind = json_string_value(k);
    if (strcmp(kind, "start") == 0) return on_start(rd, o);
    bool step = strcmp(kind, "step") == 0, eval = strcmp(kind, "eval") == 0, end = strcmp(kind, "end") == 0;
    if (step || eval || end) rd->segment_used = true;
    if (step) return on_step(rd, o);
    if (eval) return on_eval(rd, o);
    if (end) return on_end(rd, o);
    return RT_OK; /* other kinds: not needed here */
}

static json_t *parse_object(const char *text, size_t len, json_error_t *err) {
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, err);
    if (o && !json_is_object(o)) {
        json_decref(o);
        snprintf(err->text, sizeof err->text, "not a JSON object");
        err->column = 1;
        return NULL;
    }
    return o;
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

static rt_status read_lines(reader *rd, FILE *f) {
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    rt_status st = RT_OK;
    while ((n = getline(&buf, &cap, f)) >= 0) {
        rd->line++;
        bool complete = n > 0 && buf[n - 1] == '\n'; /* the writer ends every record with one */
        if (blank(buf, (size_t)n)) continue;
        json_error_t err;
        json_t *o = parse_object(buf, (size_t)n, &err);
        if (!o) {
            /* a record cut short by a kill, with a resumed run's first record appended
             * to the same line */
            const char *next = strstr(buf + 1, "{\"kind\"");
            json_error_t err2;
            json_t *o2 = next ? parse_object(next, (size_t)n - (size_t)(next - buf), &err2) : NULL;
            if (o2) {
                RT_CHECK_GOTO(warn(rd,
                                   "a truncated record (a run killed mid-write) is followed by a new one on the "
                                   "same line: skipped the truncated part (%d bytes)",
                                   (int)(next - buf)),
                              st, done);
                o = o2;
            } else if (!complete) {
                RT_CHECK_GOTO(warn(rd, "the last line is truncated (a run killed mid-write?): skipped"), st, done);
                break;
            } else {
                st = RT_ERROR(RT_ERR_FORMAT, "%s:%lld: malformed JSON at column %d: %s", rd->log->path,
                              (long long)rd->line, err.column, err.text);
                goto done;
            }
        }
        st = on_object(rd, o);
        json_decref(o);
        if (st != RT_OK) goto done;
    }
    if (ferror(f)) st = RT_ERROR(RT_ERR_IO, "%s: %s", rd->log->path, strerror(errno));
done:
    free(buf);
    return st;
}

rt_status rt_run_log_read(const char *path, int rank, rt_run_log **out) {
    *out = NULL;
    rt_run_log *log = calloc(1, sizeof *log);
    RT_CHECK_ALLOC(log, sizeof *log);
    snprintf(log->path, sizeof log->path, "%s", path);
    log->rank = rank;
    log->wall_s = NAN;
    reader rd = {.log = log, .base_end_wall = NAN};
    rt_status st = new_segment(&rd);
    if (st != RT_OK) {
        rt_run_log_free(log);
        return st;
    }
    int fd = -1;
    uint64_t size = 0;
    FILE *f = NULL;
    st = rt_file_open_regular(path, "metrics log", &fd, &size); /* a FIFO or a directory never blocks us */
    if (st == RT_OK && !(f = fdopen(fd, "r"))) {
        st = RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
    }
    if (st != RT_OK) {
        rt_run_log_free(log);
        return st;
    }
    st = read_lines(&rd, f);
    fclose(f);
    if (st != RT_OK) {
        rt_run_log_free(log);
        return st;
    }
    if (rd.any_time) {
        double seg = rd.last_raw;
        if (isfinite(rd.base_end_wall) && rd.base_end_wall > seg) seg = rd.base_end_wall;
        log->wall_s = rd.offset + seg;
    } else if (isfinite(rd.base_end_wall)) {
        log->wall_s = rd.base_end_wall;
    }
    *out = log;
    return RT_OK;
}

void rt_run_log_free(rt_run_log *log) {
    if (!log) return;
    for (int i = 0; i < log->n_warnings; i++) free(log->warnings[i]);
    free(log->warnings);
    free(log->steps);
    free(log->evals);
    free(log->segments);
    free(log);
}

/* ---- a run directory ------------------------------------------------------------------ */

static int cmp_rank(const void *a, const void *b) {
    const rt_run_log *x = *(rt_run_log *const *)a, *y = *(rt_run_log *const *)b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

rt_status rt_report_load(const char *run_dir, rt_report **out) {
    *out = NULL;
    rt_report *r = calloc(1, sizeof *r);
    RT_CHECK_ALLOC(r, sizeof *r);
    snprintf(r->run_dir, sizeof r->run_dir, "%s", run_dir);
    char path[1100];
    rt_status st = RT_OK;
    struct stat sb;
    if (stat(run_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = RT_ERROR(RT_ERR_IO, "%s: %s", run_dir, errno ? strerror(errno) : "not a directory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    RT_CHECK_GOTO(rt_run_log_read(path, -1, &r->main), st, fail);
    DIR *d = opendir(run_dir);
    if (!d) {
        st = RT_ERROR(RT_ERR_IO, "%s: %s", run_dir, strerror(errno));
        goto fail;
    }
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d)) != NULL) {
        int rank, end = 0;
        if (sscanf(e->d_name, "metrics-rank%d.jsonl%n", &rank, &end) != 1 || end == 0 || e->d_name[end] != '\0' ||
            rank < 0)
            continue;
        if (r->n_ranks == cap) {
            cap = cap ? 2 * cap : 8;
            rt_run_log **p = realloc(r->ranks, sizeof *p * (size_t)cap);
            if (!p) {
                closedir(d);
                st = RT_ERROR(RT_ERR_NOMEM, "out of memory");
                goto fail;
            }
            r->ranks = p;
        }
        snprintf(path, sizeof path, "%s/%s", run_dir, e->d_name);
        st = rt_run_log_read(path, rank, &r->ranks[r->n_ranks]);
        if (st != RT_OK) {
            closedir(d);
            goto fail;
        }
        r->n_ranks++;
    }
    closedir(d);
    if (r->n_ranks > 1) qsort(r->ranks, (size_t)r->n_ranks, sizeof *r->ranks, cmp_rank);
    *out = r;
    return RT_OK;
fail:
    rt_report_free(r);
    return st;
}

void rt_report_free(rt_report *r) {
    if (!r) return;
    rt_run_log_free(r->main);
    for (int i = 0; i < r->n_ranks; i++) rt_run_log_free(r->ranks[i]);
    free(r->ranks);
    free(r);
}

/* ---- summary ----------------------------------------------------------------------------- */

static bool stages_finite(const rt_step_record *r) {
    for (int k = 0; k < RT_STAGE_COUNT_; k++)
        if (!isfinite(r->ms[k])) return false;
    return true;
}

static rt_status stage_stats_of(const rt_run_log *log, rt_stage_stats **out) {
    RT_CHECK(rt_stage_stats_create(out));
    for (int64_t i = 0; i < log->n_steps; i++) {
        rt_step_record r = log->steps[i].rec;
        if (!stages_finite(&r)) continue;
        if (!isfinite(r.comm_busy_ms)) r.comm_busy_ms = 0;
        rt_status st = rt_stage_stats_add(*out, &r);
        if (st != RT_OK) {
            rt_stage_stats_destroy(*out);
            *out = NULL;
            return st;
        }
    }
    return RT_OK;
}

rt_status rt_report_summarize(const rt_report *r, rt_report_summary *s) {
    memset(s, 0, sizeof *s);
    const rt_run_log *log = r->main;
    s->test_accuracy = s->test_loss = s->final_train_loss = NAN;
    s->images_per_s_mean = s->images_per_s_last_epoch = NAN;
    /* the last evaluation, else the last "end" line's numbers */
    if (log->n_evals > 0) {
        const rt_report_eval *e = &log->evals[log->n_evals - 1];
        s->has_eval = true;
        s->eval_step = e->step;
        s->eval_epoch = e->epoch;
        s->test_accuracy = e->accuracy;
        s->test_loss = e->loss;
    } else {
        for (int g = log->n_segments - 1; g >= 0; g--)
            if (log->segments[g].has_end && isfinite(log->segments[g].end_accuracy)) {
                s->has_eval = true;
                s->eval_step = -1;
                s->test_accuracy = log->segments[g].end_accuracy;
                s->test_loss = log->segments[g].end_loss;
                break;
            }
    }
    s->wall_s = log->wall_s;
    s->segments = log->n_segments;
    s->world_size = log->segments[log->n_segments - 1].world_size;
    s->first_world_size = log->segments[0].world_size;
    s->finished = log->segments[log->n_segments - 1].has_end;
    s->step_records = log->n_steps;
    if (log->n_steps > 0) {
        const rt_step_record *last = &log->steps[log->n_steps - 1].rec;
        s->steps = last->step;
        s->final_train_loss = last->loss;
        s->last_epoch = last->epoch;
        double sum = 0, sum_last = 0;
        int64_t n = 0, n_last = 0;
        for (int64_t i = 0; i < log->n_steps; i++) {
            const rt_step_record *q = &log->steps[i].rec;
            if (!isfinite(q->images_per_s)) continue;
            sum += q->images_per_s;
            n++;
            if (q->epoch == s->last_epoch) {
                sum_last += q->images_per_s;
                n_last++;
            }
        }
        if (n > 0) s->images_per_s_mean = sum / (double)n;
        if (n_last > 0) s->images_per_s_last_epoch = sum_last / (double)n_last;
        s->last_epoch_steps = n_last;
    }
    RT_CHECK(stage_stats_of(log, &s->stages));
    if (r->n_ranks > 0) {
        s->ranks = calloc((size_t)r->n_ranks, sizeof *s->ranks);
        RT_CHECK_ALLOC(s->ranks, sizeof *s->ranks * (size_t)r->n_ranks);
        s->n_ranks = r->n_ranks;
        for (int i = 0; i < r->n_ranks; i++) {
            rt_stage_stats *st;
            RT_CHECK(stage_stats_of(r->ranks[i], &st));
            rt_report_rank *k = &s->ranks[i];
            double p50, p95, total;
            k->rank = r->ranks[i]->rank;
            k->steps = rt_stage_stats_count(st);
            rt_stage_stats_get(st, RT_STAGE_STEP, &k->step_mean_ms, &k->step_p50_ms, &k->step_p95_ms, &total);
            rt_stage_stats_get(st, RT_STAGE_DATA, &k->data_mean_ms, &p50, &p95, &total);
            rt_stage_stats_get(st, RT_STAGE_COMM, &k->comm_mean_ms, &p50, &p95, &total);
            rt_stage_stats_destroy(st);
        }
    }
    return RT_OK;
}

void rt_report_summary_free(rt_report_summary *s) {
    if (!s) return;
    rt_stage_stats_destroy(s->stages);
    free(s->ranks);
    memset(s, 0, sizeof *s);
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!isfinite(s)) {
        snprintf(buf, n, "unknown");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%.1f s (%ld:%02ld:%02ld)", s, t / 3600, (t / 60) % 60, t % 60);
    else if (t >= 60)
        snprintf(buf, n, "%.1f s (%ld:%02ld)", s, t / 60, t % 60);
    else
        snprintf(buf, n, "%.2f s", s);
}

void rt_report_print(const rt_report *r, const rt_report_summary *s, FILE *out) {
    char dur[64];
    fprintf(out, "run: %s\n", r->run_dir);
    if (s->has_eval && s->eval_step >= 0)
        fprintf(out, "test accuracy: %.2f%%  test loss: %.4f  (evaluated at step %lld, epoch %lld)\n",
                100.0 * s->test_accuracy, s->test_loss, (long long)s->eval_step, (long long)s->eval_epoch + 1);
    else if (s->has_eval)
        fprintf(out, "test accuracy: %.2f%%  test loss: %.4f\n", 100.0 * s->test_accuracy, s->test_loss);
    else
        fprintf(out, "test accuracy: none recorded (no evaluation yet)\n");
    fmt_duration(dur, sizeof dur, s->wall_s);
    fprintf(out, "wall time: %s%s\n", dur, s->finished ? "" : "  (the run has not finished: no \"end\" line)");
    if (s->step_records == 0) {
        fprintf(out, "steps: none recorded\n");
    } else {
        fprintf(out, "steps: %lld", (long long)s->steps);
        if (s->step_records != s->steps) fprintf(out, " (%lld step records)", (long long)s->step_records);
        fprintf(out, ", last epoch %lld, final training loss %.4f\n", (long long)s->last_epoch + 1,
                s->final_train_loss);
    }
    fprintf(out, "world size: %d", s->world_size);
    if (s->segments > 1) {
        fprintf(out, "  (%d resume(s); world size by segment:", s->segments - 1);
        for (int g = 0; g < r->main->n_segments; g++) fprintf(out, " %d", r->main->segments[g].world_size);
        fprintf(out, ")");
    }
    fprintf(out, "\n");
    if (s->step_records == 0) return;
    fprintf(out, "images/s: %.1f mean over steps, %.1f over the last epoch (%lld steps)\n", s->images_per_s_mean,
            s->images_per_s_last_epoch, (long long)s->last_epoch_steps);
    fprintf(out, "\n");
    rt_stage_stats_print(s->stages, out, "stages of a step, all steps");
    if (s->n_ranks > 0) {
        int slow = 0;
        for (int i = 1; i < s->n_ranks; i++)
            if (s->ranks[i].step_mean_ms - s->ranks[i].comm_mean_ms >
                s->ranks[slow].step_mean_ms - s->ranks[slow].comm_mean_ms)
                slow = i;
        fprintf(out, "\nper rank (metrics-rank<R>.jsonl)\n");
        fprintf(out, "  %-5s %7s %11s %9s %9s %11s %11s %13s\n", "rank", "steps", "step mean", "p50", "p95",
                "data mean", "comm mean", "step - comm");
        for (int i = 0; i < s->n_ranks; i++) {
            const rt_report_rank *k = &s->ranks[i];
            fprintf(out, "  %-5d %7lld %8.2f ms %9.2f %9.2f %8.2f ms %8.2f ms %10.2f ms%s\n", k->rank,
                    (long long)k->steps, k->step_mean_ms, k->step_p50_ms, k->step_p95_ms, k->data_mean_ms,
                    k->comm_mean_ms, k->step_mean_ms - k->comm_mean_ms,
                    s->n_ranks > 1 && i == slow ? "  <- slowest (least time waiting for the others)" : "");
        }
    }
}

/* ---- plots ------------------------------------------------------------------------------- */

static rt_status open_out(const char *dir, const char *name, FILE **f) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = fopen(path, "w");
    if (!*f) return RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
    return RT_OK;
}

static rt_status close_out(const char *dir, const char *name, FILE *f) {
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0) bad = true;
    if (bad) return RT_ERROR(RT_ERR_IO, "%s/%s: write failed: %s", dir, name, strerror(errno));
    return RT_OK;
}

/* a number for gnuplot: NaN is a gap (set datafile missing NaN) */
static void put(FILE *f, double v, const char *sep) {
    if (isfinite(v))
        fprintf(f, "%.9g%s", v, sep);
    else
        fprintf(f, "NaN%s", sep);
}

/* Window of the moving averages: about 1/50 of the points, at least 1. */
static int64_t window_of(int64_t n) { return n >= 100 ? n / 50 : (n >= 10 ? 5 : 1); }

/* Trailing mean of v(i) over the last w points that are finite. */
typedef double (*value_fn)(const rt_report_step *s);
static double moving_mean(const rt_report_step *s, int64_t i, int64_t w, value_fn v) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t j = i - w + 1 < 0 ? 0 : i - w + 1; j <= i; j++) {
        double x = v(&s[j]);
        if (isfinite(x)) {
            sum += x;
            n++;
        }
    }
    return n ? sum / (double)n : NAN;
}
static double v_loss(const rt_report_step *s) { return s->rec.loss; }
static double v_ips(const rt_report_step *s) { return s->rec.images_per_s; }
static double v_step_ms(const rt_report_step *s) { return s->rec.ms[RT_STAGE_STEP]; }
static double v_busy_ms(const rt_report_step *s) { return s->rec.ms[RT_STAGE_STEP] - s->rec.ms[RT_STAGE_COMM]; }

static const char *const k_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
enum { N_COLORS = (int)(sizeof k_colors / sizeof k_colors[0]) };

/* (1) training loss and test accuracy against step */
static rt_status plot_loss(const rt_run_log *log, const char *dir, FILE *gp) {
    FILE *f;
    int64_t w = window_of(log->n_steps);
    RT_CHECK(open_out(dir, "loss.dat", &f));
    fprintf(f, "# step\tepoch\tloss\tloss_mean_%lld\tlr\n", (long long)w);
    for (int64_t i = 0; i < log->n_steps; i++) {
        const rt_step_record *r = &log->steps[i].rec;
        fprintf(f, "%lld\t%lld\t", (long long)r->step, (long long)r->epoch);
        put(f, r->loss, "\t");
        put(f, moving_mean(log->steps, i, w, v_loss), "\t");
        put(f, r->lr, "\n");
    }
    RT_CHECK(close_out(dir, "loss.dat", f));
    RT_CHECK(open_out(dir, "eval.dat", &f));
    fprintf(f, "# step\tepoch\taccuracy_percent\ttest_loss\tsamples\n");
    for (int64_t i = 0; i < log->n_evals; i++) {
        const rt_report_eval *e = &log->evals[i];
        fprintf(f, "%lld\t%lld\t", (long long)e->step, (long long)e->epoch);
        put(f, 100.0 * e->accuracy, "\t");
        put(f, e->loss, "\t");
        fprintf(f, "%lld\n", (long long)e->samples);
    }
    RT_CHECK(close_out(dir, "eval.dat", f));

    fprintf(gp, "\n# (1) training loss and test accuracy against step\n");
    fprintf(gp, "reset\nset output 'loss.png'\n");
    fprintf(gp, "set title 'Training loss and test accuracy'\n");
    fprintf(gp, "set xlabel 'step (optimizer steps)'\nset ylabel 'loss (cross-entropy)'\n");
    fprintf(gp, "set grid\nset key outside bottom center horizontal\nset ytics nomirror\n");
    /* the loss axis: from 0 to a little above the training loss; a test loss far above
     * it (an early evaluation with unsettled batch-norm statistics) is left off the axis
     * rather than flattening every other curve */
    double top = 0;
    int64_t clipped = 0;
    for (int64_t i = 0; i < log->n_steps; i++)
        if (isfinite(log->steps[i].rec.loss) && log->steps[i].rec.loss > top) top = log->steps[i].rec.loss;
    double limit = 2 * top;
    for (int64_t i = 0; i < log->n_evals; i++) {
        double l = log->evals[i].loss;
        if (!isfinite(l)) continue;
        if (top > 0 && l > limit)
            clipped++;
        else if (l > top)
            top = l;
    }
    if (top > 0) fprintf(gp, "set yrange [0:%.6g]\n", 1.1 * top);
    for (int g = 1; g < log->n_segments; g++)
        for (int64_t i = 0; i < log->n_steps; i++)
            if (log->steps[i].segment == g) {
                fprintf(gp, "set arrow from %lld, graph 0 to %lld, graph 1 nohead dt 2 lc rgb '#888888'\n",
                        (long long)log->steps[i].rec.step, (long long)log->steps[i].rec.step);
                fprintf(gp, "set label 'resumed' at %lld, graph 0.97 left offset 0.5,0 tc rgb '#888888'\n",
                        (long long)log->steps[i].rec.step);
                break;
            }
    if (log->n_evals > 0) fprintf(gp, "set y2label 'test accuracy (%%)'\nset y2tics\n");
    fprintf(gp, "plot 'loss.dat' using 1:3 with lines lc rgb '#9ecae1' title 'training loss (each step)', \\\n");
    fprintf(gp, "     '' using 1:4 with lines lw 2 lc rgb '#08519c' title 'training loss (mean of %lld steps)'",
            (long long)w);
    if (log->n_evals > 0) {
        fprintf(gp, ", \\\n     'eval.dat' using 1:4 with linespoints pt 6 lc rgb '#ff7f0e' title 'test loss");
        if (clipped) fprintf(gp, " (%lld above the axis)", (long long)clipped);
        fprintf(gp, "'");
        fprintf(gp, ", \\\n     'eval.dat' using 1:3 axes x1y2 with linespoints pt 7 lw 2 lc rgb '#d62728' "
                    "title 'test accuracy (%%, right axis)'");
    }
    fprintf(gp, "\n");
    return RT_OK;
}

/* (2) the stages of a step, stacked: mean ms per stage per epoch (with 3 to 60 epochs),
 * else per window of steps */
static rt_status plot_stages(const rt_run_log *log, const char *dir, FILE *gp) {
    int64_t epochs = 0;
    for (int64_t i = 0; i < log->n_steps; i++)
        if (i == 0 || log->steps[i].rec.epoch != log->steps[i - 1].rec.epoch) epochs++;
    bool by_epoch = epochs >= 3 && epochs <= 60;
    int64_t win = by_epoch ? 0 : (log->n_steps + 19) / 20; /* about 20 bars */
    if (win < 1) win = 1;
    FILE *f;
    RT_CHECK(open_out(dir, "stages.dat", &f));
    fprintf(f, "# %s", by_epoch ? "epoch" : "first_step");
    for (int k = 0; k < RT_STAGE_STEP; k++) fprintf(f, "\t%s_ms", rt_stage_name((rt_stage)k));
    fprintf(f, "\tother_ms\tstep_ms\tsteps\n");
    int64_t bars = 0;
    for (int64_t i = 0; i < log->n_steps;) {
        int64_t j = i;
        double sum[RT_STAGE_COUNT_] = {0};
        int64_t n = 0;
        for (; j < log->n_steps; j++) {
            const rt_step_record *r = &log->steps[j].rec;
            if (by_epoch ? r->epoch != log->steps[i].rec.epoch : j - i >= win) break;
            if (!stages_finite(r)) continue;
            for (int k = 0; k < RT_STAGE_COUNT_; k++) sum[k] += r->ms[k];
            n++;
        }
        if (n > 0) {
            fprintf(f, "%lld", by_epoch ? (long long)log->steps[i].rec.epoch + 1 : (long long)log->steps[i].rec.step);
            double parts = 0;
            for (int k = 0; k < RT_STAGE_STEP; k++) {
                fprintf(f, "\t%.6g", sum[k] / (double)n);
                parts += sum[k] / (double)n;
            }
            double step = sum[RT_STAGE_STEP] / (double)n, other = step - parts;
            fprintf(f, "\t%.6g\t%.6g\t%lld\n", other > 0 ? other : 0.0, step, (long long)n);
            bars++;
        }
        i = j;
    }
    RT_CHECK(close_out(dir, "stages.dat", f));
    if (bars == 0) return RT_OK;

    fprintf(gp, "\n# (2) the stages of a step, stacked\n");
    fprintf(gp, "reset\nset output 'stages.png'\n");
    if (by_epoch)
        fprintf(gp, "set title 'Time per step by stage (mean over each epoch)'\nset xlabel 'epoch'\n");
    else
        fprintf(gp,
                "set title 'Time per step by stage (mean over windows of %lld steps)'\n"
                "set xlabel 'first step of the window'\n",
                (long long)win);
    fprintf(gp, "set ylabel 'time per step (ms)'\nset yrange [0:*]\nset grid ytics\n");
    fprintf(gp, "set key outside right top title 'stage' reverse Left\n");
    fprintf(gp, "set style data histograms\nset style histogram rowstacked\n");
    fprintf(gp, "set style fill solid 0.85 border rgb '#333333'\nset boxwidth 0.8 relative\n");
    if (bars > 20) fprintf(gp, "set xtics rotate by -60\n");
    fprintf(gp, "plot 'stages.dat' using 2:xtic(1) lc rgb '%s' title '%s'", k_colors[0], rt_stage_name(RT_STAGE_DATA));
    for (int k = 1; k < RT_STAGE_STEP; k++)
        fprintf(gp, ", \\\n     '' using %d lc rgb '%s' title '%s'", k + 2, k_colors[k % N_COLORS],
                rt_stage_name((rt_stage)k));
    fprintf(gp, ", \\\n     '' using %d lc rgb '#dddddd' title 'other (step - stages)'\n", RT_STAGE_STEP + 2);
    return RT_OK;
}

/* (3) images/s over wall time */
static rt_status plot_throughput(const rt_run_log *log, const char *dir, FILE *gp) {
    int64_t w = window_of(log->n_steps), n = 0;
    FILE *f;
    RT_CHECK(open_out(dir, "throughput.dat", &f));
    fprintf(f, "# run_s\tstep\timages_per_s\timages_per_s_mean_%lld\n", (long long)w);
    for (int64_t i = 0; i < log->n_steps; i++) {
        const rt_report_step *s = &log->steps[i];
        if (!isfinite(s->run_s)) continue;
        put(f, s->run_s, "\t");
        fprintf(f, "%lld\t", (long long)s->rec.step);
        put(f, s->rec.images_per_s, "\t");
        put(f, moving_mean(log->steps, i, w, v_ips), "\n");
        n++;
    }
    RT_CHECK(close_out(dir, "throughput.dat", f));
    if (n == 0) return RT_OK;
    fprintf(gp, "\n# (3) images/s over time\n");
    fprintf(gp, "reset\nset output 'throughput.png'\n");
    fprintf(gp, "set title 'Training throughput'\n");
    fprintf(gp, "set xlabel 'wall time since the run started (s)'\nset ylabel 'throughput (images/s, all ranks)'\n");
    fprintf(gp, "set yrange [0:*]\nset grid\nset key outside bottom center horizontal\n");
    for (int g = 1; g < log->n_segments; g++)
        for (int64_t i = 0; i < log->n_steps; i++)
            if (log->steps[i].segment == g && isfinite(log->steps[i].run_s)) {
                double x = log->steps[i].run_s;
                fprintf(gp, "set arrow from %.9g, graph 0 to %.9g, graph 1 nohead dt 2 lc rgb '#888888'\n", x, x);
                fprintf(gp, "set label 'resumed' at %.9g, graph 0.97 left offset 0.5,0 tc rgb '#888888'\n", x);
                break;
            }
    fprintf(gp, "plot 'throughput.dat' using 1:3 with lines lc rgb '#bbbbbb' title 'each step', \\\n");
    fprintf(gp, "     '' using 1:4 with lines lw 2 lc rgb '#2ca02c' title 'mean of %lld steps'\n", (long long)w);
    return RT_OK;
}

/* (4) per-rank step times (stragglers), from metrics-rank<R>.jsonl */
static rt_status plot_ranks(const rt_report *r, const char *dir, FILE *gp) {
    int64_t w = 1;
    int plotted = 0;
    for (int i = 0; i < r->n_ranks; i++) {
        const rt_run_log *log = r->ranks[i];
        int64_t wi = window_of(log->n_steps);
        if (wi > w) w = wi;
    }
    for (int i = 0; i < r->n_ranks; i++) {
        const rt_run_log *log = r->ranks[i];
        char name[64];
        snprintf(name, sizeof name, "rank%d.dat", log->rank);
        FILE *f;
        RT_CHECK(open_out(dir, name, &f));
        fprintf(f, "# step\trun_s\tstep_ms\tstep_ms_mean_%lld\tstep_minus_comm_ms_mean_%lld\tdata_ms\tcomm_ms\n",
                (long long)w, (long long)w);
        for (int64_t j = 0; j < log->n_steps; j++) {
            const rt_report_step *s = &log->steps[j];
            fprintf(f, "%lld\t", (long long)s->rec.step);
            put(f, s->run_s, "\t");
            put(f, s->rec.ms[RT_STAGE_STEP], "\t");
            put(f, moving_mean(log->steps, j, w, v_step_ms), "\t");
            put(f, moving_mean(log->steps, j, w, v_busy_ms), "\t");
            put(f, s->rec.ms[RT_STAGE_DATA], "\t");
            put(f, s->rec.ms[RT_STAGE_COMM], "\n");
        }
        RT_CHECK(close_out(dir, name, f));
        if (log->n_steps > 0) plotted++;
    }
    if (plotted == 0) return RT_OK;
    fprintf(gp, "\n# (4) per-rank step times (stragglers)\n");
    fprintf(gp, "reset\nset output 'ranks.png'\nset multiplot layout 2,1 title 'Per-rank step times (stragglers)'\n");
    const char *what[2] = {"whole step", "step without the wait for the all-reduce (a straggler is highest here)"};
    for (int panel = 0; panel < 2; panel++) {
        fprintf(gp, "set title '%s (mean of %lld steps)'\n", what[panel], (long long)w);
        fprintf(gp, "set xlabel 'step'\nset ylabel 'time (ms)'\nset grid\n");
        fprintf(gp, "set key outside right top title 'rank'\n");
        fprintf(gp, "plot");
        int k = 0;
        for (int i = 0; i < r->n_ranks; i++) {
            if (r->ranks[i]->n_steps == 0) continue;
            fprintf(gp, "%s 'rank%d.dat' using 1:%d with lines lw 2 lc rgb '%s' title 'rank %d'", k ? ", \\\n    " : "",
                    r->ranks[i]->rank, panel == 0 ? 4 : 5, k_colors[k % N_COLORS], r->ranks[i]->rank);
            k++;
        }
        fprintf(gp, "\n");
    }
    fprintf(gp, "unset multiplot\n");
    return RT_OK;
}

rt_status rt_report_write_plots(const rt_report *r, const char *out_dir, const char *pngs[RT_REPORT_MAX_PLOTS],
                                int *n_pngs) {
    *n_pngs = 0;
    const rt_run_log *log = r->main;
    FILE *gp;
    RT_CHECK(open_out(out_dir, "plots.gp", &gp));
    rt_status st = RT_OK;
    fprintf(gp, "# ringtrain report: the plots of %s (run `gnuplot plots.gp` in this folder)\n",
            "this run's metrics.jsonl");
    fprintf(gp, "set terminal pngcairo size 1100,650 noenhanced font 'sans,11'\n");
    fprintf(gp, "set datafile separator '\\t'\nset datafile missing 'NaN'\n");
    if (log->n_steps > 0) {
        RT_CHECK_GOTO(plot_loss(log, out_dir, gp), st, done);
        pngs[(*n_pngs)++] = "loss.png";
        long pos = ftell(gp);
        RT_CHECK_GOTO(plot_stages(log, out_dir, gp), st, done);
        if (ftell(gp) != pos) pngs[(*n_pngs)++] = "stages.png";
        pos = ftell(gp);
        RT_CHECK_GOTO(plot_throughput(log, out_dir, gp), st, done);
        if (ftell(gp) != pos) pngs[(*n_pngs)++] = "throughput.png";
    }
    if (r->n_ranks > 0) {
        long pos = ftell(gp);
        RT_CHECK_GOTO(plot_ranks(r, out_dir, gp), st, done);
        if (ftell(gp) != pos) pngs[(*n_pngs)++] = "ranks.png";
    }
done:
    if (st != RT_OK) {
        fclose(gp);
        return st;
    }
    RT_CHECK(close_out(out_dir, "plots.gp", gp));
    return RT_OK;
}

/* ---- running gnuplot ------------------------------------------------------------------ */

rt_status rt_report_run_gnuplot(const char *out_dir) {
    int fds[2];
    RT_CHECK_SYS(pipe2(fds, O_CLOEXEC));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return rt_error_sys(__FILE__, __LINE__, "fork");
    }
    if (pid == 0) {
        /* child: report a failure before exec through the pipe (closed by a good exec) */
        int why[2] = {0, 0};
        int log = -1, null = open("/dev/null", O_RDONLY);
        if (chdir(out_dir) != 0) {
            why[0] = 1;
        } else if ((log = open("gnuplot.log", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
            why[0] = 2;
        } else {
            if (null >= 0) dup2(null, 0);
            dup2(log, 1);
            dup2(log, 2);
            char *argv[] = {"gnuplot", "plots.gp", NULL};
            execvp(argv[0], argv);
            why[0] = 3;
        }
        why[1] = errno;
        ssize_t ignored = write(fds[1], why, sizeof why);
        (void)ignored;
        _exit(127);
    }
    close(fds[1]);
    int why[2] = {0, 0};
    ssize_t got;
    do {
        got = read(fds[0], why, sizeof why);
    } while (got < 0 && errno == EINTR);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return rt_error_sys(__FILE__, __LINE__, "waitpid");
    if (got == (ssize_t)sizeof why) {
        if (why[0] == 3 && (why[1] == ENOENT || why[1] == ENOTDIR))
            return RT_ERROR(RT_ERR_UNSUPPORTED,
                            "the plots need gnuplot, which is not on PATH: install Debian's gnuplot-nox "
                            "(scripts/install-deps train), or use --no-plots");
        const char *what[] = {"", "chdir", "open gnuplot.log in", "exec gnuplot in"};
        return RT_ERROR(RT_ERR_SYS, "cannot %s %s: %s", what[why[0] >= 1 && why[0] <= 3 ? why[0] : 0], out_dir,
                        strerror(why[1]));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return RT_OK;
    /* the log's last lines */
    char path[1200], tail[1024] = "";
    snprintf(path, sizeof path, "%s/gnuplot.log", out_dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0) {
            long size = ftell(f);
            fseek(f, size > (long)sizeof tail - 1 ? size - (long)sizeof tail + 1 : 0, SEEK_SET);
            size_t n = fread(tail, 1, sizeof tail - 1, f);
            tail[n] = '\0';
        }
        fclose(f);
    }
    if (WIFSIGNALED(status))
        return RT_ERROR(RT_ERR_SYS, "gnuplot (in %s) was killed by signal %d; its log %s ends:\n%s", out_dir,
                        WTERMSIG(status), path, tail);
    return RT_ERROR(RT_ERR_SYS, "gnuplot failed (exit %d) on %s/plots.gp; its log %s ends:\n%s", WEXITSTATUS(status),
                    out_dir, path, tail);
}

