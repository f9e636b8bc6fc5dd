/* Hostile peers against a running job's rendezvous store (label multiproc).
 *
 * A job of two ranks runs (tcp://127.0.0.1) while a third process, the attacker, who
 * can reach the port but, except where it plays a rank of the job, does not know the
 * secret, tries in turn: a rank-slot squat with a forged proof (before rank 1 arrives),
 * requests with no proof, a wrong proof (the refusal must not name the secret), a
 * replay of a recorded good handshake (through a recording proxy: the secret must not be
 * in what it recorded either), garbage, a huge length prefix, 48 connections that each
 * declare and send a value of 1 MiB before any proof, and 200 silent connections (a
 * member still gets in while they are open, and the store closes them all). Rank 0
 * hosts the store: its peak RSS may grow by at most 16 MiB over the attacks, the store
 * still serves, and the job's all_reduce still works. Then:
 *   squatter   a process of the job claiming rank 1 first: the real rank 1 fails with
 *              "rank 1 already joined from 127.0.0.1:PORT" naming the squatter's port;
 *   emfile     the store's process out of file descriptors: the store thread does not
 *              spin (CPU time over a second of waiting) and serves again afterwards;
 *   bind       rank 0's store for tcp://127.0.0.1 listens on 127.0.0.1 only (127.0.0.2
 *              is refused), and on every address when asked with 0.0.0.0.
 * Leaks: the handshake runs in-process under ASan in test_dist_unit and fuzz_dist_wire. */
#include "../test_util.h"
#include "core/timer.h"
#include "dist/dist.h"
#include "dist/internal/rendezvous.h"
#include "dist/internal/sock.h"
#include "dist/internal/wire.h"
#include "dist/store.h"
#include "mp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[256]; /* flag files: squatted, ready, done */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void flag_set(const char *name) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
}

static bool flag_is(const char *name) {
    char p[300];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return access(p, F_OK) == 0;
}

static bool flag_wait(const char *name, double limit_s) {
    uint64_t end = rt_now_ns() + (uint64_t)(limit_s * 1e9);
    while (!flag_is(name)) {
        if (rt_now_ns() >= end) return false;
        sleep_ms(20);
    }
    return true;
}

/* kB of a /proc/self/status field (VmRSS, VmHWM) */
static long proc_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') v = atol(line + n + 1);
    fclose(f);
    return v;
}

static int connect_raw(int port) {
    int fd = -1;
    if (rt_sock_connect("127.0.0.1", port, rt_now_ns() + 10000000000ull, "store", &fd) != RT_OK) return -1;
    return fd;
}

/* Everything the server sends until it closes the connection (or the deadline passes;
 * then *closed is false). */
static size_t read_until(int fd, uint8_t *buf, size_t cap, uint64_t end, bool *closed) {
    size_t n = 0;
    *closed = false;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int ms = rt_sock_ms_left(end, 1000);
        if (ms <= 0 && rt_now_ns() >= end) return n;
        if (poll(&p, 1, ms) <= 0) continue;
        uint8_t tmp[4096];
        ssize_t r = recv(fd, tmp, sizeof tmp, 0);
        if (r <= 0) {
            *closed = true;
            return n;
        }
        size_t k = (size_t)r < cap - n ? (size_t)r : cap - n;
        memcpy(buf + n, tmp, k);
        n += k;
    }
}

