/* The dense path of CPU convolutions on tiny inputs (conv_cpu.c: ResNet's layer3 and
 * layer4 at 28x28, 2x2 and 1x1 maps), in fp32 and bf16:
 *  - its AVX-512 unroll of W into W' and fold of dW' into dW give the bits of the plain
 *    loops (rt_cpu_conv2d_force_plain): y, dx (written and accumulated), dW and db;
 *  - under bf16, the batch it was prepared for runs the products on oneDNN's bf16 matmul
 *    (rt_cpu_conv2d_dense16), other batches as fp32 products of the same bf16-rounded
 *    values: the two differ only in the order of the fp32 sums, so y and dx (rounded to
 *    bf16 once) agree within one bf16 step of the larger of the two, dW and db (fp32
 *    sums of up to n * positions exact products) within 1e-5 of the largest.
 * Shapes: 3x3 on 2x2 (one block of 4 channels per vector), odd channel counts (a
 * remainder channel), stride 2 onto 1x1, 3x3 on 1x1 (one live tap),
 * with and without bias, on 2 and 3 threads.
 */
#include "model_test_util.h"

#include "core/bf16.h"
#include "model/cpu/cpu_internal.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct dshape {
    int in_c, out_c, hw, k, stride, pad; /* input hw x hw, or hw x w where w is set */
    bool bias;
    int n, threads;
    int w;
} dshape;

static int width(const dshape *s) { return s->w ? s->w : s->hw; }

static const dshape shapes[] = {
    {16, 24, 2, 3, 1, 1, false, 6, 2, 0}, /* layer3 */
    {5, 7, 2, 3, 1, 1, true, 5, 3, 0},    /* odd channels, bias, 3 threads */
    {16, 32, 2, 3, 2, 1, false, 4, 2, 0}, /* layer4's first: 2x2 -> 1x1 */
    {3, 8, 2, 3, 1, 1, true, 3, 2, 0},    /* fewer channels than a vector's block */
    {24, 16, 1, 3, 1, 1, false, 6, 2, 0}, /* layer4: 1x1, the centre tap */
    {20, 9, 1, 3, 1, 1, true, 3, 3, 0},   /* 1x1, channels not a multiple of 16, bias */
    {6, 5, 2, 3, 1, 1, false, 4, 2, 4},   /* 2x4: 8 positions, two channels per vector, row by row */
    {9, 4, 1, 3, 1, 1, true, 3, 2, 2},    /* 1x2: 2 positions, two taps per output */
    /* other kernels and paddings (im2col takes the dense path for these, auto oneDNN) */
    {6, 5, 2, 5, 1, 2, false, 3, 2, 0}, /* 5x5 on 2x2: 25 taps, the row path */
    {3, 4, 4, 5, 1, 2, true, 2, 2, 0},  /* 5x5 on 4x4: 16 positions, one channel per vector */
    {5, 3, 1, 3, 1, 1, false, 3, 2, 3}, /* 1x3: 3 positions, the plain loops */
    {4, 3, 2, 3, 1, 2, true, 2, 3, 0},  /* 2x2 padded by 2: 16 outputs of 4 positions, the row path */
    {7, 5, 2, 2, 1, 0, false, 3, 2, 0}, /* a 2x2 kernel on 2x2, no padding */
    /* the fp32 forward's chunks of W' rows (1 MiB) and parts of output channels */
    {256, 256, 2, 3, 1, 1, false, 4, 2, 0}, /* 16 KiB of W' per channel: two chunks a part */
    {512, 40, 2, 3, 1, 1, true, 3, 1, 0},   /* one part, chunks of 32 and 8 channels */
    {300, 2, 2, 3, 1, 1, true, 3, 3, 0},    /* fewer output channels than threads */
};

typedef struct outs {
    float *y, *dx, *dxacc, *dw, *db;
} outs;

typedef struct data {
    float *x, *w, *b, *dy, *base;
    size_t xn, yn, wn;
} data;

/* forward, backward (dx written), forward, backward (dx added onto base) of batch n on a
 * layer prepared for max_n, in a context of the precision; *dense16: the layer ran the
 * bf16 matmul products */
