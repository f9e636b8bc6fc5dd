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
#include "core/settings.h"
#include "core/timer.h"
#include "core/trace.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "dist/dist.h"
#include "dist/launch.h"
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
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
    /* tracing on a GPU: an event recorded with the step's scalars and the host time right
     * after the host waited for them, which places the step's events on the host clock */
    rt_event *anchor;
    uint64_t anchor_ns;
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
    float *x_dev;      /* CUDA: the batch on the device */
    void *scratch_dev; /* CUDA: host values all-reduced through the device (all_reduce_host) */
    /* CUDA: what a step reads back, in pinned memory: the summed loss and stop flag, the
     * gradients' sum of squares; one event, one host wait per step (step_scalars) */
    struct step_vals {
        float loss_stop[3]; /* and the flight recorder flag */
        double sumsq;
    } * vals_host;
    bool vals_pinned;
    rt_event *ev_vals;
    int64_t *label_dev; /* CUDA */
    float *out_host;    /* evaluation: logits on the host */
    float *tta_x;       /* eval.tta flip: the mirrored batch (host) */
    float *tta_out;     /* eval.tta flip: the mirrored batch's logits (host) */
    rt_metrics *metrics, *rank_metrics;
    rt_stage_stats *stats;
    rt_progress progress;
    pending pend[2];
    int64_t step; /* optimizer steps done */
    char ckpt_dir[RT_CONFIG_PATH_MAX];
    char resume_path[RT_CKPT_PATH_MAX]; /* the checkpoint to continue from ("": fresh), found before the model */
    int64_t start_epoch, start_batches; /* where a resumed run continues */
    int64_t resumed_step;               /* -1: a fresh run */
    bool stop;                          /* the ranks agreed to stop (agree_stop, step_scalars) */
    bool flight_agreed;                 /* a rank got SIGUSR1: every rank dumps after this step (step_scalars) */
    int stop_signal;                    /* the signal they agreed on (SIGTERM over SIGINT) */
    int64_t resume_step;                /* the step of rank 0's choice (-1: not known before loading) */
    char run_id[32];                    /* 16 hex digits: rank 0's at a fresh start, the checkpoint's on resume */
    bool choose_failed;                 /* rank 0 could not choose the checkpoint (choose_err says why) */
    rt_error_record choose_err;
    int64_t plan_steps; /* train.epochs x steps_per_epoch: what auto schedule lengths fit */
    int64_t steps_per_epoch, total_steps;
    uint64_t t0;
    pending *cur;         /* the step under way (train_step) */
    uint64_t stream_last; /* tracing on a GPU: the end of the last stream span */
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

/* Best effort: a failure is logged and cleared (the caller's error, if any, is its own). */
static void flight_dump(run *r, const char *why) {
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
 * SIGINT), the same answer on every rank. */
