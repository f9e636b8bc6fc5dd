/* bfloat16 rounding on the host: the one definition every layer uses.
 *
 * bf16 is the top half of an IEEE float32: sign, 8 exponent bits, 7 stored mantissa bits
 * (8 significant bits, unit roundoff u = 2^-8 / 2 = 2^-9). Conversion from fp32 rounds to
 * nearest, ties to even, as PyTorch's c10::BFloat16 (round_to_nearest_even), oneDNN's
 * reorders and AVX512_BF16's vcvtneps2bf16 do; NaN stays a (quiet) NaN. Keeping a bf16
 * value in a float (low 16 bits zero) is exact, so "round to bf16" below returns a float.
 * Compiled by nvcc these functions are __host__ __device__, so the GPU's casts
 * (dist/cuda/bf16_cuda.cu) run this very code.
 */
#ifndef RT_CORE_BF16_H
#define RT_CORE_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RT_BF16_FN __host__ __device__ __forceinline__
#else
#define RT_BF16_FN static inline
#endif

/* branch-free, so that loops over arrays vectorize (the reduce kernels, dist/reduce.c) */
RT_BF16_FN uint16_t rt_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* ties to even */
    const uint32_t nan = (u >> 16) | 0x40u;                          /* NaN: keep it quiet */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

RT_BF16_FN float rt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> nearest bf16 (ties to even), as a float */
RT_BF16_FN float rt_bf16_round(float f) { return rt_bf16_to_f32(rt_bf16_from_f32(f)); }

#endif
