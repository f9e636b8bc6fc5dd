/* The CNN of PyTorch's "Writing Distributed Applications with PyTorch" tutorial
 * (pytorch.org/tutorials/intermediate/dist_tuto.html), the MNIST example's Net:
 *
 *   class Net(nn.Module):
 *       def __init__(self):
 *           self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
 *           self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
 *           self.conv2_drop = nn.Dropout2d()
 *           self.fc1 = nn.Linear(320, 50)
 *           self.fc2 = nn.Linear(50, 10)
 *       def forward(self, x):
 *           x = F.relu(F.max_pool2d(self.conv1(x), 2))
 *           x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
 *           x = x.view(-1, 320)
 *           x = F.relu(self.fc1(x))
 *           x = F.dropout(x, training=self.training)
 *           x = self.fc2(x)
 *           return F.log_softmax(x)
 *
 * trained with F.nll_loss. Both dropouts have p = 0.5 (config `dropout` overrides;
 * 0 turns them off, as the reference test does). Shapes for a 1x28x28 input:
 * conv1 (10,24,24) -> pool (10,12,12) -> conv2 (20,8,8) -> pool (20,4,4) -> 320 -> 50 -> 10.
 * num_classes replaces the final 10.
 */
#include "model/internal/model_impl.h"

#include <math.h>
#include <stdlib.h>

typedef struct net {
    rt_conv2d conv1, conv2;
    rt_maxpool2d pool1, pool2;
    rt_dropout drop2d, drop;
    rt_linear fc1, fc2;
    rt_act *c1, *p1, *c2, *p2; /* activations (the context's format) */
    float *flat, *f1, *z;      /* fp32 features: p2 flattened (unused in fp32 NCHW: p2 is that), fc1, fc2 */
    rt_act *g_a, *g_b;         /* gradient scratch, activations */
    float *f_a, *f_b;          /* gradient scratch, features */
} net;

static rt_status net_prepare(rt_model *m) {
    net *t = m->arch;
    RT_CHECK(rt_model_prepare_conv(m, &t->conv1));
    RT_CHECK(rt_model_prepare_conv(m, &t->conv2));
    RT_CHECK(rt_maxpool2d_prepare(m->ctx, &t->pool1, m->cfg.max_batch));
    RT_CHECK(rt_maxpool2d_prepare(m->ctx, &t->pool2, m->cfg.max_batch));
    RT_CHECK(rt_model_prepare_linear(m, &t->fc1));
    RT_CHECK(rt_model_prepare_linear(m, &t->fc2));
    return RT_OK;
}

static void net_release(rt_model *m) {
    net *t = m->arch;
    if (!t) return;
    rt_conv2d_release(m->ctx, &t->conv1);
    rt_conv2d_release(m->ctx, &t->conv2);
    rt_maxpool2d_release(m->ctx, &t->pool1);
    rt_maxpool2d_release(m->ctx, &t->pool2);
    rt_linear_release(m->ctx, &t->fc1);
    rt_linear_release(m->ctx, &t->fc2);
    free(t);
    m->arch = NULL;
}

static void net_seed_dropout(rt_model *m, uint64_t seed) {
    net *t = m->arch;
    /* subsequences far above the parameter-init ones */
    t->drop2d.seed = t->drop.seed = seed;
    t->drop2d.subseq = 1u << 20;
    t->drop.subseq = (1u << 20) + 1;
    t->drop2d.counter = t->drop.counter = 0;
}

static int net_dropouts(rt_model *m, rt_dropout **out, int cap) {
    net *t = m->arch;
    rt_dropout *all[] = {&t->drop2d, &t->drop};
    for (int i = 0; i < 2 && i < cap; i++) out[i] = all[i];
    return 2;
}

/* p2 flattened: in the fp32 NCHW format the activation is its own flattening */
static float *net_flat(const rt_model *m, const net *t, rt_act *p2, float *flat) {
    return rt_act_is_nchw_f32(m->ctx) ? (float *)p2 : flat;
}

