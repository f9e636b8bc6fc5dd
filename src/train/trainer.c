/* The trainer (trainer.h): one rank of a data-parallel run.
 *
 * Timing: every stage boundary records an event on the model's stream (on the CPU an
 * event is a host timestamp, so the same code runs there). A step's record is completed
 * when its events are ready: at once on the CPU, one step later on a GPU, so timing never
 * adds a synchronisation. The data stage is host time (waiting for the loader). */
#include "train/trainer.h"

#include "core/device.h"
#include "core/file.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "model/ctx.h"
#include "model/model.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void rt_train_run_dir(const rt_config *cfg, char *out, size_t n) {
    if (strcmp(cfg->log.dir, "auto") != 0) {
        snprintf(out, n, "%s", cfg->log.dir);
        return;
    }
    const char *base = strrchr(cfg->source, '/');
    base = base ? base + 1 : cfg->source;
    char stem[RT_CONFIG_PATH_MAX];
    snprintf(stem, sizeof stem, "%s", *base ? base : "default");
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = '\0';
    snprintf(out, n, "runs/%.*s", (int)(n > 6 ? n - 6 : 0), stem);
}

void rt_train_ckpt_dir(const rt_config *cfg, char *out, size_t n) {
    if (strcmp(cfg->checkpoint.dir, "auto") != 0) {
        snprintf(out, n, "%s", cfg->checkpoint.dir);
        return;
    }
    char run_dir[RT_CONFIG_PATH_MAX];
    rt_train_run_dir(cfg, run_dir, sizeof run_dir);
    snprintf(out, n, "%s/checkpoints", run_dir);
}

rt_status rt_train_check_world(const rt_config *cfg, int64_t world_size) {
    RT_REQUIRE(cfg->data.batch_size % world_size == 0, RT_ERR_INVALID,
               "data.batch_size: %lld is not divisible by the world size %lld (it is the global batch: each rank "
               "takes batch_size / world_size)",
               (long long)cfg->data.batch_size, (long long)world_size);
    return RT_OK;
}

/* ---- the state of one rank's run ------------------------------------------------------- */

enum { EV_START, EV_H2D, EV_FWD, EV_BWD, EV_COMM, EV_END, EV_COUNT };
enum { SCRATCH_BYTES = 64 };

typedef struct pending {
    rt_event *ev[EV_COUNT];
    rt_step_record rec;
    bool waiting; /* events recorded, record not logged yet */
} pending;

typedef struct run {
    const rt_config *cfg;
    rt_train_rank who;
    FILE *out;
    char run_dir[RT_CONFIG_PATH_MAX];
    rt_device dev;
    rt_dataset train_ds, test_ds;
    bool have_train, have_test;
    rt_model_ctx *ctx;
    rt_model *model;
    rt_pg *pg; /* NULL with one rank */
    rt_reducer *reducer;
    size_t *bounds;
    rt_loader *train_loader, *test_loader;
    rt_optimizer opt;
    bool have_opt;
    rt_optim_range *no_decay;
    rt_schedule sched;
    rt_grad_clip clip;
    bool have_clip;
    float *x_dev;       /* CUDA: the batch on the device */
    void *scratch_dev;  /* CUDA: host values all-reduced through the device (all_reduce_host) */
    /* CUDA: what a step reads back, in pinned memory: the summed loss and stop flag, the
     * gradients' sum of squares; one event, one host wait per step (step_scalars) */
    struct step_vals {
        float loss_stop[2];
        double sumsq;
    } *vals_host;
    bool vals_pinned;
    rt_event *ev_vals;
    int64_t *label_dev; /* CUDA */
    float *out_host;    /* evaluation: logits on the host */
    rt_metrics *metrics, *rank_metrics;
    rt_stage_stats *stats;
    rt_progress progress;
    pending pend[2];
    int64_t step; /* optimizer steps done */
    char ckpt_dir[RT_CONFIG_PATH_MAX];
    char resume_path[RT_CKPT_PATH_MAX]; /* the checkpoint to continue from ("": fresh), found before the model */
    int64_t start_epoch, start_batches; /* where a resumed run continues */
    int64_t resumed_step;               /* -1: a fresh run */
    bool stop;                          /* every rank saw a stop request at the last step */
    int64_t steps_per_epoch, total_steps;
    uint64_t t0;
} run;

static bool is_root(const run *r) { return r->who.rank == 0; }
static rt_status test_init_seed_rank(run *r); /* test-only hooks: see test_env_rank */
static rt_status test_perturb_at(run *r);
static rt_status test_bn_perturb(run *r);

/* All-reduce of a few host values (the loss, evaluation sums, checksums); a no-op with
 * one rank. The group's buffers live on the training device, so on a GPU the values go
 * through a small device buffer. */
static rt_status all_reduce_host(run *r, void *v, size_t n, rt_dtype t, rt_reduce_op op) {
    if (!r->pg) return RT_OK;
    if (!rt_device_is_cuda(r->dev)) return rt_all_reduce(r->pg, v, n, t, op);
    size_t bytes = n * rt_dtype_size(t);
    RT_REQUIRE(bytes <= SCRATCH_BYTES, RT_ERR_INTERNAL, "all_reduce_host: %zu bytes", bytes);
    RT_CHECK(rt_memcpy(r->scratch_dev, r->dev, v, rt_device_cpu(), bytes, r->ctx->stream));
    RT_CHECK(rt_all_reduce(r->pg, r->scratch_dev, n, t, op)); /* ordered after the copy (the group's stream) */
    RT_CHECK(rt_memcpy(v, rt_device_cpu(), r->scratch_dev, r->dev, bytes, r->ctx->stream));
    return rt_model_ctx_sync(r->ctx);
}
static rt_status all_reduce_f64(run *r, double *v, size_t n, rt_reduce_op op) {
    return all_reduce_host(r, v, n, RT_F64, op);
}

/* ---- clean stops ------------------------------------------------------------------------ */

/* SIGINT or SIGTERM (to the launcher, which forwards it, or to any rank): finish the
 * step, write a checkpoint, exit. The ranks agree at every step (the flag travels with
 * the loss's all-reduce), so they all stop after the same step. */
static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) { g_stop_signal = sig; }

/* ---- setup --------------------------------------------------------------------------- */

static rt_status load_data(run *r) {
    const rt_config *c = r->cfg;
    rt_dataset_kind kind;
    RT_CHECK(rt_dataset_kind_parse(c->data.kind, &kind));
    rt_status s = rt_dataset_load(c->data.path, "train", kind, &r->train_ds);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "data.path: the training set"), s;
    r->have_train = true;
    s = rt_dataset_load(c->data.path, "test", kind, &r->test_ds);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "data.path: the test set"), s;
    r->have_test = true;
    if (c->data.train_subset > 0 && c->data.train_subset < r->train_ds.n) r->train_ds.n = c->data.train_subset;
    if (c->data.test_subset > 0 && c->data.test_subset < r->test_ds.n) r->test_ds.n = c->data.test_subset;
    return RT_OK;
}

/* FNV-1a over the parameters, and the buffers with `buffers` (host copies on a GPU).
 * Batch-norm buffers differ between ranks during training (each rank's own batch
 * statistics, as in DDP): they are compared only after rank 0's were broadcast. */
static rt_status param_checksum(run *r, bool buffers, uint64_t *out) {
    uint64_t h = 1469598103934665603ull;
    rt_arena *arenas[2] = {rt_model_params(r->model), rt_model_buffers(r->model)};
    for (int a = 0; a < (buffers ? 2 : 1); a++) {
        size_t n = arenas[a]->size;
        const unsigned char *p = arenas[a]->base;
        unsigned char *host = NULL;
        if (rt_device_is_cuda(r->dev)) {
            host = malloc(n);
            RT_CHECK_ALLOC(host, n);
            RT_CHECK(rt_model_ctx_sync(r->ctx));
            rt_status s = rt_memcpy(host, rt_device_cpu(), p, r->dev, n, NULL);
            if (s != RT_OK) {
                free(host);
                return s;
            }
            p = host;
        }
        for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
        free(host);
    }
    *out = h;
    return RT_OK;
}

