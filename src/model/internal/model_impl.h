/* Private to src/model: the inside of rt_model shared by model.c, resnet.c and net.c. */
#ifndef RT_MODEL_IMPL_H
#define RT_MODEL_IMPL_H

#include "model/layers.h"
#include "model/model.h"

typedef struct rt_arch_ops {
    rt_status (*prepare)(rt_model *m); /* after allocation: prepare layers, reserve workspace */
    rt_status (*forward)(rt_model *m, const float *x, int n, bool training);
    rt_status (*backward)(rt_model *m, rt_grad_ready_fn ready, void *user);
    void (*seed_dropout)(rt_model *m, uint64_t seed);
    void (*release)(rt_model *m); /* release layer state and free m->arch */
} rt_arch_ops;

typedef struct act_patch {
    float **slot;
    size_t offset;
} act_patch;

struct rt_model {
    rt_model_config cfg;
    rt_model_ctx *ctx;
    rt_arena params, grads, buffers, acts;
    rt_param *table;
    int nparams, cap_params;
    int nblocks;
    size_t *block_begin; /* grad byte offset where block b starts (nblocks + 1 entries) */
    act_patch *patches;
    int npatches, cap_patches;
    const rt_arch_ops *ops;
    void *arch;
    /* head */
    float *out;  /* (max_batch, num_classes): logits or log-probabilities */
    float *dout; /* gradient of the loss w.r.t. out */
    float *loss_dev;
    const float *input; /* the last forward's input (kept by the caller until backward) */
    int last_n;
    bool last_training, have_loss;
};

/* Setup helpers (model.c). Parameters are registered in state_dict order. */
rt_status model_add_param(rt_model *m, const char *prefix, const char *suffix, rt_param_kind kind, int block,
                          rt_tensor *value, rt_tensor *grad);
rt_status model_add_conv(rt_model *m, const char *prefix, int block, rt_conv2d *l);
rt_status model_add_bn(rt_model *m, const char *prefix, int block, rt_batchnorm2d *l);
rt_status model_add_linear(rt_model *m, const char *prefix, int block, rt_linear *l);
/* plan `nfloats` floats of activation memory; *slot is set after allocation */
rt_status model_act(rt_model *m, size_t nfloats, float **slot);
rt_status model_prepare_conv(rt_model *m, rt_conv2d *l);
rt_status model_prepare_bn(rt_model *m, rt_batchnorm2d *l);
rt_status model_prepare_linear(rt_model *m, rt_linear *l);
/* tell the callback that block b's gradients are final */
rt_status model_block_done(rt_model *m, int b, rt_grad_ready_fn ready, void *user);

rt_status rt_resnet_build(rt_model *m);
rt_status rt_net_build(rt_model *m);

#endif
