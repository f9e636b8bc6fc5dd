/* Helpers shared by the model tests: a CPU context, random fills, a finite-difference
 * checker, and layers with their own little parameter arenas. */
#ifndef RT_MODEL_TEST_UTIL_H
#define RT_MODEL_TEST_UTIL_H

#include "test_util.h"

#include "core/rng.h"
#include "model/layers.h"
#include "model/model.h"

#include <math.h>
#include <string.h>

static inline rt_model_ctx *mt_ctx(int threads) {
    rt_model_ctx *ctx = NULL;
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = threads};
    assert_rt_ok(rt_model_ctx_create(&o, &ctx));
    return ctx;
}

/* A shared 2-thread CPU context for a test file: cmocka group setup/teardown. */
static rt_model_ctx *g_ctx;
static inline int mt_group_setup(void **state) {
    (void)state;
    g_ctx = mt_ctx(2);
    return 0;
}
static inline int mt_group_teardown(void **state) {
    (void)state;
    rt_model_ctx_destroy(g_ctx);
    return 0;
}

static inline void mt_randn(float *x, size_t n, uint64_t seed) {
    rt_rng r;
    rt_rng_init(&r, seed, 7);
    rt_rng_normal(&r, x, n, 0.0f, 1.0f);
}

static inline double mt_dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* The scalar function checked: evaluates the layer at the current data. */
typedef double (*mt_eval_fn)(void *user);

/* Central differences at `samples` indices of a[0..n) (all when n <= samples) against
 * the analytic gradient g. A sample passes when |num - ana| <= atol + rtol * max|g|.
 * Returns the number of failing samples (printing the first few). */
static inline int mt_fd_check(const char *what, float *a, const float *g, size_t n, int samples, float eps, double rtol,
                              double atol, mt_eval_fn eval, void *user) {
    double gmax = 0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
    int fails = 0, checked = 0;
    size_t step = n <= (size_t)samples ? 1 : n / (size_t)samples;
    for (size_t i = (n <= (size_t)samples ? 0 : step / 2); i < n; i += step) {
        float keep = a[i];
        a[i] = keep + eps;
        double lp = eval(user);
        a[i] = keep - eps;
        double lm = eval(user);
        a[i] = keep;
        double num = (lp - lm) / (2.0 * eps);
        checked++;
        if (fabs(num - g[i]) > atol + rtol * gmax) {
            if (fails < 5)
                print_message("%s[%zu]: numeric %.6g analytic %.6g (max |g| %.4g)\n", what, i, num, (double)g[i], gmax);
            fails++;
        }
    }
    if (checked == 0) fail_msg("%s: nothing checked", what);
    return fails;
}

/* A parameter arena pair for a standalone layer. */
typedef struct mt_arenas {
    rt_arena params, grads, buffers;
} mt_arenas;

static inline void mt_arenas_init(mt_arenas *A) {
    rt_arena_init(&A->params, rt_device_cpu());
    rt_arena_init(&A->grads, rt_device_cpu());
    rt_arena_init(&A->buffers, rt_device_cpu());
}
static inline void mt_place(mt_arenas *A, rt_tensor *v, rt_tensor *g) {
    assert_rt_ok(rt_tensor_place(v, &A->params));
    if (g) *g = rt_tensor_in(v, &A->grads);
}
static inline void mt_alloc(mt_arenas *A) {
    A->grads.size = A->params.size;
    assert_rt_ok(rt_arena_alloc(&A->params));
    assert_rt_ok(rt_arena_alloc(&A->grads));
    assert_rt_ok(rt_arena_alloc(&A->buffers));
}
static inline void mt_free(mt_arenas *A) {
    rt_arena_free(&A->params);
    rt_arena_free(&A->grads);
    rt_arena_free(&A->buffers);
}

#endif
