/* conv2d on the CPU: im2col + one sgemm per chunk of images, or oneDNN.
 *
 * This file owns the layer's CPU state and picks, per layer at prepare time, between
 * oneDNN (conv_dnnl.c; RINGTRAIN_CONV, see conv_choose_dnnl) and the im2col/dense paths
 * below, which also run every batch smaller than the one oneDNN was prepared for.
 *
 * Spatial sizes in ResNet at 28x28 get tiny (layer4 is 1x1), so one gemm per image
 * would be a matrix-vector product. Instead a chunk of nb images is unfolded side by
 * side into col (C*T, nb*P) (P = out_h*out_w, T kernel taps) and multiplied once:
 *   forward   Y (O, nb*P)     = W (O, C*T) x col
 *   backward  dW (O, C*T)    += dY (O, nb*P) x col^T
 *             dcol (C*T, nb*P) = W^T x dY, folded back into dx (col2im)
 *
 * Dead taps: a kernel tap that only ever reads padding contributes nothing (and gets
 * a zero gradient). On a 1x1 input a 3x3/p1 conv has one live tap of nine; prepare
 * finds the live taps and, when some are dead, the layer multiplies a gathered
 * W (O, C*T_live) instead - 9x less work for ResNet's layer4 at 28x28.
 *
 * Forward keeps its columns (per layer, allocated by prepare, up to 128 MiB) so that
 * backward needs no second im2col; RINGTRAIN_CONV_NOCACHE=1 turns that off (to measure).
 *
 * The chunk is as large as the shared workspace allows, the whole batch at 28x28.
 * Threads split the batch: in the forward pass each pool thread unfolds its own
 * images, runs one single-threaded sgemm over their columns and writes its outputs;
 * in backward dW is split by output-channel rows (full K per thread, no reduction) and
 * dx by images again. OpenBLAS itself runs single-threaded (backend_cpu.c): measured
 * faster than OpenBLAS's own threads, which spin in sched_yield between our calls.
 */
#include "model/cpu/conv_dnnl.h"
#include "model/cpu/cpu_internal.h"
#include "model/cpu/gemm.h"

#include "core/bf16.h"
#include "core/log.h"
#include "core/settings.h"

#include <stdlib.h>
#include <string.h>

/* Workspace cap per conv: 16 M floats (64 MiB) of col + Y. */
#define CONV_WS_CAP_FLOATS ((size_t)16 << 20)
#define MAX_TAPS 64

typedef struct cpu_conv {
    int ntaps;   /* live taps */
    bool pruned; /* ntaps < k*k: use the gathered weights */
    bool dense;  /* tiny input: multiply by the unrolled (O*OP, C*IP) matrix */
    int ki[MAX_TAPS], kj[MAX_TAPS];
    /* The columns of the last forward, kept for backward (which then needs no im2col):
     * (rows, max_n*P), allocated by prepare when it is at most CONV_CACHE_CAP floats. */
    float *cache;
    int max_n;
    const float *cached_x; /* input and batch the cache holds; NULL: stale */
    int cached_n;
    rt_dnnl_conv *dnnl; /* oneDNN primitives for batch max_n (conv_dnnl.c), or NULL */
    /* dense path: the unrolled weights W' (O*OP, C*IP), zeroed once by prepare; each
     * forward writes only its non-zero entries (a fixed pattern), backward reuses it */
    float *wd;
    /* precision bf16, for the paths other than oneDNN's: the bf16-rounded input, weights
     * (not for the dense and pruned paths, which round the live taps as they read them)
     * and bias, output gradient and the input gradient before rounding (see
     * rt_cpu_conv2d_forward); NULL under fp32/tf32 */
    float *bx, *bw, *bdy, *bdx;
    /* dense path under bf16 for batches of max_n (dense16_*): W', x and dy in bf16 and the
     * three products on oneDNN's bf16 matmul, one per part; NULL mm: not in use */
    uint16_t *wd16, *x16, *dy16;
    int mparts;             /* parts of the packing of x and dy (images) */
    int fparts, xparts;     /* of the forward (blocks of output channels) and of dx (its columns) */
    int wparts;             /* of dW' (blocks of output channels, = fparts) */
    struct rt_dnnl_mm **mm; /* [fparts] forward, [xparts] dx, [wparts] dW', or NULL */
    size_t mm_scratch;      /* bytes per part, in the workspace after dW' */
} cpu_conv;

#define CONV_CACHE_CAP ((size_t)32 << 20)

static size_t dense_floats(const rt_conv2d *l) {
    return (size_t)l->out_c * l->out_h * l->out_w * (size_t)l->in_c * l->in_h * l->in_w;
}

static size_t fixed_floats(const rt_conv2d *l, const cpu_conv *cc) {
    if (cc->dense) return dense_floats(l); /* dW' (W' is cc->wd) */
    return cc->pruned ? (size_t)l->out_c * l->in_c * cc->ntaps : 0;
}
static size_t per_image_floats(const rt_conv2d *l, const cpu_conv *cc) {
    size_t rows = cc->cache ? 0 : (size_t)l->in_c * cc->ntaps;
    size_t p = (size_t)l->out_h * l->out_w;
    return (rows + (size_t)l->out_c) * p;
}

/* does tap offset `kk` (0..k-1) read a valid input for some output position? */
static bool tap_live(int kk, int out, int in, int s, int pad) {
    for (int o = 0; o < out; o++) {
        int i = o * s - pad + kk;
        if (i >= 0 && i < in) return true;
    }
    return false;
}

/* Which implementation runs this layer (RINGTRAIN_CONV, see cpu_internal.h): make the
 * oneDNN primitives for batch max_n when it is oneDNN. By default (auto) that is every
 * layer except those the dense path below takes with an unrolled matrix W' at most
 * twice the weights (ResNet34 at 28x28: layer4's 3x3 convs on 1x1 and its first, stride
 * 2, on 2x2, where it measured 1.5-4x faster than oneDNN; and layer3's 3x3 convs on 2x2,
 * W' 1.8x the weights, since the AVX-512 unroll and fold and, in bf16, the bf16 matmul
 * products: forward + backward of the 11 layers, batch 64, 2 threads, per step, bf16
 * 17.0 -> 13.0-13.3 ms, fp32 21.2-22.1 -> 19.8-20.6 ms against oneDNN's convolutions;
 * `bench model --layers`, interleaved). A oneDNN that cannot do a layer (or fails)
 * leaves it to im2col, unless RINGTRAIN_CONV=dnnl asked for oneDNN. */
static rt_status conv_choose_dnnl(rt_model_ctx *ctx, const rt_conv2d *l, cpu_conv *cc, int max_n, size_t *ws) {
    *ws = 0;
#ifdef RT_HAVE_DNNL
    rt_dnnl_conv_destroy(cc->dnnl);
    cc->dnnl = NULL;
    rt_cpu_state *s = ctx->backend;
    if (s->conv == RT_CPU_CONV_IM2COL || !s->dnnl) return RT_OK; /* (ctx_init failed for dnnl without one) */
    if (s->conv == RT_CPU_CONV_AUTO && cc->dense && dense_floats(l) <= (size_t)2 * l->out_c * l->in_c * l->k * l->k)
        return RT_OK;
    rt_status st =
        rt_dnnl_conv_create(s->dnnl, l, max_n, ctx->threads, ctx->precision == RT_PRECISION_BF16, ws, &cc->dnnl);
    if (st != RT_OK) {
        if (s->conv == RT_CPU_CONV_DNNL) return st;
        RT_LOG_DEBUG("conv2d %d->%d k%d s%d on %dx%d: oneDNN not used (%s); im2col", l->in_c, l->out_c, l->k, l->stride,
                     l->in_h, l->in_w, rt_error_message());
        *ws = 0;
    }
#else
    (void)ctx;
    (void)l;
    (void)cc;
    (void)max_n;
#endif
    return RT_OK;
}

static void bf16_free(cpu_conv *cc) {
    free(cc->bx);
    free(cc->bw);
    free(cc->bdy);
    free(cc->bdx);
    cc->bx = cc->bw = cc->bdy = cc->bdx = NULL;
}

static rt_status bf16_buffers(rt_model_ctx *ctx, const rt_conv2d *l, cpu_conv *cc, int max_n) {
    bf16_free(cc);
    if (ctx->precision != RT_PRECISION_BF16) return RT_OK;
    const size_t xs = (size_t)max_n * l->in_c * l->in_h * l->in_w, ys = (size_t)max_n * l->out_c * l->out_h * l->out_w,
                 ws = (cc->dense || cc->pruned ? 0 : (size_t)l->out_c * l->in_c * l->k * l->k) +
                      (l->has_bias ? (size_t)l->out_c : 0) + 1;
    cc->bx = malloc(xs * sizeof(float));
    cc->bdx = malloc(xs * sizeof(float));
    cc->bw = malloc(ws * sizeof(float));
    cc->bdy = malloc(ys * sizeof(float));
    if (!cc->bx || !cc->bdx || !cc->bw || !cc->bdy) {
        bf16_free(cc);
        RT_FAIL(RT_ERR_NOMEM, "conv2d %d->%d k%d: out of memory for the bf16 buffers of batch %d", l->in_c, l->out_c,
                l->k, max_n);
    }
    return RT_OK;
}

