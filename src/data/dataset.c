/* Loading MNIST-format, CIFAR-10 and CIFAR-100 datasets into memory; see dataset.h. */
#include "data/dataset.h"

#include "core/device.h"
#include "core/names.h"
#include "core/rng.h"
#include "data/internal/bytes.h"
#include "data/internal/cifar.h"
#include "data/internal/idx.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define INSTALL_HINT                                                                                                   \
    "Fashion-MNIST: run scripts/install-deps (Debian package dataset-fashion-mnist, installed "                        \
    "at " RT_DATASET_DEFAULT_PATH                                                                                      \
    "); MNIST, CIFAR-10 or CIFAR-100: download it as datasets/README.md says and set data.path to "                    \
    "its folder"

/* Name, classes, normalisation constants and augmentation defaults of each kind, one row
 * each. */
static const struct kind_info {
    const char *name;
    bool parsable; /* accepted by rt_dataset_kind_parse (synthetic sets are built in memory) */
    int classes;   /* of the fine label */
    float mean[RT_DATASET_MAX_C], std[RT_DATASET_MAX_C];
    bool hflip_suits; /* horizontal flips keep the class */
    int crop_pad;
} k_kinds[RT_DATASET_KIND_COUNT_] = {
    [RT_DATASET_AUTO] = {"auto", true, 10, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}, false, 0},
    /* a mirrored digit is another symbol */
    [RT_DATASET_MNIST] = {"mnist", true, 10, {0.1307f}, {0.3081f}, false, 2},
    /* clothes and shoes face either way */
    [RT_DATASET_FASHION_MNIST] = {"fashion-mnist", true, 10, {0.2860f}, {0.3530f}, true, 2},
    [RT_DATASET_CIFAR10] = {"cifar10", true, 10, {0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}, true, 4},
    /* the training split's per-channel pixel mean and standard deviation (of pixel/255,
     * over all 50000 x 1024 pixels), as torchvision recipes normalise CIFAR-100 with them,
     * e.g. weiaicunzai/pytorch-cifar100, conf/global_settings.py: CIFAR100_TRAIN_MEAN =
     * (0.5070751592371323, 0.48654887331495095, 0.4409178433670343), CIFAR100_TRAIN_STD =
     * (0.2673342858792401, 0.2564384629170883, 0.27615047132568404); the same training
     * split, the same statistic as the CIFAR-10 row (whose std is the pixel std too) */
    [RT_DATASET_CIFAR100] = {"cifar100", true, 100, {0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}, true, 4},
    [RT_DATASET_SYNTHETIC] = {"synthetic", false, 10, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}, false, 0},
};

/* the names a user may write (synthetic data is made, never named) */
static const char *kind_name(int i) { return k_kinds[i].parsable ? k_kinds[i].name : NULL; }
static const rt_name_alias k_kind_aliases[] = {{"fashion_mnist", RT_DATASET_FASHION_MNIST},
                                               {"fashionmnist", RT_DATASET_FASHION_MNIST},
                                               {"cifar-10", RT_DATASET_CIFAR10},
                                               {"cifar-100", RT_DATASET_CIFAR100},
                                               {NULL, 0}};
const rt_names rt_dataset_kind_names = {"dataset kind", RT_DATASET_KIND_COUNT_, NULL, kind_name, k_kind_aliases};

static const char *const k_label_names[RT_DATASET_LABEL_COUNT_] = {
    [RT_DATASET_LABEL_FINE] = "fine", [RT_DATASET_LABEL_COARSE] = "coarse"};
const rt_names rt_dataset_label_names = {"dataset label", RT_DATASET_LABEL_COUNT_, k_label_names, NULL, NULL};

rt_status rt_dataset_kind_parse(const char *text, rt_dataset_kind *out) {
    int k = 0;
    rt_status st = rt_names_parse(&rt_dataset_kind_names, text, &k); /* a complete message: no trace line */
    if (st == RT_OK) *out = (rt_dataset_kind)k;
    return st;
}

const char *rt_dataset_kind_name(rt_dataset_kind kind) {
    return (unsigned)kind < RT_DATASET_KIND_COUNT_ ? k_kinds[kind].name : "?";
}

