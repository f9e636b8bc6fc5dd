/* Gradient norm, non-finite check and clipping (see clip.h): the CPU path and the
 * dispatch to the CUDA reduction. */
#include "optim/clip.h"
#include "optim/optim_kernels.h"

#include <math.h>
#include <string.h>

rt_status rt_grad_clip_init(rt_grad_clip *c, rt_device device) {
    RT_REQUIRE(c != NULL, RT_ERR_INVALID, "optim: clipper is NULL");
    memset(c, 0, sizeof *c);
    c->device = device;
    if (!rt_device_is_cuda(device)) return RT_OK;
#ifdef RT_HAVE_CUDA
    rt_status st;
    RT_CHECK_GOTO(rt_malloc(device, RT_OPTIM_NORM_BLOCKS * sizeof(double), (void **)&c->partial_dev), st, fail);
    RT_CHECK_GOTO(rt_malloc(device, sizeof(double), (void **)&c->sum_dev), st, fail);
    return RT_OK;
fail:
    rt_grad_clip_free(c);
    return st;
#else
    RT_FAIL(RT_ERR_UNSUPPORTED, "optim: gradient clipping on cuda requested but built without CUDA");
#endif
}

void rt_grad_clip_free(rt_grad_clip *c) {
    if (!c) return;
    rt_free(c->device, c->partial_dev);
    rt_free(c->device, c->sum_dev);
    memset(c, 0, sizeof *c);
}

rt_status rt_grad_norm(rt_grad_clip *c, const float *grads, size_t n, rt_stream *stream, double *norm) {
    RT_REQUIRE(c != NULL && norm != NULL, RT_ERR_INVALID, "optim: NULL argument");
    RT_REQUIRE(grads != NULL || n == 0, RT_ERR_INVALID, "optim: gradients are NULL");
    double sum = 0;
    if (rt_device_is_cuda(c->device)) {
#ifdef RT_HAVE_CUDA
        RT_CHECK(rt_optim_sumsq_cuda(grads, n, c->partial_dev, c->sum_dev, stream));
        RT_CHECK(rt_memcpy(&sum, rt_device_cpu(), c->sum_dev, c->device, sizeof sum, stream));
        RT_CHECK(rt_stream_sync(stream));
#else
        RT_FAIL(RT_ERR_UNSUPPORTED, "optim: built without CUDA");
#endif
    } else {
        sum = rt_optim_sumsq_cpu(grads, n);
    }
    *norm = sqrt(sum);
    return RT_OK;
}

rt_status rt_grad_clip_norm(rt_grad_clip *c, float *grads, size_t n, double max_norm, rt_stream *stream,
                            rt_grad_stats *out) {
    RT_REQUIRE(out != NULL, RT_ERR_INVALID, "optim: stats is NULL");
    RT_REQUIRE(!isnan(max_norm), RT_ERR_INVALID, "optim.clip_grad_norm: NaN");
    memset(out, 0, sizeof *out);
    out->clip_coef = 1.0f;
    RT_CHECK(rt_grad_norm(c, grads, n, stream, &out->norm));
    out->finite = isfinite(out->norm);
    if (!out->finite || !(max_norm > 0)) return RT_OK;
    /* clip_coef = max_norm / (total_norm + 1e-6), float32 tensor arithmetic in PyTorch */
    float coef = (float)max_norm / ((float)out->norm + 1e-6f);
    if (!(coef < 1.0f)) return RT_OK; /* clamp(max=1): multiplying by 1 changes nothing */
    out->clip_coef = coef;
    out->clipped = true;
    if (rt_device_is_cuda(c->device)) {
#ifdef RT_HAVE_CUDA
        RT_CHECK(rt_optim_scale_cuda(grads, n, coef, stream));
#endif
    } else {
        rt_optim_scale_cpu(grads, n, coef);
    }
    return RT_OK;
}
