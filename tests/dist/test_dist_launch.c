/* The launcher with real processes (label multiproc): the environment the ranks see
 * (exec form, through /bin/sh), a rank that exits 3, a rank killed by SIGKILL, a rank that
 * hangs ignoring SIGTERM while another fails (stopped within the grace period), SIGINT to
 * the launcher (forwarded; the launcher reports it; ranks that make progress after it are
 * waited for, far beyond the grace period, and ranks that do not are killed), a rank that
 * stopped cleanly on a signal of its own (its peers are waited for), the time limit, a
 * command that does not exist, the stderr lines forwarded as they arrive, torchrun's restart
 * variables, the launch's id (RINGTRAIN_LAUNCH_ID), and a rank that died by itself named before a peer that exited with a lost-peer
 * error. */
#include "../test_util.h"
#include "dist/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_forever(void) {
    for (;;) pause();
}

static void opts(rt_launch_options *o, int nproc) {
    rt_launch_options_default(o);
    o->nproc = nproc;
    o->grace_s = 1;
    o->timeout_s = 120; /* a bug must not hang ctest */
}

/* ---- the environment (exec form) ---- */

static char *const k_print_env[] = {
    "/bin/sh", "-c",
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT "
    "$RINGTRAIN_JOB_TOKEN ${TORCHELASTIC_USE_AGENT_STORE-unset}\" >&2",
    NULL};

static void env_single_node(void **s) {
    (void)s;
    setenv("RANK", "77", 1);                           /* an inherited value is replaced */
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); /* torchrun's own store: not ours, dropped */
    rt_launch_options o;
    opts(&o, 3);
    rt_launch_result r, r2;
    assert_rt_ok(rt_launch_exec(&o, k_print_env, &r));
    assert_rt_ok(rt_launch_exec(&o, k_print_env, &r2));
    assert_true(r.master_port > 0 && r.master_port < 65536);
    char token[64] = "", token2[64] = "";
    for (int i = 0; i < 3; i++) {
        int rank, world, local, lworld, group, port;
        char addr[64], tok[64], agent[16];
        assert_int_equal(sscanf(r.ranks[i].last_line, "%d %d %d %d %d %63s %d %63s %15s", &rank, &world, &local,
                                &lworld, &group, addr, &port, tok, agent),
                         9);
        assert_int_equal(rank, i);
        assert_int_equal(world, 3);
        assert_int_equal(local, i);
        assert_int_equal(lworld, 3);
        assert_int_equal(group, 0);
        assert_string_equal(addr, "127.0.0.1");
        assert_int_equal(port, r.master_port);
        assert_string_equal(agent, "unset");
        assert_int_equal(strlen(tok), 32); /* random hex, the same for every rank of a launch */
        if (i == 0) snprintf(token, sizeof token, "%s", tok);
        assert_string_equal(tok, token);
        assert_int_equal(r.ranks[i].exit_code, 0);
        assert_int_equal(r.ranks[i].signal, 0);
    }
    sscanf(r2.ranks[0].last_line, "%*d %*d %*d %*d %*d %*s %*d %63s", token2);
    assert_int_equal(strlen(token2), 32);
    assert_string_not_equal(token, token2); /* a new secret per launch */
    char line[256];
    assert_string_equal(rt_launch_describe(&r, line, sizeof line), "all 3 ranks exited with code 0");
    rt_launch_result_free(&r);
    rt_launch_result_free(&r2);
    unsetenv("RANK");
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
}

/* torchrun's restart variables: which attempt a launch is (an inherited value is replaced) */
static void env_restart_count(void **s) {
    (void)s;
    char *const cmd[] = {"/bin/sh", "-c", "echo \"$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS\" >&2", NULL};
    setenv("TORCHELASTIC_RESTART_COUNT", "9", 1);
    rt_launch_options o;
    opts(&o, 2);
    rt_launch_result r;
    assert_rt_ok(rt_launch_exec(&o, cmd, &r));
    for (int i = 0; i < 2; i++) assert_string_equal(r.ranks[i].last_line, "0 0");
    rt_launch_result_free(&r);
    o.restart_count = 2;
    o.max_restarts = 3;
    assert_rt_ok(rt_launch_exec(&o, cmd, &r));
    for (int i = 0; i < 2; i++) assert_string_equal(r.ranks[i].last_line, "2 3");
    rt_launch_result_free(&r);
    unsetenv("TORCHELASTIC_RESTART_COUNT");
}

