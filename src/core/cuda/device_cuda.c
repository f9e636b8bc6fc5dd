/* CUDA runtime implementation of the device layer (see core/device.h). */
#include "core/cuda/device_cuda.h"

#include <dlfcn.h>
#include <stdio.h>

#include "core/cuda/cuda_check.h"

rt_status rt_cuda_count(int *count) {
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        /* the runtime says "insufficient driver" also when there is no driver at all */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!drv) drv = dlopen("libcuda.so.1", RTLD_LAZY);
        if (!drv)
            return rt_error_set(RT_ERR_NODEVICE, __FILE__, __LINE__, "cudaGetDeviceCount",
                                "no GPU: no NVIDIA driver installed (libcuda.so.1 not found; CUDA runtime: %s)",
                                cudaGetErrorName(e));
        dlclose(drv);
        return rt_error_set(RT_ERR_NODEVICE, __FILE__, __LINE__, "cudaGetDeviceCount", "no GPU: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return RT_OK;
}

rt_status rt_cuda_info(int index, rt_cuda_device_info *info) {
    struct cudaDeviceProp p;
    RT_CHECK_CUDA(cudaGetDeviceProperties(&p, index));
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->major = p.major;
    info->minor = p.minor;
    info->total_mem = p.totalGlobalMem;
    info->multiprocessors = p.multiProcessorCount;
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    return RT_OK;
}

rt_status rt_cuda_set_device(int index) {
    RT_CHECK_CUDA(cudaSetDevice(index));
    return RT_OK;
}

rt_status rt_cuda_malloc(int index, size_t nbytes, void **out) {
    RT_CHECK_CUDA(cudaSetDevice(index));
    cudaError_t e = cudaMalloc(out, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return rt_error_set(RT_ERR_NOMEM, __FILE__, __LINE__, "cudaMalloc",
                            "GPU %d: cannot allocate %zu bytes (%zu of %zu bytes free): %s", index, nbytes, free_b,
                            total_b, cudaGetErrorString(e));
    }
    return RT_OK;
}

void rt_cuda_free(void *p) { cudaFree(p); }

rt_status rt_cuda_host_alloc(size_t nbytes, void **out) {
    RT_CHECK_CUDA(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable));
    return RT_OK;
}

void rt_cuda_host_free(void *p) { cudaFreeHost(p); }

rt_status rt_cuda_memcpy(void *dst, bool dst_dev, const void *src, bool src_dev, size_t n, void *stream) {
    enum cudaMemcpyKind kind = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                       : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    if (stream) {
        RT_CHECK_CUDA(cudaMemcpyAsync(dst, src, n, kind, (cudaStream_t)stream));
    } else {
        RT_CHECK_CUDA(cudaMemcpy(dst, src, n, kind));
        /* cudaMemcpy from pageable memory may return before the DMA lands, and work on
         * the non-blocking streams does not wait for the legacy stream: finish it, so
         * "NULL = synchronous" (device.h) holds */
        RT_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
    }
    return RT_OK;
}

rt_status rt_cuda_memset(void *p, int value, size_t n, void *stream) {
    if (stream) {
        RT_CHECK_CUDA(cudaMemsetAsync(p, value, n, (cudaStream_t)stream));
    } else {
        RT_CHECK_CUDA(cudaMemset(p, value, n));
        RT_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy)); /* cudaMemset is asynchronous */
    }
    return RT_OK;
}

rt_status rt_cuda_stream_create(int index, void **out) {
    RT_CHECK_CUDA(cudaSetDevice(index));
    cudaStream_t s;
    RT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return RT_OK;
}

void rt_cuda_stream_destroy(void *s) { cudaStreamDestroy((cudaStream_t)s); }

rt_status rt_cuda_stream_sync(void *s) {
    RT_CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s));
    return RT_OK;
}

rt_status rt_cuda_event_create(int index, void **out) {
    RT_CHECK_CUDA(cudaSetDevice(index));
    cudaEvent_t e;
    RT_CHECK_CUDA(cudaEventCreate(&e));
    *out = e;
    return RT_OK;
}

void rt_cuda_event_destroy(void *e) { cudaEventDestroy((cudaEvent_t)e); }

rt_status rt_cuda_event_record(void *e, void *s) {
    RT_CHECK_CUDA(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
    return RT_OK;
}

rt_status rt_cuda_event_sync(void *e) {
    RT_CHECK_CUDA(cudaEventSynchronize((cudaEvent_t)e));
    return RT_OK;
}

rt_status rt_cuda_stream_wait_event(void *s, void *e) {
    RT_CHECK_CUDA(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
    return RT_OK;
}

rt_status rt_cuda_event_elapsed(void *start, void *end, float *ms, bool *ready) {
    cudaError_t q = cudaEventQuery((cudaEvent_t)end);
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *ready = false;
        return RT_OK;
    }
    RT_CHECK_CUDA(q);
    RT_CHECK_CUDA(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    *ready = true;
    return RT_OK;
}

int rt_cuda_runtime_version(void) {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
}

int rt_cuda_driver_version(void) {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) (void)cudaGetLastError();
    return v;
}
