/* Rounding whole arrays to bf16 on the CPU backend's pool (precision bf16).
 *
 * conv_cpu.c rounds a layer's input, output, output gradient and input gradient on the
 * paths that are not oneDNN's (see "precision bf16" there). Done as a plain loop on the
 * calling thread this was a visible share of a bf16 step (-O2 does not vectorise it, and
 * the other pool threads waited); here each call is split in blocks over the pool and
 * the loop is compiled at -O3, so it vectorises. Each element is rounded on its own with
 * rt_bf16_round (core/bf16.h): the result does not depend on the split.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "core/bf16.h"
#include "model/cpu/cpu_internal.h"

#define BF16_BLOCK 16384

typedef struct bf16_job {
    const float *src;
    float *dst;
    size_t count;
    bool add;
} bf16_job;

static void bf16_task(void *arg, int t) {
    const bf16_job *J = arg;
    const size_t lo = (size_t)t * BF16_BLOCK, hi = lo + BF16_BLOCK < J->count ? lo + BF16_BLOCK : J->count;
    const float *src = J->src;
    float *dst = J->dst;
    if (J->add)
        for (size_t i = lo; i < hi; i++) dst[i] += rt_bf16_round(src[i]);
    else
        for (size_t i = lo; i < hi; i++) dst[i] = rt_bf16_round(src[i]);
}

void rt_cpu_bf16_round(rt_model_ctx *ctx, size_t count, const float *src, float *dst, bool add) {
    bf16_job J = {.src = src, .dst = dst, .count = count, .add = add};
    const size_t blocks = (count + BF16_BLOCK - 1) / BF16_BLOCK;
    if (blocks <= 1)
        bf16_task(&J, 0); /* not worth waking the pool */
    else
        rt_threadpool_run(cpu_pool(ctx), (int)blocks, bf16_task, &J);
}

void rt_cpu_bf16_pack(size_t count, const float *src, uint16_t *dst) {
    for (size_t i = 0; i < count; i++) dst[i] = rt_bf16_from_f32(src[i]);
}
