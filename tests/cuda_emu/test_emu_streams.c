/* The emulated CUDA runtime (tests/cuda_emu/runtime.cpp) is strict where the GPU is
 * forgiving by timing: these tests show that each of its rules holds, and that breaking
 * the rule in a program gives a wrong result or a named fault instead of passing by luck.
 *
 * Determinism: a stream is held at a precise point by a host function that waits on a
 * semaphore the test posts, so "the consumer ran before the producer" is a fact, not a
 * race. Where a test must show that something does NOT run (an implicit or event wait
 * that holds it back), it waits a bounded time for it to run: a correct runtime passes
 * whatever the machine's speed, a broken one fails (or, on a very slow machine, is not
 * caught that time); the bound never makes a correct runtime fail.
 *
 * Every test runs with random delays before each stream operation (RINGTRAIN_EMU_DELAY_US,
 * set in main before the runtime starts). Settings read once at start
 * (CUDA_VISIBLE_DEVICES, RINGTRAIN_EMU_GPUS, RINGTRAIN_EMU_FAIL_INIT, RINGTRAIN_EMU_STATS)
 * are checked in fresh copies of this program (re-executed with a child mode argument).
 */
#include <errno.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <cuda_runtime.h>

#include "emu_internal.h"

#define assert_cuda(expr) assert_int_equal((expr), cudaSuccess)

/* ---- helpers ---------------------------------------------------------------------- */

/* a stream held by a host function until release(): a fresh semaphore each time, freed
 * by the host function once released (a reused one could be re-armed before the waiter
 * has taken the post) */
typedef struct {
    sem_t go;
    sem_t reached; /* posted when the stream's worker reaches the gate */
} gate;

static void gate_wait(void *p) {
    gate *g = p;
    sem_post(&g->reached);
    while (sem_wait(&g->go) != 0 && errno == EINTR) {
    }
    sem_destroy(&g->go);
    sem_destroy(&g->reached);
    free(g);
}

static gate *hold(cudaStream_t s) {
    gate *g = malloc(sizeof *g);
    assert_non_null(g);
    sem_init(&g->go, 0, 0);
    sem_init(&g->reached, 0, 0);
    assert_cuda(cudaLaunchHostFunc(s, gate_wait, g));
    return g;
}

static void release(gate *g) { sem_post(&g->go); }

/* until the stream's worker waits at the gate (everything before it has run); before release */
static void wait_reached(gate *g) {
    while (sem_wait(&g->reached) != 0 && errno == EINTR) {
    }
}

static void post_sem(void *p) { sem_post((sem_t *)p); }

/* whether the semaphore is posted within ms milliseconds */
static int posted_within(sem_t *s, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    int r;
    while ((r = sem_timedwait(s, &ts)) != 0 && errno == EINTR) {
    }
    return r == 0;
}

enum { NOT_RUN_MS = 150, MUST_RUN_MS = 60000 };

/* the first byte of a device buffer, read through a synchronous copy */
static unsigned char dev_byte(const void *d) {
    unsigned char b = 0;
    assert_cuda(cudaMemcpy(&b, d, 1, cudaMemcpyDeviceToHost));
    return b;
}

static const char *g_self; /* this program, for the child modes */

/* run this program as `self mode` with extra environment (NAME=VALUE, NULL-terminated);
 * its stdout into out (cap bytes), its stderr into err; returns the wait status */
