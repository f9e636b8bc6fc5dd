/* The CUDA backend's non-convolution layers in every activation format (issue 41 item 1;
 * model/ctx.h "The activation format"; docs/gpu.md "Activation formats: the kernels"):
 * fp32 NCHW, fp32 NHWC, bf16 NHWC and bf16 NCHW, each in a GPU context created with
 * .act_format, against the CPU backend's fp32 layers run on the SAME values: inputs are
 * made on the host (rounded to bf16 first in a bf16 format, so both sides see the same
 * input), uploaded with rt_act_upload and read back with rt_act_download.
 *
 * Bounds (max-norm relative, gpu_test_util.h), derived:
 *  - relu, add, accumulate, max pooling (forward and backward), average pooling's
 *    backward, dropout: the kernels do the CPU's fp32 arithmetic in the CPU's order on the
 *    same values, so the GPU's result is the CPU's fp32 result, rounded once to bf16 (to
 *    nearest even, core/bf16.h) in a bf16 format: compared EXACTLY against that (bit for
 *    bit; fp32 formats: against the CPU's bits). A truncating store or a wrong index fails.
 *  - average pooling's forward writes fp32 features (sums in double of the same values):
 *    exact in every format.
 *  - batch norm: the fp32 bounds of test_gpu_layers (TOL_FWD 1e-5 output and statistics,
 *    TOL_GRAD 1e-4 gradients: sums in double in another order), plus, for outputs stored
 *    in bf16 (y, dx), one rounding: |round(g) - c| <= |round(g) - g| + |g - c| <= 2^-8 |g|
 *    + the fp32 part, so 2^-8 + TOL. The statistics (save_mean/invstd, running_mean/var)
 *    and dweight/dbias are fp32 in every format: the fp32 bounds alone.
 *  - dropout: the GPU's mask equals the CPU's for the same seed and counter, bit for bit,
 *    in every format (PyTorch's NCHW order).
 *  - the conversions: act_from_nchw with padded channels stores zeros there and
 *    act_to_nchw reads only the first c channels (exact).
 * Synchronised batch norm runs the same batch-norm case with a one-rank all-reduce (the
 * identity): its statistics are the rank's own, so the CPU's plain batch norm is the
 * reference within the same bounds.
 */
#include "gpu_test_util.h"
#include "gpu_bn_util.h"

#include "core/bf16.h"

#include <stdlib.h>

static const rt_act_format k_formats[] = {
    {RT_F32, RT_ACT_NCHW, 1}, {RT_F32, RT_ACT_NHWC, 1}, {RT_BF16, RT_ACT_NHWC, 1}, {RT_BF16, RT_ACT_NCHW, 1}};
#define N_FORMATS ((int)(sizeof k_formats / sizeof k_formats[0]))
#define BF16_ROUNDING 0.00390625 /* 2^-8: one rounding to bf16, relative */

static const char *fmt_name(const rt_act_format *f) {
    static char b[32];
    snprintf(b, sizeof b, "%s %s", f->dtype == RT_BF16 ? "bf16" : "fp32", f->layout == RT_ACT_NHWC ? "NHWC" : "NCHW");
    return b;
}

static bool bf(void) { return g_gpu->act.dtype == RT_BF16; }

/* the GPU context in format f (the CPU's stays) */
static void use_format(const rt_act_format *f) {
    if (g_gpu) rt_model_ctx_destroy(g_gpu);
    g_gpu = NULL;
    rt_model_ctx_options o = {.device = gt_gpu_device(), .threads = 4, .precision = RT_PRECISION_FP32,
                              .act_format = gt_on_cpu() ? NULL : f};
    assert_rt_ok(rt_model_ctx_create(&o, &g_gpu));
    printf("format %s\n", fmt_name(f));
}

static int setup(void **state) {
    (void)state;
    g_cpu = gt_ctx(rt_device_cpu(), RT_PRECISION_FP32);
    g_gpu = NULL;
    return 0;
}
static int teardown(void **state) {
    (void)state;
    if (g_gpu) rt_model_ctx_destroy(g_gpu);
    rt_model_ctx_destroy(g_cpu);
    return 0;
}

