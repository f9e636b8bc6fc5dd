/* The local launcher (see launch.h): environment, fork/exec, the stderr pipes, signal
 * forwarding, the ranks' heartbeat, stopping the ranks after the first failure, removing
 * the named shm segments a rank killed during its setup left behind. */
#include "dist/launch.h"

#include "core/timer.h"
#include "core/settings.h"
#include "dist/internal/sock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* the variables the launcher sets (an inherited value is replaced); the last one is
 * dropped: it describes torchrun's own store, which this launcher does not run */
enum {
    V_RANK,
    V_WORLD,
    V_LOCAL,
    V_LOCAL_WORLD,
    V_GROUP,
    V_ADDR,
    V_PORT,
    V_TOKEN,
    V_BEAT,
    V_RESTARTS,
    V_MAX_RESTARTS,
    V_LAUNCH_ID,
    V_SET_,
    V_DROP_ = V_SET_,
    V_COUNT_
};
static const char *const k_vars[V_COUNT_] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RINGTRAIN_JOB_TOKEN",
    "RINGTRAIN_HEARTBEAT_FD",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "RINGTRAIN_LAUNCH_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
};

/* signals the launcher catches while it supervises (restored before it returns) */
static const int k_sigs[] = {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGUSR1};
enum { N_SIGS = sizeof k_sigs / sizeof k_sigs[0], LINE_BUF = 4096 };

static volatile sig_atomic_t g_signal;   /* SIGINT / SIGTERM received */
static volatile sig_atomic_t g_nsignals; /* how many */
static volatile sig_atomic_t g_nusr1;    /* SIGUSR1s received: forwarded to the ranks, not a stop */
static int g_wake = -1;                  /* write end of the self-pipe */

static void on_signal(int sig) {
    int saved = errno;
    if (sig == SIGINT || sig == SIGTERM) {
        g_signal = sig;
        g_nsignals++;
    }
    if (sig == SIGUSR1) g_nusr1++;
    if (g_wake >= 0 && sig != SIGPIPE) (void)!write(g_wake, "", 1);
    errno = saved;
}

void rt_launch_options_default(rt_launch_options *o) {
    memset(o, 0, sizeof *o);
    o->nproc = 1;
    o->nnodes = 1;
    o->master_addr = "127.0.0.1";
    o->grace_s = 5.0;
}

const char *rt_signal_name(int sig, char *buf, size_t n) {
    const char *abbrev = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (abbrev)
        snprintf(buf, n, "SIG%s", abbrev);
    else
        snprintf(buf, n, "signal %d", sig);
    return buf;
}

int rt_launch_rank_code(const rt_launch_rank *r) {
    if (r->signal) return 128 + r->signal;
    return r->exit_code;
}

const char *rt_launch_describe(const rt_launch_result *r, char *buf, size_t n) {
    char sig[32];
    if (!r || !r->ranks) {
        snprintf(buf, n, "no ranks were started");
    } else if (r->first_failure >= 0) {
        const rt_launch_rank *f = &r->ranks[r->first_failure];
        int len = f->signal ? snprintf(buf, n, "rank %d was killed by %s", f->rank,
                                       rt_signal_name(f->signal, sig, sizeof sig))
                            : snprintf(buf, n, "rank %d exited with code %d", f->rank, f->exit_code);
        if (f->last_line[0] && len >= 0 && (size_t)len < n) snprintf(buf + len, n - (size_t)len, ": %s", f->last_line);
    } else if (r->signal) {
        snprintf(buf, n, "interrupted by %s (forwarded to the ranks)", rt_signal_name(r->signal, sig, sizeof sig));
    } else if (r->timed_out) {
        char list[256] = "";
        size_t len = 0;
        int k = 0;
        for (int i = 0; i < r->nproc && len < sizeof list; i++)
            if (r->ranks[i].timed_out)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k++ ? ", " : "", r->ranks[i].rank);
        snprintf(buf, n, "time limit of %g s: rank%s %s %s still running (stopped)", r->timeout_s, k > 1 ? "s" : "",
                 list, k > 1 ? "were" : "was");
    } else {
        int bad = 0;
        for (int i = 0; i < r->nproc; i++) bad += rt_launch_rank_code(&r->ranks[i]) != 0;
        if (bad)
            snprintf(buf, n, "%d of %d ranks failed", bad, r->nproc);
        else
            snprintf(buf, n, "all %d ranks exited with code 0", r->nproc);
    }
    return buf;
}

void rt_launch_result_free(rt_launch_result *r) {
    if (!r) return;
    free(r->ranks);
    r->ranks = NULL;
}

/* ---- supervision ---- */