static rt_status agree_stop(run *r) {
    double sig = (double)g_stop_signal;
    RT_CHECK(all_reduce_f64(r, &sig, 1, RT_OP_MAX));
    r->stop = sig > 0;
    r->stop_signal = (int)sig;
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_SIGNAL_AT=<where>:<step>[:<target>[:<rank>[:<signal>]]] makes
 * rank <rank> (default 0) send a signal at an exact point, where a test that polls and
 * then signals races with the run. <where>: step (between steps, before step <step>
 * starts), eval (inside the evaluation after step <step>, after its first batch), ckpt
 * (while the checkpoint of step <step> is written: rank 0 right before it writes the
 * files, the others before they wait for the outcome). <target>: launcher (default; its
 * parent when ringtrain's launcher started it, else itself) or self. <signal>: TERM
 * (default), INT, KILL, USR1 (the flight recorder) or STOP (with target self: a rank that
 * hangs, for the timeout diagnosis). After TERM, INT or USR1 the rank
 * waits (at most 60 s) until its own handler has the signal (the launcher forwards it),
 * so the stop (or dump) is decided at the next agreement point, never at a later one. */
static void test_signal_at(run *r, const char *where, int64_t step) {
    static bool fired;
    const char *v = rt_setting_text(RT_SET_TEST_SIGNAL_AT);
    if (fired || !v) return;
    char w[16] = "", target[16] = "launcher", name[8] = "TERM";
    long long at = -1;
    int rank = 0;
    if (sscanf(v, "%15[^:]:%lld:%15[^:]:%d:%7s", w, &at, target, &rank, name) < 2) return;
    if (strcmp(w, where) != 0 || at != (long long)step || rank != r->who.rank) return;
    fired = true;
    int sig = strcmp(name, "INT") == 0    ? SIGINT
              : strcmp(name, "KILL") == 0 ? SIGKILL
              : strcmp(name, "USR1") == 0 ? SIGUSR1
              : strcmp(name, "STOP") == 0 ? SIGSTOP
                                          : SIGTERM;
    fflush(NULL);
    if (strcmp(target, "launcher") == 0 &&
        rt_setting_is_set(RT_SET_JOB_TOKEN)) { /* ringtrain's launcher forked this rank */
        kill(getppid(), sig);
        if (sig == SIGKILL)
            for (;;) pause(); /* PR_SET_PDEATHSIG: this rank dies with its launcher */
    } else {
        raise(sig); /* this thread: handled before raise returns */
    }
    struct timespec ms = {0, 1000000};
    volatile sig_atomic_t *flag = sig == SIGUSR1 ? &g_flight_signal : &g_stop_signal;
    for (int i = 0; i < 60000 && !*flag; i++) nanosleep(&ms, NULL);
}

/* ---- setup --------------------------------------------------------------------------- */

static rt_status load_data(run *r) {
    const rt_config *c = r->cfg;
    rt_dataset_kind kind = c->data.kind;
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

/* The process group (none with one rank): the dist.* keys as the config holds them in
 * the group's options, with the run-time fields (rendezvous, ranks, buffers on the
 * training device). */
static rt_status setup_group(run *r) {
    const rt_config *c = r->cfg;
    if (r->who.world_size == 1) return RT_OK;
    rt_pg_options po = c->dist.pg;
    po.init_method = c->dist.init_method;
    po.rank = r->who.rank;
    po.world_size = r->who.world_size;
    po.device = r->dev;
    return rt_pg_init(&po, &r->pg);
}

/* The convolution algorithms recorded in the checkpoint this run resumes from, when both
 * are deterministic GPU runs; n = 0 otherwise (a fresh run, a CPU checkpoint, one written
 * with train.deterministic off, or this run has it off: the search chooses afresh). */
static rt_status checkpoint_conv_algos(run *r, rt_conv_algos *out) {
    out->n = 0;
    if (!r->resume_path[0] || !r->cfg->train.ctx.deterministic) return RT_OK;
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

/* The model's options as the config holds them (model.*), the autos resolved from the
 * training set (the one place: stem cifar for images 32 pixels high or more, else
 * imagenet; num_classes the dataset's) and its input shape set; max_batch is the
 * caller's. */
static rt_model_config resolved_model(const rt_config *c, const rt_dataset *ds) {
    rt_model_config mc = c->model;
    mc.in_channels = ds->c;
    mc.in_h = ds->h;
    mc.in_w = ds->w;
    if (mc.num_classes == RT_CONFIG_AUTO) mc.num_classes = ds->num_classes;
    if (mc.stem == RT_STEM_AUTO) mc.stem = ds->h >= 32 ? RT_STEM_CIFAR : RT_STEM_IMAGENET;
    return mc;
}

static rt_status setup_model(run *r) {
    const rt_config *c = r->cfg;
    rt_model_config mc = resolved_model(c, &r->train_ds);
    int per_rank = (int)(c->data.batch_size / r->who.world_size);
    int64_t eval_global = c->data.eval_batch_size == RT_CONFIG_AUTO ? c->data.batch_size : c->data.eval_batch_size;
    int eval_per_rank = (int)(eval_global / r->who.world_size);
    if (eval_per_rank < 1) eval_per_rank = 1;
    mc.max_batch = per_rank > eval_per_rank ? per_rank : eval_per_rank;

    rt_model_ctx_options o = c->train.ctx;
    o.device = r->dev;
    if (o.threads == RT_CONFIG_AUTO) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = (int)(cores / (r->who.local_world_size > 0 ? r->who.local_world_size : 1));
        if (o.threads < 1) o.threads = 1;
    }
    RT_CHECK(rt_model_ctx_create(&o, &r->ctx));
    RT_CHECK(create_model(r, &mc));
    RT_CHECK(rt_model_init_weights(r->model, (uint64_t)c->train.seed));
    rt_status ls = rt_model_set_label_smoothing(r->model, c->train.label_smoothing);
    if (ls != RT_OK) return rt_error_trace(__FILE__, __LINE__, "train.label_smoothing"), ls;
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
    rt_loader_config lc = c->data.loader; /* the loader's keys, parsed once */
    lc.dataset = &r->train_ds;
    lc.world_size = r->who.world_size;
    lc.rank = r->who.rank;
    lc.global_batch = c->data.batch_size;
    lc.seed = (uint64_t)c->train.seed;
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
    ec.prefetch = c->data.loader.prefetch;
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
    r->plan_steps = r->total_steps; /* train.max_steps stops the run, it does not shorten the schedule */
    if (c->train.max_steps > 0 && c->train.max_steps < r->total_steps) r->total_steps = c->train.max_steps;
    return RT_OK;
}

static rt_status setup_optim(run *r) {
    const rt_config *c = r->cfg;
    rt_optim_config oc = c->optim.opt; /* the optimizer's keys (train.ema_* too), NaN where auto */
    RT_CHECK(rt_optim_config_resolve(&oc));
    oc.no_decay = NULL;
    oc.n_no_decay = 0;
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
    /* on the CPU, the update runs on the model's threads (train.threads) */
    rt_optimizer_set_parallel(&r->opt, rt_model_ctx_parallel, r->ctx);

    r->sched = c->optim.sched; /* the schedule's keys; auto where the config says so */
    rt_schedule *sc = &r->sched;
    sc->base_lr = oc.lr;
    sc->steps_per_epoch = r->steps_per_epoch;
    /* auto lengths fit the planned run (train.epochs): a run stopped by train.max_steps and
     * resumed with more steps follows the schedule of the uninterrupted run */
    int64_t units = sc->per_epoch ? (r->plan_steps + r->steps_per_epoch - 1) / r->steps_per_epoch : r->plan_steps;
    if (sc->t_max == RT_CONFIG_AUTO) sc->t_max = units - sc->warmup_steps;
    if (sc->t_max < 1) sc->t_max = 1;
    if (isnan(sc->max_lr)) sc->max_lr = oc.lr;
    if (sc->total_steps == RT_CONFIG_AUTO) sc->total_steps = units;
    sc->cycle_momentum = sc->cycle_momentum && rt_optim_config_has_momentum(&oc);
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
    if (r->cfg->dist.compress_bf16) {
        ro.compress_bf16 = true; /* GPU: rounded and widened on the model's stream (dist/reducer.h) */
        if (r->dev.kind == RT_DEVICE_CPU) ro.stream = NULL; /* CPU: the gradients are final when reported */
    }
    return rt_reducer_create(r->pg, rt_model_grads(r->model)->base, r->bounds, nb, &ro, &r->reducer);
}

static rt_status on_grad_ready(void *user, int block, size_t begin, size_t end) {
    (void)block;
    run *r = user;
    return rt_reducer_ready(r->reducer, begin, end);
}

/* train.ema_decay: the parameters' moving average lives in the optimizer's "ema" state;
 * evaluation, checkpoints and the run's model.safetensors see it by swapping it with the
 * model's parameters (and back). Before the first update (step < train.ema_every) there
 * is no average yet and the raw weights are used. */
static bool ema_active(const run *r) {
    return r->have_opt && rt_optimizer_ema(&r->opt) && rt_optimizer_get_steps(&r->opt) >= r->opt.cfg.ema_every;
}

static rt_status ema_swap(run *r) {
    return rt_optimizer_ema_swap(&r->opt, rt_model_params(r->model)->base, r->ctx->stream);
}

/* ---- evaluation ------------------------------------------------------------------------ */

/* x (n, c, h, w) mirrored left-right into y: torch's x.flip(-1) */
static void flip_images(const float *x, int n, int c, int h, int w, float *y) {
    for (size_t row = 0; row < (size_t)n * (size_t)c * (size_t)h; row++) {
        const float *s = x + row * (size_t)w;
        float *d = y + row * (size_t)w;
        for (int j = 0; j < w; j++) d[j] = s[w - 1 - j];
    }
}

/* eval.tta: flip. The outputs of the batch and of its mirror (both on the host) are
 * averaged in place into a, as torch.stack([model(x), model(x.flip(-1))]).mean(0);
 * returns the summed cross-entropy of the averaged rows (log_softmax of them, also for
 * Net, whose outputs are log-probabilities) in double. */
static double tta_average(float *a, const float *b, const int64_t *labels, int n, int k) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        float *o = a + (size_t)i * (size_t)k;
        const float *f = b + (size_t)i * (size_t)k;
        float m = -INFINITY;
        for (int j = 0; j < k; j++) {
            o[j] = (o[j] + f[j]) / 2.0f;
            m = o[j] > m ? o[j] : m;
        }
        double s = 0;
        for (int j = 0; j < k; j++) s += exp((double)o[j] - m);
        total += m + log(s) - o[labels[i]];
    }
    return total;
}

static rt_status evaluate_model(run *r, double *loss, double *acc, int64_t *samples);

/* the evaluation of the moving average when there is one (AveragedModel(use_buffers=False):
 * the averaged parameters with the model's batch-norm buffers) */
static rt_status evaluate(run *r, double *loss, double *acc, int64_t *samples) {
    bool ema = ema_active(r);
    if (ema) RT_CHECK(ema_swap(r));
    rt_status st = evaluate_model(r, loss, acc, samples);
    if (ema) {
        rt_status s2 = ema_swap(r);
        if (st == RT_OK) st = s2;
    }
    return st;
}

static rt_status evaluate_model(run *r, double *loss, double *acc, int64_t *samples) {
    RT_CHECK(test_bn_perturb(r));
    RT_CHECK(broadcast_state(r, false)); /* batch-norm running statistics of rank 0 */
    const rt_model_config *mc = rt_model_config_of(r->model);
    int k = mc->num_classes;
    double sums[3] = {0, 0, 0}; /* loss * n, correct, n */
    /* evaluation reports plain cross-entropy whatever the training loss's smoothing */
    double smoothing = rt_model_label_smoothing(r->model);
    RT_CHECK(rt_model_set_label_smoothing(r->model, 0.0));
    bool tta = r->cfg->train.tta_flip;
    if (tta && !r->tta_x) {
        size_t img = rt_dataset_image_bytes(&r->test_ds), bmax = (size_t)mc->max_batch;
        r->tta_x = malloc(sizeof(float) * img * bmax);
        r->tta_out = malloc(sizeof(float) * bmax * (size_t)k);
        RT_CHECK_ALLOC(r->tta_x, sizeof(float) * img * bmax);
        RT_CHECK_ALLOC(r->tta_out, sizeof(float) * bmax * (size_t)k);
    }
    RT_CHECK(rt_loader_start_epoch(r->test_loader, 0));
    for (int64_t batches = 0;; batches++) {
        rt_launch_heartbeat();
        if (batches == 1) test_signal_at(r, "eval", r->step);
        if (g_flight_signal) { /* this rank's alone: evaluation has no agreement per batch */
            g_flight_signal = 0;
            flight_dump(r, "SIGUSR1 in evaluation");
        }
        rt_batch b;
        RT_CHECK(rt_loader_next(r->test_loader, &b));
        if (b.size == 0) break;
        const float *x = b.images;
        const int64_t *y = b.labels;
        if (tta) flip_images(b.images, b.size, r->test_ds.c, r->test_ds.h, r->test_ds.w, r->tta_x);
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
        const int64_t *labels = b.labels; /* host copy */
        if (tta) {
            /* the mirrored batch through the same (eval-mode) model, then the mean of the two */
            RT_CHECK(rt_memcpy(r->out_host, rt_device_cpu(), rt_model_output(r->model), r->dev,
                               sizeof(float) * (size_t)b.size * (size_t)k, r->ctx->stream));
            RT_CHECK(rt_model_ctx_sync(r->ctx)); /* the first forward is done with x_dev */
            const float *xf = r->tta_x;
            if (rt_device_is_cuda(r->dev)) {
                size_t img = rt_dataset_image_bytes(&r->test_ds);
                RT_CHECK(rt_memcpy(r->x_dev, r->dev, r->tta_x, rt_device_cpu(), sizeof(float) * img * (size_t)b.size,
                                   r->ctx->stream));
                xf = r->x_dev;
            }
            RT_CHECK(rt_model_forward(r->model, xf, b.size, false));
            RT_CHECK(rt_memcpy(r->tta_out, rt_device_cpu(), rt_model_output(r->model), r->dev,
                               sizeof(float) * (size_t)b.size * (size_t)k, r->ctx->stream));
            RT_CHECK(rt_model_ctx_sync(r->ctx));
            sums[0] += tta_average(r->out_host, r->tta_out, labels, b.size, k);
        } else {
            RT_CHECK(rt_model_loss(r->model, y));
            RT_CHECK(rt_memcpy(r->out_host, rt_device_cpu(), rt_model_output(r->model), r->dev,
                               sizeof(float) * (size_t)b.size * (size_t)k, r->ctx->stream));
            float l; /* rt_model_loss_value syncs the model's stream: the logits above are in too */
            RT_CHECK(rt_model_loss_value(r->model, &l));
            sums[0] += (double)l * b.size;
        }
        for (int i = 0; i < b.size; i++) {
            const float *o = r->out_host + (size_t)i * (size_t)k;
            int best = 0;
            for (int j = 1; j < k; j++)
                if (o[j] > o[best]) best = j;
            sums[1] += best == labels[i];
        }
        sums[2] += b.size;
    }
    RT_CHECK(rt_model_set_label_smoothing(r->model, smoothing));
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

/* Tracing on a GPU: the step's stream spans, from its events (all complete: complete()
 * asks this only once the last one is), placed on the host clock by the anchor. */
static rt_status trace_stream(run *r, pending *p) {
    if (!rt_trace_enabled() || !rt_device_is_cuda(r->dev) || !p->anchor_ns) return RT_OK;
    static const char *const names[EV_COUNT - 1] = {"h2d", "forward", "backward", "wait for gradient all_reduce",
                                                    "scalars + optimizer"};
    uint64_t at[EV_COUNT];
    for (int i = 0; i < EV_COUNT; i++) {
        float ms = 0;
        bool ready = false;
        bool after = i == EV_END; /* recorded after the anchor */
        RT_CHECK(after ? rt_event_elapsed_ms(p->anchor, p->ev[i], &ms, &ready)
                       : rt_event_elapsed_ms(p->ev[i], p->anchor, &ms, &ready));
        if (!ready) return RT_OK;
        double ns = ms > 0 ? (double)ms * 1e6 : 0;
        at[i] = after ? p->anchor_ns + (uint64_t)ns : p->anchor_ns - (uint64_t)(ns < (double)p->anchor_ns ? ns : 0);
    }
    /* the anchors' host wake-up differs from step to step: never before the span before */
    for (int i = 0; i < EV_COUNT; i++) {
        if (at[i] < r->stream_last) at[i] = r->stream_last;
        r->stream_last = at[i];
    }
    for (int i = 0; i < EV_COUNT - 1; i++)
        rt_trace_span_at(RT_TRACK_STREAM, names[i], at[i], at[i + 1], p->rec.step, p->rec.epoch);
    p->anchor_ns = 0;
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
    RT_CHECK(trace_stream(r, p));
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
        /* the mean loss; any rank asked to stop; any rank asked for the flight recorder */
        double agree[3] = {lf, g_stop_signal ? 1.0 : 0.0, g_flight_signal ? 1.0 : 0.0};
        uint64_t t = rt_trace_now();
        RT_CHECK(all_reduce_f64(r, agree, 3, RT_OP_SUM));
        if (r->pg) rt_trace_end(RT_TRACK_MAIN, "scalars all_reduce", t);
        *loss = agree[0] / r->who.world_size;
        *stop = agree[1] > 0;
        r->flight_agreed = agree[2] > 0;
        return rt_grad_norm(&r->clip, grads, n, st, norm);
    }
    float flag[2] = {g_stop_signal ? 1.0f : 0.0f, g_flight_signal ? 1.0f : 0.0f};
    float *sc = r->scratch_dev;
    RT_CHECK(rt_memcpy(sc, r->dev, rt_model_loss_ptr(r->model), r->dev, sizeof(float), st));
    RT_CHECK(rt_memcpy(sc + 1, r->dev, flag, rt_device_cpu(), sizeof flag, st));
    if (r->pg) {
        rt_request *q = NULL;
        uint64_t t = rt_trace_now();
        RT_CHECK(rt_iall_reduce(r->pg, sc, 3, RT_F32, RT_OP_SUM, &q)); /* after the copies: the group's stream */
        RT_CHECK(rt_wait_stream(q, st));                               /* on the device: the copy below waits for it */
        rt_trace_end(RT_TRACK_MAIN, "scalars all_reduce", t);
    }
    RT_CHECK(rt_grad_sumsq_async(&r->clip, grads, n, st, &r->vals_host->sumsq));
    RT_CHECK(rt_memcpy(r->vals_host->loss_stop, rt_device_cpu(), sc, r->dev, 3 * sizeof(float), st));
    pending *p = rt_trace_enabled() ? r->cur : NULL;
    if (p) RT_CHECK(rt_event_record(p->anchor, st));
    RT_CHECK(rt_event_record(r->ev_vals, st));
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_event_sync(r->ev_vals)); /* the step's one host wait */
    if (p) p->anchor_ns = rt_now_ns();   /* the anchor completed at most this long ago */
    rt_trace_end(RT_TRACK_MAIN, "wait for the step's scalars", t);
    *loss = (double)r->vals_host->loss_stop[0] / r->who.world_size;
    *stop = r->vals_host->loss_stop[1] > 0;
    r->flight_agreed = r->vals_host->loss_stop[2] > 0;
    *norm = sqrt(r->vals_host->sumsq);
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_NAN_AT=<rank>:<step> puts a NaN into the first pixel of that
 * rank's batch at that step (1-based), so that rank alone produces non-finite gradients
 * (its loss may stay finite: a ReLU turns a NaN into 0 on the way forward, not back). */
static void test_nan_batch(const run *r, const rt_batch *b) {
    const char *v = rt_setting_text(RT_SET_TEST_NAN_AT);
    if (!v || b->size < 1) return;
    char *end = NULL;
    long rank = strtol(v, &end, 10);
    if (*end != ':') return;
    long long at = strtoll(end + 1, &end, 10);
    if (*end || rank != r->who.rank || at != (long long)r->step + 1) return;
    b->images[0] = NAN;
}

/* Which ranks produced a non-finite step: every rank sees it (the loss is averaged over
 * the ranks, the gradient norm is that of the all-reduced gradients), so each checks its
 * own loss and its own gradients (the all-reduce overwrote them: backward again, without
 * the reducer; parameter gradients are written, not accumulated) and they agree on the
 * lowest such rank and their number. Only on this path: a finite step pays nothing. */
static rt_status nonfinite_ranks(run *r, char *who, size_t n) {
    float own = 0;
    double own_norm = 0;
    RT_CHECK(rt_model_loss_value(r->model, &own)); /* this rank's loss, before the averaging */
    if (isfinite(own)) {
        float *grads = rt_model_grads(r->model)->base;
        size_t ng = rt_model_grads(r->model)->size / sizeof(float);
        if (r->pg) RT_CHECK(rt_model_backward(r->model, NULL, NULL));
        RT_CHECK(rt_grad_norm(&r->clip, grads, ng, r->ctx->stream, &own_norm));
    }
    bool bad = !isfinite(own) || !isfinite(own_norm);
    int64_t first = bad ? r->who.rank : r->who.world_size, count = bad ? 1 : 0;
    RT_CHECK(all_reduce_host(r, &first, 1, RT_I64, RT_OP_MIN));
    RT_CHECK(all_reduce_host(r, &count, 1, RT_I64, RT_OP_SUM));
    if (count == 0)
        snprintf(who, n,
                 "on no rank alone (the own loss and gradients of each of the %d rank(s) were finite: their sum "
                 "overflowed)",
                 r->who.world_size);
    else if (count == 1)
        snprintf(who, n, "on rank %lld (of %d rank(s), the only one whose own loss or gradients were non-finite)",
                 (long long)first, r->who.world_size);
    else
        snprintf(who, n, "on rank %lld (the first of %lld of %d ranks whose own loss or gradients were non-finite)",
                 (long long)first, (long long)count, r->who.world_size);
    return RT_OK;
}

/* Tests only (a desync on purpose, docs/dist.md "Hangs and desyncs"):
 *   RINGTRAIN_TEST_SKIP_BUCKET=<rank>:<step>:<bucket>   that rank does not all-reduce
 *       gradient bucket <bucket> (1 = the first started, as in "bucket 1 of 6") in step <step>;
 *   RINGTRAIN_TEST_BUCKET_COUNT=<rank>:<step>:<bucket>  it all-reduces it with one element
 *       fewer. */
static void test_bucket_fault(run *r) {
    const rt_setting_id ids[2] = {RT_SET_TEST_SKIP_BUCKET, RT_SET_TEST_BUCKET_COUNT};
    for (int k = 0; k < 2; k++) {
        const char *v = rt_setting_text(ids[k]);
        long long rank = -1, step = -1, bucket = -1;
        if (!v || sscanf(v, "%lld:%lld:%lld", &rank, &step, &bucket) != 3) continue;
        if (rank != r->who.rank || step != (long long)r->step + 1) continue;
        fprintf(stderr, "%s: rank %lld, step %lld, bucket %lld\n", rt_setting_info_get(ids[k])->name, rank, step,
                bucket);
        rt_reducer_test_fault(r->reducer, (int)bucket - 1, k == 0 ? RT_REDUCER_FAULT_SKIP : RT_REDUCER_FAULT_SHORT);
    }
}

static rt_status train_step(run *r, const rt_batch *b, double data_ms, int64_t epoch) {
    const rt_config *c = r->cfg;
    char tag[32]; /* the step in flight files and hang/desync diagnoses */
    snprintf(tag, sizeof tag, "step %lld", (long long)r->step + 1);
    rt_pg_set_tag(r->pg, tag);
    pending *p = &r->pend[r->step % 2];
    RT_CHECK(complete(r, p, true)); /* two steps back (the older pending record): surely done */
    r->cur = p;
    p->anchor_ns = 0;
    rt_stream *st = r->ctx->stream;
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_event_record(p->ev[EV_START], st));
    test_nan_batch(r, b);
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
    rt_trace_end(RT_TRACK_MAIN, "h2d", t);
    t = rt_trace_now();
    RT_CHECK(rt_model_forward(r->model, x, b->size, true));
    RT_CHECK(rt_model_loss(r->model, y));
    RT_CHECK(rt_event_record(p->ev[EV_FWD], st));
    rt_trace_end(RT_TRACK_MAIN, "forward", t);
    t = rt_trace_now();
    if (r->reducer) {
        RT_CHECK(rt_reducer_begin(r->reducer));
        test_bucket_fault(r);
    }
    RT_CHECK(rt_model_backward(r->model, r->reducer ? on_grad_ready : NULL, r));
    RT_CHECK(rt_event_record(p->ev[EV_BWD], st));
    rt_trace_end(RT_TRACK_MAIN, "backward", t);
    rt_reducer_stats rs = {0};
    if (r->reducer) {
        t = rt_trace_now();
        RT_CHECK(rt_reducer_finish(r->reducer));
        rt_trace_end(RT_TRACK_MAIN, "wait for gradient all_reduce", t);
        rt_reducer_stats_get(r->reducer, &rs);
    }
    RT_CHECK(rt_event_record(p->ev[EV_COMM], st));
    /* the loss averaged over the ranks (for the logs), the stop flag, the norm */
    double loss = 0, norm = 0;
    RT_CHECK(step_scalars(r, &loss, &r->stop, &norm));
    if (r->stop) RT_CHECK(agree_stop(r)); /* which signal: every rank, they all saw the flag */
    /* clip (the norm is logged either way), then the optimizer at the schedule's lr */
    t = rt_trace_now();
    rt_grad_stats gs;
    float *grads = rt_model_grads(r->model)->base;
    size_t n = rt_model_grads(r->model)->size / sizeof(float);
    RT_CHECK(rt_grad_clip_apply(&r->clip, grads, n, c->optim.clip_grad_norm, norm, st, &gs));
    double lr = rt_schedule_lr(&r->sched, r->step);
    double mom;
    if (rt_schedule_momentum(&r->sched, r->step, &mom)) RT_CHECK(rt_optimizer_set_momentum(&r->opt, mom));
    bool skipped = false;
    if (!gs.finite || !isfinite(loss)) {
        char who[160]; /* the same on every rank: the launcher names the rank that produced it */
        RT_CHECK(nonfinite_ranks(r, who, sizeof who));
        RT_REQUIRE(c->train.skip_nonfinite, RT_ERR_INVALID,
                   "step %lld (epoch %lld): non-finite %s (loss %g, gradient norm %g) %s; set "
                   "train.skip_nonfinite: true to skip such steps",
                   (long long)r->step + 1, (long long)epoch, isfinite(loss) ? "gradient" : "loss", loss, gs.norm, who);
        skipped = true;
        RT_LOG_WARN("step %lld: non-finite %s %s, step skipped", (long long)r->step + 1,
                    isfinite(loss) ? "gradient" : "loss", who);
    } else {
        RT_CHECK(rt_optimizer_step_arena(&r->opt, rt_model_params(r->model), rt_model_grads(r->model), lr, st));
    }
    RT_CHECK(rt_event_record(p->ev[EV_END], st));
    rt_trace_end(RT_TRACK_MAIN, "optimizer", t);
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
static bool test_env_rank(const run *r, rt_setting_id id, long long *step) {
    const char *v = rt_setting_text(id);
    if (!v || !r->pg) return false;
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
    if (!test_env_rank(r, RT_SET_TEST_INIT_SEED_RANK, NULL)) return RT_OK;
    return rt_model_init_weights(r->model, (uint64_t)r->cfg->train.seed + 1);
}

static rt_status test_perturb_at(run *r) {
    long long at = -1;
    if (!test_env_rank(r, RT_SET_TEST_PERTURB_AT, &at) || at != (long long)r->step) return RT_OK;
    return test_edit_floats(r, rt_model_params(r->model)->base, 1, 1.0f, 1e-3f);
}

static rt_status test_bn_perturb(run *r) {
    if (!test_env_rank(r, RT_SET_TEST_BN_PERTURB, NULL)) return RT_OK;
    for (int i = 0; i < rt_model_param_count(r->model); i++) {
        const rt_param *p = rt_model_param(r->model, i);
        if (p->kind == RT_PARAM_BUFFER && p->value.dtype == RT_F32)
            RT_CHECK(test_edit_floats(r, rt_tensor_data(&p->value), (size_t)rt_tensor_numel(&p->value), 4.0f, 0.0f));
    }
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_KILL_AFTER_CKPT=<step> makes rank 0, once the checkpoint of
 * that step is complete, SIGKILL its parent when ringtrain's launcher started it (its
 * ranks then die with it, PR_SET_PDEATHSIG) and itself (one rank: there is no launcher): a crash at an exact point,
 * where a test that polls for the checkpoint and then kills races with the run (which may have pruned it by then). */
static void test_kill_after_checkpoint(run *r) {
    const char *v = rt_setting_text(RT_SET_TEST_KILL_AFTER_CKPT);
    if (!v || !is_root(r)) return;
    char *end = NULL;
    long long at = strtoll(v, &end, 10);
    if (*end || at != (long long)r->step) return;
    fflush(NULL);
    if (rt_setting_is_set(RT_SET_JOB_TOKEN)) kill(getppid(), SIGKILL); /* ringtrain's launcher forked this rank */
    kill(getpid(), SIGKILL);
}

/* The job's attempt: TORCHELASTIC_RESTART_COUNT, set by ringtrain's launcher (--max-restarts)
 * and by torchrun; 0 (the first attempt) when unset. A launcher's variable that does not
 * parse reads as 0 here (this only labels metrics and test hooks), with a warning. */
static long long restart_count(void) {
    int64_t n = 0;
    if (rt_setting_int(RT_SET_TE_RESTART_COUNT, &n) != RT_OK) {
        RT_LOG_WARN("%s; taking attempt 0", rt_error_message());
        rt_error_clear();
        n = 0;
    }
    return (long long)n;
}

/* Tests only: RINGTRAIN_TEST_KILL_RANK_AT=<rank>:<step> makes that rank SIGKILL itself right
 * after step <step> in the job's first attempt only (restart_count 0: a restarted attempt
 * runs on); <rank>:<step>:every in every attempt. A rank that dies at an exact point, for
 * the launcher's restarts (tests/train/resume.sh restart). */
static void test_kill_rank_at(const run *r) {
    const char *v = rt_setting_text(RT_SET_TEST_KILL_RANK_AT);
    if (!v) return;
    char *end = NULL;
    long long rank = strtoll(v, &end, 10);
    if (*end != ':' || rank != r->who.rank) return;
    long long at = strtoll(end + 1, &end, 10);
    bool every = strcmp(end, ":every") == 0;
    if (at != (long long)r->step || (*end && !every) || (!every && restart_count() != 0)) return;
    fprintf(stderr, "RINGTRAIN_TEST_KILL_RANK_AT: rank %lld kills itself after step %lld (attempt %lld)\n", rank, at,
            restart_count());
    fflush(NULL);
    kill(getpid(), SIGKILL);
}

/* Rank 0 writes ckpt-<step>/ after rank 0's batch-norm buffers reached every rank; the
 * others wait for the outcome, so a failed write (disk full, permissions) stops every
 * rank with rank 0's error and leaves the earlier checkpoints as they were. */
static rt_status save_checkpoint_(run *r, int64_t epoch, int64_t epoch_batches, const char *why);
static rt_status save_checkpoint(run *r, int64_t epoch, int64_t epoch_batches, const char *why) {
    uint64_t t = rt_trace_now();
    rt_status s = save_checkpoint_(r, epoch, epoch_batches, why);
    rt_trace_end(RT_TRACK_MAIN, "checkpoint", t);
    return s;
}
static rt_status save_checkpoint_(run *r, int64_t epoch, int64_t epoch_batches, const char *why) {
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
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "run_id", r->run_id);
        /* the schedule's state, as PyTorch's scheduler state_dict: its resolved lengths and step */
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "schedule.kind", rt_sched_kind_name(r->sched.kind));
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "schedule.interval", r->sched.per_epoch ? "epoch" : "iteration");
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "schedule.steps_per_epoch", r->sched.steps_per_epoch);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "schedule.t_max", r->sched.t_max);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "schedule.total_steps", r->sched.total_steps);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "schedule.warmup_steps", r->sched.warmup_steps);
        if (st == RT_OK) st = rt_ckpt_meta_set_i64(&m, "schedule.step", r->step);
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "device", rt_device_is_cuda(r->dev) ? "cuda" : "cpu");
        if (st == RT_OK && rt_device_is_cuda(r->dev)) {
            rt_conv_algos algos; /* what every rank ran (rank 0's choice: create_model) */
            rt_model_ctx_get_conv_algos(r->ctx, &algos);
            st = rt_ckpt_meta_set(&m, "cudnn.deterministic", r->ctx->deterministic ? "true" : "false");
            if (st == RT_OK) st = rt_ckpt_meta_set_conv_algos(&m, "cudnn.conv_algos", &algos);
        }
        if (st == RT_OK) st = rt_ckpt_meta_set(&m, "config", yaml ? yaml : "");
        free(yaml);
        test_signal_at(r, "ckpt", r->step);
        rt_launch_heartbeat();
        /* with a moving average: model.safetensors holds it (what evaluation uses), the
         * optimizer's "ema" state the raw weights (swapped back right after) */
        bool ema = st == RT_OK && ema_active(r);
        if (ema) st = ema_swap(r);
        if (st == RT_OK)
            st = rt_ckpt_write(r->ckpt_dir, r->step, r->model, &r->opt, &m, (int)c->checkpoint.keep_last, path,
                               sizeof path);
        if (ema) {
            rt_status s2 = ema_swap(r);
            if (st == RT_OK) st = s2;
        }
        rt_launch_heartbeat();
        rt_ckpt_meta_free(&m);
        if (st != RT_OK) rt_error_save(&err);
    } else {
        test_signal_at(r, "ckpt", r->step);
    }
    double ok = st == RT_OK;
    RT_CHECK(all_reduce_f64(r, &ok, 1, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err);
    RT_REQUIRE(ok > 0, RT_ERR_IO, "rank 0 could not write the checkpoint of step %lld (its error says why)",
               (long long)r->step);
    if (r->metrics)
        RT_CHECK(rt_metrics_line(r->metrics, "checkpoint",
                                 json_pack("{s:I, s:I, s:s, s:o}", "step", (json_int_t)r->step, "epoch",
                                           (json_int_t)epoch, "why", why, "path", rt_metrics_str(path))));
    test_kill_after_checkpoint(r);
    return RT_OK;
}