/* Did the server answer with a REPLY of status 0 (a success) anywhere in buf? */
static bool has_ok_reply(const uint8_t *buf, size_t n) {
    size_t off = 0;
    while (off + RT_STORE_HDR <= n) {
        const uint8_t *h = buf + off;
        uint16_t kl = (uint16_t)(h[6] | h[7] << 8);
        uint32_t vl = (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
        if (h[4] == RT_STORE_REPLY && h[5] == 0) return true;
        off += RT_STORE_HDR + kl + vl;
    }
    return false;
}

#define ATTACK_CHECK(cond, ...) MP_CHECK(cond, __VA_ARGS__)

/* Send bytes, then expect the server to refuse: no success reply, the connection closed,
 * and nothing it sent names the secret. */
static int expect_refused(int port, const void *bytes, size_t n, const char *secret, const char *what) {
    int fd = connect_raw(port);
    ATTACK_CHECK(fd >= 0, "%s: no connection", what);
    (void)!send(fd, bytes, n, MSG_NOSIGNAL);
    uint8_t buf[8192];
    bool closed;
    size_t got = read_until(fd, buf, sizeof buf, rt_now_ns() + 20000000000ull, &closed);
    close(fd);
    ATTACK_CHECK(closed, "%s: the store kept the connection open", what);
    ATTACK_CHECK(!has_ok_reply(buf, got), "%s: the store answered with a success", what);
    ATTACK_CHECK(!memmem(buf, got, secret, strlen(secret)), "%s: the store's answer names the job secret", what);
    return 0;
}

/* ---- a recording proxy between a member's rt_store_connect and the store ---- */

typedef struct victim {
    int port;
    const char *secret;
    rt_status st;
} victim;

static void *victim_main(void *p) {
    victim *v = p;
    rt_store *st = NULL;
    v->st = rt_store_connect("127.0.0.1", v->port, v->secret, -1, 2, 10, &st);
    if (v->st == RT_OK) rt_store_close(st);
    return NULL;
}

/* Record what a member sends while it joins; *n bytes into rec. */
static int record_handshake(int store_port, const char *secret, uint8_t *rec, size_t cap, size_t *n) {
    int lfd, pport;
    MP_OK(rt_sock_listen("127.0.0.1", 0, &lfd, &pport));
    victim v = {pport, secret, RT_OK};
    pthread_t t;
    ATTACK_CHECK(pthread_create(&t, NULL, victim_main, &v) == 0, "thread");
    int cfd = -1;
    MP_OK(rt_sock_accept(lfd, rt_now_ns() + 10000000000ull, &cfd));
    int sfd = connect_raw(store_port);
    ATTACK_CHECK(sfd >= 0, "proxy: no connection to the store");
    *n = 0;
    bool open_c = true, open_s = true;
    while (open_c && open_s) {
        struct pollfd p[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, 10000) <= 0) break;
        uint8_t b[4096];
        if (p[0].revents) {
            ssize_t r = recv(cfd, b, sizeof b, 0);
            if (r <= 0)
                open_c = false;
            else {
                if (*n + (size_t)r <= cap) memcpy(rec + *n, b, (size_t)r), *n += (size_t)r;
                (void)!send(sfd, b, (size_t)r, MSG_NOSIGNAL);
            }
        }
        if (p[1].revents) {
            ssize_t r = recv(sfd, b, sizeof b, 0);
            if (r <= 0)
                open_s = false;
            else
                (void)!send(cfd, b, (size_t)r, MSG_NOSIGNAL);
        }
    }
    pthread_join(t, NULL);
    close(cfd);
    close(sfd);
    close(lfd);
    ATTACK_CHECK(v.st == RT_OK, "the recorded member did not get in: %s", rt_error_message());
    return 0;
}

