/* The CUDA device backend (see core/internal/device_backend.h): the CUDA runtime behind
 * core/device.h. Streams are non-blocking cudaStream_t, events cudaEvent_t. */
#include "core/internal/device_backend.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/device_cuda.h"
#include "core/cuda/driver_version.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* the NVIDIA kernel module's version ("535.104.05") from /proc/driver/nvidia/version, or "" */
static void nvidia_module_version(char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f) return;
    char line[512];
    if (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ' || *p == '\t') p++;
            size_t k = strcspn(p, " \t\n");
            if (k >= n) k = n - 1;
            memcpy(out, p, k);
            out[k] = 0;
        }
    }
    fclose(f);
}

/* the CUDA version the installed driver supports (1000*major + 10*minor), asked from
 * libcuda itself (needs no cuInit, so it answers for a driver too old for this runtime);
 * 0 without a driver */
static int libcuda_driver_version(void) {
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!drv) drv = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!drv) return 0;
    int v = 0;
    int (*get_version)(int *) = (int (*)(int *))dlsym(drv, "cuDriverGetVersion");
    if (!get_version || get_version(&v) != 0) v = 0;
    dlclose(drv);
    return v;
}

/* The device count; without one RT_ERR_NODEVICE ("no GPU": no device, no driver) or
 * RT_ERR_CUDA for GPUs that are there but cannot be used, naming the cause
 * (rt_cuda_probe_classify in driver_version.h). */
static rt_status cuda_count(int *count) {
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e == cudaSuccess) return RT_OK;
    (void)cudaGetLastError();
    *count = 0;
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!drv) drv = dlopen("libcuda.so.1", RTLD_LAZY);
    bool have_driver = drv != NULL;
    if (drv) dlclose(drv);
    char msg[1024];
    switch (rt_cuda_probe_classify((int)e, have_driver)) {
    case RT_CUDA_PROBE_NO_GPU:
        /* the runtime says "insufficient driver" also when there is no driver at all */
        if (!have_driver && e != cudaErrorNoDevice)
            return rt_error_set(RT_ERR_NODEVICE, __FILE__, __LINE__, "cudaGetDeviceCount",
                                "no GPU: no NVIDIA driver installed (libcuda.so.1 not found; CUDA runtime: %s)",
                                cudaGetErrorName(e));
        return rt_error_set(RT_ERR_NODEVICE, __FILE__, __LINE__, "cudaGetDeviceCount", "no GPU: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
    case RT_CUDA_PROBE_OLD_DRIVER: {
        /* a driver is there but older than this runtime: an error that names both
         * versions, not "no GPU" */
        char module[64];
        nvidia_module_version(module, sizeof module);
        rt_cuda_old_driver_message(msg, sizeof msg, libcuda_driver_version(), CUDART_VERSION, module);
        return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, "cudaGetDeviceCount", "%s", msg);
    }
    case RT_CUDA_PROBE_ERROR:
    default:
        rt_cuda_probe_message(msg, sizeof msg, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
        return rt_error_set(RT_ERR_CUDA, __FILE__, __LINE__, "cudaGetDeviceCount", "%s", msg);
    }
}

static rt_status cuda_info(int index, rt_cuda_device_info *info) {
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

static rt_status cuda_set_device(int index) {
    RT_CHECK_CUDA(cudaSetDevice(index));
    return RT_OK;
}

static rt_status cuda_malloc(int index, size_t nbytes, void **out) {
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

static void cuda_free(void *p) { cudaFree(p); }

static rt_status cuda_host_alloc(size_t nbytes, void **out) {
    RT_CHECK_CUDA(cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable));
    return RT_OK;
}

static void cuda_host_free(void *p) { cudaFreeHost(p); }

static rt_status cuda_memcpy(void *dst, bool dst_dev, const void *src, bool src_dev, size_t n, rt_stream *s) {
    void *stream = s ? s->native : NULL; /* a CPU stream orders nothing on the GPU */
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

static rt_status cuda_memset(void *p, int value, size_t n, rt_stream *s) {
    void *stream = s ? s->native : NULL;
    if (stream) {
        RT_CHECK_CUDA(cudaMemsetAsync(p, value, n, (cudaStream_t)stream));
    } else {
        RT_CHECK_CUDA(cudaMemset(p, value, n));
        RT_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy)); /* cudaMemset is asynchronous */
    }
    return RT_OK;
}

static rt_status cuda_stream_create(rt_stream *st) {
    RT_CHECK_CUDA(cudaSetDevice(st->dev.index));
    cudaStream_t s;
    RT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    st->native = s;
    return RT_OK;
}

static void cuda_stream_destroy(rt_stream *s) {
    if (s->native) cudaStreamDestroy((cudaStream_t)s->native);
}

static rt_status cuda_stream_sync(rt_stream *s) {
    RT_CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)s->native));
    return RT_OK;
}

