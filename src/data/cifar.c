/* CIFAR-10 binary batches; see cifar.h. */
#include "data/internal/cifar.h"

#include <string.h>

static rt_status check_length(const char *name, size_t len) {
    if (len == 0) RT_FAIL(RT_ERR_FORMAT, "%s: empty file: expected 3073-byte CIFAR-10 records", name);
    if (len % RT_CIFAR_RECORD != 0) {
        size_t whole = len / RT_CIFAR_RECORD;
        RT_FAIL(RT_ERR_FORMAT,
                "%s: truncated data: %zu bytes is not a whole number of %d-byte records (expected %zu bytes for %zu "
                "records, the last has %zu bytes)",
                name, len, RT_CIFAR_RECORD, (whole + 1) * RT_CIFAR_RECORD, whole + 1, len % RT_CIFAR_RECORD);
    }
    return RT_OK;
}

rt_status rt_cifar_count(const uint8_t *buf, size_t len, const char *name, int num_classes, int64_t *n) {
    *n = 0;
    RT_CHECK(check_length(name, len));
    size_t count = len / RT_CIFAR_RECORD;
    for (size_t i = 0; i < count; i++) {
        uint8_t label = buf[i * RT_CIFAR_RECORD];
        if (label >= num_classes)
            RT_FAIL(RT_ERR_FORMAT, "%s: label out of range: record %zu (byte offset %zu) has label %u, expected 0..%d",
                    name, i, i * RT_CIFAR_RECORD, label, num_classes - 1);
    }
    *n = (int64_t)count;
    return RT_OK;
}

void rt_cifar_unpack(const uint8_t *buf, int64_t n, uint8_t *images, uint8_t *labels) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *rec = buf + (size_t)i * RT_CIFAR_RECORD;
        labels[i] = rec[0];
        memcpy(images + (size_t)i * RT_CIFAR_IMAGE, rec + 1, RT_CIFAR_IMAGE);
    }
}

/* no header: a raw file must hold whole records (checked before it is read); gzip data
 * declares no size, so only the reader's limit bounds it */
static rt_status cifar_size(const uint8_t *head, size_t head_len, size_t total, const char *name, const void *arg,
                            size_t *expected) {
    *expected = total;
    if (total != RT_BYTES_SIZE_UNKNOWN) RT_CHECK(check_length(name, total));
    return RT_OK;
}

rt_bytes_rule rt_cifar_rule(void) { return (rt_bytes_rule){.head = 0, .size = cifar_size, .arg = NULL}; }