static void run(const dshape *s, const char *impl, rt_precision prec, int max_n, const data *d, outs *o,
                bool *dense16) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options opt = {.device = rt_device_cpu(), .threads = s->threads, .precision = prec};
    assert_int_equal(setenv("RINGTRAIN_CONV", impl, 1), 0);
    assert_rt_ok(rt_model_ctx_create(&opt, &ctx));
    unsetenv("RINGTRAIN_CONV");
    rt_conv2d l;
    mt_arenas A;
    mt_arenas_init(&A);
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, width(s), s->k, s->stride, s->pad, s->bias));
    mt_place(&A, &l.weight, &l.dweight);
    if (s->bias) mt_place(&A, &l.bias, &l.dbias);
    mt_alloc(&A);
    memcpy(rt_tensor_data(&l.weight), d->w, d->wn * 4);
    if (s->bias) memcpy(rt_tensor_data(&l.bias), d->b, (size_t)s->out_c * 4);
    size_t ws;
    assert_rt_ok(rt_conv2d_prepare(ctx, &l, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(ctx, ws));
    *dense16 = rt_cpu_conv2d_dense16(&l);
    assert_rt_ok(rt_conv2d_forward(ctx, &l, s->n, (rt_act *)d->x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, s->n, (rt_act *)d->x, (rt_act *)d->dy, (rt_act *)o->dx, false));
    memcpy(o->dw, rt_tensor_data(&l.dweight), d->wn * 4);
    if (s->bias) memcpy(o->db, rt_tensor_data(&l.dbias), (size_t)s->out_c * 4);
    memcpy(o->dxacc, d->base, d->xn * 4);
    assert_rt_ok(rt_conv2d_forward(ctx, &l, s->n, (rt_act *)d->x, (rt_act *)o->y));
    assert_rt_ok(rt_conv2d_backward(ctx, &l, s->n, (rt_act *)d->x, (rt_act *)d->dy, (rt_act *)o->dxacc, true));
    rt_conv2d_release(ctx, &l);
    mt_free(&A);
    rt_model_ctx_destroy(ctx);
}

static void outs_alloc(outs *o, const data *d, int out_c) {
    o->y = malloc(d->yn * 4);
    o->dx = malloc(d->xn * 4);
    o->dxacc = malloc(d->xn * 4);
    o->dw = malloc(d->wn * 4);
    o->db = malloc((size_t)out_c * 4);
}

static void outs_free(outs *o) {
    free(o->y);
    free(o->dx);
    free(o->dxacc);
    free(o->dw);
    free(o->db);
}

static void bits_equal(const char *what, const float *a, const float *b, size_t n) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s[%zu]: %.9g (AVX-512) against %.9g (plain loops)", what, i, (double)a[i], (double)b[i]);
}

/* |a - b| <= one bf16 step (2^-7 relative) of the larger, element by element */
static void within_bf16_step(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const double m = fmax(fabs((double)a[i]), fabs((double)b[i]));
        if (fabs((double)a[i] - b[i]) > m * 0x1p-7)
            fail_msg("%s[%zu]: %.9g (bf16 matmul) against %.9g (fp32 products)", what, i, (double)a[i], (double)b[i]);
    }
}

static void within_rel(const char *what, const float *a, const float *b, size_t n, double tol) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)b[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    if (d > tol * mx) fail_msg("%s: max difference %.3g of max %.3g (tolerance %.1g)", what, d, mx, tol);
}

static void make_data(const dshape *s, data *d) {
    rt_conv2d l;
    assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, width(s), s->k, s->stride, s->pad, s->bias));
    d->xn = (size_t)s->n * s->in_c * s->hw * width(s);
    d->yn = (size_t)s->n * s->out_c * l.out_h * l.out_w;
    d->wn = (size_t)s->out_c * s->in_c * s->k * s->k;
    d->x = malloc(d->xn * 4);
    d->w = malloc(d->wn * 4);
    d->b = malloc((size_t)s->out_c * 4);
    d->dy = malloc(d->yn * 4);
    d->base = malloc(d->xn * 4);
    mt_randn(d->x, d->xn, 21);
    mt_randn(d->w, d->wn, 22);
    mt_randn(d->b, (size_t)s->out_c, 23);
    mt_randn(d->dy, d->yn, 24);
    mt_randn(d->base, d->xn, 25);
    /* ties of the bf16 rounding (low 16 bits 0x8000, either parity), and values just
     * below and above, in the weights and the input */
    float *tie[2] = {d->w, d->x};
    size_t cnt[2] = {d->wn, d->xn};
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < cnt[a]; i += 3) {
            uint32_t u;
            memcpy(&u, &tie[a][i], 4);
            u = (u & 0xffff0000u) | (i % 2 ? 0x8000u : (i % 3 ? 0x7fffu : 0x8001u));
            memcpy(&tie[a][i], &u, 4);
        }
}

static void free_data(data *d) {
    free(d->x);
    free(d->w);
    free(d->b);
    free(d->dy);
    free(d->base);
}

