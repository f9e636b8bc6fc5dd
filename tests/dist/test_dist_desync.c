/* Hangs and desyncs with real processes (label multiproc; docs/dist.md, "Hangs and
 * desyncs"):
 *   - ranks that call all_reduce with different counts at one sequence number fail with a
 *     desync report naming both calls (tcp and shm), not a timeout;
 *   - in debug mode the same mismatch, and ones the wire cannot see (another root, another
 *     reduce op with equal sizes), fail before the operation runs, on every rank; matching
 *     calls of every kind pass; TORCH_DISTRIBUTED_DEBUG=DETAIL turns it on;
 *   - a rank stopped with SIGSTOP before a collective: the others time out and their
 *     diagnosis names it, the operation it has not started, the ranks that wait, and its
 *     last completed operation (read from its shared recorder page); also rank 0, the
 *     store's host (the diagnosis from the shared pages alone);
 *   - debug mode keeps only each rank's key of its last check in the store, however many
 *     collectives ran.
 * Each rank writes its error to <dir>/err-rank<r> and the parent checks the texts. */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/internal/pg_internal.h"
#include "dist/store.h"
#include "mp.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct cfg {
    rt_transport transport;
    bool debug;
    int mode;
    int stop_rank; /* STOPPED: the rank that stops itself */
    char dir[64];
} cfg;

enum { COUNT, ROOT, ROP, MATCH, STOPPED, KEYS };

static void put(const cfg *c, const char *name, int rank, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s-rank%d", c->dir, name, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *get(const cfg *c, const char *name, int rank) {
    static char buf[4][8192];
    static int k;
    char *b = buf[k++ % 4];
    char path[128];
    snprintf(path, sizeof path, "%s/%s-rank%d", c->dir, name, rank);
    b[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(b, 1, sizeof buf[0] - 1, f);
        b[n] = '\0';
        fclose(f);
    }
    return b;
}

/* wait for a file another rank writes (an event; the bound only keeps a broken test from
 * hanging) */
static bool wait_file(const cfg *c, const char *name, int rank) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s-rank%d", c->dir, name, rank);
    struct timespec ms = {0, 10000000};
    for (int i = 0; i < 12000; i++) {
        struct stat st;
        if (stat(path, &st) == 0) return true;
        nanosleep(&ms, NULL);
    }
    return false;
}

static int body(int rank, int world, int port, void *arg) {
    const cfg *c = arg;
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, world, port, c->transport, c->mode == STOPPED ? 4 : 30);
    o.debug = c->debug;
    rt_pg *pg;
    MP_OK(rt_pg_init(&o, &pg));
    static float buf[4000];
    rt_pg_set_tag(pg, "step 1");
    MP_OK(rt_all_reduce(pg, buf, 10, RT_F32, RT_OP_SUM)); /* #1: everyone agrees */
    rt_pg_set_op_tag(pg, "the second");
    rt_status s = RT_OK;
    switch (c->mode) {
    case COUNT: /* #2: 3000 elements on rank 0, 2000 on the others */
        s = rt_all_reduce(pg, buf, rank == 0 ? 3000 : 2000, RT_F32, RT_OP_SUM);
        break;
    case ROOT: /* every rank its own root: on the wire, roots only send, and all succeed */
        s = rt_broadcast(pg, buf, 100, RT_F32, rank);
        break;
    case ROP: /* equal sizes: the wire cannot tell sum from max */
        s = rt_all_reduce(pg, buf, 100, RT_F32, rank == 0 ? RT_OP_SUM : RT_OP_MAX);
        break;
    case MATCH: {
        double d[6] = {0}, all[6 * 4];
        MP_OK(rt_broadcast(pg, buf, 100, RT_F32, 1));
        MP_OK(rt_reduce(pg, d, 6, RT_F64, RT_OP_MAX, 0));
        MP_OK(rt_all_gather(pg, d, all, 6, RT_F64));
        MP_OK(rt_barrier(pg));
        rt_request *req;
        MP_OK(rt_iall_reduce(pg, buf, 4000, RT_F32, RT_OP_AVG, &req));
        MP_OK(rt_wait(req));
        int32_t v = rank;
        if (rank == 0) MP_OK(rt_send(pg, &v, 1, RT_I32, 1));
        if (rank == 1) MP_OK(rt_recv(pg, &v, 1, RT_I32, 0));
        rt_pg_destroy(pg);
        return 0;
    }
    case KEYS: { /* #2..#41, then count this rank's fingerprint keys left in the store */
        for (int i = 0; i < 40; i++) MP_OK(rt_all_reduce(pg, buf, 10, RT_F32, RT_OP_SUM));
        int left = 0;
        char key[64], which[256] = "";
        for (int q = 1; q <= 45; q++) {
            snprintf(key, sizeof key, "rt/fpd/%d/%d/%d", pg->id, q, rank);
            bool ex = false;
            MP_OK(rt_store_check(pg->w->store, key, &ex));
            if (ex) {
                left++;
                snprintf(which + strlen(which), sizeof which - strlen(which), " #%d", q);
            }
        }
        MP_CHECK(left == 1 && strcmp(which, " #41") == 0, "rank %d: %d fingerprint keys left:%s", rank, left, which);
        MP_OK(rt_barrier(pg));
        rt_pg_destroy(pg);
        return 0;
    }
    case STOPPED:
        if (rank == c->stop_rank) {
            char pid[32];
            snprintf(pid, sizeof pid, "%d", (int)getpid());
            put(c, "pid", rank, pid);
            raise(SIGSTOP); /* never continued: rank 0 kills it */
            return 1;
        }
        s = rt_all_reduce(pg, buf, 1000, RT_F32, RT_OP_AVG); /* #2, never started by the last rank */
        break;
    }
    put(c, "err", rank, s == RT_OK ? "OK" : rt_error_message());
    int first_live = c->stop_rank == 0 ? 1 : 0;
    if (c->mode == STOPPED && rank == first_live) { /* every live rank has written its error: end the stopped one */
        for (int r = 0; r < world; r++)
            if (r != c->stop_rank) MP_CHECK(wait_file(c, "err", r), "rank %d wrote no error", r);
        MP_CHECK(wait_file(c, "pid", c->stop_rank), "the stopped rank wrote no pid");
        kill(atoi(get(c, "pid", c->stop_rank)), SIGKILL);
    }
    rt_pg_destroy(pg);
    return 0;
}

