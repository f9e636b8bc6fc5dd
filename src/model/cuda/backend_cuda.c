/* The CUDA model backend: context set-up (cuDNN and cuBLAS handles on ctx->stream),
 * batch norm (our kernels), linear layers (cuBLAS), the kernel wrappers, and the table.
 *
 * Convolutions are in conv_cuda.c, the hand-written kernels in kernels_cuda.cu. All
 * work goes to ctx->stream; forward and backward entries neither allocate nor
 * synchronise with the host. Activations are in the context's format (ctx->act: fp32 or
 * bf16, NCHW or NHWC; act_supported), every kernel that touches them takes it at run time
 * (docs/gpu.md, "Activation formats: the kernels").
 *
 * Precision (ctx->precision): fp32 forbids tensor cores everywhere (cuDNN
 * CUDNN_FMA_MATH, cuBLAS CUBLAS_PEDANTIC_MATH: plain fp32 arithmetic throughout; the
 * linear layers are too small for the mode to cost anything); tf32
 * allows TF32 tensor cores (cuDNN CUDNN_DEFAULT_MATH, cuBLAS
 * CUBLAS_TF32_TENSOR_OP_MATH), what PyTorch does with allow_tf32 = True; bf16 runs
 * convolutions (conv_cuda.c) and linear layers (cublasGemmEx, below) on bf16 copies with
 * fp32 accumulation, at the CPU's rounding points (docs/model.md, "Precision bf16"),
 * and everything else (batch norm, relu, pooling, the losses) in fp32 as before.
 *
 * Batch norm: our kernels (kernels_cuda.cu, "batch norm"; docs/gpu.md "Batch norm
 * details"), with the residual add and ReLU fused: PyTorch's semantics (biased batch
 * variance to normalise, unbiased for the running variance, momentum, eps, save_mean /
 * save_invstd for the backward, num_batches_tracked on the device), two passes over the
 * activations each way, deterministic (no floating-point atomics). They take every
 * shape; cuDNN's batch norm is not called.
 */
#include "core/log.h"
#include "core/settings.h"
#include "model/cuda/cuda_internal.h"
#include "model/cuda/syncbn_cuda.h"

#include <stdint.h>
#include <stdlib.h>

/* cuBLAS workspace given with cublasSetWorkspace (NVIDIA recommends 32 MiB on Hopper),
 * so cuBLAS never allocates one itself in the middle of a step. */
#define BLAS_WS_BYTES ((size_t)32 << 20)

rt_status rt_cuda_bind(rt_model_ctx *ctx) {
    RT_CHECK_CUDA(cudaSetDevice(ctx->device.index));
    return RT_OK;
}

static cudaStream_t stream_of(rt_model_ctx *ctx) { return cuda_state(ctx)->stream; }

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* ---- context ------------------------------------------------------------------------ */

static void cuda_ctx_release(rt_model_ctx *ctx) {
    rt_cuda_state *s = ctx->backend;
    if (!s) return;
    (void)cudaSetDevice(ctx->device.index);
    if (s->bad_labels) { /* the loss kernels cannot fail a call without a host sync: say it here */
        int bad = 0;
        if (cudaMemcpy(&bad, s->bad_labels, sizeof bad, cudaMemcpyDeviceToHost) == cudaSuccess && bad > 0)
            RT_LOG_WARN("model on cuda:%d: %d label(s) outside [0, classes) were seen; their losses were NaN",
                        ctx->device.index, bad);
        (void)cudaGetLastError();
    }
    if (s->dnn) (void)cudnnDestroy(s->dnn);
    if (s->blas) (void)cublasDestroy(s->blas);
    if (s->blas_ws) (void)cudaFree(s->blas_ws);
    if (s->bad_labels) (void)cudaFree(s->bad_labels);
    free(s);
    ctx->backend = NULL;
}

