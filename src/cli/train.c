/* `ringtrain train CONFIG [section.key=value ...] [--nproc N] [--nnodes N --node-rank R
 * --master-addr A --master-port P] [--max-restarts N] [--trace]`, and `ringtrain eval
 * CHECKPOINT|CONFIG [section.key=value ...]` with the same launch options less
 * --max-restarts and --trace (accepted, but an evaluation neither restarts nor records a
 * timeline); each command has its own usage (usage_train, usage_eval).
 *
 * Two ways to run, as torchrun users expect:
 * - started by an outside launcher (torchrun --no_python, mpirun, srun: its variables are
 *   set), this process is one rank;
 * - otherwise it is the launcher: it checks the config and the dataset once (so an error
 *   is printed once, not once per rank), then starts N local ranks of this same command
 *   (src/dist/launch.h) and reports the first failure; with --max-restarts N it starts the
 *   whole job again after a rank failed, from the newest checkpoint the job wrote, at most
 *   N times (torchrun's --max-restarts; docs/train.md, "Restarts"). */
#include "cli/args.h"
#include "cli/cli.h"

#include "core/device.h"
#include "core/log.h"
#include "core/settings.h"
#include "data/dataset.h"
#include "dist/dist.h"
#include "dist/launch.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

#include <inttypes.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool g_eval; /* `ringtrain eval` rather than train */

static void usage_train(FILE *f) {
    fprintf(f, "usage: ringtrain train CONFIG [section.key=value ...] [options]\n\n"
               "Train from a YAML config (docs/config.md); any key can be overridden after it, e.g.\n"
               "optim.lr=0.05 train.epochs=2. Without an outside launcher it starts the ranks itself;\n"
               "under torchrun --no_python, mpirun or srun each process is one rank.\n\n"
               "  --nproc N          ranks on this node (default: dist.nproc; auto = one per GPU, else 2)\n"
               "  --nnodes N         nodes (dist.nnodes)\n"
               "  --node-rank R      this node's index (dist.node_rank)\n"
               "  --master-addr A    address of node 0 (dist.master_addr)\n"
               "  --master-port P    its port (dist.master_port; 0 = a free one, single node only)\n"
               "  --max-restarts N   after a rank failed, restart the job from its newest checkpoint,\n"
               "                     at most N times (dist.max_restarts; default 0; single node only)\n"
               "  --trace            record every rank's timeline (log.trace=true; merge it with\n"
               "                     ringtrain trace RUN_DIR; docs/debugging.md)\n"
               "\nThe run directory (log.dir, default runs/<config name>) gets config.yaml and\n"
               "metrics.jsonl; the last line printed is the test accuracy.\n");
}

/* eval's own: the options that apply to it (no restarts, no timeline: load_eval, run_rank) */
static void usage_eval(FILE *f) {
    fprintf(f, "usage: ringtrain eval CHECKPOINT|CONFIG [section.key=value ...] [options]\n\n"
               "Evaluate a checkpoint's model on the test set, split over any number of ranks (each\n"
               "sample once), and print its test loss and accuracy. CHECKPOINT is a checkpoint folder\n"
               "(ckpt-<step>; its config comes from the checkpoint); CONFIG is a YAML config\n"
               "(docs/config.md) whose newest valid checkpoint (checkpoint.dir) is evaluated. Any key\n"
               "can be overridden after it, e.g. data.path=DIR eval.tta=flip. Without an outside\n"
               "launcher it starts the ranks itself; under torchrun --no_python, mpirun or srun each\n"
               "process is one rank.\n\n"
               "  --nproc N          ranks on this node (default: dist.nproc; auto = one per GPU, else 2)\n"
               "  --nnodes N         nodes (dist.nnodes)\n"
               "  --node-rank R      this node's index (dist.node_rank)\n"
               "  --master-addr A    address of node 0 (dist.master_addr)\n"
               "  --master-port P    its port (dist.master_port; 0 = a free one, single node only)\n"
               "\nThe line printed: CHECKPOINT (step N): test loss L, accuracy A%% (S test samples,\n"
               "R rank(s)).\n");
}

static void usage(FILE *f) {
    if (g_eval)
        usage_eval(f);
    else
        usage_train(f);
    /* from the name tables of the areas, as the config parses them */
    fprintf(f, "\nThe keys that take a name (any case), and the names:\n");
    const char *name;
    char names[512];
    for (int i = 0; rt_config_key_at(i, &name, NULL, NULL, NULL); i++)
        if (rt_config_key_choices(i, names, sizeof names)) fprintf(f, "  %-20s %s\n", name, names);
}

