/* The two CPU convolution implementations agree: oneDNN (conv_dnnl.c) against
 * im2col + BLAS (conv_cpu.c), on random data, forward output and both gradients
 * (dW, db, dx written and accumulated), for a few shapes: stride 2, padding, 1x1,
 * bias, a 7x7 stem, tiny spatial sizes, odd channel counts and more threads than
 * output channels. Each implementation runs in its own context (RINGTRAIN_CONV is read
 * when a context is created). A batch smaller than the prepared one (which the oneDNN
 * context runs through im2col) is checked too. Several chunks: im2col without its
 * column cache and with a workspace smaller than the batch, and oneDNN in several
 * parts, equal the one-chunk run and finite differences. The oneDNN comparisons are
 * left out without oneDNN in the build.
 */
#include "model_test_util.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct conv_shape {
    int in_c, out_c, hw, k, stride, pad;
    bool bias;
    int n, threads;
} conv_shape;

static rt_model_ctx *ctx_with(const char *impl, int threads) {
    assert_int_equal(setenv("RINGTRAIN_CONV", impl, 1), 0);
    rt_model_ctx *ctx = mt_ctx(threads);
    unsetenv("RINGTRAIN_CONV");
    return ctx;
}

static void fill(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = 1e30f;
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

typedef struct run_out {
    float *y, *dx, *dxacc, *dw, *db;
} run_out;

#ifdef RT_HAVE_DNNL
/* forward, backward (dx written) and backward again (dx accumulated onto `base`) of
 * batch n on a layer prepared for max_n */
static void run_impl(const char *impl, const conv_shape *s, int max_n, int n, const float *x, const float *w,
                     const float *b, const float *dy, const float *base, run_out *o) {
    rt_model_ctx *ctx = ctx_with(impl, s->threads);
    rt_conv2d l;
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, s->hw, s->k, s->stride, s->pad, s->bias));
    mt_place(&A, &l.weight, &l.dweight);
    if (s->bias) mt_place(&A, &l.bias, &l.dbias);
    mt_alloc(&A);
    memcpy(rt_tensor_data(&l.weight), w, (size_t)rt_tensor_numel(&l.weight) * 4);
    if (s->bias) memcpy(rt_tensor_data(&l.bias), b, (size_t)rt_tensor_numel(&l.bias) * 4);
    size_t ws;
    assert_rt_ok(rt_conv2d_prepare(ctx, &l, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(ctx, ws));
    const size_t xn = (size_t)n * s->in_c * s->hw * s->hw;
    /* poison what must be written: a buffer left alone would show */
    fill(o->y, (size_t)n * s->out_c * l.out_h * l.out_w);
    fill(o->dx, xn);
    fill(rt_tensor_data(&l.dweight), (size_t)rt_tensor_numel(&l.dweight));
    if (s->bias) fill(rt_tensor_data(&l.dbias), (size_t)s->out_c);
    assert_rt_ok(rt_conv2d_forward(ctx, &l, n, (rt_act *)x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, n, (rt_act *)x, (rt_act *)dy, (rt_act *)o->dx, false));
    memcpy(o->dw, rt_tensor_data(&l.dweight), (size_t)rt_tensor_numel(&l.dweight) * 4);
    if (s->bias) memcpy(o->db, rt_tensor_data(&l.dbias), (size_t)rt_tensor_numel(&l.dbias) * 4);
    memcpy(o->dxacc, base, xn * sizeof(float));
    assert_rt_ok(rt_conv2d_forward(ctx, &l, n, (rt_act *)x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, n, (rt_act *)x, (rt_act *)dy, (rt_act *)o->dxacc, true));
    rt_conv2d_release(ctx, &l);
    mt_free(&A);
    rt_model_ctx_destroy(ctx);
}

