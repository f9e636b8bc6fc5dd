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
#include "core/names.h"
#include "core/status.h"
#include "core/tensor.h"
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_precision {
    RT_PRECISION_FP32 = 0, /* exact fp32 everywhere (no tensor cores) */
    RT_PRECISION_TF32 = 1, /* CUDA: allow TF32 tensor cores in conv and matmul */
    RT_PRECISION_BF16 = 2, /* conv and linear in bf16 with fp32 accumulation (autocast; docs/model.md) */
    RT_PRECISION_COUNT_
} rt_precision;

/* "fp32" | "tf32" | "bf16", ASCII case-insensitive; RT_ERR_INVALID naming the accepted names if
 * unknown (or NULL). rt_precision_name gives the lowercase name ("?" if out of range). */
rt_status rt_precision_parse(const char *text, rt_precision *out);
const char *rt_precision_name(rt_precision p);
extern const rt_names rt_precision_names; /* the table rt_precision_parse reads (core/names.h) */

/* One convolution shape's algorithm choice on a GPU, as plain ints so that a caller (the
 * trainer, which keeps it in checkpoints) needs no library header. The shape is the key;
 * the numbers are cuDNN's own enum values (cudnnConvolutionFwdAlgo_t, ...BwdDataAlgo_t,
 * ...BwdFilterAlgo_t, cudnnMathType_t), meaningful only to the backend that made them. */
typedef struct rt_conv_algo {
    int in_c, out_c, in_h, in_w, k, stride, pad;  /* the convolution */
    int n;                                        /* the batch it was chosen at (max_batch) */
    int precision;                                /* the rt_precision it was chosen under */
    int fwd, bwd_data, bwd_filter;                /* algorithms */
    int fwd_math, bwd_data_math, bwd_filter_math; /* math types */
    int nhwc;                                     /* 1: chosen for NHWC tensors (CUDA tf32/bf16 formats, bf16 copies) */
} rt_conv_algo;

#define RT_CONV_ALGOS_MAX 64 /* distinct convolution shapes of one model (ResNet34: 13) */
typedef struct rt_conv_algos {
    int n;
    rt_conv_algo a[RT_CONV_ALGOS_MAX];
} rt_conv_algos;

struct rt_model_backend;

/* ---- The activation format (docs/model.md, "Activations") ---------------------------
 *
 * Activations between layers (and their gradients) are in the context's format, chosen by
 * the backend for the precision when the context is created: the CPU keeps fp32 NCHW
 * (PyTorch's contiguous layout); CUDA takes fp32 NCHW under fp32 (the exact-comparison
 * mode), fp32 NHWC under tf32 and bf16 NHWC under bf16 (cuDNN's tensor-core kernels work
 * in NHWC). Conversions happen at the model's boundary only: the input batch (fp32 NCHW
 * from the loader) is converted into the format as the forward begins, and the head
 * (global average pooling, flatten) reads the format and writes fp32 features (n, f) in
 * PyTorch's order. Parameters, gradients, optimizer state and checkpoints are fp32 in
 * PyTorch's layouts whatever the format.
 *
 * Typing: activation memory is `rt_act *` (an incomplete type: a pointer to elements of
 * ctx->act, never dereferenced outside a backend), fp32 features, logits and parameters
 * stay `float *`. The compiler keeps the two apart; rt_act_at does the pointer arithmetic
 * in elements of the format. Tests and tools read and write activations through
 * rt_act_upload / rt_act_download (fp32 NCHW on the host), the one conversion helper. */
typedef enum rt_act_layout {
    RT_ACT_NCHW = 0,
    RT_ACT_NHWC = 1,
    /* NCHW with every element held in a float: with dtype RT_BF16, the CPU backend's oracle
     * of the bf16 formats (bf16 values in fp32 storage, every store rounded to bf16 where a
     * GPU stores bf16; docs/model.md, "The CPU oracle of the bf16 activation format"):
     * {RT_BF16, RT_ACT_NCHW_WIDE, 1}, on the CPU only */
    RT_ACT_NCHW_WIDE = 2
} rt_act_layout;

typedef struct rt_act_format {
    rt_dtype dtype;       /* RT_F32 or RT_BF16 */
    rt_act_layout layout; /* NCHW, NHWC or (the CPU's bf16 oracle) NCHW widened */
    /* the model input's channels are stored padded (with zeros) to a multiple of this
     * (1: none): cuDNN's NHWC tensor-core kernels want 8 bf16 / 4 fp32 channels, and the
     * stem's input has 1 or 3; the stem convolution's copy of its weights is padded with
     * zero input channels to match, so the padding adds nothing to any sum */
    int input_channel_align;
} rt_act_format;

