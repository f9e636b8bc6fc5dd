/* Unit tests of src/optim without PyTorch: config and schedule validation (errors name
 * the field), hand-computed SGD/Adam/AdamW steps (first momentum step copies the
 * gradient, decoupled weight decay, excluded ranges), the state accessors and an exact
 * save/load round trip, gradient norm / clipping / non-finite check, schedule values
 * worked out by hand, and the AVX2 and baseline CPU loops giving identical bits. */
#include "optim_test_util.h"
#include "test_util.h"

#include "core/rng.h"
#include "optim/clip.h"
#include "optim/internal/optim_kernels.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#include <math.h>
#include <string.h>

static void assert_close(double got, double want, double tol) {
    if (!(fabs(got - want) <= tol * fmax(1.0, fabs(want)))) fail_msg("got %.12g want %.12g", got, want);
}

static void test_kind_names(void **state) {
    (void)state;
    rt_optim_kind k;
    assert_rt_ok(rt_optim_kind_parse("AdamW", &k));
    assert_int_equal(k, RT_OPTIM_ADAMW);
    assert_rt_ok(rt_optim_kind_parse("sgd", &k));
    assert_int_equal(k, RT_OPTIM_SGD);
    assert_rt_fails(rt_optim_kind_parse("rmsprop", &k), RT_ERR_INVALID,
                    "unknown optimizer 'rmsprop' (expected sgd | adam | adamw | adadelta)");
    assert_rt_fails(rt_optim_kind_parse(NULL, &k), RT_ERR_INVALID,
                    "no optimizer given (expected sgd | adam | adamw | adadelta)");
    for (int i = 0; i < RT_OPTIM_KIND_COUNT_; i++) { /* every name parses back to its kind */
        assert_rt_ok(rt_optim_kind_parse(rt_optim_kind_name((rt_optim_kind)i), &k));
        assert_int_equal(k, i);
    }
    assert_string_equal(rt_optim_kind_name(RT_OPTIM_ADAM), "adam");
    rt_sched_kind s;
    assert_rt_ok(rt_sched_kind_parse("OneCycle", &s));
    assert_int_equal(s, RT_SCHED_ONECYCLE);
    assert_rt_fails(rt_sched_kind_parse("poly", &s), RT_ERR_INVALID,
                    "unknown schedule 'poly' (expected constant | step | multistep | cosine | onecycle)");
    for (int i = 0; i < RT_SCHED_KIND_COUNT_; i++) {
        assert_rt_ok(rt_sched_kind_parse(rt_sched_kind_name((rt_sched_kind)i), &s));
        assert_int_equal(s, i);
    }
    assert_string_equal(rt_sched_kind_name(RT_SCHED_MULTISTEP), "multistep");
}

/* The rows (kinds.c): every kind has one, complete, under a distinct name, with valid
 * defaults; "auto" resolution and the momentum that one-cycle may cycle come from them. */
