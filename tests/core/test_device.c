/* Device layer on the CPU, and clean errors (not crashes) for CUDA without a GPU. */
#include "test_util.h"

#include "core/device.h"
#include "core/timer.h"

#include <stdio.h>
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
    bool done = false;
    assert_rt_ok(rt_event_query(e0, &done)); /* never recorded: nothing to wait for */
    assert_true(done);
    assert_rt_ok(rt_event_record(e0, s));
    done = false;
    assert_rt_ok(rt_event_query(e0, &done)); /* a CPU event is complete once recorded */
    assert_true(done);
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

/* `expr` fails with `code` and the recorded message contains `needle`. */
#define assert_fails_with(expr, code, needle)                                                                          \
    do {                                                                                                               \
        rt_status s_ = (expr);                                                                                         \
        if (s_ != (code)) fail_msg("%s -> %s, expected %s", #expr, rt_status_name(s_), rt_status_name(code));          \
        if (!strstr(rt_error_message(), (needle)))                                                                     \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #expr, rt_error_message(), (needle));                          \
    } while (0)

#define assert_device(d, k, i)                                                                                         \
    do {                                                                                                               \
        assert_int_equal((d).kind, (k));                                                                               \
        assert_int_equal((d).index, (i));                                                                              \
    } while (0)

/* The rule of rt_device_choose, every case, with any number of GPUs (no GPU needed). */
static void test_choose(void **state) {
    (void)state;
    rt_device d;
    /* auto: cuda:(local_rank % count) when GPUs answer, else the CPU */
    assert_rt_ok(rt_device_choose("auto", 0, 0, &d));
    assert_device(d, RT_DEVICE_CPU, 0);
    assert_rt_ok(rt_device_choose("auto", 5, 0, &d));
    assert_device(d, RT_DEVICE_CPU, 0);
    assert_rt_ok(rt_device_choose("auto", 0, 4, &d));
    assert_device(d, RT_DEVICE_CUDA, 0);
    assert_rt_ok(rt_device_choose("auto", 6, 4, &d));
    assert_device(d, RT_DEVICE_CUDA, 2);
    assert_rt_ok(rt_device_choose("AUTO", 1, 2, &d));
    assert_device(d, RT_DEVICE_CUDA, 1);
    assert_rt_ok(rt_device_choose("auto", -1, 3, &d)); /* LOCAL_RANK unknown: rank 0 */
    assert_device(d, RT_DEVICE_CUDA, 0);
    /* cpu: always the CPU */
    assert_rt_ok(rt_device_choose("cpu", 3, 8, &d));
    assert_device(d, RT_DEVICE_CPU, 0);
    assert_rt_ok(rt_device_choose("CPU", 0, 0, &d));
    assert_device(d, RT_DEVICE_CPU, 0);
    /* cuda: cuda:(local_rank % count); an error without a GPU */
    assert_rt_ok(rt_device_choose("cuda", 3, 2, &d));
    assert_device(d, RT_DEVICE_CUDA, 1);
    assert_rt_ok(rt_device_choose("Cuda", 7, 8, &d));
    assert_device(d, RT_DEVICE_CUDA, 7);
    assert_fails_with(rt_device_choose("cuda", 0, 0, &d), RT_ERR_NODEVICE, "device 'cuda' requested but no GPU");
    assert_device(d, RT_DEVICE_CPU, 0);
    /* cuda:N: N whatever the local rank; N >= count and no GPU are errors */
    assert_rt_ok(rt_device_choose("cuda:1", 0, 2, &d));
    assert_device(d, RT_DEVICE_CUDA, 1);
    assert_rt_ok(rt_device_choose("CUDA:0", 5, 2, &d));
    assert_device(d, RT_DEVICE_CUDA, 0);
    assert_fails_with(rt_device_choose("cuda:2", 0, 2, &d), RT_ERR_INVALID, "only 2 GPU(s) found");
    assert_fails_with(rt_device_choose("cuda:1", 0, 0, &d), RT_ERR_NODEVICE, "no GPU");
    /* bad names fail whatever the machine, naming themselves and the accepted forms */
    const char *bad[] = {"tpu",     "",      "cuda:", "cuda:x",           "cuda:-1", "cuda:+1", "cuda: 1",
                         "cuda:1x", "cpu:0", "gpu:0", "cuda:99999999999", " auto",   "cudax"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int count = 0; count <= 2; count += 2) {
            char want[64];
            snprintf(want, sizeof want, "'%s'", bad[i]);
            assert_fails_with(rt_device_choose(bad[i], 0, count, &d), RT_ERR_INVALID, want);
            assert_fails_with(rt_device_choose(bad[i], 0, count, &d), RT_ERR_INVALID, "auto | cpu | cuda | cuda:N");
        }
    }
    assert_fails_with(rt_device_choose("tpu", 0, 1, &d), RT_ERR_INVALID,
                      "unknown device 'tpu' (expected auto | cpu | cuda | cuda:N)");
    assert_fails_with(rt_device_choose(NULL, 0, 1, &d), RT_ERR_INVALID, "(null)");
    assert_string_equal(rt_device_kind_name(RT_DEVICE_CUDA), "cuda");
}

static void test_select(void **state) {
    (void)state;
    rt_device d;
    assert_rt_ok(rt_device_select("cpu", 0, &d));
    assert_int_equal(d.kind, RT_DEVICE_CPU);
    assert_fails_with(rt_device_select("tpu", 0, &d), RT_ERR_INVALID, "expected auto | cpu | cuda | cuda:N");
    assert_fails_with(rt_device_select("cuda:x", 0, &d), RT_ERR_INVALID, "'cuda:x'");
    int n = 0;
    if (rt_cuda_device_count(&n) != RT_OK) {
        /* no GPU: auto falls back to the CPU, cuda is an error that says why */
        assert_rt_ok(rt_device_select("auto", 0, &d));
        assert_int_equal(d.kind, RT_DEVICE_CPU);
        assert_fails_with(rt_device_select("cuda", 0, &d), RT_ERR_NODEVICE, "no GPU");
        assert_fails_with(rt_device_select("cuda:0", 0, &d), RT_ERR_NODEVICE, "no GPU");
        /* CUDA memory requests fail cleanly */
        void *p = (void *)1;
        assert_int_not_equal(rt_malloc(rt_device_cuda(0), 16, &p), RT_OK);
        assert_null(p);
        rt_stream *s = NULL;
        assert_int_not_equal(rt_stream_create(rt_device_cuda(0), &s), RT_OK);
        assert_null(s);
        rt_event *e = NULL;
        assert_int_not_equal(rt_event_create(rt_device_cuda(0), &e), RT_OK);
        assert_null(e);
    } else {
        assert_rt_ok(rt_device_select("auto", 0, &d));
        assert_int_equal(d.kind, RT_DEVICE_CUDA);
        assert_int_equal(d.index, 0);
        assert_rt_ok(rt_device_select("auto", n, &d)); /* local rank n shares GPU 0 */
        assert_device(d, RT_DEVICE_CUDA, 0);
        char want[32];
        snprintf(want, sizeof want, "cuda:%d", n - 1);
        assert_rt_ok(rt_device_select(want, 0, &d));
        assert_device(d, RT_DEVICE_CUDA, n - 1);
        snprintf(want, sizeof want, "cuda:%d", n);
        assert_fails_with(rt_device_select(want, 0, &d), RT_ERR_INVALID, "GPU(s) found");
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
                                       cmocka_unit_test(test_choose), cmocka_unit_test(test_select),
                                       cmocka_unit_test(test_timer)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
