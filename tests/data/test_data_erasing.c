/* Random erasing (torchvision.transforms.RandomErasing after Normalize): our draws are
 * Philox's, not torch's, so the test checks the semantics instead of the bits:
 *  - every rectangle is one RandomErasing can produce: h = round(sqrt(A*r)),
 *    w = round(sqrt(A/r)) for some A in H*W*scale and r in ratio, h < H, w < W, inside
 *    the image;
 *  - the rate of erased images is p within 5 binomial standard deviations (a setting
 *    where every first attempt fits), and against torchvision's own RandomErasing
 *    (tests/data/torch_erasing.py, 20000 images each) the rate, the mean area fraction,
 *    log aspect ratio and centre agree within 5 standard errors, for torchvision's
 *    defaults and for a narrower setting on 3 channels;
 *  - values: a number is written into every channel of the rectangle and nothing else
 *    changes; "random" writes N(0, 1) values (mean and variance within 5 standard errors
 *    over many pixels), different per channel;
 *  - the draws depend on (seed, epoch, sample) only: the loader with 1 and 2 ranks
 *    (same global batch) gives every sample the same image, and a loader restored in
 *    mid-epoch continues with the same batches.
 * The torchvision comparison is skipped when /usr/bin/python3 has no torch. */
#include "data_test_util.h"

#include "data/internal/augment.h"
#include "data/loader.h"

#include <math.h>
#include <sys/wait.h>

typedef struct stats {
    double n, rate, mean[4], var[4];
} stats;

static rt_augment make_aug(double p, double s0, double s1, double r0, double r1, int c, int h, int w) {
    rt_augment a = {.seed = 0x5eed, .erase_p = p, .c = c, .h = h, .w = w};
    a.erase_scale[0] = s0, a.erase_scale[1] = s1, a.erase_ratio[0] = r0, a.erase_ratio[1] = r1;
    return a;
}

/* a rectangle RandomErasing can draw: sqrt(A*r) in [h-1/2, h+1/2], sqrt(A/r) in [w-1/2, w+1/2] */
static void check_rect(const rt_augment *a, const rt_augment_params *p) {
    assert_true(p->eh >= 0 && p->ew >= 0 && p->eh < a->h && p->ew < a->w);
    assert_true(p->ey >= 0 && p->ey + p->eh <= a->h && p->ex >= 0 && p->ex + p->ew <= a->w);
    double area = (double)a->h * a->w;
    double amin = fmax(p->eh - 0.5, 0) * fmax(p->ew - 0.5, 0), amax = (p->eh + 0.5) * (p->ew + 0.5);
    assert_true(amin <= a->erase_scale[1] * area + 1e-9 && amax >= a->erase_scale[0] * area - 1e-9);
    if (p->ew > 0 && p->eh > 0) {
        double rmin = (p->eh - 0.5) / (p->ew + 0.5), rmax = (p->eh + 0.5) / (p->ew - 0.5);
        assert_true(rmin <= a->erase_ratio[1] + 1e-9 && rmax >= a->erase_ratio[0] - 1e-9);
    }
}

static stats our_stats(const rt_augment *a, int n) {
    stats s = {0};
    double sum[4] = {0}, sq[4] = {0};
    int erased = 0;
    for (int i = 0; i < n; i++) {
        rt_augment_params p = rt_augment_params_at(a, 3, i);
        if (!p.erase || p.eh * p.ew == 0) continue; /* torchvision's empty rectangle changes nothing */
        check_rect(a, &p);
        erased++;
        double v[4] = {(double)p.eh * p.ew / ((double)a->h * a->w), log((double)p.eh / p.ew),
                       (p.ey + p.eh / 2.0) / a->h, (p.ex + p.ew / 2.0) / a->w};
        for (int k = 0; k < 4; k++) sum[k] += v[k], sq[k] += v[k] * v[k];
    }
    s.n = erased;
    s.rate = (double)erased / n;
    for (int k = 0; k < 4; k++) {
        s.mean[k] = sum[k] / erased;
        s.var[k] = (sq[k] - erased * s.mean[k] * s.mean[k]) / (erased - 1);
    }
    return s;
}

