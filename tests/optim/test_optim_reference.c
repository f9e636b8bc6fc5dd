/* Reference test: the optimizers, gradient clipping and the schedules against PyTorch.
 *
 * The test draws initial parameters and 50 steps of gradients (core Philox RNG) for
 * tensors of shapes [3,4,5,5], [10], [7,3], [1], writes them to a temp dir, runs
 * tests/optim/torch_optim_ref.py with Debian's /usr/bin/python3 once for all cases,
 * then runs the same cases here over a padded flat arena and compares the parameters
 * after every step (1e-6 relative) — once straight through and once with the state
 * saved, the optimizer destroyed and a new one loaded at step 25. The schedules are
 * compared with torch.optim.lr_scheduler iteration by iteration. Exits 77 when
 * /usr/bin/python3 has no torch.
 */
#include "test_util.h"

#include "core/rng.h"
#include "core/tensor.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_TENSORS 4
#define STEPS 50
#define RESUME_AT 25
static const int64_t shapes[N_TENSORS][4] = {{3, 4, 5, 5}, {10, 0, 0, 0}, {7, 3, 0, 0}, {1, 0, 0, 0}};
static const int ndims[N_TENSORS] = {4, 1, 2, 1};
static const int no_decay_tensors[] = {1, 3}; /* "biases" and "batch-norm" parameters */

typedef struct ocase {
    const char *name;
    rt_optim_kind kind;
    double lr, momentum, dampening;
    bool nesterov;
    double wd, b1, b2, eps;
    bool amsgrad, no_decay;
    double clip;
    int sched;        /* 0 none, 1 cosine with warmup, 2 step */
    double rho;       /* Adadelta */
    double ema_decay; /* the parameters' moving average (0: off) against AveragedModel */
    int ema_every;
    bool ema_warmup; /* decay min(ema_decay, (1 + n) / (10 + n)) */
} ocase;