/* Every rank holds identical parameters (and buffers): min and max of the checksum agree. */
static rt_status check_in_sync(run *r, bool buffers, const char *when) {
    if (!r->pg) return RT_OK;
    uint64_t h = 0;
    RT_CHECK(param_checksum(r, buffers, &h));
    int64_t lo = (int64_t)(h >> 1), hi = lo;
    RT_CHECK(all_reduce_host(r, &lo, 1, RT_I64, RT_OP_MIN));
    RT_CHECK(all_reduce_host(r, &hi, 1, RT_I64, RT_OP_MAX));
    RT_REQUIRE(lo == hi, RT_ERR_INTERNAL,
               "%s: the ranks' parameters differ (checksums from %llx to %llx; this rank %llx): a rank diverged", when,
               (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)(h >> 1));
    return RT_OK;
}

/* Rank 0's buffers (batch-norm running statistics, the only state the ranks' steps
 * leave different) and, with `params`, its parameters (at the start; afterwards they are
 * identical by construction and check_in_sync verifies it) to every rank. */
static rt_status broadcast_state(run *r, bool params) {
    if (!r->pg) return RT_OK;
    RT_CHECK(rt_model_ctx_sync(r->ctx));
    rt_arena *p = rt_model_params(r->model), *b = rt_model_buffers(r->model);
    if (params) RT_CHECK(rt_broadcast(r->pg, p->base, p->size / sizeof(float), RT_F32, 0));
    if (b->size) RT_CHECK(rt_broadcast(r->pg, b->base, b->size / sizeof(float), RT_F32, 0));
    return RT_OK;
}

/* The process group (none with one rank): dist.* keys, buffers on the training device. */
static rt_status setup_group(run *r) {
    const rt_config *c = r->cfg;
    if (r->who.world_size == 1) return RT_OK;
    rt_pg_options po;
    rt_pg_options_default(&po);
    po.init_method = c->dist.init_method;
    po.rank = r->who.rank;
    po.world_size = r->who.world_size;
    po.timeout_s = c->dist.timeout_s;
    RT_CHECK(rt_transport_parse(c->dist.transport, &po.transport));
    RT_CHECK(rt_algo_parse(c->dist.algo, &po.algo));
    po.device = r->dev;
    return rt_pg_init(&po, &r->pg);
}

/* The convolution algorithms recorded in the checkpoint this run resumes from, when both
 * are deterministic GPU runs; n = 0 otherwise (a fresh run, a CPU checkpoint, one written
 * with train.deterministic off, or this run has it off: the search chooses afresh). */
static rt_status checkpoint_conv_algos(run *r, rt_conv_algos *out) {
    out->n = 0;
    if (!r->resume_path[0] || !r->cfg->train.deterministic) return RT_OK;
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = rt_ckpt_verify(r->resume_path, &m);
    const char *dev = st == RT_OK ? rt_ckpt_meta_get(&m, "device") : NULL;
    const char *det = st == RT_OK ? rt_ckpt_meta_get(&m, "cudnn.deterministic") : NULL;
    if (dev && strcmp(dev, "cuda") == 0) {
        if (det && strcmp(det, "true") == 0) {
            st = rt_ckpt_meta_get_conv_algos(&m, "cudnn.conv_algos", out);
        } else {
            fprintf(r->out,
                    "ringtrain: %s chose its convolution algorithms with train.deterministic off: choosing afresh "
                    "(this resume is not bit-exact)\n",
                    r->resume_path);
            fflush(r->out);
        }
    }
    rt_ckpt_meta_free(&m);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "checkpoint.resume"), st;
    return RT_OK;
}

/* Rank 0's convolution algorithms to every rank (n = -1: rank 0 failed). The group's
 * buffers live on the GPU: through a device buffer, the copies finished on the host. */
