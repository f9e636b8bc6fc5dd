/* IDX (raw and gzip) and CIFAR-10 readers on files this test writes: good files load
 * with the right bytes, and every kind of malformed file gets an error naming the file
 * and what was wrong (bad magic, wrong dimensions, count mismatch, truncation, trailing
 * bytes, label out of range, gzip errors, missing files). */
#include "data_test_util.h"

#include "data/internal/bytes.h"
#include "data/internal/cifar.h"
#include "data/dataset.h"
#include "data/internal/idx.h"

enum { N = 5, ROWS = 3, COLS = 4 };

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

/* IDX images (n, rows, cols) with pixel (i, k) = 7*i + k, and labels i % 10. */
static size_t make_images(unsigned char *buf, uint32_t n, uint32_t rows, uint32_t cols) {
    be32(buf, 0x00000803);
    be32(buf + 4, n), be32(buf + 8, rows), be32(buf + 12, cols);
    for (uint32_t i = 0; i < n * rows * cols; i++)
        buf[16 + i] = (unsigned char)(7 * (i / (rows * cols)) + i % (rows * cols));
    return 16 + (size_t)n * rows * cols;
}
static size_t make_labels(unsigned char *buf, uint32_t n) {
    be32(buf, 0x00000801);
    be32(buf + 4, n);
    for (uint32_t i = 0; i < n; i++) buf[8 + i] = (unsigned char)(i % 10);
    return 8 + n;
}

static unsigned char g_img[16 + N * ROWS * COLS + 16], g_lab[8 + N + 8];
static size_t g_img_len, g_lab_len;

