/* Model context: picks the backend of the device and owns the shared workspace. */
#include "model/ctx.h"

#include "model/internal/backend.h"

#include <stdlib.h>
#include <string.h>

static const char *const k_precision_names[RT_PRECISION_COUNT_] = {
    [RT_PRECISION_FP32] = "fp32", [RT_PRECISION_TF32] = "tf32", [RT_PRECISION_BF16] = "bf16"};

const rt_names rt_precision_names = {"precision", RT_PRECISION_COUNT_, k_precision_names, NULL, NULL};

rt_status rt_precision_parse(const char *text, rt_precision *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_precision_names, text, &i);
    if (st != RT_OK) return st; /* the message is complete: no trace line */
    *out = (rt_precision)i;
    return RT_OK;
}

const char *rt_precision_name(rt_precision p) { return (unsigned)p < RT_PRECISION_COUNT_ ? k_precision_names[p] : "?"; }

/* The backend of each device kind; NULL where this build has none. */
static const rt_model_backend *const k_backends[] = {
    [RT_DEVICE_CPU] = &rt_model_backend_cpu,
#ifdef RT_HAVE_CUDA
    [RT_DEVICE_CUDA] = &rt_model_backend_cuda,
#endif
};

/* the activation format of a new context: opts->act_format (checked against the backend), or
 * the backend's for the precision, or fp32 NCHW */
static rt_status act_format_of(const rt_model_ctx_options *opts, const rt_model_backend *ops, rt_act_format *out) {
    *out = (rt_act_format){RT_F32, RT_ACT_NCHW, 1};
    const rt_act_format *f = opts->act_format;
    if (!f) {
        if (ops->act_format) ops->act_format(opts->precision, out);
        return RT_OK;
    }
    RT_REQUIRE(f->layout != RT_ACT_NCHW_WIDE || f->dtype == RT_BF16, RT_ERR_INVALID,
               "activation format: the widened NCHW layout holds bf16 values in floats (the CPU's bf16 oracle), "
               "not dtype %d",
               (int)f->dtype);
    const bool nchw_f32 = f->dtype == RT_F32 && f->layout == RT_ACT_NCHW && f->input_channel_align == 1;
    RT_REQUIRE(nchw_f32 || (ops->act_supported && ops->act_supported(f)), RT_ERR_UNSUPPORTED,
               "activation format %s %s (input channels padded to %d): not one the %s model backend has",
               f->dtype == RT_BF16  ? "bf16"
               : f->dtype == RT_F32 ? "fp32"
                                    : "?",
               f->layout == RT_ACT_NHWC        ? "NHWC"
               : f->layout == RT_ACT_NCHW_WIDE ? "NCHW held in fp32"
                                               : "NCHW",
               f->input_channel_align, ops->name);
    RT_REQUIRE(f->input_channel_align >= 1 && f->input_channel_align <= 64, RT_ERR_INVALID,
               "activation format: input channel alignment %d (expected 1..64)", f->input_channel_align);
    *out = *f;
    return RT_OK;
}

