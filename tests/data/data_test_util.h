/* Helpers for the data tests: a scratch folder and files written into it. */
#ifndef RT_DATA_TEST_UTIL_H
#define RT_DATA_TEST_UTIL_H

#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* A fresh folder under $TMPDIR (or /tmp) whose name contains `tag`. */
static inline char *dt_mkdtemp(const char *tag) {
    const char *tmp = getenv("TMPDIR");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/rt-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(p)) fail_msg("mkdtemp %s failed", p);
    return p;
}

static inline void dt_path(char *out, size_t n, const char *dir, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

static inline void dt_write(const char *dir, const char *name, const void *data, size_t len) {
    char p[8400];
    dt_path(p, sizeof p, dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) fail_msg("cannot write %s", p);
    if (len && fwrite(data, 1, len, f) != len) fail_msg("short write %s", p);
    fclose(f);
}

static inline void dt_write_gz(const char *dir, const char *name, const void *data, size_t len) {
    char p[8400];
    dt_path(p, sizeof p, dir, name);
    gzFile g = gzopen(p, "wb");
    if (!g) fail_msg("gzopen %s", p);
    if (len && gzwrite(g, data, (unsigned)len) != (int)len) fail_msg("gzwrite %s", p);
    gzclose(g);
}

/* gzip of a buffer in memory (caller frees). */
static inline unsigned char *dt_gzip(const void *data, size_t len, size_t *out_len) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) fail_msg("deflateInit2");
    size_t cap = deflateBound(&zs, len) + 64;
    unsigned char *out = malloc(cap);
    zs.next_in = (Bytef *)data;
    zs.avail_in = (uInt)len;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) fail_msg("deflate");
    *out_len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

static inline void dt_rm_rf(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Assert that the last error mentions `needle`. */
#define assert_error_has(needle)                                                                                       \
    do {                                                                                                               \
        if (!strstr(rt_error_message(), (needle)))                                                                     \
            fail_msg("error message does not contain \"%s\": %s", (needle), rt_error_message());                       \
    } while (0)

#endif