static void write_idx_set(const char *dir, const char *prefix, const unsigned char *img, size_t il,
                          const unsigned char *lab, size_t ll, int gz) {
    char a[128], b[128];
    snprintf(a, sizeof a, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    snprintf(b, sizeof b, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    if (gz) {
        dt_write_gz(dir, a, img, il);
        dt_write_gz(dir, b, lab, ll);
    } else {
        dt_write(dir, a, img, il);
        dt_write(dir, b, lab, ll);
    }
}

static int setup(void **state) {
    (void)state;
    g_img_len = make_images(g_img, N, ROWS, COLS);
    g_lab_len = make_labels(g_lab, N);
    return 0;
}

static void check_good(const rt_dataset *ds) {
    assert_int_equal(ds->n, N);
    assert_int_equal(ds->c, 1);
    assert_int_equal(ds->h, ROWS);
    assert_int_equal(ds->w, COLS);
    assert_int_equal(ds->num_classes, 10);
    assert_memory_equal(ds->images, g_img + 16, N * ROWS * COLS);
    for (int i = 0; i < N; i++) assert_int_equal(ds->labels[i], i % 10);
}

static void test_idx_raw_and_gzip(void **state) {
    (void)state;
    char *dir = dt_mkdtemp("mnist");
    write_idx_set(dir, "train", g_img, g_img_len, g_lab, g_lab_len, 0);
    rt_dataset ds;
    assert_rt_ok(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds));
    check_good(&ds);
    assert_string_equal(ds.name, "mnist");
    assert_string_equal(ds.format, "idx");
    assert_string_equal(ds.split, "train");
    assert_false(ds.hflip_suits);
    rt_dataset_free(&ds);
    /* no test split yet: the error names the missing file */
    assert_int_equal(rt_dataset_load(dir, "test", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("t10k-images-idx3-ubyte");
    dt_rm_rf(dir);
    free(dir);

    dir = dt_mkdtemp("fashion");
    write_idx_set(dir, "t10k", g_img, g_img_len, g_lab, g_lab_len, 1);
    assert_rt_ok(rt_dataset_load(dir, "test", RT_DATASET_AUTO, &ds));
    check_good(&ds);
    assert_string_equal(ds.name, "fashion-mnist"); /* the folder names it */
    assert_string_equal(ds.format, "idx (gzip)");
    assert_float_equal(ds.mean[0], 0.2860, 1e-6);
    assert_float_equal(ds.std[0], 0.3530, 1e-6);
    rt_dataset_free(&ds);
    /* an explicit kind wins over the folder's name */
    assert_rt_ok(rt_dataset_load(dir, "test", RT_DATASET_MNIST, &ds));
    assert_string_equal(ds.name, "mnist");
    rt_dataset_free(&ds);
    assert_int_equal(rt_dataset_load(dir, "validation", RT_DATASET_AUTO, &ds), RT_ERR_INVALID);
    assert_error_has("expected train or test");
    dt_rm_rf(dir);
    free(dir);
}

/* Write images/labels (raw), load, expect `code` and an error naming `file` and `what`. */
static void expect_bad(const unsigned char *img, size_t il, const unsigned char *lab, size_t ll, int gz, rt_status code,
                       const char *file, const char *what) {
    char *dir = dt_mkdtemp("bad");
    write_idx_set(dir, "train", img, il, lab, ll, gz);
    rt_dataset ds;
    rt_status st = rt_dataset_load(dir, "train", RT_DATASET_MNIST, &ds);
    if (st == RT_OK) fail_msg("loaded a malformed dataset (expected an error about %s)", what);
    assert_int_equal(st, code);
    assert_error_has(file);
    assert_error_has(what);
    dt_rm_rf(dir);
    free(dir);
}

static void test_idx_malformed(void **state) {
    (void)state;
    unsigned char img[sizeof g_img], lab[sizeof g_lab];
    for (int gz = 0; gz <= 1; gz++) {
        /* bad magic */
        memcpy(img, g_img, g_img_len);
        img[0] = 0x1f, img[1] = 0x00;
        expect_bad(img, g_img_len, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte", "bad magic");
        /* element type other than unsigned byte */
        memcpy(img, g_img, g_img_len);
        img[2] = 0x0d;
        expect_bad(img, g_img_len, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte", "element type 0x0d");
        /* labels file with the images' magic (3 dims) */
        expect_bad(g_img, g_img_len, g_img, g_img_len, gz, RT_ERR_FORMAT, "train-labels-idx1-ubyte",
                   "wrong dimensions");
        /* a zero dimension */
        memcpy(img, g_img, g_img_len);
        be32(img + 8, 0);
        expect_bad(img, 16, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte", "dimension 1 is 0");
        /* counts differ: 4 labels for 5 images */
        size_t ll = make_labels(lab, N - 1);
        expect_bad(g_img, g_img_len, lab, ll, gz, RT_ERR_FORMAT, "train-labels-idx1-ubyte", "counts differ");
        /* truncated data: one byte short, expected vs actual */
        expect_bad(g_img, g_img_len - 1, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte",
                   "truncated data: expected 60 bytes after the 16-byte header, got 59");
        /* truncated header */
        expect_bad(g_img, 10, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte", "truncated IDX header");
        expect_bad(g_img, 2, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte", "truncated IDX header");
        /* trailing bytes */
        memcpy(img, g_img, g_img_len);
        img[g_img_len] = 1;
        expect_bad(img, g_img_len + 1, g_lab, g_lab_len, gz, RT_ERR_FORMAT, "train-images-idx3-ubyte",
                   gz ? "unexpected bytes after the data" : "1 unexpected bytes after the data");
        /* label out of range */
        memcpy(lab, g_lab, g_lab_len);
        lab[8 + 3] = 10;
        expect_bad(g_img, g_img_len, lab, g_lab_len, gz, RT_ERR_FORMAT, "train-labels-idx1-ubyte",
                   "label out of range: label 10 at index 3");
    }
}

static void test_gzip_errors(void **state) {
    (void)state;
    size_t zl;
    unsigned char *z = dt_gzip(g_img, g_img_len, &zl);
    char *dir = dt_mkdtemp("gz");
    dt_write(dir, "train-labels-idx1-ubyte", g_lab, g_lab_len);
    rt_dataset ds;
    /* truncated gzip stream */
    dt_write(dir, "train-images-idx3-ubyte.gz", z, zl - 9);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("train-images-idx3-ubyte.gz");
    assert_error_has("gzip error");
    /* corrupted deflate data: CRC or stream error, either way a gzip error */
    unsigned char *bad = malloc(zl);
    memcpy(bad, z, zl);
    for (size_t i = 12; i < zl - 8; i += 3) bad[i] ^= 0x5a;
    dt_write(dir, "train-images-idx3-ubyte.gz", bad, zl);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("gzip error");
    /* a wrong CRC only */
    memcpy(bad, z, zl);
    bad[zl - 8] ^= 1;
    dt_write(dir, "train-images-idx3-ubyte.gz", bad, zl);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("gzip error");
    /* data after the end of the stream */
    unsigned char *more = malloc(zl + 3);
    memcpy(more, z, zl);
    memcpy(more + zl, "abc", 3);
    dt_write(dir, "train-images-idx3-ubyte.gz", more, zl + 3);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("3 unexpected bytes after the end of the gzip stream");
    /* the good stream loads */
    dt_write(dir, "train-images-idx3-ubyte.gz", z, zl);
    assert_rt_ok(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds));
    check_good(&ds);
    rt_dataset_free(&ds);
    /* two gzip members, as `cat a.gz b.gz` makes, inflate to both parts */
    size_t z1l, z2l;
    unsigned char *z1 = dt_gzip(g_img, 20, &z1l), *z2 = dt_gzip(g_img + 20, g_img_len - 20, &z2l);
    unsigned char *cat = malloc(z1l + z2l);
    memcpy(cat, z1, z1l);
    memcpy(cat + z1l, z2, z2l);
    dt_write(dir, "train-images-idx3-ubyte.gz", cat, z1l + z2l);
    assert_rt_ok(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds));
    check_good(&ds);
    rt_dataset_free(&ds);
    /* ... but a truncated second member is an error */
    dt_write(dir, "train-images-idx3-ubyte.gz", cat, z1l + z2l - 5);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("gzip error");
    free(cat);
    free(z1);
    free(z2);
    /* the inflate limit */
    rt_bytes out;
    assert_int_equal(rt_gunzip(z, zl, "buf", 10, NULL, &out), RT_ERR_FORMAT);
    assert_error_has("more than 10 bytes");
    assert_rt_ok(rt_gunzip(z, zl, "buf", g_img_len, NULL, &out));
    assert_int_equal(out.len, g_img_len);
    assert_memory_equal(out.data, g_img, g_img_len);
    rt_bytes_free(&out);
    free(more);
    free(bad);
    free(z);
    dt_rm_rf(dir);
    free(dir);
}

static void test_idx_parse_every_prefix(void **state) {
    (void)state;
    /* every prefix of a good file is rejected as truncated, never read past */
    for (size_t len = 0; len < g_img_len; len++) {
        unsigned char *copy = malloc(len ? len : 1);
        memcpy(copy, g_img, len);
        rt_idx v;
        assert_int_equal(rt_idx_parse(copy, len, "buf", 3, &v), RT_ERR_FORMAT);
        assert_error_has("truncated");
        free(copy);
    }
    rt_idx v;
    assert_rt_ok(rt_idx_parse(g_img, g_img_len, "buf", 3, &v));
    assert_int_equal(v.dims[0], N);
    assert_int_equal(v.dims[1], ROWS);
    assert_int_equal(v.dims[2], COLS);
    assert_int_equal(v.count, N * ROWS * COLS);
    assert_ptr_equal(v.data, g_img + 16);
    /* a header whose element count overflows */
    unsigned char big[16];
    be32(big, 0x803), be32(big + 4, 0xffffffffu), be32(big + 8, 0xffffffffu), be32(big + 12, 0xffffffffu);
    assert_int_equal(rt_idx_parse(big, sizeof big, "big", 3, &v), RT_ERR_FORMAT);
    assert_error_has("big");
}

static void test_missing_dataset(void **state) {
    (void)state;
    rt_dataset ds;
    char *dir = dt_mkdtemp("empty");
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("no dataset found");
    assert_error_has("scripts/install-deps");
    assert_error_has("dataset-fashion-mnist");
    assert_error_has("data.path");
    char p[4200];
    snprintf(p, sizeof p, "%s/nowhere", dir);
    assert_int_equal(rt_dataset_load(p, "train", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("nowhere");
    assert_error_has("scripts/install-deps");
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_CIFAR10, &ds), RT_ERR_IO);
    assert_error_has("CIFAR-10");
    assert_error_has("data.path");
    /* images without labels */
    dt_write(dir, "train-images-idx3-ubyte", g_img, g_img_len);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("train-labels-idx1-ubyte");
    dt_rm_rf(dir);
    free(dir);
}

/* CIFAR-10 batch of n records: label (i + base) % 10, pixels (i*3 + k + base) % 251. */
static unsigned char *make_cifar(int n, int base, size_t *len) {
    *len = (size_t)n * RT_CIFAR_RECORD;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < n; i++) {
        unsigned char *r = b + (size_t)i * RT_CIFAR_RECORD;
        r[0] = (unsigned char)((i + base) % 10);
        for (int k = 0; k < RT_CIFAR_IMAGE; k++) r[1 + k] = (unsigned char)((i * 3 + k + base) % 251);
    }
    return b;
}

static void write_cifar_train(const char *dir, int per) {
    for (int f = 1; f <= 5; f++) {
        size_t len;
        unsigned char *b = make_cifar(per, f * 100, &len);
        char name[64];
        snprintf(name, sizeof name, "data_batch_%d.bin", f);
        dt_write(dir, name, b, len);
        free(b);
    }
}

static void test_cifar(void **state) {
    (void)state;
    char *root = dt_mkdtemp("cifar");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/cifar-10-batches-bin", root);
    assert_int_equal(mkdir(dir, 0755), 0);
    write_cifar_train(dir, 2);
    size_t len;
    unsigned char *t = make_cifar(3, 7, &len);
    dt_write(dir, "test_batch.bin", t, len);
    rt_dataset ds;
    /* found in the cifar-10-batches-bin subfolder */
    assert_rt_ok(rt_dataset_load(root, "train", RT_DATASET_AUTO, &ds));
    assert_string_equal(ds.name, "cifar10");
    assert_string_equal(ds.format, "cifar10-binary");
    assert_int_equal(ds.n, 10);
    assert_int_equal(ds.c, 3);
    assert_int_equal(ds.h, 32);
    assert_int_equal(ds.w, 32);
    assert_true(ds.hflip_suits);
    for (int f = 1; f <= 5; f++) {
        size_t bl;
        unsigned char *b = make_cifar(2, f * 100, &bl);
        for (int i = 0; i < 2; i++) {
            int64_t s = (f - 1) * 2 + i;
            assert_int_equal(ds.labels[s], b[(size_t)i * RT_CIFAR_RECORD]);
            assert_memory_equal(ds.images + (size_t)s * RT_CIFAR_IMAGE, b + (size_t)i * RT_CIFAR_RECORD + 1,
                                RT_CIFAR_IMAGE);
        }
        free(b);
    }
    rt_dataset_free(&ds);
    assert_rt_ok(rt_dataset_load(dir, "test", RT_DATASET_CIFAR10, &ds));
    assert_int_equal(ds.n, 3);
    assert_memory_equal(ds.images, t + 1, RT_CIFAR_IMAGE);
    assert_int_equal(ds.labels[2], (2 + 7) % 10);
    rt_dataset_free(&ds);

    /* truncated test batch */
    dt_write(dir, "test_batch.bin", t, len - 1);
    assert_int_equal(rt_dataset_load(dir, "test", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("test_batch.bin");
    assert_error_has("truncated data");
    assert_error_has("expected 9219 bytes");
    /* empty */
    dt_write(dir, "test_batch.bin", t, 0);
    assert_int_equal(rt_dataset_load(dir, "test", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("empty");
    /* label out of range */
    t[RT_CIFAR_RECORD] = 10;
    dt_write(dir, "test_batch.bin", t, len);
    assert_int_equal(rt_dataset_load(dir, "test", RT_DATASET_AUTO, &ds), RT_ERR_FORMAT);
    assert_error_has("label out of range: record 1");
    /* a missing training batch */
    char p[4300];
    snprintf(p, sizeof p, "%s/data_batch_3.bin", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rt_dataset_load(dir, "train", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("data_batch_3.bin");
    free(t);
    dt_rm_rf(root);
    free(root);
}

static void test_kind_parse(void **state) {
    (void)state;
    rt_dataset_kind k;
    assert_rt_ok(rt_dataset_kind_parse("fashion-mnist", &k));
    assert_int_equal(k, RT_DATASET_FASHION_MNIST);
    assert_rt_ok(rt_dataset_kind_parse("CIFAR10", &k));
    assert_int_equal(k, RT_DATASET_CIFAR10);
    assert_rt_ok(rt_dataset_kind_parse("Fashion_MNIST", &k));
    assert_int_equal(k, RT_DATASET_FASHION_MNIST);
    assert_int_equal(rt_dataset_kind_parse("imagenet", &k), RT_ERR_INVALID);
    assert_error_has("unknown dataset kind 'imagenet' (expected auto | mnist | fashion-mnist | cifar10 | cifar100)");
    assert_int_equal(rt_dataset_kind_parse("synthetic", &k), RT_ERR_INVALID); /* built in memory, never loaded */
    assert_int_equal(rt_dataset_kind_parse(NULL, &k), RT_ERR_INVALID);
    for (int i = 0; i < RT_DATASET_SYNTHETIC; i++) {
        assert_rt_ok(rt_dataset_kind_parse(rt_dataset_kind_name((rt_dataset_kind)i), &k));
        assert_int_equal(k, i);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_raw_and_gzip), cmocka_unit_test(test_idx_malformed),
        cmocka_unit_test(test_gzip_errors),      cmocka_unit_test(test_idx_parse_every_prefix),
        cmocka_unit_test(test_missing_dataset),  cmocka_unit_test(test_cifar),
        cmocka_unit_test(test_kind_parse),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
