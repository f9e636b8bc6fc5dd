/* conv2d on CUDA: cuDNN forward, backward-data and backward-filter, in the context's
 * activation format (ctx->act, model/ctx.h).
 *
 * NHWC formats (fp32 NHWC under fp32/tf32, bf16 NHWC under bf16; docs/gpu.md "Activation
 * formats: convolutions"): x, y, dy and dx go to cuDNN as they are, NHWC descriptors of
 * the activations' dtype, x with l->x_c channels (the stem's padded input). The filter is
 * a copy (KRSC, that dtype, input channels padded to x_c with zeros) that
 * rt_conv2d_weights_refresh writes for every convolution in one launch (convw_cuda.cu);
 * dW comes back in the copy's layout and dtype into ctx->work and one kernel writes the
 * fp32 OIHW gradient; dx accumulates through cuDNN's beta (one rounding); a bias is a
 * fill of y before cuDNN adds (beta 1) and db double sums of dy. Smaller batches take the
 * spare descriptors below. A shape cuDNN refuses in NHWC falls back to NCHW copies of its
 * activations in ctx->work (converted around the calls, warned once per process). A
 * preset recorded with the other layout is an error naming the shape
 * (preset_layout_check). The rest of this comment is the fp32 NCHW format, unchanged:
 *
 * fp32 NCHW: fp32 data, or bf16 copies under precision bf16, NHWC for most layers, below.
 *
 * Prepare (once per layer, setup time) creates the filter and convolution descriptors
 * and the x/y tensor descriptors for the largest batch, and chooses the three
 * algorithms, by cuDNN's heuristics or, with ctx->benchmark (train.cudnn_benchmark), by
 * measurement: cudnnFind*AlgorithmEx runs every candidate on scratch buffers of the real
 * shapes with a workspace bounded by RT_CUDA_CONV_WS_CAP and they come back ranked by
 * time. Either way the first allowed one is kept (ctx->deterministic and the precision
 * say which are: perf_usable, below); its workspace is reported to the model, which
 * reserves the largest over all layers as ctx->work. Identical shapes are chosen for
 * once per context (ResNet34 repeats most of its convolutions).
 *
 * Precision: fp32 sets CUDNN_FMA_MATH on the convolution descriptors (no tensor cores,
 * no TF32); tf32 sets CUDNN_DEFAULT_MATH (TF32 tensor cores allowed on sm_80+) and
 * then each direction's descriptor takes the math type its chosen algorithm was
 * measured with, as cuDNN recommends. fp32 is the exact-comparison mode: it also
 * passes over FFT, FFT-tiling and non-fused Winograd algorithms, whose transforms
 * round more than a direct sum (tf32 may use everything).
 *
 * Precision bf16 (docs/model.md, "Precision bf16"; the CPU's rounding points,
 * conv_cpu.c): cuDNN's PSEUDO_BFLOAT16 configuration, x/w/y descriptors
 * CUDNN_DATA_BFLOAT16 with compute type CUDNN_DATA_FLOAT (fp32 accumulation) and
 * CUDNN_TENSOR_OP_MATH; each direction then keeps the math type its algorithm was
 * measured with (tensor-core bf16 or FMA: both read bf16 exactly and sum in fp32), and
 * transform algorithms are passed over as under fp32. The algorithm search (Find or the
 * heuristics) and the workspace sizes are asked with these bf16 descriptors. Activations,
 * parameters and gradients stay fp32 at the interface; the bf16 copies live in ctx->work
 * ahead of cuDNN's workspace (p->scratch bytes, sized for max_n), made on ctx->stream by
 * the cast kernels of kernels_cuda.cu (round to nearest even, core/bf16.h's rule):
 *   forward:  x and W rounded (W on every call: no copy outlives the call, so the
 *             optimizer's update is always seen); with a bias, y is first filled with
 *             the rounded bias and cuDNN adds the convolution with beta = 1 (one fp32 sum,
 *             one rounding, as the CPU's round(sum + round(b))); y rounded to bf16 by
 *             cuDNN, widened into the fp32 output
 *   backward: x, dy and W rounded; dx rounded by cuDNN, widened into (or added in fp32 to)
 *             the fp32 dx; db = fp32 sums of the rounded dy (a kernel); dW comes back
 *             from cuDNN in bf16 (its bf16 configuration has a bf16 dw descriptor, there
 *             is no float-dw variant) and is widened into the fp32 gradient arena: one
 *             rounding more than the CPU (which keeps the fp32 sum), at most 2^-9
 *             relative, as PyTorch's CUDA autocast does.
 * The copies are NHWC (x, dy: n h w c; W, dW: out_c kh kw in_c; NHWC descriptors) where
 * both channel counts are multiples of 8 (layout_nhwc): the casts write that order as
 * they round and the widenings read it back into NCHW, so it costs no launch.
 *
 * bf16 also passes over every algorithm cuDNN reports non-deterministic (perf_usable):
 * their atomics add partial sums in bf16.
 *
 * Determinism (ctx->deterministic, train.deterministic): only results cuDNN reports
 * CUDNN_DETERMINISTIC are considered, in all three directions, and the fallbacks are the
 * deterministic ALGO_1 of the backward passes instead of ALGO_0 (which adds with
 * atomics). Without ctx->benchmark (the default) nothing is timed: the candidates come in
 * cuDNN's heuristic order (cudnnGet*Algorithm_v7, a function of the shape, the GPU model
 * and the cuDNN version), so fresh runs agree too. With it the deterministic candidates
 * are timed and the fastest kept: a fresh run may choose otherwise (the timing decides),
 * the other ranks and a resume never do, because neither chooses:
 * ctx->conv_preset (rt_model_ctx_set_conv_algos: the checkpoint's record, or rank 0's
 * choice on the other ranks) is taken as it is for the shapes it names, after checking
 * that cuDNN accepts it here and that it fits RT_CUDA_CONV_WS_CAP (an error naming the
 * shape and the algorithm otherwise, never a silent substitute). Every choice, searched or
 * preset, is listed in ctx->conv_chosen for the caller to keep.
 *
 * Smaller batches (the last partial batch of an epoch): a second set of x/y descriptors
 * is re-described for that n when it changes (cudnnSetTensor4dDescriptor on existing
 * descriptors: host only, nothing allocated) and reuses the algorithms measured for the
 * full batch; if cuDNN rejects one of them for the smaller shape, or it would need more
 * workspace than ctx->work holds, that direction falls back to the zero-workspace
 * algorithm (IMPLICIT_GEMM / ALGO_0; ALGO_1 when deterministic), a function of the choice
 * and the workspace only, so a resume falls back identically; where cuDNN refuses the
 * fallback too, a call that needs that direction fails naming the layer, the batch and
 * the direction (dir_ready). bf16 has no second
 * set: its bf16 copies are sized for max_n anyway, so a smaller batch is padded with zero
 * images and runs as the full one (pad_tail; the reason is there).
 * Nothing allocates or synchronises in a step.
 */
#include "core/log.h"
#include "core/settings.h"
#include "model/cuda/cuda_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct conv_shape {
    int n;
    cudnnTensorDescriptor_t x, y;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    /* per direction (forward, backward-data, backward-filter): whether cuDNN takes an
     * algorithm for this shape within the workspace; where not (the spare set only), its
     * answer for the fallback and the workspace that asked, for the error at the call */
    bool ok[3];
    cudnnStatus_t why[3];
    size_t need[3];
} conv_shape;

typedef struct conv_priv {
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv_fwd, conv_bwd_data, conv_bwd_filter;
    cudnnTensorDescriptor_t bias; /* (1, out_c, 1, 1), fp32 */
    conv_shape full, spare;       /* full: max_n; spare: the last other n (-1: none) */
    int max_n;
    cudnnDataType_t dtype; /* of x, w, y: CUDNN_DATA_FLOAT, or CUDNN_DATA_BFLOAT16 under bf16 */
    /* bf16: byte offsets of the copies in ctx->work (x, y or dy, W, dW, dx; 256-aligned,
     * sized for max_n) and their total `scratch`, where cuDNN's workspace begins (0 in fp32) */
    size_t off_x, off_y, off_w, off_dw, off_dx, scratch;
    /* bf16: the copies (and the x, y and filter descriptors) are NHWC, the layout of
     * cuDNN's tensor-core kernels, made by the casts as they round (layout_nhwc) */
    bool nhwc;
    bool refused; /* prepare failed on a cuDNN refusal of the shape (the search's or the workspace query's
                     answer): with NHWC copies, the layer retries with NCHW ones */
    /* An NHWC activation format (ctx->act): x, y, dy and dx are handed to cuDNN as they are
     * (act_bf16: bf16, else fp32), with the weight copy (wcopy, written by
     * rt_conv2d_weights_refresh: KRSC, or KCRS on the fallback, x_c input channels).
     * fallback: cuDNN refused the NHWC shape, the layer converts its activations to NCHW
     * copies in ctx->work around the calls (off_x, off_y, off_dx). off_dw: dW in the copy's
     * layout and dtype, written into the fp32 OIHW gradient by a kernel. dw_own (deferred dW:
     * weight copies prepared with defer_grads): this layer's own dW scratch instead, written
     * into the gradient only by rt_conv2d_weights_grads (one launch for many layers). */
    bool act_nhwc, act_bf16, fallback;
    int xc; /* x's channels in the descriptors: l->x_c in an NHWC format, else l->in_c */
    const void *wcopy;
    void *dw_own;
} conv_priv;

static rt_status set_4d(cudnnTensorDescriptor_t d, bool nhwc, cudnnDataType_t t, int n, int c, int h, int w) {
    RT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, t, n, c, h, w));
    return RT_OK;
}

/* Whether a bf16 layer's copies are NHWC: cuDNN's bf16 tensor-core convolutions run in
 * NHWC (NVIDIA's guidance; given NCHW, cuDNN transposes around its kernel or runs a slower
 * one), and the casts that round x, W and dy anyway can write that order at no extra
 * launch. Where both channel counts are multiples of 8 (the tensor cores' granularity for
 * 16-bit data): the stems (1 or 3 input channels) stay NCHW. RINGTRAIN_CUDNN_LAYOUT=nchw
 * keeps every layer NCHW (for measurements). fp32 and tf32 are always NCHW. */
