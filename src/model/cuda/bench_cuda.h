/* GPU helpers for `ringtrain bench model` (src/model/bench.c) and the GPU tests: the
 * benchmark's plain SGD-with-momentum update over a flat arena on the device, and the
 * device memory in use. Built with RT_HAVE_CUDA only. */
#ifndef RT_MODEL_CUDA_BENCH_H
#define RT_MODEL_CUDA_BENCH_H

#include "model/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* v = mu * v + g; w -= lr * v over n floats on ctx's GPU, enqueued on ctx->stream (what
 * bench.c's CPU loop and torch.optim.SGD(momentum=mu) do). */
rt_status rt_model_cuda_sgd_momentum(rt_model_ctx *ctx, float *w, const float *g, float *v, size_t n, float lr,
                                     float mu);

/* Device bytes the CUDA backend of ctx holds besides the model and ctx->work (the
 * cuBLAS workspace, counters). */
size_t rt_model_cuda_backend_bytes(rt_model_ctx *ctx);

/* Bytes of ctx's GPU in use (total - free, cudaMemGetInfo): all processes, the CUDA
 * context and library code included; differences between two calls isolate a run. */
rt_status rt_model_cuda_mem_used(rt_model_ctx *ctx, size_t *used);

#ifdef __cplusplus
}
#endif

#endif
