/* The loader for a CUDA device: its batch ring is page-locked host memory, and the
 * batches are the same as for the CPU. Skipped (77) without a GPU. */
#include "data_test_util.h"

#include "data/loader.h"

static void test_pinned_same_batches(void **state) {
    (void)state;
    rt_dataset ds;
    assert_rt_ok(rt_dataset_alloc(&ds, "tiny", 50, 3, 8, 8, 10));
    uint8_t *img = (uint8_t *)ds.images;
    for (int i = 0; i < 50 * 3 * 64; i++) img[i] = (uint8_t)(i * 13 + 5);
    ds.crop_pad = 2, ds.hflip_suits = true;
    rt_loader_config c = rt_loader_config_default(&ds);
    c.global_batch = 16;
    rt_loader *cpu = NULL, *gpu = NULL;
    assert_rt_ok(rt_loader_create(&c, &cpu));
    c.device = rt_device_cuda(0);
    assert_rt_ok(rt_loader_create(&c, &gpu));
    assert_false(rt_loader_pinned(cpu));
    assert_true(rt_loader_pinned(gpu));
    assert_rt_ok(rt_loader_start_epoch(cpu, 1));
    assert_rt_ok(rt_loader_start_epoch(gpu, 1));
    rt_batch a, b;
    int n = 0;
    for (;;) {
        assert_rt_ok(rt_loader_next(cpu, &a));
        assert_rt_ok(rt_loader_next(gpu, &b));
        assert_int_equal(a.size, b.size);
        if (a.size == 0) break;
        assert_memory_equal(a.images, b.images, (size_t)a.size * 3 * 64 * sizeof(float));
        assert_memory_equal(a.labels, b.labels, (size_t)a.size * sizeof(int64_t));
        /* the pinned batch can be copied to the device */
        void *dev = NULL;
        assert_rt_ok(rt_malloc(rt_device_cuda(0), (size_t)b.size * 3 * 64 * sizeof(float), &dev));
        assert_rt_ok(rt_memcpy(dev, rt_device_cuda(0), b.images, rt_device_cpu(),
                               (size_t)b.size * 3 * 64 * sizeof(float), NULL));
        rt_free(rt_device_cuda(0), dev);
        n++;
    }
    assert_int_equal(n, 4);
    rt_loader_destroy(cpu);
    rt_loader_destroy(gpu);
    rt_dataset_free(&ds);
}

int main(void) {
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pinned_same_batches)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
