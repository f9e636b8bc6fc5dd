/* safetensors: round trip, a file written by hand the way PyTorch's library writes it,
 * and malformed files, each rejected with an error that says what is wrong. */
#include "test_util.h"

#include "core/safetensors.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

/* header JSON + data bytes -> a buffer in safetensors layout */
static unsigned char *make(const char *json, const void *data, size_t dlen, size_t *len) {
    size_t h = strlen(json);
    *len = 8 + h + dlen;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    return b;
}

static void expect_bad(const char *json, size_t dlen, const char *needle) {
    unsigned char data[64] = {0};
    size_t len;
    unsigned char *b = make(json, data, dlen, &len);
    rt_safetensors *st = NULL;
    rt_status s = rt_safetensors_parse(b, len, "bad.safetensors", &st);
    if (s != RT_ERR_FORMAT) fail_msg("accepted %s (status %s)", json, rt_status_name(s));
    if (!strstr(rt_error_message(), needle)) fail_msg("error for %s lacks '%s': %s", json, needle, rt_error_message());
    if (!strstr(rt_error_message(), "bad.safetensors"))
        fail_msg("error does not name the file: %s", rt_error_message());
    assert_null(st);
    free(b);
}

static void test_roundtrip(void **state) {
    (void)state;
    char dir[] = "/tmp/rt_st_XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float w[6] = {1, 2, 3, 4, 5, -6.5f};
    int64_t step = 42;
    uint8_t bytes[3] = {7, 8, 9};
    rt_st_writer *wr;
    assert_rt_ok(rt_st_writer_create(&wr));
    assert_rt_ok(rt_st_writer_add(wr, "layer.weight", RT_F32, 2, (int64_t[]){2, 3}, w));
    assert_rt_ok(rt_st_writer_add(wr, "a \"quoted\\\" name", RT_I64, 0, NULL, &step));
    assert_rt_ok(rt_st_writer_add(wr, "bytes", RT_U8, 1, (int64_t[]){3}, bytes));
    assert_rt_ok(rt_st_writer_add(wr, "empty", RT_F32, 2, (int64_t[]){0, 4}, NULL));
    assert_int_equal(rt_st_writer_add(wr, "bytes", RT_U8, 1, (int64_t[]){3}, bytes), RT_ERR_INVALID);
    assert_rt_ok(rt_st_writer_meta(wr, "format", "pt"));
    assert_rt_ok(rt_st_writer_meta(wr, "note", "line\nbreak \"q\""));
    assert_rt_ok(rt_st_writer_write(wr, path));
    rt_st_writer_free(wr);
    assert_int_equal(access(strcat(strcpy((char[160]){0}, path), ".tmp"), F_OK), -1); /* renamed away */

    rt_safetensors *st = NULL;
    assert_rt_ok(rt_safetensors_read(path, &st));
    assert_int_equal(st->n, 4);
    float got[6];
    assert_rt_ok(rt_safetensors_get(st, "layer.weight", RT_F32, 2, (int64_t[]){2, 3}, got));
    assert_memory_equal(got, w, sizeof w);
    int64_t s2 = 0;
    assert_rt_ok(rt_safetensors_get(st, "a \"quoted\\\" name", RT_I64, 0, NULL, &s2));
    assert_int_equal(s2, 42);
    const rt_st_tensor *t = rt_safetensors_find(st, "bytes");
    assert_non_null(t);
    assert_int_equal(t->dtype, RT_U8);
    assert_memory_equal(t->data, bytes, 3);
    assert_non_null(rt_safetensors_find(st, "empty"));
    assert_null(rt_safetensors_find(st, "missing"));
    assert_string_equal(rt_safetensors_meta(st, "format"), "pt");
    assert_string_equal(rt_safetensors_meta(st, "note"), "line\nbreak \"q\"");
    assert_null(rt_safetensors_meta(st, "other"));
    /* the data section starts 8-byte aligned, as the reference writer pads it */
    uint64_t h = 0;
    memcpy(&h, st->bytes, 8);
    assert_int_equal(h % 8, 0);
    /* dtype and shape checks on get, naming file and tensor */
    assert_int_equal(rt_safetensors_get(st, "layer.weight", RT_F64, 2, (int64_t[]){2, 3}, got), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "dtype F32, expected F64"));
    assert_int_equal(rt_safetensors_get(st, "layer.weight", RT_F32, 2, (int64_t[]){3, 2}, got), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "shape [2, 3], expected [3, 2]"));
    assert_non_null(strstr(rt_error_message(), "a.safetensors"));
    assert_int_equal(rt_safetensors_get(st, "nope", RT_F32, 0, NULL, got), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "'nope' is missing"));
    rt_safetensors_free(st);
    unlink(path);
    assert_int_equal(rt_safetensors_read(path, &st), RT_ERR_IO);
    rmdir(dir);
}

