/* The optimizer's CUDA kernels (src/optim/cuda/optim_cuda.cu), compiled as host code
 * through the CUDA emulation, against the CPU loops (src/optim/cpu/optim_cpu.c) on the
 * configurations of tests/optim/test_gpu_optim.c: SGD plain / momentum + dampening +
 * weight decay / nesterov with excluded ranges, Adam, Adam + weight decay + amsgrad
 * with excluded ranges, AdamW, AdamW + amsgrad. Both sides get the same float
 * coefficients (rt_optim_scalars, computed here as optimizer.c does) for 12 steps
 * with a changing learning rate; the CPU walks the decayed and excluded stretches as
 * optimizer.c does, the kernel reads the bit mask, with ranges that straddle mask words.
 *
 * Agreement: optim_cuda.cu spells every operation with a rounding intrinsic and the CPU
 * uses fmaf where the kernel uses __fmaf_rn, so parameters and state must agree bit
 * for bit (both CPU builds: the AVX2 one and the baseline one). The sum of squares for
 * clipping adds in another order (a fixed tree on the GPU, 8 interleaved sums on the
 * CPU): it must equal, bit for bit, the same tree computed here in the documented
 * order, and the CPU's value to 1e-12 relative (double sums of 300k squares in two
 * orders differ by far less). Scaling is bit for bit.
 */
#include "emu_test_util.h"

#include "optim/optim_kernels.h"

#include <cuda_runtime.h>

#define N ((size_t)20011) /* 79 blocks, the last partial; 626 mask words, the last partial */
#define STEPS 12

typedef struct range {
    size_t offset, count;
} range;
static const range ranges[3] = {{0, 5}, {33, 64}, {N - 13, 13}};

typedef struct config {
    const char *name;
    int adam, adamw;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    int nesterov, amsgrad, excluded;
} config;

static const config configs[] = {
    {"sgd", 0, 0, 0.01, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"sgd momentum dampening wd", 0, 0, 0.01, 0.9, 0.2, 1e-2, 0, 0, 0, 0, 0, 0},
    {"sgd nesterov wd excluded", 0, 0, 0.01, 0.9, 0, 5e-4, 0, 0, 0, 1, 0, 1},
    {"adam", 1, 0, 1e-3, 0, 0, 0, 0.9, 0.999, 1e-8, 0, 0, 0},
    {"adam wd amsgrad excluded", 1, 0, 1e-3, 0, 0, 1e-2, 0.9, 0.999, 1e-8, 0, 1, 1},
    {"adamw", 1, 1, 1e-3, 0, 0, 1e-2, 0.9, 0.999, 1e-8, 0, 0, 0},
    {"adamw amsgrad excluded", 1, 1, 1e-3, 0, 0, 0.1, 0.8, 0.999, 1e-6, 0, 1, 1},
};

/* optimizer.c's optimizer_scalars (static there) */
static void scalars(const config *c, double lr, int64_t step, rt_optim_scalars *s) {
    memset(s, 0, sizeof *s);
    s->has_wd = c->weight_decay != 0;
    s->wd = (float)c->weight_decay;
    if (!c->adam) {
        s->momentum = c->momentum != 0;
        s->first = step == 1;
        s->nesterov = c->nesterov;
        s->mom = (float)c->momentum;
        s->damp1 = (float)(1.0 - c->dampening);
        s->neglr = (float)(-lr);
        return;
    }
    double bc1 = 1.0 - pow(c->beta1, (double)step), bc2 = 1.0 - pow(c->beta2, (double)step);
    s->amsgrad = c->amsgrad;
    s->decoupled = c->adamw;
    s->b1 = (float)c->beta1;
    s->omb1 = (float)(1.0 - c->beta1);
    s->b2 = (float)c->beta2;
    s->omb2 = (float)(1.0 - c->beta2);
    s->bc2s = (float)sqrt(bc2);
    s->eps = (float)c->eps;
    s->negss = (float)(-(lr / bc1));
    s->decay_mul = (float)(1.0 - lr * c->weight_decay);
}

/* the CPU side of one step: optimizer.c's walk over decayed and excluded stretches */
static void cpu_step(const config *c, float *p, const float *g, float *st[3], const rt_optim_scalars *s) {
    size_t pos = 0;
    const size_t nr = c->excluded ? 3 : 0;
    for (size_t r = 0; r <= nr; r++) {
        size_t off = r < nr ? ranges[r].offset : N, cnt = r < nr ? ranges[r].count : 0;
        for (int decay = 1; decay >= 0; decay--) {
            size_t lo = decay ? pos : off, n = decay ? off - pos : cnt;
            if (n == 0) continue;
            if (!c->adam)
                rt_optim_sgd_cpu(p + lo, g + lo, s->momentum ? st[0] + lo : NULL, n, s, decay);
            else
                rt_optim_adam_cpu(p + lo, g + lo, st[0] + lo, st[1] + lo, s->amsgrad ? st[2] + lo : NULL, n, s, decay);
        }
        pos = off + cnt;
    }
}