static void test_kind_rows(void **state) {
    (void)state;
    for (int i = 0; i < RT_OPTIM_KIND_COUNT_; i++) {
        const rt_optim_kind_ops *ops = rt_optim_kind_ops_of((rt_optim_kind)i);
        assert_non_null(ops);
        assert_non_null(ops->name);
        assert_non_null(ops->defaults);
        assert_non_null(ops->states);
        assert_non_null(ops->state_hint);
        assert_non_null(ops->scalars);
        assert_non_null(ops->cpu);
        assert_true((ops->has_momentum == NULL) == (ops->set_momentum == NULL));
        for (int j = 0; j < i; j++) assert_string_not_equal(ops->name, rt_optim_kind_ops_of((rt_optim_kind)j)->name);
        rt_optim_config c;
        rt_optim_config_default(&c, (rt_optim_kind)i);
        assert_int_equal(c.kind, i);
        assert_rt_ok(rt_optim_config_validate(&c, 4)); /* the defaults are valid */
        const char *names[RT_OPTIM_MAX_STATE];
        c.amsgrad = true, c.momentum = 0.9;
        int ns = ops->states(&c, names);
        assert_true(ns >= 0 && ns < RT_OPTIM_MAX_STATE);
    }
    assert_null(rt_optim_kind_ops_of(RT_OPTIM_KIND_COUNT_));
    assert_null(rt_optim_kind_ops_of((rt_optim_kind)-1));
    char list[64];
    assert_string_equal(rt_optim_kind_list(list, sizeof list), "sgd | adam | adamw | adadelta");

    /* auto (NaN) keys take the kind's defaults, set ones stay */
    rt_optim_config c;
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    c.kind = RT_OPTIM_ADADELTA, c.lr = NAN, c.eps = NAN, c.weight_decay = NAN;
    assert_rt_ok(rt_optim_config_resolve(&c));
    assert_true(c.lr == 1.0 && c.eps == 1e-6 && c.weight_decay == 0);
    c.kind = RT_OPTIM_ADAMW, c.lr = 0.5, c.eps = NAN, c.weight_decay = NAN;
    assert_rt_ok(rt_optim_config_resolve(&c));
    assert_true(c.lr == 0.5 && c.eps == 1e-8 && c.weight_decay == 1e-2);
    c.kind = RT_OPTIM_KIND_COUNT_;
    assert_rt_fails(rt_optim_config_resolve(&c), RT_ERR_INVALID, "expected sgd | adam | adamw | adadelta");
    assert_rt_fails(rt_optim_config_validate(&c, 4), RT_ERR_INVALID, "optim.name: unknown optimizer");

    /* what one-cycle may cycle */
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    assert_false(rt_optim_config_has_momentum(&c));
    c.momentum = 0.9;
    assert_true(rt_optim_config_has_momentum(&c));
    rt_optim_config_default(&c, RT_OPTIM_ADAM);
    assert_true(rt_optim_config_has_momentum(&c));
    rt_optim_config_default(&c, RT_OPTIM_ADAMW);
    assert_true(rt_optim_config_has_momentum(&c));
    rt_optim_config_default(&c, RT_OPTIM_ADADELTA);
    assert_false(rt_optim_config_has_momentum(&c));
    c.kind = RT_OPTIM_KIND_COUNT_;
    assert_false(rt_optim_config_has_momentum(&c));
    assert_false(rt_optim_config_has_momentum(NULL));
}

static void test_config_validation(void **state) {
    (void)state;
    rt_optimizer opt;
    rt_optim_config c;
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    c.nesterov = true;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "optim.nesterov");
    c.momentum = 0.9, c.dampening = 0.1;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "dampening");
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    c.lr = -1;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "optim.lr");
    c.lr = NAN;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "optim.lr");
    rt_optim_config_default(&c, RT_OPTIM_ADAM);
    c.betas[1] = 1.0;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "optim.betas[1]");
    rt_optim_config_default(&c, RT_OPTIM_ADAMW);
    c.weight_decay = -0.1;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "optim.weight_decay");
    rt_optim_config_default(&c, RT_OPTIM_ADAMW);
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 0), RT_ERR_INVALID, "empty");
    rt_optim_range r[2] = {{4, 4}, {7, 2}};
    c.no_decay = r, c.n_no_decay = 2;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "overlap");
    r[1] = (rt_optim_range){8, 3};
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "outside the arena");
    c.no_decay = NULL;
    assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cpu(), 10), RT_ERR_INVALID, "no array");
    if (!rt_cuda_built()) {
        rt_optim_config_default(&c, RT_OPTIM_SGD);
        assert_rt_fails(rt_optimizer_init(&opt, &c, rt_device_cuda(0), 10), RT_ERR_UNSUPPORTED, "without CUDA");
    }
    /* a failed init leaves nothing to free, and free of a zeroed optimizer is harmless */
    rt_optimizer_free(&opt);
    assert_rt_fails(rt_optimizer_step(&opt, NULL, NULL, 0.1, NULL), RT_ERR_INVALID, "not initialised");
}

/* SGD by hand: p=1, g=0.5, lr=0.1, momentum 0.9, dampening 0.5, weight decay 0.1 on
 * element 0 only (element 1 excluded). */
