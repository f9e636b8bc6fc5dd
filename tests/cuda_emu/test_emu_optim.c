/* The optimizer's CUDA backend (src/optim/cuda/optim_cuda.cu: the fused SGD and Adam
 * kernels, the sum of squares and the scaling, and its table rt_optim_backend_cuda),
 * compiled as host code through the CUDA emulation, against the CPU backend on the
 * cases of tests/optim/test_gpu_optim.c.
 *
 * The whole front end runs on both sides: an optimizer (or clipper) is created on the
 * CPU and then given the emulated CUDA table instead of the CPU one (its init builds
 * the weight-decay bit mask from the excluded ranges), so rt_optimizer_step computes
 * the same float coefficients for both and only the backend differs. "Device" memory is
 * host memory in the emulation, so the CPU device's allocations serve it.
 *
 * Agreement: optim_cuda.cu spells every operation with a rounding intrinsic, the CPU
 * uses fmaf where the kernel uses __fmaf_rn, so parameters and state agree bit for bit,
 * with both CPU builds (AVX2 and baseline loops), and across a save / load of the
 * state mid-run. The sum of squares for clipping adds in another order (a fixed tree
 * of 512 x 256 partial sums on the GPU, 8 interleaved sums on the CPU): it equals bit
 * for bit the same tree computed here in the documented order, and the CPU's value to
 * 1e-12 relative (double sums of 10^5 squares in two orders differ by far less).
 */
#include "emu_test_util.h"
#include "optim/optim_test_util.h"

#include "optim/clip.h"
#include "optim/internal/optim_kernels.h"
#include "optim/optimizer.h"

#include <cuda_runtime.h>

#define N ((size_t)20011) /* 79 blocks, the last partial; 626 mask words, the last partial */
#define STEPS 12
#define NORM_BLOCKS 512 /* optim_cuda.cu's RT_OPTIM_NORM_BLOCKS */

static const rt_optim_range ranges[3] = {{0, 5}, {33, 64}, {N - 13, 13}}; /* straddling mask words */

/* an optimizer whose backend is the emulated CUDA one */
static void emu_optimizer_init(rt_optimizer *o, const rt_optim_config *c) {
    assert_rt_ok(rt_optimizer_init(o, c, rt_device_cpu(), N));
    o->backend->release(o);
    o->backend = &rt_optim_backend_cuda; /* rt_emu_optim_backend_cuda: the host-compiled table */
    assert_rt_ok(o->backend->init(o));
    assert_string_equal(o->backend->name, "cuda");
    assert_true((o->backend_state != NULL) == (c->n_no_decay > 0)); /* the decay mask */
}

static void run_config(const rt_optim_config *c, int resume_at, int generic) {
    float *p = rt_test_randn(N, 1.0f), *g = rt_test_randn(STEPS * N, 1.0f), *gp = rt_test_copy(p, N);
    rt_optimizer oc, og;
    assert_rt_ok(rt_optimizer_init(&oc, c, rt_device_cpu(), N));
    emu_optimizer_init(&og, c);
    rt_optim_cpu_force_generic(generic);
    for (int t = 0; t < STEPS; t++) {
        double lr = c->lr * (1.0 + 0.1 * t);
        if (t == resume_at) { /* the emulated optimizer's state, saved and loaded into a new one */
            int ns;
            int64_t k;
            float *saved = optim_test_save(&og, N, &ns, &k);
            rt_optimizer_free(&og);
            emu_optimizer_init(&og, c);
            optim_test_load(&og, saved, N, k);
        }
        assert_rt_ok(rt_optimizer_step(&oc, p, g + (size_t)t * N, lr, NULL));
        assert_rt_ok(rt_optimizer_step(&og, gp, g + (size_t)t * N, lr, NULL));
    }
    rt_optim_cpu_force_generic(0);
    char what[160];
    snprintf(what, sizeof what, "%s momentum %g nesterov %d wd %g amsgrad %d excluded %zu%s%s: params",
             rt_optim_kind_name(c->kind), c->momentum, c->nesterov, c->weight_decay, c->amsgrad, c->n_no_decay,
             resume_at >= 0 ? " resumed" : "", generic ? " (baseline CPU loops)" : "");
    et_check_exact(what, p, gp, N);
    assert_int_equal(rt_optimizer_state_count(&oc), rt_optimizer_state_count(&og));
    for (int i = 0; i < rt_optimizer_state_count(&oc); i++) {
        rt_optim_state sc, sg;
        assert_rt_ok(rt_optimizer_state_get(&oc, i, &sc));
        assert_rt_ok(rt_optimizer_state_find(&og, sc.name, &sg));
        snprintf(what, sizeof what, "  %s", sc.name);
        et_check_exact(what, sc.data, sg.data, N);
    }
    rt_optimizer_free(&oc);
    rt_optimizer_free(&og);
    free(p), free(g), free(gp);
}

static void test_optimizers(void **state) {
    (void)state;
    rt_optim_config cs[OPTIM_TEST_CONFIGS_MAX];
    int n;
    optim_test_configs(cs, &n, ranges);
    for (int i = 0; i < n; i++) {
        run_config(&cs[i], -1, 0);
        run_config(&cs[i], STEPS / 2, 0);
        run_config(&cs[i], -1, 1);
    }
}