static rt_status layout_nhwc(const rt_model_ctx *ctx, const rt_conv2d *l, bool *nhwc) {
    if (ctx->act.layout == RT_ACT_NHWC) { /* the activations' own layout */
        *nhwc = true;
        return RT_OK;
    }
    int choice = 0; /* auto | nchw */
    RT_CHECK(rt_setting_choice(RT_SET_CUDNN_LAYOUT, &choice));
    *nhwc = ctx->precision == RT_PRECISION_BF16 && choice == 0 && l->in_c % 8 == 0 && l->out_c % 8 == 0;
    return RT_OK;
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* the bf16 copies' layout in ctx->work for batches up to max_n */
static void bf16_layout(conv_priv *p, const rt_conv2d *l, int max_n) {
    const size_t xb = sizeof(uint16_t) * (size_t)max_n * l->in_c * l->in_h * l->in_w;
    const size_t yb = sizeof(uint16_t) * (size_t)max_n * l->out_c * l->out_h * l->out_w;
    const size_t wb = sizeof(uint16_t) * (size_t)l->out_c * l->in_c * l->k * l->k;
    p->off_x = 0;
    p->off_y = p->off_x + align256(xb);
    p->off_w = p->off_y + align256(yb);
    p->off_dw = p->off_w + align256(wb);
    p->off_dx = p->off_dw + align256(wb);
    p->scratch = p->off_dx + align256(xb);
}

/* An NHWC format's scratch in ctx->work for batches up to max_n, in the activations'
 * dtype: dW in the copy's layout, then (fallback only) the NCHW copies of x, y or dy, dx */
static void act_layout(conv_priv *p, const rt_conv2d *l, int max_n) {
    const size_t es = p->act_bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t xb = es * (size_t)max_n * p->xc * l->in_h * l->in_w;
    const size_t yb = es * (size_t)max_n * l->out_c * l->out_h * l->out_w;
    p->off_dw = 0;
    p->off_x = p->off_dw + align256(es * (size_t)l->out_c * p->xc * l->k * l->k);
    p->off_y = p->off_x + (p->fallback ? align256(xb) : 0);
    p->off_dx = p->off_y + (p->fallback ? align256(yb) : 0);
    p->scratch = p->off_dx + (p->fallback ? align256(xb) : 0);
}

/* cuDNN's share of ctx->work: what follows the bf16 copies */
static size_t dnn_ws_bytes(const rt_model_ctx *ctx, const conv_priv *p) {
    return ctx->work_bytes > p->scratch ? ctx->work_bytes - p->scratch : 0;
}
static void *dnn_ws(const rt_model_ctx *ctx, const conv_priv *p) {
    return dnn_ws_bytes(ctx, p) ? (char *)ctx->work + p->scratch : NULL;
}
static void *work_at(const rt_model_ctx *ctx, size_t off) { return (char *)ctx->work + off; }

static rt_status shape_create(conv_shape *s) {
    s->n = -1;
    s->ok[0] = s->ok[1] = s->ok[2] = true;
    RT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&s->x));
    RT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&s->y));
    return RT_OK;
}

static void shape_destroy(conv_shape *s) {
    if (s->x) (void)cudnnDestroyTensorDescriptor(s->x);
    if (s->y) (void)cudnnDestroyTensorDescriptor(s->y);
    s->x = s->y = NULL;
}

static rt_status shape_set(conv_shape *s, const rt_conv2d *l, int xc, bool nhwc, cudnnDataType_t t, int n) {
    RT_CHECK(set_4d(s->x, nhwc, t, n, xc, l->in_h, l->in_w));
    RT_CHECK(set_4d(s->y, nhwc, t, n, l->out_c, l->out_h, l->out_w));
    s->n = n;
    return RT_OK;
}

void rt_cuda_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l) {
    (void)ctx;
    conv_priv *p = l->priv;
    if (!p) return;
    shape_destroy(&p->full);
    shape_destroy(&p->spare);
    if (p->w) (void)cudnnDestroyFilterDescriptor(p->w);
    if (p->conv_fwd) (void)cudnnDestroyConvolutionDescriptor(p->conv_fwd);
    if (p->conv_bwd_data) (void)cudnnDestroyConvolutionDescriptor(p->conv_bwd_data);
    if (p->conv_bwd_filter) (void)cudnnDestroyConvolutionDescriptor(p->conv_bwd_filter);
    if (p->bias) (void)cudnnDestroyTensorDescriptor(p->bias);
    free(p);
    l->priv = NULL;
}

static rt_status conv_desc(cudnnConvolutionDescriptor_t *d, const rt_conv2d *l, cudnnMathType_t math) {
    RT_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(d));
    /* CROSS_CORRELATION is what PyTorch's Conv2d computes */
    RT_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(*d, l->pad, l->pad, l->stride, l->stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(*d, math));
    return RT_OK;
}

/* Whether an algorithm's math is allowed: never fp32 -> fp16 down-conversion; under
 * fp32 no tensor cores and no transform algorithm with a larger rounding error than a
 * direct sum (`approx`: FFT, FFT tiling, non-fused Winograd), so fp32 results stay within
 * 1e-5 of the CPU's. */
static bool math_allowed(const rt_model_ctx *ctx, cudnnMathType_t m, bool approx) {
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    if (ctx->precision == RT_PRECISION_TF32) return true;
    if (ctx->precision == RT_PRECISION_BF16) return !approx; /* bf16 tensor cores or FMA: fp32 sums */
    return m != CUDNN_TENSOR_OP_MATH && !approx;
}

/* The math type the descriptors start with (and the fallbacks keep): fp32
 * CUDNN_FMA_MATH, tf32 CUDNN_DEFAULT_MATH, bf16 CUDNN_TENSOR_OP_MATH. */
static cudnnMathType_t desc_math(const rt_model_ctx *ctx) {
    if (ctx->precision == RT_PRECISION_TF32) return CUDNN_DEFAULT_MATH;
    return ctx->precision == RT_PRECISION_BF16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

/* Whether a measured result may be used: it succeeded, fits the workspace bound, is
 * deterministic when the context asks for it or the precision is bf16, and its math is
 * allowed. bf16 takes deterministic algorithms only: cuDNN's non-deterministic ones add
 * partial sums into the output with atomics, in the output's type, so a bf16 dW or dx
 * is rounded once per partial sum. Seen on an H200 (cuDNN 9.19, test_gpu_bf16,
 * 2026-11-28): conv 32->32 6x6 k3 n=6, dW 10.6 times the one-rounding bound off the CPU
 * (0.8047 for 0.9085), half its bits different. */
static bool perf_usable(const rt_model_ctx *ctx, cudnnStatus_t status, size_t memory, cudnnMathType_t m, bool approx,
                        cudnnDeterminism_t det) {
    if (status != CUDNN_STATUS_SUCCESS || memory > RT_CUDA_CONV_WS_CAP) return false;
    if ((ctx->deterministic || ctx->precision == RT_PRECISION_BF16) && det != CUDNN_DETERMINISTIC) return false;
    return math_allowed(ctx, m, approx);
}

/* The zero-workspace fallbacks of the backward passes: ALGO_0 adds with atomics (not
 * deterministic), ALGO_1 does not. (The forward's IMPLICIT_GEMM is deterministic.) In
 * bf16 always ALGO_1: ALGO_0's atomics could add partial sums into the bf16 dx/dW,
 * rounding many times where the CPU rounds once. */
static cudnnConvolutionBwdDataAlgo_t bwd_data_fallback(const rt_model_ctx *ctx) {
    return ctx->deterministic || ctx->precision == RT_PRECISION_BF16 ? CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
                                                                      : CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
}
static cudnnConvolutionBwdFilterAlgo_t bwd_filter_fallback(const rt_model_ctx *ctx) {
    return ctx->deterministic || ctx->precision == RT_PRECISION_BF16 ? CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
                                                                      : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
}

static bool fwd_approx(cudnnConvolutionFwdAlgo_t a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
static bool bwd_data_approx(cudnnConvolutionBwdDataAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
static bool bwd_filter_approx(cudnnConvolutionBwdFilterAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* The math type a direction's descriptor gets: fp32 always CUDNN_FMA_MATH (the search
 * ran under it); tf32 and bf16 the type the algorithm was measured with (cuDNN's advice). */
static cudnnMathType_t perf_math(const rt_model_ctx *ctx, cudnnMathType_t m) {
    return ctx->precision == RT_PRECISION_FP32 ? CUDNN_FMA_MATH : m;
}

/* ---- measurement --------------------------------------------------------------------- */

typedef struct find_bufs {
    void *x, *y, *w, *ws;
    size_t ws_bytes;
} find_bufs;

static void find_bufs_free(find_bufs *b) {
    if (b->x) (void)cudaFree(b->x);
    if (b->y) (void)cudaFree(b->y);
    if (b->w) (void)cudaFree(b->w);
    if (b->ws) (void)cudaFree(b->ws);
    *b = (find_bufs){0};
}

/* The largest workspace any algorithm of the three directions asks for, capped. */
static size_t largest_workspace(cudnnHandle_t h, const conv_priv *p) {
    size_t most = 0, ws;
    for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; a++)
        if (cudnnGetConvolutionForwardWorkspaceSize(h, p->full.x, p->w, p->conv_fwd, p->full.y,
                                                    (cudnnConvolutionFwdAlgo_t)a, &ws) == CUDNN_STATUS_SUCCESS &&
            ws > most)
            most = ws;
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; a++)
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->full.y, p->conv_bwd_data, p->full.x,
                                                         (cudnnConvolutionBwdDataAlgo_t)a,
                                                         &ws) == CUDNN_STATUS_SUCCESS &&
            ws > most)
            most = ws;
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; a++)
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->full.x, p->full.y, p->conv_bwd_filter, p->w,
                                                           (cudnnConvolutionBwdFilterAlgo_t)a,
                                                           &ws) == CUDNN_STATUS_SUCCESS &&
            ws > most)
            most = ws;
    return most < RT_CUDA_CONV_WS_CAP ? most : RT_CUDA_CONV_WS_CAP;
}

