/* Host emulation (docs/cuda-emulation.md): the functions of the real CUDA backend that
 * the .cu files call, for the emulated device (see include/rt_emu_stub_names.h). */
#include "rt_emu_names.h"

#include "model/cuda/cuda_internal.h"

rt_status rt_cuda_bind(rt_model_ctx *ctx) {
    (void)ctx;
    return RT_OK;
}
