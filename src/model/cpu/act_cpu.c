/* The CPU backend's activation formats and the table's typed entries.
 *
 * The CPU keeps PyTorch's fp32 NCHW (model/ctx.h): an rt_act * is a float array here, so
 * these entries only give the float kernels of ops_cpu.c and conv_cpu.c their pointers,
 * and refuse a dtype or layout that is not one of its formats (a caller's bug, never data).
 *
 * Its second format is the oracle of the GPU's bf16 activations (docs/model.md, "The CPU
 * oracle of the bf16 activation format"): {RT_BF16, RT_ACT_NCHW_WIDE, 1}, bf16 values held
 * in floats (alignment 1: the convolutions here read in_c input channels). Every entry
 * below that stores an activation (or an activation's gradient) runs the fp32 kernel and
 * then rounds what it stored to bf16 (round to nearest even, core/bf16.h), in place: once
 * per store, after an accumulation's add, where the GPU rounds its bf16 store. Sums (batch-norm statistics)
 * and fp32 features (avgpool's output, flatten's) are not rounded. A call on features or
 * fp32 gradients says so by its dtype (RT_F32) or format, and is never rounded. */
#include "model/cpu/cpu_internal.h"
#include "core/settings.h"

#include <string.h>

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

/* fp32 NCHW, or under bf16 with RINGTRAIN_ACT_LAYOUT=oracle the oracle of the GPU's bf16
 * format (a run of `ringtrain train` compared with a GPU's: tests/emu/train_emu.sh bf16) */
void rt_cpu_act_format(rt_precision precision, rt_act_format *f) {
    int choice = 0; /* auto | nchw | oracle: a bad value is cpu_ctx_init's error */
    if (rt_setting_choice(RT_SET_ACT_LAYOUT, &choice) != RT_OK) choice = 0;
    *f = choice == 2 && precision == RT_PRECISION_BF16 ? (rt_act_format){RT_BF16, RT_ACT_NCHW_WIDE, 1}
                                                       : (rt_act_format){RT_F32, RT_ACT_NCHW, 1};
}

bool rt_cpu_act_supported(const rt_act_format *f) {
    return (f->dtype == RT_F32 && f->layout == RT_ACT_NCHW && f->input_channel_align == 1) ||
           (f->dtype == RT_BF16 && f->layout == RT_ACT_NCHW_WIDE && f->input_channel_align == 1);
}

bool rt_cpu_act_rounds(const rt_model_ctx *ctx) { return ctx->act.dtype == RT_BF16; }

/* data of dtype dt: fp32 (features, gradients, or activations of the fp32 format: stored as
 * computed) or the oracle's bf16 values (rounded at the store) */
static rt_status dt_rounds(const rt_model_ctx *ctx, rt_dtype dt, const char *what, bool *round) {
    *round = false;
    RT_REQUIRE(dt == RT_F32 || (dt == RT_BF16 && ctx->act.layout == RT_ACT_NCHW_WIDE), RT_ERR_UNSUPPORTED,
               "%s on the CPU: data is fp32, or bf16 values held in fp32 (dtype %d)", what, (int)dt);
    *round = dt == RT_BF16;
    return RT_OK;
}

static rt_status fmt_rounds(rt_act_format f, const char *what, bool *round) {
    *round = false;
    RT_REQUIRE(rt_cpu_act_supported(&f), RT_ERR_UNSUPPORTED,
               "%s on the CPU: activations are fp32 NCHW, or bf16 values in fp32 NCHW with unpadded input (dtype %d, "
               "layout %d)",
               what, (int)f.dtype, (int)f.layout);
    *round = f.dtype == RT_BF16;
    return RT_OK;
}

/* the oracle's store: count floats at p rounded to bf16 in place (after the kernel's status) */
static rt_status stored(rt_model_ctx *ctx, rt_status st, bool round, size_t count, void *p) {
    if (st == RT_OK && round && p) rt_cpu_bf16_round(ctx, count, F(p), F(p), false);
    return st;
}
static rt_status stored_act(rt_model_ctx *ctx, rt_status st, size_t count, rt_act *p) {
    return stored(ctx, st, rt_cpu_act_rounds(ctx), count, p);
}

