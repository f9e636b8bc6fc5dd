/* The reducer's buckets, exactly: whole segments from the end of the buffer, the first
 * bucket filled to first_bucket_bytes and the others to bucket_bytes (a bucket closes
 * when it reaches its target, equal counts), the rest in a last bucket that starts at 0.
 * test_dist_reducer checks that buckets tile the buffer and reduce right, which any
 * choice of boundaries does; this pins the boundaries (found by `make mutants`,
 * docs/testing.md). One rank. */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "mp.h"

enum { NSEG = 8, SEG = 100 };

static int expect(rt_pg *pg, size_t first, size_t each, int n, const size_t *want_begin) {
    static float g[NSEG * SEG / 4];
    size_t bounds[NSEG + 1];
    for (int s = 0; s <= NSEG; s++) bounds[s] = (size_t)s * SEG;
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.bucket_bytes = each;
    ro.first_bucket_bytes = first;
    rt_reducer *r;
    MP_OK(rt_reducer_create(pg, g, bounds, NSEG, &ro, &r));
    MP_CHECK(rt_reducer_bucket_count(r) == n, "first %zu, others %zu: %d buckets, expected %d", first, each,
             rt_reducer_bucket_count(r), n);
    size_t end = NSEG * SEG;
    for (int i = 0; i < n; i++) {
        size_t b, e;
        rt_reducer_bucket_range(r, i, &b, &e);
        MP_CHECK(b == want_begin[i] && e == end, "first %zu, others %zu: bucket %d is [%zu, %zu), expected [%zu, %zu)",
                 first, each, i, b, e, want_begin[i], end);
        end = b;
    }
    rt_reducer_destroy(r);
    return 0;
}

static int rank_main(int rank, int world, int port, void *arg) {
    (void)arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, RT_TRANSPORT_TCP, 30);
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    /* first bucket one segment, the others three */
    static const size_t a[] = {700, 400, 100, 0};
    if (expect(pg, 100, 300, 4, a)) return 1;
    /* first bucket three segments, the others one */
    static const size_t b[] = {500, 400, 300, 200, 100, 0};
    if (expect(pg, 300, 100, 6, b)) return 1;
    /* targets between segment sizes: a bucket takes segments until it reaches them */
    static const size_t c[] = {600, 300, 0};
    if (expect(pg, 150, 250, 3, c)) return 1;
    /* first_bucket_bytes 0: every bucket to bucket_bytes */
    static const size_t d[] = {600, 400, 200, 0};
    if (expect(pg, 0, 200, 4, d)) return 1;
    rt_pg_destroy(pg);
    return 0;
}

static void test_bucket_boundaries(void **state) {
    (void)state;
    int codes[1];
    assert_int_equal(mp_run(1, rank_main, NULL, 60, codes), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_bucket_boundaries)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
