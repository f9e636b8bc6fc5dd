/* Rendezvous failures and methods with real processes (label multiproc): a rank that
 * never arrives, a world-size mismatch, a duplicate rank and a peer of another job
 * are errors naming the ranks; file:// works; under torchrun's variables
 * (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT taken by torchrun's store) our
 * store moves to MASTER_PORT+1; Open MPI and Slurm variables give rank and size. */
#include "../test_util.h"
#include "core/timer.h"
#include "dist/dist.h"
#include "dist/internal/wire.h"
#include "dist/internal/sock.h"
#include "mp.h"

#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cfg {
    int mode;
    char path[256];
} cfg;

enum { MISSING, WORLD_MISMATCH, DUPLICATE, OTHER_JOB, FILE_INIT, TORCHRUN, OMPI, SLURM, INTRUDER };

/* A process that can read the store but does not know the job secret's transport key
 * (here: it proves a wrong one) connects to rank 0's transport listener claiming to be
 * rank 1: rank 0 answers its opening, then refuses its proof, and keeps waiting for the
 * real rank 1. */
static int intruder(int port) {
    rt_store *st;
    MP_OK(rt_store_connect("127.0.0.1", port, getenv("RINGTRAIN_JOB_TOKEN"), -1, 2, 10, &st));
    char addr[80] = "", host[64];
    size_t n = 0;
    MP_OK(rt_store_get(st, "rt/addr/0", addr, sizeof addr - 1, &n));
    addr[n] = '\0';
    int p = 0;
    MP_CHECK(sscanf(addr, "%63s %d", host, &p) == 2, "address '%s'", addr);
    int fd;
    MP_OK(rt_sock_connect(host, p, rt_now_ns() + 5000000000ull, "rank 0", &fd));
    rt_hello h = {.step = RT_HELLO_OPEN, .rank = 1, .world = 2};
    memset(h.nonce, 0x5a, sizeof h.nonce);
    uint8_t b[RT_HELLO_BYTES];
    rt_hello_encode(b, &h);
    MP_OK(rt_sock_write_all(fd, b, sizeof b, rt_now_ns() + 5000000000ull, "rank 0"));
    /* connected and opened: the real rank 1 may come now (rank 0 accepts in order) */
    MP_OK(rt_store_set(st, "test/intruder-connected", "1", 1));
    MP_OK(rt_sock_read_all(fd, b, sizeof b, rt_now_ns() + 10000000000ull, "rank 0")); /* its answer */
    h.step = RT_HELLO_PROOF;
    memset(h.mac, 0x77, sizeof h.mac); /* a proof under a key it does not have */
    rt_hello_encode(b, &h);
    MP_OK(rt_sock_write_all(fd, b, sizeof b, rt_now_ns() + 5000000000ull, "rank 0"));
    rt_status s = rt_sock_read_all(fd, b, 1, rt_now_ns() + 10000000000ull, "rank 0");
    MP_CHECK(s == RT_ERR_PEER, "rank 0 kept a peer with a wrong proof (%s)", rt_status_name(s));
    close(fd);
    rt_store_close(st);
    return 0;
}