static void part_range(int total, int parts, int t, int *lo, int *hi) {
    *lo = (int)((long)total * t / parts);
    *hi = (int)((long)total * (t + 1) / parts);
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static void dense16_free(cpu_conv *cc) {
#ifdef RT_HAVE_DNNL
    if (cc->mm)
        for (int i = 0; i < cc->fparts + cc->xparts + cc->wparts; i++) rt_dnnl_mm_destroy(cc->mm[i]);
#endif
    free(cc->mm);
    free(cc->wd16);
    free(cc->x16);
    free(cc->dy16);
    cc->mm = NULL;
    cc->wd16 = cc->x16 = cc->dy16 = NULL;
    cc->mparts = cc->fparts = cc->xparts = cc->wparts = 0;
    cc->mm_scratch = 0;
}

/* the most parts a dense16 product runs in (each with its scratchpad) */
static int dense16_parts(const cpu_conv *cc) {
    int p = cc->fparts > cc->xparts ? cc->fparts : cc->xparts;
    return p > cc->wparts ? p : cc->wparts;
}

/* The dense path under bf16, for batches of max_n: W' (O*OP, C*IP), x and dy in bf16
 * and three oneDNN bf16 matmuls per part, fp32 accumulation (dense16_forward/backward):
 *   forward   y[:, cols]   = x16 W'16[rows]^T     (part t: the rows of a block of output
 *                                                 channels, which it unrolls first)
 *   dW'       dW'[rows]    = dy16^T[rows] x16     (part t: the rows of a block of output
 *                                                 channels; sums over all images; then
 *                                                 folds them into dW)
 *   dx        dx[:, cols]  = dy16 W'16[:, cols]   (part t: a block of columns)
 * each part over all the images (split by images, each part's product had half as many
 * rows and ran ~15% slower on ResNet34's layer3 at batch 64); x and dy are packed into
 * bf16 by images first. These are the bf16 products the other dense batches run as fp32 products of bf16-rounded values
 * (same rounding points, docs/model.md). Where oneDNN has no such matmul, nothing is made
 * and every batch takes that fp32 path. */
static rt_status dense16_prepare(rt_model_ctx *ctx, const rt_conv2d *l, cpu_conv *cc, int max_n) {
    dense16_free(cc);
#ifdef RT_HAVE_DNNL
    rt_cpu_state *s = ctx->backend;
    if (ctx->precision != RT_PRECISION_BF16 || !cc->dense || cc->dnnl || !s->dnnl) return RT_OK;
    const int T = rt_threadpool_threads(cpu_pool(ctx));
    const int64_t R = (int64_t)l->out_c * l->out_h * l->out_w, K = (int64_t)l->in_c * l->in_h * l->in_w;
    cc->mparts = max_n < T ? max_n : T;
    cc->fparts = l->out_c < T ? l->out_c : T; /* (forward: whole output channels, see d16_fwd_part) */
    cc->wparts = cc->fparts;                  /* (dW': whole output channels too, folded by their part) */
    cc->xparts = K < T ? (int)K : T;
    const int nmm = cc->fparts + cc->xparts + cc->wparts;
    cc->mm = calloc((size_t)nmm, sizeof *cc->mm);
    cc->wd16 = calloc((size_t)(R * K), sizeof(uint16_t)); /* the zeros of W' stay zero */
    cc->x16 = malloc((size_t)max_n * (size_t)K * sizeof(uint16_t));
    cc->dy16 = malloc((size_t)max_n * (size_t)R * sizeof(uint16_t));
    if (!cc->mm || !cc->wd16 || !cc->x16 || !cc->dy16) {
        dense16_free(cc);
        RT_FAIL(RT_ERR_NOMEM, "conv2d %d->%d k%d on %dx%d: out of memory for its bf16 matrices (batch %d)", l->in_c,
                l->out_c, l->k, l->in_h, l->in_w, max_n);
    }
    rt_status st = RT_OK;
    size_t most = 0, sb = 0;
    /* forward and dx: all the images, a block of columns each (every part a wide product) */
    const int64_t fa[2] = {K, 1}, fb[2] = {1, K}, da[2] = {R, 1}, db[2] = {K, 1};
    for (int t = 0; t < cc->fparts && st == RT_OK; t++) {
        int r0, r1;
        part_range(l->out_c, cc->fparts, t, &r0, &r1);
        r0 *= l->out_h * l->out_w;
        r1 *= l->out_h * l->out_w;
        st = rt_dnnl_mm_create(s->dnnl, true, 1, max_n, r1 - r0, (int)K, fa, fb, R, &sb, &cc->mm[t]);
        if (sb > most) most = sb;
    }
    for (int t = 0; t < cc->xparts && st == RT_OK; t++) {
        int k0, k1;
        part_range((int)K, cc->xparts, t, &k0, &k1);
        st = rt_dnnl_mm_create(s->dnnl, true, 1, max_n, k1 - k0, (int)R, da, db, K, &sb, &cc->mm[cc->fparts + t]);
        if (sb > most) most = sb;
    }
    for (int t = 0; t < cc->wparts && st == RT_OK; t++) {
        int r0, r1;
        part_range(l->out_c, cc->wparts, t, &r0, &r1);
        r0 *= l->out_h * l->out_w;
        r1 *= l->out_h * l->out_w;
        const int64_t wa[2] = {1, R}, wb[2] = {K, 1};
        st = rt_dnnl_mm_create(s->dnnl, true, 1, r1 - r0, (int)K, max_n, wa, wb, K, &sb,
                               &cc->mm[cc->fparts + cc->xparts + t]);
        if (sb > most) most = sb;
    }
    if (st != RT_OK) {
        dense16_free(cc);
        if (st != RT_ERR_UNSUPPORTED) return st;
        RT_LOG_DEBUG("conv2d %d->%d k%d on %dx%d: no oneDNN bf16 matmul (%s); fp32 products of bf16 values", l->in_c,
                     l->out_c, l->k, l->in_h, l->in_w, rt_error_message());
        rt_error_clear();
        return RT_OK;
    }
    cc->mm_scratch = align64(most);
#else
    (void)ctx;
    (void)l;
    (void)cc;
    (void)max_n;
#endif
    return RT_OK;
}

rt_status rt_cpu_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace) {
    RT_REQUIRE(l->k * l->k <= MAX_TAPS, RT_ERR_UNSUPPORTED,
               "conv2d kernel %dx%d: the CPU backend handles up to %d taps", l->k, l->k, MAX_TAPS);
    bool nocache = false; /* RINGTRAIN_CONV_NOCACHE: no column cache (for measurements) */
    RT_CHECK(rt_setting_bool(RT_SET_CONV_NOCACHE, &nocache));
    cpu_conv *cc = l->priv;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        RT_CHECK_ALLOC(cc, sizeof *cc);
        l->priv = cc;
    }
    cc->ntaps = 0;
    for (int ki = 0; ki < l->k; ki++)
        for (int kj = 0; kj < l->k; kj++)
            if (tap_live(ki, l->out_h, l->in_h, l->stride, l->pad) &&
                tap_live(kj, l->out_w, l->in_w, l->stride, l->pad)) {
                cc->ki[cc->ntaps] = ki;
                cc->kj[cc->ntaps] = kj;
                cc->ntaps++;
            }
    cc->pruned = cc->ntaps < l->k * l->k;
    /* Tiny inputs (ResNet's layer3/layer4 at 28x28: 2x2 and 1x1): a conv is a linear map
     * from the C*IP inputs of an image to its O*OP outputs, and NCHW already stores an
     * image as that vector. Multiplying by the unrolled matrix costs OP*IP per (o, c)
     * instead of OP*T with im2col, and needs no im2col at all: use it when IP <= T. */
    cc->dense = l->in_h * l->in_w <= cc->ntaps && dense_floats(l) <= ((size_t)4 << 20);
    size_t dnnl_ws = 0;
    cc->max_n = max_n;
    RT_CHECK(conv_choose_dnnl(ctx, l, cc, max_n, &dnnl_ws));
    RT_CHECK(bf16_buffers(ctx, l, cc, max_n));
    free(cc->wd);
    cc->wd = NULL;
    if (cc->dense) {
        cc->wd = calloc(dense_floats(l), sizeof(float));
        RT_CHECK_ALLOC(cc->wd, dense_floats(l) * sizeof(float));
        RT_CHECK(dense16_prepare(ctx, l, cc, max_n));
        *workspace = fixed_floats(l, cc) * sizeof(float);
        if (cc->mm) /* dW', then each part's matmul scratchpad */
            *workspace = align64(*workspace) + (size_t)dense16_parts(cc) * cc->mm_scratch;
        if (dnnl_ws > *workspace) *workspace = dnnl_ws;
        return RT_OK;
    }
    /* keep the forward columns for backward when they fit (whole batch) */
    size_t cache_floats = (size_t)l->in_c * cc->ntaps * (size_t)max_n * l->out_h * l->out_w;
    free(cc->cache);
    cc->cache = NULL;
    cc->cached_x = NULL;
    cc->max_n = max_n;
    /* with oneDNN, im2col only runs batches smaller than max_n: no cache for those */
    if (!cc->dnnl && cache_floats <= CONV_CACHE_CAP && !nocache) {
        cc->cache = malloc(cache_floats * sizeof(float));
        RT_CHECK_ALLOC(cc->cache, cache_floats * sizeof(float));
    }
    size_t per = per_image_floats(l, cc);
    size_t nb = cc->cache ? (size_t)max_n : CONV_WS_CAP_FLOATS / per;
    if (nb < 1) nb = 1;
    if (nb > (size_t)max_n) nb = (size_t)max_n;
    *workspace = (fixed_floats(l, cc) + nb * per) * sizeof(float);
    if (dnnl_ws > *workspace) *workspace = dnnl_ws;
    return RT_OK;
}

