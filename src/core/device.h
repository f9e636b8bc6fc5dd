/* Devices (cpu | cuda): memory, copies, memset, streams, events, pinned host memory.
 *
 * One interface for both backends so that layers, optimizers and the communicator call
 * the same functions whatever the device. On the CPU a stream is a no-op ordering
 * token and an event records a host timestamp; on CUDA they are cudaStream_t and
 * cudaEvent_t. Every function works in a build without CUDA: CUDA requests then fail
 * with RT_ERR_UNSUPPORTED ("built without CUDA") instead of crashing. Each device kind
 * is one table of functions (core/internal/device_backend.h; cpu/ and cuda/).
 */
#ifndef RT_DEVICE_H
#define RT_DEVICE_H

#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_device_kind { RT_DEVICE_CPU = 0, RT_DEVICE_CUDA = 1, RT_DEVICE_KIND_COUNT_ } rt_device_kind;

typedef struct rt_device {
    rt_device_kind kind;
    int index; /* GPU ordinal; 0 for the CPU */
} rt_device;

static inline rt_device rt_device_cpu(void) { return (rt_device){RT_DEVICE_CPU, 0}; }
static inline rt_device rt_device_cuda(int index) { return (rt_device){RT_DEVICE_CUDA, index}; }
static inline bool rt_device_is_cuda(rt_device d) { return d.kind == RT_DEVICE_CUDA; }
static inline bool rt_device_equal(rt_device a, rt_device b) { return a.kind == b.kind && a.index == b.index; }

/* "cpu" or "cuda:N" into buf; returns buf. */
const char *rt_device_str(rt_device d, char *buf, size_t n);
/* "cpu", "cuda" */
const char *rt_device_kind_name(rt_device_kind kind);

/* RT_OK when this build has the backend of `kind`; else RT_ERR_UNSUPPORTED saying
 * "this ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF)". Areas with backend
 * tables of their own check this before picking theirs. */
rt_status rt_device_kind_built(rt_device_kind kind);

/* True when the library was built with the CUDA backend. */
bool rt_cuda_built(void);

/* Number of usable GPUs. With none (no driver, no device, or a build without CUDA)
 * returns RT_ERR_NODEVICE and a message that gives the driver's reason. GPUs that are
 * there but cannot be used (a driver too old for this CUDA runtime, a driver updated
 * without a reboot, every GPU busy in exclusive-process mode, a failed initialisation)
 * are RT_ERR_CUDA, with a message that names the cause and what to do. */
rt_status rt_cuda_device_count(int *count);

/* Device name, compute capability, memory, for `ringtrain info` (GPU `index`). */
typedef struct rt_cuda_device_info {
    char name[256];
    int major, minor;
    size_t total_mem;
    int multiprocessors;
    int driver_version, runtime_version;
} rt_cuda_device_info;
rt_status rt_cuda_device_info_get(int index, rt_cuda_device_info *info);

/* The one way to choose a device. `want` is a config or option value, matched
 * case-insensitively:
 *   "auto"    cuda:(local_rank % gpu_count) when a GPU answers, else the CPU
 *   "cpu"     the CPU (asks no GPU driver)
 *   "cuda"    cuda:(local_rank % gpu_count); RT_ERR_NODEVICE without a GPU
 *   "cuda:N"  GPU N; RT_ERR_INVALID when N >= gpu_count, RT_ERR_NODEVICE without a GPU
 * Anything else (NULL included) is RT_ERR_INVALID naming the value and these forms.
 * local_rank < 0 counts as 0 (LOCAL_RANK unset). rt_device_choose is the rule alone, a
 * pure function of its arguments (gpu_count <= 0: no GPU); rt_device_select asks the
 * driver for the count (its reason is in the error when there is none), applies the
 * rule, warns when ranks share a GPU, logs once when auto falls back to the CPU, and
 * makes the device current. Auto falls back only for "no GPU" (RT_ERR_NODEVICE): any
 * other failure of rt_cuda_device_count (GPUs that cannot be used) is returned, for
 * every `want` but "cpu". */
