/* The CUDA convolutions in the NHWC activation formats (issue 41 item 1; conv_cuda.c,
 * docs/gpu.md "Activation formats: convolutions") against the CPU backend.
 *
 * fp32 NHWC (precision fp32: the emulated and the real cuDNN sum in fp32 without tensor
 * cores, FMA math) against the CPU's fp32 within the fp32 GPU tests' bounds (1e-5
 * forward, 1e-4 gradients, max-norm relative). bf16 NHWC (precision bf16) against the
 * CPU's bf16 precision, the inputs rounded to bf16 on the host first (the activations
 * are bf16 on the GPU; the CPU's bf16 convolution rounds x, W and dy, which are then
 * exact, and rounds y and dx once). Both sides sum the same K exact bf16 x bf16 products
 * in fp32: each within K 2^-24 A of the exact sum (A: the sum of |products|, computed by
 * the CPU in fp32 from |x|, |W|, |b|, |dy|), so the two sums differ by at most K 2^-23 A;
 * rounding both to bf16 moves each by at most half an ulp, so
 *     |gpu - cpu| <= ulp_bf16(max(|gpu|, |cpu|)) + K 2^-22 A + 2^-22 |cpu|
 * (test_gpu_bf16.c's bound: a factor 2 of margin on the sum term). dW: the GPU's is
 * cuDNN's bf16 dw (one rounding the CPU's fp32 sum lacks: within the ulp term); db: fp32
 * sums of the same bf16 dy on both sides (the sum term alone). dx accumulated: the GPU
 * rounds dx0 + conv once (cuDNN's beta 1, the stored dx is bf16), the CPU adds round(conv)
 * to dx0 in fp32: the two differ by at most half an ulp of the part, half an ulp of the
 * result, and the sum term: ulp(part) + ulp(result) + K 2^-22 A + 2^-22 |cpu|.
 * K: taps (x_c k^2 + 1 with a bias; the padded channels add exact zeros) for y, out_c k^2
 * for dx, n oh ow for dW and db.
 *
 * Cases: a 3x3 with bias, a strided one without, the stem (3 input channels stored as 4
 * (fp32) or 8 (bf16), the padding zeros in x and in the weight copy), each at the
 * prepared batch and a smaller one (the spare descriptors); the NCHW fallback where the
 * emulated cuDNN refuses NHWC (RINGTRAIN_EMU_CUDNN_REFUSE=fwd:nhwc and data:nhwc); the
 * weight copies refreshed after the fp32 weights change (two convolutions, one launch);
 * a preset recorded with the other layout (an error naming the shape).
 *
 * Activations are written and read here on the host (NCHW fp32 <-> the stored format:
 * NHWC, bf16 or fp32, padded channels zero): an oracle of the layout independent of the
 * backend's conversion kernels.
 */
#include "gpu_test_util.h"

#ifdef RT_HAVE_CUDA
#include "model/cuda/cuda_internal.h" /* rt_cuda_conv2d_nhwc */
#endif

#include "core/bf16.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static rt_model_ctx *g_cpu16;  /* CPU bf16 */
static rt_model_ctx *g_gpu16;  /* GPU bf16 NHWC */
static const rt_act_format k_f32 = {RT_F32, RT_ACT_NHWC, 4}, k_bf16 = {RT_BF16, RT_ACT_NHWC, 8};

/* a context in format f: given at creation where the backend takes it, else set on a
 * context created with the default (before the backend's act_supported lands; the
 * convolutions read ctx->act only) */
static rt_model_ctx *fmt_ctx(rt_precision prec, const rt_act_format *f) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = gt_gpu_device(), .threads = 4, .precision = prec, .act_format = f};
    if (rt_model_ctx_create(&o, &ctx) == RT_OK) return ctx;
    rt_error_clear();
    o.act_format = NULL;
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    ctx->act = *f;
    return ctx;
}

