/* The model object: creation, accessors, initialisation, the forward / loss /
 * backward entry points and state-dict files. It knows no architecture: it reaches the
 * one of the config through its row of the table in arch.c (m->ops); the architectures
 * register their parameters and activations through params.c and walk their own
 * layers. */
#include "model/internal/model_impl.h"

#include "core/rng.h"
#include "core/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- create / destroy ------------------------------------------------------------- */

static rt_status check_config(const rt_model_config *c, const rt_model_arch_ops **ops) {
    *ops = rt_model_arch_ops_of(c->arch);
    RT_REQUIRE(*ops != NULL, RT_ERR_INVALID, "model arch %d: not in the table of architectures", (int)c->arch);
    RT_REQUIRE(c->max_batch > 0 && c->max_batch <= 1 << 20, RT_ERR_INVALID, "model max_batch %d (expected 1..2^20)",
               c->max_batch);
    RT_REQUIRE(c->num_classes > 0 && c->num_classes <= 1 << 20, RT_ERR_INVALID, "model num_classes %d", c->num_classes);
    RT_REQUIRE(c->in_channels > 0 && c->in_channels <= 4096, RT_ERR_INVALID, "model in_channels %d", c->in_channels);
    RT_REQUIRE(c->in_h > 0 && c->in_w > 0 && c->in_h <= 4096 && c->in_w <= 4096, RT_ERR_INVALID, "model input %dx%d",
               c->in_h, c->in_w);
    if ((*ops)->check) RT_CHECK((*ops)->check(c));
    return RT_OK;
}

