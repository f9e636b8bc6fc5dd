/* conv2d and linear under train.precision bf16 against PyTorch's CPU autocast
 * (torch.autocast("cpu", torch.bfloat16)) on the same input, weights and output
 * gradient: forward y, backward dx, dW, db (tests/model/torch_bf16_layers.py).
 *
 * Where rounding happens (ours, docs/model.md "bf16"): x, W, b and dy are rounded to
 * bf16 (nearest, ties to even); products of two bf16 are exact in fp32; sums run in
 * fp32; y and dx are rounded to bf16 once, dW and db are not (autocast rounds them).
 *
 * Tolerance, derived per element. Both sides sum the same exact products in fp32 in
 * some order: each fp32 sum of K terms is within gamma_K * A of the exact sum
 * (gamma_K ~ K * 2^-24, A = sum of the |products|, computed by the script in float64),
 * so the two fp32 sums differ by at most K * 2^-23 * A. Each result is then rounded to
 * bf16 (half an ulp, 2^-9 relative, on each side), so
 *   |ours - torch| <= 2^-8 * |torch| + K * 2^-22 * A     (y, dx: both rounded)
 * with a factor 2 of margin on the accumulation term. dW and db: torch's is rounded
 * and ours is not, the same bound holds. A forgotten rounding of an input (x or W in
 * fp32) moves y by ~2^-9 * A, hundreds of times that accumulation term: the bound
 * alone would let an ulp flip through, so on top every y and dx must EQUAL torch's bits
 * in at least 90% of the elements (they differ only where the fp32 sums straddle a
 * bf16 rounding boundary), and round_to_bf16(dW) must equal torch's dW in 90%.
 *
 * Every conv shape runs twice: at the batch the layer was prepared for (oneDNN's bf16
 * primitives) and at a smaller batch (the im2col/dense path on rounded copies), and in
 * a context with RINGTRAIN_CONV=im2col.
 *
 * A whole ResNet18 training step (logits, loss, every parameter gradient) against the
 * same step under autocast (tests/model/torch_reference.py --autocast). Autocast also
 * rounds batch-norm outputs, relu outputs and residual sums to bf16 where we keep fp32
 * (docs/model.md), and a relu input near 0 may flip, so bits do not match; the bound is
 * relative to bf16's own error: with e = max|autocast - f64| / max|f64| (PyTorch's
 * bf16 step against its float64 step, per tensor), ours must satisfy
 *   max|ours - autocast| / max|autocast| <= 3 e
 * (triangle inequality, granting our step up to twice autocast's own error; a planted
 * fp32 conv, or a bf16 rounding in the wrong place, shows up as a factor far from 1).
 * Skipped (77) without torch.
 */
#include "model_test_util.h"

#include "core/bf16.h"
#include "core/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct lcase {
    bool conv;
    int in, out, hw, k, stride, pad;
    bool bias;
    int n, max_n;
    const char *impl; /* RINGTRAIN_CONV, or NULL */
} lcase;

static char g_dir[256];

static void wr(const char *name, const float *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, sizeof(float), n, f), n);
    fclose(f);
}

static float *rd(const char *name, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("torch side wrote no %s", path);
    float *p = malloc(n * sizeof(float) + 1);
    assert_non_null(p);
    size_t got = fread(p, sizeof(float), n + 1, f);
    fclose(f);
    if (got != n) fail_msg("%s: %zu floats, expected %zu", path, got, n);
    return p;
}

/* every element within 2^-8 |t| + K 2^-22 A; `exact`: fraction of equal bits (of
 * round_bf16(ours) when round_ours) must reach 0.9 */
static void check(const char *what, const float *ours, const float *t, const float *A, size_t n, int K,
                  bool round_ours) {
    size_t bad = 0, same = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = ldexp(fabs((double)t[i]), -8) + ldexp((double)K * A[i], -22);
        double d = fabs((double)ours[i] - t[i]);
        if (!(d <= tol)) {
            if (bad < 5) print_message("%s[%zu]: ours %.9g torch %.9g (tol %.3g)\n", what, i, ours[i], t[i], tol);
            bad++;
        }
        float o = round_ours ? rt_bf16_round(ours[i]) : ours[i];
        same += o == t[i];
    }
    print_message("%s: %zu elements, %.1f%% bitwise equal, %zu over the bound\n", what, n, 100.0 * same / n, bad);
    if (bad) fail_msg("%s: %zu elements over the bound", what, bad);
    if (same < n * 9 / 10) fail_msg("%s: only %zu of %zu elements equal torch's bf16 bits", what, same, n);
}

