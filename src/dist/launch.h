/* The local launcher: start N ranks on this host the way torchrun does, watch them, and
 * stop them all when one fails.
 *
 * Each rank gets the environment torchrun gives: RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK (the node rank), MASTER_ADDR, MASTER_PORT, plus
 * RINGTRAIN_JOB_TOKEN, the job secret (32 random hex digits from getrandom per launch:
 * the store and the ranks admit only processes that prove they know it, without it
 * ever being sent; docs/security.md), and torchrun's TORCHELASTIC_RESTART_COUNT and
 * TORCHELASTIC_MAX_RESTARTS (restart_count, max_restarts: a caller that restarts a failed
 * job, as `ringtrain train --max-restarts` does, says which attempt this launch is).
 * With nnodes > 1 the launcher of node k starts global ranks k*nproc .. k*nproc+nproc-1
 * of WORLD_SIZE nnodes*nproc (every node's launcher needs the same master address and
 * port, and the same job token). Two forms share one supervision core:
 *   rt_launch_exec  runs a command (argv) per rank (what `ringtrain train --nproc N` uses);
 *   rt_launch_fork  runs rank_fn(local_rank, arg) in a forked child per rank, whose
 *                   return value is the rank's exit code (benchmarks, test harnesses).
 * A rank sees its own variables through getenv, so rt_dist_env_read and
 * rt_pg_init("env://") work unchanged in both forms.
 *
 * Supervision. Each rank's stderr goes through a pipe: every line is forwarded to the
 * launcher's stderr as it arrives (prefixed "[rank R] " with tag_lines), and the last
 * non-empty line of each rank is kept (indented lines continue the line before, as the
 * trace under an error message does: the line they continue is kept). stdout is inherited.
 * SIGINT and SIGTERM sent to the launcher are forwarded to the ranks (its own handlers
 * are restored before returning); a second one kills the ranks still running at once.
 * Between the two the ranks get as long as they make progress: each rank is given
 * RINGTRAIN_HEARTBEAT_FD, the write end of a non-blocking pipe shared by the ranks, and
 * rt_launch_heartbeat writes a record to it (the rank and the newest step it completed:
 * the trainer beats after every step, evaluation batch and checkpoint phase); the
 * launcher SIGKILLs the ranks still running only when no rank beat for progress_s
 * (progress_s 0: after grace_s, as below). A rank that exits with 130 or 143 (128 +
 * SIGINT/SIGTERM: it stopped cleanly on a signal sent to it alone, and its peers agreed
 * to stop with it) starts the same patient wait, sending the others nothing. When a rank
 * fails (any other non-zero exit, or a signal), the others get SIGTERM, then SIGKILL
 * after grace_s (also in the middle of a patient stop: the peers of a failed rank cannot
 * make progress); the result names the FIRST failure (a rank killed by a signal the
 * launcher did not send goes before one that exited with an error: its peers' lost-peer
 * errors follow from its death, and may reach the launcher first). With timeout_s > 0
 * every rank still running then is stopped the same way and listed.
 *
 * Returns RT_OK when every rank exited 0. Otherwise the result is still filled, and the
 * status is RT_ERR_PEER (a rank failed, or the launcher was interrupted: signal set) or
 * RT_ERR_TIMEOUT, with the message of rt_launch_describe. RT_ERR_INVALID / RT_ERR_SYS /
 * RT_ERR_NOMEM when the ranks could not be started (those started are stopped). The
 * launcher allocates the result's rank table; free it with rt_launch_result_free. It
 * never exits and prints nothing but the forwarded lines.
 */
#ifndef RT_DIST_LAUNCH_H
#define RT_DIST_LAUNCH_H

#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_LAUNCH_MAX_NPROC 1024
#define RT_LAUNCH_LINE 1024

