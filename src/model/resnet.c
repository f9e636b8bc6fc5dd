/* ResNet18 / ResNet34 in torchvision's layout (BasicBlock, expansion 1).
 *
 *   stem    conv1 (7x7/2 p3, imagenet | 3x3/1 p1, cifar) -> bn1 -> relu [-> maxpool 3x3/2 p1]
 *   layer1..layer4   [2,2,2,2] or [3,4,6,3] BasicBlocks of width, 2w, 4w, 8w channels;
 *           the first block of layer2..4 has stride 2 and a downsample (1x1/2 conv + BN)
 *   head    global average pool -> fc (8w -> num_classes)
 *
 * BasicBlock:  out = relu(bn2(conv2(relu(bn1(conv1(x))))) + identity(x))
 *
 * Every activation a backward pass needs is kept (allocated once for max_batch);
 * batch norm, the residual add and relu are one layer call (rt_batchnorm2d_forward_act,
 * fused on the CPU), and so are relu's and batch norm's backward inside a block. Backward walks the head, the blocks in
 * reverse and the stem, reporting each finished block to the grad-ready callback.
 * Gradient scratch: two ping-pong buffers for the block input/output gradients and
 * two temporaries inside a block, each as large as the largest activation.
 */
#include "model/internal/model_impl.h"
#include "core/names.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- stems -------------------------------------------------------------------------- */

static const char *const k_stem_names[RT_STEM_COUNT_] = {[RT_STEM_IMAGENET] = "imagenet", [RT_STEM_CIFAR] = "cifar"};

const rt_names rt_stem_names = {"stem", RT_STEM_COUNT_, k_stem_names, NULL, NULL};

rt_status rt_stem_parse(const char *text, rt_stem *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_stem_names, text, &i);
    if (st != RT_OK) return st; /* the message is complete: no trace line */
    *out = (rt_stem)i;
    return RT_OK;
}

const char *rt_stem_name(rt_stem s) { return (unsigned)s < RT_STEM_COUNT_ ? k_stem_names[s] : "?"; }

typedef struct basic_block {
    rt_conv2d conv1, conv2, ds_conv;
    rt_batchnorm2d bn1, bn2, ds_bn;
    bool has_ds;
    size_t in_count, out_count; /* elements per image */
    const rt_act *x;            /* input of the last forward */
    rt_act *c1, *a1, *c2, *out, *dsc, *dsb;
} basic_block;

typedef struct resnet {
    rt_conv2d conv1;
    rt_batchnorm2d bn1;
    rt_maxpool2d maxpool;
    bool has_maxpool;
    rt_act *stem_c, *stem_a, *stem_out; /* conv out, bn+relu out, maxpool out (or stem_a) */
    size_t stem_c_count, stem_out_count;
    basic_block *blocks;
    int nblocks;
    int feat_c, feat_hw;
    float *pooled, *dpooled; /* fp32 features (n, feat_c) */
    rt_linear fc;
    rt_act *g0, *g1, *t1, *t2;
} resnet;

static size_t chw(int c, int h, int w) { return (size_t)c * (size_t)h * (size_t)w; }

static rt_status block_plan(rt_model *m, basic_block *b, const char *prefix, int block, int in_c, int out_c, int h,
                            int w, int stride, size_t *max_act) {
    int N = m->cfg.max_batch;
    char name[64];
    RT_CHECK(rt_conv2d_init(&b->conv1, in_c, out_c, h, w, 3, stride, 1, false));
    int oh = b->conv1.out_h, ow = b->conv1.out_w;
    RT_CHECK(rt_batchnorm2d_init(&b->bn1, out_c, oh, ow));
    RT_CHECK(rt_conv2d_init(&b->conv2, out_c, out_c, oh, ow, 3, 1, 1, false));
    RT_CHECK(rt_batchnorm2d_init(&b->bn2, out_c, oh, ow));
    b->has_ds = stride != 1 || in_c != out_c;
    b->in_count = chw(in_c, h, w);
    b->out_count = chw(out_c, oh, ow);
    snprintf(name, sizeof name, "%s.conv1", prefix);
    RT_CHECK(rt_model_add_conv(m, name, block, &b->conv1));
    snprintf(name, sizeof name, "%s.bn1", prefix);
    RT_CHECK(rt_model_add_bn(m, name, block, &b->bn1));
    snprintf(name, sizeof name, "%s.conv2", prefix);
    RT_CHECK(rt_model_add_conv(m, name, block, &b->conv2));
    snprintf(name, sizeof name, "%s.bn2", prefix);
    RT_CHECK(rt_model_add_bn(m, name, block, &b->bn2));
    if (b->has_ds) {
        RT_CHECK(rt_conv2d_init(&b->ds_conv, in_c, out_c, h, w, 1, stride, 0, false));
        RT_CHECK(rt_batchnorm2d_init(&b->ds_bn, out_c, oh, ow));
        snprintf(name, sizeof name, "%s.downsample.0", prefix);
        RT_CHECK(rt_model_add_conv(m, name, block, &b->ds_conv));
        snprintf(name, sizeof name, "%s.downsample.1", prefix);
        RT_CHECK(rt_model_add_bn(m, name, block, &b->ds_bn));
        RT_CHECK(rt_model_act(m, N * b->out_count, &b->dsc));
        RT_CHECK(rt_model_act(m, N * b->out_count, &b->dsb));
    }
    RT_CHECK(rt_model_act(m, N * b->out_count, &b->c1));
    RT_CHECK(rt_model_act(m, N * b->out_count, &b->a1));
    RT_CHECK(rt_model_act(m, N * b->out_count, &b->c2));
    RT_CHECK(rt_model_act(m, N * b->out_count, &b->out));
    if (b->out_count > *max_act) *max_act = b->out_count;
    if (b->in_count > *max_act) *max_act = b->in_count;
    return RT_OK;
}