void rt_cpu_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l) {
    (void)ctx;
#ifdef RT_HAVE_DNNL
    if (l->priv) rt_dnnl_conv_destroy(((cpu_conv *)l->priv)->dnnl);
#endif
    if (l->priv) free(((cpu_conv *)l->priv)->cache);
    if (l->priv) free(((cpu_conv *)l->priv)->wd);
    if (l->priv) dense16_free(l->priv);
    if (l->priv) bf16_free(l->priv);
    free(l->priv);
    l->priv = NULL;
}

typedef struct conv_job {
    const rt_conv2d *l;
    const cpu_conv *cc;
    int n0;          /* first image of the chunk */
    int nb;          /* images in the chunk */
    int rows;        /* C * live taps */
    const float *x;  /* (n, C, H, W) whole batch */
    float *col;      /* (rows, nb*P) */
    float *yt;       /* (O, nb*P) */
    float *y;        /* (n, O, P) whole batch (forward) */
    const float *dy; /* (n, O, P) (backward) */
    float *dx;       /* (n, C, H, W) (backward) */
    const float *bias;
    const float *w; /* (O, rows): the weights or their live-tap gather */
    float *dw;      /* (O, rows) */
    bool accumulate, first_chunk;
    int parts;
} conv_job;

/* unfold image j of the chunk into columns [j*P, (j+1)*P) of col */
static void im2col_task(const conv_job *J, int j) {
    const rt_conv2d *l = J->l;
    const cpu_conv *cc = J->cc;
    const int H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w, s = l->stride, pad = l->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)J->nb * P;
    const float *x = J->x + (size_t)(J->n0 + j) * l->in_c * H * W;
    for (int c = 0; c < l->in_c; c++) {
        const float *xc = x + (size_t)c * H * W;
        for (int t = 0; t < cc->ntaps; t++) {
            const int ki = cc->ki[t], kj = cc->kj[t];
            float *out = J->col + ((size_t)c * cc->ntaps + t) * ld + (size_t)j * P;
            for (int oh = 0; oh < OH; oh++, out += OW) {
                int ih = oh * s - pad + ki;
                if (ih < 0 || ih >= H) {
                    for (int ow = 0; ow < OW; ow++) out[ow] = 0.0f;
                    continue;
                }
                const float *xr = xc + (size_t)ih * W;
                if (s == 1) {
                    /* iw = ow - pad + kj: valid for ow in [lo, hi) */
                    int lo = pad - kj, hi = W + pad - kj;
                    if (lo < 0) lo = 0;
                    if (hi > OW) hi = OW;
                    if (hi < lo) hi = lo;
                    const float *src = xr - pad + kj;
                    for (int ow = 0; ow < lo; ow++) out[ow] = 0.0f;
                    for (int ow = lo; ow < hi; ow++) out[ow] = src[ow];
                    for (int ow = hi; ow < OW; ow++) out[ow] = 0.0f;
                } else {
                    for (int ow = 0; ow < OW; ow++) {
                        int iw = ow * s - pad + kj;
                        out[ow] = (iw >= 0 && iw < W) ? xr[iw] : 0.0f;
                    }
                }
            }
        }
    }
}

/* fold columns of image j back into dx (adds; dx zeroed first unless accumulating) */
static void col2im_task(const conv_job *J, int j) {
    const rt_conv2d *l = J->l;
    const cpu_conv *cc = J->cc;
    const int H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w, s = l->stride, pad = l->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)J->nb * P;
    float *dx = J->dx + (size_t)(J->n0 + j) * l->in_c * H * W;
    if (!J->accumulate) memset(dx, 0, sizeof(float) * (size_t)l->in_c * H * W);
    for (int c = 0; c < l->in_c; c++) {
        float *dxc = dx + (size_t)c * H * W;
        for (int t = 0; t < cc->ntaps; t++) {
            const int ki = cc->ki[t], kj = cc->kj[t];
            const float *row = J->col + ((size_t)c * cc->ntaps + t) * ld + (size_t)j * P;
            for (int oh = 0; oh < OH; oh++) {
                int ih = oh * s - pad + ki;
                if (ih < 0 || ih >= H) continue;
                float *xr = dxc + (size_t)ih * W;
                const float *in = row + (size_t)oh * OW;
                for (int ow = 0; ow < OW; ow++) {
                    int iw = ow * s - pad + kj;
                    if (iw >= 0 && iw < W) xr[iw] += in[ow];
                }
            }
        }
    }
}

/* y[n0+j] (O, P) = yt[:, j*P : (j+1)*P] + bias */
static void scatter_task(const conv_job *J, int j) {
    const rt_conv2d *l = J->l;
    const size_t P = (size_t)l->out_h * l->out_w, ld = (size_t)J->nb * P;
    float *y = J->y + (size_t)(J->n0 + j) * l->out_c * P;
    for (int o = 0; o < l->out_c; o++) {
        const float *src = J->yt + (size_t)o * ld + (size_t)j * P;
        float *dst = y + (size_t)o * P;
        float b = J->bias ? J->bias[o] : 0.0f;
        for (size_t p = 0; p < P; p++) dst[p] = src[p] + b;
    }
}

/* yt[:, j*P : (j+1)*P] = dy[n0+j] */
static void gather_task(const conv_job *J, int j) {
    const rt_conv2d *l = J->l;
    const size_t P = (size_t)l->out_h * l->out_w, ld = (size_t)J->nb * P;
    const float *dy = J->dy + (size_t)(J->n0 + j) * l->out_c * P;
    for (int o = 0; o < l->out_c; o++)
        memcpy(J->yt + (size_t)o * ld + (size_t)j * P, dy + (size_t)o * P, sizeof(float) * P);
}

/* forward, one task per thread: unfold its images, one gemm over their columns, scatter */
static void fwd_part(void *arg, int t) {
    conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const int P = l->out_h * l->out_w, ld = J->nb * P;
    int lo, hi;
    part_range(J->nb, J->parts, t, &lo, &hi);
    if (hi <= lo) return;
    for (int j = lo; j < hi; j++) im2col_task(J, j);
    rt_cpu_sgemm(false, false, l->out_c, (hi - lo) * P, J->rows, 1.0f, J->w, J->rows, J->col + (size_t)lo * P, ld, 0.0f,
                 J->yt + (size_t)lo * P, ld);
    for (int j = lo; j < hi; j++) scatter_task(J, j);
}

/* backward step 1, per image: dY into (O, ld) layout and unfold x (unless the columns
 * of the forward are still in the cache) */
static void bwd_prep(void *arg, int j) {
    gather_task(arg, j);
    im2col_task(arg, j);
}
static void bwd_gather(void *arg, int j) { gather_task(arg, j); }

/* backward step 2, per thread: rows [lo, hi) of dW (O, rows) (+)= dY[lo:hi] (.., ld) x col^T */
static void bwd_dw_part(void *arg, int t) {
    conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const int ld = J->nb * l->out_h * l->out_w;
    int lo, hi;
    part_range(l->out_c, J->parts, t, &lo, &hi);
    if (hi <= lo) return;
    rt_cpu_sgemm(false, true, hi - lo, J->rows, ld, 1.0f, J->yt + (size_t)lo * ld, ld, J->col, ld,
                 J->first_chunk ? 0.0f : 1.0f, J->dw + (size_t)lo * J->rows, J->rows);
}

/* backward step 3, per thread: dcol for its images (into col, no longer needed) and fold */
static void bwd_dx_part(void *arg, int t) {
    conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const int P = l->out_h * l->out_w, ld = J->nb * P;
    int lo, hi;
    part_range(J->nb, J->parts, t, &lo, &hi);
    if (hi <= lo) return;
    rt_cpu_sgemm(true, false, J->rows, (hi - lo) * P, l->out_c, 1.0f, J->w, J->rows, J->yt + (size_t)lo * P, ld, 0.0f,
                 J->col + (size_t)lo * P, ld);
    for (int j = lo; j < hi; j++) col2im_task(J, j);
}

