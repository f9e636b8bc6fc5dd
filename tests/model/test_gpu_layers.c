/* Every layer of the CUDA backend against the CPU backend, forward and backward.
 *
 * Fresh random inputs and parameters every run (the seed is printed;
 * RINGTRAIN_TEST_SEED repeats a run), GPU output buffers filled with NaN first so an
 * element the GPU forgets to write fails the comparison. fp32 bounds: relative
 * (max-norm) error < 1e-5 forward, < 1e-4 gradients. The ops whose kernels repeat the
 * CPU arithmetic (relu, add, pooling, dropout, bias gradient) must match bit for bit.
 * Batch sizes below the prepared maximum are run too (the cuDNN layers keep a second
 * descriptor set for them). Convolution and batch norm also run at the shapes that train
 * (batch 128 and 256, 64-128 channels) in fp32 and tf32; the tf32 run must have chosen a
 * tensor-op algorithm on sm_80+. Exits 77 (skipped) where no GPU answers.
 */
#include "gpu_test_util.h"
#include "gpu_bn_util.h"

#ifdef RT_HAVE_CUDA
#include "model/cuda/cuda_internal.h" /* the chosen convolution algorithms (rt_cuda_state) */
#endif

#include <stdlib.h>

/* ---- conv2d ------------------------------------------------------------------------ */

typedef struct conv_pair {
    rt_conv2d c, g;          /* CPU layer, GPU layer */
    rt_arena cp, cg, gp, gg; /* params / grads arenas of each */
} conv_pair;

static void conv_setup(conv_pair *P, int max_n, int in_c, int out_c, int h, int w, int k, int s, int pad, bool bias,
                       float **h_w, float **h_b) {
    assert_rt_ok(rt_conv2d_init(&P->c, in_c, out_c, h, w, k, s, pad, bias));
    P->g = P->c;
    rt_arena_init(&P->cp, rt_device_cpu());
    rt_arena_init(&P->cg, rt_device_cpu());
    rt_arena_init(&P->gp, g_gpu->device);
    rt_arena_init(&P->gg, g_gpu->device);
    assert_rt_ok(rt_tensor_place(&P->c.weight, &P->cp));
    P->c.dweight = rt_tensor_in(&P->c.weight, &P->cg);
    assert_rt_ok(rt_tensor_place(&P->g.weight, &P->gp));
    P->g.dweight = rt_tensor_in(&P->g.weight, &P->gg);
    if (bias) {
        assert_rt_ok(rt_tensor_place(&P->c.bias, &P->cp));
        P->c.dbias = rt_tensor_in(&P->c.bias, &P->cg);
        assert_rt_ok(rt_tensor_place(&P->g.bias, &P->gp));
        P->g.dbias = rt_tensor_in(&P->g.bias, &P->gg);
    }
    P->cg.size = P->cp.size;
    P->gg.size = P->gp.size;
    assert_rt_ok(rt_arena_alloc(&P->cp));
    assert_rt_ok(rt_arena_alloc(&P->cg));
    assert_rt_ok(rt_arena_alloc(&P->gp));
    assert_rt_ok(rt_arena_alloc(&P->gg));
    gt_sync();
    size_t wn = (size_t)out_c * in_c * k * k;
    *h_w = rt_test_randn(wn, (float)(1.0 / sqrt((double)in_c * k * k)));
    memcpy(rt_tensor_data(&P->c.weight), *h_w, wn * sizeof(float));
    gt_upload(rt_tensor_data(&P->g.weight), *h_w, wn * sizeof(float));
    *h_b = NULL;
    if (bias) {
        *h_b = rt_test_randn((size_t)out_c, 0.5f);
        memcpy(rt_tensor_data(&P->c.bias), *h_b, (size_t)out_c * sizeof(float));
        gt_upload(rt_tensor_data(&P->g.bias), *h_b, (size_t)out_c * sizeof(float));
    }
    size_t ws = 0;
    assert_rt_ok(rt_conv2d_prepare(g_cpu, &P->c, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_cpu, ws));
    assert_rt_ok(rt_conv2d_prepare(g_gpu, &P->g, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_gpu, ws));
}

static void conv_teardown(conv_pair *P) {
    rt_conv2d_release(g_cpu, &P->c);
    rt_conv2d_release(g_gpu, &P->g);
    rt_arena_free(&P->cp);
    rt_arena_free(&P->cg);
    rt_arena_free(&P->gp);
    rt_arena_free(&P->gg);
}

/* forward, backward (dx written, dx accumulated, dx NULL) at batch n, within tf (forward)
 * and tg (gradients) */
/* The largest relative error conv_run saw per convolution shape, batch and direction
 * (forward, backward data, backward filter), since the last reset: the tf32 test reads
 * them next to the algorithms the backend chose */
typedef struct conv_err {
    int in_c, out_c, in_h, k, stride, n;
    double err[3];
} conv_err;
static conv_err g_conv_errs[128];
static int g_nconv_errs;

static void note_conv_err(const rt_conv2d *l, int n, int dir, double e) {
    int i = 0;
    while (i < g_nconv_errs &&
           !(g_conv_errs[i].in_c == l->in_c && g_conv_errs[i].out_c == l->out_c && g_conv_errs[i].in_h == l->in_h &&
             g_conv_errs[i].k == l->k && g_conv_errs[i].stride == l->stride && g_conv_errs[i].n == n))
        i++;
    if (i == g_nconv_errs) {
        assert_true(g_nconv_errs < (int)(sizeof g_conv_errs / sizeof g_conv_errs[0]));
        g_conv_errs[g_nconv_errs++] = (conv_err){l->in_c, l->out_c, l->in_h, l->k, l->stride, n, {0, 0, 0}};
    }
    g_conv_errs[i].err[dir] = fmax(g_conv_errs[i].err[dir], e);
}