static void test_dense_avx512_equals_plain(void **state) {
    (void)state;
#if defined(__x86_64__) && defined(__GNUC__)
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        print_message("no AVX-512 on this CPU: the plain loops run either way, nothing to compare\n");
        skip();
    }
#else
    skip();
#endif
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const dshape *s = &shapes[i];
        data d;
        make_data(s, &d);
        for (int pi = 0; pi < 2; pi++) {
            const rt_precision prec = pi ? RT_PRECISION_BF16 : RT_PRECISION_FP32;
            outs fast, plain;
            outs_alloc(&fast, &d, s->out_c);
            outs_alloc(&plain, &d, s->out_c);
            bool m1, m2;
            /* prepared for the batch (auto, bf16: the matmul products) and for a larger
             * one; im2col: the dense path whatever the size of W' */
            for (int r = 0; r < 3; r++) {
                const char *impl = r < 2 ? "auto" : "im2col";
                const int extra = r == 1;
                run(s, impl, prec, s->n + extra, &d, &fast, &m1);
                rt_cpu_conv2d_force_plain(true);
                run(s, impl, prec, s->n + extra, &d, &plain, &m2);
                rt_cpu_conv2d_force_plain(false);
                print_message("conv %d->%d k%d s%d on %dx%d%s, n %d prepared for %d, %s, %s%s: comparing\n", s->in_c,
                              s->out_c, s->k, s->stride, s->hw, width(s), s->bias ? " bias" : "", s->n, s->n + extra,
                              impl, rt_precision_name(prec), m1 && extra == 0 ? " (bf16 matmul)" : "");
                bits_equal("y", fast.y, plain.y, d.yn);
                bits_equal("dx", fast.dx, plain.dx, d.xn);
                bits_equal("dx accumulated", fast.dxacc, plain.dxacc, d.xn);
                bits_equal("dW", fast.dw, plain.dw, d.wn);
                if (s->bias) bits_equal("db", fast.db, plain.db, (size_t)s->out_c);
            }
            outs_free(&fast);
            outs_free(&plain);
        }
        free_data(&d);
    }
}

static void test_dense16_matches_fp32_products(void **state) {
    (void)state;
    for (size_t i = 0; i < 6; i++) {
        const dshape *s = &shapes[i];
        data d;
        make_data(s, &d);
        outs mm, ref;
        outs_alloc(&mm, &d, s->out_c);
        outs_alloc(&ref, &d, s->out_c);
        bool on_mm, on_ref;
        run(s, "auto", RT_PRECISION_BF16, s->n, &d, &mm, &on_mm);
        run(s, "auto", RT_PRECISION_BF16, s->n + 1, &d, &ref, &on_ref);
#ifdef RT_HAVE_DNNL
        /* Debian's oneDNN 2.6 has this matmul, and the dense path takes ResNet's shapes
         * (the first six): the test is about it */
        assert_true(on_mm);
#endif
        print_message("conv %d->%d k%d s%d on %dx%d%s, n %d: bf16 matmul %s\n", s->in_c, s->out_c, s->k, s->stride,
                      s->hw, width(s), s->bias ? " bias" : "", s->n, on_mm ? "against fp32 products" : "not built");
        within_bf16_step("y", mm.y, ref.y, d.yn);
        within_bf16_step("dx", mm.dx, ref.dx, d.xn);
        within_rel("dx accumulated", mm.dxacc, ref.dxacc, d.xn, 0x1p-7);
        within_rel("dW", mm.dw, ref.dw, d.wn, 1e-5);
        if (s->bias) within_rel("db", mm.db, ref.db, (size_t)s->out_c, 1e-5);
        /* the outputs are bf16 values, and not all zero */
        for (size_t j = 0; j < d.yn; j++)
            if (mm.y[j] != rt_bf16_round(mm.y[j])) fail_msg("y[%zu] = %.9g is no bf16 value", j, (double)mm.y[j]);
        for (size_t j = 0; j < d.xn; j++)
            if (mm.dx[j] != rt_bf16_round(mm.dx[j])) fail_msg("dx[%zu] = %.9g is no bf16 value", j, (double)mm.dx[j]);
        assert_true(fabs(mm.y[0]) + fabs(mm.dw[d.wn / 2]) > 0);
        outs_free(&mm);
        outs_free(&ref);
        free_data(&d);
    }
}

/* A tap that reads only padding gets a zero gradient, every time: oneDNN's bf16
 * backward-weights, one part on several OpenMP threads, wrote varying values there
 * (conv 33->1 3x3 stride 3 on 3x2 with bias: kw 0 never meets the input). The layer's
 * dW is compared over repeated runs and its dead taps with zero, in both precisions. */