/* fp32 NCHW with c channels <-> stored_c channels (the extra ones zero) */
static void from_nchw(int n, int c, int h, int w, int stored_c, const float *src, float *dst) {
    const size_t plane = (size_t)h * w, img = (size_t)c * plane, simg = (size_t)stored_c * plane;
    if (stored_c == c) {
        if ((const void *)src != (const void *)dst) memmove(dst, src, sizeof(float) * n * img);
        return;
    }
    for (int i = 0; i < n; i++) {
        memmove(dst + i * simg, src + i * img, sizeof(float) * img);
        memset(dst + i * simg + img, 0, sizeof(float) * (simg - img));
    }
}

rt_status rt_cpu_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src,
                               rt_act *dst) {
    bool round = false;
    RT_CHECK(fmt_rounds(ctx->act, "activation conversion", &round));
    from_nchw(n, c, h, w, stored_c, src, F(dst));
    return stored(ctx, RT_OK, round, (size_t)n * stored_c * h * w, dst);
}

rt_status rt_cpu_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src,
                             float *dst) {
    bool round = false;
    RT_CHECK(fmt_rounds(ctx->act, "activation conversion", &round));
    const size_t plane = (size_t)h * w, img = (size_t)c * plane, simg = (size_t)stored_c * plane;
    if ((const void *)src == (const void *)dst && stored_c == c) return RT_OK;
    for (int i = 0; i < n; i++) memmove(dst + i * img, CF(src) + i * simg, sizeof(float) * img);
    return RT_OK;
}

static size_t conv_y_count(const rt_conv2d *l, int n) { return (size_t)n * l->out_c * l->out_h * l->out_w; }
static size_t conv_x_count(const rt_conv2d *l, int n) {
    return (size_t)n * (l->x_c > 0 ? l->x_c : l->in_c) * l->in_h * l->in_w;
}
static size_t bn_count(const rt_batchnorm2d *l, int n) { return (size_t)n * l->c * l->h * l->w; }

rt_status rt_cpu_act_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y) {
    return stored_act(ctx, rt_cpu_conv2d_forward(ctx, l, n, CF(x), F(y)), conv_y_count(l, n), y);
}
/* The weight gradient too under precision bf16: cuDNN's bf16 backward-filter stores dW in
 * bf16 (conv_cuda.c), which the GPU then widens exactly; the oracle rounds the CPU's fp32 dW
 * the same way (db stays fp32 on both) */
