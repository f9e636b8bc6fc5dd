/* The CUDA kernels of the model backend: what cuDNN and cuBLAS do not provide in the
 * form the CPU backend defines (src/model/cpu/ops_cpu.c).
 *
 * Batch norm fused with the residual add and ReLU (forward and backward, two passes
 * each way, deterministic), elementwise ops (relu, residual add, accumulate), max pooling with the CPU's tie rule
 * (padding -inf, the first maximum of a window gets the gradient, NaN wins), global
 * average pooling, the linear layer's bias broadcast and bias gradient, dropout with the
 * shared Philox stream (core/philox.h compiles for the device: the masks equal the CPU
 * backend's for the same counter), the BN step counter, the losses (softmax
 * cross-entropy, log-softmax, NLL), and for precision bf16 the fp32 <-> bf16 casts
 * (core/bf16.h's rounding) and bias pieces around the bf16 cuDNN / cuBLAS calls. Each kernel does the CPU loop's
 * arithmetic in the same order and precision (sums in double where the CPU sums in double), so these ops agree with the
 * CPU backend to the last bit or nearly; only the convolutions (cuDNN), batch norm (sums in double, in another order)
 * and the matrix products (cuBLAS) differ by rounding.
 *
 * Every launcher enqueues on the given stream and returns cudaGetLastError(); no
 * launcher allocates or synchronises.
 */
#include "core/philox.h"
#include "model/cuda/act_cuda.h"
#include "model/cuda/bn_nhwc_cuda.h"
#include "model/cuda/cuda_internal.h"

#include <math.h>
#include <string.h>

#define THREADS RT_CUK_THREADS
#define REDUCE_THREADS 256

/* fp32 -> bf16, round to nearest, ties to even; NaN stays a quiet NaN: core/bf16.h's
 * rt_bf16_from_f32, line for line (a copy from when that one was host-only; it is
 * __host__ __device__ now, which src/dist/cuda/bf16_cuda.cu uses, so this copy could go) */