/* Set up the job's buffers in the workspace and the chunk size. */
static rt_status job_init(rt_model_ctx *ctx, rt_conv2d *l, int n, conv_job *J, int *nbmax, float **wl) {
    const cpu_conv *cc = l->priv;
    RT_REQUIRE(cc != NULL, RT_ERR_INVALID, "conv2d %d->%d k%d: not prepared (call rt_conv2d_prepare)", l->in_c,
               l->out_c, l->k);
    RT_REQUIRE(!cc->cache || n <= cc->max_n, RT_ERR_INVALID, "conv2d: batch %d larger than prepared for (%d)", n,
               cc->max_n);
    size_t fixed = fixed_floats(l, cc), per = per_image_floats(l, cc), have = ctx->work_bytes / sizeof(float);
    size_t fit = have > fixed ? (have - fixed) / per : 0;
    RT_REQUIRE(fit >= 1 && ctx->work, RT_ERR_INVALID,
               "conv2d %d->%d k%d on %dx%d: workspace of %zu bytes is smaller than one image needs (%zu); "
               "call rt_conv2d_prepare and rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, l->in_h, l->in_w, ctx->work_bytes, (fixed + per) * sizeof(float));
    *nbmax = fit < (size_t)n ? (int)fit : n;
    RT_REQUIRE(!cc->cache || *nbmax == n, RT_ERR_INVALID,
               "conv2d %d->%d k%d: workspace too small for the whole batch of %d", l->in_c, l->out_c, l->k, n);
    memset(J, 0, sizeof *J);
    J->l = l;
    J->cc = cc;
    J->rows = l->in_c * cc->ntaps;
    *wl = (float *)ctx->work;
    J->col = *wl + fixed; /* without a cache: col then yt; with one: yt only */
    return RT_OK;
}

/* where col and yt of a chunk of nb images go */
static void job_chunk(conv_job *J, float *ws, int nb) {
    const size_t P = (size_t)J->l->out_h * J->l->out_w;
    if (J->cc->cache) {
        J->col = J->cc->cache;
        J->yt = ws;
    } else {
        J->col = ws;
        J->yt = ws + (size_t)J->rows * nb * P;
    }
}

/* gather the live taps of W (O, C, k, k) into wl (O, C*T), each rounded to bf16 when
 * `round` (precision bf16: the only read of the weights on this path) */
static void gather_weights(const rt_conv2d *l, const cpu_conv *cc, const float *w, float *wl, bool round) {
    const int kk = l->k * l->k;
    for (int o = 0; o < l->out_c; o++)
        for (int c = 0; c < l->in_c; c++)
            for (int t = 0; t < cc->ntaps; t++) {
                const float v = w[((size_t)o * l->in_c + c) * kk + cc->ki[t] * l->k + cc->kj[t]];
                wl[((size_t)o * l->in_c + c) * cc->ntaps + t] = round ? rt_bf16_round(v) : v;
            }
}

static int parts_for(rt_model_ctx *ctx, int nb) {
    int T = rt_threadpool_threads(cpu_pool(ctx));
    return nb < T ? nb : T;
}

/* ---- dense path for tiny inputs ---------------------------------------------------- */

typedef struct dense_job {
    rt_dnnl_env *dnnl; /* oneDNN's sgemm for the products, or NULL: OpenBLAS */
    const rt_conv2d *l;
    int n, parts;
    int rows, cols; /* O*OP, C*IP */
    const float *x, *dy, *wd;
    float *y, *dx, *dwd;
    const float *bias;
    bool accumulate;
    const struct unroll_job *unroll; /* forward: the unroll of W' each part does before its products;
                                        backward: the fold of dW' each part does after them */
} dense_job;

/* The forward's products go in chunks of output channels whose rows of W' take about
 * this much (a core's L2 on the development machine): each chunk is unrolled right
 * before its product, which then finds it in the cache rather than in memory (layer3's
 * W' is 4 MiB in fp32). Measured, ResNet34's layer3 forward in fp32, batch 64, 2 threads,
 * interleaved: 8.2-9.8 -> 7.9-8.3 ms per step for its 11 layers; 256 KiB chunks made the
 * products too narrow (13.2 ms). */
#define DENSE_CHUNK_BYTES ((size_t)1024 << 10)

/* W' (O*OP, C*IP) from W (O, C, k, k), or back: fold dW' into dW. One task per output
 * channel o (its OP rows of W' and its C*k*k weights). `round` (precision bf16): W' holds
 * the bf16 roundings of the weights, rounded here as they are read (only the live taps
 * are read: at 1x1 one in nine), so bf16 needs no rounded copy of the whole of W; with
 * wd16 set, W' is that bf16 matrix itself (for oneDNN's bf16 matmul), else floats. */
typedef struct unroll_job {
    const rt_conv2d *l;
    const float *w;
    float *wd, *dw;
    uint16_t *wd16;
    int fold;
    bool round;
} unroll_job;

/* One output position's row of W' (or dW'): `row`, C segments of IP; its nt live (tap,
 * input position) pairs. Channel by channel, so that both W[o] (C groups of k*k) and the
 * row are walked in order. The fold adds each weight's one term of this position: over
 * the positions, in order, whatever the loop inside. */
static void unroll_row_from(const unroll_job *U, int o, size_t r, int nt, const int *tap, const int *xoff, int c0) {
    const rt_conv2d *l = U->l;
    const size_t IP = (size_t)l->in_h * l->in_w, kk = (size_t)l->k * l->k, C = (size_t)l->in_c;
    const size_t cols = C * IP;
    if (U->fold) {
        const float *row = U->wd + r * cols;
        float *dw = U->dw + (size_t)o * C * kk;
        for (size_t c = (size_t)c0; c < C; c++)
            for (int t = 0; t < nt; t++) dw[c * kk + tap[t]] += row[c * IP + xoff[t]];
        return;
    }
    const float *w = U->w + (size_t)o * C * kk;
    if (U->wd16) {
        uint16_t *row = U->wd16 + r * cols;
        for (size_t c = (size_t)c0; c < C; c++)
            for (int t = 0; t < nt; t++) row[c * IP + xoff[t]] = rt_bf16_from_f32(w[c * kk + tap[t]]);
    } else if (U->round) {
        float *row = U->wd + r * cols;
        for (size_t c = (size_t)c0; c < C; c++)
            for (int t = 0; t < nt; t++) row[c * IP + xoff[t]] = rt_bf16_round(w[c * kk + tap[t]]);
    } else {
        float *row = U->wd + r * cols;
        for (size_t c = (size_t)c0; c < C; c++)
            for (int t = 0; t < nt; t++) row[c * IP + xoff[t]] = w[c * kk + tap[t]];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RT_UNROLL_AVX512 1
#define RT_AVX512 __attribute__((target("avx512f,avx512bw,prfchw")))

/* The unrolls and folds walk W or dW, which the optimizer's pass over all the
 * parameters has just pushed out of the caches, in short pieces per channel: the
 * hardware prefetchers fall behind. Each loop asks for the lines UNROLL_AHEAD input
 * channels ahead (the next output channel's, past the end of a row: a prefetch does not
 * fault). Measured on the Zen 5 development machine, ResNet34 1x28x28 batch 64, 2 threads,
 * the 3328 unrolls of layer3 and layer4's first conv per step: 18-19 -> 10-11 Mcycles
 * (rdtsc summed over both threads; 32 or 128 channels ahead did no better). */
#define UNROLL_AHEAD 64

/* rt_bf16_from_f32 on 16 lanes (core/bf16.h's rounding, in integers): the bf16 bits in
 * the low half of each lane, (u + 0x7fff + ((u >> 16) & 1)) >> 16, a NaN kept quiet */
RT_AVX512 static inline __m512i bf16_bits_avx512(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i b = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1))),
        16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(b, nan, hi, _mm512_set1_epi32(0x40));
}

/* 16 lanes of W' entries as the unroll stores them: bf16 (wd16), floats rounded to bf16
 * (round) or the floats themselves */
RT_AVX512 static inline void store_wd_avx512(const unroll_job *U, size_t at, __m512 v) {
    if (U->wd16)
        _mm256_storeu_si256((__m256i *)(U->wd16 + at), _mm512_cvtepi32_epi16(bf16_bits_avx512(v)));
    else if (U->round)
        _mm512_storeu_ps(U->wd + at, _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits_avx512(v), 16)));
    else
        _mm512_storeu_ps(U->wd + at, v);
}

/* unroll_row_from on AVX-512, where 16 is a multiple of IP: a block of G = 16 / IP input
 * channels is 16 consecutive entries of the row (lane j: channel j / IP, input position
 * j % IP) and G groups of k*k weights; one gather reads the block's live weights (lanes
 * of dead pairs are off: they read nothing and write the zero they already hold), and
 * the fold adds the block's row entries to a gather of its weight gradients and
 * scatters them back (the lanes' weights are distinct: one term each, as in unroll_row_from).
 * Rounding to bf16 is core/bf16.h's, lane by lane in integers. Returns false where it
 * does not apply. */
