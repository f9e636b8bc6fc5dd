/* The table of optimizers: one row (rt_optim_kind_ops, internal/optim_kernels.h) per
 * rt_optim_kind, their names and the config defaults.
 *
 * Adding an optimizer: write src/optim/<name>.c defining its row (name, defaults,
 * validation, state buffers, the step's coefficients, the CPU loop, the CUDA step), its
 * kernel and launch function in cuda/optim_cuda.cu, its coefficients as a member of
 * rt_optim_scalars (and its launch function's declaration) in internal/optim_kernels.h,
 * its enum member before RT_OPTIM_KIND_COUNT_ in optimizer.h and its row here. Nothing
 * else in src/optim changes (docs/optim.md, "Adding an optimizer"). */
#include "optim/internal/optim_kernels.h"

#include "core/names.h"

#include <math.h>
#include <string.h>

/* sgd.c */
extern const rt_optim_kind_ops rt_optim_kind_sgd;
/* adam.c */
extern const rt_optim_kind_ops rt_optim_kind_adam, rt_optim_kind_adamw;
/* adadelta.c */
extern const rt_optim_kind_ops rt_optim_kind_adadelta;

static const rt_optim_kind_ops *const k_kinds[RT_OPTIM_KIND_COUNT_] = {
    [RT_OPTIM_SGD] = &rt_optim_kind_sgd,
    [RT_OPTIM_ADAM] = &rt_optim_kind_adam,
    [RT_OPTIM_ADAMW] = &rt_optim_kind_adamw,
    [RT_OPTIM_ADADELTA] = &rt_optim_kind_adadelta,
};

const rt_optim_kind_ops *rt_optim_kind_ops_of(rt_optim_kind kind) {
    return (unsigned)kind < RT_OPTIM_KIND_COUNT_ ? k_kinds[kind] : NULL;
}

static const char *kind_name(int i) { return k_kinds[i]->name; }
const rt_names rt_optim_kind_names = {"optimizer", RT_OPTIM_KIND_COUNT_, NULL, kind_name, NULL};

const char *rt_optim_kind_list(char *buf, size_t size) { return rt_names_list(&rt_optim_kind_names, buf, size); }

rt_status rt_optim_kind_parse(const char *text, rt_optim_kind *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_optim_kind_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_optim_kind)k;
    return st;
}

const char *rt_optim_kind_name(rt_optim_kind kind) {
    const rt_optim_kind_ops *ops = rt_optim_kind_ops_of(kind);
    return ops ? ops->name : "?";
}

void rt_optim_config_default(rt_optim_config *cfg, rt_optim_kind kind) {
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    /* the shared hyper-parameters' PyTorch defaults; the row sets its own */
    cfg->betas[0] = 0.9;
    cfg->betas[1] = 0.999;
    cfg->eps = 1e-8;
    cfg->rho = 0.9;
    const rt_optim_kind_ops *ops = rt_optim_kind_ops_of(kind);
    if (ops) ops->defaults(cfg);
}

rt_status rt_optim_config_resolve(rt_optim_config *cfg) {
    RT_REQUIRE(cfg != NULL, RT_ERR_INVALID, "optim: config is NULL");
    char names[64];
    RT_REQUIRE(rt_optim_kind_ops_of(cfg->kind) != NULL, RT_ERR_INVALID,
               "optim.name: unknown optimizer %d (expected %s)", (int)cfg->kind,
               rt_optim_kind_list(names, sizeof names));
    rt_optim_config d;
    rt_optim_config_default(&d, cfg->kind);
    /* a key whose default depends on the optimizer (set in the rows' defaults) is listed here */
    if (isnan(cfg->lr)) cfg->lr = d.lr;
    if (isnan(cfg->weight_decay)) cfg->weight_decay = d.weight_decay;
    if (isnan(cfg->eps)) cfg->eps = d.eps;
    return RT_OK;
}

bool rt_optim_config_has_momentum(const rt_optim_config *cfg) {
    const rt_optim_kind_ops *ops = cfg ? rt_optim_kind_ops_of(cfg->kind) : NULL;
    return ops && ops->has_momentum && ops->has_momentum(cfg);
}
