/* The CPU kernels of every layer but conv2d: batch norm, relu, pooling, linear,
 * dropout, elementwise ops and the losses. Per-channel and per-image loops run on the
 * pool; every sum has one order, whatever the thread count, so results do not depend on it. */
/* These loops are the elementwise hot spots; gcc's -O2 cost model does not vectorise
 * loops that need an aliasing check (in-place ops alias), -O3's does. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

/* a loop whose iterations read and write only their own index (in-place ops alias) */
#if defined(__GNUC__) && !defined(__clang__)
#define RT_IVDEP _Pragma("GCC ivdep")
#elif defined(__clang__)
#define RT_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define RT_IVDEP
#endif

#include "core/philox.h"
#include "model/cpu/cpu_internal.h"
#include "model/cpu/gemm.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- batch norm ------------------------------------------------------------------- */

/* Each task owns a range of channels and walks every image's rows of them, so the
 * statistics of a channel are summed in the same order whatever the thread count.
 * Planes of up to BN_ROW_PLANE values (ResNet's 7x7, 4x4, 2x2, 1x1 maps at 28x28) take
 * the row path: a task's channels are one contiguous run of at most BN_ROW values in
 * each image, so every loop runs over that run with unit stride (vectorised, whole cache
 * lines), summing per position in double and per channel at the end. Larger planes go
 * channel by channel, each plane summed in float lanes and the images in double.
 * The forward can add a residual and apply ReLU as it writes y (y = relu(bn(x) + r));
 * the backward can take the gradient through a ReLU whose output was `act` (dy is
 * used where act > 0): the same values as the separate ops, in one pass less each. */
#define BN_ROW 1024
/* the rows' loops over the images ask for the segments of the image this far ahead
 * (rt_cpu_prefetch): each is one short piece per image, too short for the hardware
 * prefetchers (the saved activations come from memory in the backward) */
#define BN_AHEAD 2
#define BN_ROW_PLANE 256
#define BN_LANES 16

typedef struct bn_job {
    rt_batchnorm2d *l;
    int n, cpt; /* images; channels per task */
    const float *x, *dy, *res, *act;
    float *y, *dx;
    bool training, accumulate, relu;
    double m;           /* values per channel the statistics are over: n*h*w, or every rank's */
    double *sums_out;   /* synchronised batch norm: this rank's sums go here, no output */
    const double *sums; /* synchronised batch norm: every rank's sums instead of this rank's */
} bn_job;

/* Synchronised batch norm: channel c's sums (s, ss) are every rank's when J->sums is given;
 * with J->sums_out this rank's are written there instead and the caller stops (true). */
static bool bn_take_sums(const bn_job *J, int c, double *s, double *ss) {
    const int C = J->l->c;
    if (J->sums) *s = J->sums[c], *ss = J->sums[C + c];
    if (!J->sums_out) return false;
    J->sums_out[c] = *s;
    J->sums_out[C + c] = *ss;
    return true;
}

static inline float bn_grad(const float *dy, const float *act, size_t p) {
    const float d = dy[p];
    return act ? (act[p] > 0.0f ? d : 0.0f) : d;
}

/* s1 = sum x, s2 = sum x^2 over one image's plane (P values) */
static inline void bn_sums(const float *x, size_t P, double *s1, double *s2) {
    float a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t p = 0;
    for (; p + BN_LANES <= P; p += BN_LANES)
        for (int j = 0; j < BN_LANES; j++) {
            a[j] += x[p + j];
            b[j] += x[p + j] * x[p + j];
        }
    double da = 0, db = 0;
    for (int j = 0; j < BN_LANES; j++) {
        da += a[j];
        db += b[j];
    }
    for (; p < P; p++) {
        da += x[p];
        db += (double)x[p] * x[p];
    }
    *s1 += da;
    *s2 += db;
}

/* s1 = sum g, s2 = sum g * (x - mean) over one plane, g the gradient through the ReLU */
static inline void bn_dsums(const float *dy, const float *act, const float *x, float mean, size_t P, double *s1,
                            double *s2) {
    float a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t p = 0;
    for (; p + BN_LANES <= P; p += BN_LANES)
        for (int j = 0; j < BN_LANES; j++) {
            float g = bn_grad(dy, act, p + j);
            a[j] += g;
            b[j] += g * (x[p + j] - mean);
        }
    double da = 0, db = 0;
    for (int j = 0; j < BN_LANES; j++) {
        da += a[j];
        db += b[j];
    }
    for (; p < P; p++) {
        float g = bn_grad(dy, act, p);
        da += g;
        db += (double)g * (x[p] - mean);
    }
    *s1 += da;
    *s2 += db;
}

/* channel c's batch statistics from its sums s = sum x, ss = sum x^2 over m values:
 * saved for the backward, folded into the running statistics */
static void bn_stats(const bn_job *J, int c, double s, double ss, double *mean, double *invstd) {
    rt_batchnorm2d *l = J->l;
    float *rm = rt_tensor_data(&l->running_mean), *rv = rt_tensor_data(&l->running_var);
    const double m = J->m;
    *mean = s / m;
    double var = ss / m - *mean * *mean;
    if (var < 0) var = 0;
    *invstd = 1.0 / sqrt(var + (double)l->eps);
    l->save_mean[c] = (float)*mean;
    l->save_invstd[c] = (float)*invstd;
    const double mo = l->momentum;
    rm[c] = (float)((1.0 - mo) * rm[c] + mo * *mean);
    rv[c] = (float)((1.0 - mo) * rv[c] + mo * var * m / (m - 1.0));
}