/* Keep the lines of a metrics file up to `step` (a resumed run logs the steps after its
 * checkpoint again): no gap, no duplicate. Lines without a "step" field are kept.
 * `eval_at` (may be NULL): `step` if an "eval" line of that step was kept, else -1 (a
 * checkpoint of an epoch's last step was written before that epoch's evaluation, so the
 * resumed run evaluates that step again, and must not log it twice). */
static rt_status truncate_metrics(const char *path, int64_t step, int64_t *eval_at) {
    if (eval_at) *eval_at = -1;
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
        if (eval_at && s == step && strncmp(line, "{\"kind\": \"eval\", ", 17) == 0) *eval_at = step;
        fputs(line, o);
    }
    free(line);
    fclose(f);
    if (fclose(o) != 0 || rename(tmp, path) != 0) return RT_ERROR(RT_ERR_IO, "%s: %s", path, strerror(errno));
    return RT_OK;
}

/* Tests only: RINGTRAIN_TEST_RANK_PATH=<rank>:<from>=<to> makes that rank see the files
 * under <from> at <to>, as ranks on different nodes see node-local folders of the same
 * name: the checkpoint folder's listing and the checkpoints it loads. */
static void rank_view(const run *r, const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    const char *v = rt_setting_text(RT_SET_TEST_RANK_PATH);
    if (!v) return;
    char *end = NULL;
    long rank = strtol(v, &end, 10);
    const char *eq = *end == ':' ? strchr(end + 1, '=') : NULL;
    if (!eq || rank != r->who.rank) return;
    size_t fl = (size_t)(eq - end - 1);
    if (strncmp(path, end + 1, fl) != 0 || (path[fl] != '/' && path[fl] != '\0')) return;
    snprintf(out, n, "%s%s", eq + 1, path + fl);
}

