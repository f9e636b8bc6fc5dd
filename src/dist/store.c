/* Rendezvous key-value store: server thread (poll loop) and client (see store.h). */
#include "dist/store.h"

#include "core/log.h"
#include "core/timer.h"
#include "dist/internal/auth.h"
#include "dist/internal/sock.h"
#include "dist/internal/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- server ---- */

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t n;
} kv;

/* A connection that has not proven the secret holds only `pre` (one HELLO frame), for at
 * most RT_STORE_HANDSHAKE_S; at most RT_STORE_MAX_PENDING of them exist at once (the
 * oldest goes when another arrives). */
typedef struct client {
    int fd;
    int rank;                     /* -1: launcher or not yet known */
    bool hello;                   /* proof accepted */
    uint8_t nonce[RT_AUTH_NONCE]; /* the challenge it was sent */
    uint64_t deadline_ns;         /* handshake deadline (before hello) */
    uint8_t pre[RT_STORE_HDR + RT_STORE_HELLO_BYTES];
    char addr[64]; /* "ip:port" of the peer */
    uint8_t *in;   /* after hello */
    size_t in_len, in_cap;
    char *waiting_key; /* pending GET */
    bool waiting_get;  /* GET (true) or CHECK-style wait */
} client;

struct rt_store_server {
    int lfd;
    int wake[2];  /* pipe to stop the thread */
    int spare_fd; /* kept open to be closed when accept() meets EMFILE (see accept_one) */
    uint64_t accept_paused_until;
    pthread_t thread;
    char secret[256];
    int world;
    kv *kvs;
    int nkv, capkv;
    client *cl;
    int ncl, capcl;
    int npending;    /* clients without hello */
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

/* A client that has not proven the secret gets at most a frame the socket buffer takes at
 * once: never block the server thread on it. */
static void send_nowait(client *c, const uint8_t *buf, size_t len) {
    if (send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len) shutdown(c->fd, SHUT_RDWR);
}

static void reply(client *c, uint8_t status, const void *val, size_t n) {
    size_t cap = RT_STORE_HDR + n;
    uint8_t *buf = malloc(cap);
    if (!buf) return;
    size_t len = rt_store_frame_encode(buf, cap, RT_STORE_REPLY, status, NULL, 0, val, n);
    if (!c->hello) {
        if (len) send_nowait(c, buf, len);
    } else if (len && rt_sock_write_all(c->fd, buf, len, rt_now_ns() + 5000000000ull, "store client") != RT_OK) {
        /* a client that does not read its reply is dropped after 5 s */
        shutdown(c->fd, SHUT_RDWR);
    }
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

/* The one answer to every client that did not prove the secret: it names nothing. */
static void refuse(client *c) { reply(c, 1, RT_AUTH_REFUSED, strlen(RT_AUTH_REFUSED)); }

/* The HELLO of a client without one yet; returns -1 to drop it. */
static int handle_hello(rt_store_server *s, client *c, const rt_store_frame *f) {
    rt_store_hello h;
    uint8_t proof[RT_AUTH_MAC];
    if (f->op != RT_STORE_HELLO || f->keylen != 0 ||
        rt_auth_store_verify(s->secret, c->nonce, f->value, f->vallen, &h, proof) != RT_OK) {
        rt_error_clear();
        refuse(c);
        return -1;
    }
    /* the proof holds: from here on the client is one of this job's processes */
    c->hello = true;
    s->npending--;
    if (h.world != s->world) {
        reply_err(c, "store: world size mismatch: rank %d says %d, the store expects %d", (int)h.rank, (int)h.world,
                  s->world);
        return -1;
    }
    if (h.rank >= 0) {
        if (s->joined[h.rank]) {
            reply_err(c, "store: rank %d already joined from %s (two processes claim rank %d)", (int)h.rank,
                      s->joined_from[h.rank] ? s->joined_from[h.rank] : "?", (int)h.rank);
            return -1;
        }
        s->joined[h.rank] = 1;
        s->joined_from[h.rank] = strdup(c->addr);
    }
    c->rank = h.rank;
    reply(c, 0, proof, sizeof proof);
    return 0;
}

/* Handle one frame of a client past its hello; returns -1 to drop it. */
static int handle(rt_store_server *s, client *c, const rt_store_frame *f) {
    char key[RT_STORE_MAX_KEY + 1];
    memcpy(key, f->key, f->keylen);
    key[f->keylen] = '\0';
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
    case RT_STORE_DELETE: {
        kv *e = kv_find(s, key);
        if (e) {
            free(e->key);
            free(e->val);
            *e = s->kvs[--s->nkv];
        }
        reply(c, e ? 0 : 2, NULL, 0);
        return 0;
    }
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
    if (!c->hello) s->npending--;
    close(c->fd);
    free(c->in);
    free(c->waiting_key);
    s->cl[i] = s->cl[--s->ncl];
}

/* Read what a client without hello sent: one HELLO frame at most, into its fixed buffer.
 * Returns -1 to drop it. */
static int read_pending(rt_store_server *s, client *c) {
    size_t want = c->in_len < RT_STORE_HDR ? RT_STORE_HDR : sizeof c->pre;
    ssize_t r = recv(c->fd, c->pre + c->in_len, want - c->in_len, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (r <= 0) return -1;
    c->in_len += (size_t)r;
    if (c->in_len < RT_STORE_HDR) return 0;
    rt_store_frame f;
    size_t used = 0;
    /* anything but a HELLO of its exact size (garbage, another op, a huge length) is refused
     * at its header, before any more of it is read */
    if (rt_store_header_parse(c->pre, &f) != RT_OK || f.op != RT_STORE_HELLO || f.keylen != 0 ||
        f.vallen != RT_STORE_HELLO_BYTES) {
        rt_error_clear();
        refuse(c);
        return -1;
    }
    if (c->in_len < sizeof c->pre) return 0;
    if (rt_store_frame_parse(c->pre, c->in_len, &f, &used) != RT_OK || used != c->in_len) {
        rt_error_clear();
        refuse(c);
        return -1;
    }
    c->in_len = 0;
    return handle_hello(s, c, &f);
}

/* Read and handle what a client past its hello sent. Returns -1 to drop it. */
static int read_client(rt_store_server *s, client *c) {
    /* room for a whole frame of the largest size the limits allow, and some more */
    const size_t limit = RT_STORE_HDR + RT_STORE_MAX_KEY + RT_STORE_MAX_VALUE + 65536;
    if (c->in_cap - c->in_len < 65536 && c->in_cap < limit) {
        size_t nc = c->in_cap ? c->in_cap * 2 : 65536;
        if (nc > limit) nc = limit; /* (growing to exactly the limit, not stopping short of it) */
        uint8_t *nb = realloc(c->in, nc);
        if (!nb) return -1;
        c->in = nb;
        c->in_cap = nc;
    }
    ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (r <= 0) return -1;
    c->in_len += (size_t)r;
    for (;;) {
        rt_store_frame f;
        size_t used = 0;
        if (rt_store_frame_parse(c->in, c->in_len, &f, &used) != RT_OK) {
            RT_LOG_WARN("store: dropping a client: %s", rt_error_message());
            rt_error_clear();
            reply_err(c, "store: malformed frame");
            return -1;
        }
        if (used == 0) return 0;
        if (f.op == RT_STORE_HELLO || handle(s, c, &f) != 0) {
            if (f.op == RT_STORE_HELLO) reply_err(c, "store: a second HELLO");
            return -1;
        }
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
    }
}

/* Accept one connection and send it its challenge. accept() failing for want of file
 * descriptors (EMFILE, ENFILE) leaves the connection queued, so the listening socket
 * stays readable: close the spare descriptor to accept it and close it at once, and
 * stop watching the socket for a moment rather than spin on it. */
static void accept_one(rt_store_server *s) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            if (s->spare_fd >= 0) {
                close(s->spare_fd);
                int k = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
                if (k >= 0) close(k);
                s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            }
            s->accept_paused_until = rt_now_ns() + 100000000ull; /* 100 ms */
        }
        return;
    }
    if (s->npending >= RT_STORE_MAX_PENDING) { /* make room: the oldest connection without hello goes */
        int old = -1;
        for (int i = 0; i < s->ncl; i++)
            if (!s->cl[i].hello && (old < 0 || s->cl[i].deadline_ns < s->cl[old].deadline_ns)) old = i;
        if (old >= 0) drop_client(s, old);
    }
    if (s->ncl == s->capcl) {
        int nc = s->capcl ? 2 * s->capcl : 16;
        client *n = realloc(s->cl, (size_t)nc * sizeof *n);
        if (!n) {
            close(fd);
            return;
        }
        s->cl = n;
        s->capcl = nc;
    }
    rt_sock_set_nodelay(fd);
    client *c = &s->cl[s->ncl];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->rank = -1;
    c->deadline_ns = rt_now_ns() + (uint64_t)(RT_STORE_HANDSHAKE_S * 1e9);
    char ip[INET_ADDRSTRLEN] = "?";
    if (sa.sin_family == AF_INET) inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(c->addr, sizeof c->addr, "%s:%d", ip, ntohs(sa.sin_port));
    uint8_t ch[RT_STORE_HDR + RT_AUTH_NONCE];
    if (rt_random_bytes(c->nonce, sizeof c->nonce) != RT_OK) {
        rt_error_clear();
        close(fd);
        return;
    }
    s->ncl++;
    s->npending++;
    size_t len = rt_store_frame_encode(ch, sizeof ch, RT_STORE_CHALLENGE, 0, NULL, 0, c->nonce, sizeof c->nonce);
    send_nowait(c, ch, len);
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
        uint64_t now = rt_now_ns();
        /* handshakes past their deadline end here */
        for (int i = s->ncl - 1; i >= 0; i--)
            if (!s->cl[i].hello && now >= s->cl[i].deadline_ns) drop_client(s, i);
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < s->ncl; i++)
            if (!s->cl[i].hello && s->cl[i].deadline_ns < next) next = s->cl[i].deadline_ns;
        bool listening = now >= s->accept_paused_until;
        if (!listening && s->accept_paused_until < next) next = s->accept_paused_until;
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){listening ? s->lfd : -1, POLLIN, 0};
        for (int i = 0; i < s->ncl; i++) pf[i + 2] = (struct pollfd){s->cl[i].fd, POLLIN, 0};
        int timeout = next == UINT64_MAX ? -1 : rt_sock_ms_left(next, 1000);
        int pr = poll(pf, (nfds_t)(s->ncl + 2), timeout);
        if (pr < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        int ncl_before = s->ncl;
        for (int i = ncl_before - 1; i >= 0; i--) {
            if (!pf[i + 2].revents) continue;
            client *c = &s->cl[i];
            if ((c->hello ? read_client(s, c) : read_pending(s, c)) != 0) drop_client(s, i);
        }
        if (listening && (pf[1].revents & POLLIN)) accept_one(s);
    }
    free(pf);
    return NULL;
}

