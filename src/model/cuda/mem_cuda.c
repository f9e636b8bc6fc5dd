/* Device memory of a CUDA model context (see mem_cuda.h). */
#include "model/cuda/mem_cuda.h"
#include "model/cuda/cuda_internal.h"

rt_status rt_model_cuda_mem_used(rt_model_ctx *ctx, size_t *used) {
    *used = 0;
    RT_REQUIRE(ctx->device.kind == RT_DEVICE_CUDA, RT_ERR_INVALID, "rt_model_cuda_mem_used needs a CUDA context");
    RT_CHECK(rt_cuda_bind(ctx));
    size_t free_b = 0, total_b = 0;
    RT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    *used = total_b - free_b;
    return RT_OK;
}

size_t rt_model_cuda_backend_bytes(rt_model_ctx *ctx) {
    const rt_cuda_state *s = ctx->device.kind == RT_DEVICE_CUDA ? cuda_state(ctx) : NULL;
    return s ? s->blas_ws_bytes + sizeof(int) : 0;
}
