#include "core/tensor.h"

#include "core/names.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t size;
} k_dtypes[RT_DTYPE_COUNT_] = {{"f32", 4}, {"f64", 8}, {"i32", 4}, {"i64", 8}, {"u8", 1}, {"bf16", 2}};

size_t rt_dtype_size(rt_dtype t) { return (unsigned)t < RT_DTYPE_COUNT_ ? k_dtypes[t].size : 0; }
const char *rt_dtype_name(rt_dtype t) { return (unsigned)t < RT_DTYPE_COUNT_ ? k_dtypes[t].name : "?"; }

static const char *dtype_name(int i) { return k_dtypes[i].name; }
/* also accepted: torch's and C's spellings */
static const rt_name_alias k_dtype_aliases[] = {{"float32", RT_F32}, {"float", RT_F32},     {"float64", RT_F64},
                                                {"double", RT_F64},  {"int32", RT_I32},     {"int64", RT_I64},
                                                {"uint8", RT_U8},    {"bfloat16", RT_BF16}, {NULL, 0}};
const rt_names rt_dtype_names = {"dtype", RT_DTYPE_COUNT_, NULL, dtype_name, k_dtype_aliases};

rt_status rt_dtype_parse(const char *text, rt_dtype *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_dtype_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_dtype)k;
    return st;
}

void rt_arena_init(rt_arena *a, rt_device device) {
    a->device = device;
    a->size = 0;
    a->base = NULL;
}

rt_status rt_arena_push(rt_arena *a, size_t nbytes, size_t align, size_t *offset) {
    RT_REQUIRE(a->base == NULL, RT_ERR_INTERNAL, "rt_arena_push after the arena was allocated");
    if (align == 0) align = 64;
    RT_REQUIRE((align & (align - 1)) == 0, RT_ERR_INVALID, "arena alignment %zu is not a power of two", align);
    size_t off = (a->size + align - 1) & ~(align - 1);
    RT_REQUIRE(off >= a->size && off + nbytes >= off, RT_ERR_NOMEM, "arena size overflows at %zu + %zu bytes", a->size,
               nbytes);
    *offset = off;
    a->size = off + nbytes;
    return RT_OK;
}

rt_status rt_arena_alloc(rt_arena *a) {
    RT_REQUIRE(a->base == NULL, RT_ERR_INTERNAL, "arena allocated twice");
    RT_CHECK(rt_malloc(a->device, a->size, &a->base));
    RT_CHECK(rt_memset(a->device, a->base, 0, a->size, NULL));
    return RT_OK;
}

void rt_arena_free(rt_arena *a) {
    rt_free(a->device, a->base);
    a->base = NULL;
}

rt_status rt_tensor_init(rt_tensor *t, rt_dtype dtype, int ndim, const int64_t *shape, rt_device device) {
    memset(t, 0, sizeof *t);
    RT_REQUIRE((unsigned)dtype < RT_DTYPE_COUNT_, RT_ERR_INVALID, "unknown dtype %d", (int)dtype);
    RT_REQUIRE(ndim >= 0 && ndim <= RT_MAX_DIMS, RT_ERR_INVALID, "tensor with %d dims (expected 0..%d)", ndim,
               RT_MAX_DIMS);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        RT_REQUIRE(shape[i] >= 0, RT_ERR_INVALID, "tensor dim %d is negative (%lld)", i, (long long)shape[i]);
        if (shape[i] > 0 && numel > INT64_MAX / 8 / shape[i])
            RT_FAIL(RT_ERR_INVALID, "tensor of %d dims: element count overflows at dim %d", ndim, i);
        numel *= shape[i];
        t->shape[i] = shape[i];
    }
    t->dtype = dtype;
    t->ndim = ndim;
    t->device = device;
    return RT_OK;
}

int64_t rt_tensor_numel(const rt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t rt_tensor_nbytes(const rt_tensor *t) { return (size_t)rt_tensor_numel(t) * rt_dtype_size(t->dtype); }

bool rt_tensor_same_shape(const rt_tensor *a, const rt_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

void *rt_tensor_data(const rt_tensor *t) {
    if (t->arena) return t->arena->base ? (char *)t->arena->base + t->offset : NULL;
    return t->data;
}

rt_status rt_tensor_place(rt_tensor *t, rt_arena *a) {
    RT_CHECK(rt_arena_push(a, rt_tensor_nbytes(t), 64, &t->offset));
    t->arena = a;
    t->data = NULL;
    t->device = a->device;
    return RT_OK;
}

rt_tensor rt_tensor_in(const rt_tensor *t, rt_arena *other) {
    rt_tensor r = *t;
    r.arena = other;
    r.device = other->device;
    return r;
}

const char *rt_tensor_str(const rt_tensor *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "%s[", rt_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}
