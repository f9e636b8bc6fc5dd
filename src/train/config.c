/* The training config (config.h): one table of keys, a libyaml reader that walks the
 * document (section -> key -> value) checking each key against the table, overrides
 * parsed by the same value parser, and a writer of the resolved config.
 *
 * Defaults are text in the table and go through the same parser as the file, so a
 * default can never be a value the file would refuse. */
#include "train/config.h"

#include "core/file.h"
#include "core/names.h"
#include "core/log.h"
#include "core/settings.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "dist/dist.h"
#include "dist/reducer.h"
#include "model/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* ---- the key table ------------------------------------------------------------------ */

/* K_ENUM: a name of a table, held as its index (an enum, int or bool field: `size` says
 * which); K_CHOICE: a value checked by `check`, held as text */
typedef enum ktype { K_INT, K_FLOAT, K_BOOL, K_STR, K_CHOICE, K_INTLIST, K_FLOATLIST, K_STRLIST, K_ENUM } ktype;

typedef struct key {
    const char *name; /* "section.key" */
    /* how a checkpoint treats it (config.h; docs/config.md's checkpoint column, checked):
     * MATCH, MAY (a resume may change it) or NEVER (process, network, output: never taken
     * from a checkpoint) */
    rt_key_resume ckpt;
    ktype type;
    size_t off;       /* offset of the value in rt_config */
    size_t size;      /* strings: buffer size; lists: capacity */
    size_t count_off; /* lists: offset of the int count */
    const char *def;  /* default, as the file would say it */
    double lo, hi;    /* numeric range, inclusive */
    bool allow_auto;  /* "auto" accepted (int: RT_CONFIG_AUTO, float: NaN, choice: "auto") */
    /* K_ENUM: the name table of the area that owns the choice (core/names.h), which
     * parses the value, lists the names in the error, in `ringtrain train --help` and in
     * docs/config.md (checked); K_CHOICE (a value that is not a name): a check */
    const rt_names *names;
    rt_status (*check)(rt_config *cfg, const char *value); /* and stores the typed value */
    const char *doc;
} key;

#define F(field) offsetof(rt_config, field)
#define SZ(field) sizeof(((rt_config *)0)->field)
#define CAP(field) (sizeof(((rt_config *)0)->field) / sizeof(((rt_config *)0)->field[0]))
#define INF HUGE_VAL
#define I64 9.2e18
#define MATCH RT_KEY_MUST_MATCH
#define MAY RT_KEY_MAY_CHANGE
#define NEVER RT_KEY_NOT_FROM_CKPT

/* train's own choices, indexed by the value they select */
static const char *const k_tta_names[] = {"none", "flip"}; /* indexed by tta_flip */
static const rt_names k_tta = {"test-time augmentation", 2, k_tta_names, NULL, NULL};
static const char *const k_progress_names[RT_PROGRESS_COUNT_] = {
    [RT_PROGRESS_AUTO] = "auto", [RT_PROGRESS_ON] = "on", [RT_PROGRESS_OFF] = "off"};
static const rt_names k_progress = {"progress mode", RT_PROGRESS_COUNT_, k_progress_names, NULL, NULL};
static const char *const k_graphs_names[RT_GRAPHS_COUNT_] = {
    [RT_GRAPHS_AUTO] = "auto", [RT_GRAPHS_ON] = "on", [RT_GRAPHS_OFF] = "off"};
static const rt_names k_graphs = {"CUDA graphs mode", RT_GRAPHS_COUNT_, k_graphs_names, NULL, NULL};
static const char *const k_monitor_names[RT_MONITOR_COUNT_] = {[RT_MONITOR_NONE] = "none",
                                                               [RT_MONITOR_VAL_ACC] = "val_acc",
                                                               [RT_MONITOR_VAL_LOSS] = "val_loss",
                                                               [RT_MONITOR_TEST_ACC] = "test_acc",
                                                               [RT_MONITOR_TEST_LOSS] = "test_loss"};
const rt_names rt_monitor_names = {"evaluation metric", RT_MONITOR_COUNT_, k_monitor_names, NULL, NULL};

/* data.erasing_value: "random" or a finite number, into the loader's erase_random and
 * erase_value */
static rt_status check_erasing_value(rt_config *cfg, const char *v) {
    if (strcasecmp(v, "random") == 0) {
        cfg->data.loader.erase_random = true;
        cfg->data.loader.erase_value = 0.0f;
        return RT_OK;
    }
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end != 0 || !isfinite(x)) return RT_ERROR(RT_ERR_INVALID, "expected random or a finite number");
    cfg->data.loader.erase_random = false;
    cfg->data.loader.erase_value = (float)x;
    return RT_OK;
}

/* train.device: a form core's rt_device_choose knows (auto | cpu | cuda | cuda:N), checked
 * when the config is read; which device it names depends on the rank and the GPUs, so
 * the trainer resolves it (rt_device_select) and the config keeps the text */
static rt_status check_device(rt_config *cfg, const char *v) {
    (void)cfg;
    rt_device d;
    rt_status st = rt_device_choose(v, 0, 0, &d); /* with no GPU: only the form is judged */
    if (st == RT_ERR_NODEVICE) rt_error_clear();
    return st == RT_ERR_NODEVICE ? RT_OK : st;
}

