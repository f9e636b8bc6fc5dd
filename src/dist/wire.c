/* Wire formats: encoders and length-checked parsers (see wire.h). */
#include "dist/internal/wire.h"

#include <string.h>

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

rt_status rt_store_frame_parse(const uint8_t *buf, size_t len, rt_store_frame *out, size_t *consumed) {
    *consumed = 0;
    if (len < 4) {
        if (len > 0 && memcmp(buf, "\x52\x54\x53\x31", len) != 0)
            return RT_ERROR(RT_ERR_FORMAT, "store frame: bad magic (not a ringtrain store peer)");
        return RT_OK;
    }
    uint32_t magic = get32(buf);
    if (magic != RT_STORE_MAGIC)
        return RT_ERROR(RT_ERR_FORMAT, "store frame: bad magic 0x%08x at offset 0 (expected 0x%08x)", magic,
                        RT_STORE_MAGIC);
    if (len < RT_STORE_HDR) return RT_OK;
    uint8_t op = buf[4], st = buf[5];
    uint16_t keylen = get16(buf + 6);
    uint32_t vallen = get32(buf + 8);
    if (op == 0 || op >= RT_STORE_OP_MAX_) return RT_ERROR(RT_ERR_FORMAT, "store frame: unknown op %u at offset 4", op);
    if (keylen > RT_STORE_MAX_KEY)
        return RT_ERROR(RT_ERR_FORMAT, "store frame: key length %u at offset 6 over the limit %u", keylen,
                        RT_STORE_MAX_KEY);
    if (vallen > RT_STORE_MAX_VALUE)
        return RT_ERROR(RT_ERR_FORMAT, "store frame: value length %u at offset 8 over the limit %u", vallen,
                        RT_STORE_MAX_VALUE);
    size_t total = RT_STORE_HDR + (size_t)keylen + vallen;
    if (len < total) return RT_OK;
    out->op = op;
    out->status = st;
    out->keylen = keylen;
    out->vallen = vallen;
    out->key = buf + RT_STORE_HDR;
    out->value = buf + RT_STORE_HDR + keylen;
    *consumed = total;
    return RT_OK;
}

rt_status rt_store_header_parse(const uint8_t *hdr, rt_store_frame *out) {
    rt_store_frame f;
    size_t used = 0;
    /* parse as if the body were present: only the header's checks can fail */
    uint8_t tmp[RT_STORE_HDR];
    memcpy(tmp, hdr, RT_STORE_HDR);
    memset(tmp + 6, 0, 6);
    RT_CHECK(rt_store_frame_parse(tmp, RT_STORE_HDR, &f, &used));
    out->op = hdr[4];
    out->status = hdr[5];
    out->keylen = get16(hdr + 6);
    out->vallen = get32(hdr + 8);
    if (out->keylen > RT_STORE_MAX_KEY || out->vallen > RT_STORE_MAX_VALUE)
        return RT_ERROR(RT_ERR_FORMAT, "store frame: key %u / value %u bytes over the limits", out->keylen,
                        out->vallen);
    out->key = out->value = NULL;
    return RT_OK;
}

size_t rt_store_frame_encode(uint8_t *out, size_t cap, uint8_t op, uint8_t status, const void *key, size_t keylen,
                             const void *value, size_t vallen) {
    if (keylen > RT_STORE_MAX_KEY || vallen > RT_STORE_MAX_VALUE) return 0;
    size_t total = RT_STORE_HDR + keylen + vallen;
    if (total > cap) return 0;
    put32(out, RT_STORE_MAGIC);
    out[4] = op;
    out[5] = status;
    put16(out + 6, (uint16_t)keylen);
    put32(out + 8, (uint32_t)vallen);
    if (keylen) memcpy(out + RT_STORE_HDR, key, keylen);
    if (vallen) memcpy(out + RT_STORE_HDR + keylen, value, vallen);
    return total;
}

void rt_store_hello_encode(uint8_t out[RT_STORE_HELLO_BYTES], const rt_store_hello *h) {
    memcpy(out, h->nonce, RT_AUTH_NONCE);
    put32(out + RT_AUTH_NONCE, (uint32_t)h->rank);
    put32(out + RT_AUTH_NONCE + 4, (uint32_t)h->world);
    memcpy(out + RT_AUTH_NONCE + 8, h->mac, RT_AUTH_MAC);
}

