/* The CPU backend: context set-up (thread pool, OpenBLAS threads) and the table. */
#include "model/cpu/cpu_internal.h"

#include "core/log.h"
#include "core/settings.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef RT_HAVE_OPENBLAS
#include <cblas.h>
#endif

#ifdef RT_HAVE_OPENBLAS
/* OpenBLAS 0.3.21 runs its AVX2 (Haswell/Zen) kernels on AVX-512 CPUs it does not know
 * (e.g. AMD Zen 4), or when OPENBLAS_CORETYPE=Haswell is set; its SkylakeX kernels
 * measured ~1.4x faster for our convolutions there. The kernel is chosen when the
 * library loads, so all we can do is say so once. */
static void blas_hint(void) {
    static int said;
    if (said++) return;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const char *core = openblas_get_corename();
    if (core && (strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0) &&
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        RT_LOG_INFO("OpenBLAS uses its %s kernels on this AVX-512 CPU%s; OPENBLAS_CORETYPE=SkylakeX in the "
                    "environment makes CPU training faster",
                    core, rt_setting_is_set(RT_SET_OPENBLAS_CORETYPE) ? " (OPENBLAS_CORETYPE is set)" : "");
#endif
}
#endif

static void cpu_ctx_release(rt_model_ctx *ctx);

/* precision bf16 where the convolutions cannot run on bf16 instructions: the results are
 * the same (the rounding points do not move), the speed is not what bf16 is chosen for.
 * Said once per process (every rank's context would say it again). */
static void bf16_hint(const rt_cpu_state *s) {
    static int said;
    char why[160] = "";
    if (!rt_model_cpu_bf16_native(why, sizeof why)) {
    } else if (s->conv == RT_CPU_CONV_IM2COL) {
        snprintf(why, sizeof why, "RINGTRAIN_CONV=im2col takes the convolutions off oneDNN");
    } else if (!s->dnnl) {
        snprintf(why, sizeof why, "oneDNN is not available");
    } else {
        return;
    }
    if (said++) return;
    RT_LOG_WARN("precision bf16 on this CPU: %s, so bf16 is emulated: the same rounding as on bf16 hardware, but no "
                "faster than fp32 (often slower); precision fp32 is the faster choice here",
                why);
}

/* RINGTRAIN_CONV's choices (core/settings.h) name rt_cpu_conv_impl in order: auto, im2col, dnnl */
_Static_assert(RT_CPU_CONV_AUTO == 0 && RT_CPU_CONV_IM2COL == 1 && RT_CPU_CONV_DNNL == 2 && RT_CPU_CONV_COUNT_ == 3,
               "RINGTRAIN_CONV's choices follow rt_cpu_conv_impl");

static rt_status cpu_ctx_init(rt_model_ctx *ctx) {
    int impl = RT_CPU_CONV_AUTO; /* RINGTRAIN_CONV */
    int64_t blas_threads = 1;    /* RINGTRAIN_BLAS_THREADS */
    int dnnl_choice = 0;         /* oneDNN's settings, read again by each convolution: */
    RT_CHECK(rt_setting_choice(RT_SET_CONV, &impl));
    RT_CHECK(rt_setting_choice(RT_SET_ACT_LAYOUT, &dnnl_choice)); /* RINGTRAIN_ACT_LAYOUT (rt_cpu_act_format) */
    /* checked here, so a bad value is this call's error, never a silent im2col fallback
     * (the auto mode falls back when oneDNN cannot take a convolution) */
    RT_CHECK(rt_setting_choice(RT_SET_DNNL_BWW, &dnnl_choice));
    RT_CHECK(rt_setting_choice(RT_SET_DNNL_LAYOUT, &dnnl_choice));
    RT_CHECK(rt_setting_int(RT_SET_BLAS_THREADS, &blas_threads));
    rt_cpu_state *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    rt_status st = rt_threadpool_create(ctx->threads, &s->pool);
    if (st != RT_OK) {
        free(s);
        rt_error_trace(__FILE__, __LINE__, "rt_threadpool_create");
        return st;
    }
    ctx->backend = s;
    s->conv = (rt_cpu_conv_impl)impl;
#ifdef RT_HAVE_DNNL
    if (s->conv != RT_CPU_CONV_IM2COL) {
        st = rt_dnnl_env_create(&s->dnnl);
        if (st != RT_OK) {
            if (s->conv == RT_CPU_CONV_DNNL) {
                cpu_ctx_release(ctx);
                return st;
            }
            RT_LOG_WARN("oneDNN not available (%s): convolutions use im2col + BLAS", rt_error_message());
            s->dnnl = NULL;
        }
    }
#else
    if (s->conv == RT_CPU_CONV_DNNL) {
        cpu_ctx_release(ctx);
        RT_FAIL(RT_ERR_UNSUPPORTED, "RINGTRAIN_CONV=dnnl: this ringtrain was built without oneDNN (libdnnl-dev)");
    }
#endif
    if (ctx->precision == RT_PRECISION_BF16) bf16_hint(s);
#ifdef RT_HAVE_OPENBLAS
    /* our pool threads split the batch and each calls a single-threaded sgemm
     * (conv_cpu.c); OpenBLAS's own threads would only compete with them.
     * RINGTRAIN_BLAS_THREADS overrides (for measuring the alternative). */
    openblas_set_num_threads((int)blas_threads);
    blas_hint();
#else
    (void)blas_threads;
#endif
    return RT_OK;
}

static void cpu_ctx_release(rt_model_ctx *ctx) {
    rt_cpu_state *s = ctx->backend;
#ifdef RT_HAVE_DNNL
    rt_dnnl_env_destroy(s->dnnl);
#endif
    rt_threadpool_destroy(s->pool);
    free(s);
    ctx->backend = NULL;
}

static void cpu_host_parallel(rt_model_ctx *ctx, int ntasks, void (*fn)(void *arg, int task), void *arg) {
    rt_threadpool_run(cpu_pool(ctx), ntasks, fn, arg);
}

const rt_model_backend rt_model_backend_cpu = {
    .name = "cpu",
    .ctx_init = cpu_ctx_init,
    .ctx_release = cpu_ctx_release,
    .host_parallel = cpu_host_parallel,
    .memory = NULL, /* host memory only: rt_model_ctx_memory answers 0 and 0 */
    .act_format = rt_cpu_act_format, /* fp32 NCHW; the bf16 oracle with RINGTRAIN_ACT_LAYOUT=oracle */
    .act_supported = rt_cpu_act_supported, /* and the bf16 oracle (act_cpu.c) */
    .act_from_nchw = rt_cpu_act_from_nchw,
    .act_to_nchw = rt_cpu_act_to_nchw,
    .conv2d_prepare = rt_cpu_conv2d_prepare,
    .conv2d_release = rt_cpu_conv2d_release,
    .conv2d_forward = rt_cpu_act_conv2d_forward,
    .conv2d_backward = rt_cpu_act_conv2d_backward,
    .batchnorm2d_forward = rt_cpu_act_bn_forward,
    .batchnorm2d_backward = rt_cpu_act_bn_backward,
    .batchnorm2d_forward_act = rt_cpu_act_bn_forward_act,
    .batchnorm2d_backward_act = rt_cpu_act_bn_backward_act,
    .batchnorm2d_sync_stats = rt_cpu_act_bn_sync_stats,
    .batchnorm2d_sync_forward = rt_cpu_act_bn_sync_forward,
    .batchnorm2d_sync_dsums = rt_cpu_act_bn_sync_dsums,
    .batchnorm2d_sync_dx = rt_cpu_act_bn_sync_dx,
    .relu_forward = rt_cpu_act_relu_forward,
    .relu_backward = rt_cpu_act_relu_backward,
    .maxpool2d_prepare = rt_cpu_maxpool2d_prepare,
    .maxpool2d_release = rt_cpu_maxpool2d_release,
    .maxpool2d_forward = rt_cpu_act_maxpool_forward,
    .maxpool2d_backward = rt_cpu_act_maxpool_backward,
    .avgpool_forward = rt_cpu_act_avgpool_forward,
    .avgpool_backward = rt_cpu_act_avgpool_backward,
    .linear_forward = rt_cpu_linear_forward,
    .linear_backward = rt_cpu_linear_backward,
    .dropout_forward = rt_cpu_act_dropout_forward,
    .dropout_backward = rt_cpu_act_dropout_backward,
    .add_forward = rt_cpu_act_add_forward,
    .add_backward = rt_cpu_act_add_backward,
    .copy = rt_cpu_act_copy,
    .softmax_xent = rt_cpu_softmax_xent,
    .log_softmax_forward = rt_cpu_log_softmax_forward,
    .log_softmax_backward = rt_cpu_log_softmax_backward,
    .nll_loss = rt_cpu_nll_loss,
};
