/* The training config (src/train/config.h): defaults, YAML of every value type, the
 * documented errors (unknown key with a suggestion, wrong type, out of range, bad
 * override, missing file, YAML syntax), write -> read round trip, docs/config.md
 * listing exactly the keys of the table, and how a checkpoint treats each key (its column
 * in docs/config.md and the table of docs/checkpoints.md). */
#include "test_util.h"

#include "train/config.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static rt_status parse(rt_config *c, const char *yaml) {
    rt_config_default(c);
    return rt_config_parse_text(c, yaml, strlen(yaml), "cfg.yaml");
}

/* The call fails with RT_ERR_INVALID and the message contains every given fragment. */
static void expect_error(rt_status s, const char *a, const char *b, const char *c) {
    assert_int_equal(s, RT_ERR_INVALID);
    const char *m = rt_error_message();
    const char *parts[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (parts[i] && !strstr(m, parts[i])) fail_msg("error '%s' lacks '%s'", m, parts[i]);
    rt_error_clear();
}

static void test_defaults(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_int_equal(c.model.arch, RT_ARCH_RESNET34);
    assert_int_equal(c.model.stem, RT_STEM_AUTO);
    assert_int_equal(c.data.kind, RT_DATASET_AUTO);
    assert_int_equal(c.data.loader.mode, RT_SAMPLER_DISTRIBUTED);
    assert_int_equal(c.data.loader.crop_pad, -1); /* auto: the dataset's */
    assert_int_equal(c.data.loader.hflip, -1);
    assert_int_equal(c.data.loader.prefetch, 4);
    assert_false(c.data.loader.erase_random);
    assert_true(c.data.loader.erase_value == 0.0f);
    assert_true(c.data.loader.erase_scale[1] == 0.33 && c.data.loader.erase_ratio[0] == 0.3);
    assert_int_equal(c.optim.opt.kind, RT_OPTIM_SGD);
    assert_int_equal(c.optim.sched.kind, RT_SCHED_CONSTANT);
    assert_false(c.optim.sched.per_epoch);
    assert_false(c.optim.sched.anneal_linear);
    assert_int_equal(c.optim.sched.t_max, RT_CONFIG_AUTO);
    assert_true(isnan(c.optim.sched.max_lr));
    assert_int_equal(c.train.ctx.precision, RT_PRECISION_FP32);
    assert_false(c.train.tta_flip);
    assert_int_equal(c.dist.pg.algo, RT_ALGO_RING);
    assert_int_equal(c.dist.pg.transport, RT_TRANSPORT_AUTO);
    assert_false(c.dist.compress_bf16);
    assert_int_equal(c.log.level, RT_LOG_INFO);
    assert_int_equal(c.log.progress, RT_PROGRESS_AUTO);
    assert_int_equal(c.model.width, 64);
    assert_int_equal(c.model.num_classes, RT_CONFIG_AUTO);
    assert_true(isnan(c.optim.opt.lr));
    assert_int_equal(c.data.batch_size, 128);
    assert_true(c.data.loader.shuffle);
    assert_string_equal(c.data.path, "/usr/share/datasets/fashion-mnist");
    assert_true(fabs(c.dist.bucket_mb - 25.0) < 1e-12);
    assert_int_equal(c.optim.n_betas, 2);
    assert_true(fabs(c.optim.opt.betas[1] - 0.999) < 1e-15);
    assert_int_equal(c.optim.sched.n_milestones, 0);
    assert_int_equal(c.dist.nproc, RT_CONFIG_AUTO);
    assert_string_equal(c.checkpoint.resume, "auto");
}

static void test_values(void **state) {
    (void)state;
    rt_config c;
    assert_rt_ok(parse(&c, "model:\n  arch: NET\n  width: 16\n  dropout: 0.25\n"
                           "data:\n  batch_size: 0x40\n  shuffle: no\n  path: '/tmp/x y'\n"
                           "optim:\n  name: adamw\n  lr: 3e-4\n  betas: [0.8, 0.99]\n  milestones: [3, 6, 9]\n"
                           "dist:\n  nproc: 3\n  bucket_mb: 0\n"
                           "train:\n  max_steps: 5\n"
                           "log:\n"));
    assert_int_equal(c.model.arch, RT_ARCH_NET); /* names are matched case-insensitively */
    assert_int_equal(c.model.width, 16);
    assert_true(fabs(c.model.dropout - 0.25) < 1e-15);
    assert_int_equal(c.data.batch_size, 64);
    assert_false(c.data.loader.shuffle);
    assert_string_equal(c.data.path, "/tmp/x y");
    assert_int_equal(c.optim.opt.kind, RT_OPTIM_ADAMW);
    assert_true(fabs(c.optim.opt.lr - 3e-4) < 1e-18);
    assert_true(fabs(c.optim.opt.betas[0] - 0.8) < 1e-15 && fabs(c.optim.opt.betas[1] - 0.99) < 1e-15);
    assert_int_equal(c.optim.sched.n_milestones, 3);
    assert_int_equal(c.optim.sched.milestones[2], 9);
    assert_int_equal(c.dist.nproc, 3);
    assert_true(c.dist.bucket_mb == 0.0);
    assert_int_equal(c.train.max_steps, 5);
    /* untouched keys keep their defaults */
    assert_int_equal(c.train.epochs, 1);
    /* an empty document is every default */
    assert_rt_ok(parse(&c, ""));
    assert_int_equal(c.model.arch, RT_ARCH_RESNET34);
    /* each choice parsed once into its area's enum (or bool), written back as its name */
    assert_rt_ok(parse(&c, "model:\n  stem: CIFAR\ndata:\n  kind: FASHION_MNIST\n  sampler: partition\n"
                           "optim:\n  schedule: onecycle\n  interval: Epoch\n  anneal: linear\n"
                           "train:\n  precision: bf16\neval:\n  tta: flip\n"
                           "dist:\n  algo: rsag\n  transport: shm\n  compress: bf16\n"
                           "log:\n  level: warning\n  progress: off\n"));
    assert_int_equal(c.model.stem, RT_STEM_CIFAR);
    assert_int_equal(c.data.kind, RT_DATASET_FASHION_MNIST); /* an alias */
    assert_int_equal(c.data.loader.mode, RT_SAMPLER_PARTITION);
    /* the loader's int fields and data.erasing_value, parsed once into the loader's struct */
    assert_rt_ok(rt_config_override(&c, "data.crop_pad=3"));
    assert_int_equal(c.data.loader.crop_pad, 3);
    assert_rt_ok(rt_config_override(&c, "data.erasing_value=Random"));
    assert_true(c.data.loader.erase_random);
    assert_rt_ok(rt_config_override(&c, "data.erasing_value=0.5"));
    assert_false(c.data.loader.erase_random);
    assert_true(c.data.loader.erase_value == 0.5f);
    expect_error(rt_config_override(&c, "data.erasing_value=half"), "data.erasing_value", "random or a finite number",
                 NULL);
    expect_error(rt_config_override(&c, "data.prefetch=99"), "data.prefetch", "out of range", NULL);
    /* train.device: its form is checked when the config is read, on any machine; the text is kept */
    expect_error(rt_config_override(&c, "train.device=tpu"), "train.device: 'tpu' is not accepted",
                 "unknown device 'tpu' (expected auto | cpu | cuda | cuda:N)", NULL);
    expect_error(rt_config_override(&c, "train.device=cuda:x"), "train.device", "not a GPU index", NULL);
    assert_rt_ok(rt_config_override(&c, "train.device=CUDA:1"));
    assert_string_equal(c.train.device, "cuda:1");
    assert_int_equal(c.optim.sched.kind, RT_SCHED_ONECYCLE);
    assert_true(c.optim.sched.per_epoch);
    assert_true(c.optim.sched.anneal_linear);
    assert_int_equal(c.train.ctx.precision, RT_PRECISION_BF16);
    assert_true(c.train.tta_flip);
    assert_int_equal(c.dist.pg.algo, RT_ALGO_RSAG);
    assert_int_equal(c.dist.pg.transport, RT_TRANSPORT_SHM);
    assert_true(c.dist.compress_bf16);
    assert_int_equal(c.log.level, RT_LOG_WARN);
    assert_int_equal(c.log.progress, RT_PROGRESS_OFF);
    static const char *const want[][2] = {
        {"model.stem", "\"cifar\""},    {"data.kind", "\"fashion-mnist\""}, {"optim.interval", "\"epoch\""},
        {"optim.anneal", "\"linear\""}, {"eval.tta", "\"flip\""},           {"dist.compress", "\"bf16\""},
        {"log.level", "\"warn\""},      {"optim.name", "\"sgd\""},          {"optim.t_max", "auto"},
        {"data.crop_pad", "3"},         {"data.erasing_value", "\"0.5\""},  {"data.hflip", "auto"},
    };
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++)
        for (size_t j = 0; j < sizeof want / sizeof want[0]; j++)
            if (strcmp(name, want[j][0]) == 0) {
                char v[128];
                assert_true(rt_config_value_at(&c, i, v, sizeof v));
                if (strcmp(v, want[j][1]) != 0) fail_msg("%s: written as %s, expected %s", name, v, want[j][1]);
            }
    rt_config_default(&c);
    char v[64];
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++)
        if (strcmp(name, "model.stem") == 0) {
            assert_true(rt_config_value_at(&c, i, v, sizeof v));
            assert_string_equal(v, "\"auto\"");
            assert_true(rt_config_key_choices(i, v, sizeof v));
            assert_string_equal(v, "auto | imagenet | cifar");
        }
}

