/* CUDA optimizer kernels: one fused kernel per optimizer over the whole arena (one
 * launch per step, however many tensors), the deterministic sum-of-squares reduction
 * for gradient clipping, and the scaling.
 *
 * The arithmetic is the CPU loops' (cpu/optim_cpu.c) with explicit IEEE rounding
 * intrinsics (__fmaf_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn, ...) so nvcc cannot contract
 * or approximate anything: the GPU result equals the CPU result bit for bit. Weight
 * decay exclusions come as a bit mask (one bit per element, 1/32 of the arena).
 */
#include "core/cuda/cuda_check.h"
#include "core/device.h"
#include "optim/optim_kernels.h"

#define RT_OPTIM_THREADS 256

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
                                  const rt_optim_scalars s, const uint32_t *__restrict__ mask) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i];
        float d = g[i];
        if (optim_decays(s, mask, i)) d = __fmaf_rn(s.wd, pi, d);
        if (s.momentum) {
            float b = s.first ? d : __fmaf_rn(s.damp1, d, __fmul_rn(buf[i], s.mom));
            buf[i] = b;
            d = s.nesterov ? __fmaf_rn(s.mom, b, d) : b;
        }
        p[i] = __fmaf_rn(s.neglr, d, pi);
    }
}

static __global__ void adam_kernel(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                                   float *__restrict__ v, float *__restrict__ vmax, size_t n, const rt_optim_scalars s,
                                   const uint32_t *__restrict__ mask) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float pi = p[i];
        float gi = g[i];
        if (optim_decays(s, mask, i)) {
            if (s.decoupled)
                pi = __fmul_rn(pi, s.decay_mul);
            else
                gi = __fmaf_rn(s.wd, pi, gi);
        }
        float mi = __fmaf_rn(s.omb1, gi, __fmul_rn(m[i], s.b1));
        float vi = __fmaf_rn(__fmul_rn(s.omb2, gi), gi, __fmul_rn(v[i], s.b2));
        m[i] = mi;
        v[i] = vi;
        float vh = vi;
        if (s.amsgrad) {
            float a = vmax[i];
            vh = a >= vi ? a : vi;
            vmax[i] = vh;
        }
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vh), s.bc2s), s.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.negss, mi), denom));
    }
}

extern "C" rt_status rt_optim_sgd_cuda(float *params, const float *grads, float *buf, size_t n,
                                       const rt_optim_scalars *s, const uint32_t *decay_mask, rt_stream *stream) {
    if (n == 0) return RT_OK;
    sgd_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(params, grads, buf, n,
                                                                                               *s, decay_mask);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

extern "C" rt_status rt_optim_adam_cuda(float *params, const float *grads, float *m, float *v, float *vmax, size_t n,
                                        const rt_optim_scalars *s, const uint32_t *decay_mask, rt_stream *stream) {
    if (n == 0) return RT_OK;
    adam_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(
        params, grads, m, v, vmax, n, *s, decay_mask);
    RT_CHECK_LAUNCH();
    return RT_OK;
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

extern "C" rt_status rt_optim_sumsq_cuda(const float *x, size_t n, double *partial_dev, double *out_dev,
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

extern "C" rt_status rt_optim_scale_cuda(float *x, size_t n, float coef, rt_stream *stream) {
    if (n == 0) return RT_OK;
    scale_kernel<<<optim_grid(n), RT_OPTIM_THREADS, 0, (cudaStream_t)rt_stream_native(stream)>>>(x, n, coef);
    RT_CHECK_LAUNCH();
    return RT_OK;
}