/* clang-format off */
static const key k_keys[] = {
    /* model */
    {"model.arch", MATCH, K_ENUM, F(model.arch), SZ(model.arch), 0, "resnet34", 0, 0, false, &rt_model_arch_names, NULL,
     "architecture (net: the PyTorch tutorial's CNN)"},
    {"model.width", MATCH, K_INT, F(model.width), SZ(model.width), 0, "64", 1, 4096, false, NULL, NULL,
     "ResNet base channels (64 is torchvision's; smaller for quick tests)"},
    {"model.stem", MATCH, K_ENUM, F(model.stem), SZ(model.stem), 0, "auto", 0, 0, true, &rt_stem_names, NULL,
     "ResNet stem: imagenet (7x7/2 conv + max-pool), cifar (3x3/1 conv); auto: cifar for 32x32 images"},
    {"model.num_classes", MATCH, K_INT, F(model.num_classes), SZ(model.num_classes), 0, "auto", 2, 1000000, true, NULL, NULL,
     "output classes; auto: the dataset's"},
    {"model.dropout", MATCH, K_FLOAT, F(model.dropout), 0, 0, "auto", 0, 0.999999, true, NULL, NULL,
     "Net's dropout probability; auto: the tutorial's 0.5 (both dropouts)"},
    {"model.sync_bn", MATCH, K_BOOL, F(sync_bn), 0, 0, "false", 0, 0, false, NULL, NULL,
     "batch norm with statistics over the global batch (torch.nn.SyncBatchNorm) instead of each rank's"},
    /* data */
    {"data.kind", MATCH, K_ENUM, F(data.kind), SZ(data.kind), 0, "auto", 0, 0, false, &rt_dataset_kind_names, NULL,
     "the dataset's format (auto: detected from the files)"},
    {"data.label", MATCH, K_ENUM, F(data.label), SZ(data.label), 0, "fine", 0, 0, false, &rt_dataset_label_names, NULL,
     "the label learned: fine (the dataset's classes) or coarse (CIFAR-100's 20 superclasses; only CIFAR-100)"},
    {"data.path", MAY, K_STR, F(data.path), SZ(data.path), 0, RT_DATASET_DEFAULT_PATH, 0, 0, false, NULL, NULL,
     "folder with the IDX files (gzip or raw), the CIFAR-10 binary batches or CIFAR-100's train.bin and test.bin"},
    {"data.batch_size", MATCH, K_INT, F(data.batch_size), 0, 0, "128", 1, 1 << 20, false, NULL, NULL,
     "global batch over all ranks (each rank takes batch_size / world_size)"},
    {"data.eval_batch_size", MAY, K_INT, F(data.eval_batch_size), 0, 0, "auto", 1, 1 << 20, true, NULL, NULL,
     "global batch for evaluation; auto: batch_size / train.accumulate"},
    {"data.sampler", MATCH, K_ENUM, F(data.loader.mode), SZ(data.loader.mode), 0, "distributed", 0, 0, false, &rt_sampler_train_mode_names, NULL,
     "distributed (PyTorch's DistributedSampler) or partition (contiguous shards)"},
    {"data.shuffle", MATCH, K_BOOL, F(data.loader.shuffle), 0, 0, "true", 0, 0, false, NULL, NULL,
     "shuffle the training set every epoch (seed + epoch)"},
    {"data.drop_last", MATCH, K_BOOL, F(data.loader.drop_last), 0, 0, "false", 0, 0, false, NULL, NULL,
     "sampler drops the tail instead of padding it (DistributedSampler's drop_last)"},
    {"data.augment", MATCH, K_BOOL, F(data.loader.augment), 0, 0, "true", 0, 0, false, NULL, NULL,
     "random crop (and flip where it keeps the class) on training batches"},
    {"data.crop_pad", MATCH, K_INT, F(data.loader.crop_pad), SZ(data.loader.crop_pad), 0, "auto", 0, 64, true, NULL, NULL,
     "padding of the random crop; auto: 2 for 28x28 data, 4 for CIFAR-10 and CIFAR-100"},
    {"data.hflip", MATCH, K_INT, F(data.loader.hflip), SZ(data.loader.hflip), 0, "auto", 0, 1, true, NULL, NULL,
     "random horizontal flip: 0 | 1 | auto (on for Fashion-MNIST, CIFAR-10 and CIFAR-100, off for MNIST digits)"},
    {"data.prefetch", MAY, K_INT, F(data.loader.prefetch), SZ(data.loader.prefetch), 0, "4", 2, 64, false, NULL, NULL,
     "batches prepared ahead by the loader thread"},
    {"data.train_subset", MATCH, K_INT, F(data.train_subset), 0, 0, "0", 0, I64, false, NULL, NULL,
     "use only the first N training samples (0: all)"},
    {"data.val_split", MATCH, K_INT, F(data.val_split), 0, 0, "0", 0, I64, false, NULL, NULL,
     "hold out N training samples for validation (the same ones on every rank and world size: the last N of a "
     "permutation drawn from train.seed; 0: none)"},
    {"data.test_subset", MAY, K_INT, F(data.test_subset), 0, 0, "0", 0, I64, false, NULL, NULL,
     "use only the first N test samples (0: all)"},
    {"data.erasing", MATCH, K_FLOAT, F(data.loader.erase_p), 0, 0, "0", 0, 1, false, NULL, NULL,
     "random erasing probability per training image (torchvision RandomErasing's p, on the normalised image; 0: off)"},
    {"data.erasing_scale", MATCH, K_FLOATLIST, F(data.loader.erase_scale), CAP(data.loader.erase_scale), F(data.n_erasing_scale),
     "[0.02, 0.33]", 0, 1, false, NULL, NULL, "random erasing: range of the erased area as a fraction of the image"},
    {"data.erasing_ratio", MATCH, K_FLOATLIST, F(data.loader.erase_ratio), CAP(data.loader.erase_ratio), F(data.n_erasing_ratio),
     "[0.3, 3.3]", 1e-6, 1e6, false, NULL, NULL, "random erasing: range of the aspect ratio (height / width) of the area"},
    {"data.erasing_value", MATCH, K_CHOICE, F(data.erasing_value), SZ(data.erasing_value), 0, "0", 0, 0, false, NULL,
     check_erasing_value, "random erasing: the value written (after normalisation): a number | random (N(0, 1) per pixel)"},
    /* optim */
    {"optim.name", MATCH, K_ENUM, F(optim.opt.kind), SZ(optim.opt.kind), 0, "sgd", 0, 0, false, &rt_optim_kind_names, NULL,
     "the optimizer (docs/optim.md)"},
    {"optim.lr", MATCH, K_FLOAT, F(optim.opt.lr), 0, 0, "auto", 0, INF, true, NULL, NULL,
     "base learning rate; auto: 0.1 for sgd, 1e-3 for adam and adamw, 1.0 for adadelta"},
    {"optim.momentum", MATCH, K_FLOAT, F(optim.opt.momentum), 0, 0, "0", 0, 1, false, NULL, NULL, "SGD momentum"},
    {"optim.dampening", MATCH, K_FLOAT, F(optim.opt.dampening), 0, 0, "0", 0, 1, false, NULL, NULL, "SGD dampening"},
    {"optim.nesterov", MATCH, K_BOOL, F(optim.opt.nesterov), 0, 0, "false", 0, 0, false, NULL, NULL,
     "SGD Nesterov momentum (needs momentum > 0 and dampening 0)"},
    {"optim.weight_decay", MATCH, K_FLOAT, F(optim.opt.weight_decay), 0, 0, "auto", 0, INF, true, NULL, NULL,
     "L2 (sgd, adam) or decoupled (adamw) weight decay; auto: 0, adamw 1e-2"},
    {"optim.betas", MATCH, K_FLOATLIST, F(optim.opt.betas), CAP(optim.opt.betas), F(optim.n_betas), "[0.9, 0.999]", 0,
     0.999999999, false, NULL, NULL, "Adam/AdamW betas [beta1, beta2]"},
    {"optim.eps", MATCH, K_FLOAT, F(optim.opt.eps), 0, 0, "auto", 0, INF, true, NULL, NULL,
     "Adam/AdamW/Adadelta epsilon; auto: 1e-8 (adam, adamw), 1e-6 (adadelta)"},
    {"optim.rho", MATCH, K_FLOAT, F(optim.opt.rho), 0, 0, "0.9", 0, 1, false, NULL, NULL,
     "Adadelta: decay of the running averages of squared gradients and updates"},
    {"optim.amsgrad", MATCH, K_BOOL, F(optim.opt.amsgrad), 0, 0, "false", 0, 0, false, NULL, NULL, "Adam/AdamW AMSGrad"},
    {"optim.no_decay_bn_bias", MATCH, K_BOOL, F(optim.no_decay_bn_bias), 0, 0, "false", 0, 0, false, NULL, NULL,
     "no weight decay on batch-norm parameters and biases"},
    {"optim.clip_grad_norm", MATCH, K_FLOAT, F(optim.clip_grad_norm), 0, 0, "0", 0, INF, false, NULL, NULL,
     "clip the global gradient norm to this value (0: off)"},
    {"optim.schedule", MATCH, K_ENUM, F(optim.sched.kind), SZ(optim.sched.kind), 0, "constant", 0, 0, false, &rt_sched_kind_names, NULL,
     "the learning-rate schedule (docs/optim.md)"},
    {"optim.interval", MATCH, K_ENUM, F(optim.sched.per_epoch), SZ(optim.sched.per_epoch), 0, "iteration", 0, 0, false, &rt_sched_interval_names, NULL,
     "the unit the schedule counts in"},
    {"optim.step_size", MATCH, K_INT, F(optim.sched.step_size), 0, 0, "1", 1, I64, false, NULL, NULL, "step: decay every N units"},
    {"optim.gamma", MATCH, K_FLOAT, F(optim.sched.gamma), 0, 0, "0.1", 0, INF, false, NULL, NULL, "step, multistep: decay factor"},
    {"optim.milestones", MATCH, K_INTLIST, F(optim.sched.milestones), CAP(optim.sched.milestones), F(optim.sched.n_milestones), "[]", 0, I64,
     false, NULL, NULL, "multistep: increasing unit counts where the lr is multiplied by gamma"},
    {"optim.t_max", MATCH, K_INT, F(optim.sched.t_max), 0, 0, "auto", 1, I64, true, NULL, NULL,
     "cosine: period in units after the warmup; auto: the rest of the run"},
    {"optim.eta_min", MATCH, K_FLOAT, F(optim.sched.eta_min), 0, 0, "0", 0, INF, false, NULL, NULL, "cosine: final lr"},
    {"optim.warmup_steps", MATCH, K_INT, F(optim.sched.warmup_steps), 0, 0, "0", 0, I64, false, NULL, NULL,
     "linear warmup over the first N units (not with onecycle)"},
    {"optim.warmup_start_factor", MATCH, K_FLOAT, F(optim.sched.warmup_start_factor), 0, 0, "0.3333333333333333", 1e-12, 1, false,
     NULL, NULL, "warmup starts at lr * this factor (LinearLR's start_factor)"},
    {"optim.max_lr", MATCH, K_FLOAT, F(optim.sched.max_lr), 0, 0, "auto", 0, INF, true, NULL, NULL, "onecycle: peak lr; auto: lr"},
    {"optim.total_steps", MATCH, K_INT, F(optim.sched.total_steps), 0, 0, "auto", 1, I64, true, NULL, NULL,
     "onecycle: length in units; auto: the run's"},
    {"optim.pct_start", MATCH, K_FLOAT, F(optim.sched.pct_start), 0, 0, "0.3", 0, 1, false, NULL, NULL,
     "onecycle: share of the cycle spent increasing the lr"},
    {"optim.anneal", MATCH, K_ENUM, F(optim.sched.anneal_linear), SZ(optim.sched.anneal_linear), 0, "cos", 0, 0, false, &rt_sched_anneal_names, NULL,
     "onecycle: the annealing strategy"},
    {"optim.div_factor", MATCH, K_FLOAT, F(optim.sched.div_factor), 0, 0, "25", 1e-12, INF, false, NULL, NULL,
     "onecycle: initial lr = max_lr / div_factor"},
    {"optim.final_div_factor", MATCH, K_FLOAT, F(optim.sched.final_div_factor), 0, 0, "1e4", 1e-12, INF, false, NULL, NULL,
     "onecycle: final lr = initial lr / final_div_factor"},
    {"optim.three_phase", MATCH, K_BOOL, F(optim.sched.three_phase), 0, 0, "false", 0, 0, false, NULL, NULL, "onecycle: three phases"},
    {"optim.cycle_momentum", MATCH, K_BOOL, F(optim.sched.cycle_momentum), 0, 0, "true", 0, 0, false, NULL, NULL,
     "onecycle: cycle momentum (SGD) or beta1 (Adam) inversely to the lr"},
    {"optim.base_momentum", MATCH, K_FLOAT, F(optim.sched.base_momentum), 0, 0, "0.85", 0, 1, false, NULL, NULL,
     "onecycle: lowest momentum"},
    {"optim.max_momentum", MATCH, K_FLOAT, F(optim.sched.max_momentum), 0, 0, "0.95", 0, 1, false, NULL, NULL,
     "onecycle: highest momentum"},
    /* train */
    {"train.epochs", MAY, K_INT, F(train.epochs), 0, 0, "1", 0, 1000000, false, NULL, NULL, "passes over the training set"},
    {"train.accumulate", MAY, K_INT, F(train.accumulate), 0, 0, "1", 1, 1 << 20, false, NULL, NULL,
     "gradient accumulation: each rank computes its batch as K micro-batches of batch_size / (world_size * K) and "
     "all-reduces once, during the K-th backward (data.batch_size stays the optimizer step's global batch; may change "
     "on resume, which keeps the global batch)"},
    {"train.max_steps", MAY, K_INT, F(train.max_steps), 0, 0, "0", 0, I64, false, NULL, NULL,
     "stop after N optimizer steps (0: no limit; smoke runs); auto schedule lengths still fit train.epochs"},
    {"train.eval_every", MAY, K_INT, F(train.eval_every), 0, 0, "1", 0, 1000000, false, NULL, NULL,
     "evaluate every N epochs (0: only at the end; always at the end)"},
    {"train.seed", MATCH, K_INT, F(train.seed), 0, 0, "0", 0, I64, false, NULL, NULL,
     "initialisation, shuffling, augmentation and dropout"},
    {"train.device", NEVER, K_CHOICE, F(train.device), SZ(train.device), 0, "auto", 0, 0, false, NULL, check_device,
     "auto | cpu | cuda | cuda:N (auto: GPU LOCAL_RANK % count when one answers, else the CPU)"},
    {"train.precision", MAY, K_ENUM, F(train.ctx.precision), SZ(train.ctx.precision), 0, "fp32", 0, 0, false, &rt_precision_names, NULL,
     "arithmetic of convolutions and linear layers (tf32: GPU tensor cores; bf16: docs/model.md)"},
    {"train.threads", NEVER, K_INT, F(train.ctx.threads), SZ(train.ctx.threads), 0, "auto", 1, 1024, true, NULL, NULL,
     "CPU threads per rank; auto: the cores divided among the local ranks"},
    {"train.skip_nonfinite", MAY, K_BOOL, F(train.skip_nonfinite), 0, 0, "false", 0, 0, false, NULL, NULL,
     "skip a step whose loss or gradient is not finite instead of stopping"},
    {"train.deterministic", MAY, K_BOOL, F(train.ctx.deterministic), 0, 0, "true", 0, 0, false, NULL, NULL,
     "GPU: only deterministic cuDNN convolution algorithms, the choice kept in the checkpoint (exact resume)"},
    {"train.cudnn_benchmark", MAY, K_BOOL, F(train.ctx.benchmark), 0, 0, "false", 0, 0, false, NULL, NULL,
     "GPU: rank 0 times the cuDNN convolution algorithms train.deterministic allows and takes the fastest (false: "
     "cuDNN's heuristics, untimed); kept in the checkpoint as any choice, but two fresh runs may differ"},
    {"train.cuda_graphs", MAY, K_ENUM, F(train.cuda_graphs), SZ(train.cuda_graphs), 0, "auto", 0, 0, false, &k_graphs,
     NULL,
     "GPU: capture the steady training step in CUDA graphs and replay it (the same bits, fewer host calls); auto: "
     "where every part can be captured, on: an error where one cannot, off: never (docs/gpu.md)"},
    {"train.label_smoothing", MATCH, K_FLOAT, F(train.label_smoothing), 0, 0, "0", 0, 1, false, NULL, NULL,
     "label smoothing of the training loss (CrossEntropyLoss(label_smoothing=); resnet only; evaluation reports plain "
     "cross-entropy)"},
    {"train.ema_decay", MATCH, K_FLOAT, F(optim.opt.ema_decay), 0, 0, "0", 0, 0.999999999, false, NULL, NULL,
     "moving average of the parameters (AveragedModel with an EMA avg_fn; BN buffers are the model's): evaluation and "
     "model.safetensors use it (0: off)"},
    {"train.ema_every", MATCH, K_INT, F(optim.opt.ema_every), 0, 0, "1", 1, I64, false, NULL, NULL,
     "update the moving average every N optimizer steps"},
    {"train.ema_warmup", MATCH, K_BOOL, F(optim.opt.ema_warmup), 0, 0, "true", 0, 0, false, NULL, NULL,
     "the decay of the n-th update is min(ema_decay, (1 + n) / (10 + n)), so the first weights fade fast (false: "
     "ema_decay from the start)"},
    {"train.early_stop", MAY, K_ENUM, F(train.early_stop), SZ(train.early_stop), 0, "none", 0, 0, false,
     &rt_monitor_names, NULL,
     "stop when this evaluation metric has not improved by more than early_stop_min_delta in early_stop_patience "
     "evaluations (none: never)"},
    {"train.early_stop_patience", MAY, K_INT, F(train.early_stop_patience), 0, 0, "3", 1, 1000000, false, NULL, NULL,
     "early stop: evaluations without an improvement before the run stops"},
    {"train.early_stop_min_delta", MAY, K_FLOAT, F(train.early_stop_min_delta), 0, 0, "0", 0, INF, false, NULL, NULL,
     "early stop: an improvement is a change of the metric by more than this (accuracy as a fraction 0..1)"},
    /* eval */
    {"eval.tta", MAY, K_ENUM, F(train.tta_flip), SZ(train.tta_flip), 0, "none", 0, 0, false, &k_tta, NULL,
     "test-time augmentation in evaluation (flip: the mean of the logits of each image and its mirror); "
     "`train.tta` is read as this key"},
    /* dist */
    {"dist.nproc", NEVER, K_INT, F(dist.nproc), 0, 0, "auto", 1, 1024, true, NULL, NULL,
     "ranks on this node; auto: one per local GPU, else 2 on the CPU"},
    {"dist.init_method", NEVER, K_STR, F(dist.init_method), SZ(dist.init_method), 0, "env://", 0, 0, false, NULL, NULL,
     "rendezvous of the ranks: env:// (MASTER_ADDR, MASTER_PORT: torchrun, ringtrain) | tcp://HOST:PORT | "
     "file:///PATH (e.g. under mpirun)"},
    {"dist.nnodes", NEVER, K_INT, F(dist.nnodes), 0, 0, "1", 1, 65536, false, NULL, NULL, "nodes (torchrun's --nnodes)"},
    {"dist.node_rank", NEVER, K_INT, F(dist.node_rank), 0, 0, "0", 0, 65535, false, NULL, NULL,
     "this node's index (torchrun's --node-rank)"},
    {"dist.master_addr", NEVER, K_STR, F(dist.master_addr), SZ(dist.master_addr), 0, "127.0.0.1", 0, 0, false, NULL, NULL,
     "address of node 0 (torchrun's --master-addr)"},
    {"dist.master_port", NEVER, K_INT, F(dist.master_port), 0, 0, "0", 0, 65535, false, NULL, NULL,
     "port of node 0 (0: a free port, single node only)"},
    {"dist.algo", NEVER, K_ENUM, F(dist.pg.algo), SZ(dist.pg.algo), 0, "ring", 0, 0, false, &rt_algo_names, NULL,
     "gradient all-reduce algorithm (docs/comm-algorithms.md)"},
    {"dist.transport", NEVER, K_ENUM, F(dist.pg.transport), SZ(dist.pg.transport), 0, "auto", 0, 0, false, &rt_transport_names, NULL,
     "transport between ranks (auto: shm on one host, nccl between GPUs, else tcp)"},
    {"dist.compress", NEVER, K_ENUM, F(dist.compress_bf16), SZ(dist.compress_bf16), 0, "none", 0, 0, false, &rt_compress_names, NULL,
     "gradient compression (bf16: all-reduced in bf16, DDP's bf16_compress_hook; CPU and GPU)"},
    {"dist.bucket_mb", NEVER, K_FLOAT, F(dist.bucket_mb), 0, 0, "25", 0, 1e6, false, NULL, NULL,
     "gradient bucket size in MiB (0: one all-reduce after backward)"},
    {"dist.first_bucket_mb", NEVER, K_FLOAT, F(dist.first_bucket_mb), 0, 0, "1", 0, 1e6, false, NULL, NULL,
     "size of the first bucket, small so communication starts early (DDP's)"},
    {"dist.check_sync_every", NEVER, K_INT, F(dist.check_sync_every), 0, 0, "0", 0, I64, false, NULL, NULL,
     "every N steps check that all ranks hold identical parameters (0: never)"},
    {"dist.timeout_s", NEVER, K_FLOAT, F(dist.pg.timeout_s), 0, 0, "300", 0.001, 1e8, false, NULL, NULL,
     "a peer silent this long is an error naming it (default: RINGTRAIN_DIST_TIMEOUT when set, else 300)"},
    {"dist.debug", NEVER, K_BOOL, F(dist.pg.debug), 0, 0, "false", 0, 0, false, NULL, NULL,
     "check every collective's call (op, count, dtype, root) across ranks before it runs (slow; default: "
     "RINGTRAIN_DIST_DEBUG, or TORCH_DISTRIBUTED_DEBUG=DETAIL)"},
    {"dist.max_restarts", NEVER, K_INT, F(dist.max_restarts), 0, 0, "0", 0, 1000000, false, NULL, NULL,
     "the launcher restarts the job from its newest checkpoint after a rank failed, at most N times "
     "(torchrun's --max-restarts)"},
    /* checkpoint */
    {"checkpoint.dir", NEVER, K_STR, F(checkpoint.dir), SZ(checkpoint.dir), 0, "auto", 0, 0, false, NULL, NULL,
     "where ckpt-<step>/ folders go; auto: RUN_DIR/checkpoints"},
    {"checkpoint.every_steps", NEVER, K_INT, F(checkpoint.every_steps), 0, 0, "0", 0, I64, false, NULL, NULL,
     "save every N steps (0: off)"},
    {"checkpoint.every_epochs", NEVER, K_INT, F(checkpoint.every_epochs), 0, 0, "1", 0, 1000000, false, NULL, NULL,
     "save every N epochs (0: off); one is always saved at the end"},
    {"checkpoint.keep_last", NEVER, K_INT, F(checkpoint.keep_last), 0, 0, "3", 0, 1000000, false, NULL, NULL,
     "keep the newest N checkpoints (0: all)"},
    {"checkpoint.keep_best", NEVER, K_ENUM, F(checkpoint.keep_best), SZ(checkpoint.keep_best), 0, "auto", 0, 0, true,
     &rt_monitor_names, NULL,
     "keep the checkpoint of the best evaluation by this metric in DIR/best/ (never pruned); auto: val_acc with "
     "data.val_split, else none"},
    {"checkpoint.every_minutes", NEVER, K_FLOAT, F(checkpoint.every_minutes), 0, 0, "0", 0, 1e9, false, NULL, NULL,
     "save after M minutes of training since the last checkpoint (rank 0's clock, agreed with the step; 0: off)"},
    {"checkpoint.resume", NEVER, K_STR, F(checkpoint.resume), SZ(checkpoint.resume), 0, "auto", 0, 0, false, NULL, NULL,
     "auto (the newest complete checkpoint, if any) | none | PATH"},
    {"checkpoint.overwrite", NEVER, K_BOOL, F(checkpoint.overwrite), 0, 0, "false", 0, 0, false, NULL, NULL,
     "resume none in a folder holding checkpoints: move them aside into DIR/old-<run id>/ (false: refuse)"},
    {"checkpoint.allow_changes", NEVER, K_STRLIST, F(checkpoint.allow_changes), CAP(checkpoint.allow_changes),
     F(checkpoint.n_allow_changes), "[]", 0, 0, false, NULL, NULL,
     "keys a resume may change from the checkpoint's config (e.g. [optim.lr]); others are refused"},
    /* log */
    {"log.dir", NEVER, K_STR, F(log.dir), SZ(log.dir), 0, "auto", 0, 0, false, NULL, NULL,
     "the run directory (metrics.jsonl, config.yaml, checkpoints); auto: runs/<config file name>"},
    {"log.every_steps", NEVER, K_INT, F(log.every_steps), 0, 0, "50", 1, I64, false, NULL, NULL,
     "a plain progress line every N steps when the output is not a terminal"},
    {"log.all_ranks", NEVER, K_BOOL, F(log.all_ranks), 0, 0, "false", 0, 0, false, NULL, NULL,
     "every rank writes metrics-rank<R>.jsonl too (to find stragglers)"},
    {"log.trace", NEVER, K_BOOL, F(log.trace), 0, 0, "false", 0, 0, false, NULL, NULL,
     "every rank records a timeline to RUN_DIR/trace-rank<R>.jsonl (ringtrain trace merges them; docs/debugging.md)"},
    {"log.tensorboard", NEVER, K_BOOL, F(log.tensorboard), 0, 0, "false", 0, 0, false, NULL, NULL,
     "rank 0 writes the run's scalars to a TensorBoard event file RUN_DIR/events.out.tfevents.* (docs/train.md)"},
    {"log.level", NEVER, K_ENUM, F(log.level), SZ(log.level), 0, "info", 0, 0, false, &rt_log_level_names, NULL,
     "log level (default: RINGTRAIN_LOG_LEVEL when set)"},
    {"log.progress", NEVER, K_ENUM, F(log.progress), SZ(log.progress), 0, "auto", 0, 0, false, &k_progress, NULL,
     "progress bar (auto: on a terminal)"},
};
/* clang-format on */
enum { N_KEYS = (int)(sizeof k_keys / sizeof k_keys[0]) };

