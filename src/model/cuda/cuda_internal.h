/* Private to the CUDA model backend: its context state, the per-layer state kept in
 * l->priv, and the launchers of the kernels in kernels_cuda.cu.
 *
 * Included by .c files (compiled by gcc with the CUDA headers) and by the .cu file
 * (nvcc), so everything here is plain C. */
#ifndef RT_MODEL_CUDA_INTERNAL_H
#define RT_MODEL_CUDA_INTERNAL_H

#include "model/cuda/lib_check.h"
#include "model/internal/backend.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One algorithm choice per convolution shape (measured, or given with
 * rt_model_ctx_set_conv_algos), shared by identical layers (ResNet34's layer1 has six
 * identical convolutions: measured once); each is also listed in ctx->conv_chosen. */
typedef struct rt_cuda_conv_algos {
    int in_c, out_c, in_h, in_w, k, stride, pad, n, precision, nhwc; /* the key (nhwc: the bf16 copies' layout) */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
    size_t fwd_ws, bwd_data_ws, bwd_filter_ws; /* bytes, at batch n */
    bool refused; /* (nhwc only) cuDNN ran no algorithm on NHWC bf16 copies: the shape's copies stay NCHW */
} rt_cuda_conv_algos;

#define RT_CUDA_ALGO_CACHE 64

typedef struct rt_cuda_state {
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    cudaStream_t stream;
    void *blas_ws; /* cuBLAS workspace (cublasSetWorkspace): no allocation inside cuBLAS */
    size_t blas_ws_bytes;
    int *bad_labels;         /* device counter of out-of-range labels seen by the loss kernels */
    size_t bn_scratch_bytes; /* the prepared batch-norm layers' scratch (backend_cuda.c) */
    size_t wcopies_bytes;    /* the convolutions' weight copies and deferred dW (conv_cuda.c) */
    rt_cuda_conv_algos algos[RT_CUDA_ALGO_CACHE];
    int nalgos;
} rt_cuda_state;

static inline rt_cuda_state *cuda_state(rt_model_ctx *ctx) { return (rt_cuda_state *)ctx->backend; }

/* Upper bound of the workspace a convolution algorithm may use (cuDNN Find is given at
 * most this much; faster algorithms that need more are not considered). */
#define RT_CUDA_CONV_WS_CAP ((size_t)256 << 20)

/* Whether a prepared conv2d runs cuDNN on NHWC bf16 copies (conv_cuda.c, layout_nhwc). */
bool rt_cuda_conv2d_nhwc(const rt_conv2d *l);

/* Make the context's GPU current for the calling thread (cheap, no synchronisation). */
rt_status rt_cuda_bind(rt_model_ctx *ctx);

/* backend_cuda.c: prepared batch-norm layer l's reduction scratch for a batch of n
 * (rt_cuk_bn_args' partial and tickets), which the synchronised batch norm's NHWC sums
 * use too (syncbn_cuda.c); an error when l is not prepared for n */
rt_status rt_cuda_bn_scratch(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, double **partial, int **tickets);

/* conv_cuda.c */
rt_status rt_cuda_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace);
void rt_cuda_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l);
rt_status rt_cuda_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y);
rt_status rt_cuda_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy, rt_act *dx,
                                  bool accumulate);

/* mem_cuda.c: the table's `memory` (rt_model_ctx_memory). *backend: device bytes the
 * backend holds besides the model and ctx->work (the cuBLAS workspace, counters, the
 * batch norms' scratch, the weight copies and deferred dW of conv_cuda.c); *used:
 * bytes of ctx's GPU in use (total - free, cudaMemGetInfo): all processes, the CUDA
 * context and library code included; differences between two calls isolate a run. */
rt_status rt_cuda_memory(rt_model_ctx *ctx, size_t *used, size_t *backend);

/* ---- kernels_cuda.cu: every launcher enqueues on `s` and returns the launch status --- */

/* Activations (void *) are in a format given at run time (model/ctx.h): the element type
 * dt (RT_F32 or RT_BF16) for the layout-free elementwise ops, an rt_act_format (dtype and
 * layout; its input_channel_align is not read) for the others. Each reads the stored
 * dtype, computes in fp32 (sums in double where noted) and rounds once where it stores
 * (bf16: to nearest even). fp32 NCHW: the arithmetic, and the bits, of the fp32 kernels
 * these were. */
