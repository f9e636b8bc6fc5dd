/* A model's training step captured in a CUDA graph (core/device.h: rt_stream_capture_*,
 * rt_graph_launch; issue 40) equals the same step run uncaptured, bit for bit.
 *
 * Two copies of a ResNet18 (same weights, one context with deterministic algorithms, so
 * both run the same convolution algorithms) and an optimizer each: A runs 4 plain steps
 * (forward, loss, backward, update); B runs 1 plain step, captures the next, and replays
 * it 3 times (the captured work runs at the first replay, not at the capture), calling
 * rt_optimizer_replay_prepare before each replay. Parameters, BN running statistics, the
 * optimizer's state and the last loss must be identical: SGD with momentum in fp32, tf32
 * and bf16, and Adam with a learning rate that changes at every step (the scalars a
 * replay must not take from its capture: lr and the bias corrections of the step count). The capture must leave nothing run twice or
 * skipped: after the capture and before the first replay, B's parameters are still those
 * of step 1. On the emulated GPUs (make test) the capture follows CUDA's rules
 * (runtime.cpp, "stream capture"): a host synchronisation, an allocation or a query
 * inside a layer's step would fail the capture here.
 */
#include "gpu_test_util.h"
#include "test_util.h"

#include "optim/optimizer.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

typedef struct side {
    rt_model *m;
    rt_optimizer opt;
} side;

static void make_side(side *s, rt_model_ctx *ctx, const rt_model_config *cfg, uint64_t seed, rt_optim_kind kind,
                      bool ema) {
    assert_rt_ok(rt_model_create(cfg, ctx, &s->m));
    assert_rt_ok(rt_model_init_weights(s->m, seed));
    rt_optim_config oc;
    rt_optim_config_default(&oc, kind);
    oc.lr = 0.01, oc.weight_decay = 5e-4;
    if (kind == RT_OPTIM_SGD) oc.momentum = 0.9;
    if (ema) oc.ema_decay = 0.9, oc.ema_every = 2; /* updated after steps 2 and 4: one of each kind of step */
    const size_t nf = rt_model_params(s->m)->size / sizeof(float);
    assert_rt_ok(rt_optimizer_init(&s->opt, &oc, ctx->device, nf));
}

static void free_side(side *s) {
    rt_optimizer_free(&s->opt);
    rt_model_destroy(s->m);
}

/* step i's learning rate (1-based): constant, or changing at every step */
static double lr_at(int i, bool schedule) { return schedule ? 0.01 / (1.0 + 0.5 * i) : 0.01; }

static rt_status step(side *s, const float *x, const int64_t *labels, int n, double lr) {
    rt_model_ctx *ctx = rt_model_context(s->m);
    RT_CHECK(rt_model_forward(s->m, x, n, true));
    RT_CHECK(rt_model_loss(s->m, labels));
    RT_CHECK(rt_model_backward(s->m, NULL, NULL));
    return rt_optimizer_step_arena(&s->opt, rt_model_params(s->m), rt_model_grads(s->m), lr, ctx->stream);
}

/* an arena (device) into a fresh host buffer */
static float *host_copy(rt_model *m, const rt_arena *a) {
    float *h = rt_test_floats(a->size / sizeof(float) + 1);
    assert_rt_ok(rt_model_ctx_sync(rt_model_context(m)));
    gt_download(h, a->base, a->size);
    return h;
}

static void expect_same(const char *what, rt_model *ma, const rt_arena *a, rt_model *mb, const rt_arena *b) {
    assert_int_equal(a->size, b->size);
    float *ha = host_copy(ma, a), *hb = host_copy(mb, b);
    size_t first = 0, n = a->size / sizeof(float), differ = rt_test_count_differ(ha, hb, n, &first);
    printf("  %-36s %zu of %zu floats differ\n", what, differ, n);
    if (differ)
        fail_msg("%s: %zu of %zu differ between the plain and the graphed steps (first %zu: %.9g against %.9g)", what,
                 differ, n, first, (double)ha[first], (double)hb[first]);
    free(ha), free(hb);
}