static rt_status broadcast_conv_algos(run *r, rt_conv_algos *a) {
    void *buf = NULL;
    RT_CHECK(rt_malloc(r->dev, sizeof *a, &buf));
    rt_status st = rt_memcpy(buf, r->dev, a, rt_device_cpu(), sizeof *a, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    if (st == RT_OK) st = rt_broadcast(r->pg, buf, sizeof *a / sizeof(int32_t), RT_I32, 0);
    if (st == RT_OK) st = rt_memcpy(a, rt_device_cpu(), buf, r->dev, sizeof *a, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    rt_free(r->dev, buf);
    return st;
}

/* The model, running the same convolution algorithms on every rank. On a GPU rank 0
 * takes the checkpoint's choice (a deterministic resume) and searches the shapes it
 * lacks; the other ranks take rank 0's choice (broadcast) instead of searching, so the
 * checkpoint's record (rank 0's) is what every rank ran. The CPU has nothing to choose. */
static rt_status create_model(run *r, const rt_model_config *mc) {
    if (!rt_device_is_cuda(r->dev)) return rt_model_create(mc, r->ctx, &r->model);
    rt_conv_algos *a = calloc(1, sizeof *a);
    RT_CHECK_ALLOC(a, sizeof *a);
    rt_status st = RT_OK;
    rt_error_record err;
    if (is_root(r)) {
        st = checkpoint_conv_algos(r, a);
        bool recorded = st == RT_OK && a->n > 0;
        if (st == RT_OK) st = rt_model_ctx_set_conv_algos(r->ctx, a);
        if (st == RT_OK) st = rt_model_create(mc, r->ctx, &r->model);
        if (st != RT_OK && recorded)
            rt_error_trace(__FILE__, __LINE__,
                           "the convolution algorithms recorded in the checkpoint (train.deterministic=false chooses "
                           "afresh; that resume is not bit-exact)");
        if (st == RT_OK) {
            rt_model_ctx_get_conv_algos(r->ctx, a);
            if (recorded) {
                fprintf(r->out, "ringtrain: the convolution algorithms of %s (%d shapes)\n", r->resume_path, a->n);
                fflush(r->out);
            }
        } else {
            rt_error_save(&err);
            a->n = -1; /* tells the other ranks */
        }
    }
    if (r->pg) {
        rt_status bs = broadcast_conv_algos(r, a);
        if (st == RT_OK) st = bs;
    }
    if (st == RT_OK && !is_root(r)) {
        if (a->n < 0)
            st = RT_ERROR(RT_ERR_INVALID, "rank 0 could not create the model (its error says why)");
        else
            st = rt_model_ctx_set_conv_algos(r->ctx, a);
        if (st == RT_OK) st = rt_model_create(mc, r->ctx, &r->model);
    }
    bool root_failed = is_root(r) && a->n < 0;
    free(a);
    if (root_failed) return rt_error_restore(&err);
    return st;
}

static rt_status setup_model(run *r) {
    const rt_config *c = r->cfg;
    rt_model_config mc;
    rt_model_config_default(&mc);
    RT_CHECK(rt_model_arch_parse(c->model.arch, &mc.arch));
    mc.in_channels = r->train_ds.c;
    mc.in_h = r->train_ds.h;
    mc.in_w = r->train_ds.w;
    mc.num_classes = c->model.num_classes == RT_CONFIG_AUTO ? r->train_ds.num_classes : (int)c->model.num_classes;
    if (strcmp(c->model.stem, "auto") == 0)
        mc.stem = r->train_ds.h >= 32 ? RT_STEM_CIFAR : RT_STEM_IMAGENET;
    else
        RT_CHECK(rt_stem_parse(c->model.stem, &mc.stem));
    mc.width = (int)c->model.width;
    mc.dropout = isnan(c->model.dropout) ? -1.0f : (float)c->model.dropout;
    int per_rank = (int)(c->data.batch_size / r->who.world_size);
    int64_t eval_global = c->data.eval_batch_size == RT_CONFIG_AUTO ? c->data.batch_size : c->data.eval_batch_size;
    int eval_per_rank = (int)(eval_global / r->who.world_size);
    if (eval_per_rank < 1) eval_per_rank = 1;
    mc.max_batch = per_rank > eval_per_rank ? per_rank : eval_per_rank;

    rt_model_ctx_options o = {.device = r->dev};
    if (c->train.threads == RT_CONFIG_AUTO) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = (int)(cores / (r->who.local_world_size > 0 ? r->who.local_world_size : 1));
        if (o.threads < 1) o.threads = 1;
    } else {
        o.threads = (int)c->train.threads;
    }
    o.precision = strcmp(c->train.precision, "tf32") == 0 ? RT_PRECISION_TF32 : RT_PRECISION_FP32;
    o.deterministic = c->train.deterministic;
    RT_CHECK(rt_model_ctx_create(&o, &r->ctx));
    RT_CHECK(create_model(r, &mc));
    RT_CHECK(rt_model_init_weights(r->model, (uint64_t)c->train.seed));
    RT_CHECK(test_init_seed_rank(r));
    /* dropout masks differ between ranks (as torch's per-process RNG) but are reproducible */
    rt_model_set_dropout_seed(r->model, (uint64_t)c->train.seed * 1000003u + (uint64_t)r->who.rank);
    if (rt_device_is_cuda(r->dev)) {
        size_t img = rt_dataset_image_bytes(&r->train_ds);
        RT_CHECK(rt_malloc(r->dev, sizeof(float) * img * (size_t)mc.max_batch, (void **)&r->x_dev));
        RT_CHECK(rt_malloc(r->dev, sizeof(int64_t) * (size_t)mc.max_batch, (void **)&r->label_dev));
        RT_CHECK(rt_malloc(r->dev, SCRATCH_BYTES, &r->scratch_dev));
        RT_CHECK(rt_host_alloc(sizeof *r->vals_host, true, (void **)&r->vals_host, &r->vals_pinned));
        RT_CHECK(rt_event_create(r->dev, &r->ev_vals));
    }
    r->out_host = malloc(sizeof(float) * (size_t)mc.max_batch * (size_t)mc.num_classes);
    RT_CHECK_ALLOC(r->out_host, sizeof(float) * (size_t)mc.max_batch * (size_t)mc.num_classes);
    return RT_OK;
}

/* The test loader, and with `train` the training loader. */
static rt_status setup_loaders(run *r, bool train) {
    const rt_config *c = r->cfg;
    rt_loader_config lc = rt_loader_config_default(&r->train_ds);
    RT_CHECK(rt_sampler_mode_parse(c->data.sampler, &lc.mode));
    lc.world_size = r->who.world_size;
    lc.rank = r->who.rank;
    lc.global_batch = c->data.batch_size;
    lc.seed = (uint64_t)c->train.seed;
    lc.shuffle = c->data.shuffle;
    lc.drop_last = c->data.drop_last;
    lc.augment = c->data.augment;
    lc.crop_pad = c->data.crop_pad == RT_CONFIG_AUTO ? -1 : (int)c->data.crop_pad;
    lc.hflip = c->data.hflip == RT_CONFIG_AUTO ? -1 : (int)c->data.hflip;
    lc.prefetch = (int)c->data.prefetch;
    lc.device = r->dev;
    if (train) RT_CHECK(rt_loader_create(&lc, &r->train_loader));

    rt_loader_config ec = rt_loader_config_default(&r->test_ds);
    ec.mode = RT_SAMPLER_EVAL;
    ec.world_size = r->who.world_size;
    ec.rank = r->who.rank;
    int64_t eval_global = c->data.eval_batch_size == RT_CONFIG_AUTO ? c->data.batch_size : c->data.eval_batch_size;
    int64_t per = eval_global / r->who.world_size;
    ec.global_batch = (per < 1 ? 1 : per) * r->who.world_size;
    ec.shuffle = false;
    ec.augment = false;
    ec.prefetch = (int)c->data.prefetch;
    ec.device = r->dev;
    RT_CHECK(rt_loader_create(&ec, &r->test_loader));
    if (!train) return RT_OK;
    r->steps_per_epoch = rt_loader_batches_per_epoch(r->train_loader);
    /* every rank must take the same number of steps (their collectives pair up) */
    if (r->pg) {
        int64_t lo = r->steps_per_epoch, hi = lo;
        RT_CHECK(all_reduce_host(r, &lo, 1, RT_I64, RT_OP_MIN));
        RT_CHECK(all_reduce_host(r, &hi, 1, RT_I64, RT_OP_MAX));
        RT_REQUIRE(lo == hi, RT_ERR_INVALID,
                   "ranks would take %lld to %lld steps per epoch (data.sampler partition with a dataset that does not "
                   "split evenly; use data.sampler: distributed)",
                   (long long)lo, (long long)hi);
    }
    RT_REQUIRE(r->steps_per_epoch > 0, RT_ERR_INVALID,
               "data: %lld training samples give no batch of %lld on %d rank(s)", (long long)r->train_ds.n,
               (long long)c->data.batch_size, r->who.world_size);
    r->total_steps = r->steps_per_epoch * c->train.epochs;
    if (c->train.max_steps > 0 && c->train.max_steps < r->total_steps) r->total_steps = c->train.max_steps;
    return RT_OK;
}

static rt_status setup_optim(run *r) {
    const rt_config *c = r->cfg;
    rt_optim_kind kind;
    RT_CHECK(rt_optim_kind_parse(c->optim.name, &kind));
    rt_optim_config oc;
    rt_optim_config_default(&oc, kind);
    if (!isnan(c->optim.lr)) oc.lr = c->optim.lr;
    if (!isnan(c->optim.weight_decay)) oc.weight_decay = c->optim.weight_decay;
    oc.momentum = c->optim.momentum;
    oc.dampening = c->optim.dampening;
    oc.nesterov = c->optim.nesterov;
    oc.beta1 = c->optim.betas[0];
    oc.beta2 = c->optim.betas[1];
    oc.eps = c->optim.eps;
    oc.amsgrad = c->optim.amsgrad;
    size_t n = rt_model_params(r->model)->size / sizeof(float);
    if (c->optim.no_decay_bn_bias) {
        int np = rt_model_param_count(r->model);
        r->no_decay = calloc((size_t)np, sizeof *r->no_decay);
        RT_CHECK_ALLOC(r->no_decay, sizeof *r->no_decay * (size_t)np);
        for (int i = 0; i < np; i++) {
            const rt_param *p = rt_model_param(r->model, i);
            if (!rt_param_trainable(p) || rt_param_decays(p)) continue;
            r->no_decay[oc.n_no_decay++] =
                (rt_optim_range){p->value.offset / sizeof(float), (size_t)rt_tensor_numel(&p->value)};
        }
        oc.no_decay = r->no_decay;
    }
    rt_status s = rt_optim_config_validate(&oc, n);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "optim: the config's optimizer keys"), s;
    RT_CHECK(rt_optimizer_init(&r->opt, &oc, r->dev, n));
    r->have_opt = true;

    rt_sched_kind sk;
    RT_CHECK(rt_sched_kind_parse(c->optim.schedule, &sk));
    rt_schedule_default(&r->sched, sk, oc.lr);
    rt_schedule *sc = &r->sched;
    sc->per_epoch = strcmp(c->optim.interval, "epoch") == 0;
    sc->steps_per_epoch = r->steps_per_epoch;
    int64_t units = sc->per_epoch ? (r->total_steps + r->steps_per_epoch - 1) / r->steps_per_epoch : r->total_steps;
    sc->step_size = c->optim.step_size;
    sc->gamma = c->optim.gamma;
    sc->n_milestones = c->optim.n_milestones;
    for (int i = 0; i < c->optim.n_milestones; i++) sc->milestones[i] = c->optim.milestones[i];
    sc->warmup_steps = c->optim.warmup_steps;
    sc->warmup_start_factor = c->optim.warmup_start_factor;
    sc->t_max = c->optim.t_max == RT_CONFIG_AUTO ? units - c->optim.warmup_steps : c->optim.t_max;
    if (sc->t_max < 1) sc->t_max = 1;
    sc->eta_min = c->optim.eta_min;
    sc->max_lr = isnan(c->optim.max_lr) ? oc.lr : c->optim.max_lr;
    sc->total_steps = c->optim.total_steps == RT_CONFIG_AUTO ? units : c->optim.total_steps;
    sc->pct_start = c->optim.pct_start;
    sc->anneal_linear = strcmp(c->optim.anneal, "linear") == 0;
    sc->div_factor = c->optim.div_factor;
    sc->final_div_factor = c->optim.final_div_factor;
    sc->three_phase = c->optim.three_phase;
    sc->cycle_momentum = c->optim.cycle_momentum && (kind != RT_OPTIM_SGD || oc.momentum > 0);
    sc->base_momentum = c->optim.base_momentum;
    sc->max_momentum = c->optim.max_momentum;
    s = rt_schedule_validate(sc);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "optim: the config's schedule keys"), s;
    RT_CHECK(rt_grad_clip_init(&r->clip, r->dev));
    r->have_clip = true;
    return RT_OK;
}