/* cuBLAS's math mode per precision: fp32 pedantic (plain fp32), tf32 TF32 tensor cores;
 * bf16 default (its GEMMs are cublasGemmEx on bf16 operands with CUBLAS_COMPUTE_32F,
 * which run on bf16 tensor cores with fp32 accumulation; no fp32 GEMM is left) */
static cublasMath_t blas_math(rt_precision p) {
    if (p == RT_PRECISION_TF32) return CUBLAS_TF32_TENSOR_OP_MATH;
    return p == RT_PRECISION_BF16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH;
}

static rt_status cuda_ctx_init(rt_model_ctx *ctx) {
    RT_REQUIRE(ctx->device.kind == RT_DEVICE_CUDA, RT_ERR_INTERNAL, "CUDA model backend on a non-CUDA device");
    int layout = 0; /* RINGTRAIN_ACT_LAYOUT: a bad value is this call's error (cuda_act_format took auto) */
    RT_CHECK(rt_setting_choice(RT_SET_ACT_LAYOUT, &layout));
    rt_cuda_state *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    ctx->backend = s; /* released by cuda_ctx_release, also after a failure below */
    RT_CHECK(rt_cuda_bind(ctx));
    s->stream = (cudaStream_t)rt_stream_native(ctx->stream);
    RT_CHECK_CUDNN(cudnnCreate(&s->dnn));
    RT_CHECK_CUDNN(cudnnSetStream(s->dnn, s->stream));
    RT_CHECK_CUBLAS(cublasCreate(&s->blas));
    RT_CHECK_CUBLAS(cublasSetStream(s->blas, s->stream));
    RT_CHECK_CUBLAS(cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST));
    RT_CHECK_CUBLAS(cublasSetMathMode(s->blas, blas_math(ctx->precision)));
    RT_CHECK_CUDA(cudaMalloc(&s->blas_ws, BLAS_WS_BYTES));
    s->blas_ws_bytes = BLAS_WS_BYTES;
    RT_CHECK_CUBLAS(cublasSetWorkspace(s->blas, s->blas_ws, s->blas_ws_bytes));
    RT_CHECK_CUDA(cudaMalloc((void **)&s->bad_labels, sizeof(int)));
    RT_CHECK_CUDA(cudaMemsetAsync(s->bad_labels, 0, sizeof(int), s->stream));
    RT_LOG_DEBUG("model on cuda:%d: cuDNN %zu, cuBLAS, precision %s", ctx->device.index, cudnnGetVersion(),
                 rt_precision_name(ctx->precision));
    return RT_OK;
}

/* ---- batch norm ---------------------------------------------------------------------- */

/* Our kernels (kernels_cuda.cu, "batch norm"), for every shape: forward y = relu?(bn(x) +
 * residual?) in two passes, backward (through the ReLU) in two, deterministic. The layer's
 * scratch (the reduction's partials, the per-channel factors, the tickets that find each
 * channel's last block) is one device allocation made when the layer is prepared. */
typedef struct bn_priv {
    void *scratch;
    size_t bytes;
    int max_n;
    size_t off_factors, off_tickets;
} bn_priv;

static void cuda_bn_release(rt_model_ctx *ctx, rt_batchnorm2d *l) {
    bn_priv *p = l->priv;
    if (!p) return;
    if (p->scratch) {
        (void)rt_cuda_bind(ctx);
        (void)cudaFree(p->scratch);
        cuda_state(ctx)->bn_scratch_bytes -= p->bytes;
    }
    free(p);
    l->priv = NULL;
}

