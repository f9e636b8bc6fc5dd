/* Process groups: init (rendezvous, token, the tcp mesh, then the transport:
 * transports.c), sub-groups, requests, hangs and failures. The operations themselves are
 * in collectives.c, the transports in transport_*.c and cuda/nccl.c. */
#include "dist/internal/pg_internal.h"

#include "core/log.h"
#include "core/settings.h"
#include "core/spin.h"
#include "core/timer.h"
#include "dist/internal/auth.h"
#include "dist/internal/sock.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

rt_status rt_pg_options_default(rt_pg_options *o) {
    memset(o, 0, sizeof *o);
    o->init_method = "env://";
    o->rank = -1;
    o->world_size = -1;
    o->transport = RT_TRANSPORT_AUTO;
    o->algo = RT_ALGO_RING;
    o->device = rt_device_cpu();
    /* the defaults are the settings' (core/settings.h): their defaults or the environment */
    int64_t fe = 0;
    int torch_debug = 0;
    RT_CHECK(rt_setting_float(RT_SET_DIST_TIMEOUT, &o->timeout_s));
    RT_CHECK(rt_setting_int(RT_SET_FLIGHT_ENTRIES, &fe));
    o->flight_entries = (int)fe;
    RT_CHECK(rt_setting_choice(RT_SET_TORCH_DEBUG, &torch_debug));
    o->debug = torch_debug == 2; /* TORCH_DISTRIBUTED_DEBUG=DETAIL, unless RINGTRAIN_DIST_DEBUG says */
    if (rt_setting_is_set(RT_SET_DIST_DEBUG)) RT_CHECK(rt_setting_bool(RT_SET_DIST_DEBUG, &o->debug));
    return RT_OK;
}

int rt_pg_rank(const rt_pg *pg) { return pg->rank; }
int rt_pg_size(const rt_pg *pg) { return pg->size; }
int rt_pg_local_rank(const rt_pg *pg) { return pg->w->rdzv.local_rank; }
int rt_pg_world_rank(const rt_pg *pg, int r) { return r >= 0 && r < pg->size ? pg->ranks[r] : -1; }
rt_transport rt_pg_transport(const rt_pg *pg) { return pg->transport; }
rt_algo rt_pg_algo(const rt_pg *pg) { return pg->algo; }
void rt_pg_set_algo(rt_pg *pg, rt_algo a) { pg->algo = a; }
rt_store *rt_pg_store(rt_pg *pg) { return pg->w->store; }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

rt_status rt_pg_wait_ranks(rt_store *st, const char *prefix, int world, double timeout_s, const char *what) {
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    char *seen = calloc((size_t)world, 1);
    RT_CHECK_ALLOC(seen, (size_t)world);
    int delay = 1, left = world;
    for (;;) {
        for (int j = 0; j < world; j++) {
            if (seen[j]) continue;
            char key[128];
            snprintf(key, sizeof key, "%s%d", prefix, j);
            bool ex = false;
            rt_status s = rt_store_check(st, key, &ex);
            if (s != RT_OK) {
                free(seen);
                return s;
            }
            if (ex) {
                seen[j] = 1;
                left--;
            }
        }
        if (left == 0) break;
        if (rt_now_ns() >= deadline) {
            char list[512] = "";
            size_t n = 0;
            for (int j = 0; j < world && n < sizeof list - 16; j++)
                if (!seen[j]) n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? ", " : "", j);
            free(seen);
            return RT_ERROR(RT_ERR_TIMEOUT, "%s: rank%s %s never arrived within %.1f s (world size %d)", what,
                            left > 1 ? "s" : "", list, timeout_s, world);
        }
        sleep_ms(delay);
        if (delay < 50) delay *= 2;
    }
    free(seen);
    return RT_OK;
}

