/* Adam (torch.optim.Adam: L2 weight decay, amsgrad) and AdamW (torch.optim.AdamW:
 * decoupled weight decay): their rows (rt_optim_kind_adam, rt_optim_kind_adamw) and
 * their CPU loop, the same for both (AdamW differs only in the decay). The CUDA kernel
 * is adam_kernel in cuda/optim_cuda.cu. State: "exp_avg", "exp_avg_sq", and
 * "max_exp_avg_sq" with amsgrad.
 */
#include "optim/internal/cpu_loops.h"

static void adam_defaults(rt_optim_config *cfg) { cfg->lr = 1e-3; /* betas (0.9, 0.999), eps 1e-8: shared */ }

static void adamw_defaults(rt_optim_config *cfg) {
    cfg->lr = 1e-3;
    cfg->weight_decay = 1e-2;
}

static rt_status adam_validate(const rt_optim_config *cfg) {
    RT_REQUIRE(cfg->betas[0] >= 0 && cfg->betas[0] < 1, RT_ERR_INVALID, "optim.betas[0]: %g (expected 0 <= beta1 < 1)",
               cfg->betas[0]);
    RT_REQUIRE(cfg->betas[1] >= 0 && cfg->betas[1] < 1, RT_ERR_INVALID, "optim.betas[1]: %g (expected 0 <= beta2 < 1)",
               cfg->betas[1]);
    RT_REQUIRE(isfinite(cfg->eps) && cfg->eps >= 0, RT_ERR_INVALID, "optim.eps: %g (expected a finite value >= 0)",
               cfg->eps);
    return RT_OK;
}

static int adam_states(const rt_optim_config *cfg, const char **names) {
    int n = 0;
    names[n++] = "exp_avg";
    names[n++] = "exp_avg_sq";
    if (cfg->amsgrad) names[n++] = "max_exp_avg_sq";
    return n;
}

/* _single_tensor_adam / _single_tensor_adamw */
static void adam_scalars_common(const rt_optim_config *c, double lr, int64_t step, rt_optim_scalars *s) {
    double bc1 = 1.0 - pow(c->betas[0], (double)step);
    double bc2 = 1.0 - pow(c->betas[1], (double)step);
    double step_size = lr / bc1;
    s->adam.amsgrad = c->amsgrad;
    s->adam.b1 = (float)c->betas[0];
    s->adam.omb1 = (float)(1.0 - c->betas[0]);
    s->adam.b2 = (float)c->betas[1];
    s->adam.omb2 = (float)(1.0 - c->betas[1]);
    s->adam.bc2s = (float)sqrt(bc2);
    s->adam.eps = (float)c->eps;
    s->adam.negss = (float)(-step_size);
    s->adam.decay_mul = (float)(1.0 - lr * c->weight_decay);
}

static void adam_scalars(const rt_optim_config *c, double lr, int64_t step, rt_optim_scalars *s) {
    adam_scalars_common(c, lr, step, s);
    s->adam.decoupled = 0;
}

static void adamw_scalars(const rt_optim_config *c, double lr, int64_t step, rt_optim_scalars *s) {
    adam_scalars_common(c, lr, step, s);
    s->adam.decoupled = 1;
}

static bool adam_has_momentum(const rt_optim_config *cfg) {
    (void)cfg;
    return true;
}

static rt_status adam_set_momentum(rt_optim_config *cfg, double momentum) {
    RT_REQUIRE(momentum >= 0 && momentum < 1, RT_ERR_INVALID, "optim.betas[0]: %g (expected 0 <= beta1 < 1)", momentum);
    cfg->betas[0] = momentum;
    return RT_OK;
}

/* ---- the CPU loop ------------------------------------------------------------------- */

RT_ALWAYS_INLINE void adam_body(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                                float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd, bool decoupled,
                                bool amsgrad) {
    const float wdf = s->wd, b1 = s->adam.b1, omb1 = s->adam.omb1, b2 = s->adam.b2, omb2 = s->adam.omb2,
                bc2s = s->adam.bc2s, eps = s->adam.eps, negss = s->adam.negss, decay_mul = s->adam.decay_mul;
    for (size_t i = 0; i < n; i++) {
        float pi = p[i], gi = g[i];
        if (wd) {
            if (decoupled)
                pi = pi * decay_mul; /* param.mul_(1 - lr*weight_decay) */
            else
                gi = fmaf(wdf, pi, gi); /* grad = grad.add(param, alpha=weight_decay) */
        }
        float mi = fmaf(omb1, gi, m[i] * b1);      /* exp_avg.mul_(beta1).add_(grad, alpha=1-beta1) */
        float vi = fmaf(omb2 * gi, gi, v[i] * b2); /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1-beta2) */
        m[i] = mi;
        v[i] = vi;
        float vh = vi;
        if (amsgrad) {
            float a = vmax[i];
            vh = a >= vi ? a : vi; /* torch.maximum (a NaN in vi propagates) */
            vmax[i] = vh;
        }
        float denom = sqrtf(vh) / bc2s + eps; /* (v.sqrt() / bias_correction2_sqrt).add_(eps) */
        p[i] = pi + (negss * mi) / denom;     /* param.addcdiv_(exp_avg, denom, value=-step_size) */
    }
}

