/* Learning-rate schedules as pure functions of the iteration (see schedule.h). The
 * expressions are written in the same order as PyTorch 1.13's Python code so the
 * double-precision results agree with it to the last bit or nearly. */
#include "optim/schedule.h"

#include "core/names.h"

#include <math.h>
#include <string.h>

static const char *const sched_names[RT_SCHED_KIND_COUNT_] = {
    [RT_SCHED_CONSTANT] = "constant", [RT_SCHED_STEP] = "step",         [RT_SCHED_MULTISTEP] = "multistep",
    [RT_SCHED_COSINE] = "cosine",     [RT_SCHED_ONECYCLE] = "onecycle",
};
const rt_names rt_sched_kind_names = {"schedule", RT_SCHED_KIND_COUNT_, sched_names, NULL, NULL};

/* indexed by the bool they set: per_epoch, anneal_linear */
static const char *const interval_names[2] = {"iteration", "epoch"};
const rt_names rt_sched_interval_names = {"schedule interval", 2, interval_names, NULL, NULL};
static const char *const anneal_names[2] = {"cos", "linear"};
const rt_names rt_sched_anneal_names = {"anneal strategy", 2, anneal_names, NULL, NULL};

rt_status rt_sched_kind_parse(const char *text, rt_sched_kind *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_sched_kind_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_sched_kind)k;
    return st;
}

const char *rt_sched_kind_name(rt_sched_kind kind) {
    const char *name = rt_names_name(&rt_sched_kind_names, (int)kind);
    return name ? name : "?";
}

void rt_schedule_default(rt_schedule *s, rt_sched_kind kind, double base_lr) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->base_lr = base_lr;
    s->steps_per_epoch = 1;
    s->gamma = 0.1;
    s->warmup_start_factor = 1.0 / 3;
    s->pct_start = 0.3;
    s->div_factor = 25.0;
    s->final_div_factor = 1e4;
    s->cycle_momentum = true;
    s->base_momentum = 0.85;
    s->max_momentum = 0.95;
}

rt_status rt_schedule_validate(const rt_schedule *s) {
    RT_REQUIRE(s != NULL, RT_ERR_INVALID, "optim.schedule: NULL");
    char names[128];
    RT_REQUIRE(s->kind >= 0 && s->kind < RT_SCHED_KIND_COUNT_, RT_ERR_INVALID,
               "optim.schedule: unknown kind %d (expected %s)", (int)s->kind,
               rt_names_list(&rt_sched_kind_names, names, sizeof names));
    RT_REQUIRE(isfinite(s->base_lr) && s->base_lr >= 0, RT_ERR_INVALID, "optim.lr: %g (expected a finite value >= 0)",
               s->base_lr);
    RT_REQUIRE(!s->per_epoch || s->steps_per_epoch > 0, RT_ERR_INVALID,
               "optim.steps_per_epoch: %lld (expected > 0 when the schedule steps per epoch)",
               (long long)s->steps_per_epoch);
    RT_REQUIRE(s->warmup_steps >= 0, RT_ERR_INVALID, "optim.warmup_steps: %lld (expected >= 0)",
               (long long)s->warmup_steps);
    if (s->warmup_steps > 0) {
        RT_REQUIRE(s->warmup_start_factor > 0 && s->warmup_start_factor <= 1, RT_ERR_INVALID,
                   "optim.warmup_start_factor: %g (expected 0 < factor <= 1)", s->warmup_start_factor);
        RT_REQUIRE(s->kind != RT_SCHED_ONECYCLE, RT_ERR_INVALID,
                   "optim.warmup_steps: one-cycle has its own warmup (pct_start); set warmup_steps to 0");
    }
    switch (s->kind) {
    case RT_SCHED_CONSTANT:
        break;
    case RT_SCHED_STEP:
        RT_REQUIRE(s->step_size > 0, RT_ERR_INVALID, "optim.step_size: %lld (expected > 0)", (long long)s->step_size);
        /* fallthrough */
    case RT_SCHED_MULTISTEP:
        RT_REQUIRE(isfinite(s->gamma) && s->gamma >= 0, RT_ERR_INVALID, "optim.gamma: %g (expected >= 0)", s->gamma);
        RT_REQUIRE(s->n_milestones >= 0 && s->n_milestones <= RT_SCHED_MAX_MILESTONES, RT_ERR_INVALID,
                   "optim.milestones: %d of them (at most %d)", s->n_milestones, RT_SCHED_MAX_MILESTONES);
        for (int i = 0; i < s->n_milestones; i++) {
            RT_REQUIRE(s->milestones[i] >= 0, RT_ERR_INVALID, "optim.milestones[%d]: %lld (expected >= 0)", i,
                       (long long)s->milestones[i]);
            RT_REQUIRE(i == 0 || s->milestones[i] >= s->milestones[i - 1], RT_ERR_INVALID,
                       "optim.milestones[%d]: %lld after %lld (expected increasing)", i, (long long)s->milestones[i],
                       (long long)s->milestones[i - 1]);
        }
        break;
    case RT_SCHED_COSINE:
        RT_REQUIRE(s->t_max > 0, RT_ERR_INVALID, "optim.t_max: %lld (expected > 0)", (long long)s->t_max);
        RT_REQUIRE(isfinite(s->eta_min) && s->eta_min >= 0, RT_ERR_INVALID, "optim.eta_min: %g (expected >= 0)",
                   s->eta_min);
        break;
    case RT_SCHED_ONECYCLE:
        RT_REQUIRE(s->total_steps > 0, RT_ERR_INVALID, "optim.total_steps: %lld (expected > 0)",
                   (long long)s->total_steps);
        RT_REQUIRE(s->pct_start >= 0 && s->pct_start <= 1, RT_ERR_INVALID,
                   "optim.pct_start: %g (expected between 0 and 1)", s->pct_start);
        RT_REQUIRE(isfinite(s->max_lr) && s->max_lr >= 0, RT_ERR_INVALID, "optim.max_lr: %g (expected >= 0)",
                   s->max_lr);
        RT_REQUIRE(s->div_factor > 0 && s->final_div_factor > 0, RT_ERR_INVALID,
                   "optim.div_factor/final_div_factor: %g/%g (expected > 0)", s->div_factor, s->final_div_factor);
        /* phase boundaries must be distinct or torch divides by zero */
        {
            double e1 = s->pct_start * (double)s->total_steps - 1;
            double e2 = s->three_phase ? 2 * s->pct_start * (double)s->total_steps - 2 : (double)s->total_steps - 1;
            double e3 = (double)s->total_steps - 1;
            RT_REQUIRE(e1 > 0 && e2 > e1 && (!s->three_phase || e3 > e2), RT_ERR_INVALID,
                       "optim.pct_start: %g with total_steps %lld leaves an empty phase", s->pct_start,
                       (long long)s->total_steps);
        }
        break;
    default:
        break;
    }
    return RT_OK;
}