/* y = x * a + b [+ r] [relu] over `len` values; a, b per value */
static inline void bn_apply(const float *x, const float *r, const float *a, const float *b, float *y, size_t len,
                            bool relu) {
    if (r && relu)
        for (size_t e = 0; e < len; e++) {
            float v = x[e] * a[e] + b[e] + r[e];
            y[e] = v > 0.0f ? v : 0.0f;
        }
    else if (r)
        for (size_t e = 0; e < len; e++) y[e] = x[e] * a[e] + b[e] + r[e];
    else if (relu)
        for (size_t e = 0; e < len; e++) {
            float v = x[e] * a[e] + b[e];
            y[e] = v > 0.0f ? v : 0.0f;
        }
    else
        for (size_t e = 0; e < len; e++) y[e] = x[e] * a[e] + b[e];
}

/* the scale and shift of channel c: y = x * a + b */
static void bn_affine(const bn_job *J, int c, double mean, double invstd, float *a, float *b) {
    const float gamma = ((const float *)rt_tensor_data(&J->l->weight))[c];
    const float beta = ((const float *)rt_tensor_data(&J->l->bias))[c];
    *a = (float)(gamma * invstd);
    *b = (float)(beta - mean * gamma * invstd);
}

static void bn_eval_stats(const bn_job *J, int c, double *mean, double *invstd) {
    *mean = ((const float *)rt_tensor_data(&J->l->running_mean))[c];
    *invstd = 1.0 / sqrt((double)((const float *)rt_tensor_data(&J->l->running_var))[c] + (double)J->l->eps);
}

RT_CPU_HOT static void bn_forward_rows(const bn_job *J, int c0, int c1) {
    const size_t P = (size_t)J->l->h * J->l->w, stride = (size_t)J->l->c * P, off = (size_t)c0 * P;
    const size_t len = (size_t)(c1 - c0) * P;
    float a[BN_ROW], b[BN_ROW];
    if (J->training) {
        double s1[BN_ROW] = {0}, s2[BN_ROW] = {0};
        for (int i = 0; !J->sums && i < J->n; i++) {
            const float *xr = J->x + i * stride + off;
            rt_cpu_prefetch(xr + BN_AHEAD * stride, len * sizeof(float), false);
            RT_IVDEP
            for (size_t e = 0; e < len; e++) {
                s1[e] += xr[e];
                s2[e] += (double)xr[e] * xr[e];
            }
        }
        for (int c = c0; c < c1; c++) {
            double s = 0, ss = 0, mean, invstd;
            for (size_t p = 0; !J->sums && p < P; p++) {
                s += s1[(c - c0) * P + p];
                ss += s2[(c - c0) * P + p];
            }
            if (bn_take_sums(J, c, &s, &ss)) continue;
            bn_stats(J, c, s, ss, &mean, &invstd);
            bn_affine(J, c, mean, invstd, &a[(c - c0) * P], &b[(c - c0) * P]);
        }
        if (J->sums_out) return;
    } else {
        for (int c = c0; c < c1; c++) {
            double mean, invstd;
            bn_eval_stats(J, c, &mean, &invstd);
            bn_affine(J, c, mean, invstd, &a[(c - c0) * P], &b[(c - c0) * P]);
        }
    }
    for (int c = c0; c < c1; c++)
        for (size_t p = 1; p < P; p++) {
            a[(c - c0) * P + p] = a[(c - c0) * P];
            b[(c - c0) * P + p] = b[(c - c0) * P];
        }
    for (int i = 0; i < J->n; i++) {
        if (J->res) rt_cpu_prefetch(J->res + (i + BN_AHEAD) * stride + off, len * sizeof(float), false);
        bn_apply(J->x + i * stride + off, J->res ? J->res + i * stride + off : NULL, a, b, J->y + i * stride + off, len,
                 J->relu);
    }
}

RT_CPU_HOT static void bn_forward_planes(const bn_job *J, int c0, int c1) {
    const size_t P = (size_t)J->l->h * J->l->w, stride = (size_t)J->l->c * P;
    float a[BN_LANES], b[BN_LANES];
    for (int c = c0; c < c1; c++) {
        double mean, invstd;
        if (J->training) {
            double s = 0, ss = 0;
            for (int i = 0; !J->sums && i < J->n; i++) bn_sums(J->x + i * stride + (size_t)c * P, P, &s, &ss);
            if (bn_take_sums(J, c, &s, &ss)) continue;
            bn_stats(J, c, s, ss, &mean, &invstd);
        } else {
            bn_eval_stats(J, c, &mean, &invstd);
        }
        bn_affine(J, c, mean, invstd, &a[0], &b[0]);
        for (int j = 1; j < BN_LANES; j++) a[j] = a[0], b[j] = b[0];
        for (int i = 0; i < J->n; i++) {
            const size_t o = i * stride + (size_t)c * P;
            for (size_t p = 0; p < P; p += BN_LANES) {
                size_t len = P - p < BN_LANES ? P - p : BN_LANES;
                bn_apply(J->x + o + p, J->res ? J->res + o + p : NULL, a, b, J->y + o + p, len, J->relu);
            }
        }
    }
}

static void bn_forward_task(void *arg, int t) {
    const bn_job *J = arg;
    int c0 = t * J->cpt, c1 = c0 + J->cpt < J->l->c ? c0 + J->cpt : J->l->c;
    if ((size_t)J->l->h * J->l->w <= BN_ROW_PLANE)
        bn_forward_rows(J, c0, c1);
    else
        bn_forward_planes(J, c0, c1);
}

/* g = dy where act > 0, else 0: the gradient through the ReLU, into a row buffer (a
 * separate loop: gcc vectorises it, not the select inside the double sums below) */
