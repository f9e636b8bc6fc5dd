/* Settings from the environment, declared once (like NCCL's NCCL_PARAM).
 *
 * Every environment variable ringtrain reads is one row of RT_SETTINGS below: its name,
 * type, default, range (or choices), who sets it and what it means. Every read goes
 * through the accessors here (core/settings.c is the only file that calls getenv), so
 * each variable has one parser, one default and one doc line: `ringtrain info
 * --settings` prints the table with the values in force, and docs/settings.md is the
 * same table (tests/core/settings_docs.sh fails when they differ).
 *
 * An empty variable counts as unset. A value that does not parse, or lies outside the
 * range, is RT_ERR_INVALID naming the variable, its value and what was expected.
 * Values are read from the environment at each call (tests change them with setenv);
 * code on a hot path reads a setting once, where it can return the error (init).
 *
 * Adding a setting: one row here, then read it with rt_setting_int/float/bool/choice/str
 * (and paste `ringtrain info --settings --markdown` into docs/settings.md). */
#ifndef RT_SETTINGS_H
#define RT_SETTINGS_H

#include "core/status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_setting_type {
    RT_SETTING_INT,    /* decimal integer in lo..hi */
    RT_SETTING_FLOAT,  /* finite number in lo..hi */
    RT_SETTING_BOOL,   /* 1/0, true/false, yes/no, on/off (any case) */
    RT_SETTING_STRING, /* any text (its format, if any, is the reader's) */
    RT_SETTING_CHOICE  /* one of the '|'-separated choices (any case; no index), or a name of the
                        * area's table where the row's choices are NULL (settings.c, choice_table) */
} rt_setting_type;

typedef enum rt_setting_group {
    RT_SETTING_USER,     /* for users: tuning, debugging, multi-node secrets */
    RT_SETTING_LAUNCHER, /* set by a launcher (torchrun, mpirun, srun, ringtrain's own) */
    RT_SETTING_SYSTEM,   /* set by the system or read by a library ringtrain links */
    RT_SETTING_TEST      /* test hooks: faults at exact points (not for users) */
} rt_setting_group;

#define RT_I32MAX 2147483647.0

/* X(ID, "NAME", TYPE, "default", lo, hi, "choices", GROUP, "meaning").
 * Where a config key and a variable both exist, a variable that is set replaces the config
 * file's value and a command-line override wins over both (said in the meaning;
 * rt_config_apply_env). */
