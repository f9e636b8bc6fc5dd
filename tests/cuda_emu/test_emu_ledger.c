/* The cost ledger of the emulated GPUs (tests/cuda_emu/ledger.cpp, kernel_costs.cpp;
 * docs/gpu.md "The cost ledger"):
 *  - every __global__ kernel of the sources (the list is generated from the .cu files) has
 *    an entry in the one cost table, and the table has no entry for a kernel that does
 *    not exist;
 *  - a kernel without an entry is counted and named by the ledger;
 *  - every entry's bytes equal the sizes of the tensors this test launches it on,
 *    computed here from the shapes (each tensor read or written once at its element size);
 *  - cuDNN, cuBLAS, copies and fills cost what their shapes and types say, with the math
 *    their descriptors choose; host synchronisations and the other counts add up;
 *  - a captured graph's operations count at each of its launches, marked captured, with
 *    one graph launch each; capturing counts nothing;
 *  - count-only mode records without computing.
 * The kernel cases run in count-only mode (the launches are checked and recorded, the
 * emulation skips their arithmetic): only the costs matter here.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/device.h"
#include "core/rng.h"
#include "dist/internal/bf16_cuda.h"
#include "model/cuda/cuda_internal.h"
#include "model/cuda/syncbn_cuda.h"
#include "optim/clip.h"
#include "optim/internal/optim_kernels.h"
#include "rt_emu_ledger.h"

#define assert_cuda(expr) assert_int_equal((int)(expr), (int)cudaSuccess)

static const rt_act_format k_nchw_f32 = {RT_F32, RT_ACT_NCHW, 1}; /* the kernels' format argument */
static const char *const k_kernels[] = {
#include "rt_emu_kernel_list.h"
};

/* the unlisted test kernel (test_emu_ledger_kernel.cu) */
cudaError_t rt_emu_test_unlisted_launch(cudaStream_t s, float *x);

static cudaStream_t g_s;
static rt_stream *g_stream;
static char *g_pool; /* one device allocation, handed out in pieces */
static size_t g_used;
#define POOL_BYTES ((size_t)8 << 20)

static void *dev(size_t bytes) {
    void *p = g_pool + g_used;
    g_used += (bytes + 255) / 256 * 256;
    assert_true(g_used <= POOL_BYTES);
    return p;
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(rt_stream_create(rt_device_cuda(0), &g_stream), RT_OK);
    g_s = (cudaStream_t)rt_stream_native(g_stream);
    assert_cuda(cudaMalloc((void **)&g_pool, POOL_BYTES));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cudaFree(g_pool);
    rt_stream_destroy(g_stream);
    return 0;
}

/* the operations recorded since the reset */
static rt_cost_op g_ops[16];
static size_t recorded(void) { return rt_emu_ledger_ops(g_ops, 0, 16); }

static void begin(int mode) {
    rt_emu_ledger_enable(0);
    assert_int_equal(rt_emu_ledger_enable(mode), mode);
    rt_emu_ledger_reset();
    g_used = 0;
}

/* operation i is `name`, reading rd and writing wr device bytes */
static void expect_op(size_t i, const char *name, double rd, double wr) {
    assert_true(i < recorded());
    const rt_cost_op *o = &g_ops[i];
    if (strcmp(o->name, name) != 0 || o->bytes_read != rd || o->bytes_written != wr)
        fail_msg("operation %zu: %s read %.0f, wrote %.0f bytes; expected %s reading %.0f, writing %.0f", i, o->name,
                 o->bytes_read, o->bytes_written, name, rd, wr);
}

/* ---- the table against the sources ------------------------------------------------ */

static bool listed(const char *name) {
    for (size_t i = 0; i < sizeof k_kernels / sizeof k_kernels[0]; i++)
        if (strcmp(k_kernels[i], name) == 0) return true;
    return false;
}

static void test_every_kernel_has_an_entry(void **state) {
    (void)state;
    int missing = 0, stale = 0;
    for (size_t i = 0; i < sizeof k_kernels / sizeof k_kernels[0]; i++)
        if (!rt_emu_kernel_cost_known(k_kernels[i])) {
            printf("kernel %s has no cost entry in tests/cuda_emu/kernel_costs.cpp\n", k_kernels[i]);
            missing++;
        }
    size_t n = 0;
    const char *const *names = rt_emu_kernel_cost_names(&n);
    for (size_t i = 0; i < n; i++)
        if (!listed(names[i])) {
            printf("cost entry %s names no __global__ kernel of src/*/cuda/*.cu\n", names[i]);
            stale++;
        }
    printf("%zu kernels in the sources, %zu cost entries\n", sizeof k_kernels / sizeof k_kernels[0], n);
    assert_int_equal(missing, 0);
    assert_int_equal(stale, 0);
}

static void test_unknown_kernel_named(void **state) {
    (void)state;
    begin(2);
    float *x = dev(sizeof(float));
    assert_cuda(rt_emu_test_unlisted_launch(g_s, x));
    assert_cuda(rt_emu_test_unlisted_launch(g_s, x));
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_int_equal(l.launches, 2);
    assert_int_equal(l.unknown_kernels, 2);
    assert_string_equal(l.unknown_names, "ledger_test_unlisted_kernel"); /* once */
}

