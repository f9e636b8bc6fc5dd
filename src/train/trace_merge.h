/* Reading a traced run back (log.trace, docs/debugging.md): every rank's
 * RUN_DIR/trace-rank<R>.jsonl (core/trace.h wrote them) brought onto rank 0's clock,
 * merged into one Chrome trace-event JSON (`ringtrain trace`), and summarised per epoch
 * for `ringtrain report`: the share of the gradient all-reduce time hidden behind
 * backward, and the rank the others waited for most often.
 *
 * Reading is strict: a rank's file missing (the header of the first says how many ranks
 * there are), a line that is not a JSON object or lacks a field is an error naming the
 * file, the line and the field. A truncated last line (a rank killed mid-write) is
 * skipped. */
#ifndef RT_TRAIN_TRACE_MERGE_H
#define RT_TRAIN_TRACE_MERGE_H

#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_trace_rec {
    char name[48];
    char algo[16];  /* "" when not a collective */
    int track;      /* RT_TRACK_* (core/trace.h) */
    int bucket;     /* -1: none */
    int64_t t0, t1; /* ns on rank 0's clock (the file's times + its offset) */
    int64_t step, epoch, bytes, queued_ns;
    bool comm; /* a collective's span (bucket, bytes, algo given) */
} rt_trace_rec;

typedef struct rt_trace_rank {
    char path[1100];
    char host[64];
    int rank;
    int64_t offset_ns, error_ns, rtt_ns;
    rt_trace_rec *s;
    size_t n, cap;
    bool truncated; /* its last line was cut short (skipped) */
} rt_trace_rank;

typedef struct rt_trace_run {
    rt_trace_rank *ranks; /* rank i at index i */
    int world_size;
} rt_trace_run;

/* RT_OK with *found false (and an empty run) when the folder holds no trace-rank*.jsonl;
 * errors name the file (and line). */
rt_status rt_trace_load(const char *run_dir, rt_trace_run *out, bool *found);
void rt_trace_run_free(rt_trace_run *t);

/* The Chrome trace-event JSON (one process per rank, one thread per track, complete "X"
 * events in microseconds from the earliest span, on rank 0's clock) of the spans of steps
 * step_lo..step_hi (inclusive; spans outside steps, such as evaluation, count as the step
 * they follow; step_hi < 0: no upper bound). *events: how many "X" events were written. */
rt_status rt_trace_write_chrome(const rt_trace_run *t, int64_t step_lo, int64_t step_hi, const char *path,
                                int64_t *events);

/* Per epoch that has gradient buckets: the share of the bucket all-reduce time that
 * overlapped backward (per rank, then averaged; not on a GPU, whose bucket spans end when
 * the host hands the wait to the stream), and the rank whose start of a collective
 * (bucket all-reduce or the step's scalars) was last most often. */
typedef struct rt_trace_epoch {
    int64_t epoch;
    double hidden;       /* 0..1, averaged over the ranks */
    double *rank_hidden; /* world_size entries */
    int slowest_rank;    /* -1: no collective seen on every rank */
    int64_t slowest_count, collectives;
    double median_late_ms; /* median over the collectives of (last start - first start) */
    bool gpu;              /* a GPU run: the buckets' device-side completion is not traced, so no share */
} rt_trace_epoch;

rt_status rt_trace_overlap(const rt_trace_run *t, rt_trace_epoch **out, int *n);
void rt_trace_overlap_free(rt_trace_epoch *e, int n);
/* One line per epoch: "trace epoch 1: 63% of all-reduce time hidden behind backward
 * (rank 0 61%, rank 1 65%); slowest rank most often: 1 (9 of 16 collectives, median 0.21
 * ms behind the first)". */
void rt_trace_overlap_print(const rt_trace_epoch *e, int n, int world_size, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
