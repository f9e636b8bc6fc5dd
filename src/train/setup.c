/* The run's setup: the datasets, the process group, the model (on a GPU with the same
 * convolution algorithms on every rank), the loaders, the optimizer with its schedule and
 * clipping, and the gradient reducer; each from the config's keys as the areas hold them,
 * with the autos that depend on the run resolved here (one place per area). */
#include "train/internal/run.h"

#include "core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* data.val_split: the training set's held-out samples into val_ds (the same on every rank:
 * rt_dataset_split draws from train.seed alone), the rest the training set; the held-out
 * indices' FNV-1a goes into metrics.jsonl's start line, so runs can be compared. */
static rt_status split_val(run *r) {
    const rt_config *c = r->cfg;
    int64_t n = c->data.val_split < r->data.train_ds.n ? c->data.val_split : 0; /* 0: the split's error */
    int64_t *held = malloc(sizeof *held * (size_t)(n > 0 ? n : 1));
    RT_CHECK_ALLOC(held, sizeof *held * (size_t)(n > 0 ? n : 1));
    rt_dataset train;
    rt_status s =
        rt_dataset_split(&r->data.train_ds, c->data.val_split, (uint64_t)c->train.seed, &train, &r->data.val_ds, held);
    if (s == RT_OK) {
        uint64_t h = 14695981039346656037ull;
        for (int64_t i = 0; i < n; i++)
            for (int k = 0; k < 8; k++) h = (h ^ (uint8_t)((uint64_t)held[i] >> (8 * k))) * 1099511628211ull;
        r->data.val_fingerprint = h;
        rt_dataset_free(&r->data.train_ds);
        r->data.train_ds = train;
        r->data.have_val = true;
    }
    free(held);
    return s;
}

rt_status rt_run_load_data(run *r) {
    const rt_config *c = r->cfg;
    rt_dataset_kind kind = c->data.kind;
    rt_status s = rt_dataset_load_label(c->data.path, "train", kind, c->data.label, &r->data.train_ds);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "data.path: the training set"), s;
    r->data.have_train = true;
    s = rt_dataset_load_label(c->data.path, "test", kind, c->data.label, &r->data.test_ds);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "data.path: the test set"), s;
    r->data.have_test = true;
    if (c->data.train_subset > 0 && c->data.train_subset < r->data.train_ds.n)
        r->data.train_ds.n = c->data.train_subset;
    if (c->data.test_subset > 0 && c->data.test_subset < r->data.test_ds.n) r->data.test_ds.n = c->data.test_subset;
    return c->data.val_split > 0 ? split_val(r) : RT_OK;
}

/* The process group (none with one rank): the dist.* keys as the config holds them in
 * the group's options, with the run-time fields (rendezvous, ranks, buffers on the
 * training device). */