static void run(const lcase *c) {
    if (c->impl) assert_int_equal(setenv("RINGTRAIN_CONV", c->impl, 1), 0);
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 2, .precision = RT_PRECISION_BF16};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    unsetenv("RINGTRAIN_CONV");
    mt_arenas A;
    mt_arenas_init(&A);
    rt_conv2d cl;
    rt_linear ll;
    size_t xn, yn, wn;
    int Ky, Kdx, Kdw; /* terms per sum of y, dx, dW */
    if (c->conv) {
        assert_rt_ok(rt_conv2d_init(&cl, c->in, c->out, c->hw, c->hw, c->k, c->stride, c->pad, c->bias));
        mt_place(&A, &cl.weight, &cl.dweight);
        if (c->bias) mt_place(&A, &cl.bias, &cl.dbias);
        xn = (size_t)c->n * c->in * c->hw * c->hw;
        yn = (size_t)c->n * c->out * cl.out_h * cl.out_w;
        wn = (size_t)c->out * c->in * c->k * c->k;
        Ky = c->in * c->k * c->k + 1;
        Kdx = c->out * c->k * c->k;
        Kdw = c->n * cl.out_h * cl.out_w;
    } else {
        assert_rt_ok(rt_linear_init(&ll, c->in, c->out));
        mt_place(&A, &ll.weight, &ll.dweight);
        mt_place(&A, &ll.bias, &ll.dbias);
        xn = (size_t)c->n * c->in;
        yn = (size_t)c->n * c->out;
        wn = (size_t)c->out * c->in;
        Ky = c->in + 1;
        Kdx = c->out;
        Kdw = c->n;
    }
    mt_alloc(&A);
    float *x = malloc(xn * 4), *dy = malloc(yn * 4), *y = malloc(yn * 4), *dx = malloc(xn * 4), *acc = malloc(xn * 4);
    assert_true(x && dy && y && dx && acc);
    mt_randn(x, xn, 11);
    mt_randn(dy, yn, 12);
    mt_randn(acc, xn, 13);
    float *w = rt_tensor_data(c->conv ? &cl.weight : &ll.weight);
    float *b = c->bias ? rt_tensor_data(c->conv ? &cl.bias : &ll.bias) : NULL;
    mt_randn(w, wn, 14);
    for (size_t i = 0; i < wn; i++) w[i] *= 0.2f;
    if (b) mt_randn(b, (size_t)c->out, 15);
    size_t ws = 0;
    if (c->conv) {
        assert_rt_ok(rt_conv2d_prepare(ctx, &cl, c->max_n, &ws));
        assert_rt_ok(rt_model_ctx_reserve(ctx, ws));
        assert_rt_ok(rt_conv2d_forward(ctx, &cl, c->n, (rt_act *)x, (rt_act *)y));
        assert_rt_ok(rt_conv2d_backward(ctx, &cl, c->n, (rt_act *)x, (rt_act *)dy, (rt_act *)dx, false));
    } else {
        assert_rt_ok(rt_linear_prepare(ctx, &ll, c->max_n, &ws));
        assert_rt_ok(rt_model_ctx_reserve(ctx, ws));
        assert_rt_ok(rt_linear_forward(ctx, &ll, c->n, x, y));
        assert_rt_ok(rt_linear_backward(ctx, &ll, c->n, x, dy, dx));
    }
    float *dw = rt_tensor_data(c->conv ? &cl.dweight : &ll.dweight);
    float *db = c->bias ? rt_tensor_data(c->conv ? &cl.dbias : &ll.dbias) : NULL;
    if (c->conv) {
        /* accumulating dx adds the same bf16-rounded values in fp32 */
        float *acc0 = malloc(xn * 4);
        assert_non_null(acc0);
        memcpy(acc0, acc, xn * 4);
        assert_rt_ok(rt_conv2d_forward(ctx, &cl, c->n, (rt_act *)x, (rt_act *)y));
        assert_rt_ok(rt_conv2d_backward(ctx, &cl, c->n, (rt_act *)x, (rt_act *)dy, (rt_act *)acc, true));
        size_t off = 0;
        for (size_t i = 0; i < xn; i++) off += acc[i] != acc0[i] + dx[i];
        if (off) fail_msg("accumulated dx != dx + base in %zu of %zu elements", off, xn);
        free(acc0);
    }

    snprintf(g_dir, sizeof g_dir, "/tmp/rt-bf16-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    wr("x.bin", x, xn);
    wr("w.bin", w, wn);
    if (b) wr("b.bin", b, (size_t)c->out);
    wr("dy.bin", dy, yn);
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/model/torch_bf16_layers.py --dir %s --kind %s --n %d --in %d --out %d "
             "--hw %d --k %d --stride %d --pad %d --bias %d",
             src ? src : RT_SOURCE_DIR, g_dir, c->conv ? "conv" : "linear", c->n, c->in, c->out, c->hw, c->k, c->stride,
             c->pad, c->bias ? 1 : 0);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        print_message("SKIP: /usr/bin/python3 has no torch\n");
        skip();
    }
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("%s failed (status %d)", cmd, rc);
    float *ty = rd("y.bin", yn), *tdx = rd("dx.bin", xn), *tdw = rd("dw.bin", wn), *ay = rd("ay.bin", yn),
          *adx = rd("adx.bin", xn), *adw = rd("adw.bin", wn);
    check("y", y, ty, ay, yn, Ky, false);
    check("dx", dx, tdx, adx, xn, Kdx, false);
    check("dW", dw, tdw, adw, wn, Kdw, true);
    if (b) {
        float *tdb = rd("db.bin", (size_t)c->out), *adb = malloc((size_t)c->out * 4);
        assert_non_null(adb);
        const size_t per = yn / (size_t)c->n / (size_t)c->out; /* positions per channel */
        for (int oc = 0; oc < c->out; oc++) {
            double s = 0;
            for (int i = 0; i < c->n; i++)
                for (size_t p = 0; p < per; p++) s += fabs(rt_bf16_round(dy[((size_t)i * c->out + oc) * per + p]));
            adb[oc] = (float)s;
        }
        check("db", db, tdb, adb, (size_t)c->out, (int)(c->n * per), true);
        free(tdb);
        free(adb);
    }
    free(ty), free(tdx), free(tdw), free(ay), free(adx), free(adw);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    (void)system(cmd);
    if (c->conv)
        rt_conv2d_release(ctx, &cl);
    else
        rt_linear_release(ctx, &ll);
    mt_free(&A);
    free(x), free(dy), free(y), free(dx), free(acc);
    rt_model_ctx_destroy(ctx);
}