static const char *const k_sections[] = {"model", "data", "optim", "train", "eval", "dist", "checkpoint", "log"};
enum { N_SECTIONS = (int)(sizeof k_sections / sizeof k_sections[0]) };

static const char *const k_type_names[] = {"int",   "float",          "bool",     "string", "choice",
                                           "[int]", "[float, float]", "[string]", "choice"};

bool rt_config_key_at(int i, const char **name, const char **type, const char **def, const char **doc) {
    if (i < 0 || i >= N_KEYS) return false;
    if (name) *name = k_keys[i].name;
    if (type) *type = k_type_names[k_keys[i].type];
    if (def) *def = k_keys[i].def;
    if (doc) *doc = k_keys[i].doc;
    return true;
}

/* ---- "did you mean" ------------------------------------------------------------------ */

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1; /* transposition */
            d[i][j] = c;
        }
    return d[la][lb];
}

/* The closest key to `full` ("section.key"), or NULL if none is close. Also tries the
 * same key name in another section (a key put under the wrong section). */
static const char *suggest_key(const char *full) {
    const char *best = NULL;
    int best_d = 3;
    const char *dot = strchr(full, '.');
    for (int i = 0; i < N_KEYS; i++) {
        int d = edit_distance(full, k_keys[i].name);
        if (dot && strcmp(dot, strchr(k_keys[i].name, '.')) == 0 && d > 1) d = 1;
        if (d < best_d) best_d = d, best = k_keys[i].name;
    }
    return best;
}