RT_AVX512 static bool unroll_row_avx512(const unroll_job *U, int o, size_t r, int nt, const int *tap, const int *xoff) {
    const rt_conv2d *l = U->l;
    const int IP = l->in_h * l->in_w, kk = l->k * l->k, C = l->in_c;
    if (IP > 16 || 16 % IP != 0) return false;
    const int G = 16 / IP;
    int idx[16];
    __mmask16 live = 0;
    for (int j = 0; j < 16; j++) {
        idx[j] = 0;
        for (int t = 0; t < nt; t++)
            if (xoff[t] == j % IP) {
                idx[j] = (j / IP) * kk + tap[t];
                live |= (__mmask16)(1u << j);
            }
    }
    const __m512i vidx = _mm512_loadu_si512(idx);
    const size_t cols = (size_t)C * IP;
    int c = 0;
    if (U->fold) {
        const float *row = U->wd + r * cols;
        float *dw = U->dw + (size_t)o * C * kk;
        for (; c + G <= C; c += G) {
            /* (this row's dW was zeroed just now, so is in cache: the next channel's, ahead) */
            rt_cpu_prefetch(dw + ((size_t)C + c) * kk, sizeof(float) * (size_t)G * kk, true);
            const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, vidx, dw + (size_t)c * kk, 4);
            const __m512 v = _mm512_add_ps(g, _mm512_loadu_ps(row + (size_t)c * IP));
            _mm512_mask_i32scatter_ps(dw + (size_t)c * kk, live, vidx, v, 4);
        }
    } else {
        const float *w = U->w + (size_t)o * C * kk;
        for (; c + G <= C; c += G) {
            rt_cpu_prefetch(w + (size_t)(c + UNROLL_AHEAD) * kk, sizeof(float) * (size_t)G * kk, false);
            store_wd_avx512(U, r * cols + (size_t)c * IP,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, vidx, w + (size_t)c * kk, 4));
        }
    }
    /* the channels left over, one at a time */
    if (c < C) unroll_row_from(U, o, r, nt, tap, xoff, c);
    return true;
}

/* The whole of output channel o's rows of W' where the input is 4 positions and the
 * output at most 4 (ResNet's layers on 2x2 maps), the kernel at most 16 taps: per input channel c one load of its k*k
 * weights, one permute into the OP * IP entries (lane p * IP + q: the tap joining output p and input q; off, so zero,
 * where none does), rounding, then IP entries into each of the OP rows. The per-row gathers of unroll_row_avx512 read
 * each weight OP times. Not for the fold. */
RT_AVX512 static bool unroll_o_avx512(const unroll_job *U, int o) {
    const rt_conv2d *l = U->l;
    const int IP = l->in_h * l->in_w, OP = l->out_h * l->out_w, kk = l->k * l->k, C = l->in_c;
    if (U->fold || IP != 4 || OP > 4 || kk > 16) return false; /* (IP 4: copies of a constant size) */
    int idx[16] = {0};
    __mmask16 live = 0;
    for (int oh = 0; oh < l->out_h; oh++)
        for (int ow = 0; ow < l->out_w; ow++)
            for (int ih = 0; ih < l->in_h; ih++)
                for (int iw = 0; iw < l->in_w; iw++) {
                    const int ki = ih - oh * l->stride + l->pad, kj = iw - ow * l->stride + l->pad;
                    if (ki < 0 || ki >= l->k || kj < 0 || kj >= l->k) continue;
                    const int j = (oh * l->out_w + ow) * IP + ih * l->in_w + iw;
                    idx[j] = ki * l->k + kj;
                    live |= (__mmask16)(1u << j);
                }
    const __m512i vidx = _mm512_loadu_si512(idx);
    const __mmask16 taps = (__mmask16)((1u << kk) - 1);
    const size_t cols = (size_t)C * IP, r0 = (size_t)o * OP;
    const float *w = U->w + (size_t)o * C * kk;
    float tf[16];
    uint16_t th[16];
    for (int c = 0; c < C; c++) {
        if ((c & 3) == 0) rt_cpu_prefetch(w + (size_t)(c + UNROLL_AHEAD) * kk, sizeof(float) * 4 * (size_t)kk, false);
        const __m512 v = _mm512_maskz_permutexvar_ps(live, vidx, _mm512_maskz_loadu_ps(taps, w + (size_t)c * kk));
        if (!U->round) {
            _mm512_storeu_ps(tf, v);
            for (int p = 0; p < OP; p++) memcpy(U->wd + (r0 + p) * cols + (size_t)c * 4, tf + p * 4, sizeof(float) * 4);
            continue;
        }
        const __m512i b = bf16_bits_avx512(v);
        if (U->wd16) {
            _mm256_storeu_si256((__m256i *)th, _mm512_cvtepi32_epi16(b));
            for (int p = 0; p < OP; p++)
                memcpy(U->wd16 + (r0 + p) * cols + (size_t)c * 4, th + p * 4, sizeof(uint16_t) * 4);
        } else {
            _mm512_storeu_ps(tf, _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)));
            for (int p = 0; p < OP; p++) memcpy(U->wd + (r0 + p) * cols + (size_t)c * 4, tf + p * 4, sizeof(float) * 4);
        }
    }
    return true;
}

/* The fold of output channel o where the input is 4 positions and the output at most 4
 * (as unroll_o_avx512): per input channel c its OP row segments of dW' (4 entries each)
 * in one vector, then, output position by position in order, each tap's one term (a
 * permute, added under the mask of the taps live at that position) onto a vector of its
 * k*k gradients, which starts at zero: the scalar fold's memset and additions, in the
 * same order. The k*k gradients are stored whole (dead taps: zero). */
RT_AVX512 static bool fold_o_avx512(const unroll_job *U, int o) {
    const rt_conv2d *l = U->l;
    const int IP = l->in_h * l->in_w, OP = l->out_h * l->out_w, kk = l->k * l->k, C = l->in_c;
    if (!U->fold || IP != 4 || OP > 4 || kk > 16) return false;
    int idx[4][16];
    __mmask16 m[4] = {0, 0, 0, 0};
    memset(idx, 0, sizeof idx);
    for (int oh = 0; oh < l->out_h; oh++)
        for (int ow = 0; ow < l->out_w; ow++)
            for (int ih = 0; ih < l->in_h; ih++)
                for (int iw = 0; iw < l->in_w; iw++) {
                    const int ki = ih - oh * l->stride + l->pad, kj = iw - ow * l->stride + l->pad;
                    if (ki < 0 || ki >= l->k || kj < 0 || kj >= l->k) continue;
                    const int p = oh * l->out_w + ow, t = ki * l->k + kj;
                    idx[p][t] = p * 4 + ih * l->in_w + iw;
                    m[p] |= (__mmask16)(1u << t);
                }
    __m512i vidx[4];
    for (int p = 0; p < OP; p++) vidx[p] = _mm512_loadu_si512(idx[p]);
    const __mmask16 taps = (__mmask16)((1u << kk) - 1);
    const size_t cols = (size_t)C * 4, r0 = (size_t)o * OP;
    float *dw = U->dw + (size_t)o * C * kk;
    for (int c = 0; c < C; c++) {
        if ((c & 3) == 0) rt_cpu_prefetch(dw + (size_t)(c + UNROLL_AHEAD) * kk, sizeof(float) * 4 * (size_t)kk, true);
        __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(U->wd + r0 * cols + (size_t)c * 4));
        if (OP > 1) v = _mm512_insertf32x4(v, _mm_loadu_ps(U->wd + (r0 + 1) * cols + (size_t)c * 4), 1);
        if (OP > 2) v = _mm512_insertf32x4(v, _mm_loadu_ps(U->wd + (r0 + 2) * cols + (size_t)c * 4), 2);
        if (OP > 3) v = _mm512_insertf32x4(v, _mm_loadu_ps(U->wd + (r0 + 3) * cols + (size_t)c * 4), 3);
        __m512 acc = _mm512_setzero_ps();
        for (int p = 0; p < OP; p++) acc = _mm512_mask_add_ps(acc, m[p], acc, _mm512_permutexvar_ps(vidx[p], v));
        _mm512_mask_storeu_ps(dw + (size_t)c * kk, taps, acc);
    }
    return true;
}

#endif

static bool g_force_plain; /* rt_cpu_conv2d_force_plain */

void rt_cpu_conv2d_force_plain(bool on) { g_force_plain = on; }

bool rt_cpu_conv2d_dense16(const rt_conv2d *l) { return l->priv && ((const cpu_conv *)l->priv)->mm; }

static bool use_avx512(void) {
#ifdef RT_UNROLL_AVX512
    return !g_force_plain && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

static void unroll_task(void *arg, int o) {
    const unroll_job *U = arg;
    const rt_conv2d *l = U->l;
    const int H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w, k = l->k, s = l->stride, pad = l->pad;
    const size_t OP = (size_t)OH * OW, kk = (size_t)k * k;
    const bool avx512 = use_avx512();
#ifdef RT_UNROLL_AVX512
    if (avx512 && (U->fold ? fold_o_avx512(U, o) : unroll_o_avx512(U, o))) return;
#else
    (void)avx512;
#endif
    /* unroll: the entries not written here are zero since prepare */
    if (U->fold) memset(U->dw + (size_t)o * l->in_c * kk, 0, sizeof(float) * (size_t)l->in_c * kk);
    /* the (tap, input position) pairs of each output position */
    int tap[MAX_TAPS], xoff[MAX_TAPS];
    for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
            int nt = 0;
            for (int ki = 0; ki < k; ki++) {
                int ih = oh * s - pad + ki;
                if (ih < 0 || ih >= H) continue;
                for (int kj = 0; kj < k; kj++) {
                    int iw = ow * s - pad + kj;
                    if (iw < 0 || iw >= W) continue;
                    tap[nt] = ki * k + kj;
                    xoff[nt++] = ih * W + iw;
                }
            }
            const size_t r = (size_t)o * OP + (size_t)oh * OW + ow;
#ifdef RT_UNROLL_AVX512
            if (avx512 && unroll_row_avx512(U, o, r, nt, tap, xoff)) continue;
#endif
            unroll_row_from(U, o, r, nt, tap, xoff, 0);
        }
}

