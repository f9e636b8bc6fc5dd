/* For the files that hold CPU loops (the rows src/optim/<name>.c and cpu/optim_cpu.c):
 * include it first. Each loop is written once (always-inline bodies with the options as
 * constant arguments, so every option combination becomes a branch-free loop) and
 * compiled twice: for the baseline CPU and, on x86-64, for AVX2+FMA (RT_TARGET_FMA),
 * picked at run time with rt_optim_cpu_use_fma(). fmaf is exact in both builds (the
 * baseline one just computes it more slowly), so both give the same bits; nothing may be
 * contracted into a fused multiply-add that PyTorch does not fuse.
 */
#ifndef RT_OPTIM_CPU_LOOPS_H
#define RT_OPTIM_CPU_LOOPS_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "optim/internal/optim_kernels.h"

#include <math.h>
#include <stdbool.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define RT_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define RT_ALWAYS_INLINE static inline
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define RT_OPTIM_FMA_VARIANT 1
#define RT_TARGET_FMA __attribute__((target("avx2,fma")))
#endif

#endif
