/* The shm transport (transport.h): ranks on one host.
 *
 * Per pair of ranks (lo < hi) one shared-memory segment: a 4 KiB header page with two
 * single-producer single-consumer rings' counters, then the data of lo -> hi (cap bytes,
 * a power of two: RINGTRAIN_SHM_RING_BYTES) and of hi -> lo. Per rank one page with its
 * wake-up word (the bell). Senders copy into the ring; receivers peek at the bytes in the
 * ring and reduce them straight into the destination. The rendezvous' tcp sockets stay
 * open as control lines: they carry no data, so EOF says that the peer died and one 'A'
 * byte that it aborted after an error of its own.
 *
 * Segments are anonymous by default: memfd_create() (no name anywhere, so nothing can be
 * left behind whenever a rank dies), and peers open the creator's descriptor through
 * /proc/<pid>/fd/<n> (published through the store). RINGTRAIN_SHM_NAMED=1 uses named
 * shm_open() segments instead (for systems where /proc of a sibling process cannot be
 * opened); those are unlinked by their creator as soon as every rank has mapped them, and
 * their names carry RINGTRAIN_LAUNCH_ID: ringtrain's launcher removes the names of its
 * launch that a rank killed during setup left behind (launch.c, remove_segments).
 *
 * Waiting: the engine spins, yields, then sleeps here on the futex bell (see shm_sleep).
 */
#include "dist/internal/pg_internal.h"

#include "core/settings.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* One direction of a ring: the producer advances head, the consumer tail (both count
 * bytes since the start; the data index is value % cap). */
typedef struct shm_ring {
    _Atomic uint64_t head;
    char pad0[56];
    _Atomic uint64_t tail;
    char pad1[56];
} shm_ring;

/* Per-rank wake-up word: peers bump seq when they produce data for or consume data from
 * this rank, and futex-wake it only while it sleeps. */
typedef struct shm_bell {
    _Atomic uint32_t seq;
    _Atomic uint32_t waiting;
    char pad[56];
} shm_bell;

/* ---- the segment layout ---- */

#define SHM_PAGE 4096 /* a bell's page, and a pair segment's header page */
_Static_assert(2 * sizeof(shm_ring) <= SHM_PAGE, "both rings' counters fit the header page");
_Static_assert(sizeof(shm_bell) <= SHM_PAGE, "the bell fits its page");

/* direction 0: lo -> hi, 1: hi -> lo */
static size_t seg_bytes(size_t cap) { return SHM_PAGE + 2 * cap; }
static shm_ring *seg_ring(void *seg, int dir) { return (shm_ring *)seg + dir; }
static uint8_t *seg_data(void *seg, size_t cap, int dir) { return (uint8_t *)seg + SHM_PAGE + (size_t)dir * cap; }

/* A channel's state. */
typedef struct shm_chan {
    shm_ring *tx, *rx;
    uint8_t *txd, *rxd;
    size_t cap;          /* ring capacity (power of two) */
    size_t piece;        /* bytes published per send step */
    shm_bell *peer_bell; /* in its own mapping */
    void *seg;
    size_t seglen;
} shm_chan;

/* ---- wake-ups ----
 * Dekker style, both sides fenced: a sleeper sets `waiting`, fences, re-checks the rings,
 * then sleeps on `seq` if nothing changed; a producer or consumer publishes its head/tail,
 * fences, and only if `waiting` is set bumps `seq` and wakes. While nobody sleeps (the
 * spinning phase) a transfer costs no atomic read-modify-write and no system call. */

