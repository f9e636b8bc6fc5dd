/* The loader: batch sizes per rank, normalisation against values computed here, the
 * crop/flip against a naive transform with exactly the parameters of (seed, epoch,
 * sample) (the same image under any world and batch size), determinism across runs,
 * resuming from a saved state (mid-epoch, in a fresh loader) gives the same batches,
 * and the evaluation loader covers every sample exactly once across ranks. */
#include "data_test_util.h"

#include "core/philox.h"
#include "data/internal/augment.h"
#include "data/loader.h"

#include <math.h>

enum { N = 37, C = 1, H = 6, W = 5 };

static rt_dataset g_ds, g_rgb;

static int setup(void **state) {
    (void)state;
    if (rt_dataset_alloc(&g_ds, "tiny", N, C, H, W, 10) != RT_OK) return -1;
    uint8_t *img = (uint8_t *)g_ds.images, *lab = (uint8_t *)g_ds.labels;
    for (int i = 0; i < N * C * H * W; i++) img[i] = (uint8_t)((i * 37 + 11) % 256);
    for (int i = 0; i < N; i++) lab[i] = (uint8_t)((i * 7) % 10);
    g_ds.mean[0] = 0.3f, g_ds.std[0] = 0.4f;
    g_ds.crop_pad = 2;
    if (rt_dataset_alloc(&g_rgb, "tiny-rgb", 20, 3, 8, 7, 10) != RT_OK) return -1;
    img = (uint8_t *)g_rgb.images;
    lab = (uint8_t *)g_rgb.labels;
    for (int i = 0; i < 20; i++) lab[i] = (uint8_t)(9 - i % 10);
    for (int i = 0; i < 20 * 3 * 8 * 7; i++) img[i] = (uint8_t)((i * 101 + 3) % 256);
    const float m[3] = {0.1f, 0.5f, 0.9f}, s[3] = {0.2f, 0.3f, 0.5f};
    memcpy(g_rgb.mean, m, sizeof m);
    memcpy(g_rgb.std, s, sizeof s);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rt_dataset_free(&g_ds);
    rt_dataset_free(&g_rgb);
    return 0;
}

static float norm(const rt_dataset *ds, int ch, uint8_t v) { return ((float)v / 255.0f - ds->mean[ch]) / ds->std[ch]; }

/* Naive reference: pad by `pad` zeros, take the window at (pad+dy, pad+dx), flip. */
static float ref_pixel(const rt_dataset *ds, int64_t s, int ch, int y, int x, int dy, int dx, bool flip) {
    int xx = flip ? ds->w - 1 - x : x;
    int sy = y + dy, sx = xx + dx;
    uint8_t v = 0;
    if (sy >= 0 && sy < ds->h && sx >= 0 && sx < ds->w)
        v = ds->images[(((size_t)s * ds->c + ch) * ds->h + sy) * ds->w + sx];
    return norm(ds, ch, v);
}

static bool image_matches(const rt_dataset *ds, int64_t s, const float *img, int dy, int dx, bool flip) {
    for (int ch = 0; ch < ds->c; ch++)
        for (int y = 0; y < ds->h; y++)
            for (int x = 0; x < ds->w; x++) {
                float want = ref_pixel(ds, s, ch, y, x, dy, dx, flip);
                if (fabsf(img[(ch * ds->h + y) * ds->w + x] - want) > 1e-6f) return false;
            }
    return true;
}

static rt_loader *make(const rt_dataset *ds, rt_sampler_mode mode, int world, int rank, int batch, bool augment,
                       uint64_t seed) {
    rt_loader_config c = rt_loader_config_default(ds);
    c.mode = mode;
    c.world_size = world;
    c.rank = rank;
    c.global_batch = batch;
    c.augment = augment;
    c.seed = seed;
    c.prefetch = 2;
    rt_loader *l = NULL;
    assert_rt_ok(rt_loader_create(&c, &l));
    return l;
}