static const char *suggest_section(const char *s) {
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < N_SECTIONS; i++) {
        int d = edit_distance(s, k_sections[i]);
        if (d < best_d) best_d = d, best = k_sections[i];
    }
    return best;
}

static const key *find_key(const char *full) {
    if (strcmp(full, "train.tta") == 0) full = "eval.tta"; /* its name before the eval section */
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(k_keys[i].name, full) == 0) return &k_keys[i];
    return NULL;
}

/* ---- values ------------------------------------------------------------------------ */

/* `where` is "file:line: " or "override 'x=y': " (for the message). */
static rt_status parse_int(const key *k, const char *where, const char *v, int64_t *out) {
    if (k->allow_auto && strcasecmp(v, "auto") == 0) {
        *out = RT_CONFIG_AUTO;
        return RT_OK;
    }
    char *end;
    errno = 0;
    /* decimal, or hex with 0x (docs/config.md): base 0 would read 010 as octal 8 */
    const char *digits = v + (*v == '-' || *v == '+');
    int base = digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X') ? 16 : 10;
    long long x = strtoll(v, &end, base);
    if (end == v || *end || errno)
        return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not an integer%s", where, k->name, v,
                        k->allow_auto ? " (or auto)" : "");
    if ((double)x < k->lo || (double)x > k->hi)
        return RT_ERROR(RT_ERR_INVALID, "%s%s: %lld is out of range (expected %.0f..%.0f)", where, k->name, x, k->lo,
                        k->hi);
    *out = (int64_t)x;
    return RT_OK;
}