static void check_shape(const conv_shape *s, int max_n) {
    const int n = s->n;
    rt_conv2d l;
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, s->hw, s->k, s->stride, s->pad, s->bias));
    const size_t xn = (size_t)n * s->in_c * s->hw * s->hw, yn = (size_t)n * s->out_c * l.out_h * l.out_w,
                 wn = (size_t)s->out_c * s->in_c * s->k * s->k;
    float *x = malloc(xn * 4), *dy = malloc(yn * 4), *w = malloc(wn * 4), *b = malloc((size_t)s->out_c * 4),
          *base = malloc(xn * 4);
    mt_randn(x, xn, 1);
    mt_randn(dy, yn, 2);
    mt_randn(w, wn, 3);
    mt_randn(b, (size_t)s->out_c, 4);
    mt_randn(base, xn, 5);
    run_out r[2];
    for (int i = 0; i < 2; i++) {
        r[i].y = malloc(yn * 4);
        r[i].dx = malloc(xn * 4);
        r[i].dxacc = malloc(xn * 4);
        r[i].dw = malloc(wn * 4);
        r[i].db = malloc((size_t)s->out_c * 4);
    }
    run_impl("im2col", s, max_n, n, x, w, b, dy, base, &r[0]);
    run_impl("dnnl", s, max_n, n, x, w, b, dy, base, &r[1]);
    double ey = rel_err(r[1].y, r[0].y, yn), edx = rel_err(r[1].dx, r[0].dx, xn),
           edxa = rel_err(r[1].dxacc, r[0].dxacc, xn), edw = rel_err(r[1].dw, r[0].dw, wn),
           edb = s->bias ? rel_err(r[1].db, r[0].db, (size_t)s->out_c) : 0.0;
    print_message("conv %d->%d k%d s%d p%d %dx%d%s n=%d (max %d) threads=%d: y %.2e dx %.2e dx+ %.2e dW %.2e db %.2e\n",
                  s->in_c, s->out_c, s->k, s->stride, s->pad, s->hw, s->hw, s->bias ? " bias" : "", n, max_n,
                  s->threads, ey, edx, edxa, edw, edb);
    assert_true(ey < 1e-5);
    assert_true(edx < 1e-4);
    assert_true(edxa < 1e-4);
    assert_true(edw < 1e-4);
    assert_true(edb < 1e-4);
    /* the comparison can fail: the outputs are not all zero */
    assert_true(fabs(r[0].y[0]) + fabs(r[0].y[yn / 2]) + fabs(r[0].dw[0]) > 0);
    for (int i = 0; i < 2; i++) {
        free(r[i].y);
        free(r[i].dx);
        free(r[i].dxacc);
        free(r[i].dw);
        free(r[i].db);
    }
    free(x);
    free(dy);
    free(w);
    free(b);
    free(base);
}

static const conv_shape shapes[] = {
    {3, 16, 9, 3, 1, 1, false, 4, 2},  /* 3x3 same padding */
    {8, 32, 10, 3, 2, 1, true, 5, 2},  /* stride 2, bias, odd batch */
    {16, 32, 7, 1, 2, 0, false, 4, 2}, /* 1x1 stride 2 (downsample) */
    {32, 16, 6, 1, 1, 0, true, 3, 2},  /* 1x1 with bias */
    {1, 16, 28, 7, 2, 3, false, 4, 2}, /* the imagenet stem */
    {32, 32, 1, 3, 1, 1, false, 6, 2}, /* 1x1 input: only the centre tap lives */
    {16, 32, 2, 3, 2, 1, false, 4, 3}, /* tiny input, 3 threads */
    {16, 32, 2, 3, 1, 1, false, 4, 2}, /* layer3 at 28x28 (3x3 on 2x2): oneDNN's dW as a matmul + fold */
    {5, 7, 8, 5, 1, 2, true, 3, 4},    /* odd channels, more threads than work */
    {1, 10, 28, 5, 1, 0, true, 2, 1},  /* the tutorial Net's conv1, one thread */
};

static void test_conv_impls_agree(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], shapes[i].n);
}

/* prepared for a larger batch than it runs: the oneDNN context falls back to im2col */
static void test_conv_impls_smaller_batch(void **state) {
    (void)state;
    check_shape(&shapes[1], 8);
    check_shape(&shapes[4], 8);
}
#endif

