/* bf16 compression's steps on the host (internal/bf16_ops.h): core/bf16.h's casts and
 * dist/reduce.c's bf16 steps, run now; the stream is not used. */
#include "dist/internal/bf16_ops.h"

#include "core/bf16.h"

static rt_status cpu_pack(rt_stream *s, const float *src, uint16_t *dst, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) dst[i] = rt_bf16_from_f32(src[i]);
    return RT_OK;
}

static rt_status cpu_unpack(rt_stream *s, const uint16_t *src, float *dst, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) dst[i] = rt_bf16_to_f32(src[i]);
    return RT_OK;
}

static rt_status cpu_combine(rt_stream *s, uint16_t *d, const uint16_t *src, size_t n, rt_reduce_op op, int div) {
    (void)s;
    if (div > 0)
        rt_reduce_apply_div(d, src, n, RT_BF16, div);
    else
        rt_reduce_apply(d, src, n, RT_BF16, op);
    return RT_OK;
}

static rt_status cpu_div(rt_stream *s, uint16_t *d, size_t n, int div) {
    (void)s;
    rt_reduce_div(d, n, RT_BF16, div);
    return RT_OK;
}

const rt_dist_bf16_ops rt_dist_bf16_cpu = {
    .name = "cpu", .pack = cpu_pack, .unpack = cpu_unpack, .combine = cpu_combine, .div = cpu_div};