static void test_rate_and_rectangles(void **state) {
    (void)state;
    /* every first attempt fits (h <= round(sqrt(0.2*784*2)) = 18 < 28): the rate is p */
    const int n = 40000;
    rt_augment a = make_aug(0.3, 0.02, 0.2, 0.5, 2.0, 1, 28, 28);
    stats s = our_stats(&a, n);
    double sd = sqrt(0.3 * 0.7 / n);
    printf("p 0.3: erased %.4f of %d images (binomial sd %.4f)\n", s.rate, n, sd);
    assert_true(fabs(s.rate - 0.3) < 5 * sd);
    /* p = 0 never, p = 1 always (when a rectangle fits) */
    a.erase_p = 1.0;
    assert_true(our_stats(&a, 2000).rate == 1.0);
    a.erase_p = 0.0;
    for (int i = 0; i < 100; i++) assert_false(rt_augment_params_at(&a, 0, i).erase);
    /* a scale that never fits: no attempt succeeds, the image is left alone */
    a = make_aug(1.0, 0.99, 1.0, 1.0, 1.0, 1, 10, 10);
    for (int i = 0; i < 100; i++) assert_false(rt_augment_params_at(&a, 0, i).erase);
}

static int torch_stats(int n, const rt_augment *a, stats *out) {
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tests/data/torch_erasing.py %d %.17g %.17g %.17g %.17g %.17g %d %d %d",
             src ? src : ".", n, a->erase_p, a->erase_scale[0], a->erase_scale[1], a->erase_ratio[0], a->erase_ratio[1],
             a->c, a->h, a->w);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    int got = fscanf(f, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &out->n, &out->mean[0], &out->var[0], &out->mean[1],
                     &out->var[1], &out->mean[2], &out->var[2], &out->mean[3], &out->var[3]);
    int rc = pclose(f);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) return 3;
    out->rate = out->n / n;
    return got == 9 && rc == 0 ? 0 : -1;
}

static void test_against_torchvision(void **state) {
    (void)state;
    const int n = 20000;
    rt_augment cases[2] = {make_aug(0.5, 0.02, 0.33, 0.3, 3.3, 1, 28, 28), /* torchvision's defaults */
                           make_aug(0.8, 0.1, 0.4, 0.5, 1.5, 3, 32, 24)};
    static const char *names[4] = {"area", "log aspect", "centre y", "centre x"};
    for (int c = 0; c < 2; c++) {
        stats t, o = our_stats(&cases[c], n);
        int rc = torch_stats(n, &cases[c], &t);
        if (rc == 3) skip();
        assert_int_equal(rc, 0);
        double sd = sqrt(o.rate * (1 - o.rate) / n + t.rate * (1 - t.rate) / n);
        printf("case %d: erased %.4f (torchvision %.4f, 5 sd %.4f)\n", c, o.rate, t.rate, 5 * sd);
        assert_true(fabs(o.rate - t.rate) < 5 * sd);
        for (int k = 0; k < 4; k++) {
            double se = sqrt(o.var[k] / o.n + t.var[k] / t.n);
            printf("  %-10s mean %.4f sd %.4f (torchvision %.4f sd %.4f; 5 se %.4f)\n", names[k], o.mean[k],
                   sqrt(o.var[k]), t.mean[k], sqrt(t.var[k]), 5 * se);
            assert_true(fabs(o.mean[k] - t.mean[k]) < 5 * se);
        }
    }
}

static void test_values(void **state) {
    (void)state;
    enum { C = 3, H = 16, W = 12 };
    uint8_t src[C * H * W];
    for (int i = 0; i < C * H * W; i++) src[i] = (uint8_t)(i * 29 % 251);
    float mean[C] = {0.2f, 0.4f, 0.6f}, std[C] = {0.3f, 0.2f, 0.25f}, lut[C * 256];
    rt_normalize_lut(mean, std, C, lut);
    float plain[C * H * W], img[C * H * W];
    rt_augment a = make_aug(1.0, 0.1, 0.3, 0.3, 3.3, C, H, W);
    a.erase_value = 0.75f;
    double sum = 0, sq = 0, cross = 0;
    long count = 0;
    for (int s = 0; s < 400; s++) {
        a.erase_random = false;
        rt_augment_params p = rt_augment_params_at(&a, 1, s);
        assert_true(p.erase);
        rt_augment_image(src, C, H, W, lut, NULL, plain);
        rt_augment_image(src, C, H, W, lut, &p, img);
        for (int ch = 0; ch < C; ch++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    size_t k = ((size_t)ch * H + y) * W + x;
                    bool in = y >= p.ey && y < p.ey + p.eh && x >= p.ex && x < p.ex + p.ew;
                    assert_true(in ? img[k] == 0.75f : img[k] == plain[k]);
                }
        a.erase_random = true;
        p = rt_augment_params_at(&a, 1, s);
        rt_augment_image(src, C, H, W, lut, &p, img);
        float again[C * H * W];
        rt_augment_image(src, C, H, W, lut, &p, again);
        assert_memory_equal(img, again, sizeof img); /* a pure function of the parameters */
        for (int y = p.ey; y < p.ey + p.eh; y++)
            for (int x = p.ex; x < p.ex + p.ew; x++) {
                float v0 = img[(size_t)y * W + x], v1 = img[((size_t)H + y) * W + x];
                for (int ch = 0; ch < C; ch++) {
                    float v = img[((size_t)ch * H + y) * W + x];
                    sum += v, sq += (double)v * v, count++;
                }
                cross += (double)v0 * v1;
            }
        for (int y = 0; y < H; y++) /* outside the rectangle: untouched */
            for (int x = 0; x < W; x++)
                if (!(y >= p.ey && y < p.ey + p.eh && x >= p.ex && x < p.ex + p.ew))
                    assert_true(img[(size_t)y * W + x] == plain[(size_t)y * W + x]);
    }
    double m = sum / count, v = sq / count - m * m, c01 = cross / (count / C);
    printf("random values: %ld pixels, mean %.4f, variance %.4f, channel 0 x 1 mean %.4f\n", count, m, v, c01);
    assert_true(fabs(m) < 5 / sqrt((double)count));
    assert_true(fabs(v - 1) < 5 * sqrt(2.0 / count));
    assert_true(fabs(c01) < 5 / sqrt((double)count / C)); /* independent channels */
}