typedef struct perf_lists {
    cudnnConvolutionFwdAlgoPerf_t fr[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t dr[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t wr[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int nf, nd, nw;
} perf_lists;

/* Without ctx->benchmark: cuDNN's heuristic ranking (cudnnGet*Algorithm_v7: nothing runs,
 * nothing is timed), a function of the shape, the GPU model and the cuDNN version only,
 * so a fresh run, a rerun and every rank of one GPU model rank alike (PyTorch with
 * cudnn.benchmark off). */
static rt_status ask(rt_model_ctx *ctx, const rt_conv2d *l, conv_priv *p, perf_lists *pl) {
    rt_cuda_state *s = cuda_state(ctx);
    cudnnStatus_t cs = cudnnGetConvolutionForwardAlgorithm_v7(s->dnn, p->full.x, p->w, p->conv_fwd, p->full.y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &pl->nf, pl->fr);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = cudnnGetConvolutionBackwardDataAlgorithm_v7(s->dnn, p->w, p->full.y, p->conv_bwd_data, p->full.x,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &pl->nd, pl->dr);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = cudnnGetConvolutionBackwardFilterAlgorithm_v7(s->dnn, p->full.x, p->full.y, p->conv_bwd_filter, p->w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &pl->nw, pl->wr);
    p->refused = cs != CUDNN_STATUS_SUCCESS;
    if (cs != CUDNN_STATUS_SUCCESS)
        RT_FAIL(RT_ERR_CUDA, "conv2d %d->%d %dx%d k%d s%d: cuDNN algorithm heuristics: %s", l->in_c, l->out_c, l->in_h,
                l->in_w, l->k, l->stride, cudnnGetErrorString(cs));
    return RT_OK;
}

/* With ctx->benchmark: every candidate run and timed on scratch buffers
 * (cudnnFind*AlgorithmEx; PyTorch's cudnn.benchmark). */
static rt_status measure(rt_model_ctx *ctx, const rt_conv2d *l, conv_priv *p, perf_lists *pl) {
    rt_cuda_state *s = cuda_state(ctx);
    const size_t es = p->dtype == CUDNN_DATA_BFLOAT16 ? sizeof(uint16_t) : sizeof(float);
    const size_t xb = es * (size_t)p->max_n * p->xc * l->in_h * l->in_w;
    const size_t yb = es * (size_t)p->max_n * l->out_c * l->out_h * l->out_w;
    const size_t wb = es * (size_t)l->out_c * p->xc * l->k * l->k;
    find_bufs b = {0};
    /* scratch at the real sizes: x doubles as dx, y as dy, w as dw (never the model's
     * own buffers, so measuring cannot disturb parameters or gradients) */
    b.ws_bytes = largest_workspace(s->dnn, p);
    cudaError_t e = cudaMalloc(&b.x, xb);
    if (e == cudaSuccess) e = cudaMalloc(&b.y, yb);
    if (e == cudaSuccess) e = cudaMalloc(&b.w, wb);
    if (e == cudaSuccess && b.ws_bytes) {
        /* a workspace that does not fit is measured with less (down to none) */
        for (;;) {
            b.ws = NULL;
            if (cudaMalloc(&b.ws, b.ws_bytes) == cudaSuccess) break;
            (void)cudaGetLastError();
            b.ws = NULL;
            if (b.ws_bytes <= ((size_t)1 << 20)) {
                b.ws_bytes = 0;
                break;
            }
            b.ws_bytes /= 2;
        }
    }
    if (e == cudaSuccess) e = cudaMemsetAsync(b.x, 0, xb, s->stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(b.y, 0, yb, s->stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(b.w, 0, wb, s->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        find_bufs_free(&b);
        RT_FAIL(RT_ERR_CUDA, "conv2d %d->%d %dx%d k%d: scratch for the algorithm search (%zu + %zu bytes): %s", l->in_c,
                l->out_c, l->in_h, l->in_w, l->k, xb, yb, cudaGetErrorString(e));
    }

    cudnnStatus_t cs =
        cudnnFindConvolutionForwardAlgorithmEx(s->dnn, p->full.x, b.x, p->w, b.w, p->conv_fwd, p->full.y, b.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &pl->nf, pl->fr, b.ws, b.ws_bytes);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = cudnnFindConvolutionBackwardDataAlgorithmEx(s->dnn, p->w, b.w, p->full.y, b.y, p->conv_bwd_data, p->full.x,
                                                         b.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &pl->nd, pl->dr,
                                                         b.ws, b.ws_bytes);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = cudnnFindConvolutionBackwardFilterAlgorithmEx(s->dnn, p->full.x, b.x, p->full.y, b.y, p->conv_bwd_filter,
                                                           p->w, b.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &pl->nw,
                                                           pl->wr, b.ws, b.ws_bytes);
    find_bufs_free(&b);
    p->refused = cs != CUDNN_STATUS_SUCCESS;
    if (cs != CUDNN_STATUS_SUCCESS)
        RT_FAIL(RT_ERR_CUDA, "conv2d %d->%d %dx%d k%d s%d: cuDNN algorithm search: %s", l->in_c, l->out_c, l->in_h,
                l->in_w, l->k, l->stride, cudnnGetErrorString(cs));
    return RT_OK;
}

static rt_status find_algos(rt_model_ctx *ctx, const rt_conv2d *l, conv_priv *p, rt_cuda_conv_algos *out) {
    perf_lists pl = {.nf = 0};
    if (ctx->benchmark)
        RT_CHECK(measure(ctx, l, p, &pl));
    else
        RT_CHECK(ask(ctx, l, p, &pl));
    const cudnnConvolutionFwdAlgoPerf_t *fr = pl.fr;
    const cudnnConvolutionBwdDataAlgoPerf_t *dr = pl.dr;
    const cudnnConvolutionBwdFilterAlgoPerf_t *wr = pl.wr;
    const int nf = pl.nf, nd = pl.nd, nw = pl.nw;

    /* results come ranked (by time, or by the heuristics): keep the first usable one; the
     * zero-workspace algorithms are the fallback if none is (deterministic ones when asked) */
    out->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    out->fwd_math = desc_math(ctx);
    out->fwd_ws = 0;
    for (int i = 0; i < nf; i++)
        if (perf_usable(ctx, fr[i].status, fr[i].memory, fr[i].mathType, fwd_approx(fr[i].algo), fr[i].determinism)) {
            out->fwd = fr[i].algo, out->fwd_math = perf_math(ctx, fr[i].mathType), out->fwd_ws = fr[i].memory;
            break;
        }
    out->bwd_data = bwd_data_fallback(ctx);
    out->bwd_data_math = out->fwd_math;
    out->bwd_data_ws = 0;
    for (int i = 0; i < nd; i++)
        if (perf_usable(ctx, dr[i].status, dr[i].memory, dr[i].mathType, bwd_data_approx(dr[i].algo),
                        dr[i].determinism)) {
            out->bwd_data = dr[i].algo, out->bwd_data_math = perf_math(ctx, dr[i].mathType),
            out->bwd_data_ws = dr[i].memory;
            break;
        }
    out->bwd_filter = bwd_filter_fallback(ctx);
    out->bwd_filter_math = out->fwd_math;
    out->bwd_filter_ws = 0;
    for (int i = 0; i < nw; i++)
        if (perf_usable(ctx, wr[i].status, wr[i].memory, wr[i].mathType, bwd_filter_approx(wr[i].algo),
                        wr[i].determinism)) {
            out->bwd_filter = wr[i].algo, out->bwd_filter_math = perf_math(ctx, wr[i].mathType),
            out->bwd_filter_ws = wr[i].memory;
            break;
        }
    RT_LOG_DEBUG("conv2d %d->%d %dx%d k%d s%d n%d (%s%s): fwd algo %d (math %d, %zu B), bwd-data %d (math %d, %zu B), "
                 "bwd-filter %d (math %d, %zu B)",
                 l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, p->max_n, ctx->benchmark ? "timed" : "heuristic",
                 ctx->deterministic ? ", deterministic" : "", (int)out->fwd, (int)out->fwd_math, out->fwd_ws,
                 (int)out->bwd_data, (int)out->bwd_data_math, out->bwd_data_ws, (int)out->bwd_filter,
                 (int)out->bwd_filter_math, out->bwd_filter_ws);
    return RT_OK;
}

static rt_cuda_conv_algos *cache_find(rt_model_ctx *ctx, const rt_conv2d *l, int n, bool nhwc) {
    rt_cuda_state *s = cuda_state(ctx);
    for (int i = 0; i < s->nalgos; i++) {
        rt_cuda_conv_algos *a = &s->algos[i];
        if (a->in_c == l->in_c && a->out_c == l->out_c && a->in_h == l->in_h && a->in_w == l->in_w && a->k == l->k &&
            a->stride == l->stride && a->pad == l->pad && a->n == n && a->precision == (int)ctx->precision &&
            a->nhwc == (int)nhwc && !a->refused)
            return a;
    }
    return NULL;
}

/* NHWC copies of this shape were refused by cuDNN before (nhwc_refused_put): NCHW at once,
 * without a second search that would fail the same way */
static bool nhwc_refused(rt_model_ctx *ctx, const rt_conv2d *l, int n) {
    const rt_cuda_state *s = cuda_state(ctx);
    for (int i = 0; i < s->nalgos; i++) {
        const rt_cuda_conv_algos *a = &s->algos[i];
        if (a->refused && a->in_c == l->in_c && a->out_c == l->out_c && a->in_h == l->in_h && a->in_w == l->in_w &&
            a->k == l->k && a->stride == l->stride && a->pad == l->pad && a->n == n &&
            a->precision == (int)ctx->precision)
            return true;
    }
    return false;
}
static void nhwc_refused_put(rt_model_ctx *ctx, const rt_conv2d *l, int n) {
    rt_cuda_state *s = cuda_state(ctx);
    if (s->nalgos >= RT_CUDA_ALGO_CACHE) return;
    s->algos[s->nalgos++] = (rt_cuda_conv_algos){.in_c = l->in_c,
                                                 .out_c = l->out_c,
                                                 .in_h = l->in_h,
                                                 .in_w = l->in_w,
                                                 .k = l->k,
                                                 .stride = l->stride,
                                                 .pad = l->pad,
                                                 .n = n,
                                                 .precision = (int)ctx->precision,
                                                 .nhwc = 1,
                                                 .refused = true};
}

/* Cache the choice and list it for rt_model_ctx_get_conv_algos. */
static void cache_put(rt_model_ctx *ctx, const rt_conv2d *l, int n, bool nhwc, rt_cuda_conv_algos *a) {
    rt_cuda_state *s = cuda_state(ctx);
    a->in_c = l->in_c, a->out_c = l->out_c, a->in_h = l->in_h, a->in_w = l->in_w, a->k = l->k;
    a->stride = l->stride, a->pad = l->pad, a->n = n, a->precision = (int)ctx->precision, a->nhwc = nhwc;
    a->refused = false;
    if (s->nalgos < RT_CUDA_ALGO_CACHE) s->algos[s->nalgos++] = *a;
    rt_conv_algos *chosen = ctx->conv_chosen;
    if (chosen->n < RT_CONV_ALGOS_MAX)
        chosen->a[chosen->n++] = (rt_conv_algo){.in_c = a->in_c,
                                                .out_c = a->out_c,
                                                .in_h = a->in_h,
                                                .in_w = a->in_w,
                                                .k = a->k,
                                                .stride = a->stride,
                                                .pad = a->pad,
                                                .n = a->n,
                                                .precision = a->precision,
                                                .fwd = (int)a->fwd,
                                                .bwd_data = (int)a->bwd_data,
                                                .bwd_filter = (int)a->bwd_filter,
                                                .fwd_math = (int)a->fwd_math,
                                                .bwd_data_math = (int)a->bwd_data_math,
                                                .bwd_filter_math = (int)a->bwd_filter_math,
                                                .nhwc = a->nhwc};
}

/* The preset choice for this layer's shape and copies' layout (rt_model_ctx_set_conv_algos),
 * or NULL. A shape preset with NCHW copies only makes the layer use NCHW copies in the
 * first place (preset_says_nchw); one preset with NHWC copies under
 * RINGTRAIN_CUDNN_LAYOUT=nchw is not taken (the layer searches). */
static const rt_conv_algo *preset_find(const rt_model_ctx *ctx, const rt_conv2d *l, int n, bool nhwc) {
    const rt_conv_algos *pre = ctx->conv_preset;
    for (int i = 0; i < pre->n; i++) {
        const rt_conv_algo *a = &pre->a[i];
        if (a->in_c == l->in_c && a->out_c == l->out_c && a->in_h == l->in_h && a->in_w == l->in_w && a->k == l->k &&
            a->stride == l->stride && a->pad == l->pad && a->n == n && a->precision == (int)ctx->precision &&
            a->nhwc == (int)nhwc)
            return a;
    }
    return NULL;
}

/* A preset names this shape with NCHW copies and none with NHWC ones (rank 0 fell back to
 * NCHW for it, or a checkpoint from before the NHWC copies): the layer takes that layout
 * and that choice, so every rank and a deterministic resume run what the record says. */
static bool preset_says_nchw(const rt_model_ctx *ctx, const rt_conv2d *l, int n) {
    if (ctx->precision != RT_PRECISION_BF16 || ctx->act.layout == RT_ACT_NHWC) return false;
    return preset_find(ctx, l, n, false) != NULL && preset_find(ctx, l, n, true) == NULL;
}

/* Where the run's layout is fixed (an NHWC activation format; fp32 NCHW activations
 * under fp32 or tf32: only bf16 in fp32 NCHW picks its copies' layout per shape), a
 * search for a shape the preset records with the other layout only is an error naming
 * the shape: the record comes from another activation format (a checkpoint of another
 * version or format), and following it would mean another layout. */
static rt_status preset_layout_check(const rt_model_ctx *ctx, const rt_conv2d *l, const conv_priv *p, int n) {
    const bool fixed = p->act_nhwc || ctx->precision != RT_PRECISION_BF16;
    if (!fixed || preset_find(ctx, l, n, p->nhwc) || !preset_find(ctx, l, n, !p->nhwc)) return RT_OK;
    RT_FAIL(RT_ERR_INVALID,
            "conv2d %d->%d %dx%d k%d s%d p%d n%d (%s): the given algorithm choice (a checkpoint's or rank 0's) was "
            "recorded for %s tensors, this run gives cuDNN %s ones (activation format %s %s): a layout mismatch "
            "between the record and the run; resume in the format it was made in, or without the record",
            l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, l->pad, n, rt_precision_name(ctx->precision),
            p->nhwc ? "NCHW" : "NHWC", p->nhwc ? "NHWC" : "NCHW", ctx->act.dtype == RT_BF16 ? "bf16" : "fp32",
            ctx->act.layout == RT_ACT_NHWC ? "NHWC" : "NCHW");
}

static bool math_known(int m) {
    return m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
           m == CUDNN_FMA_MATH;
}

/* One direction of a preset: a known algorithm number and math type, allowed by the
 * precision (fp32: CUDNN_FMA_MATH and no transform algorithm, as the search would), that
 * cuDNN accepts for the shape (it answers its workspace size) within the workspace
 * bound. `what` names the direction in the errors. */
static rt_status preset_check(const rt_model_ctx *ctx, const char *shape, const char *what, int algo, int count,
                              int math, bool approx) {
    RT_REQUIRE(algo >= 0 && algo < count, RT_ERR_INVALID,
               "%s: the given %s algorithm %d is unknown to this cuDNN (0..%d): chosen with another cuDNN version?",
               shape, what, algo, count - 1);
    RT_REQUIRE(math_known(math), RT_ERR_INVALID, "%s: the given %s math type %d is unknown to this cuDNN", shape, what,
               math);
    RT_REQUIRE(math_allowed(ctx, (cudnnMathType_t)math, approx) &&
                   (ctx->precision != RT_PRECISION_FP32 || math == CUDNN_FMA_MATH),
               RT_ERR_INVALID, "%s: the given %s algorithm %d with math type %d is not allowed under precision %s",
               shape, what, algo, math, rt_precision_name(ctx->precision));
    return RT_OK;
}

static rt_status preset_workspace(const char *shape, const char *what, int algo, cudnnStatus_t cs, size_t ws) {
    RT_REQUIRE(cs == CUDNN_STATUS_SUCCESS, RT_ERR_INVALID,
               "%s: the given %s algorithm %d cannot run here (cuDNN: %s): chosen on another GPU model or cuDNN "
               "version?",
               shape, what, algo, cudnnGetErrorString(cs));
    RT_REQUIRE(ws <= RT_CUDA_CONV_WS_CAP, RT_ERR_INVALID,
               "%s: the given %s algorithm %d needs %zu bytes of workspace, more than the %zu allowed "
               "(RT_CUDA_CONV_WS_CAP)",
               shape, what, algo, ws, (size_t)RT_CUDA_CONV_WS_CAP);
    return RT_OK;
}

/* Take a preset choice for this layer (no search, no timing), validated as above. The
 * descriptors get its math types here; conv_prepare sets them again from *out. */
static rt_status preset_take(rt_model_ctx *ctx, const rt_conv2d *l, conv_priv *p, const rt_conv_algo *pre,
                             rt_cuda_conv_algos *out) {
    char shape[128];
    snprintf(shape, sizeof shape, "conv2d %d->%d %dx%d k%d s%d p%d n%d%s", l->in_c, l->out_c, l->in_h, l->in_w, l->k,
             l->stride, l->pad, p->max_n, p->nhwc ? " (NHWC bf16 copies)" : "");
    RT_CHECK(preset_check(ctx, shape, "forward", pre->fwd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, pre->fwd_math,
                          pre->fwd >= 0 && fwd_approx((cudnnConvolutionFwdAlgo_t)pre->fwd)));
    RT_CHECK(preset_check(ctx, shape, "backward-data", pre->bwd_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                          pre->bwd_data_math,
                          pre->bwd_data >= 0 && bwd_data_approx((cudnnConvolutionBwdDataAlgo_t)pre->bwd_data)));
    RT_CHECK(preset_check(ctx, shape, "backward-filter", pre->bwd_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                          pre->bwd_filter_math,
                          pre->bwd_filter >= 0 && bwd_filter_approx((cudnnConvolutionBwdFilterAlgo_t)pre->bwd_filter)));
    /* bf16 keeps to deterministic algorithms (perf_usable): the backward passes' atomic
     * ones would round a bf16 dx/dW once per partial sum */
    RT_REQUIRE(ctx->precision != RT_PRECISION_BF16 || (pre->bwd_data != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 &&
                                                       pre->bwd_filter != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 &&
                                                       pre->bwd_filter != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3),
               RT_ERR_INVALID,
               "%s: the given backward algorithms (data %d, filter %d) add with atomics, which under precision bf16 "
               "round each partial sum: not allowed",
               shape, pre->bwd_data, pre->bwd_filter);
    out->fwd = (cudnnConvolutionFwdAlgo_t)pre->fwd;
    out->bwd_data = (cudnnConvolutionBwdDataAlgo_t)pre->bwd_data;
    out->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)pre->bwd_filter;
    out->fwd_math = (cudnnMathType_t)pre->fwd_math;
    out->bwd_data_math = (cudnnMathType_t)pre->bwd_data_math;
    out->bwd_filter_math = (cudnnMathType_t)pre->bwd_filter_math;
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_fwd, out->fwd_math));
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_bwd_data, out->bwd_data_math));
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_bwd_filter, out->bwd_filter_math));
    cudnnHandle_t h = cuda_state(ctx)->dnn;
    cudnnStatus_t cs =
        cudnnGetConvolutionForwardWorkspaceSize(h, p->full.x, p->w, p->conv_fwd, p->full.y, out->fwd, &out->fwd_ws);
    RT_CHECK(preset_workspace(shape, "forward", pre->fwd, cs, out->fwd_ws));
    cs = cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->full.y, p->conv_bwd_data, p->full.x, out->bwd_data,
                                                      &out->bwd_data_ws);
    RT_CHECK(preset_workspace(shape, "backward-data", pre->bwd_data, cs, out->bwd_data_ws));
    cs = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->full.x, p->full.y, p->conv_bwd_filter, p->w,
                                                        out->bwd_filter, &out->bwd_filter_ws);
    RT_CHECK(preset_workspace(shape, "backward-filter", pre->bwd_filter, cs, out->bwd_filter_ws));
    RT_LOG_DEBUG("%s: given fwd algo %d (math %d), bwd-data %d (math %d), bwd-filter %d (math %d)", shape, pre->fwd,
                 pre->fwd_math, pre->bwd_data, pre->bwd_data_math, pre->bwd_filter, pre->bwd_filter_math);
    return RT_OK;
}

