/* Device layer: CPU implementation and dispatch to the CUDA one (core/cuda/). */
#include "core/device.h"

#include "core/cuda/device_cuda.h"
#include "core/log.h"
#include "core/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_stream {
    rt_device dev;
    void *native; /* cudaStream_t */
};

struct rt_event {
    rt_device dev;
    void *native; /* cudaEvent_t */
    uint64_t host_ns;
    bool recorded;
};

const char *rt_device_str(rt_device d, char *buf, size_t n) {
    if (d.kind == RT_DEVICE_CUDA)
        snprintf(buf, n, "cuda:%d", d.index);
    else
        snprintf(buf, n, "cpu");
    return buf;
}

bool rt_cuda_built(void) {
#ifdef RT_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

#ifndef RT_HAVE_CUDA
#define NO_CUDA() RT_FAIL(RT_ERR_UNSUPPORTED, "this ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF)")
#endif

rt_status rt_cuda_device_count(int *count) {
    *count = 0;
#ifdef RT_HAVE_CUDA
    RT_CHECK(rt_cuda_count(count));
    if (*count == 0) RT_FAIL(RT_ERR_NODEVICE, "no GPU: the CUDA driver reports 0 devices");
    return RT_OK;
#else
    RT_FAIL(RT_ERR_NODEVICE, "no GPU: this ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF)");
#endif
}

rt_status rt_cuda_device_info_get(int index, rt_cuda_device_info *info) {
    memset(info, 0, sizeof *info);
#ifdef RT_HAVE_CUDA
    return rt_cuda_info(index, info);
#else
    (void)index;
    NO_CUDA();
#endif
}

rt_status rt_device_select(const char *want, int local_rank, rt_device *out) {
    *out = rt_device_cpu();
    if (!want || strcmp(want, "cpu") == 0) return RT_OK;
    bool is_auto = strcmp(want, "auto") == 0;
    int index = -1;
    if (!is_auto) {
        if (strcmp(want, "cuda") == 0) {
            index = -1;
        } else if (strncmp(want, "cuda:", 5) == 0) {
            char *end = NULL;
            long v = strtol(want + 5, &end, 10);
            if (!*(want + 5) || *end || v < 0 || v > 1024)
                RT_FAIL(RT_ERR_INVALID, "device '%s': expected auto, cpu, cuda or cuda:N", want);
            index = (int)v;
        } else {
            RT_FAIL(RT_ERR_INVALID, "device '%s': expected auto, cpu, cuda or cuda:N", want);
        }
    }
    int count = 0;
    rt_status st = rt_cuda_device_count(&count);
    if (st != RT_OK) {
        if (!is_auto) {
            rt_error_trace(__FILE__, __LINE__, "device requested in config");
            return st;
        }
        static int said;
        if (!said++) RT_LOG_INFO("device auto: %s; using the CPU", rt_error_message());
        rt_error_clear();
        return RT_OK;
    }
    if (index >= count) RT_FAIL(RT_ERR_INVALID, "device cuda:%d requested but only %d GPU(s) found", index, count);
    if (index < 0) {
        int lr = local_rank < 0 ? 0 : local_rank;
        index = lr % count;
        if (lr >= count)
            RT_LOG_WARN("local rank %d shares GPU %d with another rank (%d GPU(s)); fine for testing, slow for training",
                        lr, index, count);
    }
    *out = rt_device_cuda(index);
    RT_CHECK(rt_device_set_current(*out));
    return RT_OK;
}

rt_status rt_device_set_current(rt_device d) {
    if (d.kind == RT_DEVICE_CPU) return RT_OK;
#ifdef RT_HAVE_CUDA
    return rt_cuda_set_device(d.index);
#else
    NO_CUDA();
#endif
}

rt_status rt_malloc(rt_device d, size_t nbytes, void **out) {
    *out = NULL;
    if (d.kind == RT_DEVICE_CUDA) {
#ifdef RT_HAVE_CUDA
        return rt_cuda_malloc(d.index, nbytes, out);
#else
        NO_CUDA();
#endif
    }
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded < nbytes) RT_FAIL(RT_ERR_NOMEM, "allocation of %zu bytes overflows", nbytes);
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    RT_CHECK_ALLOC(p, nbytes);
    *out = p;
    return RT_OK;
}

void rt_free(rt_device d, void *p) {
    if (!p) return;
    if (d.kind == RT_DEVICE_CUDA) {
#ifdef RT_HAVE_CUDA
        rt_cuda_free(p);
#endif
        return;
    }
    free(p);
}

rt_status rt_host_alloc(size_t nbytes, bool want_pinned, void **out, bool *pinned) {
    *pinned = false;
#ifdef RT_HAVE_CUDA
    if (want_pinned) {
        int count = 0;
        if (rt_cuda_count(&count) == RT_OK && count > 0 && rt_cuda_host_alloc(nbytes, out) == RT_OK) {
            *pinned = true;
            return RT_OK;
        }
        rt_error_clear();
    }
#else
    (void)want_pinned;
#endif
    return rt_malloc(rt_device_cpu(), nbytes, out);
}

void rt_host_free(void *p, bool pinned) {
    if (!p) return;
#ifdef RT_HAVE_CUDA
    if (pinned) {
        rt_cuda_host_free(p);
        return;
    }
#else
    (void)pinned;
#endif
    free(p);
}

