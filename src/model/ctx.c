/* Model context: picks the backend of the device and owns the shared workspace. */
#include "model/ctx.h"

#include "model/internal/backend.h"

#include <stdlib.h>

rt_status rt_model_ctx_create(const rt_model_ctx_options *opts, rt_model_ctx **out) {
    *out = NULL;
    const rt_model_backend *ops = NULL;
    if (opts->device.kind == RT_DEVICE_CPU) {
        ops = &rt_model_backend_cpu;
    } else {
#ifdef RT_HAVE_CUDA
        ops = &rt_model_backend_cuda;
#else
        RT_FAIL(RT_ERR_UNSUPPORTED, "model on cuda:%d: this ringtrain was built without CUDA", opts->device.index);
#endif
    }
    RT_REQUIRE(opts->threads >= 0 && opts->threads <= 1024, RT_ERR_INVALID, "threads = %d (expected 0..1024)",
               opts->threads);
    RT_REQUIRE(opts->precision == RT_PRECISION_FP32 || opts->precision == RT_PRECISION_TF32, RT_ERR_INVALID,
               "precision %d (expected fp32 or tf32)", (int)opts->precision);
    rt_model_ctx *ctx = calloc(1, sizeof *ctx);
    RT_CHECK_ALLOC(ctx, sizeof *ctx);
    ctx->device = opts->device;
    ctx->threads = opts->threads > 0 ? opts->threads : 1;
    ctx->precision = opts->precision;
    ctx->ops = ops;
    rt_status st;
    RT_CHECK_GOTO(rt_device_set_current(ctx->device), st, fail);
    RT_CHECK_GOTO(rt_stream_create(ctx->device, &ctx->stream), st, fail);
    if (ops->ctx_init) RT_CHECK_GOTO(ops->ctx_init(ctx), st, fail);
    *out = ctx;
    return RT_OK;
fail:
    rt_model_ctx_destroy(ctx);
    return st;
}

void rt_model_ctx_destroy(rt_model_ctx *ctx) {
    if (!ctx) return;
    if (ctx->stream) (void)rt_stream_sync(ctx->stream);
    if (ctx->ops && ctx->ops->ctx_release && ctx->backend) ctx->ops->ctx_release(ctx);
    rt_free(ctx->device, ctx->work);
    if (ctx->stream) rt_stream_destroy(ctx->stream);
    free(ctx);
}

rt_status rt_model_ctx_reserve(rt_model_ctx *ctx, size_t nbytes) {
    if (nbytes <= ctx->work_bytes) return RT_OK;
    RT_CHECK(rt_model_ctx_sync(ctx));
    rt_free(ctx->device, ctx->work);
    ctx->work = NULL;
    ctx->work_bytes = 0;
    RT_CHECK(rt_malloc(ctx->device, nbytes, &ctx->work));
    ctx->work_bytes = nbytes;
    return RT_OK;
}

rt_status rt_model_ctx_sync(rt_model_ctx *ctx) { return ctx->stream ? rt_stream_sync(ctx->stream) : RT_OK; }