/* RINGTRAIN_LAUNCH_ID (named shm segments carry it): the launcher's pid and a nonce, the
 * same for every rank of a launch, new for each launch (an inherited value is replaced) */
static void env_launch_id(void **s) {
    (void)s;
    char *const cmd[] = {"/bin/sh", "-c", "echo \"$RINGTRAIN_LAUNCH_ID\" >&2", NULL};
    setenv("RINGTRAIN_LAUNCH_ID", "stale", 1);
    rt_launch_options o;
    opts(&o, 2);
    rt_launch_result r, r2;
    assert_rt_ok(rt_launch_exec(&o, cmd, &r));
    assert_rt_ok(rt_launch_exec(&o, cmd, &r2));
    char want[32];
    snprintf(want, sizeof want, "%d.", (int)getpid());
    const char *id = r.ranks[0].last_line;
    assert_int_equal(strncmp(id, want, strlen(want)), 0);
    assert_int_equal(strlen(id), strlen(want) + 16);
    assert_int_equal(strspn(id + strlen(want), "0123456789abcdef"), 16);
    assert_string_equal(r.ranks[1].last_line, id);
    assert_string_not_equal(r2.ranks[0].last_line, id);
    rt_launch_result_free(&r);
    rt_launch_result_free(&r2);
    unsetenv("RINGTRAIN_LAUNCH_ID");
}

static void env_multi_node(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 2);
    o.nnodes = 3;
    o.node_rank = 1;
    o.master_addr = "10.1.2.3";
    o.master_port = 29999;
    o.job_token = "job-77";
    rt_launch_result r;
    assert_rt_ok(rt_launch_exec(&o, k_print_env, &r));
    assert_string_equal(r.ranks[0].last_line, "2 6 0 2 1 10.1.2.3 29999 job-77 unset");
    assert_string_equal(r.ranks[1].last_line, "3 6 1 2 1 10.1.2.3 29999 job-77 unset");
    assert_int_equal(r.ranks[1].rank, 3);
    rt_launch_result_free(&r);
    /* several nodes must agree on the port and the token */
    o.master_port = 0;
    assert_int_equal(rt_launch_exec(&o, k_print_env, &r), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "master_port"));
    rt_launch_result_free(&r);
    o.master_port = 29999;
    o.job_token = NULL;
    assert_int_equal(rt_launch_exec(&o, k_print_env, &r), RT_ERR_INVALID);
    rt_launch_result_free(&r);
    o.nnodes = 1;
    o.node_rank = 1; /* out of range */
    assert_int_equal(rt_launch_exec(&o, k_print_env, &r), RT_ERR_INVALID);
    assert_non_null(strstr(rt_error_message(), "node_rank"));
    rt_launch_result_free(&r);
    o.node_rank = 0;
    o.nproc = 0;
    assert_int_equal(rt_launch_exec(&o, k_print_env, &r), RT_ERR_INVALID);
    rt_launch_result_free(&r);
    rt_error_clear();
}

static void exec_missing_command(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 1);
    char *const argv[] = {"/nonexistent/ringtrain-no-such-program", NULL};
    rt_launch_result r;
    assert_int_equal(rt_launch_exec(&o, argv, &r), RT_ERR_PEER);
    assert_int_equal(r.first_failure, 0);
    assert_int_equal(r.ranks[0].exit_code, 127);
    assert_non_null(strstr(rt_error_message(), "rank 0 exited with code 127: launch: cannot run"));
    assert_non_null(strstr(rt_error_message(), "No such file"));
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* ---- failures (fork form) ---- */

/* rank 1 fails with code 3; the others wait to be stopped */
static int exits_3(int local, void *arg) {
    (void)arg;
    if (local == 1) {
        usleep(50000);
        fprintf(stderr, "loading the data\nerror: something went wrong\n  from a.c:1: f()\n\n   \n");
        return 3;
    }
    fprintf(stderr, "rank %d waiting\n", local);
    sleep_forever();
    return 0;
}