static void run(cfg *c, int world, int *codes) {
    snprintf(c->dir, sizeof c->dir, "/tmp/rt_desync_XXXXXX");
    assert_non_null(mkdtemp(c->dir));
    mp_run(world, body, c, 120, codes);
}

static void cleanup(cfg *c) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", c->dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", c->dir);
}

/* some rank's error is a desync report at #2 naming both counts; none is a timeout */
static void count_mismatch(rt_transport t, int world, bool debug) {
    cfg c = {.transport = t, .debug = debug, .mode = COUNT};
    int codes[4];
    run(&c, world, codes);
    int found = 0;
    for (int r = 0; r < world; r++) {
        assert_int_equal(codes[r], 0);
        const char *e = get(&c, "err", r);
        fprintf(stderr, "rank %d: %s\n", r, e);
        assert_null(strstr(e, "timed out"));
        assert_string_not_equal(e, "OK");
        if (strstr(e, "desync at #2") && strstr(e, "all_reduce #2 (f32 x 3000, 12.0 kB, sum, the second, step 1)") &&
            strstr(e, "all_reduce #2 (f32 x 2000, 8.0 kB, sum, the second, step 1)"))
            found++;
    }
    /* debug mode: every rank says so, before the operation ran */
    if (debug) {
        assert_int_equal(found, world);
        for (int r = 0; r < world; r++) assert_non_null(strstr(get(&c, "err", r), "dist debug mode, before it ran"));
    } else {
        assert_true(found >= 1);
    }
    cleanup(&c);
}

static void count_tcp_2(void **s) {
    (void)s;
    count_mismatch(RT_TRANSPORT_TCP, 2, false);
}
static void count_shm_3(void **s) {
    (void)s;
    count_mismatch(RT_TRANSPORT_SHM, 3, false);
}
static void count_debug_tcp_2(void **s) {
    (void)s;
    count_mismatch(RT_TRANSPORT_TCP, 2, true);
}

/* mismatches the wire cannot see: only debug mode finds them (without it they "succeed") */
static void invisible(int mode, const char *a, const char *b) {
    for (int debug = 0; debug < 2; debug++) {
        cfg c = {.transport = RT_TRANSPORT_SHM, .debug = debug, .mode = mode};
        int codes[2];
        run(&c, 2, codes);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(codes[r], 0);
            const char *e = get(&c, "err", r);
            fprintf(stderr, "debug %d, rank %d: %s\n", debug, r, e);
            if (!debug) {
                assert_string_equal(e, "OK");
                continue;
            }
            assert_non_null(strstr(e, "desync at #2 (group 0, dist debug mode, before it ran)"));
            assert_non_null(strstr(e, a));
            assert_non_null(strstr(e, b));
        }
        cleanup(&c);
    }
}