typedef struct slot {
    int fd; /* read end of the rank's stderr pipe, -1 once closed */
    char line[LINE_BUF];
    size_t len;
    bool running;
    bool have_head; /* last_line holds a line that is not indented */
    uint64_t sent;  /* the signals the launcher sent it (bit 1 << sig) */
} slot;

typedef struct launch {
    const rt_launch_options *o;
    rt_launch_result *res;
    slot *slots;
    int running;
    bool stopping;
    bool patient;       /* a stop on a signal: SIGKILL only when no heartbeat came for progress_s */
    bool killed;        /* SIGKILL sent */
    uint64_t kill_at;   /* with !patient: SIGKILL the rest at this time */
    uint64_t last_beat; /* the newest heartbeat (or the stop's start) */
    int beat_rd;        /* read end of the heartbeat pipe */
    int beat_wr;        /* its write end (the ranks' RINGTRAIN_HEARTBEAT_FD) */
    pid_t parent;       /* the launcher's pid (children check it after PR_SET_PDEATHSIG) */
} launch;

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* stderr closed: forwarding is best effort */
        p += w;
        n -= (size_t)w;
    }
}

/* One complete line of rank i: forward it, remember it when not blank. */
static void emit_line(launch *L, int i, const char *p, size_t n) {
    char out[LINE_BUF + 64];
    size_t k = 0;
    if (L->o->tag_lines) k = (size_t)snprintf(out, sizeof out, "[rank %d] ", L->res->ranks[i].rank);
    memcpy(out + k, p, n);
    out[k + n] = '\n';
    write_all(STDERR_FILENO, out, k + n + 1);
    while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    size_t b = 0;
    while (b < n && (p[b] == ' ' || p[b] == '\t')) b++;
    if (b == n) return;
    rt_launch_rank *r = &L->res->ranks[i];
    const char *dg = memmem(p, n, "diagnosis: ", 11);
    if (dg && !L->res->diagnosis[0]) { /* every rank that timed out prints it: keep one */
        size_t dl = n - (size_t)(dg + 11 - p);
        if (dl > sizeof L->res->diagnosis - 1) dl = sizeof L->res->diagnosis - 1;
        memcpy(L->res->diagnosis, dg + 11, dl);
        L->res->diagnosis[dl] = '\0';
    }
    /* an indented line continues the one before (an error's trace): keep the head line */
    if (b > 0 && L->slots[i].have_head) return;
    L->slots[i].have_head = b == 0;
    size_t m = n < sizeof r->last_line - 1 ? n : sizeof r->last_line - 1;
    memcpy(r->last_line, p, m);
    r->last_line[m] = '\0';
}

