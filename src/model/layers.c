/* Layers: shape set-up, argument checks, and dispatch to the device's backend.
 *
 * The arithmetic lives in the backends (cpu/, cuda/); this file only makes sure every
 * backend sees valid arguments, so a wrong call gets one clear error whatever the
 * device. */
#include "model/layers.h"

#include "model/internal/backend.h"
#include "model/profile.h"

#include "core/cost_ledger.h"
#include "core/timer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define OPS(ctx, fn)                                                                                                   \
    do {                                                                                                               \
        if (!(ctx)->ops->fn) RT_FAIL(RT_ERR_UNSUPPORTED, "the %s model backend has no " #fn, (ctx)->ops->name);        \
    } while (0)

#define REQUIRE_N(n) RT_REQUIRE((n) > 0, RT_ERR_INVALID, "batch size %d (expected > 0)", (n))

static rt_status vec(rt_tensor *t, rt_dtype dtype, int64_t n) {
    return rt_tensor_init(t, dtype, 1, (int64_t[]){n}, rt_device_cpu());
}

/* ---- setup ---------------------------------------------------------------------- */

rt_status rt_conv2d_init(rt_conv2d *l, int in_c, int out_c, int in_h, int in_w, int k, int stride, int pad,
                         bool has_bias) {
    *l = (rt_conv2d){0};
    RT_REQUIRE(in_c > 0 && out_c > 0 && in_h > 0 && in_w > 0, RT_ERR_INVALID,
               "conv2d %d->%d channels on %dx%d input (all must be > 0)", in_c, out_c, in_h, in_w);
    RT_REQUIRE(k > 0 && stride > 0 && pad >= 0, RT_ERR_INVALID, "conv2d kernel %d stride %d pad %d", k, stride, pad);
    RT_REQUIRE(in_h + 2 * pad >= k && in_w + 2 * pad >= k, RT_ERR_INVALID,
               "conv2d kernel %d larger than the padded %dx%d input", k, in_h + 2 * pad, in_w + 2 * pad);
    l->in_c = in_c;
    l->out_c = out_c;
    l->in_h = in_h;
    l->in_w = in_w;
    l->k = k;
    l->stride = stride;
    l->pad = pad;
    l->has_bias = has_bias;
    l->out_h = (in_h + 2 * pad - k) / stride + 1;
    l->out_w = (in_w + 2 * pad - k) / stride + 1;
    l->x_c = in_c;
    RT_CHECK(rt_tensor_init(&l->weight, RT_F32, 4, (int64_t[]){out_c, in_c, k, k}, rt_device_cpu()));
    l->dweight = l->weight;
    if (has_bias) {
        RT_CHECK(vec(&l->bias, RT_F32, out_c));
        l->dbias = l->bias;
    }
    return RT_OK;
}

rt_status rt_batchnorm2d_init(rt_batchnorm2d *l, int c, int h, int w) {
    *l = (rt_batchnorm2d){0};
    RT_REQUIRE(c > 0 && h > 0 && w > 0, RT_ERR_INVALID, "batchnorm2d of %dx%dx%d", c, h, w);
    l->c = c;
    l->h = h;
    l->w = w;
    l->eps = 1e-5f;
    l->momentum = 0.1f;
    RT_CHECK(vec(&l->weight, RT_F32, c));
    RT_CHECK(vec(&l->bias, RT_F32, c));
    l->dweight = l->weight;
    l->dbias = l->bias;
    RT_CHECK(vec(&l->running_mean, RT_F32, c));
    RT_CHECK(vec(&l->running_var, RT_F32, c));
    RT_CHECK(rt_tensor_init(&l->num_batches_tracked, RT_I64, 0, NULL, rt_device_cpu()));
    return RT_OK;
}

rt_status rt_maxpool2d_init(rt_maxpool2d *l, int c, int in_h, int in_w, int k, int stride, int pad) {
    *l = (rt_maxpool2d){0};
    RT_REQUIRE(c > 0 && in_h > 0 && in_w > 0 && k > 0 && stride > 0 && pad >= 0 && 2 * pad <= k, RT_ERR_INVALID,
               "maxpool2d k %d stride %d pad %d on %dx%dx%d (pad must be <= k/2)", k, stride, pad, c, in_h, in_w);
    RT_REQUIRE(in_h + 2 * pad >= k && in_w + 2 * pad >= k, RT_ERR_INVALID, "maxpool2d kernel %d larger than %dx%d", k,
               in_h + 2 * pad, in_w + 2 * pad);
    l->c = c;
    l->in_h = in_h;
    l->in_w = in_w;
    l->k = k;
    l->stride = stride;
    l->pad = pad;
    l->out_h = (in_h + 2 * pad - k) / stride + 1;
    l->out_w = (in_w + 2 * pad - k) / stride + 1;
    return RT_OK;
}

rt_status rt_linear_init(rt_linear *l, int in_f, int out_f) {
    *l = (rt_linear){0};
    RT_REQUIRE(in_f > 0 && out_f > 0, RT_ERR_INVALID, "linear %d -> %d", in_f, out_f);
    l->in_f = in_f;
    l->out_f = out_f;
    RT_CHECK(rt_tensor_init(&l->weight, RT_F32, 2, (int64_t[]){out_f, in_f}, rt_device_cpu()));
    RT_CHECK(vec(&l->bias, RT_F32, out_f));
    l->dweight = l->weight;
    l->dbias = l->bias;
    return RT_OK;
}

rt_status rt_dropout_init(rt_dropout *l, float p, bool channelwise, int c, int h, int w, uint64_t seed,
                          uint64_t subseq) {
    *l = (rt_dropout){0};
    RT_REQUIRE(p >= 0.0f && p < 1.0f, RT_ERR_INVALID, "dropout p = %g (expected 0 <= p < 1)", (double)p);
    RT_REQUIRE(c > 0 && h > 0 && w > 0, RT_ERR_INVALID, "dropout of %dx%dx%d", c, h, w);
    l->p = p;
    l->channelwise = channelwise;
    l->c = c;
    l->features = c * h * w;
    l->plane = channelwise ? h * w : 1;
    l->seed = seed;
    l->subseq = subseq;
    return RT_OK;
}

rt_status rt_conv2d_prepare(rt_model_ctx *ctx, rt_conv2d *l, int max_n, size_t *workspace) {
    *workspace = 0;
    REQUIRE_N(max_n);
    return ctx->ops->conv2d_prepare ? ctx->ops->conv2d_prepare(ctx, l, max_n, workspace) : RT_OK;
}
rt_status rt_batchnorm2d_prepare(rt_model_ctx *ctx, rt_batchnorm2d *l, int max_n) {
    REQUIRE_N(max_n);
    return ctx->ops->batchnorm2d_prepare ? ctx->ops->batchnorm2d_prepare(ctx, l, max_n) : RT_OK;
}
rt_status rt_maxpool2d_prepare(rt_model_ctx *ctx, rt_maxpool2d *l, int max_n) {
    REQUIRE_N(max_n);
    return ctx->ops->maxpool2d_prepare ? ctx->ops->maxpool2d_prepare(ctx, l, max_n) : RT_OK;
}
rt_status rt_linear_prepare(rt_model_ctx *ctx, rt_linear *l, int max_n, size_t *workspace) {
    *workspace = 0;
    REQUIRE_N(max_n);
    return ctx->ops->linear_prepare ? ctx->ops->linear_prepare(ctx, l, max_n, workspace) : RT_OK;
}
void rt_conv2d_release(rt_model_ctx *ctx, rt_conv2d *l) {
    if (l->priv && ctx->ops->conv2d_release) ctx->ops->conv2d_release(ctx, l);
    l->priv = NULL;
}
void rt_batchnorm2d_release(rt_model_ctx *ctx, rt_batchnorm2d *l) {
    if (l->priv && ctx->ops->batchnorm2d_release) ctx->ops->batchnorm2d_release(ctx, l);
    l->priv = NULL;
}
void rt_maxpool2d_release(rt_model_ctx *ctx, rt_maxpool2d *l) {
    if (l->priv && ctx->ops->maxpool2d_release) ctx->ops->maxpool2d_release(ctx, l);
    l->priv = NULL;
}
void rt_linear_release(rt_model_ctx *ctx, rt_linear *l) {
    if (l->priv && ctx->ops->linear_release) ctx->ops->linear_release(ctx, l);
    l->priv = NULL;
}

rt_status rt_conv2d_weights_prepare(rt_model_ctx *ctx, rt_conv2d *const *ls, int n, bool defer_grads, void **state) {
    *state = NULL;
    RT_REQUIRE(n >= 0 && (n == 0 || ls), RT_ERR_INVALID, "convolution weight copies of %d layers", n);
    return ctx->ops->conv2d_weights_prepare && n > 0
               ? ctx->ops->conv2d_weights_prepare(ctx, ls, n, defer_grads && ctx->ops->conv2d_weights_grads, state)
               : RT_OK;
}
void rt_conv2d_weights_release(rt_model_ctx *ctx, void *state) {
    if (state && ctx->ops->conv2d_weights_release) ctx->ops->conv2d_weights_release(ctx, state);
}

/* ---- per-layer profile (profile.h) ------------------------------------------------ */

typedef struct prof_call {
    uint64_t t0;
    int pair; /* event pair recorded before the call (rt_layer_profile_use_events), or -1 */
    bool on;  /* this call is timed (the outermost one with a profile attached) */
    bool ledger;       /* l0 holds the cost ledger at the call's start (emulated GPUs) */
    rt_cost_ledger l0; /* its totals then */
} prof_call;

/* the cost ledger's totals now into *l, when the process has one and it is on */
static bool prof_ledger_read(const rt_model_ctx *ctx, rt_cost_ledger *l) {
    const rt_cost_ledger_api *api = ctx->device.kind != RT_DEVICE_CPU ? rt_cost_ledger_find() : NULL;
    l->size = sizeof *l;
    return api && api->read(l) == 0 && l->mode != 0;
}

/* the ledger's difference over call c into its row r (before r->calls counts it) */
static void prof_ledger_add(const rt_model_ctx *ctx, const prof_call *c, rt_layer_prof_row *r) {
    rt_cost_ledger l1, d;
    if (!c->ledger || !prof_ledger_read(ctx, &l1)) return;
    rt_cost_ledger_diff(&l1, &c->l0, &d);
    if (r->calls == 0) r->ledger_first_op = c->l0.ops, r->ledger_nops = d.ops;
    r->ledger = true;
    r->ledger_bytes += d.bytes_read + d.bytes_written;
    r->ledger_flops += d.flops;
    r->ledger_modelled_s += d.modelled_s;
    r->ledger_launches += (long)d.launches;
    r->ledger_library_calls += (long)d.library_calls;
    r->ledger_copies += (long)(d.copies + d.fills);
    r->ledger_host_syncs += (long)d.host_syncs;
}

static prof_call prof_begin(rt_model_ctx *ctx) {
    rt_layer_profile *p = ctx->profile;
    prof_call c = {.pair = -1};
    if (!p || p->depth++ > 0) return c;
    c.ledger = prof_ledger_read(ctx, &c.l0);
    if (ctx->device.kind != RT_DEVICE_CPU && p->ev) { /* an event pair: nothing waits */
        if (p->npairs == p->pairs_cap) {
            p->overflow = true;
            return c;
        }
        if (rt_event_record(p->ev[2 * p->npairs], ctx->stream) != RT_OK) return c; /* the stream's error comes later */
        c.pair = p->npairs++;
    } else if (ctx->device.kind != RT_DEVICE_CPU) {
        (void)rt_stream_sync(ctx->stream); /* its error comes back later */
    }
    c.on = true;
    c.t0 = rt_now_ns();
    return c;
}

/* the row of (layer, kind, pass, shape, flops): a layer called with and without its
 * input gradient, or an elementwise layer at another size, has a row of each */
static rt_layer_prof_row *prof_row(rt_layer_profile *p, const void *layer, const char *kind, rt_prof_pass pass,
                                   const char *shape, double flops) {
    for (int i = 0; i < p->n; i++) {
        rt_layer_prof_row *r = &p->rows[i];
        if (r->layer == layer && r->pass == pass && r->flops == flops && strcmp(r->kind, kind) == 0 &&
            strcmp(r->shape, shape) == 0)
            return r;
    }
    if (p->n == p->cap) {
        p->overflow = true;
        return NULL;
    }
    rt_layer_prof_row *r = &p->rows[p->n++];
    *r = (rt_layer_prof_row){.layer = layer, .kind = kind, .pass = pass, .flops = flops};
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    return r;
}

/* Close a call begun by prof_begin: add its time to its row (prof_row; the shape printed
 * from fmt): the host's time after a stream synchronisation, or (event pairs) the pair's
 * end recorded, its time added by rt_layer_profile_collect. Returns st, or the stream's
 * error on a GPU where the layer succeeded. */
static rt_status prof_end(rt_model_ctx *ctx, prof_call c, rt_status st, const void *layer, const char *kind,
                          rt_prof_pass pass, size_t count, double flops, const char *fmt, ...) {
    rt_layer_profile *p = ctx->profile;
    if (!p) return st;
    p->depth--;
    if (!c.on) return st;
    if (st == RT_OK && c.pair >= 0)
        st = rt_event_record(p->ev[2 * c.pair + 1], ctx->stream);
    else if (st == RT_OK && ctx->device.kind != RT_DEVICE_CPU)
        st = rt_stream_sync(ctx->stream);
    if (st != RT_OK && c.pair >= 0) { /* the pair is the last one (only outermost calls take one) */
        p->npairs--;
        return st;
    }
    const uint64_t t1 = rt_now_ns();
    char shape[sizeof p->rows[0].shape];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shape, sizeof shape, fmt, ap);
    va_end(ap);
    rt_layer_prof_row *r = prof_row(p, layer, kind, pass, shape, flops);
    if (!r) {
        if (c.pair >= 0) p->npairs--; /* the last pair: its row is lost, so is its time */
        return st;
    }
    r->count = count;
    prof_ledger_add(ctx, &c, r);
    if (c.pair >= 0)
        p->pending[c.pair] = (int)(r - p->rows);
    else
        r->seconds += (double)(t1 - c.t0) * 1e-9;
    r->calls++;
    return st;
}

