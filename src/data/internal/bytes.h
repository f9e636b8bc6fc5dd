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

/* What a format's header says about the size of the whole (inflated) file. */
#define RT_BYTES_SIZE_UNKNOWN SIZE_MAX
typedef struct rt_bytes_rule {
    size_t head; /* header bytes `size` needs to see (fewer only when the data is shorter) */
    /* Check the header in head[0..head_len) and give the exact size the whole data must
     * have in *expected (RT_BYTES_SIZE_UNKNOWN: the format does not say). `total` is the
     * real size when known, else RT_BYTES_SIZE_UNKNOWN; when known, a size that
     * disagrees is an error naming `name` and both sizes. */
    rt_status (*size)(const uint8_t *head, size_t head_len, size_t total, const char *name, const void *arg,
                      size_t *expected);
    const void *arg;
} rt_bytes_rule;

/* Inflate the gzip data held in buf (one member, or several concatenated as gzip -d
 * reads them); name is used in error messages. The output may not exceed max_out bytes
 * (an error says so); other bytes after the last member are an error (no silently
 * ignored data). With a rule (may be NULL), the header is checked from the first
 * inflated bytes and inflating stops, with an error, as soon as the output passes the
 * size the header declares: a gzip bomb costs at most that size plus one byte. */
rt_status rt_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, const rt_bytes_rule *rule,
                    rt_bytes *out);

/* A file, inflated when it is gzip, with a size rule (may be NULL): a raw file whose
 * size disagrees with its header is refused before it is read whole; gzip data as
 * rt_gunzip. At most max_out bytes either way. */
rt_status rt_bytes_read_maybe_gz(const char *path, size_t max_out, const rt_bytes_rule *rule, rt_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
