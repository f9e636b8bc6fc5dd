/* The model backend's own CUDA kernels (src/model/cuda/kernels_cuda.cu),
 * compiled as host code through the CUDA emulation, against the CPU backend on the
 * cases of tests/model/test_gpu_layers.c, plus NaN in max pooling and out-of-range
 * labels in the losses. Sizes are not multiples of the 256-thread blocks, and grids have
 * many blocks, so partial blocks and the index arithmetic of every block are exercised.
 *
 * Agreement: kernels_cuda.cu promises the CPU loop's arithmetic in the same order and
 * precision, so every output here is compared bit for bit, except the two losses' mean
 * value: the kernel sums the per-row losses in a fixed tree over 256 threads, the CPU
 * from row 0 to n-1, both in double; the same terms in another order round to the same
 * float or its neighbour, so those two are checked to one float ulp.
 *
 * What the emulation does not show (docs/cuda-emulation.md): nvcc contracts plain
 * `a * b + c` into fused multiply-adds (log-softmax backward has one, in double) and
 * uses its own exp/log; the GPU tests keep their tolerances for those.
 */
#include "emu_test_util.h"

#include "core/bf16.h"
#include "core/tensor.h"
#include "model/cuda/cuda_internal.h"
#include "model/layers.h"

#include <cuda_runtime.h>

static const rt_act_format k_nchw_f32 = {RT_F32, RT_ACT_NCHW, 1}; /* the kernels' format argument */
static rt_model_ctx *g_cpu;

static int setup(void **state) {
    (void)state;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 2, .precision = RT_PRECISION_FP32};
    assert_rt_ok(rt_model_ctx_create(&o, &g_cpu));
    return 0;
}
static int teardown(void **state) {
    (void)state;
    rt_model_ctx_destroy(g_cpu);
    return 0;
}

#define assert_cuda_ok(expr) assert_int_equal((expr), cudaSuccess)

/* ---- relu, add, accumulate ----------------------------------------------------------- */

static void test_elementwise(void **state) {
    (void)state;
    const size_t n = 100003; /* 391 blocks, the last one partial */
    float *a = rt_test_randn(n, 1.0f), *b = rt_test_randn(n, 1.0f);
    a[0] = 0.0f, a[1] = -0.0f, a[2] = NAN, a[n - 1] = -INFINITY; /* relu's edges */
    float *cy = rt_test_nans(n), *gy = rt_test_nans(n);

    assert_rt_ok(rt_relu_forward(g_cpu, n, (rt_act *)a, (rt_act *)cy));
    assert_cuda_ok(rt_cuk_relu_forward(NULL, RT_F32, n, a, gy));
    et_check_exact("relu forward", cy, gy, n);
    float *cdx = rt_test_copy(b, n), *gdx = rt_test_copy(b, n); /* backward in place on dy */
    assert_rt_ok(rt_relu_backward(g_cpu, n, (rt_act *)cy, (rt_act *)cdx, (rt_act *)cdx));
    assert_cuda_ok(rt_cuk_relu_backward(NULL, RT_F32, n, gy, gdx, gdx));
    et_check_exact("relu backward (in place)", cdx, gdx, n);
    float *cx = rt_test_copy(a, n), *gx = rt_test_copy(a, n);
    assert_rt_ok(rt_relu_forward(g_cpu, n, (rt_act *)cx, (rt_act *)cx));
    assert_cuda_ok(rt_cuk_relu_forward(NULL, RT_F32, n, gx, gx));
    et_check_exact("relu forward (in place)", cx, gx, n);

    et_poison(gy, n);
    assert_rt_ok(rt_add_forward(g_cpu, n, (rt_act *)a, (rt_act *)b, (rt_act *)cy));
    assert_cuda_ok(rt_cuk_add(NULL, RT_F32, n, a, b, gy));
    et_check_exact("add", cy, gy, n);
    assert_rt_ok(rt_add_backward(g_cpu, n, (rt_act *)b, (rt_act *)cy));
    assert_cuda_ok(rt_cuk_accumulate(NULL, RT_F32, n, b, gy));
    et_check_exact("accumulate", cy, gy, n);
    /* count 0 launches nothing */
    unsigned long long launches = rt_emu_launch_count();
    assert_cuda_ok(rt_cuk_relu_forward(NULL, RT_F32, 0, a, gy));
    assert_cuda_ok(rt_cuk_add(NULL, RT_F32, 0, a, b, gy));
    assert_true(rt_emu_launch_count() == launches);
    free(a), free(b), free(cy), free(gy), free(cdx), free(gdx), free(cx), free(gx);
}

