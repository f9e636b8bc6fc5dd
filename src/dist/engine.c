/* The progress engine (see engine.h). */
#include "dist/internal/engine.h"
#include "dist/internal/flight.h"
#include "dist/internal/names.h"
#include "core/spin.h"

#include "core/log.h"
#include "core/settings.h"
#include "core/timer.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

rt_status rt_engine_init(rt_engine *e, int rank, int world) {
    memset(e, 0, sizeof *e);
    int64_t spin_us = 0; /* at most 1 s (the table's range): no overflow in the product */
    RT_CHECK(rt_setting_int(RT_SET_SHM_SPIN_US, &spin_us));
    e->spin_ns = (uint64_t)spin_us * 1000;
    e->rank = rank;
    e->world = world;
    e->ch = calloc((size_t)world, sizeof *e->ch);
    RT_CHECK_ALLOC(e->ch, (size_t)world * sizeof *e->ch);
    for (int i = 0; i < world; i++) {
        e->ch[i].peer = i;
        e->ch[i].fd = -1;
    }
    e->mismatch_peer = -1;
    e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->evfd < 0) {
        free(e->ch);
        return rt_error_sys(__FILE__, __LINE__, "eventfd");
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    return RT_OK;
}

static void wake_driver(rt_engine *e) {
    if (e->tp && e->tp->wake) e->tp->wake(e);
    uint64_t one = 1;
    if (write(e->evfd, &one, sizeof one) < 0) { /* counter full: the driver is awake anyway */
    }
}

void rt_engine_destroy(rt_engine *e) {
    if (!e->ch) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        wake_driver(e);
        pthread_join(e->thread, NULL);
    }
    for (int i = 0; i < e->world; i++) {
        rt_chan *c = &e->ch[i];
        if (c->ops && c->ops->close) c->ops->close(c);
        c->ops = NULL;
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
    }
    free(e->ch);
    e->ch = NULL;
    if (e->tp && e->tp->engine_close) e->tp->engine_close(e);
    e->tp = NULL;
    close(e->evfd);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
}

/* ---- requests ---- */

rt_status rt_req_new(rt_engine *e, const char *opname, int group, double timeout_s, int maxx, rt_request **out) {
    /* one allocation: the request, then its transfers */
    size_t bytes = sizeof(rt_request) + (size_t)(maxx > 0 ? maxx : 0) * sizeof(rt_xfer);
    rt_request *r = calloc(1, bytes);
    RT_CHECK_ALLOC(r, bytes);
    r->x = maxx > 0 ? (rt_xfer *)(r + 1) : NULL;
    r->eng = e;
    r->opname = opname;
    r->group = group;
    r->capx = maxx;
    r->timeout_s = timeout_s;
    *out = r;
    return RT_OK;
}

void rt_req_free(rt_request *r) {
    if (!r) return;
    /* a device part handed to a stream (rt_wait_stream): its transport may keep its
     * recorder entry open until it sees the completion (nccl's watchdog takes fr_id) */
    if (r->dev && r->dev->release) r->dev->release(r);
    /* still open: failed before it ran, or handed to a stream: done as far as the host sees it */
    if (r->fr_id) rt_flight_end(r->fr, r->fr_id, r->done && r->status == RT_OK && r->dev_status == RT_OK);
    free(r->scratch);
    free(r);
}

static rt_xfer *add(rt_request *r, int peer) {
    if (r->nx >= r->capx || peer < 0 || peer >= r->eng->world || peer == r->eng->rank) return NULL;
    rt_xfer *x = &r->x[r->nx++];
    memset(x, 0, sizeof *x);
    x->ch = &r->eng->ch[peer];
    x->req = r;
    x->op = -1;
    return x;
}

rt_xfer *rt_req_send(rt_request *r, int peer, const void *buf, size_t nbytes, uint16_t kind, uint32_t seq,
                     const rt_xfer *dep, bool dep_full) {
    rt_xfer *x = add(r, peer);
    if (!x) return NULL;
    x->is_send = true;
    x->buf = (uint8_t *)buf;
    x->nbytes = nbytes;
    x->pad = (8 - nbytes % 8) % 8;
    x->hdr = (rt_msg_hdr){kind, (uint16_t)r->group, seq, nbytes};
    rt_msg_hdr_encode(x->hbuf, &x->hdr);
    x->dep = dep;
    x->dep_full = dep_full;
    return x;
}

