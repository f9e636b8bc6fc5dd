/* Private to the CPU backend: its context state and the kernels of each file. */
#ifndef RT_MODEL_CPU_INTERNAL_H
#define RT_MODEL_CPU_INTERNAL_H

#include "model/internal/backend.h"
#include "model/cpu/conv_dnnl.h"
#include "model/cpu/threadpool.h"

/* How convolutions run: environment RINGTRAIN_CONV=im2col | dnnl | auto (the default:
 * oneDNN where the build has it and it can do the layer, else im2col + OpenBLAS). */
typedef enum rt_cpu_conv_impl {
    RT_CPU_CONV_AUTO = 0,
    RT_CPU_CONV_IM2COL,
    RT_CPU_CONV_DNNL,
    RT_CPU_CONV_COUNT_
} rt_cpu_conv_impl;

/* The elementwise hot loops (batch norm, ReLU, pooling) are compiled for the baseline
 * x86-64 and again for AVX2 and AVX-512, the best picked at load time (GCC's
 * target_clones): the build stays portable and the loops run full-width where the CPU
 * has it. ISO C mode (-std=c11) lets gcc contract no a * b + c into an FMA, so every
 * copy computes the same bits (the objects hold no vfmadd). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RT_CPU_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RT_CPU_HOT
#endif

/* Asks for the cache lines of [p, p + bytes) (for writing: `write`). For the loops that
 * walk data in short pieces the hardware prefetchers do not follow: W and dW in the
 * dense path's unrolls and folds, the per-image segments of batch norm's channel rows.
 * A prefetch does not fault, so the range may run past an allocation's end. */
static inline void rt_cpu_prefetch(const void *p, size_t bytes, bool write) {
    const char *a = (const char *)((uintptr_t)p & ~(uintptr_t)63), *end = (const char *)p + bytes;
    for (; a < end; a += 64) {
        if (write)
            __builtin_prefetch(a, 1, 3);
        else
            __builtin_prefetch(a, 0, 3);
    }
}

typedef struct rt_cpu_state {
    rt_threadpool *pool;
    rt_cpu_conv_impl conv;
    rt_dnnl_env *dnnl; /* oneDNN engine and stream; NULL without oneDNN or with im2col */
} rt_cpu_state;

static inline rt_threadpool *cpu_pool(rt_model_ctx *ctx) { return ((rt_cpu_state *)ctx->backend)->pool; }

/* conv_cpu.c */
/* dW (O, C, k, k) of layer l from its unrolled gradient dW' (O*OH*OW, C*H*W) (the
 * dense path's layout: row (o, output position), column (c, input position)); dead taps
 * 0; on the pool */
void rt_cpu_conv2d_fold(rt_model_ctx *ctx, const rt_conv2d *l, const float *dwd, float *dw);
/* For tests: run the dense path's unroll and fold on their plain loops even where the
 * CPU has AVX-512 (on: true), to compare the two bit for bit (process-wide, not for use
 * while another thread runs a layer); and whether layer l's batches of the size it was
 * prepared for run the bf16 matmul products (dense16 in conv_cpu.c). */
void rt_cpu_conv2d_force_plain(bool on);
bool rt_cpu_conv2d_dense16(const rt_conv2d *l);
rt_status rt_cpu_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace);
void rt_cpu_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l);
rt_status rt_cpu_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y);
rt_status rt_cpu_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                 bool accumulate);

/* ops_cpu.c, for tests: max pooling's forward on its plain scan even where the CPU has
 * AVX-512 (on: true), to compare the two bit for bit (process-wide) */
void rt_cpu_maxpool2d_force_plain(bool on);

/* bf16_cpu.c: dst[i] = bf16(src[i]) (add: dst[i] += bf16(src[i])) for i < count, split
 * over the pool; dst == src is allowed (not with add), other overlaps are not */
void rt_cpu_bf16_round(rt_model_ctx *ctx, size_t count, const float *src, float *dst, bool add);
/* dst[i] = the bf16 bits of src[i] (nearest, ties to even) for i < count, on the calling
 * thread (vectorised) */
void rt_cpu_bf16_pack(size_t count, const float *src, uint16_t *dst);

/* linear_bf16.c: the linear layer under precision bf16, the same bits as ops_cpu.c's
 * plain loops (the specification), split over the pool and vectorised */
rt_status rt_cpu_linear_forward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y);
rt_status rt_cpu_linear_backward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy,
                                      float *dx);