static const char *bind_name(const char *host) { return host && *host ? host : "0.0.0.0"; }

rt_status rt_store_server_start(const char *host, int port, const char *secret, int world, rt_store_server **out,
                                int *bound_port) {
    RT_REQUIRE(world >= 1 && world <= (1 << 20), RT_ERR_INVALID, "store: world size %d must be in 1..%d", world,
               1 << 20);
    RT_REQUIRE(secret && strlen(secret) < 256, RT_ERR_INVALID, "store: job secret missing or longer than 255 bytes");
    rt_store_server *s = calloc(1, sizeof *s);
    RT_CHECK_ALLOC(s, sizeof *s);
    s->joined = calloc((size_t)world, 1);
    s->joined_from = calloc((size_t)world, sizeof *s->joined_from);
    if (!s->joined || !s->joined_from) {
        free(s->joined);
        free(s->joined_from);
        free(s);
        RT_CHECK_ALLOC(NULL, (size_t)world * (1 + sizeof(char *)));
    }
    snprintf(s->secret, sizeof s->secret, "%s", secret);
    s->world = world;
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    rt_status st = rt_sock_listen(bind_name(host), port, &s->lfd, bound_port);
    if (st != RT_OK) {
        if (s->spare_fd >= 0) close(s->spare_fd);
        free(s->joined);
        free(s->joined_from);
        free(s);
        rt_error_trace(__FILE__, __LINE__, "rt_sock_listen (store)");
        return st;
    }
    if (pipe2(s->wake, O_CLOEXEC) < 0 || pthread_create(&s->thread, NULL, server_main, s) != 0) {
        st = rt_error_sys(__FILE__, __LINE__, "store server thread");
        close(s->lfd);
        if (s->spare_fd >= 0) close(s->spare_fd);
        free(s->joined);
        free(s->joined_from);
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
    if (s->spare_fd >= 0) close(s->spare_fd);
    for (int i = 0; i < s->ncl; i++) {
        close(s->cl[i].fd);
        free(s->cl[i].in);
        free(s->cl[i].waiting_key);
    }
    for (int i = 0; i < s->nkv; i++) {
        free(s->kvs[i].key);
        free(s->kvs[i].val);
    }
    for (int i = 0; i < s->world; i++) free(s->joined_from[i]);
    free(s->joined_from);
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
    int owed; /* replies still due to requests that timed out (the *_within ones): read first */
    char where[300];
    char local[64];
};

const char *rt_store_local_addr(const rt_store *st) { return st->local; }
void rt_store_set_timeout(rt_store *st, double timeout_s) { st->timeout_s = timeout_s; }

/* Read one reply-like frame (header + value, value malloc'd) before the deadline. */
static rt_status read_frame(int fd, uint64_t deadline, const char *what, rt_store_frame *f, uint8_t **val) {
    uint8_t hdr[RT_STORE_HDR];
    *val = NULL;
    RT_CHECK(rt_sock_read_all(fd, hdr, sizeof hdr, deadline, what));
    RT_CHECK(rt_store_header_parse(hdr, f));
    if (f->keylen != 0) return RT_ERROR(RT_ERR_FORMAT, "%s: a frame with a key where a reply was due", what);
    if (f->vallen) {
        *val = malloc(f->vallen);
        RT_CHECK_ALLOC(*val, f->vallen);
        rt_status s = rt_sock_read_all(fd, *val, f->vallen, deadline, what);
        if (s != RT_OK) {
            free(*val);
            *val = NULL;
            return s;
        }
    }
    return RT_OK;
}

/* Whether fd has something to read (or an error or end) before the deadline: 1 yes, 0 no,
 * -1 poll failed. */
static int readable_by(int fd, uint64_t deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, rt_sock_ms_left(deadline, 1000));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
        if (r == 0 && rt_now_ns() >= deadline) return 0;
    }
}