/* Read what rank i's pipe holds; at EOF (or error) flush a partial line and close it. */
static void drain(launch *L, int i) {
    slot *s = &L->slots[i];
    while (s->fd >= 0) {
        ssize_t got = read(s->fd, s->line + s->len, sizeof s->line - s->len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (got <= 0) {
            if (s->len) emit_line(L, i, s->line, s->len);
            s->len = 0;
            close(s->fd);
            s->fd = -1;
            return;
        }
        s->len += (size_t)got;
        size_t start = 0;
        for (size_t k = 0; k < s->len; k++)
            if (s->line[k] == '\n') {
                emit_line(L, i, s->line + start, k - start);
                start = k + 1;
            }
        if (start == 0 && s->len == sizeof s->line) { /* a line longer than the buffer: pass it on in pieces */
            emit_line(L, i, s->line, s->len);
            start = s->len;
        }
        memmove(s->line, s->line + start, s->len - start);
        s->len -= start;
    }
}

/* One heartbeat: the global rank that beat and the newest step it reported (-1: none).
 * 16 bytes, written with one write() (atomic on a pipe: under PIPE_BUF), so the records of
 * the ranks sharing the pipe never interleave and every read returns whole records. */
typedef struct beat_record {
    int32_t rank;
    int32_t magic;
    int64_t step;
} beat_record;
#define BEAT_MAGIC 0x52544842 /* "RTHB" */

/* Read the heartbeats waiting in the pipe: the time of the newest, and each rank's step. */
static void read_beats(launch *L) {
    beat_record b[256];
    ssize_t got;
    while ((got = read(L->beat_rd, b, sizeof b)) > 0 || (got < 0 && errno == EINTR)) {
        if (got < 0) continue;
        L->last_beat = rt_now_ns();
        for (size_t k = 0; k < (size_t)got / sizeof *b; k++) {
            int i = b[k].rank - L->o->node_rank * L->res->nproc;
            if (b[k].magic == BEAT_MAGIC && i >= 0 && i < L->res->nproc && b[k].step >= 0)
                L->res->ranks[i].step = b[k].step;
        }
    }
}

static void signal_all(launch *L, int sig, bool stopped) {
    for (int i = 0; i < L->res->nproc; i++)
        if (L->slots[i].running && L->res->ranks[i].pid > 0) {
            kill((pid_t)L->res->ranks[i].pid, sig);
            if (sig > 0 && sig < 64) L->slots[i].sent |= 1ull << sig;
            if (stopped) L->res->ranks[i].stopped = true;
        }
}

/* Signal the ranks (sig 0: none) and stop. `patient` (a stop the ranks were asked for:
 * SIGINT/SIGTERM, or a rank that stopped cleanly on one): they get as long as they beat,
 * progress_s between heartbeats (0: grace_s, as a failure). Otherwise (a failure, the time
 * limit) SIGKILL after grace_s, also when a patient stop was under way: the peers of a
 * failed rank cannot make progress. */
static void begin_stop(launch *L, int sig, bool stopped, bool patient) {
    if (sig) signal_all(L, sig, stopped);
    patient = patient && L->o->progress_s > 0;
    uint64_t now = rt_now_ns();
    if (!L->stopping) {
        L->stopping = true;
        L->patient = patient;
        L->last_beat = now;
        L->kill_at = now + (uint64_t)(L->o->grace_s * 1e9);
    } else if (L->patient && !patient) {
        L->patient = false;
        L->kill_at = now + (uint64_t)(L->o->grace_s * 1e9);
    }
}

/* When the ranks still running get SIGKILL (0: not scheduled). */
static uint64_t kill_deadline(const launch *L) {
    if (!L->stopping || L->killed) return 0;
    if (L->patient) return L->last_beat + (uint64_t)(L->o->progress_s * 1e9);
    return L->kill_at;
}

/* Rank i was killed by a signal the launcher did not send it (SIGKILL of the OOM killer or of
 * a user, SIGSEGV, SIGABRT): it died by itself, never as a consequence of a peer's failure. */
static bool own_death(const launch *L, int i) {
    int sig = L->res->ranks[i].signal;
    return sig > 0 && sig < 64 && sig != SIGPIPE && !(L->slots[i].sent & (1ull << sig));
}

/* Rank i exited 130 or 143 by itself: it stopped cleanly on SIGINT/SIGTERM (a stop someone
 * asked for, its peers stop with it), not a failure of its own. */
static bool clean_exit(const launch *L, int i) {
    const rt_launch_rank *r = &L->res->ranks[i];
    return r->pid > 0 && !r->signal && (r->exit_code == 128 + SIGINT || r->exit_code == 128 + SIGTERM);
}

static void reap(launch *L) {
    bool any_real_fail = false, any_clean = false;
    if (L->beat_rd >= 0) read_beats(L); /* a rank that died: the step it reported last */
    for (int i = 0; i < L->res->nproc; i++) {
        slot *s = &L->slots[i];
        rt_launch_rank *r = &L->res->ranks[i];
        if (!s->running) continue;
        int st = 0;
        pid_t p = waitpid((pid_t)r->pid, &st, WNOHANG);
        if (p == 0 || (p < 0 && errno == EINTR)) continue;
        s->running = false;
        L->running--;
        /* its last records are in the pipe now that it is gone (it may have written them
         * after the read above: with one rank no later pass reads them) */
        if (L->beat_rd >= 0) read_beats(L);
        if (p < 0) { /* not our child any more (someone else reaped it): unknown fate */
            r->exit_code = -1;
        } else if (WIFSIGNALED(st)) {
            r->exit_code = -1;
            r->signal = WTERMSIG(st);
        } else {
            r->exit_code = WEXITSTATUS(st);
        }
        /* what it wrote before exiting is in the pipe; a grandchild holding the pipe
         * open must not keep the launcher waiting, so read what is there and close */
        drain(L, i);
        if (s->fd >= 0) {
            if (s->len) emit_line(L, i, s->line, s->len);
            s->len = 0;
            close(s->fd);
            s->fd = -1;
        }
        bool failed = p < 0 || r->signal != 0 || r->exit_code != 0;
        if (!failed) continue;
        /* a rank the launcher signalled is a consequence, not a first failure; a rank that
         * died by itself goes before one that exited with an error: its death makes its peers
         * exit with a lost-peer error, which can reach the launcher first (a peer sees the
         * closed connection before the dead rank can be reaped, and a pass goes in rank order) */
        /* and a real failure goes before a clean stop (a rank that stopped on its own signal
         * while a peer then failed: the failure is what the user must see, and restart) */
        int first = L->res->first_failure;
        bool clean_stop = p > 0 && clean_exit(L, i);
        if (!L->res->signal && ((first < 0 && !r->stopped) || (first >= 0 && own_death(L, i) && !own_death(L, first)) ||
                                (first >= 0 && clean_exit(L, first) && !clean_stop && !r->stopped)))
            L->res->first_failure = i;
        /* exit 130/143: it stopped cleanly on SIGINT/SIGTERM, and its peers stop with it
         * (they agreed to): wait for them while they make progress, send them nothing */
        if (clean_stop && L->o->progress_s > 0)
            any_clean = true;
        else
            any_real_fail = true;
    }
    /* after the pass: a rank that ended before it was signalled is not counted as stopped */
    if (L->o->keep_going) return;
    if (any_real_fail && (!L->stopping || L->patient))
        begin_stop(L, SIGTERM, true, false); /* the peers of a failed rank: SIGTERM, SIGKILL after grace_s */
    else if (any_clean && !L->stopping)
        begin_stop(L, 0, false, true); /* a clean stop: wait while the others make progress */
}

static void supervise(launch *L) {
    const rt_launch_options *o = L->o;
    rt_launch_result *res = L->res;
    uint64_t t0 = rt_now_ns(), limit = o->timeout_s > 0 ? t0 + (uint64_t)(o->timeout_s * 1e9) : 0;
    struct pollfd *pfd = NULL;
    int *who = NULL;
    pfd = calloc((size_t)res->nproc + 2, sizeof *pfd);
    who = calloc((size_t)res->nproc + 2, sizeof *who);
    int wake_rd = L->slots[res->nproc].fd; /* the self-pipe rides in the last slot */
    sig_atomic_t usr1_seen = g_nusr1;
    for (;;) {
        if (g_nusr1 != usr1_seen) { /* SIGUSR1: every running rank dumps its flight recorder; not a stop */
            usr1_seen = g_nusr1;
            for (int i = 0; i < res->nproc; i++)
                if (L->slots[i].running && res->ranks[i].pid > 0) kill((pid_t)res->ranks[i].pid, SIGUSR1);
        }
        reap(L);
        if (L->running == 0) {
            /* a SIGINT/SIGTERM that came while the last ranks ended is still the user's
             * request: it must be reported (and a job must not be restarted after it) */
            if (g_signal && !res->signal) res->signal = g_signal;
            break;
        }
        uint64_t now = rt_now_ns();
        if (g_signal && !res->signal) { /* forward it; the ranks get as long as they make progress */
            res->signal = g_signal;
            begin_stop(L, g_signal, true, true);
        } else if (g_nsignals > 1 && L->stopping && !L->killed) { /* asked twice (Ctrl-C again): kill now */
            signal_all(L, SIGKILL, true);
            L->killed = true;
        }
        if (limit && now >= limit && !res->timed_out) {
            res->timed_out = true;
            for (int i = 0; i < res->nproc; i++)
                if (L->slots[i].running) res->ranks[i].timed_out = true;
            begin_stop(L, SIGTERM, true, false);
        }
        uint64_t kill = kill_deadline(L);
        if (kill && now >= kill) {
            signal_all(L, SIGKILL, true);
            L->killed = true;
            kill = 0;
        }
        /* sleep until output, a heartbeat, a signal (SIGCHLD included), or the next deadline */
        int ms = 200;
        uint64_t next = kill ? kill : limit && !res->timed_out ? limit : 0;
        if (next) {
            uint64_t left = next > now ? (next - now) / 1000000 + 1 : 0;
            if (left < (uint64_t)ms) ms = (int)left;
        }
        int n = 0;
        if (pfd && who) {
            pfd[n] = (struct pollfd){.fd = wake_rd, .events = POLLIN};
            who[n++] = -1;
            if (L->beat_rd >= 0) {
                pfd[n] = (struct pollfd){.fd = L->beat_rd, .events = POLLIN};
                who[n++] = -2;
            }
            for (int i = 0; i < res->nproc; i++)
                if (L->slots[i].fd >= 0) {
                    pfd[n] = (struct pollfd){.fd = L->slots[i].fd, .events = POLLIN};
                    who[n++] = i;
                }
            int k = poll(pfd, (nfds_t)n, ms);
            for (int j = 0; k > 0 && j < n; j++) {
                if (!pfd[j].revents) continue;
                if (who[j] == -2) { /* a rank made progress */
                    read_beats(L);
                } else if (who[j] < 0) {
                    char sink[64];
                    while (read(wake_rd, sink, sizeof sink) > 0) {
                    }
                } else {
                    drain(L, who[j]);
                }
            }
        } else { /* no memory for the poll table: poll the pipes by sleeping */
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
            for (int i = 0; i < res->nproc; i++) drain(L, i);
        }
    }
    free(pfd);
    free(who);
}

/* ---- setup ---- */

typedef struct rank_env {
    char **envp;
    char vals[V_SET_][320];
} rank_env;

static bool is_set_var(const char *entry) {
    for (int v = 0; v < V_COUNT_; v++) {
        size_t k = strlen(k_vars[v]);
        if (strncmp(entry, k_vars[v], k) == 0 && entry[k] == '=') return true;
    }
    return false;
}

static rt_status build_env(const rt_launch_options *o, int local, int port, const char *token, int beat_fd,
                           const char *launch_id, rank_env *e) {
    size_t n = 0;
    for (char **p = environ; p && *p; p++) n++;
    e->envp = calloc(n + V_SET_ + 1, sizeof *e->envp);
    RT_CHECK_ALLOC(e->envp, (n + V_SET_ + 1) * sizeof(char *));
    size_t k = 0;
    for (char **p = environ; p && *p; p++)
        if (!is_set_var(*p)) e->envp[k++] = *p;
    int world = o->nnodes * o->nproc;
    snprintf(e->vals[V_RANK], sizeof e->vals[0], "RANK=%d", o->node_rank * o->nproc + local);
    snprintf(e->vals[V_WORLD], sizeof e->vals[0], "WORLD_SIZE=%d", world);
    snprintf(e->vals[V_LOCAL], sizeof e->vals[0], "LOCAL_RANK=%d", local);
    snprintf(e->vals[V_LOCAL_WORLD], sizeof e->vals[0], "LOCAL_WORLD_SIZE=%d", o->nproc);
    snprintf(e->vals[V_GROUP], sizeof e->vals[0], "GROUP_RANK=%d", o->node_rank);
    snprintf(e->vals[V_ADDR], sizeof e->vals[0], "MASTER_ADDR=%s", o->master_addr);
    snprintf(e->vals[V_PORT], sizeof e->vals[0], "MASTER_PORT=%d", port);
    snprintf(e->vals[V_TOKEN], sizeof e->vals[0], "RINGTRAIN_JOB_TOKEN=%s", token);
    snprintf(e->vals[V_BEAT], sizeof e->vals[0], "RINGTRAIN_HEARTBEAT_FD=%d", beat_fd);
    snprintf(e->vals[V_RESTARTS], sizeof e->vals[0], "TORCHELASTIC_RESTART_COUNT=%d", o->restart_count);
    snprintf(e->vals[V_MAX_RESTARTS], sizeof e->vals[0], "TORCHELASTIC_MAX_RESTARTS=%d", o->max_restarts);
    snprintf(e->vals[V_LAUNCH_ID], sizeof e->vals[0], "RINGTRAIN_LAUNCH_ID=%s", launch_id);
    for (int v = 0; v < V_SET_; v++) e->envp[k++] = e->vals[v];
    e->envp[k] = NULL;
    return RT_OK;
}

static rt_status check_options(const rt_launch_options *o) {
    RT_REQUIRE(o != NULL, RT_ERR_INVALID, "launch: NULL options");
    RT_REQUIRE(o->nproc >= 1 && o->nproc <= RT_LAUNCH_MAX_NPROC, RT_ERR_INVALID,
               "launch: nproc %d: expected 1..%d ranks per node", o->nproc, RT_LAUNCH_MAX_NPROC);
    RT_REQUIRE(o->nnodes >= 1 && o->nnodes <= (1 << 20) / o->nproc, RT_ERR_INVALID,
               "launch: nnodes %d: expected 1 or more nodes (at most %d ranks in all)", o->nnodes, 1 << 20);
    RT_REQUIRE(o->node_rank >= 0 && o->node_rank < o->nnodes, RT_ERR_INVALID, "launch: node_rank %d out of range 0..%d",
               o->node_rank, o->nnodes - 1);
    RT_REQUIRE(o->master_addr && *o->master_addr && strlen(o->master_addr) < 256, RT_ERR_INVALID,
               "launch: master_addr: expected a host name or address");
    RT_REQUIRE(o->master_port >= 0 && o->master_port <= 65535, RT_ERR_INVALID, "launch: master_port %d out of range",
               o->master_port);
    RT_REQUIRE(o->master_port > 0 || o->nnodes == 1, RT_ERR_INVALID,
               "launch: %d nodes need a master_port that every node's launcher agrees on", o->nnodes);
    RT_REQUIRE(o->nnodes == 1 || (o->job_token && *o->job_token), RT_ERR_INVALID,
               "launch: %d nodes need a job_token that every node's launcher agrees on", o->nnodes);
    RT_REQUIRE(!o->job_token || strlen(o->job_token) < 256, RT_ERR_INVALID, "launch: job_token longer than 255");
    RT_REQUIRE(o->restart_count >= 0 && o->max_restarts >= 0, RT_ERR_INVALID,
               "launch: restart_count %d, max_restarts %d: expected counts of 0 or more", o->restart_count,
               o->max_restarts);
    RT_REQUIRE(isfinite(o->grace_s) && o->grace_s >= 0 && o->grace_s <= 86400, RT_ERR_INVALID,
               "launch: grace_s %g: expected seconds in 0..86400", o->grace_s);
    RT_REQUIRE(isfinite(o->timeout_s) && o->timeout_s >= 0 && o->timeout_s <= 1e8, RT_ERR_INVALID,
               "launch: timeout_s %g: expected seconds in 0..1e8 (0: no limit)", o->timeout_s);
    RT_REQUIRE(isfinite(o->progress_s) && o->progress_s >= 0 && o->progress_s <= 1e8, RT_ERR_INVALID,
               "launch: progress_s %g: expected seconds in 0..1e8 (0: grace_s after a signal)", o->progress_s);
    return RT_OK;
}

static rt_status free_port(const char *addr, int *port) {
    int fd = -1;
    /* the master address when it is this host's, else any local address */
    if (rt_sock_listen(addr, 0, &fd, port) != RT_OK) {
        rt_error_clear();
        RT_CHECK(rt_sock_listen(NULL, 0, &fd, port));
    }
    close(fd);
    return RT_OK;
}

/* In the child, between fork and exec / rank_fn. Only async-signal-safe calls until
 * rank_fn runs. */
static void child_setup(int err_fd, const struct sigaction *old, const launch *L, int me, char **envp) {
    /* a rank must not outlive its launcher (kill -9 of the launcher would leave it running,
     * holding the port and writing to the run directory) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != L->parent) _exit(1); /* the launcher died before prctl took effect */
    for (int k = 0; k < N_SIGS; k++) sigaction(k_sigs[k], &old[k], NULL);
    /* SIGUSR1 (the flight recorder's dump, forwarded by the launcher) must not end a rank
     * that has not installed its handler yet: ignored until it does (kept across exec) */
    signal(SIGUSR1, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(err_fd, STDERR_FILENO);
    close(err_fd);
    for (int i = 0; i <= L->res->nproc; i++) /* the other ranks' pipes and the self-pipe */
        if (i != me && L->slots[i].fd >= 0) close(L->slots[i].fd);
    if (L->slots[me].fd >= 0) close(L->slots[me].fd);
    if (g_wake >= 0) close(g_wake);
    if (L->beat_rd >= 0) close(L->beat_rd);
    if (L->beat_wr >= 0) fcntl(L->beat_wr, F_SETFD, 0); /* the ranks' heartbeat survives exec */
    environ = envp;
}

/* The child's part of a fork: set up, then run rank_fn or exec the command; never returns. */
static _Noreturn void run_child(int err_fd, const struct sigaction *old, const launch *L, int me, char **envp,
                                char *const argv[], rt_launch_fn fn, void *arg) {
    child_setup(err_fd, old, L, me, envp);
    if (fn) {
        int rc = fn(me, arg);
        fflush(NULL);
        _exit(rc >= 0 && rc <= 255 ? rc : 255);
    }
    execvp(argv[0], argv);
    int er = errno;
    char msg[512];
    int m = snprintf(msg, sizeof msg, "launch: cannot run '%s': %s\n", argv[0], strerror(er));
    if (m > 0) (void)!write(STDERR_FILENO, msg, (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
    _exit(er == ENOENT ? 127 : 126);
}

/* The result before any rank starts: every rank's global rank, no exit code yet. */
static rt_status result_init(const rt_launch_options *o, rt_launch_result *out) {
    int n = o->nproc;
    out->nproc = n;
    out->timeout_s = o->timeout_s;
    out->ranks = calloc((size_t)n, sizeof *out->ranks);
    RT_CHECK_ALLOC(out->ranks, (size_t)n * sizeof *out->ranks);
    for (int i = 0; i < n; i++) {
        out->ranks[i].rank = o->node_rank * n + i;
        out->ranks[i].exit_code = -1;
        out->ranks[i].step = -1;
    }
    return RT_OK;
}

/* The pipes and the ranks' environments (the job's secret tok, the master's port, the
 * launch's id): the heartbeat pipe (L->beat_rd, beat_wr), envs[], the self-pipe wake[].
 * What it made is released by teardown_launch, also after a failure. */
static rt_status setup_launch(launch *L, const char *tok, int port, const char *launch_id, rank_env *envs,
                              int wake[2]) {
    const int n = L->res->nproc;
    for (int i = 0; i <= n; i++) L->slots[i].fd = -1;
    int beat[2] = {-1, -1}; /* the ranks' heartbeat: non-blocking, a rank never waits on it */
    if (pipe2(beat, O_CLOEXEC | O_NONBLOCK) != 0) return rt_error_sys(__FILE__, __LINE__, "pipe2 (heartbeat)");
    L->beat_rd = beat[0];
    L->beat_wr = beat[1];
    for (int i = 0; i < n; i++) RT_CHECK(build_env(L->o, i, port, tok, beat[1], launch_id, &envs[i]));
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return rt_error_sys(__FILE__, __LINE__, "pipe2");
    return RT_OK;
}

/* The launcher's handlers of k_sigs (the previous ones in old[]), writing to the self-pipe */
static void install_handlers(struct sigaction old[N_SIGS]) {
    g_signal = 0;
    g_nsignals = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int k = 0; k < N_SIGS; k++) sigaction(k_sigs[k], &sa, &old[k]);
}

/* Fork local rank i, its stderr a pipe the launcher reads (L->slots[i]). */
static rt_status start_rank(launch *L, int i, char *const argv[], rt_launch_fn fn, void *arg,
                            const struct sigaction *old, char **envp) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return rt_error_sys(__FILE__, __LINE__, "pipe2 (rank stderr)");
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return rt_error_sys(__FILE__, __LINE__, "fork");
    }
    if (pid == 0) {
        close(p[0]);
        run_child(p[1], old, L, i, envp, argv, fn, arg);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    L->slots[i].fd = p[0];
    L->slots[i].running = true;
    L->res->ranks[i].pid = (int)pid;
    L->running++;
    return RT_OK;
}

/* setup_launch's pipes and environments released, and the launch's slots */
static void teardown_launch(launch *L, rank_env *envs, int wake_wr) {
    const int n = L->res->nproc;
    g_wake = -1;
    for (int i = 0; i <= n; i++)
        if (L->slots[i].fd >= 0) close(L->slots[i].fd);
    if (wake_wr >= 0) close(wake_wr);
    if (L->beat_rd >= 0) close(L->beat_rd);
    if (L->beat_wr >= 0) close(L->beat_wr);
    for (int i = 0; i < n; i++) free(envs[i].envp);
    free(envs);
    free(L->slots);
}

/* This launch's id (RINGTRAIN_LAUNCH_ID): the launcher's pid and a random nonce, so that no
 * concurrent launch sharing this /dev/shm (also from another pid namespace) has the same;
 * no '-' in it */
static rt_status make_launch_id(char *out, size_t n) {
    char nonce[17];
    RT_CHECK(rt_random_hex(nonce, 8));
    snprintf(out, n, "%d.%s", (int)getpid(), nonce);
    return RT_OK;
}

/* Unlink the named shm segments of this launch: /dev/shm/ringtrain-<id>-* (the names
 * transport_shm.c gives them under RINGTRAIN_LAUNCH_ID). Their creator unlinks them once
 * its peers mapped them, so after a launch only those of a rank killed during its setup
 * are left. Names with this exact prefix only: another launch's never match. */
static void remove_segments(const char *launch_id) {
    char prefix[64];
    int k = snprintf(prefix, sizeof prefix, "ringtrain-%s-", launch_id);
    DIR *d = opendir("/dev/shm");
    if (!d || k <= 0) {
        if (d) closedir(d);
        return;
    }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, (size_t)k) == 0) {
            char name[NAME_MAX + 2];
            snprintf(name, sizeof name, "/%s", e->d_name);
            removed += shm_unlink(name) == 0;
        }
    closedir(d);
    if (removed) {
        char msg[160];
        int m = snprintf(msg, sizeof msg,
                         "launch: removed %d shared-memory segment%s a rank killed during setup left (/dev/shm/%s*)\n",
                         removed, removed > 1 ? "s" : "", prefix);
        if (m > 0) write_all(STDERR_FILENO, msg, (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
    }
}

/* How the launch ended, as a status: RT_OK only when every rank exited 0 */
static rt_status launch_status(const rt_launch_result *out) {
    char why[RT_LAUNCH_LINE + 128];
    if (out->first_failure >= 0 || out->signal)
        return RT_ERROR(RT_ERR_PEER, "%s", rt_launch_describe(out, why, sizeof why));
    if (out->timed_out) return RT_ERROR(RT_ERR_TIMEOUT, "%s", rt_launch_describe(out, why, sizeof why));
    for (int i = 0; i < out->nproc; i++)
        if (rt_launch_rank_code(&out->ranks[i]) != 0)
            return RT_ERROR(RT_ERR_PEER, "%s", rt_launch_describe(out, why, sizeof why));
    return RT_OK;
}

static rt_status launch_run(const rt_launch_options *o, char *const argv[], rt_launch_fn fn, void *arg,
                            rt_launch_result *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "launch: NULL result");
    memset(out, 0, sizeof *out);
    out->first_failure = -1;
    RT_CHECK(check_options(o));
    RT_REQUIRE(fn || (argv && argv[0] && argv[0][0]), RT_ERR_INVALID, "launch: no command to run");
    RT_REQUIRE(g_wake < 0, RT_ERR_INVALID, "launch: another launch is running in this process");
    RT_CHECK(result_init(o, out));
    char token[2 * RT_SECRET_BYTES + 1] = "";
    const char *tok = o->job_token;
    if (!tok || !*tok) { /* a fresh secret per launch */
        RT_CHECK(rt_random_hex(token, RT_SECRET_BYTES));
        tok = token;
    }
    int port = o->master_port;
    if (port == 0) RT_CHECK(free_port(o->master_addr, &port));
    out->master_port = port;
    char launch_id[48];
    RT_CHECK(make_launch_id(launch_id, sizeof launch_id));

    const int n = o->nproc;
    launch L = {.o = o, .res = out, .beat_rd = -1, .beat_wr = -1, .parent = getpid()};
    rank_env *envs = calloc((size_t)n, sizeof *envs);
    L.slots = calloc((size_t)n + 1, sizeof *L.slots); /* + the self-pipe */
    if (!envs || !L.slots) {
        free(envs);
        free(L.slots);
        RT_CHECK_ALLOC(NULL, (size_t)n * (sizeof *envs + sizeof *L.slots));
    }
    int wake[2] = {-1, -1};
    struct sigaction old[N_SIGS];
    rt_status st = setup_launch(&L, tok, port, launch_id, envs, wake);
    const bool handlers = st == RT_OK;
    if (handlers) {
        L.slots[n].fd = wake[0];
        g_wake = wake[1];
        install_handlers(old);
        fflush(NULL); /* nothing buffered may be written twice */
    }
    for (int i = 0; i < n && st == RT_OK; i++) st = start_rank(&L, i, argv, fn, arg, old, envs[i].envp);
    if (st != RT_OK && L.running > 0) { /* some ranks started: stop them before returning */
        rt_error_record rec;
        rt_error_save(&rec);
        begin_stop(&L, SIGTERM, true, false);
        supervise(&L);
        rt_error_restore(&rec);
    } else if (st == RT_OK) {
        supervise(&L);
    }
    if (handlers)
        for (int k = 0; k < N_SIGS; k++) sigaction(k_sigs[k], &old[k], NULL);
    teardown_launch(&L, envs, wake[1]);
    remove_segments(launch_id); /* every rank has ended: after a failure, a restart, or the last attempt */
    return st != RT_OK ? st : launch_status(out);
}

rt_status rt_launch_exec(const rt_launch_options *o, char *const argv[], rt_launch_result *out) {
    RT_REQUIRE(argv && argv[0] && argv[0][0], RT_ERR_INVALID, "launch: no command to run");
    return launch_run(o, argv, NULL, NULL, out);
}

rt_status rt_launch_fork(const rt_launch_options *o, rt_launch_fn rank_fn, void *arg, rt_launch_result *out) {
    RT_REQUIRE(rank_fn != NULL, RT_ERR_INVALID, "launch: NULL rank function");
    return launch_run(o, NULL, rank_fn, arg, out);
}

/* ---- the rank's side of the heartbeat ---- */

static void beat(bool now);

static int64_t g_step = -1; /* the step this rank reported (rt_launch_progress) */

void rt_launch_progress(int64_t step) {
    bool changed = step != g_step;
    g_step = step;
    beat(changed);
}

void rt_launch_heartbeat(void) { beat(false); }

/* The rank's side: a record on the pipe, at most 20 a second unless `now` (a new step:
 * the launcher must know the newest one when the rank dies right after it). */
static void beat(bool now) {
    static int fd = -2; /* -2: not looked up yet, -1: none */
    static int32_t rank = -1;
    static uint64_t last;
    if (fd == -2) {
        fd = -1;
        int64_t k = -1; /* unset or not a descriptor number: no heartbeat (it must never fail the rank) */
        if (rt_setting_int(RT_SET_HEARTBEAT_FD, &k) != RT_OK) rt_error_clear();
        struct stat sb;
        int fl = k >= 0 ? fcntl((int)k, F_GETFL) : -1;
        /* only the pipe the launcher made (write end, non-blocking): an inherited stale
         * number must not send bytes into an unrelated file */
        if (fl >= 0 && (fl & O_ACCMODE) == O_WRONLY && (fl & O_NONBLOCK) && fstat((int)k, &sb) == 0 &&
            S_ISFIFO(sb.st_mode))
            fd = (int)k;
        int64_t r = -1;
        if (rt_setting_int(RT_SET_RANK, &r) != RT_OK) rt_error_clear();
        rank = r >= 0 && r <= INT32_MAX ? (int32_t)r : -1;
    }
    if (fd < 0) return;
    uint64_t t = rt_now_ns();
    if (!now && last && t - last < 50000000ull) return; /* at most 20 a second */
    last = t;
    int saved = errno;
    beat_record b = {.rank = rank, .magic = BEAT_MAGIC, .step = g_step};
    (void)!write(fd, &b, sizeof b); /* a full pipe (EAGAIN): the launcher knows already */
    errno = saved;
}
