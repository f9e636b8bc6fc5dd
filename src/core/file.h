/* Opening the files ringtrain reads (datasets, safetensors, configs) safely.
 *
 * rt_file_open_regular opens a path for reading without ever blocking: the open is
 * non-blocking (so a FIFO with no writer does not hang the process), then fstat checks
 * that it is a regular file, then O_NONBLOCK is cleared. Anything else is refused with
 * an error that names the path and what it is: "is a directory", "is a FIFO (named
 * pipe)", "is a device", "is a socket", or the open's own errno text ("Too many levels
 * of symbolic links", "Permission denied", "No such file or directory"), never a bare
 * "missing".
 */
#ifndef RT_CORE_FILE_H
#define RT_CORE_FILE_H

#include "core/status.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Open `path` read-only; it must be a regular file. On success *fd is an open
 * descriptor (close-on-exec, blocking) and *size the file's size. `what` ("config",
 * "dataset file", ...) prefixes the error message; NULL for none. Errors: RT_ERR_IO. */
rt_status rt_file_open_regular(const char *path, const char *what, int *fd, uint64_t *size);

/* Read exactly `n` bytes at the current offset of fd (EINTR retried); a short file is
 * an RT_ERR_IO error naming `path` and the byte offset reached. */
rt_status rt_file_read_exact(int fd, void *buf, size_t n, const char *path);

/* The whole regular file `path` into a new malloc'd buffer (NUL-terminated, not
 * counted in *len). Files larger than max_size are refused before they are read. */
rt_status rt_file_read_all(const char *path, const char *what, size_t max_size, char **out, size_t *len);

/* mkdir -p: `path` and its missing parents (0755). An error names `what` ("run
 * directory"), the component that failed and why; an existing non-directory is refused. */
rt_status rt_file_mkdirs(const char *path, const char *what);

#ifdef __cplusplus
}
#endif

#endif
