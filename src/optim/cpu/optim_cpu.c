/* The CPU optimizer backend: the table (rt_optim_backend_cpu) whose step walks the arena
 * between the weight-decay exclusions and calls the optimizer row's CPU loop on each
 * stretch (the loops live with their rows, src/optim/<name>.c), the parameters' moving
 * average, the sum of squares and the scaling used by gradient clipping, and the
 * run-time choice between the baseline and the AVX2+FMA builds of every loop
 * (internal/cpu_loops.h).
 */
#include "optim/internal/cpu_loops.h"

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

static double sumsq_generic(const float *restrict x, size_t n) { return sumsq_body(x, n); }
static void scale_generic(float *restrict x, size_t n, float coef) { scale_body(x, n, coef); }

#ifdef RT_OPTIM_FMA_VARIANT
RT_TARGET_FMA static double sumsq_fma(const float *restrict x, size_t n) { return sumsq_body(x, n); }
RT_TARGET_FMA static void scale_fma(float *restrict x, size_t n, float coef) { scale_body(x, n, coef); }

static int force_generic;
#endif

bool rt_optim_cpu_use_fma(void) {
#ifdef RT_OPTIM_FMA_VARIANT
    return !force_generic && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

void rt_optim_cpu_force_generic(int on) {
#ifdef RT_OPTIM_FMA_VARIANT
    force_generic = on;
#else
    (void)on;
#endif
}

double rt_optim_sumsq_cpu(const float *x, size_t n) {
#ifdef RT_OPTIM_FMA_VARIANT
    if (rt_optim_cpu_use_fma()) return sumsq_fma(x, n);
#endif
    return sumsq_generic(x, n);
}

void rt_optim_scale_cpu(float *x, size_t n, float coef) {
#ifdef RT_OPTIM_FMA_VARIANT
    if (rt_optim_cpu_use_fma()) {
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
    if (count > 0) opt->ops->cpu(opt, p, g, off, count, s, decay);
}

/* Chunks of the arena per task when the step is split over threads: 256 Ki floats
 * (1 MiB of each array), about 80 tasks for ResNet34, so two threads share them evenly. */
#define STEP_CHUNK ((size_t)1 << 18)

typedef struct step_job {
    rt_optimizer *opt;
    float *params;
    const float *grads;
    const rt_optim_scalars *s;
} step_job;

/* the arena's elements [lo, hi): decayed stretches between the excluded ranges (sorted,
 * disjoint), each clipped to [lo, hi) */
static void step_span(const step_job *J, size_t lo, size_t hi) {
    rt_optimizer *opt = J->opt;
    size_t pos = 0;
    for (size_t i = 0; i <= opt->cfg.n_no_decay && pos < hi; i++) {
        const bool last = i == opt->cfg.n_no_decay;
        const size_t r0 = last ? opt->n : opt->ranges[i].offset, r1 = last ? opt->n : r0 + opt->ranges[i].count;
        size_t a = pos > lo ? pos : lo, b = r0 < hi ? r0 : hi;
        if (b > a) cpu_range(opt, J->params, J->grads, a, b - a, J->s, 1);
        a = r0 > lo ? r0 : lo, b = r1 < hi ? r1 : hi;
        if (b > a) cpu_range(opt, J->params, J->grads, a, b - a, J->s, 0);
        pos = r1;
    }
}

static void step_task(void *arg, int t) {
    const step_job *J = arg;
    const size_t lo = (size_t)t * STEP_CHUNK, hi = lo + STEP_CHUNK < J->opt->n ? lo + STEP_CHUNK : J->opt->n;
    step_span(J, lo, hi);
}

static rt_status cpu_step(rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                          rt_stream *stream) {
    (void)stream;
    step_job J = {.opt = opt, .params = params, .grads = grads, .s = s};
    const int tasks = (int)((opt->n + STEP_CHUNK - 1) / STEP_CHUNK);
    if (opt->parallel && tasks > 1)
        opt->parallel(opt->parallel_pool, tasks, step_task, &J);
    else
        step_span(&J, 0, opt->n);
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
