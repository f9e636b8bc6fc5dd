/* Device layer front end: argument checks, the choice of a device, and dispatch to the
 * backend table of the device kind involved (core/internal/device_backend.h). */
#include "core/device.h"

#include "core/internal/device_backend.h"
#include "core/log.h"
#include "core/names.h"
#include "core/timer.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const k_kind_names[RT_DEVICE_KIND_COUNT_] = {"cpu", "cuda"};

/* The one place where the build decides which backends exist. */
const rt_device_backend *rt_device_backend_get(rt_device_kind kind) {
    static const rt_device_backend *const k_backends[RT_DEVICE_KIND_COUNT_] = {
        [RT_DEVICE_CPU] = &rt_device_backend_cpu,
#ifdef RT_HAVE_CUDA
        [RT_DEVICE_CUDA] = &rt_device_backend_cuda,
#endif
    };
    return (unsigned)kind < RT_DEVICE_KIND_COUNT_ ? k_backends[kind] : NULL;
}

rt_status rt_device_kind_built(rt_device_kind kind) {
    if (rt_device_backend_get(kind)) return RT_OK;
    if ((unsigned)kind >= RT_DEVICE_KIND_COUNT_) RT_FAIL(RT_ERR_INVALID, "device kind %d is not a device", (int)kind);
    char upper[16];
    size_t i = 0;
    for (; k_kind_names[kind][i] && i + 1 < sizeof upper; i++)
        upper[i] = (char)toupper((unsigned char)k_kind_names[kind][i]);
    upper[i] = '\0';
    RT_FAIL(RT_ERR_UNSUPPORTED, "this ringtrain was built without %s (RINGTRAIN_%s=OFF)", upper, upper);
}

/* The backend of `kind`, or RT_ERR_UNSUPPORTED saying it is not built in. */
static rt_status backend_of(rt_device_kind kind, const rt_device_backend **out) {
    *out = rt_device_backend_get(kind);
    if (*out) return RT_OK;
    return rt_device_kind_built(kind);
}

const char *rt_device_kind_name(rt_device_kind kind) {
    return (unsigned)kind < RT_DEVICE_KIND_COUNT_ ? k_kind_names[kind] : "?";
}

const char *rt_device_str(rt_device d, char *buf, size_t n) {
    if (d.kind == RT_DEVICE_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "%s:%d", rt_device_kind_name(d.kind), d.index);
    return buf;
}

bool rt_cuda_built(void) { return rt_device_backend_get(RT_DEVICE_CUDA) != NULL; }

rt_status rt_cuda_device_count(int *count) {
    *count = 0;
    const rt_device_backend *be = rt_device_backend_get(RT_DEVICE_CUDA);
    if (!be) RT_FAIL(RT_ERR_NODEVICE, "no GPU: this ringtrain was built without CUDA (RINGTRAIN_CUDA=OFF)");
    RT_CHECK(be->device_count(count));
    if (*count == 0) RT_FAIL(RT_ERR_NODEVICE, "no GPU: the CUDA driver reports 0 devices");
    return RT_OK;
}

rt_status rt_cuda_device_info_get(int index, rt_cuda_device_info *info) {
    memset(info, 0, sizeof *info);
    const rt_device_backend *be;
    RT_CHECK(backend_of(RT_DEVICE_CUDA, &be));
    RT_REQUIRE(be->device_info, RT_ERR_UNSUPPORTED, "no device information from the %s backend", be->name);
    return be->device_info(index, info);
}

/* ---- choosing a device --------------------------------------------------------------- */

/* "auto | cpu | cuda | cuda:N", from the kind names */
static const char *device_forms(char *buf, size_t n) {
    buf[0] = '\0';
    rt_names_append(buf, n, "auto");
    for (int k = 0; k < RT_DEVICE_KIND_COUNT_; k++) rt_names_append(buf, n, k_kind_names[k]);
    for (int k = 0; k < RT_DEVICE_KIND_COUNT_; k++) {
        char form[32];
        snprintf(form, sizeof form, "%s:N", k_kind_names[k]);
        if (k != RT_DEVICE_CPU) rt_names_append(buf, n, form);
    }
    return buf;
}