static const ocase ocases[] = {
    {"sgd", RT_OPTIM_SGD, 0.1, 0, 0, false, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_wd", RT_OPTIM_SGD, 0.1, 0, 0, false, 1e-2, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_momentum", RT_OPTIM_SGD, 0.05, 0.9, 0, false, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_momentum_dampening", RT_OPTIM_SGD, 0.05, 0.9, 0.1, false, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_momentum_dampening_wd", RT_OPTIM_SGD, 0.05, 0.8, 0.5, false, 5e-3, 0, 0, 0, false, false, 0, 0, 0, 0, 0,
     false},
    {"sgd_nesterov", RT_OPTIM_SGD, 0.05, 0.9, 0, true, 0, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_nesterov_wd", RT_OPTIM_SGD, 0.05, 0.9, 0, true, 1e-2, 0, 0, 0, false, false, 0, 0, 0, 0, 0, false},
    {"sgd_momentum_wd_nodecay", RT_OPTIM_SGD, 0.05, 0.9, 0, false, 5e-2, 0, 0, 0, false, true, 0, 0, 0, 0, 0, false},
    {"sgd_nesterov_wd_nodecay_clip", RT_OPTIM_SGD, 0.05, 0.9, 0, true, 1e-2, 0, 0, 0, false, true, 1.0, 0, 0, 0, 0,
     false},
    {"sgd_momentum_wd_cosine_warmup", RT_OPTIM_SGD, 0.1, 0.9, 0, false, 1e-3, 0, 0, 0, false, false, 0, 1, 0, 0, 0,
     false},
    {"adam", RT_OPTIM_ADAM, 1e-3, 0, 0, false, 0, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0, 0, false},
    {"adam_wd", RT_OPTIM_ADAM, 1e-2, 0, 0, false, 1e-2, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0, 0, false},
    {"adam_amsgrad", RT_OPTIM_ADAM, 1e-2, 0, 0, false, 0, 0.9, 0.999, 1e-8, true, false, 0, 0, 0, 0, 0, false},
    {"adam_amsgrad_wd", RT_OPTIM_ADAM, 1e-2, 0, 0, false, 1e-1, 0.8, 0.99, 1e-6, true, false, 0, 0, 0, 0, 0, false},
    {"adam_betas_eps_nodecay", RT_OPTIM_ADAM, 3e-3, 0, 0, false, 1e-1, 0.5, 0.9, 1e-3, false, true, 0, 0, 0, 0, 0,
     false},
    {"adam_clip_step", RT_OPTIM_ADAM, 1e-2, 0, 0, false, 0, 0.9, 0.999, 1e-8, false, false, 2.0, 2, 0, 0, 0, false},
    {"adamw", RT_OPTIM_ADAMW, 1e-3, 0, 0, false, 1e-2, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0, 0, false},
    {"adamw_amsgrad", RT_OPTIM_ADAMW, 1e-2, 0, 0, false, 1e-1, 0.9, 0.999, 1e-8, true, false, 0, 0, 0, 0, 0, false},
    {"adamw_nodecay", RT_OPTIM_ADAMW, 1e-2, 0, 0, false, 0.5, 0.9, 0.99, 1e-8, false, true, 0, 0, 0, 0, 0, false},
    {"adamw_amsgrad_nodecay_clip_cosine", RT_OPTIM_ADAMW, 1e-2, 0, 0, false, 0.1, 0.9, 0.999, 1e-8, true, true, 5.0, 1,
     0, 0, 0, false},
    {"adamw_nowd", RT_OPTIM_ADAMW, 1e-2, 0, 0, false, 0, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0, 0, false},
    {"adadelta", RT_OPTIM_ADADELTA, 1.0, 0, 0, false, 0, 0, 0, 1e-6, false, false, 0, 0, 0.9, 0, 0, false},
    {"adadelta_rho_eps_wd", RT_OPTIM_ADADELTA, 0.5, 0, 0, false, 1e-2, 0, 0, 1e-4, false, false, 0, 0, 0.95, 0, 0,
     false},
    {"adadelta_wd_nodecay_clip", RT_OPTIM_ADADELTA, 2.0, 0, 0, false, 5e-2, 0, 0, 1e-6, false, true, 1.0, 0, 0.8, 0, 0,
     false},
    {"adadelta_steplr", RT_OPTIM_ADADELTA, 1.0, 0, 0, false, 0, 0, 0, 1e-6, false, false, 0, 2, 0.9, 0, 0, false},
    {"adadelta_rho0_eps1e-3", RT_OPTIM_ADADELTA, 1.0, 0, 0, false, 0, 0, 0, 1e-3, false, false, 0, 0, 0.0, 0, 0, false},
    {"sgd_nesterov_wd_ema", RT_OPTIM_SGD, 0.05, 0.9, 0, true, 1e-2, 0, 0, 0, false, false, 0, 0, 0, 0.9, 1, false},
    {"adamw_ema_every3", RT_OPTIM_ADAMW, 1e-2, 0, 0, false, 1e-2, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0.99, 3,
     false},
    {"sgd_momentum_ema_warmup", RT_OPTIM_SGD, 0.05, 0.9, 0, false, 0, 0, 0, 0, false, false, 0, 0, 0, 0.95, 1, true},
    {"adam_ema_warmup_every2", RT_OPTIM_ADAM, 1e-2, 0, 0, false, 0, 0.9, 0.999, 1e-8, false, false, 0, 0, 0, 0.999, 2,
     true},
    {"adadelta_ema_every2_steplr", RT_OPTIM_ADADELTA, 1.0, 0, 0, false, 0, 0, 0, 1e-6, false, false, 0, 2, 0.9, 0.5, 2,
     false},
};
#define N_OCASES (int)(sizeof ocases / sizeof ocases[0])

/* schedules: the same struct the library takes, plus iteration count and adam flag */
typedef struct scase {
    const char *name;
    rt_schedule s;
    int iters;
    bool adam;
} scase;
static scase scases[16];
static int n_scases;

static char dir[256];
static size_t total; /* floats in all tensors (no padding) */
static float *data;  /* (STEPS+1) * total */
static float *torch_out;
static float *torch_ema; /* the EMA cases' averaged parameters after every step, in case order */
static double (*torch_sched)[2];
static int torch_sched_n;

static void sched_cosine_warmup(rt_schedule *s, double lr) {
    rt_schedule_default(s, RT_SCHED_COSINE, lr);
    s->t_max = 40;
    s->eta_min = 1e-3;
    s->warmup_steps = 5;
    s->warmup_start_factor = 0.1;
}

static void add_sched(const char *name, rt_schedule s, int iters, bool adam) {
    scases[n_scases++] = (scase){name, s, iters, adam};
}

static void build_sched_cases(void) {
    rt_schedule s;
    rt_schedule_default(&s, RT_SCHED_CONSTANT, 0.1);
    add_sched("constant", s, 20, false);
    rt_schedule_default(&s, RT_SCHED_STEP, 0.1);
    s.step_size = 7, s.gamma = 0.5;
    add_sched("step", s, 60, false);
    rt_schedule_default(&s, RT_SCHED_MULTISTEP, 0.3);
    s.milestones[0] = 10, s.milestones[1] = 25, s.milestones[2] = 25, s.milestones[3] = 40, s.n_milestones = 4;
    add_sched("multistep", s, 60, false);
    rt_schedule_default(&s, RT_SCHED_COSINE, 0.1);
    s.t_max = 30, s.eta_min = 1e-4;
    add_sched("cosine_past_tmax", s, 100, false);
    sched_cosine_warmup(&s, 0.1);
    add_sched("warmup_cosine", s, 60, false);
    rt_schedule_default(&s, RT_SCHED_STEP, 0.2);
    s.step_size = 5, s.gamma = 0.3, s.warmup_steps = 8;
    add_sched("warmup_step", s, 40, false);
    rt_schedule_default(&s, RT_SCHED_MULTISTEP, 0.2);
    s.milestones[0] = 3, s.milestones[1] = 12, s.n_milestones = 2, s.gamma = 0.1, s.warmup_steps = 4,
    s.warmup_start_factor = 0.25;
    add_sched("warmup_multistep", s, 30, false);
    rt_schedule_default(&s, RT_SCHED_CONSTANT, 0.05);
    s.warmup_steps = 10, s.warmup_start_factor = 0.01;
    add_sched("warmup_constant", s, 20, false);
    rt_schedule_default(&s, RT_SCHED_COSINE, 0.1);
    s.t_max = 6, s.eta_min = 0.0, s.per_epoch = true, s.steps_per_epoch = 7, s.warmup_steps = 2;
    add_sched("per_epoch_warmup_cosine", s, 70, false);
    rt_schedule_default(&s, RT_SCHED_ONECYCLE, 0.1);
    s.max_lr = 0.5, s.total_steps = 100;
    add_sched("onecycle", s, 100, false);
    rt_schedule_default(&s, RT_SCHED_ONECYCLE, 0.1);
    s.max_lr = 0.01, s.total_steps = 57, s.three_phase = true, s.anneal_linear = true, s.pct_start = 0.25;
    add_sched("onecycle_three_phase_linear_adam", s, 57, true);
    rt_schedule_default(&s, RT_SCHED_ONECYCLE, 0.1);
    s.max_lr = 0.2, s.total_steps = 12, s.per_epoch = true, s.steps_per_epoch = 3, s.cycle_momentum = false,
    s.div_factor = 10, s.final_div_factor = 100;
    add_sched("onecycle_per_epoch", s, 36, false);
}

static void json_sched(FILE *f, const rt_schedule *s) {
    fprintf(f, "{\"kind\": \"%s\", \"lr\": %.17g, \"step_size\": %lld, \"gamma\": %.17g, \"milestones\": [",
            rt_sched_kind_name(s->kind), s->base_lr, (long long)s->step_size, s->gamma);
    for (int i = 0; i < s->n_milestones; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)s->milestones[i]);
    fprintf(f,
            "], \"t_max\": %lld, \"eta_min\": %.17g, \"warmup_steps\": %lld, \"warmup_start_factor\": %.17g, "
            "\"max_lr\": %.17g, \"total_steps\": %lld, \"pct_start\": %.17g, \"anneal\": \"%s\", "
            "\"div_factor\": %.17g, \"final_div_factor\": %.17g, \"three_phase\": %s, \"cycle_momentum\": %s, "
            "\"base_momentum\": %.17g, \"max_momentum\": %.17g, \"per_epoch\": %s, \"steps_per_epoch\": %lld",
            (long long)s->t_max, s->eta_min, (long long)s->warmup_steps, s->warmup_start_factor, s->max_lr,
            (long long)s->total_steps, s->pct_start, s->anneal_linear ? "linear" : "cos", s->div_factor,
            s->final_div_factor, s->three_phase ? "true" : "false", s->cycle_momentum ? "true" : "false",
            s->base_momentum, s->max_momentum, s->per_epoch ? "true" : "false", (long long)s->steps_per_epoch);
}

