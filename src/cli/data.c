/* `ringtrain data info|sampler` and `ringtrain bench loader`: the command lines over the
 * library functions of src/data.
 *
 * `data info` loads a dataset the way training would and prints what it found;
 * `data sampler` prints the indices one rank would get in one epoch, a debugging aid
 * for DistributedSampler questions; `bench loader` measures the loader's throughput
 * on synthetic 28x28 and 32x32 data with augmentation, one worker thread.
 */
#include "cli/args.h"
#include "cli/cli.h"
#include "data/dataset.h"
#include "data/loader_bench.h"
#include "data/sampler.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --name VALUE or --name=VALUE at argv[*i]; advances *i past the value. */
static int opt_value(const char *prog, int argc, char **argv, int *i, const char *name, const char **val) {
    return rt_cli_opt(prog, argc, argv, i, name, val);
}

static int parse_i64(const char *prog, const char *what, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v;
    if (rt_cli_parse_i64(text, lo, hi, &v) != 0) {
        fprintf(stderr, "%s: %s '%s': expected an integer in %" PRId64 "..%" PRId64 "\n", prog, what, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_u64(const char *prog, const char *what, const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (text[0] < '0' || text[0] > '9') { /* no sign, spaces or empty text */
        fprintf(stderr, "%s: %s '%s': expected a non-negative integer\n", prog, what, text);
        return -1;
    }
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || !end || end == text || *end != '\0') {
        fprintf(stderr, "%s: %s '%s': expected a non-negative integer\n", prog, what, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- data info ------------------------------------------------------------------------ */

static void print_split(const rt_dataset *ds) {
    int64_t hist[256];
    rt_dataset_histogram(ds, hist);
    double mean[RT_DATASET_MAX_C], sd[RT_DATASET_MAX_C];
    rt_dataset_pixel_stats(ds, mean, sd);
    printf("path:       %s\n", ds->path);
    printf("dataset:    %s\n", ds->name);
    printf("format:     %s\n", ds->format);
    printf("split:      %s\n", ds->split);
    printf("samples:    %" PRId64 "\n", ds->n);
    printf("image:      %d x %d x %d (C x H x W), uint8\n", ds->c, ds->h, ds->w);
    printf("classes:    %d\n", ds->num_classes);
    printf("histogram:  class  count\n");
    for (int k = 0; k < ds->num_classes; k++) printf("            %5d  %" PRId64 "\n", k, hist[k]);
    printf("pixel mean:");
    for (int ch = 0; ch < ds->c; ch++) printf(" %.4f", mean[ch]);
    printf("   (measured, of pixel/255)\npixel std: ");
    for (int ch = 0; ch < ds->c; ch++) printf(" %.4f", sd[ch]);
    printf("\nnormalise:  mean");
    for (int ch = 0; ch < ds->c; ch++) printf(" %.4f", (double)ds->mean[ch]);
    printf(" std");
    for (int ch = 0; ch < ds->c; ch++) printf(" %.4f", (double)ds->std[ch]);
    printf("   (the loader's constants for %s)\n", ds->name);
}

/* The kinds --kind accepts, from the dataset kind table: "auto|mnist|..." and
 * ", mnist, ..." (auto left out) */
static void kind_lists(char *bar, char *comma, size_t n) {
    bar[0] = comma[0] = '\0';
    for (int k = 0; k < RT_DATASET_KIND_COUNT_; k++) {
        const char *name = rt_names_name(&rt_dataset_kind_names, k);
        if (!name) continue; /* built in memory only */
        size_t lb = strlen(bar), lc = strlen(comma);
        snprintf(bar + lb, n - lb, "%s%s", lb ? "|" : "", name);
        if (k != RT_DATASET_AUTO) snprintf(comma + lc, n - lc, ", %s", name);
    }
}

static int cmd_info(int argc, char **argv) {
    const char *prog = "ringtrain data info";
    const char *path = NULL, *split = NULL, *kind_s = "auto", *label_s = "fine";
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (rt_cli_is_help(argv[i])) {
            char bar[128], comma[128];
            kind_lists(bar, comma, sizeof bar);
            printf("usage: ringtrain data info [PATH] [--split train|test] [--kind %s]\n"
                   "                          [--label fine|coarse]\n\n"
                   "Load a dataset as training would and print its format, sample count, image shape,\n"
                   "class histogram and pixel mean/std (of pixel/255, per channel). PATH is a folder of\n"
                   "IDX files ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]: MNIST, Fashion-MNIST),\n"
                   "CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin) or CIFAR-100's\n"
                   "binary files (train.bin, test.bin); default\n"
                   "%s (Debian package dataset-fashion-mnist).\n\n"
                   "  --split train|test   only this split (default: train, then test when present)\n"
                   "  --kind K             auto (default: detect from the files)%s\n"
                   "  --label fine|coarse  the label counted (data.label): coarse is CIFAR-100's 20\n"
                   "                       superclasses (default: fine)\n",
                   bar, RT_DATASET_DEFAULT_PATH, comma);
            return 0;
        }
        if ((r = opt_value(prog, argc, argv, &i, "--split", &v)) != 0) {
            if (r < 0) return 2;
            if (strcmp(v, "train") != 0 && strcmp(v, "test") != 0) {
                fprintf(stderr, "%s: --split '%s': expected train or test\n", prog, v);
                return 2;
            }
            split = v;
        } else if ((r = opt_value(prog, argc, argv, &i, "--kind", &v)) != 0) {
            if (r < 0) return 2;
            kind_s = v;
        } else if ((r = opt_value(prog, argc, argv, &i, "--label", &v)) != 0) {
            if (r < 0) return 2;
            label_s = v;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, argv[i]);
            return 2;
        } else if (path) {
            fprintf(stderr, "%s: more than one PATH ('%s', '%s')\n", prog, path, argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    rt_dataset_kind kind;
    if (rt_dataset_kind_parse(kind_s, &kind) != RT_OK) {
        fprintf(stderr, "%s: --kind: %s\n", prog, rt_error_message());
        return 2;
    }
    int label;
    if (rt_names_parse(&rt_dataset_label_names, label_s, &label) != RT_OK) {
        fprintf(stderr, "%s: --label: %s\n", prog, rt_error_message());
        return 2;
    }
    /* without --split: both splits, the test split only when present */
    const char *splits[2] = {split ? split : "train", split ? NULL : "test"};
    for (int k = 0; k < 2 && splits[k]; k++) {
        rt_dataset ds;
        if (rt_dataset_load_label(path, splits[k], kind, (rt_dataset_label)label, &ds) != RT_OK) {
            if (k == 1 && rt_error_status() == RT_ERR_IO) {
                printf("\nsplit test: not found (%s)\n", rt_error_message());
                rt_error_clear();
                break;
            }
            return rt_cli_fail();
        }
        if (k > 0) printf("\n");
        print_split(&ds);
        rt_dataset_free(&ds);
    }
    return 0;
}

/* ---- data sampler --------------------------------------------------------------------- */

static int cmd_sampler(int argc, char **argv) {
    const char *prog = "ringtrain data sampler";
    int64_t world = -1, rank = -1, epoch = -1, n = -1;
    uint64_t seed = 0;
    bool shuffle = true, drop_last = false;
    rt_sampler_mode mode = RT_SAMPLER_DISTRIBUTED;
    bool options = true; /* until "--" */
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (options && strcmp(argv[i], "--") == 0) {
            options = false;
            continue;
        }
        if (!options) {
            if (n >= 0) {
                fprintf(stderr, "%s: more than one N ('%s')\n", prog, argv[i]);
                return 2;
            }
            if (parse_i64(prog, "N", argv[i], 1, (int64_t)1 << 40, &n)) return 2;
            continue;
        }
        if (rt_cli_is_help(argv[i])) {
            printf("usage: ringtrain data sampler --world-size W --rank R --epoch E [--seed S] [--no-shuffle]\n"
                   "                              [--drop-last] [--mode distributed|partition|eval] N\n\n"
                   "Print the dataset indices rank R of W gets in epoch E from a sampler over N samples,\n"
                   "one per line, in order. The default mode is PyTorch's DistributedSampler (shuffle by\n"
                   "seed + epoch; without --drop-last the list is padded to a multiple of W by wrapping\n"
                   "around to its start; rank R takes every W-th index from R). With --no-shuffle the\n"
                   "output equals torch.utils.data.distributed.DistributedSampler's.\n\n"
                   "  --world-size W  number of ranks (>= 1)\n"
                   "  --rank R        0..W-1\n"
                   "  --epoch E       epoch (>= 0), as sampler.set_epoch(E)\n"
                   "  --seed S        shuffle seed (default 0)\n"
                   "  --no-shuffle    keep 0..N-1 in order\n"
                   "  --drop-last     drop the tail instead of padding\n"
                   "  --mode M        distributed (default), partition (the tutorial's fixed split into W\n"
                   "                  equal parts of a seeded permutation), eval (every sample exactly\n"
                   "                  once across ranks, no padding)\n");
            return 0;
        }
        if ((r = opt_value(prog, argc, argv, &i, "--world-size", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--world-size", v, 1, INT_MAX, &world)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--rank", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--rank", v, 0, INT_MAX, &rank)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--epoch", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--epoch", v, 0, INT64_MAX, &epoch)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--seed", &v)) != 0) {
            if (r < 0 || parse_u64(prog, "--seed", v, &seed)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--mode", &v)) != 0) {
            if (r < 0) return 2;
            if (rt_sampler_mode_parse(v, &mode) != RT_OK) {
                fprintf(stderr, "%s: --mode: %s\n", prog, rt_error_message());
                return 2;
            }
        } else if (strcmp(argv[i], "--no-shuffle") == 0) {
            shuffle = false;
        } else if (strcmp(argv[i], "--drop-last") == 0) {
            drop_last = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, argv[i]);
            return 2;
        } else if (n >= 0) {
            fprintf(stderr, "%s: more than one N ('%s')\n", prog, argv[i]);
            return 2;
        } else if (parse_i64(prog, "N", argv[i], 1, (int64_t)1 << 40, &n)) {
            return 2;
        }
    }
    const char *missing = world < 0 ? "--world-size" : rank < 0 ? "--rank" : epoch < 0 ? "--epoch" : n < 0 ? "N" : NULL;
    if (missing) {
        fprintf(stderr, "%s: missing %s (try --help)\n", prog, missing);
        return 2;
    }
    if (rank >= world) {
        fprintf(stderr, "%s: --rank %" PRId64 ": expected 0..%" PRId64 " (--world-size %" PRId64 ")\n", prog, rank,
                world - 1, world);
        return 2;
    }
    rt_sampler_config cfg = {mode, n, (int)world, (int)rank, seed, shuffle, drop_last};
    rt_sampler s;
    if (rt_sampler_init(&s, &cfg) != RT_OK) return rt_cli_fail();
    if (rt_sampler_set_epoch(&s, epoch) != RT_OK) {
        rt_sampler_free(&s);
        return rt_cli_fail();
    }
    int64_t idx;
    while (rt_sampler_next(&s, &idx)) printf("%" PRId64 "\n", idx);
    rt_sampler_free(&s);
    return fflush(stdout) == 0 ? 0 : 1;
}

int rt_cmd_data(int argc, char **argv) {
    static const rt_command cmds[] = {
        {"info", "format, sample counts, image shape, class histogram, pixel mean/std of a dataset", cmd_info},
        {"sampler", "the indices a rank gets from the distributed sampler, one per line", cmd_sampler},
    };
    return rt_cli_dispatch("ringtrain data", cmds, (int)(sizeof cmds / sizeof cmds[0]), argc, argv);
}

/* ---- bench loader --------------------------------------------------------------------- */

typedef struct bench_row {
    const char *name;
    int c, h, w;
    int64_t n;
    rt_loader_bench_result r;
} bench_row;

int rt_cmd_bench_loader(int argc, char **argv) {
    const char *prog = "ringtrain bench loader";
    int64_t batch = 256, prefetch = 4, images = 300000;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (rt_cli_is_help(argv[i])) {
            printf("usage: ringtrain bench loader [--batch B] [--images N] [--prefetch P] [--json]\n\n"
                   "Loader throughput (images/s) with one worker thread, on synthetic 1x28x28 (60000\n"
                   "images, crop padding 2) and 3x32x32 (50000 images, crop padding 4) datasets, with\n"
                   "augmentation (random crop + horizontal flip) and normalisation, world size 1. The\n"
                   "consumer only takes the batches, so this is the rate the loader can sustain.\n\n"
                   "  --batch B      batch size (default 256)\n"
                   "  --images N     images to time per shape (default 300000)\n"
                   "  --prefetch P   ring slots (default 4)\n"
                   "  --json         one JSON object instead of the table\n");
            return 0;
        }
        if ((r = opt_value(prog, argc, argv, &i, "--batch", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--batch", v, 1, 1 << 16, &batch)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--images", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--images", v, 1, (int64_t)1 << 40, &images)) return 2;
        } else if ((r = opt_value(prog, argc, argv, &i, "--prefetch", &v)) != 0) {
            if (r < 0 || parse_i64(prog, "--prefetch", v, 2, 64, &prefetch)) return 2;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", prog, argv[i]);
            return 2;
        }
    }
    bench_row rows[] = {{"1x28x28", 1, 28, 28, 60000, {0, 0}}, {"3x32x32", 3, 32, 32, 50000, {0, 0}}};
    int nrows = (int)(sizeof rows / sizeof rows[0]);
    for (int i = 0; i < nrows; i++) {
        rt_loader_bench_config cfg = {rows[i].c, rows[i].h, rows[i].w, rows[i].n, (int)batch, (int)prefetch, images};
        if (rt_loader_bench(&cfg, &rows[i].r) != RT_OK) return rt_cli_fail();
    }
    if (json) {
        printf("{\"benchmark\": \"loader\", \"batch\": %" PRId64 ", \"prefetch\": %" PRId64
               ", \"worker_threads\": 1, \"augment\": true, \"results\": [",
               batch, prefetch);
        for (int i = 0; i < nrows; i++)
            printf("%s{\"shape\": \"%s\", \"dataset_size\": %" PRId64 ", \"images\": %" PRId64
                   ", \"seconds\": %.6f, \"images_per_s\": %.1f}",
                   i ? ", " : "", rows[i].name, rows[i].n, rows[i].r.images, rows[i].r.seconds,
                   rows[i].r.images / rows[i].r.seconds);
        printf("]}\n");
        return 0;
    }
    printf("%-8s %6s %10s %9s %12s\n", "shape", "batch", "images", "seconds", "images/s");
    for (int i = 0; i < nrows; i++)
        printf("%-8s %6" PRId64 " %10" PRId64 " %9.3f %12.0f\n", rows[i].name, batch, rows[i].r.images,
               rows[i].r.seconds, rows[i].r.images / rows[i].r.seconds);
    return 0;
}