/* act_cpu.c: the table's entries over rt_act (fp32 NCHW, or bf16 values held in fp32 NCHW: the oracle) */
/* the CPU's formats: fp32 NCHW and the bf16 oracle (fp32 NCHW storage, stores rounded) */
bool rt_cpu_act_supported(const rt_act_format *f);
void rt_cpu_act_format(rt_precision precision, rt_act_format *f);
/* whether the context's activations are the bf16 oracle's (every store rounded to bf16) */
bool rt_cpu_act_rounds(const rt_model_ctx *ctx);
rt_status rt_cpu_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src,
                               rt_act *dst);
rt_status rt_cpu_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src,
                             float *dst);
rt_status rt_cpu_act_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y);
rt_status rt_cpu_act_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy,
                                     rt_act *dx, bool accumulate);
rt_status rt_cpu_act_bn_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                bool training);
rt_status rt_cpu_act_bn_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                 rt_act *dx, bool accumulate);
rt_status rt_cpu_act_bn_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                    const rt_act *residual, rt_act *y, bool training, bool relu);
rt_status rt_cpu_act_bn_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                     const rt_act *dy, rt_act *dx, bool accumulate);
rt_status rt_cpu_act_bn_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums);
rt_status rt_cpu_act_bn_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                     const rt_act *residual, rt_act *y, bool relu, const double *sums);
rt_status rt_cpu_act_bn_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                   const rt_act *dy, double *sums);
rt_status rt_cpu_act_bn_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                const rt_act *dy, rt_act *dx, bool accumulate, const double *sums);
rt_status rt_cpu_act_relu_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y);
rt_status rt_cpu_act_relu_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy,
                                   void *dx);
rt_status rt_cpu_act_maxpool_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y);
rt_status rt_cpu_act_maxpool_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                      const rt_act *dy, rt_act *dx);
rt_status rt_cpu_act_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y);
rt_status rt_cpu_act_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx);
rt_status rt_cpu_act_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x,
                                     void *y);
rt_status rt_cpu_act_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy,
                                      void *dx);
rt_status rt_cpu_act_add_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *a, const void *b,
                                 void *y);
rt_status rt_cpu_act_add_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx);
rt_status rt_cpu_act_copy(rt_model_ctx *ctx, size_t bytes, const void *x, void *y);

/* ops_cpu.c */
rt_status rt_cpu_batchnorm2d_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, float *y,
                                     bool training);
rt_status rt_cpu_batchnorm2d_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *dy,
                                      float *dx, bool accumulate);
rt_status rt_cpu_batchnorm2d_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x,
                                         const float *residual, float *y, bool training, bool relu);
rt_status rt_cpu_batchnorm2d_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                          const float *dy, float *dx, bool accumulate);
/* synchronised batch norm's pieces (internal/backend.h) */
rt_status rt_cpu_batchnorm2d_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, double *sums);
rt_status rt_cpu_batchnorm2d_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x,
                                          const float *residual, float *y, bool relu, const double *sums);
rt_status rt_cpu_batchnorm2d_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                        const float *dy, double *sums);
rt_status rt_cpu_batchnorm2d_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                     const float *dy, float *dx, bool accumulate, const double *sums);
rt_status rt_cpu_relu_forward(rt_model_ctx *ctx, size_t count, const float *x, float *y);
rt_status rt_cpu_relu_backward(rt_model_ctx *ctx, size_t count, const float *y, const float *dy, float *dx);
rt_status rt_cpu_maxpool2d_prepare(rt_model_ctx *ctx, rt_maxpool2d *l, int max_n);
void rt_cpu_maxpool2d_release(rt_model_ctx *ctx, rt_maxpool2d *l);
rt_status rt_cpu_maxpool2d_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const float *x, float *y);
rt_status rt_cpu_maxpool2d_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const float *x, const float *y,
                                    const float *dy, float *dx);
rt_status rt_cpu_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const float *x, float *y);
rt_status rt_cpu_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, float *dx);
rt_status rt_cpu_linear_forward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y);
rt_status rt_cpu_linear_backward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy, float *dx);
rt_status rt_cpu_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, const float *x, float *y);
rt_status rt_cpu_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, const float *dy, float *dx);
rt_status rt_cpu_add_forward(rt_model_ctx *ctx, size_t count, const float *a, const float *b, float *y);
rt_status rt_cpu_add_backward(rt_model_ctx *ctx, size_t count, const float *dy, float *dx);
rt_status rt_cpu_copy(rt_model_ctx *ctx, size_t count, const float *x, float *y);
rt_status rt_cpu_softmax_xent(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels, double eps,
                              float *loss, float *dlogits);
rt_status rt_cpu_log_softmax_forward(rt_model_ctx *ctx, int n, int k, const float *x, float *y);
rt_status rt_cpu_log_softmax_backward(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy, float *dx);
rt_status rt_cpu_nll_loss(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                          float *dlogp);

#endif