static void graphed_equals_plain(rt_precision prec, rt_optim_kind kind, bool schedule, bool ema) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = gt_gpu_device(), .threads = 2, .precision = prec, .deterministic = true};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_RESNET18, cfg.stem = RT_STEM_CIFAR, cfg.width = 8;
    cfg.in_channels = 3, cfg.in_h = cfg.in_w = 8, cfg.max_batch = 4;
    const int n = 4;
    side a, b;
    make_side(&a, ctx, &cfg, g_seed, kind, ema);
    make_side(&b, ctx, &cfg, g_seed, kind, ema);
    float *xh = gt_uniform((size_t)n * 3 * 8 * 8, -1, 1);
    int64_t *lh = gt_labels(n, 10);
    float *x = gt_dev_copy(xh, (size_t)n * 3 * 8 * 8);
    int64_t *labels = gt_dev(n * sizeof *labels);
    gt_upload(labels, lh, n * sizeof *labels);

    for (int i = 1; i <= 4; i++) assert_rt_ok(step(&a, x, labels, n, lr_at(i, schedule)));
    assert_rt_ok(step(&b, x, labels, n, lr_at(1, schedule)));
    float *after1 = host_copy(b.m, rt_model_params(b.m));
    rt_graph *g = NULL;
    assert_rt_ok(rt_stream_capture_begin(ctx->stream));
    rt_status cap = step(&b, x, labels, n, 0.5); /* a learning rate no replay may use */
    rt_status end = rt_stream_capture_end(ctx->stream, &g);
    assert_rt_ok(cap);
    assert_rt_ok(end);
    float *still = host_copy(b.m, rt_model_params(b.m)); /* captured, not run */
    size_t first = 0;
    assert_int_equal(rt_test_count_differ(after1, still, rt_model_params(b.m)->size / sizeof(float), &first), 0);
    rt_event *done = NULL; /* after each replay: rt_optimizer_replay_prepare_after's event */
    assert_rt_ok(rt_event_create(ctx->device, &done));
    for (int i = 2; i <= 4; i++) {
        assert_rt_ok(i == 2 ? rt_optimizer_replay_prepare(&b.opt, lr_at(i, schedule))
                            : rt_optimizer_replay_prepare_after(&b.opt, lr_at(i, schedule), done));
        if (ema && i == 2) /* prepared twice, not finished between: a moving-average update would be missing */
            assert_int_equal(rt_optimizer_replay_prepare(&b.opt, lr_at(i, schedule)), RT_ERR_INVALID);
        assert_rt_ok(rt_graph_launch(g, ctx->stream));
        if (ema) assert_rt_ok(rt_optimizer_replay_finish(&b.opt, rt_model_params(b.m)->base, ctx->stream));
        assert_rt_ok(rt_event_record(done, ctx->stream));
    }
    rt_event_destroy(done);
    assert_rt_ok(rt_model_ctx_sync(ctx));
    assert_int_equal(rt_optimizer_get_steps(&b.opt), 4);

    expect_same("parameters", a.m, rt_model_params(a.m), b.m, rt_model_params(b.m));
    expect_same("BN running statistics", a.m, rt_model_buffers(a.m), b.m, rt_model_buffers(b.m));
    float la = NAN, lb = NAN;
    assert_rt_ok(rt_model_loss_value(a.m, &la));
    assert_rt_ok(rt_model_loss_value(b.m, &lb));
    printf("  %s: last loss %.9g plain, %.9g graphed\n", rt_precision_name(prec), (double)la, (double)lb);
    assert_true(memcmp(&la, &lb, sizeof la) == 0);
    const size_t nf = rt_model_params(a.m)->size / sizeof(float);
    float *ma = rt_test_floats(nf), *mb = rt_test_floats(nf);
    const char *state_name = kind == RT_OPTIM_SGD ? "momentum_buffer" : "exp_avg_sq";
    assert_rt_ok(rt_optimizer_state_save(&a.opt, state_name, ma, nf));
    assert_rt_ok(rt_optimizer_state_save(&b.opt, state_name, mb, nf));
    gt_sync();
    assert_int_equal(rt_test_count_differ(ma, mb, nf, &first), 0);
    if (ema) {
        assert_rt_ok(rt_optimizer_state_save(&a.opt, "ema", ma, nf));
        assert_rt_ok(rt_optimizer_state_save(&b.opt, "ema", mb, nf));
        gt_sync();
        printf("  moving average: %zu of %zu floats differ\n", rt_test_count_differ(ma, mb, nf, &first), nf);
        assert_int_equal(rt_test_count_differ(ma, mb, nf, &first), 0);
    }

    rt_graph_destroy(g);
    free(after1), free(still), free(ma), free(mb), free(xh), free(lh);
    gt_free(x), gt_free(labels);
    free_side(&a), free_side(&b);
    rt_model_ctx_destroy(ctx);
}