static void test_eval_normalised_and_complete(void **state) {
    (void)state;
    for (int world = 1; world <= 4; world++) {
        int seen[N] = {0};
        for (int r = 0; r < world; r++) {
            rt_loader *l = make(&g_ds, RT_SAMPLER_EVAL, world, r, 4 * world, true, 1);
            assert_int_equal(rt_loader_batch_size(l), 4);
            int64_t mine = (N - r + world - 1) / world;
            assert_int_equal(rt_loader_samples_per_epoch(l), mine);
            assert_int_equal(rt_loader_batches_per_epoch(l), (mine + 3) / 4);
            assert_rt_ok(rt_loader_start_epoch(l, 0));
            rt_batch b;
            int64_t got = 0, nb = 0;
            for (;;) {
                assert_rt_ok(rt_loader_next(l, &b));
                if (b.size == 0) break;
                assert_int_equal(b.index, nb);
                assert_true(b.size == 4 || (b.size == mine % 4 && nb == rt_loader_batches_per_epoch(l) - 1));
                for (int i = 0; i < b.size; i++) {
                    int64_t s = b.samples[i];
                    assert_int_equal(s % world, r);
                    seen[s]++;
                    assert_int_equal(b.labels[i], (s * 7) % 10);
                    /* eval: no augmentation even when asked */
                    assert_true(image_matches(&g_ds, s, b.images + (size_t)i * C * H * W, 0, 0, false));
                }
                got += b.size;
                nb++;
            }
            assert_int_equal(got, mine);
            /* the end stays the end */
            assert_rt_ok(rt_loader_next(l, &b));
            assert_int_equal(b.size, 0);
            rt_loader_destroy(l);
        }
        for (int s = 0; s < N; s++) assert_int_equal(seen[s], 1); /* exactly once across ranks */
    }
}

/* One label type from the loader to the loss: int64, as PyTorch's cross_entropy takes
 * (docs/architecture.md). A change of rt_batch.labels' type fails to compile here. */
_Static_assert(_Generic(((rt_batch *)0)->labels, int64_t * : 1, default : 0), "rt_batch.labels must be int64_t *");

static void test_rgb_normalisation_int64_labels(void **state) {
    (void)state;
    rt_loader_config c = rt_loader_config_default(&g_rgb);
    c.mode = RT_SAMPLER_EVAL;
    c.global_batch = 8;
    rt_loader *l = NULL;
    assert_rt_ok(rt_loader_create(&c, &l));
    assert_rt_ok(rt_loader_start_epoch(l, 0));
    rt_batch b;
    assert_rt_ok(rt_loader_next(l, &b));
    assert_int_equal(b.size, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(b.labels[i], 9 - b.samples[i] % 10);
        for (int ch = 0; ch < 3; ch++)
            for (int k = 0; k < 8 * 7; k++) {
                uint8_t v = g_rgb.images[((size_t)b.samples[i] * 3 + ch) * 56 + k];
                assert_float_equal(b.images[((size_t)i * 3 + ch) * 56 + k], norm(&g_rgb, ch, v), 1e-6);
            }
    }
    rt_loader_destroy(l);
}

static void test_augmentation(void **state) {
    (void)state;
    rt_augment a = {.seed = 77, .crop_pad = 2, .hflip = true};
    int flips = 0, dx_seen[5] = {0}, dy_seen[5] = {0}, moved = 0;
    for (int64_t s = 0; s < 400; s++) {
        rt_augment_params p = rt_augment_params_at(&a, 3, s), q = rt_augment_params_at(&a, 3, s);
        assert_true(p.dx == q.dx && p.dy == q.dy && p.flip == q.flip); /* a pure function */
        assert_true(p.dx >= -2 && p.dx <= 2 && p.dy >= -2 && p.dy <= 2);
        flips += p.flip;
        dx_seen[p.dx + 2]++, dy_seen[p.dy + 2]++;
        rt_augment_params e = rt_augment_params_at(&a, 4, s);
        moved += e.dx != p.dx || e.dy != p.dy || e.flip != p.flip;
    }
    assert_true(flips > 150 && flips < 250);
    for (int k = 0; k < 5; k++) assert_true(dx_seen[k] > 40 && dy_seen[k] > 40);
    assert_true(moved > 300); /* another epoch, other choices */

    /* training batches: every image is the naive crop/flip of its sample with the
     * sample's parameters (and hflip on for this loader) */
    for (int hflip = 0; hflip <= 1; hflip++) {
        rt_loader_config c = rt_loader_config_default(&g_ds);
        c.global_batch = 8;
        c.seed = 5;
        c.hflip = hflip;
        rt_loader *l = NULL;
        assert_rt_ok(rt_loader_create(&c, &l));
        assert_rt_ok(rt_loader_start_epoch(l, 2));
        rt_batch b;
        int flipped = 0, shifted = 0;
        while (rt_loader_next(l, &b) == RT_OK && b.size > 0)
            for (int i = 0; i < b.size; i++) {
                const float *img = b.images + (size_t)i * C * H * W;
                int matches = 0;
                for (int dy = -2; dy <= 2; dy++)
                    for (int dx = -2; dx <= 2; dx++)
                        for (int f = 0; f <= hflip; f++)
                            if (image_matches(&g_ds, b.samples[i], img, dy, dx, f)) {
                                matches++;
                                flipped += f;
                                shifted += dx != 0 || dy != 0;
                            }
                assert_true(matches >= 1);
            }
        if (hflip)
            assert_true(flipped > 5);
        else
            assert_int_equal(flipped, 0);
        assert_true(shifted > 10);
        rt_loader_destroy(l);
    }
}