/* The syntax of a device name: *is_auto, or a kind with an index (-1: by local rank). */
static rt_status device_parse(const char *want, bool *is_auto, rt_device_kind *kind, int *index) {
    char forms[128];
    *is_auto = false;
    *kind = RT_DEVICE_CPU;
    *index = -1;
    if (want && strcasecmp(want, "auto") == 0) {
        *is_auto = true;
        return RT_OK;
    }
    int k = rt_names_find(k_kind_names, RT_DEVICE_KIND_COUNT_, want);
    if (k >= 0) {
        *kind = (rt_device_kind)k;
        if (k == RT_DEVICE_CPU) *index = 0;
        return RT_OK;
    }
    const char *colon = want ? strchr(want, ':') : NULL;
    if (colon) {
        for (k = 0; k < RT_DEVICE_KIND_COUNT_; k++)
            if (k != RT_DEVICE_CPU && strlen(k_kind_names[k]) == (size_t)(colon - want) &&
                strncasecmp(want, k_kind_names[k], (size_t)(colon - want)) == 0)
                break;
        if (k < RT_DEVICE_KIND_COUNT_) {
            const char *digits = colon + 1;
            char *end = NULL;
            long v = (*digits >= '0' && *digits <= '9') ? strtol(digits, &end, 10) : -1;
            if (v < 0 || v > INT_MAX || *end != '\0')
                RT_FAIL(RT_ERR_INVALID, "device '%s': '%s' is not a GPU index (expected %s, N = 0, 1, ...)", want,
                        digits, device_forms(forms, sizeof forms));
            *kind = (rt_device_kind)k;
            *index = (int)v;
            return RT_OK;
        }
    }
    RT_FAIL(RT_ERR_INVALID, "unknown device '%s' (expected %s)", want ? want : "(null)",
            device_forms(forms, sizeof forms));
}

rt_status rt_device_choose(const char *want, int local_rank, int gpu_count, rt_device *out) {
    *out = rt_device_cpu();
    bool is_auto;
    rt_device_kind kind;
    int index;
    RT_CHECK(device_parse(want, &is_auto, &kind, &index));
    if (kind == RT_DEVICE_CPU && !is_auto) return RT_OK;
    if (gpu_count <= 0) {
        if (is_auto) return RT_OK;
        RT_FAIL(RT_ERR_NODEVICE, "device '%s' requested but no GPU was found", want);
    }
    if (index >= gpu_count)
        RT_FAIL(RT_ERR_INVALID, "device '%s' requested but only %d GPU(s) found (cuda:0 .. cuda:%d)", want, gpu_count,
                gpu_count - 1);
    if (index < 0) index = (local_rank < 0 ? 0 : local_rank) % gpu_count;
    *out = rt_device_cuda(index);
    return RT_OK;
}

/* An error message as a sentence for a user: without the "rank N: " the log prefix
 * already says, the source location and the "from" trace that follows it. */
static const char *error_text(const char *msg, char *buf, size_t n) {
    const char *p = msg;
    if (strncmp(p, "rank ", 5) == 0) {
        const char *q = p + 5;
        while (isdigit((unsigned char)*q)) q++;
        if (q > p + 5 && strncmp(q, ": ", 2) == 0) p = q + 2;
    }
    size_t len = strcspn(p, "\n");
    /* the location ends the first line: " (src/x.c:12)" or " (src/x.c:12: call)" */
    for (size_t i = 0; i + 2 < len; i++) {
        if (p[i] != ' ' || p[i + 1] != '(') continue;
        const char *f = p + i + 2;
        size_t fl = strcspn(f, ":) \n");
        bool source = (fl > 2 && strncmp(f + fl - 2, ".c", 2) == 0) || (fl > 3 && strncmp(f + fl - 3, ".cu", 3) == 0);
        if (source && f[fl] == ':' && isdigit((unsigned char)f[fl + 1])) {
            len = i;
            break;
        }
    }
    snprintf(buf, n, "%.*s", (int)len, p);
    return buf;
}