static rt_status setup_reducer(run *r) {
    if (!r->pg) return RT_OK;
    int nb = rt_model_block_count(r->model);
    r->bounds = malloc(sizeof *r->bounds * (size_t)(nb + 1));
    RT_CHECK_ALLOC(r->bounds, sizeof *r->bounds * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) rt_model_block_range(r->model, b, &r->bounds[b], &r->bounds[b + 1]);
    rt_reducer_options ro;
    rt_reducer_options_default(&ro);
    ro.bucket_bytes = (size_t)(r->cfg->dist.bucket_mb * 1024 * 1024);
    ro.first_bucket_bytes = (size_t)(r->cfg->dist.first_bucket_mb * 1024 * 1024);
    if (ro.bucket_bytes == 0) ro.first_bucket_bytes = 0;
    ro.stream = r->ctx->stream; /* buckets are ordered after the backward work enqueued so far */
    return rt_reducer_create(r->pg, rt_model_grads(r->model)->base, r->bounds, nb, &ro, &r->reducer);
}

static rt_status on_grad_ready(void *user, int block, size_t begin, size_t end) {
    (void)block;
    run *r = user;
    return rt_reducer_ready(r->reducer, begin, end);
}

/* ---- evaluation ------------------------------------------------------------------------ */

static rt_status evaluate(run *r, double *loss, double *acc, int64_t *samples) {
    RT_CHECK(test_bn_perturb(r));
    RT_CHECK(broadcast_state(r, false)); /* batch-norm running statistics of rank 0 */
    const rt_model_config *mc = rt_model_config_of(r->model);
    int k = mc->num_classes;
    double sums[3] = {0, 0, 0}; /* loss * n, correct, n */
    RT_CHECK(rt_loader_start_epoch(r->test_loader, 0));
    for (;;) {
        rt_batch b;
        RT_CHECK(rt_loader_next(r->test_loader, &b));
        if (b.size == 0) break;
        const float *x = b.images;
        const int64_t *y = b.labels;
        if (rt_device_is_cuda(r->dev)) {
            size_t img = rt_dataset_image_bytes(&r->test_ds);
            RT_CHECK(rt_memcpy(r->x_dev, r->dev, b.images, rt_device_cpu(), sizeof(float) * img * (size_t)b.size,
                               r->ctx->stream));
            RT_CHECK(rt_memcpy(r->label_dev, r->dev, b.labels, rt_device_cpu(), sizeof(int64_t) * (size_t)b.size,
                               r->ctx->stream));
            RT_CHECK(rt_loader_release_after(r->test_loader, &b, r->ctx->stream)); /* the pinned slot, after the copy */
            x = r->x_dev;
            y = r->label_dev;
        }
        RT_CHECK(rt_model_forward(r->model, x, b.size, false));
        RT_CHECK(rt_model_loss(r->model, y));
        RT_CHECK(rt_memcpy(r->out_host, rt_device_cpu(), rt_model_output(r->model), r->dev,
                           sizeof(float) * (size_t)b.size * (size_t)k, r->ctx->stream));
        float l; /* rt_model_loss_value syncs the model's stream: the logits above are in too */
        RT_CHECK(rt_model_loss_value(r->model, &l));
        const int64_t *labels = b.labels; /* host copy */
        for (int i = 0; i < b.size; i++) {
            const float *o = r->out_host + (size_t)i * (size_t)k;
            int best = 0;
            for (int j = 1; j < k; j++)
                if (o[j] > o[best]) best = j;
            sums[1] += best == labels[i];
        }
        sums[0] += (double)l * b.size;
        sums[2] += b.size;
    }
    RT_CHECK(all_reduce_f64(r, sums, 3, RT_OP_SUM));
    *samples = (int64_t)sums[2];
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    return RT_OK;
}

/* ---- timing ---------------------------------------------------------------------------- */

static rt_status log_record(run *r, rt_step_record *rec) {
    rec->images_per_s = rec->ms[RT_STAGE_STEP] > 0 ? (double)rec->images / (rec->ms[RT_STAGE_STEP] * 1e-3) : 0;
    RT_CHECK(rt_stage_stats_add(r->stats, rec));
    if (r->metrics) RT_CHECK(rt_metrics_step(r->metrics, rec));
    if (r->rank_metrics) RT_CHECK(rt_metrics_step(r->rank_metrics, rec));
    if (is_root(r)) rt_progress_step(&r->progress, rec);
    return RT_OK;
}

/* Complete pending record p if its events are ready (always on the CPU); `force` waits,
 * only when the record is not complete yet (two steps back it always is on a GPU: each
 * step waits for its own scalars). */
static rt_status complete(run *r, pending *p, bool force) {
    if (!p->waiting) return RT_OK;
    float ms[EV_COUNT - 1];
    if (force) {
        bool ready = false;
        RT_CHECK(rt_event_query(p->ev[EV_END], &ready));
        if (!ready) RT_CHECK(rt_event_sync(p->ev[EV_END]));
    }
    for (int i = 0; i < EV_COUNT - 1; i++) {
        bool ready = false;
        RT_CHECK(rt_event_elapsed_ms(p->ev[i], p->ev[i + 1], &ms[i], &ready));
        if (!ready) return RT_OK; /* a step later */
    }
    rt_step_record *rec = &p->rec;
    rec->ms[RT_STAGE_H2D] = ms[EV_START];
    rec->ms[RT_STAGE_FORWARD] = ms[EV_H2D];
    rec->ms[RT_STAGE_BACKWARD] = ms[EV_FWD];
    rec->ms[RT_STAGE_COMM] = ms[EV_BWD];
    rec->ms[RT_STAGE_OPTIM] = ms[EV_COMM];
    rec->ms[RT_STAGE_STEP] = rec->ms[RT_STAGE_DATA];
    for (int i = 0; i < EV_COUNT - 1; i++) rec->ms[RT_STAGE_STEP] += ms[i];
    p->waiting = false;
    return log_record(r, rec);
}

/* Complete the pending records oldest first (`force`: wait for them): a record is never
 * logged before the one of the step before it, which may still be pending when its
 * events were not ready a step late (metrics.jsonl must count up: `ringtrain report`
 * reads a smaller step as a rewind and drops the lines before it). */
