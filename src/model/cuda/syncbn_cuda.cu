/* Synchronised batch norm's kernels (syncbn_cuda.h): the CPU backend's arithmetic
 * (src/model/cpu/ops_cpu.c, bn_stats / bn_affine / bn_dfactors), split at the sums that
 * are all-reduced between the passes. A channel's sums are one block's, in double (the
 * CPU sums in double too); in NHWC a block per (group of adjacent channels, row tile), its
 * threads along the channels, the last block of a group adding the tiles' partials in order
 * (bn_nhwc_cuda.h: the layer's scratch, no floating-point atomics). The elementwise passes
 * read the per-channel factors. Every
 * launcher enqueues on `s` and returns cudaGetLastError(); none allocates or synchronises. */
#include "core/bf16.h"
#include "model/cuda/bn_nhwc_cuda.h"
#include "model/cuda/syncbn_cuda.h"

#include <math.h>

#define SB_THREADS 256

static unsigned sb_grid(size_t count) {
    size_t g = (count + SB_THREADS - 1) / SB_THREADS;
    if (g > ((size_t)1 << 20)) g = (size_t)1 << 20;
    return g ? (unsigned)g : 1u;
}

/* the block's two sums into a[0], b[0] */
static __device__ void sb_block_sum2(double *a, double *b) {
    __syncthreads();
    for (int w = SB_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            a[threadIdx.x] += a[threadIdx.x + w];
            b[threadIdx.x] += b[threadIdx.x + w];
        }
        __syncthreads();
    }
}

/* activations in the format's dtype (bf16 1: bf16 elements, round to nearest even when
 * stored; core/bf16.h) */
static __device__ __forceinline__ float sb_ld(const void *p, int bf16, size_t i) {
    if (!bf16) return ((const float *)p)[i];
    return rt_bf16_to_f32(((const uint16_t *)p)[i]);
}
static __device__ __forceinline__ void sb_st(void *p, int bf16, size_t i, float v) {
    if (bf16)
        ((uint16_t *)p)[i] = rt_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}
/* the layout, in one place: value j (in [0, n * plane)) of channel ch, and the channel of a
 * flat index; NCHW (n, c, plane) or (nhwc 1) NHWC (n, plane, c) */
static __device__ __forceinline__ size_t sb_at(int nhwc, int c, int plane, int ch, size_t j) {
    return nhwc ? j * (size_t)c + (size_t)ch : (j / plane * c + ch) * plane + j % plane;
}
static __device__ __forceinline__ int sb_channel_of(int nhwc, int c, int plane, size_t i) {
    return nhwc ? (int)(i % (size_t)c) : (int)(i / plane % c);
}

static __device__ float sb_grad(const void *dy, const void *act, int bf16, size_t i) {
    return act ? (sb_ld(act, bf16, i) > 0.0f ? sb_ld(dy, bf16, i) : 0.0f) : sb_ld(dy, bf16, i);
}

/* block c: sum x, sum x^2 over (n, plane) */
static __global__ void syncbn_stats_kernel(int n, int c, int plane, int bf16, int nhwc, const void *x, double *sums) {
    __shared__ double a[SB_THREADS], b[SB_THREADS];
    const int ch = blockIdx.x;
    const size_t m = (size_t)n * plane;
    double s = 0, ss = 0;
    for (size_t j = threadIdx.x; j < m; j += blockDim.x) {
        const double v = sb_ld(x, bf16, sb_at(nhwc, c, plane, ch, j));
        s += v;
        ss += v * v;
    }
    a[threadIdx.x] = s, b[threadIdx.x] = ss;
    sb_block_sum2(a, b);
    if (threadIdx.x == 0) {
        sums[ch] = a[0];
        sums[c + ch] = b[0];
        if (ch == 0) sums[2 * c] = (double)m;
    }
}

/* the same in NHWC (bn_nhwc_cuda.h): a block per (channel group, row tile) of `tiles` */
static __global__ void syncbn_stats_nhwc_kernel(int n, int c, int plane, int bf16, const void *x, double *partial,
                                                int *tickets, int tiles, double *sums) {
    __shared__ double a[BN_NHWC_THREADS], b[BN_NHWC_THREADS];
    __shared__ int last;
    const size_t m = (size_t)n * plane;
    const bn_tile T = bn_tile_of(c, m, tiles);
    double s = 0, ss = 0;
    for (size_t r = T.r0 + T.y; r < T.r1; r += T.rl) {
        const double v = sb_ld(x, bf16, r * (size_t)c + (size_t)T.ch);
        s += v;
        ss += v * v;
    }
    if (!bn_tile_done(T, &s, &ss, a, b, &last, partial, tickets)) return;
    sums[T.ch] = s;
    sums[c + T.ch] = ss;
    if (T.ch == 0) sums[2 * c] = (double)m;
}

