/* Whole models on the GPU against the CPU backend.
 *
 *  - ResNet34 (1x28x28, imagenet stem, batch 8): one training step from identical
 *    weights: logits, loss, every parameter gradient, BN running statistics and
 *    counters; a partial batch (5 of 8: the cuDNN layers' second descriptor set); an
 *    evaluation forward.
 *  - ResNet34: 20 SGD steps (lr 0.005, momentum 0.9, weight decay 5e-4, rt_optim on
 *    each device) over two fixed random batches: the loss of every step, the final
 *    parameters and running statistics, and the updates (final - initial parameters).
 *  - the tutorial Net (conv bias, max pooling, Dropout2d/Dropout with the shared Philox
 *    masks, log-softmax + NLL): one training step.
 *  - tf32: a ResNet18 (3x32x32, cifar stem) step stays close to fp32 on the CPU (loss
 *    within 5e-2, gradients within 0.25: TF32 rounds to 10 mantissa bits).
 *
 * Bounds (fp32): one step's logits and loss within 1e-4 relative, each gradient tensor
 * within 1e-3 (max-norm relative error; the per-layer tests hold every layer to 1e-5 /
 * 1e-4, a 34-layer chain adds up their rounding), after 20 steps the losses and every
 * parameter tensor within 1e-3 and the parameter updates within 1e-2. Loss errors are
 * relative to max(|loss|, 1): absolute once the model has memorised its two batches. Seeds change every run (printed).
 * Exits 77 without a GPU.
 */
#include "gpu_test_util.h"

#include "optim/optimizer.h"

#include <stdlib.h>

#define TOL_STEP_OUT 1e-4
#define TOL_STEP_GRAD 1e-3
#define TOL_TRAJ 1e-3
#define TOL_UPDATE 1e-2

static rt_model *make_model(rt_model_ctx *ctx, const rt_model_config *cfg, uint64_t seed) {
    rt_model *m = NULL;
    assert_rt_ok(rt_model_create(cfg, ctx, &m));
    assert_rt_ok(rt_model_init_weights(m, seed));
    return m;
}

/* every tensor of the table: values (which = 0) or gradients (which = 1); returns the
 * worst relative error */
static double compare_tables(rt_model *mc, rt_model *mg, int which, double tol, const char *label) {
    assert_int_equal(rt_model_param_count(mc), rt_model_param_count(mg));
    double worst = 0;
    const char *worst_name = "";
    gt_sync();
    for (int i = 0; i < rt_model_param_count(mc); i++) {
        const rt_param *pc = rt_model_param(mc, i), *pg = rt_model_param(mg, i);
        assert_string_equal(pc->name, pg->name);
        if (which == 1 && !rt_param_trainable(pc)) continue;
        const rt_tensor *tc = which ? &pc->grad : &pc->value, *tg = which ? &pg->grad : &pg->value;
        const size_t bytes = rt_tensor_nbytes(tc);
        if (tc->dtype == RT_I64) { /* num_batches_tracked */
            int64_t a = 0, b = -1;
            memcpy(&a, rt_tensor_data(tc), sizeof a);
            gt_download(&b, rt_tensor_data(tg), sizeof b);
            if (a != b) fail_msg("%s %s: cpu %lld gpu %lld", label, pc->name, (long long)a, (long long)b);
            continue;
        }
        const size_t n = bytes / sizeof(float);
        float *g = gt_host(n);
        gt_download(g, rt_tensor_data(tg), bytes);
        size_t at = 0;
        double e = gt_rel_err(rt_tensor_data(tc), g, n, &at);
        if (!(e <= worst) || isnan(e)) {
            worst = e;
            worst_name = pc->name;
        }
        if (!(e <= tol))
            fail_msg("%s %s: relative error %.3g > %.0e (element %zu: cpu %.9g gpu %.9g, seed %llu)", label, pc->name,
                     e, tol, at, (double)((const float *)rt_tensor_data(tc))[at], (double)g[at],
                     (unsigned long long)g_seed);
        free(g);
    }
    printf("  %-28s worst rel err %.3g (%s, tol %.0e)\n", label, worst, worst_name, tol);
    return worst;
}

typedef struct batch {
    float *hx, *dx;
    int64_t *hl, *dl;
} batch;

static batch make_batch(const rt_model_config *cfg, int n) {
    batch b;
    const size_t xn = (size_t)n * cfg->in_channels * cfg->in_h * cfg->in_w;
    b.hx = gt_randn(xn, 1.0f);
    b.dx = gt_dev_copy(b.hx, xn);
    b.hl = gt_labels((size_t)n, cfg->num_classes);
    b.dl = gt_dev((size_t)n * sizeof(int64_t));
    gt_upload(b.dl, b.hl, (size_t)n * sizeof(int64_t));
    return b;
}
static void free_batch(batch *b) {
    free(b->hx), free(b->hl);
    gt_free(b->dx), gt_free(b->dl);
}

