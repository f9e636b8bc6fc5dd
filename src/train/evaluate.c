/* Evaluation: the test set (and data.val_split's validation set) split over the ranks
 * (each sample once), plain cross-entropy and accuracy summed over the ranks; with a moving average of the weights
 * (train.ema_*) the average is evaluated, with eval.tta the mean of each batch's and its mirror's outputs. Also
 * `ringtrain eval`: the model of one checkpoint evaluated the same way. */
#include "train/internal/run.h"

#include "core/timer.h"
#include "dist/launch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* train.ema_decay: the parameters' moving average lives in the optimizer's "ema" state;
 * evaluation, checkpoints and the run's model.safetensors see it by swapping it with the
 * model's parameters (and back). Before the first update (step < train.ema_every) there
 * is no average yet and the raw weights are used. */
bool rt_run_ema_active(const run *r) {
    return r->upd.have_opt && rt_optimizer_ema(&r->upd.opt) &&
           rt_optimizer_get_steps(&r->upd.opt) >= r->upd.opt.cfg.ema_every;
}

rt_status rt_run_ema_swap(run *r) {
    return rt_optimizer_ema_swap(&r->upd.opt, rt_model_params(r->model)->base, r->ctx->stream);
}

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

/* the evaluation of the moving average when there is one (AveragedModel(use_buffers=False):
 * the averaged parameters with the model's batch-norm buffers) */
/* eval.tta: the buffers of the mirrored batch and its outputs, made at the first use */
static rt_status tta_buffers(run *r, const rt_model_config *mc) {
    if (r->bufs.tta_x) return RT_OK;
    size_t img = rt_dataset_image_bytes(&r->data.test_ds), bmax = (size_t)mc->max_batch, k = (size_t)mc->num_classes;
    r->bufs.tta_x = malloc(sizeof(float) * img * bmax);
    r->bufs.tta_out = malloc(sizeof(float) * bmax * k);
    RT_CHECK_ALLOC(r->bufs.tta_x, sizeof(float) * img * bmax);
    RT_CHECK_ALLOC(r->bufs.tta_out, sizeof(float) * bmax * k);
    return RT_OK;
}

/* n images of the test set from the host to the model's input buffer (a GPU's) */
static rt_status eval_to_device(run *r, const float *images, int n) {
    size_t img = rt_dataset_image_bytes(&r->data.test_ds);
    return rt_memcpy(r->bufs.x_dev, r->dev, images, rt_device_cpu(), sizeof(float) * img * (size_t)n, r->ctx->stream);
}

/* The model's n output rows to `host` (the copy is ordered on the model's stream). */
static rt_status outputs_to_host(run *r, float *host, int n) {
    size_t k = (size_t)rt_model_config_of(r->model)->num_classes;
    return rt_memcpy(host, rt_device_cpu(), rt_model_output(r->model), r->dev, sizeof(float) * (size_t)n * k,
                     r->ctx->stream);
}

/* One batch's summed loss into *loss and its outputs into out_host; x, y where the model
 * reads them, b's labels on the host. */
static rt_status eval_batch(run *r, const rt_batch *b, const float *x, const int64_t *y, double *loss) {
    int k = rt_model_config_of(r->model)->num_classes;
    RT_CHECK(rt_model_forward(r->model, x, b->size, false));
    if (!r->cfg->train.tta_flip) {
        RT_CHECK(rt_model_loss(r->model, y));
        RT_CHECK(outputs_to_host(r, r->bufs.out_host, b->size));
        float l; /* rt_model_loss_value syncs the model's stream: the logits above are in too */
        RT_CHECK(rt_model_loss_value(r->model, &l));
        *loss = (double)l * b->size;
        return RT_OK;
    }
    /* the mirrored batch through the same (eval-mode) model, then the mean of the two */
    RT_CHECK(outputs_to_host(r, r->bufs.out_host, b->size));
    RT_CHECK(rt_model_ctx_sync(r->ctx)); /* the first forward is done with x_dev */
    const float *xf = r->bufs.tta_x;
    if (rt_device_is_cuda(r->dev)) {
        RT_CHECK(eval_to_device(r, r->bufs.tta_x, b->size));
        xf = r->bufs.x_dev;
    }
    RT_CHECK(rt_model_forward(r->model, xf, b->size, false));
    RT_CHECK(outputs_to_host(r, r->bufs.tta_out, b->size));
    RT_CHECK(rt_model_ctx_sync(r->ctx));
    *loss = tta_average(r->bufs.out_host, r->bufs.tta_out, b->labels, b->size, k);
    return RT_OK;
}

