/* Rendezvous: init-method parsing, launcher environment variables, store hosting and
 * connection (see rendezvous.h for the rules). */
#include "dist/internal/rendezvous.h"
#include "dist/dist.h"

#include "core/log.h"
#include "core/settings.h"
#include "core/timer.h"
#include "dist/internal/env.h"
#include "dist/internal/sock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

rt_status rt_rdzv_parse(const char *init_method, int rank, int world, rt_rdzv *out) {
    memset(out, 0, sizeof *out);
    if (!init_method || !*init_method) init_method = "env://";
    /* rank / world size: the arguments, else the launcher's variables */
    rt_dist_env de;
    RT_CHECK(rt_dist_env_read(&de));
    out->rank = rank;
    out->world = world;
    out->local_rank = de.local_rank;
    out->rank_source = "arguments";
    if (out->rank < 0 && de.rank >= 0) {
        out->rank = de.rank;
        out->rank_source = de.rank_source;
    }
    if (out->world < 0) out->world = de.world_size;
    if (out->rank < 0 || out->world < 0)
        return RT_ERROR(RT_ERR_INVALID,
                        "rendezvous: rank/world size unknown: pass them, or set RANK and WORLD_SIZE (torchrun), "
                        "OMPI_COMM_WORLD_RANK/SIZE (mpirun) or SLURM_PROCID/SLURM_NTASKS (srun)");
    if (out->world < 1 || out->rank >= out->world)
        return RT_ERROR(RT_ERR_INVALID, "rendezvous: rank %d out of range for world size %d (from %s)", out->rank,
                        out->world, out->rank_source);
    if (out->local_rank < 0) out->local_rank = 0;

    /* the job secret (rendezvous.h, docs/security.md) */
    const char *job = rt_setting_text(RT_SET_JOB_TOKEN);
    char buf[256] = "";
    out->secret_source = "RINGTRAIN_JOB_TOKEN";
    if (!job && (job = rt_setting_text(RT_SET_TE_RUN_ID)) != NULL) out->secret_source = "TORCHELASTIC_RUN_ID";
    if (!job && rt_setting_is_set(RT_SET_SLURM_JOB_ID)) {
        snprintf(buf, sizeof buf, "slurm-%s.%s", rt_setting_text(RT_SET_SLURM_JOB_ID),
                 rt_setting_str(RT_SET_SLURM_STEP_ID)); /* default "0" */
        job = buf;
        out->secret_source = "SLURM_JOB_ID.SLURM_STEP_ID";
    }
    if (!job && (job = rt_setting_text(RT_SET_OMPI_JOBID)) != NULL) out->secret_source = "OMPI_MCA_ess_base_jobid";
    if (!job) out->secret_source = NULL;
    RT_REQUIRE(!job || strlen(job) < sizeof out->job, RT_ERR_INVALID, "rendezvous: %s is longer than %zu bytes",
               out->secret_source, sizeof out->job - 1);
    snprintf(out->job, sizeof out->job, "%s", job ? job : "");

    bool hosted = false; /* ringtrain's launcher hosts the store */
    RT_CHECK(rt_setting_bool(RT_SET_STORE_HOSTED, &hosted));
    out->host_store = out->rank == 0 && !hosted;

    if (strncmp(init_method, "env://", 6) == 0) {
        out->kind = RT_RDZV_ENV;
        const char *addr = rt_setting_text(RT_SET_MASTER_ADDR), *port = rt_setting_text(RT_SET_MASTER_PORT);
        if (!addr || !port)
            return RT_ERROR(RT_ERR_INVALID, "rendezvous env://: MASTER_ADDR and MASTER_PORT must be set (got %s, %s)",
                            addr ? addr : "unset", port ? port : "unset");
        snprintf(out->host, sizeof out->host, "%s", addr);
        int64_t p = 0;
        RT_CHECK(rt_setting_int(RT_SET_MASTER_PORT, &p));
        out->port = (int)p;
        bool agent = false; /* torchrun's own store holds MASTER_PORT */
        RT_CHECK(rt_setting_bool(RT_SET_TE_AGENT_STORE, &agent));
        if (agent) {
            RT_REQUIRE(out->port < 65535, RT_ERR_INVALID, "MASTER_PORT 65535 leaves no port for the store");
            out->port += 1; /* torchrun's own store holds MASTER_PORT */
        }
    } else if (strncmp(init_method, "tcp://", 6) == 0) {
        out->kind = RT_RDZV_TCP;
        const char *hp = init_method + 6;
        const char *colon = strrchr(hp, ':');
        if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof out->host)
            return RT_ERROR(RT_ERR_INVALID, "rendezvous '%s': expected tcp://HOST:PORT", init_method);
        memcpy(out->host, hp, (size_t)(colon - hp));
        out->host[colon - hp] = '\0';
        RT_CHECK(rt_env_parse_int("tcp:// port", colon + 1, 1, 65535, &out->port));
    } else if (strncmp(init_method, "file://", 7) == 0) {
        out->kind = RT_RDZV_FILE;
        const char *p = init_method + 7;
        RT_REQUIRE(*p && strlen(p) < sizeof out->path, RT_ERR_INVALID, "rendezvous '%s': expected file:///PATH",
                   init_method);
        snprintf(out->path, sizeof out->path, "%s", p);
    } else {
        return RT_ERROR(RT_ERR_INVALID,
                        "rendezvous: unknown init method '%s' (expected env://, tcp://HOST:PORT or "
                        "file:///PATH)",
                        init_method);
    }
    if (rt_setting_is_set(RT_SET_STORE_PORT) && out->kind != RT_RDZV_FILE) {
        int64_t p = 0;
        RT_CHECK(rt_setting_int(RT_SET_STORE_PORT, &p));
        out->port = (int)p;
    }
    return RT_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* file://: the store listens on the address it publishes (RINGTRAIN_STORE_ADDR, else
 * MASTER_ADDR, else loopback). */
