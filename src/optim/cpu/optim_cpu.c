/* The CPU optimizer backend: SGD, Adam/AdamW and Adadelta loops over one contiguous stretch of
 * the arena, walked between the weight-decay exclusions, plus the sum of squares and
 * the scaling used by gradient clipping, and the table (rt_optim_backend_cpu).
 *
 * Each loop is written once (always-inline bodies with the options as constant
 * arguments, so every option combination becomes a branch-free loop) and compiled
 * twice: for the baseline CPU and, on x86-64, for AVX2+FMA, picked at run time. The
 * arithmetic follows PyTorch's AVX2 kernels exactly: fused multiply-adds where
 * PyTorch's add(alpha=)/addcmul use them (fmaf, which is exact in both builds: the
 * baseline build just computes it more slowly), plain float ops elsewhere. gcc
 * vectorises the loops (restrict pointers); the Adam loop has sqrtf, which gcc will not
 * vectorise while it may set errno, so its AVX2 version is written with intrinsics
 * (the same operations in the same order).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "optim/internal/optim_kernels.h"

#include <math.h>
#include <stdbool.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define RT_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define RT_ALWAYS_INLINE static inline
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define RT_OPTIM_FMA_VARIANT 1
#define RT_TARGET_FMA __attribute__((target("avx2,fma")))
#endif

/* ---- SGD ---------------------------------------------------------------------------- */

