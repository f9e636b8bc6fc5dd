/* Crop with padding, horizontal flip and normalisation equal torchvision's
 * (pad(fill=0) -> crop -> hflip -> convert_image_dtype -> normalize) for the crop and
 * flip choices ringtrain drew, run at test time by /usr/bin/python3. */
#include "data_test_util.h"

#include "data/internal/augment.h"

#include <math.h>

enum { N = 64, C = 3, H = 8, W = 7, PAD = 3 };

static void test_against_torchvision(void **state) {
    (void)state;
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    if (!src) fail_msg("RINGTRAIN_SOURCE_DIR not set (run through ctest)");
    static uint8_t img[N * C * H * W];
    static int32_t par[N * 3];
    static float ours[N * C * H * W], ref[N * C * H * W];
    const float mean[C] = {0.4914f, 0.4822f, 0.4465f}, sd[C] = {0.2470f, 0.2435f, 0.2616f};
    for (int i = 0; i < N * C * H * W; i++) img[i] = (uint8_t)((i * 2654435761u) >> 13);
    float lut[C * 256];
    rt_normalize_lut(mean, sd, C, lut);
    rt_augment a = {.seed = 1234, .crop_pad = PAD, .hflip = true};
    int flips = 0;
    for (int i = 0; i < N; i++) {
        rt_augment_params p = rt_augment_params_at(&a, 2, i);
        par[3 * i] = p.dy, par[3 * i + 1] = p.dx, par[3 * i + 2] = p.flip;
        flips += p.flip;
        rt_augment_image(img + (size_t)i * C * H * W, C, H, W, lut, &p, ours + (size_t)i * C * H * W);
    }
    assert_true(flips > 0 && flips < N);
    char *dir = dt_mkdtemp("augment");
    char meta[512];
    int k = snprintf(meta, sizeof meta, "%d %d %d %d %d", N, C, H, W, PAD);
    for (int ch = 0; ch < C; ch++) k += snprintf(meta + k, sizeof meta - k, " %.9g", (double)mean[ch]);
    for (int ch = 0; ch < C; ch++) k += snprintf(meta + k, sizeof meta - k, " %.9g", (double)sd[ch]);
    dt_write(dir, "meta.txt", meta, strlen(meta));
    dt_write(dir, "images.u8", img, sizeof img);
    dt_write(dir, "params.i32", par, sizeof par);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/data/torch_augment.py %s", src, dir);
    if (system(cmd) != 0) fail_msg("reference script failed: %s", cmd);
    char p[8400];
    dt_path(p, sizeof p, dir, "torch.f32");
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    assert_int_equal(fread(ref, sizeof(float), N * C * H * W, f), N * C * H * W);
    fclose(f);
    double worst = 0;
    for (int i = 0; i < N * C * H * W; i++) worst = fmax(worst, fabs((double)ours[i] - ref[i]));
    if (worst > 2e-6) fail_msg("max |ringtrain - torchvision| = %g", worst);
    dt_rm_rf(dir);
    free(dir);
}

int main(void) {
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null") != 0) {
        printf("SKIP: PyTorch/torchvision not available at /usr/bin/python3 (scripts/install-deps test)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_torchvision)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
