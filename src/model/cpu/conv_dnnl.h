/* conv2d on the CPU through oneDNN (Debian's libdnnl), when the build has it.
 *
 * conv_cpu.c owns the layer's state and decides per layer which implementation runs;
 * this is the oneDNN half: primitives for forward, backward-data and backward-weights
 * (+bias) made once by prepare for batches of exactly `max_n` images, plain NCHW/OIHW
 * at the interface. See conv_dnnl.c for the layout and threading choices.
 */
#ifndef RT_MODEL_CPU_CONV_DNNL_H
#define RT_MODEL_CPU_CONV_DNNL_H

#include "model/internal/backend.h"

typedef struct rt_dnnl_conv rt_dnnl_conv;
typedef struct rt_dnnl_env rt_dnnl_env;

#ifdef RT_HAVE_DNNL
/* per context: the engine and stream (made by the CPU backend's ctx_init) */
rt_status rt_dnnl_env_create(rt_dnnl_env **out);
void rt_dnnl_env_destroy(rt_dnnl_env *e);

/* Make the primitives of layer l for batch max_n, split over `threads` parts;
 * *workspace: the bytes of ctx->work they need (blocked copies and scratchpads).
 * bf16: the primitives take bf16 src, weights, bias and dst / diff_dst / diff_src
 * (oneDNN's reorders round our fp32 to bf16, ties to even, and widen the bf16 results
 * back into our fp32 buffers), accumulate in fp32 and write the weight gradient in
 * fp32; RT_ERR_UNSUPPORTED where this oneDNN has no bf16 convolution for the CPU. */
rt_status rt_dnnl_conv_create(rt_dnnl_env *e, const rt_conv2d *l, int max_n, int threads, bool bf16, size_t *workspace,
                              rt_dnnl_conv **out);
void rt_dnnl_conv_destroy(rt_dnnl_conv *c);
int rt_dnnl_conv_batch(const rt_dnnl_conv *c);

/* C (m, n) = alpha op(A) op(B) + beta C, row-major, through oneDNN's sgemm (its AVX-512
 * JIT kernels) on the calling thread alone (its OpenMP team set to one thread first).
 * Returns false where oneDNN refuses; the caller then runs another GEMM. */
bool rt_dnnl_sgemm(rt_dnnl_env *e, bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc);
/* One matrix product through oneDNN's matmul primitive, made once for its shapes:
 *   C (m, n) f32, rows ldc apart  =  A (m, k) . B (k, n)
 * with A and B bf16 (bf16 true; else f32) at element strides as = {row, column} and bs
 * (a transpose is a stride), fp32 accumulation; planned for and run with oneDNN's OpenMP
 * team at `threads` (1: on the calling thread alone, as a part of a layer does).
 * *scratch_bytes: the scratchpad each run needs (user-managed, in the caller's
 * workspace). RT_ERR_UNSUPPORTED where this oneDNN has no such matmul. */
typedef struct rt_dnnl_mm rt_dnnl_mm;
rt_status rt_dnnl_mm_create(rt_dnnl_env *e, bool bf16, int threads, int m, int n, int k, const int64_t as[2],
                            const int64_t bs[2], int64_t ldc, size_t *scratch_bytes, rt_dnnl_mm **out);
/* false where oneDNN fails (it has no more to say than its status) */
bool rt_dnnl_mm_run(rt_dnnl_env *e, rt_dnnl_mm *mm, const void *a, const void *b, float *c, void *scratch);
void rt_dnnl_mm_destroy(rt_dnnl_mm *mm);

/* n must be the batch the primitives were made for */
rt_status rt_dnnl_conv_forward(rt_model_ctx *ctx, rt_dnnl_env *e, rt_dnnl_conv *c, rt_conv2d *l, const float *x,
                               float *y);
rt_status rt_dnnl_conv_backward(rt_model_ctx *ctx, rt_dnnl_env *e, rt_dnnl_conv *c, rt_conv2d *l, const float *x,
                                const float *dy, float *dx, bool accumulate);
#endif

#endif