/* ---- host values and activations --------------------------------------------------- */

/* the values both sides see: rounded to bf16 in a bf16 format */
static float *as_stored(float *h, size_t n) {
    if (bf())
        for (size_t i = 0; i < n; i++) h[i] = rt_bf16_round(h[i]);
    return h;
}
static float *host_randn(size_t n, float std) { return as_stored(rt_test_randn(n, std), n); }

/* activations (n, c, h, w) on the GPU in its format, from host fp32 NCHW (or NaN poison) */
static rt_act *act_up(int n, int c, int h, int w, const float *host) {
    const size_t cnt = (size_t)n * c * h * w;
    rt_act *a = gt_dev(cnt * rt_act_elem_size(g_gpu));
    gt_poison(a, cnt * rt_act_elem_size(g_gpu));
    if (host) assert_rt_ok(rt_act_upload(g_gpu, n, c, h, w, host, a));
    return a;
}
static float *act_down(int n, int c, int h, int w, const rt_act *a) {
    float *host = rt_test_nans((size_t)n * c * h * w);
    gt_sync();
    assert_rt_ok(rt_act_download(g_gpu, n, c, h, w, a, host));
    return host;
}

/* exact: the GPU's activations equal the CPU's fp32 result, rounded once in bf16 */
static void check_act_exact(const char *what, const float *cpu, const rt_act *g, int n, int c, int h, int w) {
    const size_t cnt = (size_t)n * c * h * w;
    float *want = rt_test_copy(cpu, cnt), *got = act_down(n, c, h, w, g);
    as_stored(want, cnt);
    size_t first = 0, differ = rt_test_count_differ(want, got, cnt, &first);
    printf("  %-44s %zu of %zu differ (%s)\n", what, differ, cnt, fmt_name(&g_gpu->act));
    if (differ)
        fail_msg("%s (%s): %zu elements differ (first %zu: want %.9g got %.9g, seed %llu)", what,
                 fmt_name(&g_gpu->act), differ, first, (double)want[first], (double)got[first],
                 (unsigned long long)g_seed);
    free(want), free(got);
}

/* within tol (fp32) plus one bf16 rounding in a bf16 format */
static void check_act(const char *what, const float *cpu, const rt_act *g, int n, int c, int h, int w, double tol) {
    const size_t cnt = (size_t)n * c * h * w;
    float *got = act_down(n, c, h, w, g);
    const double bound = tol + (bf() ? BF16_ROUNDING : 0);
    size_t at = 0;
    const double e = gt_rel_err(cpu, got, cnt, &at);
    printf("  %-44s rel err %.3g (bound %.3g, %s)\n", what, e, bound, fmt_name(&g_gpu->act));
    if (!(e <= bound))
        fail_msg("%s (%s): relative error %.3g > %.3g (element %zu: cpu %.9g gpu %.9g, seed %llu)", what,
                 fmt_name(&g_gpu->act), e, bound, at, (double)cpu[at], (double)got[at], (unsigned long long)g_seed);
    free(got);
}

/* ---- the conversions at the boundary ---------------------------------------------- */

/* from_nchw into 8 stored channels: the first 3 the input, the other 5 zero; to_nchw of
 * all 8 shows the zeros, of the first 3 drops them */