/* The options that stand for a config key (torchrun's names); each may be given again,
 * the last one counts. hi 0: a string, else a whole number in lo..hi (or "auto"). */
static const struct {
    const char *opt, *key;
    int64_t lo, hi;
} k_opts[] = {{"--nproc", "dist.nproc", 1, 1024},
              {"--nnodes", "dist.nnodes", 1, 65536},
              {"--node-rank", "dist.node_rank", 0, 65535},
              {"--master-addr", "dist.master_addr", 0, 0},
              {"--master-port", "dist.master_port", 0, 65535},
              {"--max-restarts", "dist.max_restarts", 0, 1000000}};
enum { N_KOPTS = sizeof k_opts / sizeof k_opts[0] };

typedef struct args {
    const char *config;
    const char **overrides;
    int n_overrides;
    char cli_over[N_KOPTS][300]; /* "key=value" for each option given, "" if not */
    bool trace;                  /* --trace: log.trace=true */
} args;

/* 0 ok, 1 help printed, 2 usage error */
static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->overrides = calloc((size_t)argc, sizeof *a->overrides);
    if (!a->overrides) return 2;
    const char *prog = g_eval ? "ringtrain eval" : "ringtrain train";
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (rt_cli_is_help(s)) {
            usage(stdout);
            return 1;
        }
        int flag = rt_cli_flag(prog, s, "--trace");
        if (flag < 0) return 2;
        if (flag) {
            a->trace = true;
            continue;
        }
        if (s[0] == '-' && s[1] == '-') {
            const char *v = NULL;
            int got = 0;
            size_t k = 0;
            for (; k < N_KOPTS && got == 0; k++) got = rt_cli_opt(prog, argc, argv, &i, k_opts[k].opt, &v);
            if (got < 0) return 2;
            if (got == 0) {
                fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, s);
                return 2;
            }
            k--;
            int64_t num;
            if (k_opts[k].hi > 0 && strcmp(v, "auto") != 0 &&
                rt_cli_parse_i64(v, k_opts[k].lo, k_opts[k].hi, &num) != 0) {
                fprintf(stderr, "%s: %s '%s' (expected a whole number in %" PRId64 "..%" PRId64 ")\n", prog,
                        k_opts[k].opt, v, k_opts[k].lo, k_opts[k].hi);
                return 2;
            }
            snprintf(a->cli_over[k], sizeof a->cli_over[k], "%s=%s", k_opts[k].key, v);
            continue;
        }
        if (rt_config_is_override(s)) {
            a->overrides[a->n_overrides++] = s;
            continue;
        }
        if (a->config) {
            fprintf(stderr,
                    "%s: unexpected argument '%s' after the config %s (overrides look like "
                    "section.key=value)\n",
                    prog, s, a->config);
            return 2;
        }
        a->config = s;
    }
    if (!a->config) {
        usage(stderr);
        return 2;
    }
    return 0;
}

static char g_ckpt[RT_CKPT_PATH_MAX];
/* eval of a checkpoint: the keys its config set that this run does not take from it
 * (", "-separated; "" for none), said once by run_command */
static char g_dropped[1024];

/* One key's value as rt_config_write writes it; a heap buffer (free it), NULL when out of
 * memory. Large enough for any value (a path of RT_CONFIG_PATH_MAX bytes, each byte
 * escaped, or a list of RT_CONFIG_MAX_LIST names). */
#define VALUE_MAX (8 * RT_CONFIG_PATH_MAX)
static char *value_of(const rt_config *cfg, int i) {
    char *v = malloc(VALUE_MAX);
    if (v) rt_config_value_at(cfg, i, v, VALUE_MAX);
    return v;
}

/* The keys of ck that say what to read and how, as YAML (rt_config_write's form): every
 * key but those never taken from a checkpoint (config.md's checkpoint column: dist.*,
 * log.*, checkpoint.*, train.device, train.threads), which are named in g_dropped when ck
 * differs from the default `def`. *out: malloc'ed text. */