static rt_status resnet_prepare(rt_model *m) {
    resnet *r = m->arch;
    if (!r->has_maxpool) r->stem_out = r->stem_a;
    RT_CHECK(rt_model_prepare_conv(m, &r->conv1));
    RT_CHECK(rt_model_prepare_bn(m, &r->bn1));
    if (r->has_maxpool) RT_CHECK(rt_maxpool2d_prepare(m->ctx, &r->maxpool, m->cfg.max_batch));
    for (int i = 0; i < r->nblocks; i++) {
        basic_block *b = &r->blocks[i];
        RT_CHECK(rt_model_prepare_conv(m, &b->conv1));
        RT_CHECK(rt_model_prepare_bn(m, &b->bn1));
        RT_CHECK(rt_model_prepare_conv(m, &b->conv2));
        RT_CHECK(rt_model_prepare_bn(m, &b->bn2));
        if (b->has_ds) {
            RT_CHECK(rt_model_prepare_conv(m, &b->ds_conv));
            RT_CHECK(rt_model_prepare_bn(m, &b->ds_bn));
        }
    }
    RT_CHECK(rt_model_prepare_linear(m, &r->fc));
    return RT_OK;
}

static void resnet_release(rt_model *m) {
    resnet *r = m->arch;
    if (!r) return;
    rt_model_ctx *ctx = m->ctx;
    rt_conv2d_release(ctx, &r->conv1);
    rt_batchnorm2d_release(ctx, &r->bn1);
    rt_maxpool2d_release(ctx, &r->maxpool);
    for (int i = 0; r->blocks && i < r->nblocks; i++) {
        basic_block *b = &r->blocks[i];
        rt_conv2d_release(ctx, &b->conv1);
        rt_conv2d_release(ctx, &b->conv2);
        rt_conv2d_release(ctx, &b->ds_conv);
        rt_batchnorm2d_release(ctx, &b->bn1);
        rt_batchnorm2d_release(ctx, &b->bn2);
        rt_batchnorm2d_release(ctx, &b->ds_bn);
    }
    rt_linear_release(ctx, &r->fc);
    free(r->blocks);
    free(r);
    m->arch = NULL;
}

static rt_status block_forward(rt_model_ctx *ctx, basic_block *b, int n, const rt_act *x, bool training) {
    b->x = x;
    RT_CHECK(rt_conv2d_forward(ctx, &b->conv1, n, x, b->c1));
    RT_CHECK(rt_batchnorm2d_forward_act(ctx, &b->bn1, n, b->c1, NULL, b->a1, training, true));
    RT_CHECK(rt_conv2d_forward(ctx, &b->conv2, n, b->a1, b->c2));
    const rt_act *identity = x;
    if (b->has_ds) {
        RT_CHECK(rt_conv2d_forward(ctx, &b->ds_conv, n, x, b->dsc));
        RT_CHECK(rt_batchnorm2d_forward(ctx, &b->ds_bn, n, b->dsc, b->dsb, training));
        identity = b->dsb;
    }
    RT_CHECK(rt_batchnorm2d_forward_act(ctx, &b->bn2, n, b->c2, identity, b->out, training, true));
    return RT_OK;
}

/* gout: gradient of the block output (n, out) - overwritten; gin: gradient of the block
 * input, written */
