/* Clean stops (docs/train.md, "Stopping and resuming"): the signal handlers, the ranks'
 * agreement on a stop, and the flight recorder's dump on SIGUSR1.
 *
 * A handler only sets a flag; what a flag means is decided where every rank passes in the
 * same order (after a step, an evaluation, a checkpoint), so the ranks stop together. The
 * flags are process-wide, as signals are: one run at a time per process. */
#include "train/internal/run.h"

#include "core/file.h"
#include "core/log.h"

#include <signal.h>
#include <string.h>

/* SIGINT or SIGTERM (to the launcher, which forwards it, or to any rank): finish what is
 * under way (a step, an evaluation, a checkpoint), write a checkpoint, exit. The ranks
 * agree at fixed points that every rank passes in the same order: after every step (the
 * flag travels with the loss's all-reduce), after an evaluation and after every
 * checkpoint, so they all stop at the same point. Meanwhile each rank tells its launcher
 * it is making progress (rt_launch_heartbeat), so a long evaluation or checkpoint write is
 * not killed. */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

/* SIGUSR1: write the flight recorder (docs/dist.md, "Flight recorder") to
 * RUN_DIR/flight-rank<r>.json and go on. The handler only sets the flag; the flag rides
 * on the step's agreement (step_scalars), so every rank dumps after the same step, and an
 * evaluation batch dumps this rank's alone. */
static volatile sig_atomic_t g_flight_signal;

static void on_flight_signal(int sig) {
    (void)sig;
    g_flight_signal = 1;
}

int rt_run_stop_signal(void) { return (int)g_stop_signal; }
bool rt_run_flight_signal(void) { return g_flight_signal != 0; }
void rt_run_flight_clear(void) { g_flight_signal = 0; }

static struct sigaction g_old_int, g_old_term, g_old_usr1;

/* The handlers of a run, the flags cleared; the previous handlers are kept for
 * rt_run_signals_restore_stop and _flight. SA_RESTART: a stop request arrives in the middle of any work,
 * which restarts rather than fails. */
void rt_run_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    g_flight_signal = 0;
    sa.sa_handler = on_flight_signal;
    sigaction(SIGUSR1, &sa, &g_old_usr1);
}

/* SIGINT and SIGTERM back to what they were before rt_run_signals_install. */
void rt_run_signals_restore_stop(void) {
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
}

/* SIGUSR1 back (kept until a failed run's own flight dump is written). */
void rt_run_signals_restore_flight(void) { sigaction(SIGUSR1, &g_old_usr1, NULL); }

/* Best effort: a failure is logged and cleared (the caller's error, if any, is its own). */
void rt_run_flight_dump(run *r, const char *why) {
    if (!r->pg) return;
    char path[RT_CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/flight-rank%d.json", r->run_dir, r->who.rank);
    rt_status s = rt_file_mkdirs(r->run_dir, "run directory");
    if (s == RT_OK) s = rt_pg_flight_dump(r->pg, path);
    if (s == RT_OK)
        RT_LOG_INFO("flight recorder (%s) written to %s", why, path);
    else
        RT_LOG_WARN("flight recorder (%s): %s", why, rt_error_message());
    rt_error_clear();
}

/* Whether any rank was asked to stop, and by which signal (the largest: SIGTERM over
 * SIGINT), the same answer on every rank; with `signals` off (after the run's last
 * evaluation, where a signal changes nothing) only the watches' part. Rank 0's watches
 * (monitor.c) ride along: after an evaluation its early stop (the run then stops here,
 * with a checkpoint) and its best checkpoint (the checkpoint of this step is written and
 * kept in best/), so every rank takes rank 0's decision at the same point. */
static rt_status agree(run *r, bool signals) {
    double v[3] = {signals ? (double)g_stop_signal : 0.0, is_root(r) && r->mon.stop_wanted ? 1.0 : 0.0,
                   is_root(r) && r->mon.write_best ? 1.0 : 0.0};
    RT_CHECK(rt_run_all_reduce_f64(r, v, 3, RT_OP_MAX));
    r->mon.stop_wanted = false;
    r->mon.write_best = v[2] > 0;
    if (signals) {
        r->stop.requested = v[0] > 0 || v[1] > 0;
        r->stop.signal = (int)v[0];
        r->mon.early_stopped = v[1] > 0;
    }
    return RT_OK;
}

rt_status rt_run_agree_stop(run *r) { return agree(r, true); }
rt_status rt_run_agree_watches(run *r) { return agree(r, false); }
