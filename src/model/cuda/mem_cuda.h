/* Device memory of a CUDA model context: what the backend holds besides the model, and
 * what the GPU has in use; the public face is rt_model_ctx_memory (model/ctx.h). Built
 * with RT_HAVE_CUDA only. */
#ifndef RT_MODEL_CUDA_MEM_H
#define RT_MODEL_CUDA_MEM_H

#include "model/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

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