static void dense_unroll(rt_model_ctx *ctx, const rt_conv2d *l, const float *w, float *wd, int fold, float *dw,
                         bool round) {
    unroll_job U = {.l = l, .w = w, .wd = wd, .dw = dw, .fold = fold, .round = round};
    rt_threadpool_run(cpu_pool(ctx), l->out_c, unroll_task, &U);
}

void rt_cpu_conv2d_fold(rt_model_ctx *ctx, const rt_conv2d *l, const float *dwd, float *dw) {
    dense_unroll(ctx, l, NULL, (float *)dwd, 1, dw, false);
}

/* the dense path's products: oneDNN's sgemm (AVX-512 kernels) where the build has it,
 * else OpenBLAS's (whose kernel on CPUs it does not know, or under
 * OPENBLAS_CORETYPE=Haswell, is AVX2). Measured on the Zen 5 development machine,
 * ResNet34 1x28x28, 2 threads, interleaved: 3-5% faster steps (layer4's products) at
 * batch 64 and 128, in fp32 and bf16. */
static void dense_gemm(const dense_job *D, bool ta, bool tb, int m, int n, int k, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef RT_HAVE_DNNL
    if (D->dnnl && rt_dnnl_sgemm(D->dnnl, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc)) return;
#endif
    rt_cpu_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

/* the columns of y (n, O*OP) of part t's output channels = x (n, C*IP) W'[rows]^T + bias:
 * each part a block of output channels over all the images (wider products than a split
 * by images), unrolling its rows of W' chunk by chunk (DENSE_CHUNK_BYTES) right before
 * multiplying them */
static void dense_fwd_part(void *arg, int t) {
    dense_job *D = arg;
    const int OP = D->l->out_h * D->l->out_w;
    int o_lo, o_hi;
    part_range(D->l->out_c, D->parts, t, &o_lo, &o_hi);
    const size_t per_o = (size_t)OP * D->cols * sizeof(float);
    const int chunk = per_o >= DENSE_CHUNK_BYTES ? 1 : (int)(DENSE_CHUNK_BYTES / per_o);
    for (int o0 = o_lo; o0 < o_hi; o0 += chunk) {
        const int o1 = o0 + chunk < o_hi ? o0 + chunk : o_hi, lo = o0 * OP, hi = o1 * OP;
        for (int o = o0; o < o1; o++) unroll_task((void *)D->unroll, o);
        dense_gemm(D, false, true, D->n, hi - lo, D->cols, D->x, D->cols, D->wd + (size_t)lo * D->cols, D->cols, 0.0f,
                   D->y + lo, D->rows);
        if (D->bias)
            for (int i = 0; i < D->n; i++)
                for (int r = lo; r < hi; r++) D->y[(size_t)i * D->rows + r] += D->bias[r / OP];
    }
}

/* the rows of dW' (O*OP, C*IP) of part t's output channels = dy^T (.., n) x (n, C*IP),
 * then folded into their dW */
static void dense_dw_part(void *arg, int t) {
    dense_job *D = arg;
    const int OP = D->l->out_h * D->l->out_w;
    int o0, o1;
    part_range(D->l->out_c, D->parts, t, &o0, &o1);
    if (o1 <= o0) return;
    const int lo = o0 * OP, hi = o1 * OP;
    dense_gemm(D, true, false, hi - lo, D->cols, D->n, D->dy + lo, D->rows, D->x, D->cols, 0.0f,
               D->dwd + (size_t)lo * D->cols, D->cols);
    /* and folded into dW by the same part, while its rows of dW' are in cache */
    for (int o = o0; o < o1; o++) unroll_task((void *)D->unroll, o);
}

/* columns [lo, hi) of dx (n, C*IP) (+)= dy (n, O*OP) W'[:, lo:hi] */
static void dense_dx_part(void *arg, int t) {
    dense_job *D = arg;
    int lo, hi;
    part_range(D->cols, D->parts, t, &lo, &hi);
    if (hi <= lo) return;
    dense_gemm(D, false, false, D->n, hi - lo, D->rows, D->dy, D->rows, D->wd + lo, D->cols,
               D->accumulate ? 1.0f : 0.0f, D->dx + lo, D->cols);
}

static rt_status dense_init(rt_model_ctx *ctx, rt_conv2d *l, int n, dense_job *D) {
    size_t need = dense_floats(l) * sizeof(float);
    RT_REQUIRE(ctx->work && ctx->work_bytes >= need, RT_ERR_INVALID,
               "conv2d %d->%d k%d on %dx%d: workspace of %zu bytes is smaller than %zu; call rt_conv2d_prepare and "
               "rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, l->in_h, l->in_w, ctx->work_bytes, need);
    memset(D, 0, sizeof *D);
    D->dnnl = ((rt_cpu_state *)ctx->backend)->dnnl;
    D->l = l;
    D->n = n;
    D->rows = l->out_c * l->out_h * l->out_w;
    D->cols = l->in_c * l->in_h * l->in_w;
    D->wd = ((cpu_conv *)l->priv)->wd;
    D->dwd = (float *)ctx->work;
    return RT_OK;
}

static rt_status dense_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y, bool round_w) {
    dense_job D;
    RT_CHECK(dense_init(ctx, l, n, &D));
    unroll_job U = {.l = l, .w = rt_tensor_data(&l->weight), .wd = (float *)D.wd, .round = round_w};
    D.unroll = &U;
    D.x = x;
    D.y = y;
    D.bias = l->has_bias ? rt_tensor_data(&l->bias) : NULL;
    D.parts = parts_for(ctx, l->out_c);
    rt_threadpool_run(cpu_pool(ctx), D.parts, dense_fwd_part, &D);
    return RT_OK;
}

static rt_status dense_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                bool accumulate, bool round_w) {
    dense_job D;
    RT_CHECK(dense_init(ctx, l, n, &D));
    D.x = x;
    D.dy = dy;
    D.dx = dx;
    D.accumulate = accumulate;
    unroll_job F = {.l = l, .wd = D.dwd, .dw = rt_tensor_data(&l->dweight), .fold = 1};
    D.unroll = &F;
    D.parts = parts_for(ctx, l->out_c);
    rt_threadpool_run(cpu_pool(ctx), D.parts, dense_dw_part, &D);
    if (dx) {
        /* W' is still the forward's: the weights are those of the last forward
         * (rt_conv2d_backward's contract), and so is the precision (round_w) */
        (void)round_w;
        D.parts = parts_for(ctx, D.cols);
        rt_threadpool_run(cpu_pool(ctx), D.parts, dense_dx_part, &D);
    }
    return RT_OK;
}

#ifdef RT_HAVE_DNNL
/* dense16_prepare's products for one batch of max_n images */
typedef struct d16_job {
    rt_dnnl_env *e;
    const rt_conv2d *l;
    const cpu_conv *cc;
    int n;
    const float *x, *dy;
    float *y, *dwd, *dxf;     /* dxf: dx before its rounding (cc->bdx) */
    char *scratch;            /* part t's at scratch + t * cc->mm_scratch */
    int failed;               /* a matmul failed (set by any part) */
    const unroll_job *unroll; /* forward: W'16's unroll, each part its own rows */
    const unroll_job *fold;   /* backward: dW' into dW, each part its own rows */
} d16_job;

/* matmul i of the layer on part t's scratchpad; false (and J->failed) where it failed */
static bool d16_run(d16_job *J, int i, int t, const void *a, const void *b, float *c) {
    if (rt_dnnl_mm_run(J->e, J->cc->mm[i], a, b, c, J->scratch + (size_t)t * J->cc->mm_scratch)) return true;
    __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
    return false;
}

/* part t of the images: pack x (and, in backward, dy) into bf16 */
static void d16_pack_part(void *arg, int t) {
    d16_job *J = arg;
    const cpu_conv *cc = J->cc;
    const size_t K = (size_t)J->l->in_c * J->l->in_h * J->l->in_w, R = (size_t)J->l->out_c * J->l->out_h * J->l->out_w;
    int lo, hi;
    part_range(J->n, cc->mparts, t, &lo, &hi);
    rt_cpu_bf16_pack((size_t)(hi - lo) * K, J->x + (size_t)lo * K, cc->x16 + (size_t)lo * K);
    if (J->dy) rt_cpu_bf16_pack((size_t)(hi - lo) * R, J->dy + (size_t)lo * R, cc->dy16 + (size_t)lo * R);
}

/* the columns of y of part t's output channels = x16 W'16[their rows]^T */
static void d16_fwd_part(void *arg, int t) {
    d16_job *J = arg;
    const cpu_conv *cc = J->cc;
    const size_t K = (size_t)J->l->in_c * J->l->in_h * J->l->in_w;
    const int OP = J->l->out_h * J->l->out_w;
    int o0, o1;
    part_range(J->l->out_c, cc->fparts, t, &o0, &o1);
    /* its rows of W'16 unrolled here, right before the product reads them from cache */
    for (int o = o0; o < o1; o++) unroll_task((void *)J->unroll, o);
    d16_run(J, t, t, cc->x16, cc->wd16 + (size_t)o0 * OP * K, J->y + (size_t)o0 * OP);
}

