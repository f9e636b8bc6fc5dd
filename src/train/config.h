/* The training config: a YAML file (libyaml) with the sections model, data, optim,
 * train, dist, checkpoint and log, plus `section.key=value` overrides from the command
 * line. Every key is one row of a table in config.c (type, default, range, meaning, how a
 * checkpoint treats it); docs/config.md documents the same rows, and a test checks that
 * the two agree.
 *
 * Errors name the file, the line and the key, and what was expected:
 *   configs/x.yaml:7: model.archh: unknown key (did you mean model.arch?)
 *   configs/x.yaml:9: data.batch_size: 'many' is not an integer
 *   override 'optim.lr=abc': optim.lr: 'abc' is not a number
 *
 * A choice is parsed once, here, by the name table of the area that owns it, and held as
 * that area's enum (or bool) in the area's own option struct where it has one
 * (rt_model_config, rt_model_ctx_options, rt_optim_config, rt_schedule, rt_loader_config,
 * rt_pg_options); the
 * trainer never compares names nor copies keys one by one into those structs. Files, checkpoints
 * and rt_config_write still say names, never numbers.
 *
 * Values that depend on others are "auto" in the table (stored as RT_CONFIG_AUTO for
 * integers and choices, NaN for floats, "auto" for strings) and resolved by the
 * trainer, which then writes the resolved config (rt_config_write) into the run
 * directory. */
#ifndef RT_TRAIN_CONFIG_H
#define RT_TRAIN_CONFIG_H

#include "core/log.h"
#include "core/names.h"
#include "core/status.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "dist/dist.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_CONFIG_AUTO (-1) /* an integer key left to "auto" */
#define RT_CONFIG_PATH_MAX 1024
#define RT_CONFIG_NAME_MAX 64
#define RT_CONFIG_MAX_LIST 64 /* checkpoint.allow_changes */

/* How a checkpoint treats a config key: the `ckpt` column of the key table, shown as
 * docs/config.md's checkpoint column (a test checks the two agree). A resume compares the
 * checkpoint's config with its own key by key and refuses a MUST_MATCH key that differs
 * (unless checkpoint.allow_changes names it); the other two may differ. NOT_FROM_CKPT keys
 * say where the process runs, whom it connects to and where its output goes (dist.*,
 * log.*, checkpoint.*, train.threads, train.device): they come from the command line, the
 * config file and the environment only, never from a checkpoint's metadata. */
typedef enum rt_key_resume {
    RT_KEY_MUST_MATCH = 0, /* what a step computes: equal, or named in checkpoint.allow_changes */
    RT_KEY_MAY_CHANGE,     /* how or how long the run goes: a resume may change it */
    RT_KEY_NOT_FROM_CKPT,  /* process, network, output: this run's own, never a checkpoint's */
    RT_KEY_RESUME_COUNT_
} rt_key_resume;

/* "must match", "may change", "never from a checkpoint" (docs/config.md's cells) */
extern const rt_names rt_key_resume_names;

/* log.progress */
typedef enum rt_progress_mode {
    RT_PROGRESS_AUTO = 0,
    RT_PROGRESS_ON,
    RT_PROGRESS_OFF,
    RT_PROGRESS_COUNT_
} rt_progress_mode;

/* train.cuda_graphs */
typedef enum rt_graphs_mode {
    RT_GRAPHS_AUTO = 0,
    RT_GRAPHS_ON,
    RT_GRAPHS_OFF,
    RT_GRAPHS_COUNT_
} rt_graphs_mode;

/* What checkpoint.keep_best and train.early_stop watch: a metric of the evaluation
 * (val_*: the held-out part of the training set, data.val_split; test_*: the test set);
 * keep_best's auto (RT_CONFIG_AUTO) is val_acc where a split exists, else none. */
typedef enum rt_monitor {
    RT_MONITOR_NONE = 0,
    RT_MONITOR_VAL_ACC,
    RT_MONITOR_VAL_LOSS,
    RT_MONITOR_TEST_ACC,
    RT_MONITOR_TEST_LOSS,
    RT_MONITOR_COUNT_
} rt_monitor;

/* "none", "val_acc", "val_loss", "test_acc", "test_loss" */
extern const rt_names rt_monitor_names;