static int run_self(const char *mode, const char *const *env, char *out, size_t cap, char *err, size_t ecap) {
    int po[2], pe[2];
    assert_int_equal(pipe(po), 0);
    assert_int_equal(pipe(pe), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        unsetenv("CUDA_VISIBLE_DEVICES");
        unsetenv("RINGTRAIN_EMU_FAIL_INIT");
        unsetenv("RINGTRAIN_EMU_STATS");
        unsetenv("RINGTRAIN_EMU_SYNC_LOG");
        for (; env && *env; env++) putenv((char *)*env);
        execl(g_self, g_self, mode, (char *)NULL);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    size_t n = 0, m = 0;
    ssize_t k;
    while ((k = read(po[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    while ((k = read(pe[0], err + m, ecap - 1 - m)) > 0) m += (size_t)k;
    out[n] = 0;
    err[m] = 0;
    close(po[0]);
    close(pe[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

/* ---- device memory ---------------------------------------------------------------- */

/* forked before any stream exists (the first test): a child may use the runtime */
static void test_host_read_of_device_memory_dies(void **state) {
    (void)state;
    int pe[2];
    assert_int_equal(pipe(pe), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pe[1], 2);
        void *other, *p;
        if (cudaSetDevice(1) != cudaSuccess || cudaMalloc(&other, 100) != cudaSuccess ||
            cudaMalloc(&p, 4096) != cudaSuccess)
            _exit(3);
        volatile unsigned char *b = p;
        unsigned char x = b[128]; /* the host reads device memory: the fault */
        _exit(x == 42 ? 4 : 5);
    }
    close(pe[1]);
    char err[4096];
    size_t n = 0;
    ssize_t k;
    while ((k = read(pe[0], err + n, sizeof err - 1 - n)) > 0) n += (size_t)k;
    err[n] = 0;
    close(pe[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT) fail_msg("the child was not aborted (status %#x): %s", st, err);
    if (!strstr(err, "cuda emulation: host access to device memory at 0x") ||
        !strstr(err, "of 4096 bytes on device 1 (offset 128)") || !strstr(err, "allocation #"))
        fail_msg("the message does not name the allocation: %s", err);
}

static void test_fresh_memory_is_garbage_and_free_checks(void **state) {
    (void)state;
    float *d;
    assert_cuda(cudaSetDevice(0));
    assert_cuda(cudaMalloc((void **)&d, 16 * sizeof(float)));
    float h[16];
    assert_cuda(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; i++) assert_true(h[i] != h[i]); /* NaN: 0xFF bytes */
    int on_stack;
    assert_int_equal(cudaFree((char *)d + 4), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(&on_stack), cudaErrorInvalidValue);
    assert_cuda(cudaFree(NULL));
    assert_cuda(cudaFree(d));
    assert_int_equal(cudaFree(d), cudaErrorInvalidValue); /* twice */
    (void)cudaGetLastError();
    void *big = NULL;
    assert_int_equal(cudaMalloc(&big, (size_t)81 << 30), cudaErrorMemoryAllocation);
    assert_null(big);
    assert_int_equal(cudaGetLastError(), cudaErrorMemoryAllocation);
    size_t fr, total;
    assert_cuda(cudaMemGetInfo(&fr, &total));
    assert_true(total == (size_t)80 << 30);
    /* wrong kinds: a device pointer given as host, a host pointer as device */
    char host[8] = {0};
    void *d2;
    assert_cuda(cudaMalloc(&d2, 8));
    assert_int_equal(cudaMemcpy(d2, host, 8, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, d2, 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d2, host, 9, cudaMemcpyHostToDevice), cudaErrorInvalidValue); /* past the end */
    assert_int_equal(cudaMemset(host, 0, 8), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    assert_cuda(cudaFree(d2));
}

/* ---- streams ---------------------------------------------------------------------- */

enum { FIFO_OPS = 64, FIFO_BYTES = 4096 };

/* with random delays, every operation of a stream still runs in the order enqueued */
static void test_stream_fifo_with_delays(void **state) {
    (void)state;
    cudaStream_t s;
    assert_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char *d, *out;
    assert_cuda(cudaMalloc((void **)&d, FIFO_BYTES));
    assert_cuda(cudaMallocHost((void **)&out, FIFO_OPS * FIFO_BYTES));
    for (int i = 0; i < FIFO_OPS; i++) {
        assert_cuda(cudaMemsetAsync(d, i + 1, FIFO_BYTES, s));
        assert_cuda(cudaMemcpyAsync(out + (size_t)i * FIFO_BYTES, d, FIFO_BYTES, cudaMemcpyDeviceToHost, s));
    }
    assert_cuda(cudaStreamSynchronize(s));
    for (int i = 0; i < FIFO_OPS; i++)
        for (int j = 0; j < FIFO_BYTES; j += 511) assert_int_equal(out[(size_t)i * FIFO_BYTES + j], i + 1);
    assert_cuda(cudaStreamQuery(s));
    assert_cuda(cudaFreeHost(out));
    assert_cuda(cudaFree(d));
    assert_cuda(cudaStreamDestroy(s));
}

/* an event wait orders two non-blocking streams; without it the consumer reads old data */
static void test_event_wait_orders_streams(void **state) {
    (void)state;
    cudaStream_t prod, cons;
    cudaEvent_t ev;
    assert_cuda(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking));
    assert_cuda(cudaStreamCreateWithFlags(&cons, cudaStreamNonBlocking));
    assert_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    unsigned char *d, *pin;
    assert_cuda(cudaMalloc((void **)&d, 256));
    assert_cuda(cudaMallocHost((void **)&pin, 256));
    assert_cuda(cudaMemset(d, 1, 256));
    assert_cuda(cudaDeviceSynchronize());

    /* no wait: the consumer runs while the producer is held, and sees the old bytes */
    gate *g = hold(prod);
    assert_cuda(cudaMemsetAsync(d, 7, 256, prod));
    assert_cuda(cudaEventRecord(ev, prod));
    assert_int_equal(cudaEventQuery(ev), cudaErrorNotReady);
    assert_int_equal(cudaGetLastError(), cudaErrorNotReady);
    assert_cuda(cudaMemcpyAsync(pin, d, 256, cudaMemcpyDeviceToHost, cons));
    assert_cuda(cudaStreamSynchronize(cons));
    assert_int_equal(pin[0], 1);
    release(g);
    assert_cuda(cudaEventSynchronize(ev));
    assert_cuda(cudaEventQuery(ev));

    /* with the wait: the consumer cannot run before the producer's write */
    g = hold(prod);
    assert_cuda(cudaMemsetAsync(d, 9, 256, prod));
    assert_cuda(cudaEventRecord(ev, prod));
    assert_cuda(cudaStreamWaitEvent(cons, ev, 0));
    assert_cuda(cudaMemcpyAsync(pin, d, 256, cudaMemcpyDeviceToHost, cons));
    sem_t done;
    sem_init(&done, 0, 0);
    assert_cuda(cudaLaunchHostFunc(cons, post_sem, &done));
    assert_false(posted_within(&done, NOT_RUN_MS));
    release(g);
    assert_cuda(cudaStreamSynchronize(cons));
    assert_int_equal(pin[0], 9);
    assert_true(posted_within(&done, MUST_RUN_MS));

    /* the wait is for the record that was the latest at the call, not a later one */
    g = hold(prod);
    assert_cuda(cudaEventRecord(ev, prod));
    assert_cuda(cudaStreamWaitEvent(cons, ev, 0));
    assert_cuda(cudaLaunchHostFunc(cons, post_sem, &done));
    assert_cuda(cudaEventRecord(ev, cons)); /* re-recorded after the wait: ignored by it */
    assert_false(posted_within(&done, NOT_RUN_MS));
    release(g);
    assert_true(posted_within(&done, MUST_RUN_MS));

    /* a never-recorded event is complete */
    cudaEvent_t fresh;
    assert_cuda(cudaEventCreate(&fresh));
    assert_cuda(cudaEventQuery(fresh));
    assert_cuda(cudaStreamWaitEvent(cons, fresh, 0));
    assert_cuda(cudaStreamSynchronize(cons));

    assert_cuda(cudaStreamSynchronize(prod));
    assert_cuda(cudaEventDestroy(fresh));
    assert_cuda(cudaEventDestroy(ev));
    assert_cuda(cudaFreeHost(pin));
    assert_cuda(cudaFree(d));
    assert_cuda(cudaStreamDestroy(prod));
    assert_cuda(cudaStreamDestroy(cons));
}

/* pageable sources are read at the call; pinned ones when the stream gets there;
 * a pageable destination makes the call wait, a pinned one does not */
static void test_pinned_and_pageable_copies(void **state) {
    (void)state;
    cudaStream_t s;
    assert_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d, *pin, page[64];
    assert_cuda(cudaMalloc((void **)&d, sizeof page));
    assert_cuda(cudaHostAlloc((void **)&pin, sizeof page, cudaHostAllocPortable));

    /* H2D from pageable memory: the caller may reuse the buffer at once */
    for (int i = 0; i < 64; i++) page[i] = 1;
    gate *g = hold(s);
    assert_cuda(cudaMemcpyAsync(d, page, sizeof page, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < 64; i++) page[i] = 2;
    release(g);
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(dev_byte(d), 1);

    /* H2D from pinned memory: read when the stream gets there */
    for (int i = 0; i < 64; i++) pin[i] = 3;
    g = hold(s);
    assert_cuda(cudaMemcpyAsync(d, pin, sizeof page, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < 64; i++) pin[i] = 4;
    release(g);
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(dev_byte(d), 4);

    /* D2H to pageable memory: done when the call returns, one host sync */
    memset(page, 0, sizeof page);
    unsigned long long before = rt_emu_host_syncs();
    assert_cuda(cudaMemcpyAsync(page, d, sizeof page, cudaMemcpyDeviceToHost, s));
    assert_int_equal(page[63], 4);
    assert_true(rt_emu_host_syncs() == before + 1);

    /* D2H to pinned memory: asynchronous, no host sync */
    pin[0] = 0;
    g = hold(s);
    before = rt_emu_host_syncs();
    assert_cuda(cudaMemcpyAsync(pin, d, sizeof page, cudaMemcpyDeviceToHost, s));
    assert_true(rt_emu_host_syncs() == before);
    assert_int_equal(pin[0], 0);
    release(g);
    assert_cuda(cudaStreamSynchronize(s));
    assert_int_equal(pin[0], 4);

    /* cudaMemcpyDefault infers the direction from the pointers */
    pin[5] = 77;
    assert_cuda(cudaMemcpy(d, pin, sizeof page, cudaMemcpyDefault));
    assert_cuda(cudaMemcpy(page, d, sizeof page, cudaMemcpyDefault));
    assert_int_equal(page[5], 77);

    assert_int_equal(rt_emu_is_pinned(pin + 63, sizeof(int)), 1);
    assert_int_equal(rt_emu_is_pinned(page, sizeof(int)), 0);
    assert_int_equal(cudaFreeHost(page), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    assert_cuda(cudaFreeHost(pin));
    assert_cuda(cudaFree(d));
    assert_cuda(cudaStreamDestroy(s));
}

/* the legacy default stream waits for blocking streams and they wait for it; a
 * non-blocking stream is independent of it */
static void test_legacy_stream_implicit_sync(void **state) {
    (void)state;
    assert_cuda(cudaSetDevice(0));
    cudaStream_t b, nb;
    assert_cuda(cudaStreamCreate(&b));
    assert_cuda(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    unsigned flags = 99;
    assert_cuda(cudaStreamGetFlags(nb, &flags));
    assert_int_equal(flags, cudaStreamNonBlocking);
    sem_t ran;
    sem_init(&ran, 0, 0);

    /* legacy work after blocking work waits for it */
    gate *g = hold(b);
    assert_cuda(cudaLaunchHostFunc(0, post_sem, &ran));
    assert_false(posted_within(&ran, NOT_RUN_MS));
    release(g);
    assert_true(posted_within(&ran, MUST_RUN_MS));

    /* blocking work after legacy work waits for it */
    g = hold(cudaStreamLegacy);
    assert_cuda(cudaLaunchHostFunc(b, post_sem, &ran));
    assert_false(posted_within(&ran, NOT_RUN_MS));
    release(g);
    assert_true(posted_within(&ran, MUST_RUN_MS));

    /* a non-blocking stream neither waits for the legacy stream nor holds it back */
    g = hold(nb);
    assert_cuda(cudaLaunchHostFunc(0, post_sem, &ran));
    assert_true(posted_within(&ran, MUST_RUN_MS));
    release(g);
    g = hold(0);
    assert_cuda(cudaLaunchHostFunc(nb, post_sem, &ran));
    assert_true(posted_within(&ran, MUST_RUN_MS));
    release(g);

    assert_cuda(cudaDeviceSynchronize());
    assert_cuda(cudaStreamDestroy(b));
    assert_cuda(cudaStreamDestroy(nb));
}

/* a destroyed stream's pending work still runs; its handle is invalid at once */
static void test_destroyed_stream(void **state) {
    (void)state;
    cudaStream_t s;
    unsigned char *d;
    assert_cuda(cudaMalloc((void **)&d, 64));
    assert_cuda(cudaMemset(d, 0, 64));
    assert_cuda(cudaDeviceSynchronize()); /* the non-blocking stream does not wait for it */
    assert_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gate *g = hold(s);
    assert_cuda(cudaMemsetAsync(d, 5, 64, s));
    assert_cuda(cudaStreamDestroy(s));
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(cudaMemsetAsync(d, 6, 64, s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaLaunchHostFunc(s, post_sem, NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    assert_int_equal(rt_emu_stream_enqueue(s, "test", NULL, NULL, NULL), cudaErrorInvalidResourceHandle);
    assert_int_equal(rt_emu_stream_device(s), -1);
    (void)cudaGetLastError();
    release(g);
    assert_cuda(cudaDeviceSynchronize());
    assert_int_equal(dev_byte(d), 5);
    assert_cuda(cudaFree(d));
}

/* events: another device's stream, timing, readiness, destroyed handles */
static void test_events(void **state) {
    (void)state;
    cudaEvent_t e0, t0, t1;
    cudaStream_t s1, s0;
    assert_cuda(cudaSetDevice(0));
    assert_cuda(cudaEventCreate(&e0));
    assert_cuda(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    assert_cuda(cudaSetDevice(1));
    assert_cuda(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    assert_int_equal(rt_emu_stream_device(s1), 1);
    assert_int_equal(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventRecord(e0, 0), cudaErrorInvalidResourceHandle); /* device 1's legacy stream */
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    assert_cuda(cudaEventRecord(e0, s0));
    assert_cuda(cudaStreamWaitEvent(s1, e0, 0)); /* across devices: allowed */
    assert_cuda(cudaStreamSynchronize(s1));

    /* elapsed time: real time between the moments the worker reached the records */
    assert_cuda(cudaEventCreate(&t0));
    assert_cuda(cudaEventCreate(&t1));
    float ms = -1;
    assert_int_equal(cudaEventElapsedTime(&ms, t0, t1), cudaErrorInvalidResourceHandle); /* never recorded */
    assert_cuda(cudaEventRecord(t0, s1));
    gate *g = hold(s1);
    assert_cuda(cudaEventRecord(t1, s1));
    assert_int_equal(cudaEventElapsedTime(&ms, t0, t1), cudaErrorNotReady);
    /* the 30 ms count from the moment the worker passed t0 (a worker that reached t0
     * only after the pause, under load, measured less) */
    wait_reached(g);
    struct timespec pause = {0, 30 * 1000000L};
    nanosleep(&pause, NULL);
    release(g);
    assert_cuda(cudaEventSynchronize(t1));
    assert_cuda(cudaEventElapsedTime(&ms, t0, t1));
    assert_true(ms >= 29.0f && ms < 60000.0f);
    cudaEvent_t nt;
    assert_cuda(cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
    assert_cuda(cudaEventRecord(nt, s1));
    assert_cuda(cudaEventSynchronize(nt));
    assert_int_equal(cudaEventElapsedTime(&ms, t0, nt), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventCreateWithFlags(&nt, 0x40), cudaErrorInvalidValue);

    assert_cuda(cudaEventDestroy(t1));
    assert_int_equal(cudaEventQuery(t1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventRecord(t1, s1), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaStreamWaitEvent(s1, t1, 0), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaEventDestroy(t1), cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    assert_cuda(cudaEventDestroy(t0));
    assert_cuda(cudaEventDestroy(e0));
    assert_cuda(cudaStreamDestroy(s1));
    assert_cuda(cudaStreamDestroy(s0));
    assert_cuda(cudaSetDevice(0));
}

/* each kind of host synchronisation counts once; asynchronous calls count nothing */
static void test_host_sync_counter(void **state) {
    (void)state;
    cudaStream_t s;
    cudaEvent_t e;
    int *d, h[4] = {1, 2, 3, 4};
    assert_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    assert_cuda(cudaEventCreate(&e));
    assert_cuda(cudaMalloc((void **)&d, sizeof h));
    unsigned long long n = rt_emu_host_syncs();
    assert_cuda(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s)); /* staged: no wait */
    assert_cuda(cudaMemsetAsync(d, 0, sizeof h, s));
    assert_cuda(cudaEventRecord(e, s));
    (void)cudaEventQuery(e);
    (void)cudaStreamQuery(s);
    (void)cudaGetLastError();
    assert_true(rt_emu_host_syncs() == n);
    assert_cuda(cudaStreamSynchronize(s));
    assert_true(rt_emu_host_syncs() == n + 1);
    assert_cuda(cudaEventSynchronize(e));
    assert_true(rt_emu_host_syncs() == n + 2);
    assert_cuda(cudaDeviceSynchronize());
    assert_true(rt_emu_host_syncs() == n + 3);
    assert_cuda(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    assert_true(rt_emu_host_syncs() == n + 4);
    rt_emu_count_host_sync("test");
    assert_true(rt_emu_host_syncs() == n + 5);
    assert_cuda(cudaEventDestroy(e));
    assert_cuda(cudaStreamDestroy(s));
    assert_cuda(cudaFree(d));
}

static void test_errors_and_properties(void **state) {
    (void)state;
    assert_string_equal(cudaGetErrorName(cudaErrorSystemDriverMismatch), "cudaErrorSystemDriverMismatch");
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
    assert_string_equal(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady");
    assert_int_equal(cudaErrorSystemDriverMismatch, 803);
    assert_int_equal(cudaErrorDevicesUnavailable, 46);
    assert_int_equal(cudaErrorInvalidResourceHandle, 400);
    assert_int_equal(cudaErrorNotReady, 600);
    int count = 0, dev = -1, v = 0;
    assert_cuda(cudaGetDeviceCount(&count));
    assert_int_equal(count, 2);
    assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidDevice);
    assert_cuda(cudaSetDevice(1));
    assert_cuda(cudaGetDevice(&dev));
    assert_int_equal(dev, 1);
    assert_int_equal(rt_emu_current_device(), 1);
    assert_cuda(cudaSetDevice(0));
    struct cudaDeviceProp p;
    assert_cuda(cudaGetDeviceProperties(&p, 1));
    assert_string_equal(p.name, "NVIDIA H100 80GB HBM3 (emulated)");
    assert_int_equal(p.major, 9);
    assert_int_equal(p.multiProcessorCount, 132);
    assert_true(p.totalGlobalMem == (size_t)80 << 30);
    assert_cuda(cudaDriverGetVersion(&v));
    assert_int_equal(v, 13000);
    assert_cuda(cudaRuntimeGetVersion(&v));
    assert_int_equal(v, CUDART_VERSION);
    char b0[32], b1[32];
    assert_cuda(cudaDeviceGetPCIBusId(b0, sizeof b0, 0));
    assert_cuda(cudaDeviceGetPCIBusId(b1, sizeof b1, 1));
    assert_string_not_equal(b0, b1);
}

/* ---- settings read at start: in fresh processes ----------------------------------- */

/* child: "count=N err=E" and the bus ids */
static int child_devices(void) {
    int n = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("count=%d err=%d\n", n, (int)e);
    for (int i = 0; e == cudaSuccess && i < n; i++) {
        char bus[32];
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) != cudaSuccess) return 2;
        printf("%s\n", bus);
    }
    void *p = NULL;
    printf("malloc=%d\n", (int)cudaMalloc(&p, 16));
    return 0;
}

/* child: one of each host sync, then exit (the stats line is written at exit) */
static int child_stats(void) {
    void *d;
    if (cudaMalloc(&d, 16) != cudaSuccess) return 2;
    if (cudaDeviceSynchronize() != cudaSuccess) return 3;
    if (cudaStreamSynchronize(0) != cudaSuccess) return 4;
    return 0;
}

static void expect_child(const char *const *env, const char *expect_out) {
    char out[4096], err[4096];
    int st = run_self("--child-devices", env, out, sizeof out, err, sizeof err);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("child failed (%#x): %s", st, err);
    if (strcmp(out, expect_out) != 0) fail_msg("with %s: expected\n%s\ngot\n%s", env[0], expect_out, out);
}

static void test_visible_devices_and_fail_init(void **state) {
    (void)state;
    char all[4096], err[4096];
    const char *four[] = {"RINGTRAIN_EMU_GPUS=4", NULL};
    int st = run_self("--child-devices", four, all, sizeof all, err, sizeof err);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char bus[4][32];
    assert_int_equal(sscanf(all, "count=4 err=0\n%31s\n%31s\n%31s\n%31s\n", bus[0], bus[1], bus[2], bus[3]), 4);
    /* devices 3 and 1 renumbered 0 and 1, with the PCI bus ids of the physical ones */
    char expect[512];
    snprintf(expect, sizeof expect, "count=2 err=0\n%s\n%s\nmalloc=0\n", bus[3], bus[1]);
    const char *cvd[] = {"CUDA_VISIBLE_DEVICES=3,1", "RINGTRAIN_EMU_GPUS=4", NULL};
    expect_child(cvd, expect);
    /* an invalid entry ends the list */
    snprintf(expect, sizeof expect, "count=1 err=0\n%s\nmalloc=0\n", bus[2]);
    const char *cut[] = {"CUDA_VISIBLE_DEVICES=2,7,0", "RINGTRAIN_EMU_GPUS=4", NULL};
    expect_child(cut, expect);
    const char *none[] = {"CUDA_VISIBLE_DEVICES=", NULL};
    expect_child(none, "count=0 err=100\nmalloc=100\n");
    const char *zero[] = {"RINGTRAIN_EMU_GPUS=0", NULL};
    expect_child(zero, "count=0 err=100\nmalloc=100\n");
    /* a driver mismatch is an error of its own, not "no device"; every call fails */
    const char *mismatch[] = {"RINGTRAIN_EMU_FAIL_INIT=803", NULL};
    expect_child(mismatch, "count=-1 err=803\nmalloc=803\n");
    const char *busy[] = {"RINGTRAIN_EMU_FAIL_INIT=46", NULL};
    expect_child(busy, "count=-1 err=46\nmalloc=46\n");
}

static void test_stats_and_sync_log(void **state) {
    (void)state;
    char dir[] = "/tmp/rt_emu_stats_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char stats[64], log[64], envs[128], envl[128];
    snprintf(stats, sizeof stats, "%s/stats.jsonl", dir);
    snprintf(log, sizeof log, "%s/sync.log", dir);
    snprintf(envs, sizeof envs, "RINGTRAIN_EMU_STATS=%s", stats);
    snprintf(envl, sizeof envl, "RINGTRAIN_EMU_SYNC_LOG=%s", log);
    const char *env[] = {envs, envl, NULL};
    char out[256], err[4096];
    for (int run = 0; run < 2; run++) { /* two processes append to one file */
        int st = run_self("--child-stats", env, out, sizeof out, err, sizeof err);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("child failed (%#x): %s", st, err);
    }
    FILE *f = fopen(stats, "r");
    assert_non_null(f);
    char line[256];
    for (int run = 0; run < 2; run++) {
        assert_non_null(fgets(line, sizeof line, f));
        assert_string_equal(line, "{\"host_syncs\":2,\"launches\":0,\"ops\":1,\"allocs_live\":1,\"graph_launches\":0}\n");
    }
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
    f = fopen(log, "r");
    assert_non_null(f);
    int lines = 0;
    unsigned long long t, prev = 0;
    char what[64];
    while (fscanf(f, "%llu %63s", &t, what) == 2) {
        assert_true(lines == 2 || t >= prev); /* monotonic within a process */
        prev = t;
        assert_true(strcmp(what, lines % 2 ? "cudaStreamSynchronize" : "cudaDeviceSynchronize") == 0);
        lines++;
    }
    fclose(f);
    assert_int_equal(lines, 4);
    unlink(stats);
    unlink(log);
    rmdir(dir);
}

int main(int argc, char **argv) {
    g_self = argv[0];
    if (argc > 1 && strcmp(argv[1], "--child-devices") == 0) return child_devices();
    if (argc > 1 && strcmp(argv[1], "--child-stats") == 0) return child_stats();
    /* before the runtime starts: every operation of every stream is delayed at random */
    setenv("RINGTRAIN_EMU_DELAY_US", "300", 1);
    setenv("RINGTRAIN_EMU_GPUS", "2", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("RINGTRAIN_EMU_FAIL_INIT");
    unsetenv("RINGTRAIN_EMU_STATS");
    unsetenv("RINGTRAIN_EMU_SYNC_LOG");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_read_of_device_memory_dies), /* first: forks before any worker */
        cmocka_unit_test(test_fresh_memory_is_garbage_and_free_checks),
        cmocka_unit_test(test_stream_fifo_with_delays),
        cmocka_unit_test(test_event_wait_orders_streams),
        cmocka_unit_test(test_pinned_and_pageable_copies),
        cmocka_unit_test(test_legacy_stream_implicit_sync),
        cmocka_unit_test(test_destroyed_stream),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_host_sync_counter),
        cmocka_unit_test(test_errors_and_properties),
        cmocka_unit_test(test_visible_devices_and_fail_init),
        cmocka_unit_test(test_stats_and_sync_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
