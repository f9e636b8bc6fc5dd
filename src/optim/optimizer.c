/* Optimizer front end: validation of the common keys, state allocation, the step's
 * common coefficients, the step through the backend table of the optimizer's device,
 * the moving average, and the state accessors for checkpoints. What differs between
 * optimizers (defaults, their keys' validation, state buffers, coefficients, loops) is
 * in their rows (kinds.c, internal/optim_kernels.h): nothing here branches on the kind.
 * See optimizer.h and docs/optim.md.
 */
#include "optim/optimizer.h"
#include "optim/internal/optim_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The one place where the build decides which backends exist. */
const rt_optim_backend *rt_optim_backend_get(rt_device_kind kind) {
    static const rt_optim_backend *const k_backends[RT_DEVICE_KIND_COUNT_] = {
        [RT_DEVICE_CPU] = &rt_optim_backend_cpu,
#ifdef RT_HAVE_CUDA
        [RT_DEVICE_CUDA] = &rt_optim_backend_cuda,
#endif
    };
    return (unsigned)kind < RT_DEVICE_KIND_COUNT_ ? k_backends[kind] : NULL;
}

static int range_cmp(const void *a, const void *b) {
    const rt_optim_range *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

rt_status rt_optim_config_validate(const rt_optim_config *cfg, size_t n) {
    RT_REQUIRE(cfg != NULL, RT_ERR_INVALID, "optim: config is NULL");
    const rt_optim_kind_ops *ops = rt_optim_kind_ops_of(cfg->kind);
    char names[64];
    RT_REQUIRE(ops != NULL, RT_ERR_INVALID, "optim.name: unknown optimizer %d (expected %s)", (int)cfg->kind,
               rt_optim_kind_list(names, sizeof names));
    RT_REQUIRE(isfinite(cfg->lr) && cfg->lr >= 0, RT_ERR_INVALID, "optim.lr: %g (expected a finite value >= 0)",
               cfg->lr);
    RT_REQUIRE(isfinite(cfg->weight_decay) && cfg->weight_decay >= 0, RT_ERR_INVALID,
               "optim.weight_decay: %g (expected a finite value >= 0)", cfg->weight_decay);
    if (ops->validate) {
        rt_status st = ops->validate(cfg);
        if (st != RT_OK) return st; /* the message names the key: no trace line */
    }
    RT_REQUIRE(isfinite(cfg->ema_decay) && cfg->ema_decay >= 0 && cfg->ema_decay < 1, RT_ERR_INVALID,
               "train.ema_decay: %g (expected 0 <= decay < 1)", cfg->ema_decay);
    RT_REQUIRE(cfg->ema_every >= 0, RT_ERR_INVALID, "train.ema_every: %lld (expected >= 1)", (long long)cfg->ema_every);
    RT_REQUIRE(cfg->n_no_decay == 0 || cfg->no_decay != NULL, RT_ERR_INVALID, "optim: %zu no-decay ranges but no array",
               cfg->n_no_decay);
    for (size_t i = 0; i < cfg->n_no_decay; i++) {
        const rt_optim_range *r = &cfg->no_decay[i];
        RT_REQUIRE(r->offset <= n && r->count <= n - r->offset, RT_ERR_INVALID,
                   "optim: no-decay range %zu [%zu, +%zu) outside the arena of %zu floats", i, r->offset, r->count, n);
    }
    return RT_OK;
}

static void optimizer_add_state(rt_optimizer *opt, const char *name) { opt->state_name[opt->n_state++] = name; }

rt_status rt_optimizer_init(rt_optimizer *opt, const rt_optim_config *cfg, rt_device device, size_t n) {
    RT_REQUIRE(opt != NULL, RT_ERR_INVALID, "optim: optimizer is NULL");
    memset(opt, 0, sizeof *opt);
    RT_CHECK(rt_optim_config_validate(cfg, n));
    RT_REQUIRE(n > 0, RT_ERR_INVALID, "optim: empty parameter arena");
    RT_REQUIRE(n <= SIZE_MAX / sizeof(float), RT_ERR_INVALID, "optim: arena of %zu floats too large", n);
    RT_CHECK(rt_device_kind_built(device.kind));
    const rt_optim_backend *backend = rt_optim_backend_get(device.kind);
    RT_REQUIRE(backend, RT_ERR_UNSUPPORTED, "optim: no optimizer backend for device kind %s",
               rt_device_kind_name(device.kind));
    opt->cfg = *cfg;
    opt->ops = rt_optim_kind_ops_of(cfg->kind); /* validated */
    opt->device = device;
    opt->n = n;
    rt_status st = RT_OK;
    size_t nr = 0;
    if (cfg->n_no_decay > 0) {
        opt->ranges = malloc(cfg->n_no_decay * sizeof *opt->ranges);
        RT_CHECK_ALLOC(opt->ranges, cfg->n_no_decay * sizeof *opt->ranges);
        for (size_t i = 0; i < cfg->n_no_decay; i++)
            if (cfg->no_decay[i].count > 0) opt->ranges[nr++] = cfg->no_decay[i];
        qsort(opt->ranges, nr, sizeof *opt->ranges, range_cmp);
        for (size_t i = 1; i < nr; i++) {
            if (opt->ranges[i].offset < opt->ranges[i - 1].offset + opt->ranges[i - 1].count) {
                st = RT_ERROR(RT_ERR_INVALID, "optim: no-decay ranges [%zu, +%zu) and [%zu, +%zu) overlap",
                              opt->ranges[i - 1].offset, opt->ranges[i - 1].count, opt->ranges[i].offset,
                              opt->ranges[i].count);
                goto fail;
            }
        }
    }
    opt->cfg.no_decay = opt->ranges;
    opt->cfg.n_no_decay = nr;

    const char *names[RT_OPTIM_MAX_STATE];
    int ns = opt->ops->states(cfg, names);
    if (ns < 0 || ns >= RT_OPTIM_MAX_STATE) {
        st = RT_ERROR(RT_ERR_INTERNAL, "optim: %s declares %d state buffers (expected 0 to %d)", opt->ops->name, ns,
                      RT_OPTIM_MAX_STATE - 1);
        goto fail;
    }
    for (int i = 0; i < ns; i++) optimizer_add_state(opt, names[i]);
    if (cfg->ema_decay > 0) optimizer_add_state(opt, "ema");
    if (opt->cfg.ema_every < 1) opt->cfg.ema_every = 1;
    for (int i = 0; i < opt->n_state; i++) {
        RT_CHECK_GOTO(rt_malloc(device, n * sizeof(float), (void **)&opt->state[i]), st, fail);
        RT_CHECK_GOTO(rt_memset(device, opt->state[i], 0, n * sizeof(float), NULL), st, fail);
    }
    if (rt_device_is_cuda(device)) { /* where a captured step reads its scalars */
        RT_CHECK_GOTO(rt_malloc(device, sizeof(rt_optim_scalars), &opt->scalars_dev), st, fail);
        RT_CHECK_GOTO(rt_host_alloc(sizeof(rt_optim_scalars), true, &opt->scalars_host, &opt->scalars_host_pinned), st,
                      fail);
    }
    RT_CHECK_GOTO(backend->init(opt), st, fail);
    opt->backend = backend; /* from here on rt_optimizer_free releases the backend's part */
    return RT_OK;
fail:
    rt_optimizer_free(opt);
    return st;
}

/* the host waits for the steps enqueued so far: the last recorded one, and the replays
 * of a captured one (on its stream) */
static rt_status wait_steps(const rt_optimizer *opt) {
    if (opt->step_done) RT_CHECK(rt_event_sync(opt->step_done));
    if (opt->graph_stream) RT_CHECK(rt_stream_sync(opt->graph_stream));
    return RT_OK;
}

void rt_optimizer_free(rt_optimizer *opt) {
    if (!opt) return;
    (void)wait_steps(opt); /* a step may still use the state (a captured one's stream must outlive it) */
    if (opt->backend) opt->backend->release(opt);
    rt_event_destroy(opt->step_done);
    rt_free(opt->device, opt->scalars_dev);
    if (opt->scalars_host) rt_host_free(opt->scalars_host, opt->scalars_host_pinned);
    for (int i = 0; i < opt->n_state; i++) rt_free(opt->device, opt->state[i]);
    free(opt->ranges);
    memset(opt, 0, sizeof *opt);
}

/* The float coefficients of one step, from PyTorch 1.13's _single_tensor_<kind>: Python
 * computes in double; the kernels receive the values rounded to float. The common part
 * here, the kind's own in its row. */
static void optimizer_scalars(const rt_optimizer *opt, double lr, int64_t step, rt_optim_scalars *s) {
    const rt_optim_config *c = &opt->cfg;
    memset(s, 0, sizeof *s);
    s->has_wd = c->weight_decay != 0;
    s->wd = (float)c->weight_decay;
    s->neglr = (float)(-lr);
    opt->ops->scalars(c, lr, step, s);
}

void rt_optimizer_set_parallel(rt_optimizer *opt, rt_optim_parallel_fn run, void *pool) {
    opt->parallel = run;
    opt->parallel_pool = pool;
}

/* A step being captured: its scalars go to the pinned slot now, and the captured work
 * copies them to the device before the kernel reads them there (at every replay, the
 * slot's contents then) */
static rt_status capture_scalars(rt_optimizer *opt, const rt_optim_scalars *s, rt_stream *stream) {
    RT_REQUIRE(opt->scalars_dev && opt->scalars_host_pinned, RT_ERR_UNSUPPORTED,
               "optim: a step captured in a graph needs a GPU optimizer with pinned host memory");
    memcpy(opt->scalars_host, s, sizeof *s);
    RT_CHECK(rt_memcpy(opt->scalars_dev, opt->device, opt->scalars_host, rt_device_cpu(), sizeof *s, stream));
    opt->scalars_from_dev = true;
    return RT_OK;
}

rt_status rt_optimizer_replay_prepare(rt_optimizer *opt, double lr) { return rt_optimizer_replay_prepare_after(opt, lr, NULL); }

rt_status rt_optimizer_replay_prepare_after(rt_optimizer *opt, double lr, rt_event *after) {
    RT_REQUIRE(opt != NULL && opt->graph_stream != NULL, RT_ERR_INVALID, "optim: no step was captured in a graph");
    RT_REQUIRE(!(opt->replay_open && opt->cfg.ema_decay > 0), RT_ERR_INVALID,
               "optim: the replay before was not finished (rt_optimizer_replay_finish): its moving-average update "
               "is missing");
    if (lr < 0) lr = opt->cfg.lr;
    RT_REQUIRE(isfinite(lr), RT_ERR_INVALID, "optim: learning rate %g is not finite", lr);
    bool done = false; /* the previous replay has read the slot */
    if (after) RT_CHECK(rt_event_query(after, &done));
    if (!done) RT_CHECK(after ? rt_event_sync(after) : rt_stream_sync(opt->graph_stream));
    rt_optim_scalars s;
    const int64_t step = opt->steps + 1;
    optimizer_scalars(opt, lr, step, &s);
    memcpy(opt->scalars_host, &s, sizeof s);
    opt->steps = step;
    opt->replay_open = true;
    return RT_OK;
}

/* the moving average of step `step` if it is due (AveragedModel.update_parameters:
 * n_averaged = step / every - 1 updates so far), enqueued on stream */
static rt_status ema_update(rt_optimizer *opt, float *params, int64_t step, rt_stream *stream) {
    if (!(opt->cfg.ema_decay > 0 && step % opt->cfg.ema_every == 0)) return RT_OK;
    float *avg = rt_optimizer_ema(opt);
    int64_t done = step / opt->cfg.ema_every - 1;
    double d = opt->cfg.ema_decay;
    if (opt->cfg.ema_warmup) d = fmin(d, (1.0 + (double)done) / (10.0 + (double)done));
    return opt->backend->ema(avg, params, opt->n, (float)d, (float)(1.0 - d), done == 0, stream);
}

rt_status rt_optimizer_replay_finish(rt_optimizer *opt, float *params, rt_stream *stream) {
    RT_REQUIRE(opt != NULL && opt->replay_open, RT_ERR_INVALID, "optim: no replay prepared to finish");
    RT_REQUIRE(!rt_stream_capturing(stream), RT_ERR_INVALID, "optim: a replay is finished outside the capture");
    opt->replay_open = false;
    RT_CHECK(ema_update(opt, params, opt->steps, stream));
    return rt_event_record(opt->step_done, stream); /* state_save waits for it */
}

rt_status rt_optimizer_step(rt_optimizer *opt, float *params, const float *grads, double lr, rt_stream *stream) {
    RT_REQUIRE(opt != NULL && opt->n > 0 && opt->backend, RT_ERR_INVALID, "optim: optimizer not initialised");
    RT_REQUIRE(params != NULL && grads != NULL, RT_ERR_INVALID, "optim: params or grads is NULL");
    if (lr < 0) lr = opt->cfg.lr;
    RT_REQUIRE(isfinite(lr), RT_ERR_INVALID, "optim: learning rate %g is not finite", lr);
    rt_optim_scalars s;
    int64_t step = opt->steps + 1;
    optimizer_scalars(opt, lr, step, &s);
    if (!opt->step_done) RT_CHECK(rt_event_create(opt->device, &opt->step_done));
    const bool captured = rt_stream_capturing(stream);
    if (captured) RT_CHECK(capture_scalars(opt, &s, stream));
    rt_status st = opt->backend->step(opt, params, grads, &s, stream);
    opt->scalars_from_dev = false;
    RT_CHECK(st);
    if (captured) { /* counted by rt_optimizer_replay_prepare, before each replay */
        opt->graph_stream = stream;
        return RT_OK;
    }
    RT_CHECK(ema_update(opt, params, step, stream));
    /* the step's stream: state_save/state_load wait for it before the host touches the state */
    RT_CHECK(rt_event_record(opt->step_done, stream));
    opt->steps = step;
    return RT_OK;
}

rt_status rt_optimizer_step_arena(rt_optimizer *opt, rt_arena *params, rt_arena *grads, double lr, rt_stream *stream) {
    RT_REQUIRE(opt != NULL && params != NULL && grads != NULL, RT_ERR_INVALID, "optim: NULL argument");
    char a[32], b[32], c[32];
    RT_REQUIRE(params->base != NULL && grads->base != NULL, RT_ERR_INVALID, "optim: arena not allocated");
    RT_REQUIRE(params->size == opt->n * sizeof(float) && grads->size == params->size, RT_ERR_INVALID,
               "optim: arenas of %zu (params) and %zu (grads) bytes for an optimizer of %zu floats", params->size,
               grads->size, opt->n);
    RT_REQUIRE(rt_device_equal(params->device, opt->device) && rt_device_equal(grads->device, opt->device),
               RT_ERR_INVALID, "optim: arenas on %s (params) and %s (grads), optimizer on %s",
               rt_device_str(params->device, a, sizeof a), rt_device_str(grads->device, b, sizeof b),
               rt_device_str(opt->device, c, sizeof c));
    RT_CHECK(rt_optimizer_step(opt, params->base, grads->base, lr, stream));
    return RT_OK;
}

rt_status rt_optimizer_set_momentum(rt_optimizer *opt, double momentum) {
    RT_REQUIRE(opt != NULL && opt->n > 0, RT_ERR_INVALID, "optim: optimizer not initialised");
    RT_REQUIRE(opt->ops->set_momentum != NULL, RT_ERR_INVALID,
               "optim: %s has no momentum to cycle (optim.cycle_momentum: false)", opt->ops->name);
    return opt->ops->set_momentum(&opt->cfg, momentum); /* the message names the key: no trace line */
}

float *rt_optimizer_ema(const rt_optimizer *opt) {
    if (!opt || opt->cfg.ema_decay <= 0) return NULL;
    return opt->state[opt->n_state - 1]; /* always the last */
}

rt_status rt_optimizer_ema_swap(rt_optimizer *opt, float *params, rt_stream *stream) {
    RT_REQUIRE(opt != NULL && opt->backend && params != NULL, RT_ERR_INVALID, "optim: optimizer not initialised");
    float *avg = rt_optimizer_ema(opt);
    RT_REQUIRE(avg != NULL, RT_ERR_INVALID, "optim: no moving average (train.ema_decay is 0)");
    RT_CHECK(opt->backend->ema_swap(avg, params, opt->n, stream));
    if (!opt->step_done) RT_CHECK(rt_event_create(opt->device, &opt->step_done));
    RT_CHECK(rt_event_record(opt->step_done, stream)); /* state_save waits for it */
    return RT_OK;
}

int64_t rt_optimizer_get_steps(const rt_optimizer *opt) { return opt ? opt->steps : 0; }

rt_status rt_optimizer_set_steps(rt_optimizer *opt, int64_t steps) {
    RT_REQUIRE(opt != NULL, RT_ERR_INVALID, "optim: optimizer is NULL");
    RT_REQUIRE(steps >= 0, RT_ERR_INVALID, "optim: step %lld (expected >= 0)", (long long)steps);
    opt->steps = steps;
    return RT_OK;
}

int rt_optimizer_state_count(const rt_optimizer *opt) { return opt ? opt->n_state : 0; }

rt_status rt_optimizer_state_get(const rt_optimizer *opt, int index, rt_optim_state *out) {
    RT_REQUIRE(opt != NULL && out != NULL, RT_ERR_INVALID, "optim: NULL argument");
    RT_REQUIRE(index >= 0 && index < opt->n_state, RT_ERR_INVALID, "optim: state index %d (this %s optimizer has %d)",
               index, rt_optim_kind_name(opt->cfg.kind), opt->n_state);
    out->name = opt->state_name[index];
    out->data = opt->state[index];
    out->count = opt->n;
    int64_t shape[1] = {(int64_t)opt->n};
    RT_CHECK(rt_tensor_init(&out->tensor, RT_F32, 1, shape, opt->device));
    out->tensor.data = opt->state[index];
    return RT_OK;
}

rt_status rt_optimizer_state_find(const rt_optimizer *opt, const char *name, rt_optim_state *out) {
    RT_REQUIRE(opt != NULL && name != NULL, RT_ERR_INVALID, "optim: NULL argument");
    for (int i = 0; i < opt->n_state; i++)
        if (strcmp(opt->state_name[i], name) == 0) return rt_optimizer_state_get(opt, i, out);
    RT_REQUIRE(opt->ops != NULL, RT_ERR_INVALID, "optim: optimizer not initialised");
    RT_FAIL(RT_ERR_INVALID, "optim: no state \"%s\" in this %s optimizer%s", name, opt->ops->name,
            opt->ops->state_hint);
}

rt_status rt_optimizer_state_load(rt_optimizer *opt, const char *name, const float *host, size_t count) {
    rt_optim_state st;
    RT_CHECK(rt_optimizer_state_find(opt, name, &st));
    RT_REQUIRE(host != NULL && count == st.count, RT_ERR_INVALID, "optim: state \"%s\" has %zu floats, got %zu", name,
               st.count, count);
    RT_CHECK(wait_steps(opt)); /* a step in flight reads the state */
    RT_CHECK(rt_memcpy(st.data, opt->device, host, rt_device_cpu(), count * sizeof(float), NULL));
    return RT_OK;
}

rt_status rt_optimizer_state_save(const rt_optimizer *opt, const char *name, float *host, size_t count) {
    rt_optim_state st;
    RT_CHECK(rt_optimizer_state_find(opt, name, &st));
    RT_REQUIRE(host != NULL && count == st.count, RT_ERR_INVALID, "optim: state \"%s\" has %zu floats, got %zu", name,
               st.count, count);
    RT_CHECK(wait_steps(opt)); /* the last step wrote it on its stream */
    RT_CHECK(rt_memcpy(host, rt_device_cpu(), st.data, opt->device, count * sizeof(float), NULL));
    return RT_OK;
}
