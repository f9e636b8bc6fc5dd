/* The pooled, vectorised bf16 linear layer (src/model/cpu/linear_bf16.c) gives exactly
 * the bits of the plain loops that specify it (written out again here, as ops_cpu.c has
 * them: every operand rounded to bf16 as it is read, sums in fp32 in index order, y and
 * dx rounded once): y, dW, db and dx compared bit for bit, for 1, 2 and 3 pool threads,
 * with shapes that do not divide evenly among the threads, and without dx. How close
 * those loops are to PyTorch's autocast is test_bf16_layers' business.
 */
#include "model_test_util.h"

#include "core/bf16.h"
#include "model/cpu/cpu_internal.h"

#include <stdlib.h>

static void spec_forward(const rt_linear *l, int n, const float *x, float *y) {
    const float *w = rt_tensor_data(&l->weight), *b = rt_tensor_data(&l->bias);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < l->out_f; o++) {
            float s = 0.0f;
            for (int k = 0; k < l->in_f; k++)
                s += rt_bf16_round(x[(size_t)i * l->in_f + k]) * rt_bf16_round(w[(size_t)o * l->in_f + k]);
            y[(size_t)i * l->out_f + o] = rt_bf16_round(s + rt_bf16_round(b[o]));
        }
}

static void spec_backward(const rt_linear *l, int n, const float *x, const float *dy, float *dw, float *db, float *dx) {
    const float *w = rt_tensor_data(&l->weight);
    for (int o = 0; o < l->out_f; o++) {
        float sb = 0.0f;
        for (int i = 0; i < n; i++) sb += rt_bf16_round(dy[(size_t)i * l->out_f + o]);
        db[o] = sb;
        for (int k = 0; k < l->in_f; k++) {
            float s = 0.0f;
            for (int i = 0; i < n; i++)
                s += rt_bf16_round(dy[(size_t)i * l->out_f + o]) * rt_bf16_round(x[(size_t)i * l->in_f + k]);
            dw[(size_t)o * l->in_f + k] = s;
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < l->in_f; k++) {
            float s = 0.0f;
            for (int o = 0; o < l->out_f; o++)
                s += rt_bf16_round(dy[(size_t)i * l->out_f + o]) * rt_bf16_round(w[(size_t)o * l->in_f + k]);
            dx[(size_t)i * l->in_f + k] = rt_bf16_round(s);
        }
}

/* Make the last two terms of every sum (k for y, i for dW, o for dx) a huge pair that
 * cancels exactly: added in index order, the sum of the other terms is first absorbed
 * into the huge one and loses its low bits (visible after rounding to bf16); added in
 * any other order, e.g. backwards, it is kept whole. So a kernel that changed the order
 * of a sum would not give the plain loops' bits. (Powers of two and negation are exact
 * in bf16, and so are the products.) */
static void cancel_last(rt_linear *l, int n, float *x, float *dy) {
    const int K = l->in_f, O = l->out_f;
    float *w = rt_tensor_data(&l->weight);
    const float big = 4194304.0f; /* 2^22 */
    if (K >= 2) {
        for (int o = 0; o < O; o++) w[(size_t)o * K + K - 1] = w[(size_t)o * K + K - 2] *= 1024.0f;
        for (int i = 0; i < n; i++) x[(size_t)i * K + K - 1] = -(x[(size_t)i * K + K - 2] *= 4096.0f);
    }
    if (n >= 2)
        for (int k = 0; k < K; k++) x[(size_t)(n - 1) * K + k] = x[(size_t)(n - 2) * K + k];
    if (n >= 2)
        for (int o = 0; o < O; o++) dy[(size_t)(n - 1) * O + o] = -(dy[(size_t)(n - 2) * O + o] *= big);
    if (O >= 2) {
        for (int k = 0; k < K; k++) w[(size_t)(O - 1) * K + k] = w[(size_t)(O - 2) * K + k];
        for (int i = 0; i < n; i++) dy[(size_t)i * O + O - 1] = -(dy[(size_t)i * O + O - 2] *= big);
    }
}

static void same_bits(const char *what, const float *a, const float *b, size_t n) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) off += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    if (off) fail_msg("%s: %zu of %zu elements differ from the plain loops' bits", what, off, n);
}

static void run(int in, int out, int n, int threads) {
    rt_model_ctx *ctx = mt_ctx(threads);
    mt_arenas A;
    mt_arenas_init(&A);
    rt_linear l;
    assert_rt_ok(rt_linear_init(&l, in, out));
    mt_place(&A, &l.weight, &l.dweight);
    mt_place(&A, &l.bias, &l.dbias);
    mt_alloc(&A);
    const size_t xn = (size_t)n * in, yn = (size_t)n * out, wn = (size_t)out * in;
    float *x = malloc(xn * 4), *dy = malloc(yn * 4), *y = malloc(yn * 4), *ty = malloc(yn * 4), *dx = malloc(xn * 4),
          *tdx = malloc(xn * 4), *tdw = malloc(wn * 4), *tdb = malloc((size_t)out * 4);
    assert_true(x && dy && y && ty && dx && tdx && tdw && tdb);
    mt_randn(x, xn, 31);
    mt_randn(dy, yn, 32);
    mt_randn(rt_tensor_data(&l.weight), wn, 33);
    mt_randn(rt_tensor_data(&l.bias), (size_t)out, 34);
    cancel_last(&l, n, x, dy);

    assert_rt_ok(rt_cpu_linear_forward_bf16(ctx, &l, n, x, y));
    spec_forward(&l, n, x, ty);
    same_bits("y", y, ty, yn);
    spec_backward(&l, n, x, dy, tdw, tdb, tdx);
    assert_rt_ok(rt_cpu_linear_backward_bf16(ctx, &l, n, x, dy, dx));
    same_bits("dW", rt_tensor_data(&l.dweight), tdw, wn);
    same_bits("db", rt_tensor_data(&l.dbias), tdb, (size_t)out);
    same_bits("dx", dx, tdx, xn);
    /* without dx (the first layer): dW and db written all the same, over stale values */
    memset(rt_tensor_data(&l.dweight), 0x7f, wn * 4);
    assert_rt_ok(rt_cpu_linear_backward_bf16(ctx, &l, n, x, dy, NULL));
    same_bits("dW (no dx)", rt_tensor_data(&l.dweight), tdw, wn);
    print_message("linear %d->%d n=%d threads=%d: same bits\n", in, out, n, threads);

    free(x), free(dy), free(y), free(ty), free(dx), free(tdx), free(tdw), free(tdb);
    mt_free(&A);
    rt_model_ctx_destroy(ctx);
}

/* ResNet's fc (512 -> 10) at a training batch, on 1, 2 and 3 threads */
static void test_resnet_fc(void **state) {
    (void)state;
    for (int t = 1; t <= 3; t++) run(512, 10, 64, t);
}

/* odd sizes: fewer outputs and images than threads, k not a multiple of a vector */
static void test_odd_shapes(void **state) {
    (void)state;
    run(37, 1, 5, 3);
    run(3, 7, 1, 2);
    run(129, 33, 7, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resnet_fc),
        cmocka_unit_test(test_odd_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
