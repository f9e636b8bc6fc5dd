/* The CPU max pooling (src/model/cpu/ops_cpu.c, vectorised over a row's windows) gives
 * exactly what the plain scan that specifies it gives (written out again here): each
 * window clipped to the plane, scanned in row-major order, a value taken when it is
 * greater than the best so far or is NaN; so ties go to the first maximum and the last NaN
 * of a window wins (PyTorch's CPU rule). y is compared bit for bit (the inputs hold NaNs
 * with distinct payloads, so the NaN that won shows), and the argmax through backward's
 * dx: dy scattered to each output's argmax in output order, bit for bit, for a prepared
 * layer (the forward's recorded argmax) and an unprepared one (backward finds the maxima
 * again). Inputs are drawn from a few values so that windows hold ties, with -inf, +inf
 * and NaNs among them; shapes: the ResNet stem's 14x14 k3 s2 p1, odd sizes, k2 s2 p0,
 * planes smaller than a window and rows wider than a vector, on 1, 2 and 3 threads.
 */
#include "model_test_util.h"

#include "model/cpu/cpu_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static int spec_argmax(const rt_maxpool2d *l, const float *xp, int oh, int ow) {
    int arg = -1;
    float m = 0.0f;
    for (int kh = 0; kh < l->k; kh++)
        for (int kw = 0; kw < l->k; kw++) {
            const int ih = oh * l->stride - l->pad + kh, iw = ow * l->stride - l->pad + kw;
            if (ih < 0 || ih >= l->in_h || iw < 0 || iw >= l->in_w) continue;
            const float v = xp[ih * l->in_w + iw];
            if (arg < 0 || v > m || isnan(v)) {
                m = v;
                arg = ih * l->in_w + iw;
            }
        }
    return arg;
}

/* y and dx (dy scattered by argmax, outputs in order) of the plain scan */
static void spec(const rt_maxpool2d *l, int n, const float *x, const float *dy, float *y, float *dx) {
    const size_t IP = (size_t)l->in_h * l->in_w, OP = (size_t)l->out_h * l->out_w;
    memset(dx, 0, sizeof(float) * n * l->c * IP);
    for (size_t p = 0; p < (size_t)n * l->c; p++)
        for (int oh = 0; oh < l->out_h; oh++)
            for (int ow = 0; ow < l->out_w; ow++) {
                const size_t o = p * OP + (size_t)oh * l->out_w + ow;
                const int a = spec_argmax(l, x + p * IP, oh, ow);
                y[o] = x[p * IP + a];
                dx[p * IP + a] += dy[o];
            }
}

static void same_bits(const char *what, const float *a, const float *b, size_t n) {
    size_t off = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) first = off++ ? first : i;
    if (off) fail_msg("%s: %zu of %zu elements differ from the plain scan's bits (first at %zu)", what, off, n, first);
}

/* values from {-2, -1, 0, 1, 2} (ties), with -inf, +inf and NaNs of distinct payloads
 * (some with the sign bit set) sprinkled in */
static void fill(float *x, size_t count, uint64_t seed) {
    rt_rng r;
    rt_rng_init(&r, seed, 3);
    for (size_t i = 0; i < count; i++) {
        const uint32_t u = rt_rng_u32(&r);
        const uint32_t c = u % 64;
        uint32_t bits;
        if (c == 0) {
            bits = 0x7fc00000u | (u >> 10 & 0x3fffffu) | 1u; /* quiet NaN, payload from u */
        } else if (c == 1) {
            bits = 0xffc00000u | (u >> 12 & 0xffu);
        } else if (c < 4) {
            bits = 0xff800000u; /* -inf */
        } else if (c == 4) {
            bits = 0x7f800000u; /* +inf */
        } else {
            const float v = (float)((int)(u >> 8 & 7u) % 5 - 2);
            memcpy(&bits, &v, 4);
        }
        memcpy(&x[i], &bits, 4);
    }
}