/* the rows of dW' of part t's output channels = dy16^T[rows] x16 (a sum over all the
 * images), then folded into their dW (not after a failed product: dW is left as it was) */
static void d16_dw_part(void *arg, int t) {
    d16_job *J = arg;
    const cpu_conv *cc = J->cc;
    const size_t K = (size_t)J->l->in_c * J->l->in_h * J->l->in_w;
    const int OP = J->l->out_h * J->l->out_w;
    int o0, o1;
    part_range(J->l->out_c, cc->wparts, t, &o0, &o1);
    if (!d16_run(J, cc->fparts + cc->xparts + t, t, cc->dy16 + (size_t)o0 * OP, cc->x16, J->dwd + (size_t)o0 * OP * K))
        return;
    /* and folded into dW by the same part, while its rows of dW' are in cache */
    for (int o = o0; o < o1; o++) unroll_task((void *)J->fold, o);
}

/* columns [k0, k1) of dx = dy16 W'16, in fp32 (rounded by the caller) */
static void d16_dx_part(void *arg, int t) {
    d16_job *J = arg;
    const cpu_conv *cc = J->cc;
    int k0, k1;
    part_range(J->l->in_c * J->l->in_h * J->l->in_w, cc->xparts, t, &k0, &k1);
    d16_run(J, cc->fparts + t, t, cc->dy16, cc->wd16 + k0, J->dxf + k0);
}

static rt_status d16_init(rt_model_ctx *ctx, const rt_conv2d *l, int n, d16_job *J) {
    const cpu_conv *cc = l->priv;
    const size_t dwb = align64(dense_floats(l) * sizeof(float));
    const int parts = dense16_parts(cc);
    RT_REQUIRE(ctx->work && ctx->work_bytes >= dwb + (size_t)parts * cc->mm_scratch, RT_ERR_INVALID,
               "conv2d %d->%d k%d on %dx%d: workspace of %zu bytes is smaller than %zu; call rt_conv2d_prepare and "
               "rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, l->in_h, l->in_w, ctx->work_bytes, dwb + (size_t)parts * cc->mm_scratch);
    *J = (d16_job){.e = ((rt_cpu_state *)ctx->backend)->dnnl, .l = l, .cc = cc, .n = n};
    J->dwd = (float *)ctx->work;
    J->scratch = (char *)ctx->work + dwb;
    return RT_OK;
}

static rt_status d16_check(const d16_job *J, const char *what) {
    RT_REQUIRE(!J->failed, RT_ERR_INTERNAL, "conv2d %d->%d k%d on %dx%d: oneDNN bf16 matmul (%s) failed", J->l->in_c,
               J->l->out_c, J->l->k, J->l->in_h, J->l->in_w, what);
    return RT_OK;
}

/* bf16, dense, batch max_n: y = round(x16 W'16^T + round(b)) */
static rt_status dense16_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y) {
    cpu_conv *cc = l->priv;
    d16_job J;
    RT_CHECK(d16_init(ctx, l, n, &J));
    unroll_job U = {.l = l, .w = rt_tensor_data(&l->weight), .wd16 = cc->wd16, .round = true};
    J.unroll = &U;
    J.x = x;
    J.y = y;
    rt_threadpool_run(cpu_pool(ctx), cc->mparts, d16_pack_part, &J);
    rt_threadpool_run(cpu_pool(ctx), cc->fparts, d16_fwd_part, &J);
    RT_CHECK(d16_check(&J, "forward"));
    const size_t R = (size_t)l->out_c * l->out_h * l->out_w, OP = (size_t)l->out_h * l->out_w;
    if (l->has_bias) {
        const float *b = rt_tensor_data(&l->bias);
        for (int i = 0; i < n; i++)
            for (int o = 0; o < l->out_c; o++) {
                const float bo = rt_bf16_round(b[o]);
                for (size_t p = 0; p < OP; p++) y[(size_t)i * R + (size_t)o * OP + p] += bo;
            }
    }
    rt_cpu_bf16_round(ctx, (size_t)n * R, y, y, false);
    return RT_OK;
}

/* bf16, dense, batch max_n: dW (and db) from the fp32 sums of bf16 products, dx rounded
 * once (then added where accumulating); W'16 is the last forward's */
static rt_status dense16_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                  bool accumulate) {
    cpu_conv *cc = l->priv;
    d16_job J;
    RT_CHECK(d16_init(ctx, l, n, &J));
    J.x = x;
    J.dy = dy;
    J.dxf = cc->bdx;
    rt_threadpool_run(cpu_pool(ctx), cc->mparts, d16_pack_part, &J);
    unroll_job F = {.l = l, .wd = J.dwd, .dw = rt_tensor_data(&l->dweight), .fold = 1};
    J.fold = &F;
    rt_threadpool_run(cpu_pool(ctx), cc->wparts, d16_dw_part, &J);
    RT_CHECK(d16_check(&J, "weight gradient"));
    if (l->has_bias) { /* db: the sum of the rounded dy, as conv_backward_f32 sums it */
        float *db = rt_tensor_data(&l->dbias);
        const size_t R = (size_t)l->out_c * l->out_h * l->out_w, OP = (size_t)l->out_h * l->out_w;
        for (int o = 0; o < l->out_c; o++) {
            double sum = 0;
            for (int i = 0; i < n; i++)
                for (size_t p = 0; p < OP; p++) sum += rt_bf16_to_f32(cc->dy16[(size_t)i * R + (size_t)o * OP + p]);
            db[o] = (float)sum;
        }
    }
    if (!dx) return RT_OK;
    rt_threadpool_run(cpu_pool(ctx), cc->xparts, d16_dx_part, &J);
    RT_CHECK(d16_check(&J, "input gradient"));
    rt_cpu_bf16_round(ctx, (size_t)n * l->in_c * l->in_h * l->in_w, cc->bdx, dx, accumulate);
    return RT_OK;
}
#endif

/* The fp32 paths. round_w: round the weights to bf16 as they are read (the dense and
 * pruned paths under precision bf16; see bf16_layer). */
static rt_status conv_forward_f32(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y, bool round_w) {
#ifdef RT_HAVE_DNNL
    cpu_conv *dc = l->priv;
    if (dc && dc->dnnl && n == rt_dnnl_conv_batch(dc->dnnl))
        return rt_dnnl_conv_forward(ctx, ((rt_cpu_state *)ctx->backend)->dnnl, dc->dnnl, l, x, y);
#endif
    if (l->priv && ((cpu_conv *)l->priv)->dense) return dense_forward(ctx, l, n, x, y, round_w);
    conv_job J;
    int nbmax;
    float *wl;
    RT_CHECK(job_init(ctx, l, n, &J, &nbmax, &wl));
    const size_t P = (size_t)l->out_h * l->out_w;
    const float *w = rt_tensor_data(&l->weight);
    if (J.cc->pruned) gather_weights(l, J.cc, w, wl, round_w);
    J.w = J.cc->pruned ? wl : w;
    J.x = x;
    J.y = y;
    J.bias = l->has_bias ? rt_tensor_data(&l->bias) : NULL;
    float *ws = J.col;
    for (int n0 = 0; n0 < n; n0 += nbmax) {
        J.n0 = n0;
        J.nb = n - n0 < nbmax ? n - n0 : nbmax;
        job_chunk(&J, ws, J.nb);
        J.parts = parts_for(ctx, J.nb);
        rt_threadpool_run(cpu_pool(ctx), J.parts, fwd_part, &J);
    }
    if (J.cc->cache) {
        cpu_conv *cc = l->priv;
        cc->cached_x = x;
        cc->cached_n = n;
    }
    (void)P;
    return RT_OK;
}

/* dW of the taps that read only padding: 0. oneDNN's bf16 backward-weights in one part on
 * several OpenMP threads wrote varying values there (conv 33->1 3x3/3 p1 on 3x2 with
 * bias, 3 threads: test_model_conv_dense); the live taps' gradients were repeatable. */
static void zero_dead_taps(const rt_conv2d *l, const cpu_conv *cc, float *dw) {
    const int kk = l->k * l->k;
    bool live[MAX_TAPS] = {false};
    for (int t = 0; t < cc->ntaps; t++) live[cc->ki[t] * l->k + cc->kj[t]] = true;
    for (size_t oc = 0; oc < (size_t)l->out_c * l->in_c; oc++)
        for (int t = 0; t < kk; t++)
            if (!live[t]) dw[oc * kk + t] = 0.0f;
}

