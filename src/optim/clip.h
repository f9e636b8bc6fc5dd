/* Gradient clipping by global norm and the non-finite gradient check.
 *
 * torch.nn.utils.clip_grad_norm_ semantics over the whole flat gradient arena (after
 * the all-reduce, so every rank sees the same gradients and clips identically):
 * total_norm = ||g||_2 over all elements, clip_coef = max_norm / (total_norm + 1e-6)
 * in float32, clamped to 1, g *= clip_coef. The squares are summed in double in a fixed
 * order (deterministic on CPU and on GPU), so an infinite or NaN gradient, and only
 * that, makes the norm non-finite: then nothing is scaled and the caller skips the
 * optimizer step and reports it (PyTorch would scale by NaN).
 */
#ifndef RT_OPTIM_CLIP_H
#define RT_OPTIM_CLIP_H

#include "core/device.h"
#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The device's clipping functions and their scratch for the norm reduction. */
typedef struct rt_grad_clip {
    rt_device device;
    const struct rt_optim_backend *backend; /* picked by rt_grad_clip_init */
    void *scratch;                          /* CUDA: per-block partial sums and the total */
} rt_grad_clip;

typedef struct rt_grad_stats {
    double norm;     /* global L2 norm before clipping (inf or nan if non-finite) */
    bool finite;     /* false: some gradient is inf or nan; nothing was scaled, skip the step */
    bool clipped;    /* the gradients were scaled */
    float clip_coef; /* the factor applied (1 when not clipped) */
} rt_grad_stats;

rt_status rt_grad_clip_init(rt_grad_clip *c, rt_device device);
void rt_grad_clip_free(rt_grad_clip *c);

/* Global L2 norm of n floats on the clipper's device. Waits for `stream` (the result
 * comes back to the host). */
rt_status rt_grad_norm(rt_grad_clip *c, const float *grads, size_t n, rt_stream *stream, double *norm);

/* Norm, finiteness check and, when max_norm > 0 and the norm exceeds it, scaling of the
 * n gradients in place (asynchronous on `stream`). max_norm <= 0: check only. */
rt_status rt_grad_clip_norm(rt_grad_clip *c, float *grads, size_t n, double max_norm, rt_stream *stream,
                            rt_grad_stats *out);

/* The same in two halves, for a device with streams, so that the host waits once for
 * everything it must read back in a step: rt_grad_sumsq_async enqueues the sum of squares
 * into *sum (pinned host memory; valid once `stream` got there: the caller
 * synchronises), then rt_grad_clip_apply takes the norm (sqrt of that sum) and checks
 * and scales as rt_grad_clip_norm does. */
rt_status rt_grad_sumsq_async(rt_grad_clip *c, const float *grads, size_t n, rt_stream *stream, double *sum);
rt_status rt_grad_clip_apply(rt_grad_clip *c, float *grads, size_t n, double max_norm, double norm, rt_stream *stream,
                             rt_grad_stats *out);

/* x[0..n) *= coef on c's device, enqueued on stream (the CPU: at once): the kernel
 * clipping uses, for other scalings of gradients (train.accumulate's 1/K shares). */
rt_status rt_grad_scale(rt_grad_clip *c, float *x, size_t n, float coef, rt_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