/* A run's id: 16 hex digits from getrandom (the time and pid if it fails). */
static void new_run_id(char *out, size_t n) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    snprintf(out, n, "%016llx", (unsigned long long)v);
}

/* Rank 0's choice (find_resume): checkpoint.resume auto (the newest complete checkpoint
 * of checkpoint.dir, if any), none (the folder must hold no checkpoint, or
 * checkpoint.overwrite moves them aside), or a path. */
static rt_status choose_resume(run *r) {
    const rt_config *c = r->cfg;
    new_run_id(r->run_id, sizeof r->run_id); /* a resume takes the checkpoint's instead */
    char dir[RT_CKPT_PATH_MAX];
    rank_view(r, r->ckpt_dir, dir, sizeof dir);
    if (strcmp(c->checkpoint.resume, "none") == 0) {
        int n = 0;
        char newest[256];
        RT_CHECK(rt_ckpt_count(dir, &n, newest, sizeof newest));
        if (n == 0) return RT_OK;
        RT_REQUIRE(c->checkpoint.overwrite, RT_ERR_INVALID,
                   "checkpoint.resume is none but %s holds %d checkpoint(s) of an earlier run (the newest %s); a new "
                   "run there would mix with them: give this run another checkpoint.dir (or log.dir), continue that "
                   "run (checkpoint.resume: auto), or set checkpoint.overwrite: true to move them aside into "
                   "%s/old-<run id>/",
                   dir, n, newest, dir);
        char aside[RT_CKPT_PATH_MAX + 128];
        RT_CHECK(rt_ckpt_move_aside(dir, aside, sizeof aside));
        fprintf(r->out, "ringtrain: checkpoint.overwrite: moved the %d checkpoint(s) of %s aside into %s\n", n, dir,
                aside);
        fflush(r->out);
        return RT_OK;
    }
    if (strcmp(c->checkpoint.resume, "auto") != 0) {
        snprintf(r->resume_path, sizeof r->resume_path, "%s", c->checkpoint.resume);
        return RT_OK;
    }
    rt_ckpt_found found;
    RT_CHECK(rt_ckpt_find(dir, &found));
    for (int i = 0; i < found.n_skipped; i++)
        RT_LOG_WARN("checkpoint %s refused: %s; trying the one before", found.skipped[i].path, found.skipped[i].reason);
    snprintf(r->resume_path, sizeof r->resume_path, "%s", found.path); /* "": nothing to resume */
    r->resume_step = found.step;
    return RT_OK;
}