static rt_status parse_float(const key *k, const char *where, const char *v, double *out) {
    if (k->allow_auto && strcasecmp(v, "auto") == 0) {
        *out = NAN;
        return RT_OK;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !isfinite(x))
        return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not a finite number%s", where, k->name, v,
                        k->allow_auto ? " (or auto)" : "");
    if (x < k->lo || x > k->hi)
        return RT_ERROR(RT_ERR_INVALID, "%s%s: %g is out of range (expected %g..%g)", where, k->name, x, k->lo, k->hi);
    *out = x;
    return RT_OK;
}

static rt_status parse_bool(const key *k, const char *where, const char *v, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) return *out = true, RT_OK;
        if (strcasecmp(v, no[i]) == 0) return *out = false, RT_OK;
    }
    return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not a boolean (expected true or false)", where, k->name, v);
}

/* "auto | a | b": the names a choice key accepts (its table's, after "auto" where the key
 * takes it); "" for a key that is not a name of a table. */
static const char *choice_list(const key *k, char *buf, size_t n) {
    if (n) buf[0] = '\0';
    if (!k->names) return buf;
    if (k->allow_auto) rt_names_append(buf, n, "auto");
    size_t len = strlen(buf);
    char rest[512];
    rt_names_list(k->names, rest, sizeof rest);
    snprintf(buf + len, n - len, "%s%s", len && *rest ? " | " : "", rest);
    return buf;
}

/* The value `v` names in k's table (core's rt_names_index, ASCII case-insensitive), or
 * RT_CONFIG_AUTO for "auto" where the key takes it; the one error format of core/names.h. */
static rt_status choice_index(const key *k, const char *where, const char *v, int *out) {
    if (k->allow_auto && strcasecmp(v, "auto") == 0) {
        *out = RT_CONFIG_AUTO;
        return RT_OK;
    }
    *out = rt_names_index(k->names, v);
    if (*out >= 0) return RT_OK;
    char list[512];
    return RT_ERROR(RT_ERR_INVALID, "%s%s: unknown %s '%s' (expected %s)", where, k->name, k->names->what, v,
                    choice_list(k, list, sizeof list));
}

/* K_ENUM: the index held in the field (size 1: a bool; else an int or an enum). */
static int enum_get(const key *k, const void *base) {
    return k->size == sizeof(bool) ? (int)*(const bool *)base : *(const int *)base;
}
static void enum_set(const key *k, void *base, int v) {
    if (k->size == sizeof(bool))
        *(bool *)base = v != 0;
    else
        *(int *)base = v;
}

/* The name (or "auto") a K_ENUM field holds, as files say it. */
static const char *enum_name(const key *k, const void *base) {
    int i = enum_get(k, base);
    if (k->allow_auto && i == RT_CONFIG_AUTO) return "auto";
    const char *name = rt_names_name(k->names, i);
    return name ? name : "?";
}

static rt_status parse_enum(const key *k, const char *where, const char *v, void *dst) {
    int i = 0;
    rt_status st = choice_index(k, where, v, &i);
    if (st == RT_OK) enum_set(k, dst, i);
    return st;
}

