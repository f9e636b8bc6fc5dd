/* Process groups: init (rendezvous, token, the tcp mesh, then the transport:
 * transports.c), sub-groups and requests. The operations themselves are in
 * collectives.c, the transports in transport_*.c and cuda/nccl.c, hangs, desyncs and
 * failure reports in hangs.c. */
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
    /* every setting is read even after a bad one, so the fields that can be read get their
     * values; the first error is the one returned */
    int64_t fe = 0;
    int torch_debug = 0;
    rt_status st = rt_setting_float(RT_SET_DIST_TIMEOUT, &o->timeout_s);
    rt_status s2 = rt_setting_int(RT_SET_FLIGHT_ENTRIES, &fe);
    if (s2 == RT_OK) o->flight_entries = (int)fe;
    if (st == RT_OK) st = s2;
    s2 = rt_setting_choice(RT_SET_TORCH_DEBUG, &torch_debug);
    o->debug = s2 == RT_OK && torch_debug == 2; /* TORCH_DISTRIBUTED_DEBUG=DETAIL, unless RINGTRAIN_DIST_DEBUG says */
    if (st == RT_OK) st = s2;
    if (rt_setting_is_set(RT_SET_DIST_DEBUG)) {
        s2 = rt_setting_bool(RT_SET_DIST_DEBUG, &o->debug);
        if (st == RT_OK) st = s2;
    }
    return st;
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

void rt_pg_set_tag(rt_pg *pg, const char *tag) {
    if (pg) snprintf(pg->tag, sizeof pg->tag, "%s", tag ? tag : "");
}
void rt_pg_set_op_tag(rt_pg *pg, const char *tag) {
    if (pg) snprintf(pg->op_tag, sizeof pg->op_tag, "%s", tag ? tag : "");
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
    w->eng.on_fail = rt_pg_report_failure;
    w->eng.on_fail_ctx = w;
    w->eng.on_slow = rt_pg_on_slow;
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
    if (o->flight_entries > 0) rt_pg_cell_create(w, r->rank);
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
        if (s == RT_OK && j != r->rank && strcmp(other, hid) == 0) rt_pg_cell_ref(w, j);
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

/* The one teardown of a group: frees w (its world, NULL: a sub-group shares its
 * parent's) and everything the group holds, whatever state rt_pg_init or
 * rt_pg_new_group left it in (fields still zero are skipped). A new field of rt_pg is
 * freed here. */
static void pg_free(rt_pg *pg, rt_pg_world *w) {
    pg->flight.cell = NULL; /* in w's shared page */
    if (w) world_free(w);
    rt_stage_pool_free(pg);
    if (pg->has_flight) rt_flight_destroy(&pg->flight);
    rt_pg_graph_free(pg->capture); /* a capture never ended */
    free(pg->p2p_n);
    free(pg->cell_cache);
    pthread_mutex_destroy(&pg->cache_mu);
    free(pg->ranks);
    free(pg);
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
        pg_free(pg, w);
        rt_error_restore(&rec);
        rt_error_trace(__FILE__, __LINE__, "rt_pg_init");
        return s;
    }
    *out = pg;
    return RT_OK;
}

void rt_pg_destroy(rt_pg *pg) {
    if (!pg) return;
    rt_pg_world *w = pg->is_world ? pg->w : NULL; /* a sub-group's world is its parent's */
    if (w) {
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
    }
    pg_free(pg, w);
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
        pg_free(g, NULL);
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
        pg_free(g, NULL);
        return fs;
    }
    g->has_flight = true;
    g->debug = pg->debug;
    g->p2p_n = calloc(2 * (size_t)n, sizeof *g->p2p_n);
    if (!g->p2p_n) {
        pg_free(g, NULL);
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

/* A captured request (pg_graph.c) waited for by the host: refused, and freed when `free`. */
static rt_status captured_host_wait(rt_request *req, const char *call, bool free) {
    char op[48];
    snprintf(op, sizeof op, "%s", req->opname);
    if (free) {
        rt_pg_capture_forget(req->owner, false);
        rt_req_free(req);
    }
    RT_FAIL(RT_ERR_INVALID,
            "%s: %s was captured into a CUDA graph: it runs when the graph is launched, so the host cannot wait for "
            "it (use rt_wait_stream on the capturing stream)",
            call, op);
}

rt_status rt_wait(rt_request *req) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_wait: NULL request");
    if (req->captured) return captured_host_wait(req, "rt_wait", true);
    rt_status s = rt_req_wait(req);
    if (s == RT_OK) s = dev_wait(req);
    rt_req_free(req);
    return s;
}

rt_status rt_wait_stream(rt_request *req, rt_stream *stream) {
    RT_REQUIRE(req != NULL, RT_ERR_INVALID, "rt_wait_stream: NULL request");
    if (req->captured) { /* the join of the capture: the stream waits on the device, nothing is watched */
        if (!stream || !rt_stream_native(stream)) return captured_host_wait(req, "rt_wait_stream", true);
        rt_status s = req->dev->stream_wait(req, stream);
        rt_pg_capture_forget(req->owner, false);
        rt_req_free(req);
        return s;
    }
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
    if (req->captured) return captured_host_wait(req, "rt_test", false);
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
    if (pg->tp && pg->tp->flight_refresh) pg->tp->flight_refresh(pg);
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
