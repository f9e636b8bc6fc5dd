/* safetensors files with holes and header lengths at the boundary. The tensors must
 * cover the data bytes exactly, in order: a gap between two tensors or before the first
 * is a malformed file (a reader that allowed one would accept files whose bytes no
 * tensor owns), and so is a tensor whose range is larger than dtype x shape. The header
 * length may be at most size - 8 (the whole rest of the file); one byte more is refused
 * before any JSON is read ("beyond the end"). Each buffer is allocated at its exact
 * size, so a read past it shows under AddressSanitizer. Kept apart from
 * test_safetensors.c and asserting only the status where the wording is the parser's
 * own, so it holds for any parser behind rt_safetensors_parse. */
#include "test_util.h"

#include "core/safetensors.h"

#include <stdlib.h>
#include <string.h>

/* 8-byte little-endian header length `hlen` + json + dlen data bytes (1, 2, 3, ...) */
static unsigned char *make(uint64_t hlen, const char *json, size_t dlen, size_t *len) {
    size_t h = strlen(json);
    *len = 8 + h + dlen;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, json, h);
    for (size_t i = 0; i < dlen; i++) b[8 + h + i] = (unsigned char)(i + 1);
    return b;
}

static rt_status parse(const char *json, size_t dlen, long hlen_delta, rt_safetensors **st) {
    size_t len;
    unsigned char *b = make((uint64_t)((long)strlen(json) + hlen_delta), json, dlen, &len);
    *st = NULL;
    rt_status s = rt_safetensors_parse(b, len, "holes.safetensors", st);
    free(b);
    return s;
}

static void expect_refused(const char *json, size_t dlen, const char *why) {
    rt_safetensors *st = NULL;
    rt_status s = parse(json, dlen, 0, &st);
    if (s != RT_ERR_FORMAT) fail_msg("%s: accepted (status %s): %s", why, rt_status_name(s), json);
    assert_null(st);
}

static void test_gaps(void **state) {
    (void)state;
    /* the well-formed neighbours of the files below are accepted */
    rt_safetensors *st = NULL;
    assert_rt_ok(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       8, 0, &st));
    assert_int_equal(st->n, 2);
    rt_safetensors_free(st);
    assert_rt_ok(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, 0, &st));
    rt_safetensors_free(st);
    /* a gap of 4 bytes between two tensors (the data size matches the last end) */
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                   12, "gap between two tensors");
    /* the same with the tensors listed in the other order */
    expect_refused("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   12, "gap between two tensors");
    /* a gap before the first tensor */
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, "gap before the first tensor");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                   4, "gap of one byte before the first tensor");
    /* a hole inside a tensor: its data_offsets hold more bytes than dtype x shape */
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                   "tensor range larger than its shape");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,3]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}",
                   4, "tensor range larger than its shape");
    /* a gap of one byte between two tensors */
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                   4, "gap of one byte between two tensors");
}

static void test_header_length_bounds(void **state) {
    (void)state;
    rt_safetensors *st = NULL;
    /* exactly size - 8: the header runs to the end of the file (no data bytes) */
    assert_rt_ok(parse("{}", 0, 0, &st));
    assert_int_equal(st->n, 0);
    rt_safetensors_free(st);
    assert_rt_ok(parse("{\"__metadata__\":{\"format\":\"pt\"}}  ", 0, 0, &st));
    rt_safetensors_free(st);
    assert_rt_ok(parse("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0, &st));
    assert_int_equal(st->n, 1);
    rt_safetensors_free(st);
    /* size - 7: one byte beyond the end, refused before the JSON is read */
    static const char *const jsons[] = {"{}", "{} ", "{\"__metadata__\":{\"format\":\"pt\"}}",
                                        "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(parse(jsons[i], 0, 1, &st), RT_ERR_FORMAT);
        assert_null(st);
        if (!strstr(rt_error_message(), "beyond the end"))
            fail_msg("header length size - 7 for %s: %s", jsons[i], rt_error_message());
    }
    /* and with data bytes after the header: the length may not reach into them by more
     * than the file holds */
    assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 3, &st),
                     RT_ERR_FORMAT);
    assert_null(st);
    if (!strstr(rt_error_message(), "beyond the end")) fail_msg("size - 7 with data: %s", rt_error_message());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gaps),
        cmocka_unit_test(test_header_length_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
