/* Counter-based random numbers (Philox4x32-10), the same on CPU, GPU and every rank.
 *
 * An rt_rng is (seed, subsequence, offset): element i of a draw of n numbers is element
 * offset+i of the stream, and the offset then advances by n. Nothing else is stateful,
 * so a draw can be split across threads or GPU blocks, and the state is three integers
 * to save in a checkpoint. Different subsequences are independent streams under one
 * seed (e.g. one per layer, or per (epoch, sample) for augmentation).
 */
#ifndef RT_RNG_H
#define RT_RNG_H

#include "core/status.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_rng {
    uint64_t seed;
    uint64_t subseq;
    uint64_t offset; /* elements consumed so far */
} rt_rng;

void rt_rng_init(rt_rng *rng, uint64_t seed, uint64_t subseq);

/* n floats uniform in [0, 1) */
void rt_rng_uniform(rt_rng *rng, float *out, size_t n);
/* n floats uniform in [lo, hi) */
void rt_rng_uniform_range(rt_rng *rng, float *out, size_t n, float lo, float hi);
/* n floats, normal with the given mean and standard deviation */
void rt_rng_normal(rt_rng *rng, float *out, size_t n, float mean, float std);
/* one 32-bit word and one integer uniform in [0, bound) (bound > 0; unbiased) */
uint32_t rt_rng_u32(rt_rng *rng);
uint64_t rt_rng_below(rt_rng *rng, uint64_t bound);

/* GPU versions (out_dev is device memory; stream may be NULL). Same numbers as the CPU
 * functions for the same rng state; advance the state the same way. Return
 * RT_ERR_UNSUPPORTED when built without CUDA. */
struct rt_stream;
rt_status rt_rng_uniform_dev(rt_rng *rng, float *out_dev, size_t n, struct rt_stream *stream);
rt_status rt_rng_normal_dev(rt_rng *rng, float *out_dev, size_t n, float mean, float std,
                            struct rt_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
