/* GPU helpers for the model benchmark: the SGD-with-momentum update over the flat
 * parameter arena (one launch) and the device memory in use. See bench_cuda.h. */
#include "model/cuda/bench_cuda.h"
#include "model/cuda/cuda_internal.h"

static __global__ void sgd_momentum_kernel(float *w, const float *g, float *v, size_t n, float lr, float mu) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float vi = __fadd_rn(__fmul_rn(mu, v[i]), g[i]);
        v[i] = vi;
        w[i] = __fsub_rn(w[i], __fmul_rn(lr, vi));
    }
}

extern "C" rt_status rt_model_cuda_sgd_momentum(rt_model_ctx *ctx, float *w, const float *g, float *v, size_t n,
                                                float lr, float mu) {
    RT_REQUIRE(ctx->device.kind == RT_DEVICE_CUDA && ctx->backend, RT_ERR_INVALID,
               "rt_model_cuda_sgd_momentum needs a CUDA model context");
    if (n == 0) return RT_OK;
    RT_CHECK(rt_cuda_bind(ctx));
    size_t blocks = (n + 255) / 256;
    if (blocks > ((size_t)1 << 20)) blocks = (size_t)1 << 20;
    sgd_momentum_kernel<<<(unsigned)blocks, 256, 0, cuda_state(ctx)->stream>>>(w, g, v, n, lr, mu);
    RT_CHECK_LAUNCH();
    return RT_OK;
}

extern "C" rt_status rt_model_cuda_mem_used(rt_model_ctx *ctx, size_t *used) {
    *used = 0;
    RT_REQUIRE(ctx->device.kind == RT_DEVICE_CUDA, RT_ERR_INVALID, "rt_model_cuda_mem_used needs a CUDA context");
    RT_CHECK(rt_cuda_bind(ctx));
    size_t free_b = 0, total_b = 0;
    RT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    *used = total_b - free_b;
    return RT_OK;
}

extern "C" size_t rt_model_cuda_backend_bytes(rt_model_ctx *ctx) {
    const rt_cuda_state *s = ctx->device.kind == RT_DEVICE_CUDA ? cuda_state(ctx) : NULL;
    return s ? s->blas_ws_bytes + sizeof(int) : 0;
}
