/* Hangs, desyncs and failure reports of process groups (docs/dist.md, "Hangs and
 * desyncs", "Timeouts and failures"): the states the ranks publish when something is
 * slow or failed, the shared recorder pages of the ranks on this host, debug mode's
 * fingerprint check, and the report of a group's first failure through the store. The
 * engine calls in through rt_engine.on_fail and on_slow (pg.c installs them). */
#include "dist/internal/pg_internal.h"

#include "core/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The first rank to fail reports its error through the store; a rank that fails
 * later (typically because a failed rank shut its sockets) appends that first report,
 * so every survivor names the rank that really died. */
/* After a timeout: follow "who waits for whom" (each failing rank publishes the peer it
 * was receiving from) to the first rank that reported nothing within a short grace
 * period: that rank is stuck or dead, while the peers in between merely wait behind it. */
static void diagnose_timeout(rt_pg_world *w, double grace_s, char *out, size_t n) {
    int me = w->eng.rank, cur = w->eng.fail_peer, hops = 0;
    out[0] = '\0';
    uint64_t deadline = rt_now_ns() + (uint64_t)(grace_s * 1e9);
    char chain[256] = "";
    size_t cl = 0;
    while (cur >= 0 && cur != me && hops < w->eng.world) {
        char key[64], val[32] = "";
        snprintf(key, sizeof key, "rt/waiting/%d", cur);
        bool ex = false;
        if (rt_store_check(w->store, key, &ex) != RT_OK) return;
        if (ex) {
            size_t len = 0;
            if (rt_store_get(w->store, key, val, sizeof val - 1, &len) != RT_OK) return;
            val[len] = '\0';
            int next = atoi(val);
            if (cl < sizeof chain - 40)
                cl += (size_t)snprintf(chain + cl, sizeof chain - cl, "rank %d waits for rank %d; ", cur, next);
            cur = next;
            hops++;
            continue;
        }
        if (rt_now_ns() >= deadline) {
            snprintf(out, n, "%srank %d reported nothing: it is probably stuck or dead", chain, cur);
            return;
        }
        sleep_ms(20);
    }
}

/* ---- hangs and desyncs (docs/dist.md, "Hangs and desyncs") ----
 * Every rank's state (its oldest pending collective, how long it waits in it, its last
 * completed one) is published under rt/fr/<group>/<rank> only when something is slow or
 * failed; the step itself never touches the store. */

double rt_pg_slow_after_s(double timeout_s) { return timeout_s / 4 < 10 ? timeout_s / 4 : 10; }

/* Store requests of these checks: a store that does not answer this fast is as stuck as
 * a peer (its host, rank 0 or the launcher, is stopped): without it, the shared pages. */
static double check_timeout(const rt_pg *pg) {
    double t = rt_pg_slow_after_s(pg->timeout_s);
    return t < 2 ? t : 2;
}

static rt_status publish_state(rt_pg *pg, rt_flight_state_rec *mine) {
    rt_flight_get_state(&pg->flight, mine);
    char key[64], val[512];
    snprintf(key, sizeof key, "rt/fr/%d/%d", pg->id, pg->rank);
    int n = rt_flight_state_format(mine, val, sizeof val);
    return rt_store_set_within(pg->w->store, key, val, (size_t)(n < (int)sizeof val ? n : (int)sizeof val - 1),
                               check_timeout(pg));
}

/* The others' published states into rec[] (rec[me] = mine). A state older than this
 * rank's (its pending operation before this rank's) is from an earlier slow wait that
 * ended: it counts as not published. Returns how many ranks published. */
static int read_states(rt_pg *pg, const rt_flight_state_rec *mine, rt_flight_state_rec *rec) {
    memset(rec, 0, (size_t)pg->size * sizeof *rec);
    rec[pg->rank] = *mine;
    int have = 1;
    for (int j = 0; j < pg->size; j++) {
        if (j == pg->rank) continue;
        char key[64], val[512];
        snprintf(key, sizeof key, "rt/fr/%d/%d", pg->id, j);
        bool ex = false;
        /* a request that fails (the store does not answer in time) ends the round: the
         * next ones would wait as long for nothing */
        if (rt_store_check_within(pg->w->store, key, &ex, check_timeout(pg)) != RT_OK) break;
        if (!ex) continue;
        size_t n = 0;
        if (rt_store_get_within(pg->w->store, key, val, sizeof val - 1, &n, check_timeout(pg)) != RT_OK) break;
        val[n] = '\0';
        if (!rt_flight_state_parse(val, &rec[j])) continue;
        if (mine->npending && rec[j].npending && rec[j].pending[0].seq < mine->pending[0].seq &&
            rec[j].pending[rec[j].npending - 1].seq < mine->pending[0].seq) {
            memset(&rec[j], 0, sizeof rec[j]); /* stale */
            continue;
        }
        have++;
    }
    return have;
}

