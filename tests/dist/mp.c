/* Multi-process test harness (see mp.h): a thin wrapper over the launcher's fork form. */
#include "mp.h"

#include "dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

typedef struct mp_call {
    mp_fn fn;
    void *arg;
} mp_call;

/* The rank's body sees the test process's environment: the launcher's variables are
 * read (world size, port) and removed, so that tests of other launchers' variables
 * (Open MPI, Slurm, torchrun's agent store) still test exactly those. The job secret
 * (RINGTRAIN_JOB_TOKEN) stays: every rank of one mp_run shares it, as under the launcher;
 * a test of the launchers' fallbacks unsets it. */
static int mp_rank(int local_rank, void *p) {
    const mp_call *c = p;
    const char *w = getenv("WORLD_SIZE"), *port = getenv("MASTER_PORT");
    int world = w ? atoi(w) : 0, prt = port ? atoi(port) : 0;
    static const char *const launcher_vars[] = {"RANK",       "WORLD_SIZE",  "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"};
    for (size_t i = 0; i < sizeof launcher_vars / sizeof *launcher_vars; i++) unsetenv(launcher_vars[i]);
    return c->fn(local_rank, world, prt, c->arg);
}

int mp_run(int world, mp_fn fn, void *arg, double limit_s, int *codes) {
    int local[64];
    if (world < 1 || world > 64) return world;
    if (!codes) codes = local;
    rt_launch_options o;
    rt_launch_options_default(&o);
    o.nproc = world;
    o.keep_going = true; /* tests kill ranks on purpose and check what the survivors report */
    o.timeout_s = limit_s;
    o.grace_s = 2;
    mp_call c = {fn, arg};
    rt_launch_result res;
    rt_status s = rt_launch_fork(&o, mp_rank, &c, &res);
    if (!res.ranks) {
        fprintf(stderr, "mp_run: %s\n", rt_error_message());
        return world;
    }
    if (s != RT_OK && res.timed_out) fprintf(stderr, "mp_run: %s\n", rt_error_message());
    int failed = 0;
    for (int r = 0; r < world; r++) {
        codes[r] = rt_launch_rank_code(&res.ranks[r]);
        failed += codes[r] != 0;
    }
    rt_launch_result_free(&res);
    return failed;
}

void mp_pg_options(rt_pg_options *o, char method[MP_METHOD_LEN], int rank, int world, int port, rt_transport transport,
                   double timeout_s) {
    if (rt_pg_options_default(o) != RT_OK) { /* a bad setting in the test's environment */
        fprintf(stderr, "mp_pg_options: %s\n", rt_error_message());
        abort();
    }
    snprintf(method, MP_METHOD_LEN, "tcp://127.0.0.1:%d", port);
    o->init_method = method;
    o->rank = rank;
    o->world_size = world;
    o->transport = transport;
    o->timeout_s = timeout_s;
}