static void set_kind(rt_dataset *ds, rt_dataset_kind kind, rt_dataset_label label) {
    const struct kind_info *k = &k_kinds[(unsigned)kind < RT_DATASET_KIND_COUNT_ ? kind : RT_DATASET_SYNTHETIC];
    ds->kind = kind;
    snprintf(ds->name, sizeof ds->name, "%s", k->name);
    ds->num_classes = label == RT_DATASET_LABEL_COARSE ? RT_CIFAR100_COARSE : k->classes;
    memcpy(ds->mean, k->mean, sizeof ds->mean);
    memcpy(ds->std, k->std, sizeof ds->std);
    ds->hflip_suits = k->hflip_suits;
    ds->crop_pad = k->crop_pad;
}

/* Something is there (a file, a FIFO, a directory, a symlink even to nowhere): the
 * reader opens it and names what is wrong with it, rather than calling it missing. */
static bool file_exists(const char *p) {
    struct stat sb;
    return lstat(p, &sb) == 0 || errno != ENOENT;
}

static rt_status join(char *out, size_t n, const char *dir, const char *file) {
    int k = snprintf(out, n, "%s/%s", dir, file);
    if (k < 0 || (size_t)k >= n) RT_FAIL(RT_ERR_INVALID, "path '%s/%s' is too long (max %zu bytes)", dir, file, n - 1);
    return RT_OK;
}

/* The first of prefix+{suffixes} that exists in dir; "" if none. */
static rt_status find_idx(const char *dir, const char *prefix, const char *what, char *out, size_t n) {
    char names[3][128];
    /* what is "images-idx3" or "labels-idx1" */
    snprintf(names[0], sizeof names[0], "%s-%s-ubyte.gz", prefix, what);
    snprintf(names[1], sizeof names[1], "%s-%s-ubyte", prefix, what);
    /* the layout some downloaders use: train-images.idx3-ubyte */
    char dotted[64];
    snprintf(dotted, sizeof dotted, "%s", what);
    char *dash = strchr(dotted, '-');
    if (dash) *dash = '.';
    snprintf(names[2], sizeof names[2], "%s-%s-ubyte", prefix, dotted);
    out[0] = '\0';
    for (int i = 0; i < 3; i++) {
        RT_CHECK(join(out, n, dir, names[i]));
        if (file_exists(out)) return RT_OK;
    }
    out[0] = '\0';
    return RT_OK;
}

/* Where a CIFAR format's files are: its splits' file names and the folder its archive
 * extracts to. CIFAR-10 and CIFAR-100 are told apart by these names (data_batch_N.bin and
 * test_batch.bin, train.bin and test.bin), then checked by their record sizes. */
typedef struct cifar_layout {
    const char *name;       /* "CIFAR-10" */
    const char *sub;        /* the archive's folder */
    int ntrain;             /* training files */
    const char *train[5];   /* their names */
    const char *train_list; /* ... for messages */
    const char *test;       /* the test file */
} cifar_layout;

static const cifar_layout k_cifar10_files = {
    "CIFAR-10",
    "cifar-10-batches-bin",
    5,
    {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
    "data_batch_1.bin .. data_batch_5.bin",
    "test_batch.bin"};
static const cifar_layout k_cifar100_files = {"CIFAR-100",   "cifar-100-binary", 1,
                                              {"train.bin"}, "train.bin",        "test.bin"};

/* The folder (path itself, else its archive subfolder) holding the first training file or
 * the test file of layout L; "" if neither has them. */
static rt_status cifar_dir(const cifar_layout *L, const char *path, char *out, size_t n) {
    char probe[4096];
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(out, n, "%s", path);
        else
            RT_CHECK(join(out, n, path, L->sub));
        RT_CHECK(join(probe, sizeof probe, out, L->train[0]));
        if (file_exists(probe)) return RT_OK;
        RT_CHECK(join(probe, sizeof probe, out, L->test));
        if (file_exists(probe)) return RT_OK;
    }
    out[0] = '\0';
    return RT_OK;
}