/* ---- max pooling ----------------------------------------------------------------------- */

enum { POOL_PLAIN, POOL_TIES, POOL_NAN };

static void pool_case(int n, int c, int h, int w, int k, int s, int pad, int kind) {
    rt_maxpool2d l;
    assert_rt_ok(rt_maxpool2d_init(&l, c, h, w, k, s, pad));
    assert_rt_ok(rt_maxpool2d_prepare(g_cpu, &l, n));
    const size_t xn = (size_t)n * c * h * w, yn = (size_t)n * c * l.out_h * l.out_w;
    float *x = rt_test_randn(xn, 1.0f), *dy = rt_test_randn(yn, 1.0f);
    if (kind != POOL_PLAIN) /* few distinct values: tied maxima everywhere (the first wins) */
        for (size_t i = 0; i < xn; i++) x[i] = roundf(x[i] * 2.0f) * 0.5f;
    if (kind == POOL_NAN) /* NaN wins its windows, wherever it is in them */
        for (size_t i = 3; i < xn; i += 37) x[i] = NAN;
    float *cy = rt_test_nans(yn), *gy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gdx = rt_test_nans(xn);
    char what[96];
    const char *tag = kind == POOL_TIES ? " ties" : kind == POOL_NAN ? " ties+NaN" : "";
    assert_rt_ok(rt_maxpool2d_forward(g_cpu, &l, n, (rt_act *)x, (rt_act *)cy));
    assert_cuda_ok(rt_cuk_maxpool_forward(NULL, k_nchw_f32, &l, n, x, gy));
    snprintf(what, sizeof what, "maxpool n%d c%d %dx%d k%d s%d p%d%s forward", n, c, h, w, k, s, pad, tag);
    et_check_exact(what, cy, gy, yn);
    assert_rt_ok(rt_maxpool2d_backward(g_cpu, &l, n, (rt_act *)x, (rt_act *)cy, (rt_act *)dy, (rt_act *)cdx));
    assert_cuda_ok(rt_cuk_maxpool_backward(NULL, k_nchw_f32, &l, n, x, dy, gdx));
    snprintf(what, sizeof what, "maxpool n%d c%d %dx%d k%d s%d p%d%s backward", n, c, h, w, k, s, pad, tag);
    et_check_exact(what, cdx, gdx, xn);
    rt_maxpool2d_release(g_cpu, &l);
    free(x), free(dy), free(cy), free(gy), free(cdx), free(gdx);
}

static void test_maxpool(void **state) {
    (void)state;
    pool_case(4, 16, 14, 14, 3, 2, 1, POOL_PLAIN); /* ResNet stem */
    pool_case(4, 16, 14, 14, 3, 2, 1, POOL_TIES);
    pool_case(3, 5, 15, 13, 3, 2, 1, POOL_TIES);   /* odd sizes */
    pool_case(5, 10, 24, 24, 2, 2, 0, POOL_PLAIN); /* Net */
    pool_case(5, 10, 24, 24, 2, 2, 0, POOL_TIES);
    pool_case(2, 3, 9, 9, 3, 1, 1, POOL_TIES); /* overlapping stride-1 windows */
    pool_case(3, 5, 15, 13, 3, 2, 1, POOL_NAN);
    pool_case(2, 3, 9, 9, 3, 1, 1, POOL_NAN);
}

/* ---- global average pooling ------------------------------------------------------------ */