/* ---- gradient norm and clipping ------------------------------------------------------ */

static void emu_clip_init(rt_grad_clip *c) {
    assert_rt_ok(rt_grad_clip_init(c, rt_device_cpu()));
    c->backend->clip_release(c);
    c->backend = &rt_optim_backend_cuda;
    assert_rt_ok(c->backend->clip_init(c));
}

/* optim_cuda.cu's documented order: thread t of block b adds x[i]^2 (fma in double)
 * for i = b*256 + t, + 512*256, ...; each block adds its 256 values in a tree
 * (w = 128, 64, ..., 1: s[t] += s[t + w]); one block of 512 then adds the partials in a
 * tree the same way */
static double tree_model(const float *x, size_t n) {
    enum { B = NORM_BLOCKS, T = 256 };
    static double part[B], sh[T];
    for (size_t b = 0; b < B; b++) {
        for (size_t t = 0; t < T; t++) {
            double acc = 0.0;
            for (size_t i = b * T + t; i < n; i += (size_t)B * T) acc = fma((double)x[i], (double)x[i], acc);
            sh[t] = acc;
        }
        for (size_t w = T / 2; w > 0; w >>= 1)
            for (size_t t = 0; t < w; t++) sh[t] = sh[t] + sh[t + w];
        part[b] = sh[0];
    }
    for (size_t w = B / 2; w > 0; w >>= 1)
        for (size_t t = 0; t < w; t++) part[t] = part[t] + part[t + w];
    return part[0];
}

static void test_sumsq(void **state) {
    (void)state;
    rt_grad_clip cg;
    emu_clip_init(&cg);
    /* several passes per thread (300007 > 512*256), one, fewer elements than threads */
    const size_t sizes[] = {300007, 1000, 1, 0};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *x = rt_test_randn(n, 2.0f);
        double out = NAN, again = NAN;
        assert_rt_ok(cg.backend->sumsq(&cg, x, n, NULL, &out));
        double model = tree_model(x, n), cpu = rt_optim_sumsq_cpu(x, n);
        printf("  sumsq n=%zu: emulated gpu %.17g tree model %.17g cpu %.17g\n", n, out, model, cpu);
        assert_true(memcmp(&out, &model, sizeof out) == 0); /* bit for bit: the documented tree */
        assert_true(fabs(out - cpu) <= 1e-12 * cpu);        /* another order of the same sum */
        if (si == 0) {
            assert_rt_ok(cg.backend->sumsq(&cg, x, n, NULL, &again));
            assert_true(memcmp(&out, &again, sizeof out) == 0); /* deterministic */
        }
        free(x);
    }
    rt_grad_clip_free(&cg);
}

/* test_gpu_optim.c's clipping case: norm, coefficient, scaled gradients, non-finite */
static void test_clip(void **state) {
    (void)state;
    const size_t n = 100003;
    float *gc = rt_test_randn(n, 2.0f), *gg = rt_test_copy(gc, n);
    rt_grad_clip cc, cg;
    assert_rt_ok(rt_grad_clip_init(&cc, rt_device_cpu()));
    emu_clip_init(&cg);
    rt_grad_stats a, b;
    assert_rt_ok(rt_grad_clip_norm(&cc, gc, n, 100.0, NULL, &a));
    assert_rt_ok(rt_grad_clip_norm(&cg, gg, n, 100.0, NULL, &b));
    printf("  norm cpu %.17g emulated gpu %.17g, coef %.9g %.9g\n", a.norm, b.norm, (double)a.clip_coef,
           (double)b.clip_coef);
    assert_true(fabs(a.norm - b.norm) <= 1e-12 * a.norm);
    assert_true(a.finite && b.finite && a.clipped && b.clipped);
    /* the sums differ only in order, so the float coefficients agree (to an ulp at worst) */
    assert_true(fabsf(a.clip_coef - b.clip_coef) <= 1e-6f * a.clip_coef);
    if (a.clip_coef == b.clip_coef) et_check_exact("clipped gradients (scale)", gc, gg, n);
    /* non-finite: reported, nothing scaled */
    memcpy(gc, gg, n * sizeof(float));
    gg[77777] = INFINITY;
    assert_rt_ok(rt_grad_clip_norm(&cg, gg, n, 1.0, NULL, &b));
    assert_false(b.finite);
    assert_false(b.clipped);
    gg[77777] = gc[77777];
    et_check_exact("not scaled when non-finite", gc, gg, n);
    gg[5] = NAN;
    assert_rt_ok(rt_grad_clip_norm(&cg, gg, n, 1.0, NULL, &b));
    assert_false(b.finite);
    rt_grad_clip_free(&cc);
    rt_grad_clip_free(&cg);
    free(gc), free(gg);
}

/* scaling alone, against the CPU's */
static void test_scale(void **state) {
    (void)state;
    const size_t n = 70001;
    float *x = rt_test_randn(n, 3.0f), *c = rt_test_copy(x, n);
    rt_grad_clip cg;
    emu_clip_init(&cg);
    rt_optim_scale_cpu(c, n, 0.3712f);
    assert_rt_ok(cg.backend->scale(&cg, x, n, 0.3712f, NULL));
    et_check_exact("scale", c, x, n);
    rt_grad_clip_free(&cg);
    free(x), free(c);
}

int main(void) {
    et_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
