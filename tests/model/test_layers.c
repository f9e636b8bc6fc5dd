/* Finite-difference gradient checks for every layer of the CPU backend.
 *
 * Each check evaluates L = sum(r * layer(x)) (r fixed random) in double from the
 * layer's float32 output, and compares (L(a+eps) - L(a-eps)) / 2eps with the analytic
 * gradient from backward (called with dy = r) for inputs and parameters.
 *
 * Tolerance, float32 with eps = 1e-2: conv/linear/pool/add are linear in each input,
 * so the difference quotient is exact up to rounding: the output floats carry a
 * relative error ~6e-8, summed over <= 2000 outputs of magnitude <= ~10 that is
 * <= ~1e-5 in L, i.e. <= ~1e-3 after dividing by 2 eps. Batch norm and the losses are
 * smooth; their O(eps^2) truncation term is ~1e-4 relative. A bound of
 * 1e-3 + 5e-3 * max|g| therefore leaves room for rounding and fails on any real error
 * (a wrong term is O(max|g|)). ReLU and max pooling are only checked away from their
 * kinks: inputs are kept >= 0.05 from 0 and window values distinct by >= 0.05.
 */
#include "model_test_util.h"

#include <stdlib.h>

#define EPS 1e-2f
#define RTOL 5e-3
#define ATOL 1e-3

static float *alloc_f(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

/* ---- conv2d ------------------------------------------------------------------------ */

typedef struct conv_case {
    rt_conv2d l;
    int n;
    float *x, *y, *r;
    size_t xn, yn;
} conv_case;

static double conv_eval(void *u) {
    conv_case *c = u;
    assert_rt_ok(rt_conv2d_forward(g_ctx, &c->l, c->n, (rt_act *)c->x, (rt_act *)c->y));
    return mt_dot(c->y, c->r, c->yn);
}

static void check_conv(int n, int in_c, int out_c, int h, int w, int k, int s, int p, bool bias) {
    conv_case c = {.n = n};
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_conv2d_init(&c.l, in_c, out_c, h, w, k, s, p, bias));
    mt_place(&A, &c.l.weight, &c.l.dweight);
    if (bias) mt_place(&A, &c.l.bias, &c.l.dbias);
    mt_alloc(&A);
    size_t ws;
    assert_rt_ok(rt_conv2d_prepare(g_ctx, &c.l, n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_ctx, ws));
    c.xn = (size_t)n * in_c * h * w;
    c.yn = (size_t)n * out_c * c.l.out_h * c.l.out_w;
    c.x = alloc_f(c.xn);
    c.y = alloc_f(c.yn);
    c.r = alloc_f(c.yn);
    float *dx = alloc_f(c.xn), *dx2 = alloc_f(c.xn);
    mt_randn(c.x, c.xn, 1);
    mt_randn(c.r, c.yn, 2);
    float *wt = rt_tensor_data(&c.l.weight);
    mt_randn(wt, (size_t)rt_tensor_numel(&c.l.weight), 3);
    if (bias) mt_randn(rt_tensor_data(&c.l.bias), (size_t)out_c, 4);
    assert_rt_ok(rt_conv2d_forward(g_ctx, &c.l, n, (rt_act *)c.x, (rt_act *)c.y));
    assert_rt_ok(rt_conv2d_backward(g_ctx, &c.l, n, (rt_act *)c.x, (rt_act *)c.r, (rt_act *)dx, false));
    char what[96];
    snprintf(what, sizeof what, "conv k%d s%d p%d %dx%d dx", k, s, p, h, w);
    int fails = mt_fd_check(what, c.x, dx, c.xn, 60, EPS, RTOL, ATOL, conv_eval, &c);
    snprintf(what, sizeof what, "conv k%d s%d p%d %dx%d dW", k, s, p, h, w);
    fails += mt_fd_check(what, wt, rt_tensor_data(&c.l.dweight), (size_t)rt_tensor_numel(&c.l.weight), 60, EPS, RTOL,
                         ATOL, conv_eval, &c);
    if (bias)
        fails += mt_fd_check("conv db", rt_tensor_data(&c.l.bias), rt_tensor_data(&c.l.dbias), (size_t)out_c, 60, EPS,
                             RTOL, ATOL, conv_eval, &c);
    /* accumulate adds to what dx holds (after a forward with the unperturbed weights:
     * backward's contract) */
    assert_rt_ok(rt_conv2d_forward(g_ctx, &c.l, n, (rt_act *)c.x, (rt_act *)c.y));
    for (size_t i = 0; i < c.xn; i++) dx2[i] = 1.0f;
    assert_rt_ok(rt_conv2d_backward(g_ctx, &c.l, n, (rt_act *)c.x, (rt_act *)c.r, (rt_act *)dx2, true));
    for (size_t i = 0; i < c.xn; i++) assert_float_equal(dx2[i], dx[i] + 1.0f, 1e-4);
    assert_int_equal(fails, 0);
    free(c.x);
    free(c.y);
    free(c.r);
    free(dx);
    free(dx2);
    rt_conv2d_release(g_ctx, &c.l);
    mt_free(&A);
}