static void test_errors(void **state) {
    (void)state;
    rt_config c;
    /* unknown key with suggestion, with file and line */
    expect_error(parse(&c, "model:\n  arch: net\n  archh: net\n"), "cfg.yaml:3:", "model.archh: unknown key",
                 "did you mean model.arch?");
    /* a key under the wrong section points to the right one */
    expect_error(parse(&c, "data:\n  lr: 0.1\n"), "cfg.yaml:2:", "data.lr", "did you mean optim.lr?");
    /* unknown section */
    expect_error(parse(&c, "optimizer:\n  lr: 0.1\n"), "cfg.yaml:1:", "unknown section 'optimizer'", "optim");
    /* wrong types */
    expect_error(parse(&c, "data:\n  batch_size: many\n"), "cfg.yaml:2:", "data.batch_size", "not an integer");
    expect_error(parse(&c, "data:\n  batch_size: 12.5\n"), "data.batch_size", "'12.5' is not an integer", NULL);
    /* decimal with a leading zero (not octal), and hex with 0x (docs/config.md) */
    assert_int_equal(parse(&c, "data:\n  batch_size: 010\n"), RT_OK);
    assert_int_equal(c.data.batch_size, 10);
    assert_int_equal(parse(&c, "data:\n  batch_size: 0x10\n"), RT_OK);
    assert_int_equal(c.data.batch_size, 16);
    expect_error(parse(&c, "data:\n  batch_size: 08x\n"), "data.batch_size", "'08x' is not an integer", NULL);
    expect_error(parse(&c, "optim:\n  lr: fast\n"), "optim.lr", "not a finite number", NULL);
    expect_error(parse(&c, "optim:\n  lr: .nan\n"), "optim.lr", "not a finite number", NULL);
    expect_error(parse(&c, "data:\n  shuffle: maybe\n"), "data.shuffle", "not a boolean", NULL);
    expect_error(parse(&c, "data:\n  batch_size: [1, 2]\n"), "cfg.yaml:2:", "data.batch_size", "a list");
    expect_error(parse(&c, "data:\n  batch_size:\n"), "cfg.yaml:2:", "data.batch_size", "no value");
    expect_error(parse(&c, "optim:\n  betas: [0.9]\n"), "optim.betas", "1 items (expected 2)", NULL);
    expect_error(parse(&c, "optim:\n  milestones: [5, 3]\n"), "optim.milestones[1]", "increasing", NULL);
    /* strictly increasing: a repeated milestone is refused too (MultiStepLR would apply
     * gamma twice at once) */
    expect_error(parse(&c, "optim:\n  milestones: [3, 3]\n"), "optim.milestones[1]", "increasing", NULL);
    /* out of range */
    expect_error(parse(&c, "model:\n  width: 0\n"), "cfg.yaml:2:", "model.width", "out of range");
    expect_error(parse(&c, "optim:\n  momentum: 1.5\n"), "optim.momentum", "out of range", NULL);
    /* a name the owning area does not know */
    expect_error(parse(&c, "model:\n  arch: resnet35\n"), "cfg.yaml:2:", "model.arch", "resnet35");
    expect_error(parse(&c, "optim:\n  interval: fortnight\n"), "optim.interval", "iteration | epoch", NULL);
    /* the one message of core/names.h, listed from the area's table ("auto" first where
     * the key takes it); data.sampler takes the training modes only */
    expect_error(parse(&c, "model:\n  arch: resnet35\n"),
                 "cfg.yaml:2: model.arch: ", "unknown model arch 'resnet35' (expected resnet18 | resnet34 | net)",
                 NULL);
    expect_error(parse(&c, "optim:\n  schedule: poly\n"), "optim.schedule: ",
                 "unknown schedule 'poly' (expected constant | step | multistep | cosine | onecycle)", NULL);
    expect_error(parse(&c, "model:\n  stem: tiny\n"), "model.stem: ", "'tiny' (expected auto | imagenet | cifar)",
                 NULL);
    expect_error(parse(&c, "data:\n  sampler: eval\n"),
                 "data.sampler: ", "unknown sampler mode 'eval' (expected distributed | partition)", NULL);
    expect_error(parse(&c, "data:\n  kind: synthetic\n"),
                 "data.kind: ", "(expected auto | mnist | fashion-mnist | cifar10 | cifar100)", NULL);
    expect_error(rt_config_override(&c, "dist.algo=tree"),
                 "dist.algo: ", "unknown algorithm 'tree' (expected ring | naive | rsag | nccl)", NULL);
    /* duplicates are errors, not silent overrides */
    expect_error(parse(&c, "model:\n  width: 8\n  width: 16\n"), "cfg.yaml:3:", "given twice", "line 2");
    /* YAML syntax, with line */
    expect_error(parse(&c, "model:\n  arch: [net\n"), "cfg.yaml:", "YAML syntax", NULL);
    expect_error(parse(&c, "- a\n- b\n"), "cfg.yaml:1:", "expected sections", NULL);
    expect_error(parse(&c, "model: 3\n"), "cfg.yaml:1:", "model", "expected a mapping");
}

