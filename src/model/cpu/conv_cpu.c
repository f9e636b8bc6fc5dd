/* conv2d on the CPU: im2col + one sgemm per chunk of images.
 *
 * Spatial sizes in ResNet at 28x28 get tiny (layer4 is 1x1), so one gemm per image
 * would be a matrix-vector product. Instead a chunk of nb images is unfolded side by
 * side into col (C*k*k, nb*P) (P = out_h*out_w) and multiplied once:
 *   forward   Y (O, nb*P)      = W (O, CKK) x col
 *   backward  dW (O, CKK)     += dY (O, nb*P) x col^T
 *             dcol (CKK, nb*P) = W^T x dY, folded back into dx (col2im)
 * The chunk is as large as the shared workspace allows (col + Y), the whole batch at
 * 28x28. Unfolding, folding and the NCHW <-> (O, nb*P) transposes run on the pool,
 * one task per image; the gemms use OpenBLAS's threads.
 */
#include "model/cpu/cpu_internal.h"
#include "model/cpu/gemm.h"

#include <string.h>

/* Workspace cap per conv: 16 M floats (64 MiB) of col + Y. */
#define CONV_WS_CAP_FLOATS ((size_t)16 << 20)

static size_t per_image_floats(const rt_conv2d *l) {
    size_t ckk = (size_t)l->in_c * l->k * l->k;
    size_t p = (size_t)l->out_h * l->out_w;
    return (ckk + (size_t)l->out_c) * p;
}

rt_status rt_cpu_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace) {
    size_t per = per_image_floats(l);
    size_t nb = CONV_WS_CAP_FLOATS / per;
    if (nb < 1) nb = 1;
    if (nb > (size_t)max_n) nb = (size_t)max_n;
    *workspace = nb * per * sizeof(float);
    return RT_OK;
}

typedef struct conv_job {
    const rt_conv2d *l;
    int n0;          /* first image of the chunk */
    int nb;          /* images in the chunk */
    const float *x;  /* (n, C, H, W) whole batch */
    float *col;      /* (CKK, nb*P) */
    float *yt;       /* (O, nb*P) */
    float *y;        /* (n, O, P) whole batch (forward) */
    const float *dy; /* (n, O, P) (backward) */
    float *dx;       /* (n, C, H, W) (backward) */
    const float *bias;
    bool accumulate;
} conv_job;

