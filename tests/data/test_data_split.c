/* data.val_split (rt_dataset_split): the held-out samples and the training ones are
 * disjoint and together the whole set, each sample's image and label are kept, the
 * choice is the seed's alone (the same for any caller: a rank, a world size), another
 * seed holds out others, and bad sizes are refused naming the key. */
#include "data_test_util.h"

#include "data/dataset.h"

#include <stdint.h>

enum { N = 203, C = 1, H = 3, W = 2 };

/* sample i: label i % 10, every pixel (i * 7 + k) & 255, so a sample names itself */
static void make(rt_dataset *ds) {
    assert_rt_ok(rt_dataset_alloc(ds, "synthetic", N, C, H, W, 10));
    uint8_t *img = (uint8_t *)ds->images, *lab = (uint8_t *)ds->labels;
    for (int i = 0; i < N; i++) {
        lab[i] = (uint8_t)(i % 10);
        for (int k = 0; k < C * H * W; k++) img[i * C * H * W + k] = (uint8_t)((i * 7 + k) & 255);
    }
    ds->mean[0] = 0.25f;
}

/* the source index of sample j of part p (its first pixel and label identify it) */
static int source_of(const rt_dataset *p, int64_t j) {
    for (int i = 0; i < N; i++)
        if (p->images[j * C * H * W] == (uint8_t)((i * 7) & 255) &&
            p->images[j * C * H * W + 1] == (uint8_t)((i * 7 + 1) & 255) && p->labels[j] == i % 10)
            return i;
    return -1;
}

static void split(const rt_dataset *ds, int64_t n_val, uint64_t seed, int *owner, int64_t *held) {
    rt_dataset tr, va;
    assert_rt_ok(rt_dataset_split(ds, n_val, seed, &tr, &va, held));
    assert_int_equal(tr.n, N - n_val);
    assert_int_equal(va.n, n_val);
    assert_string_equal(va.split, "val");
    assert_true(va.mean[0] == 0.25f && tr.mean[0] == 0.25f); /* the set's normalisation */
    for (int i = 0; i < N; i++) owner[i] = 0;
    for (int64_t j = 0; j < tr.n; j++) owner[source_of(&tr, j)] += 1;
    for (int64_t j = 0; j < va.n; j++) owner[source_of(&va, j)] += 2;
    rt_dataset_free(&tr);
    rt_dataset_free(&va);
}

static void test_split(void **state) {
    (void)state;
    rt_dataset ds;
    make(&ds);
    int owner[N], again[N], other[N];
    int64_t held[50], held2[50], held3[50];
    split(&ds, 50, 42, owner, held);
    int nval = 0;
    for (int i = 0; i < N; i++) {
        assert_true(owner[i] == 1 || owner[i] == 2); /* each sample in exactly one part */
        nval += owner[i] == 2;
    }
    assert_int_equal(nval, 50);
    for (int k = 0; k < 50; k++) {
        assert_int_equal(owner[held[k]], 2); /* the indices reported are the held-out ones */
        if (k) assert_true(held[k] > held[k - 1]);
    }
    split(&ds, 50, 42, again, held2); /* the seed's alone: any rank, any world size */
    assert_memory_equal(owner, again, sizeof owner);
    assert_memory_equal(held, held2, sizeof held);
    split(&ds, 50, 43, other, held3);
    assert_memory_not_equal(held, held3, sizeof held);
    /* not the first or last 50: a permutation, not a slice */
    int first = 0, last = 0;
    for (int k = 0; k < 50; k++) first += held[k] < 50, last += held[k] >= N - 50;
    assert_true(first < 50 && last < 50);
    rt_dataset_free(&ds);
}

static void test_bad_sizes(void **state) {
    (void)state;
    rt_dataset ds, tr, va;
    make(&ds);
    assert_int_equal(rt_dataset_split(&ds, N, 1, &tr, &va, NULL), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "data.val_split: 203 of the 203 training samples"));
    assert_int_equal(rt_dataset_split(&ds, 0, 1, &tr, &va, NULL), RT_ERR_INVALID);
    rt_error_clear();
    rt_dataset_free(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