static rt_status bn_prepare(rt_model_ctx *ctx, rt_batchnorm2d *l, bn_priv *p, int max_n) {
    const size_t c = (size_t)l->c,
                 splits = (size_t)rt_cuk_bn_splits(max_n, l->c, (size_t)l->h * l->w, ctx->act.layout == RT_ACT_NHWC);
    p->max_n = max_n;
    p->off_factors = align256(2 * c * splits * sizeof(double));
    p->off_tickets = p->off_factors + align256(4 * c * sizeof(float));
    const size_t bytes = p->off_tickets + align256(c * sizeof(int));
    RT_CHECK_CUDA(cudaMalloc(&p->scratch, bytes));
    p->bytes = bytes;
    cuda_state(ctx)->bn_scratch_bytes += bytes;
    /* the tickets start at 0 and every launch leaves them at 0 */
    RT_CHECK_CUDA(cudaMemsetAsync((char *)p->scratch + p->off_tickets, 0, c * sizeof(int), stream_of(ctx)));
    return RT_OK;
}

static rt_status cuda_bn_prepare(rt_model_ctx *ctx, rt_batchnorm2d *l, int max_n) {
    RT_CHECK(rt_cuda_bind(ctx));
    if (l->priv) cuda_bn_release(ctx, l);
    bn_priv *p = calloc(1, sizeof *p);
    RT_CHECK_ALLOC(p, sizeof *p);
    l->priv = p;
    rt_status st = bn_prepare(ctx, l, p, max_n);
    if (st != RT_OK) {
        rt_error_trace(__FILE__, __LINE__, "batchnorm2d prepare");
        cuda_bn_release(ctx, l);
        return st;
    }
    return RT_OK;
}

rt_status rt_cuda_bn_scratch(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, double **partial, int **tickets) {
    bn_priv *p = l->priv;
    RT_REQUIRE(p != NULL, RT_ERR_INVALID, "batchnorm2d on cuda: layer not prepared (rt_batchnorm2d_prepare)");
    RT_REQUIRE(n <= p->max_n, RT_ERR_INVALID, "batchnorm2d: batch %d larger than the prepared %d", n, p->max_n);
    RT_CHECK(rt_cuda_bind(ctx));
    *partial = p->scratch;
    *tickets = (int *)((char *)p->scratch + p->off_tickets);
    return RT_OK;
}

/* the kernels' view of layer l at batch n */
static rt_status bn_args(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, rt_cuk_bn_args *a, rt_cuk_bn_shape *sh) {
    double *partial;
    int *tickets;
    RT_CHECK(rt_cuda_bn_scratch(ctx, l, n, &partial, &tickets));
    bn_priv *p = l->priv;
    *a = (rt_cuk_bn_args){
        .weight = rt_tensor_data(&l->weight),
        .bias = rt_tensor_data(&l->bias),
        .running_mean = rt_tensor_data(&l->running_mean),
        .running_var = rt_tensor_data(&l->running_var),
        .save_mean = l->save_mean,
        .save_invstd = l->save_invstd,
        .dweight = rt_tensor_data(&l->dweight), /* written by the backward only */
        .dbias = rt_tensor_data(&l->dbias),
        .num_batches_tracked = rt_tensor_data(&l->num_batches_tracked),
        .momentum = l->momentum,
        .eps = l->eps,
        .partial = partial,
        .factors = (float *)((char *)p->scratch + p->off_factors),
        .tickets = tickets,
    };
    *sh = (rt_cuk_bn_shape){.n = n,
                            .c = l->c,
                            .bf16 = ctx->act.dtype == RT_BF16,
                            .nhwc = ctx->act.layout == RT_ACT_NHWC,
                            .plane = (size_t)l->h * l->w};
    return RT_OK;
}

static rt_status cuda_bn_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *residual,
                                     rt_act *y, bool training, bool relu) {
    rt_cuk_bn_args a;
    rt_cuk_bn_shape sh;
    RT_CHECK(bn_args(ctx, l, n, &a, &sh));
    RT_CHECK_CUDA(rt_cuk_bn_forward(stream_of(ctx), &a, sh, x, residual, y, training, relu));
    return RT_OK;
}

static rt_status cuda_bn_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y, bool training) {
    return cuda_bn_forward_act(ctx, l, n, x, NULL, y, training, false);
}

