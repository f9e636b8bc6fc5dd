/* Element-wise reduction kernels (see reduce.h). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include "dist/reduce.h"

#include "core/bf16.h"
#include "core/names.h"

#include <string.h>

static const char *const k_ops[RT_OP_COUNT_] = {"sum", "avg", "product", "min", "max"};
const rt_names rt_reduce_op_names = {"reduce op", RT_OP_COUNT_, k_ops, NULL, NULL};

const char *rt_reduce_op_name(rt_reduce_op op) { return (unsigned)op < RT_OP_COUNT_ ? k_ops[op] : "?"; }

rt_status rt_reduce_op_parse(const char *text, rt_reduce_op *out) {
    int i = 0;
    rt_status st = rt_names_parse(&rt_reduce_op_names, text, &i); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_reduce_op)i;
    return st;
}

int rt_reduce_dtype_ok(rt_dtype t) { return t == RT_F32 || t == RT_F64 || t == RT_I32 || t == RT_I64 || t == RT_BF16; }

/* bf16: each element widened to fp32 (exact), combined in fp32, rounded back to bf16
 * (nearest, ties to even) once per step: dst = bf16(f32(dst) op f32(src)). The ring's
 * reduce-scatter applies this once per hop, so a sum over n ranks is rounded n - 1
 * times (n with AVG's fused division), in the ring's order, which is the same on every
 * rank for a given chunk; the all-gather then copies bits, so every rank ends with the
 * same bits (docs/dist.md, "Compression"). */
static float bf16_op(float a, float b, rt_reduce_op op) {
    switch (op) {
    case RT_OP_PRODUCT:
        return a * b;
    case RT_OP_MIN:
        return b < a ? b : a;
    case RT_OP_MAX:
        return b > a ? b : a;
    default:
        return a + b;
    }
}
static void bf16_apply(uint16_t *restrict d, const uint16_t *restrict s, size_t n, rt_reduce_op op) {
    for (size_t i = 0; i < n; i++) d[i] = rt_bf16_from_f32(bf16_op(rt_bf16_to_f32(d[i]), rt_bf16_to_f32(s[i]), op));
}
static void bf16_sumdiv(uint16_t *restrict d, const uint16_t *restrict s, size_t n, float div) {
    for (size_t i = 0; i < n; i++) d[i] = rt_bf16_from_f32((rt_bf16_to_f32(d[i]) + rt_bf16_to_f32(s[i])) / div);
}
static void bf16_div(uint16_t *restrict d, size_t n, float div) {
    for (size_t i = 0; i < n; i++) d[i] = rt_bf16_from_f32(rt_bf16_to_f32(d[i]) / div);
}

#define DEFINE_KERNELS(T, NAME)                                                                                        \
    static void NAME##_sum(T *restrict d, const T *restrict s, size_t n) {                                             \
        for (size_t i = 0; i < n; i++) d[i] += s[i];                                                                   \
    }                                                                                                                  \
    static void NAME##_prod(T *restrict d, const T *restrict s, size_t n) {                                            \
        for (size_t i = 0; i < n; i++) d[i] *= s[i];                                                                   \
    }                                                                                                                  \
    static void NAME##_min(T *restrict d, const T *restrict s, size_t n) {                                             \
        for (size_t i = 0; i < n; i++) d[i] = s[i] < d[i] ? s[i] : d[i];                                               \
    }                                                                                                                  \
    static void NAME##_max(T *restrict d, const T *restrict s, size_t n) {                                             \
        for (size_t i = 0; i < n; i++) d[i] = s[i] > d[i] ? s[i] : d[i];                                               \
    }                                                                                                                  \
    static void NAME##_sumdiv(T *restrict d, const T *restrict s, size_t n, T div) {                                   \
        for (size_t i = 0; i < n; i++) d[i] = (T)((d[i] + s[i]) / div);                                                \
    }                                                                                                                  \
    static void NAME##_div(T *restrict d, size_t n, T div) {                                                           \
        for (size_t i = 0; i < n; i++) d[i] = (T)(d[i] / div);                                                         \
    }                                                                                                                  \
    static void NAME##_apply(void *d, const void *s, size_t n, rt_reduce_op op) {                                      \
        switch (op) {                                                                                                  \
        case RT_OP_SUM:                                                                                                \
        case RT_OP_AVG:                                                                                                \
            NAME##_sum(d, s, n);                                                                                       \
            break;                                                                                                     \
        case RT_OP_PRODUCT:                                                                                            \
            NAME##_prod(d, s, n);                                                                                      \
            break;                                                                                                     \
        case RT_OP_MIN:                                                                                                \
            NAME##_min(d, s, n);                                                                                       \
            break;                                                                                                     \
        case RT_OP_MAX:                                                                                                \
            NAME##_max(d, s, n);                                                                                       \
            break;                                                                                                     \
        default:                                                                                                       \
            break;                                                                                                     \
        }                                                                                                              \
    }

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(int32_t, i32)
DEFINE_KERNELS(int64_t, i64)

void rt_reduce_apply(void *dst, const void *src, size_t n, rt_dtype t, rt_reduce_op op) {
    switch (t) {
    case RT_F32:
        f32_apply(dst, src, n, op);
        break;
    case RT_F64:
        f64_apply(dst, src, n, op);
        break;
    case RT_I32:
        i32_apply(dst, src, n, op);
        break;
    case RT_I64:
        i64_apply(dst, src, n, op);
        break;
    case RT_BF16:
        bf16_apply(dst, src, n, op);
        break;
    default:
        break;
    }
}

void rt_reduce_apply_div(void *dst, const void *src, size_t n, rt_dtype t, int divisor) {
    switch (t) {
    case RT_F32:
        f32_sumdiv(dst, src, n, (float)divisor);
        break;
    case RT_F64:
        f64_sumdiv(dst, src, n, (double)divisor);
        break;
    case RT_I32:
        i32_sumdiv(dst, src, n, (int32_t)divisor);
        break;
    case RT_I64:
        i64_sumdiv(dst, src, n, (int64_t)divisor);
        break;
    case RT_BF16:
        bf16_sumdiv(dst, src, n, (float)divisor);
        break;
    default:
        break;
    }
}

void rt_reduce_div(void *dst, size_t n, rt_dtype t, int divisor) {
    switch (t) {
    case RT_F32:
        f32_div(dst, n, (float)divisor);
        break;
    case RT_F64:
        f64_div(dst, n, (double)divisor);
        break;
    case RT_I32:
        i32_div(dst, n, (int32_t)divisor);
        break;
    case RT_I64:
        i64_div(dst, n, (int64_t)divisor);
        break;
    case RT_BF16:
        bf16_div(dst, n, (float)divisor);
        break;
    default:
        break;
    }
}
