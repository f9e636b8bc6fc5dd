/* GPU optimizers against the CPU ones: the fused CUDA kernels (SGD, Adam, AdamW with
 * every option, weight-decay exclusions through the bit mask, ranges that straddle mask
 * words) must give the CPU loops' parameters and state (they are written to be
 * bit-identical; checked to 1e-6 relative and the number of differing bits reported),
 * the gradient norm / clipping / non-finite check must agree, and a save/load of the
 * GPU state mid-run must continue the same trajectory. Exits 77 without a GPU. */
#include "test_util.h"
#include "optim_test_util.h"

#include "core/rng.h"
#include "optim/clip.h"
#include "optim/optimizer.h"

#include <math.h>
#include <string.h>

#define N ((size_t)1000003) /* odd, not a multiple of 32 or of the block size */
#define STEPS 12

static const rt_optim_range ranges[3] = {{0, 5}, {33, 64}, {999990, 13}};

/* compare n floats; returns the number of elements off by more than 1e-6 relative */
static size_t compare(const char *what, const float *cpu, const float *gpu, size_t n) {
    size_t off = 0, differ = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) differ++;
        double d = fabs((double)cpu[i] - gpu[i]) / fmax(fabs((double)cpu[i]), 1e-2);
        if (!(d <= 1e-6)) off++;
        if (!(d <= worst)) worst = d;
    }
    printf("  %-16s %zu elements differ in some bit, max rel err %.3g, %zu beyond 1e-6\n", what, differ, worst, off);
    return off;
}

/* One config: STEPS steps on CPU and GPU from the same start; on the GPU the state is
 * saved and reloaded into a new optimizer at step resume_at. */
static void run_config(const rt_optim_config *c, int resume_at) {
    rt_device gpu = rt_device_cuda(0), cpu = rt_device_cpu();
    size_t bytes = N * sizeof(float);
    float *p = malloc(bytes), *g = malloc(STEPS * bytes), *back = malloc(bytes);
    float *p_dev, *g_dev;
    assert_rt_ok(rt_malloc(gpu, bytes, (void **)&p_dev));
    assert_rt_ok(rt_malloc(gpu, bytes, (void **)&g_dev));
    rt_rng rng;
    rt_rng_init(&rng, 7, 3);
    rt_rng_normal(&rng, p, N, 0, 1);
    rt_rng_normal(&rng, g, STEPS * N, 0, 1);
    assert_rt_ok(rt_memcpy(p_dev, gpu, p, cpu, bytes, NULL));
    rt_optimizer oc, og;
    assert_rt_ok(rt_optimizer_init(&oc, c, cpu, N));
    assert_rt_ok(rt_optimizer_init(&og, c, gpu, N));
    rt_stream *s;
    assert_rt_ok(rt_stream_create(gpu, &s));
    for (int t = 0; t < STEPS; t++) {
        double lr = c->lr * (1.0 + 0.1 * t);
        if (t == resume_at) {
            for (int i = 0; i < rt_optimizer_state_count(&og); i++) { /* the state lives on the GPU */
                rt_optim_state st;
                assert_rt_ok(rt_optimizer_state_get(&og, i, &st));
                assert_true(rt_device_is_cuda(st.tensor.device));
            }
            int ns;
            int64_t k;
            float *saved = optim_test_save(&og, N, &ns, &k);
            rt_optimizer_free(&og);
            assert_rt_ok(rt_optimizer_init(&og, c, gpu, N));
            optim_test_load(&og, saved, N, k);
        }
        assert_rt_ok(rt_memcpy(g_dev, gpu, g + (size_t)t * N, cpu, bytes, s));
        assert_rt_ok(rt_optimizer_step(&og, p_dev, g_dev, lr, s));
        assert_rt_ok(rt_optimizer_step(&oc, p, g + (size_t)t * N, lr, NULL));
    }
    assert_rt_ok(rt_stream_sync(s));
    printf("%s momentum %g nesterov %d wd %g amsgrad %d excluded ranges %zu (resumed at %d)\n",
           rt_optim_kind_name(c->kind), c->momentum, c->nesterov, c->weight_decay, c->amsgrad, c->n_no_decay,
           resume_at);
    size_t bad = 0;
    assert_rt_ok(rt_memcpy(back, cpu, p_dev, gpu, bytes, NULL));
    bad += compare("params", p, back, N);
    for (int i = 0; i < rt_optimizer_state_count(&oc); i++) {
        rt_optim_state sc, sg;
        assert_rt_ok(rt_optimizer_state_get(&oc, i, &sc));
        assert_rt_ok(rt_optimizer_state_find(&og, sc.name, &sg));
        assert_rt_ok(rt_memcpy(back, cpu, sg.data, gpu, bytes, NULL));
        bad += compare(sc.name, sc.data, back, N);
    }
    assert_int_equal(bad, 0);
    rt_stream_destroy(s);
    rt_optimizer_free(&oc);
    rt_optimizer_free(&og);
    rt_free(gpu, p_dev);
    rt_free(gpu, g_dev);
    free(p);
    free(g);
    free(back);
}