static void test_sgd_by_hand(void **state) {
    (void)state;
    rt_optim_config c;
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    c.lr = 0.1, c.momentum = 0.9, c.dampening = 0.5, c.weight_decay = 0.1;
    rt_optim_range r = {1, 1};
    c.no_decay = &r, c.n_no_decay = 1;
    rt_optimizer opt;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 2));
    float p[2] = {1, 1}, g[2] = {0.5f, 0.5f};
    assert_rt_ok(rt_optimizer_step(&opt, p, g, -1, NULL));
    /* step 1: d = g + wd*p = 0.6 (element 1: 0.5); buf = d (no dampening); p -= lr*buf */
    assert_close(p[0], 1 - 0.1 * 0.6, 1e-7);
    assert_close(p[1], 1 - 0.1 * 0.5, 1e-7);
    assert_close(opt.state[0][0], 0.6, 1e-7);
    /* step 2 with lr 0.2: d = 0.5 + 0.1*0.94 = 0.594; buf = 0.9*0.6 + 0.5*0.594 = 0.837 */
    assert_rt_ok(rt_optimizer_step(&opt, p, g, 0.2, NULL));
    assert_close(opt.state[0][0], 0.9 * 0.6 + 0.5 * 0.594, 1e-6);
    assert_close(p[0], 0.94 - 0.2 * 0.837, 1e-6);
    assert_close(opt.state[0][1], 0.9 * 0.5 + 0.5 * 0.5, 1e-6);
    assert_close(p[1], 0.95 - 0.2 * 0.7, 1e-6);
    assert_int_equal(rt_optimizer_get_steps(&opt), 2);
    rt_optimizer_free(&opt);

    /* the arena form: sizes and devices are checked */
    rt_arena pa, ga;
    rt_arena_init(&pa, rt_device_cpu());
    rt_arena_init(&ga, rt_device_cpu());
    size_t o1, o2;
    assert_rt_ok(rt_arena_push(&pa, 3 * sizeof(float), 64, &o1));
    assert_rt_ok(rt_arena_push(&ga, 3 * sizeof(float), 64, &o2));
    assert_rt_ok(rt_arena_alloc(&pa));
    assert_rt_ok(rt_arena_alloc(&ga));
    size_t n = pa.size / sizeof(float);
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), n));
    ((float *)pa.base)[0] = 1, ((float *)ga.base)[0] = 2;
    assert_rt_ok(rt_optimizer_step_arena(&opt, &pa, &ga, 0.5, NULL));
    assert_true(((float *)pa.base)[0] == 0.0f);
    rt_optimizer_free(&opt);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), n + 1));
    assert_rt_fails(rt_optimizer_step_arena(&opt, &pa, &ga, 0.5, NULL), RT_ERR_INVALID, "arenas of");
    rt_optimizer_free(&opt);
    rt_arena_free(&pa);
    rt_arena_free(&ga);

    /* nesterov: step 1 d = g + momentum*buf = g*(1+m) */
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    c.lr = 0.1, c.momentum = 0.5, c.nesterov = true;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 1));
    float q = 2, h = 1;
    assert_rt_ok(rt_optimizer_step(&opt, &q, &h, -1, NULL));
    assert_close(q, 2 - 0.1 * 1.5, 1e-7);
    rt_optimizer_free(&opt);
}

static void test_adam_by_hand(void **state) {
    (void)state;
    rt_optim_config c;
    rt_optimizer opt;
    /* AdamW with a zero gradient: the moments stay 0, only the decoupled decay acts */
    rt_optim_config_default(&c, RT_OPTIM_ADAMW);
    c.lr = 0.1, c.weight_decay = 0.5;
    rt_optim_range r = {2, 1};
    c.no_decay = &r, c.n_no_decay = 1;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 3));
    float p[3] = {1, -2, 3}, g[3] = {0, 0, 0};
    assert_rt_ok(rt_optimizer_step(&opt, p, g, -1, NULL));
    assert_close(p[0], 0.95, 1e-7);
    assert_close(p[1], -1.9, 1e-7);
    assert_true(p[2] == 3.0f); /* excluded */
    rt_optimizer_free(&opt);
    /* Adam, L2 decay with g = 0: g' = wd*p, step 1: m_hat = g', v_hat = g'^2, so the
     * update is -lr * g'/(|g'| + eps) = -lr*sign(p) (nearly) */
    rt_optim_config_default(&c, RT_OPTIM_ADAM);
    c.lr = 0.1, c.weight_decay = 0.5;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 3));
    float q[3] = {1, -2, 3};
    assert_rt_ok(rt_optimizer_step(&opt, q, g, -1, NULL));
    assert_close(q[0], 0.9, 1e-6);
    assert_close(q[1], -1.9, 1e-6);
    assert_close(q[2], 2.9, 1e-6);
    assert_close(opt.state[0][0], 0.1 * 0.5, 1e-7);   /* exp_avg = (1-b1) g' */
    assert_close(opt.state[1][1], 0.001 * 1.0, 1e-7); /* exp_avg_sq = (1-b2) g'^2 */
    rt_optimizer_free(&opt);
    /* amsgrad keeps the running max of v: a big gradient then small ones */
    rt_optim_config_default(&c, RT_OPTIM_ADAM);
    c.amsgrad = true;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 1));
    float x = 0, big = 10, small = 0.1f;
    assert_rt_ok(rt_optimizer_step(&opt, &x, &big, -1, NULL));
    float vmax1 = opt.state[2][0];
    assert_close(vmax1, 0.001 * 100, 1e-6);
    assert_rt_ok(rt_optimizer_step(&opt, &x, &small, -1, NULL));
    assert_true(opt.state[2][0] == vmax1);
    assert_true(opt.state[1][0] < vmax1);
    rt_optimizer_free(&opt);
}