void rt_dist_host_id(char *buf, size_t n) {
    char host[256] = "", boot[64] = "", ns[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    ssize_t l = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (l > 0) ns[l] = '\0';
    snprintf(buf, n, "%s|%s|%s", host, boot, ns);
}

/* ---- init / destroy ---- */

static void world_free(rt_pg_world *w) {
    if (w->cell) munmap(w->cell, RT_FLIGHT_CELL_BYTES);
    if (w->cell_fd > 0) close(w->cell_fd);
    w->cell = NULL;
    free(w->cellref);
    rt_engine_destroy(&w->eng); /* closes the channels and the transport's engine state */
    rt_store_close(w->store);
    rt_store_server_stop(w->server);
    free(w);
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
static void cell_create(rt_pg_world *w, int rank) {
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
static void cell_ref(rt_pg_world *w, int j) {
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

static rt_status engine_on_slow(void *owner) { return rt_pg_slow_check(owner); }

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

void rt_pg_set_tag(rt_pg *pg, const char *tag) {
    if (pg) snprintf(pg->tag, sizeof pg->tag, "%s", tag ? tag : "");
}
void rt_pg_set_op_tag(rt_pg *pg, const char *tag) {
    if (pg) snprintf(pg->op_tag, sizeof pg->op_tag, "%s", tag ? tag : "");
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

static void report_failure(void *ctx, rt_error_record *rec) {
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

static rt_status pg_init_(const rt_pg_options *o, rt_pg_world *w, rt_pg *pg) {
    /* the bound keeps deadline arithmetic ((uint64_t)(timeout_s * 1e9)) defined: inf is refused */
    RT_REQUIRE(o->timeout_s > 0 && o->timeout_s <= 1e8, RT_ERR_INVALID,
               "dist.timeout_s %g: expected seconds above 0 and at most 1e8 (RINGTRAIN_DIST_TIMEOUT sets the default)",
               o->timeout_s);
    int64_t small = 0;
    RT_CHECK(rt_setting_int(RT_SET_ALLREDUCE_SMALL_BYTES, &small)); /* read once: collectives use it */
    w->allreduce_small_bytes = (size_t)small;
    RT_CHECK(rt_rdzv_parse(o->init_method, o->rank, o->world_size, &w->rdzv));
    rt_rdzv *r = &w->rdzv;
    rt_set_rank(r->rank);
    RT_CHECK(rt_rdzv_connect(r, o->timeout_s, &w->server, &w->store));
    RT_CHECK(rt_engine_init(&w->eng, r->rank, r->world));
    w->eng.on_fail = report_failure;
    w->eng.on_fail_ctx = w;
    w->eng.on_slow = engine_on_slow;
    /* the per-launch nonce: with the job secret it keys the transport handshake (auth.h) */
    if (r->rank == 0) {
        RT_CHECK(rt_random_bytes(w->token, sizeof w->token));
        RT_CHECK(rt_store_set(w->store, "rt/token", w->token, sizeof w->token));
    } else {
        size_t n = 0;
        RT_CHECK(rt_store_get(w->store, "rt/token", w->token, sizeof w->token, &n));
        RT_REQUIRE(n == sizeof w->token, RT_ERR_PEER, "store: token of %zu bytes, expected %d", n, RT_TOKEN_BYTES);
    }
    rt_hex_encode(w->token, RT_TOKEN_BYTES, w->tokhex);
    /* our address and host */
    int lfd = -1, port = 0;
    /* the interface that reaches the store, unless RINGTRAIN_ADDR says otherwise */
    const char *ip = rt_setting_text(RT_SET_ADDR);
    if (!ip) ip = rt_store_local_addr(w->store);
    RT_CHECK(rt_sock_listen(ip, 0, &lfd, &port));
    char key[64], val[400], hid[300];
    if (o->flight_entries > 0) cell_create(w, r->rank);
    w->cellref = calloc((size_t)r->world, sizeof *w->cellref);
    RT_CHECK_ALLOC(w->cellref, (size_t)r->world * sizeof *w->cellref);
    rt_dist_host_id(hid, sizeof hid);
    snprintf(key, sizeof key, "rt/host/%d", r->rank);
    rt_status s = rt_store_set(w->store, key, hid, strlen(hid));
    snprintf(key, sizeof key, "rt/addr/%d", r->rank);
    snprintf(val, sizeof val, "%s %d", ip, port);
    if (s == RT_OK) s = rt_store_set(w->store, key, val, strlen(val));
    if (s == RT_OK) s = rt_pg_wait_ranks(w->store, "rt/addr/", r->world, o->timeout_s, "rendezvous");
    char(*addrs)[80] = calloc((size_t)r->world, sizeof *addrs);
    bool same_host = true;
    for (int j = 0; s == RT_OK && j < r->world; j++) {
        size_t n = 0;
        char other[300] = "";
        if (!addrs) {
            s = RT_ERROR(RT_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(key, sizeof key, "rt/addr/%d", j);
        s = rt_store_get(w->store, key, addrs[j], sizeof addrs[j] - 1, &n);
        snprintf(key, sizeof key, "rt/host/%d", j);
        if (s == RT_OK) s = rt_store_get(w->store, key, other, sizeof other - 1, &n);
        if (s == RT_OK && j != r->rank && strcmp(other, hid) == 0) cell_ref(w, j);
        if (strcmp(other, hid) != 0) {
            same_host = false;
            /* a loopback address is unreachable from another host (MASTER_ADDR resolving to
             * 127.0.1.1 through /etc/hosts on the store's host is the usual cause) */
            if (s == RT_OK && j < r->rank && strncmp(addrs[j], "127.", 4) == 0)
                s = RT_ERROR(RT_ERR_INVALID,
                             "rank %d runs on another host but published the loopback address %s: set "
                             "RINGTRAIN_ADDR to its reachable IP address there (MASTER_ADDR probably resolves to "
                             "a loopback address on that host)",
                             j, addrs[j]);
        }
    }
    if (s == RT_OK) s = rt_tcp_mesh_connect(w, lfd, addrs, o->timeout_s);
    close(lfd);
    free(addrs);
    RT_CHECK(s);

    pg->w = w;
    pg->is_world = true;
    pg->rank = r->rank;
    pg->size = r->world;
    pg->ranks = malloc((size_t)r->world * sizeof *pg->ranks);
    RT_CHECK_ALLOC(pg->ranks, (size_t)r->world * sizeof(int));
    for (int i = 0; i < r->world; i++) pg->ranks[i] = i;
    pg->id = 0;
    w->next_group = 1;
    pg->timeout_s = o->timeout_s;
    pg->algo = o->algo;
    RT_REQUIRE(o->flight_entries >= 0, RT_ERR_INVALID, "rt_pg_options.flight_entries %d < 0", o->flight_entries);
    RT_CHECK(rt_flight_init(&pg->flight, (uint32_t)o->flight_entries));
    pg->has_flight = true;
    pg->debug = o->debug;
    pg->p2p_n = calloc(2 * (size_t)r->world, sizeof *pg->p2p_n);
    RT_CHECK_ALLOC(pg->p2p_n, 2 * (size_t)r->world * sizeof *pg->p2p_n);
    pg->flight.cell = w->cell;
    pg->cell_cache = calloc((size_t)r->world, sizeof *pg->cell_cache);
    RT_CHECK_ALLOC(pg->cell_cache, (size_t)r->world * sizeof *pg->cell_cache);
    pg->buf_device = o->device;
    rt_transport_setup ts = {.same_host = same_host, .timeout_s = o->timeout_s};
    RT_CHECK(rt_transport_connect(pg, o, &ts));
    RT_LOG_DEBUG("process group ready: rank %d of %d, transport %s", r->rank, r->world,
                 rt_transport_name(pg->transport));
    return RT_OK;
}

rt_status rt_pg_init(const rt_pg_options *o, rt_pg **out) {
    *out = NULL;
    rt_pg_world *w = calloc(1, sizeof *w);
    RT_CHECK_ALLOC(w, sizeof *w);
    rt_pg *pg = calloc(1, sizeof *pg);
    if (!pg) {
        free(w);
        RT_CHECK_ALLOC(NULL, sizeof *pg);
    }
    pthread_mutex_init(&pg->cache_mu, NULL);
    rt_status s = pg_init_(o, w, pg);
    if (s != RT_OK) {
        rt_error_record rec;
        rt_error_save(&rec);
        pg->flight.cell = NULL;
        if (pg->has_flight) rt_flight_destroy(&pg->flight);
        free(pg->p2p_n);
        free(pg->cell_cache);
        pthread_mutex_destroy(&pg->cache_mu);
        free(pg->ranks);
        free(pg);
        world_free(w);
        rt_error_restore(&rec);
        rt_error_trace(__FILE__, __LINE__, "rt_pg_init");
        return s;
    }
    *out = pg;
    return RT_OK;
}

void rt_pg_destroy(rt_pg *pg) {
    if (!pg) return;
    if (pg->is_world) {
        rt_pg_world *w = pg->w;
        if (pg->tp && pg->tp->teardown) pg->tp->teardown(w);
        /* say goodbye; the store's host keeps the store up until every rank said goodbye
         * or its connection closed (the server marks "rt/left/<rank>") */
        if (w->store) {
            char key[64];
            rt_store_set_timeout(w->store, 5.0);
            snprintf(key, sizeof key, "rt/exit/%d", pg->rank);
            if (rt_store_set(w->store, key, "1", 1) == RT_OK && w->server) {
                /* after a failure some ranks may be dead or stuck: wait briefly only, so
                 * that the survivors can still read the failure report */
                double wait_s = w->eng.broken ? (pg->timeout_s < 3 ? pg->timeout_s : 3) : pg->timeout_s;
                uint64_t deadline = rt_now_ns() + (uint64_t)(wait_s * 1e9);
                int delay = 1, next = 0;
                while (next < pg->size && rt_now_ns() < deadline) {
                    bool ex = false, left = false;
                    snprintf(key, sizeof key, "rt/exit/%d", next);
                    if (rt_store_check(w->store, key, &ex) != RT_OK) break;
                    if (!ex) {
                        snprintf(key, sizeof key, "rt/left/%d", next);
                        if (rt_store_check(w->store, key, &left) != RT_OK) break;
                    }
                    if (ex || left) {
                        next++;
                        continue;
                    }
                    sleep_ms(delay);
                    if (delay < 50) delay *= 2;
                }
            }
        }
        pg->flight.cell = NULL;
        world_free(w);
    }
    rt_stage_pool_free(pg);
    if (pg->has_flight) rt_flight_destroy(&pg->flight);
    free(pg->p2p_n);
    free(pg->cell_cache);
    pthread_mutex_destroy(&pg->cache_mu);
    free(pg->ranks);
    free(pg);
}

rt_status rt_pg_new_group(rt_pg *pg, const int *ranks, int n, rt_pg **out) {
    *out = NULL;
    RT_REQUIRE(n >= 1 && n <= pg->size, RT_ERR_INVALID, "new_group: %d ranks (group size %d)", n, pg->size);
    int id = pg->w->next_group++;
    RT_REQUIRE(id < 65536, RT_ERR_INVALID, "new_group: too many groups");
    int me = -1;
    for (int i = 0; i < n; i++) {
        RT_REQUIRE(ranks[i] >= 0 && ranks[i] < pg->size, RT_ERR_INVALID,
                   "new_group: rank %d at index %d out of range 0..%d", ranks[i], i, pg->size - 1);
        for (int k = 0; k < i; k++)
            RT_REQUIRE(ranks[k] != ranks[i], RT_ERR_INVALID, "new_group: rank %d listed twice", ranks[i]);
        if (ranks[i] == pg->rank) me = i;
    }
    if (me < 0) return RT_OK;
    rt_pg *g = calloc(1, sizeof *g);
    RT_CHECK_ALLOC(g, sizeof *g);
    pthread_mutex_init(&g->cache_mu, NULL);
    g->ranks = malloc((size_t)n * sizeof *g->ranks);
    if (!g->ranks) {
        free(g);
        RT_CHECK_ALLOC(NULL, (size_t)n * sizeof(int));
    }
    for (int i = 0; i < n; i++) g->ranks[i] = pg->ranks[ranks[i]];
    g->w = pg->w;
    g->buf_device = pg->buf_device;
    g->stream = pg->stream;
    g->rank = me;
    g->size = n;
    g->id = id;
    g->timeout_s = pg->timeout_s;
    g->algo = pg->algo;
    g->transport = pg->transport;
    g->tp = pg->tp;
    rt_status fs = rt_flight_init(&g->flight, pg->flight.cap);
    if (fs != RT_OK) {
        free(g->ranks);
        free(g);
        return fs;
    }
    g->has_flight = true;
    g->debug = pg->debug;
    g->p2p_n = calloc(2 * (size_t)n, sizeof *g->p2p_n);
    if (!g->p2p_n) {
        rt_flight_destroy(&g->flight);
        free(g->ranks);
        free(g);
        RT_CHECK_ALLOC(NULL, 2 * (size_t)n * sizeof(uint32_t));
    }
    *out = g;
    return RT_OK;
}

/* The device part of a request (engine.h), after its host part has completed: one
 * look; an error is kept (a later look returns it again). */
static rt_status dev_poll(rt_request *r, bool *done) {
    if (!r->dev || r->dev_done) {
        *done = true;
        if (r->dev_status != RT_OK) rt_error_restore(&r->dev_err);
        return r->dev_status;
    }
    rt_status s = r->dev->poll(r, done);
    if (s != RT_OK) {
        rt_error_save(&r->dev_err);
        r->dev_status = s;
        *done = true;
    }
    if (*done) {
        r->dev_done = true;
        if (r->fr_id) {
            rt_flight_end(r->fr, r->fr_id, s == RT_OK);
            r->fr_id = 0;
        }
    }
    return s;
}

/* Wait for the device part on the host: spin a little (rt_cpu_relax), then yield the
 * processor between looks; never sleep a fixed time per look. */
static rt_status dev_wait(rt_request *r) {
    uint64_t slow = r->owner && r->slow_s > 0 ? rt_now_ns() + (uint64_t)(r->slow_s * 1e9) : 0;
    for (unsigned i = 0;; i++) {
        bool done = false;
        rt_status s = dev_poll(r, &done);
        if (s != RT_OK || done) return s;
        if (slow && (i & 1023) == 0 && rt_now_ns() >= slow) {
            /* slow (nccl has no message headers to compare): publish and compare states;
             * a desync breaks the group (the communicator is aborted when it is closed) */
            slow = rt_now_ns() + 1000000000ull;
            rt_pg *pg = r->owner;
            s = rt_pg_slow_check(pg);
            if (s != RT_OK) {
                rt_engine *e = &pg->w->eng;
                rt_error_trace(__FILE__, __LINE__, r->opname);
                pthread_mutex_lock(&e->mu);
                if (!e->broken) {
                    e->broken = true;
                    rt_error_save(&e->err);
                }
                pthread_mutex_unlock(&e->mu);
                if (r->fr_id) {
                    rt_flight_end(r->fr, r->fr_id, false);
                    r->fr_id = 0;
                }
                return s;
            }
        }
        if (i < 2000)
            rt_cpu_relax();
        else
            sched_yield();
    }
}

rt_status rt_wait(rt_request *req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_wait: NULL request");
    rt_status s = rt_req_wait(req);
    if (s == RT_OK) s = dev_wait(req);
    rt_req_free(req);
    return s;
}

rt_status rt_wait_stream(rt_request *req, rt_stream *stream) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_wait_stream: NULL request");
    rt_status s = rt_req_wait(req); /* the host part (none on nccl) */
    if (s == RT_OK && req->dev && !req->dev_done) {
        if (stream && rt_stream_native(stream))
            s = req->dev->stream_wait(req, stream);
        else
            s = dev_wait(req); /* no device stream to wait: the host waits */
    } else if (s == RT_OK) {
        bool done;
        s = dev_poll(req, &done); /* a device part that already failed */
    }
    rt_req_free(req);
    return s;
}

rt_status rt_test(rt_request *req, bool *done) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_test: NULL request");
    RT_REQUIRE(done != NULL, RT_ERR_INVALID, "rt_test: NULL result pointer");
    bool host = false;
    rt_status s = rt_req_test(req, &host);
    if (s != RT_OK || !host) {
        *done = host;
        return s;
    }
    return dev_poll(req, done);
}

rt_status rt_pg_flight_dump(rt_pg *pg, const char *path) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "flight recorder dump: NULL process group");
    return rt_flight_dump(&pg->flight, pg->rank, pg->size, pg->id, path);
}

void rt_pg_set_stream(rt_pg *pg, rt_stream *stream) {
    if (pg) pg->stream = stream;
}

rt_stream *rt_pg_stream(const rt_pg *pg) { return pg ? pg->stream : NULL; }

rt_status rt_pg_set_buffer_device(rt_pg *pg, rt_device d) {
    RT_REQUIRE(pg != NULL, RT_ERR_INVALID, "NULL process group");
    RT_REQUIRE(d.kind == RT_DEVICE_CPU || rt_cuda_built(), RT_ERR_UNSUPPORTED, "device buffers: built without CUDA");
    RT_REQUIRE(!pg->tp->device_only || d.kind == RT_DEVICE_CUDA, RT_ERR_INVALID,
               "the %s transport takes device buffers only", pg->tp->name);
    pg->buf_device = d;
    return RT_OK;
}