typedef struct rt_launch_options {
    int nproc;               /* ranks on this node, 1..RT_LAUNCH_MAX_NPROC */
    int nnodes, node_rank;   /* default 1 node, node 0 */
    const char *master_addr; /* default "127.0.0.1" */
    int master_port;         /* 0 (default): a free port of this host, chosen per launch */
    const char *job_token;   /* the job secret; NULL (default): random hex per launch */
    double grace_s;          /* SIGTERM -> SIGKILL after a failure; default 5 */
    double progress_s;       /* after SIGINT/SIGTERM, SIGKILL once no heartbeat came this long; 0 (default): grace_s */
    double timeout_s;        /* stop everything after this long; 0 (default): no limit */
    bool tag_lines;          /* prefix forwarded stderr lines with "[rank R] "; default off */
    bool keep_going;         /* do not stop the others when a rank fails (test harnesses) */
    int restart_count;       /* this launch is the job's attempt restart_count (0: the first) ... */
    int max_restarts;        /* ... of at most 1 + max_restarts: exported as torchrun does */
} rt_launch_options;

void rt_launch_options_default(rt_launch_options *o);

typedef struct rt_launch_rank {
    int rank;       /* global rank */
    int pid;        /* 0: never started */
    int exit_code;  /* when it exited normally, else -1 */
    int signal;     /* the signal that ended it, else 0 */
    bool stopped;   /* the launcher sent it SIGTERM/SIGKILL (another rank failed, time limit, interrupt) */
    bool timed_out; /* still running when the time limit passed */
    int64_t step;   /* the newest step it reported (rt_launch_progress), -1: none */
    char last_line[RT_LAUNCH_LINE]; /* last non-empty, non-indented stderr line ("" if none) */
} rt_launch_rank;

typedef struct rt_launch_result {
    int nproc;
    rt_launch_rank *ranks; /* [nproc], allocated by the launcher */
    int first_failure;     /* local index of the first rank that failed, -1 if none */
    bool timed_out;        /* the time limit passed */
    int signal;            /* SIGINT/SIGTERM the launcher received and forwarded, 0 if none */
    int master_port;       /* the port the ranks were given */
    double timeout_s;      /* the time limit it ran under (0: none) */
    /* the first "diagnosis: ..." any rank printed (a hang or desync explained: docs/dist.md,
     * "Hangs and desyncs"), the text after the marker; "" if none */
    char diagnosis[RT_LAUNCH_LINE];
} rt_launch_result;

/* The code a process exits with for this rank: its exit code, or 128 + signal. */
int rt_launch_rank_code(const rt_launch_rank *r);

/* One line, e.g. "rank 1 exited with code 3: <last line>", "rank 0 was killed by
 * SIGKILL: <last line>", "interrupted by SIGINT (forwarded to the ranks)", "time limit
 * of 5 s: ranks 0, 2 were still running", or "all 4 ranks exited with code 0". */
const char *rt_launch_describe(const rt_launch_result *r, char *buf, size_t n);

/* Run argv (argv[0] searched in PATH as execvp does) as every rank. */
rt_status rt_launch_exec(const rt_launch_options *o, char *const argv[], rt_launch_result *out);

/* Run rank_fn(local_rank, arg) in a forked child per rank; its return value is the
 * rank's exit code. The child starts from a fork of the caller: call it before starting
 * threads or initialising CUDA. */
typedef int (*rt_launch_fn)(int local_rank, void *arg);
rt_status rt_launch_fork(const rt_launch_options *o, rt_launch_fn rank_fn, void *arg, rt_launch_result *out);

/* Frees out->ranks (NULL-safe); the struct may be reused. */
void rt_launch_result_free(rt_launch_result *r);

/* In a rank: tell the launcher that this rank is making progress (a 16-byte record on
 * the pipe of RINGTRAIN_HEARTBEAT_FD: its RANK and newest step; non-blocking, at most 20
 * a second). A no-op when the variable is not set or does not name the write end of a
 * non-blocking pipe (another launcher). Call it from one thread. */
void rt_launch_heartbeat(void);

/* The same, saying that this rank completed `step` (the trainer calls it after every
 * step): written at once when the step changed, so the launcher knows the newest step of
 * a rank that dies right after it (rt_launch_rank.step; --max-restarts compares it). */
void rt_launch_progress(int64_t step);

/* "SIGKILL" for SIGKILL, "signal 77" for an unknown one (buf holds at least 16 bytes). */
const char *rt_signal_name(int sig, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
