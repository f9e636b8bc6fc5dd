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

/* rt_gunzip's state: the compressed input, the output buffer and its limits. */
typedef struct gunzip {
    const char *name;
    const rt_bytes_rule *rule;
    const uint8_t *in;
    size_t in_len, in_pos;
    size_t max_out;
    size_t limit;   /* max_out, or once the header is read, the size it declares + 1 */
    bool declared;  /* the header declared the size */
    bool head_done; /* the header was read (or there is none to read) */
    uint8_t *dst;
    size_t cap, out_pos;
    z_stream zs;
} gunzip;

/* What the trailer's ISIZE (size mod 2^32) says the stream inflates to, bounded by what
 * deflate can make of this many compressed bytes (at most ~1032:1: a larger ISIZE is a
 * lie, or a multi-member file) and by the limit. A guess, never trusted. */
static size_t isize_guess(const gunzip *g) {
    const uint8_t *t = g->in + g->in_len - 4;
    size_t n = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
    if (n / 1032 > g->in_len) n = g->in_len * 1032;
    return n < g->limit ? n : g->limit;
}

/* The first output buffer's size: the ISIZE guess, or only the header until its size is
 * known; at least 4 KiB, at most the limit. */
static size_t first_cap(const gunzip *g) {
    size_t cap = isize_guess(g);
    if (!g->head_done && g->rule->head) cap = g->rule->head; /* only the header until its size is known */
    if (cap < 4096) cap = 4096;
    if (cap > g->limit) cap = g->limit;
    return cap;
}

/* Once the header is inflated: the size it declares (if it does) becomes the limit (that
 * size + 1: one byte more tells a longer stream). The buffer still grows only as the data
 * arrives (make_room), from the ISIZE guess: a 60-byte file may declare 4 GiB, and
 * check_end compares the declared size with what the stream inflated to. */
static rt_status take_header(gunzip *g) {
    if (g->head_done || g->out_pos < g->rule->head) return RT_OK;
    size_t want;
    RT_CHECK(g->rule->size(g->dst, g->out_pos, RT_BYTES_SIZE_UNKNOWN, g->name, g->rule->arg, &want));
    g->head_done = true;
    if (want == RT_BYTES_SIZE_UNKNOWN) return RT_OK;
    if (want > g->max_out)
        RT_FAIL(RT_ERR_FORMAT, "%s: the header declares %zu bytes, more than the %zu-byte limit", g->name, want,
                g->max_out);
    g->declared = true;
    g->limit = want + 1;
    if (g->out_pos > want)
        RT_FAIL(RT_ERR_FORMAT,
                "%s: gzip data inflates past the %zu bytes its header declares (unexpected bytes after the data)",
                g->name, want);
    size_t guess = isize_guess(g);
    if (guess > g->cap) {
        RT_CHECK(grow(&g->dst, g->out_pos, guess));
        g->cap = guess;
    }
    if (g->cap > g->limit) g->cap = g->limit; /* the bytes past it stay unused */
    return RT_OK;
}

/* A full buffer: twice as large, up to the limit; past the limit (or the declared size)
 * an error. */
static rt_status make_room(gunzip *g) {
    if (g->out_pos < g->cap) return RT_OK;
    if (g->cap >= g->limit && g->declared)
        RT_FAIL(RT_ERR_FORMAT,
                "%s: gzip data inflates past the %zu bytes its header declares (unexpected bytes after the data); "
                "stopped there",
                g->name, g->limit - 1);
    if (g->cap >= g->limit)
        RT_FAIL(RT_ERR_FORMAT, "%s: gzip data inflates to more than %zu bytes (the limit)", g->name, g->max_out);
    size_t ncap = g->cap > g->limit / 2 ? g->limit : g->cap * 2;
    RT_CHECK(grow(&g->dst, g->out_pos, ncap));
    g->cap = ncap;
    return RT_OK;
}

/* One inflate call into the buffer's free space; *end once the last gzip member ended. */
static rt_status inflate_some(gunzip *g, bool *end) {
    z_stream *zs = &g->zs;
    *end = false;
    size_t in_left = g->in_len - g->in_pos, out_left = g->cap - g->out_pos;
    zs->next_in = (Bytef *)(g->in + g->in_pos);
    zs->avail_in = in_left > 0x40000000u ? 0x40000000u : (uInt)in_left;
    zs->next_out = g->dst + g->out_pos;
    zs->avail_out = out_left > 0x40000000u ? 0x40000000u : (uInt)out_left;
    uInt ai = zs->avail_in, ao = zs->avail_out;
    int zr = inflate(zs, Z_NO_FLUSH);
    g->in_pos += ai - zs->avail_in;
    g->out_pos += ao - zs->avail_out;
    if (zr == Z_STREAM_END) {
        /* another gzip member follows (as `cat a.gz b.gz` makes): gzip -d reads on */
        const uint8_t *next = g->in + g->in_pos;
        *end = !(g->in_pos < g->in_len && rt_is_gzip(next, g->in_len - g->in_pos) && inflateReset(zs) == Z_OK);
        return RT_OK;
    }
    if (zr == Z_BUF_ERROR && g->in_pos == g->in_len)
        RT_FAIL(RT_ERR_FORMAT, "%s: gzip error: truncated stream (ends after %zu compressed bytes, %zu inflated)",
                g->name, g->in_len, g->out_pos);
    if (zr != Z_OK && zr != Z_BUF_ERROR)
        RT_FAIL(RT_ERR_FORMAT, "%s: gzip error at compressed byte %zu: %s", g->name, g->in_pos,
                zs->msg ? zs->msg : zError(zr));
    return RT_OK;
}

/* After the last member: no bytes left over, and the whole size against the header (or
 * a header cut short). */
static rt_status check_end(const gunzip *g) {
    if (g->in_pos != g->in_len)
        RT_FAIL(RT_ERR_FORMAT, "%s: %zu unexpected bytes after the end of the gzip stream (at byte %zu)", g->name,
                g->in_len - g->in_pos, g->in_pos);
    if (g->rule && g->rule->size) {
        size_t want;
        size_t hl = g->out_pos < g->rule->head ? g->out_pos : g->rule->head;
        RT_CHECK(g->rule->size(g->dst, hl, g->out_pos, g->name, g->rule->arg, &want));
    }
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
    gunzip g = {.name = name,
                .rule = rule,
                .in = buf,
                .in_len = len,
                .max_out = max_out,
                .limit = max_out,
                .head_done = !rule || !rule->size};
    g.cap = first_cap(&g);
    void *p = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), g.cap, &p));
    g.dst = p;
    if (inflateInit2(&g.zs, 15 + 16) != Z_OK) { /* gzip wrapper only */
        rt_free(rt_device_cpu(), g.dst);
        RT_FAIL(RT_ERR_NOMEM, "%s: inflateInit2 failed", name);
    }
    rt_status st = RT_OK;
    for (bool end = false; !end;) {
        RT_CHECK_GOTO(take_header(&g), st, fail);
        RT_CHECK_GOTO(make_room(&g), st, fail);
        RT_CHECK_GOTO(inflate_some(&g, &end), st, fail);
    }
    RT_CHECK_GOTO(check_end(&g), st, fail);
    inflateEnd(&g.zs);
    out->data = g.dst;
    out->len = g.out_pos;
    return RT_OK;
fail:
    inflateEnd(&g.zs);
    rt_free(rt_device_cpu(), g.dst);
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