static inline const float *bn_relu_grad(const float *dy, const float *act, float *g, size_t len) {
    if (!act) return dy;
    for (size_t e = 0; e < len; e++) {
        const float d = dy[e];
        g[e] = act[e] > 0.0f ? d : 0.0f;
    }
    return g;
}

/* dx = k * (g - mean(g) - xhat * mean(g * xhat)), k = gamma * invstd, per value (rows;
 * ivdep: dx may be g's source dy, each value read before it is written) */
static inline void bn_dx(const float *g, const float *x, const float *k, const float *mdy, const float *mu,
                         const float *q, float *dx, size_t len, bool accumulate) {
    if (accumulate) RT_IVDEP
    for (size_t e = 0; e < len; e++) dx[e] += k[e] * (g[e] - mdy[e] - (x[e] - mu[e]) * q[e]);
    else RT_IVDEP for (size_t e = 0; e < len; e++) dx[e] = k[e] * (g[e] - mdy[e] - (x[e] - mu[e]) * q[e]);
}

/* channel c's gradient sums -> dgamma, dbeta and the per-channel factors of dx */
static void bn_dfactors(const bn_job *J, int c, double sdy, double sdyx, float *k, float *mdy, float *mu, float *q) {
    rt_batchnorm2d *l = J->l;
    const float gamma = ((const float *)rt_tensor_data(&l->weight))[c];
    const double invstd = l->save_invstd[c];
    sdyx *= invstd; /* sum g * xhat */
    if (!J->sums) { /* every rank's sums (synchronised): this rank's gradients were written with them */
        ((float *)rt_tensor_data(&l->dweight))[c] = (float)sdyx;
        ((float *)rt_tensor_data(&l->dbias))[c] = (float)sdy;
    }
    if (J->sums_out) return;
    const double m = J->m;
    *k = (float)(gamma * invstd);
    *mdy = (float)(sdy / m);
    *mu = l->save_mean[c];
    *q = (float)invstd * (float)(sdyx / m);
}

RT_CPU_HOT static void bn_backward_rows(const bn_job *J, int c0, int c1) {
    const size_t P = (size_t)J->l->h * J->l->w, stride = (size_t)J->l->c * P, off = (size_t)c0 * P;
    const size_t len = (size_t)(c1 - c0) * P;
    float k[BN_ROW], mdy[BN_ROW], mu[BN_ROW], q[BN_ROW];
    double s1[BN_ROW] = {0}, s2[BN_ROW] = {0};
    for (int c = c0; c < c1; c++)
        for (size_t p = 0; p < P; p++) mu[(c - c0) * P + p] = J->l->save_mean[c];
    float gbuf[BN_ROW];
    for (int i = 0; !J->sums && i < J->n; i++) {
        const size_t o = i * stride + off, ahead = o + BN_AHEAD * stride;
        rt_cpu_prefetch(J->x + ahead, len * sizeof(float), false);
        rt_cpu_prefetch(J->dy + ahead, len * sizeof(float), false);
        if (J->act) rt_cpu_prefetch(J->act + ahead, len * sizeof(float), false);
        const float *g = bn_relu_grad(J->dy + o, J->act ? J->act + o : NULL, gbuf, len), *xr = J->x + o;
        RT_IVDEP
        for (size_t e = 0; e < len; e++) {
            s1[e] += g[e];
            s2[e] += (double)g[e] * (xr[e] - mu[e]);
        }
    }
    for (int c = c0; c < c1; c++) {
        double sdy = 0, sdyx = 0;
        const size_t o = (size_t)(c - c0) * P;
        for (size_t p = 0; !J->sums && p < P; p++) {
            sdy += s1[o + p];
            sdyx += s2[o + p];
        }
        bool out = bn_take_sums(J, c, &sdy, &sdyx);
        bn_dfactors(J, c, sdy, sdyx, &k[o], &mdy[o], &mu[o], &q[o]);
        if (out) continue;
        for (size_t p = 1; p < P; p++) k[o + p] = k[o], mdy[o + p] = mdy[o], mu[o + p] = mu[o], q[o + p] = q[o];
    }
    for (int i = 0; !J->sums_out && i < J->n; i++) {
        const size_t o = i * stride + off;
        const float *g = bn_relu_grad(J->dy + o, J->act ? J->act + o : NULL, gbuf, len);
        bn_dx(g, J->x + o, k, mdy, mu, q, J->dx + o, len, J->accumulate);
    }
}

RT_CPU_HOT static void bn_backward_planes(const bn_job *J, int c0, int c1) {
    const size_t P = (size_t)J->l->h * J->l->w, stride = (size_t)J->l->c * P;
    float k[BN_LANES], mdy[BN_LANES], mu[BN_LANES], q[BN_LANES];
    for (int c = c0; c < c1; c++) {
        double sdy = 0, sdyx = 0;
        const float mean = J->l->save_mean[c];
        for (int i = 0; !J->sums && i < J->n; i++) {
            const size_t o = i * stride + (size_t)c * P;
            bn_dsums(J->dy + o, J->act ? J->act + o : NULL, J->x + o, mean, P, &sdy, &sdyx);
        }
        bool out = bn_take_sums(J, c, &sdy, &sdyx);
        bn_dfactors(J, c, sdy, sdyx, &k[0], &mdy[0], &mu[0], &q[0]);
        if (out) continue;
        for (int j = 1; j < BN_LANES; j++) k[j] = k[0], mdy[j] = mdy[0], mu[j] = mu[0], q[j] = q[0];
        for (int i = 0; i < J->n; i++) {
            const size_t o = i * stride + (size_t)c * P;
            for (size_t p = 0; p < P; p += BN_LANES) {
                size_t len = P - p < BN_LANES ? P - p : BN_LANES;
                float gbuf[BN_LANES];
                const float *g = bn_relu_grad(J->dy + o + p, J->act ? J->act + o + p : NULL, gbuf, len);
                bn_dx(g, J->x + o + p, k, mdy, mu, q, J->dx + o + p, len, J->accumulate);
            }
        }
    }
}

