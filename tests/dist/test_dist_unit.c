/* Unit tests of the communicator's parts that need no second process: frame parsers
 * (valid, truncated, bad magic, oversize), the store server and client in one process
 * (set/get/add/check, timeouts, job/world/duplicate checks, garbage and oversize frames
 * from a raw socket do not crash it), rendezvous variable parsing, reduce kernels. */
#include "../test_util.h"
#include "dist/dist.h"
#include "dist/internal/auth.h"
#include "dist/internal/pg_internal.h"
#include "dist/internal/rendezvous.h"
#include "dist/internal/sock.h"
#include "dist/store.h"
#include "dist/internal/wire.h"
#include "dist/reducer.h"
#include "core/timer.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
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
    rt_hello h = {.step = RT_HELLO_ANSWER, .rank = 3, .world = 4}, g;
    memset(h.nonce, 0xab, sizeof h.nonce);
    memset(h.mac, 0xcd, sizeof h.mac);
    uint8_t b[RT_HELLO_BYTES];
    rt_hello_encode(b, &h);
    assert_rt_ok(rt_hello_parse(b, sizeof b, &g));
    assert_int_equal(g.step, RT_HELLO_ANSWER);
    assert_int_equal(g.rank, 3);
    assert_int_equal(g.world, 4);
    assert_memory_equal(g.nonce, h.nonce, sizeof h.nonce);
    assert_memory_equal(g.mac, h.mac, sizeof h.mac);
    assert_int_equal(rt_hello_parse(b, sizeof b - 1, &g), RT_ERR_FORMAT);
    h.step = RT_HELLO_STEP_MAX_; /* unknown step */
    rt_hello_encode(b, &h);
    assert_int_equal(rt_hello_parse(b, sizeof b, &g), RT_ERR_FORMAT);
    h.step = RT_HELLO_OPEN;
    rt_store_hello sh = {.rank = -1, .world = 2}, sg;
    uint8_t sb[RT_STORE_HELLO_BYTES];
    rt_store_hello_encode(sb, &sh);
    assert_rt_ok(rt_store_hello_parse(sb, sizeof sb, &sg));
    assert_int_equal(sg.rank, -1);
    assert_int_equal(rt_store_hello_parse(sb, sizeof sb - 1, &sg), RT_ERR_FORMAT);
    sh.rank = 2; /* rank >= world */
    rt_store_hello_encode(sb, &sh);
    assert_int_equal(rt_store_hello_parse(sb, sizeof sb, &sg), RT_ERR_FORMAT);
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

/* The handshake's proofs (auth.h): a good one passes, and a wrong secret, a replay
 * against a fresh challenge, a changed claim or a truncated hello are refused alike;
 * the server's proof is what the client expects; the transport proofs likewise. */
