/* The CUDA model backend (cuDNN, cuBLAS and a few kernels): the table.
 *
 * Placeholder while the real implementation is written: every entry reports
 * RT_ERR_UNSUPPORTED, so a CUDA build links and a cuda model context fails cleanly. */
#include "model/backend.h"

static rt_status cuda_ctx_init(rt_model_ctx *ctx) {
    (void)ctx;
    RT_FAIL(RT_ERR_UNSUPPORTED, "the CUDA model backend is not implemented yet (use device cpu)");
}

const rt_model_backend rt_model_backend_cuda = {
    .name = "cuda",
    .ctx_init = cuda_ctx_init,
};
