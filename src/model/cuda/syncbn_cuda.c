/* Synchronised batch norm, the CUDA backend's entries (syncbn_cuda.h): each enqueues its
 * kernel on the model's stream; layers.c all-reduces the sums between them. The ReLU's
 * mask and the residual add are fused into the passes as in the CPU backend. Activations
 * in the context's format (ctx->act), the statistics fp32 (sums in double) in every one.
 * The sums take the layer's batch-norm scratch (rt_cuda_bn_scratch): the layer must be
 * prepared (rt_batchnorm2d_prepare), as its evaluation forward needs anyway. */
#include "model/cuda/syncbn_cuda.h"

static cudaStream_t sb_stream(rt_model_ctx *ctx) { return cuda_state(ctx)->stream; }
static const float *fdata(const rt_tensor *t) { return (const float *)rt_tensor_data(t); }

rt_status rt_cuda_batchnorm2d_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums) {
    double *partial;
    int *tickets;
    RT_CHECK(rt_cuda_bn_scratch(ctx, l, n, &partial, &tickets));
    RT_CHECK_CUDA(rt_cuk_syncbn_stats(sb_stream(ctx), ctx->act, n, l->c, l->h * l->w, x, partial, tickets, sums));
    return RT_OK;
}

rt_status rt_cuda_batchnorm2d_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                           const rt_act *residual, rt_act *y, bool relu, const double *sums) {
    RT_CHECK(rt_cuda_bind(ctx));
    cudaStream_t s = sb_stream(ctx);
    RT_CHECK_CUDA(rt_cuk_syncbn_finish(s, l->c, l->eps, l->momentum, sums, l->save_mean, l->save_invstd,
                                       rt_tensor_data(&l->running_mean), rt_tensor_data(&l->running_var),
                                       (int64_t *)rt_tensor_data(&l->num_batches_tracked)));
    RT_CHECK_CUDA(rt_cuk_syncbn_apply(s, ctx->act, n, l->c, l->h * l->w, x, residual, l->save_mean, l->save_invstd,
                                      fdata(&l->weight), fdata(&l->bias), y, relu));
    return RT_OK;
}

rt_status rt_cuda_batchnorm2d_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                         const rt_act *act, const rt_act *dy, double *sums) {
    double *partial;
    int *tickets;
    RT_CHECK(rt_cuda_bn_scratch(ctx, l, n, &partial, &tickets));
    RT_CHECK_CUDA(rt_cuk_syncbn_dsums(sb_stream(ctx), ctx->act, n, l->c, l->h * l->w, x, act, dy, l->save_mean,
                                      l->save_invstd, partial, tickets, sums, rt_tensor_data(&l->dweight),
                                      rt_tensor_data(&l->dbias)));
    return RT_OK;
}

rt_status rt_cuda_batchnorm2d_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                      const rt_act *dy, rt_act *dx, bool accumulate, const double *sums) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_syncbn_dx(sb_stream(ctx), ctx->act, n, l->c, l->h * l->w, x, act, dy, l->save_mean,
                                   l->save_invstd, fdata(&l->weight), sums, dx, accumulate));
    return RT_OK;
}