/* ---- every kernel entry against the tensors it is launched on --------------------- */

static void test_model_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t n = 1000, F = sizeof(float), H = sizeof(uint16_t);
    float *a = dev(n * F), *b = dev(n * F), *y = dev(n * F);
    uint16_t *h = dev(n * H);
    assert_cuda(rt_cuk_relu_forward(g_s, RT_F32, n, a, y));
    expect_op(0, "relu_fw_kernel", n * F, n * F);
    assert_cuda(rt_cuk_relu_backward(g_s, RT_F32, n, a, b, y));
    expect_op(1, "relu_bw_kernel", 2 * n * F, n * F);
    assert_cuda(rt_cuk_add(g_s, RT_F32, n, a, b, y));
    expect_op(2, "add_kernel", 2 * n * F, n * F);
    assert_cuda(rt_cuk_accumulate(g_s, RT_F32, n, a, y)); /* y += a */
    expect_op(3, "acc_kernel", 2 * n * F, n * F);
    assert_cuda(rt_cuk_to_bf16(g_s, n, a, h));
    expect_op(4, "to_bf16_kernel", n * F, n * H);
    assert_cuda(rt_cuk_from_bf16(g_s, n, h, y, false));
    expect_op(5, "from_bf16_kernel", n * H, n * F);
    assert_cuda(rt_cuk_from_bf16(g_s, n, h, y, true)); /* y += widen(h) */
    expect_op(6, "from_bf16_kernel", n * H + n * F, n * F);
    assert_cuda(rt_cuk_round_bf16(g_s, n, y));
    expect_op(7, "round_bf16_kernel", n * F, n * F);
    assert_cuda(rt_cuk_increment_i64(g_s, (int64_t *)a));
    expect_op(8, "increment_i64_kernel", 8, 8);
    assert_int_equal(recorded(), 9);
}

static void test_pool_and_bias_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), H = sizeof(uint16_t);
    /* (2, 3, 8, 8) -> max pool k3 s2 p1 -> (2, 3, 4, 4) */
    rt_maxpool2d mp = {.c = 3, .in_h = 8, .in_w = 8, .out_h = 4, .out_w = 4, .k = 3, .stride = 2, .pad = 1};
    const size_t nx = 2 * 3 * 64, ny = 2 * 3 * 16;
    float *x = dev(nx * F), *y = dev(ny * F), *dx = dev(nx * F), *dy = dev(ny * F);
    assert_cuda(rt_cuk_maxpool_forward(g_s, k_nchw_f32, &mp, 2, x, y));
    expect_op(0, "maxpool_fw_kernel", nx * F, ny * F);
    assert_cuda(rt_cuk_maxpool_backward(g_s, k_nchw_f32, &mp, 2, x, dy, dx));
    expect_op(1, "maxpool_bw_kernel", (nx + ny) * F, nx * F);
    /* global average pooling of (2, 3, 8, 8) -> (2, 3) */
    assert_cuda(rt_cuk_avgpool_forward(g_s, k_nchw_f32, 2, 3, 64, x, y));
    expect_op(2, "avgpool_fw_kernel", nx * F, 6 * F);
    assert_cuda(rt_cuk_avgpool_backward(g_s, k_nchw_f32, 2, 3, 64, dy, dx));
    expect_op(3, "avgpool_bw_kernel", 6 * F, nx * F);
    /* linear bias: y (5, 7) rows = b (7); db (7) = column sums of dy (5, 7) */
    assert_cuda(rt_cuk_bias_rows(g_s, 5, 7, x, y));
    expect_op(4, "bias_rows_kernel", 7 * F, 35 * F);
    assert_cuda(rt_cuk_column_sums(g_s, 5, 7, dy, x));
    expect_op(5, "column_sums_kernel", 35 * F, 7 * F);
    /* bf16 conv bias pieces: y (2, 4, 9) bf16 from b (4); db (4) from dy (2, 4, 9) bf16 */
    uint16_t *yb = dev(72 * H);
    assert_cuda(rt_cuk_bf16_fill_channels(g_s, 2, 4, 9, true, x, yb));
    expect_op(6, "bf16_fill_channels_kernel", 4 * F, 72 * H);
    assert_cuda(rt_cuk_bf16_channel_sums(g_s, 2, 4, 9, false, yb, x));
    expect_op(7, "bf16_channel_sums_kernel", 72 * H, 4 * F);
    /* dropout2d over (2, 3, 4, 4): one mask value per (image, channel) */
    rt_dropout dr = {.p = 0.5f, .channelwise = true, .c = 3, .features = 48, .plane = 16, .seed = 1, .mask = dev(6 * F)};
    assert_cuda(rt_cuk_dropout_forward(g_s, k_nchw_f32, &dr, 2, x, y));
    expect_op(8, "dropout_mask_kernel", 0, 6 * F);
    expect_op(9, "dropout_apply_kernel", (6 + 96) * F, 96 * F);
    assert_cuda(rt_cuk_dropout_backward(g_s, k_nchw_f32, &dr, 2, dy, dx));
    expect_op(10, "dropout_apply_kernel", (6 + 96) * F, 96 * F);
    assert_int_equal(recorded(), 11);
}