static rt_status load_idx(rt_dataset *ds, const char *img_path, const char *lab_path) {
    rt_bytes lab = {0}, img = {0};
    rt_status st = RT_OK;
    rt_idx li, ii;
    const rt_bytes_rule lab_rule = rt_idx_rule(1), img_rule = rt_idx_rule(3);
    RT_CHECK_GOTO(rt_bytes_read_maybe_gz(lab_path, RT_DATASET_MAX_FILE, &lab_rule, &lab), st, fail);
    RT_CHECK_GOTO(rt_idx_parse(lab.data, lab.len, lab_path, 1, &li), st, fail);
    RT_CHECK_GOTO(rt_bytes_read_maybe_gz(img_path, RT_DATASET_MAX_FILE, &img_rule, &img), st, fail);
    RT_CHECK_GOTO(rt_idx_parse(img.data, img.len, img_path, 3, &ii), st, fail);
    if (ii.dims[0] != li.dims[0]) {
        st = RT_ERROR(RT_ERR_FORMAT, "image and label counts differ: %s has %u images but %s has %u labels", img_path,
                      ii.dims[0], lab_path, li.dims[0]);
        goto fail;
    }
    if (ii.dims[1] > 4096 || ii.dims[2] > 4096) {
        st = RT_ERROR(RT_ERR_FORMAT, "%s: wrong dimensions: images of %ux%u, expected at most 4096x4096", img_path,
                      ii.dims[1], ii.dims[2]);
        goto fail;
    }
    for (size_t i = 0; i < li.count; i++)
        if (li.data[i] >= ds->num_classes) {
            st = RT_ERROR(RT_ERR_FORMAT,
                          "%s: label out of range: label %u at index %zu (byte offset %zu), expected 0..%d", lab_path,
                          li.data[i], i, 8 + i, ds->num_classes - 1);
            goto fail;
        }
    ds->n = ii.dims[0];
    ds->c = 1;
    ds->h = (int)ii.dims[1];
    ds->w = (int)ii.dims[2];
    ds->images = ii.data;
    ds->labels = li.data;
    ds->owned_[0] = img.data;
    ds->owned_[1] = lab.data;
    return RT_OK;
fail:
    rt_bytes_free(&lab);
    rt_bytes_free(&img);
    return st;
}

static rt_status load_cifar(rt_dataset *ds, const cifar_layout *L, const rt_cifar_format *fmt, const char *dir,
                            bool train) {
    int nfiles = train ? L->ntrain : 1;
    char paths[5][4096];
    for (int i = 0; i < nfiles; i++) {
        RT_CHECK(join(paths[i], sizeof paths[i], dir, train ? L->train[i] : L->test));
        if (!file_exists(paths[i]))
            RT_FAIL(RT_ERR_IO, "%s %s split: missing file %s (expected %s in %s). " INSTALL_HINT, L->name,
                    train ? "train" : "test", paths[i], train ? L->train_list : L->test, dir);
    }
    rt_bytes files[5] = {{0}};
    int64_t counts[5] = {0}, total = 0;
    rt_status st = RT_OK;
    const rt_bytes_rule rule = rt_cifar_rule(fmt);
    for (int i = 0; i < nfiles; i++) {
        RT_CHECK_GOTO(rt_bytes_read_maybe_gz(paths[i], RT_DATASET_MAX_FILE, &rule, &files[i]), st, done);
        RT_CHECK_GOTO(rt_cifar_count(files[i].data, files[i].len, paths[i], fmt, &counts[i]), st, done);
        total += counts[i];
    }
    void *img = NULL, *lab = NULL;
    RT_CHECK_GOTO(rt_malloc(rt_device_cpu(), (size_t)total * RT_CIFAR_IMAGE, &img), st, done);
    st = rt_malloc(rt_device_cpu(), (size_t)total, &lab);
    if (st != RT_OK) {
        rt_free(rt_device_cpu(), img);
        goto done;
    }
    int64_t at = 0;
    for (int i = 0; i < nfiles; i++) {
        rt_cifar_unpack(files[i].data, counts[i], fmt, (uint8_t *)img + (size_t)at * RT_CIFAR_IMAGE,
                        (uint8_t *)lab + at);
        at += counts[i];
    }
    ds->n = total;
    ds->c = RT_CIFAR_C;
    ds->h = RT_CIFAR_H;
    ds->w = RT_CIFAR_W;
    ds->images = img;
    ds->labels = lab;
    ds->owned_[0] = img;
    ds->owned_[1] = lab;
done:
    for (int i = 0; i < nfiles; i++) rt_bytes_free(&files[i]);
    return st;
}

static bool contains_ci(const char *s, const char *sub) {
    size_t n = strlen(sub);
    for (; *s; s++)
        if (strncasecmp(s, sub, n) == 0) return true;
    return false;
}

/* The files found in a dataset folder: the CIFAR folders (cifar[0] CIFAR-10, cifar[1]
 * CIFAR-100) and the IDX files of one split; "" where absent. */
typedef struct found_files {
    char cifar[2][4096], img[4096], lab[4096];
} found_files;