static const char *store_bind_addr(void) {
    const char *host = rt_setting_text(RT_SET_STORE_ADDR);
    if (!host) host = rt_setting_text(RT_SET_MASTER_ADDR);
    return host ? host : "127.0.0.1";
}

/* file://: rank 0 publishes "host port token". */
static rt_status file_publish(rt_rdzv *r, int port) {
    const char *host = store_bind_addr();
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", r->path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return RT_ERROR(RT_ERR_IO, "rendezvous file://%s: cannot create %s: %s", r->path, tmp, strerror(errno));
    char line[600];
    /* the secret goes to the file only when rank 0 made it up (the others have theirs) */
    bool made = r->secret_source && strcmp(r->secret_source, "the file:// rendezvous") == 0;
    int n = snprintf(line, sizeof line, "%s %d %s\n", host, port, made ? r->job : "");
    bool ok = write(fd, line, (size_t)n) == n && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, r->path) != 0) {
        unlink(tmp);
        return RT_ERROR(RT_ERR_IO, "rendezvous file://%s: cannot write it: %s", r->path, strerror(errno));
    }
    return RT_OK;
}

static bool file_read(rt_rdzv *r) {
    FILE *f = fopen(r->path, "r");
    if (!f) return false;
    char host[256], job[256] = "";
    int port = 0;
    int n = fscanf(f, "%255s %d %255s", host, &port, job);
    fclose(f);
    if (n < 2 || port <= 0 || port > 65535) return false;
    snprintf(r->host, sizeof r->host, "%s", host);
    r->port = port;
    if (n == 3) snprintf(r->job, sizeof r->job, "%s", job);
    if (!r->job[0]) return false; /* no secret anywhere (yet) */
    return true;
}