/* the convolutions' NHWC kernels (convw_cuda.cu): bytes at the activations' element size */
static void test_convw_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), H = sizeof(uint16_t);
    /* two copies in one launch: a stem 3->4 k3 padded to 8 channels (4*8*9 = 288 written
     * from 4*3*9 = 108 read), a 4->4 k1 (16 from 16) */
    rt_cuk_wcopy t[2] = {{.src = 0, .dst = 0, .gsrc = 0, .out_c = 4, .in_c = 3, .x_c = 8, .taps = 9, .nhwc = 1},
                         {.src = 108, .dst = 384, .gsrc = 108, .out_c = 4, .in_c = 4, .x_c = 4, .taps = 1, .nhwc = 1}};
    rt_cuk_wcopy *td = dev(sizeof t);
    assert_cuda(cudaMemcpy(td, t, sizeof t, cudaMemcpyHostToDevice));
    float *w = dev(124 * F), *dw = dev(108 * F), *b = dev(4 * F), *db = dev(4 * F);
    uint16_t *copies = dev(400 * H), *act = dev(2 * 8 * 9 * H), *act2 = dev(2 * 8 * 9 * H);
    begin(2);
    assert_cuda(rt_cuk_convw_refresh(g_s, 2, td, w, copies, true, 124, 304, 288));
    expect_op(0, "convw_refresh_kernel", 2 * sizeof t[0] + 124 * F, 304 * H);
    assert_cuda(rt_cuk_convw_dw(g_s, 4, 3, 8, 9, true, true, copies, dw));
    expect_op(1, "convw_dw_kernel", 108 * H, 108 * F);
    assert_cuda(rt_cuk_convw_dw(g_s, 4, 3, 8, 9, true, false, w, dw));
    expect_op(2, "convw_dw_kernel", 108 * F, 108 * F);
    /* the deferred dW (bf16, the copies' layout) of both in one launch (108 + 16 written),
     * then of the second alone; an empty range launches nothing */
    assert_cuda(rt_cuk_convw_grads(g_s, 0, 2, td, copies, w, true, 124, 108));
    expect_op(3, "convw_grads_kernel", 2 * sizeof t[0] + 124 * H, 124 * F);
    assert_cuda(rt_cuk_convw_grads(g_s, 1, 1, td, copies, w, true, 16, 16));
    expect_op(4, "convw_grads_kernel", sizeof t[0] + 16 * H, 16 * F);
    assert_cuda(rt_cuk_convw_grads(g_s, 2, 0, td, copies, w, true, 0, 0));
    /* bias pieces over (2, 4, 9): y filled from b (4); db from dy */
    assert_cuda(rt_cuk_conv_bias_fill(g_s, 2, 4, 9, true, true, b, act));
    expect_op(5, "conv_bias_fill_kernel", 4 * F, 72 * H);
    assert_cuda(rt_cuk_conv_bias_sums(g_s, 2, 4, 9, true, false, w, db));
    expect_op(6, "conv_bias_sums_kernel", 72 * F, 4 * F);
    /* the fallback's conversion of (2, 8, 9) bf16 */
    assert_cuda(rt_cuk_act_relayout(g_s, 2, 8, 9, false, true, act, act2));
    expect_op(7, "act_relayout_kernel", 144 * H, 144 * H);
    assert_int_equal(recorded(), 8);
}

/* batch norm over (2, 3, 5): one slice per channel (rt_cuk_bn_splits), so each channel's
 * block stores its two double partials and takes its integer ticket once */
static void test_bn_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), D = sizeof(double), I = sizeof(int), L = sizeof(int64_t), C = 3, N = 30;
    assert_int_equal(rt_cuk_bn_splits(2, 3, 5, false), 1);
    float *x = dev(N * F), *r = dev(N * F), *y = dev(N * F), *dy = dev(N * F), *v = dev(16 * C * F);
    rt_cuk_bn_args a = {.weight = v,
                        .bias = v + C,
                        .running_mean = v + 2 * C,
                        .running_var = v + 3 * C,
                        .save_mean = v + 4 * C,
                        .save_invstd = v + 5 * C,
                        .dweight = v + 6 * C,
                        .dbias = v + 7 * C,
                        .num_batches_tracked = dev(L),
                        .momentum = 0.1f,
                        .eps = 1e-5f,
                        .partial = dev(2 * C * D),
                        .factors = v + 8 * C,
                        .tickets = dev(C * I)};
    const rt_cuk_bn_shape sh = {.n = 2, .c = (int)C, .plane = 5};
    const double part = 2 * C * D + C * I; /* partials and tickets, each read and written */
    assert_cuda(rt_cuk_bn_forward(g_s, &a, sh, x, r, y, true, true));
    expect_op(0, "bn_stats_kernel", N * F + part + 4 * C * F + L, part + 4 * C * F + L + 2 * C * F);
    expect_op(1, "bn_apply_kernel", 2 * N * F + 2 * C * F, N * F);
    assert_cuda(rt_cuk_bn_forward(g_s, &a, sh, x, NULL, y, false, false));
    expect_op(2, "bn_eval_factors_kernel", 4 * C * F, 2 * C * F);
    expect_op(3, "bn_apply_kernel", N * F + 2 * C * F, N * F);
    assert_cuda(rt_cuk_bn_backward(g_s, &a, sh, x, y, dy, r, false, NULL)); /* through the relu of output y */
    expect_op(4, "bn_dsums_kernel", 3 * N * F + part + 3 * C * F, part + 2 * C * F + 4 * C * F);
    expect_op(5, "bn_dx_kernel", 3 * N * F + 4 * C * F, N * F);
    assert_cuda(rt_cuk_bn_backward(g_s, &a, sh, x, NULL, dy, r, true, NULL)); /* no relu, dx accumulated */
    expect_op(6, "bn_dsums_kernel", 2 * N * F + part + 3 * C * F, part + 2 * C * F + 4 * C * F);
    expect_op(7, "bn_dx_kernel", 3 * N * F + 4 * C * F, N * F);
    assert_int_equal(recorded(), 8);
}