/* A reply that started arriving is read within this (the server writes it at once). */
#define REPLY_REST_S 10.0

/* Send a request and read the reply. The value is copied into buf (cap bytes).
 * may_owe (the *_within calls: short timeouts of the hang and desync checks): a reply not
 * begun by the deadline is owed, not an error of the connection: the next request reads
 * and drops it first. Any other failure (a reply cut short, or any timeout of the
 * others) breaks the connection for good (the stream's position is lost). */
static rt_status request(rt_store *st, uint8_t op, const char *key, const void *val, size_t n, void *buf, size_t cap,
                         size_t *out_n, uint8_t *status, double timeout_s, bool may_owe) {
    size_t keylen = strlen(key);
    RT_REQUIRE(keylen <= RT_STORE_MAX_KEY, RT_ERR_INVALID, "store key '%.40s...' longer than %d bytes", key,
               RT_STORE_MAX_KEY);
    RT_REQUIRE(n <= RT_STORE_MAX_VALUE, RT_ERR_INVALID, "store value of %zu bytes over the limit %u", n,
               RT_STORE_MAX_VALUE);
    if (st->broken)
        return RT_ERROR(RT_ERR_PEER, "store connection to %s is broken by an earlier error or timeout", st->where);
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    rt_status s = RT_OK;
    rt_store_frame f;
    uint8_t *v = NULL;
    while (st->owed > 0) { /* late replies to earlier requests: read and drop them */
        int r = readable_by(st->fd, deadline);
        if (r == 0)
            return RT_ERROR(RT_ERR_TIMEOUT,
                            "store request for key '%s' timed out after %.1f s: the store has not answered an "
                            "earlier request yet (%s)",
                            key, timeout_s, st->where);
        s = r < 0 ? rt_error_sys(__FILE__, __LINE__, "poll (store connection)")
                  : read_frame(st->fd, rt_now_ns() + (uint64_t)(REPLY_REST_S * 1e9), st->where, &f, &v);
        free(v);
        v = NULL;
        if (s != RT_OK) break;
        st->owed--;
    }
    if (s == RT_OK) {
        size_t cap_frame = RT_STORE_HDR + keylen + n;
        uint8_t *frame = malloc(cap_frame);
        RT_CHECK_ALLOC(frame, cap_frame);
        size_t len = rt_store_frame_encode(frame, cap_frame, op, 0, key, keylen, val, n);
        s = rt_sock_write_all(st->fd, frame, len, deadline, st->where);
        free(frame);
    }
    if (s == RT_OK && may_owe) {
        int r = readable_by(st->fd, deadline);
        if (r == 0) {
            st->owed++;
            return RT_ERROR(RT_ERR_TIMEOUT, "store request for key '%s' timed out after %.1f s (%s)", key, timeout_s,
                            st->where);
        }
        if (r < 0) s = rt_error_sys(__FILE__, __LINE__, "poll (store connection)");
        uint64_t rest = rt_now_ns() + (uint64_t)(REPLY_REST_S * 1e9);
        if (rest > deadline) deadline = rest;
    }
    if (s == RT_OK) s = read_frame(st->fd, deadline, st->where, &f, &v);
    if (s == RT_OK && f.op != RT_STORE_REPLY) s = RT_ERROR(RT_ERR_FORMAT, "store sent op %u instead of a reply", f.op);
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

/* One handshake on a connected socket (auth.h). RT_ERR_IO: the connection ended before
 * an answer (the server dropped it, e.g. to make room): worth another try. */
static rt_status handshake(rt_store *st, const char *secret, int rank, int world, uint64_t deadline) {
    rt_store_frame f;
    uint8_t *v = NULL;
    rt_status s = read_frame(st->fd, deadline, st->where, &f, &v);
    if (s == RT_ERR_PEER) return RT_ERR_IO;
    RT_CHECK(s);
    if (f.op != RT_STORE_CHALLENGE || f.vallen != RT_AUTH_NONCE) {
        free(v);
        return RT_ERROR(RT_ERR_PEER, "%s is not a ringtrain store of this version (no challenge)", st->where);
    }
    uint8_t hello[RT_STORE_HELLO_BYTES], expect[RT_AUTH_MAC], frame[RT_STORE_HDR + RT_STORE_HELLO_BYTES];
    s = rt_auth_store_answer(secret, v, rank, world, hello, expect);
    free(v);
    RT_CHECK(s);
    size_t len = rt_store_frame_encode(frame, sizeof frame, RT_STORE_HELLO, 0, NULL, 0, hello, sizeof hello);
    s = rt_sock_write_all(st->fd, frame, len, deadline, st->where);
    if (s == RT_OK) s = read_frame(st->fd, deadline, st->where, &f, &v);
    if (s == RT_ERR_PEER) return RT_ERR_IO;
    RT_CHECK(s);
    if (f.op != RT_STORE_REPLY)
        s = RT_ERROR(RT_ERR_PEER, "%s sent op %u instead of a reply", st->where, f.op);
    else if (f.status != 0 && f.vallen == strlen(RT_AUTH_REFUSED) && memcmp(v, RT_AUTH_REFUSED, f.vallen) == 0)
        s = RT_ERROR(RT_ERR_PEER,
                     "the %s refused this process: it does not share this job's secret (RINGTRAIN_JOB_TOKEN, or the "
                     "launcher's job id: a process of another job, or the variable differs between ranks? see "
                     "docs/security.md)",
                     st->where);
    else if (f.status != 0)
        s = RT_ERROR(RT_ERR_PEER, "%.*s", (int)(f.vallen < 600 ? f.vallen : 600), v ? (const char *)v : "");
    else if (f.vallen != RT_AUTH_MAC || !rt_auth_equal(v, expect, RT_AUTH_MAC))
        s = RT_ERROR(RT_ERR_PEER,
                     "the %s did not prove it knows this job's secret: it is not this job's store (another job's, "
                     "or an impostor on its port)",
                     st->where);
    free(v);
    return s;
}

rt_status rt_store_connect(const char *host, int port, const char *secret, int rank, int world, double timeout_s,
                           rt_store **out) {
    RT_REQUIRE(secret && strlen(secret) < 256, RT_ERR_INVALID, "store: job secret missing or longer than 255 bytes");
    rt_store *st = calloc(1, sizeof *st);
    RT_CHECK_ALLOC(st, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->timeout_s = timeout_s;
    st->fd = -1;
    snprintf(st->where, sizeof st->where, "store at %s:%d", host, port);
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    rt_status s;
    for (int delay_ms = 10;; delay_ms = delay_ms < 500 ? 2 * delay_ms : delay_ms) {
        s = rt_sock_connect(host, port, deadline, st->where, &st->fd);
        if (s != RT_OK) break;
        s = handshake(st, secret, rank, world, deadline);
        if (s != RT_ERR_IO) break;
        /* dropped before an answer: try again until the deadline */
        close(st->fd);
        st->fd = -1;
        if (rt_now_ns() >= deadline) {
            s = RT_ERROR(RT_ERR_TIMEOUT, "%s closed every connection before its handshake within %.1f s", st->where,
                         timeout_s);
            break;
        }
        struct timespec ts = {0, (long)rt_sock_ms_left(deadline, delay_ms) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s != RT_OK) {
        if (st->fd >= 0) close(st->fd);
        pthread_mutex_destroy(&st->mu);
        free(st);
        rt_error_trace(__FILE__, __LINE__, "store hello");
        return s;
    }
    rt_sock_local_addr(st->fd, st->local, sizeof st->local);
    *out = st;
    return RT_OK;
}

void rt_store_close(rt_store *st) {
    if (!st) return;
    close(st->fd);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* The connection's lock; with a timeout of its own (> 0) the wait for it counts in it: a
 * thread blocked in a long request (debug mode's waits) makes a check time out, not hang. */
static rt_status lock_within(rt_store *st, const char *key, double timeout_s) {
    if (timeout_s <= 0) {
        pthread_mutex_lock(&st->mu);
        return RT_OK;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double end = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    int e;
    while ((e = pthread_mutex_timedlock(&st->mu, &ts)) == EINTR) {
    }
    if (e == 0) return RT_OK;
    return RT_ERROR(RT_ERR_TIMEOUT,
                    "store request for key '%s': the connection stayed busy with another request for %.1f s (%s)", key,
                    timeout_s, st->where);
}

bool rt_store_busy(rt_store *st) {
    if (pthread_mutex_trylock(&st->mu) != 0) return true;
    pthread_mutex_unlock(&st->mu);
    return false;
}

rt_status rt_store_set_within(rt_store *st, const char *key, const void *value, size_t n, double timeout_s) {
    uint8_t status;
    RT_CHECK(lock_within(st, key, timeout_s));
    rt_status s = request(st, RT_STORE_SET, key, value, n, NULL, 0, NULL, &status,
                          timeout_s > 0 ? timeout_s : st->timeout_s, timeout_s > 0);
    pthread_mutex_unlock(&st->mu);
    return s;
}

rt_status rt_store_set(rt_store *st, const char *key, const void *value, size_t n) {
    return rt_store_set_within(st, key, value, n, 0);
}

rt_status rt_store_get_within(rt_store *st, const char *key, void *buf, size_t cap, size_t *n, double timeout_s) {
    uint8_t status;
    RT_CHECK(lock_within(st, key, timeout_s));
    rt_status s = request(st, RT_STORE_GET, key, NULL, 0, buf, cap, n, &status,
                          timeout_s > 0 ? timeout_s : st->timeout_s, timeout_s > 0);
    pthread_mutex_unlock(&st->mu);
    return s;
}

rt_status rt_store_get(rt_store *st, const char *key, void *buf, size_t cap, size_t *n) {
    return rt_store_get_within(st, key, buf, cap, n, 0);
}

rt_status rt_store_add(rt_store *st, const char *key, int64_t delta, int64_t *total) {
    char v[32], r[32] = "";
    snprintf(v, sizeof v, "%" PRId64, delta);
    size_t n = 0;
    uint8_t status;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_ADD, key, v, strlen(v), r, sizeof r - 1, &n, &status, st->timeout_s, false);
    pthread_mutex_unlock(&st->mu);
    if (s != RT_OK) return s;
    r[n < sizeof r ? n : sizeof r - 1] = '\0';
    if (total) *total = strtoll(r, NULL, 10);
    return RT_OK;
}

rt_status rt_store_check_within(rt_store *st, const char *key, bool *exists, double timeout_s) {
    uint8_t status = 0;
    RT_CHECK(lock_within(st, key, timeout_s));
    rt_status s = request(st, RT_STORE_CHECK, key, NULL, 0, NULL, 0, NULL, &status,
                          timeout_s > 0 ? timeout_s : st->timeout_s, timeout_s > 0);
    pthread_mutex_unlock(&st->mu);
    if (s == RT_OK) *exists = status == 0;
    return s;
}

rt_status rt_store_delete(rt_store *st, const char *key, bool *existed) {
    uint8_t status = 0;
    pthread_mutex_lock(&st->mu);
    rt_status s = request(st, RT_STORE_DELETE, key, NULL, 0, NULL, 0, NULL, &status, st->timeout_s, false);
    pthread_mutex_unlock(&st->mu);
    if (s == RT_OK && existed) *existed = status == 0;
    return s;
}

rt_status rt_store_check(rt_store *st, const char *key, bool *exists) {
    return rt_store_check_within(st, key, exists, 0);
}

rt_status rt_store_wait(rt_store *st, const char *const *keys, int n) {
    for (int i = 0; i < n; i++) {
        size_t len;
        RT_CHECK(rt_store_get(st, keys[i], NULL, 0, &len));
    }
    return RT_OK;
}
