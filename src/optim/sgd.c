/* SGD (torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay): its row
 * (rt_optim_kind_sgd) and its CPU loop. The CUDA kernel is sgd_kernel in
 * cuda/optim_cuda.cu. State: "momentum_buffer" with momentum > 0, none otherwise.
 */
#include "optim/internal/cpu_loops.h"

static void sgd_defaults(rt_optim_config *cfg) { cfg->lr = 0.1; /* PyTorch has none */ }

static rt_status sgd_validate(const rt_optim_config *cfg) {
    RT_REQUIRE(isfinite(cfg->momentum) && cfg->momentum >= 0, RT_ERR_INVALID,
               "optim.momentum: %g (expected a finite value >= 0)", cfg->momentum);
    RT_REQUIRE(isfinite(cfg->dampening), RT_ERR_INVALID, "optim.dampening: %g (expected a finite value)",
               cfg->dampening);
    RT_REQUIRE(!cfg->nesterov || (cfg->momentum > 0 && cfg->dampening == 0), RT_ERR_INVALID,
               "optim.nesterov: needs momentum > 0 and dampening = 0 (got momentum %g, dampening %g)", cfg->momentum,
               cfg->dampening);
    return RT_OK;
}

static int sgd_states(const rt_optim_config *cfg, const char **names) {
    if (cfg->momentum == 0) return 0;
    names[0] = "momentum_buffer";
    return 1;
}

/* _single_tensor_sgd */
static void sgd_scalars(const rt_optim_config *cfg, double lr, int64_t step, rt_optim_scalars *s) {
    (void)lr; /* s->neglr */
    s->sgd.momentum = cfg->momentum != 0;
    s->sgd.first = step == 1;
    s->sgd.nesterov = cfg->nesterov;
    s->sgd.mom = (float)cfg->momentum;
    s->sgd.damp1 = (float)(1.0 - cfg->dampening);
}

static bool sgd_has_momentum(const rt_optim_config *cfg) { return cfg->momentum > 0; }

static rt_status sgd_set_momentum(rt_optim_config *cfg, double momentum) {
    RT_REQUIRE(cfg->momentum != 0 && isfinite(momentum) && momentum > 0, RT_ERR_INVALID,
               "optim.momentum: cannot set %g on an SGD optimizer created with momentum %g", momentum, cfg->momentum);
    cfg->momentum = momentum;
    return RT_OK;
}

/* ---- the CPU loop ------------------------------------------------------------------- */

RT_ALWAYS_INLINE void sgd_body(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                               const rt_optim_scalars *s, bool wd, bool mom, bool first, bool nesterov) {
    const float wdf = s->wd, m = s->sgd.mom, damp1 = s->sgd.damp1, neglr = s->neglr;
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd) d = fmaf(wdf, p[i], d); /* d_p = d_p.add(param, alpha=weight_decay) */
        if (mom) {
            float b;
            if (first)
                b = d; /* buf = clone(d_p) */
            else
                b = fmaf(damp1, d, buf[i] * m); /* buf.mul_(momentum).add_(d_p, alpha=1-dampening) */
            buf[i] = b;
            d = nesterov ? fmaf(m, b, d) : b; /* d_p.add(buf, alpha=momentum) or buf */
        }
        p[i] = fmaf(neglr, d, p[i]); /* param.add_(d_p, alpha=-lr) */
    }
}

RT_ALWAYS_INLINE void sgd_all(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                              const rt_optim_scalars *s, bool wd) {
    if (!s->sgd.momentum) {
        if (wd)
            sgd_body(p, g, buf, n, s, true, false, false, false);
        else
            sgd_body(p, g, buf, n, s, false, false, false, false);
    } else if (s->sgd.first) {
        if (wd)
            sgd_body(p, g, buf, n, s, true, true, true, s->sgd.nesterov);
        else if (s->sgd.nesterov)
            sgd_body(p, g, buf, n, s, false, true, true, true);
        else
            sgd_body(p, g, buf, n, s, false, true, true, false);
    } else if (s->sgd.nesterov) {
        if (wd)
            sgd_body(p, g, buf, n, s, true, true, false, true);
        else
            sgd_body(p, g, buf, n, s, false, true, false, true);
    } else {
        if (wd)
            sgd_body(p, g, buf, n, s, true, true, false, false);
        else
            sgd_body(p, g, buf, n, s, false, true, false, false);
    }
}

static void sgd_generic(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                        const rt_optim_scalars *s, bool wd) {
    sgd_all(p, g, buf, n, s, wd);
}

#ifdef RT_OPTIM_FMA_VARIANT
RT_TARGET_FMA static void sgd_fma(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                                  const rt_optim_scalars *s, bool wd) {
    sgd_all(p, g, buf, n, s, wd);
}
#endif

static void sgd_cpu(const rt_optimizer *opt, float *params, const float *grads, size_t off, size_t count,
                    const rt_optim_scalars *s, int decay) {
    float *buf = s->sgd.momentum ? opt->state[0] + off : NULL;
    bool wd = decay && s->has_wd;
#ifdef RT_OPTIM_FMA_VARIANT
    if (rt_optim_cpu_use_fma()) {
        sgd_fma(params + off, grads + off, buf, count, s, wd);
        return;
    }
#endif
    sgd_generic(params + off, grads + off, buf, count, s, wd);
}

const rt_optim_kind_ops rt_optim_kind_sgd = {
    .name = "sgd",
    .defaults = sgd_defaults,
    .validate = sgd_validate,
    .states = sgd_states,
    .state_hint = " (momentum_buffer exists only with momentum > 0)",
    .scalars = sgd_scalars,
    .has_momentum = sgd_has_momentum,
    .set_momentum = sgd_set_momentum,
    .cpu = sgd_cpu,
};