/* one training step on both; compares loss and logits */
static void step_both(rt_model *mc, rt_model *mg, const batch *b, int n, double tol, const char *label) {
    const int k = rt_model_config_of(mc)->num_classes;
    float lc = NAN, lg = NAN;
    assert_rt_ok(rt_model_train_step(mc, b->hx, b->hl, n, NULL, NULL, &lc));
    assert_rt_ok(rt_model_train_step(mg, b->dx, b->dl, n, NULL, NULL, &lg));
    /* relative to the loss, or absolute once the loss is below 1 (a memorised batch) */
    double e = fabs((double)lg - lc) / fmax(fabs((double)lc), 1.0);
    printf("  %-28s loss cpu %.7f gpu %.7f rel err %.3g (tol %.0e)\n", label, (double)lc, (double)lg, e, tol);
    if (!(e <= tol))
        fail_msg("%s: loss cpu %.9g gpu %.9g (seed %llu)", label, (double)lc, (double)lg, (unsigned long long)g_seed);
    char what[96];
    snprintf(what, sizeof what, "%s output", label);
    gt_check_dev(what, rt_model_output(mc), rt_model_output(mg), (size_t)n * k, tol);
}

static void poison_grads(rt_model *mg) {
    rt_arena *g = rt_model_grads(mg);
    gt_poison(g->base, g->size);
}

static void resnet34_config(rt_model_config *cfg, int max_batch) {
    rt_model_config_default(cfg);
    cfg->arch = RT_ARCH_RESNET34;
    cfg->in_channels = 1, cfg->in_h = 28, cfg->in_w = 28;
    cfg->stem = RT_STEM_IMAGENET;
    cfg->max_batch = max_batch;
}

static void test_resnet34_step(void **state) {
    (void)state;
    rt_model_config cfg;
    resnet34_config(&cfg, 8);
    const uint64_t wseed = g_seed ^ 0x77;
    rt_model *mc = make_model(g_cpu, &cfg, wseed), *mg = make_model(g_gpu, &cfg, wseed);
    compare_tables(mc, mg, 0, 0.0, "initial weights (identical)");

    batch b = make_batch(&cfg, 8);
    poison_grads(mg);
    step_both(mc, mg, &b, 8, TOL_STEP_OUT, "resnet34 step n=8");
    compare_tables(mc, mg, 1, TOL_STEP_GRAD, "gradients");
    compare_tables(mc, mg, 0, TOL_STEP_OUT, "running statistics");

    batch b5 = make_batch(&cfg, 5);
    poison_grads(mg);
    step_both(mc, mg, &b5, 5, TOL_STEP_OUT, "resnet34 step n=5");
    compare_tables(mc, mg, 1, TOL_STEP_GRAD, "gradients n=5");

    /* evaluation forward with the running statistics */
    assert_rt_ok(rt_model_forward(mc, b.hx, 8, false));
    assert_rt_ok(rt_model_forward(mg, b.dx, 8, false));
    gt_check_dev("resnet34 eval output", rt_model_output(mc), rt_model_output(mg), (size_t)8 * cfg.num_classes,
                 TOL_STEP_OUT);

    free_batch(&b), free_batch(&b5);
    rt_model_destroy(mc);
    rt_model_destroy(mg);
}