static rt_schedule case_schedule(const ocase *c) {
    rt_schedule s;
    if (c->sched == 1) {
        sched_cosine_warmup(&s, c->lr);
    } else {
        rt_schedule_default(&s, RT_SCHED_STEP, c->lr);
        s.step_size = 10, s.gamma = 0.5;
    }
    return s;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

static int setup(void **state) {
    (void)state;
    if (system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
        printf("SKIP: /usr/bin/python3 cannot import torch (install python3-torch)\n");
        exit(77);
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/rt_optim_ref_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return -1;
    /* data: initial params N(0,1), then gradients N(0, scale_t) with scales varying by step */
    total = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        int64_t n = 1;
        for (int d = 0; d < ndims[t]; d++) n *= shapes[t][d];
        total += (size_t)n;
    }
    data = malloc((STEPS + 1) * total * sizeof *data);
    rt_rng rng;
    rt_rng_init(&rng, 1234, 7);
    rt_rng_normal(&rng, data, total, 0.0f, 1.0f);
    static const float scales[5] = {1.0f, 0.01f, 3.0f, 0.3f, 1e-4f};
    for (int s = 0; s < STEPS; s++) rt_rng_normal(&rng, data + (size_t)(s + 1) * total, total, 0.0f, scales[s % 5]);
    char path[512];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    FILE *f = fopen(path, "wb");
    fwrite(data, sizeof *data, (STEPS + 1) * total, f);
    fclose(f);

    snprintf(path, sizeof path, "%s/optim.json", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"steps\": %d, \"shapes\": [", STEPS);
    for (int t = 0; t < N_TENSORS; t++) {
        fprintf(f, "%s[", t ? ", " : "");
        for (int d = 0; d < ndims[t]; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)shapes[t][d]);
        fprintf(f, "]");
    }
    fprintf(f, "], \"cases\": [\n");
    for (int i = 0; i < N_OCASES; i++) {
        const ocase *c = &ocases[i];
        fprintf(f,
                "%s{\"name\": \"%s\", \"kind\": \"%s\", \"lr\": %.17g, \"momentum\": %.17g, \"dampening\": %.17g, "
                "\"nesterov\": %s, \"weight_decay\": %.17g, \"betas\": [%.17g, %.17g], \"eps\": %.17g, "
                "\"amsgrad\": %s, \"no_decay\": %s, \"clip\": %.17g, \"rho\": %.17g, \"ema_decay\": %.17g, "
                "\"ema_every\": %d, \"ema_warmup\": %s, \"sched\": ",
                i ? ",\n" : "", c->name, rt_optim_kind_name(c->kind), c->lr, c->momentum, c->dampening,
                c->nesterov ? "true" : "false", c->wd, c->b1, c->b2, c->eps, c->amsgrad ? "true" : "false",
                c->no_decay ? "[1, 3]" : "[]", c->clip, c->rho, c->ema_decay, c->ema_every,
                c->ema_warmup ? "true" : "false");
        if (c->sched) {
            rt_schedule s = case_schedule(c);
            json_sched(f, &s);
            fprintf(f, "}}");
        } else {
            fprintf(f, "null}");
        }
    }
    fprintf(f, "]}\n");
    fclose(f);

    build_sched_cases();
    snprintf(path, sizeof path, "%s/sched.json", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"cases\": [\n");
    for (int i = 0; i < n_scases; i++) {
        fprintf(f, "%s", i ? ",\n" : "");
        json_sched(f, &scases[i].s);
        fprintf(f, ", \"name\": \"%s\", \"iters\": %d, \"adam\": %s}", scases[i].name, scases[i].iters,
                scases[i].adam ? "true" : "false");
    }
    fprintf(f, "]}\n");
    fclose(f);

    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/optim/torch_optim_ref.py %s", src ? src : ".", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        return -1;
    }
    size_t len;
    snprintf(path, sizeof path, "%s/optim_out.bin", dir);
    torch_out = (float *)read_file(path, &len);
    if (!torch_out || len != (size_t)N_OCASES * STEPS * total * sizeof(float)) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, torch_out ? len : 0,
                (size_t)N_OCASES * STEPS * total * sizeof(float));
        return -1;
    }
    int n_ema = 0;
    for (int i = 0; i < N_OCASES; i++) n_ema += ocases[i].ema_decay > 0;
    snprintf(path, sizeof path, "%s/ema_out.bin", dir);
    torch_ema = (float *)read_file(path, &len);
    if (!torch_ema || len != (size_t)n_ema * STEPS * total * sizeof(float)) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, torch_ema ? len : 0,
                (size_t)n_ema * STEPS * total * sizeof(float));
        return -1;
    }
    snprintf(path, sizeof path, "%s/sched_out.txt", dir);
    char *txt = read_file(path, &len);
    if (!txt) return -1;
    int lines = 0;
    for (int i = 0; i < n_scases; i++) lines += scases[i].iters;
    torch_sched = malloc((size_t)lines * sizeof *torch_sched);
    char *p = txt;
    for (torch_sched_n = 0; torch_sched_n < lines; torch_sched_n++) {
        char *end;
        torch_sched[torch_sched_n][0] = strtod(p, &end);
        if (end == p) break;
        p = end;
        torch_sched[torch_sched_n][1] = strtod(p, &end);
        p = end;
    }
    free(txt);
    if (torch_sched_n != lines) {
        fprintf(stderr, "%s: %d values, expected %d\n", path, torch_sched_n, lines);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    const char *names[] = {"data.bin", "optim.json", "sched.json", "optim_out.bin", "sched_out.txt", "ema_out.bin"};
    char path[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    free(data);
    free(torch_out);
    free(torch_ema);
    free(torch_sched);
    return 0;
}

/* Relative error with a floor, so values crossing zero are judged on the scale of the
 * floor: 1e-2 (parameters are N(0,1)). With clipping the floor is 0.1: PyTorch rounds
 * each tensor's norm to float before combining them, we sum the whole arena in double,
 * so the clip coefficients differ by an ulp now and then, which moves parameters by a
 * few 1e-8 absolute over 50 steps (3e-6 "relative" on a parameter of 0.005). */
static double rel_err(float got, float want, double floor) {
    double d = fabs((double)got - (double)want), m = fabs((double)want);
    return d / (m > floor ? m : floor);
}

/* Run case c for STEPS steps (resuming from saved state at `resume_at` if > 0) and
 * return the largest relative error against torch over all steps and elements. */
static double run_case(const ocase *c, int resume_at) {
    rt_arena pa, ga;
    rt_arena_init(&pa, rt_device_cpu());
    rt_arena_init(&ga, rt_device_cpu());
    size_t off[N_TENSORS], numel[N_TENSORS];
    for (int t = 0; t < N_TENSORS; t++) {
        numel[t] = 1;
        for (int d = 0; d < ndims[t]; d++) numel[t] *= (size_t)shapes[t][d];
        assert_rt_ok(rt_arena_push(&pa, numel[t] * sizeof(float), 64, &off[t]));
        assert_rt_ok(rt_arena_push(&ga, numel[t] * sizeof(float), 64, &off[t]));
        off[t] /= sizeof(float);
    }
    assert_rt_ok(rt_arena_alloc(&pa));
    assert_rt_ok(rt_arena_alloc(&ga));
    size_t n = pa.size / sizeof(float);
    float *p = pa.base, *g = ga.base;
    size_t k = 0;
    for (int t = 0; t < N_TENSORS; t++, k += numel[t - 1]) memcpy(p + off[t], data + k, numel[t] * sizeof(float));

    rt_optim_config cfg;
    rt_optim_config_default(&cfg, c->kind);
    cfg.lr = c->lr;
    cfg.momentum = c->momentum;
    cfg.dampening = c->dampening;
    cfg.nesterov = c->nesterov;
    cfg.weight_decay = c->wd;
    if (c->kind != RT_OPTIM_SGD) cfg.betas[0] = c->b1, cfg.betas[1] = c->b2, cfg.eps = c->eps;
    cfg.amsgrad = c->amsgrad;
    cfg.rho = c->rho;
    cfg.ema_decay = c->ema_decay;
    cfg.ema_every = c->ema_every;
    cfg.ema_warmup = c->ema_warmup;
    rt_optim_range ranges[2];
    if (c->no_decay) {
        for (int i = 0; i < 2; i++) ranges[i] = (rt_optim_range){off[no_decay_tensors[i]], numel[no_decay_tensors[i]]};
        cfg.no_decay = ranges;
        cfg.n_no_decay = 2;
    }
    rt_schedule sched = case_schedule(c);
    if (c->sched) assert_rt_ok(rt_schedule_validate(&sched));
    rt_optimizer opt;
    assert_rt_ok(rt_optimizer_init(&opt, &cfg, rt_device_cpu(), n));
    rt_grad_clip clip;
    assert_rt_ok(rt_grad_clip_init(&clip, rt_device_cpu()));
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        if (resume_at > 0 && s == resume_at) {
            /* checkpoint: state buffers and step count out, a brand-new optimizer, back in */
            int ns = rt_optimizer_state_count(&opt);
            float *saved[RT_OPTIM_MAX_STATE];
            const char *names[RT_OPTIM_MAX_STATE];
            for (int i = 0; i < ns; i++) {
                rt_optim_state st;
                assert_rt_ok(rt_optimizer_state_get(&opt, i, &st));
                names[i] = st.name;
                saved[i] = malloc(n * sizeof(float));
                assert_rt_ok(rt_optimizer_state_save(&opt, st.name, saved[i], n));
            }
            int64_t steps = rt_optimizer_get_steps(&opt);
            rt_optimizer_free(&opt);
            assert_rt_ok(rt_optimizer_init(&opt, &cfg, rt_device_cpu(), n));
            assert_int_equal(rt_optimizer_state_count(&opt), ns);
            for (int i = 0; i < ns; i++) {
                assert_rt_ok(rt_optimizer_state_load(&opt, names[i], saved[i], n));
                free(saved[i]);
            }
            assert_rt_ok(rt_optimizer_set_steps(&opt, steps));
        }
        memset(g, 0, n * sizeof(float));
        k = (size_t)(s + 1) * total;
        for (int t = 0; t < N_TENSORS; t++) {
            memcpy(g + off[t], data + k, numel[t] * sizeof(float));
            k += numel[t];
        }
        if (c->clip > 0) {
            rt_grad_stats gs;
            assert_rt_ok(rt_grad_clip_norm(&clip, g, n, c->clip, NULL, &gs));
            assert_true(gs.finite);
        }
        double lr = c->sched ? rt_schedule_lr(&sched, s) : c->lr;
        assert_rt_ok(rt_optimizer_step(&opt, p, g, lr, NULL));
        const float *want = torch_out + ((size_t)(c - ocases) * STEPS + (size_t)s) * total;
        k = 0;
        for (int t = 0; t < N_TENSORS; t++)
            for (size_t i = 0; i < numel[t]; i++, k++) {
                double e = rel_err(p[off[t] + i], want[k], c->clip > 0 ? 0.1 : 1e-2);
                if (!(e <= worst)) { /* NaN counts as worst */
                    worst = e;
                    if (e > 1e-6 && getenv("RT_OPTIM_DEBUG"))
                        printf("  step %d tensor %d [%zu]: got %.9g want %.9g\n", s, t, i, p[off[t] + i], want[k]);
                }
            }
        if (c->ema_decay > 0 && s + 1 >= c->ema_every) { /* AveragedModel after its first update */
            int ei = 0;
            for (const ocase *o = ocases; o < c; o++) ei += o->ema_decay > 0;
            const float *avg = rt_optimizer_ema(&opt), *we = torch_ema + ((size_t)ei * STEPS + (size_t)s) * total;
            assert_non_null(avg);
            k = 0;
            for (int t = 0; t < N_TENSORS; t++)
                for (size_t i = 0; i < numel[t]; i++, k++) {
                    double e = rel_err(avg[off[t] + i], we[k], 1e-2);
                    if (!(e <= worst)) worst = e;
                }
        }
    }
    rt_grad_clip_free(&clip);
    rt_optimizer_free(&opt);
    rt_arena_free(&pa);
    rt_arena_free(&ga);
    return worst;
}

