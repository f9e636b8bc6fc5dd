/* Models: parameter table and names, initialisation, the grad-ready callback, a
 * whole-model finite-difference check, "no layer is skipped", save/load. */
#include "model_test_util.h"
#include "model/profile.h"

#include "core/timer.h"

#include <stdlib.h>
#include <unistd.h>

static rt_model *make(rt_model_arch arch, rt_stem stem, int c, int hw, int width, int batch) {
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = arch;
    cfg.stem = stem;
    cfg.in_channels = c;
    cfg.in_h = cfg.in_w = hw;
    cfg.width = width;
    cfg.max_batch = batch;
    if (arch == RT_ARCH_NET) cfg.dropout = 0.0f;
    rt_model *m = NULL;
    assert_rt_ok(rt_model_create(&cfg, g_ctx, &m));
    assert_rt_ok(rt_model_init_weights(m, 1234));
    return m;
}

static void shape_is(const rt_model *m, const char *name, int ndim, const int64_t *shape, rt_param_kind kind) {
    const rt_param *p = rt_model_param_find(m, name);
    if (!p) fail_msg("no parameter %s", name);
    assert_int_equal(p->value.ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(p->value.shape[i], shape[i]);
    assert_int_equal(p->kind, kind);
}

static void test_name_parse(void **state) {
    (void)state;
    rt_model *m = make(RT_ARCH_RESNET34, RT_STEM_IMAGENET, 1, 28, 64, 2);
    shape_is(m, "conv1.weight", 4, (int64_t[]){64, 1, 7, 7}, RT_PARAM_WEIGHT);
    shape_is(m, "bn1.weight", 1, (int64_t[]){64}, RT_PARAM_BN_WEIGHT);
    shape_is(m, "bn1.num_batches_tracked", 0, NULL, RT_PARAM_BUFFER);
    shape_is(m, "layer1.2.conv2.weight", 4, (int64_t[]){64, 64, 3, 3}, RT_PARAM_WEIGHT);
    shape_is(m, "layer2.0.downsample.0.weight", 4, (int64_t[]){128, 64, 1, 1}, RT_PARAM_WEIGHT);
    shape_is(m, "layer2.0.downsample.1.running_var", 1, (int64_t[]){128}, RT_PARAM_BUFFER);
    shape_is(m, "layer3.5.bn2.bias", 1, (int64_t[]){256}, RT_PARAM_BN_BIAS);
    shape_is(m, "layer4.2.bn2.running_mean", 1, (int64_t[]){512}, RT_PARAM_BUFFER);
    shape_is(m, "fc.weight", 2, (int64_t[]){10, 512}, RT_PARAM_WEIGHT);
    shape_is(m, "fc.bias", 1, (int64_t[]){10}, RT_PARAM_BIAS);
    assert_null(rt_model_param_find(m, "layer1.0.downsample.0.weight"));
    assert_null(rt_model_param_find(m, "layer3.6.conv1.weight"));
    /* torchvision's resnet34 with a 1-channel 7x7 conv1 and 10 classes:
     * 21,797,672 - 64*2*49 (two fewer input channels) - 513*990 (990 fewer classes) */
    assert_int_equal(rt_model_num_parameters(m), 21797672 - 64 * 2 * 49 - 513 * 990);
    assert_int_equal(rt_model_block_count(m), 1 + 16 + 1);
    /* weight decay applies to conv/linear weights only */
    int decays = 0;
    for (int i = 0; i < rt_model_param_count(m); i++) decays += rt_param_decays(rt_model_param(m, i));
    assert_int_equal(decays, 36 + 1); /* 33 convs + 3 downsample convs + fc */
    /* the table is in state_dict order and offsets increase: forward order in the arena */
    size_t last = 0;
    for (int i = 0; i < rt_model_param_count(m); i++) {
        const rt_param *p = rt_model_param(m, i);
        if (!rt_param_trainable(p)) continue;
        assert_true(i == 0 || p->value.offset > last);
        last = p->value.offset;
        assert_int_equal(p->grad.offset, p->value.offset);
        assert_ptr_equal(p->grad.arena, rt_model_grads(m));
    }
    assert_string_equal(rt_model_param(m, 0)->name, "conv1.weight");
    assert_string_equal(rt_model_param(m, rt_model_param_count(m) - 1)->name, "fc.bias");
    rt_model_destroy(m);
    m = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 32, 64, 2);
    shape_is(m, "conv1.weight", 4, (int64_t[]){64, 3, 3, 3}, RT_PARAM_WEIGHT);
    assert_null(rt_model_param_find(m, "layer1.2.conv1.weight"));
    assert_int_equal(rt_model_num_parameters(m), 11689512 - 64 * 3 * 49 + 64 * 3 * 9 - 513 * 990);
    rt_model_destroy(m);
    m = make(RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28, 0, 2);
    static const char *net_names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
    assert_int_equal(rt_model_param_count(m), 8);
    for (int i = 0; i < 8; i++) assert_string_equal(rt_model_param(m, i)->name, net_names[i]);
    assert_int_equal(rt_model_num_parameters(m), 21840);
    rt_model_destroy(m);
}

