/* Philox RNG: known-answer vectors, reproducibility, split draws, moments. */
#include "test_util.h"

#include "core/philox.h"
#include "core/rng.h"

#include <math.h>
#include <string.h>

/* Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors). */
static void test_known_answers(void **state) {
    (void)state;
    rt_u32x4 a = rt_philox4x32_10(0, 0, 0, 0, 0, 0);
    const uint32_t ea[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
    rt_u32x4 b = rt_philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
    const uint32_t eb[4] = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
    rt_u32x4 c = rt_philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
    const uint32_t ec[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(a.v[i], ea[i]);
        assert_int_equal(b.v[i], eb[i]);
        assert_int_equal(c.v[i], ec[i]);
    }
}

static void test_reproducible_and_split(void **state) {
    (void)state;
    enum { N = 1003 };
    static float x[N], y[N], z[N];
    rt_rng r1, r2, r3;
    rt_rng_init(&r1, 1234, 7);
    rt_rng_init(&r2, 1234, 7);
    rt_rng_uniform(&r1, x, N);
    /* the same stream drawn in odd-sized pieces (crossing block boundaries) */
    size_t pieces[] = {1, 2, 5, 3, 992};
    size_t at = 0;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        rt_rng_uniform(&r2, y + at, pieces[i]);
        at += pieces[i];
    }
    assert_int_equal(at, N);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(r1.offset, N);
    /* another subsequence and another seed give other numbers */
    rt_rng_init(&r3, 1234, 8);
    rt_rng_uniform(&r3, z, N);
    assert_memory_not_equal(x, z, sizeof x);
    rt_rng_init(&r3, 1235, 7);
    rt_rng_uniform(&r3, z, N);
    assert_memory_not_equal(x, z, sizeof x);
    /* normals: same split property, and element-wise equal to the _at function */
    rt_rng_init(&r1, 99, 0);
    rt_rng_normal(&r1, x, N, 0.0f, 1.0f);
    rt_rng_init(&r2, 99, 0);
    rt_rng_normal(&r2, y, 500, 0.0f, 1.0f);
    rt_rng_normal(&r2, y + 500, N - 500, 0.0f, 1.0f);
    assert_memory_equal(x, y, sizeof x);
    for (int i = 0; i < N; i++) assert_true(x[i] == rt_philox_normal_at(99, 0, (uint64_t)i));
}

static void test_uniform_moments(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    rt_rng r;
    rt_rng_init(&r, 42, 0);
    rt_rng_uniform(&r, x, N);
    double sum = 0, sq = 0;
    int bins[10] = {0};
    for (int i = 0; i < N; i++) {
        assert_true(x[i] >= 0.0f && x[i] < 1.0f);
        sum += x[i];
        sq += (double)x[i] * x[i];
        bins[(int)(x[i] * 10)]++;
    }
    double mean = sum / N, var = sq / N - mean * mean;
    /* 6 standard errors: false alarm probability ~ 1e-9 */
    assert_true(fabs(mean - 0.5) < 6 * sqrt(1.0 / 12 / N));
    assert_true(fabs(var - 1.0 / 12) < 6 * sqrt(1.0 / 180 / N)); /* var of (u-1/2)^2 is 1/180 */
    /* chi-square over 10 bins, 9 dof: 99.99th percentile is ~33.7 */
    double chi = 0, e = N / 10.0;
    for (int b = 0; b < 10; b++) chi += (bins[b] - e) * (bins[b] - e) / e;
    assert_true(chi < 33.7);
    /* range */
    rt_rng_uniform_range(&r, x, 1000, -2.0f, 3.0f);
    for (int i = 0; i < 1000; i++) assert_true(x[i] >= -2.0f && x[i] < 3.0f);
    free(x);
}

static void test_normal_moments(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    rt_rng r;
    rt_rng_init(&r, 7, 3);
    rt_rng_normal(&r, x, N, 2.0f, 0.5f);
    double sum = 0, sq = 0, m4 = 0;
    for (int i = 0; i < N; i++) sum += x[i];
    double mean = sum / N;
    for (int i = 0; i < N; i++) {
        double d = x[i] - mean;
        sq += d * d;
        m4 += d * d * d * d;
    }
    double var = sq / N;
    assert_true(fabs(mean - 2.0) < 6 * 0.5 / sqrt(N));
    /* var of the sample variance of a normal: 2 sigma^4 / N */
    assert_true(fabs(var - 0.25) < 6 * sqrt(2.0 * 0.0625 / N));
    /* kurtosis 3 for a normal (std error ~ sqrt(24/N)) */
    double kurt = m4 / N / (var * var);
    assert_true(fabs(kurt - 3.0) < 6 * sqrt(24.0 / N));
    free(x);
}

static void test_below(void **state) {
    (void)state;
    rt_rng r;
    rt_rng_init(&r, 5, 0);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint64_t v = rt_rng_below(&r, 7);
        assert_true(v < 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++) assert_true(abs(counts[i] - 10000) < 6 * 93); /* sd ~ 92.6 */
    assert_int_equal(rt_rng_below(&r, 1), 0);
    uint64_t big = (1ull << 40) + 3;
    for (int i = 0; i < 100; i++) assert_true(rt_rng_below(&r, big) < big);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers), cmocka_unit_test(test_reproducible_and_split),
        cmocka_unit_test(test_uniform_moments), cmocka_unit_test(test_normal_moments), cmocka_unit_test(test_below),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
