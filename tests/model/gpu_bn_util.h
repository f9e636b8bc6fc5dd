/* Batch norm on both backends for the GPU model tests (test_gpu_layers, test_gpu_act_formats):
 * a layer pair with the same random parameters and running statistics, inputs with a
 * per-channel offset and scale, and the comparison of the statistics. Include after
 * gpu_test_util.h. */
#ifndef RT_GPU_BN_UTIL_H
#define RT_GPU_BN_UTIL_H

#include "core/tensor.h"

typedef struct bn_pair {
    rt_batchnorm2d c, g;
    rt_arena cp, cg, cb, gp, gg, gb;
    float *g_save_mean, *g_save_invstd;
} bn_pair;

static void bn_place(rt_batchnorm2d *l, rt_arena *P, rt_arena *G, rt_arena *B) {
    assert_rt_ok(rt_tensor_place(&l->weight, P));
    l->dweight = rt_tensor_in(&l->weight, G);
    assert_rt_ok(rt_tensor_place(&l->bias, P));
    l->dbias = rt_tensor_in(&l->bias, G);
    assert_rt_ok(rt_tensor_place(&l->running_mean, B));
    assert_rt_ok(rt_tensor_place(&l->running_var, B));
    assert_rt_ok(rt_tensor_place(&l->num_batches_tracked, B));
    G->size = P->size;
    assert_rt_ok(rt_arena_alloc(P));
    assert_rt_ok(rt_arena_alloc(G));
    assert_rt_ok(rt_arena_alloc(B));
}

/* batch norm C x H x W on both backends, prepared for max_n: random parameters and
 * running statistics (running_var > 0), NaN saved statistics */
static void bn_setup(bn_pair *P, int max_n, int C, int H, int W) {
    assert_rt_ok(rt_batchnorm2d_init(&P->c, C, H, W));
    P->g = P->c;
    rt_arena_init(&P->cp, rt_device_cpu()), rt_arena_init(&P->cg, rt_device_cpu()),
        rt_arena_init(&P->cb, rt_device_cpu());
    rt_arena_init(&P->gp, g_gpu->device), rt_arena_init(&P->gg, g_gpu->device), rt_arena_init(&P->gb, g_gpu->device);
    bn_place(&P->c, &P->cp, &P->cg, &P->cb);
    bn_place(&P->g, &P->gp, &P->gg, &P->gb);
    gt_sync();
    P->c.save_mean = rt_test_nans((size_t)C), P->c.save_invstd = rt_test_nans((size_t)C);
    P->g_save_mean = gt_dev_nan((size_t)C), P->g_save_invstd = gt_dev_nan((size_t)C);
    P->g.save_mean = P->g_save_mean, P->g.save_invstd = P->g_save_invstd;
    /* parameters and running statistics: random (running_var > 0) */
    float *hg = gt_uniform((size_t)C, 0.5f, 1.5f), *hb = rt_test_randn((size_t)C, 0.3f);
    float *hrm = rt_test_randn((size_t)C, 0.2f), *hrv = gt_uniform((size_t)C, 0.5f, 2.0f);
    int64_t nbt = 3;
    memcpy(rt_tensor_data(&P->c.weight), hg, C * sizeof(float));
    memcpy(rt_tensor_data(&P->c.bias), hb, C * sizeof(float));
    memcpy(rt_tensor_data(&P->c.running_mean), hrm, C * sizeof(float));
    memcpy(rt_tensor_data(&P->c.running_var), hrv, C * sizeof(float));
    memcpy(rt_tensor_data(&P->c.num_batches_tracked), &nbt, sizeof nbt);
    gt_upload(rt_tensor_data(&P->g.weight), hg, C * sizeof(float));
    gt_upload(rt_tensor_data(&P->g.bias), hb, C * sizeof(float));
    gt_upload(rt_tensor_data(&P->g.running_mean), hrm, C * sizeof(float));
    gt_upload(rt_tensor_data(&P->g.running_var), hrv, C * sizeof(float));
    gt_upload(rt_tensor_data(&P->g.num_batches_tracked), &nbt, sizeof nbt);
    assert_rt_ok(rt_batchnorm2d_prepare(g_cpu, &P->c, max_n));
    assert_rt_ok(rt_batchnorm2d_prepare(g_gpu, &P->g, max_n));
    free(hg), free(hb), free(hrm), free(hrv);
}

static void bn_teardown(bn_pair *P) {
    rt_batchnorm2d_release(g_cpu, &P->c);
    rt_batchnorm2d_release(g_gpu, &P->g);
    rt_arena_free(&P->cp), rt_arena_free(&P->cg), rt_arena_free(&P->cb);
    rt_arena_free(&P->gp), rt_arena_free(&P->gg), rt_arena_free(&P->gb);
    gt_free(P->g_save_mean), gt_free(P->g_save_invstd);
    free(P->c.save_mean), free(P->c.save_invstd);
}

/* activations with a per-channel offset and scale */
static float *bn_input(size_t cnt, int C, int H, int W) {
    float *hx = rt_test_randn(cnt, 1.0f);
    for (size_t i = 0; i < cnt; i++) {
        int ch = (int)((i / ((size_t)H * W)) % (size_t)C);
        hx[i] = hx[i] * (1.0f + 0.1f * (float)ch) + 0.5f * (float)(ch % 3);
    }
    return hx;
}

/* the training forward's saved and running statistics and counter, GPU against CPU */
static void bn_check_stats(bn_pair *P) {
    const size_t C = (size_t)P->c.c;
    gt_check_dev("  save_mean", P->c.save_mean, P->g_save_mean, C, TOL_FWD);
    gt_check_dev("  save_invstd", P->c.save_invstd, P->g_save_invstd, C, TOL_FWD);
    gt_check_dev("  running_mean", rt_tensor_data(&P->c.running_mean), rt_tensor_data(&P->g.running_mean), C, TOL_FWD);
    gt_check_dev("  running_var (unbiased)", rt_tensor_data(&P->c.running_var), rt_tensor_data(&P->g.running_var), C,
                 TOL_FWD);
    int64_t gn = -1;
    gt_download(&gn, rt_tensor_data(&P->g.num_batches_tracked), sizeof gn);
    assert_int_equal(gn, *(int64_t *)rt_tensor_data(&P->c.num_batches_tracked));
}

#endif
