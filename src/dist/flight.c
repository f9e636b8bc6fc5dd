/* The flight recorder (internal/flight.h). */
#include "dist/internal/flight.h"
#include "dist/internal/names.h"

#include "core/timer.h"
#include "dist/reduce.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

uint64_t rt_flight_begin(rt_flight *f, int kind, bool is_send, rt_dtype dtype, size_t count, int peer, int rop,
                         const char *algo, const char *tag) {
    if (!f || !f->cap) return 0;
    uint64_t t = since(f);
    pthread_mutex_lock(&f->mu);
    uint64_t id = f->next_id++;
    rt_flight_entry *e = &f->e[(id - 1) % f->cap];
    *e = (rt_flight_entry){.id = id,
                           .kind = kind,
                           .is_send = is_send,
                           .dtype = dtype,
                           .count = count,
                           .peer = peer,
                           .rop = rop,
                           .algo = algo,
                           .state = RT_FLIGHT_QUEUED,
                           .t_queued = t};
    if (tag) snprintf(e->tag, sizeof e->tag, "%s", tag);
    pthread_mutex_unlock(&f->mu);
    return id;
}

static void fp_of_entry(const rt_flight_entry *e, rt_flight_fp *fp);

/* under f->mu */
static void cell_put(rt_flight *f, rt_flight_fp *dst, const rt_flight_entry *e) {
    __atomic_add_fetch(&f->cell->gen, 1, __ATOMIC_SEQ_CST);
    fp_of_entry(e, dst);
    __atomic_add_fetch(&f->cell->gen, 1, __ATOMIC_SEQ_CST);
}

bool rt_flight_cell_read(const volatile rt_flight_cell *c, rt_flight_cell *out) {
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t g0 = __atomic_load_n(&c->gen, __ATOMIC_SEQ_CST);
        if (g0 & 1) continue;
        memcpy(out, (const void *)c, sizeof *out);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&c->gen, __ATOMIC_SEQ_CST) == g0) return out->magic == RT_FLIGHT_CELL_MAGIC;
    }
    return false;
}

void rt_flight_set_seq(rt_flight *f, uint64_t id, uint32_t seq) {
    if (!f || !f->cap || !id) return;
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e) e->seq = seq;
    if (e && f->cell && e->kind != RT_K_P2P) {
        rt_flight_cell *c = f->cell;
        __atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST);
        fp_of_entry(e, &c->begun[seq % RT_FLIGHT_PENDING]);
        c->t_begun_ns[seq % RT_FLIGHT_PENDING] = f->t0_ns + e->t_queued;
        c->last_begun = seq;
        __atomic_add_fetch(&c->gen, 1, __ATOMIC_SEQ_CST);
    }
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
        if (ok && f->cell && e->kind != RT_K_P2P && e->seq) cell_put(f, &f->cell->last_done, e);
    }
    pthread_mutex_unlock(&f->mu);
}

uint64_t rt_flight_last_allreduce(rt_flight *f, size_t count) {
    if (!f || !f->cap) return 0;
    pthread_mutex_lock(&f->mu);
    uint64_t id = f->next_id - 1;
    const rt_flight_entry *e = id ? &f->e[(id - 1) % f->cap] : NULL;
    bool ok = e && e->id == id && e->kind == RT_K_ALLREDUCE && e->count == count;
    pthread_mutex_unlock(&f->mu);
    return ok ? id : 0;
}

bool rt_flight_end_of(rt_flight *f, uint64_t id, uint64_t *done_ns, const char **algo) {
    *done_ns = 0;
    *algo = NULL;
    if (!f || !f->cap || !id) return false;
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e) {
        if (e->t_done) *done_ns = f->t0_ns + e->t_done;
        *algo = e->algo;
    }
    pthread_mutex_unlock(&f->mu);
    return e != NULL;
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
        if (e->rop >= 0) json_object_set_new(o, "reduce_op", json_string(rt_reduce_op_name((rt_reduce_op)e->rop)));
        if (e->tag[0]) json_object_set_new(o, "tag", json_string(e->tag));
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

/* ---- hangs and desyncs ---- */

static void fp_of_entry(const rt_flight_entry *e, rt_flight_fp *fp) {
    *fp = (rt_flight_fp){
        .seq = e->seq, .kind = e->kind, .rop = e->rop, .dtype = (int)e->dtype, .root = e->peer, .count = e->count};
    memcpy(fp->tag, e->tag, sizeof fp->tag);
}