static void test_conv2d(void **state) {
    (void)state;
    check_conv(2, 3, 4, 6, 5, 3, 1, 1, false); /* BasicBlock 3x3 */
    check_conv(2, 2, 3, 9, 9, 7, 2, 3, false); /* imagenet stem */
    check_conv(3, 4, 5, 5, 5, 1, 2, 0, false); /* downsample 1x1/2 */
    check_conv(2, 2, 3, 8, 8, 5, 1, 0, true);  /* Net 5x5 with bias */
    check_conv(2, 3, 2, 4, 4, 3, 2, 1, false); /* 3x3/2 */
    check_conv(3, 4, 3, 1, 1, 3, 1, 1, false); /* 1x1 input: only the centre tap is live */
    check_conv(3, 4, 5, 2, 2, 3, 2, 1, true);  /* 2x2 -> 1x1 stride 2: four live taps */
    check_conv(3, 4, 5, 2, 2, 3, 1, 1, true);  /* 2x2 -> 2x2: the unrolled dense path */
    check_conv(2, 3, 4, 2, 3, 3, 1, 1, false); /* 2x3: dense, not square */
}

/* a workspace too small for one image is an error, not a crash */
static void test_conv2d_workspace_error(void **state) {
    (void)state;
    rt_model_ctx *ctx = mt_ctx(1);
    rt_conv2d l;
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_conv2d_init(&l, 3, 4, 8, 8, 3, 1, 1, false));
    mt_place(&A, &l.weight, &l.dweight);
    mt_alloc(&A);
    float x[3 * 64] = {0}, y[4 * 64];
    assert_int_equal(rt_conv2d_forward(ctx, &l, 1, (rt_act *)x, (rt_act *)y), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "prepare"));
    size_t ws;
    assert_rt_ok(rt_conv2d_prepare(ctx, &l, 1, &ws));
    assert_int_equal(rt_conv2d_forward(ctx, &l, 1, (rt_act *)x, (rt_act *)y), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "workspace"));
    rt_conv2d_release(ctx, &l);
    assert_int_equal(rt_conv2d_init(&l, 3, 4, 2, 2, 7, 1, 0, false), RT_ERR_INVALID);
    mt_free(&A);
    rt_model_ctx_destroy(ctx);
}

/* ---- batchnorm2d ------------------------------------------------------------------- */

typedef struct bn_case {
    rt_batchnorm2d l;
    int n;
    float *x, *y, *r;
    size_t cnt;
} bn_case;

static double bn_eval(void *u) {
    bn_case *c = u;
    assert_rt_ok(rt_batchnorm2d_forward(g_ctx, &c->l, c->n, (rt_act *)c->x, (rt_act *)c->y, true));
    return mt_dot(c->y, c->r, c->cnt);
}

/* batch norm's training forward against the formulas, backward by finite differences,
 * evaluation forward against the formula; planes of C x H x W, n images */
