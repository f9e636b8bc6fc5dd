#include "core/rng.h"

#include <math.h>

#include "core/internal/device_backend.h"
#include "core/philox.h"

void rt_rng_init(rt_rng *rng, uint64_t seed, uint64_t subseq) {
    rng->seed = seed;
    rng->subseq = subseq;
    rng->offset = 0;
}

void rt_rng_uniform(rt_rng *rng, float *out, size_t n) {
    uint64_t i = rng->offset;
    size_t k = 0;
    /* head: until the stream position is at a block boundary */
    for (; k < n && (i & 3); k++, i++) out[k] = rt_philox_uniform_at(rng->seed, rng->subseq, i);
    for (; k + 4 <= n; k += 4, i += 4) {
        rt_u32x4 b = rt_philox_block(rng->seed, rng->subseq, i >> 2);
        for (int j = 0; j < 4; j++) out[k + j] = rt_u32_to_uniform(b.v[j]);
    }
    for (; k < n; k++, i++) out[k] = rt_philox_uniform_at(rng->seed, rng->subseq, i);
    rng->offset += n;
}

void rt_rng_uniform_range(rt_rng *rng, float *out, size_t n, float lo, float hi) {
    rt_rng_uniform(rng, out, n);
    for (size_t k = 0; k < n; k++) out[k] = lo + (hi - lo) * out[k];
}

void rt_rng_normal(rt_rng *rng, float *out, size_t n, float mean, float std) {
    for (size_t k = 0; k < n; k++) out[k] = mean + std * rt_philox_normal_at(rng->seed, rng->subseq, rng->offset + k);
    rng->offset += n;
}

uint32_t rt_rng_u32(rt_rng *rng) {
    uint64_t i = rng->offset++;
    return rt_philox_block(rng->seed, rng->subseq, i >> 2).v[i & 3];
}

uint64_t rt_rng_below(rt_rng *rng, uint64_t bound) {
    if (bound <= 1) return 0;
    if (bound <= 0xFFFFFFFFull) {
        /* Lemire's nearly divisionless method on 32-bit words */
        uint32_t b = (uint32_t)bound;
        uint64_t m = (uint64_t)rt_rng_u32(rng) * b;
        uint32_t l = (uint32_t)m;
        if (l < b) {
            uint32_t t = (uint32_t)(-b) % b;
            while (l < t) {
                m = (uint64_t)rt_rng_u32(rng) * b;
                l = (uint32_t)m;
            }
        }
        return m >> 32;
    }
    /* rejection sampling on 64-bit words */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    for (;;) {
        uint64_t x = ((uint64_t)rt_rng_u32(rng) << 32) | rt_rng_u32(rng);
        if (x < limit) return x % bound;
    }
}

/* The GPU draws: the device backend's (core/internal/device_backend.h). */
rt_status rt_rng_uniform_dev(rt_rng *rng, float *out_dev, size_t n, struct rt_stream *stream) {
    const rt_device_backend *be = rt_device_backend_get(RT_DEVICE_CUDA);
    if (!be || !be->rng_uniform)
        RT_FAIL(RT_ERR_UNSUPPORTED, "rt_rng_uniform_dev: this ringtrain was built without CUDA");
    return be->rng_uniform(rng, out_dev, n, stream);
}

rt_status rt_rng_normal_dev(rt_rng *rng, float *out_dev, size_t n, float mean, float std, struct rt_stream *stream) {
    const rt_device_backend *be = rt_device_backend_get(RT_DEVICE_CUDA);
    if (!be || !be->rng_normal) RT_FAIL(RT_ERR_UNSUPPORTED, "rt_rng_normal_dev: this ringtrain was built without CUDA");
    return be->rng_normal(rng, out_dev, n, mean, std, stream);
}