static void test_bad_config(void **state) {
    (void)state;
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    rt_model *m = NULL;
    cfg.max_batch = 0;
    assert_int_equal(rt_model_create(&cfg, g_ctx, &m), RT_ERR_INVALID);
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_NET;
    cfg.in_h = 32;
    assert_int_equal(rt_model_create(&cfg, g_ctx, &m), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "1x28x28"));
    rt_model_config_default(&cfg);
    cfg.width = 0;
    assert_int_equal(rt_model_create(&cfg, g_ctx, &m), RT_ERR_INVALID);
    cfg.width = 64;
    cfg.arch = RT_ARCH_COUNT_; /* not an architecture */
    assert_int_equal(rt_model_create(&cfg, g_ctx, &m), RT_ERR_INVALID);
    cfg.arch = RT_ARCH_RESNET18;
    cfg.stem = RT_STEM_COUNT_;
    assert_int_equal(rt_model_create(&cfg, g_ctx, &m), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "expected imagenet | cifar"));
    /* batch larger than built for */
    m = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 8, 2, 2);
    float x[3 * 3 * 64] = {0};
    assert_int_equal(rt_model_forward(m, x, 3, true), RT_ERR_INVALID);
    int64_t lab[2] = {0, 1};
    assert_int_equal(rt_model_backward(m, NULL, NULL), RT_ERR_INVALID);
    assert_rt_ok(rt_model_forward(m, x, 2, false));
    assert_rt_ok(rt_model_loss(m, lab));
    assert_int_equal(rt_model_backward(m, NULL, NULL), RT_ERR_INVALID); /* eval forward */
    rt_model_destroy(m);
}

/* every name parse of model: each canonical (lowercase) name round-trips, any case is
 * accepted, an unknown or NULL name is RT_ERR_INVALID listing the accepted names */
static void test_names(void **state) {
    (void)state;
    for (int i = 0; i < RT_ARCH_COUNT_; i++) {
        const char *name = rt_model_arch_name((rt_model_arch)i);
        assert_string_not_equal(name, "?"); /* a row in the table for every enum member */
        rt_model_arch a = RT_ARCH_COUNT_;
        assert_rt_ok(rt_model_arch_parse(name, &a));
        assert_int_equal(a, i);
        for (const char *c = name; *c; c++) assert_false(*c >= 'A' && *c <= 'Z');
    }
    assert_string_equal(rt_model_arch_name(RT_ARCH_COUNT_), "?");
    rt_model_arch a = RT_ARCH_NET;
    assert_rt_ok(rt_model_arch_parse("ResNet34", &a));
    assert_int_equal(a, RT_ARCH_RESNET34);
    assert_int_equal(rt_model_arch_parse("resnet50", &a), RT_ERR_INVALID);
    assert_int_equal(a, RT_ARCH_RESNET34); /* untouched */
    assert_non_null(strstr(rt_error_message(), "unknown model arch 'resnet50' (expected resnet18 | resnet34 | net)"));
    assert_int_equal(rt_model_arch_parse(NULL, &a), RT_ERR_INVALID);

    for (int i = 0; i < RT_STEM_COUNT_; i++) {
        rt_stem s = RT_STEM_COUNT_;
        assert_rt_ok(rt_stem_parse(rt_stem_name((rt_stem)i), &s));
        assert_int_equal(s, i);
    }
    rt_stem s = RT_STEM_IMAGENET;
    assert_rt_ok(rt_stem_parse("CIFAR", &s));
    assert_int_equal(s, RT_STEM_CIFAR);
    assert_int_equal(rt_stem_parse("tiny", &s), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "unknown stem 'tiny' (expected imagenet | cifar)"));
    assert_string_equal(rt_stem_name(RT_STEM_COUNT_), "?");

    for (int i = 0; i < RT_PRECISION_COUNT_; i++) {
        rt_precision p = RT_PRECISION_COUNT_;
        assert_rt_ok(rt_precision_parse(rt_precision_name((rt_precision)i), &p));
        assert_int_equal(p, i);
    }
    rt_precision p = RT_PRECISION_FP32;
    assert_rt_ok(rt_precision_parse("TF32", &p));
    assert_int_equal(p, RT_PRECISION_TF32);
    assert_int_equal(rt_precision_parse("fp16", &p), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "unknown precision 'fp16' (expected fp32 | tf32 | bf16)"));
    assert_string_equal(rt_precision_name(RT_PRECISION_COUNT_), "?");
}

