/* CIFAR-100 (binary version: train.bin / test.bin, 3074-byte records of a coarse label, a
 * fine label and 3x32x32 pixels) on files this test writes: the fine and the coarse labels
 * and the pixels read back, the kind's constants (100 or 20 classes, mean/std, crop and
 * flip defaults), detection by file name (and the folder with both CIFARs refused), every
 * malformed file an error naming the file (truncated, wrong size, a CIFAR-10 file under
 * CIFAR-100's name, empty, either label out of range naming the record), coarse labels
 * refused for another dataset, and the loader's batches carrying the right label of each
 * sample on 2 ranks. */
#include "data_test_util.h"

#include "core/names.h"
#include "data/dataset.h"
#include "data/internal/cifar.h"
#include "data/loader.h"

#include <math.h>

enum { NTRAIN = 7, NTEST = 3 };

/* Record i of a file made with `base`: coarse (i + base) % 20, fine (7i + 3 + base) % 100
 * (never equal to the coarse label for the bases used), pixels (5i + k + base) % 253. */
static int coarse_of(int i, int base) { return (i + base) % 20; }
static int fine_of(int i, int base) { return (7 * i + 3 + base) % 100; }

static unsigned char *make_c100(int n, int base, size_t *len) {
    *len = (size_t)n * RT_CIFAR100_RECORD;
    unsigned char *b = malloc(*len);
    for (int i = 0; i < n; i++) {
        unsigned char *r = b + (size_t)i * RT_CIFAR100_RECORD;
        r[0] = (unsigned char)coarse_of(i, base);
        r[1] = (unsigned char)fine_of(i, base);
        for (int k = 0; k < RT_CIFAR_IMAGE; k++) r[2 + k] = (unsigned char)((i * 5 + k + base) % 253);
    }
    return b;
}

/* train.bin (NTRAIN records, base 40) and test.bin (NTEST, base 90) in dir. */
static void write_c100(const char *dir) {
    size_t len;
    unsigned char *b = make_c100(NTRAIN, 40, &len);
    dt_write(dir, "train.bin", b, len);
    free(b);
    b = make_c100(NTEST, 90, &len);
    dt_write(dir, "test.bin", b, len);
    free(b);
}

/* root/cifar-100-binary (as the archive extracts) holding write_c100's files. */
static char *make_root(char *sub, size_t n) {
    char *root = dt_mkdtemp("cifar100");
    snprintf(sub, n, "%s/cifar-100-binary", root);
    assert_int_equal(mkdir(sub, 0755), 0);
    write_c100(sub);
    return root;
}

static void check_split(const rt_dataset *ds, int n, int base, bool coarse) {
    assert_int_equal(ds->n, n);
    assert_int_equal(ds->c, 3);
    assert_int_equal(ds->h, 32);
    assert_int_equal(ds->w, 32);
    assert_int_equal(ds->num_classes, coarse ? 20 : 100);
    size_t len;
    unsigned char *b = make_c100(n, base, &len);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ds->labels[i], coarse ? coarse_of(i, base) : fine_of(i, base));
        assert_memory_equal(ds->images + (size_t)i * RT_CIFAR_IMAGE, b + (size_t)i * RT_CIFAR100_RECORD + 2,
                            RT_CIFAR_IMAGE);
    }
    free(b);
}

