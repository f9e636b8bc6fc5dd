/* Device helpers shared by the activation kernels (kernels_cuda.cu, convw_cuda.cu): device
 * code, included by those .cu files only. A launch's grid for `count` elements (grid-stride
 * loops cover what a capped grid does not), and an activation element read or stored in
 * its format's dtype (bf16: rounded once to nearest even on store, core/bf16.h's rule). */
#ifndef RT_MODEL_CUDA_ACT_CUDA_H
#define RT_MODEL_CUDA_ACT_CUDA_H

#include "core/bf16.h"

#include <stddef.h>
#include <stdint.h>

#define RT_CUK_THREADS 256

static unsigned grid_for(size_t count) {
    size_t g = (count + RT_CUK_THREADS - 1) / RT_CUK_THREADS;
    if (g > ((size_t)1 << 20)) g = (size_t)1 << 20; /* grid-stride loops cover the rest */
    return g ? (unsigned)g : 1u;
}

#define GRID_STRIDE(i, count)                                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count); i += (size_t)gridDim.x * blockDim.x)

/* element i of p, widened to fp32 */
static __device__ __forceinline__ float act_ld(const void *p, int bf16, size_t i) {
    return bf16 ? rt_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
/* element i = v, rounded once to nearest even when bf16 */
static __device__ __forceinline__ void act_st(void *p, int bf16, size_t i, float v) {
    if (bf16)
        ((uint16_t *)p)[i] = rt_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

#endif
