/* The device side of bf16 gradient compression (dist/internal/bf16_cuda.h).
 *
 * The casts are core/bf16.h's functions themselves (compiled __host__ __device__ by
 * nvcc), and each reduction step is dist/reduce.c's bf16 kernel line for line: both
 * operands widened (exact), one IEEE fp32 operation (__fadd_rn, __fmul_rn, __fdiv_rn:
 * never fused, never approximate; the build passes no -ftz or --use_fast_math, which would
 * flush subnormals), rounded once to bf16.
 * So a bucket reduced on the GPU has the bits the CPU ring gives the same inputs.
 */
#include "core/bf16.h"
#include "dist/internal/bf16_cuda.h"
#include "dist/reduce.h"

#define THREADS 256

static unsigned grid_for(size_t n) {
    size_t g = (n + THREADS - 1) / THREADS;
    if (g > ((size_t)1 << 20)) g = (size_t)1 << 20; /* grid-stride loops cover the rest */
    return g ? (unsigned)g : 1u;
}

#define GRID_STRIDE(i, n)                                                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* reduce.c's bf16_op */
static __device__ __forceinline__ float bf16_op(float a, float b, int op) {
    switch (op) {
    case RT_OP_PRODUCT:
        return __fmul_rn(a, b);
    case RT_OP_MIN:
        return b < a ? b : a;
    case RT_OP_MAX:
        return b > a ? b : a;
    default:
        return __fadd_rn(a, b);
    }
}

static __global__ void pack_kernel(size_t n, const float *x, uint16_t *y) {
    GRID_STRIDE(i, n) { y[i] = rt_bf16_from_f32(x[i]); }
}

static __global__ void unpack_kernel(size_t n, const uint16_t *x, float *y) {
    GRID_STRIDE(i, n) { y[i] = rt_bf16_to_f32(x[i]); }
}

/* reduce.c's bf16_apply (div 0) and bf16_sumdiv (div > 0) */
static __global__ void combine_kernel(size_t n, uint16_t *d, const uint16_t *s, int op, int div) {
    GRID_STRIDE(i, n) {
        float a = rt_bf16_to_f32(d[i]), b = rt_bf16_to_f32(s[i]);
        d[i] = rt_bf16_from_f32(div > 0 ? __fdiv_rn(__fadd_rn(a, b), (float)div) : bf16_op(a, b, op));
    }
}

/* reduce.c's bf16_div */
static __global__ void div_kernel(size_t n, uint16_t *d, int div) {
    GRID_STRIDE(i, n) { d[i] = rt_bf16_from_f32(__fdiv_rn(rt_bf16_to_f32(d[i]), (float)div)); }
}

extern "C" cudaError_t rt_dist_bf16_pack(cudaStream_t s, const float *x, uint16_t *y, size_t n) {
    if (n == 0) return cudaSuccess;
    pack_kernel<<<grid_for(n), THREADS, 0, s>>>(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_dist_bf16_unpack(cudaStream_t s, const uint16_t *x, float *y, size_t n) {
    if (n == 0) return cudaSuccess;
    unpack_kernel<<<grid_for(n), THREADS, 0, s>>>(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_dist_bf16_combine(cudaStream_t s, uint16_t *d, const uint16_t *src, size_t n, int op,
                                            int div) {
    if (n == 0) return cudaSuccess;
    combine_kernel<<<grid_for(n), THREADS, 0, s>>>(n, d, src, op, div);
    return cudaGetLastError();
}

extern "C" cudaError_t rt_dist_bf16_div(cudaStream_t s, uint16_t *d, size_t n, int div) {
    if (n == 0) return cudaSuccess;
    div_kernel<<<grid_for(n), THREADS, 0, s>>>(n, d, div);
    return cudaGetLastError();
}