static rt_status parse_choice(rt_config *cfg, const key *k, const char *where, const char *v, char *dst) {
    size_t n = strlen(v);
    if (n >= k->size) return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is too long", where, k->name, v);
    rt_error_clear();
    if (k->check(cfg, v) != RT_OK) {
        char why[512] = "";
        if (rt_error_status() != RT_OK) {
            snprintf(why, sizeof why, "%s", rt_error_message());
            char *loc = strstr(why, " (src/");
            if (loc) *loc = '\0';
            char *nl = strchr(why, '\n');
            if (nl) *nl = '\0';
        }
        rt_error_clear();
        return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not accepted%s%s", where, k->name, v, *why ? ": " : "", why);
    }
    for (size_t i = 0; i <= n; i++) dst[i] = (char)((v[i] >= 'A' && v[i] <= 'Z') ? v[i] - 'A' + 'a' : v[i]);
    return RT_OK;
}

/* Set key k of cfg from a scalar text. */
static rt_status set_scalar(rt_config *cfg, const key *k, const char *where, const char *v) {
    char *base = (char *)cfg + k->off;
    switch (k->type) {
    case K_INT: {
        int64_t x = 0;
        rt_status st = parse_int(k, where, v, &x);
        if (st != RT_OK) return st;
        if (k->size == sizeof(int))
            *(int *)base = (int)x; /* an int field of an area's struct: the range fits it */
        else
            *(int64_t *)base = x;
        return RT_OK;
    }
    case K_FLOAT:
        return parse_float(k, where, v, (double *)base);
    case K_BOOL:
        return parse_bool(k, where, v, (bool *)base);
    case K_STR:
        if (!*v) return RT_ERROR(RT_ERR_INVALID, "%s%s: empty (expected a value)", where, k->name);
        if (strncmp(v, "~/", 2) == 0 && (strstr(k->name, "path") || strstr(k->name, "dir"))) {
            /* a path written as in a shell: ~/ is $HOME/ */
            const char *home = rt_setting_text(RT_SET_HOME);
            RT_REQUIRE(home, RT_ERR_INVALID, "%s%s: '%s' starts with ~/ but HOME is not set", where, k->name, v);
            RT_REQUIRE(strlen(home) + strlen(v) < k->size, RT_ERR_INVALID, "%s%s: path too long", where, k->name);
            snprintf(base, k->size, "%s%s", home, v + 1);
            return RT_OK;
        }
        if (strlen(v) >= k->size)
            return RT_ERROR(RT_ERR_INVALID, "%s%s: %zu characters (at most %zu)", where, k->name, strlen(v),
                            k->size - 1);
        snprintf(base, k->size, "%s", v);
        return RT_OK;
    case K_CHOICE:
        return parse_choice(cfg, k, where, v, base);
    case K_ENUM:
        return parse_enum(k, where, v, base);
    case K_INTLIST:
    case K_FLOATLIST:
    case K_STRLIST:
        return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not a list (expected [a, b, ...])", where, k->name, v);
    }
    return RT_ERROR(RT_ERR_INTERNAL, "key type %d", (int)k->type);
}

/* Set a list key from its items (texts). */
static rt_status set_list(rt_config *cfg, const key *k, const char *where, int n, const char *const *items) {
    char *base = (char *)cfg + k->off;
    int *count = (int *)((char *)cfg + k->count_off);
    if (n > (int)k->size) return RT_ERROR(RT_ERR_INVALID, "%s%s: %d items (at most %zu)", where, k->name, n, k->size);
    if (k->type == K_FLOATLIST && n != (int)k->size)
        return RT_ERROR(RT_ERR_INVALID, "%s%s: %d items (expected %zu)", where, k->name, n, k->size);
    for (int i = 0; i < n; i++) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s[%d]", k->name, i);
        key ki = *k;
        ki.name = sub;
        ki.allow_auto = false;
        if (k->type == K_STRLIST) {
            char(*strs)[RT_CONFIG_NAME_MAX] = (char(*)[RT_CONFIG_NAME_MAX])base;
            if (!*items[i] || strlen(items[i]) >= RT_CONFIG_NAME_MAX)
                return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' (expected 1 to %d characters)", where, sub, items[i],
                                RT_CONFIG_NAME_MAX - 1);
            /* the one list of names, checkpoint.allow_changes: config keys, checked here so a
             * misspelled one is an error of this line, not only of a later resume */
            if (!find_key(items[i]))
                return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not a config key (see docs/config.md)", where, sub,
                                items[i]);
            snprintf(strs[i], RT_CONFIG_NAME_MAX, "%s", items[i]);
        } else if (k->type == K_INTLIST) {
            RT_CHECK(parse_int(&ki, where, items[i], (int64_t *)base + i));
            if (i > 0 && ((int64_t *)base)[i] <= ((int64_t *)base)[i - 1])
                return RT_ERROR(RT_ERR_INVALID, "%s%s: %s after %lld (expected increasing values)", where, sub,
                                items[i], (long long)((int64_t *)base)[i - 1]);
        } else {
            RT_CHECK(parse_float(&ki, where, items[i], (double *)base + i));
        }
    }
    *count = n;
    return RT_OK;
}

/* A list written inline as text: "[1, 2, 3]", "1,2,3" or "" / "[]". */
static rt_status set_list_text(rt_config *cfg, const key *k, const char *where, const char *v) {
    char buf[1024];
    if (strlen(v) >= sizeof buf) return RT_ERROR(RT_ERR_INVALID, "%s%s: value too long", where, k->name);
    snprintf(buf, sizeof buf, "%s", v);
    char *s = buf;
    while (*s == ' ') s++;
    size_t len = strlen(s);
    while (len && s[len - 1] == ' ') s[--len] = '\0';
    if (*s == '[') {
        if (len < 2 || s[len - 1] != ']')
            return RT_ERROR(RT_ERR_INVALID, "%s%s: '%s' is not a list (expected [a, b, ...])", where, k->name, v);
        s[len - 1] = '\0';
        s++;
    }
    const char *items[RT_CONFIG_MAX_LIST + 1];
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        size_t tl = strlen(t);
        while (tl && t[tl - 1] == ' ') t[--tl] = '\0';
        if (!*t) return RT_ERROR(RT_ERR_INVALID, "%s%s: empty item in '%s'", where, k->name, v);
        if (n > RT_CONFIG_MAX_LIST)
            return RT_ERROR(RT_ERR_INVALID, "%s%s: more than %d items", where, k->name, RT_CONFIG_MAX_LIST);
        items[n++] = t;
    }
    return set_list(cfg, k, where, n, items);
}

static rt_status set_text(rt_config *cfg, const key *k, const char *where, const char *v) {
    if (k->type == K_INTLIST || k->type == K_FLOATLIST || k->type == K_STRLIST) return set_list_text(cfg, k, where, v);
    return set_scalar(cfg, k, where, v);
}

/* What is wrong with the shape of row k (the parsers and writers rely on it); NULL if nothing. */
static const char *row_problem(const key *k) {
    if (k->type == K_ENUM && !(k->names && ((k->size == sizeof(int) && k->names->count > 0) ||
                                            (k->size == sizeof(bool) && k->names->count == 2))))
        return "a K_ENUM key needs a table and an int (or enum) field, or a bool for a table of two names";
    if (k->type == K_INT && k->size != 0 && !(k->size == sizeof(int) && k->lo >= INT_MIN && k->hi <= INT_MAX))
        return "a K_INT field is an int64_t (size 0) or an int whose range fits";
    if (k->type == K_CHOICE && !k->check) return "a K_CHOICE key needs a check";
    return NULL;
}

/* model.stem auto is held as the model's RT_STEM_AUTO */
_Static_assert(RT_STEM_AUTO == RT_CONFIG_AUTO, "model.stem auto");

/* The fields of the areas' option structs that are not keys hold their area's defaults:
 * the model's input shape (the trainer sets it), the process group's run-time fields
 * and the flight recorder's size (its setting; a bad value of a setting is
 * rt_config_apply_env's error, reported by rt_config_load). */
