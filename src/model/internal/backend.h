/* The backend interface: one table of functions per device kind.
 *
 * layers.c validates arguments and calls ctx->ops->..., so a backend only implements
 * the arithmetic. The CPU backend (src/model/cpu/, rt_model_backend_cpu) is always
 * built; the CUDA backend (src/model/cuda/, rt_model_backend_cuda) is built with
 * RT_HAVE_CUDA and picked by rt_model_ctx_create for a cuda device. Every entry has the
 * semantics documented for the matching rt_* function in layers.h (same argument
 * order, pointers on the context's device, work enqueued on ctx->stream).
 *
 * Contract for a backend:
 *  - ctx_init runs once and may allocate (handles, streams, scratch); it stores its
 *    state in ctx->backend; ctx_release frees it.
 *  - *_prepare runs once per layer (after the parameter arenas exist) and may allocate
 *    per-layer state into l->priv (released by *_release) and report the workspace it
 *    needs; the workspace itself is ctx->work (ctx->work_bytes), shared by all layers.
 *  - forward/backward entries must not allocate and (on CUDA) must not synchronise
 *    with the host. Optional entries may be NULL only where noted.
 *  - act_format chooses the context's activation format (model/ctx.h) for the precision;
 *    every `rt_act *` here is in that format; parameters and their gradients are fp32 in
 *    PyTorch's layouts; `float *` features (the head's) are fp32 (n, f). Entries taking
 *    `const void *` with a dtype (or a format) serve both kinds: relu and dropout act on
 *    activations and on features.
 */
#ifndef RT_MODEL_BACKEND_H
#define RT_MODEL_BACKEND_H

