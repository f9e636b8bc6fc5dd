/* Parts of the CUDA device backend compiled by nvcc (rng_cuda.cu), for the table in
 * device_cuda.c. Internal to src/core; built only with RT_HAVE_CUDA. */
#ifndef RT_CORE_DEVICE_CUDA_H
#define RT_CORE_DEVICE_CUDA_H

#include "core/device.h"
#include "core/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

rt_status rt_rng_uniform_cuda(rt_rng *rng, float *out_dev, size_t n, rt_stream *stream);
rt_status rt_rng_normal_cuda(rt_rng *rng, float *out_dev, size_t n, float mean, float std, rt_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