/* Bytes of one element of format f: 2 for bf16, 4 for fp32 and for bf16 values held in floats
 * (RT_ACT_NCHW_WIDE). Every size computed from a format goes through here. */
static inline size_t rt_act_format_elem_size(const rt_act_format *f) {
    return f->dtype == RT_BF16 && f->layout != RT_ACT_NCHW_WIDE ? 2 : 4;
}

typedef struct rt_act rt_act; /* activation memory in the context's format (never defined) */

/* Synchronised batch norm (model.sync_bn; docs/model.md, "Synchronised batch norm"): the
 * sum over the ranks that training batch norm needs for statistics over the global batch
 * (torch.nn.SyncBatchNorm). The model knows no ranks: whoever runs it (the trainer,
 * src/train/setup.c) gives it this hook. all_reduce sums `count` doubles at buf (on the
 * context's device) over every rank in place, the same bits on every rank, and returns
 * when the caller may go on: on a GPU the sum is ordered after the work enqueued on
 * `stream` so far and work enqueued there afterwards sees it (no host wait); on the CPU
 * the sum is done. Every rank calls it in the same order (each training batch norm's
 * forward and backward). */
typedef struct rt_bn_sync {
    rt_status (*all_reduce)(void *user, double *buf, size_t count, rt_stream *stream);
    void *user;
} rt_bn_sync;

typedef struct rt_model_ctx {
    rt_device device;
    rt_stream *stream; /* all layer work is enqueued here (CPU: ordering token) */
    int threads;       /* CPU backend: worker threads (>= 1) */
    rt_precision precision;
    bool deterministic;         /* GPU: only deterministic algorithms (rt_model_ctx_options) */
    bool benchmark;             /* GPU: choose by timing, not by cuDNN's heuristics (rt_model_ctx_options) */
    rt_conv_algos *conv_preset; /* choices to take instead of searching (rt_model_ctx_set_conv_algos) */
    rt_conv_algos *conv_chosen; /* the choices in use, one per shape (rt_model_ctx_get_conv_algos) */
    void *work;                 /* workspace on `device`, `work_bytes` long; shared by all layers */
    size_t work_bytes;
    const struct rt_model_backend *ops; /* the backend of `device` */
    void *backend;                      /* backend state: CPU thread pool; cuDNN/cuBLAS handles, ... */
    struct rt_layer_profile *profile;   /* per-layer times (model/profile.h), or NULL: none taken */
    rt_act_format act;                  /* activations' format (above); fixed at creation */
    rt_bn_sync bn_sync;                 /* rt_model_ctx_set_bn_sync: all_reduce NULL = off */
    double *bn_sync_buf;                /* (2 * bn_sync_channels + 1) doubles on `device` */
    int bn_sync_channels;
} rt_model_ctx;

typedef struct rt_model_ctx_options {
    rt_device device;       /* cpu or cuda:N */
    int threads;            /* CPU worker threads; 0 = 1 */
    rt_precision precision; /* fp32 by default */
    /* GPU: consider only convolution algorithms cuDNN reports deterministic (no atomics),
     * for forward, backward data and backward filter, the fallbacks included; false (the
     * zero value) takes the fastest whatever its determinism. The CPU backend is
     * deterministic either way. */
    bool deterministic;
    /* GPU: how a convolution shape's algorithms are chosen (PyTorch's cudnn.benchmark; the
     * two settings are independent, as PyTorch's): true times every candidate once
     * (cudnnFind*AlgorithmEx) and takes the fastest of those `deterministic` and the
     * precision allow, so two fresh contexts may choose differently; false (the zero
     * value) takes the first allowed in cuDNN's heuristic order (cudnnGet*Algorithm_v7:
     * nothing runs, a function of the shape, the GPU model and the cuDNN version). Presets
     * (rt_model_ctx_set_conv_algos) are taken either way, untimed. */
    bool benchmark;
    /* The activation format to use instead of the backend's choice for the precision (NULL,
     * the zero value: the backend's choice): for tests of each format's layers and for
     * measurements. RT_ERR_UNSUPPORTED naming the format where the backend has no such
     * format (the CPU: fp32 NCHW, and its bf16 oracle {RT_BF16, RT_ACT_NCHW_WIDE, 1}). */
    const rt_act_format *act_format;
} rt_model_ctx_options;

/* Create a context: picks the backend of opts->device (RT_ERR_UNSUPPORTED for CUDA in a
 * build without it), creates the stream and lets the backend set up its state. */
rt_status rt_model_ctx_create(const rt_model_ctx_options *opts, rt_model_ctx **out);
void rt_model_ctx_destroy(rt_model_ctx *ctx);