static void conversion_case(void) {
    const int n = 2, c = 3, sc = 8, h = 4, w = 5;
    const size_t cnt = (size_t)n * c * h * w, scnt = (size_t)n * sc * h * w;
    float *hx = host_randn(cnt, 1.0f), *src = gt_dev_copy(hx, cnt);
    rt_act *a = gt_dev(scnt * rt_act_elem_size(g_gpu));
    gt_poison(a, scnt * rt_act_elem_size(g_gpu));
    assert_rt_ok(rt_act_from_nchw(g_gpu, n, c, h, w, sc, src, a));
    float *all = gt_dev_nan(scnt), *back = gt_dev_nan(cnt);
    assert_rt_ok(rt_act_to_nchw(g_gpu, n, sc, h, w, sc, a, all));
    assert_rt_ok(rt_act_to_nchw(g_gpu, n, c, h, w, sc, a, back));
    assert_rt_ok(rt_model_ctx_sync(g_gpu));
    float *want = rt_test_floats(scnt);
    for (size_t i = 0; i < scnt; i++) {
        const size_t img = i / ((size_t)sc * h * w), r = i % ((size_t)sc * h * w), ch = r / ((size_t)h * w);
        want[i] = ch < (size_t)c ? hx[(img * c + ch) * h * w + r % ((size_t)h * w)] : 0.0f;
    }
    gt_check_exact("from_nchw padded 3 -> 8 channels (zeros)", want, all, scnt);
    gt_check_exact("to_nchw of the first 3 of 8", hx, back, cnt);
    free(hx), free(want);
    gt_free(src), gt_free(a), gt_free(all), gt_free(back);
}

/* ---- elementwise -------------------------------------------------------------------- */

static void elementwise_case(void) {
    const int n = 3, c = 5, h = 7, w = 9;
    const size_t cnt = (size_t)n * c * h * w;
    float *hx = host_randn(cnt, 1.0f), *hb = host_randn(cnt, 1.0f), *hdy = host_randn(cnt, 1.0f);
    hx[0] = 0.0f, hx[1] = -0.0f;
    float *cy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt);
    rt_act *gx = act_up(n, c, h, w, hx), *gb = act_up(n, c, h, w, hb), *gdy = act_up(n, c, h, w, hdy);
    rt_act *gy = act_up(n, c, h, w, NULL), *gdx = act_up(n, c, h, w, NULL);
    assert_rt_ok(rt_relu_forward(g_cpu, cnt, (rt_act *)hx, (rt_act *)cy));
    assert_rt_ok(rt_relu_forward(g_gpu, cnt, gx, gy));
    check_act_exact("relu forward", cy, gy, n, c, h, w);
    assert_rt_ok(rt_relu_backward(g_cpu, cnt, (rt_act *)cy, (rt_act *)hdy, (rt_act *)cdx));
    assert_rt_ok(rt_relu_backward(g_gpu, cnt, gy, gdy, gdx));
    check_act_exact("relu backward", cdx, gdx, n, c, h, w);
    assert_rt_ok(rt_add_forward(g_cpu, cnt, (rt_act *)hx, (rt_act *)hb, (rt_act *)cy));
    assert_rt_ok(rt_add_forward(g_gpu, cnt, gx, gb, gy));
    check_act_exact("add", cy, gy, n, c, h, w);
    /* accumulate into the GPU's own (rounded) sum: the CPU starts from the same values */
    float *start = act_down(n, c, h, w, gy);
    assert_rt_ok(rt_add_backward(g_cpu, cnt, (rt_act *)hdy, (rt_act *)start));
    assert_rt_ok(rt_add_backward(g_gpu, cnt, gdy, gy));
    check_act_exact("accumulate (add backward)", start, gy, n, c, h, w);
    free(hx), free(hb), free(hdy), free(cy), free(cdx), free(start);
    gt_free(gx), gt_free(gb), gt_free(gdy), gt_free(gy), gt_free(gdx);
}

/* ---- pooling ------------------------------------------------------------------------- */

