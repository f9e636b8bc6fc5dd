/* Reading a traced run back (trace_merge.h). */
#include "train/trace_merge.h"

#include "core/trace.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static rt_status add_rec(rt_trace_rank *r, const rt_trace_rec *x) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        rt_trace_rec *s = realloc(r->s, cap * sizeof *s);
        RT_CHECK_ALLOC(s, cap * sizeof *s);
        r->s = s;
        r->cap = cap;
    }
    r->s[r->n++] = *x;
    return RT_OK;
}

/* an integer field (required unless `opt`): RT_ERR_FORMAT naming file, line and field */
static rt_status get_int(json_t *o, const char *key, bool opt, int64_t *v, const char *path, long line) {
    json_t *f = json_object_get(o, key);
    if (!f && opt) return RT_OK;
    RT_REQUIRE(f && json_is_integer(f), RT_ERR_FORMAT, "%s:%ld: field \"%s\": %s (expected an integer)", path, line,
               key, f ? "not an integer" : "missing");
    *v = (int64_t)json_integer_value(f);
    return RT_OK;
}

static rt_status get_str(json_t *o, const char *key, bool opt, char *out, size_t n, const char *path, long line) {
    json_t *f = json_object_get(o, key);
    if (!f && opt) return RT_OK;
    RT_REQUIRE(f && json_is_string(f), RT_ERR_FORMAT, "%s:%ld: field \"%s\": %s (expected a string)", path, line, key,
               f ? "not a string" : "missing");
    snprintf(out, n, "%s", json_string_value(f));
    return RT_OK;
}

static rt_status parse_header(json_t *o, rt_trace_rank *r, int want_rank, int *world, const char *path) {
    json_t *k = json_object_get(o, "kind");
    RT_REQUIRE(k && json_is_string(k) && strcmp(json_string_value(k), "header") == 0, RT_ERR_FORMAT,
               "%s:1: not a trace header (expected {\"kind\": \"header\", ...} on the first line)", path);
    int64_t rank = -1, ws = 0, version = 0;
    RT_CHECK(get_int(o, "version", false, &version, path, 1));
    RT_REQUIRE(version == 1, RT_ERR_FORMAT, "%s:1: trace format version %lld (this ringtrain reads version 1)", path,
               (long long)version);
    RT_CHECK(get_int(o, "rank", false, &rank, path, 1));
    RT_CHECK(get_int(o, "world_size", false, &ws, path, 1));
    RT_CHECK(get_int(o, "offset_ns", false, &r->offset_ns, path, 1));
    RT_CHECK(get_int(o, "offset_error_ns", false, &r->error_ns, path, 1));
    RT_CHECK(get_int(o, "rtt_ns", true, &r->rtt_ns, path, 1));
    RT_CHECK(get_str(o, "host", true, r->host, sizeof r->host, path, 1));
    RT_REQUIRE(rank == want_rank, RT_ERR_FORMAT, "%s:1: field \"rank\": %lld (expected %d, as the file name says)",
               path, (long long)rank, want_rank);
    RT_REQUIRE(ws >= 1 && ws <= 65536 && want_rank < ws, RT_ERR_FORMAT,
               "%s:1: field \"world_size\": %lld (expected 1..65536, more than the rank %d)", path, (long long)ws,
               want_rank);
    if (*world == 0) *world = (int)ws;
    RT_REQUIRE(ws == *world, RT_ERR_FORMAT, "%s:1: field \"world_size\": %lld, but trace-rank0.jsonl says %d", path,
               (long long)ws, *world);
    r->rank = want_rank;
    return RT_OK;
}