static void check_batchnorm2d(int C, int H, int W, int n) {
    bn_case c = {.n = n};
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_batchnorm2d_init(&c.l, C, H, W));
    mt_place(&A, &c.l.weight, &c.l.dweight);
    mt_place(&A, &c.l.bias, &c.l.dbias);
    assert_rt_ok(rt_tensor_place(&c.l.running_mean, &A.buffers));
    assert_rt_ok(rt_tensor_place(&c.l.running_var, &A.buffers));
    assert_rt_ok(rt_tensor_place(&c.l.num_batches_tracked, &A.buffers));
    mt_alloc(&A);
    float save_m[8], save_i[8];
    assert_true(C <= 8);
    c.l.save_mean = save_m;
    c.l.save_invstd = save_i;
    c.cnt = (size_t)c.n * C * H * W;
    c.x = alloc_f(c.cnt);
    c.y = alloc_f(c.cnt);
    c.r = alloc_f(c.cnt);
    float *dx = alloc_f(c.cnt);
    mt_randn(c.x, c.cnt, 11);
    for (size_t i = 0; i < c.cnt; i++) c.x[i] = 2.0f * c.x[i] + 0.5f;
    mt_randn(c.r, c.cnt, 12);
    float *gamma = rt_tensor_data(&c.l.weight), *beta = rt_tensor_data(&c.l.bias);
    mt_randn(gamma, C, 13);
    mt_randn(beta, C, 14);
    float *rm = rt_tensor_data(&c.l.running_mean), *rv = rt_tensor_data(&c.l.running_var);
    for (int i = 0; i < C; i++) rv[i] = 1.0f;
    /* running statistics after one training forward: momentum 0.1, unbiased variance */
    assert_rt_ok(rt_batchnorm2d_forward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)c.y, true));
    const int M = c.n * H * W;
    for (int ch = 0; ch < C; ch++) {
        double s = 0, ss = 0;
        for (int i = 0; i < c.n; i++)
            for (int p = 0; p < H * W; p++) s += c.x[(i * C + ch) * H * W + p];
        double mean = s / M;
        for (int i = 0; i < c.n; i++)
            for (int p = 0; p < H * W; p++) ss += pow(c.x[(i * C + ch) * H * W + p] - mean, 2);
        assert_float_equal(rm[ch], 0.1 * mean, 1e-6);
        assert_float_equal(rv[ch], 0.9 + 0.1 * ss / (M - 1), 1e-6);
        /* normalised output: mean beta, biased std |gamma| (up to eps) */
        double ys = 0, yss = 0;
        for (int i = 0; i < c.n; i++)
            for (int p = 0; p < H * W; p++) ys += c.y[(i * C + ch) * H * W + p];
        ys /= M;
        for (int i = 0; i < c.n; i++)
            for (int p = 0; p < H * W; p++) yss += pow(c.y[(i * C + ch) * H * W + p] - ys, 2);
        assert_float_equal(ys, beta[ch], 1e-5);
        assert_float_equal(sqrt(yss / M), fabs(gamma[ch]) * sqrt(ss / M / (ss / M + 1e-5)), 1e-4);
    }
    assert_int_equal(((int64_t *)rt_tensor_data(&c.l.num_batches_tracked))[0], 1);
    assert_rt_ok(rt_batchnorm2d_backward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)c.r, (rt_act *)dx, false));
    int fails = mt_fd_check("bn dx", c.x, dx, c.cnt, 72, EPS, RTOL, ATOL, bn_eval, &c);
    fails += mt_fd_check("bn dgamma", gamma, rt_tensor_data(&c.l.dweight), C, 4, EPS, RTOL, ATOL, bn_eval, &c);
    fails += mt_fd_check("bn dbeta", beta, rt_tensor_data(&c.l.dbias), C, 4, EPS, RTOL, ATOL, bn_eval, &c);
    assert_int_equal(fails, 0);
    /* evaluation uses the running statistics */
    for (int ch = 0; ch < C; ch++) {
        rm[ch] = 0.25f * ch;
        rv[ch] = 1.0f + ch;
    }
    assert_rt_ok(rt_batchnorm2d_forward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)c.y, false));
    for (size_t i = 0; i < c.cnt; i++) {
        int ch = (int)(i / (H * W)) % C;
        double want = (c.x[i] - rm[ch]) / sqrt(rv[ch] + 1e-5) * gamma[ch] + beta[ch];
        assert_float_equal(c.y[i], want, 1e-5);
    }
    /* one value per channel cannot be normalised in training */
    rt_batchnorm2d one;
    assert_rt_ok(rt_batchnorm2d_init(&one, 1, 1, 1));
    one = c.l;
    one.h = one.w = 1;
    one.c = 1;
    assert_int_equal(rt_batchnorm2d_forward(g_ctx, &one, 1, (rt_act *)c.x, (rt_act *)c.y, true), RT_ERR_INVALID);
    free(c.x);
    free(c.y);
    free(c.r);
    free(dx);
    mt_free(&A);
}

static void test_batchnorm2d(void **state) {
    (void)state;
    check_batchnorm2d(4, 3, 2, 3);   /* small planes: the CPU's row path */
    check_batchnorm2d(2, 17, 16, 2); /* 272 values per plane: the plane-by-plane path */
}

/* ---- fused batch norm (+ residual) (+ relu) ----------------------------------------- */

typedef struct bn_fx {
    rt_batchnorm2d l;
    mt_arenas A;
    float save_m[64], save_i[64];
} bn_fx;

static void bn_fx_init(bn_fx *f, int C, int H, int W) {
    assert_true(C <= 64);
    mt_arenas_init(&f->A);
    assert_rt_ok(rt_batchnorm2d_init(&f->l, C, H, W));
    mt_place(&f->A, &f->l.weight, &f->l.dweight);
    mt_place(&f->A, &f->l.bias, &f->l.dbias);
    assert_rt_ok(rt_tensor_place(&f->l.running_mean, &f->A.buffers));
    assert_rt_ok(rt_tensor_place(&f->l.running_var, &f->A.buffers));
    assert_rt_ok(rt_tensor_place(&f->l.num_batches_tracked, &f->A.buffers));
    mt_alloc(&f->A);
    f->l.save_mean = f->save_m;
    f->l.save_invstd = f->save_i;
    mt_randn(rt_tensor_data(&f->l.weight), (size_t)C, 21);
    mt_randn(rt_tensor_data(&f->l.bias), (size_t)C, 22);
    float *rv = rt_tensor_data(&f->l.running_var);
    for (int i = 0; i < C; i++) rv[i] = 1.0f;
}

static void assert_same_bits(const float *a, const float *b, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu differs: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
}

/* Forward: rt_batchnorm2d_forward_act (fused on the CPU) against batch norm, add and
 * relu one after another, bit for bit, with the running statistics; backward through
 * the ReLU against relu's backward then batch norm's. Both on a context of `threads`;
 * results (y, dx, dgamma, dbeta) returned for the thread-count comparison. */