static void test_resnet34_sgd(void **state) {
    (void)state;
    rt_model_config cfg;
    resnet34_config(&cfg, 8);
    const uint64_t wseed = g_seed ^ 0x99;
    rt_model *mc = make_model(g_cpu, &cfg, wseed), *mg = make_model(g_gpu, &cfg, wseed);
    rt_optim_config oc;
    rt_optim_config_default(&oc, RT_OPTIM_SGD);
    oc.lr = 0.005, oc.momentum = 0.9, oc.weight_decay = 5e-4;
    const size_t nf = rt_model_params(mc)->size / sizeof(float);
    rt_optimizer oc_cpu, oc_gpu;
    assert_rt_ok(rt_optimizer_init(&oc_cpu, &oc, rt_device_cpu(), nf));
    assert_rt_ok(rt_optimizer_init(&oc_gpu, &oc, g_gpu->device, nf));
    /* the initial parameters, to compare what the 20 steps changed */
    rt_arena *pa = rt_model_params(mc);
    float *p0 = gt_host(nf);
    memcpy(p0, pa->base, pa->size);
    /* a small fixed data set (two batches, alternating) that the model learns, so the
     * trajectory is smooth rather than chasing fresh random labels */
    batch data[2] = {make_batch(&cfg, 8), make_batch(&cfg, 8)};
    float first = NAN, last = NAN;
    for (int step = 0; step < 20; step++) {
        char label[64];
        snprintf(label, sizeof label, "sgd step %2d", step + 1);
        step_both(mc, mg, &data[step % 2], 8, TOL_TRAJ, label);
        assert_rt_ok(rt_optimizer_step_arena(&oc_cpu, rt_model_params(mc), rt_model_grads(mc), -1.0, NULL));
        assert_rt_ok(rt_optimizer_step_arena(&oc_gpu, rt_model_params(mg), rt_model_grads(mg), -1.0, g_gpu->stream));
        assert_rt_ok(rt_model_ctx_sync(g_gpu));
        float l = NAN;
        assert_rt_ok(rt_model_loss_value(mc, &l));
        if (step == 0) first = l;
        last = l;
    }
    printf("  cpu loss %.4f -> %.4f over 20 steps\n", (double)first, (double)last);
    compare_tables(mc, mg, 0, TOL_TRAJ, "parameters after 20 steps");
    /* the updates themselves: (p_gpu - p0) against (p_cpu - p0), whole arena */
    float *pg = gt_host(nf);
    gt_download(pg, rt_model_params(mg)->base, pa->size);
    float *dc = gt_host(nf), *dg = gt_host(nf);
    for (size_t i = 0; i < nf; i++) {
        dc[i] = ((const float *)pa->base)[i] - p0[i];
        dg[i] = pg[i] - p0[i];
    }
    size_t at = 0;
    double e = gt_rel_err(dc, dg, nf, &at);
    printf("  %-28s rel err %.3g (tol %.0e)\n", "parameter updates", e, TOL_UPDATE);
    if (!(e <= TOL_UPDATE))
        fail_msg("parameter updates: relative error %.3g > %.0e (element %zu: cpu %.9g gpu %.9g, seed %llu)", e,
                 TOL_UPDATE, at, (double)dc[at], (double)dg[at], (unsigned long long)g_seed);
    free(p0), free(pg), free(dc), free(dg);
    free_batch(&data[0]), free_batch(&data[1]);
    rt_optimizer_free(&oc_cpu);
    rt_optimizer_free(&oc_gpu);
    rt_model_destroy(mc);
    rt_model_destroy(mg);
}

static void test_net_step(void **state) {
    (void)state;
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_NET;
    cfg.max_batch = 16;
    const uint64_t wseed = g_seed ^ 0x33;
    rt_model *mc = make_model(g_cpu, &cfg, wseed), *mg = make_model(g_gpu, &cfg, wseed);
    for (int rep = 0; rep < 2; rep++) { /* the second step draws new dropout masks */
        batch b = make_batch(&cfg, 16);
        poison_grads(mg);
        step_both(mc, mg, &b, 16, TOL_STEP_OUT, rep ? "net step 2" : "net step 1");
        compare_tables(mc, mg, 1, TOL_GRAD, "net gradients");
        free_batch(&b);
    }
    rt_model_destroy(mc);
    rt_model_destroy(mg);
}

static void test_tf32_close(void **state) {
    (void)state;
    rt_model_ctx *tf = gt_ctx(gt_gpu_device(), RT_PRECISION_TF32);
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_RESNET18;
    cfg.in_channels = 3, cfg.in_h = 32, cfg.in_w = 32;
    cfg.stem = RT_STEM_CIFAR;
    cfg.max_batch = 4;
    const uint64_t wseed = g_seed ^ 0x55;
    rt_model *mc = make_model(g_cpu, &cfg, wseed), *mg = make_model(tf, &cfg, wseed);
    batch b = make_batch(&cfg, 4);
    float lc = NAN, lg = NAN;
    assert_rt_ok(rt_model_train_step(mc, b.hx, b.hl, 4, NULL, NULL, &lc));
    assert_rt_ok(rt_model_train_step(mg, b.dx, b.dl, 4, NULL, NULL, &lg));
    double e = fabs((double)lg - lc) / fabs((double)lc);
    printf("  tf32 resnet18 cifar: loss cpu fp32 %.6f gpu tf32 %.6f rel err %.3g (tol 5e-2)\n", (double)lc, (double)lg,
           e);
    assert_true(e <= 5e-2);
    /* TF32 has a 10-bit mantissa: gradients within a few percent (a layout or math
     * error is O(1)), and finite */
    compare_tables(mc, mg, 1, 0.25, "tf32 gradients");
    free_batch(&b);
    rt_model_destroy(mc);
    rt_model_destroy(mg);
    rt_model_ctx_destroy(tf);
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resnet34_step),
        cmocka_unit_test(test_resnet34_sgd),
        cmocka_unit_test(test_net_step),
        cmocka_unit_test(test_tf32_close),
    };
    return cmocka_run_group_tests(tests, gt_setup, gt_teardown);
}
