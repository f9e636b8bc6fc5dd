/* The model object: arenas, parameter table, initialisation, the forward / loss /
 * backward entry points and state-dict files. The architectures (resnet.c, net.c)
 * register their parameters and activations here and walk their own layers. */
#include "model/internal/model_impl.h"

#include "core/rng.h"
#include "core/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rt_model_config_default(rt_model_config *cfg) {
    *cfg = (rt_model_config){.arch = RT_ARCH_RESNET34,
                             .in_channels = 1,
                             .in_h = 28,
                             .in_w = 28,
                             .num_classes = 10,
                             .stem = RT_STEM_IMAGENET,
                             .width = 64,
                             .max_batch = 64,
                             .dropout = -1.0f};
}

static const char *k_arch_names[] = {"resnet18", "resnet34", "net"};
static const char *k_stem_names[] = {"imagenet", "cifar"};

int rt_model_arch_parse(const char *text, rt_model_arch *out) {
    for (int i = 0; i < 3; i++)
        if (text && strcmp(text, k_arch_names[i]) == 0) {
            *out = (rt_model_arch)i;
            return 0;
        }
    return -1;
}
int rt_stem_parse(const char *text, rt_stem *out) {
    for (int i = 0; i < 2; i++)
        if (text && strcmp(text, k_stem_names[i]) == 0) {
            *out = (rt_stem)i;
            return 0;
        }
    return -1;
}
const char *rt_model_arch_name(rt_model_arch a) { return (unsigned)a < 3 ? k_arch_names[a] : "?"; }
const char *rt_stem_name(rt_stem s) { return (unsigned)s < 2 ? k_stem_names[s] : "?"; }

/* ---- setup helpers ---------------------------------------------------------------- */

rt_status model_add_param(rt_model *m, const char *prefix, const char *suffix, rt_param_kind kind, int block,
                          rt_tensor *value, rt_tensor *grad) {
    if (m->nparams == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 64;
        rt_param *t = realloc(m->table, sizeof *t * (size_t)cap);
        RT_CHECK_ALLOC(t, sizeof *t * (size_t)cap);
        m->table = t;
        m->cap_params = cap;
    }
    rt_param *p = &m->table[m->nparams];
    memset(p, 0, sizeof *p);
    int len = snprintf(p->name, sizeof p->name, "%s%s%s", prefix, *prefix ? "." : "", suffix);
    RT_REQUIRE(len > 0 && (size_t)len < sizeof p->name, RT_ERR_INTERNAL, "parameter name %s.%s too long", prefix,
               suffix);
    p->kind = kind;
    p->block = block;
    if (kind == RT_PARAM_BUFFER) {
        RT_CHECK(rt_tensor_place(value, &m->buffers));
    } else {
        RT_CHECK(rt_tensor_place(value, &m->params));
        *grad = rt_tensor_in(value, &m->grads);
        p->grad = *grad;
    }
    p->value = *value;
    if (block + 1 > m->nblocks) m->nblocks = block + 1;
    m->nparams++;
    return RT_OK;
}

rt_status model_add_conv(rt_model *m, const char *prefix, int block, rt_conv2d *l) {
    RT_CHECK(model_add_param(m, prefix, "weight", RT_PARAM_WEIGHT, block, &l->weight, &l->dweight));
    if (l->has_bias) RT_CHECK(model_add_param(m, prefix, "bias", RT_PARAM_BIAS, block, &l->bias, &l->dbias));
    return RT_OK;
}

rt_status model_add_bn(rt_model *m, const char *prefix, int block, rt_batchnorm2d *l) {
    RT_CHECK(model_add_param(m, prefix, "weight", RT_PARAM_BN_WEIGHT, block, &l->weight, &l->dweight));
    RT_CHECK(model_add_param(m, prefix, "bias", RT_PARAM_BN_BIAS, block, &l->bias, &l->dbias));
    RT_CHECK(model_add_param(m, prefix, "running_mean", RT_PARAM_BUFFER, block, &l->running_mean, NULL));
    RT_CHECK(model_add_param(m, prefix, "running_var", RT_PARAM_BUFFER, block, &l->running_var, NULL));
    RT_CHECK(model_add_param(m, prefix, "num_batches_tracked", RT_PARAM_BUFFER, block, &l->num_batches_tracked, NULL));
    RT_CHECK(model_act(m, (size_t)l->c, &l->save_mean));
    RT_CHECK(model_act(m, (size_t)l->c, &l->save_invstd));
    return RT_OK;
}