/* return `call`'s status, timed into the context's profile as (layer, kind, pass, count) */
#define TIMED(ctx, call, layer, kind, pass, count, flops, ...)                                                         \
    do {                                                                                                               \
        prof_call pc_ = prof_begin(ctx);                                                                               \
        rt_status st_ = (call);                                                                                        \
        return prof_end(ctx, pc_, st_, layer, kind, pass, count, flops, __VA_ARGS__);                                  \
    } while (0)

/* ---- the model's own operations, timed as rows of their own (profile.h: the rows and the
 * optimizer are the whole step): the weight copies, their gradients, the input conversion ---- */

rt_status rt_conv2d_weights_refresh(rt_model_ctx *ctx, void *state) {
    if (!state || !ctx->ops->conv2d_weights_refresh) return RT_OK;
    TIMED(ctx, ctx->ops->conv2d_weights_refresh(ctx, state), state, "conv2d weight copies", RT_PROF_FORWARD, 1, 0,
          "all convolutions");
}
rt_status rt_conv2d_weights_grads(rt_model_ctx *ctx, void *state, int first, int count) {
    if (!state || count == 0 || !ctx->ops->conv2d_weights_grads) return RT_OK;
    TIMED(ctx, ctx->ops->conv2d_weights_grads(ctx, state, first, count), state, "conv2d weight grads",
          RT_PROF_BACKWARD, (size_t)count, 0, "convolutions %d..%d", first, first + count - 1);
}
rt_status rt_act_input(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src, rt_act *dst) {
    TIMED(ctx, rt_act_from_nchw(ctx, n, c, h, w, stored_c, src, dst), NULL, "input", RT_PROF_FORWARD, (size_t)n, 0,
          "%dx%dx%d as %d channels, n %d", c, h, w, stored_c, n);
}