static void rank_exits_3(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 3);
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, exits_3, NULL, &r), RT_ERR_PEER);
    assert_int_equal(r.first_failure, 1);
    assert_int_equal(r.ranks[1].exit_code, 3);
    assert_int_equal(r.ranks[1].signal, 0);
    assert_false(r.ranks[1].stopped);
    assert_string_equal(r.ranks[1].last_line, "error: something went wrong");
    for (int i = 0; i < 3; i += 2) { /* stopped with SIGTERM (they do not catch it) */
        assert_true(r.ranks[i].stopped);
        assert_int_equal(r.ranks[i].signal, SIGTERM);
        assert_int_equal(rt_launch_rank_code(&r.ranks[i]), 128 + SIGTERM);
    }
    char line[RT_LAUNCH_LINE + 64];
    assert_string_equal(rt_launch_describe(&r, line, sizeof line),
                        "rank 1 exited with code 3: error: something went wrong");
    assert_int_equal(strncmp(rt_error_message(), line, strlen(line)), 0); /* + " (file:line)" */
    rt_launch_result_free(&r);
    rt_error_clear();
}

static int killed(int local, void *arg) {
    (void)arg;
    if (local == 0) {
        fprintf(stderr, "about to die");
        fflush(stderr);
        raise(SIGKILL);
    }
    sleep_forever();
    return 0;
}

static void rank_killed(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 2);
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, killed, NULL, &r), RT_ERR_PEER);
    assert_int_equal(r.first_failure, 0);
    assert_int_equal(r.ranks[0].signal, SIGKILL);
    assert_int_equal(rt_launch_rank_code(&r.ranks[0]), 128 + SIGKILL);
    assert_true(r.ranks[1].stopped);
    char line[RT_LAUNCH_LINE + 64];
    /* a last line without a newline still counts */
    assert_string_equal(rt_launch_describe(&r, line, sizeof line), "rank 0 was killed by SIGKILL: about to die");
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* A rank that dies by itself goes before a peer that exited with an error, even when the
 * peer's exit reached the launcher first (a peer sees the closed connection of a rank
 * killed by SIGKILL before that rank can be reaped). Deterministic stand-in: rank 0 exits 1
 * once rank 1 is ready; rank 1, when the launcher's SIGTERM comes (after rank 0 was
 * reaped), dies by a SIGKILL the launcher did not send. */
static int g_order[2] = {-1, -1}; /* a pipe: rank 1 -> rank 0, "ready" */

static void on_term_die(int sig) {
    (void)sig;
    raise(SIGKILL);
}

static int peer_error_then_death(int local, void *arg) {
    (void)arg;
    char c = 0;
    if (local == 0) {
        if (read(g_order[0], &c, 1) != 1) return 9;
        fprintf(stderr, "peer rank 1 closed its connection\n");
        return 1;
    }
    signal(SIGTERM, on_term_die);
    if (write(g_order[1], "r", 1) != 1) return 9;
    sleep_forever();
    return 0;
}

static void own_death_goes_first(void **s) {
    (void)s;
    assert_int_equal(pipe(g_order), 0);
    rt_launch_options o;
    opts(&o, 2);
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, peer_error_then_death, NULL, &r), RT_ERR_PEER);
    close(g_order[0]);
    close(g_order[1]);
    assert_int_equal(r.ranks[0].exit_code, 1);
    assert_int_equal(r.ranks[1].signal, SIGKILL);
    char line[RT_LAUNCH_LINE + 64];
    assert_string_equal(rt_launch_describe(&r, line, sizeof line), "rank 1 was killed by SIGKILL");
    assert_int_equal(r.first_failure, 1);
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* rank 0 ignores SIGTERM and hangs; rank 2 fails */

/* rank 0 ignores SIGTERM and hangs; rank 2 fails once rank 0 ignores SIGTERM (a pipe:
 * a fixed sleep raced with rank 0's start, which then died of the SIGTERM) */
static int g_ignoring[2] = {-1, -1};

static int hangs(int local, void *arg) {
    (void)arg;
    if (local == 0) {
        signal(SIGTERM, SIG_IGN);
        fprintf(stderr, "stuck forever\n");
        (void)!write(g_ignoring[1], "i", 1);
        sleep_forever();
    }
    if (local == 2) {
        char c;
        while (read(g_ignoring[0], &c, 1) < 0 && errno == EINTR) {
        }
        fprintf(stderr, "rank 2: fatal\n");
        return 1;
    }
    sleep_forever();
    return 0;
}