static int setup(void **state) {
    (void)state;
    g_cpu = gt_ctx(rt_device_cpu(), RT_PRECISION_FP32);
    g_cpu16 = gt_ctx(rt_device_cpu(), RT_PRECISION_BF16);
    g_gpu = fmt_ctx(RT_PRECISION_FP32, &k_f32);
    g_gpu16 = fmt_ctx(RT_PRECISION_BF16, &k_bf16);
    return 0;
}
static int teardown(void **state) {
    rt_model_ctx_destroy(g_gpu16);
    rt_model_ctx_destroy(g_cpu16);
    return gt_teardown(state);
}

/* ---- activations in the stored format, on the host ------------------------------------ */

static bool is16(const rt_model_ctx *ctx) { return ctx->act.dtype == RT_BF16; }

/* fp32 NCHW (n, c, plane) -> a device buffer in ctx's format with sc channels (zeros past c) */
/* n images uploaded, followed by 2 images of NaN (0xff bytes): the buffers hold max_n
 * images (layers.h), and bf16 runs a smaller batch at max_n over zeroed tails */
static void *act_up(rt_model_ctx *ctx, const float *h, int n, int c, size_t plane, int sc) {
    const size_t es = is16(ctx) ? 2 : 4, total = (size_t)(n + 2) * sc * plane;
    unsigned char *b = calloc(total, es);
    memset(b + (size_t)n * sc * plane * es, 0xff, 2 * (size_t)sc * plane * es);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (size_t p = 0; p < plane; p++) {
                const float v = h[((size_t)i * c + ch) * plane + p];
                const size_t at = ((size_t)i * plane + p) * sc + ch;
                if (es == 2)
                    ((uint16_t *)b)[at] = rt_bf16_from_f32(v);
                else
                    ((float *)b)[at] = v;
            }
    void *d = gt_dev(total * es);
    gt_upload(d, b, total * es);
    free(b);
    return d;
}

/* the device buffer (ctx's format, sc channels) -> fp32 NCHW (n, c, plane); the padded
 * channels must hold zeros (a stem's dx there: the zero weights of the padded channels) */
static float *act_down(rt_model_ctx *ctx, const void *d, int n, int c, size_t plane, int sc) {
    const size_t es = is16(ctx) ? 2 : 4, total = (size_t)n * sc * plane;
    unsigned char *b = malloc(total * es);
    gt_download(b, d, total * es);
    float *h = rt_test_floats((size_t)n * c * plane);
    for (size_t i = 0; i < (size_t)n * plane; i++)
        for (int ch = c; ch < sc; ch++) {
            const float v = es == 2 ? rt_bf16_to_f32(((uint16_t *)b)[i * sc + ch]) : ((float *)b)[i * sc + ch];
            if (v != 0.0f) fail_msg("padded channel %d of position %zu holds %g, not 0", ch, i, (double)v);
        }
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (size_t p = 0; p < plane; p++) {
                const size_t at = ((size_t)i * plane + p) * sc + ch;
                h[((size_t)i * c + ch) * plane + p] = es == 2 ? rt_bf16_to_f32(((uint16_t *)b)[at]) : ((float *)b)[at];
            }
    free(b);
    return h;
}

static float *rounded(const float *x, size_t n, bool bf16, bool absolute) {
    float *p = rt_test_floats(n);
    for (size_t i = 0; i < n; i++) {
        const float v = bf16 ? rt_bf16_round(x[i]) : x[i];
        p[i] = absolute ? fabsf(v) : v;
    }
    return p;
}

/* ---- layers: up to two convolutions sharing one parameter arena ----------------------- */

typedef struct side {
    rt_conv2d l[2];
    int nl;
    rt_arena p, g;
    rt_model_ctx *ctx;
    void *wc; /* the weight copies (rt_conv2d_weights_prepare) */
} side;