static double conv_flops(const rt_conv2d *l, int n) {
    return 2.0 * n * l->out_c * l->out_h * l->out_w * (double)l->in_c * l->k * l->k;
}
#define CONV_SHAPE "%d->%d k%d s%d p%d on %dx%d, n %d"
#define CONV_ARGS(l, n) (l)->in_c, (l)->out_c, (l)->k, (l)->stride, (l)->pad, (l)->in_h, (l)->in_w, (n)
#define BN_SHAPE "%d ch %dx%d, n %d"
#define BN_ARGS(l, n) (l)->c, (l)->h, (l)->w, (n)

/* ---- forward / backward --------------------------------------------------------- */

static rt_status need_params(const rt_tensor *t, const char *what) {
    RT_REQUIRE(rt_tensor_data(t) != NULL, RT_ERR_INVALID, "%s has no storage (place it in an allocated arena)", what);
    return RT_OK;
}

rt_status rt_conv2d_forward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, rt_act *y) {
    REQUIRE_N(n);
    RT_REQUIRE(x && y, RT_ERR_INVALID, "conv2d forward: NULL input or output");
    RT_CHECK(need_params(&l->weight, "conv2d weight"));
    OPS(ctx, conv2d_forward);
    TIMED(ctx, ctx->ops->conv2d_forward(ctx, l, n, x, y), l, "conv2d", RT_PROF_FORWARD, (size_t)n, conv_flops(l, n),
          CONV_SHAPE, CONV_ARGS(l, n));
}