rt_status rt_device_choose(const char *want, int local_rank, int gpu_count, rt_device *out);
rt_status rt_device_select(const char *want, int local_rank, rt_device *out);

/* Make `d` the current device of the calling thread (no-op on the CPU). */
rt_status rt_device_set_current(rt_device d);

/* Memory. CPU allocations are 64-byte aligned. rt_free(NULL) is a no-op. */
rt_status rt_malloc(rt_device d, size_t nbytes, void **out);
void rt_free(rt_device d, void *p);

/* Host memory for transfers: page-locked when a CUDA device is usable (so copies can be
 * asynchronous), plain aligned memory otherwise. *pinned says which it got. */
rt_status rt_host_alloc(size_t nbytes, bool want_pinned, void **out, bool *pinned);
void rt_host_free(void *p, bool pinned);

typedef struct rt_stream rt_stream;
typedef struct rt_event rt_event;

/* Copy n bytes between any two devices (host<->host, host<->device, device<->device).
 * With a CUDA stream the copy is asynchronous on it; with NULL it is synchronous. */
rt_status rt_memcpy(void *dst, rt_device dst_dev, const void *src, rt_device src_dev, size_t nbytes, rt_stream *stream);
rt_status rt_memset(rt_device d, void *p, int value, size_t nbytes, rt_stream *stream);

rt_status rt_stream_create(rt_device d, rt_stream **out);
void rt_stream_destroy(rt_stream *s);
rt_status rt_stream_sync(rt_stream *s);
/* The native handle (cudaStream_t) or NULL on the CPU. */
void *rt_stream_native(rt_stream *s);

rt_status rt_event_create(rt_device d, rt_event **out);
void rt_event_destroy(rt_event *e);
rt_status rt_event_record(rt_event *e, rt_stream *s);
rt_status rt_event_sync(rt_event *e);
/* *done: everything enqueued before the event's last record has completed (true for an
 * event never recorded, and on the CPU); never blocks the host. */
rt_status rt_event_query(rt_event *e, bool *done);
/* Make stream `s` wait for event `e` (GPU-side; no host sync). */
rt_status rt_stream_wait_event(rt_stream *s, rt_event *e);
/* Milliseconds between two recorded events; *ready false (and RT_OK) if the later one
 * has not completed yet, so timing never forces a sync. */
rt_status rt_event_elapsed_ms(rt_event *start, rt_event *end, float *ms, bool *ready);

/* Graphs (CUDA; RT_ERR_UNSUPPORTED on the CPU). From rt_stream_capture_begin(s) until
 * rt_stream_capture_end(s), what the calling thread enqueues on s (and on streams that
 * wait on events recorded in it) is recorded, not run: CUDA stream capture in
 * thread-local mode, so other threads' allocations and synchronisations stay allowed,
 * but this thread must not allocate, synchronise or query a stream or an event meanwhile.
 * The arguments of each call are recorded as they are at the call: values that change
 * between replays must reach the work through memory. end: *out is the graph,
 * instantiated; where the capture failed (CUDA's reason in the error), the capture is
 * over and nothing it recorded runs. launch: one replay on s. */
typedef struct rt_graph rt_graph;
rt_status rt_stream_capture_begin(rt_stream *s);
rt_status rt_stream_capture_end(rt_stream *s, rt_graph **out);
rt_status rt_graph_launch(rt_graph *g, rt_stream *s);
void rt_graph_destroy(rt_graph *g);
/* An event record a graph keeps: on a capturing stream, a node of the graph (CUDA's
 * cudaEventRecordExternal), so every launch records the event when its work reaches that
 * point: the way to time the stages of a captured step (after the launch, the event is
 * complete once the graph's work before it is, and rt_event_elapsed_ms reads it). Not for
 * ordering streams inside the capture (rt_event_record's). Elsewhere rt_event_record. */
rt_status rt_event_record_node(rt_event *e, rt_stream *s);
/* Whether s is capturing now (false on the CPU): an event recorded on a capturing stream
 * is not recorded when the graph runs, so code that records one to wait for later must
 * wait for the stream instead. */
bool rt_stream_capturing(rt_stream *s);

#ifdef __cplusplus
}
#endif

#endif
