/* The CUDA optimizer backend: one fused kernel per optimizer over the whole arena (one
 * launch per step, however many tensors) with its launch function, chosen by kind in
 * cuda_kind_step (the one place here that names the optimizers: the rest of an
 * optimizer is its row, src/optim/<name>.c), the deterministic sum-of-squares reduction
 * for gradient clipping, the scaling, the moving average, and the table
 * (rt_optim_backend_cuda).
 *
 * The arithmetic is that of the rows' CPU loops (src/optim/<name>.c), with explicit IEEE
 * rounding intrinsics (__fmaf_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn, ...) so nvcc cannot contract
 * or approximate anything: the GPU result equals the CPU result bit for bit. Weight
 * decay exclusions come as a bit mask (one bit per element, 1/32 of the arena).
 */
#include "core/cuda/cuda_check.h"
#include "core/device.h"
#include "optim/internal/optim_kernels.h"

#include <stdlib.h>
#include <string.h>

#define RT_OPTIM_THREADS 256
/* the norm reduction: a fixed grid of partial sums, then one block adds them in order */
#define RT_OPTIM_NORM_BLOCKS 512

static unsigned optim_grid(size_t n) {
    size_t g = (n + RT_OPTIM_THREADS - 1) / RT_OPTIM_THREADS;
    if (g > 65535 * 8) g = 65535 * 8;
    return g ? (unsigned)g : 1u;
}

static __device__ __forceinline__ bool optim_decays(const rt_optim_scalars &s, const uint32_t *__restrict__ mask,
                                                    size_t i) {
    return s.has_wd && (mask == NULL || ((mask[i >> 5] >> (i & 31)) & 1u));
}

static __global__ void sgd_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ buf, size_t n,
                                  const rt_optim_scalars sv, const rt_optim_scalars *__restrict__ sd, const uint32_t *__restrict__ mask) {
    const rt_optim_scalars s = sd ? *sd : sv; /* a captured step reads its scalars from memory */
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i];
        float d = g[i];
        if (optim_decays(s, mask, i)) d = __fmaf_rn(s.wd, pi, d);
        if (s.sgd.momentum) {
            float b = s.sgd.first ? d : __fmaf_rn(s.sgd.damp1, d, __fmul_rn(buf[i], s.sgd.mom));
            buf[i] = b;
            d = s.sgd.nesterov ? __fmaf_rn(s.sgd.mom, b, d) : b;
        }
        p[i] = __fmaf_rn(s.neglr, d, pi);
    }
}

static __global__ void adam_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                                   float *__restrict__ v, float *__restrict__ vmax, size_t n, const rt_optim_scalars sv, const rt_optim_scalars *__restrict__ sd,
                                   const uint32_t *__restrict__ mask) {
    const rt_optim_scalars s = sd ? *sd : sv; /* a captured step reads its scalars from memory */
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i];
        float gi = g[i];
        if (optim_decays(s, mask, i)) {
            if (s.adam.decoupled)
                pi = __fmul_rn(pi, s.adam.decay_mul);
            else
                gi = __fmaf_rn(s.wd, pi, gi);
        }
        float mi = __fmaf_rn(s.adam.omb1, gi, __fmul_rn(m[i], s.adam.b1));
        float vi = __fmaf_rn(__fmul_rn(s.adam.omb2, gi), gi, __fmul_rn(v[i], s.adam.b2));
        m[i] = mi;
        v[i] = vi;
        float vh = vi;
        if (s.adam.amsgrad) {
            float a = vmax[i];
            vh = a >= vi ? a : vi;
            vmax[i] = vh;
        }
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vh), s.adam.bc2s), s.adam.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.adam.negss, mi), denom));
    }
}

static __global__ void adadelta_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ sq,
                                       float *__restrict__ acc, size_t n, const rt_optim_scalars sv, const rt_optim_scalars *__restrict__ sd,
                                       const uint32_t *__restrict__ mask) {
    const rt_optim_scalars s = sd ? *sd : sv; /* a captured step reads its scalars from memory */
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i];
        float gi = g[i];
        if (optim_decays(s, mask, i)) gi = __fmaf_rn(s.wd, pi, gi);
        float si = __fmaf_rn(__fmul_rn(s.adadelta.omrho, gi), gi, __fmul_rn(sq[i], s.adadelta.rho));
        sq[i] = si;
        float sd = __fsqrt_rn(__fadd_rn(si, s.adadelta.eps));
        float delta = __fmul_rn(__fdiv_rn(__fsqrt_rn(__fadd_rn(acc[i], s.adadelta.eps)), sd), gi);
        acc[i] = __fmaf_rn(__fmul_rn(s.adadelta.omrho, delta), delta, __fmul_rn(acc[i], s.adadelta.rho));
        p[i] = __fmaf_rn(s.neglr, delta, pi);
    }
}