#include "model/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_model_backend {
    const char *name; /* "cpu", "cuda" */

    rt_status (*ctx_init)(rt_model_ctx *ctx);
    void (*ctx_release)(rt_model_ctx *ctx);
    /* optional: fn(arg, t) for t < ntasks on the context's host threads (CPU: its pool) */
    void (*host_parallel)(rt_model_ctx *ctx, int ntasks, void (*fn)(void *arg, int task), void *arg);
    /* optional: rt_model_ctx_memory's figures (model/ctx.h), both set to 0 before the call:
     * bytes of the context's device in use, and the device bytes the backend holds besides
     * the model and ctx->work. NULL: the backend holds no device memory (0 and 0). */
    rt_status (*memory)(rt_model_ctx *ctx, size_t *used, size_t *backend);
    /* the activation format for a precision (called before ctx_init); NULL: fp32 NCHW */
    void (*act_format)(rt_precision precision, rt_act_format *fmt);
    /* whether the backend runs activations in format f (rt_model_ctx_options.act_format);
     * NULL: fp32 NCHW only */
    bool (*act_supported)(const rt_act_format *f);
    /* fp32 NCHW (n, c, h, w) <-> activations stored with stored_c channels (rt_act_from_nchw) */
    rt_status (*act_from_nchw)(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src,
                               rt_act *dst);
    rt_status (*act_to_nchw)(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src,
                             float *dst);

    rt_status (*conv2d_prepare)(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace);
    void (*conv2d_release)(rt_model_ctx *ctx, rt_conv2d *l);
    rt_status (*conv2d_forward)(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y);
    rt_status (*conv2d_backward)(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy, rt_act *dx,
                                 bool accumulate);

    /* optional (NULL: no weight copies), rt_conv2d_weights_* (layers.h); prepare may
     * allocate and sets *state (NULL: nothing to copy); refresh enqueues the copies;
     * grads (optional: NULL where prepare never defers dW) enqueues the deferred dW of
     * the state's convolutions first..first+count-1 */
    rt_status (*conv2d_weights_prepare)(rt_model_ctx *ctx, rt_conv2d *const *ls, int n, bool defer_grads, void **state);
    rt_status (*conv2d_weights_refresh)(rt_model_ctx *ctx, void *state);
    rt_status (*conv2d_weights_grads)(rt_model_ctx *ctx, void *state, int first, int count);
    void (*conv2d_weights_release)(rt_model_ctx *ctx, void *state);

    rt_status (*batchnorm2d_prepare)(rt_model_ctx *ctx, rt_batchnorm2d *l, int max_n);
    void (*batchnorm2d_release)(rt_model_ctx *ctx, rt_batchnorm2d *l);
    rt_status (*batchnorm2d_forward)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                     bool training);
    rt_status (*batchnorm2d_backward)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                      rt_act *dx, bool accumulate);
    /* optional, fused (NULL: the layer composes batch norm, add and relu):
     * y = relu?(bn(x) + residual?); dx from dy taken through a ReLU whose output was act */
    rt_status (*batchnorm2d_forward_act)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                         const rt_act *residual, rt_act *y, bool training, bool relu);
    rt_status (*batchnorm2d_backward_act)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                          const rt_act *dy, rt_act *dx, bool accumulate);

    /* optional (NULL: relu backward into g, then batchnorm2d_backward): backward_act that
     * also writes dy * (act > 0) into g (rt_batchnorm2d_backward_act_keep) */
    rt_status (*batchnorm2d_backward_act_keep)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                               const rt_act *act, const rt_act *dy, rt_act *g, rt_act *dx,
                                               bool accumulate);

    /* optional, synchronised batch norm (rt_model_ctx_set_bn_sync; NULL: unsupported), the
     * pieces layers.c composes around ctx->bn_sync.all_reduce, C = l->c channels:
     *  sync_stats: this rank's sums[c] = sum x, sums[C + c] = sum x^2 over (n, h, w) and
     *    sums[2C] = n*h*w, into `sums` (device, doubles);
     *  sync_forward: the training forward (fused like batchnorm2d_forward_act) with the
     *    statistics of every rank's sums: mean = S / M, biased var = SS / M - mean^2 for
     *    normalising, save_mean/save_invstd, running_var from the unbiased M / (M - 1) var,
     *    num_batches_tracked + 1;
     *  sync_dsums: with g = dy (taken through the ReLU whose output was act, when act is
     *    given), this rank's sums[c] = sum g, sums[C + c] = sum g (x - save_mean),
     *    sums[2C] = n*h*w; writes this rank's dweight = sums[C + c] * save_invstd and dbias =
     *    sums[c] (the gradient reducer averages them, as DDP does SyncBatchNorm's);
     *  sync_dx: dx (written or accumulated) from g and every rank's sums:
     *    dx = gamma invstd (g - S / M - (x - mean) invstd^2 SX / M). */
    rt_status (*batchnorm2d_sync_stats)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, double *sums);
    rt_status (*batchnorm2d_sync_forward)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                          const rt_act *residual, rt_act *y, bool relu, const double *sums);
    rt_status (*batchnorm2d_sync_dsums)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                        const rt_act *dy, double *sums);
    rt_status (*batchnorm2d_sync_dx)(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                     const rt_act *dy, rt_act *dx, bool accumulate, const double *sums);

    /* dt: RT_F32 (features, or activations in an fp32 format) or RT_BF16 */
    rt_status (*relu_forward)(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y);
    rt_status (*relu_backward)(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy, void *dx);

    rt_status (*maxpool2d_prepare)(rt_model_ctx *ctx, rt_maxpool2d *l, int max_n);
    void (*maxpool2d_release)(rt_model_ctx *ctx, rt_maxpool2d *l);
    rt_status (*maxpool2d_forward)(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y);
    rt_status (*maxpool2d_backward)(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                    const rt_act *dy, rt_act *dx);

    rt_status (*avgpool_forward)(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y);
    rt_status (*avgpool_backward)(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx);

    rt_status (*linear_prepare)(rt_model_ctx *ctx, rt_linear *l, int max_n, size_t *workspace);
    void (*linear_release)(rt_model_ctx *ctx, rt_linear *l);
    rt_status (*linear_forward)(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y);
    rt_status (*linear_backward)(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy, float *dx);

    /* dropout: the backend fills l->mask for the draw starting at l->counter (the
     * caller advances the counter afterwards) and applies it; fmt: the data's format
     * (ctx->act for activations; fp32 NCHW for features, l->c == 1); the mask is in
     * PyTorch's order either way (layers.h). */
    rt_status (*dropout_forward)(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x, void *y);
    rt_status (*dropout_backward)(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy,
                                  void *dx);

    /* y = a + b; dx += dy (activations, or fp32 features and gradients: dt); plain copy of
     * `bytes` (eval dropout) */
    rt_status (*add_forward)(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *a, const void *b, void *y);
    rt_status (*add_backward)(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx);
    rt_status (*copy)(rt_model_ctx *ctx, size_t bytes, const void *x, void *y);

    /* label smoothing eps in [0, 1]: CrossEntropyLoss(label_smoothing=eps) */
    rt_status (*softmax_xent)(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels,
                              double smoothing, float *loss, float *dlogits);
    rt_status (*log_softmax_forward)(rt_model_ctx *ctx, int n, int k, const float *x, float *y);
    rt_status (*log_softmax_backward)(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy, float *dx);
    rt_status (*nll_loss)(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                          float *dlogp);
} rt_model_backend;

/* The CPU backend (src/model/cpu/): im2col + OpenBLAS sgemm, a pthread pool of
 * ctx->threads workers. */
extern const rt_model_backend rt_model_backend_cpu;

#ifdef RT_HAVE_CUDA
/* The CUDA backend (src/model/cuda/): cuDNN, cuBLAS and a few kernels. */
extern const rt_model_backend rt_model_backend_cuda;
#endif

#ifdef __cplusplus
}
#endif

#endif
