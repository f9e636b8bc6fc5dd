/* Helpers shared by the checkpoint tests: a small model + optimizer that has trained a
 * few steps (so every state buffer, BN statistic and dropout counter is non-trivial),
 * bitwise comparisons, scratch directories. */
#ifndef RT_CKPT_TEST_UTIL_H
#define RT_CKPT_TEST_UTIL_H

#include "test_util.h"

#include "core/rng.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ct_run {
    rt_model_ctx *ctx;
    rt_model *model;
    rt_optimizer opt;
    int n; /* batch */
    float *x;
    int64_t *y;
} ct_run;

/* Build arch (width for ResNet) on 1x28x28 with optimizer `kind`, weights from `seed`. */
static inline void ct_build(ct_run *r, rt_model_arch arch, int width, rt_optim_kind kind, uint64_t seed) {
    memset(r, 0, sizeof *r);
    rt_model_ctx_options o = {.device = rt_device_cpu(), .threads = 1};
    assert_rt_ok(rt_model_ctx_create(&o, &r->ctx));
    rt_model_config mc;
    rt_model_config_default(&mc);
    mc.arch = arch;
    mc.width = width;
    mc.max_batch = 8;
    assert_rt_ok(rt_model_create(&mc, r->ctx, &r->model));
    assert_rt_ok(rt_model_init_weights(r->model, seed));
    rt_optim_config oc;
    rt_optim_config_default(&oc, kind);
    if (kind == RT_OPTIM_SGD) {
        oc.momentum = 0.9;
        oc.lr = 0.05;
        oc.weight_decay = 1e-4;
    } else {
        oc.amsgrad = kind == RT_OPTIM_ADAM; /* three state buffers */
    }
    assert_rt_ok(rt_optimizer_init(&r->opt, &oc, rt_device_cpu(), rt_model_params(r->model)->size / sizeof(float)));
    r->n = 4;
    r->x = malloc(sizeof(float) * (size_t)r->n * 28 * 28);
    r->y = malloc(sizeof(int64_t) * (size_t)r->n);
    assert_non_null(r->x);
    assert_non_null(r->y);
}

/* `steps` training steps on batches drawn from `seed` */
static inline void ct_train(ct_run *r, int steps, uint64_t seed) {
    for (int s = 0; s < steps; s++) {
        rt_rng g;
        rt_rng_init(&g, seed, (uint64_t)s);
        rt_rng_normal(&g, r->x, (size_t)r->n * 28 * 28, 0.0f, 1.0f);
        for (int i = 0; i < r->n; i++) r->y[i] = (int64_t)((seed + (uint64_t)s * 7 + (uint64_t)i * 3) % 10);
        float loss;
        assert_rt_ok(rt_model_train_step(r->model, r->x, r->y, r->n, NULL, NULL, &loss));
        assert_rt_ok(rt_optimizer_step_arena(&r->opt, rt_model_params(r->model), rt_model_grads(r->model), -1, NULL));
    }
}

static inline void ct_free(ct_run *r) {
    rt_optimizer_free(&r->opt);
    rt_model_destroy(r->model);
    rt_model_ctx_destroy(r->ctx);
    free(r->x);
    free(r->y);
}

/* bitwise: parameters, buffers, every optimizer state buffer, the step counter and the
 * dropout counters */
static inline void ct_assert_same(ct_run *a, ct_run *b) {
    rt_arena *pa = rt_model_params(a->model), *pb = rt_model_params(b->model);
    assert_int_equal(pa->size, pb->size);
    assert_memory_equal(pa->base, pb->base, pa->size);
    rt_arena *ba = rt_model_buffers(a->model), *bb = rt_model_buffers(b->model);
    assert_int_equal(ba->size, bb->size);
    if (ba->size) assert_memory_equal(ba->base, bb->base, ba->size);
    assert_int_equal(rt_optimizer_state_count(&a->opt), rt_optimizer_state_count(&b->opt));
    for (int i = 0; i < rt_optimizer_state_count(&a->opt); i++) {
        rt_optim_state sa, sb;
        assert_rt_ok(rt_optimizer_state_get(&a->opt, i, &sa));
        assert_rt_ok(rt_optimizer_state_get(&b->opt, i, &sb));
        assert_string_equal(sa.name, sb.name);
        assert_int_equal(sa.count, sb.count);
        assert_memory_equal(sa.data, sb.data, sa.count * sizeof(float));
    }
    assert_int_equal(rt_optimizer_get_steps(&a->opt), rt_optimizer_get_steps(&b->opt));
    uint64_t ca[8], cb[8];
    int na = rt_model_dropout_counters(a->model, ca, 8), nb = rt_model_dropout_counters(b->model, cb, 8);
    assert_int_equal(na, nb);
    for (int i = 0; i < na; i++) assert_int_equal(ca[i], cb[i]);
}

/* the metadata a trainer would give */
static inline void ct_meta(rt_ckpt_meta *m, int64_t epoch) {
    rt_ckpt_meta_init(m);
    assert_rt_ok(rt_ckpt_meta_set_i64(m, "epoch", epoch));
    assert_rt_ok(rt_ckpt_meta_set_i64(m, "world_size", 1));
    assert_rt_ok(rt_ckpt_meta_set_i64(m, "loader.epoch", epoch));
    assert_rt_ok(rt_ckpt_meta_set_i64(m, "loader.position", 96));
    assert_rt_ok(rt_ckpt_meta_set_u64(m, "rng.seed", UINT64_MAX));
    assert_rt_ok(rt_ckpt_meta_set_i64(m, "schedule.iter", -5));
    assert_rt_ok(rt_ckpt_meta_set(m, "config", "model:\n  arch: \"net\"  # \\ quoted\n\tx: é\n"));
}

/* a fresh scratch directory under the test's working directory */
static inline void ct_tmpdir(char *out, size_t n, const char *what) {
    snprintf(out, n, "ckpt-test-%s-XXXXXX", what);
    assert_non_null(mkdtemp(out));
}

static inline void ct_rmrf(const char *path) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'", path, path);
    if (system(cmd) != 0) print_message("could not remove %s\n", path);
}

/* entries of dir whose name starts with prefix */
static inline int ct_count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static inline void ct_assert_msg(const char *frag) {
    if (!strstr(rt_error_message(), frag)) fail_msg("error '%s' lacks '%s'", rt_error_message(), frag);
}

#endif
