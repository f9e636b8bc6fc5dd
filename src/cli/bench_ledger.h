/* `ringtrain bench model --device cuda`: what the emulated GPUs' cost ledger says of a
 * training step (core/cost_ledger.h, docs/gpu.md "The cost ledger"), for bench_model.c.
 * On a real GPU, or any build without the emulated runtime, there is no ledger and the
 * rows print null. Private to src/cli. */
#ifndef RT_CLI_BENCH_LEDGER_H
#define RT_CLI_BENCH_LEDGER_H

#include "core/cost_ledger.h"
#include "model/profile.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct rt_bench_ledger {
    const rt_cost_ledger_api *api; /* NULL: no ledger in this process */
    bool modelled;                 /* a calibration was loaded: modelled times are meaningful */
    char calibration[512];         /* its path, or why there is none */
    /* the last measured step */
    bool measured, steady; /* steady: one step's totals equal the difference of two runs */
    rt_cost_ledger step;   /* per step */
    rt_cost_op *ops;       /* one step's operations */
    size_t nops;
} rt_bench_ledger;

/* Find the ledger (GPU runs only: gpu false leaves it off), switch it on and load the
 * calibration: $RINGTRAIN_COST_CALIBRATION, or else the newest
 * bench/results/gpu-cost-calibration-*.json of the source tree (by the date in its name;
 * none: modelled times are null). 0 ok, else the exit code (a calibration named by the
 * variable that cannot be read: the error printed). */
int rt_bench_ledger_setup(rt_bench_ledger *l, bool gpu);
void rt_bench_ledger_free(rt_bench_ledger *l);

/* One steady-state step's ledger: step(arg) run once after a reset, then twice after
 * another, the difference of the two kept (l->step), and whether it equals the single
 * step's (l->steady); the single step's operations kept. No synchronisation: the ledger
 * records what the host enqueues. No-op without a ledger. */
rt_status rt_bench_ledger_measure(rt_bench_ledger *l, rt_status (*step)(void *arg), void *arg);

/* The row's ledger members (", \"modelled_step_ms\": ..."; null without a ledger);
 * with_ops: also "ledger_ops", the step's operations grouped. Text: one line. */
void rt_bench_ledger_json(const rt_bench_ledger *l, bool with_ops);
void rt_bench_ledger_text(const rt_bench_ledger *l);

/* Forget what was recorded (before a profiled run whose rows index the operations). */
void rt_bench_ledger_reset(rt_bench_ledger *l);

/* The ledger members of one --layers JSON row: the rows of p with this kind, shape and
 * pass, summed per step over `steps` steps (nothing where the rows have no ledger);
 * with_ops: their operations grouped (each row's first call, weighted by its calls). */
void rt_bench_ledger_layer_json(const rt_bench_ledger *l, const rt_layer_profile *p, const char *kind,
                                const char *shape, rt_prof_pass pass, int steps, bool with_ops);

#endif
