/* safetensors files: a minimal reader and writer.
 *
 * Format (https://github.com/huggingface/safetensors): 8-byte little-endian header
 * length N, then N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * then the tensor bytes (offsets relative to the end of the header). This is what
 * PyTorch users read with safetensors.torch.load_file, and what ringtrain's model and
 * checkpoint files are. The header JSON is parsed with jansson (Debian libjansson), as
 * the reference implementation reads it: UTF-8 validated, duplicate keys refused at
 * every level, \u escapes decoded (surrogate pairs included, \u0000 refused).
 *
 * Reading validates everything else here: the header length against the file size
 * (exactly size - 8 is the largest accepted), the header is an object, tensor names are
 * non-empty, dtypes (F32 F64 I32 I64 U8), shapes, offsets consistent with dtype x shape,
 * contiguous from 0 with no gaps or overlaps and covering the data, __metadata__ a
 * string -> string map. Errors are RT_ERR_FORMAT naming the file, the tensor and what
 * was expected; NUL and control characters in them are printed escaped (\xNN).
 * rt_safetensors_read opens the file with rt_file_open_regular (never blocks on a FIFO;
 * a directory or device is named) and refuses a header length past the end unread.
 */
#ifndef RT_SAFETENSORS_H
#define RT_SAFETENSORS_H

#include "core/status.h"
#include "core/tensor.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rt_st_tensor {
    char *name;
    rt_dtype dtype;
    int ndim;
    int64_t shape[RT_MAX_DIMS];
    size_t begin, end; /* byte offsets into the data section */
    const void *data;  /* points into the file's data */
} rt_st_tensor;

typedef struct rt_safetensors {
    char path[512]; /* for error messages */
    int n;          /* tensors, sorted by name */
    rt_st_tensor *tensors;
    int n_meta;
    char **meta_keys, **meta_values;
    void *bytes; /* the whole file */
    size_t size;
} rt_safetensors;

/* Read and validate a file / a buffer (copied). `what` names it in errors. */
rt_status rt_safetensors_read(const char *path, rt_safetensors **out);
rt_status rt_safetensors_parse(const void *buf, size_t len, const char *what, rt_safetensors **out);
void rt_safetensors_free(rt_safetensors *st);

/* NULL when absent */
const rt_st_tensor *rt_safetensors_find(const rt_safetensors *st, const char *name);
const char *rt_safetensors_meta(const rt_safetensors *st, const char *key);

/* Copy a tensor's bytes to host memory `dst` after checking that it exists and has
 * exactly this dtype and shape (errors name the file and tensor). */
rt_status rt_safetensors_get(const rt_safetensors *st, const char *name, rt_dtype dtype, int ndim, const int64_t *shape,
                             void *dst);

/* Writer: collect tensors (host pointers, not copied: keep them alive until write)
 * and metadata, then write the file (to path.tmp, fsync, rename). */
typedef struct rt_st_writer rt_st_writer;
rt_status rt_st_writer_create(rt_st_writer **out);
rt_status rt_st_writer_add(rt_st_writer *w, const char *name, rt_dtype dtype, int ndim, const int64_t *shape,
                           const void *data);
rt_status rt_st_writer_meta(rt_st_writer *w, const char *key, const char *value);
rt_status rt_st_writer_write(rt_st_writer *w, const char *path);
/* Visit the tensors' bytes in the order rt_st_writer_write lays out the data section
 * (by name), e.g. to checksum the data before it is written. */
void rt_st_writer_each_data(rt_st_writer *w, void (*fn)(void *user, const void *data, size_t n), void *user);
void rt_st_writer_free(rt_st_writer *w);

#ifdef __cplusplus
}
#endif

#endif