static void area_defaults(rt_config *cfg) {
    rt_model_config_default(&cfg->model);
    (void)rt_pg_options_default(&cfg->dist.pg); /* its error, if any, is dropped by rt_config_default */
}

void rt_config_default(rt_config *cfg) {
    /* defaulting is not an error of the caller's: whatever error it has pending survives
     * (a bad setting, or a choice check on the way, records its own and is dropped) */
    rt_error_record pending;
    rt_error_save(&pending);
    memset(cfg, 0, sizeof *cfg);
    area_defaults(cfg);
    for (int i = 0; i < N_KEYS; i++) {
        const key *k = &k_keys[i];
        const char *bad = row_problem(k);
        rt_status s = bad ? RT_ERROR(RT_ERR_INTERNAL, "%s: %s", k->name, bad) : set_text(cfg, k, "default: ", k->def);
        if (s != RT_OK) { /* a bug in the table: loud in every test */
            fprintf(stderr, "ringtrain: internal error: %s\n", rt_error_message());
            abort();
        }
    }
    rt_error_restore(&pending);
}

/* ---- YAML -------------------------------------------------------------------------- */

static const char *scalar(yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static rt_status parse_section(rt_config *cfg, yaml_document_t *doc, const char *name, const char *sect,
                               yaml_node_t *map) {
    char where[RT_CONFIG_PATH_MAX + 32];
    if (map->type != YAML_MAPPING_NODE) {
        if (map->type == YAML_SCALAR_NODE && !*scalar(map)) return RT_OK; /* "section:" with nothing under it */
        return RT_ERROR(RT_ERR_INVALID, "%s:%zu: %s: expected a mapping of keys (key: value)", name,
                        (size_t)map->start_mark.line + 1, sect);
    }
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key), *vn = yaml_document_get_node(doc, p->value);
        size_t line = (size_t)kn->start_mark.line + 1;
        snprintf(where, sizeof where, "%s:%zu: ", name, line);
        if (kn->type != YAML_SCALAR_NODE)
            return RT_ERROR(RT_ERR_INVALID, "%s%s: a key must be a plain name", where, sect);
        char full[160];
        snprintf(full, sizeof full, "%s.%s", sect, scalar(kn));
        const key *k = find_key(full);
        if (!k) {
            const char *s = suggest_key(full);
            return RT_ERROR(RT_ERR_INVALID, "%s%s: unknown key%s%s%s", where, full, s ? " (did you mean " : "",
                            s ? s : "", s ? "?)" : " (see docs/config.md)");
        }
        /* a key given twice in one section is an error, not a silent override */
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
            if (strcmp(scalar(yaml_document_get_node(doc, q->key)), scalar(kn)) == 0)
                return RT_ERROR(RT_ERR_INVALID, "%s%s: given twice (first on line %zu)", where, full,
                                (size_t)yaml_document_get_node(doc, q->key)->start_mark.line + 1);
        snprintf(where, sizeof where, "%s:%zu: ", name, (size_t)vn->start_mark.line + 1);
        if (vn->type == YAML_SEQUENCE_NODE) {
            if (k->type != K_INTLIST && k->type != K_FLOATLIST && k->type != K_STRLIST)
                return RT_ERROR(RT_ERR_INVALID, "%s%s: a list where a single %s is expected", where, full,
                                k_type_names[k->type]);
            const char *items[RT_CONFIG_MAX_LIST + 1];
            int n = 0;
            for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
                yaml_node_t *in = yaml_document_get_node(doc, *it);
                if (in->type != YAML_SCALAR_NODE)
                    return RT_ERROR(RT_ERR_INVALID, "%s%s: list items must be plain values", where, full);
                if (n > RT_CONFIG_MAX_LIST)
                    return RT_ERROR(RT_ERR_INVALID, "%s%s: more than %d items", where, full, RT_CONFIG_MAX_LIST);
                items[n++] = scalar(in);
            }
            RT_CHECK(set_list(cfg, k, where, n, items));
        } else if (vn->type == YAML_SCALAR_NODE) {
            if (!*scalar(vn) && vn->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
                return RT_ERROR(RT_ERR_INVALID, "%s%s: no value (expected a %s)", where, full, k_type_names[k->type]);
            RT_CHECK(set_text(cfg, k, where, scalar(vn)));
        } else {
            return RT_ERROR(RT_ERR_INVALID, "%s%s: a mapping where a %s is expected", where, full,
                            k_type_names[k->type]);
        }
    }
    return RT_OK;
}

rt_status rt_config_parse_text(rt_config *cfg, const char *text, size_t len, const char *name) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return RT_ERROR(RT_ERR_NOMEM, "%s: libyaml parser init", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rt_status s =
            RT_ERROR(RT_ERR_INVALID, "%s:%zu:%zu: YAML syntax: %s%s%s", name, (size_t)parser.problem_mark.line + 1,
                     (size_t)parser.problem_mark.column + 1, parser.problem ? parser.problem : "error",
                     parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return s;
    }
    rt_status st = RT_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) goto done; /* an empty file: every default */
    if (root->type != YAML_MAPPING_NODE) {
        st = RT_ERROR(RT_ERR_INVALID,
                      "%s:%zu: expected sections (model:, data:, optim:, train:, eval:, dist:, checkpoint:, log:)",
                      name, (size_t)root->start_mark.line + 1);
        goto done;
    }
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top && st == RT_OK; p++) {
        yaml_node_t *kn = yaml_document_get_node(&doc, p->key), *vn = yaml_document_get_node(&doc, p->value);
        size_t line = (size_t)kn->start_mark.line + 1;
        const char *sect = kn->type == YAML_SCALAR_NODE ? scalar(kn) : "";
        int found = -1;
        for (int i = 0; i < N_SECTIONS; i++)
            if (strcmp(sect, k_sections[i]) == 0) found = i;
        if (found < 0) {
            const char *s = strchr(sect, '.') ? NULL : suggest_section(sect);
            if (!s && strchr(sect, '.') && find_key(sect))
                st = RT_ERROR(RT_ERR_INVALID, "%s:%zu: '%s': write it as a key of its section (%.*s:\\n  %s: ...)",
                              name, line, sect, (int)(strchr(sect, '.') - sect), sect, strchr(sect, '.') + 1);
            else
                st = RT_ERROR(RT_ERR_INVALID,
                              "%s:%zu: unknown section '%s'%s%s%s (sections: model, data, optim, train, eval, dist, "
                              "checkpoint, log)",
                              name, line, sect, s ? " (did you mean " : "", s ? s : "", s ? "?)" : "");
            break;
        }
        for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < p; q++)
            if (strcmp(scalar(yaml_document_get_node(&doc, q->key)), sect) == 0) {
                st = RT_ERROR(RT_ERR_INVALID, "%s:%zu: section '%s' given twice", name, line, sect);
                goto done;
            }
        st = parse_section(cfg, &doc, name, sect, vn);
    }
done:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

bool rt_config_is_override(const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || arg[0] == '-') return false;
    const char *dot = memchr(arg, '.', (size_t)(eq - arg));
    const char *slash = memchr(arg, '/', (size_t)(eq - arg));
    return dot && !slash;
}

rt_status rt_config_override(rt_config *cfg, const char *assignment) {
    char where[1200];
    snprintf(where, sizeof where, "override '%s': ", assignment);
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) return RT_ERROR(RT_ERR_INVALID, "%sexpected section.key=value", where);
    char full[160];
    size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof full) return RT_ERROR(RT_ERR_INVALID, "%skey too long", where);
    memcpy(full, assignment, kl);
    full[kl] = '\0';
    const key *k = find_key(full);
    if (!k) {
        if (!strchr(full, '.'))
            return RT_ERROR(RT_ERR_INVALID, "%s'%s' names no section (expected section.key=value)", where, full);
        const char *s = suggest_key(full);
        return RT_ERROR(RT_ERR_INVALID, "%s%s: unknown key%s%s%s", where, full, s ? " (did you mean " : "", s ? s : "",
                        s ? "?)" : " (see docs/config.md)");
    }
    const char *v = eq + 1;
    if (!*v && k->type != K_INTLIST && k->type != K_STRLIST)
        return RT_ERROR(RT_ERR_INVALID, "%s%s: no value (expected a %s)", where, full, k_type_names[k->type]);
    return set_text(cfg, k, where, v);
}

