/* Tensor descriptors and arenas. */
#include "test_util.h"

#include "core/tensor.h"

#include <string.h>

static void test_descriptor(void **state) {
    (void)state;
    rt_tensor t;
    assert_rt_ok(rt_tensor_init(&t, RT_F32, 4, (int64_t[]){64, 3, 7, 7}, rt_device_cpu()));
    assert_int_equal(rt_tensor_numel(&t), 64 * 3 * 7 * 7);
    assert_int_equal(rt_tensor_nbytes(&t), 64 * 3 * 7 * 7 * 4);
    char buf[64];
    assert_string_equal(rt_tensor_str(&t, buf, sizeof buf), "f32[64, 3, 7, 7]");
    rt_tensor s;
    assert_rt_ok(rt_tensor_init(&s, RT_I64, 0, NULL, rt_device_cpu()));
    assert_int_equal(rt_tensor_numel(&s), 1);
    assert_int_equal(rt_tensor_nbytes(&s), 8);
    assert_string_equal(rt_tensor_str(&s, buf, sizeof buf), "i64[]");
    assert_false(rt_tensor_same_shape(&t, &s));
    rt_tensor u = t;
    assert_true(rt_tensor_same_shape(&t, &u));
    /* bad descriptors */
    assert_int_equal(rt_tensor_init(&t, RT_F32, 9, (int64_t[9]){1}, rt_device_cpu()), RT_ERR_INVALID);
    assert_int_equal(rt_tensor_init(&t, RT_F32, 2, (int64_t[]){3, -1}, rt_device_cpu()), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "dim 1 is negative"));
    assert_int_equal(rt_tensor_init(&t, RT_F32, 3, (int64_t[]){1ll << 30, 1ll << 30, 1ll << 30}, rt_device_cpu()),
                     RT_ERR_INVALID);
    assert_int_equal(rt_tensor_init(&t, (rt_dtype)42, 1, (int64_t[]){1}, rt_device_cpu()), RT_ERR_INVALID);
}

static void test_dtypes(void **state) {
    (void)state;
    rt_dtype d;
    assert_rt_ok(rt_dtype_parse("F32", &d));
    assert_int_equal(d, RT_F32);
    assert_rt_ok(rt_dtype_parse("int64", &d));
    assert_int_equal(d, RT_I64);
    assert_rt_ok(rt_dtype_parse("Float64", &d));
    assert_int_equal(d, RT_F64);
    assert_rt_ok(rt_dtype_parse("BF16", &d));
    assert_int_equal(d, RT_BF16);
    assert_rt_fails(rt_dtype_parse("f16", &d), RT_ERR_INVALID,
                    "unknown dtype 'f16' (expected f32 | f64 | i32 | i64 | u8 | bf16)");
    assert_rt_fails(rt_dtype_parse(NULL, &d), RT_ERR_INVALID, "no dtype given");
    assert_int_equal(rt_dtype_size(RT_F64), 8);
    assert_int_equal(rt_dtype_size(RT_U8), 1);
    assert_string_equal(rt_dtype_name(RT_I32), "i32");
}

static void test_arena(void **state) {
    (void)state;
    rt_arena params, grads;
    rt_arena_init(&params, rt_device_cpu());
    rt_arena_init(&grads, rt_device_cpu());
    rt_tensor w, b;
    assert_rt_ok(rt_tensor_init(&w, RT_F32, 2, (int64_t[]){10, 3}, rt_device_cpu()));
    assert_rt_ok(rt_tensor_init(&b, RT_F32, 1, (int64_t[]){10}, rt_device_cpu()));
    assert_rt_ok(rt_tensor_place(&w, &params));
    assert_rt_ok(rt_tensor_place(&b, &params));
    assert_int_equal(w.offset, 0);
    assert_int_equal(b.offset, 128); /* 120 bytes rounded up to 64 */
    assert_null(rt_tensor_data(&w));
    grads.size = params.size; /* same layout */
    assert_rt_ok(rt_arena_alloc(&params));
    assert_rt_ok(rt_arena_alloc(&grads));
    size_t off;
    assert_int_equal(rt_arena_push(&params, 4, 64, &off), RT_ERR_INTERNAL); /* frozen after alloc */
    float *wp = rt_tensor_data(&w), *bp = rt_tensor_data(&b);
    assert_ptr_equal((char *)bp, (char *)params.base + 128);
    for (int i = 0; i < 30; i++) assert_true(wp[i] == 0.0f); /* zeroed */
    rt_tensor gb = rt_tensor_in(&b, &grads);
    assert_ptr_equal(rt_tensor_data(&gb), (char *)grads.base + 128);
    assert_true(rt_tensor_same_shape(&gb, &b));
    assert_int_equal(rt_arena_push(&grads, 4, 3, &off), RT_ERR_INTERNAL);
    rt_arena_free(&params);
    rt_arena_free(&grads);
    rt_arena a;
    rt_arena_init(&a, rt_device_cpu());
    assert_int_equal(rt_arena_push(&a, 4, 3, &off), RT_ERR_INVALID); /* alignment not a power of 2 */
    assert_int_equal(rt_arena_push(&a, SIZE_MAX, 64, &off), RT_OK);
    assert_int_equal(rt_arena_push(&a, 64, 64, &off), RT_ERR_NOMEM); /* overflow detected */
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_descriptor), cmocka_unit_test(test_dtypes),
                                       cmocka_unit_test(test_arena)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