static void bn_backward_task(void *arg, int t) {
    const bn_job *J = arg;
    int c0 = t * J->cpt, c1 = c0 + J->cpt < J->l->c ? c0 + J->cpt : J->l->c;
    if ((size_t)J->l->h * J->l->w <= BN_ROW_PLANE)
        bn_backward_rows(J, c0, c1);
    else
        bn_backward_planes(J, c0, c1);
}

/* channels per task: at most one row block, else about four tasks per thread (the
 * split does not change any result) */
static void bn_run(rt_model_ctx *ctx, bn_job *J, rt_threadpool_fn fn) {
    const int C = J->l->c, P = J->l->h * J->l->w, T = rt_threadpool_threads(cpu_pool(ctx));
    int cpt = (C + 4 * T - 1) / (4 * T);
    if (P <= BN_ROW_PLANE && cpt > BN_ROW / P) cpt = BN_ROW / P;
    J->cpt = cpt < 1 ? 1 : cpt;
    rt_threadpool_run(cpu_pool(ctx), (C + J->cpt - 1) / J->cpt, fn, J);
}

rt_status rt_cpu_batchnorm2d_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x,
                                         const float *residual, float *y, bool training, bool relu) {
    bn_job J = {.l = l, .n = n, .x = x, .res = residual, .y = y, .training = training, .relu = relu};
    J.m = (double)n * l->h * l->w;
    bn_run(ctx, &J, bn_forward_task);
    if (training) ((int64_t *)rt_tensor_data(&l->num_batches_tracked))[0] += 1;
    return RT_OK;
}

rt_status rt_cpu_batchnorm2d_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, float *y,
                                     bool training) {
    return rt_cpu_batchnorm2d_forward_act(ctx, l, n, x, NULL, y, training, false);
}

rt_status rt_cpu_batchnorm2d_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                          const float *dy, float *dx, bool accumulate) {
    bn_job J = {.l = l, .n = n, .x = x, .act = act, .dy = dy, .dx = dx, .accumulate = accumulate};
    J.m = (double)n * l->h * l->w;
    bn_run(ctx, &J, bn_backward_task);
    return RT_OK;
}

rt_status rt_cpu_batchnorm2d_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *dy,
                                      float *dx, bool accumulate) {
    return rt_cpu_batchnorm2d_backward_act(ctx, l, n, x, NULL, dy, dx, accumulate);
}

/* Synchronised batch norm (backend.h): the same passes as above, split at the sums. The
 * statistics of a channel come from the same double sums as the unsynchronised layer's,
 * so one rank synchronised computes what it computes alone. */
rt_status rt_cpu_batchnorm2d_sync_stats(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, double *sums) {
    bn_job J = {.l = l, .n = n, .x = x, .training = true, .sums_out = sums};
    bn_run(ctx, &J, bn_forward_task);
    sums[2 * l->c] = (double)n * l->h * l->w;
    return RT_OK;
}

rt_status rt_cpu_batchnorm2d_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x,
                                          const float *residual, float *y, bool relu, const double *sums) {
    bn_job J = {.l = l, .n = n, .x = x, .res = residual, .y = y, .training = true, .relu = relu, .sums = sums};
    J.m = sums[2 * l->c];
    bn_run(ctx, &J, bn_forward_task);
    ((int64_t *)rt_tensor_data(&l->num_batches_tracked))[0] += 1;
    return RT_OK;
}

rt_status rt_cpu_batchnorm2d_sync_dsums(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                        const float *dy, double *sums) {
    bn_job J = {.l = l, .n = n, .x = x, .act = act, .dy = dy, .sums_out = sums};
    bn_run(ctx, &J, bn_backward_task);
    sums[2 * l->c] = (double)n * l->h * l->w;
    return RT_OK;
}

rt_status rt_cpu_batchnorm2d_sync_dx(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const float *x, const float *act,
                                     const float *dy, float *dx, bool accumulate, const double *sums) {
    bn_job J = {.l = l, .n = n, .x = x, .act = act, .dy = dy, .dx = dx, .accumulate = accumulate, .sums = sums};
    J.m = sums[2 * l->c];
    bn_run(ctx, &J, bn_backward_task);
    return RT_OK;
}

/* ---- elementwise: split into blocks of 64 Ki elements ------------------------------ */

#define EW_BLOCK ((size_t)1 << 16)

typedef struct ew_job {
    size_t count;
    const float *a, *b;
    float *y;
    int op;
} ew_job;

enum { EW_RELU, EW_RELU_BW, EW_ADD, EW_ACC, EW_COPY };

RT_CPU_HOT static void ew_task(void *arg, int t) {
    const ew_job *J = arg;
    size_t lo = (size_t)t * EW_BLOCK, hi = lo + EW_BLOCK < J->count ? lo + EW_BLOCK : J->count;
    const float *a = J->a, *b = J->b;
    float *y = J->y;
    switch (J->op) {
    case EW_RELU:
        for (size_t i = lo; i < hi; i++) y[i] = a[i] > 0.0f ? a[i] : 0.0f;
        break;
    case EW_RELU_BW: /* a = y (output), b = dy */
        for (size_t i = lo; i < hi; i++) y[i] = a[i] > 0.0f ? b[i] : 0.0f;
        break;
    case EW_ADD:
        for (size_t i = lo; i < hi; i++) y[i] = a[i] + b[i];
        break;
    case EW_ACC:
        for (size_t i = lo; i < hi; i++) y[i] += a[i];
        break;
    case EW_COPY:
        memmove(y + lo, a + lo, sizeof(float) * (hi - lo));
        break;
    }
}