static void test_state_accessors(void **state) {
    (void)state;
    rt_optim_config c;
    rt_optimizer opt;
    rt_optim_state st;
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 5));
    assert_int_equal(rt_optimizer_state_count(&opt), 0);
    assert_rt_fails(rt_optimizer_state_find(&opt, "momentum_buffer", &st), RT_ERR_INVALID, "momentum > 0");
    rt_optimizer_free(&opt);
    c.momentum = 0.9;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 5));
    assert_int_equal(rt_optimizer_state_count(&opt), 1);
    assert_rt_ok(rt_optimizer_state_get(&opt, 0, &st));
    assert_string_equal(st.name, "momentum_buffer");
    assert_int_equal(st.count, 5);
    assert_int_equal(rt_tensor_numel(&st.tensor), 5);
    assert_ptr_equal(rt_tensor_data(&st.tensor), st.data);
    assert_rt_fails(rt_optimizer_state_get(&opt, 1, &st), RT_ERR_INVALID, "state index 1");
    float buf[4] = {0};
    assert_rt_fails(rt_optimizer_state_load(&opt, "momentum_buffer", buf, 4), RT_ERR_INVALID, "has 5 floats");
    assert_rt_fails(rt_optimizer_set_steps(&opt, -1), RT_ERR_INVALID, "step");
    assert_rt_ok(rt_optimizer_set_momentum(&opt, 0.8));
    assert_true(opt.cfg.momentum == 0.8);
    rt_optimizer_free(&opt);
    rt_optim_config_default(&c, RT_OPTIM_ADAMW);
    c.amsgrad = true;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 5));
    const char *want[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    assert_int_equal(rt_optimizer_state_count(&opt), 3);
    for (int i = 0; i < 3; i++) {
        assert_rt_ok(rt_optimizer_state_get(&opt, i, &st));
        assert_string_equal(st.name, want[i]);
    }
    assert_rt_fails(rt_optimizer_set_momentum(&opt, 1.0), RT_ERR_INVALID, "betas[0]");
    rt_optimizer_free(&opt);
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 5));
    assert_rt_fails(rt_optimizer_set_momentum(&opt, 0.9), RT_ERR_INVALID, "momentum");
    rt_optimizer_free(&opt);
    /* Adadelta: PyTorch's defaults, its state names, its checks */
    rt_optim_config_default(&c, RT_OPTIM_ADADELTA);
    assert_true(c.lr == 1.0 && c.rho == 0.9 && c.eps == 1e-6 && c.weight_decay == 0);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 5));
    assert_int_equal(rt_optimizer_state_count(&opt), 2);
    assert_rt_ok(rt_optimizer_state_get(&opt, 0, &st));
    assert_string_equal(st.name, "square_avg");
    assert_rt_ok(rt_optimizer_state_get(&opt, 1, &st));
    assert_string_equal(st.name, "acc_delta");
    assert_rt_fails(rt_optimizer_set_momentum(&opt, 0.9), RT_ERR_INVALID, "adadelta has no momentum");
    rt_optimizer_free(&opt);
    c.rho = 1.5;
    assert_rt_fails(rt_optim_config_validate(&c, 5), RT_ERR_INVALID, "optim.rho: 1.5");
    c.rho = 0.9, c.eps = -1;
    assert_rt_fails(rt_optim_config_validate(&c, 5), RT_ERR_INVALID, "optim.eps");
    /* the moving average: a state buffer "ema" after the optimizer's own, swapped with the params */
    rt_optim_config_default(&c, RT_OPTIM_ADAM);
    c.ema_decay = 1.0;
    assert_rt_fails(rt_optim_config_validate(&c, 5), RT_ERR_INVALID, "train.ema_decay: 1");
    c.ema_decay = 0.5, c.ema_every = 2;
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 3));
    assert_int_equal(rt_optimizer_state_count(&opt), 3);
    assert_rt_ok(rt_optimizer_state_get(&opt, 2, &st));
    assert_string_equal(st.name, "ema");
    float p3[3] = {1, 2, 3}, g3[3] = {0, 0, 0};
    assert_rt_ok(rt_optimizer_step(&opt, p3, g3, 0.0, NULL)); /* step 1: no update (every 2) */
    assert_true(rt_optimizer_ema(&opt)[0] == 0.0f);
    assert_rt_ok(rt_optimizer_step(&opt, p3, g3, 0.0, NULL)); /* step 2: the first update copies */
    assert_true(rt_optimizer_ema(&opt)[2] == 3.0f);
    p3[2] = 5;
    assert_rt_ok(rt_optimizer_step(&opt, p3, g3, 0.0, NULL));
    assert_rt_ok(rt_optimizer_step(&opt, p3, g3, 0.0, NULL)); /* step 4: 0.5*3 + 0.5*5 */
    assert_true(rt_optimizer_ema(&opt)[2] == 4.0f);
    assert_rt_ok(rt_optimizer_ema_swap(&opt, p3, NULL));
    assert_true(p3[2] == 4.0f && rt_optimizer_ema(&opt)[2] == 5.0f);
    rt_optimizer_free(&opt);
    rt_optim_config_default(&c, RT_OPTIM_SGD);
    assert_rt_ok(rt_optimizer_init(&opt, &c, rt_device_cpu(), 3));
    assert_null(rt_optimizer_ema(&opt));
    assert_rt_fails(rt_optimizer_ema_swap(&opt, p3, NULL), RT_ERR_INVALID, "train.ema_decay is 0");
    rt_optimizer_free(&opt);
}

