/* The samplers: coverage per epoch for world sizes 1-5 and sizes that do not divide
 * evenly (every index once, plus exactly the padding; or the tail dropped), different
 * epochs give different orders, equal seeds agree, the padding repeats the start of the
 * epoch's shuffled order (so the repeated samples change per epoch), state
 * save/restore, the fixed partition and the evaluation split (every sample exactly once
 * across ranks). */
#include "data_test_util.h"

#include "data/sampler.h"

static const int64_t k_sizes[] = {1, 2, 3, 7, 10, 13, 64, 101, 1000};
#define NSIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))

static void init(rt_sampler *s, rt_sampler_mode mode, int64_t n, int w, int r, uint64_t seed, bool shuffle, bool drop) {
    rt_sampler_config c = {mode, n, w, r, seed, shuffle, drop};
    assert_rt_ok(rt_sampler_init(s, &c));
}

/* All ranks' indices of one epoch counted per dataset index; returns the total. */
static int64_t count_epoch(rt_sampler_mode mode, int64_t n, int w, uint64_t seed, bool shuffle, bool drop,
                           int64_t epoch, int64_t *counts, int64_t *len0) {
    memset(counts, 0, (size_t)n * sizeof *counts);
    int64_t total = 0;
    for (int r = 0; r < w; r++) {
        rt_sampler s;
        init(&s, mode, n, w, r, seed, shuffle, drop);
        assert_rt_ok(rt_sampler_set_epoch(&s, epoch));
        int64_t idx, k = 0;
        while (rt_sampler_next(&s, &idx)) {
            assert_true(idx >= 0 && idx < n);
            counts[idx]++;
            k++;
        }
        assert_int_equal(k, rt_sampler_len(&s));
        if (r == 0) *len0 = k;
        if (mode != RT_SAMPLER_EVAL) assert_int_equal(k, *len0); /* equal lengths on every rank */
        total += k;
        rt_sampler_free(&s);
    }
    return total;
}

static void test_distributed_coverage(void **state) {
    (void)state;
    int64_t *counts = malloc(1000 * sizeof *counts);
    for (int si = 0; si < NSIZES; si++)
        for (int w = 1; w <= 5; w++)
            for (int shuffle = 0; shuffle <= 1; shuffle++)
                for (int64_t epoch = 0; epoch < 3; epoch++) {
                    int64_t n = k_sizes[si], len0;
                    /* drop_last false: ceil(n/w)*w indices, every index at least once, the
                     * padding (total - n) repeats indices */
                    int64_t total = count_epoch(RT_SAMPLER_DISTRIBUTED, n, w, 11, shuffle, false, epoch, counts, &len0);
                    int64_t want = (n + w - 1) / w * w;
                    assert_int_equal(total, want);
                    int64_t extra = 0;
                    for (int64_t i = 0; i < n; i++) {
                        assert_true(counts[i] >= 1);
                        extra += counts[i] - 1;
                    }
                    assert_int_equal(extra, want - n);
                    if (want - n <= n)
                        for (int64_t i = 0; i < n; i++) assert_true(counts[i] <= 2);
                    /* drop_last true: floor(n/w)*w distinct indices (all of them when w divides n) */
                    total = count_epoch(RT_SAMPLER_DISTRIBUTED, n, w, 11, shuffle, true, epoch, counts, &len0);
                    assert_int_equal(total, n / w * w);
                    int64_t seen = 0;
                    for (int64_t i = 0; i < n; i++) {
                        assert_true(counts[i] <= 1);
                        seen += counts[i];
                    }
                    assert_int_equal(seen, n / w * w);
                }
    free(counts);
}