static rt_status complete_in_order(run *r, bool force) {
    pending *old = &r->pend[0], *young = &r->pend[1];
    if (young->waiting && (!old->waiting || young->rec.step < old->rec.step)) {
        old = &r->pend[1];
        young = &r->pend[0];
    }
    RT_CHECK(complete(r, old, force));
    if (old->waiting) return RT_OK; /* not ready: the younger one waits behind it */
    return complete(r, young, force);
}

/* ---- one step --------------------------------------------------------------------------- */

/* What the host must know after backward: the loss averaged over the ranks, whether any
 * rank was asked to stop, and the gradient norm (clipping, non-finite steps). On a GPU
 * the three come back together after one host wait: the loss and the stop flag are
 * all-reduced on the device (ordered on the model stream, no host wait), the sum of
 * squares is computed there, and one copy + event brings them to pinned memory. */
static rt_status step_scalars(run *r, double *loss, bool *stop, double *norm) {
    rt_stream *st = r->ctx->stream;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    if (!rt_device_is_cuda(r->dev)) {
        float lf;
        RT_CHECK(rt_model_loss_value(r->model, &lf));
        double agree[2] = {lf, g_stop_signal ? 1.0 : 0.0}; /* the mean loss; any rank asked to stop */
        RT_CHECK(all_reduce_f64(r, agree, 2, RT_OP_SUM));
        *loss = agree[0] / r->who.world_size;
        *stop = agree[1] > 0;
        return rt_grad_norm(&r->clip, grads, n, st, norm);
    }
    float flag = g_stop_signal ? 1.0f : 0.0f;
    float *sc = r->scratch_dev;
    RT_CHECK(rt_memcpy(sc, r->dev, rt_model_loss_ptr(r->model), r->dev, sizeof(float), st));
    RT_CHECK(rt_memcpy(sc + 1, r->dev, &flag, rt_device_cpu(), sizeof flag, st));
    if (r->pg) {
        rt_request *q = NULL;
        RT_CHECK(rt_iall_reduce(r->pg, sc, 2, RT_F32, RT_OP_SUM, &q)); /* after the copies: the group's stream */
        RT_CHECK(rt_wait_stream(q, st)); /* on the device: the copy below waits for it */
    }
    RT_CHECK(rt_grad_sumsq_async(&r->clip, grads, n, st, &r->vals_host->sumsq));
    RT_CHECK(rt_memcpy(r->vals_host->loss_stop, rt_device_cpu(), sc, r->dev, 2 * sizeof(float), st));
    RT_CHECK(rt_event_record(r->ev_vals, st));
    RT_CHECK(rt_event_sync(r->ev_vals)); /* the step's one host wait */
    *loss = (double)r->vals_host->loss_stop[0] / r->who.world_size;
    *stop = r->vals_host->loss_stop[1] > 0;
    *norm = sqrt(r->vals_host->sumsq);
    return RT_OK;
}

static rt_status train_step(run *r, const rt_batch *b, double data_ms, int64_t epoch) {
    const rt_config *c = r->cfg;
    pending *p = &r->pend[r->step % 2];
    RT_CHECK(complete(r, p, true)); /* two steps back (the older pending record): surely done */
    rt_stream *st = r->ctx->stream;
    RT_CHECK(rt_event_record(p->ev[EV_START], st));
    const float *x = b->images;
    const int64_t *y = b->labels;
    if (rt_device_is_cuda(r->dev)) {
        size_t img = rt_dataset_image_bytes(&r->train_ds);
        RT_CHECK(rt_memcpy(r->x_dev, r->dev, b->images, rt_device_cpu(), sizeof(float) * img * (size_t)b->size, st));
        RT_CHECK(rt_memcpy(r->label_dev, r->dev, b->labels, rt_device_cpu(), sizeof(int64_t) * (size_t)b->size, st));
        /* the pinned slot is refilled only after these copies ran, not when the host
         * asks for the next batch (the copies may not have started by then) */
        RT_CHECK(rt_loader_release_after(r->train_loader, b, st));
        x = r->x_dev;
        y = r->label_dev;
    }
    RT_CHECK(rt_event_record(p->ev[EV_H2D], st));
    RT_CHECK(rt_model_forward(r->model, x, b->size, true));
    RT_CHECK(rt_model_loss(r->model, y));
    RT_CHECK(rt_event_record(p->ev[EV_FWD], st));
    if (r->reducer) RT_CHECK(rt_reducer_begin(r->reducer));
    RT_CHECK(rt_model_backward(r->model, r->reducer ? on_grad_ready : NULL, r));
    RT_CHECK(rt_event_record(p->ev[EV_BWD], st));
    rt_reducer_stats rs = {0};
    if (r->reducer) {
        RT_CHECK(rt_reducer_finish(r->reducer));
        rt_reducer_stats_get(r->reducer, &rs);
    }
    RT_CHECK(rt_event_record(p->ev[EV_COMM], st));
    /* the loss averaged over the ranks (for the logs), the stop flag, the norm */
    double loss = 0, norm = 0;
    RT_CHECK(step_scalars(r, &loss, &r->stop, &norm));
    /* clip (the norm is logged either way), then the optimizer at the schedule's lr */
    rt_grad_stats gs;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    RT_CHECK(rt_grad_clip_apply(&r->clip, grads, n, c->optim.clip_grad_norm, norm, st, &gs));
    double lr = rt_schedule_lr(&r->sched, r->step);
    double mom;
    if (rt_schedule_momentum(&r->sched, r->step, &mom)) RT_CHECK(rt_optimizer_set_momentum(&r->opt, mom));
    bool skipped = false;
    if (!gs.finite || !isfinite(loss)) {
        RT_REQUIRE(c->train.skip_nonfinite, RT_ERR_INVALID,
                   "step %lld (epoch %lld): non-finite %s (loss %g, gradient norm %g) on rank %d; set "
                   "train.skip_nonfinite: true to skip such steps",
                   (long long)r->step + 1, (long long)epoch, gs.finite ? "loss" : "gradient", loss, gs.norm,
                   r->who.rank);
        skipped = true;
        RT_LOG_WARN("step %lld: non-finite loss or gradient, step skipped", (long long)r->step + 1);
    } else {
        RT_CHECK(rt_optimizer_step_arena(&r->opt, rt_model_params(r->model), rt_model_grads(r->model), lr, st));
    }
    RT_CHECK(rt_event_record(p->ev[EV_END], st));
    r->step++;
    p->rec = (rt_step_record){.step = r->step,
                              .epoch = epoch,
                              .batch = b->index,
                              .rank = r->who.rank,
                              .comm_busy_ms = rs.busy_ms,
                              .images = (int64_t)b->size * r->who.world_size,
                              .loss = loss,
                              .lr = lr,
                              .grad_norm = gs.norm,
                              .time_s = (double)(rt_now_ns() - r->t0) * 1e-9,
                              .skipped = skipped};
    p->rec.ms[RT_STAGE_DATA] = data_ms;
    p->waiting = true;
    RT_CHECK(complete_in_order(r, false)); /* the step before first, if it is still pending */
    RT_CHECK(test_perturb_at(r));
    if (c->dist.check_sync_every > 0 && r->step % c->dist.check_sync_every == 0) {
        char when[64];
        snprintf(when, sizeof when, "step %lld", (long long)r->step);
        RT_CHECK(check_in_sync(r, false, when));
    }
    return RT_OK;
}

/* ---- checkpoints ------------------------------------------------------------------------- */

/* ---- test-only hooks (tests/train/guards.sh) ------------------------------------------- */

/* Each makes one rank break a distributed guarantee that the trainer must repair or
 * detect, so a test can fail when the repair or the check is missing:
 *   RINGTRAIN_TEST_INIT_SEED_RANK=<rank>     that rank initialises its weights from
 *       train.seed + 1 (rank 0's weights broadcast at start must replace them);
 *   RINGTRAIN_TEST_PERTURB_AT=<rank>:<step>  after step <step>, that rank adds 1e-3 to its
 *       first parameter (a diverged rank: dist.check_sync_every must name the step);
 *   RINGTRAIN_TEST_BN_PERTURB=<rank>         before every evaluation, that rank scales its
 *       batch-norm running means and variances by 4 (evaluation uses rank 0's). */