static void test_avgpool(void **state) {
    (void)state;
    const int cases[][3] = {{8, 64, 49}, {8, 512, 1}, {5, 32, 16}, {3, 100, 7}};
    for (int ci = 0; ci < 4; ci++) {
        const int n = cases[ci][0], c = cases[ci][1], hw = cases[ci][2];
        const size_t xn = (size_t)n * c * hw, yn = (size_t)n * c;
        float *x = rt_test_randn(xn, 1.0f), *dy = rt_test_randn(yn, 1.0f);
        float *cy = rt_test_nans(yn), *gy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gdx = rt_test_nans(xn);
        char what[96];
        assert_rt_ok(rt_avgpool_forward(g_cpu, n, c, hw, (rt_act *)x, cy));
        assert_cuda_ok(rt_cuk_avgpool_forward(NULL, k_nchw_f32, n, c, hw, x, gy));
        snprintf(what, sizeof what, "avgpool n%d c%d hw%d forward", n, c, hw);
        et_check_exact(what, cy, gy, yn);
        assert_rt_ok(rt_avgpool_backward(g_cpu, n, c, hw, dy, (rt_act *)cdx));
        assert_cuda_ok(rt_cuk_avgpool_backward(NULL, k_nchw_f32, n, c, hw, dy, gdx));
        snprintf(what, sizeof what, "avgpool n%d c%d hw%d backward", n, c, hw);
        et_check_exact(what, cdx, gdx, xn);
        free(x), free(dy), free(cy), free(gy), free(cdx), free(gdx);
    }
}

/* ---- linear: bias rows (y starts as the bias) and the bias gradient --------------------- */

static void linear_case(int n, int in_f, int out_f) {
    rt_linear l;
    rt_arena p, g;
    assert_rt_ok(rt_linear_init(&l, in_f, out_f));
    rt_arena_init(&p, rt_device_cpu());
    rt_arena_init(&g, rt_device_cpu());
    assert_rt_ok(rt_tensor_place(&l.weight, &p));
    l.dweight = rt_tensor_in(&l.weight, &g);
    assert_rt_ok(rt_tensor_place(&l.bias, &p));
    l.dbias = rt_tensor_in(&l.bias, &g);
    g.size = p.size;
    assert_rt_ok(rt_arena_alloc(&p));
    assert_rt_ok(rt_arena_alloc(&g));
    float *w = rt_test_randn((size_t)out_f * in_f, 0.1f), *b = rt_test_randn((size_t)out_f, 0.5f);
    memcpy(rt_tensor_data(&l.weight), w, (size_t)out_f * in_f * sizeof(float));
    memcpy(rt_tensor_data(&l.bias), b, (size_t)out_f * sizeof(float));
    size_t ws = 0;
    assert_rt_ok(rt_linear_prepare(g_cpu, &l, n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_cpu, ws));
    const size_t xn = (size_t)n * in_f, yn = (size_t)n * out_f;
    float *x = rt_test_randn(xn, 1.0f), *dy = rt_test_randn(yn, 1.0f), *dx = rt_test_nans(xn);
    char what[96];

    /* the bias broadcast: what the CUDA forward puts in y before cuBLAS adds x W^T (the
     * CPU forward memcpy's the bias into each row the same way) */
    float *rows = rt_test_floats(yn), *gy = rt_test_nans(yn);
    for (int i = 0; i < n; i++) memcpy(rows + (size_t)i * out_f, b, (size_t)out_f * sizeof(float));
    assert_cuda_ok(rt_cuk_bias_rows(NULL, n, out_f, b, gy));
    snprintf(what, sizeof what, "bias rows n%d out%d", n, out_f);
    et_check_exact(what, rows, gy, yn);

    /* the bias gradient: the CPU backward's column sums (double, rows in order) */
    float *gdb = rt_test_nans((size_t)out_f);
    assert_rt_ok(rt_linear_backward(g_cpu, &l, n, x, dy, dx));
    assert_cuda_ok(rt_cuk_column_sums(NULL, n, out_f, dy, gdb));
    snprintf(what, sizeof what, "bias gradient n%d out%d", n, out_f);
    et_check_exact(what, rt_tensor_data(&l.dbias), gdb, (size_t)out_f);

    rt_linear_release(g_cpu, &l);
    rt_arena_free(&p), rt_arena_free(&g);
    free(w), free(b), free(x), free(dy), free(dx), free(rows), free(gy), free(gdb);
}