/* The workspace cuDNN wants for algorithm `algo` of direction d (0 forward, 1
 * backward-data, 2 backward-filter) on shape s, or its refusal. */
static cudnnStatus_t spare_ws(cudnnHandle_t h, const conv_priv *p, const conv_shape *s, int d, int algo, size_t *ws) {
    if (d == 0)
        return cudnnGetConvolutionForwardWorkspaceSize(h, s->x, p->w, p->conv_fwd, s->y,
                                                       (cudnnConvolutionFwdAlgo_t)algo, ws);
    if (d == 1)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, s->y, p->conv_bwd_data, s->x,
                                                            (cudnnConvolutionBwdDataAlgo_t)algo, ws);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, s->x, s->y, p->conv_bwd_filter, p->w,
                                                          (cudnnConvolutionBwdFilterAlgo_t)algo, ws);
}

/* ---- prepare ------------------------------------------------------------------------- */

/* The layer's data: the activation format's (ctx->act) dtype and layout, x's stored
 * channels, and the scratch it needs in ctx->work (the bf16 copies of the fp32 NCHW
 * format's bf16 precision, or an NHWC format's dW and fallback copies). */
static rt_status data_mode(const rt_model_ctx *ctx, const rt_conv2d *l, conv_priv *p, int max_n, bool allow_nhwc) {
    const rt_act_format f = ctx->act;
    p->act_nhwc = f.layout == RT_ACT_NHWC;
    p->act_bf16 = f.dtype == RT_BF16;
    p->xc = p->act_nhwc ? l->x_c : l->in_c;
    RT_REQUIRE(p->act_nhwc || (!p->act_bf16 && l->x_c == l->in_c), RT_ERR_UNSUPPORTED,
               "conv2d %d->%d on cuda: %s NCHW activations with %d stored input channels (expected fp32 NCHW with %d, "
               "or an NHWC format)",
               l->in_c, l->out_c, p->act_bf16 ? "bf16" : "fp32", l->x_c, l->in_c);
    RT_REQUIRE(!p->act_nhwc || (p->act_bf16 == (ctx->precision == RT_PRECISION_BF16) && l->x_c >= l->in_c),
               RT_ERR_UNSUPPORTED,
               "conv2d %d->%d on cuda: %s NHWC activations (%d stored input channels) under precision %s (expected bf16 "
               "activations with precision bf16, fp32 ones with fp32 or tf32, at least %d channels)",
               l->in_c, l->out_c, p->act_bf16 ? "bf16" : "fp32", l->x_c, rt_precision_name(ctx->precision), l->in_c);
    const bool bf16 = p->act_nhwc ? p->act_bf16 : ctx->precision == RT_PRECISION_BF16;
    p->dtype = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    RT_CHECK(layout_nhwc(ctx, l, &p->nhwc));
    p->nhwc = p->nhwc && allow_nhwc;
    p->fallback = p->act_nhwc && !p->nhwc;
    if (p->act_nhwc)
        act_layout(p, l, max_n);
    else if (bf16)
        bf16_layout(p, l, max_n);
    return RT_OK;
}