static bool test_env_rank(const run *r, const char *name, long long *step) {
    const char *v = getenv(name);
    if (!v || !*v || !r->pg) return false;
    char *end = NULL;
    long long rank = strtoll(v, &end, 10);
    if (step) {
        if (*end != ':') return false;
        *step = strtoll(end + 1, &end, 10);
    }
    return !*end && rank == r->who.rank;
}

/* x[i] = x[i] * mul + add for n floats of the model's device */
static rt_status test_edit_floats(run *r, float *x, size_t n, float mul, float add) {
    float *h = x;
    if (rt_device_is_cuda(r->dev)) {
        RT_CHECK(rt_model_ctx_sync(r->ctx));
        h = malloc(n * sizeof *h);
        RT_CHECK_ALLOC(h, n * sizeof *h);
        rt_status s = rt_memcpy(h, rt_device_cpu(), x, r->dev, n * sizeof *h, NULL);
        if (s != RT_OK) return free(h), s;
    }
    for (size_t i = 0; i < n; i++) h[i] = h[i] * mul + add;
    if (h == x) return RT_OK;
    rt_status s = rt_memcpy(x, r->dev, h, rt_device_cpu(), n * sizeof *h, NULL);
    free(h);
    return s;
}

static rt_status test_init_seed_rank(run *r) {
    if (!test_env_rank(r, "RINGTRAIN_TEST_INIT_SEED_RANK", NULL)) return RT_OK;
    return rt_model_init_weights(r->model, (uint64_t)r->cfg->train.seed + 1);
}

static rt_status test_perturb_at(run *r) {
    long long at = -1;
    if (!test_env_rank(r, "RINGTRAIN_TEST_PERTURB_AT", &at) || at != (long long)r->step) return RT_OK;
    return test_edit_floats(r, rt_model_params(r->model)->base, 1, 1.0f, 1e-3f);
}

static rt_status test_bn_perturb(run *r) {
    if (!test_env_rank(r, "RINGTRAIN_TEST_BN_PERTURB", NULL)) return RT_OK;
    for (int i = 0; i < rt_model_param_count(r->model); i++) {
        const rt_param *p = rt_model_param(r->model, i);
        if (p->kind == RT_PARAM_BUFFER && p->value.dtype == RT_F32)
            RT_CHECK(test_edit_floats(r, rt_tensor_data(&p->value), (size_t)rt_tensor_numel(&p->value), 4.0f, 0.0f));
    }
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_KILL_AFTER_CKPT=<step> makes rank 0, once the checkpoint of
 * that step is complete, SIGKILL its parent when ringtrain's launcher started it (its
 * ranks then die with it, PR_SET_PDEATHSIG) and itself (one rank: there is no launcher): a crash at an exact point, where a test that polls for the
 * checkpoint and then kills races with the run (which may have pruned it by then). */
static void test_kill_after_checkpoint(run *r) {
    const char *v = getenv("RINGTRAIN_TEST_KILL_AFTER_CKPT");
    if (!v || !*v || !is_root(r)) return;
    char *end = NULL;
    long long at = strtoll(v, &end, 10);
    if (*end || at != (long long)r->step) return;
    fflush(NULL);
    if (getenv("RINGTRAIN_JOB_TOKEN")) kill(getppid(), SIGKILL); /* ringtrain's launcher forked this rank */
    kill(getpid(), SIGKILL);
}

/* Rank 0 writes ckpt-<step>/ after rank 0's batch-norm buffers reached every rank; the
 * others wait for the outcome, so a failed write (disk full, permissions) stops every
 * rank with rank 0's error and leaves the earlier checkpoints as they were. */
static rt_status save_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, const char *why) {
    const rt_config *c = r->cfg;
    RT_CHECK(broadcast_state(r, false));
    rt_status st = RT_OK;
    rt_error_record err;
    char path[RT_CKPT_PATH_MAX] = "";
    if (is_root(r)) {
        rt_ckpt_meta m;
        rt_ckpt_meta_init(&m);
        char *yaml = NULL;
        size_t ylen = 0;
        FILE *mf = open_memstream(&yaml, &ylen);
        if (!mf) st = RT_ERROR(RT_ERR_NOMEM, "checkpoint: the config text");
        if (st == RT_OK) st = rt_config_write(c, mf);
        if (mf) fclose(mf);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "epoch", epoch);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "epoch_batches", epoch_batches);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "world_size", r->who.world_size);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "global_batch", c->data.batch_size);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "seed", c->train.seed);
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "device", rt_device_is_cuda(r->dev) ? "cuda" : "cpu");
        if (st == RT_OK && rt_device_is_cuda(r->dev)) {
            rt_conv_algos algos; /* what every rank ran (rank 0's choice: create_model) */
            rt_model_ctx_get_conv_algos(r->ctx, &algos);
            st = rt_ckpt_meta_set(&m, "cudnn.deterministic", r->ctx->deterministic ? "true" : "false");
            if (st == RT_OK) st = rt_ckpt_meta_set_conv_algos(&m, "cudnn.conv_algos", &algos);
        }
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "config", yaml ? yaml : "");
        free(yaml);
        if (st == RT_OK)
            st = rt_ckpt_write(r->ckpt_dir, r->step, r->model, &r->opt, &m, (int)c->checkpoint.keep_last, path,
                               sizeof path);
        rt_ckpt_meta_free(&m);
        if (st != RT_OK) rt_error_save(&err);
    }
    double ok = st == RT_OK;
    RT_CHECK(all_reduce_f64(r, &ok, 1, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err);
    RT_REQUIRE(ok > 0, RT_ERR_IO, "rank 0 could not write the checkpoint of step %lld (its error says why)",
               (long long)r->step);
    if (r->metrics) {
        char fields[2 * RT_CKPT_PATH_MAX + 128];
        /* the path as a JSON string (a '"' or '\\' in checkpoint.dir must not break the line) */
        json_t *js = json_string(path);
        char *enc = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        snprintf(fields, sizeof fields, "\"step\": %lld, \"epoch\": %lld, \"why\": \"%s\", \"path\": %s",
                 (long long)r->step, (long long)epoch, why, enc ? enc : "null");
        free(enc);
        RT_CHECK(rt_metrics_line(r->metrics, "checkpoint", fields));
    }
    test_kill_after_checkpoint(r);
    return RT_OK;
}

/* Keep the lines of a metrics file up to `step` (a resumed run logs the steps after its
 * checkpoint again): no gap, no duplicate. Lines without a "step" field are kept. */
