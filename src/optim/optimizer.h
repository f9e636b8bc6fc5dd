/* Optimizers over the flat parameter arena: SGD (momentum, dampening, nesterov, weight
 * decay), Adam (L2 weight decay, amsgrad), AdamW (decoupled weight decay) and Adadelta
 * (rho, eps, L2 weight decay; maximize off).
 *
 * All parameters live in one arena, the gradients in a second one with the same offsets,
 * so an optimizer step is one pass over n floats: one fused loop on the CPU and one
 * kernel launch on CUDA, whatever the number of tensors. The state (momentum buffer,
 * Adam moments) lives in buffers of the same n floats on the same device, so a
 * parameter's state is found at the parameter's own offset.
 *
 * The arithmetic is PyTorch 1.13's single-tensor implementation (foreach=False) in the
 * same float32 order, fused multiply-adds where PyTorch's AVX2 kernels use them, scalar
 * coefficients computed in double and rounded to float as PyTorch does, so trajectories
 * match torch.optim.SGD/Adam/AdamW to the last bit or nearly; the CUDA kernels use the
 * same operations with explicit rounding (no contraction), so GPU results equal CPU ones.
 *
 * Weight decay can be switched off for element ranges of the arena (batch-norm
 * parameters and biases, as the model reports them): PyTorch's equivalent is a second
 * parameter group with weight_decay=0.
 */
#ifndef RT_OPTIM_OPTIMIZER_H
#define RT_OPTIM_OPTIMIZER_H

#include "core/device.h"
#include "core/names.h"
#include "core/status.h"
#include "core/tensor.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One row per optimizer (src/optim/<name>.c, listed in kinds.c); a new one adds its
 * member here, before RT_OPTIM_KIND_COUNT_ (docs/optim.md, "Adding an optimizer"). */
typedef enum rt_optim_kind {
    RT_OPTIM_SGD = 0,
    RT_OPTIM_ADAM,
    RT_OPTIM_ADAMW,
    RT_OPTIM_ADADELTA,
    RT_OPTIM_KIND_COUNT_
} rt_optim_kind;

/* The optimizers' names, "sgd" | "adam" | "adamw" | "adadelta", from their rows (core/names.h). */
extern const rt_names rt_optim_kind_names;

/* rt_names_parse of rt_optim_kind_names. */
rt_status rt_optim_kind_parse(const char *text, rt_optim_kind *out);
const char *rt_optim_kind_name(rt_optim_kind kind);

/* A range of the flat arena, in floats: [offset, offset + count). */
typedef struct rt_optim_range {
    size_t offset;
    size_t count;
} rt_optim_range;

/* The hyper-parameters are the config's optim keys of the same names (src/train/config.c
 * points each key at its field here; the config holds an rt_optim_config), so a new one
 * is a field here, its key there and its use in its row. */
typedef struct rt_optim_config {
    rt_optim_kind kind;
    double lr;           /* used by rt_optimizer_step when its lr argument is < 0 */
    double weight_decay; /* SGD/Adam/Adadelta: added to the gradient (L2); AdamW: param *= 1 - lr*wd */
    /* SGD */
    double momentum;  /* 0: plain SGD */
    double dampening; /* buf = momentum*buf + (1-dampening)*grad (not on the first step) */
    bool nesterov;    /* needs momentum > 0 and dampening == 0, as in PyTorch */
    /* Adam / AdamW (eps also Adadelta's) */
    double betas[2]; /* beta1, beta2 */
    double eps;
    bool amsgrad;
    /* Adadelta: square_avg = rho*square_avg + (1-rho)*g^2, the same for acc_delta */
    double rho;
    /* Exponential moving average of the parameters (0: off), the state buffer "ema":
     * torch.optim.swa_utils.AveragedModel(model, avg_fn=lambda a, m, n: decay*a +
     * (1-decay)*m) with update_parameters called after every ema_every-th step: the
     * first update copies the parameters, the later ones average (see docs/optim.md). */
    double ema_decay;
    int64_t ema_every; /* >= 1 (0 is taken as 1) */
    /* the decay of update n (n = 0, 1, ... updates done before it) is
     * min(ema_decay, (1 + n) / (10 + n)) (TensorFlow's ExponentialMovingAverage with
     * num_updates), so the first weights are soon forgotten; false: ema_decay always */
    bool ema_warmup;
    /* Ranges excluded from weight decay (biases, batch-norm weights and biases). They
     * may be unsorted and touch each other but must not overlap and must lie inside
     * the arena. Copied by rt_optimizer_init. */
    const rt_optim_range *no_decay;
    size_t n_no_decay;
} rt_optim_config;