/* The world group's shared page (flight.h, rt_flight_cell): a memfd the peers on this
 * host open through /proc/<pid>/fd/<n>, published before the rendezvous' addresses (so
 * every rank reads the others' at init, while the store surely answers). Best effort:
 * without it, a stopped rank's last operation is unknown. */
void rt_pg_cell_create(rt_pg_world *w, int rank) {
    _Static_assert(sizeof(rt_flight_cell) <= RT_FLIGHT_CELL_BYTES, "the cell fits its page");
    int fd = memfd_create(RT_FLIGHT_CELL_NAME, MFD_CLOEXEC);
    if (fd < 0) return;
    void *p = MAP_FAILED;
    if (ftruncate(fd, RT_FLIGHT_CELL_BYTES) == 0)
        p = mmap(NULL, RT_FLIGHT_CELL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return;
    }
    w->cell = p;
    w->cell_fd = fd;
    w->cell->magic = RT_FLIGHT_CELL_MAGIC;
    char key[64], val[64];
    snprintf(key, sizeof key, "rt/frcell/%d", rank);
    int n = snprintf(val, sizeof val, "%d %d", (int)getpid(), fd);
    if (rt_store_set(w->store, key, val, (size_t)n) != RT_OK) rt_error_clear();
}

/* rank j's page reference, when it is on this host and has one (at init) */
void rt_pg_cell_ref(rt_pg_world *w, int j) {
    char key[64], val[64];
    size_t n = 0;
    bool ex = false;
    snprintf(key, sizeof key, "rt/frcell/%d", j);
    if (rt_store_check(w->store, key, &ex) == RT_OK && ex &&
        rt_store_get(w->store, key, val, sizeof val - 1, &n) == RT_OK) {
        val[n] = '\0';
        if (sscanf(val, "%d %d", &w->cellref[j][0], &w->cellref[j][1]) != 2) w->cellref[j][0] = 0;
    }
    rt_error_clear();
}

/* Group rank j's shared page, when it is on this host: its last begun and last completed
 * collective. `waiting`: a rank inside an operation (begun after its last completed one)
 * counts as waiting in it, since it began (without the store, nobody published). */
static void cell_read(rt_pg *pg, int j, rt_flight_state_rec *rec, bool waiting) {
    if (!pg->is_world || !pg->w->cellref || !pg->w->cellref[j][0]) return;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pg->w->cellref[j][0], pg->w->cellref[j][1]);
    int fd = rt_flight_cell_open(path); /* -1: absent, or not a cell (a reused pid) */
    if (fd < 0) return;
    void *p = mmap(NULL, RT_FLIGHT_CELL_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    rt_flight_cell c;
    if (rt_flight_cell_read(p, &c)) {
        rec->from_cell = true;
        rec->last_done = c.last_done;
        rec->begun = c.begun[c.last_begun % RT_FLIGHT_PENDING];
        /* the ones begun after the last completed, oldest first, as far as the page keeps them */
        uint32_t from = c.last_done.seq + 1;
        if (c.last_begun >= RT_FLIGHT_PENDING && from < c.last_begun - RT_FLIGHT_PENDING + 1)
            from = c.last_begun - RT_FLIGHT_PENDING + 1;
        for (uint32_t q = from; waiting && !rec->present && q && q <= c.last_begun; q++) {
            const rt_flight_fp *b = &c.begun[q % RT_FLIGHT_PENDING];
            if (b->seq != q) continue;
            if (rec->npending == 0) {
                uint64_t now = rt_now_ns(), t = c.t_begun_ns[q % RT_FLIGHT_PENDING];
                rec->wait_s = now > t ? (double)(now - t) * 1e-9 : 0;
            }
            rec->pending[rec->npending++] = *b;
        }
        if (rec->npending) rec->present = true;
    }
    munmap(p, RT_FLIGHT_CELL_BYTES);
}

rt_status rt_pg_slow_check(rt_pg *pg) {
    if (!pg || !pg->w->store || !pg->flight.cap) return RT_OK;
    for (int j = 0; pg->cell_cache && j < pg->size; j++) { /* first: needs no store */
        rt_flight_state_rec t = {0};
        if (j != pg->rank) cell_read(pg, j, &t, true);
        if (t.from_cell) {
            pthread_mutex_lock(&pg->cache_mu);
            pg->cell_cache[j] = t;
            pthread_mutex_unlock(&pg->cache_mu);
        }
    }
    /* another thread holds the store connection (debug mode's wait for a peer's
     * fingerprint): skip this round rather than wait for it (it is tried again in 1 s) */
    if (rt_store_busy(pg->w->store)) return RT_OK;
    rt_flight_state_rec mine;
    if (publish_state(pg, &mine) != RT_OK) {
        rt_error_clear();
        return RT_OK;
    }
    rt_flight_state_rec *rec = calloc((size_t)pg->size, sizeof *rec);
    if (!rec) return RT_OK;
    read_states(pg, &mine, rec);
    char diag[800];
    int kind = rt_flight_diagnose(rec, pg->size, diag, sizeof diag);
    free(rec);
    rt_error_clear();
    if (kind == 1) return RT_ERROR(RT_ERR_PEER, "group %d: the ranks called different collectives: %s", pg->id, diag);
    return RT_OK;
}

