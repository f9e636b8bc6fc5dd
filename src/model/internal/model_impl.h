/* Private to src/model: the inside of rt_model, the row of operations every
 * architecture fills in, and the setup helpers (params.c) the architectures call.
 *
 * Calls go one way:
 *
 *   model.c ──> arch.c (the table: one row per rt_model_arch) ──> resnet.c, net.c
 *      │                                                             │
 *      └──────────────> params.c (parameters, activations, arenas) <─┘ ──> layers.c
 *
 * model.c knows no architecture: it reaches one only through its row (m->ops), and the
 * architectures never call model.c.
 */
#ifndef RT_MODEL_INTERNAL_MODEL_IMPL_H
#define RT_MODEL_INTERNAL_MODEL_IMPL_H

#include "core/rng.h"
#include "model/layers.h"
#include "model/model.h"

/* One architecture. Required: name, build, prepare, forward, backward, release. */
typedef struct rt_model_arch_ops {
    const char *name;    /* canonical lowercase name: "resnet34" (parsed case-insensitively) */
    const void *variant; /* constants the architecture's code reads (ResNet: blocks per stage) */
    /* Architecture-specific rules for the config (model.c checks the generic ones first).
     * NULL: none. */
    rt_status (*check)(const rt_model_config *cfg);
    /* Plan the model: register the parameters in state_dict order (rt_model_add_*) and
     * the activations (rt_model_act), keep its state in m->arch. Nothing is allocated
     * on the device yet. */
    rt_status (*build)(rt_model *m);
    /* After the arenas are allocated: prepare the layers, reserve the workspace. */
    rt_status (*prepare)(rt_model *m);
    /* Initialise one weight or bias into host[0..n) (fans of the owning weight); return
     * false to leave it to PyTorch's Conv2d/Linear default. NULL: the default for all. */
    bool (*init_param)(const rt_param *p, double fan_in, double fan_out, rt_rng *rng, float *host, size_t n);
    /* Forward of the input activations x (m->x_act: the batch in the context's format, its
     * channels padded to m->x_c) into m->out (logits, or what `loss` expects). */
    rt_status (*forward)(rt_model *m, const rt_act *x, int n, bool training);
    /* Loss of m->out against the labels into m->loss_dev, gradient into m->dout. NULL:
     * cross-entropy of logits (rt_softmax_xent). */
    rt_status (*loss)(rt_model *m, const int64_t *labels);
    /* Backward from m->dout, telling rt_model_block_done about each finished block. */
    rt_status (*backward)(rt_model *m, rt_grad_ready_fn ready, void *user);
    void (*seed_dropout)(rt_model *m, uint64_t seed); /* NULL: no dropout */
    /* The dropout layers in forward order (up to cap); returns how many. NULL: none. */
    int (*dropouts)(rt_model *m, rt_dropout **out, int cap);
    void (*release)(rt_model *m); /* release layer state and free m->arch */
} rt_model_arch_ops;

/* The row of `arch` (arch.c), NULL when out of range. */
const rt_model_arch_ops *rt_model_arch_ops_of(rt_model_arch arch);

typedef struct rt_model_act_patch {
    void *slot; /* an rt_act ** (activations) or a float ** (feat) */
    bool feat;
    size_t offset;
} rt_model_act_patch;

struct rt_model {
    rt_model_config cfg;
    rt_model_ctx *ctx;
    rt_arena params, grads, buffers, acts;
    rt_param *table;
    int nparams, cap_params;
    int nblocks;
    size_t *block_begin; /* grad byte offset where block b starts (nblocks + 1 entries) */
    rt_model_act_patch *patches;
    int npatches, cap_patches;
    const rt_model_arch_ops *ops;
    void *arch;
    /* head */
    float *out;  /* (max_batch, num_classes): logits or log-probabilities */
    float *dout; /* gradient of the loss w.r.t. out */
    float *loss_dev;
    double label_smoothing; /* rt_model_set_label_smoothing: 0 = plain cross-entropy */
    double flops_fwd;       /* per image: convolutions and linear layers (rt_model_add_conv/_linear) */
    double flops_input;     /* per image: the first convolution's forward (it sees the input) */
    const float *input;     /* the last forward's input (kept by the caller until backward) */
    rt_conv2d **convs;      /* every convolution, by block (rt_model_convs_by_block) */
    int nconvs, cap_convs;
    int *conv_first;        /* nblocks + 1: block b's convolutions are convs[conv_first[b]..conv_first[b + 1]) */
    void *wcopies;          /* rt_conv2d_weights_prepare's state (dW deferred): refreshed at every forward */
    int dw_pending;         /* in a backward: convs[0..dw_pending) have their deferred dW still to write */
    rt_act *x_act;          /* the input in the context's format (NULL: fp32 NCHW, input itself) */
    int x_c;                /* channels x_act is stored with (rt_act_input_channels) */
    int last_n;
    bool last_training, have_loss;
};

/* the last forward's input as activations: x_act, or the fp32 NCHW batch itself */
static inline const rt_act *rt_model_input_act(const rt_model *m) {
    return m->x_act ? m->x_act : (const rt_act *)m->input;
}

/* ---- params.c: setup helpers. Parameters are registered in state_dict order. ---- */
rt_status rt_model_add_param(rt_model *m, const char *prefix, const char *suffix, rt_param_kind kind, int block,
                             rt_tensor *value, rt_tensor *grad);
rt_status rt_model_add_conv(rt_model *m, const char *prefix, int block, rt_conv2d *l);
rt_status rt_model_add_bn(rt_model *m, const char *prefix, int block, rt_batchnorm2d *l);
rt_status rt_model_add_linear(rt_model *m, const char *prefix, int block, rt_linear *l);
/* plan `nelems` elements of activation memory in the context's format (model/ctx.h), or
 * `nfloats` fp32 values (features, logits, batch-norm statistics, dropout masks); *slot
 * is set by rt_model_arenas_alloc */
rt_status rt_model_act(rt_model *m, size_t nelems, rt_act **slot);
rt_status rt_model_feat(rt_model *m, size_t nfloats, float **slot);
/* allocate the planned arenas, point the activation slots into them and compute the
 * gradient byte range of each block; rt_model_arenas_free undoes it (and the plan) */
rt_status rt_model_arenas_alloc(rt_model *m);
void rt_model_arenas_free(rt_model *m);
rt_status rt_model_prepare_conv(rt_model *m, rt_conv2d *l);
rt_status rt_model_prepare_bn(rt_model *m, rt_batchnorm2d *l);
rt_status rt_model_prepare_linear(rt_model *m, rt_linear *l);
/* order m->convs by the block of their weights (the order they were prepared in within
 * a block) and set m->conv_first; after the architecture's prepare */
rt_status rt_model_convs_by_block(rt_model *m);
/* Block b's backward is done (an architecture's backward calls it for every block, from
 * the last to the first): with a callback, the deferred dW of the blocks done since the
 * last call with one is written (one launch, rt_conv2d_weights_grads) and the callback
 * told that block b's gradients are final; without one nothing is written yet:
 * rt_model_grads_flush at the end of the backward writes the rest (one launch). */
rt_status rt_model_block_done(rt_model *m, int b, rt_grad_ready_fn ready, void *user);
rt_status rt_model_grads_flush(rt_model *m);

#endif