static rt_status ew_run(rt_model_ctx *ctx, int op, size_t count, const float *a, const float *b, float *y) {
    ew_job J = {.count = count, .a = a, .b = b, .y = y, .op = op};
    rt_threadpool_run(cpu_pool(ctx), (int)((count + EW_BLOCK - 1) / EW_BLOCK), ew_task, &J);
    return RT_OK;
}

rt_status rt_cpu_relu_forward(rt_model_ctx *ctx, size_t count, const float *x, float *y) {
    return ew_run(ctx, EW_RELU, count, x, NULL, y);
}
rt_status rt_cpu_relu_backward(rt_model_ctx *ctx, size_t count, const float *y, const float *dy, float *dx) {
    return ew_run(ctx, EW_RELU_BW, count, y, dy, dx);
}
rt_status rt_cpu_add_forward(rt_model_ctx *ctx, size_t count, const float *a, const float *b, float *y) {
    return ew_run(ctx, EW_ADD, count, a, b, y);
}
rt_status rt_cpu_add_backward(rt_model_ctx *ctx, size_t count, const float *dy, float *dx) {
    return ew_run(ctx, EW_ACC, count, dy, NULL, dx);
}
rt_status rt_cpu_copy(rt_model_ctx *ctx, size_t count, const float *x, float *y) {
    /* single task: memmove is only safe for overlapping ranges as one call */
    memmove(y, x, sizeof(float) * count);
    (void)ctx;
    return RT_OK;
}

/* ---- max pooling: tasks of a few (image, channel) planes --------------------------- */

/* Prepared layers (rt_maxpool2d_prepare) keep the forward's argmax of every output, so
 * that backward only scatters dy; without it (or for an input other than the last
 * forward's) backward finds the maxima again. */
typedef struct cpu_maxpool {
    int max_n, n;   /* capacity; images of the last forward (0: none recorded) */
    const float *x; /* that forward's input */
    int32_t *arg;   /* (max_n, c, out_h, out_w): index into the input plane */
} cpu_maxpool;

typedef struct pool_job {
    const rt_maxpool2d *l;
    const float *x, *dy;
    float *y, *dx;
    int32_t *arg; /* written by forward / read by backward, or NULL */
    int planes;   /* n * c */
    bool vector;  /* forward on maxpool_fw_plane_avx512 */
} pool_job;

/* index (into the input plane) of the first maximum of window (oh, ow), the window
 * clipped to the plane first (padding never wins; pad <= k/2 leaves every window at least
 * one value); a NaN wins over everything before it (PyTorch's CPU rule). Branch-free
 * selects: the comparisons of random data mispredict half the time. */
static inline int window_argmax(const rt_maxpool2d *l, const float *xp, int oh, int ow, float *best) {
    const int h0 = oh * l->stride - l->pad, w0 = ow * l->stride - l->pad;
    const int i0 = h0 < 0 ? 0 : h0, i1 = h0 + l->k < l->in_h ? h0 + l->k : l->in_h;
    const int j0 = w0 < 0 ? 0 : w0, j1 = w0 + l->k < l->in_w ? w0 + l->k : l->in_w;
    int arg = i0 * l->in_w + j0;
    float m = xp[arg];
    for (int ih = i0; ih < i1; ih++)
        for (int iw = j0; iw < j1; iw++) {
            const int idx = ih * l->in_w + iw;
            const float v = xp[idx];
            const bool take = (v > m) | (v != v);
            m = take ? v : m;
            arg = take ? idx : arg;
        }
    *best = m;
    return arg;
}

/* tasks of MP_PLANES planes: thousands of one-plane tasks made the shared task
 * counter a contended cache line */
#define MP_PLANES 16

/* window_argmax for a 3x3 window wholly inside the plane at row-major offset a0 (the
 * ResNet stem's pooling: all but the first row and column of outputs), unrolled */
static inline int window3_argmax(const float *xp, int W, int a0, float *best) {
    int arg = a0;
    float m = xp[a0];
    const int off[8] = {1, 2, W, W + 1, W + 2, 2 * W, 2 * W + 1, 2 * W + 2};
    for (int t = 0; t < 8; t++) {
        const float v = xp[a0 + off[t]];
        const bool take = (v > m) | (v != v);
        m = take ? v : m;
        arg = take ? a0 + off[t] : arg;
    }
    *best = m;
    return arg;
}

static void maxpool_fw_plane(const pool_job *J, int plane) {
    const rt_maxpool2d *l = J->l;
    const size_t OP = (size_t)l->out_h * l->out_w;
    const float *xp = J->x + (size_t)plane * l->in_h * l->in_w;
    float *yp = J->y + (size_t)plane * OP;
    int32_t *ap = J->arg ? J->arg + (size_t)plane * OP : NULL;
    for (int oh = 0; oh < l->out_h; oh++) {
        const int h0 = oh * l->stride - l->pad;
        for (int ow = 0; ow < l->out_w; ow++) {
            const int w0 = ow * l->stride - l->pad;
            float m;
            const int a = l->k == 3 && h0 >= 0 && w0 >= 0 && h0 + 3 <= l->in_h && w0 + 3 <= l->in_w
                              ? window3_argmax(xp, l->in_w, h0 * l->in_w + w0, &m)
                              : window_argmax(l, xp, oh, ow, &m);
            yp[oh * l->out_w + ow] = m;
            if (ap) ap[oh * l->out_w + ow] = a;
        }
    }
}

