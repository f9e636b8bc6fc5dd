/* Gradient norm, non-finite check and clipping (see clip.h) over the backend table of
 * the clipper's device (internal/optim_kernels.h). */
#include "optim/clip.h"
#include "optim/internal/optim_kernels.h"

#include <math.h>
#include <string.h>

rt_status rt_grad_clip_init(rt_grad_clip *c, rt_device device) {
    RT_REQUIRE(c != NULL, RT_ERR_INVALID, "optim: clipper is NULL");
    memset(c, 0, sizeof *c);
    c->device = device;
    RT_CHECK(rt_device_kind_built(device.kind));
    const rt_optim_backend *backend = rt_optim_backend_get(device.kind);
    RT_REQUIRE(backend, RT_ERR_UNSUPPORTED, "optim: no clipping backend for device kind %s",
               rt_device_kind_name(device.kind));
    RT_CHECK(backend->clip_init(c));
    c->backend = backend;
    return RT_OK;
}

void rt_grad_clip_free(rt_grad_clip *c) {
    if (!c) return;
    if (c->backend) c->backend->clip_release(c);
    memset(c, 0, sizeof *c);
}

rt_status rt_grad_norm(rt_grad_clip *c, const float *grads, size_t n, rt_stream *stream, double *norm) {
    RT_REQUIRE(c != NULL && norm != NULL, RT_ERR_INVALID, "optim: NULL argument");
    RT_REQUIRE(c->backend != NULL, RT_ERR_INVALID, "optim: clipper not initialised");
    RT_REQUIRE(grads != NULL || n == 0, RT_ERR_INVALID, "optim: gradients are NULL");
    double sum = 0;
    RT_CHECK(c->backend->sumsq(c, grads, n, stream, &sum));
    if (stream) RT_CHECK(rt_stream_sync(stream));
    *norm = sqrt(sum);
    return RT_OK;
}

rt_status rt_grad_sumsq_async(rt_grad_clip *c, const float *grads, size_t n, rt_stream *stream, double *sum) {
    RT_REQUIRE(c != NULL && sum != NULL, RT_ERR_INVALID, "optim: NULL argument");
    RT_REQUIRE(c->backend != NULL, RT_ERR_INVALID, "optim: clipper not initialised");
    RT_REQUIRE(grads != NULL || n == 0, RT_ERR_INVALID, "optim: gradients are NULL");
    return c->backend->sumsq(c, grads, n, stream, sum);
}

rt_status rt_grad_clip_norm(rt_grad_clip *c, float *grads, size_t n, double max_norm, rt_stream *stream,
                            rt_grad_stats *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "optim: stats is NULL");
    RT_REQUIRE(!isnan(max_norm), RT_ERR_INVALID, "optim.clip_grad_norm: NaN");
    double norm = 0;
    RT_CHECK(rt_grad_norm(c, grads, n, stream, &norm));
    return rt_grad_clip_apply(c, grads, n, max_norm, norm, stream, out);
}

rt_status rt_grad_scale(rt_grad_clip *c, float *x, size_t n, float coef, rt_stream *stream) {
    RT_REQUIRE(c != NULL && c->backend != NULL, RT_ERR_INVALID, "optim: gradient clip state not initialised");
    return c->backend->scale(c, x, n, coef, stream);
}

rt_status rt_grad_clip_apply(rt_grad_clip *c, float *grads, size_t n, double max_norm, double norm, rt_stream *stream,
                             rt_grad_stats *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "optim: stats is NULL");
    RT_REQUIRE(!isnan(max_norm), RT_ERR_INVALID, "optim.clip_grad_norm: NaN");
    memset(out, 0, sizeof *out);
    out->clip_coef = 1.0f;
    out->norm = norm;
    out->finite = isfinite(out->norm);
    if (!out->finite || !(max_norm > 0)) return RT_OK;
    /* clip_coef = max_norm / (total_norm + 1e-6), float32 tensor arithmetic in PyTorch */
    float coef = (float)max_norm / ((float)out->norm + 1e-6f);
    if (!(coef < 1.0f)) return RT_OK; /* clamp(max=1): multiplying by 1 changes nothing */
    out->clip_coef = coef;
    out->clipped = true;
    RT_CHECK(c->backend->scale(c, grads, n, coef, stream));
    return RT_OK;
}
