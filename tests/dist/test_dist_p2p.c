/* Point-to-point and sub-groups with real processes (label multiproc): the PyTorch
 * tutorial's examples (blocking and non-blocking send/recv of a tensor received as
 * 1.0; all_reduce of ones over group [0, 1] giving 2), simultaneous large isend/irecv
 * both ways (no deadlock), rt_test polling, a sub-group {0, 2} of 4 running
 * collectives while ranks 1 and 3 talk among themselves, env:// rendezvous, and
 * mismatched calls (different collectives, different sizes) reported as errors. */
#include "../test_util.h"
#include "dist/dist.h"
#include "mp.h"

#include <string.h>
#include <unistd.h>

typedef struct cfg {
    rt_transport transport;
    int use_env;
} cfg;

static int init(int rank, int world, int port, const cfg *c, double timeout, rt_pg **pg) {
    rt_pg_options o;
    MP_CHECK(rt_pg_options_default(&o) == RT_OK, "%s", rt_error_message());
    char method[64];
    if (c->use_env) { /* as torchrun would set it */
        char v[32];
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
        snprintf(v, sizeof v, "%d", rank);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", world);
        setenv("WORLD_SIZE", v, 1);
    } else {
        snprintf(method, sizeof method, "tcp://127.0.0.1:%d", port);
        o.init_method = method;
        o.rank = rank;
        o.world_size = world;
    }
    o.transport = c->transport;
    o.timeout_s = timeout;
    MP_OK(rt_pg_init(&o, pg));
    return 0;
}

