/* With shuffle off, the per-rank indices of rt_sampler and of `ringtrain data sampler
 * --no-shuffle` equal what torch.utils.data.distributed.DistributedSampler yields
 * (Debian's torch, run at test time by /usr/bin/python3), for world sizes 1-5, both
 * drop_last settings and sizes that do not divide evenly (N < W included). */
#include "data_test_util.h"

#include "data/sampler.h"

#define SIZES "1,2,3,7,10,13,64,101"

/* The CLI's output for one config, compared with the torch line `want` (count idx...). */
static void compare_cli(const char *bin, int64_t n, int w, int drop, int r, const int64_t *want, int64_t cnt) {
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "'%s' data sampler --world-size %d --rank %d --epoch 3 --no-shuffle %s %lld", bin, w, r,
             drop ? "--drop-last" : "", (long long)n);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    long long v;
    int64_t k = 0;
    while (fscanf(p, "%lld", &v) == 1) {
        if (k >= cnt) fail_msg("%s: more than %lld indices", cmd, (long long)cnt);
        assert_int_equal(v, want[k]);
        k++;
    }
    assert_int_equal(pclose(p), 0);
    assert_int_equal(k, cnt);
}

static void test_against_torch(void **state) {
    (void)state;
    const char *src = getenv("RINGTRAIN_SOURCE_DIR"), *bin = getenv("RINGTRAIN_BINARY");
    if (!src || !bin) fail_msg("RINGTRAIN_SOURCE_DIR / RINGTRAIN_BINARY not set (run through ctest)");
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/data/torch_sampler.py " SIZES " 5", src);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    long long n, w, drop, r, cnt;
    int lines = 0, cli = 0;
    int64_t *want = malloc(200 * sizeof *want);
    while (fscanf(p, "%lld %lld %lld %lld %lld", &n, &w, &drop, &r, &cnt) == 5) {
        assert_true(cnt <= 200);
        for (long long k = 0; k < cnt; k++) {
            long long v;
            if (fscanf(p, "%lld", &v) != 1) fail_msg("short line from the reference");
            want[k] = v;
        }
        rt_sampler s;
        rt_sampler_config c = {RT_SAMPLER_DISTRIBUTED, n, (int)w, (int)r, 0, false, drop != 0};
        assert_rt_ok(rt_sampler_init(&s, &c));
        assert_rt_ok(rt_sampler_set_epoch(&s, 3));
        if (rt_sampler_len(&s) != cnt)
            fail_msg("N=%lld W=%lld drop_last=%lld rank=%lld: %lld indices, torch has %lld", n, w, drop, r,
                     (long long)rt_sampler_len(&s), cnt);
        for (long long k = 0; k < cnt; k++)
            if (s.indices[k] != want[k])
                fail_msg("N=%lld W=%lld drop_last=%lld rank=%lld: index %lld is %lld, torch has %lld", n, w, drop, r, k,
                         (long long)s.indices[k], (long long)want[k]);
        rt_sampler_free(&s);
        /* the command line, on a subset (each call starts a process) */
        if ((n == 10 || n == 3) && drop == (r % 2)) {
            compare_cli(bin, n, (int)w, (int)drop, (int)r, want, cnt);
            cli++;
        }
        lines++;
    }
    free(want);
    assert_int_equal(pclose(p), 0);
    /* every (N, W, drop_last, rank) combination was compared: 8 sizes x 2 x (1+2+3+4+5) */
    assert_int_equal(lines, 8 * 2 * 15);
    assert_true(cli >= 10);
}

int main(void) {
    if (access("/usr/bin/python3", X_OK) != 0 || system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
        printf("SKIP: PyTorch not available at /usr/bin/python3 (scripts/install-deps test)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_torch)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
