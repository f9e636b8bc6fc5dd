/* The kernels of the convolutions in an NHWC activation format (conv_cuda.c; docs/gpu.md,
 * "Activation formats: convolutions"): the weight copies (all convolutions of a model in
 * one launch), dW back into the fp32 OIHW gradient (per convolution, or deferred: many
 * convolutions in one launch), the bias pieces, and the NCHW <-> NHWC conversions of the
 * fallback (a layer whose NHWC shape cuDNN refuses).
 *
 * Activations are fp32 or bf16 (`bf16` parameter: a void pointer's elements are uint16_t
 * then, else float); bf16 is rounded to nearest even once where it is stored (core/bf16.h's
 * rule), fp32 sums of bf16 are exact widenings added in double. No kernel is templated
 * (the emulated GPUs rewrite the launches): the dtype and the layout are int parameters.
 */
#include "core/bf16.h"
#include "model/cuda/act_cuda.h"
#include "model/cuda/cuda_internal.h"

#define THREADS RT_CUK_THREADS

/* Element j of a copy of one convolution's filter (out_c rows of x_c channels x taps),
 * KRSC (nhwc) or KCRS: its (row o, channel c, tap t). */
static __device__ __forceinline__ void copy_coords(size_t j, int x_c, int taps, int nhwc, size_t *o, int *c, int *t) {
    if (nhwc) {
        *c = (int)(j % (size_t)x_c);
        *t = (int)((j / (size_t)x_c) % (size_t)taps);
        *o = j / ((size_t)x_c * taps);
    } else {
        *t = (int)(j % (size_t)taps);
        *c = (int)((j / (size_t)taps) % (size_t)x_c);
        *o = j / ((size_t)x_c * taps);
    }
}

/* Every copy in one launch: block row blockIdx.y writes convolution blockIdx.y's copy from
 * its fp32 OIHW weights (wbase + src), channels in_c..x_c-1 zero. src_total and
 * copy_total (the sums over the table) are for the ledger only. */
static __global__ void convw_refresh_kernel(int nconvs, const rt_cuk_wcopy *table, const float *wbase, void *copies,
                                            int bf16, size_t src_total, size_t copy_total) {
    (void)src_total, (void)copy_total;
    if ((int)blockIdx.y >= nconvs) return;
    const rt_cuk_wcopy e = table[blockIdx.y];
    const size_t count = (size_t)e.out_c * e.x_c * e.taps;
    const float *w = wbase + e.src;
    GRID_STRIDE(j, count) {
        size_t o;
        int c, t;
        copy_coords(j, e.x_c, e.taps, e.nhwc, &o, &c, &t);
        const float v = c < e.in_c ? w[(o * e.in_c + c) * e.taps + t] : 0.0f;
        act_st(copies, bf16, e.dst + j, v);
    }
}

/* where element i of a (out_c, in_c, taps) gradient is in the copy's layout (x_c channels) */
static __device__ __forceinline__ size_t dw_at(size_t i, int in_c, int x_c, int taps, int nhwc) {
    const int t = (int)(i % (size_t)taps), c = (int)((i / (size_t)taps) % (size_t)in_c);
    const size_t o = i / ((size_t)taps * in_c);
    return nhwc ? (o * taps + t) * x_c + c : (o * x_c + c) * taps + t;
}

/* dw (out_c, in_c, taps) fp32 = the copy-layout gradient dwc (x_c channels; the padded
 * ones dropped), widened where bf16 */
static __global__ void convw_dw_kernel(size_t total, int in_c, int x_c, int taps, int nhwc, int bf16, const void *dwc,
                                       float *dw) {
    GRID_STRIDE(i, total) { dw[i] = act_ld(dwc, bf16, dw_at(i, in_c, x_c, taps, nhwc)); }
}

/* The same for the table's entries first..first+count-1 in one launch (the deferred dW of
 * a model block, rt_conv2d_weights_grads): block row blockIdx.y writes entry first +
 * blockIdx.y's gradient (gbase + gsrc) from its dW in the copy's layout (dws + dst).
 * grad_total (the elements written over the entries) is for the ledger only. */
static __global__ void convw_grads_kernel(int first, int count, const rt_cuk_wcopy *table, const void *dws,
                                          float *gbase, int bf16, size_t grad_total) {
    (void)grad_total;
    if ((int)blockIdx.y >= count) return;
    const rt_cuk_wcopy e = table[first + (int)blockIdx.y];
    float *dw = gbase + e.gsrc;
    GRID_STRIDE(i, (size_t)e.out_c * e.in_c * e.taps) {
        dw[i] = act_ld(dws, bf16, e.dst + dw_at(i, e.in_c, e.x_c, e.taps, e.nhwc));
    }
}

