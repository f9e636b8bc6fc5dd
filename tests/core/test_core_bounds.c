/* Core edge cases that statistics and small inputs cannot see (found by `make mutants`,
 * docs/testing.md):
 * - rt_rng_below is Lemire's nearly divisionless method: checked draw by draw against
 *   that algorithm written out here over a twin generator's words, with bounds where
 *   the rejection step runs often (3 * 2^30: a quarter of the words) and rarely. A
 *   skipped rejection biases the draws by about bound / 2^32, far below what counting
 *   could detect, but it changes the sequence.
 * - rt_tensor_init refuses a shape whose element count overflows, whatever the order in
 *   which the large dimensions come. */
#include "test_util.h"

#include "core/rng.h"
#include "core/tensor.h"

#include <stdint.h>
#include <string.h>

/* Lemire, "Fast Random Integer Generation in an Interval" (2019), algorithm 5, 32-bit */
static uint64_t lemire(rt_rng *r, uint32_t b) {
    uint64_t m = (uint64_t)rt_rng_u32(r) * b;
    uint32_t l = (uint32_t)m;
    if (l < b) {
        uint32_t t = (uint32_t)(0u - b) % b;
        while (l < t) {
            m = (uint64_t)rt_rng_u32(r) * b;
            l = (uint32_t)m;
        }
    }
    return m >> 32;
}

static void test_rng_below_is_lemire(void **state) {
    (void)state;
    static const uint32_t bounds[] = {2, 3, 7, 10, 1000, 3u << 30, 0xFFFFFFFFu, (1u << 31) + 1};
    for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
        rt_rng a, b;
        rt_rng_init(&a, 99 + k, 5);
        rt_rng_init(&b, 99 + k, 5);
        for (int i = 0; i < 20000; i++) {
            uint64_t x = rt_rng_below(&a, bounds[k]), y = lemire(&b, bounds[k]);
            if (x != y)
                fail_msg("bound %u, draw %d: %llu, Lemire's method gives %llu", bounds[k], i, (unsigned long long)x,
                         (unsigned long long)y);
            assert_true(x < bounds[k]);
        }
    }
    /* 64-bit bounds: rejection sampling over two words, below the bound */
    rt_rng a;
    rt_rng_init(&a, 7, 1);
    for (int i = 0; i < 1000; i++) assert_true(rt_rng_below(&a, (3ull << 40) + 1) < (3ull << 40) + 1);
    assert_int_equal(rt_rng_below(&a, 1), 0);
    assert_int_equal(rt_rng_below(&a, 0), 0);
}

static void test_tensor_overflow(void **state) {
    (void)state;
    rt_tensor t;
    const int64_t big[][3] = {
        {1ll << 40, 1ll << 40, 1}, {1, 1ll << 40, 1ll << 40}, {1ll << 21, 1ll << 21, 1ll << 21}, {1ll << 62, 2, 1}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rt_tensor_init(&t, RT_F32, 3, big[i], rt_device_cpu()), RT_ERR_INVALID);
        assert_non_null(strstr(rt_error_message(), "overflows"));
    }
    /* the largest count that fits (INT64_MAX / 8 elements of up to 8 bytes) is accepted */
    const int64_t ok[3] = {1ll << 20, 1ll << 20, (1ll << 19) - 1};
    assert_rt_ok(rt_tensor_init(&t, RT_F32, 3, ok, rt_device_cpu()));
    const int64_t zero[3] = {0, 1ll << 62, 1ll << 62}; /* an empty tensor never overflows */
    assert_rt_ok(rt_tensor_init(&t, RT_F32, 3, zero, rt_device_cpu()));
    assert_int_equal(rt_tensor_numel(&t), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_below_is_lemire),
        cmocka_unit_test(test_tensor_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
