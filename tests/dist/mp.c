/* Multi-process test harness (see mp.h). */
#include "mp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int mp_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        if (fd >= 0) close(fd);
        return 29500 + (int)(getpid() % 1000);
    }
    int port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mp_run(int world, mp_fn fn, void *arg, double limit_s, int *codes) {
    int port = mp_free_port();
    pid_t pids[64];
    int local[64];
    if (world > 64) return world;
    if (!codes) codes = local;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        pid_t p = fork();
        if (p == 0) {
            int rc = fn(r, world, port, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        pids[r] = p;
        codes[r] = -1;
    }
    int left = world, failed = 0;
    double t0 = now_s();
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < world; r++)
                if (pids[r] == p) {
                    codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    if (codes[r] != 0) failed++;
                    left--;
                }
            continue;
        }
        if (now_s() - t0 > limit_s) {
            fprintf(stderr, "mp_run: ranks still running after %.0f s: killing them\n", limit_s);
            for (int r = 0; r < world; r++)
                if (codes[r] < 0) kill(pids[r], SIGKILL);
            limit_s = 1e9;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return failed;
}

void mp_pg_options(rt_pg_options *o, char method[MP_METHOD_LEN], int rank, int world, int port,
                   rt_transport transport, double timeout_s) {
    rt_pg_options_default(o);
    snprintf(method, MP_METHOD_LEN, "tcp://127.0.0.1:%d", port);
    o->init_method = method;
    o->rank = rank;
    o->world_size = world;
    o->transport = transport;
    o->timeout_s = timeout_s;
}