static void maxpool_case(int n, int c, int h, int w, int k, int s, int pad) {
    rt_maxpool2d l;
    assert_rt_ok(rt_maxpool2d_init(&l, c, h, w, k, s, pad));
    assert_rt_ok(rt_maxpool2d_prepare(g_cpu, &l, n));
    assert_rt_ok(rt_maxpool2d_prepare(g_gpu, &l, n));
    const size_t xn = (size_t)n * c * h * w, yn = (size_t)n * c * l.out_h * l.out_w;
    float *hx = rt_test_randn(xn, 1.0f), *hdy = host_randn(yn, 1.0f);
    for (size_t i = 0; i < xn; i++) hx[i] = roundf(hx[i] * 2.0f) * 0.5f; /* ties: the first maximum wins */
    float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn);
    rt_act *gx = act_up(n, c, h, w, hx), *gdy = act_up(n, c, l.out_h, l.out_w, hdy);
    rt_act *gy = act_up(n, c, l.out_h, l.out_w, NULL), *gdx = act_up(n, c, h, w, NULL);
    assert_rt_ok(rt_maxpool2d_forward(g_cpu, &l, n, (rt_act *)hx, (rt_act *)cy));
    assert_rt_ok(rt_maxpool2d_forward(g_gpu, &l, n, gx, gy));
    check_act_exact("maxpool forward", cy, gy, n, c, l.out_h, l.out_w);
    assert_rt_ok(rt_maxpool2d_backward(g_cpu, &l, n, (rt_act *)hx, (rt_act *)cy, (rt_act *)hdy, (rt_act *)cdx));
    assert_rt_ok(rt_maxpool2d_backward(g_gpu, &l, n, gx, gy, gdy, gdx));
    check_act_exact("maxpool backward", cdx, gdx, n, c, h, w);
    rt_maxpool2d_release(g_cpu, &l), rt_maxpool2d_release(g_gpu, &l);
    free(hx), free(hdy), free(cy), free(cdx);
    gt_free(gx), gt_free(gdy), gt_free(gy), gt_free(gdx);
}

static void avgpool_case(int n, int c, int h, int w) {
    const int hw = h * w;
    const size_t xn = (size_t)n * c * hw, yn = (size_t)n * c;
    float *hx = host_randn(xn, 1.0f), *hdy = rt_test_randn(yn, 1.0f); /* dy: fp32 features */
    float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gy = gt_dev_nan(yn), *gdy = gt_dev_copy(hdy, yn);
    rt_act *gx = act_up(n, c, h, w, hx), *gdx = act_up(n, c, h, w, NULL);
    assert_rt_ok(rt_avgpool_forward(g_cpu, n, c, hw, (rt_act *)hx, cy));
    assert_rt_ok(rt_avgpool_forward(g_gpu, n, c, hw, gx, gy));
    gt_check_exact("avgpool forward (fp32 features)", cy, gy, yn);
    assert_rt_ok(rt_avgpool_backward(g_cpu, n, c, hw, hdy, (rt_act *)cdx));
    assert_rt_ok(rt_avgpool_backward(g_gpu, n, c, hw, gdy, gdx));
    check_act_exact("avgpool backward", cdx, gdx, n, c, h, w);
    free(hx), free(hdy), free(cy), free(cdx);
    gt_free(gy), gt_free(gdy), gt_free(gx), gt_free(gdx);
}

/* ---- dropout: the mask in PyTorch's order in every format ---------------------------- */

static void dropout_case(bool channelwise, int n, int c, int h, int w) {
    rt_dropout lc, lg;
    assert_rt_ok(rt_dropout_init(&lc, 0.4f, channelwise, c, h, w, g_seed ^ 0xd0u, 5));
    lg = lc;
    const size_t cnt = (size_t)n * c * h * w, draws = cnt / (size_t)lc.plane;
    lc.mask = rt_test_nans(draws);
    lg.mask = gt_dev_nan(draws);
    float *hx = host_randn(cnt, 1.0f), *hdy = host_randn(cnt, 1.0f), *cy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt);
    rt_act *gx = act_up(n, c, h, w, hx), *gdy = act_up(n, c, h, w, hdy);
    rt_act *gy = act_up(n, c, h, w, NULL), *gdx = act_up(n, c, h, w, NULL);
    assert_rt_ok(rt_dropout_forward(g_cpu, &lc, n, (rt_act *)hx, (rt_act *)cy, true));
    assert_rt_ok(rt_dropout_forward(g_gpu, &lg, n, gx, gy, true));
    gt_check_exact(channelwise ? "dropout2d mask (PyTorch's order)" : "dropout mask (PyTorch's order)", lc.mask,
                   lg.mask, draws);
    check_act_exact("dropout forward", cy, gy, n, c, h, w);
    assert_rt_ok(rt_dropout_backward(g_cpu, &lc, n, (rt_act *)hdy, (rt_act *)cdx));
    assert_rt_ok(rt_dropout_backward(g_gpu, &lg, n, gdy, gdx));
    check_act_exact("dropout backward", cdx, gdx, n, c, h, w);
    free(lc.mask), free(hx), free(hdy), free(cy), free(cdx);
    gt_free(lg.mask), gt_free(gx), gt_free(gdy), gt_free(gy), gt_free(gdx);
}