/* One label type from the loader to the loss: int64, as PyTorch's. A change of
 * rt_model_loss's or rt_model_train_step's label type fails to compile here. */
_Static_assert(_Generic(&rt_model_loss, rt_status (*)(rt_model *, const int64_t *) : 1, default : 0),
               "rt_model_loss takes int64 labels");
_Static_assert(_Generic(&rt_model_train_step,
                        rt_status (*)(rt_model *, const float *, const int64_t *, int, rt_grad_ready_fn, void *,
                                      float *) : 1,
                        default : 0),
               "rt_model_train_step takes int64 labels");

static void test_init(void **state) {
    (void)state;
    rt_model *a = make(RT_ARCH_RESNET18, RT_STEM_IMAGENET, 1, 28, 16, 2);
    rt_model *b = make(RT_ARCH_RESNET18, RT_STEM_IMAGENET, 1, 28, 16, 2);
    /* same seed, same weights */
    assert_memory_equal(rt_model_params(a)->base, rt_model_params(b)->base, rt_model_params(a)->size);
    assert_memory_equal(rt_model_buffers(a)->base, rt_model_buffers(b)->base, rt_model_buffers(a)->size);
    assert_rt_ok(rt_model_init_weights(b, 1235));
    assert_memory_not_equal(rt_model_params(a)->base, rt_model_params(b)->base, rt_model_params(a)->size);
    /* statistics: kaiming normal fan_out for convs, U(+-1/sqrt(fan_in)) for fc, BN 1/0 */
    const rt_param *p = rt_model_param_find(a, "layer3.0.conv2.weight"); /* (64, 64, 3, 3) */
    const float *w = rt_tensor_data(&p->value);
    size_t n = (size_t)rt_tensor_numel(&p->value);
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) {
        s += w[i];
        ss += (double)w[i] * w[i];
    }
    double std = sqrt(ss / n - (s / n) * (s / n)), want = sqrt(2.0 / (64 * 9));
    assert_true(fabs(std - want) < 0.03 * want);
    assert_true(fabs(s / n) < 0.03 * want);
    p = rt_model_param_find(a, "fc.weight");
    w = rt_tensor_data(&p->value);
    float bound = 1.0f / sqrtf(128.0f), mx = 0;
    for (int64_t i = 0; i < rt_tensor_numel(&p->value); i++) mx = fmaxf(mx, fabsf(w[i]));
    assert_true(mx <= bound && mx > 0.9f * bound);
    p = rt_model_param_find(a, "fc.bias");
    w = rt_tensor_data(&p->value);
    for (int i = 0; i < 10; i++) assert_true(fabsf(w[i]) <= bound && w[i] != 0.0f);
    const float *g = rt_tensor_data(&rt_model_param_find(a, "layer2.1.bn1.weight")->value);
    const float *v = rt_tensor_data(&rt_model_param_find(a, "layer2.1.bn1.running_var")->value);
    const float *bb = rt_tensor_data(&rt_model_param_find(a, "layer2.1.bn1.bias")->value);
    for (int i = 0; i < 32; i++) {
        assert_float_equal(g[i], 1, 0);
        assert_float_equal(v[i], 1, 0);
        assert_float_equal(bb[i], 0, 0);
    }
    rt_model_destroy(a);
    rt_model_destroy(b);
}

