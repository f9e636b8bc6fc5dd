/* Private interface between the optimizer front end (optimizer.c, clip.c) and the CPU
 * (cpu/optim_cpu.c) and CUDA (cuda/optim_cuda.cu) kernels.
 *
 * The front end turns a step's double-precision hyper-parameters into the float
 * coefficients PyTorch's kernels would see (rt_optim_scalars), so both backends do
 * exactly the same float32 arithmetic.
 */
#ifndef RT_OPTIM_KERNELS_H
#define RT_OPTIM_KERNELS_H

#include "core/device.h"
#include "core/status.h"
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
} rt_optim_scalars;

/* CPU: one contiguous range, `decay` says whether weight decay applies to it. */
void rt_optim_sgd_cpu(float *params, const float *grads, float *buf, size_t n, const rt_optim_scalars *s, int decay);
void rt_optim_adam_cpu(float *params, const float *grads, float *m, float *v, float *vmax, size_t n,
                       const rt_optim_scalars *s, int decay);
/* Tests: force the baseline (non-AVX2) CPU loops, to check both builds agree. */
void rt_optim_cpu_force_generic(int on);
/* Sum of squares in double over n floats (8 independent partial sums, fixed order). */
double rt_optim_sumsq_cpu(const float *x, size_t n);
void rt_optim_scale_cpu(float *x, size_t n, float coef);

/* CUDA: the whole arena in one launch; decay_mask (may be NULL = decay everywhere) has
 * bit (i & 31) of word i >> 5 set where weight decay applies. */
rt_status rt_optim_sgd_cuda(float *params, const float *grads, float *buf, size_t n, const rt_optim_scalars *s,
                            const uint32_t *decay_mask, rt_stream *stream);
rt_status rt_optim_adam_cuda(float *params, const float *grads, float *m, float *v, float *vmax, size_t n,
                             const rt_optim_scalars *s, const uint32_t *decay_mask, rt_stream *stream);
/* Sum of squares over n floats into *out_dev (a double on the device), deterministic:
 * fixed grid, per-block partials in `partial_dev` (RT_OPTIM_NORM_BLOCKS doubles), then
 * one block adds them in order. */
#define RT_OPTIM_NORM_BLOCKS 512
rt_status rt_optim_sumsq_cuda(const float *x, size_t n, double *partial_dev, double *out_dev, rt_stream *stream);
rt_status rt_optim_scale_cuda(float *x, size_t n, float coef, rt_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