/* ---- batch norm (fused and synchronised) -------------------------------------------- */

/* the backward of both sides (dy copied: the CPU's composed path may work in it) */
static void bn_backward_both(bn_pair *P, int n, const float *hx, const float *hact, const float *hdy, float *cdx,
                             const rt_act *gx, const rt_act *gact, rt_act *gdx, bool accumulate) {
    const int C = P->c.c, H = P->c.h, W = P->c.w;
    const size_t cnt = (size_t)n * C * H * W;
    float *cdy = rt_test_copy(hdy, cnt);
    rt_act *gdy = act_up(n, C, H, W, hdy);
    if (hact) {
        assert_rt_ok(rt_batchnorm2d_backward_act(g_cpu, &P->c, n, (rt_act *)hx, (rt_act *)hact, (rt_act *)cdy,
                                                 (rt_act *)cdx, accumulate));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_gpu, &P->g, n, gx, gact, gdy, gdx, accumulate));
    } else {
        assert_rt_ok(rt_batchnorm2d_backward(g_cpu, &P->c, n, (rt_act *)hx, (rt_act *)cdy, (rt_act *)cdx, accumulate));
        assert_rt_ok(rt_batchnorm2d_backward(g_gpu, &P->g, n, gx, gdy, gdx, accumulate));
    }
    free(cdy);
    gt_free(gdy);
}

/* training forward y = relu?(bn(x) + residual?) (output, saved and running statistics),
 * backward (through the ReLU whose output is a given act, the same on both sides: dx
 * written, dweight, dbias; dx accumulated), evaluation forward */
