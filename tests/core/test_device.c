/* Device layer on the CPU, and clean errors (not crashes) for CUDA without a GPU. */
#include "test_util.h"

#include "core/device.h"
#include "core/timer.h"

#include <string.h>
#include <time.h>

static void test_cpu_memory(void **state) {
    (void)state;
    rt_device cpu = rt_device_cpu();
    void *a = NULL, *b = NULL;
    assert_rt_ok(rt_malloc(cpu, 1000, &a));
    assert_rt_ok(rt_malloc(cpu, 1000, &b));
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_rt_ok(rt_memset(cpu, a, 0x5a, 1000, NULL));
    for (int i = 0; i < 1000; i++) assert_int_equal(((unsigned char *)a)[i], 0x5a);
    assert_rt_ok(rt_memcpy(b, cpu, a, cpu, 1000, NULL));
    assert_memory_equal(a, b, 1000);
    /* zero-byte operations are fine, even with NULL */
    assert_rt_ok(rt_memcpy(NULL, cpu, NULL, cpu, 0, NULL));
    assert_int_equal(rt_memcpy(NULL, cpu, a, cpu, 4, NULL), RT_ERR_INVALID);
    rt_free(cpu, a);
    rt_free(cpu, b);
    rt_free(cpu, NULL);
    void *h = NULL;
    bool pinned = true;
    assert_rt_ok(rt_host_alloc(4096, false, &h, &pinned));
    assert_false(pinned);
    memset(h, 1, 4096);
    rt_host_free(h, pinned);
}

static void test_streams_events(void **state) {
    (void)state;
    rt_device cpu = rt_device_cpu();
    rt_stream *s;
    rt_event *e0, *e1;
    assert_rt_ok(rt_stream_create(cpu, &s));
    assert_rt_ok(rt_event_create(cpu, &e0));
    assert_rt_ok(rt_event_create(cpu, &e1));
    float ms;
    bool ready;
    assert_int_equal(rt_event_elapsed_ms(e0, e1, &ms, &ready), RT_ERR_INVALID); /* never recorded */
    assert_rt_ok(rt_event_record(e0, s));
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_rt_ok(rt_event_record(e1, s));
    assert_rt_ok(rt_stream_sync(s));
    assert_rt_ok(rt_event_sync(e1));
    assert_rt_ok(rt_stream_wait_event(s, e1));
    assert_rt_ok(rt_event_elapsed_ms(e0, e1, &ms, &ready));
    assert_true(ready);
    assert_true(ms >= 19.0f && ms < 5000.0f);
    assert_null(rt_stream_native(s));
    rt_event_destroy(e0);
    rt_event_destroy(e1);
    rt_stream_destroy(s);
}

static void test_select(void **state) {
    (void)state;
    rt_device d;
    assert_rt_ok(rt_device_select("cpu", 0, &d));
    assert_int_equal(d.kind, RT_DEVICE_CPU);
    assert_int_equal(rt_device_select("tpu", 0, &d), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "expected auto, cpu, cuda or cuda:N"));
    assert_int_equal(rt_device_select("cuda:x", 0, &d), RT_ERR_INVALID);
    int n = 0;
    if (rt_cuda_device_count(&n) != RT_OK) {
        /* no GPU: auto falls back to the CPU, cuda is an error that says why */
        assert_rt_ok(rt_device_select("auto", 0, &d));
        assert_int_equal(d.kind, RT_DEVICE_CPU);
        assert_int_equal(rt_device_select("cuda", 0, &d), RT_ERR_NODEVICE);
        assert_non_null(strstr(rt_error_message(), "no GPU"));
        /* CUDA memory requests fail cleanly */
        void *p = (void *)1;
        assert_int_not_equal(rt_malloc(rt_device_cuda(0), 16, &p), RT_OK);
        assert_null(p);
        rt_stream *s = NULL;
        assert_int_not_equal(rt_stream_create(rt_device_cuda(0), &s), RT_OK);
        assert_null(s);
    } else {
        assert_rt_ok(rt_device_select("auto", 0, &d));
        assert_int_equal(d.kind, RT_DEVICE_CUDA);
        assert_int_equal(d.index, 0);
    }
    char buf[16];
    assert_string_equal(rt_device_str(rt_device_cuda(3), buf, sizeof buf), "cuda:3");
    assert_string_equal(rt_device_str(rt_device_cpu(), buf, sizeof buf), "cpu");
}

static void test_timer(void **state) {
    (void)state;
    uint64_t a = rt_now_ns(), b = rt_now_ns();
    assert_true(b >= a);
    rt_timer t;
    rt_timer_start(&t);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_true(rt_timer_elapsed_ms(&t) >= 4.9);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cpu_memory), cmocka_unit_test(test_streams_events),
                                       cmocka_unit_test(test_select), cmocka_unit_test(test_timer)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