/* what safetensors.torch.save_file writes: metadata first, spaces, unicode escapes */
static void test_foreign(void **state) {
    (void)state;
    float v[2] = {0.5f, -1};
    size_t len;
    unsigned char *b = make("{\"__metadata__\":{\"format\":\"pt\"},\"w\\u00e9\": {\"dtype\":\"F32\", \"shape\":[2], "
                            "\"data_offsets\":[0,8]}}   ",
                            v, 8, &len);
    rt_safetensors *st = NULL;
    assert_rt_ok(rt_safetensors_parse(b, len, "x", &st));
    float got[2];
    assert_rt_ok(rt_safetensors_get(st, "w\xc3\xa9", RT_F32, 1, (int64_t[]){2}, got));
    assert_memory_equal(got, v, 8);
    rt_safetensors_free(st);
    free(b);
    b = make("{}", NULL, 0, &len);
    assert_rt_ok(rt_safetensors_parse(b, len, "x", &st));
    assert_int_equal(st->n, 0);
    rt_safetensors_free(st);
    free(b);
}

static void test_malformed(void **state) {
    (void)state;
    rt_safetensors *st = NULL;
    /* header length */
    unsigned char short_file[5] = {1, 2, 3, 4, 5};
    assert_int_equal(rt_safetensors_parse(short_file, 5, "bad.safetensors", &st), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "too short"));
    unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    assert_int_equal(rt_safetensors_parse(huge, 16, "bad.safetensors", &st), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "beyond the end of the file"));
    /* JSON errors */
    expect_bad("[1,2]", 0, "must be an object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
               "header JSON at byte 61 (line 1, column 53): '}' expected near end of file");
    expect_bad("{\"a\" {}}", 0, "':' expected");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, "string or '}' expected");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "fraction");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
               "too big integer");
    expect_bad("{\"a\\q\":{}}", 0, "invalid escape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
               "end of file expected near 'x'");
    expect_bad("{\"unterminated", 0, "premature end of input");
    /* schema */
    expect_bad("{\"a\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2, "BF16");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, "lacks data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unexpected field \"x\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "duplicate object key");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2,3,4,5,6,7,8,9],\"data_offsets\":[0,4]}}", 4, "more than 8");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "must be strings");
    /* offsets */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "begin > end");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "beyond the 8 data bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
               8, "contiguous and not overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 data bytes");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, "duplicate object key near '\"a\"'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, "overflows");
}