/* layer i's fp32 weights written from the host (the copies follow at the next refresh) */
static void side_set(side *s, int i, const float *w, const float *b) {
    const rt_conv2d *l = &s->l[i];
    const size_t wn = (size_t)l->out_c * l->in_c * l->k * l->k;
    gt_sync();
    assert_rt_ok(rt_memcpy(rt_tensor_data(&s->l[i].weight), s->ctx->device, w, rt_device_cpu(), wn * 4, NULL));
    if (l->has_bias)
        assert_rt_ok(rt_memcpy(rt_tensor_data(&s->l[i].bias), s->ctx->device, b, rt_device_cpu(),
                               (size_t)l->out_c * 4, NULL));
    gt_sync();
}

/* x_c: the first layer's stored input channels (in an NHWC format; the CPU's are in_c) */
static void side_make(side *s, rt_model_ctx *ctx, const rt_conv2d *shapes, int nl, int x_c, float *const *w,
                      float *const *b, int max_n) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->nl = nl;
    rt_arena_init(&s->p, ctx->device);
    rt_arena_init(&s->g, ctx->device);
    for (int i = 0; i < nl; i++) {
        s->l[i] = shapes[i];
        if (i == 0 && ctx->act.layout == RT_ACT_NHWC) s->l[i].x_c = x_c;
        assert_rt_ok(rt_tensor_place(&s->l[i].weight, &s->p));
        s->l[i].dweight = rt_tensor_in(&s->l[i].weight, &s->g);
        if (shapes[i].has_bias) {
            assert_rt_ok(rt_tensor_place(&s->l[i].bias, &s->p));
            s->l[i].dbias = rt_tensor_in(&s->l[i].bias, &s->g);
        }
    }
    s->g.size = s->p.size;
    assert_rt_ok(rt_arena_alloc(&s->p));
    assert_rt_ok(rt_arena_alloc(&s->g));
    size_t most = 0;
    rt_conv2d *ls[2] = {&s->l[0], &s->l[1]};
    for (int i = 0; i < nl; i++) {
        size_t ws = 0;
        assert_rt_ok(rt_conv2d_prepare(ctx, &s->l[i], max_n, &ws));
        if (ws > most) most = ws;
    }
    assert_rt_ok(rt_model_ctx_reserve(ctx, most));
    assert_rt_ok(rt_conv2d_weights_prepare(ctx, ls, nl, false, &s->wc));
    for (int i = 0; i < nl; i++) side_set(s, i, w[i], b[i]);
    assert_rt_ok(rt_conv2d_weights_refresh(ctx, s->wc));
}

static void side_free(side *s) {
    rt_conv2d_weights_release(s->ctx, s->wc);
    for (int i = 0; i < s->nl; i++) rt_conv2d_release(s->ctx, &s->l[i]);
    rt_arena_free(&s->p);
    rt_arena_free(&s->g);
}

/* ---- comparison ------------------------------------------------------------------------ */

static double bf16_ulp(double v) {
    int e = 0;
    (void)frexp(fabs(v), &e);
    return ldexp(1.0, e - 8);
}

/* gpu (host) against cpu: fp32 within tol (relative, max-norm); bf16 within the header's
 * bound (rounded: the ulp term; part: an accumulated result's rounded part, its ulp too) */
static void check(const char *what, const float *cpu, const float *gpu, size_t n, bool bf16, double tol,
                  const float *A, double K, bool rounded, const float *part) {
    if (!bf16) {
        size_t at = 0;
        const double e = gt_rel_err(cpu, gpu, n, &at);
        printf("  %-48s rel err %.3g (tol %.0e)\n", what, e, tol);
        if (!(e <= tol))
            fail_msg("%s: relative error %.3g > %.0e (element %zu: cpu %.9g gpu %.9g, seed %llu)", what, e, tol, at,
                     (double)cpu[at], (double)gpu[at], (unsigned long long)g_seed);
        return;
    }
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double c = cpu[i], v = gpu[i];
        const double bound = (rounded ? bf16_ulp(fmax(fabs(c), fabs(v))) : 0) +
                             (part ? bf16_ulp(part[i]) : 0) + K * ldexp(A[i], -22) + ldexp(fabs(c), -22);
        const double r = isfinite(v) ? fabs(v - c) / bound : INFINITY;
        if (!(r <= worst)) worst = r, at = i;
    }
    printf("  %-48s err/bound max %.3g\n", what, worst);
    if (!(worst <= 1.0))
        fail_msg("%s: element %zu: cpu %.9g gpu %.9g, %.3g times the bound (A %.6g, K %.0f; seed %llu)", what, at,
                 (double)cpu[at], (double)gpu[at], worst, (double)A[at], K, (unsigned long long)g_seed);
}