static void bn_fused_run(int threads, int C, int H, int W, int n, float *y_out, float *dx_out, float *dg_out) {
    rt_model_ctx *ctx = mt_ctx(threads);
    const size_t cnt = (size_t)n * C * H * W;
    float *x = alloc_f(cnt), *res = alloc_f(cnt), *y1 = alloc_f(cnt), *y2 = alloc_f(cnt), *dy = alloc_f(cnt);
    float *g = alloc_f(cnt), *dx1 = alloc_f(cnt), *dx2 = alloc_f(cnt);
    mt_randn(x, cnt, 31);
    mt_randn(res, cnt, 32);
    mt_randn(dy, cnt, 33);
    for (int pass = 0; pass < 2; pass++) { /* 0: composed, 1: fused; fresh statistics each */
        bn_fx f;
        bn_fx_init(&f, C, H, W);
        float *y = pass ? y2 : y1, *dx = pass ? dx2 : dx1;
        if (pass) {
            assert_rt_ok(rt_batchnorm2d_forward_act(ctx, &f.l, n, (rt_act *)x, (rt_act *)res, (rt_act *)y, true, true));
            memcpy(g, dy, cnt * sizeof *g);
            assert_rt_ok(rt_batchnorm2d_backward_act(ctx, &f.l, n, (rt_act *)x, (rt_act *)y, (rt_act *)g, (rt_act *)dx, false));
        } else {
            assert_rt_ok(rt_batchnorm2d_forward(ctx, &f.l, n, (rt_act *)x, (rt_act *)y, true));
            assert_rt_ok(rt_add_forward(ctx, cnt, (rt_act *)y, (rt_act *)res, (rt_act *)y));
            assert_rt_ok(rt_relu_forward(ctx, cnt, (rt_act *)y, (rt_act *)y));
            assert_rt_ok(rt_relu_backward(ctx, cnt, (rt_act *)y, (rt_act *)dy, (rt_act *)g));
            assert_rt_ok(rt_batchnorm2d_backward(ctx, &f.l, n, (rt_act *)x, (rt_act *)g, (rt_act *)dx, false));
        }
        static float rm[2][64], rv[2][64], dgb[2][128];
        memcpy(rm[pass], rt_tensor_data(&f.l.running_mean), sizeof(float) * (size_t)C);
        memcpy(rv[pass], rt_tensor_data(&f.l.running_var), sizeof(float) * (size_t)C);
        memcpy(dgb[pass], rt_tensor_data(&f.l.dweight), sizeof(float) * (size_t)C);
        memcpy(dgb[pass] + C, rt_tensor_data(&f.l.dbias), sizeof(float) * (size_t)C);
        if (pass) {
            assert_same_bits(y1, y2, cnt, "fused forward y");
            assert_same_bits(dx1, dx2, cnt, "fused backward dx");
            assert_same_bits(rm[0], rm[1], (size_t)C, "running_mean");
            assert_same_bits(rv[0], rv[1], (size_t)C, "running_var");
            assert_same_bits(dgb[0], dgb[1], 2 * (size_t)C, "dgamma, dbeta");
            memcpy(dg_out, dgb[1], sizeof(float) * 2 * (size_t)C);
            /* evaluation mode, with a residual and without relu, against the composed ops */
            assert_rt_ok(rt_batchnorm2d_forward(ctx, &f.l, n, (rt_act *)x, (rt_act *)y1, false));
            assert_rt_ok(rt_add_forward(ctx, cnt, (rt_act *)y1, (rt_act *)res, (rt_act *)y1));
            assert_rt_ok(rt_batchnorm2d_forward_act(ctx, &f.l, n, (rt_act *)x, (rt_act *)res, (rt_act *)y2, false, false));
            assert_same_bits(y1, y2, cnt, "fused evaluation forward y");
        }
        mt_free(&f.A);
    }
    memcpy(y_out, y2, cnt * sizeof *y2);
    memcpy(dx_out, dx2, cnt * sizeof *dx2);
    free(x), free(res), free(y1), free(y2), free(dy), free(g), free(dx1), free(dx2);
    rt_model_ctx_destroy(ctx);
}