/* batch norm in bf16 NHWC over (2, 40, 300): 600 rows of 40 channels, so 2 channel groups
 * (32 + 8 lanes' channels) x 3 row tiles (rt_cuk_bn_splits: 256 rows each at least) = 6
 * blocks; each (channel, tile) stores its two double partials, each block takes its
 * group's ticket once. The synchronised sums take the same tiling. */
static void test_bn_nhwc_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), D = sizeof(double), I = sizeof(int), L = sizeof(int64_t), H = sizeof(uint16_t);
    const size_t C = 40, N = 2 * C * 300, T = 3, B = 2 * T;
    assert_int_equal(rt_cuk_bn_splits(2, (int)C, 300, true), (int)T);
    uint16_t *x = dev(N * H), *y = dev(N * H), *dy = dev(N * H), *g = dev(N * H);
    float *v = dev(16 * C * F);
    double *sums = dev((2 * C + 1) * D);
    rt_cuk_bn_args a = {.weight = v,
                        .bias = v + C,
                        .running_mean = v + 2 * C,
                        .running_var = v + 3 * C,
                        .save_mean = v + 4 * C,
                        .save_invstd = v + 5 * C,
                        .dweight = v + 6 * C,
                        .dbias = v + 7 * C,
                        .num_batches_tracked = dev(L),
                        .momentum = 0.1f,
                        .eps = 1e-5f,
                        .partial = dev(2 * C * T * D),
                        .factors = v + 8 * C,
                        .tickets = dev(C * I)};
    const rt_cuk_bn_shape sh = {.n = 2, .c = (int)C, .plane = 300, .bf16 = 1, .nhwc = 1};
    const double part = 2 * C * T * D + B * I; /* partials and tickets, each read and written */
    assert_cuda(rt_cuk_bn_forward(g_s, &a, sh, x, NULL, y, true, false));
    expect_op(0, "bn_stats_nhwc_kernel", N * H + part + 4 * C * F + L, part + 4 * C * F + L + 2 * C * F);
    expect_op(1, "bn_apply_kernel", N * H + 2 * C * F, N * H);
    assert_cuda(rt_cuk_bn_backward(g_s, &a, sh, x, y, dy, dy, false, g)); /* through y's relu, g kept */
    expect_op(2, "bn_dsums_nhwc_kernel", 3 * N * H + part + 3 * C * F, part + 2 * C * F + 4 * C * F + N * H);
    expect_op(3, "bn_dx_kernel", 2 * N * H + 4 * C * F, N * H); /* x and g: the kept g replaces dy and act */
    const rt_act_format f = {RT_BF16, RT_ACT_NHWC, 1};
    assert_cuda(rt_cuk_syncbn_stats(g_s, f, 2, (int)C, 300, x, a.partial, a.tickets, sums));
    expect_op(4, "syncbn_stats_nhwc_kernel", N * H + part, part + (2 * C + 1) * D);
    assert_cuda(rt_cuk_syncbn_dsums(g_s, f, 2, (int)C, 300, x, y, dy, a.save_mean, a.save_invstd, a.partial,
                                    a.tickets, sums, a.dweight, a.dbias));
    expect_op(5, "syncbn_dsums_nhwc_kernel", 3 * N * H + 2 * C * F + part, part + (2 * C + 1) * D + 2 * C * F);
    assert_int_equal(recorded(), 6);
}

static void test_cast_set_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), H = sizeof(uint16_t);
    float *x0 = dev(100 * F), *x1 = dev(64 * F);
    uint16_t *y0 = dev(100 * H), *y1 = dev(64 * H);
    rt_cuk_to_bf16_set to = {0};
    rt_cuk_set_to(&to, 100, x0, y0);
    rt_cuk_set_to_nhwc(&to, 64, 4, 16, x1, y1); /* (1, 4, 16) into NHWC */
    assert_cuda(rt_cuk_to_bf16_n(g_s, &to));
    expect_op(0, "to_bf16_set_kernel", 164 * F, 164 * H);
    rt_cuk_from_bf16_set from = {0};
    rt_cuk_set_from(&from, 100, y0, x0, false);
    rt_cuk_set_from_nchw(&from, 64, 4, 16, y1, x1, true); /* x1 += widen(y1) */
    assert_cuda(rt_cuk_from_bf16_n(g_s, &from));
    expect_op(1, "from_bf16_set_kernel", 164 * H + 64 * F, 164 * F);
    assert_int_equal(recorded(), 2);
}

