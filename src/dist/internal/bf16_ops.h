/* The steps of bf16 gradient compression, one table per device kind, so that the
 * device-neutral code (the gradient reducer, reducer.c) never asks where its bf16 copy
 * lives: the casts (rounding point 1 and the widening back) and the bf16 reduction steps,
 * each dist/reduce.c's arithmetic element for element (core/bf16.h's rounding), so that
 * every table gives the same bits on the same inputs.
 *
 * rt_dist_bf16_cpu (bf16_cpu.c) runs on the host now and ignores the stream;
 * rt_dist_bf16_cuda (cuda/bf16_ops_cuda.c, CUDA builds only: the kernels of
 * cuda/bf16_cuda.cu) enqueues on the stream (NULL: the default stream), neither
 * allocating nor synchronising. Pointers are on the table's device; n == 0 does nothing.
 * rt_dist_bf16_ops (transports.c, where dist's tables are picked) picks the table of a
 * buffer's device kind. */
#ifndef RT_DIST_BF16_OPS_H
#define RT_DIST_BF16_OPS_H

#include "core/device.h"
#include "dist/reduce.h"

#include <stddef.h>
#include <stdint.h>

typedef struct rt_dist_bf16_ops {
    const char *name; /* "cpu", "cuda" */
    /* dst[i] = rt_bf16_from_f32(src[i]): nearest, ties to even, NaN stays a quiet NaN */
    rt_status (*pack)(rt_stream *s, const float *src, uint16_t *dst, size_t n);
    /* dst[i] = rt_bf16_to_f32(src[i]) (exact) */
    rt_status (*unpack)(rt_stream *s, const uint16_t *src, float *dst, size_t n);
    /* one reduction step: div 0 is rt_reduce_apply (d = bf16(f32(d) op f32(src))), div > 0
     * rt_reduce_apply_div, AVG's last step (d = bf16((f32(d) + f32(src)) / div)) */
    rt_status (*combine)(rt_stream *s, uint16_t *d, const uint16_t *src, size_t n, rt_reduce_op op, int div);
    /* d = bf16(f32(d) / div), as rt_reduce_div */
    rt_status (*div)(rt_stream *s, uint16_t *d, size_t n, int div);
} rt_dist_bf16_ops;

extern const rt_dist_bf16_ops rt_dist_bf16_cpu;
extern const rt_dist_bf16_ops rt_dist_bf16_cuda; /* defined only with RT_HAVE_CUDA */

/* The table of a device kind; NULL where this build has none (cuda without CUDA). */
const rt_dist_bf16_ops *rt_dist_bf16_ops_of(rt_device_kind kind);

#endif