static int attacker(int port) {
    char secret[256];
    snprintf(secret, sizeof secret, "%s", getenv("RINGTRAIN_JOB_TOKEN"));
    ATTACK_CHECK(secret[0], "no job secret in the environment");
    unsetenv("RINGTRAIN_JOB_TOKEN");
    uint8_t frame[RT_STORE_HDR + 256];

    /* a squatter with a forged proof claims rank 1 before rank 1 arrives */
    {
        uint8_t val[RT_STORE_HELLO_BYTES];
        memset(val, 0x33, sizeof val);
        memcpy(val + RT_AUTH_NONCE, "\x01\0\0\0\x02\0\0\0", 8); /* rank 1, world 2 */
        size_t n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_HELLO, 0, NULL, 0, val, sizeof val);
        if (expect_refused(port, frame, n, secret, "forged rank-1 claim")) return 1;
        flag_set("squatted");
    }
    ATTACK_CHECK(flag_wait("ready", 60), "rank 0 never got ready");

    /* no proof: requests straight away */
    size_t n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_SET, 0, "rt/evil", 7, "1", 1);
    if (expect_refused(port, frame, n, secret, "SET without a proof")) return 1;
    n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_GET, 0, "rt/addr/0", 9, NULL, 0);
    if (expect_refused(port, frame, n, secret, "GET without a proof")) return 1;
    /* a wrong proof, in this version's form and in the form that named the job id */
    {
        uint8_t val[RT_STORE_HELLO_BYTES];
        memset(val, 0x44, sizeof val);
        memcpy(val + RT_AUTH_NONCE, "\xff\xff\xff\xff\x02\0\0\0", 8); /* rank -1, world 2 */
        n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_HELLO, 0, NULL, 0, val, sizeof val);
        if (expect_refused(port, frame, n, secret, "wrong proof")) return 1;
        n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_HELLO, 0, "guess", 5, "-1 2", 4);
        if (expect_refused(port, frame, n, secret, "a guessed job id")) return 1;
    }
    /* a replayed handshake */
    {
        uint8_t rec[4096];
        size_t rn = 0;
        if (record_handshake(port, secret, rec, sizeof rec, &rn)) return 1;
        ATTACK_CHECK(rn > 0, "nothing recorded");
        ATTACK_CHECK(!memmem(rec, rn, secret, strlen(secret)), "the job secret travelled in the handshake");
        if (expect_refused(port, rec, rn, secret, "replayed handshake")) return 1;
    }
    /* garbage, a huge length prefix */
    {
        uint8_t junk[4096];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
        if (expect_refused(port, junk, sizeof junk, secret, "garbage")) return 1;
        n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_HELLO, 0, NULL, 0, NULL, 0);
        frame[8] = frame[9] = frame[10] = frame[11] = 0xff;
        if (expect_refused(port, frame, RT_STORE_HDR, secret, "a 4 GiB length prefix")) return 1;
    }
    /* 48 connections, each declaring a 1 MiB value and sending all of it but 64 bytes,
     * before any proof (a store that buffers them holds 48 MiB) */
    {
        enum { NBIG = 48 };
        int fds[NBIG];
        uint8_t *big = calloc(1, RT_STORE_MAX_VALUE);
        ATTACK_CHECK(big, "out of memory");
        for (int i = 0; i < NBIG; i++) {
            fds[i] = connect_raw(port);
            ATTACK_CHECK(fds[i] >= 0, "big %d: no connection", i);
            n = rt_store_frame_encode(frame, sizeof frame, RT_STORE_SET, 0, "k", 1, NULL, 0);
            frame[8] = 0, frame[9] = 0, frame[10] = 0x10, frame[11] = 0; /* 1 MiB */
            (void)!send(fds[i], frame, n, MSG_NOSIGNAL);
            rt_sock_set_nonblock(fds[i], 1);
            size_t off = 0, want = RT_STORE_MAX_VALUE - 64; /* as much as the store takes in 2 s */
            uint64_t end = rt_now_ns() + 2000000000ull;
            while (off < want && rt_now_ns() < end) {
                ssize_t w = send(fds[i], big + off, want - off, MSG_NOSIGNAL);
                if (w > 0)
                    off += (size_t)w;
                else if (w < 0 && errno != EAGAIN)
                    break;
                else
                    sleep_ms(1);
            }
        }
        free(big);
        rt_error_clear();
        int kept = 0;
        uint64_t end = rt_now_ns() + 20000000000ull;
        for (int i = 0; i < NBIG; i++) {
            uint8_t buf[512];
            bool closed;
            size_t got = read_until(fds[i], buf, sizeof buf, end, &closed);
            close(fds[i]);
            kept += !closed || has_ok_reply(buf, got);
        }
        ATTACK_CHECK(kept == 0, "the store kept %d of %d connections sending 1 MiB without a proof", kept, NBIG);
    }
    /* 200 silent connections: a member still gets in meanwhile, and the store ends them */
    {
        enum { NSILENT = 200 };
        int fds[NSILENT];
        for (int i = 0; i < NSILENT; i++) {
            fds[i] = connect_raw(port);
            ATTACK_CHECK(fds[i] >= 0, "silent %d: no connection", i);
        }
        setenv("RINGTRAIN_JOB_TOKEN", secret, 1);
        rt_store *st = NULL;
        MP_OK(rt_store_connect("127.0.0.1", port, secret, -1, 2, 30, &st));
        bool ex = true;
        MP_OK(rt_store_check(st, "rt/evil", &ex));
        ATTACK_CHECK(!ex, "a request without a proof was served");
        rt_store_close(st);
        unsetenv("RINGTRAIN_JOB_TOKEN");
        int open_left = 0;
        uint64_t end = rt_now_ns() + 30000000000ull;
        for (int i = 0; i < NSILENT; i++) {
            uint8_t buf[256];
            bool closed;
            read_until(fds[i], buf, sizeof buf, end, &closed);
            open_left += !closed;
            close(fds[i]);
        }
        ATTACK_CHECK(open_left == 0, "%d silent connections were never closed", open_left);
    }
    flag_set("done");
    return 0;
}

