/* Label smoothing against PyTorch: rt_softmax_xent_smooth (the CPU backend) on random
 * logits and labels gives the loss and the logits' gradient of
 * torch.nn.CrossEntropyLoss(label_smoothing=eps) (autograd, float32) for eps in
 * {0, 0.1, 0.25, 1} and several batch and class counts; the CUDA kernel is compared with
 * this CPU code in test_emu_model (host-compiled) and test_gpu_layers. Tolerances: loss
 * relative error < 1e-5, gradient max|ours - torch| / max|torch| < 1e-5 (we compute in
 * double and round once; PyTorch in float32). A model with eps > 0 trains with the
 * smoothed loss (rt_model_set_label_smoothing), and Net refuses it. Skipped (77) when
 * /usr/bin/python3 cannot import torch. */
#include "model_test_util.h"

#include "core/rng.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct scase {
    int n, k;
    double eps;
} scase;
static const scase k_cases[] = {{8, 10, 0.0}, {8, 10, 0.1}, {64, 10, 0.1}, {5, 1000, 0.25}, {33, 3, 1.0}, {1, 2, 0.5}};
#define N_CASES (int)(sizeof k_cases / sizeof k_cases[0])

static void test_against_torch(void **state) {
    (void)state;
    char dir[] = "/tmp/rt_smooth_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *fc = fopen(path, "w");
    snprintf(path, sizeof path, "%s/in.bin", dir);
    FILE *fi = fopen(path, "wb");
    assert_non_null(fc);
    assert_non_null(fi);
    rt_rng rng;
    rt_rng_init(&rng, 77, 0);
    float *xs[N_CASES];
    int64_t *ys[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        const scase *s = &k_cases[c];
        xs[c] = malloc(sizeof(float) * (size_t)s->n * s->k);
        ys[c] = malloc(sizeof(int64_t) * (size_t)s->n);
        rt_rng_normal(&rng, xs[c], (size_t)s->n * s->k, 0.0f, 3.0f);
        for (int i = 0; i < s->n; i++) ys[c][i] = (int64_t)(rt_rng_u32(&rng) % (uint32_t)s->k);
        fprintf(fc, "%d %d %.17g\n", s->n, s->k, s->eps);
        fwrite(xs[c], sizeof(float), (size_t)s->n * s->k, fi);
        fwrite(ys[c], sizeof(int64_t), (size_t)s->n, fi);
    }
    fclose(fc);
    fclose(fi);
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/model/torch_smoothing.py %s", src ? src : RT_SOURCE_DIR, dir);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        printf("SKIP: /usr/bin/python3 cannot import torch\n");
        exit(77);
    }
    assert_int_equal(rc, 0);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *fo = fopen(path, "rb");
    assert_non_null(fo);
    rt_model_ctx *ctx;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 1};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    int bad = 0;
    for (int c = 0; c < N_CASES; c++) {
        const scase *s = &k_cases[c];
        size_t nk = (size_t)s->n * s->k;
        float want_loss, loss = NAN, *want = malloc(sizeof(float) * nk), *got = malloc(sizeof(float) * nk);
        assert_int_equal(fread(&want_loss, sizeof(float), 1, fo), 1);
        assert_int_equal(fread(want, sizeof(float), nk, fo), nk);
        assert_rt_ok(rt_softmax_xent_smooth(ctx, s->n, s->k, xs[c], ys[c], s->eps, &loss, got));
        double le = fabs((double)loss - want_loss) / fabs((double)want_loss);
        double gmax = 0, emax = 0;
        for (size_t i = 0; i < nk; i++) {
            gmax = fmax(gmax, fabs((double)want[i]));
            emax = fmax(emax, fabs((double)got[i] - want[i]));
        }
        bool ok = le < 1e-5 && emax / gmax < 1e-5;
        printf("n %3d k %4d eps %-4g loss %.7g (torch %.7g, rel err %.2g), grad rel err %.2g %s\n", s->n, s->k, s->eps,
               (double)loss, (double)want_loss, le, emax / gmax, ok ? "ok" : "MISMATCH");
        bad += !ok;
        free(want);
        free(got);
        free(xs[c]);
        free(ys[c]);
    }
    fclose(fo);
    rt_model_ctx_destroy(ctx);
    const char *names[] = {"cases.txt", "in.bin", "out.bin"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    assert_int_equal(bad, 0);
}

/* the model's loss uses the smoothing; Net (nll_loss of log-probabilities) refuses it */
static void test_model_smoothing(void **state) {
    (void)state;
    rt_model_ctx *ctx;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 1};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    rt_model_config mc;
    rt_model_config_default(&mc);
    mc.arch = RT_ARCH_RESNET18;
    mc.width = 4;
    mc.max_batch = 4;
    rt_model *m;
    assert_rt_ok(rt_model_create(&mc, ctx, &m));
    float x[4 * 28 * 28];
    for (int i = 0; i < 4 * 28 * 28; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    int64_t y[4] = {1, 7, 3, 3};
    float plain, smooth, want;
    assert_rt_ok(rt_model_forward(m, x, 4, false));
    assert_rt_ok(rt_model_loss(m, y));
    assert_rt_ok(rt_model_loss_value(m, &plain));
    assert_rt_ok(rt_model_set_label_smoothing(m, 0.2));
    assert_true(rt_model_label_smoothing(m) == 0.2);
    assert_rt_ok(rt_model_loss(m, y));
    assert_rt_ok(rt_model_loss_value(m, &smooth));
    assert_rt_ok(rt_softmax_xent_smooth(ctx, 4, 10, rt_model_output(m), y, 0.2, &want, NULL));
    assert_true(smooth == want && smooth != plain);
    assert_rt_fails(rt_model_set_label_smoothing(m, 1.5), RT_ERR_INVALID, "label smoothing 1.5");
    rt_model_destroy(m);
    mc.arch = RT_ARCH_NET;
    assert_rt_ok(rt_model_create(&mc, ctx, &m));
    assert_rt_ok(rt_model_set_label_smoothing(m, 0.0));
    assert_rt_fails(rt_model_set_label_smoothing(m, 0.1), RT_ERR_UNSUPPORTED, "nll_loss");
    rt_model_destroy(m);
    rt_model_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_model_smoothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