static rt_status cuda_event_create(rt_event *ev) {
    RT_CHECK_CUDA(cudaSetDevice(ev->dev.index));
    cudaEvent_t e;
    RT_CHECK_CUDA(cudaEventCreate(&e));
    ev->native = e;
    return RT_OK;
}

static void cuda_event_destroy(rt_event *e) {
    if (e->native) cudaEventDestroy((cudaEvent_t)e->native);
}

/* on `s` when it is a CUDA stream; a CPU stream (or NULL) records on the default stream */
static rt_status cuda_event_record(rt_event *e, rt_stream *s) {
    RT_CHECK_CUDA(cudaEventRecord((cudaEvent_t)e->native, (cudaStream_t)(s ? s->native : NULL)));
    return RT_OK;
}

/* cudaEventRecordExternal: on a capturing stream a record node, recorded by every launch */
static rt_status cuda_event_record_node(rt_event *e, rt_stream *s) {
    RT_CHECK_CUDA(cudaEventRecordWithFlags((cudaEvent_t)e->native, (cudaStream_t)s->native, cudaEventRecordExternal));
    return RT_OK;
}

static rt_status cuda_event_sync(rt_event *e) {
    RT_CHECK_CUDA(cudaEventSynchronize((cudaEvent_t)e->native));
    return RT_OK;
}

static rt_status cuda_event_query(rt_event *e, bool *done) {
    cudaError_t q = cudaEventQuery((cudaEvent_t)e->native);
    *done = q != cudaErrorNotReady;
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return RT_OK;
    }
    RT_CHECK_CUDA(q);
    return RT_OK;
}

static rt_status cuda_stream_wait_event(rt_stream *s, rt_event *e) {
    if (!e->native) return RT_OK; /* a CPU event is complete once recorded */
    RT_CHECK_CUDA(cudaStreamWaitEvent((cudaStream_t)s->native, (cudaEvent_t)e->native, 0));
    return RT_OK;
}

static rt_status cuda_event_elapsed(rt_event *start, rt_event *end, float *ms, bool *ready) {
    cudaError_t q = cudaEventQuery((cudaEvent_t)end->native);
    if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *ready = false;
        return RT_OK;
    }
    RT_CHECK_CUDA(q);
    RT_CHECK_CUDA(cudaEventElapsedTime(ms, (cudaEvent_t)start->native, (cudaEvent_t)end->native));
    *ready = true;
    return RT_OK;
}

/* thread-local mode: the loader's and the reducer's threads may go on allocating and
 * synchronising while this thread captures */
static rt_status cuda_capture_begin(rt_stream *s) {
    RT_CHECK_CUDA(cudaStreamBeginCapture((cudaStream_t)s->native, cudaStreamCaptureModeThreadLocal));
    return RT_OK;
}

static rt_status cuda_capture_end(rt_stream *s, void **exec) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    RT_CHECK_CUDA(cudaStreamEndCapture((cudaStream_t)s->native, &g));
    cudaError_t e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g); /* the instance keeps what it needs */
    RT_CHECK_CUDA(e);
    *exec = x;
    return RT_OK;
}

static rt_status cuda_graph_launch(void *exec, rt_stream *s) {
    RT_CHECK_CUDA(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)s->native));
    return RT_OK;
}

static bool cuda_capturing(rt_stream *s) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)s->native, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return st != cudaStreamCaptureStatusNone;
}

static void cuda_graph_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

static int cuda_lib_versions(rt_lib_version *out, int cap) {
    int n = 0, rt = 0, drv = 0;
    char v[32];
    cudaRuntimeGetVersion(&rt);
    rt_lib_version_fmt(v, sizeof v, rt, 1000, 10);
    rt_lib_version_add(out, cap, &n, "CUDA runtime", "cuda_runtime", v);
    if (cudaDriverGetVersion(&drv) != cudaSuccess) (void)cudaGetLastError();
    if (drv <= 0) drv = libcuda_driver_version(); /* a driver too old for this runtime */
    rt_lib_version_fmt(v, sizeof v, drv, 1000, 10);
    rt_lib_version_add(out, cap, &n, "CUDA driver", "cuda_driver", drv > 0 ? v : "none");
    return n;
}

const rt_device_backend rt_device_backend_cuda = {
    .name = "cuda",
    .device_count = cuda_count,
    .device_info = cuda_info,
    .set_current = cuda_set_device,
    .malloc = cuda_malloc,
    .free = cuda_free,
    .memcpy = cuda_memcpy,
    .memset = cuda_memset,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_record_node = cuda_event_record_node,
    .event_sync = cuda_event_sync,
    .event_query = cuda_event_query,
    .stream_wait_event = cuda_stream_wait_event,
    .event_elapsed = cuda_event_elapsed,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .capturing = cuda_capturing,
    .rng_uniform = rt_rng_uniform_cuda,
    .rng_normal = rt_rng_normal_cuda,
    .lib_versions = cuda_lib_versions,
};