static int body(int idx, int nproc, int port, void *arg) {
    cfg *c = arg;
    if (c->mode == INTRUDER) {
        if (idx == 2) return intruder(port);
        nproc = 2;
        if (idx == 1) { /* the intruder has the first go at rank 0's listener: rank 1 waits
                         * until it has connected (a fixed 0.5 s raced with a slow intruder) */
            rt_store *st;
            MP_OK(rt_store_connect("127.0.0.1", port, getenv("RINGTRAIN_JOB_TOKEN"), -1, 2, 60, &st));
            char v[4];
            size_t n = 0;
            MP_OK(rt_store_get(st, "test/intruder-connected", v, sizeof v, &n));
            rt_store_close(st);
        }
    }
    rt_pg_options o;
    char method[MP_METHOD_LEN], file_method[300];
    mp_pg_options(&o, method, idx, nproc, port, RT_TRANSPORT_TCP, 3);
    if (c->mode == INTRUDER) o.timeout_s = 30; /* rank 0 waits for rank 1 through the intruder's attempt */
    char v[32];
    switch (c->mode) {
    case MISSING:
        o.world_size = nproc + 1;
        break; /* the last rank never starts */
    case WORLD_MISMATCH:
        o.world_size = idx == 1 ? 3 : 2;
        break; /* rank 1 says 3 */
    case DUPLICATE:
        o.world_size = 3;
        o.rank = idx == 2 ? 1 : idx;
        break;
    case OTHER_JOB:
        setenv("RINGTRAIN_JOB_TOKEN", idx == 1 ? "job-B" : "job-A", 1);
        break;
    case FILE_INIT:
        snprintf(file_method, sizeof file_method, "file://%s", c->path);
        o.init_method = file_method;
        break;
    case TORCHRUN: /* torchrun's own store holds MASTER_PORT (the parent listens there) */
        o.init_method = "env://";
        o.rank = o.world_size = -1;
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof v, "%d", port);
        setenv("MASTER_PORT", v, 1);
        setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
        unsetenv("RINGTRAIN_JOB_TOKEN"); /* the secret from torchrun's run id */
        setenv("TORCHELASTIC_RUN_ID", c->path, 1);
        snprintf(v, sizeof v, "%d", idx);
        setenv("RANK", v, 1);
        snprintf(v, sizeof v, "%d", nproc);
        setenv("WORLD_SIZE", v, 1);
        break;
    case OMPI:
    case SLURM: /* the secret from the launcher's job id */
        unsetenv("RINGTRAIN_JOB_TOKEN");
        if (c->mode == OMPI)
            setenv("OMPI_MCA_ess_base_jobid", c->path, 1);
        else
            setenv("SLURM_JOB_ID", c->path, 1);
        o.rank = o.world_size = -1;
        snprintf(v, sizeof v, "%d", idx);
        setenv(c->mode == OMPI ? "OMPI_COMM_WORLD_RANK" : "SLURM_PROCID", v, 1);
        snprintf(v, sizeof v, "%d", nproc);
        setenv(c->mode == OMPI ? "OMPI_COMM_WORLD_SIZE" : "SLURM_NTASKS", v, 1);
        setenv(c->mode == OMPI ? "OMPI_COMM_WORLD_LOCAL_RANK" : "SLURM_LOCALID", "0", 1);
        break;
    }
    rt_pg *pg = NULL;
    rt_status s = rt_pg_init(&o, &pg);
    const char *m = rt_error_message();
    switch (c->mode) {
    case MISSING: /* rank 0 names the missing rank; the others may instead see its store go away */
        MP_CHECK(s == RT_ERR_TIMEOUT || (idx > 0 && s == RT_ERR_PEER), "missing rank: %s", rt_status_name(s));
        MP_CHECK(strstr(m, "rank 2 never arrived") || (idx > 0 && strstr(m, "store at")), "message: %s", m);
        return 0;
    case WORLD_MISMATCH:
        MP_CHECK(s != RT_OK, "world size mismatch accepted");
        if (idx == 1) MP_CHECK(strstr(m, "world size mismatch") && strstr(m, "rank 1 says 3"), "message: %s", m);
        if (idx == 0) MP_CHECK(strstr(m, "rank 1 never arrived"), "message: %s", m);
        return 0;
    case DUPLICATE:
        if (s == RT_OK) { /* one of the two rank-1 processes gets in; nobody can finish (rank 2 missing) */
            rt_pg_destroy(pg);
            MP_CHECK(0, "init succeeded with a duplicate rank");
        }
        MP_CHECK(strstr(m, "rank 1 already joined from 127.0.0.1:") || strstr(m, "rank 2 never arrived") ||
                     strstr(m, "never connected") || strstr(m, "store at"),
                 "message: %s", m);
        /* exit code 2 marks "I saw the duplicate" for the parent */
        return strstr(m, "rank 1 already joined from") ? 2 : 0;
    case OTHER_JOB:
        MP_CHECK(s != RT_OK, "a peer of another job was accepted");
        /* one generic refusal: the store names neither job's secret */
        if (idx == 1)
            MP_CHECK(strstr(m, "refused this process") && !strstr(m, "job-A") && !strstr(m, "job-B"), "message: %s", m);
        return 0;
    default:
        break;
    }
    MP_OK(s);
    MP_CHECK(rt_pg_rank(pg) == idx && rt_pg_size(pg) == nproc, "rank %d size %d", rt_pg_rank(pg), rt_pg_size(pg));
    int64_t x = idx + 1;
    MP_OK(rt_all_reduce(pg, &x, 1, RT_I64, RT_OP_SUM));
    MP_CHECK(x == (int64_t)nproc * (nproc + 1) / 2, "all_reduce after rendezvous: %lld", (long long)x);
    rt_pg_destroy(pg);
    return 0;
}

