/* Whole files into memory and gzip inflation with zlib; see bytes.h. */
#include "data/internal/bytes.h"

#include "core/device.h"
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

void rt_bytes_free(rt_bytes *b) {
    if (!b) return;
    rt_free(rt_device_cpu(), b->data);
    b->data = NULL;
    b->len = 0;
}

bool rt_is_gzip(const uint8_t *buf, size_t len) { return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b; }

/* The rest of an open file (`have` bytes of it already in `head`) into a new buffer. */
static rt_status read_rest(int fd, const char *path, const uint8_t *head, size_t have, size_t size, rt_bytes *out) {
    void *p = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), size ? size : 1, &p));
    if (have) memcpy(p, head, have);
    rt_status st = rt_file_read_exact(fd, (uint8_t *)p + have, size - have, path);
    if (st != RT_OK) {
        rt_free(rt_device_cpu(), p);
        return st;
    }
    out->data = p;
    out->len = size;
    return RT_OK;
}

static rt_status open_sized(const char *path, size_t max_size, int *fd, size_t *size) {
    uint64_t sz;
    RT_CHECK(rt_file_open_regular(path, NULL, fd, &sz));
    if (sz > max_size) {
        close(*fd);
        *fd = -1;
        RT_FAIL(RT_ERR_FORMAT, "%s: %llu bytes, more than the %zu-byte limit", path, (unsigned long long)sz, max_size);
    }
    *size = (size_t)sz;
    return RT_OK;
}

/* Grow dst to ncap bytes, keeping the first `used`. */
static rt_status grow(uint8_t **dst, size_t used, size_t ncap) {
    void *q = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), ncap, &q));
    memcpy(q, *dst, used);
    rt_free(rt_device_cpu(), *dst);
    *dst = q;
    return RT_OK;
}

rt_status rt_gunzip(const uint8_t *buf, size_t len, const char *name, size_t max_out, const rt_bytes_rule *rule,
                    rt_bytes *out) {
    out->data = NULL;
    out->len = 0;
    if (!rt_is_gzip(buf, len)) RT_FAIL(RT_ERR_FORMAT, "%s: not gzip data (no 1f 8b magic)", name);
    if (len < 18)
        RT_FAIL(RT_ERR_FORMAT, "%s: gzip error: truncated stream (%zu bytes, a gzip member has at least 18)", name,
                len);
    if (max_out == 0) max_out = 1;
    /* the output limit: max_out, or once the header is read, the size it declares + 1 */
    size_t limit = max_out;
    bool declared = false, head_done = !rule || !rule->size;
    /* the trailer's ISIZE (size mod 2^32) is a good first guess of the output size */
    size_t cap =
        (size_t)buf[len - 4] | (size_t)buf[len - 3] << 8 | (size_t)buf[len - 2] << 16 | (size_t)buf[len - 1] << 24;
    /* deflate expands at most ~1032:1, so a larger ISIZE is a lie (or a multi-member file) */
    if (cap / 1032 > len) cap = len * 1032;
    if (!head_done && rule->head) cap = rule->head; /* only the header until its size is known */
    if (cap < 4096) cap = 4096;
    if (cap > limit) cap = limit;
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
        if (!head_done && out_pos >= rule->head) {
            size_t want;
            RT_CHECK_GOTO(rule->size(dst, out_pos, RT_BYTES_SIZE_UNKNOWN, name, rule->arg, &want), st, fail);
            head_done = true;
            if (want != RT_BYTES_SIZE_UNKNOWN) {
                if (want > max_out) {
                    st = RT_ERROR(RT_ERR_FORMAT, "%s: the header declares %zu bytes, more than the %zu-byte limit",
                                  name, want, max_out);
                    goto fail;
                }
                declared = true;
                limit = want + 1; /* one byte more tells a longer stream */
                if (out_pos > want) {
                    st = RT_ERROR(RT_ERR_FORMAT,
                                  "%s: gzip data inflates past the %zu bytes its header declares (unexpected bytes "
                                  "after the data)",
                                  name, want);
                    goto fail;
                }
                if (cap != limit) {
                    RT_CHECK_GOTO(grow(&dst, out_pos, limit), st, fail);
                    cap = limit;
                }
            }
        }
        if (out_pos == cap) {
            if (declared) {
                st = RT_ERROR(RT_ERR_FORMAT,
                              "%s: gzip data inflates past the %zu bytes its header declares (unexpected bytes after "
                              "the data); stopped there",
                              name, limit - 1);
                goto fail;
            }
            if (cap >= limit) {
                st =
                    RT_ERROR(RT_ERR_FORMAT, "%s: gzip data inflates to more than %zu bytes (the limit)", name, max_out);
                goto fail;
            }
            size_t ncap = cap > limit / 2 ? limit : cap * 2;
            RT_CHECK_GOTO(grow(&dst, out_pos, ncap), st, fail);
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
    if (rule && rule->size) { /* the whole size against the header (or a header cut short) */
        size_t want;
        size_t hl = out_pos < rule->head ? out_pos : rule->head;
        RT_CHECK_GOTO(rule->size(dst, hl, out_pos, name, rule->arg, &want), st, fail);
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

rt_status rt_bytes_read_maybe_gz(const char *path, size_t max_out, const rt_bytes_rule *rule, rt_bytes *out) {
    out->data = NULL;
    out->len = 0;
    int fd = -1;
    size_t size = 0; /* set by open_sized (initialised for gcc's -Wmaybe-uninitialized once it inlines it) */
    RT_CHECK(open_sized(path, max_out, &fd, &size));
    /* the first bytes: the gzip magic, or the raw header the rule checks */
    uint8_t head[64];
    size_t want_head = rule && rule->size && rule->head > 2 ? rule->head : 2;
    if (want_head > sizeof head) want_head = sizeof head;
    size_t have = size < want_head ? size : want_head;
    rt_status st = rt_file_read_exact(fd, head, have, path);
    if (st != RT_OK) goto done;
    if (rt_is_gzip(head, have)) {
        rt_bytes raw;
        RT_CHECK_GOTO(read_rest(fd, path, head, have, size, &raw), st, done);
        st = rt_gunzip(raw.data, raw.len, path, max_out, rule, out);
        rt_bytes_free(&raw);
        if (st != RT_OK) rt_error_trace(__FILE__, __LINE__, "rt_gunzip(path)");
        goto done;
    }
    if (rule && rule->size) { /* refuse a size that disagrees with the header before reading it */
        size_t want;
        RT_CHECK_GOTO(rule->size(head, have, size, path, rule->arg, &want), st, done);
    }
    st = read_rest(fd, path, head, have, size, out);
done:
    close(fd);
    return st;
}