static rt_status net_forward(rt_model *m, const rt_act *x, int n, bool training) {
    net *t = m->arch;
    rt_model_ctx *ctx = m->ctx;
    float *flat = net_flat(m, t, t->p2, t->flat);
    RT_CHECK(rt_conv2d_forward(ctx, &t->conv1, n, x, t->c1));        /* (n, 10, 24, 24) */
    RT_CHECK(rt_maxpool2d_forward(ctx, &t->pool1, n, t->c1, t->p1)); /* (n, 10, 12, 12) */
    RT_CHECK(rt_relu_forward(ctx, (size_t)n * 1440, t->p1, t->p1));
    RT_CHECK(rt_conv2d_forward(ctx, &t->conv2, n, t->p1, t->c2)); /* (n, 20, 8, 8) */
    RT_CHECK(rt_dropout_forward(ctx, &t->drop2d, n, t->c2, t->c2, training));
    RT_CHECK(rt_maxpool2d_forward(ctx, &t->pool2, n, t->c2, t->p2)); /* (n, 20, 4, 4) */
    RT_CHECK(rt_relu_forward(ctx, (size_t)n * 320, t->p2, t->p2));
    RT_CHECK(rt_flatten_forward(ctx, n, 20, 4, 4, t->p2, flat)); /* (n, 320) */
    RT_CHECK(rt_linear_forward(ctx, &t->fc1, n, flat, t->f1));    /* (n, 50) */
    RT_CHECK(rt_relu_forward_f32(ctx, (size_t)n * 50, t->f1, t->f1));
    RT_CHECK(rt_dropout_forward_f32(ctx, &t->drop, n, t->f1, t->f1, training));
    RT_CHECK(rt_linear_forward(ctx, &t->fc2, n, t->f1, t->z)); /* (n, k) */
    RT_CHECK(rt_log_softmax_forward(ctx, n, m->cfg.num_classes, t->z, m->out));
    return RT_OK;
}

static rt_status net_backward(rt_model *m, rt_grad_ready_fn ready, void *user) {
    net *t = m->arch;
    rt_model_ctx *ctx = m->ctx;
    const int n = m->last_n, k = m->cfg.num_classes;
    float *fa = t->f_a, *fb = t->f_b;
    rt_act *a = t->g_a, *b = t->g_b;
    float *dflat = net_flat(m, t, a, fa);
    RT_CHECK(rt_log_softmax_backward(ctx, n, k, m->out, m->dout, fa)); /* dz */
    RT_CHECK(rt_linear_backward(ctx, &t->fc2, n, t->f1, fa, fb));      /* df1 */
    RT_CHECK(rt_model_block_done(m, 3, ready, user));
    RT_CHECK(rt_dropout_backward_f32(ctx, &t->drop, n, fb, fb));
    RT_CHECK(rt_relu_backward_f32(ctx, (size_t)n * 50, t->f1, fb, fb));
    RT_CHECK(rt_linear_backward(ctx, &t->fc1, n, net_flat(m, t, t->p2, t->flat), fb, dflat)); /* dp2 (n, 320) */
    RT_CHECK(rt_model_block_done(m, 2, ready, user));
    RT_CHECK(rt_flatten_backward(ctx, n, 20, 4, 4, dflat, a));
    RT_CHECK(rt_relu_backward(ctx, (size_t)n * 320, t->p2, a, a));
    RT_CHECK(rt_maxpool2d_backward(ctx, &t->pool2, n, t->c2, t->p2, a, b)); /* dc2 (n, 20, 8, 8) */
    RT_CHECK(rt_dropout_backward(ctx, &t->drop2d, n, b, b));
    RT_CHECK(rt_conv2d_backward(ctx, &t->conv2, n, t->p1, b, a, false)); /* dp1 (n, 10, 12, 12) */
    RT_CHECK(rt_model_block_done(m, 1, ready, user));
    RT_CHECK(rt_relu_backward(ctx, (size_t)n * 1440, t->p1, a, a));
    RT_CHECK(rt_maxpool2d_backward(ctx, &t->pool1, n, t->c1, t->p1, a, b)); /* dc1 (n, 10, 24, 24) */
    RT_CHECK(rt_conv2d_backward(ctx, &t->conv1, n, rt_model_input_act(m), b, NULL, false));
    RT_CHECK(rt_model_block_done(m, 0, ready, user));
    return RT_OK;
}