static void test_batchnorm2d_fused(void **state) {
    (void)state;
    /* 1x1, 2x2 (row path, one and several row blocks per task), 7x7, 17x17 (plane path), */
    /* ... 14x14 with more channels than one row block holds, 16x16 = BN_ROW_PLANE */
    const int shapes[][4] = {{64, 1, 1, 9},  {40, 2, 2, 5},   {6, 7, 7, 3},
                             {3, 17, 17, 2}, {64, 14, 14, 2}, {3, 16, 16, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int C = shapes[s][0], H = shapes[s][1], W = shapes[s][2], n = shapes[s][3];
        const size_t cnt = (size_t)n * C * H * W;
        float *y[2], *dx[2], dg[2][128];
        for (int t = 0; t < 2; t++) {
            y[t] = alloc_f(cnt);
            dx[t] = alloc_f(cnt);
            bn_fused_run(t ? 3 : 1, C, H, W, n, y[t], dx[t], dg[t]);
        }
        /* the thread count changes no bit */
        assert_same_bits(y[0], y[1], cnt, "y, 1 vs 3 threads");
        assert_same_bits(dx[0], dx[1], cnt, "dx, 1 vs 3 threads");
        assert_same_bits(dg[0], dg[1], 2 * (size_t)C, "dgamma/dbeta, 1 vs 3 threads");
        for (int t = 0; t < 2; t++) free(y[t]), free(dx[t]);
    }
}

/* ---- relu, add, flatten, avgpool ----------------------------------------------------- */

typedef struct ew_case {
    int op; /* 0 relu, 1 add (wrt a), 2 avgpool, 3 flatten */
    int n, c, hw;
    float *x, *b, *y, *r;
    size_t xn, yn;
} ew_case;

static double ew_eval(void *u) {
    ew_case *e = u;
    switch (e->op) {
    case 0:
        assert_rt_ok(rt_relu_forward(g_ctx, e->xn, (rt_act *)e->x, (rt_act *)e->y));
        break;
    case 1:
        assert_rt_ok(rt_add_forward(g_ctx, e->xn, (rt_act *)e->x, (rt_act *)e->b, (rt_act *)e->y));
        break;
    case 2:
        assert_rt_ok(rt_avgpool_forward(g_ctx, e->n, e->c, e->hw, (rt_act *)e->x, e->y));
        break;
    case 3:
        assert_rt_ok(rt_flatten_forward(g_ctx, e->n, e->c, 1, e->hw, (rt_act *)e->x, e->y));
        break;
    }
    return mt_dot(e->y, e->r, e->yn);
}

static void test_elementwise(void **state) {
    (void)state;
    for (int op = 0; op < 4; op++) {
        ew_case e = {.op = op, .n = 2, .c = 3, .hw = 5};
        e.xn = (size_t)e.n * e.c * e.hw;
        e.yn = op == 2 ? (size_t)e.n * e.c : e.xn;
        e.x = alloc_f(e.xn);
        e.b = alloc_f(e.xn);
        e.y = alloc_f(e.xn);
        e.r = alloc_f(e.xn);
        float *dx = alloc_f(e.xn);
        mt_randn(e.x, e.xn, 21);
        for (size_t i = 0; i < e.xn; i++) /* away from relu's kink */
            if (fabsf(e.x[i]) < 0.05f) e.x[i] = e.x[i] < 0 ? -0.05f : 0.05f;
        mt_randn(e.b, e.xn, 22);
        mt_randn(e.r, e.yn, 23);
        (void)ew_eval(&e);
        switch (op) {
        case 0:
            assert_rt_ok(rt_relu_backward(g_ctx, e.xn, (rt_act *)e.y, (rt_act *)e.r, (rt_act *)dx));
            break;
        case 1:
            for (size_t i = 0; i < e.xn; i++) dx[i] = 0.5f;
            assert_rt_ok(rt_add_backward(g_ctx, e.xn, (rt_act *)e.r, (rt_act *)dx));
            for (size_t i = 0; i < e.xn; i++) dx[i] -= 0.5f;
            break;
        case 2:
            assert_rt_ok(rt_avgpool_backward(g_ctx, e.n, e.c, e.hw, e.r, (rt_act *)dx));
            break;
        case 3:
            assert_rt_ok(rt_flatten_backward(g_ctx, e.n, e.c, 1, e.hw, e.r, (rt_act *)dx));
            break;
        }
        static const char *names[] = {"relu dx", "add da", "avgpool dx", "flatten dx"};
        assert_int_equal(mt_fd_check(names[op], e.x, dx, e.xn, 100, EPS, RTOL, ATOL, ew_eval, &e), 0);
        /* in place relu gives the same as out of place */
        if (op == 0) {
            float *yy = alloc_f(e.xn);
            memcpy(yy, e.x, e.xn * sizeof(float));
            assert_rt_ok(rt_relu_forward(g_ctx, e.xn, (rt_act *)yy, (rt_act *)yy));
            assert_memory_equal(yy, e.y, e.xn * sizeof(float));
            free(yy);
        }
        free(e.x);
        free(e.b);
        free(e.y);
        free(e.r);
        free(dx);
    }
}

/* ---- maxpool ----------------------------------------------------------------------- */

typedef struct mp_case {
    rt_maxpool2d l;
    int n;
    float *x, *y, *r;
    size_t xn, yn;
} mp_case;

static double mp_eval(void *u) {
    mp_case *c = u;
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &c->l, c->n, (rt_act *)c->x, (rt_act *)c->y));
    return mt_dot(c->y, c->r, c->yn);
}