static rt_status truncate_metrics(const char *path, int64_t step) {
    FILE *f = fopen(path, "r");
    if (!f) return RT_OK; /* nothing logged yet */
    char tmp[RT_CONFIG_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *o = fopen(tmp, "w");
    if (!o) {
        fclose(f);
        return RT_ERROR(RT_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') break; /* a line cut short by a kill */
        const char *k = strstr(line, "\"step\": ");
        long long s = -1;
        if (k && sscanf(k + 8, "%lld", &s) == 1 && s > step) continue;
        fputs(line, o);
    }
    free(line);
    fclose(f);
    if (fclose(o) != 0 || rename(tmp, path) != 0) return RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
    return RT_OK;
}

/* checkpoint.resume: auto (the newest complete checkpoint of checkpoint.dir, if any),
 * none, or a path, into r->resume_path ("": a fresh run). Found before the model is made
 * (a GPU resume takes the checkpoint's convolution algorithms); every rank looks (they
 * all see the same files). */
static rt_status find_resume(run *r) {
    const rt_config *c = r->cfg;
    r->resume_path[0] = '\0';
    if (strcmp(c->checkpoint.resume, "none") == 0) return RT_OK;
    if (strcmp(c->checkpoint.resume, "auto") != 0) {
        snprintf(r->resume_path, sizeof r->resume_path, "%s", c->checkpoint.resume);
        return RT_OK;
    }
    rt_train_ckpt_dir(c, r->ckpt_dir, sizeof r->ckpt_dir);
    rt_ckpt_found found;
    RT_CHECK(rt_ckpt_find(r->ckpt_dir, &found));
    if (is_root(r))
        for (int i = 0; i < found.n_skipped; i++)
            RT_LOG_WARN("checkpoint %s refused: %s; trying the one before", found.skipped[i].path,
                        found.skipped[i].reason);
    snprintf(r->resume_path, sizeof r->resume_path, "%s", found.path); /* "": nothing to resume */
    return RT_OK;
}

/* Load r->resume_path (find_resume). Every rank loads it. */
static rt_status resume(run *r) {
    const rt_config *c = r->cfg;
    r->resumed_step = -1;
    if (!r->resume_path[0]) return RT_OK;
    const char *path = r->resume_path;
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    int64_t step = 0, epoch = 0, batches = 0, world = 0, batch = 0;
    rt_status st = rt_ckpt_load(path, r->model, &r->opt, &m);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch", &epoch);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch_batches", &batches);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "world_size", &world);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "global_batch", &batch);
    rt_ckpt_meta_free(&m);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "checkpoint.resume"), st;
    RT_REQUIRE(batch == c->data.batch_size, RT_ERR_INVALID,
               "checkpoint %s was trained with data.batch_size %lld, this run has %lld: resume with the same global "
               "batch (checkpoint.resume: none starts afresh)",
               path, (long long)batch, (long long)c->data.batch_size);
    r->step = step;
    r->start_epoch = epoch;
    r->start_batches = batches;
    r->resumed_step = step;
    if (is_root(r)) {
        fprintf(r->out, "ringtrain: resuming from %s (step %lld, epoch %lld, batch %lld)\n", path, (long long)step,
                (long long)epoch + 1, (long long)batches);
        if (world != r->who.world_size)
            fprintf(r->out,
                    "ringtrain: the checkpoint was written by %lld rank(s), this run has %d: the rest of epoch %lld is "
                    "re-partitioned over %d rank(s)\n",
                    (long long)world, r->who.world_size, (long long)epoch + 1, r->who.world_size);
        fflush(r->out);
    }
    return RT_OK;
}

/* ---- the run ------------------------------------------------------------------------------ */

static void run_free(run *r) {
    for (int i = 0; i < 2; i++)
        for (int e = 0; e < EV_COUNT; e++) rt_event_destroy(r->pend[i].ev[e]);
    rt_metrics_close(r->metrics);
    rt_metrics_close(r->rank_metrics);
    rt_stage_stats_destroy(r->stats);
    rt_loader_destroy(r->train_loader);
    rt_loader_destroy(r->test_loader);
    rt_reducer_destroy(r->reducer);
    free(r->bounds);
    if (r->have_opt) rt_optimizer_free(&r->opt);
    if (r->have_clip) rt_grad_clip_free(&r->clip);
    free(r->no_decay);
    free(r->out_host);
    if (r->x_dev) rt_free(r->dev, r->x_dev);
    if (r->label_dev) rt_free(r->dev, r->label_dev);
    if (r->scratch_dev) rt_free(r->dev, r->scratch_dev);
    if (r->vals_host) rt_host_free(r->vals_host, r->vals_pinned);
    rt_event_destroy(r->ev_vals);
    rt_model_destroy(r->model);
    rt_model_ctx_destroy(r->ctx);
    rt_pg_destroy(r->pg);
    if (r->have_train) rt_dataset_free(&r->train_ds);
    if (r->have_test) rt_dataset_free(&r->test_ds);
}

