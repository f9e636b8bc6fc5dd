/* Whole files into memory and gzip inflation with zlib; see bytes.h. */
#include "data/internal/bytes.h"

#include "core/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

void rt_bytes_free(rt_bytes *b) {
    if (!b) return;
    rt_free(rt_device_cpu(), b->data);
    b->data = NULL;
    b->len = 0;
}

bool rt_is_gzip(const uint8_t *buf, size_t len) { return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b; }

rt_status rt_bytes_read_file(const char *path, rt_bytes *out) {
    out->data = NULL;
    out->len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) RT_FAIL(RT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    rt_status st = RT_OK;
    if (fseeko(f, 0, SEEK_END) != 0) {
        st = RT_ERROR(RT_ERR_IO, "cannot seek in '%s': %s", path, strerror(errno));
        goto done;
    }
    off_t size = ftello(f);
    if (size < 0 || fseeko(f, 0, SEEK_SET) != 0) {
        st = RT_ERROR(RT_ERR_IO, "cannot size '%s': %s", path, strerror(errno));
        goto done;
    }
    void *p = NULL;
    RT_CHECK_GOTO(rt_malloc(rt_device_cpu(), (size_t)size, &p), st, done);
    out->data = p;
    size_t got = size > 0 ? fread(out->data, 1, (size_t)size, f) : 0;
    if (got != (size_t)size) {
        st = RT_ERROR(RT_ERR_IO, "short read of '%s': expected %lld bytes, got %zu%s%s", path, (long long)size, got,
                      ferror(f) ? ": " : "", ferror(f) ? strerror(errno) : "");
        rt_bytes_free(out);
        goto done;
    }
    out->len = (size_t)size;
done:
    fclose(f);
    return st;
}

rt_status rt_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, rt_bytes *out) {
    out->data = NULL;
    out->len = 0;
    if (!rt_is_gzip(buf, len)) RT_FAIL(RT_ERR_FORMAT, "%s: not gzip data (no 1f 8b magic)", name);
    if (len < 18)
        RT_FAIL(RT_ERR_FORMAT, "%s: gzip error: truncated stream (%zu bytes, a gzip member has at least 18)", name,
                len);
    /* the trailer's ISIZE (size mod 2^32) is a good first guess of the output size */
    size_t cap =
        (size_t)buf[len - 4] | (size_t)buf[len - 3] << 8 | (size_t)buf[len - 2] << 16 | (size_t)buf[len - 1] << 24;
    /* deflate expands at most ~1032:1, so a larger ISIZE is a lie (or a multi-member file) */
    if (cap / 1032 > len) cap = len * 1032;
    if (cap < 4096) cap = 4096;
    if (cap > max_out) cap = max_out > 0 ? max_out : 1;
    void *p = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), cap, &p));
    uint8_t *dst = p;

    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 16) != Z_OK) { /* gzip wrapper only */
        rt_free(rt_device_cpu(), dst);
        RT_FAIL(RT_ERR_NOMEM, "%s: inflateInit2 failed", name);
    }
    rt_status st = RT_OK;
    size_t in_pos = 0, out_pos = 0;
    int zr = Z_OK;
    for (;;) {
        if (out_pos == cap) {
            if (cap >= max_out) {
                st =
                    RT_ERROR(RT_ERR_FORMAT, "%s: gzip data inflates to more than %zu bytes (the limit)", name, max_out);
                goto fail;
            }
            size_t ncap = cap > max_out / 2 ? max_out : cap * 2;
            void *q = NULL;
            RT_CHECK_GOTO(rt_malloc(rt_device_cpu(), ncap, &q), st, fail);
            memcpy(q, dst, out_pos);
            rt_free(rt_device_cpu(), dst);
            dst = q;
            cap = ncap;
        }
        size_t in_left = len - in_pos, out_left = cap - out_pos;
        zs.next_in = (Bytef *)(buf + in_pos);
        zs.avail_in = in_left > 0x40000000u ? 0x40000000u : (uInt)in_left;
        zs.next_out = dst + out_pos;
        zs.avail_out = out_left > 0x40000000u ? 0x40000000u : (uInt)out_left;
        uInt ai = zs.avail_in, ao = zs.avail_out;
        zr = inflate(&zs, Z_NO_FLUSH);
        in_pos += ai - zs.avail_in;
        out_pos += ao - zs.avail_out;
        if (zr == Z_STREAM_END) {
            /* another gzip member follows (as `cat a.gz b.gz` makes): gzip -d reads on */
            if (in_pos < len && rt_is_gzip(buf + in_pos, len - in_pos) && inflateReset(&zs) == Z_OK) continue;
            break;
        }
        if (zr == Z_BUF_ERROR && in_pos == len) {
            st = RT_ERROR(RT_ERR_FORMAT,
                          "%s: gzip error: truncated stream (ends after %zu compressed bytes, %zu inflated)", name, len,
                          out_pos);
            goto fail;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            st = RT_ERROR(RT_ERR_FORMAT, "%s: gzip error at compressed byte %zu: %s", name, in_pos,
                          zs.msg ? zs.msg : zError(zr));
            goto fail;
        }
    }
    if (in_pos != len) {
        st = RT_ERROR(RT_ERR_FORMAT, "%s: %zu unexpected bytes after the end of the gzip stream (at byte %zu)", name,
                      len - in_pos, in_pos);
        goto fail;
    }
    inflateEnd(&zs);
    out->data = dst;
    out->len = out_pos;
    return RT_OK;
fail:
    inflateEnd(&zs);
    rt_free(rt_device_cpu(), dst);
    return st;
}

rt_status rt_bytes_read_maybe_gz(const char *path, size_t max_out, rt_bytes *out) {
    rt_bytes raw;
    RT_CHECK(rt_bytes_read_file(path, &raw));
    if (!rt_is_gzip(raw.data, raw.len)) {
        *out = raw;
        return RT_OK;
    }
    rt_status st = rt_gunzip(raw.data, raw.len, path, max_out, out);
    rt_bytes_free(&raw);
    if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "rt_gunzip(path)");
    return st;
}