static void check_maxpool(int n, int ch, int h, int w, int k, int s, int p) {
    mp_case c = {.n = n};
    assert_rt_ok(rt_maxpool2d_init(&c.l, ch, h, w, k, s, p));
    c.xn = (size_t)n * ch * h * w;
    c.yn = (size_t)n * ch * c.l.out_h * c.l.out_w;
    c.x = alloc_f(c.xn);
    c.y = alloc_f(c.yn);
    c.r = alloc_f(c.yn);
    float *dx = alloc_f(c.xn);
    /* distinct values 0.1 apart, shuffled, so eps never changes a window's maximum */
    for (size_t i = 0; i < c.xn; i++) c.x[i] = 0.1f * (float)i - 3.0f;
    rt_rng rng;
    rt_rng_init(&rng, 5, 5);
    for (size_t i = c.xn - 1; i > 0; i--) {
        size_t j = (size_t)rt_rng_below(&rng, i + 1);
        float t = c.x[i];
        c.x[i] = c.x[j];
        c.x[j] = t;
    }
    mt_randn(c.r, c.yn, 31);
    (void)mp_eval(&c);
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &c.l, n, (rt_act *)c.x, (rt_act *)c.y, (rt_act *)c.r, (rt_act *)dx));
    assert_int_equal(mt_fd_check("maxpool dx", c.x, dx, c.xn, 200, EPS, RTOL, ATOL, mp_eval, &c), 0);
    free(c.x);
    free(c.y);
    free(c.r);
    free(dx);
}

static void test_maxpool2d(void **state) {
    (void)state;
    check_maxpool(2, 3, 7, 7, 3, 2, 1); /* ResNet stem */
    check_maxpool(2, 2, 8, 8, 2, 2, 0); /* Net */
    /* ties: the first maximum gets the gradient (PyTorch's CPU rule) */
    rt_maxpool2d l;
    assert_rt_ok(rt_maxpool2d_init(&l, 1, 2, 2, 2, 2, 0));
    float x[4] = {1, 1, 1, 1}, y[1], dy[1] = {3}, dx[4];
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &l, 1, (rt_act *)x, (rt_act *)y));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &l, 1, (rt_act *)x, (rt_act *)y, (rt_act *)dy, (rt_act *)dx));
    assert_float_equal(dx[0], 3, 0);
    assert_float_equal(dx[1] + dx[2] + dx[3], 0, 0);
    /* 3x3 window, stride 2, padding 1 on 3x3: four windows clipped to the plane; a NaN
     * wins its windows (output NaN, gradient to it), a tie goes to the first value */
    rt_maxpool2d q;
    assert_rt_ok(rt_maxpool2d_init(&q, 1, 3, 3, 3, 2, 1));
    float xq[9] = {5, 1, 5, /**/ 0, 2, NAN, /**/ 7, 7, -1}, yq[4], dyq[4] = {1, 10, 100, 1000}, dxq[9];
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &q, 1, (rt_act *)xq, (rt_act *)yq));
    assert_float_equal(yq[0], 5, 0); /* rows 0-1, cols 0-1: {5, 1, 0, 2} */
    assert_true(isnan(yq[1]));       /* rows 0-1, cols 1-2 */
    assert_float_equal(yq[2], 7, 0); /* rows 1-2, cols 0-1: {0, 2, 7, 7}: the first 7 */
    assert_true(isnan(yq[3]));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &q, 1, (rt_act *)xq, (rt_act *)yq, (rt_act *)dyq, (rt_act *)dxq));
    const float want[9] = {1, 0, 0, /**/ 0, 0, 1010, /**/ 100, 0, 0};
    for (int i = 0; i < 9; i++) assert_float_equal(dxq[i], want[i], 0);
    /* prepared: backward scatters the forward's recorded maxima: the same dx */
    assert_rt_ok(rt_maxpool2d_prepare(g_ctx, &q, 2));
    memset(dxq, 0, sizeof dxq);
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &q, 1, (rt_act *)xq, (rt_act *)yq));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &q, 1, (rt_act *)xq, (rt_act *)yq, (rt_act *)dyq, (rt_act *)dxq));
    for (int i = 0; i < 9; i++) assert_float_equal(dxq[i], want[i], 0);
    rt_maxpool2d_release(g_ctx, &q);
    /* and on random planes, against the unprepared layer; then a backward for another
     * input than the last forward's finds that input's maxima */
    const int n = 3, C = 5, H = 14;
    rt_maxpool2d u, v;
    assert_rt_ok(rt_maxpool2d_init(&u, C, H, H, 3, 2, 1));
    assert_rt_ok(rt_maxpool2d_init(&v, C, H, H, 3, 2, 1));
    assert_rt_ok(rt_maxpool2d_prepare(g_ctx, &v, n));
    const size_t xn = (size_t)n * C * H * H, yn = (size_t)n * C * u.out_h * u.out_w;
    float *xa = alloc_f(xn), *xb = alloc_f(xn), *ya = alloc_f(yn), *yb = alloc_f(yn), *g = alloc_f(yn);
    float *da = alloc_f(xn), *db = alloc_f(xn);
    mt_randn(xa, xn, 41);
    mt_randn(xb, xn, 42);
    mt_randn(g, yn, 43);
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &u, n, (rt_act *)xa, (rt_act *)ya));
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &v, n, (rt_act *)xa, (rt_act *)yb));
    assert_memory_equal(ya, yb, yn * sizeof *ya);
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &u, n, (rt_act *)xa, (rt_act *)ya, (rt_act *)g, (rt_act *)da));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &v, n, (rt_act *)xa, (rt_act *)yb, (rt_act *)g, (rt_act *)db));
    assert_memory_equal(da, db, xn * sizeof *da);
    assert_rt_ok(rt_maxpool2d_forward(g_ctx, &u, n, (rt_act *)xb, (rt_act *)ya));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &u, n, (rt_act *)xb, (rt_act *)ya, (rt_act *)g, (rt_act *)da));
    assert_rt_ok(rt_maxpool2d_backward(g_ctx, &v, n, (rt_act *)xb, (rt_act *)ya, (rt_act *)g, (rt_act *)db)); /* v's last forward was xa */
    assert_memory_equal(da, db, xn * sizeof *da);
    rt_maxpool2d_release(g_ctx, &v);
    free(xa), free(xb), free(ya), free(yb), free(g), free(da), free(db);
}