static double anneal(const rt_schedule *s, double start, double end, double pct) {
    if (s->anneal_linear) return (end - start) * pct + start;
    double cos_out = cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
}

/* OneCycleLR.get_lr for step_num; also the momentum when asked. */
static double onecycle(const rt_schedule *s, int64_t step, double *momentum) {
    double max_lr = s->max_lr > 0 ? s->max_lr : s->base_lr;
    double initial = max_lr / s->div_factor;
    double min_lr = initial / s->final_div_factor;
    double total = (double)s->total_steps;
    struct {
        double end, lr0, lr1, m0, m1;
    } ph[3];
    int n;
    if (s->three_phase) {
        ph[0].end = s->pct_start * total - 1, ph[0].lr0 = initial, ph[0].lr1 = max_lr;
        ph[0].m0 = s->max_momentum, ph[0].m1 = s->base_momentum;
        ph[1].end = 2 * s->pct_start * total - 2, ph[1].lr0 = max_lr, ph[1].lr1 = initial;
        ph[1].m0 = s->base_momentum, ph[1].m1 = s->max_momentum;
        ph[2].end = total - 1, ph[2].lr0 = initial, ph[2].lr1 = min_lr;
        ph[2].m0 = s->max_momentum, ph[2].m1 = s->max_momentum;
        n = 3;
    } else {
        ph[0].end = s->pct_start * total - 1, ph[0].lr0 = initial, ph[0].lr1 = max_lr;
        ph[0].m0 = s->max_momentum, ph[0].m1 = s->base_momentum;
        ph[1].end = total - 1, ph[1].lr0 = max_lr, ph[1].lr1 = min_lr;
        ph[1].m0 = s->base_momentum, ph[1].m1 = s->max_momentum;
        n = 2;
    }
    double x = (double)step, start = 0;
    for (int i = 0; i < n; i++) {
        if (x <= ph[i].end || i == n - 1) {
            double pct = (x - start) / (ph[i].end - start);
            if (momentum) *momentum = anneal(s, ph[i].m0, ph[i].m1, pct);
            return anneal(s, ph[i].lr0, ph[i].lr1, pct);
        }
        start = ph[i].end;
    }
    return min_lr; /* not reached */
}

static int64_t schedule_pos(const rt_schedule *s, int64_t iter) {
    if (iter < 0) iter = 0;
    return s->per_epoch ? iter / s->steps_per_epoch : iter;
}

double rt_schedule_lr(const rt_schedule *s, int64_t iter) {
    int64_t pos = schedule_pos(s, iter);
    double base = s->base_lr;
    if (s->kind == RT_SCHED_ONECYCLE) return onecycle(s, pos < s->total_steps ? pos : s->total_steps, NULL);
    if (s->warmup_steps > 0) {
        if (pos < s->warmup_steps) {
            /* LinearLR closed form: base * (start + (end - start) * min(W, e) / W), end = 1 */
            double sf = s->warmup_start_factor;
            return base * (sf + (1.0 - sf) * (double)pos / (double)s->warmup_steps);
        }
        pos -= s->warmup_steps; /* SequentialLR: the main schedule restarts at 0 */
    }
    switch (s->kind) {
    case RT_SCHED_STEP:
        return base * pow(s->gamma, (double)(pos / s->step_size));
    case RT_SCHED_MULTISTEP: {
        int k = 0;
        while (k < s->n_milestones && s->milestones[k] <= pos) k++; /* bisect_right */
        return base * pow(s->gamma, (double)k);
    }
    case RT_SCHED_COSINE:
        return s->eta_min + (base - s->eta_min) * (1 + cos(M_PI * (double)pos / (double)s->t_max)) / 2;
    default:
        return base;
    }
}

bool rt_schedule_momentum(const rt_schedule *s, int64_t iter, double *momentum) {
    if (s->kind != RT_SCHED_ONECYCLE || !s->cycle_momentum) return false;
    int64_t pos = schedule_pos(s, iter);
    onecycle(s, pos < s->total_steps ? pos : s->total_steps, momentum);
    return true;
}