static void root_debug_only(void **s) {
    (void)s;
    invisible(ROOT, "broadcast #2 (f32 x 100, 400 B, root 0, the second, step 1)",
              "broadcast #2 (f32 x 100, 400 B, root 1, the second, step 1)");
}
static void rop_debug_only(void **s) {
    (void)s;
    invisible(ROP, "all_reduce #2 (f32 x 100, 400 B, sum, the second, step 1)",
              "all_reduce #2 (f32 x 100, 400 B, max, the second, step 1)");
}

static void debug_matching_calls_pass(void **s) {
    (void)s;
    cfg c = {.transport = RT_TRANSPORT_TCP, .debug = true, .mode = MATCH};
    int codes[3];
    run(&c, 3, codes);
    for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
    cleanup(&c);
}

/* debug mode's fingerprints do not pile up in the store (issue 21) */
static void debug_keys_bounded(void **s) {
    (void)s;
    cfg c = {.transport = RT_TRANSPORT_SHM, .debug = true, .mode = KEYS};
    int codes[3];
    run(&c, 3, codes);
    for (int r = 0; r < 3; r++) assert_int_equal(codes[r], 0);
    cleanup(&c);
}

static void debug_env(void **s) {
    (void)s;
    rt_pg_options o;
    unsetenv("RINGTRAIN_DIST_DEBUG");
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
    assert_rt_ok(rt_pg_options_default(&o));
    assert_false(o.debug);
    setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
    assert_rt_ok(rt_pg_options_default(&o));
    assert_true(o.debug);
    setenv("TORCH_DISTRIBUTED_DEBUG", "INFO", 1);
    assert_rt_ok(rt_pg_options_default(&o));
    assert_false(o.debug);
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
    setenv("RINGTRAIN_DIST_DEBUG", "1", 1);
    assert_rt_ok(rt_pg_options_default(&o));
    assert_true(o.debug);
    unsetenv("RINGTRAIN_DIST_DEBUG");
    /* torch's values only: a number is an error naming the variable and the choices */
    setenv("TORCH_DISTRIBUTED_DEBUG", "2", 1);
    assert_rt_fails(rt_pg_options_default(&o), RT_ERR_INVALID,
                    "TORCH_DISTRIBUTED_DEBUG='2': expected one of OFF|INFO|DETAIL");
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
}

/* a rank stops itself before #2; the others' diagnosis names it (rank 0 hosts the store:
 * then the diagnosis comes from the shared pages alone) */
static void stopped(rt_transport t, int world, int stop_rank) {
    cfg c = {.transport = t, .mode = STOPPED, .stop_rank = stop_rank};
    int codes[4];
    run(&c, world, codes);
    char want[200], waiters[32] = "";
    snprintf(want, sizeof want, "rank %d has not started all_reduce #2 (f32 x 1000, 4.0 kB, avg, the second, step 1)",
             stop_rank);
    for (int r = 0; r < world; r++)
        if (r != stop_rank)
            snprintf(waiters + strlen(waiters), sizeof waiters - strlen(waiters), "%s%d", waiters[0] ? "," : "", r);
    char wait_s[64], last[200];
    snprintf(wait_s, sizeof wait_s, "ranks %s wait in it since ", waiters);
    snprintf(last, sizeof last, "rank %d's last completed: all_reduce #1 (f32 x 10, 40 B, sum, step 1)", stop_rank);
    for (int r = 0; r < world; r++) {
        if (r == stop_rank) continue;
        assert_int_equal(codes[r], 0);
        const char *e = get(&c, "err", r);
        fprintf(stderr, "rank %d: %s\n", r, e);
        assert_non_null(strstr(e, "timed out"));
        assert_non_null(strstr(e, want));
        assert_non_null(strstr(e, wait_s));
        assert_non_null(strstr(e, last));
    }
    assert_int_equal(codes[stop_rank], 128 + SIGKILL);
    cleanup(&c);
}

static void stopped_shm_3(void **s) {
    (void)s;
    stopped(RT_TRANSPORT_SHM, 3, 2);
}
static void stopped_tcp_3(void **s) {
    (void)s;
    stopped(RT_TRANSPORT_TCP, 3, 2);
}
static void stopped_store_host_shm_3(void **s) {
    (void)s;
    stopped(RT_TRANSPORT_SHM, 3, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(debug_env),
        cmocka_unit_test(debug_keys_bounded),
        cmocka_unit_test(count_tcp_2),
        cmocka_unit_test(count_shm_3),
        cmocka_unit_test(count_debug_tcp_2),
        cmocka_unit_test(root_debug_only),
        cmocka_unit_test(rop_debug_only),
        cmocka_unit_test(debug_matching_calls_pass),
        cmocka_unit_test(stopped_shm_3),
        cmocka_unit_test(stopped_tcp_3),
        cmocka_unit_test(stopped_store_host_shm_3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