static void test_linear_bias(void **state) {
    (void)state;
    linear_case(8, 512, 10);  /* ResNet fc */
    linear_case(9, 50, 10);   /* Net fc2 */
    linear_case(33, 129, 67); /* odd sizes */
    linear_case(5, 3, 700);   /* bias gradient over 3 blocks */
}

/* ---- dropout: the Philox mask of the CPU, the same products ------------------------------ */

static void dropout_case(float p, bool channelwise, int n, int c, int h, int w) {
    rt_dropout lc, lg;
    assert_rt_ok(rt_dropout_init(&lc, p, channelwise, c, h, w, g_seed ^ 0x5eedu, 3));
    lg = lc;
    const size_t cnt = (size_t)n * c * h * w, draws = cnt / (size_t)lc.plane;
    lc.mask = rt_test_nans(draws);
    lg.mask = rt_test_nans(draws);
    float *x = rt_test_randn(cnt, 1.0f), *dy = rt_test_randn(cnt, 1.0f);
    float *cy = rt_test_nans(cnt), *gy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt), *gdx = rt_test_nans(cnt);
    for (int rep = 0; rep < 2; rep++) { /* the second draw continues the counter */
        char what[96];
        assert_rt_ok(rt_dropout_forward(g_cpu, &lc, n, (rt_act *)x, (rt_act *)cy, true));
        assert_cuda_ok(rt_cuk_dropout_forward(NULL, k_nchw_f32, &lg, n, x, gy));
        lg.counter += draws; /* the caller (layers.c) advances it */
        assert_true(lc.counter == lg.counter);
        snprintf(what, sizeof what, "dropout p=%.2f%s n%d %dx%dx%d draw %d mask", (double)p, channelwise ? " 2d" : "",
                 n, c, h, w, rep);
        et_check_exact(what, lc.mask, lg.mask, draws);
        et_check_exact("  forward", cy, gy, cnt);
        assert_rt_ok(rt_dropout_backward(g_cpu, &lc, n, (rt_act *)dy, (rt_act *)cdx));
        assert_cuda_ok(rt_cuk_dropout_backward(NULL, k_nchw_f32, &lg, n, dy, gdx));
        et_check_exact("  backward", cdx, gdx, cnt);
    }
    free(lc.mask), free(lg.mask), free(x), free(dy), free(cy), free(gy), free(cdx), free(gdx);
}

static void test_dropout(void **state) {
    (void)state;
    dropout_case(0.5f, false, 8, 50, 1, 1);
    dropout_case(0.5f, true, 8, 20, 8, 8);
    dropout_case(0.3f, false, 7, 13, 5, 3);
    dropout_case(0.1f, true, 9, 37, 3, 3); /* 333 draws: two blocks */
}

/* ---- the batch-norm step counter --------------------------------------------------------- */

static void test_increment(void **state) {
    (void)state;
    int64_t c = ((int64_t)1 << 40) + 41;
    assert_cuda_ok(rt_cuk_increment_i64(NULL, &c));
    assert_cuda_ok(rt_cuk_increment_i64(NULL, &c));
    assert_true(c == ((int64_t)1 << 40) + 43);
}

/* ---- losses --------------------------------------------------------------------------------- */

static int64_t *labels_for(size_t n, int k) {
    int64_t *p = malloc((n ? n : 1) * sizeof *p);
    rt_rng r;
    rt_rng_init(&r, g_seed, ++g_subseq);
    for (size_t i = 0; i < n; i++) p[i] = (int64_t)rt_rng_below(&r, (uint64_t)k);
    return p;
}