#define RT_SETTINGS(X)                                                                                                 \
    /* ---- user ---- */                                                                                               \
    X(LOG_LEVEL, "RINGTRAIN_LOG_LEVEL", CHOICE, "info", 0, 0, NULL /* rt_log_level_names */, USER,                     \
      "log level of every process (or 0-4); sets log.level over the config file (a command-line override wins)")       \
    X(DIST_TIMEOUT, "RINGTRAIN_DIST_TIMEOUT", FLOAT, "300", 1e-3, 1e8, NULL, USER,                                     \
      "seconds a blocking distributed call waits before it fails naming the peer (rt_pg_options.timeout_s, bench "     \
      "comm); sets dist.timeout_s over the config file (a command-line override wins)")                                \
    X(DIST_DEBUG, "RINGTRAIN_DIST_DEBUG", BOOL, "0", 0, 0, NULL, USER,                                                 \
      "debug mode: every collective's call is checked across the ranks before it runs; sets dist.debug over the "      \
      "config file (a command-line override wins); when set it wins over TORCH_DISTRIBUTED_DEBUG")                     \
    X(TORCH_DEBUG, "TORCH_DISTRIBUTED_DEBUG", CHOICE, "OFF", 0, 0, "OFF|INFO|DETAIL", USER,                            \
      "as in PyTorch: DETAIL turns debug mode on (dist.debug over the config file) when RINGTRAIN_DIST_DEBUG is "      \
      "unset")                                                                                                         \
    X(FLIGHT_ENTRIES, "RINGTRAIN_FLIGHT_ENTRIES", INT, "512", 0, 16777216, NULL, USER,                                 \
      "operations each process group's flight recorder keeps (0: off)")                                                \
    X(ALLREDUCE_SMALL_BYTES, "RINGTRAIN_ALLREDUCE_SMALL_BYTES", INT, "4096", 0, 1073741824, NULL, USER,                \
      "ring all-reduces of at most this many bytes run as one exchange round (0: never); read at group init")          \
    X(SHM_RING_BYTES, "RINGTRAIN_SHM_RING_BYTES", INT, "1048576", 4096, 1073741824, NULL, USER,                        \
      "shm transport: bytes of each ring per direction (rounded up to a power of two)")                                \
    X(SHM_SPIN_US, "RINGTRAIN_SHM_SPIN_US", INT, "20", 0, 1000000, NULL, USER,                                         \
      "shm transport: microseconds a waiting rank spins before it yields the core")                                    \
    X(SHM_NAMED, "RINGTRAIN_SHM_NAMED", BOOL, "0", 0, 0, NULL, USER,                                                   \
      "shm transport: named shm_open() segments instead of memfd (where /proc of a sibling cannot be opened)")         \
    X(ADDR, "RINGTRAIN_ADDR", STRING, "", 0, 0, NULL, USER,                                                            \
      "the address this rank listens on for its peers (default: the interface that reaches the store)")                \
    X(STORE_ADDR, "RINGTRAIN_STORE_ADDR", STRING, "", 0, 0, NULL, USER,                                                \
      "file:// rendezvous: the address the store listens on and publishes (default: MASTER_ADDR, else 127.0.0.1)")     \
    X(STORE_PORT, "RINGTRAIN_STORE_PORT", INT, "", 1, 65535, NULL, USER,                                               \
      "env:// and tcp:// rendezvous: the store's port instead of the one the init method names")                       \
    X(JOB_TOKEN, "RINGTRAIN_JOB_TOKEN", STRING, "", 0, 0, NULL, USER,                                                  \
      "the job's secret that admits ranks to the store; the same on every node of a multi-node job "                   \
      "(ringtrain's launcher sets it for its ranks)")                                                                  \
    X(CONV, "RINGTRAIN_CONV", CHOICE, "auto", 0, 0, "auto|im2col|dnnl", USER,                                          \
      "CPU convolutions: auto (oneDNN when built in), im2col + BLAS, or oneDNN")                                       \
    X(CONV_NOCACHE, "RINGTRAIN_CONV_NOCACHE", BOOL, "0", 0, 0, NULL, USER,                                             \
      "CPU im2col convolutions: do not keep forward's columns for backward (for measurements)")                        \
    X(DNNL_BWW, "RINGTRAIN_DNNL_BWW", CHOICE, "auto", 0, 0, "auto|omp|oc|batch", USER,                                 \
      "oneDNN weight gradients: split by images (batch) or output channels (oc), or oneDNN's own threads (omp); "      \
      "auto: by size")                                                                                                 \
    X(DNNL_LAYOUT, "RINGTRAIN_DNNL_LAYOUT", CHOICE, "auto", 0, 0, "auto|plain", USER,                                  \
      "oneDNN activations: auto (blocked) or plain NCHW (for measurements)")                                           \
    X(CUDNN_LAYOUT, "RINGTRAIN_CUDNN_LAYOUT", CHOICE, "auto", 0, 0, "auto|nchw", USER,                                 \
      "GPU bf16 convolutions: auto (NHWC copies where both channel counts are multiples of 8) or nchw (for "           \
      "measurements)")                                                                                                 \
    X(ACT_LAYOUT, "RINGTRAIN_ACT_LAYOUT", CHOICE, "auto", 0, 0, "auto|nchw|oracle", USER,                             \
      "activations between layers: auto (GPU: NHWC, bf16 under bf16; fp32 NCHW under fp32), nchw (GPU: fp32 NCHW "    \
      "under every precision, for measurements) or oracle (CPU under bf16: fp32 NCHW holding bf16-rounded values, "    \
      "the CPU oracle of the GPU's bf16 format, for tests)")                                                           \
    X(COST_CALIBRATION, "RINGTRAIN_COST_CALIBRATION", STRING, "", 0, 0, NULL, USER,                                   \
      "bench model on the emulated GPUs: the cost calibration of the modelled step time (default: the newest "         \
      "bench/results/gpu-cost-calibration-*.json of the source tree; docs/gpu.md)")                                    \
    X(BLAS_THREADS, "RINGTRAIN_BLAS_THREADS", INT, "1", 1, 1024, NULL, USER,                                           \
      "OpenBLAS threads per ringtrain thread (our pool already splits the batch)")                                     \
    X(POOL_SPIN, "RINGTRAIN_POOL_SPIN", INT, "1000", 0, RT_I32MAX, NULL, USER,                                         \
      "CPU thread pool: pause instructions a worker spins between jobs before it sleeps (0: sleep at once)")           \
    X(OPENBLAS_CORETYPE, "OPENBLAS_CORETYPE", STRING, "", 0, 0, NULL, SYSTEM,                                          \
      "read by OpenBLAS when it loads (SkylakeX is faster on AVX-512 CPUs); ringtrain only mentions it in a hint")     \
    X(HOME, "HOME", STRING, "", 0, 0, NULL, SYSTEM, "a config path that starts with ~/ starts here")                   \
    /* ---- launcher ---- */                                                                                           \
    X(RANK, "RANK", INT, "", 0, 1048576, NULL, LAUNCHER, "torchrun: this process's rank")                              \
    X(WORLD_SIZE, "WORLD_SIZE", INT, "", 1, 1048576, NULL, LAUNCHER, "torchrun: the number of ranks")                  \
    X(LOCAL_RANK, "LOCAL_RANK", INT, "", 0, 1048576, NULL, LAUNCHER, "torchrun: the rank on this node")                \
    X(LOCAL_WORLD_SIZE, "LOCAL_WORLD_SIZE", INT, "", 1, 1048576, NULL, LAUNCHER, "torchrun: ranks on this node")       \
    X(MASTER_ADDR, "MASTER_ADDR", STRING, "", 0, 0, NULL, LAUNCHER, "env:// rendezvous: the store's host")             \
    X(MASTER_PORT, "MASTER_PORT", INT, "", 1, 65535, NULL, LAUNCHER, "env:// rendezvous: the store's port")            \
    X(TE_RUN_ID, "TORCHELASTIC_RUN_ID", STRING, "", 0, 0, NULL, LAUNCHER,                                              \
      "torchrun: the job's id, its secret when RINGTRAIN_JOB_TOKEN is unset")                                          \
    X(TE_AGENT_STORE, "TORCHELASTIC_USE_AGENT_STORE", BOOL, "0", 0, 0, NULL, LAUNCHER,                                 \
      "torchrun: its own store holds MASTER_PORT, so ringtrain's store uses MASTER_PORT + 1")                          \
    X(TE_RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT", INT, "0", 0, RT_I32MAX, NULL, LAUNCHER,                          \
      "torchrun and ringtrain's launcher: the job's attempt (0: the first)")                                           \
    X(OMPI_RANK, "OMPI_COMM_WORLD_RANK", INT, "", 0, 1048576, NULL, LAUNCHER, "mpirun: this process's rank")           \
    X(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", INT, "", 1, 1048576, NULL, LAUNCHER, "mpirun: the number of ranks")           \
    X(OMPI_LOCAL_RANK, "OMPI_COMM_WORLD_LOCAL_RANK", INT, "", 0, 1048576, NULL, LAUNCHER,                              \
      "mpirun: the rank on this node")                                                                                 \
    X(OMPI_LOCAL_SIZE, "OMPI_COMM_WORLD_LOCAL_SIZE", INT, "", 1, 1048576, NULL, LAUNCHER,                              \
      "mpirun: ranks on this node")                                                                                    \
    X(OMPI_JOBID, "OMPI_MCA_ess_base_jobid", STRING, "", 0, 0, NULL, LAUNCHER,                                         \
      "mpirun: the job's id, its secret when nothing above gives one")                                                 \
    X(SLURM_PROCID, "SLURM_PROCID", INT, "", 0, 1048576, NULL, LAUNCHER, "srun: this process's rank")                  \
    X(SLURM_NTASKS, "SLURM_NTASKS", INT, "", 1, 1048576, NULL, LAUNCHER, "srun: the number of ranks")                  \
    X(SLURM_LOCALID, "SLURM_LOCALID", INT, "", 0, 1048576, NULL, LAUNCHER, "srun: the rank on this node")              \
    X(SLURM_NTASKS_PER_NODE, "SLURM_NTASKS_PER_NODE", INT, "", 1, 1048576, NULL, LAUNCHER, "srun: ranks on this node") \
    X(SLURM_JOB_ID, "SLURM_JOB_ID", STRING, "", 0, 0, NULL, LAUNCHER,                                                  \
      "srun: with SLURM_STEP_ID the job's secret when neither RINGTRAIN_JOB_TOKEN nor TORCHELASTIC_RUN_ID is set")     \
    X(SLURM_STEP_ID, "SLURM_STEP_ID", STRING, "0", 0, 0, NULL, LAUNCHER, "srun: the job step (see SLURM_JOB_ID)")      \
    X(STORE_HOSTED, "RINGTRAIN_STORE_HOSTED", BOOL, "0", 0, 0, NULL, LAUNCHER,                                         \
      "ringtrain's launcher: it hosts the store, so rank 0 does not")                                                  \
    X(HEARTBEAT_FD, "RINGTRAIN_HEARTBEAT_FD", INT, "", 0, RT_I32MAX, NULL, LAUNCHER,                                   \
      "ringtrain's launcher: the pipe a rank writes its heartbeat to (checked to be that pipe)")                       \
    X(LAUNCH_ID, "RINGTRAIN_LAUNCH_ID", STRING, "", 0, 0, NULL, LAUNCHER,                                              \
      "ringtrain's launcher: this launch's id (its pid and a random nonce; not a secret): named shm segments carry "   \
      "it, and the launcher removes those a killed rank left (up to 32 letters, digits, '_' or '.'; other "            \
      "launchers may set it)")                                                                                         \
    /* ---- test hooks (formats: src/train/test_hooks.c, src/dist/transport_shm.c) ---- */                             \
    X(SHM_TAG, "RINGTRAIN_SHM_TAG", STRING, "", 0, 0, NULL, TEST, "shm segment names carry this tag")                  \
    X(TEST_HOOKS, "RINGTRAIN_TEST_HOOKS", BOOL, "0", 0, 0, NULL, TEST,                                                 \
      "1: the RINGTRAIN_TEST_* hooks below act (unset: a run ignores them and says so)")                               \
    X(TEST_SIGNAL_AT, "RINGTRAIN_TEST_SIGNAL_AT", STRING, "", 0, 0, NULL, TEST,                                        \
      "<where>:<step>[:<target>[:<rank>[:<signal>]]]: a signal at an exact point")                                     \
    X(TEST_NAN_AT, "RINGTRAIN_TEST_NAN_AT", STRING, "", 0, 0, NULL, TEST, "<rank>:<step>: a NaN in that batch")        \
    X(TEST_SKIP_BUCKET, "RINGTRAIN_TEST_SKIP_BUCKET", STRING, "", 0, 0, NULL, TEST,                                    \
      "<rank>:<step>:<bucket>: that bucket is not all-reduced")                                                        \
    X(TEST_BUCKET_COUNT, "RINGTRAIN_TEST_BUCKET_COUNT", STRING, "", 0, 0, NULL, TEST,                                  \
      "<rank>:<step>:<bucket>: that bucket is all-reduced one element short")                                          \
    X(TEST_INIT_SEED_RANK, "RINGTRAIN_TEST_INIT_SEED_RANK", STRING, "", 0, 0, NULL, TEST,                              \
      "<rank>: that rank initialises from train.seed + 1")                                                             \
    X(TEST_PERTURB_AT, "RINGTRAIN_TEST_PERTURB_AT", STRING, "", 0, 0, NULL, TEST,                                      \
      "<rank>:<step>: that rank's first parameter drifts after the step")                                              \
    X(TEST_BN_PERTURB, "RINGTRAIN_TEST_BN_PERTURB", STRING, "", 0, 0, NULL, TEST,                                      \
      "<rank>: that rank scales its batch-norm statistics before evaluation")                                          \
    X(TEST_KILL_AFTER_CKPT, "RINGTRAIN_TEST_KILL_AFTER_CKPT", STRING, "", 0, 0, NULL, TEST,                            \
      "<step>: rank 0 kills the job once that checkpoint is complete")                                                 \
    X(TEST_KILL_RANK_AT, "RINGTRAIN_TEST_KILL_RANK_AT", STRING, "", 0, 0, NULL, TEST,                                  \
      "<rank>:<step>[:every]: that rank kills itself after the step")                                                  \
    X(TEST_KILL_PLAN, "RINGTRAIN_TEST_KILL_PLAN", STRING, "", 0, 0, NULL, TEST,                                        \
      "<attempt>:<rank>:<step>[,...]: in that attempt, that rank kills itself after the step")                         \
    X(TEST_CKPT_STALL, "RINGTRAIN_TEST_CKPT_STALL", STRING, "", 0, 0, NULL, TEST,                                      \
      "<step>:<seconds>: rank 0 stalls that long inside the write of that checkpoint")                                 \
    X(TEST_RANK_PATH, "RINGTRAIN_TEST_RANK_PATH", STRING, "", 0, 0, NULL, TEST,                                        \
      "<rank>:<from>=<to>: that rank sees the files under <from> at <to>")                                            \
    X(TEST_CLOCK, "RINGTRAIN_TEST_CLOCK", STRING, "", 0, 0, NULL, TEST,                                                \
      "<rank>:<minutes>: that rank's training clock reads <minutes> per step done (checkpoint.every_minutes)")

typedef enum rt_setting_id {
#define RT_SETTING_ENUM_(id, name, type, def, lo, hi, choices, group, doc) RT_SET_##id,
    RT_SETTINGS(RT_SETTING_ENUM_)
#undef RT_SETTING_ENUM_
        RT_SETTING_COUNT_
} rt_setting_id;

/* One row of the table. `def` is text as a user would write it ("" : no default). */
typedef struct rt_setting_info {
    const char *name;
    rt_setting_type type;
    const char *def;
    double lo, hi;       /* INT and FLOAT: inclusive range */
    const char *choices; /* CHOICE: "a|b|c" (for a row that names none: its name table's) */
    rt_setting_group group;
    const char *doc;
} rt_setting_info;

/* Row `id` (NULL when out of range). */
const rt_setting_info *rt_setting_info_get(rt_setting_id id);
/* The id of the variable `name`; RT_ERR_INVALID when no row declares it. */
rt_status rt_setting_find(const char *name, rt_setting_id *out);
/* "int", "float", "bool", "string", "choice"; and "user", "launcher", "system", "test". */
const char *rt_setting_type_name(rt_setting_type t);
const char *rt_setting_group_name(rt_setting_group g);

/* The variable's text: NULL when unset or empty. The one getenv of ringtrain. */
const char *rt_setting_text(rt_setting_id id);
/* True when the variable is set (non-empty). */
bool rt_setting_is_set(rt_setting_id id);

/* The value (the variable's, else the default), parsed strictly and range-checked;
 * the type must be the row's. Unset with no default: RT_OK, *out untouched (check
 * rt_setting_is_set). A bad value: RT_ERR_INVALID "NAME='text': expected ...". */
rt_status rt_setting_int(rt_setting_id id, int64_t *out);
rt_status rt_setting_float(rt_setting_id id, double *out);
rt_status rt_setting_bool(rt_setting_id id, bool *out);
/* CHOICE: the index of the choice in the row's list. */
rt_status rt_setting_choice(rt_setting_id id, int *out);
/* STRING (or any type): the variable's text, else the default, NULL when both are empty. */
const char *rt_setting_str(rt_setting_id id);

/* Parse `text` as row `id` would (the accessors above use it): RT_OK, or RT_ERR_INVALID
 * naming the variable, the text and what was expected. `num` gets INT/FLOAT/BOOL values
 * (bool as 0/1) and CHOICE indexes; may be NULL. */
rt_status rt_setting_parse(rt_setting_id id, const char *text, double *num);

/* Every set variable of the user and system groups parses (launcher variables are checked
 * where they are read: under Slurm some have forms only srun reads). The first bad one is
 * RT_ERR_INVALID naming it. The CLI calls this before any command but info. */
rt_status rt_settings_check(void);

#ifdef __cplusplus
}
#endif

#endif