rt_status rt_model_ctx_create(const rt_model_ctx_options *opts, rt_model_ctx **out) {
    *out = NULL;
    const size_t nkinds = sizeof k_backends / sizeof k_backends[0];
    const rt_model_backend *ops = (unsigned)opts->device.kind < nkinds ? k_backends[opts->device.kind] : NULL;
    if (!ops) {
        char dev[32];
        rt_device_str(opts->device, dev, sizeof dev);
        RT_FAIL(RT_ERR_UNSUPPORTED,
                "model on %s: no backend for that device in this build (CUDA needs RINGTRAIN_CUDA=ON)", dev);
    }
    RT_REQUIRE(opts->threads >= 0 && opts->threads <= 1024, RT_ERR_INVALID, "threads = %d (expected 0..1024)",
               opts->threads);
    char names[64];
    RT_REQUIRE((unsigned)opts->precision < RT_PRECISION_COUNT_, RT_ERR_INVALID, "precision %d (expected %s)",
               (int)opts->precision, rt_names_list(&rt_precision_names, names, sizeof names));
    rt_act_format act; /* checked before anything is allocated */
    RT_CHECK(act_format_of(opts, ops, &act));
    rt_model_ctx *ctx = calloc(1, sizeof *ctx);
    RT_CHECK_ALLOC(ctx, sizeof *ctx);
    ctx->device = opts->device;
    ctx->threads = opts->threads > 0 ? opts->threads : 1;
    ctx->precision = opts->precision;
    ctx->deterministic = opts->deterministic;
    ctx->benchmark = opts->benchmark;
    ctx->ops = ops;
    ctx->act = act;
    rt_status st;
    ctx->conv_preset = calloc(1, sizeof *ctx->conv_preset);
    ctx->conv_chosen = calloc(1, sizeof *ctx->conv_chosen);
    if (!ctx->conv_preset || !ctx->conv_chosen) {
        st = RT_ERROR(RT_ERR_NOMEM, "model context: %zu bytes for the convolution algorithms",
                      2 * sizeof *ctx->conv_preset);
        goto fail;
    }
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
    rt_free(ctx->device, ctx->bn_sync_buf);
    if (ctx->stream) rt_stream_destroy(ctx->stream);
    free(ctx->conv_preset);
    free(ctx->conv_chosen);
    free(ctx);
}

rt_status rt_model_ctx_set_conv_algos(rt_model_ctx *ctx, const rt_conv_algos *algos) {
    RT_REQUIRE(algos->n >= 0 && algos->n <= RT_CONV_ALGOS_MAX, RT_ERR_INVALID,
               "convolution algorithms: %d shapes (expected 0..%d)", algos->n, RT_CONV_ALGOS_MAX);
    ctx->conv_preset->n = algos->n;
    for (int i = 0; i < algos->n; i++) ctx->conv_preset->a[i] = algos->a[i];
    return RT_OK;
}

void rt_model_ctx_get_conv_algos(const rt_model_ctx *ctx, rt_conv_algos *out) {
    out->n = ctx->conv_chosen->n;
    for (int i = 0; i < out->n; i++) out->a[i] = ctx->conv_chosen->a[i];
}