/* ---- linear ------------------------------------------------------------------------ */

typedef struct lin_case {
    rt_linear l;
    int n;
    float *x, *y, *r;
} lin_case;

static double lin_eval(void *u) {
    lin_case *c = u;
    assert_rt_ok(rt_linear_forward(g_ctx, &c->l, c->n, c->x, c->y));
    return mt_dot(c->y, c->r, (size_t)c->n * c->l.out_f);
}

static void test_linear(void **state) {
    (void)state;
    lin_case c = {.n = 3};
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_linear_init(&c.l, 7, 4));
    mt_place(&A, &c.l.weight, &c.l.dweight);
    mt_place(&A, &c.l.bias, &c.l.dbias);
    mt_alloc(&A);
    c.x = alloc_f(21);
    c.y = alloc_f(12);
    c.r = alloc_f(12);
    float *dx = alloc_f(21);
    mt_randn(c.x, 21, 41);
    mt_randn(c.r, 12, 42);
    mt_randn(rt_tensor_data(&c.l.weight), 28, 43);
    mt_randn(rt_tensor_data(&c.l.bias), 4, 44);
    (void)lin_eval(&c);
    assert_rt_ok(rt_linear_backward(g_ctx, &c.l, c.n, c.x, c.r, dx));
    int fails = mt_fd_check("linear dx", c.x, dx, 21, 21, EPS, RTOL, ATOL, lin_eval, &c);
    fails += mt_fd_check("linear dW", rt_tensor_data(&c.l.weight), rt_tensor_data(&c.l.dweight), 28, 28, EPS, RTOL,
                         ATOL, lin_eval, &c);
    fails += mt_fd_check("linear db", rt_tensor_data(&c.l.bias), rt_tensor_data(&c.l.dbias), 4, 4, EPS, RTOL, ATOL,
                         lin_eval, &c);
    assert_int_equal(fails, 0);
    free(c.x);
    free(c.y);
    free(c.r);
    free(dx);
    mt_free(&A);
}

/* ---- dropout ----------------------------------------------------------------------- */

typedef struct do_case {
    rt_dropout l;
    int n;
    float *x, *y, *r;
    size_t cnt;
} do_case;

static double do_eval(void *u) {
    do_case *c = u;
    c->l.counter = 0; /* the same mask for every evaluation */
    assert_rt_ok(rt_dropout_forward(g_ctx, &c->l, c->n, (rt_act *)c->x, (rt_act *)c->y, true));
    return mt_dot(c->y, c->r, c->cnt);
}

static void test_dropout(void **state) {
    (void)state;
    for (int cw = 0; cw < 2; cw++) {
        do_case c = {.n = 4};
        const int C = 6, H = 3, W = 3;
        assert_rt_ok(rt_dropout_init(&c.l, 0.5f, cw, C, H, W, 99, 3));
        c.cnt = (size_t)c.n * C * H * W;
        c.x = alloc_f(c.cnt);
        c.y = alloc_f(c.cnt);
        c.r = alloc_f(c.cnt);
        c.l.mask = alloc_f(c.cnt);
        float *dx = alloc_f(c.cnt);
        mt_randn(c.x, c.cnt, 51);
        mt_randn(c.r, c.cnt, 52);
        (void)do_eval(&c);
        assert_int_equal(c.l.counter, cw ? (uint64_t)c.n * C : c.cnt);
        assert_rt_ok(rt_dropout_backward(g_ctx, &c.l, c.n, (rt_act *)c.r, (rt_act *)dx));
        assert_int_equal(
            mt_fd_check(cw ? "dropout2d dx" : "dropout dx", c.x, dx, c.cnt, 216, EPS, RTOL, ATOL, do_eval, &c), 0);
        (void)do_eval(&c); /* y at the unperturbed x */
        /* values are 0 or 2x; about half dropped; channelwise drops whole planes */
        size_t dropped = 0;
        for (size_t i = 0; i < c.cnt; i++) {
            assert_true(c.y[i] == 0.0f || fabsf(c.y[i] - 2.0f * c.x[i]) < 1e-6f);
            dropped += c.y[i] == 0.0f;
            if (cw) assert_true((c.y[i] == 0.0f) == (c.y[i - i % (H * W)] == 0.0f));
        }
        assert_true(dropped > c.cnt / 5 && dropped < c.cnt * 4 / 5);
        /* the mask is Philox: element i of the draw is uniform_at(seed, subseq, i) < p */
        size_t draws = cw ? (size_t)c.n * C : c.cnt;
        for (size_t i = 0; i < draws; i++) {
            rt_rng r;
            rt_rng_init(&r, 99, 3);
            r.offset = i;
            float u;
            rt_rng_uniform(&r, &u, 1);
            assert_float_equal(c.l.mask[i], u < 0.5f ? 0.0f : 2.0f, 0);
        }
        /* a second forward draws a different mask; evaluation copies */
        assert_rt_ok(rt_dropout_forward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)c.y, true));
        float *y2 = alloc_f(c.cnt);
        assert_rt_ok(rt_dropout_forward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)y2, true));
        assert_memory_not_equal(c.y, y2, c.cnt * sizeof(float));
        assert_rt_ok(rt_dropout_forward(g_ctx, &c.l, c.n, (rt_act *)c.x, (rt_act *)y2, false));
        assert_memory_equal(c.x, y2, c.cnt * sizeof(float));
        free(y2);
        free(c.x);
        free(c.y);
        free(c.r);
        free(c.l.mask);
        free(dx);
    }
    rt_dropout bad;
    assert_int_equal(rt_dropout_init(&bad, 1.0f, false, 1, 1, 1, 0, 0), RT_ERR_INVALID);
}