/* PyTorch's defaults for `kind`: SGD lr 0.1 (PyTorch has none), momentum 0;
 * Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0;
 * AdamW the same with weight_decay 1e-2; Adadelta lr 1.0, rho 0.9, eps 1e-6, weight_decay 0. */
void rt_optim_config_default(rt_optim_config *cfg, rt_optim_kind kind);

/* Replace the hyper-parameters that may be "auto" in the config (NaN here: lr,
 * weight_decay, eps, whose defaults depend on the optimizer) by cfg->kind's defaults;
 * RT_ERR_INVALID for an unknown kind. */
rt_status rt_optim_config_resolve(rt_optim_config *cfg);

/* True when an optimizer of this config has a momentum rt_optimizer_set_momentum can
 * change (one-cycle's cycle_momentum): SGD with momentum > 0, Adam, AdamW; false for
 * Adadelta, SGD without momentum and an unknown kind. */
bool rt_optim_config_has_momentum(const rt_optim_config *cfg);

/* Check a config against PyTorch's rules (lr >= 0, 0 <= beta < 1, eps >= 0, nesterov
 * needs momentum > 0 and dampening 0, ...); the error names the field. n is the arena
 * size in floats the ranges must fit in. */
rt_status rt_optim_config_validate(const rt_optim_config *cfg, size_t n);

/* Named state buffers: "momentum_buffer" (SGD with momentum), "exp_avg", "exp_avg_sq",
 * "max_exp_avg_sq" (Adam/AdamW, the last with amsgrad), "square_avg", "acc_delta"
 * (Adadelta), PyTorch's names; then "ema" (the parameters' moving average, any kind). */
#define RT_OPTIM_MAX_STATE 4

/* Runs fn(arg, t) for t in [0, ntasks) on some threads and returns when all are done
 * (rt_model_ctx_parallel fits, with the model context as `pool`). */
typedef void (*rt_optim_parallel_fn)(void *pool, int ntasks, void (*fn)(void *arg, int task), void *arg);

typedef struct rt_optimizer {
    rt_optim_config cfg;                 /* cfg.no_decay points at the sorted copy below */
    const struct rt_optim_kind_ops *ops; /* the kind's row (internal/optim_kernels.h), set by rt_optimizer_init */
    rt_optim_range *ranges;              /* sorted copy of the excluded ranges */
    rt_device device;
    size_t n;      /* floats in the arena */
    int64_t steps; /* optimizer steps taken: PyTorch's state['step'] */
    int n_state;
    const char *state_name[RT_OPTIM_MAX_STATE];
    float *state[RT_OPTIM_MAX_STATE];       /* on `device`, n floats each */
    const struct rt_optim_backend *backend; /* the device kind's functions, picked by rt_optimizer_init */
    void *backend_state;                    /* the backend's (CUDA: the weight-decay bit mask) */
    rt_event *step_done;                    /* recorded after each step on its stream: the state is read or
                                             * overwritten on the host only after it (created at the first step) */
    rt_stream *graph_stream;                /* a step was captured on this stream (core/device.h graphs):
                                             * its replays record no event, the host waits for the stream */
    void *scalars_dev, *scalars_host;       /* GPU: a captured step's scalars, on the device and in a pinned
                                             * host slot (rt_optimizer_replay_prepare writes it) */
    bool scalars_host_pinned;
    bool scalars_from_dev;                  /* the step being enqueued reads scalars_dev (backends) */
    bool replay_open;                       /* prepared, not finished (rt_optimizer_replay_finish) */
    rt_optim_parallel_fn parallel;          /* CPU steps: the threads to split the arena over (NULL: the caller's) */
    void *parallel_pool;
} rt_optimizer;

/* CPU optimizers: split each step's update over `run`'s threads (chunks of the arena;
 * every element's update is independent, so the result is the same bits for any
 * thread count). run NULL: the calling thread. No effect on a GPU optimizer. */
void rt_optimizer_set_parallel(rt_optimizer *opt, rt_optim_parallel_fn run, void *pool);

/* Set up an optimizer for an arena of n floats on `device` and allocate its state
 * (zeroed). */
rt_status rt_optimizer_init(rt_optimizer *opt, const rt_optim_config *cfg, rt_device device, size_t n);
void rt_optimizer_free(rt_optimizer *opt);