static void test_loss_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t F = sizeof(float), L = sizeof(int64_t), I = sizeof(int);
    const int n = 6, k = 10;
    float *logits = dev(n * k * F), *d = dev(n * k * F), *loss = dev(F);
    int64_t *labels = dev(n * L);
    int *bad = dev(I);
    assert_cuda(rt_cuk_softmax_xent(g_s, n, k, logits, labels, loss, d, bad));
    expect_op(0, "softmax_xent_kernel", n * k * F + n * L, F + n * k * F);
    assert_cuda(rt_cuk_softmax_xent(g_s, n, k, logits, labels, loss, NULL, bad)); /* no gradient */
    expect_op(1, "softmax_xent_kernel", n * k * F + n * L, F);
    assert_cuda(rt_cuk_log_softmax_forward(g_s, n, k, logits, d));
    expect_op(2, "log_softmax_fw_kernel", n * k * F, n * k * F);
    assert_cuda(rt_cuk_log_softmax_backward(g_s, n, k, logits, d, d));
    expect_op(3, "log_softmax_bw_kernel", 2 * n * k * F, n * k * F);
    assert_cuda(rt_cuk_nll_loss(g_s, n, k, logits, labels, loss, d, bad)); /* one logit per row read */
    expect_op(4, "nll_kernel", n * F + n * L, F + n * k * F);
    assert_int_equal(recorded(), 5);
}

static void test_optim_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t n = 1000, F = sizeof(float);
    rt_optimizer opt;
    memset(&opt, 0, sizeof opt);
    opt.device = rt_device_cuda(0);
    opt.n = n;
    for (int i = 0; i < 3; i++) opt.state[i] = dev(n * F);
    float *p = dev(n * F), *g = dev(n * F);
    rt_optim_scalars s;
    memset(&s, 0, sizeof s);
    opt.cfg.kind = RT_OPTIM_SGD; /* plain: p read and written, g read */
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(0, "sgd_kernel", 2 * n * F, n * F);
    s.sgd.momentum = 1; /* + the momentum buffer, read and written; + the decay mask */
    opt.backend_state = dev(32 * sizeof(uint32_t));
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(1, "sgd_kernel", 3 * n * F + 32 * sizeof(uint32_t), 2 * n * F);
    opt.backend_state = NULL;
    memset(&s, 0, sizeof s);
    opt.cfg.kind = RT_OPTIM_ADAM; /* p, m, v read and written, g read */
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(2, "adam_kernel", 4 * n * F, 3 * n * F);
    s.adam.amsgrad = 1; /* + vmax */
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(3, "adam_kernel", 5 * n * F, 4 * n * F);
    memset(&s, 0, sizeof s);
    opt.cfg.kind = RT_OPTIM_ADADELTA; /* p, square avg, acc delta read and written, g read */
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(4, "adadelta_kernel", 4 * n * F, 3 * n * F);
    opt.cfg.kind = RT_OPTIM_SGD; /* a captured step's scalars from device memory: + one struct read */
    opt.scalars_dev = dev(sizeof(rt_optim_scalars));
    opt.scalars_from_dev = true;
    assert_int_equal(rt_optim_backend_cuda.step(&opt, p, g, &s, g_stream), RT_OK);
    expect_op(5, "sgd_kernel", 2 * n * F + sizeof(rt_optim_scalars), n * F);
    assert_int_equal(recorded(), 6);
}