static void bn_fmt_case(int n, int C, int H, int W, bool residual, bool relu) {
    bn_pair P;
    bn_setup(&P, n, C, H, W);
    const size_t cnt = (size_t)n * C * H * W;
    float *hx = as_stored(bn_input(cnt, C, H, W), cnt), *hr = residual ? host_randn(cnt, 1.0f) : NULL;
    float *hdy = host_randn(cnt, 1.0f), *hdx0 = host_randn(cnt, 1.0f), *hact = NULL;
    if (relu) {
        hact = host_randn(cnt, 1.0f);
        for (size_t i = 0; i < cnt; i++) hact[i] = hact[i] > 0.0f ? hact[i] : 0.0f;
    }
    float *cy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt);
    rt_act *gx = act_up(n, C, H, W, hx), *gr = hr ? act_up(n, C, H, W, hr) : NULL, *gy = act_up(n, C, H, W, NULL);
    rt_act *gact = hact ? act_up(n, C, H, W, hact) : NULL, *gdx = act_up(n, C, H, W, NULL);
    char name[96], what[128];
    snprintf(name, sizeof name, "bn %dx%dx%d n=%d%s%s%s", C, H, W, n, residual ? " +res" : "", relu ? " relu" : "",
             g_gpu->bn_sync.all_reduce ? " synced" : "");

    assert_rt_ok(rt_batchnorm2d_forward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hr, (rt_act *)cy, true, relu));
    assert_rt_ok(rt_batchnorm2d_forward_act(g_gpu, &P.g, n, gx, gr, gy, true, relu));
    snprintf(what, sizeof what, "%s train forward", name);
    check_act(what, cy, gy, n, C, H, W, TOL_FWD);
    bn_check_stats(&P);

    gt_poison(rt_tensor_data(&P.g.dweight), C * sizeof(float));
    gt_poison(rt_tensor_data(&P.g.dbias), C * sizeof(float));
    bn_backward_both(&P, n, hx, hact, hdy, cdx, gx, gact, gdx, false);
    snprintf(what, sizeof what, "%s dx", name);
    check_act(what, cdx, gdx, n, C, H, W, TOL_GRAD);
    gt_check_dev("  dweight", rt_tensor_data(&P.c.dweight), rt_tensor_data(&P.g.dweight), (size_t)C, TOL_GRAD);
    gt_check_dev("  dbias", rt_tensor_data(&P.c.dbias), rt_tensor_data(&P.g.dbias), (size_t)C, TOL_GRAD);
    memcpy(cdx, hdx0, cnt * sizeof(float));
    assert_rt_ok(rt_act_upload(g_gpu, n, C, H, W, hdx0, gdx));
    bn_backward_both(&P, n, hx, hact, hdy, cdx, gx, gact, gdx, true);
    snprintf(what, sizeof what, "%s dx accumulated", name);
    check_act(what, cdx, gdx, n, C, H, W, TOL_GRAD);

    assert_rt_ok(rt_batchnorm2d_forward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hr, (rt_act *)cy, false, relu));
    assert_rt_ok(rt_batchnorm2d_forward_act(g_gpu, &P.g, n, gx, gr, gy, false, relu));
    snprintf(what, sizeof what, "%s eval forward", name);
    check_act(what, cy, gy, n, C, H, W, TOL_FWD);

    free(hx), free(hr), free(hdy), free(hdx0), free(hact), free(cy), free(cdx);
    gt_free(gx), gt_free(gy), gt_free(gdx);
    if (gr) gt_free(gr);
    if (gact) gt_free(gact);
    bn_teardown(&P);
}

/* one rank: the sum over the ranks is this rank's own */
static rt_status one_rank_all_reduce(void *user, double *buf, size_t count, rt_stream *stream) {
    (void)user, (void)buf, (void)count, (void)stream;
    return RT_OK;
}

static void bn_cases(void) {
    /* n, C, H, W: channels not a multiple of 8, a 1x1 plane, n * plane past one block's
     * slice (8192: 2 slices per channel; NHWC: 5 row tiles of 2048 rows), and in NHWC two
     * channel groups (32 + 8 channels) of 2 row tiles (256 rows each) */
    const int shapes[][4] = {{4, 5, 3, 5}, {6, 12, 1, 1}, {4, 3, 48, 48}, {3, 40, 12, 12}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int k = 0; k < 4; k += 3) /* plain, and + residual + relu */
            bn_fmt_case(shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], k & 1, k & 2);
}

/* ---- every layer in every format ---------------------------------------------------- */

static void test_formats(void **state) {
    (void)state;
    for (int f = 0; f < N_FORMATS; f++) {
        use_format(&k_formats[f]);
        conversion_case();
        elementwise_case();
        maxpool_case(3, 6, 14, 14, 3, 2, 1); /* the ResNet stem's */
        maxpool_case(2, 5, 9, 9, 3, 1, 1);   /* overlapping windows */
        avgpool_case(4, 6, 7, 7);
        avgpool_case(3, 10, 1, 1);
        dropout_case(true, 3, 5, 4, 6);
        dropout_case(false, 3, 5, 4, 6);
        bn_cases();
    }
}

static void test_formats_syncbn(void **state) {
    (void)state;
    const rt_bn_sync sync = {.all_reduce = one_rank_all_reduce};
    for (int f = 0; f < N_FORMATS; f++) {
        use_format(&k_formats[f]);
        assert_rt_ok(rt_model_ctx_set_bn_sync(g_gpu, &sync, 64));
        bn_cases();
    }
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_formats_syncbn),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