/* ---- grad-ready callback ------------------------------------------------------------ */

typedef struct ready_log {
    rt_model *m;
    int calls;
    int blocks[64];
    size_t begin[64], end[64];
    char *snap; /* the gradient arena as seen at each callback, within its range */
} ready_log;

static rt_status on_ready(void *user, int block, size_t begin, size_t end) {
    ready_log *L = user;
    if (L->calls >= 64) return RT_ERROR(RT_ERR_INTERNAL, "too many callbacks");
    L->blocks[L->calls] = block;
    L->begin[L->calls] = begin;
    L->end[L->calls] = end;
    memcpy(L->snap + begin, (char *)rt_model_grads(L->m)->base + begin, end - begin);
    L->calls++;
    return RT_OK;
}

static rt_status fail_ready(void *user, int block, size_t begin, size_t end) {
    (void)user;
    (void)begin;
    (void)end;
    return block == 3 ? RT_ERROR(RT_ERR_PEER, "reducer gave up at block %d", block) : RT_OK;
}

static void check_ready(rt_model *m, const float *x, const int64_t *labels, int n) {
    ready_log L = {.m = m};
    size_t gsize = rt_model_grads(m)->size;
    L.snap = calloc(1, gsize);
    assert_non_null(L.snap);
    /* poison the gradients: everything must be rewritten */
    memset(rt_model_grads(m)->base, 0x7f, gsize);
    assert_rt_ok(rt_model_forward(m, x, n, true));
    assert_rt_ok(rt_model_loss(m, labels));
    assert_rt_ok(rt_model_backward(m, on_ready, &L));
    assert_int_equal(L.calls, rt_model_block_count(m));
    /* reverse block order, contiguous ranges from the end of the arena to its start */
    size_t expect_end = gsize;
    for (int i = 0; i < L.calls; i++) {
        assert_int_equal(L.blocks[i], rt_model_block_count(m) - 1 - i);
        assert_int_equal(L.end[i], expect_end);
        assert_true(L.begin[i] < L.end[i]);
        /* the reported range is the one rt_model_block_range announces */
        size_t rb, re;
        rt_model_block_range(m, L.blocks[i], &rb, &re);
        assert_int_equal(rb, L.begin[i]);
        assert_int_equal(re, L.end[i]);
        expect_end = L.begin[i];
    }
    assert_int_equal(expect_end, 0);
    /* what the callback saw is final */
    assert_memory_equal(L.snap, rt_model_grads(m)->base, gsize);
    /* every gradient element written (no poison left) */
    for (int i = 0; i < rt_model_param_count(m); i++) {
        const rt_param *p = rt_model_param(m, i);
        if (!rt_param_trainable(p)) continue;
        const float *g = rt_tensor_data(&p->grad);
        for (int64_t j = 0; j < rt_tensor_numel(&p->grad); j++)
            if (!isfinite(g[j]) || fabsf(g[j]) > 1e30f) fail_msg("%s grad[%lld] not written", p->name, (long long)j);
    }
    /* a failing callback stops backward with its error */
    assert_rt_ok(rt_model_forward(m, x, n, true));
    assert_rt_ok(rt_model_loss(m, labels));
    assert_int_equal(rt_model_backward(m, fail_ready, NULL), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "block 3"));
    free(L.snap);
}

static void test_grad_ready(void **state) {
    (void)state;
    float x[3 * 3 * 16 * 16];
    mt_randn(x, sizeof x / sizeof x[0], 77);
    int64_t labels[3] = {1, 7, 3};
    rt_model *m = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 16, 4, 3);
    check_ready(m, x, labels, 3);
    rt_model_destroy(m);
    m = make(RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28, 0, 3);
    float xn[3 * 28 * 28];
    mt_randn(xn, sizeof xn / sizeof xn[0], 78);
    check_ready(m, xn, labels, 3);
    rt_model_destroy(m);
}

/* ---- whole-model finite differences --------------------------------------------------- */

typedef struct model_case {
    rt_model *m;
    const float *x;
    const int64_t *labels;
    int n;
} model_case;