static void test_overrides(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_rt_ok(rt_config_override(&c, "optim.lr=0.05"));
    assert_true(fabs(c.optim.opt.lr - 0.05) < 1e-15);
    assert_rt_ok(rt_config_override(&c, "optim.milestones=[2,4]"));
    assert_int_equal(c.optim.sched.n_milestones, 2);
    assert_rt_ok(rt_config_override(&c, "optim.milestones=7,8,9"));
    assert_int_equal(c.optim.sched.n_milestones, 3);
    assert_rt_ok(rt_config_override(&c, "optim.milestones="));
    assert_int_equal(c.optim.sched.n_milestones, 0);
    setenv("HOME", "/home/u", 1);
    assert_rt_ok(rt_config_override(&c, "data.path=~/mnist"));
    assert_string_equal(c.data.path, "/home/u/mnist"); /* ~/ as in a shell */
    assert_rt_ok(rt_config_override(&c, "data.path=/a=b/c"));
    assert_string_equal(c.data.path, "/a=b/c");
    expect_error(rt_config_override(&c, "optim.lr=abc"), "override 'optim.lr=abc'", "optim.lr", "not a finite number");
    expect_error(rt_config_override(&c, "optim.lrr=1"), "override 'optim.lrr=1'", "did you mean optim.lr?", NULL);
    expect_error(rt_config_override(&c, "lr=1"), "override 'lr=1'", "names no section", NULL);
    expect_error(rt_config_override(&c, "model.width="), "override 'model.width='", "no value", NULL);
    expect_error(rt_config_override(&c, "model.width=-3"), "model.width", "out of range", NULL);
    assert_true(rt_config_is_override("optim.lr=0.1"));
    assert_false(rt_config_is_override("configs/a.yaml"));
    assert_false(rt_config_is_override("runs/x=1/a.yaml"));
    assert_false(rt_config_is_override("--nproc=2"));
}