/* the step's scalars in device memory (a captured step: optimizer.c), or NULL: by value */
static const rt_optim_scalars *sdev(const rt_optimizer *opt) {
    return opt->scalars_from_dev ? (const rt_optim_scalars *)opt->scalars_dev : NULL;
}

/* The launches: the state buffers in the row's order, one launch over the whole arena. */
static rt_status sgd_cuda(const rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                          const uint32_t *mask, rt_stream *stream) {
    size_t n = opt->n;
    if (n == 0) return RT_OK;
    float *buf = s->sgd.momentum ? opt->state[0] : NULL;
    sgd_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(params, grads, buf, n,
                                                                                               *s, sdev(opt), mask);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

static rt_status adam_cuda(const rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                           const uint32_t *mask, rt_stream *stream) {
    size_t n = opt->n;
    if (n == 0) return RT_OK;
    float *vmax = s->adam.amsgrad ? opt->state[2] : NULL;
    adam_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(
        params, grads, opt->state[0], opt->state[1], vmax, n, *s, sdev(opt), mask);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

static rt_status adadelta_cuda(const rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                               const uint32_t *mask, rt_stream *stream) {
    size_t n = opt->n;
    if (n == 0) return RT_OK;
    adadelta_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(
        params, grads, opt->state[0], opt->state[1], n, *s, sdev(opt), mask);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

/* The kind's kernel. A row cannot point at its launch function as it does at its CPU
 * loop: the rows are compiled without CUDA in the builds where tests/cuda_emu still runs
 * this file on the host. A new optimizer adds its case here (-Wswitch names a missing one). */
static rt_status cuda_kind_step(const rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                                const uint32_t *mask, rt_stream *stream) {
    switch (opt->cfg.kind) {
    case RT_OPTIM_SGD:
        return sgd_cuda(opt, params, grads, s, mask, stream);
    case RT_OPTIM_ADAM:
    case RT_OPTIM_ADAMW: /* s->adam.decoupled tells them apart */
        return adam_cuda(opt, params, grads, s, mask, stream);
    case RT_OPTIM_ADADELTA:
        return adadelta_cuda(opt, params, grads, s, mask, stream);
    case RT_OPTIM_KIND_COUNT_:
        break;
    }
    RT_FAIL(RT_ERR_INTERNAL, "optim: no CUDA kernel for optimizer %s", rt_optim_kind_name(opt->cfg.kind));
}

/* ---- gradient norm: fixed grid, fixed tree order => deterministic ---------------- */

static __device__ __forceinline__ double block_sum(double x, double *sh) {
    sh[threadIdx.x] = x;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    return sh[0];
}

static __global__ void sumsq_partial_kernel(const float *__restrict__ x, size_t n, double *__restrict__ partial) {
    __shared__ double sh[RT_OPTIM_THREADS];
    double acc = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = (double)x[i];
        acc = __fma_rn(v, v, acc);
    }
    double t = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
}

static __global__ void sumsq_final_kernel(const double *__restrict__ partial, unsigned count,
                                          double *__restrict__ out) {
    __shared__ double sh[RT_OPTIM_NORM_BLOCKS];
    double acc = threadIdx.x < count ? partial[threadIdx.x] : 0.0;
    double t = block_sum(acc, sh);
    if (threadIdx.x == 0) *out = t;
}

static rt_status sumsq_cuda(const float *x, size_t n, double *partial_dev, double *out_dev,
                                         rt_stream *stream) {
    cudaStream_t st = (cudaStream_t)rt_stream_native(stream);
    sumsq_partial_kernel<<<RT_OPTIM_NORM_BLOCKS, RT_OPTIM_THREADS, 0, st>>>(x, n, partial_dev);
    RT_CHECK_LAUNCH();
    sumsq_final_kernel<<<1, RT_OPTIM_NORM_BLOCKS, 0, st>>>(partial_dev, RT_OPTIM_NORM_BLOCKS, out_dev);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

static __global__ void scale_kernel(float *__restrict__ x, size_t n, float coef) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = __fmul_rn(x[i], coef);
}

static rt_status scale_cuda(float *x, size_t n, float coef, rt_stream *stream) {
    if (n == 0) return RT_OK;
    scale_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(x, n, coef);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

/* ---- the parameters' moving average ------------------------------------------------------ */

static __global__ void ema_kernel(float *__restrict__ avg, const float *__restrict__ p, size_t n, float decay,
                                  float omdecay, int first) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        avg[i] = first ? p[i] : __fadd_rn(__fmul_rn(avg[i], decay), __fmul_rn(p[i], omdecay));
}

static __global__ void ema_swap_kernel(float *__restrict__ avg, float *__restrict__ p, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float t = avg[i];
        avg[i] = p[i];
        p[i] = t;
    }
}

static rt_status cuda_ema(float *avg, const float *p, size_t n, float decay, float omdecay, int first,
                          rt_stream *stream) {
    if (n == 0) return RT_OK;
    ema_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(avg, p, n, decay,
                                                                                               omdecay, first);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

static rt_status cuda_ema_swap(float *avg, float *p, size_t n, rt_stream *stream) {
    if (n == 0) return RT_OK;
    ema_swap_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(avg, p, n);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

/* ---- the backend table ---------------------------------------------------------------- */

/* With excluded ranges: one bit per element (1 = weight decay applies), built on the host
 * and copied once; NULL (decay everywhere) without exclusions. */
static rt_status cuda_init(rt_optimizer *opt) {
    size_t nr = opt->cfg.n_no_decay;
    if (nr == 0) return RT_OK;
    size_t words = (opt->n + 31) / 32;
    uint32_t *mask = (uint32_t *)malloc(words * sizeof *mask);
    RT_CHECK_ALLOC(mask, words * sizeof *mask);
    memset(mask, 0xff, words * sizeof *mask);
    for (size_t r = 0; r < nr; r++)
        for (size_t i = opt->ranges[r].offset; i < opt->ranges[r].offset + opt->ranges[r].count; i++)
            mask[i >> 5] &= ~(1u << (i & 31));
    void *dev = NULL;
    rt_status st = rt_malloc(opt->device, words * sizeof(uint32_t), &dev);
    if (st == RT_OK) st = rt_memcpy(dev, opt->device, mask, rt_device_cpu(), words * sizeof *mask, NULL);
    free(mask);
    if (st != RT_OK) {
        rt_free(opt->device, dev);
        return st;
    }
    opt->backend_state = dev;
    return RT_OK;
}

static void cuda_release(rt_optimizer *opt) {
    rt_free(opt->device, opt->backend_state);
    opt->backend_state = NULL;
}

static rt_status cuda_step(rt_optimizer *opt, float *params, const float *grads, const rt_optim_scalars *s,
                           rt_stream *stream) {
    RT_CHECK(cuda_kind_step(opt, params, grads, s, (const uint32_t *)opt->backend_state, stream));
    return RT_OK;
}

/* scratch: RT_OPTIM_NORM_BLOCKS partial sums, then the total */
static rt_status cuda_clip_init(rt_grad_clip *c) {
    RT_CHECK(rt_malloc(c->device, (RT_OPTIM_NORM_BLOCKS + 1) * sizeof(double), &c->scratch));
    return RT_OK;
}

static void cuda_clip_release(rt_grad_clip *c) {
    rt_free(c->device, c->scratch);
    c->scratch = NULL;
}

static rt_status cuda_sumsq(rt_grad_clip *c, const float *x, size_t n, rt_stream *stream, double *sum) {
    double *partial = (double *)c->scratch, *total = partial + RT_OPTIM_NORM_BLOCKS;
    RT_CHECK(sumsq_cuda(x, n, partial, total, stream));
    RT_CHECK(rt_memcpy(sum, rt_device_cpu(), total, c->device, sizeof *sum, stream)); /* the caller syncs */
    return RT_OK;
}

static rt_status cuda_scale(rt_grad_clip *c, float *x, size_t n, float coef, rt_stream *stream) {
    (void)c;
    return scale_cuda(x, n, coef, stream);
}

/* positional: C++ has no designated initialisers before C++20 (the order of rt_optim_backend) */
extern "C" const rt_optim_backend rt_optim_backend_cuda = {
    "cuda",     cuda_init,  cuda_release, cuda_step, cuda_clip_init, cuda_clip_release, cuda_sumsq, cuda_scale,
    cuda_ema, cuda_ema_swap,
};