/* Rank 0 chooses the checkpoint to continue from into r->resume_path ("": a fresh run),
 * before the model is made (a GPU resume takes the checkpoint's convolution algorithms);
 * the other ranks take its choice from share_resume. A failure is kept for share_resume,
 * which tells every rank. */
static rt_status find_resume(run *r) {
    r->resume_path[0] = '\0';
    r->resume_step = -1;
    rt_train_ckpt_dir(r->cfg, r->ckpt_dir, sizeof r->ckpt_dir);
    if (!is_root(r)) return RT_OK;
    if (choose_resume(r) != RT_OK) {
        rt_error_save(&r->choose_err);
        r->choose_failed = true;
        r->resume_path[0] = '\0';
    }
    return RT_OK;
}

/* Rank 0's bytes to every rank (the group's buffers live on the training device). */
static rt_status broadcast_bytes(run *r, void *p, size_t bytes) {
    if (!r->pg) return RT_OK;
    RT_REQUIRE(bytes % sizeof(int32_t) == 0, RT_ERR_INTERNAL, "broadcast_bytes: %zu bytes", bytes);
    if (!rt_device_is_cuda(r->dev)) return rt_broadcast(r->pg, p, bytes / sizeof(int32_t), RT_I32, 0);
    void *buf = NULL;
    RT_CHECK(rt_malloc(r->dev, bytes, &buf));
    rt_status st = rt_memcpy(buf, r->dev, p, rt_device_cpu(), bytes, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    if (st == RT_OK) st = rt_broadcast(r->pg, buf, bytes / sizeof(int32_t), RT_I32, 0);
    if (st == RT_OK) st = rt_memcpy(p, rt_device_cpu(), buf, r->dev, bytes, r->ctx->stream);
    if (st == RT_OK) st = rt_model_ctx_sync(r->ctx);
    rt_free(r->dev, buf);
    return st;
}

/* Rank 0's choice (path, step, run id) to every rank, after the model is made: every
 * rank then loads exactly that path, whatever its own folder holds. */
static rt_status share_resume(run *r) {
    struct {
        int64_t failed, step;
        char run_id[32];
        char path[RT_CKPT_PATH_MAX];
    } d;
    memset(&d, 0, sizeof d);
    d.failed = r->choose_failed;
    d.step = r->resume_step;
    snprintf(d.run_id, sizeof d.run_id, "%s", r->run_id);
    snprintf(d.path, sizeof d.path, "%s", r->resume_path);
    RT_CHECK(broadcast_bytes(r, &d, sizeof d));
    if (r->choose_failed) return rt_error_restore(&r->choose_err);
    RT_REQUIRE(!d.failed, RT_ERR_INVALID, "rank 0 could not choose the checkpoint (its error says why)");
    snprintf(r->resume_path, sizeof r->resume_path, "%s", d.path);
    snprintf(r->run_id, sizeof r->run_id, "%s", d.run_id);
    r->resume_step = d.step;
    return RT_OK;
}

/* Every rank's outcome of loading rank 0's choice: the job goes on only if every rank
 * loaded it; otherwise each fails, the one that could not with its own reason. */
static rt_status agree_loaded(run *r, rt_status st, const char *path) {
    if (!r->pg) return st;
    rt_error_record err;
    if (st != RT_OK) rt_error_save(&err);
    int64_t first_bad = st == RT_OK ? r->who.world_size : r->who.rank;
    RT_CHECK(all_reduce_host(r, &first_bad, 1, RT_I64, RT_OP_MIN));
    if (st != RT_OK) return rt_error_restore(&err);
    RT_REQUIRE(first_bad >= r->who.world_size, RT_ERR_IO,
               "rank %lld could not load the checkpoint %s that rank 0 chose (its error says why)",
               (long long)first_bad, path);
    return RT_OK;
}

/* Keys a resume may change freely (docs/checkpoints.md): how and how long the run goes,
 * not what it computes. Every other key of the checkpoint's config must be equal, or be
 * named in checkpoint.allow_changes. */
static bool free_key(const char *k) {
    static const char *const sections[] = {"checkpoint.", "log.", "dist."};
    static const char *const keys[] = {
        "train.epochs", "train.max_steps", "train.eval_every",     "train.threads",
        "train.device", "train.precision", "train.deterministic",  "train.skip_nonfinite",
        "data.path",    "data.prefetch",   "data.eval_batch_size", "data.test_subset",
        "eval.tta"};
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
        if (strncmp(k, sections[i], strlen(sections[i])) == 0) return true;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (strcmp(k, keys[i]) == 0) return true;
    return false;
}

/* A config value as a person writes it: numbers in their shortest exact form (0.05, not
 * 0.050000000000000003), strings without their quotes. */
static void pretty_value(const char *v, char *out, size_t n) {
    char *end = NULL;
    double d = strtod(v, &end);
    if (end != v && !*end && strchr(v, '.')) {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, n, "%.*g", prec, d);
            if (strtod(out, NULL) == d) return;
        }
    }
    size_t l = strlen(v);
    if (l >= 2 && v[0] == '"' && v[l - 1] == '"')
        snprintf(out, n, "%.*s", (int)(l - 2), v + 1);
    else
        snprintf(out, n, "%s", v);
}

/* optim.eps as the optimizer uses it: auto is the optimizer's default (1e-8 unless its
 * row says otherwise: what a checkpoint written before auto existed holds) */