static rt_status train_all(run *r, rt_train_result *res) {
    const rt_config *c = r->cfg;
    FILE *out = r->out;
    RT_CHECK(rt_train_check_world(c, r->who.world_size));
    rt_train_run_dir(c, r->run_dir, sizeof r->run_dir);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    if (is_root(r)) RT_CHECK(rt_file_mkdirs(r->run_dir, "run directory"));
    RT_CHECK(rt_device_select(c->train.device, r->who.local_rank, &r->dev));
    RT_CHECK(load_data(r));
    RT_CHECK(setup_group(r));
    RT_CHECK(find_resume(r));
    RT_CHECK(setup_model(r));
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream); /* the stream contract (docs/dist.md) */
    RT_CHECK(broadcast_state(r, true));
    RT_CHECK(check_in_sync(r, true, "after the initial broadcast"));
    RT_CHECK(setup_loaders(r, true));
    RT_CHECK(setup_optim(r));
    rt_train_ckpt_dir(c, r->ckpt_dir, sizeof r->ckpt_dir);
    RT_CHECK(resume(r));
    if (r->resumed_step >= 0) RT_CHECK(check_in_sync(r, true, "after loading the checkpoint"));
    RT_CHECK(setup_reducer(r));
    RT_CHECK(rt_stage_stats_create(&r->stats));
    for (int i = 0; i < 2; i++)
        for (int e = 0; e < EV_COUNT; e++) RT_CHECK(rt_event_create(r->dev, &r->pend[i].ev[e]));
    char path[RT_CONFIG_PATH_MAX + 64];
    bool resumed = r->resumed_step >= 0;
    if (is_root(r)) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", r->run_dir);
        if (resumed) RT_CHECK(truncate_metrics(path, r->step));
        RT_CHECK(rt_metrics_open(path, resumed, &r->metrics));
        snprintf(path, sizeof path, "%s/config.yaml", r->run_dir);
        RT_CHECK(rt_config_write_file(c, path));
        char fields[512], devs[32];
        snprintf(fields, sizeof fields,
                 "\"world_size\": %d, \"device\": \"%s\", \"steps_per_epoch\": %lld, \"total_steps\": %lld, "
                 "\"global_batch\": %lld, \"train_samples\": %lld, \"test_samples\": %lld, \"parameters\": %lld",
                 r->who.world_size, rt_device_str(r->dev, devs, sizeof devs), (long long)r->steps_per_epoch,
                 (long long)r->total_steps, (long long)c->data.batch_size, (long long)r->train_ds.n,
                 (long long)r->test_ds.n, (long long)rt_model_num_parameters(r->model));
        size_t fl = strlen(fields);
        if (resumed) snprintf(fields + fl, sizeof fields - fl, ", \"resumed_from_step\": %lld", (long long)r->step);
        RT_CHECK(rt_metrics_line(r->metrics, "start", fields));
    }
    if (c->log.all_ranks) {
        if (r->pg) RT_CHECK(rt_barrier(r->pg)); /* rank 0 made the folder */
        snprintf(path, sizeof path, "%s/metrics-rank%d.jsonl", r->run_dir, r->who.rank);
        if (resumed) RT_CHECK(truncate_metrics(path, r->step));
        RT_CHECK(rt_metrics_open(path, resumed, &r->rank_metrics));
    }
    bool tty = strcmp(c->log.progress, "on") == 0 || (strcmp(c->log.progress, "auto") == 0 && isatty(fileno(out)));
    rt_progress_init(&r->progress, out, tty, c->log.every_steps, c->train.epochs, r->steps_per_epoch, r->total_steps,
                     r->step);
    if (is_root(r)) {
        char devs[32];
        fprintf(out,
                "ringtrain: %s (width %lld) on %s, %d rank(s), global batch %lld, %lld steps/epoch, %lld steps; run "
                "directory %s\n",
                c->model.arch, (long long)c->model.width, rt_device_str(r->dev, devs, sizeof devs), r->who.world_size,
                (long long)c->data.batch_size, (long long)r->steps_per_epoch, (long long)r->total_steps, r->run_dir);
        fflush(out);
    }
    r->t0 = rt_now_ns();
    double loss = NAN, acc = NAN;
    int64_t samples = 0;
    int64_t epoch = r->start_epoch;
    int64_t saved_at = r->resumed_step; /* the step of the newest checkpoint */
    for (; epoch < c->train.epochs && r->step < r->total_steps && !r->stop; epoch++) {
        rt_stage_stats_reset(r->stats);
        if (epoch == r->start_epoch && r->start_batches > 0) {
            /* the resumed epoch: the batches not taken yet, re-partitioned if the world changed */
            int64_t pos = r->start_batches * rt_loader_batch_size(r->train_loader);
            int64_t len = rt_loader_samples_per_epoch(r->train_loader);
            RT_CHECK(rt_loader_restore(r->train_loader, (rt_loader_state){epoch, pos < len ? pos : len}));
        } else {
            RT_CHECK(rt_loader_start_epoch(r->train_loader, epoch));
        }
        int64_t next_batch = -1; /* -1: the epoch ran to its end */
        while (r->step < r->total_steps && !r->stop) {
            uint64_t t = rt_now_ns();
            rt_batch b;
            RT_CHECK(rt_loader_next(r->train_loader, &b));
            if (b.size == 0) {
                next_batch = -1;
                break;
            }
            RT_CHECK(train_step(r, &b, (double)(rt_now_ns() - t) * 1e-6, epoch));
            next_batch = b.index + 1 < r->steps_per_epoch ? b.index + 1 : -1;
            bool every = c->checkpoint.every_steps > 0 && r->step % c->checkpoint.every_steps == 0;
            if (r->stop || every) {
                RT_CHECK(complete_in_order(r, true));
                RT_CHECK(save_checkpoint(r, epoch, b.index + 1, r->stop ? "stop" : "every_steps"));
                saved_at = r->step;
            }
        }
        RT_CHECK(complete_in_order(r, true));
        if (r->stop) break;
        bool last = epoch + 1 == c->train.epochs || r->step >= r->total_steps;
        if (is_root(r)) {
            rt_progress_break(&r->progress);
            char title[64];
            snprintf(title, sizeof title, "epoch %lld/%lld", (long long)epoch + 1, (long long)c->train.epochs);
            rt_stage_stats_print(r->stats, out, title);
        }
        if (last || (c->train.eval_every > 0 && (epoch + 1) % c->train.eval_every == 0)) {
            RT_CHECK(evaluate(r, &loss, &acc, &samples));
            if (r->metrics) RT_CHECK(rt_metrics_eval(r->metrics, r->step, epoch, loss, acc, samples));
            if (is_root(r)) {
                fprintf(out, "epoch %lld: test loss %.4f, accuracy %.2f%% (%lld samples)\n", (long long)epoch + 1, loss,
                        100.0 * acc, (long long)samples);
                fflush(out);
            }
        }
        /* at the epoch's end, and always at the end of the run */
        bool every = c->checkpoint.every_epochs > 0 && (epoch + 1) % c->checkpoint.every_epochs == 0;
        if ((every || last) && saved_at != r->step) {
            /* train.max_steps can end the run in mid-epoch: the position is then the next
             * batch of this epoch, so a resume that trains longer does not skip its rest */
            if (next_batch >= 0)
                RT_CHECK(save_checkpoint(r, epoch, next_batch, "end"));
            else
                RT_CHECK(save_checkpoint(r, epoch + 1, 0, last ? "end" : "every_epochs"));
            saved_at = r->step;
        }
    }
    res->stopped = r->stop;
    res->stop_signal = (int)g_stop_signal;
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", r->ckpt_dir);
    res->resumed_step = r->resumed_step;
    if (r->stop) { /* a clean stop: the checkpoint is written, nothing else to do */
        res->steps = r->step;
        res->epochs = epoch;
        res->wall_s = (double)(rt_now_ns() - r->t0) * 1e-9;
        if (r->metrics) {
            char fields[128];
            snprintf(fields, sizeof fields, "\"step\": %lld, \"signal\": %d", (long long)r->step, (int)g_stop_signal);
            RT_CHECK(rt_metrics_line(r->metrics, "stop", fields));
        }
        if (r->pg) RT_CHECK(rt_barrier(r->pg));
        return RT_OK;
    }
    if (isnan(acc)) { /* resumed from the end of a finished run: nothing left to train */
        RT_CHECK(evaluate(r, &loss, &acc, &samples));
        if (r->metrics) RT_CHECK(rt_metrics_eval(r->metrics, r->step, epoch, loss, acc, samples));
    }
    RT_CHECK(check_in_sync(r, true, "at the end of training"));
    if (is_root(r)) { /* the trained weights, as torchvision's state_dict */
        snprintf(path, sizeof path, "%s/model.safetensors", r->run_dir);
        RT_CHECK(rt_model_ctx_sync(r->ctx));
        RT_CHECK(rt_model_save(r->model, path));
    }
    res->steps = r->step;
    res->epochs = epoch;
    res->test_loss = loss;
    res->test_accuracy = acc;
    res->test_samples = samples;
    res->wall_s = (double)(rt_now_ns() - r->t0) * 1e-9;
    if (r->metrics) {
        char fields[256];
        snprintf(fields, sizeof fields,
                 "\"steps\": %lld, \"wall_s\": %.3f, \"test_accuracy\": %.6f, \"test_loss\": %.6f",
                 (long long)res->steps, res->wall_s, acc, loss);
        RT_CHECK(rt_metrics_line(r->metrics, "end", fields));
    }
    if (r->pg) RT_CHECK(rt_barrier(r->pg));
    return RT_OK;
}

rt_status rt_train(const rt_config *cfg, const rt_train_rank *who, FILE *out, rt_train_result *res) {
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.who = *who;
    r.out = out ? out : stdout;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    rt_status s = train_all(&r, res);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    rt_error_record saved;
    if (s != RT_OK) rt_error_save(&saved); /* freeing must not lose the first error */
    run_free(&r);
    if (s != RT_OK) rt_error_restore(&saved);
    return s;
}

/* ---- evaluation of a checkpoint ---------------------------------------------------------- */

static rt_status eval_all(run *r, const char *ckpt, rt_train_result *res) {
    const rt_config *c = r->cfg;
    rt_train_run_dir(c, r->run_dir, sizeof r->run_dir);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", ckpt);
    RT_CHECK(rt_device_select(c->train.device, r->who.local_rank, &r->dev));
    RT_CHECK(load_data(r));
    RT_CHECK(setup_group(r));
    snprintf(r->resume_path, sizeof r->resume_path, "%s", ckpt); /* its convolution algorithms (GPU) */
    RT_CHECK(setup_model(r));
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream);
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = rt_ckpt_load(ckpt, r->model, NULL, &m);
    int64_t step = 0;
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    rt_ckpt_meta_free(&m);
    RT_CHECK(st);
    RT_CHECK(setup_loaders(r, false));
    uint64_t t0 = rt_now_ns();
    RT_CHECK(evaluate(r, &res->test_loss, &res->test_accuracy, &res->test_samples));
    res->wall_s = (double)(rt_now_ns() - t0) * 1e-9;
    res->steps = step;
    if (r->pg) RT_CHECK(rt_barrier(r->pg));
    return RT_OK;
}

rt_status rt_evaluate(const rt_config *cfg, const rt_train_rank *who, const char *checkpoint, rt_train_result *res) {
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.who = *who;
    r.out = stdout;
    rt_status s = eval_all(&r, checkpoint, res);
    rt_error_record saved;
    if (s != RT_OK) rt_error_save(&saved);
    run_free(&r);
    if (s != RT_OK) rt_error_restore(&saved);
    return s;
}