static void test_no_shuffle_layout(void **state) {
    (void)state;
    /* n = 10, w = 4: [0..9] + pad [0, 1] -> rank 1 gets 1, 5, 9; rank 2 gets 2, 6, 0 */
    rt_sampler s;
    init(&s, RT_SAMPLER_DISTRIBUTED, 10, 4, 2, 0, false, false);
    assert_int_equal(rt_sampler_len(&s), 3);
    assert_int_equal(s.indices[0], 2);
    assert_int_equal(s.indices[1], 6);
    assert_int_equal(s.indices[2], 0);
    rt_sampler_free(&s);
    init(&s, RT_SAMPLER_DISTRIBUTED, 10, 4, 3, 0, false, true);
    assert_int_equal(rt_sampler_len(&s), 2);
    assert_int_equal(s.indices[0], 3);
    assert_int_equal(s.indices[1], 7);
    rt_sampler_free(&s);
    /* more ranks than samples: wraps around repeatedly */
    init(&s, RT_SAMPLER_DISTRIBUTED, 2, 5, 4, 0, false, false);
    assert_int_equal(rt_sampler_len(&s), 1);
    assert_int_equal(s.indices[0], 0);
    rt_sampler_free(&s);
    init(&s, RT_SAMPLER_DISTRIBUTED, 2, 5, 4, 0, false, true);
    assert_int_equal(rt_sampler_len(&s), 0);
    int64_t idx;
    assert_false(rt_sampler_next(&s, &idx));
    rt_sampler_free(&s);
}

static void order(rt_sampler_mode mode, int64_t n, int w, int r, uint64_t seed, int64_t epoch, int64_t *out) {
    rt_sampler s;
    init(&s, mode, n, w, r, seed, true, false);
    assert_rt_ok(rt_sampler_set_epoch(&s, epoch));
    memcpy(out, s.indices, (size_t)s.num_samples * sizeof *out);
    rt_sampler_free(&s);
}

static void test_epochs_and_seeds(void **state) {
    (void)state;
    int64_t a[1000], b[1000];
    for (int w = 1; w <= 5; w++) {
        int64_t m = (1000 + w - 1) / w;
        order(RT_SAMPLER_DISTRIBUTED, 1000, w, w - 1, 5, 0, a);
        order(RT_SAMPLER_DISTRIBUTED, 1000, w, w - 1, 5, 0, b);
        assert_memory_equal(a, b, (size_t)m * sizeof *a); /* equal seeds agree */
        order(RT_SAMPLER_DISTRIBUTED, 1000, w, w - 1, 5, 1, b);
        assert_memory_not_equal(a, b, (size_t)m * sizeof *a); /* epochs differ */
        order(RT_SAMPLER_DISTRIBUTED, 1000, w, w - 1, 6, 1, a);
        order(RT_SAMPLER_DISTRIBUTED, 1000, w, w - 1, 7, 1, b);
        assert_memory_not_equal(a, b, (size_t)m * sizeof *a); /* seeds differ */
    }
    /* shuffled order is not the identity, and is a permutation (checked by coverage) */
    order(RT_SAMPLER_DISTRIBUTED, 500, 1, 0, 0, 0, a);
    int same = 0;
    for (int i = 0; i < 500; i++) same += a[i] == i;
    assert_true(same < 50);
}

/* The global order of one epoch: position r + k*w is rank r's k-th index. */
static void global_order(int64_t n, int w, uint64_t seed, int64_t epoch, int64_t *out, int64_t *total) {
    *total = 0;
    for (int r = 0; r < w; r++) {
        rt_sampler s;
        init(&s, RT_SAMPLER_DISTRIBUTED, n, w, r, seed, true, false);
        assert_rt_ok(rt_sampler_set_epoch(&s, epoch));
        for (int64_t k = 0; k < rt_sampler_len(&s); k++) out[r + k * w] = rt_sampler_indices(&s)[k];
        *total += rt_sampler_len(&s);
        rt_sampler_free(&s);
    }
}

/* With shuffle on, the padding repeats the first entries of the epoch's permutation (as
 * torch's DistributedSampler does: indices += indices[:padding]), not the dataset's
 * first samples: the duplicated samples change from epoch to epoch. Counting
 * occurrences cannot tell the two apart; this looks at which samples are repeated. */