/* the loader's image of each sample: the same with 1 and 2 ranks, and after a restore */
static void test_world_size_and_restore(void **state) {
    (void)state;
    enum { N = 64, H = 12, W = 10 };
    rt_dataset ds;
    assert_rt_ok(rt_dataset_alloc(&ds, "tiny", N, 1, H, W, 10));
    uint8_t *img = (uint8_t *)ds.images;
    for (int i = 0; i < N * H * W; i++) img[i] = (uint8_t)((i * 37 + 11) % 256);
    for (int i = 0; i < N; i++) ((uint8_t *)ds.labels)[i] = (uint8_t)(i % 10);
    ds.mean[0] = 0.3f, ds.std[0] = 0.4f, ds.crop_pad = 2, ds.hflip_suits = true;
    size_t elems = (size_t)H * W;
    float *by_sample[2];
    for (int world = 1; world <= 2; world++) {
        float *seen = calloc((size_t)N * elems, sizeof(float));
        for (int rank = 0; rank < world; rank++) {
            rt_loader_config c = rt_loader_config_default(&ds);
            c.world_size = world, c.rank = rank, c.global_batch = 8, c.seed = 9;
            c.erase_p = 0.7, c.erase_random = true;
            rt_loader *l;
            assert_rt_ok(rt_loader_create(&c, &l));
            assert_rt_ok(rt_loader_start_epoch(l, 2));
            rt_batch b;
            for (;;) {
                assert_rt_ok(rt_loader_next(l, &b));
                if (b.size == 0) break;
                for (int i = 0; i < b.size; i++)
                    memcpy(seen + (size_t)b.samples[i] * elems, b.images + (size_t)i * elems, elems * sizeof(float));
            }
            rt_loader_destroy(l);
        }
        by_sample[world - 1] = seen;
    }
    assert_memory_equal(by_sample[0], by_sample[1], (size_t)N * elems * sizeof(float));
    /* restore in mid-epoch: the next batches equal the uninterrupted loader's */
    rt_loader_config c = rt_loader_config_default(&ds);
    c.global_batch = 8, c.seed = 9, c.erase_p = 0.7, c.erase_random = true;
    rt_loader *l1, *l2;
    assert_rt_ok(rt_loader_create(&c, &l1));
    assert_rt_ok(rt_loader_create(&c, &l2));
    assert_rt_ok(rt_loader_start_epoch(l1, 1));
    rt_batch b1, b2;
    for (int i = 0; i < 3; i++) assert_rt_ok(rt_loader_next(l1, &b1));
    assert_rt_ok(rt_loader_restore(l2, rt_loader_get_state(l1)));
    for (int i = 0; i < 3; i++) {
        assert_rt_ok(rt_loader_next(l1, &b1));
        assert_rt_ok(rt_loader_next(l2, &b2));
        assert_int_equal(b1.size, b2.size);
        assert_memory_equal(b1.images, b2.images, (size_t)b1.size * elems * sizeof(float));
    }
    rt_loader_destroy(l1);
    rt_loader_destroy(l2);
    /* bad settings are refused, naming the key */
    c.erase_scale[0] = 0.5, c.erase_scale[1] = 0.1;
    assert_int_equal(rt_loader_create(&c, &l1), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "data.erasing_scale"));
    free(by_sample[0]);
    free(by_sample[1]);
    rt_dataset_free(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rate_and_rectangles),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_world_size_and_restore),
        cmocka_unit_test(test_against_torchvision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