static void test_load_file(void **state) {
    (void)state;
    char dir[] = "/tmp/rt-config-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/a.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("model:\n  arch: net\ntrain:\n  epochs: 3\n", f);
    fclose(f);
    rt_config c;
    const char *ov[] = {"train.epochs=4", "model.width=8"};
    assert_rt_ok(rt_config_load(&c, path, 2, ov));
    assert_int_equal(c.train.epochs, 4); /* overrides after the file */
    assert_string_equal(c.source, path);
    /* a bad override names itself, even with a good file */
    const char *bad[] = {"train.epochs=x"};
    expect_error(rt_config_load(&c, path, 1, bad), "override 'train.epochs=x'", NULL, NULL);
    /* a missing file is named */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.yaml", dir);
    assert_int_equal(rt_config_load(&c, missing, 0, NULL), RT_ERR_IO);
    if (!strstr(rt_error_message(), missing) || !strstr(rt_error_message(), "No such file"))
        fail_msg("%s", rt_error_message());
    rt_error_clear();
    /* a directory is not a config */
    assert_int_equal(rt_config_load(&c, dir, 0, NULL), RT_ERR_IO);
    rt_error_clear();
    /* round trip: write the resolved config, read it back, write again: same text and values */
    rt_config a, b;
    const char *ov2[] = {"optim.milestones=[3,5]", "optim.lr=0.123456789012345", "data.path=/x\"y",
                         "checkpoint.allow_changes=[optim.lr, data.augment]"};
    assert_rt_ok(rt_config_load(&a, path, 4, ov2));
    char out1[256];
    snprintf(out1, sizeof out1, "%s/resolved.yaml", dir);
    assert_rt_ok(rt_config_write_file(&a, out1));
    assert_rt_ok(rt_config_load(&b, out1, 0, NULL));
    assert_int_equal(b.model.arch, RT_ARCH_NET);
    assert_int_equal(b.train.epochs, 3);
    assert_int_equal(b.optim.sched.n_milestones, 2);
    assert_true(b.optim.opt.lr == a.optim.opt.lr);
    assert_true(isnan(b.model.dropout));
    assert_string_equal(b.data.path, "/x\"y");
    assert_int_equal(b.checkpoint.n_allow_changes, 2);
    assert_string_equal(b.checkpoint.allow_changes[1], "data.augment");
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *m1 = open_memstream(&t1, &n1), *m2 = open_memstream(&t2, &n2);
    b.source[0] = a.source[0] = '\0';
    assert_rt_ok(rt_config_write(&a, m1));
    assert_rt_ok(rt_config_write(&b, m2));
    fclose(m1);
    fclose(m2);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    unlink(out1);
    unlink(path);
    rmdir(dir);
}

/* checkpoint.allow_changes: a list of key names, in YAML or as an override; the value
 * text (rt_config_value_at) is what rt_config_write writes. */
static void test_string_list(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_int_equal(c.checkpoint.n_allow_changes, 0);
    assert_false(c.checkpoint.overwrite);
    assert_rt_ok(parse(&c, "checkpoint:\n  allow_changes: [optim.lr, model.width]\n  overwrite: true\n"));
    assert_int_equal(c.checkpoint.n_allow_changes, 2);
    assert_string_equal(c.checkpoint.allow_changes[0], "optim.lr");
    assert_string_equal(c.checkpoint.allow_changes[1], "model.width");
    assert_true(c.checkpoint.overwrite);
    assert_rt_ok(parse(&c, "checkpoint:\n  allow_changes:\n    - train.seed\n"));
    assert_int_equal(c.checkpoint.n_allow_changes, 1);
    assert_rt_ok(rt_config_override(&c, "checkpoint.allow_changes=[optim.lr,optim.momentum]"));
    assert_int_equal(c.checkpoint.n_allow_changes, 2);
    assert_string_equal(c.checkpoint.allow_changes[1], "optim.momentum");
    char v[256] = "";
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        if (strcmp(name, "checkpoint.allow_changes") == 0) assert_true(rt_config_value_at(&c, i, v, sizeof v));
    }
    assert_string_equal(v, "[\"optim.lr\", \"optim.momentum\"]");
    assert_rt_ok(rt_config_override(&c, "checkpoint.allow_changes="));
    assert_int_equal(c.checkpoint.n_allow_changes, 0);
    assert_true(rt_config_has_key("optim.lr"));
    assert_false(rt_config_has_key("optim.lrr"));
    assert_rt_ok(parse(&c, "checkpoint:\n  allow_changes: optim.lr\n")); /* one item, as optim.milestones: 3 */
    assert_int_equal(c.checkpoint.n_allow_changes, 1);
    expect_error(parse(&c, "checkpoint:\n  allow_changes: [[optim.lr]]\n"), "checkpoint.allow_changes", "plain values",
                 NULL);
    /* a misspelled key is an error of its line, on a fresh run too (not only on a resume) */
    expect_error(parse(&c, "checkpoint:\n  allow_changes: [optim.lr, optim.lrr]\n"),
                 "cfg.yaml:2:", "checkpoint.allow_changes[1]", "'optim.lrr' is not a config key");
    expect_error(rt_config_override(&c, "checkpoint.allow_changes=[model.widht]"), "checkpoint.allow_changes[0]",
                 "'model.widht' is not a config key", NULL);
}

/* docs/NAME read into buf (skips the test without RINGTRAIN_SOURCE_DIR). */
static void read_doc(const char *name, char *buf, size_t cap) {
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    if (!src) skip();
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/%s", src, name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s: missing", path);
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
}

/* Key i's type column as the docs write it: a choice among a table's names lists exactly
 * those names (the area's rt_names, so a name added to a table and not to the docs fails),
 * each in backticks when `ticks`, '|' escaped for the markdown table. */