static void test_shuffled_padding(void **state) {
    (void)state;
    static const int64_t sizes[] = {10, 7, 13, 101};
    for (int si = 0; si < 4; si++)
        for (int w = 2; w <= 5; w++) {
            int64_t n = sizes[si], order[128], total;
            if (n % w == 0) continue;
            int differs = 0;
            bool dup_changed = false;
            int64_t first_dup = -1;
            for (int64_t epoch = 0; epoch < 6; epoch++) {
                global_order(n, w, 21, epoch, order, &total);
                assert_int_equal(total, (n + w - 1) / w * w);
                for (int64_t p = n; p < total; p++) assert_int_equal(order[p], order[p - n]); /* wraps the order */
                for (int64_t p = 0; p < n; p++) differs += order[p] != p;
                if (epoch == 0) first_dup = order[n];
                dup_changed |= order[n] != first_dup;
            }
            assert_true(differs > 0); /* the order is shuffled at all */
            assert_true(dup_changed); /* the padded samples move with the epoch */
        }
    /* n = 10, world 4: 2 padded entries, the first two of that epoch's order */
    int64_t order[12], total;
    int64_t seen[10] = {0};
    for (int64_t epoch = 0; epoch < 8; epoch++) {
        global_order(10, 4, 3, epoch, order, &total);
        assert_int_equal(total, 12);
        assert_int_equal(order[10], order[0]);
        assert_int_equal(order[11], order[1]);
        seen[order[10]]++;
    }
    int distinct = 0;
    for (int i = 0; i < 10; i++) distinct += seen[i] > 0;
    assert_true(distinct >= 3); /* not always sample 0 */
}

/* The shuffle is uniform: over 600 seeds every one of the 3! orders of 3 samples turns
 * up about equally often. Counts of each index cannot tell a biased shuffle from a fair
 * one: Fisher-Yates drawing j below i instead of i + 1 (Sattolo's algorithm) still
 * gives a permutation, but only the 2 cyclic ones of the 6. */
static void test_shuffle_uniform(void **state) {
    (void)state;
    int counts[3][3][3] = {{{0}}};
    for (uint64_t seed = 0; seed < 600; seed++) {
        int64_t a[3];
        order(RT_SAMPLER_DISTRIBUTED, 3, 1, 0, seed, 0, a);
        counts[a[0]][a[1]][a[2]]++;
    }
    int orders = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 3; k++)
                if (i != j && j != k && i != k) {
                    orders++;
                    if (counts[i][j][k] < 60 || counts[i][j][k] > 140)
                        fail_msg("order (%d %d %d) came %d times in 600 (expected about 100)", i, j, k,
                                 counts[i][j][k]);
                }
    assert_int_equal(orders, 6);
    /* and a permutation of 10 keeps some sample in place for some seed (1 - 1/e of them) */
    int fixed = 0;
    for (uint64_t seed = 0; seed < 50; seed++) {
        int64_t a[10];
        order(RT_SAMPLER_DISTRIBUTED, 10, 1, 0, seed, 0, a);
        for (int i = 0; i < 10; i++) fixed += a[i] == i;
    }
    assert_true(fixed > 20); /* about 50 expected */
}

static void test_state_roundtrip(void **state) {
    (void)state;
    rt_sampler s, t;
    init(&s, RT_SAMPLER_DISTRIBUTED, 101, 3, 1, 42, true, false);
    assert_rt_ok(rt_sampler_set_epoch(&s, 4));
    int64_t idx;
    for (int i = 0; i < 17; i++) assert_true(rt_sampler_next(&s, &idx));
    rt_sampler_state st = rt_sampler_get_state(&s);
    assert_int_equal(st.epoch, 4);
    assert_int_equal(st.position, 17);
    /* a fresh sampler (another process after a restart) continues identically */
    init(&t, RT_SAMPLER_DISTRIBUTED, 101, 3, 1, 42, true, false);
    assert_rt_ok(rt_sampler_set_state(&t, st));
    int64_t a, b;
    int n = 0;
    while (rt_sampler_next(&s, &a)) {
        assert_true(rt_sampler_next(&t, &b));
        assert_int_equal(a, b);
        n++;
    }
    assert_int_equal(n, 34 - 17);
    assert_false(rt_sampler_next(&t, &b));
    st.position = 35;
    assert_int_equal(rt_sampler_set_state(&t, st), RT_ERR_INVALID);
    assert_error_has("position 35");
    rt_sampler_free(&s);
    rt_sampler_free(&t);
}