rt_status rt_cpu_act_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy,
                                     rt_act *dx, bool accumulate) {
    rt_status st = rt_cpu_conv2d_backward(ctx, l, n, CF(x), CF(dy), F(dx), accumulate);
    if (ctx->precision == RT_PRECISION_BF16)
        st = stored_act(ctx, st, (size_t)rt_tensor_numel(&l->dweight), (rt_act *)rt_tensor_data(&l->dweight));
    return stored_act(ctx, st, conv_x_count(l, n), dx);
}
rt_status rt_cpu_act_bn_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                bool training) {
    return stored_act(ctx, rt_cpu_batchnorm2d_forward(ctx, l, n, CF(x), F(y), training), bn_count(l, n), y);
}
rt_status rt_cpu_act_bn_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                 rt_act *dx, bool accumulate) {
    return stored_act(ctx, rt_cpu_batchnorm2d_backward(ctx, l, n, CF(x), CF(dy), F(dx), accumulate), bn_count(l, n),
                      dx);
}
rt_status rt_cpu_act_bn_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                    const rt_act *residual, rt_act *y, bool training, bool relu) {
    return stored_act(ctx, rt_cpu_batchnorm2d_forward_act(ctx, l, n, CF(x), CF(residual), F(y), training, relu),
                      bn_count(l, n), y);
}
rt_status rt_cpu_act_bn_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                     const rt_act *dy, rt_act *dx, bool accumulate) {
    return stored_act(ctx, rt_cpu_batchnorm2d_backward_act(ctx, l, n, CF(x), CF(act), CF(dy), F(dx), accumulate),
                      bn_count(l, n), dx);
}
rt_status rt_cpu_act_bn_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums) {
    return rt_cpu_batchnorm2d_sync_stats(ctx, l, n, CF(x), sums);
}
rt_status rt_cpu_act_bn_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                     const rt_act *residual, rt_act *y, bool relu, const double *sums) {
    return stored_act(ctx, rt_cpu_batchnorm2d_sync_forward(ctx, l, n, CF(x), CF(residual), F(y), relu, sums),
                      bn_count(l, n), y);
}
rt_status rt_cpu_act_bn_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                   const rt_act *dy, double *sums) {
    return rt_cpu_batchnorm2d_sync_dsums(ctx, l, n, CF(x), CF(act), CF(dy), sums);
}
rt_status rt_cpu_act_bn_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                const rt_act *dy, rt_act *dx, bool accumulate, const double *sums) {
    return stored_act(ctx, rt_cpu_batchnorm2d_sync_dx(ctx, l, n, CF(x), CF(act), CF(dy), F(dx), accumulate, sums),
                      bn_count(l, n), dx);
}
rt_status rt_cpu_act_relu_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y) {
    bool round = false;
    RT_CHECK(dt_rounds(ctx, dt, "relu", &round));
    return stored(ctx, rt_cpu_relu_forward(ctx, count, CF(x), F(y)), round, count, y);
}
rt_status rt_cpu_act_relu_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy,
                                   void *dx) {
    bool round = false;
    RT_CHECK(dt_rounds(ctx, dt, "relu", &round));
    return stored(ctx, rt_cpu_relu_backward(ctx, count, CF(y), CF(dy), F(dx)), round, count, dx);
}
rt_status rt_cpu_act_maxpool_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y) {
    return stored_act(ctx, rt_cpu_maxpool2d_forward(ctx, l, n, CF(x), F(y)), (size_t)n * l->c * l->out_h * l->out_w, y);
}
rt_status rt_cpu_act_maxpool_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                      const rt_act *dy, rt_act *dx) {
    return stored_act(ctx, rt_cpu_maxpool2d_backward(ctx, l, n, CF(x), CF(y), CF(dy), F(dx)),
                      (size_t)n * l->c * l->in_h * l->in_w, dx);
}
rt_status rt_cpu_act_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y) {
    return rt_cpu_avgpool_forward(ctx, n, c, hw, CF(x), y); /* fp32 features: not rounded */
}
rt_status rt_cpu_act_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx) {
    return stored_act(ctx, rt_cpu_avgpool_backward(ctx, n, c, hw, dy, F(dx)), (size_t)n * c * hw, dx);
}
rt_status rt_cpu_act_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x,
                                     void *y) {
    bool round = false;
    RT_CHECK(fmt_rounds(fmt, "dropout", &round));
    return stored(ctx, rt_cpu_dropout_forward(ctx, l, n, CF(x), F(y)), round, (size_t)n * l->features, y);
}
rt_status rt_cpu_act_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy,
                                      void *dx) {
    bool round = false;
    RT_CHECK(fmt_rounds(fmt, "dropout", &round));
    return stored(ctx, rt_cpu_dropout_backward(ctx, l, n, CF(dy), F(dx)), round, (size_t)n * l->features, dx);
}
rt_status rt_cpu_act_add_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *a, const void *b, void *y) {
    bool round = false;
    RT_CHECK(dt_rounds(ctx, dt, "add", &round));
    return stored(ctx, rt_cpu_add_forward(ctx, count, CF(a), CF(b), F(y)), round, count, y);
}
rt_status rt_cpu_act_add_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx) {
    bool round = false;
    RT_CHECK(dt_rounds(ctx, dt, "add", &round));
    return stored(ctx, rt_cpu_add_backward(ctx, count, CF(dy), F(dx)), round, count, dx);
}
rt_status rt_cpu_act_copy(rt_model_ctx *ctx, size_t bytes, const void *x, void *y) {
    (void)ctx;
    memmove(y, x, bytes); /* one call: safe for overlapping ranges */
    return RT_OK;
}