rt_status rt_device_select(const char *want, int local_rank, rt_device *out) {
    *out = rt_device_cpu();
    bool is_auto;
    rt_device_kind kind;
    int index;
    RT_CHECK(device_parse(want, &is_auto, &kind, &index)); /* a bad name fails on every machine */
    if (kind == RT_DEVICE_CPU && !is_auto) return RT_OK;   /* the CPU asks no GPU driver */
    int count = 0;
    char why[512] = "";
    rt_status cs = rt_cuda_device_count(&count);
    if (cs != RT_OK && cs != RT_ERR_NODEVICE) { /* GPUs that are there but unusable: never a silent CPU run */
        rt_error_trace(__FILE__, __LINE__, "rt_cuda_device_count");
        return cs;
    }
    if (cs != RT_OK) {
        snprintf(why, sizeof why, "%s", rt_error_message());
        rt_error_clear();
        count = 0;
    }
    rt_status st = rt_device_choose(want, local_rank, count, out);
    if (st == RT_ERR_NODEVICE) /* say why there is none */
        RT_FAIL(RT_ERR_NODEVICE, "device '%s' requested (in config or options), but %s", want, why);
    RT_CHECK(st);
    if (!rt_device_is_cuda(*out)) { /* auto without a GPU: said once per node, as a choice */
        static int said;
        if (!said++) {
            RT_LOG_DEBUG("device auto: %s; using the CPU", why);
            char reason[512];
            if (local_rank <= 0) RT_LOG_INFO("device auto: using the CPU (%s)", error_text(why, reason, sizeof reason));
        }
        return RT_OK;
    }
    if (index < 0 && local_rank >= count)
        RT_LOG_WARN("local rank %d shares GPU %d with another rank (%d GPU(s)); fine for testing, slow for training",
                    local_rank, out->index, count);
    RT_CHECK(rt_device_set_current(*out));
    return RT_OK;
}

/* ---- memory, streams, events --------------------------------------------------------- */

rt_status rt_device_set_current(rt_device d) {
    const rt_device_backend *be;
    RT_CHECK(backend_of(d.kind, &be));
    return be->set_current(d.index);
}

rt_status rt_malloc(rt_device d, size_t nbytes, void **out) {
    *out = NULL;
    const rt_device_backend *be;
    RT_CHECK(backend_of(d.kind, &be));
    return be->malloc(d.index, nbytes, out);
}

void rt_free(rt_device d, void *p) {
    const rt_device_backend *be = rt_device_backend_get(d.kind);
    if (p && be) be->free(p);
}

/* Page-locked memory comes from the GPU backend, when it is built and a GPU answers. */
rt_status rt_host_alloc(size_t nbytes, bool want_pinned, void **out, bool *pinned) {
    *pinned = false;
    const rt_device_backend *be = rt_device_backend_get(RT_DEVICE_CUDA);
    if (want_pinned && be && be->host_alloc) {
        int count = 0;
        if (be->device_count(&count) == RT_OK && count > 0 && be->host_alloc(nbytes, out) == RT_OK) {
            *pinned = true;
            return RT_OK;
        }
        rt_error_clear();
    }
    return rt_malloc(rt_device_cpu(), nbytes, out);
}

void rt_host_free(void *p, bool pinned) {
    if (!p) return;
    const rt_device_backend *be = pinned ? rt_device_backend_get(RT_DEVICE_CUDA) : NULL;
    if (be && be->host_free)
        be->host_free(p);
    else
        free(p);
}

rt_status rt_memcpy(void *dst, rt_device dst_dev, const void *src, rt_device src_dev, size_t nbytes,
                    rt_stream *stream) {
    if (nbytes == 0) return RT_OK;
    RT_REQUIRE(dst && src, RT_ERR_INVALID, "rt_memcpy of %zu bytes with a NULL pointer", nbytes);
    /* the backend of the side that is not host memory (the CPU's when both are) */
    rt_device_kind kind = dst_dev.kind != RT_DEVICE_CPU ? dst_dev.kind : src_dev.kind;
    const rt_device_backend *be;
    RT_CHECK(backend_of(kind, &be));
    return be->memcpy(dst, dst_dev.kind != RT_DEVICE_CPU, src, src_dev.kind != RT_DEVICE_CPU, nbytes, stream);
}

rt_status rt_memset(rt_device d, void *p, int value, size_t nbytes, rt_stream *stream) {
    if (nbytes == 0) return RT_OK;
    RT_REQUIRE(p, RT_ERR_INVALID, "rt_memset of %zu bytes on a NULL pointer", nbytes);
    const rt_device_backend *be;
    RT_CHECK(backend_of(d.kind, &be));
    return be->memset(p, value, nbytes, stream);
}

rt_status rt_stream_create(rt_device d, rt_stream **out) {
    *out = NULL;
    const rt_device_backend *be;
    RT_CHECK(backend_of(d.kind, &be));
    rt_stream *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    s->dev = d;
    s->be = be;
    rt_status st = be->stream_create(s);
    if (st != RT_OK) {
        free(s);
        rt_error_trace(__FILE__, __LINE__, "stream_create");
        return st;
    }
    *out = s;
    return RT_OK;
}