static rt_status net_check(const rt_model_config *c) {
    RT_REQUIRE(c->in_channels == 1 && c->in_h == 28 && c->in_w == 28, RT_ERR_INVALID,
               "model net is the MNIST tutorial CNN: input must be 1x28x28 (got %dx%dx%d)", c->in_channels, c->in_h,
               c->in_w);
    RT_REQUIRE(isnan(c->dropout) || (float)c->dropout < 1.0f, RT_ERR_INVALID,
               "model dropout %g (expected < 1 as a float: the layers keep p in single precision)", c->dropout);
    return RT_OK;
}

/* F.nll_loss of the log-probabilities */
static rt_status net_loss(rt_model *m, const int64_t *labels) {
    return rt_nll_loss(m->ctx, m->last_n, m->cfg.num_classes, m->out, labels, m->loss_dev, m->dout);
}

static rt_status net_build(rt_model *m) {
    net *t = calloc(1, sizeof *t);
    RT_CHECK_ALLOC(t, sizeof *t);
    m->arch = t;
    const size_t N = (size_t)m->cfg.max_batch;
    const float p = isnan(m->cfg.dropout) || m->cfg.dropout < 0.0 ? 0.5f : (float)m->cfg.dropout;
    RT_CHECK(rt_conv2d_init(&t->conv1, 1, 10, 28, 28, 5, 1, 0, true));
    t->conv1.x_c = m->x_c; /* the input's stored channels (padding: model/ctx.h) */
    RT_CHECK(rt_maxpool2d_init(&t->pool1, 10, 24, 24, 2, 2, 0));
    RT_CHECK(rt_conv2d_init(&t->conv2, 10, 20, 12, 12, 5, 1, 0, true));
    RT_CHECK(rt_dropout_init(&t->drop2d, p, true, 20, 8, 8, 0, 0));
    RT_CHECK(rt_maxpool2d_init(&t->pool2, 20, 8, 8, 2, 2, 0));
    RT_CHECK(rt_linear_init(&t->fc1, 320, 50));
    RT_CHECK(rt_dropout_init(&t->drop, p, false, 50, 1, 1, 0, 0));
    RT_CHECK(rt_linear_init(&t->fc2, 50, m->cfg.num_classes));
    RT_CHECK(rt_model_add_conv(m, "conv1", 0, &t->conv1));
    RT_CHECK(rt_model_add_conv(m, "conv2", 1, &t->conv2));
    RT_CHECK(rt_model_add_linear(m, "fc1", 2, &t->fc1));
    RT_CHECK(rt_model_add_linear(m, "fc2", 3, &t->fc2));
    RT_CHECK(rt_model_act(m, N * 5760, &t->c1));
    RT_CHECK(rt_model_act(m, N * 1440, &t->p1));
    RT_CHECK(rt_model_act(m, N * 1280, &t->c2));
    RT_CHECK(rt_model_act(m, N * 320, &t->p2));
    if (!rt_act_is_nchw_f32(m->ctx)) RT_CHECK(rt_model_feat(m, N * 320, &t->flat));
    RT_CHECK(rt_model_feat(m, N * 50, &t->f1));
    RT_CHECK(rt_model_feat(m, N * (size_t)m->cfg.num_classes, &t->z));
    RT_CHECK(rt_model_feat(m, N * 20, &t->drop2d.mask));
    RT_CHECK(rt_model_feat(m, N * 50, &t->drop.mask));
    size_t g = 320; /* features: flat, fc1, the classes */
    if ((size_t)m->cfg.num_classes > g) g = (size_t)m->cfg.num_classes;
    RT_CHECK(rt_model_act(m, N * 5760, &t->g_a));
    RT_CHECK(rt_model_act(m, N * 5760, &t->g_b));
    RT_CHECK(rt_model_feat(m, N * g, &t->f_a));
    RT_CHECK(rt_model_feat(m, N * g, &t->f_b));
    return RT_OK;
}

/* the row of the architecture table (arch.c); initialisation is PyTorch's default */
const rt_model_arch_ops rt_arch_net = {
    .name = "net",
    .check = net_check,
    .build = net_build,
    .prepare = net_prepare,
    .forward = net_forward,
    .loss = net_loss,
    .backward = net_backward,
    .seed_dropout = net_seed_dropout,
    .dropouts = net_dropouts,
    .release = net_release,
};
