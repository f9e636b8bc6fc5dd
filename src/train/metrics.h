/* Timing logs: the stages of a training step, one JSON line per step in metrics.jsonl,
 * the per-epoch stage table, and the progress display.
 *
 * Stages (milliseconds): data (waiting for the loader), h2d (batch to the device),
 * forward, backward, comm (all-reduce time not hidden behind backward), optim, step (the
 * whole step). Plus comm busy time, images/s, loss, lr and gradient norm. */
#ifndef RT_TRAIN_METRICS_H
#define RT_TRAIN_METRICS_H

#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_stage {
    RT_STAGE_DATA = 0,
    RT_STAGE_H2D,
    RT_STAGE_FORWARD,
    RT_STAGE_BACKWARD,
    RT_STAGE_COMM,
    RT_STAGE_OPTIM,
    RT_STAGE_STEP,
    RT_STAGE_COUNT_
} rt_stage;

/* "data", "h2d", ... */
const char *rt_stage_name(rt_stage s);

typedef struct rt_step_record {
    int64_t step;  /* optimizer steps done, counting this one (1-based) */
    int64_t epoch; /* 0-based */
    int64_t batch; /* batch index within the epoch */
    int rank;
    double ms[RT_STAGE_COUNT_];
    double comm_busy_ms; /* first bucket started to last one done */
    int64_t images;      /* global batch size of this step */
    double images_per_s; /* images / step time */
    double loss;         /* mean over all ranks */
    double lr;
    double grad_norm; /* before clipping; NaN when not computed */
    double time_s;    /* since the run (or the resumed run) started */
    bool skipped;     /* non-finite step skipped (train.skip_nonfinite) */
} rt_step_record;

/* ---- metrics.jsonl --------------------------------------------------------------------- */

typedef struct rt_metrics rt_metrics;

/* Every line is one JSON object written by jansson: strings escaped, numbers valid JSON
 * (JSON has no NaN or infinity: a non-finite value is written as null), the keys in the
 * order they were added, "kind" first. */
struct json_t; /* jansson's value */

/* Open (append: continue an existing file, as a resumed run does). */
rt_status rt_metrics_open(const char *path, bool append, rt_metrics **out);
void rt_metrics_close(rt_metrics *m);
/* {"kind":"step","step":..,"epoch":..,"data_ms":..,...} on one line, flushed. */
rt_status rt_metrics_step(rt_metrics *m, const rt_step_record *r);
/* {"kind":"eval","step":..,"epoch":..,"loss":..,"accuracy":..,"samples":..} */
rt_status rt_metrics_eval(rt_metrics *m, int64_t step, int64_t epoch, double loss, double accuracy, int64_t samples);

/* An evaluation: the test set's and, with data.val_split, the validation set's. */
typedef struct rt_eval_record {
    int64_t step, epoch;
    double loss, accuracy; /* the test set's */
    int64_t samples;
    double val_loss, val_accuracy;
    int64_t val_samples; /* 0: no validation set (the val_* fields are left out) */
} rt_eval_record;

/* rt_metrics_eval's line, with "val_loss", "val_accuracy" and "val_samples" after
 * "samples" when val_samples > 0 */
rt_status rt_metrics_eval_record(rt_metrics *m, const rt_eval_record *e);
/* Any other line: {"kind": KIND, then the members of `fields` in their order}. `fields`
 * is a JSON object, e.g. json_pack("{s:I, s:s}", "step", (json_int_t)7, "why", why), or
 * json_object() for none; the call takes its reference (as json_pack's "o" does), and a
 * NULL (a json_pack that failed) is an error naming the kind. */
rt_status rt_metrics_line(rt_metrics *m, const char *kind, struct json_t *fields);
/* A JSON number, or null when `v` is NaN or infinite (a new reference, for json_pack's "o"). */
struct json_t *rt_metrics_num(double v);
/* A JSON string of `s` (a path: any bytes), its bytes that are not UTF-8 as '?' (JSON
 * strings are Unicode; json_pack's "s" fails on them); a new reference, for "o". */
struct json_t *rt_metrics_str(const char *s);

/* ---- per-epoch stage table ------------------------------------------------------------- */

typedef struct rt_stage_stats rt_stage_stats;

rt_status rt_stage_stats_create(rt_stage_stats **out);
void rt_stage_stats_destroy(rt_stage_stats *s);
void rt_stage_stats_reset(rt_stage_stats *s);
rt_status rt_stage_stats_add(rt_stage_stats *s, const rt_step_record *r);
int64_t rt_stage_stats_count(const rt_stage_stats *s);
/* Mean, median and 95th percentile (nearest rank) in ms, total in s, of one stage. */
void rt_stage_stats_get(const rt_stage_stats *s, rt_stage stage, double *mean, double *p50, double *p95,
                        double *total_s);
/* The table: stage | mean ms | p50 | p95 | total s | % of step (and comm busy). */
void rt_stage_stats_print(const rt_stage_stats *s, FILE *out, const char *title);

/* ---- progress ---------------------------------------------------------------------------- */

typedef struct rt_progress {
    FILE *out;
    bool tty;          /* a bar redrawn in place; else a plain line every `every` steps */
    int64_t every;     /* plain lines: every N steps */
    int64_t epochs;    /* total epochs */
    int64_t per_epoch; /* steps per epoch */
    int64_t total;     /* steps of the whole run (epochs * per_epoch, or max_steps) */
    uint64_t start_ns;
    int64_t start_step; /* step count when the display started (resumed runs) */
    bool drawn;         /* a bar is on the current line */
} rt_progress;

void rt_progress_init(rt_progress *p, FILE *out, bool tty, int64_t every, int64_t epochs, int64_t per_epoch,
                      int64_t total, int64_t start_step);
void rt_progress_step(rt_progress *p, const rt_step_record *r);
/* End the bar's line (before other output, and at the end of an epoch). */
void rt_progress_break(rt_progress *p);

#ifdef __cplusplus
}
#endif

#endif