/* the rows of out (n, k) whose largest output is the label */
static double count_correct(const float *out, const int64_t *labels, int n, int k) {
    double correct = 0;
    for (int i = 0; i < n; i++) {
        const float *o = out + (size_t)i * (size_t)k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (o[j] > o[best]) best = j;
        correct += best == labels[i];
    }
    return correct;
}

/* One evaluation set (the test set, or data.val_split's) through the model: its summed
 * loss, correct answers and samples, all-reduced. */
static rt_status evaluate_set(run *r, rt_loader *loader, double *loss, double *acc, int64_t *samples) {
    const rt_model_config *mc = rt_model_config_of(r->model);
    double sums[3] = {0, 0, 0}; /* loss * n, correct, n */
    bool tta = r->cfg->train.tta_flip;
    RT_CHECK(rt_loader_start_epoch(loader, 0));
    for (int64_t batches = 0;; batches++) {
        rt_launch_heartbeat();
        if (batches == 1 && loader == r->data.test_loader) rt_run_test_signal_at(r, "eval", r->step);
        if (rt_run_flight_signal()) { /* this rank's alone: evaluation has no agreement per batch */
            rt_run_flight_clear();
            rt_run_flight_dump(r, "SIGUSR1 in evaluation");
        }
        rt_batch b;
        RT_CHECK(rt_loader_next(loader, &b));
        if (b.size == 0) break;
        const float *x = b.images;
        const int64_t *y = b.labels;
        if (tta) flip_images(b.images, b.size, r->data.test_ds.c, r->data.test_ds.h, r->data.test_ds.w, r->bufs.tta_x);
        if (rt_device_is_cuda(r->dev)) {
            RT_CHECK(eval_to_device(r, b.images, b.size));
            RT_CHECK(rt_memcpy(r->bufs.label_dev, r->dev, b.labels, rt_device_cpu(), sizeof(int64_t) * (size_t)b.size,
                               r->ctx->stream));
            RT_CHECK(rt_loader_release_after(loader, &b, r->ctx->stream)); /* the pinned slot, after the copy */
            x = r->bufs.x_dev;
            y = r->bufs.label_dev;
        }
        double l = 0;
        RT_CHECK(eval_batch(r, &b, x, y, &l));
        sums[0] += l;
        sums[1] += count_correct(r->bufs.out_host, b.labels, b.size, mc->num_classes);
        sums[2] += b.size;
    }
    RT_CHECK(rt_run_all_reduce_f64(r, sums, 3, RT_OP_SUM));
    *samples = (int64_t)sums[2];
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    return RT_OK;
}

/* The test set, then the validation set where data.val_split holds one out. */
static rt_status evaluate_model(run *r, run_eval *e) {
    RT_CHECK(rt_run_test_bn_perturb(r));
    RT_CHECK(rt_run_broadcast_state(r, false)); /* batch-norm running statistics of rank 0 */
    const rt_model_config *mc = rt_model_config_of(r->model);
    /* evaluation reports plain cross-entropy whatever the training loss's smoothing */
    double smoothing = rt_model_label_smoothing(r->model);
    RT_CHECK(rt_model_set_label_smoothing(r->model, 0.0));
    if (r->cfg->train.tta_flip) RT_CHECK(tta_buffers(r, mc));
    *e = (run_eval){.val_loss = NAN, .val_acc = NAN};
    RT_CHECK(evaluate_set(r, r->data.test_loader, &e->loss, &e->acc, &e->samples));
    if (r->data.val_loader) RT_CHECK(evaluate_set(r, r->data.val_loader, &e->val_loss, &e->val_acc, &e->val_samples));
    return rt_model_set_label_smoothing(r->model, smoothing);
}

rt_status rt_run_evaluate(run *r, run_eval *e) {
    bool ema = rt_run_ema_active(r);
    if (ema) RT_CHECK(rt_run_ema_swap(r));
    rt_status st = evaluate_model(r, e);
    if (ema) {
        rt_status s2 = rt_run_ema_swap(r);
        if (st == RT_OK) st = s2;
    }
    return st;
}