static void test_losses(void **state) {
    (void)state;
    /* n = 300 and 600: threads take rows t, t+256, ... (a second and third pass) */
    const int cases[][2] = {{8, 10}, {64, 10}, {300, 7}, {5, 1000}, {600, 3}};
    for (int ci = 0; ci < 5; ci++) {
        const int n = cases[ci][0], k = cases[ci][1];
        const size_t nk = (size_t)n * k;
        char what[96];
        float *x = rt_test_randn(nk, 3.0f), *dy = rt_test_randn(nk, 1.0f);
        int64_t *lab = labels_for((size_t)n, k);
        float *cd = rt_test_nans(nk), *gd = rt_test_nans(nk), *cy = rt_test_nans(nk), *gy = rt_test_nans(nk);
        float closs = NAN, gloss = NAN;
        int bad = 0;

        assert_rt_ok(rt_softmax_xent(g_cpu, n, k, x, lab, &closs, cd));
        assert_cuda_ok(rt_cuk_softmax_xent(NULL, n, k, x, lab, &gloss, gd, &bad));
        snprintf(what, sizeof what, "softmax_xent n%d k%d loss (1 ulp: tree sum)", n, k);
        et_check_ulp(what, closs, gloss);
        et_check_exact("  dlogits", cd, gd, nk);
        gloss = NAN; /* and without the gradient */
        assert_cuda_ok(rt_cuk_softmax_xent(NULL, n, k, x, lab, &gloss, NULL, &bad));
        et_check_ulp("  loss (dlogits NULL)", closs, gloss);
        assert_int_equal(bad, 0);
        /* label smoothing (CrossEntropyLoss(label_smoothing=eps)): the same formulas */
        static const double eps_cases[] = {0.1, 0.37, 1.0};
        for (int e = 0; e < 3; e++) {
            et_poison(cd, nk);
            et_poison(gd, nk);
            closs = gloss = NAN;
            assert_rt_ok(rt_softmax_xent_smooth(g_cpu, n, k, x, lab, eps_cases[e], &closs, cd));
            assert_cuda_ok(rt_cuk_softmax_xent_smooth(NULL, n, k, x, lab, eps_cases[e], &gloss, gd, &bad));
            snprintf(what, sizeof what, "softmax_xent smoothing %g n%d k%d loss (1 ulp: tree sum)", eps_cases[e], n, k);
            et_check_ulp(what, closs, gloss);
            et_check_exact("  dlogits", cd, gd, nk);
        }
        assert_int_equal(bad, 0);

        assert_rt_ok(rt_log_softmax_forward(g_cpu, n, k, x, cy));
        assert_cuda_ok(rt_cuk_log_softmax_forward(NULL, n, k, x, gy));
        snprintf(what, sizeof what, "log_softmax n%d k%d forward", n, k);
        et_check_exact(what, cy, gy, nk);
        et_poison(gd, nk);
        assert_rt_ok(rt_log_softmax_backward(g_cpu, n, k, cy, dy, cd));
        assert_cuda_ok(rt_cuk_log_softmax_backward(NULL, n, k, gy, dy, gd));
        et_check_exact("  backward", cd, gd, nk);

        et_poison(gd, nk);
        gloss = NAN;
        assert_rt_ok(rt_nll_loss(g_cpu, n, k, cy, lab, &closs, cd));
        assert_cuda_ok(rt_cuk_nll_loss(NULL, n, k, gy, lab, &gloss, gd, &bad));
        snprintf(what, sizeof what, "nll_loss n%d k%d loss (1 ulp: tree sum)", n, k);
        et_check_ulp(what, closs, gloss);
        et_check_exact("  dlogp", cd, gd, nk);
        assert_int_equal(bad, 0);
        free(x), free(dy), free(lab), free(cd), free(gd), free(cy), free(gy);
    }
}

/* out-of-range labels: the CPU refuses the call; the kernels count them in *bad, make
 * the loss and those rows' gradients NaN and compute the other rows as usual */
