/* Rendezvous key-value store: server thread (poll loop) and client (see store.h). */
#include "dist/store.h"

#include "core/log.h"
#include "core/timer.h"
#include "dist/internal/sock.h"
#include "dist/internal/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- server ---- */

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t n;
} kv;

typedef struct client {
    int fd;
    int rank;   /* -1: launcher or not yet known */
    bool hello; /* HELLO accepted */
    uint8_t *in;
    size_t in_len, in_cap;
    char *waiting_key; /* pending GET */
    bool waiting_get;  /* GET (true) or CHECK-style wait */
} client;

struct rt_store_server {
    int lfd;
    int wake[2]; /* pipe to stop the thread */
    pthread_t thread;
    char job[256];
    int world;
    kv *kvs;
    int nkv, capkv;
    client *cl;
    int ncl, capcl;
    uint8_t *joined; /* [world] */
    char **joined_from;
};

static kv *kv_find(rt_store_server *s, const char *key) {
    for (int i = 0; i < s->nkv; i++)
        if (strcmp(s->kvs[i].key, key) == 0) return &s->kvs[i];
    return NULL;
}

static int kv_set(rt_store_server *s, const char *key, const uint8_t *val, size_t n) {
    kv *e = kv_find(s, key);
    uint8_t *v = malloc(n ? n : 1);
    if (!v) return -1;
    if (n) memcpy(v, val, n);
    if (e) {
        free(e->val);
        e->val = v;
        e->n = n;
        return 0;
    }
    if (s->nkv == s->capkv) {
        int nc = s->capkv ? 2 * s->capkv : 64;
        kv *k = realloc(s->kvs, (size_t)nc * sizeof *k);
        if (!k) {
            free(v);
            return -1;
        }
        s->kvs = k;
        s->capkv = nc;
    }
    char *kd = strdup(key);
    if (!kd) {
        free(v);
        return -1;
    }
    s->kvs[s->nkv++] = (kv){kd, v, n};
    return 0;
}

static void reply(client *c, uint8_t status, const void *val, size_t n) {
    size_t cap = RT_STORE_HDR + n;
    uint8_t *buf = malloc(cap);
    if (!buf) return;
    size_t len = rt_store_frame_encode(buf, cap, RT_STORE_REPLY, status, NULL, 0, val, n);
    /* a reply is small; a client that does not read is dropped after 5 s */
    if (len && rt_sock_write_all(c->fd, buf, len, rt_now_ns() + 5000000000ull, "store client") != RT_OK)
        shutdown(c->fd, SHUT_RDWR);
    free(buf);
}