cudaError_t rt_cuk_relu_forward(cudaStream_t s, rt_dtype dt, size_t count, const void *x, void *y);
cudaError_t rt_cuk_relu_backward(cudaStream_t s, rt_dtype dt, size_t count, const void *y, const void *dy, void *dx);
cudaError_t rt_cuk_add(cudaStream_t s, rt_dtype dt, size_t count, const void *a, const void *b, void *y);
cudaError_t rt_cuk_accumulate(cudaStream_t s, rt_dtype dt, size_t count, const void *dy, void *dx);
/* fp32 NCHW (n, c, plane) at src -> activations (n, stored_c, plane) at dst in format f,
 * channels c..stored_c-1 zero; and back (only the first c channels read) */
cudaError_t rt_cuk_act_from_nchw(cudaStream_t s, rt_act_format f, int n, int c, size_t plane, int stored_c,
                                 const float *src, void *dst);
cudaError_t rt_cuk_act_to_nchw(cudaStream_t s, rt_act_format f, int n, int c, size_t plane, int stored_c,
                               const void *src, float *dst);
/* the max-pooling kernels' geometry parameter (one plane's, the channels and the format:
 * bf16 and nhwc 0 or 1); tests/cuda_emu/kernel_costs.cpp reads it to count the bytes of a
 * launch */
typedef struct rt_cuk_pool_geom {
    int in_h, in_w, out_h, out_w, k, stride, pad;
    int c, bf16, nhwc;
} rt_cuk_pool_geom;
/* max pooling with the CPU rule (padding -inf, first maximum, NaN wins) */
cudaError_t rt_cuk_maxpool_forward(cudaStream_t s, rt_act_format f, const rt_maxpool2d *l, int n, const void *x,
                                   void *y);
cudaError_t rt_cuk_maxpool_backward(cudaStream_t s, rt_act_format f, const rt_maxpool2d *l, int n, const void *x,
                                    const void *dy, void *dx);
/* global average pooling: activations (n, c, hw) -> fp32 features y (n, c) (sums in
 * double), and back */
cudaError_t rt_cuk_avgpool_forward(cudaStream_t s, rt_act_format f, int n, int c, int hw, const void *x, float *y);
cudaError_t rt_cuk_avgpool_backward(cudaStream_t s, rt_act_format f, int n, int c, int hw, const float *dy, void *dx);
/* y (n, out) row i = b; db (out) = column sums of dy (n, out) */
cudaError_t rt_cuk_bias_rows(cudaStream_t s, int n, int out, const float *b, float *y);
cudaError_t rt_cuk_column_sums(cudaStream_t s, int n, int out, const float *dy, float *db);
/* dropout: mask (draws, fp32) from Philox, y = x * mask[k / plane] where k is the
 * element's index in PyTorch's NCHW order whatever the format f (features: fp32 NCHW with
 * l->c == 1) */
cudaError_t rt_cuk_dropout_forward(cudaStream_t s, rt_act_format f, const rt_dropout *l, int n, const void *x,
                                   void *y);
cudaError_t rt_cuk_dropout_backward(cudaStream_t s, rt_act_format f, const rt_dropout *l, int n, const void *dy,
                                    void *dx);
/* precision bf16 (bf16 as uint16_t, the top half of a float): y = round(x) to nearest
 * even (core/bf16.h's rule); y = x widened, or y += x widened in fp32 when accumulate;
 * y = round(y) in place (kept as a float); y (n, c, plane) = round(b[channel]); and
 * db[ch] = fp32 sum over n and plane of dy (n, c, plane) (a row-major (n, out) matrix's
 * column sums with plane 1) */
cudaError_t rt_cuk_to_bf16(cudaStream_t s, size_t count, const float *x, uint16_t *y);
cudaError_t rt_cuk_from_bf16(cudaStream_t s, size_t count, const uint16_t *x, float *y, bool accumulate);
cudaError_t rt_cuk_round_bf16(cudaStream_t s, size_t count, float *y);
/* The same casts for up to RT_CUK_SET arrays in one launch (those around one bf16 cuDNN or
 * cuBLAS call: each launch costs about as much as these small arrays' work), the same
 * bits as one rt_cuk_to_bf16 / rt_cuk_from_bf16 per array; arrays of count 0 are
 * skipped. Fill them with rt_cuk_set_to / rt_cuk_set_from; the _nhwc / _nchw forms also
 * change the layout: an array of images of c channels and `plane` positions each (x, y,
 * dy, dx: plane h*w; a filter: its out_c rows of c x r*s) goes from NCHW (fp32) to NHWC
 * (bf16), or back, element for element the same values. */
