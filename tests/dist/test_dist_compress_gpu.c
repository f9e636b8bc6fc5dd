/* dist.compress bf16 on a GPU (label gpu; exit 77 without one, never "passed"): the
 * gradient reducer with the model's stream and compress_bf16, 2 and 3 ranks, must give
 * every rank the very bits the CPU path gives the same inputs.
 *
 * The reference is the CPU path itself, run first in this test: host buffers over shm,
 * the same reducer options, its results written to shared memory (test_dist_compress
 * checks that path against the rounding bound). Then the GPU runs: staging over shm with
 * every rank on cuda:0, and the nccl transport with a GPU per rank (where there are
 * enough GPUs, else that part is skipped; the emulated build gives it 3). Each
 * run covers the ring (its small buckets take the one-round form, the others the ring)
 * and naive algorithms, one bucket per segment and one bucket for all, two steps. With
 * 2 ranks every path's result is also checked against a formula of the test's own,
 * bf16((bf16(a) + bf16(b)) / 2) (dividing by 2 is exact in bf16 here: no subnormals).
 * The reducer must report half the buffer's bytes all-reduced.
 *
 * Segments of 300, 2000, 777, 5000 and 1200 floats: as bf16 buckets of 600, 4000, 1554,
 * 10000 and 2400 bytes, so the 4 KiB one-round form (RINGTRAIN_ALLREDUCE_SMALL_BYTES)
 * and the ring both run; the single bucket (18554 bytes) is a ring. CUDA is probed in a
 * child process (a process must not fork after initialising CUDA). */
#include "../test_util.h"
#include "core/bf16.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "mp.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>

enum { NSEG = 5, N = 300 + 2000 + 777 + 5000 + 1200, NALGO = 2, NLAYOUT = 2, NSTEP = 2, MAXW = 3 };
static const size_t k_seg[NSEG] = {300, 2000, 777, 5000, 1200};
static const rt_algo k_algo[NALGO] = {RT_ALGO_RING, RT_ALGO_NAIVE};
static const size_t k_bucket[NLAYOUT] = {4, 0}; /* one bucket per segment; one for all */

/* the CPU path's results, per world size (2, 3), algorithm, layout, step: shared memory */
static float (*g_ref)[NALGO][NLAYOUT][NSTEP][N];

typedef struct cfg {
    bool gpu;
    rt_transport transport;
    bool own_gpu; /* rank r on cuda:r (nccl); else all on cuda:0 (staging) */
} cfg;

static float value(int rank, int step, size_t i) {
    /* not representable in bf16, mixed signs and magnitudes */
    double v = sin(0.37 * (double)i + 1.3 * rank + 0.11 * step) * pow(10.0, (double)((i + (size_t)rank) % 5) - 2.0);
    return (float)(v * (1.0 + 1e-3 * rank));
}

/* This rank's check of one step's result h against the CPU reference (GPU runs) or its
 * recording (the CPU run), and with 2 ranks against the formula. */
static int check_step(const cfg *c, int world, int a, int l, int step, const float *h) {
    float *ref = g_ref[world - 2][a][l][step];
    if (!c->gpu) {
        memcpy(ref, h, sizeof(float) * N);
    } else {
        size_t differ = 0, first = N;
        for (size_t i = 0; i < N; i++)
            if (memcmp(&h[i], &ref[i], sizeof h[i]) != 0 && differ++ == 0) first = i;
        MP_CHECK(differ == 0,
                 "%s, %s, bucket_bytes %zu, step %d: %zu of %d elements differ from the CPU path's (first [%zu]: %.9g, "
                 "CPU %.9g)",
                 rt_transport_name(c->transport), rt_algo_name(k_algo[a]), k_bucket[l], step, differ, N, first,
                 (double)h[first], (double)ref[first]);
    }
    if (world == 2) {
        size_t off = 0, first = N;
        for (size_t i = 0; i < N; i++) {
            float want = rt_bf16_round((rt_bf16_round(value(0, step, i)) + rt_bf16_round(value(1, step, i))) / 2.0f);
            if (h[i] != want && off++ == 0) first = i;
        }
        MP_CHECK(off == 0, "%s, gpu %d, %s: %zu elements differ from bf16((bf16(a) + bf16(b)) / 2) (first [%zu])",
                 rt_transport_name(c->transport), (int)c->gpu, rt_algo_name(k_algo[a]), off, first);
    }
    return 0;
}