typedef struct rt_config {
    /* the model's keys (model.arch, width, stem, num_classes, dropout), each in its field
     * of the model's own option struct; auto: stem RT_STEM_AUTO (cifar for 32x32 data),
     * num_classes RT_CONFIG_AUTO (the dataset's), dropout NaN (the architecture's). The
     * trainer resolves the autos and sets the input shape and max_batch. */
    rt_model_config model;
    bool sync_bn; /* model.sync_bn: batch-norm statistics over the global batch (SyncBatchNorm) */
    struct {
        rt_dataset_kind kind; /* RT_DATASET_AUTO: detected from the files */
        rt_dataset_label label; /* CIFAR-100: fine (100 classes) or coarse (20) */
        char path[RT_CONFIG_PATH_MAX];
        int64_t batch_size;      /* global, over all ranks */
        int64_t eval_batch_size; /* auto: batch_size */
        /* the training loader's keys, each in its field (data.sampler is its mode,
         * data.shuffle, data.drop_last, data.augment, data.crop_pad and data.hflip: -1
         * where auto, data.prefetch, data.erasing*: erase_*). The trainer sets the
         * dataset, the ranks, the batch, the seed and the device. */
        rt_loader_config loader;
        int64_t train_subset; /* 0: every training sample; N: the first N */
        int64_t test_subset;  /* 0: every test sample; N: the first N */
        int64_t val_split;    /* N training samples held out for validation (0: none) */
        int n_erasing_scale, n_erasing_ratio;
        /* data.erasing_value as written ("random" or a number); parsed once into
         * loader.erase_random and loader.erase_value */
        char erasing_value[RT_CONFIG_NAME_MAX];
    } data;
    struct {
        /* the optimizer's keys (optim.name is its kind, optim.lr, optim.momentum,
         * optim.betas, ...), each in its field, and train.ema_* in its ema fields; NaN
         * where auto (lr, weight_decay, eps: rt_optim_config_resolve). The trainer sets
         * the ranges. */
        rt_optim_config opt;
        int n_betas;
        bool no_decay_bn_bias;
        double clip_grad_norm; /* 0: off */
        /* the schedule's keys (optim.schedule is its kind, optim.interval per_epoch,
         * optim.anneal anneal_linear, optim.step_size, ...), each in its field; auto:
         * t_max and total_steps RT_CONFIG_AUTO (the run's length), max_lr NaN (lr). The
         * trainer sets base_lr and steps_per_epoch and resolves the autos. */
        rt_schedule sched;
    } optim;
    struct {
        int64_t epochs;
        int64_t max_steps;  /* 0: no limit */
        int64_t accumulate; /* micro-batches per optimizer step (1: none; docs/train.md, "Gradient accumulation") */
        int64_t eval_every; /* epochs; 0: only at the end */
        int64_t seed;
        char device[RT_CONFIG_NAME_MAX]; /* auto | cpu | cuda | cuda:N */
        /* the model context's keys (train.precision, train.threads, train.deterministic:
         * deterministic GPU convolution algorithms, kept in the checkpoint;
         * train.cudnn_benchmark: chosen by timing), each in its
         * field; threads RT_CONFIG_AUTO where auto (the cores shared by the local ranks).
         * The trainer sets the device and resolves the threads. */
        rt_model_ctx_options ctx;
        bool skip_nonfinite;
        rt_graphs_mode cuda_graphs; /* the step captured in CUDA graphs (docs/gpu.md, "CUDA graphs") */
        double label_smoothing; /* CrossEntropyLoss(label_smoothing=) */
        bool tta_flip;          /* eval.tta flip: evaluation averages the logits of x and its mirror */
        int early_stop;                /* rt_monitor: stop when it has not improved (NONE: never) */
        int64_t early_stop_patience;   /* evaluations without an improvement before the stop */
        double early_stop_min_delta;   /* an improvement is a change by more than this */
        /* train.ema_decay, train.ema_every, train.ema_warmup: the optimizer's fields
         * (optim.opt.ema_*), which keep the moving average */
    } train;
    struct {
        int64_t nproc;                        /* auto: one per local GPU, else 2 on CPU */
        char init_method[RT_CONFIG_PATH_MAX]; /* env:// | tcp://HOST:PORT | file:///PATH */
        int64_t nnodes, node_rank;
        char master_addr[256];
        int64_t master_port; /* 0: a free port (single node) */
        /* the process group's keys (dist.algo, dist.transport, dist.timeout_s, dist.debug),
         * each in its field, and its settings' defaults (the flight recorder's size); the
         * trainer sets the run-time fields: init_method (from the key above), rank,
         * world_size and device */
        rt_pg_options pg;
        bool compress_bf16;     /* dist.compress bf16: gradients all-reduced as bf16 */
        double bucket_mb;       /* 0: one all-reduce after backward */
        double first_bucket_mb; /* DDP's small first bucket */
        int64_t check_sync_every;
        int64_t max_restarts; /* the launcher restarts a failed job this many times (torchrun's) */
    } dist;
    struct {
        char dir[RT_CONFIG_PATH_MAX];    /* auto: RUN_DIR/checkpoints */
        int64_t every_steps;             /* 0: off */
        int64_t every_epochs;            /* 0: off */
        int64_t keep_last;               /* 0: keep all */
        int keep_best;                   /* rt_monitor, or RT_CONFIG_AUTO: the best evaluation in DIR/best/ */
        double every_minutes;            /* a checkpoint after M minutes of training (rank 0's clock; 0: off) */
        char resume[RT_CONFIG_PATH_MAX]; /* auto | none | PATH */
        bool overwrite;                  /* resume none in a folder with checkpoints: move them aside */
        char allow_changes[RT_CONFIG_MAX_LIST][RT_CONFIG_NAME_MAX]; /* keys a resume may change */
        int n_allow_changes;
    } checkpoint;
    struct {
        char dir[RT_CONFIG_PATH_MAX]; /* the run directory; auto: runs/<config file name> */
        int64_t every_steps;          /* a plain line every N steps when not on a terminal */
        bool all_ranks;
        bool trace;       /* timeline spans to RUN_DIR/trace-rank<R>.jsonl (docs/debugging.md) */
        bool tensorboard; /* rank 0's scalars to RUN_DIR/events.out.tfevents.* (train/tensorboard.h) */
        rt_log_level level;
        rt_progress_mode progress;
    } log;
    char source[RT_CONFIG_PATH_MAX]; /* the file it was read from ("" for defaults) */
} rt_config;

