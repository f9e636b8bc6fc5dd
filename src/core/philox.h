/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 *
 * Header-only so that the very same code is compiled by gcc for the CPU and by nvcc for
 * the GPU: a (key, counter) pair always maps to the same four 32-bit words, so a stream
 * is identical on CPU and GPU and on every rank. Conversions to float are done in
 * double precision on both sides, so normals agree bit for bit in practice.
 */
#ifndef RT_PHILOX_H
#define RT_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define RT_HOSTDEV __host__ __device__ __forceinline__
#else
#define RT_HOSTDEV static inline
#endif

#define RT_PHILOX_M0 0xD2511F53u
#define RT_PHILOX_M1 0xCD9E8D57u
#define RT_PHILOX_W0 0x9E3779B9u
#define RT_PHILOX_W1 0xBB67AE85u

typedef struct rt_u32x4 {
    uint32_t v[4];
} rt_u32x4;

RT_HOSTDEV rt_u32x4 rt_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                     uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)RT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)RT_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += RT_PHILOX_W0;
        k1 += RT_PHILOX_W1;
    }
    rt_u32x4 out = {{c0, c1, c2, c3}};
    return out;
}

/* Block `block` (a 64-bit counter) of subsequence `subseq` under `seed`. */
RT_HOSTDEV rt_u32x4 rt_philox_block(uint64_t seed, uint64_t subseq, uint64_t block) {
    return rt_philox4x32_10((uint32_t)block, (uint32_t)(block >> 32), (uint32_t)subseq,
                            (uint32_t)(subseq >> 32), (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* [0, 1) with 24 random bits: exactly representable in float. */
RT_HOSTDEV float rt_u32_to_uniform(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* (0, 1]: safe for log(). */
RT_HOSTDEV double rt_u32_to_uniform_open0(uint32_t x) { return ((double)(x >> 8) + 1.0) * (1.0 / 16777216.0); }

/* Element i of the uniform stream (seed, subseq): word i%4 of block i/4. */
RT_HOSTDEV float rt_philox_uniform_at(uint64_t seed, uint64_t subseq, uint64_t i) {
    rt_u32x4 b = rt_philox_block(seed, subseq, i >> 2);
    return rt_u32_to_uniform(b.v[i & 3]);
}

/* Element i of the standard-normal stream: Box-Muller over the word pairs (0,1), (2,3)
 * of block i/4; even lanes take the cosine, odd lanes the sine. */
RT_HOSTDEV float rt_philox_normal_at(uint64_t seed, uint64_t subseq, uint64_t i) {
    rt_u32x4 b = rt_philox_block(seed, subseq, i >> 2);
    unsigned lane = (unsigned)(i & 3);
    unsigned pair = lane & 2u;
    double u1 = rt_u32_to_uniform_open0(b.v[pair]);
    double u2 = (double)(b.v[pair + 1] >> 8) * (1.0 / 16777216.0);
    double r = sqrt(-2.0 * log(u1));
    double a = 6.283185307179586 * u2;
    return (float)((lane & 1u) ? r * sin(a) : r * cos(a));
}

#endif