void rt_stream_destroy(rt_stream *s) {
    if (!s) return;
    s->be->stream_destroy(s);
    free(s);
}

rt_status rt_stream_sync(rt_stream *s) { return s ? s->be->stream_sync(s) : RT_OK; }

void *rt_stream_native(rt_stream *s) { return s ? s->native : NULL; }

rt_status rt_event_create(rt_device d, rt_event **out) {
    *out = NULL;
    const rt_device_backend *be;
    RT_CHECK(backend_of(d.kind, &be));
    rt_event *e = calloc(1, sizeof *e);
    RT_CHECK_ALLOC(e, sizeof *e);
    e->dev = d;
    e->be = be;
    rt_status st = be->event_create(e);
    if (st != RT_OK) {
        free(e);
        rt_error_trace(__FILE__, __LINE__, "event_create");
        return st;
    }
    *out = e;
    return RT_OK;
}

void rt_event_destroy(rt_event *e) {
    if (!e) return;
    e->be->event_destroy(e);
    free(e);
}

rt_status rt_event_record(rt_event *e, rt_stream *s) {
    RT_REQUIRE(e, RT_ERR_INVALID, "rt_event_record on a NULL event");
    e->recorded = true;
    e->host_ns = rt_now_ns();
    return e->be->event_record(e, s);
}

rt_status rt_event_record_node(rt_event *e, rt_stream *s) {
    if (!rt_stream_capturing(s) || !e || !e->be->event_record_node) return rt_event_record(e, s);
    e->recorded = true;
    return e->be->event_record_node(e, s);
}

rt_status rt_event_sync(rt_event *e) { return e ? e->be->event_sync(e) : RT_OK; }

rt_status rt_event_query(rt_event *e, bool *done) {
    *done = true;
    if (!e || !e->recorded || !e->be->event_query) return RT_OK;
    return e->be->event_query(e, done);
}

rt_status rt_stream_wait_event(rt_stream *s, rt_event *e) {
    if (!s || !e) return RT_OK;
    return s->be->stream_wait_event(s, e);
}

struct rt_graph {
    const rt_device_backend *be;
    void *exec;
};

rt_status rt_stream_capture_begin(rt_stream *s) {
    RT_REQUIRE(s, RT_ERR_INVALID, "rt_stream_capture_begin with a NULL stream");
    RT_REQUIRE(s->be->capture_begin, RT_ERR_UNSUPPORTED, "no graphs on the %s device", s->be->name);
    return s->be->capture_begin(s);
}

rt_status rt_stream_capture_end(rt_stream *s, rt_graph **out) {
    *out = NULL;
    RT_REQUIRE(s && s->be->capture_end, RT_ERR_UNSUPPORTED, "rt_stream_capture_end: no capture to end");
    rt_graph *g = calloc(1, sizeof *g);
    void *exec = NULL;
    rt_status st = s->be->capture_end(s, &exec); /* ends the capture whatever happens */
    if (st == RT_OK && !g) {
        s->be->graph_destroy(exec);
        RT_FAIL(RT_ERR_NOMEM, "rt_stream_capture_end: %zu bytes", sizeof *g);
    }
    if (st != RT_OK) {
        free(g);
        return st;
    }
    *g = (rt_graph){s->be, exec};
    *out = g;
    return RT_OK;
}

rt_status rt_graph_launch(rt_graph *g, rt_stream *s) {
    RT_REQUIRE(g && s && g->be == s->be, RT_ERR_INVALID, "rt_graph_launch: a graph and a stream of one device kind");
    return g->be->graph_launch(g->exec, s);
}

bool rt_stream_capturing(rt_stream *s) { return s && s->be->capturing && s->be->capturing(s); }

void rt_graph_destroy(rt_graph *g) {
    if (!g) return;
    g->be->graph_destroy(g->exec);
    free(g);
}

rt_status rt_event_elapsed_ms(rt_event *start, rt_event *end, float *ms, bool *ready) {
    *ms = 0.0f;
    *ready = false;
    RT_REQUIRE(start && end, RT_ERR_INVALID, "rt_event_elapsed_ms with a NULL event");
    RT_REQUIRE(start->recorded && end->recorded, RT_ERR_INVALID, "rt_event_elapsed_ms on an event never recorded");
    RT_REQUIRE(start->dev.kind == end->dev.kind, RT_ERR_INVALID, "rt_event_elapsed_ms: events of different devices");
    return start->be->event_elapsed(start, end, ms, ready);
}