static rt_status conv_prepare(rt_model_ctx *ctx, rt_conv2d *l, conv_priv *p, int max_n, bool allow_nhwc,
                              size_t *workspace) {
    const cudnnMathType_t math = desc_math(ctx);
    p->max_n = max_n;
    RT_CHECK(data_mode(ctx, l, p, max_n, allow_nhwc));
    RT_CHECK_CUDNN(cudnnCreateFilterDescriptor(&p->w));
    RT_CHECK_CUDNN(cudnnSetFilter4dDescriptor(p->w, p->dtype, p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, l->out_c,
                                              p->xc, l->k, l->k));
    RT_CHECK(conv_desc(&p->conv_fwd, l, math));
    RT_CHECK(conv_desc(&p->conv_bwd_data, l, math));
    RT_CHECK(conv_desc(&p->conv_bwd_filter, l, math));
    RT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&p->bias));
    RT_CHECK(set_4d(p->bias, false, CUDNN_DATA_FLOAT, 1, l->out_c, 1, 1));
    RT_CHECK(shape_create(&p->full));
    RT_CHECK(shape_create(&p->spare));
    RT_CHECK(shape_set(&p->full, l, p->xc, p->nhwc, p->dtype, max_n));
    /* cuDNN must agree on the output shape */
    int on, oc, oh, ow;
    RT_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(p->conv_fwd, p->full.x, p->w, &on, &oc, &oh, &ow));
    RT_REQUIRE(on == max_n && oc == l->out_c && oh == l->out_h && ow == l->out_w, RT_ERR_INTERNAL,
               "conv2d: cuDNN output %dx%dx%dx%d, expected %dx%dx%dx%d", on, oc, oh, ow, max_n, l->out_c, l->out_h,
               l->out_w);

    rt_cuda_conv_algos a = {0}; /* every field set: cache_put copies all of it, refused included */
    rt_cuda_conv_algos *hit = cache_find(ctx, l, max_n, p->nhwc);
    const rt_conv_algo *pre = NULL;
    if (hit) {
        a = *hit;
    } else {
        pre = preset_find(ctx, l, max_n, p->nhwc);
        if (pre)
            RT_CHECK(preset_take(ctx, l, p, pre, &a));
        else
            RT_CHECK(find_algos(ctx, l, p, &a));
    }
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_fwd, a.fwd_math));
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_bwd_data, a.bwd_data_math));
    RT_CHECK_CUDNN(cudnnSetConvolutionMathType(p->conv_bwd_filter, a.bwd_filter_math));
    p->full.fwd = a.fwd;
    p->full.bwd_data = a.bwd_data;
    p->full.bwd_filter = a.bwd_filter;
    /* the workspace the chosen algorithms need with the final math types; a refusal here
     * (cuDNN runs none of the search's results nor the fallback) names the layer */
    static const char *const dir_names[3] = {"forward", "backward-data", "backward-filter"};
    const int algo[3] = {(int)a.fwd, (int)a.bwd_data, (int)a.bwd_filter};
    size_t need = 0;
    for (int d = 0; d < 3; d++) {
        size_t ws = 0;
        cudnnStatus_t cs = spare_ws(cuda_state(ctx)->dnn, p, &p->full, d, algo[d], &ws);
        p->refused = cs != CUDNN_STATUS_SUCCESS;
        RT_REQUIRE(cs == CUDNN_STATUS_SUCCESS, RT_ERR_CUDA,
                   "conv2d %d->%d %dx%d k%d s%d batch %d, %s%s: cuDNN runs no %s algorithm (algorithm %d: %s)",
                   l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, max_n, rt_precision_name(ctx->precision),
                   p->nhwc ? " on NHWC copies" : "", dir_names[d], algo[d], cudnnGetErrorString(cs));
        if (ws > need) need = ws;
    }
    /* a search where the record names the shape with the other layout: an error, never a
     * silent second choice (after the refusals: an NHWC layer cuDNN refuses falls back to
     * NCHW, and takes the record's NCHW choice then) */
    if (!hit && !pre) RT_CHECK(preset_layout_check(ctx, l, p, max_n));
    /* only a choice whose workspace cuDNN answers (it takes the algorithm for the shape) is
     * kept and listed */
    if (!hit) cache_put(ctx, l, max_n, p->nhwc, &a);
    *workspace = p->scratch + need; /* the bf16 copies (none in fp32), then cuDNN's */
    return RT_OK;
}

/* cuDNN refused the NHWC shape (the error being set says how): said once per shape in the
 * fp32 NCHW format's bf16 copies, once per process in an NHWC format (its later fallbacks
 * at debug level: every fallback layer's conversions are in the ledger anyway) */
static void warn_refused(const rt_model_ctx *ctx, const rt_conv2d *l, int max_n) {
    static atomic_int warned;
    const char *m = rt_error_message();
    const int len = strchr(m, '\n') ? (int)(strchr(m, '\n') - m) : (int)strlen(m);
    if (ctx->act.layout != RT_ACT_NHWC) {
        RT_LOG_WARN("conv2d %d->%d %dx%d k%d s%d batch %d, bf16: cuDNN refuses NHWC copies (%.*s); this shape runs on "
                    "NCHW copies",
                    l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, max_n, len, m);
    } else if (atomic_exchange(&warned, 1) == 0) {
        RT_LOG_WARN("conv2d %d->%d %dx%d k%d s%d batch %d: cuDNN refuses NHWC %s tensors (%.*s); the layer converts its "
                    "activations to NCHW and back around each call (said once per process; other such layers at "
                    "debug level)",
                    l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, max_n,
                    ctx->act.dtype == RT_BF16 ? "bf16" : "fp32", len, m);
    } else {
        RT_LOG_DEBUG("conv2d %d->%d %dx%d k%d s%d batch %d: NCHW fallback (%.*s)", l->in_c, l->out_c, l->in_h, l->in_w,
                     l->k, l->stride, max_n, len, m);
    }
}

rt_status rt_cuda_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace) {
    RT_CHECK(rt_cuda_bind(ctx));
    if (l->priv) rt_cuda_conv2d_release(ctx, l);
    conv_priv *p = calloc(1, sizeof *p);
    RT_CHECK_ALLOC(p, sizeof *p);
    l->priv = p;
    const bool allow_nhwc = !nhwc_refused(ctx, l, max_n) && !preset_says_nchw(ctx, l, max_n);
    rt_status st = conv_prepare(ctx, l, p, max_n, allow_nhwc, workspace);
    if (st == RT_ERR_CUDA && p->nhwc && p->refused) {
        /* cuDNN answers the search, or the workspace of the chosen algorithm, with a
         * refusal of this shape's NHWC bf16 copies: the layer keeps NCHW copies (slower,
         * the same numbers), said once per shape; its choice is listed as an NCHW one, so
         * the other ranks and a resume follow it (preset_says_nchw) */
        warn_refused(ctx, l, max_n);
        rt_error_clear();
        nhwc_refused_put(ctx, l, max_n);
        rt_cuda_conv2d_release(ctx, l);
        p = calloc(1, sizeof *p);
        RT_CHECK_ALLOC(p, sizeof *p);
        l->priv = p;
        st = conv_prepare(ctx, l, p, max_n, false, workspace);
    }
    if (st != RT_OK) {
        rt_error_trace(__FILE__, __LINE__, "conv2d prepare");
        rt_cuda_conv2d_release(ctx, l);
        return st;
    }
    return RT_OK;
}

/* ---- per-step shape ------------------------------------------------------------------ */