/* The loader's augmentation stream (loader.c): the run's seed xor "augment!". */
#define AUG_SEED_SALT 0x6175676d656e7421ull

/* Every image gets exactly the crop/flip of (seed, epoch, sample), not one of the 50
 * choices that would also fit, so the same (epoch, sample) is the same image whatever
 * the rank, the world size or the batch size. Parameters drawn from the position in
 * the batch would give every rank the same sequence of augmentations. */
static void test_augmentation_keyed_by_sample(void **state) {
    (void)state;
    static float seen[N][C * H * W];
    bool have[N] = {false};
    static const int cfgs[][2] = {{1, 8}, {2, 8}, {3, 6}, {4, 4}, {1, 5}, {2, 2}}; /* world, global batch */
    int checked = 0, compared = 0;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
        for (int rank = 0; rank < cfgs[k][0]; rank++) {
            rt_loader_config c = rt_loader_config_default(&g_ds);
            c.world_size = cfgs[k][0];
            c.rank = rank;
            c.global_batch = cfgs[k][1];
            c.seed = 5;
            c.hflip = 1;
            rt_loader *l = NULL;
            assert_rt_ok(rt_loader_create(&c, &l));
            assert_rt_ok(rt_loader_start_epoch(l, 2));
            rt_augment a = {.seed = 5 ^ AUG_SEED_SALT, .crop_pad = 2, .hflip = true};
            rt_batch b;
            while (rt_loader_next(l, &b) == RT_OK && b.size > 0)
                for (int i = 0; i < b.size; i++) {
                    int64_t s = b.samples[i];
                    const float *img = b.images + (size_t)i * C * H * W;
                    rt_augment_params p = rt_augment_params_at(&a, 2, s);
                    if (!image_matches(&g_ds, s, img, p.dy, p.dx, p.flip))
                        fail_msg("world %d rank %d batch %d: sample %lld is not its crop (%d, %d) flip %d", cfgs[k][0],
                                 rank, cfgs[k][1], (long long)s, p.dy, p.dx, p.flip);
                    checked++;
                    if (have[s]) {
                        assert_memory_equal(seen[s], img, sizeof seen[s]);
                        compared++;
                    } else {
                        memcpy(seen[s], img, sizeof seen[s]);
                        have[s] = true;
                    }
                }
            rt_loader_destroy(l);
        }
    assert_true(checked > 6 * N);
    assert_true(compared > 5 * N);
}

/* The documented draw (augment.h): for sample i, Philox words 0, 1, 2 of block
 * (seed, epoch, i) pick the top offset, the left offset and the flip, i.e. uniforms
 * 4i, 4i+1, 4i+2 of the stream (seed, epoch). Written out here so that a change of
 * words (which no statistics would notice) is a failing test, not a silent change of
 * every run's augmentation. */