static __device__ __forceinline__ uint16_t bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static __device__ __forceinline__ float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- activations in the context's format (model/ctx.h) ----------------------------------
 *
 * The kernels that read or write activations take the format at run time (int flags, not
 * templates: the emulated GPUs rewrite launches of plain kernels only): bf16 (1) or fp32
 * (0) elements, NCHW (0) or NHWC (1). They read the stored dtype, compute in fp32 (sums in
 * double where they were), and round ONCE where they store (act_st: round to nearest
 * even, core/bf16.h's rule). fp32 NCHW takes exactly the arithmetic it took before. */

/* index of (image * c + channel = ic, position p) in activations of c channels and `plane`
 * positions, in the layout */
static __device__ __forceinline__ size_t act_index(int nhwc, int c, size_t plane, size_t ic, size_t p) {
    if (!nhwc) return ic * plane + p;
    const size_t img = ic / (size_t)c;
    return (img * plane + p) * (size_t)c + (ic - img * (size_t)c);
}
/* the reverse: flat index i -> (image * c + channel, position) */
static __device__ __forceinline__ void act_split(int nhwc, int c, size_t plane, size_t i, size_t *ic, size_t *p) {
    if (!nhwc) {
        *ic = i / plane, *p = i - *ic * plane;
        return;
    }
    const size_t q = i / (size_t)c, ch = i - q * (size_t)c, img = q / plane;
    *p = q - img * plane, *ic = img * (size_t)c + ch;
}

/* ---- elementwise (layout-free: only the dtype matters) ---------------------------- */

static __global__ void relu_fw_kernel(size_t count, int bf16, const void *x, void *y) {
    GRID_STRIDE(i, count) {
        float v = act_ld(x, bf16, i);
        act_st(y, bf16, i, v > 0.0f ? v : 0.0f);
    }
}

static __global__ void relu_bw_kernel(size_t count, int bf16, const void *y, const void *dy, void *dx) {
    GRID_STRIDE(i, count) { act_st(dx, bf16, i, act_ld(y, bf16, i) > 0.0f ? act_ld(dy, bf16, i) : 0.0f); }
}

static __global__ void add_kernel(size_t count, int bf16, const void *a, const void *b, void *y) {
    GRID_STRIDE(i, count) { act_st(y, bf16, i, __fadd_rn(act_ld(a, bf16, i), act_ld(b, bf16, i))); }
}

static __global__ void acc_kernel(size_t count, int bf16, const void *dy, void *dx) {
    GRID_STRIDE(i, count) { act_st(dx, bf16, i, __fadd_rn(act_ld(dx, bf16, i), act_ld(dy, bf16, i))); }
}

static int is_bf16(rt_dtype dt) { return dt == RT_BF16 ? 1 : 0; }

extern "C" cudaError_t rt_cuk_relu_forward(cudaStream_t s, rt_dtype dt, size_t count, const void *x, void *y) {
    if (count == 0) return cudaSuccess;
    relu_fw_kernel<<<grid_for(count), THREADS, 0, s>>>(count, is_bf16(dt), x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_relu_backward(cudaStream_t s, rt_dtype dt, size_t count, const void *y, const void *dy,
                                            void *dx) {
    if (count == 0) return cudaSuccess;
    relu_bw_kernel<<<grid_for(count), THREADS, 0, s>>>(count, is_bf16(dt), y, dy, dx);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_add(cudaStream_t s, rt_dtype dt, size_t count, const void *a, const void *b, void *y) {
    if (count == 0) return cudaSuccess;
    add_kernel<<<grid_for(count), THREADS, 0, s>>>(count, is_bf16(dt), a, b, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_accumulate(cudaStream_t s, rt_dtype dt, size_t count, const void *dy, void *dx) {
    if (count == 0) return cudaSuccess;
    acc_kernel<<<grid_for(count), THREADS, 0, s>>>(count, is_bf16(dt), dy, dx);
    return cudaGetLastError();
}

/* ---- conversions at the model's boundary: fp32 NCHW <-> the format ------------------- */

/* dst (n, stored_c, plane) in the format from src (n, c, plane) fp32 NCHW, channels c..
 * stored_c - 1 zero; one thread per stored element, writes in order */
static __global__ void act_from_nchw_kernel(size_t total, int c, int stored_c, size_t plane, int bf16, int nhwc,
                                            const float *src, void *dst) {
    GRID_STRIDE(i, total) {
        size_t ic, p;
        act_split(nhwc, stored_c, plane, i, &ic, &p);
        const size_t img = ic / (size_t)stored_c, ch = ic - img * (size_t)stored_c;
        act_st(dst, bf16, i, ch < (size_t)c ? src[(img * (size_t)c + ch) * plane + p] : 0.0f);
    }
}

/* dst (n, c, plane) fp32 NCHW from the first c of src's stored_c channels */
static __global__ void act_to_nchw_kernel(size_t total, int c, int stored_c, size_t plane, int bf16, int nhwc,
                                          const void *src, float *dst) {
    GRID_STRIDE(i, total) {
        const size_t ic = i / plane, p = i - ic * plane, img = ic / (size_t)c, ch = ic - img * (size_t)c;
        dst[i] = act_ld(src, bf16, act_index(nhwc, stored_c, plane, img * (size_t)stored_c + ch, p));
    }
}

static int is_nhwc(rt_act_format f) { return f.layout == RT_ACT_NHWC ? 1 : 0; }

extern "C" cudaError_t rt_cuk_act_from_nchw(cudaStream_t s, rt_act_format f, int n, int c, size_t plane, int stored_c,
                                            const float *src, void *dst) {
    const size_t total = (size_t)n * stored_c * plane;
    if (total == 0) return cudaSuccess;
    act_from_nchw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, c, stored_c, plane, is_bf16(f.dtype), is_nhwc(f),
                                                             src, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_act_to_nchw(cudaStream_t s, rt_act_format f, int n, int c, size_t plane, int stored_c,
                                          const void *src, float *dst) {
    const size_t total = (size_t)n * c * plane;
    if (total == 0) return cudaSuccess;
    act_to_nchw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, c, stored_c, plane, is_bf16(f.dtype), is_nhwc(f),
                                                           src, dst);
    return cudaGetLastError();
}

/* ---- max pooling ------------------------------------------------------------------- */

typedef rt_cuk_pool_geom pool_geom; /* cuda_internal.h: the emulated GPUs' cost table reads it too */

/* index into the input plane of the first maximum of window (oh, ow): the CPU's
 * window_argmax, line for line; the plane's position q is element base + q * ps of x */
static __device__ __forceinline__ int window_argmax(const pool_geom g, const void *x, size_t base, size_t ps, int oh,
                                                    int ow, float *best) {
    int h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    int arg = -1;
    float m = -INFINITY;
    for (int i = 0; i < g.k; i++) {
        int ih = h0 + i;
        if (ih < 0 || ih >= g.in_h) continue;
        for (int j = 0; j < g.k; j++) {
            int iw = w0 + j;
            if (iw < 0 || iw >= g.in_w) continue;
            float v = act_ld(x, g.bf16, base + (size_t)(ih * g.in_w + iw) * ps);
            if (arg < 0 || v > m || isnan(v)) {
                m = v;
                arg = ih * g.in_w + iw;
            }
        }
    }
    *best = m;
    return arg;
}

/* one thread per output element (in the layout's order); a bf16 maximum is one of the
 * inputs, stored exactly */
static __global__ void maxpool_fw_kernel(size_t total, const pool_geom g, const void *x, void *y) {
    const size_t out_plane = (size_t)g.out_h * g.out_w, in_plane = (size_t)g.in_h * g.in_w;
    const size_t ps = g.nhwc ? (size_t)g.c : 1;
    GRID_STRIDE(i, total) {
        size_t ic, q;
        act_split(g.nhwc, g.c, out_plane, i, &ic, &q);
        const int r = (int)q, oh = r / g.out_w, ow = r - oh * g.out_w;
        float m;
        (void)window_argmax(g, x, act_index(g.nhwc, g.c, in_plane, ic, 0), ps, oh, ow, &m);
        act_st(y, g.bf16, i, m);
    }
}

/* one thread per input element: gather dy from every window whose first maximum it
 * is, in the CPU's (oh, ow) order, so the sums are bit-identical (bf16: that fp32 sum
 * rounded once) */
static __global__ void maxpool_bw_kernel(size_t total, const pool_geom g, const void *x, const void *dy, void *dx) {
    const size_t out_plane = (size_t)g.out_h * g.out_w, in_plane = (size_t)g.in_h * g.in_w;
    const size_t ps = g.nhwc ? (size_t)g.c : 1;
    GRID_STRIDE(i, total) {
        size_t ic, q;
        act_split(g.nhwc, g.c, in_plane, i, &ic, &q);
        const int r = (int)q, ih = r / g.in_w, iw = r - ih * g.in_w;
        const size_t xb = act_index(g.nhwc, g.c, in_plane, ic, 0), db = act_index(g.nhwc, g.c, out_plane, ic, 0);
        /* windows with oh*s - pad <= ih <= oh*s - pad + k - 1 */
        int lo_h = ih + g.pad - g.k + 1, lo_w = iw + g.pad - g.k + 1;
        int oh0 = lo_h <= 0 ? 0 : (lo_h + g.stride - 1) / g.stride;
        int ow0 = lo_w <= 0 ? 0 : (lo_w + g.stride - 1) / g.stride;
        int oh1 = (ih + g.pad) / g.stride, ow1 = (iw + g.pad) / g.stride;
        if (oh1 > g.out_h - 1) oh1 = g.out_h - 1;
        if (ow1 > g.out_w - 1) ow1 = g.out_w - 1;
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++) {
                float m;
                if (window_argmax(g, x, xb, ps, oh, ow, &m) == r)
                    acc = __fadd_rn(acc, act_ld(dy, g.bf16, db + (size_t)(oh * g.out_w + ow) * ps));
            }
        act_st(dx, g.bf16, i, acc);
    }
}

static pool_geom geom_of(rt_act_format f, const rt_maxpool2d *l) {
    pool_geom g = {l->in_h, l->in_w, l->out_h, l->out_w, l->k, l->stride, l->pad, l->c, is_bf16(f.dtype), is_nhwc(f)};
    return g;
}

extern "C" cudaError_t rt_cuk_maxpool_forward(cudaStream_t s, rt_act_format f, const rt_maxpool2d *l, int n,
                                              const void *x, void *y) {
    size_t total = (size_t)n * l->c * l->out_h * l->out_w;
    if (total == 0) return cudaSuccess;
    maxpool_fw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, geom_of(f, l), x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_maxpool_backward(cudaStream_t s, rt_act_format f, const rt_maxpool2d *l, int n,
                                               const void *x, const void *dy, void *dx) {
    size_t total = (size_t)n * l->c * l->in_h * l->in_w;
    if (total == 0) return cudaSuccess;
    maxpool_bw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, geom_of(f, l), x, dy, dx);
    return cudaGetLastError();
}

/* ---- global average pooling: activations -> fp32 features (n, c) ------------------ */

static __global__ void avgpool_fw_kernel(size_t planes, int c, int hw, int bf16, int nhwc, const void *x, float *y) {
    GRID_STRIDE(i, planes) {
        const size_t b = act_index(nhwc, c, (size_t)hw, i, 0), ps = nhwc ? (size_t)c : 1;
        double acc = 0;
        for (int p = 0; p < hw; p++) acc += (double)act_ld(x, bf16, b + (size_t)p * ps);
        y[i] = (float)(acc / hw);
    }
}

static __global__ void avgpool_bw_kernel(size_t total, int c, int hw, int bf16, int nhwc, float inv, const float *dy,
                                         void *dx) {
    GRID_STRIDE(i, total) {
        size_t ic, p;
        act_split(nhwc, c, (size_t)hw, i, &ic, &p);
        act_st(dx, bf16, i, __fmul_rn(dy[ic], inv));
    }
}

extern "C" cudaError_t rt_cuk_avgpool_forward(cudaStream_t s, rt_act_format f, int n, int c, int hw, const void *x,
                                              float *y) {
    size_t planes = (size_t)n * c;
    avgpool_fw_kernel<<<grid_for(planes), THREADS, 0, s>>>(planes, c, hw, is_bf16(f.dtype), is_nhwc(f), x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_avgpool_backward(cudaStream_t s, rt_act_format f, int n, int c, int hw, const float *dy,
                                               void *dx) {
    size_t total = (size_t)n * c * hw;
    avgpool_bw_kernel<<<grid_for(total), THREADS, 0, s>>>(total, c, hw, is_bf16(f.dtype), is_nhwc(f),
                                                          1.0f / (float)hw, dy, dx);
    return cudaGetLastError();
}

/* ---- linear: bias broadcast and bias gradient ------------------------------------- */

static __global__ void bias_rows_kernel(size_t total, int out, const float *b, float *y) {
    GRID_STRIDE(i, total) { y[i] = b[i % (size_t)out]; }
}

static __global__ void column_sums_kernel(int n, int out, const float *dy, float *db) {
    GRID_STRIDE(o, (size_t)out) {
        double acc = 0;
        for (int i = 0; i < n; i++) acc += (double)dy[(size_t)i * out + o];
        db[o] = (float)acc;
    }
}

extern "C" cudaError_t rt_cuk_bias_rows(cudaStream_t s, int n, int out, const float *b, float *y) {
    size_t total = (size_t)n * out;
    bias_rows_kernel<<<grid_for(total), THREADS, 0, s>>>(total, out, b, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_column_sums(cudaStream_t s, int n, int out, const float *dy, float *db) {
    column_sums_kernel<<<grid_for((size_t)out), THREADS, 0, s>>>(n, out, dy, db);
    return cudaGetLastError();
}

/* ---- dropout ----------------------------------------------------------------------- */

static __global__ void dropout_mask_kernel(size_t draws, uint64_t seed, uint64_t subseq, uint64_t counter, float p,
                                           float scale, float *mask) {
    GRID_STRIDE(i, draws) {
        float u = rt_philox_uniform_at(seed, subseq, counter + i);
        mask[i] = u < p ? 0.0f : scale;
    }
}

/* y = x * mask[k / plane] for the element's index k in PyTorch's NCHW order (the mask's
 * order in every format: channelwise, one draw per (image, channel); else per element);
 * data of c channels and hw positions per image (features: c 1) */
static __global__ void dropout_apply_kernel(size_t count, size_t plane, int c, size_t hw, int bf16, int nhwc,
                                            const float *mask, const void *x, void *y) {
    GRID_STRIDE(j, count) {
        size_t ic, p;
        act_split(nhwc, c, hw, j, &ic, &p);
        act_st(y, bf16, j, __fmul_rn(act_ld(x, bf16, j), mask[(ic * hw + p) / plane]));
    }
}

static void dropout_apply(cudaStream_t s, rt_act_format f, const rt_dropout *l, size_t count, const void *x, void *y) {
    const size_t hw = (size_t)l->features / (size_t)l->c;
    dropout_apply_kernel<<<grid_for(count), THREADS, 0, s>>>(count, (size_t)l->plane, l->c, hw, is_bf16(f.dtype),
                                                             is_nhwc(f), l->mask, x, y);
}

extern "C" cudaError_t rt_cuk_dropout_forward(cudaStream_t s, rt_act_format f, const rt_dropout *l, int n,
                                              const void *x, void *y) {
    const size_t count = (size_t)n * (size_t)l->features, plane = (size_t)l->plane;
    const size_t draws = count / plane;
    const float scale = 1.0f / (1.0f - l->p); /* the CPU's float expression */
    if (count == 0) return cudaSuccess;
    dropout_mask_kernel<<<grid_for(draws), THREADS, 0, s>>>(draws, l->seed, l->subseq, l->counter, l->p, scale,
                                                            l->mask);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dropout_apply(s, f, l, count, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_dropout_backward(cudaStream_t s, rt_act_format f, const rt_dropout *l, int n,
                                               const void *dy, void *dx) {
    const size_t count = (size_t)n * (size_t)l->features;
    if (count == 0) return cudaSuccess;
    dropout_apply(s, f, l, count, dy, dx);
    return cudaGetLastError();
}

/* ---- batch norm, fused with the residual add and the ReLU ------------------------------ */

/* Two passes over the activations each way, where cuDNN's spatial batch norm followed by
 * add_kernel and relu_fw_kernel took four to six (and relu_bw_kernel before cuDNN's
 * backward two more):
 *   training forward  bn_stats_kernel: ONE read of x, the per-channel sum and sum of
 *                     squares; the last block of each channel turns them into the batch
 *                     statistics (save_mean, save_invstd), the running statistics
 *                     (unbiased variance, momentum), the channel's scale and shift, and
 *                     (channel 0) num_batches_tracked += 1, all on the device;
 *                     bn_apply_kernel: ONE pass y = relu?(x * a + b + residual?)
 *   evaluation        bn_eval_factors_kernel (one thread per channel) + bn_apply_kernel
 *   backward          bn_dsums_kernel: ONE read of x, dy (and act), g = act > 0 ? dy : 0:
 *                     the per-channel sum g and sum g * (x - mean); the last block of a
 *                     channel writes dweight, dbias and the channel's dx factors;
 *                     bn_dx_kernel: ONE pass dx (=, or += when accumulating)
 *                     k * (g - mean(g) - (x - mean) * q)
 * Deterministic: each channel's reduction is split into rt_cuk_bn_splits(n, plane) slices
 * (a function of the shape alone), thread t of a slice's block sums its fixed elements in
 * double, the block adds its threads in a fixed shared-memory tree and stores its partial;
 * an integer atomicAdd on the channel's ticket only says which block is the last to finish,
 * and that block adds the slices' partials in slice order. No floating-point atomics: the
 * same bits on every run (train.deterministic's bitwise resume holds on a GPU).
 * Numerics (the CPU backend's formulas, ops_cpu.c bn_stats / bn_dfactors): sums in double
 * (relative error of the variance about m * 2^-53 * (1 + mean^2 / var) for m values per
 * channel: below 1e-9 at m = 2^20 unless |mean| > 100 std), the variance ss/m - mean^2
 * clamped at 0, 1/sqrt in double, then fp32 for the elementwise pass (one fma, the add and
 * the select: within 2 ulp of the CPU's y).
 * No allocation or host value that changes between steps: the scratch (partials, factors,
 * tickets) is the layer's, allocated when it is prepared; a ticket returns to 0 at the end
 * of every launch, so a captured graph replays it. */
#define BN_THREADS 256
#define BN_CHUNK ((size_t)8192) /* at least this many values of a channel per block */
#define BN_MAX_SPLITS 64

typedef rt_cuk_bn_shape bn_shape;

/* where value j (in [0, n * plane)) of channel c lies in NCHW (n, c, plane): the
 * per-channel reductions' layout (NHWC's reduce along rows: bn_nhwc_cuda.h); and the
 * channel of a flat index, NCHW or NHWC (n, plane, c) */
static __device__ __forceinline__ size_t bn_at(const bn_shape s, int c, size_t j) {
    const size_t i = j / s.plane;
    return (i * (size_t)s.c + (size_t)c) * s.plane + (j - i * s.plane);
}
static __device__ __forceinline__ int bn_channel_of(const bn_shape s, size_t idx) {
    if (s.nhwc) return (int)(idx % (size_t)s.c);
    return (int)((idx / s.plane) % (size_t)s.c);
}
static __host__ __device__ __forceinline__ size_t bn_count(const bn_shape s) {
    return (size_t)s.n * (size_t)s.c * s.plane;
}

/* this block's slice [*j0, *j1) of its channel's n * plane values */
static __device__ __forceinline__ void bn_slice(const bn_shape s, size_t *j0, size_t *j1) {
    const size_t m = (size_t)s.n * s.plane, per = (m + s.splits - 1) / s.splits;
    *j0 = (size_t)blockIdx.y * per;
    *j1 = *j0 + per < m ? *j0 + per : m;
}

/* the block's two sums (a fixed tree), in thread 0's *a, *b */
static __device__ void bn_block_sums(double *a, double *b, double *sa, double *sb) {
    const unsigned t = threadIdx.x;
    sa[t] = *a, sb[t] = *b;
    __syncthreads();
    for (unsigned h = BN_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) sa[t] += sa[t + h], sb[t] += sb[t + h];
        __syncthreads();
    }
    *a = sa[0], *b = sb[0];
}

/* thread 0: store the block's partial; true in the last block of the channel to finish,
 * with the channel's sums (the partials in slice order) in *a, *b */
static __device__ bool bn_channel_done(double *a, double *b, double *partial, int *tickets, int c, int splits) {
    double *p = partial + 2 * (size_t)c * splits;
    p[2 * blockIdx.y] = *a, p[2 * blockIdx.y + 1] = *b;
    __threadfence();
    if (atomicAdd(&tickets[c], 1) != splits - 1) return false;
    tickets[c] = 0; /* for the next launch */
    __threadfence();
    const volatile double *q = p;
    double s1 = 0, s2 = 0;
    for (int k = 0; k < splits; k++) s1 += q[2 * k], s2 += q[2 * k + 1];
    *a = s1, *b = s2;
    return true;
}

/* channel c's scale and shift, y = x * a + b (the CPU's bn_affine) */
static __device__ void bn_set_affine(float *factors, int c, float gamma, float beta, double mean, double invstd) {
    factors[2 * c] = (float)(gamma * invstd);
    factors[2 * c + 1] = (float)(beta - mean * gamma * invstd);
}

/* the last block of channel c, with the channel's sum and sum of squares: the batch and
 * running statistics, the scale and shift, and (channel 0) the step counter */
static __device__ void bn_stats_finish(const bn_shape s, int c, double s1, double s2, const float *weight,
                                       const float *bias, float *running_mean, float *running_var, float *save_mean,
                                       float *save_invstd, int64_t *nbt, float *factors, float momentum, float eps) {
    const double m = (double)s.n * (double)s.plane, mean = s1 / m, mo = momentum;
    double var = s2 / m - mean * mean;
    if (var < 0) var = 0;
    const double invstd = 1.0 / sqrt(var + (double)eps);
    save_mean[c] = (float)mean;
    save_invstd[c] = (float)invstd;
    running_mean[c] = (float)((1.0 - mo) * running_mean[c] + mo * mean);
    running_var[c] = (float)((1.0 - mo) * running_var[c] + mo * var * m / (m - 1.0)); /* unbiased */
    bn_set_affine(factors, c, weight[c], bias[c], mean, invstd);
    if (c == 0) *nbt += 1;
}

static __global__ void bn_stats_kernel(const bn_shape s, const void *x, double *partial, int *tickets,
                                       const float *weight, const float *bias, float *running_mean, float *running_var,
                                       float *save_mean, float *save_invstd, int64_t *nbt, float *factors,
                                       float momentum, float eps) {
    __shared__ double sa[BN_THREADS], sb[BN_THREADS];
    const int c = blockIdx.x;
    double s1 = 0, s2 = 0;
    size_t j0, j1;
    bn_slice(s, &j0, &j1);
    for (size_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const double v = (double)act_ld(x, s.bf16, bn_at(s, c, j));
        s1 += v;
        s2 = __fma_rn(v, v, s2);
    }
    bn_block_sums(&s1, &s2, sa, sb);
    if (threadIdx.x != 0 || !bn_channel_done(&s1, &s2, partial, tickets, c, s.splits)) return;
    bn_stats_finish(s, c, s1, s2, weight, bias, running_mean, running_var, save_mean, save_invstd, nbt, factors,
                    momentum, eps);
}

/* the same in NHWC, threads along the channels (bn_nhwc_cuda.h): a block per (channel
 * group, row tile), s.splits tiles */
static __global__ void bn_stats_nhwc_kernel(const bn_shape s, const void *x, double *partial, int *tickets,
                                            const float *weight, const float *bias, float *running_mean,
                                            float *running_var, float *save_mean, float *save_invstd, int64_t *nbt,
                                            float *factors, float momentum, float eps) {
    __shared__ double sa[BN_NHWC_THREADS], sb[BN_NHWC_THREADS];
    __shared__ int last;
    const bn_tile T = bn_tile_of(s.c, (size_t)s.n * s.plane, s.splits);
    double s1 = 0, s2 = 0;
    for (size_t r = T.r0 + T.y; r < T.r1; r += T.rl) {
        const double v = (double)act_ld(x, s.bf16, r * (size_t)s.c + (size_t)T.ch);
        s1 += v;
        s2 = __fma_rn(v, v, s2);
    }
    if (!bn_tile_done(T, &s1, &s2, sa, sb, &last, partial, tickets)) return;
    bn_stats_finish(s, T.ch, s1, s2, weight, bias, running_mean, running_var, save_mean, save_invstd, nbt, factors,
                    momentum, eps);
}

static __global__ void bn_eval_factors_kernel(int c, const float *weight, const float *bias, const float *running_mean,
                                              const float *running_var, float eps, float *factors) {
    GRID_STRIDE(k, (size_t)c) {
        const double invstd = 1.0 / sqrt((double)running_var[k] + (double)eps);
        bn_set_affine(factors, (int)k, weight[k], bias[k], running_mean[k], invstd);
    }
}

static __global__ void bn_apply_kernel(const bn_shape s, const void *x, const void *res, const float *factors,
                                       void *y, int relu) {
    GRID_STRIDE(i, bn_count(s)) {
        const int c = bn_channel_of(s, i);
        float v = __fmaf_rn(act_ld(x, s.bf16, i), factors[2 * c], factors[2 * c + 1]);
        if (res) v = __fadd_rn(v, act_ld(res, s.bf16, i));
        act_st(y, s.bf16, i, relu ? (v > 0.0f ? v : 0.0f) : v);
    }
}

/* the gradient through the ReLU whose output was act (none: act NULL) */
static __device__ __forceinline__ float bn_relu_grad(const bn_shape s, const void *act, const void *dy, size_t o) {
    return act && !(act_ld(act, s.bf16, o) > 0.0f) ? 0.0f : act_ld(dy, s.bf16, o);
}

/* keep, when not NULL, gets g (dy through the ReLU: exact in either dtype; it may be dy: each
 * element is read, then written, by the one thread that owns it) */
/* the last block of channel c, with the channel's sum g and sum g (x - mean): dweight,
 * dbias and the dx factors (the CPU's bn_dfactors: s2 * invstd = sum g * xhat) */
static __device__ void bn_dsums_finish(const bn_shape s, int c, double s1, double s2, const float *weight,
                                       const float *save_mean, const float *save_invstd, float *dweight, float *dbias,
                                       float *factors) {
    const double m = (double)s.n * (double)s.plane, invstd = save_invstd[c], sgx = s2 * invstd;
    dweight[c] = (float)sgx;
    dbias[c] = (float)s1;
    float *f = factors + 4 * (size_t)c;
    f[0] = (float)(weight[c] * invstd);
    f[1] = (float)(s1 / m);
    f[2] = save_mean[c];
    f[3] = __fmul_rn((float)invstd, (float)(sgx / m));
}

/* element o's share of the backward's sums (keep, when not NULL, gets g) */
static __device__ __forceinline__ void bn_dsums_add(const bn_shape s, const void *x, const void *act, const void *dy,
                                                    void *keep, double mean, size_t o, double *s1, double *s2) {
    const double g = bn_relu_grad(s, act, dy, o);
    if (keep) act_st(keep, s.bf16, o, (float)g);
    *s1 += g;
    *s2 = __fma_rn(g, (double)act_ld(x, s.bf16, o) - mean, *s2);
}

/* keep, when not NULL, gets g (dy through the ReLU: exact in either dtype; it may be dy: each
 * element is read, then written, by the one thread that owns it) */
static __global__ void bn_dsums_kernel(const bn_shape s, const void *x, const void *act, const void *dy,
                                       double *partial, int *tickets, const float *weight, const float *save_mean,
                                       const float *save_invstd, float *dweight, float *dbias, float *factors,
                                       void *keep) {
    __shared__ double sa[BN_THREADS], sb[BN_THREADS];
    const int c = blockIdx.x;
    const double mean = save_mean[c];
    double s1 = 0, s2 = 0;
    size_t j0, j1;
    bn_slice(s, &j0, &j1);
    for (size_t j = j0 + threadIdx.x; j < j1; j += blockDim.x)
        bn_dsums_add(s, x, act, dy, keep, mean, bn_at(s, c, j), &s1, &s2);
    bn_block_sums(&s1, &s2, sa, sb);
    if (threadIdx.x != 0 || !bn_channel_done(&s1, &s2, partial, tickets, c, s.splits)) return;
    bn_dsums_finish(s, c, s1, s2, weight, save_mean, save_invstd, dweight, dbias, factors);
}

/* the same in NHWC, threads along the channels (bn_nhwc_cuda.h); each element of keep is
 * written by the one lane that sums it */
static __global__ void bn_dsums_nhwc_kernel(const bn_shape s, const void *x, const void *act, const void *dy,
                                            double *partial, int *tickets, const float *weight, const float *save_mean,
                                            const float *save_invstd, float *dweight, float *dbias, float *factors,
                                            void *keep) {
    __shared__ double sa[BN_NHWC_THREADS], sb[BN_NHWC_THREADS];
    __shared__ int last;
    const bn_tile T = bn_tile_of(s.c, (size_t)s.n * s.plane, s.splits);
    const double mean = T.ch < s.c ? save_mean[T.ch] : 0.0;
    double s1 = 0, s2 = 0;
    for (size_t r = T.r0 + T.y; r < T.r1; r += T.rl)
        bn_dsums_add(s, x, act, dy, keep, mean, r * (size_t)s.c + (size_t)T.ch, &s1, &s2);
    if (!bn_tile_done(T, &s1, &s2, sa, sb, &last, partial, tickets)) return;
    bn_dsums_finish(s, T.ch, s1, s2, weight, save_mean, save_invstd, dweight, dbias, factors);
}

/* dx may be dy (each element is read before it is written, by the same thread) */
static __global__ void bn_dx_kernel(const bn_shape s, const void *x, const void *act, const void *dy,
                                    const float *factors, void *dx, int accumulate) {
    GRID_STRIDE(i, bn_count(s)) {
        const float *f = factors + 4 * (size_t)bn_channel_of(s, i);
        const float g = bn_relu_grad(s, act, dy, i);
        const float xi = act_ld(x, s.bf16, i);
        const float v = __fmul_rn(f[0], __fsub_rn(__fsub_rn(g, f[1]), __fmul_rn(__fsub_rn(xi, f[2]), f[3])));
        act_st(dx, s.bf16, i, accumulate ? __fadd_rn(act_ld(dx, s.bf16, i), v) : v);
    }
}

extern "C" int rt_cuk_bn_splits(int n, int c, size_t plane, bool nhwc) {
    if (nhwc) return bn_nhwc_tiles(c, (size_t)n * plane);
    const size_t k = ((size_t)n * plane + BN_CHUNK - 1) / BN_CHUNK;
    return k < 1 ? 1 : k > BN_MAX_SPLITS ? BN_MAX_SPLITS : (int)k;
}

/* the reductions' grid: (channel, slice) in NCHW, (channel group, row tile) in NHWC */
static dim3 bn_sums_grid(const bn_shape s) {
    return dim3((unsigned)(s.nhwc ? bn_nhwc_groups(s.c) : s.c), (unsigned)s.splits);
}

static void bn_stats(cudaStream_t st, const rt_cuk_bn_args *a, const bn_shape sh, const void *x) {
    if (sh.nhwc)
        bn_stats_nhwc_kernel<<<bn_sums_grid(sh), BN_NHWC_THREADS, 0, st>>>(
            sh, x, a->partial, a->tickets, a->weight, a->bias, a->running_mean, a->running_var, a->save_mean,
            a->save_invstd, a->num_batches_tracked, a->factors, a->momentum, a->eps);
    else
        bn_stats_kernel<<<bn_sums_grid(sh), BN_THREADS, 0, st>>>(
            sh, x, a->partial, a->tickets, a->weight, a->bias, a->running_mean, a->running_var, a->save_mean,
            a->save_invstd, a->num_batches_tracked, a->factors, a->momentum, a->eps);
}

extern "C" cudaError_t rt_cuk_bn_forward(cudaStream_t st, const rt_cuk_bn_args *a, rt_cuk_bn_shape sh, const void *x,
                                         const void *residual, void *y, bool training, bool relu) {
    sh.splits = rt_cuk_bn_splits(sh.n, sh.c, sh.plane, sh.nhwc != 0);
    if (bn_count(sh) == 0) return cudaSuccess;
    if (training)
        bn_stats(st, a, sh, x);
    else
        bn_eval_factors_kernel<<<grid_for((size_t)sh.c), THREADS, 0, st>>>(sh.c, a->weight, a->bias, a->running_mean,
                                                                           a->running_var, a->eps, a->factors);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    bn_apply_kernel<<<grid_for(bn_count(sh)), THREADS, 0, st>>>(sh, x, residual, a->factors, y, relu ? 1 : 0);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_bn_backward(cudaStream_t st, const rt_cuk_bn_args *a, rt_cuk_bn_shape sh, const void *x,
                                          const void *act, const void *dy, void *dx, bool accumulate, void *keep) {
    sh.splits = rt_cuk_bn_splits(sh.n, sh.c, sh.plane, sh.nhwc != 0);
    if (bn_count(sh) == 0) return cudaSuccess;
    if (sh.nhwc)
        bn_dsums_nhwc_kernel<<<bn_sums_grid(sh), BN_NHWC_THREADS, 0, st>>>(sh, x, act, dy, a->partial, a->tickets,
                                                                           a->weight, a->save_mean, a->save_invstd,
                                                                           a->dweight, a->dbias, a->factors, keep);
    else
        bn_dsums_kernel<<<bn_sums_grid(sh), BN_THREADS, 0, st>>>(sh, x, act, dy, a->partial, a->tickets, a->weight,
                                                                 a->save_mean, a->save_invstd, a->dweight, a->dbias,
                                                                 a->factors, keep);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    /* with keep, the dx pass reads g (kept) instead of dy and act: one read fewer */
    bn_dx_kernel<<<grid_for(bn_count(sh)), THREADS, 0, st>>>(sh, x, keep ? NULL : act, keep ? keep : dy, a->factors, dx,
                                                              accumulate ? 1 : 0);
    return cudaGetLastError();
}

/* ---- batch-norm step counter ------------------------------------------------------- */

static __global__ void increment_i64_kernel(int64_t *c) { *c += 1; }

extern "C" cudaError_t rt_cuk_increment_i64(cudaStream_t s, int64_t *counter) {
    increment_i64_kernel<<<1, 1, 0, s>>>(counter);
    return cudaGetLastError();
}

/* ---- precision bf16: casts and the bias pieces around cuDNN / cuBLAS ---------------- */

static __global__ void to_bf16_kernel(size_t count, const float *x, uint16_t *y) {
    GRID_STRIDE(i, count) { y[i] = bf16_from_f32(x[i]); }
}

static __global__ void from_bf16_kernel(size_t count, const uint16_t *x, float *y, int accumulate) {
    GRID_STRIDE(i, count) { y[i] = accumulate ? __fadd_rn(y[i], bf16_to_f32(x[i])) : bf16_to_f32(x[i]); }
}

static __global__ void round_bf16_kernel(size_t count, float *y) {
    GRID_STRIDE(i, count) { y[i] = bf16_to_f32(bf16_from_f32(y[i])); }
}

/* y (n, c, plane) bf16 = round(b[channel]); nhwc: y (n, plane, c) */
static __global__ void bf16_fill_channels_kernel(size_t total, size_t plane, int c, int nhwc, const float *b,
                                                 uint16_t *y) {
    GRID_STRIDE(i, total) { y[i] = bf16_from_f32(b[nhwc ? i % (size_t)c : (i / plane) % (size_t)c]); }
}

/* db[ch] = sum over images and the plane of dy (bf16), accumulated in double as the bias
 * gradients above and rounded to fp32 once (the CPU sums in fp32: the two agree to fp32
 * rounding of the sum, within test_gpu_bf16's bound); one thread per channel */
static __global__ void bf16_channel_sums_kernel(int n, int c, size_t plane, int nhwc, const uint16_t *dy, float *db) {
    GRID_STRIDE(ch, (size_t)c) {
        double acc = 0;
        for (int i = 0; i < n; i++) {
            if (nhwc) { /* (n, plane, c) */
                const uint16_t *p = dy + (size_t)i * plane * c + ch;
                for (size_t j = 0; j < plane; j++) acc += (double)bf16_to_f32(p[j * (size_t)c]);
            } else {
                const uint16_t *p = dy + ((size_t)i * c + ch) * plane;
                for (size_t j = 0; j < plane; j++) acc += (double)bf16_to_f32(p[j]);
            }
        }
        db[ch] = (float)acc;
    }
}

extern "C" cudaError_t rt_cuk_to_bf16(cudaStream_t s, size_t count, const float *x, uint16_t *y) {
    if (count == 0) return cudaSuccess;
    to_bf16_kernel<<<grid_for(count), THREADS, 0, s>>>(count, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_from_bf16(cudaStream_t s, size_t count, const uint16_t *x, float *y, bool accumulate) {
    if (count == 0) return cudaSuccess;
    from_bf16_kernel<<<grid_for(count), THREADS, 0, s>>>(count, x, y, accumulate ? 1 : 0);
    return cudaGetLastError();
}

/* The batched casts take each array as a parameter of its own (not in a struct): a launch
 * passes pointer parameters as they are, and the emulated GPUs (tests/cuda_emu) translate
 * only those. Element i of the concatenation of arrays 0, 1, 2 of n0, n1, n2 elements
 * (empty ones skipped): array *k, index *j. */
static __device__ __forceinline__ void set_index(size_t i, size_t n0, size_t n1, int *k, size_t *j) {
    if (i < n0) {
        *k = 0, *j = i;
    } else if (i - n0 < n1) {
        *k = 1, *j = i - n0;
    } else {
        *k = 2, *j = i - n0 - n1;
    }
}

/* The layout changes of the sets, as the element of the source that output element j
 * takes (c == 0: j itself). to NHWC: output (image, position, channel) from input
 * (image, channel, position); to NCHW the reverse. Writes go in order (coalesced), reads
 * gather. */
static __device__ __forceinline__ size_t nhwc_source(size_t j, int c, size_t plane) {
    if (c == 0) return j;
    const size_t img = (size_t)c * plane;
    if (j <= 0xffffffffu &&
        img <= 0xffffffffu) { /* 32-bit divisions (a 64-bit one is a long software sequence on a GPU) */
        const unsigned jj = (unsigned)j, im = (unsigned)img, cc = (unsigned)c, i = jj / im, r = jj - i * im;
        const unsigned q = r / cc;
        return (size_t)i * img + (size_t)(r - q * cc) * plane + q;
    }
    const size_t i = j / img, r = j % img;
    return i * img + (r % (size_t)c) * plane + r / (size_t)c;
}
static __device__ __forceinline__ size_t nchw_source(size_t j, int c, size_t plane) {
    if (c == 0) return j;
    const size_t img = (size_t)c * plane;
    if (j <= 0xffffffffu && img <= 0xffffffffu) {
        const unsigned jj = (unsigned)j, im = (unsigned)img, pl = (unsigned)plane, i = jj / im, r = jj - i * im;
        const unsigned q = r / pl;
        return (size_t)i * img + (size_t)(r - q * pl) * (size_t)c + q;
    }
    const size_t i = j / img, r = j % img;
    return i * img + (r % plane) * (size_t)c + r / plane;
}

static __global__ void to_bf16_set_kernel(size_t total, size_t n0, size_t n1, const float *x0, const float *x1,
                                          const float *x2, uint16_t *y0, uint16_t *y1, uint16_t *y2, int c0, int c1,
                                          int c2, size_t p0, size_t p1, size_t p2) {
    GRID_STRIDE(i, total) {
        int k;
        size_t j;
        set_index(i, n0, n1, &k, &j);
        const float *x = k == 0 ? x0 : k == 1 ? x1 : x2;
        uint16_t *y = k == 0 ? y0 : k == 1 ? y1 : y2;
        const int c = k == 0 ? c0 : k == 1 ? c1 : c2;
        const size_t plane = k == 0 ? p0 : k == 1 ? p1 : p2;
        y[j] = bf16_from_f32(x[nhwc_source(j, c, plane)]);
    }
}

static __global__ void from_bf16_set_kernel(size_t total, size_t n0, size_t n1, const uint16_t *x0, const uint16_t *x1,
                                            const uint16_t *x2, float *y0, float *y1, float *y2, int acc0, int acc1,
                                            int acc2, int c0, int c1, int c2, size_t p0, size_t p1, size_t p2) {
    GRID_STRIDE(i, total) {
        int k;
        size_t j;
        set_index(i, n0, n1, &k, &j);
        const uint16_t *x = k == 0 ? x0 : k == 1 ? x1 : x2;
        float *y = k == 0 ? y0 : k == 1 ? y1 : y2;
        const int acc = k == 0 ? acc0 : k == 1 ? acc1 : acc2;
        const int c = k == 0 ? c0 : k == 1 ? c1 : c2;
        const size_t plane = k == 0 ? p0 : k == 1 ? p1 : p2;
        const float v = bf16_to_f32(x[nchw_source(j, c, plane)]);
        y[j] = acc ? __fadd_rn(y[j], v) : v;
    }
}

static_assert(RT_CUK_SET == 3, "the set kernels take three arrays");

extern "C" cudaError_t rt_cuk_to_bf16_n(cudaStream_t s, const rt_cuk_to_bf16_set *g) {
    if (g->n < 1 || g->n > RT_CUK_SET) return cudaErrorInvalidValue;
    size_t n[RT_CUK_SET] = {0, 0, 0}, p[RT_CUK_SET] = {0, 0, 0};
    const float *x[RT_CUK_SET] = {NULL, NULL, NULL};
    uint16_t *y[RT_CUK_SET] = {NULL, NULL, NULL};
    int c[RT_CUK_SET] = {0, 0, 0};
    for (int k = 0; k < g->n; k++) {
        n[k] = g->count[k], x[k] = g->x[k], y[k] = g->y[k], c[k] = g->c[k], p[k] = g->plane[k];
        if (c[k] < 0 || (c[k] > 0 && (p[k] == 0 || n[k] % ((size_t)c[k] * p[k]) != 0))) return cudaErrorInvalidValue;
    }
    const size_t total = n[0] + n[1] + n[2];
    if (total == 0) return cudaSuccess;
    to_bf16_set_kernel<<<grid_for(total), THREADS, 0, s>>>(total, n[0], n[1], x[0], x[1], x[2], y[0], y[1], y[2], c[0],
                                                           c[1], c[2], p[0], p[1], p[2]);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_from_bf16_n(cudaStream_t s, const rt_cuk_from_bf16_set *g) {
    if (g->n < 1 || g->n > RT_CUK_SET) return cudaErrorInvalidValue;
    size_t n[RT_CUK_SET] = {0, 0, 0}, p[RT_CUK_SET] = {0, 0, 0};
    const uint16_t *x[RT_CUK_SET] = {NULL, NULL, NULL};
    float *y[RT_CUK_SET] = {NULL, NULL, NULL};
    int acc[RT_CUK_SET] = {0, 0, 0}, c[RT_CUK_SET] = {0, 0, 0};
    for (int k = 0; k < g->n; k++) {
        n[k] = g->count[k], x[k] = g->x[k], y[k] = g->y[k], acc[k] = g->accumulate[k], c[k] = g->c[k];
        p[k] = g->plane[k];
        if (c[k] < 0 || (c[k] > 0 && (p[k] == 0 || n[k] % ((size_t)c[k] * p[k]) != 0))) return cudaErrorInvalidValue;
    }
    const size_t total = n[0] + n[1] + n[2];
    if (total == 0) return cudaSuccess;
    from_bf16_set_kernel<<<grid_for(total), THREADS, 0, s>>>(total, n[0], n[1], x[0], x[1], x[2], y[0], y[1], y[2],
                                                             acc[0], acc[1], acc[2], c[0], c[1], c[2], p[0], p[1],
                                                             p[2]);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_round_bf16(cudaStream_t s, size_t count, float *y) {
    if (count == 0) return cudaSuccess;
    round_bf16_kernel<<<grid_for(count), THREADS, 0, s>>>(count, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_bf16_fill_channels(cudaStream_t s, int n, int c, size_t plane, bool nhwc, const float *b,
                                                 uint16_t *y) {
    const size_t total = (size_t)n * c * plane;
    if (total == 0) return cudaSuccess;
    bf16_fill_channels_kernel<<<grid_for(total), THREADS, 0, s>>>(total, plane, c, nhwc ? 1 : 0, b, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_bf16_channel_sums(cudaStream_t s, int n, int c, size_t plane, bool nhwc,
                                                const uint16_t *dy, float *db) {
    if (c == 0) return cudaSuccess;
    bf16_channel_sums_kernel<<<grid_for((size_t)c), THREADS, 0, s>>>(n, c, plane, nhwc ? 1 : 0, dy, db);
    return cudaGetLastError();
}

/* ---- losses ------------------------------------------------------------------------ */

/* the CPU's row_logsumexp: float max, double sum of exp */
static __device__ double row_logsumexp(const float *x, int k) {
    float m = -INFINITY;
    for (int j = 0; j < k; j++) m = x[j] > m ? x[j] : m;
    double s = 0;
    for (int j = 0; j < k; j++) s += exp((double)x[j] - m);
    return m + log(s);
}

/* sum of the block's per-thread doubles in shared memory (fixed tree: deterministic) */
static __device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = REDUCE_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

/* one block: each thread takes rows t, t+256, ...; the loss is reduced in the block */
static __global__ void softmax_xent_kernel(int n, int k, const float *logits, const int64_t *labels, double eps,
                                           float *loss, float *dlogits, int *bad) {
    __shared__ double sh[REDUCE_THREADS];
    double total = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float *x = logits + (size_t)i * k;
        int64_t lab = labels[i];
        if (lab < 0 || lab >= k) {
            atomicAdd(bad, 1);
            total += NAN;
            if (dlogits)
                for (int j = 0; j < k; j++) dlogits[(size_t)i * k + j] = NAN;
            continue;
        }
        double lse = row_logsumexp(x, k);
        /* the CPU's formulas in the same order (ops_cpu.c), explicitly rounded: no contraction */
        if (eps == 0) {
            total += lse - x[lab];
        } else {
            double sx = 0;
            for (int j = 0; j < k; j++) sx = __dadd_rn(sx, (double)x[j]);
            total = __dadd_rn(total,
                              __dsub_rn(__dsub_rn(lse, __dmul_rn(1.0 - eps, (double)x[lab])), __dmul_rn(eps, sx / k)));
        }
        if (dlogits) {
            float *d = dlogits + (size_t)i * k;
            if (eps == 0)
                for (int j = 0; j < k; j++) d[j] = (float)((exp((double)x[j] - lse) - (j == lab ? 1.0 : 0.0)) / n);
            else
                for (int j = 0; j < k; j++)
                    d[j] = (float)(__dsub_rn(
                                       __dsub_rn(exp((double)x[j] - lse), __dmul_rn(1.0 - eps, j == lab ? 1.0 : 0.0)),
                                       eps / k) /
                                   n);
        }
    }
    double sum = block_sum(total, sh);
    if (threadIdx.x == 0) *loss = (float)(sum / n);
}

extern "C" cudaError_t rt_cuk_softmax_xent(cudaStream_t s, int n, int k, const float *logits, const int64_t *labels,
                                           float *loss, float *dlogits, int *bad) {
    softmax_xent_kernel<<<1, REDUCE_THREADS, 0, s>>>(n, k, logits, labels, 0.0, loss, dlogits, bad);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_softmax_xent_smooth(cudaStream_t s, int n, int k, const float *logits,
                                                  const int64_t *labels, double eps, float *loss, float *dlogits,
                                                  int *bad) {
    softmax_xent_kernel<<<1, REDUCE_THREADS, 0, s>>>(n, k, logits, labels, eps, loss, dlogits, bad);
    return cudaGetLastError();
}

static __global__ void log_softmax_fw_kernel(int n, int k, const float *x, float *y) {
    GRID_STRIDE(r, (size_t)n) {
        const float *xr = x + r * (size_t)k;
        float *yr = y + r * (size_t)k;
        double lse = row_logsumexp(xr, k);
        for (int j = 0; j < k; j++) yr[j] = (float)(xr[j] - lse);
    }
}

static __global__ void log_softmax_bw_kernel(int n, int k, const float *y, const float *dy, float *dx) {
    GRID_STRIDE(r, (size_t)n) {
        const float *yr = y + r * (size_t)k, *dyr = dy + r * (size_t)k;
        float *dxr = dx + r * (size_t)k;
        double acc = 0;
        for (int j = 0; j < k; j++) acc += dyr[j];
        for (int j = 0; j < k; j++) /* multiply, then subtract, as the CPU (nvcc would fuse them) */
            dxr[j] = (float)__dsub_rn((double)dyr[j], __dmul_rn(exp((double)yr[j]), acc));
    }
}

extern "C" cudaError_t rt_cuk_log_softmax_forward(cudaStream_t s, int n, int k, const float *x, float *y) {
    log_softmax_fw_kernel<<<grid_for((size_t)n), THREADS, 0, s>>>(n, k, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_cuk_log_softmax_backward(cudaStream_t s, int n, int k, const float *y, const float *dy,
                                                   float *dx) {
    log_softmax_bw_kernel<<<grid_for((size_t)n), THREADS, 0, s>>>(n, k, y, dy, dx);
    return cudaGetLastError();
}

static __global__ void nll_kernel(int n, int k, const float *logp, const int64_t *labels, float *loss, float *dlogp,
                                  int *bad) {
    __shared__ double sh[REDUCE_THREADS];
    double total = 0;
    const float g = -1.0f / (float)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int64_t lab = labels[i];
        bool ok = lab >= 0 && lab < k;
        if (!ok) {
            atomicAdd(bad, 1);
            total += NAN;
        } else {
            total -= logp[(size_t)i * k + lab];
        }
        if (dlogp)
            for (int j = 0; j < k; j++) dlogp[(size_t)i * k + j] = ok ? (j == lab ? g : 0.0f) : NAN;
    }
    double sum = block_sum(total, sh);
    if (threadIdx.x == 0) *loss = (float)(sum / n);
}

extern "C" cudaError_t rt_cuk_nll_loss(cudaStream_t s, int n, int k, const float *logp, const int64_t *labels,
                                       float *loss, float *dlogp, int *bad) {
    nll_kernel<<<1, REDUCE_THREADS, 0, s>>>(n, k, logp, labels, loss, dlogp, bad);
    return cudaGetLastError();
}