static rt_status ckpt_keys_yaml(const rt_config *ck, const rt_config *def, char **out, size_t *len) {
    FILE *f = open_memstream(out, len);
    RT_REQUIRE(f, RT_ERR_NOMEM, "out of memory (the checkpoint's config)");
    rt_status st = RT_OK;
    const char *name, *sect = "";
    size_t sect_len = 0, dl = 0;
    g_dropped[0] = '\0';
    for (int i = 0; st == RT_OK && rt_config_key_at(i, &name, NULL, NULL, NULL); i++) {
        char *a = value_of(ck, i), *b = value_of(def, i);
        if (!a || !b) st = RT_ERROR(RT_ERR_NOMEM, "out of memory (the checkpoint's config)");
        const char *dot = strchr(name, '.');
        size_t sl = (size_t)(dot - name);
        bool never = rt_config_key_resume(name) == RT_KEY_NOT_FROM_CKPT;
        if (st == RT_OK && never && strcmp(a, b) != 0 && dl < sizeof g_dropped)
            dl += (size_t)snprintf(g_dropped + dl, sizeof g_dropped - dl, "%s%s", dl ? ", " : "", name);
        if (st == RT_OK && !never) {
            if (sl != sect_len || strncmp(name, sect, sl) != 0) fprintf(f, "%.*s:\n", (int)sl, name);
            sect = name;
            sect_len = sl;
            fprintf(f, "  %s: %s\n", dot + 1, a);
        }
        free(a);
        free(b);
    }
    if (fclose(f) != 0 && st == RT_OK) st = RT_ERROR(RT_ERR_NOMEM, "out of memory (the checkpoint's config)");
    if (st != RT_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

/* cfg (at its defaults) with the checkpoint's config (metadata 'config', `text`; `name`
 * in errors) but for the keys never taken from a checkpoint: a checkpoint is data, and
 * nothing in it chooses what this process writes, binds, connects to or forks (issue 38). */
static rt_status apply_ckpt_config(rt_config *cfg, const char *text, const char *name) {
    rt_config *ck = malloc(sizeof *ck);
    RT_CHECK_ALLOC(ck, sizeof *ck);
    rt_config_default(ck);
    rt_status st = rt_config_parse_text(ck, text, strlen(text), name);
    char *yaml = NULL;
    size_t len = 0;
    if (st == RT_OK) st = ckpt_keys_yaml(ck, cfg, &yaml, &len);
    if (st == RT_OK) st = rt_config_parse_text(cfg, yaml, len, name);
    free(yaml);
    free(ck);
    return st;
}

/* eval: CONFIG_OR_CKPT is a checkpoint directory (the keys of its config that say what to
 * read and how: apply_ckpt_config) or a config (its newest checkpoint, as rank 0 finds it,
 * is evaluated). Then, as for train, the environment and the command line. */
static rt_status load_eval(const args *a, rt_config *cfg) {
    struct stat st;
    char probe[RT_CKPT_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/" RT_CKPT_TRAIN_FILE, a->config);
    if (stat(a->config, &st) == 0 && S_ISDIR(st.st_mode) && access(probe, F_OK) == 0) {
        snprintf(g_ckpt, sizeof g_ckpt, "%s", a->config);
        rt_ckpt_meta m;
        rt_ckpt_meta_init(&m);
        rt_status s = rt_ckpt_verify(g_ckpt, &m);
        const char *text = NULL;
        if (s == RT_OK) s = rt_ckpt_meta_get_str(&m, "config", &text);
        rt_config_default(cfg);
        char name[RT_CKPT_PATH_MAX + 64];
        snprintf(name, sizeof name, "%s metadata 'config'", probe);
        if (s == RT_OK) s = apply_ckpt_config(cfg, text, name);
        rt_ckpt_meta_free(&m);
        RT_CHECK(s);
        RT_CHECK(rt_config_apply_env(cfg)); /* the environment over the checkpoint's config */
        for (int i = 0; i < a->n_overrides; i++) RT_CHECK(rt_config_override(cfg, a->overrides[i]));
    } else {
        /* the newest checkpoint of checkpoint.dir: rank 0 chooses it (rt_evaluate) and
         * every rank evaluates that one */
        RT_CHECK(rt_config_load(cfg, a->config, a->n_overrides, a->overrides));
        g_ckpt[0] = '\0';
    }
    return RT_OK;
}

/* Config file, then its overrides, then the command-line options. */
static rt_status load(const args *a, rt_config *cfg) {
    if (g_eval)
        RT_CHECK(load_eval(a, cfg));
    else
        RT_CHECK(rt_config_load(cfg, a->config, a->n_overrides, a->overrides));
    for (int k = 0; k < N_KOPTS; k++)
        if (a->cli_over[k][0]) RT_CHECK(rt_config_override(cfg, a->cli_over[k]));
    if (a->trace) RT_CHECK(rt_config_override(cfg, "log.trace=true"));
    /* log.level (RINGTRAIN_LOG_LEVEL replaces the file's, rt_config_apply_env) from here on */
    rt_log_set_level(cfg->log.level);
    return RT_OK;
}

/* The dataset is there and whole: checked once by the launcher, so a missing or
 * truncated file is one error, not one per rank. */
static rt_status check_data(const rt_config *cfg) {
    rt_dataset_kind kind = cfg->data.kind;
    const char *splits[2] = {"train", "test"};
    for (int i = 0; i < 2; i++) {
        rt_dataset ds;
        RT_CHECK(rt_dataset_load_label(cfg->data.path, splits[i], kind, cfg->data.label, &ds));
        rt_dataset_free(&ds);
    }
    return RT_OK;
}

/* After a stop, the command that resumes from its checkpoint: with checkpoint.resume:
 * auto the same command again (its newest checkpoint is the stop's); otherwise the same
 * command would not (none starts afresh, or refuses the folder; a PATH goes back to PATH),
 * so the hint names the override that does: the stop's checkpoint, added at the end
 * (overrides apply in order, the last one wins). */
static void stop_hint(const rt_config *cfg, const rt_train_result *res, char *out, size_t n) {
    if (strcmp(cfg->checkpoint.resume, "auto") == 0) {
        snprintf(out, n, "run the same command again to resume");
        return;
    }
    char name[64];
    rt_ckpt_dir_name(res->steps, name, sizeof name);
    int len = snprintf(out, n,
                       "to resume, run the same command with checkpoint.resume=%s/%s at its end (as it stands, "
                       "with checkpoint.resume: %s, it would not resume from there)",
                       res->checkpoint_dir, name, cfg->checkpoint.resume);
    if (len < 0 || (size_t)len >= n) /* paths longer than the config allows: say it without them */
        snprintf(out, n, "to resume, run the same command with checkpoint.resume=<this checkpoint> at its end");
}

static int run_rank(const rt_config *cfg, const rt_dist_env *env) {
    rt_train_rank who = {.rank = env->rank >= 0 ? env->rank : 0,
                         .world_size = env->world_size >= 1 ? env->world_size : 1,
                         .local_rank = env->local_rank >= 0 ? env->local_rank : 0,
                         .local_world_size = env->local_world_size >= 1 ? env->local_world_size : 1};
    rt_set_rank(who.world_size > 1 ? who.rank : -1);
    rt_train_result res;
    if (g_eval) {
        if (rt_evaluate(cfg, &who, g_ckpt, &res) != RT_OK) return rt_cli_fail();
        if (who.rank == 0)
            printf("%s (step %lld): test loss %.4f, accuracy %.2f%% (%lld test samples, %d rank(s))\n",
                   res.checkpoint_dir, (long long)res.steps, res.test_loss, 100.0 * res.test_accuracy,
                   (long long)res.test_samples, who.world_size);
        if (who.rank == 0 && res.val_samples > 0)
            printf("%s (step %lld): validation loss %.4f, accuracy %.2f%% (%lld held-out samples)\n",
                   res.checkpoint_dir, (long long)res.steps, res.val_loss, 100.0 * res.val_accuracy,
                   (long long)res.val_samples);
        return 0;
    }
    if (rt_train(cfg, &who, stdout, &res) != RT_OK) return rt_cli_fail();
    if (res.stopped) { /* SIGINT/SIGTERM: a checkpoint of this step was written */
        if (who.rank == 0) {
            char sig[32], hint[2 * RT_CONFIG_PATH_MAX + 256];
            stop_hint(cfg, &res, hint, sizeof hint);
            printf("stopped by %s after step %lld; checkpoint in %s/; %s\n",
                   rt_signal_name(res.stop_signal, sig, sizeof sig), (long long)res.steps, res.checkpoint_dir, hint);
            fflush(stdout);
        }
        return 128 + res.stop_signal; /* as a shell reports an interrupted command (130, 143) */
    }
    if (who.rank == 0) {
        if (res.early_stopped) /* train.early_stop: a finished run, its checkpoint written */
            printf("stopped early after step %lld by train.early_stop: %s; checkpoint in %s/\n", (long long)res.steps,
                   res.stop_reason, res.checkpoint_dir);
        if (res.val_samples > 0)
            printf("validation accuracy %.2f%% (%lld held-out samples); ", 100.0 * res.val_accuracy,
                   (long long)res.val_samples);
        printf("test accuracy %.2f%% (%lld test samples) after %lld steps in %.1f s; logs in %s/ (metrics.jsonl, "
               "config.yaml)\n",
               100.0 * res.test_accuracy, (long long)res.test_samples, (long long)res.steps, res.wall_s, res.run_dir);
        fflush(stdout);
    }
    return 0;
}

static int nproc_of(const rt_config *cfg) {
    if (cfg->dist.nproc != RT_CONFIG_AUTO) return (int)cfg->dist.nproc;
    if (strcmp(cfg->train.device, "cpu") != 0) {
        int n = 0;
        if (rt_cuda_device_count(&n) == RT_OK && n > 0) return n;
        rt_error_clear();
    }
    return 2;
}

/* ---- restarts (--max-restarts) ---- */

/* A ckpt-<step> folder as the job found it before its first attempt. A restarted attempt
 * resumes only from a checkpoint the job itself wrote: one not in that list, or replaced
 * since (another inode or modification time), so `checkpoint.resume: none` in a folder of an
 * older run never restarts from that run's checkpoints. */
enum { CKPT_NAME = 64 };
typedef struct ckpt_seen {
    char name[CKPT_NAME];
    int64_t step;
    ino_t ino;
    struct timespec mtime;
} ckpt_seen;

typedef struct ckpt_list {
    ckpt_seen *v;
    int n;
} ckpt_list;

/* "ckpt-<digits>" -> step, else -1 (temporary ".ckpt-*" folders and other names) */
static int64_t ckpt_step_of(const char *name) {
    if (strncmp(name, "ckpt-", 5) != 0 || !name[5] || strlen(name) >= CKPT_NAME) return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

static int by_step_desc(const void *a, const void *b) {
    int64_t x = ((const ckpt_seen *)a)->step, y = ((const ckpt_seen *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The ckpt-* folders of dir, newest first; a missing or unreadable folder is an empty list
 * (there is nothing to resume from in it). */
static void ckpt_list_read(const char *dir, ckpt_list *out) {
    out->v = NULL;
    out->n = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step = ckpt_step_of(e->d_name);
        char path[RT_CKPT_PATH_MAX];
        struct stat st;
        if (step < 0 || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path ||
            stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (out->n == cap) {
            int nc = cap ? 2 * cap : 16;
            ckpt_seen *v = realloc(out->v, (size_t)nc * sizeof *v);
            if (!v) break;
            out->v = v;
            cap = nc;
        }
        ckpt_seen *c = &out->v[out->n++];
        snprintf(c->name, sizeof c->name, "%s", e->d_name);
        c->step = step;
        c->ino = st.st_ino;
        c->mtime = st.st_mtim;
    }
    closedir(d);
    if (out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, by_step_desc);
}

/* The newest valid checkpoint of dir that is not in `before` (path "" when there is none). */
static void newest_of_job(const char *dir, const ckpt_list *before, char *path, size_t n) {
    path[0] = '\0';
    ckpt_list now;
    ckpt_list_read(dir, &now);
    for (int i = 0; i < now.n && !path[0]; i++) {
        const ckpt_seen *c = &now.v[i];
        bool old = false;
        for (int j = 0; j < before->n && !old; j++) {
            const ckpt_seen *b = &before->v[j];
            old = strcmp(b->name, c->name) == 0 && b->ino == c->ino && b->mtime.tv_sec == c->mtime.tv_sec &&
                  b->mtime.tv_nsec == c->mtime.tv_nsec;
        }
        if (old || (size_t)snprintf(path, n, "%s/%s", dir, c->name) >= n) {
            path[0] = '\0';
            continue;
        }
        if (rt_ckpt_verify(path, NULL) != RT_OK) { /* refused (the trainer would say why): the one before */
            rt_error_clear();
            path[0] = '\0';
        }
    }
    free(now.v);
}

/* NULL when the failure of an attempt is restarted, else why not. A rank that failed (an
 * error exit, a signal such as SIGKILL or SIGSEGV, a lost peer) is restarted, as torchrun
 * does; a stop that someone asked for, or a command that cannot run, is not. */
static const char *not_restartable(const rt_launch_result *res) {
    if (res->signal) return "the launcher was interrupted";
    if (res->timed_out) return "the time limit passed";
    if (res->first_failure < 0) return "no rank failed first";
    const rt_launch_rank *f = &res->ranks[res->first_failure];
    int code = rt_launch_rank_code(f);
    if (code == 128 + SIGINT || code == 128 + SIGTERM) return "a rank was stopped by a signal (a stop, not a failure)";
    if (!f->signal && f->exit_code == 2) return "a usage error";
    if (!f->signal && (f->exit_code == 126 || f->exit_code == 127)) return "the command could not run";
    return NULL;
}

/* A failed attempt as --max-restarts compares it: the first failure's rank, how it ended,
 * its error line, the newest step it reported and the checkpoint a restart resumes from. */
typedef struct attempt_failure {
    int rank, code;
    bool signal;
    int64_t step;
    char line[RT_LAUNCH_LINE];
    char ckpt[RT_CKPT_PATH_MAX];
} attempt_failure;

/* Two attempts failed with the same cause at the same step, with no checkpoint in between:
 * the same rank ended the same way (killed by the same signal, or the same exit code with
 * the same error line) after the same step, and the restart would resume from the same
 * checkpoint. Another attempt would fail again: the restarts stop. Deaths at different
 * steps (a rank killed from outside at random times) are not the same failure. */
static bool same_failure(const attempt_failure *a, const attempt_failure *b) {
    return a->rank == b->rank && a->code == b->code && a->signal == b->signal && a->step == b->step &&
           (a->signal || strcmp(a->line, b->line) == 0) && strcmp(a->ckpt, b->ckpt) == 0;
}

static void attempt_failure_of(const rt_launch_result *res, const char *ckpt, attempt_failure *out) {
    const rt_launch_rank *f = &res->ranks[res->first_failure];
    *out =
        (attempt_failure){.rank = f->rank, .code = rt_launch_rank_code(f), .signal = f->signal != 0, .step = f->step};
    snprintf(out->line, sizeof out->line, "%s", f->last_line);
    snprintf(out->ckpt, sizeof out->ckpt, "%s", ckpt);
}

/* Run the job: one launch, and after a failure that is restarted (not_restartable) up to
 * max_restarts more launches, each resuming from the newest checkpoint the job wrote (an
 * override appended to the ranks' command line: the last one wins). Returns the last
 * launch's status and result; with max_restarts > 0 `tail` says why its failure ended
 * the job ("" otherwise). */
static rt_status launch_job(rt_launch_options *lo, char **cmd, int argc, const rt_config *cfg, int max_restarts,
                            rt_launch_result *res, char *tail, size_t tail_n) {
    char ckdir[RT_CONFIG_PATH_MAX + 16];
    rt_train_ckpt_dir(cfg, ckdir, sizeof ckdir);
    ckpt_list before = {NULL, 0};
    if (max_restarts > 0) ckpt_list_read(ckdir, &before);
    char resume_over[RT_CKPT_PATH_MAX + 32] = "";
    attempt_failure prev, now; /* the attempt before's failure, this one's */
    lo->max_restarts = max_restarts;
    rt_status st;
    for (int attempt = 0;; attempt++) {
        lo->restart_count = attempt;
        cmd[argc + 1] = resume_over[0] ? resume_over : NULL;
        memset(res, 0, sizeof *res);
        res->first_failure = -1;
        st = rt_launch_exec(lo, cmd, res);
        if (st == RT_OK || !res->ranks || max_restarts == 0) break;
        const char *why = not_restartable(res);
        if (why) {
            snprintf(tail, tail_n, "; not restarted: %s", why);
            break;
        }
        if (attempt == max_restarts) {
            snprintf(tail, tail_n, "; no restarts left (%d of --max-restarts %d used)", attempt, max_restarts);
            break;
        }
        char line[2 * RT_LAUNCH_LINE], ck[RT_CKPT_PATH_MAX];
        newest_of_job(ckdir, &before, ck, sizeof ck);
        attempt_failure_of(res, ck, &now);
        if (attempt > 0 && same_failure(&prev, &now)) {
            char step[48] = "before its first step";
            if (now.step >= 0) snprintf(step, sizeof step, "after step %lld", (long long)now.step);
            snprintf(tail, tail_n,
                     "; not restarted: the same failure as in the attempt before, %s, with no checkpoint in between",
                     step);
            break;
        }
        prev = now;
        rt_launch_describe(res, line, sizeof line);
        rt_launch_result_free(res);
        rt_error_clear();
        if (ck[0]) {
            snprintf(resume_over, sizeof resume_over, "checkpoint.resume=%s", ck);
            fprintf(stderr, "ringtrain: %s; restarting (%d/%d) from the newest checkpoint, %s\n", line, attempt + 1,
                    max_restarts, ck);
        } else { /* it starts as the first attempt did */
            resume_over[0] = '\0';
            fprintf(stderr,
                    "ringtrain: %s; restarting (%d/%d) as the job started (it wrote no checkpoint yet; "
                    "checkpoint.resume: %s)\n",
                    line, attempt + 1, max_restarts, cfg->checkpoint.resume);
        }
    }
    free(before.v);
    return st;
}

/* The launcher's checks of the job's distributed settings before it starts a rank:
 * 0 ok, 2 a usage error (printed). */
static int check_launch(const rt_config *cfg, int max_restarts) {
    const long long nnodes = (long long)cfg->dist.nnodes;
    if (nnodes > 1 && cfg->dist.master_port == 0) {
        fprintf(stderr, "ringtrain: error: dist.master_port (--master-port) must be given with %lld nodes\n", nnodes);
        return 2;
    }
    if (nnodes > 1 && max_restarts > 0) {
        /* each node's launcher would restart on its own, from the checkpoint it sees */
        fprintf(stderr,
                "ringtrain: error: dist.max_restarts (--max-restarts) %d with %lld nodes: restarts are for single-node "
                "jobs (restart a multi-node job by running the same command again on every node: it resumes)\n",
                max_restarts, nnodes);
        return 2;
    }
    if (cfg->dist.node_rank >= cfg->dist.nnodes) {
        fprintf(stderr, "ringtrain: error: dist.node_rank %lld must be below dist.nnodes %lld\n",
                (long long)cfg->dist.node_rank, nnodes);
        return 2;
    }
    if (nnodes > 1 && !rt_setting_text(RT_SET_JOB_TOKEN)) {
        fprintf(stderr, "ringtrain: error: with %lld nodes set RINGTRAIN_JOB_TOKEN to the same secret on every node\n",
                nnodes);
        return 2;
    }
    return 0;
}

static void launch_options(const rt_config *cfg, int nproc, rt_launch_options *lo) {
    rt_launch_options_default(lo);
    lo->nproc = nproc;
    lo->nnodes = (int)cfg->dist.nnodes;
    lo->node_rank = (int)cfg->dist.node_rank;
    lo->master_addr = cfg->dist.master_addr;
    lo->master_port = (int)cfg->dist.master_port;
    lo->progress_s = cfg->dist.pg.timeout_s;           /* after Ctrl-C: as long as the ranks make progress */
    lo->job_token = rt_setting_text(RT_SET_JOB_TOKEN); /* every node's launcher needs the same one */
}

/* The ranks' command line: this same command (self: PATH_MAX bytes, filled here), with
 * two slots left at the end for launch_job's resume override and the closing NULL; the
 * ranks find their rank in the environment. NULL when it cannot be made (printed when
 * there is something to say). */
static char **rank_command(int argc, char **argv, char *self) {
    ssize_t n = readlink("/proc/self/exe", self, PATH_MAX - 1);
    if (n <= 0) {
        fprintf(stderr, "ringtrain: error: cannot find this executable (/proc/self/exe): %s\n", strerror(errno));
        return NULL;
    }
    self[n] = '\0';
    char **cmd = calloc((size_t)argc + 3, sizeof *cmd);
    if (!cmd) return NULL;
    cmd[0] = self;
    cmd[1] = g_eval ? "eval" : "train";
    for (int i = 1; i < argc; i++) cmd[i + 1] = argv[i];
    return cmd;
}

/* The rank that failed first: named with how it ended, without repeating its error line
 * (forwarded already, so the error is printed once). Returns the job's exit code. */
static int report_rank_failure(const rt_launch_result *res, const char *tail) {
    const rt_launch_rank *f = &res->ranks[res->first_failure];
    char sig[32];
    if (!f->signal && (f->exit_code == 128 + SIGINT || f->exit_code == 128 + SIGTERM))
        ; /* a clean stop: rank 0 said where the checkpoint is and how to resume */
    else if (f->signal)
        fprintf(stderr, "ringtrain: rank %d was killed by %s%s; the other ranks were stopped%s\n", f->rank,
                rt_signal_name(f->signal, sig, sizeof sig), f->last_line[0] ? " (its last error is above)" : "", tail);
    else
        fprintf(stderr, "ringtrain: rank %d exited with code %d%s; the other ranks were stopped%s\n", f->rank,
                f->exit_code, f->last_line[0] ? " (its error is above)" : " without printing an error", tail);
    if (res->diagnosis[0]) fprintf(stderr, "ringtrain: diagnosis: %s\n", res->diagnosis);
    int code = rt_launch_rank_code(f);
    return code > 0 && code < 256 ? code : 1;
}

/* The job's exit code from the last launch's status and result, the summary of a failure
 * printed. */
static int report_launch(rt_status st, rt_launch_result *res, const char *tail) {
    char line[2 * RT_LAUNCH_LINE];
    if (st == RT_OK) return 0;
    if (!res->ranks) return rt_cli_fail(); /* the ranks could not be started */
    if (res->first_failure >= 0) return report_rank_failure(res, tail);
    if (res->signal) { /* interrupted: quiet when every rank stopped cleanly */
        bool clean = true, finished = true;
        for (int i = 0; i < res->nproc; i++) {
            int code = rt_launch_rank_code(&res->ranks[i]);
            clean &= code == 0 || code == 128 + SIGINT || code == 128 + SIGTERM;
            finished &= code == 0;
        }
        if (!clean) fprintf(stderr, "ringtrain: error: %s\n", rt_launch_describe(res, line, sizeof line));
        /* every rank exited 0: the signal came when only the end of the run was left
         * (its last evaluation or checkpoint), and the run finished */
        return finished ? 0 : 128 + res->signal;
    }
    fprintf(stderr, "ringtrain: error: %s\n", rt_launch_describe(res, line, sizeof line));
    return 1;
}

/* The launcher's part once the checks passed: start this node's ranks (again after a
 * failure, with --max-restarts) and say how the job ended. */
static int launch_ranks(int argc, char **argv, const rt_config *cfg, int nproc, int max_restarts) {
    rt_launch_options lo;
    launch_options(cfg, nproc, &lo);
    char self[PATH_MAX];
    char **cmd = rank_command(argc, argv, self);
    if (!cmd) return 1;
    fflush(stdout);
    rt_launch_result res;
    char tail[160] = ""; /* why a failure ended the job, with --max-restarts */
    rt_status st = launch_job(&lo, cmd, argc, cfg, max_restarts, &res, tail, sizeof tail);
    free(cmd);
    int rc = report_launch(st, &res, tail);
    rt_launch_result_free(&res);
    return rc;
}

/* The command once its arguments are parsed: one rank of a launch, or the launcher
 * (which checks the config and the dataset once, then starts the ranks). */
static int run_command(const args *a, int argc, char **argv) {
    rt_config cfg;
    rt_dist_env env;
    if (load(a, &cfg) != RT_OK || rt_dist_env_read(&env) != RT_OK) return rt_cli_fail();
    /* once: by the process that starts the job (or rank 0 of an outside launcher) */
    if (g_dropped[0] && (!env.launcher || (env.rank == 0 && !rt_setting_is_set(RT_SET_HEARTBEAT_FD))))
        RT_LOG_INFO("%s: the checkpoint's values of %s are not used (process, network and output settings "
                    "come from the command line, the config file and the environment; docs/checkpoints.md)",
                    g_ckpt, g_dropped);
    if (env.launcher) return run_rank(&cfg, &env); /* one rank of an outside (or our own) launch */
    /* the launcher: check once, then start the ranks */
    if (check_data(&cfg) != RT_OK) return rt_cli_fail();
    int nproc = nproc_of(&cfg);
    int64_t world = nproc * cfg.dist.nnodes;
    if (!g_eval && rt_train_check_world(&cfg, world) != RT_OK) return rt_cli_fail();
    int max_restarts = g_eval ? 0 : (int)cfg.dist.max_restarts;
    if (cfg.dist.nnodes == 1 && nproc == 1 && max_restarts == 0) { /* one rank: no processes to start */
        env = (rt_dist_env){.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1};
        return run_rank(&cfg, &env);
    }
    int rc = check_launch(&cfg, max_restarts);
    return rc != 0 ? rc : launch_ranks(argc, argv, &cfg, nproc, max_restarts);
}

static int train_or_eval(int argc, char **argv) {
    args a;
    int pr = parse_args(argc, argv, &a);
    int rc = pr == 0 ? run_command(&a, argc, argv) : pr == 1 ? 0 : 2;
    free(a.overrides);
    return rc;
}

int rt_cmd_train(int argc, char **argv) {
    g_eval = false;
    return train_or_eval(argc, argv);
}

int rt_cmd_eval(int argc, char **argv) {
    g_eval = true;
    return train_or_eval(argc, argv);
}