rt_status rt_conv2d_backward(rt_model_ctx *ctx, rt_conv2d *l, int n, const rt_act *x, const rt_act *dy, rt_act *dx,
                             bool accumulate) {
    REQUIRE_N(n);
    RT_REQUIRE(x && dy, RT_ERR_INVALID, "conv2d backward: NULL input or output gradient");
    RT_CHECK(need_params(&l->dweight, "conv2d weight gradient"));
    OPS(ctx, conv2d_backward);
    TIMED(ctx, ctx->ops->conv2d_backward(ctx, l, n, x, dy, dx, accumulate), l, "conv2d", RT_PROF_BACKWARD, (size_t)n,
          conv_flops(l, n) * (dx ? 2 : 1), CONV_SHAPE, CONV_ARGS(l, n));
}

static rt_status bn_forward_check(rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y, bool training) {
    REQUIRE_N(n);
    RT_REQUIRE(x && y && x != y, RT_ERR_INVALID, "batchnorm2d forward: NULL or aliased input/output");
    RT_CHECK(need_params(&l->weight, "batchnorm2d weight"));
    RT_CHECK(need_params(&l->running_var, "batchnorm2d running_var"));
    RT_REQUIRE(!training || (l->save_mean && l->save_invstd), RT_ERR_INVALID,
               "batchnorm2d training forward without save_mean/save_invstd buffers");
    RT_REQUIRE(!training || (int64_t)n * l->h * l->w > 1, RT_ERR_INVALID,
               "batchnorm2d training needs more than one value per channel (n %d, %dx%d)", n, l->h, l->w);
    return RT_OK;
}

static rt_status bn_backward_check(rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy, rt_act *dx) {
    REQUIRE_N(n);
    RT_REQUIRE(x && dy && dx, RT_ERR_INVALID, "batchnorm2d backward: NULL argument");
    return need_params(&l->dweight, "batchnorm2d weight gradient");
}

/* Synchronised batch norm (rt_model_ctx_set_bn_sync): this rank's sums, their sum over
 * every rank through the hook, then the forward (or dx) from those; the backend's fused
 * forms are replaced by its sync pieces, which fuse the same residual add and ReLU. */
static bool bn_synced(const rt_model_ctx *ctx) { return ctx->bn_sync.all_reduce != NULL; }

/* before the sums are written into the context's buffer: it must hold the layer's */
static rt_status bn_sync_fits(const rt_model_ctx *ctx, const rt_batchnorm2d *l) {
    RT_REQUIRE(l->c <= ctx->bn_sync_channels, RT_ERR_INVALID,
               "synchronised batchnorm2d of %d channels: the context's buffer holds %d (rt_model_ctx_set_bn_sync)",
               l->c, ctx->bn_sync_channels);
    return RT_OK;
}