static float *dev_floats(const float *d, size_t n) {
    float *h = rt_test_floats(n);
    gt_download(h, d, n * sizeof(float));
    return h;
}

/* ---- one layer, forward and backward --------------------------------------------------- */

typedef struct conv_sides {
    side *C, *G, *A; /* CPU (fp32 or bf16), GPU, CPU fp32 over |terms| (bf16's bound) */
    int li;          /* the layer */
} conv_sides;

/* y, dx written, dx accumulated, dW and db at batch n */
static void conv_run(const conv_sides *S, int n, const char *name) {
    rt_conv2d *lc = &S->C->l[S->li], *lg = &S->G->l[S->li], *la = &S->A->l[S->li];
    rt_model_ctx *gctx = S->G->ctx;
    const bool bf16 = is16(gctx);
    const int xc = lg->x_c;
    const size_t xp = (size_t)lc->in_h * lc->in_w, yp = (size_t)lc->out_h * lc->out_w;
    const size_t xn = (size_t)n * lc->in_c * xp, yn = (size_t)n * lc->out_c * yp;
    const size_t wn = (size_t)lc->out_c * lc->in_c * lc->k * lc->k;
    const double k_y = (double)xc * lc->k * lc->k + lc->has_bias, k_dx = (double)lc->out_c * lc->k * lc->k;
    const double k_dw = (double)n * yp;
    char what[160];
    float *r0 = rt_test_randn(xn, 1.0f), *r1 = rt_test_randn(yn, 1.0f), *r2 = rt_test_randn(xn, 1.0f);
    float *hx = rounded(r0, xn, bf16, false), *hdy = rounded(r1, yn, bf16, false), *hdx0 = rounded(r2, xn, bf16, false);
    float *ax = rounded(hx, xn, false, true), *ady = rounded(hdy, yn, false, true);
    float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *ay = rt_test_nans(yn), *adx = rt_test_nans(xn);
    void *gx = act_up(gctx, hx, n, lc->in_c, xp, xc), *gdy = act_up(gctx, hdy, n, lc->out_c, yp, lc->out_c);
    const size_t yn2 = (size_t)(n + 2) * lc->out_c * yp, dxn2 = (size_t)(n + 2) * xc * xp; /* max_n images */
    void *gy = gt_dev(yn2 * 4), *gdx = gt_dev(dxn2 * 4);
    gt_poison(gy, yn2 * 4), gt_poison(gdx, dxn2 * 4);
    gt_poison(rt_tensor_data(&lg->dweight), wn * 4);
    if (lc->has_bias) gt_poison(rt_tensor_data(&lg->dbias), (size_t)lc->out_c * 4);

    assert_rt_ok(rt_conv2d_forward(g_cpu, la, n, (rt_act *)ax, (rt_act *)ay));
    assert_rt_ok(rt_conv2d_backward(g_cpu, la, n, (rt_act *)ax, (rt_act *)ady, (rt_act *)adx, false));
    assert_rt_ok(rt_conv2d_forward(S->C->ctx, lc, n, (rt_act *)hx, (rt_act *)cy));
    assert_rt_ok(rt_conv2d_forward(gctx, lg, n, gx, gy));
    float *y = act_down(gctx, gy, n, lc->out_c, yp, lc->out_c);
    snprintf(what, sizeof what, "%s n=%d y", name, n);
    check(what, cy, y, yn, bf16, TOL_FWD, ay, k_y, true, NULL);

    assert_rt_ok(rt_conv2d_backward(S->C->ctx, lc, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, false));
    assert_rt_ok(rt_conv2d_backward(gctx, lg, n, gx, gdy, gdx, false));
    float *dx = act_down(gctx, gdx, n, lc->in_c, xp, xc);
    snprintf(what, sizeof what, "%s n=%d dx", name, n);
    check(what, cdx, dx, xn, bf16, TOL_GRAD, adx, k_dx, true, NULL);
    float *dw = dev_floats(rt_tensor_data(&lg->dweight), wn);
    snprintf(what, sizeof what, "%s n=%d dweight", name, n);
    check(what, rt_tensor_data(&lc->dweight), dw, wn, bf16, TOL_GRAD, rt_tensor_data(&la->dweight), k_dw, true, NULL);
    if (lc->has_bias) {
        float *db = dev_floats(rt_tensor_data(&lg->dbias), (size_t)lc->out_c);
        snprintf(what, sizeof what, "%s n=%d dbias", name, n);
        check(what, rt_tensor_data(&lc->dbias), db, (size_t)lc->out_c, bf16, TOL_GRAD, rt_tensor_data(&la->dbias),
              k_dw, false, NULL);
        free(db);
    }

    /* accumulated into dx0 (bf16 where the activations are) */
    float *part = rt_test_floats(xn);
    memcpy(part, cdx, xn * 4);
    memcpy(cdx, hdx0, xn * 4);
    gt_free(gdx);
    gdx = act_up(gctx, hdx0, n, lc->in_c, xp, xc);
    assert_rt_ok(rt_conv2d_backward(S->C->ctx, lc, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, true));
    assert_rt_ok(rt_conv2d_backward(gctx, lg, n, gx, gdy, gdx, true));
    free(dx);
    dx = act_down(gctx, gdx, n, lc->in_c, xp, xc);
    snprintf(what, sizeof what, "%s n=%d dx accumulated", name, n);
    check(what, cdx, dx, xn, bf16, TOL_GRAD, adx, k_dx, true, part);

    free(r0), free(r1), free(r2), free(hx), free(hdy), free(hdx0), free(ax), free(ady), free(cy), free(cdx);
    free(ay), free(adx), free(y), free(dx), free(dw), free(part);
    gt_free(gx), gt_free(gdy), gt_free(gy), gt_free(gdx);
}

