/* Tensor descriptors and arenas.
 *
 * A descriptor is dtype + shape + device + where the bytes are: either a plain pointer
 * or an offset into an arena. Arenas hold all parameters of a model in one allocation
 * (and gradients, optimizer state in arenas of the same layout), so a reduction or an
 * optimizer step runs over one flat buffer. Shapes are PyTorch's (NCHW, OIHW).
 */
#ifndef RT_TENSOR_H
#define RT_TENSOR_H

#include "core/device.h"
#include "core/names.h"
#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_MAX_DIMS 8

/* RT_BF16: bfloat16 (core/bf16.h), 2 bytes; used for compressed gradients on the wire
 * (dist.compress: bf16), not for model tensors or files */
typedef enum rt_dtype { RT_F32 = 0, RT_F64, RT_I32, RT_I64, RT_U8, RT_BF16, RT_DTYPE_COUNT_ } rt_dtype;

size_t rt_dtype_size(rt_dtype t);
const char *rt_dtype_name(rt_dtype t); /* "f32", ... */
/* "f32" | "f64" | "i32" | "i64" | "u8" | "bf16", or float32, bfloat16, float, float64, double, int32, int64,
 * uint8 (case-insensitive: safetensors' "F32" too); RT_ERR_INVALID naming the accepted
 * names otherwise. It parses with rt_dtype_names (core/names.h), the one table. */
rt_status rt_dtype_parse(const char *text, rt_dtype *out);
extern const rt_names rt_dtype_names;

/* A bump allocator of one device buffer. Plan with rt_arena_push (offsets only), then
 * rt_arena_alloc allocates `size` bytes, zeroed. Offsets are aligned to 64 bytes by
 * default, so each tensor starts on a cache line. */
typedef struct rt_arena {
    rt_device device;
    size_t size; /* bytes planned so far */
    void *base;  /* NULL until allocated */
} rt_arena;

void rt_arena_init(rt_arena *a, rt_device device);
rt_status rt_arena_push(rt_arena *a, size_t nbytes, size_t align, size_t *offset);
rt_status rt_arena_alloc(rt_arena *a);
void rt_arena_free(rt_arena *a);

typedef struct rt_tensor {
    rt_dtype dtype;
    int ndim;
    int64_t shape[RT_MAX_DIMS];
    rt_device device;
    void *data;      /* when arena == NULL */
    rt_arena *arena; /* when set: bytes at arena->base + offset */
    size_t offset;
} rt_tensor;

/* Descriptor with a shape and no storage yet. Rejects ndim outside 0..8, negative
 * dims and element counts that overflow. */
rt_status rt_tensor_init(rt_tensor *t, rt_dtype dtype, int ndim, const int64_t *shape, rt_device device);
int64_t rt_tensor_numel(const rt_tensor *t);
size_t rt_tensor_nbytes(const rt_tensor *t);
bool rt_tensor_same_shape(const rt_tensor *a, const rt_tensor *b);
/* Pointer to the first element (resolves arena offsets; NULL if unallocated). */
void *rt_tensor_data(const rt_tensor *t);
/* Place the tensor in an arena (plans its offset). */
rt_status rt_tensor_place(rt_tensor *t, rt_arena *a);
/* The same tensor in another arena of the same layout (parameter -> its gradient). */
rt_tensor rt_tensor_in(const rt_tensor *t, rt_arena *other);
/* "f32[64, 3, 7, 7]" */
const char *rt_tensor_str(const rt_tensor *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