static double model_eval(void *u) {
    model_case *c = u;
    float loss;
    assert_rt_ok(rt_model_forward(c->m, c->x, c->n, true));
    assert_rt_ok(rt_model_loss(c->m, c->labels));
    assert_rt_ok(rt_model_loss_value(c->m, &loss));
    return loss;
}

/* Three samples per parameter tensor. The loss is a float32 sum through ~20 layers
 * (rounding ~1e-7..1e-6 relative on a loss of ~2.3, i.e. <= ~4e-3 on the quotient with
 * eps = 3e-4) and strongly curved: with tiny BN groups (layer4 is 1x1 at 28x28, three
 * values per channel) eps = 1e-2 is far outside the linear range, 3e-4 is inside. It
 * is also piecewise smooth (relu, maxpool kinks): a sample passes within
 * 3e-3 + 3e-2 * max|g| of its tensor, and at most 5% of the samples may fall on a
 * kink. A skipped or wrong gradient breaks far more. */
static void check_model_fd(rt_model *m, const float *x, const int64_t *labels, int n) {
    model_case c = {.m = m, .x = x, .labels = labels, .n = n};
    assert_rt_ok(rt_model_forward(m, x, n, true));
    assert_rt_ok(rt_model_loss(m, labels));
    assert_rt_ok(rt_model_backward(m, NULL, NULL));
    size_t gsize = rt_model_grads(m)->size;
    float *grads = malloc(gsize);
    assert_non_null(grads);
    memcpy(grads, rt_model_grads(m)->base, gsize);
    int fails = 0, total = 0;
    for (int i = 0; i < rt_model_param_count(m); i++) {
        const rt_param *p = rt_model_param(m, i);
        if (!rt_param_trainable(p)) continue;
        float *a = rt_tensor_data(&p->value);
        const float *g = (const float *)((char *)grads + p->grad.offset);
        size_t cnt = (size_t)rt_tensor_numel(&p->value);
        fails += mt_fd_check(p->name, a, g, cnt, 3, 3e-4f, 3e-2, 3e-3, model_eval, &c);
        total += cnt < 3 ? (int)cnt : 3;
    }
    print_message("model finite differences: %d of %d samples outside tolerance\n", fails, total);
    assert_true(fails * 20 <= total);
    free(grads);
}

static void test_model_fd(void **state) {
    (void)state;
    int64_t labels[3] = {2, 0, 9};
    float x[3 * 3 * 16 * 16];
    mt_randn(x, sizeof x / sizeof x[0], 88);
    rt_model *m = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 16, 4, 3);
    check_model_fd(m, x, labels, 3);
    rt_model_destroy(m);
    m = make(RT_ARCH_RESNET18, RT_STEM_IMAGENET, 1, 28, 4, 3);
    float x1[3 * 28 * 28];
    mt_randn(x1, sizeof x1 / sizeof x1[0], 89);
    check_model_fd(m, x1, labels, 3);
    /* the tutorial Net has the same input shape */
    rt_model_destroy(m);
    m = make(RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28, 0, 3);
    check_model_fd(m, x1, labels, 3);
    rt_model_destroy(m);
}

/* ---- no layer silently skipped ---------------------------------------------------------- */

/* Perturbing any trainable tensor must move the output (training mode: BN on
 * batch statistics). Checked for every parameter tensor, the last block's included. */
static void test_every_layer_used(void **state) {
    (void)state;
    const int n = 4;
    float x[4 * 28 * 28]; /* large enough for both inputs */
    mt_randn(x, sizeof x / sizeof x[0], 99);
    for (int which = 0; which < 2; which++) {
        rt_model *m = which == 0 ? make(RT_ARCH_RESNET34, RT_STEM_CIFAR, 3, 16, 4, n)
                                 : make(RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28, 0, n);
        const int k = 10;
        float base[40], now[40];
        assert_rt_ok(rt_model_forward(m, x, n, true));
        memcpy(base, rt_model_output(m), sizeof base);
        for (int i = 0; i < rt_model_param_count(m); i++) {
            const rt_param *p = rt_model_param(m, i);
            if (!rt_param_trainable(p)) continue;
            float *a = rt_tensor_data(&p->value);
            size_t cnt = (size_t)rt_tensor_numel(&p->value);
            for (size_t j = 0; j < cnt; j++) a[j] += 0.1f * (float)((int)(j % 7) - 3);
            assert_rt_ok(rt_model_forward(m, x, n, true));
            memcpy(now, rt_model_output(m), sizeof now);
            for (size_t j = 0; j < cnt; j++) a[j] -= 0.1f * (float)((int)(j % 7) - 3);
            double d = 0;
            for (int t = 0; t < n * k; t++) d = fmax(d, fabs(now[t] - base[t]));
            if (!(d > 1e-5)) fail_msg("perturbing %s does not change the output", p->name);
        }
        rt_model_destroy(m);
    }
}

