/* The stream contract on a GPU (label gpu; exit 77 without one, never "passed"). Each rank
 * writes its gradient with a long-running kernel on its model stream (every thread spins
 * about 0.3 s, then writes) and immediately, without any host sync, all-reduces it:
 * asynchronously then rt_wait_stream on the model stream, asynchronously then rt_wait,
 * blocking, and through the gradient reducer given the model stream. The result must be
 * the sum (average) of the fully written buffers: an all-reduce that does not wait for
 * the producer's stream reads zeros. Transports: staging over shm with 2 ranks on one GPU
 * (always, with a GPU); nccl with 2 ranks on 2 GPUs (only where 2 GPUs exist; else only
 * that part is skipped, and the test exits 77 if nothing ran). CUDA is probed in a child
 * process (a process must not fork after initialising CUDA). */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "mp.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int test_spin_fill(float *p, size_t n, float scale, long long cycles, void *stream);

enum { N = 1 << 20 };
static const long long k_cycles = 500000000LL; /* ~0.3 s at 1.5-2 GHz */

typedef struct cfg {
    rt_transport transport;
    bool own_gpu; /* rank r on cuda:r (nccl); else both on cuda:0 (staging) */
} cfg;

static int check(const float *h, float scale, const char *what) {
    for (size_t i = 0; i < N; i++)
        MP_CHECK(h[i] == scale * (float)(i % 17), "%s: [%zu] = %g, expected %g (read before the producer wrote it?)",
                 what, i, h[i], scale * (float)(i % 17));
    return 0;
}

static int body(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, c->transport, 120);
    rt_device dev = rt_device_cuda(c->own_gpu ? rank : 0);
    MP_OK(rt_device_set_current(dev));
    o.device = dev;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_CHECK(rt_pg_transport(pg) == c->transport, "transport %s", rt_transport_name(rt_pg_transport(pg)));
    MP_OK(rt_pg_set_buffer_device(pg, dev));
    rt_stream *model;
    MP_OK(rt_stream_create(dev, &model));
    rt_pg_set_stream(pg, model);
    float *d = NULL, *h = malloc(N * sizeof *h);
    MP_CHECK(h != NULL, "malloc");
    MP_OK(rt_malloc(dev, N * sizeof *h, (void **)&d));
    float mine = (float)(rank + 1), sum = (float)(world * (world + 1) / 2);
    void *ms = rt_stream_native(model);

    /* 1. asynchronous, the model stream waits on the device */
    MP_OK(rt_memset(dev, d, 0, N * sizeof *h, NULL));
    MP_CHECK(test_spin_fill(d, N, mine, k_cycles, ms) == 0, "launch");
    rt_request *r;
    MP_OK(rt_iall_reduce(pg, d, N, RT_F32, RT_OP_SUM, &r));
    MP_OK(rt_wait_stream(r, model));
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, model));
    MP_OK(rt_stream_sync(model));
    if (check(h, sum, "rt_iall_reduce + rt_wait_stream")) return 1;

    /* 2. asynchronous, the host waits */
    MP_OK(rt_memset(dev, d, 0, N * sizeof *h, NULL));
    MP_CHECK(test_spin_fill(d, N, mine, k_cycles, ms) == 0, "launch");
    MP_OK(rt_iall_reduce(pg, d, N, RT_F32, RT_OP_SUM, &r));
    bool done = true;
    MP_OK(rt_test(r, &done)); /* any answer is right; it must not block or fail */
    MP_OK(rt_wait(r));
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, NULL));
    if (check(h, sum, "rt_iall_reduce + rt_wait")) return 1;

    /* 3. blocking: complete, device included, on return */
    MP_OK(rt_memset(dev, d, 0, N * sizeof *h, NULL));
    MP_CHECK(test_spin_fill(d, N, mine, k_cycles, ms) == 0, "launch");
    MP_OK(rt_all_reduce(pg, d, N, RT_F32, RT_OP_SUM));
    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, NULL));
    if (check(h, sum, "rt_all_reduce")) return 1;

    /* 4. the gradient reducer with the model stream: two segments, reported at enqueue */
    rt_pg_set_stream(pg, NULL); /* the reducer's option alone must order it */
    size_t bounds[3] = {0, N / 2 * sizeof(float), N * sizeof(float)};
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.bucket_bytes = 4;
    ro.first_bucket_bytes = 4;
    ro.op = RT_OP_SUM;
    ro.stream = model;
    rt_reducer *red;
    MP_OK(rt_reducer_create(pg, d, bounds, 2, &ro, &red));
    for (int step = 0; step < 2; step++) {
        MP_OK(rt_memset(dev, d, 0, N * sizeof *h, NULL));
        MP_OK(rt_reducer_begin(red));
        MP_CHECK(test_spin_fill(d, N, mine, k_cycles, ms) == 0, "launch");
        MP_OK(rt_reducer_ready(red, bounds[1], bounds[2]));
        MP_OK(rt_reducer_ready(red, bounds[0], bounds[1]));
        MP_OK(rt_reducer_finish(red));
        MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, model));
        MP_OK(rt_stream_sync(model));
        if (check(h, sum, "reducer")) return 1;
    }
    rt_reducer_destroy(red);
    rt_free(dev, d);
    free(h);
    rt_stream_destroy(model);
    rt_pg_destroy(pg);
    return 0;
}

int main(void) {
    int rc = 0;
    int gpus = rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    int fails = 0;
    cfg staged = {RT_TRANSPORT_SHM, false};
    int f = mp_run(2, body, &staged, 240, NULL);
    if (f) fprintf(stderr, "staging over shm, 2 ranks on one GPU: %d rank(s) failed\n", f);
    fails += f;
    if (gpus >= 2) {
        cfg nccl = {RT_TRANSPORT_NCCL, true};
        f = mp_run(2, body, &nccl, 240, NULL);
        if (f) fprintf(stderr, "nccl, 2 ranks on 2 GPUs: %d rank(s) failed\n", f);
        fails += f;
    } else {
        printf("nccl part skipped: %d GPU (needs 2)\n", gpus);
    }
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