static void run_config(const config *c, int generic) {
    float *g = et_randn(STEPS * N, 1.0f), *p0 = et_randn(N, 1.0f);
    float *cp = et_copy(p0, N), *gp = et_copy(p0, N);
    float *cs[3], *gs[3];
    for (int i = 0; i < 3; i++) {
        cs[i] = calloc(N, sizeof(float));
        gs[i] = calloc(N, sizeof(float));
    }
    /* decay mask: optimizer.c's, one bit per element, set where weight decay applies */
    uint32_t *mask = NULL;
    if (c->excluded) {
        size_t words = (N + 31) / 32;
        mask = malloc(words * sizeof *mask);
        memset(mask, 0xff, words * sizeof *mask);
        for (int r = 0; r < 3; r++)
            for (size_t i = ranges[r].offset; i < ranges[r].offset + ranges[r].count; i++)
                mask[i >> 5] &= ~(1u << (i & 31));
    }
    rt_optim_cpu_force_generic(generic);
    for (int t = 0; t < STEPS; t++) {
        rt_optim_scalars s;
        scalars(c, c->lr * (1.0 + 0.1 * t), t + 1, &s);
        const float *gt = g + (size_t)t * N;
        cpu_step(c, cp, gt, cs, &s);
        if (!c->adam)
            assert_rt_ok(rt_optim_sgd_cuda(gp, gt, s.momentum ? gs[0] : NULL, N, &s, mask, NULL));
        else
            assert_rt_ok(rt_optim_adam_cuda(gp, gt, gs[0], gs[1], s.amsgrad ? gs[2] : NULL, N, &s, mask, NULL));
    }
    rt_optim_cpu_force_generic(0);
    char what[128];
    snprintf(what, sizeof what, "%s (%s CPU loops): params", c->name, generic ? "baseline" : "default");
    et_check_exact(what, cp, gp, N);
    const int nstate = !c->adam ? (c->momentum != 0) : 2 + c->amsgrad;
    for (int i = 0; i < nstate; i++) {
        snprintf(what, sizeof what, "  state %d", i);
        et_check_exact(what, cs[i], gs[i], N);
    }
    free(g), free(p0), free(cp), free(gp), free(mask);
    for (int i = 0; i < 3; i++) free(cs[i]), free(gs[i]);
}

static void test_optimizers(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        run_config(&configs[i], 0);
        run_config(&configs[i], 1);
    }
    assert_rt_ok(rt_optim_sgd_cuda(NULL, NULL, NULL, 0, NULL, NULL, NULL)); /* n = 0: nothing */
}

/* optim_cuda.cu's documented order: thread t of block b adds x[i]^2 (fma in double)
 * for i = b*256 + t, + 512*256, ...; each block adds its 256 values in a tree
 * (w = 128, 64, ..., 1: s[t] += s[t + w]); one block of 512 then adds the partials in
 * a tree the same way */
static double tree_model(const float *x, size_t n) {
    enum { B = RT_OPTIM_NORM_BLOCKS, T = 256 };
    static double part[B], sh[B > T ? B : T];
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
    const size_t sizes[] = {300007, 131073, 1000, 1, 0}; /* several passes per thread ... fewer than the threads */
    double *partial = malloc(RT_OPTIM_NORM_BLOCKS * sizeof(double));
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *x = et_randn(n, 2.0f);
        double out = NAN, again = NAN;
        assert_rt_ok(rt_optim_sumsq_cuda(x, n, partial, &out, NULL));
        assert_rt_ok(rt_optim_sumsq_cuda(x, n, partial, &again, NULL));
        double model = tree_model(x, n), cpu = rt_optim_sumsq_cpu(x, n);
        printf("  sumsq n=%zu: emulated gpu %.17g tree model %.17g cpu %.17g\n", n, out, model, cpu);
        assert_true(memcmp(&out, &model, sizeof out) == 0); /* bit for bit: the documented tree */
        assert_true(memcmp(&out, &again, sizeof out) == 0); /* deterministic */
        assert_true(fabs(out - cpu) <= 1e-12 * cpu);        /* another order of the same sum */
        free(x);
    }
    /* a non-finite gradient makes the sum non-finite */
    float *x = et_randn(5000, 1.0f);
    x[4321] = INFINITY;
    double out = 0;
    assert_rt_ok(rt_optim_sumsq_cuda(x, 5000, partial, &out, NULL));
    assert_true(isinf(out));
    x[4321] = NAN;
    assert_rt_ok(rt_optim_sumsq_cuda(x, 5000, partial, &out, NULL));
    assert_true(isnan(out));
    free(x);
    free(partial);
}

static void test_scale(void **state) {
    (void)state;
    const size_t n = 70001;
    float *x = et_randn(n, 3.0f), *c = et_copy(x, n);
    rt_optim_scale_cpu(c, n, 0.3712f);
    assert_rt_ok(rt_optim_scale_cuda(x, n, 0.3712f, NULL));
    et_check_exact("scale", c, x, n);
    free(x), free(c);
}

int main(void) {
    et_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