static void test_optimizers_match_cpu(void **state) {
    (void)state;
    rt_optim_config cs[OPTIM_TEST_CONFIGS_MAX];
    int n;
    optim_test_configs(cs, &n, ranges);
    for (int i = 0; i < n; i++) {
        run_config(&cs[i], -1);
        run_config(&cs[i], STEPS / 2);
    }
}

static void test_clip_matches_cpu(void **state) {
    (void)state;
    rt_device gpu = rt_device_cuda(0), cpu = rt_device_cpu();
    size_t bytes = N * sizeof(float);
    float *g = malloc(bytes), *back = malloc(bytes);
    float *g_dev;
    assert_rt_ok(rt_malloc(gpu, bytes, (void **)&g_dev));
    rt_rng rng;
    rt_rng_init(&rng, 11, 0);
    rt_rng_normal(&rng, g, N, 0, 2);
    assert_rt_ok(rt_memcpy(g_dev, gpu, g, cpu, bytes, NULL));
    rt_grad_clip cc, cg;
    assert_rt_ok(rt_grad_clip_init(&cc, cpu));
    assert_rt_ok(rt_grad_clip_init(&cg, gpu));
    rt_stream *s;
    assert_rt_ok(rt_stream_create(gpu, &s));
    rt_grad_stats a, b;
    assert_rt_ok(rt_grad_clip_norm(&cc, g, N, 100.0, NULL, &a));
    assert_rt_ok(rt_grad_clip_norm(&cg, g_dev, N, 100.0, s, &b));
    assert_rt_ok(rt_stream_sync(s));
    printf("norm cpu %.17g gpu %.17g, coef %.9g %.9g\n", a.norm, b.norm, a.clip_coef, b.clip_coef);
    assert_true(fabs(a.norm - b.norm) <= 1e-12 * a.norm);
    assert_true(a.finite && b.finite && a.clipped && b.clipped);
    /* the sums differ only in order, so the float coefficients agree (to an ulp at worst) */
    assert_true(fabsf(a.clip_coef - b.clip_coef) <= 1e-6f * a.clip_coef);
    assert_rt_ok(rt_memcpy(back, cpu, g_dev, gpu, bytes, NULL));
    if (a.clip_coef == b.clip_coef)
        assert_memory_equal(g, back, bytes);
    else
        assert_int_equal(compare("clipped grads", g, back, N), 0);
    /* the same norm twice on the GPU: deterministic */
    double n1, n2;
    assert_rt_ok(rt_grad_norm(&cg, g_dev, N, s, &n1));
    assert_rt_ok(rt_grad_norm(&cg, g_dev, N, NULL, &n2));
    assert_true(n1 == n2);
    /* non-finite on the GPU: reported, nothing scaled */
    float inf = INFINITY;
    assert_rt_ok(rt_memcpy(g_dev + 777777, gpu, &inf, cpu, sizeof inf, NULL));
    assert_rt_ok(rt_grad_clip_norm(&cg, g_dev, N, 1.0, s, &b));
    assert_false(b.finite);
    assert_false(b.clipped);
    float one;
    assert_rt_ok(rt_memcpy(&one, cpu, g_dev + 5, gpu, sizeof one, NULL));
    assert_true(one == g[5]);
    rt_stream_destroy(s);
    rt_grad_clip_free(&cc);
    rt_grad_clip_free(&cg);
    rt_free(gpu, g_dev);
    free(g);
    free(back);
}

int main(void) {
    RT_SKIP_WITHOUT_GPU();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers_match_cpu),
        cmocka_unit_test(test_clip_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
