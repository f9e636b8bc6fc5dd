/* CIFAR-10 and CIFAR-100 binary records; see cifar.h. */
#include "data/internal/cifar.h"

#include <string.h>

const rt_cifar_format rt_cifar10_format = {"CIFAR-10", 1, {RT_CIFAR_CLASSES, 0}, {"label", NULL}, 0};
const rt_cifar_format rt_cifar100_fine_format = {
    "CIFAR-100", 2, {RT_CIFAR100_COARSE, RT_CIFAR100_FINE}, {"coarse label", "fine label"}, 1};
const rt_cifar_format rt_cifar100_coarse_format = {
    "CIFAR-100", 2, {RT_CIFAR100_COARSE, RT_CIFAR100_FINE}, {"coarse label", "fine label"}, 0};

/* A size that is no whole number of this format's records but is one of the other's:
 * the other dataset's file under this one's name (say which kind to set). */
static const char *other_format_hint(const rt_cifar_format *f, size_t len) {
    if (f->labels == 1 && len % RT_CIFAR100_RECORD == 0)
        return " (it is a whole number of 3074-byte CIFAR-100 records: is it CIFAR-100? set data.kind: cifar100)";
    if (f->labels == 2 && len % RT_CIFAR_RECORD == 0)
        return " (it is a whole number of 3073-byte CIFAR-10 records: is it CIFAR-10? set data.kind: cifar10)";
    return "";
}

static rt_status check_length(const char *name, size_t len, const rt_cifar_format *f) {
    size_t rec = rt_cifar_record(f);
    if (len == 0) RT_FAIL(RT_ERR_FORMAT, "%s: empty file: expected %zu-byte %s records", name, rec, f->name);
    if (len % rec != 0) {
        size_t whole = len / rec;
        RT_FAIL(RT_ERR_FORMAT,
                "%s: truncated data: %zu bytes is not a whole number of %zu-byte records (expected %zu bytes for %zu "
                "%s records, the last has %zu bytes)%s",
                name, len, rec, (whole + 1) * rec, whole + 1, f->name, len % rec, other_format_hint(f, len));
    }
    return RT_OK;
}

rt_status rt_cifar_count(const uint8_t *buf, size_t len, const char *name, const rt_cifar_format *f, int64_t *n) {
    *n = 0;
    RT_CHECK(check_length(name, len, f));
    size_t rec = rt_cifar_record(f), count = len / rec;
    for (size_t i = 0; i < count; i++)
        for (int j = 0; j < f->labels; j++) {
            uint8_t label = buf[i * rec + (size_t)j];
            if (label >= f->classes[j])
                RT_FAIL(RT_ERR_FORMAT, "%s: %s out of range: record %zu (byte offset %zu) has %s %u, expected 0..%d",
                        name, f->label_names[j], i, i * rec + (size_t)j, f->label_names[j], label, f->classes[j] - 1);
        }
    *n = (int64_t)count;
    return RT_OK;
}

void rt_cifar_unpack(const uint8_t *buf, int64_t n, const rt_cifar_format *f, uint8_t *images, uint8_t *labels) {
    size_t rec = rt_cifar_record(f);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *r = buf + (size_t)i * rec;
        labels[i] = r[f->keep];
        memcpy(images + (size_t)i * RT_CIFAR_IMAGE, r + f->labels, RT_CIFAR_IMAGE);
    }
}

/* no header: a raw file must hold whole records (checked before it is read); gzip data
 * declares no size, so only the reader's limit bounds it */
static rt_status cifar_size(const uint8_t *head, size_t head_len, size_t total, const char *name, const void *arg,
                            size_t *expected) {
    (void)head, (void)head_len;
    *expected = total;
    if (total != RT_BYTES_SIZE_UNKNOWN) RT_CHECK(check_length(name, total, arg));
    return RT_OK;
}

rt_bytes_rule rt_cifar_rule(const rt_cifar_format *f) {
    return (rt_bytes_rule){.head = 0, .size = cifar_size, .arg = f};
}