/* Every key at its default. */
void rt_config_default(rt_config *cfg);

/* Defaults, then the file `path` (NULL: none), then each override "section.key=value"
 * in order. Errors name the file and line, or the override. */
rt_status rt_config_load(rt_config *cfg, const char *path, int n_overrides, const char *const *overrides);

/* Parse YAML text (`name` is used in errors) onto cfg (which holds defaults or earlier values). */
rt_status rt_config_parse_text(rt_config *cfg, const char *text, size_t len, const char *name);

/* The environment variables that set config keys (docs/settings.md): each one that is set
 * replaces its key's value (RINGTRAIN_DIST_TIMEOUT -> dist.timeout_s, RINGTRAIN_DIST_DEBUG or
 * TORCH_DISTRIBUTED_DEBUG -> dist.debug, RINGTRAIN_LOG_LEVEL -> log.level). Call it after the
 * file and before the command-line overrides (rt_config_load does). Errors: a bad value,
 * naming the variable. */
rt_status rt_config_apply_env(rt_config *cfg);

/* Apply one "section.key=value" override. */
rt_status rt_config_override(rt_config *cfg, const char *assignment);

/* True when `arg` looks like an override (contains '=' before any '/', and a '.'). */
bool rt_config_is_override(const char *arg);

/* Write every key as YAML, section by section (auto values as "auto"); the output
 * loads back into an equal config. */
rt_status rt_config_write(const rt_config *cfg, FILE *out);
rt_status rt_config_write_file(const rt_config *cfg, const char *path);

/* The key table, for the docs test and `ringtrain train --help`: name ("model.arch"),
 * type ("int", "float", "bool", "string", "choice", "[int]", "[float, float]"), default
 * as text, meaning. Returns false past the end. */
bool rt_config_key_at(int i, const char **name, const char **type, const char **def, const char **doc);

/* Key i's accepted names when it is a choice among the names of a table ("auto | imagenet
 * | cifar", from the area's rt_names: what --help and docs/config.md's type column show);
 * false (and "") for other keys or past the end. */
bool rt_config_key_choices(int i, char *buf, size_t n);

/* Key i's value in cfg as rt_config_write writes it ("auto", "0.10000000000000001",
 * "\"sgd\"", "[1, 2]"); false past the end. */
bool rt_config_value_at(const rt_config *cfg, int i, char *out, size_t n);

/* True when `name` is a key of the table ("optim.lr"). */
bool rt_config_has_key(const char *name);

/* How a checkpoint treats the key `name` (its row's column, rt_key_resume above);
 * RT_KEY_MUST_MATCH for a name that is no key. */
rt_key_resume rt_config_key_resume(const char *name);

#ifdef __cplusplus
}
#endif

#endif