static rt_status block_backward(rt_model_ctx *ctx, resnet *r, basic_block *b, int n, rt_act *gout, rt_act *gin) {
    const rt_act *x = b->x;
    /* the ReLU's backward g (the shortcut's gradient) is kept as bn2's backward runs: in gout
     * (in place) for the downsample's batch norm, or written straight into gin, which the
     * identity shortcut's gradient is, and which conv1's backward then adds to */
    RT_CHECK(rt_batchnorm2d_backward_act_keep(ctx, &b->bn2, n, b->c2, b->out, gout, b->has_ds ? gout : gin, r->t1,
                                              false));
    RT_CHECK(rt_conv2d_backward(ctx, &b->conv2, n, b->a1, r->t1, r->t2, false));
    RT_CHECK(rt_batchnorm2d_backward_act(ctx, &b->bn1, n, b->c1, b->a1, r->t2, r->t1, false));
    RT_CHECK(rt_conv2d_backward(ctx, &b->conv1, n, x, r->t1, gin, !b->has_ds));
    if (b->has_ds) {
        RT_CHECK(rt_batchnorm2d_backward(ctx, &b->ds_bn, n, b->dsc, gout, r->t2, false));
        RT_CHECK(rt_conv2d_backward(ctx, &b->ds_conv, n, x, r->t2, gin, true));
    }
    return RT_OK;
}

static rt_status resnet_forward(rt_model *m, const rt_act *x, int n, bool training) {
    resnet *r = m->arch;
    rt_model_ctx *ctx = m->ctx;
    RT_CHECK(rt_conv2d_forward(ctx, &r->conv1, n, x, r->stem_c));
    RT_CHECK(rt_batchnorm2d_forward_act(ctx, &r->bn1, n, r->stem_c, NULL, r->stem_a, training, true));
    if (r->has_maxpool) RT_CHECK(rt_maxpool2d_forward(ctx, &r->maxpool, n, r->stem_a, r->stem_out));
    const rt_act *h = r->stem_out;
    for (int i = 0; i < r->nblocks; i++) {
        RT_CHECK(block_forward(ctx, &r->blocks[i], n, h, training));
        h = r->blocks[i].out;
    }
    RT_CHECK(rt_avgpool_forward(ctx, n, r->feat_c, r->feat_hw, h, r->pooled));
    RT_CHECK(rt_linear_forward(ctx, &r->fc, n, r->pooled, m->out));
    return RT_OK;
}

static rt_status resnet_backward(rt_model *m, rt_grad_ready_fn ready, void *user) {
    resnet *r = m->arch;
    rt_model_ctx *ctx = m->ctx;
    const int n = m->last_n;
    RT_CHECK(rt_linear_backward(ctx, &r->fc, n, r->pooled, m->dout, r->dpooled));
    RT_CHECK(rt_model_block_done(m, r->nblocks + 1, ready, user));
    rt_act *g = r->g0, *other = r->g1;
    RT_CHECK(rt_avgpool_backward(ctx, n, r->feat_c, r->feat_hw, r->dpooled, g));
    for (int i = r->nblocks - 1; i >= 0; i--) {
        RT_CHECK(block_backward(ctx, r, &r->blocks[i], n, g, other));
        RT_CHECK(rt_model_block_done(m, i + 1, ready, user));
        rt_act *t = g;
        g = other;
        other = t;
    }
    /* g: gradient of stem_out */
    rt_act *ga = g;
    if (r->has_maxpool) {
        RT_CHECK(rt_maxpool2d_backward(ctx, &r->maxpool, n, r->stem_a, r->stem_out, g, other));
        ga = other;
    }
    rt_act *gc = ga == r->g0 ? r->g1 : r->g0;
    RT_CHECK(rt_batchnorm2d_backward_act(ctx, &r->bn1, n, r->stem_c, r->stem_a, ga, gc, false));
    RT_CHECK(rt_conv2d_backward(ctx, &r->conv1, n, rt_model_input_act(m), gc, NULL, false));
    RT_CHECK(rt_model_block_done(m, 0, ready, user));
    return RT_OK;
}

static rt_status resnet_check(const rt_model_config *c) {
    char list[64];
    RT_REQUIRE((unsigned)c->stem < RT_STEM_COUNT_, RT_ERR_INVALID, "model stem %d (expected %s)", (int)c->stem,
               rt_names_list(&rt_stem_names, list, sizeof list));
    RT_REQUIRE(c->width > 0 && c->width <= 4096, RT_ERR_INVALID, "model width %d (expected 1..4096)", c->width);
    return RT_OK;
}

/* torchvision's ResNet: convolutions kaiming_normal_(mode='fan_out', nonlinearity='relu');
 * fc keeps PyTorch's Linear default */
