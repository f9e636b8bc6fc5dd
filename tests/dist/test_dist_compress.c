/* dist.compress bf16 (rt_reducer_options.compress_bf16) with real ranks, 2-4 of them
 * over shm and tcp, one bucket and many: every rank ends with the same bits (checked
 * against the element-wise MIN and MAX over the ranks of the result), every value is a
 * bf16, the result is within the rounding bound of the exact mean, the bytes all-reduced
 * are half the buffer's, and without compression the same data is exact f32.
 *
 * Bound: each rank's value is rounded once (2^-9 relative), the ring's n - 1 hops round
 * each partial sum (2^-9 of at most sum|g_r|), the fused division rounds once more:
 *   |result - mean| <= (2n + 1) 2^-9 sum_r |g_r| / n. */
#include "mp.h"

#include "core/bf16.h"
#include "dist/reducer.h"

#include <math.h>
#include <string.h>

enum { NSEG = 6, SEG_FLOATS = 777 };

typedef struct args {
    rt_transport transport;
    size_t bucket_bytes;
} args;

static float value(int rank, int step, size_t i) {
    /* not representable in bf16, mixed signs and magnitudes */
    double v = sin(0.37 * (double)i + 1.3 * rank + 0.11 * step) * pow(10.0, (double)((i + (size_t)rank) % 5) - 2.0);
    return (float)(v * (1.0 + 1e-3 * rank));
}

static int rank_main(int rank, int world, int port, void *arg) {
    const args *a = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, a->transport, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    const size_t n = (size_t)NSEG * SEG_FLOATS;
    float *g = malloc(n * sizeof *g), *lo = malloc(n * sizeof *lo), *hi = malloc(n * sizeof *hi);
    size_t bounds[NSEG + 1];
    for (int s = 0; s <= NSEG; s++) bounds[s] = (size_t)s * SEG_FLOATS * sizeof(float);
    for (int compress = 1; compress >= 0; compress--) {
        rt_reducer_options ro;
        rt_reducer_options_default(&ro);
        ro.bucket_bytes = a->bucket_bytes;
        ro.first_bucket_bytes = a->bucket_bytes;
        ro.compress_bf16 = compress;
        rt_reducer *r;
        MP_OK(rt_reducer_create(pg, g, bounds, NSEG, &ro, &r));
        for (int step = 0; step < 2; step++) {
            for (size_t i = 0; i < n; i++) g[i] = value(rank, step, i);
            MP_OK(rt_reducer_begin(r));
            for (int s = NSEG - 1; s >= 0; s--) MP_OK(rt_reducer_ready(r, bounds[s], bounds[s + 1]));
            MP_OK(rt_reducer_finish(r));
            rt_reducer_stats st;
            rt_reducer_stats_get(r, &st);
            MP_CHECK(st.bytes == n * (compress ? 2 : 4), "%zu bytes all-reduced, expected %zu", st.bytes,
                     n * (compress ? 2 : 4));
            /* the same bits on every rank: MIN == MAX == ours */
            memcpy(lo, g, n * sizeof *g);
            memcpy(hi, g, n * sizeof *g);
            MP_OK(rt_all_reduce(pg, lo, n, RT_F32, RT_OP_MIN));
            MP_OK(rt_all_reduce(pg, hi, n, RT_F32, RT_OP_MAX));
            size_t differ = 0, not_bf16 = 0, off = 0;
            for (size_t i = 0; i < n; i++) {
                differ += !(lo[i] == g[i] && hi[i] == g[i]);
                not_bf16 += rt_bf16_round(g[i]) != g[i];
                double mean = 0, mag = 0;
                for (int q = 0; q < world; q++) {
                    mean += value(q, step, i);
                    mag += fabs(value(q, step, i));
                }
                mean /= world;
                double tol = compress ? ldexp((2.0 * world + 1) * mag / world, -9) : ldexp(world * mag / world, -22);
                if (fabs(g[i] - mean) > tol) {
                    if (off < 3)
                        fprintf(stderr, "rank %d: g[%zu] = %.9g, mean %.9g, tol %.3g\n", rank, i, g[i], mean, tol);
                    off++;
                }
            }
            MP_CHECK(differ == 0, "compress %d: %zu elements differ between ranks", compress, differ);
            MP_CHECK(!compress || not_bf16 == 0, "%zu results are not bf16 values", not_bf16);
            MP_CHECK(off == 0, "compress %d: %zu elements outside the bound", compress, off);
            if (compress) { /* and not merely an fp32 sum: most values had to round */
                size_t changed = 0;
                for (size_t i = 0; i < n; i++) {
                    double mean = 0;
                    for (int q = 0; q < world; q++) mean += value(q, step, i);
                    changed += (float)(mean / world) != g[i];
                }
                MP_CHECK(changed > n / 2, "only %zu of %zu results differ from the f32 mean", changed, n);
            }
        }
        rt_reducer_destroy(r);
    }
    /* refused: a device stream or a non-f32 buffer */
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.compress_bf16 = true;
    ro.dtype = RT_F64;
    rt_reducer *r = NULL;
    MP_CHECK(rt_reducer_create(pg, g, bounds, NSEG, &ro, &r) == RT_ERR_UNSUPPORTED &&
                 strstr(rt_error_message(), "bf16 compression"),
             "f64 + compress accepted: %s", rt_error_message());
    rt_error_clear();
    free(g), free(lo), free(hi);
    rt_pg_destroy(pg);
    return 0;
}

int main(void) {
    int fails = 0;
    const args cases[] = {
        {RT_TRANSPORT_SHM, 0},                              /* one bucket */
        {RT_TRANSPORT_SHM, 4},                              /* one bucket per segment */
        {RT_TRANSPORT_TCP, 2 * SEG_FLOATS * sizeof(float)}, /* two segments a bucket */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int world = 2; world <= 4; world++) {
            int f = mp_run(world, rank_main, (void *)&cases[i], 60, NULL);
            if (f) fprintf(stderr, "case %zu, world %d: %d rank(s) failed\n", i, world, f);
            fails += f;
        }
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