static int job_rank(int rank, int port) {
    if (rank == 1) MP_CHECK(flag_wait("squatted", 60), "the squat never happened");
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, rank, 2, port, RT_TRANSPORT_TCP, 60);
    rt_pg *pg = NULL;
    MP_OK(rt_pg_init(&o, &pg));
    long rss0 = proc_kb("VmRSS");
    if (rank == 0) flag_set("ready");
    /* The ranks decide together when to stop: each reads the flag at its own moment,
     * so the flag travels in the all_reduce and both see the same sum (a rank that
     * stopped on its own reading would call barrier while the other calls all_reduce). */
    int64_t x[2] = {0, 0};
    int rounds = 0;
    for (bool last = false; !last; rounds++) {
        x[0] = rank + 1;
        x[1] = flag_is("done");
        MP_OK(rt_all_reduce(pg, x, 2, RT_I64, RT_OP_SUM));
        MP_CHECK(x[0] == 3, "all_reduce during the attacks: %lld", (long long)x[0]);
        last = x[1] > 0;
        if (!last) sleep_ms(50);
        MP_CHECK(rounds < 20 * 300, "the attacker never finished");
    }
    if (rank == 0) {
        long peak = proc_kb("VmHWM");
        fprintf(stderr, "store host: VmRSS %ld kB before the attacks, peak %ld kB\n", rss0, peak);
        MP_CHECK(rss0 > 0 && peak - rss0 < 16 * 1024, "the store's memory grew by %ld kB", peak - rss0);
        MP_OK(rt_store_set(rt_pg_store(pg), "after", "1", 1));
    }
    MP_OK(rt_barrier(pg));
    rt_pg_destroy(pg);
    return 0;
}

/* ---- squatter: a process of the job (it has the secret) takes rank 1's slot ---- */

static int squatter(int port) {
    rt_store *st = NULL;
    MP_OK(rt_store_connect("127.0.0.1", port, getenv("RINGTRAIN_JOB_TOKEN"), 1, 2, 30, &st));
    char me[64];
    snprintf(me, sizeof me, "%s", rt_store_local_addr(st));
    fprintf(stderr, "squatter: rank 1 from %s\n", me);
    flag_set("squatted");
    MP_CHECK(flag_wait("done", 60), "rank 1 never finished");
    rt_store_close(st);
    return 0;
}

static int body(int idx, int nproc, int port, void *arg) {
    (void)nproc;
    int mode = *(int *)arg;
    if (mode == 0) return idx == 2 ? attacker(port) : job_rank(idx, port);
    /* squatter: process 2 takes rank 1's slot; rank 1 must say so and name the address */
    if (idx == 2) return squatter(port);
    if (idx == 1) MP_CHECK(flag_wait("squatted", 60), "no squat");
    rt_pg_options o;
    char method[MP_METHOD_LEN];
    mp_pg_options(&o, method, idx, 2, port, RT_TRANSPORT_TCP, 5);
    rt_pg *pg = NULL;
    rt_status s = rt_pg_init(&o, &pg);
    const char *m = rt_error_message();
    if (idx == 1) {
        flag_set("done");
        MP_CHECK(s == RT_ERR_PEER, "rank 1 joined although its slot was taken (%s)", rt_status_name(s));
        MP_CHECK(strstr(m, "rank 1 already joined from 127.0.0.1:"), "message: %s", m);
        MP_CHECK(!strstr(m, "never arrived"), "message: %s", m);
        return 0;
    }
    /* rank 0 waits for a rank 1 that the squatter never completes */
    if (s == RT_OK) rt_pg_destroy(pg);
    return s == RT_OK ? 1 : 0;
}