static void reply_err(client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply_err(client *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply(c, 1, msg, strlen(msg));
}

/* Handle one frame; returns -1 to drop the client. */
static int handle(rt_store_server *s, client *c, const rt_store_frame *f) {
    char key[RT_STORE_MAX_KEY + 1];
    memcpy(key, f->key, f->keylen);
    key[f->keylen] = '\0';
    if (!c->hello) {
        if (f->op != RT_STORE_HELLO) {
            reply_err(c, "store: the first frame must be HELLO (got op %u)", f->op);
            return -1;
        }
        char v[64] = "";
        size_t n = f->vallen < sizeof v - 1 ? f->vallen : sizeof v - 1;
        memcpy(v, f->value, n);
        int rank = -2, world = -2;
        if (sscanf(v, "%d %d", &rank, &world) != 2) {
            reply_err(c, "store: malformed HELLO value '%s'", v);
            return -1;
        }
        if (strcmp(key, s->job) != 0) {
            reply_err(c, "store: job id '%s' of rank %d does not match this store's job '%s' (a peer of another job?)",
                      key, rank, s->job);
            return -1;
        }
        if (world != s->world) {
            reply_err(c, "store: world size mismatch: rank %d says %d, the store expects %d", rank, world, s->world);
            return -1;
        }
        if (rank < -1 || rank >= s->world) {
            reply_err(c, "store: rank %d out of range 0..%d (world size %d)", rank, s->world - 1, s->world);
            return -1;
        }
        if (rank >= 0) {
            if (s->joined[rank]) {
                reply_err(c, "store: duplicate rank %d: rank %d already joined (two processes claim rank %d)", rank,
                          rank, rank);
                return -1;
            }
            s->joined[rank] = 1;
        }
        c->rank = rank;
        c->hello = true;
        reply(c, 0, NULL, 0);
        return 0;
    }
    switch (f->op) {
    case RT_STORE_SET:
        if (kv_set(s, key, f->value, f->vallen) != 0) {
            reply_err(c, "store: out of memory");
            return -1;
        }
        reply(c, 0, NULL, 0);
        /* wake waiters on this key */
        for (int i = 0; i < s->ncl; i++) {
            client *w = &s->cl[i];
            if (w->waiting_key && strcmp(w->waiting_key, key) == 0) {
                kv *e = kv_find(s, key);
                if (w->waiting_get)
                    reply(w, 0, e->val, e->n);
                else
                    reply(w, 0, NULL, 0);
                free(w->waiting_key);
                w->waiting_key = NULL;
            }
        }
        return 0;
    case RT_STORE_GET: {
        kv *e = kv_find(s, key);
        if (e) {
            reply(c, 0, e->val, e->n);
        } else {
            free(c->waiting_key);
            c->waiting_key = strdup(key);
            c->waiting_get = true;
        }
        return 0;
    }
    case RT_STORE_CHECK:
        reply(c, kv_find(s, key) ? 0 : 2, NULL, 0);
        return 0;
    case RT_STORE_ADD: {
        char v[32] = "";
        size_t n = f->vallen < sizeof v - 1 ? f->vallen : sizeof v - 1;
        memcpy(v, f->value, n);
        char *end = NULL;
        long long d = strtoll(v, &end, 10);
        if (end == v) {
            reply_err(c, "store: ADD delta '%s' is not an integer", v);
            return 0;
        }
        long long cur = 0;
        kv *e = kv_find(s, key);
        if (e) {
            char t[32] = "";
            memcpy(t, e->val, e->n < 31 ? e->n : 31);
            cur = strtoll(t, NULL, 10);
        }
        char out[32];
        int len = snprintf(out, sizeof out, "%lld", cur + d);
        /* ADD also wakes waiters (a counter key) */
        reply(c, 0, out, (size_t)len);
        if (kv_set(s, key, (const uint8_t *)out, (size_t)len) != 0) return -1;
        for (int i = 0; i < s->ncl; i++) {
            client *w = &s->cl[i];
            if (w != c && w->waiting_key && strcmp(w->waiting_key, key) == 0) {
                kv *e2 = kv_find(s, key);
                reply(w, 0, w->waiting_get ? e2->val : NULL, w->waiting_get ? e2->n : 0);
                free(w->waiting_key);
                w->waiting_key = NULL;
            }
        }
        return 0;
    }
    default:
        reply_err(c, "store: unexpected op %u", f->op);
        return -1;
    }
}

static void drop_client(rt_store_server *s, int i) {
    client *c = &s->cl[i];
    if (c->hello && c->rank >= 0) { /* "rt/left/<rank>": lets the host stop waiting for a rank that is gone */
        char key[32];
        snprintf(key, sizeof key, "rt/left/%d", c->rank);
        kv_set(s, key, (const uint8_t *)"1", 1);
    }
    close(c->fd);
    free(c->in);
    free(c->waiting_key);
    s->cl[i] = s->cl[--s->ncl];
}

static void *server_main(void *arg) {
    rt_store_server *s = arg;
    struct pollfd *pf = NULL;
    int pcap = 0;
    for (;;) {
        int np = s->ncl + 2;
        if (np > pcap) {
            struct pollfd *n = realloc(pf, (size_t)np * sizeof *n);
            if (!n) break;
            pf = n;
            pcap = np;
        }
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){s->lfd, POLLIN, 0};
        for (int i = 0; i < s->ncl; i++) pf[i + 2] = (struct pollfd){s->cl[i].fd, POLLIN, 0};
        int pr = poll(pf, (nfds_t)np, -1);
        if (pr < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        int ncl_before = s->ncl;
        for (int i = ncl_before - 1; i >= 0; i--) {
            if (!pf[i + 2].revents) continue;
            client *c = &s->cl[i];
            if (c->in_cap - c->in_len < 65536) {
                size_t nc = c->in_cap ? c->in_cap * 2 : 65536;
                if (nc > RT_STORE_HDR + RT_STORE_MAX_KEY + RT_STORE_MAX_VALUE + 65536) nc = c->in_cap;
                uint8_t *nb = nc != c->in_cap ? realloc(c->in, nc) : c->in;
                if (!nb) {
                    drop_client(s, i);
                    continue;
                }
                c->in = nb;
                c->in_cap = nc;
            }
            ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                drop_client(s, i);
                continue;
            }
            c->in_len += (size_t)r;
            bool drop = false;
            for (;;) {
                rt_store_frame f;
                size_t used = 0;
                if (rt_store_frame_parse(c->in, c->in_len, &f, &used) != RT_OK) {
                    RT_LOG_WARN("store: dropping a client: %s", rt_error_message());
                    reply_err(c, "store: malformed frame");
                    drop = true;
                    break;
                }
                if (used == 0) break;
                if (handle(s, c, &f) != 0) {
                    drop = true;
                    break;
                }
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
            }
            if (drop) drop_client(s, i);
        }
        if (pf[1].revents & POLLIN) {
            int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                if (s->ncl == s->capcl) {
                    int nc = s->capcl ? 2 * s->capcl : 16;
                    client *n = realloc(s->cl, (size_t)nc * sizeof *n);
                    if (!n) {
                        close(fd);
                        continue;
                    }
                    s->cl = n;
                    s->capcl = nc;
                }
                rt_sock_set_nodelay(fd);
                s->cl[s->ncl++] = (client){.fd = fd, .rank = -1};
            }
        }
    }
    free(pf);
    return NULL;
}

