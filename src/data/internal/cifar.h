/* CIFAR-10 and CIFAR-100 binary files over memory buffers.
 *
 * A file is a sequence of records: the label bytes, then a 32x32 colour image as 1024
 * red, 1024 green and 1024 blue bytes, i.e. already CHW.
 * - CIFAR-10 (data_batch_1..5.bin, test_batch.bin): one label byte (0..9), 3073-byte
 *   records; the official batches hold 10000 records each.
 * - CIFAR-100 (train.bin, test.bin): the coarse label (0..19, the superclass) then the
 *   fine label (0..99), 3074-byte records; the official files hold 50000 and 10000.
 * Any whole number of records is accepted. Every label byte of every record is checked,
 * whichever label the dataset keeps (a fine label of 100 is an error even when the
 * coarse labels are read).
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
#define RT_CIFAR_RECORD (1 + RT_CIFAR_IMAGE)    /* CIFAR-10 */
#define RT_CIFAR100_RECORD (2 + RT_CIFAR_IMAGE) /* CIFAR-100 */
#define RT_CIFAR_CLASSES 10
#define RT_CIFAR100_COARSE 20
#define RT_CIFAR100_FINE 100

/* The record layout of one format and the label byte a dataset keeps. */
typedef struct rt_cifar_format {
    const char *name;           /* "CIFAR-10" | "CIFAR-100", in messages */
    int labels;                 /* label bytes before the pixels: 1 | 2 */
    int classes[2];             /* label byte i holds 0..classes[i]-1 */
    const char *label_names[2]; /* what label byte i is called in messages */
    int keep;                   /* the label byte the dataset keeps */
} rt_cifar_format;

/* CIFAR-10; CIFAR-100 keeping the fine (100 classes) or the coarse (20) label. */
extern const rt_cifar_format rt_cifar10_format, rt_cifar100_fine_format, rt_cifar100_coarse_format;

static inline size_t rt_cifar_record(const rt_cifar_format *f) { return (size_t)f->labels + RT_CIFAR_IMAGE; }

/* Validate a file's buffer (whole records, every label byte in range) and count its
 * records; errors name `name`, the record and the label. */
rt_status rt_cifar_count(const uint8_t *buf, size_t len, const char *name, const rt_cifar_format *f, int64_t *n);

/* The size rule of a file for rt_bytes_read_maybe_gz: a raw file that is not a whole
 * number of records is refused before it is read (f must outlive the read). */
rt_bytes_rule rt_cifar_rule(const rt_cifar_format *f);

/* Split a validated buffer into images (n, 3, 32, 32) and the kept labels (n). */
void rt_cifar_unpack(const uint8_t *buf, int64_t n, const rt_cifar_format *f, uint8_t *images, uint8_t *labels);

#ifdef __cplusplus
}
#endif

#endif
