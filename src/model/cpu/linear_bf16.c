/* The linear layer under precision bf16 on the CPU, on the pool and vectorised, with the
 * bits of the plain loops that specify it (the reference in tests/model/test_linear_bf16.c):
 *   y[i,o]  = bf16( sum_k bf16(x[i,k]) bf16(W[o,k])  +  bf16(b[o]) )   (sum over k in order)
 *   dW[o,k] = sum_i bf16(dy[i,o]) bf16(x[i,k])                         (over i in order)
 *   db[o]   = sum_i bf16(dy[i,o])
 *   dx[i,k] = bf16( sum_o bf16(dy[i,o]) bf16(W[o,k]) )                 (over o in order)
 * each sum in fp32 from 0. Every element's terms are added in the same order as there
 * (products of two bf16 are exact in fp32; the loops here are compiled without
 * contraction into fused multiply-adds, C11's default), so the results are the same
 * bits. What changes is which loop is innermost: dW and dx run over k, the contiguous
 * index, for all k at once (vectorised), instead of one dot product per element; the
 * forward splits its images over the pool. dW's rows are split over the pool by output
 * feature, dx's over images: no element is summed by two threads, so the result does not
 * depend on the thread count.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "core/bf16.h"
#include "model/cpu/cpu_internal.h"

typedef struct lin_job {
    const rt_linear *l;
    int n, parts;
    const float *x, *dy;
    float *y, *dx;
} lin_job;

static void lin_range(int total, int parts, int t, int *lo, int *hi) {
    *lo = (int)((long)total * t / parts);
    *hi = (int)((long)total * (t + 1) / parts);
}

/* y rows [lo, hi) */
static void lin_fwd_task(void *arg, int t) {
    const lin_job *J = arg;
    const rt_linear *l = J->l;
    const float *w = rt_tensor_data(&l->weight), *b = rt_tensor_data(&l->bias);
    int lo, hi;
    lin_range(J->n, J->parts, t, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        const float *xi = J->x + (size_t)i * l->in_f;
        for (int o = 0; o < l->out_f; o++) {
            const float *wo = w + (size_t)o * l->in_f;
            float s = 0.0f;
            for (int k = 0; k < l->in_f; k++) s += rt_bf16_round(xi[k]) * rt_bf16_round(wo[k]);
            J->y[(size_t)i * l->out_f + o] = rt_bf16_round(s + rt_bf16_round(b[o]));
        }
    }
}

/* dW and db rows [lo, hi): dW[o, :] accumulates over the images in order, all k at once */
static void lin_dw_task(void *arg, int t) {
    const lin_job *J = arg;
    const rt_linear *l = J->l;
    float *dw = rt_tensor_data(&l->dweight), *db = rt_tensor_data(&l->dbias);
    const int K = l->in_f;
    int lo, hi;
    lin_range(l->out_f, J->parts, t, &lo, &hi);
    for (int o = lo; o < hi; o++) {
        float *row = dw + (size_t)o * K;
        float sb = 0.0f;
        for (int k = 0; k < K; k++) row[k] = 0.0f;
        for (int i = 0; i < J->n; i++) {
            const float d = rt_bf16_round(J->dy[(size_t)i * l->out_f + o]);
            const float *xi = J->x + (size_t)i * K;
            sb += d;
            for (int k = 0; k < K; k++) row[k] += d * rt_bf16_round(xi[k]);
        }
        db[o] = sb;
    }
}

/* dx rows [lo, hi): accumulate over the outputs in order, all k at once, then round */
static void lin_dx_task(void *arg, int t) {
    const lin_job *J = arg;
    const rt_linear *l = J->l;
    const float *w = rt_tensor_data(&l->weight);
    const int K = l->in_f;
    int lo, hi;
    lin_range(J->n, J->parts, t, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        float *row = J->dx + (size_t)i * K;
        for (int k = 0; k < K; k++) row[k] = 0.0f;
        for (int o = 0; o < l->out_f; o++) {
            const float d = rt_bf16_round(J->dy[(size_t)i * l->out_f + o]);
            const float *wo = w + (size_t)o * K;
            for (int k = 0; k < K; k++) row[k] += d * rt_bf16_round(wo[k]);
        }
        for (int k = 0; k < K; k++) row[k] = rt_bf16_round(row[k]);
    }
}

static int lin_parts(rt_model_ctx *ctx, int work) {
    const int T = rt_threadpool_threads(cpu_pool(ctx));
    return work < T ? (work < 1 ? 1 : work) : T;
}

rt_status rt_cpu_linear_forward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y) {
    lin_job J = {.l = l, .n = n, .x = x, .y = y, .parts = lin_parts(ctx, n)};
    rt_threadpool_run(cpu_pool(ctx), J.parts, lin_fwd_task, &J);
    return RT_OK;
}

rt_status rt_cpu_linear_backward_bf16(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy,
                                      float *dx) {
    lin_job J = {.l = l, .n = n, .x = x, .dy = dy, .dx = dx, .parts = lin_parts(ctx, l->out_f)};
    rt_threadpool_run(cpu_pool(ctx), J.parts, lin_dw_task, &J);
    if (!dx) return RT_OK;
    J.parts = lin_parts(ctx, n);
    rt_threadpool_run(cpu_pool(ctx), J.parts, lin_dx_task, &J);
    return RT_OK;
}