rt_status rt_pg_on_slow(void *owner) { return rt_pg_slow_check(owner); }

/* After a failure: publish, wait up to grace_s for every rank's state (a stopped rank
 * never comes), diagnose. Returns rt_flight_diagnose's kind. */
static int diagnose_flight(rt_pg *pg, double grace_s, int wait_rank, char *out, size_t n) {
    out[0] = '\0';
    if (!pg || !pg->flight.cap) return 0;
    rt_flight_state_rec mine;
    rt_flight_state_rec *rec = calloc((size_t)pg->size, sizeof *rec);
    if (!rec) return 0;
    if (publish_state(pg, &mine) != RT_OK) {
        /* no store (its host is stopped or dead): this rank's own state and the pages of
         * the ranks on this host */
        rt_error_clear();
        for (int j = 0; j < pg->size; j++) {
            if (j == pg->rank)
                rec[j] = mine;
            else
                cell_read(pg, j, &rec[j], true);
            if (!rec[j].from_cell && j != pg->rank && pg->cell_cache) {
                pthread_mutex_lock(&pg->cache_mu);
                if (pg->cell_cache[j].from_cell) rec[j] = pg->cell_cache[j]; /* it exited since (its own timeout) */
                pthread_mutex_unlock(&pg->cache_mu);
            }
        }
        int kind = rt_flight_diagnose(rec, pg->size, out, n);
        free(rec);
        return kind;
    }
    uint64_t deadline = rt_now_ns() + (uint64_t)(grace_s * 1e9);
    for (;;) { /* every rank's state, or wait_rank's (>= 0) */
        int have = read_states(pg, &mine, rec);
        if (wait_rank >= 0 ? rec[wait_rank].present : have == pg->size) break;
        if (rt_now_ns() >= deadline) break;
        sleep_ms(20);
    }
    for (int j = 0; j < pg->size; j++)
        if (!rec[j].present) cell_read(pg, j, &rec[j], false);
    int kind = rt_flight_diagnose(rec, pg->size, out, n);
    free(rec);
    return kind;
}

rt_status rt_pg_debug_check(rt_pg *pg, const rt_flight_fp *fp) {
    rt_store *st = pg->w->store;
    RT_REQUIRE(st != NULL, RT_ERR_INVALID, "dist debug mode: no store");
    char key[64], val[256];
    snprintf(key, sizeof key, "rt/fpd/%d/%u/%d", pg->id, fp->seq, pg->rank);
    int n = rt_flight_fp_format(fp, val, sizeof val);
    RT_CHECK(rt_store_set(st, key, val, (size_t)n));
    if (pg->ndebug_keys < (int)(sizeof pg->debug_keys / sizeof pg->debug_keys[0]))
        pg->debug_keys[pg->ndebug_keys++] = fp->seq;
    char dmine[200];
    rt_flight_fp_describe(fp, dmine, sizeof dmine);
    for (int j = 0; j < pg->size; j++) {
        if (j == pg->rank) continue;
        snprintf(key, sizeof key, "rt/fpd/%d/%u/%d", pg->id, fp->seq, j);
        const char *keys[1] = {key};
        rt_status s = rt_store_wait(st, keys, 1);
        if (s != RT_OK)
            return RT_ERROR(s, "dist debug mode: rank %d never checked in for %s (group %d): %s", j, dmine, pg->id,
                            rt_error_message());
        size_t got = 0;
        RT_CHECK(rt_store_get(st, key, val, sizeof val - 1, &got));
        val[got] = '\0';
        rt_flight_fp other;
        RT_REQUIRE(rt_flight_fp_parse(val, &other), RT_ERR_PEER, "dist debug mode: rank %d published '%s'", j, val);
        if (rt_flight_fp_differ(fp, &other)) {
            char dother[200];
            rt_flight_fp_describe(&other, dother, sizeof dother);
            return RT_ERROR(RT_ERR_PEER,
                            "desync at #%u (group %d, dist debug mode, before it ran): rank %d called %s but rank %d "
                            "called %s",
                            fp->seq, pg->id, pg->rank, dmine, j, dother);
        }
    }
    /* The store keeps each rank's key of its last check only (else it grows with every
     * collective: issue 21). This check read every rank's key of it, and a rank writes its
     * key only after its previous check returned (one thread per group): nobody reads
     * a key of an earlier check any more, so this rank's keys of its earlier checks go
     * (the previous one, and those of checks that failed since the last that passed). */
    for (int i = 0; i < pg->ndebug_keys; i++) {
        if (pg->debug_keys[i] == fp->seq) continue;
        snprintf(key, sizeof key, "rt/fpd/%d/%u/%d", pg->id, pg->debug_keys[i], pg->rank);
        RT_CHECK(rt_store_delete(st, key, NULL));
    }
    pg->debug_keys[0] = fp->seq;
    pg->ndebug_keys = 1;
    return RT_OK;
}