#define RT_CUK_SET 3
typedef struct rt_cuk_to_bf16_set {
    int n;
    const float *x[RT_CUK_SET];
    uint16_t *y[RT_CUK_SET];
    size_t count[RT_CUK_SET];
    int c[RT_CUK_SET]; /* 0: no change of layout */
    size_t plane[RT_CUK_SET];
} rt_cuk_to_bf16_set;
typedef struct rt_cuk_from_bf16_set {
    int n;
    const uint16_t *x[RT_CUK_SET];
    float *y[RT_CUK_SET];
    size_t count[RT_CUK_SET];
    int accumulate[RT_CUK_SET];
    int c[RT_CUK_SET]; /* 0: no change of layout */
    size_t plane[RT_CUK_SET];
} rt_cuk_from_bf16_set;
static inline void rt_cuk_set_to_nhwc(rt_cuk_to_bf16_set *g, size_t count, int c, size_t plane, const float *x,
                                      uint16_t *y) {
    g->x[g->n] = x, g->y[g->n] = y, g->count[g->n] = count, g->c[g->n] = c, g->plane[g->n] = plane;
    g->n++;
}
static inline void rt_cuk_set_to(rt_cuk_to_bf16_set *g, size_t count, const float *x, uint16_t *y) {
    rt_cuk_set_to_nhwc(g, count, 0, 0, x, y);
}
static inline void rt_cuk_set_from_nchw(rt_cuk_from_bf16_set *g, size_t count, int c, size_t plane, const uint16_t *x,
                                        float *y, bool accumulate) {
    g->x[g->n] = x, g->y[g->n] = y, g->count[g->n] = count, g->accumulate[g->n] = accumulate ? 1 : 0;
    g->c[g->n] = c, g->plane[g->n] = plane;
    g->n++;
}
static inline void rt_cuk_set_from(rt_cuk_from_bf16_set *g, size_t count, const uint16_t *x, float *y,
                                   bool accumulate) {
    rt_cuk_set_from_nchw(g, count, 0, 0, x, y, accumulate);
}
cudaError_t rt_cuk_to_bf16_n(cudaStream_t s, const rt_cuk_to_bf16_set *g);
cudaError_t rt_cuk_from_bf16_n(cudaStream_t s, const rt_cuk_from_bf16_set *g);
/* the bias pieces for y / dy in NCHW, or in NHWC when nhwc */
cudaError_t rt_cuk_bf16_fill_channels(cudaStream_t s, int n, int c, size_t plane, bool nhwc, const float *b,
                                      uint16_t *y);
cudaError_t rt_cuk_bf16_channel_sums(cudaStream_t s, int n, int c, size_t plane, bool nhwc, const uint16_t *dy,
                                     float *db);
/* Batch norm (training and evaluation), with the residual add and the ReLU fused
 * (kernels_cuda.cu, "batch norm"). The activations' shape and format: (n, c, plane),
 * NCHW or (nhwc 1) NHWC, fp32 or (bf16 1) bf16 elements; `splits` blocks share each
 * channel's reduction (rt_cuk_bn_splits: a function of the shape alone, so the reduction
 * order, and every bit of the result, is the same on every run and every device): in
 * NCHW slices of a channel, one block per (channel, slice); in NHWC row tiles of the
 * (n * plane) x c matrix, one block per (group of up to 32 adjacent channels, tile), its
 * threads along the channels (bn_nhwc_cuda.h). Statistics, factors and parameter
 * gradients are fp32 (sums in double) in every format. */
typedef struct rt_cuk_bn_shape {
    int n, c, splits;
    int bf16, nhwc;
    size_t plane;
} rt_cuk_bn_shape;
int rt_cuk_bn_splits(int n, int c, size_t plane, bool nhwc);
/* a layer's tensors (device pointers) and its per-layer scratch, allocated at prepare:
 * partial (2 * c * splits doubles for the largest batch), factors (4 * c floats), tickets
 * (c ints, zero between launches: the last block of a channel, or in NHWC of a channel
 * group, resets its ticket) */
typedef struct rt_cuk_bn_args {
    const float *weight, *bias;
    float *running_mean, *running_var, *save_mean, *save_invstd, *dweight, *dbias;
    int64_t *num_batches_tracked;
    float momentum, eps;
    double *partial;
    float *factors;
    int *tickets;
} rt_cuk_bn_args;
/* y = relu?(bn(x) + residual?); training: batch statistics (saved, folded into the running
 * ones, num_batches_tracked += 1), 2 launches; evaluation: running statistics, 2 launches */
cudaError_t rt_cuk_bn_forward(cudaStream_t s, const rt_cuk_bn_args *a, rt_cuk_bn_shape sh, const void *x,
                              const void *residual, void *y, bool training, bool relu);
/* backward of a training forward, dy taken through the ReLU whose output was act (NULL:
 * no ReLU): dweight, dbias written, dx written or accumulated (dx may be dy); 2 launches */
cudaError_t rt_cuk_bn_backward(cudaStream_t s, const rt_cuk_bn_args *a, rt_cuk_bn_shape sh, const void *x,
                               const void *act, const void *dy, void *dx, bool accumulate,
                               void *keep);