/* header bytes (explicit length: NULs allowed) + dlen zero data bytes */
static rt_status parse_n(const char *json, size_t jl, size_t dlen, rt_safetensors **st) {
    unsigned char *b = calloc(1, 8 + jl + dlen);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(b + 8, json, jl);
    rt_status s = rt_safetensors_parse(b, 8 + jl + dlen, "ref.safetensors", st);
    free(b);
    return s;
}
#define PARSE(lit, dlen, st) parse_n((lit), sizeof(lit) - 1, (dlen), (st))
#define EXPECT_BAD_N(lit, dlen, needle)                                                                                \
    do {                                                                                                               \
        rt_safetensors *st_ = NULL;                                                                                    \
        if (PARSE(lit, dlen, &st_) != RT_ERR_FORMAT) fail_msg("accepted %s", #lit);                                    \
        if (!strstr(rt_error_message(), (needle)))                                                                     \
            fail_msg("error for %s lacks '%s': %s", #lit, (needle), rt_error_message());                               \
        if (!strstr(rt_error_message(), "ref.safetensors")) fail_msg("no file name: %s", rt_error_message());          \
        assert_null(st_);                                                                                              \
    } while (0)

/* The rules of the reference implementation (issue 14, item 5). */
static void test_reference_rules(void **state) {
    (void)state;
    rt_safetensors *st = NULL;
    /* escaped surrogate pairs are one code point (U+1F600), in UTF-8 */
    assert_rt_ok(PARSE("{\"\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &st));
    assert_int_equal(st->n, 1);
    assert_string_equal(st->tensors[0].name, "\xf0\x9f\x98\x80");
    assert_non_null(rt_safetensors_find(st, "\xf0\x9f\x98\x80"));
    rt_safetensors_free(st);
    /* ... a lone surrogate is not */
    EXPECT_BAD_N("{\"\\ud83d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "invalid Unicode");
    /* names are valid UTF-8 and not empty */
    EXPECT_BAD_N("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 "unable to decode byte 0xff");
    EXPECT_BAD_N("{\"\xc3\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unable to decode byte 0xc3");
    EXPECT_BAD_N("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "empty name");
    EXPECT_BAD_N("{\"\\u0000\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "NUL byte");
    /* duplicate keys anywhere: tensors, fields, metadata */
    EXPECT_BAD_N("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "duplicate object key near '\"k\"'");
    EXPECT_BAD_N("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate object key");
    EXPECT_BAD_N("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 "duplicate object key");
    /* __metadata__ is a string -> string map */
    EXPECT_BAD_N("{\"__metadata__\":[\"k\"]}", 0, "string -> string map");
    EXPECT_BAD_N("{\"__metadata__\":{\"k\":{}}}", 0, "must be strings");
    /* NUL and control characters in errors are printed escaped, never raw */
    EXPECT_BAD_N("{\"\\u0001x\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor '\\x01x'");
    EXPECT_BAD_N("{\"a\x01\":{}}", 0, "is \\x01");
    EXPECT_BAD_N("{\"a\":{}}\x00", 0, "is \\x00");
    EXPECT_BAD_N("{\"a\x00\":{}}", 0, "is \\x00");
    if (strchr(rt_error_message(), '\x01')) fail_msg("a raw control character in: %s", rt_error_message());
    /* offsets contiguous from 0: a gap at the start */
    EXPECT_BAD_N("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "begin 1, expected 0");
    /* the header length: exactly size - 8 is accepted, size - 7 is beyond the end */
    unsigned char b[10] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_rt_ok(rt_safetensors_parse(b, sizeof b, "ref.safetensors", &st));
    rt_safetensors_free(st);
    b[0] = 3;
    assert_int_equal(rt_safetensors_parse(b, sizeof b, "ref.safetensors", &st), RT_ERR_FORMAT);
    assert_non_null(strstr(rt_error_message(), "header length 3 is beyond the end of the file (10 bytes)"));
}

/* Reading a path that is not a regular file never blocks and names what it is. */
static void test_read_not_regular(void **state) {
    (void)state;
    alarm(60); /* a blocking open of the FIFO fails here instead of hanging */
    char dir[] = "/tmp/rt_st_XXXXXX", p[128];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    rt_safetensors *st = NULL;
    assert_int_equal(rt_safetensors_read(p, &st), RT_ERR_IO);
    if (!strstr(rt_error_message(), "model.safetensors is a FIFO (named pipe)")) fail_msg("%s", rt_error_message());
    assert_int_equal(rt_safetensors_read(dir, &st), RT_ERR_IO);
    if (!strstr(rt_error_message(), "is a directory")) fail_msg("%s", rt_error_message());
    assert_int_equal(rt_safetensors_read("/dev/zero", &st), RT_ERR_IO);
    if (!strstr(rt_error_message(), "/dev/zero is a device")) fail_msg("%s", rt_error_message());
    unlink(p);
    /* a header length past the end is refused before the file is read */
    FILE *f = fopen(p, "wb");
    unsigned char hl[8] = {0xff, 0xff, 0xff, 0, 0, 0, 0, 0};
    fwrite(hl, 1, 8, f);
    fputs("{}", f);
    fclose(f);
    assert_int_equal(rt_safetensors_read(p, &st), RT_ERR_FORMAT);
    if (!strstr(rt_error_message(), "beyond the end of the file")) fail_msg("%s", rt_error_message());
    unlink(p);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),        cmocka_unit_test(test_foreign),
        cmocka_unit_test(test_malformed),        cmocka_unit_test(test_reference_rules),
        cmocka_unit_test(test_read_not_regular),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