/* the weights and biases of a layer (bf16-rounded where bf16, so both sides hold the same) */
static void make_params(const rt_conv2d *l, bool bf16, float **w, float **b) {
    const size_t wn = (size_t)l->out_c * l->in_c * l->k * l->k;
    float *rw = rt_test_randn(wn, (float)(1.0 / sqrt((double)l->in_c * l->k * l->k)));
    float *rb = rt_test_randn((size_t)l->out_c, 0.5f);
    *w = rounded(rw, wn, bf16, false), *b = rounded(rb, (size_t)l->out_c, bf16, false);
    free(rw), free(rb);
}

/* one shape on the GPU context gctx, its batch max_n and a smaller one; expect_nhwc: the
 * layer runs cuDNN on NHWC (else the NCHW fallback) */
static void conv_case(rt_model_ctx *gctx, int max_n, int in_c, int out_c, int hw, int k, int s, int pad, bool bias,
                      bool expect_nhwc) {
    const bool bf16 = is16(gctx);
    rt_conv2d shape;
    assert_rt_ok(rt_conv2d_init(&shape, in_c, out_c, hw, hw, k, s, pad, bias));
    float *w, *b;
    make_params(&shape, bf16, &w, &b);
    float *aw = rounded(w, (size_t)out_c * in_c * k * k, false, true), *ab = rounded(b, (size_t)out_c, false, true);
    side C, G, A;
    const int xc = rt_act_input_channels(gctx, in_c);
    side_make(&C, bf16 ? g_cpu16 : g_cpu, &shape, 1, in_c, &w, &b, max_n);
    side_make(&G, gctx, &shape, 1, xc, &w, &b, max_n);
    side_make(&A, g_cpu, &shape, 1, in_c, &aw, &ab, max_n);
#ifdef RT_HAVE_CUDA
    if (rt_device_is_cuda(gctx->device)) assert_int_equal(rt_cuda_conv2d_nhwc(&G.l[0]), expect_nhwc);
#endif
    char name[128];
    snprintf(name, sizeof name, "%s conv %d(x_c %d)->%d %dx%d k%d s%d%s%s", bf16 ? "bf16" : "fp32", in_c, G.l[0].x_c,
             out_c, hw, hw, k, s, bias ? " bias" : "", expect_nhwc ? "" : " fallback");
    const conv_sides S = {&C, &G, &A, 0};
    conv_run(&S, max_n, name);
    conv_run(&S, max_n - 2, name); /* the spare descriptors */
    side_free(&C), side_free(&G), side_free(&A);
    free(w), free(b), free(aw), free(ab);
}