/* The group's first failure: the first rank to fail records its message (with `diag`)
 * in the store; a later one appends that first message to its own. */
static void register_failure(rt_pg_world *w, rt_error_record *rec, const char *diag) {
    rt_error_record mine = *rec;
    int64_t k = 0;
    if (rt_store_add(w->store, "rt/failures", 1, &k) != RT_OK) {
        if (!w->server) {
            size_t len = strlen(rec->msg);
            snprintf(rec->msg + len, sizeof rec->msg - len,
                     "\n  and the store (hosted by rank 0 or the launcher) is unreachable: rank 0 probably died");
        }
        return;
    }
    if (k == 1) {
        char msg[1600];
        char *nl = strchr(mine.msg, '\n');
        if (nl) *nl = '\0';
        char who[32]; /* the rank once: the message and the errors nested in it may carry it already */
        size_t wl = (size_t)snprintf(who, sizeof who, "rank %d: ", w->eng.rank);
        for (char *p; (p = strstr(mine.msg, who)) != NULL;) memmove(p, p + wl, strlen(p + wl) + 1);
        int n = snprintf(msg, sizeof msg, "%s%.800s%s%.700s", who, mine.msg, diag[0] ? "; " : "", diag);
        rt_store_set(w->store, "rt/failure/first", msg, (size_t)n);
    } else {
        char first[1700] = "";
        size_t n = 0;
        if (rt_store_get(w->store, "rt/failure/first", first, sizeof first - 1, &n) == RT_OK) {
            first[n < sizeof first ? n : sizeof first - 1] = '\0';
            char *nl = strchr(first, '\n');
            if (nl) *nl = '\0';
            size_t len = strlen(rec->msg);
            snprintf(rec->msg + len, sizeof rec->msg - len, "\n  first failure in the group: %s", first);
        }
    }
}

static void append_diag(rt_error_record *rec, const char *diag) {
    if (!diag[0]) return;
    size_t len = strlen(rec->msg);
    snprintf(rec->msg + len, sizeof rec->msg - len, "\n  diagnosis: %s", diag);
}

void rt_pg_report_failure(void *ctx, rt_error_record *rec) {
    rt_pg_world *w = ctx;
    if (!w->store) return;
    rt_store_set_timeout(w->store, 2.0);
    if (w->eng.fail_peer >= 0) {
        char key[64], val[32];
        snprintf(key, sizeof key, "rt/waiting/%d", w->eng.rank);
        int n = snprintf(val, sizeof val, "%d", w->eng.fail_peer);
        rt_store_set(w->store, key, val, (size_t)n);
    }
    /* every failing rank publishes its state (docs/dist.md, "Hangs and desyncs") */
    char diag[800] = "";
    bool timeout = rec->status == RT_ERR_TIMEOUT;
    rt_pg *fpg = w->eng.fail_owner;
    int mm = -1; /* the peer whose message did not match, as a rank of the failing group */
    for (int j = 0; fpg && w->eng.mismatch_peer >= 0 && j < fpg->size; j++)
        if (fpg->ranks[j] == w->eng.mismatch_peer) mm = j;
    if (mm >= 0 && !timeout) {
        /* a message that did not match this rank's call: publish, record the failure, then
         * abort the peers at once (the peer is usually blocked in its own call: it then
         * fails, publishes its state and finds both calls) and wait up to 2 s for its state */
        rt_flight_state_rec mine;
        if (publish_state(fpg, &mine) != RT_OK) rt_error_clear();
        register_failure(w, rec, "");
        rt_engine_abort_peers(&w->eng);
        if (diagnose_flight(fpg, 2.0, mm, diag, sizeof diag) == 1) append_diag(rec, diag);
        return;
    }
    /* a timeout waits for the others' states (2 s) and says who is behind or which calls
     * differ; any other failure reads what is there and reports only a desync */
    int kind = diagnose_flight(fpg, timeout ? 2.0 : 0, -1, diag, sizeof diag);
    if (!timeout && kind != 1) diag[0] = '\0';
    if (timeout && !diag[0]) diagnose_timeout(w, 2.0, diag, sizeof diag);
    append_diag(rec, diag);
    register_failure(w, rec, diag);
}
