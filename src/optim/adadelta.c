/* Adadelta (torch.optim.Adadelta: rho, eps, L2 weight decay; maximize off): its row
 * (rt_optim_kind_adadelta) and its CPU loop. The CUDA kernel is adadelta_kernel in
 * cuda/optim_cuda.cu. State: "square_avg", "acc_delta". No momentum to cycle.
 */
#include "optim/internal/cpu_loops.h"

static void adadelta_defaults(rt_optim_config *cfg) {
    cfg->lr = 1.0;
    cfg->eps = 1e-6; /* rho 0.9: shared */
}

static rt_status adadelta_validate(const rt_optim_config *cfg) {
    RT_REQUIRE(cfg->rho >= 0 && cfg->rho <= 1, RT_ERR_INVALID, "optim.rho: %g (expected 0 <= rho <= 1)", cfg->rho);
    RT_REQUIRE(isfinite(cfg->eps) && cfg->eps >= 0, RT_ERR_INVALID, "optim.eps: %g (expected a finite value >= 0)",
               cfg->eps);
    return RT_OK;
}

static int adadelta_states(const rt_optim_config *cfg, const char **names) {
    (void)cfg;
    names[0] = "square_avg";
    names[1] = "acc_delta";
    return 2;
}

/* _single_tensor_adadelta */
static void adadelta_scalars(const rt_optim_config *c, double lr, int64_t step, rt_optim_scalars *s) {
    (void)lr, (void)step;                      /* s->neglr: param.add_(delta, alpha=-lr) */
    s->adadelta.rho = (float)c->rho;           /* square_avg.mul_(rho) */
    s->adadelta.omrho = (float)(1.0 - c->rho); /* addcmul_(grad, grad, value=1 - rho) */
    s->adadelta.eps = (float)c->eps;
}

/* ---- the CPU loop ------------------------------------------------------------------- */

/* PyTorch 1.13's _single_tensor_adadelta, one element at a time in its float order */
RT_ALWAYS_INLINE void adadelta_body(float *restrict p, const float *restrict g, float *restrict sq, float *restrict acc,
                                    size_t n, const rt_optim_scalars *s, bool wd) {
    const float wdf = s->wd, rho = s->adadelta.rho, omrho = s->adadelta.omrho, eps = s->adadelta.eps, neglr = s->neglr;
    for (size_t i = 0; i < n; i++) {
        float pi = p[i], gi = g[i];
        if (wd) gi = fmaf(wdf, pi, gi);               /* grad = grad.add(param, alpha=weight_decay) */
        float si = fmaf(omrho * gi, gi, sq[i] * rho); /* square_avg.mul_(rho).addcmul_(grad, grad, value=1-rho) */
        sq[i] = si;
        float sd = sqrtf(si + eps);                        /* std = square_avg.add(eps).sqrt_() */
        float delta = sqrtf(acc[i] + eps) / sd * gi;       /* acc_delta.add(eps).sqrt_().div_(std).mul_(grad) */
        acc[i] = fmaf(omrho * delta, delta, acc[i] * rho); /* acc_delta.mul_(rho).addcmul_(delta, delta, 1-rho) */
        p[i] = fmaf(neglr, delta, pi);                     /* param.add_(delta, alpha=-lr) */
    }
}

static void adadelta_generic(float *restrict p, const float *restrict g, float *restrict sq, float *restrict acc,
                             size_t n, const rt_optim_scalars *s, bool wd) {
    if (wd)
        adadelta_body(p, g, sq, acc, n, s, true);
    else
        adadelta_body(p, g, sq, acc, n, s, false);
}

#ifdef RT_OPTIM_FMA_VARIANT
RT_TARGET_FMA static void adadelta_fma(float *restrict p, const float *restrict g, float *restrict sq,
                                       float *restrict acc, size_t n, const rt_optim_scalars *s, bool wd) {
    if (wd)
        adadelta_body(p, g, sq, acc, n, s, true);
    else
        adadelta_body(p, g, sq, acc, n, s, false);
}
#endif

static void adadelta_cpu(const rt_optimizer *opt, float *params, const float *grads, size_t off, size_t count,
                         const rt_optim_scalars *s, int decay) {
    float *sq = opt->state[0] + off, *acc = opt->state[1] + off;
    bool wd = decay && s->has_wd;
#ifdef RT_OPTIM_FMA_VARIANT
    if (rt_optim_cpu_use_fma()) {
        adadelta_fma(params + off, grads + off, sq, acc, count, s, wd);
        return;
    }
#endif
    adadelta_generic(params + off, grads + off, sq, acc, count, s, wd);
}

const rt_optim_kind_ops rt_optim_kind_adadelta = {
    .name = "adadelta",
    .defaults = adadelta_defaults,
    .validate = adadelta_validate,
    .states = adadelta_states,
    .state_hint = " (adadelta keeps square_avg and acc_delta)",
    .scalars = adadelta_scalars,
    .has_momentum = NULL, /* optim.cycle_momentum does not apply */
    .set_momentum = NULL,
    .cpu = adadelta_cpu,
};