static void test_clip_ema_rng_dist_kernels(void **state) {
    (void)state;
    begin(2);
    const size_t n = 1000, F = sizeof(float), H = sizeof(uint16_t), D = sizeof(double);
    float *x = dev(n * F), *avg = dev(n * F);
    rt_grad_clip c = {.device = rt_device_cuda(0), .backend = &rt_optim_backend_cuda};
    assert_int_equal(rt_optim_backend_cuda.clip_init(&c), RT_OK);
    double sum = 0;
    assert_int_equal(rt_optim_backend_cuda.sumsq(&c, x, n, g_stream, &sum), RT_OK);
    expect_op(0, "sumsq_partial_kernel", n * F, 512 * D); /* one partial sum per block */
    expect_op(1, "sumsq_final_kernel", 512 * D, D);
    expect_op(2, "cudaMemcpyAsync", D, 0); /* the total to the host: device bytes read only */
    assert_int_equal(rt_optim_backend_cuda.scale(&c, x, n, 0.5f, g_stream), RT_OK);
    expect_op(3, "scale_kernel", n * F, n * F);
    assert_int_equal(rt_optim_backend_cuda.ema(avg, x, n, 0.9f, 0.1f, 1, g_stream), RT_OK); /* first: avg = p */
    expect_op(4, "ema_kernel", n * F, n * F);
    assert_int_equal(rt_optim_backend_cuda.ema(avg, x, n, 0.9f, 0.1f, 0, g_stream), RT_OK);
    expect_op(5, "ema_kernel", 2 * n * F, n * F);
    assert_int_equal(rt_optim_backend_cuda.ema_swap(avg, x, n, g_stream), RT_OK);
    expect_op(6, "ema_swap_kernel", 2 * n * F, 2 * n * F);
    rt_rng rng;
    rt_rng_init(&rng, 1, 0);
    assert_int_equal(rt_rng_uniform_dev(&rng, x, n, g_stream), RT_OK);
    expect_op(7, "uniform_kernel", 0, n * F);
    assert_int_equal(rt_rng_normal_dev(&rng, x, n, 0.0f, 1.0f, g_stream), RT_OK);
    expect_op(8, "normal_kernel", 0, n * F);
    uint16_t *h = dev(n * H), *h2 = dev(n * H);
    assert_cuda(rt_dist_bf16_pack(g_s, x, h, n));
    expect_op(9, "pack_kernel", n * F, n * H);
    assert_cuda(rt_dist_bf16_unpack(g_s, h, x, n));
    expect_op(10, "unpack_kernel", n * H, n * F);
    assert_cuda(rt_dist_bf16_combine(g_s, h, h2, n, 0, 2)); /* h = round((h + h2) / 2) */
    expect_op(11, "combine_kernel", 2 * n * H, n * H);
    assert_cuda(rt_dist_bf16_div(g_s, h, n, 2));
    expect_op(12, "div_kernel", n * H, n * H);
    assert_int_equal(recorded(), 13);
    assert_cuda(cudaStreamSynchronize(g_s));
    rt_optim_backend_cuda.clip_release(&c);
}

/* ---- libraries, copies, counts ---------------------------------------------------- */

/* x (2, 3, 8, 8) * w (4, 3, 3, 3), pad 1 -> y (2, 4, 8, 8), in all three directions */
static void conv_case(cudnnHandle_t dnn, cudnnDataType_t type, cudnnMathType_t math, int first, int expect_math) {
    const double es = type == CUDNN_DATA_BFLOAT16 ? 2 : 4, nx = 384, nw = 108, ny = 512;
    const double flops = 2.0 * 2 * 4 * 3 * 3 * 3 * 8 * 8;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    assert_int_equal(cudnnCreateTensorDescriptor(&xd), 0);
    assert_int_equal(cudnnCreateTensorDescriptor(&yd), 0);
    assert_int_equal(cudnnCreateFilterDescriptor(&wd), 0);
    assert_int_equal(cudnnCreateConvolutionDescriptor(&cd), 0);
    assert_int_equal(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, type, 2, 3, 8, 8), 0);
    assert_int_equal(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, type, 2, 4, 8, 8), 0);
    assert_int_equal(cudnnSetFilter4dDescriptor(wd, type, CUDNN_TENSOR_NCHW, 4, 3, 3, 3), 0);
    assert_int_equal(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                     0);
    assert_int_equal(cudnnSetConvolutionMathType(cd, math), 0);
    void *x = dev(384 * 4), *w = dev(108 * 4), *y = dev(512 * 4);
    const float one = 1, zero = 0;
    assert_int_equal(cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                             NULL, 0, &zero, yd, y),
                     0);
    expect_op(first, "cudnnConvolutionForward", (nx + nw) * es, ny * es);
    assert_int_equal(cudnnConvolutionBackwardData(dnn, &one, wd, w, yd, y, cd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL,
                                                  0, &zero, xd, x),
                     0);
    expect_op(first + 1, "cudnnConvolutionBackwardData", (nw + ny) * es, nx * es);
    assert_int_equal(cudnnConvolutionBackwardFilter(dnn, &one, xd, x, yd, y, cd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                                    NULL, 0, &one, wd, w), /* beta 1: dw read too */
                     0);
    expect_op(first + 2, "cudnnConvolutionBackwardFilter", (nx + ny + nw) * es, nw * es);
    for (int i = 0; i < 3; i++) {
        assert_true(g_ops[first + i].flops == flops);
        assert_int_equal(g_ops[first + i].math, expect_math);
        assert_int_equal(g_ops[first + i].kind, RT_COST_CUDNN);
        assert_int_equal(g_ops[first + i].captured, 0);
    }
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
}

