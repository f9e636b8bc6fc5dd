/* Internal interface of src/optim: the optimizer rows and the device backends.
 *
 * An optimizer is one row (rt_optim_kind_ops: name, defaults, validation, state
 * buffers, coefficients, CPU step; its CUDA kernel is a case in cuda/optim_cuda.cu),
 * defined in src/optim/<name>.c and listed
 * in kinds.c; the front end (optimizer.c) never branches on the kind.
 *
 * A device kind is one backend table (rt_optim_backend): the CPU one in
 * cpu/optim_cpu.c and the CUDA one in cuda/optim_cuda.cu (built only with RT_HAVE_CUDA),
 * picked when an optimizer or a clipper is created (rt_optim_backend_get), as
 * src/model/backend.h does for the layers. The CPU backend's step walks the weight-decay
 * exclusions and calls the row's CPU loop; the CUDA backend's step launches the kind's
 * kernel, chosen in one switch in cuda/optim_cuda.cu (the rows are compiled without CUDA
 * where the emulated-CUDA tests still run that file, so they cannot point at it).
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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The float coefficients of one step, computed by the front end and the kind's row
 * (rt_optim_kind_ops.scalars) in double as PyTorch's Python code computes them, then
 * rounded to float as its kernels receive them. The common part first, then one member
 * of the union per optimizer (a new optimizer with coefficients of its own adds one). */
typedef struct rt_optim_sgd_scalars {
    int momentum;     /* momentum != 0 */
    int first;        /* first step: buf = d (no dampening) */
    int nesterov;     /* d = fma(mom, buf, d) */
    float mom, damp1; /* buf = fma(damp1, d, buf*mom); damp1 = 1 - dampening */
} rt_optim_sgd_scalars;

typedef struct rt_optim_adam_scalars {
    int amsgrad;              /* vhat = max(vmax, v) */
    int decoupled;            /* AdamW: p = p * decay_mul instead of the L2 term */
    float b1, omb1, b2, omb2; /* m = fma(omb1, g, m*b1); v = fma(omb2*g, g, v*b2) */
    float bc2s;               /* sqrt(1 - beta2^t) */
    float eps;                /* denom = sqrt(v)/bc2s + eps */
    float negss;              /* -lr / (1 - beta1^t): p = p + (negss*m)/denom */
    float decay_mul;          /* AdamW: 1 - lr*wd */
} rt_optim_adam_scalars;

typedef struct rt_optim_adadelta_scalars {
    float rho, omrho; /* sq = fma(omrho*g, g, sq*rho); acc = fma(omrho*delta, delta, acc*rho) */
    float eps;        /* delta = sqrt(acc+eps)/sqrt(sq+eps)*g */
} rt_optim_adadelta_scalars;

typedef struct rt_optim_scalars {
    int has_wd;  /* weight decay != 0 (elements in excluded ranges skip it) */
    float wd;    /* L2 decay: d = fma(wd, p, g) */
    float neglr; /* -lr: p = fma(neglr, d, p) (SGD, Adadelta) */
    union {
        rt_optim_sgd_scalars sgd;
        rt_optim_adam_scalars adam;
        rt_optim_adadelta_scalars adadelta;
    };
} rt_optim_scalars;

/* One optimizer: one row per rt_optim_kind (src/optim/<name>.c), listed in kinds.c as
 * src/model/arch.c lists the architectures. Everything that differs between optimizers
 * is here but the CUDA kernel (its case in cuda/optim_cuda.cu's cuda_step); optimizer.c
 * and the CPU backend only call it. Entries marked "NULL:" may be NULL,
 * every other one is set. */
typedef struct rt_optim_kind_ops {
    const char *name; /* optim.name: "sgd", parsed case-insensitively */
    /* PyTorch's defaults of this kind, over the shared ones rt_optim_config_default set */
    void (*defaults)(rt_optim_config *cfg);
    /* its own hyper-parameters (lr and weight_decay are checked before): the error names
     * the config key and what is expected. NULL: nothing of its own to check */
    rt_status (*validate)(const rt_optim_config *cfg);
    /* the names of its state buffers for `cfg` (PyTorch's), in the order its steps use
     * them (opt->state[0], ...); returns how many, at most RT_OPTIM_MAX_STATE - 1 (the
     * front end may add "ema" after them) */
    int (*states)(const rt_optim_config *cfg, const char **names);
    const char *state_hint; /* ends the "no state" error: which buffers exist when */
    /* its coefficients for step `step` (1, 2, ...) at learning rate lr; the common part
     * (has_wd, wd, neglr) is already set, the rest zeroed */
    void (*scalars)(const rt_optim_config *cfg, double lr, int64_t step, rt_optim_scalars *s);
    /* one-cycle momentum: whether cfg has a momentum to cycle, and set it (SGD's momentum,
     * Adam's beta1; the error names the key). NULL (both): none to cycle */
    bool (*has_momentum)(const rt_optim_config *cfg);
    rt_status (*set_momentum)(rt_optim_config *cfg, double momentum);
    /* the CPU step over [off, off + count) of the arena (count > 0), weight decay on it
     * when `decay` (and s->has_wd): state at opt->state[i] + off */
    void (*cpu)(const rt_optimizer *opt, float *params, const float *grads, size_t off, size_t count,
                const rt_optim_scalars *s, int decay);
} rt_optim_kind_ops;

/* The row of `kind` (kinds.c); NULL when out of range. */
const rt_optim_kind_ops *rt_optim_kind_ops_of(rt_optim_kind kind);
/* "sgd | adam | adamw | adadelta", the names of the rows, into buf (kinds.c). */
const char *rt_optim_kind_list(char *buf, size_t size);

/* A backend. Every entry is set. */
typedef struct rt_optim_backend {
    const char *name; /* "cpu", "cuda" */
    /* after the front end allocated opt->state: set up opt->backend_state (e.g. the
     * CUDA weight-decay mask from opt->ranges); release frees it */
    rt_status (*init)(rt_optimizer *opt);
    void (*release)(rt_optimizer *opt);
    /* one step over the whole arena (opt->n floats on opt->device) with the step's
     * coefficients: the row's CPU loop or the kind's kernel, skipping weight decay on
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

/* The parameters' moving average on the CPU (cpu/optim_cpu.c). */
void rt_optim_ema_cpu(float *avg, const float *p, size_t n, float decay, float omdecay, int first);
/* Tests: force the baseline (non-AVX2) CPU loops, to check both builds agree. */
void rt_optim_cpu_force_generic(int on);
/* Whether the CPU loops take their AVX2+FMA build (the CPU has it, not forced off). */
bool rt_optim_cpu_use_fma(void);
/* Sum of squares in double over n floats (8 independent partial sums, fixed order). */
double rt_optim_sumsq_cpu(const float *x, size_t n);
void rt_optim_scale_cpu(float *x, size_t n, float coef);

#ifdef __cplusplus
}
#endif

#endif
