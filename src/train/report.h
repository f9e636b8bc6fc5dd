/* Reading a run's timing logs back: metrics.jsonl (and metrics-rank<R>.jsonl with
 * log.all_ranks), the run's summary, and the gnuplot script and data files of its plots
 * (`ringtrain report`, docs/report.md).
 *
 * Reading is strict where a file is damaged and lenient where a run was interrupted:
 * - a line that is not a JSON object, has no "kind", or has a field of the wrong type is
 *   an error naming the file, the line and the field;
 * - a truncated last line (a run killed mid-write) is skipped with a warning, and so is a
 *   truncated record that a resumed run's first record was appended to on the same line;
 * - a resumed run appends a new "start" line and its steps continue the numbering; if a
 *   resumed run repeats steps (it restarted from an earlier checkpoint), the later
 *   records replace the earlier ones from that step on, with a warning;
 * - lines of other kinds, and unknown fields, are ignored.
 * Warnings are collected in the rt_run_log (the caller prints them). */
#ifndef RT_TRAIN_REPORT_H
#define RT_TRAIN_REPORT_H

#include "core/status.h"
#include "train/metrics.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One "step" line. `rec.time_s` is as written (since its run segment started); `run_s`
 * is seconds since the first segment started, across resumes. */
typedef struct rt_report_step {
    rt_step_record rec;
    double run_s;
    int segment; /* 0 = before the first resume, 1 = after it, ... */
} rt_report_step;

typedef struct rt_report_eval {
    int64_t step, epoch, samples;
    double loss, accuracy; /* accuracy as a fraction (0..1); NaN when written as null */
} rt_report_eval;

/* A run segment: from one "start" line (or the beginning of a file without one) to the
 * next. */
typedef struct rt_report_segment {
    int world_size; /* 0: not recorded */
    int64_t steps_per_epoch, total_steps, global_batch;
    char device[32];
    bool has_end;      /* an "end" line closed it */
    double end_wall_s; /* the "end" line's wall_s (NaN without one) */
    double end_accuracy, end_loss;
    double last_time_s; /* the largest time_s of its steps */
} rt_report_segment;

/* One metrics file. */
typedef struct rt_run_log {
    char path[1024];
    int rank;              /* -1 for metrics.jsonl, R for metrics-rank<R>.jsonl */
    rt_report_step *steps; /* in step order, each step once */
    int64_t n_steps;
    rt_report_eval *evals;
    int64_t n_evals;
    rt_report_segment *segments;
    int n_segments;
    /* seconds from the first segment's start to the last step (or "end" line), summed
     * over the segments as run_s is; NaN when no time was recorded */
    double wall_s;
    char **warnings;
    int n_warnings;
} rt_run_log;

/* Read one metrics file. On error *out is NULL and the message names path:line. */
rt_status rt_run_log_read(const char *path, int rank, rt_run_log **out);
void rt_run_log_free(rt_run_log *log);

/* A run directory: metrics.jsonl and any metrics-rank<R>.jsonl (sorted by rank). */
typedef struct rt_report {
    char run_dir[1024];
    rt_run_log *main;
    rt_run_log **ranks;
    int n_ranks;
} rt_report;

rt_status rt_report_load(const char *run_dir, rt_report **out);
void rt_report_free(rt_report *r);

/* Per-rank step times (from metrics-rank<R>.jsonl). */
typedef struct rt_report_rank {
    int rank;
    int64_t steps;
    double step_mean_ms, step_p50_ms, step_p95_ms;
    double data_mean_ms, comm_mean_ms;
} rt_report_rank;

typedef struct rt_report_summary {
    bool has_eval;
    int64_t eval_step, eval_epoch;
    double test_accuracy; /* of the last evaluation, a fraction; NaN without one */
    double test_loss;
    double wall_s;                  /* summed over segments: each one's end wall_s, else its last time_s */
    int64_t steps;                  /* the last step number */
    int64_t step_records;           /* step lines kept (== steps when none is missing) */
    int world_size;                 /* of the last segment */
    int first_world_size;           /* of the first segment */
    int segments;                   /* 1 + number of resumes */
    bool finished;                  /* the last segment has an "end" line */
    double final_train_loss;        /* loss of the last step */
    double images_per_s_mean;       /* mean of images_per_s over the steps */
    double images_per_s_last_epoch; /* the same over the steps of the last epoch */
    int64_t last_epoch;             /* 0-based */
    int64_t last_epoch_steps;
    rt_stage_stats *stages; /* every step with a finite step_ms */
    rt_report_rank *ranks;  /* one per rank file */
    int n_ranks;
} rt_report_summary;

rt_status rt_report_summarize(const rt_report *r, rt_report_summary *out);
void rt_report_summary_free(rt_report_summary *s);
/* The summary as text: accuracy, loss, wall time, steps, world size, images/s, the stage
 * table (rt_stage_stats_print) and the per-rank table. */
void rt_report_print(const rt_report *r, const rt_report_summary *s, FILE *out);

/* Write the plots' data files (*.dat) and the gnuplot script (plots.gp) into out_dir
 * (which must exist). `pngs` receives the names of the PNG files the script draws,
 * relative to out_dir (at most RT_REPORT_MAX_PLOTS). The script uses relative names
 * only, so gnuplot must run with out_dir as its working directory. */
enum { RT_REPORT_MAX_PLOTS = 8 };
rt_status rt_report_write_plots(const rt_report *r, const char *out_dir, const char *pngs[RT_REPORT_MAX_PLOTS],
                                int *n_pngs);

/* Run `gnuplot plots.gp` in out_dir (fork + exec, no shell), its output going to
 * out_dir/gnuplot.log. RT_ERR_UNSUPPORTED when `gnuplot` is not on PATH (Debian:
 * gnuplot-nox); RT_ERR_SYS when it fails (the message ends with its log's last lines). */
rt_status rt_report_run_gnuplot(const char *out_dir);

#ifdef __cplusplus
}
#endif

#endif
