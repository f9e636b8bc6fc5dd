/* The stream contract's request state machine (docs/dist.md, "Streams"), on the CPU:
 * a request's device part (engine.h, rt_req_dev_ops) is replaced by a fake that
 * completes after a set number of looks, fails, or records that a stream waited for it.
 * rt_test never blocks and reports "not done" until the device part completes, then its
 * result (an error stays the answer); rt_wait polls it to completion and frees the
 * request; rt_wait_stream hands it to a device stream without polling (a CPU or NULL
 * stream: the host waits instead); every request's device part is released once. A real
 * one-rank group checks that a CPU stream changes nothing for host buffers. The engine's
 * slow-wait hook (on_slow: the hang and desync check, which makes store requests) runs
 * without the engine lock: another thread's rt_test returns meanwhile (issue 21). */
#include "../test_util.h"
#include "core/internal/device_backend.h"
#include "dist/internal/engine.h"
#include "mp.h"

#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct fake {
    int looks, complete_after; /* done at look number complete_after (1-based) */
    bool fail;
    int stream_waits, releases;
} fake;

static rt_status fake_poll(rt_request *r, bool *done) {
    fake *f = r->dev_ctx;
    f->looks++;
    if (f->fail && f->looks >= f->complete_after) return RT_ERROR(RT_ERR_PEER, "fake device part failed");
    *done = f->looks >= f->complete_after;
    return RT_OK;
}
static rt_status fake_stream_wait(rt_request *r, rt_stream *s) {
    (void)s;
    ((fake *)r->dev_ctx)->stream_waits++;
    return RT_OK;
}
static void fake_release(rt_request *r) { ((fake *)r->dev_ctx)->releases++; }
static const rt_req_dev_ops k_fake = {fake_poll, fake_stream_wait, fake_release};

static rt_engine g_eng;

/* an empty request (its host part completes at submission) with the fake device part */
static rt_request *new_req(fake *f) {
    rt_request *r = NULL;
    assert_int_equal(rt_req_new(&g_eng, "fake_op", 0, 10.0, 0, &r), RT_OK);
    assert_int_equal(rt_req_submit(r, false), RT_OK);
    r->dev = &k_fake;
    r->dev_ctx = f;
    return r;
}

static void test_test_then_wait(void **state) {
    (void)state;
    fake f = {.complete_after = 3};
    rt_request *r = new_req(&f);
    bool done = true;
    assert_int_equal(rt_test(r, &done), RT_OK);
    assert_false(done); /* handed back before it completed */
    assert_int_equal(rt_test(r, &done), RT_OK);
    assert_false(done);
    assert_int_equal(rt_test(r, &done), RT_OK);
    assert_true(done);
    assert_int_equal(rt_test(r, &done), RT_OK); /* stays done, no more looks */
    assert_true(done);
    assert_int_equal(f.looks, 3);
    assert_int_equal(rt_wait(r), RT_OK);
    assert_int_equal(f.looks, 3);
    assert_int_equal(f.releases, 1);
    assert_int_equal(f.stream_waits, 0);
}

static void test_wait_polls_to_completion(void **state) {
    (void)state;
    fake f = {.complete_after = 5000}; /* past the spinning phase: yields between looks */
    rt_request *r = new_req(&f);
    assert_int_equal(rt_wait(r), RT_OK);
    assert_int_equal(f.looks, 5000);
    assert_int_equal(f.releases, 1);
}

static void test_failure_is_final(void **state) {
    (void)state;
    fake f = {.complete_after = 2, .fail = true};
    rt_request *r = new_req(&f);
    bool done = true;
    assert_int_equal(rt_test(r, &done), RT_OK);
    assert_false(done);
    assert_int_equal(rt_test(r, &done), RT_ERR_PEER);
    assert_true(done);
    rt_error_clear();
    assert_int_equal(rt_test(r, &done), RT_ERR_PEER); /* the same error again, no new look */
    assert_non_null(strstr(rt_error_message(), "fake device part failed"));
    assert_int_equal(f.looks, 2);
    assert_int_equal(rt_wait(r), RT_ERR_PEER);
    assert_int_equal(f.releases, 1);
    rt_error_clear();
    fake g = {.complete_after = 1, .fail = true};
    assert_int_equal(rt_wait(new_req(&g)), RT_ERR_PEER);
    assert_int_equal(g.releases, 1);
    rt_error_clear();
}

static void test_wait_stream(void **state) {
    (void)state;
    /* a device stream (a fake handle): the stream waits, the host does not look */
    int token = 0;
    rt_stream dev_stream = {.dev = rt_device_cuda(0), .native = &token};
    fake f = {.complete_after = 1000000};
    assert_int_equal(rt_wait_stream(new_req(&f), &dev_stream), RT_OK);
    assert_int_equal(f.looks, 0);
    assert_int_equal(f.stream_waits, 1);
    assert_int_equal(f.releases, 1);
    /* a CPU stream, or none: the host waits */
    rt_stream *cpu = NULL;
    assert_int_equal(rt_stream_create(rt_device_cpu(), &cpu), RT_OK);
    fake g = {.complete_after = 4};
    assert_int_equal(rt_wait_stream(new_req(&g), cpu), RT_OK);
    assert_int_equal(g.looks, 4);
    assert_int_equal(g.stream_waits, 0);
    assert_int_equal(g.releases, 1);
    fake h = {.complete_after = 2};
    assert_int_equal(rt_wait_stream(new_req(&h), NULL), RT_OK);
    assert_int_equal(h.looks, 2);
    assert_int_equal(h.releases, 1);
    /* a device part that already failed (seen by rt_test) is not handed to a stream */
    fake k = {.complete_after = 1, .fail = true};
    rt_request *r = new_req(&k);
    bool done;
    assert_int_equal(rt_test(r, &done), RT_ERR_PEER);
    assert_int_equal(rt_wait_stream(r, &dev_stream), RT_ERR_PEER);
    assert_int_equal(k.stream_waits, 0);
    assert_int_equal(k.releases, 1);
    rt_error_clear();
    rt_stream_destroy(cpu);
    /* argument checks */
    assert_int_equal(rt_wait_stream(NULL, NULL), RT_ERR_INVALID);
    fake m = {.complete_after = 1};
    r = new_req(&m);
    assert_int_equal(rt_test(r, NULL), RT_ERR_INVALID);
    assert_int_equal(rt_wait(r), RT_OK);
    rt_error_clear();
}

