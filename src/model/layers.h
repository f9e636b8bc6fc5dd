/* Layers: descriptors and forward/backward for every layer kind.
 *
 * A layer descriptor holds its hyper-parameters, the spatial size of its input (fixed
 * when the model is built) and its parameters as rt_tensor views into the model's
 * parameter arena, with the gradients at the same offsets in the gradient arena. The
 * batch size `n` is given per call (n <= the max batch the model was built for).
 *
 * All data pointers are on ctx->device. Activations (and their gradients) are `rt_act *`
 * in the context's format (model/ctx.h: fp32 NCHW on the CPU; NHWC fp32 or bf16 on CUDA
 * under tf32 or bf16); the shapes below name them in PyTorch's (N, C, H, W) order whatever
 * the layout. Features, logits and parameters are fp32 `float *` in PyTorch's layouts:
 * conv weights OIHW, linear weights (out, in). Each function dispatches
 * through ctx->ops to the CPU (src/model/cpu/) or CUDA (src/model/cuda/) backend;
 * see internal/backend.h for the contract every backend implements.
 *
 * Gradient conventions:
 *  - parameter gradients are WRITTEN (not accumulated): a backward pass overwrites them,
 *    so no zero_grad is needed between steps;
 *  - input gradients are written, or added to what is there when `accumulate` is true
 *    (residual connections); dx == NULL means "not needed" (the first layer);
 *  - relu and the elementwise ops may run in place (y == x, dx == dy).
 */
#ifndef RT_MODEL_LAYERS_H
#define RT_MODEL_LAYERS_H

#include "core/tensor.h"
#include "model/ctx.h"
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- descriptors -------------------------------------------------------------------- */

typedef struct rt_conv2d {
    int in_c, out_c;    /* channels */
    int in_h, in_w;     /* input spatial size */
    int out_h, out_w;   /* derived: (in + 2*pad - k) / stride + 1 */
    int k, stride, pad; /* square kernel k x k */
    bool has_bias;
    int x_c;            /* channels x is stored with (>= in_c: the model input's padding,
                           rt_act_input_channels; the extra channels hold zeros); set by
                           init to in_c, by the model for its first convolution */
    rt_tensor weight, dweight; /* (out_c, in_c, k, k) */
    rt_tensor bias, dbias;     /* (out_c); unset when !has_bias */
    void *priv;                /* backend state (cuDNN descriptors, chosen algorithms) */
} rt_conv2d;

typedef struct rt_batchnorm2d {
    int c, h, w;
    float eps;                              /* 1e-5 */
    float momentum;                         /* 0.1: running = (1 - m) * running + m * batch (unbiased var) */
    rt_tensor weight, dweight, bias, dbias; /* (c) */
    rt_tensor running_mean, running_var;    /* (c) f32, in the buffer arena */
    rt_tensor num_batches_tracked;          /* () i64, in the buffer arena */
    float *save_mean, *save_invstd;         /* (c) each, on the device: the batch mean and
                                               1/sqrt(var + eps) of the last training forward */
    void *priv;
} rt_batchnorm2d;

typedef struct rt_maxpool2d {
    int c, in_h, in_w, out_h, out_w;
    int k, stride, pad; /* padding counts as -inf; first maximum wins (PyTorch's CPU rule) */
    void *priv;
} rt_maxpool2d;

typedef struct rt_linear {
    int in_f, out_f;
    rt_tensor weight, dweight; /* (out_f, in_f) */
    rt_tensor bias, dbias;     /* (out_f) */
    void *priv;
} rt_linear;

typedef struct rt_dropout {
    float p;               /* drop probability in [0, 1) */
    bool channelwise;      /* Dropout2d: one draw per (sample, channel), else per element */
    int c;                 /* channels (1 for features: a (n, features) fp32 input) */
    int features;          /* elements per sample: c*h*w */
    int plane;             /* elements per channel (h*w) when channelwise, else 1 */
    uint64_t seed, subseq; /* Philox stream of this layer */
    uint64_t counter;      /* draws used so far; advances by n*features/plane each forward */
    float *mask;           /* (max_n, features/plane) on the device: 0 or 1/(1-p) */
} rt_dropout;