/* unfold image j of the chunk into columns [j*P, (j+1)*P) of col */
static void im2col_task(void *arg, int j) {
    const conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const int H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w, k = l->k, s = l->stride, pad = l->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)J->nb * P;
    const float *x = J->x + (size_t)(J->n0 + j) * l->in_c * H * W;
    for (int c = 0; c < l->in_c; c++) {
        const float *xc = x + (size_t)c * H * W;
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float *row = J->col + ((size_t)(c * k + ki) * k + kj) * ld + (size_t)j * P;
                for (int oh = 0; oh < OH; oh++) {
                    int ih = oh * s - pad + ki;
                    float *out = row + (size_t)oh * OW;
                    if (ih < 0 || ih >= H) {
                        memset(out, 0, sizeof(float) * (size_t)OW);
                        continue;
                    }
                    const float *xr = xc + (size_t)ih * W;
                    if (s == 1) {
                        /* iw = ow - pad + kj: valid for ow in [lo, hi) */
                        int lo = pad - kj, hi = W + pad - kj;
                        if (lo < 0) lo = 0;
                        if (hi > OW) hi = OW;
                        if (hi < lo) hi = lo;
                        for (int ow = 0; ow < lo; ow++) out[ow] = 0.0f;
                        if (hi > lo) memcpy(out + lo, xr + lo - pad + kj, sizeof(float) * (size_t)(hi - lo));
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
static void col2im_task(void *arg, int j) {
    const conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const int H = l->in_h, W = l->in_w, OH = l->out_h, OW = l->out_w, k = l->k, s = l->stride, pad = l->pad;
    const size_t P = (size_t)OH * OW, ld = (size_t)J->nb * P;
    float *dx = J->dx + (size_t)(J->n0 + j) * l->in_c * H * W;
    if (!J->accumulate) memset(dx, 0, sizeof(float) * (size_t)l->in_c * H * W);
    for (int c = 0; c < l->in_c; c++) {
        float *dxc = dx + (size_t)c * H * W;
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const float *row = J->col + ((size_t)(c * k + ki) * k + kj) * ld + (size_t)j * P;
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
static void scatter_task(void *arg, int j) {
    const conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const size_t P = (size_t)l->out_h * l->out_w, ld = (size_t)J->nb * P;
    float *y = J->y + (size_t)(J->n0 + j) * l->out_c * P;
    for (int o = 0; o < l->out_c; o++) {
        const float *src = J->yt + (size_t)o * ld + (size_t)j * P;
        float *dst = y + (size_t)o * P;
        float b = J->bias ? J->bias[o] : 0.0f;
        if (J->bias)
            for (size_t p = 0; p < P; p++) dst[p] = src[p] + b;
        else
            memcpy(dst, src, sizeof(float) * P);
    }
}

/* yt[:, j*P : (j+1)*P] = dy[n0+j] */
static void gather_task(void *arg, int j) {
    const conv_job *J = arg;
    const rt_conv2d *l = J->l;
    const size_t P = (size_t)l->out_h * l->out_w, ld = (size_t)J->nb * P;
    const float *dy = J->dy + (size_t)(J->n0 + j) * l->out_c * P;
    for (int o = 0; o < l->out_c; o++) memcpy(J->yt + (size_t)o * ld + (size_t)j * P, dy + (size_t)o * P, sizeof(float) * P);
}

static rt_status chunk_size(rt_model_ctx *ctx, const rt_conv2d *l, int n, int *nb) {
    size_t per = per_image_floats(l);
    size_t fit = ctx->work_bytes / sizeof(float) / per;
    RT_REQUIRE(fit >= 1 && ctx->work, RT_ERR_INVALID,
               "conv2d %d->%d k%d on %dx%d: workspace of %zu bytes is smaller than one image needs (%zu); "
               "call rt_conv2d_prepare and rt_model_ctx_reserve",
               l->in_c, l->out_c, l->k, l->in_h, l->in_w, ctx->work_bytes, per * sizeof(float));
    *nb = fit < (size_t)n ? (int)fit : n;
    return RT_OK;
}

rt_status rt_cpu_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, float *y) {
    int nbmax;
    RT_CHECK(chunk_size(ctx, l, n, &nbmax));
    const int ckk = l->in_c * l->k * l->k;
    const size_t P = (size_t)l->out_h * l->out_w;
    const float *w = rt_tensor_data(&l->weight);
    rt_pool *pool = cpu_pool(ctx);
    for (int n0 = 0; n0 < n; n0 += nbmax) {
        int nb = n - n0 < nbmax ? n - n0 : nbmax;
        conv_job J = {.l = l, .n0 = n0, .nb = nb, .x = x, .y = y,
                      .bias = l->has_bias ? rt_tensor_data(&l->bias) : NULL};
        J.col = ctx->work;
        J.yt = J.col + (size_t)ckk * nb * P;
        rt_pool_run(pool, nb, im2col_task, &J);
        rt_cpu_sgemm(false, false, l->out_c, nb * (int)P, ckk, 1.0f, w, ckk, J.col, nb * (int)P, 0.0f, J.yt,
                     nb * (int)P);
        rt_pool_run(pool, nb, scatter_task, &J);
    }
    return RT_OK;
}

rt_status rt_cpu_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const float *x, const float *dy, float *dx,
                                 bool accumulate) {
    int nbmax;
    RT_CHECK(chunk_size(ctx, l, n, &nbmax));
    const int ckk = l->in_c * l->k * l->k;
    const size_t P = (size_t)l->out_h * l->out_w;
    const float *w = rt_tensor_data(&l->weight);
    float *dw = rt_tensor_data(&l->dweight);
    rt_pool *pool = cpu_pool(ctx);
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
    for (int n0 = 0; n0 < n; n0 += nbmax) {
        int nb = n - n0 < nbmax ? n - n0 : nbmax;
        conv_job J = {.l = l, .n0 = n0, .nb = nb, .x = x, .dy = dy, .dx = dx, .accumulate = accumulate};
        J.col = ctx->work;
        J.yt = J.col + (size_t)ckk * nb * P;
        const int ld = nb * (int)P;
        rt_pool_run(pool, nb, gather_task, &J);
        rt_pool_run(pool, nb, im2col_task, &J);
        /* dW (O, CKK) (+)= dY (O, ld) x col^T (ld, CKK) */
        rt_cpu_sgemm(false, true, l->out_c, ckk, ld, 1.0f, J.yt, ld, J.col, ld, n0 == 0 ? 0.0f : 1.0f, dw, ckk);
        if (dx) {
            /* dcol (CKK, ld) = W^T (CKK, O) x dY (O, ld), into the col buffer */
            rt_cpu_sgemm(true, false, ckk, ld, l->out_c, 1.0f, w, ckk, J.yt, ld, 0.0f, J.col, ld);
            rt_pool_run(pool, nb, col2im_task, &J);
        }
    }
    return RT_OK;
}
