/* rt_model_flops_per_image against PyTorch's own count: torch.profiler with_flops on the
 * torchvision models our checkpoints load into (tests/model/torch_flops.py) gives the
 * forward FLOPs of one image and those of the first convolution; ours must equal them
 * exactly (both count 2 per multiply-add of the convolutions and linear layers from the
 * shapes), and a training step must cost 3 x forward less the first convolution (no
 * input gradient there). ResNet18/34 with both stems, 1 and 3 channels, 28 and 32
 * pixels, and Net. Skipped (77) when /usr/bin/python3 cannot import torch. */
#include "model_test_util.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct fcase {
    rt_model_arch arch;
    rt_stem stem;
    int channels, size;
} fcase;
static const fcase k_cases[] = {
    {RT_ARCH_RESNET34, RT_STEM_IMAGENET, 1, 28}, {RT_ARCH_RESNET34, RT_STEM_CIFAR, 1, 28},
    {RT_ARCH_RESNET18, RT_STEM_IMAGENET, 3, 32}, {RT_ARCH_RESNET18, RT_STEM_CIFAR, 3, 32},
    {RT_ARCH_NET, RT_STEM_IMAGENET, 1, 28},
};
#define N_CASES (int)(sizeof k_cases / sizeof k_cases[0])

static void test_flops_against_torch(void **state) {
    (void)state;
    char dir[] = "/tmp/rt_flops_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cases[256], out[256];
    snprintf(cases, sizeof cases, "%s/cases.txt", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    FILE *fc = fopen(cases, "w");
    assert_non_null(fc);
    for (int c = 0; c < N_CASES; c++)
        fprintf(fc, "%s %s %d %d\n", rt_model_arch_name(k_cases[c].arch), rt_stem_name(k_cases[c].stem),
                k_cases[c].channels, k_cases[c].size);
    fclose(fc);
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/model/torch_flops.py %s > %s", src ? src : RT_SOURCE_DIR,
             cases, out);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        printf("SKIP: /usr/bin/python3 cannot import torch\n");
        exit(77);
    }
    assert_int_equal(rc, 0);
    FILE *fo = fopen(out, "r");
    assert_non_null(fo);
    rt_model_ctx *ctx = mt_ctx(1);
    int bad = 0;
    for (int c = 0; c < N_CASES; c++) {
        const fcase *k = &k_cases[c];
        double want_fwd = 0, want_first = 0;
        assert_int_equal(fscanf(fo, "forward %lf first_conv %lf\n", &want_fwd, &want_first), 2);
        rt_model_config mc;
        rt_model_config_default(&mc);
        mc.arch = k->arch;
        mc.stem = k->stem;
        mc.in_channels = k->channels;
        mc.in_h = mc.in_w = k->size;
        mc.width = 64; /* torchvision's */
        mc.max_batch = 1;
        rt_model *m = NULL;
        assert_rt_ok(rt_model_create(&mc, ctx, &m));
        const double fwd = rt_model_flops_per_image(m, false), step = rt_model_flops_per_image(m, true);
        const bool ok = fwd == want_fwd && step == 3 * want_fwd - want_first;
        printf("%-8s %-8s %dx%dx%d: forward %.0f (torch %.0f), step %.0f (torch: 3 x %.0f - %.0f) %s\n",
               rt_model_arch_name(k->arch), rt_stem_name(k->stem), k->channels, k->size, k->size, fwd, want_fwd, step,
               want_fwd, want_first, ok ? "ok" : "MISMATCH");
        bad += !ok;
        rt_model_destroy(m);
    }
    fclose(fo);
    rt_model_ctx_destroy(ctx);
    unlink(cases);
    unlink(out);
    rmdir(dir);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flops_against_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