rt_status rt_rdzv_connect(rt_rdzv *r, double timeout_s, rt_store_server **server, rt_store **store) {
    *server = NULL;
    *store = NULL;
    uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    if (!r->job[0] && r->kind != RT_RDZV_FILE) {
        RT_REQUIRE(r->world == 1, RT_ERR_INVALID,
                   "rendezvous: no job secret: set RINGTRAIN_JOB_TOKEN to the same random value for every rank "
                   "(export RINGTRAIN_JOB_TOKEN=$(openssl rand -hex 16)); ringtrain's launcher sets it, torchrun, "
                   "mpirun and srun give a weaker fallback (docs/security.md)");
        /* a world of one: nobody else is to join, so a secret nobody knows */
        RT_CHECK(rt_random_hex(r->job, RT_SECRET_BYTES));
        r->secret_source = "a random secret (world size 1)";
    }
    if (r->kind == RT_RDZV_FILE) {
        if (r->host_store) {
            if (!r->job[0]) { /* no secret from the environment: a random one, in the file only */
                RT_CHECK(rt_random_hex(r->job, RT_SECRET_BYTES));
                r->secret_source = "the file:// rendezvous";
            }
            int port = 0;
            RT_CHECK(rt_store_server_start(store_bind_addr(), 0, r->job, r->world, server, &port));
            rt_status s = file_publish(r, port);
            if (s != RT_OK) {
                rt_store_server_stop(*server);
                *server = NULL;
                return s;
            }
            snprintf(r->host, sizeof r->host, "127.0.0.1");
            r->port = port;
        } else {
            int delay = 10;
            for (;;) {
                if (file_read(r)) {
                    double left = (double)(deadline > rt_now_ns() ? deadline - rt_now_ns() : 0) * 1e-9;
                    rt_status s =
                        rt_store_connect(r->host, r->port, r->job, r->rank, r->world, left < 1.0 ? left : 1.0, store);
                    if (s == RT_OK) {
                        rt_store_set_timeout(*store, timeout_s);
                        return RT_OK;
                    }
                    if (s != RT_ERR_TIMEOUT && s != RT_ERR_PEER) return s;
                }
                if (rt_now_ns() >= deadline)
                    return RT_ERROR(RT_ERR_TIMEOUT,
                                    "rendezvous file://%s: rank %d found no live store within %.1f s (rank 0 never "
                                    "arrived?)",
                                    r->path, r->rank, timeout_s);
                sleep_ms(delay);
                if (delay < 500) delay *= 2;
            }
        }
    } else if (r->host_store) {
        /* only where the others were told to connect: MASTER_ADDR / the tcp:// host (a
         * single-host job: 127.0.0.1); every interface only when that is 0.0.0.0 */
        int port = 0;
        rt_status ss = rt_store_server_start(r->host, r->port, r->job, r->world, server, &port);
        if (ss != RT_OK) {
            rt_error_trace(__FILE__, __LINE__,
                           "rank 0 hosts the store on the address the ranks connect to: it must be one of this "
                           "host's addresses (or 0.0.0.0 for every interface)");
            return ss;
        }
        if (r->world > 1 && strcmp(r->secret_source, "RINGTRAIN_JOB_TOKEN") != 0)
            RT_LOG_WARN("rendezvous: RINGTRAIN_JOB_TOKEN is unset: the job secret is %s, which other users of these "
                        "hosts may guess; export RINGTRAIN_JOB_TOKEN=$(openssl rand -hex 16) on every node "
                        "(docs/security.md)",
                        r->secret_source);
    }
    char what[300];
    snprintf(what, sizeof what, "store at %s:%d", r->host, r->port);
    rt_status s = rt_store_connect(r->host, r->port, r->job, r->rank, r->world, timeout_s, store);
    if (s != RT_OK) {
        if (*server) rt_store_server_stop(*server);
        *server = NULL;
        rt_error_trace(__FILE__, __LINE__, what);
        return s;
    }
    (void)deadline;
    return RT_OK;
}