static double effective_eps(const rt_config *c) {
    if (!isnan(c->optim.opt.eps)) return c->optim.opt.eps;
    rt_optim_config d;
    rt_optim_config_default(&d, c->optim.opt.kind);
    return d.eps;
}

/* The checkpoint's config (metadata "config", the resolved config it was written with)
 * against this run's, key by key: a key of the trajectory that differs is refused unless
 * checkpoint.allow_changes names it, then it applies and rank 0 logs it. */
static rt_status compare_config(run *r, const char *path, const char *text) {
    const rt_config *c = r->cfg;
    for (int i = 0; i < c->checkpoint.n_allow_changes; i++)
        RT_REQUIRE(rt_config_has_key(c->checkpoint.allow_changes[i]), RT_ERR_INVALID,
                   "checkpoint.allow_changes: '%s' is not a config key (see docs/config.md)",
                   c->checkpoint.allow_changes[i]);
    rt_config *old = malloc(sizeof *old);
    RT_CHECK_ALLOC(old, sizeof *old);
    rt_config_default(old);
    char name[RT_CKPT_PATH_MAX + 64];
    snprintf(name, sizeof name, "%s/" RT_CKPT_TRAIN_FILE " metadata 'config'", path);
    rt_status st = rt_config_parse_text(old, text, strlen(text), name);
    char refused[2048] = "";
    size_t rl = 0;
    int n_refused = 0;
    const char *k;
    for (int i = 0; st == RT_OK && rt_config_key_at(i, &k, NULL, NULL, NULL); i++) {
        char a[1200], b[1200];
        rt_config_value_at(old, i, a, sizeof a);
        rt_config_value_at(c, i, b, sizeof b);
        if (strcmp(a, b) == 0 || free_key(k)) continue;
        if (strcmp(k, "optim.eps") == 0 && effective_eps(old) == effective_eps(c)) continue; /* auto vs its value */
        char pa[600], pb[600];
        pretty_value(a, pa, sizeof pa);
        pretty_value(b, pb, sizeof pb);
        bool allowed = false;
        for (int j = 0; j < c->checkpoint.n_allow_changes; j++)
            allowed |= strcmp(c->checkpoint.allow_changes[j], k) == 0;
        if (allowed) {
            if (is_root(r)) fprintf(r->out, "ringtrain: checkpoint.allow_changes: %s %s -> %s\n", k, pa, pb);
            continue;
        }
        if (rl < sizeof refused)
            rl += (size_t)snprintf(refused + rl, sizeof refused - rl, "%s%s %s in the checkpoint, %s in this run",
                                   n_refused ? "; " : "", k, pa, pb);
        n_refused++;
    }
    free(old);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "checkpoint.resume: the checkpoint's config"), st;
    if (is_root(r)) fflush(r->out);
    RT_REQUIRE(n_refused == 0, RT_ERR_INVALID,
               "checkpoint %s was trained with another config: %s. A resume continues the same run: use the "
               "checkpoint's values, state the change with checkpoint.allow_changes=[KEY,...] to apply it, or start "
               "afresh (checkpoint.resume: none, in another checkpoint.dir)",
               path, refused);
    return RT_OK;
}

/* The schedule's saved state (schedule.* metadata) over the one this config resolves to:
 * lengths left to auto keep their saved values (a run trained longer by train.epochs
 * keeps its schedule, as a restored PyTorch scheduler keeps T_max); explicit ones, and
 * a schedule of another kind or interval (a stated change), come from the config.
 * Checkpoints without schedule.* keep the config's. */
static rt_status restore_schedule(run *r, const rt_ckpt_meta *m, int64_t step) {
    const rt_config *c = r->cfg;
    const char *kind = rt_ckpt_meta_get(m, "schedule.kind"), *interval = rt_ckpt_meta_get(m, "schedule.interval");
    if (!kind || !interval) return RT_OK;
    rt_schedule *sc = &r->sched;
    if (strcmp(kind, rt_sched_kind_name(sc->kind)) != 0 || strcmp(interval, sc->per_epoch ? "epoch" : "iteration") != 0)
        return RT_OK;
    int64_t spe, t_max, total, saved_step;
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.steps_per_epoch", &spe));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.t_max", &t_max));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.total_steps", &total));
    RT_CHECK(rt_ckpt_meta_get_i64(m, "schedule.step", &saved_step));
    RT_REQUIRE(saved_step == step, RT_ERR_FORMAT, "%s: metadata 'schedule.step' is %lld, expected the step %lld",
               m->source, (long long)saved_step, (long long)step);
    rt_schedule s = *sc;
    if (spe > 0) s.steps_per_epoch = spe;
    if (c->optim.sched.t_max == RT_CONFIG_AUTO) s.t_max = t_max;
    if (c->optim.sched.total_steps == RT_CONFIG_AUTO) s.total_steps = total;
    rt_status st = rt_schedule_validate(&s);
    if (st != RT_OK) return rt_error_trace(__FILE__, __LINE__, "the checkpoint's schedule.* metadata"), st;
    bool kept = s.t_max != sc->t_max || s.total_steps != sc->total_steps || s.steps_per_epoch != sc->steps_per_epoch;
    if (kept && is_root(r)) {
        fprintf(r->out,
                "ringtrain: the schedule keeps its saved lengths (t_max %lld, total_steps %lld, %lld steps/epoch; "
                "this config alone gives %lld, %lld, %lld): set optim.t_max or optim.total_steps with "
                "checkpoint.allow_changes to re-plan it\n",
                (long long)s.t_max, (long long)s.total_steps, (long long)s.steps_per_epoch, (long long)sc->t_max,
                (long long)sc->total_steps, (long long)sc->steps_per_epoch);
        fflush(r->out);
    }
    *sc = s;
    return RT_OK;
}

/* Load r->resume_path (rank 0's choice: find_resume, share_resume). Every rank loads
 * it, checks the metadata against this run, and the ranks agree on the outcome. */
static rt_status resume(run *r) {
    const rt_config *c = r->cfg;
    r->resumed_step = -1;
    if (!r->resume_path[0]) return RT_OK;
    char path[RT_CKPT_PATH_MAX];
    rank_view(r, r->resume_path, path, sizeof path);
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    int64_t step = 0, epoch = 0, batches = 0, world = 0, batch = 0;
    rt_status st = rt_ckpt_load(path, r->model, &r->opt, &m);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    /* model.safetensors held the moving average and the "ema" state the raw weights */
    if (st == RT_OK && ema_active(r)) st = ema_swap(r);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch", &epoch);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "epoch_batches", &batches);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "world_size", &world);
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "global_batch", &batch);
    if (st == RT_OK && r->resume_step >= 0 && step != r->resume_step)
        st = RT_ERROR(RT_ERR_FORMAT, "checkpoint %s holds step %lld here, rank 0 chose it as step %lld", path,
                      (long long)step, (long long)r->resume_step);
    const char *text = st == RT_OK ? rt_ckpt_meta_get(&m, "config") : NULL;
    if (st == RT_OK && text) st = compare_config(r, path, text);
    if (st == RT_OK && batch != c->data.batch_size)
        st = RT_ERROR(RT_ERR_INVALID,
                      "checkpoint %s was trained with data.batch_size %lld, this run has %lld: resume with the same "
                      "global batch (checkpoint.resume: none starts afresh)",
                      path, (long long)batch, (long long)c->data.batch_size);
    if (st == RT_OK) st = restore_schedule(r, &m, step);
    const char *id = st == RT_OK ? rt_ckpt_meta_get(&m, "run_id") : NULL;
    if (id && *id) snprintf(r->run_id, sizeof r->run_id, "%s", id); /* else: the fresh one (an older checkpoint) */
    rt_ckpt_meta_free(&m);
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "checkpoint.resume");
    RT_CHECK(agree_loaded(r, st, r->resume_path));
    /* the rest of the epoch on another number of ranks: exact for the distributed sampler
     * (the epoch's order does not depend on it), not for partition (each rank's part does) */
    const rt_sampler_config *sc = &rt_loader_sampler(r->train_loader)->cfg;
    RT_REQUIRE(rt_sampler_resumable(sc, (int)world, batches * c->data.batch_size), RT_ERR_INVALID,
               "checkpoint %s stopped after batch %lld of epoch %lld on %lld rank(s), this run has %d: data.sampler "
               "partition cannot continue that epoch on another number of ranks (each rank's part of the data depends "
               "on it: some samples would be taken twice, others never); resume with %lld rank(s) (dist.nproc), from a "
               "checkpoint at an epoch's end, or with data.sampler: distributed",
               path, (long long)batches, (long long)epoch + 1, (long long)world, r->who.world_size, (long long)world);
    r->step = step;
    r->start_epoch = epoch;
    r->start_batches = batches;
    r->resumed_step = step;
    if (is_root(r)) {
        fprintf(r->out, "ringtrain: resuming from %s (step %lld, epoch %lld, batch %lld)\n", path, (long long)step,
                (long long)epoch + 1, (long long)batches);
        if (world != r->who.world_size) /* data.sampler distributed (partition refused above) */
            fprintf(r->out,
                    "ringtrain: the checkpoint was written by %lld rank(s), this run has %d: the rest of epoch %lld is "
                    "re-partitioned over %d rank(s) (data.sampler %s: the samples of the epoch's order not taken yet, "
                    "each once)\n",
                    (long long)world, r->who.world_size, (long long)epoch + 1, r->who.world_size,
                    rt_sampler_mode_name(sc->mode));
        fflush(r->out);
    }
    return RT_OK;
}

