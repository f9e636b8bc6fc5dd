/* The gradient reducer (src/dist/reducer.h) with real ranks: every bucket layout
 * (one bucket, a tiny bucket size = one bucket per segment, the default) averages the
 * buffer exactly; buckets start while "backward" is still running; misuse is refused; a
 * producer stream on the CPU (rt_reducer_options.stream) changes nothing. */
#include "mp.h"

#include "core/timer.h"
#include "dist/reducer.h"

#include <string.h>
#include <time.h>

enum { NSEG = 12, SEG_FLOATS = 1000 };

typedef struct args {
    rt_transport transport;
    size_t bucket_bytes;
    int expect_buckets; /* -1: do not check */
    bool cpu_stream;    /* give the reducer a CPU stream (the stream contract: no change on the CPU) */
} args;

static int rank_main(int rank, int world, int port, void *arg) {
    const args *a = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, a->transport, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    size_t n = (size_t)NSEG * SEG_FLOATS;
    float *g = malloc(n * sizeof *g);
    size_t bounds[NSEG + 1];
    for (int s = 0; s <= NSEG; s++) bounds[s] = (size_t)s * SEG_FLOATS * sizeof(float);
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.bucket_bytes = a->bucket_bytes;
    ro.first_bucket_bytes = a->bucket_bytes;
    rt_stream *cs = NULL;
    if (a->cpu_stream) {
        MP_OK(rt_stream_create(rt_device_cpu(), &cs));
        ro.stream = cs;
    }
    rt_reducer *r;
    MP_OK(rt_reducer_create(pg, g, bounds, NSEG, &ro, &r));
    if (a->expect_buckets >= 0)
        MP_CHECK(rt_reducer_bucket_count(r) == a->expect_buckets, "%d buckets, expected %d", rt_reducer_bucket_count(r),
                 a->expect_buckets);
    /* buckets tile the buffer from its end */
    size_t prev_begin = bounds[NSEG];
    for (int i = 0; i < rt_reducer_bucket_count(r); i++) {
        size_t b, e;
        rt_reducer_bucket_range(r, i, &b, &e);
        MP_CHECK(e == prev_begin && b < e, "bucket %d [%zu, %zu) after %zu", i, b, e, prev_begin);
        prev_begin = b;
    }
    MP_CHECK(prev_begin == 0, "buckets do not reach offset 0 (%zu)", prev_begin);
    for (int step = 0; step < 3; step++) {
        /* rank r's value: r*1000 + step + i/7: the mean is known exactly in f32 */
        for (size_t i = 0; i < n; i++) g[i] = (float)(rank * 1000 + step) + (float)(i % 7);
        MP_OK(rt_reducer_begin(r));
        for (int s = NSEG - 1; s >= 0; s--) { /* "backward": segments complete from the end */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL); /* compute of the next block */
            MP_OK(rt_reducer_ready(r, bounds[s], bounds[s + 1]));
        }
        MP_OK(rt_reducer_finish(r));
        float mean_rank = 1000.0f * (float)(world - 1) / 2.0f;
        for (size_t i = 0; i < n; i++) {
            float want = mean_rank + (float)step + (float)(i % 7);
            MP_CHECK(g[i] == want, "step %d: g[%zu] = %g, expected %g", step, i, g[i], want);
        }
        rt_reducer_stats st;
        rt_reducer_stats_get(r, &st);
        MP_CHECK(st.end_ns >= st.finish_call_ns && st.finish_call_ns >= st.begin_ns, "timestamps out of order");
        if (a->bucket_bytes == 0) {
            MP_CHECK(st.buckets_before_finish == 0, "bucket_bytes 0 started %d buckets during backward",
                     st.buckets_before_finish);
        } else if (rt_reducer_bucket_count(r) > 1) {
            /* overlap: the first bucket's all-reduce began before backward ended */
            MP_CHECK(st.first_start_ns > 0 && st.first_start_ns < st.finish_call_ns,
                     "first bucket started at %llu, backward ended at %llu", (unsigned long long)st.first_start_ns,
                     (unsigned long long)st.finish_call_ns);
            MP_CHECK(st.buckets_before_finish >= rt_reducer_bucket_count(r) - 1, "%d of %d buckets before finish",
                     st.buckets_before_finish, rt_reducer_bucket_count(r));
        }
    }
    /* misuse: a segment reported twice; ready outside a step; finish with bytes missing */
    MP_OK(rt_reducer_begin(r));
    MP_CHECK(rt_reducer_ready(r, bounds[NSEG - 1], bounds[NSEG]) == RT_OK, "ready");
    if (a->bucket_bytes != 0) {
        rt_status s = rt_reducer_ready(r, bounds[NSEG - 1], bounds[NSEG]);
        MP_CHECK(s == RT_ERR_INVALID && strstr(rt_error_message(), "twice"), "double report: %s", rt_error_message());
        rt_error_clear();
    }
    for (int s = NSEG - 2; s >= 0; s--) MP_OK(rt_reducer_ready(r, bounds[s], bounds[s + 1]));
    MP_OK(rt_reducer_finish(r));
    MP_CHECK(rt_reducer_ready(r, 0, 4) == RT_ERR_INVALID, "ready outside a step accepted");
    rt_error_clear();
    rt_reducer_destroy(r);
    rt_stream_destroy(cs);
    free(g);
    rt_pg_destroy(pg);
    return 0;
}

int main(void) {
    int fails = 0;
    const args cases[] = {
        {RT_TRANSPORT_SHM, 0, 1, false},                              /* one all-reduce after backward */
        {RT_TRANSPORT_SHM, 4, NSEG, false},                           /* tiny: one bucket per segment */
        {RT_TRANSPORT_TCP, 3 * SEG_FLOATS * sizeof(float), 4, false}, /* three segments a bucket */
        {RT_TRANSPORT_SHM, (size_t)25 << 20, 1, false},               /* default size: everything fits one */
        {RT_TRANSPORT_SHM, 4, NSEG, true},                            /* a producer stream on the CPU */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int world = 2; world <= 3; world++) {
            int f = mp_run(world, rank_main, (void *)&cases[i], 60, NULL);
            if (f) fprintf(stderr, "case %zu, world %d: %d rank(s) failed\n", i, world, f);
            fails += f;
        }
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