static void doc_type(int i, const char *type, bool ticks, char *want, size_t cap) {
    char names[512];
    bool choice = rt_config_key_choices(i, names, sizeof names);
    bool tick = choice && ticks;
    const char *t = choice ? names : type;
    char *w = want;
    if (tick) *w++ = '`';
    for (; *t && w < want + cap - 5; t++) {
        if (tick && *t == ' ' && t[1] == '|') *w++ = '`';
        if (*t == '|') *w++ = '\\';
        *w++ = *t;
        if (tick && *t == ' ' && t > names && t[-1] == '|') *w++ = '`';
    }
    if (tick) *w++ = '`';
    *w = '\0';
}

/* The row `row` of `name` in doc begins "row want |"; where: the doc's name. */
static void check_row_type(const char *doc, const char *where, const char *row, const char *name, const char *want) {
    const char *at = strstr(doc, row);
    char cell[1024];
    snprintf(cell, sizeof cell, "%s %s |", row, want);
    if (strncmp(at, cell, strlen(cell)) != 0) {
        const char *eol = strchr(at, '\n');
        fail_msg("%s: the row of %s should begin\n  %s\nbut is\n  %.*s", where, name, cell, (int)(eol ? eol - at : 200),
                 at);
    }
}

/* The type column of each key's row in doc (named `where`): every key must have a row
 * when `every`, else the choice keys that have one are checked; the number checked. */
static int check_doc_types(const char *doc, const char *where, bool ticks, bool every) {
    const char *name, *type;
    int checked = 0;
    for (int i = 0; rt_config_key_at(i, &name, &type, NULL, NULL); i++) {
        char row[128], want[768];
        snprintf(row, sizeof row, "| `%s` |", name);
        if (!strstr(doc, row) && every) fail_msg("%s has no row for %s", where, name);
        if (!strstr(doc, row) || (!every && !rt_config_key_choices(i, want, sizeof want))) continue;
        doc_type(i, type, ticks, want, sizeof want);
        check_row_type(doc, where, row, name, want);
        checked++;
    }
    return checked;
}

/* docs/config.md has one table row per key ("| `section.key` |") and no row for a key
 * that does not exist. */
static void test_docs(void **state) {
    (void)state;
    static char doc[1 << 17];
    read_doc("config.md", doc, sizeof doc);
    int keys = check_doc_types(doc, "docs/config.md", false, true);
    const char *name;
    int rows = 0;
    for (const char *p = strstr(doc, "\n| `"); p; p = strstr(p + 1, "\n| `")) {
        char key[128];
        if (sscanf(p, "\n| `%127[^`]`", key) != 1) continue;
        int found = 0;
        for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) found |= strcmp(name, key) == 0;
        if (!found) fail_msg("docs/config.md documents '%s', which is not a key", key);
        rows++;
    }
    assert_int_equal(rows, keys);
}

/* docs/optim.md's key table: each choice key it has a row for lists the table's names
 * (in backticks), as docs/config.md does. */
static void test_docs_optim(void **state) {
    (void)state;
    static char doc[1 << 17];
    read_doc("optim.md", doc, sizeof doc);
    assert_true(check_doc_types(doc, "docs/optim.md", true, false) >= 3); /* name, schedule, interval */
}

/* How a checkpoint treats the keys (rt_config_key_resume): every key has one of the three
 * values, each value is used, process, network and output settings (dist.*, log.*,
 * checkpoint.*) are never taken from a checkpoint (ringtrain eval relies on it), an old
 * name answers for its key and a name that is no key must match. */
static void test_key_resume(void **state) {
    (void)state;
    int count[RT_KEY_RESUME_COUNT_] = {0};
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        rt_key_resume r = rt_config_key_resume(name);
        assert_in_range(r, 0, RT_KEY_RESUME_COUNT_ - 1);
        count[r]++;
        bool process =
            strncmp(name, "dist.", 5) == 0 || strncmp(name, "log.", 4) == 0 || strncmp(name, "checkpoint.", 11) == 0;
        if (process && r != RT_KEY_NOT_FROM_CKPT)
            fail_msg("%s: a process, network or output setting is '%s', expected '%s'", name,
                     rt_names_name(&rt_key_resume_names, r), rt_names_name(&rt_key_resume_names, RT_KEY_NOT_FROM_CKPT));
    }
    for (int r = 0; r < RT_KEY_RESUME_COUNT_; r++) assert_true(count[r] > 0);
    assert_int_equal(rt_config_key_resume("model.arch"), RT_KEY_MUST_MATCH);
    assert_int_equal(rt_config_key_resume("train.epochs"), RT_KEY_MAY_CHANGE);
    assert_int_equal(rt_config_key_resume("train.device"), RT_KEY_NOT_FROM_CKPT);
    assert_int_equal(rt_config_key_resume("train.tta"), RT_KEY_MAY_CHANGE); /* eval.tta's old name */
    assert_int_equal(rt_config_key_resume("model.widht"), RT_KEY_MUST_MATCH);
    assert_string_equal(rt_names_name(&rt_key_resume_names, RT_KEY_MUST_MATCH), "must match");
    assert_string_equal(rt_names_name(&rt_key_resume_names, RT_KEY_MAY_CHANGE), "may change");
    assert_string_equal(rt_names_name(&rt_key_resume_names, RT_KEY_NOT_FROM_CKPT), "never from a checkpoint");
}

/* Cell `col` (0: the first) of the markdown table row at `row` ("| a | b \| c |"),
 * trimmed, into out (an escaped '|' stays in its cell); false when the row is shorter. */