static void run_mode(int mode) {
    snprintf(g_dir, sizeof g_dir, "/tmp/rt-hostile-%d-%d", (int)getpid(), mode);
    assert_int_equal(mkdir(g_dir, 0700), 0);
    int codes[3];
    int failed = mp_run(3, body, &mode, 240, codes);
    const char *names[] = {"squatted", "ready", "done"};
    for (int i = 0; i < 3; i++) {
        char p[300];
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    if (failed) fail_msg("processes failed: codes %d %d %d", codes[0], codes[1], codes[2]);
}

static void attacks(void **s) {
    (void)s;
    run_mode(0);
}

static void squatter_named(void **s) {
    (void)s;
    run_mode(1);
}

/* ---- the store's process out of file descriptors ---- */

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int emfile_child(void) {
    rt_store_server *srv;
    int port;
    MP_OK(rt_store_server_start("127.0.0.1", 0, "emfile-secret", 1, &srv, &port));
    /* a few descriptors above what is open now, then fill them with connections */
    int top = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0) top = fd;
    struct rlimit rl = {(rlim_t)top + 16, (rlim_t)top + 16};
    MP_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s", strerror(errno));
    /* fill every free descriptor, then free nine */
    static int fill[4200];
    int nfill = 0;
    while (nfill < 4200 && (fill[nfill] = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0) nfill++;
    MP_CHECK(nfill > 10 && nfill < 4200, "%d descriptors filled (top %d)", nfill, top);
    for (int i = 0; i < 9; i++) close(fill[--nfill]); /* odd: the last connection waits for an fd */
    int fds[64], nfd = 0;
    while (nfd < 64) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(0x7f000001);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            close(fd);
            break;
        }
        fds[nfd++] = fd;
        sleep_ms(5); /* let the store accept it while it can */
    }
    MP_CHECK(nfd > 0 && nfd < 64, "%d connections: the limit did not bite", nfd);
    /* the store now meets EMFILE with a connection waiting: it must not spin */
    sleep_ms(200);
    double c0 = cpu_s();
    sleep_ms(1000);
    double used = cpu_s() - c0;
    fprintf(stderr, "emfile: %d connections, %.3f s of CPU in 1 s of waiting\n", nfd, used);
    MP_CHECK(used < 0.5, "the store thread spun on accept: %.3f s of CPU in 1 s", used);
    for (int i = 0; i < nfd; i++) close(fds[i]);
    for (int i = 0; i < nfill; i++) close(fill[i]);
    rt_store *st = NULL;
    MP_OK(rt_store_connect("127.0.0.1", port, "emfile-secret", 0, 1, 10, &st));
    MP_OK(rt_store_set(st, "k", "v", 1));
    rt_store_close(st);
    rt_store_server_stop(srv);
    return 0;
}

static void emfile(void **s) {
    (void)s;
    pid_t pid = fork();
    if (pid == 0) _exit(emfile_child());
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- where the store listens ---- */

static int bind_child(const char *host, bool every) {
    int port = mp_free_port();
    char method[300];
    snprintf(method, sizeof method, "tcp://%s:%d", host, port);
    setenv("RINGTRAIN_JOB_TOKEN", "bind-secret", 1);
    rt_rdzv r;
    MP_OK(rt_rdzv_parse(method, 0, 2, &r));
    rt_store_server *srv = NULL;
    rt_store *st = NULL;
    MP_OK(rt_rdzv_connect(&r, 10, &srv, &st));
    MP_CHECK(srv != NULL, "rank 0 did not host the store");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(0x7f000002); /* 127.0.0.2: loopback, but not 127.0.0.1 */
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int er = errno;
    close(fd);
    if (every)
        MP_CHECK(rc == 0, "asked for every interface, 127.0.0.2 was refused: %s", strerror(er));
    else
        MP_CHECK(rc != 0 && er == ECONNREFUSED, "the store for %s also listens on 127.0.0.2", host);
    rt_store_close(st);
    rt_store_server_stop(srv);
    return 0;
}

static void bind_addr(void **s) {
    (void)s;
    for (int every = 0; every < 2; every++) {
        pid_t pid = fork();
        if (pid == 0) _exit(bind_child(every ? "0.0.0.0" : "127.0.0.1", every));
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attacks),
        cmocka_unit_test(squatter_named),
        cmocka_unit_test(emfile),
        cmocka_unit_test(bind_addr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