RT_ALWAYS_INLINE void sgd_body(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                               const rt_optim_scalars *s, bool wd, bool mom, bool first, bool nesterov) {
    const float wdf = s->wd, m = s->mom, damp1 = s->damp1, neglr = s->neglr;
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
    if (!s->momentum) {
        if (wd)
            sgd_body(p, g, buf, n, s, true, false, false, false);
        else
            sgd_body(p, g, buf, n, s, false, false, false, false);
    } else if (s->first) {
        if (wd)
            sgd_body(p, g, buf, n, s, true, true, true, s->nesterov);
        else if (s->nesterov)
            sgd_body(p, g, buf, n, s, false, true, true, true);
        else
            sgd_body(p, g, buf, n, s, false, true, true, false);
    } else if (s->nesterov) {
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

/* ---- Adam / AdamW ------------------------------------------------------------------- */

RT_ALWAYS_INLINE void adam_body(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                                float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd, bool decoupled,
                                bool amsgrad) {
    const float wdf = s->wd, b1 = s->b1, omb1 = s->omb1, b2 = s->b2, omb2 = s->omb2, bc2s = s->bc2s, eps = s->eps,
                negss = s->negss, decay_mul = s->decay_mul;
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
    if (s->decoupled) {
        if (s->amsgrad)
            adam_body(p, g, m, v, vmax, n, s, true, true, true);
        else
            adam_body(p, g, m, v, vmax, n, s, true, true, false);
    } else if (wd) {
        if (s->amsgrad)
            adam_body(p, g, m, v, vmax, n, s, true, false, true);
        else
            adam_body(p, g, m, v, vmax, n, s, true, false, false);
    } else {
        if (s->amsgrad)
            adam_body(p, g, m, v, vmax, n, s, false, false, true);
        else
            adam_body(p, g, m, v, vmax, n, s, false, false, false);
    }
}

/* ---- Adadelta ------------------------------------------------------------------------ */

/* PyTorch 1.13's _single_tensor_adadelta, one element at a time in its float order */
RT_ALWAYS_INLINE void adadelta_body(float *restrict p, const float *restrict g, float *restrict sq, float *restrict acc,
                                    size_t n, const rt_optim_scalars *s, bool wd) {
    const float wdf = s->wd, rho = s->rho, omrho = s->omrho, eps = s->eps, neglr = s->neglr;
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

/* ---- the parameters' moving average ---------------------------------------------------- */

/* One build only (no avx2/fma target): decay*avg + omdecay*p must stay two rounded
 * products and a rounded sum, as PyTorch's mul, mul, add (a contracted fma would differ). */
void rt_optim_ema_cpu(float *restrict avg, const float *restrict p, size_t n, float decay, float omdecay, int first) {
    if (first) {
        for (size_t i = 0; i < n; i++) avg[i] = p[i];
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float a = avg[i] * decay, b = p[i] * omdecay;
        avg[i] = a + b;
    }
}

/* ---- clipping ----------------------------------------------------------------------- */

RT_ALWAYS_INLINE double sumsq_body(const float *restrict x, size_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++) acc[i & 7] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

RT_ALWAYS_INLINE void scale_body(float *restrict x, size_t n, float coef) {
    for (size_t i = 0; i < n; i++) x[i] = x[i] * coef;
}

/* ---- the two builds and the run-time choice ----------------------------------------- */

static void sgd_generic(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                        const rt_optim_scalars *s, bool wd) {
    sgd_all(p, g, buf, n, s, wd);
}
static void adam_generic(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                         float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd) {
    adam_all(p, g, m, v, vmax, n, s, wd);
}
static void adadelta_generic(float *restrict p, const float *restrict g, float *restrict sq, float *restrict acc,
                             size_t n, const rt_optim_scalars *s, bool wd) {
    if (wd)
        adadelta_body(p, g, sq, acc, n, s, true);
    else
        adadelta_body(p, g, sq, acc, n, s, false);
}
static double sumsq_generic(const float *restrict x, size_t n) { return sumsq_body(x, n); }
static void scale_generic(float *restrict x, size_t n, float coef) { scale_body(x, n, coef); }

#ifdef RT_OPTIM_FMA_VARIANT
RT_TARGET_FMA static void sgd_fma(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                                  const rt_optim_scalars *s, bool wd) {
    sgd_all(p, g, buf, n, s, wd);
}
/* adam_body with AVX2 intrinsics, 8 floats at a time; the tail goes through adam_all */
RT_TARGET_FMA static void adam_fma(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                                   float *restrict vmax, size_t n, const rt_optim_scalars *s, bool wd) {
    const __m256 vwd = _mm256_set1_ps(s->wd), b1 = _mm256_set1_ps(s->b1), omb1 = _mm256_set1_ps(s->omb1),
                 b2 = _mm256_set1_ps(s->b2), omb2 = _mm256_set1_ps(s->omb2), bc2s = _mm256_set1_ps(s->bc2s),
                 eps = _mm256_set1_ps(s->eps), negss = _mm256_set1_ps(s->negss),
                 decay_mul = _mm256_set1_ps(s->decay_mul);
    const bool decoupled = s->decoupled, amsgrad = s->amsgrad;
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
RT_TARGET_FMA static void adadelta_fma(float *restrict p, const float *restrict g, float *restrict sq,
                                       float *restrict acc, size_t n, const rt_optim_scalars *s, bool wd) {
    if (wd)
        adadelta_body(p, g, sq, acc, n, s, true);
    else
        adadelta_body(p, g, sq, acc, n, s, false);
}
RT_TARGET_FMA static double sumsq_fma(const float *restrict x, size_t n) { return sumsq_body(x, n); }
RT_TARGET_FMA static void scale_fma(float *restrict x, size_t n, float coef) { scale_body(x, n, coef); }

static int force_generic;

static bool have_fma(void) { return !force_generic && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

void rt_optim_cpu_force_generic(int on) {
#ifdef RT_OPTIM_FMA_VARIANT
    force_generic = on;
#else
    (void)on;
#endif
}

void rt_optim_sgd_cpu(float *params, const float *grads, float *buf, size_t n, const rt_optim_scalars *s, int decay) {
    bool wd = decay && s->has_wd;
#ifdef RT_OPTIM_FMA_VARIANT
    if (have_fma()) {
        sgd_fma(params, grads, buf, n, s, wd);
        return;
    }
#endif
    sgd_generic(params, grads, buf, n, s, wd);
}

void rt_optim_adam_cpu(float *params, const float *grads, float *m, float *v, float *vmax, size_t n,
                       const rt_optim_scalars *s, int decay) {
    bool wd = decay && s->has_wd;
    /* AdamW with weight decay excluded here: multiplying by 1 - lr*0 = 1 is exact, skip it */
    rt_optim_scalars local;
    if (s->decoupled && !wd) {
        local = *s;
        local.decoupled = 0;
        s = &local;
    }
#ifdef RT_OPTIM_FMA_VARIANT
    if (have_fma()) {
        adam_fma(params, grads, m, v, vmax, n, s, wd);
        return;
    }
#endif
    adam_generic(params, grads, m, v, vmax, n, s, wd);
}

void rt_optim_adadelta_cpu(float *params, const float *grads, float *square_avg, float *acc_delta, size_t n,
                           const rt_optim_scalars *s, int decay) {
    bool wd = decay && s->has_wd;
#ifdef RT_OPTIM_FMA_VARIANT
    if (have_fma()) {
        adadelta_fma(params, grads, square_avg, acc_delta, n, s, wd);
        return;
    }
#endif
    adadelta_generic(params, grads, square_avg, acc_delta, n, s, wd);
}

double rt_optim_sumsq_cpu(const float *x, size_t n) {
#ifdef RT_OPTIM_FMA_VARIANT
    if (have_fma()) return sumsq_fma(x, n);
#endif
    return sumsq_generic(x, n);
}

void rt_optim_scale_cpu(float *x, size_t n, float coef) {
#ifdef RT_OPTIM_FMA_VARIANT
    if (have_fma()) {
        scale_fma(x, n, coef);
        return;
    }
#endif
    scale_generic(x, n, coef);
}

/* ---- the backend table ---------------------------------------------------------------- */

static rt_status cpu_init(rt_optimizer *opt) {
    (void)opt;
    return RT_OK;
}

static void cpu_release(rt_optimizer *opt) { (void)opt; }

static void cpu_range(const rt_optimizer *opt, float *p, const float *g, size_t off, size_t count,
                      const rt_optim_scalars *s, int decay) {
    if (count == 0) return;
    if (opt->cfg.kind == RT_OPTIM_SGD) {
        rt_optim_sgd_cpu(p + off, g + off, s->momentum ? opt->state[0] + off : NULL, count, s, decay);
    } else if (opt->cfg.kind == RT_OPTIM_ADADELTA) {
        rt_optim_adadelta_cpu(p + off, g + off, opt->state[0] + off, opt->state[1] + off, count, s, decay);
    } else {
        rt_optim_adam_cpu(p + off, g + off, opt->state[0] + off, opt->state[1] + off,
                          s->amsgrad ? opt->state[2] + off : NULL, count, s, decay);
    }
}

/* walk the arena: decayed stretches between the excluded ranges (sorted, disjoint) */
static rt_status cpu_step(rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                          rt_stream *stream) {
    (void)stream;
    size_t pos = 0;
    for (size_t i = 0; i < opt->cfg.n_no_decay; i++) {
        const rt_optim_range *r = &opt->ranges[i];
        cpu_range(opt, params, grads, pos, r->offset - pos, s, 1);
        cpu_range(opt, params, grads, r->offset, r->count, s, 0);
        pos = r->offset + r->count;
    }
    cpu_range(opt, params, grads, pos, opt->n - pos, s, 1);
    return RT_OK;
}

static rt_status cpu_clip_init(rt_grad_clip *c) {
    (void)c;
    return RT_OK;
}

static void cpu_clip_release(rt_grad_clip *c) { (void)c; }

static rt_status cpu_sumsq(rt_grad_clip *c, const float *x, size_t n, rt_stream *stream, double *sum) {
    (void)c, (void)stream;
    *sum = rt_optim_sumsq_cpu(x, n);
    return RT_OK;
}

static rt_status cpu_scale(rt_grad_clip *c, float *x, size_t n, float coef, rt_stream *stream) {
    (void)c, (void)stream;
    rt_optim_scale_cpu(x, n, coef);
    return RT_OK;
}

static rt_status cpu_ema(float *avg, const float *p, size_t n, float decay, float omdecay, int first,
                         rt_stream *stream) {
    (void)stream;
    rt_optim_ema_cpu(avg, p, n, decay, omdecay, first);
    return RT_OK;
}

static rt_status cpu_ema_swap(float *avg, float *p, size_t n, rt_stream *stream) {
    (void)stream;
    for (size_t i = 0; i < n; i++) {
        float t = avg[i];
        avg[i] = p[i];
        p[i] = t;
    }
    return RT_OK;
}

const rt_optim_backend rt_optim_backend_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .release = cpu_release,
    .step = cpu_step,
    .clip_init = cpu_clip_init,
    .clip_release = cpu_clip_release,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .ema = cpu_ema,
    .ema_swap = cpu_ema_swap,
};