static int body(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    char method[MP_METHOD_LEN];
    rt_pg_options o;
    mp_pg_options(&o, method, rank, world, port, c->transport, 120);
    rt_device dev = c->gpu ? rt_device_cuda(c->own_gpu ? rank : 0) : rt_device_cpu();
    if (c->gpu) {
        MP_OK(rt_device_set_current(dev));
        o.device = dev;
    }
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    MP_CHECK(rt_pg_transport(pg) == c->transport, "transport %s", rt_transport_name(rt_pg_transport(pg)));
    rt_stream *model = NULL;
    if (c->gpu) {
        MP_OK(rt_pg_set_buffer_device(pg, dev));
        MP_OK(rt_stream_create(dev, &model));
    }
    float *h = malloc(N * sizeof *h), *d = h;
    MP_CHECK(h != NULL, "malloc");
    if (c->gpu) MP_OK(rt_malloc(dev, N * sizeof *h, (void **)&d));
    size_t bounds[NSEG + 1] = {0};
    for (int s = 0; s < NSEG; s++) bounds[s + 1] = bounds[s] + k_seg[s] * sizeof(float);
    for (int a = 0; a < NALGO; a++) {
        rt_pg_set_algo(pg, k_algo[a]);
        for (int l = 0; l < NLAYOUT; l++) {
            rt_reducer_options ro;
            rt_reducer_options_default(&ro);
            ro.bucket_bytes = ro.first_bucket_bytes = k_bucket[l];
            ro.compress_bf16 = true;
            ro.stream = model;
            rt_reducer *r;
            MP_OK(rt_reducer_create(pg, d, bounds, NSEG, &ro, &r));
            for (int step = 0; step < NSTEP; step++) {
                for (size_t i = 0; i < N; i++) h[i] = value(rank, step, i);
                if (c->gpu) MP_OK(rt_memcpy(d, dev, h, rt_device_cpu(), N * sizeof *h, model));
                MP_OK(rt_reducer_begin(r));
                for (int s = NSEG - 1; s >= 0; s--) MP_OK(rt_reducer_ready(r, bounds[s], bounds[s + 1]));
                MP_OK(rt_reducer_finish(r));
                if (c->gpu) {
                    memset(h, 0, N * sizeof *h);
                    MP_OK(rt_memcpy(h, rt_device_cpu(), d, dev, N * sizeof *h, model));
                    MP_OK(rt_stream_sync(model));
                }
                rt_reducer_stats st;
                rt_reducer_stats_get(r, &st);
                MP_CHECK(st.bytes == N * 2, "%zu bytes all-reduced, expected %d (half the f32 buffer's)", st.bytes,
                         N * 2);
                if (check_step(c, world, a, l, step, h)) return 1;
            }
            rt_reducer_destroy(r);
        }
    }
    if (c->gpu) {
        rt_free(dev, d);
        rt_stream_destroy(model);
    }
    free(h);
    rt_pg_destroy(pg);
    return 0;
}

int main(void) {
    int rc = 0;
    int gpus = rt_test_probe_gpus(&rc);
    if (rc != 0) return rc;
    g_ref = mmap(NULL, sizeof *g_ref * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_ref == MAP_FAILED) {
        printf("FAIL: mmap\n");
        return 1;
    }
    int fails = 0;
    for (int world = 2; world <= MAXW; world++) {
        cfg cpu = {false, RT_TRANSPORT_SHM, false};
        int f = mp_run(world, body, &cpu, 120, NULL);
        if (f) {
            fprintf(stderr, "CPU reference, %d ranks: %d rank(s) failed\n", world, f);
            fails += f;
            continue; /* no reference to compare with */
        }
        cfg staged = {true, RT_TRANSPORT_SHM, false};
        f = mp_run(world, body, &staged, 240, NULL);
        if (f) fprintf(stderr, "staging over shm, %d ranks on one GPU: %d rank(s) failed\n", world, f);
        fails += f;
        if (gpus >= world) {
            cfg nccl = {true, RT_TRANSPORT_NCCL, true};
            f = mp_run(world, body, &nccl, 240, NULL);
            if (f) fprintf(stderr, "nccl, %d ranks on %d GPUs: %d rank(s) failed\n", world, world, f);
            fails += f;
        } else {
            printf("nccl with %d ranks skipped: %d GPU(s)\n", world, gpus);
        }
    }
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