/* ---- several chunks (im2col) and several parts (oneDNN) ------------------------------
 * Every test above prepares for the whole batch, so im2col runs it as one chunk and the
 * weight gradient is one gemm. With the column cache off (RINGTRAIN_CONV_NOCACHE=1) and
 * a workspace prepared for fewer images than the batch, backward runs several chunks
 * and dW must accumulate over them; oneDNN with several pool threads runs several parts
 * (backward-weights split by images, partial dW summed, or by output channels). */

typedef struct chunk_run {
    const conv_shape *s;
    const char *impl, *bww; /* RINGTRAIN_CONV, RINGTRAIN_DNNL_BWW (NULL: unset) */
    bool nocache;
    int prepare_n, threads;
} chunk_run;

typedef struct fd_user {
    rt_model_ctx *ctx;
    rt_conv2d *l;
    int n;
    const float *x, *dy;
    float *y;
    size_t yn;
} fd_user;

/* sum(y * dy): linear in the weights, so its derivative is dW exactly */
static double fd_eval(void *u) {
    fd_user *f = u;
    assert_rt_ok(rt_conv2d_forward(f->ctx, f->l, f->n, (rt_act *)f->x, (rt_act *)f->y));
    return mt_dot(f->y, f->dy, f->yn);
}

/* forward + backward (dx written, then accumulated onto base) of batch s->n with the
 * run's settings; returns the workspace bytes; dW is also checked by finite differences */
static size_t run_chunked(const chunk_run *c, const float *x, const float *w, const float *b, const float *dy,
                          const float *base, run_out *o) {
    const conv_shape *s = c->s;
    const int n = s->n;
    if (c->nocache) assert_int_equal(setenv("RINGTRAIN_CONV_NOCACHE", "1", 1), 0);
    if (c->bww) assert_int_equal(setenv("RINGTRAIN_DNNL_BWW", c->bww, 1), 0);
    rt_model_ctx *ctx = ctx_with(c->impl, c->threads);
    rt_conv2d l;
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, s->hw, s->k, s->stride, s->pad, s->bias));
    mt_place(&A, &l.weight, &l.dweight);
    if (s->bias) mt_place(&A, &l.bias, &l.dbias);
    mt_alloc(&A);
    const size_t wn = (size_t)rt_tensor_numel(&l.weight), xn = (size_t)n * s->in_c * s->hw * s->hw,
                 yn = (size_t)n * s->out_c * l.out_h * l.out_w;
    memcpy(rt_tensor_data(&l.weight), w, wn * 4);
    if (s->bias) memcpy(rt_tensor_data(&l.bias), b, (size_t)s->out_c * 4);
    size_t ws;
    assert_rt_ok(rt_conv2d_prepare(ctx, &l, c->prepare_n, &ws)); /* reads the environment */
    unsetenv("RINGTRAIN_CONV_NOCACHE");
    unsetenv("RINGTRAIN_DNNL_BWW");
    assert_rt_ok(rt_model_ctx_reserve(ctx, ws));
    fill(o->y, yn);
    fill(o->dx, xn);
    fill(rt_tensor_data(&l.dweight), wn);
    if (s->bias) fill(rt_tensor_data(&l.dbias), (size_t)s->out_c);
    assert_rt_ok(rt_conv2d_forward(ctx, &l, n, (rt_act *)x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, n, (rt_act *)x, (rt_act *)dy, (rt_act *)o->dx, false));
    memcpy(o->dw, rt_tensor_data(&l.dweight), wn * 4);
    if (s->bias) memcpy(o->db, rt_tensor_data(&l.dbias), (size_t)s->out_c * 4);
    memcpy(o->dxacc, base, xn * sizeof(float));
    assert_rt_ok(rt_conv2d_forward(ctx, &l, n, (rt_act *)x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, n, (rt_act *)x, (rt_act *)dy, (rt_act *)o->dxacc, true));
    /* finite differences of sum(y * dy) in the weights, on this same configuration */
    float *yfd = malloc(yn * 4);
    fd_user u = {ctx, &l, n, x, dy, yfd, yn};
    int bad = mt_fd_check("dW", rt_tensor_data(&l.weight), o->dw, wn, 24, 0.5f, 1e-3, 1e-3, fd_eval, &u);
    if (bad)
        fail_msg("%s%s%s: %d of 24 weight gradients disagree with finite differences", c->impl,
                 c->nocache ? " nocache" : "", c->bww ? c->bww : "", bad);
    free(yfd);
    rt_conv2d_release(ctx, &l);
    mt_free(&A);
    rt_model_ctx_destroy(ctx);
    return ws;
}