static int tutorial(int rank, int world, int port, void *arg) {
    rt_pg *pg;
    if (init(rank, world, port, arg, 30, &pg)) return 1;
    MP_CHECK(rt_pg_rank(pg) == rank && rt_pg_size(pg) == world, "rank %d size %d", rt_pg_rank(pg), rt_pg_size(pg));
    /* blocking: rank 0 sends tensor+1, rank 1 receives 1.0 */
    float t = 0.0f;
    if (rank == 0) {
        t += 1.0f;
        MP_OK(rt_send(pg, &t, 1, RT_F32, 1));
    } else if (rank == 1) {
        MP_OK(rt_recv(pg, &t, 1, RT_F32, 0));
        MP_CHECK(t == 1.0f, "blocking recv got %g", t);
    }
    /* non-blocking */
    t = 0.0f;
    rt_request *req = NULL;
    if (rank == 0) {
        t += 1.0f;
        MP_OK(rt_isend(pg, &t, 1, RT_F32, 1, &req));
        MP_OK(rt_wait(req));
    } else if (rank == 1) {
        MP_OK(rt_irecv(pg, &t, 1, RT_F32, 0, &req));
        MP_OK(rt_wait(req));
        MP_CHECK(t == 1.0f, "irecv got %g", t);
    }
    /* all_reduce of ones over group [0, 1] */
    int g01[2] = {0, 1};
    rt_pg *grp = NULL;
    MP_OK(rt_pg_new_group(pg, g01, 2, &grp));
    MP_CHECK((grp != NULL) == (rank < 2), "membership");
    if (grp) {
        float ones[4] = {1, 1, 1, 1};
        MP_OK(rt_all_reduce(grp, ones, 4, RT_F32, RT_OP_SUM));
        for (int i = 0; i < 4; i++) MP_CHECK(ones[i] == 2.0f, "group all_reduce [%d] = %g", i, ones[i]);
        rt_pg_destroy(grp);
    }
    if (world < 2) {
        rt_pg_destroy(pg);
        return 0;
    }
    /* large isend/irecv both ways at once around the ring (would deadlock if sends
     * had to finish before receives start) */
    size_t n = 3u << 20; /* 12 MiB of f32 */
    float *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    MP_CHECK(out && in, "alloc");
    for (size_t i = 0; i < n; i++) out[i] = (float)(rank * 1000000 + (int)(i % 1000003));
    int right = (rank + 1) % world, left = (rank + world - 1) % world;
    rt_request *rs, *rr;
    MP_OK(rt_isend(pg, out, n, RT_F32, right, &rs));
    MP_OK(rt_irecv(pg, in, n, RT_F32, left, &rr));
    bool done = false;
    int polls = 0;
    while (!done) {
        MP_OK(rt_test(rr, &done));
        polls++;
    }
    MP_CHECK(polls >= 1, "polls");
    MP_OK(rt_wait(rr));
    MP_OK(rt_wait(rs));
    for (size_t i = 0; i < n; i++)
        MP_CHECK(in[i] == (float)(left * 1000000 + (int)(i % 1000003)), "ring exchange [%zu] = %g", i, in[i]);
    /* blocking pairwise exchange with different dtypes, lower rank sends first */
    for (int peer = 0; peer < world; peer++) {
        if (peer == rank) continue;
        int64_t v[3] = {rank, peer, -7}, got[3] = {0};
        if (rank < peer) {
            MP_OK(rt_send(pg, v, 3, RT_I64, peer));
            MP_OK(rt_recv(pg, got, 3, RT_I64, peer));
        } else {
            MP_OK(rt_recv(pg, got, 3, RT_I64, peer));
            MP_OK(rt_send(pg, v, 3, RT_I64, peer));
        }
        MP_CHECK(got[0] == peer && got[1] == rank && got[2] == -7, "pairwise from %d", peer);
    }
    /* sub-group {0, 2} of 4 while 1 and 3 exchange among themselves */
    if (world == 4) {
        int g02[2] = {0, 2};
        rt_pg *sub = NULL;
        MP_OK(rt_pg_new_group(pg, g02, 2, &sub));
        MP_CHECK((sub != NULL) == (rank == 0 || rank == 2), "sub-group membership of rank %d", rank);
        if (sub) {
            MP_CHECK(rt_pg_size(sub) == 2 && rt_pg_rank(sub) == rank / 2, "sub rank %d", rt_pg_rank(sub));
            MP_CHECK(rt_pg_world_rank(sub, 1) == 2, "world rank of sub rank 1");
            for (int a = 0; a < 3; a++) {
                int32_t x[5];
                for (int i = 0; i < 5; i++) x[i] = rank * 100 + i;
                MP_OK(rt_all_reduce_algo(sub, x, 5, RT_I32, RT_OP_SUM, (rt_algo)a));
                for (int i = 0; i < 5; i++) MP_CHECK(x[i] == 200 + 2 * i, "sub all_reduce [%d] = %d", i, x[i]);
            }
            double b = rank == 2 ? 3.5 : 0;
            MP_OK(rt_broadcast(sub, &b, 1, RT_F64, 1));
            MP_CHECK(b == 3.5, "sub broadcast from sub rank 1 got %g", b);
            int32_t me = rank, all[2] = {-1, -1};
            MP_OK(rt_all_gather(sub, &me, all, 1, RT_I32));
            MP_CHECK(all[0] == 0 && all[1] == 2, "sub all_gather %d %d", all[0], all[1]);
            MP_OK(rt_barrier(sub));
            int32_t q = 0;
            if (rt_pg_rank(sub) == 0) {
                q = 42;
                MP_OK(rt_send(sub, &q, 1, RT_I32, 1));
            } else {
                MP_OK(rt_recv(sub, &q, 1, RT_I32, 0));
                MP_CHECK(q == 42, "sub p2p got %d", q);
            }
            rt_pg_destroy(sub);
        } else {
            int32_t q[1000];
            for (int i = 0; i < 1000; i++) q[i] = rank + i;
            int other = rank == 1 ? 3 : 1;
            rt_request *a, *b;
            int32_t got[1000];
            MP_OK(rt_isend(pg, q, 1000, RT_I32, other, &a));
            MP_OK(rt_irecv(pg, got, 1000, RT_I32, other, &b));
            MP_OK(rt_wait(a));
            MP_OK(rt_wait(b));
            for (int i = 0; i < 1000; i++) MP_CHECK(got[i] == other + i, "1<->3 [%d]", i);
        }
    }
    MP_OK(rt_barrier(pg));
    free(out);
    free(in);
    rt_pg_destroy(pg);
    return 0;
}