static rt_status bn_sync_reduce(rt_model_ctx *ctx, rt_batchnorm2d *l) {
    return ctx->bn_sync.all_reduce(ctx->bn_sync.user, ctx->bn_sync_buf, 2 * (size_t)l->c + 1, ctx->stream);
}

static rt_status bn_sync_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *residual,
                                 rt_act *y, bool relu) {
    RT_CHECK(bn_sync_fits(ctx, l));
    RT_CHECK(ctx->ops->batchnorm2d_sync_stats(ctx, l, n, x, ctx->bn_sync_buf));
    RT_CHECK(bn_sync_reduce(ctx, l));
    return ctx->ops->batchnorm2d_sync_forward(ctx, l, n, x, residual, y, relu, ctx->bn_sync_buf);
}

static rt_status bn_sync_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                  const rt_act *dy, rt_act *dx, bool accumulate) {
    RT_CHECK(bn_sync_fits(ctx, l));
    RT_CHECK(ctx->ops->batchnorm2d_sync_dsums(ctx, l, n, x, act, dy, ctx->bn_sync_buf));
    RT_CHECK(bn_sync_reduce(ctx, l));
    return ctx->ops->batchnorm2d_sync_dx(ctx, l, n, x, act, dy, dx, accumulate, ctx->bn_sync_buf);
}

static rt_status bn_forward_plain(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y,
                                  bool training) {
    if (training && bn_synced(ctx)) return bn_sync_forward(ctx, l, n, x, NULL, y, false);
    return ctx->ops->batchnorm2d_forward(ctx, l, n, x, y, training);
}

rt_status rt_batchnorm2d_forward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, rt_act *y, bool training) {
    RT_CHECK(bn_forward_check(l, n, x, y, training));
    OPS(ctx, batchnorm2d_forward);
    TIMED(ctx, bn_forward_plain(ctx, l, n, x, y, training), l, "batchnorm2d", RT_PROF_FORWARD, (size_t)n, 0, BN_SHAPE,
          BN_ARGS(l, n));
}

rt_status rt_batchnorm2d_backward(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *dy,
                                  rt_act *dx, bool accumulate) {
    RT_CHECK(bn_backward_check(l, n, x, dy, dx));
    OPS(ctx, batchnorm2d_backward);
    TIMED(ctx,
          bn_synced(ctx) ? bn_sync_backward(ctx, l, n, x, NULL, dy, dx, accumulate)
                         : ctx->ops->batchnorm2d_backward(ctx, l, n, x, dy, dx, accumulate),
          l, "batchnorm2d", RT_PROF_BACKWARD, (size_t)n, 0, BN_SHAPE, BN_ARGS(l, n));
}

static rt_status bn_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *residual,
                                rt_act *y, bool training, bool relu) {
    if (training && bn_synced(ctx)) return bn_sync_forward(ctx, l, n, x, residual, y, relu);
    if (ctx->ops->batchnorm2d_forward_act)
        return ctx->ops->batchnorm2d_forward_act(ctx, l, n, x, residual, y, training, relu);
    const size_t count = (size_t)n * l->c * l->h * l->w;
    RT_CHECK(rt_batchnorm2d_forward(ctx, l, n, x, y, training));
    if (residual) RT_CHECK(rt_add_forward(ctx, count, y, residual, y));
    if (relu) RT_CHECK(rt_relu_forward(ctx, count, y, y));
    return RT_OK;
}

rt_status rt_batchnorm2d_forward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *residual,
                                     rt_act *y, bool training, bool relu) {
    RT_CHECK(bn_forward_check(l, n, x, y, training));
    RT_REQUIRE(residual != y, RT_ERR_INVALID, "batchnorm2d forward: output aliases the residual");
    const char *kind =
        residual ? (relu ? "batchnorm2d+add+relu" : "batchnorm2d+add") : (relu ? "batchnorm2d+relu" : "batchnorm2d");
    TIMED(ctx, bn_forward_act(ctx, l, n, x, residual, y, training, relu), l, kind, RT_PROF_FORWARD, (size_t)n, 0,
          BN_SHAPE, BN_ARGS(l, n));
}

static rt_status bn_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                 rt_act *dy, rt_act *dx, bool accumulate) {
    if (bn_synced(ctx)) return bn_sync_backward(ctx, l, n, x, act, dy, dx, accumulate);
    if (ctx->ops->batchnorm2d_backward_act)
        return ctx->ops->batchnorm2d_backward_act(ctx, l, n, x, act, dy, dx, accumulate);
    RT_CHECK(rt_relu_backward(ctx, (size_t)n * l->c * l->h * l->w, act, dy, dy));
    return rt_batchnorm2d_backward(ctx, l, n, x, dy, dx, accumulate);
}

static rt_status bn_backward_act_keep(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                      const rt_act *act, const rt_act *dy, rt_act *g, rt_act *dx, bool accumulate) {
    if (!bn_synced(ctx) && ctx->ops->batchnorm2d_backward_act_keep)
        return ctx->ops->batchnorm2d_backward_act_keep(ctx, l, n, x, act, dy, g, dx, accumulate);
    RT_CHECK(rt_relu_backward(ctx, (size_t)n * l->c * l->h * l->w, act, dy, g));
    return rt_batchnorm2d_backward(ctx, l, n, x, g, dx, accumulate);
}