static void test_augmentation_draw_is_documented(void **state) {
    (void)state;
    for (int pad = 1; pad <= 4; pad += 3) {
        rt_augment a = {.seed = 0x1234abcdull, .crop_pad = pad, .hflip = true};
        for (int64_t epoch = 0; epoch < 3; epoch++)
            for (int64_t i = 0; i < 200; i++) {
                rt_augment_params p = rt_augment_params_at(&a, epoch, i);
                const int span = 2 * pad + 1;
                int dy = (int)(rt_philox_uniform_at(a.seed, (uint64_t)epoch, 4 * (uint64_t)i) * (float)span) - pad;
                int dx = (int)(rt_philox_uniform_at(a.seed, (uint64_t)epoch, 4 * (uint64_t)i + 1) * (float)span) - pad;
                bool flip = rt_philox_uniform_at(a.seed, (uint64_t)epoch, 4 * (uint64_t)i + 2) < 0.5f;
                assert_int_equal(p.dy, dy);
                assert_int_equal(p.dx, dx);
                assert_int_equal(p.flip, flip);
            }
    }
    /* no flip asked: never flipped, offsets unchanged */
    rt_augment a = {.seed = 0x1234abcdull, .crop_pad = 2, .hflip = false},
               b = {.seed = 0x1234abcdull, .crop_pad = 2, .hflip = true};
    for (int64_t i = 0; i < 50; i++) {
        rt_augment_params p = rt_augment_params_at(&a, 1, i), q = rt_augment_params_at(&b, 1, i);
        assert_false(p.flip);
        assert_int_equal(p.dy, q.dy);
        assert_int_equal(p.dx, q.dx);
    }
}

typedef struct record {
    int64_t count;
    int64_t samples[64][16];
    float images[64][16 * C * H * W];
    int64_t labels[64][16];
    int sizes[64];
} record;

/* Take up to `max` batches of the current epoch into r. */
static void take(rt_loader *l, record *r, int max) {
    rt_batch b;
    for (int k = 0; k < max; k++) {
        assert_rt_ok(rt_loader_next(l, &b));
        if (b.size == 0) break;
        int64_t j = r->count++;
        r->sizes[j] = b.size;
        memcpy(r->samples[j], b.samples, (size_t)b.size * sizeof(int64_t));
        memcpy(r->labels[j], b.labels, (size_t)b.size * sizeof(int64_t));
        memcpy(r->images[j], b.images, (size_t)b.size * C * H * W * sizeof(float));
    }
}

static void assert_records_equal(const record *a, int64_t from, const record *b) {
    assert_int_equal(a->count - from, b->count);
    for (int64_t j = 0; j < b->count; j++) {
        assert_int_equal(a->sizes[from + j], b->sizes[j]);
        assert_memory_equal(a->samples[from + j], b->samples[j], (size_t)b->sizes[j] * sizeof(int64_t));
        assert_memory_equal(a->labels[from + j], b->labels[j], (size_t)b->sizes[j] * sizeof(int64_t));
        assert_memory_equal(a->images[from + j], b->images[j], (size_t)b->sizes[j] * C * H * W * sizeof(float));
    }
}