static rt_status parse_span(json_t *o, rt_trace_rank *r, const char *path, long line) {
    rt_trace_rec x = {.bucket = -1};
    int64_t track = 0, t0 = 0, t1 = 0, bucket = -1;
    RT_CHECK(get_str(o, "name", false, x.name, sizeof x.name, path, line));
    RT_CHECK(get_int(o, "track", false, &track, path, line));
    RT_REQUIRE(track >= 0 && track < RT_TRACK_COUNT_, RT_ERR_FORMAT,
               "%s:%ld: field \"track\": %lld (expected 0 main, 1 comm or 2 stream)", path, line, (long long)track);
    RT_CHECK(get_int(o, "t0", false, &t0, path, line));
    RT_CHECK(get_int(o, "t1", false, &t1, path, line));
    RT_REQUIRE(t0 > 0 && t1 >= t0, RT_ERR_FORMAT, "%s:%ld: fields \"t0\" %lld, \"t1\" %lld (expected 0 < t0 <= t1)",
               path, line, (long long)t0, (long long)t1);
    RT_CHECK(get_int(o, "step", false, &x.step, path, line));
    RT_CHECK(get_int(o, "epoch", false, &x.epoch, path, line));
    x.comm = json_object_get(o, "bytes") != NULL;
    RT_CHECK(get_int(o, "bucket", true, &bucket, path, line));
    RT_CHECK(get_int(o, "bytes", true, &x.bytes, path, line));
    RT_CHECK(get_int(o, "queued_ns", true, &x.queued_ns, path, line));
    RT_CHECK(get_str(o, "algo", true, x.algo, sizeof x.algo, path, line));
    x.track = (int)track;
    x.bucket = (int)bucket;
    x.t0 = t0 + r->offset_ns;
    x.t1 = t1 + r->offset_ns;
    return add_rec(r, &x);
}

/* rank `rank`'s file; *world from rank 0's header (0: not known yet) */
static rt_status load_rank(const char *dir, int rank, int *world, rt_trace_rank *r) {
    snprintf(r->path, sizeof r->path, "%s/trace-rank%d.jsonl", dir, rank);
    FILE *f = fopen(r->path, "r");
    if (!f) {
        if (rank > 0)
            return RT_ERROR(RT_ERR_IO, "%s: %s (the header of trace-rank0.jsonl says %d ranks traced)", r->path,
                            strerror(errno), *world);
        return RT_ERROR(RT_ERR_IO, "%s: %s (the other ranks' files are there)", r->path, strerror(errno));
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    long line = 0;
    rt_status st = RT_OK;
    while (st == RT_OK && (len = getline(&buf, &cap, f)) > 0) {
        line++;
        if (buf[len - 1] != '\n') { /* cut short: a rank killed while writing */
            int c = fgetc(f);
            if (c == EOF) {
                r->truncated = true;
                break;
            }
            ungetc(c, f);
        }
        json_error_t je;
        json_t *o = json_loads(buf, JSON_REJECT_DUPLICATES, &je);
        if (!o || !json_is_object(o)) {
            st = RT_ERROR(RT_ERR_FORMAT, "%s:%ld: not a JSON object (%s)", r->path, line,
                          o ? "another JSON value" : je.text);
        } else if (line == 1) {
            st = parse_header(o, r, rank, world, r->path);
        } else if (!json_object_get(o, "kind")) {
            st = parse_span(o, r, r->path, line);
        } /* other kinds ("note": spans dropped, flushes when full) are informational */
        json_decref(o);
    }
    free(buf);
    fclose(f);
    if (st == RT_OK && line == 0) st = RT_ERROR(RT_ERR_FORMAT, "%s: empty (expected a trace header line)", r->path);
    return st;
}

rt_status rt_trace_load(const char *run_dir, rt_trace_run *out, bool *found) {
    memset(out, 0, sizeof *out);
    *found = false;
    DIR *d = opendir(run_dir);
    RT_REQUIRE(d, RT_ERR_IO, "%s: %s", run_dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "trace-rank", 10) == 0 && strstr(e->d_name, ".jsonl")) *found = true;
    closedir(d);
    if (!*found) return RT_OK;
    rt_trace_rank first;
    memset(&first, 0, sizeof first);
    int world = 0;
    rt_status st = load_rank(run_dir, 0, &world, &first);
    if (st != RT_OK) {
        free(first.s);
        return st;
    }
    out->ranks = calloc((size_t)world, sizeof *out->ranks);
    if (!out->ranks) {
        free(first.s);
        return RT_ERROR(RT_ERR_NOMEM, "trace: %d ranks", world);
    }
    out->world_size = world;
    out->ranks[0] = first;
    for (int r = 1; r < world && st == RT_OK; r++) st = load_rank(run_dir, r, &world, &out->ranks[r]);
    if (st != RT_OK) rt_trace_run_free(out);
    return st;
}

void rt_trace_run_free(rt_trace_run *t) {
    if (!t) return;
    for (int i = 0; i < t->world_size && t->ranks; i++) free(t->ranks[i].s);
    free(t->ranks);
    memset(t, 0, sizeof *t);
}

/* ---- Chrome trace-event JSON ---------------------------------------------------------- */

static int cmp_rec(const void *a, const void *b) {
    const rt_trace_rec *x = a, *y = b;
    if (x->track != y->track) return x->track < y->track ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1; /* the enclosing span first */
    return 0;
}