static void test_losses_bad_labels(void **state) {
    (void)state;
    const int n = 300, k = 10;
    const size_t nk = (size_t)n * k;
    float *x = rt_test_randn(nk, 3.0f), *logp = rt_test_nans(nk);
    int64_t *lab = labels_for((size_t)n, k), *fixed = malloc(n * sizeof *fixed);
    const int bad_rows[3] = {1, 200, 299}; /* in different threads, the last in a second pass */
    lab[bad_rows[0]] = k, lab[bad_rows[1]] = -1, lab[bad_rows[2]] = (int64_t)1 << 32; /* would be 0 as an int32 */
    memcpy(fixed, lab, n * sizeof *fixed);
    for (int b = 0; b < 3; b++) fixed[bad_rows[b]] = 0;
    float closs = 0, gloss = 0, *cd = rt_test_nans(nk), *gd = rt_test_nans(nk);
    int bad = 5; /* counts on from what is there */

    assert_int_equal(rt_softmax_xent(g_cpu, n, k, x, lab, &closs, cd), RT_ERR_INVALID);
    assert_rt_ok(rt_softmax_xent(g_cpu, n, k, x, fixed, &closs, cd));
    assert_cuda_ok(rt_cuk_softmax_xent(NULL, n, k, x, lab, &gloss, gd, &bad));
    assert_int_equal(bad, 5 + 3);
    assert_true(isnan(gloss));
    for (int b = 0; b < 3; b++)
        for (int j = 0; j < k; j++) {
            assert_true(isnan(gd[(size_t)bad_rows[b] * k + j]));
            cd[(size_t)bad_rows[b] * k + j] = NAN;
        }
    et_check_exact("softmax_xent bad labels: other rows' dlogits", cd, gd, nk);

    assert_rt_ok(rt_log_softmax_forward(g_cpu, n, k, x, logp));
    bad = 0;
    et_poison(gd, nk);
    assert_int_equal(rt_nll_loss(g_cpu, n, k, logp, lab, &closs, cd), RT_ERR_INVALID);
    assert_rt_ok(rt_nll_loss(g_cpu, n, k, logp, fixed, &closs, cd));
    assert_cuda_ok(rt_cuk_nll_loss(NULL, n, k, logp, lab, &gloss, gd, &bad));
    assert_int_equal(bad, 3);
    assert_true(isnan(gloss));
    for (int b = 0; b < 3; b++)
        for (int j = 0; j < k; j++) {
            assert_true(isnan(gd[(size_t)bad_rows[b] * k + j]));
            cd[(size_t)bad_rows[b] * k + j] = NAN;
        }
    et_check_exact("nll_loss bad labels: other rows' dlogp", cd, gd, nk);
    free(x), free(logp), free(lab), free(fixed), free(cd), free(gd);
}

/* ---- precision bf16: casts and bias pieces ------------------------------------------- */

/* the cast kernels round as core/bf16.h does (ties to even, NaN quiet, infinities and
 * signed zeros kept), bit for bit; fill and channel sums against loops over those roundings */
