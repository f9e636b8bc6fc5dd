/* CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin) over memory buffers.
 *
 * A batch is a sequence of 3073-byte records: one label byte (0..9) then a 32x32 colour
 * image as 1024 red, 1024 green and 1024 blue bytes, i.e. already CHW. The official
 * batches hold 10000 records each; any whole number of records is accepted.
 */
#ifndef RT_DATA_CIFAR_H
#define RT_DATA_CIFAR_H

#include "core/status.h"
#include "data/internal/bytes.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_CIFAR_C 3
#define RT_CIFAR_H 32
#define RT_CIFAR_W 32
#define RT_CIFAR_IMAGE (RT_CIFAR_C * RT_CIFAR_H * RT_CIFAR_W)
#define RT_CIFAR_RECORD (1 + RT_CIFAR_IMAGE)
#define RT_CIFAR_CLASSES 10

/* Validate a batch buffer (whole records, labels < num_classes) and count its records. */
rt_status rt_cifar_count(const uint8_t *buf, size_t len, const char *name, int num_classes, int64_t *n);

/* The size rule of a batch file for rt_bytes_read_maybe_gz: a raw file that is not a
 * whole number of records is refused before it is read. */
rt_bytes_rule rt_cifar_rule(void);

/* Split a validated batch into images (n, 3, 32, 32) and labels (n). */
void rt_cifar_unpack(const uint8_t *buf, int64_t n, uint8_t *images, uint8_t *labels);

#ifdef __cplusplus
}
#endif

#endif