static void bell_ring(shm_bell *b) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&b->waiting, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
        syscall(SYS_futex, &b->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

/* always wakes: another thread of the same rank submitted work */
static void bell_force(shm_bell *b) {
    atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
    syscall(SYS_futex, &b->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* sleep while seq == seen, at most timeout_ms (the caller set `waiting` and re-checked) */
static void bell_wait(shm_bell *b, uint32_t seen, int timeout_ms) {
    if (atomic_load_explicit(&b->seq, memory_order_seq_cst) == seen) {
        struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
        syscall(SYS_futex, &b->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}

/* ---- the data path ---- */

static rt_status shm_send(rt_chan *ch, const void *p, size_t n, size_t *moved) {
    shm_chan *c = ch->state;
    uint64_t head = atomic_load_explicit(&c->tx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
    size_t free_b = c->cap - (size_t)(head - tail);
    if (n > free_b) n = free_b;
    if (n > c->piece) n = c->piece;
    *moved = n;
    if (n == 0) return RT_OK;
    size_t off = (size_t)(head & (c->cap - 1));
    size_t first = c->cap - off < n ? c->cap - off : n;
    memcpy(c->txd + off, p, first);
    if (first < n) memcpy(c->txd, (const uint8_t *)p + first, n - first);
    atomic_store_explicit(&c->tx->head, head + n, memory_order_release);
    bell_ring(c->peer_bell);
    return RT_OK;
}

static void ring_peek(shm_chan *c, const uint8_t **p, size_t *avail) {
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
    size_t n = (size_t)(head - tail);
    size_t off = (size_t)(tail & (c->cap - 1));
    if (n > c->cap - off) n = c->cap - off;
    *p = c->rxd + off;
    *avail = n;
}

static rt_status shm_peek(rt_chan *ch, const uint8_t **p, size_t *avail) {
    ring_peek(ch->state, p, avail);
    return RT_OK;
}

static void shm_consume(rt_chan *ch, size_t n) {
    shm_chan *c = ch->state;
    uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
    atomic_store_explicit(&c->rx->tail, tail + n, memory_order_release);
    bell_ring(c->peer_bell);
}

static rt_status shm_recv(rt_chan *ch, void *dst, size_t n, size_t *moved) {
    shm_chan *c = ch->state;
    *moved = 0;
    if (n == 0) return RT_OK;
    uint8_t *d = dst;
    for (int k = 0; k < 2 && *moved < n; k++) {
        const uint8_t *p;
        size_t avail;
        ring_peek(c, &p, &avail);
        if (avail == 0) break;
        size_t m = avail < n - *moved ? avail : n - *moved;
        memcpy(d + *moved, p, m);
        *moved += m;
        /* publish per piece so that the producer can refill while we copy */
        uint64_t tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
        atomic_store_explicit(&c->rx->tail, tail + m, memory_order_release);
    }
    if (*moved) bell_ring(c->peer_bell);
    return RT_OK;
}

static void shm_close(rt_chan *ch) {
    shm_chan *c = ch->state;
    if (!c) return;
    if (c->seg) munmap(c->seg, c->seglen);
    if (c->peer_bell) munmap(c->peer_bell, SHM_PAGE);
    free(c);
    ch->state = NULL;
}

/* the control line carries no data, so one byte says "aborted, not dead" */
static void shm_abort(rt_chan *ch) {
    if (send(ch->fd, "A", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    }
}

/* ---- the engine's waits ---- */

/* Liveness of the peers: their control lines must stay silent and open. */
static rt_status check_control(rt_engine *e) {
    struct pollfd pf[64];
    int idx[64], n = 0;
    for (int i = 0; i < e->world; i++) {
        rt_chan *c = &e->ch[i];
        if (c->fd < 0 || !(c->sq_head || c->rq_head)) continue;
        if (n == 64) break;
        pf[n] = (struct pollfd){c->fd, POLLIN, 0};
        idx[n++] = i;
    }
    if (n == 0 || poll(pf, (nfds_t)n, 0) <= 0) return RT_OK;
    /* prefer a peer that died (EOF) over one that aborted because of it (an 'A' byte) */
    int dead = -1, aborted = -1;
    for (int k = 0; k < n; k++) {
        if (!pf[k].revents) continue;
        char b = 0;
        ssize_t r = recv(pf[k].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 1 && b == 'A') {
            if (aborted < 0) aborted = idx[k];
        } else if (dead < 0) {
            dead = idx[k];
        }
    }
    int who = dead >= 0 ? dead : aborted;
    if (who >= 0) {
        rt_chan *c = &e->ch[who];
        rt_xfer *x = c->rq_head ? c->rq_head : c->sq_head;
        return RT_ERROR(
            RT_ERR_PEER, "%s (group %u, op #%u) failed: peer rank %d %s", x->req->opname, x->hdr.group, x->hdr.seq, who,
            dead >= 0 ? "closed its connection (the process died)" : "aborted the operation after an error of its own");
    }
    return RT_OK;
}

/* Sleep on this rank's bell: announce it, re-check (a pass), look at the control lines,
 * then wait (at most 100 ms at a time). mu held, dropped for the wait. */
static rt_status shm_sleep(rt_engine *e, int max_ms) {
    shm_bell *bell = e->tp_state;
    atomic_store_explicit(&bell->waiting, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t seen = atomic_load_explicit(&bell->seq, memory_order_seq_cst);
    bool moved = false;
    rt_status s = rt_engine_pass(e, &moved);
    if (s == RT_OK && !moved) {
        s = check_control(e);
        if (s == RT_OK) {
            pthread_mutex_unlock(&e->mu);
            bell_wait(bell, seen, max_ms < 100 ? max_ms : 100);
            pthread_mutex_lock(&e->mu);
        }
    }
    atomic_store_explicit(&bell->waiting, 0, memory_order_relaxed);
    return s;
}

static void shm_wake(rt_engine *e) {
    if (e->tp_state) bell_force(e->tp_state);
}

static void shm_engine_close(rt_engine *e) {
    if (e->tp_state) munmap(e->tp_state, SHM_PAGE);
    e->tp_state = NULL;
}

/* ---- setup ---- */

typedef struct shm_setup_ctx {
    rt_pg_world *w;
    bool named;  /* RINGTRAIN_SHM_NAMED, read once */
    char id[34]; /* named: "<RINGTRAIN_LAUNCH_ID>-" ("" when unset; names fit 128 bytes), read once */
    int *fds;    /* [world]: this rank's memfds, closed once every rank mapped them */
} shm_setup_ctx;

/* RINGTRAIN_SHM_RING_BYTES rounded up to a power of two */
static rt_status shm_ring_bytes(size_t *cap) {
    int64_t want = 0;
    RT_CHECK(rt_setting_int(RT_SET_SHM_RING_BYTES, &want));
    *cap = 4096;
    while (*cap < (size_t)want && *cap < (1u << 30)) *cap <<= 1;
    return RT_OK;
}

static rt_status shm_map(const char *name, size_t len, bool create, void **out) {
    int fd = shm_open(name, create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
    if (fd < 0) return RT_ERROR(RT_ERR_SYS, "shm_open(%s): %s", name, strerror(errno));
    if (create && ftruncate(fd, (off_t)len) < 0) {
        int er = errno;
        close(fd);
        shm_unlink(name);
        return RT_ERROR(RT_ERR_SYS, "ftruncate(%s, %zu): %s (is /dev/shm big enough?)", name, len, strerror(er));
    }
    struct stat st = {0};
    if (!create && (fstat(fd, &st) != 0 || (size_t)st.st_size != len)) { /* mapped beyond its end: SIGBUS */
        close(fd);
        return RT_ERROR(RT_ERR_PEER,
                        "shm: the peer's segment %s has %lld bytes, expected %zu (is RINGTRAIN_SHM_RING_BYTES the "
                        "same on every rank?)",
                        name, (long long)st.st_size, len);
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (create) shm_unlink(name);
        return RT_ERROR(RT_ERR_SYS, "mmap(%s, %zu): %s", name, len, strerror(errno));
    }
    *out = p;
    return RT_OK;
}

#define SHM_ID_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."

/* RINGTRAIN_LAUNCH_ID as the start of this rank's segment names ("<id>-"; "" when unset).
 * No '-' in it: "ringtrain-<id>-" then prefixes this launch's names and no other's. */
static rt_status shm_launch_id(char *out, size_t n) {
    const char *id = rt_setting_text(RT_SET_LAUNCH_ID);
    out[0] = '\0';
    if (!id) return RT_OK;
    size_t len = strlen(id);
    RT_REQUIRE(len + 2 <= n && strspn(id, SHM_ID_CHARS) == len, RT_ERR_INVALID,
               "RINGTRAIN_LAUNCH_ID='%.80s': expected at most %zu letters, digits, '_' or '.'", id, n - 2);
    snprintf(out, n, "%s-", id);
    return RT_OK;
}

/* /dev/shm names: ringtrain-[LAUNCH_ID-][TAG-]TOKEN-b<rank> (bell) and -p<lo>-<hi> (pair
 * rings), with `id` the creator's "<launch id>-". RINGTRAIN_SHM_TAG (tests) makes them easy
 * to look for. */
static void shm_name(char *buf, size_t n, const char *id, const rt_pg_world *w, int a, int b) {
    const char *tag = rt_setting_text(RT_SET_SHM_TAG);
    char t[48] = "";
    if (tag) snprintf(t, sizeof t, "%.40s-", tag);
    if (b < 0)
        snprintf(buf, n, "/ringtrain-%s%s%.16s-b%d", id, t, w->tokhex, a);
    else
        snprintf(buf, n, "/ringtrain-%s%s%.16s-p%d-%d", id, t, w->tokhex, a, b);
}

static void shm_unlink_mine(const shm_setup_ctx *x) {
    rt_engine *e = &x->w->eng;
    char name[128];
    shm_name(name, sizeof name, x->id, x->w, e->rank, -1);
    shm_unlink(name);
    for (int j = e->rank + 1; j < e->world; j++) {
        shm_name(name, sizeof name, x->id, x->w, e->rank, j);
        shm_unlink(name);
    }
}

/* Segment (a, b) (b < 0: rank a's bell), created by rank a; *fd_keep: its memfd (-1: named). */
static rt_status seg_create(shm_setup_ctx *x, int a, int b, size_t len, void **out, int *fd_keep) {
    rt_pg_world *w = x->w;
    char name[128], key[64];
    shm_name(name, sizeof name, x->id, w, a, b);
    snprintf(key, sizeof key, "rt/shm/fd/%d/%d", a, b);
    *fd_keep = -1;
    if (x->named) { /* the name, for peers under another launcher (another launch id) */
        RT_CHECK(shm_map(name, len, true, out));
        rt_status s = rt_store_set(w->store, key, name, strlen(name));
        if (s != RT_OK) munmap(*out, len);
        return s;
    }
    int fd = memfd_create(name + 1, MFD_CLOEXEC);
    if (fd < 0) return RT_ERROR(RT_ERR_SYS, "memfd_create(%s): %s", name + 1, strerror(errno));
    if (ftruncate(fd, (off_t)len) < 0) {
        int er = errno;
        close(fd);
        return RT_ERROR(RT_ERR_SYS, "ftruncate(memfd %s, %zu): %s", name + 1, len, strerror(er));
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int er = errno;
        close(fd);
        return RT_ERROR(RT_ERR_SYS, "mmap(memfd %s, %zu): %s", name + 1, len, strerror(er));
    }
    char val[64];
    int n = snprintf(val, sizeof val, "%d %d", (int)getpid(), fd);
    rt_status s = rt_store_set(w->store, key, val, (size_t)n);
    if (s != RT_OK) {
        munmap(p, len);
        close(fd);
        return s;
    }
    *out = p;
    *fd_keep = fd;
    return RT_OK;
}

rt_status rt_shm_peer_open(const char *path, const char *memfd_name, size_t len, int *fd) {
    *fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0)
        return RT_ERROR(RT_ERR_SYS,
                        "shm: cannot open a peer's segment %s: %s (different pid namespaces or a locked-down "
                        "/proc? set RINGTRAIN_SHM_NAMED=1, or use transport tcp)",
                        path, strerror(errno));
    /* the name of what opened (not of `path` again: its pid may be reused meanwhile) */
    char self[64], link[300], want[300];
    snprintf(self, sizeof self, "/proc/self/fd/%d", *fd);
    ssize_t n = readlink(self, link, sizeof link - 1);
    link[n > 0 ? n : 0] = '\0';
    int wl = snprintf(want, sizeof want, "/memfd:%s", memfd_name);
    bool named =
        n > 0 && strncmp(link, want, (size_t)wl) == 0 && (link[wl] == '\0' || strcmp(link + wl, " (deleted)") == 0);
    struct stat st = {0};
    bool sized = fstat(*fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == len;
    if (named && sized) return RT_OK;
    close(*fd);
    *fd = -1;
    if (!named)
        return RT_ERROR(RT_ERR_PEER,
                        "shm: %s is '%s', not the peer's segment (memfd '%s'): its process is gone and the pid "
                        "reused, or the store was tampered with",
                        path, link, memfd_name);
    return RT_ERROR(RT_ERR_PEER, "shm: the peer's segment %s has %lld bytes, expected %zu", path, (long long)st.st_size,
                    len);
}

/* Named: map the name rank a published for segment (a, b): "/ringtrain-", then the
 * creator's "<launch id>-" if any, then what this rank names it without its own id. */
static rt_status named_open(shm_setup_ctx *x, int a, int b, size_t len, const char *val, void **out) {
    char want[128];
    shm_name(want, sizeof want, "", x->w, a, b);
    const size_t pre = strlen("/ringtrain-"), vl = strlen(val), tl = strlen(want) - pre;
    bool ok = vl >= pre + tl && strncmp(val, want, pre) == 0 && strcmp(val + vl - tl, want + pre) == 0;
    size_t m = ok ? vl - pre - tl : 0; /* the launch id and its '-' */
    if (m > 0) ok = m >= 2 && val[pre + m - 1] == '-' && strspn(val + pre, SHM_ID_CHARS) == m - 1;
    RT_REQUIRE(ok, RT_ERR_PEER, "rank %d published a malformed segment name '%.100s' (expected /ringtrain-[<id>-]%s)",
               a, val, want + pre);
    return shm_map(val, len, false, out);
}

/* Map segment (a, b), created by rank a. */
static rt_status seg_open(shm_setup_ctx *x, int a, int b, size_t len, void **out) {
    rt_pg_world *w = x->w;
    char name[128];
    shm_name(name, sizeof name, "", w, a, b);
    char key[64], val[128] = "", path[96];
    size_t n = 0;
    snprintf(key, sizeof key, "rt/shm/fd/%d/%d", a, b);
    RT_CHECK(rt_store_get(w->store, key, val, sizeof val - 1, &n));
    val[n] = '\0';
    if (x->named) return named_open(x, a, b, len, val, out);
    int pid = 0, fdn = -1;
    RT_REQUIRE(sscanf(val, "%d %d", &pid, &fdn) == 2 && pid > 0 && fdn >= 0, RT_ERR_PEER,
               "rank %d published a malformed segment '%s'", a, val);
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fdn);
    int fd = -1;
    rt_status st = rt_shm_peer_open(path, name + 1, len, &fd);
    if (st != RT_OK) {
        char what[64];
        snprintf(what, sizeof what, "rank %d's segment", a);
        rt_error_trace(__FILE__, __LINE__, what);
        return st;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return RT_ERROR(RT_ERR_SYS, "mmap(%s, %zu): %s", path, len, strerror(errno));
    *out = p;
    return RT_OK;
}

/* The channel to peer j over its pair's segment. */
static void chan_attach(shm_chan *c, int me, int j, size_t cap) {
    int out = me < j ? 0 : 1; /* the direction this rank writes */
    c->tx = seg_ring(c->seg, out);
    c->rx = seg_ring(c->seg, 1 - out);
    c->txd = seg_data(c->seg, cap, out);
    c->rxd = seg_data(c->seg, cap, 1 - out);
    c->cap = cap;
    c->piece = cap / 4;
}

static rt_status setup_(shm_setup_ctx *x, double timeout_s) {
    rt_pg_world *w = x->w;
    rt_engine *e = &w->eng;
    size_t cap = 0;
    RT_CHECK(shm_ring_bytes(&cap));
    size_t seglen = seg_bytes(cap);
    /* every channel is shm from here on: the engine's close frees what is mapped */
    for (int j = 0; j < e->world; j++) {
        if (j == e->rank) continue;
        e->ch[j].state = calloc(1, sizeof(shm_chan));
        RT_CHECK_ALLOC(e->ch[j].state, sizeof(shm_chan));
        e->ch[j].ops = &rt_tp_shm;
    }
    e->tp = &rt_tp_shm;
    char key[64];
    void *p;
    RT_CHECK(seg_create(x, e->rank, -1, SHM_PAGE, &p, &x->fds[e->rank]));
    e->tp_state = p;
    for (int j = e->rank + 1; j < e->world; j++) {
        shm_chan *c = e->ch[j].state;
        RT_CHECK(seg_create(x, e->rank, j, seglen, &c->seg, &x->fds[j]));
        c->seglen = seglen;
    }
    snprintf(key, sizeof key, "rt/shm/c/%d", e->rank);
    RT_CHECK(rt_store_set(w->store, key, "1", 1));
    RT_CHECK(rt_pg_wait_ranks(w->store, "rt/shm/c/", e->world, timeout_s, "shm setup"));
    for (int j = 0; j < e->world; j++) {
        if (j == e->rank) continue;
        shm_chan *c = e->ch[j].state;
        RT_CHECK(seg_open(x, j, -1, SHM_PAGE, &p));
        c->peer_bell = p;
        if (j < e->rank) {
            RT_CHECK(seg_open(x, j, e->rank, seglen, &c->seg));
            c->seglen = seglen;
        }
        chan_attach(c, e->rank, j, cap);
    }
    snprintf(key, sizeof key, "rt/shm/m/%d", e->rank);
    RT_CHECK(rt_store_set(w->store, key, "1", 1));
    RT_CHECK(rt_pg_wait_ranks(w->store, "rt/shm/m/", e->world, timeout_s, "shm setup"));
    return RT_OK;
}

static rt_status shm_setup(rt_pg *pg, const rt_transport_setup *s) {
    rt_pg_world *w = pg->w;
    shm_setup_ctx x = {.w = w};
    RT_CHECK(rt_setting_bool(RT_SET_SHM_NAMED, &x.named));
    if (x.named) RT_CHECK(shm_launch_id(x.id, sizeof x.id));
    x.fds = malloc((size_t)w->eng.world * sizeof *x.fds);
    RT_CHECK_ALLOC(x.fds, (size_t)w->eng.world * sizeof(int));
    for (int i = 0; i < w->eng.world; i++) x.fds[i] = -1;
    rt_status st = setup_(&x, s->timeout_s);
    /* every rank mapped the segments (or setup failed): drop the names and descriptors */
    if (x.named) shm_unlink_mine(&x);
    for (int i = 0; i < w->eng.world; i++)
        if (x.fds[i] >= 0) close(x.fds[i]);
    free(x.fds);
    return st;
}

static rt_status shm_can_connect(rt_pg *pg, const rt_transport_setup *s) {
    (void)pg;
    RT_REQUIRE(s->same_host, RT_ERR_INVALID,
               "transport shm needs all ranks on one host; they are not (use tcp or auto)");
    return RT_OK;
}

const rt_transport_ops rt_tp_shm = {
    .name = "shm",
    .kind = RT_TRANSPORT_SHM,
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .run = rt_run_host,
    .send = shm_send,
    .peek = shm_peek,
    .consume = shm_consume,
    .recv = shm_recv,
    .close = shm_close,
    .abort = shm_abort,
    .yield_before_sleep = true,
    .sleep = shm_sleep,
    .wake = shm_wake,
    .engine_close = shm_engine_close,
};
