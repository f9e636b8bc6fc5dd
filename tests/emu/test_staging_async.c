/* Staging does not block the thread that queues the work (label emu; issue 19, item 4).
 *
 * Two ranks share one emulated GPU, so device buffers go through pinned host memory over
 * shm. Each rank holds its model stream with a host function that waits on a flag, so
 * nothing enqueued behind it (the gradient's producer, then the copy of the bucket to the
 * host) can run; then it starts an asynchronous all-reduce of that buffer. The call must
 * return while the stream is still held: the copy's completion is waited for by the
 * engine, not by the caller (before, rt_iall_reduce waited for the copy on the host, and
 * with the stream held it never returned: the harness's limit then fails the test). Then
 * the flag is released and the result must be the sum of what the producer wrote. */
#include "../test_util.h"
#include "dist/dist.h"
#include "mp.h"

#include <cuda_runtime.h>
#include <sched.h>
#include <stdatomic.h>

enum { N = 1 << 16 };

static atomic_int g_release;

static void hold(void *arg) {
    (void)arg;
    while (!atomic_load(&g_release)) sched_yield();
}

static int body(int rank, int world, int port, void *arg) {
    (void)arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_SHM, 60);
    rt_device dev = rt_device_cuda(0);
    MP_OK(rt_device_set_current(dev));
    o.device = dev;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_OK(rt_pg_set_buffer_device(pg, dev));
    rt_stream *model;
    MP_OK(rt_stream_create(dev, &model));
    rt_pg_set_stream(pg, model);
    cudaStream_t ms = (cudaStream_t)rt_stream_native(model);
    float *d = NULL, *h = malloc(N * sizeof *h), *mine = malloc(N * sizeof *h);
    MP_CHECK(h && mine, "malloc");
    for (size_t i = 0; i < N; i++) mine[i] = (float)((rank + 1) * (int)(i % 13));
    MP_OK(rt_malloc(dev, N * sizeof *h, (void **)&d));
    MP_OK(rt_memset(dev, d, 0, N * sizeof *h, NULL));
    /* the producer: held, then it writes this rank's values */
    MP_CHECK(cudaLaunchHostFunc(ms, hold, NULL) == cudaSuccess, "cudaLaunchHostFunc");
    MP_CHECK(cudaMemcpyAsync(d, mine, N * sizeof *h, cudaMemcpyHostToDevice, ms) == cudaSuccess, "copy");
    rt_request *q = NULL;
    MP_OK(rt_iall_reduce(pg, d, N, RT_F32, RT_OP_SUM, &q)); /* returns while the stream is held */
    MP_CHECK(!atomic_load(&g_release), "impossible");
    atomic_store(&g_release, 1);
    MP_OK(rt_wait_stream(q, model));
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, model));
    MP_OK(rt_stream_sync(model));
    for (size_t i = 0; i < N; i++)
        MP_CHECK(h[i] == (float)(3 * (int)(i % 13)), "[%zu] = %g, expected %g", i, h[i], (double)(3 * (int)(i % 13)));
    rt_free(dev, d);
    free(h), free(mine);
    rt_stream_destroy(model);
    rt_pg_destroy(pg);
    return 0;
}

static void test_staged_allreduce_returns_while_stream_held(void **st) {
    (void)st;
    int codes[2];
    assert_int_equal(mp_run(2, body, NULL, 120, codes), 0);
}

int main(void) {
    int rc = 0;
    rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_staged_allreduce_returns_while_stream_held)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