rt_status model_add_linear(rt_model *m, const char *prefix, int block, rt_linear *l) {
    RT_CHECK(model_add_param(m, prefix, "weight", RT_PARAM_WEIGHT, block, &l->weight, &l->dweight));
    RT_CHECK(model_add_param(m, prefix, "bias", RT_PARAM_BIAS, block, &l->bias, &l->dbias));
    return RT_OK;
}

rt_status model_act(rt_model *m, size_t nfloats, float **slot) {
    if (m->npatches == m->cap_patches) {
        int cap = m->cap_patches ? 2 * m->cap_patches : 128;
        act_patch *t = realloc(m->patches, sizeof *t * (size_t)cap);
        RT_CHECK_ALLOC(t, sizeof *t * (size_t)cap);
        m->patches = t;
        m->cap_patches = cap;
    }
    RT_REQUIRE(nfloats <= SIZE_MAX / sizeof(float), RT_ERR_NOMEM, "activation of %zu floats", nfloats);
    act_patch *p = &m->patches[m->npatches++];
    p->slot = slot;
    RT_CHECK(rt_arena_push(&m->acts, nfloats * sizeof(float), 64, &p->offset));
    return RT_OK;
}

rt_status model_prepare_conv(rt_model *m, rt_conv2d *l) {
    size_t ws = 0;
    RT_CHECK(rt_conv2d_prepare(m->ctx, l, m->cfg.max_batch, &ws));
    return rt_model_ctx_reserve(m->ctx, ws);
}
rt_status model_prepare_bn(rt_model *m, rt_batchnorm2d *l) {
    return rt_batchnorm2d_prepare(m->ctx, l, m->cfg.max_batch);
}
rt_status model_prepare_linear(rt_model *m, rt_linear *l) {
    size_t ws = 0;
    RT_CHECK(rt_linear_prepare(m->ctx, l, m->cfg.max_batch, &ws));
    return rt_model_ctx_reserve(m->ctx, ws);
}

rt_status model_block_done(rt_model *m, int b, rt_grad_ready_fn ready, void *user) {
    if (!ready) return RT_OK;
    rt_status st = ready(user, b, m->block_begin[b], m->block_begin[b + 1]);
    if (st != RT_OK) {
        rt_error_trace(__FILE__, __LINE__, "grad-ready callback");
        return st;
    }
    return RT_OK;
}

/* ---- create / destroy ------------------------------------------------------------- */

static rt_status check_config(const rt_model_config *c) {
    RT_REQUIRE((unsigned)c->arch <= RT_ARCH_NET, RT_ERR_INVALID, "model arch %d (expected resnet18|resnet34|net)",
               (int)c->arch);
    RT_REQUIRE(c->max_batch > 0 && c->max_batch <= 1 << 20, RT_ERR_INVALID, "model max_batch %d (expected 1..2^20)",
               c->max_batch);
    RT_REQUIRE(c->num_classes > 0 && c->num_classes <= 1 << 20, RT_ERR_INVALID, "model num_classes %d", c->num_classes);
    RT_REQUIRE(c->in_channels > 0 && c->in_channels <= 4096, RT_ERR_INVALID, "model in_channels %d", c->in_channels);
    RT_REQUIRE(c->in_h > 0 && c->in_w > 0 && c->in_h <= 4096 && c->in_w <= 4096, RT_ERR_INVALID, "model input %dx%d",
               c->in_h, c->in_w);
    if (c->arch == RT_ARCH_NET) {
        RT_REQUIRE(c->in_channels == 1 && c->in_h == 28 && c->in_w == 28, RT_ERR_INVALID,
                   "model net is the MNIST tutorial CNN: input must be 1x28x28 (got %dx%dx%d)", c->in_channels, c->in_h,
                   c->in_w);
        RT_REQUIRE(c->dropout < 1.0f, RT_ERR_INVALID, "model dropout %g (expected < 1)", (double)c->dropout);
    } else {
        RT_REQUIRE((unsigned)c->stem <= RT_STEM_CIFAR, RT_ERR_INVALID, "model stem %d (expected imagenet|cifar)",
                   (int)c->stem);
        RT_REQUIRE(c->width > 0 && c->width <= 4096, RT_ERR_INVALID, "model width %d (expected 1..4096)", c->width);
    }
    return RT_OK;
}