/* One step over the whole arena: params (n floats) updated in place from grads (n
 * floats), both on the optimizer's device. lr < 0 means cfg.lr. Asynchronous on CUDA
 * (on `stream`, NULL = the default stream); the CPU ignores the stream. */
rt_status rt_optimizer_step(rt_optimizer *opt, float *params, const float *grads, double lr, rt_stream *stream);

/* The same over whole arenas: both on the optimizer's device and n floats long
 * (params->size == grads->size == n * sizeof(float)). */
rt_status rt_optimizer_step_arena(rt_optimizer *opt, rt_arena *params, rt_arena *grads, double lr, rt_stream *stream);

/* A step enqueued on a capturing stream (core/device.h graphs) is recorded, not run:
 * its scalars (the learning rate, momentum's first step, Adam's bias corrections, which
 * change from step to step) are read from device memory, copied there from a pinned
 * host slot by the captured work itself, and the captured step is not counted. Before
 * every replay of the graph, including the first, rt_optimizer_replay_prepare computes
 * the scalars of the next step with learning rate lr (< 0: cfg.lr) as
 * rt_optimizer_step would, writes them into the slot and counts the step; it first waits
 * (host) until the stream has finished the previous replay, which read the slot. The
 * graph must be launched on the stream the step was captured on, and that stream must
 * outlive the optimizer (its waits synchronise it). The moving average (cfg.ema_decay)
 * is not captured (its decay changes with the step): with one, every replay is followed
 * by rt_optimizer_replay_finish (a prepare before it is RT_ERR_INVALID). */
rt_status rt_optimizer_replay_prepare(rt_optimizer *opt, double lr);
/* The same where `after` is an event recorded on the graph's stream after the previous
 * replay (the caller's step event, say): when it is complete (the host waited for it
 * already) nothing is synchronised; otherwise the host waits for it. */
rt_status rt_optimizer_replay_prepare_after(rt_optimizer *opt, double lr, rt_event *after);
/* After launching the graph (not captured): the moving average's update of this step,
 * if one is due, and the step's event (state_save waits for it), on `stream`; params as
 * rt_optimizer_step's. RT_ERR_INVALID without a prepared replay. */
rt_status rt_optimizer_replay_finish(rt_optimizer *opt, float *params, rt_stream *stream);

/* The moving average of the parameters (cfg.ema_decay > 0): the state buffer "ema", or
 * NULL when off. rt_optimizer_ema_swap exchanges its contents with params (n floats on
 * the optimizer's device, after the steps enqueued so far on `stream`): evaluation and
 * checkpoints swap, use the model, and swap back. RT_ERR_INVALID without an EMA. */
float *rt_optimizer_ema(const rt_optimizer *opt);
rt_status rt_optimizer_ema_swap(rt_optimizer *opt, float *params, rt_stream *stream);

/* Change SGD's momentum or Adam's beta1 between steps (one-cycle momentum cycling);
 * RT_ERR_INVALID where rt_optim_config_has_momentum is false (Adadelta has neither). */
rt_status rt_optimizer_set_momentum(rt_optimizer *opt, double momentum);

/* The step counter (PyTorch's state['step']; for SGD it says whether the momentum
 * buffer exists yet: 0 = the next step copies the gradient into it). */
int64_t rt_optimizer_get_steps(const rt_optimizer *opt);
rt_status rt_optimizer_set_steps(rt_optimizer *opt, int64_t steps);

/* State buffers for checkpoints: name, data (on the optimizer's device) and a 1-D f32
 * tensor of n elements describing it. A parameter's state is at its arena offset. Save
 * them with the step counter; load by copying back into `data` (rt_memcpy) and
 * rt_optimizer_set_steps. */
typedef struct rt_optim_state {
    const char *name;
    float *data;
    size_t count;
    rt_tensor tensor;
} rt_optim_state;
int rt_optimizer_state_count(const rt_optimizer *opt);
rt_status rt_optimizer_state_get(const rt_optimizer *opt, int index, rt_optim_state *out);
/* RT_ERR_INVALID naming the buffer if this optimizer has no such state. */
rt_status rt_optimizer_state_find(const rt_optimizer *opt, const char *name, rt_optim_state *out);
/* Copy state buffer `name` from / to host memory (n floats). */
rt_status rt_optimizer_state_load(rt_optimizer *opt, const char *name, const float *host, size_t count);
rt_status rt_optimizer_state_save(const rt_optimizer *opt, const char *name, float *host, size_t count);

#ifdef __cplusplus
}
#endif

#endif
