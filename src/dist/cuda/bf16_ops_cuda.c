/* bf16 compression's steps on a GPU (internal/bf16_ops.h): the kernels of bf16_cuda.cu,
 * enqueued on the given stream (NULL: the default stream). */
#include "dist/internal/bf16_ops.h"

#include "core/cuda/cuda_check.h"
#include "dist/internal/bf16_cuda.h"

static cudaStream_t native(rt_stream *s) { return (cudaStream_t)rt_stream_native(s); }

static rt_status cuda_pack(rt_stream *s, const float *src, uint16_t *dst, size_t n) {
    RT_CHECK_CUDA(rt_dist_bf16_pack(native(s), src, dst, n));
    return RT_OK;
}

static rt_status cuda_unpack(rt_stream *s, const uint16_t *src, float *dst, size_t n) {
    RT_CHECK_CUDA(rt_dist_bf16_unpack(native(s), src, dst, n));
    return RT_OK;
}

static rt_status cuda_combine(rt_stream *s, uint16_t *d, const uint16_t *src, size_t n, rt_reduce_op op, int div) {
    RT_CHECK_CUDA(rt_dist_bf16_combine(native(s), d, src, n, (int)op, div));
    return RT_OK;
}

static rt_status cuda_div(rt_stream *s, uint16_t *d, size_t n, int div) {
    RT_CHECK_CUDA(rt_dist_bf16_div(native(s), d, n, div));
    return RT_OK;
}

const rt_dist_bf16_ops rt_dist_bf16_cuda = {
    .name = "cuda", .pack = cuda_pack, .unpack = cuda_unpack, .combine = cuda_combine, .div = cuda_div};