/* Direction d may run on shape s: else an error naming the layer, the batch, the
 * direction and cuDNN's answer (not cuDNN's BAD_PARAM from inside a step). Only the
 * directions a call runs are asked: an evaluation's forward runs even where cuDNN has
 * no backward algorithm for that batch. */
static rt_status dir_ready(const rt_conv2d *l, const conv_priv *p, const conv_shape *s, int n, int d) {
    static const char *const names[3] = {"forward", "backward-data", "backward-filter"};
    const int algo[3] = {(int)s->fwd, (int)s->bwd_data, (int)s->bwd_filter};
    RT_REQUIRE(s->ok[d], RT_ERR_CUDA,
               "conv2d %d->%d %dx%d k%d s%d: batch %d (prepared %d): cuDNN runs no %s algorithm for it (the fallback "
               "%d: %s, %zu bytes of workspace needed)",
               l->in_c, l->out_c, l->in_h, l->in_w, l->k, l->stride, n, p->max_n, names[d], algo[d],
               cudnnGetErrorString(s->why[d]), s->need[d]);
    return RT_OK;
}

/* The descriptors for batch n: the full set, or the spare set re-described for n. */
static rt_status shape_for(rt_model_ctx *ctx, rt_conv2d *l, int n, conv_shape **out) {
    conv_priv *p = l->priv;
    RT_REQUIRE(p != NULL, RT_ERR_INVALID, "conv2d on cuda: layer not prepared (rt_conv2d_prepare)");
    RT_REQUIRE(n <= p->max_n, RT_ERR_INVALID, "conv2d: batch %d larger than the prepared %d", n, p->max_n);
    /* bf16 runs every batch at max_n: its copies are padded with zero images (pad_tail), its
     * bf16 activations get zero tails (zero_tails) */
    if (n == p->max_n || p->dtype == CUDNN_DATA_BFLOAT16) {
        *out = &p->full;
        return RT_OK;
    }
    conv_shape *s = &p->spare;
    if (s->n != n) {
        cudnnHandle_t h = cuda_state(ctx)->dnn;
        RT_CHECK(shape_set(s, l, p->xc, p->nhwc, p->dtype, n));
        const size_t avail = dnn_ws_bytes(ctx, p);
        /* per direction: the full batch's algorithm, else the fallback, where cuDNN answers
         * its workspace for this shape within what ctx->work holds */
        const int full[3] = {(int)p->full.fwd, (int)p->full.bwd_data, (int)p->full.bwd_filter};
        const int fallback[3] = {(int)CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, (int)bwd_data_fallback(ctx),
                                 (int)bwd_filter_fallback(ctx)};
        int pick[3];
        for (int d = 0; d < 3; d++) {
            size_t ws = 0;
            cudnnStatus_t cs = spare_ws(h, p, s, d, full[d], &ws);
            pick[d] = full[d];
            if (cs != CUDNN_STATUS_SUCCESS || ws > avail) {
                pick[d] = fallback[d];
                ws = 0;
                cs = spare_ws(h, p, s, d, fallback[d], &ws);
            }
            s->ok[d] = cs == CUDNN_STATUS_SUCCESS && ws <= avail;
            s->why[d] = cs;
            s->need[d] = cs == CUDNN_STATUS_SUCCESS ? ws : 0;
        }
        s->fwd = (cudnnConvolutionFwdAlgo_t)pick[0];
        s->bwd_data = (cudnnConvolutionBwdDataAlgo_t)pick[1];
        s->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)pick[2];
    }
    *out = s;
    return RT_OK;
}

/* ---- forward / backward -------------------------------------------------------------- */

/* bf16: the copies fit ctx->work (rt_conv2d_prepare + rt_model_ctx_reserve ran) */
static rt_status bf16_ready(const rt_model_ctx *ctx, const rt_conv2d *l, const conv_priv *p) {
    RT_REQUIRE(ctx->work != NULL && ctx->work_bytes >= p->scratch, RT_ERR_INVALID,
               "conv2d %d->%d k%d bf16: workspace of %zu bytes is smaller than the %zu its bf16 copies need; call "
               "rt_conv2d_prepare and rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, ctx->work_bytes, p->scratch);
    return RT_OK;
}

/* bf16 runs a batch of n < max_n at max_n, the full descriptors and the algorithms
 * measured for them: the bf16 copy of n images is followed by max_n - n zero images
 * (elems per image). Zero images add exact zeros to dW's sums; their y and dx are not
 * read back. (A smaller batch under its own descriptors may not run: on an H200, cuDNN
 * 9.19, the last batch of 96 of an epoch at 128 stopped a bf16 quickstart with
 * CUDNN_STATUS_BAD_PARAM in cudnnConvolutionBackwardFilter, 2026-11-28.) */
static rt_status pad_tail(cudaStream_t st, uint16_t *b, int n, int max_n, size_t elems) {
    if (n < max_n)
        RT_CHECK_CUDA(cudaMemsetAsync(b + (size_t)n * elems, 0, sizeof *b * (size_t)(max_n - n) * elems, st));
    return RT_OK;
}

/* The same for bf16 activations (shape_for runs them at max_n too): the backward's x and dy
 * get max_n - n zero images after their n (the buffers hold max_n images: layers.h; a tail
 * may hold anything, NaN included, and 0 * NaN would reach dW), and dx gets zeros there */
static rt_status zero_tail(cudaStream_t st, const conv_priv *p, int n, size_t per_image, const void *b) {
    if (p->dtype == CUDNN_DATA_BFLOAT16 && n < p->max_n)
        RT_CHECK_CUDA(cudaMemsetAsync((char *)b + (size_t)n * per_image * sizeof(uint16_t), 0,
                                      (size_t)(p->max_n - n) * per_image * sizeof(uint16_t), st));
    return RT_OK;
}

bool rt_cuda_conv2d_nhwc(const rt_conv2d *l) {
    const conv_priv *p = l->priv;
    return p && p->nhwc;
}

/* the channel count the casts transpose with: c where the copies are NHWC, else 0 (none) */
static int lay_c(const conv_priv *p, int c) { return p->nhwc ? c : 0; }

static rt_status forward_bf16(rt_model_ctx *ctx, rt_conv2d *l, conv_shape *s, int n, const float *x, float *y) {
    conv_priv *p = l->priv;
    RT_CHECK(bf16_ready(ctx, l, p));
    cudaStream_t st = cuda_state(ctx)->stream;
    uint16_t *xb = work_at(ctx, p->off_x), *yb = work_at(ctx, p->off_y), *wb = work_at(ctx, p->off_w);
    const size_t xn = (size_t)n * l->in_c * l->in_h * l->in_w, yn = (size_t)n * l->out_c * l->out_h * l->out_w;
    rt_cuk_to_bf16_set in = {0}; /* x and W: one launch, into NHWC where p->nhwc */
    rt_cuk_set_to_nhwc(&in, xn, lay_c(p, l->in_c), (size_t)l->in_h * l->in_w, x, xb);
    rt_cuk_set_to_nhwc(&in, (size_t)rt_tensor_numel(&l->weight), lay_c(p, l->in_c), (size_t)l->k * l->k,
                       rt_tensor_data(&l->weight), wb);
    RT_CHECK_CUDA(rt_cuk_to_bf16_n(st, &in));
    RT_CHECK(pad_tail(st, xb, n, p->max_n, (size_t)l->in_c * l->in_h * l->in_w));
    if (l->has_bias) /* y = round(conv + round(b)): cuDNN adds to the rounded bias (beta 1) */
        RT_CHECK_CUDA(rt_cuk_bf16_fill_channels(st, p->max_n, l->out_c, (size_t)l->out_h * l->out_w, p->nhwc,
                                                rt_tensor_data(&l->bias), yb));
    const float one = 1.0f, zero = 0.0f;
    RT_CHECK_CUDNN(cudnnConvolutionForward(cuda_state(ctx)->dnn, &one, s->x, xb, p->w, wb, p->conv_fwd, s->fwd,
                                           dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), l->has_bias ? &one : &zero, s->y, yb));
    rt_cuk_from_bf16_set out = {0};
    rt_cuk_set_from_nchw(&out, yn, lay_c(p, l->out_c), (size_t)l->out_h * l->out_w, yb, y, false);
    RT_CHECK_CUDA(rt_cuk_from_bf16_n(st, &out));
    return RT_OK;
}

static rt_status conv_forward_nchw_f32(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y) {
    RT_CHECK(rt_cuda_bind(ctx));
    conv_shape *s;
    RT_CHECK(shape_for(ctx, l, n, &s));
    conv_priv *p = l->priv;
    RT_CHECK(dir_ready(l, p, s, n, 0));
    if (p->dtype == CUDNN_DATA_BFLOAT16) return forward_bf16(ctx, l, s, n, x, y);
    cudnnHandle_t h = cuda_state(ctx)->dnn;
    const float one = 1.0f, zero = 0.0f;
    RT_CHECK_CUDNN(cudnnConvolutionForward(h, &one, s->x, x, p->w, rt_tensor_data(&l->weight), p->conv_fwd, s->fwd,
                                           dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), &zero, s->y, y));
    if (l->has_bias) RT_CHECK_CUDNN(cudnnAddTensor(h, &one, p->bias, rt_tensor_data(&l->bias), &one, s->y, y));
    return RT_OK;
}