/* ---- losses ------------------------------------------------------------------------ */

typedef struct loss_case {
    int op; /* 0 softmax_xent, 1 log_softmax (sum r*y), 2 nll */
    int n, k;
    float *x, *y, *r, *d;
    int64_t labels[4];
} loss_case;

static double loss_eval(void *u) {
    loss_case *c = u;
    float loss = 0;
    switch (c->op) {
    case 0:
        assert_rt_ok(rt_softmax_xent(g_ctx, c->n, c->k, c->x, c->labels, &loss, c->d));
        return loss;
    case 1:
        assert_rt_ok(rt_log_softmax_forward(g_ctx, c->n, c->k, c->x, c->y));
        return mt_dot(c->y, c->r, (size_t)c->n * c->k);
    default:
        assert_rt_ok(rt_nll_loss(g_ctx, c->n, c->k, c->x, c->labels, &loss, c->d));
        return loss;
    }
}

static void test_losses(void **state) {
    (void)state;
    for (int op = 0; op < 3; op++) {
        loss_case c = {.op = op, .n = 4, .k = 5, .labels = {0, 4, 2, 2}};
        size_t cnt = 20;
        c.x = alloc_f(cnt);
        c.y = alloc_f(cnt);
        c.r = alloc_f(cnt);
        c.d = alloc_f(cnt);
        float *g = alloc_f(cnt);
        mt_randn(c.x, cnt, 61);
        for (size_t i = 0; i < cnt; i++) c.x[i] *= 3.0f;
        mt_randn(c.r, cnt, 62);
        (void)loss_eval(&c);
        if (op == 1)
            assert_rt_ok(rt_log_softmax_backward(g_ctx, c.n, c.k, c.y, c.r, g));
        else
            memcpy(g, c.d, cnt * sizeof(float));
        static const char *names[] = {"softmax_xent", "log_softmax", "nll"};
        assert_int_equal(mt_fd_check(names[op], c.x, g, cnt, 20, EPS, RTOL, ATOL, loss_eval, &c), 0);
        free(c.x);
        free(c.y);
        free(c.r);
        free(c.d);
        free(g);
    }
    /* known value: uniform logits give log(k) */
    float z[6] = {0}, d[6], loss;
    int64_t lab[2] = {1, 2};
    assert_rt_ok(rt_softmax_xent(g_ctx, 2, 3, z, lab, &loss, d));
    assert_float_equal(loss, log(3.0), 1e-6);
    assert_float_equal(d[1], (1.0 / 3 - 1) / 2, 1e-7);
    /* labels out of range are errors naming the sample */
    lab[1] = 3;
    assert_int_equal(rt_softmax_xent(g_ctx, 2, 3, z, lab, &loss, d), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "sample 1"));
    lab[1] = -1;
    assert_int_equal(rt_nll_loss(g_ctx, 2, 3, z, lab, &loss, d), RT_ERR_INVALID);
    /* labels are int64 end to end: 2^32 + 1 is out of range, not label 1 */
    lab[1] = ((int64_t)1 << 32) + 1;
    assert_int_equal(rt_softmax_xent(g_ctx, 2, 3, z, lab, &loss, d), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "4294967297"));
    assert_int_equal(rt_nll_loss(g_ctx, 2, 3, z, lab, &loss, d), RT_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),      cmocka_unit_test(test_conv2d_workspace_error),
        cmocka_unit_test(test_batchnorm2d), cmocka_unit_test(test_batchnorm2d_fused),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_maxpool2d),
        cmocka_unit_test(test_linear),      cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_losses),
    };
    return cmocka_run_group_tests(tests, mt_group_setup, mt_group_teardown);
}
