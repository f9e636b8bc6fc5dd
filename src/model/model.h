/* Models: ResNet18/34 (torchvision layout) and the PyTorch distributed tutorial's Net.
 *
 * A model owns three arenas on the context's device: parameters, gradients (same
 * offsets as the parameters) and buffers (BN running statistics, num_batches_tracked),
 * plus its activations, allocated once for `max_batch` images. The parameter table
 * lists every state_dict entry with torchvision's name, in torchvision's order, so a
 * checkpoint of the parameters and buffers loads into torchvision with strict=True.
 *
 * Parameters are placed in forward order; backward finishes them in reverse, so the
 * gradient arena completes from its end toward its start. After each block's backward,
 * the grad-ready callback is told which byte range [begin, end) of the gradient arena
 * is now final: the ranges arrive in decreasing order, are contiguous and together
 * cover the whole arena (padding included), which is what a bucketed all-reduce needs.
 * On CUDA the callback runs when the block's work has been enqueued on ctx->stream
 * (record an event there to wait for it); on the CPU the gradients are already written.
 *
 * The hot loop (forward, loss, backward) does not allocate.
 */
#ifndef RT_MODEL_MODEL_H
#define RT_MODEL_MODEL_H

#include "core/tensor.h"
#include "core/info.h"
#include "model/ctx.h"
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Each architecture is one row of the table in arch.c (see docs/model.md). */
typedef enum rt_model_arch { RT_ARCH_RESNET18 = 0, RT_ARCH_RESNET34, RT_ARCH_NET, RT_ARCH_COUNT_ } rt_model_arch;
/* RT_STEM_AUTO: only in a config (train's model.stem auto), which resolves it from the
 * dataset before rt_model_create; the model takes imagenet or cifar. */
typedef enum rt_stem { RT_STEM_AUTO = -1, RT_STEM_IMAGENET = 0, RT_STEM_CIFAR, RT_STEM_COUNT_ } rt_stem;

typedef struct rt_model_config {
    rt_model_arch arch;
    int in_channels; /* 1 (MNIST) or 3 (CIFAR); Net: 1 */
    int in_h, in_w;  /* input image size; Net: 28x28 */
    int num_classes; /* Net: 10 */
    rt_stem stem;    /* ResNet: imagenet (7x7/2 conv + 3x3/2 maxpool) or cifar (3x3/1 conv) */
    int width;       /* ResNet base channels (64 = torchvision) */
    int max_batch;   /* activations are allocated for this many images */
    double dropout;  /* Net: drop probability of both dropouts (0.5 in the tutorial); NaN or -1 = default */
} rt_model_config;

/* Defaults: resnet34, 1x28x28, 10 classes, imagenet stem, width 64, max_batch 64. */
void rt_model_config_default(rt_model_config *cfg);
/* "resnet18" | "resnet34" | "net" and "imagenet" | "cifar", ASCII case-insensitive;
 * RT_ERR_INVALID naming the accepted names if unknown (or NULL). Names are lowercase. */
rt_status rt_model_arch_parse(const char *text, rt_model_arch *out);
/* The name tables those parse (core/names.h): the architectures' names from their rows. */
extern const rt_names rt_model_arch_names, rt_stem_names;
rt_status rt_stem_parse(const char *text, rt_stem *out);
const char *rt_model_arch_name(rt_model_arch a);
const char *rt_stem_name(rt_stem s);

typedef enum rt_param_kind {
    RT_PARAM_WEIGHT = 0, /* conv and linear weights: weight decay applies */
    RT_PARAM_BIAS,       /* conv and linear biases */
    RT_PARAM_BN_WEIGHT,  /* batch-norm gamma */
    RT_PARAM_BN_BIAS,    /* batch-norm beta */
    RT_PARAM_BUFFER,     /* running_mean, running_var, num_batches_tracked: not trained */
} rt_param_kind;

typedef struct rt_param {
    char name[64]; /* torchvision's state_dict key: "layer2.0.downsample.1.running_var" */
    rt_param_kind kind;
    rt_tensor value; /* in the parameter arena (buffers: in the buffer arena) */
    rt_tensor grad;  /* same offset in the gradient arena; grad.arena == NULL for buffers */
    int block;       /* index of the block that owns it (see rt_model_block_count) */
} rt_param;