static rt_status backward_bf16(rt_model_ctx *ctx, rt_conv2d *l, conv_shape *s, int n, const float *x, const float *dy,
                               float *dx, bool accumulate) {
    conv_priv *p = l->priv;
    RT_CHECK(bf16_ready(ctx, l, p));
    cudaStream_t st = cuda_state(ctx)->stream;
    cudnnHandle_t h = cuda_state(ctx)->dnn;
    uint16_t *xb = work_at(ctx, p->off_x), *dyb = work_at(ctx, p->off_y), *wb = work_at(ctx, p->off_w);
    uint16_t *dwb = work_at(ctx, p->off_dw), *dxb = work_at(ctx, p->off_dx);
    const size_t xn = (size_t)n * l->in_c * l->in_h * l->in_w, yn = (size_t)n * l->out_c * l->out_h * l->out_w;
    const size_t wn = (size_t)rt_tensor_numel(&l->weight);
    const float one = 1.0f, zero = 0.0f;
    /* the casts in one launch (x, dy, and W where dx is wanted), the widenings in another
     * (dW, and dx), around the two cuDNN calls: dwb, dxb and wb are distinct buffers */
    const size_t xplane = (size_t)l->in_h * l->in_w, yplane = (size_t)l->out_h * l->out_w, taps = (size_t)l->k * l->k;
    rt_cuk_to_bf16_set in = {0};
    rt_cuk_set_to_nhwc(&in, xn, lay_c(p, l->in_c), xplane, x, xb);
    rt_cuk_set_to_nhwc(&in, yn, lay_c(p, l->out_c), yplane, dy, dyb);
    if (dx) rt_cuk_set_to_nhwc(&in, wn, lay_c(p, l->in_c), taps, rt_tensor_data(&l->weight), wb);
    RT_CHECK_CUDA(rt_cuk_to_bf16_n(st, &in));
    RT_CHECK(pad_tail(st, xb, n, p->max_n, (size_t)l->in_c * l->in_h * l->in_w));
    RT_CHECK(pad_tail(st, dyb, n, p->max_n, (size_t)l->out_c * l->out_h * l->out_w));
    /* dW: cuDNN's bf16 dw, widened into the fp32 gradient (written, beta 0) */
    RT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(h, &one, s->x, xb, s->y, dyb, p->conv_bwd_filter, s->bwd_filter,
                                                  dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), &zero, p->w, dwb));
    rt_cuk_from_bf16_set out = {0};
    rt_cuk_set_from_nchw(&out, wn, lay_c(p, l->in_c), taps, dwb, rt_tensor_data(&l->dweight), false);
    if (l->has_bias) /* db: fp32 sums of the rounded dy, not rounded (the CPU's) */
        RT_CHECK_CUDA(rt_cuk_bf16_channel_sums(st, n, l->out_c, yplane, p->nhwc, dyb, rt_tensor_data(&l->dbias)));
    if (dx) { /* dx rounded once by cuDNN, then written or added in fp32 */
        RT_CHECK_CUDNN(cudnnConvolutionBackwardData(h, &one, p->w, wb, s->y, dyb, p->conv_bwd_data, s->bwd_data,
                                                    dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), &zero, s->x, dxb));
        rt_cuk_set_from_nchw(&out, xn, lay_c(p, l->in_c), xplane, dxb, dx, accumulate);
    }
    RT_CHECK_CUDA(rt_cuk_from_bf16_n(st, &out));
    return RT_OK;
}

static rt_status conv_backward_nchw_f32(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy,
                                       float *dx, bool accumulate) {
    RT_CHECK(rt_cuda_bind(ctx));
    conv_shape *s;
    RT_CHECK(shape_for(ctx, l, n, &s));
    conv_priv *p = l->priv;
    RT_CHECK(dir_ready(l, p, s, n, 2));
    if (dx) RT_CHECK(dir_ready(l, p, s, n, 1));
    if (p->dtype == CUDNN_DATA_BFLOAT16) return backward_bf16(ctx, l, s, n, x, dy, dx, accumulate);
    cudnnHandle_t h = cuda_state(ctx)->dnn;
    const float one = 1.0f, zero = 0.0f;
    /* parameter gradients are written (beta 0) */
    RT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(h, &one, s->x, x, s->y, dy, p->conv_bwd_filter, s->bwd_filter,
                                                  dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), &zero, p->w,
                                                  rt_tensor_data(&l->dweight)));
    if (l->has_bias)
        RT_CHECK_CUDNN(cudnnConvolutionBackwardBias(h, &one, s->y, dy, &zero, p->bias, rt_tensor_data(&l->dbias)));
    if (dx)
        RT_CHECK_CUDNN(cudnnConvolutionBackwardData(h, &one, p->w, rt_tensor_data(&l->weight), s->y, dy,
                                                    p->conv_bwd_data, s->bwd_data, dnn_ws(ctx, p), dnn_ws_bytes(ctx, p),
                                                    accumulate ? &one : &zero, s->x, dx));
    return RT_OK;
}

/* ---- NHWC activation formats ----------------------------------------------------------- */

/* the weight copy is written (rt_conv2d_weights_refresh) and ctx->work holds the scratch */
static rt_status act_ready(const rt_model_ctx *ctx, const rt_conv2d *l, const conv_priv *p) {
    RT_REQUIRE(p->wcopy != NULL, RT_ERR_INVALID,
               "conv2d %d->%d k%d on cuda, NHWC activations: its weight copy was never written; call "
               "rt_conv2d_weights_prepare (after rt_conv2d_prepare) and rt_conv2d_weights_refresh",
               l->in_c, l->out_c, l->k);
    RT_REQUIRE(ctx->work != NULL && ctx->work_bytes >= p->scratch, RT_ERR_INVALID,
               "conv2d %d->%d k%d: workspace of %zu bytes is smaller than the %zu its scratch needs; call "
               "rt_conv2d_prepare and rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, ctx->work_bytes, p->scratch);
    return RT_OK;
}

/* the fallback's conversion of n images of c channels and `plane` positions */
static rt_status relayout(const rt_model_ctx *ctx, const conv_priv *p, int n, int c, size_t plane, bool to_nhwc,
                          const void *x, void *y) {
    RT_CHECK_CUDA(rt_cuk_act_relayout(cuda_state((rt_model_ctx *)ctx)->stream, n, c, plane, to_nhwc, p->act_bf16, x, y));
    return RT_OK;
}

/* y = conv(x) (+ b: y is first filled with b, rounded where bf16, and cuDNN adds the
 * convolution with beta 1: one sum, one rounding, the CPU's round(sum + round(b))) */
static rt_status forward_act(rt_model_ctx *ctx, rt_conv2d *l, conv_shape *s, int n, const void *x, void *y) {
    conv_priv *p = l->priv;
    RT_CHECK(act_ready(ctx, l, p));
    const size_t xplane = (size_t)l->in_h * l->in_w, yplane = (size_t)l->out_h * l->out_w;
    const void *xin = x;
    void *yout = y;
    if (p->fallback) {
        xin = work_at(ctx, p->off_x), yout = work_at(ctx, p->off_y);
        RT_CHECK(relayout(ctx, p, n, p->xc, xplane, false, x, (void *)xin));
    }
    if (l->has_bias)
        RT_CHECK_CUDA(rt_cuk_conv_bias_fill(cuda_state(ctx)->stream, n, l->out_c, yplane, p->nhwc, p->act_bf16,
                                            rt_tensor_data(&l->bias), yout));
    const float one = 1.0f, zero = 0.0f;
    RT_CHECK_CUDNN(cudnnConvolutionForward(cuda_state(ctx)->dnn, &one, s->x, xin, p->w, p->wcopy, p->conv_fwd, s->fwd,
                                           dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), l->has_bias ? &one : &zero, s->y,
                                           yout));
    if (p->fallback) RT_CHECK(relayout(ctx, p, n, l->out_c, yplane, true, yout, y));
    return RT_OK;
}

/* dW (cuDNN's, in the copy's layout and dtype, into the fp32 OIHW gradient: the first
 * in_c channels; deferred: left in the layer's own scratch for rt_conv2d_weights_grads),
 * db (fp32 sums of dy), dx written or accumulated through cuDNN's beta (alpha conv + beta
 * dx rounded once; the fallback converts dx to NCHW first to keep it so) */
static rt_status backward_act(rt_model_ctx *ctx, rt_conv2d *l, conv_shape *s, int n, const void *x, const void *dy,
                              void *dx, bool accumulate) {
    conv_priv *p = l->priv;
    RT_CHECK(act_ready(ctx, l, p));
    cudaStream_t st = cuda_state(ctx)->stream;
    cudnnHandle_t h = cuda_state(ctx)->dnn;
    const size_t xplane = (size_t)l->in_h * l->in_w, yplane = (size_t)l->out_h * l->out_w;
    const void *xin = x, *dyin = dy;
    void *dxout = dx, *dwc = p->dw_own ? p->dw_own : work_at(ctx, p->off_dw);
    if (p->fallback) {
        xin = work_at(ctx, p->off_x), dyin = work_at(ctx, p->off_y), dxout = work_at(ctx, p->off_dx);
        RT_CHECK(relayout(ctx, p, n, p->xc, xplane, false, x, (void *)xin));
        RT_CHECK(relayout(ctx, p, n, l->out_c, yplane, false, dy, (void *)dyin));
    }
    RT_CHECK(zero_tail(st, p, n, (size_t)p->xc * xplane, xin));
    RT_CHECK(zero_tail(st, p, n, (size_t)l->out_c * yplane, dyin));
    const float one = 1.0f, zero = 0.0f;
    RT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(h, &one, s->x, xin, s->y, dyin, p->conv_bwd_filter, s->bwd_filter,
                                                  dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), &zero, p->w, dwc));
    if (!p->dw_own) /* deferred: rt_conv2d_weights_grads writes it */
        RT_CHECK_CUDA(rt_cuk_convw_dw(st, l->out_c, l->in_c, p->xc, l->k * l->k, p->nhwc, p->act_bf16, dwc,
                                      rt_tensor_data(&l->dweight)));
    if (l->has_bias)
        RT_CHECK_CUDA(rt_cuk_conv_bias_sums(st, n, l->out_c, yplane, p->nhwc, p->act_bf16, dyin,
                                            rt_tensor_data(&l->dbias)));
    if (!dx) return RT_OK;
    if (p->fallback && accumulate) RT_CHECK(relayout(ctx, p, n, p->xc, xplane, false, dx, dxout));
    RT_CHECK_CUDNN(cudnnConvolutionBackwardData(h, &one, p->w, p->wcopy, s->y, dyin, p->conv_bwd_data, s->bwd_data,
                                                dnn_ws(ctx, p), dnn_ws_bytes(ctx, p), accumulate ? &one : &zero, s->x,
                                                dxout));
    if (p->fallback) RT_CHECK(relayout(ctx, p, n, p->xc, xplane, true, dxout, dx));
    return RT_OK;
}

rt_status rt_cuda_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y) {
    const conv_priv *p = l->priv;
    if (!p || !p->act_nhwc) return conv_forward_nchw_f32(ctx, l, n, (const float *)x, (float *)y);
    RT_CHECK(rt_cuda_bind(ctx));
    conv_shape *s;
    RT_CHECK(shape_for(ctx, l, n, &s));
    RT_CHECK(dir_ready(l, p, s, n, 0));
    return forward_act(ctx, l, s, n, x, y);
}