static rt_status cuda_bn_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                      const rt_act *dy, rt_act *dx, bool accumulate) {
    rt_cuk_bn_args a;
    rt_cuk_bn_shape sh;
    RT_CHECK(bn_args(ctx, l, n, &a, &sh));
    RT_CHECK_CUDA(rt_cuk_bn_backward(stream_of(ctx), &a, sh, x, act, dy, dx, accumulate, NULL));
    return RT_OK;
}

/* the same, writing dy through the ReLU into g in the sums' pass (the shortcut's gradient) */
static rt_status cuda_bn_backward_act_keep(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                           const rt_act *act, const rt_act *dy, rt_act *g, rt_act *dx,
                                           bool accumulate) {
    rt_cuk_bn_args a;
    rt_cuk_bn_shape sh;
    RT_CHECK(bn_args(ctx, l, n, &a, &sh));
    RT_CHECK_CUDA(rt_cuk_bn_backward(stream_of(ctx), &a, sh, x, act, dy, dx, accumulate, g));
    return RT_OK;
}

static rt_status cuda_bn_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                  rt_act *dx, bool accumulate) {
    return cuda_bn_backward_act(ctx, l, n, x, NULL, dy, dx, accumulate);
}

/* ---- linear (cuBLAS, column-major view of row-major data) ---------------------------- */

/* Row-major x (n, in) is column-major x^T (in, n); row-major W (out, in) is column-major
 * W^T (in, out). So y^T (out, n) = W x^T = op_T(W^T) x^T.
 *
 * Precision bf16 (the CPU's linear_forward_bf16 / linear_backward_bf16, ops_cpu.c):
 * cublasGemmEx with CUDA_R_16BF A and B, CUBLAS_COMPUTE_32F (fp32 accumulation, bf16
 * tensor cores) and a CUDA_R_32F C. Forward: y starts as the rounded bias, the GEMM adds
 * round(W) round(x) to it in fp32 (beta 1), then y is rounded once. Backward: dW = the
 * fp32 GEMM of round(dy) and round(x), not rounded; db = fp32 column sums of round(dy);
 * dx = round(the fp32 GEMM of round(dy) and round(W)). The bf16 copies (W, then x, then
 * dy) live in ctx->work, reserved by linear_prepare for max_n. */

/* the bf16 copies' offsets in ctx->work for batch n, and their total */
typedef struct lin_bf16 {
    size_t off_w, off_x, off_dy, total;
} lin_bf16;

static lin_bf16 lin_layout(const rt_linear *l, int n) {
    lin_bf16 b;
    b.off_w = 0;
    b.off_x = align256(sizeof(uint16_t) * (size_t)l->out_f * l->in_f);
    b.off_dy = b.off_x + align256(sizeof(uint16_t) * (size_t)n * l->in_f);
    b.total = b.off_dy + align256(sizeof(uint16_t) * (size_t)n * l->out_f);
    return b;
}

static rt_status cuda_linear_prepare(rt_model_ctx *ctx, rt_linear *l, int max_n, size_t *workspace) {
    *workspace = ctx->precision == RT_PRECISION_BF16 ? lin_layout(l, max_n).total : 0;
    return RT_OK;
}

static rt_status lin_bf16_ready(const rt_model_ctx *ctx, const rt_linear *l, int n, lin_bf16 *b) {
    *b = lin_layout(l, n);
    RT_REQUIRE(ctx->work != NULL && ctx->work_bytes >= b->total, RT_ERR_INVALID,
               "linear %d->%d bf16, batch %d: workspace of %zu bytes is smaller than the %zu its bf16 copies need; "
               "call rt_linear_prepare and rt_model_ctx_reserve",
               l->in_f, l->out_f, n, ctx->work_bytes, b->total);
    return RT_OK;
}

static void *work_at(const rt_model_ctx *ctx, size_t off) { return (char *)ctx->work + off; }