static rt_status read_file(const char *path, char **out, size_t *len) {
    /* a regular file, opened without blocking (a FIFO or a directory is named as such) */
    return rt_file_read_all(path, "config", (size_t)1 << 24, out, len);
}

/* Keys an environment variable sets (core/settings.h): a variable that is set replaces
 * the key's value from the config file (or the checkpoint's config); the command-line
 * overrides, applied after, win over both. One place for the rule "command line over
 * environment over config file over built-in default", as with torchrun's variables: a
 * resolved config.yaml or a checkpoint names every key, so TORCH_DISTRIBUTED_DEBUG=DETAIL
 * must still turn debug mode on for it. */
rt_status rt_config_apply_env(rt_config *cfg) {
    rt_pg_options po; /* dist's: RINGTRAIN_DIST_TIMEOUT, RINGTRAIN_DIST_DEBUG, TORCH_DISTRIBUTED_DEBUG */
    RT_CHECK(rt_pg_options_default(&po));
    if (rt_setting_is_set(RT_SET_DIST_TIMEOUT)) cfg->dist.pg.timeout_s = po.timeout_s;
    if (rt_setting_is_set(RT_SET_DIST_DEBUG) || rt_setting_is_set(RT_SET_TORCH_DEBUG)) cfg->dist.pg.debug = po.debug;
    cfg->dist.pg.flight_entries = po.flight_entries; /* a setting with no key: the environment at load time */
    int level = 0;
    RT_CHECK(rt_setting_choice(RT_SET_LOG_LEVEL, &level)); /* checks the text */
    if (rt_setting_is_set(RT_SET_LOG_LEVEL))
        RT_CHECK(rt_log_parse_level(rt_setting_text(RT_SET_LOG_LEVEL), &cfg->log.level));
    return RT_OK;
}

rt_status rt_config_load(rt_config *cfg, const char *path, int n_overrides, const char *const *overrides) {
    rt_config_default(cfg);
    if (path) {
        char *text = NULL;
        size_t len = 0;
        RT_CHECK(read_file(path, &text, &len));
        rt_status s = rt_config_parse_text(cfg, text, len, path);
        free(text);
        RT_CHECK(s);
        snprintf(cfg->source, sizeof cfg->source, "%s", path);
    }
    RT_CHECK(rt_config_apply_env(cfg));
    for (int i = 0; i < n_overrides; i++) RT_CHECK(rt_config_override(cfg, overrides[i]));
    return RT_OK;
}

/* ---- writing ----------------------------------------------------------------------- */

/* A YAML scalar that reads back as the same string. */
static void write_str(FILE *out, const char *s) {
    fputc('"', out);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

/* Key k's value as YAML text. */
static void write_value(const rt_config *cfg, const key *k, FILE *out) {
    const char *base = (const char *)cfg + k->off;
    switch (k->type) {
    case K_INT: {
        int64_t v = k->size == sizeof(int) ? *(const int *)base : *(const int64_t *)base;
        if (k->allow_auto && v == RT_CONFIG_AUTO)
            fprintf(out, "auto");
        else
            fprintf(out, "%lld", (long long)v);
        break;
    }
    case K_FLOAT: {
        double v = *(const double *)base;
        if (isnan(v))
            fprintf(out, "auto");
        else
            fprintf(out, "%.17g", v);
        break;
    }
    case K_BOOL:
        fprintf(out, "%s", *(const bool *)base ? "true" : "false");
        break;
    case K_STR:
    case K_CHOICE:
        write_str(out, base);
        break;
    case K_ENUM:
        write_str(out, enum_name(k, base));
        break;
    case K_STRLIST: {
        int n = *(const int *)((const char *)cfg + k->count_off);
        fputc('[', out);
        for (int j = 0; j < n; j++) {
            if (j) fputs(", ", out);
            write_str(out, ((const char(*)[RT_CONFIG_NAME_MAX])base)[j]);
        }
        fputc(']', out);
        break;
    }
    case K_INTLIST:
    case K_FLOATLIST: {
        int n = *(const int *)((const char *)cfg + k->count_off);
        fputc('[', out);
        for (int j = 0; j < n; j++) {
            if (k->type == K_INTLIST)
                fprintf(out, "%s%lld", j ? ", " : "", (long long)((const int64_t *)base)[j]);
            else
                fprintf(out, "%s%.17g", j ? ", " : "", ((const double *)base)[j]);
        }
        fputc(']', out);
        break;
    }
    }
}

rt_status rt_config_write(const rt_config *cfg, FILE *out) {
    const char *cur = "";
    size_t cur_len = 0;
    fprintf(out, "# ringtrain resolved config: every key, defaults and overrides applied\n");
    if (*cfg->source) fprintf(out, "# read from %s\n", cfg->source);
    for (int i = 0; i < N_KEYS; i++) {
        const key *k = &k_keys[i];
        const char *dot = strchr(k->name, '.');
        size_t sl = (size_t)(dot - k->name);
        if (cur_len != sl || strncmp(cur, k->name, sl) != 0) {
            fprintf(out, "%.*s:\n", (int)sl, k->name);
            cur = k->name;
            cur_len = sl;
        }
        fprintf(out, "  %s: ", dot + 1);
        write_value(cfg, k, out);
        fputc('\n', out);
    }
    return ferror(out) ? RT_ERROR(RT_ERR_IO, "writing the config: %s", strerror(errno)) : RT_OK;
}

rt_status rt_config_write_file(const rt_config *cfg, const char *path) {
    char tmp[RT_CONFIG_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return RT_ERROR(RT_ERR_IO, "%s: %s", tmp, strerror(errno));
    rt_status s = rt_config_write(cfg, f);
    if (fclose(f) != 0 && s == RT_OK) s = RT_ERROR(RT_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (s == RT_OK && rename(tmp, path) != 0)
        s = RT_ERROR(RT_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (s != RT_OK) remove(tmp);
    return s;
}

bool rt_config_value_at(const rt_config *cfg, int i, char *out, size_t n) {
    if (i < 0 || i >= N_KEYS) return false;
    if (n) out[0] = '\0';
    FILE *f = fmemopen(out, n, "w");
    if (!f) return true;
    write_value(cfg, &k_keys[i], f);
    fclose(f);
    return true;
}

bool rt_config_has_key(const char *name) { return find_key(name) != NULL; }

static const char *const k_key_resume_names[RT_KEY_RESUME_COUNT_] = {
    [RT_KEY_MUST_MATCH] = "must match",
    [RT_KEY_MAY_CHANGE] = "may change",
    [RT_KEY_NOT_FROM_CKPT] = "never from a checkpoint",
};
const rt_names rt_key_resume_names = {"checkpoint treatment", RT_KEY_RESUME_COUNT_, k_key_resume_names, NULL, NULL};

rt_key_resume rt_config_key_resume(const char *name) {
    const key *k = find_key(name);
    return k ? k->ckpt : RT_KEY_MUST_MATCH;
}

bool rt_config_key_choices(int i, char *buf, size_t n) {
    if (n) buf[0] = '\0';
    if (i < 0 || i >= N_KEYS || !k_keys[i].names) return false;
    choice_list(&k_keys[i], buf, n);
    return true;
}