static const char *const k_thread_names[RT_TRACK_COUNT_] = {"main thread", "comm (progress thread)",
                                                            "GPU stream (events)"};
static const char *const k_cats[RT_TRACK_COUNT_] = {"host", "comm", "stream"};

static rt_status put(FILE *f, json_t *ev, bool *first, const char *path) {
    RT_REQUIRE(ev, RT_ERR_NOMEM, "%s: an event", path);
    if (!*first) fputs(",\n", f);
    *first = false;
    int rc = json_dumpf(ev, f, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(ev);
    RT_REQUIRE(rc == 0, RT_ERR_IO, "%s: write failed", path);
    return RT_OK;
}

rt_status rt_trace_write_chrome(const rt_trace_run *t, int64_t step_lo, int64_t step_hi, const char *path,
                                int64_t *events) {
    *events = 0;
    int64_t base = INT64_MAX;
    for (int r = 0; r < t->world_size; r++)
        for (size_t i = 0; i < t->ranks[r].n; i++)
            if (t->ranks[r].s[i].t0 < base) base = t->ranks[r].s[i].t0;
    if (base == INT64_MAX) base = 0;
    for (int r = 0; r < t->world_size; r++) qsort(t->ranks[r].s, t->ranks[r].n, sizeof *t->ranks[r].s, cmp_rec);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    RT_REQUIRE(f, RT_ERR_IO, "%s: %s", tmp, strerror(errno));
    rt_status st = RT_OK;
    bool first = true;
    fputs("{\"displayTimeUnit\": \"ms\", \"otherData\": ", f);
    json_t *other = json_pack("{s:s, s:I, s:[]}", "clock", "CLOCK_MONOTONIC of rank 0, microseconds from base_ns",
                              "base_ns", (json_int_t)base, "ranks");
    for (int r = 0; other && r < t->world_size; r++)
        json_array_append_new(json_object_get(other, "ranks"),
                              json_pack("{s:i, s:s, s:I, s:I}", "rank", r, "host", t->ranks[r].host, "offset_ns",
                                        (json_int_t)t->ranks[r].offset_ns, "offset_error_ns",
                                        (json_int_t)t->ranks[r].error_ns));
    if (!other || json_dumpf(other, f, JSON_COMPACT) != 0) st = RT_ERROR(RT_ERR_IO, "%s: write failed", tmp);
    json_decref(other);
    fputs(",\n\"traceEvents\": [\n", f);
    for (int r = 0; r < t->world_size && st == RT_OK; r++) {
        const rt_trace_rank *k = &t->ranks[r];
        char pname[128];
        snprintf(pname, sizeof pname, "rank %d (%s)", r, k->host);
        st = put(f,
                 json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "ph", "M", "name", "process_name", "pid", r, "tid", 0,
                           "args", "name", pname),
                 &first, tmp);
        if (st == RT_OK)
            st = put(f,
                     json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "ph", "M", "name", "process_sort_index", "pid", r,
                               "tid", 0, "args", "sort_index", r),
                     &first, tmp);
        bool has[RT_TRACK_COUNT_] = {false};
        for (size_t i = 0; i < k->n; i++) has[k->s[i].track] = true;
        for (int tr = 0; tr < RT_TRACK_COUNT_ && st == RT_OK; tr++)
            if (has[tr])
                st = put(f,
                         json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "ph", "M", "name", "thread_name", "pid", r, "tid",
                                   tr, "args", "name", k_thread_names[tr]),
                         &first, tmp);
        for (size_t i = 0; i < k->n && st == RT_OK; i++) {
            const rt_trace_rec *x = &k->s[i];
            if (x->step < step_lo || (step_hi >= 0 && x->step > step_hi)) continue;
            json_t *args = json_pack("{s:I, s:I}", "step", (json_int_t)x->step, "epoch", (json_int_t)x->epoch);
            if (args && x->comm) {
                json_object_set_new(args, "bucket", json_integer(x->bucket));
                json_object_set_new(args, "bytes", json_integer(x->bytes));
                json_object_set_new(args, "algo", json_string(x->algo));
                json_object_set_new(args, "queued_us", json_real((double)x->queued_ns * 1e-3));
            }
            json_t *ev = json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "ph", "X", "name", x->name, "cat",
                                   k_cats[x->track], "pid", r, "tid", x->track, "ts", (double)(x->t0 - base) * 1e-3,
                                   "dur", (double)(x->t1 - x->t0) * 1e-3, "args", args);
            st = put(f, ev, &first, tmp);
            if (st == RT_OK) ++*events;
        }
    }
    fputs("\n]}\n", f);
    if (ferror(f) | (fclose(f) != 0) && st == RT_OK) st = RT_ERROR(RT_ERR_IO, "%s: write failed", tmp);
    if (st == RT_OK && rename(tmp, path) != 0) st = RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != RT_OK) remove(tmp);
    return st;
}