rt_status rt_memcpy(void *dst, rt_device dst_dev, const void *src, rt_device src_dev, size_t nbytes,
                    rt_stream *stream) {
    if (nbytes == 0) return RT_OK;
    RT_REQUIRE(dst && src, RT_ERR_INVALID, "rt_memcpy of %zu bytes with a NULL pointer", nbytes);
    if (dst_dev.kind == RT_DEVICE_CPU && src_dev.kind == RT_DEVICE_CPU) {
        memmove(dst, src, nbytes);
        return RT_OK;
    }
#ifdef RT_HAVE_CUDA
    return rt_cuda_memcpy(dst, dst_dev.kind == RT_DEVICE_CUDA, src, src_dev.kind == RT_DEVICE_CUDA, nbytes,
                          stream ? stream->native : NULL);
#else
    (void)stream;
    NO_CUDA();
#endif
}

rt_status rt_memset(rt_device d, void *p, int value, size_t nbytes, rt_stream *stream) {
    if (nbytes == 0) return RT_OK;
    RT_REQUIRE(p, RT_ERR_INVALID, "rt_memset of %zu bytes on a NULL pointer", nbytes);
    if (d.kind == RT_DEVICE_CPU) {
        memset(p, value, nbytes);
        return RT_OK;
    }
#ifdef RT_HAVE_CUDA
    return rt_cuda_memset(p, value, nbytes, stream ? stream->native : NULL);
#else
    (void)stream;
    NO_CUDA();
#endif
}

rt_status rt_stream_create(rt_device d, rt_stream **out) {
    *out = NULL;
    rt_stream *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    s->dev = d;
    if (d.kind == RT_DEVICE_CUDA) {
#ifdef RT_HAVE_CUDA
        rt_status st = rt_cuda_stream_create(d.index, &s->native);
        if (st != RT_OK) {
            free(s);
            rt_error_trace(__FILE__, __LINE__, "rt_cuda_stream_create");
            return st;
        }
#else
        free(s);
        NO_CUDA();
#endif
    }
    *out = s;
    return RT_OK;
}

void rt_stream_destroy(rt_stream *s) {
    if (!s) return;
#ifdef RT_HAVE_CUDA
    if (s->native) rt_cuda_stream_destroy(s->native);
#endif
    free(s);
}

rt_status rt_stream_sync(rt_stream *s) {
#ifdef RT_HAVE_CUDA
    if (s && s->native) return rt_cuda_stream_sync(s->native);
#else
    (void)s;
#endif
    return RT_OK;
}

void *rt_stream_native(rt_stream *s) { return s ? s->native : NULL; }

rt_status rt_event_create(rt_device d, rt_event **out) {
    *out = NULL;
    rt_event *e = calloc(1, sizeof *e);
    RT_CHECK_ALLOC(e, sizeof *e);
    e->dev = d;
    if (d.kind == RT_DEVICE_CUDA) {
#ifdef RT_HAVE_CUDA
        rt_status st = rt_cuda_event_create(d.index, &e->native);
        if (st != RT_OK) {
            free(e);
            rt_error_trace(__FILE__, __LINE__, "rt_cuda_event_create");
            return st;
        }
#else
        free(e);
        NO_CUDA();
#endif
    }
    *out = e;
    return RT_OK;
}

void rt_event_destroy(rt_event *e) {
    if (!e) return;
#ifdef RT_HAVE_CUDA
    if (e->native) rt_cuda_event_destroy(e->native);
#endif
    free(e);
}

rt_status rt_event_record(rt_event *e, rt_stream *s) {
    RT_REQUIRE(e, RT_ERR_INVALID, "rt_event_record on a NULL event");
    e->recorded = true;
    e->host_ns = rt_now_ns();
#ifdef RT_HAVE_CUDA
    if (e->native) return rt_cuda_event_record(e->native, s ? s->native : NULL);
#else
    (void)s;
#endif
    return RT_OK;
}

rt_status rt_event_sync(rt_event *e) {
#ifdef RT_HAVE_CUDA
    if (e && e->native) return rt_cuda_event_sync(e->native);
#else
    (void)e;
#endif
    return RT_OK;
}

rt_status rt_stream_wait_event(rt_stream *s, rt_event *e) {
#ifdef RT_HAVE_CUDA
    if (s && s->native && e && e->native) return rt_cuda_stream_wait_event(s->native, e->native);
#else
    (void)s;
    (void)e;
#endif
    return RT_OK;
}

rt_status rt_event_elapsed_ms(rt_event *start, rt_event *end, float *ms, bool *ready) {
    *ms = 0.0f;
    *ready = false;
    RT_REQUIRE(start && end, RT_ERR_INVALID, "rt_event_elapsed_ms with a NULL event");
    RT_REQUIRE(start->recorded && end->recorded, RT_ERR_INVALID, "rt_event_elapsed_ms on an event never recorded");
    RT_REQUIRE(start->dev.kind == end->dev.kind, RT_ERR_INVALID, "rt_event_elapsed_ms: events of different devices");
#ifdef RT_HAVE_CUDA
    if (start->native) return rt_cuda_event_elapsed(start->native, end->native, ms, ready);
#endif
    *ms = (float)rt_ns_to_ms(end->host_ns - start->host_ns);
    *ready = true;
    return RT_OK;
}