/* Rank 0's choice for `ringtrain eval`: the given checkpoint, or ("") the newest valid
 * one of checkpoint.dir. */
static rt_status choose_eval(run *r, const char *ckpt) {
    if (ckpt && *ckpt) {
        snprintf(r->ckpt.chosen_path, sizeof r->ckpt.chosen_path, "%s", ckpt);
        return RT_OK;
    }
    char dir[RT_CKPT_PATH_MAX];
    rt_run_rank_view(r, r->ckpt.dir, dir, sizeof dir);
    rt_ckpt_found found;
    RT_CHECK(rt_ckpt_find(dir, &found));
    RT_REQUIRE(found.path[0], RT_ERR_INVALID, "no checkpoint in %s to evaluate (train first, or give a ckpt-* path)",
               dir);
    for (int i = 0; i < found.n_skipped; i++)
        RT_LOG_WARN("checkpoint %s refused: %s; trying the one before", found.skipped[i].path, found.skipped[i].reason);
    snprintf(r->ckpt.chosen_path, sizeof r->ckpt.chosen_path, "%s", found.path);
    r->ckpt.chosen_step = found.step;
    return RT_OK;
}

/* ckpt: a checkpoint directory, or "" for the newest of checkpoint.dir; rank 0 chooses,
 * every rank evaluates that one (or the job fails naming it). */
static rt_status eval_all(run *r, const char *ckpt, rt_train_result *res) {
    const rt_config *c = r->cfg;
    rt_train_run_dir(c, r->run_dir, sizeof r->run_dir);
    snprintf(res->run_dir, sizeof res->run_dir, "%s", r->run_dir);
    RT_CHECK(rt_device_select(c->train.device, r->who.local_rank, &r->dev));
    RT_CHECK(rt_run_load_data(r));
    RT_CHECK(rt_run_setup_group(r));
    rt_train_ckpt_dir(c, r->ckpt.dir, sizeof r->ckpt.dir);
    r->ckpt.chosen_step = -1;
    if (is_root(r) && choose_eval(r, ckpt) != RT_OK) { /* told to every rank by share_resume */
        rt_error_save(&r->ckpt.choose_err);
        r->ckpt.choose_failed = true;
        r->ckpt.chosen_path[0] = '\0';
    }
    RT_CHECK(rt_run_setup_model(r)); /* rank 0: the checkpoint's convolution algorithms (GPU) */
    if (r->pg) rt_pg_set_stream(r->pg, r->ctx->stream);
    RT_CHECK(rt_run_share_resume(r));
    snprintf(res->checkpoint_dir, sizeof res->checkpoint_dir, "%s", r->ckpt.chosen_path);
    char path[RT_CKPT_PATH_MAX];
    rt_run_rank_view(r, r->ckpt.chosen_path, path, sizeof path);
    rt_ckpt_meta m;
    rt_ckpt_meta_init(&m);
    rt_status st = rt_ckpt_load(path, r->model, NULL, &m);
    int64_t step = 0;
    if (st == RT_OK) st = rt_ckpt_meta_get_i64(&m, "step", &step);
    if (st == RT_OK && r->ckpt.chosen_step >= 0 && step != r->ckpt.chosen_step)
        st = RT_ERROR(RT_ERR_FORMAT, "checkpoint %s holds step %lld here, rank 0 chose it as step %lld", path,
                      (long long)step, (long long)r->ckpt.chosen_step);
    rt_ckpt_meta_free(&m);
    RT_CHECK(rt_run_agree_loaded(r, st, r->ckpt.chosen_path));
    RT_CHECK(rt_run_setup_loaders(r, false));
    uint64_t t0 = rt_now_ns();
    run_eval e;
    RT_CHECK(rt_run_evaluate(r, &e));
    res->test_loss = e.loss;
    res->test_accuracy = e.acc;
    res->test_samples = e.samples;
    res->val_loss = e.val_loss;
    res->val_accuracy = e.val_acc;
    res->val_samples = e.val_samples;
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
    rt_run_free(&r);
    if (s != RT_OK) rt_error_restore(&saved);
    return s;
}
