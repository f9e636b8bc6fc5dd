/* GPU draws from the Philox streams of core/rng.h: the same philox.h code as the CPU,
 * one thread per element, so CPU and GPU produce the same numbers. */
#include "core/cuda/cuda_check.h"
#include "core/cuda/device_cuda.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/philox.h"

static __global__ void uniform_kernel(float *out, size_t n, uint64_t seed, uint64_t subseq, uint64_t offset) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) out[i] = rt_philox_uniform_at(seed, subseq, offset + i);
}

static __global__ void normal_kernel(float *out, size_t n, uint64_t seed, uint64_t subseq, uint64_t offset, float mean,
                                     float std) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(
            mean, __fmul_rn(std, rt_philox_normal_at(seed, subseq, offset + i))); /* no FMA: the CPU's rounding */
}

static unsigned grid_for(size_t n) {
    size_t g = (n + 255) / 256;
    if (g > 65535) g = 65535;
    return g ? (unsigned)g : 1u;
}

extern "C" rt_status rt_rng_uniform_cuda(rt_rng *rng, float *out_dev, size_t n, rt_stream *stream) {
    if (n == 0) return RT_OK;
    uniform_kernel<<<grid_for(n), 256, 0, (cudaStream_t)rt_stream_native(stream)>>>(out_dev, n, rng->seed, rng->subseq,
                                                                                    rng->offset);
    RT_CHECK_LAUNCH();
    rng->offset += n;
    return RT_OK;
}

extern "C" rt_status rt_rng_normal_cuda(rt_rng *rng, float *out_dev, size_t n, float mean, float std,
                                        rt_stream *stream) {
    if (n == 0) return RT_OK;
    normal_kernel<<<grid_for(n), 256, 0, (cudaStream_t)rt_stream_native(stream)>>>(out_dev, n, rng->seed, rng->subseq,
                                                                                   rng->offset, mean, std);
    RT_CHECK_LAUNCH();
    rng->offset += n;
    return RT_OK;
}