static void test_graphed_step_fp32(void **state) {
    (void)state;
    graphed_equals_plain(RT_PRECISION_FP32, RT_OPTIM_SGD, false, false);
}
static void test_graphed_step_tf32(void **state) {
    (void)state;
    graphed_equals_plain(RT_PRECISION_TF32, RT_OPTIM_SGD, false, false);
}
static void test_graphed_step_bf16(void **state) {
    (void)state;
    graphed_equals_plain(RT_PRECISION_BF16, RT_OPTIM_SGD, false, false);
}
/* Adam: the learning rate of a schedule and the bias corrections of the step count */
static void test_graphed_adam_schedule(void **state) {
    (void)state;
    graphed_equals_plain(RT_PRECISION_FP32, RT_OPTIM_ADAM, true, false);
}

/* dropout's mask counter is a host value passed at the call: a captured dropout would
 * replay one mask, so it is refused, and the capture ends without a graph */
/* the moving average after captured steps: not captured (its decay changes with the
 * step), updated by rt_optimizer_replay_finish after each replay */
static void test_graphed_ema(void **state) {
    (void)state;
    graphed_equals_plain(RT_PRECISION_FP32, RT_OPTIM_SGD, true, true);
}

static void test_dropout_refused(void **state) {
    (void)state;
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = gt_gpu_device(), .threads = 2, .deterministic = true};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_NET, cfg.max_batch = 4; /* the tutorial Net: Dropout2d and Dropout */
    side s;
    make_side(&s, ctx, &cfg, g_seed, RT_OPTIM_SGD, false);
    const size_t in = (size_t)4 * cfg.in_channels * cfg.in_h * cfg.in_w;
    float *xh = gt_uniform(in, -1, 1);
    int64_t *lh = gt_labels(4, 10);
    float *x = gt_dev_copy(xh, in);
    int64_t *labels = gt_dev(4 * sizeof *labels);
    gt_upload(labels, lh, 4 * sizeof *labels);
    assert_rt_ok(step(&s, x, labels, 4, -1));
    rt_graph *g = NULL;
    assert_rt_ok(rt_stream_capture_begin(ctx->stream));
    rt_status cap = step(&s, x, labels, 4, -1);
    rt_status end = rt_stream_capture_end(ctx->stream, &g);
    printf("  capture of the Net's step: %s\n", rt_error_message());
    assert_int_equal(cap, RT_ERR_UNSUPPORTED);
    assert_non_null(strstr(rt_error_message(), "dropout"));
    (void)end;
    rt_graph_destroy(g);
    assert_false(rt_stream_capturing(ctx->stream));
    assert_rt_ok(rt_model_ctx_sync(ctx));
    free(xh), free(lh);
    gt_free(x), gt_free(labels);
    free_side(&s);
    rt_model_ctx_destroy(ctx);
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    if (gt_on_cpu()) {
        printf("no graphs on the CPU: skipped\n");
        return 77;
    }
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graphed_step_fp32),
        cmocka_unit_test(test_graphed_step_tf32),
        cmocka_unit_test(test_graphed_step_bf16),
        cmocka_unit_test(test_graphed_adam_schedule),
        cmocka_unit_test(test_graphed_ema),
        cmocka_unit_test(test_dropout_refused),
    };
    return cmocka_run_group_tests(tests, gt_setup, gt_teardown);
}