static __global__ void syncbn_finish_kernel(int c, float eps, float momentum, const double *sums, float *save_mean,
                                            float *save_invstd, float *rm, float *rv, int64_t *tracked) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch == 0) *tracked += 1;
    if (ch >= c) return;
    const double m = sums[2 * c], mean = sums[ch] / m;
    double var = sums[c + ch] / m - mean * mean;
    if (var < 0) var = 0;
    save_mean[ch] = (float)mean;
    save_invstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
    const double mo = momentum;
    rm[ch] = (float)((1.0 - mo) * rm[ch] + mo * mean);
    rv[ch] = (float)((1.0 - mo) * rv[ch] + mo * var * m / (m - 1.0));
}

static __global__ void syncbn_apply_kernel(size_t count, int c, int plane, int bf16, int nhwc, const void *x,
                                           const void *r, const float *mean, const float *invstd, const float *gamma,
                                           const float *beta, void *y, int relu) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const int ch = sb_channel_of(nhwc, c, plane, i);
        const double k = (double)gamma[ch] * invstd[ch];
        const float a = (float)k, b = (float)(beta[ch] - (double)mean[ch] * k);
        float v = sb_ld(x, bf16, i) * a + b;
        if (r) v += sb_ld(r, bf16, i);
        sb_st(y, bf16, i, relu && !(v > 0.0f) ? 0.0f : v);
    }
}

/* block c: sum g, sum g (x - mean); this rank's dweight, dbias */
static __global__ void syncbn_dsums_kernel(int n, int c, int plane, int bf16, int nhwc, const void *x, const void *act,
                                           const void *dy, const float *mean, const float *invstd, double *sums,
                                           float *dweight, float *dbias) {
    __shared__ double a[SB_THREADS], b[SB_THREADS];
    const int ch = blockIdx.x;
    const size_t m = (size_t)n * plane;
    const float mu = mean[ch];
    double s = 0, sx = 0;
    for (size_t j = threadIdx.x; j < m; j += blockDim.x) {
        const size_t i = sb_at(nhwc, c, plane, ch, j);
        const float g = sb_grad(dy, act, bf16, i);
        s += g;
        sx += (double)g * (sb_ld(x, bf16, i) - mu);
    }
    a[threadIdx.x] = s, b[threadIdx.x] = sx;
    sb_block_sum2(a, b);
    if (threadIdx.x == 0) {
        sums[ch] = a[0];
        sums[c + ch] = b[0];
        dweight[ch] = (float)(b[0] * invstd[ch]);
        dbias[ch] = (float)a[0];
        if (ch == 0) sums[2 * c] = (double)m;
    }
}

/* the same in NHWC (bn_nhwc_cuda.h): a block per (channel group, row tile) of `tiles` */
static __global__ void syncbn_dsums_nhwc_kernel(int n, int c, int plane, int bf16, const void *x, const void *act,
                                                const void *dy, const float *mean, const float *invstd, double *partial,
                                                int *tickets, int tiles, double *sums, float *dweight, float *dbias) {
    __shared__ double a[BN_NHWC_THREADS], b[BN_NHWC_THREADS];
    __shared__ int last;
    const size_t m = (size_t)n * plane;
    const bn_tile T = bn_tile_of(c, m, tiles);
    const float mu = T.ch < c ? mean[T.ch] : 0.0f;
    double s = 0, sx = 0;
    for (size_t r = T.r0 + T.y; r < T.r1; r += T.rl) {
        const size_t i = r * (size_t)c + (size_t)T.ch;
        const float g = sb_grad(dy, act, bf16, i);
        s += g;
        sx += (double)g * (sb_ld(x, bf16, i) - mu);
    }
    if (!bn_tile_done(T, &s, &sx, a, b, &last, partial, tickets)) return;
    sums[T.ch] = s;
    sums[c + T.ch] = sx;
    dweight[T.ch] = (float)(sx * invstd[T.ch]);
    dbias[T.ch] = (float)s;
    if (T.ch == 0) sums[2 * c] = (double)m;
}