static rt_status linear_forward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y) {
    rt_cuda_state *s = cuda_state(ctx);
    lin_bf16 b;
    RT_CHECK(lin_bf16_ready(ctx, l, n, &b));
    uint16_t *wb = work_at(ctx, b.off_w), *xb = work_at(ctx, b.off_x);
    const size_t yn = (size_t)n * l->out_f;
    const float one = 1.0f;
    rt_cuk_to_bf16_set in = {0}; /* W and x: one launch */
    rt_cuk_set_to(&in, (size_t)l->out_f * l->in_f, rt_tensor_data(&l->weight), wb);
    rt_cuk_set_to(&in, (size_t)n * l->in_f, x, xb);
    RT_CHECK_CUDA(rt_cuk_to_bf16_n(s->stream, &in));
    RT_CHECK_CUDA(rt_cuk_bias_rows(s->stream, n, l->out_f, rt_tensor_data(&l->bias), y));
    RT_CHECK_CUDA(rt_cuk_round_bf16(s->stream, yn, y));
    RT_CHECK_CUBLAS(cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, l->out_f, n, l->in_f, &one, wb, CUDA_R_16BF,
                                 l->in_f, xb, CUDA_R_16BF, l->in_f, &one, y, CUDA_R_32F, l->out_f, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    RT_CHECK_CUDA(rt_cuk_round_bf16(s->stream, yn, y));
    return RT_OK;
}

static rt_status linear_backward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy,
                                      float *dx) {
    rt_cuda_state *s = cuda_state(ctx);
    lin_bf16 b;
    RT_CHECK(lin_bf16_ready(ctx, l, n, &b));
    uint16_t *wb = work_at(ctx, b.off_w), *xb = work_at(ctx, b.off_x), *dyb = work_at(ctx, b.off_dy);
    const float one = 1.0f, zero = 0.0f;
    rt_cuk_to_bf16_set in = {0}; /* x, dy, and W where dx is wanted: one launch */
    rt_cuk_set_to(&in, (size_t)n * l->in_f, x, xb);
    rt_cuk_set_to(&in, (size_t)n * l->out_f, dy, dyb);
    if (dx) rt_cuk_set_to(&in, (size_t)l->out_f * l->in_f, rt_tensor_data(&l->weight), wb);
    RT_CHECK_CUDA(rt_cuk_to_bf16_n(s->stream, &in));
    /* dW^T (in, out) = x^T (in, n) dy (n, out): fp32, not rounded */
    RT_CHECK_CUBLAS(cublasGemmEx(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, l->in_f, l->out_f, n, &one, xb, CUDA_R_16BF,
                                 l->in_f, dyb, CUDA_R_16BF, l->out_f, &zero, rt_tensor_data(&l->dweight), CUDA_R_32F,
                                 l->in_f, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    RT_CHECK_CUDA(rt_cuk_bf16_channel_sums(s->stream, n, l->out_f, 1, false, dyb, rt_tensor_data(&l->dbias)));
    if (!dx) return RT_OK;
    /* dx^T (in, n) = W^T (in, out) dy^T (out, n), rounded once */
    RT_CHECK_CUBLAS(cublasGemmEx(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, l->in_f, n, l->out_f, &one, wb, CUDA_R_16BF,
                                 l->in_f, dyb, CUDA_R_16BF, l->out_f, &zero, dx, CUDA_R_32F, l->in_f,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    RT_CHECK_CUDA(rt_cuk_round_bf16(s->stream, (size_t)n * l->in_f, dx));
    return RT_OK;
}

static rt_status cuda_linear_forward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y) {
    RT_CHECK(rt_cuda_bind(ctx));
    if (ctx->precision == RT_PRECISION_BF16) return linear_forward_bf16(ctx, l, n, x, y);
    rt_cuda_state *s = cuda_state(ctx);
    const float one = 1.0f;
    RT_CHECK_CUDA(rt_cuk_bias_rows(s->stream, n, l->out_f, rt_tensor_data(&l->bias), y));
    RT_CHECK_CUBLAS(cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, l->out_f, n, l->in_f, &one,
                                rt_tensor_data(&l->weight), l->in_f, x, l->in_f, &one, y, l->out_f));
    return RT_OK;
}

static rt_status cuda_linear_backward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy,
                                      float *dx) {
    RT_CHECK(rt_cuda_bind(ctx));
    if (ctx->precision == RT_PRECISION_BF16) return linear_backward_bf16(ctx, l, n, x, dy, dx);
    rt_cuda_state *s = cuda_state(ctx);
    const float one = 1.0f, zero = 0.0f;
    /* dW (out, in) = dy^T x  <=>  column-major dW^T (in, out) = x^T (in, n) dy (n, out) */
    RT_CHECK_CUBLAS(cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, l->in_f, l->out_f, n, &one, x, l->in_f, dy, l->out_f,
                                &zero, rt_tensor_data(&l->dweight), l->in_f));
    RT_CHECK_CUDA(rt_cuk_column_sums(s->stream, n, l->out_f, dy, rt_tensor_data(&l->dbias)));
    /* dx (n, in) = dy W  <=>  column-major dx^T (in, n) = W^T (in, out) dy^T (out, n) */
    if (dx)
        RT_CHECK_CUBLAS(cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, l->in_f, n, l->out_f, &one,
                                    rt_tensor_data(&l->weight), l->in_f, dy, l->out_f, &zero, dx, l->in_f));
    return RT_OK;
}