rt_status rt_run_setup_group(run *r) {
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
    if (!r->ckpt.chosen_path[0] || !r->cfg->train.ctx.deterministic) return RT_OK;
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = rt_ckpt_verify(r->ckpt.chosen_path, &m);
    const char *dev = st == RT_OK ? rt_ckpt_meta_get(&m, "device") : NULL;
    const char *det = st == RT_OK ? rt_ckpt_meta_get(&m, "cudnn.deterministic") : NULL;
    if (dev && strcmp(dev, "cuda") == 0) {
        if (det && strcmp(det, "true") == 0) {
            st = rt_ckpt_meta_get_conv_algos(&m, "cudnn.conv_algos", out);
        } else {
            fprintf(r->out,
                    "ringtrain: %s chose its convolution algorithms with train.deterministic off: choosing afresh "
                    "(this resume is not bit-exact)\n",
                    r->ckpt.chosen_path);
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
 * takes the checkpoint's choice (a deterministic resume, timed or not: nothing is timed
 * again) and searches the shapes it lacks (by timing with train.cudnn_benchmark); the
 * other ranks take rank 0's choice (broadcast) instead of searching, so the checkpoint's
 * record (rank 0's) is what every rank ran. The CPU has nothing to choose. */
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
            if (recorded)
                fprintf(r->out, "ringtrain: the convolution algorithms of %s (%d shapes)\n", r->ckpt.chosen_path, a->n);
            else if (r->ctx->benchmark)
                fprintf(
                    r->out,
                    "ringtrain: timed the convolution algorithms of %d shapes (train.cudnn_benchmark): another fresh "
                    "run may choose otherwise; the checkpoints record this choice\n",
                    a->n);
            fflush(r->out);
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

/* data.eval_batch_size; auto: the global batch of a micro-batch (batch_size / train.accumulate:
 * evaluation needs no more memory than a training micro-batch) */
static int64_t eval_global(const rt_config *c) {
    return c->data.eval_batch_size == RT_CONFIG_AUTO ? c->data.batch_size / c->train.accumulate
                                                     : c->data.eval_batch_size;
}

/* model.sync_bn: the model's batch norms sum their statistics over the ranks through the
 * group, queued behind the gradient buckets already started (one group, one order on
 * every rank). On a GPU the sum runs on the group's stream after the work on the model's
 * stream and the model's stream waits for it on the device (no host wait; capturable
 * with nccl, so a captured step holds these sums too); on the CPU it is done on return. */
static rt_status bn_all_reduce(void *user, double *buf, size_t count, rt_stream *stream) {
    run *r = user;
    rt_stream *saved = rt_pg_stream(r->pg);
    rt_pg_set_stream(r->pg, stream);
    rt_pg_set_op_tag(r->pg, "sync_bn");
    rt_request *req = NULL;
    rt_status st = rt_iall_reduce(r->pg, buf, count, RT_F64, RT_OP_SUM, &req);
    if (st == RT_OK) st = rt_wait_stream(req, stream);
    rt_pg_set_stream(r->pg, saved);
    return st;
}

rt_status rt_run_setup_model(run *r) {
    const rt_config *c = r->cfg;
    rt_model_config mc = resolved_model(c, &r->data.train_ds);
    /* the model runs one micro-batch at a time (train.accumulate; the whole rank's batch
     * without it): its activations are sized for that */
    int per_rank = (int)(c->data.batch_size / r->who.world_size / c->train.accumulate);
    r->accum.micro = per_rank;
    int eval_per_rank = (int)(eval_global(c) / r->who.world_size);
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
    if (c->sync_bn && r->pg) RT_CHECK(rt_model_set_bn_sync(r->model, &(rt_bn_sync){bn_all_reduce, r}));
    RT_CHECK(rt_model_init_weights(r->model, (uint64_t)c->train.seed));
    rt_status ls = rt_model_set_label_smoothing(r->model, c->train.label_smoothing);
    if (ls != RT_OK) return rt_error_trace(__FILE__, __LINE__, "train.label_smoothing"), ls;
    RT_CHECK(rt_run_test_init_seed_rank(r));
    /* dropout masks differ between ranks (as torch's per-process RNG) but are reproducible */
    rt_model_set_dropout_seed(r->model, (uint64_t)c->train.seed * 1000003u + (uint64_t)r->who.rank);
    if (rt_device_is_cuda(r->dev)) {
        size_t img = rt_dataset_image_bytes(&r->data.train_ds);
        RT_CHECK(rt_malloc(r->dev, sizeof(float) * img * (size_t)mc.max_batch, (void **)&r->bufs.x_dev));
        RT_CHECK(rt_malloc(r->dev, sizeof(int64_t) * (size_t)mc.max_batch, (void **)&r->bufs.label_dev));
        RT_CHECK(rt_malloc(r->dev, RUN_SCRATCH_BYTES, &r->bufs.scratch_dev));
        RT_CHECK(rt_host_alloc(sizeof *r->bufs.vals_host, true, (void **)&r->bufs.vals_host, &r->bufs.vals_pinned));
        RT_CHECK(rt_event_create(r->dev, &r->bufs.ev_vals));
    }
    r->bufs.out_host = malloc(sizeof(float) * (size_t)mc.max_batch * (size_t)mc.num_classes);
    RT_CHECK_ALLOC(r->bufs.out_host, sizeof(float) * (size_t)mc.max_batch * (size_t)mc.num_classes);
    return RT_OK;
}

/* The test loader, and with `train` the training loader. */
rt_status rt_run_setup_loaders(run *r, bool train) {
    const rt_config *c = r->cfg;
    rt_loader_config lc = c->data.loader; /* the loader's keys, parsed once */
    lc.dataset = &r->data.train_ds;
    lc.world_size = r->who.world_size;
    lc.rank = r->who.rank;
    lc.global_batch = c->data.batch_size;
    lc.seed = (uint64_t)c->train.seed;
    lc.device = r->dev;
    if (train) RT_CHECK(rt_loader_create(&lc, &r->data.train_loader));

    rt_loader_config ec = rt_loader_config_default(&r->data.test_ds);
    ec.mode = RT_SAMPLER_EVAL;
    ec.world_size = r->who.world_size;
    ec.rank = r->who.rank;
    int64_t per = eval_global(c) / r->who.world_size;
    ec.global_batch = (per < 1 ? 1 : per) * r->who.world_size;
    ec.shuffle = false;
    ec.augment = false;
    ec.prefetch = c->data.loader.prefetch;
    ec.device = r->dev;
    RT_CHECK(rt_loader_create(&ec, &r->data.test_loader));
    if (r->data.have_val) { /* evaluated as the test set is */
        ec.dataset = &r->data.val_ds;
        RT_CHECK(rt_loader_create(&ec, &r->data.val_loader));
    }
    if (!train) return RT_OK;
    r->data.steps_per_epoch = rt_loader_batches_per_epoch(r->data.train_loader);
    /* every rank must take the same number of steps (their collectives pair up) */
    if (r->pg) {
        int64_t lo = r->data.steps_per_epoch, hi = lo;
        RT_CHECK(rt_run_all_reduce_host(r, &lo, 1, RT_I64, RT_OP_MIN));
        RT_CHECK(rt_run_all_reduce_host(r, &hi, 1, RT_I64, RT_OP_MAX));
        RT_REQUIRE(lo == hi, RT_ERR_INVALID,
                   "ranks would take %lld to %lld steps per epoch (data.sampler partition with a dataset that does not "
                   "split evenly; use data.sampler: distributed)",
                   (long long)lo, (long long)hi);
    }
    if (r->pg && r->data.have_val) { /* data.val_split: every rank must hold out the same samples */
        int64_t lo = (int64_t)r->data.val_fingerprint, hi = lo;
        RT_CHECK(rt_run_all_reduce_host(r, &lo, 1, RT_I64, RT_OP_MIN));
        RT_CHECK(rt_run_all_reduce_host(r, &hi, 1, RT_I64, RT_OP_MAX));
        RT_REQUIRE(lo == hi, RT_ERR_INVALID,
                   "data.val_split: the ranks hold out different training samples (their indices' fingerprints "
                   "differ): the split must be drawn from train.seed alone");
    }
    RT_REQUIRE(r->data.steps_per_epoch > 0, RT_ERR_INVALID,
               "data: %lld training samples give no batch of %lld on %d rank(s)", (long long)r->data.train_ds.n,
               (long long)c->data.batch_size, r->who.world_size);
    r->data.total_steps = r->data.steps_per_epoch * c->train.epochs;
    r->data.plan_steps = r->data.total_steps; /* train.max_steps stops the run, it does not shorten the schedule */
    if (c->train.max_steps > 0 && c->train.max_steps < r->data.total_steps) r->data.total_steps = c->train.max_steps;
    return RT_OK;
}

rt_status rt_run_setup_optim(run *r) {
    const rt_config *c = r->cfg;
    rt_optim_config oc = c->optim.opt; /* the optimizer's keys (train.ema_* too), NaN where auto */
    RT_CHECK(rt_optim_config_resolve(&oc));
    oc.no_decay = NULL;
    oc.n_no_decay = 0;
    size_t n = rt_model_params(r->model)->size / sizeof(float);
    if (c->optim.no_decay_bn_bias) {
        int np = rt_model_param_count(r->model);
        r->upd.no_decay = calloc((size_t)np, sizeof *r->upd.no_decay);
        RT_CHECK_ALLOC(r->upd.no_decay, sizeof *r->upd.no_decay * (size_t)np);
        for (int i = 0; i < np; i++) {
            const rt_param *p = rt_model_param(r->model, i);
            if (!rt_param_trainable(p) || rt_param_decays(p)) continue;
            r->upd.no_decay[oc.n_no_decay++] =
                (rt_optim_range){p->value.offset / sizeof(float), (size_t)rt_tensor_numel(&p->value)};
        }
        oc.no_decay = r->upd.no_decay;
    }
    rt_status s = rt_optim_config_validate(&oc, n);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "optim: the config's optimizer keys"), s;
    RT_CHECK(rt_optimizer_init(&r->upd.opt, &oc, r->dev, n));
    r->upd.have_opt = true;
    /* on the CPU, the update runs on the model's threads (train.threads) */
    rt_optimizer_set_parallel(&r->upd.opt, rt_model_ctx_parallel, r->ctx);

    r->upd.sched = c->optim.sched; /* the schedule's keys; auto where the config says so */
    rt_schedule *sc = &r->upd.sched;
    sc->base_lr = oc.lr;
    sc->steps_per_epoch = r->data.steps_per_epoch;
    /* auto lengths fit the planned run (train.epochs): a run stopped by train.max_steps and
     * resumed with more steps follows the schedule of the uninterrupted run */
    int64_t units = sc->per_epoch ? (r->data.plan_steps + r->data.steps_per_epoch - 1) / r->data.steps_per_epoch
                                  : r->data.plan_steps;
    if (sc->t_max == RT_CONFIG_AUTO) sc->t_max = units - sc->warmup_steps;
    if (sc->t_max < 1) sc->t_max = 1;
    if (isnan(sc->max_lr)) sc->max_lr = oc.lr;
    if (sc->total_steps == RT_CONFIG_AUTO) sc->total_steps = units;
    sc->cycle_momentum = sc->cycle_momentum && rt_optim_config_has_momentum(&oc);
    s = rt_schedule_validate(sc);
    if (s != RT_OK) return rt_error_trace(__FILE__, __LINE__, "optim: the config's schedule keys"), s;
    RT_CHECK(rt_grad_clip_init(&r->upd.clip, r->dev));
    r->upd.have_clip = true;
    return RT_OK;
}

rt_status rt_run_setup_reducer(run *r) {
    if (!r->pg) return RT_OK;
    int nb = rt_model_block_count(r->model);
    r->upd.bounds = malloc(sizeof *r->upd.bounds * (size_t)(nb + 1));
    RT_CHECK_ALLOC(r->upd.bounds, sizeof *r->upd.bounds * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) rt_model_block_range(r->model, b, &r->upd.bounds[b], &r->upd.bounds[b + 1]);
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
    return rt_reducer_create(r->pg, rt_model_grads(r->model)->base, r->upd.bounds, nb, &ro, &r->upd.reducer);
}

/* The epoch tables' statistics and the events of the two steps whose timing records may
 * be pending (timing.c); with log.trace on a GPU, their anchors. */
rt_status rt_run_setup_events(run *r) {
    RT_CHECK(rt_stage_stats_create(&r->log.stats));
    for (int i = 0; i < 2; i++)
        for (int e = 0; e < EV_COUNT; e++) RT_CHECK(rt_event_create(r->dev, &r->log.pend[i].ev[e]));
    if (r->cfg->log.trace && rt_device_is_cuda(r->dev))
        for (int i = 0; i < 2; i++) RT_CHECK(rt_event_create(r->dev, &r->log.pend[i].anchor));
    return RT_OK;
}