static void cases(rt_model_ctx *gctx, bool expect_nhwc) {
    conv_case(gctx, 5, 8, 16, 6, 3, 1, 1, true, expect_nhwc);
    conv_case(gctx, 4, 16, 8, 7, 3, 2, 1, false, expect_nhwc);
    conv_case(gctx, 4, 3, 8, 8, 3, 1, 1, true, expect_nhwc); /* the stem: 3 channels stored as 4 or 8 */
}

static void test_conv_f32_nhwc(void **state) {
    (void)state;
    cases(g_gpu, true);
}

static void test_conv_bf16_nhwc(void **state) {
    (void)state;
    cases(g_gpu16, true);
}

/* cuDNN refusing NHWC (the emulated one, by request): each layer converts around itself */
static void test_conv_nhwc_refused(void **state) {
    (void)state;
#ifdef RT_EMU_FULL_RUNTIME
    setenv("RINGTRAIN_EMU_CUDNN_REFUSE", "fwd:nhwc,data:nhwc,filter:nhwc", 1);
    rt_model_ctx *f = fmt_ctx(RT_PRECISION_FP32, &k_f32), *h = fmt_ctx(RT_PRECISION_BF16, &k_bf16);
    cases(f, false);
    cases(h, false);
    rt_model_ctx_destroy(f), rt_model_ctx_destroy(h);
#else
    printf("  (a real cuDNN cannot be made to refuse: the emulated GPUs test the fallback)\n");
#endif
}

static int refusal_off(void **state) {
    (void)state;
    unsetenv("RINGTRAIN_EMU_CUDNN_REFUSE"); /* also after a failure: the next tests run without */
    return 0;
}

/* The copies follow the fp32 weights: two convolutions in one arena (one refresh launch
 * writes both), new weights written into the arena from the host and refreshed: the second
 * forward uses them (a refresh that stops after its first call fails here). */
static void refresh_on(rt_model_ctx *gctx) {
    const bool bf16 = is16(gctx);
    rt_conv2d shapes[2];
    assert_rt_ok(rt_conv2d_init(&shapes[0], 3, 8, 6, 6, 3, 1, 1, true));
    assert_rt_ok(rt_conv2d_init(&shapes[1], 8, 8, 6, 6, 3, 1, 1, false));
    float *w[2], *b[2], *w2[2], *b2[2], *aw[2], *ab[2];
    for (int i = 0; i < 2; i++) {
        make_params(&shapes[i], bf16, &w[i], &b[i]);
        make_params(&shapes[i], bf16, &w2[i], &b2[i]);
        aw[i] = rounded(w2[i], (size_t)shapes[i].out_c * shapes[i].in_c * 9, false, true);
        ab[i] = rounded(b2[i], 8, false, true);
    }
    side C, G, A;
    side_make(&C, bf16 ? g_cpu16 : g_cpu, shapes, 2, 3, w2, b2, 4);
    side_make(&G, gctx, shapes, 2, rt_act_input_channels(gctx, 3), w, b, 4);
    side_make(&A, g_cpu, shapes, 2, 3, aw, ab, 4);
    /* a forward with the first weights, then the new ones */
    const size_t xn = (size_t)4 * 8 * 36;
    float *r = rt_test_randn(xn, 1.0f), *hx = rounded(r, xn, bf16, false);
    free(r);
    void *gx = act_up(gctx, hx, 4, 8, 36, 8), *gy = gt_dev(xn * 4);
    assert_rt_ok(rt_conv2d_forward(gctx, &G.l[1], 4, gx, gy));
    for (int i = 0; i < 2; i++) side_set(&G, i, w2[i], b2[i]);
    assert_rt_ok(rt_conv2d_weights_refresh(gctx, G.wc));
    const conv_sides S0 = {&C, &G, &A, 0}, S1 = {&C, &G, &A, 1};
    conv_run(&S0, 4, bf16 ? "bf16 refreshed stem" : "fp32 refreshed stem");
    conv_run(&S1, 4, bf16 ? "bf16 refreshed second conv" : "fp32 refreshed second conv");
    side_free(&C), side_free(&G), side_free(&A);
    for (int i = 0; i < 2; i++) free(w[i]), free(b[i]), free(w2[i]), free(b2[i]), free(aw[i]), free(ab[i]);
    free(hx), gt_free(gx), gt_free(gy);
}

