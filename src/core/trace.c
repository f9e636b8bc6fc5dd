/* The timeline recorder (trace.h): one preallocated array of spans per process, one
 * mutex, written as JSON lines when the caller flushes (or the array is full). */
#include "core/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool rt_trace_on_;

typedef struct span {
    uint64_t t0, t1, queued_ns;
    int64_t step, epoch, bytes;
    const char *name, *algo;
    int32_t track, bucket;
} span;

static struct {
    pthread_mutex_t mu;
    span *s;
    size_t cap, n;
    char path[4096];
    bool header_set, written; /* the header is known; the file was created */
    int rank, world;
    int64_t offset_ns, error_ns, rtt_ns;
    int64_t step, epoch;
    uint64_t dropped, full_flushes;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const k_tracks[RT_TRACK_COUNT_] = {"main", "comm", "stream"};

const char *rt_trace_track_name(int track) {
    return track >= 0 && track < RT_TRACK_COUNT_ ? k_tracks[track] : "unknown";
}

rt_status rt_trace_start(const char *path, size_t capacity) {
    RT_REQUIRE(path && *path && strlen(path) < sizeof g.path, RT_ERR_INVALID, "trace: bad file path");
    RT_REQUIRE(capacity > 0, RT_ERR_INVALID, "trace: capacity 0");
    span *s = malloc(capacity * sizeof *s);
    RT_CHECK_ALLOC(s, capacity * sizeof *s);
    pthread_mutex_lock(&g.mu);
    free(g.s);
    g.s = s;
    g.cap = capacity;
    g.n = 0;
    snprintf(g.path, sizeof g.path, "%s", path);
    g.header_set = g.written = false;
    g.rank = 0;
    g.world = 1;
    g.offset_ns = g.error_ns = g.rtt_ns = 0;
    g.step = g.epoch = 0;
    g.dropped = g.full_flushes = 0;
    rt_trace_on_ = true;
    pthread_mutex_unlock(&g.mu);
    return RT_OK;
}

void rt_trace_stop(void) {
    pthread_mutex_lock(&g.mu);
    rt_trace_on_ = false;
    free(g.s);
    g.s = NULL;
    g.cap = g.n = 0;
    pthread_mutex_unlock(&g.mu);
}

void rt_trace_set_step(int64_t step, int64_t epoch) {
    if (!rt_trace_on_) return;
    pthread_mutex_lock(&g.mu);
    g.step = step;
    g.epoch = epoch;
    pthread_mutex_unlock(&g.mu);
}

void rt_trace_set_header(int rank, int world_size, int64_t offset_ns, int64_t error_ns, int64_t rtt_ns) {
    pthread_mutex_lock(&g.mu);
    g.rank = rank;
    g.world = world_size;
    g.offset_ns = offset_ns;
    g.error_ns = error_ns;
    g.rtt_ns = rtt_ns;
    g.header_set = true;
    pthread_mutex_unlock(&g.mu);
}

/* under g.mu */
static rt_status flush_locked(void) {
    /* nothing before the header (the rank's clock offset): a file without it could not be
     * merged, and would carry rank 0's number */
    if (!g.s || !g.header_set) return RT_OK;
    FILE *f = fopen(g.path, g.written ? "a" : "w");
    if (!f) return RT_ERROR(RT_ERR_IO, "trace file %s: %s", g.path, strerror(errno));
    if (!g.written) {
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        for (char *c = host; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
        fprintf(f,
                "{\"kind\": \"header\", \"version\": 1, \"rank\": %d, \"world_size\": %d, \"clock\": "
                "\"CLOCK_MONOTONIC\", \"offset_ns\": %" PRId64 ", \"offset_error_ns\": %" PRId64
                ", \"rtt_ns\": %" PRId64
                ", \"tracks\": [\"main\", \"comm\", \"stream\"], \"host\": \"%s\", \"pid\": %d}\n",
                g.rank, g.world, g.offset_ns, g.error_ns, g.rtt_ns, host, (int)getpid());
        g.written = true;
    }
    for (size_t i = 0; i < g.n; i++) {
        const span *s = &g.s[i];
        fprintf(f,
                "{\"name\": \"%s\", \"track\": %d, \"t0\": %" PRIu64 ", \"t1\": %" PRIu64 ", \"step\": %" PRId64
                ", \"epoch\": %" PRId64,
                s->name, (int)s->track, s->t0, s->t1, s->step, s->epoch);
        if (s->bucket >= -1 && s->bytes >= 0)
            fprintf(f, ", \"bucket\": %d, \"bytes\": %" PRId64 ", \"algo\": \"%s\", \"queued_ns\": %" PRIu64,
                    (int)s->bucket, s->bytes, s->algo ? s->algo : "unknown", s->queued_ns);
        fputs("}\n", f);
    }
    if (g.dropped || g.full_flushes)
        fprintf(f, "{\"kind\": \"note\", \"dropped\": %" PRIu64 ", \"flushes_when_full\": %" PRIu64 "}\n", g.dropped,
                g.full_flushes);
    g.dropped = 0;
    g.full_flushes = 0;
    g.n = 0;
    if (ferror(f) | (fclose(f) != 0)) return RT_ERROR(RT_ERR_IO, "trace file %s: write failed", g.path);
    return RT_OK;
}

enum { CURRENT = -0x7fffffff }; /* a span's step: the current one (rt_trace_set_step) */

static void add(span *s) {
    pthread_mutex_lock(&g.mu);
    if (s->step == CURRENT) {
        s->step = g.step;
        s->epoch = g.epoch;
    }
    if (g.s && g.n == g.cap) {
        if (g.header_set) {
            g.full_flushes++;
            /* the next flush reports a failure; the caller's error (a span recorded on an
             * error path) is kept */
            rt_error_record saved;
            rt_error_save(&saved);
            if (flush_locked() != RT_OK) rt_error_restore(&saved);
        }
    }
    if (g.s && g.n < g.cap)
        g.s[g.n++] = *s;
    else
        g.dropped++;
    pthread_mutex_unlock(&g.mu);
}

void rt_trace_span_at(int track, const char *name, uint64_t t0, uint64_t t1, int64_t step, int64_t epoch) {
    if (!rt_trace_on_ || !t0) return;
    span s = {.t0 = t0,
              .t1 = t1 < t0 ? t0 : t1,
              .step = step,
              .epoch = epoch,
              .bytes = -1,
              .name = name,
              .track = track,
              .bucket = -2};
    add(&s);
}

void rt_trace_span(int track, const char *name, uint64_t t0, uint64_t t1) {
    if (!rt_trace_on_ || !t0) return;
    rt_trace_span_at(track, name, t0, t1, CURRENT, 0);
}

void rt_trace_span_comm_at(int track, const char *name, uint64_t t0, uint64_t t1, int bucket, int64_t bytes,
                           const char *algo, uint64_t queued_ns, int64_t step, int64_t epoch) {
    if (!rt_trace_on_ || !t0) return;
    span s = {.t0 = t0,
              .t1 = t1 < t0 ? t0 : t1,
              .queued_ns = queued_ns,
              .step = step,
              .epoch = epoch,
              .bytes = bytes < 0 ? 0 : bytes,
              .name = name,
              .algo = algo,
              .track = track,
              .bucket = bucket < -1 ? -1 : bucket};
    add(&s);
}

void rt_trace_span_comm(int track, const char *name, uint64_t t0, uint64_t t1, int bucket, int64_t bytes,
                        const char *algo, uint64_t queued_ns) {
    rt_trace_span_comm_at(track, name, t0, t1, bucket, bytes, algo, queued_ns, CURRENT, 0);
}

void rt_trace_get_step(int64_t *step, int64_t *epoch) {
    pthread_mutex_lock(&g.mu);
    *step = g.step;
    *epoch = g.epoch;
    pthread_mutex_unlock(&g.mu);
}

rt_status rt_trace_flush(void) {
    if (!rt_trace_on_) return RT_OK;
    pthread_mutex_lock(&g.mu);
    rt_status s = flush_locked();
    pthread_mutex_unlock(&g.mu);
    return s;
}