static void run(int n, int c, int h, int w, int k, int s, int p, int threads) {
    rt_model_ctx *ctx = mt_ctx(threads);
    rt_maxpool2d u, v; /* unprepared; prepared */
    assert_rt_ok(rt_maxpool2d_init(&u, c, h, w, k, s, p));
    assert_rt_ok(rt_maxpool2d_init(&v, c, h, w, k, s, p));
    assert_rt_ok(rt_maxpool2d_prepare(ctx, &v, n));
    const size_t xn = (size_t)n * c * h * w, yn = (size_t)n * c * u.out_h * u.out_w;
    float *x = malloc(xn * 4), *dy = malloc(yn * 4), *y = malloc(yn * 4), *ty = malloc(yn * 4), *dx = malloc(xn * 4),
          *tdx = malloc(xn * 4);
    assert_true(x && dy && y && ty && dx && tdx);
    fill(x, xn, 1000u * (uint64_t)h + (uint64_t)w);
    /* one plane all -inf: every window's maximum is its first value */
    for (size_t i = 0; i < (size_t)h * w; i++) x[xn - 1 - i] = -INFINITY;
    mt_randn(dy, yn, 77);
    spec(&u, n, x, dy, ty, tdx);
    char what[128];
    for (int mode = 0; mode < 4; mode++) {
        const int prepared = mode & 1, plain = mode >> 1;
        rt_maxpool2d *l = prepared ? &v : &u;
        rt_cpu_maxpool2d_force_plain(plain);
        memset(y, 0x55, yn * 4);
        memset(dx, 0x55, xn * 4);
        assert_rt_ok(rt_maxpool2d_forward(ctx, l, n, (rt_act *)x, (rt_act *)y));
        rt_cpu_maxpool2d_force_plain(false);
        snprintf(what, sizeof what, " y of %dx%dx%dx%d k%d s%d p%d, %s, %s, %d threads", n, c, h, w, k, s, p,
                 prepared ? "prepared" : "unprepared", plain ? "plain scan forced" : "default", threads);
        same_bits(what + 1, y, ty, yn);
        assert_rt_ok(rt_maxpool2d_backward(ctx, l, n, (rt_act *)x, (rt_act *)y, (rt_act *)dy, (rt_act *)dx));
        memcpy(what, "dx", 2);
        same_bits(what, dx, tdx, xn);
    }
    rt_maxpool2d_release(ctx, &v);
    free(x), free(dy), free(y), free(ty), free(dx), free(tdx);
    rt_model_ctx_destroy(ctx);
}

/* the ResNet stem's pooling (64 channels, 14x14 -> 7x7 at 28x28), on 1, 2 and 3 threads */
static void test_stem(void **state) {
    (void)state;
    for (int t = 1; t <= 3; t++) run(3, 64, 14, 14, 3, 2, 1, t);
    run(1, 3, 112, 112, 3, 2, 1, 2); /* at 224x224: rows wider than a vector */
}

static void test_other_shapes(void **state) {
    (void)state;
    run(3, 5, 13, 11, 3, 2, 1, 2); /* odd sizes */
    run(2, 3, 7, 7, 3, 2, 1, 3);
    run(2, 4, 8, 8, 2, 2, 0, 2);    /* k2 s2 p0 */
    run(2, 3, 9, 7, 2, 2, 0, 1);    /* k2 s2 p0 dropping the last row and column */
    run(1, 3, 3, 3, 3, 2, 1, 2);    /* every window falls off the border */
    run(2, 2, 1, 5, 3, 1, 1, 2);    /* one row */
    run(1, 2, 6, 1, 3, 2, 1, 1);    /* one column */
    run(1, 2, 1, 1, 3, 1, 1, 1);    /* one value */
    run(2, 3, 10, 10, 3, 1, 1, 2);  /* k3 s1 p1 */
    run(1, 2, 9, 40, 3, 2, 1, 2);   /* a row of 20 outputs */
    run(1, 3, 17, 23, 5, 3, 2, 2);  /* k5 s3 p2 */
    run(2, 2, 11, 11, 2, 3, 0, 1);  /* stride larger than the window */
    run(1, 2, 5, 37, 1, 1, 0, 2);   /* k1: a copy */
    run(1, 2, 13, 21, 8, 1, 4, 2);  /* the widest window of the vector path, padding 4 */
    run(1, 2, 10, 12, 4, 2, 2, 1);  /* even window, padding k/2 */
    run(1, 2, 3, 45, 2, 20, 0, 1);  /* stride over 16: one output per vector */
    run(1, 1, 20, 20, 20, 1, 0, 1); /* the whole plane in one window */
    run(1, 2, 9, 9, 9, 4, 4, 1);    /* windows over 8 wide (the plain scan), padding 4 */
}

/* time of the stem's forward, batch 64, one thread, vectorised and plain (issue 22, item 5;
 * only printed) */
static void test_time_stem(void **state) {
    (void)state;
    rt_model_ctx *ctx = mt_ctx(1);
    rt_maxpool2d l;
    const int n = 64, c = 64, reps = 20;
    assert_rt_ok(rt_maxpool2d_init(&l, c, 14, 14, 3, 2, 1));
    assert_rt_ok(rt_maxpool2d_prepare(ctx, &l, n));
    const size_t xn = (size_t)n * c * 14 * 14, yn = (size_t)n * c * 7 * 7;
    float *x = malloc(xn * 4), *y = malloc(yn * 4);
    assert_true(x && y);
    mt_randn(x, xn, 5);
    for (int plain = 0; plain < 2; plain++) {
        rt_cpu_maxpool2d_force_plain(plain);
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            assert_rt_ok(rt_maxpool2d_forward(ctx, &l, n, (rt_act *)x, (rt_act *)y));
            clock_gettime(CLOCK_MONOTONIC, &b);
            const double t = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
            best = t < best ? t : best;
        }
        rt_cpu_maxpool2d_force_plain(false);
        print_message("maxpool forward 64x64x14x14 k3 s2 p1, 1 thread, %s: best of %d %.3f ms (%.1f ns per output)\n",
                      plain ? "plain" : "default", reps, best * 1e3, best * 1e9 / (double)yn);
    }
    rt_maxpool2d_release(ctx, &l);
    free(x), free(y);
    rt_model_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stem),
        cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_time_stem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