rt_status rt_batchnorm2d_backward_act_keep(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x,
                                           const rt_act *act, const rt_act *dy, rt_act *g, rt_act *dx,
                                           bool accumulate) {
    RT_CHECK(bn_backward_check(l, n, x, dy, dx));
    RT_REQUIRE(act && g, RT_ERR_INVALID, "batchnorm2d backward through relu: NULL relu output or kept gradient");
    RT_REQUIRE(dx != dy && dx != g, RT_ERR_INVALID,
               "batchnorm2d backward: dx aliases dy or the kept gradient (it must stay apart)");
    TIMED(ctx, bn_backward_act_keep(ctx, l, n, x, act, dy, g, dx, accumulate), l, "batchnorm2d+relu",
          RT_PROF_BACKWARD, (size_t)n, 0, BN_SHAPE, BN_ARGS(l, n));
}

rt_status rt_batchnorm2d_backward_act(rt_model_ctx *ctx, rt_batchnorm2d *l, int n, const rt_act *x, const rt_act *act,
                                      rt_act *dy, rt_act *dx, bool accumulate) {
    RT_CHECK(bn_backward_check(l, n, x, dy, dx));
    RT_REQUIRE(act, RT_ERR_INVALID, "batchnorm2d backward through relu: NULL relu output");
    TIMED(ctx, bn_backward_act(ctx, l, n, x, act, dy, dx, accumulate), l, "batchnorm2d+relu", RT_PROF_BACKWARD,
          (size_t)n, 0, BN_SHAPE, BN_ARGS(l, n));
}

static rt_status relu_fw(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *x, void *y) {
    OPS(ctx, relu_forward);
    TIMED(ctx, ctx->ops->relu_forward(ctx, dt, count, x, y), NULL, "relu", RT_PROF_FORWARD, count, 0, "%zu elements",
          count);
}
static rt_status relu_bw(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *y, const void *dy, void *dx) {
    OPS(ctx, relu_backward);
    TIMED(ctx, ctx->ops->relu_backward(ctx, dt, count, y, dy, dx), NULL, "relu", RT_PROF_BACKWARD, count, 0,
          "%zu elements", count);
}
rt_status rt_relu_forward(rt_model_ctx *ctx, size_t count, const rt_act *x, rt_act *y) {
    return relu_fw(ctx, ctx->act.dtype, count, x, y);
}
rt_status rt_relu_backward(rt_model_ctx *ctx, size_t count, const rt_act *y, const rt_act *dy, rt_act *dx) {
    return relu_bw(ctx, ctx->act.dtype, count, y, dy, dx);
}
rt_status rt_relu_forward_f32(rt_model_ctx *ctx, size_t count, const float *x, float *y) {
    return relu_fw(ctx, RT_F32, count, x, y);
}
rt_status rt_relu_backward_f32(rt_model_ctx *ctx, size_t count, const float *y, const float *dy, float *dx) {
    return relu_bw(ctx, RT_F32, count, y, dy, dx);
}

rt_status rt_maxpool2d_forward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, rt_act *y) {
    REQUIRE_N(n);
    OPS(ctx, maxpool2d_forward);
    TIMED(ctx, ctx->ops->maxpool2d_forward(ctx, l, n, x, y), l, "maxpool2d", RT_PROF_FORWARD, (size_t)n, 0,
          "%d ch %dx%d k%d s%d p%d, n %d", l->c, l->in_h, l->in_w, l->k, l->stride, l->pad, n);
}
rt_status rt_maxpool2d_backward(rt_model_ctx *ctx, rt_maxpool2d *l, int n, const rt_act *x, const rt_act *y,
                                const rt_act *dy, rt_act *dx) {
    REQUIRE_N(n);
    OPS(ctx, maxpool2d_backward);
    TIMED(ctx, ctx->ops->maxpool2d_backward(ctx, l, n, x, y, dy, dx), l, "maxpool2d", RT_PROF_BACKWARD, (size_t)n, 0,
          "%d ch %dx%d k%d s%d p%d, n %d", l->c, l->in_h, l->in_w, l->k, l->stride, l->pad, n);
}

rt_status rt_avgpool_forward(rt_model_ctx *ctx, int n, int c, int hw, const rt_act *x, float *y) {
    REQUIRE_N(n);
    RT_REQUIRE(c > 0 && hw > 0, RT_ERR_INVALID, "avgpool of %d channels x %d", c, hw);
    OPS(ctx, avgpool_forward);
    TIMED(ctx, ctx->ops->avgpool_forward(ctx, n, c, hw, x, y), NULL, "avgpool", RT_PROF_FORWARD, (size_t)n * c * hw, 0,
          "%d ch x %d, n %d", c, hw, n);
}
rt_status rt_avgpool_backward(rt_model_ctx *ctx, int n, int c, int hw, const float *dy, rt_act *dx) {
    REQUIRE_N(n);
    RT_REQUIRE(c > 0 && hw > 0, RT_ERR_INVALID, "avgpool of %d channels x %d", c, hw);
    OPS(ctx, avgpool_backward);
    TIMED(ctx, ctx->ops->avgpool_backward(ctx, n, c, hw, dy, dx), NULL, "avgpool", RT_PROF_BACKWARD, (size_t)n * c * hw,
          0, "%d ch x %d, n %d", c, hw, n);
}

