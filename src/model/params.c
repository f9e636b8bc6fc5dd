/* Setup helpers below both model.c and the architectures: the parameter table, the
 * activation plan and the arenas. An architecture's build registers its parameters
 * (in state_dict order) and activations here; model.c then allocates the arenas. */
#include "model/internal/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rt_status rt_model_add_param(rt_model *m, const char *prefix, const char *suffix, rt_param_kind kind, int block,
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

rt_status rt_model_add_conv(rt_model *m, const char *prefix, int block, rt_conv2d *l) {
    /* 2 FLOPs per multiply-accumulate; the first convolution registered is the one that
     * reads the input (both architectures register conv1 first) */
    const double flops = 2.0 * l->out_c * l->out_h * l->out_w * (double)l->in_c * l->k * l->k;
    if (m->flops_fwd == 0) m->flops_input = flops;
    m->flops_fwd += flops;
    RT_CHECK(rt_model_add_param(m, prefix, "weight", RT_PARAM_WEIGHT, block, &l->weight, &l->dweight));
    if (l->has_bias) RT_CHECK(rt_model_add_param(m, prefix, "bias", RT_PARAM_BIAS, block, &l->bias, &l->dbias));
    return RT_OK;
}

rt_status rt_model_add_bn(rt_model *m, const char *prefix, int block, rt_batchnorm2d *l) {
    RT_CHECK(rt_model_add_param(m, prefix, "weight", RT_PARAM_BN_WEIGHT, block, &l->weight, &l->dweight));
    RT_CHECK(rt_model_add_param(m, prefix, "bias", RT_PARAM_BN_BIAS, block, &l->bias, &l->dbias));
    RT_CHECK(rt_model_add_param(m, prefix, "running_mean", RT_PARAM_BUFFER, block, &l->running_mean, NULL));
    RT_CHECK(rt_model_add_param(m, prefix, "running_var", RT_PARAM_BUFFER, block, &l->running_var, NULL));
    RT_CHECK(
        rt_model_add_param(m, prefix, "num_batches_tracked", RT_PARAM_BUFFER, block, &l->num_batches_tracked, NULL));
    RT_CHECK(rt_model_feat(m, (size_t)l->c, &l->save_mean));
    RT_CHECK(rt_model_feat(m, (size_t)l->c, &l->save_invstd));
    return RT_OK;
}

rt_status rt_model_add_linear(rt_model *m, const char *prefix, int block, rt_linear *l) {
    m->flops_fwd += 2.0 * l->in_f * (double)l->out_f;
    RT_CHECK(rt_model_add_param(m, prefix, "weight", RT_PARAM_WEIGHT, block, &l->weight, &l->dweight));
    RT_CHECK(rt_model_add_param(m, prefix, "bias", RT_PARAM_BIAS, block, &l->bias, &l->dbias));
    return RT_OK;
}

static rt_status plan(rt_model *m, size_t count, size_t elem, void *slot, bool feat) {
    if (m->npatches == m->cap_patches) {
        int cap = m->cap_patches ? 2 * m->cap_patches : 128;
        rt_model_act_patch *t = realloc(m->patches, sizeof *t * (size_t)cap);
        RT_CHECK_ALLOC(t, sizeof *t * (size_t)cap);
        m->patches = t;
        m->cap_patches = cap;
    }
    RT_REQUIRE(count <= SIZE_MAX / elem, RT_ERR_NOMEM, "activation of %zu elements", count);
    rt_model_act_patch *p = &m->patches[m->npatches++];
    p->slot = slot;
    p->feat = feat;
    RT_CHECK(rt_arena_push(&m->acts, count * elem, 256, &p->offset));
    return RT_OK;
}

rt_status rt_model_act(rt_model *m, size_t nelems, rt_act **slot) {
    return plan(m, nelems, rt_act_elem_size(m->ctx), slot, false);
}

rt_status rt_model_feat(rt_model *m, size_t nfloats, float **slot) {
    return plan(m, nfloats, sizeof(float), slot, true);
}

rt_status rt_model_arenas_alloc(rt_model *m) {
    /* gradients share the parameters' layout */
    m->grads.size = m->params.size;
    RT_CHECK(rt_arena_alloc(&m->params));
    RT_CHECK(rt_arena_alloc(&m->grads));
    RT_CHECK(rt_arena_alloc(&m->buffers));
    RT_CHECK(rt_arena_alloc(&m->acts));
    for (int i = 0; i < m->npatches; i++) {
        char *at = (char *)m->acts.base + m->patches[i].offset;
        if (m->patches[i].feat)
            *(float **)m->patches[i].slot = (float *)at;
        else
            *(rt_act **)m->patches[i].slot = (rt_act *)at;
    }
    /* block ranges: from each block's first gradient to the next block's */
    m->block_begin = calloc((size_t)m->nblocks + 1, sizeof *m->block_begin);
    RT_CHECK_ALLOC(m->block_begin, sizeof *m->block_begin * ((size_t)m->nblocks + 1));
    for (int b = 0; b <= m->nblocks; b++) m->block_begin[b] = m->grads.size;
    for (int i = m->nparams - 1; i >= 0; i--)
        if (rt_param_trainable(&m->table[i])) m->block_begin[m->table[i].block] = m->table[i].grad.offset;
    m->block_begin[0] = 0;
    for (int b = m->nblocks - 1; b > 0; b--)
        if (m->block_begin[b] > m->block_begin[b + 1]) m->block_begin[b] = m->block_begin[b + 1];
    return RT_OK;
}