/* ---- setup (not in the hot loop) ---------------------------------------------------- */

/* Fill in derived sizes and tensor shapes (no storage yet). */
rt_status rt_conv2d_init(rt_conv2d *l, int in_c, int out_c, int in_h, int in_w, int k, int stride, int pad,
                         bool has_bias);
rt_status rt_batchnorm2d_init(rt_batchnorm2d *l, int c, int h, int w);
rt_status rt_maxpool2d_init(rt_maxpool2d *l, int c, int in_h, int in_w, int k, int stride, int pad);
rt_status rt_linear_init(rt_linear *l, int in_f, int out_f);
rt_status rt_dropout_init(rt_dropout *l, float p, bool channelwise, int c, int h, int w, uint64_t seed,
                          uint64_t subseq);

/* Let the backend prepare a layer for batches of up to max_n (cuDNN descriptors and
 * algorithm choice; CPU: nothing) and report the workspace it needs. Called once per
 * layer after the arenas are allocated; the model reserves the largest workspace. */
rt_status rt_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace);
rt_status rt_batchnorm2d_prepare(rt_model_ctx *ctx, rt_batchnorm2d *l, int max_n);
rt_status rt_maxpool2d_prepare(rt_model_ctx *ctx, rt_maxpool2d *l, int max_n);
rt_status rt_linear_prepare(rt_model_ctx *ctx, rt_linear *l, int max_n, size_t *workspace);
/* Free what prepare made (l->priv). */
void rt_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l);
void rt_batchnorm2d_release(rt_model_ctx *ctx, rt_batchnorm2d *l);
void rt_maxpool2d_release(rt_model_ctx *ctx, rt_maxpool2d *l);
void rt_linear_release(rt_model_ctx *ctx, rt_linear *l);

/* Weight copies: a backend that runs convolutions on a copy of the weights in another
 * layout or dtype (CUDA in an NHWC format: KRSC, bf16 under bf16, input channels padded
 * to x_c) keeps one copy per convolution and writes them all from the fp32 OIHW weights
 * in refresh (one launch where it can). The model prepares them for all its convolutions
 * and refreshes them at the start of every forward (model.c), so a change of the
 * parameters by any path (the optimizer, a load, the broadcast at start, an EMA swap, a
 * test writing the arena) is seen by the next forward, and a backward uses its forward's
 * copies. Callers of the layers directly: prepare once (setup: allocates), refresh after
 * changing a weight. state NULL: nothing to copy (the CPU; the fp32 NCHW format).
 * defer_grads: a backward of these convolutions may leave its weight gradient in the
 * backend's layout (CUDA in an NHWC format: in a scratch of each convolution's own, as
 * large as its copy), and rt_conv2d_weights_grads writes the gradients (dweight) of
 * convolutions first..first+count-1 of ls, after their backward, in one launch: l->dweight
 * is final only after it (the model: for each block before the grad-ready callback, or at
 * the end of its backward; params.c). Without defer_grads each backward writes dweight
 * itself and rt_conv2d_weights_grads is an error; with a NULL state it does nothing.
 * Release the state before the layers. */
rt_status rt_conv2d_weights_prepare(rt_model_ctx *ctx, rt_conv2d *const *ls, int n, bool defer_grads, void **state);
rt_status rt_conv2d_weights_refresh(rt_model_ctx *ctx, void *state);
/* The model's input conversion (rt_act_from_nchw), timed as a profile row of its own. */
rt_status rt_act_input(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src, rt_act *dst);
rt_status rt_conv2d_weights_grads(rt_model_ctx *ctx, void *state, int first, int count);
void rt_conv2d_weights_release(rt_model_ctx *ctx, void *state);