rt_status rt_linear_forward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, float *y) {
    REQUIRE_N(n);
    RT_CHECK(need_params(&l->weight, "linear weight"));
    OPS(ctx, linear_forward);
    TIMED(ctx, ctx->ops->linear_forward(ctx, l, n, x, y), l, "linear", RT_PROF_FORWARD, (size_t)n,
          2.0 * n * l->in_f * l->out_f, "%d->%d, n %d", l->in_f, l->out_f, n);
}
rt_status rt_linear_backward(rt_model_ctx *ctx, rt_linear *l, int n, const float *x, const float *dy, float *dx) {
    REQUIRE_N(n);
    RT_CHECK(need_params(&l->dweight, "linear weight gradient"));
    OPS(ctx, linear_backward);
    TIMED(ctx, ctx->ops->linear_backward(ctx, l, n, x, dy, dx), l, "linear", RT_PROF_BACKWARD, (size_t)n,
          2.0 * n * l->in_f * l->out_f * (dx ? 2 : 1), "%d->%d, n %d", l->in_f, l->out_f, n);
}

static const rt_act_format k_features = {RT_F32, RT_ACT_NCHW, 1};

static size_t fmt_bytes(rt_act_format f) { return rt_act_format_elem_size(&f); }

static rt_status copy_bytes(rt_model_ctx *ctx, size_t bytes, const void *x, void *y) {
    if (x == y) return RT_OK;
    OPS(ctx, copy);
    TIMED(ctx, ctx->ops->copy(ctx, bytes, x, y), NULL, "copy", RT_PROF_FORWARD, bytes, 0, "%zu bytes", bytes);
}

static rt_status dropout_fw(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *x, void *y,
                            bool training) {
    REQUIRE_N(n);
    size_t count = (size_t)n * (size_t)l->features;
    if (!training || l->p == 0.0f) return copy_bytes(ctx, count * fmt_bytes(fmt), x, y);
    RT_REQUIRE(l->mask, RT_ERR_INVALID, "dropout training forward without a mask buffer");
    /* the mask's counter is a host value passed at the call: a graph would replay one mask */
    RT_REQUIRE(!rt_stream_capturing(ctx->stream), RT_ERR_UNSUPPORTED,
               "dropout in a step captured in a CUDA graph is not supported (its mask would repeat at every replay)");
    OPS(ctx, dropout_forward);
    prof_call pc = prof_begin(ctx);
    rt_status st = prof_end(ctx, pc, ctx->ops->dropout_forward(ctx, l, n, fmt, x, y), l, "dropout", RT_PROF_FORWARD,
                            (size_t)n, 0, "%d features, n %d", l->features, n);
    if (st != RT_OK) return st;
    l->counter += count / (size_t)l->plane;
    return RT_OK;
}
static rt_status dropout_bw(rt_model_ctx *ctx, rt_dropout *l, int n, rt_act_format fmt, const void *dy, void *dx) {
    REQUIRE_N(n);
    if (l->p == 0.0f) return copy_bytes(ctx, (size_t)n * (size_t)l->features * fmt_bytes(fmt), dy, dx);
    OPS(ctx, dropout_backward);
    TIMED(ctx, ctx->ops->dropout_backward(ctx, l, n, fmt, dy, dx), l, "dropout", RT_PROF_BACKWARD, (size_t)n, 0,
          "%d features, n %d", l->features, n);
}
rt_status rt_dropout_forward(rt_model_ctx *ctx, rt_dropout *l, int n, const rt_act *x, rt_act *y, bool training) {
    return dropout_fw(ctx, l, n, ctx->act, x, y, training);
}
rt_status rt_dropout_backward(rt_model_ctx *ctx, rt_dropout *l, int n, const rt_act *dy, rt_act *dx) {
    return dropout_bw(ctx, l, n, ctx->act, dy, dx);
}
rt_status rt_dropout_forward_f32(rt_model_ctx *ctx, rt_dropout *l, int n, const float *x, float *y, bool training) {
    RT_REQUIRE(l->c == 1 || l->features == l->c, RT_ERR_INVALID, "dropout on features: the layer has %d channels of %d",
               l->c, l->features / l->c);
    return dropout_fw(ctx, l, n, k_features, x, y, training);
}
rt_status rt_dropout_backward_f32(rt_model_ctx *ctx, rt_dropout *l, int n, const float *dy, float *dx) {
    return dropout_bw(ctx, l, n, k_features, dy, dx);
}