rt_status rt_store_server_start(const char *host, int port, const char *job, int world, rt_store_server **out,
                                int *bound_port) {
    RT_REQUIRE(world >= 1, RT_ERR_INVALID, "store: world size %d must be >= 1", world);
    RT_REQUIRE(strlen(job) < 256, RT_ERR_INVALID, "store: job id longer than 255 bytes");
    rt_store_server *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    s->joined = calloc((size_t)world, 1);
    if (!s->joined) {
        free(s);
        RT_CHECK_ALLOC(NULL, (size_t)world);
    }
    snprintf(s->job, sizeof s->job, "%s", job);
    s->world = world;
    rt_status st = rt_sock_listen(host, port, &s->lfd, bound_port);
    if (st != RT_OK) {
        free(s->joined);
        free(s);
        rt_error_trace(__FILE__, __LINE__, "rt_sock_listen (store)");
        return st;
    }
    if (pipe2(s->wake, O_CLOEXEC) < 0 || pthread_create(&s->thread, NULL, server_main, s) != 0) {
        st = rt_error_sys(__FILE__, __LINE__, "store server thread");
        close(s->lfd);
        free(s->joined);
        free(s);
        return st;
    }
    *out = s;
    return RT_OK;
}

void rt_store_server_stop(rt_store_server *s) {
    if (!s) return;
    if (write(s->wake[1], "x", 1) < 0) { /* the thread also ends when the pipe closes */
    }
    pthread_join(s->thread, NULL);
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->lfd);
    for (int i = 0; i < s->ncl; i++) {
        close(s->cl[i].fd);
        free(s->cl[i].in);
        free(s->cl[i].waiting_key);
    }
    for (int i = 0; i < s->nkv; i++) {
        free(s->kvs[i].key);
        free(s->kvs[i].val);
    }
    free(s->kvs);
    free(s->cl);
    free(s->joined);
    free(s);
}

/* ---------------------------------------------------------------- client ---- */

struct rt_store {
    int fd;
    pthread_mutex_t mu;
    double timeout_s;
    bool broken;
    char where[300];
    char local[64];
};

const char *rt_store_local_addr(const rt_store *st) { return st->local; }
void rt_store_set_timeout(rt_store *st, double timeout_s) { st->timeout_s = timeout_s; }