rt_status rt_cuda_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy,
                                  rt_act *dx, bool accumulate) {
    const conv_priv *p = l->priv;
    if (!p || !p->act_nhwc)
        return conv_backward_nchw_f32(ctx, l, n, (const float *)x, (const float *)dy, (float *)dx, accumulate);
    RT_CHECK(rt_cuda_bind(ctx));
    conv_shape *s;
    RT_CHECK(shape_for(ctx, l, n, &s));
    RT_CHECK(dir_ready(l, p, s, n, 2));
    if (dx) RT_CHECK(dir_ready(l, p, s, n, 1));
    return backward_act(ctx, l, s, n, x, dy, dx, accumulate);
}

/* ---- weight copies (rt_conv2d_weights_*, layers.h) --------------------------------------- */

/* One device buffer holds every copy (each 256-byte aligned), a device table describes
 * them (rt_cuk_wcopy: offsets from the lowest weight pointer, which with the model's
 * parameter arena is one allocation), and refresh writes them all in one launch. The
 * layers' priv pointers are kept to notice a layer prepared again since (its copy's
 * layout may have changed): refresh says so instead of writing a stale layout.
 * defer_grads: a second buffer of the same layout holds each layer's dW (cuDNN's, in the
 * copy's layout: dw_own), which rt_conv2d_weights_grads writes into the fp32 gradients of
 * a range of the table in one launch (the model: per block). */
typedef struct conv_wcopies {
    int n;
    rt_conv2d **ls;
    const conv_priv **privs;
    rt_cuk_wcopy *host;  /* the table (offsets of each copy in elements) */
    rt_cuk_wcopy *table; /* device */
    void *copies;        /* device */
    void *dws;           /* device: the deferred dW (defer_grads), else NULL */
    const float *wbase;
    float *gbase; /* the lowest weight gradient pointer (defer_grads) */
    size_t src_total, copy_total, largest, elems, bytes;
    bool bf16;
} conv_wcopies;

static size_t wcopies_es(const conv_wcopies *w) { return w->bf16 ? sizeof(uint16_t) : sizeof(float); }

/* layer i is still the one prepared when the copies were */
static rt_status wcopies_current(const conv_wcopies *w, int i) {
    RT_REQUIRE(w->ls[i]->priv == w->privs[i], RT_ERR_INVALID,
               "conv2d weight copies: convolution %d (%d->%d k%d) was prepared again (or released) since "
               "rt_conv2d_weights_prepare: prepare the copies again",
               i, w->ls[i]->in_c, w->ls[i]->out_c, w->ls[i]->k);
    return RT_OK;
}

void rt_cuda_conv2d_weights_release(rt_model_ctx *ctx, void *state) {
    conv_wcopies *w = state;
    if (!w) return;
    for (int i = 0; w->dws && i < w->n; i++) /* the layers back to their per-call dW */
        if (w->ls[i]->priv == w->privs[i]) ((conv_priv *)w->ls[i]->priv)->dw_own = NULL;
    if (w->table) (void)cudaFree(w->table);
    if (w->copies) (void)cudaFree(w->copies);
    if (w->dws) (void)cudaFree(w->dws);
    if (cuda_state(ctx)) cuda_state(ctx)->wcopies_bytes -= w->bytes;
    free(w->ls);
    free(w->privs);
    free(w->host);
    free(w);
}

/* the lowest of the layers' weight (grad false) or weight gradient (grad true) pointers */
static float *wcopies_base(const conv_wcopies *w, bool grad) {
    float *base = NULL;
    for (int i = 0; i < w->n; i++) {
        float *p = rt_tensor_data(grad ? &w->ls[i]->dweight : &w->ls[i]->weight);
        if (!base || (p && p < base)) base = p;
    }
    return base;
}

/* the host side of the table, the offsets and the totals */
static rt_status wcopies_plan(conv_wcopies *w, bool defer) {
    w->wbase = wcopies_base(w, false);
    w->gbase = defer ? wcopies_base(w, true) : NULL;
    const size_t align = w->bf16 ? 128 : 64; /* elements of 256 bytes */
    size_t at = 0;
    for (int i = 0; i < w->n; i++) {
        const rt_conv2d *l = w->ls[i];
        const conv_priv *p = l->priv;
        RT_REQUIRE(p && p->act_nhwc && rt_tensor_data(&l->weight) && (!defer || rt_tensor_data(&l->dweight)),
                   RT_ERR_INVALID,
                   "conv2d weight copies: convolution %d (%d->%d k%d) is not prepared for an NHWC format "
                   "(rt_conv2d_prepare first) or has no weights%s",
                   i, l->in_c, l->out_c, l->k, defer ? " or weight gradient" : "");
        RT_REQUIRE(!defer || !p->dw_own, RT_ERR_INVALID,
                   "conv2d weight copies: convolution %d (%d->%d k%d) already defers its dW to other copies", i,
                   l->in_c, l->out_c, l->k);
        const size_t count = (size_t)l->out_c * p->xc * l->k * l->k;
        w->host[i] = (rt_cuk_wcopy){.src = (size_t)((const float *)rt_tensor_data(&l->weight) - w->wbase),
                                    .dst = at,
                                    .gsrc = defer ? (size_t)((float *)rt_tensor_data(&l->dweight) - w->gbase) : 0,
                                    .out_c = l->out_c,
                                    .in_c = l->in_c,
                                    .x_c = p->xc,
                                    .taps = l->k * l->k,
                                    .nhwc = p->nhwc};
        w->privs[i] = p;
        w->src_total += (size_t)l->out_c * l->in_c * l->k * l->k;
        w->copy_total += count;
        if (count > w->largest) w->largest = count;
        at += (count + align - 1) / align * align;
    }
    w->elems = at; /* the buffer's (copy_total: the elements written, not the alignment gaps) */
    return RT_OK;
}

/* the device buffers and table; defer: the layers' dW scratch (dw_own) in w->dws */
static rt_status wcopies_alloc(rt_model_ctx *ctx, conv_wcopies *w, bool defer) {
    const size_t bytes = wcopies_es(w) * w->elems, tb = sizeof *w->host * (size_t)w->n;
    cudaError_t e = cudaMalloc(&w->copies, bytes);
    if (e == cudaSuccess && defer) e = cudaMalloc(&w->dws, bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&w->table, tb);
    /* on the model's stream, then waited for: a pageable cudaMemcpy may return before the
     * copy lands, and the refresh runs on the non-blocking model stream (DESIGN.md, Streams) */
    if (e == cudaSuccess) e = cudaMemcpyAsync(w->table, w->host, tb, cudaMemcpyHostToDevice, cuda_state(ctx)->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cuda_state(ctx)->stream);
    RT_REQUIRE(e == cudaSuccess, RT_ERR_CUDA, "conv2d weight copies of %d layers (%zu bytes%s): %s", w->n, bytes,
               defer ? ", twice with the deferred dW" : "", cudaGetErrorString(e));
    w->bytes = bytes * (defer ? 2 : 1) + tb;
    cuda_state(ctx)->wcopies_bytes += w->bytes;
    for (int i = 0; defer && i < w->n; i++)
        ((conv_priv *)w->ls[i]->priv)->dw_own = (char *)w->dws + wcopies_es(w) * w->host[i].dst;
    return RT_OK;
}

rt_status rt_cuda_conv2d_weights_prepare(rt_model_ctx *ctx, rt_conv2d *const *ls, int n, bool defer_grads,
                                         void **state) {
    *state = NULL;
    if (ctx->act.layout != RT_ACT_NHWC) return RT_OK; /* fp32 NCHW: cuDNN reads the fp32 weights */
    RT_CHECK(rt_cuda_bind(ctx));
    conv_wcopies *w = calloc(1, sizeof *w);
    RT_CHECK_ALLOC(w, sizeof *w);
    w->n = n;
    w->bf16 = ctx->act.dtype == RT_BF16;
    w->ls = calloc((size_t)n, sizeof *w->ls);
    w->privs = calloc((size_t)n, sizeof *w->privs);
    w->host = calloc((size_t)n, sizeof *w->host);
    rt_status st =
        w->ls && w->privs && w->host ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "conv2d weight copies of %d layers", n);
    for (int i = 0; st == RT_OK && i < n; i++) w->ls[i] = ls[i];
    if (st == RT_OK) st = wcopies_plan(w, defer_grads);
    if (st == RT_OK) st = wcopies_alloc(ctx, w, defer_grads);
    if (st != RT_OK) {
        rt_cuda_conv2d_weights_release(ctx, w);
        return st;
    }
    *state = w;
    return RT_OK;
}

rt_status rt_cuda_conv2d_weights_refresh(rt_model_ctx *ctx, void *state) {
    conv_wcopies *w = state;
    for (int i = 0; i < w->n; i++) {
        RT_CHECK(wcopies_current(w, i));
        ((conv_priv *)w->ls[i]->priv)->wcopy = (const char *)w->copies + wcopies_es(w) * w->host[i].dst;
    }
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(rt_cuk_convw_refresh(cuda_state(ctx)->stream, w->n, w->table, w->wbase, w->copies, w->bf16,
                                       w->src_total, w->copy_total, w->largest));
    return RT_OK;
}

rt_status rt_cuda_conv2d_weights_grads(rt_model_ctx *ctx, void *state, int first, int count) {
    conv_wcopies *w = state;
    RT_REQUIRE(w->dws != NULL, RT_ERR_INVALID,
               "conv2d weight gradients: the copies were prepared without defer_grads (each backward writes dW)");
    RT_REQUIRE(first >= 0 && count >= 0 && first <= w->n - count, RT_ERR_INVALID,
               "conv2d weight gradients of convolutions %d..%d: the copies cover 0..%d", first, first + count - 1,
               w->n - 1);
    size_t total = 0, largest = 0;
    for (int i = first; i < first + count; i++) {
        RT_CHECK(wcopies_current(w, i));
        const size_t c = (size_t)w->host[i].out_c * w->host[i].in_c * w->host[i].taps;
        total += c;
        if (c > largest) largest = c;
    }
    RT_CHECK(rt_cuda_bind(ctx));
    RT_CHECK_CUDA(
        rt_cuk_convw_grads(cuda_state(ctx)->stream, first, count, w->table, w->dws, w->gbase, w->bf16, total, largest));
    return RT_OK;
}