/* ---- the run ------------------------------------------------------------------------------ */

static void run_free(run *r) {
    for (int i = 0; i < 2; i++)
        for (int e = 0; e < EV_COUNT; e++) rt_event_destroy(r->pend[i].ev[e]);
    for (int i = 0; i < 2; i++) rt_event_destroy(r->pend[i].anchor);
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
    free(r->tta_x);
    free(r->tta_out);
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

/* ---- tracing (log.trace, docs/debugging.md) ----------------------------------------------- */

enum { TRACE_SPANS = 1 << 16, CLOCK_ROUNDS = 32 };

/* One 8-byte value to or from group rank `peer`: host memory, or through the device
 * scratch buffer when the transport takes device buffers only (nccl). */
static rt_status clock_xfer(run *r, bool send, int64_t *v, int peer, bool via_dev) {
    if (!via_dev) return send ? rt_send(r->pg, v, 1, RT_I64, peer) : rt_recv(r->pg, v, 1, RT_I64, peer);
    if (send) RT_CHECK(rt_memcpy(r->scratch_dev, r->dev, v, rt_device_cpu(), sizeof *v, NULL));
    RT_CHECK(send ? rt_send(r->pg, r->scratch_dev, 1, RT_I64, peer) : rt_recv(r->pg, r->scratch_dev, 1, RT_I64, peer));
    if (!send) RT_CHECK(rt_memcpy(v, rt_device_cpu(), r->scratch_dev, r->dev, sizeof *v, NULL));
    return RT_OK;
}

/* This rank's clock offset to rank 0's (t_rank0 = t + *off), by ping-pong with rank 0:
 * CLOCK_ROUNDS rounds, each a send of this rank's time and rank 0's reply with its own;
 * the round with the smallest round trip counts: rank 0 read its clock between this
 * rank's send and receive, so the offset is t0 - (t_send + t_recv) / 2 within half that
 * round trip (*err). Rank 0 answers the others one after another. */
static rt_status clock_offset(run *r, int64_t *off, int64_t *err, int64_t *rtt) {
    *off = *err = *rtt = 0;
    bool cuda = rt_device_is_cuda(r->dev);
    bool via_dev = cuda && rt_pg_transport(r->pg) == RT_TRANSPORT_NCCL;
    if (cuda && !via_dev) RT_CHECK(rt_pg_set_buffer_device(r->pg, rt_device_cpu())); /* host buffers below */
    rt_status st = RT_OK;
    if (is_root(r)) {
        for (int peer = 1; peer < r->who.world_size && st == RT_OK; peer++)
            for (int k = 0; k < CLOCK_ROUNDS && st == RT_OK; k++) {
                int64_t v = 0;
                st = clock_xfer(r, false, &v, peer, via_dev);
                v = (int64_t)rt_now_ns();
                if (st == RT_OK) st = clock_xfer(r, true, &v, peer, via_dev);
            }
    } else {
        int64_t best = INT64_MAX;
        for (int k = 0; k < CLOCK_ROUNDS && st == RT_OK; k++) {
            int64_t ts = (int64_t)rt_now_ns(), v = ts;
            st = clock_xfer(r, true, &v, 0, via_dev);
            if (st == RT_OK) st = clock_xfer(r, false, &v, 0, via_dev);
            int64_t tr = (int64_t)rt_now_ns();
            if (st == RT_OK && tr - ts < best) {
                best = tr - ts;
                *off = v - (ts + (tr - ts) / 2);
                *rtt = best;
                *err = (best + 1) / 2;
            }
        }
    }
    if (cuda && !via_dev) {
        rt_status s2 = rt_pg_set_buffer_device(r->pg, r->dev);
        if (st == RT_OK) st = s2;
    }
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "log.trace: measuring the clock offset to rank 0");
    return st;
}

/* log.trace: the recorder on, to RUN_DIR/trace-rank<r>.jsonl, with this rank's clock
 * offset to rank 0's in its header (written now, so even a run that fails early leaves
 * a file that says how its clock relates). */
static rt_status setup_trace(run *r) {
    if (!r->cfg->log.trace) return RT_OK;
    char path[RT_CONFIG_PATH_MAX + 32];
    RT_CHECK(rt_file_mkdirs(r->run_dir, "run directory"));
    snprintf(path, sizeof path, "%s/trace-rank%d.jsonl", r->run_dir, r->who.rank);
    RT_CHECK(rt_trace_start(path, TRACE_SPANS));
    int64_t off = 0, err = 0, rtt = 0;
    uint64_t t = rt_now_ns();
    if (r->pg) RT_CHECK(clock_offset(r, &off, &err, &rtt));
    rt_trace_span(RT_TRACK_MAIN, "clock alignment", t, rt_now_ns());
    rt_trace_set_header(r->who.rank, r->who.world_size, off, err, rtt);
    if (r->pg)
        RT_LOG_DEBUG("trace: clock offset to rank 0 %lld ns (error bound %lld ns)", (long long)off, (long long)err);
    return rt_trace_flush();
}