static inline bool rt_param_trainable(const rt_param *p) { return p->kind != RT_PARAM_BUFFER; }
/* Weight decay: weights only (not biases, not BN parameters), the usual exclusion. */
static inline bool rt_param_decays(const rt_param *p) { return p->kind == RT_PARAM_WEIGHT; }

typedef struct rt_model rt_model;

/* Build a model on ctx->device (the context must outlive it): plans and allocates the
 * arenas and activations, prepares every layer, reserves the workspace, and
 * initialises the weights with seed 0 (rt_model_init_weights for another seed,
 * rt_model_load for saved ones). */
rt_status rt_model_create(const rt_model_config *cfg, rt_model_ctx *ctx, rt_model **out);
void rt_model_destroy(rt_model *m);

/* Initialise like torchvision from `seed` (identical on every rank and device): convs
 * kaiming_normal_(fan_out, relu) in ResNet, PyTorch's Conv2d/Linear default
 * (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias) elsewhere, BN weight 1,
 * bias 0, running mean 0, var 1, num_batches_tracked 0. Parameter i of the table draws
 * from Philox subsequence i. Also seeds the dropout layers from `seed`. */
rt_status rt_model_init_weights(rt_model *m, uint64_t seed);
/* Seed of the dropout masks (e.g. seed + rank); resets their counters. */
void rt_model_set_dropout_seed(rt_model *m, uint64_t seed);
/* Dropout state for checkpoints: the draws each dropout layer has used so far, in
 * forward order. Returns the number of dropout layers (0: none) and copies up to cap
 * counters. Restore with rt_model_set_dropout_counters after rt_model_set_dropout_seed
 * (which resets them); n must be that number (RT_ERR_INVALID otherwise). */
int rt_model_dropout_counters(const rt_model *m, uint64_t *out, int cap);
rt_status rt_model_set_dropout_counters(rt_model *m, const uint64_t *counters, int n);

const rt_model_config *rt_model_config_of(const rt_model *m);
rt_model_ctx *rt_model_context(const rt_model *m);

/* The parameter table: every state_dict entry in torchvision's order. */
int rt_model_param_count(const rt_model *m);
const rt_param *rt_model_param(const rt_model *m, int i);
/* NULL when no entry has that name */
const rt_param *rt_model_param_find(const rt_model *m, const char *name);
rt_arena *rt_model_params(rt_model *m);             /* trainable parameters */
rt_arena *rt_model_grads(rt_model *m);              /* gradients, same layout */
rt_arena *rt_model_buffers(rt_model *m);            /* BN buffers */
int64_t rt_model_num_parameters(const rt_model *m); /* trainable elements */
/* FLOPs of one image in the convolutions and linear layers, counted from the layer shapes
 * (2 per multiply-accumulate, as torch.profiler's with_flops counts aten::conv2d and
 * aten::addmm): the forward, or with `training` a whole step: the forward, the weight
 * gradients and the input gradients, each the forward's cost, less the first
 * convolution's input gradient, which is never computed. Batch norm, ReLU, pooling, the
 * loss and the optimizer are elementwise and not counted (well under 1% of a ResNet's).
 * ResNet34, 1x28x28, imagenet stem, width 64: 0.1393 GFLOP forward, 0.4167 a step. */
double rt_model_flops_per_image(const rt_model *m, bool training);

/* Blocks are the units of the grad-ready callback: ResNet: 0 = stem (conv1, bn1), then
 * every BasicBlock in order, last = fc; Net: conv1, conv2, fc1, fc2. */
int rt_model_block_count(const rt_model *m);
/* Bytes [*begin, *end) of the gradient arena that block b writes: the range its
 * grad-ready callback reports. The blocks tile the arena in order (block 0 at offset 0),
 * so a gradient reducer can plan its buckets before the first backward. */
void rt_model_block_range(const rt_model *m, int b, size_t *begin, size_t *end);

/* Forward pass of n <= max_batch images x (n, in_channels, in_h, in_w) on the device.
 * training: batch-norm batch statistics (running statistics updated) and dropout on;
 * else running statistics and no dropout. x must stay unchanged until the backward of
 * this forward (conv1's weight gradient reads it). */
rt_status rt_model_forward(rt_model *m, const float *x, int n, bool training);
/* The output of the last forward, (n, num_classes) on the device: logits for ResNet,
 * log-probabilities for Net. */