static void check_chunks(const conv_shape *s, const chunk_run *runs, int nruns) {
    const int n = s->n;
    rt_conv2d l;
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, s->hw, s->k, s->stride, s->pad, s->bias));
    const size_t xn = (size_t)n * s->in_c * s->hw * s->hw, yn = (size_t)n * s->out_c * l.out_h * l.out_w,
                 wn = (size_t)s->out_c * s->in_c * s->k * s->k;
    float *x = malloc(xn * 4), *dy = malloc(yn * 4), *w = malloc(wn * 4), *b = malloc((size_t)s->out_c * 4),
          *base = malloc(xn * 4);
    mt_randn(x, xn, 11);
    mt_randn(dy, yn, 12);
    mt_randn(w, wn, 13);
    mt_randn(b, (size_t)s->out_c, 14);
    mt_randn(base, xn, 15);
    run_out ref, r;
    run_out *both[2] = {&ref, &r};
    for (int i = 0; i < 2; i++) {
        both[i]->y = malloc(yn * 4);
        both[i]->dx = malloc(xn * 4);
        both[i]->dxacc = malloc(xn * 4);
        both[i]->dw = malloc(wn * 4);
        both[i]->db = malloc((size_t)s->out_c * 4);
    }
    /* the reference: im2col, one chunk (prepared for the whole batch, columns cached) */
    const chunk_run one = {s, "im2col", NULL, false, n, 2};
    run_chunked(&one, x, w, b, dy, base, &ref);
    for (int k = 0; k < nruns; k++) {
        const chunk_run *c = &runs[k];
        run_chunked(c, x, w, b, dy, base, &r);
        double ey = rel_err(r.y, ref.y, yn), edx = rel_err(r.dx, ref.dx, xn), edxa = rel_err(r.dxacc, ref.dxacc, xn),
               edw = rel_err(r.dw, ref.dw, wn), edb = s->bias ? rel_err(r.db, ref.db, (size_t)s->out_c) : 0.0;
        print_message("conv %d->%d k%d s%d %dx%d n=%d %s%s%s%s prepared for %d, %d threads: y %.2e dx %.2e dx+ %.2e "
                      "dW %.2e db %.2e\n",
                      s->in_c, s->out_c, s->k, s->stride, s->hw, s->hw, n, c->impl, c->nocache ? " nocache" : "",
                      c->bww ? " bww=" : "", c->bww ? c->bww : "", c->prepare_n, c->threads, ey, edx, edxa, edw, edb);
        assert_true(ey < 1e-5);
        assert_true(edx < 1e-4);
        assert_true(edxa < 1e-4);
        assert_true(edw < 1e-4);
        assert_true(edb < 1e-4);
    }
    assert_true(fabs(ref.dw[0]) + fabs(ref.dw[wn / 2]) > 0);
    for (int i = 0; i < 2; i++) {
        free(both[i]->y);
        free(both[i]->dx);
        free(both[i]->dxacc);
        free(both[i]->dw);
        free(both[i]->db);
    }
    free(x);
    free(dy);
    free(w);
    free(b);
    free(base);
}

static const conv_shape chunk_shapes[] = {
    {3, 8, 8, 3, 1, 1, true, 6, 2},  /* 3x3 same padding, bias */
    {4, 6, 9, 3, 2, 1, false, 7, 2}, /* stride 2, a last chunk of one image */
    {5, 4, 7, 1, 1, 0, true, 5, 3},  /* 1x1 */
};