static void auth_proofs(void **s) {
    (void)s;
    uint8_t ns[RT_AUTH_NONCE], ns2[RT_AUTH_NONCE], val[RT_STORE_HELLO_BYTES], expect[RT_AUTH_MAC], proof[RT_AUTH_MAC];
    memset(ns, 1, sizeof ns);
    memset(ns2, 2, sizeof ns2);
    rt_store_hello h;
    assert_rt_ok(rt_auth_store_answer("s3cret", ns, 1, 4, val, expect));
    assert_rt_ok(rt_auth_store_verify("s3cret", ns, val, sizeof val, &h, proof));
    assert_int_equal(h.rank, 1);
    assert_int_equal(h.world, 4);
    assert_memory_equal(proof, expect, RT_AUTH_MAC);
    /* the secret itself is nowhere in what the client sends */
    assert_null(memmem(val, sizeof val, "s3cret", 6));
    assert_int_equal(rt_auth_store_verify("other", ns, val, sizeof val, &h, proof), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), RT_AUTH_REFUSED));
    assert_int_equal(rt_auth_store_verify("s3cret", ns2, val, sizeof val, &h, proof), RT_ERR_PEER); /* replay */
    uint8_t t[RT_STORE_HELLO_BYTES];
    memcpy(t, val, sizeof t);
    t[RT_AUTH_NONCE] = 0; /* claim rank 0 instead of 1 with rank 1's proof */
    assert_int_equal(rt_auth_store_verify("s3cret", ns, t, sizeof t, &h, proof), RT_ERR_PEER);
    memcpy(t, val, sizeof t);
    t[sizeof t - 1] ^= 1;
    assert_int_equal(rt_auth_store_verify("s3cret", ns, t, sizeof t, &h, proof), RT_ERR_PEER);
    assert_int_equal(rt_auth_store_verify("s3cret", ns, val, sizeof val - 1, &h, proof), RT_ERR_PEER);
    /* two answers to one challenge differ (the client's own nonce) */
    uint8_t val2[RT_STORE_HELLO_BYTES], expect2[RT_AUTH_MAC];
    assert_rt_ok(rt_auth_store_answer("s3cret", ns, 1, 4, val2, expect2));
    assert_memory_not_equal(val, val2, sizeof val);
    /* transport: keys differ per launch nonce and per secret; proofs per side */
    uint8_t l1[RT_TOKEN_BYTES] = {1}, l2[RT_TOKEN_BYTES] = {2}, k1[RT_AUTH_MAC], k2[RT_AUTH_MAC], k3[RT_AUTH_MAC];
    assert_rt_ok(rt_auth_peer_key("s3cret", l1, k1));
    assert_rt_ok(rt_auth_peer_key("s3cret", l2, k2));
    assert_rt_ok(rt_auth_peer_key("other", l1, k3));
    assert_memory_not_equal(k1, k2, RT_AUTH_MAC);
    assert_memory_not_equal(k1, k3, RT_AUTH_MAC);
    uint8_t c[RT_AUTH_MAC], a[RT_AUTH_MAC], c2[RT_AUTH_MAC], a2[RT_AUTH_MAC];
    assert_rt_ok(rt_auth_peer_proofs(k1, ns, ns2, 2, 0, 3, c, a));
    assert_memory_not_equal(c, a, RT_AUTH_MAC);
    assert_rt_ok(rt_auth_peer_proofs(k1, ns, ns2, 1, 0, 3, c2, a2));
    assert_memory_not_equal(c, c2, RT_AUTH_MAC);
    assert_true(rt_auth_equal(c, c, RT_AUTH_MAC));
    assert_false(rt_auth_equal(c, c2, RT_AUTH_MAC));
    rt_error_clear();
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
    /* wrong secret (one generic refusal: it names neither secret), wrong world size,
     * a rank already joined (named with its address), rank out of range */
    rt_store *c;
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobY", 1, 2, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "refused this process"));
    assert_null(strstr(rt_error_message(), "jobX"));
    assert_null(strstr(rt_error_message(), "jobY"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 1, 3, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "world size mismatch"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 1, 2, 2, &c), RT_ERR_PEER);
    assert_non_null(strstr(rt_error_message(), "rank 1 already joined from 127.0.0.1:"));
    assert_int_equal(rt_store_connect("127.0.0.1", port, "jobX", 7, 2, 2, &c), RT_ERR_PEER);
    /* a value of the largest size the limits allow, under the longest key (a value just
     * under 1 MiB used to reset the connection: the buffer stopped short of a whole frame) */
    {
        char big_key[RT_STORE_MAX_KEY + 1];
        memset(big_key, 'k', RT_STORE_MAX_KEY);
        big_key[RT_STORE_MAX_KEY] = '\0';
        uint8_t *big = malloc(RT_STORE_MAX_VALUE), *back = malloc(RT_STORE_MAX_VALUE);
        assert_non_null(big);
        assert_non_null(back);
        for (size_t i = 0; i < RT_STORE_MAX_VALUE; i++) big[i] = (uint8_t)(i * 7 + 3);
        rt_store_set_timeout(a, 10);
        assert_rt_ok(rt_store_set(a, big_key, big, RT_STORE_MAX_VALUE));
        assert_rt_ok(rt_store_set(a, "k-1mib-1", big, RT_STORE_MAX_VALUE - 1));
        assert_rt_ok(rt_store_get(a, big_key, back, RT_STORE_MAX_VALUE, &n));
        assert_int_equal(n, RT_STORE_MAX_VALUE);
        assert_memory_equal(big, back, RT_STORE_MAX_VALUE);
        free(big);
        free(back);
    }
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
        uint8_t r[64];
        while (read(fd, r, sizeof r) > 0) { /* the challenge, then a refusal or just the end */
        }
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
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r)); /* no secret: refused before any connection */
    rt_store_server *srv = NULL;
    rt_store *st = NULL;
    assert_int_equal(rt_rdzv_connect(&r, 1, &srv, &st), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "RINGTRAIN_JOB_TOKEN"));
    assert_null(srv);
    assert_null(st);
    setenv("OMPI_MCA_ess_base_jobid", "4242", 1); /* a launcher's fallback */
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    assert_string_equal(r.job, "4242");
    assert_string_equal(r.secret_source, "OMPI_MCA_ess_base_jobid");
    unsetenv("OMPI_MCA_ess_base_jobid");
    setenv("RINGTRAIN_JOB_TOKEN", "tok0", 1);
    assert_rt_ok(rt_rdzv_parse("env://", -1, -1, &r));
    unsetenv("RINGTRAIN_JOB_TOKEN");
    setenv("TORCHELASTIC_RUN_ID", "run7", 1);
    assert_int_equal(r.rank, 1);
    assert_int_equal(r.world, 4);
    assert_int_equal(r.local_rank, 1);
    assert_int_equal(r.port, 29500);
    assert_false(r.host_store);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); /* torchrun: its store holds MASTER_PORT */
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
}