static void test_fine_and_coarse(void **state) {
    (void)state;
    char sub[4200];
    char *root = make_root(sub, sizeof sub);
    rt_dataset ds;
    /* auto: train.bin / test.bin in the cifar-100-binary subfolder; fine labels by default */
    assert_rt_ok(rt_dataset_load(root, "train", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.kind, RT_DATASET_CIFAR100);
    assert_string_equal(ds.name, "cifar100");
    assert_string_equal(ds.format, "cifar100-binary (fine)");
    check_split(&ds, NTRAIN, 40, false);
    const float mean[3] = {0.5071f, 0.4865f, 0.4409f}, sd[3] = {0.2673f, 0.2564f, 0.2762f};
    assert_memory_equal(ds.mean, mean, sizeof mean);
    assert_memory_equal(ds.std, sd, sizeof sd);
    assert_true(ds.hflip_suits);
    assert_int_equal(ds.crop_pad, 4);
    rt_dataset_free(&ds);
    assert_rt_ok(rt_dataset_load_label(root, "train", RT_DATASET_AUTO, RT_DATASET_LABEL_COARSE, &ds));
    assert_string_equal(ds.format, "cifar100-binary (coarse)");
    check_split(&ds, NTRAIN, 40, true);
    rt_dataset_free(&ds);
    /* the folder itself, the kind named, the test split, both labels */
    assert_rt_ok(rt_dataset_load_label(sub, "test", RT_DATASET_CIFAR100, RT_DATASET_LABEL_FINE, &ds));
    check_split(&ds, NTEST, 90, false);
    rt_dataset_free(&ds);
    assert_rt_ok(rt_dataset_load_label(sub, "test", RT_DATASET_CIFAR100, RT_DATASET_LABEL_COARSE, &ds));
    check_split(&ds, NTEST, 90, true);
    rt_dataset_free(&ds);
    /* gzip data is read as CIFAR-10's is (recognised by content) */
    size_t len;
    unsigned char *b = make_c100(NTEST, 90, &len);
    dt_write_gz(sub, "test.bin", b, len);
    assert_rt_ok(rt_dataset_load(sub, "test", RT_DATASET_AUTO, &ds));
    check_split(&ds, NTEST, 90, false);
    rt_dataset_free(&ds);
    free(b);
    dt_rm_rf(root);
    free(root);
}

/* Load `split` of dir expecting `want` and every needle in the message. */
static void expect_load_error(const char *dir, const char *split, rt_dataset_label label, rt_status want,
                              const char *const *needles) {
    rt_dataset ds;
    assert_int_equal(rt_dataset_load_label(dir, split, RT_DATASET_AUTO, label, &ds), want);
    for (; *needles; needles++) assert_error_has(*needles);
}

static void test_malformed(void **state) {
    (void)state;
    char sub[4200];
    char *root = make_root(sub, sizeof sub);
    size_t len;
    unsigned char *b = make_c100(NTRAIN, 40, &len);
    /* one byte short */
    dt_write(sub, "train.bin", b, len - 1);
    expect_load_error(sub, "train", RT_DATASET_LABEL_FINE, RT_ERR_FORMAT,
                      (const char *[]){"train.bin", "truncated data: 21517 bytes",
                                       "not a whole number of 3074-byte records",
                                       "expected 21518 bytes for 7 CIFAR-100 records, the last has 3073 bytes", NULL});
    /* one byte too many */
    unsigned char *big = malloc(len + 1);
    memcpy(big, b, len);
    big[len] = 0;
    dt_write(sub, "train.bin", big, len + 1);
    expect_load_error(sub, "train", RT_DATASET_LABEL_FINE, RT_ERR_FORMAT,
                      (const char *[]){"train.bin", "21519 bytes is not a whole number",
                                       "24592 bytes for 8 CIFAR-100 records, the last has 1 bytes", NULL});
    free(big);
    /* a CIFAR-10 file (3073-byte records) under CIFAR-100's name */
    dt_write(sub, "train.bin", b, 2 * RT_CIFAR_RECORD);
    expect_load_error(sub, "train", RT_DATASET_LABEL_FINE, RT_ERR_FORMAT,
                      (const char *[]){"train.bin", "6146 bytes is not a whole number of 3074-byte records",
                                       "whole number of 3073-byte CIFAR-10 records: is it CIFAR-10?", NULL});
    dt_write(sub, "train.bin", b, 0);
    expect_load_error(sub, "train", RT_DATASET_LABEL_FINE, RT_ERR_FORMAT,
                      (const char *[]){"train.bin: empty file: expected 3074-byte CIFAR-100 records", NULL});
    /* the largest labels are fine; one past either is an error naming the record, read as
     * fine or as coarse */
    b[RT_CIFAR100_RECORD + 1] = 99, b[2 * RT_CIFAR100_RECORD] = 19;
    dt_write(sub, "train.bin", b, len);
    rt_dataset ds;
    assert_rt_ok(rt_dataset_load(sub, "train", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.labels[1], 99);
    rt_dataset_free(&ds);
    b[RT_CIFAR100_RECORD + 1] = 100;
    dt_write(sub, "train.bin", b, len);
    for (int l = 0; l < RT_DATASET_LABEL_COUNT_; l++)
        expect_load_error(sub, "train", (rt_dataset_label)l, RT_ERR_FORMAT,
                          (const char *[]){"train.bin: fine label out of range: record 1 (byte offset 3075) has fine "
                                           "label 100, expected 0..99",
                                           NULL});
    b[RT_CIFAR100_RECORD + 1] = 99, b[2 * RT_CIFAR100_RECORD] = 20;
    dt_write(sub, "train.bin", b, len);
    for (int l = 0; l < RT_DATASET_LABEL_COUNT_; l++)
        expect_load_error(sub, "train", (rt_dataset_label)l, RT_ERR_FORMAT,
                          (const char *[]){"train.bin: coarse label out of range: record 2 (byte offset 6148) has "
                                           "coarse label 20, expected 0..19",
                                           NULL});
    /* a missing split */
    char p[4300];
    snprintf(p, sizeof p, "%s/test.bin", sub);
    assert_int_equal(unlink(p), 0);
    expect_load_error(root, "test", RT_DATASET_LABEL_FINE, RT_ERR_IO,
                      (const char *[]){"CIFAR-100 test split: missing file", "cifar-100-binary/test.bin", NULL});
    free(b);
    dt_rm_rf(root);
    free(root);
}

/* CIFAR-10 and CIFAR-100 told apart by their files' names; coarse labels are CIFAR-100's. */
static void test_detect(void **state) {
    (void)state;
    char sub[4200], c10[4200];
    char *root = make_root(sub, sizeof sub);
    snprintf(c10, sizeof c10, "%s/cifar-10-batches-bin", root);
    assert_int_equal(mkdir(c10, 0755), 0);
    unsigned char rec[RT_CIFAR_RECORD] = {3};
    dt_write(c10, "test_batch.bin", rec, sizeof rec);
    rt_dataset ds;
    assert_int_equal(rt_dataset_load(root, "test", RT_DATASET_AUTO, &ds), RT_ERR_INVALID);
    assert_error_has("holds both CIFAR-10 files");
    assert_error_has("set data.kind to cifar10 or cifar100");
    assert_rt_ok(rt_dataset_load(root, "test", RT_DATASET_CIFAR100, &ds));
    assert_int_equal(ds.n, NTEST);
    rt_dataset_free(&ds);
    assert_rt_ok(rt_dataset_load(root, "test", RT_DATASET_CIFAR10, &ds));
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.num_classes, 10);
    rt_dataset_free(&ds);
    /* CIFAR-10 alone: detected as CIFAR-10; its files are not CIFAR-100's; no coarse labels */
    assert_rt_ok(rt_dataset_load(c10, "test", RT_DATASET_AUTO, &ds));
    assert_int_equal(ds.kind, RT_DATASET_CIFAR10);
    rt_dataset_free(&ds);
    assert_int_equal(rt_dataset_load(c10, "test", RT_DATASET_CIFAR100, &ds), RT_ERR_IO);
    assert_error_has("no CIFAR-100 files in");
    assert_int_equal(rt_dataset_load_label(c10, "test", RT_DATASET_AUTO, RT_DATASET_LABEL_COARSE, &ds), RT_ERR_INVALID);
    assert_error_has("data.label coarse: only CIFAR-100 has coarse labels");
    assert_error_has("is cifar10");
    assert_int_equal(rt_dataset_load_label(root, "test", RT_DATASET_MNIST, RT_DATASET_LABEL_COARSE, &ds),
                     RT_ERR_INVALID);
    assert_error_has("is mnist");
    /* nothing there: the message lists what each format would have */
    char *empty = dt_mkdtemp("cifar100-none");
    assert_int_equal(rt_dataset_load(empty, "train", RT_DATASET_AUTO, &ds), RT_ERR_IO);
    assert_error_has("data_batch_1.bin .. data_batch_5.bin (CIFAR-10) or train.bin (CIFAR-100)");
    dt_rm_rf(empty);
    free(empty);
    dt_rm_rf(root);
    free(root);
}

static void test_names(void **state) {
    (void)state;
    rt_dataset_kind k;
    assert_rt_ok(rt_dataset_kind_parse("cifar100", &k));
    assert_int_equal(k, RT_DATASET_CIFAR100);
    assert_rt_ok(rt_dataset_kind_parse("CIFAR-100", &k));
    assert_int_equal(k, RT_DATASET_CIFAR100);
    assert_string_equal(rt_dataset_kind_name(RT_DATASET_CIFAR100), "cifar100");
    int l;
    assert_rt_ok(rt_names_parse(&rt_dataset_label_names, "Coarse", &l));
    assert_int_equal(l, RT_DATASET_LABEL_COARSE);
    assert_rt_ok(rt_names_parse(&rt_dataset_label_names, "fine", &l));
    assert_int_equal(l, RT_DATASET_LABEL_FINE);
    assert_int_equal(rt_names_parse(&rt_dataset_label_names, "superclass", &l), RT_ERR_INVALID);
    assert_error_has("unknown dataset label 'superclass' (expected fine | coarse)");
}

/* Every sample of an epoch on 2 ranks (shuffled, no augmentation) arrives once with its
 * own label (fine or coarse) and its pixels normalised with CIFAR-100's constants. */
static void check_loader(const rt_dataset *ds, bool coarse) {
    int seen[NTRAIN] = {0};
    for (int rank = 0; rank < 2; rank++) {
        rt_loader_config c = rt_loader_config_default(ds);
        c.world_size = 2, c.rank = rank, c.global_batch = 4, c.seed = 5, c.augment = false;
        rt_loader *l;
        assert_rt_ok(rt_loader_create(&c, &l));
        assert_rt_ok(rt_loader_start_epoch(l, 0));
        rt_batch b;
        while (rt_loader_next(l, &b) == RT_OK && b.size > 0)
            for (int j = 0; j < b.size; j++) {
                int s = (int)b.samples[j];
                assert_in_range(s, 0, NTRAIN - 1);
                seen[s]++;
                assert_int_equal(b.labels[j], coarse ? coarse_of(s, 40) : fine_of(s, 40));
                const float *img = b.images + (size_t)j * RT_CIFAR_IMAGE;
                for (int ch = 0; ch < 3; ch++) {
                    size_t k = (size_t)ch * 1024 + 33;
                    float want = ((float)((s * 5 + (int)k + 40) % 253) / 255.0f - ds->mean[ch]) / ds->std[ch];
                    assert_true(fabsf(img[k] - want) < 1e-5f);
                }
            }
        rt_loader_destroy(l);
    }
    int total = 0;
    for (int s = 0; s < NTRAIN; s++) {
        assert_true(seen[s] >= 1);
        total += seen[s];
    }
    assert_int_equal(total, 8); /* 7 padded to 8 (DistributedSampler) */
}

static void test_loader(void **state) {
    (void)state;
    char sub[4200];
    char *root = make_root(sub, sizeof sub);
    for (int l = 0; l < RT_DATASET_LABEL_COUNT_; l++) {
        rt_dataset ds;
        assert_rt_ok(rt_dataset_load_label(root, "train", RT_DATASET_CIFAR100, (rt_dataset_label)l, &ds));
        check_loader(&ds, l == RT_DATASET_LABEL_COARSE);
        rt_dataset_free(&ds);
    }
    dt_rm_rf(root);
    free(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fine_and_coarse), cmocka_unit_test(test_malformed), cmocka_unit_test(test_detect),
        cmocka_unit_test(test_names),           cmocka_unit_test(test_loader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