static void maxpool_bw_plane(const pool_job *J, int plane) {
    const rt_maxpool2d *l = J->l;
    const size_t OP = (size_t)l->out_h * l->out_w;
    const float *xp = J->x + (size_t)plane * l->in_h * l->in_w;
    const float *dyp = J->dy + (size_t)plane * OP;
    float *dxp = J->dx + (size_t)plane * l->in_h * l->in_w;
    memset(dxp, 0, sizeof(float) * (size_t)l->in_h * l->in_w);
    if (J->arg) {
        const int32_t *ap = J->arg + (size_t)plane * OP;
        for (size_t o = 0; o < OP; o++) dxp[ap[o]] += dyp[o];
        return;
    }
    for (int oh = 0; oh < l->out_h; oh++)
        for (int ow = 0; ow < l->out_w; ow++) {
            float m;
            dxp[window_argmax(l, xp, oh, ow, &m)] += dyp[oh * l->out_w + ow];
        }
}

/* ---- the forward on AVX-512 ----
 * 16 window starts of an output row at a time: the windows that start at every column
 * from the chunk's first window's (the stride ignored; those that are outputs are picked
 * at the end), each giving what window_argmax's scan gives:
 * - the scan picks the last NaN of a sequence, else its first maximum; so the pick of a
 *   concatenation is the scan of its parts' picks, and a window is scanned as its rows'
 *   picks, in order (the rows' scans are independent: shorter dependency chains);
 * - scanning a value twice in a row changes nothing (a value not greater than itself is
 *   taken again only when it is a NaN, and then it is the same NaN at the same index),
 *   nor does scanning a row twice in a row; so a window clipped by the plane's border
 *   gives the same value and index when its rows and columns outside the plane read the
 *   edge row and column instead (pad <= k/2: every window keeps a row and a column).
 * The reads of a window row's tap are then one vector load for 16 windows, masked at the
 * border (edge values blended in), and every window has k * k taps: no branch, no
 * gather. The ResNet stem's 3x3/2: 9 masked loads, compares and selects (and 2 to fold
 * the rows) for a row of up to 8 outputs, where the plain scan branches on each value. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MP_AVX512 1
#define MP_KMAX 8 /* widest window taken (wider ones: the plain scan) */

/* lanes where the scan takes v over the best so far, m: v > m or v is NaN */
__attribute__((target("avx512f"))) static inline __mmask16 mp_take(__m512 m, __m512 v) {
    return (__mmask16)(_mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
}

/* maxpool_fw_plane's outputs for one plane: y, and the argmax where J->arg is set */
__attribute__((target("avx512f"))) static void maxpool_fw_plane_avx512(const pool_job *J, int plane) {
    const rt_maxpool2d *l = J->l;
    const int H = l->in_h, W = l->in_w, k = l->k, s = l->stride, OW = l->out_w;
    const size_t OP = (size_t)l->out_h * OW;
    const float *xp = J->x + (size_t)plane * H * W;
    float *yp = J->y + (size_t)plane * OP;
    int32_t *ap = J->arg ? J->arg + (size_t)plane * OP : NULL;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i zero = _mm512_setzero_si512(), last = _mm512_set1_epi32(W - 1);
    const __m512i pick = _mm512_mullo_epi32(iota, _mm512_set1_epi32(s)); /* output q: lane q * s */
    const int per = (16 + s - 1) / s;                                    /* outputs per 16 starts */
    __mmask16 inside[MP_KMAX], before[MP_KMAX];
    __m512i col[MP_KMAX];
    for (int o0 = 0; o0 < OW; o0 += per) {
        const int c0 = o0 * s - l->pad; /* first column of the chunk's first window */
        const __mmask16 out = (__mmask16)((1u << (OW - o0 < per ? OW - o0 : per)) - 1u);
        for (int kw = 0; kw < k; kw++) { /* column c0 + j + kw of lane j, clamped */
            const __m512i c = _mm512_add_epi32(iota, _mm512_set1_epi32(c0 + kw));
            inside[kw] = _mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(W));
            before[kw] = _mm512_cmplt_epi32_mask(c, zero);
            col[kw] = _mm512_min_epi32(_mm512_max_epi32(c, zero), last);
        }
        for (int oh = 0; oh < l->out_h; oh++) {
            __m512 m = _mm512_setzero_ps();
            __m512i a = zero;
            for (int kh = 0; kh < k; kh++) {
                const int h = oh * s - l->pad + kh, r = h < 0 ? 0 : h < H ? h : H - 1;
                const float *xr = xp + (size_t)r * W;
                const __m512 left = _mm512_set1_ps(xr[0]), right = _mm512_set1_ps(xr[W - 1]);
                const __m512i rw = _mm512_set1_epi32(r * W);
                __m512 mr = _mm512_setzero_ps();
                __m512i ar = zero;
                for (int kw = 0; kw < k; kw++) {
                    /* lanes outside the row are not read (masked), whatever the address;
                     * which may lie before the array: formed as an integer, not by
                     * pointer arithmetic out of bounds */
                    const __m512 edge = _mm512_mask_blend_ps(before[kw], right, left);
                    const uintptr_t at = (uintptr_t)xr + (uintptr_t)((intptr_t)(c0 + kw) * (intptr_t)sizeof(float));
                    const __m512 v = _mm512_mask_loadu_ps(edge, inside[kw], (const void *)at);
                    const __mmask16 take = kw == 0 ? (__mmask16)0xffff : mp_take(mr, v);
                    mr = _mm512_mask_mov_ps(mr, take, v);
                    ar = _mm512_mask_mov_epi32(ar, take, _mm512_add_epi32(col[kw], rw));
                }
                const __mmask16 take = kh == 0 ? (__mmask16)0xffff : mp_take(m, mr);
                m = _mm512_mask_mov_ps(m, take, mr);
                a = _mm512_mask_mov_epi32(a, take, ar);
            }
            _mm512_mask_storeu_ps(yp + (size_t)oh * OW + o0, out, _mm512_permutexvar_ps(pick, m));
            if (ap) _mm512_mask_storeu_epi32(ap + (size_t)oh * OW + o0, out, _mm512_permutexvar_epi32(pick, a));
        }
    }
}
#endif