/* ---- kernel wrappers ----------------------------------------------------------------- */

/* The activation formats (model/ctx.h): fp32 or bf16 elements, NCHW or NHWC; every
 * kernel here takes the format at run time. */
/* The format for a precision (docs/model.md, "Activations"): fp32 keeps PyTorch's NCHW
 * (the exact-comparison mode); tf32 and bf16 run NHWC, the layout of cuDNN's tensor-core
 * convolutions, bf16 storing bf16 (the model input padded to 8 channels, fp32 to 4: the
 * granularity of the tensor cores' 16-bit and 32-bit operands). RINGTRAIN_ACT_LAYOUT=nchw
 * keeps fp32 NCHW under every precision (measurements; the per-layer bf16 casts of before). */
static void cuda_act_format(rt_precision precision, rt_act_format *f) {
    int choice = 0; /* auto | nchw */
    if (rt_setting_choice(RT_SET_ACT_LAYOUT, &choice) != RT_OK) choice = 0; /* checked at ctx_init */
    if (choice == 1 || precision == RT_PRECISION_FP32) /* nchw; auto and oracle (a CPU choice) alike here */
        *f = (rt_act_format){RT_F32, RT_ACT_NCHW, 1};
    else if (precision == RT_PRECISION_BF16)
        *f = (rt_act_format){RT_BF16, RT_ACT_NHWC, 8};
    else
        *f = (rt_act_format){RT_F32, RT_ACT_NHWC, 4};
}

static bool cuda_act_supported(const rt_act_format *f) {
    return (f->dtype == RT_F32 || f->dtype == RT_BF16) && (f->layout == RT_ACT_NCHW || f->layout == RT_ACT_NHWC);
}

static rt_status need_act_dtype(rt_dtype dt, const char *what) {
    RT_REQUIRE(dt == RT_F32 || dt == RT_BF16, RT_ERR_UNSUPPORTED,
               "%s on cuda: element type %d (expected fp32 or bf16)", what, (int)dt);
    return RT_OK;
}

static rt_status need_format(rt_act_format f, const char *what) {
    RT_REQUIRE(cuda_act_supported(&f), RT_ERR_UNSUPPORTED,
               "%s on cuda: format (dtype %d, layout %d) is not one of fp32/bf16 NCHW/NHWC", what, (int)f.dtype,
               (int)f.layout);
    return RT_OK;
}

