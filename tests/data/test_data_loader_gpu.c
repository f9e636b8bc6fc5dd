/* The loader for a CUDA device: its batch ring is page-locked host memory, the
 * batches are the same as for the CPU, and a batch copied to the device asynchronously
 * arrives intact although nothing but rt_loader_release_after orders the copy before the
 * slot's reuse (issue 19, defect 7: the slot used to be refilled at the next
 * rt_loader_next, safe only because the trainer read the loss back every step). In the
 * emulated-GPU build (RINGTRAIN_CUDA=EMU) pinned memory is read when the stream reaches
 * the copy, and RINGTRAIN_EMU_DELAY_US delays every stream operation, so a slot refilled
 * too early shows up as a wrong batch on the device. Skipped (77) without a GPU. */
#include "data_test_util.h"

#include "data/loader.h"

#include <stdlib.h>

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

/* Two epochs of batches through a ring of 2 pinned slots, each copied to its own place
 * on the device on one stream with no host sync in between (as the trainer does when it
 * reads nothing back), then compared with the CPU loader's batches. */
static void test_async_copies_see_their_batch(void **state) {
    (void)state;
    enum { N = 64, C = 3, H = 16, W = 16, BS = 8, EPOCHS = 2, NB = EPOCHS * N / BS };
    const size_t img_bytes = (size_t)BS * C * H * W * sizeof(float), lab_bytes = (size_t)BS * sizeof(int64_t);
    rt_dataset ds;
    assert_rt_ok(rt_dataset_alloc(&ds, "tiny", N, C, H, W, 10));
    uint8_t *img = (uint8_t *)ds.images;
    for (int i = 0; i < N * C * H * W; i++) img[i] = (uint8_t)(i * 7 + i / 97);
    for (int i = 0; i < N; i++) ((uint8_t *)ds.labels)[i] = (uint8_t)(i % 10);
    rt_loader_config c = rt_loader_config_default(&ds);
    c.global_batch = BS;
    c.prefetch = 2; /* a slot comes round again two batches later */
    rt_loader *cpu = NULL, *gpu = NULL;
    assert_rt_ok(rt_loader_create(&c, &cpu));
    c.device = rt_device_cuda(0);
    assert_rt_ok(rt_loader_create(&c, &gpu));
    assert_true(rt_loader_pinned(gpu));

    rt_device d = rt_device_cuda(0);
    rt_stream *s = NULL;
    assert_rt_ok(rt_stream_create(d, &s));
    uint8_t *dev = NULL;
    assert_rt_ok(rt_malloc(d, NB * (img_bytes + lab_bytes), (void **)&dev));
    uint8_t *want = calloc(NB, img_bytes + lab_bytes);
    uint8_t *got = calloc(NB, img_bytes + lab_bytes);
    assert_non_null(want);
    assert_non_null(got);
    int n = 0;
    for (int e = 0; e < EPOCHS; e++) {
        assert_rt_ok(rt_loader_start_epoch(cpu, e));
        assert_rt_ok(rt_loader_start_epoch(gpu, e));
        for (;;) {
            rt_batch a, b;
            assert_rt_ok(rt_loader_next(cpu, &a));
            assert_rt_ok(rt_loader_next(gpu, &b));
            assert_int_equal(a.size, b.size);
            if (b.size == 0) break;
            assert_int_equal(b.size, BS);
            assert_true(n < NB);
            uint8_t *at = want + (size_t)n * (img_bytes + lab_bytes);
            memcpy(at, a.images, img_bytes);
            memcpy(at + img_bytes, a.labels, lab_bytes);
            uint8_t *to = dev + (size_t)n * (img_bytes + lab_bytes);
            assert_rt_ok(rt_memcpy(to, d, b.images, rt_device_cpu(), img_bytes, s));
            assert_rt_ok(rt_memcpy(to + img_bytes, d, b.labels, rt_device_cpu(), lab_bytes, s));
            assert_rt_ok(rt_loader_release_after(gpu, &b, s));
            n++;
        }
    }
    assert_int_equal(n, NB);
    /* misuse: a batch that is no longer the one handed out last */
    assert_rt_ok(rt_loader_start_epoch(gpu, 0));
    rt_batch b0, b1;
    assert_rt_ok(rt_loader_next(gpu, &b0));
    assert_rt_ok(rt_loader_next(gpu, &b1));
    assert_int_equal(rt_loader_release_after(gpu, &b0, s), RT_ERR_INVALID);
    rt_error_clear();

    assert_rt_ok(rt_stream_sync(s));
    assert_rt_ok(rt_memcpy(got, rt_device_cpu(), dev, d, NB * (img_bytes + lab_bytes), NULL));
    int bad = 0;
    for (int i = 0; i < NB; i++) {
        size_t o = (size_t)i * (img_bytes + lab_bytes);
        if (memcmp(want + o, got + o, img_bytes + lab_bytes) != 0) {
            if (bad < 5)
                printf("batch %d (epoch %d, batch %d) arrived wrong on the device\n", i, i / (N / BS), i % (N / BS));
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    free(want);
    free(got);
    rt_free(d, dev);
    rt_stream_destroy(s);
    rt_loader_destroy(gpu);
    rt_loader_destroy(cpu);
    rt_dataset_free(&ds);
}

int main(void) {
    /* before the first CUDA call: the emulated streams delay every operation (a real GPU
     * ignores it; ctest may set a value of its own) */
    setenv("RINGTRAIN_EMU_DELAY_US", "2000", 0);
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pinned_same_batches),
                                       cmocka_unit_test(test_async_copies_see_their_batch)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