const float *rt_model_output(const rt_model *m);

/* Loss of the last forward against labels (n) int64 on the device (the loader's label
 * type, as in PyTorch): cross-entropy of the
 * logits (ResNet) or NLL of the log-probabilities (Net), mean over the batch. Also
 * computes the output gradient for rt_model_backward. The value stays on the device
 * until rt_model_loss_value (which synchronises). */
rt_status rt_model_loss(rt_model *m, const int64_t *labels);
/* Label smoothing of the loss (torch.nn.CrossEntropyLoss(label_smoothing=eps)), eps in
 * [0, 1]; 0 (the default) is plain cross-entropy. ResNet only: Net's loss is nll_loss
 * (RT_ERR_UNSUPPORTED for eps > 0). */
rt_status rt_model_set_label_smoothing(rt_model *m, double eps);
double rt_model_label_smoothing(const rt_model *m);
/* Synchronised batch norm (model.sync_bn, torch.nn.SyncBatchNorm; docs/model.md): every
 * training batch norm's statistics over the batches of all ranks, its backward reduced
 * the same way, through `sync` (model/ctx.h: rt_bn_sync); NULL turns it off. A model
 * without batch norm (net) takes it and has nothing to synchronise. */
rt_status rt_model_set_bn_sync(rt_model *m, const rt_bn_sync *sync);
rt_status rt_model_loss_value(rt_model *m, float *loss);
/* The mean loss of the last rt_model_loss where it is computed (device memory on a GPU,
 * valid once the model's stream got there): to read it back without a synchronisation
 * of its own, e.g. together with other values. NULL before rt_model_loss. */
const float *rt_model_loss_ptr(const rt_model *m);
/* A training forward and loss of n images from x that ran in a CUDA graph replay (the
 * host did not call rt_model_forward and rt_model_loss for it): the model's record of its
 * last forward (input, batch size, training, loss present) is set as those calls set it,
 * so that rt_model_loss_value and rt_model_backward after the replay see the replayed
 * step, not what ran uncaptured last (an evaluation, a partial batch). */
void rt_model_note_replayed(rt_model *m, const float *x, int n);

/* Called after each block's backward: grads [begin, end) bytes of the gradient arena
 * are final. Return non-OK to abort the backward pass with that status. */
typedef rt_status (*rt_grad_ready_fn)(void *user, int block, size_t begin, size_t end);

/* Backward of the last training forward + loss: writes (not accumulates) every
 * parameter gradient. `ready` may be NULL. */
rt_status rt_model_backward(rt_model *m, rt_grad_ready_fn ready, void *user);

/* Convenience: forward (training) + loss + backward; *loss on the host if non-NULL. */
rt_status rt_model_train_step(rt_model *m, const float *x, const int64_t *labels, int n, rt_grad_ready_fn ready,
                              void *user, float *loss);

/* State dict in safetensors with torchvision's names (parameters and buffers), as
 * torch.save(model.state_dict()) would hold it: loads with strict=True. Loading checks
 * that every name is present with the right dtype and shape, and no extra names. */
rt_status rt_model_save(rt_model *m, const char *path);
rt_status rt_model_load(rt_model *m, const char *path);

/* The libraries src/model links (cuDNN, cuBLAS, OpenBLAS, oneDNN), for `ringtrain info`. */
int rt_model_lib_versions(rt_lib_version *out, int cap);

/* For benchmark records (issue 22): cpu_bf16 is whether this CPU has the AVX-512 BF16
 * instructions (vcvtneps2bf16, vdpbf16ps); onednn_isa the instruction set oneDNN's
 * kernels use here ("avx512_core_bf16", "avx512_core" (bf16 then emulated),
 * "avx2", ...; "not built" without oneDNN). */
bool rt_model_cpu_bf16(void);
const char *rt_model_onednn_isa(void);
/* Whether train.precision bf16 runs its CPU convolutions on bf16 instructions: oneDNN is
 * built and its kernels use AVX-512 BF16 (or AMX; ONEDNN_MAX_CPU_ISA can lower that).
 * Otherwise bf16 is emulated (oneDNN's avx512_core kernels, or fp32 products of
 * bf16-rounded values): the same rounding points, no faster than fp32. When false and
 * `why` is given, it says which (e.g. "oneDNN's kernels use avx2"). */
bool rt_model_cpu_bf16_native(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
