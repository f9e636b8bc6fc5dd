/* Element-wise reduction kernels: dst[i] = dst[i] OP src[i] over f32 f64 i32 i64, and
 * the final division of AVG (and bf16, combined in fp32 and rounded per step). Written as plain loops the compiler
 * vectorizes (this file is compiled with -O3 semantics via a pragma); the hot path is SUM/AVG over f32. */
#ifndef RT_DIST_REDUCE_H
#define RT_DIST_REDUCE_H

#include "core/names.h"
#include "core/status.h"
#include "core/tensor.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_reduce_op { RT_OP_SUM = 0, RT_OP_AVG, RT_OP_PRODUCT, RT_OP_MIN, RT_OP_MAX, RT_OP_COUNT_ } rt_reduce_op;

const char *rt_reduce_op_name(rt_reduce_op op); /* "sum", ... */
/* rt_names_parse of rt_reduce_op_names (core/names.h). */
extern const rt_names rt_reduce_op_names;
rt_status rt_reduce_op_parse(const char *text, rt_reduce_op *out);
/* f32 f64 i32 i64 bf16 are reducible (bf16 computed in fp32, rounded per step). */
int rt_reduce_dtype_ok(rt_dtype t);

/* dst[i] = dst[i] op src[i] for n elements (AVG adds; the division comes last). */
void rt_reduce_apply(void *dst, const void *src, size_t n, rt_dtype t, rt_reduce_op op);
/* dst[i] = (dst[i] op src[i]) / divisor: the last step of AVG, fused. */
void rt_reduce_apply_div(void *dst, const void *src, size_t n, rt_dtype t, int divisor);
/* dst[i] /= divisor (integers: truncating division, as C). */
void rt_reduce_div(void *dst, size_t n, rt_dtype t, int divisor);

#ifdef __cplusplus
}
#endif

#endif
