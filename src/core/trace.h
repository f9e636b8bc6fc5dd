/* The timeline recorder (log.trace, docs/debugging.md): spans of one process on a few
 * tracks (the main thread, the communication thread, the GPU stream), timestamped in
 * nanoseconds of rt_now_ns() (CLOCK_MONOTONIC), written to one JSON-lines file per rank.
 *
 * Shaped for a hot loop: one buffer of spans is allocated when tracing starts, a span is
 * a fixed-size record appended under a mutex (any thread may record), its name and
 * algorithm are static strings (no copy, no allocation), and with tracing off every call
 * is one load of a global flag. The buffer goes to the file at the points the caller
 * chooses (rt_trace_flush: epoch ends, the run's end, a failure) and, when it fills up
 * between them, at once (counted in the file: "flushes_when_full").
 *
 *   rt_trace_start("RUN_DIR/trace-rank0.jsonl", 1 << 16);   // on, nothing written yet
 *   uint64_t t = rt_trace_now();                  // 0 when tracing is off
 *   ... work ...
 *   rt_trace_end(RT_TRACK_MAIN, "forward", t);    // no-op when t == 0
 *   rt_trace_set_header(rank, world, offset_ns, error_ns, rtt_ns);
 *   rt_trace_flush();                             // the header first, then the spans so far
 *   rt_trace_stop();
 *
 * File format (one JSON object per line; docs/debugging.md):
 *   {"kind": "header", "version": 1, "rank": R, "world_size": N, "clock": "CLOCK_MONOTONIC",
 *    "offset_ns": O, "offset_error_ns": E, "rtt_ns": T, "tracks": ["main", "comm", "stream"],
 *    "host": "...", "pid": P}
 *   {"name": "backward", "track": 0, "t0": ns, "t1": ns, "step": S, "epoch": E
 *    [, "bucket": B, "bytes": N, "algo": "ring", "queued_ns": Q]}
 * t + offset_ns is the time on rank 0's clock, within offset_error_ns. */
#ifndef RT_CORE_TRACE_H
#define RT_CORE_TRACE_H

#include "core/status.h"
#include "core/timer.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_trace_track {
    RT_TRACK_MAIN = 0,   /* the rank's main thread (the training loop) */
    RT_TRACK_COMM = 1,   /* the communication (progress) thread: gradient buckets */
    RT_TRACK_STREAM = 2, /* the GPU stream, from its events */
    RT_TRACK_COUNT_
} rt_trace_track;

/* "main", "comm", "stream" */
const char *rt_trace_track_name(int track);

extern bool rt_trace_on_; /* read through rt_trace_enabled */
static inline bool rt_trace_enabled(void) { return rt_trace_on_; }
/* rt_now_ns() when tracing, 0 when not (the span's start for rt_trace_end). */
static inline uint64_t rt_trace_now(void) { return rt_trace_on_ ? rt_now_ns() : 0; }

/* Tracing on, to the file `path`, with room for `capacity` spans between flushes (one
 * allocation). Nothing is written before the first rt_trace_flush. */
rt_status rt_trace_start(const char *path, size_t capacity);
/* Off, the buffer freed (spans not flushed are lost). */
void rt_trace_stop(void);

/* The step and epoch that later spans recorded without them belong to. */
void rt_trace_set_step(int64_t step, int64_t epoch);

/* The header's fields: this rank, the world size, and this clock's offset to rank 0's
 * (t_rank0 = t + offset_ns) within error_ns (half the best round trip rtt_ns). */
void rt_trace_set_header(int rank, int world_size, int64_t offset_ns, int64_t error_ns, int64_t rtt_ns);

/* A span [t0, t1] on `track` at the current step (rt_trace_set_step). `name` must be a
 * static string. No-op when tracing is off or t0 == 0. */
void rt_trace_span(int track, const char *name, uint64_t t0, uint64_t t1);
static inline void rt_trace_end(int track, const char *name, uint64_t t0) {
    if (t0) rt_trace_span(track, name, t0, rt_now_ns());
}
/* The same with an explicit step and epoch. */
void rt_trace_span_at(int track, const char *name, uint64_t t0, uint64_t t1, int64_t step, int64_t epoch);
/* A collective's span: bucket index (-1: none), bytes, algorithm (static string or NULL),
 * and how long it waited for the operation before it (queued_ns). */
void rt_trace_span_comm(int track, const char *name, uint64_t t0, uint64_t t1, int bucket, int64_t bytes,
                        const char *algo, uint64_t queued_ns);

/* The same with an explicit step and epoch (a span recorded a step late). */
void rt_trace_span_comm_at(int track, const char *name, uint64_t t0, uint64_t t1, int bucket, int64_t bytes,
                           const char *algo, uint64_t queued_ns, int64_t step, int64_t epoch);
/* The current step and epoch (rt_trace_set_step). */
void rt_trace_get_step(int64_t *step, int64_t *epoch);
/* Append the spans recorded since the last flush to the file and empty the buffer; the
 * first flush creates (truncates) the file and writes the header. After it, a buffer
 * that fills up is flushed at once; before it (the header is not known yet) the spans
 * that do not fit are dropped and counted. RT_ERR_IO naming the path. No-op when off. */
rt_status rt_trace_flush(void);

#ifdef __cplusplus
}
#endif

#endif