/* Every *_parse: case-insensitive, returns rt_status, an unknown name lists the
 * accepted ones (from the table, so the list cannot drift). */
static void parse_names(void **s) {
    (void)s;
    rt_reduce_op op = RT_OP_SUM;
    assert_rt_ok(rt_reduce_op_parse("avg", &op));
    assert_int_equal(op, RT_OP_AVG);
    assert_rt_ok(rt_reduce_op_parse("MaX", &op));
    assert_int_equal(op, RT_OP_MAX);
    assert_int_equal(rt_reduce_op_parse("mean", &op), RT_ERR_INVALID);
    assert_int_equal(op, RT_OP_MAX); /* unchanged on error */
    assert_non_null(strstr(rt_error_message(), "unknown reduce op 'mean' (expected sum | avg | product | min | max)"));
    assert_int_equal(rt_reduce_op_parse(NULL, &op), RT_ERR_INVALID);
    rt_algo al;
    assert_rt_ok(rt_algo_parse("rsag", &al));
    assert_int_equal(al, RT_ALGO_RSAG);
    assert_rt_ok(rt_algo_parse("RING", &al));
    assert_int_equal(al, RT_ALGO_RING);
    assert_int_equal(rt_algo_parse("tree", &al), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "unknown algorithm 'tree' (expected ring | naive | rsag | nccl)"));
    rt_transport tr;
    assert_rt_ok(rt_transport_parse("shm", &tr));
    assert_int_equal(tr, RT_TRANSPORT_SHM);
    assert_rt_ok(rt_transport_parse("Tcp", &tr));
    assert_int_equal(tr, RT_TRANSPORT_TCP);
    assert_int_equal(rt_transport_parse("carrier-pigeon", &tr), RT_ERR_INVALID);
    assert_non_null(
        strstr(rt_error_message(), "unknown transport 'carrier-pigeon' (expected auto | tcp | shm | nccl)"));
    /* every name of every table parses back to itself */
    for (int i = 0; i < RT_TRANSPORT_COUNT_; i++) {
        assert_rt_ok(rt_transport_parse(rt_transport_name((rt_transport)i), &tr));
        assert_int_equal(tr, i);
    }
    for (int i = 0; i < RT_ALGO_COUNT_; i++) {
        assert_rt_ok(rt_algo_parse(rt_algo_name((rt_algo)i), &al));
        assert_int_equal(al, i);
    }
    for (int i = 0; i < RT_OP_COUNT_; i++) {
        assert_rt_ok(rt_reduce_op_parse(rt_reduce_op_name((rt_reduce_op)i), &op));
        assert_int_equal(op, i);
    }
    /* every member of every enum of names.c has a name of its own (the tables are
     * designated, [RT_X] = "x": a member added without its name is a NULL there) */
    const rt_names *const tables[] = {&rt_transport_names, &rt_algo_names, &rt_compress_names, &rt_reduce_op_names};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (int i = 0; i < tables[t]->count; i++) {
            const char *name = rt_names_name(tables[t], i);
            if (!name) fail_msg("%s %d has no name", tables[t]->what, i);
            int back = -1;
            assert_rt_ok(rt_names_parse(tables[t], name, &back));
            assert_int_equal(back, i);
        }
    for (int k = RT_K_NONE_ + 1; k < RT_K_COUNT_; k++) {
        const char *name = rt_comm_kind_name(k);
        if (!name || !strcmp(name, "unknown operation")) fail_msg("operation kind %d has no name", k);
        for (int j = RT_K_NONE_ + 1; j < k; j++) assert_string_not_equal(rt_comm_kind_name(j), name);
    }
    rt_error_clear();
}