static void test_optimizers(void **state) {
    (void)state;
    int bad = 0;
    for (int i = 0; i < N_OCASES; i++) {
        double e1 = run_case(&ocases[i], 0), e2 = run_case(&ocases[i], RESUME_AT);
        bool ok = e1 <= 1e-6 && e2 <= 1e-6;
        printf("%-36s max rel err %.3g, resumed at %d: %.3g %s\n", ocases[i].name, e1, RESUME_AT, e2,
               ok ? "ok" : "MISMATCH");
        bad += !ok;
    }
    assert_int_equal(bad, 0);
}

static void test_schedules(void **state) {
    (void)state;
    int bad = 0, row = 0;
    for (int i = 0; i < n_scases; i++) {
        const scase *c = &scases[i];
        assert_rt_ok(rt_schedule_validate(&c->s));
        double worst = 0;
        for (int it = 0; it < c->iters; it++, row++) {
            double lr = rt_schedule_lr(&c->s, it), want = torch_sched[row][0];
            double e = fabs(lr - want) / fmax(fabs(want), 1e-9 * c->s.base_lr);
            if (!(e <= worst)) worst = e;
            double m;
            if (rt_schedule_momentum(&c->s, it, &m)) {
                e = fabs(m - torch_sched[row][1]) / fmax(fabs(torch_sched[row][1]), 1e-12);
                if (!(e <= worst)) worst = e;
            }
        }
        bool ok = worst <= 1e-10;
        printf("%-36s max rel err %.3g %s\n", c->name, worst, ok ? "ok" : "MISMATCH");
        bad += !ok;
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