static void test_partition(void **state) {
    (void)state;
    int64_t *counts = malloc(1000 * sizeof *counts);
    for (int si = 0; si < NSIZES; si++)
        for (int w = 1; w <= 5; w++)
            for (int shuffle = 0; shuffle <= 1; shuffle++) {
                int64_t n = k_sizes[si], len0;
                int64_t total = count_epoch(RT_SAMPLER_PARTITION, n, w, 3, shuffle, false, 0, counts, &len0);
                assert_int_equal(len0, n / w);
                assert_int_equal(total, n / w * w);
                for (int64_t i = 0; i < n; i++) assert_true(counts[i] <= 1); /* disjoint parts */
            }
    /* the part is fixed across epochs (as a set), its order changes with shuffle */
    int64_t a[250], b[250];
    order(RT_SAMPLER_PARTITION, 1000, 4, 2, 9, 0, a);
    order(RT_SAMPLER_PARTITION, 1000, 4, 2, 9, 1, b);
    assert_memory_not_equal(a, b, sizeof a);
    memset(counts, 0, 1000 * sizeof *counts);
    for (int i = 0; i < 250; i++) counts[a[i]]++, counts[b[i]]--;
    for (int i = 0; i < 1000; i++) assert_int_equal(counts[i], 0);
    /* without shuffle: contiguous parts as the tutorial's identity order gives */
    rt_sampler s;
    init(&s, RT_SAMPLER_PARTITION, 10, 3, 1, 0, false, false);
    assert_int_equal(rt_sampler_len(&s), 3);
    assert_int_equal(s.indices[0], 3);
    assert_int_equal(s.indices[2], 5);
    rt_sampler_free(&s);
    free(counts);
}

/* A run stopped after `batches` batches of global batch `g` on w_old ranks and resumed on
 * w_new ranks, each new rank at position batches * g / w_new (as the trainer restores its
 * loader): the samples taken before the stop and after the resume, counted per index. */
static void count_resumed(rt_sampler_mode mode, int64_t n, int w_old, int w_new, int64_t g, int64_t batches,
                          int64_t epoch, int64_t *counts) {
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (int pass = 0; pass < 2; pass++) {
        int w = pass == 0 ? w_old : w_new;
        for (int r = 0; r < w; r++) {
            rt_sampler s;
            init(&s, mode, n, w, r, 5, true, false);
            int64_t pos = batches * (g / w), len = rt_sampler_len(&s);
            if (pos > len) pos = len;
            rt_sampler_state st = {epoch, pass == 0 ? 0 : pos};
            assert_rt_ok(rt_sampler_set_state(&s, st));
            int64_t idx, k = 0;
            while ((pass == 1 || k < pos) && rt_sampler_next(&s, &idx)) counts[idx]++, k++;
            rt_sampler_free(&s);
        }
    }
}

/* data.sampler with another world size on resume, mid-epoch: distributed (and eval)
 * continue the epoch exactly (the samples before the stop and after the resume are the
 * new world's epoch, each once); partition cannot (some samples twice, some never), and
 * rt_sampler_resumable says so, which the trainer turns into a refusal. */