/* ---- the overlap summary ---------------------------------------------------------------- */

/* The spans the summary needs, sorted by (step, kind, bucket) for binary search. */
enum { K_BWD_HOST, K_BWD_STREAM, K_BUCKET, K_SCALARS };
typedef struct key {
    int64_t step;
    int kind, bucket;
    int64_t t0, t1, start; /* start: when the rank started the collective (its arrival) */
} key;

static int cmp_key(const void *a, const void *b) {
    const key *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return (x->bucket > y->bucket) - (x->bucket < y->bucket);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* rank k's keys of `epoch` */
static rt_status keys_of(const rt_trace_rank *k, int64_t epoch, key **out, size_t *n) {
    key *v = malloc(sizeof *v * (k->n + 1));
    RT_CHECK_ALLOC(v, sizeof *v * (k->n + 1));
    size_t m = 0;
    for (size_t i = 0; i < k->n; i++) {
        const rt_trace_rec *x = &k->s[i];
        if (x->epoch != epoch) continue;
        int kind = -1;
        if (strcmp(x->name, "backward") == 0)
            kind = x->track == RT_TRACK_STREAM ? K_BWD_STREAM : K_BWD_HOST;
        else if (x->comm && x->bucket >= 0 && x->track == RT_TRACK_COMM)
            kind = K_BUCKET;
        else if (strcmp(x->name, "scalars all_reduce") == 0)
            kind = K_SCALARS;
        if (kind < 0) continue;
        v[m++] = (key){x->step, kind, kind == K_BUCKET ? x->bucket : -1, x->t0, x->t1, x->t0 - x->queued_ns};
    }
    qsort(v, m, sizeof *v, cmp_key);
    *out = v;
    *n = m;
    return RT_OK;
}

static const key *find(const key *v, size_t n, int64_t step, int kind, int bucket) {
    key k = {.step = step, .kind = kind, .bucket = bucket};
    return bsearch(&k, v, n, sizeof *v, cmp_key);
}

static rt_status epoch_summary(const rt_trace_run *t, int64_t epoch, rt_trace_epoch *e) {
    int W = t->world_size;
    e->epoch = epoch;
    e->slowest_rank = -1;
    e->rank_hidden = calloc((size_t)W, sizeof *e->rank_hidden);
    RT_CHECK_ALLOC(e->rank_hidden, (size_t)W * sizeof *e->rank_hidden);
    key **keys = calloc((size_t)W, sizeof *keys);
    size_t *nk = calloc((size_t)W, sizeof *nk);
    int64_t *count = calloc((size_t)W, sizeof *count);
    int64_t *late = NULL;
    rt_status st = keys && nk && count ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "trace: the overlap summary");
    for (int r = 0; r < W && st == RT_OK; r++) st = keys_of(&t->ranks[r], epoch, &keys[r], &nk[r]);
    if (st == RT_OK) {
        late = malloc(sizeof *late * (nk[0] + 1));
        if (!late) st = RT_ERROR(RT_ERR_NOMEM, "trace: the overlap summary");
    }
    if (st != RT_OK) goto out;
    /* the share of each rank's bucket time inside its backward span (the stream's on a GPU) */
    double sum = 0;
    int ranks_with = 0;
    for (int r = 0; r < W; r++) {
        double over = 0, total = 0;
        for (size_t i = 0; i < nk[r]; i++) {
            const key *x = &keys[r][i];
            if (x->kind != K_BUCKET) continue;
            total += (double)(x->t1 - x->t0);
            if (find(keys[r], nk[r], x->step, K_BWD_STREAM, -1)) e->gpu = true;
            const key *b = find(keys[r], nk[r], x->step, K_BWD_HOST, -1);
            if (!b) continue;
            int64_t lo = x->t0 > b->t0 ? x->t0 : b->t0, hi = x->t1 < b->t1 ? x->t1 : b->t1;
            if (hi > lo) over += (double)(hi - lo);
        }
        e->rank_hidden[r] = total > 0 ? over / total : 0;
        if (total > 0) {
            sum += e->rank_hidden[r];
            ranks_with++;
        }
    }
    e->hidden = ranks_with ? sum / ranks_with : 0;
    /* every collective of rank 0 that every rank traced: who started it last */
    int64_t n = 0;
    for (size_t i = 0; i < nk[0]; i++) {
        const key *x = &keys[0][i];
        if (x->kind != K_BUCKET && x->kind != K_SCALARS) continue;
        int last = 0;
        int64_t lo = x->start, hi = x->start;
        bool all = true;
        for (int r = 1; r < W && all; r++) {
            const key *y = find(keys[r], nk[r], x->step, x->kind, x->bucket);
            all = y != NULL;
            if (!y) break;
            if (y->start > hi) {
                hi = y->start;
                last = r;
            }
            if (y->start < lo) lo = y->start;
        }
        if (!all) continue;
        count[last]++;
        late[n++] = hi - lo;
    }
    e->collectives = n;
    for (int r = 0; r < W && n > 0; r++)
        if (e->slowest_rank < 0 || count[r] > count[e->slowest_rank]) e->slowest_rank = r;
    if (n > 0) {
        e->slowest_count = count[e->slowest_rank];
        qsort(late, (size_t)n, sizeof *late, cmp_i64);
        e->median_late_ms = (double)late[n / 2] * 1e-6;
    }
out:
    for (int r = 0; keys && r < W; r++) free(keys[r]);
    free(keys);
    free(nk);
    free(count);
    free(late);
    return st;
}