/* host buffers with a CPU stream set on the group: as without it */
static int one_rank(int rank, int world, int port, void *arg) {
    (void)arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_SHM, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    rt_stream *cpu;
    MP_OK(rt_stream_create(rt_device_cpu(), &cpu));
    MP_CHECK(rt_pg_stream(pg) == NULL, "a new group has a stream");
    rt_pg_set_stream(pg, cpu);
    MP_CHECK(rt_pg_stream(pg) == cpu, "rt_pg_stream");
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)(rank + i);
    rt_request *r;
    MP_OK(rt_iall_reduce(pg, v, 64, RT_F32, RT_OP_SUM, &r));
    MP_OK(rt_wait_stream(r, cpu));
    for (int i = 0; i < 64; i++) MP_CHECK(v[i] == (float)(world * i + world * (world - 1) / 2), "v[%d] = %g", i, v[i]);
    MP_OK(rt_all_reduce(pg, v, 64, RT_F32, RT_OP_AVG));
    rt_stream_destroy(cpu);
    rt_pg_destroy(pg);
    return 0;
}

static void test_cpu_stream_group(void **state) {
    (void)state;
    assert_int_equal(mp_run(1, one_rank, NULL, 30, NULL), 0);
    assert_int_equal(mp_run(2, one_rank, NULL, 30, NULL), 0);
}

static int g_slow; /* 1: the hook runs; 2: the main thread's rt_test returned meanwhile */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static rt_status slow_hook(void *owner) {
    (void)owner;
    __atomic_store_n(&g_slow, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 30000 && __atomic_load_n(&g_slow, __ATOMIC_SEQ_CST) != 2; i++) sleep_ms(1);
    if (__atomic_load_n(&g_slow, __ATOMIC_SEQ_CST) != 2)
        return RT_ERROR(RT_ERR_PEER, "slow hook: rt_test stayed blocked for 30 s (the engine lock held)");
    return RT_ERROR(RT_ERR_PEER, "slow hook: done");
}

typedef struct slow_wait {
    rt_request *r;
    rt_status status;
    char msg[512];
} slow_wait;

static void *wait_main(void *arg) {
    slow_wait *w = arg;
    w->status = rt_req_wait(w->r);
    snprintf(w->msg, sizeof w->msg, "%s", w->status == RT_OK ? "" : rt_error_message());
    return NULL;
}

/* a receive that never comes is slow: while the driving thread runs the hook, rt_test on
 * the main thread returns (not done) instead of waiting for the engine lock */
static void test_slow_hook_without_lock(void **state) {
    (void)state;
    rt_engine e;
    assert_int_equal(rt_engine_init(&e, 0, 2), RT_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    e.ch[1].fd = sv[0];
    assert_int_equal(rt_tcp_attach(&e), RT_OK); /* the channel is a tcp one over the socket pair */
    e.on_slow = slow_hook;
    rt_request *r;
    float buf[4];
    assert_int_equal(rt_req_new(&e, "slow_op", 0, 120.0, 1, &r), RT_OK);
    assert_non_null(rt_req_recv(r, 1, buf, sizeof buf, 1, 1, -1, RT_F32, 0, NULL, false));
    r->owner = &e;
    r->slow_s = 0.01;
    assert_int_equal(rt_req_submit(r, false), RT_OK);
    slow_wait w = {r, RT_OK, ""};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_main, &w), 0);
    for (int i = 0; i < 30000 && __atomic_load_n(&g_slow, __ATOMIC_SEQ_CST) != 1; i++) sleep_ms(1);
    assert_int_equal(__atomic_load_n(&g_slow, __ATOMIC_SEQ_CST), 1);
    bool done = true;
    rt_status st = rt_req_test(r, &done); /* blocks while the hook holds the lock */
    __atomic_store_n(&g_slow, 2, __ATOMIC_SEQ_CST);
    assert_int_equal(st, RT_OK);
    assert_false(done);
    pthread_join(t, NULL);
    print_message("the wait ended with: %s\n", w.msg);
    assert_int_equal(w.status, RT_ERR_PEER);
    assert_non_null(strstr(w.msg, "slow hook: done"));
    rt_req_free(r);
    rt_engine_destroy(&e);
    close(sv[1]);
}

int main(void) {
    if (rt_engine_init(&g_eng, 0, 1) != RT_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_test_then_wait),   cmocka_unit_test(test_wait_polls_to_completion),
        cmocka_unit_test(test_failure_is_final), cmocka_unit_test(test_wait_stream),
        cmocka_unit_test(test_cpu_stream_group), cmocka_unit_test(test_slow_hook_without_lock),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rt_engine_destroy(&g_eng);
    return rc;
}