/* Run `steps` steps; at `resume_at` (> 0) save everything, destroy, rebuild, load. */
static void trajectory(const rt_optim_config *c, size_t n, int steps, int resume_at, float *p_out) {
    rt_optimizer opt;
    assert_rt_ok(rt_optimizer_init(&opt, c, rt_device_cpu(), n));
    float *g = malloc(n * sizeof *g);
    rt_rng rng;
    rt_rng_init(&rng, 99, 1);
    rt_rng_normal(&rng, p_out, n, 0, 1);
    for (int s = 0; s < steps; s++) {
        if (s == resume_at) {
            int ns = rt_optimizer_state_count(&opt);
            float *saved = malloc((size_t)ns * n * sizeof *saved);
            rt_optim_state st;
            for (int i = 0; i < ns; i++) {
                assert_rt_ok(rt_optimizer_state_get(&opt, i, &st));
                assert_rt_ok(rt_optimizer_state_save(&opt, st.name, saved + (size_t)i * n, n));
            }
            int64_t k = rt_optimizer_get_steps(&opt);
            rt_optimizer_free(&opt);
            assert_rt_ok(rt_optimizer_init(&opt, c, rt_device_cpu(), n));
            for (int i = 0; i < ns; i++) {
                assert_rt_ok(rt_optimizer_state_get(&opt, i, &st));
                assert_rt_ok(rt_optimizer_state_load(&opt, st.name, saved + (size_t)i * n, n));
            }
            assert_rt_ok(rt_optimizer_set_steps(&opt, k));
            free(saved);
        }
        rt_rng_normal(&rng, g, n, 0, 1);
        assert_rt_ok(rt_optimizer_step(&opt, p_out, g, 0.01 * (1 + s % 3), NULL));
    }
    free(g);
    rt_optimizer_free(&opt);
}

