/* Stream capture and CUDA graphs in the emulated runtime (tests/cuda_emu/runtime.cpp,
 * section "stream capture"; issue 40, item 2): a capture records instead of running,
 * a replay runs the recorded work again with the arguments it had at the call (a host
 * value passed at capture time is baked in, pinned memory is read at replay), and what
 * CUDA refuses during a capture is refused here with CUDA's error, invalidating the
 * capture: an allocation or a host synchronisation in the modes that forbid it, a
 * synchronisation of the capturing stream, work on the legacy stream beside a capturing
 * blocking stream, a pageable copy, a wait on an event from outside the capture, an
 * unjoined fork, a query of an event recorded in a capture.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cuda_runtime.h>

#include "emu_internal.h"

#define assert_cuda(expr) assert_int_equal((expr), cudaSuccess)

/* ---- helpers ---------------------------------------------------------------------- */

/* a stream operation that adds `add` to the int at `dev` (device memory); the argument
 * outlives the graphs (static storage in the tests) */
typedef struct {
    int *dev;
    int add;
} inc_arg;

static void inc_run(void *p) {
    inc_arg *a = p;
    int *v = rt_emu_access(a->dev, sizeof(int), "inc");
    *v += a->add;
}

static void enqueue_inc(cudaStream_t s, inc_arg *a) { assert_cuda(rt_emu_stream_enqueue(s, "inc", inc_run, a, NULL)); }