static void test_conv_weights_refresh(void **state) {
    (void)state;
    refresh_on(g_gpu);
    refresh_on(g_gpu16);
}

/* A preset recorded with the other layout: an error naming the shape, not a search. */
static void mismatch_on(rt_model_ctx *gctx, int nhwc, const char *expect) {
    rt_conv2d l;
    assert_rt_ok(rt_conv2d_init(&l, 8, 8, 6, 6, 3, 1, 1, false));
    rt_conv_algos pre = {.n = 1};
    pre.a[0] = (rt_conv_algo){.in_c = 8, .out_c = 8, .in_h = 6, .in_w = 6, .k = 3, .stride = 1, .pad = 1, .n = 4,
                              .precision = (int)gctx->precision, .fwd = 0, .bwd_data = 1, .bwd_filter = 1,
                              .fwd_math = 3, .bwd_data_math = 3, .bwd_filter_math = 3, .nhwc = nhwc};
    assert_rt_ok(rt_model_ctx_set_conv_algos(gctx, &pre));
    rt_arena p;
    rt_arena_init(&p, gctx->device);
    assert_rt_ok(rt_tensor_place(&l.weight, &p));
    assert_rt_ok(rt_arena_alloc(&p));
    size_t ws = 0;
    const rt_status st = rt_conv2d_prepare(gctx, &l, 4, &ws);
    printf("  %s\n", rt_error_message());
    assert_int_equal(st, RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "layout mismatch"));
    assert_non_null(strstr(rt_error_message(), "conv2d 8->8 6x6 k3 s1 p1 n4"));
    assert_non_null(strstr(rt_error_message(), expect));
    rt_error_clear();
    rt_conv2d_release(gctx, &l);
    rt_arena_free(&p);
}

static void test_conv_preset_layout_mismatch(void **state) {
    (void)state;
    rt_model_ctx *f = fmt_ctx(RT_PRECISION_FP32, &k_f32);
    mismatch_on(f, 0, "recorded for NCHW tensors, this run gives cuDNN NHWC ones");
    rt_model_ctx_destroy(f);
    /* fp32 NCHW activations (fp32 precision) and a record made for NHWC */
    rt_model_ctx *n = gt_ctx(gt_gpu_device(), RT_PRECISION_FP32);
    if (rt_device_is_cuda(n->device)) mismatch_on(n, 1, "recorded for NHWC tensors, this run gives cuDNN NCHW ones");
    rt_model_ctx_destroy(n);
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_f32_nhwc),
        cmocka_unit_test(test_conv_bf16_nhwc),
        cmocka_unit_test_teardown(test_conv_nhwc_refused, refusal_off),
        cmocka_unit_test(test_conv_weights_refresh),
        cmocka_unit_test(test_conv_preset_layout_mismatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