static void test_save_load_exact(void **state) {
    (void)state;
    enum { N = 1003 };
    rt_optim_range r[2] = {{10, 100}, {500, 37}};
    rt_optim_config cs[5];
    rt_optim_config_default(&cs[0], RT_OPTIM_SGD);
    cs[0].momentum = 0.9, cs[0].nesterov = true, cs[0].weight_decay = 1e-2, cs[0].no_decay = r, cs[0].n_no_decay = 2;
    rt_optim_config_default(&cs[1], RT_OPTIM_SGD);
    cs[1].momentum = 0.9, cs[1].dampening = 0.3;
    rt_optim_config_default(&cs[2], RT_OPTIM_ADAM);
    cs[2].amsgrad = true, cs[2].weight_decay = 1e-3;
    rt_optim_config_default(&cs[3], RT_OPTIM_ADAMW);
    cs[3].no_decay = r, cs[3].n_no_decay = 2;
    rt_optim_config_default(&cs[4], RT_OPTIM_ADADELTA);
    cs[4].weight_decay = 1e-2, cs[4].no_decay = r, cs[4].n_no_decay = 2;
    float a[N], b[N], c[N];
    for (int i = 0; i < 5; i++) {
        trajectory(&cs[i], N, 20, -1, a);
        trajectory(&cs[i], N, 20, 9, b);
        trajectory(&cs[i], N, 20, 1, c); /* right after the first (copying) step */
        assert_memory_equal(a, b, sizeof a);
        assert_memory_equal(a, c, sizeof a);
    }
}

/* The AVX2+FMA loops (with the intrinsic Adam) and the baseline ones give the same bits,
 * on lengths that exercise the 8-wide body and every tail. */
static void test_cpu_variants_equal(void **state) {
    (void)state;
    rt_optim_config cs[5];
    rt_optim_config_default(&cs[0], RT_OPTIM_SGD);
    cs[0].momentum = 0.9, cs[0].weight_decay = 1e-2;
    rt_optim_config_default(&cs[1], RT_OPTIM_ADAM);
    cs[1].weight_decay = 1e-2, cs[1].amsgrad = true;
    rt_optim_config_default(&cs[2], RT_OPTIM_ADAMW);
    rt_optim_config_default(&cs[3], RT_OPTIM_ADAMW);
    cs[3].amsgrad = true;
    rt_optim_config_default(&cs[4], RT_OPTIM_ADADELTA);
    cs[4].weight_decay = 1e-2;
    for (size_t n = 1; n <= 41; n += 5) {
        for (int i = 0; i < 5; i++) {
            float a[41], b[41];
            rt_optim_cpu_force_generic(1);
            trajectory(&cs[i], n, 7, -1, a);
            rt_optim_cpu_force_generic(0);
            trajectory(&cs[i], n, 7, -1, b);
            assert_memory_equal(a, b, n * sizeof(float));
        }
    }
    float x[37];
    for (int i = 0; i < 37; i++) x[i] = (float)(i - 18) * 0.37f;
    rt_optim_cpu_force_generic(1);
    double s1 = rt_optim_sumsq_cpu(x, 37);
    rt_optim_cpu_force_generic(0);
    assert_true(s1 == rt_optim_sumsq_cpu(x, 37));
}

/* a "pool" that runs the tasks last to first, with the pool pointer checked */
static int g_parallel_calls;
static void reverse_parallel(void *pool, int ntasks, void (*fn)(void *arg, int task), void *arg) {
    assert_ptr_equal(pool, &g_parallel_calls);
    g_parallel_calls++;
    for (int t = ntasks - 1; t >= 0; t--) fn(arg, t);
}

/* A CPU step split into chunks (rt_optimizer_set_parallel) gives the bits of the whole
 * arena in one pass: every configuration, excluded ranges that cross the chunks'
 * boundaries (chunks are 2^18 floats), three steps. */