static int read_int(const int *dev) {
    int v = 0;
    assert_cuda(cudaMemcpy(&v, dev, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

static int *zeroed_int(void) {
    int *d = NULL;
    assert_cuda(cudaMalloc((void **)&d, sizeof(int)));
    assert_cuda(cudaMemset(d, 0, sizeof(int)));
    assert_cuda(cudaDeviceSynchronize()); /* the legacy stream's memset, before non-blocking streams use d */
    return d;
}

static cudaStream_t new_stream(unsigned flags) {
    cudaStream_t s = NULL;
    assert_cuda(cudaStreamCreateWithFlags(&s, flags));
    return s;
}

/* end a capture expected to be invalidated: the error and no graph */
static void expect_invalidated(cudaStream_t s) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    assert_cuda(cudaStreamIsCapturing(s, &st));
    assert_int_equal(st, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t g = (cudaGraph_t)0x1;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    assert_cuda(cudaStreamIsCapturing(s, &st));
    assert_int_equal(st, cudaStreamCaptureStatusNone);
    (void)cudaGetLastError();
}

static cudaGraphExec_t end_and_instantiate(cudaStream_t s) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    assert_cuda(cudaStreamEndCapture(s, &g));
    assert_non_null(g);
    assert_cuda(cudaGraphInstantiate(&x, g, 0));
    assert_cuda(cudaGraphDestroy(g)); /* the instance keeps what it needs */
    return x;
}

/* ---- replay ----------------------------------------------------------------------- */

/* nothing runs while captured; each launch runs the work again, and is one graph launch */
static void test_replay_reexecutes(void **state) {
    (void)state;
    static inc_arg a;
    int *d = zeroed_int();
    a = (inc_arg){d, 1};
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enqueue_inc(s, &a);
    enqueue_inc(s, &a);
    cudaGraphExec_t x = end_and_instantiate(s);
    assert_int_equal(read_int(d), 0); /* captured, not run */
    unsigned long long before = rt_emu_graph_launches();
    for (int i = 0; i < 3; i++) assert_cuda(cudaGraphLaunch(x, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(read_int(d), 6);
    assert_int_equal(rt_emu_graph_launches() - before, 3);
    assert_cuda(cudaGraphExecDestroy(x));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFree(d));
}

/* a value passed at capture time is baked in; pinned memory is read at each replay */
static void test_values_baked_pinned_read(void **state) {
    (void)state;
    int *d = zeroed_int(), *d2 = zeroed_int(), *pin = NULL;
    assert_cuda(cudaMallocHost((void **)&pin, sizeof(int)));
    *pin = 5;
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    int value = 7;
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_cuda(cudaMemsetAsync(d, value, 1, s));
    assert_cuda(cudaMemcpyAsync(d2, pin, sizeof(int), cudaMemcpyHostToDevice, s));
    cudaGraphExec_t x = end_and_instantiate(s);
    value = 9; /* too late: the memset's value was taken at the call */
    *pin = 11; /* read when the copy runs */
    assert_cuda(cudaGraphLaunch(x, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(read_int(d) & 0xff, 7);
    assert_int_equal(read_int(d2), 11);
    assert_cuda(cudaGraphExecDestroy(x));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFreeHost(pin));
    assert_cuda(cudaFree(d));
    assert_cuda(cudaFree(d2));
}

/* ---- what a capture refuses --------------------------------------------------------- */

/* an allocation in global mode: refused, the capture invalidated; relaxed allows it */
static void test_allocation_in_capture(void **state) {
    (void)state;
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    void *p = NULL;
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    assert_null(p);
    expect_invalidated(s);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    assert_int_equal(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    expect_invalidated(s);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_cuda(cudaMalloc(&p, 64));
    cudaGraph_t g = NULL;
    assert_cuda(cudaStreamEndCapture(s, &g));
    assert_cuda(cudaGraphDestroy(g));
    assert_cuda(cudaFree(p));
    assert_cuda(cudaStreamDestroy(s));
}

typedef struct {
    enum cudaStreamCaptureMode mode;
    cudaError_t got;
} other_thread;

static void *malloc_elsewhere(void *p) {
    other_thread *o = p;
    enum cudaStreamCaptureMode m = o->mode;
    assert_cuda(cudaThreadExchangeStreamCaptureMode(&m));
    void *d = NULL;
    o->got = cudaMalloc(&d, 16);
    if (d) cudaFree(d);
    (void)cudaGetLastError();
    return NULL;
}

/* a global capture forbids another thread's unsafe calls, unless that thread is relaxed */
static void test_global_capture_other_thread(void **state) {
    (void)state;
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    other_thread o[2] = {{cudaStreamCaptureModeGlobal, cudaSuccess}, {cudaStreamCaptureModeRelaxed, cudaErrorUnknown}};
    for (int i = 0; i < 2; i++) {
        pthread_t t;
        assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        assert_int_equal(pthread_create(&t, NULL, malloc_elsewhere, &o[i]), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
        if (i == 0) {
            expect_invalidated(s);
        } else {
            cudaGraph_t g = NULL;
            assert_cuda(cudaStreamEndCapture(s, &g));
            assert_cuda(cudaGraphDestroy(g));
        }
    }
    assert_int_equal(o[0].got, cudaErrorStreamCaptureUnsupported);
    assert_int_equal(o[1].got, cudaSuccess);
    assert_cuda(cudaStreamDestroy(s));
}

/* synchronising or querying the capturing stream is refused even in relaxed mode */
static void test_sync_of_capturing_stream(void **state) {
    (void)state;
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    expect_invalidated(s);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported);
    expect_invalidated(s);
    assert_cuda(cudaStreamDestroy(s));
}

/* the legacy stream beside a capturing blocking stream; fine beside a non-blocking one */
static void test_legacy_stream_implicit(void **state) {
    (void)state;
    int *d = zeroed_int();
    cudaStream_t b = new_stream(cudaStreamDefault), nb = new_stream(cudaStreamNonBlocking);
    assert_cuda(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaMemsetAsync(d, 1, 4, 0), cudaErrorStreamCaptureImplicit);
    expect_invalidated(b);
    assert_cuda(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed));
    assert_cuda(cudaMemsetAsync(d, 1, 4, 0));
    cudaGraph_t g = NULL;
    assert_cuda(cudaStreamEndCapture(nb, &g));
    assert_cuda(cudaGraphDestroy(g));
    assert_cuda(cudaStreamDestroy(b));
    assert_cuda(cudaStreamDestroy(nb));
    assert_cuda(cudaFree(d));
}

/* a copy to or from pageable memory cannot be captured */
static void test_pageable_copy_in_capture(void **state) {
    (void)state;
    int *d = zeroed_int(), host = 3;
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaMemcpyAsync(d, &host, sizeof host, cudaMemcpyHostToDevice, s),
                     cudaErrorStreamCaptureUnsupported);
    expect_invalidated(s);
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFree(d));
}

/* ---- events: forks, joins, isolation, captured events --------------------------------- */

/* s1 forks s2 through an event and joins it back: both streams' work replays */
static void test_fork_join(void **state) {
    (void)state;
    static inc_arg a1, a2;
    int *d = zeroed_int();
    a1 = (inc_arg){d, 1};
    a2 = (inc_arg){d, 10};
    cudaStream_t s1 = new_stream(cudaStreamNonBlocking), s2 = new_stream(cudaStreamNonBlocking);
    cudaEvent_t fork, join;
    assert_cuda(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    assert_cuda(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    for (int joined = 0; joined < 2; joined++) {
        assert_cuda(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
        enqueue_inc(s1, &a1);
        assert_cuda(cudaEventRecord(fork, s1));
        assert_cuda(cudaStreamWaitEvent(s2, fork, 0));
        enqueue_inc(s2, &a2);
        if (!joined) { /* s2's work is never joined back */
            cudaGraph_t g = (cudaGraph_t)0x1;
            assert_int_equal(cudaStreamEndCapture(s1, &g), cudaErrorStreamCaptureUnjoined);
            assert_null(g);
            (void)cudaGetLastError();
            enum cudaStreamCaptureStatus st;
            assert_cuda(cudaStreamIsCapturing(s2, &st));
            assert_int_equal(st, cudaStreamCaptureStatusNone); /* the end took s2 out too */
            continue;
        }
        assert_cuda(cudaEventRecord(join, s2));
        assert_cuda(cudaStreamWaitEvent(s1, join, 0));
        cudaGraphExec_t x = end_and_instantiate(s1);
        assert_cuda(cudaGraphLaunch(x, s1));
        assert_cuda(cudaGraphLaunch(x, s1));
        assert_cuda(cudaStreamSynchronize(s1));
        assert_int_equal(read_int(d), 22);
        assert_cuda(cudaGraphExecDestroy(x));
    }
    /* an event recorded in a capture cannot be queried, synchronised or waited on after it */
    assert_int_equal(cudaEventQuery(join), cudaErrorCapturedEvent);
    assert_int_equal(cudaEventSynchronize(join), cudaErrorCapturedEvent);
    assert_int_equal(cudaStreamWaitEvent(s1, join, 0), cudaErrorCapturedEvent);
    (void)cudaGetLastError();
    assert_cuda(cudaEventRecord(join, s2)); /* recorded on a stream again: usable */
    assert_cuda(cudaEventSynchronize(join));
    assert_cuda(cudaEventDestroy(fork));
    assert_cuda(cudaEventDestroy(join));
    assert_cuda(cudaStreamDestroy(s1));
    assert_cuda(cudaStreamDestroy(s2));
    assert_cuda(cudaFree(d));
}

/* a wait is no work: a forked stream whose last action is a wait on the origin's event
 * (after its work was joined) ends joined, as CUDA has it */
static void test_wait_is_no_work(void **state) {
    (void)state;
    static inc_arg a2;
    int *d = zeroed_int();
    a2 = (inc_arg){d, 5};
    cudaStream_t s1 = new_stream(cudaStreamNonBlocking), s2 = new_stream(cudaStreamNonBlocking);
    cudaEvent_t e1, e2, e3;
    assert_cuda(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    assert_cuda(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
    assert_cuda(cudaEventCreateWithFlags(&e3, cudaEventDisableTiming));
    assert_cuda(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    assert_cuda(cudaEventRecord(e1, s1));
    assert_cuda(cudaStreamWaitEvent(s2, e1, 0));
    enqueue_inc(s2, &a2);
    assert_cuda(cudaEventRecord(e2, s2));
    assert_cuda(cudaStreamWaitEvent(s1, e2, 0)); /* s2's work joined */
    assert_cuda(cudaEventRecord(e3, s1));
    assert_cuda(cudaStreamWaitEvent(s2, e3, 0)); /* s2's last action: a wait */
    cudaGraphExec_t x = end_and_instantiate(s1);
    assert_cuda(cudaGraphLaunch(x, s1));
    assert_cuda(cudaStreamSynchronize(s1));
    assert_int_equal(read_int(d), 5);
    assert_cuda(cudaGraphExecDestroy(x));
    assert_cuda(cudaEventDestroy(e1));
    assert_cuda(cudaEventDestroy(e2));
    assert_cuda(cudaEventDestroy(e3));
    assert_cuda(cudaStreamDestroy(s1));
    assert_cuda(cudaStreamDestroy(s2));
    assert_cuda(cudaFree(d));
}

/* waiting inside a capture on an event recorded outside it; querying an event in global mode */
static void test_isolation_and_event_query(void **state) {
    (void)state;
    cudaStream_t s = new_stream(cudaStreamNonBlocking), other = new_stream(cudaStreamNonBlocking);
    cudaEvent_t e;
    assert_cuda(cudaEventCreate(&e));
    assert_cuda(cudaEventRecord(e, other));
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    assert_int_equal(cudaStreamWaitEvent(s, e, 0), cudaErrorStreamCaptureIsolation);
    expect_invalidated(s);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_int_equal(cudaEventQuery(e), cudaErrorStreamCaptureUnsupported);
    expect_invalidated(s);
    assert_cuda(cudaEventDestroy(e));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaStreamDestroy(other));
}

/* ---- instances: update ------------------------------------------------------------ */

static cudaGraph_t capture_memsets(cudaStream_t s, int *d, int value, int times) {
    cudaGraph_t g = NULL;
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < times; i++) assert_cuda(cudaMemsetAsync(d, value, 1, s));
    assert_cuda(cudaStreamEndCapture(s, &g));
    return g;
}

/* an update with the same operations takes the new arguments; another shape is refused
 * and leaves the instance as it was */
static void test_exec_update(void **state) {
    (void)state;
    int *d = zeroed_int();
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    cudaGraph_t g1 = capture_memsets(s, d, 1, 1), g2 = capture_memsets(s, d, 2, 1), g3 = capture_memsets(s, d, 3, 2);
    cudaGraphExec_t x = NULL;
    assert_cuda(cudaGraphInstantiate(&x, g1, 0));
    cudaGraphExecUpdateResultInfo info;
    assert_cuda(cudaGraphExecUpdate(x, g2, &info));
    assert_int_equal(info.result, cudaGraphExecUpdateSuccess);
    assert_int_equal(cudaGraphExecUpdate(x, g3, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    (void)cudaGetLastError();
    assert_cuda(cudaGraphDestroy(g1));
    assert_cuda(cudaGraphDestroy(g2));
    assert_cuda(cudaGraphDestroy(g3));
    assert_cuda(cudaGraphLaunch(x, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(read_int(d) & 0xff, 2);
    assert_cuda(cudaGraphExecDestroy(x));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFree(d));
}

/* beginning twice, ending where it did not begin, capturing the legacy stream */
static void test_begin_end_rules(void **state) {
    (void)state;
    cudaStream_t s = new_stream(cudaStreamNonBlocking), t = new_stream(cudaStreamNonBlocking);
    assert_int_equal(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
                     cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g = NULL;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    assert_int_equal(cudaStreamEndCapture(t, &g), cudaErrorIllegalState);
    assert_cuda(cudaStreamEndCapture(s, &g));
    assert_cuda(cudaGraphDestroy(g));
    (void)cudaGetLastError();
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaStreamDestroy(t));
}

/* ---- event record nodes (cudaEventRecordExternal) --------------------------------- */

static volatile int gate_open;
static void gate_run(void *p) {
    (void)p;
    while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE)) usleep(100);
}

static float elapsed(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    assert_cuda(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* An external record in a capture is a node: each launch records the event anew (not
 * complete before that launch ran, later than an event recorded before it), so events
 * time the captured work; a plain record stays a position, never recorded by a launch. */
static void test_event_record_nodes(void **state) {
    (void)state;
    static inc_arg a1;
    int *d = zeroed_int();
    a1 = (inc_arg){d, 1};
    cudaStream_t s = new_stream(cudaStreamNonBlocking);
    cudaEvent_t ea, eb, ec, ref;
    assert_cuda(cudaEventCreate(&ea));
    assert_cuda(cudaEventCreate(&eb));
    assert_cuda(cudaEventCreate(&ec));
    assert_cuda(cudaEventCreate(&ref));
    assert_int_equal(cudaEventRecordWithFlags(ea, s, 0x10), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    assert_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    assert_cuda(cudaEventRecordWithFlags(ea, s, cudaEventRecordExternal));
    enqueue_inc(s, &a1);
    assert_cuda(cudaEventRecordWithFlags(eb, s, cudaEventRecordExternal));
    assert_cuda(cudaEventRecord(ec, s));
    cudaGraphExec_t x = end_and_instantiate(s);
    gate_open = 0;
    assert_cuda(rt_emu_stream_enqueue(s, "gate", gate_run, NULL, NULL));
    assert_cuda(cudaGraphLaunch(x, s));
    assert_int_equal(cudaEventQuery(eb), cudaErrorNotReady); /* recorded by the launch, which waits */
    (void)cudaGetLastError();
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    assert_cuda(cudaEventSynchronize(eb));
    assert_int_equal(read_int(d), 1);
    assert_true(elapsed(ea, eb) >= 0);
    assert_cuda(cudaEventRecord(ref, s));
    assert_cuda(cudaEventSynchronize(ref));
    assert_true(elapsed(ref, ea) < 0); /* the first launch's record */
    assert_cuda(cudaGraphLaunch(x, s));
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(read_int(d), 2);
    assert_true(elapsed(ref, ea) >= 0); /* the second launch recorded it again */
    assert_true(elapsed(ea, eb) >= 0);
    assert_int_equal(cudaEventQuery(ec), cudaErrorCapturedEvent); /* a position, not a node */
    (void)cudaGetLastError();
    assert_cuda(cudaGraphExecDestroy(x));
    cudaEvent_t evs[] = {ea, eb, ec, ref};
    for (int i = 0; i < 4; i++) assert_cuda(cudaEventDestroy(evs[i]));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFree(d));
}

int main(void) {
    setenv("RINGTRAIN_EMU_DELAY_US", "200", 0); /* random delays before every stream operation */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_reexecutes),
        cmocka_unit_test(test_values_baked_pinned_read),
        cmocka_unit_test(test_allocation_in_capture),
        cmocka_unit_test(test_global_capture_other_thread),
        cmocka_unit_test(test_sync_of_capturing_stream),
        cmocka_unit_test(test_legacy_stream_implicit),
        cmocka_unit_test(test_pageable_copy_in_capture),
        cmocka_unit_test(test_fork_join),
        cmocka_unit_test(test_wait_is_no_work),
        cmocka_unit_test(test_isolation_and_event_query),
        cmocka_unit_test(test_exec_update),
        cmocka_unit_test(test_begin_end_rules),
        cmocka_unit_test(test_event_record_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