/* Look in `path` for the files of `kind` (of every format with RT_DATASET_AUTO) and, for
 * RT_DATASET_AUTO, tell the kind from what is there: IDX files, CIFAR-10's data_batch_N.bin
 * and test_batch.bin or CIFAR-100's train.bin and test.bin (both CIFARs: an error). */
static rt_status find_files(const char *path, bool train, rt_dataset_kind *kind, found_files *f) {
    const char *prefix = train ? "train" : "t10k";
    bool any = *kind == RT_DATASET_AUTO, cifar = *kind == RT_DATASET_CIFAR10 || *kind == RT_DATASET_CIFAR100;
    f->cifar[0][0] = f->cifar[1][0] = f->img[0] = f->lab[0] = '\0';
    if (any || *kind == RT_DATASET_CIFAR10)
        RT_CHECK(cifar_dir(&k_cifar10_files, path, f->cifar[0], sizeof f->cifar[0]));
    if (any || *kind == RT_DATASET_CIFAR100)
        RT_CHECK(cifar_dir(&k_cifar100_files, path, f->cifar[1], sizeof f->cifar[1]));
    if (!cifar) {
        RT_CHECK(find_idx(path, prefix, "images-idx3", f->img, sizeof f->img));
        RT_CHECK(find_idx(path, prefix, "labels-idx1", f->lab, sizeof f->lab));
    }
    if (!any) return RT_OK;
    if (*f->img || *f->lab)
        *kind = contains_ci(path, "fashion") ? RT_DATASET_FASHION_MNIST : RT_DATASET_MNIST;
    else if (*f->cifar[0] && *f->cifar[1])
        RT_FAIL(RT_ERR_INVALID,
                "'%s' holds both CIFAR-10 files (in %s) and CIFAR-100 files (in %s): set data.kind to cifar10 or "
                "cifar100",
                path, f->cifar[0], f->cifar[1]);
    else if (*f->cifar[0] || *f->cifar[1])
        *kind = *f->cifar[0] ? RT_DATASET_CIFAR10 : RT_DATASET_CIFAR100;
    else
        RT_FAIL(RT_ERR_IO,
                "no dataset found in '%s': expected %s-images-idx3-ubyte[.gz] and %s-labels-idx1-ubyte[.gz] "
                "(MNIST, Fashion-MNIST), %s (CIFAR-10) or %s (CIFAR-100). %s",
                path, prefix, prefix, train ? k_cifar10_files.train_list : k_cifar10_files.test,
                train ? k_cifar100_files.train_list : k_cifar100_files.test, INSTALL_HINT);
    return RT_OK;
}

/* A CIFAR kind's files, read as `label` says. */
static rt_status load_cifar_kind(rt_dataset *ds, const found_files *f, const char *path, bool train,
                                 rt_dataset_label label) {
    bool c100 = ds->kind == RT_DATASET_CIFAR100;
    const cifar_layout *L = c100 ? &k_cifar100_files : &k_cifar10_files;
    const rt_cifar_format *fmt = !c100                              ? &rt_cifar10_format
                                 : label == RT_DATASET_LABEL_COARSE ? &rt_cifar100_coarse_format
                                                                    : &rt_cifar100_fine_format;
    const char *dir = f->cifar[c100];
    if (!*dir)
        RT_FAIL(RT_ERR_IO, "no %s files in '%s' (nor in its %s folder): expected %s. %s", L->name, path, L->sub,
                train ? L->train_list : L->test, INSTALL_HINT);
    RT_CHECK(load_cifar(ds, L, fmt, dir, train));
    if (c100)
        snprintf(ds->format, sizeof ds->format, "cifar100-binary (%s)", rt_names_name(&rt_dataset_label_names, label));
    else
        snprintf(ds->format, sizeof ds->format, "cifar10-binary");
    return RT_OK;
}

rt_status rt_dataset_load(const char *path, const char *split, rt_dataset_kind kind, rt_dataset *ds) {
    return rt_dataset_load_label(path, split, kind, RT_DATASET_LABEL_FINE, ds);
}

