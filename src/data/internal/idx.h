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
#include "data/internal/bytes.h"
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

/* The header alone (the first len bytes of a file, len may be larger): magic, element
 * type, dimensions, their product (out->count; out->data stays NULL) and the header's
 * length. Errors are rt_idx_parse's. */
rt_status rt_idx_header(const uint8_t *buf, size_t len, const char *name, int want_ndim, rt_idx *out, size_t *header);

/* The size rule of an IDX file with want_ndim dimensions for rt_bytes_read_maybe_gz: the
 * header declares the exact length (header + prod(dims)), so a raw file of another size
 * is refused before it is read, and gzip data is refused as soon as it inflates past it. */
rt_bytes_rule rt_idx_rule(int want_ndim);

#ifdef __cplusplus
}
#endif

#endif