/* A batch smaller than max_batch (the last batch of an epoch) gives what a model built
 * for exactly that batch gives. */
static void test_partial_batch(void **state) {
    (void)state;
    float x[5 * 3 * 16 * 16];
    mt_randn(x, sizeof x / sizeof x[0], 123);
    int64_t labels[5] = {1, 2, 3, 4, 5};
    rt_model *a = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 16, 4, 5);
    rt_model *b = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 16, 4, 3);
    float la, lb;
    assert_rt_ok(rt_model_train_step(a, x, labels, 3, NULL, NULL, &la));
    assert_rt_ok(rt_model_train_step(b, x, labels, 3, NULL, NULL, &lb));
    assert_float_equal(la, lb, 1e-6);
    for (int i = 0; i < 30; i++) assert_float_equal(rt_model_output(a)[i], rt_model_output(b)[i], 1e-5);
    const float *ga = rt_model_grads(a)->base, *gb = rt_model_grads(b)->base;
    for (size_t i = 0; i < rt_model_grads(a)->size / sizeof(float); i++) assert_float_equal(ga[i], gb[i], 1e-4);
    rt_model_destroy(a);
    rt_model_destroy(b);
}

/* ---- save / load ------------------------------------------------------------------------- */

static void test_save_load(void **state) {
    (void)state;
    char dir[] = "/tmp/rt_model_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rt_model *a = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 8, 4, 2);
    float x[2 * 3 * 64];
    mt_randn(x, 2 * 3 * 64, 5);
    assert_rt_ok(rt_model_forward(a, x, 2, true)); /* running stats and counters move */
    assert_rt_ok(rt_model_save(a, path));
    rt_model *b = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 8, 4, 2);
    assert_rt_ok(rt_model_init_weights(b, 999));
    assert_rt_ok(rt_model_load(b, path));
    assert_memory_equal(rt_model_params(a)->base, rt_model_params(b)->base, rt_model_params(a)->size);
    assert_memory_equal(rt_model_buffers(a)->base, rt_model_buffers(b)->base, rt_model_buffers(a)->size);
    assert_int_equal(*(int64_t *)rt_tensor_data(&rt_model_param_find(b, "bn1.num_batches_tracked")->value), 1);
    /* a model of another shape refuses it, naming the tensor */
    rt_model *c = make(RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 8, 8, 2);
    assert_int_equal(rt_model_load(c, path), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "conv1.weight"));
    rt_model *d = make(RT_ARCH_RESNET34, RT_STEM_CIFAR, 3, 8, 4, 2);
    assert_int_equal(rt_model_load(d, path), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "layer1.2"));
    rt_model *e = make(RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28, 0, 2);
    assert_int_equal(rt_model_load(e, path), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "unexpected tensor"));
    rt_model_destroy(a);
    rt_model_destroy(b);
    rt_model_destroy(c);
    rt_model_destroy(d);
    rt_model_destroy(e);
    unlink(path);
    rmdir(dir);
}

/* rt_model_ctx_memory: a CPU context holds no device memory (the GPU side is
 * test_gpu_layers' test_mem_used); a NULL context is an error, not a crash */
static void test_ctx_memory(void **state) {
    (void)state;
    size_t used = 1, backend = 1;
    assert_rt_ok(rt_model_ctx_memory(g_ctx, &used, &backend));
    assert_true(used == 0 && backend == 0);
    assert_rt_fails(rt_model_ctx_memory(NULL, &used, &backend), RT_ERR_INVALID, "NULL context");
}

/* The per-layer profile (model/profile.h): ResNet18 at width 4 on 16x16, two steps. Every
 * convolution of the model appears once per pass with two calls, its FLOPs those of its
 * shape as counted here (the profile prints in, out, k, stride, pad, input size and n;
 * the output size follows from them), the linear layer too; the times add up to no more
 * than the steps' wall time; a profile too small says so. */