static bool row_cell(const char *row, int col, char *out, size_t n) {
    if (*row != '|') return false;
    const char *p = row;
    for (int c = 0;; c++) {
        const char *e = ++p; /* past the '|' that opens cell c */
        while (*e && *e != '\n' && !(*e == '|' && e[-1] != '\\')) e++;
        if (*e != '|') return false;
        if (c == col) {
            while (p < e && *p == ' ') p++;
            const char *q = e;
            while (q > p && q[-1] == ' ') q--;
            snprintf(out, n, "%.*s", (int)(q - p), p);
            return true;
        }
        p = e;
    }
}

/* docs/config.md's checkpoint column (the fourth): each key's cell names how a checkpoint
 * treats it, as its row in the key table says (rt_config_key_resume). */
static void test_docs_checkpoint_column(void **state) {
    (void)state;
    static char doc[1 << 17];
    read_doc("config.md", doc, sizeof doc);
    assert_non_null(strstr(doc, "\n| key | type | default | checkpoint | meaning |\n"));
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        char row[128], cell[256];
        snprintf(row, sizeof row, "\n| `%s` |", name);
        const char *at = strstr(doc, row);
        if (!at || !row_cell(at + 1, 3, cell, sizeof cell)) fail_msg("docs/config.md: %s has no checkpoint cell", name);
        rt_key_resume want = rt_config_key_resume(name);
        if (rt_names_index(&rt_key_resume_names, cell) != (int)want)
            fail_msg("docs/config.md: %s's checkpoint cell says '%s', its row in k_keys '%s'", name, cell,
                     rt_names_name(&rt_key_resume_names, want));
    }
}

/* The keys of one row of docs/checkpoints.md's table (`section.key`, or `section.*` for a
 * whole section, in backticks): each has the row's treatment `t`; named[i] counts key i. */
static void check_checkpoints_row(const char *keys, int t, int *named, int cap) {
    for (const char *k = strchr(keys, '`'); k; k = strchr(k + 1, '`')) {
        const char *end = strchr(k + 1, '`');
        if (!end) fail_msg("docs/checkpoints.md: unbalanced ` in '%s'", keys);
        char want[128];
        snprintf(want, sizeof want, "%.*s", (int)(end - k - 1), k + 1);
        size_t wl = strlen(want);
        bool section = wl > 2 && strcmp(want + wl - 2, ".*") == 0;
        int matched = 0;
        const char *name;
        for (int i = 0; i < cap && rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
            if (section ? strncmp(name, want, wl - 1) != 0 : strcmp(name, want) != 0) continue;
            matched++;
            named[i]++;
            if ((int)rt_config_key_resume(name) != t)
                fail_msg("docs/checkpoints.md: %s is '%s' there, '%s' in the key table (docs/config.md)", name,
                         rt_names_name(&rt_key_resume_names, t),
                         rt_names_name(&rt_key_resume_names, rt_config_key_resume(name)));
        }
        if (!matched) fail_msg("docs/checkpoints.md: '%s' names no config key", want);
        k = end;
    }
}

/* docs/checkpoints.md's table of the keys a resume may change ("| keys | checkpoint | why
 * |"): each row's keys have the row's treatment, and the rows name every key that is not
 * "must match" once, and no other. */
static void test_docs_checkpoints(void **state) {
    (void)state;
    static char doc[1 << 17];
    read_doc("checkpoints.md", doc, sizeof doc);
    const char *p = strstr(doc, "\n| keys | checkpoint | why |\n|---|---|---|\n");
    if (!p) fail_msg("docs/checkpoints.md: no table '| keys | checkpoint | why |'");
    p = strstr(p, "|---|---|---|\n") + strlen("|---|---|---|\n");
    enum { CAP = 1024 };
    static int named[CAP];
    memset(named, 0, sizeof named);
    int rows = 0;
    for (; *p == '|'; rows++) {
        char keys[1024], treat[128];
        if (!row_cell(p, 0, keys, sizeof keys) || !row_cell(p, 1, treat, sizeof treat))
            fail_msg("docs/checkpoints.md: a short row in the table of keys a resume may change");
        int t = rt_names_index(&rt_key_resume_names, treat);
        if (t < 0) fail_msg("docs/checkpoints.md: '%s' is no checkpoint treatment", treat);
        check_checkpoints_row(keys, t, named, CAP);
        const char *eol = strchr(p, '\n');
        p = eol ? eol + 1 : p + strlen(p);
    }
    assert_true(rows > 0);
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        assert_true(i < CAP);
        int want = rt_config_key_resume(name) != RT_KEY_MUST_MATCH;
        if (named[i] != want)
            fail_msg("docs/checkpoints.md: %s is named %d times in the table of keys a resume may change, expected %d",
                     name, named[i], want);
    }
}

/* train.deterministic: on by default (exact resume on a GPU, docs/config.md says why),
 * YAML booleans and overrides, a non-boolean refused with the key and the line, and the
 * value survives the resolved config's round trip (checkpoints carry it). */