bool rt_flight_fp_of(rt_flight *f, uint64_t id, rt_flight_fp *out) {
    memset(out, 0, sizeof *out);
    if (!f || !f->cap || !id) return false;
    pthread_mutex_lock(&f->mu);
    rt_flight_entry *e = slot(f, id);
    if (e) fp_of_entry(e, out);
    pthread_mutex_unlock(&f->mu);
    return e != NULL;
}

void rt_flight_get_state(rt_flight *f, rt_flight_state_rec *out) {
    memset(out, 0, sizeof *out);
    out->present = true;
    if (!f || !f->cap) return;
    uint64_t now = since(f);
    pthread_mutex_lock(&f->mu);
    uint64_t next = f->next_id, first = next - 1 > f->cap ? next - f->cap : 1;
    for (uint64_t id = first; id < next; id++) { /* oldest first */
        const rt_flight_entry *e = &f->e[(id - 1) % f->cap];
        if (e->id != id || e->kind == RT_K_P2P) continue;
        if (e->state == RT_FLIGHT_QUEUED || e->state == RT_FLIGHT_STARTED) {
            if (out->npending == 0) out->wait_s = (double)(now - e->t_queued) * 1e-9;
            if (out->npending < RT_FLIGHT_PENDING) fp_of_entry(e, &out->pending[out->npending++]);
        } else if (e->state == RT_FLIGHT_DONE) {
            fp_of_entry(e, &out->last_done);
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static void tag_clean(char *t) {
    for (; *t; t++)
        if (*t == '\n' || *t == '\r') *t = ' ';
}

int rt_flight_fp_format(const rt_flight_fp *fp, char *buf, size_t n) {
    char tag[RT_FLIGHT_TAG];
    memcpy(tag, fp->tag, sizeof tag);
    tag[sizeof tag - 1] = '\0';
    tag_clean(tag);
    return snprintf(buf, n, "%u %d %d %d %d %llu\n%s", fp->seq, fp->kind, fp->rop, fp->dtype, fp->root,
                    (unsigned long long)fp->count, tag);
}

static bool fp_fields(const char *s, rt_flight_fp *fp, int *used) {
    unsigned long long count = 0;
    unsigned seq = 0;
    if (sscanf(s, "%u %d %d %d %d %llu%n", &seq, &fp->kind, &fp->rop, &fp->dtype, &fp->root, &count, used) != 6)
        return false;
    fp->seq = seq;
    fp->count = count;
    return true;
}

static void tag_line(const char *s, char *tag) {
    size_t l = strcspn(s, "\n");
    if (l >= RT_FLIGHT_TAG) l = RT_FLIGHT_TAG - 1;
    memcpy(tag, s, l);
    tag[l] = '\0';
}

bool rt_flight_fp_parse(const char *s, rt_flight_fp *out) {
    memset(out, 0, sizeof *out);
    int used = 0;
    if (!fp_fields(s, out, &used) || s[used] != '\n') return false;
    tag_line(s + used + 1, out->tag);
    return true;
}

int rt_flight_state_format(const rt_flight_state_rec *s, char *buf, size_t n) {
    int l = snprintf(buf, n, "%.3f %d\n", s->wait_s, s->npending);
    const rt_flight_fp *fps[1 + RT_FLIGHT_PENDING] = {&s->last_done};
    for (int i = 0; i < s->npending && i < RT_FLIGHT_PENDING; i++) fps[1 + i] = &s->pending[i];
    for (int i = 0; i < 1 + s->npending && i <= RT_FLIGHT_PENDING && l >= 0 && (size_t)l < n; i++) {
        l += rt_flight_fp_format(fps[i], buf + l, n - (size_t)l);
        if ((size_t)l < n - 1) buf[l++] = '\n', buf[l] = '\0';
    }
    return l < (int)n ? l : (int)n - 1;
}

/* the fingerprint at s (two lines); the text after it, or NULL */
static const char *fp_next(const char *s, rt_flight_fp *fp) {
    memset(fp, 0, sizeof *fp);
    int used = 0;
    if (!fp_fields(s, fp, &used) || s[used] != '\n') return NULL;
    const char *t = s + used + 1;
    tag_line(t, fp->tag);
    const char *nl = strchr(t, '\n');
    return nl ? nl + 1 : t + strlen(t);
}

bool rt_flight_state_parse(const char *s, rt_flight_state_rec *out) {
    memset(out, 0, sizeof *out);
    int used = 0, np = 0;
    if (sscanf(s, "%lf %d%n", &out->wait_s, &np, &used) != 2 || s[used] != '\n') return false;
    if (np < 0 || np > RT_FLIGHT_PENDING) return false;
    const char *t = fp_next(s + used + 1, &out->last_done);
    for (int i = 0; i < np && t; i++) t = fp_next(t, &out->pending[i]);
    if (!t) return false;
    out->npending = np;
    out->present = true;
    return true;
}

bool rt_flight_fp_differ(const rt_flight_fp *a, const rt_flight_fp *b) {
    return a->seq != b->seq || a->kind != b->kind || a->rop != b->rop || a->dtype != b->dtype || a->root != b->root ||
           a->count != b->count;
}

static void human_bytes(double b, char *buf, size_t n) {
    if (b >= 1e9)
        snprintf(buf, n, "%.1f GB", b * 1e-9);
    else if (b >= 1e6)
        snprintf(buf, n, "%.1f MB", b * 1e-6);
    else if (b >= 1e3)
        snprintf(buf, n, "%.1f kB", b * 1e-3);
    else
        snprintf(buf, n, "%.0f B", b);
}

void rt_flight_fp_describe(const rt_flight_fp *fp, char *buf, size_t n) {
    const char *op = rt_comm_kind_name(fp->kind);
    if (fp->kind == RT_K_BARRIER || fp->kind <= RT_K_NONE_ || fp->kind >= RT_K_COUNT_) {
        snprintf(buf, n, "%s #%u%s%s%s", op, fp->seq, fp->tag[0] ? " (" : "", fp->tag, fp->tag[0] ? ")" : "");
        return;
    }
    char size[32], extra[48] = "";
    size_t es = (unsigned)fp->dtype < RT_DTYPE_COUNT_ ? rt_dtype_size((rt_dtype)fp->dtype) : 0;
    human_bytes((double)fp->count * (double)es, size, sizeof size);
    size_t el = 0;
    if (fp->rop >= 0 && fp->rop < RT_OP_COUNT_)
        el += (size_t)snprintf(extra + el, sizeof extra - el, ", %s", rt_reduce_op_name((rt_reduce_op)fp->rop));
    if (fp->kind == RT_K_BCAST || fp->kind == RT_K_REDUCE || fp->kind == RT_K_SCATTER || fp->kind == RT_K_GATHER)
        snprintf(extra + el, sizeof extra - el, ", root %d", fp->root);
    snprintf(buf, n, "%s #%u (%s x %llu, %s%s%s%s)", op, fp->seq,
             (unsigned)fp->dtype < RT_DTYPE_COUNT_ ? rt_dtype_name((rt_dtype)fp->dtype) : "?",
             (unsigned long long)fp->count, size, extra, fp->tag[0] ? ", " : "", fp->tag);
}

/* "0,1,3" */
static void rank_list(const int *r, int k, char *buf, size_t n) {
    size_t l = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && l + 12 < n; i++) l += (size_t)snprintf(buf + l, n - l, "%s%d", i ? "," : "", r[i]);
}

/* rank k's pending fingerprint at seq, or NULL */
static const rt_flight_fp *pending_at(const rt_flight_state_rec *r, uint32_t seq) {
    if (!r->present) return NULL;
    for (int i = 0; i < r->npending; i++)
        if (r->pending[i].seq == seq) return &r->pending[i];
    return NULL;
}

int rt_flight_diagnose(const rt_flight_state_rec *rec, int n, char *out, size_t len) {
    out[0] = '\0';
    if (n <= 0 || len == 0) return 0;
    /* a desync: two ranks are in different calls at one sequence number */
    for (int i = 0; i < n; i++) {
        if (!rec[i].present) continue;
        for (int pi = 0; pi < rec[i].npending; pi++) {
            const rt_flight_fp *fi = &rec[i].pending[pi];
            for (int j = 0; j < n; j++) {
                const rt_flight_fp *fj = j == i ? NULL : pending_at(&rec[j], fi->seq);
                if (!fj || !rt_flight_fp_differ(fi, fj)) continue;
                /* the ranks that agree with i, and those that agree with j */
                int a[256], b[256], na = 0, nb = 0;
                for (int k = 0; k < n; k++) {
                    const rt_flight_fp *fk = pending_at(&rec[k], fi->seq);
                    if (!fk) continue;
                    if (!rt_flight_fp_differ(fk, fi) && na < 256) a[na++] = k;
                    if (!rt_flight_fp_differ(fk, fj) && nb < 256) b[nb++] = k;
                }
                char la[128], lb[128], da[200], db[200];
                rank_list(a, na, la, sizeof la);
                rank_list(b, nb, lb, sizeof lb);
                rt_flight_fp_describe(fi, da, sizeof da);
                rt_flight_fp_describe(fj, db, sizeof db);
                snprintf(out, len, "desync at #%u: rank%s %s called %s but rank%s %s called %s", fi->seq,
                         na > 1 ? "s" : "", la, da, nb > 1 ? "s" : "", lb, db);
                return 1;
            }
        }
    }
    /* behind: the oldest operation anyone waits in, and who has not started it */
    int w = -1;
    for (int i = 0; i < n; i++)
        if (rec[i].present && rec[i].npending && (w < 0 || rec[i].pending[0].seq < rec[w].pending[0].seq)) w = i;
    if (w < 0) return 0;
    uint32_t seq = rec[w].pending[0].seq;
    int waiting[256], behind[256], nw = 0, nbh = 0;
    double since_s = 0;
    for (int i = 0; i < n; i++) {
        bool in = pending_at(&rec[i], seq) != NULL;
        bool past = rec[i].present && rec[i].last_done.seq >= seq;
        if (in) {
            if (nw < 256) waiting[nw++] = i;
            if (rec[i].wait_s > since_s) since_s = rec[i].wait_s;
        } else if (!past && nbh < 256) {
            behind[nbh++] = i;
        }
    }
    if (nbh == 0) return 0;
    char lw[256], lb[256], what[200];
    rank_list(waiting, nw, lw, sizeof lw);
    rank_list(behind, nbh, lb, sizeof lb);
    rt_flight_fp_describe(&rec[w].pending[0], what, sizeof what);
    /* a rank known (its shared page) to have begun it is stuck inside, not behind */
    bool inside = nbh == 1 && rec[behind[0]].from_cell && rec[behind[0]].begun.seq >= seq;
    size_t l =
        (size_t)snprintf(out, len, "rank%s %s %s %s; rank%s %s wait%s in it since %.1f s", nbh > 1 ? "s" : "", lb,
                         inside    ? "began but has not completed"
                         : nbh > 1 ? "have not started"
                                   : "has not started",
                         what, nw > 1 ? "s" : "", lw, nw > 1 ? "" : "s", since_s);
    for (int k = 0; k < nbh && l < len; k++) {
        const rt_flight_state_rec *b = &rec[behind[k]];
        if (b->last_done.seq) {
            char d[200];
            rt_flight_fp_describe(&b->last_done, d, sizeof d);
            l += (size_t)snprintf(out + l, len - l, "; rank %d's last completed: %s", behind[k], d);
        }
        if (!b->present && l < len)
            l += (size_t)snprintf(out + l, len - l, "; rank %d published nothing (%s)", behind[k],
                                  b->from_cell ? "stopped or hung outside the communicator: read from its shared "
                                                 "recorder page"
                                               : "stopped, hung outside the communicator, or dead");
        if (b->present && b->npending && b->pending[0].seq > seq && l < len)
            l += (size_t)snprintf(out + l, len - l, "; rank %d waits in #%u", behind[k], b->pending[0].seq);
    }
    return 2;
}

int rt_flight_cell_open(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    char self[64], link[256];
    /* the name of what was opened (not of the path again: its pid may be reused meanwhile) */
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(self, link, sizeof link - 1);
    if (n >= 0) link[n] = '\0';
    static const char want[] = "/memfd:" RT_FLIGHT_CELL_NAME;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < RT_FLIGHT_CELL_BYTES || n < 0 ||
        strncmp(link, want, sizeof want - 1) != 0 || (link[sizeof want - 1] != '\0' && link[sizeof want - 1] != ' ')) {
        close(fd);
        return -1;
    }
    return fd;
}