rt_status rt_model_create(const rt_model_config *cfg, rt_model_ctx *ctx, rt_model **out) {
    *out = NULL;
    RT_CHECK(check_config(cfg));
    rt_model *m = calloc(1, sizeof *m);
    RT_CHECK_ALLOC(m, sizeof *m);
    m->cfg = *cfg;
    m->ctx = ctx;
    rt_arena_init(&m->params, ctx->device);
    rt_arena_init(&m->grads, ctx->device);
    rt_arena_init(&m->buffers, ctx->device);
    rt_arena_init(&m->acts, ctx->device);
    rt_status st;
    if (cfg->arch == RT_ARCH_NET)
        RT_CHECK_GOTO(rt_net_build(m), st, fail);
    else
        RT_CHECK_GOTO(rt_resnet_build(m), st, fail);
    size_t k = (size_t)cfg->num_classes * (size_t)cfg->max_batch;
    RT_CHECK_GOTO(model_act(m, k, &m->out), st, fail);
    RT_CHECK_GOTO(model_act(m, k, &m->dout), st, fail);
    RT_CHECK_GOTO(model_act(m, 1, &m->loss_dev), st, fail);
    /* allocate: gradients share the parameters' layout */
    m->grads.size = m->params.size;
    RT_CHECK_GOTO(rt_arena_alloc(&m->params), st, fail);
    RT_CHECK_GOTO(rt_arena_alloc(&m->grads), st, fail);
    RT_CHECK_GOTO(rt_arena_alloc(&m->buffers), st, fail);
    RT_CHECK_GOTO(rt_arena_alloc(&m->acts), st, fail);
    for (int i = 0; i < m->npatches; i++) *m->patches[i].slot = (float *)((char *)m->acts.base + m->patches[i].offset);
    /* block ranges: from each block's first gradient to the next block's */
    m->block_begin = calloc((size_t)m->nblocks + 1, sizeof *m->block_begin);
    RT_CHECK_ALLOC(m->block_begin, sizeof *m->block_begin * ((size_t)m->nblocks + 1));
    for (int b = 0; b <= m->nblocks; b++) m->block_begin[b] = m->grads.size;
    for (int i = m->nparams - 1; i >= 0; i--)
        if (rt_param_trainable(&m->table[i])) m->block_begin[m->table[i].block] = m->table[i].grad.offset;
    m->block_begin[0] = 0;
    for (int b = m->nblocks - 1; b > 0; b--)
        if (m->block_begin[b] > m->block_begin[b + 1]) m->block_begin[b] = m->block_begin[b + 1];
    RT_CHECK_GOTO(m->ops->prepare(m), st, fail);
    /* running_var starts at 1 */
    RT_CHECK_GOTO(rt_model_init_weights(m, 0), st, fail);
    *out = m;
    return RT_OK;
fail:
    rt_model_destroy(m);
    return st;
}

void rt_model_destroy(rt_model *m) {
    if (!m) return;
    if (m->ops && m->ops->release) m->ops->release(m);
    rt_arena_free(&m->params);
    rt_arena_free(&m->grads);
    rt_arena_free(&m->buffers);
    rt_arena_free(&m->acts);
    free(m->table);
    free(m->patches);
    free(m->block_begin);
    free(m);
}

/* ---- accessors --------------------------------------------------------------------- */

const rt_model_config *rt_model_config_of(const rt_model *m) { return &m->cfg; }
rt_model_ctx *rt_model_context(const rt_model *m) { return m->ctx; }
int rt_model_param_count(const rt_model *m) { return m->nparams; }
const rt_param *rt_model_param(const rt_model *m, int i) { return i >= 0 && i < m->nparams ? &m->table[i] : NULL; }
const rt_param *rt_model_param_find(const rt_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->table[i].name, name) == 0) return &m->table[i];
    return NULL;
}
rt_arena *rt_model_params(rt_model *m) { return &m->params; }
rt_arena *rt_model_grads(rt_model *m) { return &m->grads; }
rt_arena *rt_model_buffers(rt_model *m) { return &m->buffers; }
int rt_model_block_count(const rt_model *m) { return m->nblocks; }
int64_t rt_model_num_parameters(const rt_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        if (rt_param_trainable(&m->table[i])) n += rt_tensor_numel(&m->table[i].value);
    return n;
}
const float *rt_model_output(const rt_model *m) { return m->out; }

/* ---- initialisation ---------------------------------------------------------------- */

