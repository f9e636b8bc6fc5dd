/* Unit tests of the communicator's parts that need no second process: frame parsers
 * (valid, truncated, bad magic, oversize), the store server and client in one process
 * (set/get/add/check, timeouts, job/world/duplicate checks, garbage and oversize frames
 * from a raw socket do not crash it), rendezvous variable parsing, reduce kernels. */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/rendezvous.h"
#include "dist/sock.h"
#include "dist/store.h"
#include "dist/wire.h"
#include "core/timer.h"

#include <string.h>
#include <unistd.h>

static void store_frames(void **s) {
    (void)s;
    uint8_t buf[256];
    size_t n = rt_store_frame_encode(buf, sizeof buf, RT_STORE_SET, 0, "key", 3, "value", 5);
    assert_int_equal(n, RT_STORE_HDR + 8);
    rt_store_frame f;
    size_t used;
    for (size_t cut = 0; cut < n; cut++) { /* every prefix: "need more" */
        assert_rt_ok(rt_store_frame_parse(buf, cut, &f, &used));
        assert_int_equal(used, 0);
    }
    assert_rt_ok(rt_store_frame_parse(buf, n, &f, &used));
    assert_int_equal(used, n);
    assert_int_equal(f.op, RT_STORE_SET);
    assert_memory_equal(f.key, "key", 3);
    assert_memory_equal(f.value, "value", 5);
    uint8_t bad[RT_STORE_HDR];
    memcpy(bad, buf, sizeof bad);
    bad[0] ^= 1;
    assert_int_equal(rt_store_frame_parse(bad, sizeof bad, &f, &used), RT_ERR_FORMAT);
    assert_int_equal(rt_store_frame_parse(bad, 2, &f, &used), RT_ERR_FORMAT);
    memcpy(bad, buf, sizeof bad);
    bad[4] = 99; /* op */
    assert_int_equal(rt_store_frame_parse(bad, sizeof bad, &f, &used), RT_ERR_FORMAT);
    memcpy(bad, buf, sizeof bad);
    bad[6] = 0xff, bad[7] = 0xff; /* key length 65535 > limit */
    assert_int_equal(rt_store_frame_parse(bad, sizeof bad, &f, &used), RT_ERR_FORMAT);
    memcpy(bad, buf, sizeof bad);
    bad[8] = bad[9] = bad[10] = bad[11] = 0xff; /* value 4 GiB */
    assert_int_equal(rt_store_frame_parse(bad, sizeof bad, &f, &used), RT_ERR_FORMAT);
    assert_int_equal(rt_store_frame_encode(buf, sizeof buf, RT_STORE_SET, 0, "k", 1, buf, 1000), 0); /* no room */
}

static void hello_and_header(void **s) {
    (void)s;
    rt_hello h = {.rank = 3, .world = 4}, g;
    memset(h.token, 0xab, sizeof h.token);
    uint8_t b[RT_HELLO_BYTES];
    rt_hello_encode(b, &h);
    assert_rt_ok(rt_hello_parse(b, sizeof b, &g));
    assert_int_equal(g.rank, 3);
    assert_int_equal(g.world, 4);
    assert_memory_equal(g.token, h.token, sizeof h.token);
    assert_int_equal(rt_hello_parse(b, sizeof b - 1, &g), RT_ERR_FORMAT);
    h.rank = 4; /* rank >= world */
    rt_hello_encode(b, &h);
    assert_int_equal(rt_hello_parse(b, sizeof b, &g), RT_ERR_FORMAT);
    rt_msg_hdr m = {4, 7, 99, 123456789012ull}, m2;
    uint8_t hb[RT_MSG_HDR];
    rt_msg_hdr_encode(hb, &m);
    assert_rt_ok(rt_msg_hdr_parse(hb, sizeof hb, &m2));
    assert_int_equal(m2.kind, 4);
    assert_int_equal(m2.group, 7);
    assert_int_equal(m2.seq, 99);
    assert_true(m2.nbytes == 123456789012ull);
    m.nbytes = RT_MSG_MAX_BYTES + 1;
    rt_msg_hdr_encode(hb, &m);
    assert_int_equal(rt_msg_hdr_parse(hb, sizeof hb, &m2), RT_ERR_FORMAT);
    hb[0] = 0;
    assert_int_equal(rt_msg_hdr_parse(hb, sizeof hb, &m2), RT_ERR_FORMAT);
}