static void test_deterministic(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_true(c.train.ctx.deterministic);
    assert_rt_ok(parse(&c, "train:\n  deterministic: false\n"));
    assert_false(c.train.ctx.deterministic);
    assert_rt_ok(parse(&c, "train:\n  deterministic: on\n"));
    assert_true(c.train.ctx.deterministic);
    assert_rt_ok(rt_config_override(&c, "train.deterministic=no"));
    assert_false(c.train.ctx.deterministic);
    assert_rt_ok(rt_config_override(&c, "train.deterministic=true"));
    assert_true(c.train.ctx.deterministic);
    expect_error(parse(&c, "train:\n  epochs: 1\n  deterministic: sometimes\n"), "cfg.yaml:3:", "train.deterministic",
                 "not a boolean");
    expect_error(parse(&c, "train:\n  deterministic: 2\n"), "train.deterministic", "not a boolean", NULL);
    expect_error(rt_config_override(&c, "train.deterministic="), "train.deterministic", "no value", NULL);
    expect_error(rt_config_override(&c, "train.determinstic=1"), "did you mean train.deterministic?", NULL, NULL);
    /* written and read back */
    rt_config a, b;
    assert_rt_ok(parse(&a, "train:\n  deterministic: false\n"));
    char *t = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&t, &n);
    assert_non_null(m);
    assert_rt_ok(rt_config_write(&a, m));
    fclose(m);
    assert_non_null(strstr(t, "deterministic: false"));
    assert_rt_ok(parse(&b, t));
    assert_false(b.train.ctx.deterministic);
    free(t);
}

/* train.cudnn_benchmark: off by default (the heuristic choice, so two fresh runs agree),
 * a YAML boolean into the model context's options, a non-boolean refused naming the key,
 * written and read back, and a resume may change it (the recorded choice is taken
 * whatever it says: docs/train.md). */
static void test_cudnn_benchmark(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_false(c.train.ctx.benchmark);
    assert_true(c.train.ctx.deterministic);
    assert_rt_ok(parse(&c, "train:\n  cudnn_benchmark: true\n"));
    assert_true(c.train.ctx.benchmark);
    assert_true(c.train.ctx.deterministic); /* independent of train.deterministic */
    assert_rt_ok(rt_config_override(&c, "train.cudnn_benchmark=off"));
    assert_false(c.train.ctx.benchmark);
    expect_error(parse(&c, "train:\n  epochs: 1\n  cudnn_benchmark: fastest\n"), "cfg.yaml:3:", "train.cudnn_benchmark",
                 "not a boolean");
    expect_error(rt_config_override(&c, "train.cudnn_benchmark=2"), "train.cudnn_benchmark", "not a boolean", NULL);
    assert_int_equal(rt_config_key_resume("train.cudnn_benchmark"), RT_KEY_MAY_CHANGE);
    rt_config a, b;
    assert_rt_ok(parse(&a, "train:\n  cudnn_benchmark: true\n  deterministic: false\n"));
    char *t = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&t, &n);
    assert_non_null(m);
    assert_rt_ok(rt_config_write(&a, m));
    fclose(m);
    assert_non_null(strstr(t, "cudnn_benchmark: true"));
    assert_rt_ok(parse(&b, t));
    assert_true(b.train.ctx.benchmark);
    assert_false(b.train.ctx.deterministic);
    free(t);
}

/* data.label: fine by default (every dataset's own label), coarse parsed into the data
 * area's enum (any case) and written back by name, another word refused listing the
 * names; it must match on resume (it changes what is learned: 100 or 20 classes). */
static void test_data_label(void **state) {
    (void)state;
    rt_config c;
    rt_config_default(&c);
    assert_int_equal(c.data.label, RT_DATASET_LABEL_FINE);
    assert_rt_ok(parse(&c, "data:\n  kind: cifar-100\n  label: Coarse\n"));
    assert_int_equal(c.data.kind, RT_DATASET_CIFAR100);
    assert_int_equal(c.data.label, RT_DATASET_LABEL_COARSE);
    const char *name;
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        char v[64];
        if (strcmp(name, "data.label") == 0) {
            assert_true(rt_config_value_at(&c, i, v, sizeof v));
            assert_string_equal(v, "\"coarse\"");
        } else if (strcmp(name, "data.kind") == 0) {
            assert_true(rt_config_value_at(&c, i, v, sizeof v));
            assert_string_equal(v, "\"cifar100\"");
        }
    }
    assert_rt_ok(rt_config_override(&c, "data.label=fine"));
    assert_int_equal(c.data.label, RT_DATASET_LABEL_FINE);
    expect_error(parse(&c, "data:\n  label: superclass\n"), "cfg.yaml:2:", "data.label: ",
                 "unknown dataset label 'superclass' (expected fine | coarse)");
    assert_int_equal(rt_config_key_resume("data.label"), RT_KEY_MUST_MATCH);
}

/* Every shipped config loads (a renamed key would break them silently otherwise). */
static void test_shipped_configs(void **state) {
    (void)state;
    const char *src = getenv("RINGTRAIN_SOURCE_DIR");
    if (!src) skip();
    const char *names[] = {"quickstart", "fashion-mnist-resnet34", "mnist-net", "cifar10-resnet34", "cifar100-resnet34"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/%s.yaml", src, names[i]);
        rt_config c;
        assert_rt_ok(rt_config_load(&c, path, 0, NULL));
    }
}

/* RINGTRAIN_DIST_TIMEOUT, RINGTRAIN_DIST_DEBUG (else TORCH_DISTRIBUTED_DEBUG=DETAIL) and
 * RINGTRAIN_LOG_LEVEL set the defaults of dist.timeout_s, dist.debug and log.level; the
 * file and the overrides win (docs/settings.md, "One source per setting"). */