/* fp32 NCHW unpadded is a copy (as it always was); any other format a conversion kernel
 * (to: activations -> fp32 NCHW) */
static rt_status act_convert(rt_model_ctx *ctx, bool to, int n, int c, int h, int w, int stored_c, const void *src,
                             void *dst) {
    RT_CHECK(rt_cuda_bind(ctx));
    if (rt_act_is_nchw_f32(ctx) && stored_c == c) {
        if (src != dst)
            RT_CHECK_CUDA(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n * c * h * w, cudaMemcpyDeviceToDevice,
                                          stream_of(ctx)));
        return RT_OK;
    }
    RT_REQUIRE(src != dst, RT_ERR_INVALID,
               "activation conversion on cuda: output aliases the input (only fp32 NCHW unpadded may)");
    const size_t plane = (size_t)h * w;
    RT_CHECK_CUDA(to ? rt_cuk_act_to_nchw(stream_of(ctx), ctx->act, n, c, plane, stored_c, src, dst)
                     : rt_cuk_act_from_nchw(stream_of(ctx), ctx->act, n, c, plane, stored_c, src, dst));
    return RT_OK;
}

static rt_status cuda_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src,
                                    rt_act *dst) {
    return act_convert(ctx, false, n, c, h, w, stored_c, src, dst);
}

static rt_status cuda_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src,
                                  float *dst) {
    return act_convert(ctx, true, n, c, h, w, stored_c, src, dst);
}

static rt_status cuda_relu_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y) {
    RT_CHECK(need_act_dtype(dt, "relu"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_relu_forward(stream_of(ctx), dt, count, x, y));
    return RT_OK;
}

static rt_status cuda_relu_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy,
                                    void *dx) {
    RT_CHECK(need_act_dtype(dt, "relu"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_relu_backward(stream_of(ctx), dt, count, y, dy, dx));
    return RT_OK;
}

static rt_status cuda_maxpool_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_maxpool_forward(stream_of(ctx), ctx->act, l, n, x, y));
    return RT_OK;
}

static rt_status cuda_maxpool_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                       const rt_act *dy, rt_act *dx) {
    (void)y;
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_maxpool_backward(stream_of(ctx), ctx->act, l, n, x, dy, dx));
    return RT_OK;
}

static rt_status cuda_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_avgpool_forward(stream_of(ctx), ctx->act, n, c, hw, x, y));
    return RT_OK;
}

static rt_status cuda_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_avgpool_backward(stream_of(ctx), ctx->act, n, c, hw, dy, dx));
    return RT_OK;
}

static rt_status cuda_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x,
                                      void *y) {
    RT_CHECK(need_format(fmt, "dropout"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_dropout_forward(stream_of(ctx), fmt, l, n, x, y));
    return RT_OK;
}

static rt_status cuda_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy,
                                       void *dx) {
    RT_CHECK(need_format(fmt, "dropout"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_dropout_backward(stream_of(ctx), fmt, l, n, dy, dx));
    return RT_OK;
}

static rt_status cuda_add_forward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *a, const void *b,
                                  void *y) {
    RT_CHECK(need_act_dtype(dt, "add"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_add(stream_of(ctx), dt, count, a, b, y));
    return RT_OK;
}

static rt_status cuda_add_backward(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx) {
    RT_CHECK(need_act_dtype(dt, "add"));
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_accumulate(stream_of(ctx), dt, count, dy, dx));
    return RT_OK;
}

static rt_status cuda_copy(rt_model_ctx *ctx, size_t bytes, const void *x, void *y) {
    if (bytes == 0 || x == y) return RT_OK;
    /* cudaMemcpyAsync has no memmove semantics: refuse partial overlap */
    RT_REQUIRE((uintptr_t)x + bytes <= (uintptr_t)y || (uintptr_t)y + bytes <= (uintptr_t)x, RT_ERR_INVALID,
               "copy of %zu bytes between overlapping device ranges", bytes);
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)));
    return RT_OK;
}