/* ---- forward / backward ------------------------------------------------------------- */

/* conv2d: x (n, in_c, in_h, in_w) -> y (n, out_c, out_h, out_w). On CUDA under bf16 a batch
 * n < max_n runs at the prepared max_n (cuDNN refused a smaller batch's backward-filter on
 * an H200: conv_cuda.c pad_tail), so there x, y, dy and dx must hold max_n images: the
 * backward writes zeros into the tails of x and dy (the model's activations are allocated
 * for its max_batch). */
rt_status rt_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y);
/* writes dweight (and dbias); dx (n, in_c, in_h, in_w) written or accumulated, or NULL.
 * x must be the (unchanged) input of this layer's last forward with the same n, and the
 * weights those of that forward: the CPU backend reuses that forward's unfolded columns
 * and unrolled weights. */
rt_status rt_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy, rt_act *dx,
                             bool accumulate);

/* batchnorm2d: training uses batch statistics, saves mean/invstd and updates the
 * running statistics and num_batches_tracked; evaluation uses the running statistics.
 * x, y (n, c, h, w); y may not alias x. */
rt_status rt_batchnorm2d_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                 bool training);
/* Backward of a training forward (uses save_mean/save_invstd): writes dweight, dbias,
 * and dx (written or accumulated). */
rt_status rt_batchnorm2d_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                  rt_act *dx, bool accumulate);

/* batch norm, then (optional) a residual added and (optional) ReLU, in one pass where the
 * backend fuses them: y = relu(bn(x) + residual); residual NULL: none; y may alias
 * neither x nor residual. Same values as the three layers one after another. */
rt_status rt_batchnorm2d_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                     const rt_act *residual, rt_act *y, bool training, bool relu);
/* Backward of batch norm followed by a ReLU whose output was act: the batch norm's output
 * gradient is dy where act > 0, else 0. dy may be overwritten (backends without the fused
 * op apply the ReLU's backward to it in place). */
rt_status rt_batchnorm2d_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                      rt_act *dy, rt_act *dx, bool accumulate);

/* rt_batchnorm2d_backward_act that also writes the ReLU's backward (dy where act > 0, else
 * 0) into g (written; g may be dy): the gradient a residual block's shortcut takes. A
 * backend with the fused op writes g in its pass over dy for the sums and its dx pass
 * reads g instead of dy and act (one read fewer than backward_act, one write more); without
 * it: the ReLU's backward into g, then batch norm's backward of g. dx may alias neither. */
rt_status rt_batchnorm2d_backward_act_keep(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                           const rt_act *act, const rt_act *dy, rt_act *g, rt_act *dx,
                                           bool accumulate);

/* relu over `count` elements; y may be x. Backward from the output: dx = dy * (y > 0);
 * dx may be dy. The _f32 pair works on fp32 features. */
rt_status rt_relu_forward(rt_model_ctx *ctx, size_t count, const rt_act *x, rt_act *y);
rt_status rt_relu_backward(rt_model_ctx *ctx, size_t count, const rt_act *y, const rt_act *dy, rt_act *dx);
rt_status rt_relu_forward_f32(rt_model_ctx *ctx, size_t count, const float *x, float *y);
rt_status rt_relu_backward_f32(rt_model_ctx *ctx, size_t count, const float *y, const float *dy, float *dx);

/* maxpool2d: x (n, c, in_h, in_w) -> y (n, c, out_h, out_w). Backward routes dy to the
 * (first) maximum of each window; dx written. */
rt_status rt_maxpool2d_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y);
rt_status rt_maxpool2d_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                const rt_act *dy, rt_act *dx);

/* global average pooling + flatten: activations x (n, c, hw) -> fp32 features y (n, c) (a
 * model boundary: the sum is fp32); backward: dx (activations) written */
rt_status rt_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y);
rt_status rt_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx);

/* linear: x (n, in_f) -> y (n, out_f) = x W^T + b; backward writes dweight, dbias and
 * dx (written, or NULL) */