static void conv_run(conv_pair *P, int n, const char *name, double tf, double tg) {
    const rt_conv2d *l = &P->c;
    const size_t xn = (size_t)n * l->in_c * l->in_h * l->in_w, yn = (size_t)n * l->out_c * l->out_h * l->out_w;
    const size_t wn = (size_t)l->out_c * l->in_c * l->k * l->k;
    char what[96];
    float *hx = rt_test_randn(xn, 1.0f), *hdy = rt_test_randn(yn, 1.0f), *hdx0 = rt_test_randn(xn, 1.0f);
    float *x_dev = gt_dev_copy(hx, xn), *ddy = gt_dev_copy(hdy, yn);
    float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn);
    float *gy = gt_dev_nan(yn), *gdx = gt_dev_nan(xn);

    assert_rt_ok(rt_conv2d_forward(g_cpu, &P->c, n, (rt_act *)hx, (rt_act *)cy));
    assert_rt_ok(rt_conv2d_forward(g_gpu, &P->g, n, (rt_act *)x_dev, (rt_act *)gy));
    snprintf(what, sizeof what, "%s n=%d forward", name, n);
    note_conv_err(l, n, 0, gt_check_dev(what, cy, gy, yn, tf));

    gt_poison(rt_tensor_data(&P->g.dweight), wn * sizeof(float));
    if (l->has_bias) gt_poison(rt_tensor_data(&P->g.dbias), (size_t)l->out_c * sizeof(float));
    assert_rt_ok(rt_conv2d_backward(g_cpu, &P->c, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, false));
    assert_rt_ok(rt_conv2d_backward(g_gpu, &P->g, n, (rt_act *)x_dev, (rt_act *)ddy, (rt_act *)gdx, false));
    snprintf(what, sizeof what, "%s n=%d dx", name, n);
    note_conv_err(l, n, 1, gt_check_dev(what, cdx, gdx, xn, tg));
    snprintf(what, sizeof what, "%s n=%d dweight", name, n);
    note_conv_err(l, n, 2, gt_check_dev(what, rt_tensor_data(&P->c.dweight), rt_tensor_data(&P->g.dweight), wn, tg));
    if (l->has_bias) {
        snprintf(what, sizeof what, "%s n=%d dbias", name, n);
        gt_check_dev(what, rt_tensor_data(&P->c.dbias), rt_tensor_data(&P->g.dbias), (size_t)l->out_c, tg);
    }

    /* accumulate into a random dx */
    memcpy(cdx, hdx0, xn * sizeof(float));
    gt_upload(gdx, hdx0, xn * sizeof(float));
    gt_poison(rt_tensor_data(&P->g.dweight), wn * sizeof(float));
    assert_rt_ok(rt_conv2d_backward(g_cpu, &P->c, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, true));
    assert_rt_ok(rt_conv2d_backward(g_gpu, &P->g, n, (rt_act *)x_dev, (rt_act *)ddy, (rt_act *)gdx, true));
    snprintf(what, sizeof what, "%s n=%d dx accumulated", name, n);
    gt_check_dev(what, cdx, gdx, xn, tg);
    snprintf(what, sizeof what, "%s n=%d dweight (again)", name, n);
    gt_check_dev(what, rt_tensor_data(&P->c.dweight), rt_tensor_data(&P->g.dweight), wn, tg);

    /* no input gradient (the first layer) */
    gt_poison(rt_tensor_data(&P->g.dweight), wn * sizeof(float));
    assert_rt_ok(rt_conv2d_backward(g_gpu, &P->g, n, (rt_act *)x_dev, (rt_act *)ddy, (rt_act *)NULL, false));
    snprintf(what, sizeof what, "%s n=%d dweight (dx NULL)", name, n);
    gt_check_dev(what, rt_tensor_data(&P->c.dweight), rt_tensor_data(&P->g.dweight), wn, tg);

    free(hx), free(hdy), free(hdx0), free(cy), free(cdx);
    gt_free(x_dev), gt_free(ddy), gt_free(gy), gt_free(gdx);
}

static void conv_case(int max_n, int in_c, int out_c, int h, int w, int k, int s, int pad, bool bias) {
    conv_pair P;
    float *hw, *hb;
    conv_setup(&P, max_n, in_c, out_c, h, w, k, s, pad, bias, &hw, &hb);
    char name[96];
    snprintf(name, sizeof name, "conv %d->%d %dx%d k%d s%d p%d%s", in_c, out_c, h, w, k, s, pad, bias ? " bias" : "");
    conv_run(&P, max_n, name, TOL_FWD, TOL_GRAD);
    conv_run(&P, max_n - 3, name, TOL_FWD, TOL_GRAD); /* the second descriptor set */
    conv_run(&P, max_n, name, TOL_FWD, TOL_GRAD);     /* and back */
    conv_teardown(&P);
    free(hw);
    free(hb);
}

static void test_conv2d(void **state) {
    (void)state;
    conv_case(8, 1, 16, 28, 28, 7, 2, 3, false); /* imagenet stem on MNIST */
    conv_case(8, 3, 16, 32, 32, 3, 1, 1, false); /* cifar stem */
    conv_case(6, 16, 16, 7, 7, 3, 1, 1, false);  /* BasicBlock conv */
    conv_case(6, 16, 32, 7, 7, 3, 2, 1, false);  /* strided, odd size */
    conv_case(6, 16, 32, 7, 7, 1, 2, 0, false);  /* downsample 1x1/2 */
    conv_case(5, 32, 32, 1, 1, 3, 1, 1, false);  /* layer4 at 28x28: 1x1 maps */
    conv_case(7, 1, 10, 28, 28, 5, 1, 0, true);  /* Net conv1 (bias) */
    conv_case(7, 10, 20, 12, 12, 5, 1, 0, true); /* Net conv2 (bias) */
    conv_case(4, 5, 7, 13, 11, 3, 2, 1, true);   /* odd everything */
}

/* ---- batch norm -------------------------------------------------------------------- */

/* bn_pair, bn_setup, bn_input, bn_check_stats: gpu_bn_util.h */

/* batch norm C x H x W prepared for max_n, run at each batch of ns[0..nns): training
 * forward (output, saved and running statistics, counter), backward (dx written and
 * accumulated), evaluation forward */
