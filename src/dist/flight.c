/* The flight recorder (internal/flight.h). */
#include "dist/internal/flight.h"
#include "dist/internal/names.h"

#include "core/timer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const k_states[] = {"queued", "started", "done", "failed"};

rt_status rt_flight_init(rt_flight *f, uint32_t cap) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->next_id = 1;
    f->t0_ns = rt_now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    f->t0_wall_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (cap) {
        f->e = calloc(cap, sizeof *f->e);
        RT_CHECK_ALLOC(f->e, (size_t)cap * sizeof *f->e);
        f->cap = cap;
    }
    return RT_OK;
}

void rt_flight_destroy(rt_flight *f) {
    if (!f) return;
    free(f->e);
    f->e = NULL;
    f->cap = 0;
    pthread_mutex_destroy(&f->mu);
}

static uint64_t since(const rt_flight *f) {
    uint64_t t = rt_now_ns() - f->t0_ns;
    return t ? t : 1; /* 0 means "not reached" */
}

/* the live entry of `id`, or NULL (disabled, none, or overwritten); under f->mu */
static rt_flight_entry *slot(rt_flight *f, uint64_t id) {
    if (!f->cap || id == 0) return NULL;
    rt_flight_entry *e = &f->e[(id - 1) % f->cap];
    return e->id == id ? e : NULL;
}

uint64_t rt_flight_begin(rt_flight *f, int kind, bool is_send, rt_dtype dtype, size_t count, int peer,
                         const char *algo) {
    if (!f || !f->cap) return 0;
    uint64_t t = since(f);
    pthread_mutex_lock(&f->mu);
    uint64_t id = f->next_id++;
    f->e[(id - 1) % f->cap] = (rt_flight_entry){.id = id,
                                                .kind = kind,
                                                .is_send = is_send,
                                                .dtype = dtype,
                                                .count = count,
                                                .peer = peer,
                                                .algo = algo,
                                                .state = RT_FLIGHT_QUEUED,
                                                .t_queued = t};
    pthread_mutex_unlock(&f->mu);
    return id;
}

void rt_flight_set_seq(rt_flight *f, uint64_t id, uint32_t seq) {
    if (!f || !f->cap || !id) return;
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e) e->seq = seq;
    pthread_mutex_unlock(&f->mu);
}

void rt_flight_started(rt_flight *f, uint64_t id) {
    if (!f || !f->cap || !id) return;
    uint64_t t = since(f);
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e && e->state == RT_FLIGHT_QUEUED) {
        e->state = RT_FLIGHT_STARTED;
        e->t_started = t;
    }
    pthread_mutex_unlock(&f->mu);
}

void rt_flight_end(rt_flight *f, uint64_t id, bool ok) {
    if (!f || !f->cap || !id) return;
    uint64_t t = since(f);
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e && e->state != RT_FLIGHT_DONE && e->state != RT_FLIGHT_FAILED) {
        if (!e->t_started) e->t_started = t;
        e->state = ok ? RT_FLIGHT_DONE : RT_FLIGHT_FAILED;
        e->t_done = t;
    }
    pthread_mutex_unlock(&f->mu);
}

static json_t *ms_or_null(uint64_t ns) { return ns ? json_real((double)ns * 1e-6) : json_null(); }

rt_status rt_flight_dump(rt_flight *f, int rank, int world, int group, const char *path) {
    RT_REQUIRE(f != NULL && path != NULL, RT_ERR_INVALID, "flight recorder dump: NULL argument");
    /* a snapshot under the lock, JSON outside it */
    uint32_t cap = f->cap;
    rt_flight_entry *snap = NULL;
    uint64_t next = 1;
    if (cap) {
        snap = malloc((size_t)cap * sizeof *snap);
        RT_CHECK_ALLOC(snap, (size_t)cap * sizeof *snap);
    }
    pthread_mutex_lock(&f->mu);
    if (cap) memcpy(snap, f->e, (size_t)cap * sizeof *snap);
    next = f->next_id;
    pthread_mutex_unlock(&f->mu);

    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "rank", json_integer(rank));
    json_object_set_new(root, "world_size", json_integer(world));
    json_object_set_new(root, "group", json_integer(group));
    json_object_set_new(root, "capacity", json_integer(cap));
    json_object_set_new(root, "recorded", json_integer((json_int_t)(next - 1)));
    json_object_set_new(root, "wall_clock_at_t0_ms", json_real((double)f->t0_wall_ns * 1e-6));
    json_object_set_new(root, "dumped_at_ms", json_real((double)since(f) * 1e-6));
    uint64_t first = next - 1 > cap ? next - cap : 1;
    for (uint64_t id = first; id < next && cap; id++) {
        const rt_flight_entry *e = &snap[(id - 1) % cap];
        if (e->id != id) continue;
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer((json_int_t)e->id));
        json_object_set_new(o, "seq", json_integer(e->seq));
        json_object_set_new(o, "op", json_string(rt_comm_op_name(e->kind, e->is_send)));
        json_object_set_new(o, "dtype", json_string(rt_dtype_name(e->dtype)));
        json_object_set_new(o, "count", json_integer((json_int_t)e->count));
        json_object_set_new(o, "peer", json_integer(e->peer));
        json_object_set_new(o, "algo", json_string(e->algo ? e->algo : "?"));
        json_object_set_new(o, "state", json_string(k_states[e->state]));
        json_object_set_new(o, "t_queued_ms", ms_or_null(e->t_queued));
        json_object_set_new(o, "t_started_ms", ms_or_null(e->t_started));
        json_object_set_new(o, "t_done_ms", ms_or_null(e->t_done));
        json_array_append_new(arr, o);
    }
    free(snap);
    json_object_set_new(root, "entries", arr);
    /* written whole under a temporary name, then renamed: a reader never sees half a file */
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    if (!tmp) {
        json_decref(root);
        RT_CHECK_ALLOC(NULL, n);
    }
    snprintf(tmp, n, "%s.tmp", path);
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(12));
    json_decref(root);
    if (rc != 0) {
        free(tmp);
        return RT_ERROR(RT_ERR_IO, "flight recorder: cannot write %s", path);
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        remove(tmp);
        free(tmp);
        return RT_ERROR(RT_ERR_IO, "flight recorder: rename to %s: %s", path, strerror(err));
    }
    free(tmp);
    return RT_OK;
}