/* im2col without the column cache, prepared for 2 (or 1) images: the batch runs in
 * several chunks (the workspace is smaller than the batch needs), and every result
 * equals the one-chunk run; dW also equals finite differences */
static void test_conv_im2col_chunks(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof chunk_shapes / sizeof chunk_shapes[0]; i++) {
        const conv_shape *s = &chunk_shapes[i];
        const chunk_run runs[] = {
            {s, "im2col", NULL, true, 2, s->threads},
            {s, "im2col", NULL, true, 1, 1},
            {s, "im2col", NULL, true, s->n, s->threads}, /* no cache, one chunk */
        };
        check_chunks(s, runs, 3);
        /* the chunked runs had less workspace than the whole batch needs */
        rt_model_ctx *ctx = ctx_with("im2col", 2);
        rt_conv2d l;
        mt_arenas A;
        mt_arenas_init(&A);
        assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, s->hw, s->k, s->stride, s->pad, s->bias));
        mt_place(&A, &l.weight, &l.dweight);
        if (s->bias) mt_place(&A, &l.bias, &l.dbias);
        mt_alloc(&A);
        size_t ws2, wsn;
        assert_int_equal(setenv("RINGTRAIN_CONV_NOCACHE", "1", 1), 0);
        assert_rt_ok(rt_conv2d_prepare(ctx, &l, 2, &ws2));
        assert_rt_ok(rt_conv2d_prepare(ctx, &l, s->n, &wsn));
        unsetenv("RINGTRAIN_CONV_NOCACHE");
        assert_true(ws2 * 2 < wsn);
        rt_conv2d_release(ctx, &l);
        mt_free(&A);
        rt_model_ctx_destroy(ctx);
    }
}

#ifdef RT_HAVE_DNNL
/* oneDNN with several parts (3 pool threads): backward-weights split by images (each
 * part's partial dW summed) and by output channels, against the one-chunk im2col run
 * and finite differences */
static void test_conv_dnnl_parts(void **state) {
    (void)state;
    static const conv_shape s[] = {
        {3, 8, 8, 3, 1, 1, true, 6, 3},
        {4, 6, 9, 3, 2, 1, false, 7, 3},
    };
    for (int i = 0; i < 2; i++) {
        const chunk_run runs[] = {
            {&s[i], "dnnl", "batch", false, s[i].n, 3},
            {&s[i], "dnnl", "oc", false, s[i].n, 3},
            {&s[i], "dnnl", NULL, false, s[i].n, 3},
        };
        check_chunks(&s[i], runs, 3);
    }
}
#endif

/* a value a CPU convolution setting does not know is an error of the context naming it,
 * not a silent default (nor, for oneDNN's, a silent im2col fallback in the auto mode) */
static void check_bad_env(const char *name, const char *value, const char *want) {
    assert_int_equal(setenv(name, value, 1), 0);
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 2};
    rt_status st = rt_model_ctx_create(&o, &ctx);
    unsetenv(name);
    assert_int_equal(st, RT_ERR_INVALID);
    assert_null(ctx);
    if (!strstr(rt_error_message(), want)) fail_msg("%s: '%s' lacks '%s'", name, rt_error_message(), want);
}

static void test_conv_impl_bad_env(void **state) {
    (void)state;
    check_bad_env("RINGTRAIN_CONV", "fastest", "RINGTRAIN_CONV='fastest': expected one of auto|im2col|dnnl");
    check_bad_env("RINGTRAIN_DNNL_BWW", "images", "RINGTRAIN_DNNL_BWW='images': expected one of auto|omp|oc|batch");
    check_bad_env("RINGTRAIN_DNNL_LAYOUT", "nhwc", "RINGTRAIN_DNNL_LAYOUT='nhwc': expected one of auto|plain");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_im2col_chunks),
#ifdef RT_HAVE_DNNL
        cmocka_unit_test(test_conv_dnnl_parts),          cmocka_unit_test(test_conv_impls_agree),
        cmocka_unit_test(test_conv_impls_smaller_batch),
#endif
        cmocka_unit_test(test_conv_impl_bad_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
