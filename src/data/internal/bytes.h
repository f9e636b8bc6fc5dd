/* Whole files in memory, gunzipped (zlib) when they are gzip.
 *
 * The readers of src/data parse memory buffers, not FILE streams, so that the very same
 * code runs on files and inside the libFuzzer targets, and so that gzip and raw input
 * go through one path: read the file, inflate it if it starts with the gzip magic,
 * then parse. Every failure names the file (or buffer) and what was wrong.
 */
#ifndef RT_DATA_BYTES_H
#define RT_DATA_BYTES_H

#include "core/status.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An owned buffer of bytes (64-byte aligned; free with rt_bytes_free). */
typedef struct rt_bytes {
    uint8_t *data;
    size_t len;
} rt_bytes;

void rt_bytes_free(rt_bytes *b);

/* True when buf starts with the gzip magic 1f 8b. */
bool rt_is_gzip(const uint8_t *buf, size_t len);

/* The whole file `path` into memory. */
rt_status rt_bytes_read_file(const char *path, rt_bytes *out);

/* Inflate the gzip data held in buf (one member, or several concatenated as gzip -d
 * reads them); name is used in error messages. The output may not exceed max_out bytes
 * (an error says so); other bytes after the last member are an error (no silently
 * ignored data). */
rt_status rt_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, rt_bytes *out);

/* rt_bytes_read_file, then rt_gunzip when the content is gzip. */
rt_status rt_bytes_read_maybe_gz(const char *path, size_t max_out, rt_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