static void test_env_defaults(void **state) {
    (void)state;
    rt_config c;
    setenv("RINGTRAIN_DIST_TIMEOUT", "7", 1);
    setenv("RINGTRAIN_DIST_DEBUG", "1", 1);
    setenv("RINGTRAIN_LOG_LEVEL", "debug", 1);
    assert_rt_ok(rt_config_load(&c, NULL, 0, NULL));
    assert_true(c.dist.pg.timeout_s == 7.0);
    assert_true(c.dist.pg.debug);
    assert_int_equal(c.log.level, RT_LOG_DEBUG);
    char dir[] = "/tmp/rt-config-env-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/a.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("dist:\n  timeout_s: 9\n  debug: false\n", f);
    fclose(f);
    assert_rt_ok(rt_config_load(&c, path, 0, NULL)); /* the environment wins over the file */
    assert_true(c.dist.pg.timeout_s == 7.0);
    assert_true(c.dist.pg.debug);
    assert_int_equal(c.log.level, RT_LOG_DEBUG);
    unsetenv("RINGTRAIN_DIST_TIMEOUT"); /* an unset variable leaves the file's value */
    assert_rt_ok(rt_config_load(&c, path, 0, NULL));
    assert_true(c.dist.pg.timeout_s == 9.0);
    setenv("RINGTRAIN_DIST_TIMEOUT", "7", 1);
    const char *ov[] = {"dist.timeout_s=11", "log.level=warn"};
    assert_rt_ok(rt_config_load(&c, path, 2, ov)); /* and the command line wins over both */
    assert_true(c.dist.pg.timeout_s == 11.0);
    assert_int_equal(c.log.level, RT_LOG_WARN);
    unlink(path);
    rmdir(dir);
    /* a bad value is an error naming the variable */
    setenv("RINGTRAIN_DIST_TIMEOUT", "abc", 1);
    expect_error(rt_config_load(&c, NULL, 0, NULL), "RINGTRAIN_DIST_TIMEOUT='abc'", "expected a number", NULL);
    unsetenv("RINGTRAIN_DIST_TIMEOUT");
    setenv("RINGTRAIN_LOG_LEVEL", "loud", 1);
    expect_error(rt_config_load(&c, NULL, 0, NULL), "RINGTRAIN_LOG_LEVEL='loud'", "error|warn|info|debug|trace", NULL);
    unsetenv("RINGTRAIN_LOG_LEVEL");
    /* RINGTRAIN_DIST_DEBUG, when set, wins over TORCH_DISTRIBUTED_DEBUG */
    setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
    setenv("RINGTRAIN_DIST_DEBUG", "0", 1);
    assert_rt_ok(rt_config_load(&c, NULL, 0, NULL));
    assert_false(c.dist.pg.debug);
    unsetenv("RINGTRAIN_DIST_DEBUG");
    assert_rt_ok(rt_config_load(&c, NULL, 0, NULL));
    assert_true(c.dist.pg.debug);
    unsetenv("TORCH_DISTRIBUTED_DEBUG");
    assert_rt_ok(rt_config_load(&c, NULL, 0, NULL)); /* unset: the table's defaults */
    assert_true(c.dist.pg.timeout_s == 300.0);
    assert_false(c.dist.pg.debug);
    assert_int_equal(c.log.level, RT_LOG_INFO);
    /* RINGTRAIN_FLIGHT_ENTRIES (no key) is read when the config is loaded, not when it was
     * defaulted: a variable set in between counts */
    rt_config_default(&c);
    setenv("RINGTRAIN_FLIGHT_ENTRIES", "7", 1);
    assert_rt_ok(rt_config_apply_env(&c));
    assert_int_equal(c.dist.pg.flight_entries, 7);
    /* defaulting a config with a bad setting keeps the caller's pending error, and the
     * settings after the bad one still get their values */
    setenv("RINGTRAIN_DIST_TIMEOUT", "abc", 1);
    rt_error_clear();
    (void)RT_ERROR(RT_ERR_IO, "the caller's own error");
    rt_config_default(&c);
    assert_int_equal(rt_error_status(), RT_ERR_IO);
    assert_non_null(strstr(rt_error_message(), "the caller's own error"));
    assert_int_equal(c.dist.pg.flight_entries, 7);
    rt_error_clear();
    unsetenv("RINGTRAIN_DIST_TIMEOUT");
    unsetenv("RINGTRAIN_FLIGHT_ENTRIES");
}

/* model.sync_bn: off by default, a boolean, and it must match on a resume (it changes what a
 * step computes) */
static void test_sync_bn_key(void **state) {
    (void)state;
    rt_config c;
    assert_rt_ok(parse(&c, "train:\n  epochs: 1\n"));
    assert_false(c.sync_bn);
    assert_rt_ok(parse(&c, "model:\n  sync_bn: true\n"));
    assert_true(c.sync_bn);
    assert_rt_ok(rt_config_override(&c, "model.sync_bn=false"));
    assert_false(c.sync_bn);
    expect_error(parse(&c, "model:\n  arch: resnet18\n  sync_bn: global\n"), "cfg.yaml:3:", "model.sync_bn",
                 "not a boolean");
    assert_int_equal(rt_config_key_resume("model.sync_bn"), RT_KEY_MUST_MATCH);
}

int main(void) {
    /* the variables that set config keys (rt_config_apply_env): the developer's own must not change the defaults */
    const char *env[] = {"RINGTRAIN_DIST_TIMEOUT", "RINGTRAIN_DIST_DEBUG", "TORCH_DISTRIBUTED_DEBUG",
                         "RINGTRAIN_LOG_LEVEL", "RINGTRAIN_FLIGHT_ENTRIES"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++) unsetenv(env[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_docs),
        cmocka_unit_test(test_docs_optim),
        cmocka_unit_test(test_shipped_configs),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_cudnn_benchmark),
        cmocka_unit_test(test_data_label),
        cmocka_unit_test(test_string_list),
        cmocka_unit_test(test_env_defaults),
        cmocka_unit_test(test_key_resume),
        cmocka_unit_test(test_docs_checkpoint_column),
        cmocka_unit_test(test_docs_checkpoints),
        cmocka_unit_test(test_sync_bn_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
