/* The device backend interface (internal to src/core): one table of functions per
 * device kind, as src/model/backend.h has for the layers.
 *
 * device.c validates arguments and calls the table of the device kind involved:
 * rt_device_backend_get(kind), the only place where the CUDA build option decides
 * anything. The CPU table (cpu/device_cpu.c) is always built; the CUDA table
 * (cuda/device_cuda.c) only with RT_HAVE_CUDA, so a build without CUDA answers a CUDA
 * request with "built without CUDA" instead of crashing. Adding a device kind means
 * adding its rt_device_kind value, its name in device.c and one table here.
 *
 * Contract: entries marked "may be NULL" are optional (the front end then reports
 * RT_ERR_UNSUPPORTED or falls back); every other entry is set. Streams and events
 * remember the table that created them. Plain C types only: no CUDA header here.
 */
#ifndef RT_CORE_DEVICE_BACKEND_H
#define RT_CORE_DEVICE_BACKEND_H

#include "core/device.h"
#include "core/info.h"
#include "core/rng.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_device_backend rt_device_backend;

struct rt_stream {
    rt_device dev;
    const rt_device_backend *be;
    void *native; /* the backend's handle (cudaStream_t); NULL on the CPU */
};

struct rt_event {
    rt_device dev;
    const rt_device_backend *be;
    void *native;     /* the backend's handle (cudaEvent_t); NULL on the CPU */
    uint64_t host_ns; /* host time of the last record (the CPU's timing) */
    bool recorded;
};

struct rt_device_backend {
    const char *name; /* "cpu", "cuda": the device kind's name */

    /* devices of this kind; may be NULL (the CPU): then there is exactly one */
    rt_status (*device_count)(int *count);
    rt_status (*device_info)(int index, rt_cuda_device_info *info); /* may be NULL */
    rt_status (*set_current)(int index);

    /* memory: allocations on device `index`; memcpy between this kind and the host
     * (dst_dev / src_dev say which side is this kind's memory), asynchronous on a stream
     * of this kind, synchronous with NULL */
    rt_status (*malloc)(int index, size_t nbytes, void **out);
    void (*free)(void *p);
    rt_status (*memcpy)(void *dst, bool dst_dev, const void *src, bool src_dev, size_t nbytes, rt_stream *stream);
    rt_status (*memset)(void *p, int value, size_t nbytes, rt_stream *stream);
    /* page-locked host memory for fast transfers; may be NULL (none) */
    rt_status (*host_alloc)(size_t nbytes, void **out);
    void (*host_free)(void *p);

    /* streams and events: create fills s->native / e->native */
    rt_status (*stream_create)(rt_stream *s);
    void (*stream_destroy)(rt_stream *s);
    rt_status (*stream_sync)(rt_stream *s);
    rt_status (*event_create)(rt_event *e);
    void (*event_destroy)(rt_event *e);
    rt_status (*event_record)(rt_event *e, rt_stream *s); /* s may be NULL or of another kind */
    /* on a capturing stream: a record node of the graph (device.h rt_event_record_node); may be
     * NULL (no graphs: event_record) */
    rt_status (*event_record_node)(rt_event *e, rt_stream *s);
    rt_status (*event_sync)(rt_event *e);
    /* *done: the work before the event's last record has completed; never blocks. May be
     * NULL: an event of this kind is complete once recorded (the CPU) */
    rt_status (*event_query)(rt_event *e, bool *done);
    rt_status (*stream_wait_event)(rt_stream *s, rt_event *e); /* e may be of another kind */
    rt_status (*event_elapsed)(rt_event *start, rt_event *end, float *ms, bool *ready);
    /* graphs (device.h); may be NULL (none): capture_end fills *exec with the backend's
     * instantiated graph */
    rt_status (*capture_begin)(rt_stream *s);
    rt_status (*capture_end)(rt_stream *s, void **exec);
    rt_status (*graph_launch)(void *exec, rt_stream *s);
    void (*graph_destroy)(void *exec);
    bool (*capturing)(rt_stream *s);

    /* core/rng.h's *_dev draws into this kind's memory; may be NULL */
    rt_status (*rng_uniform)(rt_rng *rng, float *out_dev, size_t n, rt_stream *stream);
    rt_status (*rng_normal)(rt_rng *rng, float *out_dev, size_t n, float mean, float std, rt_stream *stream);

    /* the libraries this backend links, for `ringtrain info`; may be NULL */
    int (*lib_versions)(rt_lib_version *out, int cap);
};

extern const rt_device_backend rt_device_backend_cpu;
extern const rt_device_backend rt_device_backend_cuda; /* defined only with RT_HAVE_CUDA */

/* The table of device kind `kind`; NULL when that backend is not built in. */
const rt_device_backend *rt_device_backend_get(rt_device_kind kind);

#ifdef __cplusplus
}
#endif

#endif