rt_status rt_store_hello_parse(const uint8_t *buf, size_t len, rt_store_hello *out) {
    if (len != RT_STORE_HELLO_BYTES)
        return RT_ERROR(RT_ERR_FORMAT, "store hello: %zu bytes, expected %d", len, RT_STORE_HELLO_BYTES);
    memcpy(out->nonce, buf, RT_AUTH_NONCE);
    out->rank = (int32_t)get32(buf + RT_AUTH_NONCE);
    out->world = (int32_t)get32(buf + RT_AUTH_NONCE + 4);
    memcpy(out->mac, buf + RT_AUTH_NONCE + 8, RT_AUTH_MAC);
    if (out->world <= 0 || out->world > (1 << 20) || out->rank < -1 || out->rank >= out->world)
        return RT_ERROR(RT_ERR_FORMAT, "store hello: rank %d / world size %d out of range", (int)out->rank,
                        (int)out->world);
    return RT_OK;
}

void rt_hello_encode(uint8_t out[RT_HELLO_BYTES], const rt_hello *h) {
    put32(out, RT_HELLO_MAGIC);
    put32(out + 4, h->step);
    put32(out + 8, (uint32_t)h->rank);
    put32(out + 12, (uint32_t)h->world);
    memcpy(out + 16, h->nonce, RT_AUTH_NONCE);
    memcpy(out + 16 + RT_AUTH_NONCE, h->mac, RT_AUTH_MAC);
}

rt_status rt_hello_parse(const uint8_t *buf, size_t len, rt_hello *out) {
    if (len != RT_HELLO_BYTES) return RT_ERROR(RT_ERR_FORMAT, "hello: %zu bytes, expected %d", len, RT_HELLO_BYTES);
    if (get32(buf) != RT_HELLO_MAGIC)
        return RT_ERROR(RT_ERR_FORMAT, "hello: bad magic 0x%08x at offset 0 (not a ringtrain peer)", get32(buf));
    uint32_t step = get32(buf + 4);
    if (step == 0 || step >= RT_HELLO_STEP_MAX_)
        return RT_ERROR(RT_ERR_FORMAT, "hello: unknown step %u at offset 4", step);
    out->step = (uint8_t)step;
    out->rank = (int32_t)get32(buf + 8);
    out->world = (int32_t)get32(buf + 12);
    memcpy(out->nonce, buf + 16, RT_AUTH_NONCE);
    memcpy(out->mac, buf + 16 + RT_AUTH_NONCE, RT_AUTH_MAC);
    if (out->world <= 0 || out->world > (1 << 20) || out->rank < 0 || out->rank >= out->world)
        return RT_ERROR(RT_ERR_FORMAT, "hello: rank %d / world size %d out of range", (int)out->rank, (int)out->world);
    return RT_OK;
}

void rt_msg_hdr_encode(uint8_t out[RT_MSG_HDR], const rt_msg_hdr *h) {
    put32(out, RT_MSG_MAGIC);
    put16(out + 4, h->kind);
    put16(out + 6, h->group);
    put32(out + 8, h->seq);
    put64(out + 12, h->nbytes);
    put32(out + 20, 0);
}

rt_status rt_msg_hdr_parse(const uint8_t *buf, size_t len, rt_msg_hdr *out) {
    if (len != RT_MSG_HDR) return RT_ERROR(RT_ERR_FORMAT, "message header: %zu bytes, expected %d", len, RT_MSG_HDR);
    if (get32(buf) != RT_MSG_MAGIC)
        return RT_ERROR(RT_ERR_FORMAT, "message header: bad magic 0x%08x (stream out of sync)", get32(buf));
    out->kind = get16(buf + 4);
    out->group = get16(buf + 6);
    out->seq = get32(buf + 8);
    out->nbytes = get64(buf + 12);
    if (out->nbytes > RT_MSG_MAX_BYTES)
        return RT_ERROR(RT_ERR_FORMAT, "message header: %llu bytes at offset 12 over the limit %llu",
                        (unsigned long long)out->nbytes, (unsigned long long)RT_MSG_MAX_BYTES);
    return RT_OK;
}