static void bn_case(int max_n, int C, int H, int W, const int *ns, int nns) {
    bn_pair P;
    bn_setup(&P, max_n, C, H, W);
    float *c_save_mean = P.c.save_mean, *c_save_invstd = P.c.save_invstd;
    for (int ni = 0; ni < nns; ni++) {
        const int n = ns[ni];
        const size_t cnt = (size_t)n * C * H * W;
        char what[96];
        /* inputs with a per-channel offset and scale, as activations have */
        float *hx = bn_input(cnt, C, H, W), *hdy = rt_test_randn(cnt, 1.0f), *hdx0 = rt_test_randn(cnt, 1.0f);
        float *dx_in = gt_dev_copy(hx, cnt), *ddy = gt_dev_copy(hdy, cnt);
        float *cy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt);
        float *gy = gt_dev_nan(cnt), *gdx = gt_dev_nan(cnt);
        gt_poison(P.g_save_mean, C * sizeof(float));
        gt_poison(P.g_save_invstd, C * sizeof(float));

        /* training forward: output, saved statistics, running statistics, counter */
        assert_rt_ok(rt_batchnorm2d_forward(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)cy, true));
        assert_rt_ok(rt_batchnorm2d_forward(g_gpu, &P.g, n, (rt_act *)dx_in, (rt_act *)gy, true));
        snprintf(what, sizeof what, "bn %dx%dx%d n=%d train forward", C, H, W, n);
        gt_check_dev(what, cy, gy, cnt, TOL_FWD);
        bn_check_stats(&P);

        /* backward, dx written then accumulated */
        gt_poison(rt_tensor_data(&P.g.dweight), C * sizeof(float));
        gt_poison(rt_tensor_data(&P.g.dbias), C * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, false));
        assert_rt_ok(rt_batchnorm2d_backward(g_gpu, &P.g, n, (rt_act *)dx_in, (rt_act *)ddy, (rt_act *)gdx, false));
        snprintf(what, sizeof what, "bn %dx%dx%d n=%d dx", C, H, W, n);
        gt_check_dev(what, cdx, gdx, cnt, TOL_GRAD);
        gt_check_dev("  dweight", rt_tensor_data(&P.c.dweight), rt_tensor_data(&P.g.dweight), (size_t)C, TOL_GRAD);
        gt_check_dev("  dbias", rt_tensor_data(&P.c.dbias), rt_tensor_data(&P.g.dbias), (size_t)C, TOL_GRAD);
        memcpy(cdx, hdx0, cnt * sizeof(float));
        gt_upload(gdx, hdx0, cnt * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hdy, (rt_act *)cdx, true));
        assert_rt_ok(rt_batchnorm2d_backward(g_gpu, &P.g, n, (rt_act *)dx_in, (rt_act *)ddy, (rt_act *)gdx, true));
        gt_check_dev("  dx accumulated", cdx, gdx, cnt, TOL_GRAD);

        /* evaluation forward with the (now updated) running statistics */
        gt_poison(gy, cnt * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_forward(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)cy, false));
        assert_rt_ok(rt_batchnorm2d_forward(g_gpu, &P.g, n, (rt_act *)dx_in, (rt_act *)gy, false));
        snprintf(what, sizeof what, "bn %dx%dx%d n=%d eval forward", C, H, W, n);
        gt_check_dev(what, cy, gy, cnt, TOL_FWD);

        free(hx), free(hdy), free(hdx0), free(cy), free(cdx);
        gt_free(dx_in), gt_free(ddy), gt_free(gy), gt_free(gdx);
    }
    (void)c_save_mean, (void)c_save_invstd;
    bn_teardown(&P);
}

static void test_batchnorm2d(void **state) {
    (void)state;
    const int shapes[][4] = {{8, 16, 7, 7}, {8, 8, 14, 14}, {8, 32, 1, 1}, {4, 5, 3, 5}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int max_n = shapes[si][0];
        const int ns[3] = {max_n, max_n - 1, max_n};
        bn_case(max_n, shapes[si][1], shapes[si][2], shapes[si][3], ns, 3);
    }
}

/* The fused batch norm (rt_batchnorm2d_forward_act / _backward_act): y = relu?(bn(x) +
 * residual?) in training and evaluation, and the backward through the ReLU, against the
 * CPU backend's fused ops. The backward gets the CPU forward's output as act on both
 * backends, so the ReLU mask is the same one (a value at 0 on one backend and 1e-8 on the
 * other would change that gradient by O(1)). The GPU's training forward and backward run
 * twice: the same bits (fixed reduction order). */
static void bn_act_case(int max_n, int n, int C, int H, int W, bool residual, bool relu) {
    bn_pair P;
    bn_setup(&P, max_n, C, H, W);
    const size_t cnt = (size_t)n * C * H * W;
    char what[128], name[64];
    snprintf(name, sizeof name, "bn %dx%dx%d n=%d%s%s", C, H, W, n, residual ? " +res" : "", relu ? " relu" : "");
    float *hx = bn_input(cnt, C, H, W), *hr = residual ? rt_test_randn(cnt, 1.0f) : NULL;
    float *hdy = rt_test_randn(cnt, 1.0f), *hdx0 = rt_test_randn(cnt, 1.0f);
    float *gx = gt_dev_copy(hx, cnt), *gr = hr ? gt_dev_copy(hr, cnt) : NULL, *gy = gt_dev_nan(cnt);
    float *cy = rt_test_nans(cnt), *first = rt_test_nans(cnt), *cdx = rt_test_nans(cnt);

    assert_rt_ok(rt_batchnorm2d_forward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hr, (rt_act *)cy, true, relu));
    assert_rt_ok(rt_batchnorm2d_forward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gr, (rt_act *)gy, true, relu));
    snprintf(what, sizeof what, "%s train forward", name);
    gt_check_dev(what, cy, gy, cnt, TOL_FWD);
    bn_check_stats(&P);
    gt_download(first, gy, cnt * sizeof(float));
    /* again (the running statistics move on both backends): the same bits */
    assert_rt_ok(rt_batchnorm2d_forward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hr, (rt_act *)cy, true, relu));
    assert_rt_ok(rt_batchnorm2d_forward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gr, (rt_act *)gy, true, relu));
    gt_check_exact("  train forward, second run (bits)", first, gy, cnt);
    bn_check_stats(&P);

    if (relu) { /* backward through the ReLU whose output was the CPU's y; dx written, then accumulated */
        float *gact = gt_dev_copy(cy, cnt), *gdy = gt_dev_copy(hdy, cnt), *gdx = gt_dev_nan(cnt);
        float *cdy = rt_test_floats(cnt);
        memcpy(cdy, hdy, cnt * sizeof(float));
        gt_poison(rt_tensor_data(&P.g.dweight), C * sizeof(float));
        gt_poison(rt_tensor_data(&P.g.dbias), C * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)cy, (rt_act *)cdy, (rt_act *)cdx, false));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gact, (rt_act *)gdy, (rt_act *)gdx, false));
        snprintf(what, sizeof what, "%s dx through relu", name);
        gt_check_dev(what, cdx, gdx, cnt, TOL_GRAD);
        gt_check_dev("  dweight", rt_tensor_data(&P.c.dweight), rt_tensor_data(&P.g.dweight), (size_t)C, TOL_GRAD);
        gt_check_dev("  dbias", rt_tensor_data(&P.c.dbias), rt_tensor_data(&P.g.dbias), (size_t)C, TOL_GRAD);
        gt_download(first, gdx, cnt * sizeof(float));
        gt_upload(gdy, hdy, cnt * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gact, (rt_act *)gdy, (rt_act *)gdx, false));
        gt_check_exact("  dx, second run (bits)", first, gdx, cnt);
        memcpy(cdy, hdy, cnt * sizeof(float)), memcpy(cdx, hdx0, cnt * sizeof(float));
        gt_upload(gdy, hdy, cnt * sizeof(float)), gt_upload(gdx, hdx0, cnt * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)cy, (rt_act *)cdy, (rt_act *)cdx, true));
        assert_rt_ok(rt_batchnorm2d_backward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gact, (rt_act *)gdy, (rt_act *)gdx, true));
        gt_check_dev("  dx through relu, accumulated", cdx, gdx, cnt, TOL_GRAD);
        /* _keep: the same dx, and dy left holding the ReLU's backward (the CPU composes it:
         * relu backward in place, then batch norm's backward; the GPU writes it in its dx pass) */
        memcpy(cdy, hdy, cnt * sizeof(float));
        gt_upload(gdy, hdy, cnt * sizeof(float)), gt_poison(gdx, cnt * sizeof(float));
        assert_rt_ok(rt_batchnorm2d_backward_act_keep(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)cy, (rt_act *)cdy,
                                                      (rt_act *)cdy, (rt_act *)cdx, false));
        assert_rt_ok(rt_batchnorm2d_backward_act_keep(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gact, (rt_act *)gdy,
                                                      (rt_act *)gdy, (rt_act *)gdx, false));
        gt_check_dev("  dx through relu (keep)", cdx, gdx, cnt, TOL_GRAD);
        gt_check_exact("  dy kept through the relu", cdy, gdy, cnt);
        free(cdy);
        gt_free(gact), gt_free(gdy), gt_free(gdx);
    }

    gt_poison(gy, cnt * sizeof(float)); /* evaluation with the updated running statistics */
    assert_rt_ok(rt_batchnorm2d_forward_act(g_cpu, &P.c, n, (rt_act *)hx, (rt_act *)hr, (rt_act *)cy, false, relu));
    assert_rt_ok(rt_batchnorm2d_forward_act(g_gpu, &P.g, n, (rt_act *)gx, (rt_act *)gr, (rt_act *)gy, false, relu));
    snprintf(what, sizeof what, "%s eval forward", name);
    gt_check_dev(what, cy, gy, cnt, TOL_FWD);

    free(hx), free(hr), free(hdy), free(hdx0), free(cy), free(first), free(cdx);
    gt_free(gx), gt_free(gy);
    if (gr) gt_free(gr);
    bn_teardown(&P);
}