/* rt_cpu_maxpool2d_force_plain(true): every forward takes the plain scan (the tests
 * compare both ways on the same CPU; cpu_internal.h) */
static bool mp_force_plain;
void rt_cpu_maxpool2d_force_plain(bool on) { mp_force_plain = on; }

/* whether this forward runs maxpool_fw_plane_avx512: the CPU has AVX-512 and the window
 * is at most MP_KMAX wide */
static bool maxpool_vector(const rt_maxpool2d *l) {
#ifdef MP_AVX512
    return !mp_force_plain && l->k <= MP_KMAX && __builtin_cpu_supports("avx512f");
#else
    (void)l, (void)mp_force_plain;
    return false;
#endif
}

RT_CPU_HOT static void maxpool_fw_task(void *arg, int t) {
    const pool_job *J = arg;
#ifdef MP_AVX512
    if (J->vector) {
        for (int p = t * MP_PLANES; p < (t + 1) * MP_PLANES && p < J->planes; p++) maxpool_fw_plane_avx512(J, p);
        return;
    }
#endif
    for (int p = t * MP_PLANES; p < (t + 1) * MP_PLANES && p < J->planes; p++) maxpool_fw_plane(J, p);
}
RT_CPU_HOT static void maxpool_bw_task(void *arg, int t) {
    const pool_job *J = arg;
    for (int p = t * MP_PLANES; p < (t + 1) * MP_PLANES && p < J->planes; p++) maxpool_bw_plane(J, p);
}

rt_status rt_cpu_maxpool2d_prepare(rt_model_ctx *ctx, rt_maxpool2d *l, int max_n) {
    rt_cpu_maxpool2d_release(ctx, l);
    const size_t count = (size_t)max_n * l->c * l->out_h * l->out_w;
    cpu_maxpool *mp = calloc(1, sizeof *mp);
    int32_t *arg = malloc(sizeof *arg * count);
    if (!mp || !arg) {
        free(mp);
        free(arg);
        RT_FAIL(RT_ERR_NOMEM, "maxpool2d on %dx%dx%d: %zu bytes of argmax for batch %d", l->c, l->in_h, l->in_w,
                sizeof *arg * count, max_n);
    }
    mp->max_n = max_n;
    mp->arg = arg;
    l->priv = mp;
    return RT_OK;
}

void rt_cpu_maxpool2d_release(rt_model_ctx *ctx, rt_maxpool2d *l) {
    (void)ctx;
    cpu_maxpool *mp = l->priv;
    if (mp) free(mp->arg);
    free(mp);
    l->priv = NULL;
}

rt_status rt_cpu_maxpool2d_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const float *x, float *y) {
    cpu_maxpool *mp = l->priv;
    pool_job J = {.l = l, .x = x, .y = y, .planes = n * l->c, .vector = maxpool_vector(l)};
    if (mp) {
        const bool fits = n <= mp->max_n;
        J.arg = fits ? mp->arg : NULL;
        mp->n = fits ? n : 0;
        mp->x = x;
    }
    rt_threadpool_run(cpu_pool(ctx), (J.planes + MP_PLANES - 1) / MP_PLANES, maxpool_fw_task, &J);
    return RT_OK;
}

rt_status rt_cpu_maxpool2d_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const float *x, const float *y,
                                    const float *dy, float *dx) {
    (void)y;
    const cpu_maxpool *mp = l->priv;
    pool_job J = {.l = l, .x = x, .dy = dy, .dx = dx, .planes = n * l->c};
    if (mp && mp->n == n && mp->x == x) J.arg = mp->arg; /* the last forward's maxima */
    rt_threadpool_run(cpu_pool(ctx), (J.planes + MP_PLANES - 1) / MP_PLANES, maxpool_bw_task, &J);
    return RT_OK;
}

/* ---- global average pooling -------------------------------------------------------- */

rt_status rt_cpu_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const float *x, float *y) {
    (void)ctx;
    for (size_t i = 0; i < (size_t)n * c; i++) {
        double s = 0;
        for (int p = 0; p < hw; p++) s += x[i * hw + p];
        y[i] = (float)(s / hw);
    }
    return RT_OK;
}

rt_status rt_cpu_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, float *dx) {
    (void)ctx;
    const float inv = 1.0f / (float)hw;
    for (size_t i = 0; i < (size_t)n * c; i++) {
        float g = dy[i] * inv;
        for (int p = 0; p < hw; p++) dx[i * hw + p] = g;
    }
    return RT_OK;
}

/* ---- linear ------------------------------------------------------------------------ */

rt_status rt_cpu_linear_forward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y) {
    if (ctx->precision == RT_PRECISION_BF16) return rt_cpu_linear_forward_bf16(ctx, l, n, x, y);
    const float *w = rt_tensor_data(&l->weight), *b = rt_tensor_data(&l->bias);
    for (int i = 0; i < n; i++) memcpy(y + (size_t)i * l->out_f, b, sizeof(float) * (size_t)l->out_f);
    /* y (n, out) += x (n, in) W^T (in, out) */
    rt_cpu_sgemm(false, true, n, l->out_f, l->in_f, 1.0f, x, l->in_f, w, l->in_f, 1.0f, y, l->out_f);
    return RT_OK;
}