static void test_cudnn_costs(void **state) {
    (void)state;
    begin(2);
    cudnnHandle_t dnn;
    assert_int_equal(cudnnCreate(&dnn), 0);
    assert_int_equal(cudnnSetStream(dnn, g_s), 0);
    conv_case(dnn, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 0, RT_COST_MATH_FP32);
    conv_case(dnn, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH, 3, RT_COST_MATH_TF32);
    conv_case(dnn, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH, 6, RT_COST_MATH_BF16);
    /* batch norm over (2, 4, 8, 8): x read, y written, 4 per-channel vectors read (scale,
     * bias, the running pair), the running and saved pairs written */
    cudnnTensorDescriptor_t xd, pd;
    assert_int_equal(cudnnCreateTensorDescriptor(&xd), 0);
    assert_int_equal(cudnnCreateTensorDescriptor(&pd), 0);
    assert_int_equal(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 2, 4, 8, 8), 0);
    assert_int_equal(cudnnSetTensor4dDescriptor(pd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 4, 1, 1), 0);
    float *x = dev(512 * 4), *y = dev(512 * 4), *v[8];
    for (int i = 0; i < 8; i++) v[i] = dev(4 * 4);
    const float one = 1, zero = 0;
    assert_int_equal(cudnnBatchNormalizationForwardTraining(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x, xd, y, pd,
                                                            v[0], v[1], 0.1, v[2], v[3], 1e-5, v[4], v[5]),
                     0);
    expect_op(9, "cudnnBatchNormalizationForwardTraining", (512 + 4 * 4) * 4, (512 + 4 * 4) * 4);
    /* backward: x and dy read, scale and the saved pair read; dx, dscale, dbias written */
    assert_int_equal(cudnnBatchNormalizationBackward(dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd, x, xd,
                                                     y, xd, x, pd, v[0], v[6], v[7], 1e-5, v[4], v[5]),
                     0);
    expect_op(10, "cudnnBatchNormalizationBackward", (2 * 512 + 3 * 4) * 4, (512 + 2 * 4) * 4);
    assert_int_equal(recorded(), 11);
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(pd);
    cudnnDestroy(dnn);
}

static void test_cublas_copies_counts(void **state) {
    (void)state;
    begin(2);
    cublasHandle_t blas;
    assert_int_equal(cublasCreate(&blas), 0);
    assert_int_equal(cublasSetStream(blas, g_s), 0);
    /* C (5 x 6) = A (5 x 7) B (7 x 6) */
    float *A = dev(35 * 4), *B = dev(42 * 4), *C = dev(30 * 4);
    const float one = 1, zero = 0;
    assert_int_equal(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 5, 6, 7, &one, A, 5, B, 7, &zero, C, 5), 0);
    expect_op(0, "cublasSgemm", (35 + 42) * 4, 30 * 4);
    assert_int_equal(g_ops[0].math, RT_COST_MATH_FP32);
    assert_true(g_ops[0].flops == 2.0 * 5 * 6 * 7);
    assert_int_equal(cublasSetMathMode(blas, CUBLAS_TF32_TENSOR_OP_MATH), 0);
    assert_int_equal(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 5, 6, 7, &one, A, 5, B, 7, &one, C, 5), 0);
    expect_op(1, "cublasSgemm", (35 + 42 + 30) * 4, 30 * 4); /* beta 1: C read */
    assert_int_equal(g_ops[1].math, RT_COST_MATH_TF32);
    assert_int_equal(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, 5, 6, 7, &one, A, CUDA_R_16BF, 5, B, CUDA_R_16BF, 7,
                                  &zero, C, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     0);
    expect_op(2, "cublasGemmEx", (35 + 42) * 2, 30 * 4);
    assert_int_equal(g_ops[2].math, RT_COST_MATH_BF16);
    /* copies: device bytes only; a fill writes */
    static char host[1000];
    assert_cuda(cudaMemcpyAsync(A, host, 100, cudaMemcpyHostToDevice, g_s));
    expect_op(3, "cudaMemcpyAsync", 0, 100);
    assert_cuda(cudaMemcpyAsync(B, A, 100, cudaMemcpyDeviceToDevice, g_s));
    expect_op(4, "cudaMemcpyAsync", 100, 100);
    assert_cuda(cudaMemsetAsync(C, 0, 64, g_s));
    expect_op(5, "cudaMemsetAsync", 0, 64);
    assert_cuda(cudaStreamSynchronize(g_s));                      /* one host synchronisation */
    assert_cuda(cudaMemcpy(host, C, 64, cudaMemcpyDeviceToHost)); /* a second, and a copy */
    expect_op(6, "cudaMemcpy", 64, 0);
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_int_equal(l.ops, 7);
    assert_int_equal(l.launches, 0);
    assert_int_equal(l.library_calls, 3);
    assert_int_equal(l.copies, 3);
    assert_int_equal(l.fills, 1);
    assert_int_equal(l.host_syncs, 2);
    assert_int_equal(l.graph_launches, 0);
    assert_int_equal(l.captured, 0);
    assert_true(l.bytes_read == (35 + 42) * 4 + (35 + 42 + 30) * 4 + (35 + 42) * 2 + 100 + 64);
    assert_true(l.kind_bytes[RT_COST_COPY] == 100 + 200 + 64);
    rt_cost_ledger wrong = {.size = sizeof wrong - 8};
    assert_int_equal(rt_emu_ledger_read(&wrong), -1);
    cublasDestroy(blas);
}