static void test_determinism_and_resume(void **state) {
    (void)state;
    record *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *c = calloc(1, sizeof *c);
    for (int world = 1; world <= 3; world++)
        for (int r = 0; r < world; r++) {
            int batch = 3 * world;
            /* two runs of two epochs agree batch for batch */
            rt_loader *l1 = make(&g_ds, RT_SAMPLER_DISTRIBUTED, world, r, batch, true, 9);
            rt_loader *l2 = make(&g_ds, RT_SAMPLER_DISTRIBUTED, world, r, batch, true, 9);
            int64_t per = (N + world - 1) / world;
            assert_int_equal(rt_loader_samples_per_epoch(l1), per);
            memset(a, 0, sizeof *a), memset(b, 0, sizeof *b);
            for (int e = 0; e < 2; e++) {
                assert_rt_ok(rt_loader_start_epoch(l1, e));
                assert_rt_ok(rt_loader_start_epoch(l2, e));
                take(l1, a, 64);
                take(l2, b, 64);
            }
            assert_int_equal(a->count, 2 * ((per + 2) / 3));
            assert_records_equal(a, 0, b);
            /* the two epochs differ */
            int64_t half = a->count / 2;
            assert_memory_not_equal(a->samples[0], a->samples[half], 3 * sizeof(int64_t));

            /* resume: run epoch 1 partway, save, continue; a fresh loader restored from the
             * state yields exactly the remaining batches */
            memset(a, 0, sizeof *a), memset(b, 0, sizeof *b), memset(c, 0, sizeof *c);
            assert_rt_ok(rt_loader_start_epoch(l1, 1));
            take(l1, a, 2);
            rt_loader_state st = rt_loader_get_state(l1);
            assert_int_equal(st.epoch, 1);
            assert_int_equal(st.position, 2 * 3);
            take(l1, a, 64);
            rt_loader *l3 = make(&g_ds, RT_SAMPLER_DISTRIBUTED, world, r, batch, true, 9);
            assert_rt_ok(rt_loader_restore(l3, st));
            take(l3, b, 64);
            assert_records_equal(a, 2, b);
            /* restoring the same loader mid-way (the worker is running ahead) works too */
            assert_rt_ok(rt_loader_restore(l2, st));
            take(l2, c, 64);
            assert_records_equal(a, 2, c);
            /* a position off the batch grid is rejected */
            st.position = 4;
            assert_int_equal(rt_loader_restore(l3, st), RT_ERR_INVALID);
            assert_error_has("position 4");
            /* another seed, other batches */
            rt_loader *l4 = make(&g_ds, RT_SAMPLER_DISTRIBUTED, world, r, batch, true, 10);
            memset(c, 0, sizeof *c);
            assert_rt_ok(rt_loader_start_epoch(l4, 1));
            take(l4, c, 64);
            assert_memory_not_equal(a->images[0], c->images[0], 3 * C * H * W * sizeof(float));
            rt_loader_destroy(l1);
            rt_loader_destroy(l2);
            rt_loader_destroy(l3);
            rt_loader_destroy(l4);
        }
    free(a);
    free(b);
    free(c);
}

static void test_drop_last_batch_and_errors(void **state) {
    (void)state;
    rt_loader_config c = rt_loader_config_default(&g_ds);
    c.global_batch = 8;
    c.drop_last_batch = true;
    rt_loader *l = NULL;
    assert_rt_ok(rt_loader_create(&c, &l));
    assert_int_equal(rt_loader_batches_per_epoch(l), N / 8);
    assert_int_equal(rt_loader_samples_per_epoch(l), N / 8 * 8);
    rt_batch b;
    assert_int_equal(rt_loader_next(l, &b), RT_ERR_INVALID); /* no epoch started */
    assert_error_has("rt_loader_start_epoch");
    assert_rt_ok(rt_loader_start_epoch(l, 0));
    int nb = 0;
    while (rt_loader_next(l, &b) == RT_OK && b.size > 0) {
        assert_int_equal(b.size, 8);
        nb++;
    }
    assert_int_equal(nb, N / 8);
    rt_loader_state st = rt_loader_get_state(l);
    assert_int_equal(st.position, N / 8 * 8);
    assert_rt_ok(rt_loader_restore(l, st)); /* the end of an epoch is a valid state */
    assert_rt_ok(rt_loader_next(l, &b));
    assert_int_equal(b.size, 0);
    rt_loader_destroy(l);

    c.drop_last_batch = false;
    c.world_size = 3;
    c.global_batch = 8;
    assert_int_equal(rt_loader_create(&c, &l), RT_ERR_INVALID);
    assert_error_has("not a positive multiple of world_size 3");
    c.world_size = 2, c.rank = 2;
    assert_int_equal(rt_loader_create(&c, &l), RT_ERR_INVALID);
    assert_error_has("rank 2");
    c.rank = 0, c.prefetch = 1;
    assert_int_equal(rt_loader_create(&c, &l), RT_ERR_INVALID);
    assert_error_has("prefetch 1");
    c.prefetch = 4, c.crop_pad = 7;
    assert_int_equal(rt_loader_create(&c, &l), RT_ERR_INVALID);
    assert_error_has("crop padding 7");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_normalised_and_complete),
        cmocka_unit_test(test_rgb_normalisation_int64_labels),
        cmocka_unit_test(test_augmentation),
        cmocka_unit_test(test_augmentation_keyed_by_sample),
        cmocka_unit_test(test_augmentation_draw_is_documented),
        cmocka_unit_test(test_determinism_and_resume),
        cmocka_unit_test(test_drop_last_batch_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