/* timeouts that would make the deadline arithmetic undefined are refused up front */
static void bad_timeout(void **s) {
    (void)s;
    const double bad[] = {0.0, -1.0, 1.0 / 0.0, 0.0 / 0.0, 1e30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rt_pg_options o;
        assert_rt_ok(rt_pg_options_default(&o));
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

static const char *const k_env_vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
};
static void env_clear(void) {
    for (size_t i = 0; i < sizeof k_env_vars / sizeof *k_env_vars; i++) unsetenv(k_env_vars[i]);
}
static void env_set4(const char *a, const char *b, const char *c, const char *d, const char *va, const char *vb,
                     const char *vc, const char *vd) {
    setenv(a, va, 1);
    setenv(b, vb, 1);
    setenv(c, vc, 1);
    setenv(d, vd, 1);
}

/* rt_dist_env_read: each launcher's variables, their precedence, bad values (an error
 * naming the variable), and the rendezvous reading the same code. */
static void dist_env(void **s) {
    (void)s;
    env_clear();
    rt_dist_env e;
    assert_rt_ok(rt_dist_env_read(&e)); /* no launcher: every field unknown */
    assert_null(e.launcher);
    assert_null(e.rank_source);
    assert_true(e.rank == -1 && e.world_size == -1 && e.local_rank == -1 && e.local_world_size == -1);
    /* Slurm */
    env_set4("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "5", "8", "1", "4");
    assert_rt_ok(rt_dist_env_read(&e));
    assert_string_equal(e.launcher, "slurm");
    assert_string_equal(e.rank_source, "SLURM_PROCID");
    assert_true(e.rank == 5 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 4);
    /* Open MPI wins over Slurm (mpirun inside an allocation) */
    env_set4("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
             "3", "4", "1", "2");
    setenv("SLURM_PROCID", "garbage", 1); /* not read: a launcher above it is present */
    assert_rt_ok(rt_dist_env_read(&e));
    assert_string_equal(e.launcher, "openmpi");
    assert_string_equal(e.rank_source, "OMPI_COMM_WORLD_RANK");
    assert_true(e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2);
    /* torchrun (and ringtrain's launcher) win over both; no field mixes launchers */
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "6", 1);
    assert_rt_ok(rt_dist_env_read(&e));
    assert_string_equal(e.launcher, "torchrun");
    assert_string_equal(e.rank_source, "RANK");
    assert_true(e.rank == 2 && e.world_size == 6 && e.local_rank == -1 && e.local_world_size == -1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "3", 1);
    assert_rt_ok(rt_dist_env_read(&e));
    assert_true(e.local_rank == 1 && e.local_world_size == 3);
    /* bad values name the variable */
    const struct {
        const char *var, *value, *says;
    } bad[] = {
        {"RANK", "abc", "RANK='abc'"},
        {"RANK", "1x", "RANK='1x'"},
        {"RANK", "-1", "RANK='-1'"},
        {"RANK", "99999999999", "RANK='99999999999'"},
        {"WORLD_SIZE", "0", "WORLD_SIZE='0'"},
        {"LOCAL_RANK", " ", "LOCAL_RANK=' '"},
        {"RANK", "6", "RANK=6 is out of range for WORLD_SIZE=6"},
        {"LOCAL_RANK", "3", "LOCAL_RANK=3 is out of range for LOCAL_WORLD_SIZE=3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char keep[64];
        snprintf(keep, sizeof keep, "%s", getenv(bad[i].var));
        setenv(bad[i].var, bad[i].value, 1);
        assert_int_equal(rt_dist_env_read(&e), RT_ERR_INVALID);
        if (!strstr(rt_error_message(), bad[i].says))
            fail_msg("%s=%s: %s", bad[i].var, bad[i].value, rt_error_message());
        /* the rendezvous reads the same code */
        rt_rdzv r;
        assert_int_equal(rt_rdzv_parse("tcp://127.0.0.1:1234", -1, -1, &r), RT_ERR_INVALID);
        assert_non_null(strstr(rt_error_message(), bad[i].says));
        setenv(bad[i].var, keep, 1);
    }
    rt_rdzv r;
    assert_rt_ok(rt_rdzv_parse("tcp://127.0.0.1:1234", -1, -1, &r));
    assert_true(r.rank == 2 && r.world == 6 && r.local_rank == 1);
    /* an empty variable counts as unset */
    env_clear();
    setenv("RANK", "", 1);
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "2", 1);
    assert_rt_ok(rt_dist_env_read(&e));
    assert_string_equal(e.launcher, "slurm");
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.world_size, 2);
    assert_int_equal(e.local_rank, -1); /* the local pair stays optional (srun may leave it) */
    env_clear();
    rt_error_clear();
}