static void test_layer_profile(void **state) {
    (void)state;
    const int n = 3;
    rt_model *m = make(RT_ARCH_RESNET18, RT_STEM_IMAGENET, 1, 16, 4, n);
    float x[3 * 16 * 16];
    for (int i = 0; i < 3 * 16 * 16; i++) x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    const int64_t labels[3] = {1, 4, 9};
    rt_layer_profile p;
    assert_rt_ok(rt_layer_profile_init(&p, 512));
    rt_model_ctx_set_profile(g_ctx, &p);
    const uint64_t t0 = rt_now_ns();
    for (int step = 0; step < 2; step++) {
        assert_rt_ok(rt_model_forward(m, x, n, true));
        assert_rt_ok(rt_model_loss(m, labels));
        assert_rt_ok(rt_model_backward(m, NULL, NULL));
    }
    const double wall = (double)(rt_now_ns() - t0) * 1e-9;
    rt_model_ctx_set_profile(g_ctx, NULL);
    assert_false(p.overflow);
    assert_int_equal(p.depth, 0);
    int convs[2] = {0, 0}, linears[2] = {0, 0}, bns = 0;
    double total = 0;
    for (int i = 0; i < p.n; i++) {
        const rt_layer_prof_row *r = &p.rows[i];
        /* an elementwise row (no layer) sums the calls of one size */
        if (r->layer)
            assert_int_equal(r->calls, 2);
        else
            assert_int_equal(r->calls % 2, 0);
        assert_true(r->seconds >= 0);
        total += r->seconds;
        if (strcmp(r->kind, "conv2d") == 0) {
            int ci, co, k, s, pad, h, w, nn;
            assert_int_equal(sscanf(r->shape, "%d->%d k%d s%d p%d on %dx%d, n %d", &ci, &co, &k, &s, &pad, &h, &w, &nn),
                             8);
            assert_int_equal(nn, n);
            const int oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
            const double f = 2.0 * n * co * oh * ow * ci * k * k;
            /* backward: the weight gradient, and the input gradient but for the stem's */
            const double want = r->pass == RT_PROF_FORWARD ? f : (ci == 1 ? f : 2 * f);
            assert_true(fabs(r->flops - want) <= 1e-9 * want);
            convs[r->pass]++;
        } else if (strcmp(r->kind, "linear") == 0) {
            assert_string_equal(r->shape, "32->10, n 3");
            const double f = 2.0 * n * 32 * 10;
            assert_true(fabs(r->flops - (r->pass == RT_PROF_FORWARD ? f : 2 * f)) <= 1e-9 * f);
            linears[r->pass]++;
        } else if (strncmp(r->kind, "batchnorm2d", 11) == 0) {
            bns++;
        }
    }
    /* ResNet18: the stem, 16 block convolutions, 3 downsamples */
    assert_int_equal(convs[RT_PROF_FORWARD], 20);
    assert_int_equal(convs[RT_PROF_BACKWARD], 20);
    assert_int_equal(linears[RT_PROF_FORWARD], 1);
    assert_int_equal(linears[RT_PROF_BACKWARD], 1);
    assert_true(bns >= 2 * 20);
    assert_true(total > 0 && total <= wall);
    /* a profile too small keeps what fits and says that it lost the rest */
    rt_layer_profile small;
    assert_rt_ok(rt_layer_profile_init(&small, 3));
    rt_model_ctx_set_profile(g_ctx, &small);
    assert_rt_ok(rt_model_forward(m, x, n, true));
    rt_model_ctx_set_profile(g_ctx, NULL);
    assert_int_equal(small.n, 3);
    assert_true(small.overflow);
    rt_layer_profile_reset(&small);
    assert_int_equal(small.n, 0);
    assert_false(small.overflow);
    rt_layer_profile_free(&small);
    rt_layer_profile_free(&p);
    rt_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_name_parse),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_grad_ready),
        cmocka_unit_test(test_model_fd),
        cmocka_unit_test(test_every_layer_used),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_partial_batch),
        cmocka_unit_test(test_ctx_memory),
        cmocka_unit_test(test_layer_profile),
    };
    return cmocka_run_group_tests(tests, mt_group_setup, mt_group_teardown);
}
