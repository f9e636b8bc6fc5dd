/* The GPU's bf16 activation format against its CPU oracle (issue 41; docs/model.md, "The CPU
 * oracle of the bf16 activation format").
 *
 * A ResNet18 (width 8, cifar stem, 3x16x16, batch 4) training step under precision bf16 on
 * the GPU with activations {RT_BF16, RT_ACT_NHWC, 8} (bf16 NHWC, the input padded to 8
 * channels) and on the CPU in the oracle {RT_BF16, RT_ACT_NCHW_WIDE, 1} (fp32 storage, every
 * store rounded to bf16 where the GPU stores bf16), from the same weights and batch: loss,
 * logits and every parameter gradient.
 *
 * Bounds. Both sides store the same bf16 values up to the fp32 summation order inside the
 * convolutions and the batch-norm statistics: two fp32 sums ~1e-7 relative apart round to
 * the same bf16 value except when they straddle a rounding boundary, then to neighbours
 * 2^-8 (2u, u = 2^-9) apart. Such flips are rare (~1e-7 / 2^-8 per element, a few per
 * step) and each moves one element by 2u; the oracle with im2col against oneDNN
 * convolutions, the same kind of difference on the CPU, moves this step's loss by 0 and its
 * gradients by 2e-7 (test_model_act_oracle). The channel padding adds zero products only.
 * So: loss within 4u = 7.8e-3 relative to max(|loss|, 1); logits within 16u = 3.1e-2 in
 * max-norm relative (a flipped element moves a logit by a few u at most); all gradients
 * (one vector) within 0.05 in L2 relative (a ReLU flip moves a slice: test_gpu_model's
 * scale, 25% of one tensor, is ~0.05 of the whole at this size), each also at most
 * DRIFT_FACTOR x the CPU oracle's own im2col-vs-oneDNN distance, or FLIP_FACTOR x the
 * distance ONE flip makes (the oracle again with one input element moved to its bf16
 * neighbour), when those are larger: at this size batch norm over few values per channel
 * makes a single flip move the gradients by up to ~0.2 for some seeds (measured; batch 8
 * at 32x32 since 2026-11-29, 4 at 16x16 before, where 1 seed in 4 failed 0.05).
 * Single tensors are printed. Not yet measured on a GPU: the CUDA backend has no bf16
 * NHWC format until the GPU side of issue 41 lands; until then creating its context fails
 * with RT_ERR_UNSUPPORTED and this test FAILS saying so (it does not skip).
 *
 * Exits 77 without a GPU; RINGTRAIN_GPU_TESTS_ON_CPU=1 runs the "GPU" side in the oracle
 * on a second CPU context (a harness self-check). */
#include "gpu_test_util.h"

#include "core/bf16.h"

#include <stdlib.h>

#define TOL_LOSS (4.0 / 512.0)
#define TOL_LOGITS (16.0 / 512.0)
#define TOL_GRADS 0.05
#define DRIFT_FACTOR 4.0
#define FLIP_FACTOR 4.0
enum { MB = 8, HW = 32 };

static const rt_act_format k_oracle = {RT_BF16, RT_ACT_NCHW_WIDE, 1};
static const rt_act_format k_gpu_bf16 = {RT_BF16, RT_ACT_NHWC, 8};

static rt_model_ctx *cpu_oracle(const char *conv) {
    const char *prev = getenv("RINGTRAIN_CONV");
    char *saved = prev ? strdup(prev) : NULL;
    setenv("RINGTRAIN_CONV", conv, 1);
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {
        .device = rt_device_cpu(), .threads = 4, .precision = RT_PRECISION_BF16, .act_format = &k_oracle};
    rt_status st = rt_model_ctx_create(&o, &ctx);
    if (saved)
        setenv("RINGTRAIN_CONV", saved, 1);
    else
        unsetenv("RINGTRAIN_CONV");
    free(saved);
    assert_rt_ok(st);
    return ctx;
}

static rt_model_ctx *gpu_bf16(void) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = gt_gpu_device(),
                              .threads = 3,
                              .precision = RT_PRECISION_BF16,
                              .benchmark = true,
                              .act_format = gt_on_cpu() ? &k_oracle : &k_gpu_bf16};
    rt_status st = rt_model_ctx_create(&o, &ctx);
    if (st == RT_ERR_UNSUPPORTED)
        fail_msg("the GPU backend refuses activations bf16 NHWC (input channels padded to 8): %s. Expected until the "
                 "GPU side of issue 41 (the bf16 activation format) is merged; from then on this must pass",
                 rt_error_message());
    assert_rt_ok(st);
    return ctx;
}

static rt_model *resnet18(rt_model_ctx *ctx, uint64_t seed) {
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_RESNET18;
    cfg.width = 8;
    cfg.in_channels = 3, cfg.in_h = HW, cfg.in_w = HW;
    cfg.stem = RT_STEM_CIFAR;
    cfg.max_batch = MB;
    rt_model *m = NULL;
    assert_rt_ok(rt_model_create(&cfg, ctx, &m));
    assert_rt_ok(rt_model_init_weights(m, seed));
    return m;
}

static float *fetch_floats(rt_model *m, const void *src, size_t n) {
    rt_model_ctx *c = rt_model_context(m);
    float *h = rt_test_floats(n);
    assert_rt_ok(rt_model_ctx_sync(c));
    gt_sync();
    assert_rt_ok(rt_memcpy(h, rt_device_cpu(), src, c->device, n * sizeof(float), NULL));
    gt_sync();
    return h;
}