void rt_model_ctx_parallel(void *vctx, int ntasks, void (*fn)(void *arg, int task), void *arg) {
    rt_model_ctx *ctx = vctx;
    if (ctx && ctx->ops->host_parallel) {
        ctx->ops->host_parallel(ctx, ntasks, fn, arg);
        return;
    }
    for (int t = 0; t < ntasks; t++) fn(arg, t);
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

rt_status rt_model_ctx_set_bn_sync(rt_model_ctx *ctx, const rt_bn_sync *sync, int max_channels) {
    if (!sync || !sync->all_reduce) {
        ctx->bn_sync = (rt_bn_sync){0};
        return RT_OK;
    }
    RT_REQUIRE(ctx->ops->batchnorm2d_sync_stats && ctx->ops->batchnorm2d_sync_forward &&
                   ctx->ops->batchnorm2d_sync_dsums && ctx->ops->batchnorm2d_sync_dx,
               RT_ERR_UNSUPPORTED, "model.sync_bn: the %s model backend has no synchronised batch norm",
               ctx->ops->name);
    RT_REQUIRE(max_channels > 0, RT_ERR_INVALID, "synchronised batch norm for %d channels (expected > 0)",
               max_channels);
    if (max_channels > ctx->bn_sync_channels) {
        RT_CHECK(rt_model_ctx_sync(ctx));
        rt_free(ctx->device, ctx->bn_sync_buf);
        ctx->bn_sync_buf = NULL;
        ctx->bn_sync_channels = 0;
        RT_CHECK(rt_malloc(ctx->device, sizeof(double) * (2 * (size_t)max_channels + 1), (void **)&ctx->bn_sync_buf));
        ctx->bn_sync_channels = max_channels;
    }
    ctx->bn_sync = *sync;
    return RT_OK;
}

rt_status rt_model_ctx_sync(rt_model_ctx *ctx) { return ctx->stream ? rt_stream_sync(ctx->stream) : RT_OK; }

rt_status rt_model_ctx_memory(rt_model_ctx *ctx, size_t *used, size_t *backend) {
    *used = *backend = 0;
    RT_REQUIRE(ctx != NULL, RT_ERR_INVALID, "rt_model_ctx_memory: NULL context");
    if (ctx->ops->memory) RT_CHECK(ctx->ops->memory(ctx, used, backend)); /* NULL: no device memory */
    return RT_OK;
}

void rt_model_ctx_set_profile(rt_model_ctx *ctx, struct rt_layer_profile *p) { ctx->profile = p; }

/* ---- activations ------------------------------------------------------------------- */

size_t rt_act_elem_size(const rt_model_ctx *ctx) { return rt_act_format_elem_size(&ctx->act); }

int rt_act_input_channels(const rt_model_ctx *ctx, int c) {
    const int a = ctx->act.input_channel_align > 1 ? ctx->act.input_channel_align : 1;
    return (c + a - 1) / a * a;
}

bool rt_act_is_nchw_f32(const rt_model_ctx *ctx) { return ctx->act.dtype == RT_F32 && ctx->act.layout == RT_ACT_NCHW; }

static rt_status act_args(const rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const void *a,
                          const void *b) {
    RT_REQUIRE(n > 0 && c > 0 && h > 0 && w > 0 && stored_c >= c && a && b, RT_ERR_INVALID,
               "activation conversion of %dx%dx%dx%d stored with %d channels (or a NULL buffer)", n, c, h, w, stored_c);
    RT_REQUIRE(ctx->ops->act_from_nchw && ctx->ops->act_to_nchw, RT_ERR_UNSUPPORTED,
               "the %s model backend has no activation conversion", ctx->ops->name);
    return RT_OK;
}

rt_status rt_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src, rt_act *dst) {
    RT_CHECK(act_args(ctx, n, c, h, w, stored_c, src, dst));
    return ctx->ops->act_from_nchw(ctx, n, c, h, w, stored_c, src, dst);
}

rt_status rt_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src, float *dst) {
    RT_CHECK(act_args(ctx, n, c, h, w, stored_c, src, dst));
    return ctx->ops->act_to_nchw(ctx, n, c, h, w, stored_c, src, dst);
}

rt_status rt_act_upload(rt_model_ctx *ctx, int n, int c, int h, int w, const float *host, rt_act *dst) {
    const size_t bytes = sizeof(float) * (size_t)n * c * h * w;
    float *tmp = NULL;
    RT_CHECK(rt_malloc(ctx->device, bytes, (void **)&tmp));
    rt_status st = rt_memcpy(tmp, ctx->device, host, rt_device_cpu(), bytes, ctx->stream);
    if (st == RT_OK) st = rt_act_from_nchw(ctx, n, c, h, w, c, tmp, dst);
    if (st == RT_OK) st = rt_model_ctx_sync(ctx);
    rt_free(ctx->device, tmp);
    return st;
}

rt_status rt_act_download(rt_model_ctx *ctx, int n, int c, int h, int w, const rt_act *src, float *host) {
    const size_t bytes = sizeof(float) * (size_t)n * c * h * w;
    float *tmp = NULL;
    RT_CHECK(rt_malloc(ctx->device, bytes, (void **)&tmp));
    rt_status st = rt_act_to_nchw(ctx, n, c, h, w, c, src, tmp);
    if (st == RT_OK) st = rt_memcpy(host, rt_device_cpu(), tmp, ctx->device, bytes, ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(ctx);
    rt_free(ctx->device, tmp);
    return st;
}