RT_ALWAYS_INLINE void adam_all(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                               float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd) {
    if (s->adam.decoupled) {
        if (s->adam.amsgrad)
            adam_body(p, g, m, v, vmax, n, s, true, true, true);
        else
            adam_body(p, g, m, v, vmax, n, s, true, true, false);
    } else if (wd) {
        if (s->adam.amsgrad)
            adam_body(p, g, m, v, vmax, n, s, true, false, true);
        else
            adam_body(p, g, m, v, vmax, n, s, true, false, false);
    } else {
        if (s->adam.amsgrad)
            adam_body(p, g, m, v, vmax, n, s, false, false, true);
        else
            adam_body(p, g, m, v, vmax, n, s, false, false, false);
    }
}

static void adam_generic(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                         float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd) {
    adam_all(p, g, m, v, vmax, n, s, wd);
}

#ifdef RT_OPTIM_FMA_VARIANT
/* adam_body with AVX2 intrinsics, 8 floats at a time (gcc will not vectorise sqrtf while
 * it may set errno): the same operations in the same order; the tail goes through adam_all */
RT_TARGET_FMA static void adam_fma(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                                   float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd) {
    const __m256 vwd = _mm256_set1_ps(s->wd), b1 = _mm256_set1_ps(s->adam.b1), omb1 = _mm256_set1_ps(s->adam.omb1),
                 b2 = _mm256_set1_ps(s->adam.b2), omb2 = _mm256_set1_ps(s->adam.omb2),
                 bc2s = _mm256_set1_ps(s->adam.bc2s), eps = _mm256_set1_ps(s->adam.eps),
                 negss = _mm256_set1_ps(s->adam.negss), decay_mul = _mm256_set1_ps(s->adam.decay_mul);
    const bool decoupled = s->adam.decoupled, amsgrad = s->adam.amsgrad;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pi = _mm256_loadu_ps(p + i), gi = _mm256_loadu_ps(g + i);
        if (wd) {
            if (decoupled)
                pi = _mm256_mul_ps(pi, decay_mul);
            else
                gi = _mm256_fmadd_ps(vwd, pi, gi);
        }
        __m256 mi = _mm256_fmadd_ps(omb1, gi, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
        __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 vh = vi;
        if (amsgrad) {
            __m256 a = _mm256_loadu_ps(vmax + i);
            vh = _mm256_blendv_ps(vi, a, _mm256_cmp_ps(a, vi, _CMP_GE_OQ)); /* a >= vi ? a : vi */
            _mm256_storeu_ps(vmax + i, vh);
        }
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vh), bc2s), eps);
        _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(negss, mi), denom)));
    }
    if (i < n) adam_all(p + i, g + i, m + i, v + i, vmax ? vmax + i : NULL, n - i, s, wd);
}
#endif

static void adam_cpu(const rt_optimizer *opt, float *params, const float *grads, size_t off, size_t count,
                     const rt_optim_scalars *s, int decay) {
    float *m = opt->state[0] + off, *v = opt->state[1] + off, *vmax = s->adam.amsgrad ? opt->state[2] + off : NULL;
    bool wd = decay && s->has_wd;
    /* AdamW with weight decay excluded here: multiplying by 1 - lr*0 = 1 is exact, skip it */
    rt_optim_scalars local;
    if (s->adam.decoupled && !wd) {
        local = *s;
        local.adam.decoupled = 0;
        s = &local;
    }
#ifdef RT_OPTIM_FMA_VARIANT
    if (rt_optim_cpu_use_fma()) {
        adam_fma(params + off, grads + off, m, v, vmax, count, s, wd);
        return;
    }
#endif
    adam_generic(params + off, grads + off, m, v, vmax, count, s, wd);
}

const rt_optim_kind_ops rt_optim_kind_adam = {
    .name = "adam",
    .defaults = adam_defaults,
    .validate = adam_validate,
    .states = adam_states,
    .state_hint = " (max_exp_avg_sq exists only with amsgrad)",
    .scalars = adam_scalars,
    .has_momentum = adam_has_momentum,
    .set_momentum = adam_set_momentum,
    .cpu = adam_cpu,
};

const rt_optim_kind_ops rt_optim_kind_adamw = {
    .name = "adamw",
    .defaults = adamw_defaults,
    .validate = adam_validate,
    .states = adam_states,
    .state_hint = " (max_exp_avg_sq exists only with amsgrad)",
    .scalars = adamw_scalars,
    .has_momentum = adam_has_momentum,
    .set_momentum = adam_set_momentum,
    .cpu = adam_cpu,
};
