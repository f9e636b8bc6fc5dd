/* Datasets in memory: MNIST, Fashion-MNIST (IDX, raw or gzip), CIFAR-10 and CIFAR-100
 * (binary).
 *
 * A dataset is one split ("train" or "test") of images kept as uint8 NCHW plus one
 * uint8 label per image, with the per-channel mean/std used to normalise it. It is
 * loaded whole and validated whole: a malformed file is an error naming the file and
 * what was wrong, never a partial dataset. The default is Fashion-MNIST from Debian's
 * dataset-fashion-mnist package (RT_DATASET_DEFAULT_PATH); `data.path` points anywhere
 * else. See docs/data.md and datasets/README.md.
 */
#ifndef RT_DATA_DATASET_H
#define RT_DATA_DATASET_H

#include "core/names.h"
#include "core/status.h"
#include "core/info.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_DATASET_DEFAULT_PATH "/usr/share/datasets/fashion-mnist"
#define RT_DATASET_MAX_C 3
/* Largest inflated IDX file accepted (the MNIST training images are 47 MB). */
#define RT_DATASET_MAX_FILE ((size_t)1 << 32)

typedef enum rt_dataset_kind {
    RT_DATASET_AUTO = 0, /* detect from the files: IDX files, CIFAR-10 or CIFAR-100 */
    RT_DATASET_MNIST,
    RT_DATASET_FASHION_MNIST,
    RT_DATASET_CIFAR10,
    RT_DATASET_CIFAR100,
    RT_DATASET_SYNTHETIC, /* built in memory (tests, benchmarks) */
    RT_DATASET_KIND_COUNT_
} rt_dataset_kind;

/* Which label a sample gets (config data.label): the dataset's own (fine), or CIFAR-100's
 * coarse label (its 20 superclasses); coarse for any other kind is an error. */
typedef enum rt_dataset_label {
    RT_DATASET_LABEL_FINE = 0, /* the only label of MNIST, Fashion-MNIST and CIFAR-10 */
    RT_DATASET_LABEL_COARSE,   /* CIFAR-100's superclass, 0..19 */
    RT_DATASET_LABEL_COUNT_
} rt_dataset_label;

typedef struct rt_dataset {
    rt_dataset_kind kind;
    char name[32];   /* "fashion-mnist", "mnist", "cifar10", "cifar100", ... */
    char format[32]; /* "idx (gzip)", "idx", "cifar10-binary", "cifar100-binary (fine)", "memory" */
    char split[8];   /* "train" | "test" */
    char path[1024]; /* the folder it was loaded from */
    int64_t n;       /* number of samples */
    int c, h, w;     /* image shape */
    int num_classes;
    const uint8_t *images;                               /* (n, c, h, w) */
    const uint8_t *labels;                               /* (n), each < num_classes */
    float mean[RT_DATASET_MAX_C], std[RT_DATASET_MAX_C]; /* per channel, of pixel/255 */
    bool hflip_suits;                                    /* horizontal flips keep the class (not for digits) */
    int crop_pad;                                        /* default padding of the random crop */
    void *owned_[2];                                     /* private: the buffers images/labels point into */
} rt_dataset;

/* The formats a user may name (core/names.h, one row each in dataset.c's kind table):
 * "auto" | "mnist" | "fashion-mnist" | "cifar10" | "cifar100", also spelt "fashion_mnist",
 * "fashionmnist", "cifar-10", "cifar-100". */
extern const rt_names rt_dataset_kind_names;

/* "fine" | "coarse" (rt_dataset_label). */
extern const rt_names rt_dataset_label_names;

/* rt_names_parse of rt_dataset_kind_names. */
rt_status rt_dataset_kind_parse(const char *text, rt_dataset_kind *out);
const char *rt_dataset_kind_name(rt_dataset_kind kind);

/* Load split "train" or "test" of the dataset in folder `path` (NULL: the default).
 * IDX: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (gzip detected by content);
 * CIFAR-10: data_batch_1..5.bin / test_batch.bin in `path` or path/cifar-10-batches-bin;
 * CIFAR-100: train.bin / test.bin in `path` or path/cifar-100-binary.
 * With RT_DATASET_AUTO, IDX data is "fashion-mnist" when the path names it, else "mnist";
 * a folder with both CIFAR-10 and CIFAR-100 files is an error (set the kind).
 * rt_dataset_load keeps the fine labels; rt_dataset_load_label takes the label to keep
 * (num_classes 100 or 20 for CIFAR-100). */
rt_status rt_dataset_load(const char *path, const char *split, rt_dataset_kind kind, rt_dataset *ds);
rt_status rt_dataset_load_label(const char *path, const char *split, rt_dataset_kind kind, rt_dataset_label label,
                                rt_dataset *ds);

/* An empty dataset of n images (c, h, w) owning zeroed buffers the caller fills
 * (images/labels may be cast to non-const); mean 0.5, std 0.25 until set. */
rt_status rt_dataset_alloc(rt_dataset *ds, const char *name, int64_t n, int c, int h, int w, int num_classes);

void rt_dataset_free(rt_dataset *ds);

/* The subsequence of train.seed the validation split draws from (the sampler's and the
 * augmentation's are others). */
#define RT_DATASET_SPLIT_SUBSEQ 0x76616c73u /* "vals" */

/* data.val_split: n_val samples of ds held out. The held-out ones are the last n_val of a
 * permutation of 0..n-1 drawn from `seed` alone (Fisher-Yates with Philox), so every rank
 * and every world size holds out the same ones; `val` gets them and `train` the others,
 * each in ds's order, as copies (ds is left as it was). held_out (n_val entries, may be
 * NULL): the indices of ds held out, ascending. 1 <= n_val < ds->n, else RT_ERR_INVALID
 * naming data.val_split. */
rt_status rt_dataset_split(const rt_dataset *ds, int64_t n_val, uint64_t seed, rt_dataset *train, rt_dataset *val,
                           int64_t *held_out);

/* Pixel mean/std per channel (of pixel/255) over the whole split, and the class
 * histogram (counts has num_classes entries). */
void rt_dataset_pixel_stats(const rt_dataset *ds, double mean[RT_DATASET_MAX_C], double std[RT_DATASET_MAX_C]);
void rt_dataset_histogram(const rt_dataset *ds, int64_t *counts);

static inline size_t rt_dataset_image_bytes(const rt_dataset *ds) { return (size_t)ds->c * ds->h * ds->w; }

/* The libraries src/data links (zlib), for `ringtrain info` (core/info.h). */
int rt_data_lib_versions(rt_lib_version *out, int cap);

#ifdef __cplusplus
}
#endif

#endif