/* the model's time: max(flops / (eta peak), bytes / (beta bandwidth), h) per operation */
static void test_modelled_time(void **state) {
    (void)state;
    begin(2);
    rt_cost_model m = {.bandwidth = 1e12, .eta = 0.5, .beta = 0.5, .h = 1e-6, .sync_s = 1e-3};
    for (int i = 0; i < RT_COST_MATHS; i++) m.peak_flops[i] = 1e12;
    float *a = dev(1 << 20), *y = dev(1 << 20);
    assert_cuda(rt_cuk_relu_forward(g_s, RT_F32, 10, a, y));      /* 80 bytes: h */
    assert_cuda(rt_cuk_relu_forward(g_s, RT_F32, 1 << 18, a, y)); /* 2 MiB at 0.5 TB/s: 4.19 us */
    rt_emu_ledger_set_model(&m);                          /* set after: the sum is recomputed */
    assert_cuda(cudaStreamSynchronize(g_s));              /* + sync_s */
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_true(l.modelled);
    const double want = 1e-6 + (double)(8 << 20) / 4 / 0.5e12 + 1e-3;
    if (fabs(l.modelled_s - want) > 1e-12) fail_msg("modelled %.9g s, expected %.9g", l.modelled_s, want);
    rt_emu_ledger_set_model(NULL);
}

/* A captured step costs what its operations cost at every launch of the graph, marked
 * captured (no host cost each), plus one graph launch; the capture itself counts nothing. */
static void test_graph_replay(void **state) {
    (void)state;
    begin(2);
    rt_cost_model m = {.bandwidth = 1e12, .eta = 1, .beta = 1, .h = 1e-3, .sync_s = 0};
    for (int i = 0; i < RT_COST_MATHS; i++) m.peak_flops[i] = 1e12;
    rt_emu_ledger_set_model(&m);
    cudaStream_t cs;
    assert_cuda(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    float *x = dev(4000), *y = dev(4000);
    assert_cuda(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    assert_cuda(rt_cuk_relu_forward(cs, RT_F32, 1000, x, y));
    assert_cuda(cudaMemsetAsync(y, 0, 4000, cs));
    cudaGraph_t graph;
    assert_cuda(cudaStreamEndCapture(cs, &graph));
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_int_equal(l.ops, 0); /* capturing runs nothing */
    cudaGraphExec_t exec;
    assert_cuda(cudaGraphInstantiate(&exec, graph, 0));
    assert_cuda(cudaGraphLaunch(exec, cs));
    assert_cuda(cudaGraphLaunch(exec, cs));
    assert_cuda(cudaStreamSynchronize(cs));
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_int_equal(l.graph_launches, 2);
    assert_int_equal(l.ops, 4);
    assert_int_equal(l.captured, 4);
    assert_int_equal(l.launches, 2);
    assert_int_equal(l.fills, 2);
    assert_int_equal(l.host_syncs, 1);
    assert_true(l.bytes_read == 2 * 4000 && l.bytes_written == 2 * (4000 + 4000));
    expect_op(0, "relu_fw_kernel", 4000, 4000);
    expect_op(1, "cudaMemsetAsync", 0, 4000);
    assert_int_equal(g_ops[0].captured, 1);
    /* 2 launches x (8000 + 4000 bytes at 1 TB/s) without h, and h per graph launch */
    const double want = 2 * (8000 + 4000) / 1e12 + 2 * 1e-3;
    if (fabs(l.modelled_s - want) > 1e-12) fail_msg("modelled %.9g s, expected %.9g", l.modelled_s, want);
    rt_emu_ledger_set_model(NULL);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(cs);
}

/* count only: recorded, not computed */
static void test_count_only(void **state) {
    (void)state;
    begin(1);
    float h[4] = {-1, 2, -3, 4}, out[4];
    float *x = dev(sizeof h), *y = dev(sizeof h);
    assert_cuda(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice));
    assert_cuda(cudaMemcpy(y, h, sizeof h, cudaMemcpyHostToDevice));
    assert_int_equal(rt_emu_ledger_enable(2), 2);
    assert_cuda(rt_cuk_relu_forward(g_s, RT_F32, 4, x, y));
    assert_cuda(cudaStreamSynchronize(g_s));
    assert_cuda(cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost));
    assert_memory_equal(out, h, sizeof h);        /* untouched */
    assert_int_equal(rt_emu_ledger_enable(1), 2); /* "on" keeps count only */
    rt_emu_ledger_enable(0);
    assert_int_equal(rt_emu_ledger_enable(1), 1);
    assert_cuda(rt_cuk_relu_forward(g_s, RT_F32, 4, x, y));
    assert_cuda(cudaStreamSynchronize(g_s));
    assert_cuda(cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost));
    assert_true(out[0] == 0 && out[1] == 2 && out[2] == 0 && out[3] == 4);
    rt_cost_ledger l = {.size = sizeof l};
    assert_int_equal(rt_emu_ledger_read(&l), 0);
    assert_int_equal(l.launches, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kernel_has_an_entry),
        cmocka_unit_test(test_unknown_kernel_named),
        cmocka_unit_test(test_model_kernels),
        cmocka_unit_test(test_pool_and_bias_kernels),
        cmocka_unit_test(test_bn_kernels),
        cmocka_unit_test(test_bn_nhwc_kernels),
        cmocka_unit_test(test_convw_kernels),
        cmocka_unit_test(test_cast_set_kernels),
        cmocka_unit_test(test_loss_kernels),
        cmocka_unit_test(test_optim_kernels),
        cmocka_unit_test(test_clip_ema_rng_dist_kernels),
        cmocka_unit_test(test_cudnn_costs),
        cmocka_unit_test(test_cublas_copies_counts),
        cmocka_unit_test(test_modelled_time),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_count_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
