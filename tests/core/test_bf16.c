/* core/bf16.h: fp32 -> bf16 rounds to nearest, ties to even, overflows to infinity, keeps
 * NaN a NaN; bf16 -> fp32 is exact. Checked on the boundary cases and on 2^22 bit
 * patterns against an independent rule in double precision: of the two bf16 neighbours
 * of x (truncation and the next one up in magnitude), the nearer, the even one on a tie. */
#include "test_util.h"

#include "core/bf16.h"
#include "core/tensor.h"

#include <math.h>

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the reference: independent of the bit trick under test */
static uint16_t ref_round(float x) {
    uint32_t u = bits(x);
    if (isnan(x)) return 0; /* (NaN checked separately) */
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dx = x, dlo = rt_bf16_to_f32(lo),
           dhi = (hi & 0x7f80) == 0x7f80 && (lo & 0x7f80) == 0x7f00
                     ? copysign(ldexp(1.0, 128), dx) /* one past the top */
                     : (double)rt_bf16_to_f32(hi);
    double elo = fabs(dx - dlo), ehi = fabs(dhi - dx);
    if (elo < ehi) return lo;
    if (ehi < elo) return hi;
    return (lo & 1) ? hi : lo;
}

static void test_cases(void **state) {
    (void)state;
    assert_int_equal(rt_bf16_from_f32(1.0f), 0x3f80);
    assert_int_equal(rt_bf16_from_f32(1.0f + ldexpf(1, -8)), 0x3f80);                  /* tie: to even (down) */
    assert_int_equal(rt_bf16_from_f32(1.0f + 3 * ldexpf(1, -8)), 0x3f82);              /* tie: to even (up) */
    assert_int_equal(rt_bf16_from_f32(1.0f + ldexpf(1, -8) + ldexpf(1, -20)), 0x3f81); /* above the tie */
    assert_int_equal(rt_bf16_from_f32(-2.0f), 0xc000);
    assert_int_equal(rt_bf16_from_f32(INFINITY), 0x7f80);
    assert_int_equal(rt_bf16_from_f32(-INFINITY), 0xff80);
    assert_int_equal(rt_bf16_from_f32(from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX overflows to inf */
    assert_int_equal(rt_bf16_from_f32(from_bits(0x00000001)), 0x0000); /* smallest subnormal: to 0 */
    assert_true(isnan(rt_bf16_to_f32(rt_bf16_from_f32(NAN))));
    assert_true(isnan(rt_bf16_to_f32(rt_bf16_from_f32(from_bits(0x7f800001))))); /* a NaN that would round to inf */
    assert_true(isnan(rt_bf16_to_f32(rt_bf16_from_f32(from_bits(0xffffffff)))));
    assert_int_equal(bits(rt_bf16_round(3.140625f)), bits(3.140625f)); /* already bf16 */
    assert_int_equal(rt_dtype_size(RT_BF16), 2);
    rt_dtype t;
    assert_rt_ok(rt_dtype_parse("bfloat16", &t));
    assert_int_equal(t, RT_BF16);
}

static void test_against_reference(void **state) {
    (void)state;
    size_t bad = 0;
    for (uint64_t k = 0; k < ((uint64_t)1 << 22); k++) {
        uint32_t u = (uint32_t)(k * 1023u + (k << 10)) ^ (uint32_t)(k * 2654435761u); /* spread over all patterns */
        float x = from_bits(u);
        if (isnan(x)) continue;
        uint16_t got = rt_bf16_from_f32(x), want = ref_round(x);
        if (got != want && bad++ < 5) print_message("%08x: got %04x want %04x\n", u, got, want);
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cases), cmocka_unit_test(test_against_reference)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