static void store_roundtrip(void **s) {
    (void)s;
    rt_store_server *srv;
    int port;
    assert_rt_ok(rt_store_server_start("127.0.0.1", 0, "jobX", 2, &srv, &port));
    rt_store *a, *b;
    assert_rt_ok(rt_store_connect("127.0.0.1", port, "jobX", 0, 2, 5, &a));
    assert_rt_ok(rt_store_connect("127.0.0.1", port, "jobX", 1, 2, 5, &b));
    assert_rt_ok(rt_store_set(a, "k", "hello", 5));
    char v[16] = "";
    size_t n = 0;
    assert_rt_ok(rt_store_get(b, "k", v, sizeof v, &n));
    assert_int_equal(n, 5);
    assert_memory_equal(v, "hello", 5);
    int64_t t = 0;
    assert_rt_ok(rt_store_add(a, "c", 5, &t));
    assert_int_equal(t, 5);
    assert_rt_ok(rt_store_add(b, "c", -2, &t));
    assert_int_equal(t, 3);
    bool ex = true;
    assert_rt_ok(rt_store_check(a, "missing", &ex));
    assert_false(ex);
    assert_rt_ok(rt_store_check(a, "k", &ex));
    assert_true(ex);
    const char *keys[] = {"k", "c"};
    assert_rt_ok(rt_store_wait(b, keys, 2));
    /* a get of a key nobody sets times out (and breaks that client only) */
    rt_store_set_timeout(b, 0.2);
    assert_int_equal(rt_store_get(b, "never", v, sizeof v, &n), RT_ERR_TIMEOUT);
    assert_non_null(strstr(rt_error_message(), "never"));
    /* wrong job, wrong world size, duplicate rank, rank out of range */
    rt_store *c;
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobY", 1, 2, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "jobY"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 1, 3, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "world size mismatch"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 1, 2, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "duplicate rank 1"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 7, 2, 2, &c), RT_ERR_PEER);
    /* garbage and an oversize frame from raw sockets: the server drops them and lives on */
    for (int k = 0; k < 2; k++) {
        int fd;
        assert_rt_ok(rt_sock_connect("127.0.0.1", port, rt_now_ns() + 2000000000ull, "store", &fd));
        uint8_t junk[64];
        memset(junk, 0x41, sizeof junk);
        if (k == 1)
            rt_store_frame_encode(junk, sizeof junk, RT_STORE_SET, 0, "k", 1, NULL, 0), junk[8] = 0xff, junk[9] = 0xff,
                                                                                        junk[10] = 0xff;
        assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
        char r;
        (void)!read(fd, &r, 1); /* the server answers with an error or closes */
        close(fd);
    }
    assert_rt_ok(rt_store_set(a, "k2", "x", 1));
    assert_rt_ok(rt_store_get(a, "k2", v, sizeof v, &n));
    /* a launcher (rank -1) may connect */
    assert_rt_ok(rt_store_connect("127.0.0.1", port, "jobX", -1, 2, 2, &c));
    rt_store_close(c);
    rt_store_close(a);
    rt_store_close(b);
    rt_store_server_stop(srv);
}