rt_status rt_dataset_load_label(const char *path, const char *split, rt_dataset_kind kind, rt_dataset_label label,
                                rt_dataset *ds) {
    memset(ds, 0, sizeof *ds);
    if (!path || !*path) path = RT_DATASET_DEFAULT_PATH;
    if (!split) split = "train";
    bool train;
    if (strcmp(split, "train") == 0)
        train = true;
    else if (strcmp(split, "test") == 0)
        train = false;
    else
        RT_FAIL(RT_ERR_INVALID, "split '%s': expected train or test", split);
    if ((unsigned)label >= RT_DATASET_LABEL_COUNT_)
        RT_FAIL(RT_ERR_INVALID, "dataset label %d: expected fine or coarse", (int)label);
    if (strlen(path) >= sizeof ds->path) RT_FAIL(RT_ERR_INVALID, "dataset path is too long (%zu bytes)", strlen(path));
    struct stat sb;
    if (stat(path, &sb) != 0) RT_FAIL(RT_ERR_IO, "no dataset at '%s': %s. %s", path, strerror(errno), INSTALL_HINT);
    if (!S_ISDIR(sb.st_mode))
        RT_FAIL(RT_ERR_INVALID, "dataset path '%s' is not a folder (data.path names the folder holding the files)",
                path);

    found_files f;
    RT_CHECK(find_files(path, train, &kind, &f));
    if (label == RT_DATASET_LABEL_COARSE && kind != RT_DATASET_CIFAR100)
        RT_FAIL(RT_ERR_INVALID,
                "data.label coarse: only CIFAR-100 has coarse labels (its 20 superclasses), the dataset in '%s' is "
                "%s: set data.label to fine",
                path, k_kinds[kind].name);
    set_kind(ds, kind, label);
    snprintf(ds->split, sizeof ds->split, "%s", split);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    if (kind == RT_DATASET_CIFAR10 || kind == RT_DATASET_CIFAR100) return load_cifar_kind(ds, &f, path, train, label);
    const char *prefix = train ? "train" : "t10k";
    if (!*f.img || !*f.lab)
        RT_FAIL(RT_ERR_IO, "%s split of %s in '%s': missing %s-%s-ubyte[.gz]. %s", split, ds->name, path, prefix,
                !*f.img ? "images-idx3" : "labels-idx1", INSTALL_HINT);
    RT_CHECK(load_idx(ds, f.img, f.lab));
    snprintf(ds->format, sizeof ds->format, "idx%s", strcmp(f.img + strlen(f.img) - 3, ".gz") == 0 ? " (gzip)" : "");
    return RT_OK;
}

rt_status rt_dataset_alloc(rt_dataset *ds, const char *name, int64_t n, int c, int h, int w, int num_classes) {
    memset(ds, 0, sizeof *ds);
    RT_REQUIRE(n > 0 && c >= 1 && c <= RT_DATASET_MAX_C && h > 0 && w > 0 && h <= 4096 && w <= 4096 &&
                   num_classes >= 1 && num_classes <= 256,
               RT_ERR_INVALID,
               "dataset of %lld images (%d, %d, %d), %d classes: expected n > 0, c 1..3, h, w 1..4096, "
               "classes 1..256",
               (long long)n, c, h, w, num_classes);
    set_kind(ds, RT_DATASET_SYNTHETIC, RT_DATASET_LABEL_FINE);
    snprintf(ds->name, sizeof ds->name, "%s", name ? name : "synthetic");
    snprintf(ds->format, sizeof ds->format, "memory");
    snprintf(ds->split, sizeof ds->split, "train");
    ds->n = n, ds->c = c, ds->h = h, ds->w = w, ds->num_classes = num_classes;
    size_t bytes;
    RT_REQUIRE(!__builtin_mul_overflow((size_t)n, (size_t)c * h * w, &bytes), RT_ERR_INVALID, "dataset size overflows");
    void *img = NULL, *lab = NULL;
    RT_CHECK(rt_malloc(rt_device_cpu(), bytes, &img));
    rt_status st = rt_malloc(rt_device_cpu(), (size_t)n, &lab);
    if (st != RT_OK) {
        rt_free(rt_device_cpu(), img);
        RT_CHECK(st);
    }
    memset(img, 0, bytes);
    memset(lab, 0, (size_t)n);
    ds->images = img;
    ds->labels = lab;
    ds->owned_[0] = img;
    ds->owned_[1] = lab;
    return RT_OK;
}

void rt_dataset_free(rt_dataset *ds) {
    if (!ds) return;
    rt_free(rt_device_cpu(), ds->owned_[0]);
    rt_free(rt_device_cpu(), ds->owned_[1]);
    memset(ds, 0, sizeof *ds);
}