static bool resnet_init_param(const rt_param *p, double fan_in, double fan_out, rt_rng *rng, float *host, size_t n) {
    if (p->kind != RT_PARAM_WEIGHT || p->value.ndim != 4) return false;
    rt_rng_normal(rng, host, n, 0.0f, (float)sqrt(2.0 / fan_out));
    return true;
}

/* variant: BasicBlocks per stage */
static rt_status resnet_build(rt_model *m) {
    const rt_model_config *c = &m->cfg;
    const int *layers = m->ops->variant;
    resnet *r = calloc(1, sizeof *r);
    RT_CHECK_ALLOC(r, sizeof *r);
    m->arch = r;
    r->nblocks = layers[0] + layers[1] + layers[2] + layers[3];
    r->blocks = calloc((size_t)r->nblocks, sizeof *r->blocks);
    RT_CHECK_ALLOC(r->blocks, sizeof *r->blocks * (size_t)r->nblocks);
    const int N = c->max_batch, w0 = c->width;
    size_t max_act = 0;
    /* stem: block 0 */
    if (c->stem == RT_STEM_IMAGENET)
        RT_CHECK(rt_conv2d_init(&r->conv1, c->in_channels, w0, c->in_h, c->in_w, 7, 2, 3, false));
    else
        RT_CHECK(rt_conv2d_init(&r->conv1, c->in_channels, w0, c->in_h, c->in_w, 3, 1, 1, false));
    r->conv1.x_c = m->x_c; /* the input's stored channels (padding: model/ctx.h) */
    int h = r->conv1.out_h, w = r->conv1.out_w;
    RT_CHECK(rt_batchnorm2d_init(&r->bn1, w0, h, w));
    RT_CHECK(rt_model_add_conv(m, "conv1", 0, &r->conv1));
    RT_CHECK(rt_model_add_bn(m, "bn1", 0, &r->bn1));
    r->stem_c_count = chw(w0, h, w);
    RT_CHECK(rt_model_act(m, N * r->stem_c_count, &r->stem_c));
    RT_CHECK(rt_model_act(m, N * r->stem_c_count, &r->stem_a));
    max_act = r->stem_c_count;
    r->has_maxpool = c->stem == RT_STEM_IMAGENET;
    if (r->has_maxpool) {
        RT_CHECK(rt_maxpool2d_init(&r->maxpool, w0, h, w, 3, 2, 1));
        h = r->maxpool.out_h;
        w = r->maxpool.out_w;
        RT_CHECK(rt_model_act(m, N * chw(w0, h, w), &r->stem_out));
    } else {
        /* no maxpool: stem_out is stem_a (patched after allocation through the slot) */
        r->stem_out = NULL;
    }
    r->stem_out_count = chw(w0, h, w);
    /* layers */
    int in_c = w0, bi = 0;
    for (int li = 0; li < 4; li++) {
        int out_c = w0 << li;
        for (int j = 0; j < layers[li]; j++, bi++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "layer%d.%d", li + 1, j);
            int stride = (li > 0 && j == 0) ? 2 : 1;
            basic_block *b = &r->blocks[bi];
            RT_CHECK(block_plan(m, b, prefix, bi + 1, in_c, out_c, h, w, stride, &max_act));
            h = b->conv1.out_h;
            w = b->conv1.out_w;
            in_c = out_c;
        }
    }
    r->feat_c = in_c;
    r->feat_hw = h * w;
    RT_CHECK(rt_model_feat(m, (size_t)N * in_c, &r->pooled));
    RT_CHECK(rt_model_feat(m, (size_t)N * in_c, &r->dpooled));
    RT_CHECK(rt_linear_init(&r->fc, in_c, c->num_classes));
    RT_CHECK(rt_model_add_linear(m, "fc", r->nblocks + 1, &r->fc));
    RT_CHECK(rt_model_act(m, N * max_act, &r->g0));
    RT_CHECK(rt_model_act(m, N * max_act, &r->g1));
    RT_CHECK(rt_model_act(m, N * max_act, &r->t1));
    RT_CHECK(rt_model_act(m, N * max_act, &r->t2));
    return RT_OK;
}

static const int k_layers18[4] = {2, 2, 2, 2}, k_layers34[4] = {3, 4, 6, 3};

#define RESNET_OPS                                                                                                     \
    .check = resnet_check, .build = resnet_build, .prepare = resnet_prepare, .init_param = resnet_init_param,          \
    .forward = resnet_forward, .backward = resnet_backward, .release = resnet_release

/* rows of the architecture table (arch.c); the loss is the default cross-entropy */
const rt_model_arch_ops rt_arch_resnet18 = {.name = "resnet18", .variant = k_layers18, RESNET_OPS};
const rt_model_arch_ops rt_arch_resnet34 = {.name = "resnet34", .variant = k_layers34, RESNET_OPS};