static void test_batchnorm2d_fused(void **state) {
    (void)state;
    /* max_n, n, C, H, W: channels not a multiple of 8, 1x1 planes, a batch of 1, a batch
     * below the prepared one, and n * plane past one block's slice (8192: 2 and 4 slices) */
    const int shapes[][5] = {{4, 4, 5, 3, 5}, {6, 6, 12, 1, 1},  {1, 1, 3, 4, 4},
                             {8, 5, 7, 6, 6}, {8, 8, 7, 33, 33}, {8, 8, 2, 64, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int k = 0; k < 4; k++) {
            const int *sh = shapes[si];
            bn_act_case(sh[0], sh[1], sh[2], sh[3], sh[4], k & 1, k & 2);
        }
}

/* ---- the shapes that train: batch 128 and 256, fp32 and tf32 ----------------------- */

/* cuDNN picks other algorithms at training batches than at batch 8, so convolution and
 * batch norm are also compared at batch 128 and 256, on ResNet-like shapes small enough
 * to keep the CPU reference quick (64 channels at 28x28, 128 at 14x14). */
static const int train_convs[][7] = {
    /* in_c, out_c, h, w, k, stride, pad */
    {64, 64, 28, 28, 3, 1, 1},   /* BasicBlock conv */
    {64, 128, 28, 28, 3, 2, 1},  /* first conv of a downsampling block */
    {64, 128, 28, 28, 1, 2, 0},  /* its 1x1 downsample */
    {128, 128, 14, 14, 3, 1, 1}, /* BasicBlock conv after it */
};
static const int train_batches[] = {128, 256};
#define N_TRAIN_CONVS ((int)(sizeof train_convs / sizeof train_convs[0]))
#define N_TRAIN_BATCHES ((int)(sizeof train_batches / sizeof train_batches[0]))

/* TF32 rounds each operand to 10 mantissa bits (2^-11 = 4.9e-4 relative); sums of
 * random-sign products keep the result within a few 1e-3 of its scale (max norm) */
#define TOL_TF32 1e-2

static void conv_train_shapes(double tf, double tg) {
    for (int bi = 0; bi < N_TRAIN_BATCHES; bi++)
        for (int ci = 0; ci < N_TRAIN_CONVS; ci++) {
            const int *c = train_convs[ci], n = train_batches[bi];
            conv_pair P;
            float *hw, *hb;
            conv_setup(&P, n, c[0], c[1], c[2], c[3], c[4], c[5], c[6], false, &hw, &hb);
            char name[96];
            snprintf(name, sizeof name, "%s conv %d->%d %dx%d k%d s%d",
                     g_gpu->precision == RT_PRECISION_TF32 ? "tf32" : "fp32", c[0], c[1], c[2], c[3], c[4], c[5]);
            conv_run(&P, n, name, tf, tg);
            conv_teardown(&P);
            free(hw);
            free(hb);
        }
}

static void bn_train_shapes(void) {
    const int shapes[][3] = {{64, 28, 28}, {128, 14, 14}};
    for (int bi = 0; bi < N_TRAIN_BATCHES; bi++)
        for (int si = 0; si < 2; si++) {
            const int n = train_batches[bi];
            bn_case(n, shapes[si][0], shapes[si][1], shapes[si][2], &n, 1);
        }
}

#ifdef RT_HAVE_CUDA
static const char *math_name(cudnnMathType_t m) {
    switch (m) {
    case CUDNN_DEFAULT_MATH:
        return "default";
    case CUDNN_TENSOR_OP_MATH:
        return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
        return "tensor-op+conversion";
    case CUDNN_FMA_MATH:
        return "fma";
    default:
        return "?";
    }
}
#endif

#ifdef RT_HAVE_CUDA
/* whether a direction's algorithm sums products directly (GEMM-like), as opposed to the
 * FFT and Winograd transforms, whose own rounding is no sign of TF32 */
static bool direct_sum(int dir, int algo) {
    if (dir == 0)
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM || algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
    if (dir == 1) return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}
#endif

/* the algorithms and math types the CUDA backend chose (its per-shape cache, read through
 * the backend's internal header); returns how many directions chose tensor-op math, and
 * fails if any chose fp16 down-conversion or (under fp32) anything but FMA math. *worst
 * (when given): the largest error conv_run noted for a direction whose algorithm sums
 * directly (direct_sum). */
static int conv_algos_report(rt_model_ctx *ctx, double *worst) {
    int tensor_op = 0;
    if (worst) *worst = 0;
#ifdef RT_HAVE_CUDA
    if (!rt_device_is_cuda(ctx->device)) return 0;
    const rt_cuda_state *st = cuda_state(ctx);
    assert_true(st->nalgos > 0);
    for (int i = 0; i < st->nalgos; i++) {
        const rt_cuda_conv_algos *a = &st->algos[i];
        if (a->refused) continue; /* bf16 NHWC refused for the shape: a marker, no choice */
        printf("  algos %d->%d %dx%d k%d s%d n=%d: fwd %d (%s), bwd-data %d (%s), bwd-filter %d (%s)\n", a->in_c,
               a->out_c, a->in_h, a->in_w, a->k, a->stride, a->n, (int)a->fwd, math_name(a->fwd_math), (int)a->bwd_data,
               math_name(a->bwd_data_math), (int)a->bwd_filter, math_name(a->bwd_filter_math));
        const cudnnMathType_t m[3] = {a->fwd_math, a->bwd_data_math, a->bwd_filter_math};
        for (int d = 0; d < 3; d++) {
            if (m[d] == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
                fail_msg("conv %d->%d n=%d: an algorithm with fp16 down-conversion was chosen", a->in_c, a->out_c,
                         a->n);
            if (ctx->precision == RT_PRECISION_FP32 && m[d] != CUDNN_FMA_MATH)
                fail_msg("fp32 conv %d->%d n=%d: math type %s, expected fma", a->in_c, a->out_c, a->n, math_name(m[d]));
            tensor_op += m[d] == CUDNN_TENSOR_OP_MATH;
        }
        const int algo[3] = {(int)a->fwd, (int)a->bwd_data, (int)a->bwd_filter};
        for (int e = 0; worst && e < g_nconv_errs; e++) {
            const conv_err *r = &g_conv_errs[e];
            if (r->in_c != a->in_c || r->out_c != a->out_c || r->in_h != a->in_h || r->k != a->k ||
                r->stride != a->stride || r->n != a->n)
                continue;
            for (int d = 0; d < 3; d++)
                if (direct_sum(d, algo[d])) *worst = fmax(*worst, r->err[d]);
        }
    }
#else
    (void)ctx;
#endif
    return tensor_op;
}

static void test_conv2d_train_fp32(void **state) {
    (void)state;
    conv_train_shapes(TOL_FWD, TOL_GRAD);
    conv_algos_report(g_gpu, NULL);
}

static void test_batchnorm2d_train(void **state) {
    (void)state;
    bn_train_shapes();
}

/* The error above which a result of a direct-sum algorithm (not FFT or Winograd, whose
 * transforms round on their own) shows TF32 arithmetic: TF32 rounds each operand to 10
 * mantissa bits (2^-11 relative), fp32 sums stay within a few 1e-7 of the CPU's here
 * (H200, cuDNN 9.19: at most 1.4e-6 over these shapes in fp32 and in the directions of
 * tf32 mode that chose FMA kernels; 3.5e-4 where one, IMPLICIT_PRECOMP_GEMM, ran TF32) */
#define TF32_SIGNATURE 2e-5

/* tf32: within TOL_TF32 of the fp32 CPU backend, and on sm_80+ at least one direction of
 * these shapes must run TF32 tensor cores, or tf32 mode buys nothing: an algorithm that
 * cuDNN reports as tensor-op math (the emulation does), or a result whose error against
 * the fp32 CPU shows TF32's operand rounding (cuDNN 9.19 on an H200 reports its TF32
 * kernels as CUDNN_DEFAULT_MATH, the descriptor's type, so only the numbers tell); batch
 * norm stays fp32 in tf32 mode (fp32 bounds) */
static void test_train_shapes_tf32(void **state) {
    (void)state;
    rt_model_ctx *fp32 = g_gpu;
    g_gpu = gt_ctx(gt_gpu_device(), RT_PRECISION_TF32);
    g_nconv_errs = 0;
    conv_train_shapes(TOL_TF32, TOL_TF32);
    bn_train_shapes();
    double worst = 0;
    int tensor_op = conv_algos_report(g_gpu, &worst);
    if (rt_device_is_cuda(g_gpu->device)) {
        rt_cuda_device_info info;
        assert_rt_ok(rt_cuda_device_info_get(g_gpu->device.index, &info));
        printf("  %s (sm_%d%d): %d direction(s) reported tensor-op math; largest error of a direct-sum algorithm "
               "%.3g (TF32 shows above %.0e)\n",
               info.name, info.major, info.minor, tensor_op, worst, TF32_SIGNATURE);
        if (info.major >= 8 && tensor_op == 0 && !(worst > TF32_SIGNATURE))
            fail_msg("tf32 on sm_%d%d: no convolution direction ran TF32: none reported tensor-op math and no "
                     "direct-sum result is further than %.3g from the fp32 CPU (TF32 rounding shows above %.0e)",
                     info.major, info.minor, worst, TF32_SIGNATURE);
        if (info.major < 8)
            printf("  sm_%d%d has no TF32: the tensor-op check does not apply\n", info.major, info.minor);
    }
    rt_model_ctx_destroy(g_gpu);
    g_gpu = fp32;
}

/* ---- relu, add, copy --------------------------------------------------------------- */

static void test_elementwise(void **state) {
    (void)state;
    const size_t n = 100003; /* not a multiple of the block size */
    float *ha = rt_test_randn(n, 1.0f), *hb = rt_test_randn(n, 1.0f);
    ha[0] = 0.0f, ha[1] = -0.0f; /* relu's edge */
    float *da = gt_dev_copy(ha, n), *db = gt_dev_copy(hb, n), *dy = gt_dev_nan(n);
    float *cy = rt_test_nans(n), *cx = rt_test_floats(n);

    assert_rt_ok(rt_relu_forward(g_cpu, n, (rt_act *)ha, (rt_act *)cy));
    assert_rt_ok(rt_relu_forward(g_gpu, n, (rt_act *)da, (rt_act *)dy));
    gt_check_exact("relu forward", cy, dy, n);
    /* backward from the output, in place on dy */
    float *cdx = rt_test_floats(n);
    memcpy(cdx, hb, n * sizeof(float));
    float *gdx = gt_dev_copy(hb, n);
    assert_rt_ok(rt_relu_backward(g_cpu, n, (rt_act *)cy, (rt_act *)cdx, (rt_act *)cdx));
    assert_rt_ok(rt_relu_backward(g_gpu, n, (rt_act *)dy, (rt_act *)gdx, (rt_act *)gdx));
    gt_check_exact("relu backward (in place)", cdx, gdx, n);
    /* relu in place */
    memcpy(cx, ha, n * sizeof(float));
    float *gx = gt_dev_copy(ha, n);
    assert_rt_ok(rt_relu_forward(g_cpu, n, (rt_act *)cx, (rt_act *)cx));
    assert_rt_ok(rt_relu_forward(g_gpu, n, (rt_act *)gx, (rt_act *)gx));
    gt_check_exact("relu forward (in place)", cx, gx, n);

    gt_poison(dy, n * sizeof(float));
    assert_rt_ok(rt_add_forward(g_cpu, n, (rt_act *)ha, (rt_act *)hb, (rt_act *)cy));
    assert_rt_ok(rt_add_forward(g_gpu, n, (rt_act *)da, (rt_act *)db, (rt_act *)dy));
    gt_check_exact("add forward", cy, dy, n);
    assert_rt_ok(rt_add_backward(g_cpu, n, (rt_act *)ha, (rt_act *)cy));
    assert_rt_ok(rt_add_backward(g_gpu, n, (rt_act *)da, (rt_act *)dy));
    gt_check_exact("add backward (accumulate)", cy, dy, n);

    gt_poison(dy, n * sizeof(float));
    assert_rt_ok(rt_flatten_forward(g_gpu, 1, 1, 1, (int)n, (rt_act *)da, dy));
    gt_check_exact("copy (flatten)", ha, dy, n);

    free(ha), free(hb), free(cy), free(cx), free(cdx);
    gt_free(da), gt_free(db), gt_free(dy), gt_free(gdx), gt_free(gx);
}

/* ---- max pooling -------------------------------------------------------------------- */

static void pool_case(int n, int c, int h, int w, int k, int s, int pad, bool ties) {
    rt_maxpool2d l;
    assert_rt_ok(rt_maxpool2d_init(&l, c, h, w, k, s, pad));
    assert_rt_ok(rt_maxpool2d_prepare(g_cpu, &l, n));
    rt_maxpool2d lg = l;
    assert_rt_ok(rt_maxpool2d_prepare(g_gpu, &lg, n));
    const size_t xn = (size_t)n * c * h * w, yn = (size_t)n * c * l.out_h * l.out_w;
    float *hx = rt_test_randn(xn, 1.0f), *hdy = rt_test_randn(yn, 1.0f);
    if (ties) /* few distinct values: many windows with tied maxima (the first must win) */
        for (size_t i = 0; i < xn; i++) hx[i] = roundf(hx[i] * 2.0f) * 0.5f;
    float *dx_in = gt_dev_copy(hx, xn), *ddy = gt_dev_copy(hdy, yn);
    float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gy = gt_dev_nan(yn), *gdx = gt_dev_nan(xn);
    char what[96];
    assert_rt_ok(rt_maxpool2d_forward(g_cpu, &l, n, (rt_act *)hx, (rt_act *)cy));
    assert_rt_ok(rt_maxpool2d_forward(g_gpu, &lg, n, (rt_act *)dx_in, (rt_act *)gy));
    snprintf(what, sizeof what, "maxpool %dx%d k%d s%d p%d%s forward", h, w, k, s, pad, ties ? " ties" : "");
    gt_check_exact(what, cy, gy, yn);
    assert_rt_ok(rt_maxpool2d_backward(g_cpu, &l, n, (rt_act *)hx, (rt_act *)cy, (rt_act *)hdy, (rt_act *)cdx));
    assert_rt_ok(rt_maxpool2d_backward(g_gpu, &lg, n, (rt_act *)dx_in, (rt_act *)gy, (rt_act *)ddy, (rt_act *)gdx));
    snprintf(what, sizeof what, "maxpool %dx%d k%d s%d p%d%s backward", h, w, k, s, pad, ties ? " ties" : "");
    gt_check_exact(what, cdx, gdx, xn);
    rt_maxpool2d_release(g_cpu, &l);
    rt_maxpool2d_release(g_gpu, &lg);
    free(hx), free(hdy), free(cy), free(cdx);
    gt_free(dx_in), gt_free(ddy), gt_free(gy), gt_free(gdx);
}

static void test_maxpool2d(void **state) {
    (void)state;
    pool_case(4, 16, 14, 14, 3, 2, 1, false); /* ResNet stem */
    pool_case(4, 16, 14, 14, 3, 2, 1, true);
    pool_case(3, 5, 15, 13, 3, 2, 1, true);   /* odd sizes */
    pool_case(5, 10, 24, 24, 2, 2, 0, false); /* Net */
    pool_case(5, 10, 24, 24, 2, 2, 0, true);
    pool_case(2, 3, 9, 9, 3, 1, 1, true); /* overlapping stride-1 windows */
}

/* ---- global average pooling -------------------------------------------------------- */

static void test_avgpool(void **state) {
    (void)state;
    const int cases[][3] = {{8, 64, 49}, {8, 512, 1}, {5, 32, 16}};
    for (int ci = 0; ci < 3; ci++) {
        const int n = cases[ci][0], c = cases[ci][1], hw = cases[ci][2];
        const size_t xn = (size_t)n * c * hw, yn = (size_t)n * c;
        float *hx = rt_test_randn(xn, 1.0f), *hdy = rt_test_randn(yn, 1.0f);
        float *dx_in = gt_dev_copy(hx, xn), *ddy = gt_dev_copy(hdy, yn);
        float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gy = gt_dev_nan(yn), *gdx = gt_dev_nan(xn);
        assert_rt_ok(rt_avgpool_forward(g_cpu, n, c, hw, (rt_act *)hx, cy));
        assert_rt_ok(rt_avgpool_forward(g_gpu, n, c, hw, (rt_act *)dx_in, gy));
        gt_check_exact("avgpool forward", cy, gy, yn);
        assert_rt_ok(rt_avgpool_backward(g_cpu, n, c, hw, hdy, (rt_act *)cdx));
        assert_rt_ok(rt_avgpool_backward(g_gpu, n, c, hw, ddy, (rt_act *)gdx));
        gt_check_exact("avgpool backward", cdx, gdx, xn);
        free(hx), free(hdy), free(cy), free(cdx);
        gt_free(dx_in), gt_free(ddy), gt_free(gy), gt_free(gdx);
    }
}

/* ---- linear ------------------------------------------------------------------------ */

static void linear_case(int max_n, int in_f, int out_f) {
    rt_linear c, g;
    rt_arena cp, cg, gp, gg;
    assert_rt_ok(rt_linear_init(&c, in_f, out_f));
    g = c;
    rt_arena_init(&cp, rt_device_cpu()), rt_arena_init(&cg, rt_device_cpu());
    rt_arena_init(&gp, g_gpu->device), rt_arena_init(&gg, g_gpu->device);
    assert_rt_ok(rt_tensor_place(&c.weight, &cp));
    c.dweight = rt_tensor_in(&c.weight, &cg);
    assert_rt_ok(rt_tensor_place(&c.bias, &cp));
    c.dbias = rt_tensor_in(&c.bias, &cg);
    assert_rt_ok(rt_tensor_place(&g.weight, &gp));
    g.dweight = rt_tensor_in(&g.weight, &gg);
    assert_rt_ok(rt_tensor_place(&g.bias, &gp));
    g.dbias = rt_tensor_in(&g.bias, &gg);
    cg.size = cp.size, gg.size = gp.size;
    assert_rt_ok(rt_arena_alloc(&cp));
    assert_rt_ok(rt_arena_alloc(&cg));
    assert_rt_ok(rt_arena_alloc(&gp));
    assert_rt_ok(rt_arena_alloc(&gg));
    gt_sync();
    const size_t wn = (size_t)out_f * in_f;
    float *hw = rt_test_randn(wn, (float)(1.0 / sqrt((double)in_f))), *hb = rt_test_randn((size_t)out_f, 0.5f);
    memcpy(rt_tensor_data(&c.weight), hw, wn * sizeof(float));
    memcpy(rt_tensor_data(&c.bias), hb, out_f * sizeof(float));
    gt_upload(rt_tensor_data(&g.weight), hw, wn * sizeof(float));
    gt_upload(rt_tensor_data(&g.bias), hb, out_f * sizeof(float));
    size_t ws = 0;
    assert_rt_ok(rt_linear_prepare(g_cpu, &c, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_cpu, ws));
    assert_rt_ok(rt_linear_prepare(g_gpu, &g, max_n, &ws));
    assert_rt_ok(rt_model_ctx_reserve(g_gpu, ws));
    const int ns[2] = {max_n, max_n / 2 + 1};
    for (int ni = 0; ni < 2; ni++) {
        const int n = ns[ni];
        const size_t xn = (size_t)n * in_f, yn = (size_t)n * out_f;
        char what[96];
        float *hx = rt_test_randn(xn, 1.0f), *hdy = rt_test_randn(yn, 1.0f);
        float *dx_in = gt_dev_copy(hx, xn), *ddy = gt_dev_copy(hdy, yn);
        float *cy = rt_test_nans(yn), *cdx = rt_test_nans(xn), *gy = gt_dev_nan(yn), *gdx = gt_dev_nan(xn);
        assert_rt_ok(rt_linear_forward(g_cpu, &c, n, hx, cy));
        assert_rt_ok(rt_linear_forward(g_gpu, &g, n, dx_in, gy));
        snprintf(what, sizeof what, "linear %d->%d n=%d forward", in_f, out_f, n);
        gt_check_dev(what, cy, gy, yn, TOL_FWD);
        gt_poison(rt_tensor_data(&g.dweight), wn * sizeof(float));
        gt_poison(rt_tensor_data(&g.dbias), out_f * sizeof(float));
        assert_rt_ok(rt_linear_backward(g_cpu, &c, n, hx, hdy, cdx));
        assert_rt_ok(rt_linear_backward(g_gpu, &g, n, dx_in, ddy, gdx));
        gt_check_dev("  dx", cdx, gdx, xn, TOL_GRAD);
        gt_check_dev("  dweight", rt_tensor_data(&c.dweight), rt_tensor_data(&g.dweight), wn, TOL_GRAD);
        gt_check_exact("  dbias", rt_tensor_data(&c.dbias), rt_tensor_data(&g.dbias), (size_t)out_f);
        gt_poison(rt_tensor_data(&g.dweight), wn * sizeof(float));
        assert_rt_ok(rt_linear_backward(g_gpu, &g, n, dx_in, ddy, NULL));
        gt_check_dev("  dweight (dx NULL)", rt_tensor_data(&c.dweight), rt_tensor_data(&g.dweight), wn, TOL_GRAD);
        free(hx), free(hdy), free(cy), free(cdx);
        gt_free(dx_in), gt_free(ddy), gt_free(gy), gt_free(gdx);
    }
    rt_linear_release(g_cpu, &c);
    rt_linear_release(g_gpu, &g);
    rt_arena_free(&cp), rt_arena_free(&cg), rt_arena_free(&gp), rt_arena_free(&gg);
    free(hw), free(hb);
}

static void test_linear(void **state) {
    (void)state;
    linear_case(8, 512, 10);  /* ResNet fc */
    linear_case(8, 320, 50);  /* Net fc1 */
    linear_case(9, 50, 10);   /* Net fc2 */
    linear_case(33, 129, 67); /* odd sizes */
}

/* ---- dropout ----------------------------------------------------------------------- */

static void dropout_case(float p, bool channelwise, int n, int c, int h, int w) {
    rt_dropout lc, lg;
    const uint64_t seed = g_seed ^ 0x5eedu, subseq = 3;
    assert_rt_ok(rt_dropout_init(&lc, p, channelwise, c, h, w, seed, subseq));
    lg = lc;
    const size_t cnt = (size_t)n * c * h * w, draws = cnt / (size_t)lc.plane;
    float *cmask = rt_test_nans(draws);
    lc.mask = cmask;
    lg.mask = gt_dev_nan(draws);
    float *hx = rt_test_randn(cnt, 1.0f), *hdy = rt_test_randn(cnt, 1.0f);
    float *dx_in = gt_dev_copy(hx, cnt), *ddy = gt_dev_copy(hdy, cnt);
    float *cy = rt_test_nans(cnt), *cdx = rt_test_nans(cnt), *gy = gt_dev_nan(cnt), *gdx = gt_dev_nan(cnt);
    for (int rep = 0; rep < 2; rep++) { /* the second draw continues the counter */
        char what[96];
        assert_rt_ok(rt_dropout_forward(g_cpu, &lc, n, (rt_act *)hx, (rt_act *)cy, true));
        assert_rt_ok(rt_dropout_forward(g_gpu, &lg, n, (rt_act *)dx_in, (rt_act *)gy, true));
        assert_true(lc.counter == lg.counter);
        snprintf(what, sizeof what, "dropout p=%.2f%s draw %d mask", (double)p, channelwise ? " 2d" : "", rep);
        gt_check_exact(what, cmask, lg.mask, draws);
        gt_check_exact("  forward", cy, gy, cnt);
        assert_rt_ok(rt_dropout_backward(g_cpu, &lc, n, (rt_act *)hdy, (rt_act *)cdx));
        assert_rt_ok(rt_dropout_backward(g_gpu, &lg, n, (rt_act *)ddy, (rt_act *)gdx));
        gt_check_exact("  backward", cdx, gdx, cnt);
    }
    /* evaluation: a copy */
    gt_poison(gy, cnt * sizeof(float));
    assert_rt_ok(rt_dropout_forward(g_gpu, &lg, n, (rt_act *)dx_in, (rt_act *)gy, false));
    gt_check_exact("  eval forward (copy)", hx, gy, cnt);
    free(cmask), free(hx), free(hdy), free(cy), free(cdx);
    gt_free(lg.mask), gt_free(dx_in), gt_free(ddy), gt_free(gy), gt_free(gdx);
}

static void test_dropout(void **state) {
    (void)state;
    dropout_case(0.5f, false, 8, 50, 1, 1);
    dropout_case(0.5f, true, 8, 20, 8, 8);
    dropout_case(0.3f, false, 7, 13, 5, 3);
}

/* ---- losses ------------------------------------------------------------------------ */

static void test_losses(void **state) {
    (void)state;
    const int cases[][2] = {{8, 10}, {64, 10}, {300, 7}, {5, 1000}};
    for (int ci = 0; ci < 4; ci++) {
        const int n = cases[ci][0], k = cases[ci][1];
        const size_t nk = (size_t)n * k;
        char what[96];
        float *hx = rt_test_randn(nk, 3.0f), *hdy = rt_test_randn(nk, 1.0f);
        int64_t *hl = gt_labels((size_t)n, k);
        float *dx_in = gt_dev_copy(hx, nk), *ddy = gt_dev_copy(hdy, nk);
        int64_t *dl = gt_dev((size_t)n * sizeof(int64_t));
        gt_upload(dl, hl, (size_t)n * sizeof(int64_t));
        float *cd = rt_test_nans(nk), *gd = gt_dev_nan(nk), *gloss = gt_dev_nan(1), closs = NAN;
        float *cy = rt_test_nans(nk), *gy = gt_dev_nan(nk);

        assert_rt_ok(rt_softmax_xent(g_cpu, n, k, hx, hl, &closs, cd));
        assert_rt_ok(rt_softmax_xent(g_gpu, n, k, dx_in, dl, gloss, gd));
        snprintf(what, sizeof what, "softmax_xent n=%d k=%d loss", n, k);
        gt_check_dev(what, &closs, gloss, 1, TOL_FWD);
        gt_check_dev("  dlogits", cd, gd, nk, TOL_GRAD);
        /* label smoothing (CrossEntropyLoss(label_smoothing=0.1)) */
        gt_poison(gd, nk * sizeof(float));
        gt_poison(gloss, sizeof(float));
        assert_rt_ok(rt_softmax_xent_smooth(g_cpu, n, k, hx, hl, 0.1, &closs, cd));
        assert_rt_ok(rt_softmax_xent_smooth(g_gpu, n, k, dx_in, dl, 0.1, gloss, gd));
        snprintf(what, sizeof what, "softmax_xent smoothing 0.1 n=%d k=%d loss", n, k);
        gt_check_dev(what, &closs, gloss, 1, TOL_FWD);
        gt_check_dev("  dlogits", cd, gd, nk, TOL_GRAD);

        assert_rt_ok(rt_log_softmax_forward(g_cpu, n, k, hx, cy));
        assert_rt_ok(rt_log_softmax_forward(g_gpu, n, k, dx_in, gy));
        snprintf(what, sizeof what, "log_softmax n=%d k=%d forward", n, k);
        gt_check_dev(what, cy, gy, nk, TOL_FWD);
        gt_poison(gd, nk * sizeof(float));
        assert_rt_ok(rt_log_softmax_backward(g_cpu, n, k, cy, hdy, cd));
        assert_rt_ok(rt_log_softmax_backward(g_gpu, n, k, gy, ddy, gd));
        gt_check_dev("  backward", cd, gd, nk, TOL_GRAD);

        gt_poison(gd, nk * sizeof(float));
        gt_poison(gloss, sizeof(float));
        assert_rt_ok(rt_nll_loss(g_cpu, n, k, cy, hl, &closs, cd));
        assert_rt_ok(rt_nll_loss(g_gpu, n, k, gy, dl, gloss, gd));
        snprintf(what, sizeof what, "nll_loss n=%d k=%d loss", n, k);
        gt_check_dev(what, &closs, gloss, 1, TOL_FWD);
        gt_check_exact("  dlogp", cd, gd, nk);

        free(hx), free(hdy), free(hl), free(cd), free(cy);
        gt_free(dx_in), gt_free(ddy), gt_free(dl), gt_free(gd), gt_free(gloss), gt_free(gy);
    }
    /* a label out of range: the GPU cannot fail the call without a host sync; the loss
     * comes back NaN */
    if (rt_device_is_cuda(g_gpu->device)) {
        const int n = 4, k = 10;
        float *hx = rt_test_randn((size_t)n * k, 1.0f);
        int64_t hl[4] = {1, 2, 10, 3};
        float *dx_in = gt_dev_copy(hx, (size_t)n * k), *gloss = gt_dev_nan(1), loss = 0;
        int64_t *dl = gt_dev(sizeof hl);
        gt_upload(dl, hl, sizeof hl);
        assert_rt_ok(rt_softmax_xent(g_gpu, n, k, dx_in, dl, gloss, NULL));
        gt_download(&loss, gloss, sizeof loss);
        printf("  softmax_xent with label 10 of 10 classes: loss %g\n", (double)loss);
        assert_true(isnan(loss));
        free(hx);
        gt_free(dx_in), gt_free(gloss), gt_free(dl);
    }
}

/* ---- device memory ------------------------------------------------------------------ */

static void test_mem_used(void **state) {
    (void)state;
    size_t used = 1, backend = 1;
    assert_rt_ok(rt_model_ctx_memory(g_cpu, &used, &backend));
    assert_true(used == 0 && backend == 0); /* the CPU context has no device memory */
    if (!rt_device_is_cuda(g_gpu->device)) return;
    const size_t n = 70001;
    float *w = rt_test_randn(n, 1.0f);
    float *dw = gt_dev_copy(w, n);
    assert_rt_ok(rt_model_ctx_memory(g_gpu, &used, &backend));
    assert_true(used >= n * sizeof(float));
    assert_true(backend > 0);
    free(w);
    gt_free(dw);
}

int main(void) {
    GT_SKIP_WITHOUT_GPU();
    g_seed = gt_pick_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_batchnorm2d),
        cmocka_unit_test(test_batchnorm2d_fused),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_maxpool2d),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_mem_used),
        cmocka_unit_test(test_conv2d_train_fp32),
        cmocka_unit_test(test_batchnorm2d_train),
        cmocka_unit_test(test_train_shapes_tf32),
    };
    return cmocka_run_group_tests(tests, gt_setup, gt_teardown);
}
