/* Synchronised batch norm on the CUDA backend (model.sync_bn; internal/backend.h, the
 * batchnorm2d_sync_* entries): the launchers of syncbn_cuda.cu and the table's entries
 * (syncbn_cuda.c). Kept apart from backend_cuda.c's cuDNN batch norm and its fused
 * kernels: these passes split at the sums that layers.c all-reduces between them. */
#ifndef RT_MODEL_CUDA_SYNCBN_H
#define RT_MODEL_CUDA_SYNCBN_H

#include "model/cuda/cuda_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x, dy, act, y, dx (n, c, plane) activations in format f (NCHW or NHWC, fp32 or bf16:
 * read in their dtype, y and dx rounded once when stored); sums (2c + 1) doubles; act
 * NULL: no ReLU mask. partial, tickets: the layer's batch-norm scratch (rt_cuda_bn_scratch:
 * 2 * c * rt_cuk_bn_splits(n, c, plane, true) doubles, c ints at 0), used in NHWC only
 * (NULL allowed in NCHW) */
cudaError_t rt_cuk_syncbn_stats(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                double *partial, int *tickets, double *sums);
/* the statistics from every rank's sums: save_mean, save_invstd, the running statistics
 * (momentum, unbiased variance) and num_batches_tracked + 1 */
cudaError_t rt_cuk_syncbn_finish(cudaStream_t s, int c, float eps, float momentum, const double *sums, float *save_mean,
                                 float *save_invstd, float *running_mean, float *running_var, int64_t *tracked);
/* y = relu?(x * a + b + residual?), a = gamma invstd, b = beta - mean a */
cudaError_t rt_cuk_syncbn_apply(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                const void *residual, const float *mean, const float *invstd, const float *gamma,
                                const float *beta, void *y, bool relu);
/* this rank's sum g, sum g (x - mean), count; dweight, dbias */
cudaError_t rt_cuk_syncbn_dsums(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                const void *act, const void *dy, const float *mean, const float *invstd,
                                double *partial, int *tickets, double *sums, float *dweight, float *dbias);
cudaError_t rt_cuk_syncbn_dx(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x, const void *act,
                             const void *dy, const float *mean, const float *invstd, const float *gamma,
                             const double *sums, void *dx, bool accumulate);

rt_status rt_cuda_batchnorm2d_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums);
rt_status rt_cuda_batchnorm2d_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                           const rt_act *residual, rt_act *y, bool relu, const double *sums);
rt_status rt_cuda_batchnorm2d_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                         const rt_act *dy, double *sums);
rt_status rt_cuda_batchnorm2d_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                      const rt_act *dy, rt_act *dx, bool accumulate, const double *sums);

#ifdef __cplusplus
}
#endif

#endif