#define CONV(in, out, hw, k, s, p, bias, n, max_n, impl)                                                               \
    { true, in, out, hw, k, s, p, bias, n, max_n, impl }

/* 3x3/p1 at ResNet's layer1 shape, oneDNN's batch and a smaller one */
static void test_conv3x3(void **state) {
    (void)state;
    lcase a = CONV(16, 32, 7, 3, 1, 1, false, 4, 4, NULL), b = CONV(16, 32, 7, 3, 1, 1, false, 3, 4, NULL);
    run(&a);
    run(&b);
}
/* stride 2 with bias; the 7x7 stem on one channel; a 1x1 downsample; 1x1 and 2x2 inputs */
static void test_conv_shapes(void **state) {
    (void)state;
    lcase cs[] = {CONV(8, 16, 9, 3, 2, 1, true, 4, 4, NULL), CONV(1, 16, 14, 7, 2, 3, false, 4, 4, NULL),
                  CONV(16, 32, 4, 1, 2, 0, false, 4, 4, NULL), CONV(32, 32, 1, 3, 1, 1, false, 4, 4, NULL),
                  /* 3x3 on 2x2 (ResNet's layer3 at 28x28): oneDNN's dW as a bf16 matmul + fold */
                  CONV(16, 32, 2, 3, 1, 1, false, 4, 4, NULL)};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run(&cs[i]);
}
/* the same layers on the im2col path only */
static void test_conv_im2col(void **state) {
    (void)state;
    lcase cs[] = {CONV(16, 32, 7, 3, 1, 1, false, 4, 4, "im2col"), CONV(8, 16, 9, 3, 2, 1, true, 4, 4, "im2col")};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run(&cs[i]);
}
static void test_linear(void **state) {
    (void)state;
    lcase c = {false, 512, 10, 1, 1, 1, 0, true, 8, 8, NULL};
    run(&c);
}

static float *st_f32(const rt_safetensors *st, const char *name, size_t want) {
    const rt_st_tensor *t = rt_safetensors_find(st, name);
    if (!t) fail_msg("torch output lacks %s", name);
    if (t->dtype != RT_F32 || (size_t)(t->end - t->begin) != want * 4) fail_msg("torch output %s: size mismatch", name);
    float *p = malloc(want * 4);
    assert_non_null(p);
    memcpy(p, t->data, want * 4);
    return p;
}

/* max|a - b| / max|b| */
static double rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / fmax(m, 1e-30);
}

static void within(const char *what, double e, double e_ac) {
    print_message("%-28s ours vs autocast %.3g, autocast vs f64 %.3g (ratio %.2f)\n", what, e, e_ac,
                  e / fmax(e_ac, 1e-30));
    if (!(e <= 3 * e_ac)) fail_msg("%s: ours vs autocast %.3g > 3 x autocast's own error %.3g", what, e, e_ac);
}

