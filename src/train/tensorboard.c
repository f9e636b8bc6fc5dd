/* TensorBoard event file (tensorboard.h). The Event messages are encoded and decoded by
 * protobuf-c from tb_event.proto (a subset of TensorBoard's event.proto and summary.proto);
 * the record framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
 * data) is TensorBoard's record_writer.py, written here. One record per step and per
 * evaluation, each written with one fwrite and flushed: a kill -9 leaves complete records
 * and at most one cut short at the end, which TensorBoard's reader and rt_tb_cut stop at. */
#include "train/tensorboard.h"

#include "train/tb_event.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { TB_PATH_MAX = 4096, TB_MAX_SCALARS = 16, TB_HEAD = 12, TB_FOOT = 4 };

struct rt_tb {
    FILE *f;
    char path[TB_PATH_MAX];
    int64_t eval_kept; /* the step of an evaluation the file kept through a resume, else -1 */
};

/* ---- CRC-32C and the record framing ----------------------------------------------------- */

uint32_t rt_tb_crc32c(const void *p, size_t n) {
    const uint8_t *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= b[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u))); /* reflected Castagnoli */
    }
    return ~c;
}

uint32_t rt_tb_masked_crc(const void *p, size_t n) {
    uint32_t c = rt_tb_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The record of `n` bytes of `data`, framed, into `out` (n + 16 bytes). */
static void frame_record(uint8_t *out, const uint8_t *data, size_t n) {
    put_le(out, n, 8);
    put_le(out + 8, rt_tb_masked_crc(out, 8), 4);
    memcpy(out + TB_HEAD, data, n);
    put_le(out + TB_HEAD + n, rt_tb_masked_crc(data, n), 4);
}

/* The next complete record of f into *buf (grown as needed), its data at *buf + 12 and
 * *n bytes long: false at the end, at a record cut short, or at a wrong CRC. */
static bool read_record(FILE *f, uint8_t **buf, size_t *cap, size_t *n) {
    uint8_t head[TB_HEAD];
    if (fread(head, 1, TB_HEAD, f) != TB_HEAD) return false;
    uint64_t len = get_le(head, 8);
    if ((uint32_t)get_le(head + 8, 4) != rt_tb_masked_crc(head, 8) || len > ((uint64_t)1 << 30)) return false;
    size_t total = TB_HEAD + (size_t)len + TB_FOOT;
    if (total > *cap) {
        uint8_t *b = realloc(*buf, total);
        if (!b) return false;
        *buf = b;
        *cap = total;
    }
    memcpy(*buf, head, TB_HEAD);
    if (fread(*buf + TB_HEAD, 1, (size_t)len + TB_FOOT, f) != (size_t)len + TB_FOOT) return false;
    if ((uint32_t)get_le(*buf + TB_HEAD + len, 4) != rt_tb_masked_crc(*buf + TB_HEAD, (size_t)len)) return false;
    *n = (size_t)len;
    return true;
}

/* ---- writing ------------------------------------------------------------------------------ */

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Event `ev` (its wall time set here) as one record, appended and flushed. */
static rt_status write_event(rt_tb *t, Tensorboard__Event *ev) {
    ev->wall_time = wall_time();
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *data = malloc(n + TB_HEAD + TB_FOOT), *rec = malloc(n + TB_HEAD + TB_FOOT);
    if (!data || !rec) {
        free(data);
        free(rec);
        return RT_ERROR(RT_ERR_NOMEM, "%s: a record of %zu bytes", t->path, n);
    }
    tensorboard__event__pack(ev, data);
    frame_record(rec, data, n);
    size_t wrote = fwrite(rec, 1, n + TB_HEAD + TB_FOOT, t->f);
    free(data);
    free(rec);
    if (wrote != n + TB_HEAD + TB_FOOT || fflush(t->f) != 0)
        return RT_ERROR(RT_ERR_IO, "%s: %s", t->path, strerror(errno ? errno : EIO));
    return RT_OK;
}

rt_status rt_tb_scalars(rt_tb *t, int64_t step, size_t n, const char *const *tags, const float *values) {
    RT_REQUIRE(n <= TB_MAX_SCALARS, RT_ERR_INVALID, "%s: %zu scalars in one event (at most %d)", t->path, n,
               TB_MAX_SCALARS);
    Tensorboard__Summary__Value vals[TB_MAX_SCALARS], *ptrs[TB_MAX_SCALARS];
    for (size_t i = 0; i < n; i++) {
        vals[i] = (Tensorboard__Summary__Value)TENSORBOARD__SUMMARY__VALUE__INIT;
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = values[i];
        ptrs[i] = &vals[i];
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(t, &ev);
}

rt_status rt_tb_step(rt_tb *t, const rt_step_record *r) {
    static const char *const stage_tags[RT_STAGE_COUNT_] = {"time/data_ms",     "time/h2d_ms",  "time/forward_ms",
                                                            "time/backward_ms", "time/comm_ms", "time/optim_ms",
                                                            "time/step_ms"};
    const char *tags[TB_MAX_SCALARS] = {"train/loss", "train/lr", "train/images_per_s", "time/comm_busy_ms"};
    float v[TB_MAX_SCALARS] = {(float)r->loss, (float)r->lr, (float)r->images_per_s, (float)r->comm_busy_ms};
    size_t n = 4;
    for (int s = 0; s < RT_STAGE_COUNT_; s++, n++) {
        tags[n] = stage_tags[s];
        v[n] = (float)r->ms[s];
    }
    if (isfinite(r->grad_norm)) { /* NaN: not computed this run */
        tags[n] = "train/grad_norm";
        v[n++] = (float)r->grad_norm;
    }
    return rt_tb_scalars(t, r->step, n, tags, v);
}

rt_status rt_tb_eval(rt_tb *t, const rt_eval_record *e) {
    if (e->step == t->eval_kept) return RT_OK;
    const char *tags[4] = {"test/loss", "test/accuracy", "val/loss", "val/accuracy"};
    float v[4] = {(float)e->loss, (float)e->accuracy, (float)e->val_loss, (float)e->val_accuracy};
    return rt_tb_scalars(t, e->step, e->val_samples > 0 ? 4 : 2, tags, v);
}

/* ---- cutting back (a resume) ---------------------------------------------------------------- */

/* fflush, fsync and fclose f (written to `path`), each checked */
static rt_status close_synced(FILE *f, const char *path) {
    int e = 0;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) e = errno ? errno : EIO;
    if (fclose(f) != 0 && !e) e = errno;
    RT_REQUIRE(!e, RT_ERR_IO, "writing %s: %s", path, strerror(e));
    return RT_OK;
}

/* Record data[0, n) of an Event: its step, and whether it is an evaluation's (a "test/" tag).
 * false: not an Event protobuf_c can read (the cut ends there, as at a wrong CRC). */
static bool event_step(const uint8_t *data, size_t n, int64_t *step, bool *eval) {
    Tensorboard__Event *ev = tensorboard__event__unpack(NULL, n, data);
    if (!ev) return false;
    *step = ev->step;
    *eval = false;
    if (ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev->summary)
        for (size_t i = 0; i < ev->summary->n_value; i++)
            if (ev->summary->value[i]->tag && strncmp(ev->summary->value[i]->tag, "test/", 5) == 0) *eval = true;
    tensorboard__event__free_unpacked(ev, NULL);
    return true;
}

/* The records of f in order into `keep` while their step is <= `step`, the rest into `mv`
 * (NULL: dropped); *eval_kept as for rt_tb_cut. The version record (step 0) is kept. */
static void split_records(FILE *f, int64_t step, FILE *keep, FILE *mv, bool *eval_kept) {
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;
    bool past = false; /* in time order: after the first record past `step`, all are of the cut-off trajectory */
    while (read_record(f, &buf, &cap, &n)) {
        int64_t s;
        bool eval;
        if (!event_step(buf + TB_HEAD, n, &s, &eval)) break;
        if (s > step) past = true;
        if (!past && eval && s == step) *eval_kept = true;
        FILE *to = past ? mv : keep;
        if (to) fwrite(buf, 1, TB_HEAD + n + TB_FOOT, to);
    }
    free(buf);
}

/* fsync the folder of `path` (a rename in it is then durable) */
static rt_status fsync_dir_of(const char *path) {
    char dir[TB_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    RT_REQUIRE(fd >= 0, RT_ERR_IO, "cannot open %s to fsync it: %s", dir, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    RT_REQUIRE(rc == 0, RT_ERR_IO, "fsync %s: %s", dir, strerror(e));
    return RT_OK;
}

rt_status rt_tb_cut(const char *path, int64_t step, const char *moved, bool *eval_kept) {
    bool kept = false;
    if (eval_kept) *eval_kept = false;
    FILE *f = fopen(path, "rb");
    if (!f) return RT_OK; /* nothing written yet */
    char tmp[TB_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *o = fopen(tmp, "wb"), *mv = o && moved ? fopen(moved, "wb") : NULL;
    if (!o || (moved && !mv)) {
        int e = errno;
        fclose(f);
        if (o) fclose(o);
        return RT_ERROR(RT_ERR_IO, "%s: %s", o ? moved : tmp, strerror(e));
    }
    split_records(f, step, o, mv, &kept);
    bool read_err = ferror(f);
    fclose(f);
    rt_status st = mv ? close_synced(mv, moved) : RT_OK;
    rt_status st2 = close_synced(o, tmp);
    if (st == RT_OK) st = st2;
    if (st == RT_OK && read_err) st = RT_ERROR(RT_ERR_IO, "reading %s: %s", path, strerror(errno));
    if (st != RT_OK) {
        unlink(tmp);
        return st;
    }
    RT_REQUIRE(rename(tmp, path) == 0, RT_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    if (eval_kept) *eval_kept = kept;
    return fsync_dir_of(path);
}

/* ---- opening ----------------------------------------------------------------------------- */

/* The newest event file of `dir` (names start with the time, so the largest name) into
 * `newest` (empty if none); each one cut back to `resume_step` (>= 0) or removed (< 0). */
static rt_status each_event_file(const char *dir, int64_t resume_step, char *newest, size_t cap, bool *eval_kept) {
    newest[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return RT_OK;
    char(*names)[256] = NULL;
    size_t count = 0;
    struct dirent *e;
    rt_status st = RT_OK;
    while (st == RT_OK && (e = readdir(d)) != NULL) { /* the names first: a cut renames over them */
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, RT_TB_PREFIX, strlen(RT_TB_PREFIX)) != 0 || l >= 256 || strstr(e->d_name, ".tmp"))
            continue;
        void *grown = realloc(names, (count + 1) * sizeof *names);
        if (!grown) st = RT_ERROR(RT_ERR_NOMEM, "listing the event files of %s", dir);
        if (grown) names = grown;
        if (grown) memcpy(names[count++], e->d_name, l + 1);
    }
    closedir(d);
    for (size_t i = 0; i < count && st == RT_OK; i++) {
        char path[TB_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        bool kept = false;
        if (resume_step >= 0)
            st = rt_tb_cut(path, resume_step, NULL, &kept);
        else if (unlink(path) != 0)
            st = RT_ERROR(RT_ERR_IO, "removing the previous run's %s: %s", path, strerror(errno));
        if (st == RT_OK && resume_step >= 0 && strcmp(names[i], newest) > 0) {
            snprintf(newest, cap, "%s", names[i]);
            *eval_kept = kept;
        }
    }
    free(names);
    return st;
}

/* A new event file in `dir`, with its version record. */
static rt_status start_file(rt_tb *t, const char *dir) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '/') *p = '_';
    snprintf(t->path, sizeof t->path, "%s/" RT_TB_PREFIX "%010lld.%s", dir, (long long)time(NULL), host);
    t->f = fopen(t->path, "wb");
    RT_REQUIRE(t->f, RT_ERR_IO, "%s: %s", t->path, strerror(errno));
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    return write_event(t, &ev);
}

rt_status rt_tb_open(const char *dir, int64_t resume_step, rt_tb **out) {
    rt_tb *t = calloc(1, sizeof *t);
    RT_CHECK_ALLOC(t, sizeof *t);
    t->eval_kept = -1;
    char newest[256];
    bool kept = false;
    rt_status st = each_event_file(dir, resume_step, newest, sizeof newest, &kept);
    if (st == RT_OK && newest[0]) {
        snprintf(t->path, sizeof t->path, "%s/%s", dir, newest);
        t->f = fopen(t->path, "ab");
        if (!t->f) st = RT_ERROR(RT_ERR_IO, "%s: %s", t->path, strerror(errno));
        if (kept) t->eval_kept = resume_step;
    } else if (st == RT_OK) {
        st = start_file(t, dir);
    }
    if (st != RT_OK) {
        rt_tb_close(t);
        return st;
    }
    *out = t;
    return RT_OK;
}

void rt_tb_close(rt_tb *t) {
    if (!t) return;
    if (t->f) fclose(t->f);
    free(t);
}

const char *rt_tb_path(const rt_tb *t) { return t->path; }