rt_status rt_cpu_linear_backward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy, float *dx) {
    if (ctx->precision == RT_PRECISION_BF16) return rt_cpu_linear_backward_bf16(ctx, l, n, x, dy, dx);
    const float *w = rt_tensor_data(&l->weight);
    float *dw = rt_tensor_data(&l->dweight), *db = rt_tensor_data(&l->dbias);
    /* dW (out, in) = dy^T (out, n) x (n, in) */
    rt_cpu_sgemm(true, false, l->out_f, l->in_f, n, 1.0f, dy, l->out_f, x, l->in_f, 0.0f, dw, l->in_f);
    for (int o = 0; o < l->out_f; o++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += dy[(size_t)i * l->out_f + o];
        db[o] = (float)s;
    }
    /* dx (n, in) = dy (n, out) W (out, in) */
    if (dx) rt_cpu_sgemm(false, false, n, l->in_f, l->out_f, 1.0f, dy, l->out_f, w, l->in_f, 0.0f, dx, l->in_f);
    return RT_OK;
}

/* ---- dropout ----------------------------------------------------------------------- */

rt_status rt_cpu_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, const float *x, float *y) {
    (void)ctx;
    const size_t draws = (size_t)n * (size_t)l->features / (size_t)l->plane;
    const float scale = 1.0f / (1.0f - l->p);
    for (size_t i = 0; i < draws; i++) {
        float u = rt_philox_uniform_at(l->seed, l->subseq, l->counter + i);
        l->mask[i] = u < l->p ? 0.0f : scale;
    }
    const size_t count = (size_t)n * (size_t)l->features;
    for (size_t j = 0; j < count; j++) y[j] = x[j] * l->mask[j / (size_t)l->plane];
    return RT_OK;
}

rt_status rt_cpu_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, const float *dy, float *dx) {
    (void)ctx;
    const size_t count = (size_t)n * (size_t)l->features;
    for (size_t j = 0; j < count; j++) dx[j] = dy[j] * l->mask[j / (size_t)l->plane];
    return RT_OK;
}

/* ---- losses ------------------------------------------------------------------------ */

static rt_status check_labels(int n, int k, const int64_t *labels) {
    for (int i = 0; i < n; i++)
        RT_REQUIRE(labels[i] >= 0 && labels[i] < k, RT_ERR_INVALID, "label %" PRId64 " of sample %d is outside [0, %d)",
                   labels[i], i, k);
    return RT_OK;
}

static double row_logsumexp(const float *x, int k) {
    float m = -INFINITY;
    for (int j = 0; j < k; j++) m = x[j] > m ? x[j] : m;
    double s = 0;
    for (int j = 0; j < k; j++) s += exp((double)x[j] - m);
    return m + log(s);
}

/* eps = 0: exactly the unsmoothed formulas (no smoothing terms are added) */
rt_status rt_cpu_softmax_xent(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels, double eps,
                              float *loss, float *dlogits) {
    (void)ctx;
    RT_CHECK(check_labels(n, k, labels));
    double total = 0;
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * k;
        double lse = row_logsumexp(x, k);
        if (eps == 0) {
            total += lse - x[labels[i]];
        } else {
            double sx = 0;
            for (int j = 0; j < k; j++) sx += x[j];
            total += lse - (1.0 - eps) * x[labels[i]] - eps * (sx / k);
        }
        if (dlogits) {
            float *d = dlogits + (size_t)i * k;
            if (eps == 0)
                for (int j = 0; j < k; j++) d[j] = (float)((exp((double)x[j] - lse) - (j == labels[i])) / n);
            else
                for (int j = 0; j < k; j++)
                    d[j] = (float)((exp((double)x[j] - lse) - (1.0 - eps) * (j == labels[i]) - eps / k) / n);
        }
    }
    *loss = (float)(total / n);
    return RT_OK;
}

rt_status rt_cpu_log_softmax_forward(rt_model_ctx *ctx, int n, int k, const float *x, float *y) {
    (void)ctx;
    for (int i = 0; i < n; i++) {
        double lse = row_logsumexp(x + (size_t)i * k, k);
        for (int j = 0; j < k; j++) y[(size_t)i * k + j] = (float)(x[(size_t)i * k + j] - lse);
    }
    return RT_OK;
}

rt_status rt_cpu_log_softmax_backward(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy, float *dx) {
    (void)ctx;
    for (int i = 0; i < n; i++) {
        const float *yr = y + (size_t)i * k, *dyr = dy + (size_t)i * k;
        float *dxr = dx + (size_t)i * k;
        double s = 0;
        for (int j = 0; j < k; j++) s += dyr[j];
        for (int j = 0; j < k; j++) dxr[j] = (float)(dyr[j] - exp((double)yr[j]) * s);
    }
    return RT_OK;
}

rt_status rt_cpu_nll_loss(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                          float *dlogp) {
    (void)ctx;
    RT_CHECK(check_labels(n, k, labels));
    double total = 0;
    for (int i = 0; i < n; i++) total -= logp[(size_t)i * k + labels[i]];
    *loss = (float)(total / n);
    if (dlogp) {
        memset(dlogp, 0, sizeof(float) * (size_t)n * k);
        for (int i = 0; i < n; i++) dlogp[(size_t)i * k + labels[i]] = -1.0f / (float)n;
    }
    return RT_OK;
}
