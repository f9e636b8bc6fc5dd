/* The model context: where and how layers run.
 *
 * One context per device (per rank): the device, the stream every layer enqueues on,
 * the thread count of the CPU backend, one workspace buffer sized once for the largest
 * layer (im2col columns on the CPU, cuDNN workspace on CUDA), and an opaque pointer the
 * backend keeps its own state in (the CPU thread pool; cuDNN and cuBLAS handles). The
 * backend is chosen from the device when the context is created; layers never test the
 * device themselves (see internal/backend.h). Nothing here allocates after setup.
 */
#ifndef RT_MODEL_CTX_H
#define RT_MODEL_CTX_H

#include "core/device.h"
#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_precision {
    RT_PRECISION_FP32 = 0, /* exact fp32 everywhere (no tensor cores) */
    RT_PRECISION_TF32 = 1, /* CUDA: allow TF32 tensor cores in conv and matmul */
    RT_PRECISION_COUNT_
} rt_precision;

/* "fp32" | "tf32", ASCII case-insensitive; RT_ERR_INVALID naming the accepted names if
 * unknown (or NULL). rt_precision_name gives the lowercase name ("?" if out of range). */
rt_status rt_precision_parse(const char *text, rt_precision *out);
const char *rt_precision_name(rt_precision p);

struct rt_model_backend;

typedef struct rt_model_ctx {
    rt_device device;
    rt_stream *stream; /* all layer work is enqueued here (CPU: ordering token) */
    int threads;       /* CPU backend: worker threads (>= 1) */
    rt_precision precision;
    void *work; /* workspace on `device`, `work_bytes` long; shared by all layers */
    size_t work_bytes;
    const struct rt_model_backend *ops; /* the backend of `device` */
    void *backend;                      /* backend state: CPU thread pool; cuDNN/cuBLAS handles, ... */
} rt_model_ctx;

typedef struct rt_model_ctx_options {
    rt_device device;       /* cpu or cuda:N */
    int threads;            /* CPU worker threads; 0 = 1 */
    rt_precision precision; /* fp32 by default */
} rt_model_ctx_options;

/* Create a context: picks the backend of opts->device (RT_ERR_UNSUPPORTED for CUDA in a
 * build without it), creates the stream and lets the backend set up its state. */
rt_status rt_model_ctx_create(const rt_model_ctx_options *opts, rt_model_ctx **out);
void rt_model_ctx_destroy(rt_model_ctx *ctx);

/* Make sure the workspace holds at least `nbytes` (grows it; only at setup time). */
rt_status rt_model_ctx_reserve(rt_model_ctx *ctx, size_t nbytes);

/* Wait until all work enqueued on the context's stream is done (no-op on the CPU). */
rt_status rt_model_ctx_sync(rt_model_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