static rt_status cuda_softmax_xent(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels,
                                   double smoothing, float *loss, float *dlogits) {
    RT_CHECK(rt_cuda_bind(ctx));
    rt_cuda_state *s = cuda_state(ctx);
    RT_CHECK_CUDA(rt_cuk_softmax_xent_smooth(s->stream, n, k, logits, labels, smoothing, loss, dlogits, s->bad_labels));
    return RT_OK;
}

static rt_status cuda_log_softmax_forward(rt_model_ctx *ctx, int n, int k, const float *x, float *y) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_log_softmax_forward(stream_of(ctx), n, k, x, y));
    return RT_OK;
}

static rt_status cuda_log_softmax_backward(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy,
                                           float *dx) {
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_log_softmax_backward(stream_of(ctx), n, k, y, dy, dx));
    return RT_OK;
}

static rt_status cuda_nll_loss(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                               float *dlogp) {
    RT_CHECK(rt_cuda_bind(ctx));
    rt_cuda_state *s = cuda_state(ctx);
    RT_CHECK_CUDA(rt_cuk_nll_loss(s->stream, n, k, logp, labels, loss, dlogp, s->bad_labels));
    return RT_OK;
}

const rt_model_backend rt_model_backend_cuda = {
    .name = "cuda",
    .ctx_init = cuda_ctx_init,
    .ctx_release = cuda_ctx_release,
    .memory = rt_cuda_memory,
    .act_format = cuda_act_format,
    .act_supported = cuda_act_supported,
    .act_from_nchw = cuda_act_from_nchw,
    .act_to_nchw = cuda_act_to_nchw,
    .conv2d_prepare = rt_cuda_conv2d_prepare,
    .conv2d_release = rt_cuda_conv2d_release,
    .conv2d_forward = rt_cuda_conv2d_forward,
    .conv2d_backward = rt_cuda_conv2d_backward,
    .conv2d_weights_prepare = rt_cuda_conv2d_weights_prepare,
    .conv2d_weights_refresh = rt_cuda_conv2d_weights_refresh,
    .conv2d_weights_grads = rt_cuda_conv2d_weights_grads,
    .conv2d_weights_release = rt_cuda_conv2d_weights_release,
    .batchnorm2d_prepare = cuda_bn_prepare,
    .batchnorm2d_release = cuda_bn_release,
    .batchnorm2d_forward = cuda_bn_forward,
    .batchnorm2d_backward = cuda_bn_backward,
    .batchnorm2d_forward_act = cuda_bn_forward_act,
    .batchnorm2d_backward_act = cuda_bn_backward_act,
    .batchnorm2d_backward_act_keep = cuda_bn_backward_act_keep,
    .relu_forward = cuda_relu_forward,
    .relu_backward = cuda_relu_backward,
    .maxpool2d_forward = cuda_maxpool_forward,
    .maxpool2d_backward = cuda_maxpool_backward,
    .avgpool_forward = cuda_avgpool_forward,
    .avgpool_backward = cuda_avgpool_backward,
    .linear_prepare = cuda_linear_prepare,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .add_forward = cuda_add_forward,
    .add_backward = cuda_add_backward,
    .copy = cuda_copy,
    .softmax_xent = cuda_softmax_xent,
    .log_softmax_forward = cuda_log_softmax_forward,
    .log_softmax_backward = cuda_log_softmax_backward,
    .nll_loss = cuda_nll_loss,
    /* synchronised batch norm (syncbn_cuda.c) */
    .batchnorm2d_sync_stats = rt_cuda_batchnorm2d_sync_stats,
    .batchnorm2d_sync_forward = rt_cuda_batchnorm2d_sync_forward,
    .batchnorm2d_sync_dsums = rt_cuda_batchnorm2d_sync_dsums,
    .batchnorm2d_sync_dx = rt_cuda_batchnorm2d_sync_dx,
};
