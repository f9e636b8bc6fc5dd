/* Learning-rate schedules: constant, step, multistep, cosine annealing, one-cycle, each
 * optionally behind a linear warmup; stepped per iteration or per epoch.
 *
 * A schedule is a pure function of the iteration counter, rt_schedule_lr(s, iter), so
 * resuming from a checkpoint needs nothing but the step count, and every rank computes
 * the same value. The values are PyTorch 1.13's closed forms (_get_closed_form_lr) of
 * StepLR, MultiStepLR, CosineAnnealingLR, LinearLR and OneCycleLR's get_lr, which the
 * chained (recursive) forms torch applies step by step agree with to rounding; a warmup
 * is SequentialLR([LinearLR(start_factor, 1.0, total_iters=W), main], milestones=[W]).
 * The exact formulas are in docs/optim.md.
 */
#ifndef RT_OPTIM_SCHEDULE_H
#define RT_OPTIM_SCHEDULE_H

#include "core/names.h"
#include "core/status.h"
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_sched_kind {
    RT_SCHED_CONSTANT = 0,
    RT_SCHED_STEP,
    RT_SCHED_MULTISTEP,
    RT_SCHED_COSINE,
    RT_SCHED_ONECYCLE,
    RT_SCHED_KIND_COUNT_
} rt_sched_kind;

/* The names of the schedules ("constant" | "step" | "multistep" | "cosine" | "onecycle"),
 * of the units (optim.interval: "iteration" | "epoch", index 1 is per_epoch) and of the
 * one-cycle annealing ("cos" | "linear", index 1 is anneal_linear): core/names.h. */
extern const rt_names rt_sched_kind_names, rt_sched_interval_names, rt_sched_anneal_names;

/* rt_names_parse of rt_sched_kind_names. */
rt_status rt_sched_kind_parse(const char *text, rt_sched_kind *out);
const char *rt_sched_kind_name(rt_sched_kind kind);

#define RT_SCHED_MAX_MILESTONES 64

typedef struct rt_schedule {
    rt_sched_kind kind;
    double base_lr; /* optim.lr */
    /* the unit the schedule counts in: iterations, or epochs of steps_per_epoch
     * iterations (position = iter / steps_per_epoch) */
    bool per_epoch;
    int64_t steps_per_epoch;
    /* step: lr = base * gamma^(pos / step_size); multistep: gamma^(milestones <= pos) */
    int64_t step_size;
    double gamma;
    int64_t milestones[RT_SCHED_MAX_MILESTONES];
    int n_milestones;
    /* cosine: eta_min + (base - eta_min) * (1 + cos(pi * pos / t_max)) / 2 */
    int64_t t_max;
    double eta_min;
    /* linear warmup over the first warmup_steps positions, from base*warmup_start_factor
     * (not with onecycle, which has its own) */
    int64_t warmup_steps;
    double warmup_start_factor;
    /* onecycle (OneCycleLR): max_lr (0: base_lr), total_steps, pct_start, anneal cos or
     * linear, div_factor, final_div_factor, three_phase, momentum cycling */
    double max_lr;
    int64_t total_steps;
    double pct_start;
    bool anneal_linear;
    double div_factor, final_div_factor;
    bool three_phase;
    bool cycle_momentum;
    double base_momentum, max_momentum;
} rt_schedule;

/* Defaults: constant, gamma 0.1, warmup_start_factor 1/3 (LinearLR's), eta_min 0,
 * onecycle pct_start 0.3, cos, div_factor 25, final_div_factor 1e4, two phases,
 * cycle_momentum on with base/max momentum 0.85/0.95. */
void rt_schedule_default(rt_schedule *s, rt_sched_kind kind, double base_lr);

/* Check the fields the kind uses; the error names the field and what was expected. */
rt_status rt_schedule_validate(const rt_schedule *s);

/* The learning rate for iteration `iter` (0-based: the lr the iter-th optimizer step
 * uses). Past a one-cycle's total_steps the value at total_steps is held (PyTorch
 * raises). */
double rt_schedule_lr(const rt_schedule *s, int64_t iter);

/* One-cycle with cycle_momentum: *momentum = the momentum (SGD) or beta1 (Adam) for
 * iteration `iter` and true; otherwise false and *momentum untouched. */
bool rt_schedule_momentum(const rt_schedule *s, int64_t iter, double *momentum);

#ifdef __cplusplus
}
#endif

#endif