void rt_model_arenas_free(rt_model *m) {
    rt_arena_free(&m->params);
    rt_arena_free(&m->grads);
    rt_arena_free(&m->buffers);
    rt_arena_free(&m->acts);
    free(m->table);
    free(m->patches);
    free(m->convs);
    free(m->conv_first);
    m->convs = NULL;
    m->conv_first = NULL;
    m->nconvs = m->cap_convs = 0;
    free(m->block_begin);
    m->table = NULL;
    m->patches = NULL;
    m->block_begin = NULL;
    m->nparams = m->cap_params = m->npatches = m->cap_patches = 0;
}

rt_status rt_model_prepare_conv(rt_model *m, rt_conv2d *l) {
    size_t ws = 0;
    RT_CHECK(rt_conv2d_prepare(m->ctx, l, m->cfg.max_batch, &ws));
    if (m->nconvs == m->cap_convs) {
        int cap = m->cap_convs ? 2 * m->cap_convs : 64;
        rt_conv2d **t = realloc(m->convs, sizeof *t * (size_t)cap);
        RT_CHECK_ALLOC(t, sizeof *t * (size_t)cap);
        m->convs = t;
        m->cap_convs = cap;
    }
    m->convs[m->nconvs++] = l;
    return rt_model_ctx_reserve(m->ctx, ws);
}

rt_status rt_model_prepare_bn(rt_model *m, rt_batchnorm2d *l) {
    return rt_batchnorm2d_prepare(m->ctx, l, m->cfg.max_batch);
}

rt_status rt_model_prepare_linear(rt_model *m, rt_linear *l) {
    size_t ws = 0;
    RT_CHECK(rt_linear_prepare(m->ctx, l, m->cfg.max_batch, &ws));
    return rt_model_ctx_reserve(m->ctx, ws);
}

/* the block of convolution l: that of its weight in the parameter table, -1 if absent */
static int conv_block(const rt_model *m, const rt_conv2d *l) {
    for (int i = 0; i < m->nparams; i++)
        if (m->table[i].kind == RT_PARAM_WEIGHT && rt_tensor_data(&m->table[i].value) == rt_tensor_data(&l->weight))
            return m->table[i].block;
    return -1;
}

rt_status rt_model_convs_by_block(rt_model *m) {
    m->conv_first = calloc((size_t)m->nblocks + 1, sizeof *m->conv_first);
    int *block = calloc((size_t)m->nconvs + 1, sizeof *block);
    rt_status st = m->conv_first && block ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "the blocks of %d convolutions", m->nconvs);
    for (int i = 0; st == RT_OK && i < m->nconvs; i++) {
        block[i] = conv_block(m, m->convs[i]);
        if (block[i] < 0)
            st = RT_ERROR(RT_ERR_INTERNAL, "convolution %d (%d->%d k%d): its weight is not a registered parameter", i,
                          m->convs[i]->in_c, m->convs[i]->out_c, m->convs[i]->k);
    }
    for (int i = 1; st == RT_OK && i < m->nconvs; i++) /* insertion sort: stable, a few dozen layers */
        for (int j = i; j > 0 && block[j - 1] > block[j]; j--) {
            rt_conv2d *l = m->convs[j];
            const int b = block[j];
            m->convs[j] = m->convs[j - 1], block[j] = block[j - 1];
            m->convs[j - 1] = l, block[j - 1] = b;
        }
    for (int b = 0, i = 0; st == RT_OK && b <= m->nblocks; b++) {
        while (i < m->nconvs && block[i] < b) i++;
        m->conv_first[b] = i;
    }
    free(block);
    return st;
}

/* the deferred dW of convs[from..dw_pending) */
static rt_status grads_flush_from(rt_model *m, int from) {
    if (from >= m->dw_pending) return RT_OK;
    const int count = m->dw_pending - from;
    m->dw_pending = from;
    return rt_conv2d_weights_grads(m->ctx, m->wcopies, from, count);
}

rt_status rt_model_grads_flush(rt_model *m) { return grads_flush_from(m, 0); }

rt_status rt_model_block_done(rt_model *m, int b, rt_grad_ready_fn ready, void *user) {
    if (!ready) return RT_OK;
    RT_CHECK(grads_flush_from(m, m->conv_first[b]));
    rt_status st = ready(user, b, m->block_begin[b], m->block_begin[b + 1]);
    if (st != RT_OK) {
        rt_error_trace(__FILE__, __LINE__, "grad-ready callback");
        return st;
    }
    return RT_OK;
}