static void hang_is_killed_after_grace(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 3);
    o.grace_s = 1;
    rt_launch_result r;
    assert_int_equal(pipe(g_ignoring), 0);
    double t0 = now_s();
    assert_int_equal(rt_launch_fork(&o, hangs, NULL, &r), RT_ERR_PEER);
    close(g_ignoring[0]);
    close(g_ignoring[1]);
    double took = now_s() - t0;
    /* the grace period plus a generous margin for a loaded machine; without the
     * SIGKILL it would run into the 120 s time limit */
    if (took > 30) fail_msg("the launcher took %.1f s with a grace period of 1 s", took);
    assert_int_equal(r.first_failure, 2);
    assert_false(r.timed_out);
    assert_int_equal(r.ranks[0].signal, SIGKILL); /* ignored SIGTERM: killed after the grace period */
    assert_true(r.ranks[0].stopped);
    assert_int_equal(r.ranks[1].signal, SIGTERM);
    char line[RT_LAUNCH_LINE + 64];
    assert_string_equal(rt_launch_describe(&r, line, sizeof line), "rank 2 exited with code 1: rank 2: fatal");
    rt_launch_result_free(&r);
    rt_error_clear();
}

static int slow(int local, void *arg) {
    (void)arg;
    if (local == 1) return 0;
    sleep_forever();
    return 0;
}

static void time_limit(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 3);
    o.timeout_s = 2; /* rank 1 returns at once: 2 s leave a loaded machine time to see it exit */
    o.grace_s = 0.5;
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, slow, NULL, &r), RT_ERR_TIMEOUT);
    assert_true(r.timed_out);
    assert_int_equal(r.first_failure, -1);
    assert_true(r.ranks[0].timed_out && r.ranks[2].timed_out);
    assert_false(r.ranks[1].timed_out);
    assert_int_equal(r.ranks[1].exit_code, 0);
    assert_non_null(strstr(rt_error_message(), "time limit of 2 s: ranks 0, 2 were still running (stopped)"));
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* keep_going: a failure does not stop the others (the test harness) */
static int one_fails(int local, void *arg) {
    (void)arg;
    if (local == 0) return 4;
    usleep(200000);
    return 0;
}

static void keep_going(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 2);
    o.keep_going = true;
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, one_fails, NULL, &r), RT_ERR_PEER);
    assert_int_equal(r.first_failure, 0);
    assert_int_equal(r.ranks[1].exit_code, 0);
    assert_false(r.ranks[1].stopped);
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* ---- SIGINT to the launcher (the launcher runs in a child process) ---- */

static int g_ready_fd = -1;

static void on_int(int sig) {
    (void)sig;
    static const char msg[] = "rank 1: interrupted, exiting\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(130);
}

static int wait_for_sigint(int local, void *arg) {
    (void)arg;
    if (local == 1) signal(SIGINT, on_int); /* rank 1 handles it; rank 0 dies of it */
    (void)!write(g_ready_fd, "r", 1);
    sleep_forever();
    return 0;
}

