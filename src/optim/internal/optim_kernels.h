/* Internal interface between the optimizer front end (optimizer.c, clip.c) and its
 * backends: one table of functions per device kind, the CPU one in cpu/optim_cpu.c and
 * the CUDA one in cuda/optim_cuda.cu (built only with RT_HAVE_CUDA), picked when an
 * optimizer or a clipper is created (rt_optim_backend_get, the only place where the
 * build option decides anything), as src/model/backend.h does for the layers.
 *
 * The front end validates, keeps the state buffers and turns a step's double-precision
 * hyper-parameters into the float coefficients PyTorch's kernels would see
 * (rt_optim_scalars), so every backend does exactly the same float32 arithmetic.
 */
#ifndef RT_OPTIM_KERNELS_H
#define RT_OPTIM_KERNELS_H

#include "core/device.h"
#include "core/status.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_optim_scalars {
    int has_wd;               /* weight decay != 0 (elements in excluded ranges skip it) */
    int momentum;             /* SGD: momentum != 0 */
    int first;                /* SGD: first step, buf = d (no dampening) */
    int nesterov;             /* SGD */
    int amsgrad;              /* Adam */
    int decoupled;            /* AdamW */
    float wd;                 /* SGD/Adam: d = fma(wd, p, g) */
    float mom;                /* SGD: buf = fma(damp1, d, buf*mom); nesterov d = fma(mom, buf, d) */
    float damp1;              /* 1 - dampening */
    float neglr;              /* SGD: p = fma(neglr, d, p) */
    float b1, omb1, b2, omb2; /* Adam: m = fma(omb1, g, m*b1); v = fma(omb2*g, g, v*b2) */
    float bc2s;               /* sqrt(1 - beta2^t) */
    float eps;                /* denom = sqrt(v)/bc2s + eps */
    float negss;              /* -lr / (1 - beta1^t): p = p + (negss*m)/denom */
    float decay_mul;          /* AdamW: p = p * (1 - lr*wd) */
    int adadelta;             /* Adadelta (eps, wd and neglr as above) */
    float rho, omrho;         /* sq = fma(omrho*g, g, sq*rho); delta = sqrt(acc+eps)/sqrt(sq+eps)*g;
                               * acc = fma(omrho*delta, delta, acc*rho); p = fma(neglr, delta, p) */
} rt_optim_scalars;

/* A backend. Every entry is set. */
typedef struct rt_optim_backend {
    const char *name; /* "cpu", "cuda" */
    /* after the front end allocated opt->state: set up opt->backend_state (e.g. the
     * CUDA weight-decay mask from opt->ranges); release frees it */
    rt_status (*init)(rt_optimizer *opt);
    void (*release)(rt_optimizer *opt);
    /* one step over the whole arena (opt->n floats on opt->device) with the step's
     * coefficients: SGD or Adam/AdamW as opt->cfg.kind says, skipping weight decay on
     * opt->ranges; asynchronous on `stream` where the device allows */
    rt_status (*step)(rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                      rt_stream *stream);
    /* gradient clipping: scratch in c->scratch; the sum of squares of n floats in
     * double, deterministic, into *sum on the host, asynchronously on `stream` where the
     * device has streams (then *sum should be pinned memory, and is valid once the
     * stream got there: the caller synchronises); x *= coef */
    rt_status (*clip_init)(rt_grad_clip *c);
    void (*clip_release)(rt_grad_clip *c);
    rt_status (*sumsq)(rt_grad_clip *c, const float *x, size_t n, rt_stream *stream, double *sum);
    rt_status (*scale)(rt_grad_clip *c, float *x, size_t n, float coef, rt_stream *stream);
    /* the parameters' moving average over n floats: first ? avg = p : avg = decay*avg +
     * omdecay*p (two float products and a float sum, no fused multiply-add: PyTorch's
     * mul, mul, add); swap exchanges avg and p */
    rt_status (*ema)(float *avg, const float *p, size_t n, float decay, float omdecay, int first, rt_stream *stream);
    rt_status (*ema_swap)(float *avg, float *p, size_t n, rt_stream *stream);
} rt_optim_backend;

extern const rt_optim_backend rt_optim_backend_cpu;
extern const rt_optim_backend rt_optim_backend_cuda;

/* The backend of device kind `kind`; NULL when it is not built in. */
const rt_optim_backend *rt_optim_backend_get(rt_device_kind kind);

/* The CPU loops (cpu/optim_cpu.c), also for the tests: one contiguous range, `decay`
 * says whether weight decay applies to it. */
void rt_optim_sgd_cpu(float *params, const float *grads, float *buf, size_t n, const rt_optim_scalars *s, int decay);
void rt_optim_adam_cpu(float *params, const float *grads, float *m, float *v, float *vmax, size_t n,
                       const rt_optim_scalars *s, int decay);
void rt_optim_adadelta_cpu(float *params, const float *grads, float *square_avg, float *acc_delta, size_t n,
                           const rt_optim_scalars *s, int decay);
void rt_optim_ema_cpu(float *avg, const float *p, size_t n, float decay, float omdecay, int first);
/* Tests: force the baseline (non-AVX2) CPU loops, to check both builds agree. */
void rt_optim_cpu_force_generic(int on);
/* Sum of squares in double over n floats (8 independent partial sums, fixed order). */
double rt_optim_sumsq_cpu(const float *x, size_t n);
void rt_optim_scale_cpu(float *x, size_t n, float coef);

#ifdef __cplusplus
}
#endif

#endif