static void test_world_change(void **state) {
    (void)state;
    static const int pairs[][2] = {{1, 2}, {2, 1}, {2, 3}, {3, 4}, {4, 2}, {3, 3}};
    static const int64_t sizes[] = {96, 100, 101};
    const int64_t g = 12;
    int64_t counts[101], want[101], len0;
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int64_t batches = 0; batches <= 3; batches++) {
                int w_old = pairs[pi][0], w_new = pairs[pi][1];
                int64_t n = sizes[si];
                rt_sampler_config c = {RT_SAMPLER_DISTRIBUTED, n, w_new, 0, 5, true, false};
                assert_true(rt_sampler_resumable(&c, w_old, batches * g));
                count_resumed(RT_SAMPLER_DISTRIBUTED, n, w_old, w_new, g, batches, 2, counts);
                count_epoch(RT_SAMPLER_DISTRIBUTED, n, w_new, 5, true, false, 2, want, &len0);
                for (int64_t i = 0; i < n; i++) assert_int_equal(counts[i], want[i]);

                c.mode = RT_SAMPLER_PARTITION;
                bool exact = w_old == w_new || batches == 0;
                assert_int_equal(rt_sampler_resumable(&c, w_old, batches * g), exact);
                count_resumed(RT_SAMPLER_PARTITION, n, w_old, w_new, g, batches, 2, counts);
                count_epoch(RT_SAMPLER_PARTITION, n, w_new, 5, true, false, 2, want, &len0);
                bool same = true;
                for (int64_t i = 0; i < n; i++) same &= counts[i] == want[i];
                assert_int_equal(same, exact); /* the refusal is needed exactly when it is given */
            }
    /* partition: once the old ranks took their whole parts the epoch is over: resumable */
    rt_sampler_config c = {RT_SAMPLER_PARTITION, 100, 3, 0, 5, true, false};
    assert_false(rt_sampler_resumable(&c, 2, 96));
    assert_true(rt_sampler_resumable(&c, 2, 100));
}

static void test_eval(void **state) {
    (void)state;
    int64_t *counts = malloc(1000 * sizeof *counts);
    for (int si = 0; si < NSIZES; si++)
        for (int w = 1; w <= 5; w++) {
            int64_t n = k_sizes[si], len0;
            int64_t total = count_epoch(RT_SAMPLER_EVAL, n, w, 3, true, false, 2, counts, &len0);
            assert_int_equal(total, n);
            for (int64_t i = 0; i < n; i++) assert_int_equal(counts[i], 1); /* exactly once */
        }
    free(counts);
}

static void test_bad_config(void **state) {
    (void)state;
    rt_sampler s;
    rt_sampler_config c = rt_sampler_config_default(10);
    c.world_size = 4, c.rank = 4;
    assert_int_equal(rt_sampler_init(&s, &c), RT_ERR_INVALID);
    assert_error_has("rank 4");
    c.world_size = 0, c.rank = 0;
    assert_int_equal(rt_sampler_init(&s, &c), RT_ERR_INVALID);
    assert_error_has("world_size 0");
    c = rt_sampler_config_default(0);
    assert_int_equal(rt_sampler_init(&s, &c), RT_ERR_INVALID);
    c = rt_sampler_config_default(10);
    assert_rt_ok(rt_sampler_init(&s, &c));
    assert_int_equal(rt_sampler_set_epoch(&s, -1), RT_ERR_INVALID);
    rt_sampler_free(&s);
    rt_sampler_mode m;
    assert_rt_ok(rt_sampler_mode_parse("partition", &m));
    assert_int_equal(m, RT_SAMPLER_PARTITION);
    assert_rt_ok(rt_sampler_mode_parse("EVAL", &m));
    assert_int_equal(m, RT_SAMPLER_EVAL);
    assert_int_equal(rt_sampler_mode_parse("random", &m), RT_ERR_INVALID);
    assert_error_has("unknown sampler mode 'random' (expected distributed | partition | eval)");
    for (int i = 0; i < RT_SAMPLER_MODE_COUNT_; i++) {
        assert_rt_ok(rt_sampler_mode_parse(rt_sampler_mode_name((rt_sampler_mode)i), &m));
        assert_int_equal(m, i);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributed_coverage),
        cmocka_unit_test(test_no_shuffle_layout),
        cmocka_unit_test(test_epochs_and_seeds),
        cmocka_unit_test(test_shuffled_padding),
        cmocka_unit_test(test_shuffle_uniform),
        cmocka_unit_test(test_state_roundtrip),
        cmocka_unit_test(test_partition),
        cmocka_unit_test(test_world_change),
        cmocka_unit_test(test_eval),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