static void test_dead_taps_zero(void **state) {
    (void)state;
    const dshape shapes2[] = {
        {33, 1, 3, 3, 3, 1, true, 2, 3, 2},
        {33, 1, 3, 3, 3, 1, true, 2, 2, 2},
        {17, 2, 3, 3, 3, 1, false, 3, 2, 3},
    };
    for (size_t i = 0; i < sizeof shapes2 / sizeof shapes2[0]; i++) {
        const dshape *s = &shapes2[i];
        data d;
        make_data(s, &d);
        rt_conv2d l;
        assert_rt_ok(rt_conv2d_init(&l, s->in_c, s->out_c, s->hw, width(s), s->k, s->stride, s->pad, s->bias));
        for (int pi = 0; pi < 2; pi++) {
            const rt_precision prec = pi ? RT_PRECISION_FP32 : RT_PRECISION_BF16;
            outs first, o;
            outs_alloc(&first, &d, s->out_c);
            outs_alloc(&o, &d, s->out_c);
            bool m;
            run(s, "auto", prec, s->n, &d, &first, &m);
            for (int rep = 0; rep < 8; rep++) {
                run(s, "auto", prec, s->n, &d, &o, &m);
                if (memcmp(o.dw, first.dw, d.wn * 4) != 0)
                    fail_msg("conv %d->%d on %dx%d, %s: dW differs between runs of the same inputs", s->in_c, s->out_c,
                             s->hw, width(s), rt_precision_name(prec));
            }
            int dead = 0;
            for (int ki = 0; ki < s->k; ki++)
                for (int kj = 0; kj < s->k; kj++) {
                    bool live_h = false, live_w = false;
                    for (int oh = 0; oh < l.out_h; oh++) {
                        const int ih = oh * s->stride - s->pad + ki;
                        live_h |= ih >= 0 && ih < s->hw;
                    }
                    for (int ow = 0; ow < l.out_w; ow++) {
                        const int iw = ow * s->stride - s->pad + kj;
                        live_w |= iw >= 0 && iw < width(s);
                    }
                    if (live_h && live_w) continue;
                    for (int oc = 0; oc < s->out_c; oc++)
                        for (int c = 0; c < s->in_c; c++) {
                            const float g = first.dw[(((size_t)oc * s->in_c + c) * s->k + ki) * s->k + kj];
                            if (g != 0.0f)
                                fail_msg("conv %d->%d on %dx%d, %s: dW[%d, %d, %d, %d] = %g at a dead tap", s->in_c,
                                         s->out_c, s->hw, width(s), rt_precision_name(prec), oc, c, ki, kj, (double)g);
                            dead++;
                        }
                }
            assert_true(dead > 0);
            outs_free(&first);
            outs_free(&o);
        }
        free_data(&d);
    }
}

#ifdef RT_HAVE_DNNL
/* The dense path (auto) against oneDNN's convolution (RINGTRAIN_CONV=dnnl) at the
 * prepared batch, in fp32: another implementation altogether, so a chunk, part or
 * channel the dense path left out shows. Tolerances as test_model_conv_impl's. */
static void test_dense_matches_onednn(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const dshape *s = &shapes[i];
        data d;
        make_data(s, &d);
        outs a, b;
        outs_alloc(&a, &d, s->out_c);
        outs_alloc(&b, &d, s->out_c);
        bool m;
        run(s, "auto", RT_PRECISION_FP32, s->n, &d, &a, &m);
        run(s, "dnnl", RT_PRECISION_FP32, s->n, &d, &b, &m);
        print_message("conv %d->%d k%d s%d p%d on %dx%d, n %d, %d threads: dense (auto) against oneDNN\n", s->in_c,
                      s->out_c, s->k, s->stride, s->pad, s->hw, width(s), s->n, s->threads);
        within_rel("y", a.y, b.y, d.yn, 1e-5);
        within_rel("dx", a.dx, b.dx, d.xn, 1e-4);
        within_rel("dx accumulated", a.dxacc, b.dxacc, d.xn, 1e-4);
        within_rel("dW", a.dw, b.dw, d.wn, 1e-4);
        if (s->bias) within_rel("db", a.db, b.db, (size_t)s->out_c, 1e-4);
        outs_free(&a);
        outs_free(&b);
        free_data(&d);
    }
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dead_taps_zero), /* first: its bug showed on a fresh heap */
        cmocka_unit_test(test_dense_avx512_equals_plain),
        cmocka_unit_test(test_dense16_matches_fp32_products),
#ifdef RT_HAVE_DNNL
        cmocka_unit_test(test_dense_matches_onednn),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
