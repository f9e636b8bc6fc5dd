/* Device memory of a CUDA model context, the CUDA backend's `memory` entry
 * (cuda_internal.h); the public face is rt_model_ctx_memory (model/ctx.h). */
#include "model/cuda/cuda_internal.h"

rt_status rt_cuda_memory(rt_model_ctx *ctx, size_t *used, size_t *backend) {
    *used = *backend = 0;
    RT_REQUIRE(ctx->device.kind == RT_DEVICE_CUDA, RT_ERR_INVALID, "rt_cuda_memory needs a CUDA context");
    const rt_cuda_state *s = cuda_state(ctx);
    *backend = s ? s->blas_ws_bytes + sizeof(int) + s->bn_scratch_bytes + s->wcopies_bytes : 0;
    RT_CHECK(rt_cuda_bind(ctx));
    size_t free_b = 0, total_b = 0;
    RT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    *used = total_b - free_b;
    return RT_OK;
}