/* the step in activation format fmt (NULL: fp32 NCHW, the CPU's own) */
static void resnet18_step(const rt_act_format *fmt) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 2, .precision = RT_PRECISION_BF16,
                              .act_format = fmt};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    rt_model_config cfg;
    rt_model_config_default(&cfg);
    cfg.arch = RT_ARCH_RESNET18;
    cfg.stem = RT_STEM_CIFAR;
    cfg.in_channels = 3;
    cfg.in_h = cfg.in_w = 32;
    cfg.max_batch = 8;
    cfg.num_classes = 10;
    rt_model *m = NULL;
    assert_rt_ok(rt_model_create(&cfg, ctx, &m));
    assert_rt_ok(rt_model_init_weights(m, 20261124));
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-bf16-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    assert_rt_ok(rt_model_save(m, path));
    const int n = 8, k = 10;
    const size_t xn = (size_t)n * 3 * 32 * 32;
    float *x = malloc(xn * 4);
    assert_non_null(x);
    mt_randn(x, xn, 4242);
    int64_t labels[8];
    for (int i = 0; i < n; i++) labels[i] = (i * 7 + 3) % k;
    rt_st_writer *w;
    assert_rt_ok(rt_st_writer_create(&w));
    assert_rt_ok(rt_st_writer_add(w, "x", RT_F32, 4, (int64_t[]){n, 3, 32, 32}, x));
    assert_rt_ok(rt_st_writer_add(w, "labels", RT_I64, 1, (int64_t[]){n}, labels));
    snprintf(path, sizeof path, "%s/input.safetensors", g_dir);
    assert_rt_ok(rt_st_writer_write(w, path));
    rt_st_writer_free(w);
    float loss = 0;
    assert_rt_ok(rt_model_train_step(m, x, labels, n, NULL, NULL, &loss));
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/model/torch_reference.py --arch resnet18 --stem cifar --in-channels 3 "
             "--classes 10 --autocast --dir %s",
             src ? src : RT_SOURCE_DIR, g_dir);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        print_message("SKIP: /usr/bin/python3 has no torch\n");
        skip();
    }
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("%s failed (status %d)", cmd, rc);
    snprintf(path, sizeof path, "%s/out.safetensors", g_dir);
    rt_safetensors *out = NULL;
    assert_rt_ok(rt_safetensors_read(path, &out));
    float *t = st_f32(out, "output", (size_t)n * k), *e = st_f32(out, "err.output", 1);
    within("output", rel(rt_model_output(m), t, (size_t)n * k), e[0]);
    free(t), free(e);
    t = st_f32(out, "loss", 1), e = st_f32(out, "err.loss", 1);
    within("loss", fabs(loss - t[0]) / fabs(t[0]), e[0]);
    free(t), free(e);
    int grads = 0;
    for (int i = 0; i < rt_model_param_count(m); i++) {
        const rt_param *p = rt_model_param(m, i);
        if (!rt_param_trainable(p)) continue;
        size_t cnt = (size_t)rt_tensor_numel(&p->value);
        char key[128];
        snprintf(key, sizeof key, "grad.%s", p->name);
        t = st_f32(out, key, cnt);
        snprintf(key, sizeof key, "err.grad.%s", p->name);
        e = st_f32(out, key, 1);
        within(key + 4, rel(rt_tensor_data(&p->grad), t, cnt), e[0]);
        free(t), free(e);
        grads++;
    }
    assert_int_equal(grads, 62); /* resnet18: 20 convs, 20 batch norms x 2, fc x 2 */
    rt_safetensors_free(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    (void)system(cmd);
    free(x);
    rt_model_destroy(m);
    rt_model_ctx_destroy(ctx);
}

static void test_resnet18_step(void **state) {
    (void)state;
    resnet18_step(NULL);
}

/* The CPU oracle of the GPU's bf16 activation format (issue 41; docs/model.md): activations
 * and their gradients rounded to bf16 at every store, as autocast rounds batch norm's,
 * relu's and the residual sums' outputs too; the same bound (3 e) holds, and the ratios it
 * prints are the GPU bf16 format's distance to autocast on the same step (test_gpu_act_oracle
 * ties the GPU to this oracle). */
static void test_resnet18_step_oracle(void **state) {
    (void)state;
    resnet18_step(&(rt_act_format){RT_BF16, RT_ACT_NCHW_WIDE, 1});
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_conv3x3), cmocka_unit_test(test_conv_shapes),
                                       cmocka_unit_test(test_conv_im2col), cmocka_unit_test(test_linear),
                                       cmocka_unit_test(test_resnet18_step),
                                       cmocka_unit_test(test_resnet18_step_oracle)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