static void test_parallel_step_equal(void **state) {
    (void)state;
    const size_t n = 3 * ((size_t)1 << 18) + 12345, K = (size_t)1 << 18;
    const rt_optim_range ranges[3] = {{K - 100, 300}, {2 * K - 5, K + 10}, {n - 7, 7}};
    rt_optim_config cs[OPTIM_TEST_CONFIGS_MAX];
    int count = 0;
    optim_test_configs(cs, &count, ranges);
    float *p[2], *g = malloc(n * sizeof(float));
    assert_non_null(g);
    for (int k = 0; k < 2; k++) assert_non_null(p[k] = malloc(n * sizeof(float)));
    for (int c = 0; c < count; c++) {
        rt_optimizer opt[2];
        for (int k = 0; k < 2; k++) {
            for (size_t i = 0; i < n; i++) p[k][i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
            assert_rt_ok(rt_optimizer_init(&opt[k], &cs[c], rt_device_cpu(), n));
        }
        rt_optimizer_set_parallel(&opt[1], reverse_parallel, &g_parallel_calls);
        g_parallel_calls = 0;
        for (int step = 0; step < 3; step++) {
            for (size_t i = 0; i < n; i++) g[i] = (float)(((i + step) * 40503u) % 997) * 1e-3f - 0.4f;
            for (int k = 0; k < 2; k++) assert_rt_ok(rt_optimizer_step(&opt[k], p[k], g, -1.0, NULL));
        }
        assert_int_equal(g_parallel_calls, 3);
        assert_memory_equal(p[0], p[1], n * sizeof(float));
        for (int i = 0; i < opt[0].n_state; i++)
            assert_memory_equal(opt[0].state[i], opt[1].state[i], n * sizeof(float));
        for (int k = 0; k < 2; k++) rt_optimizer_free(&opt[k]);
    }
    free(g), free(p[0]), free(p[1]);
}

static void test_clip(void **state) {
    (void)state;
    rt_grad_clip c;
    assert_rt_ok(rt_grad_clip_init(&c, rt_device_cpu()));
    rt_grad_stats st;
    float g[3] = {3, 4, 0};
    assert_rt_ok(rt_grad_clip_norm(&c, g, 3, 10.0, NULL, &st));
    assert_true(st.finite && !st.clipped && st.clip_coef == 1.0f);
    assert_close(st.norm, 5.0, 1e-15);
    assert_true(g[0] == 3 && g[1] == 4);
    assert_rt_ok(rt_grad_clip_norm(&c, g, 3, 1.0, NULL, &st));
    assert_true(st.finite && st.clipped);
    assert_true(st.clip_coef == 1.0f / (5.0f + 1e-6f));
    assert_close(g[0], 0.6, 1e-6);
    assert_close(g[1], 0.8, 1e-6);
    /* check only */
    float h[2] = {30, 40};
    assert_rt_ok(rt_grad_clip_norm(&c, h, 2, 0.0, NULL, &st));
    assert_true(st.finite && !st.clipped && h[0] == 30);
    /* huge but finite: squares overflow float, not the double sum */
    float big[2] = {3e30f, 4e30f};
    assert_rt_ok(rt_grad_clip_norm(&c, big, 2, 1.0, NULL, &st));
    assert_true(st.finite && st.clipped);
    assert_close(st.norm, 5e30, 1e-6);
    /* non-finite: reported, nothing scaled */
    float bad[5] = {1, 2, INFINITY, 4, 5};
    assert_rt_ok(rt_grad_clip_norm(&c, bad, 5, 1.0, NULL, &st));
    assert_false(st.finite);
    assert_false(st.clipped);
    assert_true(bad[0] == 1 && bad[4] == 5);
    bad[2] = NAN;
    assert_rt_ok(rt_grad_clip_norm(&c, bad, 5, 1.0, NULL, &st));
    assert_false(st.finite);
    assert_rt_fails(rt_grad_clip_norm(&c, bad, 5, NAN, NULL, &st), RT_ERR_INVALID, "clip_grad_norm");
    double norm;
    assert_rt_ok(rt_grad_norm(&c, g, 0, NULL, &norm));
    assert_true(norm == 0);
    rt_grad_clip_free(&c);
}

static void test_schedule_validation(void **state) {
    (void)state;
    rt_schedule s;
    rt_schedule_default(&s, RT_SCHED_STEP, 0.1);
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.step_size");
    rt_schedule_default(&s, RT_SCHED_COSINE, 0.1);
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.t_max");
    rt_schedule_default(&s, RT_SCHED_MULTISTEP, 0.1);
    s.milestones[0] = 5, s.milestones[1] = 3, s.n_milestones = 2;
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.milestones[1]");
    rt_schedule_default(&s, RT_SCHED_ONECYCLE, 0.1);
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.total_steps");
    s.total_steps = 100, s.warmup_steps = 5;
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.warmup_steps");
    s.warmup_steps = 0, s.total_steps = 2;
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "empty phase");
    rt_schedule_default(&s, RT_SCHED_CONSTANT, 0.1);
    s.warmup_steps = 3, s.warmup_start_factor = 0;
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.warmup_start_factor");
    rt_schedule_default(&s, RT_SCHED_CONSTANT, 0.1);
    s.per_epoch = true, s.steps_per_epoch = 0;
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.steps_per_epoch");
    rt_schedule_default(&s, RT_SCHED_CONSTANT, -0.1);
    assert_rt_fails(rt_schedule_validate(&s), RT_ERR_INVALID, "optim.lr");
}