/* *counter += 1 (num_batches_tracked) */
cudaError_t rt_cuk_increment_i64(cudaStream_t s, int64_t *counter);
/* losses: an out-of-range label adds 1 to *bad and makes the loss (and that row's
 * gradient) NaN */
cudaError_t rt_cuk_softmax_xent(cudaStream_t s, int n, int k, const float *logits, const int64_t *labels, float *loss,
                                float *dlogits, int *bad);
/* the same with label smoothing eps (CrossEntropyLoss(label_smoothing=eps)); eps 0: as above */
cudaError_t rt_cuk_softmax_xent_smooth(cudaStream_t s, int n, int k, const float *logits, const int64_t *labels,
                                       double eps, float *loss, float *dlogits, int *bad);
cudaError_t rt_cuk_log_softmax_forward(cudaStream_t s, int n, int k, const float *x, float *y);
cudaError_t rt_cuk_log_softmax_backward(cudaStream_t s, int n, int k, const float *y, const float *dy, float *dx);
cudaError_t rt_cuk_nll_loss(cudaStream_t s, int n, int k, const float *logp, const int64_t *labels, float *loss,
                            float *dlogp, int *bad);

/* ---- convw_cuda.cu: the convolutions in an NHWC activation format (conv_cuda.c) ----- */

/* One convolution's weight copy (rt_conv2d_weights_prepare): its fp32 OIHW weights at
 * wbase + src (floats), its copy at copies + dst (elements of the activations' dtype):
 * out_c rows of x_c channels (in_c of them the weights', the rest zero) x taps, KRSC
 * (nhwc) or KCRS (a layer on the NCHW fallback). Deferred dW (rt_conv2d_weights_grads):
 * cuDNN's dW in the copy's layout at dws + dst, its fp32 OIHW gradient at gbase + gsrc.
 * Offsets, not pointers: a kernel parameter's pointers are what a launch passes (the
 * emulated GPUs map only those). */
typedef struct rt_cuk_wcopy {
    size_t src, dst, gsrc;
    int out_c, in_c, x_c, taps, nhwc;
} rt_cuk_wcopy;
/* every copy of the table (device memory, nconvs entries) in one launch; src_total,
 * copy_total: the elements read and written over all entries, largest: the largest copy */
cudaError_t rt_cuk_convw_refresh(cudaStream_t s, int nconvs, const rt_cuk_wcopy *table, const float *wbase,
                                 void *copies, bool bf16, size_t src_total, size_t copy_total, size_t largest);
/* dw (out_c, in_c, taps) fp32 from a gradient in the copy's layout and dtype (x_c channels) */
cudaError_t rt_cuk_convw_dw(cudaStream_t s, int out_c, int in_c, int x_c, int taps, bool nhwc, bool bf16,
                            const void *dwc, float *dw);
/* the same for entries first..first+count-1 of the table in one launch: gbase + gsrc from
 * dws + dst; grad_total: the gradient elements written over them, largest: the most of one */
cudaError_t rt_cuk_convw_grads(cudaStream_t s, int first, int count, const rt_cuk_wcopy *table, const void *dws,
                               float *gbase, bool bf16, size_t grad_total, size_t largest);
/* y (n, c, plane) or (n, plane, c) = b[channel] (rounded to bf16 where bf16); db[c] = the
 * fp32 (double-summed) channel sums of dy */
cudaError_t rt_cuk_conv_bias_fill(cudaStream_t s, int n, int c, size_t plane, bool nhwc, bool bf16, const float *b,
                                  void *y);
cudaError_t rt_cuk_conv_bias_sums(cudaStream_t s, int n, int c, size_t plane, bool nhwc, bool bf16, const void *dy,
                                  float *db);
/* y = x, NCHW -> NHWC (to_nhwc) or back, in the activations' dtype */
cudaError_t rt_cuk_act_relayout(cudaStream_t s, int n, int c, size_t plane, bool to_nhwc, bool bf16, const void *x,
                                void *y);
/* conv_cuda.c: the backend's conv2d_weights_* entries (layers.h) */
rt_status rt_cuda_conv2d_weights_prepare(rt_model_ctx *ctx, rt_conv2d *const *ls, int n, bool defer_grads,
                                         void **state);
rt_status rt_cuda_conv2d_weights_refresh(rt_model_ctx *ctx, void *state);
rt_status rt_cuda_conv2d_weights_grads(rt_model_ctx *ctx, void *state, int first, int count);
void rt_cuda_conv2d_weights_release(rt_model_ctx *ctx, void *state);

#ifdef __cplusplus
}
#endif

#endif