static void sigint_forwarded(void **s) {
    (void)s;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t launcher = fork();
    if (launcher == 0) {
        close(ready[0]);
        g_ready_fd = ready[1];
        rt_launch_options o;
        opts(&o, 2);
        rt_launch_result r;
        rt_status st = rt_launch_fork(&o, wait_for_sigint, NULL, &r);
        int ok = st == RT_ERR_PEER && r.signal == SIGINT && r.first_failure == -1 && r.ranks[0].signal == SIGINT &&
                 r.ranks[1].exit_code == 130 && strcmp(r.ranks[1].last_line, "rank 1: interrupted, exiting") == 0 &&
                 strstr(rt_error_message(), "interrupted by SIGINT (forwarded to the ranks)") != NULL;
        if (!ok)
            fprintf(stderr, "launcher: status %s, signal %d, first %d, rank 0 signal %d, rank 1 code %d: %s\n",
                    rt_status_name(st), r.signal, r.first_failure, r.ranks ? r.ranks[0].signal : -1,
                    r.ranks ? r.ranks[1].exit_code : -1, rt_error_message());
        _exit(ok ? 0 : 1);
    }
    close(ready[1]);
    char c;
    for (int got = 0; got < 2;) { /* both ranks are up */
        ssize_t n = read(ready[0], &c, 1);
        if (n < 0 && errno == EINTR) continue;
        assert_int_equal(n, 1);
        got++;
    }
    close(ready[0]);
    assert_int_equal(kill(launcher, SIGINT), 0);
    int st = 0;
    assert_int_equal(waitpid(launcher, &st, 0), launcher);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- after a stop signal the ranks get as long as they make progress ---- */

static volatile sig_atomic_t g_got_signal;
static void on_stop(int sig) { g_got_signal = sig; }

static void catch_stops(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* what a trainer does: on SIGINT finish a long piece of work (2 s, 10 times the grace
 * period), telling the launcher it makes progress, then exit 130 */
static int finishes_after_sigint(int local, void *arg) {
    (void)arg;
    catch_stops();
    (void)!write(g_ready_fd, "r", 1);
    while (!g_got_signal) usleep(1000);
    for (int i = 0; i < 20; i++) {
        usleep(100000);
        rt_launch_heartbeat();
    }
    fprintf(stderr, "rank %d: stopped cleanly\n", local);
    return 128 + g_got_signal;
}

/* a rank that neither stops nor makes progress */
static int ignores_sigint(int local, void *arg) {
    (void)local;
    (void)arg;
    signal(SIGINT, SIG_IGN);
    (void)!write(g_ready_fd, "r", 1);
    sleep_forever();
    return 0;
}

/* Run fn on 2 ranks in a launcher (a child process), SIGINT it once both ranks are up;
 * the launcher's child exits 0 when check(result) holds. */
static void interrupt_launcher(rt_launch_fn fn, double progress_s, int (*check)(rt_status, rt_launch_result *)) {
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t launcher = fork();
    if (launcher == 0) {
        close(ready[0]);
        g_ready_fd = ready[1];
        rt_launch_options o;
        opts(&o, 2);
        o.grace_s = 0.2;
        o.progress_s = progress_s;
        rt_launch_result r;
        rt_status st = rt_launch_fork(&o, fn, NULL, &r);
        _exit(check(st, &r) ? 0 : 1);
    }
    close(ready[1]);
    char c;
    for (int got = 0; got < 2;) {
        ssize_t n = read(ready[0], &c, 1);
        if (n < 0 && errno == EINTR) continue;
        assert_int_equal(n, 1);
        got++;
    }
    close(ready[0]);
    assert_int_equal(kill(launcher, SIGINT), 0);
    int st = 0;
    assert_int_equal(waitpid(launcher, &st, 0), launcher);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static int both_stopped_cleanly(rt_status st, rt_launch_result *r) {
    bool ok = st == RT_ERR_PEER && r->signal == SIGINT && r->first_failure == -1;
    for (int i = 0; i < 2; i++) ok = ok && r->ranks[i].signal == 0 && r->ranks[i].exit_code == 130;
    if (!ok)
        fprintf(stderr, "launcher: status %s, signal %d; rank 0: code %d signal %d; rank 1: code %d signal %d\n",
                rt_status_name(st), r->signal, r->ranks ? r->ranks[0].exit_code : -1,
                r->ranks ? r->ranks[0].signal : -1, r->ranks ? r->ranks[1].exit_code : -1,
                r->ranks ? r->ranks[1].signal : -1);
    return ok;
}

static int both_killed(rt_status st, rt_launch_result *r) {
    bool ok = st == RT_ERR_PEER && r->signal == SIGINT;
    for (int i = 0; i < 2; i++) ok = ok && r->ranks[i].signal == SIGKILL;
    if (!ok) fprintf(stderr, "launcher: status %s, ranks not killed by SIGKILL\n", rt_status_name(st));
    return ok;
}

static void sigint_waits_for_progress(void **s) {
    (void)s;
    /* a 0.2 s grace period would kill them; the heartbeat keeps them alive */
    interrupt_launcher(finishes_after_sigint, 60, both_stopped_cleanly);
}

static void sigint_no_progress_is_killed(void **s) {
    (void)s;
    interrupt_launcher(ignores_sigint, 0.5, both_killed);
}

/* rank 1 was asked to stop alone and exits 143 at once; rank 0 (its peer, which agreed to
 * stop) still writes for 2 s, beating: it is neither signalled nor killed */
static int stops_on_its_own(int local, void *arg) {
    (void)arg;
    if (local == 1) return 128 + SIGTERM;
    catch_stops(); /* a SIGTERM from the launcher would be recorded */
    for (int i = 0; i < 20; i++) {
        usleep(100000);
        rt_launch_heartbeat();
    }
    return g_got_signal ? 1 : 128 + SIGTERM;
}

static void clean_stop_waits_for_peers(void **s) {
    (void)s;
    rt_launch_options o;
    opts(&o, 2);
    o.grace_s = 0.2;
    o.progress_s = 60;
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, stops_on_its_own, NULL, &r), RT_ERR_PEER);
    assert_int_equal(r.first_failure, 1);
    assert_int_equal(r.ranks[0].signal, 0);
    assert_int_equal(r.ranks[0].exit_code, 128 + SIGTERM); /* not 1: it got no signal */
    assert_false(r.ranks[0].stopped);
    rt_launch_result_free(&r);
    rt_error_clear();
}

/* A clean stop (rank 1 exits 143 on its own signal) and then a real failure of a peer
 * (rank 0 exits 1 once rank 1 is reaped and gone): the failure is the job's first failure,
 * so it is reported and can be restarted; a clean stop named first hid it. */
static int g_pid1[2] = {-1, -1}; /* a pipe: rank 1 -> rank 0, rank 1's pid */

static int stop_then_failure(int local, void *arg) {
    (void)arg;
    if (local == 1) {
        pid_t me = getpid();
        if (write(g_pid1[1], &me, sizeof me) != (ssize_t)sizeof me) return 9;
        return 128 + SIGTERM;
    }
    pid_t p1 = 0;
    if (read(g_pid1[0], &p1, sizeof p1) != (ssize_t)sizeof p1) return 9;
    for (int i = 0; i < 3000 && !(kill(p1, 0) != 0 && errno == ESRCH); i++) { /* reaped: gone */
        usleep(10000);
        rt_launch_heartbeat();
    }
    return 1;
}

static void failure_after_clean_stop_goes_first(void **s) {
    (void)s;
    assert_int_equal(pipe(g_pid1), 0);
    rt_launch_options o;
    opts(&o, 2);
    o.grace_s = 0.2;
    o.progress_s = 60;
    rt_launch_result r;
    assert_int_equal(rt_launch_fork(&o, stop_then_failure, NULL, &r), RT_ERR_PEER);
    assert_int_equal(r.ranks[1].exit_code, 128 + SIGTERM);
    assert_int_equal(r.ranks[0].exit_code, 1);
    assert_int_equal(r.first_failure, 0);
    rt_launch_result_free(&r);
    rt_error_clear();
    close(g_pid1[0]);
    close(g_pid1[1]);
}

/* ---- forwarding: every line reaches the launcher's stderr, tagged ---- */

static int chatty(int local, void *arg) {
    (void)arg;
    fprintf(stderr, "hello from %d\n", local);
    fflush(stderr);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fprintf(stderr, "%s\nno newline at the end", big);
    return 0;
}

static void lines_forwarded(void **s) {
    (void)s;
    char path[] = "/tmp/ringtrain-launch-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    pid_t p = fork();
    if (p == 0) {
        dup2(fd, 2);
        rt_launch_options o;
        opts(&o, 2);
        o.tag_lines = true;
        rt_launch_result r;
        _exit(rt_launch_fork(&o, chatty, NULL, &r) == RT_OK ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char buf[16384] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_non_null(strstr(buf, "[rank 0] hello from 0\n"));
    assert_non_null(strstr(buf, "[rank 1] hello from 1\n"));
    assert_non_null(strstr(buf, "[rank 1] no newline at the end\n"));
    assert_non_null(strstr(buf, "[rank 0] xxxxxxxxxx"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(env_single_node),      cmocka_unit_test(env_multi_node),
        cmocka_unit_test(exec_missing_command), cmocka_unit_test(rank_exits_3),
        cmocka_unit_test(rank_killed),          cmocka_unit_test(hang_is_killed_after_grace),
        cmocka_unit_test(time_limit),           cmocka_unit_test(keep_going),
        cmocka_unit_test(sigint_forwarded),     cmocka_unit_test(sigint_waits_for_progress),
        cmocka_unit_test(sigint_no_progress_is_killed), cmocka_unit_test(clean_stop_waits_for_peers),
        cmocka_unit_test(lines_forwarded),
        cmocka_unit_test(env_restart_count),    cmocka_unit_test(own_death_goes_first),
        cmocka_unit_test(env_launch_id),
        cmocka_unit_test(failure_after_clean_stop_goes_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