/* all gradients of b against a as one vector, L2 relative; prints the worst tensor */
static double grads_l2(rt_model *a, rt_model *b, const char *label) {
    double t0 = 0, td = 0, worst = 0;
    const char *wname = "";
    for (int i = 0; i < rt_model_param_count(a); i++) {
        const rt_param *pa = rt_model_param(a, i), *pb = rt_model_param(b, i);
        assert_string_equal(pa->name, pb->name);
        if (!rt_param_trainable(pa)) continue;
        const size_t n = (size_t)rt_tensor_numel(&pa->grad);
        float *ga = fetch_floats(a, rt_tensor_data(&pa->grad), n), *gb = fetch_floats(b, rt_tensor_data(&pb->grad), n);
        double s0 = 0, sd = 0;
        for (size_t k = 0; k < n; k++) {
            const double d = (double)gb[k] - ga[k];
            s0 += (double)ga[k] * ga[k], sd += isfinite(gb[k]) ? d * d : INFINITY;
        }
        t0 += s0, td += sd;
        const double e = s0 > 0 ? sqrt(sd / s0) : sqrt(sd);
        if (!(e <= worst)) worst = e, wname = pa->name;
        free(ga), free(gb);
    }
    const double tot = t0 > 0 ? sqrt(td / t0) : sqrt(td);
    printf("  %-24s gradients L2 %.3g, the worst tensor %.3g (%s)\n", label, tot, worst, wname);
    return tot;
}

static double logits_err(rt_model *a, rt_model *b) {
    const size_t nk = (size_t)MB * rt_model_config_of(a)->num_classes;
    float *la = fetch_floats(a, rt_model_output(a), nk), *lb = fetch_floats(b, rt_model_output(b), nk);
    const double e = gt_rel_err(la, lb, nk, NULL);
    free(la), free(lb);
    return e;
}

static void test_resnet18_bf16_step(void **state) {
    (void)state;
    rt_model_ctx *cpu = cpu_oracle("dnnl"), *alt = cpu_oracle("im2col");
    g_gpu = gpu_bf16(); /* gt_dev and gt_free allocate on it; destroyed in teardown */
    const uint64_t wseed = g_seed ^ 0x41;
    rt_model *mc = resnet18(cpu, wseed), *ma = resnet18(alt, wseed), *mg = resnet18(g_gpu, wseed);
    rt_model *mp = resnet18(cpu, wseed);
    const size_t xn = (size_t)MB * 3 * HW * HW;
    float *hx = rt_test_randn(xn, 1.0f);
    /* the step's sensitivity to ONE rounding flip: the oracle again with one input element
     * moved to its bf16 neighbour (2u): what a single flip inside the GPU's step can do */
    float *hxp = rt_test_floats(xn);
    memcpy(hxp, hx, xn * sizeof(float));
    {
        const size_t k = (size_t)(g_seed % xn);
        hxp[k] = rt_bf16_round(hxp[k]) * (1.0f + 1.0f / 128.0f);
    }
    int64_t hl[MB];
    for (int i = 0; i < MB; i++) hl[i] = (int64_t)((g_seed >> (4 * i)) % 10);
    float *dx = gt_dev_copy(hx, xn);
    int64_t *dl = gt_dev(sizeof hl);
    gt_upload(dl, hl, sizeof hl);
    float lc = NAN, la = NAN, lg = NAN;
    assert_rt_ok(rt_model_train_step(mc, hx, hl, MB, NULL, NULL, &lc));
    assert_rt_ok(rt_model_train_step(ma, hx, hl, MB, NULL, NULL, &la));
    assert_rt_ok(rt_model_train_step(mg, dx, dl, MB, NULL, NULL, &lg));
    float lp = NAN;
    assert_rt_ok(rt_model_train_step(mp, hxp, hl, MB, NULL, NULL, &lp));
    const double scale = fmax(fabs((double)lc), 1.0);
    const double el = fabs((double)lg - lc) / scale, dl_ = fabs((double)la - lc) / scale;
    const double elog = logits_err(mc, mg), dlog = logits_err(mc, ma);
    printf("  loss cpu oracle %.7f gpu %.7f: err %.3g (cpu drift %.3g, tol %.3g)\n", (double)lc, (double)lg, el, dl_,
           fmax(TOL_LOSS, DRIFT_FACTOR * dl_));
    printf("  logits err %.3g (cpu drift %.3g, tol %.3g)\n", elog, dlog, fmax(TOL_LOGITS, DRIFT_FACTOR * dlog));
    const double dg = grads_l2(mc, ma, "cpu im2col vs oneDNN"), eg = grads_l2(mc, mg, "gpu vs cpu oracle");
    const double ds = grads_l2(mc, mp, "cpu, one input flipped");
    const double tg = fmax(TOL_GRADS, fmax(DRIFT_FACTOR * dg, FLIP_FACTOR * ds));
    if (!(el <= fmax(TOL_LOSS, DRIFT_FACTOR * dl_)))
        fail_msg("loss: cpu oracle %.9g gpu %.9g (seed %llu)", (double)lc, (double)lg, (unsigned long long)g_seed);
    if (!(elog <= fmax(TOL_LOGITS, DRIFT_FACTOR * dlog)))
        fail_msg("logits: relative error %.3g (seed %llu)", elog, (unsigned long long)g_seed);
    if (!(eg <= tg)) fail_msg("gradients: L2 relative %.3g > %.3g (seed %llu)", eg, tg, (unsigned long long)g_seed);
    free(hx), free(hxp);
    gt_free(dx), gt_free(dl);
    rt_model_destroy(mc), rt_model_destroy(ma), rt_model_destroy(mg), rt_model_destroy(mp);
    rt_model_ctx_destroy(cpu), rt_model_ctx_destroy(alt);
}

static int setup(void **state) {
    (void)state;
    g_gpu = NULL;
    return 0;
}
static int teardown(void **state) {
    (void)state;
    rt_model_ctx_destroy(g_gpu);
    return 0;
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_resnet18_bf16_step)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