static void rdzv_env(void **s) {
    (void)s;
    const char *vars[] = {"RANK",
                          "WORLD_SIZE",
                          "LOCAL_RANK",
                          "MASTER_ADDR",
                          "MASTER_PORT",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "TORCHELASTIC_USE_AGENT_STORE",
                          "RINGTRAIN_STORE_PORT",
                          "RINGTRAIN_JOB_TOKEN",
                          "TORCHELASTIC_RUN_ID",
                          "SLURM_JOB_ID",
                          "SLURM_STEP_ID",
                          "OMPI_MCA_ess_base_jobid",
                          "RINGTRAIN_STORE_HOSTED"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    rt_rdzv r;
    assert_int_equal(rt_rdzv_parse("env://", -1, -1, &r), RT_ERR_INVALID); /* no rank */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    assert_int_equal(rt_rdzv_parse("env://", -1, -1, &r), RT_ERR_INVALID); /* no MASTER_ADDR */
    assert_non_null(strstr(rt_error_message(), "MASTER_ADDR"));
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    assert_int_equal(r.rank, 1);
    assert_int_equal(r.world, 4);
    assert_int_equal(r.local_rank, 1);
    assert_int_equal(r.port, 29500);
    assert_false(r.host_store);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); /* torchrun: its store holds MASTER_PORT */
    setenv("TORCHELASTIC_RUN_ID", "run7", 1);
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    assert_int_equal(r.port, 29501);
    assert_string_equal(r.job, "run7");
    setenv("RINGTRAIN_STORE_PORT", "31000", 1);
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    assert_int_equal(r.port, 31000);
    setenv("RINGTRAIN_JOB_TOKEN", "tok", 1);
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    assert_string_equal(r.job, "tok");
    setenv("MASTER_PORT", "99999", 1);
    unsetenv("RINGTRAIN_STORE_PORT");
    assert_int_equal(rt_rdzv_parse("env://", -1, -1, &r), RT_ERR_INVALID);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    assert_rt_ok(rt_rdzv_parse("tcp://10.0.0.1:1234", -1, -1, &r));
    assert_int_equal(r.rank, 0);
    assert_int_equal(r.world, 2);
    assert_true(r.host_store);
    assert_string_equal(r.host, "10.0.0.1");
    assert_int_equal(r.port, 1234);
    assert_string_equal(r.rank_source, "OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_JOB_ID", "77", 1);
    unsetenv("RINGTRAIN_JOB_TOKEN");
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_rt_ok(rt_rdzv_parse("file:///tmp/x", -1, -1, &r));
    assert_int_equal(r.rank, 5);
    assert_int_equal(r.world, 8);
    assert_int_equal(r.local_rank, 1);
    assert_string_equal(r.job, "slurm-77.0");
    assert_int_equal(r.kind, RT_RDZV_FILE);
    setenv("SLURM_PROCID", "8", 1); /* rank >= world */
    assert_int_equal(rt_rdzv_parse("file:///tmp/x", -1, -1, &r), RT_ERR_INVALID);
    setenv("SLURM_PROCID", "x", 1);
    assert_int_equal(rt_rdzv_parse("file:///tmp/x", -1, -1, &r), RT_ERR_INVALID);
    setenv("SLURM_PROCID", "5", 1);
    assert_rt_ok(rt_rdzv_parse("file:///tmp/x", 2, 3, &r)); /* arguments win */
    assert_int_equal(r.rank, 2);
    assert_int_equal(rt_rdzv_parse("tcp://nohostport", 0, 1, &r), RT_ERR_INVALID);
    assert_int_equal(rt_rdzv_parse("udp://x:1", 0, 1, &r), RT_ERR_INVALID);
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void reduce_kernels(void **s) {
    (void)s;
    float a[5] = {1, -2, 3, 4.5f, 0}, b[5] = {2, 2, -3, 0.5f, -1};
    float x[5];
    memcpy(x, a, sizeof x);
    rt_reduce_apply(x, b, 5, RT_F32, RT_OP_SUM);
    assert_true(x[0] == 3 && x[1] == 0 && x[2] == 0 && x[3] == 5 && x[4] == -1);
    memcpy(x, a, sizeof x);
    rt_reduce_apply(x, b, 5, RT_F32, RT_OP_MIN);
    assert_true(x[0] == 1 && x[1] == -2 && x[2] == -3 && x[3] == 0.5f && x[4] == -1);
    memcpy(x, a, sizeof x);
    rt_reduce_apply(x, b, 5, RT_F32, RT_OP_MAX);
    assert_true(x[0] == 2 && x[1] == 2 && x[2] == 3 && x[3] == 4.5f && x[4] == 0);
    memcpy(x, a, sizeof x);
    rt_reduce_apply(x, b, 5, RT_F32, RT_OP_PRODUCT);
    assert_true(x[0] == 2 && x[1] == -4 && x[2] == -9 && x[3] == 2.25f && x[4] == 0);
    int64_t i[3] = {7, -7, 10}, j[3] = {0, 0, 1};
    rt_reduce_apply_div(i, j, 3, RT_I64, 2); /* truncating, as C */
    assert_true(i[0] == 3 && i[1] == -3 && i[2] == 5);
    double d[2] = {1, 3};
    rt_reduce_div(d, 2, RT_F64, 4);
    assert_true(d[0] == 0.25 && d[1] == 0.75);
    rt_reduce_op op;
    assert_int_equal(rt_reduce_op_parse("avg", &op), 0);
    assert_int_equal(op, RT_OP_AVG);
    assert_int_equal(rt_reduce_op_parse("mean", &op), -1);
    rt_algo al;
    assert_int_equal(rt_algo_parse("rsag", &al), 0);
    assert_int_equal(al, RT_ALGO_RSAG);
    rt_transport tr;
    assert_int_equal(rt_transport_parse("shm", &tr), 0);
    assert_int_equal(tr, RT_TRANSPORT_SHM);
}

/* timeouts that would make the deadline arithmetic undefined are refused up front */
static void bad_timeout(void **s) {
    (void)s;
    const double bad[] = {0.0, -1.0, 1.0 / 0.0, 0.0 / 0.0, 1e30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rt_pg_options o;
        rt_pg_options_default(&o);
        o.init_method = "tcp://127.0.0.1:1";
        o.rank = 0;
        o.world_size = 1;
        o.timeout_s = bad[i];
        rt_pg *pg = NULL;
        assert_int_equal(rt_pg_init(&o, &pg), RT_ERR_INVALID);
        assert_non_null(strstr(rt_error_message(), "dist.timeout_s"));
        rt_error_clear();
    }
}

/* The asynchronous calls reject a NULL request pointer with an error, not a crash. */
static void async_null_request(void **state) {
    (void)state;
    float buf[4] = {0};
    assert_int_equal(rt_iall_reduce(NULL, buf, 4, RT_F32, RT_OP_SUM, NULL), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "rt_iall_reduce: NULL request pointer"));
    assert_int_equal(rt_ibroadcast(NULL, buf, 4, RT_F32, 0, NULL), RT_ERR_INVALID);
    assert_int_equal(rt_ibarrier(NULL, NULL), RT_ERR_INVALID);
    assert_int_equal(rt_isend(NULL, buf, 4, RT_F32, 1, NULL), RT_ERR_INVALID);
    assert_int_equal(rt_irecv(NULL, buf, 4, RT_F32, 1, NULL), RT_ERR_INVALID);
    rt_error_clear();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(store_frames), cmocka_unit_test(hello_and_header), cmocka_unit_test(store_roundtrip),
        cmocka_unit_test(rdzv_env),     cmocka_unit_test(reduce_kernels),   cmocka_unit_test(bad_timeout),
        cmocka_unit_test(async_null_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