static rt_status fill(rt_model *m, const rt_param *p, const void *host) {
    return rt_memcpy(rt_tensor_data(&p->value), m->ctx->device, host, rt_device_cpu(), rt_tensor_nbytes(&p->value),
                     NULL);
}

rt_status rt_model_init_weights(rt_model *m, uint64_t seed) {
    size_t maxn = 1;
    for (int i = 0; i < m->nparams; i++) {
        size_t n = (size_t)rt_tensor_numel(&m->table[i].value);
        if (n > maxn) maxn = n;
    }
    float *host = malloc(maxn * sizeof(float));
    RT_CHECK_ALLOC(host, maxn * sizeof(float));
    rt_status st = RT_OK;
    const bool resnet = m->cfg.arch != RT_ARCH_NET;
    for (int i = 0; i < m->nparams && st == RT_OK; i++) {
        const rt_param *p = &m->table[i];
        size_t n = (size_t)rt_tensor_numel(&p->value);
        rt_rng rng;
        rt_rng_init(&rng, seed, (uint64_t)i);
        const char *leaf = strrchr(p->name, '.');
        leaf = leaf ? leaf + 1 : p->name;
        if (p->kind == RT_PARAM_BUFFER) {
            if (strcmp(leaf, "num_batches_tracked") == 0) {
                int64_t zero = 0;
                st = fill(m, p, &zero);
                continue;
            }
            float v = strcmp(leaf, "running_var") == 0 ? 1.0f : 0.0f;
            for (size_t j = 0; j < n; j++) host[j] = v;
        } else if (p->kind == RT_PARAM_BN_WEIGHT || p->kind == RT_PARAM_BN_BIAS) {
            float v = p->kind == RT_PARAM_BN_WEIGHT ? 1.0f : 0.0f;
            for (size_t j = 0; j < n; j++) host[j] = v;
        } else {
            /* fan_in of the owning weight: for a bias, the weight registered just before */
            const rt_tensor *w = p->kind == RT_PARAM_WEIGHT ? &p->value : &m->table[i - 1].value;
            int64_t receptive = 1;
            for (int d = 2; d < w->ndim; d++) receptive *= w->shape[d];
            double fan_in = (double)w->shape[1] * (double)receptive;
            double fan_out = (double)w->shape[0] * (double)receptive;
            if (resnet && p->kind == RT_PARAM_WEIGHT && w->ndim == 4) {
                /* kaiming_normal_(mode='fan_out', nonlinearity='relu') */
                rt_rng_normal(&rng, host, n, 0.0f, (float)sqrt(2.0 / fan_out));
            } else {
                /* PyTorch's Conv2d/Linear default: kaiming_uniform_(a=sqrt(5)) for the
                 * weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias: the same bound */
                float bound = (float)(1.0 / sqrt(fan_in));
                rt_rng_uniform_range(&rng, host, n, -bound, bound);
            }
        }
        st = fill(m, p, host);
    }
    free(host);
    RT_CHECK(st);
    rt_model_set_dropout_seed(m, seed);
    return RT_OK;
}

void rt_model_set_dropout_seed(rt_model *m, uint64_t seed) {
    if (m->ops->seed_dropout) m->ops->seed_dropout(m, seed);
}

/* ---- steps --------------------------------------------------------------------------- */

rt_status rt_model_forward(rt_model *m, const float *x, int n, bool training) {
    RT_REQUIRE(n > 0 && n <= m->cfg.max_batch, RT_ERR_INVALID, "batch of %d images (the model was built for 1..%d)", n,
               m->cfg.max_batch);
    RT_REQUIRE(x != NULL, RT_ERR_INVALID, "model forward: NULL input");
    m->input = x;
    m->last_n = n;
    m->last_training = training;
    m->have_loss = false;
    RT_CHECK(m->ops->forward(m, x, n, training));
    return RT_OK;
}

rt_status rt_model_loss(rt_model *m, const int32_t *labels) {
    RT_REQUIRE(m->last_n > 0, RT_ERR_INVALID, "model loss before any forward");
    RT_REQUIRE(labels != NULL, RT_ERR_INVALID, "model loss: NULL labels");
    if (m->cfg.arch == RT_ARCH_NET)
        RT_CHECK(rt_nll_loss(m->ctx, m->last_n, m->cfg.num_classes, m->out, labels, m->loss_dev, m->dout));
    else
        RT_CHECK(rt_softmax_xent(m->ctx, m->last_n, m->cfg.num_classes, m->out, labels, m->loss_dev, m->dout));
    m->have_loss = true;
    return RT_OK;
}

