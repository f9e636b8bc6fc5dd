/* Timing logs (metrics.h): metrics.jsonl lines, the per-epoch stage table and the
 * progress bar / plain progress lines. */
#include "train/metrics.h"

#include "core/timer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_stage_names[RT_STAGE_COUNT_] = {"data", "h2d",   "forward", "backward",
                                                           "comm", "optim", "step"};

const char *rt_stage_name(rt_stage s) { return (unsigned)s < RT_STAGE_COUNT_ ? k_stage_names[s] : "?"; }

/* ---- metrics.jsonl --------------------------------------------------------------------- */

struct rt_metrics {
    FILE *f;
    char path[1024];
};

rt_status rt_metrics_open(const char *path, bool append, rt_metrics **out) {
    rt_metrics *m = calloc(1, sizeof *m);
    RT_CHECK_ALLOC(m, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f) {
        rt_status s = RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
        free(m);
        return s;
    }
    *out = m;
    return RT_OK;
}

void rt_metrics_close(rt_metrics *m) {
    if (!m) return;
    if (m->f) fclose(m->f);
    free(m);
}

json_t *rt_metrics_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *rt_metrics_str(const char *s) {
    json_t *j = json_string(s);
    if (j || !s) return j;
    char *t = strdup(s); /* not UTF-8: keep ASCII, replace the rest */
    if (!t) return NULL;
    for (char *p = t; *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
    j = json_string(t);
    free(t);
    return j;
}

/* Set key to a new reference; a NULL value (out of memory) leaves the object incomplete,
 * which write_line reports. */
static bool put(json_t *o, const char *key, json_t *v) { return v && json_object_set_new(o, key, v) == 0; }

/* One line: the object's members after "kind", in their order; takes `fields`. Reals
 * with 6 significant digits (%.6g, as the lines always had). */
static rt_status write_line(rt_metrics *m, const char *kind, json_t *fields, bool complete) {
    json_t *o = json_object();
    bool ok = o && complete && fields && json_is_object(fields) && put(o, "kind", json_string(kind));
    if (ok) {
        const char *key;
        json_t *v;
        json_object_foreach(fields, key, v) {
            if (!put(o, key, json_incref(v))) ok = false;
        }
    }
    char *text = ok ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(o);
    json_decref(fields);
    if (!text)
        return RT_ERROR(RT_ERR_NOMEM, "%s: the \"%s\" line could not be built (out of memory, or not a JSON object)",
                        m->path, kind);
    fputs(text, m->f);
    fputc('\n', m->f);
    free(text);
    if (fflush(m->f) != 0 || ferror(m->f)) return RT_ERROR(RT_ERR_IO, "%s: %s", m->path, strerror(errno));
    return RT_OK;
}

rt_status rt_metrics_step(rt_metrics *m, const rt_step_record *r) {
    json_t *o = json_object();
    bool ok = o && put(o, "step", json_integer(r->step)) && put(o, "epoch", json_integer(r->epoch)) &&
              put(o, "batch", json_integer(r->batch)) && put(o, "rank", json_integer(r->rank));
    for (int s = 0; ok && s < RT_STAGE_COUNT_; s++) {
        char key[32];
        snprintf(key, sizeof key, "%s_ms", k_stage_names[s]);
        ok = put(o, key, rt_metrics_num(r->ms[s]));
    }
    ok = ok && put(o, "comm_busy_ms", rt_metrics_num(r->comm_busy_ms)) && put(o, "images", json_integer(r->images)) &&
         put(o, "images_per_s", rt_metrics_num(r->images_per_s)) && put(o, "loss", rt_metrics_num(r->loss)) &&
         put(o, "lr", rt_metrics_num(r->lr)) && put(o, "grad_norm", rt_metrics_num(r->grad_norm)) &&
         put(o, "time_s", rt_metrics_num(r->time_s)) && put(o, "skipped", json_boolean(r->skipped));
    return write_line(m, "step", o, ok);
}

rt_status rt_metrics_eval_record(rt_metrics *m, const rt_eval_record *e) {
    json_t *o = json_object();
    bool ok = o && put(o, "step", json_integer(e->step)) && put(o, "epoch", json_integer(e->epoch)) &&
              put(o, "loss", rt_metrics_num(e->loss)) && put(o, "accuracy", rt_metrics_num(e->accuracy)) &&
              put(o, "samples", json_integer(e->samples));
    if (ok && e->val_samples > 0)
        ok = put(o, "val_loss", rt_metrics_num(e->val_loss)) &&
             put(o, "val_accuracy", rt_metrics_num(e->val_accuracy)) &&
             put(o, "val_samples", json_integer(e->val_samples));
    return write_line(m, "eval", o, ok);
}

rt_status rt_metrics_eval(rt_metrics *m, int64_t step, int64_t epoch, double loss, double accuracy, int64_t samples) {
    rt_eval_record e = {.step = step, .epoch = epoch, .loss = loss, .accuracy = accuracy, .samples = samples};
    return rt_metrics_eval_record(m, &e);
}

rt_status rt_metrics_line(rt_metrics *m, const char *kind, json_t *fields) { return write_line(m, kind, fields, true); }

/* ---- per-epoch stage table ------------------------------------------------------------- */

struct rt_stage_stats {
    double *ms[RT_STAGE_COUNT_]; /* per step */
    double *busy;
    int64_t n, cap;
    double *scratch;
};

rt_status rt_stage_stats_create(rt_stage_stats **out) {
    rt_stage_stats *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    *out = s;
    return RT_OK;
}

void rt_stage_stats_destroy(rt_stage_stats *s) {
    if (!s) return;
    for (int i = 0; i < RT_STAGE_COUNT_; i++) free(s->ms[i]);
    free(s->busy);
    free(s->scratch);
    free(s);
}

void rt_stage_stats_reset(rt_stage_stats *s) { s->n = 0; }
int64_t rt_stage_stats_count(const rt_stage_stats *s) { return s->n; }

rt_status rt_stage_stats_add(rt_stage_stats *s, const rt_step_record *r) {
    if (s->n == s->cap) { /* grows during the first epoch only */
        int64_t cap = s->cap ? 2 * s->cap : 1024;
        for (int i = 0; i <= RT_STAGE_COUNT_; i++) {
            double **p = i < RT_STAGE_COUNT_ ? &s->ms[i] : &s->busy;
            double *q = realloc(*p, sizeof *q * (size_t)cap);
            RT_CHECK_ALLOC(q, sizeof *q * (size_t)cap);
            *p = q;
        }
        double *q = realloc(s->scratch, sizeof *q * (size_t)cap);
        RT_CHECK_ALLOC(q, sizeof *q * (size_t)cap);
        s->scratch = q;
        s->cap = cap;
    }
    for (int i = 0; i < RT_STAGE_COUNT_; i++) s->ms[i][s->n] = r->ms[i];
    s->busy[s->n] = r->comm_busy_ms;
    s->n++;
    return RT_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats_of(rt_stage_stats *s, const double *v, double *mean, double *p50, double *p95, double *total_s) {
    *mean = *p50 = *p95 = *total_s = 0;
    if (s->n == 0) return;
    double sum = 0;
    for (int64_t i = 0; i < s->n; i++) sum += v[i];
    memcpy(s->scratch, v, sizeof *v * (size_t)s->n);
    qsort(s->scratch, (size_t)s->n, sizeof *s->scratch, cmp_double);
    /* nearest rank: the smallest value with at least p% of the values at or below it */
    int64_t i50 = (int64_t)ceil(0.50 * (double)s->n) - 1, i95 = (int64_t)ceil(0.95 * (double)s->n) - 1;
    *mean = sum / (double)s->n;
    *p50 = s->scratch[i50 < 0 ? 0 : i50];
    *p95 = s->scratch[i95 < 0 ? 0 : i95];
    *total_s = sum * 1e-3;
}

void rt_stage_stats_get(const rt_stage_stats *s, rt_stage stage, double *mean, double *p50, double *p95,
                        double *total_s) {
    stats_of((rt_stage_stats *)s, s->ms[stage], mean, p50, p95, total_s);
}

void rt_stage_stats_print(const rt_stage_stats *s, FILE *out, const char *title) {
    double mean, p50, p95, total, step_total;
    rt_stage_stats_get(s, RT_STAGE_STEP, &mean, &p50, &p95, &step_total);
    fprintf(out, "%s (%lld steps)\n", title, (long long)s->n);
    fprintf(out, "  %-9s %9s %9s %9s %9s %7s\n", "stage", "mean ms", "p50", "p95", "total s", "%");
    for (int i = 0; i < RT_STAGE_COUNT_; i++) {
        rt_stage_stats_get(s, (rt_stage)i, &mean, &p50, &p95, &total);
        fprintf(out, "  %-9s %9.2f %9.2f %9.2f %9.2f %6.1f%%\n", k_stage_names[i], mean, p50, p95, total,
                step_total > 0 ? 100.0 * total / step_total : 0.0);
    }
    stats_of((rt_stage_stats *)s, s->busy, &mean, &p50, &p95, &total);
    fprintf(out, "  %-9s %9.2f %9.2f %9.2f %9.2f %6.1f%%  (all-reduce span, mostly hidden behind backward)\n",
            "comm busy", mean, p50, p95, total, step_total > 0 ? 100.0 * total / step_total : 0.0);
}

/* ---- progress ---------------------------------------------------------------------------- */

void rt_progress_init(rt_progress *p, FILE *out, bool tty, int64_t every, int64_t epochs, int64_t per_epoch,
                      int64_t total, int64_t start_step) {
    *p = (rt_progress){.out = out,
                       .tty = tty,
                       .every = every > 0 ? every : 50,
                       .epochs = epochs,
                       .per_epoch = per_epoch,
                       .total = total,
                       .start_ns = rt_now_ns(),
                       .start_step = start_step};
}

static void fmt_eta(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void rt_progress_step(rt_progress *p, const rt_step_record *r) {
    double el = (double)(rt_now_ns() - p->start_ns) * 1e-9;
    int64_t done = r->step - p->start_step;
    double eta = done > 0 ? el / (double)done * (double)(p->total - r->step) : NAN;
    char etas[32];
    fmt_eta(etas, sizeof etas, eta);
    int64_t in_epoch = r->batch + 1;
    if (p->tty) {
        int width = 24;
        int fill = p->per_epoch > 0 ? (int)((double)width * (double)in_epoch / (double)p->per_epoch) : 0;
        if (fill > width) fill = width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(p->out, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld  loss %.4f  %.0f img/s  ETA %s",
                (long long)r->epoch + 1, (long long)p->epochs, bar, (long long)in_epoch, (long long)p->per_epoch,
                r->loss, r->images_per_s, etas);
        fflush(p->out);
        p->drawn = true;
    } else if (r->step % p->every == 0 || r->step == p->total) {
        fprintf(p->out, "epoch %lld/%lld step %lld/%lld (batch %lld/%lld): loss %.4f, lr %.4g, %.0f img/s, ETA %s\n",
                (long long)r->epoch + 1, (long long)p->epochs, (long long)r->step, (long long)p->total,
                (long long)in_epoch, (long long)p->per_epoch, r->loss, r->lr, r->images_per_s, etas);
        fflush(p->out);
    }
}

void rt_progress_break(rt_progress *p) {
    if (p->drawn) {
        fputc('\n', p->out);
        fflush(p->out);
        p->drawn = false;
    }
}