rt_status rt_flatten_forward(rt_model_ctx *ctx, int n, int c, int h, int w, const rt_act *x, float *y) {
    REQUIRE_N(n);
    if (rt_act_is_nchw_f32(ctx) && (const void *)x == (const void *)y) return RT_OK;
    RT_REQUIRE((const void *)x != (const void *)y, RT_ERR_INVALID,
               "flatten: output aliases the input (only the fp32 NCHW format is its own flattening)");
    TIMED(ctx, rt_act_to_nchw(ctx, n, c, h, w, c, x, y), NULL, "flatten", RT_PROF_FORWARD, (size_t)n * c * h * w, 0,
          "%d ch %dx%d, n %d", c, h, w, n);
}
rt_status rt_flatten_backward(rt_model_ctx *ctx, int n, int c, int h, int w, const float *dy, rt_act *dx) {
    REQUIRE_N(n);
    if (rt_act_is_nchw_f32(ctx) && (const void *)dx == (const void *)dy) return RT_OK;
    RT_REQUIRE((const void *)dx != (const void *)dy, RT_ERR_INVALID,
               "flatten backward: output aliases the input (only the fp32 NCHW format is its own flattening)");
    TIMED(ctx, rt_act_from_nchw(ctx, n, c, h, w, c, dy, dx), NULL, "flatten", RT_PROF_BACKWARD, (size_t)n * c * h * w,
          0, "%d ch %dx%d, n %d", c, h, w, n);
}

rt_status rt_add_forward(rt_model_ctx *ctx, size_t count, const rt_act *a, const rt_act *b, rt_act *y) {
    OPS(ctx, add_forward);
    TIMED(ctx, ctx->ops->add_forward(ctx, ctx->act.dtype, count, a, b, y), NULL, "add", RT_PROF_FORWARD, count, 0,
          "%zu elements", count);
}
static rt_status add_bw(rt_model_ctx *ctx, rt_dtype dt, size_t count, const void *dy, void *dx) {
    OPS(ctx, add_backward);
    TIMED(ctx, ctx->ops->add_backward(ctx, dt, count, dy, dx), NULL, "add", RT_PROF_BACKWARD, count, 0,
          "%zu elements", count);
}
rt_status rt_add_backward(rt_model_ctx *ctx, size_t count, const rt_act *dy, rt_act *dx) {
    return add_bw(ctx, ctx->act.dtype, count, dy, dx);
}
rt_status rt_add_backward_f32(rt_model_ctx *ctx, size_t count, const float *dy, float *dx) {
    return add_bw(ctx, RT_F32, count, dy, dx);
}

rt_status rt_softmax_xent(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels, float *loss,
                          float *dlogits) {
    REQUIRE_N(n);
    RT_REQUIRE(k > 0 && logits && labels && loss, RT_ERR_INVALID, "softmax_xent: %d classes or NULL argument", k);
    OPS(ctx, softmax_xent);
    TIMED(ctx, ctx->ops->softmax_xent(ctx, n, k, logits, labels, 0.0, loss, dlogits), NULL, "softmax_xent",
          RT_PROF_FORWARD, (size_t)n * k, 0, "%d x %d", n, k);
}
rt_status rt_softmax_xent_smooth(rt_model_ctx *ctx, int n, int k, const float *logits, const int64_t *labels,
                                 double smoothing, float *loss, float *dlogits) {
    REQUIRE_N(n);
    RT_REQUIRE(k > 0 && logits && labels && loss, RT_ERR_INVALID, "softmax_xent: %d classes or NULL argument", k);
    RT_REQUIRE(smoothing >= 0 && smoothing <= 1, RT_ERR_INVALID, "softmax_xent: label smoothing %g (expected 0..1)",
               smoothing);
    OPS(ctx, softmax_xent);
    TIMED(ctx, ctx->ops->softmax_xent(ctx, n, k, logits, labels, smoothing, loss, dlogits), NULL, "softmax_xent",
          RT_PROF_FORWARD, (size_t)n * k, 0, "%d x %d", n, k);
}
rt_status rt_log_softmax_forward(rt_model_ctx *ctx, int n, int k, const float *x, float *y) {
    REQUIRE_N(n);
    RT_REQUIRE(k > 0, RT_ERR_INVALID, "log_softmax over %d classes", k);
    OPS(ctx, log_softmax_forward);
    TIMED(ctx, ctx->ops->log_softmax_forward(ctx, n, k, x, y), NULL, "log_softmax", RT_PROF_FORWARD, (size_t)n * k, 0,
          "%d x %d", n, k);
}
rt_status rt_log_softmax_backward(rt_model_ctx *ctx, int n, int k, const float *y, const float *dy, float *dx) {
    REQUIRE_N(n);
    OPS(ctx, log_softmax_backward);
    TIMED(ctx, ctx->ops->log_softmax_backward(ctx, n, k, y, dy, dx), NULL, "log_softmax", RT_PROF_BACKWARD,
          (size_t)n * k, 0, "%d x %d", n, k);
}
rt_status rt_nll_loss(rt_model_ctx *ctx, int n, int k, const float *logp, const int64_t *labels, float *loss,
                      float *dlogp) {
    REQUIRE_N(n);
    RT_REQUIRE(k > 0 && logp && labels && loss, RT_ERR_INVALID, "nll_loss: %d classes or NULL argument", k);
    OPS(ctx, nll_loss);
    TIMED(ctx, ctx->ops->nll_loss(ctx, n, k, logp, labels, loss, dlogp), NULL, "nll_loss", RT_PROF_FORWARD,
          (size_t)n * k, 0, "%d x %d", n, k);
}
