/* GPU core: device memory in every copy direction, memset, streams/events, and the
 * Philox streams equal on CPU and GPU. Exits 77 without a GPU. */
#include "test_util.h"

#include "core/device.h"
#include "core/rng.h"

#include <string.h>

static void test_memory(void **state) {
    (void)state;
    rt_device gpu = rt_device_cuda(0), cpu = rt_device_cpu();
    enum { N = 1 << 20 };
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 3);
    void *d1, *d2, *pin;
    bool pinned;
    assert_rt_ok(rt_malloc(gpu, N, &d1));
    assert_rt_ok(rt_malloc(gpu, N, &d2));
    assert_rt_ok(rt_host_alloc(N, true, &pin, &pinned));
    assert_true(pinned);
    rt_stream *s;
    assert_rt_ok(rt_stream_create(gpu, &s));
    assert_rt_ok(rt_memcpy(d1, gpu, h, cpu, N, NULL));              /* H2D */
    assert_rt_ok(rt_memcpy(d2, gpu, d1, gpu, N, s));                /* D2D async */
    assert_rt_ok(rt_memcpy(pin, cpu, d2, gpu, N, s));               /* D2H async into pinned */
    assert_rt_ok(rt_stream_sync(s));
    assert_memory_equal(pin, h, N);
    assert_rt_ok(rt_memset(gpu, d1, 0xab, N, NULL));
    assert_rt_ok(rt_memcpy(back, cpu, d1, gpu, N, NULL));
    for (int i = 0; i < N; i++) assert_int_equal(back[i], 0xab);
    rt_event *e0, *e1;
    assert_rt_ok(rt_event_create(gpu, &e0));
    assert_rt_ok(rt_event_create(gpu, &e1));
    assert_rt_ok(rt_event_record(e0, s));
    assert_rt_ok(rt_memcpy(d2, gpu, d1, gpu, N, s));
    assert_rt_ok(rt_event_record(e1, s));
    assert_rt_ok(rt_event_sync(e1));
    float ms;
    bool ready;
    assert_rt_ok(rt_event_elapsed_ms(e0, e1, &ms, &ready));
    assert_true(ready && ms >= 0.0f);
    rt_event_destroy(e0);
    rt_event_destroy(e1);
    rt_stream_destroy(s);
    rt_host_free(pin, pinned);
    rt_free(gpu, d1);
    rt_free(gpu, d2);
    free(h);
    free(back);
}

static void test_rng_equal(void **state) {
    (void)state;
    rt_device gpu = rt_device_cuda(0), cpu = rt_device_cpu();
    enum { N = 100003 };
    float *c = malloc(N * sizeof *c), *g = malloc(N * sizeof *g);
    float *d;
    assert_rt_ok(rt_malloc(gpu, N * sizeof *d, (void **)&d));
    rt_rng rc, rg;
    rt_rng_init(&rc, 2024, 5);
    rt_rng_init(&rg, 2024, 5);
    rt_rng_uniform(&rc, c, 3); /* advance both by an odd amount first */
    rt_rng_uniform(&rg, g, 3);
    rt_rng_uniform(&rc, c, N);
    assert_rt_ok(rt_rng_uniform_dev(&rg, d, N, NULL));
    assert_rt_ok(rt_memcpy(g, cpu, d, gpu, N * sizeof *d, NULL));
    assert_memory_equal(c, g, N * sizeof *c);
    rt_rng_normal(&rc, c, N, 0.5f, 2.0f);
    assert_rt_ok(rt_rng_normal_dev(&rg, d, N, 0.5f, 2.0f, NULL));
    assert_rt_ok(rt_memcpy(g, cpu, d, gpu, N * sizeof *d, NULL));
    int differ = 0;
    for (int i = 0; i < N; i++) {
        float tol = 1e-6f * (1.0f + (c[i] < 0 ? -c[i] : c[i]));
        if (c[i] - g[i] > tol || g[i] - c[i] > tol) differ++;
    }
    assert_int_equal(differ, 0);
    assert_int_equal(rc.offset, rg.offset);
    rt_free(gpu, d);
    free(c);
    free(g);
}

int main(void) {
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_memory), cmocka_unit_test(test_rng_equal)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
