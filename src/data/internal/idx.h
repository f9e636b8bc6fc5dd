/* IDX files (MNIST, Fashion-MNIST): header validation over a memory buffer.
 *
 * IDX is a 4-byte magic (0x00 0x00, element type, number of dimensions), one big-endian
 * uint32 per dimension, then the elements in C order. MNIST-format images are
 * idx3-ubyte (N, rows, cols) and labels idx1-ubyte (N). rt_idx_parse checks everything
 * (magic, element type, dimension count, positive sizes, the exact data length) and
 * returns a view into the buffer; it never reads past `len`.
 */
#ifndef RT_DATA_IDX_H
#define RT_DATA_IDX_H

#include "core/status.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_IDX_MAX_DIMS 4

typedef struct rt_idx {
    int ndim;
    uint32_t dims[RT_IDX_MAX_DIMS];
    const uint8_t *data; /* into the parsed buffer: prod(dims) bytes */
    size_t count;        /* prod(dims) */
} rt_idx;

/* Parse an unsigned-byte IDX buffer with exactly `want_ndim` dimensions (1..4). `name`
 * (the file) is used in error messages. */
rt_status rt_idx_parse(const uint8_t *buf, size_t len, const char *name, int want_ndim, rt_idx *out);

#ifdef __cplusplus
}
#endif

#endif
