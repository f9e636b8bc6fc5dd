/* The gradient reducer: averages a flat gradient buffer over a process group in
 * buckets, each all-reduced as soon as backward has written it, so communication
 * overlaps the rest of backward (DDP's Reducer, on one flat arena).
 *
 * The buffer is cut into segments by the caller (for a model: its blocks, whose
 * gradients complete from the end of the arena toward its start). Buckets are runs of
 * whole segments taken from the end: the first bucket reaches at least
 * first_bucket_bytes (small, so the first all-reduce starts early, as DDP's 1 MiB
 * first bucket), every later one at least bucket_bytes. bucket_bytes 0 means one bucket,
 * all-reduced after backward (no overlap). Every rank builds the same buckets from the
 * same segments, so the collectives match.
 *
 *   rt_reducer_create(pg, grads, bounds, nseg, &opts, &r);
 *   each step: rt_reducer_begin(r);
 *              backward calls rt_reducer_ready(r, begin, end) per finished segment;
 *              rt_reducer_finish(r);    // starts what is left, waits for every bucket
 *
 * On the CPU the all-reduces run on the group's progress thread while backward goes on.
 * On a GPU, give the reducer the stream backward runs on (o.stream): each bucket's
 * all-reduce is then ordered after the work already enqueued there when
 * rt_reducer_ready is called (backward calls it when it has enqueued a segment, not when
 * the GPU has run it), and rt_reducer_finish makes that stream wait for every bucket on
 * the device instead of blocking the host (docs/dist.md, "Streams").
 * Each bucket's all-reduce is tagged "bucket i of n" (i = 1 the first started) in the
 * group's flight recorder and in hang/desync diagnoses (rt_pg_set_op_tag).
 * dist knows nothing about models: segments are byte ranges. With tracing on
 * (core/trace.h, log.trace) each bucket's all-reduce is a span of the comm track, ended
 * by the group's flight recorder entry (docs/debugging.md). */
#ifndef RT_DIST_REDUCER_H
#define RT_DIST_REDUCER_H

#include "dist/dist.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_reducer rt_reducer;

typedef struct rt_reducer_options {
    size_t bucket_bytes;       /* 0: one bucket after backward */
    size_t first_bucket_bytes; /* the first bucket's target (0: bucket_bytes) */
    rt_dtype dtype;            /* of the buffer (RT_F32) */
    rt_reduce_op op;           /* RT_OP_AVG (gradient averaging) */
    /* the producer's stream: the one backward writes the gradients on (NULL: none, the
     * gradients are final on the host when reported, as on the CPU) */
    rt_stream *stream;
    /* Gradient compression (DDP's bf16_compress_hook): each bucket's f32 values are
     * rounded to bf16 (nearest, ties to even) into a staging buffer, all-reduced as bf16
     * (every reduction step combines in fp32 and rounds to bf16, dist/reduce.c; the
     * all-gather copies), then widened back into the f32 buffer: half the bytes on the
     * wire, every rank the same bits. dtype f32 only. With a stream (a GPU: the group's
     * buffers on it) the rounding and the widening are kernels on that stream, the bf16
     * copy is device memory, and the bits are those the host path gives the same
     * gradients (docs/dist.md, "Compression"). */
    bool compress_bf16;
} rt_reducer_options;

/* dist.compress's names (core/names.h): "none" | "bf16", indexed by compress_bf16. */
extern const rt_names rt_compress_names;

/* 25 MiB buckets, a 1 MiB first bucket, f32, AVG: DDP's defaults. */
void rt_reducer_options_default(rt_reducer_options *o);

/* `bounds` has nseg + 1 ascending byte offsets into `buf` (bounds[0] = 0, bounds[nseg] =
 * the buffer's size), each a multiple of the dtype's size. The reducer keeps `buf`. */
rt_status rt_reducer_create(rt_pg *pg, void *buf, const size_t *bounds, int nseg, const rt_reducer_options *o,
                            rt_reducer **out);
void rt_reducer_destroy(rt_reducer *r);

int rt_reducer_bucket_count(const rt_reducer *r);
/* Bucket i covers bytes [*begin, *end) of the buffer (bucket 0 is at the end). */
void rt_reducer_bucket_range(const rt_reducer *r, int i, size_t *begin, size_t *end);

/* Start a step: every bucket waits for its bytes again. */
rt_status rt_reducer_begin(rt_reducer *r);
/* Bytes [begin, end) of the buffer are final for this step; a bucket whose bytes are
 * all ready is all-reduced now (buckets start in order: 0, 1, ...). A byte reported twice
 * in a step is an error. Fits rt_grad_ready_fn through a small adapter. */
rt_status rt_reducer_ready(rt_reducer *r, size_t begin, size_t end);
/* Start every bucket not started yet (all of them with bucket_bytes 0), wait for all,
 * and end the step. Every byte must have been reported unless bucket_bytes is 0. With
 * o.stream on a GPU the wait is the stream's (device-side): work enqueued there after
 * this call sees the averaged gradients; the host does not wait for the GPU (staging
 * over tcp/shm still waits for the host ring). */
rt_status rt_reducer_finish(rt_reducer *r);

/* The last finished step, in nanoseconds of rt_now_ns(). */
typedef struct rt_reducer_stats {
    uint64_t begin_ns;         /* rt_reducer_begin */
    uint64_t first_start_ns;   /* the first bucket's all-reduce was started */
    uint64_t finish_call_ns;   /* rt_reducer_finish was called (backward had ended) */
    uint64_t end_ns;           /* every bucket done */
    double exposed_ms;         /* time rt_reducer_finish waited on the host (with a device stream the
                                * device waits instead: time it with events on the stream) */
    double busy_ms;            /* first start to last completion: the span communication took */
    int buckets_before_finish; /* buckets started while backward was still running */
    size_t bytes;              /* bytes all-reduced (the buffer's, half with compress_bf16); the
                                * ring moves 2 (n - 1) / n of them in and out of each rank */
} rt_reducer_stats;
void rt_reducer_stats_get(const rt_reducer *r, rt_reducer_stats *out);

/* Tests only (a desync on purpose, docs/dist.md "Hangs and desyncs"): in the next step,
 * bucket `bucket` is not all-reduced at all (RT_REDUCER_FAULT_SKIP) or is all-reduced
 * with one element fewer (RT_REDUCER_FAULT_SHORT). */
enum { RT_REDUCER_FAULT_NONE = 0, RT_REDUCER_FAULT_SKIP, RT_REDUCER_FAULT_SHORT };
void rt_reducer_test_fault(rt_reducer *r, int bucket, int fault);

/* Tracing: record the bucket spans still held back (a device stream's, recorded a step
 * late); call before the trace is flushed at an epoch's or the run's end. */
void rt_reducer_trace_flush(rt_reducer *r);

#ifdef __cplusplus
}
#endif

#endif
