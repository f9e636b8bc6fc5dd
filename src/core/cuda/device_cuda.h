/* CUDA half of the device layer (internal to src/core). Plain C types only, so that
 * device.c compiles without the CUDA headers. Defined only when RT_HAVE_CUDA. */
#ifndef RT_DEVICE_CUDA_H
#define RT_DEVICE_CUDA_H
#ifdef RT_HAVE_CUDA

#include "core/device.h"

rt_status rt_cuda_count(int *count);
rt_status rt_cuda_info(int index, rt_cuda_device_info *info);
rt_status rt_cuda_set_device(int index);
rt_status rt_cuda_malloc(int index, size_t nbytes, void **out);
void rt_cuda_free(void *p);
rt_status rt_cuda_host_alloc(size_t nbytes, void **out);
void rt_cuda_host_free(void *p);
rt_status rt_cuda_memcpy(void *dst, bool dst_dev, const void *src, bool src_dev, size_t n, void *stream);
rt_status rt_cuda_memset(void *p, int value, size_t n, void *stream);
rt_status rt_cuda_stream_create(int index, void **out);
void rt_cuda_stream_destroy(void *s);
rt_status rt_cuda_stream_sync(void *s);
rt_status rt_cuda_event_create(int index, void **out);
void rt_cuda_event_destroy(void *e);
rt_status rt_cuda_event_record(void *e, void *s);
rt_status rt_cuda_event_sync(void *e);
rt_status rt_cuda_stream_wait_event(void *s, void *e);
rt_status rt_cuda_event_elapsed(void *start, void *end, float *ms, bool *ready);

/* Library versions for `ringtrain info` (no GPU needed). */
int rt_cuda_runtime_version(void);
int rt_cuda_driver_version(void);

#endif
#endif