/* A copy of ds's samples whose held[i] equals `want`, in ds's order, named like ds. */
static rt_status copy_part(const rt_dataset *ds, const bool *held, bool want, int64_t n, const char *split,
                           rt_dataset *out) {
    RT_CHECK(rt_dataset_alloc(out, ds->name, n, ds->c, ds->h, ds->w, ds->num_classes));
    void *img = out->owned_[0], *lab = out->owned_[1];
    *out = *ds; /* kind, format, path, normalisation, flips, crop */
    out->n = n;
    out->images = img;
    out->labels = lab;
    out->owned_[0] = img;
    out->owned_[1] = lab;
    snprintf(out->split, sizeof out->split, "%s", split);
    size_t bytes = rt_dataset_image_bytes(ds);
    int64_t k = 0;
    for (int64_t i = 0; i < ds->n; i++) {
        if (held[i] != want) continue;
        memcpy((uint8_t *)img + (size_t)k * bytes, ds->images + (size_t)i * bytes, bytes);
        ((uint8_t *)lab)[k++] = ds->labels[i];
    }
    return RT_OK;
}

rt_status rt_dataset_split(const rt_dataset *ds, int64_t n_val, uint64_t seed, rt_dataset *train, rt_dataset *val,
                           int64_t *held_out) {
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    RT_REQUIRE(n_val > 0 && n_val < ds->n, RT_ERR_INVALID,
               "data.val_split: %lld of the %lld training samples (after data.train_subset) would leave %s (expected "
               "1 to %lld)",
               (long long)n_val, (long long)ds->n, n_val <= 0 ? "no validation set" : "none to train on",
               (long long)ds->n - 1);
    int64_t *perm = malloc(sizeof *perm * (size_t)ds->n);
    bool *held = calloc((size_t)ds->n, sizeof *held);
    rt_status st = perm && held ? RT_OK : RT_ERROR(RT_ERR_NOMEM, "data.val_split: %lld indices", (long long)ds->n);
    if (st == RT_OK) {
        /* Fisher-Yates from the seed alone: the same held-out samples whatever the ranks */
        rt_rng rng;
        rt_rng_init(&rng, seed, RT_DATASET_SPLIT_SUBSEQ);
        for (int64_t i = 0; i < ds->n; i++) perm[i] = i;
        for (int64_t i = ds->n - 1; i > 0; i--) {
            int64_t j = (int64_t)rt_rng_below(&rng, (uint64_t)i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = ds->n - n_val; i < ds->n; i++) held[perm[i]] = true;
        if (held_out)
            for (int64_t i = 0, k = 0; i < ds->n; i++)
                if (held[i]) held_out[k++] = i;
        st = copy_part(ds, held, false, ds->n - n_val, "train", train);
    }
    if (st == RT_OK) st = copy_part(ds, held, true, n_val, "val", val);
    if (st != RT_OK) {
        rt_dataset_free(train);
        rt_dataset_free(val);
    }
    free(perm);
    free(held);
    return st;
}

void rt_dataset_pixel_stats(const rt_dataset *ds, double mean[RT_DATASET_MAX_C], double std[RT_DATASET_MAX_C]) {
    size_t plane = (size_t)ds->h * ds->w;
    for (int ch = 0; ch < RT_DATASET_MAX_C; ch++) mean[ch] = std[ch] = 0;
    for (int ch = 0; ch < ds->c && ch < RT_DATASET_MAX_C; ch++) {
        uint64_t hist[256] = {0};
        for (int64_t i = 0; i < ds->n; i++) {
            const uint8_t *p = ds->images + ((size_t)i * ds->c + ch) * plane;
            for (size_t k = 0; k < plane; k++) hist[p[k]]++;
        }
        double cnt = 0, s = 0, s2 = 0;
        for (int v = 0; v < 256; v++) {
            double x = v / 255.0;
            cnt += (double)hist[v];
            s += (double)hist[v] * x;
            s2 += (double)hist[v] * x * x;
        }
        if (cnt > 0) {
            mean[ch] = s / cnt;
            double var = s2 / cnt - mean[ch] * mean[ch];
            std[ch] = var > 0 ? sqrt(var) : 0;
        }
    }
}

void rt_dataset_histogram(const rt_dataset *ds, int64_t *counts) {
    for (int k = 0; k < ds->num_classes; k++) counts[k] = 0;
    for (int64_t i = 0; i < ds->n; i++)
        if (ds->labels[i] < ds->num_classes) counts[ds->labels[i]]++;
}