static void test_bf16_casts(void **state) {
    (void)state;
    const size_t n = 70001;
    float *x = rt_test_randn(n, 3.0f);
    const float edges[] = {0.0f,
                           -0.0f,
                           INFINITY,
                           -INFINITY,
                           NAN,
                           1.0f + 0x1p-8f /* a tie: to even (1) */,
                           1.0f + 0x1p-7f + 0x1p-8f /* a tie: to even (up) */,
                           0x1p-130f /* subnormal */,
                           3.4e38f /* rounds to infinity */};
    memcpy(x, edges, sizeof edges);
    uint16_t *h = malloc(n * sizeof(uint16_t));
    assert_non_null(h);
    assert_cuda_ok(rt_cuk_to_bf16(NULL, n, x, h));
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += h[i] != rt_bf16_from_f32(x[i]);
    printf("  to_bf16: %zu of %zu differ from rt_bf16_from_f32\n", differ, n);
    assert_int_equal(differ, 0);
    /* widen, accumulate, round in place */
    float *w = rt_test_nans(n), *cw = rt_test_floats(n);
    assert_cuda_ok(rt_cuk_from_bf16(NULL, n, h, w, false));
    for (size_t i = 0; i < n; i++) cw[i] = rt_bf16_to_f32(h[i]);
    et_check_exact("from_bf16", cw, w, n);
    float *acc = rt_test_randn(n, 1.0f), *cacc = rt_test_copy(acc, n);
    assert_cuda_ok(rt_cuk_from_bf16(NULL, n, h, acc, true));
    for (size_t i = 0; i < n; i++) cacc[i] += rt_bf16_to_f32(h[i]);
    et_check_exact("from_bf16 accumulate", cacc, acc, n);
    float *r = rt_test_copy(x, n);
    assert_cuda_ok(rt_cuk_round_bf16(NULL, n, r));
    for (size_t i = 0; i < n; i++) cw[i] = rt_bf16_round(x[i]);
    et_check_exact("round_bf16", cw, r, n);
    /* fill (n, c, plane) with round(b), then the channel sums of it */
    const int N = 3, C = 5;
    const size_t P = 37, total = (size_t)N * C * P;
    float *b = rt_test_randn((size_t)C, 1.0f), *db = rt_test_nans((size_t)C), *cdb = rt_test_floats((size_t)C);
    uint16_t *y = malloc(total * sizeof(uint16_t));
    assert_non_null(y);
    assert_cuda_ok(rt_cuk_bf16_fill_channels(NULL, N, C, P, false, b, y));
    for (size_t i = 0; i < total; i++) assert_int_equal(y[i], rt_bf16_from_f32(b[(i / P) % C]));
    assert_cuda_ok(rt_cuk_bf16_fill_channels(NULL, N, C, P, true, b, y)); /* NHWC: (n, plane, c) */
    for (size_t i = 0; i < total; i++) assert_int_equal(y[i], rt_bf16_from_f32(b[i % C]));
    /* the channel sums of random values, NCHW and NHWC */
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        for (size_t i = 0; i < total; i++) y[i] = rt_bf16_from_f32(x[1000 + i] * (float)(1 + i % 3)); /* past the edge values */
        assert_cuda_ok(rt_cuk_bf16_channel_sums(NULL, N, C, P, nhwc, y, db));
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int i = 0; i < N; i++)
                for (size_t p = 0; p < P; p++)
                    s += rt_bf16_to_f32(y[nhwc ? ((size_t)i * P + p) * C + c : ((size_t)i * C + c) * P + p]);
            cdb[c] = (float)s;
        }
        et_check_exact(nhwc ? "bf16_channel_sums nhwc" : "bf16_channel_sums", cdb, db, (size_t)C);
    }
    free(x), free(h), free(w), free(cw), free(acc), free(cacc), free(r), free(b), free(db), free(cdb), free(y);
}

/* the batched casts (one launch for up to RT_CUK_SET arrays, rt_cuk_to_bf16_n /
 * rt_cuk_from_bf16_n) give each array the bits of its own cast: arrays of different
 * lengths, an empty one between them, a widening that writes next to one that adds; a
 * set of no arrays or too many is refused */
