/* The real Fashion-MNIST (Debian package dataset-fashion-mnist): 60000 training and
 * 10000 test samples, 6000 per class in training, pixel mean/std as measured by the
 * project (0.2860 / 0.3530), and the bytes of a few images and labels equal what
 * Python's gzip module reads from the same files (run at test time by /usr/bin/python3).
 * Skipped (77) when the package is not installed. */
#include "data_test_util.h"

#include "data/dataset.h"

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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_train), cmocka_unit_test(test_test_split)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dt_rm_rf(g_tmp);
    free(g_tmp);
    return rc;
}
