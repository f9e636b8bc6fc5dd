/* A ResNet34 checkpoint written by ringtrain loads into torchvision.models.resnet34 with
 * strict=True and gives ringtrain's logits: the model trains one step (weights and BN
 * running statistics move), is written with rt_ckpt_write, loaded back into a fresh model
 * with rt_ckpt_load, and that model's eval-mode logits of one input are compared by
 * tests/train/torch_checkpoint.py (/usr/bin/python3, Debian's torch) with torchvision's
 * on the same model.safetensors: max|ours - torch| / max|torch| < 1e-4. Two cases: 1x28x28
 * (Fashion-MNIST: conv1 replaced by a 1-channel one in torchvision) and 3x32x32 (the stock
 * torchvision model, nothing replaced). Skipped (77) when torch is not importable. */
#include "ckpt_test_util.h"

#include <sys/wait.h>

static int g_skip;

static void run_case(int c, int hw) {
    rt_model_ctx *ctx;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 2};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    rt_model_config mc;
    rt_model_config_default(&mc);
    mc.arch = RT_ARCH_RESNET34;
    mc.in_channels = c;
    mc.in_h = mc.in_w = hw;
    mc.num_classes = 10;
    mc.max_batch = 4;
    rt_model *a, *b;
    assert_rt_ok(rt_model_create(&mc, ctx, &a));
    assert_rt_ok(rt_model_create(&mc, ctx, &b));
    assert_rt_ok(rt_model_init_weights(a, 3));
    rt_optimizer opt;
    rt_optim_config oc;
    rt_optim_config_default(&oc, RT_OPTIM_SGD);
    oc.momentum = 0.9;
    oc.lr = 0.01;
    assert_rt_ok(rt_optimizer_init(&opt, &oc, rt_device_cpu(), rt_model_params(a)->size / sizeof(float)));
    size_t xn = (size_t)4 * c * hw * hw;
    float *x = malloc(xn * sizeof(float));
    assert_non_null(x);
    rt_rng g;
    rt_rng_init(&g, 17, 0);
    rt_rng_normal(&g, x, xn, 0.0f, 1.0f);
    int64_t y[4] = {1, 5, 7, 2};
    float loss;
    assert_rt_ok(rt_model_train_step(a, x, y, 4, NULL, NULL, &loss));
    assert_rt_ok(rt_optimizer_step_arena(&opt, rt_model_params(a), rt_model_grads(a), -1, NULL));

    char dir[256], path[RT_CKPT_PATH_MAX], io[512];
    ct_tmpdir(dir, sizeof dir, "ref");
    rt_ckpt_meta m;
    ct_meta(&m, 1);
    assert_rt_ok(rt_ckpt_write(dir, 1, a, &opt, &m, 0, path, sizeof path));
    rt_ckpt_meta_free(&m);
    assert_rt_ok(rt_ckpt_load(path, b, NULL, NULL));

    rt_rng_init(&g, 18, 0);
    rt_rng_normal(&g, x, xn / 4, 0.0f, 1.0f); /* one image */
    assert_rt_ok(rt_model_forward(b, x, 1, false));
    float logits[10];
    assert_rt_ok(rt_memcpy(logits, rt_device_cpu(), rt_model_output(b), rt_device_cpu(), sizeof logits, NULL));
    rt_st_writer *w;
    assert_rt_ok(rt_st_writer_create(&w));
    assert_rt_ok(rt_st_writer_add(w, "x", RT_F32, 4, (int64_t[]){1, c, hw, hw}, x));
    assert_rt_ok(rt_st_writer_add(w, "logits", RT_F32, 2, (int64_t[]){1, 10}, logits));
    snprintf(io, sizeof io, "%s/io.safetensors", dir);
    assert_rt_ok(rt_st_writer_write(w, io));
    rt_st_writer_free(w);

    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/train/torch_checkpoint.py %s %s", src ? src : RT_SOURCE_DIR,
             path, io);
    fflush(NULL);
    int rc = system(cmd);
    free(x);
    rt_optimizer_free(&opt);
    rt_model_destroy(a);
    rt_model_destroy(b);
    rt_model_ctx_destroy(ctx);
    ct_rmrf(dir);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        g_skip = 1;
        print_message("SKIP: /usr/bin/python3 has no torch/torchvision\n");
        skip();
    }
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("%s failed (status %d)", cmd, rc);
}

static void test_fashion_mnist_shape(void **state) {
    (void)state;
    run_case(1, 28);
}

static void test_stock_torchvision(void **state) {
    (void)state;
    run_case(3, 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fashion_mnist_shape),
                                       cmocka_unit_test(test_stock_torchvision)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_skip && failed == 0) return 77;
    return failed;
}
