/* The CPU backend's activation format and the table's typed entries.
 *
 * The CPU keeps PyTorch's fp32 NCHW (model/ctx.h): an rt_act * is a float array here, so
 * these entries only give the float kernels of ops_cpu.c and conv_cpu.c their pointers,
 * and refuse a dtype or layout that is not that format (a caller's bug, never data). */
#include "model/cpu/cpu_internal.h"

#include <string.h>

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

static rt_status need_f32(rt_dtype dt, const char *what) {
    RT_REQUIRE(dt == RT_F32, RT_ERR_UNSUPPORTED, "%s on the CPU: activations are fp32 (dtype %d)", what, (int)dt);
    return RT_OK;
}

static rt_status need_nchw_f32(rt_act_format f, const char *what) {
    RT_REQUIRE(f.dtype == RT_F32 && f.layout == RT_ACT_NCHW, RT_ERR_UNSUPPORTED,
               "%s on the CPU: activations are fp32 NCHW (dtype %d, layout %d)", what, (int)f.dtype, (int)f.layout);
    return RT_OK;
}

/* fp32 NCHW with c channels <-> stored_c channels (the extra ones zero) */
rt_status rt_cpu_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src,
                               rt_act *dst) {
    RT_CHECK(need_nchw_f32(ctx->act, "activation conversion"));
    const size_t plane = (size_t)h * w, img = (size_t)c * plane, simg = (size_t)stored_c * plane;
    if (stored_c == c) {
        if ((const void *)src != (const void *)dst) memmove(dst, src, sizeof(float) * n * img);
        return RT_OK;
    }
    for (int i = 0; i < n; i++) {
        memmove(F(dst) + i * simg, src + i * img, sizeof(float) * img);
        memset(F(dst) + i * simg + img, 0, sizeof(float) * (simg - img));
    }
    return RT_OK;
}

rt_status rt_cpu_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src,
                             float *dst) {
    RT_CHECK(need_nchw_f32(ctx->act, "activation conversion"));
    const size_t plane = (size_t)h * w, img = (size_t)c * plane, simg = (size_t)stored_c * plane;
    if ((const void *)src == (const void *)dst && stored_c == c) return RT_OK;
    for (int i = 0; i < n; i++) memmove(dst + i * img, CF(src) + i * simg, sizeof(float) * img);
    return RT_OK;
}

rt_status rt_cpu_act_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y) {
    return rt_cpu_conv2d_forward(ctx, l, n, CF(x), F(y));
}
rt_status rt_cpu_act_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy,
                                     rt_act *dx, bool accumulate) {
    return rt_cpu_conv2d_backward(ctx, l, n, CF(x), CF(dy), F(dx), accumulate);
}
rt_status rt_cpu_act_bn_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                bool training) {
    return rt_cpu_batchnorm2d_forward(ctx, l, n, CF(x), F(y), training);
}
rt_status rt_cpu_act_bn_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                 rt_act *dx, bool accumulate) {
    return rt_cpu_batchnorm2d_backward(ctx, l, n, CF(x), CF(dy), F(dx), accumulate);
}
rt_status rt_cpu_act_bn_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                    const rt_act *residual, rt_act *y, bool training, bool relu) {
    return rt_cpu_batchnorm2d_forward_act(ctx, l, n, CF(x), CF(residual), F(y), training, relu);
}
rt_status rt_cpu_act_bn_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                     const rt_act *dy, rt_act *dx, bool accumulate) {
    return rt_cpu_batchnorm2d_backward_act(ctx, l, n, CF(x), CF(act), CF(dy), F(dx), accumulate);
}
rt_status rt_cpu_act_bn_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums) {
    return rt_cpu_batchnorm2d_sync_stats(ctx, l, n, CF(x), sums);
}
rt_status rt_cpu_act_bn_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                     const rt_act *residual, rt_act *y, bool relu, const double *sums) {
    return rt_cpu_batchnorm2d_sync_forward(ctx, l, n, CF(x), CF(residual), F(y), relu, sums);
}
rt_status rt_cpu_act_bn_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                   const rt_act *dy, double *sums) {
    return rt_cpu_batchnorm2d_sync_dsums(ctx, l, n, CF(x), CF(act), CF(dy), sums);
}
rt_status rt_cpu_act_bn_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                const rt_act *dy, rt_act *dx, bool accumulate, const double *sums) {
    return rt_cpu_batchnorm2d_sync_dx(ctx, l, n, CF(x), CF(act), CF(dy), F(dx), accumulate, sums);
}
rt_status rt_cpu_act_relu_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y) {
    RT_CHECK(need_f32(dt, "relu"));
    return rt_cpu_relu_forward(ctx, count, CF(x), F(y));
}
rt_status rt_cpu_act_relu_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy,
                                   void *dx) {
    RT_CHECK(need_f32(dt, "relu"));
    return rt_cpu_relu_backward(ctx, count, CF(y), CF(dy), F(dx));
}
rt_status rt_cpu_act_maxpool_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y) {
    return rt_cpu_maxpool2d_forward(ctx, l, n, CF(x), F(y));
}
rt_status rt_cpu_act_maxpool_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                      const rt_act *dy, rt_act *dx) {
    return rt_cpu_maxpool2d_backward(ctx, l, n, CF(x), CF(y), CF(dy), F(dx));
}
rt_status rt_cpu_act_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y) {
    return rt_cpu_avgpool_forward(ctx, n, c, hw, CF(x), y);
}
rt_status rt_cpu_act_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx) {
    return rt_cpu_avgpool_backward(ctx, n, c, hw, dy, F(dx));
}
rt_status rt_cpu_act_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x,
                                     void *y) {
    RT_CHECK(need_nchw_f32(fmt, "dropout"));
    return rt_cpu_dropout_forward(ctx, l, n, CF(x), F(y));
}
rt_status rt_cpu_act_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy,
                                      void *dx) {
    RT_CHECK(need_nchw_f32(fmt, "dropout"));
    return rt_cpu_dropout_backward(ctx, l, n, CF(dy), F(dx));
}
rt_status rt_cpu_act_add_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *a, const void *b,
                                 void *y) {
    RT_CHECK(need_f32(dt, "add"));
    return rt_cpu_add_forward(ctx, count, CF(a), CF(b), F(y));
}
rt_status rt_cpu_act_add_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx) {
    RT_CHECK(need_f32(dt, "add"));
    return rt_cpu_add_backward(ctx, count, CF(dy), F(dx));
}
rt_status rt_cpu_act_copy(rt_model_ctx *ctx, size_t bytes, const void *x, void *y) {
    (void)ctx;
    memmove(y, x, bytes); /* one call: safe for overlapping ranges */
    return RT_OK;
}
