/* The real Fashion-MNIST (Debian package dataset-fashion-mnist): 60000 training and
 * 10000 test samples, 6000 per class in training, pixel mean/std as measured by the
 * project (0.2860 / 0.3530), and the bytes of a few images and labels equal what
 * Python's gzip module reads from the same files (run at test time by /usr/bin/python3).
 * Horizontal flips: on by default for Fashion-MNIST (garments face either way), off by
 * default when the same files are read as MNIST digits, on when asked (data.hflip: 1).
 * Skipped (77) when the package is not installed. */
#include "data_test_util.h"

#include "data/dataset.h"
#include "data/loader.h"

#include <math.h>

#define DIR RT_DATASET_DEFAULT_PATH

static char *g_tmp;

static void compare_with_python(const rt_dataset *ds, const char *prefix, const int64_t *idx, int k) {
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    if (!src) fail_msg("RINGTRAIN_SOURCE_DIR not set (run through ctest)");
    char out[4200], cmd[16384];
    snprintf(out, sizeof out, "%s/%s.bin", g_tmp, prefix);
    int at = snprintf(cmd, sizeof cmd,
                      "/usr/bin/python3 %s/tests/data/fashion_mnist_bytes.py %s/%s-images-idx3-ubyte.gz "
                      "%s/%s-labels-idx1-ubyte.gz %s",
                      src, DIR, prefix, DIR, prefix, out);
    for (int i = 0; i < k; i++) at += snprintf(cmd + at, sizeof cmd - at, " %lld", (long long)idx[i]);
    if (system(cmd) != 0) fail_msg("reference script failed: %s", cmd);
    FILE *f = fopen(out, "rb");
    assert_non_null(f);
    long n, rows, cols;
    if (fscanf(f, "%ld %ld %ld", &n, &rows, &cols) != 3 || fgetc(f) != '\n') fail_msg("bad reference header");
    assert_int_equal(n, ds->n);
    assert_int_equal(rows, ds->h);
    assert_int_equal(cols, ds->w);
    size_t size = (size_t)rows * cols;
    unsigned char *rec = malloc(size + 1);
    for (int i = 0; i < k; i++) {
        if (fread(rec, 1, size + 1, f) != size + 1) fail_msg("short reference file");
        assert_int_equal(ds->labels[idx[i]], rec[0]);
        assert_memory_equal(ds->images + (size_t)idx[i] * size, rec + 1, size);
    }
    free(rec);
    fclose(f);
}

static void test_train(void **state) {
    (void)state;
    rt_dataset ds;
    assert_rt_ok(rt_dataset_load(NULL, "train", RT_DATASET_AUTO, &ds)); /* NULL: the default path */
    assert_string_equal(ds.name, "fashion-mnist");
    assert_string_equal(ds.format, "idx (gzip)");
    assert_int_equal(ds.n, 60000);
    assert_int_equal(ds.c, 1);
    assert_int_equal(ds.h, 28);
    assert_int_equal(ds.w, 28);
    int64_t hist[10];
    rt_dataset_histogram(&ds, hist);
    for (int k = 0; k < 10; k++) assert_int_equal(hist[k], 6000);
    double mean[3], sd[3];
    rt_dataset_pixel_stats(&ds, mean, sd);
    assert_true(fabs(mean[0] - 0.2860) < 5e-5);
    assert_true(fabs(sd[0] - 0.3530) < 5e-5);
    const int64_t idx[] = {0, 1, 2, 777, 12345, 31415, 59999};
    compare_with_python(&ds, "train", idx, (int)(sizeof idx / sizeof idx[0]));
    rt_dataset_free(&ds);
}

static void test_test_split(void **state) {
    (void)state;
    rt_dataset ds;
    assert_rt_ok(rt_dataset_load(DIR, "test", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.n, 10000);
    int64_t hist[10];
    rt_dataset_histogram(&ds, hist);
    for (int k = 0; k < 10; k++) assert_int_equal(hist[k], 1000);
    const int64_t idx[] = {0, 5000, 9999};
    compare_with_python(&ds, "t10k", idx, 3);
    rt_dataset_free(&ds);
}

/* images of the first 512 test samples through a training loader (no crop, augmentation
 * on): how many come out mirrored (each must be either the image or its mirror) */
static int count_flips(const rt_dataset *ds, int hflip) {
    rt_loader_config c = rt_loader_config_default(ds);
    c.shuffle = false, c.global_batch = 512, c.crop_pad = 0, c.hflip = hflip;
    rt_loader *l;
    assert_rt_ok(rt_loader_create(&c, &l));
    assert_rt_ok(rt_loader_start_epoch(l, 0));
    rt_batch b;
    assert_rt_ok(rt_loader_next(l, &b));
    int flips = 0;
    for (int i = 0; i < b.size; i++) {
        const uint8_t *src = (const uint8_t *)ds->images + (size_t)b.samples[i] * 784;
        const float *img = b.images + (size_t)i * 784;
        bool same = true, mirror = true;
        for (int y = 0; y < 28; y++)
            for (int x = 0; x < 28; x++) {
                float v = ((float)src[y * 28 + x] / 255.0f - ds->mean[0]) * (1.0f / ds->std[0]);
                same = same && img[y * 28 + x] == v;
                mirror = mirror && img[y * 28 + 27 - x] == v;
            }
        assert_true(same || mirror);
        flips += !same;
    }
    rt_loader_destroy(l);
    return flips;
}

static void test_hflip_defaults(void **state) {
    (void)state;
    rt_dataset ds;
    assert_rt_ok(rt_dataset_load(DIR, "test", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.kind, RT_DATASET_FASHION_MNIST);
    assert_true(ds.hflip_suits);
    int f = count_flips(&ds, -1); /* data.hflip: auto */
    printf("fashion-mnist, hflip auto: %d of 512 mirrored\n", f);
    assert_true(f > 256 - 5 * 12 && f < 256 + 5 * 12); /* binomial(512, 1/2): sd 11.3 */
    assert_int_equal(count_flips(&ds, 0), 0);
    rt_dataset_free(&ds);
    assert_rt_ok(rt_dataset_load(DIR, "test", RT_DATASET_MNIST, &ds)); /* digits: never by default */
    assert_false(ds.hflip_suits);
    assert_int_equal(count_flips(&ds, -1), 0);
    f = count_flips(&ds, 1);
    assert_true(f > 256 - 5 * 12 && f < 256 + 5 * 12);
    rt_dataset_free(&ds);
}

int main(void) {
    if (access(DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST not installed at %s (scripts/install-deps; Debian package dataset-fashion-mnist)\n",
               DIR);
        return 77;
    }
    if (access("/usr/bin/python3", X_OK) != 0) {
        printf("SKIP: /usr/bin/python3 not found\n");
        return 77;
    }
    g_tmp = dt_mkdtemp("fmnist");
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_train), cmocka_unit_test(test_test_split),
                                       cmocka_unit_test(test_hflip_defaults)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dt_rm_rf(g_tmp);
    free(g_tmp);
    return rc;
}