static void test_schedule_values(void **state) {
    (void)state;
    rt_schedule s;
    rt_schedule_default(&s, RT_SCHED_STEP, 0.1);
    s.step_size = 7, s.gamma = 0.5;
    assert_rt_ok(rt_schedule_validate(&s));
    assert_close(rt_schedule_lr(&s, 0), 0.1, 1e-15);
    assert_close(rt_schedule_lr(&s, 6), 0.1, 1e-15);
    assert_close(rt_schedule_lr(&s, 7), 0.05, 1e-15);
    assert_close(rt_schedule_lr(&s, 14), 0.025, 1e-15);
    /* per epoch: 10 iterations an epoch, so iteration 69 is epoch 6, 70 epoch 7 */
    s.per_epoch = true, s.steps_per_epoch = 10;
    assert_close(rt_schedule_lr(&s, 69), 0.1, 1e-15);
    assert_close(rt_schedule_lr(&s, 70), 0.05, 1e-15);
    /* warmup 4 from 0.25*base, then cosine to eta_min over t_max = 8 */
    rt_schedule_default(&s, RT_SCHED_COSINE, 1.0);
    s.t_max = 8, s.eta_min = 0.1, s.warmup_steps = 4, s.warmup_start_factor = 0.25;
    assert_rt_ok(rt_schedule_validate(&s));
    assert_close(rt_schedule_lr(&s, 0), 0.25, 1e-15);
    assert_close(rt_schedule_lr(&s, 2), 0.625, 1e-15);
    assert_close(rt_schedule_lr(&s, 4), 1.0, 1e-15);
    assert_close(rt_schedule_lr(&s, 8), 0.55, 1e-15); /* half way: (1 + 0.1) / 2 */
    assert_close(rt_schedule_lr(&s, 12), 0.1, 1e-15);
    double m;
    assert_false(rt_schedule_momentum(&s, 3, &m));
    /* multistep */
    rt_schedule_default(&s, RT_SCHED_MULTISTEP, 1.0);
    s.milestones[0] = 2, s.milestones[1] = 5, s.n_milestones = 2, s.gamma = 0.1;
    assert_close(rt_schedule_lr(&s, 1), 1.0, 1e-15);
    assert_close(rt_schedule_lr(&s, 2), 0.1, 1e-15);
    assert_close(rt_schedule_lr(&s, 5), 0.01, 1e-15);
    /* one-cycle: max_lr/25 at 0, max_lr at pct_start*total - 1, max_lr/25/1e4 at the end */
    rt_schedule_default(&s, RT_SCHED_ONECYCLE, 0.0);
    s.max_lr = 0.5, s.total_steps = 101;
    assert_rt_ok(rt_schedule_validate(&s));
    assert_close(rt_schedule_lr(&s, 0), 0.02, 1e-15);
    /* phase 1 ends at 0.3*101 - 1 = 29.3: step 29 is at pct 29/29.3 of the cosine rise */
    assert_close(rt_schedule_lr(&s, 29), 0.5 - (0.5 - 0.02) / 2 * (1 + cos(M_PI * 29 / 29.3)), 1e-12);
    assert_close(rt_schedule_lr(&s, 30), 0.5 - (0.5 - 0.02e-4) / 2 * (1 - cos(M_PI * 0.7 / 70.7)), 1e-12);
    assert_close(rt_schedule_lr(&s, 100), 0.02 / 1e4, 1e-12);
    assert_close(rt_schedule_lr(&s, 1000), rt_schedule_lr(&s, 101), 0); /* held past the end */
    assert_true(rt_schedule_momentum(&s, 0, &m));
    assert_close(m, 0.95, 1e-15);
    assert_true(rt_schedule_momentum(&s, 100, &m));
    assert_close(m, 0.95, 1e-12);
    /* the constant schedule is the base lr */
    rt_schedule_default(&s, RT_SCHED_CONSTANT, 0.3);
    assert_close(rt_schedule_lr(&s, 12345), 0.3, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names),          cmocka_unit_test(test_kind_rows),
        cmocka_unit_test(test_config_validation),   cmocka_unit_test(test_sgd_by_hand),
        cmocka_unit_test(test_adam_by_hand),        cmocka_unit_test(test_state_accessors),
        cmocka_unit_test(test_save_load_exact),     cmocka_unit_test(test_cpu_variants_equal),
        cmocka_unit_test(test_parallel_step_equal), cmocka_unit_test(test_clip),
        cmocka_unit_test(test_schedule_validation), cmocka_unit_test(test_schedule_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
