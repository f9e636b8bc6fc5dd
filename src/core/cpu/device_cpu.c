/* The CPU device backend (see core/internal/device_backend.h): aligned host memory, and
 * streams and events that are ordering tokens (work on the CPU is done when the call
 * returns), with host timestamps for timing. */
#include "core/internal/device_backend.h"

#include "core/timer.h"

#include <stdlib.h>
#include <string.h>

static rt_status cpu_set_current(int index) {
    (void)index;
    return RT_OK;
}

static rt_status cpu_malloc(int index, size_t nbytes, void **out) {
    (void)index;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes) RT_FAIL(RT_ERR_NOMEM, "allocation of %zu bytes overflows", nbytes);
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    RT_CHECK_ALLOC(p, nbytes);
    *out = p;
    return RT_OK;
}

static void cpu_free(void *p) { free(p); }

static rt_status cpu_memcpy(void *dst, bool dst_dev, const void *src, bool src_dev, size_t nbytes, rt_stream *stream) {
    (void)dst_dev, (void)src_dev, (void)stream;
    memmove(dst, src, nbytes);
    return RT_OK;
}

static rt_status cpu_memset(void *p, int value, size_t nbytes, rt_stream *stream) {
    (void)stream;
    memset(p, value, nbytes);
    return RT_OK;
}

static rt_status cpu_stream_create(rt_stream *s) {
    (void)s;
    return RT_OK;
}
static void cpu_stream_destroy(rt_stream *s) { (void)s; }
static rt_status cpu_stream_sync(rt_stream *s) {
    (void)s;
    return RT_OK;
}
static rt_status cpu_event_create(rt_event *e) {
    (void)e;
    return RT_OK;
}
static void cpu_event_destroy(rt_event *e) { (void)e; }
static rt_status cpu_event_record(rt_event *e, rt_stream *s) {
    (void)e, (void)s; /* the front end stamped e->host_ns */
    return RT_OK;
}
static rt_status cpu_event_sync(rt_event *e) {
    (void)e;
    return RT_OK;
}
static rt_status cpu_stream_wait_event(rt_stream *s, rt_event *e) {
    (void)s, (void)e;
    return RT_OK;
}
static rt_status cpu_event_elapsed(rt_event *start, rt_event *end, float *ms, bool *ready) {
    *ms = (float)rt_ns_to_ms(end->host_ns - start->host_ns);
    *ready = true;
    return RT_OK;
}

const rt_device_backend rt_device_backend_cpu = {
    .name = "cpu",
    .set_current = cpu_set_current,
    .malloc = cpu_malloc,
    .free = cpu_free,
    .memcpy = cpu_memcpy,
    .memset = cpu_memset,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_sync = cpu_event_sync,
    .stream_wait_event = cpu_stream_wait_event,
    .event_elapsed = cpu_event_elapsed,
};