static int run(int mode, int nproc, int *codes) {
    cfg c = {.mode = mode};
    snprintf(c.path, sizeof c.path, "/tmp/rt-rdzv-%d", (int)getpid());
    unlink(c.path);
    int failed = mp_run(nproc, body, &c, 60, codes);
    unlink(c.path);
    return failed;
}

static void missing(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(MISSING, 2, codes), 0);
}
static void world_mismatch(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(WORLD_MISMATCH, 2, codes), 0);
}
static void other_job(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(OTHER_JOB, 2, codes), 0);
}
static void duplicate(void **s) {
    (void)s;
    int codes[4];
    run(DUPLICATE, 3, codes);
    int saw = 0;
    for (int i = 0; i < 3; i++) {
        if (codes[i] == 2)
            saw++;
        else if (codes[i] != 0)
            fail_msg("process %d exited with %d", i, codes[i]);
    }
    assert_int_equal(saw, 1);
}
static void file_init(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(FILE_INIT, 3, codes), 0);
}
static void intruder_rejected(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(INTRUDER, 3, codes), 0);
}
static void ompi_env(void **s) {
    (void)s;
    int codes[4];
    assert_int_equal(run(OMPI, 2, codes), 0);
}
static void torchrun_env(void **s) {
    (void)s;
    /* occupy MASTER_PORT like torchrun's store; ours must use MASTER_PORT+1 */
    /* Two adjacent free ports, drawn below the ephemeral range (32768+), where the
     * connections of tests running in parallel take their ports: port+1 next to a
     * kernel-chosen port was often taken by one of them. */
    int fd = -1, port = 0;
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 500 && fd < 0; tries++) {
        seed = seed * 1103515245u + 12345u;
        int want = 20000 + (int)((seed >> 8) % 12000);
        int fd2 = -1, p2;
        if (rt_sock_listen("127.0.0.1", want, &fd, &port) != RT_OK) {
            fd = -1;
            continue;
        }
        if (rt_sock_listen("127.0.0.1", want + 1, &fd2, &p2) == RT_OK) {
            close(fd2);
        } else {
            close(fd);
            fd = -1;
        }
    }
    rt_error_clear();
    assert_true(fd >= 0);
    cfg c = {.mode = TORCHRUN};
    snprintf(c.path, sizeof c.path, "run-%d", (int)getpid());
    /* mp_run picks its own port; run the body directly with ours */
    int codes[2];
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(body(r, 2, port, &c));
    }
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
    close(fd);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(missing),      cmocka_unit_test(world_mismatch),    cmocka_unit_test(other_job),
        cmocka_unit_test(duplicate),    cmocka_unit_test(file_init),         cmocka_unit_test(ompi_env),
        cmocka_unit_test(torchrun_env), cmocka_unit_test(intruder_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