static __global__ void syncbn_dx_kernel(size_t count, int c, int plane, int bf16, int nhwc, const void *x,
                                        const void *act, const void *dy, const float *mean, const float *invstd,
                                        const float *gamma, const double *sums, void *dx, int accumulate) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const int ch = sb_channel_of(nhwc, c, plane, i);
        const double m = sums[2 * c], is = invstd[ch];
        const float k = (float)(gamma[ch] * is), mdy = (float)(sums[ch] / m);
        const float q = (float)is * (float)(sums[c + ch] * is / m);
        const float v = k * (sb_grad(dy, act, bf16, i) - mdy - (sb_ld(x, bf16, i) - mean[ch]) * q);
        sb_st(dx, bf16, i, accumulate ? sb_ld(dx, bf16, i) + v : v);
    }
}

static int sb_bf16(rt_act_format f) { return f.dtype == RT_BF16 ? 1 : 0; }
static int sb_nhwc(rt_act_format f) { return f.layout == RT_ACT_NHWC ? 1 : 0; }

/* NHWC's grid: (channel group, row tile) */
static dim3 sb_nhwc_grid(int c, int tiles) { return dim3((unsigned)bn_nhwc_groups(c), (unsigned)tiles); }

extern "C" cudaError_t rt_cuk_syncbn_stats(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                           double *partial, int *tickets, double *sums) {
    const int tiles = bn_nhwc_tiles(c, (size_t)n * plane);
    if (sb_nhwc(f))
        syncbn_stats_nhwc_kernel<<<sb_nhwc_grid(c, tiles), BN_NHWC_THREADS, 0, s>>>(n, c, plane, sb_bf16(f), x, partial,
                                                                                    tickets, tiles, sums);
    else
        syncbn_stats_kernel<<<c, SB_THREADS, 0, s>>>(n, c, plane, sb_bf16(f), sb_nhwc(f), x, sums);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_syncbn_finish(cudaStream_t s, int c, float eps, float momentum, const double *sums,
                                            float *save_mean, float *save_invstd, float *running_mean,
                                            float *running_var, int64_t *tracked) {
    syncbn_finish_kernel<<<sb_grid((size_t)c), SB_THREADS, 0, s>>>(c, eps, momentum, sums, save_mean, save_invstd,
                                                                   running_mean, running_var, tracked);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_syncbn_apply(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                           const void *residual, const float *mean, const float *invstd,
                                           const float *gamma, const float *beta, void *y, bool relu) {
    const size_t count = (size_t)n * c * plane;
    syncbn_apply_kernel<<<sb_grid(count), SB_THREADS, 0, s>>>(count, c, plane, sb_bf16(f), sb_nhwc(f), x, residual,
                                                              mean, invstd, gamma, beta, y, relu ? 1 : 0);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_syncbn_dsums(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                           const void *act, const void *dy, const float *mean, const float *invstd,
                                           double *partial, int *tickets, double *sums, float *dweight, float *dbias) {
    const int tiles = bn_nhwc_tiles(c, (size_t)n * plane);
    if (sb_nhwc(f))
        syncbn_dsums_nhwc_kernel<<<sb_nhwc_grid(c, tiles), BN_NHWC_THREADS, 0, s>>>(
            n, c, plane, sb_bf16(f), x, act, dy, mean, invstd, partial, tickets, tiles, sums, dweight, dbias);
    else
        syncbn_dsums_kernel<<<c, SB_THREADS, 0, s>>>(n, c, plane, sb_bf16(f), sb_nhwc(f), x, act, dy, mean, invstd,
                                                     sums, dweight, dbias);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_syncbn_dx(cudaStream_t s, rt_act_format f, int n, int c, int plane, const void *x,
                                        const void *act, const void *dy, const float *mean, const float *invstd,
                                        const float *gamma, const double *sums, void *dx, bool accumulate) {
    const size_t count = (size_t)n * c * plane;
    syncbn_dx_kernel<<<sb_grid(count), SB_THREADS, 0, s>>>(count, c, plane, sb_bf16(f), sb_nhwc(f), x, act, dy, mean,
                                                           invstd, gamma, sums, dx, accumulate ? 1 : 0);
    return cudaGetLastError();
}
