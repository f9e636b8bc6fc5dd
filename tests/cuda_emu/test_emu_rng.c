/* The Philox draws on the GPU (src/core/cuda/rng_cuda.cu: rt_rng_uniform_cuda and
 * rt_rng_normal_cuda, behind rt_rng_uniform_dev / rt_rng_normal_dev), compiled as host code
 * through the CUDA emulation, against rt_rng_uniform / rt_rng_normal: the same
 * philox.h code on both sides, so the streams must agree bit for bit, from any offset,
 * and both advance the state by the same count.
 *
 * The normal draw scales as `mean + std * z`: the CPU (ISO C) and the emulation do a
 * multiply and an add; nvcc contracts them into one fma by default, so on hardware the
 * GPU test (tests/core/test_gpu_core.c) allows 1e-6 for mean/std other than 0/1. The
 * emulation checks the stream itself exactly. */
#include "emu_test_util.h"

#include "core/cuda/device_cuda.h"

#include <cuda_runtime.h>

static void check_state(const rt_rng *c, const rt_rng *g) {
    assert_true(c->seed == g->seed && c->subseq == g->subseq && c->offset == g->offset);
}

static void test_uniform(void **state) {
    (void)state;
    const size_t sizes[] = {1, 3, 256, 10007, 70001}; /* the last: 274 blocks, the last one partial */
    rt_rng rc, rg;
    rt_rng_init(&rc, g_seed, 5);
    rt_rng_init(&rg, g_seed, 5);
    float *skip = rt_test_floats(3);
    rt_rng_uniform(&rc, skip, 3); /* an odd offset first: blocks of 4 words split */
    rt_rng_uniform(&rg, skip, 3);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *c = rt_test_nans(n), *g = rt_test_nans(n);
        rt_rng_uniform(&rc, c, n);
        assert_rt_ok(rt_rng_uniform_cuda(&rg, g, n, NULL));
        char what[64];
        snprintf(what, sizeof what, "uniform n=%zu", n);
        et_check_exact(what, c, g, n);
        check_state(&rc, &rg);
        free(c), free(g);
    }
    assert_rt_ok(rt_rng_uniform_cuda(&rg, NULL, 0, NULL)); /* nothing drawn, nothing advanced */
    check_state(&rc, &rg);
    free(skip);
}

static void test_normal(void **state) {
    (void)state;
    const float params[][2] = {{0.0f, 1.0f}, {0.5f, 2.0f}, {-3.0f, 0.01f}};
    rt_rng rc, rg;
    rt_rng_init(&rc, g_seed ^ 0xabcdefu, 9);
    rt_rng_init(&rg, g_seed ^ 0xabcdefu, 9);
    for (int pi = 0; pi < 3; pi++) {
        const size_t n = 10007 + (size_t)pi; /* and offsets that are not multiples of 4 */
        float *c = rt_test_nans(n), *g = rt_test_nans(n);
        rt_rng_normal(&rc, c, n, params[pi][0], params[pi][1]);
        assert_rt_ok(rt_rng_normal_cuda(&rg, g, n, params[pi][0], params[pi][1], NULL));
        char what[64];
        snprintf(what, sizeof what, "normal(%g, %g) n=%zu", (double)params[pi][0], (double)params[pi][1], n);
        et_check_exact(what, c, g, n);
        check_state(&rc, &rg);
        free(c), free(g);
    }
}

int main(void) {
    et_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_normal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