rt_xfer *rt_req_recv(rt_request *r, int peer, void *buf, size_t nbytes, uint16_t kind, uint32_t seq, int op,
                     rt_dtype dtype, int avg_div, const rt_xfer *dep, bool dep_full) {
    rt_xfer *x = add(r, peer);
    if (!x) return NULL;
    x->buf = buf;
    x->nbytes = nbytes;
    x->pad = (8 - nbytes % 8) % 8;
    x->hdr = (rt_msg_hdr){kind, (uint16_t)r->group, seq, nbytes};
    x->op = op;
    x->dtype = dtype;
    x->esize = rt_dtype_size(dtype);
    if (x->esize == 0 || x->esize > 8) x->esize = 1;
    x->avg_div = avg_div;
    x->dep = dep;
    x->dep_full = dep_full;
    return x;
}

rt_status rt_req_post_copy(rt_request *r, void *dst, const void *src, size_t n) {
    RT_REQUIRE(r->nposts < 4, RT_ERR_INTERNAL, "too many post copies");
    r->posts[r->nposts++] = (rt_post_copy){dst, src, n};
    return RT_OK;
}

/* ---- progress ---- */

static void req_complete(rt_engine *e, rt_request *r, rt_status st, const rt_error_record *err) {
    if (r->done) return;
    if (st == RT_OK && r->pr_n > 0) {
        size_t nb = r->pr_count * rt_dtype_size(r->pr_dtype);
        if (nb) memcpy(r->pr_buf, r->pr_slots, nb);
        for (int k = 1; k < r->pr_n; k++)
            rt_reduce_apply(r->pr_buf, r->pr_slots + (size_t)k * nb, r->pr_count, r->pr_dtype, (rt_reduce_op)r->pr_op);
        if (r->pr_op == RT_OP_AVG) rt_reduce_div(r->pr_buf, r->pr_count, r->pr_dtype, r->pr_n);
    }
    if (st == RT_OK)
        for (int i = 0; i < r->nposts; i++)
            if (r->posts[i].n) memmove(r->posts[i].dst, r->posts[i].src, r->posts[i].n);
    r->status = st;
    if (err) r->err = *err;
    r->done = true;
    if (r->fr_id && (st != RT_OK || !r->fr_dev)) {
        rt_flight_end(r->fr, r->fr_id, st == RT_OK);
        r->fr_id = 0;
    }
    if (r->async) e->nasync--;
    /* unlink from the active list */
    for (rt_request **p = &e->active; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    r->next = NULL;
    pthread_cond_broadcast(&e->cv);
}

static void xfer_done(rt_engine *e, rt_xfer *x) {
    x->complete = true;
    if (--x->req->pending == 0) req_complete(e, x->req, RT_OK, NULL);
}

static size_t dep_limit(const rt_xfer *x) {
    if (!x->dep) return x->nbytes;
    if (x->dep->complete) return x->nbytes;
    if (x->dep_full) return 0;
    return x->dep->done < x->nbytes ? x->dep->done : x->nbytes;
}

static const uint8_t k_zero[8];

static rt_status progress_send(rt_xfer *x, bool *moved_any) {
    rt_chan *c = x->ch;
    if (x->hdone < RT_MSG_HDR) {
        if (x->dep && x->dep_full && !x->dep->complete) return RT_OK;
        size_t m = 0;
        if (x->hdone == 0 && dep_limit(x) == x->nbytes && x->nbytes <= 4096) {
            /* a small message: header, body and padding in one publication */
            uint8_t frame[RT_MSG_HDR + 4096 + 8];
            size_t len = RT_MSG_HDR + x->nbytes + x->pad;
            memcpy(frame, x->hbuf, RT_MSG_HDR);
            if (x->nbytes) memcpy(frame + RT_MSG_HDR, x->buf, x->nbytes);
            memset(frame + RT_MSG_HDR + x->nbytes, 0, x->pad);
            RT_CHECK(rt_chan_send(c, frame, len, &m));
            if (m == len) {
                x->hdone = RT_MSG_HDR;
                x->done = x->nbytes;
                x->pdone = x->pad;
                *moved_any = true;
                return RT_OK;
            }
            /* partial (ring nearly full, or a short tcp write): account for what went */
            if (m) *moved_any = true;
            x->hdone = m < RT_MSG_HDR ? m : RT_MSG_HDR;
            if (m > RT_MSG_HDR) x->done = m - RT_MSG_HDR < x->nbytes ? m - RT_MSG_HDR : x->nbytes;
            if (m > RT_MSG_HDR + x->nbytes) x->pdone = m - RT_MSG_HDR - x->nbytes;
        } else {
            RT_CHECK(rt_chan_send(c, x->hbuf + x->hdone, RT_MSG_HDR - x->hdone, &m));
            x->hdone += m;
            if (m) *moved_any = true;
        }
        if (x->hdone < RT_MSG_HDR) return RT_OK;
    }
    size_t lim = dep_limit(x);
    while (x->done < lim) {
        size_t m = 0;
        RT_CHECK(rt_chan_send(c, x->buf + x->done, lim - x->done, &m));
        if (m == 0) break;
        x->done += m;
        *moved_any = true;
    }
    if (x->done == x->nbytes && x->pdone < x->pad) {
        size_t m = 0;
        RT_CHECK(rt_chan_send(c, k_zero, x->pad - x->pdone, &m));
        x->pdone += m;
        if (m) *moved_any = true;
    }
    return RT_OK;
}

static rt_status bad_header(rt_xfer *x, const rt_msg_hdr *got) {
    x->req->eng->mismatch_peer = x->ch->peer;
    return RT_ERROR(RT_ERR_PEER,
                    "peer rank %d sent %s (group %u, op #%u, %llu bytes) but this rank expected %s (group %u, op #%u, "
                    "%llu bytes): the ranks called different operations or sizes",
                    x->ch->peer, rt_comm_kind_name(got->kind), got->group, got->seq, (unsigned long long)got->nbytes,
                    rt_comm_kind_name(x->hdr.kind), x->hdr.group, x->hdr.seq, (unsigned long long)x->hdr.nbytes);
}

static void reduce_into(rt_xfer *x, uint8_t *dst, const uint8_t *src, size_t n_elem) {
    if (x->avg_div > 0 && x->done + n_elem * x->esize <= x->nbytes)
        rt_reduce_apply_div(dst, src, n_elem, x->dtype, x->avg_div);
    else
        rt_reduce_apply(dst, src, n_elem, x->dtype, (rt_reduce_op)x->op);
}

static rt_status recv_pad(rt_xfer *x, bool *moved_any) {
    if (x->done < x->nbytes || x->pdone >= x->pad) return RT_OK;
    uint8_t tmp[8];
    size_t m = 0;
    RT_CHECK(rt_chan_recv_into(x->ch, tmp, x->pad - x->pdone, &m));
    x->pdone += m;
    if (m) *moved_any = true;
    return RT_OK;
}

static rt_status progress_recv(rt_xfer *x, bool *moved_any) {
    rt_chan *c = x->ch;
    if (x->hdone < RT_MSG_HDR) {
        size_t m = 0;
        RT_CHECK(rt_chan_recv_into(c, x->hbuf + x->hdone, RT_MSG_HDR - x->hdone, &m));
        x->hdone += m;
        if (m) *moved_any = true;
        if (x->hdone < RT_MSG_HDR) return RT_OK;
        rt_msg_hdr got;
        if (rt_msg_hdr_parse(x->hbuf, RT_MSG_HDR, &got) != RT_OK)
            return RT_ERROR(RT_ERR_PEER, "peer rank %d: %s", c->peer, rt_error_message());
        if (got.kind != x->hdr.kind || got.group != x->hdr.group || got.seq != x->hdr.seq ||
            got.nbytes != x->hdr.nbytes)
            return bad_header(x, &got);
    }
    size_t lim = dep_limit(x);
    if (x->op < 0) {
        while (x->done < lim) {
            size_t m = 0;
            RT_CHECK(rt_chan_recv_into(c, x->buf + x->done, lim - x->done, &m));
            if (m == 0) break;
            x->done += m;
            *moved_any = true;
        }
        return recv_pad(x, moved_any);
    }
    size_t es = x->esize;
    while (x->done < lim) {
        const uint8_t *p;
        size_t avail = 0;
        RT_CHECK(rt_chan_peek(c, &p, &avail));
        if (avail == 0) break;
        *moved_any = true;
        if (x->part_n || avail < es) { /* an element split across the ring's end or a short read */
            size_t take = es - x->part_n;
            if (take > avail) take = avail;
            memcpy(x->part + x->part_n, p, take);
            rt_chan_consume(c, take);
            x->part_n += take;
            if (x->part_n == es) {
                reduce_into(x, x->buf + x->done, x->part, 1);
                x->done += es;
                x->part_n = 0;
            }
            continue;
        }
        size_t take = lim - x->done;
        if (take > avail) take = avail;
        take -= take % es;
        if ((uintptr_t)p % es) { /* misaligned in the tcp staging buffer: bounce */
            static _Thread_local double bounce[8192];
            if (take > sizeof bounce) take = sizeof bounce;
            memcpy(bounce, p, take);
            p = (const uint8_t *)bounce;
        }
        reduce_into(x, x->buf + x->done, p, take / es);
        rt_chan_consume(c, take);
        x->done += take;
    }
    return recv_pad(x, moved_any);
}

/* One pass over all channels. Returns an error on a channel failure. */
static rt_status in_op(rt_xfer *x, rt_status s) {
    char msg[sizeof(((rt_error_record *)0)->msg)];
    snprintf(msg, sizeof msg, "%s", rt_error_message());
    return RT_ERROR(s, "%s (group %u, op #%u) failed: %s", x->req->opname, x->hdr.group, x->hdr.seq, msg);
}

/* Whether the request's transfers may run: no gate, or its device event has completed
 * (one non-blocking look). */
static rt_status gate_passed(rt_request *r, bool *open, bool *moved_any) {
    *open = true;
    if (!r->gate || r->gate_open) return RT_OK;
    bool ready = false;
    RT_CHECK(rt_event_query(r->gate, &ready));
    *open = r->gate_open = ready;
    if (ready) *moved_any = true;
    return RT_OK;
}

static rt_status progress_pass(rt_engine *e, bool *moved_any) {
    for (int i = 0; i < e->world; i++) {
        rt_chan *c = &e->ch[i];
        while (c->rq_head) {
            rt_xfer *x = c->rq_head;
            bool open;
            rt_status s = gate_passed(x->req, &open, moved_any);
            if (s != RT_OK) return in_op(x, s);
            if (!open) break;
            s = progress_recv(x, moved_any);
            if (s != RT_OK) return in_op(x, s);
            if (x->hdone < RT_MSG_HDR || x->done < x->nbytes || x->pdone < x->pad) break;
            if (x->dep && x->dep_full && !x->dep->complete) break;
            c->rq_head = x->qnext;
            if (!c->rq_head) c->rq_tail = NULL;
            xfer_done(e, x);
        }
        while (c->sq_head) {
            rt_xfer *x = c->sq_head;
            bool open;
            rt_status s = gate_passed(x->req, &open, moved_any);
            if (s != RT_OK) return in_op(x, s);
            if (!open) break;
            s = progress_send(x, moved_any);
            if (s != RT_OK) return in_op(x, s);
            if (x->hdone < RT_MSG_HDR || x->done < x->nbytes || x->pdone < x->pad) break;
            c->sq_head = x->qnext;
            if (!c->sq_head) c->sq_tail = NULL;
            xfer_done(e, x);
        }
    }
    return RT_OK;
}

rt_status rt_engine_pass(rt_engine *e, bool *moved_any) { return progress_pass(e, moved_any); }

void rt_engine_abort_peers(rt_engine *e) {
    if (e->peers_aborted) return;
    e->peers_aborted = true;
    /* make the peers fail fast instead of waiting for their timeout */
    for (int i = 0; i < e->world; i++) {
        rt_chan *c = &e->ch[i];
        if (c->fd < 0) continue;
        if (c->ops && c->ops->abort) c->ops->abort(c);
        shutdown(c->fd, SHUT_RDWR);
    }
}

void rt_engine_fail(rt_engine *e) {
    rt_error_record rec;
    rt_error_save(&rec);
    if (!e->broken) {
        e->broken = true;
        e->fail_peer = -1;
        e->fail_owner = NULL;
        for (rt_request *r = e->active; r && !e->fail_owner; r = r->next) e->fail_owner = r->owner;
        for (rt_request *r = e->active; r && e->fail_peer < 0; r = r->next)
            for (int i = 0; i < r->nx; i++)
                if (!r->x[i].complete && !r->x[i].is_send) {
                    e->fail_peer = r->x[i].ch->peer;
                    break;
                }
        if (e->on_fail) e->on_fail(e->on_fail_ctx, &rec);
        e->err = rec;
        rt_engine_abort_peers(e);
    }
    while (e->active) req_complete(e, e->active, rec.status, &rec);
    for (int i = 0; i < e->world; i++) e->ch[i].sq_head = e->ch[i].sq_tail = e->ch[i].rq_head = e->ch[i].rq_tail = NULL;
}

/* Describe where a request is stuck, for timeout messages. */
static void fail_timeout(rt_engine *e, rt_request *r) {
    const rt_xfer *stuck = NULL;
    for (int i = 0; i < r->nx && !stuck; i++)
        if (!r->x[i].complete && !r->x[i].is_send) stuck = &r->x[i];
    for (int i = 0; i < r->nx && !stuck; i++)
        if (!r->x[i].complete) stuck = &r->x[i];
    if (stuck)
        RT_ERROR(RT_ERR_TIMEOUT, "%s timed out after %.1f s waiting for peer rank %d (%s %zu of %zu bytes%s)",
                 r->opname, r->timeout_s, stuck->ch->peer, stuck->is_send ? "sent" : "received", stuck->done,
                 stuck->nbytes, stuck->hdone < RT_MSG_HDR ? ", header not yet through" : "");
    else
        RT_ERROR(RT_ERR_TIMEOUT, "%s timed out after %.1f s", r->opname, r->timeout_s);
    rt_engine_fail(e);
}

#define SPIN_PASSES 30 /* progress passes spun (lock held) before yielding */
/* ...and at least this long (RINGTRAIN_SHM_SPIN_US): a peer on the other core answers
 * within a microsecond, and yielding early hands the core to other processes */
static uint64_t spin_ns(const rt_engine *e) { return e->spin_ns; } /* read in rt_engine_init */
#define YIELD_PASSES 2000 /* then passes with sched_yield() between, before sleeping */

/* Drive until `target` is done (or, with NULL, until nothing is active). mu held.
 * When nothing moves: spin (a reply is often microseconds away), then, where the
 * transport asks for it, yield (2 ranks on 2 cores must not starve each other), then
 * sleep in the transport (shm: the futex bell; tcp: poll()). */
static void drive(rt_engine *e, rt_request *target) {
    e->driving = true;
    int idle = 0;
    uint64_t spin_start = 0;
    for (;;) {
        if (target ? target->done : (e->active == NULL || e->stop)) break;
        bool moved = false;
        if (progress_pass(e, &moved) != RT_OK) {
            rt_engine_fail(e);
            continue;
        }
        if (moved) {
            idle = 0;
            continue;
        }
        if (target ? target->done : e->active == NULL) break;
        uint64_t now = rt_now_ns(), earliest = UINT64_MAX;
        rt_request *late = NULL;
        for (rt_request *r = e->active; r; r = r->next)
            if (r->deadline_ns < earliest) {
                earliest = r->deadline_ns;
                late = r;
            }
        if (late && now >= earliest) {
            fail_timeout(e, late);
            continue;
        }
        /* a slow wait: the group publishes its state and compares it with its peers' */
        uint64_t slow = UINT64_MAX;
        rt_request *slowest = NULL;
        for (rt_request *r = e->active; r; r = r->next)
            if (r->slow_ns && r->owner && r->slow_ns < slow) {
                slow = r->slow_ns;
                slowest = r;
            }
        if (slowest && e->on_slow) {
            if (slow < e->slow_next_ns) slow = e->slow_next_ns;
            if (now >= slow) {
                e->slow_next_ns = now + 1000000000ull;
                /* the check makes store requests (up to 2 s each): it runs without the lock, so
                 * that other threads' rt_test / rt_wait / submits go on. e->driving stays set
                 * (as around the sleeps below): nobody else drives meanwhile, so no request of
                 * this group completes and the owner stays alive. Then rescan everything. */
                void *owner = slowest->owner;
                pthread_mutex_unlock(&e->mu);
                rt_status s = e->on_slow(owner);
                pthread_mutex_lock(&e->mu);
                if (s != RT_OK) rt_engine_fail(e);
                continue;
            }
            if (slow < earliest) earliest = slow;
        }
        int ms = 1000;
        if (earliest != UINT64_MAX && (earliest - now) / 1000000 + 1 < (uint64_t)ms)
            ms = (int)((earliest - now) / 1000000 + 1);
        for (rt_request *r = e->active; r; r = r->next)
            if (r->gate && !r->gate_open) ms = 1; /* nobody rings when a device copy lands: look again soon */
        if (idle == 0) spin_start = now;
        idle++;
        if (now - spin_start < spin_ns(e)) {
            rt_cpu_relax();
            continue;
        }
        const rt_transport_ops *tp = e->tp;
        if (!tp || !tp->sleep) { /* no peers (a group of one): sleep on the wake-up eventfd alone */
            pthread_mutex_unlock(&e->mu);
            struct pollfd pf = {e->evfd, POLLIN, 0};
            if (poll(&pf, 1, ms) > 0 && (pf.revents & POLLIN)) {
                uint64_t v;
                if (read(e->evfd, &v, sizeof v) < 0) { /* already drained */
                }
            }
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (tp->yield_before_sleep) {
            if (idle < SPIN_PASSES) idle = SPIN_PASSES;
            if (idle < SPIN_PASSES + YIELD_PASSES) {
                pthread_mutex_unlock(&e->mu);
                sched_yield();
                pthread_mutex_lock(&e->mu);
                continue;
            }
        }
        if (tp->sleep(e, ms) != RT_OK) {
            rt_engine_fail(e);
            continue;
        }
        idle = tp->yield_before_sleep ? SPIN_PASSES : 0; /* after a sleep, yield a little before sleeping again */
    }
    e->driving = false;
    pthread_cond_broadcast(&e->cv);
}

static void *progress_main(void *arg) {
    rt_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (e->nasync > 0 && !e->driving && e->active) {
            drive(e, NULL);
            continue;
        }
        pthread_cond_wait(&e->cv, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

rt_status rt_req_submit(rt_request *r, bool async) {
    rt_engine *e = r->eng;
    pthread_mutex_lock(&e->mu);
    if (e->broken) {
        rt_error_record rec = e->err;
        pthread_mutex_unlock(&e->mu);
        rt_error_restore(&rec);
        return RT_ERROR(rec.status, "%s: the process group is broken by an earlier error: %s", r->opname, rec.msg);
    }
    if (async && !e->thread_started) {
        if (pthread_create(&e->thread, NULL, progress_main, e) != 0) {
            pthread_mutex_unlock(&e->mu);
            return rt_error_sys(__FILE__, __LINE__, "pthread_create (progress thread)");
        }
        e->thread_started = true;
    }
    r->submitted = true;
    r->async = async;
    r->deadline_ns = rt_now_ns() + (uint64_t)(r->timeout_s * 1e9);
    r->slow_ns = r->slow_s > 0 ? rt_now_ns() + (uint64_t)(r->slow_s * 1e9) : 0;
    r->pending = r->nx;
    if (async) e->nasync++;
    r->next = e->active;
    e->active = r;
    for (int i = 0; i < r->nx; i++) {
        rt_xfer *x = &r->x[i];
        rt_chan *c = x->ch;
        if (x->is_send) {
            if (c->sq_tail)
                c->sq_tail->qnext = x;
            else
                c->sq_head = x;
            c->sq_tail = x;
        } else {
            if (c->rq_tail)
                c->rq_tail->qnext = x;
            else
                c->rq_head = x;
            c->rq_tail = x;
        }
    }
    if (r->nx == 0) req_complete(e, r, RT_OK, NULL);
    if (e->driving)
        wake_driver(e);
    else if (async)
        pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return RT_OK;
}

rt_status rt_req_wait(rt_request *r) {
    rt_engine *e = r->eng;
    pthread_mutex_lock(&e->mu);
    while (!r->done) {
        if (!e->driving)
            drive(e, r);
        else
            pthread_cond_wait(&e->cv, &e->mu);
    }
    rt_status st = r->status;
    rt_error_record rec = r->err;
    pthread_mutex_unlock(&e->mu);
    if (st != RT_OK) rt_error_restore(&rec);
    return st;
}

rt_status rt_req_test(rt_request *r, bool *done) {
    rt_engine *e = r->eng;
    pthread_mutex_lock(&e->mu);
    if (!r->done && !e->driving) {
        bool moved = false;
        if (progress_pass(e, &moved) != RT_OK)
            rt_engine_fail(e);
        else if (!r->done && rt_now_ns() >= r->deadline_ns)
            fail_timeout(e, r);
    }
    *done = r->done;
    rt_status st = r->done ? r->status : RT_OK;
    rt_error_record rec = r->err;
    pthread_mutex_unlock(&e->mu);
    if (st != RT_OK) rt_error_restore(&rec);
    return st;
}