static void test_bf16_cast_sets(void **state) {
    (void)state;
    const size_t len[RT_CUK_SET] = {1027, 0, 4099};
    float *x[RT_CUK_SET];
    uint16_t *h[RT_CUK_SET];
    rt_cuk_to_bf16_set in = {0};
    for (int k = 0; k < RT_CUK_SET; k++) {
        x[k] = rt_test_randn(len[k] + 1, 2.0f);
        h[k] = malloc((len[k] + 1) * sizeof(uint16_t));
        assert_non_null(h[k]);
        h[k][len[k]] = 0xbeef; /* past the end: untouched */
        rt_cuk_set_to(&in, len[k], x[k], h[k]);
    }
    assert_cuda_ok(rt_cuk_to_bf16_n(NULL, &in));
    for (int k = 0; k < RT_CUK_SET; k++) {
        for (size_t i = 0; i < len[k]; i++) assert_int_equal(h[k][i], rt_bf16_from_f32(x[k][i]));
        assert_int_equal(h[k][len[k]], 0xbeef);
    }
    /* widen array 0 (written) and array 2 (added) in one launch */
    float *w0 = rt_test_nans(len[0]), *a2 = rt_test_randn(len[2], 1.0f), *c2 = rt_test_copy(a2, len[2]);
    rt_cuk_from_bf16_set out = {0};
    rt_cuk_set_from(&out, len[0], h[0], w0, false);
    rt_cuk_set_from(&out, len[1], h[1], NULL, true);
    rt_cuk_set_from(&out, len[2], h[2], a2, true);
    assert_cuda_ok(rt_cuk_from_bf16_n(NULL, &out));
    for (size_t i = 0; i < len[0]; i++) {
        const float want = rt_bf16_to_f32(h[0][i]);
        assert_memory_equal(&w0[i], &want, sizeof want);
    }
    for (size_t i = 0; i < len[2]; i++) c2[i] += rt_bf16_to_f32(h[2][i]);
    et_check_exact("from_bf16_n accumulate", c2, a2, len[2]);
    rt_cuk_to_bf16_set none = {0}, many = in;
    many.n = RT_CUK_SET + 1;
    assert_int_not_equal(rt_cuk_to_bf16_n(NULL, &none), cudaSuccess);
    assert_int_not_equal(rt_cuk_to_bf16_n(NULL, &many), cudaSuccess);

    /* NCHW -> NHWC while rounding (images of C channels x P positions; a filter's K rows
     * of C x taps), next to a plain array; then back to NCHW, written and added */
    const int N = 3, C = 5, K = 4;
    const size_t P = 7, T = 9, nx = (size_t)N * C * P, nw = (size_t)K * C * T;
    float *xs = rt_test_randn(nx, 1.0f), *ws = rt_test_randn(nw, 1.0f);
    uint16_t *xt = malloc(nx * sizeof(uint16_t)), *wt = malloc(nw * sizeof(uint16_t)), *plain = malloc(len[0] * 2);
    assert_true(xt && wt && plain);
    rt_cuk_to_bf16_set tin = {0};
    rt_cuk_set_to_nhwc(&tin, nx, C, P, xs, xt);
    rt_cuk_set_to(&tin, len[0], x[0], plain);
    rt_cuk_set_to_nhwc(&tin, nw, C, T, ws, wt);
    assert_cuda_ok(rt_cuk_to_bf16_n(NULL, &tin));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            for (size_t p = 0; p < P; p++)
                assert_int_equal(xt[((size_t)i * P + p) * C + c], rt_bf16_from_f32(xs[((size_t)i * C + c) * P + p]));
    for (int k = 0; k < K; k++)
        for (int c = 0; c < C; c++)
            for (size_t t = 0; t < T; t++)
                assert_int_equal(wt[((size_t)k * T + t) * C + c], rt_bf16_from_f32(ws[((size_t)k * C + c) * T + t]));
    for (size_t i = 0; i < len[0]; i++) assert_int_equal(plain[i], rt_bf16_from_f32(x[0][i]));
    float *xb = rt_test_nans(nx), *wacc = rt_test_randn(nw, 1.0f), *cw = rt_test_copy(wacc, nw);
    rt_cuk_from_bf16_set tout = {0};
    rt_cuk_set_from_nchw(&tout, nx, C, P, xt, xb, false);
    rt_cuk_set_from_nchw(&tout, nw, C, T, wt, wacc, true);
    assert_cuda_ok(rt_cuk_from_bf16_n(NULL, &tout));
    for (size_t i = 0; i < nx; i++) assert_true(xb[i] == rt_bf16_round(xs[i]));
    for (size_t i = 0; i < nw; i++) cw[i] += rt_bf16_round(ws[i]);
    et_check_exact("from_bf16_n nchw accumulate", cw, wacc, nw);
    /* a count that is no whole number of images is refused */
    rt_cuk_to_bf16_set bad = {0};
    rt_cuk_set_to_nhwc(&bad, nx - 1, C, P, xs, xt);
    assert_int_not_equal(rt_cuk_to_bf16_n(NULL, &bad), cudaSuccess);
    free(xs), free(ws), free(xt), free(wt), free(plain), free(xb), free(wacc), free(cw);
    for (int k = 0; k < RT_CUK_SET; k++) free(x[k]), free(h[k]);
    free(w0), free(a2), free(c2);
}

int main(void) {
    et_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_maxpool),           cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear_bias), cmocka_unit_test(test_dropout),           cmocka_unit_test(test_increment),
        cmocka_unit_test(test_losses),      cmocka_unit_test(test_losses_bad_labels), cmocka_unit_test(test_bf16_casts),
        cmocka_unit_test(test_bf16_cast_sets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