rt_status rt_linear_forward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y);
rt_status rt_linear_backward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy, float *dx);

/* dropout: training draws a fresh mask from the layer's Philox stream (element i of
 * the draw is rt_philox_uniform_at(seed, subseq, counter + i) < p -> dropped) and
 * scales kept values by 1/(1-p); evaluation (or p == 0) copies. y may be x.
 * Backward: dx = dy * mask (dx may be dy). The mask is indexed in PyTorch's order (draw
 * i is element i of the NCHW tensor, or channel i of Dropout2d) whatever the activation
 * layout, so masks agree across backends and formats. rt_dropout_forward takes
 * activations (in the context's format), the _f32 pair fp32 features (n, features). */
rt_status rt_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, const rt_act *x, rt_act *y, bool training);
rt_status rt_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, const rt_act *dy, rt_act *dx);
rt_status rt_dropout_forward_f32(rt_model_ctx *ctx, rt_dropout *l, int n, const float *x, float *y, bool training);
rt_status rt_dropout_backward_f32(rt_model_ctx *ctx, rt_dropout *l, int n, const float *dy, float *dx);

/* flatten activations (n, c, h, w) into fp32 features (n, c*h*w) in PyTorch's order (a
 * model boundary: converts from the context's format); backward converts dy back into
 * activations dx. y and dx may not alias x and dy except in the fp32 NCHW format, where
 * the two are the same bytes (nothing is copied when the pointers are equal). */
rt_status rt_flatten_forward(rt_model_ctx *ctx, int n, int c, int h, int w, const rt_act *x, float *y);
rt_status rt_flatten_backward(rt_model_ctx *ctx, int n, int c, int h, int w, const float *dy, rt_act *dx);

/* residual add: y = a + b (y may be a or b). Its backward is the identity into both
 * inputs, done by the callers with `accumulate`; rt_add_backward adds dy into dx. */
rt_status rt_add_forward(rt_model_ctx *ctx, size_t count, const rt_act *a, const rt_act *b, rt_act *y);
rt_status rt_add_backward(rt_model_ctx *ctx, size_t count, const rt_act *dy, rt_act *dx);
/* dx += dy over fp32 values (features, parameter gradients), on the context's stream */
rt_status rt_add_backward_f32(rt_model_ctx *ctx, size_t count, const float *dy, float *dx);

/* softmax cross-entropy, mean over the batch: logits (n, k), labels (n) int64 in [0, k)
 * on the device. Writes the mean loss to *loss (one float on the device) and
 * dlogits = (softmax - onehot) / n. A label out of range is an error on the CPU; on
 * CUDA it is counted and reported by the next host-side check. */
rt_status rt_softmax_xent(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels, float *loss,
                          float *dlogits);
/* The same with label smoothing eps in [0, 1], torch.nn.CrossEntropyLoss(label_smoothing=eps):
 * the target is (1 - eps) * onehot + eps / k, so per row
 *   loss = logsumexp(x) - (1 - eps) * x[label] - eps * mean(x)
 *   dlogits = (softmax(x) - (1 - eps) * onehot - eps / k) / n
 * (eps = 0 is rt_softmax_xent exactly). */
rt_status rt_softmax_xent_smooth(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels,
                                 double smoothing, float *loss, float *dlogits);
/* log-softmax over the last dim: x (n, k) -> y (n, k); backward from the output:
 * dx = dy - exp(y) * sum(dy) */
rt_status rt_log_softmax_forward(rt_model_ctx *ctx, int n, int k, const float *x, float *y);
rt_status rt_log_softmax_backward(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy, float *dx);
/* negative log likelihood of log-probabilities, mean over the batch:
 * *loss = -mean(logp[i, labels[i]]); dlogp = -onehot / n */
rt_status rt_nll_loss(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                      float *dlogp);

#ifdef __cplusplus
}
#endif

#endif
