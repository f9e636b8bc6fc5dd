/* IDX parsing; see idx.h. */
#include "data/internal/idx.h"

#include <stdint.h>

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

rt_status rt_idx_header(const uint8_t *buf, size_t len, const char *name, int want_ndim, rt_idx *out, size_t *header) {
    RT_REQUIRE(want_ndim >= 1 && want_ndim <= RT_IDX_MAX_DIMS, RT_ERR_INVALID, "want_ndim %d: expected 1..%d",
               want_ndim, RT_IDX_MAX_DIMS);
    if (len < 4)
        RT_FAIL(RT_ERR_FORMAT, "%s: truncated IDX header: expected at least 4 bytes of magic, got %zu", name, len);
    uint32_t magic = be32(buf);
    uint32_t want_magic = 0x00000800u | (uint32_t)want_ndim;
    if (buf[0] != 0 || buf[1] != 0)
        RT_FAIL(RT_ERR_FORMAT, "%s: bad magic 0x%08x: expected 0x%08x (IDX, unsigned byte, %d dimensions)", name, magic,
                want_magic, want_ndim);
    if (buf[2] != 0x08)
        RT_FAIL(RT_ERR_FORMAT, "%s: bad magic 0x%08x: element type 0x%02x, expected 0x08 (unsigned byte)", name, magic,
                buf[2]);
    if (buf[3] != want_ndim)
        RT_FAIL(RT_ERR_FORMAT, "%s: wrong dimensions: the file has %d dimensions (magic 0x%08x), expected %d (%s)",
                name, buf[3], magic, want_ndim, want_ndim == 3 ? "images: count, rows, cols" : "labels: count");
    size_t hdr = 4 + 4 * (size_t)want_ndim;
    if (len < hdr) RT_FAIL(RT_ERR_FORMAT, "%s: truncated IDX header: expected %zu bytes, got %zu", name, hdr, len);
    out->ndim = want_ndim;
    size_t count = 1;
    for (int i = 0; i < want_ndim; i++) {
        out->dims[i] = be32(buf + 4 + 4 * i);
        if (out->dims[i] == 0)
            RT_FAIL(RT_ERR_FORMAT, "%s: wrong dimensions: dimension %d is 0, expected a positive size", name, i);
        if (__builtin_mul_overflow(count, (size_t)out->dims[i], &count) || count > SIZE_MAX - hdr - 1)
            RT_FAIL(RT_ERR_FORMAT, "%s: wrong dimensions: the element count overflows", name);
    }
    for (int i = want_ndim; i < RT_IDX_MAX_DIMS; i++) out->dims[i] = 1;
    out->count = count;
    out->data = NULL;
    *header = hdr;
    return RT_OK;
}

/* The exact-length rule: `total` bytes for a header of `header` bytes and `count` elements. */
static rt_status check_length(const char *name, size_t header, size_t count, size_t total) {
    size_t have = total - header;
    if (have < count)
        RT_FAIL(RT_ERR_FORMAT, "%s: truncated data: expected %zu bytes after the %zu-byte header, got %zu", name, count,
                header, have);
    if (have > count)
        RT_FAIL(RT_ERR_FORMAT, "%s: %zu unexpected bytes after the data: expected exactly %zu bytes after the header",
                name, have - count, count);
    return RT_OK;
}

rt_status rt_idx_parse(const uint8_t *buf, size_t len, const char *name, int want_ndim, rt_idx *out) {
    size_t header;
    RT_CHECK(rt_idx_header(buf, len, name, want_ndim, out, &header));
    RT_CHECK(check_length(name, header, out->count, len));
    out->data = buf + header;
    return RT_OK;
}

static rt_status idx_size(const uint8_t *head, size_t head_len, size_t total, const char *name, const void *arg,
                          size_t *expected) {
    int ndim = *(const int *)arg;
    rt_idx v;
    size_t header;
    RT_CHECK(rt_idx_header(head, head_len, name, ndim, &v, &header));
    *expected = header + v.count;
    if (total != RT_BYTES_SIZE_UNKNOWN) RT_CHECK(check_length(name, header, v.count, total));
    return RT_OK;
}

rt_bytes_rule rt_idx_rule(int want_ndim) {
    static const int k_ndims[RT_IDX_MAX_DIMS + 1] = {0, 1, 2, 3, 4};
    int nd = want_ndim >= 1 && want_ndim <= RT_IDX_MAX_DIMS ? want_ndim : 0;
    return (rt_bytes_rule){.head = 4 + 4 * (size_t)nd, .size = idx_size, .arg = &k_ndims[nd]};
}