/* fn(arg, t) for every t in [0, ntasks), on the context's host threads (the CPU
 * backend's pool: `threads` of them, the caller included) or, on a GPU context, on the
 * calling thread; returns when all are done. ctx is an rt_model_ctx (void * so that
 * the signature fits rt_optim_parallel_fn: the optimizer's CPU step uses it). */
void rt_model_ctx_parallel(void *ctx, int ntasks, void (*fn)(void *arg, int task), void *arg);

/* Time every layer call from now on into p (model/profile.h), or stop timing (NULL).
 * The profile is the caller's; it must outlive its use here. */
void rt_model_ctx_set_profile(rt_model_ctx *ctx, struct rt_layer_profile *p);

/* Training batch norm with statistics over every rank's batch from now on, through
 * sync->all_reduce (see rt_bn_sync), for layers of up to max_channels channels; NULL:
 * each rank's own batch (the default). Allocates the reduction buffer (setup time only).
 * RT_ERR_UNSUPPORTED where the backend has no synchronised batch norm. Evaluation always
 * uses the running statistics and reduces nothing. */
rt_status rt_model_ctx_set_bn_sync(rt_model_ctx *ctx, const rt_bn_sync *sync, int max_channels);

/* Make sure the workspace holds at least `nbytes` (grows it; only at setup time). */
rt_status rt_model_ctx_reserve(rt_model_ctx *ctx, size_t nbytes);

/* Convolution algorithms (GPU; on the CPU both calls are accepted and there is nothing
 * to choose). set: before rt_model_create, the choices to take for the shapes they name
 * instead of searching (a resume takes the checkpoint's, the other ranks take rank 0's);
 * each is validated when its layer is prepared: an unknown algorithm or math type, one
 * the precision or train.deterministic excludes, one cuDNN refuses for the shape or one
 * needing more workspace than the backend allows is an error naming the shape and the
 * algorithm (never a silent substitute). Shapes it does not name are searched. n out of
 * 0..RT_CONV_ALGOS_MAX: RT_ERR_INVALID. get: the choices in use, one per distinct shape
 * prepared so far, searched or preset (n = 0 on the CPU). */
rt_status rt_model_ctx_set_conv_algos(rt_model_ctx *ctx, const rt_conv_algos *algos);
void rt_model_ctx_get_conv_algos(const rt_model_ctx *ctx, rt_conv_algos *out);

/* ---- activations ---- */
/* Bytes of one activation element in the context's format (4 or 2). */
size_t rt_act_elem_size(const rt_model_ctx *ctx);
/* base + `elems` elements of the context's format */
static inline rt_act *rt_act_at(const rt_model_ctx *ctx, rt_act *base, size_t elems) {
    return (rt_act *)((char *)base + elems * rt_act_format_elem_size(&ctx->act));
}
/* Channels the model input is stored with: c rounded up to ctx->act.input_channel_align. */
int rt_act_input_channels(const rt_model_ctx *ctx, int c);
/* Whether the format is PyTorch's fp32 NCHW (an activation is then a float array that holds
 * any fp32 value: false for the bf16 oracle, whose stores round). */
bool rt_act_is_nchw_f32(const rt_model_ctx *ctx);
/* Convert n images of c x h x w from fp32 NCHW at src (on the context's device) into
 * activations at dst stored with stored_c >= c channels (the extra ones zero), or back
 * (only the first c channels are read); enqueued on the context's stream. The model's
 * boundary (its input) and the one conversion helper of tests. */
rt_status rt_act_from_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const float *src, rt_act *dst);
rt_status rt_act_to_nchw(rt_model_ctx *ctx, int n, int c, int h, int w, int stored_c, const rt_act *src, float *dst);
/* The same from and to host memory (fp32 NCHW), through a temporary device buffer
 * (allocates: tests and tools only, never in a step); download synchronises. */
rt_status rt_act_upload(rt_model_ctx *ctx, int n, int c, int h, int w, const float *host, rt_act *dst);
rt_status rt_act_download(rt_model_ctx *ctx, int n, int c, int h, int w, const rt_act *src, float *host);

/* Wait until all work enqueued on the context's stream is done (no-op on the CPU). */
rt_status rt_model_ctx_sync(rt_model_ctx *ctx);

/* Device memory, for benchmarks and tests: *used = bytes of the context's GPU in use
 * (total - free, as cudaMemGetInfo reports it: every process, the CUDA context and the
 * libraries' code included; the difference of two calls isolates a run), *backend =
 * device bytes the backend holds besides the models and ctx->work (the cuBLAS workspace,
 * counters). Both 0 on the CPU. */
rt_status rt_model_ctx_memory(rt_model_ctx *ctx, size_t *used, size_t *backend);

#ifdef __cplusplus
}
#endif

#endif
