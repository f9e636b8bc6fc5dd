/* The device side of bf16 gradient compression (dist/cuda/bf16_cuda.cu): the casts of
 * rt_reducer's compress_bf16 (reached through the CUDA table of bf16_ops.h,
 * cuda/bf16_ops_cuda.c) and the bf16 reduction steps of the nccl transport's own ring,
 * each the host code's arithmetic element for element (core/bf16.h's rounding,
 * dist/reduce.c's bf16 steps), so a GPU run rounds exactly where and how the CPU run does.
 *
 * Every launcher enqueues on the given stream and returns cudaGetLastError(); none
 * allocates or synchronises; n == 0 enqueues nothing. CUDA builds only. */
#ifndef RT_DIST_BF16_CUDA_H
#define RT_DIST_BF16_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = rt_bf16_from_f32(x[i]): round to nearest, ties to even, NaN stays a quiet NaN. */
cudaError_t rt_dist_bf16_pack(cudaStream_t s, const float *x, uint16_t *y, size_t n);
/* y[i] = rt_bf16_to_f32(x[i]) (exact). */
cudaError_t rt_dist_bf16_unpack(cudaStream_t s, const uint16_t *x, float *y, size_t n);
/* One reduction step over bf16, as dist/reduce.c: div 0 is rt_reduce_apply
 * (d = bf16(f32(d) op f32(src)), op an rt_reduce_op), div > 0 rt_reduce_apply_div, AVG's
 * last step (d = bf16((f32(d) + f32(src)) / div)). */
cudaError_t rt_dist_bf16_combine(cudaStream_t s, uint16_t *d, const uint16_t *src, size_t n, int op, int div);
/* d = bf16(f32(d) / div), as rt_reduce_div. */
cudaError_t rt_dist_bf16_div(cudaStream_t s, uint16_t *d, size_t n, int div);

#ifdef __cplusplus
}
#endif

#endif