/* A rank without a world size (or the reverse) is an error naming what is set and what
 * is missing, for each launcher; not a one-rank job failing later in the sampler. */
static void dist_env_half_set(void **s) {
    (void)s;
    const struct {
        const char *rank, *world, *program;
    } fam[] = {
        {"RANK", "WORLD_SIZE", "torchrun"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
        {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
    };
    for (size_t i = 0; i < sizeof fam / sizeof *fam; i++) {
        for (int half = 0; half < 2; half++) {
            const char *set = half ? fam[i].world : fam[i].rank, *missing = half ? fam[i].rank : fam[i].world;
            env_clear();
            setenv(set, half ? "4" : "1", 1);
            char says[160];
            snprintf(says, sizeof says, "%s=%s is set but %s is not", set, half ? "4" : "1", missing);
            rt_dist_env e;
            assert_int_equal(rt_dist_env_read(&e), RT_ERR_INVALID);
            const char *msg = rt_error_message();
            if (!strstr(msg, says) || !strstr(msg, fam[i].program)) fail_msg("%s alone: %s", set, msg);
            rt_rdzv r; /* the rendezvous reads the same code */
            assert_int_equal(rt_rdzv_parse("tcp://127.0.0.1:1234", -1, -1, &r), RT_ERR_INVALID);
            assert_non_null(strstr(rt_error_message(), says));
            setenv(missing, half ? "1" : "4", 1); /* the whole pair: fine */
            assert_rt_ok(rt_dist_env_read(&e));
            assert_true(e.rank == 1 && e.world_size == 4 && e.local_rank == -1 && e.local_world_size == -1);
        }
    }
    env_clear();
    rt_error_clear();
}

/* The shared submit path frees the request whatever fails. With the engine broken every
 * submission fails; a request left behind is a leak that LeakSanitizer reports under
 * `make test-asan` (this test runs there: label unit). */
static void submit_failure_frees_request(void **s) {
    (void)s;
    env_clear();
    int lfd = -1, port = 0;
    assert_rt_ok(rt_sock_listen("127.0.0.1", 0, &lfd, &port));
    close(lfd);
    char method[64];
    snprintf(method, sizeof method, "tcp://127.0.0.1:%d", port);
    rt_pg_options o;
    assert_rt_ok(rt_pg_options_default(&o));
    o.init_method = method;
    o.rank = 0;
    o.world_size = 1;
    o.transport = RT_TRANSPORT_TCP;
    o.timeout_s = 10;
    rt_pg *pg = NULL;
    assert_rt_ok(rt_pg_init(&o, &pg));
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    rt_request *req = NULL;
    assert_rt_ok(rt_iall_reduce(pg, buf, 8, RT_F32, RT_OP_SUM, &req)); /* a working group first */
    assert_rt_ok(rt_wait(req));
    rt_engine *e = &pg->w->eng;
    e->broken = true;
    e->err.status = RT_ERR_PEER;
    snprintf(e->err.msg, sizeof e->err.msg, "broken on purpose by the test");
    req = (rt_request *)&req; /* any non-NULL value: must come back NULL */
    assert_int_equal(rt_iall_reduce(pg, buf, 8, RT_F32, RT_OP_SUM, &req), RT_ERR_PEER);
    assert_null(req);
    assert_non_null(strstr(rt_error_message(), "broken on purpose"));
    req = (rt_request *)&req;
    assert_int_equal(rt_ibarrier(pg, &req), RT_ERR_PEER);
    assert_null(req);
    assert_int_equal(rt_iall_gather(pg, buf, out, 8, RT_F32, &req), RT_ERR_PEER);
    assert_int_equal(rt_ireduce_scatter(pg, buf, out, 8, RT_F32, RT_OP_SUM, &req), RT_ERR_PEER); /* with scratch */
    assert_int_equal(rt_all_reduce(pg, buf, 8, RT_F32, RT_OP_SUM), RT_ERR_PEER);
    assert_int_equal(rt_broadcast(pg, buf, 8, RT_F32, 0), RT_ERR_PEER);
    rt_pg_destroy(pg);
    rt_error_clear();
}

/* secrets and nonces as hex: every byte value, two lowercase digits each */
static void hex_secrets(void **state) {
    (void)state;
    uint8_t all[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
    char hex[513];
    rt_hex_encode(all, sizeof all, hex);
    assert_int_equal(strlen(hex), 512);
    for (int i = 0; i < 256; i++) {
        char want[3];
        snprintf(want, sizeof want, "%02x", i);
        assert_memory_equal(hex + 2 * i, want, 2);
    }
    char a[2 * RT_SECRET_BYTES + 1], b[2 * RT_SECRET_BYTES + 1];
    assert_rt_ok(rt_random_hex(a, RT_SECRET_BYTES));
    assert_rt_ok(rt_random_hex(b, RT_SECRET_BYTES));
    assert_int_equal(strlen(a), 2 * RT_SECRET_BYTES);
    assert_int_equal(strspn(a, "0123456789abcdef"), 2 * RT_SECRET_BYTES);
    assert_string_not_equal(a, b); /* 128 random bits twice */
}

/* Every built transport is one complete table (transport.h): the kind and the name are
 * the name table's, a byte-stream transport fills every channel and wait entry, a
 * whole-operation one none of them and has a teardown; auto has no table; nccl is
 * built exactly when CUDA is. */
static void transport_tables(void **s) {
    (void)s;
    assert_null(rt_transport_ops_of(RT_TRANSPORT_AUTO));
    assert_null(rt_transport_ops_of(RT_TRANSPORT_COUNT_));
    for (int k = 0; k < RT_TRANSPORT_COUNT_; k++) {
        const rt_transport_ops *t = rt_transport_ops_of((rt_transport)k);
        if (!t) continue;
        assert_int_equal(t->kind, k);
        assert_string_equal(t->name, rt_transport_name((rt_transport)k));
        assert_non_null(t->setup);
        assert_non_null(t->run);
        bool host = t->send != NULL;
        assert_int_equal(host, t->peek != NULL);
        assert_int_equal(host, t->consume != NULL);
        assert_int_equal(host, t->recv != NULL);
        assert_int_equal(host, t->close != NULL);
        assert_int_equal(host, t->sleep != NULL);
        assert_true(host ? !t->device_only && !t->algo : t->teardown != NULL);
    }
    assert_non_null(rt_transport_ops_of(RT_TRANSPORT_TCP));
    assert_non_null(rt_transport_ops_of(RT_TRANSPORT_SHM));
    assert_int_equal(rt_transport_ops_of(RT_TRANSPORT_NCCL) != NULL, rt_cuda_built());
}

/* A peer's shm segment through /proc/<pid>/fd/<n> (rt_shm_peer_open): a pid reused by
 * another process of the same user can point at any of its files, so only the memfd
 * with the segment's name and size is mapped; a file of the right size is refused. */
static void shm_peer_open_checks_the_memfd(void **s) {
    (void)s;
    const size_t len = 8192;
    char dir[] = "/tmp/rt_shmXXXXXX", path[128], proc[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/victim", dir);
    int f = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    assert_true(f >= 0);
    assert_int_equal(ftruncate(f, (off_t)len), 0);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f);
    int fd = 7;
    assert_rt_fails(rt_shm_peer_open(proc, "ringtrain-0123abcd-p0-1", len, &fd), RT_ERR_PEER,
                    "not the peer's segment (memfd 'ringtrain-0123abcd-p0-1')");
    assert_int_equal(fd, -1);
    close(f);
    unlink(path);
    rmdir(dir);
    /* a memfd of another name (another job's segment), then the right one of a wrong size */
    f = memfd_create("ringtrain-0123abcd-p0-2", MFD_CLOEXEC);
    assert_true(f >= 0);
    assert_int_equal(ftruncate(f, (off_t)len), 0);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f);
    assert_rt_fails(rt_shm_peer_open(proc, "ringtrain-0123abcd-p0-1", len, &fd), RT_ERR_PEER, "not the peer's");
    assert_rt_fails(rt_shm_peer_open(proc, "ringtrain-0123abcd-p0", len, &fd), RT_ERR_PEER, "not the peer's");
    assert_rt_fails(rt_shm_peer_open(proc, "ringtrain-0123abcd-p0-2", len * 2, &fd), RT_ERR_PEER,
                    "has 8192 bytes, expected 16384");
    assert_rt_ok(rt_shm_peer_open(proc, "ringtrain-0123abcd-p0-2", len, &fd));
    assert_true(fd >= 0 && fd != f);
    close(fd);
    close(f);
    assert_rt_fails(rt_shm_peer_open("/proc/self/fd/987654", "x", len, &fd), RT_ERR_SYS, "cannot open");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(store_frames),
        cmocka_unit_test(hello_and_header),
        cmocka_unit_test(auth_proofs),
        cmocka_unit_test(store_roundtrip),
        cmocka_unit_test(rdzv_env),
        cmocka_unit_test(reduce_kernels),
        cmocka_unit_test(bad_timeout),
        cmocka_unit_test(async_null_request),
        cmocka_unit_test(parse_names),
        cmocka_unit_test(dist_env),
        cmocka_unit_test(dist_env_half_set),
        cmocka_unit_test(submit_failure_frees_request),
        cmocka_unit_test(hex_secrets),
        cmocka_unit_test(transport_tables),
        cmocka_unit_test(shm_peer_open_checks_the_memfd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