rt_status rt_model_loss_value(rt_model *m, float *loss) {
    RT_REQUIRE(m->have_loss, RT_ERR_INVALID, "model loss value before rt_model_loss");
    RT_CHECK(rt_memcpy(loss, rt_device_cpu(), m->loss_dev, m->ctx->device, sizeof(float), m->ctx->stream));
    return rt_model_ctx_sync(m->ctx);
}

rt_status rt_model_backward(rt_model *m, rt_grad_ready_fn ready, void *user) {
    RT_REQUIRE(m->have_loss && m->last_training, RT_ERR_INVALID,
               "model backward needs a training forward and rt_model_loss first");
    RT_CHECK(m->ops->backward(m, ready, user));
    return RT_OK;
}

rt_status rt_model_train_step(rt_model *m, const float *x, const int32_t *labels, int n, rt_grad_ready_fn ready,
                              void *user, float *loss) {
    RT_CHECK(rt_model_forward(m, x, n, true));
    RT_CHECK(rt_model_loss(m, labels));
    RT_CHECK(rt_model_backward(m, ready, user));
    if (loss) RT_CHECK(rt_model_loss_value(m, loss));
    return RT_OK;
}

/* ---- state dict files -------------------------------------------------------------- */

rt_status rt_model_save(rt_model *m, const char *path) {
    rt_st_writer *w = NULL;
    char *host = NULL;
    rt_status st;
    size_t total = m->params.size + m->buffers.size;
    host = malloc(total ? total : 1);
    RT_CHECK_ALLOC(host, total);
    RT_CHECK_GOTO(rt_model_ctx_sync(m->ctx), st, done);
    RT_CHECK_GOTO(rt_memcpy(host, rt_device_cpu(), m->params.base, m->ctx->device, m->params.size, NULL), st, done);
    RT_CHECK_GOTO(
        rt_memcpy(host + m->params.size, rt_device_cpu(), m->buffers.base, m->ctx->device, m->buffers.size, NULL), st,
        done);
    RT_CHECK_GOTO(rt_st_writer_create(&w), st, done);
    for (int i = 0; i < m->nparams; i++) {
        const rt_param *p = &m->table[i];
        size_t off = p->value.offset + (p->kind == RT_PARAM_BUFFER ? m->params.size : 0);
        RT_CHECK_GOTO(rt_st_writer_add(w, p->name, p->value.dtype, p->value.ndim, p->value.shape, host + off), st,
                      done);
    }
    char arch[96];
    snprintf(arch, sizeof arch, "%s", rt_model_arch_name(m->cfg.arch));
    RT_CHECK_GOTO(rt_st_writer_meta(w, "arch", arch), st, done);
    RT_CHECK_GOTO(rt_st_writer_meta(w, "format", "pt"), st, done);
    RT_CHECK_GOTO(rt_st_writer_write(w, path), st, done);
done:
    rt_st_writer_free(w);
    free(host);
    return st;
}

rt_status rt_model_load(rt_model *m, const char *path) {
    rt_safetensors *f = NULL;
    RT_CHECK(rt_safetensors_read(path, &f));
    rt_status st = RT_OK;
    size_t maxb = 8;
    for (int i = 0; i < m->nparams; i++)
        if (rt_tensor_nbytes(&m->table[i].value) > maxb) maxb = rt_tensor_nbytes(&m->table[i].value);
    void *host = malloc(maxb);
    if (!host) {
        rt_safetensors_free(f);
        RT_FAIL(RT_ERR_NOMEM, "out of memory (%zu bytes)", maxb);
    }
    /* strict: every table entry present, no other names */
    for (int i = 0; i < f->n && st == RT_OK; i++)
        if (!rt_model_param_find(m, f->tensors[i].name))
            st = RT_ERROR(RT_ERR_FORMAT, "%s: unexpected tensor '%s' (not a %s parameter or buffer)", path,
                          f->tensors[i].name, rt_model_arch_name(m->cfg.arch));
    for (int i = 0; i < m->nparams && st == RT_OK; i++) {
        const rt_param *p = &m->table[i];
        st = rt_safetensors_get(f, p->name, p->value.dtype, p->value.ndim, p->value.shape, host);
        if (st == RT_OK) st = fill(m, p, host);
    }
    free(host);
    rt_safetensors_free(f);
    RT_CHECK(st);
    return RT_OK;
}