/* y (n images of c channels x plane, NHWC or NCHW) = b[channel], rounded where bf16 */
static __global__ void conv_bias_fill_kernel(size_t total, size_t plane, int c, int nhwc, int bf16, const float *b,
                                             void *y) {
    GRID_STRIDE(i, total) { act_st(y, bf16, i, b[nhwc ? i % (size_t)c : (i / plane) % (size_t)c]); }
}

/* db[ch] = sum of dy over the images and the plane, in double, rounded to fp32 once; one
 * thread per channel */
static __global__ void conv_bias_sums_kernel(int n, int c, size_t plane, int nhwc, int bf16, const void *dy,
                                             float *db) {
    GRID_STRIDE(ch, (size_t)c) {
        double acc = 0;
        for (size_t i = 0; i < (size_t)n * plane; i++) {
            const size_t img = i / plane, p = i % plane;
            acc += (double)act_ld(dy, bf16, nhwc ? i * c + ch : (img * c + ch) * plane + p);
        }
        db[ch] = (float)acc;
    }
}

/* y = x with the layout changed (images of c channels x plane): to_nhwc NCHW -> NHWC,
 * else NHWC -> NCHW; the same dtype both sides (the values move, nothing is rounded) */
static __global__ void act_relayout_kernel(size_t total, int c, size_t plane, int to_nhwc, int bf16, const void *x,
                                           void *y) {
    GRID_STRIDE(i, total) { /* i: the NCHW index */
        const size_t p = i % plane, img = i / (plane * c);
        const int ch = (int)((i / plane) % (size_t)c);
        const size_t h = (img * plane + p) * c + ch;
        if (bf16) {
            if (to_nhwc)
                ((uint16_t *)y)[h] = ((const uint16_t *)x)[i];
            else
                ((uint16_t *)y)[i] = ((const uint16_t *)x)[h];
        } else {
            if (to_nhwc)
                ((float *)y)[h] = ((const float *)x)[i];
            else
                ((float *)y)[i] = ((const float *)x)[h];
        }
    }
}

extern "C" cudaError_t rt_cuk_convw_refresh(cudaStream_t s, int nconvs, const rt_cuk_wcopy *table, const float *wbase,
                                            void *copies, bool bf16, size_t src_total, size_t copy_total,
                                            size_t largest) {
    if (nconvs <= 0) return cudaSuccess;
    const dim3 grid(grid_for(largest), (unsigned)nconvs);
    convw_refresh_kernel<<<grid, THREADS, 0, s>>>(nconvs, table, wbase, copies, bf16 ? 1 : 0, src_total, copy_total);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_convw_dw(cudaStream_t s, int out_c, int in_c, int x_c, int taps, bool nhwc, bool bf16,
                                       const void *dwc, float *dw) {
    const size_t total = (size_t)out_c * in_c * taps;
    convw_dw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, in_c, x_c, taps, nhwc ? 1 : 0, bf16 ? 1 : 0, dwc, dw);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_convw_grads(cudaStream_t s, int first, int count, const rt_cuk_wcopy *table,
                                          const void *dws, float *gbase, bool bf16, size_t grad_total, size_t largest) {
    if (count <= 0) return cudaSuccess;
    const dim3 grid(grid_for(largest), (unsigned)count);
    convw_grads_kernel<<<grid, THREADS, 0, s>>>(first, count, table, dws, gbase, bf16 ? 1 : 0, grad_total);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_conv_bias_fill(cudaStream_t s, int n, int c, size_t plane, bool nhwc, bool bf16,
                                             const float *b, void *y) {
    const size_t total = (size_t)n * c * plane;
    conv_bias_fill_kernel<<<grid_for(total), THREADS, 0, s>>>(total, plane, c, nhwc ? 1 : 0, bf16 ? 1 : 0, b, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_conv_bias_sums(cudaStream_t s, int n, int c, size_t plane, bool nhwc, bool bf16,
                                             const void *dy, float *db) {
    conv_bias_sums_kernel<<<grid_for((size_t)c), THREADS, 0, s>>>(n, c, plane, nhwc ? 1 : 0, bf16 ? 1 : 0, dy, db);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_act_relayout(cudaStream_t s, int n, int c, size_t plane, bool to_nhwc, bool bf16,
                                           const void *x, void *y) {
    const size_t total = (size_t)n * c * plane;
    act_relayout_kernel<<<grid_for(total), THREADS, 0, s>>>(total, c, plane, to_nhwc ? 1 : 0, bf16 ? 1 : 0, x, y);
    return cudaGetLastError();
}