static rt_status conv_backward_f32(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                   bool accumulate, bool round_w) {
#ifdef RT_HAVE_DNNL
    cpu_conv *dc = l->priv;
    if (dc && dc->dnnl && n == rt_dnnl_conv_batch(dc->dnnl)) {
        RT_CHECK(rt_dnnl_conv_backward(ctx, ((rt_cpu_state *)ctx->backend)->dnnl, dc->dnnl, l, x, dy, dx, accumulate));
        if (dc->pruned) zero_dead_taps(l, dc, rt_tensor_data(&l->dweight));
        return RT_OK;
    }
#endif
    conv_job J;
    if (l->priv && ((cpu_conv *)l->priv)->dense) {
        /* the bias gradient below is shared with the im2col path */
        if (l->has_bias) {
            const size_t OP = (size_t)l->out_h * l->out_w;
            float *db = rt_tensor_data(&l->dbias);
            for (int o = 0; o < l->out_c; o++) {
                double sum = 0;
                for (int i = 0; i < n; i++)
                    for (size_t p = 0; p < OP; p++) sum += dy[((size_t)i * l->out_c + o) * OP + p];
                db[o] = (float)sum;
            }
        }
        return dense_backward(ctx, l, n, x, dy, dx, accumulate, round_w);
    }
    int nbmax;
    float *wl;
    RT_CHECK(job_init(ctx, l, n, &J, &nbmax, &wl));
    const size_t P = (size_t)l->out_h * l->out_w;
    rt_threadpool *pool = cpu_pool(ctx);
    if (l->has_bias) {
        float *db = rt_tensor_data(&l->dbias);
        for (int o = 0; o < l->out_c; o++) {
            double s = 0;
            for (int i = 0; i < n; i++) {
                const float *d = dy + ((size_t)i * l->out_c + o) * P;
                for (size_t p = 0; p < P; p++) s += d[p];
            }
            db[o] = (float)s;
        }
    }
    const float *w = rt_tensor_data(&l->weight);
    float *dw = rt_tensor_data(&l->dweight);
    /* pruned: wl holds the gathered weights for dx; dW of the live taps accumulates in
     * the col region's tail is not possible (col is per chunk), so it goes to the
     * dweight tensor itself through a second gather buffer: dW (O, C*T) is computed
     * into the front of dweight and spread out afterwards (back to front: in place). */
    if (J.cc->pruned) gather_weights(l, J.cc, w, wl, round_w);
    J.w = J.cc->pruned ? wl : w;
    J.dw = dw;
    J.x = x;
    J.dy = dy;
    J.dx = dx;
    J.accumulate = accumulate;
    float *ws = J.col;
    int T = rt_threadpool_threads(pool);
    cpu_conv *cc = l->priv;
    const bool cached = cc->cache && cc->cached_x == x && cc->cached_n == n;
    cc->cached_x = NULL; /* dcol overwrites the columns below */
    for (int n0 = 0; n0 < n; n0 += nbmax) {
        J.n0 = n0;
        J.nb = n - n0 < nbmax ? n - n0 : nbmax;
        J.first_chunk = n0 == 0;
        job_chunk(&J, ws, J.nb);
        rt_threadpool_run(pool, J.nb, cached ? bwd_gather : bwd_prep, &J);
        J.parts = l->out_c < T ? l->out_c : T;
        rt_threadpool_run(pool, J.parts, bwd_dw_part, &J);
        if (dx) {
            J.parts = parts_for(ctx, J.nb);
            rt_threadpool_run(pool, J.parts, bwd_dx_part, &J);
        }
    }
    if (J.cc->pruned) {
        /* dw holds (O, C*T) packed at its start; spread to (O, C, k, k) with zeros for
         * the dead taps, from the last element back so nothing is overwritten early */
        const int kk = l->k * l->k, nt = J.cc->ntaps;
        for (long oc = (long)l->out_c * l->in_c - 1; oc >= 0; oc--) {
            float v[MAX_TAPS];
            for (int t = 0; t < nt; t++) v[t] = dw[oc * nt + t];
            float *dst = dw + oc * kk;
            for (int t = 0; t < kk; t++) dst[t] = 0.0f;
            for (int t = 0; t < nt; t++) dst[J.cc->ki[t] * l->k + J.cc->kj[t]] = v[t];
        }
    }
    return RT_OK;
}

/* ---- precision bf16 ------------------------------------------------------------------
 *
 * PyTorch's autocast (torch.autocast("cpu", torch.bfloat16)) runs a convolution on
 * bf16 copies of its input, weights and bias and returns a bf16 output; its backward
 * takes a bf16 output gradient and returns a bf16 input gradient. Here, with fp32
 * buffers at the interface, the rounding points are (each fp32 -> bf16, ties to even):
 *   forward:  x, W, b rounded; products exact in fp32; sums in fp32; y rounded
 *   backward: dy rounded; dx = conv^T(dy, W) summed in fp32, then rounded (before it
 *             is added to an accumulating dx); dW, db summed in fp32 and NOT rounded
 *             (autocast rounds them to bf16 and widens them again: ours is closer to
 *             the exact gradient, by at most one bf16 rounding, 2^-9 relative)
 * oneDNN's bf16 primitives (conv_dnnl.c) do exactly this for the batch they were made
 * for; every other batch and layer (im2col, dense, pruned taps; a CPU without oneDNN's
 * bf16 kernels) runs the fp32 path on rounded copies, which gives the same bits up to the
 * order of the fp32 sums: a bf16 x bf16 product is exact in fp32. The weights are the
 * exception where it pays: the dense and pruned paths read only the live taps (one in
 * nine for a 3x3 conv on 1x1, ResNet's layer4 at 28x28) into a matrix of their own
 * anyway, and round them there (round_w); rounding a copy of all of W first cost a bf16
 * ResNet34 step at 28x28 about 20 ms of one thread, 13 M weights twice per step. */

static bool dnnl_runs(const rt_conv2d *l, int n) {
#ifdef RT_HAVE_DNNL
    const cpu_conv *cc = l->priv;
    return cc && cc->dnnl && n == rt_dnnl_conv_batch(cc->dnnl);
#else
    (void)l;
    (void)n;
    return false;
#endif
}

/* l with its bias replaced by its bf16 rounding in cc->bw, and its weights too unless
 * the path that runs reads them through a gather or an unroll that rounds them itself
 * (*round_w true: dense or pruned taps) */
static rt_conv2d bf16_layer(rt_model_ctx *ctx, const rt_conv2d *l, cpu_conv *cc, bool *round_w) {
    rt_conv2d r = *l;
    *round_w = cc->dense || cc->pruned; /* (bf16_buffers sized cc->bw by the same test) */
    const size_t nw = *round_w ? 0 : (size_t)rt_tensor_numel(&l->weight);
    if (!*round_w) {
        rt_cpu_bf16_round(ctx, nw, rt_tensor_data(&l->weight), cc->bw, false);
        r.weight.arena = NULL;
        r.weight.data = cc->bw;
    }
    if (l->has_bias) {
        rt_cpu_bf16_round(ctx, (size_t)l->out_c, rt_tensor_data(&l->bias), cc->bw + nw, false);
        r.bias.arena = NULL;
        r.bias.data = cc->bw + nw;
    }
    return r;
}

rt_status rt_cpu_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y) {
    cpu_conv *cc = l->priv;
    if (ctx->precision != RT_PRECISION_BF16 || dnnl_runs(l, n)) return conv_forward_f32(ctx, l, n, x, y, false);
#ifdef RT_HAVE_DNNL
    if (cc && cc->mm && n == cc->max_n) return dense16_forward(ctx, l, n, x, y);
#endif
    RT_REQUIRE(cc && cc->bx && n <= cc->max_n, RT_ERR_INVALID,
               "conv2d %d->%d k%d: bf16 batch %d without rt_conv2d_prepare for it", l->in_c, l->out_c, l->k, n);
    rt_cpu_bf16_round(ctx, (size_t)n * l->in_c * l->in_h * l->in_w, x, cc->bx, false);
    bool round_w;
    rt_conv2d r = bf16_layer(ctx, l, cc, &round_w);
    RT_CHECK(conv_forward_f32(ctx, &r, n, cc->bx, y, round_w));
    rt_cpu_bf16_round(ctx, (size_t)n * l->out_c * l->out_h * l->out_w, y, y, false);
    return RT_OK;
}

rt_status rt_cpu_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                 bool accumulate) {
    cpu_conv *cc = l->priv;
    if (ctx->precision != RT_PRECISION_BF16 || dnnl_runs(l, n))
        return conv_backward_f32(ctx, l, n, x, dy, dx, accumulate, false);
#ifdef RT_HAVE_DNNL
    if (cc && cc->mm && n == cc->max_n) return dense16_backward(ctx, l, n, x, dy, dx, accumulate);
#endif
    RT_REQUIRE(cc && cc->bx && n <= cc->max_n, RT_ERR_INVALID,
               "conv2d %d->%d k%d: bf16 batch %d without rt_conv2d_prepare for it", l->in_c, l->out_c, l->k, n);
    /* (the same bits the forward rounded into bx: its column cache stays valid) */
    rt_cpu_bf16_round(ctx, (size_t)n * l->in_c * l->in_h * l->in_w, x, cc->bx, false);
    rt_cpu_bf16_round(ctx, (size_t)n * l->out_c * l->out_h * l->out_w, dy, cc->bdy, false);
    bool round_w;
    rt_conv2d r = bf16_layer(ctx, l, cc, &round_w);
    RT_CHECK(conv_backward_f32(ctx, &r, n, cc->bx, cc->bdy, dx ? cc->bdx : NULL, false, round_w));
    if (dx) rt_cpu_bf16_round(ctx, (size_t)n * l->in_c * l->in_h * l->in_w, cc->bdx, dx, accumulate);
    return RT_OK;
}