rt_status rt_trace_overlap(const rt_trace_run *t, rt_trace_epoch **out, int *n) {
    *out = NULL;
    *n = 0;
    if (t->world_size < 2) return RT_OK; /* no collectives with one rank */
    /* the epochs rank 0's collectives belong to, each once, in order (only those present:
     * a file's epoch numbers are not trusted to be small) */
    const rt_trace_rank *k0 = &t->ranks[0];
    int64_t *eps = k0->n ? malloc(k0->n * sizeof *eps) : NULL;
    if (k0->n) RT_CHECK_ALLOC(eps, k0->n * sizeof *eps);
    size_t ne = 0;
    for (size_t i = 0; i < k0->n; i++)
        if (k0->s[i].comm) eps[ne++] = k0->s[i].epoch;
    qsort(eps, ne, sizeof *eps, cmp_i64);
    size_t nu = 0;
    for (size_t i = 0; i < ne; i++)
        if (nu == 0 || eps[i] != eps[nu - 1]) eps[nu++] = eps[i];
    if (nu == 0) {
        free(eps);
        return RT_OK;
    }
    rt_trace_epoch *e = calloc(nu, sizeof *e);
    if (!e) free(eps);
    RT_CHECK_ALLOC(e, nu * sizeof *e);
    int m = 0;
    for (size_t j = 0; j < nu; j++) {
        rt_status st = epoch_summary(t, eps[j], &e[m]);
        m++;
        if (st != RT_OK) {
            free(eps);
            rt_trace_overlap_free(e, m);
            return st;
        }
    }
    free(eps);
    *out = e;
    *n = m;
    return RT_OK;
}

void rt_trace_overlap_free(rt_trace_epoch *e, int n) {
    for (int i = 0; e && i < n; i++) free(e[i].rank_hidden);
    free(e);
}

void rt_trace_overlap_print(const rt_trace_epoch *e, int n, int world_size, FILE *out) {
    for (int i = 0; i < n; i++) {
        if (e[i].gpu) {
            fprintf(out,
                    "trace epoch %" PRId64 ": all-reduce time hidden behind backward: not measured on a GPU (the "
                    "buckets' device-side completion is not traced",
                    e[i].epoch + 1);
        } else {
            fprintf(out, "trace epoch %" PRId64 ": %.0f%% of all-reduce time hidden behind backward (", e[i].epoch + 1,
                    100.0 * e[i].hidden);
            for (int r = 0; r < world_size; r++)
                fprintf(out, "%srank %d %.0f%%", r ? ", " : "", r, 100.0 * e[i].rank_hidden[r]);
        }
        if (e[i].slowest_rank >= 0)
            fprintf(out,
                    "); slowest rank most often: %d (%" PRId64 " of %" PRId64
                    " collectives, median %.3f ms behind the first)\n",
                    e[i].slowest_rank, e[i].slowest_count, e[i].collectives, e[i].median_late_ms);
        else
            fprintf(out, "); no collective traced on every rank\n");
    }
}