rt_status rt_model_create(const rt_model_config *cfg, rt_model_ctx *ctx, rt_model **out) {
    *out = NULL;
    const rt_model_arch_ops *ops = NULL;
    RT_CHECK(check_config(cfg, &ops));
    rt_model *m = calloc(1, sizeof *m);
    RT_CHECK_ALLOC(m, sizeof *m);
    m->cfg = *cfg;
    m->ctx = ctx;
    m->ops = ops;
    rt_arena_init(&m->params, ctx->device);
    rt_arena_init(&m->grads, ctx->device);
    rt_arena_init(&m->buffers, ctx->device);
    rt_arena_init(&m->acts, ctx->device);
    rt_status st;
    /* the input as activations: the loader's fp32 NCHW batch is used as it is in the fp32
     * NCHW format, else converted into x_act (channels padded) as the forward begins */
    m->x_c = rt_act_input_channels(ctx, cfg->in_channels);
    RT_CHECK_GOTO(ops->build(m), st, fail);
    if (!rt_act_is_nchw_f32(ctx) || m->x_c != cfg->in_channels)
        RT_CHECK_GOTO(rt_model_act(m, (size_t)cfg->max_batch * m->x_c * cfg->in_h * cfg->in_w, &m->x_act), st, fail);
    size_t k = (size_t)cfg->num_classes * (size_t)cfg->max_batch;
    RT_CHECK_GOTO(rt_model_feat(m, k, &m->out), st, fail);
    RT_CHECK_GOTO(rt_model_feat(m, k, &m->dout), st, fail);
    RT_CHECK_GOTO(rt_model_feat(m, 1, &m->loss_dev), st, fail);
    RT_CHECK_GOTO(rt_model_arenas_alloc(m), st, fail);
    RT_CHECK_GOTO(ops->prepare(m), st, fail);
    RT_CHECK_GOTO(rt_model_convs_by_block(m), st, fail);
    RT_CHECK_GOTO(rt_conv2d_weights_prepare(ctx, m->convs, m->nconvs, true, &m->wcopies), st, fail);
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
    rt_conv2d_weights_release(m->ctx, m->wcopies);
    if (m->arch) m->ops->release(m);
    rt_model_arenas_free(m);
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

void rt_model_block_range(const rt_model *m, int b, size_t *begin, size_t *end) {
    *begin = m->block_begin[b];
    *end = m->block_begin[b + 1];
}
int64_t rt_model_num_parameters(const rt_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        if (rt_param_trainable(&m->table[i])) n += rt_tensor_numel(&m->table[i].value);
    return n;
}
const float *rt_model_output(const rt_model *m) { return m->out; }

double rt_model_flops_per_image(const rt_model *m, bool training) {
    /* backward: the input gradient and the weight gradient of each layer cost its forward,
     * but the first convolution's input gradient is never computed (dx NULL) */
    return training ? 3.0 * m->flops_fwd - m->flops_input : m->flops_fwd;
}

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
            if (!m->ops->init_param || !m->ops->init_param(p, fan_in, fan_out, &rng, host, n)) {
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

#define MAX_DROPOUTS 16

int rt_model_dropout_counters(const rt_model *m, uint64_t *out, int cap) {
    if (!m->ops->dropouts) return 0;
    rt_dropout *l[MAX_DROPOUTS];
    int n = m->ops->dropouts((rt_model *)m, l, MAX_DROPOUTS);
    for (int i = 0; i < n && i < cap && i < MAX_DROPOUTS; i++) out[i] = l[i]->counter;
    return n;
}

rt_status rt_model_set_dropout_counters(rt_model *m, const uint64_t *counters, int n) {
    rt_dropout *l[MAX_DROPOUTS];
    int have = m->ops->dropouts ? m->ops->dropouts(m, l, MAX_DROPOUTS) : 0;
    RT_REQUIRE(n == have && have <= MAX_DROPOUTS, RT_ERR_INVALID, "%s has %d dropout layers, got %d counters",
               m->ops->name, have, n);
    for (int i = 0; i < n; i++) l[i]->counter = counters[i];
    return RT_OK;
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
    /* the weights' copies from the parameters as they are now (layers.h) */
    RT_CHECK(rt_conv2d_weights_refresh(m->ctx, m->wcopies));
    if (m->x_act)
        RT_CHECK(rt_act_input(m->ctx, n, m->cfg.in_channels, m->cfg.in_h, m->cfg.in_w, m->x_c, x, m->x_act));
    RT_CHECK(m->ops->forward(m, rt_model_input_act(m), n, training));
    return RT_OK;
}

rt_status rt_model_loss(rt_model *m, const int64_t *labels) {
    RT_REQUIRE(m->last_n > 0, RT_ERR_INVALID, "model loss before any forward");
    RT_REQUIRE(labels != NULL, RT_ERR_INVALID, "model loss: NULL labels");
    if (m->ops->loss)
        RT_CHECK(m->ops->loss(m, labels));
    else
        RT_CHECK(rt_softmax_xent_smooth(m->ctx, m->last_n, m->cfg.num_classes, m->out, labels, m->label_smoothing,
                                        m->loss_dev, m->dout));
    m->have_loss = true;
    return RT_OK;
}

rt_status rt_model_loss_value(rt_model *m, float *loss) {
    RT_REQUIRE(m->have_loss, RT_ERR_INVALID, "model loss value before rt_model_loss");
    RT_CHECK(rt_memcpy(loss, rt_device_cpu(), m->loss_dev, m->ctx->device, sizeof(float), m->ctx->stream));
    return rt_model_ctx_sync(m->ctx);
}

rt_status rt_model_set_label_smoothing(rt_model *m, double eps) {
    RT_REQUIRE(m != NULL, RT_ERR_INVALID, "model is NULL");
    RT_REQUIRE(isfinite(eps) && eps >= 0 && eps <= 1, RT_ERR_INVALID, "label smoothing %g (expected 0..1)", eps);
    RT_REQUIRE(eps == 0 || !m->ops->loss, RT_ERR_UNSUPPORTED,
               "label smoothing %g: %s's loss is nll_loss of log-probabilities; label smoothing applies to the "
               "cross-entropy of logits (resnet18, resnet34)",
               eps, rt_model_arch_name(m->cfg.arch));
    m->label_smoothing = eps;
    return RT_OK;
}

double rt_model_label_smoothing(const rt_model *m) { return m ? m->label_smoothing : 0.0; }

rt_status rt_model_set_bn_sync(rt_model *m, const rt_bn_sync *sync) {
    RT_REQUIRE(m != NULL, RT_ERR_INVALID, "model is NULL");
    int64_t most = 0; /* the widest batch norm: its weight's length */
    for (int i = 0; i < m->nparams; i++)
        if (m->table[i].kind == RT_PARAM_BN_WEIGHT && rt_tensor_numel(&m->table[i].value) > most)
            most = rt_tensor_numel(&m->table[i].value);
    if (most == 0) return RT_OK; /* no batch norm (net): nothing to synchronise */
    rt_status st = rt_model_ctx_set_bn_sync(m->ctx, sync, (int)most);
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "model.sync_bn");
    return st;
}

const float *rt_model_loss_ptr(const rt_model *m) { return m && m->have_loss ? m->loss_dev : NULL; }

void rt_model_note_replayed(rt_model *m, const float *x, int n) {
    m->input = x;
    m->last_n = n;
    m->last_training = true;
    m->have_loss = true;
}

rt_status rt_model_backward(rt_model *m, rt_grad_ready_fn ready, void *user) {
    RT_REQUIRE(m->have_loss && m->last_training, RT_ERR_INVALID,
               "model backward needs a training forward and rt_model_loss first");
    m->dw_pending = m->nconvs;
    RT_CHECK(m->ops->backward(m, ready, user));
    RT_CHECK(rt_model_grads_flush(m));
    return RT_OK;
}

rt_status rt_model_train_step(rt_model *m, const float *x, const int64_t *labels, int n, rt_grad_ready_fn ready,
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
    snprintf(arch, sizeof arch, "%s", m->ops->name);
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
    /* the parameters are overwritten from the host: work already enqueued on the model's
     * stream (a forward, an optimizer step) must not read them half-loaded */
    st = rt_model_ctx_sync(m->ctx);
    /* strict: every table entry present, no other names */
    for (int i = 0; i < f->n && st == RT_OK; i++)
        if (!rt_model_param_find(m, f->tensors[i].name))
            st = RT_ERROR(RT_ERR_FORMAT, "%s: unexpected tensor '%s' (not a %s parameter or buffer)", path,
                          f->tensors[i].name, m->ops->name);
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