/* Rank 0 broadcasts while rank 1 all-reduces; then (new group) sizes differ. */
static int mismatch(int rank, int world, int port, void *arg) {
    rt_pg *pg;
    if (init(rank, world, port, arg, 10, &pg)) return 1;
    float x[8] = {0};
    rt_status s = rank == 0 ? rt_broadcast(pg, x, 8, RT_F32, 0) : rt_all_reduce(pg, x, 8, RT_F32, RT_OP_SUM);
    if (rank == 1) {
        MP_CHECK(s == RT_ERR_PEER, "mismatched collective gave %s", rt_status_name(s));
        MP_CHECK(strstr(rt_error_message(), "broadcast") && strstr(rt_error_message(), "all_reduce"),
                 "message does not name both operations: %s", rt_error_message());
    }
    /* the group is broken now: later calls fail at once */
    s = rt_barrier(pg);
    if (rank == 1) MP_CHECK(s != RT_OK, "barrier on a broken group succeeded");
    rt_pg_destroy(pg);
    return 0;
}

static int size_mismatch(int rank, int world, int port, void *arg) {
    rt_pg *pg;
    if (init(rank, world, port, arg, 10, &pg)) return 1;
    int32_t x[4] = {1, 2, 3, 4};
    rt_status s = rank == 0 ? rt_send(pg, x, 4, RT_I32, 1) : rt_recv(pg, x, 3, RT_I32, 0);
    if (rank == 1) {
        MP_CHECK(s == RT_ERR_PEER, "recv of a wrong size gave %s", rt_status_name(s));
        MP_CHECK(strstr(rt_error_message(), "16 bytes") && strstr(rt_error_message(), "12 bytes"),
                 "message does not give both sizes: %s", rt_error_message());
    }
    rt_pg_destroy(pg);
    return 0;
}

/* Rank 1 leaves without rt_pg_destroy (a crash after its last operation): rank 0, which
 * hosts the store, must not wait for its goodbye until the 120 s timeout (the harness
 * kills ranks after 30 s, which would fail the test). */
static int exit_without_destroy(int rank, int world, int port, void *arg) {
    rt_pg *pg;
    if (init(rank, world, port, arg, 120, &pg)) return 1;
    MP_OK(rt_barrier(pg));
    if (rank == 1) _exit(0);
    rt_pg_destroy(pg);
    return 0;
}

static void run_limit(mp_fn fn, rt_transport t, int world, int use_env, double limit_s) {
    cfg c = {t, use_env};
    int codes[4];
    int failed = mp_run(world, fn, &c, limit_s, codes);
    for (int r = 0; r < world; r++)
        if (codes[r]) print_error("rank %d exited with %d\n", r, codes[r]);
    assert_int_equal(failed, 0);
}

static void run(mp_fn fn, rt_transport t, int world, int use_env) {
    cfg c = {t, use_env};
    int codes[4];
    int failed = mp_run(world, fn, &c, 90, codes);
    for (int r = 0; r < world; r++)
        if (codes[r]) print_error("rank %d exited with %d\n", r, codes[r]);
    assert_int_equal(failed, 0);
}

static void tutorial_env_2(void **s) {
    (void)s;
    run(tutorial, RT_TRANSPORT_AUTO, 2, 1);
}
static void tutorial_tcp_4(void **s) {
    (void)s;
    run(tutorial, RT_TRANSPORT_TCP, 4, 0);
}
static void tutorial_shm_4(void **s) {
    (void)s;
    run(tutorial, RT_TRANSPORT_SHM, 4, 0);
}
static void tutorial_tcp_3(void **s) {
    (void)s;
    run(tutorial, RT_TRANSPORT_TCP, 3, 0);
}
static void mismatch_tcp(void **s) {
    (void)s;
    run(mismatch, RT_TRANSPORT_TCP, 2, 0);
}
static void mismatch_shm(void **s) {
    (void)s;
    run(mismatch, RT_TRANSPORT_SHM, 2, 0);
}
static void size_mismatch_tcp(void **s) {
    (void)s;
    run(size_mismatch, RT_TRANSPORT_TCP, 2, 0);
}

static void exit_no_destroy(void **s) {
    (void)s;
    run_limit(exit_without_destroy, RT_TRANSPORT_SHM, 2, 0, 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tutorial_env_2),    cmocka_unit_test(tutorial_tcp_4),  cmocka_unit_test(tutorial_shm_4),
        cmocka_unit_test(tutorial_tcp_3),    cmocka_unit_test(mismatch_tcp),    cmocka_unit_test(mismatch_shm),
        cmocka_unit_test(size_mismatch_tcp), cmocka_unit_test(exit_no_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