/* Send a request and read the reply. The value is copied into buf (cap bytes). */
static rt_status request(rt_store *st, uint8_t op, const char *key, const void *val, size_t n, void *buf, size_t cap,
                         size_t *out_n, uint8_t *status, double timeout_s) {
    size_t keylen = strlen(key);
    RT_REQUIRE(keylen <= RT_STORE_MAX_KEY, RT_ERR_INVALID, "store key '%.40s...' longer than %d bytes", key,
               RT_STORE_MAX_KEY);
    RT_REQUIRE(n <= RT_STORE_MAX_VALUE, RT_ERR_INVALID, "store value of %zu bytes over the limit %u", n,
               RT_STORE_MAX_VALUE);
    if (st->broken)
        return RT_ERROR(RT_ERR_PEER, "store connection to %s is broken by an earlier error or timeout", st->where);
    size_t cap_frame = RT_STORE_HDR + keylen + n;
    uint8_t *frame = malloc(cap_frame);
    RT_CHECK_ALLOC(frame, cap_frame);
    size_t len = rt_store_frame_encode(frame, cap_frame, op, 0, key, keylen, val, n);
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    rt_status s = rt_sock_write_all(st->fd, frame, len, deadline, st->where);
    free(frame);
    uint8_t hdr[RT_STORE_HDR];
    if (s == RT_OK) s = rt_sock_read_all(st->fd, hdr, sizeof hdr, deadline, st->where);
    rt_store_frame f;
    if (s == RT_OK) {
        s = rt_store_header_parse(hdr, &f);
        if (s == RT_OK && f.keylen != 0) s = RT_ERROR(RT_ERR_FORMAT, "store reply with a key");
    }
    uint8_t *v = NULL;
    if (s == RT_OK) {
        if (f.op != RT_STORE_REPLY) s = RT_ERROR(RT_ERR_FORMAT, "store sent op %u instead of a reply", f.op);
    }
    if (s == RT_OK && f.vallen) {
        v = malloc(f.vallen);
        if (!v) s = RT_ERROR(RT_ERR_NOMEM, "out of memory (%u bytes)", f.vallen);
        if (s == RT_OK) s = rt_sock_read_all(st->fd, v, f.vallen, deadline, st->where);
    }
    if (s != RT_OK) {
        st->broken = true;
        free(v);
        if (s == RT_ERR_TIMEOUT)
            return RT_ERROR(RT_ERR_TIMEOUT, "store request for key '%s' timed out after %.1f s (%s)", key, timeout_s,
                            st->where);
        rt_error_trace(__FILE__, __LINE__, "store request");
        return s;
    }
    *status = f.status;
    if (f.status == 1) {
        char msg[600];
        snprintf(msg, sizeof msg, "%.*s", (int)f.vallen, v ? (const char *)v : "");
        free(v);
        return RT_ERROR(RT_ERR_PEER, "%s", msg);
    }
    if (out_n) *out_n = f.vallen;
    if (buf && cap) memcpy(buf, v ? v : (uint8_t *)"", f.vallen < cap ? f.vallen : cap);
    free(v);
    return RT_OK;
}

rt_status rt_store_connect(const char *host, int port, const char *job, int rank, int world, double timeout_s,
                           rt_store **out) {
    rt_store *st = calloc(1, sizeof *st);
    RT_CHECK_ALLOC(st, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->timeout_s = timeout_s;
    snprintf(st->where, sizeof st->where, "store at %s:%d", host, port);
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    rt_status s = rt_sock_connect(host, port, deadline, st->where, &st->fd);
    if (s != RT_OK) {
        free(st);
        rt_error_trace(__FILE__, __LINE__, "rt_sock_connect (store)");
        return s;
    }
    rt_sock_local_addr(st->fd, st->local, sizeof st->local);
    char v[64];
    snprintf(v, sizeof v, "%d %d", rank, world);
    uint8_t status = 0;
    s = request(st, RT_STORE_HELLO, job, v, strlen(v), NULL, 0, NULL, &status, timeout_s);
    if (s != RT_OK) {
        close(st->fd);
        free(st);
        rt_error_trace(__FILE__, __LINE__, "store hello");
        return s;
    }
    *out = st;
    return RT_OK;
}

void rt_store_close(rt_store *st) {
    if (!st) return;
    close(st->fd);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

rt_status rt_store_set(rt_store *st, const char *key, const void *value, size_t n) {
    uint8_t status;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_SET, key, value, n, NULL, 0, NULL, &status, st->timeout_s);
    pthread_mutex_unlock(&st->mu);
    return s;
}

rt_status rt_store_get(rt_store *st, const char *key, void *buf, size_t cap, size_t *n) {
    uint8_t status;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_GET, key, NULL, 0, buf, cap, n, &status, st->timeout_s);
    pthread_mutex_unlock(&st->mu);
    return s;
}

rt_status rt_store_add(rt_store *st, const char *key, int64_t delta, int64_t *total) {
    char v[32], r[32] = "";
    snprintf(v, sizeof v, "%" PRId64, delta);
    size_t n = 0;
    uint8_t status;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_ADD, key, v, strlen(v), r, sizeof r - 1, &n, &status, st->timeout_s);
    pthread_mutex_unlock(&st->mu);
    if (s != RT_OK) return s;
    r[n < sizeof r ? n : sizeof r - 1] = '\0';
    if (total) *total = strtoll(r, NULL, 10);
    return RT_OK;
}

rt_status rt_store_check(rt_store *st, const char *key, bool *exists) {
    uint8_t status = 0;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_CHECK, key, NULL, 0, NULL, 0, NULL, &status, st->timeout_s);
    pthread_mutex_unlock(&st->mu);
    if (s == RT_OK) *exists = status == 0;
    return s;
}

rt_status rt_store_wait(rt_store *st, const char *const *keys, int n) {
    for (int i = 0; i < n; i++) {
        size_t len;
        RT_CHECK(rt_store_get(st, keys[i], NULL, 0, &len));
    }
    return RT_OK;
}