static rt_status traced_barrier(run *r) {
    if (!r->pg) return RT_OK;
    uint64_t t = rt_trace_now();
    RT_CHECK(rt_barrier(r->pg));
    rt_trace_end(RT_TRACK_MAIN, "barrier", t);
    return RT_OK;
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
    rt_launch_heartbeat();
    RT_CHECK(setup_trace(r));
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream); /* the stream contract (docs/dist.md) */
    RT_CHECK(share_resume(r));
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
    if (c->log.trace && rt_device_is_cuda(r->dev))
        for (int i = 0; i < 2; i++) RT_CHECK(rt_event_create(r->dev, &r->pend[i].anchor));
    char path[RT_CONFIG_PATH_MAX + 64];
    bool resumed = r->resumed_step >= 0;
    int64_t eval_logged = -1; /* the step of an eval line metrics.jsonl has already (a resume) */
    if (is_root(r)) {
        snprintf(path, sizeof path, "%s/metrics.jsonl", r->run_dir);
        if (resumed) RT_CHECK(truncate_metrics(path, r->step, &eval_logged));
        RT_CHECK(rt_metrics_open(path, resumed, &r->metrics));
        snprintf(path, sizeof path, "%s/config.yaml", r->run_dir);
        RT_CHECK(rt_config_write_file(c, path));
        char devs[32];
        json_t *fields =
            json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "world_size", r->who.world_size, "device",
                      rt_device_str(r->dev, devs, sizeof devs), "steps_per_epoch", (json_int_t)r->steps_per_epoch,
                      "total_steps", (json_int_t)r->total_steps, "global_batch", (json_int_t)c->data.batch_size,
                      "train_samples", (json_int_t)r->train_ds.n, "test_samples", (json_int_t)r->test_ds.n,
                      "parameters", (json_int_t)rt_model_num_parameters(r->model), "run_id", r->run_id);
        if (fields && resumed) json_object_set_new(fields, "resumed_from_step", json_integer(r->step));
        if (fields && restart_count() > 0) /* a restarted attempt (--max-restarts, or torchrun's) */
            json_object_set_new(fields, "restart_count", json_integer(restart_count()));
        RT_CHECK(rt_metrics_line(r->metrics, "start", fields));
    }
    if (c->log.all_ranks) {
        if (r->pg) RT_CHECK(rt_barrier(r->pg)); /* rank 0 made the folder */
        snprintf(path, sizeof path, "%s/metrics-rank%d.jsonl", r->run_dir, r->who.rank);
        if (resumed) RT_CHECK(truncate_metrics(path, r->step, NULL));
        RT_CHECK(rt_metrics_open(path, resumed, &r->rank_metrics));
    }
    bool tty = c->log.progress == RT_PROGRESS_ON || (c->log.progress == RT_PROGRESS_AUTO && isatty(fileno(out)));
    rt_progress_init(&r->progress, out, tty, c->log.every_steps, c->train.epochs, r->steps_per_epoch, r->total_steps,
                     r->step);
    if (is_root(r)) {
        char devs[32];
        fprintf(out,
                "ringtrain: %s (width %lld) on %s, %d rank(s), global batch %lld, %lld steps/epoch, %lld steps; run "
                "directory %s\n",
                rt_model_arch_name(c->model.arch), (long long)c->model.width, rt_device_str(r->dev, devs, sizeof devs),
                r->who.world_size, (long long)c->data.batch_size, (long long)r->steps_per_epoch,
                (long long)r->total_steps, r->run_dir);
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
            test_signal_at(r, "step", r->step + 1);
            rt_trace_set_step(r->step + 1, epoch);
            uint64_t t = rt_now_ns();
            rt_batch b;
            RT_CHECK(rt_loader_next(r->train_loader, &b));
            if (b.size == 0) {
                /* the epoch is over: its evaluation and checkpoint belong to its last step */
                rt_trace_set_step(r->step, epoch);
                next_batch = -1;
                break;
            }
            uint64_t t_data = rt_now_ns();
            if (rt_trace_enabled()) rt_trace_span(RT_TRACK_MAIN, "data", t, t_data);
            RT_CHECK(train_step(r, &b, (double)(t_data - t) * 1e-6, epoch));
            if (rt_trace_enabled()) rt_trace_span(RT_TRACK_MAIN, "step", t, rt_now_ns());
            test_kill_rank_at(r);
            if (r->flight_agreed) {
                r->flight_agreed = false;
                g_flight_signal = 0;
                flight_dump(r, "SIGUSR1");
            }
            rt_launch_heartbeat();
            next_batch = b.index + 1 < r->steps_per_epoch ? b.index + 1 : -1;
            bool every = c->checkpoint.every_steps > 0 && r->step % c->checkpoint.every_steps == 0;
            if (r->stop || every) {
                RT_CHECK(complete_in_order(r, true));
                RT_CHECK(save_checkpoint(r, epoch, b.index + 1, r->stop ? "stop" : "every_steps"));
                saved_at = r->step;
                if (!r->stop) RT_CHECK(agree_stop(r)); /* asked during the write: this one is kept */
            }
        }
        RT_CHECK(complete_in_order(r, true));
        rt_reducer_trace_flush(r->reducer);
        RT_CHECK(rt_trace_flush()); /* the epoch's spans (stream spans completed just above) */
        if (r->stop) break;
        bool last = epoch + 1 == c->train.epochs || r->step >= r->total_steps;
        if (is_root(r)) {
            rt_progress_break(&r->progress);
            char title[64];
            snprintf(title, sizeof title, "epoch %lld/%lld", (long long)epoch + 1, (long long)c->train.epochs);
            rt_stage_stats_print(r->stats, out, title);
        }
        if (last || (c->train.eval_every > 0 && (epoch + 1) % c->train.eval_every == 0)) {
            uint64_t t = rt_trace_now();
            RT_CHECK(evaluate(r, &loss, &acc, &samples));
            rt_trace_end(RT_TRACK_MAIN, "evaluation", t);
            if (r->metrics && r->step != eval_logged)
                RT_CHECK(rt_metrics_eval(r->metrics, r->step, epoch, loss, acc, samples));
            if (is_root(r)) {
                fprintf(out, "epoch %lld: test loss %.4f, accuracy %.2f%% (%lld samples)\n", (long long)epoch + 1, loss,
                        100.0 * acc, (long long)samples);
                fflush(out);
            }
            /* asked during the evaluation: stop after it (after the run's last one, finish:
             * only the end-of-run check and the model file are left) */
            if (!last) RT_CHECK(agree_stop(r));
        }
        /* at the epoch's end, always at the end of the run, and on a stop (unless one of
         * this step is written) */
        bool every = c->checkpoint.every_epochs > 0 && (epoch + 1) % c->checkpoint.every_epochs == 0;
        if ((every || last || r->stop) && saved_at != r->step) {
            const char *why = r->stop ? "stop" : last ? "end" : "every_epochs";
            /* train.max_steps can end the run in mid-epoch: the position is then the next
             * batch of this epoch, so a resume that trains longer does not skip its rest */
            if (next_batch >= 0)
                RT_CHECK(save_checkpoint(r, epoch, next_batch, r->stop ? why : "end"));
            else
                RT_CHECK(save_checkpoint(r, epoch + 1, 0, why));
            saved_at = r->step;
            if (!r->stop && !last) RT_CHECK(agree_stop(r)); /* asked during the write: this one is kept */
        }
        if (r->stop) break;
    }
    res->stopped = r->stop;
    res->stop_signal = r->stop_signal;
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", r->ckpt_dir);
    res->resumed_step = r->resumed_step;
    if (r->stop) { /* a clean stop: the checkpoint is written, nothing else to do */
        res->steps = r->step;
        res->epochs = epoch;
        res->wall_s = (double)(rt_now_ns() - r->t0) * 1e-9;
        if (r->metrics)
            RT_CHECK(rt_metrics_line(r->metrics, "stop",
                                     json_pack("{s:I, s:i}", "step", (json_int_t)r->step, "signal", r->stop_signal)));
        RT_CHECK(traced_barrier(r));
        return RT_OK;
    }
    if (isnan(acc)) { /* resumed from the end of a finished run: nothing left to train */
        RT_CHECK(evaluate(r, &loss, &acc, &samples));
        if (r->metrics && r->step != eval_logged) /* its evaluation was logged before the checkpoint */
            RT_CHECK(rt_metrics_eval(r->metrics, r->step, epoch, loss, acc, samples));
    }
    RT_CHECK(check_in_sync(r, true, "at the end of training"));
    if (is_root(r)) { /* the trained weights, as torchvision's state_dict */
        snprintf(path, sizeof path, "%s/model.safetensors", r->run_dir);
        bool ema = ema_active(r); /* the weights evaluation uses */
        if (ema) RT_CHECK(ema_swap(r));
        RT_CHECK(rt_model_ctx_sync(r->ctx));
        RT_CHECK(rt_model_save(r->model, path));
        if (ema) RT_CHECK(ema_swap(r));
    }
    res->steps = r->step;
    res->epochs = epoch;
    res->test_loss = loss;
    res->test_accuracy = acc;
    res->test_samples = samples;
    res->wall_s = (double)(rt_now_ns() - r->t0) * 1e-9;
    if (r->metrics) /* NaN (a diverged model's test loss) is null: JSON has no NaN */
        RT_CHECK(rt_metrics_line(r->metrics, "end",
                                 json_pack("{s:I, s:o, s:o, s:o}", "steps", (json_int_t)res->steps, "wall_s",
                                           rt_metrics_num(res->wall_s), "test_accuracy", rt_metrics_num(acc),
                                           "test_loss", rt_metrics_num(loss))));
    RT_CHECK(traced_barrier(r));
    return RT_OK;
}

rt_status rt_train(const rt_config *cfg, const rt_train_rank *who, FILE *out, rt_train_result *res) {
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.who = *who;
    r.out = out ? out : stdout;
    struct sigaction sa, old_int, old_term, old_usr1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* a stop request arrives in the middle of any work: restart, do not fail */
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    g_flight_signal = 0;
    sa.sa_handler = on_flight_signal;
    sigaction(SIGUSR1, &sa, &old_usr1);
    rt_status s = train_all(&r, res);
    if (rt_trace_enabled()) { /* the spans since the last epoch's end (a failure's included) */
        rt_error_record saved_err;
        if (s != RT_OK) rt_error_save(&saved_err);
        rt_reducer_trace_flush(r.reducer);
        rt_status fs = rt_trace_flush();
        if (s != RT_OK)
            rt_error_restore(&saved_err); /* the run's error comes first */
        else
            s = fs;
        rt_trace_stop();
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    rt_error_record saved;
    if (s != RT_OK) rt_error_save(&saved);             /* freeing must not lose the first error */
    if (s != RT_OK) flight_dump(&r, "the run failed"); /* what the group did last; after the group exists */
    sigaction(SIGUSR1, &old_usr1, NULL);
    run_free(&r);
    if (s != RT_OK) rt_error_restore(&saved);
    return s;
}

/* ---- evaluation of a checkpoint ---------------------------------------------------------- */

/* Rank 0's choice for `ringtrain eval`: the given checkpoint, or ("") the newest valid
 * one of checkpoint.dir. */
static rt_status choose_eval(run *r, const char *ckpt) {
    if (ckpt && *ckpt) {
        snprintf(r->resume_path, sizeof r->resume_path, "%s", ckpt);
        return RT_OK;
    }
    char dir[RT_CKPT_PATH_MAX];
    rank_view(r, r->ckpt_dir, dir, sizeof dir);
    rt_ckpt_found found;
    RT_CHECK(rt_ckpt_find(dir, &found));
    RT_REQUIRE(found.path[0], RT_ERR_INVALID, "no checkpoint in %s to evaluate (train first, or give a ckpt-* path)",
               dir);
    for (int i = 0; i < found.n_skipped; i++)
        RT_LOG_WARN("checkpoint %s refused: %s; trying the one before", found.skipped[i].path, found.skipped[i].reason);
    snprintf(r->resume_path, sizeof r->resume_path, "%s", found.path);
    r->resume_step = found.step;
    return RT_OK;
}

/* ckpt: a checkpoint directory, or "" for the newest of checkpoint.dir; rank 0 chooses,
 * every rank evaluates that one (or the job fails naming it). */
static rt_status eval_all(run *r, const char *ckpt, rt_train_result *res) {
    const rt_config *c = r->cfg;
    rt_train_run_dir(c, r->run_dir, sizeof r->run_dir);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    RT_CHECK(rt_device_select(c->train.device, r->who.local_rank, &r->dev));
    RT_CHECK(load_data(r));
    RT_CHECK(setup_group(r));
    rt_train_ckpt_dir(c, r->ckpt_dir, sizeof r->ckpt_dir);
    r->resume_step = -1;
    if (is_root(r) && choose_eval(r, ckpt) != RT_OK) { /* told to every rank by share_resume */
        rt_error_save(&r->choose_err);
        r->choose_failed = true;
        r->resume_path[0] = '\0';
    }
    RT_CHECK(setup_model(r)); /* rank 0: the checkpoint's convolution algorithms (GPU) */
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream);
    RT_CHECK(share_resume(r));
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", r->resume_path);
    char path[RT_CKPT_PATH_MAX];
    rank_view(r, r->resume_path, path, sizeof path);
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = rt_ckpt_load(path, r->model, NULL, &m);
    int64_t step = 0;
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    if (st == RT_OK && r->resume_step >= 0 && step != r->resume_step)
        st = RT_ERROR(RT_ERR_FORMAT, "checkpoint %s holds step %lld here, rank 0 chose it as step %lld", path,
                      (long long)step, (long long)r->resume_step);
    rt_ckpt_meta_free(&m);
    RT_CHECK(agree_loaded(r, st, r->resume_path));
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
